//! The coordinator actor: the operation coordinator's mailbox vocabulary, and the shell that applies
//! each message to the coordinator's `State` in one handler step.
//!
//! Owns the `State` (every app's queue, admission, session slot, start blocks, drain waiters; the
//! `with_lock` keys) and the clock. The parent module's doc has the message table: who sends what,
//! what it carries, what it answers. Every message is sent with `do_send` and answers, if at all,
//! through a `oneshot` it carries, so every handler's result is `()`.
//!
//! Invariants: a handler never awaits and never panics on caller data, so a step is atomic and the
//! mailbox stays open; each step first ends the sessions past their cap.

use std::sync::Arc;

use actix::{Actor, Context, Handler, Message};
use storage::Clock;
use tokio::sync::{oneshot, watch};

use super::queue::{Entry, EntryId};
use super::{Admit, AppId, AppSnapshot, Claims, Grant, OperationError, SessionEnd, State};

/// One per process (per [`OperationCoordinator::new`](super::OperationCoordinator::new)).
pub(super) struct Coordinator {
    /// Session deadlines are read from it, so tests drive the cap with a `ManualClock`.
    clock: Arc<dyn Clock>,
    state: State,
}

impl Coordinator {
    pub(super) fn new(clock: Arc<dyn Clock>) -> Self {
        Coordinator {
            clock,
            state: State::default(),
        }
    }

    /// The time of this step, with the sessions past their cap already ended.
    fn now(&mut self) -> i64 {
        let now = self.clock.now_ms();
        self.state.expire_sessions(now);
        now
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

/// Implements `Handler<$msg>` as one step: `|$state, $msg, $now| body`.
macro_rules! step {
    ($msg:ident, |$state:ident, $m:pat_param, $now:pat_param| $body:expr) => {
        impl Handler<$msg> for Coordinator {
            type Result = ();

            fn handle(&mut self, msg: $msg, _: &mut Context<Self>) {
                let $now = self.now();
                let $state = &mut self.state;
                let $m = msg;
                $body
            }
        }
    };
}

/// Queue `entry` on `app` once admitted (on `app`, and on the `also` apps in the same step).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Acquire {
    pub(super) app: AppId,
    pub(super) entry: Entry,
    pub(super) admit: Admit,
    /// The later apps of a cross-app operation: checked for admission now, queued on nothing.
    pub(super) also: Vec<(AppId, Claims)>,
    pub(super) grant: Grant,
}
step!(Acquire, |st, m, now| st.acquire(m, now));

/// The entry leaves `app`'s queue, or gives up its claims.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Release {
    pub(super) app: AppId,
    pub(super) entry: EntryId,
}
step!(Release, |st, m, now| st.release(&m.app, m.entry, now));

/// Close `app`'s admission under `fence`.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct CloseAdmission {
    pub(super) app: AppId,
    pub(super) fence: u64,
    pub(super) reply: oneshot::Sender<Result<(), OperationError>>,
}
step!(CloseAdmission, |st, m, _now| {
    let _ = m.reply.send(st.close_admission(&m.app, m.fence));
});

/// Reopen `app` if `fence` still closes it.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Reopen {
    pub(super) app: AppId,
    pub(super) fence: u64,
}
step!(Reopen, |st, m, now| st.reopen(&m.app, m.fence, now));

/// Answer once nothing admitted is left on `app`.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Drain {
    pub(super) app: AppId,
    pub(super) reply: oneshot::Sender<()>,
}
step!(Drain, |st, m, _now| st.drain(&m.app, m.reply));

/// Reserve `app`'s session slot for session `id`.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ReserveSession {
    pub(super) app: AppId,
    pub(super) id: u64,
    pub(super) operation: String,
    pub(super) claims: Claims,
    pub(super) bypass_owner: bool,
    /// Told once, when the slot is emptied, why the session ended.
    pub(super) ended: watch::Sender<Option<SessionEnd>>,
    pub(super) reply: oneshot::Sender<Result<(), OperationError>>,
}
step!(ReserveSession, |st, m, _now| st.reserve_session(m));

/// Queue reserved session `id` for its claims as `entry`.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct StartSession {
    pub(super) app: AppId,
    pub(super) id: u64,
    /// The session's operation name, for the refusal when the slot is gone.
    pub(super) operation: String,
    pub(super) entry: EntryId,
    pub(super) grant: Grant,
}
step!(StartSession, |st, m, now| st.start_session(m, now));

/// Empty `app`'s session slot: any session (`only: None`, a teardown) or only session `id` (its own
/// release, identity-checked).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct EndSession {
    pub(super) app: AppId,
    pub(super) only: Option<u64>,
}
step!(EndSession, |st, m, now| {
    let why = if m.only.is_some() {
        SessionEnd::Ended
    } else {
        SessionEnd::TornDown
    };
    st.end_slot(&m.app, m.only, why, now);
});

/// Whether session `id` is still `app`'s session.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct CheckSession {
    pub(super) app: AppId,
    pub(super) id: u64,
    pub(super) reply: oneshot::Sender<bool>,
}
step!(CheckSession, |st, m, _now| {
    let _ = m.reply.send(st.slot_is(&m.app, m.id));
});

/// The `refuse_when_session` check on its own.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct RefuseIfSession {
    pub(super) app: AppId,
    pub(super) claims: Claims,
    pub(super) action: String,
    pub(super) reply: oneshot::Sender<Result<(), OperationError>>,
}
step!(RefuseIfSession, |st, m, _now| {
    let _ = m
        .reply
        .send(st.refuse_if_session(&m.app, &m.claims, &m.action));
});

/// Hold session starts off `app` until `UnblockSessionStart` with the same id.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct BlockSessionStart {
    pub(super) app: AppId,
    pub(super) id: u64,
    pub(super) reason: String,
}
step!(BlockSessionStart, |st, m, _now| st
    .block_session_start(&m.app, m.id, m.reason));

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct UnblockSessionStart {
    pub(super) app: AppId,
    pub(super) id: u64,
}
step!(UnblockSessionStart, |st, m, now| st
    .unblock_session_start(&m.app, m.id, now));

/// Nothing but the cap check every step starts with.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ExpireSessions;
step!(ExpireSessions, |_st, _m, _now| ());

/// A picture of one app.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct GetSnapshot {
    pub(super) app: AppId,
    pub(super) reply: oneshot::Sender<AppSnapshot>,
}
step!(GetSnapshot, |st, m, _now| {
    let _ = m.reply.send(st.snapshot(&m.app));
});

/// Hold `key` as lease `id`, after everyone queued on it before.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Lock {
    pub(super) key: String,
    pub(super) id: u64,
    pub(super) grant: oneshot::Sender<()>,
}
step!(Lock, |st, m, _now| st.locks.lock(m.key, m.id, m.grant));

/// Lease `id` lets go of `key`, held or awaited.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Unlock {
    pub(super) key: String,
    pub(super) id: u64,
}
step!(Unlock, |st, m, _now| st.locks.unlock(&m.key, m.id));

/// How many `with_lock` keys are held or awaited.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct GetLockKeyCount {
    pub(super) reply: oneshot::Sender<usize>,
}
step!(GetLockKeyCount, |st, m, _now| {
    let _ = m.reply.send(st.locks.len());
});
