//! SQL for the plan tables (SPEC §9): the [`PlanStore`] implementation on PostgreSQL, mirroring
//! `sqlite/plan.rs` method by method.
//!
//! Every writing method is one `SERIALIZABLE` transaction that reads the rows it decides on, asks
//! [`decisions`] what to do, and writes the answer: two hosts cannot both win a request (the loser runs
//! again and is refused by value on the winner's row), and two cannot both hold one plan.

use postgres::Row;

use super::Db;

use super::PgStore;
use crate::plan::decisions::{self, Invalidation};
use crate::plan::{
    Card, Consumed, Import, Imported, Orphan, Plan, PlanBinding, PlanId, PlanOutcome, PlanRequest,
    PlanStore, RequestHolder, RequestId, RequestState, Revision, Settlement, SnapshotId,
    TerminalReason,
};
use crate::{Error, Generation, Result};

const REQUEST_COLUMNS: &str =
    "request_id, plan_id, revision, snapshot_id, state, reason, diagnostic, cards_json, \
     created_at, settled_at, generation, lease_until";

fn revision_of(n: i64, what: &'static str) -> Result<Revision> {
    u64::try_from(n)
        .ok()
        .filter(|n| *n >= 1)
        .map(Revision::new)
        .ok_or_else(|| Error::corrupt(what, n))
}

/// Decode one `plan_requests` row selected with [`REQUEST_COLUMNS`]; a bad value is [`Error::Corrupt`].
fn decode(row: &Row) -> Result<PlanRequest> {
    let request_id: String = row.try_get(0)?;
    let plan_id: String = row.try_get(1)?;
    let snapshot_id: String = row.try_get(3)?;
    let state: String = row.try_get(4)?;
    let reason = match row.try_get::<_, Option<String>>(5)? {
        None => None,
        Some(r) => Some(
            TerminalReason::parse(&r).ok_or_else(|| Error::corrupt("plan_requests.reason", &r))?,
        ),
    };
    let holder = match row.try_get::<_, Option<String>>(10)? {
        None => None,
        Some(g) => Some(RequestHolder {
            generation: Generation::parse(&g)
                .ok_or_else(|| Error::corrupt("plan_requests.generation", &g))?,
            lease_until: row.try_get(11)?,
        }),
    };
    let cards = match row.try_get::<_, Option<String>>(7)? {
        None => None,
        Some(j) => Some(
            serde_json::from_str::<Vec<Card>>(&j)
                .map_err(|e| Error::corrupt("plan_requests.cards_json", e))?,
        ),
    };
    Ok(PlanRequest {
        request_id: RequestId::parse(&request_id)
            .ok_or_else(|| Error::corrupt("plan_requests.request_id", &request_id))?,
        plan_id: PlanId::parse(&plan_id)
            .ok_or_else(|| Error::corrupt("plan_requests.plan_id", &plan_id))?,
        revision: revision_of(row.try_get(2)?, "plan_requests.revision")?,
        snapshot_id: SnapshotId::parse(&snapshot_id)
            .ok_or_else(|| Error::corrupt("plan_requests.snapshot_id", &snapshot_id))?,
        state: RequestState::parse(&state)
            .ok_or_else(|| Error::corrupt("plan_requests.state", &state))?,
        reason,
        diagnostic: row.try_get(6)?,
        cards,
        created_at: row.try_get(8)?,
        settled_at: row.try_get(9)?,
        holder,
    })
}

fn decode_all(rows: Vec<Row>) -> Result<Vec<PlanRequest>> {
    rows.iter().map(decode).collect()
}

fn get_plan(c: &mut Db, plan_id: &PlanId) -> Result<Option<Plan>> {
    let Some(row) = c.query_opt(
        "SELECT revision, snapshot_id FROM plans WHERE plan_id = $1",
        &[&plan_id.as_str()],
    )?
    else {
        return Ok(None);
    };
    let snapshot: String = row.get(1);
    Ok(Some(Plan {
        id: plan_id.clone(),
        revision: revision_of(row.get(0), "plans.revision")?,
        snapshot_id: SnapshotId::parse(&snapshot)
            .ok_or_else(|| Error::corrupt("plans.snapshot_id", &snapshot))?,
    }))
}

fn revision_param(r: Revision) -> Result<i64> {
    i64::try_from(r.get()).map_err(|_| super::too_big("plans.revision", r.get()))
}

