//! Long-lived sessions (the seed's recordings and test runs): claims held for a user-controlled time.
//!
//! A session's life is the app's session slot (see the state table in the parent module). The slot is
//! owned by the coordinator actor; the [`SessionReservation`] and [`Session`] handles carry only the
//! slot id they were given, and every question they ask ("am I still the app's session?") is a
//! message answered from the slot. Teardown empties the slot; that empty (or successor-filled) slot is
//! the cancellation tombstone, and every release compares ids first.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use super::actor::{
    BlockSessionStart, CheckSession, EndSession, ExpireSessions, RefuseIfSession, ReserveSession,
    StartSession, UnblockSessionStart,
};
use super::queue::{Entry, EntryId};
use super::{
    Admission, AppId, Claims, Held, HeldApp, Operation, OperationCoordinator, OperationError,
    SessionPhase, SessionSnapshot, State, HELD, SESSION_CAP_MS,
};

/// Why a session ended, as its owner learns from [`Session::ended`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Its owner ended it (or dropped the handle).
    Ended,
    /// It reached [`SESSION_CAP_MS`](super::SESSION_CAP_MS) after its claims were granted.
    Capped,
    /// A teardown ([`OperationCoordinator::end_session`]) ended it: stop, delete, restart of the app.
    TornDown,
}

/// The coordinator-owned record of an app's session.
pub(super) struct SessionSlot {
    /// Identity checked by every release and every tombstone read.
    pub id: u64,
    pub operation: String,
    pub claims: Claims,
    pub bypass_owner: bool,
    /// The queue entry once `start` enqueued it.
    pub entry: Option<EntryId>,
    /// Set when the claims are granted: grant time + cap.
    pub live_until: Option<i64>,
    /// Tells the owner how it ended; the slot sends exactly once, when it is emptied.
    pub ended: watch::Sender<Option<SessionEnd>>,
}

impl SessionSlot {
    pub fn snapshot(&self) -> SessionSnapshot {
        let phase = match (self.entry, self.live_until) {
            (None, _) => SessionPhase::Reserved,
            (Some(_), None) => SessionPhase::Acquiring,
            (Some(_), Some(_)) => SessionPhase::Live,
        };
        SessionSnapshot {
            operation: self.operation.clone(),
            phase,
            deadline_ms: self.live_until,
        }
    }
}

impl State {
    /// Whether `id` is still `app`'s session.
    pub(super) fn slot_is(&self, app: &AppId, id: u64) -> bool {
        self.apps
            .get(app)
            .and_then(|a| a.session.as_ref())
            .is_some_and(|s| s.id == id)
    }

    /// `ReserveSession`: refused while admission is closed, while a start block is held, or while the
    /// app already has a session.
    pub(super) fn reserve_session(&mut self, msg: ReserveSession) {
        let ReserveSession {
            app,
            id,
            operation,
            claims,
            bypass_owner,
            ended,
            reply,
        } = msg;
        let refused = self.apps.get(&app).and_then(|a| {
            if let Admission::Closed { .. } = a.admission {
                return Some(OperationError::AdmissionClosed {
                    app: app.clone(),
                    operation: operation.clone(),
                });
            }
            if let Some((_, reason)) = a.start_blocks.first() {
                return Some(OperationError::SessionStartBlocked {
                    app: app.clone(),
                    reason: reason.clone(),
                });
            }
            let active = a.session.as_ref()?;
            Some(OperationError::SessionActive {
                app: app.clone(),
                session: active.operation.clone(),
            })
        });
        if let Some(refused) = refused {
            let _ = reply.send(Err(refused));
            return;
        }
        let slot = SessionSlot {
            id,
            operation,
            claims,
            bypass_owner,
            entry: None,
            live_until: None,
            ended,
        };
        self.app_mut(&app).session = Some(slot);
        let _ = reply.send(Ok(()));
    }

