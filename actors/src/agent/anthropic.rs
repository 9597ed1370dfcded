//! The `anthropic` agent: the Anthropic Messages API over reqwest (SPEC §8.3).
//!
//! Owns one HTTP client per calling thread ([`ClientPool`], see [`super::http`]) and its configuration:
//! base URL, model, API key, per-request timeout, `temperature` and `max_tokens`.
//!
//! Who calls it: the run actor, through [`Agent::next`] or [`Agent::next_streaming`]. Each call is one
//! `POST {base_url}/v1/messages` with headers `x-api-key` and `anthropic-version: 2023-06-01` and body
//! `{model, max_tokens, system?, messages, tools?, temperature?}` (plus `stream: true` when streaming).
//! `max_tokens` is required by the API: [`DEFAULT_MAX_TOKENS`] when not configured. The transcript maps
//! to messages (every `content` a list of blocks) as follows:
//!
//! | transcript                           | messages                                                            |
//! |--------------------------------------|---------------------------------------------------------------------|
//! | the system prompt                    | top-level `system` (left out when empty)                            |
//! | `user` turn                          | `{role:"user", content:[{type:"text", text}…]}`                     |
//! | `assistant` turn                     | `{role:"assistant", content:[{type:"text", text}?, {type:"tool_use", id: callId, name, input}…]}` |
//! | `tool_results` turn                  | `{role:"user", content:[{type:"tool_result", tool_use_id, content, is_error?}…, {type:"text", text}… (the follow-ups)]}` |
//!
//! Empty texts are left out (the API refuses empty text blocks), and consecutive messages of the same
//! role are merged into one, so the roles alternate as the API expects.
//!
//! The answer's `content` blocks become the turn: `text` blocks joined (no separator: the API splits
//! one text at citations), `tool_use` blocks as calls (`id` → callId, `name`, `input`); other block
//! types (thinking) are skipped. `usage {input_tokens, output_tokens}` is the turn's [`Usage`]. A
//! streamed answer is `message_start` (input usage), per block `content_block_start` /
//! `content_block_delta` (`text_delta`, reported as deltas; `input_json_delta`, a tool input in
//! pieces) / `content_block_stop`, `message_delta` (output usage) and `message_stop`; an `error` event
//! fails the call; the blocks are assembled and parsed as above.
//!
//! Invariants:
//! - errors are typed like the `openai` agent's (the table in [`super::http`]): connect failures,
//!   timeouts, 5xx (529 "overloaded" included), 429 and 408 are [`AgentError::Transient`] with the
//!   provider's `Retry-After`; any other 4xx and a malformed answer are [`AgentError::Permanent`]; the
//!   agent never retries;
//! - it never logs, nor puts into an error, message text or the API key (redacted from `Debug`).

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Instant;
use storage::ledger::Turn;

use super::http::{self, ClientPool, SseEvent};
use super::{
    part, part_type, results_of, role, Agent, AgentError, AssistantTurn, Conversation, DeltaFn,
    ToolCall, ToolDef, Usage,
};

/// The endpoint's name in errors.
const WHAT: &str = "messages";
/// The `anthropic-version` header this mapping is written against.
pub const API_VERSION: &str = "2023-06-01";
/// `max_tokens` when the agent's configuration sets none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// How to reach the provider and how to ask it: `base_url` e.g. `https://api.anthropic.com` (`/v1/messages`
/// is appended), the key sent as `x-api-key`, and `max_tokens` ([`DEFAULT_MAX_TOKENS`] when `None`).
pub type AnthropicConfig = http::ProviderConfig;

/// A Messages API agent.
pub struct AnthropicAgent {
    config: AnthropicConfig,
    /// `{base_url}/v1/messages`, computed once.
    url: String,
    /// One client per calling thread (see [`super::http`]'s `# Design`).
    clients: ClientPool,
}

impl std::fmt::Debug for AnthropicAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicAgent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AnthropicAgent {
    pub fn new(config: AnthropicConfig) -> Self {
        let url = format!("{}/v1/messages", config.base_url.trim_end_matches('/'));
        let clients = ClientPool::new(config.timeout);
        AnthropicAgent {
            config,
            url,
            clients,
        }
    }

