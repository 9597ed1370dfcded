//! The readers: a few threads, each with its own read-only connection, that answer the handle's
//! reads (lists, event pages, SSE following, live rows, transcripts) beside the storage actor.
//!
//! Owns `readers` threads and their connections — SQLite: opened `SQLITE_OPEN_READ_ONLY`, `query_only`;
//! PostgreSQL: `default_transaction_read_only`, each read a `REPEATABLE READ READ ONLY` transaction
//! ([`ReadSource`]) — and one bounded queue they share. The handle sends read jobs here; the storage actor never sees them, so a
//! heartbeat or a durable step never waits behind a read (SPEC §1.2). WAL lets these connections read
//! while the actor writes: each read is its own deferred transaction, so it sees everything committed
//! before it began — in particular every write whose reply its caller already holds (the actor replies
//! only after `COMMIT`).
//!
//! Invariants:
//! - nothing here writes: the connections are read-only twice over (open flags and `query_only`);
//! - a full queue answers `Unavailable` at once and is counted ([`GroupStats::reads_rejected`]); a
//!   sender never blocks;
//! - a reader that cannot open its connection (the file not created or not migrated yet) hands the
//!   job to the storage actor instead, so a read is never refused for that; it tries again on its next
//!   job;
//! - a job that fails with a connection-poisoning error drops that reader's connection; the next job
//!   opens a fresh one.
//!
//! # Design
//! Dedicated threads rather than `spawn_blocking`: they need no tokio runtime (the handle is used from
//! actix arbiters, web workers and plain threads alike), their number bounds the connections, and the
//! queue in front of them is bounded like the actor's. The threads share one receiver behind a
//! `std::sync::Mutex` (held only while waiting for the next job, never while running one). They stop
//! when every handle is dropped; each holds a clone of the actor's mailbox (its fallback), so the actor
//! outlives them.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc, Mutex};

use crate::actor::{Backend, GroupStats, Job, Mailbox, SendError};
use crate::postgres::PgStore;
use crate::sqlite::SqliteStore;

/// Where a reader's connection goes. Its `Debug` redacts a PostgreSQL URL's password.
#[derive(Clone)]
pub enum ReadSource {
    /// The SQLite file at this path ([`SqliteStore::open_reader`]).
    Sqlite(PathBuf),
    /// The PostgreSQL database at this URL ([`PgStore::open_reader`]).
    Postgres(String),
}

impl std::fmt::Debug for ReadSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadSource::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            ReadSource::Postgres(url) => f
                .debug_tuple("Postgres")
                .field(&crate::redact_url(url))
                .finish(),
        }
    }
}

impl ReadSource {
    fn open(&self) -> crate::Result<Box<dyn Backend>> {
        Ok(match self {
            ReadSource::Sqlite(path) => Box::new(SqliteStore::open_reader(path)?),
            ReadSource::Postgres(url) => Box::new(PgStore::open_reader(url)?),
        })
    }

    /// For the log: the file, or "postgres" (a URL may carry a password).
    fn describe(&self) -> String {
        match self {
            ReadSource::Sqlite(path) => path.display().to_string(),
            ReadSource::Postgres(_) => "postgres".into(),
        }
    }
}

/// Default number of reader threads (and read-only connections).
pub const DEFAULT_READERS: usize = 4;

/// Default capacity of the readers' shared queue.
pub const DEFAULT_READ_QUEUE_CAPACITY: usize = 4096;

/// The sending side of the readers' queue; cheap to clone. Dropping every clone stops the readers.
#[derive(Clone)]
pub struct ReadPool {
    /// Bounded: a sender never blocks (see the module doc).
    tx: mpsc::SyncSender<Job>,
    stats: Arc<GroupStats>,
    /// SQLite: one more read-only connection (opened on first use), for a caller that runs its read
    /// itself ([`ReadPool::try_run_here`]); `None` on PostgreSQL, whose synchronous client blocks only
    /// on a thread of its own.
    here: Option<(ReadSource, Spare)>,
}

/// The readers' spare connection: opened on first use, dropped after a poisoning error.
type Spare = Arc<Mutex<Option<Box<dyn Backend>>>>;

