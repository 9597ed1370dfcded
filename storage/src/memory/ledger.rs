//! The in-memory live-run ledger: [`RunLedger`] for [`MemoryStore`] (tests, `storage.kind = "memory"`).
//!
//! **Owns:** nothing of its own: the tables are [`LedgerState`](super::live::LedgerState), inside the
//! store's one `State` next to the finished-run history.
//!
//! **Callers:** the storage actor (through the [`RunLedger`] trait) and the shared contract suite
//! (`storage/tests/ledger_contract.rs`), which runs the same cases against this ledger and SQLite's.
//!
//! **Invariants:**
//! - every method is one lock scope: it takes `MemoryStore::lock` once and holds it for its whole
//!   body, so each method is one atomic transaction, as `BEGIN IMMEDIATE` makes it in SQLite;
//! - every choice comes from [`decisions`](crate::ledger::decisions) (admit, claim, fence, phase change,
//!   reclaim selection, stop strength, lease expiry, unread inbox) and the shared checks of the ledger
//!   module ([`check_events`], [`check_turns`], [`merge_state`]), so this ledger and the SQLite one can
//!   differ only in I/O, never in policy;
//! - a refused operation writes nothing: every check runs before the first mutation, and `finish`
//!   puts back what it removed when the record upsert fails (SQLite's rollback).
//!
//! It deliberately does not know about time (every `now` is the caller's clock) and never fences on
//! a lease alone.

use crate::RunId;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::live::Receipt;
use super::MemoryStore;
use crate::ledger::decisions::{
    decide_claim, deletion_fence_prunable, generation_prunable, is_unread, lease_expired,
    phase_transition, receipt_expired, reclaim_phase, reclaim_selection, strongest_stop,
    ClaimDecision, PhaseChange, ReclaimSelection,
};
use crate::ledger::SuccessorFacts;
use crate::ledger::{
    check_events, check_turns, merge_state, Admit, AdmitOutcome, Claimed, GenerationInfo,
    HandoffResult, HeartbeatAnswer, InboxItem, KillAnswer, LiveRow, Outcome, Phase, Promotion,
    PruneReport, ReclaimAnswer, Reclaimed, Refusal, RunLedger, StepRecord, StopAnswer, StopMode,
    TableRows, Transcript, Turn,
};
use crate::record::{stored_event_seqs, RecordError, RunRecord, RunStatus};
use crate::store::{PolicyProposal, PutOutcome};
use crate::{Error, Result};

impl RunLedger for MemoryStore {
    fn record_generation(&mut self, info: &GenerationInfo) -> Result<()> {
        self.lock()
            .ledger
            .generations
            .insert(info.gen.clone(), info.clone());
        Ok(())
    }

    fn generations(&mut self) -> Result<Vec<GenerationInfo>> {
        let st = self.lock();
        let mut all: Vec<GenerationInfo> = st.ledger.generations.values().cloned().collect();
        all.sort_by(|a, b| (a.started_at, &a.gen).cmp(&(b.started_at, &b.gen)));
        Ok(all)
    }

    fn admit(&mut self, admit: &Admit, now_ms: i64) -> Result<AdmitOutcome> {
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        // The receipt comes before every other check: a retry answers what the first try did.
        if let Some(key) = &admit.key {
            if let Some(receipt) = ledger.receipts.get(&(key.scope.clone(), key.key.clone())) {
                return Ok(if receipt.body_hash == key.body_hash {
                    receipt.answer.clone()
                } else {
                    AdmitOutcome::KeyConflict
                });
            }
        }
        let answer = ledger.admit_past_receipt(admit, now_ms)?;
        if let Some(key) = &admit.key {
            if answer.kept_in_receipt() {
                ledger.receipts.insert(
                    (key.scope.clone(), key.key.clone()),
                    Receipt::new(&key.body_hash, &answer),
                );
            }
        }
        Ok(answer)
    }

