//! `StorageActor`: the one thread of this process that writes the database (reads run on read-only
//! connections of their own, never queued behind writes).
//!
//! Owns the backend ([`SqliteStore`], [`PgStore`] or [`MemoryStore`]) on a dedicated thread (opened there:
//! the synchronous PostgreSQL client must not block inside a caller's async runtime), so every storage
//! transaction of the process runs in order — like a Durable Object's input gate. Messages are jobs: each
//! runs exactly one backend method, and each backend method is one logical transaction. Callers never see
//! this type; they use [`crate::StorageHandle`].
//!
//! # Design: group commit
//! SQLite has no group commit of its own, and one fsync per message caps durable writes at the disk's
//! commit rate. The actor therefore drains its queue: the messages that arrived while a transaction ran are
//! committed together in the next one — one `BEGIN IMMEDIATE`, a `SAVEPOINT` per message (a failing
//! message rolls back only itself), one `COMMIT`. No reply leaves before that `COMMIT`; if it fails, every
//! message of the group answers the error — unless the backend says the failure was a lost race or a
//! group it rolled back for one message's failure ([`Backend::rerun_alone`], PostgreSQL, SPEC §1.3;
//! PostgreSQL keeps no savepoint per message): nothing of the group landed, so each message runs
//! again as its own transaction and answers after its own commit. A message that lost a race itself runs
//! again alone too, at most [`RERUN_ALONE`] times. Only jobs built with [`job_again`] (an `FnMut` body,
//! every typed method of the handle) run again; a one-shot job answers the error. This needs to see the queue, which an actix `SyncContext`
//! handler cannot (it gets one message at a time), so the actor is a plain thread reading a channel; it is
//! still the single writer, and its mailbox is still the only way in.
//!
//! # Design: a lone writer commits on its own thread
//! With nothing to group a commit with, the hand-off to this thread buys nothing and costs two thread
//! wake-ups (the job's, then its answer's) — on a 2-core VM, a third of a lone run's CPU went to waking
//! threads (issue 29). So a caller may run its job itself ([`Mailbox::try_run_here`]) when this thread is
//! idle and nothing is queued: the same group code under the same lock, so the backend still runs one
//! transaction at a time and every rule above holds. [`crate::StorageHandle`] does so only while its
//! process holds at most one live run ([`crate::StorageHandle::here_when_alone`]): with more, a commit
//! run by an event loop would hold up the others' writes and the group they would have shared. Not on
//! PostgreSQL, whose synchronous client blocks only on its own thread.
//!
//! # Design: a bounded queue
//! The mailbox is a `sync_channel` of [`DEFAULT_QUEUE_CAPACITY`] jobs (configurable through
//! [`crate::StorageOptions`]). A sender never waits for room: a full queue answers
//! [`Error::Unavailable`] at once (transient — the caller retries, SPEC §5.5) and is counted in
//! [`GroupStats::rejected`]. An unbounded queue would only hide an overload until memory ran out, and a
//! blocking one would park async callers' executor threads.
//!
//! Reads do not come here on SQLite (nor on PostgreSQL with a read pool): they run on read-only connections ([`crate::readers`]), so
//! nothing this thread does waits behind a listing or an SSE poll.
//!
//! Invariants:
//! - a job never panics out: a panicking transaction body is caught and answered as
//!   [`Error::Panicked`]; the backend is reopened after a poisoning error;
//! - a backend that failed to open answers `Unavailable` and is reopened on the next message;
//! - a reply is sent only after the transaction that holds its writes has committed;
//! - a write that failed for lack of space marks the actor's [`WriteSpace`] exhausted until a write
//!   commits again (what `/readyz` reports, SPEC §8.1); a read never ends it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc};

use crate::memory::MemoryStore;
use crate::news::Audience;
use crate::postgres::PgStore;
use crate::sqlite::{SqliteStore, Synchronous};
use crate::{Error, Result};

pub use crate::backend::{atomic, Backend};