impl ReadPool {
    /// Start `readers` threads (at least 1) reading `source`, behind a queue of `capacity` jobs;
    /// `fallback` is the storage actor, which answers a job a reader cannot.
    pub fn start(source: ReadSource, readers: usize, capacity: usize, fallback: Mailbox) -> Self {
        let stats = fallback.stats.clone();
        let (tx, rx) = mpsc::sync_channel::<Job>(capacity.max(1));
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..readers.max(1) {
            let (rx, source, fallback) = (rx.clone(), source.clone(), fallback.clone());
            std::thread::Builder::new()
                .name(format!("storage-reader-{i}"))
                .spawn(move || reader(&rx, &source, &fallback))
                .expect("spawn a storage reader thread");
        }
        let here = matches!(source, ReadSource::Sqlite(_)).then(|| (source, Arc::default()));
        ReadPool { tx, stats, here }
    }

    /// Run the read `job` on the calling thread, on the pool's spare connection, when no read is
    /// queued and that connection is free; else give it back (to be queued). A lone run's point read
    /// then costs no hand-off to a reader thread and back (issue 29); the caller blocks its thread for
    /// the read.
    pub fn try_run_here(&self, job: Job) -> Result<(), Job> {
        let Some((source, conn)) = &self.here else {
            return Err(job);
        };
        if self.stats.reads_queued.load(Relaxed) != 0 {
            return Err(job);
        }
        let Ok(mut conn) = conn.try_lock() else {
            return Err(job);
        };
        // A connection that does not open gives the job back: a reader thread opens its own, or hands
        // it to the actor.
        run_read(&mut conn, source, job, &self.stats.reads_here).map_err(|(job, _)| job)
    }

    /// Queue a read without waiting: a full queue is [`SendError::Full`] (counted), stopped readers
    /// [`SendError::Gone`].
    pub fn try_send(&self, job: Job) -> Result<(), SendError> {
        self.stats.reads_queued.fetch_add(1, Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.reads_queued.fetch_sub(1, Relaxed);
                Err(match e {
                    mpsc::TrySendError::Full(job) => {
                        self.stats.reads_rejected.fetch_add(1, Relaxed);
                        SendError::Full(job)
                    }
                    mpsc::TrySendError::Disconnected(job) => SendError::Gone(job),
                })
            }
        }
    }
}

/// One reader thread: take the next job, run it on this thread's connection (opened on demand).
fn reader(rx: &Mutex<mpsc::Receiver<Job>>, source: &ReadSource, fallback: &Mailbox) {
    let stats = fallback.stats.clone();
    let mut conn: Option<Box<dyn Backend>> = None;
    loop {
        // The lock is held only while waiting; a poisoned lock still guards a valid receiver.
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return, // every handle is gone
        };
        stats.reads_queued.fetch_sub(1, Relaxed);
        if let Err((job, e)) = run_read(&mut conn, source, job, &stats.pooled_reads) {
            tracing::debug!(error = %e, source = %source.describe(), "a reader could not open its connection; the actor answers");
            stats.reads_on_actor.fetch_add(1, Relaxed);
            // Dropping a job the actor cannot take drops its reply channel: the caller answers
            // `Unavailable`.
            let _ = fallback.try_send(job);
        }
    }
}

/// Run the read `job` on `conn` — opened from `source` first when there is none — count it in `ran`
/// and answer it; a connection-poisoning error drops the connection, so the next read opens a fresh
/// one. When no connection opens, the job comes back with why.
fn run_read(
    conn: &mut Option<Box<dyn Backend>>,
    source: &ReadSource,
    mut job: Job,
    ran: &AtomicU64,
) -> Result<(), (Job, crate::Error)> {
    let store = match conn {
        Some(store) => store,
        None => match source.open() {
            Ok(store) => conn.insert(store),
            Err(e) => return Err((job, e)),
        },
    };
    let poisoned = job.run(store.as_mut());
    ran.fetch_add(1, Relaxed);
    job.reply(None);
    if poisoned {
        tracing::warn!(source = %source.describe(), "a read connection is dropped after a poisoning error");
        *conn = None;
    }
    Ok(())
}
