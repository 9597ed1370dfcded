//! The finished-run history on SQLite: [`RunStore`] for [`SqliteStore`] (SPEC §3).
//!
//! Each method is one transaction around the SQL of [`super::records`]: a write is `BEGIN IMMEDIATE`
//! (or a savepoint inside a group commit), a read a deferred transaction. A bad id is not-found (or
//! refused) before any SQL runs.

use crate::RunId;
use rusqlite::params_from_iter;

use super::live::is_live;
use super::records::{
    all_events_in, close_card_in, decode_item, delete_run, events_in, expire_in, kept, list_sql,
    open_cards_in, put_in, read_policy, visible_summary,
};
use super::SqliteStore;
use crate::record::{is_valid_run_id, RunListItem, RunRecord, VisibilityFilter};
use crate::store::{
    effective_events_limit, EventsPage, Expired, ListPage, ListQuery, PolicyProposal, PutOutcome,
    RunStore, StoredPolicy,
};
use crate::Result;

impl RunStore for SqliteStore {
    fn put(
        &mut self,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<PutOutcome> {
        let tx = self.immediate()?;
        let out = put_in(&tx, record, proposal, now_ms)?;
        tx.commit()?;
        Ok(out)
    }

    fn get(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunRecord>> {
        if !is_valid_run_id(id) {
            return Ok(None);
        }
        let tx = self.read()?;
        let Some(item) = visible_summary(&tx, id, now_ms)? else {
            return Ok(None);
        };
        if is_live(&tx, id)? {
            // A tombstone of a live run: its events are the ledger's, served by `live_events`.
            return Ok(Some(RunRecord {
                head: item.head,
                events: Vec::new(),
            }));
        }
        Ok(Some(RunRecord {
            head: item.head,
            events: all_events_in(&tx, id)?,
        }))
    }

    fn get_summary(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunListItem>> {
        if !is_valid_run_id(id) {
            return Ok(None);
        }
        let tx = self.read()?;
        visible_summary(&tx, id, now_ms)
    }

    fn list(&mut self, query: &ListQuery, now_ms: i64) -> Result<ListPage> {
        if matches!(query.visible_to, VisibilityFilter::None) {
            return Ok(ListPage {
                items: vec![],
                next_before: None,
            });
        }
        let tx = self.read()?;
        let policy = read_policy(&tx)?.policy;
        let kept = kept(&tx, &policy, now_ms)?;
        let Some((sql, p)) = list_sql(query, &kept, policy.cutoff_ms(now_ms)) else {
            return Ok(ListPage {
                items: vec![],
                next_before: None,
            });
        };
        let mut stmt = tx.prepare_cached(&sql)?;
        let rows: Vec<(String, i64)> = stmt
            .query_map(params_from_iter(p), |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut items = Vec::with_capacity(rows.len());
        for (s, b) in rows {
            match decode_item(&s, b) {
                Ok(item) => items.push(item),
                Err(e) => tracing::warn!(error = %e, "skipped a corrupt runs row"),
            }
        }
        Ok(ListPage::from_items(items, query.effective_limit()))
    }

    fn events(
        &mut self,
        id: &RunId,
        after_seq: u64,
        limit: Option<usize>,
        now_ms: i64,
    ) -> Result<Option<EventsPage>> {
        if !is_valid_run_id(id) {
            return Ok(None);
        }
        let tx = self.read()?;
        if visible_summary(&tx, id, now_ms)?.is_none() {
            return Ok(None);
        }
        if is_live(&tx, id)? {
            return Ok(Some(EventsPage {
                events: Vec::new(),
                next_after_seq: None,
            }));
        }
        events_in(&tx, id, after_seq, effective_events_limit(limit)).map(Some)
    }

    fn delete(&mut self, id: &RunId) -> Result<bool> {
        if !is_valid_run_id(id) {
            return Ok(false);
        }
        let tx = self.immediate()?;
        let existed = delete_run(&tx, id)?;
        tx.commit()?;
        Ok(existed)
    }

    fn policy(&mut self) -> Result<StoredPolicy> {
        let tx = self.read()?;
        read_policy(&tx)
    }

    fn expire(&mut self, now_ms: i64, scan_after: &str) -> Result<Expired> {
        let tx = self.immediate()?;
        let out = expire_in(&tx, now_ms, scan_after)?;
        tx.commit()?;
        Ok(out)
    }

    fn open_cards(
        &mut self,
        finished_before: i64,
        limit: usize,
        now_ms: i64,
    ) -> Result<Vec<RunId>> {
        let tx = self.read()?;
        open_cards_in(&tx, finished_before, limit, now_ms)
    }

    fn close_card(&mut self, id: &RunId) -> Result<bool> {
        if !is_valid_run_id(id) {
            return Ok(false);
        }
        let tx = self.immediate()?;
        let changed = close_card_in(&tx, id)?;
        tx.commit()?;
        Ok(changed)
    }
}
