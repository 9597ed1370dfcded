//! Record assembly (the one place a run's record is built) and closing a row without running it.

use serde_json::{json, Value};
use storage::ledger::{LiveRow, Successor};
use storage::record::RunEvent;
use storage::record::{fit_record_to_budget, into_record, RunRecord, RunStatus, MAX_RECORD_BYTES};
use storage::RunId;

use super::{Ended, RunDeps, StopReason};
use crate::channel::card::{CardView, Ending};
use crate::channel::cards::CardClosed;
use crate::channel::{CardHandle, ThreadRef};
use crate::registry::RunMeta;

/// The parts of a record besides its identity, events and counts.
#[derive(Debug, Clone, Default)]
pub struct RecordExtras {
    pub provisional: bool,
    pub reply: Option<(bool, Option<String>)>,
    pub diagnosis: Option<Value>,
    pub step_count: Option<u64>,
    /// `{<model>: {inputTokens, outputTokens}}`, when the agent reported usage.
    pub usage: Option<Value>,
    /// The run passed its finishing gate under a process that ended before its record: whether its
    /// reply went out is unknown (`replyOk` absent, `replyNote` says so).
    pub delivery_unknown: bool,
}

/// The `replyNote` of a run closed from `finishing` (SPEC §6.1: delivery unknown).
pub const DELIVERY_UNKNOWN: &str =
    "delivery unknown: the process that held the run ended after its finishing gate";

