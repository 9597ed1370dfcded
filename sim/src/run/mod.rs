//! The run actor's shell, simulated: the real [`machine::transition`] decides, this module executes each
//! [`Effect`] against the shared [`MemoryStore`](storage::MemoryStore) the way `actors::run` does, one
//! await-point segment per task ([`Op`]), so a fault can land between any two. Epochs discard the
//! answers of aborted effects.
//!
//! Mirrored file by file, in order:
//! - this module (`actors/src/run/mod.rs`): the actor — its start, its messages, the transition and its
//!   effects, an effect's answer, its end — and the dispatch of each segment;
//! - [`launch`] (`launch.rs`): the launch paths (fresh: tombstone → workspace → claim → seed; restart
//!   from the request; resume from the transcript with in-flight settlement);
//! - [`work`] (`work.rs`): the run's data and the step loop — the model call, the durable step, the
//!   inbox read, the tools, the handoff, the finishing gate, the reply, and the record through the
//!   ledger's finish with its successor (the history writer's retries, its `UnknownRun` fallback to a
//!   plain put).
//!
//! The memory backend has no rollback: a durable step checks the fence on its first write, and nothing
//! between its writes can refuse in a simulation (no event or part is near the size limits), so it
//! lands whole or not at all.

mod launch;
pub(crate) use launch::take_workspace;
mod work;

use actors::agent::{self, AssistantTurn, ToolCall, ToolResult};
use actors::heartbeat::HeartbeatNews;
use actors::run::machine::{self, Effect, End, Msg, RunState, Started, Written};
use actors::run::{Adoption, RecordExtras, Request, StopReason};
use serde_json::{json, Value};
use storage::ledger::decisions::Settlement;
use storage::ledger::{InboxItem, LiveRow, Outcome, StepWrite, StopMode, Successor, Turn};
use storage::record::{RunRecord, RunStatus};

use crate::supervisor::Via;
use crate::world::{Kind, World, LEASE_MS};
use work::{
    detach, durable_step, fence, fold, publish_in_step, publish_run, settle, take_step_turns,
};
pub use work::{flush_run, RunData, Tracking};

/// Retry delays of a transient owner write (SPEC §5.5): 200 ms doubling to 5 s, for up to the lease.
const WRITE_RETRY_MS: i64 = 200;
const MAX_WRITE_RETRY_MS: i64 = 5_000;

/// A message to a run actor from outside its own effects.
#[derive(Debug, Clone, PartialEq)]
pub enum ActorMsg {
    /// Its own step boundary (`ctx.notify(Step)`).
    Step,
    Stop(StopMode),
    /// Handed off past the drain budget.
    Fenced,
    Killed,
    Drain,
    News(HeartbeatNews),
}

pub struct Actor {
    pub id: u64,
    pub run_id: String,
    pub state: RunState,
    pub epoch: u64,
    /// The run's data from its launch on (`Launched::Run`).
    pub run: Option<RunData>,
    /// The data being built by the launch effect.
    launching: Option<RunData>,
    pub fence: String,
    ended: bool,
}

/// One await-point segment of an effect in flight.
pub enum Op {
    Fresh {
        request: Request,
        started_at: i64,
    },
    Restart {
        row: LiveRow,
        events: Vec<Value>,
        from_gen: Option<String>,
    },
    Resume(Adoption),
    Deliver {
        row: LiveRow,
        events: Vec<Value>,
        step: u64,
    },
    /// The promotion and the seed step, in one commit (`StorageHandle::promote`).
    Claim {
        seed: Option<StepWrite>,
        since: i64,
        delay: i64,
    },
    Write {
        w: StepWrite,
        since: i64,
        delay: i64,
    },
    Model,
    ReadInbox,
    /// Tool calls one at a time; `out` holds a dispatched call's output until its completion. With
    /// `settle`, the resume's in-flight settlement (synthetic results for what is not re-run).
    Tools {
        calls: Vec<ToolCall>,
        hows: Vec<Settlement>,
        i: usize,
        results: Vec<ToolResult>,
        out: Option<(bool, String)>,
        settle: bool,
    },
    HandOff {
        write: Option<StepWrite>,
        tracked: bool,
        since: i64,
        delay: i64,
        written: bool,
    },
    GateFlush {
        status: RunStatus,
        answer: Option<String>,
    },
    Gate {
        status: RunStatus,
        answer: Option<String>,
        since: i64,
        delay: i64,
    },
    GateCheck {
        status: RunStatus,
        since: i64,
        delay: i64,
    },
    Reply {
        detached: bool,
    },
    Record {
        record: Option<RunRecord>,
        via: Via,
        spent: usize,
        successor: Option<String>,
    },
}

