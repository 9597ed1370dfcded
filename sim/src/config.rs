//! What a simulation may do: which faults the seed may choose, and the budgets. The seed picks everything else (how many processes, threads and messages; when and
//! where each fault lands).

use std::collections::BTreeSet;

/// A fault the scheduler may land at any effect boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// The process dies (kill -9): its pending effects vanish, its ledger rows stay; it restarts later
    /// under a new generation.
    Crash,
    /// The process stops (SIGSTOP) and continues later, possibly past its leases: a zombie whose stale
    /// effects run into fences.
    Pause,
    /// SIGTERM: stop admitting, hand runs off at step boundaries, exit, restart.
    Drain,
    /// The process's storage answers `Unavailable` for a while (transient: retried, then `StorageLost`).
    Outage,
    /// The process's next owner write fails permanently (the run detaches).
    Permanent,
    /// The process's next write commits but its answer is lost (an uncertain write).
    LostReply,
    /// The clock jumps past every lease.
    ExpireLeases,
    /// A soft or hard stop of some run, through some process.
    Stop,
    /// A kill (deletion fence) of some run, through some process.
    Kill,
    /// The process's next model call (or two) panics, as a bug in an agent would: the run restarts
    /// within its restart policy and closes `failed` past it.
    Panic,
}

impl Fault {
    pub const ALL: [Fault; 10] = [
        Fault::Crash,
        Fault::Pause,
        Fault::Drain,
        Fault::Outage,
        Fault::Permanent,
        Fault::LostReply,
        Fault::ExpireLeases,
        Fault::Stop,
        Fault::Kill,
        Fault::Panic,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Crash => "crash",
            Fault::Pause => "pause",
            Fault::Drain => "drain",
            Fault::Outage => "outage",
            Fault::Permanent => "permanent",
            Fault::LostReply => "lost-reply",
            Fault::ExpireLeases => "expire-leases",
            Fault::Stop => "stop",
            Fault::Kill => "kill",
            Fault::Panic => "panic",
        }
    }

    pub fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.as_str() == s)
    }

    /// Parse a comma-separated list (`crash,pause`), or `all` / `none`.
    pub fn parse_list(s: &str) -> Result<BTreeSet<Fault>, String> {
        match s.trim() {
            "all" => return Ok(Fault::ALL.into_iter().collect()),
            "none" | "" => return Ok(BTreeSet::new()),
            _ => {}
        }
        s.split(',')
            .map(|name| {
                Fault::parse(name.trim()).ok_or_else(|| {
                    format!(
                        "unknown fault {name:?} (one of: all, none, {})",
                        Fault::names()
                    )
                })
            })
            .collect()
    }

    /// Every fault name, comma-separated (for help texts).
    pub fn names() -> String {
        Fault::ALL
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How a simulation runs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The faults the seed may choose from.
    pub faults: BTreeSet<Fault>,
    /// Scheduler steps before the simulation gives up waiting for quiescence (a liveness failure).
    pub max_steps: usize,
    /// Keep a readable trace (messages, effects, faults). Off for CI sweeps: a failing seed is re-run
    /// with it on, which determinism makes exact.
    pub trace: bool,
    /// Most faults one seed may land.
    pub max_faults: u32,
    /// Invariants whose violations are recorded as tolerated findings instead of failing the seed: the
    /// known production issues (see [`KNOWN_ISSUES`]) until they are fixed.
    pub tolerate: BTreeSet<&'static str>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            faults: Fault::ALL.into_iter().collect(),
            max_steps: 20_000,
            trace: false,
            max_faults: 8,
            tolerate: KNOWN_ISSUES.iter().map(|k| k.invariant).collect(),
        }
    }
}

impl SimConfig {
    /// Fail on every invariant, known production issues included.
    pub fn strict(mut self) -> Self {
        self.tolerate.clear();
        self
    }

    pub fn with_trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }
}

/// A production issue this simulator found: the invariant that reports it, a seed that shows it (replay
/// it with `simulate(witness, &SimConfig::default().strict())`), and what goes wrong.
#[derive(Debug, Clone, Copy)]
pub struct KnownIssue {
    pub invariant: &'static str,
    pub witness: u64,
    pub what: &'static str,
}

/// Production issues this simulator found, by the invariant that reports them. Tolerated by default (a
/// CI sweep stays green while they are open; a seed that hits one records it and everything after it as
/// tolerated); `SimConfig::strict` fails on them, and a test replays each witness seed. Remove an entry
/// once production fixes it.
pub const KNOWN_ISSUES: &[KnownIssue] = &[];
