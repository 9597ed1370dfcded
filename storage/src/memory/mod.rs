//! The in-memory implementation of the storage traits (tests, `storage.kind = "memory"`).
//!
//! Owns plain maps behind one `std::sync::Mutex`: every method holds the lock for its whole body, which makes
//! each method one atomic transaction, as SQLite's `BEGIN IMMEDIATE` does. The lock is never held across an
//! await (there are none: the trait is synchronous). Clones share one state, so the storage actor's factory
//! can hand a restarted actor the same data.
//!
//! Every decision is the shared pure code of [`crate::record`] (retention, visibility) and
//! [`crate::ledger::decisions`] — the same code the SQLite implementation compiles to SQL — so the two agree
//! by construction.
//!
//! # Layout
//! Mirrors `sqlite/`: the tables below, the trait implementations above them, dependencies pointing down.
//! - `live`: the ledger's tables (`LedgerState`) and their row-level operations;
//! - `state`: the one locked `State` — the finished-run history next to the ledger's tables — and the
//!   record upsert (`State::put`) that `RunStore::put` and the ledger's `finish` share;
//! - `runs`: [`RunStore`](crate::store::RunStore) for [`MemoryStore`];
//! - `ledger`: [`RunLedger`](crate::ledger::RunLedger) for [`MemoryStore`].

mod ledger;
mod live;
mod runs;
mod state;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::Result;
use state::State;

#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// The capability secret of this in-memory "database" (random per store).
    secret: Arc<str>,
    /// The plan tables (SPEC §9), behind their own lock: no plan operation touches the run tables.
    plans: crate::plan::MemoryPlanStore,
}

impl Default for MemoryStore {
    fn default() -> Self {
        let bytes: [u8; 32] = rand::random();
        MemoryStore {
            state: Arc::default(),
            secret: hex::encode(bytes).into(),
            plans: Default::default(),
        }
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The generations holding a pending plan request.
    pub(crate) fn plan_holders(&self) -> std::collections::BTreeSet<String> {
        self.plans.pending_holders()
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    /// Inbox rows ever written to this store, by any handle on it.
    pub fn inbox_writes(&self) -> u64 {
        self.lock().ledger.inbox_writes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves maps that are still structurally valid; keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl crate::plan::PlanStore for MemoryStore {
    fn import(
        &mut self,
        import: &crate::plan::Import,
        now_ms: i64,
    ) -> Result<crate::plan::Imported> {
        self.plans.import(import, now_ms)
    }

    fn plan(&mut self, plan_id: &crate::plan::PlanId) -> Result<Option<crate::plan::Plan>> {
        self.plans.plan(plan_id)
    }

    fn allocate_request(
        &mut self,
        identity: &crate::plan::PlanBinding,
        holder: &crate::Generation,
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.plans
            .allocate_request(identity, holder, lease_ms, now_ms)
    }

    fn renew_requests(
        &mut self,
        holder: &crate::Generation,
        request_ids: &[crate::plan::RequestId],
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<usize> {
        self.plans
            .renew_requests(holder, request_ids, lease_ms, now_ms)
    }

    fn orphaned_requests(
        &mut self,
        dead: &[crate::Generation],
        now_ms: i64,
    ) -> Result<Vec<crate::plan::Orphan>> {
        self.plans.orphaned_requests(dead, now_ms)
    }

    fn complete_suggestions(
        &mut self,
        request_id: &crate::plan::RequestId,
        binding: &crate::plan::PlanBinding,
        cards: &[crate::plan::Card],
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.plans
            .complete_suggestions(request_id, binding, cards, now_ms)
    }

    fn settle_suggestion(
        &mut self,
        request_id: &crate::plan::RequestId,
        binding: &crate::plan::PlanBinding,
        settlement: &crate::plan::Settlement,
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.plans
            .settle_suggestion(request_id, binding, settlement, now_ms)
    }

    fn consume(
        &mut self,
        request_id: &crate::plan::RequestId,
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::Consumed>> {
        self.plans.consume(request_id, now_ms)
    }

    fn dismiss(
        &mut self,
        request_id: &crate::plan::RequestId,
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.plans.dismiss(request_id, now_ms)
    }

    fn get_request(
        &mut self,
        request_id: &crate::plan::RequestId,
    ) -> Result<Option<crate::plan::PlanRequest>> {
        self.plans.get_request(request_id)
    }
}
