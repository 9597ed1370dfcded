//! `[[tools.mcp]]`: the tools of an MCP server over streamable HTTP (SPEC §8.3), through the official
//! Rust SDK's client (`rmcp`, `transport-streamable-http-client-reqwest`).
//!
//! Owns one MCP session per configured server ([`McpServer`]), shared by that server's tools. At boot
//! it runs `initialize` and `tools/list`; each call is one `tools/call` carrying the idempotency key as
//! `_meta.idempotencyKey`.
//!
//! Tool names are `<prefix>__<tool>` sanitised to `[A-Za-z0-9_-]{1,64}` ([`mcp_tool_name`]); the server
//! still sees its own name. Flags come from the tool's annotations:
//!
//! | annotations                | side-effect free | rerun safe | idempotent | at resume                |
//! |----------------------------|------------------|------------|------------|--------------------------|
//! | `readOnlyHint: true`       | yes              | yes        | no         | re-run                   |
//! | `idempotentHint: true`     | no               | no         | yes        | re-sent with the same key |
//! | anything else (or none)    | no               | no         | no         | "effects unknown"        |
//!
//! A result's text contents, joined by newlines, are its output (other content as JSON; the
//! `structuredContent` when there is no content); `isError: true` is `ok: false`.
//!
//! Invariants:
//! - a non-read-only call is sent only after the workspace fence named its generation, checked
//!   immediately before dispatch; a fenced call sends nothing;
//! - one call is one `tools/call` (the SDK re-sends a request only once, after the server reported the
//!   session expired, with the same key);
//! - a session whose transport closed is replaced at the next call (a new `initialize`); the call that
//!   found it closed fails rather than being re-sent.
//!
//! # Design
//! Annotations are hints from a server we may not control; taking `readOnlyHint` at its word is what the
//! SPEC asks, and the idempotency key is the downstream protection. A name over 64 characters keeps 55
//! and appends `_` and 8 hex digits of a SHA-256 of the unsanitised name, so it is stable across restarts
//! (a transcript names tools by it). Two tools of one server that still collide: the second is skipped
//! with a warning.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, MetaObject,
    ProtocolVersion, RequestMetaObject,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ServiceError, ServiceExt};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::external::{
    check_fence, check_url, idempotency_key, tool_def, ExternalToolError, McpServerSpec,
    MAX_TOOL_NAME,
};
use super::{Tool, ToolContext, ToolOutput};
use crate::agent::ToolDef;

/// A live MCP client session.
type Session = RunningService<RoleClient, ClientConfig>;

/// The tool name `<prefix>__<tool>`, sanitised to `[A-Za-z0-9_-]{1,64}`: every other character becomes
/// `_`; a longer name keeps 55 characters, then `_` and 8 hex digits of a SHA-256 of the unsanitised name.
pub fn mcp_tool_name(prefix: &str, tool: &str) -> String {
    let raw = format!("{prefix}__{tool}");
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_TOOL_NAME {
        return clean;
    }
    let digest = Sha256::digest(raw.as_bytes());
    let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    // `clean` is ASCII, so byte slicing is character slicing.
    format!("{}_{hash}", &clean[..MAX_TOOL_NAME - 9])
}

/// One configured MCP server: its session (re-established when its transport closes) and the spec.
pub struct McpServer {
    key: String,
    spec: McpServerSpec,
    http: reqwest::Client,
    /// `None` after the transport closed. A tokio mutex: reconnecting awaits, and concurrent calls that
    /// find the session closed must start one new session, not one each.
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("key", &self.key)
            .field("spec", &self.spec)
            .finish()
    }
}

impl McpServer {
    /// Checks the entry (`key` names it in errors) and runs `initialize`, bounded by the spec's timeout.
    pub async fn connect(
        key: &str,
        spec: McpServerSpec,
        http: reqwest::Client,
    ) -> Result<Arc<McpServer>, ExternalToolError> {
        let prefix_ok = !spec.prefix.is_empty()
            && spec.prefix.len() <= MAX_TOOL_NAME - 3
            && spec
                .prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !prefix_ok {
            return Err(ExternalToolError::BadName {
                key: format!("{key}.name"),
                name: spec.prefix,
            });
        }
        check_url(&format!("{key}.url"), &spec.url)?;
        if spec.timeout.is_zero() {
            return Err(ExternalToolError::BadTimeout {
                key: key.to_owned(),
            });
        }
        let session =
            open_session(&spec, &http)
                .await
                .map_err(|why| ExternalToolError::McpUnavailable {
                    key: key.to_owned(),
                    url: spec.url.clone(),
                    why,
                })?;
        Ok(Arc::new(McpServer {
            key: key.to_owned(),
            spec,
            http,
            session: tokio::sync::Mutex::new(Some(Arc::new(session))),
        }))
    }