    /// `StartSession`: queues the reserved session for its claims; `SessionCancelled` if the slot is
    /// no longer this reservation's.
    pub(super) fn start_session(&mut self, msg: StartSession, now: i64) {
        let StartSession {
            app,
            id,
            operation,
            entry,
            grant,
        } = msg;
        let slot = self.apps.get_mut(&app).and_then(|a| a.session.as_mut());
        let Some(slot) = slot.filter(|s| s.id == id && s.entry.is_none()) else {
            let _ = grant.send(Err(OperationError::SessionCancelled {
                app,
                session: operation,
            }));
            return;
        };
        // Recorded in the slot before the enqueue, so that the grant starts the deadline.
        slot.entry = Some(entry);
        let entry = Entry {
            id: entry,
            operation,
            claims: slot.claims.clone(),
            bypass_owner: slot.bypass_owner,
        };
        self.waiters.insert(entry.id, grant);
        self.app_mut(&app).queue.push(entry);
        self.pump(&app, now);
    }

    /// Empties `app`'s slot (only if it is `only`, when given): leaves the queue or releases the
    /// claims, tells the owner `why`, lets the next operations go.
    pub(super) fn end_slot(&mut self, app: &AppId, only: Option<u64>, why: SessionEnd, now: i64) {
        let Some(a) = self.apps.get_mut(app) else {
            return;
        };
        let Some(slot) = a.session.take_if(|s| only.is_none_or(|id| s.id == id)) else {
            return;
        };
        if let Some(entry) = slot.entry {
            a.queue.remove(entry);
            // Still queued: its start is told it was cancelled.
            if let Some(grant) = self.waiters.remove(&entry) {
                let _ = grant.send(Err(OperationError::SessionCancelled {
                    app: app.clone(),
                    session: slot.operation.clone(),
                }));
            }
        }
        tracing::debug!(app = %app, session = %slot.operation, ?why, "session slot emptied");
        slot.ended.send_replace(Some(why));
        self.pump(app, now);
    }

    /// Ends every live session whose deadline has passed.
    pub(super) fn expire_sessions(&mut self, now: i64) {
        let due: Vec<(AppId, u64, String)> = self
            .apps
            .iter()
            .filter_map(|(app, a)| {
                let s = a.session.as_ref()?;
                s.live_until
                    .is_some_and(|t| now >= t)
                    .then(|| (app.clone(), s.id, s.operation.clone()))
            })
            .collect();
        for (app, id, operation) in due {
            tracing::info!(app = %app, session = %operation, "session reached its 30-minute cap; claims released");
            self.end_slot(&app, Some(id), SessionEnd::Capped, now);
        }
    }

