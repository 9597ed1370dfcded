//! `OperationCoordinator`: exclusion for operations on the same app (SPEC §10, seed
//! `app-operation-coordination.txt`). In Switchboard an app is a run workspace ([`AppId`]).
//!
//! Owns, for every app with activity: its claim queue (holders and FIFO waiters), its admission state,
//! its session slot, its session-start blocks and its drain waiters; and, apart from apps, the
//! string-keyed locks of [`OperationCoordinator::with_lock`]. One per process, created at boot and
//! cloned into whoever needs it (a clone is a handle to the same state).
//!
//! Who calls it:
//! - handlers that touch an app: [`run`](OperationCoordinator::run) /
//!   [`acquire`](OperationCoordinator::acquire) with the app's full [`Claims`], or
//!   [`run_many`](OperationCoordinator::run_many) across apps;
//! - deletion: [`close_admission`](OperationCoordinator::close_admission) →
//!   [`end_session`](OperationCoordinator::end_session) → [`AdmissionFence::drain`] → work through the
//!   [`DeletionHandle`];
//! - long-lived owners (recordings, test runs): [`reserve_session`](OperationCoordinator::reserve_session)
//!   → [`SessionReservation::start`] → [`Session`]; teardown calls `end_session`; a periodic
//!   [`spawn_session_reaper`](OperationCoordinator::spawn_session_reaper) enforces the 30-minute cap;
//! - non-app identities (canonical file paths, token refreshes): `with_lock(&str)`.
//!
//! # Conflicts
//!
//! | held \ requested | read X     | write X  |
//! |------------------|------------|----------|
//! | read X           | compatible | conflict |
//! | write X          | conflict   | conflict |
//!
//! "X" means overlapping resources: a resource overlaps itself, and the `repository` umbrella overlaps
//! `repository-ref` and `repository-worktree` (in the umbrella's mode). `repository-ref` and
//! `repository-worktree` are independent; every other domain overlaps only itself.
//!
//! # States
//!
//! An operation's claims on one app:
//!
//! | state   | means to others                                        | leaves by                    |
//! |---------|--------------------------------------------------------|------------------------------|
//! | waiting | holds nothing; later conflicting work queues behind it | granted whole, or cancelled  |
//! | holding | holds every claim it declared for this app             | guard dropped (op finished)  |
//!
//! An app's admission (owner: whoever holds the fence, then the deletion handle):
//!
//! | state            | means                                                    | leaves by                    |
//! |------------------|----------------------------------------------------------|------------------------------|
//! | open             | new work admitted                                        | `close_admission` → draining |
//! | closed, draining | new work refused (`AdmissionClosed`); admitted work runs | idle → drained; fence drop   |
//! | closed, drained  | only [`DeletionHandle`] work runs                        | handle dropped → open        |
//!
//! An app's session slot (owner: the coordinator; reservation and session handles only read it):
//!
//! | state     | means                                                     | leaves by                          |
//! |-----------|-----------------------------------------------------------|------------------------------------|
//! | empty     | a session may be reserved (unless a start block is held)  | `reserve_session` → reserved       |
//! | reserved  | a start is under way; `refuse_when_session` refuses       | `start` → acquiring; teardown/drop |
//! | acquiring | queued for its claims                                     | granted → live; teardown/drop      |
//! | live      | holds its claims until grant + 30 min                     | end/drop, cap, teardown → empty    |
//!
//! Emptying the slot is the tombstone: a reservation or session whose id is no longer the slot's has
//! been cancelled, and its release is a no-op, so it can never retire a successor's slot.
//!
//! Invariants:
//! - acquisition for one app is atomic: an operation holds all of its claims on that app or none;
//! - queues are FIFO among conflicting operations (a reader never passes a waiting writer), except the
//!   seed's compatible-queue bypass, decided in `operations/queue.rs`;
//! - cross-app operations de-duplicate apps and acquire them in ascending [`AppId`] order — bytewise,
//!   since SPEC §10 makes app ids workspace ids (strings); the seed's "numeric order" exists to give
//!   every caller one global order, which bytewise order gives;
//!   a task inside an operation may start another only on strictly greater apps — the same app is
//!   refused as [`OperationError::NestedOperation`], a smaller one as [`OperationError::AppOrder`];
//! - `refuse_when_session` is decided under the same lock as the enqueue, per app, against that app's
//!   session claims: no session can start in between;
//! - admission is bypassed only through a [`DeletionHandle`], which only `drain` creates;
//! - the coordinator never times out a waiting operation; only sessions end by themselves (the cap).
//!
//! # Design
//!
//! SPEC §1.1 lists this coordinator among the actors. It is a plain shared structure instead: all
//! state sits behind one `std::sync::Mutex`, held only for short synchronous steps and never across an
//! `.await`, and waiters park on `tokio::sync::oneshot` channels. The seed's rules need synchronous
//! steps that a mailbox cannot give: a session reserves its app *before* the handler's first await
//! (`reserve_session` is a plain `fn`), and a guard dropped by a cancelled or panicking future must
//! release its claims in `Drop`, immediately and in order with the next enqueue. It still behaves as one
//! per-process owner: every decision is one locked step, in one place, and the grant rule is a pure
//! function of the queue (`AppQueue::grant`). It needs no actix `System`, so tools on any
//! arbiter or plain tokio tasks can use it.
//!
//! Cross-app operations hold earlier apps while waiting for later ones, as the seed composes per-app
//! acquisitions; the single global order makes that deadlock-free.

