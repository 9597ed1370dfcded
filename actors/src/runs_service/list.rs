//! `list_runs` (SPEC §7): its parameters and page, the three-source merge, and the cached ledger listing
//! (with the kill state of every id it may serve) that point reads share.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, MutexGuard};
use storage::RunId;

use serde::{Deserialize, Serialize};
use storage::ledger::decisions::Phase;
use storage::ledger::LiveRow;
use storage::record::{event_seq, RunListItem, RunStatus, VisibilityFilter};
use storage::store::{Cursor, ListQuery, Search, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT};

use super::{RunView, RunsService, LEDGER_EVENTS_CHUNK};

/// One `list_live` serves reads for this long (seed `LEDGER_LIST_TTL_MS`).
pub const LEDGER_LIST_TTL_MS: i64 = crate::registry::LANDED_MEMORY_MS;
/// The `nextBefore` of a page filled by unfinished rows alone: every finished run is older than it
/// (2^53 − 1, exact in every JSON reader).
pub const CURSOR_TOP: i64 = 9_007_199_254_740_991;

/// Which runs a listing covers (SPEC §7 `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    /// Unfinished runs of this process and runs live under other generations; never reads the store.
    Active,
    /// The unfinished runs parked on a tool call awaiting a person's approval (SPEC §13).
    AwaitingApproval,
    /// Finished registry rows and the store.
    Finished,
    All,
    /// Finished runs whose (final) status is this one: finished registry rows with it and one indexed
    /// store query. A tombstone matches none (it shows as unfinished, not as `interrupted`).
    Terminal(RunStatus),
}

impl StatusFilter {
    /// Every spelling [`parse`](Self::parse) accepts, in the order a form offers them.
    pub const CHOICES: [&'static str; 9] = [
        "all",
        "active",
        "awaiting_approval",
        "finished",
        "completed",
        "failed",
        "stopped_soft",
        "stopped_hard",
        "interrupted",
    ];

    /// `active`, `finished`, `all`, or a terminal status (`completed`, `failed`, …).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(StatusFilter::Active),
            "awaiting_approval" => Some(StatusFilter::AwaitingApproval),
            "finished" => Some(StatusFilter::Finished),
            "all" => Some(StatusFilter::All),
            other => RunStatus::parse(other).map(StatusFilter::Terminal),
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusFilter::Active => "active",
            StatusFilter::AwaitingApproval => "awaiting_approval",
            StatusFilter::Finished => "finished",
            StatusFilter::All => "all",
            StatusFilter::Terminal(s) => s.as_str(),
        }
    }

    /// Whether unfinished rows list.
    fn lists_live(self) -> bool {
        matches!(
            self,
            StatusFilter::Active | StatusFilter::All | StatusFilter::AwaitingApproval
        )
    }

    /// Whether finished rows (the registry's and the store's) list.
    fn lists_finished(self) -> bool {
        !matches!(self, StatusFilter::Active | StatusFilter::AwaitingApproval)
    }

    /// Whether an unfinished run lists: every one, or only a parked one.
    fn lists_unfinished(self, v: &RunView) -> bool {
        self != StatusFilter::AwaitingApproval || v.awaiting_approval == Some(true)
    }

    /// The terminal status asked for, if any.
    pub fn terminal(self) -> Option<RunStatus> {
        match self {
            StatusFilter::Terminal(s) => Some(s),
            _ => None,
        }
    }
}

/// `list_runs` parameters (SPEC §7).
#[derive(Debug, Clone, PartialEq)]
pub struct ListParams {
    pub status: StatusFilter,
    /// Required: the caller's visibility.
    pub visible_to: VisibilityFilter,
    pub agent: Option<String>,
    pub channel: Option<String>,
    pub thread_key: Option<String>,
    pub parent_run_id: Option<RunId>,
    /// Compared with `finishedAt ?? startedAt`.
    pub since_ms: Option<i64>,
    /// ≤ 200, default 50.
    pub limit: Option<usize>,
    /// A cursor page (`nextBefore` of the previous page): live rows are omitted.
    pub before: Option<Cursor>,
}

impl ListParams {
    pub fn new(status: StatusFilter, visible_to: VisibilityFilter) -> Self {
        ListParams {
            status,
            visible_to,
            agent: None,
            channel: None,
            thread_key: None,
            parent_run_id: None,
            since_ms: None,
            limit: None,
            before: None,
        }
    }

    fn effective_limit(&self) -> usize {
        self.limit
            .unwrap_or(LIST_DEFAULT_LIMIT)
            .clamp(1, LIST_MAX_LIMIT)
    }

    /// The non-visibility filters on a live row (a ledger row without the field is excluded).
    fn admits(&self, v: &RunView) -> bool {
        self.agent
            .as_deref()
            .is_none_or(|a| v.agent.as_deref() == Some(a))
            && self.channel.as_deref().is_none_or(|c| v.channel_id == c)
            && self.thread_key.as_deref().is_none_or(|t| v.thread_key == t)
            && self
                .parent_run_id
                .as_deref()
                .is_none_or(|p| v.parent_run_id.as_deref() == Some(p))
            && self
                .since_ms
                .is_none_or(|s| v.finished_at.unwrap_or(v.started_at) >= s)
            && v.visible_to(&self.visible_to)
    }
}

/// The wire form of a list cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextBefore {
    pub finished_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl NextBefore {
    pub fn to_cursor(&self) -> Cursor {
        Cursor {
            finished_at: self.finished_at,
            id: self.id.clone(),
        }
    }
}

/// A listing page.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunList {
    pub runs: Vec<RunView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<NextBefore>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub store_unavailable: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ledger_unavailable: bool,
}

