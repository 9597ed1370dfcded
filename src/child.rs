//! A `switchboard serve` child process on a data dir and a free loopback port: what the kill suite,
//! `bench recovery` and `switchboard chaos` crash, drain, pause and restart. Killed (and continued, if
//! paused) on drop.
//!
//! The child's stderr is captured line by line: kept in memory (so a caller can ask whether something
//! was logged) and, with [`ChildServer::start_logged`], appended to a file as it arrives, so the log of
//! a process that was killed long ago is still on disk when a scenario fails and wants to show it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct ChildServer {
    child: Child,
    /// `host:port` the child listens on.
    pub addr: String,
    /// Every stderr line so far. A std `Mutex`: the reader thread and the owner only push and copy.
    log: Arc<Mutex<Vec<String>>>,
    /// Where the reader thread also appends each line, when the caller asked for a file.
    log_file: Option<PathBuf>,
}

impl ChildServer {
    /// Start `exe serve` on `data` (database `data/switchboard.db`) with extra environment; waits until
    /// it listens.
    pub fn start(
        exe: &Path,
        data: &Path,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<ChildServer> {
        Self::start_logged(exe, data, extra_env, None)
    }

    /// [`ChildServer::start`], also appending every stderr line to `log_file` (created, with its
    /// directory, if missing). A child that exits or never listens within 60 s is killed and the error
    /// carries the tail of its log.
    pub fn start_logged(
        exe: &Path,
        data: &Path,
        extra_env: &[(&str, &str)],
        log_file: Option<&Path>,
    ) -> anyhow::Result<ChildServer> {
        Self::start_command(Command::new(exe), data, extra_env, log_file)
    }

    /// [`ChildServer::start_logged`] with the command line begun by the caller: the executable, or a
    /// wrapper and then the executable (`strace … switchboard`); `serve` is appended. The child's pid is
    /// then the wrapper's: ask the server's `/healthz` for its own.
    pub fn start_command(
        mut cmd: Command,
        data: &Path,
        extra_env: &[(&str, &str)],
        log_file: Option<&Path>,
    ) -> anyhow::Result<ChildServer> {
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
        let mut file = match log_file {
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)?,
                )
            }
            None => None,
        };
        let mut child = cmd.spawn()?;
        let Some(stderr) = child.stderr.take() else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("no stderr");
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("switchboard listening") {
                    if let Some(addr) = line
                        .split("addr=")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                    {
                        let _ = tx.send(addr.to_owned());
                    }
                }
                if let Some(f) = file.as_mut() {
                    // A full disk must not stop the capture: the in-memory copy stays.
                    let _ = writeln!(f, "{line}");
                }
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => Ok(ChildServer {
                child,
                addr,
                log,
                log_file: log_file.map(Path::to_path_buf),
            }),
            Err(_) => {
                let _ = Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                // Give the reader thread a moment to take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                let lines = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let tail = lines[lines.len().saturating_sub(20)..].join("\n");
                anyhow::bail!("the child never listened; its last log lines:\n{tail}")
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether a log line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| l.contains(needle))
    }

    /// The log lines so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The file the log is appended to, if the child was started with one.
    pub fn log_file(&self) -> Option<&Path> {
        self.log_file.as_deref()
    }

    /// Write the log lines so far to `path`.
    pub fn save_log(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut text = self.log_lines().join("\n");
        text.push('\n');
        std::fs::write(path, text)
    }

    /// Send a signal by name (`-TERM`, `-STOP`, `-CONT`, …).
    pub fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()?
            .success();
        anyhow::ensure!(ok, "kill {sig} failed");
        Ok(())
    }

    /// SIGSTOP the process at a moment it holds no SQLite write lock on `db` (a paused process that holds
    /// the lock stalls every writer of the file until it resumes — a limit of a shared SQLite file, not
    /// something a paused generation can be fenced out of). The probe waits up to 50 ms for the lock, so a
    /// lock another (running) process holds for one transaction does not count against the paused one.
    pub fn pause_outside_transaction(&self, db: &Path) -> anyhow::Result<()> {
        let probe = storage::WriteLockProbe::open(db, Duration::from_millis(50))?;
        self.pause_when(|| Ok(probe.is_free().unwrap_or(false)))
            .map_err(|e| e.context("the process kept holding the write lock"))
    }

    /// SIGSTOP the process at a moment `is_free` (asked while it is stopped) says yes: stop, ask, and if
    /// not, continue briefly and try again, up to 200 times. An error from `is_free` continues the
    /// process and ends the attempt.
    pub fn pause_when(
        &self,
        mut is_free: impl FnMut() -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        for _ in 0..200 {
            self.signal("-STOP")?;
            match is_free() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.signal("-CONT")?;
                    return Err(e);
                }
            }
            self.signal("-CONT")?;
            std::thread::sleep(Duration::from_millis(3));
        }
        anyhow::bail!("no moment outside a transaction in 200 tries")
    }

    /// The exit code if the process has exited (`-1` for a death by signal), without waiting.
    pub fn try_exit(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(status)) => status.code().or(Some(-1)),
            _ => None,
        }
    }

    /// Wait for the process to exit; answers its exit code (`-1` for a death by signal; `None` if still
    /// running at the deadline).
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let until = Instant::now() + within;
        loop {
            if let Some(code) = self.try_exit() {
                return Some(code);
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
        // An exited (reaped) child's pid may belong to someone else by now: signal only a live one.
        if self.try_exit().is_none() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.child.id().to_string()])
                .status();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
