//! Cross-host news in the read service (SPEC §1.3): what another host's committed writes change here.
//!
//! Owns, per run that readers follow through the ledger (a run live on another host), one wake-up
//! counter ([`tokio::sync::watch`]) and the ledger read its followers share. The SSE pump waits on the
//! counter instead of polling every 500 ms; one note wakes every follower of that run on this host (a
//! note about a run nobody here follows costs one map lookup, however many streams are open), and the
//! followers that wake at the same position share ONE ledger read for that note ([`RunsService::read_followed`])
//! — a thousand viewers of one run cost one read per note, not a thousand. It also drops cached views: a
//! kill empties the cached ledger listing (the run disappears from every read at once), and a run that
//! ended elsewhere is remembered as landed, so a listing cached before it ended does not serve it live.
//!
//! Notes are hints: a follower still re-reads the rows, and when notes may have been missed (the
//! listener reconnected, or this receiver lagged) every follower is woken and the listing dropped.

use std::collections::HashMap;
use std::sync::Arc;
use storage::RunId;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use serde_json::Value;
use storage::News;
use tokio::sync::{broadcast, watch};

use super::{RunsError, RunsResult, RunsService};

/// One ledger read, shared by the followers that ask for the same position after the same note.
type SharedRead = Shared<BoxFuture<'static, RunsResult<Option<Arc<Vec<Value>>>>>>;

/// The followers' wake-ups, shared by a service's clones.
#[derive(Default)]
pub(super) struct NewsBoard {
    /// Whether notes flow at all ([`RunsService::hear_news`] was called); without them readers poll.
    hearing: bool,
    followers: HashMap<RunId, Followed>,
}

impl std::fmt::Debug for NewsBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewsBoard")
            .field("hearing", &self.hearing)
            .field("followed", &self.followers.len())
            .finish()
    }
}

/// One followed run.
struct Followed {
    /// Bumped by every note about the run; its followers wait on it.
    notes: watch::Sender<u64>,
    /// The latest read: `(note count, after_seq, limit)` it was taken for, and the read.
    read: Option<((u64, u64, usize), SharedRead)>,
}

