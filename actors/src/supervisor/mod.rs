//! `Supervisor`: one per process; mints and owns the generation (the fencing token of every row this
//! process writes), owns every run actor and the `ThreadSlot`s that serialize admission per thread, and is
//! the one fan-out point for fence, stop and kill news (the heartbeat reports to it; it tells run actors).
//!
//! - [`admission`]: `ThreadSlot` and the ledger's atomic `admit` (SPEC §5.1);
//! - [`recovery`]: boot reclaim, the periodic sweep, classification, re-adoption of this generation's
//!   rows that no actor drives (SPEC §6.1);
//! - [`drain`]: SIGTERM as a handoff at step boundaries (SPEC §6.4);
//! - [`kill`]: stop and kill (SPEC §5.6).
//!
//! Restart policy (SPEC §1.1, [`RestartPolicy`]): a run actor that ended `Panicked` or `StorageLost` is
//! re-adopted from the ledger exactly as a resume plans it (in-flight mutating calls get the synthetic
//! result, never a re-run), at most `max_restarts` times within `window_ms`; past that it closes
//! `failed`. Every other ending is deliberate and final.
//!
//! Invariant: a generation never reclaims its own rows; re-adoption reads this generation's own row
//! (`readopt`), only for a run no actor of this process drives.

mod admission;
mod approvals;
mod drain;
mod kill;
mod recovery;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, WrapFuture};
use serde_json::Value;
use storage::ledger::LiveRow;
use storage::record::RunStatus;
use storage::{Clock, Generation, StorageHandle};

use crate::flusher::Flusher;
use crate::heartbeat::Heartbeat;
use crate::history::HistoryWriter;
use crate::registry::Registry;
use crate::run::{AgentEntry, Launch, RunActor, RunDeps, RunEnded, StopReason};
use crate::token::TokenMinter;
use crate::tools::Toolbox;

pub use admission::{AdmitError, AdmitMessage, Admitted, ThreadSlot};
pub use approvals::{DecideApproval, DecideError};
pub use drain::{Drain, DrainReport};
use kill::purge_killed;
pub use kill::{KillRun, StopError, StopRun};
pub use recovery::{boot, OpenIngress, ReclaimPass, ReclaimReport};

