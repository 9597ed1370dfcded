//! `RunActor`: one run, from admission (or adoption) to its final record.
//!
//! Owns the run's control channel (stop / fence) and the task that drives the run's steps. The task is
//! spawned in the actor's context and wrapped in `catch_unwind`: a panic becomes
//! [`StopReason::Panicked`] and the supervisor re-adopts the run from the ledger (SPEC §1.1); every
//! other ending is deliberate and never restarted.
//!
//! Messages in: [`StopRequest`] (from the supervisor), [`HeartbeatNews`] (from the heartbeat).
//! Notifications out: [`RunEnded`] to the supervisor.
//!
//! # The run, in order (SPEC §5.2)
//! admitted (attaching row + registry row + `run_meta`/`input`, done by the thread slot) → tombstone →
//! promote (claim with prompt and tools) → seed turns + step-0 record → steps (transcript turns, then
//! the step record with the calls in flight, then the tools) → final status → finishing gate →
//! answer + webhook → final record through the ledger's finish → one fresh run for unread follow-ups →
//! workspace release.
//!
//! Invariants:
//! - a step's turns and record are durable before its tools run and before its events are published;
//! - after a fence nothing more from this process reaches the thread: no answer, no webhook, no record;
//! - a detached run (a ledger write failed) keeps running best-effort but is never resumed.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, WrapFuture};
use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use storage::ledger::decisions::{self, ResumePoint, Settlement};
use storage::ledger::{InFlight, InboxItem, LiveRow, Promotion, Refusal, StepRecord, StopMode, Successor, Turn};
use storage::record::{fit_record_to_budget, validate_record, RunRecord, RunStatus, MAX_RECORD_BYTES};
use storage::{Clock, Generation, StorageHandle};
use tokio::sync::watch;

use crate::agent::{self, Agent, AssistantTurn, Conversation, ToolCall, ToolDef, ToolResult};
use crate::flusher::{Flusher, Push};
use crate::heartbeat::{Heartbeat, HeartbeatNews, Track, Untrack};
use crate::history::{HistoryWriter, Via, WriteOutcome};
use crate::registry::{Registry, RunMeta};
use crate::tools::{ToolContext, Toolbox};

/// Longest `summary` published for a tool call or result.
const SUMMARY_CHARS: usize = 200;
/// Retry delays of the promotion claim (SPEC §5.5).
const CLAIM_RETRIES: [Duration; 2] = [Duration::from_millis(200), Duration::from_millis(800)];
/// First retry delay of a step, state or finishing write (SPEC §5.5), doubling up to the next.
const WRITE_RETRY: Duration = Duration::from_millis(200);
const MAX_WRITE_RETRY: Duration = Duration::from_secs(5);

/// An admitted message, as saved in `meta.request` and replayed by a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub thread: String,
    pub channel: String,
    pub user: String,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility: Option<String>,
}

impl Request {
    pub fn thread_key(&self) -> String {
        format!("{}:{}", self.channel, self.thread)
    }
}

/// A configured agent with its budget and system prompt.
#[derive(Clone)]
pub struct AgentEntry {
    pub agent: Arc<dyn Agent>,
    pub budget_ms: i64,
    pub system: String,
}

/// Everything a run needs from the process; cloned into each run.
#[derive(Clone)]
pub struct RunDeps {
    pub gen: Generation,
    pub storage: StorageHandle,
    pub registry: Registry,
    pub flusher: Addr<Flusher>,
    pub heartbeat: Addr<Heartbeat>,
    pub history: HistoryWriter,
    pub agents: Arc<std::collections::HashMap<String, AgentEntry>>,
    pub tools: Arc<Toolbox>,
    pub data_dir: PathBuf,
    pub lease_ms: i64,
    pub webhook_url: Option<String>,
    pub http: reqwest::Client,
    pub clock: Arc<dyn Clock>,
    pub tokens: crate::token::TokenMinter,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Resource claims on run workspaces (an app = a run's workspace).
    pub operations: crate::operations::OperationCoordinator,
    pub on_ended: actix::Recipient<RunEnded>,
}

/// The stop control a run's task watches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Control {
    pub stop: Option<StopMode>,
    /// Another generation owns the run (or this process handed it off): abort and say nothing more.
    pub fenced: bool,
    /// The process drains: hand the run off at its next step boundary (SPEC §6.4).
    pub drain: bool,
}

impl Control {
    fn aborts(&self) -> bool {
        self.fenced || self.stop == Some(StopMode::Hard)
    }
}

/// Who asked for a stop, as published on `stop_requested`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopActor {
    pub kind: String,
    pub id: String,
}

impl StopActor {
    /// Sanitize the id to `^[A-Za-z0-9:@._-]{1,128}$`, else `unknown` (SPEC §5.6).
    pub fn new(kind: &str, id: &str) -> Self {
        let ok = (1..=128).contains(&id.len())
            && id.chars().all(|c| c.is_ascii_alphanumeric() || ":@._-".contains(c));
        StopActor { kind: kind.to_owned(), id: if ok { id.to_owned() } else { "unknown".to_owned() } }
    }
}

/// How a run starts.
#[allow(clippy::large_enum_variant)] // one per run, moved once: boxing buys nothing
pub enum Launch {
    /// Admitted here: the `attaching` row, the registry row and `run_meta`/`input` exist.
    Fresh {
        id: String,
        meta: RunMeta,
        request: Request,
        started_at: i64,
    },
    /// Continue a row this generation owns from its transcript (SPEC §6.2).
    Resume(Adoption),
    /// Re-run an `attaching` row from its saved request under the same id and start (SPEC §6.3); with
    /// `from_gen: None`, a successor run a finish admitted here, started for the first time.
    Restart { row: LiveRow, events: Vec<Value>, from_gen: Option<String> },
}

/// What a resume adopts.
pub struct Adoption {
    pub row: LiveRow,
    pub last_step: StepRecord,
    pub transcript: Vec<Turn>,
    pub events: Vec<Value>,
    pub point: ResumePoint,
    pub from_gen: String,
}

/// Why a run actor stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum StopReason {
    Finished(RunStatus),
    Fenced,
    /// Handed to the next generation at a step boundary by a drain.
    HandedOff,
    /// Storage stayed unavailable past `lease_ms` (SPEC §5.2 step 7): the supervisor re-adopts the row at
    /// the first sweep that storage answers.
    StorageLost,
    HardStopped,
    Panicked(String),
}

#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RunEnded {
    pub run_id: String,
    pub reason: StopReason,
    /// The successor run the finish admitted here for follow-ups this run never read (its `attaching` row
    /// and first events): the supervisor launches it.
    pub successor: Option<(LiveRow, Vec<Value>)>,
}

