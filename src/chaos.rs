//! `switchboard chaos`: many clients, several processes on one database, random faults, then a verifier
//! that reads every run back and checks the crash-safety contract end to end (SPEC §11).
//!
//! What it owns: a temp data dir (the one SQLite database, the run workspaces, `logs/` with every child's
//! stderr) and the `serve` children it starts there ([`ChildServer`], one per slot; a paused process
//! lives on beside its replacement until it is continued and retired).
//!
//! In order:
//! 1. start `--processes` children with a short lease, heartbeat, handoff budget and drain deadline;
//! 2. `--clients` tasks post `tool=append_file` messages with a unique `nonce=` to a few shared threads
//!    (so follow-ups steer into live runs), each to a random live process; only a 2xx answer counts as
//!    accepted; a request that failed or timed out is *unanswered* (it may or may not have been admitted)
//!    and the next attempt carries a fresh nonce, so a retry can never look like a duplicate;
//! 3. `--faults` faults land at seeded-random moments on random processes: `kill -9`, `POST
//!    /admin/crash`, SIGSTOP then SIGCONT past the lease (a replacement starts at once and reclaims the
//!    paused process's runs; once continued, the stale process is drained away), SIGTERM (a drain that
//!    must exit 0); every faulted process is restarted on the same database;
//! 4. the clients stop, every slot is up, and the run waits (≤ 2 minutes) until no run is live and every
//!    listed run has its final record;
//! 5. the verifier reads every run through the JSON API and counts violations (see [`Verdict`]).
//!
//! It prints a table and one JSON line and fails on any violation; then, and on any failure, it keeps
//! the data dir and prints where the child logs are. Only loopback addresses; every loop is bounded.
//!
//! # Design
//! The verifier never counts what the contract allows: a run closed `interrupted` without an answer is
//! fine; a message a successor run carries (its request joins several messages) counts where its nonce
//! appears in any `input` text; an unanswered or refused request may appear at most once (never twice)
//! and is not required to appear at all. The fault driver is one sequential loop (a fault's restart
//! finishes before the next fault), except the paused processes, which wait out their pause in tasks of
//! their own so several pauses can overlap other faults.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::child::ChildServer;

/// Lease of every child: short, so a paused owner's runs are reclaimed within seconds.
const LEASE_MS: u64 = 3_000;
const HEARTBEAT_MS: u64 = 1_000;
/// Drain: tool calls get this long to finish before the handoff.
const HANDOFF_BUDGET_MS: u64 = 1_000;
/// Drain: the longest a draining process waits for runs it cannot hand off.
const DRAIN_DEADLINE_MS: u64 = 10_000;
/// A client request that takes longer (a paused process) is unanswered.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the verifier waits for every run to settle.
const SETTLE: Duration = Duration::from_secs(120);
/// The message every client sends (plus its nonce): three mutating steps.
const MESSAGE: &str = "tool=append_file steps=3 ms=50";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosStorage {
    /// One SQLite file shared by every process (WAL).
    Sqlite,
    /// PostgreSQL (not built into this version of the server).
    Postgres,
}

/// `switchboard chaos` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Concurrent clients admitting and steering messages.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Faults to inject (kill -9, /admin/crash, SIGSTOP past the lease, SIGTERM drain).
    #[arg(long, default_value_t = 20)]
    pub faults: usize,
    /// The database every process shares.
    #[arg(long, value_enum, default_value_t = ChaosStorage::Sqlite)]
    pub storage: ChaosStorage,
    /// `serve` processes running at once on the one database.
    #[arg(long, default_value_t = 1)]
    pub processes: usize,
    /// Seed of the fault schedule and the clients' choices (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print only the JSON line (no table, no progress).
    #[arg(long)]
    pub json: bool,
    /// Keep the data dir (database, workspaces, child logs) even when every check passes.
    #[arg(long)]
    pub keep: bool,
}

/// The faults, as the JSON line names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `kill -9`.
    Kill,
    /// `POST /admin/crash` (exit 137 without a drain).
    Crash,
    /// SIGSTOP, a replacement, SIGCONT past the lease.
    Pause,
    /// SIGTERM: a drain that hands off and exits 0.
    Term,
}

impl Fault {
    const ALL: [Fault; 4] = [Fault::Kill, Fault::Crash, Fault::Pause, Fault::Term];

