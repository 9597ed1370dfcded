//! The simulated world: one shared [`MemoryStore`] (ledger and history), a manual clock, the processes
//! (each incarnation a generation), the clients, and the seeded scheduler that picks what happens next.
//!
//! Everything that can happen is a [`Task`]: a client's message, a process timer, a supervisor step, a
//! message to a run actor, or one await-point segment of an effect ([`Op`]). A task becomes eligible at
//! its `due` time when its process is running; each scheduler step either lands a fault (while the
//! fault window is open) or runs one eligible task chosen by the seeded RNG; when nothing is eligible the
//! clock jumps to the next due task. A crash drops every task of the incarnation (its pending effects
//! vanish) and keeps its ledger rows; a pause freezes them.
//!
//! Determinism: one thread, one RNG, ordered maps everywhere a choice is made, no wall clock.

use std::collections::{BTreeMap, BTreeSet};

use actors::run::{Launch, StopReason};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use storage::ledger::{LiveRow, RunLedger, StopMode};
use storage::record::RunRecord;
use storage::{Error, ManualClock, MemoryStore};

use crate::config::{Fault, SimConfig};
use crate::model::Model;
use crate::run::{Actor, ActorMsg, Op};
use crate::supervisor::{SweepState, Via};

/// The simulated clock starts here (an ordinary 2027 epoch-ms).
pub const T0: i64 = 1_800_000_000_000;
pub const LEASE_MS: i64 = 3_000;
pub const HEARTBEAT_MS: i64 = 1_000;
pub const FLUSH_MS: i64 = 500;
pub const BUDGET_MS: i64 = 120_000;
pub const HANDOFF_BUDGET_MS: i64 = 2_000;
pub const DRAIN_DEADLINE_MS: i64 = 20_000;
/// Faults land only in this first window of simulated time; then the world quiesces.
pub const FAULT_WINDOW_MS: i64 = 25_000;

/// Where a task runs: at a client, or inside one incarnation of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Client,
    Proc { slot: usize, inc: u64 },
}

pub struct Task {
    pub due: i64,
    pub at: At,
    pub kind: Kind,
}

/// What a task does.
pub enum Kind {
    // ---- clients and the operator ----
    /// A client posts message `msg` to some running process.
    Send {
        msg: usize,
        waited_since: Option<i64>,
    },
    /// Start a new incarnation in a slot whose process is down.
    Restart {
        slot: usize,
    },
    /// Continue a paused process (SIGCONT).
    Resume {
        slot: usize,
        inc: u64,
    },
    // ---- a process ----
    Boot,
    HeartbeatTick,
    Beat {
        run: String,
        gen: String,
    },
    FlushTick,
    SweepTick,
    Sweep(SweepState),
    Launch(Launch),
    RunEnded {
        run: String,
        reason: StopReason,
        successor: Option<(LiveRow, Vec<Value>)>,
    },
    Readopt {
        run: String,
    },
    CloseOrphan {
        run: String,
    },
    CloseFailed {
        run: String,
    },
    /// A fire-and-forget history write (SPEC §5.4).
    History {
        record: RunRecord,
        via: Via,
        spent: usize,
    },
    /// A detached run's one attempt to mark its row detached.
    SetDetached {
        run: String,
        gen: String,
    },
    StopRun {
        run: String,
        mode: StopMode,
    },
    KillRun {
        run: String,
    },
    DrainPoll,
    DrainWait,
    // ---- a run actor ----
    Msg {
        actor: u64,
        msg: ActorMsg,
    },
    Op {
        actor: u64,
        epoch: u64,
        op: Op,
    },
}

impl Kind {
    /// Periodic timers: they never end, so quiescence ignores them.
    fn is_timer(&self) -> bool {
        matches!(
            self,
            Kind::HeartbeatTick | Kind::FlushTick | Kind::SweepTick
        )
    }