/// Which backend the actor opens (and reopens after a poisoned connection). Its `Debug` redacts the
/// password a PostgreSQL URL may hold.
#[derive(Clone)]
pub enum BackendSpec {
    Sqlite {
        path: PathBuf,
        synchronous: Synchronous,
    },
    /// PostgreSQL at `url` (SPEC §1.3). `pool` is the number of read connections the handle opens
    /// beside the actor's (its readers, [`crate::readers`]); 0 sends reads to the actor.
    Postgres { url: String, pool: usize },
    /// The memory backend's clones share one state, so a reopened actor sees the same data.
    Memory(MemoryStore),
}

impl std::fmt::Debug for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendSpec::Sqlite { path, synchronous } => f
                .debug_struct("Sqlite")
                .field("path", path)
                .field("synchronous", synchronous)
                .finish(),
            BackendSpec::Postgres { url, pool } => f
                .debug_struct("Postgres")
                .field("url", &crate::redact_url(url))
                .field("pool", pool)
                .finish(),
            BackendSpec::Memory(m) => f.debug_tuple("Memory").field(m).finish(),
        }
    }
}

impl BackendSpec {
    pub fn open(&self) -> Result<Box<dyn Backend>> {
        self.open_for(&Default::default())
    }

    /// [`BackendSpec::open`] for a process whose news listener tells `audience` whether anyone else
    /// hears its notes (PostgreSQL; ignored elsewhere).
    pub fn open_for(&self, audience: &Arc<Audience>) -> Result<Box<dyn Backend>> {
        Ok(match self {
            BackendSpec::Sqlite { path, synchronous } => {
                Box::new(SqliteStore::open(path, *synchronous)?)
            }
            BackendSpec::Postgres { url, .. } => {
                Box::new(PgStore::open_for(url, audience.clone())?)
            }
            BackendSpec::Memory(m) => Box::new(m.clone()),
        })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Sqlite { .. } => "sqlite",
            BackendSpec::Postgres { .. } => "postgres",
            BackendSpec::Memory(_) => "memory",
        }
    }
}

/// Most messages committed in one group.
pub const MAX_GROUP: usize = 64;

/// One message: one backend method, run (and, when the backend asks, run again) on the actor's thread;
/// its answer is sent once the fate of the transaction holding its writes is known.
pub struct Job(Box<dyn Task>);

impl Job {
    /// Run the body (again, when it already ran: only for a job built by [`job_again`]); answers
    /// whether its error poisons the connection. A panicking body answers [`Error::Panicked`].
    pub fn run(&mut self, backend: &mut dyn Backend) -> bool {
        self.0.run(backend)
    }

    /// Send the answer of the last run; `commit_failed` when the group holding its writes did not
    /// commit (an `Ok` then answers `Unavailable`).
    pub fn reply(self, commit_failed: Option<&Error>) {
        self.0.reply(commit_failed)
    }

    /// Answer `error` without running the body (the simulator's failed write).
    pub fn fail(self, error: Error) {
        self.0.fail(error)
    }

    fn rerunnable(&self) -> bool {
        self.0.rerunnable()
    }

    fn error(&self) -> Option<&Error> {
        self.0.error()
    }
}

trait Task: Send {
    fn run(&mut self, backend: &mut dyn Backend) -> bool;
    fn rerunnable(&self) -> bool;
    fn error(&self) -> Option<&Error>;
    fn reply(self: Box<Self>, commit_failed: Option<&Error>);
    fn fail(self: Box<Self>, error: Error);
}

enum Callable<R> {
    Once(Option<Body<R>>),
    Again(BodyAgain<R>),
}

struct Call<R> {
    body: Callable<R>,
    out: Option<Result<R>>,
    reply: tokio::sync::oneshot::Sender<Result<R>>,
}