    /// `tools/list` (every page), as tools named per [`mcp_tool_name`].
    pub async fn tools(self: &Arc<Self>) -> Result<Vec<McpTool>, String> {
        let session = self.session().await?;
        let listed =
            match tokio::time::timeout(self.spec.timeout, session.peer().list_all_tools()).await {
                Ok(Ok(tools)) => tools,
                Ok(Err(e)) => return Err(format!("tools/list failed: {}", describe(&e))),
                Err(_) => {
                    return Err(format!(
                        "tools/list timed out after {} ms",
                        self.spec.timeout.as_millis()
                    ))
                }
            };
        let mut names = HashSet::new();
        let mut tools = Vec::with_capacity(listed.len());
        for tool in listed {
            // Through JSON, so this reads the wire shape rather than the SDK's evolving structs.
            let Ok(wire) = serde_json::to_value(&tool) else {
                continue;
            };
            let remote = tool.name.to_string();
            let name = mcp_tool_name(&self.spec.prefix, &remote);
            if !names.insert(name.clone()) {
                tracing::warn!(server = %self.key, tool = %remote, name = %name, "mcp tool name collides after sanitising; skipped");
                continue;
            }
            let hint = |h: &str| {
                wire.pointer(&format!("/annotations/{h}"))
                    .and_then(Value::as_bool)
                    == Some(true)
            };
            let read_only = hint("readOnlyHint");
            let description = wire
                .get("description")
                .or_else(|| wire.get("title"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let parameters = match wire.get("inputSchema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                _ => json!({"type": "object"}),
            };
            let idempotent = !read_only && hint("idempotentHint");
            tools.push(McpTool {
                server: self.clone(),
                remote,
                def: tool_def(name, description, parameters, read_only, idempotent),
                idempotent,
            });
        }
        Ok(tools)
    }

    /// The live session, opening a new one when the last one's transport closed.
    async fn session(&self) -> Result<Arc<Session>, String> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot
            .as_ref()
            .filter(|s| !s.is_transport_closed() && !s.is_closed())
        {
            return Ok(s.clone());
        }
        *slot = None;
        let fresh = Arc::new(open_session(&self.spec, &self.http).await?);
        *slot = Some(fresh.clone());
        Ok(fresh)
    }

    /// Forget `session` if it is still the current one (its transport failed).
    async fn drop_session(&self, session: &Arc<Session>) {
        let mut slot = self.session.lock().await;
        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
            *slot = None;
        }
    }
}

/// `initialize` (and `notifications/initialized`) against the server, bounded by its timeout. Speaks the
/// newest protocol revision that has the handshake; the server may answer an older one.
async fn open_session(spec: &McpServerSpec, http: &reqwest::Client) -> Result<Session, String> {
    let config = StreamableHttpClientTransportConfig::with_uri(spec.url.clone());
    let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("switchboard", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
    match tokio::time::timeout(spec.timeout, client.serve(transport)).await {
        Ok(Ok(session)) => Ok(session),
        Ok(Err(e)) => Err(format!("initialize failed: {e}")),
        Err(_) => Err(format!(
            "initialize timed out after {} ms",
            spec.timeout.as_millis()
        )),
    }
}

/// A short, secret-free description of a failed request.
fn describe(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(data) => format!("error {}: {}", data.code.0, data.message),
        ServiceError::Timeout { .. } => "timed out".into(),
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
            "the connection to the server failed".into()
        }
        other => other.to_string(),
    }
}

/// One tool of an MCP server.
pub struct McpTool {
    server: Arc<McpServer>,
    /// The tool's name on the server (what `tools/call` names).
    remote: String,
    def: ToolDef,
    idempotent: bool,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("remote", &self.remote)
            .field("def", &self.def)
            .field("idempotent", &self.idempotent)
            .finish()
    }
}

impl McpTool {
    /// The tool's name on its server.
    pub fn remote_name(&self) -> &str {
        &self.remote
    }

