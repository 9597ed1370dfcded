//! [`MemoryPlanStore`]: the in-memory [`PlanStore`], one lock = one transaction.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::*;
use crate::Result;

/// The in-memory plan store. Clones share one state.
///
/// Its tables sit behind their own `std::sync::Mutex` (not the memory store's): no plan operation touches
/// the run tables, and every method holds the lock for its whole body — one atomic transaction, as
/// `BEGIN IMMEDIATE` makes it in SQLite. No lock is held across an await (the trait is synchronous).
#[derive(Debug, Clone, Default)]
pub struct MemoryPlanStore {
    tables: Arc<Mutex<PlanTables>>,
}

#[derive(Debug, Default)]
struct PlanTables {
    plans: BTreeMap<PlanId, Plan>,
    requests: BTreeMap<RequestId, PlanRequest>,
}

impl PlanTables {
    /// Invalidate the plan's pending and ready requests (all but `except`); answers their ids.
    fn invalidate_siblings(
        &mut self,
        plan_id: &PlanId,
        except: Option<&RequestId>,
        cause: &decisions::Invalidation,
        now_ms: i64,
    ) -> Vec<RequestId> {
        let mut ids = Vec::new();
        for r in self.requests.values_mut() {
            if &r.plan_id == plan_id
                && Some(&r.request_id) != except
                && decisions::invalidated_by_move(r.state)
            {
                *r = decisions::invalidate(r, cause, now_ms);
                ids.push(r.request_id.clone());
            }
        }
        ids
    }
}

/// The order SQLite lists requests in: `created_at, request_id`.
fn oldest_first(a: &PlanRequest, b: &PlanRequest) -> std::cmp::Ordering {
    (a.created_at, &a.request_id).cmp(&(b.created_at, &b.request_id))
}

impl MemoryPlanStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, PlanTables> {
        // A panic while holding the lock leaves maps that are still structurally valid; keep serving.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The ledger's prune of the requests: remove at most `limit`
    /// requests [`decisions::request_prunable`] lets go at `now_ms`, oldest settled first; answers how
    /// many went. Plans are never pruned (see [`decisions`]).
    pub(crate) fn prune_settled(&self, now_ms: i64, ttl_ms: i64, limit: usize) -> u64 {
        let mut t = self.lock();
        let mut doomed: Vec<(i64, RequestId)> = t
            .requests
            .values()
            .filter(|r| decisions::request_prunable(r.state, r.settled_at, now_ms, ttl_ms))
            .map(|r| (r.settled_at.unwrap_or_default(), r.request_id.clone()))
            .collect();
        doomed.sort();
        doomed.truncate(limit);
        for (_, id) in &doomed {
            t.requests.remove(id);
        }
        doomed.len() as u64
    }

    /// The generations holding a pending request (rows a generation owns, for the ledger's prune).
    pub(crate) fn pending_holders(&self) -> std::collections::BTreeSet<String> {
        self.lock()
            .requests
            .values()
            .filter(|r| r.state == RequestState::Pending)
            .filter_map(|r| r.holder.as_ref().map(|h| h.generation.as_str().to_owned()))
            .collect()
    }
}

impl PlanStore for MemoryPlanStore {
    fn import(&mut self, import: &Import, now_ms: i64) -> Result<Imported> {
        let mut t = self.lock();
        let step = decisions::import(t.plans.get(&import.plan_id), import);
        let invalidated = match &step.cause {
            Some(cause) => t.invalidate_siblings(&import.plan_id, None, cause, now_ms),
            None => Vec::new(),
        };
        t.plans.insert(step.plan.id.clone(), step.plan.clone());
        Ok(Imported {
            plan: step.plan,
            created: step.created,
            invalidated,
        })
    }

    fn plan(&mut self, plan_id: &PlanId) -> Result<Option<Plan>> {
        Ok(self.lock().plans.get(plan_id).cloned())
    }

