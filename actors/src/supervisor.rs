//! `Supervisor`: one per process; owns the generation and every run actor, and `ThreadSlot`s that
//! serialize admission per thread.
//!
//! Messages in: [`AdmitMessage`] (HTTP admission), [`StopRun`] (HTTP stop), [`RunEnded`] (from run
//! actors), [`LaunchRun`] (from slots). It starts the flusher and the heartbeat.
//!
//! Restart policy (SPEC §1.1): a run actor that ended with [`StopReason::Panicked`] is re-adopted from
//! the ledger once, exactly as a resume plans it (in-flight mutating calls get the synthetic result,
//! never a re-run); a second panic closes it `failed`. Every other ending is deliberate and final.
//!
//! Invariant: a generation never reclaims its own rows; re-adoption after a panic reads this
//! generation's own row, it does not reclaim it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, AtomicResponse, Context, Handler, Message, ResponseFuture, WrapFuture};
use serde_json::{json, Value};
use storage::ledger::{decisions, Admit, AdmitOutcome, LiveRow, Phase, ReceiptKey, StopMode, Successor};
use storage::record::{ChannelVisibility, RunStatus};
use storage::{Clock, Generation, StorageHandle};

use crate::flusher::Flusher;
use crate::heartbeat::Heartbeat;
use crate::history::{HistoryWriter, Via};
use crate::registry::{Registry, RunMeta};
use crate::run::{self, Adoption, AgentEntry, Launch, Request, RunActor, RunDeps, RunEnded, StopActor, StopReason, StopRequest};
use crate::token::TokenMinter;
use crate::tools::Toolbox;

/// How long a keyed message waits for a finishing run to free its thread (SPEC §5.1).
const BUSY_WAIT: Duration = Duration::from_secs(5);
const BUSY_POLL: Duration = Duration::from_millis(100);

/// What the process hands the supervisor at boot.
pub struct SupervisorConfig {
    pub gen: Generation,
    pub storage: StorageHandle,
    pub registry: Registry,
    pub history: HistoryWriter,
    pub agents: HashMap<String, AgentEntry>,
    pub default_agent: String,
    pub tools: Toolbox,
    pub data_dir: PathBuf,
    pub lease_ms: i64,
    pub heartbeat_ms: u64,
    pub webhook_url: Option<String>,
    pub clock: Arc<dyn Clock>,
    pub tokens: TokenMinter,
    pub draining: Arc<AtomicBool>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub operations: crate::operations::OperationCoordinator,
    pub restart_policy: RestartPolicy,
}

/// How often a run may be re-adopted after a panic or `StorageLost` (SPEC §1.1, `[supervisor]`): more
/// than `max_restarts` times within `window_ms` closes it `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    pub max_restarts: u32,
    pub window_ms: i64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy { max_restarts: 1, window_ms: 600_000 }
    }
}

impl RestartPolicy {
    /// Record a restart of a run at `now` in its history; whether it is still within the policy.
    pub fn allows(&self, history: &mut Vec<i64>, now: i64) -> bool {
        history.retain(|t| now - t < self.window_ms);
        history.push(now);
        history.len() as u32 <= self.max_restarts
    }
}