    /// `RefuseIfSession`.
    pub(super) fn refuse_if_session(
        &self,
        app: &AppId,
        claims: &Claims,
        action: &str,
    ) -> Result<(), OperationError> {
        match self.apps.get(app).and_then(|a| a.session.as_ref()) {
            Some(s) if s.claims.conflicts_with(claims) => Err(OperationError::RefusedBySession {
                app: app.clone(),
                action: action.to_owned(),
                session: s.operation.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// `BlockSessionStart`.
    pub(super) fn block_session_start(&mut self, app: &AppId, id: u64, reason: String) {
        self.app_mut(app).start_blocks.push((id, reason));
    }

    /// `UnblockSessionStart`.
    pub(super) fn unblock_session_start(&mut self, app: &AppId, id: u64, now: i64) {
        if let Some(a) = self.apps.get_mut(app) {
            a.start_blocks.retain(|(block, _)| *block != id);
        }
        self.pump(app, now);
    }
}

impl OperationCoordinator {
    /// Reserves `app` for a session — call it before the setup's first other await: the reservation
    /// is in the coordinator's mailbox ahead of anything the caller sends afterwards.
    ///
    /// Refused while admission is closed, while a `block_session_start` token is held, or while the
    /// app already has a session (live or starting). From this moment, requests that set
    /// `refuse_when_session` and conflict with `claims` are refused. After every setup await, call
    /// [`SessionReservation::check`]; then [`SessionReservation::start`] queues for the claims.
    pub async fn reserve_session(
        &self,
        app: &AppId,
        operation: Operation,
        claims: impl Into<Claims>,
    ) -> Result<SessionReservation, OperationError> {
        let claims = claims.into();
        self.check_nesting(std::iter::once(app), &operation.name)?;
        let (ended_tx, ended) = watch::channel(None);
        // Built before the request: dropping this future releases the reservation right behind it
        // (and a refused one's release is ignored: the slot is not this id's).
        let slot = SlotTicket {
            coord: self.clone(),
            app: app.clone(),
            id: self.next_id(),
            operation: operation.name,
        };
        self.ask(|reply| ReserveSession {
            app: app.clone(),
            id: slot.id,
            operation: slot.operation.clone(),
            claims,
            bypass_owner: operation.allow_compatible_queue_bypass,
            ended: ended_tx,
            reply,
        })
        .await??;
        Ok(SessionReservation { slot, ended })
    }

    /// Teardown (the seed's `endRecordingForApp`, for stop, run, restart and delete): ends `app`'s
    /// session whatever its phase. A reservation still setting up is tombstoned — its next `check` or
    /// its `start` fails — and its later release cannot touch a successor. Takes effect in mailbox
    /// order: whatever the caller sends afterwards (a `drain`, a snapshot) sees the slot empty.
    pub fn end_session(&self, app: &AppId) {
        self.tell(EndSession {
            app: app.clone(),
            only: None,
        });
    }

    /// Blocks session starts on `app` until the token drops (release it in the same `finally` as the
    /// other admission blocks). Taken first by work whose refusal would come too late to be free; a
    /// session already running is not affected — pass `refuse_when_session` (or call
    /// [`refuse_if_session`](Self::refuse_if_session) while holding the token) for that. In effect for
    /// every request sent after this call.
    pub fn block_session_start(&self, app: &AppId, reason: impl Into<String>) -> SessionStartBlock {
        let id = self.next_id();
        self.tell(BlockSessionStart {
            app: app.clone(),
            id,
            reason: reason.into(),
        });
        SessionStartBlock {
            coord: self.clone(),
            app: app.clone(),
            id,
        }
    }

    /// The `refuse_when_session` check on its own, for the rare preflight that must precede work
    /// admission cannot cover. Race-free only while a [`SessionStartBlock`] for `app` is held; pass
    /// `refuse_when_session` on the operation as well.
    pub async fn refuse_if_session(
        &self,
        app: &AppId,
        claims: &Claims,
        action: &str,
    ) -> Result<(), OperationError> {
        self.ask(|reply| RefuseIfSession {
            app: app.clone(),
            claims: claims.clone(),
            action: action.to_owned(),
            reply,
        })
        .await?
    }

    /// Ends sessions past their cap. Every coordinator step does this first; call it periodically (or
    /// use [`spawn_session_reaper`](Self::spawn_session_reaper)) so a capped session's waiters do not
    /// depend on other traffic.
    pub fn expire_sessions(&self) {
        self.tell(ExpireSessions);
    }

    /// Spawns a task that sends `ExpireSessions` every `every`, until the coordinator actor is gone
    /// (it holds only a weak address). Needs a tokio runtime (actix provides one).
    pub fn spawn_session_reaper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = self.addr.downgrade();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(addr) = weak.upgrade() else { return };
                addr.do_send(ExpireSessions);
            }
        })
    }
}

/// The identity-checked hold on a session slot, shared by the reservation and the session. Dropping
/// it empties the slot only if the slot still carries this id.
struct SlotTicket {
    coord: OperationCoordinator,
    app: AppId,
    id: u64,
    operation: String,
}

impl SlotTicket {
    fn cancelled(&self) -> OperationError {
        OperationError::SessionCancelled {
            app: self.app.clone(),
            session: self.operation.clone(),
        }
    }

    /// Whether the slot still carries this id (ends capped sessions first).
    async fn is_current(&self) -> Result<bool, OperationError> {
        self.coord
            .ask(|reply| CheckSession {
                app: self.app.clone(),
                id: self.id,
                reply,
            })
            .await
    }
}

