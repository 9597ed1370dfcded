//! The server under measurement, in a process of its own (SPEC §11): a child `serve` this bench starts
//! on a temp data dir, or one already running (`--url`). The load comes from this process on a
//! multi-threaded runtime of its own; the server's resident memory and CPU are read from its own
//! `/proc/<pid>`, so the client's share is never counted.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::child::ChildServer;

/// The server's own resources, from `/proc/<pid>`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ProcStats {
    pub rss_kib: u64,
    pub peak_kib: u64,
    /// User plus system CPU time so far.
    pub cpu_s: f64,
}

/// A running server and, when it runs on this machine, its pid.
pub(super) struct Server {
    pub base: String,
    /// The backend, as its `/healthz` names it (`sqlite`, `postgres`, `memory`).
    pub storage: String,
    pid: Option<u32>,
    child: Option<ChildServer>,
    dir: Option<tempfile::TempDir>,
}

impl Server {
    /// The server at `url`, or (without one) a child `serve` with the committed defaults and `env`.
    pub async fn open(
        url: Option<&str>,
        env: &[(&str, &str)],
        load: &Load,
    ) -> anyhow::Result<Server> {
        match url {
            Some(url) => {
                let base = url.trim_end_matches('/').to_owned();
                let (pid, storage) = load.server_pid(&base).await?;
                Ok(Server {
                    base,
                    storage,
                    pid,
                    child: None,
                    dir: None,
                })
            }
            None => Self::spawn(Command::new(std::env::current_exe()?), env, load).await,
        }
    }

    /// A child started by `cmd` (the executable, or a wrapper such as `strace` and then it).
    pub async fn spawn(cmd: Command, env: &[(&str, &str)], load: &Load) -> anyhow::Result<Server> {
        let dir = tempfile::Builder::new()
            .prefix("switchboard-bench-")
            .tempdir()?;
        let child =
            ChildServer::start_command(cmd, dir.path(), env, Some(&dir.path().join("serve.log")))?;
        let base = format!("http://{}", child.addr);
        let (pid, storage) = load.server_pid(&base).await?;
        Ok(Server {
            base,
            storage,
            pid,
            child: Some(child),
            dir: Some(dir),
        })
    }

    pub fn stats(&self) -> Option<ProcStats> {
        let pid = self.pid?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib = |field: &str| -> Option<u64> {
            status
                .lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        // Fields 14 and 15 of `stat` (utime, stime), counted after the parenthesised command name; Linux
        // reports them in clock ticks of 1/100 s on every architecture this runs on.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(ProcStats {
            rss_kib: kib("VmRSS:")?,
            peak_kib: kib("VmHWM:")?,
            cpu_s: ticks as f64 / 100.0,
        })
    }

    /// Bytes of the database files (`switchboard.db` with its WAL) of a child this bench started.
    pub fn database_bytes(&self) -> Option<u64> {
        let dir = self.dir.as_ref()?.path();
        let files = ["switchboard.db", "switchboard.db-wal", "switchboard.db-shm"];
        Some(
            files
                .iter()
                .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
                .map(|m| m.len())
                .sum(),
        )
    }

    /// A child this bench started: SIGTERM to the server (it drains and exits), then wait for the child
    /// (a wrapper such as `strace` writes its summary as it exits). A `--url` server is left running.
    pub fn stop(mut self) -> anyhow::Result<()> {
        if let (Some(child), Some(pid)) = (self.child.as_mut(), self.pid) {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
            anyhow::ensure!(
                child.wait_exit(Duration::from_secs(60)).is_some(),
                "the server did not exit within 60 s"
            );
        }
        Ok(())
    }
}

/// The load client's own multi-threaded runtime (two workers), apart from the server's.
pub(super) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// The load client: an HTTP client and a tag for thread keys. Cheap to clone.
#[derive(Clone)]
pub(super) struct Load {
    pub client: reqwest::Client,
    /// Makes thread keys unique to this bench, so a `--url` server that served another bench starts fresh
    /// runs rather than steering into old threads.
    tag: String,
}

impl Load {
    pub fn new(connections: usize) -> anyhow::Result<Load> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(connections + 16)
            .build()?;
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        Ok(Load { client, tag })
    }

    /// The server's pid from `/healthz`, when that process is on this machine, and its backend.
    async fn server_pid(&self, base: &str) -> anyhow::Result<(Option<u32>, String)> {
        let health: Value = self
            .client
            .get(format!("{base}/healthz"))
            .send()
            .await?
            .json()
            .await?;
        let pid = health["pid"].as_u64().context("pid in /healthz")? as u32;
        let storage = health["storageKind"]
            .as_str()
            .unwrap_or("unknown")
            .to_owned();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        Ok((
            String::from_utf8_lossy(&cmdline)
                .contains("switchboard")
                .then_some(pid),
            storage,
        ))
    }

    /// Admit `text` on a fresh thread; answers the run id.
    pub async fn admit(&self, base: &str, i: usize, text: &str) -> anyhow::Result<String> {
        let thread = format!("bench-{}-{i}", self.tag);
        let res = self
            .client
            .post(format!("{base}/api/messages"))
            .json(&json!({"thread": thread, "channel": "bench", "user": "u", "text": text}))
            .send()
            .await?;
        anyhow::ensure!(
            res.status().as_u16() == 202,
            "admission answered {}",
            res.status()
        );
        let body: Value = res.json().await?;
        Ok(body["runId"].as_str().context("runId")?.to_owned())
    }

    /// One run end to end: admitted, followed over SSE to its `end`, then read until its final record
    /// has landed. Answers milliseconds.
    async fn one_run(&self, base: &str, i: usize, text: &str) -> anyhow::Result<f64> {
        let started = Instant::now();
        let id = self.admit(base, i, text).await?;
        let mut events = self
            .client
            .get(format!("{base}/api/runs/{id}/stream"))
            .send()
            .await?
            .bytes_stream()
            .eventsource();
        while let Some(event) = events.next().await {
            if event?.event == "end" {
                break;
            }
        }
        loop {
            let view: Value = self
                .client
                .get(format!("{base}/api/runs/{id}"))
                .send()
                .await?
                .json()
                .await?;
            if view["persisted"] == true {
                return Ok(started.elapsed().as_secs_f64() * 1000.0);
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }

    /// Runs numbered `range` with `concurrency` clients; answers each run's milliseconds.
    pub async fn drive(
        &self,
        base: &str,
        range: std::ops::Range<usize>,
        concurrency: usize,
        text: &str,
    ) -> anyhow::Result<Vec<f64>> {
        let next = Arc::new(AtomicUsize::new(range.start));
        let workers: Vec<_> = (0..concurrency.max(1))
            .map(|_| {
                let (load, base, text, next, end) = (
                    self.clone(),
                    base.to_owned(),
                    text.to_owned(),
                    next.clone(),
                    range.end,
                );
                tokio::spawn(async move {
                    let mut lat = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= end {
                            return Ok::<_, anyhow::Error>(lat);
                        }
                        lat.push(load.one_run(&base, i, &text).await?);
                    }
                })
            })
            .collect();
        let mut lat = Vec::new();
        for w in workers {
            lat.extend(w.await??);
        }
        Ok(lat)
    }
}
