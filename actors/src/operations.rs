//! `OperationCoordinator`: exclusion for operations on the same app (SPEC §10, seed
//! `app-operation-coordination.txt`). In Switchboard an app is a run workspace ([`AppId`]).
//!
//! Owns, inside one actix actor per process (`actor::Coordinator`), for every app with activity: its
//! claim queue (holders and FIFO waiters), its admission state, its session slot, its session-start
//! blocks and its drain waiters; and, apart from apps, the string-keyed locks of
//! [`OperationCoordinator::with_lock`]. Callers hold a cloneable [`OperationCoordinator`] handle (an
//! actix `Addr`, which is `Send`): any arbiter, thread or plain tokio task may use it.
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
//! # Messages
//!
//! Every message is sent with `do_send`, so it is in the mailbox when the sending call returns (or,
//! for an `async fn`, at its first poll) whatever the mailbox's load; an answer travels back through a
//! `oneshot` the message carries. All of them are handled by the coordinator actor, which first ends
//! the sessions past their cap.
//!
//! Each entry: sender → what it carries → what it answers (— for none).
//! - `Acquire`: `acquire`, `acquire_many`, `run`, `run_many`, `DeletionHandle::run` → app, entry (id,
//!   operation, claims, bypass flag), admission path (ordinary, or a deletion fence), the later apps of
//!   a cross-app operation to admission-check in the same step → grant: `Ok(granted_at)` once granted,
//!   or the refusal at once;
//! - `Release`: `Drop` of a guard or of a pending request's ticket → app, entry id → —;
//! - `CloseAdmission`: `close_admission` → app, fence id → `Ok` or `DeletionInProgress`;
//! - `Reopen`: `Drop` of `AdmissionFence` / `DeletionHandle` → app, fence id (ignored unless it still
//!   closes the app) → —;
//! - `Drain`: `AdmissionFence::drain` → app → `()` once nothing admitted is left;
//! - `ReserveSession`: `reserve_session` → app, session id, operation, claims, bypass flag, the `ended`
//!   watch → `Ok`, or `AdmissionClosed` / `SessionStartBlocked` / `SessionActive`;
//! - `StartSession`: `SessionReservation::start` → app, session id, entry id → grant:
//!   `Ok(granted_at)`, or `SessionCancelled`;
//! - `EndSession`: `end_session` (any session: teardown), `Drop` of a reservation or session (only its
//!   own id) → app, optional session id → — (the owner learns why through `ended`);
//! - `CheckSession`: `SessionReservation::check`, `Session::is_live` → app, session id → whether it is
//!   still the app's session;
//! - `RefuseIfSession`: `refuse_if_session` → app, claims, action → `Ok` or `RefusedBySession`;
//! - `BlockSessionStart` / `UnblockSessionStart`: `block_session_start` / `Drop` of its token → app,
//!   block id (and reason) → —;
//! - `ExpireSessions`: `expire_sessions`, the session reaper → nothing → —;
//! - `GetSnapshot`: `snapshot` → app → [`AppSnapshot`];
//! - `Lock` / `Unlock`: `with_lock` / `Drop` of its lease → key, lease id → `Lock`: grant `()` once the
//!   lease holds the key;
//! - `GetLockKeyCount`: `active_lock_keys` → nothing → how many keys are held or awaited.
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
//! | state   | means to others                                        | leaves by                                |
//! |---------|--------------------------------------------------------|------------------------------------------|
//! | waiting | holds nothing; later conflicting work queues behind it | granted whole, or cancelled (`Release`)  |
//! | holding | holds every claim it declared for this app             | guard dropped (`Release`); waiter gone   |
//!
//! An app's admission (owner: whoever holds the fence, then the deletion handle):
//!
//! | state            | means                                                    | leaves by                    |
//! |------------------|----------------------------------------------------------|------------------------------|
//! | open             | new work admitted                                        | `close_admission` → draining |
//! | closed, draining | new work refused (`AdmissionClosed`); admitted work runs | idle → drained; fence drop   |
//! | closed, drained  | only [`DeletionHandle`] work runs                        | handle dropped → open        |
//!
//! An app's session slot (owner: the coordinator; reservation and session handles only ask about it):
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
//!   seed's compatible-queue bypass, decided in `operations/queue.rs`; FIFO is mailbox order;
//! - cross-app operations de-duplicate apps and acquire them in ascending [`AppId`] order — bytewise,
//!   since SPEC §10 makes app ids workspace ids (strings); the seed's "numeric order" exists to give
//!   every caller one global order, which bytewise order gives;
//!   a task inside an operation may start another only on strictly greater apps — the same app is
//!   refused as [`OperationError::NestedOperation`], a smaller one as [`OperationError::AppOrder`];
//! - `refuse_when_session` is decided in the same handler step as the enqueue, per app, against that
//!   app's session claims: no session can start in between;
//! - admission is bypassed only through a [`DeletionHandle`], which only `drain` creates, and the
//!   actor checks that the handle's fence still closes the app;
//! - no claims stay with a holder that is gone: a guard's `Drop` sends `Release`, and a grant whose
//!   receiver is gone is released in the handler step that granted it;
//! - the coordinator never times out a waiting operation; only sessions end by themselves (the cap).
//!
//! # Design
//!
//! One actor owns the state, so every decision is one handler step and mailbox order is the order of
//! requests: a release and the grants it enables happen in one step, with no window for a later
//! request in between. The rules themselves are pure and tested apart (`claims`, `queue`); the actor's
//! `State` applies them and answers through the oneshots the messages carry.
//!
//! Ids (entries, fences, sessions, blocks, lock leases) are minted by the handle before the request is
//! sent, from a counter its clones share. So a request's cleanup exists before its answer does: a
//! guard-like value is built first, and if the caller's future is dropped while waiting, its `Drop`
//! sends `Release` (or `EndSession`, `Unlock`, `Reopen`) right behind the request; releases of ids
//! the coordinator does not hold are no-ops. `Drop` cannot await, which is why every release is a
//! `do_send`.
//!
//! Cross-app operations hold earlier apps while waiting for later ones, as the seed composes per-app
//! acquisitions; the single global order makes that deadlock-free.
//!
//! The actor starts on the arbiter that calls [`OperationCoordinator::new`] (an actix `System` must be
//! running there) and stops when the last handle, guard and token is dropped.