    pub fn config(&self) -> &AnthropicConfig {
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
        let mut req = client
            .post(&self.url)
            .header("anthropic-version", API_VERSION)
            .json(&body);
        if on_delta.is_some() {
            req = req.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        if !self.config.api_key.is_empty() {
            req = req.header("x-api-key", &self.config.api_key);
        }
        let started = Instant::now();
        let resp = http::send(WHAT, req).await?;
        let turn = match on_delta {
            Some(on_delta) if http::is_event_stream(&resp) => {
                let mut reply = StreamedReply::default();
                let done =
                    http::for_each_event(WHAT, resp, |event| reply.take(event, on_delta)).await?;
                if !done {
                    return Err(AgentError::transient(format!(
                        "{WHAT} stream ended before message_stop"
                    )));
                }
                parse_reply(&reply.into_body()?)?
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
            "messages answered"
        );
        Ok(turn)
    }
}

impl Agent for AnthropicAgent {
    fn kind(&self) -> &'static str {
        "anthropic"
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

/// The request body: `{model, max_tokens, system?, messages, tools?, temperature?, stream?}`.
pub fn request_body(config: &AnthropicConfig, conv: Conversation<'_>, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert(
        "max_tokens".into(),
        json!(config.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !conv.system.is_empty() {
        body.insert("system".into(), json!(conv.system));
    }
    body.insert("messages".into(), Value::Array(messages(conv.turns)));
    if !conv.tools.is_empty() {
        body.insert(
            "tools".into(),
            Value::Array(conv.tools.iter().map(tool_json).collect()),
        );
    }
    if let Some(t) = config.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Value::Object(body)
}

fn tool_json(def: &ToolDef) -> Value {
    json!({"name": def.name, "description": def.description, "input_schema": def.parameters})
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// The transcript as Messages API messages (see the module table).
pub fn messages(turns: &[Turn]) -> Vec<Value> {
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match out.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => out.push((role, blocks)),
        }
    };
    for turn in turns {
        match turn.role.as_str() {
            role::ASSISTANT => {
                let Some(a) = AssistantTurn::from_turn(turn) else {
                    continue;
                };
                let mut blocks = Vec::with_capacity(a.calls.len() + 1);
                if !a.text.is_empty() {
                    blocks.push(text_block(&a.text));
                }
                blocks.extend(
                    a.calls
                        .iter()
                        .map(|c| json!({"type": "tool_use", "id": c.call_id, "name": c.tool, "input": c.args})),
                );
                push("assistant", blocks);
            }
            role::TOOL_RESULTS => {
                // Results first (the API wants them at the head of the user message), then follow-ups.
                let mut blocks: Vec<Value> = results_of(turn)
                    .into_iter()
                    .map(|r| {
                        let mut b = json!({"type": "tool_result", "tool_use_id": r.call_id, "content": r.output});
                        if !r.ok {
                            b["is_error"] = json!(true);
                        }
                        b
                    })
                    .collect();
                blocks.extend(user_texts(turn));
                push("user", blocks);
            }
            // `user`, and a `system` turn should one appear after the first (the API has no such role).
            _ => push("user", user_texts(turn).collect()),
        }
    }
    out.into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect()
}

/// The non-empty text parts of a turn as text blocks.
fn user_texts(turn: &Turn) -> impl Iterator<Item = Value> + '_ {
    turn.parts
        .iter()
        .filter(|p| part_type(p) == Some(part::TEXT))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .filter(|t| !t.is_empty())
        .map(text_block)
}

/// A Messages API answer (`{content: [blocks], usage}`) as an assistant turn.
pub fn parse_reply(body: &Value) -> Result<AssistantTurn, AgentError> {
    let malformed = |what: &str| AgentError::Permanent(format!("malformed response body: {what}"));
    let blocks = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no content"))?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                text.push_str(
                    block
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| malformed(&format!("content[{i}] has no text")))?,
                );
            }
            Some("tool_use") => {
                let tool = block
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| malformed(&format!("content[{i}] has no tool name")))?
                    .to_owned();
                let call_id = match block.get("id").and_then(Value::as_str) {
                    Some(id) if !id.is_empty() => id.to_owned(),
                    _ => format!("toolu_{}", uuid::Uuid::new_v4().simple()),
                };
                let args = match block.get("input") {
                    None | Some(Value::Null) => json!({}),
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(_) => {
                        return Err(AgentError::Permanent(format!(
                            "unparsable input for tool call {call_id} ({tool}): not a JSON object"
                        )))
                    }
                };
                calls.push(ToolCall {
                    call_id,
                    tool,
                    args,
                });
            }
            _ => {}
        }
    }
    Ok(AssistantTurn {
        text,
        calls,
        usage: parse_usage(body.get("usage")),
    })
}

