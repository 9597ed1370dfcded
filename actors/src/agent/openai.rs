//! The `openai` agent: an OpenAI-compatible chat-completions provider over reqwest (SPEC §8.3).
//!
//! Owns one HTTP client per calling thread (see [`OpenAiAgent`]) and its configuration: base URL,
//! model, API key and a per-request timeout.
//!
//! Who calls it: the run actor, through [`Agent::next`]. Each call is one
//! `POST {base_url}/chat/completions` with `{model, messages, tools}` and bearer auth; the transcript
//! is mapped to messages as follows:
//!
//! | transcript                           | messages                                                        |
//! |--------------------------------------|-----------------------------------------------------------------|
//! | the system prompt                    | `{role:"system", content}` (left out when empty)                |
//! | `user` turn                          | `{role:"user", content}` (text parts joined by a blank line)    |
//! | `assistant` turn                     | `{role:"assistant", content, tool_calls:[{id, type:"function", function:{name, arguments:<JSON string>}}]}` |
//! | `tool_results` turn, each result     | `{role:"tool", tool_call_id, content}` (`error: ` prefixed when not ok) |
//! | `tool_results` turn, follow-up texts | one `{role:"user", content}` after the tool messages            |
//!
//! The answer is `choices[0].message`: `content` (a string, or an array of text parts) and `tool_calls`
//! (whose `arguments` JSON string is parsed; one that does not parse is a permanent error naming the call).
//!
//! Invariants:
//! - errors are typed: connect failures, timeouts, 5xx, 429 and 408 are [`AgentError::Transient`];
//!   any other 4xx and a malformed body are [`AgentError::Permanent`]; the agent never retries;
//! - it never logs, nor puts into an error, message text or the API key (the key is also redacted
//!   from `Debug`); errors carry the status and the provider's short error message only.
//!
//! # Design
//! A `reqwest::Client`'s pooled connection is driven by a task on the runtime that opened it, and every
//! actix arbiter is its own single-threaded runtime: one client shared by runs on two arbiters couples
//! them (a blocked arbiter stalls the other's request, a stopped one kills its pooled connections;
//! PITFALLS "actix / tokio" 4). So the agent keeps one client per thread, built on first use.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, Instant};
use storage::ledger::Turn;

use super::{results_of, role, texts_of, Agent, AgentError, AssistantTurn, Conversation, ToolCall, ToolDef};

/// How to reach the provider.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// e.g. `https://api.openai.com/v1`; `/chat/completions` is appended (a trailing `/` is ignored).
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer <key>`; an empty key sends no header (local servers).
    pub api_key: String,
    /// The whole request, connect to last body byte.
    pub timeout: Duration,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &if self.api_key.is_empty() { "<none>" } else { "<redacted>" })
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// An OpenAI-compatible chat-completions agent.
pub struct OpenAiAgent {
    config: OpenAiConfig,
    /// `{base_url}/chat/completions`, computed once.
    url: String,
    /// One client per calling thread (see the module's `# Design`). A std `Mutex` because it is held
    /// only to look up or insert, never across an await; entries are few (one per arbiter thread).
    clients: Mutex<HashMap<ThreadId, reqwest::Client>>,
}

impl std::fmt::Debug for OpenAiAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiAgent").field("config", &self.config).finish_non_exhaustive()
    }
}

impl OpenAiAgent {
    pub fn new(config: OpenAiConfig) -> Self {
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        OpenAiAgent { config, url, clients: Mutex::new(HashMap::new()) }
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// This thread's client, built on first use.
    fn client(&self) -> Result<reqwest::Client, AgentError> {
        let id = std::thread::current().id();
        // A poisoned map is still a valid map: take it.
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&id) {
            return Ok(c.clone());
        }
        let client = reqwest::Client::builder()
            .timeout(self.config.timeout)
            .build()
            .map_err(|e| AgentError::Permanent(format!("build http client: {}", chain(&e))))?;
        clients.insert(id, client.clone());
        Ok(client)
    }