    fn allocate_request(
        &mut self,
        identity: &PlanBinding,
        holder: &Generation,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        let mut t = self.lock();
        let mut pending: Vec<PlanRequest> = t
            .requests
            .values()
            .filter(|r| r.plan_id == identity.plan_id && r.state == RequestState::Pending)
            .cloned()
            .collect();
        pending.sort_by(oldest_first);
        if let Err(refusal) =
            decisions::admit(t.plans.get(&identity.plan_id), identity, &pending, holder)
        {
            return Ok(Err(refusal));
        }
        let mut id = RequestId::generate();
        while t.requests.contains_key(&id) {
            id = RequestId::generate();
        }
        let row = decisions::new_request(id.clone(), identity, holder, lease_ms, now_ms);
        t.requests.insert(id, row.clone());
        Ok(Ok(row))
    }

    fn renew_requests(
        &mut self,
        holder: &Generation,
        request_ids: &[RequestId],
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<usize> {
        let mut t = self.lock();
        let mut renewed = 0;
        for id in request_ids {
            if let Some(row) = t.requests.get_mut(id) {
                if let Some(next) = decisions::renew(row, holder, lease_ms, now_ms) {
                    *row = next;
                    renewed += 1;
                }
            }
        }
        Ok(renewed)
    }

    fn orphaned_requests(&mut self, dead: &[Generation], now_ms: i64) -> Result<Vec<Orphan>> {
        let t = self.lock();
        let mut orphans: Vec<Orphan> = t
            .requests
            .values()
            .filter_map(|r| {
                decisions::orphaned(r, dead, now_ms).map(|cause| Orphan {
                    request: r.clone(),
                    cause,
                })
            })
            .collect();
        orphans.sort_by(|a, b| oldest_first(&a.request, &b.request));
        Ok(orphans)
    }

    fn complete_suggestions(
        &mut self,
        request_id: &RequestId,
        binding: &PlanBinding,
        cards: &[Card],
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        let mut t = self.lock();
        let request = t.requests.get(request_id);
        if let Err(refusal) = decisions::complete(
            t.plans.get(&binding.plan_id),
            request,
            request_id,
            binding,
            cards,
        ) {
            return Ok(Err(refusal));
        }
        let row = decisions::completed(
            request.expect("complete passes only with a row"),
            cards,
            now_ms,
        );
        t.requests.insert(request_id.clone(), row.clone());
        Ok(Ok(row))
    }

    fn settle_suggestion(
        &mut self,
        request_id: &RequestId,
        binding: &PlanBinding,
        settlement: &Settlement,
        now_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        let mut t = self.lock();
        let request = t.requests.get(request_id);
        if let Err(refusal) = decisions::settle(request, request_id, binding) {
            return Ok(Err(refusal));
        }
        let row = decisions::settled(
            request.expect("settle passes only with a row"),
            settlement,
            now_ms,
        );
        t.requests.insert(request_id.clone(), row.clone());
        Ok(Ok(row))
    }

    fn consume(&mut self, request_id: &RequestId, now_ms: i64) -> Result<PlanOutcome<Consumed>> {
        let mut t = self.lock();
        let request = t.requests.get(request_id).cloned();
        let plan = request.as_ref().and_then(|r| t.plans.get(&r.plan_id));
        let (next, cause) = match decisions::consume(plan, request.as_ref(), request_id) {
            Ok(step) => step,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let row = decisions::consumed(&request.expect("consume passes only with a row"), now_ms);
        t.requests.insert(request_id.clone(), row.clone());
        let invalidated = t.invalidate_siblings(&next.id, Some(request_id), &cause, now_ms);
        t.plans.insert(next.id.clone(), next.clone());
        Ok(Ok(Consumed {
            request: row,
            plan: next,
            invalidated,
        }))
    }

    fn dismiss(&mut self, request_id: &RequestId, now_ms: i64) -> Result<PlanOutcome<PlanRequest>> {
        let mut t = self.lock();
        let request = t.requests.get(request_id);
        match decisions::dismiss(request, request_id) {
            Err(refusal) => Ok(Err(refusal)),
            Ok(false) => Ok(Ok(request.expect("dismiss passes only with a row").clone())),
            Ok(true) => {
                let row =
                    decisions::dismissed(request.expect("dismiss passes only with a row"), now_ms);
                t.requests.insert(request_id.clone(), row.clone());
                Ok(Ok(row))
            }
        }
    }

    fn get_request(&mut self, request_id: &RequestId) -> Result<Option<PlanRequest>> {
        Ok(self.lock().requests.get(request_id).cloned())
    }
}
