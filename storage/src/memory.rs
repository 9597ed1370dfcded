//! The in-memory implementation of the storage traits (tests, `storage.kind = "memory"`).
//!
//! Owns plain maps behind one `std::sync::Mutex`: every method holds the lock for its whole body, which makes
//! each method one atomic transaction, as SQLite's `BEGIN IMMEDIATE` does. The lock is never held across an
//! await (there are none: the trait is synchronous). Clones share one state, so the storage actor's factory
//! can hand a restarted actor the same data.
//!
//! Every decision is the shared pure code of [`crate::record`] (retention, visibility) — the same code
//! the SQLite implementation compiles to SQL — so the two agree by construction.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use crate::record::{apply_retention, is_valid_run_id, stored_event_seqs, RunListItem, RunRecord};
use crate::store::{
    clamp_future, effective_events_limit, EventsPage, ListPage, ListQuery, PolicyProposal, PutOutcome, RunStore,
    StoredPolicy, TRIM_PER_PUT,
};
use crate::{Error, Result};

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
        MemoryStore { state: Arc::default(), secret: hex::encode(bytes).into(), plans: Default::default() }
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) runs: BTreeMap<String, StoredRun>,
    pub(crate) policy: StoredPolicy,
    /// The live-run ledger's tables (see `ledger::memory`).
    pub(crate) ledger: crate::ledger::memory::LedgerState,
}

#[derive(Debug, Clone)]
pub(crate) struct StoredRun {
    pub(crate) record: RunRecord,
    pub(crate) bytes: u64,
    pub(crate) digest: [u8; 32],
}

impl StoredRun {
    fn item(&self) -> RunListItem {
        self.record.to_list_item(Some(self.bytes))
    }
}

impl State {
    /// The listing rows the persisted policy keeps, newest first.
    fn kept(&self, now_ms: i64) -> Vec<RunListItem> {
        let items: Vec<RunListItem> = self.runs.values().map(StoredRun::item).collect();
        apply_retention(&items, &self.policy.policy, now_ms)
    }

    fn visible(&self, id: &str, now_ms: i64) -> Option<&StoredRun> {
        let run = self.runs.get(id)?;
        self.kept(now_ms).iter().any(|i| i.head.id == id).then_some(run)
    }

    fn retained(&self, now_ms: i64) -> u64 {
        self.kept(now_ms).len() as u64
    }

