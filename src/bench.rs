//! `switchboard bench <scenario>`: measurements against the physical limit (SPEC §11).
//!
//! Each scenario prints a human table and one JSON line (`scenario, runs_per_s, p50_ms, p99_ms, max_ms,
//! n, concurrency`, plus its own fields) and works in a temp data dir with the committed defaults unless
//! flags say otherwise. Benchmarks are reports, never gates: nothing here asserts a speed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};
use storage::ledger::{Admit, Promotion, StepRecord, Turn};
use storage::{BackendSpec, StorageHandle, Synchronous};

use crate::Config;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// `steps`, `runs`, `sse`, `recovery`, `idle` or `all`.
    pub scenario: String,
    /// Iterations (runs, steps, crashes, parked runs) for one configuration.
    #[arg(long)]
    pub n: Option<usize>,
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// `full` or `normal` (steps: both when absent).
    #[arg(long)]
    pub synchronous: Option<String>,
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
    let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    Summary { p50: at(0.50), p99: at(0.99), max: ms.last().copied().unwrap_or(0.0) }
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

/// Peak resident memory of this process (KiB), from `/proc/self/status`.
pub fn peak_rss_kib() -> u64 {
    status_kib("VmHWM:")
}

/// Current resident memory of this process (KiB).
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let scenarios: Vec<&str> = match args.scenario.as_str() {
        "all" => vec!["steps", "runs", "sse", "recovery", "idle"],
        s @ ("steps" | "runs" | "sse" | "recovery" | "idle") => vec![s],
        other => anyhow::bail!("unknown scenario {other:?}: use steps, runs, sse, recovery, idle or all"),
    };
    for s in scenarios {
        match s {
            "steps" => steps(&args)?,
            "runs" => runs(&args)?,
            "sse" => sse(&args)?,
            "recovery" => recovery(&args)?,
            _ => idle(&args)?,
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

/// Durable step latency (transcript turn + step record through the storage actor) beside raw rusqlite
/// single-row transactions on the same file system with the same `synchronous`.
fn steps(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.n.unwrap_or(2000);
    for sync in synchronous_modes(args)? {
        let dir = tempfile::tempdir().context("create a temp dir")?;
        let raw = raw_commits(&dir.path().join("raw.db"), sync, n)?;
        let path = dir.path().join("bench.db");
        let durable = actix_web::rt::System::new().block_on(durable_steps(path, sync, n))?;
        let (d, r) = (summarize(durable.clone()), summarize(raw));
        let total: f64 = durable.iter().sum();
        let mode = if sync == Synchronous::Full { "full" } else { "normal" };
        report(
            &[
                ("scenario", format!("steps (synchronous = {mode})")),
                ("durable step p50 / p99 / max", format!("{:.3} / {:.3} / {:.3} ms", d.p50, d.p99, d.max)),
                ("raw commit p50 / p99", format!("{:.3} / {:.3} ms", r.p50, r.p99)),
                ("ratio p50 / p99", format!("{:.2} / {:.2}", d.p50 / r.p50, d.p99 / r.p99)),
                ("steps/s (one writer)", format!("{:.0}", n as f64 / (total / 1000.0))),
            ],
            json!({"scenario": "steps", "synchronous": mode, "runs_per_s": n as f64 / (total / 1000.0),
                "p50_ms": d.p50, "p99_ms": d.p99, "max_ms": d.max, "n": n, "concurrency": 1,
                "raw_p50_ms": r.p50, "raw_p99_ms": r.p99, "ratio_p50": d.p50 / r.p50, "ratio_p99": d.p99 / r.p99}),
        );
    }
    Ok(())
}

fn raw_commits(path: &Path, sync: Synchronous, n: usize) -> anyhow::Result<Vec<f64>> {
    let conn = rusqlite::Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", if sync == Synchronous::Full { "FULL" } else { "NORMAL" })?;
    conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        conn.execute("INSERT INTO t (k, v) VALUES (?1, ?2)", rusqlite::params![i as i64, "step"])?;
        conn.execute_batch("COMMIT")?;
        out.push(ms(t.elapsed()));
    }
    Ok(out)
}

async fn durable_steps(path: std::path::PathBuf, sync: Synchronous, n: usize) -> anyhow::Result<Vec<f64>> {
    let storage = StorageHandle::start(BackendSpec::Sqlite { path, synchronous: sync }, storage::clock::system());
    let gen = "20260101T000000Z-00000bec".to_owned();
    let run = "bench-run".to_owned();
    let admit = Admit {
        thread_key: "bench:t".into(),
        gen: gen.clone(),
        run_id: run.clone(),
        request: json!({"text": "bench"}),
        meta: json!({"agent": "demo", "request": {"text": "bench"}}),
        key: None,
        lease_ms: 3_600_000,
    };
    storage.admit(admit, storage.clock().now_ms()).await?;
    let promotion = Promotion { system_text: "s".into(), tools: json!([]), state: Default::default(), lease_ms: 3_600_000 };
    storage.claim(run.clone(), gen.clone(), promotion).await?.map_err(|r| anyhow::anyhow!("{r}"))?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let turn = Turn { role: "assistant".into(), parts: vec![json!({"type": "text", "text": format!("step {i}")})] };
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
        storage.durable_step(run.clone(), gen.clone(), i, vec![turn], record, Vec::new()).await?.map_err(|r| anyhow::anyhow!("{r}"))?;
        out.push(ms(t.elapsed()));
    }
    Ok(out)
}

