//! The scenarios that measure a served process from outside (SPEC §11): `runs`, `sse`, `idle`, `commits`
//! and `soak`. Each drives a child `serve` on a temp data dir, or the server at `--url`, from this
//! process; memory and CPU figures are the server's own (on PostgreSQL: the `serve` process's, not the
//! database server's).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::remote::{runtime, Load, ProcStats, Server};
use super::{report, summarize, BenchArgs};
use crate::shared_db::{DbSpec, SharedDb};

/// A short run: three durable steps, no tool latency, no model latency.
const SHORT_RUN: &str = "steps=3 ms=0 think_ms=0";
/// Commits a 3-step run needs without a webhook: the admission with the tombstone, the promotion and the
/// seed; one per step; the finish with the record. SPEC §5.2 step 3 counts 6 with the promotion in a
/// commit of its own, and allows merging any commits no rule orders apart — these two are such.
const CONTRACT_COMMITS_PER_RUN: f64 = 5.0;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn stats_text(s: Option<ProcStats>) -> String {
    s.map_or("n/a (server on another machine)".into(), |s| {
        format!(
            "{:.1} MiB (peak {:.1} MiB)",
            mib(s.rss_kib),
            mib(s.peak_kib)
        )
    })
}

/// The environment of a `serve` child on `db`, as host `host_id` when that is a PostgreSQL database.
fn child_env(db: &SharedDb, host_id: &str) -> Vec<(String, String)> {
    let mut env = db.spec.env();
    if matches!(db.spec, DbSpec::Postgres { .. }) {
        env.push(("SWITCHBOARD_SERVER__HOST_ID".to_owned(), host_id.to_owned()));
    }
    env
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// What the table adds to a scenario's name for a database other than the default SQLite file.
fn on_storage(db: &SharedDb) -> &'static str {
    match (&db.spec, db.is_throwaway()) {
        (DbSpec::Sqlite, _) => "",
        (DbSpec::Postgres { .. }, true) => ", postgres: throwaway cluster, fsync off",
        (DbSpec::Postgres { .. }, false) => ", postgres at --storage-url",
    }
}

/// End-to-end short runs; server RSS and CPU per run.
pub(super) fn runs(args: &BenchArgs, db: &SharedDb) -> anyhow::Result<()> {
    let presets = match (args.n, args.concurrency) {
        (None, None) => vec![(300, 1), (1000, 16), (2000, 256)],
        (n, c) => vec![(n.unwrap_or(1000), c.unwrap_or(16))],
    };
    let rt = runtime()?;
    let env = child_env(db, "bench");
    for (n, concurrency) in presets {
        let load = Load::new(concurrency)?;
        let server = rt.block_on(Server::open(args.url.as_deref(), &borrowed(&env), &load))?;
        let before = server.stats();
        let started = Instant::now();
        let lat = rt.block_on(load.drive(&server.base, 0..n, concurrency, SHORT_RUN))?;
        let wall = started.elapsed();
        let after = server.stats();
        let storage = server.storage.clone();
        server.stop()?;
        let s = summarize(lat);
        let rps = n as f64 / wall.as_secs_f64();
        let cpu_ms = before
            .zip(after)
            .map(|(b, a)| (a.cpu_s - b.cpu_s) * 1000.0 / n as f64);
        report(
            &[
                (
                    "scenario",
                    format!(
                        "runs (n = {n}, concurrency = {concurrency}{})",
                        on_storage(db)
                    ),
                ),
                ("runs/s", format!("{rps:.0}")),
                (
                    "latency p50 / p99 / max",
                    format!("{:.2} / {:.2} / {:.2} ms", s.p50, s.p99, s.max),
                ),
                ("server RSS", stats_text(after)),
                (
                    "server CPU per run",
                    cpu_ms.map_or("n/a".into(), |c| format!("{c:.2} ms")),
                ),
            ],
            json!({"scenario": "runs", "runs_per_s": rps, "p50_ms": s.p50, "p99_ms": s.p99, "max_ms": s.max,
                "n": n, "concurrency": concurrency, "storage": storage, "server_rss_mib": after.map(|a| mib(a.rss_kib)),
                "server_peak_rss_mib": after.map(|a| mib(a.peak_kib)), "server_cpu_ms_per_run": cpu_ms}),
        );
    }
    Ok(())
}

