//! The run's event vocabulary (SPEC §3, §5.2): every event a run writes, typed by its `type`. It is what
//! the API's event pages and the SSE `data:` frames carry and what the record keeps; the OpenAPI document
//! describes events with it (`oneOf` by `type`). Records still keep each event as JSON, so an event a newer
//! version writes rides through an older one verbatim; a test runs real runs and checks every event they
//! wrote reads as a [`RunEvent`] and writes back the same JSON.

use crate::RunId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::ChannelVisibility;

/// The registry's stamps: the event's place in the run and when it was published (absent before).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Stamp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
}

/// Where an `input` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InputOrigin {
    /// The message that started the run.
    Request,
    /// A message steered into the live run (or carried by a successor run).
    Followup,
}

/// One event of a run, by its `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// The run's identity (seq 1).
    #[serde(rename_all = "camelCase")]
    RunMeta {
        #[serde(flatten)]
        stamp: Stamp,
        agent: Option<String>,
        model: Option<String>,
        label: Option<String>,
        thread_key: String,
        channel_id: String,
        user_id: String,
        channel_visibility: ChannelVisibility,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<String>)]
        parent_run_id: Option<RunId>,
    },
    /// An accepted message: exactly one per message (SPEC §3).
    #[serde(rename_all = "camelCase")]
    Input {
        #[serde(flatten)]
        stamp: Stamp,
        text: String,
        source: InputOrigin,
        /// The inbox row a follow-up was read from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inbox_seq: Option<u64>,
        /// The text was capped for publishing (the transcript keeps it whole).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<bool>,
    },
    /// The model's turn of a step.
    #[serde(rename_all = "camelCase")]
    Assistant {
        #[serde(flatten)]
        stamp: Stamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// `{inputTokens, outputTokens}` when the provider reported usage.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        usage: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<bool>,
    },
    /// A piece of the model's text while it streams (live viewers only; never stored).
    #[serde(rename_all = "camelCase")]
    AssistantDelta {
        step: u64,
        attempt: u32,
        text: String,
    },
    /// A tool call of a step, published with the step record that names it.
    #[serde(rename_all = "camelCase")]
    ToolCall {
        #[serde(flatten)]
        stamp: Stamp,
        call_id: String,
        tool: String,
        /// The call's input, redacted and capped (200 characters).
        summary: String,
        step: u64,
    },
    /// A tool call's result.
    #[serde(rename_all = "camelCase")]
    ToolResult {
        #[serde(flatten)]
        stamp: Stamp,
        call_id: String,
        tool: String,
        ok: bool,
        /// The output, redacted and capped (200 characters).
        summary: String,
        step: u64,
        /// Settled at a resume: whether the call's effects happened is not known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        effects_unknown: Option<bool>,
        /// A person (or the approval timeout) denied the call: it never ran (SPEC §13).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        denied: Option<bool>,
        /// A stop ended the call's wait for approval: it never ran.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_run: Option<bool>,
    },
    /// A call waits for a person's approval (SPEC §13); the run is parked until it is decided.
    #[serde(rename_all = "camelCase")]
    ApprovalRequested {
        #[serde(flatten)]
        stamp: Stamp,
        call_id: String,
        tool: String,
        /// The call's arguments, as the model gave them; absent when over 16 KiB (the summary stays).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        input: Option<Value>,
        /// The arguments, redacted and capped (200 characters).
        summary: String,
        step: u64,
    },
    /// The decision on a call awaiting approval, committed before the call runs (or answers denied).
    #[serde(rename_all = "camelCase")]
    ApprovalDecided {
        #[serde(flatten)]
        stamp: Stamp,
        call_id: String,
        tool: String,
        decision: crate::ledger::Decision,
        /// `token:<name>`, `capability`, `slack:<user>` or `timeout`.
        who: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        step: u64,
    },
    /// Something the run, a recovery or a reader notes (`kind`: `reclaimed`, `ledger_detached`,
    /// `budget_exhausted`, `no_card`, `transcript_gap`, …).
    #[serde(rename_all = "camelCase")]
    Note {
        #[serde(flatten)]
        stamp: Stamp,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<bool>,
    },
    /// A transient model error, retried after `waitMs`.
    #[serde(rename_all = "camelCase")]
    ModelRetry {
        #[serde(flatten)]
        stamp: Stamp,
        attempt: u32,
        wait_ms: u64,
        error: String,
        step: u64,
    },
    /// The run's answer (at most one).
    #[serde(rename_all = "camelCase")]
    Answer {
        #[serde(flatten)]
        stamp: Stamp,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<bool>,
    },
    /// The run failed: what failed it, redacted and capped.
    #[serde(rename_all = "camelCase")]
    RunFailed {
        #[serde(flatten)]
        stamp: Stamp,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<bool>,
    },
    /// A stop was asked for (`soft` at the next step boundary, `hard` at once), and by whom.
    #[serde(rename_all = "camelCase")]
    StopRequested {
        #[serde(flatten)]
        stamp: Stamp,
        mode: String,
        /// `{kind, id}` of who asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<Object>)]
        actor: Option<Value>,
    },
    /// The run goes on under another generation, with how each call in flight was settled.
    #[serde(rename_all = "camelCase")]
    Resumed {
        #[serde(flatten)]
        stamp: Stamp,
        /// `{callId, tool, how}` for each call the crashed step had in flight.
        #[serde(default)]
        #[schema(value_type = Vec<Object>)]
        settled: Vec<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_generation: Option<String>,
    },
}

