//! Deterministic simulation of Switchboard's run lifecycle: thousands of seeded crash schedules per CI
//! run over the **production** supervisor, run actors, heartbeat, flusher and history writer; every
//! failure a replayable seed.
//!
//! Owns nothing durable: each seed builds its own world — one shared in-memory store
//! ([`storage::MemoryStore`], the ledger and the history), one to three process slots each running the
//! production [`actors::supervisor::Supervisor`] of its current incarnation, clients, and a seeded
//! scheduler that picks which storage transaction, model call or tool call completes next, or which fault
//! lands. [`simulate`]`(seed, config)` replays a seed exactly.
//!
//! # Layout
//! - [`exec`]: the deterministic executor — an actix system on a current-thread tokio runtime in paused
//!   virtual time, the virtual [`storage::Clock`], and `settle` (wait until every other task waits);
//! - [`io`]: model and tool calls as operations the world completes; the simulated agent and tools;
//! - [`config`]: [`SimConfig`] and the [`Fault`] kinds;
//! - `world`: the process slots and their incarnations, the scheduler, the storage jobs and calls it
//!   completes; `world/outside.rs` what reaches the processes from outside (clients, decisions, faults);
//! - `model`: what the world saw, and every invariant (the table is in its docs);
//! - [`agent`]: the scripted model's answers (a function of the transcript) and the tools' definitions;
//! - [`cli`]: `switchboard sim` — sweeps over the cores, a table and a JSON line.
//!
//! # Design
//! The production code is the code under test: the simulator holds no copy of any shell. It owns only
//! the world: the storage each incarnation talks to is a detached mailbox ([`storage::actor::detached`])
//! whose jobs the world runs one at a time against the shared store, so every await point of the
//! production shell on storage, the model or a tool is a place the seed chooses what happens next.
//! Randomness the production code draws (run ids, generations, fence nonces, jitter) comes from
//! [`storage::entropy`], seeded per seed; its blocking file work runs in place on the one thread
//! ([`actors::tools::blocking_inline_on_this_thread`]).
//!
//! Invariants of the simulator itself: one thread, virtual time only, one seeded RNG, ordered maps
//! wherever a choice is made: a seed is a complete description of its run ([`cli`] runs different seeds
//! on different cores).

pub mod agent;
pub mod cli;
pub mod config;
pub mod exec;
pub mod io;
mod model;
mod world;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

pub use config::{Fault, KnownIssue, SimConfig, KNOWN_ISSUES};
pub use world::Violation;

/// What one seed did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<Violation>,
    /// Violations of tolerated invariants: known production issues ([`config::KNOWN_ISSUES`]).
    pub tolerated: Vec<Violation>,
    /// The readable trace (only with [`SimConfig::trace`]).
    pub trace: Vec<String>,
    pub steps: usize,
    /// Simulated milliseconds.
    pub sim_ms: i64,
    pub processes: usize,
    pub runs: usize,
    pub messages: usize,
    pub effects: u64,
    pub faults: BTreeMap<&'static str, u32>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// The failure as a person reads it: seed, violations, then the trace.
    pub fn report(&self) -> String {
        let mut out = format!(
            "seed {} failed after {} steps ({} ms simulated):\n",
            self.seed, self.steps, self.sim_ms
        );
        for v in &self.violations {
            out.push_str(&format!(
                "  [{}] {} (step {}, +{} ms)\n",
                v.invariant, v.detail, v.step, v.at_ms
            ));
        }
        if !self.trace.is_empty() {
            out.push_str("trace:\n");
            for line in &self.trace {
                out.push_str(line);
                out.push('\n');
            }
        }
        out.push_str(&format!(
            "replay: sim::simulate({}, &config) or `switchboard sim --seed {}`\n",
            self.seed, self.seed
        ));
        out
    }
}

/// Run one seed to quiescence and check every invariant. Deterministic: the same seed and config give
/// the same outcome.
pub fn simulate(seed: u64, config: &SimConfig) -> Outcome {
    quiet_simulated_panics();
    storage::entropy::seed_this_thread(seed);
    actors::tools::blocking_inline_on_this_thread();
    exec::block_on(async {
        let mut w = world::World::new(seed, config);
        w.run().await;
        let model = w.model.borrow();
        Outcome {
            seed,
            violations: w.violations.clone(),
            tolerated: w.tolerated.clone(),
            trace: w.trace.clone(),
            steps: w.step,
            sim_ms: w.now(),
            processes: w.incarnations(),
            runs: model.runs.len(),
            messages: model.messages.len(),
            effects: w.effects() as u64,
            faults: w.faults_landed.clone(),
        }
    })
}

/// The panics the world lands ([`io::SIM_PANIC`]) are caught by the production shell; print only the
/// others.
fn quiet_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&io::SIM_PANIC) {
                print(info);
            }
        }));
    });
}