/// What a listing knows of a ledger row's events, read a chunk past the last seq it knew each refresh:
/// the highest seq, how many events (a count, never a seq: a resumed run's seqs jump), and their marks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct LiveTally {
    pub(super) last_seq: u64,
    pub(super) count: u64,
    pub(super) marks: super::Marks,
}

/// One `list_live` answer with the [`LiveTally`] of each row, and the kill state of every id the listing
/// may serve.
#[derive(Debug, Default)]
pub(super) struct LiveListing {
    pub(super) rows: Vec<LiveRow>,
    pub(super) tallies: HashMap<RunId, LiveTally>,
    /// The ids whose deletion fence was asked for: this process's registry rows at listing time and the
    /// listed ledger rows. A registry row created since is not covered (a point read asks for it).
    asked: HashSet<RunId>,
    /// Those of `asked` that carry a deletion fence: never served, never listed.
    pub(super) killed: HashSet<RunId>,
}

impl LiveListing {
    /// Whether `id` was killed, when this listing knows (`None`: it did not ask).
    pub(super) fn killed(&self, id: &RunId) -> Option<bool> {
        self.asked.contains(id).then(|| self.killed.contains(id))
    }

    /// A listed ledger row as a view, with its event count and marks.
    pub(super) fn view(&self, row: &LiveRow) -> RunView {
        let tally = self.tallies.get(&row.run_id).copied().unwrap_or_default();
        RunView::from_live(row, tally.count).with_marks(tally.marks)
    }
}

/// The ledger listing shared by a service's clones (see [`RunsService`]'s `live` field).
#[derive(Debug, Default)]
pub(super) struct LiveCache {
    /// The last successful listing and when (service clock) it was taken.
    listing: Option<(i64, Arc<LiveListing>)>,
    /// What was read of each ledger row's events, so a refresh reads only the events past it.
    tallies: HashMap<RunId, LiveTally>,
}

impl RunsService {
    fn cache(&self) -> MutexGuard<'_, LiveCache> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget the cached ledger listing (after a kill, so the run disappears at once).
    pub fn invalidate_live(&self) {
        self.cache().listing = None;
    }

    /// The cached ledger listing while it is at most [`LEDGER_LIST_TTL_MS`] old.
    pub(super) fn fresh_listing(&self) -> Option<Arc<LiveListing>> {
        let now = self.clock.now_ms();
        match &self.cache().listing {
            Some((at, listing)) if (0..LEDGER_LIST_TTL_MS).contains(&(now - at)) => {
                Some(listing.clone())
            }
            _ => None,
        }
    }

    /// The ledger listing, at most [`LEDGER_LIST_TTL_MS`] old; `Err` (logged once) when it cannot be read.
    /// A refresh costs one `list_live`, one `killed_among` (chunked by the ledger when the ids are many)
    /// and, per listed row, a read of the events past the highest seq already known.
    pub(super) async fn live_listing(&self) -> Result<Arc<LiveListing>, String> {
        if let Some(listing) = self.fresh_listing() {
            return Ok(listing);
        }
        let now = self.clock.now_ms();
        let unavailable = |e: storage::Error| {
            tracing::warn!(generation = self.gen.as_str(), error = %e, "ledger listing failed; serving registry and store");
            e.to_string()
        };
        let rows = self.source.list_live().await.map_err(unavailable)?;
        // Each row's tally, reading only past what is already known (rows in parallel).
        let known: HashMap<RunId, LiveTally> = {
            let cache = self.cache();
            rows.iter()
                .map(|r| {
                    (
                        r.run_id.clone(),
                        cache.tallies.get(&r.run_id).copied().unwrap_or_default(),
                    )
                })
                .collect()
        };
        let reads = rows.iter().map(|r| {
            let (id, from) = (r.run_id.clone(), known[&r.run_id]);
            async move { (id.clone(), self.tally_live(id, from).await) }
        });
        // The kill state of everything this listing may serve, read beside the seqs.
        let asked: HashSet<RunId> = self
            .registry
            .rows()
            .into_iter()
            .map(|r| r.id)
            .chain(rows.iter().map(|r| r.run_id.clone()))
            .collect();
        let kills = async {
            if asked.is_empty() {
                return Ok(Vec::new());
            }
            self.source
                .killed_among(asked.iter().cloned().collect())
                .await
        };
        let (seqs, killed) =
            futures_util::future::join(futures_util::future::join_all(reads), kills).await;
        let killed: HashSet<RunId> = killed.map_err(unavailable)?.into_iter().collect();
        let tallies: HashMap<RunId, LiveTally> = seqs.into_iter().collect();
        let listing = Arc::new(LiveListing {
            rows,
            tallies: tallies.clone(),
            asked,
            killed,
        });
        let mut cache = self.cache();
        cache.tallies = tallies;
        cache.listing = Some((now, listing.clone()));
        Ok(listing)
    }

    /// `known` extended by the live events of `id` past its last seq (`known` as it is when none follow
    /// or the read fails).
    async fn tally_live(&self, id: RunId, mut known: LiveTally) -> LiveTally {
        loop {
            match self
                .source
                .live_events(id.clone(), known.last_seq, LEDGER_EVENTS_CHUNK)
                .await
            {
                Ok(Some(events)) => {
                    let before = known.last_seq;
                    for e in &events {
                        known.count += 1;
                        known.marks.observe(e);
                        known.last_seq = known.last_seq.max(event_seq(e).unwrap_or(0));
                    }
                    if events.len() < LEDGER_EVENTS_CHUNK || known.last_seq == before {
                        return known;
                    }
                }
                _ => return known,
            }
        }
    }