/// A message to admit.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Admitted, AdmitError>")]
pub struct AdmitMessage {
    pub request: Request,
    pub key: Option<ReceiptKey>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    Started { run_id: String, token: String },
    Steered { run_id: String, seq: u64 },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmitError {
    #[error("the process is draining")]
    Draining,
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    #[error("unknown visibility {0:?}")]
    BadVisibility(String),
    #[error("thread key {0:?} is not 1 to 256 characters")]
    BadThread(String),
    #[error("the idempotency key was used with another body")]
    KeyConflict,
    #[error("the thread's run is finishing")]
    ThreadBusy,
    #[error("the run id is fenced")]
    Fenced,
    #[error("the live run holds the most keyed messages it may ({})", storage::ledger::MAX_RECEIPTS_PER_RUN)]
    ReceiptLimit,
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

/// A stop from an operator or integration (SPEC §5.6).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), StopError>")]
pub struct StopRun {
    pub run_id: String,
    pub mode: StopMode,
    pub actor: StopActor,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StopError {
    #[error("no such run")]
    NotFound,
    #[error("the run has finished")]
    Finished,
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

/// Start a run actor (from a slot, or the supervisor itself).
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaunchRun(pub Launch);

pub struct Supervisor {
    deps: Option<RunDeps>,
    config: Arc<SlotShared>,
    runs: HashMap<String, Addr<RunActor>>,
    slots: HashMap<String, Addr<ThreadSlot>>,
    /// When each run was re-adopted after a panic or `StorageLost`, within the restart window.
    restarts: HashMap<String, Vec<i64>>,
    parts: Option<(SupervisorConfig, Toolbox)>,
    /// Runs the boot reclaim adopted, launched once ingress is open.
    deferred: Vec<Launch>,
    /// A reclaim pass is running: passes never overlap.
    sweeping: bool,
    /// Runs handed to the next generation by a drain.
    handed: std::collections::HashSet<String>,
    /// Rows of this generation known to have no actor (storage lost, a failed launch or close): re-adopted
    /// at the next sweep that storage answers, with the sweeps that failed so far.
    orphans: HashMap<String, u32>,
    /// Rows (ledger or registry) seen without an actor at the last sweep: one more sighting and they
    /// are orphans (two sightings, so an admission between its commit and its launch is never taken).
    unattended: std::collections::HashSet<String>,
}

/// What slots share.
struct SlotShared {
    gen: Generation,
    storage: StorageHandle,
    registry: Registry,
    agents: Arc<HashMap<String, AgentEntry>>,
    default_agent: String,
    lease_ms: i64,
    clock: Arc<dyn Clock>,
    tokens: TokenMinter,
    draining: Arc<AtomicBool>,
    metrics: Arc<crate::metrics::Metrics>,
    restart_policy: RestartPolicy,
}

impl Supervisor {
    pub fn new(mut config: SupervisorConfig) -> Self {
        let agents = Arc::new(std::mem::take(&mut config.agents));
        let shared = SlotShared {
            gen: config.gen.clone(),
            storage: config.storage.clone(),
            registry: config.registry.clone(),
            agents: agents.clone(),
            default_agent: config.default_agent.clone(),
            lease_ms: config.lease_ms,
            clock: config.clock.clone(),
            tokens: config.tokens.clone(),
            draining: config.draining.clone(),
            metrics: config.metrics.clone(),
            restart_policy: config.restart_policy,
        };
        let tools = std::mem::replace(&mut config.tools, Toolbox::empty());
        config.agents = HashMap::new();
        Supervisor {
            deps: None,
            config: Arc::new(shared),
            runs: HashMap::new(),
            slots: HashMap::new(),
            restarts: HashMap::new(),
            parts: Some((config, tools)),
            deferred: Vec::new(),
            sweeping: false,
            handed: Default::default(),
            orphans: HashMap::new(),
            unattended: Default::default(),
        }
    }

    fn deps(&self) -> &RunDeps {
        self.deps.as_ref().expect("deps are built when the supervisor starts")
    }

    fn launch(&mut self, launch: Launch, ctx: &mut Context<Self>) {
        let _ = ctx;
        let actor = RunActor::new(self.deps().clone(), launch);
        let id = actor_id(&actor);
        let addr = actor.start();
        self.runs.insert(id, addr);
    }

    /// Re-adopt a row of this generation that no actor of this process drives (after a caught panic,
    /// `StorageLost`, a failed launch or close; SPEC §6.1): planned exactly as a reclaim plans it, owner
    /// unchanged. A row gone or owned elsewhere is dropped with its registry row; a row that still cannot
    /// be taken stays an orphan, and after [`MAX_READOPT_FAILURES`] failed sweeps closes `interrupted`.
    fn readopt(&mut self, run_id: String, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        let id = run_id.clone();
        let fut = async move { plan_readoption(&deps, &id).await };
        ctx.spawn(fut.into_actor(self).map(move |plan, act, ctx| match plan {
            Ok(Readoption::Launch(launch)) => {
                act.orphans.remove(&run_id);
                if act.runs.contains_key(&run_id) {
                    return; // an actor came back meanwhile
                }
                tracing::info!(run_id = %run_id, generation = act.deps().gen.as_str(), "re-adopting a run of this generation");
                act.deps().metrics.reclaimed("readopted", 1);
                act.launch(launch, ctx);
            }
            Ok(Readoption::Gone) => {
                act.orphans.remove(&run_id);
                if !act.runs.contains_key(&run_id) {
                    act.deps().registry.discard(&run_id);
                }
            }
            Ok(Readoption::Closed(successor)) => {
                act.orphans.remove(&run_id);
                act.launch_successor(successor, ctx);
            }
            Err(e) => {
                let failures = act.orphans.entry(run_id.clone()).or_default();
                *failures += 1;
                tracing::warn!(run_id = %run_id, failures = *failures, error = %e, "re-adoption failed; retried at the next sweep");
            }
        }));
    }

    /// Launch the successor a finish or close admitted here.
    fn launch_successor(&mut self, successor: Option<(LiveRow, Vec<Value>)>, ctx: &mut Context<Self>) {
        if let Some((row, events)) = successor {
            tracing::info!(run_id = %row.run_id, generation = self.deps().gen.as_str(), "starting the successor run for unread follow-ups");
            self.launch(Launch::Restart { row, events, from_gen: None }, ctx);
        }
    }

    /// Past the restart policy: close the run `failed` through the finish transaction.
    fn close_failed(&mut self, run_id: &str, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        let now = deps.clock.now_ms();
        run::publish(&deps, run_id, json!({"type": "run_failed", "message": "the run failed more often than the restart policy allows"}), true);
        deps.registry.finish(run_id, RunStatus::Failed, now);
        let Some(record) = run::build_record(&deps, run_id, RunStatus::Failed, now, Default::default()) else { return };
        let successor = Successor { run_id: uuid::Uuid::now_v7().to_string(), lease_ms: deps.lease_ms, inbox_consumed: None };
        let successor_id = successor.run_id.clone();
        let ticket = deps.history.write(record, Via::Ledger { gen: deps.gen.as_str().to_owned(), successor: Some(successor) });
        let fut = async move {
            ticket.landed().await;
            run::admitted_successor(&deps, &successor_id).await
        };
        ctx.spawn(fut.into_actor(self).map(|successor, act, ctx| act.launch_successor(successor, ctx)));
    }

    fn slot(&mut self, thread_key: &str, supervisor: Addr<Supervisor>) -> Addr<ThreadSlot> {
        if let Some(a) = self.slots.get(thread_key).filter(|a| a.connected()) {
            return a.clone();
        }
        let slot = ThreadSlot { shared: self.config.clone(), supervisor }.start();
        self.slots.insert(thread_key.to_owned(), slot.clone());
        slot
    }
}

fn actor_id(actor: &RunActor) -> String {
    actor.id().to_owned()
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let (config, tools) = self.parts.take().expect("a supervisor starts once");
        let flusher = Flusher::new(config.storage.clone(), self.config.metrics.event_batch_failures.clone()).start();
        let heartbeat = Heartbeat::new(
            config.storage.clone(),
            Duration::from_millis(config.heartbeat_ms),
            config.lease_ms,
            ctx.address().recipient(),
        )
        .start();
        self.deps = Some(RunDeps {
            gen: config.gen,
            storage: config.storage,
            registry: config.registry,
            flusher,
            heartbeat,
            history: config.history,
            agents: self.config.agents.clone(),
            tools: Arc::new(tools),
            data_dir: config.data_dir,
            lease_ms: config.lease_ms,
            webhook_url: config.webhook_url,
            http: reqwest::Client::new(),
            clock: config.clock,
            tokens: self.config.tokens.clone(),
            metrics: self.config.metrics.clone(),
            operations: config.operations,
            on_ended: ctx.address().recipient(),
        });
        // Finished rows leave the registry after their TTL. Slots of threads with no run here are dropped
        // (a slot only orders this process's admissions; the ledger's `admit` is what is atomic, so a
        // slot recreated while an old one finishes its last message is harmless).
        ctx.run_interval(Duration::from_secs(5), |act, _| {
            let registry = &act.deps().registry;
            registry.evict_expired();
            let busy: std::collections::HashSet<String> =
                registry.rows().into_iter().filter(|r| r.finished_at.is_none()).map(|r| r.meta.thread_key).collect();
            act.slots.retain(|thread, a| a.connected() && busy.contains(thread));
        });
    }
}

impl Handler<AdmitMessage> for Supervisor {
    type Result = ResponseFuture<Result<Admitted, AdmitError>>;

    fn handle(&mut self, msg: AdmitMessage, ctx: &mut Context<Self>) -> Self::Result {
        if self.config.draining.load(Ordering::SeqCst) {
            return Box::pin(async { Err(AdmitError::Draining) });
        }
        let slot = self.slot(&msg.request.thread_key(), ctx.address());
        Box::pin(async move { slot.send(msg).await.map_err(|e| AdmitError::Unavailable(e.to_string()))? })
    }
}

/// The heartbeat's news about a run: the supervisor is the one fan-out point that tells run actors
/// (SPEC §1.1). A fence for a run with no actor here ends its registry row.
impl Handler<crate::heartbeat::RunNews> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: crate::heartbeat::RunNews, _ctx: &mut Context<Self>) {
        match self.runs.get(&msg.run_id) {
            Some(run) => run.do_send(msg.news),
            None if msg.news == crate::heartbeat::HeartbeatNews::Fenced => self.deps().registry.discard(&msg.run_id),
            None => {}
        }
    }
}

impl Handler<LaunchRun> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: LaunchRun, ctx: &mut Context<Self>) {
        self.launch(msg.0, ctx);
    }
}