/// What the process hands the supervisor at boot.
pub struct SupervisorConfig {
    pub storage: StorageHandle,
    pub registry: Registry,
    pub history: HistoryWriter,
    pub agents: HashMap<String, AgentEntry>,
    pub default_agent: String,
    pub tools: Toolbox,
    /// Where run workspaces live (`[storage] workspace_root`): `<workspace_root>/<run_id>/`.
    pub workspace_root: PathBuf,
    pub lease_ms: i64,
    pub heartbeat_ms: u64,
    pub webhook: Option<crate::delivery::Webhook>,
    pub clock: Arc<dyn Clock>,
    pub tokens: TokenMinter,
    pub draining: Arc<AtomicBool>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub operations: crate::operations::OperationCoordinator,
    pub restart_policy: RestartPolicy,
    /// This process's host identity (`[server] host_id`): fast reclaim takes the rows of dead
    /// generations of this host identity only (SPEC §1.3).
    pub host_id: String,
    /// The chat channel's status cards (SPEC §12); `Cards::default()` without a channel.
    pub cards: crate::channel::Cards,
    /// The process's HTTP client (webhook replies), shared with its other callers: one connection pool
    /// and one load of the trusted roots per process.
    pub http: reqwest::Client,
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
        RestartPolicy {
            max_restarts: 1,
            window_ms: 600_000,
        }
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

/// Start a run actor (from a slot, or the supervisor itself).
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaunchRun(pub Launch);

pub struct Supervisor {
    deps: Option<RunDeps>,
    config: Arc<SlotShared>,
    runs: BTreeMap<RunId, Addr<RunActor>>,
    slots: BTreeMap<String, Addr<ThreadSlot>>,
    /// When each run was re-adopted after a panic or `StorageLost`, within the restart window.
    restarts: BTreeMap<RunId, Vec<i64>>,
    parts: Option<(SupervisorConfig, Arc<Toolbox>)>,
    /// Runs the boot reclaim adopted, launched once ingress is open.
    deferred: Vec<Launch>,
    /// A reclaim pass is running: passes never overlap.
    sweeping: bool,
    /// Runs handed to the next generation by a drain.
    handed: BTreeSet<RunId>,
    /// Rows of this generation known to have no actor (storage lost, a failed launch or close): re-adopted
    /// at the next sweep that storage answers, with the sweeps that failed so far.
    orphans: BTreeMap<RunId, u32>,
    /// Rows (ledger or registry) seen without an actor at the last sweep: one more sighting and they
    /// are orphans (two sightings, so an admission between its commit and its launch is never taken).
    unattended: BTreeSet<RunId>,
    /// Runs whose close past the restart policy is running (`close_failed`): like an actor, it still
    /// drives the run, so a reclaim never takes the run back meanwhile.
    closing: BTreeSet<RunId>,
    /// Runs past their restart policy whose close failed: each sweep storage answers closes them `failed`
    /// again (never re-adopted, never closed as an orphan).
    failing: BTreeSet<RunId>,
    /// Runs whose actor ended `StorageLost`: the only ending before a reply goes out (the finishing gate
    /// is where it can happen), so a re-adoption that finds such a row past its gate continues the reply
    /// from the saved answer instead of closing it delivery-unknown (SPEC §5.2 step 7).
    undelivered: BTreeSet<RunId>,
}

/// What slots share.
struct SlotShared {
    gen: Generation,
    storage: StorageHandle,
    registry: Registry,
    agents: Arc<HashMap<String, AgentEntry>>,
    /// The process's tools: a fresh run's promotion names its agent's.
    tools: Arc<Toolbox>,
    default_agent: String,
    lease_ms: i64,
    clock: Arc<dyn Clock>,
    tokens: TokenMinter,
    draining: Arc<AtomicBool>,
    metrics: Arc<crate::metrics::Metrics>,
    restart_policy: RestartPolicy,
    host_id: String,
    /// The retention policy the history proposes with every record (the tombstone's too).
    proposal: Option<storage::store::PolicyProposal>,
}

impl Supervisor {
    /// A supervisor for this process: it mints the process's generation (its fencing token) now.
    pub fn new(mut config: SupervisorConfig) -> Self {
        let gen = Generation::mint(config.clock.now_ms());
        let agents = Arc::new(std::mem::take(&mut config.agents));
        let tools = Arc::new(std::mem::replace(&mut config.tools, Toolbox::empty()));
        let shared = SlotShared {
            gen: gen.clone(),
            storage: config.storage.clone(),
            registry: config.registry.clone(),
            agents: agents.clone(),
            tools: tools.clone(),
            default_agent: config.default_agent.clone(),
            lease_ms: config.lease_ms,
            clock: config.clock.clone(),
            tokens: config.tokens.clone(),
            draining: config.draining.clone(),
            metrics: config.metrics.clone(),
            restart_policy: config.restart_policy,
            host_id: config.host_id.clone(),
            proposal: config.history.proposal(),
        };
        config.agents = HashMap::new();
        Supervisor {
            deps: None,
            config: Arc::new(shared),
            runs: BTreeMap::new(),
            slots: BTreeMap::new(),
            restarts: BTreeMap::new(),
            parts: Some((config, tools)),
            deferred: Vec::new(),
            sweeping: false,
            handed: Default::default(),
            orphans: BTreeMap::new(),
            unattended: Default::default(),
            closing: Default::default(),
            failing: Default::default(),
            undelivered: Default::default(),
        }
    }

    /// This process's generation: minted by [`Supervisor::new`], the fencing token of every row it owns.
    pub fn generation(&self) -> &Generation {
        &self.config.gen
    }

    fn deps(&self) -> &RunDeps {
        self.deps
            .as_ref()
            .expect("deps are built when the supervisor starts")
    }

    /// The runs this process still drives: an actor, a close past the restart policy, or a final record
    /// on its way through the ledger's finish. A reclaim never takes one back (SPEC §1.1: one driver).
    fn driven(&self) -> Vec<RunId> {
        let mut driven: std::collections::BTreeSet<RunId> = self
            .runs
            .keys()
            .chain(&self.closing)
            .chain(&self.failing)
            .cloned()
            .collect();
        driven.extend(self.deps().history.final_writes_pending());
        driven.into_iter().collect()
    }

    /// Whether this process drives `id` itself — an actor, or a close past the restart policy (running, or
    /// to be retried): nothing re-adopts it meanwhile.
    fn drives(&self, id: &RunId) -> bool {
        self.runs.contains_key(id) || self.closing.contains(id) || self.failing.contains(id)
    }

    /// Start an actor for `launch` — unless one already drives the run (a late launch of an admission
    /// meeting a reclaim's resume of the same run): one driver per run (SPEC §1.1). The one running
    /// either drives it, or ends (a late launch is refused `Fenced` once the run ran past its seed) and
    /// leaves the row an orphan the next sweeps re-adopt.
    fn launch(&mut self, launch: Launch, ctx: &mut Context<Self>) {
        let _ = ctx;
        if self.runs.contains_key(launch.run_id()) {
            tracing::warn!(
                run_id = launch.run_id(),
                generation = self.deps().gen.as_str(),
                "an actor already drives this run; not launching a second"
            );
            return;
        }
        let actor = RunActor::new(self.deps().clone(), launch);
        let id = actor_id(&actor);
        let addr = actor.start();
        self.runs.insert(RunId::from(id), addr);
    }

