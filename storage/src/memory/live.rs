//! The in-memory ledger tables (SPEC §4.1) as plain maps, and the row-level operations on them that
//! the in-memory [`RunLedger`](crate::ledger::RunLedger) is built from.
//!
//! **Owns:** [`LedgerState`] — live rows (with a `thread_key → run_id` index standing in for
//! `thread_key UNIQUE`), step records, live events, transcript parts, the inbox, admit receipts,
//! deletion fences and generations. It sits inside the memory store's one `State`
//! ([`super::state`]), next to the finished-run history, so `finish` can delete a run's live rows and
//! upsert its record under the same lock, exactly as the SQLite ledger does in one transaction.
//!
//! **Callers:** the ledger implementation ([`super::ledger`]) and the history's upsert
//! ([`super::state`]), which asks [`LedgerState::is_live`] and [`LedgerState::is_killed`] before it
//! writes. This module knows nothing of either.
//!
//! **Invariants:**
//! - at most one live row per thread: `threads` maps each row's thread key to its run id and no
//!   other entry ever exists ([`LedgerState::insert_row`] and [`LedgerState::drop_live`] keep them in step);
//! - transcript parts are written once and never edited; inbox seqs per run start at 1 and only grow;
//!   step records, transcript parts and inbox rows live exactly as long as the run's live row
//!   ([`LedgerState::drop_live`] takes them together); receipts outlive it until a prune.
//!
//! # Design
//! Each per-run table is a map from run id to an ordered inner map (`BTreeMap<u64, …>` for the
//! step, event and inbox seqs, `(idx, part)` for the transcript), so "everything of this run, in
//! order" is one lookup and dropping a run's rows is one `remove`. Transcript parts keep the exact
//! JSON text [`check_turns`](crate::ledger::check_turns) measured, as the SQLite `json` column does.

use crate::RunId;
use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::ledger::decisions::{decide_admit, AdmitDecision, CapCount, INSERT_PHASE};
use crate::ledger::{
    fence_refusal, Admit, AdmitOutcome, GenerationInfo, InboxItem, LiveRow, Outcome, Refusal,
    StepRecord,
};
use crate::record::RecordError;
use crate::{Error, Result};

/// The ledger's tables, inside the memory store's one lock (see the module doc).
#[derive(Debug, Default)]
pub(super) struct LedgerState {
    /// `live_runs`, by run id.
    pub(super) rows: BTreeMap<RunId, LiveRow>,
    /// `thread_key UNIQUE`: the run holding each thread. Kept in step with `rows` by
    /// [`LedgerState::insert_row`] and [`LedgerState::drop_live`] only.
    pub(super) threads: BTreeMap<String, RunId>,
    /// `run_steps(run_id, step)`.
    pub(super) steps: BTreeMap<RunId, BTreeMap<u64, StepRecord>>,
    /// A live run's `run_events(run_id, seq)`; replaced by the record's events at `finish`.
    pub(super) events: BTreeMap<RunId, BTreeMap<u64, Value>>,
    /// `transcript(run_id, idx, part) → json` (`{"role", "part"}`), first write stands.
    pub(super) transcript: BTreeMap<RunId, BTreeMap<(u64, u64), String>>,
    /// `run_inbox(run_id, seq) → message`, seqs from 1 per run.
    pub(super) inbox: BTreeMap<RunId, BTreeMap<u64, Value>>,
    /// `admit_receipts(scope, key)`.
    pub(super) receipts: BTreeMap<(String, String), Receipt>,
    /// `deletion_fences(run_id) → at`: ids a kill fenced, with the first kill's time; admit answers
    /// them `Fenced`.
    pub(super) deletion_fences: BTreeMap<RunId, i64>,
    /// `generations`, by generation.
    pub(super) generations: BTreeMap<String, GenerationInfo>,
    /// Inbox rows ever written ([`crate::actor::Backend::inbox_version`]).
    pub(super) inbox_writes: u64,
}

/// A stored admission answer for a keyed message.
#[derive(Debug, Clone)]
pub(super) struct Receipt {
    pub(super) body_hash: String,
    pub(super) answer: AdmitOutcome,
    /// The run the answer names (`""` for none), as `admit_receipts.run_id`.
    pub(super) run_id: RunId,
    /// When that run ended (`admit_receipts.ended_at`); `None` while it lives.
    pub(super) ended_at: Option<i64>,
}

impl Receipt {
    pub(super) fn new(body_hash: &str, answer: &AdmitOutcome) -> Self {
        Receipt {
            body_hash: body_hash.to_owned(),
            answer: answer.clone(),
            run_id: answer_run(answer).cloned().unwrap_or_default(),
            ended_at: None,
        }
    }
}