impl<R: Send + 'static> Task for Call<R> {
    fn run(&mut self, backend: &mut dyn Backend) -> bool {
        let out = catch_unwind(AssertUnwindSafe(|| match &mut self.body {
            Callable::Once(body) => match body.take() {
                Some(body) => body(backend),
                None => Err(Error::Unavailable(
                    "a one-shot storage message cannot run twice".into(),
                )),
            },
            Callable::Again(body) => body(backend),
        }))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Panicked(what))
        });
        let poisoned = out.as_ref().err().is_some_and(Error::poisons_connection);
        self.out = Some(out);
        poisoned
    }

    fn rerunnable(&self) -> bool {
        matches!(self.body, Callable::Again(_))
    }

    fn error(&self) -> Option<&Error> {
        self.out.as_ref().and_then(|o| o.as_ref().err())
    }

    fn reply(self: Box<Self>, commit_failed: Option<&Error>) {
        // The body goes before the answer: what it holds until its job is done with (an
        // [`InboxWritten`]) has acted when the caller sees the answer.
        let Call { body, out, reply } = *self;
        drop(body);
        let out =
            out.unwrap_or_else(|| Err(Error::Unavailable("the storage message never ran".into())));
        let out = match (commit_failed, out) {
            (Some(e), Ok(_)) => Err(Error::Unavailable(format!("group commit failed: {e}"))),
            (_, out) => out,
        };
        let _ = reply.send(out);
    }

    fn fail(self: Box<Self>, error: Error) {
        let Call { body, reply, .. } = *self;
        drop(body);
        let _ = reply.send(Err(error));
    }
}

/// Whether the storage thread's writes find space (SPEC §8.1: `/readyz` answers 503 and `/healthz` says
/// `storage: "degraded"` while they do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteSpace {
    /// No write failed for lack of space since the last write that committed (or ever).
    Available,
    /// The last write that ended failed for lack of space ([`Error::is_no_space`]: `SQLITE_FULL`,
    /// PostgreSQL's `53100 disk_full`); the next transaction that writes and commits ends it.
    Exhausted,
}

/// What this process knows of writes to runs' inboxes, so a run can skip an inbox read that cannot find
/// anything new (issue 29: a read is a thread hop, and on PostgreSQL a round trip). `epoch` moves
/// after every inbox write of this process (when the write's job is done with, so after its commit:
/// [`InboxWatch::after_write`]) and whenever another process may have written one: after a group,
/// when the backend's [`Backend::inbox_version`] moved (SQLite: `data_version`, another connection's
/// commit; memory: the shared store's inbox writes), or at a cross-host note ([`crate::news`]). A
/// reader that loaded the epoch before its read and finds it unchanged knows that read is still the
/// inbox's state; another process's write is seen at the latest after this process's next write.
#[derive(Debug)]
pub struct InboxWatch {
    epoch: AtomicU64,
    /// The backend's last [`Backend::inbox_version`] (`u64::MAX`: none yet).
    version: AtomicU64,
}

impl Default for InboxWatch {
    fn default() -> Self {
        InboxWatch {
            epoch: AtomicU64::new(0),
            version: AtomicU64::new(u64::MAX),
        }
    }
}

impl InboxWatch {
    pub fn epoch(&self) -> u64 {
        self.epoch.load(SeqCst)
    }

    /// Some inbox may have changed.
    pub fn bump(&self) {
        self.epoch.fetch_add(1, SeqCst);
    }

    /// The backend answered `version` after a job: a move (or no answer) is a possible inbox write.
    pub fn saw(&self, version: Option<u64>) {
        match version {
            Some(v) if self.version.swap(v, SeqCst) == v => {}
            _ => self.bump(),
        }
    }

    /// A guard for an inbox-writing job's body: it moves the epoch when dropped, that is when the job
    /// that owns the body is done with — after its commit (or its failure) and before its answer goes
    /// out. Only for bodies kept until then ([`job_again`]; a [`job`] drops its body as it runs).
    pub fn after_write(self: &Arc<Self>) -> InboxWritten {
        InboxWritten {
            watch: self.clone(),
            wrote: AtomicBool::new(true),
        }
    }
}

/// See [`InboxWatch::after_write`].
pub struct InboxWritten {
    watch: Arc<InboxWatch>,
    /// Whether the body's last run may have written an inbox row (an error may hide a commit).
    wrote: AtomicBool,
}