impl Drop for SlotTicket {
    fn drop(&mut self) {
        self.coord.tell(EndSession {
            app: self.app.clone(),
            only: Some(self.id),
        });
    }
}

/// A session start between its reservation and its claims. Dropping it releases the reservation
/// (identity-checked: a cancelled attempt never releases its successor's).
#[must_use = "dropping the reservation releases it"]
pub struct SessionReservation {
    slot: SlotTicket,
    ended: watch::Receiver<Option<SessionEnd>>,
}

impl std::fmt::Debug for SessionReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionReservation")
            .field("app", &self.slot.app)
            .field("session", &self.slot.operation)
            .finish()
    }
}

impl SessionReservation {
    pub fn app(&self) -> &AppId {
        &self.slot.app
    }

    /// Re-reads the tombstone: `Err(SessionCancelled)` once a teardown ended this start. Call it after
    /// every setup await and stop (undoing the setup) when it fails.
    pub async fn check(&self) -> Result<(), OperationError> {
        if self.slot.is_current().await? {
            Ok(())
        } else {
            Err(self.slot.cancelled())
        }
    }

    /// Queues for the session's claims and answers the live session once granted. Fails with
    /// `SessionCancelled` if a teardown came first (before or while queued).
    pub async fn start(self) -> Result<Session, OperationError> {
        let coord = self.slot.coord.clone();
        coord.check_nesting(std::iter::once(&self.slot.app), &self.slot.operation)?;
        let entry: EntryId = coord.next_id();
        let granted_at = coord
            .ask(|grant| StartSession {
                app: self.slot.app.clone(),
                id: self.slot.id,
                operation: self.slot.operation.clone(),
                entry,
                grant,
            })
            .await??;
        let deadline_ms = granted_at + SESSION_CAP_MS;
        // A teardown right after the grant is told through `ended`, as for any live session.
        Ok(Session {
            slot: self.slot,
            ended: self.ended,
            deadline_ms,
        })
    }
}

/// A live session: holds its claims until ended, dropped, torn down or capped.
#[must_use = "dropping the session ends it"]
pub struct Session {
    slot: SlotTicket,
    ended: watch::Receiver<Option<SessionEnd>>,
    deadline_ms: i64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("app", &self.slot.app)
            .field("session", &self.slot.operation)
            .field("deadline_ms", &self.deadline_ms)
            .finish()
    }
}

impl Session {
    pub fn app(&self) -> &AppId {
        &self.slot.app
    }

    /// When the cap ends it, in clock milliseconds.
    pub fn deadline_ms(&self) -> i64 {
        self.deadline_ms
    }

    /// Whether it still holds its claims (checks the cap first). A coordinator that is gone holds
    /// nothing.
    pub async fn is_live(&self) -> bool {
        self.slot.is_current().await.unwrap_or(false)
    }

    /// Resolves when the session ends, with why.
    pub async fn ended(&mut self) -> SessionEnd {
        match self.ended.wait_for(Option::is_some).await {
            Ok(why) => why.unwrap_or(SessionEnd::Ended),
            Err(_) => SessionEnd::Ended,
        }
    }

    /// Ends the session and releases its claims (the same as dropping it).
    pub fn end(self) {}

    /// Runs the session's own work with the app marked held: starting an operation on this app from
    /// inside is refused by name instead of queueing behind the session.
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        let mut held = Held::now();
        held.apps.push(HeldApp {
            coordinator: self.slot.coord.ids.coordinator,
            app: self.slot.app.clone(),
            operation: self.slot.operation.clone(),
        });
        HELD.scope(held, fut).await
    }
}

/// Holds session starts off an app; dropping it lifts the block.
#[must_use = "dropping the token lifts the block"]
pub struct SessionStartBlock {
    coord: OperationCoordinator,
    app: AppId,
    id: u64,
}

impl std::fmt::Debug for SessionStartBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionStartBlock")
            .field("app", &self.app)
            .finish()
    }
}

impl Drop for SessionStartBlock {
    fn drop(&mut self) {
        self.coord.tell(UnblockSessionStart {
            app: self.app.clone(),
            id: self.id,
        });
    }
}
