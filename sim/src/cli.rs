//! The command-line face of the simulator (`switchboard sim`, and `cargo run -p sim --example sweep`):
//! sweep a range of seeds over the cores, print a table and a JSON line, and the replayable report of the
//! first failing seed. A single seed prints its whole trace.

use std::collections::BTreeSet;

use crate::{simulate, sweep_sharing, Fault, SimConfig, Summary};

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// How many seeds.
    pub seeds: u64,
    /// The first seed.
    pub seed: u64,
    /// The faults the seeds may land (`None`: all).
    pub faults: Option<BTreeSet<Fault>>,
    /// Fail on the known production issues too.
    pub strict: bool,
    /// Stop the sweep once this many seeds failed (`None`: sweep them all).
    pub stop_after: Option<usize>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            seeds: 1000,
            seed: 0,
            faults: None,
            strict: false,
            stop_after: None,
        }
    }
}

/// Parse `--seeds N`, `--seed S`, `--faults list` and `--strict` (for the example; the binary uses clap).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args::default();
    let mut seeds_given = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--seeds" => {
                out.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?;
                seeds_given = true;
            }
            "--seed" => {
                out.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?;
                if !seeds_given {
                    out.seeds = 1;
                }
            }
            "--faults" => out.faults = Some(Fault::parse_list(&value()?)?),
            "--strict" => out.strict = true,
            "--stop-after" => {
                out.stop_after = Some(value()?.parse().map_err(|e| format!("--stop-after: {e}"))?)
            }
            other => return Err(format!("unknown argument {other:?} (expected --seeds N, --seed S, --faults LIST, --strict, --stop-after N)")),
        }
    }
    Ok(out)
}

/// The config `args` ask for.
pub fn config(args: &Args) -> SimConfig {
    let mut config = SimConfig::default();
    if let Some(faults) = &args.faults {
        config.faults = faults.clone();
    }
    if args.strict {
        config = config.strict();
    }
    config
}

/// Run and print; answers the process exit code (0: every invariant held, 1: a seed failed).
pub fn run(args: &Args) -> i32 {
    let config = config(args);
    if args.seeds == 1 {
        let outcome = simulate(args.seed, &config.with_trace(true));
        for line in &outcome.trace {
            println!("{line}");
        }
        for v in &outcome.tolerated {
            println!("known issue [{}]: {}", v.invariant, v.detail);
        }
        for v in &outcome.violations {
            println!(
                "VIOLATION [{}] {} (step {}, +{} ms)",
                v.invariant, v.detail, v.step, v.at_ms
            );
        }
        println!(
            "{}",
            serde_json::json!({
                "seed": outcome.seed, "ok": outcome.ok(), "steps": outcome.steps, "simulatedMs": outcome.sim_ms,
                "violations": outcome.violations.iter().map(|v| v.invariant).collect::<Vec<_>>(),
                "knownIssues": outcome.tolerated.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            })
        );
        return i32::from(!outcome.ok());
    }
    let summary = sweep_parallel(
        args.seed..args.seed + args.seeds,
        &config,
        args.stop_after.unwrap_or(usize::MAX),
    );
    print!("{}", summary.table());
    if let Some(first) = summary.failures.first() {
        println!("{}", first.report());
    }
    println!("{}", summary.json());
    i32::from(!summary.failures.is_empty())
}

/// How often a sweep says how far it got.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// [`sweep`] over the cores: each thread takes every n-th seed (each seed is still one thread, one RNG,
/// so every outcome is what `simulate(seed)` gives). Failures come back in seed order.
pub fn sweep_parallel(
    seeds: std::ops::Range<u64>,
    config: &SimConfig,
    stop_after: usize,
) -> Summary {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1) as u64;
    let started = std::time::Instant::now();
    let (begun, finished, failed) = (
        AtomicU64::new(0),
        AtomicBool::new(false),
        AtomicUsize::new(0),
    );
    let total = seeds.end - seeds.start;
    let parts: Vec<Summary> = std::thread::scope(|scope| {
        // A progress line on stderr every PROGRESS_EVERY (a terminal or a CI log alike).
        scope.spawn(|| {
            let mut next = started + PROGRESS_EVERY;
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if std::time::Instant::now() >= next {
                    next += PROGRESS_EVERY;
                    eprintln!(
                        "sim: {}/{total} seeds, {} s",
                        begun.load(Ordering::Relaxed),
                        started.elapsed().as_secs()
                    );
                }
            }
        });
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = seeds
                    .clone()
                    .skip(t as usize)
                    .step_by(threads as usize)
                    .inspect(|_| {
                        begun.fetch_add(1, Ordering::Relaxed);
                    });
                let failed = &failed;
                scope.spawn(move || sweep_sharing(seeds, config, stop_after, failed))
            })
            .collect();
        let parts = handles
            .into_iter()
            .map(|h| h.join().expect("a sweep thread does not panic"))
            .collect();
        finished.store(true, Ordering::Relaxed);
        parts
    });
    let mut total = Summary::default();
    for part in parts {
        total.seeds += part.seeds;
        total.steps += part.steps;
        total.runs += part.runs;
        total.messages += part.messages;
        total.effects += part.effects;
        total.failures.extend(part.failures);
        total.tolerated.extend(part.tolerated);
        for (k, n) in part.faults {
            *total.faults.entry(k).or_default() += n;
        }
    }
    total.failures.sort_by_key(|f| f.seed);
    total.tolerated.sort();
    total.elapsed_ms = started.elapsed().as_millis();
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse(&s.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn a_lone_seed_replays_it_and_seeds_sweep_from_it() {
        assert_eq!(args("--seed 64").map(|a| (a.seed, a.seeds)), Ok((64, 1)));
        assert_eq!(
            args("--seeds 500 --seed 10").map(|a| (a.seed, a.seeds)),
            Ok((10, 500))
        );
        assert_eq!(
            args("--seeds 5 --faults crash,pause").map(|a| a.faults.map(|f| f.len())),
            Ok(Some(2))
        );
        assert!(args("--faults lightning").is_err());
        assert!(args("--bogus").is_err());
    }
}