    /// Whether a ledger row is listed by this process: every row except this generation's `attaching`
    /// reservations (their registry row is about to exist), rows the registry already serves, and rows of
    /// runs whose record landed since the listing was taken (the store serves those).
    pub(super) fn lists_ledger_row(&self, row: &LiveRow) -> bool {
        !(row.owner_gen == self.gen.as_str() && row.phase == Phase::Attaching)
            && self.registry.row(&row.run_id).is_none()
            && !self.landed_since(row)
    }

    /// A ledger row whose record landed since the listing was read (here, or on another host as its news
    /// said): stale, and the store has the run.
    fn landed_since(&self, row: &LiveRow) -> bool {
        self.registry.recently_landed(&row.run_id)
    }

    /// `list_children` (seed item 58): the runs started for `parent` (`parentRunId` on their message) that
    /// the caller may see, live and finished, oldest start first; at most [`LIST_MAX_LIMIT`].
    pub async fn list_children(&self, parent: &str, visible_to: VisibilityFilter) -> RunList {
        let mut params = ListParams::new(StatusFilter::All, visible_to);
        params.parent_run_id = Some(RunId::from(parent));
        params.limit = Some(LIST_MAX_LIMIT);
        let mut list = self.list_runs(&params).await;
        list.runs
            .sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        list.next_before = None;
        list
    }

    /// `list_runs` (SPEC §7): the three-source merge, sorted, limited, with the store cursor.
    pub async fn list_runs(&self, params: &ListParams) -> RunList {
        self.list_runs_matching(params, None).await
    }