/// `usage {input_tokens, output_tokens}`; `None` when absent or not numbers.
pub fn parse_usage(usage: Option<&Value>) -> Option<Usage> {
    let u = usage?;
    let input_tokens = u.get("input_tokens").and_then(Value::as_u64);
    let output_tokens = u.get("output_tokens").and_then(Value::as_u64);
    if input_tokens.is_none() && output_tokens.is_none() {
        return None;
    }
    Some(Usage {
        input_tokens: input_tokens.unwrap_or(0),
        output_tokens: output_tokens.unwrap_or(0),
    })
}

/// A streamed answer being assembled from its events.
#[derive(Debug, Default)]
struct StreamedReply {
    /// Content blocks by their `index`.
    blocks: BTreeMap<u64, Block>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Debug)]
enum Block {
    Text(String),
    /// A tool call: its start (`input` is normally `{}`) and the `partial_json` pieces of its input.
    ToolUse {
        id: Value,
        name: Value,
        input: Value,
        json: String,
    },
    /// Anything else (thinking): its deltas are dropped.
    Other,
}

impl StreamedReply {
    /// Takes one event; `Ok(true)` at `message_stop`.
    fn take(&mut self, event: SseEvent, on_delta: &DeltaFn<'_>) -> Result<bool, AgentError> {
        if event.data.trim().is_empty() {
            return Ok(false);
        }
        let data: Value = serde_json::from_str(&event.data)
            .map_err(|e| AgentError::Permanent(format!("malformed stream event: {e}")))?;
        let index = || data.get("index").and_then(Value::as_u64).unwrap_or(0);
        // The event's JSON names its type; the SSE `event:` line says the same and is only a fallback.
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str());
        match kind {
            "message_start" => {
                let usage = data.get("message").and_then(|m| m.get("usage"));
                self.read_usage(usage);
            }
            "content_block_start" => {
                let b = data.get("content_block").unwrap_or(&Value::Null);
                let block = match b.get("type").and_then(Value::as_str) {
                    Some("text") => Block::Text(
                        b.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    ),
                    Some("tool_use") => Block::ToolUse {
                        id: b.get("id").cloned().unwrap_or(Value::Null),
                        name: b.get("name").cloned().unwrap_or(Value::Null),
                        input: b.get("input").cloned().unwrap_or(Value::Null),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index(), block);
            }
            "content_block_delta" => {
                let delta = data.get("delta").unwrap_or(&Value::Null);
                match (
                    delta.get("type").and_then(Value::as_str),
                    self.blocks.get_mut(&index()),
                ) {
                    (Some("text_delta"), Some(Block::Text(text))) => {
                        if let Some(piece) = delta
                            .get("text")
                            .and_then(Value::as_str)
                            .filter(|t| !t.is_empty())
                        {
                            on_delta(piece);
                            text.push_str(piece);
                        }
                    }
                    (Some("input_json_delta"), Some(Block::ToolUse { json, .. })) => {
                        json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    (Some("text_delta" | "input_json_delta"), _) => {
                        return Err(AgentError::Permanent(format!(
                            "malformed stream event: a delta for content block {} that did not start as one",
                            index()
                        )));
                    }
                    _ => {}
                }
            }
            "message_delta" => self.read_usage(data.get("usage")),
            "message_stop" => return Ok(true),
            "error" => return Err(http::stream_error(WHAT, &data)),
            // `ping`, `content_block_stop`, and event types added after this was written.
            _ => {}
        }
        Ok(false)
    }

    /// Usage counts are cumulative: a later event's count replaces an earlier one.
    fn read_usage(&mut self, usage: Option<&Value>) {
        let Some(u) = usage else { return };
        if let Some(n) = u.get("input_tokens").and_then(Value::as_u64) {
            self.input_tokens = Some(n);
        }
        if let Some(n) = u.get("output_tokens").and_then(Value::as_u64) {
            self.output_tokens = Some(n);
        }
    }

    /// The assembled answer in the non-streamed body's shape, for [`parse_reply`]; a tool input whose
    /// pieces do not form JSON is a permanent error.
    fn into_body(self) -> Result<Value, AgentError> {
        let mut content = Vec::with_capacity(self.blocks.len());
        for block in self.blocks.into_values() {
            match block {
                Block::Text(text) => content.push(text_block(&text)),
                Block::ToolUse {
                    id,
                    name,
                    input,
                    json,
                } => {
                    let input = if json.trim().is_empty() {
                        input
                    } else {
                        serde_json::from_str(&json).map_err(|e| {
                            AgentError::Permanent(format!(
                                "unparsable input for tool call {} ({}): {e}",
                                id.as_str().unwrap_or("?"),
                                name.as_str().unwrap_or("?")
                            ))
                        })?
                    };
                    content
                        .push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
                }
                Block::Other => {}
            }
        }
        let mut usage = Map::new();
        if let Some(n) = self.input_tokens {
            usage.insert("input_tokens".into(), json!(n));
        }
        if let Some(n) = self.output_tokens {
            usage.insert("output_tokens".into(), json!(n));
        }
        Ok(json!({"content": content, "usage": usage}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{followups_turn, results_turn, user_turn, ToolResult};

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

    #[test]
    fn transcript_maps_to_alternating_messages_with_blocks() {
        assert_eq!(
            messages(&transcript()),
            vec![
                json!({"role": "user", "content": [{"type": "text", "text": "say hi"}]}),
                json!({"role": "assistant", "content": [
                    {"type": "text", "text": "step 1"},
                    {"type": "tool_use", "id": "call-1", "name": "echo", "input": {"text": "hi"}},
                ]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call-1", "content": "boom", "is_error": true},
                    {"type": "text", "text": "also wave"},
                ]}),
                json!({"role": "assistant", "content": [{"type": "text", "text": "hi"}]}),
                json!({"role": "user", "content": [{"type": "text", "text": "again"}]}),
            ]
        );
        // Two user turns in a row merge; an empty text is left out; a call without text has no text block.
        let only_call = AssistantTurn {
            text: String::new(),
            calls: vec![ToolCall {
                call_id: "c".into(),
                tool: "echo".into(),
                args: json!({}),
            }],
            usage: None,
        };
        let ok = ToolResult {
            call_id: "c".into(),
            tool: "echo".into(),
            ok: true,
            output: "x".into(),
        };
        let msgs = messages(&[
            user_turn("a"),
            user_turn(""),
            user_turn("b"),
            only_call.to_turn(),
            results_turn(&[ok], &[]),
        ]);
        assert_eq!(
            msgs,
            vec![
                json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "echo", "input": {}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c", "content": "x"}]}),
            ]
        );
    }

    #[test]
    fn request_body_has_system_on_top_and_max_tokens_always() {
        let tools = [ToolDef {
            name: "echo".into(),
            description: "Return the text.".into(),
            parameters: json!({"type": "object"}),
            side_effect_free: true,
            rerun_safe: true,
            idempotent: false,
        }];
        let turns = [user_turn("hi")];
        let config = AnthropicConfig {
            model: "claude-test".into(),
            ..AnthropicConfig::default()
        };
        let body = request_body(
            &config,
            Conversation {
                system: "be brief",
                turns: &turns,
                tools: &tools,
            },
            false,
        );
        assert_eq!(
            body,
            json!({
                "model": "claude-test",
                "max_tokens": DEFAULT_MAX_TOKENS,
                "system": "be brief",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "tools": [{"name": "echo", "description": "Return the text.", "input_schema": {"type": "object"}}],
            })
        );
        let config = AnthropicConfig {
            temperature: Some(0.5),
            max_tokens: Some(64),
            ..config
        };
        let body = request_body(
            &config,
            Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            },
            true,
        );
        assert!(
            body.get("system").is_none() && body.get("tools").is_none(),
            "{body}"
        );
        assert_eq!(
            (body["temperature"].clone(), body["max_tokens"].clone()),
            (json!(0.5), json!(64))
        );
        assert_eq!(body["stream"], json!(true));
    }

    #[test]
    fn replies_parse_or_fail_permanently() {
        let cases: Vec<(&str, Value, Result<AssistantTurn, AgentError>)> = vec![
            (
                "text and a tool call with usage",
                json!({"type": "message", "role": "assistant", "stop_reason": "tool_use",
                    "content": [{"type": "text", "text": "Let me echo."},
                                {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "hello"}}],
                    "usage": {"input_tokens": 20, "output_tokens": 7}}),
                Ok(AssistantTurn {
                    text: "Let me echo.".into(),
                    calls: vec![ToolCall {
                        call_id: "toolu_1".into(),
                        tool: "echo".into(),
                        args: json!({"text": "hello"}),
                    }],
                    usage: Some(Usage {
                        input_tokens: 20,
                        output_tokens: 7,
                    }),
                }),
            ),
            (
                "text blocks join, thinking is skipped",
                json!({"content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "a"},
                                   {"type": "text", "text": "b"}]}),
                Ok(AssistantTurn {
                    text: "ab".into(),
                    calls: vec![],
                    usage: None,
                }),
            ),
            (
                "no content",
                json!({"type": "message"}),
                Err(AgentError::Permanent(
                    "malformed response body: no content".into(),
                )),
            ),
            (
                "tool use without a name",
                json!({"content": [{"type": "tool_use", "id": "t", "input": {}}]}),
                Err(AgentError::Permanent(
                    "malformed response body: content[0] has no tool name".into(),
                )),
            ),
            (
                "tool input that is not an object",
                json!({"content": [{"type": "tool_use", "id": "t", "name": "echo", "input": "x"}]}),
                Err(AgentError::Permanent(
                    "unparsable input for tool call t (echo): not a JSON object".into(),
                )),
            ),
        ];
        for (name, body, want) in cases {
            assert_eq!(parse_reply(&body), want, "{name}");
        }
    }

