//! The run actor's shell, simulated: the real [`machine::transition`] decides, this module executes each
//! [`Effect`] against the shared [`MemoryStore`](storage::MemoryStore) the way `actors::run` (`mod.rs` and
//! `work.rs`) does, one await-point segment per task ([`Op`]), so a fault can land between any two.
//!
//! Mirrored, in order: the launch paths (fresh: tombstone → workspace → claim → seed; restart from the
//! request; resume from the transcript with in-flight settlement), the model call (follow-ups read from
//! the inbox fold into the pending results turn; their `input` events go into the step's events), the
//! durable step (turns + events + record in one transaction, retried while transient up to the lease),
//! the inbox read after a text-only turn, the tools (one call at a time: dispatch, then completion), the
//! handoff, the finishing gate (flush first; `WrongPhase` read back), the reply (kill check before the
//! webhook), and the record through the ledger's finish with its successor (the history writer's
//! retries, its `UnknownRun` fallback to a plain put). Epochs discard the answers of aborted effects.
//!
//! The memory backend has no rollback: a durable step checks the fence on its first write, and nothing
//! between its writes can refuse in a simulation (no event or part is near the size limits), so it
//! lands whole or not at all.

use actors::agent::{self, AssistantTurn, ToolCall, ToolResult};
use actors::heartbeat::HeartbeatNews;
use actors::run::machine::{self, Effect, End, Msg, RunState, Started, Written};
use actors::run::{meta_from_row, Adoption, RecordExtras, Request, StopReason};
use serde_json::{json, Map, Value};
use storage::ledger::decisions::{self, ResumePoint, Settlement};
use storage::ledger::{InFlight, InboxItem, LiveRow, Outcome, Promotion, Refusal, RunLedger, StepRecord, StepWrite, StopMode, Successor, Turn};
use storage::MemoryStore;
use storage::record::{RunRecord, RunStatus};

use crate::agent as script;
use crate::supervisor::{self, Via};
use crate::world::{Io, Kind, World, BUDGET_MS, LEASE_MS};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    Tracked,
    Detached,
    Fenced,
}

/// A run's working data (`work::Run`).
pub struct RunData {
    pub id: String,
    pub gen: String,
    pub deadline: i64,
    pub tracking: Tracking,
    pub system: String,
    pub turns: Vec<Turn>,
    pub turn_count: u64,
    pub step: u64,
    pub iteration: u64,
    pub inbox_consumed: Option<u64>,
    pub pending: Option<Turn>,
    pub step_events: Vec<Value>,
    pub current: Option<AssistantTurn>,
    /// This incarnation's workspace fence token (`<gen>#<actor>`).
    pub fence: String,
    pub reply: Option<(bool, Option<String>)>,
}

impl RunData {
    fn new(gen: &str, fence: &str, id: &str, deadline: i64) -> RunData {
        RunData {
            id: id.to_owned(),
            gen: gen.to_owned(),
            deadline,
            tracking: Tracking::Tracked,
            system: "sim".into(),
            turns: Vec::new(),
            turn_count: 0,
            step: 0,
            iteration: 0,
            inbox_consumed: None,
            pending: None,
            step_events: Vec::new(),
            current: None,
            fence: fence.to_owned(),
            reply: None,
        }
    }

    pub fn tracked(&self) -> bool {
        self.tracking == Tracking::Tracked
    }
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
    /// Launched by re-adopting its own row in `finishing` (it replies from the saved answer).
    readopted_finishing: bool,
}


/// One await-point segment of an effect in flight.
pub enum Op {
    Fresh { request: Request, started_at: i64 },
    Restart { row: LiveRow, events: Vec<Value>, from_gen: Option<String> },
    Resume(Adoption),
    /// The promotion and the seed step, in one commit (`StorageHandle::promote`).
    Claim { seed: Option<StepWrite>, since: i64, delay: i64 },
    Write { w: StepWrite, since: i64, delay: i64 },
    Model,
    ReadInbox,
    /// Tool calls one at a time; `out` holds a dispatched call's output until its completion. With
    /// `settle`, the resume's in-flight settlement (synthetic results for what is not re-run).
    Tools { calls: Vec<ToolCall>, hows: Vec<Settlement>, i: usize, results: Vec<ToolResult>, out: Option<(bool, String)>, settle: bool },
    HandOff { write: Option<StepWrite>, tracked: bool, since: i64, delay: i64, written: bool },
    GateFlush { status: RunStatus, answer: Option<String> },
    Gate { status: RunStatus, answer: Option<String>, since: i64, delay: i64 },
    GateCheck { status: RunStatus, since: i64, delay: i64 },
    Reply { detached: bool },
    Record { record: Option<RunRecord>, via: Via, spent: usize, successor: Option<String> },
}

