//! [`RunView`]: a run as every read surface shows it — one shape built from each source (registry row,
//! ledger row, stored record) — and the merge of a finished registry row with its final record.

use std::borrow::Borrow;
use storage::RunId;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use storage::ledger::{LiveRow, StopMode};
use storage::record::{ChannelVisibility, RunHead, RunStatus, VisibilityFilter};

use crate::registry::RunRow;

/// A run as every read surface shows it: the same shape from every source (SPEC §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    #[schema(value_type = String)]
    pub id: RunId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub channel_id: String,
    pub user_id: String,
    pub thread_key: String,
    pub channel_visibility: ChannelVisibility,
    pub started_at: i64,
    pub finished: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    pub event_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_event_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// The strongest stop requested so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopMode>,
    /// Present (`true`) once the run's final record is in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persisted: Option<bool>,
    /// Present (`true`) for a stored tombstone: no finish was recorded (render "unfinished — no finish
    /// recorded", never "interrupted").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisional: Option<bool>,
    /// The generation a run live in another process is owned by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_gen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub parent_run_id: Option<RunId>,
    /// The run's answer (its last `answer` event), at most [`ANSWER_VIEW_CHARS`] characters with a trailing
    /// `…` (the `answer` event has it whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The `run_failed` message of a failed run (from its record, or its events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `{mode, actor?}` of the stop that ended a stopped run (its last `stop_requested`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub stopped_by: Option<Value>,
    /// `{<model>: {inputTokens, outputTokens}}` summed over the run's model calls (finished runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// How many times the run was resumed after the process holding it ended (its `resumed` events);
    /// absent when never. Records written before the field existed do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<u64>,
    /// How many of its tool calls have unknown effects: calls in flight when a process ended, settled
    /// at the resume as `effectsUnknown` results (SPEC §6.2); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects_unknown: Option<u64>,
    /// `true` when the process holding the run ended after its finishing gate, so whether its reply
    /// reached the channel is unknown (the record's `replyNote`, SPEC §6.1); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_unknown: Option<bool>,
    /// `true` while the run is parked on a tool call awaiting a person's approval (SPEC §13); absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_approval: Option<bool>,
    /// Only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<storage::record::RunEvent>>)]
    pub events: Option<Vec<Value>>,
}

impl RunView {
    /// A row of this process's registry.
    pub fn from_registry(row: &RunRow) -> Self {
        let m = &row.meta;
        RunView {
            id: row.id.clone(),
            label: Some(m.label.clone()).filter(|l| !l.is_empty()),
            agent: Some(m.agent.clone()),
            model: Some(m.model.clone()),
            channel_id: m.channel_id.clone(),
            user_id: m.user_id.clone(),
            thread_key: m.thread_key.clone(),
            channel_visibility: m.channel_visibility,
            started_at: row.started_at,
            finished: row.finished_at.is_some(),
            finished_at: row.finished_at,
            status: row.status,
            event_count: row.event_count,
            stored_event_count: Some(row.stored_event_count),
            truncated: Some(row.truncated),
            stop: row.stop,
            persisted: None,
            provisional: None,
            owner_gen: None,
            parent_run_id: m.parent_run_id.clone(),
            answer: None,
            error: None,
            stopped_by: None,
            usage: None,
            resumed: None,
            effects_unknown: None,
            delivery_unknown: None,
            awaiting_approval: None,
            events: None,
        }
        .with_marks(row.marks)
    }