impl Handler<RunEnded> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: RunEnded, ctx: &mut Context<Self>) {
        self.runs.remove(&msg.run_id);
        self.launch_successor(msg.successor, ctx);
        if self.handed.remove(&msg.run_id) {
            return;
        }
        match msg.reason {
            reason @ (StopReason::Panicked(_) | StopReason::StorageLost) => {
                let now = self.deps().clock.now_ms();
                let gen = self.deps().gen.as_str().to_owned();
                let history = self.restarts.entry(msg.run_id.clone()).or_default();
                let allowed = self.config.restart_policy.allows(history, now);
                self.config.metrics.run_restart(match reason {
                    StopReason::Panicked(_) => "panicked",
                    _ => "storage_lost",
                });
                tracing::error!(run_id = %msg.run_id, generation = %gen, restarts = history.len(), reason = ?reason, "run actor failed");
                match (allowed, reason) {
                    (false, _) => self.close_failed(&msg.run_id, ctx),
                    (true, StopReason::Panicked(_)) => self.readopt(msg.run_id, ctx),
                    // Re-adopted at the next sweep that storage answers.
                    (true, _) => {
                        self.orphans.entry(msg.run_id).or_default();
                    }
                }
            }
            StopReason::Fenced => {
                self.restarts.remove(&msg.run_id);
                let deps = self.deps().clone();
                let id = msg.run_id.clone();
                ctx.spawn(
                    async move {
                        if deps.storage.is_killed(id.clone()).await.unwrap_or(false) {
                            purge_killed(deps, id).await;
                        }
                    }
                    .into_actor(self),
                );
            }
            _ => {
                self.restarts.remove(&msg.run_id);
            }
        }
    }
}

/// What a re-adoption found.
enum Readoption {
    Launch(Launch),
    /// The row is gone or owned elsewhere: nothing to drive.
    Gone,
    /// The row was closed (a deletion fence, or too many failed attempts); with its successor, if any.
    Closed(Option<(LiveRow, Vec<Value>)>),
}

/// Most sweeps a row of this generation may fail to re-adopt before it closes `interrupted`.
const MAX_READOPT_FAILURES: u32 = 3;