    async fn call(&self, conv: Conversation<'_>) -> Result<AssistantTurn, AgentError> {
        let body = request_body(&self.config.model, conv);
        let client = self.client()?;
        let mut req = client.post(&self.url).json(&body);
        if !self.config.api_key.is_empty() {
            req = req.bearer_auth(&self.config.api_key);
        }
        let started = Instant::now();
        let resp = req.send().await.map_err(send_error)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(send_error)?;
        tracing::debug!(
            model = %self.config.model,
            status,
            elapsed_ms = started.elapsed().as_millis() as u64,
            bytes = bytes.len(),
            "chat completion answered"
        );
        if !(200..300).contains(&status) {
            let detail = provider_error(&bytes).map(|m| format!(": {m}")).unwrap_or_default();
            let msg = format!("chat completions answered http {status}{detail}");
            return Err(if matches!(status, 408 | 429 | 500..=599) {
                AgentError::Transient(msg)
            } else {
                AgentError::Permanent(msg)
            });
        }
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| AgentError::Permanent(format!("malformed response body: {e}")))?;
        parse_reply(&value)
    }
}

impl Agent for OpenAiAgent {
    fn kind(&self) -> &'static str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    fn next<'a>(&'a self, conv: Conversation<'a>) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        self.call(conv).boxed()
    }
}

/// A send/receive failure: anything on the way (connect, timeout, reset) may work on a retry.
fn send_error(e: reqwest::Error) -> AgentError {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connect failed"
    } else {
        "request failed"
    };
    AgentError::Transient(format!("chat completions {what}: {}", chain(&e.without_url())))
}

/// An error and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// The provider's `{error: {type|code, message}}`, shortened; `None` when the body has none.
fn provider_error(bytes: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let err = v.get("error")?;
    let message = match err {
        Value::String(s) => s.clone(),
        _ => {
            let kind = err.get("type").or_else(|| err.get("code")).and_then(Value::as_str);
            let message = err.get("message").and_then(Value::as_str).unwrap_or("");
            match kind {
                Some(k) if !message.is_empty() => format!("{k}: {message}"),
                Some(k) => k.to_owned(),
                None => message.to_owned(),
            }
        }
    };
    const MAX: usize = 300;
    Some(if message.chars().count() > MAX {
        format!("{}…", message.chars().take(MAX).collect::<String>())
    } else {
        message
    })
}

/// The request body: `{model, messages, tools}` (`tools` left out when there are none).
pub fn request_body(model: &str, conv: Conversation<'_>) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages(conv.system, conv.turns)));
    if !conv.tools.is_empty() {
        body.insert("tools".into(), Value::Array(conv.tools.iter().map(tool_json).collect()));
    }
    Value::Object(body)
}

fn tool_json(def: &ToolDef) -> Value {
    json!({
        "type": "function",
        "function": {"name": def.name, "description": def.description, "parameters": def.parameters},
    })
}

/// The transcript as chat-completions messages (see the module table).
pub fn messages(system: &str, turns: &[Turn]) -> Vec<Value> {
    let mut out = Vec::new();
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }
    for turn in turns {
        match turn.role.as_str() {
            role::ASSISTANT => {
                let Some(a) = AssistantTurn::from_turn(turn) else { continue };
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                if a.calls.is_empty() {
                    m.insert("content".into(), json!(a.text));
                } else {
                    m.insert("content".into(), if a.text.is_empty() { Value::Null } else { json!(a.text) });
                    let calls = a
                        .calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.call_id,
                                "type": "function",
                                "function": {"name": c.tool, "arguments": c.args.to_string()},
                            })
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                out.push(Value::Object(m));
            }
            role::TOOL_RESULTS => {
                for r in results_of(turn) {
                    let content = if r.ok { r.output } else { format!("error: {}", r.output) };
                    out.push(json!({"role": "tool", "tool_call_id": r.call_id, "content": content}));
                }
                let texts = texts_of(turn);
                if !texts.is_empty() {
                    out.push(json!({"role": "user", "content": texts.join("\n\n")}));
                }
            }
            // `user`, and a `system` turn should one appear after the first.
            other => {
                let role = if other == role::SYSTEM { "system" } else { "user" };
                out.push(json!({"role": role, "content": texts_of(turn).join("\n\n")}));
            }
        }
    }
    out
}

