//! The news a run hears from outside, after its own effects: a stop committed to the ledger, a decision
//! on a call awaiting approval, a fence (a handoff past the drain budget), a kill, a drain, and what the
//! heartbeat relays from other generations. Each becomes a message of the run's machine.

use actix::{Context, Handler, Message};
use storage::ledger::StopMode;

use super::machine::Msg;
use super::{RunActor, StopActor};
use crate::heartbeat::HeartbeatNews;

/// The process handed the run to the next generation past the drain budget: stop at once, write
/// nothing more (the ending of a fence).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Fenced {
    /// Why, for the log.
    pub why: &'static str,
}

/// The run was killed (its deletion fence is written): stop at once as fenced; the supervisor purges.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Killed;

/// The process drains: hand the run off at its next step boundary (SPEC §6.4).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct DrainRun;

impl Handler<StopRequest> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: StopRequest, ctx: &mut Context<Self>) {
        self.stop_actor = Some(msg.actor);
        self.nudge_approvals();
        self.apply(Msg::Stop(msg.mode), ctx);
    }
}

/// A decision on one of the run's calls awaiting approval was committed to its row (SPEC §13): a wait
/// reads it now rather than at its next poll.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ApprovalNews;

impl Handler<ApprovalNews> for RunActor {
    type Result = ();

    fn handle(&mut self, _msg: ApprovalNews, _ctx: &mut Context<Self>) {
        self.nudge_approvals();
    }
}

impl Handler<Fenced> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: Fenced, ctx: &mut Context<Self>) {
        tracing::info!(run_id = %self.id, generation = self.deps.gen.as_str(), why = msg.why, "fenced; nothing more is written");
        self.apply(Msg::Fenced, ctx);
    }
}

impl Handler<Killed> for RunActor {
    type Result = ();

    fn handle(&mut self, _msg: Killed, ctx: &mut Context<Self>) {
        tracing::info!(run_id = %self.id, generation = self.deps.gen.as_str(), "killed; nothing more is written");
        self.apply(Msg::Fenced, ctx);
    }
}

impl Handler<DrainRun> for RunActor {
    type Result = ();

    fn handle(&mut self, _msg: DrainRun, ctx: &mut Context<Self>) {
        self.apply(Msg::Drain, ctx);
    }
}

impl Handler<HeartbeatNews> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: HeartbeatNews, ctx: &mut Context<Self>) {
        match msg {
            HeartbeatNews::Stop(mode) => {
                self.nudge_approvals();
                self.apply(Msg::Stop(mode), ctx)
            }
            HeartbeatNews::Fenced => self.apply(Msg::Fenced, ctx),
        }
    }
}

/// A stop for this run (already committed to the ledger by the caller).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct StopRequest {
    pub mode: StopMode,
    pub actor: StopActor,
}