impl From<RunEvent> for Value {
    /// The event as the record keeps it and the wire carries it: the one place a run's event becomes JSON.
    fn from(event: RunEvent) -> Value {
        serde_json::to_value(event).expect("a RunEvent serializes: every map in it has string keys")
    }
}

impl RunEvent {
    /// A `note`: what happened to the run (`kind`) and a summary the caller redacted and capped.
    pub fn note(kind: &str, summary: impl Into<String>) -> RunEvent {
        RunEvent::Note {
            stamp: Stamp::default(),
            kind: Some(kind.to_owned()),
            summary: Some(summary.into()),
            truncated: None,
        }
    }

    /// The run's `answer`.
    pub fn answer(text: impl Into<String>) -> RunEvent {
        RunEvent::Answer {
            stamp: Stamp::default(),
            text: text.into(),
            truncated: None,
        }
    }

    /// `run_failed` with the summary of why.
    pub fn run_failed(message: impl Into<String>) -> RunEvent {
        RunEvent::RunFailed {
            stamp: Stamp::default(),
            message: message.into(),
            truncated: None,
        }
    }

    /// `resumed`: the calls in flight settled at resume, and the generation the run came from.
    pub fn resumed(settled: Vec<Value>, from_generation: Option<String>) -> RunEvent {
        RunEvent::Resumed {
            stamp: Stamp::default(),
            settled,
            from_generation,
        }
    }

    /// A `tool_result` of step `step` (the flags unset).
    pub fn tool_result(
        call_id: &str,
        tool: &str,
        ok: bool,
        summary: String,
        step: u64,
    ) -> RunEvent {
        RunEvent::ToolResult {
            stamp: Stamp::default(),
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            ok,
            summary,
            step,
            effects_unknown: None,
            denied: None,
            not_run: None,
        }
    }

    /// The same event stamped with its place in the run (for events written outside the registry: the
    /// admission's first events, a closing record's last ones). An `assistant_delta` is never stored and
    /// carries no stamp.
    pub fn stamped(mut self, seq: u64, at: i64) -> RunEvent {
        if let Some(stamp) = self.stamp_mut() {
            *stamp = Stamp {
                seq: Some(seq),
                at: Some(at),
            };
        }
        self
    }

    fn stamp_mut(&mut self) -> Option<&mut Stamp> {
        let stamp = match self {
            RunEvent::RunMeta { stamp, .. }
            | RunEvent::Input { stamp, .. }
            | RunEvent::Assistant { stamp, .. }
            | RunEvent::ToolCall { stamp, .. }
            | RunEvent::ToolResult { stamp, .. }
            | RunEvent::ApprovalRequested { stamp, .. }
            | RunEvent::ApprovalDecided { stamp, .. }
            | RunEvent::Note { stamp, .. }
            | RunEvent::ModelRetry { stamp, .. }
            | RunEvent::Answer { stamp, .. }
            | RunEvent::RunFailed { stamp, .. }
            | RunEvent::StopRequested { stamp, .. }
            | RunEvent::Resumed { stamp, .. } => stamp,
            RunEvent::AssistantDelta { .. } => return None,
        };
        Some(stamp)
    }

