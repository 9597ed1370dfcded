//! The history writer: fire-and-forget record writes with bounded retries (SPEC §5.4).
//!
//! Owns no storage of its own: it owns the *write path* to a [`HistorySink`] (the storage actor in
//! production, a scripted double in tests) and the accounting of it — how many writes are in flight
//! ([`HistoryWriter::pending`], part of the drain) and how many were lost ([`HistoryWriter::failures`]).
//!
//! Who sends it what: the run lifecycle calls [`HistoryWriter::write`] with the provisional tombstone
//! (SPEC §5.2 step 3, [`Via::Store`]) and with the final record (§5.2 step 8, [`Via::Ledger`], the
//! ledger's one-transaction `finish`); drain and drain-deadline writes go through it too. Each write
//! answers a [`WriteTicket`] its caller may await or ignore.
//!
//! Invariants:
//! - `write` never fails and never blocks: it spawns the work and returns; every failure ends as a
//!   [`WriteOutcome`] on the ticket and, when a record was lost, one `warn!` and `failures + 1`;
//! - transient failures get at most two retries (1 s then 4 s, each ±50% jitter); a permanent one gets
//!   exactly one attempt;
//! - an uncertain write (reply lost) is never blindly retried: the writer keeps the exact request and
//!   reads the row back; only a definite "not there" earns a resend of the identical request, inside the
//!   same retry budget;
//! - final beats provisional: once a final write for an id is accepted, no provisional write for that
//!   id starts another attempt (a waiting one stands down, a later one is dropped), and a final attempt
//!   never overlaps a provisional attempt for the same id, so a provisional can never land after the
//!   final in this process (the store's tombstone floor is the durable backstop across processes);
//! - a ledger `Fenced` refusal writes no record from this process and is not a loss;
//! - logs carry `run_id` (and `generation` for ledger writes), attempt counts and error classes, never
//!   record text.
//!
//! What it deliberately does not do: it does not validate or fit records (the caller does, before
//! `write`), it does not retry past its budget, and it does not persist pending writes across a crash
//! (the ledger's reclaim closes a run whose final record never landed).
//!
//! # Design
//!
//! Each `write` spawns one task on the current tokio runtime (actix runs on tokio, so this works inside
//! an actix `System` and under `#[tokio::test]`). Per id, the writer keeps a gate — an async mutex held
//! for the duration of one sink call — so attempts for the same id never overlap, and a set of ids whose
//! final write was accepted. A provisional write checks that set after taking the gate, before every
//! attempt; a provisional sleeping in backoff is woken by a `watch` counter bumped on every accepted
//! final, so it stands down at once instead of holding `pending()` up for seconds. Accounting
//! (`pending`, `failures`, the ticket) is settled by a drop guard, so even a panicking sink future
//! settles its write (as lost) and never wedges the drain.
//!
//! | write kind  | state            | next                                                        |
//! |-------------|------------------|-------------------------------------------------------------|
//! | any         | attempt          | landed / fenced / permanent → done; transient → backoff     |
//! | any         | uncertain        | read back: match → done, absent → backoff then resend       |
//! | any         | backoff          | timer → attempt; budget spent → lost                        |
//! | provisional | backoff, waiting | a final for the id is accepted → stood down                 |

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use storage::RunId;

use futures_util::future::BoxFuture;
use storage::ledger::{Outcome, Refusal, Successor};
use storage::record::{RunListItem, RunRecord};
use storage::store::{PolicyProposal, PutOutcome};
use storage::StorageHandle;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

/// The retry schedule of SPEC §5.4: the base delays before the first and the second retry.
pub const DEFAULT_BACKOFF: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(4)];
/// Each delay is its base times a uniform factor in `1 ± DEFAULT_JITTER`.
pub const DEFAULT_JITTER: f64 = 0.5;
/// How many ids with an accepted final write the writer remembers for dropping late provisional
/// writes. Bounded so a long-lived process does not grow without limit; past it the store's tombstone
/// floor still refuses a provisional put over a final row.
const FINALS_REMEMBERED: usize = 4096;

/// Why a write failed, as the writer acts on it.
///
/// The text is logged (with the run id), so a sink must not put record content in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Storage could not answer now (unavailable, busy); the write did not land. Retried.
    #[error("transient: {0}")]
    Transient(String),
    /// Storage refused the write and will refuse it again (invalid record, corrupt row). Not retried.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The reply was lost: the write may or may not have landed. Reconciled by reading back.
    #[error("uncertain: {0}")]
    Uncertain(String),
}

impl SinkError {
    /// `"transient"`, `"permanent"` or `"uncertain"`: the class, for logs.
    pub fn class(&self) -> &'static str {
        match self {
            SinkError::Transient(_) => "transient",
            SinkError::Permanent(_) => "permanent",
            SinkError::Uncertain(_) => "uncertain",
        }
    }
}

/// How a storage error reads to the writer.
///
/// | `storage::Error`  | class     | why                                                                  |
/// |-------------------|-----------|----------------------------------------------------------------------|
/// | `Unavailable`     | transient | mailbox closed or backend not open; see below                        |
/// | `Sqlite`          | transient | busy/locked after `busy_timeout`, and any other SQLite failure: unclassified errors are retried, then counted (digest §1.G) |
/// | `Postgres`        | transient | as `Sqlite`: a lost race, a lock or statement timeout, a dropped connection, and any other failure |
/// | `Panicked`        | transient | the transaction rolled back and the actor reopened its connection    |
/// | `GroupRolledBack` | transient | nothing of the group landed; the actor ran it again alone            |
/// | `InvalidRecord`   | permanent | the same record is refused again                                     |
/// | `Corrupt`         | permanent | a stored value does not decode; retrying reads the same bytes        |
/// | `SchemaTooNew`    | permanent | this build cannot write that database                                |
///
/// Never `Uncertain`: the storage actor runs each transaction to completion and always replies (a
/// panicking body is caught and answered), and `StorageHandle` folds every mailbox failure into
/// `Unavailable` without telling "never delivered" from "reply lost". So a mailbox failure reads as
/// transient — which is safe, because a retried put of the identical record is idempotent (the store
/// answers `rewritten: false`) and a retried `finish` that already committed is refused `UnknownRun`
/// and falls back to a provisional put, which the committed final record floors.
impl From<storage::Error> for SinkError {
    fn from(e: storage::Error) -> Self {
        use storage::Error as E;
        match e {
            E::Unavailable(why) => SinkError::Transient(format!("storage unavailable: {why}")),
            e @ E::Sqlite(_) => SinkError::Transient(e.to_string()),
            e @ E::Postgres(_) => SinkError::Transient(e.to_string()),
            e @ (E::Panicked(_) | E::GroupRolledBack(_)) => SinkError::Transient(e.to_string()),
            e @ E::InvalidRecord(_) => SinkError::Permanent(e.to_string()),
            E::Corrupt { what, .. } => {
                SinkError::Permanent(format!("corrupt stored value in {what}"))
            }
            e @ E::SchemaTooNew { .. } => SinkError::Permanent(e.to_string()),
        }
    }
}

