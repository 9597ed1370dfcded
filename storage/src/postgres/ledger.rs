//! SQL for the live-run ledger tables (SPEC §4.1): the [`RunLedger`] implementation on PostgreSQL,
//! mirroring `sqlite/ledger.rs` method by method.
//!
//! Every writing method is one `SERIALIZABLE` transaction ([`PgStore::write`]) that reads the rows it
//! decides on, asks [`decisions`] what to do, and writes the answer — two hosts cannot both win a row:
//! the loser's transaction fails with a serialization failure and runs again, deciding on the winner's
//! committed rows. A refusal is decided before any write, so committing it writes nothing.
//!
//! The ownership checks every owner write opens with are in `owner.rs`; admission, promotion and
//! reclaim — the decisions that create or take a row — in `admission.rs`.

use super::prune::prune_in;
use super::Db;
use crate::RunId;
use serde_json::{Map, Value};

use super::admission::{admit_in, admit_recorded_in, claim_in, promote_in, reclaim_in};
use super::facts::{seal_gate, successor_facts, PutFacts};
use super::live::{get_row, is_killed, live_rows, ROW_COLUMNS};
use super::news::notify;
use super::owner::{owned, owner, owner_only};
use super::records::{
    delete_events, has_record, insert_events, live_events_in, purge_in, put_decided, put_in,
};
use super::{params, too_big, PgStore};
use crate::ledger::decisions::{self, Phase, PhaseChange, StopMode};
use crate::ledger::{
    check_events, check_turns, merge_state, Admit, AdmitOutcome, Claimed, GenerationInfo,
    HandoffResult, HeartbeatAnswer, InboxItem, KillAnswer, LiveRow, Outcome, Promotion,
    PruneReport, ReclaimAnswer, Refusal, RunLedger, StepRecord, StepWrite, StopAnswer,
    SuccessorFacts, TableRows, Transcript, Turn,
};
use crate::news::News;
use crate::record::{RunRecord, RunStatus};
use crate::store::{PolicyProposal, PutOutcome};
use crate::{Error, Result};

/// A durable step in one statement: its turns, its events and its record, each written only when `gen`
/// owns the run and no fence stands; `$tail` is what it answers.
macro_rules! write_step_sql {
    ($tail:literal) => {
        concat!(
            "WITH own AS (SELECT 1 FROM live_runs WHERE run_id = $1 AND owner_gen = $10
                AND NOT EXISTS (SELECT 1 FROM deletion_fences f WHERE f.run_id = $1)),
            t AS (INSERT INTO transcript (run_id, idx, part, json)
                SELECT $1, i, p, j FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::text[]) AS t(i, p, j)
                WHERE EXISTS (SELECT 1 FROM own)
                ON CONFLICT (run_id, idx, part) DO NOTHING),
            e AS (INSERT INTO run_events (run_id, seq, json)
                SELECT $1, s, j FROM UNNEST($5::BIGINT[], $6::text[]) AS t(s, j)
                WHERE EXISTS (SELECT 1 FROM own)
                ON CONFLICT (run_id, seq) DO UPDATE SET json = EXCLUDED.json),
            s AS (INSERT INTO run_steps (run_id, step, json)
                SELECT $1, $7::BIGINT, $8::text WHERE $9::BOOLEAN AND EXISTS (SELECT 1 FROM own)
                ON CONFLICT (run_id, step) DO UPDATE SET json = EXCLUDED.json) ",
            $tail
        )
    };
}

/// The step, answering whether `gen` owned the run (and so wrote it).
const WRITE_STEP: &str = write_step_sql!("SELECT EXISTS (SELECT 1 FROM own)");

/// The step, failing (division by zero, at run time: the count is a table's) when `gen` does not own
/// the run: for a group of messages, where its answer is not read — the failure spoils the group, and
/// the storage actor runs each message again alone, where [`WRITE_STEP`] answers the refusal.
const WRITE_STEP_OR_FAIL: &str = write_step_sql!("SELECT 1 / (SELECT COUNT(*) FROM own)::int");

fn write_state(c: &mut Db, run_id: &RunId, state: &Map<String, Value>) -> Result<()> {
    c.execute_later(
        "UPDATE live_runs SET state_json = $2 WHERE run_id = $1",
        params![run_id.to_owned(), Value::Object(state.clone()).to_string()],
    )
}

