//! Agents: given a run's conversation, produce the next assistant turn (text and/or tool calls), SPEC §8.3.
//!
//! Owns nothing durable. It defines the [`Agent`] trait, the provider-neutral turn/part vocabulary every
//! module writes into the transcript (SPEC §4.2), and the constructors for it. Built-in agents:
//! [`scripted`] (the deterministic `demo` agent), [`openai`] (an OpenAI-compatible chat-completions
//! provider) and [`anthropic`] (the Anthropic Messages API); [`http`] holds what the two providers share
//! (per-thread clients, status classification, `Retry-After`, server-sent events).
//!
//! Who talks to it: the run actor calls [`Agent::next`] (or [`Agent::next_streaming`] when the agent is
//! configured with `stream = true`) once per model call (SPEC §5.2 step 5) with the system prompt, every
//! turn after it and the tool definitions; it writes the returned [`AssistantTurn::to_turn`] and, after
//! the tools ran, a [`results_turn`] into the ledger's transcript. A resume rebuilds the same
//! [`Conversation`] from the stored turns, so an agent sees the same input either way. On a transient
//! error the run waits [`RetryPolicy::wait`] and calls again.
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
//! Token [`Usage`] travels with the [`AssistantTurn`] the agent answers, not in the transcript: the run
//! puts it on the assistant event and sums it into the record (SPEC §8.3).
//!
//! Invariants:
//! - turns are built only through the constructors here ([`system_turn`], [`user_turn`],
//!   [`AssistantTurn::to_turn`], [`results_turn`], [`followups_turn`]), so every writer agrees on the
//!   shape a resume reads back;
//! - an agent is a pure function of its [`Conversation`] plus the provider's answer: it holds no
//!   per-run state, so a resumed run needs nothing but the transcript;
//! - an agent never logs message text or credentials;
//! - errors are typed: [`AgentError::Transient`] may succeed on a retry (and may say when, from the
//!   provider's `Retry-After`), [`AgentError::Permanent`] will not. An agent does not retry on its own;
//!   the caller decides, with a [`RetryPolicy`];
//! - streamed text deltas are a preview only: the completed turn an agent answers is the truth, whether
//!   or not deltas were reported.

pub mod anthropic;
pub mod http;
pub mod openai;
pub mod scripted;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use std::time::Duration;
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
    /// An HTTP tool declared `idempotent` or an MCP tool annotated `idempotentHint: true`: a call in
    /// flight at a crash is re-sent with the same idempotency key (`how: "resent"`, SPEC §6.2).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idempotent: bool,
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Unique within the run; ties the result back to the call.
    pub call_id: String,
    pub tool: String,
    pub args: Value,
}

/// Tokens one model call consumed, as the provider reported them (SPEC §8.3 "Token usage").
///
/// A wire type: it appears as `usage {inputTokens, outputTokens}` on assistant events and, summed per
/// model, on the run record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Prompt tokens (OpenAI `prompt_tokens`, Anthropic `input_tokens`).
    pub input_tokens: u64,
    /// Generated tokens (OpenAI `completion_tokens`, Anthropic `output_tokens`).
    pub output_tokens: u64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, other: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
        }
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        *self = *self + other;
    }
}

/// Usage summed per model over `events`' `assistant` events (what a resumed run starts its totals from).
pub fn usage_of(events: &[serde_json::Value]) -> std::collections::BTreeMap<String, Usage> {
    let mut totals = std::collections::BTreeMap::<String, Usage>::new();
    for e in events.iter().filter(|e| e["type"] == "assistant") {
        let (Some(model), Ok(usage)) = (
            e["model"].as_str(),
            serde_json::from_value::<Usage>(e["usage"].clone()),
        ) else {
            continue;
        };
        *totals.entry(model.to_owned()).or_default() += usage;
    }
    totals
}

/// What the model answered: text (possibly empty) and tool calls (none means "this is the answer").
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AssistantTurn {
    pub text: String,
    pub calls: Vec<ToolCall>,
    /// The tokens the call consumed; `None` when the provider did not say (and for a turn read back
    /// from the transcript, which does not store it).
    pub usage: Option<Usage>,
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
        Turn {
            role: role::ASSISTANT.to_owned(),
            parts,
        }
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
        Some(AssistantTurn {
            text: texts.join("\n"),
            calls,
            usage: None,
        })
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
    Turn {
        role: role::SYSTEM.to_owned(),
        parts: vec![text_part(text)],
    }
}

/// `{role: "user", parts: [text]}`: the run's request message.
pub fn user_turn(text: &str) -> Turn {
    Turn {
        role: role::USER.to_owned(),
        parts: vec![text_part(text)],
    }
}

