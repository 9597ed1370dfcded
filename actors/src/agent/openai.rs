//! The `openai` agent: an OpenAI-compatible chat-completions provider over reqwest (SPEC §8.3).
//!
//! Owns one HTTP client per calling thread ([`ClientPool`], see [`super::http`]) and its configuration:
//! base URL, model, API key, per-request timeout, and the optional `temperature` and `max_tokens`.
//!
//! Who calls it: the run actor, through [`Agent::next`] or [`Agent::next_streaming`]. Each call is one
//! `POST {base_url}/chat/completions` with `{model, messages, tools?, temperature?, max_tokens?}` and
//! bearer auth (plus `stream: true, stream_options: {include_usage: true}` when streaming); the
//! transcript is mapped to messages as follows:
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
//! (whose `arguments` JSON string is parsed; one that does not parse is a permanent error naming the call),
//! with `usage {prompt_tokens, completion_tokens}` as the turn's [`Usage`]. A streamed answer is a series
//! of `data:` chunks whose `choices[0].delta` carries text (`content`, reported as deltas) and tool-call
//! fragments (by `index`: `id` and `function.name` once, `function.arguments` in pieces), then a chunk
//! with `usage` and `data: [DONE]`; the pieces are assembled into the same message and parsed as above.
//!
//! Invariants:
//! - errors are typed (the table in [`super::http`]): connect failures, timeouts, 5xx, 429 and 408 are
//!   [`AgentError::Transient`] (with the provider's `Retry-After`); any other 4xx and a malformed body
//!   are [`AgentError::Permanent`]; the agent never retries;
//! - it never logs, nor puts into an error, message text or the API key (the key is also redacted
//!   from `Debug`); errors carry the status and the provider's short error message only.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Instant;
use storage::ledger::Turn;

use super::http::{self, ClientPool, SseEvent};
use super::{
    results_of, role, texts_of, Agent, AgentError, AssistantTurn, Conversation, DeltaFn, ToolCall,
    ToolDef, Usage,
};

/// The endpoint's name in errors.
const WHAT: &str = "chat completions";

/// How to reach the provider and how to ask it: `base_url` e.g. `https://api.openai.com/v1`
/// (`/chat/completions` is appended), the key sent as `Authorization: Bearer <key>`.
pub type OpenAiConfig = http::ProviderConfig;

/// An OpenAI-compatible chat-completions agent.
pub struct OpenAiAgent {
    config: OpenAiConfig,
    /// `{base_url}/chat/completions`, computed once.
    url: String,
    /// One client per calling thread (see [`super::http`]'s `# Design`).
    clients: ClientPool,
}

