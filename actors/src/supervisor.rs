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
use storage::ledger::{decisions, Admit, AdmitOutcome, ReceiptKey, Refusal, StopMode};
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
/// Longest `label` taken from the request text.
const LABEL_CHARS: usize = 80;

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
    panics: HashMap<String, u32>,
    parts: Option<(SupervisorConfig, Toolbox)>,
    /// Runs the boot reclaim adopted, launched once ingress is open.
    deferred: Vec<Launch>,
    /// A reclaim pass is running: passes never overlap.
    sweeping: bool,
    /// Runs handed to the next generation by a drain.
    handed: std::collections::HashSet<String>,
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
        };
        let tools = std::mem::replace(&mut config.tools, Toolbox::empty());
        config.agents = HashMap::new();
        Supervisor {
            deps: None,
            config: Arc::new(shared),
            runs: HashMap::new(),
            slots: HashMap::new(),
            panics: HashMap::new(),
            parts: Some((config, tools)),
            deferred: Vec::new(),
            sweeping: false,
            handed: Default::default(),
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

    /// Re-adopt a run of this generation after its actor panicked (its row is ours; no reclaim).
    fn readopt(&mut self, run_id: String, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        let fut = async move {
            let s = &deps.storage;
            let row = s.get_live(run_id.clone()).await.ok()??;
            if row.owner_gen != deps.gen.as_str() {
                return None;
            }
            let last_step = s.last_step(run_id.clone()).await.ok()??;
            let transcript = s.read_transcript(run_id.clone()).await.ok()?;
            let point = decisions::completeness(transcript.len() as u64, Some(last_step.cursor())).ok()?;
            let events = deps.registry.snapshot(&run_id).map(|(_, e)| e).unwrap_or_default();
            Some(Adoption { row, last_step, transcript, events, point, from_gen: deps.gen.as_str().to_owned() })
        };
        ctx.spawn(fut.into_actor(self).map(|adoption, act, ctx| match adoption {
            Some(a) => {
                tracing::info!(run_id = %a.row.run_id, generation = act.deps().gen.as_str(), "re-adopting a panicked run");
                act.launch(Launch::Resume(a), ctx);
            }
            None => tracing::error!("could not re-adopt a panicked run; the reclaim sweep of a later generation will"),
        }));
    }

    /// A second panic: close the run `failed` through the finish transaction.
    fn close_failed(&mut self, run_id: &str) {
        let deps = self.deps().clone();
        let now = deps.clock.now_ms();
        run::publish(&deps, run_id, json!({"type": "run_failed", "message": "the run panicked twice"}), true);
        deps.registry.finish(run_id, RunStatus::Failed, now);
        if let Some(record) = run::build_record(&deps, run_id, RunStatus::Failed, now, Default::default()) {
            deps.history.write(record, Via::Ledger { gen: deps.gen.as_str().to_owned() });
        }
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
        let heartbeat =
            Heartbeat::new(config.storage.clone(), Duration::from_millis(config.heartbeat_ms), config.lease_ms).start();
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
        if self.handed.remove(&msg.run_id) {
            return;
        }
        match msg.reason {
            StopReason::Panicked(what) => {
                let n = {
                    let n = self.panics.entry(msg.run_id.clone()).or_default();
                    *n += 1;
                    *n
                };
                tracing::error!(run_id = %msg.run_id, generation = self.deps().gen.as_str(), panics = n, panic = %what, "run actor panicked");
                if n == 1 {
                    self.readopt(msg.run_id, ctx);
                } else {
                    self.close_failed(&msg.run_id);
                }
            }
            StopReason::Fenced => {
                self.panics.remove(&msg.run_id);
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
                self.panics.remove(&msg.run_id);
                if let Some(request) = followup_request(&msg.leftover) {
                    // ONE fresh run on the thread for the follow-ups the finished run never read.
                    let slot = self.slot(&msg.thread_key, ctx.address());
                    ctx.spawn(
                        async move {
                            if let Err(e) = slot.send(AdmitMessage { request, key: None }).await {
                                tracing::warn!(error = %e, "could not start the follow-up run");
                            }
                        }
                        .into_actor(self),
                    );
                }
            }
        }
    }
}