    /// `type`, as written.
    pub fn kind(&self) -> &'static str {
        match self {
            RunEvent::RunMeta { .. } => "run_meta",
            RunEvent::Input { .. } => "input",
            RunEvent::Assistant { .. } => "assistant",
            RunEvent::AssistantDelta { .. } => "assistant_delta",
            RunEvent::ToolCall { .. } => "tool_call",
            RunEvent::ToolResult { .. } => "tool_result",
            RunEvent::Note { .. } => "note",
            RunEvent::ModelRetry { .. } => "model_retry",
            RunEvent::Answer { .. } => "answer",
            RunEvent::RunFailed { .. } => "run_failed",
            RunEvent::StopRequested { .. } => "stop_requested",
            RunEvent::Resumed { .. } => "resumed",
            RunEvent::ApprovalRequested { .. } => "approval_requested",
            RunEvent::ApprovalDecided { .. } => "approval_decided",
        }
    }

    /// Read a stored event: `Err` names what does not fit the vocabulary.
    pub fn parse(event: &Value) -> Result<RunEvent, String> {
        serde_json::from_value(event.clone()).map_err(|e| e.to_string())
    }

    /// Whether `event` reads as a [`RunEvent`] and writes back as the same JSON (nothing it carries is
    /// outside the vocabulary). Answers what differs otherwise.
    pub fn round_trips(event: &Value) -> Result<(), String> {
        let typed = RunEvent::parse(event)?;
        let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
        if &back == event {
            Ok(())
        } else {
            Err(format!("{event} reads back as {back}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_of_event_reads_and_writes_back_the_same() {
        for event in [
            json!({"type": "run_meta", "seq": 1, "at": 5, "agent": "demo", "model": "scripted", "label": "hi",
                "threadKey": "c:t", "channelId": "c", "userId": "u", "channelVisibility": "machine"}),
            json!({"type": "input", "seq": 2, "at": 5, "text": "hi", "source": "request"}),
            json!({"type": "input", "seq": 9, "at": 5, "text": "more", "source": "followup", "inboxSeq": 3, "truncated": true}),
            json!({"type": "assistant", "seq": 3, "at": 6, "step": 1, "text": "", "model": "m",
                "usage": {"inputTokens": 1, "outputTokens": 2}}),
            json!({"type": "assistant_delta", "step": 1, "attempt": 0, "text": "He"}),
            json!({"type": "tool_call", "seq": 4, "at": 6, "callId": "c1", "tool": "echo", "summary": "{}", "step": 1}),
            json!({"type": "tool_result", "seq": 5, "at": 7, "callId": "c1", "tool": "echo", "ok": true,
                "summary": "x", "step": 1, "effectsUnknown": true}),
            json!({"type": "note", "seq": 6, "at": 7, "kind": "reclaimed", "summary": "why"}),
            json!({"type": "model_retry", "seq": 7, "at": 7, "attempt": 1, "waitMs": 500, "error": "429", "step": 2}),
            json!({"type": "answer", "seq": 8, "at": 8, "text": "done"}),
            json!({"type": "run_failed", "seq": 8, "at": 8, "message": "boom"}),
            json!({"type": "stop_requested", "seq": 8, "at": 8, "mode": "soft", "actor": {"kind": "token", "id": "ops"}}),
            json!({"type": "resumed", "seq": 1008, "at": 9, "settled": [{"callId": "c1", "tool": "echo", "how": "rerun"}],
                "fromGeneration": "g1"}),
        ] {
            assert_eq!(RunEvent::round_trips(&event), Ok(()), "{event}");
            assert_eq!(RunEvent::parse(&event).unwrap().kind(), event["type"]);
        }
    }

    #[test]
    fn an_event_outside_the_vocabulary_is_named() {
        assert!(RunEvent::parse(&json!({"type": "teleported"})).is_err());
        assert!(
            RunEvent::parse(&json!({"type": "answer"})).is_err(),
            "an answer has text"
        );
        let extra = json!({"type": "answer", "text": "x", "mood": "happy"});
        assert!(RunEvent::round_trips(&extra).unwrap_err().contains("mood"));
    }
}