impl std::fmt::Debug for OpenAiAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiAgent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OpenAiAgent {
    pub fn new(config: OpenAiConfig) -> Self {
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let clients = ClientPool::new(config.timeout);
        OpenAiAgent {
            config,
            url,
            clients,
        }
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// One model call; streamed when `on_delta` is given.
    async fn call(
        &self,
        conv: Conversation<'_>,
        on_delta: Option<&DeltaFn<'_>>,
    ) -> Result<AssistantTurn, AgentError> {
        let body = request_body(&self.config, conv, on_delta.is_some());
        let client = self.clients.client()?;
        let mut req = client.post(&self.url).json(&body);
        if on_delta.is_some() {
            req = req.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        if !self.config.api_key.is_empty() {
            req = req.bearer_auth(&self.config.api_key);
        }
        let started = Instant::now();
        let resp = http::send(WHAT, req).await?;
        let turn = match on_delta {
            Some(on_delta) if http::is_event_stream(&resp) => {
                let mut reply = StreamedReply::default();
                let done =
                    http::for_each_event(WHAT, resp, |event| reply.take(event, on_delta)).await?;
                if !done && !reply.finished {
                    return Err(AgentError::transient(format!(
                        "{WHAT} stream ended before the answer was complete"
                    )));
                }
                parse_reply(&reply.into_body())?
            }
            _ => {
                let turn = parse_reply(&http::json_body(WHAT, resp).await?)?;
                // Asked to stream but answered at once: the whole text is the one delta.
                if let Some(on_delta) = on_delta.filter(|_| !turn.text.is_empty()) {
                    on_delta(&turn.text);
                }
                turn
            }
        };
        tracing::debug!(
            model = %self.config.model,
            elapsed_ms = started.elapsed().as_millis() as u64,
            streamed = on_delta.is_some(),
            calls = turn.calls.len(),
            input_tokens = turn.usage.map(|u| u.input_tokens),
            output_tokens = turn.usage.map(|u| u.output_tokens),
            "chat completion answered"
        );
        Ok(turn)
    }
}

impl Agent for OpenAiAgent {
    fn kind(&self) -> &'static str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    fn next<'a>(
        &'a self,
        conv: Conversation<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        self.call(conv, None).boxed()
    }

    fn next_streaming<'a>(
        &'a self,
        conv: Conversation<'a>,
        on_delta: &'a DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        self.call(conv, Some(on_delta)).boxed()
    }
}

/// The request body: `{model, messages, tools?, temperature?, max_tokens?}` (`tools` left out when there
/// are none), plus `stream: true` and `stream_options: {include_usage: true}` when `stream`.
pub fn request_body(config: &OpenAiConfig, conv: Conversation<'_>, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert(
        "messages".into(),
        Value::Array(messages(conv.system, conv.turns)),
    );
    if !conv.tools.is_empty() {
        body.insert(
            "tools".into(),
            Value::Array(conv.tools.iter().map(tool_json).collect()),
        );
    }
    if let Some(t) = config.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = config.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    if stream {
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
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
                let Some(a) = AssistantTurn::from_turn(turn) else {
                    continue;
                };
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                if a.calls.is_empty() {
                    m.insert("content".into(), json!(a.text));
                } else {
                    m.insert(
                        "content".into(),
                        if a.text.is_empty() {
                            Value::Null
                        } else {
                            json!(a.text)
                        },
                    );
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
                    let content = if r.ok {
                        r.output
                    } else {
                        format!("error: {}", r.output)
                    };
                    out.push(
                        json!({"role": "tool", "tool_call_id": r.call_id, "content": content}),
                    );
                }
                let texts = texts_of(turn);
                if !texts.is_empty() {
                    out.push(json!({"role": "user", "content": texts.join("\n\n")}));
                }
            }
            // `user`, and a `system` turn should one appear after the first.
            other => {
                let role = if other == role::SYSTEM {
                    "system"
                } else {
                    "user"
                };
                out.push(json!({"role": role, "content": texts_of(turn).join("\n\n")}));
            }
        }
    }
    out
}

/// `choices[0].message` as an assistant turn, with `usage` when the body has it.
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
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        Some(_) => return Err(malformed("content is neither text nor parts")),
    };
    let mut calls = Vec::new();
    if let Some(list) = message.get("tool_calls").filter(|v| !v.is_null()) {
        let list = list
            .as_array()
            .ok_or_else(|| malformed("tool_calls is not an array"))?;
        for (i, c) in list.iter().enumerate() {
            let function = c
                .get("function")
                .ok_or_else(|| malformed(&format!("tool_calls[{i}] has no function")))?;
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
                    AgentError::Permanent(format!(
                        "unparsable arguments for tool call {call_id} ({tool}): {e}"
                    ))
                })?,
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => {
                    return Err(AgentError::Permanent(format!(
                        "unparsable arguments for tool call {call_id} ({tool}): not a JSON string"
                    )))
                }
            };
            calls.push(ToolCall {
                call_id,
                tool,
                args,
            });
        }
    }
    Ok(AssistantTurn {
        text,
        calls,
        usage: parse_usage(body.get("usage")),
    })
}

/// `usage {prompt_tokens, completion_tokens}`; `None` when absent or not numbers (usage is reported,
/// never required: a compatible server without it still answers).
pub fn parse_usage(usage: Option<&Value>) -> Option<Usage> {
    let u = usage?;
    let input_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
    let output_tokens = u.get("completion_tokens").and_then(Value::as_u64);
    if input_tokens.is_none() && output_tokens.is_none() {
        return None;
    }
    Some(Usage {
        input_tokens: input_tokens.unwrap_or(0),
        output_tokens: output_tokens.unwrap_or(0),
    })
}