/// The request of the run started for unread follow-ups: the first one's identity, every text.
fn followup_request(items: &[storage::ledger::InboxItem]) -> Option<Request> {
    let mut reqs = items.iter().filter_map(|i| serde_json::from_value::<Request>(i.message.clone()).ok());
    let mut first = reqs.next()?;
    for r in reqs {
        first.text.push_str("\n\n");
        first.text.push_str(&r.text);
    }
    Some(first)
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
        label: label_of(&req.text),
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
        let outcome = shared.storage.admit(admit, now).await.map_err(|e| AdmitError::Unavailable(e.to_string()))?;
        return match outcome {
            AdmitOutcome::Started { run_id: started } if started == run_id => {
                let token = shared.tokens.mint(&run_id);
                shared.registry.create(&run_id, meta.clone(), now, token.clone(), Vec::new(), 1);
                let events: Vec<Value> =
                    [meta.event(), json!({"type": "input", "text": req.text, "source": "request"})]
                        .into_iter()
                        .filter_map(|event| shared.registry.publish(&run_id, event))
                        .collect();
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), "admitted a new run");
                shared.metrics.runs_started.fetch_add(1, Ordering::Relaxed);
                // `run_meta` and `input` reach the ledger before the answer: a crash from here on still
                // replays them, so a restarted or resumed run never loses (or repeats) its input.
                let appended = shared.storage.append(run_id.clone(), shared.gen.as_str().to_owned(), events.clone()).await;
                let initial_events = match appended {
                    Ok(Ok(())) => Vec::new(),
                    other => {
                        tracing::warn!(run_id = %run_id, answer = ?other.map(|o| o.err()), "first events not appended; the flusher retries them");
                        events
                    }
                };
                supervisor.do_send(LaunchRun(Launch::Fresh {
                    id: run_id.clone(),
                    meta: meta.clone(),
                    request: req.clone(),
                    started_at: now,
                    initial_events,
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

fn label_of(text: &str) -> String {
    run::truncate_chars(text.lines().next().unwrap_or_default().trim(), LABEL_CHARS)
}

/// Refusal kinds are values: keep the import used for docs.
#[allow(dead_code)]
fn _refusal(_: Refusal) {}

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
    Closed(String),
}

/// Classify and act on one taken row (SPEC §6.1): close it, or plan its resume or restart.
async fn take_row(deps: &RunDeps, r: storage::ledger::Reclaimed) -> Result<(String, Fate), String> {
    let id = r.row.run_id.clone();
    let s = &deps.storage;
    // A killed run is never resumed or closed: it is purged.
    if s.is_killed(id.clone()).await.map_err(|e| e.to_string())? {
        purge_killed(deps.clone(), id.clone()).await;
        return Ok((id, Fate::Closed("killed: purged".into())));
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
            close_row(deps, &r.row, events, status, "closed from finishing; delivery unknown").await?;
            Fate::Closed(status.as_str().into())
        }
        decisions::Classification::CloseHardStopped => {
            close_row(deps, &r.row, events, RunStatus::StoppedHard, "a hard stop was recorded").await?;
            Fate::Closed("stopped_hard".into())
        }
        decisions::Classification::CloseInterrupted { reason } => {
            close_row(deps, &r.row, events, RunStatus::Interrupted, &reason).await?;
            Fate::Closed(format!("interrupted: {reason}"))
        }
        decisions::Classification::Restart => {
            Fate::Launch(Launch::Restart { row: r.row, events, from_gen: r.prior_owner })
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
                    close_row(deps, &r.row, events, RunStatus::Interrupted, &reason).await?;
                    Fate::Closed(format!("interrupted: {reason}"))
                }
            }
        }
    };
    Ok((id, fate))
}

