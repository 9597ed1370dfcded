//! `RunActor`: one run, from admission (or adoption) to its final record, driven by messages.
//!
//! What happens next is decided by the pure state machine in [`machine`] (`transition(&RunState, &Msg)
//! -> (RunState, Vec<Effect>)`); this actor is its shell: it executes each [`machine::Effect`] — storage
//! writes through the storage actor, publishing, tool dispatch, the reply, timers — and each effect's
//! completion comes back to it as a message ([`Step`], [`Done`]), as do the news from outside
//! ([`StopRequest`], [`Fenced`], [`Killed`], [`DrainRun`], [`HeartbeatNews`]). At most one effect runs at
//! a time, so one run's storage writes never interleave; a hard stop or a fence drops a model call or
//! tool calls in flight (their futures are cancelled; a late answer is discarded by its epoch).
//!
//! | message | sender → handler | carries | answers |
//! |---|---|---|---|
//! | [`Step`] | the run itself → run | — (the shell adds the deadline check) | — |
//! | [`Done`] | an effect of the run → run | the effect's answer (`Launched`, `Promoted`, `ModelDone`, `StepWritten`, `InboxRead`, `ToolsDone`, `HandedOff`, `Replied`, `Panicked`) | — |
//! | [`Finishing`] | the finishing gate → run | what the gate committed (the final status and answer), or why not | — |
//! | [`Finish`] | the final record → run | whether the ledger's finish took it, and the successor it admitted | — |
//! | [`StopRequest`] | supervisor → run | mode, who asked (already committed to the ledger) | — |
//! | [`Fenced`] | supervisor → run | why (handed off past the drain budget) | — |
//! | [`Killed`] | supervisor → run | — (the deletion fence is written) | — |
//! | [`DrainRun`] | supervisor → run | — | — |
//! | [`HeartbeatNews`] | supervisor → run (from the heartbeat's [`crate::heartbeat::RunNews`]) | a stop another generation requested, or a fence | — |
//! | [`RunEnded`] | run → supervisor | the [`StopReason`] and any successor run the finish admitted | — |
//!
//! # The run, in order (SPEC §5.2)
//! admitted (row + `run_meta`/`input` + tombstone + promotion (claim with prompt and tools) + seed turns
//! and step-0 record, all in the admit transaction; then the registry row; the thread slot) → steps (model call,
//! then the transcript turns, the step's events and its record with the calls in flight in one commit,
//! then the tools) → final status → finishing gate → answer + webhook → final record through the
//! ledger's finish, which admits one successor run for unread follow-ups → workspace release.
//!
//! Invariants:
//! - a step's turns and record are durable before its tools run;
//! - after a fence nothing more from this process reaches the thread: no answer, no webhook, no record;
//! - a detached run (a ledger write failed permanently) keeps running best-effort but is never resumed.

mod approval;
mod done;
mod ending;
mod launch;
pub mod machine;
mod news;
mod record;
mod tool_runner;
mod work;

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;

use actix::{
    Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message,
    SpawnHandle, WrapFuture,
};
use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use storage::ledger::decisions::ResumePoint;
use storage::ledger::{InboxItem, LiveRow, StepRecord, Turn};
use storage::record::RunEvent;
use storage::record::RunStatus;
use storage::{Clock, Generation, StorageHandle};

use crate::agent::{Agent, AssistantTurn};
use crate::flusher::{Flusher, Push};
use crate::heartbeat::{Heartbeat, Track, Untrack};
use crate::history::HistoryWriter;
use crate::registry::{Registry, RunMeta};
use crate::tools::Toolbox;
use ending::{Delivery, Finish, Finishing};
pub use launch::opening;
use launch::Launched;
use machine::{Effect, End, Msg, RunState};
pub use news::{ApprovalNews, DrainRun, Fenced, Killed, StopRequest};
pub use record::{
    admitted_successor, assemble_record, build_record, close_card_of, close_row, closing_record,
    fresh_successor, meta_from_row, RecordExtras, DELIVERY_UNKNOWN,
};
use work::Run;

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
    /// The run this one was started for (a conductor's child, seed item 46): carried on every row of the
    /// run and listed by `GET /api/runs/{id}/children`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<storage::RunId>,
    /// Where the message came from: a chat channel's runs show a status card in their thread (SPEC §12).
    #[serde(default, skip_serializing_if = "Source::is_api")]
    pub source: Source,
    /// What the message does on a busy thread (SPEC §5.1); `None` takes the agent's, then `[defaults]`.
    /// Admission writes the one it resolved (omitted for `steer`), so a queued inbox item says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<storage::ledger::Strategy>,
}