    /// [`list_runs`](Self::list_runs) narrowed to the runs a text [`Search`] matches (the HTML index's
    /// `q`: an id prefix or a label substring): live rows are matched here, the store matches its own
    /// (one bounded query, see [`Search`]).
    pub async fn list_runs_matching(
        &self,
        params: &ListParams,
        search: Option<&Search>,
    ) -> RunList {
        let limit = params.effective_limit();
        let matches = |v: &RunView| search.is_none_or(|s| s.matches(&v.id, v.label.as_deref()));
        if params.visible_to == VisibilityFilter::None {
            // Nothing is visible: touch neither the ledger nor the store.
            return RunList::default();
        }
        let cursor = params.before.as_ref();
        let older_than_cursor = |v: &RunView| {
            cursor.is_none_or(|c| match &c.id {
                Some(id) => v.key() < (c.finished_at, id.as_str()),
                None => v.key().0 < c.finished_at,
            })
        };

        // Live rows: the registry, then ledger rows it does not hold; a killed id lists from no source.
        let listing = self.live_listing().await;
        let mut suppress: HashSet<RunId> = HashSet::new();
        if let Ok(listing) = &listing {
            suppress.extend(listing.killed.iter().cloned());
        }
        let mut unfinished: Vec<RunView> = Vec::new();
        let mut finished_live: Vec<RunView> = Vec::new();
        for row in self.registry.rows() {
            if suppress.contains(&row.id) {
                continue;
            }
            let mut view = RunView::from_registry(&row);
            if view.finished {
                // Its answer, error or stopper show in listings; its record may not have landed yet.
                // Read in place: no copy of the events for a listing.
                self.registry
                    .with_backlog(&row.id, |events| view.fill_from_events(events));
                finished_live.push(view);
            } else {
                suppress.insert(view.id.clone());
                unfinished.push(view);
            }
        }
        if let Ok(listing) = &listing {
            for row in &listing.rows {
                if listing.killed.contains(&row.run_id) {
                    continue; // suppressed already
                }
                if self.landed_since(row) {
                    continue; // the listing predates its record, which the store lists
                }
                suppress.insert(row.run_id.clone());
                if self.lists_ledger_row(row) {
                    unfinished.push(listing.view(row));
                }
            }
        }
        unfinished.retain(|v| params.admits(v) && matches(v) && params.status.lists_unfinished(v));
        finished_live.retain(|v| params.admits(v) && matches(v) && older_than_cursor(v));
        if cursor.is_some() || !params.status.lists_live() {
            unfinished.clear();
        }
        if !params.status.lists_finished() {
            finished_live.clear();
        }

        // The store: one bounded page, asked for enough rows to survive suppression and merging.
        let mut store_unavailable = false;
        let mut boundary: Option<Cursor> = None;
        let mut stored: Vec<RunListItem> = Vec::new();
        if params.status.lists_finished() {
            let ask = (limit + suppress.len() + finished_live.len()).min(LIST_MAX_LIMIT);
            let query = ListQuery {
                visible_to: params.visible_to.clone(),
                limit: Some(ask),
                before: params.before.clone(),
                since_ms: params.since_ms,
                agent: params.agent.clone(),
                channel: params.channel.clone(),
                thread_key: params.thread_key.clone(),
                parent_run_id: params.parent_run_id.clone(),
                status: params.status.terminal(),
                search: search.cloned(),
            };
            match self.source.list(query).await {
                Ok(page) => {
                    boundary = page.next_before;
                    stored = page.items;
                }
                Err(e) => {
                    tracing::warn!(generation = self.gen.as_str(), error = %e, "history store listing failed; serving live rows");
                    store_unavailable = true;
                }
            }
        }

        // Merge: a finished registry row takes its final record's finish fields; suppressed ids vanish.
        // A tombstone the page may hold from before its run's other sources showed it is stale: one of a
        // run whose final record landed since (a sealed run leaves the registry as it commits), or a fresh
        // one whose admission committed it just before the registry row (a live listing shows it next).
        let now = self.clock.now_ms();
        let stale_tombstone = |h: &storage::record::RunHead| {
            h.provisional
                && (self.registry.recently_landed(&h.id)
                    || (h.finished_at == h.started_at
                        && now - h.started_at < crate::registry::LANDED_MEMORY_MS))
        };
        let mut finished: HashMap<RunId, RunView> = finished_live
            .into_iter()
            .map(|v| (v.id.clone(), v))
            .collect();
        for item in stored {
            let h = &item.head;
            if suppress.contains(&h.id) || !params.visible_to.matches_head(h) || stale_tombstone(h)
            {
                continue;
            }
            match finished.get_mut(&h.id) {
                // The tombstone lends nothing, not even its status.
                Some(live) if !h.provisional => live.merge_record(h),
                Some(_) => {}
                None => {
                    finished.insert(h.id.clone(), RunView::from_head(h));
                }
            }
        }
        let mut finished: Vec<RunView> = finished.into_values().collect();
        // A terminal status: the record's status won the merge, so filter after it (the store asked
        // for it already).
        if let Some(status) = params.status.terminal() {
            finished.retain(|v| v.status == Some(status) && v.provisional.is_none());
        }
        // A full store page is only complete down to its last row: older registry rows wait for the next page.
        if let Some(b) = &boundary {
            let b_key = (b.finished_at, b.id.as_deref().unwrap_or(""));
            finished.retain(|v| v.key() >= b_key);
        }
        unfinished.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
        finished.sort_by(|a, b| b.key().cmp(&a.key()));

        let shown_unfinished = unfinished.len().min(limit);
        let shown_finished = finished.len().min(limit - shown_unfinished);
        let next_before = if shown_finished < finished.len() {
            Some(match shown_finished.checked_sub(1).map(|i| &finished[i]) {
                Some(last) => NextBefore {
                    finished_at: last.key().0,
                    id: Some(last.id.to_string()),
                },
                None => NextBefore {
                    finished_at: CURSOR_TOP,
                    id: None,
                },
            })
        } else {
            boundary.map(|b| NextBefore {
                finished_at: b.finished_at,
                id: b.id,
            })
        };
        let mut runs = unfinished;
        runs.truncate(shown_unfinished);
        runs.extend(finished.into_iter().take(shown_finished));
        RunList {
            runs,
            next_before,
            store_unavailable,
            ledger_unavailable: listing.is_err(),
        }
    }
}
#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use serde_json::json;
    use storage::ledger::StopMode;
    use storage::record::{event_seq, RunStatus};

    use super::*;
    use crate::runs_service::testing::*;
    use crate::runs_service::{FrictionSource, RunsError};

    #[tokio::test]
    async fn an_unfinished_live_row_wins_whole_and_its_tombstone_never_lists() {
        let f = fixture();
        f.local("r1", "c1", NOW - 500, None);
        f.put(record("r1", "c1", NOW - 500, NOW - 500, true, vec![]));
        for status in [
            StatusFilter::All,
            StatusFilter::Active,
            StatusFilter::Finished,
        ] {
            let list = f.list(status).await;
            let r1: Vec<&RunView> = list.runs.iter().filter(|v| v.id == "r1").collect();
            if status == StatusFilter::Finished {
                assert!(
                    r1.is_empty(),
                    "{status:?}: the tombstone surfaced: {list:?}"
                );
            } else {
                assert_eq!(r1.len(), 1, "{status:?}");
                assert!(!r1[0].finished && r1[0].provisional.is_none() && r1[0].status.is_none());
            }
        }
        // A point read serves the live row too.
        let v = f
            .svc
            .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert!(!v.finished && v.provisional.is_none());
    }

    #[tokio::test]
    async fn a_finished_registry_row_merges_with_its_record_whose_finish_fields_win() {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.registry.set_stop(&RunId::from("r1"), StopMode::Soft);
        // Before the record lands: not persisted, and the tombstone lends nothing.
        f.put(record("r1", "c1", NOW - 900, NOW - 900, true, vec![]));
        let list = f.list(StatusFilter::Finished).await;
        assert_eq!(ids(&list), ["r1"]);
        let v = &list.runs[0];
        assert_eq!(
            (v.finished_at, v.persisted, v.provisional, v.status),
            (Some(NOW - 100), None, None, Some(RunStatus::Completed))
        );
        // The final record lands with its own finish fields: they win; the live stop and counts stay.
        let mut final_record = record("r1", "c1", NOW - 900, NOW - 90, false, events(2, NOW - 95));
        final_record.head.status = RunStatus::StoppedSoft;
        f.put(final_record);
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["r1"]);
        let v = &list.runs[0];
        assert_eq!(
            (v.finished_at, v.status, v.persisted),
            (Some(NOW - 90), Some(RunStatus::StoppedSoft), Some(true))
        );
        assert_eq!(
            (v.stop, v.event_count, v.agent.as_deref()),
            (Some(StopMode::Soft), 2, Some("demo"))
        );
        let got = f
            .svc
            .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (got.finished_at, got.persisted),
            (Some(NOW - 90), Some(true))
        );
        // After eviction the store serves the same run with the same event count.
        f.clock.advance(crate::registry::FINISHED_TTL_MS);
        f.registry.evict_expired();
        let cold = f
            .svc
            .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (cold.event_count, cold.persisted, cold.finished),
            (got.event_count, Some(true), true)
        );
    }

    #[tokio::test]
    async fn a_foreign_ledger_row_lists_as_live_with_its_owner_and_suppresses_its_tombstone() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 4);
        f.put(record("remote", "c1", NOW - 300, NOW - 300, true, vec![]));
        for status in [StatusFilter::All, StatusFilter::Active] {
            let list = f.list(status).await;
            assert_eq!(ids(&list), ["remote"], "{status:?}");
            let v = &list.runs[0];
            assert_eq!(
                (v.owner_gen.as_deref(), v.finished, v.event_count),
                (Some(OTHER_GEN), false, 4)
            );
            assert_eq!(v.label.as_deref(), Some("remote"));
        }
        assert!(
            f.list(StatusFilter::Finished).await.runs.is_empty(),
            "never finished, never the tombstone"
        );
        // Point reads answer for it after the registry and before the store.
        let v = f
            .svc
            .get_run(&RunId::from("remote"), true, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (v.owner_gen.as_deref(), v.events.as_ref().map(Vec::len)),
            (Some(OTHER_GEN), Some(4))
        );
        let page = f
            .svc
            .get_run_events(&RunId::from("remote"), 2, None, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            page.events.iter().filter_map(event_seq).collect::<Vec<_>>(),
            [3, 4]
        );
        let fr = f
            .svc
            .get_run_friction(&RunId::from("remote"), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((fr.source, fr.finished), (FrictionSource::Ledger, false));
        // Serialized, no view carries the prompt, tools or state of the row.
        let all = serde_json::to_string(&(f.list(StatusFilter::All).await, v)).unwrap();
        assert!(!all.contains("SYSTEM PROMPT"));
    }

    #[tokio::test]
    async fn a_run_in_the_registry_and_the_ledger_lists_once_as_the_registry_row() {
        let f = fixture();
        f.local("r1", "c1", NOW - 300, None);
        f.ledger_row("r1", "c1", f.svc.gen.as_str(), NOW - 300, false, 2);
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["r1"]);
        assert_eq!(list.runs[0].owner_gen, None);
    }

    #[tokio::test]
    async fn a_run_that_landed_after_the_listing_was_cached_lists_once_from_the_store() {
        let f = fixture();
        let gen = f.svc.gen.as_str().to_owned();
        f.local("r1", "c1", NOW - 300, None);
        f.ledger_row("r1", "c1", &gen, NOW - 300, false, 2);
        assert_eq!(ids(&f.list(StatusFilter::All).await), ["r1"]); // caches the listing with r1 live
                                                                   // The record lands and the registry lets the run go; the cached listing still has the live row.
        f.put(record(
            "r1",
            "c1",
            NOW - 300,
            NOW - 10,
            false,
            events(2, NOW - 20),
        ));
        f.registry.landed(&RunId::from("r1"));
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["r1"]);
        assert_eq!(
            (list.runs[0].finished, list.runs[0].persisted),
            (true, Some(true))
        );
        let v = f
            .svc
            .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((v.finished, v.persisted), (true, Some(true)));
    }

    /// A page read before a seal committed may still hold the run's tombstone after the registry let
    /// the run go; a page read as an admission committed may hold one before the registry row exists.
    /// Neither is listed; an old tombstone with no other source (its row lost) still is.
    #[tokio::test]
    async fn a_stale_tombstone_does_not_list_as_a_finished_run() {
        let f = fixture();
        f.put(record("landed", "c1", NOW - 300, NOW - 300, true, vec![]));
        f.registry.landed(&RunId::from("landed"));
        f.put(record("fresh", "c1", NOW - 5, NOW - 5, true, vec![]));
        f.put(record(
            "old",
            "c1",
            NOW - 60_000,
            NOW - 60_000,
            true,
            vec![],
        ));
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["old"]);
        assert_eq!(list.runs[0].provisional, Some(true));
    }

    #[tokio::test]
    async fn this_generations_attaching_rows_not_yet_in_the_registry_are_skipped() {
        let f = fixture();
        let gen = f.svc.gen.as_str().to_owned();
        f.ledger_row("mine", "c1", &gen, NOW, true, 0);
        f.ledger_row("theirs", "c1", OTHER_GEN, NOW - 1, true, 0);
        f.put(record("mine", "c1", NOW, NOW, true, vec![]));
        let list = f.list(StatusFilter::All).await;
        // Ours is skipped (and still suppresses its tombstone); another generation's reservation lists.
        assert_eq!(ids(&list), ["theirs"]);
    }

    #[tokio::test]
    async fn active_is_live_rows_only_and_never_calls_the_store() {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        f.local("done", "c1", NOW - 20, Some(NOW - 5));
        f.put(record("old", "c1", NOW - 100, NOW - 50, false, vec![]));
        let list = f.list(StatusFilter::Active).await;
        assert_eq!(ids(&list), ["live"]);
        assert_eq!(list.next_before, None);
        assert_eq!(f.double.list_calls.load(Ordering::SeqCst), 0);
        // A failing store does not touch active listings.
        f.double.fail_store.store(true, Ordering::SeqCst);
        assert!(!f.list(StatusFilter::Active).await.store_unavailable);
        // `finished` = finished registry rows ∪ store; `all` = both.
        f.double.fail_store.store(false, Ordering::SeqCst);
        assert_eq!(ids(&f.list(StatusFilter::Finished).await), ["done", "old"]);
        assert_eq!(
            ids(&f.list(StatusFilter::All).await),
            ["live", "done", "old"]
        );
    }

    #[tokio::test]
    async fn a_store_failure_degrades_to_live_rows_with_store_unavailable() {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        f.local("done", "c1", NOW - 20, Some(NOW - 5));
        f.put(record("old", "c1", NOW - 100, NOW - 50, false, vec![]));
        f.double.fail_store.store(true, Ordering::SeqCst);
        let all = f.list(StatusFilter::All).await;
        assert_eq!(
            (ids(&all), all.store_unavailable),
            (vec!["live", "done"], true)
        );
        let fin = f.list(StatusFilter::Finished).await;
        assert_eq!((ids(&fin), fin.store_unavailable), (vec!["done"], true));
        // A point read of a stored run is unavailable, not "not found".
        assert!(matches!(
            f.svc
                .get_run(&RunId::from("old"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::Unavailable(_))
        ));
    }

    #[tokio::test]
    async fn a_ledger_failure_sets_ledger_unavailable_and_is_not_cached() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 1);
        f.put(record("old", "c1", NOW - 100, NOW - 50, false, vec![]));
        f.double.fail_ledger.store(true, Ordering::SeqCst);
        for status in [
            StatusFilter::All,
            StatusFilter::Active,
            StatusFilter::Finished,
        ] {
            let list = f.list(status).await;
            assert!(list.ledger_unavailable, "{status:?}");
        }
        let cursor_page = ListParams {
            before: Some(Cursor {
                finished_at: NOW,
                id: None,
            }),
            ..ListParams::new(StatusFilter::All, VisibilityFilter::All)
        };
        let page = f.svc.list_runs(&cursor_page).await;
        assert!(page.ledger_unavailable && ids(&page) == ["old"]);
        // The next successful listing clears the marker at once (the failure was not cached).
        f.double.fail_ledger.store(false, Ordering::SeqCst);
        let list = f.list(StatusFilter::All).await;
        assert!(!list.ledger_unavailable);
        assert_eq!(ids(&list), ["remote", "old"]);
    }

    #[tokio::test]
    async fn one_ledger_listing_serves_reads_for_two_seconds() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 3);
        f.list(StatusFilter::All).await;
        f.svc
            .get_run(&RunId::from("remote"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        f.svc
            .get_run_events(&RunId::from("remote"), 0, None, &VisibilityFilter::All)
            .await
            .unwrap();
        f.svc
            .get_run_friction(&RunId::from("remote"), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        f.clock.advance(LEDGER_LIST_TTL_MS - 1);
        f.list(StatusFilter::Active).await;
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        f.clock.advance(1);
        f.list(StatusFilter::Active).await;
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn unfinished_rows_sort_first_then_finished_newest_and_the_limit_applies_after_the_merge()
    {
        let f = fixture();
        f.local("l-old", "c1", NOW - 5000, None);
        f.local("l-new", "c1", NOW - 10, None);
        f.ledger_row("l-mid", "c1", OTHER_GEN, NOW - 100, false, 0);
        f.local("f-reg", "c1", NOW - 3000, Some(NOW - 40));
        f.put(record("s-a", "c1", NOW - 9000, NOW - 50, false, vec![]));
        f.put(record("s-b", "c1", NOW - 9000, NOW - 50, false, vec![]));
        f.put(record("s-c", "c1", NOW - 100, NOW - 60, false, vec![]));
        let list = f.list(StatusFilter::All).await;
        assert_eq!(
            ids(&list),
            ["l-new", "l-mid", "l-old", "f-reg", "s-b", "s-a", "s-c"]
        );
        let limited = f
            .svc
            .list_runs(&ListParams {
                limit: Some(4),
                ..ListParams::new(StatusFilter::All, VisibilityFilter::All)
            })
            .await;
        assert_eq!(ids(&limited), ["l-new", "l-mid", "l-old", "f-reg"]);
        assert_eq!(
            limited.next_before,
            Some(NextBefore {
                finished_at: NOW - 40,
                id: Some("f-reg".into())
            })
        );
    }

    #[tokio::test]
    async fn the_store_is_asked_for_limit_plus_the_live_count_capped_at_200() {
        let f = fixture();
        f.local("a", "c1", NOW - 10, None);
        f.local("b", "c1", NOW - 20, None);
        f.svc
            .list_runs(&ListParams {
                limit: Some(10),
                ..ListParams::new(StatusFilter::All, VisibilityFilter::All)
            })
            .await;
        f.svc
            .list_runs(&ListParams {
                limit: Some(500),
                ..ListParams::new(StatusFilter::Finished, VisibilityFilter::All)
            })
            .await;
        assert_eq!(*f.double.list_limits.lock().unwrap(), [12, 200]);
    }

    #[tokio::test]
    async fn cursor_pages_walk_the_store_without_skipping_same_millisecond_siblings_or_listing_live_rows(
    ) {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        // Seven runs, four of them finishing in the same millisecond.
        for (id, fin) in [
            ("a", 10),
            ("b", 20),
            ("c", 20),
            ("d", 20),
            ("e", 20),
            ("f", 30),
            ("g", 40),
        ] {
            f.put(record(
                id,
                "c1",
                NOW - 1000,
                NOW - 1000 + fin,
                false,
                vec![],
            ));
        }
        let mut seen = Vec::new();
        let mut params = ListParams {
            limit: Some(3),
            ..ListParams::new(StatusFilter::All, VisibilityFilter::All)
        };
        for _ in 0..10 {
            let page = f.svc.list_runs(&params).await;
            seen.extend(page.runs.iter().map(|v| v.id.clone()));
            match page.next_before {
                Some(nb) => params.before = Some(nb.to_cursor()),
                None => break,
            }
        }
        assert_eq!(seen, ["live", "g", "f", "e", "d", "c", "b", "a"]);
    }

    #[tokio::test]
    async fn next_before_stays_present_when_tombstone_suppression_shortens_a_full_store_page() {
        let f = fixture();
        // Three stored rows; the two newest are tombstones of runs live elsewhere.
        f.put(record("t1", "c1", NOW - 10, NOW - 10, true, vec![]));
        f.put(record("t2", "c1", NOW - 20, NOW - 20, true, vec![]));
        f.put(record("old", "c1", NOW - 500, NOW - 400, false, vec![]));
        f.ledger_row("t1", "c1", OTHER_GEN, NOW - 10, false, 0);
        f.ledger_row("t2", "c1", OTHER_GEN, NOW - 20, false, 0);
        let list = f
            .svc
            .list_runs(&ListParams {
                limit: Some(1),
                ..ListParams::new(StatusFilter::Finished, VisibilityFilter::All)
            })
            .await;
        // Asked for 1 + 2 live = 3 rows: all three came, two were suppressed.
        assert_eq!(ids(&list), ["old"]);
        assert_eq!(
            list.next_before,
            Some(NextBefore {
                finished_at: NOW - 400,
                id: Some("old".into())
            })
        );
        let f2 = fixture();
        for i in 0..3 {
            f2.put(record(
                &format!("t{i}"),
                "c1",
                NOW - 10 - i,
                NOW - 10 - i,
                true,
                vec![],
            ));
            f2.ledger_row(&format!("t{i}"), "c1", OTHER_GEN, NOW - 10 - i, false, 0);
        }
        f2.put(record("old", "c1", NOW - 500, NOW - 400, false, vec![]));
        // Limit 1 + 3 live → 4 rows; 4 exist → the page is full, three suppressed: still a cursor.
        let list = f2
            .svc
            .list_runs(&ListParams {
                limit: Some(1),
                ..ListParams::new(StatusFilter::Finished, VisibilityFilter::All)
            })
            .await;
        assert_eq!(ids(&list), ["old"]);
        assert!(list.next_before.is_some());
    }

    #[tokio::test]
    async fn filters_narrow_live_rows_by_their_meta_and_since_compares_finished_or_started() {
        let f = fixture();
        f.local("t-live", "c1", NOW - 10, None);
        f.local("other", "c2", NOW - 20, None);
        f.local("fin", "c1", NOW - 5000, Some(NOW - 100));
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.thread_key = Some("c1:t-live".into());
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["t-live"]);
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.channel = Some("c2".into());
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["other"]);
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.agent = Some("nope".into());
        assert!(f.svc.list_runs(&p).await.runs.is_empty());
        // sinceMs: the finished run counts from its finish (NOW-100), not its start.
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.since_ms = Some(NOW - 150);
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["t-live", "other", "fin"]);
        p.since_ms = Some(NOW - 15);
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["t-live"]);
    }

    #[tokio::test]
    async fn a_terminal_status_lists_finished_runs_with_it_from_the_registry_and_the_store_with_their_error(
    ) {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        f.local("reg-failed", "c1", NOW - 900, None);
        f.registry.publish(
            &RunId::from("reg-failed"),
            json!({"type": "run_failed", "message": "model exploded"}),
        );
        f.registry
            .finish(&RunId::from("reg-failed"), RunStatus::Failed, NOW - 20);
        f.local("reg-ok", "c1", NOW - 900, Some(NOW - 30));
        let mut failed = record("st-failed", "c1", NOW - 500, NOW - 400, false, vec![]);
        failed.head.status = RunStatus::Failed;
        failed
            .head
            .extra
            .insert("error".into(), json!("tool went away"));
        f.put(failed);
        f.put(record("st-ok", "c1", NOW - 500, NOW - 450, false, vec![]));
        // A tombstone (stored `interrupted`) shows as unfinished, so no terminal status lists it.
        f.put(record("tomb", "c1", NOW - 600, NOW - 600, true, vec![]));
        let list = f.list(StatusFilter::Terminal(RunStatus::Failed)).await;
        assert_eq!(ids(&list), ["reg-failed", "st-failed"]);
        let errors: Vec<Option<&str>> = list.runs.iter().map(|v| v.error.as_deref()).collect();
        assert_eq!(errors, [Some("model exploded"), Some("tool went away")]);
        assert_eq!(
            ids(&f.list(StatusFilter::Terminal(RunStatus::Completed)).await),
            ["reg-ok", "st-ok"]
        );
        assert!(f
            .list(StatusFilter::Terminal(RunStatus::Interrupted))
            .await
            .runs
            .is_empty());
        assert!(f
            .list(StatusFilter::Terminal(RunStatus::StoppedHard))
            .await
            .runs
            .is_empty());
        // Every spelling round-trips; anything else is refused.
        for s in StatusFilter::CHOICES {
            assert_eq!(StatusFilter::parse(s).map(StatusFilter::as_str), Some(s));
        }
        assert_eq!(StatusFilter::parse("broken"), None);
    }

    // ---- kills from other processes (SPEC §5.6): deletion fences checked before a registry row is served ----

    #[tokio::test]
    async fn the_kill_state_costs_one_read_per_listing_and_a_point_read_outside_it_asks_for_its_id_alone(
    ) {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.ledger_row("x1", "c1", OTHER_GEN, NOW - 30, false, 2);
        // One listing: one question, about every id it may serve (the registry's and the ledger's rows).
        f.list(StatusFilter::All).await;
        assert_eq!(
            *f.double.kill_questions.lock().unwrap(),
            [vec!["r1".to_owned(), "x1".to_owned()]]
        );
        // Reads within the TTL, listings and point reads alike, are answered from it.
        f.list(StatusFilter::Active).await;
        f.svc
            .get_run(&RunId::from("r1"), true, &VisibilityFilter::All)
            .await
            .unwrap();
        f.svc
            .get_run_events(&RunId::from("r1"), 0, None, &VisibilityFilter::All)
            .await
            .unwrap();
        f.svc
            .get_run_friction(&RunId::from("x1"), &VisibilityFilter::All)
            .await
            .unwrap();
        f.svc.index_rows(&VisibilityFilter::All).await;
        assert_eq!(f.double.kill_reads(), 1);
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        // Past the TTL, a point read of a registry row asks about its id alone, and lists nothing.
        f.clock.advance(LEDGER_LIST_TTL_MS);
        f.kill_elsewhere("r1");
        assert_eq!(
            f.svc
                .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
        assert_eq!(
            f.double.kill_questions.lock().unwrap().last().unwrap(),
            &["r1".to_owned()]
        );
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        // A registry row newer than a fresh listing was not asked about: its point read asks.
        f.list(StatusFilter::All).await;
        let before = f.double.kill_reads();
        f.local("new", "c1", NOW - 1, None);
        f.kill_elsewhere("new");
        assert_eq!(
            f.svc
                .get_run(&RunId::from("new"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
        assert_eq!(f.double.kill_reads(), before + 1);
        // An empty process asks nothing.
        let empty = fixture();
        empty.list(StatusFilter::All).await;
        assert_eq!(empty.double.kill_reads(), 0);
    }

    #[tokio::test]
    async fn a_failed_kill_read_fails_the_listing_uncached_and_a_point_read_serves_the_registry_row(
    ) {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.ledger_row("x1", "c1", OTHER_GEN, NOW - 30, false, 0);
        f.double.fail_kills.store(true, Ordering::SeqCst);
        // As with any ledger failure: the registry and the store are served, the ledger's rows are not.
        let list = f.list(StatusFilter::All).await;
        assert!(list.ledger_unavailable);
        assert_eq!(ids(&list), ["r1"]);
        // A failed check is no proof of a kill.
        assert!(f
            .svc
            .get_run(&RunId::from("r1"), false, &VisibilityFilter::All)
            .await
            .is_ok());
        // The failed listing was not cached: the next read lists again and sees the fence.
        f.double.fail_kills.store(false, Ordering::SeqCst);
        f.kill_elsewhere("r1");
        let list = f.list(StatusFilter::All).await;
        assert!(!list.ledger_unavailable);
        assert_eq!(ids(&list), ["x1"]);
    }

    /// A run live under another generation lists its event count (never its last seq: a resumed run's
    /// seqs jump) and its marks, read incrementally: a later listing reads only the events that followed.
    #[tokio::test]
    async fn a_run_live_elsewhere_lists_its_event_count_and_marks_not_its_last_seq() {
        let f = fixture();
        f.ledger_row("far", "c1", OTHER_GEN, NOW - 100, false, 2);
        let mut m = f.double.mem.clone();
        let append = |m: &mut storage::MemoryStore, events: Vec<serde_json::Value>| {
            storage::ledger::RunLedger::append(m, &RunId::from("far"), OTHER_GEN, &events)
                .unwrap()
                .unwrap()
        };
        append(
            &mut m,
            vec![
                json!({"type": "resumed", "fromGeneration": "G0", "seq": 1001, "at": NOW - 50}),
                json!({"type": "tool_result", "callId": "c", "tool": "append_file", "ok": false,
                    "effectsUnknown": true, "seq": 1002, "at": NOW - 49}),
                json!({"type": "note", "seq": 1003, "at": NOW - 48}),
            ],
        );
        let list = f.list(StatusFilter::Active).await;
        let v = &list.runs[0];
        assert_eq!(
            (v.event_count, v.resumed, v.effects_unknown),
            (5, Some(1), Some(1))
        );
        let reads = f.double.live_event_calls.load(Ordering::SeqCst);
        append(
            &mut m,
            vec![json!({"type": "resumed", "fromGeneration": "G1", "seq": 2001, "at": NOW - 10})],
        );
        f.clock.advance(LEDGER_LIST_TTL_MS + 1);
        let list = f.list(StatusFilter::Active).await;
        let v = &list.runs[0];
        assert_eq!(
            (v.event_count, v.resumed, v.effects_unknown),
            (6, Some(2), Some(1))
        );
        assert_eq!(
            f.double.live_event_calls.load(Ordering::SeqCst),
            reads + 1,
            "one read past the last seq known"
        );
        // A point read says the same.
        let one = f
            .svc
            .get_run(&RunId::from("far"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((one.event_count, one.resumed), (6, Some(2)));
    }

    /// A search narrows live rows here (id prefix or label, ASCII case folded) and the store's rows by
    /// the same rule; the registry's row carries the marks its published events counted.
    #[tokio::test]
    async fn a_search_matches_live_and_stored_runs_by_id_prefix_or_label() {
        let f = fixture();
        f.local("abc-live", "c1", NOW - 10, None);
        f.local("xyz-live", "c1", NOW - 20, None);
        f.put(record("abc-old", "c1", NOW - 100, NOW - 90, false, vec![]));
        f.put(record("zzz-old", "c1", NOW - 100, NOW - 80, false, vec![]));
        let all = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        let search = |t: &str| Search::new(t).unwrap();
        let list = f.svc.list_runs_matching(&all, Some(&search("ABC"))).await;
        assert_eq!(ids(&list), ["abc-live", "abc-old"]);
        // The registry rows' label is "a label"; the records have none.
        let list = f.svc.list_runs_matching(&all, Some(&search("LABEL"))).await;
        assert_eq!(ids(&list), ["abc-live", "xyz-live"]);
        let live = ListParams::new(StatusFilter::Active, VisibilityFilter::All);
        let list = f.svc.list_runs_matching(&live, Some(&search("abc"))).await;
        assert_eq!(ids(&list), ["abc-live"]);
        assert_eq!(
            ids(&f.list(StatusFilter::All).await).len(),
            4,
            "no search: all"
        );

        f.registry.publish(
            &RunId::from("xyz-live"),
            json!({"type": "resumed", "fromGeneration": "G0"}),
        );
        f.registry.publish(
            &RunId::from("xyz-live"),
            json!({"type": "tool_result", "ok": false, "effectsUnknown": true}),
        );
        let list = f.list(StatusFilter::Active).await;
        let marks: Vec<_> = list
            .runs
            .iter()
            .map(|v| (v.id.as_str(), v.resumed, v.effects_unknown))
            .collect();
        assert_eq!(
            marks,
            [("abc-live", None, None), ("xyz-live", Some(1), Some(1))]
        );
    }
}
