//! `[[tools.http]]`: a tool whose every call is one POST to a configured URL (SPEC §8.3).
//!
//! A call sends `{runId, callId, input}` as JSON with `Idempotency-Key: <runId>/<callId>` and, when
//! `delivery.secret_env` names a secret, the Standard Webhooks headers (`webhook-id` is the idempotency
//! key, so a re-sent call is recognisably the same message). A 2xx JSON body is the result (a JSON
//! string as its text, anything else as compact JSON); a non-2xx answer, a timeout, a connect error or
//! a 2xx body that is not JSON is an `ok: false` result naming what happened.
//!
//! Flags: `mutating = false` → side-effect free (re-run at resume); `mutating = true` (the default) →
//! settled "effects unknown" at resume, unless `idempotent = true` ([`Tool::idempotent`]), which re-sends
//! it with the same key.
//!
//! Invariants:
//! - a mutating call is sent only after the workspace fence named its generation, checked immediately
//!   before dispatch ([`super::external`]); a fenced call sends nothing;
//! - no retries here: one call is one POST (a re-send is the resume's decision, made with the key);
//! - at most [`MAX_RESULT_BYTES`] of an answer are read.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Value};

use super::external::{
    check_fence, check_url, idempotency_key, is_tool_name, tool_def, ExternalToolError,
    HttpToolSpec,
};
use super::{Tool, ToolContext, ToolOutput};
use crate::agent::ToolDef;
use crate::delivery::{signature_headers, unix_now_secs};

/// The most of an answer's body a call reads; a longer 2xx answer is an `ok: false` result.
pub const MAX_RESULT_BYTES: usize = 1 << 20;
/// How much of a non-2xx body the result quotes.
const ERROR_QUOTE_CHARS: usize = 500;

/// One `[[tools.http]]` endpoint as a [`Tool`].
pub struct HttpTool {
    spec: HttpToolSpec,
    /// Shared with the other external tools (one connection pool).
    http: reqwest::Client,
    /// The webhook signing key, shared by every HTTP tool.
    secret: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for HttpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("HttpTool")
            .field("spec", &self.spec)
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

impl HttpTool {
    /// Checks the entry (`key` names it in errors): the name, the URL, a positive timeout, and an
    /// object `input_schema` (a string holding JSON is parsed).
    pub fn new(
        key: &str,
        mut spec: HttpToolSpec,
        http: reqwest::Client,
        secret: Option<Arc<[u8]>>,
    ) -> Result<Self, ExternalToolError> {
        if !is_tool_name(&spec.name) {
            return Err(ExternalToolError::BadName {
                key: format!("{key}.name"),
                name: spec.name,
            });
        }
        check_url(&format!("{key}.url"), &spec.url)?;
        if spec.timeout.is_zero() {
            return Err(ExternalToolError::BadTimeout {
                key: key.to_owned(),
            });
        }
        let bad = |why: String| ExternalToolError::BadSchema {
            key: key.to_owned(),
            why,
        };
        if let Value::String(text) = &spec.input_schema {
            spec.input_schema =
                serde_json::from_str(text).map_err(|e| bad(format!("is not JSON: {e}")))?;
        }
        match &spec.input_schema {
            Value::Null => spec.input_schema = json!({"type": "object"}),
            Value::Object(o) if o.get("type").is_none_or(|t| t == "object") => {}
            Value::Object(_) => {
                return Err(bad("must describe an object (`type = \"object\"`)".into()))
            }
            _ => return Err(bad("must be a JSON Schema object".into())),
        }
        Ok(HttpTool { spec, http, secret })
    }

    pub fn spec(&self) -> &HttpToolSpec {
        &self.spec
    }

    async fn send(&self, ctx: &ToolContext, call_id: &str, input: &Value) -> ToolOutput {
        let name = &self.spec.name;
        if self.spec.mutating {
            if let Err(refused) = check_fence(ctx, &format!("http tool `{name}`")).await {
                return refused;
            }
        }
        let key = idempotency_key(&ctx.run_id, call_id);
        let body = match serde_json::to_vec(
            &json!({"runId": ctx.run_id, "callId": call_id, "input": input}),
        ) {
            Ok(b) => b,
            Err(e) => {
                return ToolOutput::err(format!(
                    "http tool `{name}`: cannot serialize the call: {e}"
                ))
            }
        };
        let mut request = self
            .http
            .post(&self.spec.url)
            .timeout(self.spec.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .header("Idempotency-Key", &key);
        if let Some(secret) = &self.secret {
            for (header, value) in signature_headers(secret, &key, unix_now_secs(), &body) {
                request = request.header(header, value);
            }
        }
        let unknown = if self.spec.mutating {
            " (its effects are unknown)"
        } else {
            ""
        };
        let response = match request.body(body).send().await {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                return ToolOutput::err(format!(
                    "http tool `{name}` timed out after {} ms{unknown}",
                    self.spec.timeout.as_millis()
                ))
            }
            Err(e) if e.is_connect() => {
                return ToolOutput::err(format!(
                    "http tool `{name}` could not connect to its endpoint"
                ))
            }
            Err(e) if e.is_builder() => {
                return ToolOutput::err(format!(
                    "http tool `{name}`: cannot build the request: {e}"
                ))
            }
            Err(_) => {
                return ToolOutput::err(format!(
                    "http tool `{name}` lost the connection before an answer{unknown}"
                ))
            }
        };
        let status = response.status();
        let body = match read_capped(response, MAX_RESULT_BYTES).await {
            Ok(b) => b,
            Err(why) => {
                return ToolOutput::err(format!(
                    "http tool `{name}` answered {}, but {why}",
                    status.as_u16()
                ))
            }
        };
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let quoted: String = text.chars().take(ERROR_QUOTE_CHARS).collect();
            return ToolOutput::err(format!(
                "http tool `{name}` answered {}: {}",
                status.as_u16(),
                quoted.trim()
            ));
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return ToolOutput::ok("");
        }
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::String(s)) => ToolOutput::ok(s),
            Ok(v) => ToolOutput::ok(v.to_string()),
            Err(_) => ToolOutput::err(format!(
                "http tool `{name}` answered {} with a body that is not JSON",
                status.as_u16()
            )),
        }
    }
}

/// The body, or why it could not be read (too long, cut off, timed out).
async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    return Err(format!("its body is longer than {cap} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) if e.is_timeout() => return Err("its body timed out".into()),
            Err(_) => return Err("its body was cut off".into()),
        }
    }
}

impl Tool for HttpTool {
    fn requires_approval(&self) -> bool {
        self.spec.approval
    }

    fn def(&self) -> ToolDef {
        tool_def(
            self.spec.name.clone(),
            self.spec.description.clone(),
            self.spec.input_schema.clone(),
            !self.spec.mutating,
            self.idempotent(),
        )
    }

    /// Without a call id there is no idempotency key: refused, nothing sent. The run dispatches
    /// through [`Tool::call_keyed`].
    fn call<'a>(&'a self, _ctx: &'a ToolContext, _args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        let name = self.spec.name.clone();
        async move { ToolOutput::err(format!("http tool `{name}` needs a call id (dispatch it with call_keyed); nothing was sent")) }.boxed()
    }

    fn call_keyed<'a>(
        &'a self,
        ctx: &'a ToolContext,
        call_id: &'a str,
        args: &'a Value,
    ) -> BoxFuture<'a, ToolOutput> {
        self.send(ctx, call_id, args).boxed()
    }

    fn idempotent(&self) -> bool {
        self.spec.mutating && self.spec.idempotent
    }
}
