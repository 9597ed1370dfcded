//! `StorageHandle`: the async face of the storage actor and its readers.
//!
//! Cheap to clone; every method sends one job and awaits its answer. Writes (and every method of the
//! memory backend) go to the storage actor's queue; reads go to the readers' queue ([`crate::readers`]:
//! SQLite, and PostgreSQL with a read pool), so a heartbeat or a step never waits behind a list or an SSE
//! poll (SPEC §1.2). A lone run's calls skip the queues when nothing waits in them and run on the caller's
//! thread ([`StorageHandle::here_when_alone`]). Both queues are bounded: a full one, a closed one or a dropped message becomes
//! [`Error::Unavailable`] at once (transient: the caller retries), never a panic and never a wait. The
//! handle stamps `now_ms` from its injected [`Clock`], so time is the handle's, not a database thread's.
//!
//! A read sees everything committed before it began: a caller that holds the answer of a write sees
//! that write in its next read (the actor answers only after `COMMIT`). Two calls issued concurrently
//! without awaiting the first are not ordered.

use crate::RunId;
use std::sync::Arc;

use crate::actor::{atomic, Backend, BackendSpec, Mailbox, WriteSpace};
use crate::clock::Clock;
use crate::ledger::{
    Admit, AdmitOutcome, Claimed, GenerationInfo, HandoffResult, HeartbeatAnswer, InboxItem,
    LiveRow, Outcome, Promotion, PruneReport, ReclaimAnswer, Refusal, StepRecord, StepWrite,
    StopAnswer, StopMode, Successor, TableRows, Turn,
};
use crate::readers::{ReadPool, ReadSource};
use crate::record::{RunListItem, RunRecord, RunStatus};
use crate::store::{EventsPage, ListPage, ListQuery, PolicyProposal, PutOutcome};
use crate::{Error, Result};

mod composite;
mod plans;
#[cfg(any(test, feature = "test-hooks"))]
mod testing;
pub use composite::finish_in;
use composite::{admit_successor, seal_in};

/// How a [`StorageHandle`] sizes its queues and readers, and how long receipts live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageOptions {
    /// Capacity of the storage actor's queue; a full queue answers `Unavailable` at once.
    pub queue_capacity: usize,
    /// Reader threads, each with a read-only connection (SQLite; PostgreSQL takes its `pool` from
    /// [`BackendSpec::Postgres`]); 0 sends reads to the actor.
    pub readers: usize,
    /// Capacity of the readers' shared queue.
    pub read_queue_capacity: usize,
    /// How long a receipt answers retries after its run ended (`[ledger] receipt_ttl_ms`), used by
    /// [`StorageHandle::prune_dead`].
    pub receipt_ttl_ms: i64,
}

impl Default for StorageOptions {
    fn default() -> Self {
        StorageOptions {
            queue_capacity: crate::actor::DEFAULT_QUEUE_CAPACITY,
            readers: crate::readers::DEFAULT_READERS,
            read_queue_capacity: crate::readers::DEFAULT_READ_QUEUE_CAPACITY,
            receipt_ttl_ms: crate::ledger::DEFAULT_RECEIPT_TTL_MS,
        }
    }
}

#[derive(Clone)]
pub struct StorageHandle {
    mailbox: Mailbox,
    /// The readers (SQLite with `readers > 0`); `None`: reads go to the actor like writes.
    readers: Option<ReadPool>,
    clock: Arc<dyn Clock>,
    kind: &'static str,
    receipt_ttl_ms: i64,
    /// Cross-host news (PostgreSQL); `None` for SQLite and memory, whose readers poll.
    news: Option<Arc<crate::news::NewsFeed>>,
    /// Fault injection (tests, `chaos`): while set, every call answers `Unavailable` without reaching
    /// the storage thread — what a full disk or a dead database looks like to callers. Shared by clones.
    outage: Arc<std::sync::atomic::AtomicBool>,
    /// Where the next [`StorageHandle::expire`]'s orphan scan starts; shared by clones.
    expire_after: Arc<std::sync::Mutex<String>>,
    /// Tests: the next `finishing` commits, then its answer is lost and an outage begins.
    #[cfg(any(test, feature = "test-hooks"))]
    lose_finishing: Arc<std::sync::atomic::AtomicBool>,
    /// The live runs of this process, when writes may run on their caller's thread while there is at
    /// most one ([`StorageHandle::here_when_alone`]).
    alone: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl std::fmt::Debug for StorageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageHandle")
            .field("kind", &self.kind)
            .finish()
    }
}

