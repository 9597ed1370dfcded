//! The index feed's memory (SPEC §8.1 `GET /runs/feed`): what one feed connection has shown, and what
//! changed since its last poll.
//!
//! Owns, per connection, the live rows it showed and the finished runs it showed last (at most
//! [`FEED_FINISHED_KEPT`]). Who calls it: the web's feed pump, once per poll; it turns the answer into
//! `upsert` and `removed` frames.
//!
//! Invariants:
//! - a run that started and finished between two polls is still shown: every poll also lists the runs
//!   that finished since the previous one (less [`FEED_LANDING_SLACK_MS`]);
//! - a run shown is `removed` when it goes without a record, and when it is killed after it finished,
//!   by this process or another generation (a deletion fence among the finished runs shown);
//! - a failed read proves nothing: a live row is kept while the ledger does not answer, the finished
//!   window does not move while the store does not answer, and kills are asked again next poll.

use std::collections::{HashMap, VecDeque};
use storage::RunId;

use storage::record::VisibilityFilter;

use super::{ListParams, RunView, RunsError, RunsService, StatusFilter};

/// Finished runs a feed remembers (to tell an unchanged one from news, and to notice their kill).
pub const FEED_FINISHED_KEPT: usize = 256;
/// How far before its previous poll a feed looks for finished runs: a record lands a little after the
/// finish it is stamped with, and hosts' clocks differ a little.
pub const FEED_LANDING_SLACK_MS: i64 = 2_000;

/// One change for a feed's client.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedChange {
    /// A run appeared or changed (a `RunView` without events).
    Upsert(Box<RunView>),
    /// A run shown is gone: killed, or gone from the live set without a record.
    Removed(RunId),
}

/// What one feed connection has shown.
#[derive(Debug)]
pub struct IndexFeed {
    visible_to: VisibilityFilter,
    /// The live rows shown, as shown.
    live: HashMap<RunId, RunView>,
    /// The finished runs shown, as shown, and their order (oldest first) for eviction.
    finished: HashMap<RunId, RunView>,
    order: VecDeque<RunId>,
    /// The killed runs said `removed` (oldest first, at most [`FEED_FINISHED_KEPT`]): a killed id never
    /// comes back (its deletion fence refuses a same-id claim), though its record may list until purged.
    killed: VecDeque<RunId>,
    /// Runs that finished at or after this (service clock, ms) are listed at the next poll.
    since_ms: i64,
}

impl IndexFeed {
    /// A feed that shows what changes from now on.
    pub fn new(runs: &RunsService, visible_to: VisibilityFilter) -> Self {
        IndexFeed {
            visible_to,
            live: HashMap::new(),
            finished: HashMap::new(),
            order: VecDeque::new(),
            killed: VecDeque::new(),
            since_ms: runs.clock.now_ms(),
        }
    }

    /// What changed since the last poll, in the order to send it.
    pub async fn poll(&mut self, runs: &RunsService) -> Vec<FeedChange> {
        let now = runs.clock.now_ms();
        let mut out = Vec::new();
        let (rows, ledger_ok) = runs.index_rows(&self.visible_to).await;
        let mut live: HashMap<RunId, RunView> = HashMap::with_capacity(rows.len());
        for view in rows {
            if self.live.get(&view.id) != Some(&view) {
                out.push(FeedChange::Upsert(Box::new(view.clone())));
            }
            live.insert(view.id.clone(), view);
        }

        // Runs that finished since the last poll, those that started after it included.
        let mut params = ListParams::new(StatusFilter::Finished, self.visible_to.clone());
        params.since_ms = Some(self.since_ms - FEED_LANDING_SLACK_MS);
        params.limit = Some(storage::store::LIST_MAX_LIMIT);
        let recent = runs.list_runs(&params).await;
        for view in recent.runs.into_iter().rev() {
            if view.finished && !live.contains_key(&view.id) {
                self.show_finished(view, &mut out);
            }
        }
        if !recent.store_unavailable {
            self.since_ms = now;
        }

        // Live rows that left the live set: their record, or `removed`.
        for (id, old) in std::mem::take(&mut self.live) {
            if live.contains_key(&id) || self.finished.contains_key(&id) {
                continue;
            }
            if !ledger_ok && old.owner_gen.is_some() {
                live.insert(id, old);
                continue;
            }
            match runs.stored_summary(&id, &self.visible_to).await {
                Ok(view) => self.show_finished(view, &mut out),
                Err(RunsError::NotFound) => out.push(FeedChange::Removed(id)),
                Err(_) => {
                    live.insert(id, old);
                }
            }
        }
        self.live = live;

        // Finished runs shown and killed since, here or by another generation.
        if !self.order.is_empty() {
            if let Ok(killed) = runs
                .source
                .killed_among(self.order.iter().cloned().collect())
                .await
            {
                for id in killed {
                    self.finished.remove(&id);
                    self.order.retain(|o| *o != id);
                    if self.killed.len() == FEED_FINISHED_KEPT {
                        self.killed.pop_front();
                    }
                    self.killed.push_back(id.clone());
                    out.push(FeedChange::Removed(id));
                }
            }
        }
        out
    }