impl InboxWritten {
    /// What the body's run answered: an answer that wrote no inbox row moves nothing.
    pub fn answered<T>(&self, out: &Result<T>, wrote: impl FnOnce(&T) -> bool) {
        self.wrote.store(out.as_ref().map_or(true, wrote), SeqCst);
    }
}

impl Drop for InboxWritten {
    fn drop(&mut self) {
        if self.wrote.load(SeqCst) {
            self.watch.bump();
        }
    }
}

/// The [`WriteSpace`] of one storage actor: set by its thread after each group, read by every clone of
/// the handle. One flag that guards no other data, hence an atomic with `SeqCst` and no lock.
#[derive(Debug, Default)]
pub struct SpaceWatch {
    exhausted: AtomicBool,
}

impl SpaceWatch {
    pub fn get(&self) -> WriteSpace {
        if self.exhausted.load(SeqCst) {
            WriteSpace::Exhausted
        } else {
            WriteSpace::Available
        }
    }

    fn set(&self, space: WriteSpace) {
        let exhausted = space == WriteSpace::Exhausted;
        if self.exhausted.swap(exhausted, SeqCst) != exhausted {
            if exhausted {
                tracing::error!(
                    "storage writes fail for lack of space; readiness fails until a write commits"
                );
            } else {
                tracing::warn!("storage writes commit again after running out of space");
            }
        }
    }
}

/// Default capacity of the storage actor's queue (messages waiting for the write thread).
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// Counters of the storage actor and its readers, shared by every clone of the handle; a metrics
/// page reads them with `Relaxed` loads (each counter is independent, none guards data).
#[derive(Debug, Default)]
pub struct GroupStats {
    /// Transactions that carried more than one message.
    pub groups: AtomicU64,
    /// Messages committed inside those transactions.
    pub grouped_messages: AtomicU64,
    /// Groups that did not commit and whose messages ran again one by one: a lost race, or on
    /// PostgreSQL a group spoiled by one message's failure.
    pub rerun_groups: AtomicU64,
    /// Messages refused at once because the actor's queue was full (each answered `Unavailable`).
    pub rejected: AtomicU64,
    /// Messages waiting in the actor's queue right now.
    pub queued: AtomicU64,
    /// Messages run on their caller's thread, the storage thread idle ([`Mailbox::try_run_here`]).
    pub here: AtomicU64,
    /// Reads answered on a read-only connection (never queued behind writes).
    pub pooled_reads: AtomicU64,
    /// Reads refused at once because the readers' queue was full (each answered `Unavailable`).
    pub reads_rejected: AtomicU64,
    /// Reads waiting in the readers' queue right now.
    pub reads_queued: AtomicU64,
    /// Reads run on their caller's thread, no read queued ([`crate::readers::ReadPool::try_run_here`]).
    pub reads_here: AtomicU64,
    /// Reads a reader handed to the actor because it could not open its connection (a database not
    /// created or migrated yet).
    pub reads_on_actor: AtomicU64,
}

/// Why a job could not be queued; the job comes back so the caller may route it elsewhere.
pub enum SendError {
    /// The queue is at capacity (counted); nothing waited.
    Full(Job),
    /// The thread behind the queue is gone.
    Gone(Job),
}

impl std::fmt::Debug for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Full(_) => "Full",
            SendError::Gone(_) => "Gone",
        })
    }
}

impl SendError {
    /// What the caller answers: both are transient ([`Error::is_transient`]).
    pub fn into_error(self, what: &str) -> Error {
        match self {
            SendError::Full(_) => Error::Unavailable(format!("the {what} queue is full")),
            SendError::Gone(_) => Error::Unavailable(format!("the {what} is gone")),
        }
    }
}

/// The sending side of the actor's mailbox; cheap to clone. Dropping every clone stops the actor.
#[derive(Clone)]
pub struct Mailbox {
    /// Bounded (see the module doc): a sender never blocks.
    tx: mpsc::SyncSender<Job>,
    pub stats: Arc<GroupStats>,
    /// Whether the actor's last write found space.
    pub space: Arc<SpaceWatch>,
    /// What this process knows of inbox writes.
    pub inbox: Arc<InboxWatch>,
    /// The actor itself, for [`Mailbox::try_run_here`]; `None` where a job cannot run on its caller's
    /// thread (PostgreSQL, whose synchronous client blocks only on its own thread; a detached mailbox).
    here: Option<Arc<std::sync::Mutex<StorageActor>>>,
}

