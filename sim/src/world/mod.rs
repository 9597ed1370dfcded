//! The simulated world: one shared [`MemoryStore`] (ledger and history), one to three process slots each
//! running the **production** [`Supervisor`] (and through it the production run actors, heartbeat,
//! flusher and history writer) of its current incarnation, the clients, and the seeded scheduler.
//!
//! Everything runs on one thread in virtual time ([`crate::exec`]). The world is a task of the same
//! runtime: each turn it waits until every other task waits ([`crate::exec::settle`]), then picks by its
//! RNG one thing to happen — a storage job of some incarnation runs (its transaction commits and its
//! caller hears the answer), a model or tool call completes, a client sends a message, a fault lands —
//! or, when nothing is pending, lets virtual time pass (timers fire: heartbeats, sweeps, budgets).
//!
//! A crash marks the incarnation dead: none of its pending or later I/O ever succeeds (each of its
//! pending storage jobs first either commits or not, and each tool call in flight lands its effect or
//! not, by the seed: a commit or an effect whose answer was lost; its storage calls then fail at once,
//! its model and tool calls never answer), so nothing it does reaches the world again — a process that
//! is gone. A pause holds an incarnation's I/O; an outage
//! fails its storage calls as unavailable; a drain is the production SIGTERM path (`Drain`), then exit.
//!
//! Determinism: one thread, a paused clock, one seeded RNG for the world and the same seed for the
//! production code's own draws ([`storage::entropy`]), ordered maps wherever a choice is made.

mod outside;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use storage::RunId;

use actix::Addr;
use actors::history::HistoryWriter;
use actors::registry::Registry;
use actors::run::{AgentEntry, Request, StopActor};
use actors::supervisor::{
    AdmitError, AdmitMessage, Admitted, DecideApproval, Drain, KillRun, OpenIngress, StopRun,
    Supervisor, SupervisorConfig,
};
use actors::token::TokenMinter;
use actors::tools::Toolbox;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use storage::actor::{Backend, Job};
use storage::ledger::{Decision, GenerationInfo, ReceiptKey, StopMode, Strategy};
use storage::record::RunStatus;
use storage::{BackendSpec, Clock, Error, MemoryStore, StorageHandle};

use crate::config::{Fault, SimConfig};
use crate::exec::{settle, VirtualClock, T0};
use crate::io::{Effect, Go, Inc, Io, OpKind, SimAgent, SimChannel, SimTool};
use crate::model::{Model, Told};

pub const LEASE_MS: i64 = 3_000;
pub const HEARTBEAT_MS: u64 = 1_000;
pub const BUDGET_MS: i64 = 120_000;
/// Faults land only in this first window of simulated time; then the world quiesces.
pub const FAULT_WINDOW_MS: i64 = 25_000;
/// A seed that has not quiesced by then is stuck.
pub const GIVE_UP_MS: i64 = 400_000;
/// How long a client waits for an admission's answer before it counts the send as unanswered.
const CLIENT_WAIT: Duration = Duration::from_secs(5);

/// An invariant that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
    pub step: usize,
    pub at_ms: i64,
}

/// One incarnation of a process slot.
struct Proc {
    slot: usize,
    inc: Inc,
    /// Set once the production boot (generation, reclaim, ingress) is through.
    supervisor: Rc<RefCell<Option<Addr<Supervisor>>>>,
    jobs_rx: mpsc::Receiver<Job>,
    /// Jobs sent and not yet run, in arrival order.
    jobs: Vec<Job>,
    /// What the incarnation knows of inbox writes: its storage actor's check after each of its jobs.
    inbox: Arc<storage::actor::InboxWatch>,
    alive: bool,
    draining: Arc<AtomicBool>,
    /// Set by the drain's task when the production drain answered: the process exits.
    exited: Rc<RefCell<bool>>,
    paused_until: i64,
    outage_until: i64,
    lose_next_reply: bool,
    fail_next_write: bool,
    /// Model calls of this incarnation still to panic ([`Fault::Panic`]).
    panic_models: u32,
}

impl Proc {
    fn addr(&self) -> Option<Addr<Supervisor>> {
        self.supervisor.borrow().clone()
    }
}