    /// Upsert a finished run unless it was shown as it is; remember it (the oldest is forgotten).
    fn show_finished(&mut self, view: RunView, out: &mut Vec<FeedChange>) {
        if self.finished.get(&view.id) == Some(&view) || self.killed.contains(&view.id) {
            return;
        }
        if self
            .finished
            .insert(view.id.clone(), view.clone())
            .is_none()
        {
            self.order.push_back(view.id.clone());
            if self.order.len() > FEED_FINISHED_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.finished.remove(&old);
                }
            }
        }
        out.push(FeedChange::Upsert(Box::new(view)));
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fixture, record, NOW};
    use super::*;

    fn upserts(changes: &[FeedChange]) -> Vec<(&str, bool)> {
        changes
            .iter()
            .filter_map(|c| match c {
                FeedChange::Upsert(v) => Some((v.id.as_str(), v.finished)),
                FeedChange::Removed(_) => None,
            })
            .collect()
    }

    fn removed(changes: &[FeedChange]) -> Vec<&str> {
        changes
            .iter()
            .filter_map(|c| match c {
                FeedChange::Removed(id) => Some(id.as_str()),
                FeedChange::Upsert(_) => None,
            })
            .collect()
    }

    #[actix_rt::test]
    async fn a_run_that_started_and_finished_between_two_polls_is_shown_once() {
        let f = fixture();
        let mut feed = IndexFeed::new(&f.svc, VisibilityFilter::All);
        assert!(feed.poll(&f.svc).await.is_empty(), "nothing yet");

        // Between two polls a run starts and finishes; its record lands.
        f.clock.advance(500);
        f.put(record(
            "quick",
            "c1",
            NOW + 100,
            NOW + 200,
            false,
            super::super::testing::events(2, NOW + 100),
        ));
        let changes = feed.poll(&f.svc).await;
        assert_eq!(upserts(&changes), [("quick", true)], "{changes:?}");
        f.clock.advance(500);
        assert!(feed.poll(&f.svc).await.is_empty(), "shown once");

        // A run that finished long before the feed opened is not news.
        f.put(record(
            "old",
            "c1",
            NOW - 60_000,
            NOW - 50_000,
            false,
            vec![],
        ));
        f.clock.advance(500);
        assert!(feed.poll(&f.svc).await.is_empty());
    }

    #[actix_rt::test]
    async fn a_finished_run_shown_and_then_killed_elsewhere_is_removed() {
        let f = fixture();
        let mut feed = IndexFeed::new(&f.svc, VisibilityFilter::All);
        f.local("live", "c1", NOW, None);
        assert_eq!(upserts(&feed.poll(&f.svc).await), [("live", false)]);

        // It finishes here and its record lands: shown as the record.
        f.put(record(
            "live",
            "c1",
            NOW,
            NOW + 300,
            false,
            super::super::testing::events(2, NOW),
        ));
        f.registry.finish(
            &RunId::from("live"),
            storage::record::RunStatus::Completed,
            NOW + 300,
        );
        f.registry.landed(&RunId::from("live"));
        f.clock.advance(500);
        let changes = feed.poll(&f.svc).await;
        assert_eq!(upserts(&changes), [("live", true)], "{changes:?}");
        assert!(removed(&changes).is_empty());

        // Another generation kills the finished run: the feed says so, once.
        f.kill_elsewhere("live");
        f.clock.advance(500);
        assert_eq!(removed(&feed.poll(&f.svc).await), ["live"]);
        f.clock.advance(500);
        let changes = feed.poll(&f.svc).await;
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[actix_rt::test]
    async fn a_store_that_does_not_answer_does_not_move_the_finished_window() {
        let f = fixture();
        let mut feed = IndexFeed::new(&f.svc, VisibilityFilter::All);
        f.double
            .fail_store
            .store(true, std::sync::atomic::Ordering::SeqCst);
        f.put(record("during", "c1", NOW + 10, NOW + 20, false, vec![]));
        f.clock.advance(60_000);
        assert!(upserts(&feed.poll(&f.svc).await).is_empty());
        f.double
            .fail_store
            .store(false, std::sync::atomic::Ordering::SeqCst);
        f.clock.advance(500);
        assert_eq!(upserts(&feed.poll(&f.svc).await), [("during", true)]);
    }
}
