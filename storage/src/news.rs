//! Cross-host news (SPEC §1.3): small notes that a committed write changed a run, for the processes
//! that did not make the write.
//!
//! Owns the note vocabulary ([`News`]), its wire form (a NOTIFY payload: the kind, the run id and a
//! seq — never event bodies, which listeners read from the rows) and the in-process fan-out
//! ([`NewsFeed`], a bounded broadcast). Only the PostgreSQL backend has a source: its writes send
//! `pg_notify` inside their transaction, so a note leaves exactly when its write commits (a rolled-back
//! savepoint takes its notes with it), and one listener connection per process feeds the feed
//! ([`crate::postgres::news`]). SQLite and memory have none: readers there poll.
//!
//! A note is a hint to read, never the data: a listener that missed notes (a reconnect, a lagging
//! receiver) is told [`News::Resync`] and re-reads everything it follows, so losing a note costs
//! latency, never correctness.

use crate::RunId;
use std::sync::{Arc, OnceLock};

use tokio::sync::broadcast;

/// The NOTIFY channel every process listens on (one per database).
pub const CHANNEL: &str = "switchboard";

/// Notes buffered per receiver; a receiver further behind is told it lagged (and re-reads).
pub const FEED_CAPACITY: usize = 4096;

/// What changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum News {
    /// Events up to `seq` were appended to a live run.
    Appended { run_id: RunId, seq: u64 },
    /// A message reached a live run's inbox under `seq`.
    Inbox { run_id: RunId, seq: u64 },
    /// A stop was requested (its mode is on the row).
    Stop { run_id: RunId },
    /// A run's live row went with its record (finish) or without one (abandon).
    Ended { run_id: RunId },
    /// A deletion fence was written: every cached view of the run goes.
    Killed { run_id: RunId },
    /// Notes may have been missed: re-read whatever is followed.
    Resync,
}

impl News {
    /// The run the note is about (`None` for [`News::Resync`]).
    pub fn run_id(&self) -> Option<&RunId> {
        match self {
            News::Appended { run_id, .. }
            | News::Inbox { run_id, .. }
            | News::Stop { run_id }
            | News::Ended { run_id }
            | News::Killed { run_id } => Some(run_id),
            News::Resync => None,
        }
    }

    /// The NOTIFY payload: `a <seq> <run_id>`, `s <run_id>`, `e <run_id>`, `k <run_id>` (run ids are
    /// `[A-Za-z0-9_-]{1,64}`, so the payload stays far below NOTIFY's 8000 bytes).
    pub fn payload(&self) -> String {
        match self {
            News::Appended { run_id, seq } => format!("a {seq} {run_id}"),
            News::Inbox { run_id, seq } => format!("i {seq} {run_id}"),
            News::Stop { run_id } => format!("s {run_id}"),
            News::Ended { run_id } => format!("e {run_id}"),
            News::Killed { run_id } => format!("k {run_id}"),
            News::Resync => "r".to_owned(),
        }
    }

    /// Parse a payload; anything else (another version's note) is `None` and ignored.
    pub fn parse(payload: &str) -> Option<News> {
        let mut words = payload.split(' ');
        let kind = words.next()?;
        let news = match kind {
            "a" => {
                let seq = words.next()?.parse().ok()?;
                News::Appended {
                    run_id: run_id(words.next()?)?,
                    seq,
                }
            }
            "i" => {
                let seq = words.next()?.parse().ok()?;
                News::Inbox {
                    run_id: run_id(words.next()?)?,
                    seq,
                }
            }
            "s" => News::Stop {
                run_id: run_id(words.next()?)?,
            },
            "e" => News::Ended {
                run_id: run_id(words.next()?)?,
            },
            "k" => News::Killed {
                run_id: run_id(words.next()?)?,
            },
            "r" => News::Resync,
            _ => return None,
        };
        words.next().is_none().then_some(news)
    }
}

fn run_id(word: &str) -> Option<RunId> {
    crate::record::is_valid_run_id(word).then(|| word.into())
}