impl Op {
    pub fn name(&self) -> String {
        match self {
            Op::Fresh { .. } => "launch fresh".into(),
            Op::Restart { .. } => "launch restart".into(),
            Op::Resume(_) => "launch resume".into(),
            Op::Deliver { .. } => "launch deliver".into(),
            Op::Claim { .. } => "claim".into(),
            Op::Write { w, .. } => {
                format!("durable step {} ({} turns)", w.record.step, w.turns.len())
            }
            Op::Model => "model call".into(),
            Op::ReadInbox => "read inbox".into(),
            Op::Tools {
                calls,
                i,
                out,
                settle,
                ..
            } => match calls.get(*i) {
                Some(c) => format!(
                    "{} {} {} {}",
                    if *settle { "settle" } else { "tool" },
                    if out.is_some() {
                        "complete"
                    } else {
                        "dispatch"
                    },
                    c.call_id,
                    c.tool
                ),
                None => "tools done".into(),
            },
            Op::HandOff { .. } => "hand off".into(),
            Op::GateFlush { .. } => "gate: flush".into(),
            Op::Gate { status, .. } => format!("gate: finishing {status:?}"),
            Op::GateCheck { .. } => "gate: read back".into(),
            Op::Reply { .. } => "reply".into(),
            Op::Record { spent, .. } => format!("record (attempt {})", spent + 1),
        }
    }
}

/// An effect's answer (`Completion`).
enum Completion {
    Launched(Started),
    Over(StopReason, Option<(LiveRow, Vec<Value>)>),
    ModelDone {
        items: Vec<InboxItem>,
        reply: Result<AssistantTurn, String>,
    },
    StepWritten(Option<storage::Result<Outcome<()>>>),
    InboxRead(Vec<InboxItem>),
    ToolsDone(Vec<ToolResult>),
    HandedOff(bool),
    Gate(Written),
    GateDetach(String),
    GateStopped(storage::ledger::StopMode),
    Replied {
        killed: bool,
        reply: Option<(bool, Option<String>)>,
    },
    Finish(Option<(LiveRow, Vec<Value>)>),
}

// ---- actor lifecycle ----

/// Start an actor for `launch` in process `slot` (the supervisor's `launch`).
pub fn start(w: &mut World, slot: usize, launch: actors::run::Launch) {
    let run_id = launch.run_id().to_owned();
    // One driver per run (`Supervisor::launch`): an actor already drives it; no second one.
    if w.procs[slot].actors.values().any(|a| a.run_id == run_id) {
        w.note(|| format!("  {run_id}: an actor already drives it; not launching a second"));
        return;
    }
    let id = w.mint_actor();
    let fence = format!("{}#{id}", w.procs[slot].gen);
    let actor = Actor {
        id,
        run_id: run_id.clone(),
        state: RunState::starting(),
        epoch: 0,
        run: None,
        launching: None,
        fence,
        ended: false,
    };
    let p = &mut w.procs[slot];
    p.runs.insert(run_id.clone(), id);
    p.actors.insert(id, actor);
    // The heartbeat starts with the run.
    p.tracked.insert(run_id.clone(), Vec::new());
    let inc = p.inc;
    w.model.actor_started(inc, &run_id);
    let op = match launch {
        actors::run::Launch::Fresh {
            request,
            started_at,
            ..
        } => Op::Fresh {
            request,
            started_at,
        },
        actors::run::Launch::Restart {
            row,
            events,
            from_gen,
        } => Op::Restart {
            row,
            events,
            from_gen,
        },
        actors::run::Launch::Resume(a) => Op::Resume(a),
        actors::run::Launch::Deliver { row, events, step } => Op::Deliver { row, events, step },
    };
    w.spawn_in(
        slot,
        0,
        Kind::Op {
            actor: id,
            epoch: 0,
            op,
        },
    );
}