    #[test]
    fn debug_output_hides_the_api_key() {
        let agent = AnthropicAgent::new(AnthropicConfig {
            base_url: "http://x".into(),
            model: "m".into(),
            api_key: "sk-ant-secret".into(),
            ..AnthropicConfig::default()
        });
        let shown = format!("{agent:?}");
        assert!(!shown.contains("sk-ant-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert_eq!(agent.kind(), "anthropic");
        assert_eq!(agent.model(), "m");
    }

    #[test]
    fn stream_events_assemble_text_tool_input_and_usage() {
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 25, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1,
                   "content_block": {"type": "tool_use", "id": "toolu_9", "name": "echo", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"te"}}),
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": "xt\": \"hi\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 15}}),
        ];
        let deltas = std::sync::Mutex::new(Vec::<String>::new());
        let sink = |d: &str| deltas.lock().unwrap().push(d.to_owned());
        let mut reply = StreamedReply::default();
        for e in events {
            assert_eq!(
                reply.take(
                    SseEvent {
                        event: String::new(),
                        data: e.to_string()
                    },
                    &sink
                ),
                Ok(false)
            );
        }
        let stop = SseEvent {
            event: "message_stop".into(),
            data: r#"{"type":"message_stop"}"#.into(),
        };
        assert_eq!(reply.take(stop, &sink), Ok(true));
        assert_eq!(deltas.into_inner().unwrap(), vec!["Hel", "lo"]);
        assert_eq!(
            parse_reply(&reply.into_body().unwrap()),
            Ok(AssistantTurn {
                text: "Hello".into(),
                calls: vec![ToolCall {
                    call_id: "toolu_9".into(),
                    tool: "echo".into(),
                    args: json!({"text": "hi"})
                }],
                usage: Some(Usage {
                    input_tokens: 25,
                    output_tokens: 15
                }),
            })
        );
    }

    #[test]
    fn broken_stream_events_fail_typed() {
        let sink = |_: &str| {};
        let take = |data: &str| {
            StreamedReply::default().take(
                SseEvent {
                    event: String::new(),
                    data: data.into(),
                },
                &sink,
            )
        };
        assert!(
            matches!(take("{not json"), Err(AgentError::Permanent(m)) if m.starts_with("malformed stream event"))
        );
        assert_eq!(
            take(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            Err(AgentError::transient(
                "messages stream failed: overloaded_error: Overloaded"
            ))
        );
        assert!(matches!(
            take(
                r#"{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"x"}}"#
            ),
            Err(AgentError::Permanent(_))
        ));
        // Tool input pieces that never form JSON.
        let mut reply = StreamedReply::default();
        for e in [
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "tool_use", "id": "t", "name": "echo", "input": {}}}),
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "input_json_delta", "partial_json": "{\"te"}}),
        ] {
            reply
                .take(
                    SseEvent {
                        event: String::new(),
                        data: e.to_string(),
                    },
                    &sink,
                )
                .unwrap();
        }
        let err = reply.into_body().unwrap_err();
        assert!(
            matches!(&err, AgentError::Permanent(m) if m.starts_with("unparsable input for tool call t (echo)"))
        );
    }
}
