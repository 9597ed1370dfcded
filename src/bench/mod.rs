//! `switchboard bench <scenario>`: measurements against the physical limit (SPEC §11).
//!
//! Each scenario prints a human table and one JSON line (`scenario, runs_per_s, p50_ms, p99_ms, max_ms,
//! n, concurrency`, plus its own fields) and works in a temp data dir with the committed defaults unless
//! flags say otherwise. Benchmarks are reports, never gates: nothing here asserts a speed.
//!
//! `runs` and `sse` also run on PostgreSQL (`--storage postgres`): on a throwaway cluster this bench
//! starts ([`SharedDb`]; tuned for throwaway data, `fsync = off`) or on the database `--storage-url`
//! names. `sse` on PostgreSQL is cross-host: the run lives on one `serve` process and every subscriber
//! reads from a second one, of another `host_id`, on the same database.

use std::path::Path;
use std::time::{Duration, Instant};
use storage::RunId;

use anyhow::Context;
use serde_json::{json, Value};
use storage::ledger::{Admit, Promotion, StepRecord, Turn};
use storage::{BackendSpec, StorageHandle, Synchronous};

use crate::shared_db::{SharedDb, StorageChoice};

mod remote;
mod served;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// `steps`, `runs`, `sse`, `stalled`, `recovery`, `idle`, `commits`, `soak` or `all` (every one but
    /// `soak`).
    pub scenario: String,
    /// Drive the server already running at this base URL (`runs`, `sse`, `idle`, `soak`) rather than a
    /// child this bench starts; its memory and CPU are read from `/proc` when it runs on this machine.
    #[arg(long)]
    pub url: Option<String>,
    /// Iterations (runs, steps, crashes, parked runs) for one configuration.
    #[arg(long)]
    pub n: Option<usize>,
    /// Concurrent clients (`runs`), subscribers (`sse`), stalled viewers (`stalled`).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// `full` or `normal` (steps: both when absent).
    #[arg(long)]
    pub synchronous: Option<String>,
    /// `runs`, `sse`: the database of the server this bench starts (postgres: a throwaway cluster this
    /// bench starts and stops, with fsync off, unless --storage-url names one; `sse` then runs cross-host).
    #[arg(long, value_enum, default_value_t = StorageChoice::Sqlite)]
    pub storage: StorageChoice,
    /// With --storage postgres: use this existing database (postgres://user@host:port/db) instead of a
    /// throwaway cluster; the bench's runs stay in it.
    #[arg(long, value_name = "URL")]
    pub storage_url: Option<String>,
}

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Summary {
    p50: f64,
    p99: f64,
    max: f64,
}

