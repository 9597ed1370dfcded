//! SQL for the live-run ledger tables (SPEC §4.1): the [`RunLedger`] implementation.
//!
//! Writes `live_runs`, `run_steps`, `transcript`, `run_inbox`, `admit_receipts`, `deletion_fences` and
//! `generations` here; reads rows through [`super::live`]; reaches the finished-run tables (`runs`,
//! `run_events`) only through [`super::records`] — `finish` upserts the record with the same
//! [`put_in`] a `put` runs, inside this method's transaction.
//!
//! Every method is one `BEGIN IMMEDIATE` transaction that reads the rows it decides on, asks
//! [`decisions`] what to do, and writes the answer before committing — so a refusal is decided under the
//! write lock and two processes sharing the file cannot both win a row.

use crate::RunId;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{Map, Value};

use super::live::{
    get_row, inbox_after, is_killed, is_live, last_step, live_row, owned, owner_only,
    row_by_thread, ROW_COLUMNS,
};
use super::records::{delete_events, has_record, insert_events, live_events_in, purge_in, put_in};
use super::SqliteStore;
use crate::ledger::decisions::{
    self, CapCount, ClaimDecision, Phase, PhaseChange, ReclaimSelection, StopMode,
};
use crate::ledger::{
    check_events, check_turns, decode_receipt_answer, merge_state, Admit, AdmitOutcome, Claimed,
    GenerationInfo, HandoffResult, HeartbeatAnswer, InboxItem, KillAnswer, LiveRow, Outcome,
    Promotion, PruneReport, ReclaimAnswer, Reclaimed, Refusal, RunLedger, StepRecord, StepWrite,
    StopAnswer, SuccessorFacts, TableRows, Transcript, Turn, FENCE_PURGED_SQL as PURGED,
    PRUNE_BATCH, PRUNE_LEFTOVER_RUNS,
};
use crate::record::{RunRecord, RunStatus};
use crate::store::{PolicyProposal, PutOutcome};
use crate::{Error, Result};

/// Most ids one `killed_among` statement probes; more ids take more steps of it in the same read
/// transaction.
const KILLED_AMONG_CHUNK: usize = 500;

/// Unwrap an owner check or return its refusal from the enclosing method: `owner!(tx, run, gen)` checks
/// only, `owner!(row: tx, run, gen)` answers the row.
macro_rules! owner {
    (row: $tx:expr, $run:expr, $gen:expr) => {
        match owned(&$tx, $run, $gen)? {
            Ok(row) => row,
            Err(refusal) => return Ok(Err(refusal)),
        }
    };
    ($tx:expr, $run:expr, $gen:expr) => {
        if let Err(refusal) = owner_only(&$tx, $run, $gen)? {
            return Ok(Err(refusal));
        }
    };
}

fn write_state(tx: &Connection, run_id: &RunId, state: &Map<String, Value>) -> Result<()> {
    tx.prepare_cached("UPDATE live_runs SET state_json = ?2 WHERE run_id = ?1")?
        .execute(params![run_id, Value::Object(state.clone()).to_string()])?;
    Ok(())
}

/// The events that carry a seq, written; the first refusal of one, answered.
fn append_in(tx: &Connection, run_id: &RunId, events: &[Value]) -> Result<Option<Refusal>> {
    let (rows, refused) = check_events(events);
    insert_events(
        tx,
        run_id,
        rows.into_iter().map(|(seq, _, json)| (seq, json)),
    )?;
    Ok(refused)
}

fn step_in(tx: &Connection, run_id: &RunId, record: &StepRecord) -> Result<()> {
    let json = serde_json::to_string(record).map_err(|e| Error::corrupt("step record", e))?;
    tx.prepare_cached("INSERT OR REPLACE INTO run_steps (run_id, step, json) VALUES (?1, ?2, ?3)")?
        .execute(params![run_id, record.step as i64, json])?;
    Ok(())
}