/// This process handed the run to the next generation (drain), or the run was killed: stop at once,
/// write nothing more (the ending of a fence).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Abort {
    /// Why, for the log: "handed off", "killed".
    pub why: &'static str,
}

impl Handler<Abort> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: Abort, _ctx: &mut Context<Self>) {
        tracing::info!(run_id = %self.id, generation = self.deps.gen.as_str(), why = msg.why, "aborting the run; nothing more is written");
        self.control.send_modify(|c| c.fenced = true);
    }
}

/// A stop for this run (already committed to the ledger by the caller).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct StopRequest {
    pub mode: StopMode,
    pub actor: StopActor,
}

pub struct RunActor {
    id: String,
    deps: RunDeps,
    launch: Option<Launch>,
    control: watch::Sender<Control>,
    announced: Vec<StopMode>,
}

impl RunActor {
    pub fn new(deps: RunDeps, launch: Launch) -> Self {
        let id = match &launch {
            Launch::Fresh { id, .. } => id.clone(),
            Launch::Resume(a) => a.row.run_id.clone(),
            Launch::Restart { row, .. } => row.run_id.clone(),
        };
        RunActor { id, deps, launch: Some(launch), control: watch::channel(Control::default()).0, announced: Vec::new() }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn stop_with(&mut self, mode: StopMode, actor: Option<StopActor>) {
        if !self.announced.contains(&mode) {
            self.announced.push(mode);
            self.deps.registry.set_stop(&self.id, mode);
            let mut ev = json!({"type": "stop_requested", "mode": mode.as_str()});
            if let Some(a) = actor {
                ev["actor"] = json!(a);
            }
            publish(&self.deps, &self.id, ev, true);
        }
        self.control.send_modify(|c| c.stop = Some(decisions::strongest_stop(c.stop, mode)));
    }
}

impl Actor for RunActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let launch = self.launch.take().expect("a run actor starts once");
        let span = tracing::info_span!("run", run_id = %self.id, generation = self.deps.gen.as_str());
        // The heartbeat starts with the run (at the reservation for a fresh run, at once for an adoption).
        self.deps.heartbeat.do_send(Track {
            run_id: self.id.clone(),
            gen: self.deps.gen.as_str().to_owned(),
            news: ctx.address().recipient(),
        });
        let task = drive(self.deps.clone(), launch, self.control.subscribe());
        let task = tracing::Instrument::instrument(AssertUnwindSafe(task).catch_unwind(), span);
        ctx.spawn(task.into_actor(self).map(|result, act, ctx| {
            let (reason, successor) = match result {
                Ok(end) => end,
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    tracing::error!(run_id = %act.id, generation = act.deps.gen.as_str(), "run panicked");
                    (StopReason::Panicked(what), None)
                }
            };
            // The heartbeat never renews a run whose actor is gone; a re-adoption tracks it again.
            act.deps.heartbeat.do_send(Untrack(act.id.clone()));
            act.deps.on_ended.do_send(RunEnded { run_id: act.id.clone(), reason, successor });
            ctx.stop();
        }));
    }
}

/// The process drains: hand the run off at its next step boundary.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct DrainRun;

impl Handler<DrainRun> for RunActor {
    type Result = ();

    fn handle(&mut self, _msg: DrainRun, _ctx: &mut Context<Self>) {
        self.control.send_modify(|c| c.drain = true);
    }
}

impl Handler<StopRequest> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: StopRequest, _ctx: &mut Context<Self>) {
        self.stop_with(msg.mode, Some(msg.actor));
    }
}

impl Handler<HeartbeatNews> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: HeartbeatNews, _ctx: &mut Context<Self>) {
        match msg {
            HeartbeatNews::Stop(mode) => self.stop_with(mode, None),
            HeartbeatNews::Fenced => self.control.send_modify(|c| c.fenced = true),
        }
    }
}

/// Publish an event to the registry and, when `durable`, to the flusher for the ledger.
pub(crate) fn publish(deps: &RunDeps, id: &str, event: Value, durable: bool) -> Option<Value> {
    let stamped = deps.registry.publish(id, event)?;
    if durable {
        deps.flusher.do_send(Push { run_id: id.to_owned(), gen: deps.gen.as_str().to_owned(), event: stamped.clone() });
    }
    Some(stamped)
}

fn summarize(s: &str) -> String {
    truncate_chars(s, SUMMARY_CHARS)
}

/// At most `max` characters of `s`, with a trailing `…` when something was cut.
pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// The write-through state of a run's ledger row (SPEC §5.5).
#[derive(Debug, Clone, PartialEq)]
enum Tracking {
    /// Reserved or promoted; writes go through.
    Tracked,
    /// A write failed: later ledger writes are no-ops, the run continues best-effort, never resumed.
    Detached,
    /// Another generation owns the row.
    Fenced,
}

/// How the loop ended.
enum Ending {
    Answer(String),
    Failed(String),
    Stopped(StopMode),
    Fenced,
    /// Storage stayed unavailable past the lease.
    StorageLost,
    /// Handed to the next generation at a step boundary (drain).
    HandedOff,
}

/// The state of a running run's task.
struct Run {
    deps: RunDeps,
    id: String,
    gen: String,
    meta: RunMeta,
    deadline: i64,
    control: watch::Receiver<Control>,
    tracking: Tracking,
    agent: AgentEntry,
    tool_defs: Vec<ToolDef>,
    system: String,
    /// Transcript turns after the system turn.
    turns: Vec<Turn>,
    /// Turn count of the durable transcript (system turn included).
    turn_count: u64,
    step: u64,
    iteration: u64,
    inbox_consumed: Option<u64>,
    /// The previous step's results turn (or follow-ups), written with the next assistant turn.
    pending: Option<Turn>,
    /// Events committed with the next durable step, not by the flusher: the `input` events of the
    /// follow-ups folded into `pending` and the step's `assistant` event (SPEC §5.2 step 5).
    step_events: Vec<Value>,
    last_text: String,
    workspace: PathBuf,
    model_ms: u64,
    model_calls: u64,
    tool_ms: u64,
    tool_calls: u64,
}

/// How a run's task ended: why, and the successor run its finish admitted here, if any.
type Ended = (StopReason, Option<(LiveRow, Vec<Value>)>);

/// Drive a run to its end.
async fn drive(deps: RunDeps, launch: Launch, control: watch::Receiver<Control>) -> Ended {
    match launch {
        Launch::Fresh { id, meta, request, started_at } => fresh(deps, id, meta, request, started_at, control).await,
        Launch::Resume(adoption) => resume(deps, adoption, control).await,
        Launch::Restart { row, events, from_gen } => restart(deps, row, events, from_gen, control).await,
    }
}