/// Take actor `id` of `slot` out, run `f` on it, and put it back unless it ended.
fn with_actor(w: &mut World, slot: usize, id: u64, f: impl FnOnce(&mut World, &mut Actor)) {
    let Some(mut actor) = w.procs[slot].actors.remove(&id) else {
        return;
    };
    f(w, &mut actor);
    if !actor.ended {
        w.procs[slot].actors.insert(id, actor);
    }
}

/// A message from outside (or the run's own `Step`).
pub fn message(w: &mut World, slot: usize, id: u64, msg: ActorMsg) {
    with_actor(w, slot, id, |w, a| {
        let m = match msg {
            ActorMsg::Step => {
                let now = w.now();
                Msg::Step {
                    past_deadline: a.run.as_ref().is_some_and(|r| now >= r.deadline),
                }
            }
            ActorMsg::Stop(mode) | ActorMsg::News(HeartbeatNews::Stop(mode)) => Msg::Stop(mode),
            ActorMsg::Fenced | ActorMsg::Killed | ActorMsg::News(HeartbeatNews::Fenced) => {
                Msg::Fenced
            }
            ActorMsg::Drain => Msg::Drain,
        };
        apply(w, slot, a, m);
    });
}

/// One segment of the effect in flight; dropped when the effect was aborted since (its epoch).
pub fn op(w: &mut World, slot: usize, id: u64, epoch: u64, op: Op) {
    with_actor(w, slot, id, |w, a| {
        if a.epoch != epoch {
            return;
        }
        run_op(w, slot, a, op);
    });
}

/// Hand `msg` to the real state machine and execute the effects it answers.
fn apply(w: &mut World, slot: usize, a: &mut Actor, msg: Msg) {
    let (next, effects) = machine::transition(&a.state, &msg);
    if w.cfg.trace && next.phase != a.state.phase {
        let (from, to, run) = (a.state.phase.clone(), next.phase.clone(), a.run_id.clone());
        w.note(|| format!("  {run}: {msg:?}: {from:?} -> {to:?}"));
    }
    a.state = next;
    for effect in effects {
        if a.ended {
            break;
        }
        execute(w, slot, a, effect);
    }
}

fn spawn_op(w: &mut World, slot: usize, a: &Actor, delay: i64, op: Op) {
    w.spawn_in(
        slot,
        delay,
        Kind::Op {
            actor: a.id,
            epoch: a.epoch,
            op,
        },
    );
}

fn run_data(a: &mut Actor) -> &mut RunData {
    a.run
        .as_mut()
        .expect("effects after the launch have the run's data")
}

/// Publish to the registry and, when `durable`, to the flusher (`run::publish`).
pub fn publish(w: &mut World, slot: usize, id: &str, event: Value, durable: bool) -> Option<Value> {
    let now = w.now();
    let p = &mut w.procs[slot];
    let stamped = p.registry.publish(id, event, now)?;
    if durable {
        let gen = p.gen.clone();
        let batch = p
            .flusher
            .entry(id.to_owned())
            .or_insert_with(|| (gen.clone(), Vec::new()));
        batch.0 = gen;
        batch.1.push(stamped.clone());
    }
    Some(stamped)
}