mod admission;
mod claims;
mod lock;
mod queue;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use storage::Clock;
use tokio::sync::{oneshot, watch};

pub use admission::{AdmissionFence, DeletionHandle};
pub use claims::{AppId, Claim, Claims, Mode, Resource, UnknownResource};
pub use session::{Session, SessionEnd, SessionReservation, SessionStartBlock};

use queue::{AppQueue, Entry, EntryId};
use session::SessionSlot;

/// A session holds its claims at most this long after they were granted (the seed's 30 minutes).
pub const SESSION_CAP_MS: i64 = 30 * 60 * 1000;

/// What an operation is and how it wants to be admitted; its claims are passed beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    name: String,
    refuse_when_session: Option<String>,
    allow_compatible_queue_bypass: bool,
}

impl Operation {
    /// `name` appears in errors, snapshots and logs (`"append_file"`, `"delete_workspace"`).
    pub fn new(name: impl Into<String>) -> Self {
        Operation { name: name.into(), refuse_when_session: None, allow_compatible_queue_bypass: false }
    }

    /// Refuse instead of queueing when a session on the app claims something this operation
    /// conflicts with. `action` names what the user asked for ("restore to message"). Checked per app
    /// in the same locked step as the enqueue.
    pub fn refuse_when_session(mut self, action: impl Into<String>) -> Self {
        self.refuse_when_session = Some(action.into());
        self
    }