mod actor;
mod admission;
mod claims;
mod lock;
mod queue;
mod session;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::{Actor, Addr, Handler, Message};
use storage::Clock;
use tokio::sync::oneshot;

pub use admission::{AdmissionFence, DeletionHandle};
pub use claims::{AppId, Claim, Claims, Mode, Resource, UnknownResource};
pub use session::{Session, SessionEnd, SessionReservation, SessionStartBlock};

use actor::{Acquire, Coordinator, GetSnapshot, Release};
use lock::KeyLocks;
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
        Operation {
            name: name.into(),
            refuse_when_session: None,
            allow_compatible_queue_bypass: false,
        }
    }

    /// Refuse instead of queueing when a session on the app claims something this operation
    /// conflicts with. `action` names what the user asked for ("restore to message"). Checked per app
    /// in the same handler step as the enqueue.
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
    RefusedBySession {
        app: AppId,
        action: String,
        session: String,
    },
    /// An operation was started from inside another operation on the same app.
    #[error("{inner} nested inside {outer} on app {app}; declare the full claim set up front")]
    NestedOperation {
        app: AppId,
        outer: String,
        inner: String,
    },
    /// An operation was started for an app not greater than one the task already holds.
    #[error("{operation} takes app {requested} while holding app {held}; apps are taken in ascending order")]
    AppOrder {
        operation: String,
        held: AppId,
        requested: AppId,
    },
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
    /// The coordinator actor is not running (the system is stopping); nothing is held.
    #[error("the operation coordinator is not running")]
    Unavailable,
}

/// Cloneable handle to the process's coordinator actor. Every method either puts a message in its
/// mailbox and returns, or does so and awaits the answer; none needs to run on the actor's arbiter.
#[derive(Clone)]
pub struct OperationCoordinator {
    /// The actor that makes every decision. `Addr` is `Send` and `Sync`.
    addr: Addr<Coordinator>,
    /// Shared by every clone of this handle.
    ids: Arc<Ids>,
}

struct Ids {
    /// Distinguishes coordinators in the task-local record of held apps (tests build several).
    coordinator: u64,
    /// Entry, fence, session, block and lease ids, minted here so a request's cleanup can name it
    /// before the answer comes. Only goes up: a stale id never names a newer request.
    next: AtomicU64,
}

impl fmt::Debug for OperationCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperationCoordinator")
            .field("id", &self.ids.coordinator)
            .finish_non_exhaustive()
    }
}