/// The committed default configuration over a temp data dir on a free port.
fn bench_config(dir: &Path) -> anyhow::Result<Config> {
    let mut config = Config::parse(crate::config::EMBEDDED_NAME, crate::config::EMBEDDED, Vec::new())?;
    config.server.bind = "127.0.0.1:0".into();
    config.storage.path = dir.join("switchboard.db");
    Ok(config)
}

/// End-to-end short runs through the HTTP admission route until each record has landed.
fn runs(args: &BenchArgs) -> anyhow::Result<()> {
    let presets = match (args.n, args.concurrency) {
        (None, None) => vec![(300, 1), (1000, 16), (2000, 256)],
        (n, c) => vec![(n.unwrap_or(1000), c.unwrap_or(16))],
    };
    for (n, concurrency) in presets {
        let dir = tempfile::tempdir()?;
        let config = bench_config(dir.path())?;
        let (lat, wall) = actix_web::rt::System::new().block_on(async move {
            let running = crate::start(config).await?;
            let url = format!("http://{}/api/messages", running.addr);
            let registry = running.registry.clone();
            let client = reqwest::Client::new();
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let started = Instant::now();
            let workers: Vec<_> = (0..concurrency)
                .map(|_| {
                    let (client, url, registry, next) = (client.clone(), url.clone(), registry.clone(), next.clone());
                    actix_web::rt::spawn(async move {
                        let mut lat = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= n {
                                return Ok::<_, anyhow::Error>(lat);
                            }
                            let t = Instant::now();
                            let body: Value = client
                                .post(&url)
                                .json(&json!({"thread": format!("b{i}"), "channel": "bench", "user": "u", "text": "steps=3 ms=0 think_ms=0"}))
                                .send()
                                .await?
                                .json()
                                .await?;
                            let id = body["runId"].as_str().context("runId")?.to_owned();
                            while !registry.row(&id).is_some_and(|r| r.persisted) {
                                tokio::time::sleep(Duration::from_micros(500)).await;
                            }
                            lat.push(ms(t.elapsed()));
                        }
                    })
                })
                .collect();
            let mut lat = Vec::new();
            for w in workers {
                lat.extend(w.await??);
            }
            let wall = started.elapsed();
            running.stop().await?;
            Ok::<_, anyhow::Error>((lat, wall))
        })?;
        let s = summarize(lat);
        let rps = n as f64 / wall.as_secs_f64();
        let rss = peak_rss_kib();
        report(
            &[
                ("scenario", format!("runs (n = {n}, concurrency = {concurrency})")),
                ("runs/s", format!("{rps:.0}")),
                ("latency p50 / p99 / max", format!("{:.1} / {:.1} / {:.1} ms", s.p50, s.p99, s.max)),
                ("peak RSS (server + client)", format!("{:.1} MiB", rss as f64 / 1024.0)),
            ],
            json!({"scenario": "runs", "runs_per_s": rps, "p50_ms": s.p50, "p99_ms": s.p99, "max_ms": s.max,
                "n": n, "concurrency": concurrency, "peak_rss_mib": rss as f64 / 1024.0}),
        );
    }
    Ok(())
}