    /// Mark this operation a long-lived owner whose blocked waiters may be passed by later compatible
    /// work (the seed's `allowCompatibleQueueBypass`; test runs and recordings). Use it only on
    /// long-lived owners.
    pub fn allow_compatible_queue_bypass(mut self) -> Self {
        self.allow_compatible_queue_bypass = true;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Why the coordinator refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationError {
    /// The app is being deleted: admission is closed to everything but its deletion handle.
    #[error("app {app} is closed for deletion; refused {operation}")]
    AdmissionClosed { app: AppId, operation: String },
    /// Someone already closed admission on the app.
    #[error("app {app} is already being deleted")]
    DeletionInProgress { app: AppId },
    /// `refuse_when_session`: a session (live or starting) claims something this operation needs.
    #[error("cannot {action} while session {session} runs on app {app}")]
    RefusedBySession { app: AppId, action: String, session: String },
    /// An operation was started from inside another operation on the same app.
    #[error("{inner} nested inside {outer} on app {app}; declare the full claim set up front")]
    NestedOperation { app: AppId, outer: String, inner: String },
    /// An operation was started for an app not greater than one the task already holds.
    #[error("{operation} takes app {requested} while holding app {held}; apps are taken in ascending order")]
    AppOrder { operation: String, held: AppId, requested: AppId },
    /// `with_lock` on a key this task already holds.
    #[error("with_lock({key}) nested inside itself")]
    NestedLock { key: String },
    /// The app already has a session, live or starting.
    #[error("session {session} is already active on app {app}")]
    SessionActive { app: AppId, session: String },
    /// A `block_session_start` token is held for the app.
    #[error("session start on app {app} is blocked: {reason}")]
    SessionStartBlocked { app: AppId, reason: String },
    /// The reservation or session was torn down (or capped) and is no longer the app's.
    #[error("session {session} on app {app} was cancelled")]
    SessionCancelled { app: AppId, session: String },
}

/// Cloneable handle to the process's coordinator.
#[derive(Clone)]
pub struct OperationCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    /// Distinguishes coordinators in the task-local record of held apps (tests build several).
    id: u64,
    /// Session deadlines are read from it, so tests drive the cap with a `ManualClock`.
    clock: Arc<dyn Clock>,
    /// All app state. A `std` mutex: every critical section is short and synchronous, and `Drop`
    /// impls (which cannot await) must be able to take it.
    state: Mutex<State>,
    /// `with_lock` keys → their FIFO async lock; an entry lives while someone holds or awaits it.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl fmt::Debug for OperationCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationCoordinator").field("id", &self.inner.id).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// Entry, session, fence and block ids; only goes up.
    next_id: u64,
    /// Apps with any activity; an idle, open, unblocked app is forgotten.
    apps: HashMap<AppId, AppState>,
    /// Waiting entries' wake-up senders, taken when the entry is granted.
    waiters: HashMap<EntryId, oneshot::Sender<()>>,
}

#[derive(Default)]
struct AppState {
    queue: AppQueue,
    admission: Admission,
    session: Option<SessionSlot>,
    /// `block_session_start` tokens: (id, reason).
    start_blocks: Vec<(u64, String)>,
    /// `drain` callers, woken when the app is idle.
    drain_waiters: Vec<oneshot::Sender<()>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Admission {
    #[default]
    Open,
    /// Closed by the fence (later the deletion handle) with this id.
    Closed { fence: u64 },
}

impl AppState {
    /// No admitted work left: nothing holds, nothing waits, no session.
    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.session.is_none()
    }

    fn is_forgettable(&self) -> bool {
        self.is_idle()
            && self.admission == Admission::Open
            && self.start_blocks.is_empty()
            && self.drain_waiters.is_empty()
    }
}

/// What the shell does once the lock is released: wake granted waiters, drainers, session owners.
#[derive(Default)]
struct Effects {
    grants: Vec<oneshot::Sender<()>>,
    drained: Vec<oneshot::Sender<()>>,
    ended: Vec<(watch::Sender<Option<SessionEnd>>, SessionEnd)>,
}

impl Effects {
    fn run(self) {
        // A closed receiver means its waiter was cancelled; its own Drop cleans up.
        for tx in self.grants {
            let _ = tx.send(());
        }
        for tx in self.drained {
            let _ = tx.send(());
        }
        for (tx, why) in self.ended {
            tx.send_replace(Some(why));
        }
    }
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn app_mut(&mut self, app: &AppId) -> &mut AppState {
        self.apps.entry(app.clone()).or_default()
    }

    /// Grants whatever may go on `app`, starts session deadlines, wakes drainers, forgets idle apps.
    fn pump(&mut self, app: &AppId, now: i64, fx: &mut Effects) {
        let State { apps, waiters, .. } = self;
        let Some(a) = apps.get_mut(app) else { return };
        for id in a.queue.grant() {
            if let Some(slot) = a.session.as_mut().filter(|s| s.entry == Some(id)) {
                slot.live_until = Some(now + SESSION_CAP_MS);
            }
            if let Some(tx) = waiters.remove(&id) {
                fx.grants.push(tx);
            }
            tracing::trace!(app = %app, entry = id, "claims granted");
        }
        if a.is_idle() {
            fx.drained.append(&mut a.drain_waiters);
        }
        if a.is_forgettable() {
            apps.remove(app);
        }
    }