/// Where a queued entry's grant goes: `Ok(granted_at)` (clock milliseconds) once it holds its claims,
/// or why it never will. Sent at most once; a send that fails means the waiter is gone.
type Grant = oneshot::Sender<Result<i64, OperationError>>;

/// Everything the coordinator actor owns. Its methods are the actor's transitions: each runs inside
/// one handler step and answers through the oneshots it is handed.
#[derive(Default)]
struct State {
    /// Apps with any activity; an idle, open, unblocked app is forgotten.
    apps: HashMap<AppId, AppState>,
    /// Queued entries' grant senders, taken when the entry is granted or leaves the queue.
    waiters: HashMap<EntryId, Grant>,
    /// The `with_lock` keys held or awaited.
    locks: KeyLocks,
}

#[derive(Default)]
struct AppState {
    queue: AppQueue,
    admission: Admission,
    session: Option<SessionSlot>,
    /// `block_session_start` tokens: (id, reason).
    start_blocks: Vec<(u64, String)>,
    /// `drain` callers, answered when the app is idle.
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

/// How a request gets past admission.
#[derive(Debug)]
enum Admit {
    /// Admission checks apply: closed admission, and `refuse_when_session` with this action.
    Ordinary { refuse_when_session: Option<String> },
    /// Through a deletion handle: admitted only while this fence closes the app.
    Deletion { fence: u64 },
}

impl State {
    fn app_mut(&mut self, app: &AppId) -> &mut AppState {
        self.apps.entry(app.clone()).or_default()
    }

    /// Grants whatever may go on `app`, starts session deadlines, answers drainers, forgets idle apps.
    /// A grant whose receiver is gone (the waiting future was dropped) is released at once, which may
    /// let further entries go in this same step.
    fn pump(&mut self, app: &AppId, now: i64) {
        let State { apps, waiters, .. } = self;
        let Some(a) = apps.get_mut(app) else { return };
        loop {
            let mut released = false;
            for id in a.queue.grant() {
                let delivered = waiters
                    .remove(&id)
                    .is_some_and(|grant| grant.send(Ok(now)).is_ok());
                let is_session = a.session.as_ref().is_some_and(|s| s.entry == Some(id));
                if delivered {
                    if let Some(slot) = a.session.as_mut().filter(|_| is_session) {
                        slot.live_until = Some(now + SESSION_CAP_MS);
                    }
                    tracing::trace!(app = %app, entry = id, "claims granted");
                    continue;
                }
                tracing::debug!(app = %app, entry = id, "claims granted to a waiter that is gone; released");
                a.queue.remove(id);
                if let Some(slot) = a.session.take_if(|_| is_session) {
                    slot.ended.send_replace(Some(SessionEnd::Ended));
                }
                released = true;
            }
            if !released {
                break;
            }
        }
        if a.is_idle() {
            for drained in a.drain_waiters.drain(..) {
                let _ = drained.send(());
            }
        }
        if a.is_forgettable() {
            apps.remove(app);
        }
    }

    /// Checks that an ordinary request may be enqueued on `app` now.
    fn admit(
        &self,
        app: &AppId,
        operation: &str,
        refuse_when_session: Option<&str>,
        claims: &Claims,
    ) -> Result<(), OperationError> {
        let Some(a) = self.apps.get(app) else {
            return Ok(());
        };
        if let Admission::Closed { .. } = a.admission {
            return Err(OperationError::AdmissionClosed {
                app: app.clone(),
                operation: operation.to_owned(),
            });
        }
        if let (Some(action), Some(slot)) = (refuse_when_session, &a.session) {
            if slot.claims.conflicts_with(claims) {
                return Err(OperationError::RefusedBySession {
                    app: app.clone(),
                    action: action.to_owned(),
                    session: slot.operation.clone(),
                });
            }
        }
        Ok(())
    }

    /// `Acquire`: admits the request on its app and on the `also` apps in one step, then queues it; the
    /// grant, or the refusal, goes to `grant`.
    fn acquire(
        &mut self,
        Acquire {
            app,
            entry,
            admit,
            also,
            grant,
        }: Acquire,
        now: i64,
    ) {
        let admitted = match &admit {
            Admit::Ordinary {
                refuse_when_session,
            } => std::iter::once((&app, &entry.claims))
                .chain(also.iter().map(|(a, c)| (a, c)))
                .try_for_each(|(a, c)| {
                    self.admit(a, &entry.operation, refuse_when_session.as_deref(), c)
                }),
            Admit::Deletion { fence } => self.admit_deletion(&app, *fence, &entry.operation),
        };
        if let Err(refused) = admitted {
            let _ = grant.send(Err(refused));
            return;
        }
        self.waiters.insert(entry.id, grant);
        self.app_mut(&app).queue.push(entry);
        self.pump(&app, now);
    }