/// Resident memory per parked live run: runs waiting on a long tool.
fn idle(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.n.unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let mut config = bench_config(dir.path())?;
    config.storage.synchronous = crate::config::SynchronousSetting::Normal;
    let (before, after, took) = actix_web::rt::System::new().block_on(async move {
        let running = crate::start(config).await?;
        let url = format!("http://{}/api/messages", running.addr);
        let client = reqwest::Client::new();
        let before = rss_kib();
        let started = Instant::now();
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let posts = chunk.iter().map(|i| {
                client
                    .post(&url)
                    .json(&json!({"thread": format!("idle{i}"), "channel": "bench", "user": "u", "text": "steps=1 ms=3600000"}))
                    .send()
            });
            for r in futures_util::future::join_all(posts).await {
                anyhow::ensure!(r?.status().as_u16() == 202, "admission refused");
            }
        }
        // Parked: every run has published its tool call and waits on the tool.
        while running.registry.rows().iter().filter(|r| r.event_count >= 4).count() < n {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let took = started.elapsed();
        let after = rss_kib();
        running.stop().await?;
        Ok::<_, anyhow::Error>((before, after, took))
    })?;
    let per_run = (after.saturating_sub(before)) as f64 * 1024.0 / n as f64;
    report(
        &[
            ("scenario", format!("idle ({n} parked runs)")),
            ("RSS before / after", format!("{:.1} / {:.1} MiB", before as f64 / 1024.0, after as f64 / 1024.0)),
            ("per parked run", format!("{:.1} KiB", per_run / 1024.0)),
            ("admitted and parked in", format!("{:.1} s", took.as_secs_f64())),
        ],
        json!({"scenario": "idle", "runs_per_s": n as f64 / took.as_secs_f64(), "p50_ms": 0.0, "p99_ms": 0.0,
            "max_ms": 0.0, "n": n, "concurrency": 64, "bytes_per_run": per_run}),
    );
    Ok(())
}

/// SSE fan-out: `n` subscribers on one live run while it publishes 2,000 events; delivery lag from
/// publish to receipt (both clocks are this process's) and memory per subscriber.
fn sse(args: &BenchArgs) -> anyhow::Result<()> {
    use futures_util::StreamExt;
    let subscribers = args.concurrency.unwrap_or(1000);
    let events = args.n.unwrap_or(2000);
    let dir = tempfile::tempdir()?;
    let config = bench_config(dir.path())?;
    let (lags, per_sub, delivered) = actix_web::rt::System::new().block_on(async move {
        let running = crate::start(config).await?;
        let client = reqwest::Client::builder().pool_max_idle_per_host(subscribers + 16).build()?;
        let body: Value = client
            .post(format!("http://{}/api/messages", running.addr))
            .json(&json!({"thread": "sse", "channel": "bench", "user": "u", "text": "steps=1 ms=3600000"}))
            .send()
            .await?
            .json()
            .await?;
        let id = body["runId"].as_str().context("runId")?.to_owned();
        while running.registry.row(&id).is_none_or(|r| r.event_count < 4) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let epoch = Instant::now();
        let before = rss_kib();
        let after_seq = running.registry.last_seq(&id).unwrap_or(0);
        let connected = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut readers = Vec::with_capacity(subscribers);
        for _ in 0..subscribers {
            let url = format!("http://{}/api/runs/{id}/stream?afterSeq={after_seq}", running.addr);
            let (client, connected) = (client.clone(), connected.clone());
            readers.push(actix_web::rt::spawn(async move {
                let res = client.get(url).send().await?;
                connected.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut stream = res.bytes_stream();
                let (mut buf, mut lags) = (String::new(), Vec::with_capacity(events));
                while lags.len() < events {
                    let Some(chunk) = stream.next().await else { break };
                    buf.push_str(&String::from_utf8_lossy(&chunk?));
                    while let Some(end) = buf.find("\n\n") {
                        let frame: String = buf.drain(..end + 2).collect();
                        if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                            if let Ok(v) = serde_json::from_str::<Value>(data) {
                                if let Some(sent) = v["sentUs"].as_u64() {
                                    lags.push((epoch.elapsed().as_micros() as u64).saturating_sub(sent) as f64 / 1000.0);
                                }
                            }
                        }
                    }
                }
                Ok::<_, anyhow::Error>(lags)
            }));
        }
        while connected.load(std::sync::atomic::Ordering::SeqCst) < subscribers {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Every stream is registered with the run before the first event is published.
        while running.registry.subscriber_count() < subscribers {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let per_sub = (rss_kib().saturating_sub(before)) as f64 * 1024.0 / subscribers as f64;
        for i in 0..events {
            let sent = epoch.elapsed().as_micros() as u64;
            running.registry.publish(&id, json!({"type": "note", "kind": "bench", "summary": format!("event {i}"), "sentUs": sent}));
            // A steady 200 events/s (a busy run), so lag measures delivery rather than a backlog.
            if i % 10 == 9 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut lags = Vec::new();
        let mut delivered = 0;
        for r in readers {
            let l = r.await??;
            delivered += l.len();
            lags.extend(l);
        }
        running.stop().await?;
        Ok::<_, anyhow::Error>((lags, per_sub, delivered))
    })?;
    let s = summarize(lags);
    report(
        &[
            ("scenario", format!("sse ({subscribers} subscribers, {events} events)")),
            ("delivered", format!("{delivered} of {}", subscribers * events)),
            ("lag p50 / p99 / max", format!("{:.2} / {:.2} / {:.2} ms", s.p50, s.p99, s.max)),
            ("memory per subscriber", format!("{:.1} KiB (server + client)", per_sub / 1024.0)),
        ],
        json!({"scenario": "sse", "runs_per_s": 0.0, "p50_ms": s.p50, "p99_ms": s.p99, "max_ms": s.max, "n": events,
            "concurrency": subscribers, "delivered": delivered, "bytes_per_subscriber": per_sub}),
    );
    Ok(())
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
        ("lease_expiry", vec![("SWITCHBOARD_LEDGER__LEASE_MS", "1000"), ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "250")]),
    ] {
        let dir = tempfile::Builder::new().prefix("switchboard-recovery-").tempdir()?;
        match recovery_mode(&exe, dir.path(), mode, &env, n) {
            Ok(duplicates) => results.push(duplicates),
            Err(e) => {
                let kept = dir.keep();
                eprintln!("bench recovery ({mode}) failed; child logs kept in {}", kept.join("logs").display());
                return Err(e.context(format!("recovery ({mode}); data dir kept at {}", kept.display())));
            }
        }
    }
    anyhow::ensure!(results.iter().all(|d| *d == 0), "a mutating call ran twice");
    Ok(())
}