fn summarize(mut ms: Vec<f64>) -> Summary {
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| {
        ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Summary {
        p50: at(0.50),
        p99: at(0.99),
        max: ms.last().copied().unwrap_or(0.0),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn report(table: &[(&str, String)], line: Value) {
    println!();
    for (k, v) in table {
        println!("  {k:<28} {v}");
    }
    println!("{line}");
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let scenarios: Vec<&str> = match args.scenario.as_str() {
        "all" => vec!["steps", "runs", "commits", "sse", "stalled", "recovery", "idle"],
        s @ ("steps" | "runs" | "commits" | "sse" | "stalled" | "recovery" | "idle" | "soak") => vec![s],
        other => anyhow::bail!("unknown scenario {other:?}: use steps, runs, commits, sse, stalled, recovery, idle, soak or all"),
    };
    if args.storage != StorageChoice::Sqlite || args.storage_url.is_some() {
        anyhow::ensure!(
            scenarios.iter().all(|s| matches!(*s, "runs" | "sse")),
            "--storage postgres applies to `runs` and `sse` only"
        );
        anyhow::ensure!(
            args.url.is_none(),
            "--storage chooses the database of a server this bench starts: drop --url"
        );
    }
    // Started before any runtime and dropped after them: the cluster outlives every child.
    let db = SharedDb::open(args.storage, args.storage_url.as_deref())?;
    for s in scenarios {
        match s {
            "steps" => steps(&args)?,
            "runs" => served::runs(&args, &db)?,
            "commits" => served::commits(&args)?,
            "sse" => served::sse(&args, &db)?,
            "stalled" => served::stalled(&args)?,
            "recovery" => recovery(&args)?,
            "idle" => served::idle(&args)?,
            _ => served::soak(&args)?,
        }
    }
    Ok(())
}

fn synchronous_modes(args: &BenchArgs) -> anyhow::Result<Vec<Synchronous>> {
    Ok(match args.synchronous.as_deref() {
        None => vec![Synchronous::Full, Synchronous::Normal],
        Some("full") => vec![Synchronous::Full],
        Some("normal") => vec![Synchronous::Normal],
        Some(o) => anyhow::bail!("--synchronous {o:?}: use full or normal"),
    })
}

/// Durable step latency (transcript turn + step record through the storage actor) beside raw SQLite
/// single-row transactions ([`storage::sqlite::raw_commit_latencies`]) on the same file system with the same `synchronous`.
fn steps(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.n.unwrap_or(2000);
    for sync in synchronous_modes(args)? {
        let dir = tempfile::tempdir().context("create a temp dir")?;
        let raw = storage::sqlite::raw_commit_latencies(&dir.path().join("raw.db"), sync, n)?
            .into_iter()
            .map(ms)
            .collect();
        let path = dir.path().join("bench.db");
        let durable = actix_web::rt::System::new().block_on(durable_steps(path, sync, n))?;
        let (d, r) = (summarize(durable.clone()), summarize(raw));
        let total: f64 = durable.iter().sum();
        let mode = if sync == Synchronous::Full {
            "full"
        } else {
            "normal"
        };
        report(
            &[
                ("scenario", format!("steps (synchronous = {mode})")),
                (
                    "durable step p50 / p99 / max",
                    format!("{:.3} / {:.3} / {:.3} ms", d.p50, d.p99, d.max),
                ),
                (
                    "raw commit p50 / p99",
                    format!("{:.3} / {:.3} ms", r.p50, r.p99),
                ),
                (
                    "ratio p50 / p99",
                    format!("{:.2} / {:.2}", d.p50 / r.p50, d.p99 / r.p99),
                ),
                (
                    "steps/s (one writer)",
                    format!("{:.0}", n as f64 / (total / 1000.0)),
                ),
            ],
            json!({"scenario": "steps", "synchronous": mode, "runs_per_s": n as f64 / (total / 1000.0),
                "p50_ms": d.p50, "p99_ms": d.p99, "max_ms": d.max, "n": n, "concurrency": 1,
                "raw_p50_ms": r.p50, "raw_p99_ms": r.p99, "ratio_p50": d.p50 / r.p50, "ratio_p99": d.p99 / r.p99}),
        );
    }
    Ok(())
}

async fn durable_steps(
    path: std::path::PathBuf,
    sync: Synchronous,
    n: usize,
) -> anyhow::Result<Vec<f64>> {
    let storage = StorageHandle::start(
        BackendSpec::Sqlite {
            path,
            synchronous: sync,
        },
        storage::clock::system(),
    );
    let gen = "20260101T000000Z-00000bec".to_owned();
    let run = "bench-run".to_owned();
    let admit = Admit {
        thread_key: "bench:t".into(),
        gen: gen.clone(),
        run_id: RunId::from(run.clone()),
        request: json!({"text": "bench"}),
        meta: json!({"agent": "demo", "request": {"text": "bench"}}),
        key: None,
        lease_ms: 3_600_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    storage.admit(admit, storage.clock().now_ms()).await?;
    let promotion = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 3_600_000,
    };
    storage
        .claim(RunId::from(run.clone()), gen.clone(), promotion)
        .await?
        .map_err(|r| anyhow::anyhow!("{r}"))?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let turn = Turn {
            role: "assistant".into(),
            parts: vec![json!({"type": "text", "text": format!("step {i}")})],
        };
        let record = StepRecord {
            step: i + 1,
            seq: i,
            turn_index: i + 1,
            in_flight: vec![],
            inbox_consumed_seq: None,
            remaining_ms: 1,
            turn: i + 1,
            iteration: i + 1,
        };
        let t = Instant::now();
        storage
            .durable_step(
                RunId::from(run.clone()),
                gen.clone(),
                i,
                vec![turn],
                record,
                Vec::new(),
            )
            .await?
            .map_err(|r| anyhow::anyhow!("{r}"))?;
        out.push(ms(t.elapsed()));
    }
    Ok(out)
}

/// Crash-to-resumed time over repeated crashes (same-host fast reclaim, then lease expiry), and duplicate
/// executions of mutating calls (each `append_file` line must appear at most once).
///
/// The crashed run is found again in the live ledger or, once it has finished, in the store: a resumed
/// run often finishes before its `resumed` note is flushed to the ledger, and the record is then the only
/// place the note is (read at the current time, so retention does not hide it). Every child logs to
/// `<data>/logs/`; when a mode fails its data dir is kept and the path printed.
fn recovery(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.n.unwrap_or(10);
    let exe = std::env::current_exe()?;
    let mut results = Vec::new();
    for (mode, env) in [
        ("fast_reclaim", vec![]),
        (
            "lease_expiry",
            vec![
                ("SWITCHBOARD_LEDGER__LEASE_MS", "1000"),
                ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "250"),
            ],
        ),
    ] {
        let dir = tempfile::Builder::new()
            .prefix("switchboard-recovery-")
            .tempdir()?;
        match recovery_mode(&exe, dir.path(), mode, &env, n) {
            Ok(duplicates) => results.push(duplicates),
            Err(e) => {
                let kept = dir.keep();
                eprintln!(
                    "bench recovery ({mode}) failed; child logs kept in {}",
                    kept.join("logs").display()
                );
                return Err(e.context(format!(
                    "recovery ({mode}); data dir kept at {}",
                    kept.display()
                )));
            }
        }
    }
    anyhow::ensure!(results.iter().all(|d| *d == 0), "a mutating call ran twice");
    Ok(())
}

/// One mode of [`recovery`] on `data`: answers the duplicate mutating calls it counted.
fn recovery_mode(
    exe: &Path,
    data: &Path,
    mode: &str,
    env: &[(&str, &str)],
    n: usize,
) -> anyhow::Result<usize> {
    use crate::child::ChildServer;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let post = |p: &ChildServer, path: &str, body: Value| -> anyhow::Result<Value> {
        rt.block_on(async {
            Ok(client
                .post(p.url(path))
                .json(&body)
                .send()
                .await?
                .json::<Value>()
                .await
                .unwrap_or(Value::Null))
        })
    };
    let mut started = 0;
    let mut start = || -> anyhow::Result<ChildServer> {
        started += 1;
        ChildServer::start_logged(
            exe,
            data,
            env,
            Some(&data.join("logs").join(format!("child-{started:03}.log"))),
        )
    };
    let db = data.join("switchboard.db");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    };
    // `None`: no live row (or the database could not be read this time).
    let live = |id: &str| -> Option<Vec<Value>> {
        storage::SqliteStore::open(&db, Synchronous::Normal)
            .ok()
            .and_then(|mut s| {
                storage::ledger::RunLedger::live_events(&mut s, &RunId::from(id), 0, 100_000)
                    .ok()
                    .flatten()
            })
    };
    // The final record's events (`None` while there is none, or only the provisional tombstone).
    let finished = |id: &str| -> Option<Vec<Value>> {
        storage::SqliteStore::open(&db, Synchronous::Normal)
            .ok()
            .and_then(|mut s| {
                storage::RunStore::get(&mut s, &RunId::from(id), now())
                    .ok()
                    .flatten()
            })
            .filter(|r| !r.head.provisional)
            .map(|r| r.events)
    };
    let wait = |what: &str, f: &mut dyn FnMut() -> bool| -> anyhow::Result<()> {
        let until = Instant::now() + Duration::from_secs(60);
        while !f() {
            anyhow::ensure!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    };
    let mut times = Vec::new();
    let mut ids = Vec::new();
    let mut current = start()?;
    for i in 0..n {
        let body = post(
            &current,
            "/api/messages",
            json!({"thread": format!("rec{i}"), "channel": "bench", "user": "u",
            "text": "steps=6 ms=150 tool=append_file"}),
        )?;
        let id = body["runId"]
            .as_str()
            .with_context(|| format!("runId in {body}"))?
            .to_owned();
        wait(&format!("a durable step of run {id}"), &mut || {
            live(&id).is_some_and(|events| events.iter().any(|e| e["type"] == "tool_result"))
        })?;
        let crashed_at = now();
        let mut old = current;
        if mode == "fast_reclaim" {
            post(&old, "/admin/crash", json!({}))?;
            old.wait_exit(Duration::from_secs(10));
        } else {
            old.pause_outside_transaction(&db)?;
        }
        current = start()?;
        // Crash-to-resumed: the `resumed` note's own stamp, read back once the run is durable.
        let mut resumed_at = None;
        wait(&format!("the resumed note of run {id}"), &mut || {
            let note = |events: Vec<Value>| {
                events
                    .into_iter()
                    .find(|e| e["type"] == "resumed")
                    .and_then(|e| e["at"].as_i64())
            };
            resumed_at = live(&id)
                .and_then(note)
                .or_else(|| finished(&id).and_then(note));
            resumed_at.is_some()
        })?;
        times.push((resumed_at.unwrap_or(crashed_at) - crashed_at) as f64);
        drop(old);
        ids.push(id);
    }
    // Let every run finish, then count duplicated mutating effects.
    let mut duplicates = 0;
    for id in &ids {
        wait(&format!("run {id} to finish"), &mut || {
            finished(id).is_some() && live(id).is_none()
        })?;
        let log = std::fs::read_to_string(data.join("workspaces").join(id).join("steps.log"))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let unique: std::collections::HashSet<&&str> = lines.iter().collect();
        duplicates += lines.len() - unique.len();
    }
    drop(current);
    let s = summarize(times);
    report(
        &[
            ("scenario", format!("recovery ({mode}, {n} crashes)")),
            (
                "crash-to-resumed p50 / p99 / max",
                format!("{:.0} / {:.0} / {:.0} ms", s.p50, s.p99, s.max),
            ),
            ("duplicate mutating calls", duplicates.to_string()),
        ],
        json!({"scenario": "recovery", "mode": mode, "runs_per_s": 0.0, "p50_ms": s.p50, "p99_ms": s.p99,
            "max_ms": s.max, "n": n, "concurrency": 1, "duplicates": duplicates,
            "lease_ms": if mode == "fast_reclaim" { 30000 } else { 1000 }}),
    );
    Ok(duplicates)
}