    /// `Release`: the entry leaves the queue or gives up its claims, and whoever may go next goes. An
    /// id the app does not hold (a refused request, one already released) changes nothing.
    fn release(&mut self, app: &AppId, entry: EntryId, now: i64) {
        self.waiters.remove(&entry);
        if let Some(a) = self.apps.get_mut(app) {
            a.queue.remove(entry);
        }
        self.pump(app, now);
    }

    /// A consistent picture of one app.
    fn snapshot(&self, app: &AppId) -> AppSnapshot {
        let Some(a) = self.apps.get(app) else {
            return AppSnapshot::idle();
        };
        let view = |e: &Entry| EntrySnapshot {
            operation: e.operation.clone(),
            claims: e.claims.clone(),
        };
        let mut holding: Vec<&Entry> = a.queue.holding().iter().collect();
        holding.sort_by_key(|e| e.id);
        AppSnapshot {
            holding: holding.into_iter().map(view).collect(),
            waiting: a.queue.waiting().map(view).collect(),
            admission_open: a.admission == Admission::Open,
            session: a.session.as_ref().map(SessionSlot::snapshot),
            session_start_blocks: a
                .start_blocks
                .iter()
                .map(|(_, reason)| reason.clone())
                .collect(),
        }
    }
}

impl OperationCoordinator {
    /// Starts the process's coordinator actor on the current arbiter (an actix `System` must be
    /// running) and answers a handle to it; `clock` drives the session cap.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        OperationCoordinator {
            addr: Coordinator::new(clock).start(),
            ids: Arc::new(Ids {
                coordinator: NEXT.fetch_add(1, Ordering::Relaxed),
                next: AtomicU64::new(1),
            }),
        }
    }

    fn next_id(&self) -> u64 {
        self.ids.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts `msg` in the coordinator's mailbox before returning (`do_send` does not wait for room). A
    /// message to an actor that is gone is dropped: it holds nothing any more.
    fn tell<M>(&self, msg: M)
    where
        Coordinator: Handler<M>,
        M: Message<Result = ()> + Send + 'static,
    {
        self.addr.do_send(msg);
    }

    /// Sends the message `build` makes around a reply sender, then waits for the reply.
    async fn ask<M, T>(
        &self,
        build: impl FnOnce(oneshot::Sender<T>) -> M,
    ) -> Result<T, OperationError>
    where
        Coordinator: Handler<M>,
        M: Message<Result = ()> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.tell(build(reply));
        answer.await.map_err(|_| OperationError::Unavailable)
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
        self.acquire_many([(app.clone(), claims.into())], operation)
            .await
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
        let plan: Vec<(AppId, Claims)> = plan.into_iter().collect();
        self.check_nesting(plan.iter().map(|(app, _)| app), &operation.name)?;
        let mut tickets = Vec::with_capacity(plan.len());
        for (i, (app, claims)) in plan.iter().enumerate() {
            // The first request also checks the later apps, in its own step, so that nothing is held
            // when some app would refuse now. Each app's own enqueue step stays the authoritative check.
            let also = if i == 0 {
                plan[1..].to_vec()
            } else {
                Vec::new()
            };
            let admit = Admit::Ordinary {
                refuse_when_session: operation.refuse_when_session.clone(),
            };
            // Holding the earlier (smaller) apps while waiting here is the seed's ordered composition.
            tickets.push(
                self.enqueue(app, &operation, claims.clone(), admit, also)
                    .await?,
            );
        }
        Ok(OperationGuard {
            operation: operation.name,
            tickets,
        })
    }

    /// Queues one request on one app and waits for its grant. The ticket is built before the request
    /// is sent: if this future is dropped while waiting, the ticket's `Release` follows the `Acquire`.
    async fn enqueue(
        &self,
        app: &AppId,
        operation: &Operation,
        claims: Claims,
        admit: Admit,
        also: Vec<(AppId, Claims)>,
    ) -> Result<Ticket, OperationError> {
        let entry = Entry {
            id: self.next_id(),
            operation: operation.name.clone(),
            claims,
            bypass_owner: operation.allow_compatible_queue_bypass,
        };
        let ticket = Ticket {
            coord: self.clone(),
            app: app.clone(),
            entry: entry.id,
        };
        self.ask(|grant| Acquire {
            app: app.clone(),
            entry,
            admit,
            also,
            grant,
        })
        .await??;
        Ok(ticket)
    }

    /// Refuses `apps` when the calling task already holds one of them (or a greater one) through an
    /// operation of this coordinator.
    fn check_nesting<'a>(
        &self,
        apps: impl Iterator<Item = &'a AppId> + Clone,
        operation: &str,
    ) -> Result<(), OperationError> {
        let held = Held::now();
        let mine: Vec<&HeldApp> = held
            .apps
            .iter()
            .filter(|h| h.coordinator == self.ids.coordinator)
            .collect();
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

    /// A consistent picture of one app, for tests, logs and debug endpoints: it reflects every message
    /// sent before this call. Holders are listed by request id (the order their requests were made),
    /// waiters in queue order.
    pub async fn snapshot(&self, app: &AppId) -> Result<AppSnapshot, OperationError> {
        self.ask(|reply| GetSnapshot {
            app: app.clone(),
            reply,
        })
        .await
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

    /// Names of the operations holding claims, in request order.
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

/// One operation's place on one app. Dropping it — finished, failed, cancelled or panicked — sends
/// `Release`: the entry leaves the queue (waiting) or gives up its claims (holding), and whoever may go
/// next is granted in the same handler step.
struct Ticket {
    coord: OperationCoordinator,
    app: AppId,
    entry: EntryId,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.coord.tell(Release {
            app: self.app.clone(),
            entry: self.entry,
        });
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
            coordinator: t.coord.ids.coordinator,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    fn write_metadata(id: EntryId, name: &str) -> Entry {
        Entry {
            id,
            operation: name.to_owned(),
            claims: Claims::new().write(Resource::Metadata),
            bypass_owner: false,
        }
    }

    fn request(
        app: &AppId,
        entry: Entry,
    ) -> (Acquire, oneshot::Receiver<Result<i64, OperationError>>) {
        let (grant, granted) = oneshot::channel();
        let admit = Admit::Ordinary {
            refuse_when_session: None,
        };
        (
            Acquire {
                app: app.clone(),
                entry,
                admit,
                also: Vec::new(),
                grant,
            },
            granted,
        )
    }

    #[test]
    fn a_grant_whose_receiver_is_gone_is_released_in_the_step_that_granted_it() {
        // A holder, then two waiters; the first waiter's future is dropped before the holder releases.
        let mut st = State::default();
        let app = AppId::new("ws-1");
        let (holder, mut holder_granted) = request(&app, write_metadata(1, "holder"));
        let (gone, gone_granted) = request(&app, write_metadata(2, "gone"));
        let (next, mut next_granted) = request(&app, write_metadata(3, "next"));
        st.acquire(holder, 10);
        st.acquire(gone, 10);
        st.acquire(next, 10);
        assert_eq!(holder_granted.try_recv(), Ok(Ok(10)));
        drop(gone_granted);
        // The holder's release grants "gone", whose receiver is gone: released in the same step, so
        // "next" holds when `release` returns, with no message in between.
        st.release(&app, 1, 20);
        assert_eq!(next_granted.try_recv(), Ok(Ok(20)));
        assert_eq!(st.snapshot(&app).holding_names(), ["next"]);
        // The late `Release` from the dropped future's ticket is a no-op.
        st.release(&app, 2, 30);
        assert_eq!(st.snapshot(&app).holding_names(), ["next"]);
        st.release(&app, 3, 40);
        assert!(st.apps.is_empty(), "an idle app is forgotten");
    }

    /// Tools run on any arbiter and may be spawned: the futures and guards must be `Send`.
    #[actix_rt::test]
    async fn handle_futures_and_guards_are_send() {
        let coord = OperationCoordinator::new(Arc::new(storage::ManualClock::new(0)));
        let app = AppId::new("ws-1");
        assert_send(&coord.run(
            &app,
            Operation::new("op"),
            Claim::write(Resource::Media),
            async {},
        ));
        assert_send(&coord.with_lock("key", async {}));
        assert_send(&coord.close_admission(&app));
        let guard = coord
            .acquire(&app, Operation::new("op"), Claim::write(Resource::Media))
            .await
            .unwrap();
        assert_send(&guard);
    }
}