    /// A stored record or listing row.
    pub fn from_head(h: &RunHead) -> Self {
        RunView {
            id: h.id.clone(),
            label: h.label.clone(),
            agent: h.agent.clone(),
            model: h.model.clone(),
            channel_id: h.channel_id.clone(),
            user_id: h.user_id.clone(),
            thread_key: h.thread_key.clone(),
            channel_visibility: h.channel_visibility,
            started_at: h.started_at,
            finished: true,
            finished_at: Some(h.finished_at),
            status: Some(h.status),
            event_count: h.event_count,
            stored_event_count: Some(h.stored_event_count),
            truncated: Some(h.truncated),
            stop: None,
            persisted: Some(true),
            provisional: h.provisional.then_some(true),
            owner_gen: None,
            parent_run_id: h.parent_run_id.clone(),
            answer: head_str(h, "answer"),
            error: head_str(h, "error"),
            stopped_by: h.extra.get("stoppedBy").cloned(),
            usage: h.extra.get("usage").cloned(),
            resumed: None,
            effects_unknown: None,
            delivery_unknown: delivery_unknown(h),
            awaiting_approval: None,
            events: None,
        }
        .with_marks(Marks::of_head(h))
    }

    /// A ledger row (a run live in some process), with the highest event seq known for it.
    pub fn from_live(row: &LiveRow, event_count: u64) -> Self {
        let id = storage::ledger::RunIdentity::from_meta(&row.thread_key, &row.meta);
        let some = |s: String| Some(s).filter(|s| !s.is_empty());
        RunView {
            id: row.run_id.clone(),
            label: some(id.label),
            agent: some(id.agent),
            model: some(id.model),
            channel_id: id.channel_id,
            user_id: id.user_id,
            thread_key: id.thread_key,
            channel_visibility: id.channel_visibility,
            started_at: row.started_at,
            finished: false,
            finished_at: None,
            status: None,
            event_count,
            stored_event_count: None,
            truncated: None,
            stop: row.stop,
            persisted: None,
            provisional: None,
            owner_gen: Some(row.owner_gen.clone()),
            parent_run_id: id.parent_run_id,
            answer: None,
            error: None,
            stopped_by: None,
            usage: None,
            resumed: None,
            effects_unknown: None,
            delivery_unknown: None,
            awaiting_approval: None,
            events: None,
        }
    }

    /// Overlay a finished live row with its (final) record: the record's finish fields win.
    pub(super) fn merge_record(&mut self, h: &RunHead) {
        self.finished = true;
        self.finished_at = Some(h.finished_at);
        self.status = Some(h.status);
        self.stored_event_count = Some(h.stored_event_count);
        self.truncated = Some(h.truncated);
        self.persisted = Some(true);
        self.usage = h.extra.get("usage").cloned();
        self.answer = head_str(h, "answer").or(self.answer.take());
        self.error = head_str(h, "error").or(self.error.take());
        self.stopped_by = h.extra.get("stoppedBy").cloned().or(self.stopped_by.take());
        self.delivery_unknown = delivery_unknown(h);
        self.add_marks(Marks::of_head(h));
    }

    /// Take what a finished run's head says from `events` when no record said it yet: the answer, the
    /// error of a failed run (the last `run_failed` message), who stopped a stopped run.
    pub fn fill_from_events<E: Borrow<Value>>(&mut self, events: &[E]) {
        self.add_marks(Marks::of(events));
        let Some(status) = self.status else { return };
        let facts = HeadFacts::of(status, events);
        self.answer = self.answer.take().or(facts.answer);
        self.error = self.error.take().or(facts.error);
        self.stopped_by = self.stopped_by.take().or(facts.stopped_by);
    }

    /// This view with `marks` taken in ([`RunView::add_marks`]).
    pub fn with_marks(mut self, marks: Marks) -> Self {
        self.add_marks(marks);
        self
    }

    /// Take in what `marks` counted: each count is the larger of the view's and the marks' (two readings
    /// of the same run, one of them perhaps from a trimmed backlog), and absent while zero.
    pub fn add_marks(&mut self, marks: Marks) {
        let larger = |have: Option<u64>, n: u64| have.max(Some(n).filter(|n| *n > 0));
        self.resumed = larger(self.resumed, marks.resumed);
        self.effects_unknown = larger(self.effects_unknown, marks.effects_unknown);
        // Only an unfinished run waits (a stop may have ended a wait before its decision).
        self.awaiting_approval = (!self.finished && marks.awaiting_approval()).then_some(true);
    }

