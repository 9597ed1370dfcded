//! The ledger's decisions that create or take a live row on PostgreSQL: admission (`admit_in`: receipt,
//! steer, queue, interrupt or reserve), promotion (`claim_in`) and a reclaim pass (`reclaim_in`). Each
//! reads the rows it decides on and writes the decision, inside the caller's `SERIALIZABLE`
//! transaction. Mirrors `sqlite/ledger.rs`.

use crate::RunId;
use serde_json::Value;

use super::facts::{admission_facts, PutFacts};
use super::ledger::{inbox_after, last_step, push_inbox_in, queued_count};
use super::live::{live_rows, row_and_fence, By, ROW_COLUMNS};
use super::records::{put_decided, put_in};
use super::{params, Db};
use crate::ledger::decisions::{self, CapCount, ClaimDecision, Phase, ReclaimSelection, StopMode};
use crate::ledger::{
    decode_receipt_answer, merge_state, Admit, AdmitOutcome, Claimed, LiveRow, Outcome, Promotion,
    ReclaimAnswer, Reclaimed, Refusal,
};
use crate::record::RunRecord;
use crate::store::PolicyProposal;
use crate::{Error, Result};

pub(super) fn admit_in(c: &mut Db, a: &Admit, now_ms: i64) -> Result<AdmitOutcome> {
    if let Some(answer) = keyed_answer(c, a)? {
        return Ok(answer);
    }
    let (holder, killed) = row_and_fence(c, By::Thread, &a.thread_key, &a.run_id)?;
    admit_decided(c, a, now_ms, holder, killed)
}

/// [`admit_in`], then — when it started `a.run_id` — the put of its `tombstone` with `proposal`, whose
/// facts come with the thread's row (one round trip fewer): read before the admission inserted the row,
/// they are the put's but for `live`, which this transaction made true.
pub(super) fn admit_recorded_in(
    c: &mut Db,
    a: &Admit,
    tombstone: &RunRecord,
    proposal: Option<&PolicyProposal>,
    now_ms: i64,
) -> Result<AdmitOutcome> {
    let (out, ahead) = match keyed_answer(c, a)? {
        Some(answer) => (answer, None),
        None => {
            let guess = PutFacts::guess(proposal, now_ms);
            let (holder, put) = admission_facts(c, &a.thread_key, &a.run_id, guess)?;
            (admit_decided(c, a, now_ms, holder, put.killed)?, Some(put))
        }
    };
    if out.started(&a.run_id) {
        match ahead.filter(|_| tombstone.head.id == a.run_id) {
            Some(facts) => put_decided(c, tombstone, proposal, now_ms, facts.started())?,
            None => put_in(c, tombstone, proposal, now_ms)?,
        };
    }
    Ok(out)
}

/// The stored answer of a keyed admission already made (or the conflict of its key), if any.
fn keyed_answer(c: &mut Db, a: &Admit) -> Result<Option<AdmitOutcome>> {
    let Some(k) = &a.key else {
        return Ok(None);
    };
    let hit = c.query_opt(
        "SELECT body_hash, run_id, answer_json FROM admit_receipts WHERE scope = $1 AND key = $2",
        &[&k.scope, &k.key],
    )?;
    let Some(hit) = hit else {
        return Ok(None);
    };
    let (hash, run_id, answer): (String, String, String) = (hit.get(0), hit.get(1), hit.get(2));
    if hash != k.body_hash {
        return Ok(Some(AdmitOutcome::KeyConflict));
    }
    decode_receipt_answer(&k.scope, &run_id, &answer).map(Some)
}

