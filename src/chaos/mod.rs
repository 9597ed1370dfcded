//! `switchboard chaos`: many clients, several processes on one database, random faults, then a verifier
//! that reads every run back and checks the crash-safety contract end to end (SPEC §11).
//!
//! What it owns: a temp data dir (the SQLite database, the run workspaces every process shares, `logs/`
//! with every child's stderr), the `serve` children it starts there ([`ChildServer`], one per slot; a
//! paused process lives on beside its replacement until it is continued and retired) and, with
//! `--storage postgres`, the throwaway PostgreSQL cluster they share ([`SharedDb`]; `--storage-url` names
//! an existing database instead). On PostgreSQL each slot is a host of its own (`host_id` `host-<slot>`,
//! kept across the slot's restarts): a restarted slot reclaims its own dead generation at once, the other
//! hosts wait for the lease.
//!
//! In order:
//! 1. start `--processes` children with a short lease, heartbeat, handoff budget and drain deadline;
//! 2. `--clients` tasks post `tool=append_file` messages with a unique `nonce=` to a few shared threads
//!    (so follow-ups steer into live runs), each to a random live process; only a 2xx answer counts as
//!    accepted; a request that failed or timed out is *unanswered* (it may or may not have been admitted)
//!    and the next attempt carries a fresh nonce, so a retry can never look like a duplicate;
//! 3. `--faults` faults land at seeded-random moments on random processes ([`fleet`]): `kill -9`, `POST
//!    /admin/crash`, SIGSTOP then SIGCONT past the lease (a replacement starts at once and reclaims the
//!    paused process's runs; once continued, the stale process is drained away), SIGTERM (a drain that
//!    must exit 0); every faulted process is restarted on the same database;
//! 4. the clients stop, every slot is up, and the run waits (≤ 2 minutes) until no run is live and every
//!    listed run has its final record;
//! 5. the verifier ([`verify`]) reads every run through the JSON API and every workspace file, and counts
//!    violations (see [`verify::Verdict`]).
//!
//! It prints a table and one JSON line and fails on any violation; then, and on any failure, it keeps
//! the data dir and prints where the child logs are (a throwaway cluster goes with the process: use
//! `--storage-url` to keep the database). Only loopback addresses; every loop is bounded.
//!
//! # Layout
//! - this file: the arguments, the clients and the scenario's order;
//! - [`fleet`]: the slots' processes, the faults and the restarts;
//! - [`verify`]: settling, reading every run back, the [`verify::Verdict`].
//!
//! # Design
//! The verifier never counts what the contract allows: a run closed `interrupted` without an answer is
//! fine; a message a successor run carries (its request joins several messages) counts where its nonce
//! appears in any `input` text; an unanswered or refused request may appear at most once (never twice)
//! and is not required to appear at all. It reads only through the API and the shared workspace files,
//! so it is the same for every backend. The fault driver is one sequential loop (a fault's restart
//! finishes before the next fault), except the paused processes, which wait out their pause in tasks of
//! their own so several pauses can overlap other faults.

mod approvals;
mod fleet;
mod slack;
mod verify;

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use storage::RunId;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use storage::ledger::Strategy;

use crate::child::ChildServer;
use crate::shared_db::{DbSpec, SharedDb, StorageChoice};
use fleet::{blocking, Fleet};
use verify::Verdict;

/// Lease of every child: short, so a paused owner's runs are reclaimed within seconds.
const LEASE_MS: u64 = 3_000;
const HEARTBEAT_MS: u64 = 1_000;
/// Drain: tool calls get this long to finish before the handoff.
const HANDOFF_BUDGET_MS: u64 = 1_000;
/// Drain: the longest a draining process waits for runs it cannot hand off.
const DRAIN_DEADLINE_MS: u64 = 10_000;
/// A client request that takes longer (a paused process) is unanswered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// The message every client sends (plus its nonce): three mutating steps.
const MESSAGE: &str = "tool=append_file steps=3 ms=50";
/// With `--approvals`: two mutating steps, each parked on a decision.
const MESSAGE_APPROVED: &str = "tool=append_file steps=2 ms=50";