/// Resolves once the control asks for an abort (hard stop or fence); never otherwise.
async fn aborted(control: watch::Receiver<Control>) {
    until(control, Control::aborts).await
}

/// Resolves once `what` holds of the control; never otherwise.
async fn until(mut control: watch::Receiver<Control>, what: fn(&Control) -> bool) {
    loop {
        if what(&control.borrow_and_update()) {
            return;
        }
        if control.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Run {
    fn now(&self) -> i64 {
        self.deps.clock.now_ms()
    }

    fn publish(&self, event: Value) {
        publish(&self.deps, &self.id, event, self.tracking == Tracking::Tracked);
    }

    /// Publish to the live view now and to the ledger with the next durable step.
    fn publish_in_step(&mut self, event: Value) {
        if let Some(stamped) = publish(&self.deps, &self.id, event, false) {
            if self.tracking == Tracking::Tracked {
                self.step_events.push(stamped);
            }
        }
    }

    fn note(&self, kind: &str, summary: &str) {
        self.publish(json!({"type": "note", "kind": kind, "summary": summary}));
    }

    /// The ending the control asks for, if any.
    fn checkpoint(&self) -> Option<Ending> {
        let c = self.control.borrow().clone();
        if c.fenced || self.tracking == Tracking::Fenced {
            Some(Ending::Fenced)
        } else {
            c.stop.map(Ending::Stopped)
        }
    }

    fn fence(&mut self) {
        if self.tracking != Tracking::Fenced {
            self.deps.metrics.fences.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(run_id = %self.id, generation = %self.gen, "fenced: another generation owns the run");
            self.tracking = Tracking::Fenced;
            self.deps.heartbeat.do_send(Untrack(self.id.clone()));
        }
    }

    /// Stop writing through: one note, one attempt to mark the row detached, no more heartbeats.
    async fn detach(&mut self, what: &str, why: String) {
        if self.tracking != Tracking::Tracked {
            return;
        }
        tracing::warn!(run_id = %self.id, generation = %self.gen, what, why = %why, "ledger write failed: detaching");
        self.tracking = Tracking::Detached;
        self.deps.heartbeat.do_send(Untrack(self.id.clone()));
        self.note("ledger_detached", &format!("{what} failed; this run is not resumable"));
        let mut patch = Map::new();
        patch.insert("detached".into(), Value::Bool(true));
        let _ = self.deps.storage.set_state(self.id.clone(), self.gen.clone(), patch).await;
    }

    /// Act on an owner write's answer. `Some` when it landed.
    async fn settle<T>(&mut self, what: &str, answer: storage::Result<storage::ledger::Outcome<T>>) -> Option<T> {
        let refusal = match &answer {
            Ok(Err(Refusal::Fenced { .. })) => Some("fenced"),
            Ok(Err(Refusal::UnknownRun { .. })) => Some("unknown_run"),
            Ok(Err(_)) => Some("other"),
            Err(_) => Some("unavailable"),
            Ok(Ok(_)) => None,
        };
        self.deps.metrics.ledger_write(what, refusal);
        match answer {
            Ok(Ok(v)) => Some(v),
            Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => {
                self.fence();
                None
            }
            Ok(Err(refusal)) => {
                self.detach(what, refusal.to_string()).await;
                None
            }
            Err(e) => {
                self.detach(what, e.to_string()).await;
                None
            }
        }
    }

    /// This step's record as of now.
    fn step_record(&self, calls: &[ToolCall]) -> StepRecord {
        StepRecord {
            step: self.step,
            seq: self.deps.registry.last_seq(&self.id).unwrap_or(0),
            turn_index: self.turn_count,
            in_flight: calls.iter().map(|c| InFlight { call_id: c.call_id.clone(), tool: c.tool.clone() }).collect(),
            inbox_consumed_seq: self.inbox_consumed,
            remaining_ms: (self.deadline - self.now()).max(0),
            turn: self.step,
            iteration: self.iteration,
        }
    }

    /// Write this step's transcript turns, its events and then its record with the calls in flight, in
    /// one commit: the record is never durable without its turns, and the tools run only after both are.
    /// A transient failure is retried for up to `lease_ms` (SPEC §5.5); `false` when storage stayed away
    /// that long (the run then ends [`StopReason::StorageLost`]).
    async fn write_durable_step(&mut self, new: Vec<Turn>, calls: &[ToolCall]) -> bool {
        let first_idx = self.turn_count;
        self.turn_count += new.len() as u64;
        self.turns.extend(new.iter().cloned());
        let events = std::mem::take(&mut self.step_events);
        if self.tracking != Tracking::Tracked {
            return true;
        }
        let record = self.step_record(calls);
        let (s, id, gen) = (self.deps.storage.clone(), self.id.clone(), self.gen.clone());
        let answer = self
            .retry_transient(|| s.durable_step(id.clone(), gen.clone(), first_idx, new.clone(), record.clone(), events.clone()))
            .await;
        let Some(answer) = answer else { return false };
        if self.settle("step record", answer).await.is_some() {
            self.deps.metrics.steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        true
    }

    /// Retry `op` while it fails transiently, with backoff (200 ms doubling to 5 s), for up to
    /// `lease_ms` (SPEC §5.5). `None` when storage stayed away that long; a permanent error is answered.
    async fn retry_transient<T, F, Fut>(&self, op: F) -> Option<storage::Result<T>>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = storage::Result<T>>,
    {
        let started = Instant::now();
        let mut delay = WRITE_RETRY;
        loop {
            match op().await {
                Err(e) if e.is_transient() => {
                    if started.elapsed() >= Duration::from_millis(self.deps.lease_ms.max(0) as u64) {
                        tracing::warn!(run_id = %self.id, generation = %self.gen, error = %e, "storage unavailable past the lease");
                        return None;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_WRITE_RETRY);
                }
                other => return Some(other),
            }
        }
    }

    /// Unread follow-ups past what this run consumed (none when untracked or unreadable).
    async fn unread(&self) -> Vec<InboxItem> {
        if self.tracking != Tracking::Tracked {
            return Vec::new();
        }
        match self.deps.storage.read_inbox(self.id.clone(), self.inbox_consumed).await {
            Ok(Ok(items)) => items,
            Ok(Err(_)) | Err(_) => Vec::new(),
        }
    }

    /// Fold follow-ups into the next turn: each gets its one `input {source: "followup"}` event, which
    /// commits with the step that writes the turn (SPEC §5.2 step 5), so a crash before that step
    /// leaves the message unread for the resumed run, and a crash after it leaves both.
    fn fold(&mut self, items: Vec<InboxItem>) {
        let Some(last) = items.iter().map(|i| i.seq).max() else { return };
        let mut followups = Vec::with_capacity(items.len());
        for item in items {
            let text = item.message.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
            self.publish_in_step(json!({"type": "input", "text": text, "source": "followup", "inboxSeq": item.seq}));
            followups.push((item.seq, text));
        }
        self.inbox_consumed = Some(last);
        match &mut self.pending {
            Some(turn) => turn.parts.extend(followups.iter().map(|(seq, t)| agent::followup_part(*seq, t))),
            None => self.pending = Some(agent::followups_turn(&followups)),
        }
    }

    /// Run one tool call, unless an abort comes first.
    async fn call_tool(&mut self, call: &ToolCall) -> Result<ToolResult, Ending> {
        self.publish(json!({"type": "tool_call", "callId": call.call_id, "tool": call.tool,
            "summary": summarize(&call.args.to_string()), "step": self.step}));
        let started = Instant::now();
        let output = match self.deps.tools.get(&call.tool) {
            Some(tool) => {
                use crate::operations::{AppId, Claim, Operation, Resource};
                let ctx = ToolContext { run_id: self.id.clone(), workspace: self.workspace.clone(), gen: self.gen.clone() };
                // The workspace is an app: a mutating call holds its worktree for writing while it runs,
                // a side-effect-free one for reading (SPEC §10).
                let claim = if tool.def().side_effect_free {
                    Claim::read(Resource::RepositoryWorktree)
                } else {
                    Claim::write(Resource::RepositoryWorktree)
                };
                let app = AppId::new(self.id.clone());
                let guarded = self.deps.operations.run(&app, Operation::new(call.tool.clone()), claim, tool.call(&ctx, &call.args));
                tokio::select! {
                    out = guarded => out.unwrap_or_else(|e| crate::tools::ToolOutput::err(format!("refused: {e}"))),
                    _ = aborted(self.control.clone()) => return Err(self.checkpoint().unwrap_or(Ending::Stopped(StopMode::Hard))),
                }
            }
            None => crate::tools::ToolOutput::err(decisions::NOT_AVAILABLE_TEXT),
        };
        self.tool_ms += started.elapsed().as_millis() as u64;
        self.tool_calls += 1;
        self.publish(json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": output.ok,
            "summary": summarize(&output.output), "step": self.step}));
        Ok(ToolResult { call_id: call.call_id.clone(), tool: call.tool.clone(), ok: output.ok, output: output.output })
    }

    async fn run_calls(&mut self, calls: &[ToolCall]) -> Result<Vec<ToolResult>, Ending> {
        let mut results = Vec::with_capacity(calls.len());
        for call in calls {
            results.push(self.call_tool(call).await?);
        }
        Ok(results)
    }

    /// The step loop (SPEC §5.2 step 5).
    async fn steps(&mut self) -> Ending {
        loop {
            if let Some(end) = self.checkpoint() {
                return end;
            }
            if self.control.borrow().drain {
                return self.hand_off().await;
            }
            if self.now() >= self.deadline {
                self.note("time_budget_exhausted", "the run's time budget ran out");
                return if self.last_text.is_empty() {
                    Ending::Failed("time budget exhausted before an answer".into())
                } else {
                    Ending::Answer(self.last_text.clone())
                };
            }
            // Follow-ups join a pending results turn (step 1 has none: its follow-ups wait, so the
            // transcript keeps its one-turn-per-step shape).
            if self.pending.is_some() {
                let items = self.unread().await;
                self.fold(items);
            }
            self.step += 1;
            self.iteration += 1;
            let mut conversation = self.turns.clone();
            conversation.extend(self.pending.clone());
            let started = Instant::now();
            let reply = {
                let conv = Conversation { system: &self.system, turns: &conversation, tools: &self.tool_defs };
                tokio::select! {
                    r = self.agent.agent.next(conv) => Some(r),
                    _ = aborted(self.control.clone()) => return self.checkpoint().unwrap_or(Ending::Stopped(StopMode::Hard)),
                    // A drain stops a model call at once: it is side-effect free and is made again.
                    _ = until(self.control.clone(), |c| c.drain) => None,
                }
            };
            let Some(reply) = reply else {
                self.step -= 1;
                self.iteration -= 1;
                return self.hand_off().await;
            };
            self.model_ms += started.elapsed().as_millis() as u64;
            self.model_calls += 1;
            let turn: AssistantTurn = match reply {
                Ok(t) => t,
                Err(e) => return Ending::Failed(e.to_string()),
            };
            let mut new_turns: Vec<Turn> = self.pending.take().into_iter().collect();
            new_turns.push(turn.to_turn());
            if !turn.calls.is_empty() {
                self.publish_in_step(json!({"type": "assistant", "text": turn.text, "step": self.step}));
            }
            if !self.write_durable_step(new_turns, &turn.calls).await {
                return Ending::StorageLost;
            }
            if self.tracking == Tracking::Fenced {
                return Ending::Fenced;
            }
            if !turn.text.is_empty() {
                self.last_text = turn.text.clone();
            }
            if turn.calls.is_empty() {
                // The model answered: read the inbox first; unread follow-ups become a turn and the loop goes on.
                let items = self.unread().await;
                if items.is_empty() {
                    return Ending::Answer(turn.text);
                }
                self.publish(json!({"type": "assistant", "text": turn.text, "step": self.step}));
                self.fold(items);
                continue;
            }
            match self.run_calls(&turn.calls).await {
                Ok(results) => self.pending = Some(agent::results_turn(&results, &[])),
                Err(end) => return end,
            }
        }
    }

    /// Take the run's workspace for this generation (SPEC §8.3 workspace fencing): rewrite its fence
    /// under the exclusive lock before any tool runs. A lock a paused old owner still holds is retried
    /// with backoff until it frees or the run is aborted; any other failure ends the run.
    async fn take_workspace(&mut self, mode: crate::tools::TakeMode) -> Result<(), Ending> {
        let mut delay = WRITE_RETRY;
        loop {
            let take = crate::tools::take_workspace_async(self.workspace.clone(), self.gen.clone(), mode);
            match take.await {
                Ok(()) => return Ok(()),
                Err(crate::tools::WorkspaceError::Busy { .. }) => {
                    tracing::warn!(run_id = %self.id, generation = %self.gen, "workspace lock held by another owner; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = aborted(self.control.clone()) => return Err(self.checkpoint().unwrap_or(Ending::Stopped(StopMode::Hard))),
                    }
                    delay = (delay * 2).min(MAX_WRITE_RETRY);
                }
                Err(e) => return Err(Ending::Failed(format!("workspace: {e}"))),
            }
        }
    }

    /// Drain (SPEC §6.4): at a step boundary, commit the last step's results (and any follow-ups folded
    /// with them) as a turn of their own under the same step with nothing in flight, flush the events,
    /// and hand the row to the next generation. The next process resumes from exactly here.
    async fn hand_off(&mut self) -> Ending {
        if self.tracking != Tracking::Tracked {
            return Ending::Fenced; // nothing to hand off: a detached run is never resumed
        }
        let results: Vec<Turn> = self.pending.take().into_iter().collect();
        if (!results.is_empty() || !self.step_events.is_empty()) && !self.write_durable_step(results, &[]).await {
            return Ending::StorageLost;
        }
        if self.tracking == Tracking::Fenced {
            return Ending::Fenced;
        }
        let _ = self.deps.flusher.send(crate::flusher::FlushRun(self.id.clone())).await;
        match self.deps.storage.handoff(self.gen.clone(), vec![self.id.clone()]).await {
            Ok(answer) if answer.iter().any(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff) => {
                tracing::info!(run_id = %self.id, generation = %self.gen, step = self.step, "handed off at a step boundary");
                Ending::HandedOff
            }
            other => {
                tracing::warn!(run_id = %self.id, generation = %self.gen, answer = ?other, "handoff at the boundary refused");
                Ending::Fenced
            }
        }
    }

    fn diagnosis(&self) -> Value {
        json!({"byCategory": {
            "model": {"count": self.model_calls, "durationMs": self.model_ms},
            "tool": {"count": self.tool_calls, "durationMs": self.tool_ms},
        }})
    }

    /// Final status, finishing gate, reply, record (SPEC §5.2 steps 6–8).
    async fn conclude(mut self, ending: Ending) -> Ended {
        let stop = self.control.borrow().stop;
        let (status, answer) = match ending {
            Ending::Fenced => return self.end_fenced(),
            Ending::StorageLost => return self.end_storage_lost(),
            Ending::HandedOff => {
                self.deps.heartbeat.do_send(Untrack(self.id.clone()));
                self.deps.registry.discard(&self.id);
                self.deps.flusher.do_send(crate::flusher::Forget(self.id.clone()));
                return (StopReason::HandedOff, None);
            }
            Ending::Failed(message) => {
                self.publish(json!({"type": "run_failed", "message": summarize(&message)}));
                (RunStatus::Failed, None)
            }
            Ending::Stopped(StopMode::Hard) => (RunStatus::StoppedHard, None),
            Ending::Stopped(StopMode::Soft) => (RunStatus::StoppedSoft, None),
            Ending::Answer(text) => match stop {
                Some(StopMode::Hard) => (RunStatus::StoppedHard, None),
                Some(StopMode::Soft) => (RunStatus::StoppedSoft, Some(text)),
                None => (RunStatus::Completed, Some(text)),
            },
        };
        // Everything published so far reaches the ledger first: a crash from here on closes the run
        // from complete live events.
        if self.tracking == Tracking::Tracked {
            let _ = self.deps.flusher.send(crate::flusher::FlushRun(self.id.clone())).await;
        }
        match self.finishing_gate(status, answer.as_deref()).await {
            Gate::Open => {}
            Gate::Fenced => return self.end_fenced(),
            Gate::Lost => return self.end_storage_lost(),
        }
        self.reply_and_finish(status, answer).await
    }

    /// The finishing gate (SPEC §5.2 step 7): only a confirmed owner replies. Unavailable storage is
    /// retried for up to the lease; a `WrongPhase` whose row already sits in `finishing` under this
    /// generation with this status means an earlier attempt committed.
    async fn finishing_gate(&mut self, status: RunStatus, answer: Option<&str>) -> Gate {
        match self.tracking {
            Tracking::Fenced => return Gate::Fenced,
            Tracking::Detached => return Gate::Open, // best effort: reply, record through the store
            Tracking::Tracked => {}
        }
        let (s, id, gen) = (self.deps.storage.clone(), self.id.clone(), self.gen.clone());
        let answer = answer.map(str::to_owned);
        let gate = self.retry_transient(|| s.finishing(id.clone(), gen.clone(), status, answer.clone())).await;
        match gate {
            None => Gate::Lost,
            Some(Ok(Ok(()))) => Gate::Open,
            Some(Ok(Err(Refusal::WrongPhase { .. }))) => {
                let row = self.retry_transient(|| s.get_live(id.clone())).await;
                match row {
                    None => Gate::Lost,
                    Some(Ok(Some(row)))
                        if row.owner_gen == self.gen
                            && row.phase == storage::ledger::Phase::Finishing
                            && row.state.get("finalStatus").and_then(Value::as_str) == Some(status.as_str()) =>
                    {
                        Gate::Open
                    }
                    Some(_) => Gate::Fenced,
                }
            }
            Some(Ok(Err(_))) => Gate::Fenced,
            Some(Err(e)) => {
                self.detach("finishing", e.to_string()).await;
                Gate::Open
            }
        }
    }

    /// After a fence: nothing more from this process reaches the thread.
    fn end_fenced(mut self) -> Ended {
        self.fence();
        self.deps.registry.discard(&self.id);
        (StopReason::Fenced, None)
    }

    /// Storage stayed away past the lease: stop renewing; the supervisor re-adopts the row when storage
    /// answers again (or another process reclaims it meanwhile).
    fn end_storage_lost(self) -> Ended {
        self.deps.heartbeat.do_send(Untrack(self.id.clone()));
        (StopReason::StorageLost, None)
    }

    /// Past the gate: publish the answer, deliver the reply, write the final record through the ledger's
    /// finish (which admits the successor for unread follow-ups in the same transaction).
    async fn reply_and_finish(self, mut status: RunStatus, answer: Option<String>) -> Ended {
        if let Some(text) = &answer {
            self.publish(json!({"type": "answer", "text": text}));
        }
        let reply = match self.deliver(status, answer.as_deref()).await {
            Delivery::Killed => return self.end_fenced(),
            Delivery::Sent(reply) => reply,
        };
        if reply.as_ref().is_some_and(|(ok, _)| !ok) && status == RunStatus::Completed {
            status = RunStatus::Failed;
        }
        let finished_at = self.now();
        self.deps.registry.finish(&self.id, status, finished_at);
        let extras = RecordExtras { reply, diagnosis: Some(self.diagnosis()), step_count: Some(self.step), ..Default::default() };
        let record = build_record(&self.deps, &self.id, status, finished_at, extras);
        let mut successor = None;
        if let Some(record) = record {
            let via = match self.tracking {
                Tracking::Tracked => Via::Ledger {
                    gen: self.gen.clone(),
                    successor: Some(Successor {
                        run_id: uuid::Uuid::now_v7().to_string(),
                        lease_ms: self.deps.lease_ms,
                        inbox_consumed: self.inbox_consumed,
                    }),
                },
                _ => Via::Store,
            };
            let successor_id = match &via {
                Via::Ledger { successor: Some(s), .. } => Some(s.run_id.clone()),
                _ => None,
            };
            if let WriteOutcome::Landed(_) = self.deps.history.write(record, via).landed().await {
                self.deps.registry.mark_persisted(&self.id);
            }
            if let Some(id) = successor_id {
                successor = admitted_successor(&self.deps, &id).await;
            }
        }
        self.deps.flusher.do_send(crate::flusher::Forget(self.id.clone()));
        self.deps.metrics.run_finished(status.as_str());
        tracing::info!(run_id = %self.id, generation = %self.gen, status = status.as_str(), "run finished; workspace released");
        (StopReason::Finished(status), successor)
    }

    /// POST the reply to the configured webhook; `Sent(Some((replyOk, replyNote)))` when one was called.
    /// The kill state is checked immediately before the attempt: a killed run sends nothing (SPEC §5.2
    /// step 7).
    async fn deliver(&self, status: RunStatus, answer: Option<&str>) -> Delivery {
        let Some(url) = self.deps.webhook_url.as_ref() else { return Delivery::Sent(None) };
        if self.tracking != Tracking::Detached && self.deps.storage.is_killed(self.id.clone()).await.unwrap_or(false) {
            tracing::info!(run_id = %self.id, generation = %self.gen, "killed after the finishing gate: no webhook");
            return Delivery::Killed;
        }
        let body = json!({
            "runId": self.id, "threadKey": self.meta.thread_key, "channel": self.meta.channel_id,
            "user": self.meta.user_id, "status": status.as_str(), "answer": answer, "finishedAt": self.now(),
        });
        let sent = self.deps.http.post(url).timeout(Duration::from_secs(10)).json(&body).send().await;
        Delivery::Sent(Some(match sent {
            Ok(r) if r.status().is_success() => (true, None),
            Ok(r) => (false, Some(format!("webhook answered {}", r.status().as_u16()))),
            Err(e) => (false, Some(format!("webhook failed: {}", if e.is_timeout() { "timeout" } else { "connection" }))),
        }))
    }
}

/// What the finishing gate answered.
enum Gate {
    Open,
    Fenced,
    Lost,
}

/// What the webhook step did.
enum Delivery {
    Sent(Option<(bool, Option<String>)>),
    /// The run was killed: no webhook, no record.
    Killed,
}

/// The successor run a finish (or close) admitted under this generation: its `attaching` row and first
/// events, for the supervisor to launch. A crash before the launch leaves it to a reclaim's restart.
pub async fn admitted_successor(deps: &RunDeps, id: &str) -> Option<(LiveRow, Vec<Value>)> {
    let row = deps.storage.get_live(id.to_owned()).await.ok()??;
    if row.owner_gen != deps.gen.as_str() || row.phase != storage::ledger::Phase::Attaching {
        return None;
    }
    let events = deps.storage.live_events(id.to_owned(), 0, usize::MAX >> 1).await.ok()??;
    Some((row, events))
}

/// The parts of a record besides its identity, events and counts.
#[derive(Debug, Clone, Default)]
pub struct RecordExtras {
    pub provisional: bool,
    pub reply: Option<(bool, Option<String>)>,
    pub diagnosis: Option<Value>,
    pub step_count: Option<u64>,
}

/// Assemble, validate and fit a record (the one place a record is built): the registry's snapshot at a
/// finish, or a reclaimed row's meta and live events at a close.
#[allow(clippy::too_many_arguments)]
pub fn assemble_record(
    id: &str,
    meta: &RunMeta,
    started_at: i64,
    finished_at: i64,
    status: RunStatus,
    events: Vec<Value>,
    event_count: u64,
    truncated: bool,
    extras: RecordExtras,
) -> Option<RunRecord> {
    let m = meta;
    let mut v = json!({
        "id": id, "label": m.label, "agent": m.agent, "model": m.model, "channelId": m.channel_id,
        "userId": m.user_id, "threadKey": m.thread_key, "channelVisibility": m.channel_visibility.as_str(),
        "startedAt": started_at, "finishedAt": finished_at, "status": status.as_str(),
        "eventCount": event_count, "storedEventCount": events.len(), "truncated": truncated,
        "events": events, "diagnosis": extras.diagnosis.unwrap_or_else(|| json!({"byCategory": {}})),
    });
    if let Some(p) = &m.parent_run_id {
        v["parentRunId"] = json!(p);
    }
    if extras.provisional {
        v["provisional"] = json!(true);
    } else {
        v["sealedAt"] = json!(finished_at);
    }
    if let Some(n) = extras.step_count {
        v["stepCount"] = json!(n);
    }
    if let Some((ok, note)) = extras.reply {
        v["replyOk"] = json!(ok);
        if let Some(n) = note {
            v["replyNote"] = json!(n);
        }
    }
    match validate_record(&v) {
        Ok(r) => Some(fit_record_to_budget(&r, MAX_RECORD_BYTES)),
        Err(e) => {
            tracing::error!(run_id = id, error = %e, "built an invalid record; not written");
            None
        }
    }
}

/// A record from the registry's snapshot of the run.
pub fn build_record(deps: &RunDeps, id: &str, status: RunStatus, finished_at: i64, extras: RecordExtras) -> Option<RunRecord> {
    let (row, events) = deps.registry.snapshot(id)?;
    assemble_record(id, &row.meta, row.started_at, finished_at, status, events, row.event_count, row.truncated, extras)
}

impl Run {
    fn new(deps: RunDeps, id: String, meta: RunMeta, deadline: i64, agent: AgentEntry, control: watch::Receiver<Control>) -> Self {
        let workspace = crate::tools::workspace_dir(&deps.data_dir, &id);
        Run {
            gen: deps.gen.as_str().to_owned(),
            tool_defs: deps.tools.defs(),
            system: agent.system.clone(),
            deps,
            id,
            meta,
            deadline,
            control,
            tracking: Tracking::Tracked,
            agent,
            turns: Vec::new(),
            turn_count: 0,
            step: 0,
            iteration: 0,
            inbox_consumed: None,
            pending: None,
            step_events: Vec::new(),
            last_text: String::new(),
            workspace,
            model_ms: 0,
            model_calls: 0,
            tool_ms: 0,
            tool_calls: 0,
        }
    }
}

/// A run admitted here: tombstone, promote, seed, steps, conclude.
async fn fresh(
    deps: RunDeps,
    id: String,
    meta: RunMeta,
    request: Request,
    started_at: i64,
    control: watch::Receiver<Control>,
) -> Ended {
    let Some(agent) = deps.agents.get(&meta.agent).cloned() else {
        // The slot checks the agent before admitting; a config reload could still race it.
        tracing::error!(run_id = %id, agent = %meta.agent, "unknown agent; abandoning the reservation");
        let _ = deps.storage.abandon(id.clone(), deps.gen.as_str().to_owned()).await;
        deps.registry.discard(&id);
        return (StopReason::Finished(RunStatus::Failed), None);
    };
    let deadline = started_at + agent.budget_ms;
    let run = Run::new(deps, id, meta, deadline, agent, control);
    // Tombstone: a provisional record, so a crash before the finish still leaves a trace.
    let tombstone = RecordExtras { provisional: true, ..Default::default() };
    if let Some(tomb) = build_record(&run.deps, &run.id, RunStatus::Interrupted, started_at, tombstone) {
        run.deps.history.write(tomb, Via::Store);
    }
    promote_and_run(run, &request.text).await
}

/// Promote the reserved row, seed the transcript, run the steps, conclude (SPEC §5.2 steps 4–8).
async fn promote_and_run(mut run: Run, request_text: &str) -> Ended {
    // The workspace fence names this generation before any tool runs (SPEC §8.3).
    if let Err(end) = run.take_workspace(crate::tools::TakeMode::Create).await {
        return run.conclude(end).await;
    }
    // Promote the reservation: from here the run is resumable.
    let mut state = Map::new();
    state.insert("binding".into(), json!({"workspace": run.workspace.display().to_string()}));
    let promotion = Promotion {
        system_text: run.system.clone(),
        tools: json!(run.tool_defs),
        state,
        lease_ms: run.deps.lease_ms,
    };
    let (s, id, gen) = (run.deps.storage.clone(), run.id.clone(), run.gen.clone());
    let claim = || s.claim(id.clone(), gen.clone(), promotion.clone());
    let mut answer = claim().await;
    for delay in CLAIM_RETRIES {
        if !answer.as_ref().is_err_and(storage::Error::is_transient) {
            break;
        }
        tokio::time::sleep(delay).await;
        answer = claim().await;
    }
    if answer.as_ref().is_err_and(storage::Error::is_transient) {
        match run.retry_transient(claim).await {
            Some(a) => answer = a,
            None => return run.conclude(Ending::StorageLost).await,
        }
    }
    match answer {
        Ok(Ok(_)) => {}
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => run.fence(),
        Ok(Err(refusal)) => run.detach("promotion", refusal.to_string()).await,
        Err(e) => run.detach("promotion", e.to_string()).await,
    }
    // Seed: the first model call's messages and the step-0 record, in one commit.
    if !run.write_durable_step(vec![agent::system_turn(&run.system), agent::user_turn(request_text)], &[]).await {
        return run.conclude(Ending::StorageLost).await;
    }
    run.turns.remove(0); // `turns` holds what follows the system turn
    let ending = run.steps().await;
    run.conclude(ending).await
}

/// Re-run a row from its saved request: same id, original start and deadline; the first attempt's
/// events replayed under their seqs, then `resumed`, then the steps (SPEC §6.3). A successor admitted
/// here (`from_gen: None`) starts the same way, without `resumed`.
async fn restart(
    deps: RunDeps,
    row: LiveRow,
    events: Vec<Value>,
    from_gen: Option<String>,
    control: watch::Receiver<Control>,
) -> Ended {
    let meta = meta_from_row(&row);
    let request: Option<Request> = row.meta.get("request").and_then(|r| serde_json::from_value(r.clone()).ok());
    let (Some(agent), Some(request)) = (deps.agents.get(&meta.agent).cloned(), request) else {
        let reason = format!("cannot restart: agent {:?} is not configured here, or the saved request is unreadable", meta.agent);
        return close_unstartable(&deps, &row, events, &reason).await;
    };
    let deadline = row.meta.get("deadline").and_then(Value::as_i64).unwrap_or(row.started_at + agent.budget_ms);
    let highest = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    let token = deps.tokens.mint(&row.run_id);
    let had_input = events.iter().any(|e| e["type"] == "input");
    // Past anything the dead attempt may have published but not flushed; a first start just continues.
    let next_seq = if from_gen.is_some() { highest + 1000 } else { highest + 1 };
    deps.registry.create(&row.run_id, meta.clone(), row.started_at, token, events, next_seq);
    let run = Run::new(deps, row.run_id.clone(), meta.clone(), deadline, agent, control);
    if highest == 0 || !had_input {
        // The first attempt's events never reached the ledger: publish the identity and request once.
        run.publish(meta.event());
        run.publish(json!({"type": "input", "text": request.text, "source": "request"}));
    }
    if let Some(from_gen) = from_gen {
        run.publish(json!({"type": "resumed", "settled": [], "fromGeneration": from_gen}));
    }
    promote_and_run(run, &request.text).await
}

/// Adopt a row this generation owns and continue it from its transcript (SPEC §6.2).
async fn resume(deps: RunDeps, a: Adoption, control: watch::Receiver<Control>) -> Ended {
    let row = a.row;
    let meta = meta_from_row(&row);
    let Some(agent) = deps.agents.get(&meta.agent).cloned() else {
        let reason = format!("cannot resume: agent {:?} is not configured here", meta.agent);
        return close_unstartable(&deps, &row, a.events, &reason).await;
    };
    let now = deps.clock.now_ms();
    let highest = a.events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    let token = deps.tokens.mint(&row.run_id);
    deps.registry.create(&row.run_id, meta.clone(), row.started_at, token, a.events, highest + 1000);
    let mut run = Run::new(deps, row.run_id.clone(), meta, now + a.last_step.remaining_ms, agent, control);
    if !row.system_text.is_empty() {
        run.system = row.system_text.clone();
    }
    // Re-attach the workspace the row is bound to; never migrate silently (SPEC §8.3).
    if let Some(bound) = row.state.get("binding").and_then(|b| b.get("workspace")).and_then(Value::as_str) {
        run.workspace = PathBuf::from(bound);
    }
    match run.take_workspace(crate::tools::TakeMode::Existing).await {
        Ok(()) => {}
        Err(Ending::Failed(why)) if !run.workspace.is_dir() => {
            let events = run.deps.registry.snapshot(&run.id).map(|(_, e)| e).unwrap_or_default();
            let deps = run.deps.clone();
            return close_unstartable(&deps, &row, events, &format!("the run's workspace is missing ({why})")).await;
        }
        Err(end) => return run.conclude(end).await,
    }
    run.turn_count = a.transcript.len() as u64;
    run.turns = a.transcript.into_iter().skip(1).collect();
    run.step = a.last_step.step;
    run.iteration = a.last_step.iteration;
    run.inbox_consumed = a.last_step.inbox_consumed_seq;
    run.last_text = run.turns.iter().rev().find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text)).unwrap_or_default();
    if row.phase == storage::ledger::Phase::Finishing {
        // Re-adopted past its finishing gate (after `StorageLost`): this process knows it never
        // delivered the reply, so it continues the reply from the saved answer (SPEC §5.2 step 7).
        let status = row.state.get("finalStatus").and_then(Value::as_str).and_then(RunStatus::parse).unwrap_or(RunStatus::Completed);
        let answer = row.state.get("answer").and_then(Value::as_str).map(str::to_owned);
        run.publish(json!({"type": "resumed", "settled": [], "fromGeneration": a.from_gen}));
        return run.reply_and_finish(status, answer).await;
    }
    let last_assistant = run.turns.last().and_then(AssistantTurn::from_turn);
    // Which calls to settle, and whether the transcript already ends on the answer (a finish plan).
    let mut calls = Vec::new();
    let mut finish_plan = None;
    match a.point {
        ResumePoint::ResumeAt { .. } => {
            let recorded: Vec<String> = a.last_step.in_flight.iter().map(|c| c.call_id.clone()).collect();
            if let Some(turn) = &last_assistant {
                let ids: Vec<String> = turn.calls.iter().map(|c| c.call_id.clone()).collect();
                if let Err(reason) = decisions::in_flight_matches(&recorded, &ids) {
                    run.publish(json!({"type": "resumed", "settled": [], "fromGeneration": a.from_gen}));
                    return run.conclude(Ending::Failed(reason)).await;
                }
                if turn.calls.is_empty() {
                    finish_plan = Some(turn.text.clone());
                }
                calls = turn.calls.clone();
            }
        }
        ResumePoint::RunStepFresh { step } => {
            // The step's turns landed but not its record: nothing was dispatched, run its calls fresh.
            run.step = step;
            run.iteration += 1;
            calls = last_assistant.map(|t| t.calls).unwrap_or_default();
            if calls.is_empty() {
                finish_plan = Some(run.last_text.clone());
            }
            if !run.write_durable_step(Vec::new(), &calls).await {
                return run.conclude(Ending::StorageLost).await;
            }
        }
    }
    let fresh_calls = matches!(a.point, ResumePoint::RunStepFresh { .. });
    let how: Vec<Settlement> = calls
        .iter()
        .map(|call| {
            if fresh_calls {
                return Settlement::Rerun;
            }
            let def = run.tool_defs.iter().find(|d| d.name == call.tool);
            decisions::settlement(def.is_some(), def.is_some_and(|d| d.side_effect_free), def.is_some_and(|d| d.rerun_safe))
        })
        .collect();
    let settled: Vec<Value> = if fresh_calls {
        Vec::new()
    } else {
        calls.iter().zip(&how).map(|(c, h)| json!({"callId": c.call_id, "tool": c.tool, "how": h})).collect()
    };
    run.publish(json!({"type": "resumed", "settled": settled, "fromGeneration": a.from_gen}));
    if let Some(text) = finish_plan {
        return run.conclude(Ending::Answer(text)).await;
    }
    if !calls.is_empty() {
        let mut results = Vec::with_capacity(calls.len());
        for (call, how) in calls.iter().zip(how) {
            match how.synthetic_text() {
                None => match run.call_tool(call).await {
                    Ok(r) => results.push(r),
                    Err(end) => return run.conclude(end).await,
                },
                Some(text) => {
                    // A visible settlement: viewers see the call's effects are unknown (SPEC §6.2).
                    let mut event = json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": false,
                        "summary": summarize(text), "step": run.step});
                    if how == Settlement::EffectsUnknown {
                        event["effectsUnknown"] = json!(true);
                    }
                    run.publish(event);
                    results.push(ToolResult { call_id: call.call_id.clone(), tool: call.tool.clone(), ok: false, output: text.to_owned() });
                }
            }
        }
        run.pending = Some(agent::results_turn(&results, &[]));
    }
    let ending = run.steps().await;
    run.conclude(ending).await
}