fn execute(w: &mut World, slot: usize, a: &mut Actor, effect: Effect) {
    match effect {
        Effect::NextStep => w.spawn_in(
            slot,
            0,
            Kind::Msg {
                actor: a.id,
                msg: ActorMsg::Step,
            },
        ),
        Effect::CallModel => {
            let delay = w.work_latency();
            spawn_op(w, slot, a, delay, Op::Model);
        }
        Effect::WriteStep => {
            let run = run_data(a);
            let (turns, calls) = take_step_turns(run);
            if !calls.is_empty() {
                let event = json!({"type": "assistant", "text": run.current.as_ref().map(|t| t.text.clone()), "step": run.step});
                publish_in_step(w, slot, run, event);
                work::publish_calls(w, slot, run, &calls);
            }
            match durable_step(w, slot, run, turns, &calls) {
                Some(write) => {
                    let (now, delay) = (w.now(), w.io_latency());
                    spawn_op(
                        w,
                        slot,
                        a,
                        delay,
                        Op::Write {
                            w: write,
                            since: now,
                            delay: WRITE_RETRY_MS,
                        },
                    );
                }
                None => complete(w, slot, a, Completion::StepWritten(Some(Ok(Ok(()))))),
            }
        }
        Effect::WriteFollowups => {
            let run = run_data(a);
            let turns: Vec<Turn> = run.pending.take().into_iter().collect();
            match durable_step(w, slot, run, turns, &[]) {
                Some(write) => {
                    let (now, delay) = (w.now(), w.io_latency());
                    spawn_op(
                        w,
                        slot,
                        a,
                        delay,
                        Op::Write {
                            w: write,
                            since: now,
                            delay: WRITE_RETRY_MS,
                        },
                    );
                }
                None => complete(w, slot, a, Completion::StepWritten(Some(Ok(Ok(()))))),
            }
        }
        Effect::ReadInbox => {
            let delay = w.io_latency();
            spawn_op(w, slot, a, delay, Op::ReadInbox);
        }
        Effect::RunTools => {
            let calls = run_data(a)
                .current
                .as_ref()
                .map(|t| t.calls.clone())
                .unwrap_or_default();
            let hows = vec![Settlement::Rerun; calls.len()];
            spawn_op(
                w,
                slot,
                a,
                0,
                Op::Tools {
                    calls,
                    hows,
                    i: 0,
                    results: Vec::new(),
                    out: None,
                    settle: false,
                },
            );
        }
        Effect::AbortInFlight => a.epoch += 1,
        Effect::AnnounceStop(mode) => {
            let event = json!({"type": "stop_requested", "mode": mode.as_str(), "actor": {"kind": "sim", "id": "operator"}});
            let durable = a.run.as_ref().is_none_or(RunData::tracked);
            publish(w, slot, &a.run_id, event, durable);
        }
        Effect::Note(kind) => {
            let run = run_data(a);
            publish_run(
                w,
                slot,
                run,
                json!({"type": "note", "kind": kind, "summary": "the run's time budget ran out"}),
            );
        }
        Effect::PublishFailure(message) => {
            let event = json!({"type": "run_failed", "message": message});
            match a.run.as_ref() {
                Some(run) => publish_run(w, slot, run, event),
                None => {
                    publish(w, slot, &a.run_id, event, true);
                }
            }
        }
        Effect::HandOff => {
            let run = run_data(a);
            let results: Vec<Turn> = run.pending.take().into_iter().collect();
            let write = if !results.is_empty() || !run.step_events.is_empty() {
                durable_step(w, slot, run, results, &[])
            } else {
                None
            };
            let tracked = run.tracked();
            let (now, delay) = (w.now(), w.io_latency());
            spawn_op(
                w,
                slot,
                a,
                delay,
                Op::HandOff {
                    write,
                    tracked,
                    since: now,
                    delay: WRITE_RETRY_MS,
                    written: false,
                },
            );
        }
        Effect::Gate { status, answer } => {
            let tracking = run_data(a).tracking;
            match tracking {
                Tracking::Fenced => complete(w, slot, a, Completion::Gate(Written::Fenced)),
                Tracking::Detached => complete(w, slot, a, Completion::Gate(Written::Ok)),
                Tracking::Tracked => {
                    let delay = w.io_latency();
                    spawn_op(w, slot, a, delay, Op::GateFlush { status, answer });
                }
            }
        }
        Effect::Reply { status: _, answer } => {
            let run = run_data(a);
            if let Some(text) = &answer {
                publish_run(w, slot, run, json!({"type": "answer", "text": text}));
            }
            let detached = run.tracking == Tracking::Detached;
            let tracked = run.tracked();
            let gen = run.gen.clone();
            if !w.webhook {
                // No webhook: the published answer is the reply.
                w.model.replied(&a.run_id, &gen, tracked);
                check_replies(w, &a.run_id);
            }
            let delay = w.io_latency();
            spawn_op(w, slot, a, delay, Op::Reply { detached });
        }
        Effect::Record { status } => {
            let now = w.now();
            let run = run_data(a);
            w.procs[slot].registry.finish(&run.id, now);
            // A detached run's record is best effort: provisional (`RunWork::record`).
            let extras = RecordExtras {
                provisional: !run.tracked(),
                reply: run.reply.clone(),
                step_count: Some(run.step),
                ..Default::default()
            };
            let record = w.procs[slot]
                .registry
                .build_record(&run.id, status, now, extras);
            let successor = run.tracked().then(|| Successor {
                run_id: String::new(),
                lease_ms: LEASE_MS,
                inbox_consumed: run.inbox_consumed,
            });
            let gen = run.gen.clone();
            let successor = successor.map(|mut s| {
                s.run_id = w.mint_run("s");
                s
            });
            let successor_id = successor.as_ref().map(|s| s.run_id.clone());
            let via = match successor {
                Some(s) => Via::Ledger {
                    gen,
                    successor: Some(s),
                },
                None => Via::Store,
            };
            let delay = w.io_latency();
            spawn_op(
                w,
                slot,
                a,
                delay,
                Op::Record {
                    record,
                    via,
                    spent: 0,
                    successor: successor_id,
                },
            );
        }
        Effect::End(end) => end_run(w, slot, a, end, None),
    }
}