    fn claim(
        &mut self,
        run_id: &RunId,
        gen: &str,
        promotion: &Promotion,
        now_ms: i64,
    ) -> Result<Outcome<Claimed>> {
        let mut st = self.lock();
        if st.ledger.is_killed(run_id) {
            return Ok(Err(Refusal::Fenced {
                run_id: run_id.to_owned(),
            }));
        }
        let ledger = &mut st.ledger;
        let by_run = ledger.rows.get(run_id);
        let by_thread = by_run.and_then(|r| ledger.by_thread(&r.thread_key));
        let decision = decide_claim(
            by_thread.map(LiveRow::view).as_ref(),
            by_run.map(LiveRow::view).as_ref(),
            run_id,
            gen,
        );
        match decision {
            ClaimDecision::Promote => {
                let Some(row) = ledger.rows.get_mut(run_id) else {
                    return Ok(Err(Refusal::UnknownRun {
                        run_id: run_id.to_owned(),
                    }));
                };
                row.phase = match phase_transition(row.phase, PhaseChange::Promote) {
                    Ok(next) => next,
                    Err(wrong) => {
                        return Ok(Err(Refusal::WrongPhase {
                            run_id: run_id.to_owned(),
                            phase: wrong.from,
                            change: PhaseChange::Promote.as_str(),
                        }))
                    }
                };
                row.system_text = promotion.system_text.clone();
                row.tools = promotion.tools.clone();
                merge_state(&mut row.state, &promotion.state);
                row.lease_until = now_ms + promotion.lease_ms;
                Ok(Ok(Claimed::Promoted))
            }
            ClaimDecision::Keep => Ok(Ok(Claimed::AlreadyLive)),
            ClaimDecision::ThreadLive { run_id: holder } => {
                let refusal = match ledger.rows.get(&holder) {
                    Some(row) => row.thread_live(),
                    None => Refusal::ThreadLive {
                        run_id: holder,
                        agent: None,
                        started_at: 0,
                    },
                };
                Ok(Err(refusal))
            }
            ClaimDecision::Fenced => Ok(Err(Refusal::Fenced {
                run_id: run_id.to_owned(),
            })),
            ClaimDecision::UnknownRun => Ok(Err(Refusal::UnknownRun {
                run_id: run_id.to_owned(),
            })),
        }
    }

    fn append(&mut self, run_id: &RunId, gen: &str, events: &[Value]) -> Result<Outcome<()>> {
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        if let Err(refusal) = ledger.owned_mut(run_id, gen) {
            return Ok(Err(refusal));
        }
        let (rows, refused) = check_events(events);
        let stored = ledger.events.entry(run_id.to_owned()).or_default();
        for (seq, event, _json) in rows {
            stored.insert(seq, event.clone());
        }
        Ok(refused.map_or(Ok(()), Err))
    }

    fn step(&mut self, run_id: &RunId, gen: &str, record: &StepRecord) -> Result<Outcome<()>> {
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        if let Err(refusal) = ledger.owned_mut(run_id, gen) {
            return Ok(Err(refusal));
        }
        ledger
            .steps
            .entry(run_id.to_owned())
            .or_default()
            .insert(record.step, record.clone());
        Ok(Ok(()))
    }

