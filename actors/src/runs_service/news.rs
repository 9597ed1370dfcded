//! Cross-host news in the read service (SPEC §1.3): what another host's committed writes change here.
//!
//! Owns, per run that a reader follows through the ledger (a run live on another host), one wake-up
//! counter ([`tokio::sync::watch`]): the SSE pump waits on it instead of polling every 500 ms, and one
//! note wakes every follower of that run on this host — a note about a run nobody here follows costs one
//! map lookup, however many streams are open. It also drops cached views: a kill empties the cached
//! ledger listing (the run disappears from every read at once), and a run that ended elsewhere is
//! remembered as landed, so a listing cached before it ended does not serve it live.
//!
//! Notes are hints: a follower still re-reads the rows, and when notes may have been missed (the
//! listener reconnected, or this receiver lagged) every follower is woken and the listing dropped.

use std::collections::HashMap;

use storage::News;
use tokio::sync::{broadcast, watch};

use super::RunsService;

/// The followers' wake-ups, shared by a service's clones.
#[derive(Debug, Default)]
pub(super) struct NewsBoard {
    /// Whether notes flow at all ([`RunsService::hear_news`] was called); without them readers poll.
    hearing: bool,
    /// Run id → the counter its followers wait on (bumped by every note about the run).
    followers: HashMap<String, watch::Sender<u64>>,
}

impl NewsBoard {
    fn wake(&mut self, run_id: &str) {
        if let Some(tx) = self.followers.get(run_id) {
            if tx.receiver_count() == 0 {
                self.followers.remove(run_id);
            } else {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    fn wake_all(&mut self) {
        self.followers.retain(|_, tx| tx.receiver_count() > 0);
        for tx in self.followers.values() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
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
        }
    }

    /// A wake-up for a reader following `run_id` through the ledger: it changes whenever a note about the
    /// run arrives (its value means nothing). `None` when no news flows: poll instead. Take it before
    /// reading, so a note that lands between the read and the wait is not missed.
    pub fn follow_news(&self, run_id: &str) -> Option<watch::Receiver<u64>> {
        let mut board = self.board();
        if !board.hearing {
            return None;
        }
        Some(board.followers.entry(run_id.to_owned()).or_insert_with(|| watch::channel(0).0).subscribe())
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
        tokio::time::timeout(Duration::from_secs(5), rx.changed()).await.is_ok()
    }

    #[actix_rt::test]
    async fn without_news_readers_poll_and_with_it_a_note_wakes_only_that_runs_followers() {
        let f = fixture();
        assert!(f.svc.follow_news("r1").is_none(), "no news: poll");
        let feed = storage::NewsFeed::local();
        f.svc.hear_news(feed.subscribe());
        let (a1, a2, b) = (f.svc.follow_news("r1").unwrap(), f.svc.follow_news("r1").unwrap(), f.svc.follow_news("r2").unwrap());
        feed.publish(News::Appended { run_id: "r1".into(), seq: 4 });
        assert!(woke(&a1).await && woke(&a2).await, "both followers of r1 woke");
        assert!(!b.has_changed().unwrap(), "r2's follower slept through r1's note");
        // A resync wakes everyone.
        feed.publish(News::Resync);
        assert!(woke(&b).await);
        // A run nobody follows any more is forgotten at its next note.
        drop((a1, a2));
        f.svc.hear(&News::Stop { run_id: "r1".into() });
        assert!(!f.svc.board().followers.contains_key("r1"));
        assert!(f.svc.board().followers.contains_key("r2"));
    }

    #[actix_rt::test]
    async fn a_kill_elsewhere_drops_the_cached_listing_and_an_end_elsewhere_stops_it_serving_the_run_live() {
        let f = fixture();
        f.ledger_row("gone", "c1", OTHER_GEN, super::super::testing::NOW, false, 2);
        f.ledger_row("killed", "c1", OTHER_GEN, super::super::testing::NOW + 1, false, 2);
        let mut listed = ids(&f.list(StatusFilter::Active).await).iter().map(|s| s.to_string()).collect::<Vec<_>>();
        listed.sort();
        assert_eq!(listed, ["gone", "killed"]);
        let listings = f.double.live_list_calls.load(Ordering::SeqCst);
        // Another host finishes `gone`: the cached listing (still fresh) no longer serves it live.
        f.svc.hear(&News::Ended { run_id: "gone".into() });
        assert_eq!(ids(&f.list(StatusFilter::Active).await), ["killed"]);
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), listings, "served from the cache");
        // Another host kills `killed`: the cache goes, the next read lists again.
        f.svc.hear(&News::Killed { run_id: "killed".into() });
        f.list(StatusFilter::Active).await;
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), listings + 1, "listed again");
    }
}