/// The in-process fan-out of one database's news. Cheap to share (`Arc`); the listener that feeds it
/// starts on the first [`NewsFeed::subscribe`] and ends once the last `Arc` is gone.
pub struct NewsFeed {
    sender: broadcast::Sender<News>,
    /// Starts the listener once: the database URL (PostgreSQL) to listen on.
    source: Option<String>,
    started: OnceLock<()>,
    /// Moved by every note that another host may have written an inbox ([`News::Inbox`], and a
    /// [`News::Resync`] after notes were missed).
    inbox: OnceLock<Arc<crate::actor::InboxWatch>>,
}

impl std::fmt::Debug for NewsFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewsFeed")
            .field("receivers", &self.sender.receiver_count())
            .finish()
    }
}

impl NewsFeed {
    /// A feed fed by a PostgreSQL listener on `url` (started on first subscribe).
    pub fn postgres(url: String) -> Arc<NewsFeed> {
        Arc::new(NewsFeed {
            sender: broadcast::channel(FEED_CAPACITY).0,
            source: Some(url),
            started: OnceLock::new(),
            inbox: OnceLock::new(),
        })
    }

    /// A feed with no listener: only [`NewsFeed::publish`] feeds it (tests).
    pub fn local() -> Arc<NewsFeed> {
        Arc::new(NewsFeed {
            sender: broadcast::channel(FEED_CAPACITY).0,
            source: None,
            started: OnceLock::new(),
            inbox: OnceLock::new(),
        })
    }

    /// A receiver of every note from now on. The first call starts the listener; it says
    /// [`News::Resync`] once it listens (and after every reconnect), since notes before that were missed.
    pub fn subscribe(self: &Arc<Self>) -> broadcast::Receiver<News> {
        let rx = self.sender.subscribe();
        self.start();
        rx
    }

    /// Move `watch` at every note of another host's inbox write (and at a resync), listening from now.
    pub fn feed_inbox(self: &Arc<Self>, watch: Arc<crate::actor::InboxWatch>) {
        let _ = self.inbox.set(watch);
        self.start();
    }

    fn start(self: &Arc<Self>) {
        if let Some(url) = &self.source {
            self.started.get_or_init(|| {
                crate::postgres::news::spawn_listener(url.clone(), Arc::downgrade(self))
            });
        }
    }

    /// Hand a note to every receiver (the listener; tests).
    pub fn publish(&self, news: News) {
        if matches!(news, News::Inbox { .. } | News::Resync) {
            if let Some(watch) = self.inbox.get() {
                watch.bump();
            }
        }
        // No receiver is fine: nobody follows anything yet.
        let _ = self.sender.send(news);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_anything_else_is_ignored() {
        let notes = [
            News::Appended {
                run_id: "r-1_x".into(),
                seq: u64::MAX,
            },
            News::Stop {
                run_id: "r1".into(),
            },
            News::Ended {
                run_id: "r1".into(),
            },
            News::Killed {
                run_id: "r1".into(),
            },
            News::Resync,
        ];
        for n in notes {
            assert_eq!(
                News::parse(&n.payload()),
                Some(n.clone()),
                "{}",
                n.payload()
            );
        }
        for bad in [
            "",
            "a",
            "a 1",
            "a x r1",
            "a 1 r1 extra",
            "s",
            "s bad/id",
            "z r1",
            "k ",
            "a -1 r1",
        ] {
            assert_eq!(News::parse(bad), None, "{bad:?}");
        }
        assert!(
            News::Killed {
                run_id: RunId::from("x".repeat(64))
            }
            .payload()
            .len()
                < 100
        );
    }

    #[tokio::test]
    async fn a_local_feed_reaches_every_receiver_and_a_lagging_one_is_told() {
        let feed = NewsFeed::local();
        let (mut a, mut b) = (feed.subscribe(), feed.subscribe());
        feed.publish(News::Stop {
            run_id: "r1".into(),
        });
        assert_eq!(
            a.recv().await.ok(),
            Some(News::Stop {
                run_id: "r1".into()
            })
        );
        assert_eq!(
            b.recv().await.ok(),
            Some(News::Stop {
                run_id: "r1".into()
            })
        );
        for _ in 0..=FEED_CAPACITY {
            feed.publish(News::Resync);
        }
        assert!(matches!(
            a.recv().await,
            Err(broadcast::error::RecvError::Lagged(_))
        ));
    }
}
