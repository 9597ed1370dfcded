//! The storage handle's plan calls (SPEC §9): each a transaction on the storage thread, or a read on a
//! reader, like every other call of the handle.

use super::StorageHandle;
use crate::plan::{
    Card, Consumed, Import, Imported, Orphan, Plan, PlanBinding, PlanId, PlanOutcome, PlanRequest,
    RequestId, Settlement,
};
use crate::{Generation, Result};

impl StorageHandle {
    pub async fn import_plan(&self, import: Import) -> Result<Imported> {
        self.transact(move |b, now| b.import(&import, now)).await
    }

    pub async fn plan(&self, plan_id: PlanId) -> Result<Option<Plan>> {
        self.read(move |b, _| b.plan(&plan_id)).await
    }

    /// Allocate a request held by `holder` for `lease_ms` (SPEC §9).
    pub async fn allocate_request(
        &self,
        identity: PlanBinding,
        holder: Generation,
        lease_ms: i64,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.transact(move |b, now| b.allocate_request(&identity, &holder, lease_ms, now))
            .await
    }

    /// Renew the lease of `holder`'s pending requests among `request_ids`; answers how many.
    pub async fn renew_plan_requests(
        &self,
        holder: Generation,
        request_ids: Vec<RequestId>,
        lease_ms: i64,
    ) -> Result<usize> {
        self.transact(move |b, now| b.renew_requests(&holder, &request_ids, lease_ms, now))
            .await
    }

    /// The pending requests whose holder is among `dead`, past its lease, or absent.
    pub async fn orphaned_plan_requests(&self, dead: Vec<Generation>) -> Result<Vec<Orphan>> {
        self.read(move |b, now| b.orphaned_requests(&dead, now))
            .await
    }

    /// The publication CAS: the plan's binding, every card and the exact pending attempt are checked in
    /// the same transaction that writes the ready row — nothing runs between the checks and the write.
    pub async fn complete_suggestions(
        &self,
        request_id: RequestId,
        binding: PlanBinding,
        cards: Vec<Card>,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.transact(move |b, now| b.complete_suggestions(&request_id, &binding, &cards, now))
            .await
    }

    pub async fn settle_suggestion(
        &self,
        request_id: RequestId,
        binding: PlanBinding,
        settlement: Settlement,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.transact(move |b, now| b.settle_suggestion(&request_id, &binding, &settlement, now))
            .await
    }

    pub async fn consume_suggestion(&self, request_id: RequestId) -> Result<PlanOutcome<Consumed>> {
        self.transact(move |b, now| b.consume(&request_id, now))
            .await
    }

    pub async fn dismiss_suggestion(
        &self,
        request_id: RequestId,
    ) -> Result<PlanOutcome<PlanRequest>> {
        self.transact(move |b, now| b.dismiss(&request_id, now))
            .await
    }

    pub async fn plan_request(&self, request_id: RequestId) -> Result<Option<PlanRequest>> {
        self.read(move |b, _| b.get_request(&request_id)).await
    }
}