/// Where records go. Implemented for [`StorageHandle`] and by test doubles.
pub trait HistorySink: Send + Sync + 'static {
    /// A plain store put (SPEC §3).
    fn put(
        &self,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
    ) -> BoxFuture<'static, Result<PutOutcome, SinkError>>;

    /// The ledger's one-transaction finish (SPEC §4.3); `Ok(Err(refusal))` when the ledger refuses
    /// (`UnknownRun` → the writer falls back to a provisional put; `Fenced` → no record from this process,
    /// nothing counted as landed).
    fn finish(
        &self,
        gen: String,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
        successor: Option<Successor>,
    ) -> BoxFuture<'static, Result<Outcome<PutOutcome>, SinkError>>;

    /// Read back the stored listing row (reconciling an uncertain write). Must observe any write whose
    /// reply was already reported (lost or not) before this call.
    fn read_back(&self, id: RunId) -> BoxFuture<'static, Result<Option<RunListItem>, SinkError>>;
}

/// The storage actor as a sink. Errors map as [`SinkError`]'s `From<storage::Error>` documents.
impl HistorySink for StorageHandle {
    fn put(
        &self,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
    ) -> BoxFuture<'static, Result<PutOutcome, SinkError>> {
        let handle = self.clone();
        Box::pin(async move { handle.put(record, proposal).await.map_err(SinkError::from) })
    }

    fn finish(
        &self,
        gen: String,
        record: RunRecord,
        proposal: Option<PolicyProposal>,
        successor: Option<Successor>,
    ) -> BoxFuture<'static, Result<Outcome<PutOutcome>, SinkError>> {
        let handle = self.clone();
        Box::pin(async move {
            handle
                .finish(gen, record, proposal, successor)
                .await
                .map_err(SinkError::from)
        })
    }

    fn read_back(&self, id: RunId) -> BoxFuture<'static, Result<Option<RunListItem>, SinkError>> {
        let handle = self.clone();
        Box::pin(async move { handle.get_summary(id).await.map_err(SinkError::from) })
    }
}

/// Which operation carries a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A plain store put (the tombstone, drain writes, a fallback).
    Store,
    /// The ledger's `finish` under this generation: the record lands and the live row goes in one
    /// transaction, which also admits the `successor` run for unread follow-ups (SPEC §5.2 step 8).
    Ledger {
        gen: String,
        successor: Option<Successor>,
    },
}

impl Via {
    fn kind(&self) -> &'static str {
        match self {
            Via::Store => "store",
            Via::Ledger { .. } => "ledger",
        }
    }
}

/// How a write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The sink acknowledged the write with this answer (a provisional put over a final row is
    /// acknowledged too: the store's floor wrote nothing, `rewritten: false`).
    Landed(PutOutcome),
    /// The reply was lost, and a read-back found the stored row matching the request (same
    /// `finishedAt`, status, `eventCount` and provisional flag). The record is durable; the put's own
    /// answer is unknown.
    Reconciled,
    /// A provisional write superseded by a final one for the same id (stood down in backoff, dropped
    /// when enqueued after the final, or found a final row on read-back). Not a loss.
    StoodDown,
    /// The ledger says another generation owns the run: no record from this process. Not a loss.
    Fenced,
    /// The record did not land (permanent refusal, retries spent, uncertain and unresolved). Counted
    /// in [`HistoryWriter::failures`].
    Lost(SinkError),
}

impl WriteOutcome {
    /// Whether the record is known to be stored (acknowledged or confirmed by read-back).
    pub fn is_landed(&self) -> bool {
        matches!(self, WriteOutcome::Landed(_) | WriteOutcome::Reconciled)
    }
}

/// A write's observable outcome. Cheap to clone; dropping it changes nothing about the write.
#[derive(Debug, Clone)]
pub struct WriteTicket {
    /// `None` until the write settles; set exactly once.
    rx: watch::Receiver<Option<WriteOutcome>>,
}

impl WriteTicket {
    fn settled(outcome: WriteOutcome) -> Self {
        let (_tx, rx) = watch::channel(Some(outcome));
        WriteTicket { rx }
    }

    /// The outcome if the write has settled, without waiting.
    pub fn outcome(&self) -> Option<WriteOutcome> {
        self.rx.borrow().clone()
    }

    /// Wait for the write to settle.
    pub async fn landed(&self) -> WriteOutcome {
        let mut rx = self.rx.clone();
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(settled) => settled.clone(),
            Err(_) => None,
        };
        // The settle guard always publishes before its sender drops; this is only a defensive answer.
        outcome.unwrap_or_else(|| {
            WriteOutcome::Lost(SinkError::Permanent(
                "write ended without an outcome".into(),
            ))
        })
    }
}

/// The per-id bookkeeping shared by every write task.
#[derive(Default)]
struct Ids {
    /// Ids whose final write was accepted, and their acceptance order for the bound.
    finals: BTreeSet<RunId>,
    finals_order: VecDeque<RunId>,
    /// Per id with unsettled writes: the attempt gate and how many writes use it. Removed at zero.
    gates: BTreeMap<RunId, Gate>,
}