/// The turns' parts, written unless one is refused (then nothing is).
fn transcript_in(
    tx: &Connection,
    run_id: &RunId,
    first_idx: u64,
    turns: &[Turn],
) -> Result<Outcome<()>> {
    let rows = match check_turns(first_idx, turns) {
        Ok(rows) => rows,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let rows: Vec<(i64, i64, String)> = rows
        .into_iter()
        .map(|(idx, part, json)| (idx as i64, part as i64, json))
        .collect();
    let rows: Vec<[&dyn rusqlite::ToSql; 3]> = rows
        .iter()
        .map(|(idx, part, json)| [idx as _, part as _, json as _])
        .collect();
    super::insert_rows(
        tx,
        "INSERT OR IGNORE INTO transcript (run_id, idx, part, json)",
        "",
        run_id,
        &rows,
    )?;
    Ok(Ok(()))
}

/// The successor facts of the live `row` of `run_id`: its highest step record and its whole inbox.
fn successor_facts_in(tx: &Connection, run_id: &RunId, row: LiveRow) -> Result<SuccessorFacts> {
    Ok(SuccessorFacts {
        last_step: last_step(tx, run_id)?,
        inbox: inbox_after(tx, run_id, None)?,
        row,
    })
}

fn set_phase(tx: &Connection, run_id: &RunId, phase: Phase) -> Result<()> {
    tx.prepare_cached("UPDATE live_runs SET phase = ?2 WHERE run_id = ?1")?
        .execute(params![run_id, phase.as_str()])?;
    Ok(())
}

fn push_inbox_in(tx: &Connection, run_id: &RunId, message: &Value) -> Result<u64> {
    let seq: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM run_inbox WHERE run_id = ?1")?
        .query_row([run_id], |r| r.get(0))?;
    tx.prepare_cached("INSERT INTO run_inbox (run_id, seq, json) VALUES (?1, ?2, ?3)")?
        .execute(params![run_id, seq, message.to_string()])?;
    Ok(seq as u64)
}

/// How many messages wait queued in a run's inbox (SPEC §5.1 `position`).
fn queued_count(tx: &Connection, run_id: &str) -> Result<u64> {
    Ok(inbox_after(tx, run_id, None)?
        .iter()
        .filter(|i| i.queued())
        .count() as u64)
}

/// Delete a run's ledger rows — `live_runs`, `run_steps`, `transcript`, `run_inbox` — answering how many
/// went; its receipts stay (they answer retries until pruned), and so do its events (the history's).
fn delete_live(tx: &Connection, run_id: &str) -> Result<usize> {
    let mut n = 0;
    for sql in [
        "DELETE FROM live_runs WHERE run_id = ?1",
        "DELETE FROM run_steps WHERE run_id = ?1",
        "DELETE FROM transcript WHERE run_id = ?1",
        "DELETE FROM run_inbox WHERE run_id = ?1",
    ] {
        n += tx.prepare_cached(sql)?.execute([run_id])?;
    }
    Ok(n)
}

/// Stamp the end of `run_id` on its receipts that carry none yet: their TTL runs from `now_ms`.
fn stamp_receipts(tx: &Connection, run_id: &RunId, now_ms: i64) -> Result<()> {
    tx.prepare_cached(
        "UPDATE admit_receipts SET ended_at = ?2 WHERE run_id = ?1 AND ended_at IS NULL",
    )?
    .execute(params![run_id, now_ms])?;
    Ok(())
}

/// Count the rows of `table` (a full count; see [`crate::ledger::TableRows`]).
fn count(tx: &Connection, table: &str) -> Result<u64> {
    let n: i64 = tx.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
    Ok(n.max(0) as u64)
}

impl RunLedger for SqliteStore {
    fn record_generation(&mut self, info: &GenerationInfo) -> Result<()> {
        let tx = self.immediate()?;
        tx.execute(
            "INSERT OR REPLACE INTO generations (gen, host, host_id, pid, proc_start, started_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![info.gen, info.host, info.host_id, info.pid, info.proc_start, info.started_at],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn generations(&mut self) -> Result<Vec<GenerationInfo>> {
        let tx = self.read()?;
        let mut stmt =
            tx.prepare("SELECT gen, host, host_id, pid, proc_start, started_at FROM generations ORDER BY started_at, gen")?;
        let out = stmt
            .query_map([], |r| {
                Ok(GenerationInfo {
                    gen: r.get(0)?,
                    host: r.get(1)?,
                    host_id: r.get(2)?,
                    pid: r.get(3)?,
                    proc_start: r.get(4)?,
                    started_at: r.get(5)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(out)
    }

    fn admit(&mut self, a: &Admit, now_ms: i64) -> Result<AdmitOutcome> {
        let tx = self.immediate()?;
        if let Some(k) = &a.key {
            let hit: Option<(String, String, String)> = tx
                .prepare_cached("SELECT body_hash, run_id, answer_json FROM admit_receipts WHERE scope = ?1 AND key = ?2")?
                .query_row(params![k.scope, k.key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            if let Some((hash, run_id, answer)) = hit {
                if hash != k.body_hash {
                    return Ok(AdmitOutcome::KeyConflict);
                }
                return decode_receipt_answer(&k.scope, &run_id, &answer);
            }
        }
        if tx
            .prepare_cached("SELECT 1 FROM deletion_fences WHERE run_id = ?1")?
            .exists([&a.run_id])?
        {
            return Ok(AdmitOutcome::Fenced);
        }
        let holder = row_by_thread(&tx, &a.thread_key)?;
        let decision = decisions::decide_admit(
            holder.as_ref().map(LiveRow::view).as_ref(),
            a.key.is_some(),
            a.reaches(holder.as_ref()),
            a.strategy,
        );
        if let Some(refused) =
            decision.refused_by_cap(a.key.is_some(), |what, run_id| match what {
                CapCount::Receipts => Ok::<_, Error>(
                    tx.prepare_cached("SELECT COUNT(*) FROM admit_receipts WHERE run_id = ?1")?
                        .query_row([run_id], |r| r.get::<_, i64>(0))? as u64,
                ),
                CapCount::Queued => queued_count(&tx, run_id),
            })?
        {
            return Ok(refused); // nothing written: the transaction rolls back empty
        }
        let outcome = match decision {
            decisions::AdmitDecision::Insert => {
                tx.prepare_cached(
                    "INSERT INTO live_runs (run_id, thread_key, owner_gen, lease_until, started_at, phase, meta_json)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?
                .execute(params![
                    a.run_id,
                    a.thread_key,
                    a.gen,
                    now_ms + a.lease_ms,
                    now_ms,
                    decisions::INSERT_PHASE.as_str(),
                    a.meta.to_string()
                ])?;
                AdmitOutcome::Started {
                    run_id: a.run_id.clone(),
                }
            }
            decisions::AdmitDecision::Steer { run_id } => {
                let seq = push_inbox_in(&tx, &run_id, &a.request)?;
                AdmitOutcome::Steered { run_id, seq }
            }
            decisions::AdmitDecision::Queue { run_id } => {
                push_inbox_in(&tx, &run_id, &a.request)?;
                let position = queued_count(&tx, &run_id)?;
                AdmitOutcome::Queued { run_id, position }
            }
            decisions::AdmitDecision::Interrupt { run_id } => {
                push_inbox_in(&tx, &run_id, &a.request)?;
                let stop =
                    decisions::strongest_stop(holder.as_ref().and_then(|h| h.stop), StopMode::Soft);
                tx.prepare_cached("UPDATE live_runs SET stop = ?2 WHERE run_id = ?1")?
                    .execute(params![run_id, stop.as_str()])?;
                let position = queued_count(&tx, &run_id)?;
                AdmitOutcome::Interrupting { run_id, position }
            }
            decisions::AdmitDecision::Reject { run_id } => AdmitOutcome::Rejected { run_id },
            decisions::AdmitDecision::Busy { run_id } => AdmitOutcome::Busy { run_id },
            decisions::AdmitDecision::Forbidden => AdmitOutcome::Forbidden,
        };
        if let (Some(k), true) = (&a.key, outcome.kept_in_receipt()) {
            let (run_id, seq) = outcome.receipt_target();
            let answer =
                serde_json::to_string(&outcome).map_err(|e| Error::corrupt("admit outcome", e))?;
            tx.prepare_cached(
                "INSERT INTO admit_receipts (scope, key, body_hash, run_id, outcome, seq, answer_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![k.scope, k.key, k.body_hash, run_id, outcome.kind(), seq.map(|s| s as i64), answer])?;
        }
        tx.commit()?;
        Ok(outcome)
    }

    fn claim(
        &mut self,
        run_id: &RunId,
        gen: &str,
        p: &Promotion,
        now_ms: i64,
    ) -> Result<Outcome<Claimed>> {
        let tx = self.immediate()?;
        if is_killed(&tx, run_id)? {
            return Ok(Err(Refusal::Fenced {
                run_id: run_id.to_owned(),
            }));
        }
        let by_run = get_row(&tx, run_id)?;
        let by_thread = match &by_run {
            Some(r) => row_by_thread(&tx, &r.thread_key)?,
            None => None,
        };
        let decision = decisions::decide_claim(
            by_thread.as_ref().map(LiveRow::view).as_ref(),
            by_run.as_ref().map(LiveRow::view).as_ref(),
            run_id,
            gen,
        );
        let out = match decision {
            ClaimDecision::Promote => {
                let mut row = by_run.expect("promote needs the run's row");
                merge_state(&mut row.state, &p.state);
                tx.prepare_cached(
                    "UPDATE live_runs SET phase = ?2, system_text = ?3, tools_json = ?4, state_json = ?5, lease_until = ?6
                     WHERE run_id = ?1 AND owner_gen = ?7",
                )?
                .execute(params![
                    run_id,
                    Phase::Live.as_str(),
                    p.system_text,
                    p.tools.to_string(),
                    Value::Object(row.state).to_string(),
                    now_ms + p.lease_ms,
                    gen
                ])?;
                Ok(Claimed::Promoted)
            }
            ClaimDecision::Keep => Ok(Claimed::AlreadyLive),
            ClaimDecision::ThreadLive { .. } => Err(by_thread
                .expect("thread-live names the holder")
                .thread_live()),
            ClaimDecision::Fenced => Err(Refusal::Fenced {
                run_id: run_id.to_owned(),
            }),
            ClaimDecision::UnknownRun => Err(Refusal::UnknownRun {
                run_id: run_id.to_owned(),
            }),
        };
        tx.commit()?;
        Ok(out)
    }

    fn append(&mut self, run_id: &RunId, gen: &str, events: &[Value]) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        owner!(tx, run_id, gen);
        let refused = append_in(&tx, run_id, events)?;
        tx.commit()?;
        Ok(refused.map_or(Ok(()), Err))
    }

    fn step(&mut self, run_id: &RunId, gen: &str, record: &StepRecord) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        owner!(tx, run_id, gen);
        step_in(&tx, run_id, record)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    fn write_transcript(
        &mut self,
        run_id: &RunId,
        gen: &str,
        first_idx: u64,
        turns: &[Turn],
    ) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        owner!(tx, run_id, gen);
        if let Err(refusal) = transcript_in(&tx, run_id, first_idx, turns)? {
            return Ok(Err(refusal));
        }
        tx.commit()?;
        Ok(Ok(()))
    }

    /// The four methods' writes under one owner check, in one transaction (or savepoint): each method
    /// alone would open its own and read the owner again — a dozen statements of a run's step.
    fn write_step(&mut self, run_id: &RunId, gen: &str, write: &StepWrite) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        let state = match write.state.is_empty() {
            true => {
                owner!(tx, run_id, gen);
                None
            }
            false => Some(owner!(row: tx, run_id, gen).state),
        };
        if let Err(refusal) = transcript_in(&tx, run_id, write.first_idx, &write.turns)? {
            return Ok(Err(refusal));
        }
        if let Some(refusal) = append_in(&tx, run_id, &write.events)? {
            // As the methods one by one: the turns and the good events stand, the record does not.
            tx.commit()?;
            return Ok(Err(refusal));
        }
        if let Some(mut state) = state {
            merge_state(&mut state, &write.state);
            write_state(&tx, run_id, &state)?;
        }
        step_in(&tx, run_id, &write.record)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    fn read_transcript(&mut self, run_id: &RunId) -> Result<Transcript> {
        let tx = self.read()?;
        let mut stmt = tx.prepare_cached(
            "SELECT idx, part, json FROM transcript WHERE run_id = ?1 ORDER BY idx, part",
        )?;
        let rows: Vec<(u64, u64, String)> = stmt
            .query_map([run_id], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, i64>(1)? as u64,
                    r.get(2)?,
                ))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Transcript::assemble(rows)
    }

    fn set_state(
        &mut self,
        run_id: &RunId,
        gen: &str,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        let mut row = owner!(row: tx, run_id, gen);
        merge_state(&mut row.state, patch);
        write_state(&tx, run_id, &row.state)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    fn heartbeat(
        &mut self,
        run_id: &RunId,
        gen: &str,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Outcome<HeartbeatAnswer>> {
        let tx = self.immediate()?;
        let row = owner!(row: tx, run_id, gen);
        tx.prepare_cached("UPDATE live_runs SET lease_until = ?2 WHERE run_id = ?1")?
            .execute(params![run_id, now_ms + lease_ms])?;
        tx.commit()?;
        Ok(Ok(HeartbeatAnswer {
            stop: row.stop,
            phase: row.phase,
        }))
    }

    fn request_stop(
        &mut self,
        run_id: &RunId,
        mode: StopMode,
        now_ms: i64,
    ) -> Result<Outcome<StopAnswer>> {
        let tx = self.immediate()?;
        let Some(row) = get_row(&tx, run_id)? else {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        };
        let stop = decisions::strongest_stop(row.stop, mode);
        tx.prepare_cached("UPDATE live_runs SET stop = ?2 WHERE run_id = ?1")?
            .execute(params![run_id, stop.as_str()])?;
        tx.commit()?;
        Ok(Ok(StopAnswer {
            stop,
            owner_lease_live: !decisions::lease_expired(row.lease_until, now_ms),
            owner_gen: row.owner_gen,
        }))
    }

    fn set_phase(
        &mut self,
        run_id: &RunId,
        gen: &str,
        change: PhaseChange,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<Phase>> {
        let tx = self.immediate()?;
        let mut row = owner!(row: tx, run_id, gen);
        let next = match crate::ledger::change_phase(&mut row, change, patch) {
            Ok(next) => next,
            Err(refusal) => return Ok(Err(refusal)),
        };
        write_state(&tx, run_id, &row.state)?;
        set_phase(&tx, run_id, next)?;
        tx.commit()?;
        Ok(Ok(next))
    }

    fn decide(
        &mut self,
        run_id: &RunId,
        call_id: &str,
        decided: &crate::ledger::Decided,
        now_ms: i64,
    ) -> Result<Outcome<crate::ledger::DecideAnswer>> {
        let tx = self.immediate()?;
        let Some(mut row) = get_row(&tx, run_id)? else {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        };
        let answer = match crate::ledger::decide(&mut row, call_id, decided, now_ms) {
            Ok(answer) => answer,
            Err(refusal) => return Ok(Err(refusal)),
        };
        write_state(&tx, run_id, &row.state)?;
        tx.commit()?;
        Ok(Ok(answer))
    }

    fn handoff(&mut self, gen: &str, run_ids: &[RunId]) -> Result<Vec<(RunId, HandoffResult)>> {
        let tx = self.immediate()?;
        let mut out = Vec::with_capacity(run_ids.len());
        for id in run_ids {
            let result = match get_row(&tx, id)? {
                Some(row) if row.owner_gen == gen => {
                    match decisions::phase_transition(row.phase, PhaseChange::Handoff) {
                        Ok(next) => {
                            set_phase(&tx, id, next)?;
                            HandoffResult::HandedOff
                        }
                        Err(_) => HandoffResult::WrongPhase,
                    }
                }
                _ => HandoffResult::NotOwner,
            };
            out.push((id.clone(), result));
        }
        tx.commit()?;
        Ok(out)
    }

    fn finishing(
        &mut self,
        run_id: &RunId,
        gen: &str,
        status: RunStatus,
        answer: Option<&str>,
    ) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        let mut row = owner!(row: tx, run_id, gen);
        let next = match crate::ledger::gate(&row, status) {
            Ok(next) => next,
            Err(refusal) => return Ok(Err(refusal)),
        };
        merge_state(
            &mut row.state,
            &crate::ledger::finishing_patch(status, answer),
        );
        write_state(&tx, run_id, &row.state)?;
        set_phase(&tx, run_id, next)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    /// The owner's row, read once, answers the gate and is the successor facts' row.
    fn seal_gate(
        &mut self,
        gen: &str,
        status: RunStatus,
        record: &RunRecord,
        _proposal: Option<&PolicyProposal>,
        _now_ms: i64,
    ) -> Result<Outcome<SuccessorFacts>> {
        let run_id = &record.head.id;
        let tx = self.immediate()?;
        let row = owner!(row: tx, run_id, gen);
        if let Err(refusal) = crate::ledger::gate(&row, status) {
            return Ok(Err(refusal));
        }
        let facts = successor_facts_in(&tx, run_id, row)?;
        tx.commit()?;
        Ok(Ok(facts))
    }

    fn finish(
        &mut self,
        run_id: &RunId,
        gen: &str,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<Outcome<PutOutcome>> {
        if record.head.id != run_id {
            return Err(Error::InvalidRecord(crate::record::RecordError::BadId));
        }
        let tx = self.immediate()?;
        owner!(tx, run_id, gen);
        delete_live(&tx, run_id)?;
        stamp_receipts(&tx, run_id, now_ms)?;
        // With the live row gone, the put replaces the live events with the record's.
        let out = put_in(&tx, record, proposal, now_ms)?;
        tx.commit()?;
        Ok(Ok(out))
    }

    fn abandon(&mut self, run_id: &RunId, gen: &str) -> Result<Outcome<()>> {
        let tx = self.immediate()?;
        owner!(tx, run_id, gen);
        delete_live(&tx, run_id)?;
        if !has_record(&tx, run_id)? {
            delete_events(&tx, run_id)?;
        }
        tx.commit()?;
        Ok(Ok(()))
    }

    fn push_inbox(&mut self, run_id: &RunId, message: &Value) -> Result<Outcome<u64>> {
        let tx = self.immediate()?;
        if !is_live(&tx, run_id)? {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        }
        let seq = push_inbox_in(&tx, run_id, message)?;
        tx.commit()?;
        Ok(Ok(seq))
    }

    fn read_inbox(
        &mut self,
        run_id: &RunId,
        after_seq: Option<u64>,
    ) -> Result<Outcome<Vec<InboxItem>>> {
        let tx = self.read()?;
        if !is_live(&tx, run_id)? {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        }
        Ok(Ok(inbox_after(&tx, run_id, after_seq)?))
    }

    fn inbox_after(&mut self, run_id: &RunId, after_seq: Option<u64>) -> Result<Vec<InboxItem>> {
        let tx = self.read()?;
        inbox_after(&tx, run_id, after_seq)
    }

    fn last_step(&mut self, run_id: &RunId) -> Result<Option<StepRecord>> {
        let tx = self.read()?;
        last_step(&tx, run_id)
    }

    /// The row, its last step and its inbox in one read transaction (the default opens three).
    fn successor_facts(&mut self, run_id: &RunId) -> Result<Option<SuccessorFacts>> {
        let tx = self.read()?;
        match get_row(&tx, run_id)? {
            Some(row) => successor_facts_in(&tx, run_id, row).map(Some),
            None => Ok(None),
        }
    }

    fn reclaim(
        &mut self,
        gen: &str,
        now_ms: i64,
        lease_ms: i64,
        dead_gens: &[String],
        driven: &[RunId],
    ) -> Result<ReclaimAnswer> {
        let tx = self.immediate()?;
        let rows: Vec<LiveRow> = tx
            .prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM live_runs ORDER BY run_id"
            ))?
            .query_map([], live_row)?
            .collect::<rusqlite::Result<_>>()?;
        let mut answer = ReclaimAnswer::default();
        for mut row in rows {
            match decisions::reclaim_selection(&row.view(), gen, now_ms, dead_gens, driven) {
                ReclaimSelection::Own | ReclaimSelection::Driven => {}
                ReclaimSelection::LiveElsewhere => answer.live_elsewhere.push(row),
                ReclaimSelection::Take => {
                    let prior_phase = row.phase;
                    let prior_owner = std::mem::replace(&mut row.owner_gen, gen.to_owned());
                    row.phase = decisions::reclaim_phase(prior_phase);
                    row.lease_until = now_ms + lease_ms;
                    tx.prepare_cached("UPDATE live_runs SET owner_gen = ?2, lease_until = ?3, phase = ?4 WHERE run_id = ?1")?
                        .execute(params![row.run_id, gen, row.lease_until, row.phase.as_str()])?;
                    let last_step = last_step(&tx, &row.run_id)?;
                    let consumed = last_step.as_ref().and_then(|s| s.inbox_consumed_seq);
                    let unread_inbox = inbox_after(&tx, &row.run_id, consumed)?;
                    answer.taken.push(Reclaimed {
                        row,
                        prior_phase,
                        prior_owner,
                        last_step,
                        unread_inbox,
                    });
                }
            }
        }
        tx.commit()?;
        Ok(answer)
    }

    fn kill(&mut self, run_id: &RunId, now_ms: i64) -> Result<KillAnswer> {
        let tx = self.immediate()?;
        tx.prepare_cached("INSERT OR IGNORE INTO deletion_fences (run_id, at) VALUES (?1, ?2)")?
            .execute(params![run_id, now_ms])?;
        let row = get_row(&tx, run_id)?;
        if row.is_some() {
            tx.prepare_cached("UPDATE live_runs SET stop = 'hard' WHERE run_id = ?1")?
                .execute([run_id])?;
        }
        let had_record = has_record(&tx, run_id)?;
        tx.commit()?;
        Ok(KillAnswer {
            owner_lease_live: row
                .as_ref()
                .is_some_and(|r| !decisions::lease_expired(r.lease_until, now_ms)),
            live_owner: row.map(|r| r.owner_gen),
            had_record,
        })
    }

    fn purge(&mut self, run_id: &RunId) -> Result<bool> {
        let tx = self.immediate()?;
        if !is_killed(&tx, run_id)? {
            return Ok(false);
        }
        let mut n = delete_live(&tx, run_id)?;
        n += purge_in(&tx, run_id)?;
        tx.commit()?;
        Ok(n > 0)
    }

    fn is_killed(&mut self, run_id: &RunId) -> Result<bool> {
        let tx = self.read()?;
        is_killed(&tx, run_id)
    }

    fn list_live(&mut self) -> Result<Vec<LiveRow>> {
        let tx = self.read()?;
        let rows = tx
            .prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM live_runs ORDER BY run_id"
            ))?
            .query_map([], live_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    }

    fn get_live(&mut self, run_id: &RunId) -> Result<Option<LiveRow>> {
        let tx = self.read()?;
        get_row(&tx, run_id)
    }

    fn live_events(
        &mut self,
        run_id: &RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<Value>>> {
        let tx = self.read()?;
        if !is_live(&tx, run_id)? {
            return Ok(None);
        }
        live_events_in(&tx, run_id, after_seq, limit).map(Some)
    }

    fn killed_among(&mut self, run_ids: &[RunId]) -> Result<Vec<RunId>> {
        let tx = self.read()?;
        let mut out: Vec<RunId> = Vec::new();
        // One primary-key probe per id, the ids one JSON array: a single statement text, prepared once
        // (one per chunk length would be parsed at every call, or evict the hot statements if cached).
        let mut stmt = tx.prepare_cached(
            "SELECT run_id FROM deletion_fences WHERE run_id IN (SELECT value FROM json_each(?1))",
        )?;
        for chunk in run_ids.chunks(KILLED_AMONG_CHUNK) {
            let ids = serde_json::to_string(chunk).map_err(|e| Error::corrupt("run ids", e))?;
            let rows = stmt.query_map([ids], |r| r.get::<_, RunId>(0))?;
            for id in rows {
                out.push(id?);
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn prune(
        &mut self,
        now_ms: i64,
        receipt_ttl_ms: i64,
        keep_gens: &[String],
    ) -> Result<PruneReport> {
        let tx = self.immediate()?;
        // Receipts of runs that ended without a stamp (abandon, purge, older builds) start their TTL now.
        tx.prepare_cached(
            "UPDATE admit_receipts SET ended_at = ?1
             WHERE ended_at IS NULL AND NOT EXISTS (SELECT 1 FROM live_runs l WHERE l.run_id = admit_receipts.run_id)",
        )?
        .execute([now_ms])?;
        // `decisions::receipt_expired`, compiled: ended_at <= receipt_cutoff.
        let receipts = tx
            .prepare_cached(
                "DELETE FROM admit_receipts WHERE ended_at IS NOT NULL AND ended_at <= ?1",
            )?
            .execute([decisions::receipt_cutoff(now_ms, receipt_ttl_ms)])?;
        // `decisions::generation_prunable`, with the facts read per generation.
        let candidates: Vec<(String, i64, bool)> = tx
            .prepare_cached(
                "SELECT g.gen, g.started_at,
                        EXISTS (SELECT 1 FROM live_runs l WHERE l.owner_gen = g.gen)
                        OR EXISTS (SELECT 1 FROM plan_requests p WHERE p.generation = g.gen AND p.state = 'pending')
                 FROM generations g WHERE g.started_at < ?1",
            )?
            .query_map([decisions::generation_cutoff(now_ms)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut generations = 0;
        for (gen, started_at, owns_rows) in candidates {
            if decisions::generation_prunable(
                started_at,
                keep_gens.contains(&gen),
                owns_rows,
                now_ms,
            ) {
                generations += tx
                    .prepare_cached("DELETE FROM generations WHERE gen = ?1")?
                    .execute([&gen])?;
            }
        }
        // Rows a finish of an older build left behind: only a live run has transcript, steps or inbox.
        let leftovers: Vec<String> = tx
            .prepare_cached(
                "SELECT run_id FROM (
                    SELECT DISTINCT run_id FROM transcript
                    UNION SELECT DISTINCT run_id FROM run_steps
                    UNION SELECT DISTINCT run_id FROM run_inbox
                 ) WHERE run_id NOT IN (SELECT run_id FROM live_runs) LIMIT ?1",
            )?
            .query_map([PRUNE_LEFTOVER_RUNS as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        for run_id in &leftovers {
            delete_live(&tx, run_id)?;
        }
        // `decisions::deletion_fence_prunable`, with the facts read per fence: the query reads only fences
        // old enough whose run is purged (after the leftovers went, so a run they held goes in this pass).
        let fences: Vec<(String, i64)> = tx
            .prepare_cached(&format!(
                "SELECT f.run_id, f.at FROM deletion_fences f WHERE f.at <= ?1 AND {PURGED} ORDER BY f.at, f.run_id LIMIT ?2"
            ))?
            .query_map(params![decisions::receipt_cutoff(now_ms, receipt_ttl_ms), PRUNE_BATCH as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut deletion_fences = 0;
        for (run_id, at) in fences {
            if decisions::deletion_fence_prunable(at, true, now_ms, receipt_ttl_ms) {
                deletion_fences += tx
                    .prepare_cached("DELETE FROM deletion_fences WHERE run_id = ?1")?
                    .execute([&run_id])?;
            }
        }
        let plan_requests =
            super::plan::prune_requests_in(&tx, now_ms, receipt_ttl_ms, PRUNE_BATCH)?;
        tx.commit()?;
        Ok(PruneReport {
            receipts: receipts as u64,
            generations: generations as u64,
            leftover_runs: leftovers.len() as u64,
            deletion_fences: deletion_fences as u64,
            plan_requests,
        })
    }

    fn table_rows(&mut self) -> Result<TableRows> {
        let tx = self.read()?;
        Ok(TableRows {
            runs: count(&tx, "runs")?,
            run_events: count(&tx, "run_events")?,
            live_runs: count(&tx, "live_runs")?,
            run_steps: count(&tx, "run_steps")?,
            transcript: count(&tx, "transcript")?,
            run_inbox: count(&tx, "run_inbox")?,
            admit_receipts: count(&tx, "admit_receipts")?,
            deletion_fences: count(&tx, "deletion_fences")?,
            generations: count(&tx, "generations")?,
        })
    }
}