    fn write_transcript(
        &mut self,
        run_id: &RunId,
        gen: &str,
        first_idx: u64,
        turns: &[Turn],
    ) -> Result<Outcome<()>> {
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        if let Err(refusal) = ledger.owned_mut(run_id, gen) {
            return Ok(Err(refusal));
        }
        let rows = match check_turns(first_idx, turns) {
            Ok(rows) => rows,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let stored = ledger.transcript.entry(run_id.to_owned()).or_default();
        for (idx, part, json) in rows {
            // Never edited: a part already written stays as it was.
            stored.entry((idx, part)).or_insert(json);
        }
        Ok(Ok(()))
    }

    fn read_transcript(&mut self, run_id: &RunId) -> Result<Transcript> {
        let st = self.lock();
        match st.ledger.transcript.get(run_id) {
            Some(rows) => Transcript::assemble(
                rows.iter()
                    .map(|(&(idx, part), json)| (idx, part, json.clone())),
            ),
            None => Ok(Transcript::default()),
        }
    }

    fn set_state(
        &mut self,
        run_id: &RunId,
        gen: &str,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<()>> {
        let mut st = self.lock();
        Ok(st
            .ledger
            .owned_mut(run_id, gen)
            .map(|row| merge_state(&mut row.state, patch)))
    }

    fn heartbeat(
        &mut self,
        run_id: &RunId,
        gen: &str,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Outcome<HeartbeatAnswer>> {
        let mut st = self.lock();
        Ok(st.ledger.owned_mut(run_id, gen).map(|row| {
            row.lease_until = now_ms + lease_ms;
            HeartbeatAnswer {
                stop: row.stop,
                phase: row.phase,
            }
        }))
    }

    fn request_stop(
        &mut self,
        run_id: &RunId,
        mode: StopMode,
        now_ms: i64,
    ) -> Result<Outcome<StopAnswer>> {
        let mut st = self.lock();
        let Some(row) = st.ledger.rows.get_mut(run_id) else {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        };
        let stop = strongest_stop(row.stop, mode);
        row.stop = Some(stop);
        Ok(Ok(StopAnswer {
            stop,
            owner_gen: row.owner_gen.clone(),
            owner_lease_live: !lease_expired(row.lease_until, now_ms),
        }))
    }

    fn set_phase(
        &mut self,
        run_id: &RunId,
        gen: &str,
        change: PhaseChange,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<Phase>> {
        let mut st = self.lock();
        let row = match st.ledger.owned_mut(run_id, gen) {
            Ok(row) => row,
            Err(refusal) => return Ok(Err(refusal)),
        };
        // On a copy: a refused change leaves the row as it was.
        let mut changed = row.clone();
        let out = crate::ledger::change_phase(&mut changed, change, patch);
        if out.is_ok() {
            *row = changed;
        }
        Ok(out)
    }

    fn decide(
        &mut self,
        run_id: &RunId,
        call_id: &str,
        decided: &crate::ledger::Decided,
        now_ms: i64,
    ) -> Result<Outcome<crate::ledger::DecideAnswer>> {
        let mut st = self.lock();
        let Some(row) = st.ledger.rows.get_mut(run_id) else {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        };
        Ok(crate::ledger::decide(row, call_id, decided, now_ms))
    }

    fn handoff(&mut self, gen: &str, run_ids: &[RunId]) -> Result<Vec<(RunId, HandoffResult)>> {
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        let answers = run_ids
            .iter()
            .map(|run_id| {
                let result = match ledger.rows.get_mut(run_id) {
                    Some(row) if row.owner_gen == gen => {
                        match phase_transition(row.phase, PhaseChange::Handoff) {
                            Ok(next) => {
                                row.phase = next;
                                HandoffResult::HandedOff
                            }
                            Err(_) => HandoffResult::WrongPhase,
                        }
                    }
                    _ => HandoffResult::NotOwner,
                };
                (run_id.clone(), result)
            })
            .collect();
        Ok(answers)
    }

    fn finishing(
        &mut self,
        run_id: &RunId,
        gen: &str,
        status: RunStatus,
        answer: Option<&str>,
    ) -> Result<Outcome<()>> {
        let mut st = self.lock();
        let row = match st.ledger.owned_mut(run_id, gen) {
            Ok(row) => row,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let next = match crate::ledger::gate(row, status) {
            Ok(next) => next,
            Err(refusal) => return Ok(Err(refusal)),
        };
        merge_state(
            &mut row.state,
            &crate::ledger::finishing_patch(status, answer),
        );
        row.phase = next;
        Ok(Ok(()))
    }

    fn seal_gate(
        &mut self,
        gen: &str,
        status: RunStatus,
        record: &RunRecord,
        _proposal: Option<&PolicyProposal>,
        _now_ms: i64,
    ) -> Result<Outcome<SuccessorFacts>> {
        let run_id = &record.head.id;
        let row = match self.lock().ledger.owned_mut(run_id, gen) {
            Ok(row) => match crate::ledger::gate(row, status) {
                Ok(_) => row.clone(),
                Err(refusal) => return Ok(Err(refusal)),
            },
            Err(refusal) => return Ok(Err(refusal)),
        };
        Ok(Ok(SuccessorFacts {
            last_step: self.last_step(run_id)?,
            inbox: self.inbox_after(run_id, None)?,
            row,
        }))
    }

    fn finish(
        &mut self,
        run_id: &RunId,
        gen: &str,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<Outcome<PutOutcome>> {
        // A record for another run is the caller's bug, refused before any check (as SQLite does).
        if record.head.id != run_id {
            return Err(Error::InvalidRecord(RecordError::BadId));
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(refusal) = st.ledger.fence(run_id, gen) {
            return Ok(Err(refusal));
        }
        // Free the run first, so the upsert stores the record's events (a live run's would be
        // stripped); a refused upsert puts everything back, as SQLite's rollback does.
        let removed = st.ledger.drop_live(run_id);
        match st.put(record, proposal, now_ms) {
            Ok(outcome) => {
                st.ledger.stamp_receipts(run_id, now_ms);
                Ok(Ok(outcome))
            }
            Err(e) => {
                st.ledger.restore(run_id, removed);
                Err(e)
            }
        }
    }

    fn abandon(&mut self, run_id: &RunId, gen: &str) -> Result<Outcome<()>> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(refusal) = st.ledger.fence(run_id, gen) {
            return Ok(Err(refusal));
        }
        let removed = st.ledger.drop_live(run_id);
        // SQLite's `run_events` is shared with the history: when the run already has a record (its
        // provisional tombstone), abandon leaves the appended events in place and they read as that
        // record's events, overlaid on its own by seq. The same here.
        if let (Some(live), Some(stored)) = (removed.events, st.runs.get_mut(run_id)) {
            let own = std::mem::take(&mut stored.record.events);
            let mut merged: BTreeMap<u64, Value> =
                stored_event_seqs(&own).into_iter().zip(own).collect();
            merged.extend(live);
            stored.record.events = merged.into_values().collect();
        }
        Ok(Ok(()))
    }

    fn kill(&mut self, run_id: &RunId, now_ms: i64) -> Result<KillAnswer> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.ledger
            .deletion_fences
            .entry(run_id.to_owned())
            .or_insert(now_ms);
        let row = st.ledger.rows.get_mut(run_id);
        let answer = KillAnswer {
            live_owner: row.as_ref().map(|r| r.owner_gen.clone()),
            owner_lease_live: row
                .as_ref()
                .is_some_and(|r| !crate::ledger::decisions::lease_expired(r.lease_until, now_ms)),
            had_record: st.runs.contains_key(run_id),
        };
        if let Some(r) = row {
            r.stop = Some(StopMode::Hard);
        }
        Ok(answer)
    }

    fn purge(&mut self, run_id: &RunId) -> Result<bool> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if !st.ledger.is_killed(run_id) {
            return Ok(false);
        }
        let removed = st.ledger.drop_live(run_id);
        let record = st.runs.remove(run_id).is_some();
        Ok(removed.any() || record)
    }

    fn is_killed(&mut self, run_id: &RunId) -> Result<bool> {
        Ok(self.lock().ledger.is_killed(run_id))
    }

    fn push_inbox(&mut self, run_id: &RunId, message: &Value) -> Result<Outcome<u64>> {
        let mut st = self.lock();
        if !st.ledger.is_live(run_id) {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        }
        Ok(Ok(st.ledger.push_inbox(run_id, message)))
    }

    fn read_inbox(
        &mut self,
        run_id: &RunId,
        after_seq: Option<u64>,
    ) -> Result<Outcome<Vec<InboxItem>>> {
        let st = self.lock();
        if !st.ledger.is_live(run_id) {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        }
        Ok(Ok(st
            .ledger
            .inbox_items(run_id, |seq| is_unread(seq, after_seq))))
    }

    fn inbox_after(&mut self, run_id: &RunId, after_seq: Option<u64>) -> Result<Vec<InboxItem>> {
        Ok(self.lock().ledger.inbox_items(run_id, |seq| {
            crate::ledger::decisions::is_unread(seq, after_seq)
        }))
    }

    fn last_step(&mut self, run_id: &RunId) -> Result<Option<StepRecord>> {
        Ok(self.lock().ledger.last_step(run_id))
    }

    fn reclaim(
        &mut self,
        gen: &str,
        now_ms: i64,
        lease_ms: i64,
        dead_gens: &[String],
        driven: &[RunId],
    ) -> Result<ReclaimAnswer> {
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        let mut answer = ReclaimAnswer::default();
        let mut taken: Vec<(RunId, Phase, String)> = Vec::new();
        // `rows` is ordered by run id, so both lists come out in run-id order.
        for row in ledger.rows.values_mut() {
            match reclaim_selection(&row.view(), gen, now_ms, dead_gens, driven) {
                ReclaimSelection::Take => {
                    let prior_phase = row.phase;
                    let prior_owner = std::mem::replace(&mut row.owner_gen, gen.to_owned());
                    row.lease_until = now_ms + lease_ms;
                    row.phase = reclaim_phase(prior_phase);
                    taken.push((row.run_id.clone(), prior_phase, prior_owner));
                }
                ReclaimSelection::LiveElsewhere => answer.live_elsewhere.push(row.clone()),
                ReclaimSelection::Own | ReclaimSelection::Driven => {}
            }
        }
        for (run_id, prior_phase, prior_owner) in taken {
            let Some(row) = ledger.rows.get(&run_id).cloned() else {
                continue;
            };
            let last_step = ledger.last_step(&run_id);
            let consumed = last_step.as_ref().and_then(|s| s.inbox_consumed_seq);
            answer.taken.push(Reclaimed {
                row,
                prior_phase,
                prior_owner,
                unread_inbox: ledger.inbox_items(&run_id, |seq| is_unread(seq, consumed)),
                last_step,
            });
        }
        Ok(answer)
    }

    fn list_live(&mut self) -> Result<Vec<LiveRow>> {
        Ok(self.lock().ledger.rows.values().cloned().collect())
    }

    fn get_live(&mut self, run_id: &RunId) -> Result<Option<LiveRow>> {
        Ok(self.lock().ledger.rows.get(run_id).cloned())
    }

    fn live_events(
        &mut self,
        run_id: &RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<Value>>> {
        let st = self.lock();
        if !st.ledger.is_live(run_id) {
            return Ok(None);
        }
        let events = st
            .ledger
            .events
            .get(run_id)
            .into_iter()
            .flat_map(|e| {
                e.range((
                    std::ops::Bound::Excluded(after_seq),
                    std::ops::Bound::Unbounded,
                ))
            })
            .take(limit)
            .map(|(_, v)| v.clone())
            .collect();
        Ok(Some(events))
    }

    fn killed_among(&mut self, run_ids: &[RunId]) -> Result<Vec<RunId>> {
        let st = self.lock();
        let fenced: BTreeSet<&RunId> = run_ids
            .iter()
            .filter(|id| st.ledger.is_killed(id))
            .collect();
        Ok(fenced.into_iter().cloned().collect())
    }

    fn prune(
        &mut self,
        now_ms: i64,
        receipt_ttl_ms: i64,
        keep_gens: &[String],
    ) -> Result<PruneReport> {
        // The plan tables have their own lock; read and prune them first so the two locks are never nested.
        let plan_holders = self.plan_holders();
        let plan_requests =
            self.plans
                .prune_settled(now_ms, receipt_ttl_ms, crate::ledger::PRUNE_BATCH);
        let mut st = self.lock();
        let ledger = &mut st.ledger;
        let mut report = PruneReport::default();
        // Receipts of runs that ended without a stamp (abandon, purge) start their TTL now.
        for r in ledger.receipts.values_mut() {
            if r.ended_at.is_none() && !ledger.rows.contains_key(&r.run_id) {
                r.ended_at = Some(now_ms);
            }
        }
        let before = ledger.receipts.len();
        ledger
            .receipts
            .retain(|_, r| !receipt_expired(r.ended_at, now_ms, receipt_ttl_ms));
        report.receipts = (before - ledger.receipts.len()) as u64;
        let owners: BTreeSet<&str> = ledger.rows.values().map(|r| r.owner_gen.as_str()).collect();
        let doomed: Vec<String> = ledger
            .generations
            .values()
            .filter(|g| {
                let owns_rows = owners.contains(g.gen.as_str()) || plan_holders.contains(&g.gen);
                generation_prunable(g.started_at, keep_gens.contains(&g.gen), owns_rows, now_ms)
            })
            .map(|g| g.gen.clone())
            .collect();
        for gen in &doomed {
            ledger.generations.remove(gen);
        }
        report.generations = doomed.len() as u64;
        // Only a live run has transcript, step or inbox rows.
        let leftovers: BTreeSet<RunId> = ledger
            .transcript
            .keys()
            .chain(ledger.steps.keys())
            .chain(ledger.inbox.keys())
            .filter(|run_id| !ledger.rows.contains_key(*run_id))
            .take(crate::ledger::PRUNE_LEFTOVER_RUNS)
            .cloned()
            .collect();
        for run_id in &leftovers {
            ledger.drop_live(run_id);
        }
        report.leftover_runs = leftovers.len() as u64;
        // `deletion_fence_prunable`, with the run's purge read from every table (after the leftovers went).
        let fences: Vec<RunId> = st
            .ledger
            .deletion_fences
            .iter()
            .filter(|(run_id, at)| {
                let purged = st.ledger.holds_nothing_of(run_id) && !st.runs.contains_key(*run_id);
                deletion_fence_prunable(**at, purged, now_ms, receipt_ttl_ms)
            })
            .take(crate::ledger::PRUNE_BATCH)
            .map(|(run_id, _)| run_id.clone())
            .collect();
        for run_id in &fences {
            st.ledger.deletion_fences.remove(run_id);
        }
        report.deletion_fences = fences.len() as u64;
        report.plan_requests = plan_requests;
        Ok(report)
    }

    fn table_rows(&mut self) -> Result<TableRows> {
        let st = self.lock();
        let l = &st.ledger;
        let inner = |m: &BTreeMap<RunId, BTreeMap<u64, Value>>| {
            m.values().map(|v| v.len() as u64).sum::<u64>()
        };
        Ok(TableRows {
            runs: st.runs.len() as u64,
            run_events: st
                .runs
                .values()
                .map(|r| r.record.events.len() as u64)
                .sum::<u64>()
                + inner(&l.events),
            live_runs: l.rows.len() as u64,
            run_steps: l.steps.values().map(|s| s.len() as u64).sum(),
            transcript: l.transcript.values().map(|t| t.len() as u64).sum(),
            run_inbox: inner(&l.inbox),
            admit_receipts: l.receipts.len() as u64,
            deletion_fences: l.deletion_fences.len() as u64,
            generations: l.generations.len() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ledger::ReceiptKey;
    use crate::record::validate_record;
    use crate::store::RunStore;

    const NOW: i64 = 1_800_000_000_000;
    const LEASE: i64 = 30_000;

    fn admit(thread: &str, run_id: &RunId, gen: &str, key: Option<(&str, &str)>) -> Admit {
        Admit {
            thread_key: thread.to_owned(),
            gen: gen.to_owned(),
            run_id: run_id.to_owned(),
            request: json!({"text": "hi"}),
            meta: json!({"agent": "demo", "request": {"text": "hi"}}),
            key: key.map(|(k, h)| ReceiptKey {
                scope: "api".into(),
                key: k.into(),
                body_hash: h.into(),
            }),
            lease_ms: LEASE,
            writer: None,
            strategy: crate::ledger::Strategy::Steer,
        }
    }

    fn promotion() -> Promotion {
        Promotion {
            system_text: "sys".into(),
            tools: json!([]),
            state: Map::new(),
            lease_ms: LEASE,
        }
    }

    fn record(id: &str) -> RunRecord {
        validate_record(&json!({
            "id": id, "agent": "demo", "channelId": "C1", "userId": "U1", "threadKey": "C1:t1",
            "channelVisibility": "public", "startedAt": NOW - 1000, "finishedAt": NOW,
            "status": "completed", "eventCount": 1, "storedEventCount": 1, "truncated": false,
            "events": [{"type": "answer", "seq": 7, "at": NOW, "text": "done"}],
            "diagnosis": {"byCategory": {}}
        }))
        .expect("valid test record")
    }

    #[test]
    fn a_run_goes_from_admit_to_a_finished_record_and_frees_its_thread() {
        let mut s = MemoryStore::new();
        // Admission reserves the thread; a follow-up steers into the run's inbox.
        assert_eq!(
            s.admit(&admit("C1:t1", &RunId::from("r1"), "g1", None), NOW)
                .ok(),
            Some(AdmitOutcome::Started {
                run_id: "r1".into()
            })
        );
        assert_eq!(
            s.admit(&admit("C1:t1", &RunId::from("r2"), "g1", None), NOW)
                .ok(),
            Some(AdmitOutcome::Steered {
                run_id: "r1".into(),
                seq: 1
            })
        );
        assert_eq!(
            s.claim(&RunId::from("r1"), "g1", &promotion(), NOW).ok(),
            Some(Ok(Claimed::Promoted))
        );
        assert_eq!(
            s.claim(&RunId::from("r1"), "g1", &promotion(), NOW).ok(),
            Some(Ok(Claimed::AlreadyLive))
        );
        assert_eq!(
            s.append(
                &RunId::from("r1"),
                "g1",
                &[json!({"type": "note", "seq": 1})]
            )
            .ok(),
            Some(Ok(()))
        );
        // Another generation is fenced and writes nothing.
        assert_eq!(
            s.append(
                &RunId::from("r1"),
                "g2",
                &[json!({"type": "note", "seq": 2})]
            )
            .ok(),
            Some(Err(Refusal::Fenced {
                run_id: "r1".into()
            }))
        );
        assert_eq!(
            s.live_events(&RunId::from("r1"), 0, 10).ok(),
            Some(Some(vec![json!({"type": "note", "seq": 1})]))
        );
        assert_eq!(
            s.finishing(&RunId::from("r1"), "g1", RunStatus::Completed, Some("done"))
                .ok(),
            Some(Ok(()))
        );
        assert!(matches!(
            s.finishing(&RunId::from("r1"), "g1", RunStatus::Completed, None)
                .ok(),
            Some(Err(Refusal::WrongPhase {
                phase: Phase::Finishing,
                ..
            }))
        ));
        let put = s
            .finish(&RunId::from("r1"), "g1", &record("r1"), None, NOW)
            .ok();
        assert_eq!(put.map(|o| o.map(|p| p.stored)), Some(Ok(true)));
        // The record's events replaced the live ones; the thread is free; the inbox went with the run.
        let stored = RunStore::get(&mut s, &RunId::from("r1"), NOW)
            .ok()
            .flatten()
            .map(|r| r.events);
        assert_eq!(
            stored,
            Some(vec![
                json!({"type": "answer", "seq": 7, "at": NOW, "text": "done"})
            ])
        );
        assert_eq!(s.live_events(&RunId::from("r1"), 0, 10).ok(), Some(None));
        assert_eq!(s.lock().ledger.inbox.get("r1").map(BTreeMap::len), None);
        assert_eq!(
            s.admit(&admit("C1:t1", &RunId::from("r3"), "g1", None), NOW)
                .ok(),
            Some(AdmitOutcome::Started {
                run_id: "r3".into()
            })
        );
    }

    #[test]
    fn a_refused_finish_leaves_the_run_live() {
        let mut s = MemoryStore::new();
        assert!(s
            .admit(&admit("C1:t1", &RunId::from("r1"), "g1", None), NOW)
            .is_ok());
        assert!(s
            .append(
                &RunId::from("r1"),
                "g1",
                &[json!({"type": "note", "seq": 1})]
            )
            .is_ok());
        // A record for another id is an error, and nothing moved.
        assert!(s
            .finish(&RunId::from("r1"), "g1", &record("r9"), None, NOW)
            .is_err());
        assert!(s.lock().ledger.is_live(&RunId::from("r1")));
        assert_eq!(
            s.live_events(&RunId::from("r1"), 0, 10)
                .ok()
                .flatten()
                .map(|e| e.len()),
            Some(1)
        );
        assert_eq!(
            RunStore::get(&mut s, &RunId::from("r9"), NOW)
                .ok()
                .flatten(),
            None
        );
    }

    #[test]
    fn abandon_leaves_the_live_events_to_an_existing_tombstone() {
        let mut s = MemoryStore::new();
        assert!(s
            .admit(&admit("C1:t1", &RunId::from("r1"), "g1", None), NOW)
            .is_ok());
        assert!(s
            .append(
                &RunId::from("r1"),
                "g1",
                &[json!({"type": "input", "seq": 1})]
            )
            .is_ok());
        // The tombstone is put while the run lives: its own events are stripped.
        let mut tombstone = record("r1");
        tombstone.head.provisional = true;
        assert!(RunStore::put(&mut s, &tombstone, None, NOW).is_ok());
        assert_eq!(
            s.abandon(&RunId::from("r1"), "g2").ok(),
            Some(Err(Refusal::Fenced {
                run_id: "r1".into()
            }))
        );
        assert_eq!(s.abandon(&RunId::from("r1"), "g1").ok(), Some(Ok(())));
        // As with SQLite's shared `run_events`, the appended events read as the tombstone's.
        let events = RunStore::get(&mut s, &RunId::from("r1"), NOW)
            .ok()
            .flatten()
            .map(|r| r.events);
        assert_eq!(events, Some(vec![json!({"type": "input", "seq": 1})]));
        assert_eq!(s.get_live(&RunId::from("r1")).ok(), Some(None));
        assert_eq!(
            s.abandon(&RunId::from("r1"), "g1").ok(),
            Some(Err(Refusal::UnknownRun {
                run_id: "r1".into()
            }))
        );
    }

    #[test]
    fn a_keyed_retry_answers_verbatim_and_another_body_conflicts() {
        let mut s = MemoryStore::new();
        let first = s
            .admit(
                &admit("C1:t1", &RunId::from("r1"), "g1", Some(("k", "h1"))),
                NOW,
            )
            .ok();
        assert_eq!(
            first,
            Some(AdmitOutcome::Started {
                run_id: "r1".into()
            })
        );
        // The retry carries a fresh pre-minted id, yet answers the first run.
        assert_eq!(
            s.admit(
                &admit("C1:t1", &RunId::from("r2"), "g1", Some(("k", "h1"))),
                NOW
            )
            .ok(),
            first
        );
        assert_eq!(
            s.admit(
                &admit("C1:t1", &RunId::from("r2"), "g1", Some(("k", "h2"))),
                NOW
            )
            .ok(),
            Some(AdmitOutcome::KeyConflict)
        );
        // Busy is not a receipt: once the thread frees, the same key starts a run.
        assert!(s
            .finishing(&RunId::from("r1"), "g1", RunStatus::Completed, None)
            .is_ok());
        let busy = admit("C1:t1", &RunId::from("r2"), "g1", Some(("k2", "h")));
        assert_eq!(
            s.admit(&busy, NOW).ok(),
            Some(AdmitOutcome::Busy {
                run_id: "r1".into()
            })
        );
        assert!(s.abandon(&RunId::from("r1"), "g1").is_ok());
        assert_eq!(
            s.admit(&busy, NOW).ok(),
            Some(AdmitOutcome::Started {
                run_id: "r2".into()
            })
        );
    }

    #[test]
    fn reclaim_takes_expired_rows_with_their_unread_inbox() {
        let mut s = MemoryStore::new();
        assert!(s
            .admit(&admit("C1:a", &RunId::from("ra"), "g1", None), NOW)
            .is_ok());
        assert!(s
            .admit(
                &admit("C1:b", &RunId::from("rb"), "g1", None),
                NOW + 10 * LEASE
            )
            .is_ok());
        assert!(s.claim(&RunId::from("ra"), "g1", &promotion(), NOW).is_ok());
        let seed = StepRecord {
            step: 0,
            seq: 0,
            turn_index: 1,
            in_flight: vec![],
            inbox_consumed_seq: Some(1),
            remaining_ms: 1000,
            turn: 0,
            iteration: 0,
        };
        assert!(s.step(&RunId::from("ra"), "g1", &seed).is_ok());
        for n in 1..=2 {
            assert_eq!(
                s.push_inbox(&RunId::from("ra"), &json!({"n": n})).ok(),
                Some(Ok(n))
            );
        }
        let answer = s
            .reclaim("g2", NOW + LEASE, LEASE, &[], &[])
            .expect("reclaim");
        // `ra`'s lease ended exactly now: taken; `rb` is still leased: reported.
        assert_eq!(answer.taken.len(), 1);
        let taken = &answer.taken[0];
        assert_eq!(
            (
                taken.row.owner_gen.as_str(),
                taken.row.phase,
                taken.prior_owner.as_str()
            ),
            ("g2", Phase::Live, "g1")
        );
        assert_eq!(
            taken.unread_inbox,
            vec![InboxItem {
                seq: 2,
                message: json!({"n": 2})
            }]
        );
        assert_eq!(
            answer
                .live_elsewhere
                .iter()
                .map(|r| r.run_id.as_str())
                .collect::<Vec<_>>(),
            ["rb"]
        );
        // The old owner is fenced from then on.
        assert_eq!(
            s.heartbeat(&RunId::from("ra"), "g1", LEASE, NOW).ok(),
            Some(Err(Refusal::Fenced {
                run_id: "ra".into()
            }))
        );
    }

    #[test]
    fn transcript_parts_are_written_once_and_read_back_as_turns() {
        let mut s = MemoryStore::new();
        assert!(s
            .admit(&admit("C1:t1", &RunId::from("r1"), "g1", None), NOW)
            .is_ok());
        let turns = vec![
            Turn {
                role: "user".into(),
                parts: vec![json!("a"), json!("b")],
            },
            Turn {
                role: "assistant".into(),
                parts: vec![json!({"text": "c"})],
            },
        ];
        assert_eq!(
            s.write_transcript(&RunId::from("r1"), "g1", 0, &turns).ok(),
            Some(Ok(()))
        );
        let edit = vec![Turn {
            role: "assistant".into(),
            parts: vec![json!("changed")],
        }];
        assert_eq!(
            s.write_transcript(&RunId::from("r1"), "g1", 1, &edit).ok(),
            Some(Ok(()))
        );
        assert_eq!(
            s.read_transcript(&RunId::from("r1")).ok().map(|t| t.turns),
            Some(turns)
        );
        assert_eq!(
            s.read_transcript(&RunId::from("nobody"))
                .ok()
                .map(|t| t.turns),
            Some(vec![])
        );
    }
}
