//! Agents: given a run's conversation, produce the next assistant turn (text and/or tool calls), SPEC §8.3.
//!
//! Owns nothing durable. It defines the [`Agent`] trait, the provider-neutral turn/part vocabulary every
//! module writes into the transcript (SPEC §4.2), and the constructors for it. Built-in agents:
//! [`scripted`] (the deterministic `demo` agent) and [`openai`] (an OpenAI-compatible chat-completions
//! provider).
//!
//! Who talks to it: the run actor calls [`Agent::next`] once per step (SPEC §5.2 step 5) with the
//! system prompt, every turn after it and the tool definitions; it writes the returned
//! [`AssistantTurn::to_turn`] and, after the tools ran, a [`results_turn`] into the ledger's transcript.
//! A resume rebuilds the same [`Conversation`] from the stored turns, so an agent sees the same input
//! either way.
//!
//! # Turns and parts
//!
//! A turn is `storage::ledger::Turn { role, parts }`; each part is a JSON object with a `type`:
//!
//! | role           | parts, in order                                                                 |
//! |----------------|---------------------------------------------------------------------------------|
//! | `system`       | `{"type":"text","text":…}`                                                      |
//! | `user`         | `{"type":"text","text":…}` (a follow-up also carries `"inboxSeq": n`)           |
//! | `assistant`    | `{"type":"text","text":…}` (omitted when empty), then one `{"type":"tool_call","callId":…,"tool":…,"args":{…}}` per call |
//! | `tool_results` | one `{"type":"tool_result","callId":…,"tool":…,"ok":bool,"output":"…"}` per call, in call order, then the follow-ups folded at that step as `{"type":"text","text":…,"inboxSeq":n}` |
//!
//! Invariants:
//! - turns are built only through the constructors here ([`system_turn`], [`user_turn`],
//!   [`AssistantTurn::to_turn`], [`results_turn`], [`followups_turn`]), so every writer agrees on the
//!   shape a resume reads back;
//! - an agent is a pure function of its [`Conversation`] plus the provider's answer: it holds no
//!   per-run state, so a resumed run needs nothing but the transcript;
//! - an agent never logs message text or credentials;
//! - errors are typed: [`AgentError::Transient`] may succeed on a retry, [`AgentError::Permanent`]
//!   will not. An agent does not retry on its own; the caller decides.

pub mod openai;
pub mod scripted;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use storage::ledger::Turn;

/// The role names of the transcript.
pub mod role {
    pub const SYSTEM: &str = "system";
    pub const USER: &str = "user";
    pub const ASSISTANT: &str = "assistant";
    pub const TOOL_RESULTS: &str = "tool_results";
}

/// The part `type` values of the transcript.
pub mod part {
    pub const TEXT: &str = "text";
    pub const TOOL_CALL: &str = "tool_call";
    pub const TOOL_RESULT: &str = "tool_result";
}

/// A tool as offered to the model, with the flags a resume needs to settle an in-flight call (SPEC §6.2).
///
/// Serialized (camelCase) into the ledger's `tools_json` at promotion.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
    /// Running it has no effect outside the process: it may be re-run freely.
    pub side_effect_free: bool,
    /// It has effects, but running it again after an unknown outcome is harmless.
    pub rerun_safe: bool,
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Unique within the run; ties the result back to the call.
    pub call_id: String,
    pub tool: String,
    pub args: Value,
}

/// What the model answered: text (possibly empty) and tool calls (none means "this is the answer").
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AssistantTurn {
    pub text: String,
    pub calls: Vec<ToolCall>,
}

impl AssistantTurn {
    /// The transcript turn: a text part unless the text is empty, then one `tool_call` part per call.
    pub fn to_turn(&self) -> Turn {
        let mut parts = Vec::with_capacity(self.calls.len() + 1);
        if !self.text.is_empty() {
            parts.push(text_part(&self.text));
        }
        for call in &self.calls {
            parts.push(json!({
                "type": part::TOOL_CALL,
                "callId": call.call_id,
                "tool": call.tool,
                "args": call.args,
            }));
        }
        Turn { role: role::ASSISTANT.to_owned(), parts }
    }

