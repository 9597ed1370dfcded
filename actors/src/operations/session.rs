//! Long-lived sessions (the seed's recordings and test runs): claims held for a user-controlled time.
//!
//! A session's life is the app's session slot (see the state table in the parent module). The slot is
//! owned by the coordinator; the [`SessionReservation`] and [`Session`] handles carry only the slot id
//! they were given, and every question they ask ("am I still the app's session?") is answered by the
//! slot under the coordinator's lock. Teardown empties the slot; that empty (or successor-filled) slot
//! is the cancellation tombstone, and every release compares ids first.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use super::queue::{Entry, EntryId};
use super::{
    Admission, AppId, Claims, Effects, Held, HeldApp, Operation, OperationCoordinator, OperationError, SessionPhase,
    SessionSnapshot, State, HELD,
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
        SessionSnapshot { operation: self.operation.clone(), phase, deadline_ms: self.live_until }
    }
}

impl State {
    /// Whether `id` is still `app`'s session.
    fn slot_is(&self, app: &AppId, id: u64) -> bool {
        self.apps.get(app).and_then(|a| a.session.as_ref()).is_some_and(|s| s.id == id)
    }

    /// Empties `app`'s slot (only if it is `only`, when given): leaves the queue or releases the
    /// claims, tells the owner `why`, lets the next operations go. Answers whether it emptied it.
    fn end_slot(&mut self, app: &AppId, only: Option<u64>, why: SessionEnd, now: i64, fx: &mut Effects) -> bool {
        let Some(a) = self.apps.get_mut(app) else { return false };
        match (&a.session, only) {
            (None, _) => return false,
            (Some(s), Some(id)) if s.id != id => return false,
            _ => {}
        }
        let slot = a.session.take().expect("checked just above");
        if let Some(entry) = slot.entry {
            a.queue.remove(entry);
            self.waiters.remove(&entry);
        }
        tracing::debug!(app = %app, session = %slot.operation, ?why, "session slot emptied");
        fx.ended.push((slot.ended, why));
        self.pump(app, now, fx);
        true
    }

    /// Ends every live session whose deadline has passed.
    pub(super) fn expire_sessions(&mut self, now: i64, fx: &mut Effects) {
        let due: Vec<(AppId, u64, String)> = self
            .apps
            .iter()
            .filter_map(|(app, a)| {
                let s = a.session.as_ref()?;
                s.live_until.is_some_and(|t| now >= t).then(|| (app.clone(), s.id, s.operation.clone()))
            })
            .collect();
        for (app, id, operation) in due {
            tracing::info!(app = %app, session = %operation, "session reached its 30-minute cap; claims released");
            self.end_slot(&app, Some(id), SessionEnd::Capped, now, fx);
        }
    }
}

impl OperationCoordinator {
    /// Reserves `app` for a session, synchronously — call it before the handler's first await.
    ///
    /// Refused while admission is closed, while a `block_session_start` token is held, or while the
    /// app already has a session (live or starting). From this moment, requests that set
    /// `refuse_when_session` and conflict with `claims` are refused. After every setup await, call
    /// [`SessionReservation::check`]; then [`SessionReservation::start`] queues for the claims.
    pub fn reserve_session(
        &self,
        app: &AppId,
        operation: Operation,
        claims: impl Into<Claims>,
    ) -> Result<SessionReservation, OperationError> {
        let claims = claims.into();
        self.check_nesting(std::iter::once(app), &operation.name)?;
        let (id, ended) = self.apply(|st, _, _| {
            if let Some(a) = st.apps.get(app) {
                if let Admission::Closed { .. } = a.admission {
                    return Err(OperationError::AdmissionClosed {
                        app: app.clone(),
                        operation: operation.name.clone(),
                    });
                }
                if let Some((_, reason)) = a.start_blocks.first() {
                    return Err(OperationError::SessionStartBlocked { app: app.clone(), reason: reason.clone() });
                }
                if let Some(s) = &a.session {
                    return Err(OperationError::SessionActive { app: app.clone(), session: s.operation.clone() });
                }
            }
            let id = st.next_id();
            let (tx, rx) = watch::channel(None);
            st.app_mut(app).session = Some(SessionSlot {
                id,
                operation: operation.name.clone(),
                claims: claims.clone(),
                bypass_owner: operation.allow_compatible_queue_bypass,
                entry: None,
                live_until: None,
                ended: tx,
            });
            Ok((id, rx))
        })?;
        Ok(SessionReservation {
            slot: SlotTicket { coord: self.clone(), app: app.clone(), id, operation: operation.name },
            ended,
        })
    }

    /// Teardown (the seed's `endRecordingForApp`, for stop, run, restart and delete): ends `app`'s
    /// session whatever its phase. A reservation still setting up is tombstoned — its next `check` or
    /// its `start` fails — and its later release cannot touch a successor. Answers whether there was
    /// a session.
    pub fn end_session(&self, app: &AppId) -> bool {
        self.apply(|st, now, fx| st.end_slot(app, None, SessionEnd::TornDown, now, fx))
    }

