//! `StorageHandle`: the async face of the storage actor.
//!
//! Cheap to clone; every method sends one [`Transact`] message and awaits its answer. A closed or full
//! mailbox becomes [`Error::Unavailable`], never a panic. The handle stamps `now_ms` from its injected
//! [`Clock`], so time is the handle's, not the database thread's.

use std::sync::Arc;

use crate::actor::{Backend, BackendSpec, Mailbox};
use crate::clock::Clock;
use crate::ledger::{
    Admit, AdmitOutcome, Claimed, GenerationInfo, HandoffResult, HeartbeatAnswer, InboxItem, LiveRow, Outcome,
    Promotion, ReclaimAnswer, StepRecord, StopAnswer, StopMode, Turn,
};
use crate::record::{RunListItem, RunRecord, RunStatus};
use crate::store::{EventsPage, ListPage, ListQuery, PolicyProposal, PutOutcome, StoredPolicy};
use crate::{Error, Result};

#[derive(Clone)]
pub struct StorageHandle {
    mailbox: Mailbox,
    clock: Arc<dyn Clock>,
    kind: &'static str,
}

impl std::fmt::Debug for StorageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageHandle").field("kind", &self.kind).finish()
    }
}

impl StorageHandle {
    /// Start a storage actor for `spec` on its own thread.
    pub fn start(spec: BackendSpec, clock: Arc<dyn Clock>) -> Self {
        let kind = spec.kind();
        StorageHandle { mailbox: crate::actor::start(spec), clock, kind }
    }

    /// Group-commit counters of the storage actor.
    pub fn group_stats(&self) -> &crate::actor::GroupStats {
        &self.mailbox.stats
    }

