//! The processes of `switchboard chaos` and the faults that land on them: one [`Fleet`] of slots, each
//! with its process (a `serve` child on the shared database), and [`drive_faults`], the one loop that
//! kills, crashes, pauses and drains them and starts each slot's replacement.
//!
//! A slot keeps its identity across restarts: its log files are numbered per start, and on PostgreSQL its
//! `[server] host_id` is `host-<slot>`, so a replacement reclaims its own dead generation at once while
//! the other slots, other hosts, wait for the lease. A paused process is not a dead one: its replacement
//! (same host, but the paused pid is alive) waits for the lease like every other host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{client, DRAIN_DEADLINE_MS, HANDOFF_BUDGET_MS, HEARTBEAT_MS, LEASE_MS};
use crate::child::ChildServer;
use crate::shared_db::DbSpec;

/// The faults, as the JSON line names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fault {
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
    pub const ALL: [Fault; 4] = [Fault::Kill, Fault::Crash, Fault::Pause, Fault::Term];

    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Kill => "kill9",
            Fault::Crash => "crash",
            Fault::Pause => "pause",
            Fault::Term => "term",
        }
    }
}

/// The slots' processes as the clients see them, and how to start one more.
pub(super) struct Fleet {
    exe: PathBuf,
    /// The data dir every child shares: workspaces, logs, and the SQLite database.
    pub data: PathBuf,
    db: DbSpec,
    env: Vec<(String, String)>,
    /// Each slot's address, `None` while its process is down. A std `Mutex`: held only to copy.
    addrs: Mutex<Vec<Option<String>>>,
    /// Children started so far; numbers their log files.
    started: AtomicUsize,
}

impl Fleet {
    pub fn new(data: &Path, db: &DbSpec, processes: usize) -> anyhow::Result<Fleet> {
        let common = [
            ("SWITCHBOARD_LEDGER__LEASE_MS", LEASE_MS.to_string()),
            ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", HEARTBEAT_MS.to_string()),
            (
                "SWITCHBOARD_DRAIN__HANDOFF_BUDGET_MS",
                HANDOFF_BUDGET_MS.to_string(),
            ),
            (
                "SWITCHBOARD_DRAIN__DEADLINE_MS",
                DRAIN_DEADLINE_MS.to_string(),
            ),
            // Retention must never trim a run the verifier is looking for.
            ("SWITCHBOARD_HISTORY__MAX_RUNS", "20000".to_owned()),
            ("SWITCHBOARD_HISTORY__MAX_BYTES", (8u64 << 30).to_string()),
            // SQLite: process crashes lose nothing under WAL + NORMAL; only power loss would.
            ("SWITCHBOARD_STORAGE__SYNCHRONOUS", "normal".to_owned()),
        ];
        let mut env: Vec<(String, String)> =
            common.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        env.extend(db.env());
        Ok(Fleet {
            exe: std::env::current_exe().context("find this executable")?,
            data: data.to_path_buf(),
            db: db.clone(),
            env,
            addrs: Mutex::new(vec![None; processes]),
            started: AtomicUsize::new(0),
        })
    }

    /// Start one more `serve` child for `slot` (blocking until it listens), its log in `logs/`; on
    /// PostgreSQL as host `host-<slot>`.
    pub fn spawn(&self, slot: usize) -> anyhow::Result<ChildServer> {
        let k = self.started.fetch_add(1, Ordering::SeqCst);
        let log = self
            .data
            .join("logs")
            .join(format!("child-{k:04}-slot{slot}.log"));
        let host = format!("host-{slot}");
        let mut env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if matches!(self.db, DbSpec::Postgres { .. }) {
            env.push(("SWITCHBOARD_SERVER__HOST_ID", &host));
        }
        ChildServer::start_logged(&self.exe, &self.data, &env, Some(&log))
            .with_context(|| format!("start child {k} (slot {slot})"))
    }

    /// More environment for every child started from now on.
    pub fn add_env(&mut self, env: Vec<(String, String)>) {
        self.env.extend(env);
    }

    pub fn set(&self, slot: usize, addr: Option<String>) {
        self.addrs.lock().unwrap_or_else(|p| p.into_inner())[slot] = addr;
    }

    pub fn live_addrs(&self) -> Vec<String> {
        self.addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .cloned()
            .collect()
    }
}