/// Where an admitted message came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `POST /api/messages`, the CLI, the plan coordinator: no chat thread to show the run in.
    #[default]
    Api,
    /// Slack's Events API: the run's card and answer go to its Slack thread.
    Slack,
}

impl Source {
    pub fn is_api(&self) -> bool {
        *self == Source::Api
    }
}

impl Request {
    pub fn thread_key(&self) -> String {
        format!("{}:{}", self.channel, self.thread)
    }

    /// The request a row saved (`meta.request`), if readable.
    pub fn of_row(row: &LiveRow) -> Option<Request> {
        serde_json::from_value(row.meta.get("request")?.clone()).ok()
    }

    /// The chat thread that shows the run (a status card and the answer), for a channel's message.
    pub fn chat_thread(&self) -> Option<crate::channel::ThreadRef> {
        (self.source == Source::Slack).then(|| crate::channel::ThreadRef {
            channel: self.channel.clone(),
            thread_ts: self.thread.clone(),
        })
    }
}

/// A configured agent with its budget, system prompt, tool allowlist, retry policy and streaming flag.
#[derive(Clone)]
pub struct AgentEntry {
    pub agent: Arc<dyn Agent>,
    pub budget_ms: i64,
    pub system: String,
    /// The tools the model sees and may call; `None`: every tool of the process.
    pub tools: Option<Vec<String>>,
    /// Retries of transient model errors (SPEC §8.3).
    pub retry: crate::agent::RetryPolicy,
    /// Text deltas go to live viewers as `assistant_delta` frames.
    pub stream: bool,
    /// What a message without a `strategy` does on a busy thread (`[agents.NAME] strategy`, else
    /// `[defaults] strategy`; SPEC §5.1).
    pub strategy: storage::ledger::Strategy,
    /// Tools whose calls wait for a person's approval (`[agents.NAME] approve`: exact names or a prefix
    /// ending in `*`; SPEC §13).
    pub approve: Vec<String>,
    /// No decision by then: the call is denied by `timeout`.
    pub approval_timeout_ms: i64,
}

impl AgentEntry {
    /// An agent with every tool, the default retry policy and no streaming.
    pub fn new(agent: Arc<dyn Agent>, budget_ms: i64, system: impl Into<String>) -> Self {
        AgentEntry {
            agent,
            budget_ms,
            system: system.into(),
            tools: None,
            retry: Default::default(),
            stream: false,
            strategy: Default::default(),
            approve: Vec::new(),
            approval_timeout_ms: 86_400_000,
        }
    }

    /// Whether this agent's calls of `tool` wait for a person's approval (`approve`, SPEC §13).
    pub fn approves(&self, tool: &str) -> bool {
        self.approve.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => tool.starts_with(prefix),
            None => p == tool,
        })
    }

    /// Whether the model may call `tool` (SPEC §8.3 `tools` allowlist).
    pub fn allows(&self, tool: &str) -> bool {
        self.tools
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|t| t == tool))
    }

    /// The definitions of the tools the model sees: the toolbox's, shared with every run unless this
    /// agent allows fewer.
    pub fn tool_defs(&self, toolbox: &crate::tools::Toolbox) -> Arc<[crate::agent::ToolDef]> {
        let all = toolbox.defs();
        match all.iter().all(|d| self.allows(&d.name)) {
            true => all,
            false => all
                .iter()
                .filter(|d| self.allows(&d.name))
                .cloned()
                .collect(),
        }
    }
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
    pub workspace_root: PathBuf,
    pub lease_ms: i64,
    /// Where finished runs' replies go, if anywhere.
    pub webhook: Option<crate::delivery::Webhook>,
    pub http: reqwest::Client,
    pub clock: Arc<dyn Clock>,
    pub tokens: crate::token::TokenMinter,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Resource claims on run workspaces (an app = a run's workspace).
    pub operations: crate::operations::OperationCoordinator,
    /// The status cards of runs from a chat thread (SPEC §12).
    pub cards: crate::channel::Cards,
    pub on_ended: actix::Recipient<RunEnded>,
}

/// Who asked for a stop, as published on `stop_requested`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopActor {
    pub kind: String,
    pub id: String,
}