/// `switchboard chaos` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Concurrent clients admitting and steering messages.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Faults to inject (kill -9, /admin/crash, SIGSTOP past the lease, SIGTERM drain).
    #[arg(long, default_value_t = 20)]
    pub faults: usize,
    /// The database every process shares (postgres: a throwaway cluster this command starts and stops,
    /// unless --storage-url names one).
    #[arg(long, value_enum, default_value_t = StorageChoice::Sqlite)]
    pub storage: StorageChoice,
    /// With --storage postgres: run on this existing database (postgres://user@host:port/db) instead of
    /// a throwaway cluster. Give it an empty database you can throw away: the verifier reads every run in
    /// it, and the runs stay there.
    #[arg(long, value_name = "URL")]
    pub storage_url: Option<String>,
    /// `serve` processes running at once on the one database (on PostgreSQL each is a host of its own).
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Seed of the fault schedule and the clients' choices (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print only the JSON line (no table, no progress).
    #[arg(long)]
    pub json: bool,
    /// Keep the data dir (workspaces, child logs, the SQLite database) even when every check passes.
    #[arg(long)]
    pub keep: bool,
    /// Send the messages as signed Slack events through `/slack/events`, to processes whose cards and
    /// replies go to a local Slack stand-in; the verifier also counts cards and replies per run.
    #[arg(long)]
    pub slack: bool,
    /// What each message does on a busy thread (SPEC §5.1), one picked at random per message from this
    /// list (e.g. `steer,enqueue,interrupt`); the verifier checks each one's promise. Default: no
    /// `strategy` field (the configured default, `steer`).
    #[arg(long, value_delimiter = ',', value_parser = parse_strategy)]
    pub strategies: Vec<Strategy>,
    /// Every `append_file` call needs a person's approval (SPEC §13): an approver decides each request
    /// at a random moment (approve or deny) through a random process; the verifier checks that no denied
    /// or undecided call ran, no approved call ran twice, and no decision changed.
    #[arg(long)]
    pub approvals: bool,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| format!("{s:?} is not steer, enqueue, reject or interrupt"))
}

pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.processes >= 1, "--processes must be at least 1");
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    // Started before the runtime and dropped after it: the cluster outlives every child.
    let db = SharedDb::open(args.storage, args.storage_url.as_deref())?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let dir = tempfile::Builder::new()
        .prefix("switchboard-chaos-")
        .tempdir()
        .context("create a temp data dir")?;
    let data = dir.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start a runtime")?;
    // Ctrl-C or SIGTERM drops the scenario, and with it every child (killed on drop), instead of leaving
    // `serve` processes behind.
    let outcome = rt.block_on(async {
        tokio::select! {
            verdict = scenario(&args, &db.spec, seed, &data) => verdict,
            signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
        }
    });
    drop(rt);
    // Children are gone by now; what is left is the verdict.
    match outcome {
        Ok(verdict) => {
            let line = verdict.json(&args, &db.spec, seed, &data);
            if args.json {
                println!("{line}");
            } else {
                crate::bench::report(&verdict.table(&args, &db.spec, seed), line);
                for d in verdict.details.iter().take(20) {
                    println!("  violation: {d}");
                }
                if verdict.details.len() > 20 {
                    println!("  … {} more violation lines", verdict.details.len() - 20);
                }
                for n in verdict.notes.iter().take(10) {
                    println!("  note: {n}");
                }
            }
            if verdict.violations() > 0 || args.keep {
                let kept = dir.keep();
                if verdict.violations() > 0 {
                    let mut text = verdict.details.join("\n");
                    text.push('\n');
                    for n in &verdict.notes {
                        let _ = writeln!(text, "note: {n}");
                    }
                    let _ = std::fs::write(kept.join("violations.txt"), text);
                }
                eprintln!(
                    "chaos: data dir kept at {} (child logs in {})",
                    kept.display(),
                    kept.join("logs").display()
                );
            }
            anyhow::ensure!(
                verdict.violations() == 0,
                "{} violation(s) (seed {seed})",
                verdict.violations()
            );
            Ok(())
        }
        Err(e) => {
            let kept = dir.keep();
            eprintln!(
                "chaos: data dir kept at {} (child logs in {})",
                kept.display(),
                kept.join("logs").display()
            );
            Err(e.context(format!("chaos (seed {seed})")))
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM, naming which.
async fn interrupted() -> &'static str {
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

// ---------------------------------------------------------------------------------------------
// The clients
// ---------------------------------------------------------------------------------------------

/// One message a client sent.
#[derive(Debug, Clone)]
struct Sent {
    nonce: String,
    /// The thread key it went to (`chaos:<thread>`).
    thread_key: String,
    answer: Answer,
    /// Wall-clock ms when it was sent and when its answer came: a message sent after another's answer
    /// came is ordered after it.
    sent_ms: i64,
    answered_ms: i64,
}

#[derive(Debug, Clone)]
enum Answer {
    /// A 2xx: the message must appear exactly once.
    Accepted { outcome: String, run_id: RunId },
    /// A non-2xx answer: it should not have been admitted (at most once, never required).
    Refused { status: u16 },
    /// No answer (connection refused or reset, timeout): at most once, never required.
    Unanswered,
}

/// An event a reader was served while its run was live on another process: a page of such a run is
/// read from the ledger (its settled prefix), so the event is committed, and the run's record must keep
/// it under the same seq (SPEC §5.2 step 5, "what a reader was shown is kept").
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Shown {
    run_id: RunId,
    seq: u64,
    kind: String,
    call_id: Option<String>,
}

impl Shown {
    fn of(run_id: &RunId, event: &Value) -> Option<Shown> {
        Some(Shown {
            run_id: run_id.to_owned(),
            seq: event["seq"].as_u64()?,
            kind: event["type"].as_str()?.to_owned(),
            call_id: event["callId"].as_str().map(str::to_owned),
        })
    }
}

/// A reader: reads the events of recently started runs from random processes; keeps what a process
/// serves for a run another generation owns (`ownerGen` before and after the page, unchanged).
async fn reader_loop(
    seed: u64,
    fleet: Arc<Fleet>,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
    shown: Arc<Mutex<Vec<Shown>>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5_eed0_f5ee);
    let Ok(http) = client() else { return };
    let owner = |v: &Value| v["ownerGen"].as_str().map(str::to_owned);
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..80))).await;
        let recent: Vec<RunId> = {
            let sent = sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.iter()
                .rev()
                .filter_map(|s| match &s.answer {
                    Answer::Accepted { run_id, .. } if !run_id.is_empty() => Some(run_id.clone()),
                    _ => None,
                })
                .take(32)
                .collect()
        };
        let addrs = fleet.live_addrs();
        if recent.is_empty() || addrs.is_empty() {
            continue;
        }
        let (id, addr) = (
            &recent[rng.random_range(0..recent.len())],
            &addrs[rng.random_range(0..addrs.len())],
        );
        let get = |path: String| {
            let http = http.clone();
            async move {
                let r = http
                    .get(path)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())?;
                r.json::<Value>().await.ok()
            }
        };
        let Some(before) = get(format!("http://{addr}/api/runs/{id}"))
            .await
            .as_ref()
            .and_then(owner)
        else {
            continue;
        };
        let Some(page) = get(format!(
            "http://{addr}/api/runs/{id}/events?afterSeq=0&limit=500"
        ))
        .await
        else {
            continue;
        };
        let after = get(format!("http://{addr}/api/runs/{id}")).await;
        if after.as_ref().and_then(owner).as_deref() != Some(before.as_str()) {
            continue; // the owner changed meanwhile: the page may have come from this process's registry
        }
        let events = page["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| Shown::of(id, e));
        shown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(events);
    }
}

fn client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("build an HTTP client")
}