/// The run identity saved in a ledger row's `meta_json`.
pub fn meta_from_row(row: &LiveRow) -> RunMeta {
    let s = |k: &str| row.meta.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    RunMeta {
        agent: s("agent"),
        model: s("model"),
        label: s("label"),
        thread_key: row.thread_key.clone(),
        channel_id: s("channelId"),
        user_id: s("userId"),
        channel_visibility: storage::record::ChannelVisibility::parse(&s("channelVisibility")).unwrap_or_default(),
        parent_run_id: row.meta.get("parentRunId").and_then(Value::as_str).map(str::to_owned),
    }
}

/// Close a row this generation holds that cannot run (its agent is not configured here, its request is
/// unreadable): `interrupted`, naming why, so no sweep relaunches it.
async fn close_unstartable(deps: &RunDeps, row: &LiveRow, events: Vec<Value>, reason: &str) -> Ended {
    tracing::error!(run_id = %row.run_id, generation = deps.gen.as_str(), reason, "closing a run that cannot start here");
    deps.registry.discard(&row.run_id);
    match close_row(deps, row, events, RunStatus::Interrupted, reason).await {
        Ok(successor) => (StopReason::Finished(RunStatus::Interrupted), successor),
        Err(e) => {
            tracing::warn!(run_id = %row.run_id, error = %e, "close failed; the supervisor retries it");
            (StopReason::StorageLost, None)
        }
    }
}