    pub fn visible_to(&self, filter: &VisibilityFilter) -> bool {
        filter.matches(&self.channel_id, &self.user_id, self.channel_visibility)
    }

    /// The listing order key of a finished row: `(finishedAt, id)`.
    pub(super) fn key(&self) -> (i64, &str) {
        (
            self.finished_at.unwrap_or(self.started_at),
            self.id.as_str(),
        )
    }

    /// Wall time from start to finish (or to `now_ms` while live).
    pub fn duration_ms(&self, now_ms: i64) -> i64 {
        (self.finished_at.unwrap_or(now_ms) - self.started_at).max(0)
    }

    /// The status word every surface shows: `live` / `stopping` while unfinished, the third state
    /// `unfinished — no finish recorded` for a tombstone, else the status.
    pub fn status_label(&self) -> String {
        if !self.finished {
            return match self.stop {
                Some(m) => format!("stopping ({})", m.as_str()),
                None => "live".into(),
            };
        }
        if self.provisional == Some(true) {
            return "unfinished — no finish recorded".into();
        }
        self.status
            .map(|s| s.as_str().to_owned())
            .unwrap_or_else(|| "finished".into())
    }
}
/// The message of the last `run_failed` event in `events`.
pub fn failure_message<E: Borrow<Value>>(events: &[E]) -> Option<String> {
    events
        .iter()
        .map(Borrow::borrow)
        .rev()
        .find(|e| e["type"] == "run_failed")
        .and_then(|e| e["message"].as_str())
        .map(str::to_owned)
}

/// What the index marks a run for, counted from its events: resumes after the holding process ended and
/// tool calls whose effects are unknown (RunView `resumed`, `effectsUnknown`). Counted as events are
/// published (the registry's row), read from events (a record's assembly, a ledger row) or from a
/// record's head.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// `resumed` events.
    pub resumed: u64,
    /// `tool_result` events with `effectsUnknown: true`.
    pub effects_unknown: u64,
    /// `approval_requested` events (a call is requested once, however often its run parks).
    pub approvals_requested: u64,
    /// `approval_decided` events.
    pub approvals_decided: u64,
}

impl Marks {
    /// Count `e` in.
    pub fn observe(&mut self, e: &Value) {
        match e.get("type").and_then(Value::as_str) {
            Some("resumed") => self.resumed += 1,
            Some("tool_result") if e.get("effectsUnknown") == Some(&Value::Bool(true)) => {
                self.effects_unknown += 1
            }
            Some("approval_requested") => self.approvals_requested += 1,
            Some("approval_decided") => self.approvals_decided += 1,
            _ => {}
        }
    }

    /// Whether a call waits for its decision (SPEC §13): requested and not yet decided.
    pub fn awaiting_approval(&self) -> bool {
        self.approvals_requested > self.approvals_decided
    }

    /// The marks of `events`.
    pub fn of<E: Borrow<Value>>(events: &[E]) -> Marks {
        let mut marks = Marks::default();
        for e in events {
            marks.observe(e.borrow());
        }
        marks
    }

    /// The marks a record's head carries (`resumed`, `effectsUnknown`; zero when absent).
    pub fn of_head(h: &RunHead) -> Marks {
        let n = |k: &str| h.extra.get(k).and_then(Value::as_u64).unwrap_or(0);
        Marks {
            resumed: n("resumed"),
            effects_unknown: n("effectsUnknown"),
            ..Marks::default()
        }
    }
}

/// `Some(true)` when a record's `replyNote` says its delivery is unknown (a run closed from its
/// finishing gate by another process, SPEC §6.1).
fn delivery_unknown(h: &RunHead) -> Option<bool> {
    (h.reply_note.as_deref() == Some(crate::run::DELIVERY_UNKNOWN)).then_some(true)
}