/// Run blocking child work (signals, waits, starts) off the runtime's thread.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("join a blocking task")
}

/// What the fault driver saw besides the faults themselves.
#[derive(Debug, Default)]
pub(super) struct FaultLog {
    pub by_kind: BTreeMap<Fault, usize>,
    /// A SIGTERM'd process that did not exit 0 within the drain deadline (and a margin).
    pub drain_failures: usize,
    /// A process that exited without being faulted.
    pub unexpected_exits: usize,
    /// `/admin/crash` that did not end the process (it was killed instead).
    pub crash_fallbacks: usize,
    /// A pause that could not find a moment outside a write transaction (skipped).
    pub pauses_skipped: usize,
    /// One line per drain failure and unexpected exit (violations).
    pub details: Vec<String>,
    /// One line per crash fallback and skipped pause.
    pub notes: Vec<String>,
}

/// Replace a slot's process: start a fresh child on the same database.
async fn restart(
    fleet: &Arc<Fleet>,
    children: &mut [Option<ChildServer>],
    slot: usize,
) -> anyhow::Result<()> {
    fleet.set(slot, None);
    children[slot] = None;
    let f = fleet.clone();
    let child = blocking(move || f.spawn(slot)).await??;
    fleet.set(slot, Some(child.addr.clone()));
    children[slot] = Some(child);
    Ok(())
}

/// Restart every slot whose process exited on its own, counting it.
async fn check_exits(
    fleet: &Arc<Fleet>,
    children: &mut [Option<ChildServer>],
    log: &mut FaultLog,
) -> anyhow::Result<()> {
    for slot in 0..children.len() {
        let exited = children[slot].as_mut().and_then(ChildServer::try_exit);
        if let Some(code) = exited {
            log.unexpected_exits += 1;
            log.details.push(format!(
                "slot {slot}: the process exited on its own (code {code}); restarted"
            ));
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
            Some(code) => Some(format!(
                "pid {}: the continued process exited {code} after SIGTERM",
                child.pid()
            )),
            None => Some(format!(
                "pid {}: the continued process did not exit after SIGTERM; killed",
                child.pid()
            )),
        }
    })
    .await
    .unwrap_or_else(|e| Some(format!("{e:#}")))
}

/// Land `faults` faults at seeded-random moments, restarting each faulted process.
pub(super) async fn drive_faults(
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
        let Some(mut child) = children[slot].take() else {
            anyhow::bail!("slot {slot} has no process")
        };
        match fault {
            Fault::Kill => {
                blocking(move || {
                    let _ = child.signal("-KILL");
                    child.wait_exit(Duration::from_secs(10));
                })
                .await?;
            }
            Fault::Crash => {
                let answered = http
                    .post(child.url("/admin/crash"))
                    .json(&json!({}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16());
                let (code, child) =
                    blocking(move || (child.wait_exit(Duration::from_secs(10)), child)).await?;
                if code != Some(137) {
                    log.crash_fallbacks += 1;
                    log.notes.push(format!("slot {slot}: /admin/crash answered {answered:?}, exit {code:?}; killed instead"));
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
                    let code = child.wait_exit(
                        Duration::from_millis(DRAIN_DEADLINE_MS) + Duration::from_secs(20),
                    );
                    (code, child.pid())
                })
                .await?;
                if code != Some(0) {
                    log.drain_failures += 1;
                    log.details.push(format!(
                        "slot {slot} (pid {pid}): SIGTERM drain ended with {code:?}, not exit 0"
                    ));
                }
            }
            Fault::Pause => {
                let f = fleet.clone();
                let (paused_ok, child) =
                    blocking(move || (f.db.pause_outside_transaction(&child, &f.data), child))
                        .await?;
                match paused_ok {
                    Ok(()) => {
                        // The replacement takes the slot at once; the paused process's runs come to it
                        // (or another process) when its lease runs out.
                        let pause = Duration::from_millis(
                            LEASE_MS + rng.random_range(500..LEASE_MS + 1000),
                        );
                        paused.push(tokio::spawn(retire_paused(child, pause)));
                    }
                    Err(e) => {
                        log.pauses_skipped += 1;
                        log.notes.push(format!("slot {slot}: no pause: {e:#}"));
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