fn write_state_and_phase(
    c: &mut Db,
    run_id: &RunId,
    state: &Map<String, Value>,
    phase: Phase,
) -> Result<()> {
    c.execute_later(
        "UPDATE live_runs SET state_json = $2, phase = $3 WHERE run_id = $1",
        params![
            run_id.to_owned(),
            Value::Object(state.clone()).to_string(),
            phase.as_str(),
        ],
    )
}

pub(super) fn set_phase(c: &mut Db, run_id: &RunId, phase: Phase) -> Result<()> {
    c.execute_later(
        "UPDATE live_runs SET phase = $2 WHERE run_id = $1",
        params![run_id.to_owned(), phase.as_str()],
    )
}

/// Tell other hosts that `run_id`'s events now reach `last` (nothing when no event was written).
fn notify_appended(c: &mut Db, run_id: &RunId, last: Option<u64>) -> Result<()> {
    match last {
        Some(seq) => notify(
            c,
            &News::Appended {
                run_id: run_id.to_owned(),
                seq,
            },
        ),
        None => Ok(()),
    }
}

pub(super) fn push_inbox_in(c: &mut Db, run_id: &RunId, message: &Value) -> Result<u64> {
    let seq: i64 = c
        .query_one(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM run_inbox WHERE run_id = $1",
            &[&run_id],
        )?
        .get(0);
    c.execute(
        "INSERT INTO run_inbox (run_id, seq, json) VALUES ($1, $2, $3)",
        &[&run_id, &seq, &message.to_string()],
    )?;
    // Other hosts' runs skip their inbox reads until a note like this one says to read again.
    notify(
        c,
        &News::Inbox {
            run_id: run_id.to_owned(),
            seq: seq as u64,
        },
    )?;
    Ok(seq as u64)
}

/// How many messages wait queued in a run's inbox (SPEC §5.1 `position`).
pub(super) fn queued_count(c: &mut Db, run_id: &str) -> Result<u64> {
    Ok(inbox_after(c, run_id, None)?
        .iter()
        .filter(|i| i.queued())
        .count() as u64)
}

pub(super) fn inbox_after(c: &mut Db, run_id: &str, after: Option<u64>) -> Result<Vec<InboxItem>> {
    let Ok(after) = i64::try_from(after.unwrap_or(0)) else {
        return Ok(Vec::new());
    };
    c.query(
        "SELECT seq, json FROM run_inbox WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        &[&run_id, &after],
    )?
    .iter()
    .map(|r| inbox_item(r.get(0), r.try_get(1)))
    .collect()
}

/// Decode one `run_inbox` row.
pub(super) fn inbox_item(
    seq: i64,
    json: std::result::Result<String, postgres::Error>,
) -> Result<InboxItem> {
    let message = serde_json::from_str(&json?).map_err(|e| Error::corrupt("run_inbox.json", e))?;
    Ok(InboxItem {
        seq: seq as u64,
        message,
    })
}

pub(super) fn last_step(c: &mut Db, run_id: &RunId) -> Result<Option<StepRecord>> {
    let json: Option<String> = c
        .query_opt(
            "SELECT json FROM run_steps WHERE run_id = $1 ORDER BY step DESC LIMIT 1",
            &[&run_id],
        )?
        .map(|r| r.get(0));
    json.map(|j| serde_json::from_str(&j).map_err(|e| Error::corrupt("run_steps.json", e)))
        .transpose()
}

/// Delete a run's ledger rows — `live_runs`, `run_steps`, `transcript`, `run_inbox` — answering how many
/// went; its receipts and events stay.
pub(super) fn delete_live(c: &mut Db, run_id: &str) -> Result<u64> {
    let n: i64 = c.query_one(DELETE_LIVE, &[&run_id])?.get(0);
    Ok(n.max(0) as u64)
}

/// [`delete_live`] when nobody reads how many rows went: it goes out with the next statement.
fn delete_live_later(c: &mut Db, run_id: &RunId) -> Result<()> {
    c.execute_later(DELETE_LIVE, params![run_id.to_owned()])
}

/// The deletion of `$1`'s ledger rows from four tables, as the `WITH` of one statement (each table is
/// written once, so nothing of one depends on another; a data-modifying `WITH` runs whether or not the
/// statement reads it).
macro_rules! delete_live_with {
    ($then:literal) => {
        concat!(
            "WITH l AS (DELETE FROM live_runs WHERE run_id = $1 RETURNING 1),
                  s AS (DELETE FROM run_steps WHERE run_id = $1 RETURNING 1),
                  t AS (DELETE FROM transcript WHERE run_id = $1 RETURNING 1),
                  i AS (DELETE FROM run_inbox WHERE run_id = $1 RETURNING 1) ",
            $then
        )
    };
}