fn check_replies(w: &mut World, run: &str) {
    let Some(replies) = w.model.replies.get(run).filter(|r| r.len() > 1).cloned() else {
        return;
    };
    w.violate(
        "one reply per run",
        format!(
            "{run} delivered its reply {} times (by {replies:?})",
            replies.len()
        ),
    );
}

/// The run is over: tell the supervisor and stop (`RunActor::end`).
fn end_run(
    w: &mut World,
    slot: usize,
    a: &mut Actor,
    end: End,
    successor: Option<(LiveRow, Vec<Value>)>,
) {
    let reason = match end {
        End::Finished(status) => {
            w.procs[slot].flusher.remove(&a.run_id);
            StopReason::Finished(status)
        }
        End::Fenced => {
            if let Some(run) = a.run.as_mut() {
                fence(w, slot, run);
            }
            w.procs[slot].registry.discard(&a.run_id);
            StopReason::Fenced
        }
        End::HandedOff => {
            w.procs[slot].registry.discard(&a.run_id);
            w.procs[slot].flusher.remove(&a.run_id);
            StopReason::HandedOff
        }
        End::StorageLost => StopReason::StorageLost,
    };
    finish_actor(w, slot, a, reason, successor);
}

fn finish_actor(
    w: &mut World,
    slot: usize,
    a: &mut Actor,
    reason: StopReason,
    successor: Option<(LiveRow, Vec<Value>)>,
) {
    w.procs[slot].tracked.remove(&a.run_id);
    a.ended = true;
    w.spawn_in(
        slot,
        0,
        Kind::RunEnded {
            run: a.run_id.clone(),
            reason,
            successor,
        },
    );
}