/// Plan the re-adoption of this generation's own row, as a reclaim would plan it (SPEC §6.1).
async fn plan_readoption(deps: &RunDeps, run_id: &str) -> Result<Readoption, String> {
    let s = &deps.storage;
    let Some(row) = s.get_live(run_id.to_owned()).await.map_err(|e| e.to_string())? else { return Ok(Readoption::Gone) };
    if row.owner_gen != deps.gen.as_str() || row.phase == Phase::Handoff {
        return Ok(Readoption::Gone);
    }
    if s.is_killed(run_id.to_owned()).await.map_err(|e| e.to_string())? {
        purge_killed(deps.clone(), run_id.to_owned()).await;
        return Ok(Readoption::Closed(None));
    }
    let last_step = s.last_step(run_id.to_owned()).await.map_err(|e| e.to_string())?;
    let transcript = s.read_transcript(run_id.to_owned()).await.map_err(|e| e.to_string())?;
    let events = s.live_events(run_id.to_owned(), 0, usize::MAX >> 1).await.map_err(|e| e.to_string())?.unwrap_or_default();
    let from_gen = Some(deps.gen.as_str().to_owned());
    let has_request = row.meta.get("request").is_some_and(Value::is_object);
    if row.phase == Phase::Attaching || last_step.is_none() {
        if !has_request {
            let successor = run::close_row(deps, &row, events, RunStatus::Interrupted, decisions::NO_REQUEST_REASON).await?;
            return Ok(Readoption::Closed(successor));
        }
        return Ok(Readoption::Launch(Launch::Restart { row, events, from_gen }));
    }
    let last_step = last_step.expect("checked above");
    match decisions::completeness(transcript.len() as u64, Some(last_step.cursor())) {
        Ok(point) => Ok(Readoption::Launch(Launch::Resume(Adoption {
            row,
            last_step,
            transcript,
            events,
            point,
            from_gen: deps.gen.as_str().to_owned(),
        }))),
        Err(reason) => Ok(Readoption::Closed(run::close_row(deps, &row, events, RunStatus::Interrupted, &reason).await?)),
    }
}

/// Close an orphan that failed [`MAX_READOPT_FAILURES`] sweeps.
async fn close_orphan(deps: &RunDeps, run_id: &str) -> Result<Readoption, String> {
    let s = &deps.storage;
    let Some(row) = s.get_live(run_id.to_owned()).await.map_err(|e| e.to_string())? else { return Ok(Readoption::Gone) };
    if row.owner_gen != deps.gen.as_str() {
        return Ok(Readoption::Gone);
    }
    let events = s.live_events(run_id.to_owned(), 0, usize::MAX >> 1).await.map_err(|e| e.to_string())?.unwrap_or_default();
    let why = format!("could not be re-adopted in {MAX_READOPT_FAILURES} sweeps");
    Ok(Readoption::Closed(run::close_row(deps, &row, events, RunStatus::Interrupted, &why).await?))
}

impl Handler<StopRun> for Supervisor {
    type Result = ResponseFuture<Result<(), StopError>>;

    fn handle(&mut self, msg: StopRun, _ctx: &mut Context<Self>) -> Self::Result {
        let deps = self.deps().clone();
        let local = self.runs.get(&msg.run_id).cloned();
        Box::pin(async move {
            if deps.registry.row(&msg.run_id).is_some_and(|r| r.finished_at.is_some()) {
                return Err(StopError::Finished);
            }
            // Every stop of a tracked run commits to the ledger first, then signals the run.
            match deps.storage.request_stop(msg.run_id.clone(), msg.mode).await {
                Ok(Ok(_)) => {}
                Ok(Err(_not_live)) => {
                    if local.is_none() {
                        return match deps.storage.get_summary(msg.run_id.clone()).await {
                            Ok(Some(_)) => Err(StopError::Finished),
                            Ok(None) => Err(StopError::NotFound),
                            Err(e) => Err(StopError::Unavailable(e.to_string())),
                        };
                    }
                }
                Err(e) => return Err(StopError::Unavailable(e.to_string())),
            }
            if let Some(run) = local {
                run.do_send(StopRequest { mode: msg.mode, actor: msg.actor });
            }
            // A run another process owns: its heartbeat relays the stop.
            Ok(())
        })
    }
}

/// `ThreadSlot`: one per thread with activity; admits that thread's messages one at a time.
pub struct ThreadSlot {
    shared: Arc<SlotShared>,
    supervisor: Addr<Supervisor>,
}

impl Actor for ThreadSlot {
    type Context = Context<Self>;
}

impl Handler<AdmitMessage> for ThreadSlot {
    type Result = AtomicResponse<Self, Result<Admitted, AdmitError>>;

    fn handle(&mut self, msg: AdmitMessage, _ctx: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let supervisor = self.supervisor.clone();
        AtomicResponse::new(Box::pin(admit(shared, supervisor, msg).into_actor(self)))
    }
}