struct Gate {
    writes: usize,
    /// Held for the duration of one sink call, so attempts for one id never overlap. A tokio mutex
    /// because it is held across the sink's await; FIFO, so a waiting final goes next.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Ids {
    fn accept_final(&mut self, id: &RunId) {
        if self.finals.insert(id.to_owned()) {
            self.finals_order.push_back(id.to_owned());
            while self.finals_order.len() > FINALS_REMEMBERED {
                if let Some(old) = self.finals_order.pop_front() {
                    self.finals.remove(&old);
                }
            }
        }
    }

    fn join(&mut self, id: &RunId) -> Arc<tokio::sync::Mutex<()>> {
        let gate = self.gates.entry(id.to_owned()).or_insert_with(|| Gate {
            writes: 0,
            turn: Arc::new(tokio::sync::Mutex::new(())),
        });
        gate.writes += 1;
        gate.turn.clone()
    }

    fn leave(&mut self, id: &RunId) {
        if let Some(gate) = self.gates.get_mut(id) {
            gate.writes = gate.writes.saturating_sub(1);
            if gate.writes == 0 {
                self.gates.remove(id);
            }
        }
    }
}

struct Inner {
    sink: Arc<dyn HistorySink>,
    /// Rides on every put and finish: the process's clamped `[history]` policy (SPEC §3).
    proposal: Option<PolicyProposal>,
    backoff: [Duration; 2],
    /// In `[0, 1]`.
    jitter: f64,
    /// A std mutex: held only for short map updates, never across an await.
    ids: Mutex<Ids>,
    /// Bumped on every accepted final write; wakes provisional writes sleeping in backoff so they
    /// re-check whether to stand down.
    finals_epoch: watch::Sender<u64>,
    /// Writes not yet settled; `settled()` waits for zero.
    pending: watch::Sender<usize>,
    failures: AtomicU64,
}

/// The history writer. Cheap to clone: clones share one sink, one accounting and one per-id state.
#[derive(Clone)]
pub struct HistoryWriter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HistoryWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryWriter")
            .field("pending", &self.pending())
            .field("failures", &self.failures())
            .field("backoff", &self.inner.backoff)
            .field("jitter", &self.inner.jitter)
            .finish()
    }
}

/// What a backoff pause ended in.
enum Pause {
    /// Slept; go on.
    Resume,
    /// No retry left.
    Exhausted,
    /// A final write for this id was accepted meanwhile (provisional writes only).
    StandDown,
}

/// What a read-back said about an uncertain write.
enum Reconcile {
    Settled(WriteOutcome),
    /// Definitely not there (absent or different): resend the identical request.
    Resend,
}

impl HistoryWriter {
    /// A writer over `sink` with the SPEC schedule: retries after 1 s then 4 s, each ±50%.
    pub fn new(sink: Arc<dyn HistorySink>, proposal: Option<PolicyProposal>) -> Self {
        Self::build(sink, proposal, DEFAULT_BACKOFF, DEFAULT_JITTER)
    }

    /// The same sink and proposal with another retry schedule (`jitter` clamped to `[0, 1]`). Call it
    /// at construction: the returned writer starts with fresh accounting.
    pub fn with_backoff(self, base: [Duration; 2], jitter: f64) -> Self {
        Self::build(self.inner.sink.clone(), self.inner.proposal, base, jitter)
    }

    fn build(
        sink: Arc<dyn HistorySink>,
        proposal: Option<PolicyProposal>,
        backoff: [Duration; 2],
        jitter: f64,
    ) -> Self {
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        HistoryWriter {
            inner: Arc::new(Inner {
                sink,
                proposal,
                backoff,
                jitter,
                ids: Mutex::new(Ids::default()),
                finals_epoch: watch::channel(0).0,
                pending: watch::channel(0).0,
                failures: AtomicU64::new(0),
            }),
        }
    }

    /// The policy proposal every put and finish carries (a sealed run's finish carries it too).
    pub fn proposal(&self) -> Option<PolicyProposal> {
        self.inner.proposal
    }

    /// Fire and forget: never fails, never blocks; the write runs on a spawned task. The ticket tells
    /// the outcome to a caller that wants it.
    pub fn write(&self, record: RunRecord, via: Via) -> WriteTicket {
        let inner = &self.inner;
        let id = record.head.id.clone();
        let provisional = record.head.provisional;
        let span = tracing::info_span!(
            "history_write",
            run_id = %id,
            generation = tracing::field::Empty,
            provisional,
            via = via.kind(),
        );
        if let Via::Ledger { gen, .. } = &via {
            span.record("generation", gen.as_str());
        }
        let entered = span.enter();

        let turn = {
            let mut ids = inner.lock_ids();
            if provisional && ids.finals.contains(&id) {
                tracing::debug!("provisional write dropped: a final write for this run came first");
                return WriteTicket::settled(WriteOutcome::StoodDown);
            }
            if !provisional {
                ids.accept_final(&id);
            }
            ids.join(&id)
        };
        if !provisional {
            inner.finals_epoch.send_modify(|n| *n = n.wrapping_add(1));
        }
        inner.pending.send_modify(|n| *n += 1);

        let (tx, rx) = watch::channel(None);
        let ticket = WriteTicket { rx };
        let mut settle = Settle {
            inner: inner.clone(),
            id,
            outcome: tx,
            attempts: 0,
            done: false,
        };

        let runtime = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime,
            Err(_) => {
                settle.settle(WriteOutcome::Lost(SinkError::Transient(
                    "no async runtime to run the write".into(),
                )));
                return ticket;
            }
        };
        let finals = inner.finals_epoch.subscribe();
        let task_inner = inner.clone();
        drop(entered);
        runtime.spawn(
            async move {
                let outcome = task_inner
                    .drive(&record, via, &turn, finals, &mut settle.attempts)
                    .await;
                settle.settle(outcome);
            }
            .instrument(span),
        );
        ticket
    }

    /// The runs with a final record still being written (accepted, not yet settled): their ledger
    /// `finish` may still commit, so this process still drives them.
    pub fn final_writes_pending(&self) -> Vec<RunId> {
        let ids = self.inner.lock_ids();
        ids.gates
            .keys()
            .filter(|id| ids.finals.contains(*id))
            .cloned()
            .collect()
    }

    /// Writes not yet settled, including those sleeping in backoff.
    pub fn pending(&self) -> usize {
        *self.inner.pending.borrow()
    }

    /// Resolves when no write is pending. The drain wraps it in its own timeout.
    pub async fn settled(&self) {
        let mut rx = self.inner.pending.subscribe();
        // The sender lives in `inner`, which `self` holds, so this cannot see a closed channel.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Records lost so far: permanent refusals, spent retries, unresolved uncertain writes.
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }
}