    /// Reads an assistant turn back. `None` when the turn is not an assistant turn or a `tool_call`
    /// part lacks its `callId` or `tool` (a transcript that cannot be trusted). Several text parts are
    /// joined with a newline; unknown part types are skipped; a call without `args` gets `{}`.
    pub fn from_turn(t: &Turn) -> Option<AssistantTurn> {
        if t.role != role::ASSISTANT {
            return None;
        }
        let mut texts = Vec::new();
        let mut calls = Vec::new();
        for p in &t.parts {
            match part_type(p) {
                Some(part::TEXT) => texts.push(p.get("text")?.as_str()?.to_owned()),
                Some(part::TOOL_CALL) => calls.push(ToolCall {
                    call_id: p.get("callId")?.as_str()?.to_owned(),
                    tool: p.get("tool")?.as_str()?.to_owned(),
                    args: p.get("args").cloned().unwrap_or_else(|| json!({})),
                }),
                _ => {}
            }
        }
        Some(AssistantTurn { text: texts.join("\n"), calls })
    }
}

/// The outcome of one tool call, as written into a `tool_results` turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub call_id: String,
    pub tool: String,
    pub ok: bool,
    pub output: String,
}

impl ToolResult {
    /// The `tool_result` part.
    pub fn to_part(&self) -> Value {
        json!({
            "type": part::TOOL_RESULT,
            "callId": self.call_id,
            "tool": self.tool,
            "ok": self.ok,
            "output": self.output,
        })
    }

    /// Reads a `tool_result` part back; `None` for any other part or a malformed one.
    pub fn from_part(p: &Value) -> Option<ToolResult> {
        if part_type(p) != Some(part::TOOL_RESULT) {
            return None;
        }
        Some(ToolResult {
            call_id: p.get("callId")?.as_str()?.to_owned(),
            tool: p.get("tool")?.as_str()?.to_owned(),
            ok: p.get("ok")?.as_bool()?,
            output: p.get("output")?.as_str()?.to_owned(),
        })
    }
}

/// `{role: "system", parts: [text]}`.
pub fn system_turn(text: &str) -> Turn {
    Turn { role: role::SYSTEM.to_owned(), parts: vec![text_part(text)] }
}

/// `{role: "user", parts: [text]}`: the run's request message.
pub fn user_turn(text: &str) -> Turn {
    Turn { role: role::USER.to_owned(), parts: vec![text_part(text)] }
}

/// One step's results: one `tool_result` part per call (in call order), then the follow-ups folded
/// at this step as text parts carrying their `inboxSeq`.
pub fn results_turn(results: &[ToolResult], followups: &[(u64, String)]) -> Turn {
    let parts = results
        .iter()
        .map(ToolResult::to_part)
        .chain(followups.iter().map(|(seq, text)| followup_part(*seq, text)))
        .collect();
    Turn { role: role::TOOL_RESULTS.to_owned(), parts }
}

/// A user turn made of follow-ups read from the inbox after a text-only answer (SPEC §5.2 step 5).
pub fn followups_turn(followups: &[(u64, String)]) -> Turn {
    let parts = followups.iter().map(|(seq, text)| followup_part(*seq, text)).collect();
    Turn { role: role::USER.to_owned(), parts }
}

/// `{"type":"text","text":…}`.
pub fn text_part(text: &str) -> Value {
    json!({"type": part::TEXT, "text": text})
}

/// `{"type":"text","text":…,"inboxSeq":n}`: a follow-up message folded into the transcript.
pub fn followup_part(seq: u64, text: &str) -> Value {
    json!({"type": part::TEXT, "text": text, "inboxSeq": seq})
}

/// A part's `type`, when it has one.
pub fn part_type(p: &Value) -> Option<&str> {
    p.get("type").and_then(Value::as_str)
}

/// The texts of a turn's text parts, in order (follow-ups included).
pub fn texts_of(turn: &Turn) -> Vec<&str> {
    turn.parts
        .iter()
        .filter(|p| part_type(p) == Some(part::TEXT))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect()
}

/// The tool results of a `tool_results` turn, in order; malformed parts are skipped.
pub fn results_of(turn: &Turn) -> Vec<ToolResult> {
    turn.parts.iter().filter_map(ToolResult::from_part).collect()
}

/// What an agent sees for one model call.
#[derive(Debug, Clone, Copy)]
pub struct Conversation<'a> {
    /// The composed system prompt.
    pub system: &'a str,
    /// Every turn after the system turn, in transcript order.
    pub turns: &'a [Turn],
    pub tools: &'a [ToolDef],
}

/// Why a model call produced no turn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// The provider could not answer now (connect failure, timeout, 5xx, 429, 408); a retry may work.
    #[error("transient: {0}")]
    Transient(String),
    /// The call cannot succeed as made (bad request, bad credentials, malformed answer, scripted failure).
    #[error("permanent: {0}")]
    Permanent(String),
}