/// When a client first sends its message.
struct Client {
    msg: usize,
    send_at: i64,
}

pub struct World {
    pub cfg: SimConfig,
    rng: StdRng,
    backend: Box<dyn Backend>,
    clock: Arc<VirtualClock>,
    io: Arc<Io>,
    procs: Vec<Proc>,
    /// Per slot: the index of its current incarnation in `procs`, and when a down slot restarts.
    slots: Vec<(Option<usize>, Option<i64>)>,
    clients: Vec<Client>,
    /// Model and tool calls of dead incarnations: kept, never answered.
    graveyard: Vec<crate::io::Op>,
    pub model: Rc<RefCell<Model>>,
    pub violations: Vec<Violation>,
    pub tolerated: Vec<Violation>,
    pub trace: Vec<String>,
    pub step: usize,
    pub faults_landed: BTreeMap<&'static str, u32>,
    faults_left: u32,
    workspaces: tempfile::TempDir,
    /// The ledger's live rows at this turn (see `collect`).
    live: Vec<storage::ledger::LiveRow>,
    /// Mutating effects so far, by (run, call).
    applied: HashMap<(RunId, String), u32>,
    /// Whether mutating calls wait for approval, with the wait's timeout (ms).
    approvals: Option<i64>,
    /// Whether the messages come from a chat channel: their runs keep a status card and answer there.
    chat: bool,
}

