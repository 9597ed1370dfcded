//! The ledger's prune on PostgreSQL (SPEC §4.3): the one transaction that keeps its tables bounded.

use super::ledger::delete_live;
use super::{big, Db};
use crate::ledger::decisions;
use crate::ledger::{PruneReport, FENCE_PURGED_SQL as PURGED, PRUNE_BATCH, PRUNE_LEFTOVER_RUNS};
use crate::Result;

pub(super) fn prune_in(
    c: &mut Db,
    now_ms: i64,
    receipt_ttl_ms: i64,
    keep_gens: &[String],
) -> Result<PruneReport> {
    // Receipts of runs that ended without a stamp (abandon, purge) start their TTL now.
    c.execute(
        "UPDATE admit_receipts SET ended_at = $1
         WHERE ended_at IS NULL AND NOT EXISTS (SELECT 1 FROM live_runs l WHERE l.run_id = admit_receipts.run_id)",
        &[&now_ms],
    )?;
    // `decisions::receipt_expired`, compiled: ended_at <= receipt_cutoff.
    let receipts = c.execute(
        "DELETE FROM admit_receipts WHERE ended_at IS NOT NULL AND ended_at <= $1",
        &[&decisions::receipt_cutoff(now_ms, receipt_ttl_ms)],
    )?;
    // `decisions::generation_prunable`, with the facts read per generation.
    let candidates: Vec<(String, i64, bool)> = c
        .query(
            "SELECT g.gen, g.started_at,
                    EXISTS (SELECT 1 FROM live_runs l WHERE l.owner_gen = g.gen)
                    OR EXISTS (SELECT 1 FROM plan_requests p WHERE p.generation = g.gen AND p.state = 'pending')
             FROM generations g WHERE g.started_at < $1",
            &[&decisions::generation_cutoff(now_ms)],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut generations = 0;
    for (gen, started_at, owns_rows) in candidates {
        if decisions::generation_prunable(started_at, keep_gens.contains(&gen), owns_rows, now_ms) {
            generations += c.execute("DELETE FROM generations WHERE gen = $1", &[&gen])?;
        }
    }
    // Rows a finish of an older build left behind: only a live run has transcript, steps or inbox.
    let leftovers: Vec<String> = c
        .query(
            "SELECT run_id FROM (
                SELECT run_id FROM transcript
                UNION SELECT run_id FROM run_steps
                UNION SELECT run_id FROM run_inbox
             ) AS owners WHERE run_id NOT IN (SELECT run_id FROM live_runs) LIMIT $1",
            &[&big(PRUNE_LEFTOVER_RUNS)],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for run_id in &leftovers {
        delete_live(c, run_id)?;
    }
    // `decisions::deletion_fence_prunable`, with the facts read per fence: the query reads only fences
    // old enough whose run is purged (after the leftovers went, so a run they held goes in this pass).
    let fences: Vec<(String, i64)> = c
        .query(
            &format!("SELECT f.run_id, f.at FROM deletion_fences f WHERE f.at <= $1 AND {PURGED} ORDER BY f.at, f.run_id LIMIT $2"),
            &[&decisions::receipt_cutoff(now_ms, receipt_ttl_ms), &big(PRUNE_BATCH)],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut deletion_fences = 0;
    for (run_id, at) in fences {
        if decisions::deletion_fence_prunable(at, true, now_ms, receipt_ttl_ms) {
            deletion_fences +=
                c.execute("DELETE FROM deletion_fences WHERE run_id = $1", &[&run_id])?;
        }
    }
    let plan_requests = super::plan::prune_requests_in(c, now_ms, receipt_ttl_ms, PRUNE_BATCH)?;
    Ok(PruneReport {
        receipts,
        generations,
        leftover_runs: leftovers.len() as u64,
        deletion_fences,
        plan_requests,
    })
}