/// A streamed answer being assembled from its chunks.
#[derive(Debug, Default)]
struct StreamedReply {
    text: String,
    /// Tool-call fragments by their `index`.
    calls: BTreeMap<u64, PartialCall>,
    usage: Option<Value>,
    /// A `finish_reason` arrived: the answer is complete even if `[DONE]` never does.
    finished: bool,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

impl StreamedReply {
    /// Takes one event; `Ok(true)` at `[DONE]`.
    fn take(&mut self, event: SseEvent, on_delta: &DeltaFn<'_>) -> Result<bool, AgentError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| AgentError::Permanent(format!("malformed stream chunk: {e}")))?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(http::stream_error(WHAT, &chunk));
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        let Some(choice) = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(false);
        };
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            on_delta(text);
            self.text.push_str(text);
        }
        if let Some(list) = delta.get("tool_calls").and_then(Value::as_array) {
            for (position, c) in list.iter().enumerate() {
                let index = c
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64);
                let call = self.calls.entry(index).or_default();
                if let Some(id) = c
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|id| !id.is_empty())
                {
                    call.id = Some(id.to_owned());
                }
                let function = c.get("function").unwrap_or(&Value::Null);
                if let Some(name) = function
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                {
                    call.name = name.to_owned();
                }
                if let Some(piece) = function.get("arguments").and_then(Value::as_str) {
                    call.arguments.push_str(piece);
                }
            }
        }
        if choice.get("finish_reason").is_some_and(Value::is_string) {
            self.finished = true;
        }
        Ok(false)
    }

    /// The assembled answer in the non-streamed body's shape, for [`parse_reply`].
    fn into_body(self) -> Value {
        let calls: Vec<Value> = self
            .calls
            .into_values()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        let mut message = json!({"role": "assistant", "content": self.text});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        json!({"choices": [{"message": message}], "usage": self.usage})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{followups_turn, results_turn, user_turn, ToolResult};
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

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
                            let auth = req
                                .headers()
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned);
                            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            record.lock().unwrap().push((auth, json));
                            if !delay.is_zero() {
                                actix_rt::time::sleep(delay).await;
                            }
                            HttpResponse::build(
                                actix_web::http::StatusCode::from_u16(status).unwrap(),
                            )
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
            Stub {
                base_url: format!("http://{addr}/v1/"),
                seen,
                server: handle,
            }
        }

        fn agent(&self, timeout: Duration) -> OpenAiAgent {
            OpenAiAgent::new(OpenAiConfig {
                base_url: self.base_url.clone(),
                model: "gpt-test".into(),
                api_key: "sk-test-key".into(),
                timeout,
                ..OpenAiConfig::default()
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
            idempotent: false,
        }]
    }

    /// A transcript with every turn kind: request, a call, its result with a folded follow-up, an
    /// answer, and a follow-up turn.
    fn transcript() -> Vec<Turn> {
        let call = AssistantTurn {
            text: "step 1".into(),
            calls: vec![ToolCall {
                call_id: "call-1".into(),
                tool: "echo".into(),
                args: json!({"text": "hi"}),
            }],
            usage: None,
        };
        vec![
            user_turn("say hi"),
            call.to_turn(),
            results_turn(
                &[ToolResult {
                    call_id: "call-1".into(),
                    tool: "echo".into(),
                    ok: false,
                    output: "boom".into(),
                }],
                &[(5, "also wave".into())],
            ),
            AssistantTurn {
                text: "hi".into(),
                calls: vec![],
                usage: None,
            }
            .to_turn(),
            followups_turn(&[(6, "again".into())]),
        ]
    }

    const TOOL_CALL_REPLY: &str = r#"{"id":"x","choices":[{"index":0,"finish_reason":"tool_calls","message":
        {"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function",
        "function":{"name":"echo","arguments":"{\"text\":\"hello\"}"}}]}}]}"#;
    const TEXT_REPLY: &str = r#"{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"all done"}}]}"#;

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
            calls: vec![ToolCall {
                call_id: "c".into(),
                tool: "echo".into(),
                args: json!({}),
            }],
            usage: None,
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
                Ok(AssistantTurn { text: "all done".into(), calls: vec![], usage: None }),
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
                    usage: None,
                }),
            ),
            (
                "content parts and empty arguments",
                json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "sleep", "arguments": ""}}]}}]}),
                Ok(AssistantTurn {
                    text: "ab".into(),
                    calls: vec![ToolCall { call_id: "c1".into(), tool: "sleep".into(), args: json!({}) }],
                    usage: None,
                }),
            ),
            (
                "usage is read when present",
                json!({"choices": [{"message": {"content": "ok"}}],
                    "usage": {"prompt_tokens": 31, "completion_tokens": 4, "total_tokens": 35}}),
                Ok(AssistantTurn {
                    text: "ok".into(),
                    calls: vec![],
                    usage: Some(Usage { input_tokens: 31, output_tokens: 4 }),
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
            ..OpenAiConfig::default()
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
        let got = agent
            .next(Conversation {
                system: "be brief",
                turns: &turns,
                tools: &tools,
            })
            .await;
        assert_eq!(
            got,
            Ok(AssistantTurn {
                text: String::new(),
                calls: vec![ToolCall {
                    call_id: "call_abc".into(),
                    tool: "echo".into(),
                    args: json!({"text": "hello"})
                }],
                usage: None,
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
        let got = agent
            .next(Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            })
            .await;
        assert_eq!(
            got,
            Ok(AssistantTurn {
                text: "all done".into(),
                calls: vec![],
                usage: None
            })
        );
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
                AgentError::transient(
                    "chat completions answered http 500: server_error: upstream broke",
                ),
            ),
            (
                429,
                "",
                AgentError::transient("chat completions answered http 429"),
            ),
            (
                408,
                "",
                AgentError::transient("chat completions answered http 408"),
            ),
            (
                400,
                r#"{"error":{"message":"unknown model","type":"invalid_request_error"}}"#,
                AgentError::Permanent(
                    "chat completions answered http 400: invalid_request_error: unknown model"
                        .into(),
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
                AgentError::Permanent(
                    "malformed response body: expected ident at line 1 column 2".into(),
                ),
            ),
        ];
        for (status, body, want) in cases {
            let stub = Stub::start(status, body, Duration::ZERO).await;
            let turns = [user_turn("hello")];
            let got = stub
                .agent(Duration::from_secs(10))
                .next(Conversation {
                    system: "",
                    turns: &turns,
                    tools: &[],
                })
                .await;
            assert_eq!(got, Err(want), "status {status}");
            stub.stop().await;
        }
    }

    #[actix_rt::test]
    async fn slow_provider_times_out_as_transient() {
        let stub = Stub::start(200, TEXT_REPLY, Duration::from_secs(5)).await;
        let turns = [user_turn("hello")];
        let started = Instant::now();
        let got = stub
            .agent(Duration::from_millis(200))
            .next(Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            })
            .await;
        assert!(
            matches!(&got, Err(AgentError::Transient { message: m, .. }) if m.starts_with("chat completions timed out")),
            "{got:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        stub.stop().await;
    }

    #[actix_rt::test]
    async fn refused_connection_is_transient() {
        // Bind and drop a listener: nothing listens on that port now.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let agent = OpenAiAgent::new(OpenAiConfig {
            base_url: format!("http://{addr}/v1"),
            model: "m".into(),
            api_key: String::new(),
            timeout: Duration::from_secs(5),
            ..OpenAiConfig::default()
        });
        let turns = [user_turn("hello")];
        let got = agent
            .next(Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            })
            .await;
        assert!(
            matches!(&got, Err(AgentError::Transient { message: m, .. }) if m.starts_with("chat completions connect failed")),
            "{got:?}"
        );
    }
}
