//! A `switchboard serve` child process on a data dir and a free loopback port: what the kill suite and
//! `bench recovery` crash, drain, pause and restart. Killed (and continued, if paused) on drop.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct ChildServer {
    child: Child,
    /// `host:port` the child listens on.
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl ChildServer {
    /// Start `exe serve` on `data` (database `data/switchboard.db`) with extra environment; waits until
    /// it listens.
    pub fn start(exe: &Path, data: &Path, extra_env: &[(&str, &str)]) -> anyhow::Result<ChildServer> {
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .current_dir(data)
            .env("SWITCHBOARD_SERVER__BIND", "127.0.0.1:0")
            .env("SWITCHBOARD_STORAGE__PATH", data.join("switchboard.db"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("switchboard listening") {
                    if let Some(addr) = line.split("addr=").nth(1).and_then(|r| r.split_whitespace().next()) {
                        let _ = tx.send(addr.to_owned());
                    }
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).map_err(|_| anyhow::anyhow!("the child never listened"))?;
        Ok(ChildServer { child, addr, log })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether a log line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|l| l.contains(needle))
    }

    /// The log lines so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Send a signal by name (`-TERM`, `-STOP`, `-CONT`, …).
    pub fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let ok = Command::new("kill").args([sig, &self.pid().to_string()]).status()?.success();
        anyhow::ensure!(ok, "kill {sig} failed");
        Ok(())
    }

    /// SIGSTOP the process at a moment it holds no SQLite write lock on `db` (a paused process that holds
    /// the lock stalls every writer of the file until it resumes — a limit of a shared SQLite file, not
    /// something a paused generation can be fenced out of): stop, probe the lock, and if it is held,
    /// continue briefly and try again.
    pub fn pause_outside_transaction(&self, db: &Path) -> anyhow::Result<()> {
        let probe = rusqlite::Connection::open(db)?;
        probe.busy_timeout(Duration::from_millis(0))?;
        for _ in 0..200 {
            self.signal("-STOP")?;
            match probe.execute_batch("BEGIN IMMEDIATE; ROLLBACK;") {
                Ok(()) => return Ok(()),
                Err(_) => {
                    self.signal("-CONT")?;
                    std::thread::sleep(Duration::from_millis(3));
                }
            }
        }
        anyhow::bail!("the process kept holding the write lock")
    }

    /// Wait for the process to exit; answers its exit code (`None` if still running at the deadline).
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code().or(Some(-1));
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.child.id().to_string()]).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