/// Admission (SPEC §5.1): the ledger's atomic `admit`, then — only for a run it started — the registry
/// row, `run_meta` and `input`, and the run actor.
async fn admit(shared: Arc<SlotShared>, supervisor: Addr<Supervisor>, msg: AdmitMessage) -> Result<Admitted, AdmitError> {
    let req = msg.request;
    let thread_key = req.thread_key();
    if !decisions::is_valid_thread_key(&thread_key) {
        return Err(AdmitError::BadThread(thread_key));
    }
    let agent_name = req.agent.clone().unwrap_or_else(|| shared.default_agent.clone());
    let agent = shared.agents.get(&agent_name).ok_or_else(|| AdmitError::UnknownAgent(agent_name.clone()))?;
    let visibility = match req.visibility.as_deref() {
        None => ChannelVisibility::Machine,
        Some(v) => ChannelVisibility::parse(v).ok_or_else(|| AdmitError::BadVisibility(v.to_owned()))?,
    };
    let run_id = uuid::Uuid::now_v7().to_string();
    let meta = RunMeta {
        agent: agent_name.clone(),
        model: agent.agent.model().to_owned(),
        label: storage::ledger::label_of(&req.text),
        thread_key: thread_key.clone(),
        channel_id: req.channel.clone(),
        user_id: req.user.clone(),
        channel_visibility: visibility,
        parent_run_id: None,
    };
    let request = serde_json::to_value(&req).map_err(|e| AdmitError::Unavailable(e.to_string()))?;
    let waited_since = shared.clock.now_ms();
    loop {
        let now = shared.clock.now_ms();
        let mut meta_json = meta.event();
        if let Value::Object(m) = &mut meta_json {
            m.remove("type");
            m.insert("deadline".into(), json!(now + agent.budget_ms));
            m.insert("request".into(), request.clone());
        }
        let admit = Admit {
            thread_key: thread_key.clone(),
            gen: shared.gen.as_str().to_owned(),
            run_id: run_id.clone(),
            request: request.clone(),
            meta: meta_json,
            key: msg.key.clone(),
            lease_ms: shared.lease_ms,
        };
        // `run_meta` and `input` (seqs 1 and 2) commit with the admission itself: a crash right after it
        // still replays them, so a restarted run never loses (or repeats) its input (SPEC §5.2 step 2).
        let first_events: Vec<Value> = [meta.event(), json!({"type": "input", "text": req.text, "source": "request"})]
            .into_iter()
            .zip(1u64..)
            .map(|(mut event, seq)| {
                event["seq"] = json!(seq);
                event["at"] = json!(now);
                storage::record::cap_event_for_publish(event)
            })
            .collect();
        let outcome = shared
            .storage
            .admit_with_events(admit, first_events.clone(), now)
            .await
            .map_err(|e| AdmitError::Unavailable(e.to_string()))?;
        return match outcome {
            AdmitOutcome::Started { run_id: started } if started == run_id => {
                let token = shared.tokens.mint(&run_id);
                shared.registry.create(&run_id, meta.clone(), now, token.clone(), first_events, 3);
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), "admitted a new run");
                shared.metrics.runs_started.fetch_add(1, Ordering::Relaxed);
                supervisor.do_send(LaunchRun(Launch::Fresh {
                    id: run_id.clone(),
                    meta: meta.clone(),
                    request: req.clone(),
                    started_at: now,
                }));
                Ok(Admitted::Started { run_id, token })
            }
            // A keyed retry of an earlier admission: its answer, verbatim.
            AdmitOutcome::Started { run_id } => Ok(Admitted::Started { token: shared.tokens.mint(&run_id), run_id }),
            AdmitOutcome::Steered { run_id, seq } => {
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), inbox_seq = seq, "steered into a live run");
                Ok(Admitted::Steered { run_id, seq })
            }
            AdmitOutcome::Busy { .. } if now - waited_since < BUSY_WAIT.as_millis() as i64 => {
                tokio::time::sleep(BUSY_POLL).await;
                continue;
            }
            AdmitOutcome::Busy { .. } => Err(AdmitError::ThreadBusy),
            AdmitOutcome::KeyConflict => Err(AdmitError::KeyConflict),
            AdmitOutcome::Fenced => Err(AdmitError::Fenced),
            AdmitOutcome::ReceiptLimit { .. } => Err(AdmitError::ReceiptLimit),
        };
    }
}


// ---- Recovery: reclaim at boot and on a sweep (SPEC §6.1), drain as handoff (SPEC §6.4) ----

/// One reclaim pass. At boot (`defer_launch`) the runs to resume are held until [`OpenIngress`].
#[derive(Message)]
#[rtype(result = "Result<ReclaimReport, String>")]
pub struct ReclaimPass {
    pub defer_launch: bool,
}

/// Ingress is open: launch the runs the boot reclaim adopted and start the periodic sweep.
#[derive(Message)]
#[rtype(result = "()")]
pub struct OpenIngress;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReclaimReport {
    pub resumed: Vec<String>,
    pub restarted: Vec<String>,
    pub closed: Vec<(String, String)>,
    pub failed: Vec<String>,
    pub live_elsewhere: usize,
}

