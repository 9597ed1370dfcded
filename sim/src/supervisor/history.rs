//! Record writes, simulated: closing a row from its ledger row and live events (`run::close_row`), the
//! ledger's finish with its successor admission as one transaction (`storage::handle::finish_in`), a
//! plain store put, and the history writer's attempts — an `UnknownRun` finish falls back to a put, a
//! transient failure is retried twice with jitter (`actors::history`). Every write goes through
//! [`World::io`] so faults land on it, and tells the world model what it closed.

use actors::run::{Launch, StopReason};
use rand::Rng;
use serde_json::Value;
use storage::ledger::{LiveRow, Outcome, Phase, Refusal, RunLedger, Successor};
use storage::record::{RunRecord, RunStatus};
use storage::store::PutOutcome;
use storage::RunStore;

use super::HISTORY_BACKOFF_MS;
use crate::run;
use crate::world::{Io, Kind, World, LEASE_MS};

/// Which operation carries a history write.
#[derive(Debug, Clone)]
pub enum Via {
    /// A plain store put (a tombstone, a detached run's provisional record, a fallback).
    Store,
    /// The ledger's finish under `gen`, admitting `successor` in the same transaction.
    Ledger {
        gen: String,
        successor: Option<Successor>,
    },
}

/// Close a row with a record built from the row and its live events, through the finish transaction,
/// which admits the successor for its unread inbox (`run::close_row`).
pub(super) fn close_row(
    w: &mut World,
    slot: usize,
    row: &LiveRow,
    events: Vec<Value>,
    status: RunStatus,
    reason: &str,
    with_successor: bool,
) -> Result<Option<(LiveRow, Vec<Value>)>, String> {
    // The workspace fence goes to the closer first, so an old owner that wakes up later cannot write into
    // the workspace of a run already closed (best effort: a missing workspace keeps no fence).
    // Only while the ledger names the closer as the owner (a stale closer leaves the real owner's fence).
    if w.model.workspace_exists(&row.run_id) {
        let gen = w.procs[slot].gen.clone();
        run::take_workspace(w, slot, &row.run_id, &format!("{gen}#close"), "to close it");
    }
    let redactor =
        actors::redact::Redactor::new(&[]).expect("the built-in redaction rules compile");
    let record = actors::run::closing_record(row, events, status, reason, w.now(), &redactor)
        .ok_or("the row does not make a valid record")?;
    let successor = with_successor.then(|| Successor {
        run_id: w.mint_run("s"),
        lease_ms: LEASE_MS,
        inbox_consumed: None,
    });
    let successor_id = successor.as_ref().map(|s| s.run_id.clone());
    let gen = w.procs[slot].gen.clone();
    if status == RunStatus::Interrupted {
        w.model.closed_interrupted(&row.run_id, reason);
    }
    match finish_tx(w, slot, &gen, &record, successor) {
        Ok(Ok(_)) => Ok(successor_id.and_then(|id| admitted_successor(w, slot, &id))),
        Ok(Err(refusal)) => Err(refusal.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Close a row this generation holds that cannot run (`close_unstartable`).
pub fn close_unstartable(
    w: &mut World,
    slot: usize,
    row: &LiveRow,
    events: Vec<Value>,
    reason: &str,
) -> (StopReason, Option<(LiveRow, Vec<Value>)>) {
    w.procs[slot].registry.discard(&row.run_id);
    match close_row(w, slot, row, events, RunStatus::Interrupted, reason, true) {
        Ok(successor) => (StopReason::Finished(RunStatus::Interrupted), successor),
        Err(_) => (StopReason::StorageLost, None),
    }
}

/// The successor a finish admitted under this generation (`admitted_successor`).
pub fn admitted_successor(w: &mut World, slot: usize, id: &str) -> Option<(LiveRow, Vec<Value>)> {
    let gen = w.procs[slot].gen.clone();
    let row = w.io(slot, Io::Read, |s, _| s.get_live(id)).ok()??;
    if row.owner_gen != gen || row.phase != Phase::Attaching {
        return None;
    }
    let events = w
        .io(slot, Io::Read, |s, _| s.live_events(id, 0, usize::MAX >> 1))
        .ok()??;
    Some((row, events))
}

/// The ledger's finish with its successor admission, as one transaction (`storage::handle::finish_in`),
/// and what the world model learns from it.
fn finish_tx(
    w: &mut World,
    slot: usize,
    gen: &str,
    record: &RunRecord,
    successor: Option<Successor>,
) -> storage::Result<Outcome<PutOutcome>> {
    let id = record.head.id.clone();
    let thread = record.head.thread_key.clone();
    let before = w.peek().get_live(&id).ok().flatten();
    let out = w.io(slot, Io::Write, |s, now| {
        storage::handle::finish_in(s, gen, record, None, successor.as_ref(), now)
    });
    let after = w.peek().get_live(&id).ok().flatten();
    if before.is_some() && after.is_none() {
        w.model.closed(&id, gen, record.head.status);
    }
    if let Some(s) = successor {
        if w.peek().get_live(&s.run_id).ok().flatten().is_some() {
            w.model.started(&s.run_id, &thread);
            crate::model::check_successor_disjoint(w, record, &s.run_id);
        }
    }
    out
}

/// A plain store put, and the check that no final record comes from a generation that lost the run.
fn put_tx(w: &mut World, slot: usize, record: &RunRecord) -> storage::Result<Outcome<PutOutcome>> {
    let gen = w.procs[slot].gen.clone();
    if !record.head.provisional {
        crate::model::check_record_writer(w, &gen, &record.head.id);
    }
    w.io(slot, Io::Write, |s, now| {
        RunStore::put(s, record, None, now)
    })
    .map(Ok)
}

/// How one history write attempt went.
pub enum Attempt {
    Retry { via: Via, delay: i64 },
    Done { landed: bool },
}

/// One attempt of the history writer (`Inner::drive`): an `UnknownRun` finish falls back to a plain put
/// at once; a fenced finish writes nothing; transient failures get two retries (1 s, then 4 s, ±50 %).
pub fn history_attempt(
    w: &mut World,
    slot: usize,
    record: &RunRecord,
    mut via: Via,
    spent: usize,
) -> Attempt {
    let id = record.head.id.clone();
    let mut record = std::borrow::Cow::Borrowed(record);
    if record.head.provisional && w.procs[slot].finals.contains(&id) {
        return Attempt::Done { landed: false }; // final beats provisional: stood down
    }
    if !record.head.provisional {
        w.procs[slot].finals.insert(id.clone());
    }
    loop {
        let answer = match &via {
            Via::Ledger { gen, successor } => {
                let gen = gen.clone();
                finish_tx(w, slot, &gen, &record, successor.clone())
            }
            Via::Store => put_tx(w, slot, &record),
        };
        let transient = match answer {
            Ok(Ok(_)) => return Attempt::Done { landed: true },
            Ok(Err(Refusal::UnknownRun { .. })) if matches!(via, Via::Ledger { .. }) => {
                // Provisional, so the tombstone floor keeps a final record another generation wrote.
                w.note(|| format!("  {id}: the ledger has no live row; the record falls back to a provisional put"));
                let mut fallback = record.clone().into_owned();
                fallback.head.provisional = true;
                fallback.head.sealed_at = None;
                record = std::borrow::Cow::Owned(fallback);
                via = Via::Store;
                continue;
            }
            Ok(Err(_)) => return Attempt::Done { landed: false },
            Err(e) => matches!(
                e,
                storage::Error::Unavailable(_)
                    | storage::Error::Sqlite(_)
                    | storage::Error::Panicked(_)
            ),
        };
        if !transient || spent >= HISTORY_BACKOFF_MS.len() {
            w.note(|| format!("  {id}: the history write is lost"));
            return Attempt::Done { landed: false };
        }
        let base = HISTORY_BACKOFF_MS[spent];
        let delay = w.rng.random_range(base / 2..=base * 3 / 2);
        return Attempt::Retry { via, delay };
    }
}

/// A fire-and-forget history write; a ledger write with a successor launches it once settled (the
/// supervisor's `close_failed`).
pub(super) fn history(w: &mut World, slot: usize, record: RunRecord, via: Via, spent: usize) {
    let successor = match &via {
        Via::Ledger {
            successor: Some(s), ..
        } => Some(s.run_id.clone()),
        _ => None,
    };
    match history_attempt(w, slot, &record, via, spent) {
        Attempt::Retry { via, delay } => w.spawn_in(
            slot,
            delay,
            Kind::History {
                record,
                via,
                spent: spent + 1,
            },
        ),
        Attempt::Done { .. } => {
            if let Some(id) = successor {
                let next = admitted_successor(w, slot, &id);
                launch_successor(w, slot, next);
            }
        }
    }
}

pub(super) fn launch_successor(
    w: &mut World,
    slot: usize,
    successor: Option<(LiveRow, Vec<Value>)>,
) {
    if let Some((row, events)) = successor {
        run::start(
            w,
            slot,
            Launch::Restart {
                row,
                events,
                from_gen: None,
            },
        );
    }
}