/// Close a reclaimed row with a record built from the row and its live events, through the finish
/// transaction (`eventCount` = last seq, `finishedAt` = the reclaim clock).
async fn close_row(
    deps: &RunDeps,
    row: &storage::ledger::LiveRow,
    mut events: Vec<Value>,
    status: RunStatus,
    reason: &str,
) -> Result<(), String> {
    let meta = run::meta_from_row(row);
    let now = deps.clock.now_ms();
    let last = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    events.push(json!({"type": "note", "seq": last + 1, "at": now, "kind": "reclaimed", "summary": reason}));
    let record = run::assemble_record(&row.run_id, &meta, row.started_at, now, status, events, last + 1, false, Default::default())
        .ok_or("the reclaimed row does not make a valid record")?;
    match deps.storage.finish(deps.gen.as_str().to_owned(), record, None).await {
        Ok(Ok(_)) => {
            tracing::info!(run_id = %row.run_id, generation = deps.gen.as_str(), status = status.as_str(), reason, "closed a reclaimed run");
            Ok(())
        }
        Ok(Err(refusal)) => Err(refusal.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

impl Supervisor {
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
                // One row's failure is logged and never stops the others; the row stays ours until
                // the next boot (a generation never retakes its own rows).
                match take_row(&deps, r).await {
                    Ok((id, Fate::Closed(how))) => report.closed.push((id, how)),
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
            Ok::<_, String>((report, launches))
        };
        Box::pin(fut.into_actor(self).map(move |result, act, ctx| {
            act.sweeping = false;
            let (report, launches) = result?;
            for l in launches {
                act.launch_or_defer(l, msg.defer_launch, ctx);
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
        let deps = self.deps().clone();
        let me = ctx.address();
        let local: Vec<String> = self.runs.keys().cloned().collect();
        let fut = async move {
            let gen = deps.gen.as_str().to_owned();
            // Resumable = promoted (live), owned here, not detached; never an attaching run.
            let resumable: Vec<String> = match deps.storage.list_live().await {
                Ok(rows) => rows
                    .into_iter()
                    .filter(|r| r.owner_gen == gen && r.phase == storage::ledger::Phase::Live)
                    .filter(|r| !r.state.get("detached").and_then(Value::as_bool).unwrap_or(false))
                    .filter(|r| local.contains(&r.run_id))
                    .map(|r| r.run_id)
                    .collect(),
                Err(e) => {
                    tracing::warn!(generation = %gen, error = %e, "drain: could not list live rows; nothing handed off");
                    Vec::new()
                }
            };
            let handed: Vec<String> = match deps.storage.handoff(gen.clone(), resumable).await {
                Ok(results) => results.into_iter().filter(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff).map(|(id, _)| id).collect(),
                Err(e) => {
                    tracing::warn!(generation = %gen, error = %e, "drain: handoff failed");
                    Vec::new()
                }
            };
            (handed, deps, me)
        };
        let deadline = msg.deadline;
        let budget = msg.handoff_budget;
        Box::pin(fut.into_actor(self).then(move |(handed, deps, me), act, _ctx| {
            for id in &handed {
                act.handed.insert(id.clone());
                if let Some(run) = act.runs.get(id) {
                    run.do_send(run::Abort { why: "handed off to the next generation" });
                }
                deps.registry.discard(id);
            }
            if !handed.is_empty() {
                tracing::info!(generation = deps.gen.as_str(), runs = ?handed, "drain: handed off resumable runs to the next generation");
            }
            let wait = async move {
                let started = tokio::time::Instant::now();
                let mut waited_for = 0;
                loop {
                    let active = me.send(ActiveRuns).await.unwrap_or_default();
                    waited_for = waited_for.max(active.len());
                    if active.is_empty() || started.elapsed() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
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
    let Ok(fence) = deps.operations.close_admission(&app) else { return };
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
                (Some(run), _) => run.do_send(run::Abort { why: "killed" }),
                // Another live owner: its heartbeat sees the fence, aborts, and purges.
                (None, Some(owner)) if owner != deps.gen.as_str() && answer.owner_lease_live => {}
                // Finished, or its owner is gone: purge now.
                _ => purge_killed(deps, id).await,
            }
            Ok(())
        })
    }
}