impl AgentError {
    pub fn is_transient(&self) -> bool {
        matches!(self, AgentError::Transient(_))
    }
}

/// A model: the conversation in, the next assistant turn out.
///
/// Shared across runs (`Arc<dyn Agent>`); implementations keep no per-run state.
pub trait Agent: Send + Sync + 'static {
    /// `"scripted"` or `"openai"`.
    fn kind(&self) -> &'static str;
    /// The model name recorded with the run (`"scripted"` for the scripted agent).
    fn model(&self) -> &str;
    /// The next assistant turn. Dropping the future abandons the call (a hard stop does).
    fn next<'a>(&'a self, conv: Conversation<'a>) -> BoxFuture<'a, Result<AssistantTurn, AgentError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assistant_turn_round_trips_through_the_transcript_shape() {
        let turn = AssistantTurn {
            text: "step 1".into(),
            calls: vec![ToolCall { call_id: "call-1".into(), tool: "sleep".into(), args: json!({"ms": 5}) }],
        };
        let t = turn.to_turn();
        assert_eq!(t.role, "assistant");
        assert_eq!(
            t.parts,
            vec![
                json!({"type": "text", "text": "step 1"}),
                json!({"type": "tool_call", "callId": "call-1", "tool": "sleep", "args": {"ms": 5}}),
            ]
        );
        assert_eq!(AssistantTurn::from_turn(&t), Some(turn));
    }

    #[test]
    fn empty_assistant_text_writes_no_text_part() {
        let turn = AssistantTurn {
            text: String::new(),
            calls: vec![ToolCall { call_id: "c".into(), tool: "echo".into(), args: json!({"text": "x"}) }],
        };
        let t = turn.to_turn();
        assert_eq!(t.parts.len(), 1);
        assert_eq!(part_type(&t.parts[0]), Some("tool_call"));
        assert_eq!(AssistantTurn::from_turn(&t), Some(turn));
    }

    #[test]
    fn from_turn_refuses_other_roles_and_calls_without_ids() {
        assert_eq!(AssistantTurn::from_turn(&user_turn("hi")), None);
        let broken = Turn { role: "assistant".into(), parts: vec![json!({"type": "tool_call", "tool": "sleep"})] };
        assert_eq!(AssistantTurn::from_turn(&broken), None);
        // A call without args reads back with an empty object.
        let bare = Turn {
            role: "assistant".into(),
            parts: vec![json!({"type": "tool_call", "callId": "c", "tool": "sleep"})],
        };
        assert_eq!(AssistantTurn::from_turn(&bare).unwrap().calls[0].args, json!({}));
    }

    #[test]
    fn results_turn_lists_results_in_order_then_followups_with_their_seq() {
        let results = vec![
            ToolResult { call_id: "a".into(), tool: "sleep".into(), ok: true, output: "slept 1 ms".into() },
            ToolResult { call_id: "b".into(), tool: "echo".into(), ok: false, output: "missing field `text`".into() },
        ];
        let t = results_turn(&results, &[(7, "also this".into())]);
        assert_eq!(t.role, "tool_results");
        assert_eq!(
            t.parts,
            vec![
                json!({"type": "tool_result", "callId": "a", "tool": "sleep", "ok": true, "output": "slept 1 ms"}),
                json!({"type": "tool_result", "callId": "b", "tool": "echo", "ok": false, "output": "missing field `text`"}),
                json!({"type": "text", "text": "also this", "inboxSeq": 7}),
            ]
        );
        assert_eq!(results_of(&t), results);
        assert_eq!(texts_of(&t), vec!["also this"]);
    }

    #[test]
    fn simple_turns_have_one_text_part() {
        assert_eq!(system_turn("be brief").parts, vec![json!({"type": "text", "text": "be brief"})]);
        assert_eq!(system_turn("be brief").role, "system");
        assert_eq!(user_turn("hello").role, "user");
        let f = followups_turn(&[(3, "one".into()), (4, "two".into())]);
        assert_eq!(f.role, "user");
        assert_eq!(
            f.parts,
            vec![
                json!({"type": "text", "text": "one", "inboxSeq": 3}),
                json!({"type": "text", "text": "two", "inboxSeq": 4}),
            ]
        );
    }

    #[test]
    fn tool_def_serializes_camel_case() {
        let def = ToolDef {
            name: "echo".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
            side_effect_free: true,
            rerun_safe: true,
        };
        assert_eq!(
            serde_json::to_value(&def).unwrap(),
            json!({"name": "echo", "description": "d", "parameters": {"type": "object"},
                   "sideEffectFree": true, "rerunSafe": true})
        );
    }
}