impl StopActor {
    /// Sanitize the id to `^[A-Za-z0-9:@._-]{1,128}$` (SPEC §5.6): other characters are stripped, the rest
    /// capped at 128; nothing left reads `unknown`.
    pub fn new(kind: &str, id: &str) -> Self {
        let kept: String = id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || ":@._-".contains(*c))
            .take(128)
            .collect();
        StopActor {
            kind: kind.to_owned(),
            id: if kept.is_empty() {
                "unknown".to_owned()
            } else {
                kept
            },
        }
    }
}

/// How a run starts.
#[allow(clippy::large_enum_variant)] // one per run, moved once: boxing buys nothing
pub enum Launch {
    /// Admitted here: the row (promoted and seeded when `seeded`), the registry row, `run_meta`/`input`
    /// and the tombstone exist.
    Fresh(Box<Fresh>),
    /// Continue a row this generation owns from its transcript (SPEC §6.2).
    Resume(Adoption),
    /// Re-run an `attaching` row from its saved request under the same id and start (SPEC §6.3); with
    /// `from_gen: None`, a successor run a finish admitted here, started for the first time.
    Restart {
        row: LiveRow,
        events: Vec<Value>,
        from_gen: Option<String>,
    },
    /// Continue the reply of a row of this generation past its finishing gate whose reply never went
    /// out (its actor lost storage at the gate): the saved status and answer, then the record.
    Deliver {
        row: LiveRow,
        events: Vec<Value>,
        step: u64,
    },
}

/// A run this process admitted.
pub struct Fresh {
    pub id: storage::RunId,
    pub meta: RunMeta,
    pub request: Request,
    pub started_at: i64,
    pub agent: AgentEntry,
    /// The definitions the promotion named ([`AgentEntry::tool_defs`]).
    pub tool_defs: Arc<[crate::agent::ToolDef]>,
    /// The admission committed the promotion and seed ([`opening`]).
    pub seeded: bool,
    /// The storage's inbox epoch loaded before the admission's commit, when the run's inbox was empty.
    pub inbox_epoch: u64,
}

impl Launch {
    /// The run it launches.
    pub fn run_id(&self) -> &str {
        match self {
            Launch::Fresh(fresh) => &fresh.id,
            Launch::Resume(a) => &a.row.run_id,
            Launch::Restart { row, .. } | Launch::Deliver { row, .. } => &row.run_id,
        }
    }
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
    pub run_id: storage::RunId,
    pub reason: StopReason,
    /// The successor run the finish admitted here for follow-ups this run never read (its `attaching` row
    /// and first events): the supervisor launches it.
    pub successor: Option<(LiveRow, Vec<Value>)>,
}

/// How a run's task ended: why, and the successor run its finish admitted here, if any.
type Ended = (StopReason, Option<(LiveRow, Vec<Value>)>);

/// The run's own step boundary: the shell checks the deadline and asks the machine what next.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Step;

/// An effect's answer, sent by the effect to its run when it completes.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Done {
    /// The effect's epoch: an answer of an effect aborted since is discarded.
    epoch: u64,
    what: Completion,
}

enum Completion {
    Launched(Launched),
    Reattached(launch::Reattach),
    /// A resume's decision ([`Run::resume`]), sent by the shell to itself.
    Resumed(machine::Started),
    Promoted {
        answer: Option<storage::Result<storage::ledger::Outcome<()>>>,
        seeded: bool,
    },
    ModelDone {
        items: Vec<InboxItem>,
        reply: Result<AssistantTurn, String>,
        ms: u64,
    },
    StepWritten(Option<storage::Result<storage::ledger::Outcome<()>>>),
    InboxRead(Vec<InboxItem>),
    ToolsDone(work::ToolsRan),
    HandedOff(bool),
    Replied(Delivery),
    Panicked(String),
}

pub struct RunActor {
    id: storage::RunId,
    deps: RunDeps,
    launch: Option<Launch>,
    state: RunState,
    /// The run's working data, from its launch on.
    run: Option<Box<Run>>,
    /// The effect in flight, and its epoch.
    in_flight: Option<SpawnHandle>,
    epoch: u64,
    /// Who asked for the stop being announced.
    stop_actor: Option<StopActor>,
    /// The `run_failed` message published (redacted and capped), for the run's end line.
    failure: Option<String>,
    /// The successor run the ledger admitted here as this run's row went (its finish, or a launch that
    /// closed the row): handed to the supervisor with the end.
    successor: Option<(LiveRow, Vec<Value>)>,
    /// While a seal is in flight ([`Run::seal`]), the events the run would publish meanwhile (a stop's
    /// `stop_requested`): held so that nothing takes the seq its record gives the answer. A run that
    /// sealed drops them (it ended before it heard them); one that went the long way shows them.
    held: Option<Vec<RunEvent>>,
    /// The span every effect of the run runs in (`run_id`, `generation`): made once, each effect takes a
    /// clone (a reference count) instead of formatting the fields again.
    span: tracing::Span,
}