/// Assemble, validate and fit a record (the one place a record is built): the registry's snapshot at a
/// finish, or a reclaimed row's meta and live events at a close.
#[allow(clippy::too_many_arguments)]
pub fn assemble_record(
    id: &RunId,
    meta: &RunMeta,
    started_at: i64,
    finished_at: i64,
    status: RunStatus,
    events: Vec<Value>,
    event_count: u64,
    truncated: bool,
    extras: RecordExtras,
) -> Option<RunRecord> {
    let mut v = Value::Object(meta.fields());
    for (k, val) in [
        ("id", json!(id)),
        ("startedAt", json!(started_at)),
        ("finishedAt", json!(finished_at)),
        ("status", json!(status.as_str())),
        ("eventCount", json!(event_count)),
        ("storedEventCount", json!(events.len())),
        ("truncated", json!(truncated)),
        ("events", Value::Array(events)),
        (
            "diagnosis",
            extras
                .diagnosis
                .unwrap_or_else(|| json!({"byCategory": {}})),
        ),
    ] {
        v[k] = val;
    }
    if extras.provisional {
        v["provisional"] = json!(true);
    } else {
        v["sealedAt"] = json!(finished_at);
    }
    // The answer, a failed run's error and a stopped run's stopper ride on its head, so a listing shows
    // them without reading events (RunView `answer`, `error`, `stoppedBy`).
    let head = crate::runs_service::HeadFacts::of(
        status,
        v["events"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default(),
    );
    if let Some(answer) = head.answer {
        v["answer"] = json!(answer);
    }
    if let Some(message) = head.error {
        v["error"] = json!(message);
    }
    if let Some(by) = head.stopped_by {
        v["stoppedBy"] = by;
    }
    // So do the index's marks (RunView `resumed`, `effectsUnknown`).
    if head.marks.resumed > 0 {
        v["resumed"] = json!(head.marks.resumed);
    }
    if head.marks.effects_unknown > 0 {
        v["effectsUnknown"] = json!(head.marks.effects_unknown);
    }
    if let Some(usage) = extras.usage {
        v["usage"] = usage;
    }
    if let Some(n) = extras.step_count {
        v["stepCount"] = json!(n);
    }
    if let Some((ok, note)) = extras.reply {
        v["replyOk"] = json!(ok);
        if let Some(n) = note {
            v["replyNote"] = json!(n);
        }
    } else if extras.delivery_unknown {
        v["replyNote"] = json!(DELIVERY_UNKNOWN);
    }
    match into_record(v) {
        Ok(r) => Some(fit_record_to_budget(r, MAX_RECORD_BYTES)),
        Err(e) => {
            tracing::error!(run_id = %id, error = %e, "built an invalid record; not written");
            None
        }
    }
}

/// A record from the registry's snapshot of the run.
pub fn build_record(
    deps: &RunDeps,
    id: &RunId,
    status: RunStatus,
    finished_at: i64,
    extras: RecordExtras,
) -> Option<RunRecord> {
    let (row, events) = deps.registry.snapshot(id)?;
    assemble_record(
        id,
        &row.meta,
        row.started_at,
        finished_at,
        status,
        events,
        row.event_count,
        row.truncated,
        extras,
    )
}

/// The run identity saved in a ledger row's `meta_json`.
pub fn meta_from_row(row: &LiveRow) -> RunMeta {
    RunMeta::from_meta(&row.thread_key, &row.meta)
}

/// The workspace the row is bound to (`state.binding.workspace`), re-attached as is, never migrated
/// (SPEC §8.3).
pub(super) fn bound_workspace(row: &LiveRow) -> Option<std::path::PathBuf> {
    row.bound_workspace().map(std::path::PathBuf::from)
}

/// The successor run a finish (or close) admitted under this generation: its `attaching` row and first
/// events, for the supervisor to launch. A crash before the launch leaves it to a reclaim's restart.
/// The successor a transaction that frees a thread may admit (a finish, a close, a purge): a fresh run
/// id (UUID v7), this process's lease, and how far the freeing run read its inbox.
pub fn fresh_successor(deps: &RunDeps, inbox_consumed: Option<u64>) -> Successor {
    Successor {
        run_id: storage::entropy::run_id(deps.clock.now_ms()),
        lease_ms: deps.lease_ms,
        inbox_consumed,
    }
}

pub async fn admitted_successor(deps: &RunDeps, id: &RunId) -> Option<(LiveRow, Vec<Value>)> {
    let row = deps.storage.get_live(id.to_owned()).await.ok()??;
    if row.owner_gen != deps.gen.as_str() || row.phase != storage::ledger::Phase::Attaching {
        return None;
    }
    let events = deps
        .storage
        .live_events(id.to_owned(), 0, usize::MAX >> 1)
        .await
        .ok()??;
    Some((row, events))
}

/// Close a row this generation holds that cannot run (its agent is not configured here, its request is
/// unreadable): `interrupted`, naming why, so no sweep relaunches it.
pub(super) async fn close_unstartable(
    deps: &RunDeps,
    row: &LiveRow,
    events: Vec<Value>,
    reason: &str,
) -> Ended {
    tracing::error!(run_id = %row.run_id, generation = deps.gen.as_str(), reason, "closing a run that cannot start here");
    deps.registry.discard(&row.run_id);
    match close_row(deps, row, events, RunStatus::Interrupted, reason).await {
        Ok(successor) => (StopReason::Finished(RunStatus::Interrupted), successor),
        Err(e) => {
            tracing::warn!(run_id = %row.run_id, error = %e, "close failed; the supervisor retries it");
            (StopReason::StorageLost, None)
        }
    }
}

/// The record that closes `row` without running it: its live events, the answer its finishing gate
/// saved (`state.answer`, when the row passed the gate and no `answer` event reached the ledger), a
/// `reclaimed` note naming `reason`; `eventCount` counts events; a gated row's delivery is unknown.
pub fn closing_record(
    row: &LiveRow,
    mut events: Vec<Value>,
    status: RunStatus,
    reason: &str,
    now: i64,
    redactor: &crate::redact::Redactor,
) -> Option<RunRecord> {
    let mut last = events
        .iter()
        .filter_map(storage::record::event_seq)
        .max()
        .unwrap_or(0);
    let gated = row.gated();
    if let Some(answer) = row.saved_answer().filter(|_| gated) {
        if !events.iter().any(|e| e["type"] == "answer") {
            last += 1;
            let text = redactor.redact(answer);
            events.push(storage::record::cap_event_for_publish(
                RunEvent::answer(text).stamped(last, now).into(),
            ));
        }
    }
    events.push(
        RunEvent::note("reclaimed", reason)
            .stamped(last + 1, now)
            .into(),
    );
    let count = events.len() as u64;
    let extras = RecordExtras {
        delivery_unknown: gated,
        ..Default::default()
    };
    assemble_record(
        &row.run_id,
        &meta_from_row(row),
        row.started_at,
        now,
        status,
        events,
        count,
        false,
        extras,
    )
}

/// Show a closed run's closing frame on its card in `thread` (SPEC §12), from its record: delivery
/// unconfirmed with the saved answer (never re-sent as a reply) for a run closed past its finishing gate,
/// else its status. Answers what the record carries (`card`, `cardClosed`).
pub async fn close_card_of(
    deps: &RunDeps,
    record: &RunRecord,
    thread: ThreadRef,
    handle: Option<CardHandle>,
) -> CardClosed {
    if !deps.cards.enabled() {
        return CardClosed::default();
    }
    let h = &record.head;
    let token = deps.tokens.mint(&h.id);
    let mut view = CardView::new(
        &h.id,
        h.agent.as_deref().unwrap_or_default(),
        deps.cards.live_url(&h.id, &token),
        h.started_at,
    )
    .folded(&record.events);
    view.ending = Some(if h.reply_note.as_deref() == Some(DELIVERY_UNKNOWN) {
        let answer = record
            .events
            .iter()
            .rev()
            .find(|e| e["type"] == "answer")
            .and_then(|e| e["text"].as_str())
            .map(str::to_owned);
        Ending::Unconfirmed { answer }
    } else {
        Ending::Ended {
            status: h.status,
            finished_at: h.finished_at,
        }
    });
    deps.cards.close_once(handle, thread, view).await
}

/// Close a row with a record built from the row and its live events, through the finish transaction
/// (`finishedAt` = now), which admits the successor for its unread inbox (SPEC §5.2 step 8); answers
/// that successor when it was admitted here. A row past its finishing gate keeps the answer the gate
/// saved (`state.answer`) as its `answer` event, and says its delivery is unknown.
pub async fn close_row(
    deps: &RunDeps,
    row: &LiveRow,
    events: Vec<Value>,
    status: RunStatus,
    reason: &str,
) -> Result<Option<(LiveRow, Vec<Value>)>, String> {
    // The workspace fence goes to the closer first, so an old owner that wakes up later cannot write into
    // the workspace of a run already closed (SPEC §8.3), and only while the ledger names the closer as
    // the owner (a stale closer, paused while another generation took the row, leaves the real owner's
    // fence alone; its finish is refused next). Best effort: a workspace that is gone, or whose lock a
    // paused owner holds, leaves the old fence, which names a generation that no longer owns the row.
    let dir = bound_workspace(row)
        .unwrap_or_else(|| crate::tools::workspace_dir(&deps.workspace_root, &row.run_id));
    if dir.is_dir() {
        let fence = format!("{}#close", deps.gen.as_str());
        let owns = super::launch::still_owner(deps, &row.run_id);
        if let Err(e) =
            crate::tools::take_workspace_async(dir, fence, crate::tools::TakeMode::Existing, owns)
                .await
        {
            tracing::warn!(run_id = %row.run_id, generation = deps.gen.as_str(), error = %e, "did not take the workspace fence before closing");
        }
    }
    let now = deps.clock.now_ms();
    let mut record = closing_record(row, events, status, reason, now, deps.registry.redactor())
        .ok_or("the row does not make a valid record")?;
    // The run's card gets its closing frame, the record says whether it did (SPEC §12).
    if let Some(thread) = super::Request::of_row(row).and_then(|r| r.chat_thread()) {
        let handle = crate::channel::cards::card_of(row);
        close_card_of(deps, &record, thread, handle)
            .await
            .stamp(&mut record.head.extra);
    }
    let successor = fresh_successor(deps, None);
    let successor_id = successor.run_id.clone();
    match deps
        .storage
        .finish(deps.gen.as_str().to_owned(), record, None, Some(successor))
        .await
    {
        Ok(Ok(_)) => {
            tracing::info!(run_id = %row.run_id, generation = deps.gen.as_str(), status = status.as_str(), reason, "closed a run");
            Ok(admitted_successor(deps, &successor_id).await)
        }
        Ok(Err(refusal)) => Err(refusal.to_string()),
        Err(e) => Err(e.to_string()),
    }
}