/// What a finished run's head says beside its status, read from its events: one reading for the record
/// assembly and for views of runs whose record has not landed.
#[derive(Debug, Default, PartialEq)]
pub struct HeadFacts {
    /// [`answer_of`].
    pub answer: Option<String>,
    /// The last `run_failed` message, for a failed run.
    pub error: Option<String>,
    /// [`stopped_by_of`], for a stopped run.
    pub stopped_by: Option<Value>,
    /// [`Marks::of`], whatever the status.
    pub marks: Marks,
}

impl HeadFacts {
    /// Read from owned events or from references to them (the registry's backlog, read in place).
    pub fn of<E: Borrow<Value>>(status: RunStatus, events: &[E]) -> HeadFacts {
        HeadFacts {
            answer: answer_of(events),
            error: (status == RunStatus::Failed)
                .then(|| failure_message(events))
                .flatten(),
            stopped_by: matches!(status, RunStatus::StoppedSoft | RunStatus::StoppedHard)
                .then(|| stopped_by_of(events))
                .flatten(),
            marks: Marks::of(events),
        }
    }
}

/// How much of an answer a view (and a record's head) carries.
pub const ANSWER_VIEW_CHARS: usize = 2_000;

/// The run's answer as views show it: the last `answer` event's text, capped at [`ANSWER_VIEW_CHARS`].
pub fn answer_of<E: Borrow<Value>>(events: &[E]) -> Option<String> {
    let text = events
        .iter()
        .map(Borrow::borrow)
        .rev()
        .find(|e| e["type"] == "answer")
        .and_then(|e| e["text"].as_str())?;
    let mut out: String = text.chars().take(ANSWER_VIEW_CHARS).collect();
    if text.chars().nth(ANSWER_VIEW_CHARS).is_some() {
        out.push('…');
    }
    Some(out)
}

/// `{mode, actor?}` of the stop that decided a stopped run: the first hard `stop_requested`, else the
/// first one.
pub fn stopped_by_of<E: Borrow<Value>>(events: &[E]) -> Option<Value> {
    let mut stops = events
        .iter()
        .map(Borrow::borrow)
        .filter(|e| e["type"] == "stop_requested");
    let first = stops.next()?;
    let e = std::iter::once(first)
        .chain(stops)
        .find(|e| e["mode"] == "hard")
        .unwrap_or(first);
    let mut by = serde_json::json!({"mode": e.get("mode").cloned().unwrap_or(Value::Null)});
    if let Some(actor) = e.get("actor") {
        by["actor"] = actor.clone();
    }
    Some(by)
}

