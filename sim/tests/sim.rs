//! The simulator's CI budget and its proof that it bites.
//!
//! - Ten thousand seeds of the default fault mix hold every invariant (four tests of 2,500 seeds, so the
//!   harness spreads them over the cores); a failing seed prints its report and trace, replayable with
//!   `sim::simulate(seed, &config)` or `switchboard sim --seed <seed>`.
//! - A seed replays exactly.
//! - Each bug the nothing-lost issue fixed, re-introduced in the simulator's shell, is found within the
//!   CI seed budget; the sweeps are strict (no known issue is tolerated), and the witness seeds of the
//!   issues fixed since hold.

use sim::{simulate, sweep, Bugs, SimConfig};

/// Seeds per CI chunk; four chunks make the 10,000-seed budget.
const CHUNK: u64 = 2_500;
/// Seeds a bug or known issue must be found within (the CI budget).
const BUDGET: u64 = 10_000;

fn holds(range: std::ops::Range<u64>) {
    let summary = sweep(range.clone(), &SimConfig::default().strict(), 1);
    println!("seeds {range:?}: {}", summary.json());
    if let Some(failure) = summary.failures.first() {
        panic!("{}", failure.report());
    }
    assert_eq!(summary.seeds, range.end - range.start);
    assert!(
        summary
            .table()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("verdict") && l.ends_with(" ok")),
        "{}",
        summary.table()
    );
}

#[test]
fn seeds_0_to_2500_hold_every_invariant() {
    holds(0..CHUNK);
}

#[test]
fn seeds_2500_to_5000_hold_every_invariant() {
    holds(CHUNK..2 * CHUNK);
}

#[test]
fn seeds_5000_to_7500_hold_every_invariant() {
    holds(2 * CHUNK..3 * CHUNK);
}

#[test]
fn seeds_7500_to_10000_hold_every_invariant() {
    holds(3 * CHUNK..4 * CHUNK);
}

#[test]
fn a_seed_replays_exactly() {
    let config = SimConfig::default().with_trace(true);
    for seed in [3, 64, 977] {
        let (a, b) = (simulate(seed, &config), simulate(seed, &config));
        assert_eq!(
            a.trace, b.trace,
            "seed {seed}: the trace differs between two runs"
        );
        assert_eq!(
            (a.steps, a.sim_ms, a.violations.len()),
            (b.steps, b.sim_ms, b.violations.len())
        );
        assert!(a.trace.len() > 10, "seed {seed}: a trace is kept");
    }
}

/// The first seed (in CI budget order) whose outcome fails on `invariant`.
fn first_seed_failing(config: &SimConfig, invariants: &[&str]) -> Option<(u64, String)> {
    for seed in 0..BUDGET {
        let outcome = simulate(seed, config);
        if let Some(v) = outcome
            .violations
            .iter()
            .find(|v| invariants.contains(&v.invariant))
        {
            return Some((seed, format!("[{}] {}", v.invariant, v.detail)));
        }
    }
    None
}

fn finds(bugs: Bugs, invariants: &[&str]) {
    finds_with(SimConfig::default().with_bugs(bugs), invariants);
}

fn finds_with(config: SimConfig, invariants: &[&str]) {
    let bugs = config.bugs;
    match first_seed_failing(&config, invariants) {
        Some((seed, what)) => println!("{bugs:?}: found at seed {seed}: {what}"),
        None => panic!("{bugs:?} not found within {BUDGET} seeds"),
    }
}

#[test]
fn bug_a_followup_input_outside_the_step_commit_is_found() {
    finds(
        Bugs {
            followup_outside_step: true,
            ..Bugs::default()
        },
        &["accepted exactly once"],
    );
}

#[test]
fn bug_b_no_successor_after_a_finishing_close_is_found() {
    finds(
        Bugs {
            no_successor_on_finishing_close: true,
            ..Bugs::default()
        },
        &["accepted exactly once"],
    );
}

#[test]
fn bug_c_effects_after_a_fence_are_found() {
    finds(
        Bugs {
            no_workspace_fence: true,
            ..Bugs::default()
        },
        &[
            "effect after workspace takeover",
            "mutating effect at most once",
        ],
    );
}

#[test]
fn bug_e_orphaned_rows_never_readopted_are_found() {
    // Without permanent faults, so the orphan is a run whose storage came back (not a detached row).
    let mut config = SimConfig::default().with_bugs(Bugs {
        no_readopt: true,
        ..Bugs::default()
    });
    config.faults.remove(&sim::Fault::Permanent);
    finds_with(
        config,
        &["orphan adopted within a sweep", "no live row remains"],
    );
}

/// The witness seeds of the production issues fixed since (a fallback or detached put over another
/// generation's close: 116, 44; a workspace fence taken before ownership was confirmed: 101, 354, 8446)
/// hold every invariant, strictly.
#[test]
fn the_fixed_issues_witness_seeds_hold_strictly() {
    let strict = SimConfig::default().strict();
    for seed in [44, 101, 116, 354, 8446] {
        let outcome = simulate(seed, &strict);
        assert!(
            outcome.ok(),
            "seed {seed}: {:?}",
            outcome.violations.first()
        );
    }
}