const DELETE_LIVE: &str = delete_live_with!(
    "SELECT (SELECT COUNT(*) FROM l) + (SELECT COUNT(*) FROM s)
          + (SELECT COUNT(*) FROM t) + (SELECT COUNT(*) FROM i)"
);

/// A finish's end of the live run, in one statement that goes out with the next: [`delete_live_later`],
/// and the end of `run_id` stamped on its receipts that carry none yet (their TTL runs from `now_ms`).
fn end_live_later(c: &mut Db, run_id: &RunId, now_ms: i64) -> Result<()> {
    c.execute_later(
        delete_live_with!(
            "UPDATE admit_receipts SET ended_at = $2 WHERE run_id = $1 AND ended_at IS NULL"
        ),
        params![run_id.to_owned(), now_ms],
    )
}

fn count(c: &mut Db, table: &str) -> Result<u64> {
    let n: i64 = c
        .query_one(&format!("SELECT COUNT(*) FROM {table}"), &[])?
        .get(0);
    Ok(n.max(0) as u64)
}

impl PgStore {
    /// [`Backend::admit_recorded`](crate::actor::Backend::admit_recorded): see `admit_recorded_in`.
    pub(crate) fn admit_recorded(
        &mut self,
        a: &Admit,
        tombstone: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<AdmitOutcome> {
        self.write(|c| admit_recorded_in(c, a, tombstone, proposal, now_ms))
    }
}

impl RunLedger for PgStore {
    fn record_generation(&mut self, info: &GenerationInfo) -> Result<()> {
        self.write(|c| {
            c.execute(
                "INSERT INTO generations (gen, host, host_id, pid, proc_start, started_at) VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (gen) DO UPDATE SET host = EXCLUDED.host, host_id = EXCLUDED.host_id, pid = EXCLUDED.pid,
                    proc_start = EXCLUDED.proc_start, started_at = EXCLUDED.started_at",
                &[&info.gen, &info.host, &info.host_id, &i64::from(info.pid), &info.proc_start, &info.started_at],
            )?;
            Ok(())
        })
    }

    fn generations(&mut self) -> Result<Vec<GenerationInfo>> {
        self.read_one(|c| {
            c.query("SELECT gen, host, host_id, pid, proc_start, started_at FROM generations ORDER BY started_at, gen", &[])?
                .iter()
                .map(|r| {
                    let pid: i64 = r.get(3);
                    Ok(GenerationInfo {
                        gen: r.get(0),
                        host: r.get(1),
                        host_id: r.get(2),
                        pid: u32::try_from(pid).map_err(|e| Error::corrupt("generations.pid", e))?,
                        proc_start: r.get(4),
                        started_at: r.get(5),
                    })
                })
                .collect()
        })
    }

    fn admit(&mut self, a: &Admit, now_ms: i64) -> Result<AdmitOutcome> {
        self.write(|c| admit_in(c, a, now_ms))
    }

    fn claim(
        &mut self,
        run_id: &RunId,
        gen: &str,
        p: &Promotion,
        now_ms: i64,
    ) -> Result<Outcome<Claimed>> {
        self.write(|c| claim_in(c, run_id, gen, p, now_ms))
    }

    fn claim_admitted(
        &mut self,
        run_id: &RunId,
        gen: &str,
        p: &Promotion,
        now_ms: i64,
    ) -> Result<Outcome<Claimed>> {
        self.write(|c| promote_in(c, run_id, gen, p, p.state.clone(), now_ms))
    }

    fn append(&mut self, run_id: &RunId, gen: &str, events: &[Value]) -> Result<Outcome<()>> {
        self.write(|c| {
            owner!(c, run_id, gen);
            let (rows, refused) = check_events(events);
            let last = rows.iter().map(|(seq, _, _)| *seq).max();
            insert_events(
                c,
                run_id,
                rows.into_iter().map(|(seq, _event, json)| (seq, json)),
            )?;
            notify_appended(c, run_id, last)?;
            Ok(refused.map_or(Ok(()), Err))
        })
    }