    /// Checks that an ordinary request may be enqueued on `app` now.
    fn admit(&self, app: &AppId, op: &Operation, claims: &Claims) -> Result<(), OperationError> {
        let Some(a) = self.apps.get(app) else { return Ok(()) };
        if let Admission::Closed { .. } = a.admission {
            return Err(OperationError::AdmissionClosed { app: app.clone(), operation: op.name.clone() });
        }
        if let (Some(action), Some(slot)) = (&op.refuse_when_session, &a.session) {
            if slot.claims.conflicts_with(claims) {
                return Err(OperationError::RefusedBySession {
                    app: app.clone(),
                    action: action.clone(),
                    session: slot.operation.clone(),
                });
            }
        }
        Ok(())
    }

    /// Queues `entry` (its id from [`State::next_id`]) and answers its wake-up receiver, already fired
    /// if it was granted at once.
    fn enqueue(&mut self, app: &AppId, entry: Entry, now: i64, fx: &mut Effects) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.waiters.insert(entry.id, tx);
        self.app_mut(app).queue.push(entry);
        self.pump(app, now, fx);
        rx
    }

    fn remove_entry(&mut self, app: &AppId, id: EntryId, now: i64, fx: &mut Effects) {
        self.waiters.remove(&id);
        if let Some(a) = self.apps.get_mut(app) {
            a.queue.remove(id);
        }
        self.pump(app, now, fx);
    }
}

/// How a request gets past admission.
#[derive(Clone, Copy)]
enum Admit {
    /// Admission checks apply (closed admission, `refuse_when_session`).
    Ordinary,
    /// Through a deletion handle: admission is closed by this fence and the app is drained.
    Deletion,
}