impl Op {
    pub fn name(&self) -> String {
        match self {
            Op::Fresh { .. } => "launch fresh".into(),
            Op::Restart { .. } => "launch restart".into(),
            Op::Resume(_) => "launch resume".into(),
            Op::Claim { .. } => "claim".into(),
            Op::Write { w, .. } => format!("durable step {} ({} turns)", w.record.step, w.turns.len()),
            Op::Model => "model call".into(),
            Op::ReadInbox => "read inbox".into(),
            Op::Tools { calls, i, out, settle, .. } => match calls.get(*i) {
                Some(c) => format!("{} {} {} {}", if *settle { "settle" } else { "tool" }, if out.is_some() { "complete" } else { "dispatch" }, c.call_id, c.tool),
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
    ModelDone { items: Vec<InboxItem>, reply: Result<AssistantTurn, String> },
    StepWritten(Option<storage::Result<Outcome<()>>>),
    InboxRead(Vec<InboxItem>),
    ToolsDone(Vec<ToolResult>),
    HandedOff(bool),
    Gate(Written),
    GateDetach(String),
    Replied { killed: bool, reply: Option<(bool, Option<String>)> },
    Finish(Option<(LiveRow, Vec<Value>)>),
}

// ---- actor lifecycle ----

/// Start an actor for `launch` in process `slot` (the supervisor's `launch`).
pub fn start(w: &mut World, slot: usize, launch: actors::run::Launch) {
    let run_id = match &launch {
        actors::run::Launch::Fresh { id, .. } => id.clone(),
        actors::run::Launch::Resume(a) => a.row.run_id.clone(),
        actors::run::Launch::Restart { row, .. } => row.run_id.clone(),
    };
    let id = w.mint_actor();
    let p = &w.procs[slot];
    if p.actors.values().any(|a| a.run_id == run_id) {
        let gen = p.gen.clone();
        w.violate("one driver per run", format!("{gen} launches a second actor for {run_id} while one still runs"));
    }
    let fence = format!("{}#{id}", w.procs[slot].gen);
    let actor = Actor { id, run_id: run_id.clone(), state: RunState::starting(), epoch: 0, run: None, launching: None, fence, ended: false, readopted_finishing: false };
    let p = &mut w.procs[slot];
    p.runs.insert(run_id.clone(), id);
    p.actors.insert(id, actor);
    // The heartbeat starts with the run.
    p.tracked.insert(run_id.clone(), Vec::new());
    let inc = p.inc;
    w.model.actor_started(inc, &run_id);
    let op = match launch {
        actors::run::Launch::Fresh { request, started_at, .. } => Op::Fresh { request, started_at },
        actors::run::Launch::Restart { row, events, from_gen } => Op::Restart { row, events, from_gen },
        actors::run::Launch::Resume(a) => Op::Resume(a),
    };
    w.spawn_in(slot, 0, Kind::Op { actor: id, epoch: 0, op });
}

/// Take actor `id` of `slot` out, run `f` on it, and put it back unless it ended.
fn with_actor(w: &mut World, slot: usize, id: u64, f: impl FnOnce(&mut World, &mut Actor)) {
    let Some(mut actor) = w.procs[slot].actors.remove(&id) else { return };
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
                Msg::Step { past_deadline: a.run.as_ref().is_some_and(|r| now >= r.deadline) }
            }
            ActorMsg::Stop(mode) | ActorMsg::News(HeartbeatNews::Stop(mode)) => Msg::Stop(mode),
            ActorMsg::Fenced | ActorMsg::Killed | ActorMsg::News(HeartbeatNews::Fenced) => Msg::Fenced,
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
    w.spawn_in(slot, delay, Kind::Op { actor: a.id, epoch: a.epoch, op });
}

fn run_data(a: &mut Actor) -> &mut RunData {
    a.run.as_mut().expect("effects after the launch have the run's data")
}

/// Publish to the registry and, when `durable`, to the flusher (`run::publish`).
pub fn publish(w: &mut World, slot: usize, id: &str, event: Value, durable: bool) -> Option<Value> {
    let now = w.now();
    let p = &mut w.procs[slot];
    let stamped = p.registry.publish(id, event, now)?;
    if durable {
        let gen = p.gen.clone();
        let batch = p.flusher.entry(id.to_owned()).or_insert_with(|| (gen.clone(), Vec::new()));
        batch.0 = gen;
        batch.1.push(stamped.clone());
    }
    Some(stamped)
}

fn publish_run(w: &mut World, slot: usize, run: &RunData, event: Value) {
    publish(w, slot, &run.id, event, run.tracked());
}

/// Publish now; commit with the next durable step (`publish_in_step`).
fn publish_in_step(w: &mut World, slot: usize, run: &mut RunData, event: Value) {
    if let Some(stamped) = publish(w, slot, &run.id, event, false) {
        if run.tracked() {
            run.step_events.push(stamped);
        }
    }
}

fn execute(w: &mut World, slot: usize, a: &mut Actor, effect: Effect) {
    match effect {
        Effect::NextStep => w.spawn_in(slot, 0, Kind::Msg { actor: a.id, msg: ActorMsg::Step }),
        Effect::CallModel => {
            let delay = w.work_latency();
            spawn_op(w, slot, a, delay, Op::Model);
        }
        Effect::WriteStep => {
            let run = run_data(a);
            if run.current.as_ref().is_some_and(|t| !t.calls.is_empty()) {
                let event = json!({"type": "assistant", "text": run.current.as_ref().map(|t| t.text.clone()), "step": run.step});
                publish_in_step(w, slot, run, event);
            }
            let (turns, calls) = take_step_turns(run);
            match durable_step(w, slot, run, turns, &calls) {
                Some(write) => {
                    let (now, delay) = (w.now(), w.io_latency());
                    spawn_op(w, slot, a, delay, Op::Write { w: write, since: now, delay: WRITE_RETRY_MS });
                }
                None => complete(w, slot, a, Completion::StepWritten(Some(Ok(Ok(()))))),
            }
        }
        Effect::ReadInbox => {
            let delay = w.io_latency();
            spawn_op(w, slot, a, delay, Op::ReadInbox);
        }
        Effect::RunTools => {
            let calls = run_data(a).current.as_ref().map(|t| t.calls.clone()).unwrap_or_default();
            let hows = vec![Settlement::Rerun; calls.len()];
            spawn_op(w, slot, a, 0, Op::Tools { calls, hows, i: 0, results: Vec::new(), out: None, settle: false });
        }
        Effect::AbortInFlight => a.epoch += 1,
        Effect::AnnounceStop(mode) => {
            let event = json!({"type": "stop_requested", "mode": mode.as_str(), "actor": {"kind": "sim", "id": "operator"}});
            let durable = a.run.as_ref().is_none_or(RunData::tracked);
            publish(w, slot, &a.run_id, event, durable);
        }
        Effect::Note(kind) => {
            let run = run_data(a);
            publish_run(w, slot, run, json!({"type": "note", "kind": kind, "summary": "the run's time budget ran out"}));
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
            let write = if !results.is_empty() || !run.step_events.is_empty() { durable_step(w, slot, run, results, &[]) } else { None };
            let tracked = run.tracked();
            let (now, delay) = (w.now(), w.io_latency());
            spawn_op(w, slot, a, delay, Op::HandOff { write, tracked, since: now, delay: WRITE_RETRY_MS, written: false });
        }
        Effect::Gate { status, answer } => {
            if a.readopted_finishing {
                let saved = w.peek().get_live(&a.run_id).ok().flatten().and_then(|r| r.state.get("finalStatus").and_then(Value::as_str).map(str::to_owned));
                if saved.as_deref().is_some_and(|s| s != status.as_str()) {
                    let gen = w.procs[slot].gen.clone();
                    w.violate(
                        "re-adoption keeps the final status",
                        format!("{gen} re-adopts {} in finishing and gates it {status:?} although {} is committed: the gate refuses, forever", a.run_id, saved.unwrap_or_default()),
                    );
                }
            }
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
                w.model.replied(&a.run_id, &gen, tracked || a.readopted_finishing, a.readopted_finishing);
                check_replies(w, &a.run_id);
            }
            let delay = w.io_latency();
            spawn_op(w, slot, a, delay, Op::Reply { detached });
        }
        Effect::Record { status } => {
            let now = w.now();
            let run = run_data(a);
            w.procs[slot].registry.finish(&run.id, now);
            let extras = RecordExtras { reply: run.reply.clone(), step_count: Some(run.step), ..Default::default() };
            let record = w.procs[slot].registry.build_record(&run.id, status, now, extras);
            let successor = run.tracked().then(|| Successor { run_id: String::new(), lease_ms: LEASE_MS, inbox_consumed: run.inbox_consumed });
            let gen = run.gen.clone();
            let successor = successor.map(|mut s| {
                s.run_id = w.mint_run("s");
                s
            });
            let successor_id = successor.as_ref().map(|s| s.run_id.clone());
            let via = match successor {
                Some(s) => Via::Ledger { gen, successor: Some(s) },
                None => Via::Store { detached: true },
            };
            let delay = w.io_latency();
            spawn_op(w, slot, a, delay, Op::Record { record, via, spent: 0, successor: successor_id });
        }
        Effect::End(end) => end_run(w, slot, a, end, None),
    }
}

fn check_replies(w: &mut World, run: &str) {
    let Some(replies) = w.model.replies.get(run).filter(|r| r.len() > 1).cloned() else { return };
    let (gen, readopted) = replies.last().cloned().expect("more than one reply");
    if readopted && replies[..replies.len() - 1].iter().any(|(g, _)| *g == gen) {
        w.violate("finishing re-adoption never replays the reply", format!("{gen} re-adopted {run} in finishing and replied again"));
    } else {
        w.violate("one reply per run", format!("{run} delivered its reply {} times ({replies:?})", replies.len()));
    }
}

/// The run is over: tell the supervisor and stop (`RunActor::end`).
fn end_run(w: &mut World, slot: usize, a: &mut Actor, end: End, successor: Option<(LiveRow, Vec<Value>)>) {
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

fn finish_actor(w: &mut World, slot: usize, a: &mut Actor, reason: StopReason, successor: Option<(LiveRow, Vec<Value>)>) {
    w.procs[slot].tracked.remove(&a.run_id);
    a.ended = true;
    w.spawn_in(slot, 0, Kind::RunEnded { run: a.run_id.clone(), reason, successor });
}

fn fence(w: &mut World, slot: usize, run: &mut RunData) {
    if run.tracking != Tracking::Fenced {
        run.tracking = Tracking::Fenced;
        w.procs[slot].tracked.remove(&run.id);
    }
}

/// One note, one attempt to mark the row detached, no more heartbeats (`Run::detach`).
fn detach(w: &mut World, slot: usize, run: &mut RunData, what: &str) {
    if run.tracking != Tracking::Tracked {
        return;
    }
    run.tracking = Tracking::Detached;
    w.procs[slot].tracked.remove(&run.id);
    w.model.tainted.insert(run.id.clone());
    let what = what.to_owned();
    let id = run.id.clone();
    w.note(|| format!("  {id}: {what} failed permanently: detached"));
    publish_run(w, slot, run, json!({"type": "note", "kind": "ledger_detached", "summary": format!("{what} failed; this run is not resumable")}));
    let delay = w.io_latency();
    w.spawn_in(slot, delay, Kind::SetDetached { run: run.id.clone(), gen: run.gen.clone() });
}

/// Act on an owner write's answer (`Run::settle`).
fn settle<T>(w: &mut World, slot: usize, run: &mut RunData, what: &str, answer: Option<storage::Result<Outcome<T>>>) -> Written {
    let Some(answer) = answer else { return Written::Lost };
    match answer {
        Ok(Ok(_)) => Written::Ok,
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => {
            fence(w, slot, run);
            Written::Fenced
        }
        Ok(Err(_)) | Err(_) => {
            detach(w, slot, run, what);
            Written::Ok
        }
    }
}

fn take_step_turns(run: &mut RunData) -> (Vec<Turn>, Vec<ToolCall>) {
    let turn = run.current.clone().expect("a step write follows a model answer");
    let mut new: Vec<Turn> = run.pending.take().into_iter().collect();
    new.push(turn.to_turn());
    (new, turn.calls)
}

/// The durable write of `new` turns, the step's events and its record (`Run::durable_step`): the
/// transcript in memory moves on at once; `None` when untracked.
fn durable_step(w: &mut World, slot: usize, run: &mut RunData, new: Vec<Turn>, calls: &[ToolCall]) -> Option<StepWrite> {
    let first_idx = run.turn_count;
    run.turn_count += new.len() as u64;
    run.turns.extend(new.iter().cloned());
    let events = std::mem::take(&mut run.step_events);
    if !run.tracked() {
        return None;
    }
    let record = StepRecord {
        step: run.step,
        seq: w.procs[slot].registry.last_seq(&run.id).unwrap_or(0),
        turn_index: run.turn_count,
        in_flight: calls.iter().map(|c| InFlight { call_id: c.call_id.clone(), tool: c.tool.clone() }).collect(),
        inbox_consumed_seq: run.inbox_consumed,
        remaining_ms: (run.deadline - w.now()).max(0),
        turn: run.step,
        iteration: run.iteration,
    };
    Some(StepWrite { first_idx, turns: new, record, events })
}

/// Fold follow-ups into the next turn (`Run::fold`): each gets one `input {source: "followup"}` event,
/// committed with the step that writes the turn — unless bug (a) publishes it through the flusher.
fn fold(w: &mut World, slot: usize, run: &mut RunData, items: Vec<InboxItem>) {
    let Some(last) = items.iter().map(|i| i.seq).max() else { return };
    let mut followups = Vec::with_capacity(items.len());
    for item in items {
        let text = item.message.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
        let event = json!({"type": "input", "text": text, "source": "followup", "inboxSeq": item.seq});
        if w.procs[slot].registry.row(&run.id).is_none() && run.tracked() {
            let (gen, id, seq) = (run.gen.clone(), run.id.clone(), item.seq);
            w.violate(
                "a folded follow-up keeps its input event",
                format!("{gen} folds inbox item {seq} into {id} after its registry row was discarded: the step commits it without its input"),
            );
        }
        if w.cfg.bugs.followup_outside_step {
            publish_run(w, slot, run, event);
        } else {
            publish_in_step(w, slot, run, event);
        }
        followups.push((item.seq, text));
    }
    run.inbox_consumed = Some(last);
    match &mut run.pending {
        Some(turn) => turn.parts.extend(followups.iter().map(|(seq, t)| agent::followup_part(*seq, t))),
        None => run.pending = Some(agent::followups_turn(&followups)),
    }
}

/// Unread follow-ups past what the run consumed (none when untracked or unreadable).
fn read_inbox(w: &mut World, slot: usize, run: &RunData) -> Vec<InboxItem> {
    if !run.tracked() {
        return Vec::new();
    }
    let (id, after) = (run.id.clone(), run.inbox_consumed);
    match w.io(slot, Io::Read, |s, _| s.read_inbox(&id, after)) {
        Ok(Ok(items)) => items,
        Ok(Err(_)) | Err(_) => Vec::new(),
    }
}

/// Retry `op` while it fails transiently, for up to the lease (`retry_transient`): `Err(delay)` asks
/// for another attempt after `delay`; `Ok(None)` when storage stayed away that long.
fn retried<T>(w: &World, answer: storage::Result<T>, since: i64, delay: i64) -> Result<Option<storage::Result<T>>, i64> {
    match answer {
        Err(e) if e.is_transient() => {
            if w.now() - since >= LEASE_MS {
                Ok(None)
            } else {
                Err(delay)
            }
        }
        other => Ok(Some(other)),
    }
}

fn next_delay(delay: i64) -> i64 {
    (delay * 2).min(MAX_WRITE_RETRY_MS)
}

fn write_step(w: &mut World, slot: usize, run_id: &str, gen: &str, sw: &StepWrite) -> storage::Result<Outcome<()>> {
    w.io(slot, Io::OwnerWrite, |s, _| step_in(s, run_id, gen, sw))
}

/// A step's turns, its events and then its record (`StorageHandle::durable_step`'s body).
fn step_in(s: &mut MemoryStore, run_id: &str, gen: &str, sw: &StepWrite) -> storage::Result<Outcome<()>> {
    if let Err(refusal) = s.write_transcript(run_id, gen, sw.first_idx, &sw.turns)? {
        return Ok(Err(refusal));
    }
    if !sw.events.is_empty() {
        if let Err(refusal) = s.append(run_id, gen, &sw.events)? {
            return Ok(Err(refusal));
        }
    }
    s.step(run_id, gen, &sw.record)
}

/// Append everything the flusher holds for `run` now (`FlushRun`).
pub fn flush_run(w: &mut World, slot: usize, run: &str) {
    if let Some((gen, events)) = w.procs[slot].flusher.remove(run).filter(|(_, e)| !e.is_empty()) {
        let _ = w.io(slot, Io::Write, |s, _| s.append(run, &gen, &events));
    }
}

fn run_op(w: &mut World, slot: usize, a: &mut Actor, op: Op) {
    match op {
        // ---- launch paths ----
        Op::Fresh { request, started_at } => {
            let gen = w.procs[slot].gen.clone();
            let run = RunData::new(&gen, &a.fence, &a.run_id, started_at + BUDGET_MS);
            let tombstone = RecordExtras { provisional: true, ..Default::default() };
            if let Some(record) = w.procs[slot].registry.build_record(&a.run_id, RunStatus::Interrupted, started_at, tombstone) {
                let delay = w.io_latency();
                w.spawn_in(slot, delay, Kind::History { record, via: Via::Store { detached: false }, spent: 0 });
            }
            a.launching = Some(run);
            promote(w, slot, a, request.text);
        }
        Op::Restart { row, events, from_gen } => {
            if from_gen.is_some() && row.state.get("detached").and_then(Value::as_bool).unwrap_or(false) {
                let gen = w.procs[slot].gen.clone();
                w.violate("detached runs are never resumed", format!("{gen} restarts {} although its row is marked detached", row.run_id));
            }
            let meta = meta_from_row(&row);
            let request: Option<Request> = row.meta.get("request").and_then(|r| serde_json::from_value(r.clone()).ok());
            let Some(request) = request else {
                let (reason, successor) = supervisor::close_unstartable(w, slot, &row, events, "the saved request is unreadable");
                return complete(w, slot, a, Completion::Over(reason, successor));
            };
            let deadline = row.meta.get("deadline").and_then(Value::as_i64).unwrap_or(row.started_at + BUDGET_MS);
            let highest = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
            let had_input = events.iter().any(|e| e["type"] == "input");
            let next_seq = if from_gen.is_some() { highest + 1000 } else { highest + 1 };
            w.procs[slot].registry.create(&row.run_id, meta.clone(), row.started_at, events, next_seq);
            let gen = w.procs[slot].gen.clone();
            let run = RunData::new(&gen, &a.fence, &row.run_id, deadline);
            if highest == 0 || !had_input {
                publish_run(w, slot, &run, meta.event());
                publish_run(w, slot, &run, json!({"type": "input", "text": request.text, "source": "request"}));
            }
            if let Some(from_gen) = from_gen {
                publish_run(w, slot, &run, json!({"type": "resumed", "settled": [], "fromGeneration": from_gen}));
            }
            a.launching = Some(run);
            promote(w, slot, a, request.text);
        }
        Op::Resume(adoption) => resume(w, slot, a, adoption),
        Op::Claim { seed, since, delay } => {
            let mut run = a.launching.take().expect("a claim belongs to a launch");
            let (id, gen) = (run.id.clone(), run.gen.clone());
            let mut state = Map::new();
            state.insert("binding".into(), json!({"workspace": format!("ws/{id}")}));
            let promotion = Promotion { system_text: run.system.clone(), tools: json!(script::tool_defs()), state, lease_ms: LEASE_MS };
            let answer = w.io(slot, Io::OwnerWrite, |s, now| {
                let claimed = match s.claim(&id, &gen, &promotion, now)? {
                    Ok(claimed) => claimed,
                    Err(refusal) => return Ok(Err(refusal)),
                };
                let Some(sw) = &seed else { return Ok(Ok(claimed)) };
                Ok(step_in(s, &id, &gen, sw)?.map(|()| claimed))
            });
            let answer = match retried(w, answer, since, delay) {
                Ok(answer) => answer,
                Err(d) => {
                    a.launching = Some(run);
                    return spawn_op(w, slot, a, d, Op::Claim { seed, since, delay: next_delay(d) });
                }
            };
            let written = settle(w, slot, &mut run, "promotion", answer);
            a.launching = Some(run);
            seeded(w, slot, a, written);
        }
        Op::Write { w: sw, since, delay } => {
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            let answer = write_step(w, slot, &id, &gen, &sw);
            let answer = match retried(w, answer, since, delay) {
                Ok(answer) => answer,
                Err(d) => return spawn_op(w, slot, a, d, Op::Write { w: sw, since, delay: next_delay(d) }),
            };
            complete(w, slot, a, Completion::StepWritten(answer));
        }

        // ---- the loop ----
        Op::Model => {
            let run = a.run.take().expect("run");
            let items = if run.pending.is_some() { read_inbox(w, slot, &run) } else { Vec::new() };
            let mut conversation = run.turns.clone();
            if let Some(mut turn) = run.pending.clone() {
                turn.parts.extend(items.iter().map(|i| agent::followup_part(i.seq, i.message.get("text").and_then(Value::as_str).unwrap_or_default())));
                conversation.push(turn);
            }
            a.run = Some(run);
            let reply = script::next(&conversation);
            complete(w, slot, a, Completion::ModelDone { items, reply });
        }
        Op::ReadInbox => {
            let items = read_inbox(w, slot, a.run.as_ref().expect("run"));
            complete(w, slot, a, Completion::InboxRead(items));
        }
        Op::Tools { calls, hows, i, mut results, out, settle } => {
            let Some(call) = calls.get(i).cloned() else {
                return if settle {
                    if let Some(run) = a.launching.as_mut() {
                        run.pending = Some(agent::results_turn(&results, &[]));
                    }
                    launched(w, slot, a, Started::Continue)
                } else {
                    complete(w, slot, a, Completion::ToolsDone(results))
                };
            };
            let run = if settle { a.launching.as_mut() } else { a.run.as_mut() }.expect("tools run on the run's data");
            let step = run.step;
            match out {
                None => match hows[i].synthetic_text() {
                    None => {
                        let summary = call.args.to_string();
                        publish_run(w, slot, run, json!({"type": "tool_call", "callId": call.call_id, "tool": call.tool, "summary": summary, "step": step}));
                        let output = crate::model::tool_effect(w, slot, run, &call);
                        let delay = w.work_latency();
                        spawn_op(w, slot, a, delay, Op::Tools { calls, hows, i, results, out: Some(output), settle });
                    }
                    Some(text) => {
                        let mut event = json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": false, "summary": text, "step": step});
                        if hows[i] == Settlement::EffectsUnknown {
                            event["effectsUnknown"] = json!(true);
                            w.model.settled_unknown(&run.id, &call.call_id);
                        }
                        publish_run(w, slot, run, event);
                        results.push(ToolResult { call_id: call.call_id.clone(), tool: call.tool.clone(), ok: false, output: text.to_owned() });
                        spawn_op(w, slot, a, 0, Op::Tools { calls, hows, i: i + 1, results, out: None, settle });
                    }
                },
                Some((ok, output)) => {
                    publish_run(w, slot, run, json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": ok, "summary": output, "step": step}));
                    results.push(ToolResult { call_id: call.call_id.clone(), tool: call.tool.clone(), ok, output });
                    spawn_op(w, slot, a, 0, Op::Tools { calls, hows, i: i + 1, results, out: None, settle });
                }
            }
        }
        Op::HandOff { write, tracked, since, delay, written } => {
            if !tracked {
                return complete(w, slot, a, Completion::HandedOff(false));
            }
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            if let (Some(sw), false) = (&write, written) {
                let answer = write_step(w, slot, &id, &gen, sw);
                match retried(w, answer, since, delay) {
                    Err(d) => return spawn_op(w, slot, a, d, Op::HandOff { write, tracked, since, delay: next_delay(d), written }),
                    Ok(Some(Ok(Ok(())))) => {
                        let delay = w.io_latency();
                        return spawn_op(w, slot, a, delay, Op::HandOff { write, tracked, since, delay, written: true });
                    }
                    Ok(_) => return complete(w, slot, a, Completion::HandedOff(false)),
                }
            }
            flush_run(w, slot, &id);
            let answer = w.io(slot, Io::Write, |s, _| s.handoff(&gen, std::slice::from_ref(&id)));
            let ok = matches!(&answer, Ok(results) if results.iter().any(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff));
            complete(w, slot, a, Completion::HandedOff(ok));
        }
        Op::GateFlush { status, answer } => {
            // Everything published so far reaches the ledger first.
            flush_run(w, slot, &a.run_id.clone());
            let (now, delay) = (w.now(), w.io_latency());
            spawn_op(w, slot, a, delay, Op::Gate { status, answer, since: now, delay: WRITE_RETRY_MS });
        }
        Op::Gate { status, answer, since, delay } => {
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            let result = w.io(slot, Io::OwnerWrite, |s, _| s.finishing(&id, &gen, status, answer.as_deref()));
            let result = match retried(w, result, since, delay) {
                Ok(r) => r,
                Err(d) => return spawn_op(w, slot, a, d, Op::Gate { status, answer, since, delay: next_delay(d) }),
            };
            match result {
                None => complete(w, slot, a, Completion::Gate(Written::Lost)),
                Some(Ok(Ok(()))) => complete(w, slot, a, Completion::Gate(Written::Ok)),
                Some(Ok(Err(Refusal::WrongPhase { .. }))) => {
                    let (now, d) = (w.now(), w.io_latency());
                    spawn_op(w, slot, a, d, Op::GateCheck { status, since: now, delay: WRITE_RETRY_MS });
                }
                Some(Ok(Err(_))) => complete(w, slot, a, Completion::Gate(Written::Fenced)),
                Some(Err(e)) => complete(w, slot, a, Completion::GateDetach(e.to_string())),
            }
        }
        Op::GateCheck { status, since, delay } => {
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            let row = w.io(slot, Io::Read, |s, _| s.get_live(&id));
            let row = match retried(w, row, since, delay) {
                Ok(r) => r,
                Err(d) => return spawn_op(w, slot, a, d, Op::GateCheck { status, since, delay: next_delay(d) }),
            };
            let written = match row {
                None => Written::Lost,
                Some(Ok(Some(row)))
                    if row.owner_gen == gen
                        && row.phase == storage::ledger::Phase::Finishing
                        && row.state.get("finalStatus").and_then(Value::as_str) == Some(status.as_str()) =>
                {
                    Written::Ok
                }
                Some(_) => Written::Fenced,
            };
            complete(w, slot, a, Completion::Gate(written));
        }
        Op::Reply { detached } => {
            if !w.webhook {
                return complete(w, slot, a, Completion::Replied { killed: false, reply: None });
            }
            let id = a.run_id.clone();
            if !detached && w.io(slot, Io::Read, |s, _| s.is_killed(&id)).unwrap_or(false) {
                return complete(w, slot, a, Completion::Replied { killed: true, reply: None });
            }
            let tracked = a.run.as_ref().is_some_and(RunData::tracked);
            let gen = w.procs[slot].gen.clone();
            w.model.replied(&id, &gen, tracked || a.readopted_finishing, a.readopted_finishing);
            check_replies(w, &id);
            complete(w, slot, a, Completion::Replied { killed: false, reply: Some((true, None)) });
        }
        Op::Record { record, via, spent, successor } => {
            let Some(record) = record else {
                return complete(w, slot, a, Completion::Finish(None));
            };
            match supervisor::history_attempt(w, slot, &record, via, spent) {
                supervisor::Attempt::Retry { via, delay } => {
                    spawn_op(w, slot, a, delay, Op::Record { record: Some(record), via, spent: spent + 1, successor })
                }
                supervisor::Attempt::Done { landed } => {
                    let _ = landed;
                    let next = successor.and_then(|id| supervisor::admitted_successor(w, slot, &id));
                    complete(w, slot, a, Completion::Finish(next));
                }
            }
        }
    }
}

/// Take the workspace, then the claim (`promote`): the workspace fence names this incarnation before any
/// tool runs.
fn promote(w: &mut World, slot: usize, a: &mut Actor, request_text: String) {
    let id = a.run_id.clone();
    let gen = w.procs[slot].gen.clone();
    if let Some(owner) = w.peek().get_live(&id).ok().flatten().map(|r| r.owner_gen).filter(|o| *o != gen) {
        w.violate(
            "only the run's owner takes its workspace",
            format!("{gen} takes the workspace fence of {id} before its claim, while {owner} owns the run: the owner's mutating tools are fenced out"),
        );
    }
    w.model.take_workspace(&id, &a.fence);
    // The seed (the first model call's messages and the step-0 record) commits with the promotion.
    let seed = a.launching.as_mut().and_then(|run| {
        let turns = vec![agent::system_turn(&run.system), agent::user_turn(&request_text)];
        durable_step(w, slot, run, turns, &[])
    });
    let (now, delay) = (w.now(), w.io_latency());
    spawn_op(w, slot, a, delay, Op::Claim { seed, since: now, delay: WRITE_RETRY_MS });
}

/// The seed write answered: the launch is over (`promote`'s tail).
fn seeded(w: &mut World, slot: usize, a: &mut Actor, written: Written) {
    if let Some(run) = a.launching.as_mut() {
        if !run.turns.is_empty() {
            run.turns.remove(0); // `turns` holds what follows the system turn
        }
    }
    let started = match written {
        Written::Ok => Started::Continue,
        Written::Fenced => Started::Fenced,
        Written::Lost => Started::Lost,
    };
    launched(w, slot, a, started);
}

fn launched(w: &mut World, slot: usize, a: &mut Actor, started: Started) {
    complete(w, slot, a, Completion::Launched(started));
}

/// Adopt a row this generation owns and continue it from its transcript (`work::resume`).
fn resume(w: &mut World, slot: usize, a: &mut Actor, ad: Adoption) {
    let row = ad.row;
    // A row in `finishing` continues its reply whatever else it records; any other detached row closes.
    if row.phase != storage::ledger::Phase::Finishing && row.state.get("detached").and_then(Value::as_bool).unwrap_or(false) {
        let gen = w.procs[slot].gen.clone();
        w.violate("detached runs are never resumed", format!("{gen} resumes {} although its row is marked detached", row.run_id));
    }
    let meta = meta_from_row(&row);
    let now = w.now();
    let highest = ad.events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    w.procs[slot].registry.create(&row.run_id, meta.clone(), row.started_at, ad.events, highest + 1000);
    let gen = w.procs[slot].gen.clone();
    let mut run = RunData::new(&gen, &a.fence, &row.run_id, now + ad.last_step.remaining_ms);
    if !row.system_text.is_empty() {
        run.system = row.system_text.clone();
    }
    // Re-attach the workspace; a missing one closes the run (SPEC §8.3).
    if !w.model.workspace_exists(&row.run_id) {
        let events = w.procs[slot].registry.row(&run.id).map(|r| r.events.clone()).unwrap_or_default();
        let (reason, successor) = supervisor::close_unstartable(w, slot, &row, events, "the run's workspace is missing");
        return complete(w, slot, a, Completion::Over(reason, successor));
    }
    w.model.take_workspace(&row.run_id, &a.fence);
    run.turn_count = ad.transcript.len() as u64;
    run.turns = ad.transcript.into_iter().skip(1).collect();
    run.step = ad.last_step.step;
    run.iteration = ad.last_step.iteration;
    run.inbox_consumed = ad.last_step.inbox_consumed_seq;
    let last_text = run.turns.iter().rev().find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text)).unwrap_or_default();
    if row.phase != storage::ledger::Phase::Finishing && row.state.contains_key("finalStatus") {
        let gen = w.procs[slot].gen.clone();
        w.violate(
            "a run past its finishing gate is never resumed",
            format!("{gen} resumes {} from the transcript although its row holds a final status (its reply may be out)", row.run_id),
        );
    }
    if row.phase == storage::ledger::Phase::Finishing {
        publish_run(w, slot, &run, json!({"type": "resumed", "settled": [], "fromGeneration": ad.from_gen}));
        let answer = row.state.get("answer").and_then(Value::as_str).unwrap_or(&last_text).to_owned();
        a.launching = Some(run);
        a.readopted_finishing = true;
        return launched(w, slot, a, Started::Finish(answer));
    }
    let last_assistant = run.turns.last().and_then(AssistantTurn::from_turn);
    let mut calls = Vec::new();
    let mut finish_plan = None;
    let fresh = matches!(ad.point, ResumePoint::RunStepFresh { .. });
    match ad.point {
        ResumePoint::ResumeAt { .. } => {
            let recorded: Vec<String> = ad.last_step.in_flight.iter().map(|c| c.call_id.clone()).collect();
            if let Some(turn) = &last_assistant {
                let ids: Vec<String> = turn.calls.iter().map(|c| c.call_id.clone()).collect();
                if let Err(reason) = decisions::in_flight_matches(&recorded, &ids) {
                    publish_run(w, slot, &run, json!({"type": "resumed", "settled": [], "fromGeneration": ad.from_gen}));
                    a.launching = Some(run);
                    return launched(w, slot, a, Started::Fail(reason));
                }
                if turn.calls.is_empty() {
                    finish_plan = Some(turn.text.clone());
                }
                calls = turn.calls.clone();
            }
        }
        ResumePoint::RunStepFresh { step } => {
            // Unreachable here (a durable step lands whole), kept for fidelity: one attempt, no retries.
            run.step = step;
            run.iteration += 1;
            calls = last_assistant.as_ref().map(|t| t.calls.clone()).unwrap_or_default();
            if calls.is_empty() {
                finish_plan = Some(last_text.clone());
            }
            if let Some(sw) = durable_step(w, slot, &mut run, Vec::new(), &calls) {
                let (id, gen) = (run.id.clone(), run.gen.clone());
                let answer = write_step(w, slot, &id, &gen, &sw);
                let answer = if answer.as_ref().is_err_and(storage::Error::is_transient) { None } else { Some(answer) };
                match settle(w, slot, &mut run, "step record", answer) {
                    Written::Ok => {}
                    Written::Fenced => {
                        a.launching = Some(run);
                        return launched(w, slot, a, Started::Fenced);
                    }
                    Written::Lost => {
                        a.launching = Some(run);
                        return launched(w, slot, a, Started::Lost);
                    }
                }
            }
        }
    }
    let defs = script::tool_defs();
    let hows: Vec<Settlement> = calls
        .iter()
        .map(|call| {
            if fresh {
                return Settlement::Rerun;
            }
            let def = defs.iter().find(|d| d.name == call.tool);
            decisions::settlement(def.is_some(), def.is_some_and(|d| d.side_effect_free), def.is_some_and(|d| d.rerun_safe), def.is_some_and(|d| d.idempotent))
        })
        .collect();
    let settled: Vec<Value> = if fresh {
        Vec::new()
    } else {
        calls.iter().zip(&hows).map(|(c, h)| json!({"callId": c.call_id, "tool": c.tool, "how": h})).collect()
    };
    publish_run(w, slot, &run, json!({"type": "resumed", "settled": settled, "fromGeneration": ad.from_gen}));
    a.launching = Some(run);
    if let Some(text) = finish_plan {
        return launched(w, slot, a, Started::Finish(text));
    }
    if calls.is_empty() {
        return launched(w, slot, a, Started::Continue);
    }
    spawn_op(w, slot, a, 0, Op::Tools { calls, hows, i: 0, results: Vec::new(), out: None, settle: true });
}

/// An effect's answer reaches the actor (`Handler<Done>`).
fn complete(w: &mut World, slot: usize, a: &mut Actor, c: Completion) {
    let msg = match c {
        Completion::Over(reason, successor) => return finish_actor(w, slot, a, reason, successor),
        Completion::Launched(started) => {
            let run = a.launching.take().expect("a launch built the run's data");
            a.state.last_text = run.turns.iter().rev().find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text)).unwrap_or_default();
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
                    let msg = Msg::ModelAnswered { text: turn.text.clone(), calls: turn.calls.len() };
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
                let text = run.current.as_ref().map(|t| t.text.clone()).unwrap_or_default();
                let step = run.step;
                publish_run(w, slot, &run, json!({"type": "assistant", "text": text, "step": step}));
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
        Completion::GateDetach(_why) => {
            let mut run = a.run.take().expect("run");
            detach(w, slot, &mut run, "finishing");
            a.run = Some(run);
            Msg::Gate(Written::Ok)
        }
        Completion::Replied { killed: true, .. } => Msg::Replied { killed: true, failed: false },
        Completion::Replied { killed: false, reply } => {
            let failed = reply.as_ref().is_some_and(|(ok, _)| !ok);
            run_data(a).reply = reply;
            Msg::Replied { killed: false, failed }
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