/// One client: post messages to random shared threads on random live processes until `stop`.
async fn client_loop(
    id: usize,
    threads: usize,
    seed: u64,
    fleet: Arc<Fleet>,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
    args: ChaosArgs,
) {
    let (via_slack, strategies) = (args.slack, args.strategies);
    let mut rng =
        StdRng::seed_from_u64(seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(id as u64 + 1)));
    let Ok(http) = client() else { return };
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let thread = format!("t{}", rng.random_range(0..threads));
        // Bounded retries: each attempt is a new message (a fresh nonce), so an answer lost to a crash
        // and its retry can never be mistaken for a duplicate.
        for _ in 0..20 {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let addrs = fleet.live_addrs();
            if addrs.is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let addr = &addrs[rng.random_range(0..addrs.len())];
            n += 1;
            let nonce = format!("q{id:02}x{n:06}");
            let message = if args.approvals {
                MESSAGE_APPROVED
            } else {
                MESSAGE
            };
            let text = format!("{message} nonce={nonce}");
            if via_slack {
                // Slack's own retries of one event carry its id: the same message, never a duplicate.
                let root = slack::thread_ts(&thread);
                let ts = format!("18{id:08}.{n:06}");
                // Retries go to the next process, the first to the one picked.
                let first = addrs.iter().position(|a| a == addr).unwrap_or(0);
                let mut order = addrs.clone();
                order.rotate_left(first);
                let status =
                    slack::mention(&http, &order, &format!("Ev{nonce}"), &root, &ts, &text).await;
                let answer = match status {
                    200..=299 => Answer::Accepted {
                        outcome: "slack".into(),
                        run_id: RunId::default(),
                    },
                    0 => Answer::Unanswered,
                    status => Answer::Refused { status },
                };
                let done = matches!(answer, Answer::Accepted { .. });
                sent.lock().unwrap_or_else(|p| p.into_inner()).push(Sent {
                    nonce,
                    thread_key: format!("{}:{root}", slack::CHANNEL),
                    answer,
                    sent_ms: 0,
                    answered_ms: 0,
                });
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(rng.random_range(10..60))).await;
                continue;
            }
            let mut body = json!({"thread": thread, "channel": "chaos", "user": format!("client{id}"),
                "text": text});
            let strategy =
                (!strategies.is_empty()).then(|| strategies[rng.random_range(0..strategies.len())]);
            if let Some(s) = strategy {
                body["strategy"] = json!(s.as_str());
            }
            let sent_ms = verify::wall_ms();
            let res = http
                .post(format!("http://{addr}/api/messages"))
                .json(&body)
                .send()
                .await;
            let answer = match res {
                Ok(r) if r.status().is_success() => match r.json::<Value>().await {
                    Ok(v) => Answer::Accepted {
                        outcome: v["outcome"].as_str().unwrap_or("").to_owned(),
                        run_id: RunId::from(v["runId"].as_str().unwrap_or("").to_owned()),
                    },
                    // The status said yes but the body was lost: as good as no answer.
                    Err(_) => Answer::Unanswered,
                },
                Ok(r) => Answer::Refused {
                    status: r.status().as_u16(),
                },
                Err(_) => Answer::Unanswered,
            };
            let done = matches!(answer, Answer::Accepted { .. });
            sent.lock().unwrap_or_else(|p| p.into_inner()).push(Sent {
                nonce,
                thread_key: format!("chaos:{thread}"),
                answer,
                sent_ms,
                answered_ms: verify::wall_ms(),
            });
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(10..60))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(30..200))).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The scenario
// ---------------------------------------------------------------------------------------------