/// What `finish` took out of the live tables, kept until the record upsert succeeds so a failed
/// upsert leaves the ledger exactly as it was.
pub(super) struct Removed {
    pub(super) row: Option<LiveRow>,
    pub(super) steps: Option<BTreeMap<u64, StepRecord>>,
    pub(super) events: Option<BTreeMap<u64, Value>>,
    pub(super) transcript: Option<BTreeMap<(u64, u64), String>>,
    pub(super) inbox: Option<BTreeMap<u64, Value>>,
}

impl Removed {
    /// Whether any row was removed.
    pub(super) fn any(&self) -> bool {
        self.row.is_some()
            || self.steps.is_some()
            || self.events.is_some()
            || self.transcript.is_some()
            || self.inbox.is_some()
    }
}

impl LedgerState {
    /// Whether `run_id` has a live row.
    pub(super) fn is_live(&self, run_id: &RunId) -> bool {
        self.rows.contains_key(run_id)
    }

    /// The row holding `thread_key`, if any.
    pub(super) fn by_thread(&self, thread_key: &str) -> Option<&LiveRow> {
        self.threads
            .get(thread_key)
            .and_then(|run_id| self.rows.get(run_id))
    }

    /// The caller's row for an owner write, or the fence refusal (another owner / no row).
    /// The owner check of every owner write: a killed run fences its owner too.
    pub(super) fn fence(&self, run_id: &RunId, gen: &str) -> Option<Refusal> {
        if self.deletion_fences.contains_key(run_id) {
            return Some(Refusal::Fenced {
                run_id: run_id.to_owned(),
            });
        }
        fence_refusal(self.rows.get(run_id), run_id, gen)
    }

    /// Whether nothing of `run_id` is left in the ledger's per-run tables (no live row, step, event,
    /// transcript or inbox rows); the caller adds the record.
    pub(super) fn holds_nothing_of(&self, run_id: &RunId) -> bool {
        !self.rows.contains_key(run_id)
            && !self.steps.contains_key(run_id)
            && !self.events.contains_key(run_id)
            && !self.transcript.contains_key(run_id)
            && !self.inbox.contains_key(run_id)
    }

    pub(super) fn is_killed(&self, run_id: &RunId) -> bool {
        self.deletion_fences.contains_key(run_id)
    }

    pub(super) fn owned_mut(&mut self, run_id: &RunId, gen: &str) -> Outcome<&mut LiveRow> {
        if let Some(refusal) = self.fence(run_id, gen) {
            return Err(refusal);
        }
        self.rows
            .get_mut(run_id)
            .ok_or_else(|| Refusal::UnknownRun {
                run_id: run_id.to_owned(),
            })
    }

    pub(super) fn insert_row(&mut self, row: LiveRow) {
        self.threads
            .insert(row.thread_key.clone(), row.run_id.clone());
        self.rows.insert(row.run_id.clone(), row);
    }

    /// Delete a run's live row (freeing its thread), step records, live events, transcript and inbox;
    /// receipts stay.
    pub(super) fn drop_live(&mut self, run_id: &RunId) -> Removed {
        let row = self.rows.remove(run_id);
        if let Some(r) = &row {
            if self
                .threads
                .get(&r.thread_key)
                .is_some_and(|holder| holder == run_id)
            {
                self.threads.remove(&r.thread_key);
            }
        }
        Removed {
            row,
            steps: self.steps.remove(run_id),
            events: self.events.remove(run_id),
            transcript: self.transcript.remove(run_id),
            inbox: self.inbox.remove(run_id),
        }
    }

    /// Stamp the end of `run_id` on its receipts that carry none yet.
    pub(super) fn stamp_receipts(&mut self, run_id: &RunId, now_ms: i64) {
        for r in self
            .receipts
            .values_mut()
            .filter(|r| r.run_id == run_id && r.ended_at.is_none())
        {
            r.ended_at = Some(now_ms);
        }
    }

    /// Undo [`LedgerState::drop_live`].
    pub(super) fn restore(&mut self, run_id: &RunId, removed: Removed) {
        if let Some(row) = removed.row {
            self.insert_row(row);
        }
        if let Some(steps) = removed.steps {
            self.steps.insert(run_id.to_owned(), steps);
        }
        if let Some(events) = removed.events {
            self.events.insert(run_id.to_owned(), events);
        }
        if let Some(transcript) = removed.transcript {
            self.transcript.insert(run_id.to_owned(), transcript);
        }
        if let Some(inbox) = removed.inbox {
            self.inbox_writes += 1;
            self.inbox.insert(run_id.to_owned(), inbox);
        }
    }

    /// Append `message` to the run's inbox under the next per-run seq (from 1).
    pub(super) fn push_inbox(&mut self, run_id: &RunId, message: &Value) -> u64 {
        self.inbox_writes += 1;
        let inbox = self.inbox.entry(run_id.to_owned()).or_default();
        let seq = inbox.keys().next_back().map_or(1, |last| last + 1);
        inbox.insert(seq, message.clone());
        seq
    }

