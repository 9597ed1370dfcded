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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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

/// Whether anyone but this process hears its notes — what a writer's `COMMIT` asks before it sends them.
///
/// A note costs the writing transaction more than its text: the database signals every listening
/// connection at the commit, and each of them wakes, reads and forwards it to its process. When the only
/// listener is this process's own (its runs learn of their own writes in-process), that is ~10 % of a
/// run on PostgreSQL for nothing (issue 29). So the listener keeps [`Audience`] up to date — another
/// Switchboard process connected to the database is an audience ([`crate::postgres::news`]) — and a
/// commit with no audience drops its notes.
///
/// A new process must not miss what was written while this one still thought itself alone. When the
/// listener learns of an audience it calls [`Audience::heard`], which waits until every commit that
/// decided to stay quiet has answered, and then sends [`News::Resync`] to everyone: whatever it missed is
/// re-read, and every later commit carries its notes. The two sides pair up without a lock: a commit
/// counts itself quiet *before* it reads the flag, and the listener sets the flag *before* it reads the
/// count — so either the commit sees the audience, or the listener waits for that commit.
///
/// Starts heard: a writer whose process has no listener (a CLI, a test's bare store) always notifies.
#[derive(Debug)]
pub struct Audience {
    heard: AtomicBool,
    /// Commits deciding, or sent, without their notes.
    quiet: AtomicUsize,
    /// Commits went quiet before the listener lost track ([`Audience::unsure`]): the next audience
    /// found is owed a [`News::Resync`].
    owed: AtomicBool,
}

impl Default for Audience {
    fn default() -> Self {
        Audience {
            heard: AtomicBool::new(true),
            quiet: AtomicUsize::new(0),
            owed: AtomicBool::new(false),
        }
    }
}

/// A commit's answer to [`Audience::commit`], held until the commit has answered.
pub(crate) struct Commit<'a> {
    audience: &'a Audience,
    /// Send the notes.
    pub(crate) heard: bool,
}

impl Drop for Commit<'_> {
    fn drop(&mut self) {
        if !self.heard {
            self.audience.quiet.fetch_sub(1, SeqCst);
        }
    }
}

impl Audience {
    /// Whether the commit about to go out sends its notes; hold the answer until the commit answered.
    pub(crate) fn commit(&self) -> Commit<'_> {
        self.quiet.fetch_add(1, SeqCst);
        let heard = self.heard.load(SeqCst);
        if heard {
            self.quiet.fetch_sub(1, SeqCst);
        }
        Commit {
            audience: self,
            heard,
        }
    }

    /// Someone else listens: later commits send their notes. Answers `true` when nobody was heard before
    /// — then every quiet commit has answered (or `patience` ran out) and the caller must send
    /// [`News::Resync`], so the newcomer re-reads what those commits wrote.
    pub(crate) fn heard(&self, patience: Duration) -> bool {
        let already = self.heard.swap(true, SeqCst);
        if already && !self.owed.swap(false, SeqCst) {
            return false;
        }
        let deadline = Instant::now() + patience;
        while self.quiet.load(SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Whether a commit now sends its notes.
    pub fn is_heard(&self) -> bool {
        self.heard.load(SeqCst)
    }

    /// Nobody else listens: commits keep their notes to themselves.
    pub(crate) fn alone(&self) {
        self.heard.store(false, SeqCst);
        self.owed.store(false, SeqCst);
    }

    /// Nobody can tell (the listener lost its connection): commits send their notes. If they were quiet,
    /// whoever the next look finds is owed a [`News::Resync`] ([`Audience::heard`] answers `true`).
    pub(crate) fn unsure(&self) {
        if !self.heard.swap(true, SeqCst) {
            self.owed.store(true, SeqCst);
        }
    }
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
    /// Whether anyone else hears this process's notes, as the listener last found.
    audience: Arc<Audience>,
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
            audience: Default::default(),
        })
    }

    /// A feed with no listener: only [`NewsFeed::publish`] feeds it (tests).
    pub fn local() -> Arc<NewsFeed> {
        Arc::new(NewsFeed {
            sender: broadcast::channel(FEED_CAPACITY).0,
            source: None,
            started: OnceLock::new(),
            inbox: OnceLock::new(),
            audience: Default::default(),
        })
    }

    /// What this process's writers ask before they send notes; the listener keeps it.
    pub fn audience(&self) -> Arc<Audience> {
        self.audience.clone()
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
                crate::postgres::news::spawn_listener(
                    url.clone(),
                    Arc::downgrade(self),
                    self.audience.clone(),
                )
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

    /// Notes go while someone else may hear them; alone, a commit keeps them; the first audience found
    /// after quiet commits is owed a `Resync` — once — and a listener that lost track owes one too.
    #[test]
    fn an_audience_decides_each_commit_and_owes_a_resync_after_quiet_ones() {
        let a = Audience::default();
        assert!(
            a.commit().heard,
            "a process nobody keeps track for always notifies"
        );
        assert!(!a.heard(Duration::ZERO), "nothing was quiet: no resync");
        a.alone();
        assert!(!a.commit().heard);
        assert!(a.heard(Duration::ZERO), "quiet commits before: resync");
        assert!(a.commit().heard);
        assert!(!a.heard(Duration::ZERO), "owed once");
        a.alone();
        a.unsure();
        assert!(a.commit().heard, "unsure: notify");
        assert!(
            a.heard(Duration::ZERO),
            "quiet before the listener lost track: resync"
        );
        assert!(!a.heard(Duration::ZERO));
        a.unsure();
        assert!(!a.heard(Duration::ZERO), "never quiet: nothing owed");
        assert_eq!(a.quiet.load(SeqCst), 0, "every answer was dropped");
    }

    /// `heard` waits for a quiet commit still in flight: the resync must follow what it wrote.
    #[test]
    fn an_audience_found_waits_for_the_quiet_commit_in_flight() {
        let a = Arc::new(Audience::default());
        a.alone();
        let commit = a.commit();
        assert!(!commit.heard);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let a = a.clone();
            std::thread::spawn(move || tx.send(a.heard(Duration::from_secs(30))).unwrap())
        };
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(200)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout),
            "answered while a quiet commit was in flight"
        );
        assert!(
            a.commit().heard,
            "a commit after the audience was found notifies"
        );
        drop(commit);
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
        waiter.join().unwrap();
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