    /// `"sqlite"` or `"memory"`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Run `f` as one transaction on the storage thread, with the handle's `now_ms`.
    pub async fn transact<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        let now = self.clock.now_ms();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let body: crate::actor::Body<R> = Box::new(move |b: &mut dyn Backend| f(b, now));
        if !self.mailbox.send(crate::actor::job(body, tx)) {
            return Err(Error::Unavailable("the storage actor is gone".into()));
        }
        rx.await.map_err(|_| Error::Unavailable("the storage actor dropped the message".into()))?
    }

    /// A no-op round trip: answers whether the storage thread is alive and its backend open.
    pub async fn ping(&self) -> Result<()> {
        self.transact(|b, _| b.policy().map(|_| ())).await
    }

    pub async fn put(&self, record: RunRecord, proposal: Option<PolicyProposal>) -> Result<PutOutcome> {
        self.transact(move |b, now| b.put(&record, proposal.as_ref(), now)).await
    }

    pub async fn get(&self, id: String) -> Result<Option<RunRecord>> {
        self.transact(move |b, now| b.get(&id, now)).await
    }

    pub async fn get_summary(&self, id: String) -> Result<Option<RunListItem>> {
        self.transact(move |b, now| b.get_summary(&id, now)).await
    }

    pub async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.transact(move |b, now| b.list(&query, now)).await
    }

    pub async fn events(&self, id: String, after_seq: u64, limit: Option<usize>) -> Result<Option<EventsPage>> {
        self.transact(move |b, now| b.events(&id, after_seq, limit, now)).await
    }

    pub async fn delete(&self, id: String) -> Result<bool> {
        self.transact(move |b, _| b.delete(&id)).await
    }

    pub async fn policy(&self) -> Result<StoredPolicy> {
        self.transact(|b, _| b.policy()).await
    }

    // ---- the live-run ledger (SPEC §4.3); each call is one transaction on the storage thread ----

    pub async fn record_generation(&self, info: GenerationInfo) -> Result<()> {
        self.transact(move |b, _| b.record_generation(&info)).await
    }

    pub async fn generations(&self) -> Result<Vec<GenerationInfo>> {
        self.transact(|b, _| b.generations()).await
    }

    /// Admit at `now_ms` (the caller's clock reading, so the run's `startedAt` is the same everywhere).
    pub async fn admit(&self, admit: Admit, now_ms: i64) -> Result<AdmitOutcome> {
        self.transact(move |b, _| b.admit(&admit, now_ms)).await
    }

    pub async fn claim(&self, run_id: String, gen: String, promotion: Promotion) -> Result<Outcome<Claimed>> {
        self.transact(move |b, now| b.claim(&run_id, &gen, &promotion, now)).await
    }

    pub async fn append(&self, run_id: String, gen: String, events: Vec<serde_json::Value>) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.append(&run_id, &gen, &events)).await
    }

    /// A step's transcript turns and then its step record, committed together: the record is never
    /// durable without its turns, and the step costs one commit.
    pub async fn durable_step(
        &self,
        run_id: String,
        gen: String,
        first_idx: u64,
        turns: Vec<Turn>,
        record: StepRecord,
    ) -> Result<Outcome<()>> {
        self.transact(move |b, _| {
            let own = b.begin_group()?;
            let out = match b.write_transcript(&run_id, &gen, first_idx, &turns) {
                Ok(Ok(())) => b.step(&run_id, &gen, &record),
                other => other,
            };
            if own {
                if matches!(out, Ok(Ok(()))) {
                    b.end_group(true)?;
                } else {
                    // Nothing of a refused or failed step may land; the original answer stands.
                    let _ = b.end_group(false);
                }
            }
            out
        })
        .await
    }

    pub async fn step(&self, run_id: String, gen: String, record: StepRecord) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.step(&run_id, &gen, &record)).await
    }

    pub async fn write_transcript(&self, run_id: String, gen: String, first_idx: u64, turns: Vec<Turn>) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.write_transcript(&run_id, &gen, first_idx, &turns)).await
    }

    pub async fn read_transcript(&self, run_id: String) -> Result<Vec<Turn>> {
        self.transact(move |b, _| b.read_transcript(&run_id)).await
    }

    pub async fn set_state(
        &self,
        run_id: String,
        gen: String,
        patch: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.set_state(&run_id, &gen, &patch)).await
    }

    pub async fn heartbeat(&self, run_id: String, gen: String, lease_ms: i64) -> Result<Outcome<HeartbeatAnswer>> {
        self.transact(move |b, now| b.heartbeat(&run_id, &gen, lease_ms, now)).await
    }

    pub async fn request_stop(&self, run_id: String, mode: StopMode) -> Result<Outcome<StopAnswer>> {
        self.transact(move |b, now| b.request_stop(&run_id, mode, now)).await
    }

    pub async fn handoff(&self, gen: String, run_ids: Vec<String>) -> Result<Vec<(String, HandoffResult)>> {
        self.transact(move |b, _| b.handoff(&gen, &run_ids)).await
    }

    pub async fn finishing(&self, run_id: String, gen: String, status: RunStatus, answer: Option<String>) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.finishing(&run_id, &gen, status, answer.as_deref())).await
    }

    pub async fn finish(&self, gen: String, record: RunRecord, proposal: Option<PolicyProposal>) -> Result<Outcome<PutOutcome>> {
        self.transact(move |b, now| {
            let id = record.head.id.clone();
            b.finish(&id, &gen, &record, proposal.as_ref(), now)
        })
        .await
    }

    pub async fn abandon(&self, run_id: String, gen: String) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.abandon(&run_id, &gen)).await
    }

    pub async fn push_inbox(&self, run_id: String, message: serde_json::Value) -> Result<Outcome<u64>> {
        self.transact(move |b, _| b.push_inbox(&run_id, &message)).await
    }

    pub async fn read_inbox(&self, run_id: String, after_seq: Option<u64>) -> Result<Outcome<Vec<InboxItem>>> {
        self.transact(move |b, _| b.read_inbox(&run_id, after_seq)).await
    }

    pub async fn reclaim(&self, gen: String, lease_ms: i64, dead_gens: Vec<String>) -> Result<ReclaimAnswer> {
        self.transact(move |b, now| b.reclaim(&gen, now, lease_ms, &dead_gens)).await
    }

    pub async fn list_live(&self) -> Result<Vec<LiveRow>> {
        self.transact(|b, _| b.list_live()).await
    }

    pub async fn get_live(&self, run_id: String) -> Result<Option<LiveRow>> {
        self.transact(move |b, _| b.get_live(&run_id)).await
    }

    pub async fn inbox_after(&self, run_id: String, after_seq: Option<u64>) -> Result<Vec<InboxItem>> {
        self.transact(move |b, _| b.inbox_after(&run_id, after_seq)).await
    }

    pub async fn last_step(&self, run_id: String) -> Result<Option<StepRecord>> {
        self.transact(move |b, _| b.last_step(&run_id)).await
    }

    pub async fn capability_secret(&self) -> Result<String> {
        self.transact(|b, _| b.capability_secret()).await
    }

    pub async fn kill(&self, run_id: String) -> Result<crate::ledger::KillAnswer> {
        self.transact(move |b, now| b.kill(&run_id, now)).await
    }

    pub async fn purge(&self, run_id: String) -> Result<bool> {
        self.transact(move |b, _| b.purge(&run_id)).await
    }

    pub async fn is_killed(&self, run_id: String) -> Result<bool> {
        self.transact(move |b, _| b.is_killed(&run_id)).await
    }

    pub async fn live_events(&self, run_id: String, after_seq: u64, limit: usize) -> Result<Option<Vec<serde_json::Value>>> {
        self.transact(move |b, _| b.live_events(&run_id, after_seq, limit)).await
    }

    // ---- plans (SPEC §9); each call is one transaction on the storage thread ----

    pub async fn import_plan(&self, import: crate::plan::Import) -> Result<crate::plan::Imported> {
        self.transact(move |b, now| b.import(&import, now)).await
    }

    pub async fn plan(&self, plan_id: crate::plan::PlanId) -> Result<Option<crate::plan::Plan>> {
        self.transact(move |b, _| b.plan(&plan_id)).await
    }

    pub async fn allocate_request(
        &self,
        identity: crate::plan::PlanBinding,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.transact(move |b, now| b.allocate_request(&identity, now)).await
    }

    /// The publication CAS: the plan's binding, every card and the exact pending attempt are checked in
    /// the same transaction that writes the ready row — nothing runs between the checks and the write.
    pub async fn complete_suggestions(
        &self,
        request_id: crate::plan::RequestId,
        binding: crate::plan::PlanBinding,
        cards: Vec<crate::plan::Card>,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.transact(move |b, now| b.complete_suggestions(&request_id, &binding, &cards, now)).await
    }

    pub async fn settle_suggestion(
        &self,
        request_id: crate::plan::RequestId,
        binding: crate::plan::PlanBinding,
        settlement: crate::plan::Settlement,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.transact(move |b, now| b.settle_suggestion(&request_id, &binding, &settlement, now)).await
    }

    pub async fn consume_suggestion(
        &self,
        request_id: crate::plan::RequestId,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::Consumed>> {
        self.transact(move |b, now| b.consume(&request_id, now)).await
    }

    pub async fn dismiss_suggestion(
        &self,
        request_id: crate::plan::RequestId,
    ) -> Result<crate::plan::PlanOutcome<crate::plan::PlanRequest>> {
        self.transact(move |b, now| b.dismiss(&request_id, now)).await
    }

    pub async fn plan_request(&self, request_id: crate::plan::RequestId) -> Result<Option<crate::plan::PlanRequest>> {
        self.transact(move |b, _| b.get_request(&request_id)).await
    }
}