impl StorageHandle {
    /// Start a storage actor for `spec` on its own thread (and, for SQLite, its readers) with the
    /// default [`StorageOptions`].
    pub fn start(spec: BackendSpec, clock: Arc<dyn Clock>) -> Self {
        Self::start_with(spec, clock, StorageOptions::default())
    }

    /// Start a storage actor for `spec` on its own thread and, for SQLite with `options.readers > 0`,
    /// its reader threads. Readers open their connections on first use.
    pub fn start_with(spec: BackendSpec, clock: Arc<dyn Clock>, options: StorageOptions) -> Self {
        let kind = spec.kind();
        let source = match &spec {
            BackendSpec::Sqlite { path, .. } if options.readers > 0 => {
                Some((ReadSource::Sqlite(path.clone()), options.readers))
            }
            BackendSpec::Postgres { url, pool } if *pool > 0 => {
                Some((ReadSource::Postgres(url.clone()), *pool))
            }
            _ => None,
        };
        let news = match &spec {
            BackendSpec::Postgres { url, .. } => Some(crate::news::NewsFeed::postgres(url.clone())),
            _ => None,
        };
        let audience = news
            .as_ref()
            .map_or_else(Default::default, |feed| feed.audience());
        let mailbox = crate::actor::start_with_capacity(spec, options.queue_capacity, audience);
        if let Some(feed) = &news {
            feed.feed_inbox(mailbox.inbox.clone());
        }
        let readers = source.map(|(source, n)| {
            ReadPool::start(source, n, options.read_queue_capacity, mailbox.clone())
        });
        StorageHandle {
            mailbox,
            readers,
            clock,
            kind,
            receipt_ttl_ms: options.receipt_ttl_ms,
            news,
            outage: Default::default(),
            expire_after: Default::default(),
            #[cfg(any(test, feature = "test-hooks"))]
            lose_finishing: Default::default(),
            alone: None,
        }
    }

    /// This handle (and its clones from here on) runs a call on its caller's thread when `live_runs`
    /// — the runs this process holds live, kept by its registry — is at most one: a write when the
    /// storage thread is idle with nothing queued ([`crate::actor::Mailbox::try_run_here`]), a read
    /// when no read is queued and the readers' spare connection is free
    /// ([`crate::readers::ReadPool::try_run_here`]). A lone run's commits and point reads then cost
    /// no thread hand-off; a caller blocks its thread for that call.
    pub fn here_when_alone(mut self, live_runs: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        self.alone = Some(live_runs);
        self
    }

    /// A handle on a [`crate::actor::detached`] mailbox: no storage thread, no readers; every call waits
    /// until the receiver's holder runs its job. `kind` is what [`StorageHandle::kind`] answers.
    pub fn on_mailbox(mailbox: Mailbox, clock: Arc<dyn Clock>, kind: &'static str) -> Self {
        StorageHandle {
            mailbox,
            readers: None,
            clock,
            kind,
            receipt_ttl_ms: crate::ledger::DEFAULT_RECEIPT_TTL_MS,
            news: None,
            outage: Default::default(),
            expire_after: Default::default(),
            #[cfg(any(test, feature = "test-hooks"))]
            lose_finishing: Default::default(),
            alone: None,
        }
    }

    /// Whether the backend has cross-host news (other hosts follow this one's writes as they commit).
    pub fn has_news(&self) -> bool {
        self.news.is_some()
    }