    fn as_str(self) -> &'static str {
        match self {
            Fault::Kill => "kill9",
            Fault::Crash => "crash",
            Fault::Pause => "pause",
            Fault::Term => "term",
        }
    }
}

pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    if args.storage == ChaosStorage::Postgres {
        anyhow::bail!("--storage postgres: this server is built with SQLite only (storage.kind sqlite | memory)");
    }
    anyhow::ensure!(args.processes >= 1, "--processes must be at least 1");
    anyhow::ensure!(args.clients >= 1, "--clients must be at least 1");
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let dir = tempfile::Builder::new().prefix("switchboard-chaos-").tempdir().context("create a temp data dir")?;
    let data = dir.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("start a runtime")?;
    // Ctrl-C or SIGTERM drops the scenario, and with it every child (killed on drop), instead of leaving
    // `serve` processes behind.
    let outcome = rt.block_on(async {
        tokio::select! {
            verdict = scenario(&args, seed, &data) => verdict,
            signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
        }
    });
    drop(rt);
    // Children are gone by now; what is left is the verdict.
    match outcome {
        Ok(verdict) => {
            let line = verdict.json(&args, seed, &data);
            if args.json {
                println!("{line}");
            } else {
                crate::bench::report(&verdict.table(&args, seed), line);
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
                eprintln!("chaos: data dir kept at {} (child logs in {})", kept.display(), kept.join("logs").display());
            }
            anyhow::ensure!(verdict.violations() == 0, "{} violation(s) (seed {seed})", verdict.violations());
            Ok(())
        }
        Err(e) => {
            let kept = dir.keep();
            eprintln!("chaos: data dir kept at {} (child logs in {})", kept.display(), kept.join("logs").display());
            Err(e.context(format!("chaos (seed {seed})")))
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM, naming which.
async fn interrupted() -> &'static str {
    #[cfg(unix)]
    {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
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
// The processes
// ---------------------------------------------------------------------------------------------

/// The slots' processes as the clients see them, and how to start one more.
struct Fleet {
    exe: PathBuf,
    data: PathBuf,
    env: Vec<(String, String)>,
    /// Each slot's address, `None` while its process is down. A std `Mutex`: held only to copy.
    addrs: Mutex<Vec<Option<String>>>,
    /// Children started so far; numbers their log files.
    started: AtomicUsize,
}

impl Fleet {
    fn new(data: &Path, processes: usize) -> anyhow::Result<Fleet> {
        let env = [
            ("SWITCHBOARD_LEDGER__LEASE_MS", LEASE_MS.to_string()),
            ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", HEARTBEAT_MS.to_string()),
            ("SWITCHBOARD_DRAIN__HANDOFF_BUDGET_MS", HANDOFF_BUDGET_MS.to_string()),
            ("SWITCHBOARD_DRAIN__DEADLINE_MS", DRAIN_DEADLINE_MS.to_string()),
            // Retention must never trim a run the verifier is looking for.
            ("SWITCHBOARD_HISTORY__MAX_RUNS", "20000".to_owned()),
            ("SWITCHBOARD_HISTORY__MAX_BYTES", (8u64 << 30).to_string()),
            // Process crashes lose nothing under WAL + NORMAL; only power loss would.
            ("SWITCHBOARD_STORAGE__SYNCHRONOUS", "normal".to_owned()),
        ];
        Ok(Fleet {
            exe: std::env::current_exe().context("find this executable")?,
            data: data.to_path_buf(),
            env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            addrs: Mutex::new(vec![None; processes]),
            started: AtomicUsize::new(0),
        })
    }

    fn db(&self) -> PathBuf {
        self.data.join("switchboard.db")
    }

    /// Start one more `serve` child (blocking until it listens), its log in `logs/`.
    fn spawn(&self, slot: usize) -> anyhow::Result<ChildServer> {
        let k = self.started.fetch_add(1, Ordering::SeqCst);
        let log = self.data.join("logs").join(format!("child-{k:04}-slot{slot}.log"));
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        ChildServer::start_logged(&self.exe, &self.data, &env, Some(&log)).with_context(|| format!("start child {k} (slot {slot})"))
    }

    fn set(&self, slot: usize, addr: Option<String>) {
        self.addrs.lock().unwrap_or_else(|p| p.into_inner())[slot] = addr;
    }

    fn live_addrs(&self) -> Vec<String> {
        self.addrs.lock().unwrap_or_else(|p| p.into_inner()).iter().flatten().cloned().collect()
    }
}

/// Run blocking child work (signals, waits, starts) off the runtime's thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await.context("join a blocking task")
}

/// What the fault driver saw besides the faults themselves.
#[derive(Debug, Default)]
struct FaultLog {
    by_kind: BTreeMap<Fault, usize>,
    /// A SIGTERM'd process that did not exit 0 within the drain deadline (and a margin).
    drain_failures: usize,
    /// A process that exited without being faulted.
    unexpected_exits: usize,
    /// `/admin/crash` that did not end the process (it was killed instead).
    crash_fallbacks: usize,
    /// A pause that could not find a moment outside a write transaction (skipped).
    pauses_skipped: usize,
    details: Vec<String>,
}

/// Replace a slot's process: start a fresh child on the same database.
async fn restart(fleet: &Arc<Fleet>, children: &mut [Option<ChildServer>], slot: usize) -> anyhow::Result<()> {
    fleet.set(slot, None);
    children[slot] = None;
    let f = fleet.clone();
    let child = blocking(move || f.spawn(slot)).await??;
    fleet.set(slot, Some(child.addr.clone()));
    children[slot] = Some(child);
    Ok(())
}

/// Restart every slot whose process exited on its own, counting it.
async fn check_exits(fleet: &Arc<Fleet>, children: &mut [Option<ChildServer>], log: &mut FaultLog) -> anyhow::Result<()> {
    for slot in 0..children.len() {
        let exited = children[slot].as_mut().and_then(ChildServer::try_exit);
        if let Some(code) = exited {
            log.unexpected_exits += 1;
            log.details.push(format!("slot {slot}: the process exited on its own (code {code}); restarted"));
            restart(fleet, children, slot).await?;
        }
    }
    Ok(())
}

/// A paused process's remaining life: wait out the pause, continue it (a stale owner now), give it two
/// seconds to hit its fences, then drain it away. Answers a note when something was off.
async fn retire_paused(child: ChildServer, pause: Duration) -> Option<String> {
    tokio::time::sleep(pause).await;
    blocking(move || {
        let mut child = child;
        if let Err(e) = child.signal("-CONT") {
            return Some(format!("pid {}: SIGCONT failed: {e:#}", child.pid()));
        }
        std::thread::sleep(Duration::from_secs(2));
        let _ = child.signal("-TERM");
        match child.wait_exit(Duration::from_millis(DRAIN_DEADLINE_MS) + Duration::from_secs(20)) {
            Some(0) => None,
            Some(code) => Some(format!("pid {}: the continued process exited {code} after SIGTERM", child.pid())),
            None => Some(format!("pid {}: the continued process did not exit after SIGTERM; killed", child.pid())),
        }
    })
    .await
    .unwrap_or_else(|e| Some(format!("{e:#}")))
}

/// Land `faults` faults at seeded-random moments, restarting each faulted process.
async fn drive_faults(
    fleet: &Arc<Fleet>,
    children: &mut [Option<ChildServer>],
    faults: usize,
    rng: &mut StdRng,
    progress: &dyn Fn(usize),
) -> anyhow::Result<FaultLog> {
    let mut log = FaultLog::default();
    let http = client()?;
    let mut paused: Vec<tokio::task::JoinHandle<Option<String>>> = Vec::new();
    // Let the clients get some runs going first.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for k in 0..faults {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1200))).await;
        check_exits(fleet, children, &mut log).await?;
        let slot = rng.random_range(0..children.len());
        let fault = Fault::ALL[rng.random_range(0..Fault::ALL.len())];
        let Some(mut child) = children[slot].take() else { anyhow::bail!("slot {slot} has no process") };
        match fault {
            Fault::Kill => {
                blocking(move || {
                    let _ = child.signal("-KILL");
                    child.wait_exit(Duration::from_secs(10));
                })
                .await?;
            }
            Fault::Crash => {
                let answered = http.post(child.url("/admin/crash")).json(&json!({})).send().await.map(|r| r.status().as_u16());
                let (code, child) = blocking(move || (child.wait_exit(Duration::from_secs(10)), child)).await?;
                if code != Some(137) {
                    log.crash_fallbacks += 1;
                    log.details.push(format!("slot {slot}: /admin/crash answered {answered:?}, exit {code:?}; killed instead"));
                    blocking(move || {
                        let mut child = child;
                        let _ = child.signal("-KILL");
                        child.wait_exit(Duration::from_secs(10));
                    })
                    .await?;
                }
            }
            Fault::Term => {
                let (code, pid) = blocking(move || {
                    let _ = child.signal("-TERM");
                    let code = child.wait_exit(Duration::from_millis(DRAIN_DEADLINE_MS) + Duration::from_secs(20));
                    (code, child.pid())
                })
                .await?;
                if code != Some(0) {
                    log.drain_failures += 1;
                    log.details.push(format!("slot {slot} (pid {pid}): SIGTERM drain ended with {code:?}, not exit 0"));
                }
            }
            Fault::Pause => {
                let db = fleet.db();
                let (paused_ok, child) = blocking(move || (child.pause_outside_transaction(&db), child)).await?;
                match paused_ok {
                    Ok(()) => {
                        // The replacement takes the slot at once; the paused process's runs come to it
                        // (or another process) when its lease runs out.
                        let pause = Duration::from_millis(LEASE_MS + rng.random_range(500..LEASE_MS + 1000));
                        paused.push(tokio::spawn(retire_paused(child, pause)));
                    }
                    Err(e) => {
                        log.pauses_skipped += 1;
                        log.details.push(format!("slot {slot}: no pause: {e:#}"));
                        children[slot] = Some(child);
                        progress(k + 1);
                        continue;
                    }
                }
            }
        }
        *log.by_kind.entry(fault).or_default() += 1;
        restart(fleet, children, slot).await?;
        progress(k + 1);
    }
    for p in paused {
        if let Some(note) = p.await.context("join a paused process")? {
            // A continued (stale) process that will not drain cleanly is a drain failure too.
            log.drain_failures += 1;
            log.details.push(note);
        }
    }
    check_exits(fleet, children, &mut log).await?;
    Ok(log)
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
}

#[derive(Debug, Clone)]
enum Answer {
    /// A 2xx: the message must appear exactly once.
    Accepted { outcome: String, run_id: String },
    /// A non-2xx answer: it should not have been admitted (at most once, never required).
    Refused { status: u16 },
    /// No answer (connection refused or reset, timeout): at most once, never required.
    Unanswered,
}

fn client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder().no_proxy().timeout(REQUEST_TIMEOUT).build().context("build an HTTP client")
}