/// A string field a record's head carries (records written since the field existed).
fn head_str(h: &RunHead, key: &str) -> Option<String> {
    h.extra.get(key).and_then(Value::as_str).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs_service::testing::*;
    use crate::runs_service::StatusFilter;
    use serde_json::json;

    /// The head facts: the last answer (capped), a failed run's error, a stopped run's stopper — and
    /// nothing a status does not call for.
    #[test]
    fn head_facts_read_the_answer_the_error_and_the_stopper_by_status() {
        let events = vec![
            json!({"type": "answer", "text": "first"}),
            json!({"type": "stop_requested", "mode": "soft", "actor": {"kind": "token", "id": "ops"}}),
            json!({"type": "run_failed", "message": "boom"}),
            json!({"type": "answer", "text": "second"}),
        ];
        let completed = HeadFacts::of(RunStatus::Completed, &events);
        assert_eq!(
            completed,
            HeadFacts {
                answer: Some("second".into()),
                error: None,
                stopped_by: None,
                marks: Marks::default(),
            }
        );
        assert_eq!(
            HeadFacts::of(RunStatus::Failed, &events).error.as_deref(),
            Some("boom")
        );
        let stopped = HeadFacts::of(RunStatus::StoppedSoft, &events);
        assert_eq!(
            stopped.stopped_by,
            Some(json!({"mode": "soft", "actor": {"kind": "token", "id": "ops"}}))
        );
        // A hard stop after a soft one decided the run.
        let mut harder = events.clone();
        harder.push(json!({"type": "stop_requested", "mode": "hard", "actor": {"kind": "capability", "id": "r1"}}));
        harder.push(json!({"type": "stop_requested", "mode": "soft"}));
        assert_eq!(
            stopped_by_of(&harder),
            Some(json!({"mode": "hard", "actor": {"kind": "capability", "id": "r1"}}))
        );
        assert_eq!(
            HeadFacts::of::<Value>(RunStatus::Interrupted, &[]),
            HeadFacts::default()
        );
        let long = "é".repeat(ANSWER_VIEW_CHARS + 1);
        let capped = answer_of(&[json!({"type": "answer", "text": long})]).unwrap();
        assert_eq!(
            (capped.chars().count(), capped.ends_with('…')),
            (ANSWER_VIEW_CHARS + 1, true)
        );
        let exact = "a".repeat(ANSWER_VIEW_CHARS);
        assert_eq!(
            answer_of(&[json!({"type": "answer", "text": exact.clone()})]),
            Some(exact)
        );
    }

    /// A record's head carries the marks its assembly counted and says when its delivery is unknown; a
    /// head without them marks nothing.
    #[test]
    fn a_views_marks_come_from_the_head_or_the_events_whichever_counted_more() {
        let head = |extra: Value| {
            let mut v = json!({"id": "r1", "channelId": "c", "userId": "u", "threadKey": "c:t",
                "startedAt": 1, "finishedAt": 2, "status": "completed", "eventCount": 0,
                "storedEventCount": 0, "truncated": false, "events": []});
            for (k, val) in extra.as_object().unwrap() {
                v[k] = val.clone();
            }
            storage::record::validate_record(&v).unwrap().head
        };
        let marked = RunView::from_head(&head(json!({"resumed": 2, "effectsUnknown": 1,
            "replyNote": crate::run::DELIVERY_UNKNOWN})));
        assert_eq!(
            (
                marked.resumed,
                marked.effects_unknown,
                marked.delivery_unknown
            ),
            (Some(2), Some(1), Some(true))
        );
        let json = serde_json::to_value(&marked).unwrap();
        assert_eq!(
            (
                &json["resumed"],
                &json["effectsUnknown"],
                &json["deliveryUnknown"]
            ),
            (&json!(2), &json!(1), &json!(true))
        );
        let plain = RunView::from_head(&head(json!({"replyNote": "no channel to deliver to"})));
        assert_eq!(
            (plain.resumed, plain.effects_unknown, plain.delivery_unknown),
            (None, None, None)
        );
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("resumed").is_none() && json.get("deliveryUnknown").is_none());
        // Events add what the head did not count.
        let mut v = plain;
        v.fill_from_events(&[
            json!({"type": "resumed"}),
            json!({"type": "tool_result", "effectsUnknown": false}),
        ]);
        assert_eq!((v.resumed, v.effects_unknown), (Some(1), None));
    }

    #[tokio::test]
    async fn no_view_carries_a_capability_token() {
        let f = fixture();
        f.local("r1", "c1", NOW - 10, None);
        f.local("r2", "c1", NOW - 20, Some(NOW - 1));
        let list = serde_json::to_string(&f.list(StatusFilter::All).await).unwrap();
        let one = serde_json::to_string(
            &f.svc
                .get_run(&RunId::from("r1"), true, &VisibilityFilter::All)
                .await
                .unwrap(),
        )
        .unwrap();
        let feed =
            serde_json::to_string(&f.svc.index_rows(&VisibilityFilter::All).await.0).unwrap();
        for s in [list, one, feed] {
            assert!(
                !s.contains("secret-token") && !s.contains("\"token\""),
                "{s}"
            );
        }
        let v = serde_json::to_value(
            f.svc
                .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            (v["finished"].as_bool(), v.get("events")),
            (Some(false), None)
        );
    }
}