/// A sweep over many seeds.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub seeds: u64,
    pub failures: Vec<Outcome>,
    /// Seeds that hit a tolerated invariant (a known production issue), with it.
    pub tolerated: Vec<(u64, &'static str)>,
    pub steps: u64,
    pub runs: u64,
    pub messages: u64,
    pub effects: u64,
    pub faults: BTreeMap<&'static str, u64>,
    pub elapsed_ms: u128,
}

impl Summary {
    pub fn seeds_per_second(&self) -> f64 {
        self.seeds as f64 / (self.elapsed_ms.max(1) as f64 / 1000.0)
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let mut rows = vec![
            ("seeds".to_owned(), self.seeds.to_string()),
            ("failed seeds".to_owned(), self.failures.len().to_string()),
            (
                "seeds with a known issue".to_owned(),
                self.tolerated.len().to_string(),
            ),
            (
                "seeds/s".to_owned(),
                format!("{:.0}", self.seeds_per_second()),
            ),
            ("scheduler steps".to_owned(), self.steps.to_string()),
            ("runs".to_owned(), self.runs.to_string()),
            ("messages".to_owned(), self.messages.to_string()),
            ("tool effects".to_owned(), self.effects.to_string()),
        ];
        for (fault, n) in &self.faults {
            rows.push((format!("faults: {fault}"), n.to_string()));
        }
        let verdict = if self.failures.is_empty() {
            "ok".to_owned()
        } else {
            format!("FAILED ({} seeds)", self.failures.len())
        };
        rows.push(("verdict".to_owned(), verdict));
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<width$}  {v:>10}\n"));
        }
        for (invariant, (n, first)) in self.known_issues() {
            out.push_str(&format!(
                "known issue [{invariant}]: {n} seeds (first {first})\n"
            ));
        }
        for f in &self.failures {
            if let Some(v) = f.violations.first() {
                out.push_str(&format!(
                    "seed {}: [{}] {}\n",
                    f.seed, v.invariant, v.detail
                ));
            }
        }
        out
    }

    /// Per known issue: how many seeds hit it, and the first.
    pub fn known_issues(&self) -> BTreeMap<&'static str, (u64, u64)> {
        let mut out: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
        for (seed, invariant) in &self.tolerated {
            out.entry(invariant).or_insert((0, *seed)).0 += 1;
        }
        out
    }

    /// One machine-readable line.
    pub fn json(&self) -> String {
        serde_json::json!({
            "seeds": self.seeds,
            "failed": self.failures.iter().map(|f| f.seed).collect::<Vec<_>>(),
            "violations": self.failures.iter().filter_map(|f| f.violations.first().map(|v| v.invariant)).collect::<Vec<_>>(),
            "knownIssues": self.known_issues(),
            "seedsPerSecond": (self.seeds_per_second() * 10.0).round() / 10.0,
            "steps": self.steps,
            "runs": self.runs,
            "messages": self.messages,
            "effects": self.effects,
            "faults": self.faults,
            "elapsedMs": self.elapsed_ms,
        })
        .to_string()
    }
}

/// Simulate every seed in `seeds`; a failing seed is re-run with the trace on (determinism makes the
/// replay exact) and kept. Stops early after `stop_after` failures.
pub fn sweep(
    seeds: impl IntoIterator<Item = u64>,
    config: &SimConfig,
    stop_after: usize,
) -> Summary {
    sweep_sharing(seeds, config, stop_after, &AtomicUsize::new(0))
}

/// [`sweep`] with the failure count shared by sweeps on other threads: every one of them stops once
/// `stop_after` failures were found between them.
pub fn sweep_sharing(
    seeds: impl IntoIterator<Item = u64>,
    config: &SimConfig,
    stop_after: usize,
    failed: &AtomicUsize,
) -> Summary {
    let started = Instant::now();
    let mut summary = Summary::default();
    for seed in seeds {
        if failed.load(Ordering::Relaxed) >= stop_after {
            break;
        }
        let outcome = simulate(seed, config);
        summary.seeds += 1;
        summary.steps += outcome.steps as u64;
        summary.runs += outcome.runs as u64;
        summary.messages += outcome.messages as u64;
        summary.effects += outcome.effects;
        for (k, n) in &outcome.faults {
            *summary.faults.entry(k).or_default() += u64::from(*n);
        }
        if let Some(v) = outcome.tolerated.first() {
            summary.tolerated.push((seed, v.invariant));
        }
        if !outcome.ok() {
            let traced = if config.trace {
                outcome
            } else {
                simulate(seed, &config.clone().with_trace(true))
            };
            summary.failures.push(traced);
            failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    summary.elapsed_ms = started.elapsed().as_millis();
    summary
}