/// Close a row with a record built from the row and its live events, through the finish transaction
/// (`eventCount` = last seq, `finishedAt` = now), which admits the successor for its unread inbox
/// (SPEC §5.2 step 8); answers that successor when it was admitted here.
pub async fn close_row(
    deps: &RunDeps,
    row: &LiveRow,
    mut events: Vec<Value>,
    status: RunStatus,
    reason: &str,
) -> Result<Option<(LiveRow, Vec<Value>)>, String> {
    let meta = meta_from_row(row);
    let now = deps.clock.now_ms();
    let last = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    events.push(json!({"type": "note", "seq": last + 1, "at": now, "kind": "reclaimed", "summary": reason}));
    let record = assemble_record(&row.run_id, &meta, row.started_at, now, status, events, last + 1, false, Default::default())
        .ok_or("the row does not make a valid record")?;
    let successor = Successor { run_id: uuid::Uuid::now_v7().to_string(), lease_ms: deps.lease_ms, inbox_consumed: None };
    let successor_id = successor.run_id.clone();
    match deps.storage.finish(deps.gen.as_str().to_owned(), record, None, Some(successor)).await {
        Ok(Ok(_)) => {
            tracing::info!(run_id = %row.run_id, generation = deps.gen.as_str(), status = status.as_str(), reason, "closed a run");
            Ok(admitted_successor(deps, &successor_id).await)
        }
        Ok(Err(refusal)) => Err(refusal.to_string()),
        Err(e) => Err(e.to_string()),
    }
}