    pub(super) fn inbox_items(&self, run_id: &str, keep: impl Fn(u64) -> bool) -> Vec<InboxItem> {
        self.inbox
            .get(run_id)
            .into_iter()
            .flatten()
            .filter(|(seq, _)| keep(**seq))
            .map(|(seq, message)| InboxItem {
                seq: *seq,
                message: message.clone(),
            })
            .collect()
    }

    pub(super) fn last_step(&self, run_id: &RunId) -> Option<StepRecord> {
        self.steps
            .get(run_id)
            .and_then(|s| s.values().next_back())
            .cloned()
    }

    /// Admission after the receipt lookup: deletion fence, then [`decide_admit`].
    pub(super) fn admit_past_receipt(
        &mut self,
        admit: &Admit,
        now_ms: i64,
    ) -> Result<AdmitOutcome> {
        if self.deletion_fences.contains_key(&admit.run_id) {
            return Ok(AdmitOutcome::Fenced);
        }
        let holder_row = self.by_thread(&admit.thread_key);
        let reaches = admit.reaches(holder_row);
        let holder = holder_row.map(LiveRow::view);
        let decision = decide_admit(
            holder.as_ref(),
            admit.key.is_some(),
            reaches,
            admit.strategy,
        );
        if let Some(refused) = decision.refused_by_cap(admit.key.is_some(), |what, run_id| {
            Ok::<_, Error>(match what {
                CapCount::Receipts => self
                    .receipts
                    .values()
                    .filter(|r| r.run_id == run_id)
                    .count() as u64,
                CapCount::Queued => self.queued_count(run_id),
            })
        })? {
            return Ok(refused);
        }
        match decision {
            AdmitDecision::Insert => {
                if let Some(other) = self.rows.get(&admit.run_id) {
                    // The pre-minted id is live on another thread: SQLite's primary key refuses
                    // the insert as an error, not a refusal; say the same thing here.
                    tracing::warn!(run_id = %admit.run_id, thread = %other.thread_key, "admit with a run id already live");
                    return Err(Error::InvalidRecord(RecordError::Field {
                        field: "runId",
                        why: "is already live on another thread",
                    }));
                }
                self.insert_row(LiveRow {
                    run_id: admit.run_id.clone(),
                    thread_key: admit.thread_key.clone(),
                    owner_gen: admit.gen.clone(),
                    lease_until: now_ms + admit.lease_ms,
                    started_at: now_ms,
                    phase: INSERT_PHASE,
                    stop: None,
                    meta: admit.meta.clone(),
                    system_text: String::new(),
                    tools: Value::Null,
                    state: Map::new(),
                });
                Ok(AdmitOutcome::Started {
                    run_id: admit.run_id.clone(),
                })
            }
            AdmitDecision::Steer { run_id } => {
                let seq = self.push_inbox(&run_id, &admit.request);
                Ok(AdmitOutcome::Steered { run_id, seq })
            }
            AdmitDecision::Queue { run_id } => {
                self.push_inbox(&run_id, &admit.request);
                let position = self.queued_count(&run_id);
                Ok(AdmitOutcome::Queued { run_id, position })
            }
            AdmitDecision::Interrupt { run_id } => {
                self.push_inbox(&run_id, &admit.request);
                if let Some(row) = self.rows.get_mut(&run_id) {
                    row.stop = Some(crate::ledger::decisions::strongest_stop(
                        row.stop,
                        crate::ledger::StopMode::Soft,
                    ));
                }
                let position = self.queued_count(&run_id);
                Ok(AdmitOutcome::Interrupting { run_id, position })
            }
            AdmitDecision::Reject { run_id } => Ok(AdmitOutcome::Rejected { run_id }),
            AdmitDecision::Busy { run_id } => Ok(AdmitOutcome::Busy { run_id }),
            AdmitDecision::Forbidden => Ok(AdmitOutcome::Forbidden),
        }
    }
}

/// The run a stored answer names (what `admit_receipts.run_id` holds in SQLite).
fn answer_run(answer: &AdmitOutcome) -> Option<&RunId> {
    match answer {
        AdmitOutcome::Started { run_id } | AdmitOutcome::Steered { run_id, .. } => Some(run_id),
        _ => None,
    }
}

/// Whether an admission answer is kept as the key's receipt. `Busy` is not: it means "come back
/// shortly" (SPEC §5.1: the keyed sender waits for the thread and retries with the same key), so a
/// stored `Busy` would answer every retry with it forever. `KeyConflict` is never produced past the
/// lookup.
impl LedgerState {
    /// How many messages wait queued in a run's inbox (SPEC §5.1 `position`).
    fn queued_count(&self, run_id: &str) -> u64 {
        self.inbox_items(run_id, |_| true)
            .iter()
            .filter(|i| i.queued())
            .count() as u64
    }
}