async fn scenario(
    args: &ChaosArgs,
    db: &DbSpec,
    seed: u64,
    data: &Path,
) -> anyhow::Result<Verdict> {
    let started = Instant::now();
    let mut fleet = Fleet::new(data, db, args.processes)?;
    let slack = match args.slack {
        true => {
            let (slack, env) = slack::SlackChaos::start(data)?;
            fleet.add_env(env);
            Some(slack)
        }
        false => None,
    };
    if args.approvals {
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(data.join("config.toml"))
            .and_then(|mut f| f.write_all(approvals::config().as_bytes()))
            .context("write the approvals config")?;
    }
    let fleet = Arc::new(fleet);
    let mut children: Vec<Option<ChildServer>> = Vec::with_capacity(args.processes);
    for slot in 0..args.processes {
        let f = fleet.clone();
        let child = blocking(move || f.spawn(slot)).await??;
        fleet.set(slot, Some(child.addr.clone()));
        children.push(Some(child));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::new()));
    let threads = (args.clients / 2).max(2);
    let clients: Vec<_> = (0..args.clients)
        .map(|id| {
            tokio::spawn(client_loop(
                id,
                threads,
                seed,
                fleet.clone(),
                stop.clone(),
                sent.clone(),
                args.clone(),
            ))
        })
        .collect();
    let decisions: Arc<Mutex<Vec<approvals::Sent>>> = Arc::new(Mutex::new(Vec::new()));
    // The approver goes on through the settling: the runs queued at the end still park on approvals.
    let approver_stop = Arc::new(AtomicBool::new(false));
    let approver = args.approvals.then(|| {
        tokio::spawn(approvals::approver_loop(
            seed,
            fleet.clone(),
            approver_stop.clone(),
            decisions.clone(),
        ))
    });
    let shown: Arc<Mutex<Vec<Shown>>> = Arc::new(Mutex::new(Vec::new()));
    let reader = tokio::spawn(reader_loop(
        seed,
        fleet.clone(),
        stop.clone(),
        sent.clone(),
        shown.clone(),
    ));

    // Progress on stderr: one line rewritten in place on a terminal, else a line every 10 s (a CI log).
    let terminal = std::io::stderr().is_terminal();
    let (show, log_lines) = (!args.json && terminal, !args.json && !terminal);
    let total = args.faults;
    let counter = sent.clone();
    let began = std::time::Instant::now();
    let last_line = Mutex::new(began);
    let progress = move |k: usize| {
        let n = || counter.lock().unwrap_or_else(|p| p.into_inner()).len();
        if show {
            eprint!("\r  chaos: fault {k}/{total}, {} messages sent   ", n());
        } else if log_lines {
            let mut last = last_line.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() >= std::time::Duration::from_secs(10) {
                *last = std::time::Instant::now();
                eprintln!(
                    "chaos: fault {k}/{total}, {} messages sent, {} s",
                    n(),
                    began.elapsed().as_secs()
                );
            }
        }
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = fleet::drive_faults(&fleet, &mut children, args.faults, &mut rng, &progress).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    let _ = reader.await;
    if show {
        eprintln!();
    }
    let faults = faults?;
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));

    let http = client()?;
    // Queues drain one run after another, and each parked run waits for its decision.
    let settle_for = if args.approvals || !args.strategies.is_empty() {
        Duration::from_secs(600)
    } else {
        Duration::from_secs(120)
    };
    let settled = verify::settle(&http, &fleet, settle_for).await;
    approver_stop.store(true, Ordering::SeqCst);
    if let Some(approver) = approver {
        let _ = approver.await;
    }
    let mut shown = std::mem::take(&mut *shown.lock().unwrap_or_else(|p| p.into_inner()));
    shown.sort();
    shown.dedup();
    let stub = slack.as_ref().map(|s| &s.stub);
    let decisions = std::mem::take(&mut *decisions.lock().unwrap_or_else(|p| p.into_inner()));
    let decisions = args.approvals.then_some(decisions.as_slice());
    let mut verdict =
        verify::verify(&http, &fleet, &sent, &shown, settled, stub, decisions).await?;
    verdict.details.extend(faults.details.iter().cloned());
    verdict.notes.extend(faults.notes.iter().cloned());
    verdict.faults = faults;
    verdict.elapsed = started.elapsed();
    drop(children);
    Ok(verdict)
}