/// `choices[0].message` as an assistant turn.
pub fn parse_reply(body: &Value) -> Result<AssistantTurn, AgentError> {
    let malformed = |what: &str| AgentError::Permanent(format!("malformed response body: {what}"));
    let message = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(|c| c.get("message"))
        .ok_or_else(|| malformed("no choices[0].message"))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        Some(_) => return Err(malformed("content is neither text nor parts")),
    };
    let mut calls = Vec::new();
    if let Some(list) = message.get("tool_calls").filter(|v| !v.is_null()) {
        let list = list.as_array().ok_or_else(|| malformed("tool_calls is not an array"))?;
        for (i, c) in list.iter().enumerate() {
            let function = c.get("function").ok_or_else(|| malformed(&format!("tool_calls[{i}] has no function")))?;
            let tool = function
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| malformed(&format!("tool_calls[{i}] has no function name")))?
                .to_owned();
            // Some compatible servers leave the id out; a fresh one keeps call ids unique in the run.
            let call_id = match c.get("id").and_then(Value::as_str) {
                Some(id) if !id.is_empty() => id.to_owned(),
                _ => format!("call_{}", uuid::Uuid::new_v4().simple()),
            };
            let args = match function.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) if s.trim().is_empty() => json!({}),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    AgentError::Permanent(format!("unparsable arguments for tool call {call_id} ({tool}): {e}"))
                })?,
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => {
                    return Err(AgentError::Permanent(format!(
                        "unparsable arguments for tool call {call_id} ({tool}): not a JSON string"
                    )))
                }
            };
            calls.push(ToolCall { call_id, tool, args });
        }
    }
    Ok(AssistantTurn { text, calls })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{followups_turn, results_turn, user_turn, ToolResult};
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    use std::sync::Arc;

    /// What the stub saw: the `Authorization` header and the JSON body of each request.
    type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

    struct Stub {
        base_url: String,
        seen: Seen,
        server: actix_web::dev::ServerHandle,
    }

    impl Stub {
        /// A chat-completions endpoint at `<base>/v1/chat/completions` answering every request with
        /// `status` and `body` after `delay`.
        async fn start(status: u16, body: &'static str, delay: Duration) -> Stub {
            let seen: Seen = Arc::default();
            let record = seen.clone();
            let server = HttpServer::new(move || {
                let record = record.clone();
                App::new().route(
                    "/v1/chat/completions",
                    web::post().to(move |req: HttpRequest, bytes: web::Bytes| {
                        let record = record.clone();
                        async move {
                            let auth =
                                req.headers().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
                            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            record.lock().unwrap().push((auth, json));
                            if !delay.is_zero() {
                                actix_rt::time::sleep(delay).await;
                            }
                            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                                .content_type("application/json")
                                .body(body)
                        }
                    }),
                )
            })
            .workers(1)
            .disable_signals()
            .shutdown_timeout(0)
            .bind(("127.0.0.1", 0))
            .unwrap();
            let addr = server.addrs()[0];
            let server = server.run();
            let handle = server.handle();
            actix_rt::spawn(server);
            Stub { base_url: format!("http://{addr}/v1/"), seen, server: handle }
        }

        fn agent(&self, timeout: Duration) -> OpenAiAgent {
            OpenAiAgent::new(OpenAiConfig {
                base_url: self.base_url.clone(),
                model: "gpt-test".into(),
                api_key: "sk-test-key".into(),
                timeout,
            })
        }

        async fn stop(self) {
            self.server.stop(false).await;
        }
    }

    fn tools() -> Vec<ToolDef> {
        vec![ToolDef {
            name: "echo".into(),
            description: "Return the text.".into(),
            parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
            side_effect_free: true,
            rerun_safe: true,
        }]
    }

    /// A transcript with every turn kind: request, a call, its result with a folded follow-up, an
    /// answer, and a follow-up turn.
    fn transcript() -> Vec<Turn> {
        let call = AssistantTurn {
            text: "step 1".into(),
            calls: vec![ToolCall { call_id: "call-1".into(), tool: "echo".into(), args: json!({"text": "hi"}) }],
        };
        vec![
            user_turn("say hi"),
            call.to_turn(),
            results_turn(
                &[ToolResult { call_id: "call-1".into(), tool: "echo".into(), ok: false, output: "boom".into() }],
                &[(5, "also wave".into())],
            ),
            AssistantTurn { text: "hi".into(), calls: vec![] }.to_turn(),
            followups_turn(&[(6, "again".into())]),
        ]
    }

    const TOOL_CALL_REPLY: &str = r#"{"id":"x","choices":[{"index":0,"finish_reason":"tool_calls","message":
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function",
        "function":{"name":"echo","arguments":"{\"text\":\"hello\"}"}}]}}]}"#;
    const TEXT_REPLY: &str =
        r#"{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"all done"}}]}"#;

    #[test]
    fn transcript_maps_to_chat_messages() {
        let msgs = messages("be brief", &transcript());
        assert_eq!(
            msgs,
            vec![
                json!({"role": "system", "content": "be brief"}),
                json!({"role": "user", "content": "say hi"}),
                json!({"role": "assistant", "content": "step 1", "tool_calls": [
                    {"id": "call-1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hi\"}"}}
                ]}),
                json!({"role": "tool", "tool_call_id": "call-1", "content": "error: boom"}),
                json!({"role": "user", "content": "also wave"}),
                json!({"role": "assistant", "content": "hi"}),
                json!({"role": "user", "content": "again"}),
            ]
        );
        // No system prompt, no system message; a call without text has null content.
        let only_call = AssistantTurn {
            text: String::new(),
            calls: vec![ToolCall { call_id: "c".into(), tool: "echo".into(), args: json!({}) }],
        };
        let msgs = messages("", &[only_call.to_turn()]);
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0]["content"], Value::Null);
    }

    #[test]
    fn replies_parse_or_fail_permanently() {
        let cases: Vec<(&str, Value, Result<AssistantTurn, AgentError>)> = vec![
            (
                "text reply",
                serde_json::from_str(TEXT_REPLY).unwrap(),
                Ok(AssistantTurn { text: "all done".into(), calls: vec![] }),
            ),
            (
                "tool call reply",
                serde_json::from_str(TOOL_CALL_REPLY).unwrap(),
                Ok(AssistantTurn {
                    text: String::new(),
                    calls: vec![ToolCall {
                        call_id: "call_abc".into(),
                        tool: "echo".into(),
                        args: json!({"text": "hello"}),
                    }],
                }),
            ),
            (
                "content parts and empty arguments",
                json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "sleep", "arguments": ""}}]}}]}),
                Ok(AssistantTurn {
                    text: "ab".into(),
                    calls: vec![ToolCall { call_id: "c1".into(), tool: "sleep".into(), args: json!({}) }],
                }),
            ),
            (
                "unparsable arguments",
                json!({"choices": [{"message": {"tool_calls": [{"id": "c9", "type": "function",
                    "function": {"name": "echo", "arguments": "{not json"}}]}}]}),
                Err(AgentError::Permanent(
                    "unparsable arguments for tool call c9 (echo): key must be a string at line 1 column 2".into(),
                )),
            ),
            (
                "no choices",
                json!({"choices": []}),
                Err(AgentError::Permanent("malformed response body: no choices[0].message".into())),
            ),
        ];
        for (name, body, want) in cases {
            assert_eq!(parse_reply(&body), want, "{name}");
        }
    }

    #[test]
    fn tool_calls_without_ids_get_fresh_ones() {
        let body = json!({"choices": [{"message": {"tool_calls": [
            {"function": {"name": "echo", "arguments": "{}"}},
            {"function": {"name": "echo", "arguments": "{}"}},
        ]}}]});
        let turn = parse_reply(&body).unwrap();
        assert!(turn.calls[0].call_id.starts_with("call_"));
        assert_ne!(turn.calls[0].call_id, turn.calls[1].call_id);
    }

    #[test]
    fn debug_output_hides_the_api_key() {
        let agent = OpenAiAgent::new(OpenAiConfig {
            base_url: "http://x".into(),
            model: "m".into(),
            api_key: "sk-secret".into(),
            timeout: Duration::from_secs(1),
        });
        let shown = format!("{agent:?}");
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert_eq!(agent.kind(), "openai");
        assert_eq!(agent.model(), "m");
    }

    #[actix_rt::test]
    async fn tool_call_reply_becomes_calls_and_request_carries_model_bearer_tools_and_messages() {
        let stub = Stub::start(200, TOOL_CALL_REPLY, Duration::ZERO).await;
        let agent = stub.agent(Duration::from_secs(10));
        let (turns, tools) = (transcript(), tools());
        let got = agent.next(Conversation { system: "be brief", turns: &turns, tools: &tools }).await;
        assert_eq!(
            got,
            Ok(AssistantTurn {
                text: String::new(),
                calls: vec![ToolCall {
                    call_id: "call_abc".into(),
                    tool: "echo".into(),
                    args: json!({"text": "hello"})
                }],
            })
        );
        let seen = stub.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        let (auth, body) = &seen[0];
        assert_eq!(auth.as_deref(), Some("Bearer sk-test-key"));
        assert_eq!(body["model"], "gpt-test");
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "echo", "description": "Return the text.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}])
        );
        assert_eq!(body["messages"], Value::Array(messages("be brief", &turns)));
        stub.stop().await;
    }

    #[actix_rt::test]
    async fn text_reply_becomes_an_answer() {
        let stub = Stub::start(200, TEXT_REPLY, Duration::ZERO).await;
        let agent = stub.agent(Duration::from_secs(10));
        let turns = [user_turn("hello")];
        let got = agent.next(Conversation { system: "", turns: &turns, tools: &[] }).await;
        assert_eq!(got, Ok(AssistantTurn { text: "all done".into(), calls: vec![] }));
        // No tools: the field is left out rather than sent empty.
        let body = stub.seen.lock().unwrap()[0].1.clone();
        assert!(body.get("tools").is_none(), "{body}");
        stub.stop().await;
    }

    #[actix_rt::test]
    async fn http_errors_are_typed_by_status() {
        let cases: Vec<(u16, &'static str, AgentError)> = vec![
            (
                500,
                r#"{"error":{"message":"upstream broke","type":"server_error"}}"#,
                AgentError::Transient("chat completions answered http 500: server_error: upstream broke".into()),
            ),
            (429, "", AgentError::Transient("chat completions answered http 429".into())),
            (408, "", AgentError::Transient("chat completions answered http 408".into())),
            (
                400,
                r#"{"error":{"message":"unknown model","type":"invalid_request_error"}}"#,
                AgentError::Permanent(
                    "chat completions answered http 400: invalid_request_error: unknown model".into(),
                ),
            ),
            (
                401,
                r#"{"error":"bad key"}"#,
                AgentError::Permanent("chat completions answered http 401: bad key".into()),
            ),
            (
                200,
                "not json",
                AgentError::Permanent("malformed response body: expected ident at line 1 column 2".into()),
            ),
        ];
        for (status, body, want) in cases {
            let stub = Stub::start(status, body, Duration::ZERO).await;
            let turns = [user_turn("hello")];
            let got =
                stub.agent(Duration::from_secs(10)).next(Conversation { system: "", turns: &turns, tools: &[] }).await;
            assert_eq!(got, Err(want), "status {status}");
            stub.stop().await;
        }
    }

    #[actix_rt::test]
    async fn slow_provider_times_out_as_transient() {
        let stub = Stub::start(200, TEXT_REPLY, Duration::from_secs(5)).await;
        let turns = [user_turn("hello")];
        let started = Instant::now();
        let got =
            stub.agent(Duration::from_millis(200)).next(Conversation { system: "", turns: &turns, tools: &[] }).await;
        assert!(
            matches!(&got, Err(AgentError::Transient(m)) if m.starts_with("chat completions timed out")),
            "{got:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        stub.stop().await;
    }

    #[actix_rt::test]
    async fn refused_connection_is_transient() {
        // Bind and drop a listener: nothing listens on that port now.
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let agent = OpenAiAgent::new(OpenAiConfig {
            base_url: format!("http://{addr}/v1"),
            model: "m".into(),
            api_key: String::new(),
            timeout: Duration::from_secs(5),
        });
        let turns = [user_turn("hello")];
        let got = agent.next(Conversation { system: "", turns: &turns, tools: &[] }).await;
        assert!(
            matches!(&got, Err(AgentError::Transient(m)) if m.starts_with("chat completions connect failed")),
            "{got:?}"
        );
    }
}