impl Mailbox {
    /// Run `job` on the calling thread, as a transaction of its own answered before this returns, when
    /// the storage thread is idle with nothing queued; else give it back (to be queued). The same
    /// [`StorageActor::run_group`] as the thread's, under the lock the thread holds for each group, so
    /// the backend still runs one transaction at a time. What it saves is the hand-off — two thread
    /// wake-ups a commit — which is all a lone writer's commit could gain from the thread: there is
    /// nothing to group it with (issue 29). A caller that blocks here blocks its thread for one commit.
    pub fn try_run_here(&self, job: Job) -> std::result::Result<(), Job> {
        let Some(actor) = &self.here else {
            return Err(job);
        };
        if self.stats.queued.load(SeqCst) != 0 {
            return Err(job);
        }
        let mut actor = match actor.try_lock() {
            Ok(actor) => actor,
            // As the thread does: a poisoned lock still guards a valid actor.
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(job),
        };
        self.stats.here.fetch_add(1, Relaxed);
        actor.run_group(vec![job]);
        Ok(())
    }

    /// Queue `job`; `false` when the actor is gone or its queue is full (then counted).
    pub fn send(&self, job: Job) -> bool {
        self.try_send(job).is_ok()
    }

    /// Queue `job` without waiting: a full queue is [`SendError::Full`] (counted in
    /// [`GroupStats::rejected`]), a stopped actor [`SendError::Gone`].
    pub fn try_send(&self, job: Job) -> std::result::Result<(), SendError> {
        self.stats.queued.fetch_add(1, Relaxed);
        match self.tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.stats.queued.fetch_sub(1, Relaxed);
                Err(match e {
                    mpsc::TrySendError::Full(job) => {
                        self.stats.rejected.fetch_add(1, Relaxed);
                        SendError::Full(job)
                    }
                    mpsc::TrySendError::Disconnected(job) => SendError::Gone(job),
                })
            }
        }
    }
}

/// The body of one transaction: one backend method call.
pub type Body<R> = Box<dyn FnOnce(&mut dyn Backend) -> Result<R> + Send>;

/// A body that may run again: the actor re-runs it alone when its group lost a race at `COMMIT`, or
/// when it lost one itself ([`Backend::rerun_alone`]).
pub type BodyAgain<R> = Box<dyn FnMut(&mut dyn Backend) -> Result<R> + Send>;

/// Build a job from a transaction body and the channel its result goes back on; it runs once.
pub fn job<R: Send + 'static>(
    body: Body<R>,
    reply: tokio::sync::oneshot::Sender<Result<R>>,
) -> Job {
    Job(Box::new(Call {
        body: Callable::Once(Some(body)),
        out: None,
        reply,
    }))
}

/// Build a job the actor may run again alone after a lost race.
pub fn job_again<R: Send + 'static>(
    body: BodyAgain<R>,
    reply: tokio::sync::oneshot::Sender<Result<R>>,
) -> Job {
    Job(Box::new(Call {
        body: Callable::Again(body),
        out: None,
        reply,
    }))
}

/// How often the actor runs one message again alone after it lost a race (on top of the backend's own
/// retries of a single transaction).
pub const RERUN_ALONE: usize = 3;

/// The actor's state: the backend (or why it could not be opened) and how to reopen it.
pub struct StorageActor {
    spec: BackendSpec,
    backend: std::result::Result<Box<dyn Backend>, String>,
    stats: Arc<GroupStats>,
    space: Arc<SpaceWatch>,
    inbox: Arc<InboxWatch>,
    audience: Arc<Audience>,
}

impl StorageActor {
    pub fn new(spec: BackendSpec, inbox: Arc<InboxWatch>, audience: Arc<Audience>) -> Self {
        let backend = Self::open(&spec, &audience);
        StorageActor {
            spec,
            backend,
            stats: Default::default(),
            space: Default::default(),
            inbox,
            audience,
        }
    }