    /// Blocks session starts on `app` until the token drops (release it in the same `finally` as the
    /// other admission blocks). Taken first by work whose refusal would come too late to be free; a
    /// session already running is not affected — pass `refuse_when_session` (or call
    /// [`refuse_if_session`](Self::refuse_if_session) while holding the token) for that.
    pub fn block_session_start(&self, app: &AppId, reason: impl Into<String>) -> SessionStartBlock {
        let reason = reason.into();
        let id = self.apply(|st, _, _| {
            let id = st.next_id();
            st.app_mut(app).start_blocks.push((id, reason));
            id
        });
        SessionStartBlock { coord: self.clone(), app: app.clone(), id }
    }

    /// The `refuse_when_session` check on its own, for the rare preflight that must precede work
    /// admission cannot cover. Race-free only while a [`SessionStartBlock`] for `app` is held; pass
    /// `refuse_when_session` on the operation as well.
    pub fn refuse_if_session(&self, app: &AppId, claims: &Claims, action: &str) -> Result<(), OperationError> {
        self.apply(|st, _, _| {
            let slot = st.apps.get(app).and_then(|a| a.session.as_ref());
            match slot {
                Some(s) if s.claims.conflicts_with(claims) => Err(OperationError::RefusedBySession {
                    app: app.clone(),
                    action: action.to_owned(),
                    session: s.operation.clone(),
                }),
                _ => Ok(()),
            }
        })
    }

    /// Ends sessions past their cap. Every coordinator call does this first; call it periodically (or
    /// use [`spawn_session_reaper`](Self::spawn_session_reaper)) so a capped session's waiters do not
    /// depend on other traffic.
    pub fn expire_sessions(&self) {
        self.apply(|_, _, _| ());
    }

    /// Spawns a task that runs [`expire_sessions`](Self::expire_sessions) every `every`, until the
    /// coordinator is dropped. Needs a tokio runtime (actix provides one).
    pub fn spawn_session_reaper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                OperationCoordinator { inner }.expire_sessions();
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
        OperationError::SessionCancelled { app: self.app.clone(), session: self.operation.clone() }
    }
}

impl Drop for SlotTicket {
    fn drop(&mut self) {
        let (app, id) = (&self.app, self.id);
        self.coord.apply(|st, now, fx| st.end_slot(app, Some(id), SessionEnd::Ended, now, fx));
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
    pub fn check(&self) -> Result<(), OperationError> {
        let (app, id) = (&self.slot.app, self.slot.id);
        if self.slot.coord.apply(|st, _, _| st.slot_is(app, id)) {
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
        let (app, id) = (&self.slot.app, self.slot.id);
        let granted = coord.apply(|st, now, fx| {
            let entry = st.next_id();
            // Record the entry in the slot before enqueueing, so the grant starts the deadline.
            let slot = st.apps.get_mut(app).and_then(|a| a.session.as_mut()).filter(|s| s.id == id);
            let slot = slot.filter(|s| s.entry.is_none())?;
            slot.entry = Some(entry);
            let entry = Entry {
                id: entry,
                operation: slot.operation.clone(),
                claims: slot.claims.clone(),
                bypass_owner: slot.bypass_owner,
            };
            Some(st.enqueue(app, entry, now, fx))
        });
        let Some(rx) = granted else { return Err(self.slot.cancelled()) };
        // A teardown while queued drops the sender: cancelled.
        if rx.await.is_err() {
            return Err(self.slot.cancelled());
        }
        // Re-read the tombstone: granted, and still this app's session?
        let deadline = coord.apply(|st, _, _| {
            st.apps.get(app).and_then(|a| a.session.as_ref()).filter(|s| s.id == id).and_then(|s| s.live_until)
        });
        match deadline {
            Some(deadline_ms) => Ok(Session { slot: self.slot, ended: self.ended, deadline_ms }),
            None => Err(self.slot.cancelled()),
        }
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

    /// Whether it still holds its claims (checks the cap first).
    pub fn is_live(&self) -> bool {
        let (app, id) = (&self.slot.app, self.slot.id);
        self.slot.coord.apply(|st, _, _| st.slot_is(app, id))
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
            coordinator: self.slot.coord.inner.id,
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
        f.debug_struct("SessionStartBlock").field("app", &self.app).finish()
    }
}

impl Drop for SessionStartBlock {
    fn drop(&mut self) {
        let (app, id) = (&self.app, self.id);
        self.coord.apply(|st, now, fx| {
            if let Some(a) = st.apps.get_mut(app) {
                a.start_blocks.retain(|(block, _)| *block != id);
            }
            st.pump(app, now, fx);
        });
    }
}
