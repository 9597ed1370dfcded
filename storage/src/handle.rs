//! `StorageHandle`: the async face of the storage actor.
//!
//! Cheap to clone; every method sends one [`Transact`] message and awaits its answer. A closed or full
//! mailbox becomes [`Error::Unavailable`], never a panic. The handle stamps `now_ms` from its injected
//! [`Clock`], so time is the handle's, not the database thread's.

use std::sync::Arc;

use actix::Addr;

use crate::actor::{Backend, BackendSpec, StorageActor, Transact};
use crate::clock::Clock;
use crate::record::{RunListItem, RunRecord};
use crate::store::{EventsPage, ListPage, ListQuery, PolicyProposal, PutOutcome, StoredPolicy};
use crate::{Error, Result};

#[derive(Clone)]
pub struct StorageHandle {
    addr: Addr<StorageActor>,
    clock: Arc<dyn Clock>,
    kind: &'static str,
}

impl std::fmt::Debug for StorageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageHandle").field("kind", &self.kind).finish()
    }
}

impl StorageHandle {
    /// Start a storage actor for `spec` (needs a running actix `System`).
    pub fn start(spec: BackendSpec, clock: Arc<dyn Clock>) -> Self {
        let kind = spec.kind();
        StorageHandle { addr: crate::actor::start(spec), clock, kind }
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
        self.addr
            .send(Transact(Box::new(move |b: &mut dyn Backend| f(b, now))))
            .await
            .map_err(|e| Error::Unavailable(format!("storage actor: {e}")))?
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
}