/// Drain: hand off resumable runs, wait for the rest, write provisional records at the deadline.
#[derive(Message)]
#[rtype(result = "DrainReport")]
pub struct Drain {
    pub deadline: Duration,
    pub handoff_budget: Duration,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrainReport {
    pub handed_off: Vec<String>,
    pub waited_for: usize,
    pub abandoned: Vec<String>,
}

/// How many run actors are still active, and which (not counting handed-off ones).
#[derive(Message)]
#[rtype(result = "Vec<String>")]
struct ActiveRuns;

/// What one reclaimed row became.
#[allow(clippy::large_enum_variant)] // one per reclaimed row, moved once
enum Fate {
    Launch(Launch),
    /// Closed, how, and the successor its close admitted here for unread follow-ups.
    Closed(String, Option<(LiveRow, Vec<Value>)>),
}

/// Classify and act on one taken row (SPEC §6.1): close it, or plan its resume or restart.
async fn take_row(deps: &RunDeps, r: storage::ledger::Reclaimed) -> Result<(String, Fate), String> {
    let id = r.row.run_id.clone();
    let s = &deps.storage;
    // A killed run is never resumed or closed: it is purged.
    if s.is_killed(id.clone()).await.map_err(|e| e.to_string())? {
        purge_killed(deps.clone(), id.clone()).await;
        return Ok((id, Fate::Closed("killed: purged".into(), None)));
    }
    let transcript = s.read_transcript(id.clone()).await.map_err(|e| e.to_string())?;
    let final_status = r.row.state.get("finalStatus").and_then(Value::as_str).map(str::to_owned);
    let input = decisions::ClassifyInput {
        prior_phase: r.prior_phase,
        stop: r.row.stop,
        final_status: final_status.as_deref(),
        detached: r.row.state.get("detached").and_then(Value::as_bool).unwrap_or(false),
        has_request: r.row.meta.get("request").is_some_and(|v| v.is_object()),
        turn_count: transcript.len() as u64,
        last_step: r.last_step.as_ref().map(|s| s.cursor()),
    };
    let events = s.live_events(id.clone(), 0, usize::MAX >> 1).await.map_err(|e| e.to_string())?.unwrap_or_default();
    let fate = match decisions::classify(&input) {
        decisions::Classification::CloseFinal { status } => {
            let status = RunStatus::parse(&status).unwrap_or(RunStatus::Completed);
            let successor = run::close_row(deps, &r.row, events, status, "closed from finishing; delivery unknown").await?;
            Fate::Closed(status.as_str().into(), successor)
        }
        decisions::Classification::CloseHardStopped => {
            let successor = run::close_row(deps, &r.row, events, RunStatus::StoppedHard, "a hard stop was recorded").await?;
            Fate::Closed("stopped_hard".into(), successor)
        }
        decisions::Classification::CloseInterrupted { reason } => {
            let successor = run::close_row(deps, &r.row, events, RunStatus::Interrupted, &reason).await?;
            Fate::Closed(format!("interrupted: {reason}"), successor)
        }
        decisions::Classification::Restart => {
            Fate::Launch(Launch::Restart { row: r.row, events, from_gen: Some(r.prior_owner) })
        }
        decisions::Classification::Resume(point) => {
            let agent = r.row.meta.get("agent").and_then(Value::as_str).unwrap_or_default().to_owned();
            match r.last_step {
                Some(last_step) if deps.agents.contains_key(&agent) => Fate::Launch(Launch::Resume(Adoption {
                    row: r.row,
                    last_step,
                    transcript,
                    events,
                    point,
                    from_gen: r.prior_owner,
                })),
                _ => {
                    let reason = format!("agent {agent:?} is not configured here");
                    let successor = run::close_row(deps, &r.row, events, RunStatus::Interrupted, &reason).await?;
                    Fate::Closed(format!("interrupted: {reason}"), successor)
                }
            }
        }
    };
    Ok((id, fate))
}

impl Supervisor {
    /// Storage answered a sweep: re-adopt (or, after too many failures, close) every orphan, and make
    /// orphans of this generation's rows — and drop registry rows — that had no actor two sweeps running.
    fn attend(&mut self, mine: Vec<String>, ctx: &mut Context<Self>) {
        if self.config.draining.load(Ordering::SeqCst) {
            return;
        }
        let registry: Vec<String> =
            self.deps().registry.rows().into_iter().filter(|r| r.finished_at.is_none()).map(|r| r.id).collect();
        let idle: std::collections::HashSet<String> = mine
            .iter()
            .chain(&registry)
            .filter(|id| !self.runs.contains_key(*id) && !self.handed.contains(*id) && !self.orphans.contains_key(*id))
            .cloned()
            .collect();
        for id in idle.intersection(&self.unattended) {
            if mine.contains(id) {
                tracing::warn!(run_id = %id, generation = self.deps().gen.as_str(), "a row of this generation has no actor");
                self.orphans.insert(id.clone(), 0);
            } else {
                self.deps().registry.discard(id);
            }
        }
        self.unattended = idle;
        let orphans: Vec<(String, u32)> = self.orphans.iter().map(|(id, n)| (id.clone(), *n)).collect();
        for (id, failures) in orphans {
            if self.runs.contains_key(&id) {
                self.orphans.remove(&id);
            } else if failures >= MAX_READOPT_FAILURES {
                self.close_orphan(id, ctx);
            } else {
                self.readopt(id, ctx);
            }
        }
    }

    fn close_orphan(&mut self, run_id: String, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        let id = run_id.clone();
        let fut = async move { close_orphan(&deps, &id).await };
        ctx.spawn(fut.into_actor(self).map(move |closed, act, ctx| match closed {
            Ok(Readoption::Closed(successor)) => {
                act.orphans.remove(&run_id);
                act.launch_successor(successor, ctx);
            }
            Ok(_) => {
                act.orphans.remove(&run_id);
                act.deps().registry.discard(&run_id);
            }
            Err(e) => tracing::warn!(run_id = %run_id, error = %e, "closing an orphan failed; retried at the next sweep"),
        }));
    }

    fn launch_or_defer(&mut self, launch: Launch, defer: bool, ctx: &mut Context<Self>) {
        if defer {
            self.deferred.push(launch);
        } else {
            self.launch(launch, ctx);
        }
    }
}

impl Handler<ReclaimPass> for Supervisor {
    type Result = actix::ResponseActFuture<Self, Result<ReclaimReport, String>>;