impl OperationCoordinator {
    /// The process's coordinator; `clock` drives the session cap.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        OperationCoordinator {
            inner: Arc::new(Inner {
                id: NEXT.fetch_add(1, Ordering::Relaxed),
                clock,
                state: Mutex::new(State::default()),
                locks: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// One synchronous step on the state: expire capped sessions, apply `f`, then (unlocked) run the
    /// effects. `f` must not drop a guard or ticket (their `Drop` takes this lock).
    fn apply<R>(&self, f: impl FnOnce(&mut State, i64, &mut Effects) -> R) -> R {
        let now = self.inner.clock.now_ms();
        let mut fx = Effects::default();
        let out = {
            // A panic while holding the lock would be a bug in this module's pure code; recovering
            // the state beats cascading panics out of every guard's `Drop`.
            let mut state = self.inner.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.expire_sessions(now, &mut fx);
            f(&mut state, now, &mut fx)
        };
        fx.run();
        out
    }

    /// Runs `op` holding `claims` on `app`, queueing until all of them are free; releases when `op`
    /// finishes (or is dropped). Refuses, without queueing, when admission is closed, when
    /// `refuse_when_session` applies, or when the calling task already holds this app.
    pub async fn run<F: Future>(
        &self,
        app: &AppId,
        operation: Operation,
        claims: impl Into<Claims>,
        op: F,
    ) -> Result<F::Output, OperationError> {
        let guard = self.acquire(app, operation, claims).await?;
        Ok(guard.scope(op).await)
    }

    /// Runs `op` holding claims on several apps. Apps named twice are merged (stronger mode wins) and
    /// taken in ascending [`AppId`] order whatever order they are given in; refusal and admission are
    /// checked per app against that app's own claims.
    pub async fn run_many<F: Future>(
        &self,
        apps: impl IntoIterator<Item = (AppId, Claims)>,
        operation: Operation,
        op: F,
    ) -> Result<F::Output, OperationError> {
        let guard = self.acquire_many(apps, operation).await?;
        Ok(guard.scope(op).await)
    }

    /// Like [`run`](Self::run), handing back the guard: the claims are held until it drops. Work done
    /// for the guard should run in [`OperationGuard::scope`] so nesting is refused by name.
    pub async fn acquire(
        &self,
        app: &AppId,
        operation: Operation,
        claims: impl Into<Claims>,
    ) -> Result<OperationGuard, OperationError> {
        self.acquire_many([(app.clone(), claims.into())], operation).await
    }

    /// Like [`run_many`](Self::run_many), handing back the guard.
    pub async fn acquire_many(
        &self,
        apps: impl IntoIterator<Item = (AppId, Claims)>,
        operation: Operation,
    ) -> Result<OperationGuard, OperationError> {
        // A BTreeMap de-duplicates and orders the apps bytewise in one go.
        let mut plan: BTreeMap<AppId, Claims> = BTreeMap::new();
        for (app, claims) in apps {
            plan.entry(app).or_default().merge(&claims);
        }
        self.check_nesting(plan.keys(), &operation.name)?;
        // Fail fast, before holding anything, when some app would refuse now. The authoritative check
        // is the one in each app's enqueue step below.
        self.apply(|st, _, _| plan.iter().try_for_each(|(app, claims)| st.admit(app, &operation, claims)))?;
        let mut tickets = Vec::with_capacity(plan.len());
        for (app, claims) in plan {
            // Holding the earlier (smaller) apps while waiting here is the seed's ordered composition.
            let mut ticket = self.enqueue(&app, &operation, claims, Admit::Ordinary)?;
            ticket.granted().await;
            tickets.push(ticket);
        }
        Ok(OperationGuard { operation: operation.name, tickets })
    }

    /// Enqueues on one app in one locked step with its admission checks; the ticket releases on drop.
    fn enqueue(&self, app: &AppId, op: &Operation, claims: Claims, admit: Admit) -> Result<Ticket, OperationError> {
        let (entry, rx) = self.apply(|st, now, fx| {
            if let Admit::Ordinary = admit {
                st.admit(app, op, &claims)?;
            }
            let id = st.next_id();
            let entry =
                Entry { id, operation: op.name.clone(), claims, bypass_owner: op.allow_compatible_queue_bypass };
            Ok((id, st.enqueue(app, entry, now, fx)))
        })?;
        Ok(Ticket { coord: self.clone(), app: app.clone(), entry, granted: Some(rx) })
    }

    /// Refuses `apps` when the calling task already holds one of them (or a greater one) through an
    /// operation of this coordinator.
    fn check_nesting<'a>(
        &self,
        apps: impl Iterator<Item = &'a AppId> + Clone,
        operation: &str,
    ) -> Result<(), OperationError> {
        let held = Held::now();
        let mine: Vec<&HeldApp> = held.apps.iter().filter(|h| h.coordinator == self.inner.id).collect();
        for app in apps.clone() {
            if let Some(outer) = mine.iter().find(|h| &h.app == app) {
                return Err(OperationError::NestedOperation {
                    app: app.clone(),
                    outer: outer.operation.clone(),
                    inner: operation.to_owned(),
                });
            }
        }
        if let (Some(held), Some(requested)) = (mine.iter().map(|h| &h.app).max(), apps.min()) {
            if requested <= held {
                return Err(OperationError::AppOrder {
                    operation: operation.to_owned(),
                    held: held.clone(),
                    requested: requested.clone(),
                });
            }
        }
        Ok(())
    }

    /// A consistent picture of one app, for tests, logs and debug endpoints. Holders are listed in the
    /// order they were enqueued, waiters in queue order.
    pub fn snapshot(&self, app: &AppId) -> AppSnapshot {
        self.apply(|st, _, _| {
            let Some(a) = st.apps.get(app) else { return AppSnapshot::idle() };
            let view = |e: &Entry| EntrySnapshot { operation: e.operation.clone(), claims: e.claims.clone() };
            let mut holding: Vec<&Entry> = a.queue.holding().iter().collect();
            holding.sort_by_key(|e| e.id);
            AppSnapshot {
                holding: holding.into_iter().map(view).collect(),
                waiting: a.queue.waiting().map(view).collect(),
                admission_open: a.admission == Admission::Open,
                session: a.session.as_ref().map(SessionSlot::snapshot),
                session_start_blocks: a.start_blocks.iter().map(|(_, reason)| reason.clone()).collect(),
            }
        })
    }
}

/// One app as the coordinator sees it at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppSnapshot {
    pub holding: Vec<EntrySnapshot>,
    pub waiting: Vec<EntrySnapshot>,
    pub admission_open: bool,
    pub session: Option<SessionSnapshot>,
    pub session_start_blocks: Vec<String>,
}