/// Commits per run: the server runs under `strace -f` tracing its fsyncs and its file-creating calls
/// (`mkdir`, and `open`/`openat`/`creat` with `O_CREAT` or `O_TMPFILE`), once with no run (its boot and drain) and once
/// with `n` short runs at concurrency 1; the difference over `n` is the count per run, beside the
/// contract's minimum (and none: a run that calls no workspace tool creates no file).
pub(super) fn commits(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.url.is_none(),
        "commits counts the fsyncs of a server it starts itself: drop --url"
    );
    anyhow::ensure!(
        Command::new("strace").arg("-V").output().is_ok(),
        "commits needs strace (apt-get install -y strace)"
    );
    let n = args.n.unwrap_or(200);
    let rt = runtime()?;
    let load = Load::new(1)?;
    let mut counts = Vec::new();
    for runs in [0, n] {
        let out = tempfile::NamedTempFile::new()?;
        let mut cmd = Command::new("strace");
        cmd.args([
            "-f",
            "-e",
            "trace=fsync,fdatasync,mkdir,mkdirat,open,openat,creat",
            "-o",
        ])
        .arg(out.path())
        .arg(std::env::current_exe()?);
        let server = rt.block_on(Server::spawn(cmd, &[], &load))?;
        rt.block_on(load.drive(&server.base, 0..runs, 1, SHORT_RUN))?;
        server.stop()?;
        counts.push(count_calls(&std::fs::read_to_string(out.path())?));
    }
    let fsyncs = [counts[0].0, counts[1].0];
    let per_run = (fsyncs[1].saturating_sub(fsyncs[0])) as f64 / n as f64;
    let creates_per_run = (counts[1].1.saturating_sub(counts[0].1)) as f64 / n as f64;
    report(
        &[
            (
                "scenario",
                format!("commits ({n} runs of 3 steps, concurrency 1)"),
            ),
            ("fsyncs per run", format!("{per_run:.2}")),
            (
                "contract minimum",
                format!("{CONTRACT_COMMITS_PER_RUN} commits"),
            ),
            ("file creations per run", format!("{creates_per_run:.2}")),
            (
                "boot and drain alone",
                format!("{} fsyncs, {} file creations", fsyncs[0], counts[0].1),
            ),
        ],
        json!({"scenario": "commits", "runs_per_s": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "n": n,
            "concurrency": 1, "fsyncs_per_run": per_run, "contract_commits_per_run": CONTRACT_COMMITS_PER_RUN,
            "file_creations_per_run": creates_per_run, "baseline_fsyncs": fsyncs[0]}),
    );
    Ok(())
}

/// `(fsyncs, file creations)` in an `strace -f` trace: each `fsync`/`fdatasync` call, and each `mkdir`,
/// `mkdirat`, `creat`, or `open`/`openat` with `O_CREAT` or `O_TMPFILE` (an unnamed temporary file, as
/// SQLite's temp store makes one, is created too; a call split by another thread's line counts once, at
/// its start).
fn count_calls(trace: &str) -> (u64, u64) {
    let (mut syncs, mut creates) = (0, 0);
    for line in trace.lines() {
        // `<pid> <name>(<args>) = <ret>`, the pid absent for the first thread and padded to five
        // columns (`3317  openat(…`).
        let call = line
            .split_once(' ')
            .filter(|(pid, _)| pid.bytes().all(|b| b.is_ascii_digit()))
            .map_or(line, |(_, rest)| rest.trim_start());
        let Some((name, args)) = call.split_once('(') else {
            continue;
        };
        match name {
            "fsync" | "fdatasync" => syncs += 1,
            "mkdir" | "mkdirat" | "creat" => creates += 1,
            "open" | "openat" if args.contains("O_CREAT") || args.contains("O_TMPFILE") => {
                creates += 1
            }
            _ => {}
        }
    }
    (syncs, creates)
}

