//! SQL for the plan tables (SPEC §9): the [`PlanStore`] implementation.
//!
//! Every writing method is one `BEGIN IMMEDIATE` transaction that reads the rows it decides on, asks
//! [`decisions`] what to do, and writes the answer before committing — so two processes sharing the file
//! cannot both win a request: the second CAS reads the first one's committed row and is refused by value.
//! Allocation reads the plan's pending requests in the same transaction, so two processes cannot both
//! hold one plan. A request's holder is `generation` (NULL only for rows from before schema v4) and
//! `lease_until`.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::SqliteStore;
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

/// The raw columns of a `plan_requests` row; decoded outside rusqlite so a bad value is [`Error::Corrupt`].
struct RawRequest {
    request_id: String,
    plan_id: String,
    revision: i64,
    snapshot_id: String,
    state: String,
    reason: Option<String>,
    diagnostic: Option<String>,
    cards_json: Option<String>,
    created_at: i64,
    settled_at: Option<i64>,
    generation: Option<String>,
    lease_until: i64,
}

fn raw_request(row: &Row) -> rusqlite::Result<RawRequest> {
    Ok(RawRequest {
        request_id: row.get(0)?,
        plan_id: row.get(1)?,
        revision: row.get(2)?,
        snapshot_id: row.get(3)?,
        state: row.get(4)?,
        reason: row.get(5)?,
        diagnostic: row.get(6)?,
        cards_json: row.get(7)?,
        created_at: row.get(8)?,
        settled_at: row.get(9)?,
        generation: row.get(10)?,
        lease_until: row.get(11)?,
    })
}

fn revision_of(n: i64, what: &'static str) -> Result<Revision> {
    u64::try_from(n)
        .ok()
        .filter(|n| *n >= 1)
        .map(Revision::new)
        .ok_or_else(|| Error::corrupt(what, n))
}

impl RawRequest {
    fn decode(self) -> Result<PlanRequest> {
        let reason = match self.reason {
            None => None,
            Some(r) => Some(
                TerminalReason::parse(&r)
                    .ok_or_else(|| Error::corrupt("plan_requests.reason", &r))?,
            ),
        };
        let holder = match self.generation {
            None => None,
            Some(g) => Some(RequestHolder {
                generation: Generation::parse(&g)
                    .ok_or_else(|| Error::corrupt("plan_requests.generation", &g))?,
                lease_until: self.lease_until,
            }),
        };
        let cards = match self.cards_json {
            None => None,
            Some(j) => Some(
                serde_json::from_str::<Vec<Card>>(&j)
                    .map_err(|e| Error::corrupt("plan_requests.cards_json", e))?,
            ),
        };
        Ok(PlanRequest {
            request_id: RequestId::parse(&self.request_id)
                .ok_or_else(|| Error::corrupt("plan_requests.request_id", &self.request_id))?,
            plan_id: PlanId::parse(&self.plan_id)
                .ok_or_else(|| Error::corrupt("plan_requests.plan_id", &self.plan_id))?,
            revision: revision_of(self.revision, "plan_requests.revision")?,
            snapshot_id: SnapshotId::parse(&self.snapshot_id)
                .ok_or_else(|| Error::corrupt("plan_requests.snapshot_id", &self.snapshot_id))?,
            state: RequestState::parse(&self.state)
                .ok_or_else(|| Error::corrupt("plan_requests.state", &self.state))?,
            reason,
            diagnostic: self.diagnostic,
            cards,
            created_at: self.created_at,
            settled_at: self.settled_at,
            holder,
        })
    }
}