    fn open(
        spec: &BackendSpec,
        audience: &Arc<Audience>,
    ) -> std::result::Result<Box<dyn Backend>, String> {
        spec.open_for(audience).map_err(|e| {
            tracing::error!(error = %e, "failed to open storage backend");
            e.to_string()
        })
    }

    /// Run one group of jobs: one transaction when there are several and the backend groups.
    fn run_group(&mut self, jobs: Vec<Job>) {
        if self.backend.is_err() {
            self.backend = Self::open(&self.spec, &self.audience);
        }
        let backend = match &mut self.backend {
            Ok(b) => b,
            Err(why) => {
                // Dropping a job drops its reply channel: the caller answers `Unavailable`.
                tracing::warn!(error = %why, messages = jobs.len(), "storage unavailable");
                return;
            }
        };
        let grouped = jobs.len() > 1
            && match backend.begin_group() {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(error = %e, "could not begin a group commit; committing one by one");
                    false
                }
            };
        let writes_before = backend.writes();
        let mut poisoned = false;
        let mut jobs = jobs;
        for j in &mut jobs {
            poisoned |= j.run(backend.as_mut());
        }
        let mut commit_failed = if grouped {
            backend.end_group(true).err()
        } else {
            None
        };
        if grouped && commit_failed.is_none() {
            self.stats.groups.fetch_add(1, Relaxed);
            self.stats
                .grouped_messages
                .fetch_add(jobs.len() as u64, Relaxed);
        }
        if let Some(e) = &commit_failed {
            poisoned |= e.poisons_connection();
            if backend.rerun_alone(e) && !poisoned && jobs.iter().all(Job::rerunnable) {
                // SPEC §1.3: the group lost a race at COMMIT, or was rolled back for one message's
                // failure (PostgreSQL); nothing of it landed. Each message runs again as its own
                // transaction, and answers after its own commit.
                self.stats.rerun_groups.fetch_add(1, Relaxed);
                if e.is_race() {
                    tracing::warn!(error = %e, messages = jobs.len(), "group commit lost a race; running its messages one by one");
                } else {
                    tracing::debug!(error = %e, messages = jobs.len(), "group rolled back; running its messages one by one");
                }
                for j in &mut jobs {
                    poisoned |= j.run(backend.as_mut());
                }
                commit_failed = None;
            } else {
                tracing::error!(error = %e, messages = jobs.len(), "group commit failed");
            }
        }
        if commit_failed.is_none() && !poisoned {
            // A message that lost a race itself (its savepoint, or its own transaction, rolled back)
            // runs again alone, a few times, before its race answers as a transient error.
            for j in &mut jobs {
                for _ in 0..RERUN_ALONE {
                    if !(j.rerunnable() && j.error().is_some_and(|e| backend.rerun_alone(e))) {
                        break;
                    }
                    poisoned |= j.run(backend.as_mut());
                }
            }
        }
        // SPEC §8.1: a write that failed for lack of space fails readiness until a write commits again
        // (a failure in the group outweighs its other messages' commit).
        let no_space = commit_failed.as_ref().is_some_and(Error::is_no_space)
            || jobs
                .iter()
                .any(|j| j.error().is_some_and(Error::is_no_space));
        if no_space {
            self.space.set(WriteSpace::Exhausted);
        } else if commit_failed.is_none() && backend.writes() != writes_before {
            self.space.set(WriteSpace::Available);
        }
        // Before the replies: whoever reads the inbox after one of them knows of any foreign write so far.
        self.inbox.saw(backend.inbox_version());
        for j in jobs {
            j.reply(commit_failed.as_ref());
        }
        if poisoned {
            tracing::error!("storage backend reopens after a poisoning error");
            self.backend = Self::open(&self.spec, &self.audience);
        }
    }
}