/// The ledger's prune of `plan_requests` (inside its transaction): delete at most `limit` requests
/// [`decisions::request_prunable`] lets go at `now_ms` — terminal, settled at least `ttl_ms` ago —
/// oldest settled first; answers how many went. `plans` rows are never pruned (see [`decisions`]).
pub(super) fn prune_requests_in(c: &mut Db, now_ms: i64, ttl_ms: i64, limit: usize) -> Result<u64> {
    let states: Vec<&str> = decisions::TERMINAL_STATES
        .iter()
        .map(|s| s.as_str())
        .collect();
    let cutoff = crate::ledger::decisions::receipt_cutoff(now_ms, ttl_ms);
    let candidates: Vec<(String, String, Option<i64>)> = c
        .query(
            "SELECT request_id, state, settled_at FROM plan_requests
             WHERE state = ANY($1) AND settled_at <= $2 ORDER BY settled_at, request_id LIMIT $3",
            &[&states, &cutoff, &super::big(limit)],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut pruned = 0;
    for (request_id, state, settled_at) in candidates {
        let state = RequestState::parse(&state)
            .ok_or_else(|| Error::corrupt("plan_requests.state", &state))?;
        if decisions::request_prunable(state, settled_at, now_ms, ttl_ms) {
            pruned += c.execute(
                "DELETE FROM plan_requests WHERE request_id = $1",
                &[&request_id],
            )?;
        }
    }
    Ok(pruned)
}

fn put_plan(c: &mut Db, plan: &Plan) -> Result<()> {
    c.execute(
        "INSERT INTO plans (plan_id, revision, snapshot_id) VALUES ($1, $2, $3)
         ON CONFLICT (plan_id) DO UPDATE SET revision = EXCLUDED.revision, snapshot_id = EXCLUDED.snapshot_id",
        &[&plan.id.as_str(), &revision_param(plan.revision)?, &plan.snapshot_id.as_str()],
    )?;
    Ok(())
}

fn get_request(c: &mut Db, request_id: &RequestId) -> Result<Option<PlanRequest>> {
    c.query_opt(
        &format!("SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE request_id = $1"),
        &[&request_id.as_str()],
    )?
    .as_ref()
    .map(decode)
    .transpose()
}

/// The plan's pending requests, oldest first.
fn pending_of_plan(c: &mut Db, plan_id: &PlanId) -> Result<Vec<PlanRequest>> {
    decode_all(c.query(
        &format!(
            "SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE plan_id = $1 AND state = 'pending' ORDER BY created_at, request_id"
        ),
        &[&plan_id.as_str()],
    )?)
}

fn cards_json(cards: &Option<Vec<Card>>) -> Result<Option<String>> {
    cards
        .as_ref()
        .map(|c| {
            serde_json::to_string(c).map_err(|e| Error::corrupt("plan_requests.cards_json", e))
        })
        .transpose()
}

fn insert_request(c: &mut Db, r: &PlanRequest) -> Result<()> {
    c.execute(
        &format!(
            "INSERT INTO plan_requests ({REQUEST_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ),
        &[
            &r.request_id.as_str(),
            &r.plan_id.as_str(),
            &revision_param(r.revision)?,
            &r.snapshot_id.as_str(),
            &r.state.as_str(),
            &r.reason.map(TerminalReason::as_str),
            &r.diagnostic,
            &cards_json(&r.cards)?,
            &r.created_at,
            &r.settled_at,
            &r.holder.as_ref().map(|h| h.generation.as_str()),
            &r.holder.as_ref().map_or(0, |h| h.lease_until),
        ],
    )?;
    Ok(())
}

/// Write a row's mutable columns (the binding, `created_at` and the holder's generation never change).
fn update_request(c: &mut Db, r: &PlanRequest) -> Result<()> {
    c.execute(
        "UPDATE plan_requests SET state = $2, reason = $3, diagnostic = $4, cards_json = $5, settled_at = $6,
         lease_until = $7 WHERE request_id = $1",
        &[
            &r.request_id.as_str(),
            &r.state.as_str(),
            &r.reason.map(TerminalReason::as_str),
            &r.diagnostic,
            &cards_json(&r.cards)?,
            &r.settled_at,
            &r.holder.as_ref().map_or(0, |h| h.lease_until),
        ],
    )?;
    Ok(())
}

/// Invalidate the plan's pending and ready requests (all but `except`) with `cause`; answers their ids.
fn invalidate_siblings(
    c: &mut Db,
    plan_id: &PlanId,
    except: Option<&RequestId>,
    cause: &Invalidation,
    now_ms: i64,
) -> Result<Vec<RequestId>> {
    let rows = decode_all(c.query(
        &format!(
            "SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE plan_id = $1 AND state IN ('pending', 'ready')
             ORDER BY created_at, request_id"
        ),
        &[&plan_id.as_str()],
    )?)?;
    let mut ids = Vec::new();
    for r in rows {
        if Some(&r.request_id) == except || !decisions::invalidated_by_move(r.state) {
            continue;
        }
        update_request(c, &decisions::invalidate(&r, cause, now_ms))?;
        ids.push(r.request_id);
    }
    Ok(ids)
}

impl PlanStore for PgStore {
    fn import(&mut self, import: &Import, now_ms: i64) -> Result<Imported> {
        self.write(|c| {
            let existing = get_plan(c, &import.plan_id)?;
            let step = decisions::import(existing.as_ref(), import);
            if existing.as_ref() != Some(&step.plan) {
                put_plan(c, &step.plan)?;
            }
            let invalidated = match &step.cause {
                Some(cause) => invalidate_siblings(c, &step.plan.id, None, cause, now_ms)?,
                None => Vec::new(),
            };
            Ok(Imported {
                plan: step.plan,
                created: step.created,
                invalidated,
            })
        })
    }

    fn plan(&mut self, plan_id: &PlanId) -> Result<Option<Plan>> {
        self.read(|c| get_plan(c, plan_id))
    }

    fn allocate_request(
        &mut self,
        identity: &PlanBinding,
        holder: &Generation,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.write(|c| {
            let plan = get_plan(c, &identity.plan_id)?;
            let pending = pending_of_plan(c, &identity.plan_id)?;
            if let Err(refusal) = decisions::admit(plan.as_ref(), identity, &pending, holder) {
                return Ok(Err(refusal));
            }
            let row =
                decisions::new_request(RequestId::generate(), identity, holder, lease_ms, now_ms);
            insert_request(c, &row)?;
            Ok(Ok(row))
        })
    }

    fn renew_requests(
        &mut self,
        holder: &Generation,
        request_ids: &[RequestId],
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<usize> {
        self.write(|c| {
            let mut renewed = 0;
            for id in request_ids {
                if let Some(row) =
                    get_request(c, id)?.and_then(|r| decisions::renew(&r, holder, lease_ms, now_ms))
                {
                    update_request(c, &row)?;
                    renewed += 1;
                }
            }
            Ok(renewed)
        })
    }

    fn orphaned_requests(&mut self, dead: &[Generation], now_ms: i64) -> Result<Vec<Orphan>> {
        self.read(|c| {
            let pending = decode_all(c.query(
                &format!("SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE state = 'pending' ORDER BY created_at, request_id"),
                &[],
            )?)?;
            Ok(pending
                .into_iter()
                .filter_map(|r| decisions::orphaned(&r, dead, now_ms).map(|cause| Orphan { request: r, cause }))
                .collect())
        })
    }

    fn complete_suggestions(
        &mut self,
        request_id: &RequestId,
        binding: &PlanBinding,
        cards: &[Card],
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.write(|c| {
            let request = get_request(c, request_id)?;
            let plan = get_plan(c, &binding.plan_id)?;
            if let Err(refusal) =
                decisions::complete(plan.as_ref(), request.as_ref(), request_id, binding, cards)
            {
                return Ok(Err(refusal));
            }
            let row = decisions::completed(
                &request.expect("complete passes only with a row"),
                cards,
                now_ms,
            );
            update_request(c, &row)?;
            Ok(Ok(row))
        })
    }

    fn settle_suggestion(
        &mut self,
        request_id: &RequestId,
        binding: &PlanBinding,
        settlement: &Settlement,
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.write(|c| {
            let request = get_request(c, request_id)?;
            if let Err(refusal) = decisions::settle(request.as_ref(), request_id, binding) {
                return Ok(Err(refusal));
            }
            let row = decisions::settled(
                &request.expect("settle passes only with a row"),
                settlement,
                now_ms,
            );
            update_request(c, &row)?;
            Ok(Ok(row))
        })
    }

    fn consume(&mut self, request_id: &RequestId, now_ms: i64) -> Result<PlanOutcome<Consumed>> {
        self.write(|c| {
            let request = get_request(c, request_id)?;
            let plan = match &request {
                Some(r) => get_plan(c, &r.plan_id)?,
                None => None,
            };
            let (next, cause) =
                match decisions::consume(plan.as_ref(), request.as_ref(), request_id) {
                    Ok(step) => step,
                    Err(refusal) => return Ok(Err(refusal)),
                };
            let row =
                decisions::consumed(&request.expect("consume passes only with a row"), now_ms);
            update_request(c, &row)?;
            let invalidated = invalidate_siblings(c, &next.id, Some(request_id), &cause, now_ms)?;
            put_plan(c, &next)?;
            Ok(Ok(Consumed {
                request: row,
                plan: next,
                invalidated,
            }))
        })
    }

    fn dismiss(&mut self, request_id: &RequestId, now_ms: i64) -> Result<PlanOutcome<PlanRequest>> {
        self.write(|c| {
            let request = get_request(c, request_id)?;
            let changed = match decisions::dismiss(request.as_ref(), request_id) {
                Ok(changed) => changed,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let request = request.expect("dismiss passes only with a row");
            if !changed {
                return Ok(Ok(request));
            }
            let row = decisions::dismissed(&request, now_ms);
            update_request(c, &row)?;
            Ok(Ok(row))
        })
    }

    fn get_request(&mut self, request_id: &RequestId) -> Result<Option<PlanRequest>> {
        self.read(|c| get_request(c, request_id))
    }
}