impl AppSnapshot {
    fn idle() -> Self {
        AppSnapshot {
            holding: Vec::new(),
            waiting: Vec::new(),
            admission_open: true,
            session: None,
            session_start_blocks: Vec::new(),
        }
    }

    /// Names of the operations holding claims, in enqueue order.
    pub fn holding_names(&self) -> Vec<&str> {
        self.holding.iter().map(|e| e.operation.as_str()).collect()
    }

    /// Names of the waiting operations, in queue order.
    pub fn waiting_names(&self) -> Vec<&str> {
        self.waiting.iter().map(|e| e.operation.as_str()).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySnapshot {
    pub operation: String,
    pub claims: Claims,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSnapshot {
    pub operation: String,
    pub phase: SessionPhase,
    /// When the cap ends it (clock milliseconds); set once live.
    pub deadline_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionPhase {
    /// Reserved before the handler's first await; not yet queued.
    Reserved,
    /// Queued for its claims.
    Acquiring,
    /// Holding its claims.
    Live,
}

/// One operation's place on one app. Dropping it — finished, failed, cancelled or panicked — leaves
/// the queue (waiting) or releases the claims (holding), and lets whoever may go next go.
struct Ticket {
    coord: OperationCoordinator,
    app: AppId,
    entry: EntryId,
    granted: Option<oneshot::Receiver<()>>,
}

impl Ticket {
    async fn granted(&mut self) {
        if let Some(rx) = self.granted.take() {
            // Only this ticket removes an ordinary entry, so its sender is dropped unsent only if
            // the whole state is gone, and this ticket keeps the state alive.
            rx.await.expect("an ordinary entry is removed only by its own ticket");
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let (app, entry) = (&self.app, self.entry);
        self.coord.apply(|st, now, fx| st.remove_entry(app, entry, now, fx));
    }
}

/// Claims held on one or more apps; dropping it releases them all.
#[must_use = "dropping the guard releases the claims at once"]
pub struct OperationGuard {
    operation: String,
    tickets: Vec<Ticket>,
}

impl fmt::Debug for OperationGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationGuard")
            .field("operation", &self.operation)
            .field("apps", &self.apps().collect::<Vec<_>>())
            .finish()
    }
}

impl OperationGuard {
    /// The apps held, ascending.
    pub fn apps(&self) -> impl Iterator<Item = &AppId> {
        self.tickets.iter().map(|t| &t.app)
    }

    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// Runs `fut` as this operation's work: inside it, starting another operation on a held app is
    /// refused by name instead of queueing behind this one forever. (The record is task-local: a
    /// task spawned from `fut` is not covered.)
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        let mut held = Held::now();
        held.apps.extend(self.tickets.iter().map(|t| HeldApp {
            coordinator: t.coord.inner.id,
            app: t.app.clone(),
            operation: self.operation.clone(),
        }));
        HELD.scope(held, fut).await
    }
}

tokio::task_local! {
    /// What the current task holds through this module, so nesting is refused by name.
    static HELD: Held;
}

#[derive(Debug, Clone, Default)]
struct Held {
    apps: Vec<HeldApp>,
    /// `with_lock` keys: (coordinator id, key).
    keys: Vec<(u64, String)>,
}

#[derive(Debug, Clone)]
struct HeldApp {
    coordinator: u64,
    app: AppId,
    operation: String,
}

impl Held {
    fn now() -> Held {
        HELD.try_with(Held::clone).unwrap_or_default()
    }
}
