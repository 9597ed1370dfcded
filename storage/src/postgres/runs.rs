//! The finished-run history on PostgreSQL: [`RunStore`] for [`PgStore`] (SPEC §3), mirroring
//! `sqlite/runs.rs`. Each method is one transaction around the SQL of [`super::records`]. A bad id is
//! not-found (or refused) before any SQL runs.

use super::live::{is_killed, is_live};
use super::records::{
    all_events_in, close_card_in, decode_item, delete_run, events_in, expire_in, floor_summary,
    kept, list_sql, open_cards_in, put_in, read_policy, summary_fast, visible_summary, Summary,
};
use super::PgStore;
use crate::record::{is_valid_run_id, RunListItem, RunRecord, VisibilityFilter};
use crate::store::{
    effective_events_limit, EventsPage, Expired, ListPage, ListQuery, PolicyProposal, PutOutcome,
    RunStore, StoredPolicy,
};
use crate::Result;
use crate::RunId;

impl RunStore for PgStore {
    fn put(
        &mut self,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<PutOutcome> {
        self.write(|c| put_in(c, record, proposal, now_ms))
    }

    fn get(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunRecord>> {
        if !is_valid_run_id(id) {
            return Ok(None);
        }
        self.read(|c| {
            let Some(item) = visible_summary(c, id, now_ms)? else {
                return Ok(None);
            };
            if is_live(c, id)? {
                // A tombstone of a live run: its events are the ledger's, served by `live_events`.
                return Ok(Some(RunRecord {
                    head: item.head,
                    events: Vec::new(),
                }));
            }
            Ok(Some(RunRecord {
                head: item.head,
                events: all_events_in(c, id)?,
            }))
        })
    }

    fn get_summary(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunListItem>> {
        if !is_valid_run_id(id) {
            return Ok(None);
        }
        match self.read_one(|c| summary_fast(c, id, now_ms))? {
            Summary::Known(item, _) => Ok(item),
            Summary::NeedsFloor => self.read(|c| floor_summary(c, id, now_ms)),
        }
    }

    fn list(&mut self, query: &ListQuery, now_ms: i64) -> Result<ListPage> {
        if matches!(query.visible_to, VisibilityFilter::None) {
            return Ok(ListPage {
                items: vec![],
                next_before: None,
            });
        }
        self.read(|c| {
            let policy = read_policy(c)?.policy;
            let kept = kept(c, &policy, now_ms)?;
            let Some((sql, p)) = list_sql(query, &kept, policy.cutoff_ms(now_ms)) else {
                return Ok(ListPage {
                    items: vec![],
                    next_before: None,
                });
            };
            let rows = c.query(&sql, &p.refs())?;
            let mut items = Vec::with_capacity(rows.len());
            for row in rows {
                match decode_item(&row.get::<_, String>(0), row.get(1)) {
                    Ok(item) => items.push(item),
                    Err(e) => tracing::warn!(error = %e, "skipped a corrupt runs row"),
                }
            }
            Ok(ListPage::from_items(items, query.effective_limit()))
        })
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
        self.read(|c| {
            if visible_summary(c, id, now_ms)?.is_none() {
                return Ok(None);
            }
            if is_live(c, id)? {
                return Ok(Some(EventsPage {
                    events: Vec::new(),
                    next_after_seq: None,
                }));
            }
            events_in(c, id, after_seq, effective_events_limit(limit)).map(Some)
        })
    }

    fn delete(&mut self, id: &RunId) -> Result<bool> {
        if !is_valid_run_id(id) {
            return Ok(false);
        }
        self.write(|c| delete_run(c, id))
    }

    fn policy(&mut self) -> Result<StoredPolicy> {
        self.read(read_policy)
    }

    fn expire(&mut self, now_ms: i64, scan_after: &str) -> Result<Expired> {
        self.write(|c| expire_in(c, now_ms, scan_after))
    }

    fn open_cards(
        &mut self,
        finished_before: i64,
        limit: usize,
        now_ms: i64,
    ) -> Result<Vec<RunId>> {
        self.read(|c| open_cards_in(c, finished_before, limit, now_ms))
    }

    fn close_card(&mut self, id: &RunId) -> Result<bool> {
        if !is_valid_run_id(id) {
            return Ok(false);
        }
        self.write(|c| close_card_in(c, id))
    }
}

impl PgStore {
    /// [`Backend::summary_and_killed`](crate::actor::Backend::summary_and_killed): one statement while
    /// the stored runs are within the policy's bounds.
    pub(crate) fn summary_and_killed(
        &mut self,
        id: &RunId,
        now_ms: i64,
    ) -> Result<(Option<RunListItem>, bool)> {
        if !is_valid_run_id(id) {
            return Ok((None, self.read_one(|c| is_killed(c, id))?));
        }
        match self.read_one(|c| summary_fast(c, id, now_ms))? {
            Summary::Known(item, killed) => Ok((item, killed)),
            Summary::NeedsFloor => {
                self.read(|c| Ok((floor_summary(c, id, now_ms)?, is_killed(c, id)?)))
            }
        }
    }
}
