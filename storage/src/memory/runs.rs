//! The in-memory finished-run history: [`RunStore`] for [`MemoryStore`] (SPEC §3).
//!
//! Reads apply the persisted policy through [`State`](super::state::State)'s kept set; `put` is the
//! shared upsert [`State::put`](super::state::State::put).

use super::state::StoredRun;
use super::MemoryStore;
use crate::record::{is_valid_run_id, stored_event_seqs, RunListItem, RunRecord};
use crate::store::{
    effective_events_limit, effective_open_cards_limit, EventsPage, Expired, ListPage, ListQuery,
    PolicyProposal, PutOutcome, RunStore, StoredPolicy,
};
use crate::Result;
use crate::RunId;

/// Stamp each event's stored seq the way the SQLite store keys `run_events`, so reads agree.
fn keyed_events(record: &RunRecord) -> Vec<(u64, serde_json::Value)> {
    stored_event_seqs(&record.events)
        .into_iter()
        .zip(record.events.iter().cloned())
        .collect()
}

impl RunStore for MemoryStore {
    fn put(
        &mut self,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<PutOutcome> {
        self.lock().put(record, proposal, now_ms)
    }

    fn get(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunRecord>> {
        let st = self.lock();
        Ok(st.visible(id, now_ms).map(|r| r.record.clone()))
    }

    fn get_summary(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunListItem>> {
        let st = self.lock();
        Ok(st.visible(id, now_ms).map(StoredRun::item))
    }

    fn list(&mut self, query: &ListQuery, now_ms: i64) -> Result<ListPage> {
        let st = self.lock();
        let limit = query.effective_limit();
        let items: Vec<RunListItem> = st
            .kept(now_ms)
            .into_iter()
            .filter(|i| query.admits(i))
            .take(limit)
            .collect();
        Ok(ListPage::from_items(items, limit))
    }

    fn events(
        &mut self,
        id: &RunId,
        after_seq: u64,
        limit: Option<usize>,
        now_ms: i64,
    ) -> Result<Option<EventsPage>> {
        let st = self.lock();
        let Some(run) = st.visible(id, now_ms) else {
            return Ok(None);
        };
        let limit = effective_events_limit(limit);
        let after: Vec<(u64, serde_json::Value)> = keyed_events(&run.record)
            .into_iter()
            .filter(|(s, _)| *s > after_seq)
            .collect();
        let more = after.len() > limit;
        let page: Vec<(u64, serde_json::Value)> = after.into_iter().take(limit).collect();
        let next_after_seq = more.then(|| page.last().map(|(s, _)| *s).unwrap_or(after_seq));
        Ok(Some(EventsPage {
            events: page.into_iter().map(|(_, e)| e).collect(),
            next_after_seq,
        }))
    }

    fn delete(&mut self, id: &RunId) -> Result<bool> {
        Ok(self.lock().runs.remove(id).is_some())
    }

    fn policy(&mut self) -> Result<StoredPolicy> {
        Ok(self.lock().policy)
    }

    /// A record holds its events and a live run's are the ledger's: no event row outlives both here.
    fn expire(&mut self, now_ms: i64, _scan_after: &str) -> Result<Expired> {
        let (_, runs) = self.lock().trim(now_ms);
        Ok(Expired {
            runs: runs as u64,
            orphaned: 0,
            scan_after: None,
        })
    }

    fn open_cards(
        &mut self,
        finished_before: i64,
        limit: usize,
        now_ms: i64,
    ) -> Result<Vec<RunId>> {
        let st = self.lock();
        let mut open: Vec<(i64, RunId)> = st
            .kept(now_ms)
            .into_iter()
            .filter(|i| i.head.finished_at <= finished_before && i.head.card_open())
            .map(|i| (i.head.finished_at, i.head.id))
            .collect();
        open.sort();
        open.truncate(effective_open_cards_limit(limit));
        Ok(open.into_iter().map(|(_, id)| id).collect())
    }

    fn close_card(&mut self, id: &RunId) -> Result<bool> {
        if !is_valid_run_id(id) {
            return Ok(false);
        }
        let mut st = self.lock();
        let Some(run) = st.runs.get_mut(id) else {
            return Ok(false);
        };
        let mut record = run.record.clone();
        if !record.head.close_card() {
            return Ok(false);
        }
        *run = StoredRun::new(record)?;
        Ok(true)
    }
}