/// One client: post messages to random shared threads on random live processes until `stop`.
async fn client_loop(id: usize, threads: usize, seed: u64, fleet: Arc<Fleet>, stop: Arc<AtomicBool>, sent: Arc<Mutex<Vec<Sent>>>) {
    let mut rng = StdRng::seed_from_u64(seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(id as u64 + 1)));
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
            let body = json!({"thread": thread, "channel": "chaos", "user": format!("client{id}"),
                "text": format!("{MESSAGE} nonce={nonce}")});
            let res = http.post(format!("http://{addr}/api/messages")).json(&body).send().await;
            let answer = match res {
                Ok(r) if r.status().is_success() => match r.json::<Value>().await {
                    Ok(v) => Answer::Accepted {
                        outcome: v["outcome"].as_str().unwrap_or("").to_owned(),
                        run_id: v["runId"].as_str().unwrap_or("").to_owned(),
                    },
                    // The status said yes but the body was lost: as good as no answer.
                    Err(_) => Answer::Unanswered,
                },
                Ok(r) => Answer::Refused { status: r.status().as_u16() },
                Err(_) => Answer::Unanswered,
            };
            let done = matches!(answer, Answer::Accepted { .. });
            sent.lock().unwrap_or_else(|p| p.into_inner()).push(Sent { nonce, thread_key: format!("chaos:{thread}"), answer });
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