/// An admission's decision on the thread's live row `holder` (and whether the admitted id is `killed`),
/// and its writes.
fn admit_decided(
    c: &mut Db,
    a: &Admit,
    now_ms: i64,
    holder: Option<LiveRow>,
    killed: bool,
) -> Result<AdmitOutcome> {
    if killed {
        return Ok(AdmitOutcome::Fenced);
    }
    let decision = decisions::decide_admit(
        holder.as_ref().map(LiveRow::view).as_ref(),
        a.key.is_some(),
        a.reaches(holder.as_ref()),
        a.strategy,
    );
    if let Some(refused) = decision.refused_by_cap(a.key.is_some(), |what, run_id| match what {
        CapCount::Receipts => Ok::<_, Error>(
            c.query_one(
                "SELECT COUNT(*) FROM admit_receipts WHERE run_id = $1",
                &[&run_id],
            )?
            .get::<_, i64>(0) as u64,
        ),
        CapCount::Queued => queued_count(c, run_id),
    })? {
        return Ok(refused);
    }
    let outcome = match decision {
        decisions::AdmitDecision::Insert => {
            c.execute_later(
                "INSERT INTO live_runs (run_id, thread_key, owner_gen, lease_until, started_at, phase, meta_json)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                params![
                    a.run_id.clone(),
                    a.thread_key.clone(),
                    a.gen.clone(),
                    now_ms + a.lease_ms,
                    now_ms,
                    decisions::INSERT_PHASE.as_str(),
                    a.meta.to_string(),
                ],
            )?;
            // The row is `gen`'s from here on in this transaction (its first events follow).
            c.owner_passed(&a.run_id, &a.gen);
            AdmitOutcome::Started {
                run_id: a.run_id.clone(),
            }
        }
        decisions::AdmitDecision::Steer { run_id } => {
            let seq = push_inbox_in(c, &run_id, &a.request)?;
            AdmitOutcome::Steered { run_id, seq }
        }
        decisions::AdmitDecision::Queue { run_id } => {
            push_inbox_in(c, &run_id, &a.request)?;
            let position = queued_count(c, &run_id)?;
            AdmitOutcome::Queued { run_id, position }
        }
        decisions::AdmitDecision::Interrupt { run_id } => {
            push_inbox_in(c, &run_id, &a.request)?;
            let stop =
                decisions::strongest_stop(holder.as_ref().and_then(|h| h.stop), StopMode::Soft);
            c.execute(
                "UPDATE live_runs SET stop = $2 WHERE run_id = $1",
                &[&run_id, &stop.as_str()],
            )?;
            let position = queued_count(c, &run_id)?;
            AdmitOutcome::Interrupting { run_id, position }
        }
        decisions::AdmitDecision::Reject { run_id } => AdmitOutcome::Rejected { run_id },
        decisions::AdmitDecision::Busy { run_id } => AdmitOutcome::Busy { run_id },
        decisions::AdmitDecision::Forbidden => AdmitOutcome::Forbidden,
    };
    if let (Some(k), true) = (&a.key, outcome.kept_in_receipt()) {
        let (run_id, seq) = outcome.receipt_target();
        let seq = seq.map(|s| s as i64);
        let answer =
            serde_json::to_string(&outcome).map_err(|e| Error::corrupt("admit outcome", e))?;
        c.execute(
            "INSERT INTO admit_receipts (scope, key, body_hash, run_id, outcome, seq, answer_json)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &k.scope,
                &k.key,
                &k.body_hash,
                &run_id,
                &outcome.kind(),
                &seq,
                &answer,
            ],
        )?;
    }
    Ok(outcome)
}

/// The promotion's write, `state` the row's state with the promotion's merged in; it waits for the next
/// answered statement (the seed step's, or the `COMMIT`).
pub(super) fn promote_in(
    c: &mut Db,
    run_id: &RunId,
    gen: &str,
    p: &Promotion,
    state: serde_json::Map<String, Value>,
    now_ms: i64,
) -> Result<Outcome<Claimed>> {
    c.execute_later(
        "UPDATE live_runs SET phase = $2, system_text = $3, tools_json = $4, state_json = $5, lease_until = $6
         WHERE run_id = $1 AND owner_gen = $7",
        params![
            run_id.to_owned(),
            Phase::Live.as_str(),
            p.system_text.clone(),
            p.tools.to_string(),
            Value::Object(state).to_string(),
            now_ms + p.lease_ms,
            gen.to_owned(),
        ],
    )?;
    // Promoted: the seed step that follows in this transaction is the owner's.
    c.owner_passed(run_id, gen);
    Ok(Ok(Claimed::Promoted))
}

pub(super) fn claim_in(
    c: &mut Db,
    run_id: &RunId,
    gen: &str,
    p: &Promotion,
    now_ms: i64,
) -> Result<Outcome<Claimed>> {
    let (by_run, killed) = row_and_fence(c, By::Run, run_id, run_id)?;
    if killed {
        return Ok(Err(Refusal::Fenced {
            run_id: run_id.to_owned(),
        }));
    }
    // `thread_key` is UNIQUE: the row holding the run's thread is the run's own row.
    let by_thread = by_run.clone();
    let decision = decisions::decide_claim(
        by_thread.as_ref().map(LiveRow::view).as_ref(),
        by_run.as_ref().map(LiveRow::view).as_ref(),
        run_id,
        gen,
    );
    Ok(match decision {
        ClaimDecision::Promote => {
            let mut row = by_run.expect("promote needs the run's row");
            merge_state(&mut row.state, &p.state);
            promote_in(c, run_id, gen, p, row.state, now_ms)?
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
    })
}

pub(super) fn reclaim_in(
    c: &mut Db,
    gen: &str,
    now_ms: i64,
    lease_ms: i64,
    dead_gens: &[String],
    driven: &[RunId],
) -> Result<ReclaimAnswer> {
    let rows = live_rows(c.query(
        &format!("SELECT {ROW_COLUMNS} FROM live_runs ORDER BY run_id"),
        &[],
    )?)?;
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
                c.execute(
                    "UPDATE live_runs SET owner_gen = $2, lease_until = $3, phase = $4 WHERE run_id = $1",
                    &[&row.run_id, &gen, &row.lease_until, &row.phase.as_str()],
                )?;
                let last_step = last_step(c, &row.run_id)?;
                let consumed = last_step.as_ref().and_then(|s| s.inbox_consumed_seq);
                let unread_inbox = inbox_after(c, &row.run_id, consumed)?;
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
    Ok(answer)
}