impl RunActor {
    pub fn new(deps: RunDeps, launch: Launch) -> Self {
        let id = match &launch {
            Launch::Fresh(fresh) => fresh.id.clone(),
            Launch::Resume(a) => a.row.run_id.clone(),
            Launch::Restart { row, .. } | Launch::Deliver { row, .. } => row.run_id.clone(),
        };
        let span =
            tracing::info_span!(parent: None, "run", run_id = %id, generation = deps.gen.as_str());
        RunActor {
            id,
            deps,
            launch: Some(launch),
            state: RunState::starting(),
            run: None,
            in_flight: None,
            epoch: 0,
            stop_actor: None,
            failure: None,
            successor: None,
            held: None,
            span,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Wake a wait for approvals, if the run waits (a stop ends it; a decision may end it).
    fn nudge_approvals(&self) {
        if let Some(run) = &self.run {
            run.approval_nudge.notify_one();
        }
    }

    /// Hand `msg` to the state machine and execute the effects it answers.
    fn apply(&mut self, msg: Msg, ctx: &mut Context<Self>) {
        let (next, effects) = machine::transition(&self.state, &msg);
        self.state = next;
        for effect in effects {
            self.execute(effect, ctx);
        }
    }

    /// Run `fut` as the effect in flight; its answer comes back as [`Done`]. A panic inside it is
    /// caught at this boundary and becomes [`Msg::Panicked`].
    fn spawn<F>(&mut self, ctx: &mut Context<Self>, fut: F, done: fn(F::Output) -> Completion)
    where
        F: std::future::Future + 'static,
    {
        self.spawn_as(ctx, fut, move |epoch, out| Done {
            epoch,
            what: done(out),
        });
    }

    /// [`RunActor::spawn`] for an effect whose answer is a message of its own (`M`, built by `answer`
    /// from the effect's epoch and output).
    fn spawn_as<F, M>(
        &mut self,
        ctx: &mut Context<Self>,
        fut: F,
        answer: impl FnOnce(u64, F::Output) -> M + 'static,
    ) where
        F: std::future::Future + 'static,
        M: Message<Result = ()> + 'static,
        Self: Handler<M>,
    {
        let epoch = self.epoch;
        let fut = tracing::Instrument::instrument(
            AssertUnwindSafe(fut).catch_unwind(),
            self.span.clone(),
        );
        let handle = ctx.spawn(fut.into_actor(self).map(move |out, _act, ctx| {
            match out {
                Ok(v) => ctx.notify(answer(epoch, v)),
                Err(panic) => ctx.notify::<Done>(Done {
                    epoch,
                    what: Completion::Panicked(
                        panic
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into()),
                    ),
                }),
            }
        }));
        self.in_flight = Some(handle);
    }

    /// Run a step write as the effect in flight ([`Completion::StepWritten`]); with nothing to write
    /// (untracked, nothing to take), its answer is `Ok` at once.
    fn spawn_write<F>(&mut self, ctx: &mut Context<Self>, write: Option<F>)
    where
        F: std::future::Future<Output = Option<storage::Result<storage::ledger::Outcome<()>>>>
            + 'static,
    {
        match write {
            Some(write) => self.spawn(ctx, write, Completion::StepWritten),
            None => ctx.notify(Done {
                epoch: self.epoch,
                what: Completion::StepWritten(Some(Ok(Ok(())))),
            }),
        }
    }

    fn run(&mut self) -> &mut Run {
        self.run
            .as_mut()
            .expect("effects after the launch have the run's data")
    }

    fn execute(&mut self, effect: Effect, ctx: &mut Context<Self>) {
        match effect {
            Effect::NextStep => ctx.notify(Step),
            Effect::Promote => {
                let fut = self.run().write_promotion();
                self.spawn(ctx, fut, |(answer, seeded)| Completion::Promoted {
                    answer,
                    seeded,
                });
            }
            Effect::Reattach => {
                let fut = self.run().reattach();
                self.spawn(ctx, fut, Completion::Reattached);
            }
            Effect::WriteResumedStep => {
                let write = self.run().write_resumed_step();
                self.spawn_write(ctx, write);
            }
            Effect::Resume => {
                let started = self.run().resume();
                ctx.notify(Done {
                    epoch: self.epoch,
                    what: Completion::Resumed(started),
                });
            }
            Effect::CallModel => {
                let fut = self.run().call_model();
                self.spawn(ctx, fut, |(items, reply, ms)| Completion::ModelDone {
                    items,
                    reply,
                    ms,
                });
            }
            Effect::WriteStep => {
                let run = self.run();
                let (turns, calls) = run.take_step_turns();
                if !calls.is_empty() {
                    let event = run.assistant_event();
                    run.publish_in_step(event);
                    run.publish_calls(&calls);
                }
                // A run that seals holds its answering step's write for the seal.
                let write = match calls.is_empty() && run.seals() {
                    true => {
                        run.defer_step(turns);
                        None
                    }
                    false => run.durable_step(turns, &calls),
                };
                self.spawn_write(ctx, write);
            }
            Effect::ReadInbox => {
                let fut = self.run().read_inbox();
                self.spawn(ctx, fut, Completion::InboxRead);
            }
            Effect::RunTools => {
                let fut = self.run().run_tools();
                self.spawn(ctx, fut, Completion::ToolsDone);
            }
            Effect::WriteFollowups => {
                let write = self.run().write_followups();
                self.spawn_write(ctx, write);
            }
            Effect::AbortInFlight => {
                self.epoch += 1;
                if let Some(handle) = self.in_flight.take() {
                    ctx.cancel_future(handle);
                }
            }
            Effect::AnnounceStop(mode) => {
                self.deps.registry.set_stop(&self.id, mode);
                let event = RunEvent::StopRequested {
                    stamp: Default::default(),
                    mode: mode.as_str().to_owned(),
                    actor: self.stop_actor.take().map(|actor| json!(actor)),
                };
                match &mut self.held {
                    Some(held) => held.push(event),
                    None => {
                        publish(
                            &self.deps,
                            &self.id,
                            event,
                            self.run.as_ref().is_none_or(|r| r.tracked()),
                        );
                    }
                }
            }
            Effect::Note(kind) => self.run().note(kind, "the run's time budget ran out"),
            Effect::PublishFailure(message) => {
                let summary = work::summarize(&self.deps, &message);
                let event = RunEvent::run_failed(summary.clone());
                self.failure = Some(summary);
                match self.run.as_ref() {
                    Some(run) => run.publish(event),
                    None => {
                        publish(&self.deps, &self.id, event, true);
                    }
                }
            }
            Effect::HandOff => {
                let fut = self.run().hand_off();
                self.spawn(ctx, fut, Completion::HandedOff);
            }
            Effect::Gate { status, answer } => {
                let run = self.run();
                let unwritten = run.unwritten.take();
                let fut = match run.seals() {
                    true => {
                        let fut = run.seal(status, answer, unwritten);
                        self.held = Some(Vec::new());
                        futures_util::future::Either::Left(fut)
                    }
                    false => futures_util::future::Either::Right(
                        run.finishing_gate(status, answer, unwritten),
                    ),
                };
                self.spawn_as(ctx, fut, |epoch, gate| Finishing { epoch, gate });
            }
            Effect::Reply { status, answer } => {
                let fut = self.run().deliver(status, answer);
                self.spawn(ctx, fut, Completion::Replied);
            }
            Effect::Record { status } => {
                let fut = self.run().record(status);
                self.spawn_as(ctx, fut, |epoch, recorded| Finish { epoch, recorded });
            }
            Effect::End(end) => self.end(end, ctx),
        }
    }

    /// The run is over: tell the supervisor (with the successor its row's end admitted) and stop.
    fn end(&mut self, end: End, ctx: &mut Context<Self>) {
        let reason = match end {
            End::Finished(status) => {
                self.deps
                    .flusher
                    .do_send(crate::flusher::Forget(self.id.clone()));
                // The one line per run end: its status, and what failed it (redacted, as the record has it).
                let (id, gen, status_text) = (&self.id, self.deps.gen.as_str(), status.as_str());
                match &self.failure {
                    Some(error) => {
                        tracing::info!(run_id = %id, generation = gen, status = status_text, error = %error, "run finished; workspace released")
                    }
                    None => {
                        tracing::info!(run_id = %id, generation = gen, status = status_text, "run finished; workspace released")
                    }
                }
                StopReason::Finished(status)
            }
            End::Fenced => {
                if let Some(run) = self.run.as_mut() {
                    run.fence();
                }
                self.deps.registry.discard(&self.id);
                StopReason::Fenced
            }
            End::HandedOff => {
                self.deps.registry.discard(&self.id);
                self.deps
                    .flusher
                    .do_send(crate::flusher::Forget(self.id.clone()));
                StopReason::HandedOff
            }
            End::StorageLost => StopReason::StorageLost,
            End::Panicked(what) => {
                tracing::error!(run_id = %self.id, generation = self.deps.gen.as_str(), "run panicked");
                StopReason::Panicked(what)
            }
        };
        // The heartbeat never renews a run whose actor is gone; a re-adoption tracks it again. Nothing
        // more reaches the thread from this actor (a finished run closed its card already).
        self.deps.heartbeat.do_send(Untrack(self.id.clone()));
        self.deps.cards.forget(&self.id);
        self.deps.on_ended.do_send(RunEnded {
            run_id: self.id.clone(),
            reason,
            successor: self.successor.take(),
        });
        ctx.stop();
    }

    /// Take an effect's answer if it is the one in flight (not the late answer of an effect aborted
    /// since).
    fn answered(&mut self, epoch: u64) -> bool {
        if epoch != self.epoch {
            return false;
        }
        self.in_flight = None;
        true
    }
}

impl Actor for RunActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let launch = self.launch.take().expect("a run actor starts once");
        // The heartbeat starts with the run (at the reservation for a fresh run, at once for an adoption).
        self.deps.heartbeat.do_send(Track {
            run_id: self.id.clone(),
            gen: self.deps.gen.as_str().to_owned(),
        });
        let deps = self.deps.clone();
        let fut = async move {
            match launch {
                Launch::Fresh(fresh) => launch::fresh(deps, fresh).await,
                Launch::Resume(adoption) => launch::resume(deps, adoption).await,
                Launch::Restart {
                    row,
                    events,
                    from_gen,
                } => launch::restart(deps, row, events, from_gen).await,
                Launch::Deliver { row, events, step } => {
                    launch::deliver(deps, row, events, step).await
                }
            }
        };
        self.spawn(ctx, fut, Completion::Launched);
    }
}