async fn scenario(args: &ChaosArgs, seed: u64, data: &Path) -> anyhow::Result<Verdict> {
    let started = Instant::now();
    let fleet = Arc::new(Fleet::new(data, args.processes)?);
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
        .map(|id| tokio::spawn(client_loop(id, threads, seed, fleet.clone(), stop.clone(), sent.clone())))
        .collect();

    let show = !args.json && std::io::stderr().is_terminal();
    let total = args.faults;
    let counter = sent.clone();
    let progress = move |k: usize| {
        if show {
            let n = counter.lock().unwrap_or_else(|p| p.into_inner()).len();
            eprint!("\r  chaos: fault {k}/{total}, {n} messages sent   ");
        }
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = drive_faults(&fleet, &mut children, args.faults, &mut rng, &progress).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    if show {
        eprintln!();
    }
    let faults = faults?;
    let sent = std::mem::take(&mut *sent.lock().unwrap_or_else(|p| p.into_inner()));

    let http = client()?;
    let settled = settle(&http, &fleet).await;
    let mut verdict = verify(&http, &fleet, &sent, settled).await?;
    verdict.faults = faults;
    verdict.elapsed = started.elapsed();
    drop(children);
    Ok(verdict)
}

/// GET `path` from one live process after another until one answers 2xx JSON.
async fn get_json(http: &reqwest::Client, fleet: &Fleet, path: &str) -> anyhow::Result<Value> {
    let mut last = anyhow::anyhow!("no process is up");
    for attempt in 0..10 {
        let addrs = fleet.live_addrs();
        if let Some(addr) = addrs.get(attempt % addrs.len().max(1)) {
            match http.get(format!("http://{addr}{path}")).send().await {
                Ok(r) if r.status().is_success() => return r.json().await.with_context(|| format!("decode GET {path}")),
                Ok(r) => last = anyhow::anyhow!("GET {path}: {}", r.status()),
                Err(e) => last = anyhow::Error::from(e).context(format!("GET {path}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

/// Every run the API lists (`status=all`, paged with `before`/`beforeId`), newest first, by id.
async fn list_all(http: &reqwest::Client, fleet: &Fleet) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<(i64, Option<String>)> = None;
    for _ in 0..10_000 {
        let mut path = "/api/runs?status=all&limit=200".to_owned();
        if let Some((before, id)) = &cursor {
            let _ = write!(path, "&before={before}");
            if let Some(id) = id {
                let _ = write!(path, "&beforeId={id}");
            }
        }
        let page = get_json(http, fleet, &path).await?;
        out.extend(page["runs"].as_array().cloned().unwrap_or_default());
        let next = page.get("nextBefore").filter(|n| !n.is_null()).map(|n| (n["finishedAt"].as_i64().unwrap_or(0), n["id"].as_str().map(str::to_owned)));
        match next {
            Some(n) if Some(&n) != cursor.as_ref() => cursor = Some(n),
            _ => return Ok(out),
        }
    }
    anyhow::bail!("the run listing never ended")
}

/// Every event of a run, paged with `afterSeq`.
async fn events_all(http: &reqwest::Client, fleet: &Fleet, id: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0u64;
    for _ in 0..10_000 {
        let page = get_json(http, fleet, &format!("/api/runs/{id}/events?afterSeq={after}&limit=500")).await?;
        out.extend(page["events"].as_array().cloned().unwrap_or_default());
        match page["nextAfterSeq"].as_u64() {
            Some(n) if n > after => after = n,
            _ => return Ok(out),
        }
    }
    anyhow::bail!("the events of run {id} never ended")
}

/// Whether a listed run has its final record: finished, not a tombstone, persisted.
fn has_final_record(run: &Value) -> bool {
    run["finished"] == true && run["provisional"] != true && run["persisted"] == true && run["status"].is_string()
}

/// Wait (≤ [`SETTLE`]) until no process lists an active run, the ledger has no live row and every listed
/// run has its final record. Answers whether that happened.
async fn settle(http: &reqwest::Client, fleet: &Fleet) -> bool {
    let until = Instant::now() + SETTLE;
    while Instant::now() < until {
        let mut quiet = true;
        for addr in fleet.live_addrs() {
            let active = http.get(format!("http://{addr}/api/runs?status=active&limit=200")).send().await;
            let active: Option<Value> = match active {
                Ok(r) if r.status().is_success() => r.json().await.ok(),
                _ => None,
            };
            if active.is_none_or(|v| v["runs"].as_array().is_none_or(|r| !r.is_empty())) {
                quiet = false;
                break;
            }
        }
        if quiet {
            quiet = get_json(http, fleet, "/api/live").await.is_ok_and(|v| v["runs"].as_array().is_some_and(Vec::is_empty));
        }
        if quiet {
            quiet = list_all(http, fleet).await.is_ok_and(|runs| runs.iter().all(has_final_record));
        }
        if quiet {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

// ---------------------------------------------------------------------------------------------
// The verifier
// ---------------------------------------------------------------------------------------------

/// What the verifier counted. Every field but the informational ones is a violation when non-zero.
#[derive(Debug, Default)]
struct Verdict {
    settled: bool,
    accepted: usize,
    steered: usize,
    unanswered: usize,
    refused: usize,
    runs: usize,
    faults: FaultLog,
    /// Accepted messages whose nonce is in no `input` event.
    lost_inputs: usize,
    /// Messages whose nonce is in more than one `input` event.
    duplicated_inputs: usize,
    /// `append_file` lines that repeat an earlier line of the same workspace file.
    duplicated_effects: usize,
    /// `append_file` lines below the highest step already written (written after a fence).
    out_of_order_effects: usize,
    /// Runs without their one final record: unfinished, a tombstone, or a live row left.
    stuck_runs: usize,
    /// Runs with more than one terminal event (`answer` / `run_failed`).
    duplicate_terminals: usize,
    /// Run ids a 2xx answer named that no listing shows.
    missing_runs: usize,
    /// Event seqs that repeat within a run.
    repeated_seqs: usize,
    /// Messages found in a run of another thread.
    crossed_threads: usize,
    /// Informational: refused messages that were admitted anyway (once).
    refused_but_present: usize,
    /// Informational: nonces found that no client sent.
    unknown_nonces: usize,
    elapsed: Duration,
    /// One line per violation.
    details: Vec<String>,
    /// One line per informational finding.
    notes: Vec<String>,
}

impl Verdict {
    fn violations(&self) -> usize {
        self.lost_inputs
            + self.duplicated_inputs
            + self.duplicated_effects
            + self.out_of_order_effects
            + self.stuck_runs
            + self.duplicate_terminals
            + self.missing_runs
            + self.repeated_seqs
            + self.crossed_threads
            + self.faults.drain_failures
            + self.faults.unexpected_exits
    }

    fn faults_by_kind(&self) -> BTreeMap<&'static str, usize> {
        Fault::ALL.iter().map(|f| (f.as_str(), self.faults.by_kind.get(f).copied().unwrap_or(0))).collect()
    }

    fn table(&self, args: &ChaosArgs, seed: u64) -> Vec<(&'static str, String)> {
        let kinds: Vec<String> = self.faults_by_kind().iter().map(|(k, n)| format!("{k} {n}")).collect();
        vec![
            ("scenario", format!("chaos ({} clients, {} processes, seed {seed})", args.clients, args.processes)),
            ("accepted (steered)", format!("{} ({})", self.accepted, self.steered)),
            ("unanswered / refused", format!("{} / {}", self.unanswered, self.refused)),
            ("runs", self.runs.to_string()),
            ("faults", format!("{} ({})", self.faults.by_kind.values().sum::<usize>(), kinds.join(", "))),
            ("settled", if self.settled { "yes".into() } else { "no (waited 2 min)".into() }),
            ("lost inputs", self.lost_inputs.to_string()),
            ("duplicated inputs", self.duplicated_inputs.to_string()),
            ("duplicated effects", self.duplicated_effects.to_string()),
            ("out-of-order effects", self.out_of_order_effects.to_string()),
            ("stuck runs", self.stuck_runs.to_string()),
            ("duplicate terminals", self.duplicate_terminals.to_string()),
            ("missing runs", self.missing_runs.to_string()),
            ("repeated seqs", self.repeated_seqs.to_string()),
            ("crossed threads", self.crossed_threads.to_string()),
            ("drain failures", self.faults.drain_failures.to_string()),
            ("unexpected exits", self.faults.unexpected_exits.to_string()),
            ("elapsed", format!("{:.1} s", self.elapsed.as_secs_f64())),
            ("verdict", if self.violations() == 0 { "ok".into() } else { format!("{} violation(s)", self.violations()) }),
        ]
    }

    fn json(&self, args: &ChaosArgs, seed: u64, data: &Path) -> Value {
        json!({
            "scenario": "chaos", "seed": seed, "clients": args.clients, "processes": args.processes,
            "storage": "sqlite", "lease_ms": LEASE_MS,
            "faults": self.faults.by_kind.values().sum::<usize>(), "faults_by_kind": self.faults_by_kind(),
            "pauses_skipped": self.faults.pauses_skipped, "crash_fallbacks": self.faults.crash_fallbacks,
            "accepted": self.accepted, "steered": self.steered, "unanswered": self.unanswered, "refused": self.refused,
            "runs": self.runs, "settled": self.settled,
            "lost_inputs": self.lost_inputs, "duplicated_inputs": self.duplicated_inputs,
            "duplicated_effects": self.duplicated_effects, "out_of_order_effects": self.out_of_order_effects,
            "stuck_runs": self.stuck_runs, "duplicate_terminals": self.duplicate_terminals,
            "missing_runs": self.missing_runs, "repeated_seqs": self.repeated_seqs,
            "crossed_threads": self.crossed_threads, "drain_failures": self.faults.drain_failures,
            "unexpected_exits": self.faults.unexpected_exits,
            "refused_but_present": self.refused_but_present, "unknown_nonces": self.unknown_nonces,
            "violations": self.violations(), "ok": self.violations() == 0,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "data_dir": if self.violations() > 0 || args.keep { Value::from(data.display().to_string()) } else { Value::Null },
        })
    }
}

/// Every `nonce=` token in a text.
fn nonces_in(text: &str) -> Vec<&str> {
    text.match_indices("nonce=")
        .map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let end = rest.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// `append_file` lines (`step <n>`) of one workspace file: (repeats, lines below the highest so far).
fn effect_order(log: &str) -> (usize, usize) {
    let (mut seen, mut high, mut dup, mut late) = (HashSet::new(), 0u64, 0, 0);
    for n in log.lines().filter_map(|l| l.trim().strip_prefix("step ")?.parse::<u64>().ok()) {
        if !seen.insert(n) {
            dup += 1;
        } else if n < high {
            late += 1;
        }
        high = high.max(n);
    }
    (dup, late)
}

async fn verify(http: &reqwest::Client, fleet: &Fleet, sent: &[Sent], settled: bool) -> anyhow::Result<Verdict> {
    let mut v = Verdict { settled, ..Verdict::default() };
    for s in sent {
        match &s.answer {
            Answer::Accepted { outcome, .. } => {
                v.accepted += 1;
                if outcome == "steered" {
                    v.steered += 1;
                }
            }
            Answer::Refused { .. } => v.refused += 1,
            Answer::Unanswered => v.unanswered += 1,
        }
    }
    let mut runs: BTreeMap<String, Value> = BTreeMap::new();
    for run in list_all(http, fleet).await.context("list every run")? {
        if let Some(id) = run["id"].as_str() {
            runs.entry(id.to_owned()).or_insert(run);
        }
    }
    v.runs = runs.len();

    // Terminal records and live rows.
    let live = get_json(http, fleet, "/api/live").await.context("read the live rows")?;
    let mut stuck: BTreeMap<String, String> = BTreeMap::new();
    for row in live["runs"].as_array().into_iter().flatten() {
        let id = row["runId"].as_str().or(row["run_id"].as_str()).or(row["id"].as_str()).unwrap_or("?");
        stuck.insert(id.to_owned(), format!("a live row remains: {row}"));
    }
    for (id, run) in &runs {
        if !has_final_record(run) {
            stuck.entry(id.clone()).or_insert_with(|| {
                format!(
                    "no final record (finished {}, status {}, provisional {}, persisted {})",
                    run["finished"], run["status"], run["provisional"], run["persisted"]
                )
            });
        }
    }
    v.stuck_runs = stuck.len();
    for (id, why) in &stuck {
        v.details.push(format!("stuck run {id}: {why}"));
    }
    for s in sent {
        if let Answer::Accepted { run_id, outcome } = &s.answer {
            if !run_id.is_empty() && !runs.contains_key(run_id) && !stuck.contains_key(run_id) {
                v.missing_runs += 1;
                v.details.push(format!("missing run {run_id}: answered {outcome} for {} on {}", s.nonce, s.thread_key));
            }
        }
    }

    // Events: seqs, terminals, inputs.
    let mut found: HashMap<String, Vec<(String, String)>> = HashMap::new();
    // Where a nonce shows in an answer (the scripted agent echoes the follow-ups it read): tells a lost
    // `input` event of a message a run did read apart from a message no run ever read.
    let mut answered: HashMap<String, String> = HashMap::new();
    for (id, run) in &runs {
        let events = events_all(http, fleet, id).await.with_context(|| format!("read the events of run {id}"))?;
        let mut seqs = HashSet::new();
        let mut terminals = 0;
        for e in &events {
            if let Some(seq) = e["seq"].as_u64() {
                if !seqs.insert(seq) {
                    v.repeated_seqs += 1;
                    v.details.push(format!("repeated seq {seq} in run {id}"));
                }
            }
            match e["type"].as_str() {
                Some("answer" | "run_failed") => {
                    terminals += 1;
                    for n in nonces_in(e["text"].as_str().unwrap_or("")) {
                        answered.entry(n.to_owned()).or_insert_with(|| id.clone());
                    }
                }
                Some("input") => {
                    for n in nonces_in(e["text"].as_str().unwrap_or("")) {
                        let thread = run["threadKey"].as_str().unwrap_or("").to_owned();
                        found.entry(n.to_owned()).or_default().push((id.clone(), thread));
                    }
                }
                _ => {}
            }
        }
        if terminals > 1 {
            v.duplicate_terminals += 1;
            v.details.push(format!("run {id} has {terminals} terminal events (answer / run_failed)"));
        }
    }

    // Messages against what the runs hold.
    let by_nonce: HashMap<&str, &Sent> = sent.iter().map(|s| (s.nonce.as_str(), s)).collect();
    for s in sent {
        let places = found.get(&s.nonce).map(Vec::as_slice).unwrap_or(&[]);
        match (&s.answer, places.len()) {
            (Answer::Accepted { outcome, run_id }, 0) => {
                v.lost_inputs += 1;
                let read = match answered.get(&s.nonce) {
                    Some(r) => format!("read: the answer of run {r} names it"),
                    None => "no run read it".into(),
                };
                v.details.push(format!("lost input {} ({outcome} into run {run_id} on {}; {read})", s.nonce, s.thread_key));
            }
            (Answer::Refused { status }, 1) => {
                v.refused_but_present += 1;
                v.notes.push(format!("refused ({status}) message {} was admitted anyway (run {})", s.nonce, places[0].0));
            }
            (_, 0 | 1) => {}
            (answer, n) => {
                v.duplicated_inputs += 1;
                let runs: Vec<&str> = places.iter().map(|(r, _)| r.as_str()).collect();
                v.details.push(format!("duplicated input {} ({answer:?}): {n} input events, runs {runs:?}", s.nonce));
            }
        }
        let crossed: Vec<&(String, String)> = places.iter().filter(|(_, t)| *t != s.thread_key).collect();
        if !crossed.is_empty() {
            v.crossed_threads += 1;
            v.details.push(format!("crossed thread: {} was sent to {} but is in {crossed:?}", s.nonce, s.thread_key));
        }
    }
    v.unknown_nonces = found.keys().filter(|n| !by_nonce.contains_key(n.as_str())).count();
    if v.runs >= 19_000 {
        v.notes.push(format!("{} runs: near the 20000-run retention cap, so trimmed runs may count as lost", v.runs));
    }

    // Workspaces: every steps.log on disk, whether or not its run is listed.
    let root = fleet.data.join("workspaces");
    if let Ok(dirs) = std::fs::read_dir(&root) {
        for dir in dirs.flatten() {
            let Ok(log) = std::fs::read_to_string(dir.path().join("steps.log")) else { continue };
            let (dup, late) = effect_order(&log);
            if dup + late > 0 {
                let id = dir.file_name().to_string_lossy().into_owned();
                v.duplicated_effects += dup;
                v.out_of_order_effects += late;
                let lines: Vec<&str> = log.lines().collect();
                v.details.push(format!("workspace {id}: {dup} repeated and {late} out-of-order append_file lines: {lines:?}"));
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_found_inside_joined_successor_requests() {
        let joined = "tool=append_file steps=3 ms=50 nonce=q01x000007\n\ntool=append_file steps=3 ms=50 nonce=q02x000011";
        assert_eq!(nonces_in(joined), vec!["q01x000007", "q02x000011"]);
        assert_eq!(nonces_in("no nonce here, nonce= either"), Vec::<&str>::new());
    }

    #[test]
    fn effect_order_counts_repeats_and_late_lines_apart() {
        // A resume may skip a step (its call settled effects-unknown): a gap is fine.
        assert_eq!(effect_order("step 1\nstep 2\nstep 4\n"), (0, 0));
        // The same step twice: a mutating call ran twice.
        assert_eq!(effect_order("step 1\nstep 2\nstep 2\nstep 3\n"), (1, 0));
        // A stale owner writing step 2 after the new owner wrote step 3.
        assert_eq!(effect_order("step 1\nstep 3\nstep 2\n"), (0, 1));
        // Other lines are not effects of the scripted agent.
        assert_eq!(effect_order("hello\nstep 1\n"), (0, 0));
    }
}