    /// Launch the successor a finish or close admitted here.
    fn launch_successor(
        &mut self,
        successor: Option<(LiveRow, Vec<Value>)>,
        ctx: &mut Context<Self>,
    ) {
        if let Some((row, events)) = successor {
            tracing::info!(run_id = %row.run_id, generation = self.deps().gen.as_str(), "starting the successor run for unread follow-ups");
            self.launch(
                Launch::Restart {
                    row,
                    events,
                    from_gen: None,
                },
                ctx,
            );
        }
    }

    /// Past the restart policy: close the run `failed` from its ledger row and live events, through the
    /// finish transaction (as a reclaim closes a row), so its record and its successor agree on which
    /// follow-ups it consumed. A close that fails is retried, `failed` again, at each sweep storage
    /// answers (the run is never re-adopted, nor closed as an orphan).
    fn close_failed(&mut self, run_id: &RunId, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        deps.registry.discard(run_id);
        self.orphans.remove(run_id);
        self.closing.insert(run_id.to_owned());
        let id = run_id.to_owned();
        let fut = async move {
            let why = "the run failed more often than the restart policy allows";
            recovery::close_own(&deps, &id, RunStatus::Failed, why).await
        };
        let id = run_id.to_owned();
        ctx.spawn(fut.into_actor(self).map(move |closed, act, ctx| {
            act.closing.remove(&id);
            match closed {
                Ok(closed) => {
                    act.failing.remove(&id);
                    if let recovery::Readoption::Closed(successor) = closed {
                        act.launch_successor(successor, ctx);
                    }
                }
                Err(e) => {
                    tracing::warn!(run_id = %id, error = %e, "could not close a run past its restart policy; retried at the next sweep");
                    act.failing.insert(id);
                }
            }
        }));
    }

    fn slot(&mut self, thread_key: &str, supervisor: Addr<Supervisor>) -> Addr<ThreadSlot> {
        if let Some(a) = self.slots.get(thread_key).filter(|a| a.connected()) {
            return a.clone();
        }
        let slot = ThreadSlot::new(self.config.clone(), supervisor).start();
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
        let flusher = Flusher::new(
            config.storage.clone(),
            self.config.metrics.event_batch_failures.clone(),
        )
        .start();
        let heartbeat = Heartbeat::new(
            config.storage.clone(),
            Duration::from_millis(config.heartbeat_ms),
            config.lease_ms,
            ctx.address().recipient(),
        )
        .with_news(config.storage.news())
        .start();
        let deps = RunDeps {
            gen: self.config.gen.clone(),
            storage: config.storage,
            registry: config.registry,
            flusher,
            heartbeat,
            history: config.history,
            agents: self.config.agents.clone(),
            tools,
            workspace_root: config.workspace_root,
            lease_ms: config.lease_ms,
            webhook: config.webhook,
            http: config.http,
            clock: config.clock,
            tokens: self.config.tokens.clone(),
            metrics: self.config.metrics.clone(),
            operations: config.operations,
            cards: config.cards,
            on_ended: ctx.address().recipient(),
        };
        // A card's note on its run (why it has none) is the run's own event. The publisher holds no
        // cards: the cards hold it (a cycle would keep every run dependency of the process alive), and a
        // note about a card is not shown on that card.
        let publisher = RunDeps {
            cards: Default::default(),
            ..deps.clone()
        };
        deps.cards.on_note(move |id, event| {
            crate::run::publish(&publisher, id, event, true);
        });
        self.deps = Some(deps);
        // Finished rows leave the registry after their TTL. Slots of threads with no run here are dropped
        // (a slot only orders this process's admissions; the ledger's `admit` is what is atomic, so a
        // slot recreated while an old one finishes its last message is harmless).
        ctx.run_interval(Duration::from_secs(5), |act, _| {
            let registry = &act.deps().registry;
            registry.evict_expired();
            let busy: std::collections::BTreeSet<String> = registry
                .rows()
                .into_iter()
                .filter(|r| r.finished_at.is_none())
                .map(|r| r.meta.thread_key)
                .collect();
            act.slots
                .retain(|thread, a| a.connected() && busy.contains(thread));
        });
    }
}

/// The heartbeat's news about a run: the supervisor is the one fan-out point that tells run actors
/// (SPEC §1.1). A fence for a run with no actor here ends its registry row.
impl Handler<crate::heartbeat::RunNews> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: crate::heartbeat::RunNews, _ctx: &mut Context<Self>) {
        match self.runs.get(&msg.run_id) {
            Some(run) => run.do_send(msg.news),
            None if msg.news == crate::heartbeat::HeartbeatNews::Fenced => {
                self.deps().registry.discard(&msg.run_id)
            }
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
                        self.undelivered.insert(msg.run_id.clone());
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
                            purge_killed(deps, id).await
                        } else {
                            None
                        }
                    }
                    .into_actor(self)
                    .map(|successor, act, ctx| act.launch_successor(successor, ctx)),
                );
            }
            _ => {
                self.restarts.remove(&msg.run_id);
            }
        }
    }
}