impl Handler<Step> for RunActor {
    type Result = ();

    fn handle(&mut self, _msg: Step, ctx: &mut Context<Self>) {
        let past_deadline = self.run.as_ref().is_some_and(|r| r.now() >= r.deadline);
        self.apply(Msg::Step { past_deadline }, ctx);
    }
}

/// Publish an event to the registry and, when `durable`, to the flusher for the ledger.
pub(crate) fn publish(
    deps: &RunDeps,
    id: &storage::RunId,
    event: RunEvent,
    durable: bool,
) -> Option<Value> {
    let stamped = deps.registry.publish(id, event.into())?;
    deps.cards.observe(id, &stamped);
    if durable {
        deps.flusher.do_send(Push {
            run_id: id.to_owned(),
            gen: deps.gen.as_str().to_owned(),
            event: stamped.clone(),
        });
    }
    Some(stamped)
}

#[cfg(test)]
mod tests {
    use super::StopActor;

    #[test]
    fn an_agent_approves_exact_names_and_trailing_star_prefixes_only() {
        let scripted = std::sync::Arc::new(crate::agent::scripted::ScriptedAgent::new());
        let mut agent = super::AgentEntry::new(scripted, 1, "s");
        assert!(
            !agent.approves("append_file"),
            "nothing needs approval by default"
        );
        agent.approve = vec!["append_file".into(), "mcp__*".into()];
        for (tool, needs) in [
            ("append_file", true),
            ("append_files", false),
            ("mcp__fs__write", true),
            ("mcp_", false),
            ("echo", false),
        ] {
            assert_eq!(agent.approves(tool), needs, "{tool}");
        }
    }

    #[test]
    fn a_stop_actor_id_is_stripped_to_its_charset_and_capped_and_nothing_left_reads_unknown() {
        assert_eq!(
            StopActor::new("token", "ops@example.com").id,
            "ops@example.com"
        );
        assert_eq!(StopActor::new("token", "ops team <boss>").id, "opsteamboss");
        assert_eq!(
            StopActor::new("token", &"a".repeat(300)).id,
            "a".repeat(128)
        );
        assert_eq!(StopActor::new("token", "").id, "unknown");
        assert_eq!(StopActor::new("token", "☃ ☃").id, "unknown");
    }
}