    fn name(&self) -> String {
        match self {
            Kind::Send { msg, .. } => format!("send m{msg}"),
            Kind::Restart { slot } => format!("restart slot {slot}"),
            Kind::Resume { slot, .. } => format!("resume slot {slot}"),
            Kind::Boot => "boot".into(),
            Kind::HeartbeatTick => "heartbeat tick".into(),
            Kind::Beat { run, .. } => format!("beat {run}"),
            Kind::FlushTick => "flush tick".into(),
            Kind::SweepTick => "sweep tick".into(),
            Kind::Sweep(s) => format!("sweep {}", s.name()),
            Kind::Launch(_) => "launch".into(),
            Kind::RunEnded { run, reason, .. } => format!("run ended {run} {reason:?}"),
            Kind::Readopt { run } => format!("readopt {run}"),
            Kind::CloseOrphan { run } => format!("close orphan {run}"),
            Kind::CloseFailed { run } => format!("close failed {run}"),
            Kind::History { record, .. } => format!("history write {}", record.head.id),
            Kind::SetDetached { run, .. } => format!("set detached {run}"),
            Kind::StopRun { run, mode } => format!("stop {run} {mode}"),
            Kind::KillRun { run } => format!("kill {run}"),
            Kind::DrainPoll => "drain poll".into(),
            Kind::DrainWait => "drain wait".into(),
            Kind::Msg { actor, msg } => format!("actor {actor} <- {msg:?}"),
            Kind::Op { actor, op, .. } => format!("actor {actor} op {}", op.name()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Up,
    Paused,
    Down,
}

/// One process slot; `inc` and `gen` name its current incarnation.
pub struct Proc {
    pub inc: u64,
    pub gen: String,
    pub status: Status,
    pub draining: bool,
    pub drain_started: i64,
    pub ingress_open: bool,
    pub registry: crate::registry::SimRegistry,
    /// Run actors of this incarnation, by actor id (an actor that ended is removed).
    pub actors: BTreeMap<u64, Actor>,
    /// The supervisor's map: run id → the actor it launched last.
    pub runs: BTreeMap<String, u64>,
    /// The heartbeat's set: run id → stop modes already relayed.
    pub tracked: BTreeMap<String, Vec<StopMode>>,
    /// The flusher's pending batches: run id → (generation, events).
    pub flusher: BTreeMap<String, (String, Vec<Value>)>,
    pub orphans: BTreeMap<String, u32>,
    /// Runs whose actor ended `StorageLost` (`Supervisor::undelivered`).
    pub undelivered: BTreeSet<String>,
    pub unattended: BTreeSet<String>,
    pub handed: BTreeSet<String>,
    pub restarts: BTreeMap<String, Vec<i64>>,
    pub deferred: Vec<Launch>,
    pub sweeping: bool,
    /// The history writer's ids with an accepted final write (a later provisional one is dropped).
    pub finals: BTreeSet<String>,
    /// Storage faults of this process.
    pub outage_until: i64,
    pub permanent_next: bool,
    pub lose_next_reply: bool,
}

/// What kind of storage call, for fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    Read,
    Write,
    /// An owner write of a run (claim, step, finishing): the only kind a permanent fault hits.
    OwnerWrite,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
    pub step: usize,
    pub at_ms: i64,
}

pub struct World {
    pub cfg: SimConfig,
    pub seed: u64,
    pub rng: StdRng,
    pub clock: ManualClock,
    pub store: MemoryStore,
    pub procs: Vec<Proc>,
    pub tasks: Vec<Task>,
    pub model: Model,
    pub trace: Vec<String>,
    pub step: usize,
    pub violations: Vec<Violation>,
    /// Violations of tolerated invariants (known production issues).
    pub tolerated: Vec<Violation>,
    pub quiescing: bool,
    pub faults_left: u32,
    pub faults_landed: BTreeMap<&'static str, u32>,
    pub webhook: bool,
    next_inc: u64,
    next_actor: u64,
    next_run: u64,
    /// Generations whose process is provably gone (crashed or exited): fast reclaim takes their rows.
    pub dead_gens: Vec<String>,
}

impl World {
    pub fn new(seed: u64, cfg: &SimConfig) -> World {
        let clock = ManualClock::new(T0);
        let mut rng = StdRng::seed_from_u64(seed);
        let max_faults = if cfg.faults.is_empty() {
            0
        } else {
            rng.random_range(1..=cfg.max_faults.max(1))
        };
        World {
            cfg: cfg.clone(),
            seed,
            rng,
            clock,
            store: MemoryStore::new(),
            procs: Vec::new(),
            tasks: Vec::new(),
            model: Model::default(),
            trace: Vec::new(),
            step: 0,
            violations: Vec::new(),
            tolerated: Vec::new(),
            quiescing: false,
            faults_left: max_faults,
            faults_landed: BTreeMap::new(),
            webhook: false,
            next_inc: 0,
            next_actor: 0,
            next_run: 0,
            dead_gens: Vec::new(),
        }
    }

    pub fn now(&self) -> i64 {
        use storage::Clock;
        self.clock.now_ms()
    }

    /// Record a trace line (only when tracing: CI sweeps re-run a failing seed with it on).
    pub fn note(&mut self, line: impl FnOnce() -> String) {
        if self.cfg.trace {
            let line = format!("{:>6} +{:>6}ms  {}", self.step, self.now() - T0, line());
            self.trace.push(line);
        }
    }

    /// Record a violation. A tolerated invariant (a known production issue) is kept apart, and from then
    /// on so is everything else this seed finds: a known issue's consequences (a second reply, a second
    /// effect) are not new findings.
    pub fn violate(&mut self, invariant: &'static str, detail: String) {
        let tolerated = self.cfg.tolerate.contains(invariant) || !self.tolerated.is_empty();
        self.note(|| {
            format!(
                "{} {invariant}: {detail}",
                if tolerated { "TOLERATED" } else { "VIOLATION" }
            )
        });
        let v = Violation {
            invariant,
            detail,
            step: self.step,
            at_ms: self.now() - T0,
        };
        let list = if tolerated {
            &mut self.tolerated
        } else {
            &mut self.violations
        };
        if !list
            .iter()
            .any(|o| o.invariant == v.invariant && o.detail == v.detail)
        {
            list.push(v);
        }
    }

    pub fn spawn(&mut self, at: At, delay: i64, kind: Kind) {
        let due = self.now() + delay.max(0);
        self.tasks.push(Task { due, at, kind });
    }

    /// A task of process `slot`'s current incarnation.
    pub fn spawn_in(&mut self, slot: usize, delay: i64, kind: Kind) {
        let at = At::Proc {
            slot,
            inc: self.procs[slot].inc,
        };
        self.spawn(at, delay, kind);
    }

    /// A short random latency for a storage round trip.
    pub fn io_latency(&mut self) -> i64 {
        self.rng.random_range(0..=30)
    }

    /// A random latency for a model or tool call.
    pub fn work_latency(&mut self) -> i64 {
        self.rng.random_range(100..=1500)
    }

    pub fn mint_run(&mut self, prefix: &str) -> String {
        self.next_run += 1;
        format!("{prefix}{:04}", self.next_run)
    }

    pub fn mint_actor(&mut self) -> u64 {
        self.next_actor += 1;
        self.next_actor
    }

    /// One storage call of process `slot`, with its faults: an outage answers `Unavailable` without
    /// reaching storage; a permanent fault fails the next owner write; a lost reply commits and then
    /// answers `Unavailable`.
    pub fn io<T>(
        &mut self,
        slot: usize,
        kind: Io,
        f: impl FnOnce(&mut MemoryStore, i64) -> storage::Result<T>,
    ) -> storage::Result<T> {
        let now = self.now();
        let p = &mut self.procs[slot];
        if p.outage_until > now {
            return Err(Error::Unavailable("injected outage".into()));
        }
        if kind == Io::OwnerWrite && p.permanent_next {
            p.permanent_next = false;
            let gen = p.gen.clone();
            self.note(|| format!("{gen}: storage fails permanently"));
            return Err(Error::Corrupt {
                what: "sim",
                why: "injected permanent failure".into(),
            });
        }
        let lose = kind != Io::Read && std::mem::take(&mut p.lose_next_reply);
        let mut store = self.store.clone();
        let out = f(&mut store, now);
        if lose {
            let gen = self.procs[slot].gen.clone();
            self.note(|| format!("{gen}: the write committed, its reply is lost"));
            return Err(Error::Unavailable("reply lost after commit".into()));
        }
        out
    }

    /// The omniscient view (the world model's, never a process's): no faults.
    pub fn peek(&self) -> MemoryStore {
        self.store.clone()
    }

    // ---- the processes ----

    /// Start a new incarnation in `slot` (a fresh generation).
    pub fn boot(&mut self, slot: usize) {
        self.next_inc += 1;
        let inc = self.next_inc;
        let gen = format!("g{inc}");
        let registry = crate::registry::SimRegistry::default();
        let proc = Proc {
            inc,
            gen: gen.clone(),
            status: Status::Up,
            draining: false,
            drain_started: 0,
            ingress_open: false,
            registry,
            actors: BTreeMap::new(),
            runs: BTreeMap::new(),
            tracked: BTreeMap::new(),
            flusher: BTreeMap::new(),
            orphans: BTreeMap::new(),
            undelivered: BTreeSet::new(),
            unattended: BTreeSet::new(),
            handed: BTreeSet::new(),
            restarts: BTreeMap::new(),
            deferred: Vec::new(),
            sweeping: false,
            finals: BTreeSet::new(),
            outage_until: 0,
            permanent_next: false,
            lose_next_reply: false,
        };
        if slot < self.procs.len() {
            self.procs[slot] = proc;
        } else {
            self.procs.push(proc);
        }
        self.note(|| format!("slot {slot} boots as {gen}"));
        self.spawn_in(slot, 0, Kind::Boot);
    }

    /// The process in `slot` dies: its tasks vanish, its generation is provably gone.
    pub fn take_down(&mut self, slot: usize, why: &str) {
        let p = &mut self.procs[slot];
        if p.status == Status::Down {
            return;
        }
        p.status = Status::Down;
        p.actors.clear();
        let (inc, gen) = (p.inc, p.gen.clone());
        self.tasks.retain(|t| t.at != At::Proc { slot, inc });
        self.dead_gens.push(gen.clone());
        self.note(|| format!("{gen} (slot {slot}) goes down: {why}"));
    }

    fn runnable(&self, at: At) -> bool {
        match at {
            At::Client => true,
            At::Proc { slot, inc } => {
                let p = &self.procs[slot];
                p.inc == inc && p.status == Status::Up
            }
        }
    }

    // ---- the scheduler ----

    /// Run the seed to quiescence (or a violation, or the step cap).
    pub fn run(&mut self) {
        self.setup();
        loop {
            self.step += 1;
            if self.step > self.cfg.max_steps {
                let live = self.peek().list_live().map(|r| r.len()).unwrap_or(0);
                self.violate(
                    "liveness",
                    format!(
                        "no quiescence within {} steps ({live} live rows)",
                        self.cfg.max_steps
                    ),
                );
                break;
            }
            if !self.quiescing && self.fault_window_over() {
                self.begin_quiesce();
            }
            if !self.quiescing && self.faults_left > 0 && self.rng.random_ratio(1, 40) {
                self.land_fault();
            } else if let Some(i) = self.pick() {
                let task = self.tasks.swap_remove(i);
                self.execute(task);
            } else if !self.advance_clock() {
                if self.quiescing {
                    break;
                }
                self.begin_quiesce();
            }
            if !self.violations.is_empty() {
                return;
            }
            if self.quiescing && self.step.is_multiple_of(8) && self.quiet() {
                break;
            }
        }
        if self.violations.is_empty() {
            crate::model::final_checks(self);
        }
    }

    fn setup(&mut self) {
        let procs = match self.rng.random_range(0..20) {
            0..=2 => 1,
            3..=11 => 2,
            _ => 3,
        };
        let threads = self.rng.random_range(1..=3);
        let messages = self.rng.random_range(2..=5);
        self.webhook = self.rng.random_bool(0.5);
        for slot in 0..procs {
            self.boot(slot);
        }
        for k in 1..=messages {
            let thread = format!("t{}", self.rng.random_range(1..=threads));
            let n = self.rng.random_range(0..=3);
            let letters: String = (0..n)
                .map(|_| match self.rng.random_range(0..40) {
                    0 => 'f',
                    1..=16 => 'm',
                    17..=28 => 'p',
                    _ => 'i',
                })
                .collect();
            let keyed = self.rng.random_bool(0.3);
            self.model
                .add_message(k, &thread, format!("m{k}:{letters}"), keyed);
            let due = self.rng.random_range(50..=12_000);
            self.spawn(
                At::Client,
                due,
                Kind::Send {
                    msg: k,
                    waited_since: None,
                },
            );
        }
        let webhook = self.webhook;
        let seed = self.seed;
        self.note(|| format!("seed {seed}: {procs} processes, {threads} threads, {messages} messages, webhook {webhook}"));
    }

    fn fault_window_over(&self) -> bool {
        self.now() - T0 >= FAULT_WINDOW_MS || self.step >= self.cfg.max_steps / 2
    }

    /// Stop landing faults; heal every process so the world can settle.
    fn begin_quiesce(&mut self) {
        if self.quiescing {
            return;
        }
        self.quiescing = true;
        self.note(|| "quiescing: no more faults, every process healthy".into());
        for slot in 0..self.procs.len() {
            let p = &mut self.procs[slot];
            p.outage_until = 0;
            p.permanent_next = false;
            p.lose_next_reply = false;
            match p.status {
                Status::Paused => self.resume(slot),
                Status::Down => self.boot(slot),
                Status::Up => {}
            }
        }
    }

    fn resume(&mut self, slot: usize) {
        if self.procs[slot].status == Status::Paused {
            self.procs[slot].status = Status::Up;
            let gen = self.procs[slot].gen.clone();
            self.note(|| format!("{gen} continues (SIGCONT)"));
        }
    }

    /// An eligible task, chosen by the seed.
    fn pick(&mut self) -> Option<usize> {
        let now = self.now();
        let eligible: Vec<usize> = self
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.due <= now && self.runnable(t.at))
            .map(|(i, _)| i)
            .collect();
        if eligible.is_empty() {
            return None;
        }
        Some(eligible[self.rng.random_range(0..eligible.len())])
    }

    /// Nothing is eligible now: jump to the next due task that could run. `false` when none could.
    fn advance_clock(&mut self) -> bool {
        let next = self
            .tasks
            .iter()
            .filter(|t| self.runnable(t.at) || matches!(t.at, At::Client))
            .map(|t| t.due)
            .min();
        match next {
            Some(due) if due > self.now() => {
                self.clock.set(due);
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Quiescent: no live row, nothing pending but timers.
    fn quiet(&self) -> bool {
        !self.tasks.iter().any(|t| !t.kind.is_timer())
            && self.procs.iter().all(|p| p.status == Status::Up)
            && self
                .peek()
                .list_live()
                .map(|r| r.is_empty())
                .unwrap_or(false)
    }

    fn execute(&mut self, task: Task) {
        if self.cfg.trace && !task.kind.is_timer() {
            let who = match task.at {
                At::Client => "client".to_owned(),
                At::Proc { slot, .. } => self.procs[slot].gen.clone(),
            };
            let name = task.kind.name();
            self.note(|| format!("{who}: {name}"));
        }
        match task.at {
            At::Client => self.client(task.kind),
            At::Proc { slot, .. } => crate::supervisor::handle(self, slot, task.kind),
        }
    }

    fn client(&mut self, kind: Kind) {
        match kind {
            Kind::Send { msg, waited_since } => crate::supervisor::send(self, msg, waited_since),
            Kind::Restart { slot } if self.procs[slot].status == Status::Down => self.boot(slot),
            Kind::Resume { slot, inc } if self.procs[slot].inc == inc => self.resume(slot),
            _ => {}
        }
    }

    /// Land one fault the seed chooses (a no-op when it does not apply now).
    fn land_fault(&mut self) {
        // A permanent storage failure is rarer than the rest: a quarter of their weight.
        let weight = |f: &Fault| if *f == Fault::Permanent { 1 } else { 4 };
        let total: u32 = self.cfg.faults.iter().map(weight).sum();
        if total == 0 {
            return;
        }
        let mut pick = self.rng.random_range(0..total);
        let mut fault = Fault::Crash;
        for f in &self.cfg.faults {
            if pick < weight(f) {
                fault = *f;
                break;
            }
            pick -= weight(f);
        }
        let slot = self.rng.random_range(0..self.procs.len());
        let up = self.procs[slot].status == Status::Up;
        let landed = match fault {
            Fault::Crash if self.procs[slot].status != Status::Down => {
                self.take_down(slot, "crash (kill -9)");
                let delay = self.rng.random_range(200..=3 * LEASE_MS);
                self.spawn(At::Client, delay, Kind::Restart { slot });
                true
            }
            Fault::Pause if up => {
                self.procs[slot].status = Status::Paused;
                let (gen, inc) = (self.procs[slot].gen.clone(), self.procs[slot].inc);
                self.note(|| format!("{gen} pauses (SIGSTOP)"));
                let delay = self.rng.random_range(LEASE_MS / 2..=3 * LEASE_MS);
                self.spawn(At::Client, delay, Kind::Resume { slot, inc });
                true
            }
            Fault::Drain if up && !self.procs[slot].draining && self.procs[slot].ingress_open => {
                crate::supervisor::drain(self, slot);
                true
            }
            Fault::Outage if up => {
                let until = self.now() + self.rng.random_range(300..=2 * LEASE_MS);
                self.procs[slot].outage_until = until;
                let gen = self.procs[slot].gen.clone();
                self.note(|| format!("{gen}: storage outage until +{}ms", until - T0));
                true
            }
            Fault::Permanent if up => {
                self.procs[slot].permanent_next = true;
                true
            }
            Fault::LostReply if up => {
                self.procs[slot].lose_next_reply = true;
                true
            }
            Fault::ExpireLeases => {
                let jump = LEASE_MS + self.rng.random_range(1..=LEASE_MS);
                self.clock.advance(jump);
                self.note(|| format!("the clock jumps {jump}ms: every lease expires"));
                true
            }
            Fault::Stop | Fault::Kill if up => match self.model.some_run(&mut self.rng) {
                Some(run) => {
                    let kind = if fault == Fault::Kill {
                        Kind::KillRun { run }
                    } else {
                        let mode = if self.rng.random_bool(0.5) {
                            StopMode::Hard
                        } else {
                            StopMode::Soft
                        };
                        Kind::StopRun { run, mode }
                    };
                    self.spawn_in(slot, 0, kind);
                    true
                }
                None => false,
            },
            _ => false,
        };
        if landed {
            self.faults_left -= 1;
            *self.faults_landed.entry(fault.as_str()).or_default() += 1;
            self.note(|| format!("FAULT {} at slot {slot}", fault.as_str()));
        }
    }
}