/// One step's results: one `tool_result` part per call (in call order), then the follow-ups folded
/// at this step as text parts carrying their `inboxSeq`.
pub fn results_turn(results: &[ToolResult], followups: &[(u64, String)]) -> Turn {
    let parts = results
        .iter()
        .map(ToolResult::to_part)
        .chain(
            followups
                .iter()
                .map(|(seq, text)| followup_part(*seq, text)),
        )
        .collect();
    Turn {
        role: role::TOOL_RESULTS.to_owned(),
        parts,
    }
}

/// A user turn made of follow-ups read from the inbox after a text-only answer (SPEC §5.2 step 5).
pub fn followups_turn(followups: &[(u64, String)]) -> Turn {
    let parts = followups
        .iter()
        .map(|(seq, text)| followup_part(*seq, text))
        .collect();
    Turn {
        role: role::USER.to_owned(),
        parts,
    }
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
    turn.parts
        .iter()
        .filter_map(ToolResult::from_part)
        .collect()
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

/// Receives streamed text deltas, in order, while a model call runs (see [`Agent::next_streaming`]).
///
/// `Sync` because the call's future holds a reference to it across awaits and must stay `Send`; an
/// `UnboundedSender<String>` captured in a closure qualifies. It is called on the calling task, so it
/// must not block.
pub type DeltaFn<'a> = dyn Fn(&str) + Sync + 'a;

/// Why a model call produced no turn.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// The provider could not answer now (connect failure, timeout, 5xx, 429, 408, a stream cut short);
    /// a retry may work.
    #[error("transient: {message}")]
    Transient {
        message: String,
        /// How long the provider asked us to wait (its `Retry-After`, seconds or an HTTP date, as a
        /// duration from when the answer arrived); `None` when it did not say.
        retry_after: Option<Duration>,
    },
    /// The call cannot succeed as made (bad request, bad credentials, malformed answer, scripted failure).
    #[error("permanent: {0}")]
    Permanent(String),
}

impl AgentError {
    /// A transient error without a `Retry-After`.
    pub fn transient(message: impl Into<String>) -> AgentError {
        AgentError::Transient {
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn permanent(message: impl Into<String>) -> AgentError {
        AgentError::Permanent(message.into())
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, AgentError::Transient { .. })
    }

    /// The provider's requested wait, for a transient error that carried one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AgentError::Transient { retry_after, .. } => *retry_after,
            AgentError::Permanent(_) => None,
        }
    }

    /// The message without the `transient: ` / `permanent: ` prefix.
    pub fn message(&self) -> &str {
        match self {
            AgentError::Transient { message, .. } | AgentError::Permanent(message) => message,
        }
    }
}

/// How a run retries an agent's transient errors (SPEC §8.3 `[agents.NAME.retry]`).
///
/// Pure: [`RetryPolicy::wait`] takes the jitter from the caller, so the schedule is a function of its
/// inputs and the caller owns the randomness (and the clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (≥ 1; 1 means "never retry").
    pub max_attempts: u32,
    /// The backoff ceiling before the first retry.
    pub initial: Duration,
    /// The backoff cap, and the longest `Retry-After` the run is willing to honour.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_millis(1000),
            max: Duration::from_millis(30_000),
        }
    }
}

impl RetryPolicy {
    /// How long to wait after attempt `attempt` (1-based; 0 counts as 1) failed transiently, or `None`
    /// to stop retrying: the attempts are spent, or the provider's `retry_after` exceeds [`Self::max`].
    ///
    /// The wait is `max(full-jitter backoff, retry_after)`, where the backoff is
    /// `min(initial · 2^(attempt−1), max) · jitter` and `jitter` is a uniform draw from `0..=1` supplied
    /// by the caller (clamped into that range; a NaN counts as 0).
    pub fn wait(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        jitter: f64,
    ) -> Option<Duration> {
        let attempt = attempt.max(1);
        if attempt >= self.max_attempts {
            return None;
        }
        if retry_after.is_some_and(|r| r > self.max) {
            return None;
        }
        let factor = 1u32.checked_shl(attempt - 1).unwrap_or(u32::MAX);
        let ceiling = self
            .initial
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max);
        let jitter = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        let backoff = ceiling.mul_f64(jitter);
        Some(backoff.max(retry_after.unwrap_or(Duration::ZERO)))
    }
}