impl World {
    pub fn new(seed: u64, cfg: &SimConfig) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let store = MemoryStore::new();
        let backend = BackendSpec::Memory(store.clone())
            .open()
            .expect("a memory backend opens");
        let slots = rng.random_range(1..=3usize);
        // A third of the seeds make every mutating call wait for a person's approval (SPEC §13).
        let approvals = rng
            .random_bool(0.33)
            .then(|| rng.random_range(2_000..30_000));
        // Half of them come from a chat channel (SPEC §12).
        let chat = rng.random_bool(0.5);
        let threads = rng.random_range(1..=3usize);
        let messages = rng.random_range(2..=8usize);
        let mut model = Model::default();
        let mut clients = Vec::new();
        for k in 1..=messages {
            let letters: String = (0..rng.random_range(1..=3))
                .map(|_| match rng.random_range(0..20) {
                    0 => 'f',
                    1..=8 => 'm',
                    9..=14 => 'p',
                    _ => 'i',
                })
                .collect();
            let thread = format!("t{}", rng.random_range(0..threads));
            let keyed = rng.random_bool(0.5);
            let strategy = match rng.random_range(0..10) {
                0 => Strategy::Enqueue,
                1 => Strategy::Interrupt,
                2 => Strategy::Reject,
                _ => Strategy::Steer,
            };
            model.add_message(thread, format!("m{k}:{letters}"), keyed, strategy);
            clients.push(Client {
                msg: k - 1,
                send_at: rng.random_range(0..FAULT_WINDOW_MS),
            });
        }
        World {
            cfg: cfg.clone(),
            rng,
            backend,
            clock: VirtualClock::start(),
            io: Arc::default(),
            procs: Vec::new(),
            slots: vec![(None, Some(0)); slots],
            clients,
            graveyard: Default::default(),
            model: Rc::new(RefCell::new(model)),
            violations: Vec::new(),
            tolerated: Vec::new(),
            trace: Vec::new(),
            step: 0,
            faults_landed: BTreeMap::new(),
            faults_left: cfg.max_faults,
            workspaces: workspace_root(),
            live: Vec::new(),
            applied: HashMap::new(),
            approvals,
            chat,
        }
    }

    /// How many incarnations booted.
    pub fn incarnations(&self) -> usize {
        self.procs.len()
    }

    /// How many tool effects landed.
    pub fn effects(&self) -> usize {
        self.io.effects().len()
    }

    /// Milliseconds since the world began.
    pub fn now(&self) -> i64 {
        self.clock.now_ms() - T0
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.cfg.trace {
            let (step, now) = (self.step, self.now());
            self.trace.push(format!("[{step:>5} +{now:>6}] {}", line()));
        }
    }

    pub fn violate(&mut self, invariant: &'static str, detail: String) {
        let v = Violation {
            invariant,
            detail,
            step: self.step,
            at_ms: self.now(),
        };
        self.note(|| format!("VIOLATION [{}] {}", v.invariant, v.detail));
        if self.cfg.tolerate.contains(invariant) {
            self.tolerated.push(v);
        } else {
            self.violations.push(v);
        }
    }

    /// Run the world until it quiesces (or gives up), then check what must hold at the end.
    pub async fn run(&mut self) {
        loop {
            settle().await;
            self.step += 1;
            self.collect();
            self.restart_due();
            if self.quiesced() {
                break;
            }
            if self.now() > GIVE_UP_MS || self.step > self.cfg.max_steps {
                let live: Vec<String> = self
                    .live
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {:?} owner {} lease {}",
                            r.run_id,
                            r.phase,
                            r.owner_gen,
                            r.lease_until - T0
                        )
                    })
                    .collect();
                let procs: Vec<String> = self
                    .procs
                    .iter()
                    .map(|p| {
                        format!(
                            "{}:{}{}",
                            p.inc,
                            if p.alive { "up" } else { "down" },
                            if p.draining.load(Ordering::SeqCst) {
                                "/draining"
                            } else {
                                ""
                            }
                        )
                    })
                    .collect();
                let pending = self.io.pending().len();
                self.violate(
                    "no live row remains",
                    format!("after {} ms: live {live:?}; incarnations {procs:?}; {pending} calls pending", self.now()),
                );
                break;
            }
            self.turn().await;
        }
        let model = self.model.clone();
        let lenient = self.faults_landed.contains_key(Fault::Permanent.as_str())
            || self.faults_landed.contains_key(Fault::Outage.as_str());
        let violations = model
            .borrow()
            .check_end(&mut *self.backend, self.clock.now_ms(), lenient);
        for (invariant, detail) in violations {
            self.violate(invariant, detail);
        }
        // A process that loses a run's lease (paused, or its storage out) may still be opening the run's
        // card when another process takes the run and opens it too, or its post may land late: a second
        // card is then possible, and tolerated (the card's post is not fenced). A detached run answers
        // best-effort while its row may still be resumed (SPEC §5.5: one attempt to mark it), so a
        // permanent storage fault may answer twice.
        let paused = [Fault::Pause, Fault::ExpireLeases, Fault::Outage]
            .iter()
            .any(|f| self.faults_landed.contains_key(f.as_str()));
        let detached = self.faults_landed.contains_key(Fault::Permanent.as_str());
        for (run, (cards, replies)) in self.io.chat() {
            if cards > 1 && !paused {
                self.violate("one card per run", format!("{run} posted {cards} cards"));
            }
            if replies > 1 && !detached {
                self.violate(
                    "one answer per run",
                    format!("{run} answered {replies} times in its thread"),
                );
            }
        }
    }

    /// Check the effects landed since the last turn, and pull every incarnation's newly sent storage
    /// jobs (a dead one's fail at once).
    fn collect(&mut self) {
        for effect in self.io.take_landed() {
            self.check_effect(effect);
        }
        for p in &mut self.procs {
            while let Ok(job) = p.jobs_rx.try_recv() {
                if p.alive {
                    p.jobs.push(job);
                } else {
                    job.fail(gone());
                }
            }
        }
        for i in 0..self.procs.len() {
            if self.procs[i].alive && *self.procs[i].exited.borrow() {
                let slot = self.procs[i].slot;
                self.note(|| format!("slot {slot}: exits (drained, or its boot failed)"));
                self.bury(i, false);
            }
        }
        let dead: BTreeSet<Inc> = self
            .procs
            .iter()
            .filter(|p| !p.alive)
            .map(|p| p.inc)
            .collect();
        for (id, inc, _) in self.io.pending() {
            if dead.contains(&inc) {
                if let Some(op) = self.io.take(id) {
                    self.graveyard.push(op);
                }
            }
        }
        // Every run the ledger holds, as the world sees it between two transactions (nothing commits
        // again before the next turn's collect: this turn's checks and choices read this snapshot).
        self.live = self.backend.list_live().unwrap_or_default();
        let mut model = self.model.borrow_mut();
        for row in &self.live {
            model
                .runs
                .insert(row.run_id.clone(), row.thread_key.clone());
            if row.gated() {
                let gate = (
                    row.final_status().unwrap_or(RunStatus::Completed),
                    row.saved_answer().map(str::to_owned),
                );
                model.gates.entry(row.run_id.clone()).or_insert(gate);
            }
        }
    }

    /// The incarnation at `i` is gone: its jobs either committed (answer lost) or not, and (at a crash)
    /// each tool or chat call it had in flight either landed as the process died or never did, by the
    /// seed.
    fn bury(&mut self, i: usize, commit_some: bool) {
        let (slot, inc) = (self.procs[i].slot, self.procs[i].inc);
        for (id, of, kind) in self.io.pending() {
            if of == inc
                && commit_some
                && matches!(kind, OpKind::Tool { .. } | OpKind::Chat(_))
                && self.rng.random_bool(0.5)
            {
                if let Some(op) = self.io.take(id) {
                    let _ = op.done.send(Go::On);
                }
            }
        }
        self.procs[i].alive = false;
        for mut job in std::mem::take(&mut self.procs[i].jobs) {
            if commit_some && self.rng.random_bool(0.5) {
                job.run(self.backend.as_mut());
            }
            job.fail(gone());
        }
        self.slots[slot] = (None, Some(self.now() + self.rng.random_range(100..3_000)));
    }

    fn restart_due(&mut self) {
        let now = self.now();
        for slot in 0..self.slots.len() {
            if let (None, Some(at)) = self.slots[slot] {
                if at <= now {
                    self.boot(slot);
                }
            }
        }
    }

    /// Start a new incarnation in `slot`: the production supervisor over a detached storage mailbox.
    fn boot(&mut self, slot: usize) {
        let inc = self.procs.len() as Inc;
        let (mailbox, jobs_rx) = storage::actor::detached(4096);
        let inbox = mailbox.inbox.clone();
        let clock: Arc<dyn Clock> = self.clock.clone();
        let handle = StorageHandle::on_mailbox(mailbox, clock.clone(), "memory");
        let mut agent = AgentEntry::new(
            Arc::new(SimAgent {
                inc,
                io: self.io.clone(),
            }),
            BUDGET_MS,
            "s",
        );
        if let Some(timeout) = self.approvals {
            agent.approve = vec!["mut".into()];
            agent.approval_timeout_ms = timeout;
        }
        let agents = HashMap::from([("sim".to_owned(), agent)]);
        let tools = SimTool::all(inc, &self.io)
            .into_iter()
            .fold(Toolbox::empty(), Toolbox::with_shared);
        let draining = Arc::new(AtomicBool::new(false));
        let history = HistoryWriter::new(Arc::new(handle.clone()), None)
            .with_backoff([Duration::from_millis(200), Duration::from_secs(2)], 0.0);
        let supervisor = Supervisor::new(SupervisorConfig {
            storage: handle.clone(),
            registry: Registry::new(clock.clone()),
            history,
            agents,
            default_agent: "sim".into(),
            tools,
            workspace_root: self.workspaces.path().to_owned(),
            lease_ms: LEASE_MS,
            heartbeat_ms: HEARTBEAT_MS,
            webhook: None,
            clock: clock.clone(),
            tokens: TokenMinter::new("00".repeat(32).as_str()),
            draining: draining.clone(),
            metrics: Arc::default(),
            operations: actors::operations::OperationCoordinator::new(clock),
            restart_policy: Default::default(),
            host_id: format!("sim-{slot}"),
            cards: actors::channel::Cards::new(
                Arc::new(SimChannel {
                    inc,
                    io: self.io.clone(),
                }),
                handle.clone(),
                "http://sim.invalid",
            ),
            http: http_client(),
        });
        let gen = supervisor.generation().as_str().to_owned();
        let info = GenerationInfo {
            gen: gen.clone(),
            host: "sim".into(),
            host_id: format!("sim-{slot}"),
            pid: 0,
            proc_start: String::new(),
            started_at: self.clock.now_ms(),
        };
        let (booted, exited) = (Rc::new(RefCell::new(None)), Rc::new(RefCell::new(false)));
        let (set, failed) = (booted.clone(), exited.clone());
        tokio::task::spawn_local(async move {
            match actors::supervisor::boot(supervisor, info).await {
                Ok((addr, _)) => {
                    addr.do_send(OpenIngress);
                    *set.borrow_mut() = Some(addr);
                }
                Err(_) => *failed.borrow_mut() = true,
            }
        });
        self.note(|| format!("slot {slot}: incarnation {inc} boots as {gen}"));
        self.procs.push(Proc {
            slot,
            inc,
            supervisor: booted,
            jobs_rx,
            jobs: Vec::new(),
            inbox,
            alive: true,
            draining,
            exited,
            paused_until: 0,
            outage_until: 0,
            lose_next_reply: false,
            panic_models: 0,
            fail_next_write: false,
        });
        self.slots[slot] = (Some(inc as usize), None);
    }

    /// The world has nothing more to do: every message told, no live row, faults over.
    fn quiesced(&mut self) -> bool {
        self.now() >= FAULT_WINDOW_MS
            && self
                .model
                .borrow()
                .messages
                .iter()
                .all(|m| m.told != Told::Pending && !m.in_flight)
            && self.slots.iter().all(|s| s.0.is_some())
            && self.live.is_empty()
    }

    /// One scheduler step.
    async fn turn(&mut self) {
        let now = self.now();
        let mut choices: Vec<Choice> = Vec::new();
        for (i, p) in self.procs.iter().enumerate() {
            if p.alive && p.paused_until <= now {
                choices.extend((0..p.jobs.len()).map(|j| Choice::Job(i, j)));
            }
        }
        let running: BTreeMap<Inc, usize> = self
            .procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.alive && p.paused_until <= now)
            .map(|(i, p)| (p.inc, i))
            .collect();
        for (id, inc, _) in self.io.pending() {
            if running.contains_key(&inc) {
                choices.push(Choice::Op(id));
            }
        }
        if self.approvals.is_some() {
            for row in &self.live {
                for (call, approval) in row.approvals() {
                    if approval.decided.is_none() {
                        choices.push(Choice::Decide(row.run_id.clone(), call));
                    }
                }
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            let m = &self.model.borrow().messages[client.msg];
            if !m.in_flight && client.send_at <= now && m.told == Told::Pending {
                choices.push(Choice::Send(c));
            }
        }
        let fault_open =
            now < FAULT_WINDOW_MS && self.faults_left > 0 && !self.cfg.faults.is_empty();
        if choices.is_empty() || (fault_open && self.rng.random_bool(0.03)) {
            if fault_open && self.rng.random_bool(0.3) {
                self.fault();
            } else {
                let ms = self.rng.random_range(1..=400);
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            return;
        }
        let pick = choices.swap_remove(self.rng.random_range(0..choices.len()));
        match pick {
            Choice::Job(i, j) => self.run_job(i, j),
            Choice::Op(id) => self.complete_op(id),
            Choice::Send(c) => self.send(c),
            Choice::Decide(run_id, call_id) => self.decide(run_id, call_id),
        }
    }

    fn run_job(&mut self, i: usize, j: usize) {
        let now = self.now();
        let p = &mut self.procs[i];
        let mut job = p.jobs.remove(j);
        if p.outage_until > now {
            job.fail(Error::Unavailable("simulated outage".into()));
        } else if p.fail_next_write {
            p.fail_next_write = false;
            job.fail(Error::Corrupt {
                what: "simulated fault",
                why: "a permanent storage failure".into(),
            });
        } else {
            job.run(self.backend.as_mut());
            p.inbox.saw(self.backend.inbox_version());
            let lost = std::mem::take(&mut p.lose_next_reply)
                .then(|| Error::Unavailable("simulated lost reply".into()));
            job.reply(lost.as_ref());
        }
    }

    fn complete_op(&mut self, id: u64) {
        let Some(op) = self.io.take(id) else { return };
        if let OpKind::Chat(what) = &op.kind {
            let (inc, what) = (op.inc, what.clone());
            self.note(|| format!("chat: {what} (incarnation {inc})"));
        }
        let go = match &op.kind {
            OpKind::Model => match self.procs.iter_mut().find(|p| p.inc == op.inc) {
                Some(p) if p.panic_models > 0 => {
                    p.panic_models -= 1;
                    let inc = op.inc;
                    self.note(|| format!("a model call of incarnation {inc} panics"));
                    Go::Panic
                }
                _ if self.rng.random_bool(0.05) => Go::Fail,
                _ => Go::On,
            },
            OpKind::Tool { .. } | OpKind::Chat(_) => Go::On,
        };
        let _ = op.done.send(go);
    }

    /// A tool's effect landed (since the last turn): check what must hold at that moment.
    fn check_effect(&mut self, effect: Effect) {
        self.note(|| {
            format!(
                "effect {}/{} {} by {}",
                effect.run_id, effect.call_id, effect.tool, effect.gen
            )
        });
        let recorded = self
            .backend
            .last_step(&effect.run_id)
            .ok()
            .flatten()
            .map(|s| s.in_flight.iter().any(|c| c.call_id == effect.call_id));
        // A detached run runs side-effect free calls best-effort, unrecorded (SPEC §5.5); nothing else
        // runs before its step record names it.
        if recorded == Some(false) && effect.tool != "pure" {
            self.violate(
                "tools after their step record",
                format!(
                    "{}/{} runs but its step record does not name it",
                    effect.run_id, effect.call_id
                ),
            );
        }
        if self.approvals.is_some() && effect.tool == "mut" {
            let approved = self
                .backend
                .get_live(&effect.run_id)
                .ok()
                .flatten()
                .and_then(|row| row.approvals().remove(&effect.call_id))
                .and_then(|a| a.decided)
                .is_some_and(|d| d.decision == Decision::Approve);
            if !approved {
                self.violate(
                    "no call runs unapproved",
                    format!(
                        "{}/{} runs without an approve decision on its row",
                        effect.run_id, effect.call_id
                    ),
                );
            }
        }
        if effect.tool == "mut" {
            let n = self
                .applied
                .entry((effect.run_id.clone(), effect.call_id.clone()))
                .or_default();
            *n += 1;
            if *n > 1 {
                let detail = format!("{}/{} landed {n} times", effect.run_id, effect.call_id);
                self.violate("mutating effect at most once", detail);
            }
        }
        if effect.tool != "pure" {
            let fence = actors::tools::read_fence(&effect.workspace).unwrap_or_default();
            if fence != effect.gen {
                let detail = format!(
                    "{}/{} landed by {} while the workspace fence names {fence:?}",
                    effect.run_id, effect.call_id, effect.gen
                );
                self.violate("effect after workspace takeover", detail);
            }
        }
    }
}

/// This thread's HTTP client (never used: the simulation has no webhook), built once — building one
/// loads the trusted roots from disk, which would cost more than a whole seed.
fn http_client() -> reqwest::Client {
    thread_local! {
        static CLIENT: reqwest::Client = reqwest::Client::new();
    }
    CLIENT.with(Clone::clone)
}

/// Where a seed's workspaces live: in memory when the machine has a tmpfs (`/dev/shm`), where the fence's
/// fsyncs cost nothing — the workspace code is the production one either way, and its durability is not
/// what the simulator checks.
fn workspace_root() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm),
        false => tempfile::tempdir(),
    }
    .or_else(|_| tempfile::tempdir())
    .expect("a temp dir for workspaces")
}

/// What a dead incarnation's storage calls answer. Its actors live on in the runtime, but nothing they do
/// reaches storage again, and failing at once (instead of never answering) lets them drop what the
/// operating system would release at a real process's death: a workspace lock held across a read.
fn gone() -> Error {
    Error::Unavailable("the process is gone".into())
}

#[derive(Debug, Clone)]
enum Choice {
    Job(usize, usize),
    Op(u64),
    Send(usize),
    Decide(RunId, String),
}
