//! The run a transaction that frees a thread admits (SPEC §5.2 step 8, §5.1): from the unread steering
//! messages and the queue the freed run leaves behind.

use crate::RunId;
use serde_json::{Map, Value};

use super::{decisions, label_of, Admit, InboxItem, LiveRow, RunIdentity, StepRecord, Strategy};

/// The run a finish (or a reclaim's close) admits in the same transaction for follow-ups the finished
/// run never read (SPEC §5.2 step 8): its pre-minted id and how far the finishing run read its inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Successor {
    pub run_id: RunId,
    pub lease_ms: i64,
    /// The highest inbox seq the finishing run folded in; the last step record's counts too.
    pub inbox_consumed: Option<u64>,
}

/// What [`RunLedger::successor_facts`](super::RunLedger::successor_facts) reads.
#[derive(Debug, Clone, PartialEq)]
pub struct SuccessorFacts {
    pub row: LiveRow,
    pub last_step: Option<StepRecord>,
    pub inbox: Vec<InboxItem>,
}

impl SuccessorFacts {
    /// The facts once `record` is written as a step: it is the highest step record unless a higher one
    /// was already there (a rewrite of the highest replaces it). The row's `thread_key` and `meta`, all a
    /// successor reads of it, and the inbox are not what a step writes.
    pub fn stepped(&mut self, record: &StepRecord) {
        if self
            .last_step
            .as_ref()
            .is_none_or(|last| last.step <= record.step)
        {
            self.last_step = Some(record.clone());
        }
    }
}

/// The inbox rows a finishing run leaves for the runs after it: every queued message (`enqueue`,
/// `interrupt`: never folded, whatever the cursor) and the steering messages past `consumed`, in seq order.
pub fn waiting(items: Vec<InboxItem>, consumed: Option<u64>) -> Vec<InboxItem> {
    items
        .into_iter()
        .filter(|i| i.queued() || decisions::is_unread(i.seq, consumed))
        .collect()
}

/// The successor a finish admits in its transaction (SPEC §5.2 step 8, §5.1): its admission, its first
/// events, and the messages it carries on in its own inbox, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct SuccessorPlan {
    pub admit: Admit,
    pub events: Vec<Value>,
    /// What waits behind the successor's own message(s): pushed onto its inbox in this order, so queued
    /// messages keep their turn and late steering messages reach it.
    pub carried: Vec<Value>,
}

/// The successor for `waiting` (see [`waiting`]), or `None` when nothing waits. Its messages are the
/// first queued message alone — a run of its own, `input {source: "request"}` — or, when steering
/// messages come first, all of them up to the first queued one, one `input {source: "followup"}` each
/// (they were meant for the finished run, so the successor answers them together). Its events are
/// `run_meta` (seq 1) and those inputs (seqs 2…), stamped `now_ms`; its request is the first message's
/// with every text, in order; its identity is the finished run's, with the first message's user.
pub fn successor_admission(
    finished: &LiveRow,
    gen: &str,
    waiting: &[InboxItem],
    successor: &Successor,
    now_ms: i64,
) -> Option<SuccessorPlan> {
    let items: Vec<(&InboxItem, &Map<String, Value>)> = waiting
        .iter()
        .filter_map(|i| i.message.as_object().map(|m| (i, m)))
        .collect();
    let (first_item, first) = *items.first()?;
    let queued = first_item.queued();
    let taken = if queued {
        1
    } else {
        items.iter().take_while(|(i, _)| !i.queued()).count()
    };
    let texts: Vec<&str> = items[..taken]
        .iter()
        .map(|(_, m)| m.get("text").and_then(Value::as_str).unwrap_or_default())
        .collect();
    let carried = items[taken..]
        .iter()
        .map(|(_, m)| Value::Object((*m).clone()))
        .collect();
    let mut request = first.clone();
    request.insert("text".into(), Value::from(texts.join("\n\n")));
    let request = Value::Object(request);
    let mut identity = RunIdentity::from_meta(&finished.thread_key, &finished.meta);
    identity.label = label_of(request["text"].as_str().unwrap_or_default());
    identity.parent_run_id = None;
    if let Some(user) = first.get("user").and_then(Value::as_str) {
        identity.user_id = user.to_owned();
    }
    // No deadline: a restart computes it from the successor's own start.
    let meta = identity.meta_json(None, &request);
    let run_meta = Value::from(identity.event().stamped(1, now_ms));
    let source = if queued {
        crate::record::InputSource::Request
    } else {
        crate::record::InputSource::Followup { inbox_seq: None }
    };
    let mut events = vec![run_meta];
    for (i, text) in texts.iter().enumerate() {
        let input = crate::record::input_event(text, source).stamped(i as u64 + 2, now_ms);
        events.push(Value::from(input));
    }
    let events = events
        .into_iter()
        .map(crate::record::cap_event_for_publish)
        .collect();
    let admit = Admit {
        thread_key: finished.thread_key.clone(),
        gen: gen.to_owned(),
        run_id: successor.run_id.clone(),
        request,
        meta,
        key: None,
        lease_ms: successor.lease_ms,
        writer: None,
        strategy: Strategy::Steer,
    };
    Some(SuccessorPlan {
        admit,
        events,
        carried,
    })
}