/// One segment of the effect in flight, to the module that runs it: a launch path, or the step loop.
fn run_op(w: &mut World, slot: usize, a: &mut Actor, op: Op) {
    match op {
        Op::Fresh {
            request,
            started_at,
        } => launch::fresh(w, slot, a, request, started_at),
        Op::Restart {
            row,
            events,
            from_gen,
        } => launch::restart(w, slot, a, row, events, from_gen),
        Op::Resume(adoption) => launch::resume(w, slot, a, adoption),
        Op::Deliver { row, events, step } => launch::deliver(w, slot, a, row, events, step),
        Op::Claim { seed, since, delay } => launch::claim(w, slot, a, seed, since, delay),
        op => work::step_op(w, slot, a, op),
    }
}

/// An effect's answer reaches the actor (`Handler<Done>`).
fn complete(w: &mut World, slot: usize, a: &mut Actor, c: Completion) {
    let msg = match c {
        Completion::Over(reason, successor) => return finish_actor(w, slot, a, reason, successor),
        Completion::Launched(started) => {
            let run = a.launching.take().expect("a launch built the run's data");
            a.state.last_text = run
                .turns
                .iter()
                .rev()
                .find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text))
                .unwrap_or_default();
            if let Some(mode) = run.recorded_stop {
                a.state.stop = Some(mode);
                a.state.announced.push(mode);
            }
            a.run = Some(run);
            Msg::Started(started)
        }
        Completion::ModelDone { items, reply } => {
            let mut run = a.run.take().expect("run");
            fold(w, slot, &mut run, items);
            run.step += 1;
            run.iteration += 1;
            let msg = match reply {
                Ok(turn) => {
                    let msg = Msg::ModelAnswered {
                        text: turn.text.clone(),
                        calls: turn.calls.len(),
                    };
                    run.current = Some(turn);
                    msg
                }
                Err(why) => Msg::ModelFailed(why),
            };
            a.run = Some(run);
            msg
        }
        Completion::StepWritten(answer) => {
            let mut run = a.run.take().expect("run");
            let written = settle(w, slot, &mut run, "step record", answer);
            a.run = Some(run);
            Msg::StepWritten(written)
        }
        Completion::InboxRead(items) => {
            let mut run = a.run.take().expect("run");
            let unread = items.len();
            if unread > 0 {
                let text = run
                    .current
                    .as_ref()
                    .map(|t| t.text.clone())
                    .unwrap_or_default();
                let step = run.step;
                publish_in_step(
                    w,
                    slot,
                    &mut run,
                    json!({"type": "assistant", "text": text, "step": step}),
                );
                fold(w, slot, &mut run, items);
            }
            a.run = Some(run);
            Msg::Inbox { unread }
        }
        Completion::ToolsDone(results) => {
            let run = run_data(a);
            run.pending = Some(agent::results_turn(&results, &[]));
            run.current = None;
            Msg::ToolsDone
        }
        Completion::HandedOff(ok) => Msg::HandedOff(ok),
        Completion::Gate(written) => Msg::Gate(written),
        Completion::GateStopped(mode) => Msg::GateStopped(mode),
        Completion::GateDetach(_why) => {
            let mut run = a.run.take().expect("run");
            detach(w, slot, &mut run, "finishing");
            a.run = Some(run);
            Msg::Gate(Written::Ok)
        }
        Completion::Replied { killed: true, .. } => Msg::Replied {
            killed: true,
            failed: false,
        },
        Completion::Replied {
            killed: false,
            reply,
        } => {
            let failed = reply.as_ref().is_some_and(|(ok, _)| !ok);
            run_data(a).reply = reply;
            Msg::Replied {
                killed: false,
                failed,
            }
        }
        Completion::Finish(successor) => {
            let (next, effects) = machine::transition(&a.state, &Msg::Recorded);
            a.state = next;
            for effect in effects {
                match effect {
                    Effect::End(end) => return end_run(w, slot, a, end, successor),
                    other => execute(w, slot, a, other),
                }
            }
            return;
        }
    };
    apply(w, slot, a, msg);
}