fn get_plan(tx: &Connection, plan_id: &PlanId) -> Result<Option<Plan>> {
    let raw: Option<(i64, String)> = tx
        .prepare_cached("SELECT revision, snapshot_id FROM plans WHERE plan_id = ?1")?
        .query_row([plan_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    raw.map(|(revision, snapshot)| {
        Ok(Plan {
            id: plan_id.clone(),
            revision: revision_of(revision, "plans.revision")?,
            snapshot_id: SnapshotId::parse(&snapshot)
                .ok_or_else(|| Error::corrupt("plans.snapshot_id", &snapshot))?,
        })
    })
    .transpose()
}

/// The ledger's prune of `plan_requests` (inside its transaction): delete at most `limit` requests
/// [`decisions::request_prunable`] lets go at `now_ms` — terminal, settled at least `ttl_ms` ago —
/// oldest settled first; answers how many went. `plans` rows are never pruned (see [`decisions`]).
pub(super) fn prune_requests_in(
    tx: &Connection,
    now_ms: i64,
    ttl_ms: i64,
    limit: usize,
) -> Result<u64> {
    let [a, b, c, d] = decisions::TERMINAL_STATES.map(RequestState::as_str);
    let cutoff = crate::ledger::decisions::receipt_cutoff(now_ms, ttl_ms);
    let candidates: Vec<(String, String, Option<i64>)> = tx
        .prepare_cached(
            "SELECT request_id, state, settled_at FROM plan_requests
             WHERE state IN (?1, ?2, ?3, ?4) AND settled_at <= ?5 ORDER BY settled_at, request_id LIMIT ?6",
        )?
        .query_map(params![a, b, c, d, cutoff, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut pruned = 0;
    for (request_id, state, settled_at) in candidates {
        let state = RequestState::parse(&state)
            .ok_or_else(|| Error::corrupt("plan_requests.state", &state))?;
        if decisions::request_prunable(state, settled_at, now_ms, ttl_ms) {
            pruned += tx
                .prepare_cached("DELETE FROM plan_requests WHERE request_id = ?1")?
                .execute([&request_id])? as u64;
        }
    }
    Ok(pruned)
}

fn put_plan(tx: &Connection, plan: &Plan) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO plans (plan_id, revision, snapshot_id) VALUES (?1, ?2, ?3)
         ON CONFLICT (plan_id) DO UPDATE SET revision = excluded.revision, snapshot_id = excluded.snapshot_id",
    )?
    .execute(params![plan.id.as_str(), plan.revision.get() as i64, plan.snapshot_id.as_str()])?;
    Ok(())
}

fn get_request(tx: &Connection, request_id: &RequestId) -> Result<Option<PlanRequest>> {
    tx.prepare_cached(&format!(
        "SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE request_id = ?1"
    ))?
    .query_row([request_id.as_str()], raw_request)
    .optional()?
    .map(RawRequest::decode)
    .transpose()
}

/// The plan's pending requests, oldest first.
fn pending_of_plan(tx: &Connection, plan_id: &PlanId) -> Result<Vec<PlanRequest>> {
    tx.prepare_cached(&format!(
        "SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE plan_id = ?1 AND state = 'pending' ORDER BY created_at, request_id"
    ))?
    .query_map([plan_id.as_str()], raw_request)?
    .map(|r| r.map_err(Error::from).and_then(RawRequest::decode))
    .collect()
}

fn cards_json(cards: &Option<Vec<Card>>) -> Result<Option<String>> {
    cards
        .as_ref()
        .map(|c| {
            serde_json::to_string(c).map_err(|e| Error::corrupt("plan_requests.cards_json", e))
        })
        .transpose()
}

fn insert_request(tx: &Connection, r: &PlanRequest) -> Result<()> {
    tx.prepare_cached(&format!(
        "INSERT INTO plan_requests ({REQUEST_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
    ))?
    .execute(params![
        r.request_id.as_str(),
        r.plan_id.as_str(),
        r.revision.get() as i64,
        r.snapshot_id.as_str(),
        r.state.as_str(),
        r.reason.map(TerminalReason::as_str),
        r.diagnostic,
        cards_json(&r.cards)?,
        r.created_at,
        r.settled_at,
        r.holder.as_ref().map(|h| h.generation.as_str()),
        r.holder.as_ref().map_or(0, |h| h.lease_until),
    ])?;
    Ok(())
}

/// Write a row's mutable columns (the binding, `created_at` and the holder's generation never change).
fn update_request(tx: &Connection, r: &PlanRequest) -> Result<()> {
    tx.prepare_cached(
        "UPDATE plan_requests SET state = ?2, reason = ?3, diagnostic = ?4, cards_json = ?5, settled_at = ?6,
         lease_until = ?7 WHERE request_id = ?1",
    )?
    .execute(params![
        r.request_id.as_str(),
        r.state.as_str(),
        r.reason.map(TerminalReason::as_str),
        r.diagnostic,
        cards_json(&r.cards)?,
        r.settled_at,
        r.holder.as_ref().map_or(0, |h| h.lease_until),
    ])?;
    Ok(())
}

/// Invalidate the plan's pending and ready requests (all but `except`) with `cause`; answers their ids.
fn invalidate_siblings(
    tx: &Connection,
    plan_id: &PlanId,
    except: Option<&RequestId>,
    cause: &Invalidation,
    now_ms: i64,
) -> Result<Vec<RequestId>> {
    let rows: Vec<PlanRequest> = tx
        .prepare_cached(&format!(
            "SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE plan_id = ?1 AND state IN ('pending', 'ready')
             ORDER BY created_at, request_id"
        ))?
        .query_map([plan_id.as_str()], raw_request)?
        .map(|r| r.map_err(Error::from).and_then(RawRequest::decode))
        .collect::<Result<_>>()?;
    let mut ids = Vec::new();
    for r in rows {
        if Some(&r.request_id) == except || !decisions::invalidated_by_move(r.state) {
            continue;
        }
        update_request(tx, &decisions::invalidate(&r, cause, now_ms))?;
        ids.push(r.request_id);
    }
    Ok(ids)
}

impl PlanStore for SqliteStore {
    fn import(&mut self, import: &Import, now_ms: i64) -> Result<Imported> {
        let tx = self.immediate()?;
        let existing = get_plan(&tx, &import.plan_id)?;
        let step = decisions::import(existing.as_ref(), import);
        if existing.as_ref() != Some(&step.plan) {
            put_plan(&tx, &step.plan)?;
        }
        let invalidated = match &step.cause {
            Some(cause) => invalidate_siblings(&tx, &step.plan.id, None, cause, now_ms)?,
            None => Vec::new(),
        };
        tx.commit()?;
        Ok(Imported {
            plan: step.plan,
            created: step.created,
            invalidated,
        })
    }

    fn plan(&mut self, plan_id: &PlanId) -> Result<Option<Plan>> {
        let tx = self.read()?;
        get_plan(&tx, plan_id)
    }

    fn allocate_request(
        &mut self,
        identity: &PlanBinding,
        holder: &Generation,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        let tx = self.immediate()?;
        let plan = get_plan(&tx, &identity.plan_id)?;
        let pending = pending_of_plan(&tx, &identity.plan_id)?;
        if let Err(refusal) = decisions::admit(plan.as_ref(), identity, &pending, holder) {
            return Ok(Err(refusal));
        }
        let row = decisions::new_request(RequestId::generate(), identity, holder, lease_ms, now_ms);
        insert_request(&tx, &row)?;
        tx.commit()?;
        Ok(Ok(row))
    }

    fn renew_requests(
        &mut self,
        holder: &Generation,
        request_ids: &[RequestId],
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<usize> {
        let tx = self.immediate()?;
        let mut renewed = 0;
        for id in request_ids {
            if let Some(row) =
                get_request(&tx, id)?.and_then(|r| decisions::renew(&r, holder, lease_ms, now_ms))
            {
                update_request(&tx, &row)?;
                renewed += 1;
            }
        }
        tx.commit()?;
        Ok(renewed)
    }

    fn orphaned_requests(&mut self, dead: &[Generation], now_ms: i64) -> Result<Vec<Orphan>> {
        let tx = self.read()?;
        let pending: Vec<PlanRequest> = tx
            .prepare_cached(&format!(
                "SELECT {REQUEST_COLUMNS} FROM plan_requests WHERE state = 'pending' ORDER BY created_at, request_id"
            ))?
            .query_map([], raw_request)?
            .map(|r| r.map_err(Error::from).and_then(RawRequest::decode))
            .collect::<Result<_>>()?;
        Ok(pending
            .into_iter()
            .filter_map(|r| {
                decisions::orphaned(&r, dead, now_ms).map(|cause| Orphan { request: r, cause })
            })
            .collect())
    }

    fn complete_suggestions(
        &mut self,
        request_id: &RequestId,
        binding: &PlanBinding,
        cards: &[Card],
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        let tx = self.immediate()?;
        let request = get_request(&tx, request_id)?;
        let plan = get_plan(&tx, &binding.plan_id)?;
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
        update_request(&tx, &row)?;
        tx.commit()?;
        Ok(Ok(row))
    }

    fn settle_suggestion(
        &mut self,
        request_id: &RequestId,
        binding: &PlanBinding,
        settlement: &Settlement,
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        let tx = self.immediate()?;
        let request = get_request(&tx, request_id)?;
        if let Err(refusal) = decisions::settle(request.as_ref(), request_id, binding) {
            return Ok(Err(refusal));
        }
        let row = decisions::settled(
            &request.expect("settle passes only with a row"),
            settlement,
            now_ms,
        );
        update_request(&tx, &row)?;
        tx.commit()?;
        Ok(Ok(row))
    }

    fn consume(&mut self, request_id: &RequestId, now_ms: i64) -> Result<PlanOutcome<Consumed>> {
        let tx = self.immediate()?;
        let request = get_request(&tx, request_id)?;
        let plan = match &request {
            Some(r) => get_plan(&tx, &r.plan_id)?,
            None => None,
        };
        let (next, cause) = match decisions::consume(plan.as_ref(), request.as_ref(), request_id) {
            Ok(step) => step,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let row = decisions::consumed(&request.expect("consume passes only with a row"), now_ms);
        update_request(&tx, &row)?;
        let invalidated = invalidate_siblings(&tx, &next.id, Some(request_id), &cause, now_ms)?;
        put_plan(&tx, &next)?;
        tx.commit()?;
        Ok(Ok(Consumed {
            request: row,
            plan: next,
            invalidated,
        }))
    }

    fn dismiss(&mut self, request_id: &RequestId, now_ms: i64) -> Result<PlanOutcome<PlanRequest>> {
        let tx = self.immediate()?;
        let request = get_request(&tx, request_id)?;
        let changed = match decisions::dismiss(request.as_ref(), request_id) {
            Ok(changed) => changed,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let request = request.expect("dismiss passes only with a row");
        if !changed {
            return Ok(Ok(request));
        }
        let row = decisions::dismissed(&request, now_ms);
        update_request(&tx, &row)?;
        tx.commit()?;
        Ok(Ok(row))
    }

    fn get_request(&mut self, request_id: &RequestId) -> Result<Option<PlanRequest>> {
        let tx = self.read()?;
        get_request(&tx, request_id)
    }
}