    /// Every note of cross-host news from now on (SPEC §1.3), or `None` when the backend has none
    /// (SQLite, memory: poll instead). The first call starts the listener, which says
    /// [`crate::News::Resync`] once it listens.
    pub fn news(&self) -> Option<tokio::sync::broadcast::Receiver<crate::News>> {
        self.news.as_ref().map(crate::news::NewsFeed::subscribe)
    }

    /// Whether this handle's commits send their notes now (`None`: no news; tests).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn heard(&self) -> Option<bool> {
        self.news.as_ref().map(|feed| feed.audience().is_heard())
    }

    /// Start (`true`) or end an injected outage: meanwhile every call answers `Unavailable`.
    pub fn inject_outage(&self, on: bool) {
        self.outage.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Tests: the next `finishing` commits, but its caller is told storage went away, and an injected
    /// outage begins at once (a connection lost after its COMMIT).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn inject_lost_finishing(&self) {
        self.lose_finishing
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the storage thread's last write that ended found space: [`WriteSpace::Exhausted`] from a
    /// write that failed for lack of space (a full disk, `SQLITE_FULL`, PostgreSQL's `53100 disk_full`)
    /// until the next write that commits (SPEC §8.1: the health probes report it). Reads succeed on a
    /// full disk, so a round trip alone ([`StorageHandle::ping`]) cannot tell.
    pub fn write_space(&self) -> WriteSpace {
        self.mailbox.space.get()
    }

    /// Counters of the storage actor (group commits, queue depth and refusals) and of its readers.
    pub fn group_stats(&self) -> &crate::actor::GroupStats {
        &self.mailbox.stats
    }

    /// The receipt TTL [`StorageHandle::prune_dead`] applies.
    pub fn receipt_ttl_ms(&self) -> i64 {
        self.receipt_ttl_ms
    }

    /// `"sqlite"`, `"postgres"` or `"memory"`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Run `f` as one transaction on the storage thread, with the handle's `now_ms`. The actor may run
    /// it again alone after a lost race (PostgreSQL, [`Backend::rerun_alone`]), hence `FnMut`.
    async fn transact<R, F>(&self, mut f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnMut(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        if self.outage.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable("injected outage".into()));
        }
        let now = self.clock.now_ms();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let body: crate::actor::BodyAgain<R> = Box::new(move |b: &mut dyn Backend| f(b, now));
        self.send(crate::actor::job_again(body, tx), rx).await
    }

    /// `job` run on the caller's thread by `here` while this process holds at most one live run
    /// ([`StorageHandle::here_when_alone`]); else, or when `here` gives it back, the job to queue.
    fn run_here_if_alone(
        &self,
        job: crate::actor::Job,
        here: impl FnOnce(crate::actor::Job) -> std::result::Result<(), crate::actor::Job>,
    ) -> Option<crate::actor::Job> {
        let alone = self
            .alone
            .as_ref()
            .is_some_and(|live| live.load(std::sync::atomic::Ordering::SeqCst) <= 1);
        if alone {
            here(job).err()
        } else {
            Some(job)
        }
    }

    async fn send<R>(
        &self,
        job: crate::actor::Job,
        rx: tokio::sync::oneshot::Receiver<Result<R>>,
    ) -> Result<R> {
        if let Some(job) = self.run_here_if_alone(job, |job| self.mailbox.try_run_here(job)) {
            if let Err(e) = self.mailbox.try_send(job) {
                return Err(e.into_error("storage actor"));
            }
        }
        rx.await
            .map_err(|_| Error::Unavailable("the storage actor dropped the message".into()))?
    }

    /// Run the read `f` on a reader's read-only connection, with the handle's `now_ms`; on the actor
    /// when there are no readers (the memory backend). `f` must only read: a reader's connection
    /// refuses writes.
    async fn read<R, F>(&self, mut f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnMut(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        let Some(readers) = &self.readers else {
            return self.transact(f).await;
        };
        if self.outage.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable("injected outage".into()));
        }
        let now = self.clock.now_ms();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let body: crate::actor::BodyAgain<R> = Box::new(move |b: &mut dyn Backend| f(b, now));
        let job = crate::actor::job_again(body, tx);
        if let Some(job) = self.run_here_if_alone(job, |job| readers.try_run_here(job)) {
            if let Err(e) = readers.try_send(job) {
                return Err(e.into_error("storage readers"));
            }
        }
        rx.await
            .map_err(|_| Error::Unavailable("the storage readers dropped the message".into()))?
    }

    /// A no-op round trip: answers whether the storage thread is alive and its backend open.
    pub async fn ping(&self) -> Result<()> {
        self.transact(|b, _| b.policy().map(|_| ())).await
    }

    pub async fn put(
        &self,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
    ) -> Result<PutOutcome> {
        self.transact(move |b, now| b.put(&record, proposal.as_ref(), now))
            .await
    }

    pub async fn get(&self, id: RunId) -> Result<Option<RunRecord>> {
        self.read(move |b, now| b.get(&id, now)).await
    }

    pub async fn get_summary(&self, id: RunId) -> Result<Option<RunListItem>> {
        self.read(move |b, now| b.get_summary(&id, now)).await
    }

    pub async fn list(&self, query: ListQuery) -> Result<ListPage> {
        self.read(move |b, now| b.list(&query, now)).await
    }

    pub async fn events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: Option<usize>,
    ) -> Result<Option<EventsPage>> {
        self.read(move |b, now| b.events(&id, after_seq, limit, now))
            .await
    }

    pub async fn delete(&self, id: RunId) -> Result<bool> {
        self.transact(move |b, _| b.delete(&id)).await
    }

    /// Retention with no write ([`RunStore::expire`](crate::store::RunStore::expire)), one pass: the
    /// orphan scan carries on where this handle's previous pass stopped.
    pub async fn expire(&self) -> Result<crate::store::Expired> {
        let after = self
            .expire_after
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let out = self.transact(move |b, now| b.expire(now, &after)).await?;
        *self.expire_after.lock().unwrap_or_else(|p| p.into_inner()) =
            out.scan_after.clone().unwrap_or_default();
        Ok(out)
    }

    /// The orphan sweep's worklist (SPEC §12, [`RunStore::open_cards`](crate::store::RunStore::open_cards)):
    /// ids of visible final records whose card waits for its closing frame, finished at or before
    /// `finished_before`, oldest first, at most `limit` (clamped to `1..=100`). A read.
    pub async fn open_cards(&self, finished_before: i64, limit: usize) -> Result<Vec<RunId>> {
        self.read(move |b, now| b.open_cards(finished_before, limit, now))
            .await
    }

    /// Mark `id`'s card closed ([`RunStore::close_card`](crate::store::RunStore::close_card)); answers
    /// whether a record with an open card changed.
    pub async fn close_card(&self, id: RunId) -> Result<bool> {
        self.transact(move |b, _| b.close_card(&id)).await
    }

    // ---- the live-run ledger (SPEC §4.3); each call is one transaction on the storage thread ----

    pub async fn record_generation(&self, info: GenerationInfo) -> Result<()> {
        self.transact(move |b, _| b.record_generation(&info)).await
    }

    pub async fn generations(&self) -> Result<Vec<GenerationInfo>> {
        self.read(|b, _| b.generations()).await
    }

    /// Admit at `now_ms` (the caller's clock reading, so the run's `startedAt` is the same everywhere).
    pub async fn admit(&self, admit: Admit, now_ms: i64) -> Result<AdmitOutcome> {
        let written = self.mailbox.inbox.after_write();
        self.transact(move |b, _| {
            let out = b.admit(&admit, now_ms);
            written.answered(&out, AdmitOutcome::wrote_inbox);
            out
        })
        .await
    }

    /// Moves whenever a run's inbox may have changed since ([`crate::actor::InboxWatch`]): a run that
    /// loaded it before its last inbox read and finds it unchanged has nothing new to read.
    pub fn inbox_epoch(&self) -> u64 {
        self.mailbox.inbox.epoch()
    }

    pub async fn claim(
        &self,
        run_id: RunId,
        gen: String,
        promotion: Promotion,
    ) -> Result<Outcome<Claimed>> {
        self.transact(move |b, now| b.claim(&run_id, &gen, &promotion, now))
            .await
    }

    pub async fn append(
        &self,
        run_id: RunId,
        gen: String,
        events: Vec<serde_json::Value>,
    ) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.append(&run_id, &gen, &events))
            .await
    }

    /// A step's transcript turns, its events (the `input` events of the follow-ups it consumed, its own
    /// `assistant` event) and then its step record, committed together: the record is never durable
    /// without its turns and events, and the step costs one commit (SPEC §4.3 `step`).
    pub async fn durable_step(
        &self,
        run_id: RunId,
        gen: String,
        first_idx: u64,
        turns: Vec<Turn>,
        record: StepRecord,
        events: Vec<serde_json::Value>,
    ) -> Result<Outcome<()>> {
        let write = StepWrite {
            first_idx,
            turns,
            record,
            events,
            state: Default::default(),
        };
        self.write_step(run_id, gen, std::sync::Arc::new(write))
            .await
    }

    /// [`StorageHandle::durable_step`] of a whole [`StepWrite`] (its state patch included). Shared, so a
    /// retry of the same write costs no copy of its turns and events.
    pub async fn write_step(
        &self,
        run_id: RunId,
        gen: String,
        write: std::sync::Arc<StepWrite>,
    ) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.write_step_atomic(&run_id, &gen, &write))
            .await
    }

    /// Promote the reserved row and write the seed step (SPEC §5.2 steps 4–5, which §5.2 step 3 allows
    /// to share one commit): the run is resumable exactly when its seed is durable. Re-running it after
    /// an uncertain answer is harmless: a re-claim keeps the row, and the same turns rewrite as they were.
    /// A row of this generation that already ran past its seed was not promoted by this launch (another
    /// generation restarted the run meanwhile and this one reclaimed it back): `Fenced`, so a late
    /// launch never runs the request again over that progress ([`crate::ledger::ran_past_its_seed`]).
    pub async fn promote(
        &self,
        run_id: RunId,
        gen: String,
        promotion: Promotion,
        seed: StepWrite,
    ) -> Result<Outcome<Claimed>> {
        self.transact(move |b, now| {
            atomic(
                b,
                |b| {
                    let claimed = match b.claim(&run_id, &gen, &promotion, now)? {
                        Ok(claimed) => claimed,
                        Err(refusal) => return Ok(Err(refusal)),
                    };
                    if crate::ledger::ran_past_its_seed(claimed, b.last_step(&run_id)?.as_ref()) {
                        return Ok(Err(Refusal::Fenced {
                            run_id: run_id.clone(),
                        }));
                    }
                    Ok(b.write_step(&run_id, &gen, &seed)?.map(|()| claimed))
                },
                |out| out.is_ok(),
            )
        })
        .await
    }

    /// Admit at `now_ms`; a run this admission starts gets `events` (its `run_meta` and `input`, seqs 1
    /// and 2), its `tombstone` (the provisional record) and, with `seed`, its promotion and seed step
    /// (which then carries the first events: one write, not two) in the same transaction, so a crash
    /// right after admission never loses them and the run is resumable from its first commit (SPEC §5.2
    /// steps 2–4: one commit, not three; nothing orders them apart). The tombstone goes with the
    /// retention policy the history proposes. A seed the ledger would refuse (a part over
    /// [`crate::ledger::MAX_TRANSCRIPT_PART_BYTES`]) is left out before anything is written, so the run
    /// is admitted unpromoted, as without one; the answer says whether the seed went in.
    pub async fn admit_with_events(
        &self,
        admit: Admit,
        events: Vec<serde_json::Value>,
        tombstone: Option<(RunRecord, Option<PolicyProposal>)>,
        seed: Option<(Promotion, StepWrite)>,
        now_ms: i64,
    ) -> Result<(AdmitOutcome, bool)> {
        let mut seed = seed.filter(|(_, s)| {
            crate::ledger::check_turns(s.first_idx, &s.turns).is_ok()
                && crate::ledger::check_events(&s.events).1.is_none()
        });
        // With a seed, the first events go with its step: one write, not two.
        let mut events = events;
        if let Some((_, step)) = &mut seed {
            step.events.splice(0..0, std::mem::take(&mut events));
        }
        let written = self.mailbox.inbox.after_write();
        self.transact(move |b, _| {
            let out = atomic(
                b,
                |b| {
                    let out = match &tombstone {
                        Some((tombstone, proposal)) => {
                            debug_assert!(
                                tombstone.head.provisional && tombstone.head.id == admit.run_id
                            );
                            b.admit_recorded(&admit, tombstone, proposal.as_ref(), now_ms)?
                        }
                        None => b.admit(&admit, now_ms)?,
                    };
                    if out.started(&admit.run_id) {
                        if !events.is_empty() {
                            b.append(&admit.run_id, &admit.gen, &events)?.map_err(|r| {
                                Error::Unavailable(format!("first events refused: {r}"))
                            })?;
                        }
                        // The row is this transaction's and the seed was checked: neither write is
                        // refused but for a first event the ledger would not take (then nothing of
                        // the admission commits, as when `append` refuses one).
                        if let Some((promotion, seed)) = &seed {
                            let (id, gen) = (&admit.run_id, &admit.gen);
                            b.claim_admitted(id, gen, promotion, now_ms)?.map_err(|r| {
                                Error::Unavailable(format!("promotion refused: {r}"))
                            })?;
                            b.write_step(id, gen, seed)?.map_err(|r| {
                                Error::Unavailable(format!("first events or seed refused: {r}"))
                            })?;
                        }
                        return Ok((out, seed.is_some()));
                    }
                    Ok((out, false))
                },
                |_| true,
            );
            written.answered(&out, |(out, _)| out.wrote_inbox());
            out
        })
        .await
    }

    pub async fn read_transcript(&self, run_id: RunId) -> Result<crate::ledger::Transcript> {
        self.read(move |b, _| b.read_transcript(&run_id)).await
    }

    pub async fn set_state(
        &self,
        run_id: RunId,
        gen: String,
        patch: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.set_state(&run_id, &gen, &patch))
            .await
    }

    pub async fn heartbeat(
        &self,
        run_id: RunId,
        gen: String,
        lease_ms: i64,
    ) -> Result<Outcome<HeartbeatAnswer>> {
        self.transact(move |b, now| b.heartbeat(&run_id, &gen, lease_ms, now))
            .await
    }

    pub async fn request_stop(&self, run_id: RunId, mode: StopMode) -> Result<Outcome<StopAnswer>> {
        self.transact(move |b, now| b.request_stop(&run_id, mode, now))
            .await
    }

    /// Park or resume a run on approvals (SPEC §13): its events (`approval_requested`, or
    /// `approval_decided`) and the owner's phase change with its state patch, in one transaction — a
    /// run never waits on a request nobody can see, and never runs a call whose decision is unrecorded.
    pub async fn change_phase(
        &self,
        run_id: RunId,
        gen: String,
        change: crate::ledger::decisions::PhaseChange,
        events: Vec<serde_json::Value>,
        patch: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Outcome<crate::ledger::Phase>> {
        self.transact(move |b, _| {
            atomic(
                b,
                |b| {
                    if !events.is_empty() {
                        if let Err(refusal) = b.append(&run_id, &gen, &events)? {
                            return Ok(Err(refusal));
                        }
                    }
                    b.set_phase(&run_id, &gen, change, &patch)
                },
                |out| out.is_ok(),
            )
        })
        .await
    }

    /// A person's decision on a call awaiting approval (any process; SPEC §13).
    pub async fn decide(
        &self,
        run_id: RunId,
        call_id: String,
        decided: crate::ledger::Decided,
    ) -> Result<Outcome<crate::ledger::DecideAnswer>> {
        self.transact(move |b, now| b.decide(&run_id, &call_id, &decided, now))
            .await
    }

    pub async fn handoff(
        &self,
        gen: String,
        run_ids: Vec<RunId>,
    ) -> Result<Vec<(RunId, HandoffResult)>> {
        self.transact(move |b, _| b.handoff(&gen, &run_ids)).await
    }

    pub async fn finishing(
        &self,
        run_id: RunId,
        gen: String,
        status: RunStatus,
        answer: Option<String>,
    ) -> Result<Outcome<()>> {
        let answered = self
            .transact(move |b, _| b.finishing(&run_id, &gen, status, answer.as_deref()))
            .await;
        #[cfg(any(test, feature = "test-hooks"))]
        if answered.is_ok()
            && self
                .lose_finishing
                .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            self.inject_outage(true);
            return Err(Error::Unavailable(
                "injected: the answer of a committed finishing was lost".into(),
            ));
        }
        answered
    }

    /// The ledger's finish, and in the same transaction the admission of `successor` for the inbox rows
    /// the run never read (SPEC §5.2 step 8; a close of a reclaimed row passes `inbox_consumed: None`
    /// and relies on the last step record). Whether a successor was admitted shows as its live row.
    pub async fn finish(
        &self,
        gen: String,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
        successor: Option<Successor>,
    ) -> Result<Outcome<PutOutcome>> {
        self.transact(move |b, now| {
            finish_in(b, &gen, &record, proposal.as_ref(), successor.as_ref(), now)
        })
        .await
    }

    /// The last step (when its write was held back), the finishing gate and the finish in one commit,
    /// for a run with no reply to deliver (SPEC §5.2 step 3); nothing lands on a refusal, which
    /// answers. `Ok(true)`: a successor was admitted (its row is live under `gen`).
    #[allow(clippy::too_many_arguments)]
    pub async fn seal(
        &self,
        gen: String,
        step: Option<StepWrite>,
        status: RunStatus,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
        successor: Option<Successor>,
    ) -> Result<Outcome<bool>> {
        self.transact(move |b, now| {
            seal_in(
                b,
                &gen,
                step.as_ref(),
                status,
                &record,
                proposal.as_ref(),
                successor.as_ref(),
                now,
            )
        })
        .await
    }

    pub async fn abandon(&self, run_id: RunId, gen: String) -> Result<Outcome<()>> {
        self.transact(move |b, _| b.abandon(&run_id, &gen)).await
    }

    pub async fn push_inbox(
        &self,
        run_id: RunId,
        message: serde_json::Value,
    ) -> Result<Outcome<u64>> {
        let written = self.mailbox.inbox.after_write();
        self.transact(move |b, _| {
            let _ = &written;
            b.push_inbox(&run_id, &message)
        })
        .await
    }

    pub async fn read_inbox(
        &self,
        run_id: RunId,
        after_seq: Option<u64>,
    ) -> Result<Outcome<Vec<InboxItem>>> {
        self.read(move |b, _| b.read_inbox(&run_id, after_seq))
            .await
    }

    pub async fn reclaim(
        &self,
        gen: String,
        lease_ms: i64,
        dead_gens: Vec<String>,
        driven: Vec<RunId>,
    ) -> Result<ReclaimAnswer> {
        self.transact(move |b, now| b.reclaim(&gen, now, lease_ms, &dead_gens, &driven))
            .await
    }

    pub async fn list_live(&self) -> Result<Vec<LiveRow>> {
        self.read(|b, _| b.list_live()).await
    }

    pub async fn get_live(&self, run_id: RunId) -> Result<Option<LiveRow>> {
        self.read(move |b, _| b.get_live(&run_id)).await
    }

    pub async fn last_step(&self, run_id: RunId) -> Result<Option<StepRecord>> {
        self.read(move |b, _| b.last_step(&run_id)).await
    }

    pub async fn capability_secret(&self) -> Result<String> {
        self.transact(|b, _| b.capability_secret()).await
    }

    pub async fn kill(&self, run_id: RunId) -> Result<crate::ledger::KillAnswer> {
        self.transact(move |b, now| b.kill(&run_id, now)).await
    }

    /// Purge a killed run (see [`RunLedger::purge`]); in the same transaction, the messages queued
    /// behind it (`enqueue`, `interrupt`: SPEC §5.1) start `successor` on the thread it freed — a kill
    /// deletes the run and what steered it, never the runs waiting their turn. Whether a successor was
    /// admitted shows as its live row.
    pub async fn purge(
        &self,
        run_id: RunId,
        gen: String,
        successor: Option<Successor>,
    ) -> Result<bool> {
        self.transact(move |b, now| {
            atomic(
                b,
                |b| {
                    let plan = match (&successor, b.get_live(&run_id)?) {
                        (Some(succ), Some(row)) => {
                            let queued: Vec<_> = b
                                .inbox_after(&run_id, None)?
                                .into_iter()
                                .filter(crate::ledger::InboxItem::queued)
                                .collect();
                            crate::ledger::successor_admission(&row, &gen, &queued, succ, now)
                        }
                        _ => None,
                    };
                    let purged = b.purge(&run_id)?;
                    if let (true, Some(plan)) = (purged, plan) {
                        admit_successor(b, &gen, &plan, now)?;
                    }
                    Ok(purged)
                },
                |_| true,
            )
        })
        .await
    }

    /// Through the storage actor's queue, not a reader: the check a run makes right before its webhook
    /// attempt then sees every kill this process queued before it (a reader might run ahead of a kill
    /// still waiting for its commit).
    pub async fn is_killed(&self, run_id: RunId) -> Result<bool> {
        self.transact(move |b, _| b.is_killed(&run_id)).await
    }

    pub async fn live_events(
        &self,
        run_id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<serde_json::Value>>> {
        self.read(move |b, _| b.live_events(&run_id, after_seq, limit))
            .await
    }

    /// A run's stored summary and whether it carries a deletion fence, in one read (a finished run's
    /// point read needs both).
    pub async fn get_summary_and_killed(&self, id: RunId) -> Result<(Option<RunListItem>, bool)> {
        self.read(move |b, now| b.summary_and_killed(&id, now))
            .await
    }

    /// Which of `run_ids` carry a deletion fence (sorted, each once): one read for a whole listing.
    pub async fn killed_among(&self, run_ids: Vec<RunId>) -> Result<Vec<RunId>> {
        self.read(move |b, _| b.killed_among(&run_ids)).await
    }

    /// The reclaim sweep's housekeeping, one transaction (SPEC §4.3 finish): receipts whose run ended
    /// [`StorageHandle::receipt_ttl_ms`] ago or earlier go; of `dead_gens` (generations the caller found
    /// dead — never its own), those that own no rows and started more than a day ago go; leftover
    /// transcript, step and inbox rows of runs without a live row go; deletion fences of purged runs
    /// killed a receipt TTL ago or earlier go, and so do plan requests in a terminal state settled as
    /// long ago (never a pending or ready one, never a plan). Every generation not in
    /// `dead_gens` is kept ([`RunLedger::prune`]'s `keep_gens`), so a process that is merely idle never
    /// loses its row.
    ///
    /// [`RunLedger::prune`]: crate::ledger::RunLedger::prune
    pub async fn prune_dead(&self, dead_gens: Vec<String>) -> Result<PruneReport> {
        let ttl = self.receipt_ttl_ms;
        self.transact(move |b, now| {
            atomic(
                b,
                |b| {
                    let keep: Vec<String> = b
                        .generations()?
                        .into_iter()
                        .map(|g| g.gen)
                        .filter(|g| !dead_gens.contains(g))
                        .collect();
                    b.prune(now, ttl, &keep)
                },
                |_| true,
            )
        })
        .await
    }

    /// [`RunLedger::prune`](crate::ledger::RunLedger::prune) as is: every generation not in `keep_gens`
    /// may go, and receipts live `receipt_ttl_ms` after their run ended.
    pub async fn prune(&self, receipt_ttl_ms: i64, keep_gens: Vec<String>) -> Result<PruneReport> {
        self.transact(move |b, now| b.prune(now, receipt_ttl_ms, &keep_gens))
            .await
    }

    /// Row counts of every table (a full count: tests, forensics, an occasional gauge).
    pub async fn table_rows(&self) -> Result<TableRows> {
        self.read(|b, _| b.table_rows()).await
    }
}