/// A mailbox no thread serves: its jobs arrive on the returned receiver, and whoever holds it runs each
/// ([`Job::run`] on a backend, then [`Job::reply`]) when it chooses. The simulator's storage: it decides
/// when every call of the production shell lands, fails or never answers.
pub fn detached(capacity: usize) -> (Mailbox, mpsc::Receiver<Job>) {
    let (tx, rx) = mpsc::sync_channel::<Job>(capacity.max(1));
    let mailbox = Mailbox {
        tx,
        stats: Default::default(),
        space: Default::default(),
        inbox: Default::default(),
        here: None,
    };
    (mailbox, rx)
}

/// Start the storage actor on its own thread with a queue of [`DEFAULT_QUEUE_CAPACITY`]; answers its
/// mailbox.
pub fn start(spec: BackendSpec) -> Mailbox {
    start_with_capacity(spec, DEFAULT_QUEUE_CAPACITY, Default::default())
}

/// Start the storage actor on its own thread with a queue of `capacity` messages (at least 1); its
/// PostgreSQL connection asks `audience` whether to send its notes.
pub fn start_with_capacity(spec: BackendSpec, capacity: usize, audience: Arc<Audience>) -> Mailbox {
    let (tx, rx) = mpsc::sync_channel::<Job>(capacity.max(1));
    // The backend opens on the storage thread — the synchronous PostgreSQL client refuses to block
    // inside a caller's async runtime — and this waits for it, so a caller finds the database created
    // and migrated (or the failure logged) when `start` returns, as before.
    let inbox = Arc::new(InboxWatch::default());
    let watch = inbox.clone();
    let (opened_tx, opened) = mpsc::sync_channel::<(
        Arc<GroupStats>,
        Arc<SpaceWatch>,
        Arc<std::sync::Mutex<StorageActor>>,
    )>(1);
    let here = !matches!(spec, BackendSpec::Postgres { .. });
    std::thread::Builder::new()
        .name("storage-actor".into())
        .spawn(move || {
            let actor = StorageActor::new(spec, watch, audience);
            let (stats, space) = (actor.stats.clone(), actor.space.clone());
            // Locked for each group, and by a caller running a job of its own ([`Mailbox::try_run_here`]).
            let actor = Arc::new(std::sync::Mutex::new(actor));
            let _ = opened_tx.send((stats.clone(), space, actor.clone()));
            while let Ok(first) = rx.recv() {
                let mut jobs = vec![first];
                while jobs.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(j) => jobs.push(j),
                        Err(_) => break,
                    }
                }
                stats.queued.fetch_sub(jobs.len() as u64, Relaxed);
                actor
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .run_group(jobs);
            }
        })
        .expect("spawn the storage thread");
    let (stats, space, actor) = opened.recv().expect("the storage thread opens its backend");
    Mailbox {
        tx,
        stats,
        space,
        inbox,
        here: here.then_some(actor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_epoch_moves_when_the_backend_version_moves_or_cannot_be_read() {
        let w = InboxWatch::default();
        w.saw(Some(7)); // the first answer: nothing was known before it
        let e = w.epoch();
        w.saw(Some(7));
        assert_eq!(w.epoch(), e, "the same version: no other connection wrote");
        w.saw(Some(8));
        assert_eq!(w.epoch(), e + 1);
        w.saw(None);
        assert_eq!(w.epoch(), e + 2, "no answer counts as a move");
    }

    #[test]
    fn an_inbox_write_moves_the_epoch_once_its_job_is_done_with_unless_it_wrote_none() {
        let w = Arc::new(InboxWatch::default());
        let e = w.epoch();
        let wrote = w.after_write();
        wrote.answered(&Ok(true), |w| *w);
        assert_eq!(w.epoch(), e, "not before the job is done with (its commit)");
        drop(wrote);
        assert_eq!(w.epoch(), e + 1);

        let none = w.after_write();
        none.answered(&Ok(false), |w| *w);
        drop(none);
        assert_eq!(w.epoch(), e + 1, "an answer that wrote no inbox row");

        let failed = w.after_write();
        failed.answered::<bool>(&Err(Error::Unavailable("lost".into())), |w| *w);
        drop(failed);
        assert_eq!(w.epoch(), e + 2, "an error may hide a commit");
    }
}