impl NewsBoard {
    fn wake(&mut self, run_id: &RunId) {
        if let Some(f) = self.followers.get(run_id) {
            if f.notes.receiver_count() == 0 {
                self.followers.remove(run_id);
            } else {
                f.notes.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    fn wake_all(&mut self) {
        self.followers.retain(|_, f| f.notes.receiver_count() > 0);
        for f in self.followers.values() {
            f.notes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl RunsService {
    fn board(&self) -> std::sync::MutexGuard<'_, NewsBoard> {
        self.news.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hear the storage's cross-host news from now on (a task on the current runtime, for as long as the
    /// feed lives). Call once, at boot; without it readers of other hosts' runs poll.
    pub fn hear_news(&self, mut rx: broadcast::Receiver<News>) {
        self.board().hearing = true;
        let service = self.clone();
        actix::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(news) => service.hear(&news),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "news receiver lagged; waking every follower");
                        service.hear(&News::Resync);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
    }

    /// What one note changes here.
    pub(super) fn hear(&self, news: &News) {
        match news {
            News::Appended { run_id, .. } | News::Stop { run_id } => self.board().wake(run_id),
            News::Ended { run_id } => {
                // A run this process drives lands through its own actor; one that ended elsewhere is
                // remembered as landed, so a cached listing's live row of it is stale.
                if self.registry.row(run_id).is_none() {
                    self.registry.landed(run_id);
                }
                self.board().wake(run_id);
            }
            News::Killed { run_id } => {
                self.invalidate_live();
                self.board().wake(run_id);
            }
            News::Resync => {
                self.invalidate_live();
                self.board().wake_all();
            }
            // A run's own read picks it up ([`storage::StorageHandle::inbox_epoch`]).
            News::Inbox { .. } => {}
        }
    }

    /// A wake-up for a reader following `run_id` through the ledger: it changes whenever a note about the
    /// run arrives. `None` when no news flows: poll instead. Take it before the first read; read with
    /// [`RunsService::read_followed`] after marking the value seen, so a note that lands between the read
    /// and the wait is not missed.
    pub fn follow_news(&self, run_id: &RunId) -> Option<watch::Receiver<u64>> {
        let mut board = self.board();
        if !board.hearing {
            return None;
        }
        // Runs whose followers all left (with the read they cached) go as new ones come.
        board.followers.retain(|_, f| f.notes.receiver_count() > 0);
        let followed = board
            .followers
            .entry(run_id.to_owned())
            .or_insert_with(|| Followed {
                notes: watch::channel(0).0,
                read: None,
            });
        Some(followed.notes.subscribe())
    }

    /// [`RunsService::ledger_events`] for a follower that saw `notes` notes of the run: followers asking
    /// for the same position after the same note share one read (the first starts it, the rest await it).
    pub async fn read_followed(
        &self,
        run_id: &RunId,
        after_seq: u64,
        limit: usize,
        notes: u64,
    ) -> RunsResult<Option<Arc<Vec<Value>>>> {
        let key = (notes, after_seq, limit);
        let read = {
            let mut board = self.board();
            match board.followers.get_mut(run_id) {
                Some(Followed {
                    read: Some((k, read)),
                    ..
                }) if *k == key => read.clone(),
                Some(followed) => {
                    let read = self.ledger_read(run_id, after_seq, limit);
                    followed.read = Some((key, read.clone()));
                    read
                }
                // Not followed (its followers are gone): read alone.
                None => self.ledger_read(run_id, after_seq, limit),
            }
        };
        read.await
    }

    fn ledger_read(&self, run_id: &RunId, after_seq: u64, limit: usize) -> SharedRead {
        let (source, id) = (self.source.clone(), run_id.to_owned());
        async move {
            let page = source
                .live_events(id, after_seq, limit)
                .await
                .map_err(|e| RunsError::Unavailable(e.to_string()))?;
            Ok(page.map(Arc::new))
        }
        .boxed()
        .shared()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::super::testing::{fixture, ids, OTHER_GEN};
    use super::super::StatusFilter;
    use super::*;

    /// Whether `rx` sees a change within 5 s.
    async fn woke(rx: &watch::Receiver<u64>) -> bool {
        let mut rx = rx.clone();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .is_ok()
    }

    #[actix_rt::test]
    async fn without_news_readers_poll_and_with_it_a_note_wakes_only_that_runs_followers() {
        let f = fixture();
        assert!(
            f.svc.follow_news(&RunId::from("r1")).is_none(),
            "no news: poll"
        );
        let feed = storage::NewsFeed::local();
        f.svc.hear_news(feed.subscribe());
        let (a1, a2, b) = (
            f.svc.follow_news(&RunId::from("r1")).unwrap(),
            f.svc.follow_news(&RunId::from("r1")).unwrap(),
            f.svc.follow_news(&RunId::from("r2")).unwrap(),
        );
        feed.publish(News::Appended {
            run_id: "r1".into(),
            seq: 4,
        });
        assert!(
            woke(&a1).await && woke(&a2).await,
            "both followers of r1 woke"
        );
        assert!(
            !b.has_changed().unwrap(),
            "r2's follower slept through r1's note"
        );
        // A resync wakes everyone.
        feed.publish(News::Resync);
        assert!(woke(&b).await);
        // A run nobody follows any more is forgotten at its next note.
        drop((a1, a2));
        f.svc.hear(&News::Stop {
            run_id: "r1".into(),
        });
        assert!(!f.svc.board().followers.contains_key("r1"));
        assert!(f.svc.board().followers.contains_key("r2"));
    }

    /// A thousand followers of one run at the same position after the same note cost one ledger read;
    /// the next note, or another position, reads again.
    #[actix_rt::test]
    async fn followers_at_one_position_after_one_note_share_one_ledger_read() {
        let f = fixture();
        f.ledger_row("r1", "c1", OTHER_GEN, super::super::testing::NOW, false, 3);
        f.svc.hear_news(storage::NewsFeed::local().subscribe());
        let followers: Vec<_> = (0..1000)
            .map(|_| f.svc.follow_news(&RunId::from("r1")).unwrap())
            .collect();
        let reads = || f.double.live_event_calls.load(Ordering::SeqCst);
        let before = reads();
        let r1 = RunId::from("r1");
        let pages = futures_util::future::join_all(
            followers
                .iter()
                .map(|rx| f.svc.read_followed(&r1, 1, 100, *rx.borrow())),
        )
        .await;
        assert!(
            pages
                .iter()
                .all(|p| p.as_ref().unwrap().as_ref().unwrap().len() == 2),
            "every follower got events 2 and 3"
        );
        assert_eq!(reads() - before, 1, "one read for all");
        f.svc.hear(&News::Appended {
            run_id: "r1".into(),
            seq: 3,
        });
        let notes = *followers[0].borrow();
        f.svc
            .read_followed(&RunId::from("r1"), 1, 100, notes)
            .await
            .unwrap();
        f.svc
            .read_followed(&RunId::from("r1"), 1, 100, notes)
            .await
            .unwrap();
        f.svc
            .read_followed(&RunId::from("r1"), 2, 100, notes)
            .await
            .unwrap();
        assert_eq!(
            reads() - before,
            3,
            "a new note and a new position read again; the same ones share"
        );
    }

    #[actix_rt::test]
    async fn a_kill_elsewhere_drops_the_cached_listing_and_an_end_elsewhere_stops_it_serving_the_run_live(
    ) {
        let f = fixture();
        f.ledger_row(
            "gone",
            "c1",
            OTHER_GEN,
            super::super::testing::NOW,
            false,
            2,
        );
        f.ledger_row(
            "killed",
            "c1",
            OTHER_GEN,
            super::super::testing::NOW + 1,
            false,
            2,
        );
        let mut listed = ids(&f.list(StatusFilter::Active).await)
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>();
        listed.sort();
        assert_eq!(listed, ["gone", "killed"]);
        let listings = f.double.live_list_calls.load(Ordering::SeqCst);
        // Another host finishes `gone`: the cached listing (still fresh) no longer serves it live.
        f.svc.hear(&News::Ended {
            run_id: "gone".into(),
        });
        assert_eq!(ids(&f.list(StatusFilter::Active).await), ["killed"]);
        assert_eq!(
            f.double.live_list_calls.load(Ordering::SeqCst),
            listings,
            "served from the cache"
        );
        // Another host kills `killed`: the cache goes, the next read lists again.
        f.svc.hear(&News::Killed {
            run_id: "killed".into(),
        });
        f.list(StatusFilter::Active).await;
        assert_eq!(
            f.double.live_list_calls.load(Ordering::SeqCst),
            listings + 1,
            "listed again"
        );
    }
}