    fn handle(&mut self, msg: ReclaimPass, _ctx: &mut Context<Self>) -> Self::Result {
        if self.sweeping {
            return Box::pin(actix::fut::ready(Ok(ReclaimReport::default())));
        }
        self.sweeping = true;
        let deps = self.deps().clone();
        let lease_ms = deps.lease_ms;
        let fut = async move {
            let dead: Vec<String> = match deps.storage.generations().await {
                Ok(gens) => gens.into_iter().filter(|g| g.gen != deps.gen.as_str() && crate::host::is_gone(g)).map(|g| g.gen).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "could not read generations; no fast reclaim this pass");
                    Vec::new()
                }
            };
            let answer = deps.storage.reclaim(deps.gen.as_str().to_owned(), lease_ms, dead).await.map_err(|e| e.to_string())?;
            let mut report = ReclaimReport { live_elsewhere: answer.live_elsewhere.len(), ..Default::default() };
            let mut launches = Vec::new();
            for r in answer.taken {
                let id = r.row.run_id.clone();
                // One row's failure is logged and never stops the others; the row stays ours and is
                // re-adopted at a later sweep.
                match take_row(&deps, r).await {
                    Ok((id, Fate::Closed(how, successor))) => {
                        report.closed.push((id, how));
                        if let Some((row, events)) = successor {
                            launches.push(Launch::Restart { row, events, from_gen: None });
                        }
                    }
                    Ok((id, Fate::Launch(l))) => {
                        match &l {
                            Launch::Restart { .. } => report.restarted.push(id),
                            _ => report.resumed.push(id),
                        }
                        launches.push(l);
                    }
                    Err(e) => {
                        tracing::error!(run_id = %id, generation = deps.gen.as_str(), error = %e, "reclaimed row could not be classified or closed");
                        report.failed.push(id);
                    }
                }
            }
            deps.metrics.reclaimed("resumed", report.resumed.len() as u64);
            deps.metrics.reclaimed("restarted", report.restarted.len() as u64);
            deps.metrics.reclaimed("closed", report.closed.len() as u64);
            deps.metrics.reclaimed("failed", report.failed.len() as u64);
            if !(report.resumed.is_empty() && report.restarted.is_empty() && report.closed.is_empty()) {
                tracing::info!(generation = deps.gen.as_str(), resumed = report.resumed.len(), restarted = report.restarted.len(), closed = report.closed.len(), "reclaim pass");
            }
            // Rows of this generation, to find any without an actor (SPEC §6.1: no run is live without one).
            let mine: Vec<String> = match deps.storage.list_live().await {
                Ok(rows) => rows
                    .into_iter()
                    .filter(|r| r.owner_gen == deps.gen.as_str() && r.phase != Phase::Handoff)
                    .map(|r| r.run_id)
                    .collect(),
                Err(_) => Vec::new(),
            };
            Ok::<_, String>((report, launches, mine))
        };
        Box::pin(fut.into_actor(self).map(move |result, act, ctx| {
            act.sweeping = false;
            let (report, launches, mine) = result?;
            for id in &report.failed {
                act.orphans.entry(id.clone()).or_default();
            }
            for l in launches {
                act.launch_or_defer(l, msg.defer_launch, ctx);
            }
            if !msg.defer_launch {
                act.attend(mine, ctx);
            }
            Ok(report)
        }))
    }
}

impl Handler<OpenIngress> for Supervisor {
    type Result = ();

    fn handle(&mut self, _msg: OpenIngress, ctx: &mut Context<Self>) {
        for l in std::mem::take(&mut self.deferred) {
            self.launch(l, ctx);
        }
        let every = Duration::from_millis(self.deps().lease_ms.max(100) as u64);
        ctx.run_interval(every, |_act, ctx| {
            ctx.address().do_send(ReclaimPass { defer_launch: false });
        });
    }
}

impl Handler<ActiveRuns> for Supervisor {
    type Result = Vec<String>;

    fn handle(&mut self, _msg: ActiveRuns, _ctx: &mut Context<Self>) -> Vec<String> {
        self.runs.keys().filter(|id| !self.handed.contains(*id)).cloned().collect()
    }
}