impl Inner {
    fn lock_ids(&self) -> MutexGuard<'_, Ids> {
        // The maps stay consistent even if a holder panicked (every update is a single step).
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn final_accepted(&self, id: &RunId) -> bool {
        self.lock_ids().finals.contains(id)
    }

    /// One write, from first attempt to outcome.
    async fn drive(
        &self,
        record: &RunRecord,
        mut via: Via,
        turn: &tokio::sync::Mutex<()>,
        mut finals: watch::Receiver<u64>,
        attempts: &mut u32,
    ) -> WriteOutcome {
        let id = &record.head.id;
        let provisional = record.head.provisional;
        let mut record = std::borrow::Cow::Borrowed(record);
        let mut spent = 0;
        loop {
            let answer = {
                let _turn = turn.lock().await;
                if provisional && self.final_accepted(id) {
                    tracing::debug!(
                        attempts = *attempts,
                        "provisional write stood down: a final write for this run came"
                    );
                    return WriteOutcome::StoodDown;
                }
                *attempts += 1;
                self.send(&record, &via).await
            };
            let err = match answer {
                Ok(Ok(put)) => return WriteOutcome::Landed(put),
                Ok(Err(Refusal::UnknownRun { .. })) if matches!(via, Via::Ledger { .. }) => {
                    // The live row is already gone: an earlier finish of ours committed (its answer was
                    // lost), or another generation closed the row with a final record of its own (SPEC
                    // §5.4 vs §5.6: no record from a process that lost the run). The put goes in as
                    // provisional, so the store's tombstone floor keeps whichever final record is there
                    // and only a run with none gets this one.
                    tracing::debug!(
                        attempt = *attempts,
                        "ledger has no live row; falling back to a provisional put"
                    );
                    record = std::borrow::Cow::Owned(as_fallback(&record));
                    via = Via::Store;
                    continue;
                }
                Ok(Err(Refusal::Fenced { .. })) => {
                    tracing::info!(
                        attempt = *attempts,
                        "ledger finish fenced: another generation owns the run"
                    );
                    return WriteOutcome::Fenced;
                }
                Ok(Err(refusal)) => SinkError::Permanent(format!("ledger refused: {refusal}")),
                Err(e) => e,
            };
            tracing::debug!(attempt = *attempts, class = err.class(), error = %err, "history write failed");
            match err {
                SinkError::Permanent(_) => return WriteOutcome::Lost(err),
                SinkError::Transient(_) => {
                    match self.pause(&mut spent, id, provisional, &mut finals).await {
                        Pause::Resume => continue,
                        Pause::Exhausted => return WriteOutcome::Lost(err),
                        Pause::StandDown => return WriteOutcome::StoodDown,
                    }
                }
                SinkError::Uncertain(_) => {
                    match self.reconcile(&record, &err, &mut spent, &mut finals).await {
                        Reconcile::Settled(outcome) => return outcome,
                        Reconcile::Resend => continue,
                    }
                }
            }
        }
    }

    async fn send(&self, record: &RunRecord, via: &Via) -> Result<Outcome<PutOutcome>, SinkError> {
        match via {
            Via::Store => self.sink.put(record.clone(), self.proposal).await.map(Ok),
            Via::Ledger { gen, successor } => {
                self.sink
                    .finish(
                        gen.clone(),
                        record.clone(),
                        self.proposal,
                        successor.clone(),
                    )
                    .await
            }
        }
    }

    /// Settle an uncertain write by reading the row back. Read failures use the same retry budget; a
    /// read that never answers leaves the write lost with the original uncertain error.
    async fn reconcile(
        &self,
        record: &RunRecord,
        uncertain: &SinkError,
        spent: &mut usize,
        finals: &mut watch::Receiver<u64>,
    ) -> Reconcile {
        let id = &record.head.id;
        let provisional = record.head.provisional;
        loop {
            match self.sink.read_back(id.to_owned()).await {
                Ok(Some(row)) if matches_request(&row, record) => {
                    tracing::debug!("uncertain write confirmed by read-back");
                    return Reconcile::Settled(WriteOutcome::Reconciled);
                }
                Ok(Some(row)) if provisional && !row.head.provisional => {
                    tracing::debug!("uncertain provisional write found a final row: standing down");
                    return Reconcile::Settled(WriteOutcome::StoodDown);
                }
                Ok(row) => {
                    tracing::debug!(
                        found = row.is_some(),
                        "uncertain write not in the store; resending it"
                    );
                    return match self.pause(spent, id, provisional, finals).await {
                        Pause::Resume => Reconcile::Resend,
                        Pause::Exhausted => {
                            Reconcile::Settled(WriteOutcome::Lost(uncertain.clone()))
                        }
                        Pause::StandDown => Reconcile::Settled(WriteOutcome::StoodDown),
                    };
                }
                Err(e) => {
                    tracing::debug!(class = e.class(), error = %e, "read-back failed");
                    match self.pause(spent, id, provisional, finals).await {
                        Pause::Resume => continue,
                        Pause::Exhausted => {
                            return Reconcile::Settled(WriteOutcome::Lost(uncertain.clone()))
                        }
                        Pause::StandDown => return Reconcile::Settled(WriteOutcome::StoodDown),
                    }
                }
            }
        }
    }

    /// Sleep out the next backoff slot. A provisional write wakes early, and stands down, when a final
    /// write for its id is accepted.
    async fn pause(
        &self,
        spent: &mut usize,
        id: &RunId,
        provisional: bool,
        finals: &mut watch::Receiver<u64>,
    ) -> Pause {
        let Some(base) = self.backoff.get(*spent).copied() else {
            return Pause::Exhausted;
        };
        *spent += 1;
        let deadline = Instant::now() + self.jittered(base);
        if !provisional {
            tokio::time::sleep_until(deadline).await;
            return Pause::Resume;
        }
        loop {
            if self.final_accepted(id) {
                return Pause::StandDown;
            }
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline) => return Pause::Resume,
                changed = finals.changed() => {
                    if changed.is_err() {
                        // The sender lives as long as `self`; kept for completeness.
                        tokio::time::sleep_until(deadline).await;
                        return Pause::Resume;
                    }
                }
            }
        }
    }

    fn jittered(&self, base: Duration) -> Duration {
        if self.jitter == 0.0 {
            return base;
        }
        let factor = storage::entropy::between(1.0 - self.jitter, 1.0 + self.jitter);
        base.mul_f64(factor)
    }
}