    /// The one upsert of a record, shared by `put` and the ledger's `finish` (SPEC §3).
    pub(crate) fn put(&mut self, record: &RunRecord, proposal: Option<&PolicyProposal>, now_ms: i64) -> Result<PutOutcome> {
        if !is_valid_run_id(&record.head.id) {
            return Err(Error::InvalidRecord(crate::record::RecordError::BadId));
        }
        let st = self;
        // A killed id takes no record ever again (SPEC §4.3 `kill`).
        if st.ledger.is_killed(&record.head.id) {
            return Ok(PutOutcome { stored: false, rewritten: false, retained: st.retained(now_ms) });
        }
        st.policy.consider(proposal, now_ms);
        let mut record = clamp_future(record, now_ms);
        let id = record.head.id.clone();
        if record.head.provisional && st.runs.get(&id).is_some_and(|r| !r.record.head.provisional) {
            return Ok(PutOutcome { stored: true, rewritten: false, retained: st.retained(now_ms) });
        }
        // A live run's events are the ledger's: a put while it lives writes only the runs row.
        if st.ledger.is_live(&id) {
            record.events.clear();
        }
        let encoded = serde_json::to_vec(&record).map_err(|e| Error::corrupt("record", e))?;
        let digest: [u8; 32] = Sha256::digest(&encoded).into();
        let existing = st.runs.get(&id).map(|r| r.digest);
        let unchanged = existing == Some(digest);
        if !unchanged {
            st.runs.insert(id.clone(), StoredRun { record, bytes: encoded.len() as u64, digest });
        }
        let kept: std::collections::HashSet<String> = st.kept(now_ms).into_iter().map(|i| i.head.id).collect();
        let mut doomed: Vec<RunListItem> =
            st.runs.values().filter(|r| !kept.contains(&r.record.head.id)).map(StoredRun::item).collect();
        doomed.sort_by(|a, b| crate::record::newest_first(&a.head, &b.head).reverse());
        for d in doomed.iter().take(TRIM_PER_PUT) {
            st.runs.remove(&d.head.id);
        }
        let stored = kept.contains(&id);
        if !stored {
            st.runs.remove(&id);
        }
        Ok(PutOutcome { stored, rewritten: existing.is_some() && !unchanged, retained: kept.len() as u64 })
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn secret(&self) -> &str {
        &self.secret
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves maps that are still structurally valid; keep serving.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Stamp each event's stored seq the way the SQLite store keys `run_events`, so reads agree.
fn keyed_events(record: &RunRecord) -> Vec<(u64, serde_json::Value)> {
    stored_event_seqs(&record.events).into_iter().zip(record.events.iter().cloned()).collect()
}

impl RunStore for MemoryStore {
    fn put(&mut self, record: &RunRecord, proposal: Option<&PolicyProposal>, now_ms: i64) -> Result<PutOutcome> {
        self.lock().put(record, proposal, now_ms)
    }

    fn get(&mut self, id: &str, now_ms: i64) -> Result<Option<RunRecord>> {
        let st = self.lock();
        Ok(st.visible(id, now_ms).map(|r| r.record.clone()))
    }

    fn get_summary(&mut self, id: &str, now_ms: i64) -> Result<Option<RunListItem>> {
        let st = self.lock();
        Ok(st.visible(id, now_ms).map(StoredRun::item))
    }

    fn list(&mut self, query: &ListQuery, now_ms: i64) -> Result<ListPage> {
        let st = self.lock();
        let limit = query.effective_limit();
        let items: Vec<RunListItem> = st.kept(now_ms).into_iter().filter(|i| query.admits(i)).take(limit).collect();
        Ok(ListPage::from_items(items, limit))
    }

    fn events(&mut self, id: &str, after_seq: u64, limit: Option<usize>, now_ms: i64) -> Result<Option<EventsPage>> {
        let st = self.lock();
        let Some(run) = st.visible(id, now_ms) else { return Ok(None) };
        let limit = effective_events_limit(limit);
        let after: Vec<(u64, serde_json::Value)> =
            keyed_events(&run.record).into_iter().filter(|(s, _)| *s > after_seq).collect();
        let more = after.len() > limit;
        let page: Vec<(u64, serde_json::Value)> = after.into_iter().take(limit).collect();
        let next_after_seq = more.then(|| page.last().map(|(s, _)| *s).unwrap_or(after_seq));
        Ok(Some(EventsPage { events: page.into_iter().map(|(_, e)| e).collect(), next_after_seq }))
    }

    fn delete(&mut self, id: &str) -> Result<bool> {
        Ok(self.lock().runs.remove(id).is_some())
    }

    fn policy(&mut self) -> Result<StoredPolicy> {
        Ok(self.lock().policy)
    }
}

impl crate::plan::PlanStore for MemoryStore {
    fn import(&mut self, import: &crate::plan::Import, now_ms: i64) -> Result<crate::plan::Imported> {
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
        self.plans.allocate_request(identity, holder, lease_ms, now_ms)
    }

    fn renew_requests(
        &mut self,
        holder: &crate::Generation,
        request_ids: &[crate::plan::RequestId],
        lease_ms: i64,
        now_ms: i64,
    ) -> Result<usize> {
        self.plans.renew_requests(holder, request_ids, lease_ms, now_ms)
    }

    fn orphaned_requests(&mut self, dead: &[crate::Generation], now_ms: i64) -> Result<Vec<crate::plan::Orphan>> {
        self.plans.orphaned_requests(dead, now_ms)
    }

    fn complete_suggestions(
        &mut self,
        request_id: &crate::plan::RequestId,
        binding: &crate::plan::PlanBinding,
        cards: &[crate::plan::Card],
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.plans.complete_suggestions(request_id, binding, cards, now_ms)
    }

    fn settle_suggestion(
        &mut self,
        request_id: &crate::plan::RequestId,
        binding: &crate::plan::PlanBinding,
        settlement: &crate::plan::Settlement,
        now_ms: i64,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.plans.settle_suggestion(request_id, binding, settlement, now_ms)
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

    fn get_request(&mut self, request_id: &crate::plan::RequestId) -> Result<Option<crate::plan::PlanRequest>> {
        self.plans.get_request(request_id)
    }
}