    async fn send(&self, ctx: &ToolContext, call_id: &str, args: &Value) -> ToolOutput {
        let name = &self.def.name;
        let Some(arguments) = args.as_object().cloned() else {
            return ToolOutput::err("args must be a JSON object");
        };
        if !self.def.side_effect_free {
            if let Err(refused) = check_fence(ctx, &format!("mcp tool `{name}`")).await {
                return refused;
            }
        }
        let session = match self.server.session().await {
            Ok(s) => s,
            Err(why) => {
                return ToolOutput::err(format!(
                    "mcp tool `{name}`: the server is unavailable ({why}); nothing was sent"
                ))
            }
        };
        let mut meta = Map::new();
        meta.insert(
            "idempotencyKey".into(),
            Value::String(idempotency_key(&ctx.run_id, call_id)),
        );
        let mut params = CallToolRequestParams::new(self.remote.clone()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        let timeout: Duration = self.server.spec.timeout;
        let unknown = if self.def.side_effect_free {
            ""
        } else {
            " (its effects are unknown)"
        };
        match tokio::time::timeout(timeout, session.peer().call_tool(params)).await {
            Ok(Ok(result)) => match serde_json::to_value(&result) {
                Ok(wire) => result_output(&wire),
                Err(e) => ToolOutput::err(format!("mcp tool `{name}`: unreadable result: {e}")),
            },
            Ok(Err(e)) => {
                if matches!(
                    e,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                ) {
                    self.server.drop_session(&session).await;
                }
                let unknown = if matches!(e, ServiceError::McpError(_)) {
                    ""
                } else {
                    unknown
                };
                ToolOutput::err(format!(
                    "mcp tool `{name}` failed: {}{unknown}",
                    describe(&e)
                ))
            }
            Err(_) => ToolOutput::err(format!(
                "mcp tool `{name}` timed out after {} ms{unknown}",
                timeout.as_millis()
            )),
        }
    }
}

/// A `CallToolResult` (wire shape) as a tool output.
fn result_output(wire: &Value) -> ToolOutput {
    let parts: Vec<String> = wire
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|c| {
                    match (
                        c.get("type").and_then(Value::as_str),
                        c.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(text)) => text.to_owned(),
                        _ => c.to_string(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let output = match (parts.is_empty(), wire.get("structuredContent")) {
        (true, Some(structured)) => structured.to_string(),
        _ => parts.join("\n"),
    };
    if wire.get("isError").and_then(Value::as_bool) == Some(true) {
        ToolOutput::err(output)
    } else {
        ToolOutput::ok(output)
    }
}

impl Tool for McpTool {
    fn def(&self) -> ToolDef {
        self.def.clone()
    }

    /// Without a call id there is no idempotency key: refused, nothing sent. The run dispatches
    /// through [`Tool::call_keyed`].
    fn call<'a>(&'a self, _ctx: &'a ToolContext, _args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        let name = self.def.name.clone();
        async move {
            ToolOutput::err(format!(
                "mcp tool `{name}` needs a call id (dispatch it with call_keyed); nothing was sent"
            ))
        }
        .boxed()
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
        self.idempotent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed_and_sanitised() {
        assert_eq!(mcp_tool_name("fs", "read_file"), "fs__read_file");
        assert_eq!(
            mcp_tool_name("gh", "issues.list/all"),
            "gh__issues_list_all"
        );
        assert_eq!(mcp_tool_name("w", "Wetter für Köln"), "w__Wetter_f_r_K_ln");
        let long = mcp_tool_name("srv", &"x".repeat(100));
        assert_eq!(long.len(), 64);
        assert!(
            long.starts_with("srv__xxx") && long.as_bytes()[55] == b'_',
            "{long}"
        );
        // Stable, and distinct for names that differ only past the cut.
        assert_eq!(long, mcp_tool_name("srv", &"x".repeat(100)));
        assert_ne!(long, mcp_tool_name("srv", &"x".repeat(101)));
    }

    #[test]
    fn results_read_text_then_other_content_then_structured() {
        let text =
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(result_output(&text), ToolOutput::ok("a\nb"));
        let image =
            json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]});
        assert!(result_output(&image).output.contains("image/png"));
        let structured = json!({"content": [], "structuredContent": {"t": 21}});
        assert_eq!(result_output(&structured), ToolOutput::ok(r#"{"t":21}"#));
        let failed =
            json!({"content": [{"type": "text", "text": "no such city"}], "isError": true});
        assert_eq!(result_output(&failed), ToolOutput::err("no such city"));
    }
}