/// A long soak with `history.max_runs = 1000`: server RSS and the database's size after a tenth, a
/// quarter, half and all of `n` runs (20,000 by default) at concurrency 16, then after 10 s idle.
pub(super) fn soak(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.n.unwrap_or(20_000);
    let concurrency = args.concurrency.unwrap_or(16);
    let rt = runtime()?;
    let load = Load::new(concurrency)?;
    let server = rt.block_on(Server::open(
        args.url.as_deref(),
        &[("SWITCHBOARD_HISTORY__MAX_RUNS", "1000")],
        &load,
    ))?;
    let mut rows = Vec::new();
    let mut done = 0;
    let started = Instant::now();
    for mark in [n / 10, n / 4, n / 2, n] {
        rt.block_on(load.drive(&server.base, done..mark, concurrency, SHORT_RUN))?;
        done = mark;
        rows.push((
            format!("after {mark} runs"),
            server.stats(),
            server.database_bytes(),
        ));
        eprintln!(
            "soak: {mark} of {n} runs in {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    std::thread::sleep(Duration::from_secs(10));
    rows.push((
        "after 10 s idle".into(),
        server.stats(),
        server.database_bytes(),
    ));
    server.stop()?;
    let rss = |i: usize| rows[i].1.map(|s| s.rss_kib);
    let ratio = rss(3)
        .zip(rss(0))
        .map(|(last, first)| last as f64 / first.max(1) as f64);
    let mut table = vec![(
        "scenario",
        format!("soak ({n} runs, concurrency {concurrency}, max_runs 1000)"),
    )];
    let lines: Vec<String> = rows
        .iter()
        .map(|(when, s, db)| {
            let db = db.map_or("n/a".into(), |b| {
                format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
            });
            format!(
                "{when}: server RSS {}, database {db}",
                s.map_or("n/a".into(), |s| format!("{:.1} MiB", mib(s.rss_kib)))
            )
        })
        .collect();
    table.extend(lines.iter().map(|l| ("", l.clone())));
    table.push((
        "RSS at the end / at the first mark",
        ratio.map_or("n/a".into(), |r| format!("{r:.2}")),
    ));
    report(
        &table,
        json!({"scenario": "soak", "runs_per_s": n as f64 / started.elapsed().as_secs_f64(), "p50_ms": 0.0,
            "p99_ms": 0.0, "max_ms": 0.0, "n": n, "concurrency": concurrency,
            "rss_mib": rows.iter().map(|r| r.1.map(|s| mib(s.rss_kib))).collect::<Vec<_>>(),
            "database_mib": rows.iter().map(|r| r.2.map(|b| b as f64 / (1 << 20) as f64)).collect::<Vec<_>>(),
            "rss_ratio": ratio}),
    );
    Ok(())
}

/// Server memory per parked live run: `n` runs waiting on a one-hour tool.
pub(super) fn idle(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.n.unwrap_or(10_000);
    let rt = runtime()?;
    let load = Load::new(64)?;
    let server = rt.block_on(Server::open(
        args.url.as_deref(),
        &[("SWITCHBOARD_STORAGE__SYNCHRONOUS", "normal")],
        &load,
    ))?;
    let before = server.stats();
    let started = Instant::now();
    rt.block_on(async {
        let mut ids = Vec::with_capacity(n);
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let admitted = futures_util::future::join_all(
                chunk
                    .iter()
                    .map(|i| load.admit(&server.base, *i, "steps=1 ms=3600000")),
            );
            for id in admitted.await {
                ids.push(id?);
            }
        }
        // Parked: every run has published its tool call and waits on the tool.
        for id in &ids {
            loop {
                let view: Value = load
                    .client
                    .get(format!("{}/api/runs/{id}", server.base))
                    .send()
                    .await?
                    .json()
                    .await?;
                if view["eventCount"].as_u64().unwrap_or(0) >= 4 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let took = started.elapsed();
    let after = server.stats();
    server.stop()?;
    let per_run = before
        .zip(after)
        .map(|(b, a)| (a.rss_kib.saturating_sub(b.rss_kib)) as f64 * 1024.0 / n as f64);
    report(
        &[
            ("scenario", format!("idle ({n} parked runs)")),
            (
                "server RSS before / after",
                format!("{} / {}", stats_text(before), stats_text(after)),
            ),
            (
                "per parked run",
                per_run.map_or("n/a".into(), |b| format!("{:.1} KiB", b / 1024.0)),
            ),
            (
                "admitted and parked in",
                format!("{:.1} s", took.as_secs_f64()),
            ),
        ],
        json!({"scenario": "idle", "runs_per_s": n as f64 / took.as_secs_f64(), "p50_ms": 0.0, "p99_ms": 0.0,
            "max_ms": 0.0, "n": n, "concurrency": 64, "bytes_per_run": per_run}),
    );
    Ok(())
}

/// SSE fan-out: `concurrency` subscribers (1,000 by default) on one live run that keeps stepping (a model
/// call of 10 ms a step); delivery lag is the reader's clock at receipt minus the event's own `at`
/// (both this machine's wall clock, in milliseconds), over events published after every reader joined.
///
/// On PostgreSQL the lag is cross-host: the run is admitted on one `serve` process (host `bench-a`) and
/// every subscriber reads from a second one (host `bench-b`) on the same database, which follows a run
/// another generation drives by reading the ledger; memory per subscriber is the second process's.
pub(super) fn sse(args: &BenchArgs, db: &SharedDb) -> anyhow::Result<()> {
    let subscribers = args.concurrency.unwrap_or(1000);
    let seconds = args.n.unwrap_or(10) as u64;
    let cross_host = matches!(db.spec, DbSpec::Postgres { .. });
    let rt = runtime()?;
    let load = Load::new(subscribers)?;
    let owner = rt.block_on(Server::open(
        args.url.as_deref(),
        &borrowed(&child_env(db, "bench-a")),
        &load,
    ))?;
    let follower = if cross_host {
        Some(rt.block_on(Server::open(
            None,
            &borrowed(&child_env(db, "bench-b")),
            &load,
        ))?)
    } else {
        None
    };
    // The process the subscribers read from.
    let readers_at = follower.as_ref().unwrap_or(&owner);
    let before = readers_at.stats();
    let (lags, published, after) = rt.block_on(async {
        let id = load
            .admit(&owner.base, 0, "steps=1000000 ms=0 think_ms=10")
            .await?;
        // Readers start after what is published by now, so none replays the run's history.
        let view: Value = load
            .client
            .get(format!("{}/api/runs/{id}", owner.base))
            .send()
            .await?
            .json()
            .await?;
        let after_seq = view["eventCount"].as_u64().unwrap_or(0);
        let connected = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let mut readers = Vec::with_capacity(subscribers);
        for _ in 0..subscribers {
            let (client, connected) = (load.client.clone(), connected.clone());
            let url = format!(
                "{}/api/runs/{id}/stream?afterSeq={after_seq}",
                readers_at.base
            );
            readers.push(tokio::spawn(async move {
                let res = client.get(url).send().await?;
                connected.add_permits(1);
                let mut events = res.bytes_stream().eventsource();
                let mut seen = Vec::new();
                while let Some(event) = events.next().await {
                    let event = event?;
                    if event.event == "end" {
                        break;
                    }
                    seen.push((now_ms(), event.data));
                }
                Ok::<_, anyhow::Error>(seen)
            }));
        }
        let _all = connected.acquire_many(subscribers as u32).await?;
        let joined = now_ms();
        let after = readers_at.stats();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let stop = load
            .client
            .post(format!("{}/api/runs/{id}/stop", owner.base))
            .json(&json!({"mode": "hard"}))
            .send()
            .await?;
        anyhow::ensure!(
            stop.status().as_u16() == 202,
            "stop answered {}",
            stop.status()
        );
        let (mut lags, mut published) = (Vec::new(), std::collections::BTreeSet::new());
        for r in readers {
            for (got, data) in r.await?? {
                let event: Value = serde_json::from_str(&data).context("an event")?;
                let at = event["at"].as_i64().unwrap_or(0);
                if at > joined {
                    lags.push((got - at) as f64);
                    published.insert(event["seq"].as_u64().unwrap_or(0));
                }
            }
        }
        Ok::<_, anyhow::Error>((lags, published.len(), after))
    })?;
    let storage = readers_at.storage.clone();
    owner.stop()?;
    if let Some(f) = follower {
        f.stop()?;
    }
    let delivered = lags.len();
    let per_sub = before
        .zip(after)
        .map(|(b, a)| (a.rss_kib.saturating_sub(b.rss_kib)) as f64 * 1024.0 / subscribers as f64);
    let s = summarize(lags);
    let scenario = if cross_host {
        format!("sse ({subscribers} subscribers on another host than the run, {seconds} s of a stepping run{})", on_storage(db))
    } else {
        format!("sse ({subscribers} subscribers, {seconds} s of a stepping run)")
    };
    report(
        &[
            ("scenario", scenario),
            (
                "delivered",
                format!(
                    "{delivered} of {} ({published} events)",
                    published * subscribers
                ),
            ),
            (
                "lag p50 / p99 / max",
                format!("{:.0} / {:.0} / {:.0} ms", s.p50, s.p99, s.max),
            ),
            (
                "server memory per subscriber",
                per_sub.map_or("n/a".into(), |b| format!("{:.1} KiB", b / 1024.0)),
            ),
        ],
        json!({"scenario": "sse", "runs_per_s": 0.0, "p50_ms": s.p50, "p99_ms": s.p99, "max_ms": s.max,
            "n": published, "concurrency": subscribers, "delivered": delivered, "bytes_per_subscriber": per_sub,
            "storage": storage, "cross_host": cross_host}),
    );
    Ok(())
}

/// Stalled viewers (SPEC §8.1 byte bounds): `concurrency` subscribers (1,000 by default) that send their
/// request and never read a byte, on one live run stepping every 30 ms, while `n` follow-ups of 100 KB (100
/// by default) steer it — each one event (capped at 64 KiB) at the next step, fanned out to every viewer. Reports the
/// server's RSS over its baseline with them attached and after they close, and the follow-ups' latency.
pub(super) fn stalled(args: &BenchArgs) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let viewers = args.concurrency.unwrap_or(1000);
    let follow_ups = args.n.unwrap_or(100);
    let rt = runtime()?;
    let load = Load::new(16)?;
    let server = rt.block_on(Server::open(args.url.as_deref(), &[], &load))?;
    let before = server.stats();
    let (lat, with_viewers, closed) = rt.block_on(async {
        let id = load
            .admit(&server.base, 0, "steps=1000000 ms=20 think_ms=10")
            .await?;
        let addr: std::net::SocketAddr = server
            .base
            .trim_start_matches("http://")
            .parse()
            .context("--url must be http://<ip>:<port> for raw viewers")?;
        let mut conns = Vec::with_capacity(viewers);
        for _ in 0..viewers {
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.set_recv_buffer_size(4096)?;
            let mut conn = socket.connect(addr).await?;
            conn.write_all(
                format!("GET /api/runs/{id}/stream HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
            )
            .await?;
            conns.push(conn);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let text = "f".repeat(100_000);
        let mut lat = Vec::with_capacity(follow_ups);
        for _ in 0..follow_ups {
            let t = Instant::now();
            let steered = load.admit(&server.base, 0, &text).await?;
            anyhow::ensure!(
                steered == id,
                "a follow-up started run {steered} instead of steering {id}"
            );
            lat.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let with_viewers = server.stats();
        drop(conns);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let closed = server.stats();
        let stop = load
            .client
            .post(format!("{}/api/runs/{id}/stop", server.base))
            .json(&json!({"mode": "hard"}))
            .send()
            .await?;
        anyhow::ensure!(
            stop.status().as_u16() == 202,
            "stop answered {}",
            stop.status()
        );
        Ok::<_, anyhow::Error>((lat, with_viewers, closed))
    })?;
    server.stop()?;
    let over = |s: Option<ProcStats>| {
        before.zip(s).map_or("n/a".into(), |(b, a)| {
            format!("{:+.1} MiB", mib(a.rss_kib) - mib(b.rss_kib))
        })
    };
    let per_viewer = before
        .zip(with_viewers)
        .map(|(b, a)| a.rss_kib.saturating_sub(b.rss_kib) as f64 * 1024.0 / viewers as f64);
    let s = summarize(lat);
    report(
        &[
            ("scenario", format!("stalled ({viewers} viewers that never read, {follow_ups} follow-ups of 100 KB)")),
            ("server RSS before", stats_text(before)),
            ("with the viewers / after they close", format!("{} / {}", over(with_viewers), over(closed))),
            ("per stalled viewer", per_viewer.map_or("n/a".into(), |b| format!("{:.1} KiB", b / 1024.0))),
            ("follow-up p50 / p99 / max", format!("{:.0} / {:.0} / {:.0} ms", s.p50, s.p99, s.max)),
        ],
        json!({"scenario": "stalled", "runs_per_s": 0.0, "p50_ms": s.p50, "p99_ms": s.p99, "max_ms": s.max,
            "n": follow_ups, "concurrency": viewers, "bytes_per_viewer": per_viewer}),
    );
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_trace_counts_its_syncs_and_the_calls_that_create_files() {
        let trace = r#"101 fsync(7) = 0
openat(AT_FDCWD, "/d/switchboard.db-wal", O_RDWR|O_CLOEXEC, 0644) = 9
102 openat(AT_FDCWD, "/d/ws/r1/.fence", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666 <unfinished ...>
101 fdatasync(7 <unfinished ...>
102 <... openat resumed>) = 10
101 <... fdatasync resumed>) = 0
102 mkdir("/d/ws/r1", 0777) = 0
103 mkdirat(AT_FDCWD, "/d/ws/r2", 0777) = -1 EEXIST (File exists)
101 openat(AT_FDCWD, "/var/tmp", O_RDWR|O_EXCL|O_CLOEXEC|O_TMPFILE, 0600) = 34
3317  fdatasync(9) = 0
3317  mkdir("/d/ws/r3", 0777) = 0
+++ exited with 0 +++"#;
        assert_eq!(super::count_calls(trace), (3, 5));
    }
}