    fn step(&mut self, run_id: &RunId, gen: &str, record: &StepRecord) -> Result<Outcome<()>> {
        let step =
            i64::try_from(record.step).map_err(|_| too_big("run_steps.step", record.step))?;
        let json = serde_json::to_string(record).map_err(|e| Error::corrupt("step record", e))?;
        self.write(|c| {
            owner!(c, run_id, gen);
            c.execute(
                "INSERT INTO run_steps (run_id, step, json) VALUES ($1, $2, $3)
                 ON CONFLICT (run_id, step) DO UPDATE SET json = EXCLUDED.json",
                &[&run_id, &step, &json],
            )?;
            Ok(Ok(()))
        })
    }

    fn write_transcript(
        &mut self,
        run_id: &RunId,
        gen: &str,
        first_idx: u64,
        turns: &[Turn],
    ) -> Result<Outcome<()>> {
        self.write(|c| {
            owner!(c, run_id, gen);
            let rows = match check_turns(first_idx, turns) {
                Ok(rows) => rows,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let (mut idxs, mut parts, mut jsons) = (Vec::new(), Vec::new(), Vec::new());
            for (idx, part, json) in rows {
                idxs.push(i64::try_from(idx).map_err(|_| too_big("transcript.idx", idx))?);
                parts.push(i64::try_from(part).map_err(|_| too_big("transcript.part", part))?);
                jsons.push(json);
            }
            c.execute(
                "INSERT INTO transcript (run_id, idx, part, json)
                 SELECT $1, i, p, j FROM UNNEST($2::BIGINT[], $3::BIGINT[], $4::text[]) AS t(i, p, j)
                 ON CONFLICT (run_id, idx, part) DO NOTHING",
                &[&run_id, &idxs, &parts, &jsons],
            )?;
            Ok(Ok(()))
        })
    }

    /// One statement for the turns, the events and the step record (three tables; the state patch,
    /// rare, goes the default way): what the default's three methods write, with the same refusals.
    fn write_step(&mut self, run_id: &RunId, gen: &str, write: &StepWrite) -> Result<Outcome<()>> {
        if !write.state.is_empty() {
            return crate::ledger::write_step_by_methods(self, run_id, gen, write);
        }
        let step = i64::try_from(write.record.step)
            .map_err(|_| too_big("run_steps.step", write.record.step))?;
        let record =
            serde_json::to_string(&write.record).map_err(|e| Error::corrupt("step record", e))?;
        // A group of the storage actor's messages (not an atomic unit's, which reads its refusals).
        let batch = self.grouped && self.atomic.is_empty();
        self.write(|c| {
            let turns = match check_turns(write.first_idx, &write.turns) {
                Ok(rows) => rows,
                Err(refusal) => {
                    // The owner's refusal comes first, as in the default.
                    owner!(c, run_id, gen);
                    return Ok(Err(refusal));
                }
            };
            let (mut idxs, mut parts, mut turn_jsons) = (Vec::new(), Vec::new(), Vec::new());
            for (idx, part, json) in turns {
                idxs.push(i64::try_from(idx).map_err(|_| too_big("transcript.idx", idx))?);
                parts.push(i64::try_from(part).map_err(|_| too_big("transcript.part", part))?);
                turn_jsons.push(json);
            }
            // The events by seq, the last of a repeated seq winning (one statement updates a row once).
            let (events, refused) = check_events(&write.events);
            let mut by_seq = std::collections::BTreeMap::new();
            for (seq, _event, json) in events {
                by_seq.insert(
                    i64::try_from(seq).map_err(|_| too_big("run_events.seq", seq))?,
                    json,
                );
            }
            let last = by_seq.keys().next_back().map(|seq| *seq as u64);
            let (seqs, event_jsons): (Vec<i64>, Vec<String>) = by_seq.into_iter().unzip();
            // The owner check is part of the statement (`own`: the row is `gen`'s and no fence stands),
            // and every write is conditional on it; a refused event answers before the step record,
            // which is then not written. Its note rides with the `COMMIT` (a fenced write's is a stray
            // hint, which readers tolerate).
            notify_appended(c, run_id, last)?;
            let params = params![
                run_id.to_owned(),
                idxs,
                parts,
                turn_jsons,
                seqs,
                event_jsons,
                step,
                record.clone(),
                refused.is_none(),
                gen.to_owned(),
            ];
            if c.owner_known(run_id, gen) {
                // Checked in this transaction already (a seal's gate, an admission's promotion): the
                // answer is known, so the statement waits for the next round trip.
                c.execute_later(WRITE_STEP, params)?;
                // It changes no ownership: the check stands for what follows (a seal's finish).
                c.owner_passed(run_id, gen);
                return Ok(refused.map_or(Ok(()), Err));
            }
            if batch {
                // In a group of messages its answer waits too: a failed check fails the group's next
                // answered statement or its `COMMIT` (then each message runs again alone).
                c.execute_later(WRITE_STEP_OR_FAIL, params)?;
                c.owner_passed(run_id, gen);
                return Ok(refused.map_or(Ok(()), Err));
            }
            // Alone in its transaction, it carries the `COMMIT`: a fenced write wrote nothing.
            let owned: bool = c.query_one_committing(WRITE_STEP, &params.refs())?.get(0);
            if !owned {
                // Nothing was written: the refusal says why.
                owner!(c, run_id, gen);
                return Err(Error::Unavailable(format!(
                    "the owner check of {run_id} changed within one transaction"
                )));
            }
            c.owner_passed(run_id, gen);
            Ok(refused.map_or(Ok(()), Err))
        })
    }

    fn read_transcript(&mut self, run_id: &RunId) -> Result<Transcript> {
        self.read_one(|c| {
            let rows = c.query(
                "SELECT idx, part, json FROM transcript WHERE run_id = $1 ORDER BY idx, part",
                &[&run_id],
            )?;
            Transcript::assemble(rows.iter().map(|r| {
                (
                    r.get::<_, i64>(0) as u64,
                    r.get::<_, i64>(1) as u64,
                    r.get(2),
                )
            }))
        })
    }

    fn set_state(
        &mut self,
        run_id: &RunId,
        gen: &str,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<()>> {
        self.write(|c| {
            let mut row = owner!(row: c, run_id, gen);
            merge_state(&mut row.state, patch);
            write_state(c, run_id, &row.state)?;
            Ok(Ok(()))
        })
    }

    fn heartbeat(
        &mut self,
        run_id: &RunId,
        gen: &str,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<Outcome<HeartbeatAnswer>> {
        self.write(|c| {
            let row = owner!(row: c, run_id, gen);
            c.execute(
                "UPDATE live_runs SET lease_until = $2 WHERE run_id = $1",
                &[&run_id, &(now_ms + lease_ms)],
            )?;
            Ok(Ok(HeartbeatAnswer {
                stop: row.stop,
                phase: row.phase,
            }))
        })
    }

    fn request_stop(
        &mut self,
        run_id: &RunId,
        mode: StopMode,
        now_ms: i64,
    ) -> Result<Outcome<StopAnswer>> {
        self.write(|c| {
            let Some(row) = get_row(c, run_id)? else {
                return Ok(Err(Refusal::NotLive {
                    run_id: run_id.to_owned(),
                }));
            };
            let stop = decisions::strongest_stop(row.stop, mode);
            c.execute(
                "UPDATE live_runs SET stop = $2 WHERE run_id = $1",
                &[&run_id, &stop.as_str()],
            )?;
            notify(
                c,
                &News::Stop {
                    run_id: run_id.to_owned(),
                },
            )?;
            Ok(Ok(StopAnswer {
                stop,
                owner_lease_live: !decisions::lease_expired(row.lease_until, now_ms),
                owner_gen: row.owner_gen,
            }))
        })
    }

    fn set_phase(
        &mut self,
        run_id: &RunId,
        gen: &str,
        change: PhaseChange,
        patch: &Map<String, Value>,
    ) -> Result<Outcome<Phase>> {
        self.write(|c| {
            let mut row = owner!(row: c, run_id, gen);
            let next = match crate::ledger::change_phase(&mut row, change, patch) {
                Ok(next) => next,
                Err(refusal) => return Ok(Err(refusal)),
            };
            write_state_and_phase(c, run_id, &row.state, next)?;
            Ok(Ok(next))
        })
    }

    fn decide(
        &mut self,
        run_id: &RunId,
        call_id: &str,
        decided: &crate::ledger::Decided,
        now_ms: i64,
    ) -> Result<Outcome<crate::ledger::DecideAnswer>> {
        self.write(|c| {
            let Some(mut row) = get_row(c, run_id)? else {
                return Ok(Err(Refusal::NotLive {
                    run_id: run_id.to_owned(),
                }));
            };
            let answer = match crate::ledger::decide(&mut row, call_id, decided, now_ms) {
                Ok(answer) => answer,
                Err(refusal) => return Ok(Err(refusal)),
            };
            write_state(c, run_id, &row.state)?;
            Ok(Ok(answer))
        })
    }

    fn handoff(&mut self, gen: &str, run_ids: &[RunId]) -> Result<Vec<(RunId, HandoffResult)>> {
        self.write(|c| {
            let mut out = Vec::with_capacity(run_ids.len());
            for id in run_ids {
                let result = match get_row(c, id)? {
                    Some(row) if row.owner_gen == gen => {
                        match decisions::phase_transition(row.phase, PhaseChange::Handoff) {
                            Ok(next) => {
                                set_phase(c, id, next)?;
                                HandoffResult::HandedOff
                            }
                            Err(_) => HandoffResult::WrongPhase,
                        }
                    }
                    _ => HandoffResult::NotOwner,
                };
                out.push((id.clone(), result));
            }
            Ok(out)
        })
    }

    fn finishing(
        &mut self,
        run_id: &RunId,
        gen: &str,
        status: RunStatus,
        answer: Option<&str>,
    ) -> Result<Outcome<()>> {
        self.write(|c| {
            let mut row = owner!(row: c, run_id, gen);
            let next = match crate::ledger::gate(&row, status) {
                Ok(next) => next,
                Err(refusal) => return Ok(Err(refusal)),
            };
            merge_state(
                &mut row.state,
                &crate::ledger::finishing_patch(status, answer),
            );
            write_state_and_phase(c, run_id, &row.state, next)?;
            Ok(Ok(()))
        })
    }

    fn seal_gate(
        &mut self,
        gen: &str,
        status: RunStatus,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<Outcome<SuccessorFacts>> {
        self.write(|c| seal_gate(c, &record.head.id, gen, status, proposal, now_ms))
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
        self.write(|c| {
            owner!(c, run_id, gen);
            end_live_later(c, run_id, now_ms)?;
            notify(
                c,
                &News::Ended {
                    run_id: run_id.to_owned(),
                },
            )?;
            // With the live row gone, the put replaces the live events with the record's. A seal's
            // gate read the put's facts ahead, the row still there: it is gone now.
            let guess = PutFacts::guess(proposal, now_ms);
            let put = match c.take_ahead(run_id, guess) {
                Some(facts) => put_decided(c, record, proposal, now_ms, facts.ended()),
                None => put_in(c, record, proposal, now_ms),
            };
            Ok(Ok(put?))
        })
    }

    fn abandon(&mut self, run_id: &RunId, gen: &str) -> Result<Outcome<()>> {
        self.write(|c| {
            owner!(c, run_id, gen);
            delete_live_later(c, run_id)?;
            if !has_record(c, run_id)? {
                delete_events(c, run_id)?;
            }
            notify(
                c,
                &News::Ended {
                    run_id: run_id.to_owned(),
                },
            )?;
            Ok(Ok(()))
        })
    }

    fn push_inbox(&mut self, run_id: &RunId, message: &Value) -> Result<Outcome<u64>> {
        self.write(|c| {
            if get_row(c, run_id)?.is_none() {
                return Ok(Err(Refusal::NotLive {
                    run_id: run_id.to_owned(),
                }));
            }
            Ok(Ok(push_inbox_in(c, run_id, message)?))
        })
    }

    fn read_inbox(
        &mut self,
        run_id: &RunId,
        after_seq: Option<u64>,
    ) -> Result<Outcome<Vec<InboxItem>>> {
        let Ok(after) = i64::try_from(after_seq.unwrap_or(0)) else {
            return Ok(Ok(Vec::new()));
        };
        // One statement: no row at all is a run no longer live; one without an inbox row (a NULL
        // seq) a live run with nothing past `after`.
        let rows = self.read_one(|c| {
            c.query(
                "SELECT i.seq, i.json FROM live_runs l
                 LEFT JOIN run_inbox i ON i.run_id = l.run_id AND i.seq > $2
                 WHERE l.run_id = $1 ORDER BY i.seq",
                &[&run_id, &after],
            )
        })?;
        if rows.is_empty() {
            return Ok(Err(Refusal::NotLive {
                run_id: run_id.to_owned(),
            }));
        }
        rows.iter()
            .filter_map(|r| match r.try_get::<_, Option<i64>>(0) {
                Ok(None) => None,
                Ok(Some(seq)) => Some(inbox_item(seq, r.try_get(1))),
                Err(e) => Some(Err(e.into())),
            })
            .collect::<Result<_>>()
            .map(Ok)
    }

    fn inbox_after(&mut self, run_id: &RunId, after_seq: Option<u64>) -> Result<Vec<InboxItem>> {
        self.read_one(|c| inbox_after(c, run_id, after_seq))
    }

    fn last_step(&mut self, run_id: &RunId) -> Result<Option<StepRecord>> {
        self.read_one(|c| last_step(c, run_id))
    }

    fn successor_facts(&mut self, run_id: &RunId) -> Result<Option<SuccessorFacts>> {
        self.read_one(|c| successor_facts(c, run_id))
    }

    fn reclaim(
        &mut self,
        gen: &str,
        now_ms: i64,
        lease_ms: i64,
        dead_gens: &[String],
        driven: &[RunId],
    ) -> Result<ReclaimAnswer> {
        self.write(|c| reclaim_in(c, gen, now_ms, lease_ms, dead_gens, driven))
    }

    fn kill(&mut self, run_id: &RunId, now_ms: i64) -> Result<KillAnswer> {
        self.write(|c| {
            c.execute(
                "INSERT INTO deletion_fences (run_id, at) VALUES ($1, $2) ON CONFLICT (run_id) DO NOTHING",
                &[&run_id, &now_ms],
            )?;
            let row = get_row(c, run_id)?;
            if row.is_some() {
                c.execute("UPDATE live_runs SET stop = 'hard' WHERE run_id = $1", &[&run_id])?;
            }
            let had_record = has_record(c, run_id)?;
            notify(c, &News::Killed { run_id: run_id.to_owned() })?;
            Ok(KillAnswer {
                owner_lease_live: row.as_ref().is_some_and(|r| !decisions::lease_expired(r.lease_until, now_ms)),
                live_owner: row.map(|r| r.owner_gen),
                had_record,
            })
        })
    }

    fn purge(&mut self, run_id: &RunId) -> Result<bool> {
        self.write(|c| {
            if !is_killed(c, run_id)? {
                return Ok(false);
            }
            let n = delete_live(c, run_id)? + purge_in(c, run_id)?;
            Ok(n > 0)
        })
    }

    fn is_killed(&mut self, run_id: &RunId) -> Result<bool> {
        self.read_one(|c| is_killed(c, run_id))
    }

    fn list_live(&mut self) -> Result<Vec<LiveRow>> {
        self.read_one(|c| {
            live_rows(c.query(
                &format!("SELECT {ROW_COLUMNS} FROM live_runs ORDER BY run_id"),
                &[],
            )?)
        })
    }

    fn get_live(&mut self, run_id: &RunId) -> Result<Option<LiveRow>> {
        self.read_one(|c| get_row(c, run_id))
    }

    fn live_events(
        &mut self,
        run_id: &RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<Value>>> {
        self.read(|c| {
            if get_row(c, run_id)?.is_none() {
                return Ok(None);
            }
            live_events_in(c, run_id, after_seq, limit).map(Some)
        })
    }

    fn killed_among(&mut self, run_ids: &[RunId]) -> Result<Vec<RunId>> {
        // One statement over an array parameter, however many ids.
        self.read_one(|c| {
            let mut out: Vec<RunId> = c
                .query(
                    "SELECT run_id FROM deletion_fences WHERE run_id = ANY($1)",
                    &[&run_ids],
                )?
                .iter()
                .map(|r| r.get(0))
                .collect();
            out.sort_unstable();
            out.dedup();
            Ok(out)
        })
    }

    fn prune(
        &mut self,
        now_ms: i64,
        receipt_ttl_ms: i64,
        keep_gens: &[String],
    ) -> Result<PruneReport> {
        self.write(|c| prune_in(c, now_ms, receipt_ttl_ms, keep_gens))
    }

    fn table_rows(&mut self) -> Result<TableRows> {
        self.read(|c| {
            Ok(TableRows {
                runs: count(c, "runs")?,
                run_events: count(c, "run_events")?,
                live_runs: count(c, "live_runs")?,
                run_steps: count(c, "run_steps")?,
                transcript: count(c, "transcript")?,
                run_inbox: count(c, "run_inbox")?,
                admit_receipts: count(c, "admit_receipts")?,
                deletion_fences: count(c, "deletion_fences")?,
                generations: count(c, "generations")?,
            })
        })
    }
}