/// The put a final record falls back to when the ledger no longer has its row: provisional (never over a
/// final record, by the store's tombstone floor), unsealed.
fn as_fallback(record: &RunRecord) -> RunRecord {
    let mut fallback = record.clone();
    fallback.head.provisional = true;
    fallback.head.sealed_at = None;
    fallback
}

/// Whether a stored listing row is the one this request would have written.
fn matches_request(row: &RunListItem, record: &RunRecord) -> bool {
    let (stored, wanted) = (&row.head, &record.head);
    stored.finished_at == wanted.finished_at
        && stored.status == wanted.status
        && stored.event_count == wanted.event_count
        && stored.provisional == wanted.provisional
}

/// Settles one write exactly once: publishes the outcome, counts a loss, releases the id's gate and
/// decrements `pending`. Dropped unsettled (the task panicked or was cancelled), it settles the write
/// as lost, so the drain never waits on a write that cannot finish.
struct Settle {
    inner: Arc<Inner>,
    id: RunId,
    outcome: watch::Sender<Option<WriteOutcome>>,
    attempts: u32,
    done: bool,
}

impl Settle {
    fn settle(&mut self, outcome: WriteOutcome) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if let WriteOutcome::Lost(err) = &outcome {
            self.inner.failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(run_id = %self.id, attempts = self.attempts, class = err.class(), error = %err, "history write lost");
        }
        self.outcome.send_replace(Some(outcome));
        self.inner.lock_ids().leave(&self.id);
        self.inner.pending.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        self.settle(WriteOutcome::Lost(SinkError::Permanent(
            "write task ended without an outcome".into(),
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;
    use storage::record::validate_record;
    use storage::{BackendSpec, ManualClock, MemoryStore};
    use tokio::sync::oneshot;

    const NOW: i64 = 1_800_000_000_000;
    const STORED: PutOutcome = PutOutcome {
        stored: true,
        rewritten: false,
        retained: 1,
    };

    fn record(id: &str, provisional: bool) -> RunRecord {
        let mut v = json!({
            "id": id, "agent": "demo", "channelId": "C1", "userId": "U1", "threadKey": "C1:t1",
            "channelVisibility": "public", "startedAt": NOW - 1000, "finishedAt": NOW,
            "status": "completed", "eventCount": 2, "storedEventCount": 2, "truncated": false,
            "events": [
                {"type": "input", "seq": 1, "at": NOW - 1000, "text": "hi", "source": "request"},
                {"type": "answer", "seq": 2, "at": NOW, "text": "done"}
            ],
            "diagnosis": {"byCategory": {}}
        });
        if provisional {
            v["provisional"] = json!(true);
            v["status"] = json!("interrupted");
            v["finishedAt"] = json!(NOW - 1000);
            v["eventCount"] = json!(0);
            v["storedEventCount"] = json!(0);
            v["events"] = json!([]);
        }
        validate_record(&v).expect("valid test record")
    }

    fn transient() -> SinkError {
        SinkError::Transient("storage unavailable: test".into())
    }

    /// One programmed answer: now, or when the test releases it (an attempt held in flight).
    enum Answer<T> {
        Now(Result<T, SinkError>),
        Later(oneshot::Receiver<Result<T, SinkError>>),
    }

    impl<T> Answer<T> {
        async fn resolve(self) -> Result<T, SinkError> {
            match self {
                Answer::Now(r) => r,
                Answer::Later(rx) => rx.await.unwrap_or_else(|_| {
                    Err(SinkError::Transient("test dropped the answer".into()))
                }),
            }
        }
    }

    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Put(RunRecord),
        Finish(String, RunRecord),
        ReadBack(RunId),
    }

    /// A sink that answers queues of programmed results (success once a queue is empty) and records
    /// every call with the (virtual) time it arrived.
    #[derive(Default)]
    struct ScriptedSink {
        puts: Mutex<VecDeque<Answer<PutOutcome>>>,
        finishes: Mutex<VecDeque<Answer<Outcome<PutOutcome>>>>,
        reads: Mutex<VecDeque<Answer<Option<RunListItem>>>>,
        calls: Mutex<Vec<(Call, Instant)>>,
    }

    impl ScriptedSink {
        fn new() -> Arc<Self> {
            Arc::new(Self::default())
        }
        fn on_put(&self, answer: Result<PutOutcome, SinkError>) {
            self.puts.lock().unwrap().push_back(Answer::Now(answer));
        }
        fn on_put_later(&self) -> oneshot::Sender<Result<PutOutcome, SinkError>> {
            let (tx, rx) = oneshot::channel();
            self.puts.lock().unwrap().push_back(Answer::Later(rx));
            tx
        }
        fn on_finish(&self, answer: Result<Outcome<PutOutcome>, SinkError>) {
            self.finishes.lock().unwrap().push_back(Answer::Now(answer));
        }
        fn on_read(&self, answer: Result<Option<RunListItem>, SinkError>) {
            self.reads.lock().unwrap().push_back(Answer::Now(answer));
        }
        fn calls(&self) -> Vec<Call> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .map(|(c, _)| c.clone())
                .collect()
        }
        fn call_times(&self) -> Vec<Instant> {
            self.calls.lock().unwrap().iter().map(|(_, t)| *t).collect()
        }
        fn log(&self, call: Call) {
            self.calls.lock().unwrap().push((call, Instant::now()));
        }
    }

    impl HistorySink for ScriptedSink {
        fn put(
            &self,
            record: RunRecord,
            _: Option<PolicyProposal>,
        ) -> BoxFuture<'static, Result<PutOutcome, SinkError>> {
            self.log(Call::Put(record));
            let answer = self
                .puts
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Answer::Now(Ok(STORED)));
            Box::pin(answer.resolve())
        }
        fn finish(
            &self,
            gen: String,
            record: RunRecord,
            _: Option<PolicyProposal>,
            _: Option<Successor>,
        ) -> BoxFuture<'static, Result<Outcome<PutOutcome>, SinkError>> {
            self.log(Call::Finish(gen, record));
            let answer = self
                .finishes
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Answer::Now(Ok(Ok(STORED))));
            Box::pin(answer.resolve())
        }
        fn read_back(
            &self,
            id: RunId,
        ) -> BoxFuture<'static, Result<Option<RunListItem>, SinkError>> {
            self.log(Call::ReadBack(id));
            let answer = self
                .reads
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Answer::Now(Ok(None)));
            Box::pin(answer.resolve())
        }
    }

    fn writer(sink: &Arc<ScriptedSink>) -> HistoryWriter {
        HistoryWriter::new(sink.clone(), None)
    }

    /// Let spawned tasks run their first steps (virtual time: advances only the paused clock).
    async fn tick() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    /// Run out every backoff the writer could still be sleeping in.
    async fn long_after() {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }

    fn puts(calls: &[Call]) -> Vec<&RunRecord> {
        calls
            .iter()
            .filter_map(|c| if let Call::Put(r) = c { Some(r) } else { None })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn transient_then_success_retries_once_and_lands() {
        let sink = ScriptedSink::new();
        sink.on_put(Err(transient()));
        let w = writer(&sink);
        let r = record("r1", false);

        let outcome = w.write(r.clone(), Via::Store).landed().await;

        assert_eq!(outcome, WriteOutcome::Landed(STORED));
        assert_eq!(sink.calls(), vec![Call::Put(r.clone()), Call::Put(r)]);
        assert_eq!(w.failures(), 0);
        assert_eq!(w.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn three_transients_lose_the_write_once_after_jittered_backoff() {
        let sink = ScriptedSink::new();
        for _ in 0..3 {
            sink.on_put(Err(transient()));
        }
        let w = writer(&sink);

        let outcome = w.write(record("r1", false), Via::Store).landed().await;

        // Three attempts of the same record, then lost and counted once.
        assert_eq!(outcome, WriteOutcome::Lost(transient()));
        assert_eq!(puts(&sink.calls()).len(), 3);
        assert_eq!(w.failures(), 1);
        // The gaps are the backoff delays: 1 s ±50%, then 4 s ±50%.
        let t = sink.call_times();
        let (first, second) = (t[1] - t[0], t[2] - t[1]);
        assert!(
            first >= Duration::from_millis(500) && first <= Duration::from_millis(1500),
            "{first:?}"
        );
        assert!(
            second >= Duration::from_secs(2) && second <= Duration::from_secs(6),
            "{second:?}"
        );
        long_after().await;
        assert_eq!(sink.calls().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn configured_backoff_without_jitter_is_exact() {
        let sink = ScriptedSink::new();
        sink.on_put(Err(transient()));
        sink.on_put(Err(transient()));
        let w =
            writer(&sink).with_backoff([Duration::from_millis(10), Duration::from_millis(20)], 0.0);

        assert_eq!(
            w.write(record("r1", false), Via::Store).landed().await,
            WriteOutcome::Landed(STORED)
        );

        let t = sink.call_times();
        assert_eq!(
            (t[1] - t[0], t[2] - t[1]),
            (Duration::from_millis(10), Duration::from_millis(20))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_refusal_is_one_attempt_and_one_failure() {
        let sink = ScriptedSink::new();
        let refused = SinkError::Permanent("invalid record: missing field id".into());
        sink.on_put(Err(refused.clone()));
        let w = writer(&sink);

        let outcome = w.write(record("r1", false), Via::Store).landed().await;

        assert_eq!(outcome, WriteOutcome::Lost(refused));
        long_after().await;
        assert_eq!(sink.calls().len(), 1);
        assert_eq!(w.failures(), 1);
        assert_eq!(w.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn uncertain_write_confirmed_by_read_back_is_not_resent() {
        let sink = ScriptedSink::new();
        let r = record("r1", false);
        sink.on_put(Err(SinkError::Uncertain("reply lost".into())));
        sink.on_read(Ok(Some(r.to_list_item(Some(100)))));
        let w = writer(&sink);

        let outcome = w.write(r.clone(), Via::Store).landed().await;

        assert_eq!(outcome, WriteOutcome::Reconciled);
        assert!(outcome.is_landed());
        long_after().await;
        assert_eq!(
            sink.calls(),
            vec![Call::Put(r), Call::ReadBack("r1".into())]
        );
        assert_eq!(w.failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn uncertain_write_absent_on_read_back_is_resent_once_identically() {
        let sink = ScriptedSink::new();
        let r = record("r1", false);
        sink.on_put(Err(SinkError::Uncertain("reply lost".into())));
        sink.on_read(Ok(None));
        let w = writer(&sink);

        let outcome = w.write(r.clone(), Via::Store).landed().await;

        assert_eq!(outcome, WriteOutcome::Landed(STORED));
        long_after().await;
        assert_eq!(
            sink.calls(),
            vec![
                Call::Put(r.clone()),
                Call::ReadBack("r1".into()),
                Call::Put(r)
            ]
        );
        assert_eq!(w.failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn uncertain_write_showing_a_different_row_is_resent() {
        // The row under the id is the provisional tombstone, not this final record: definitely not landed.
        let sink = ScriptedSink::new();
        let r = record("r1", false);
        sink.on_put(Err(SinkError::Uncertain("reply lost".into())));
        sink.on_read(Ok(Some(record("r1", true).to_list_item(None))));
        let w = writer(&sink);

        assert_eq!(
            w.write(r.clone(), Via::Store).landed().await,
            WriteOutcome::Landed(STORED)
        );
        assert_eq!(puts(&sink.calls()), vec![&r, &r]);
    }

    #[tokio::test(start_paused = true)]
    async fn uncertain_write_that_cannot_be_read_back_is_lost_without_a_resend() {
        let sink = ScriptedSink::new();
        let lost = SinkError::Uncertain("reply lost".into());
        sink.on_put(Err(lost.clone()));
        for _ in 0..3 {
            sink.on_read(Err(transient()));
        }
        let w = writer(&sink);

        let outcome = w.write(record("r1", false), Via::Store).landed().await;

        // Read-backs use the retry budget (three reads); the put is never blindly repeated.
        assert_eq!(outcome, WriteOutcome::Lost(lost));
        let calls = sink.calls();
        assert_eq!(puts(&calls).len(), 1);
        assert_eq!(
            calls
                .iter()
                .filter(|c| matches!(c, Call::ReadBack(_)))
                .count(),
            3
        );
        assert_eq!(w.failures(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn final_write_stands_down_provisional_waiting_in_backoff() {
        let sink = ScriptedSink::new();
        sink.on_put(Err(transient()));
        let w = writer(&sink);
        let (tomb, fin) = (record("r1", true), record("r1", false));

        // The tombstone fails once and sleeps in backoff.
        let provisional = w.write(tomb.clone(), Via::Store);
        tick().await;
        assert_eq!(w.pending(), 1);
        // The final write arrives meanwhile and lands.
        let final_ticket = w.write(fin.clone(), Via::Store);

        assert_eq!(final_ticket.landed().await, WriteOutcome::Landed(STORED));
        assert_eq!(provisional.landed().await, WriteOutcome::StoodDown);
        w.settled().await;
        long_after().await;
        // Two puts, final last; the tombstone's retry never happened and nothing is counted lost.
        assert_eq!(sink.calls(), vec![Call::Put(tomb), Call::Put(fin)]);
        assert_eq!(w.failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn provisional_enqueued_after_final_is_never_sent() {
        let sink = ScriptedSink::new();
        let w = writer(&sink);
        let fin = record("r1", false);

        let final_ticket = w.write(fin.clone(), Via::Store);
        let late = w.write(record("r1", true), Via::Store);

        assert_eq!(late.outcome(), Some(WriteOutcome::StoodDown));
        assert_eq!(final_ticket.landed().await, WriteOutcome::Landed(STORED));
        // Still dropped after the final settled.
        assert_eq!(
            w.write(record("r1", true), Via::Store).outcome(),
            Some(WriteOutcome::StoodDown)
        );
        long_after().await;
        assert_eq!(sink.calls(), vec![Call::Put(fin)]);
        assert_eq!((w.failures(), w.pending()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn stand_down_is_per_id() {
        let sink = ScriptedSink::new();
        sink.on_put(Err(transient()));
        let w = writer(&sink);

        // A tombstone for r1 in backoff is not affected by a final write for r2.
        let tomb = w.write(record("r1", true), Via::Store);
        tick().await;
        w.write(record("r2", false), Via::Store);

        assert_eq!(tomb.landed().await, WriteOutcome::Landed(STORED));
        assert_eq!(
            puts(&sink.calls())
                .iter()
                .filter(|r| r.head.id == "r1")
                .count(),
            2
        );
    }

    #[tokio::test(start_paused = true)]
    async fn final_write_waits_for_a_provisional_attempt_in_flight_and_lands_last() {
        let sink = ScriptedSink::new();
        let release = sink.on_put_later();
        let w = writer(&sink);
        let (tomb, fin) = (record("r1", true), record("r1", false));

        // The tombstone's put is in flight when the final write is enqueued.
        let provisional = w.write(tomb.clone(), Via::Store);
        tick().await;
        let final_ticket = w.write(fin.clone(), Via::Store);
        tick().await;
        // The final waits for its turn: no overlapping attempt for the id.
        assert_eq!(sink.calls(), vec![Call::Put(tomb.clone())]);

        // The tombstone's reply comes back (it landed); the final then goes, so it is the last word.
        release
            .send(Ok(STORED))
            .expect("writer waits for the answer");
        assert_eq!(final_ticket.landed().await, WriteOutcome::Landed(STORED));
        assert_eq!(provisional.landed().await, WriteOutcome::Landed(STORED));
        long_after().await;
        assert_eq!(sink.calls(), vec![Call::Put(tomb), Call::Put(fin)]);
    }

    #[tokio::test(start_paused = true)]
    async fn provisional_backoff_racing_a_final_never_overwrites_it() {
        let sink = ScriptedSink::new();
        let release = sink.on_put_later();
        let w = writer(&sink);
        let (tomb, fin) = (record("r1", true), record("r1", false));

        // The tombstone's attempt is in flight; the final is enqueued behind it.
        let provisional = w.write(tomb.clone(), Via::Store);
        tick().await;
        let final_ticket = w.write(fin.clone(), Via::Store);
        // The tombstone's attempt fails transiently: it would retry after its backoff, but the final
        // lands first and the retry timer, when it would fire, finds the final and sends nothing.
        release
            .send(Err(transient()))
            .expect("writer waits for the answer");
        assert_eq!(final_ticket.landed().await, WriteOutcome::Landed(STORED));
        long_after().await;

        assert_eq!(provisional.outcome(), Some(WriteOutcome::StoodDown));
        assert_eq!(sink.calls(), vec![Call::Put(tomb), Call::Put(fin)]);
        assert_eq!((w.failures(), w.pending()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn ledger_finish_unknown_run_falls_back_to_a_provisional_put() {
        let sink = ScriptedSink::new();
        sink.on_finish(Ok(Err(Refusal::UnknownRun {
            run_id: "r1".into(),
        })));
        let w = writer(&sink);
        let r = record("r1", false);

        let outcome = w
            .write(
                r.clone(),
                Via::Ledger {
                    gen: "g1".into(),
                    successor: None,
                },
            )
            .landed()
            .await;

        assert_eq!(outcome, WriteOutcome::Landed(STORED));
        assert_eq!(
            sink.calls(),
            vec![
                Call::Finish("g1".into(), r.clone()),
                Call::Put(as_fallback(&r))
            ]
        );
        assert!(as_fallback(&r).head.provisional);
        assert_eq!(w.failures(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn ledger_finish_lands_without_a_put() {
        let sink = ScriptedSink::new();
        let w = writer(&sink);
        let r = record("r1", false);

        assert_eq!(
            w.write(
                r.clone(),
                Via::Ledger {
                    gen: "g1".into(),
                    successor: None
                }
            )
            .landed()
            .await,
            WriteOutcome::Landed(STORED)
        );
        assert_eq!(sink.calls(), vec![Call::Finish("g1".into(), r)]);
    }

    #[tokio::test(start_paused = true)]
    async fn ledger_finish_fenced_writes_nothing_and_is_not_a_failure() {
        let sink = ScriptedSink::new();
        sink.on_finish(Ok(Err(Refusal::Fenced {
            run_id: "r1".into(),
        })));
        let w = writer(&sink);
        let r = record("r1", false);

        let outcome = w
            .write(
                r.clone(),
                Via::Ledger {
                    gen: "g1".into(),
                    successor: None,
                },
            )
            .landed()
            .await;

        assert_eq!(outcome, WriteOutcome::Fenced);
        assert!(!outcome.is_landed());
        long_after().await;
        assert_eq!(sink.calls(), vec![Call::Finish("g1".into(), r)]);
        assert_eq!((w.failures(), w.pending()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn pending_and_settled_track_in_flight_writes() {
        let sink = ScriptedSink::new();
        sink.on_put(Err(transient()));
        let w = writer(&sink);
        assert_eq!(w.pending(), 0);
        w.settled().await; // nothing pending: resolves at once

        let slow = w.write(record("r1", false), Via::Store);
        let quick = w.write(record("r2", false), Via::Store);
        assert_eq!(w.pending(), 2);
        tick().await;
        // r2 landed; r1 sits in retry backoff and still counts.
        assert_eq!(quick.outcome(), Some(WriteOutcome::Landed(STORED)));
        assert_eq!(slow.outcome(), None);
        assert_eq!(w.pending(), 1);

        w.settled().await;
        assert_eq!(w.pending(), 0);
        assert_eq!(slow.outcome(), Some(WriteOutcome::Landed(STORED)));
        assert_eq!(w.failures(), 0);
    }

    #[test]
    fn write_without_a_runtime_is_lost_not_a_panic() {
        let sink = ScriptedSink::new();
        let w = writer(&sink);

        let ticket = w.write(record("r1", false), Via::Store);

        assert!(matches!(
            ticket.outcome(),
            Some(WriteOutcome::Lost(SinkError::Transient(_)))
        ));
        assert_eq!((w.failures(), w.pending()), (1, 0));
        assert!(sink.calls().is_empty());
    }

    #[test]
    fn storage_errors_map_to_writer_classes() {
        use storage::record::RecordError;
        use storage::Error as E;
        assert!(matches!(
            SinkError::from(E::Unavailable("mailbox".into())),
            SinkError::Transient(_)
        ));
        assert!(matches!(
            SinkError::from(E::Panicked("boom".into())),
            SinkError::Transient(_)
        ));
        assert!(matches!(
            SinkError::from(E::InvalidRecord(RecordError::BadId)),
            SinkError::Permanent(_)
        ));
        let corrupt = SinkError::from(E::Corrupt {
            what: "runs.json",
            why: "secret text".into(),
        });
        assert_eq!(
            corrupt,
            SinkError::Permanent("corrupt stored value in runs.json".into())
        );
        assert!(matches!(
            SinkError::from(E::SchemaTooNew {
                found: 9,
                supported: 1
            }),
            SinkError::Permanent(_)
        ));
    }

    fn storage_handle() -> StorageHandle {
        StorageHandle::start(
            BackendSpec::Memory(MemoryStore::new()),
            Arc::new(ManualClock::new(NOW)),
        )
    }

    #[actix_rt::test]
    async fn write_through_storage_handle_lands_and_is_readable() {
        let handle = storage_handle();
        let w = HistoryWriter::new(Arc::new(handle.clone()), None);
        let r = record("r1", false);

        let outcome = w.write(r.clone(), Via::Store).landed().await;

        assert!(
            matches!(
                outcome,
                WriteOutcome::Landed(PutOutcome { stored: true, .. })
            ),
            "{outcome:?}"
        );
        assert_eq!(handle.get("r1".into()).await.expect("get"), Some(r.clone()));
        let summary = handle
            .read_back("r1".into())
            .await
            .expect("read back")
            .expect("row");
        assert!(matches_request(&summary, &r));
        w.settled().await;
        assert_eq!((w.pending(), w.failures()), (0, 0));
    }

    #[actix_rt::test]
    async fn ledger_finish_without_a_live_row_never_replaces_a_final_record() {
        let handle = storage_handle();
        let w = HistoryWriter::new(Arc::new(handle.clone()), None);
        // Another generation closed the run: its final record is in the store, the live row is gone.
        let mut closed = record("r1", false);
        closed.head.status = storage::record::RunStatus::Interrupted;
        assert!(w
            .write(closed.clone(), Via::Store)
            .landed()
            .await
            .is_landed());
        let fin = w
            .write(
                record("r1", false),
                Via::Ledger {
                    gen: "g1".into(),
                    successor: None,
                },
            )
            .landed()
            .await;

        assert!(
            matches!(
                fin,
                WriteOutcome::Landed(PutOutcome {
                    stored: true,
                    rewritten: false,
                    ..
                })
            ),
            "{fin:?}"
        );
        assert_eq!(
            handle.get("r1".into()).await.expect("get"),
            Some(closed),
            "the closer's record stays"
        );
    }

    #[actix_rt::test]
    async fn ledger_finish_without_a_live_row_or_final_record_lands_provisional() {
        let handle = storage_handle();
        let w = HistoryWriter::new(Arc::new(handle.clone()), None);
        let tomb = w.write(record("r1", true), Via::Store).landed().await;
        assert!(tomb.is_landed(), "{tomb:?}");
        let fin = w
            .write(
                record("r1", false),
                Via::Ledger {
                    gen: "g1".into(),
                    successor: None,
                },
            )
            .landed()
            .await;

        assert!(
            matches!(
                fin,
                WriteOutcome::Landed(PutOutcome {
                    stored: true,
                    rewritten: true,
                    ..
                })
            ),
            "{fin:?}"
        );
        assert_eq!(
            handle.get("r1".into()).await.expect("get"),
            Some(as_fallback(&record("r1", false)))
        );
    }
}
