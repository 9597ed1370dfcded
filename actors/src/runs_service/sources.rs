//! The storage seam: what [`RunsService`](super::RunsService) reads from the history store and the
//! ledger, and [`StorageHandle`]'s implementation of it. Unit tests implement it with `testing::Double`.

use std::future::Future;
use std::pin::Pin;
use storage::RunId;

use serde_json::Value;
use storage::ledger::LiveRow;
use storage::record::{RunListItem, RunRecord};
use storage::store::{EventsPage, ListPage, ListQuery};
use storage::StorageHandle;

/// A future from a [`RunSource`].
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = storage::Result<T>> + Send + 'a>>;

/// What the service reads from storage: the history store and the ledger's read side.
///
/// Implemented by [`StorageHandle`]; tests implement it with a double that counts calls and fails on demand.
pub trait RunSource: Send + Sync + 'static {
    fn list(&self, query: ListQuery) -> SourceFuture<'_, ListPage>;
    fn get(&self, id: RunId) -> SourceFuture<'_, Option<RunRecord>>;
    fn get_summary(&self, id: RunId) -> SourceFuture<'_, Option<RunListItem>>;
    fn events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: Option<usize>,
    ) -> SourceFuture<'_, Option<EventsPage>>;
    fn list_live(&self) -> SourceFuture<'_, Vec<LiveRow>>;
    fn get_live(&self, id: RunId) -> SourceFuture<'_, Option<LiveRow>>;
    fn live_events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> SourceFuture<'_, Option<Vec<Value>>>;
    /// Which of `ids` carry a deletion fence (SPEC §5.6), sorted and each once.
    fn killed_among(&self, ids: Vec<RunId>) -> SourceFuture<'_, Vec<RunId>>;
    /// [`RunSource::get_summary`] and whether [`RunSource::killed_among`] names the run, in one read.
    fn get_summary_and_killed(&self, id: RunId) -> SourceFuture<'_, (Option<RunListItem>, bool)>;
}

impl RunSource for StorageHandle {
    fn list(&self, query: ListQuery) -> SourceFuture<'_, ListPage> {
        Box::pin(StorageHandle::list(self, query))
    }
    fn get(&self, id: RunId) -> SourceFuture<'_, Option<RunRecord>> {
        Box::pin(StorageHandle::get(self, id))
    }
    fn get_summary(&self, id: RunId) -> SourceFuture<'_, Option<RunListItem>> {
        Box::pin(StorageHandle::get_summary(self, id))
    }
    fn events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: Option<usize>,
    ) -> SourceFuture<'_, Option<EventsPage>> {
        Box::pin(StorageHandle::events(self, id, after_seq, limit))
    }
    fn list_live(&self) -> SourceFuture<'_, Vec<LiveRow>> {
        Box::pin(StorageHandle::list_live(self))
    }
    fn get_live(&self, id: RunId) -> SourceFuture<'_, Option<LiveRow>> {
        Box::pin(StorageHandle::get_live(self, id))
    }
    fn live_events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> SourceFuture<'_, Option<Vec<Value>>> {
        Box::pin(StorageHandle::live_events(self, id, after_seq, limit))
    }
    fn killed_among(&self, ids: Vec<RunId>) -> SourceFuture<'_, Vec<RunId>> {
        Box::pin(StorageHandle::killed_among(self, ids))
    }
    fn get_summary_and_killed(&self, id: RunId) -> SourceFuture<'_, (Option<RunListItem>, bool)> {
        Box::pin(StorageHandle::get_summary_and_killed(self, id))
    }
}