impl Handler<Drain> for Supervisor {
    type Result = actix::ResponseActFuture<Self, DrainReport>;

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) -> Self::Result {
        self.config.draining.store(true, Ordering::SeqCst);
        // Every run hands itself off at its next step boundary: a model call stops at once, tool calls
        // in flight finish and their results commit first (SPEC §6.4).
        for run in self.runs.values() {
            run.do_send(run::DrainRun);
        }
        let deps = self.deps().clone();
        let me = ctx.address();
        let budget = msg.handoff_budget;
        let deadline = msg.deadline;
        let fut = async move {
            let started = tokio::time::Instant::now();
            // Wait for the boundaries, up to the handoff budget; runs in `finishing` or still attaching
            // are not resumable and are waited for below.
            loop {
                let active = me.send(ActiveRuns).await.unwrap_or_default();
                let resumable = resumable_here(&deps, &active).await;
                if resumable.is_empty() || started.elapsed() >= budget {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Calls still running at the budget are dropped: hand those runs off as they are, and the
            // next process settles their calls effects-unknown.
            let gen = deps.gen.as_str().to_owned();
            let active = me.send(ActiveRuns).await.unwrap_or_default();
            let late = resumable_here(&deps, &active).await;
            let handed: Vec<String> = match deps.storage.handoff(gen.clone(), late).await {
                Ok(results) => results.into_iter().filter(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff).map(|(id, _)| id).collect(),
                Err(e) => {
                    tracing::warn!(generation = %gen, error = %e, "drain: handoff failed");
                    Vec::new()
                }
            };
            (handed, deps, me, started)
        };
        Box::pin(fut.into_actor(self).then(move |(handed, deps, me, started), act, _ctx| {
            for id in &handed {
                act.handed.insert(id.clone());
                if let Some(run) = act.runs.get(id) {
                    run.do_send(run::Fenced { why: "handed off to the next generation past the handoff budget" });
                }
                deps.registry.discard(id);
            }
            if !handed.is_empty() {
                tracing::info!(generation = deps.gen.as_str(), runs = ?handed, "drain: handed off runs still busy at the budget");
            }
            let wait = async move {
                let mut waited_for = 0;
                loop {
                    let active = me.send(ActiveRuns).await.unwrap_or_default();
                    waited_for = waited_for.max(active.len());
                    if active.is_empty() || started.elapsed() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // At the deadline: a provisional full-snapshot record for every run still active here.
                let mut abandoned = Vec::new();
                for id in me.send(ActiveRuns).await.unwrap_or_default() {
                    let now = deps.clock.now_ms();
                    let provisional = run::RecordExtras { provisional: true, ..Default::default() };
                    if let Some(r) = run::build_record(&deps, &id, RunStatus::Interrupted, now, provisional) {
                        deps.history.write(r, Via::Store);
                        abandoned.push(id);
                    }
                }
                // Pending history writes get the handoff budget.
                let _ = tokio::time::timeout(budget, deps.history.settled()).await;
                DrainReport { handed_off: handed, waited_for, abandoned }
            };
            wait.into_actor(act)
        }))
    }
}

/// Of `active` (this process's runs), those resumable here: promoted (`live`), owned by this generation,
/// not detached. Never an attaching run, never one in `finishing`.
async fn resumable_here(deps: &RunDeps, active: &[String]) -> Vec<String> {
    if active.is_empty() {
        return Vec::new();
    }
    match deps.storage.list_live().await {
        Ok(rows) => rows
            .into_iter()
            .filter(|r| r.owner_gen == deps.gen.as_str() && r.phase == Phase::Live)
            .filter(|r| !r.state.get("detached").and_then(Value::as_bool).unwrap_or(false))
            .filter(|r| active.contains(&r.run_id))
            .map(|r| r.run_id)
            .collect(),
        Err(e) => {
            tracing::warn!(generation = deps.gen.as_str(), error = %e, "drain: could not list live rows");
            Vec::new()
        }
    }
}

// ---- Kill (SPEC §5.6): deletion fence, abort as a fence, purge, workspace deletion ----

/// Kill a run: live (here or elsewhere) or finished.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), StopError>")]
pub struct KillRun {
    pub run_id: String,
}

/// Purge a killed run once it has settled, and delete its workspace through the operation coordinator
/// (admission closed, admitted work drained, then `{app-path: write}` through the deletion handle).
async fn purge_killed(deps: RunDeps, run_id: String) {
    match deps.storage.purge(run_id.clone()).await {
        Ok(true) => tracing::info!(run_id = %run_id, generation = deps.gen.as_str(), "purged a killed run"),
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "purge failed; a later reclaim retries it");
            return;
        }
    }
    deps.registry.discard(&run_id);
    use crate::operations::{AppId, Claim, Operation, Resource};
    let app = AppId::new(run_id.clone());
    let Ok(fence) = deps.operations.close_admission(&app).await else { return };
    deps.operations.end_session(&app);
    let handle = fence.drain().await;
    let dir = crate::tools::workspace_dir(&deps.data_dir, &run_id);
    let removed = handle
        .run(Operation::new("delete_workspace"), Claim::write(Resource::AppPath), async move {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            }
        })
        .await;
    if let Ok(Err(e)) | Err(e) = removed.map_err(|e| std::io::Error::other(e.to_string())) {
        tracing::warn!(run_id = %run_id, error = %e, "could not delete the killed run's workspace");
    }
}

impl Handler<KillRun> for Supervisor {
    type Result = ResponseFuture<Result<(), StopError>>;

    fn handle(&mut self, msg: KillRun, _ctx: &mut Context<Self>) -> Self::Result {
        let deps = self.deps().clone();
        let local = self.runs.get(&msg.run_id).cloned();
        Box::pin(async move {
            let id = msg.run_id;
            let known = deps.registry.row(&id).is_some()
                || deps.storage.get_live(id.clone()).await.map_err(|e| StopError::Unavailable(e.to_string()))?.is_some()
                || deps.storage.get_summary(id.clone()).await.map_err(|e| StopError::Unavailable(e.to_string()))?.is_some();
            if !known {
                return Err(StopError::NotFound);
            }
            let answer = deps.storage.kill(id.clone()).await.map_err(|e| StopError::Unavailable(e.to_string()))?;
            tracing::info!(run_id = %id, generation = deps.gen.as_str(), live_owner = ?answer.live_owner, "kill: deletion fence written");
            match (local, answer.live_owner) {
                // Ours: abort it as a fence; the supervisor purges when its actor has ended.
                (Some(run), _) => run.do_send(run::Killed),
                // Another live owner: its heartbeat sees the fence, aborts, and purges.
                (None, Some(owner)) if owner != deps.gen.as_str() && answer.owner_lease_live => {}
                // Finished, or its owner is gone: purge now.
                _ => purge_killed(deps, id).await,
            }
            Ok(())
        })
    }
}
