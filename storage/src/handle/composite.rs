//! The storage handle's composite transactions: several backend methods that commit as one (a finish
//! with its successor, the successor's admission, a durable step).

use crate::actor::{atomic, Backend};
use crate::ledger::{AdmitOutcome, Outcome, StepWrite, Successor, SuccessorFacts, SuccessorPlan};
use crate::record::{RunRecord, RunStatus};
use crate::store::{PolicyProposal, PutOutcome};
use crate::{Error, Result};

/// One transaction: the ledger's `finish` of `record` and, when the run left unread follow-ups past what
/// it consumed, the admission of their successor run with its first events (SPEC §5.2 step 8).
///
/// The unread follow-ups are read before the ledger's `finish`, which deletes every inbox row of the run;
/// the successor carries them in its own request, so nothing of the finished run's inbox is needed
/// after this transaction, and nothing of it stays behind.
pub fn finish_in(
    b: &mut dyn Backend,
    gen: &str,
    record: &RunRecord,
    proposal: Option<&PolicyProposal>,
    successor: Option<&Successor>,
    now_ms: i64,
) -> Result<Outcome<PutOutcome>> {
    atomic(
        b,
        |b| {
            let plan = match successor {
                Some(succ) => b
                    .successor_facts(&record.head.id)?
                    .and_then(|facts| successor_plan(facts, gen, succ, now_ms)),
                None => None,
            };
            Ok(finish_body(b, gen, record, proposal, plan, now_ms)?.map(|(put, _)| put))
        },
        |out| out.is_ok(),
    )
}

/// The end of a run with no reply to deliver, in one transaction (SPEC §5.2 step 3: finishing and finish
/// merge when no webhook is configured): the finishing gate of `status` (the answer is the record's),
/// the last `step` when its write was held back, then the finish of `record` with its successor.
/// Nothing lands when any part refuses (the refusal answers). Answers whether a successor was admitted.
#[allow(clippy::too_many_arguments)]
pub(super) fn seal_in(
    b: &mut dyn Backend,
    gen: &str,
    step: Option<&StepWrite>,
    status: RunStatus,
    record: &RunRecord,
    proposal: Option<&PolicyProposal>,
    successor: Option<&Successor>,
    now_ms: i64,
) -> Result<Outcome<bool>> {
    atomic(
        b,
        |b| {
            // The gate first: it is what refuses (a stop recorded before it, a fence), so a refusal
            // leaves nothing written even where a transaction cannot roll back (the memory backend).
            // Only its checks: what `finishing` writes (the final status and answer, the phase) would
            // go with the row the finish deletes below, in this transaction. It reads the successor's
            // facts too, which the step then written is laid over.
            let mut facts = match b.seal_gate(gen, status, record, proposal, now_ms)? {
                Ok(facts) => facts,
                Err(refusal) => return Ok(Err(refusal)),
            };
            if let Some(step) = step {
                if let Err(refusal) = b.write_step(&record.head.id, gen, step)? {
                    return Ok(Err(refusal));
                }
                facts.stepped(&step.record);
            }
            let plan = successor.and_then(|succ| successor_plan(facts, gen, succ, now_ms));
            Ok(finish_body(b, gen, record, proposal, plan, now_ms)?.map(|(_, admitted)| admitted))
        },
        |out| out.is_ok(),
    )
}

/// The successor `facts` call for (none when nothing waits).
fn successor_plan(
    facts: SuccessorFacts,
    gen: &str,
    succ: &Successor,
    now_ms: i64,
) -> Option<SuccessorPlan> {
    let stepped = facts.last_step.and_then(|s| s.inbox_consumed_seq);
    let consumed = stepped.max(succ.inbox_consumed);
    let waiting = crate::ledger::waiting(facts.inbox, consumed);
    crate::ledger::successor_admission(&facts.row, gen, &waiting, succ, now_ms)
}

/// [`finish_in`]'s body, inside a transaction the caller holds, admitting the successor of `plan`: the
/// put's outcome and whether a successor was admitted.
fn finish_body(
    b: &mut dyn Backend,
    gen: &str,
    record: &RunRecord,
    proposal: Option<&PolicyProposal>,
    plan: Option<SuccessorPlan>,
    now_ms: i64,
) -> Result<Outcome<(PutOutcome, bool)>> {
    let put = match b.finish(&record.head.id, gen, record, proposal, now_ms)? {
        Ok(put) => put,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let admitted = plan.is_some();
    if let Some(plan) = plan {
        admit_successor(b, gen, &plan, now_ms)?;
    }
    Ok(Ok((put, admitted)))
}

/// Inside a transaction that just freed the thread: admit the successor, append its first events and
/// carry the messages waiting behind it onto its inbox, in order. Anything refused is an error, so the
/// caller's transaction rolls back whole and nothing waiting is lost.
pub(super) fn admit_successor(
    b: &mut dyn Backend,
    gen: &str,
    plan: &crate::ledger::SuccessorPlan,
    now_ms: i64,
) -> Result<()> {
    let id = &plan.admit.run_id;
    match b.admit(&plan.admit, now_ms)? {
        AdmitOutcome::Started { .. } => {}
        other => {
            return Err(Error::Unavailable(format!(
                "successor not admitted: {other:?}"
            )))
        }
    }
    b.append(id, gen, &plan.events)?
        .map_err(|r| Error::Unavailable(format!("successor events refused: {r}")))?;
    for message in &plan.carried {
        b.push_inbox(id, message)?
            .map_err(|r| Error::Unavailable(format!("successor inbox refused: {r}")))?;
    }
    Ok(())
}