/// A model: the conversation in, the next assistant turn out.
///
/// Shared across runs (`Arc<dyn Agent>`); implementations keep no per-run state.
pub trait Agent: Send + Sync + 'static {
    /// `"scripted"`, `"openai"` or `"anthropic"`.
    fn kind(&self) -> &'static str;
    /// The model name recorded with the run (`"scripted"` for the scripted agent).
    fn model(&self) -> &str;
    /// The next assistant turn. Dropping the future abandons the call (a hard stop does).
    fn next<'a>(
        &'a self,
        conv: Conversation<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>>;
    /// The next assistant turn, reporting its text to `on_delta` piece by piece as it is generated
    /// (the providers ask for a streamed answer). The completed turn (with usage) is still the answer;
    /// the deltas of a call that then fails are to be discarded by the caller. The default reports
    /// nothing and answers [`Agent::next`].
    fn next_streaming<'a>(
        &'a self,
        conv: Conversation<'a>,
        on_delta: &'a DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        let _ = on_delta;
        self.next(conv)
    }
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    #[test]
    fn usage_of_sums_assistant_events_per_model_and_skips_the_rest() {
        let events = vec![
            serde_json::json!({"type": "assistant", "model": "m1", "usage": {"inputTokens": 3, "outputTokens": 4}}),
            serde_json::json!({"type": "assistant", "model": "m1", "usage": {"inputTokens": 1, "outputTokens": 11}}),
            serde_json::json!({"type": "assistant", "model": "m2", "usage": {"inputTokens": 2, "outputTokens": 0}}),
            serde_json::json!({"type": "assistant", "text": "no usage"}),
            serde_json::json!({"type": "tool_result", "model": "m1", "usage": {"inputTokens": 9, "outputTokens": 9}}),
        ];
        let totals = usage_of(&events);
        assert_eq!(totals.len(), 2);
        assert_eq!(
            totals["m1"],
            Usage {
                input_tokens: 4,
                output_tokens: 15
            }
        );
        assert_eq!(
            totals["m2"],
            Usage {
                input_tokens: 2,
                output_tokens: 0
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assistant_turn_round_trips_through_the_transcript_shape() {
        let turn = AssistantTurn {
            text: "step 1".into(),
            calls: vec![ToolCall {
                call_id: "call-1".into(),
                tool: "sleep".into(),
                args: json!({"ms": 5}),
            }],
            usage: None,
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
            calls: vec![ToolCall {
                call_id: "c".into(),
                tool: "echo".into(),
                args: json!({"text": "x"}),
            }],
            usage: None,
        };
        let t = turn.to_turn();
        assert_eq!(t.parts.len(), 1);
        assert_eq!(part_type(&t.parts[0]), Some("tool_call"));
        assert_eq!(AssistantTurn::from_turn(&t), Some(turn));
    }

    #[test]
    fn from_turn_refuses_other_roles_and_calls_without_ids() {
        assert_eq!(AssistantTurn::from_turn(&user_turn("hi")), None);
        let broken = Turn {
            role: "assistant".into(),
            parts: vec![json!({"type": "tool_call", "tool": "sleep"})],
        };
        assert_eq!(AssistantTurn::from_turn(&broken), None);
        // A call without args reads back with an empty object.
        let bare = Turn {
            role: "assistant".into(),
            parts: vec![json!({"type": "tool_call", "callId": "c", "tool": "sleep"})],
        };
        assert_eq!(
            AssistantTurn::from_turn(&bare).unwrap().calls[0].args,
            json!({})
        );
    }

    #[test]
    fn results_turn_lists_results_in_order_then_followups_with_their_seq() {
        let results = vec![
            ToolResult {
                call_id: "a".into(),
                tool: "sleep".into(),
                ok: true,
                output: "slept 1 ms".into(),
            },
            ToolResult {
                call_id: "b".into(),
                tool: "echo".into(),
                ok: false,
                output: "missing field `text`".into(),
            },
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
        assert_eq!(
            system_turn("be brief").parts,
            vec![json!({"type": "text", "text": "be brief"})]
        );
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
            idempotent: false,
        };
        assert_eq!(
            serde_json::to_value(&def).unwrap(),
            json!({"name": "echo", "description": "d", "parameters": {"type": "object"},
                   "sideEffectFree": true, "rerunSafe": true})
        );
    }

    #[test]
    fn usage_does_not_enter_the_transcript_and_reads_back_as_none() {
        let turn = AssistantTurn {
            text: "hi".into(),
            calls: vec![],
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 3,
            }),
        };
        let t = turn.to_turn();
        assert_eq!(t.parts, vec![json!({"type": "text", "text": "hi"})]);
        assert_eq!(
            AssistantTurn::from_turn(&t),
            Some(AssistantTurn {
                usage: None,
                ..turn
            })
        );
    }

    #[test]
    fn usage_serializes_camel_case_and_sums() {
        let a = Usage {
            input_tokens: 10,
            output_tokens: 2,
        };
        assert_eq!(
            serde_json::to_value(a).unwrap(),
            json!({"inputTokens": 10, "outputTokens": 2})
        );
        let back: Usage =
            serde_json::from_value(json!({"inputTokens": 1, "outputTokens": 4})).unwrap();
        let mut total = a + back;
        assert_eq!(
            total,
            Usage {
                input_tokens: 11,
                output_tokens: 6
            }
        );
        total += Usage {
            input_tokens: u64::MAX,
            output_tokens: 0,
        };
        assert_eq!(total.input_tokens, u64::MAX, "sums saturate");
    }

    #[test]
    fn agent_errors_say_whether_and_when_to_retry() {
        let t = AgentError::Transient {
            message: "http 429".into(),
            retry_after: Some(Duration::from_secs(3)),
        };
        assert!(t.is_transient());
        assert_eq!(t.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(t.to_string(), "transient: http 429");
        assert_eq!(t.message(), "http 429");
        let t = AgentError::transient("reset");
        assert!(t.is_transient());
        assert_eq!(t.retry_after(), None);
        let p = AgentError::permanent("http 400");
        assert!(!p.is_transient());
        assert_eq!(p.retry_after(), None);
        assert_eq!(p.to_string(), "permanent: http 400");
    }

    #[test]
    fn retry_policy_waits_full_jitter_backoff_or_retry_after_whichever_is_longer() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        // The defaults: 5 attempts in total, 1 s doubling, capped at 30 s.
        let p = RetryPolicy::default();
        assert_eq!(
            p,
            RetryPolicy {
                max_attempts: 5,
                initial: s(1),
                max: s(30)
            }
        );
        // (name, policy, attempt, Retry-After, jitter draw, the wait wanted)
        type Case = (
            &'static str,
            RetryPolicy,
            u32,
            Option<Duration>,
            f64,
            Option<Duration>,
        );
        let cases: Vec<Case> = vec![
            (
                "first failure, full jitter draw",
                p,
                1,
                None,
                1.0,
                Some(s(1)),
            ),
            ("first failure, half jitter", p, 1, None, 0.5, Some(ms(500))),
            (
                "jitter 0 waits nothing",
                p,
                1,
                None,
                0.0,
                Some(Duration::ZERO),
            ),
            ("second failure doubles", p, 2, None, 1.0, Some(s(2))),
            ("fourth failure is 8 s", p, 4, None, 1.0, Some(s(8))),
            ("fifth failure: attempts spent", p, 5, None, 1.0, None),
            ("beyond the attempts: still spent", p, 9, None, 1.0, None),
            ("attempt 0 counts as the first", p, 0, None, 1.0, Some(s(1))),
            (
                "retry-after longer than the backoff wins",
                p,
                1,
                Some(s(3)),
                1.0,
                Some(s(3)),
            ),
            (
                "backoff longer than retry-after wins",
                p,
                4,
                Some(s(3)),
                1.0,
                Some(s(8)),
            ),
            (
                "retry-after of exactly max is honoured",
                p,
                1,
                Some(s(30)),
                0.2,
                Some(s(30)),
            ),
            (
                "retry-after above max ends the retries",
                p,
                1,
                Some(ms(30_001)),
                1.0,
                None,
            ),
            (
                "retry-after zero: the backoff stands",
                p,
                2,
                Some(Duration::ZERO),
                0.25,
                Some(ms(500)),
            ),
            ("jitter above 1 is clamped", p, 1, None, 7.0, Some(s(1))),
            (
                "negative jitter is clamped",
                p,
                1,
                None,
                -1.0,
                Some(Duration::ZERO),
            ),
            (
                "NaN jitter counts as 0",
                p,
                1,
                None,
                f64::NAN,
                Some(Duration::ZERO),
            ),
            (
                "the cap applies before the jitter",
                RetryPolicy {
                    max_attempts: 10,
                    initial: s(1),
                    max: s(5),
                },
                6,
                None,
                0.5,
                Some(ms(2500)),
            ),
            (
                "huge attempt numbers do not overflow",
                RetryPolicy {
                    max_attempts: u32::MAX,
                    initial: s(1),
                    max: s(30),
                },
                200,
                None,
                1.0,
                Some(s(30)),
            ),
            (
                "one attempt means never retry",
                RetryPolicy {
                    max_attempts: 1,
                    initial: s(1),
                    max: s(30),
                },
                1,
                None,
                1.0,
                None,
            ),
            (
                "zero initial retries at once",
                RetryPolicy {
                    max_attempts: 3,
                    initial: Duration::ZERO,
                    max: Duration::ZERO,
                },
                2,
                None,
                1.0,
                Some(Duration::ZERO),
            ),
        ];
        for (name, policy, attempt, retry_after, jitter, want) in cases {
            assert_eq!(policy.wait(attempt, retry_after, jitter), want, "{name}");
        }
    }
}