/// One mode of [`recovery`] on `data`: answers the duplicate mutating calls it counted.
fn recovery_mode(exe: &Path, data: &Path, mode: &str, env: &[(&str, &str)], n: usize) -> anyhow::Result<usize> {
    use crate::child::ChildServer;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client = reqwest::Client::builder().no_proxy().build()?;
    let post = |p: &ChildServer, path: &str, body: Value| -> anyhow::Result<Value> {
        rt.block_on(async { Ok(client.post(p.url(path)).json(&body).send().await?.json::<Value>().await.unwrap_or(Value::Null)) })
    };
    let mut started = 0;
    let mut start = || -> anyhow::Result<ChildServer> {
        started += 1;
        ChildServer::start_logged(exe, data, env, Some(&data.join("logs").join(format!("child-{started:03}.log"))))
    };
    let db = data.join("switchboard.db");
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    // `None`: no live row (or the database could not be read this time).
    let live = |id: &str| -> Option<Vec<Value>> {
        storage::SqliteStore::open(&db, Synchronous::Normal)
            .ok()
            .and_then(|mut s| storage::ledger::RunLedger::live_events(&mut s, id, 0, 100_000).ok().flatten())
    };
    // The final record's events (`None` while there is none, or only the provisional tombstone).
    let finished = |id: &str| -> Option<Vec<Value>> {
        storage::SqliteStore::open(&db, Synchronous::Normal)
            .ok()
            .and_then(|mut s| storage::RunStore::get(&mut s, id, now()).ok().flatten())
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
        let body = post(&current, "/api/messages", json!({"thread": format!("rec{i}"), "channel": "bench", "user": "u",
            "text": "steps=6 ms=150 tool=append_file"}))?;
        let id = body["runId"].as_str().with_context(|| format!("runId in {body}"))?.to_owned();
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
            let note = |events: Vec<Value>| events.into_iter().find(|e| e["type"] == "resumed").and_then(|e| e["at"].as_i64());
            resumed_at = live(&id).and_then(note).or_else(|| finished(&id).and_then(note));
            resumed_at.is_some()
        })?;
        times.push((resumed_at.unwrap_or(crashed_at) - crashed_at) as f64);
        drop(old);
        ids.push(id);
    }
    // Let every run finish, then count duplicated mutating effects.
    let mut duplicates = 0;
    for id in &ids {
        wait(&format!("run {id} to finish"), &mut || finished(id).is_some() && live(id).is_none())?;
        let log = std::fs::read_to_string(data.join("workspaces").join(id).join("steps.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let unique: std::collections::HashSet<&&str> = lines.iter().collect();
        duplicates += lines.len() - unique.len();
    }
    drop(current);
    let s = summarize(times);
    report(
        &[
            ("scenario", format!("recovery ({mode}, {n} crashes)")),
            ("crash-to-resumed p50 / p99 / max", format!("{:.0} / {:.0} / {:.0} ms", s.p50, s.p99, s.max)),
            ("duplicate mutating calls", duplicates.to_string()),
        ],
        json!({"scenario": "recovery", "mode": mode, "runs_per_s": 0.0, "p50_ms": s.p50, "p99_ms": s.p99,
            "max_ms": s.max, "n": n, "concurrency": 1, "duplicates": duplicates,
            "lease_ms": if mode == "fast_reclaim" { 30000 } else { 1000 }}),
    );
    Ok(duplicates)
}
