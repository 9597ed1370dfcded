//! A throwaway PostgreSQL cluster for tests (SPEC §1.3: "Tests start a throwaway PostgreSQL
//! themselves"), and a fresh database per test.
//!
//! [`shared`] starts one cluster per test process on first use (`initdb` + `pg_ctl` in a temp dir, on a
//! free loopback port) and [`Cluster::database`] creates a fresh database in it and answers its URL.
//! One cluster per process, not per test, keeps a suite fast (a start takes 1–2 s); one database per
//! test keeps the tests apart.
//!
//! - The server binaries are found in `/usr/lib/postgresql/<newest>/bin`, else `pg_config --bindir`,
//!   else on `PATH`. Without them every PostgreSQL case FAILS naming `apt-get install -y postgresql`:
//!   CI installs the package, and a silent skip would hide a backend nobody tested.
//! - PostgreSQL refuses to run as root: run as root, the temp dir is `chown`ed to the `postgres` OS
//!   user (which the Debian package creates) and `initdb` / `pg_ctl` run through `runuser -u postgres --`.
//! - The server is tuned for throwaway data (`fsync=off`, no synchronous commit).
//! - Nothing is left running: a watchdog process (its own session, so a Ctrl-C of the test's process
//!   group does not kill it first) waits for the end of a pipe this process holds; when the process
//!   exits — normally, by a panic or by a signal, since statics are never dropped — the kernel closes
//!   the pipe and the watchdog stops the server (`pg_ctl stop -m immediate`) and removes the temp dir.
//!   A [`Cluster`] that is dropped stops its server at once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// What to install when the server binaries are missing.
pub const INSTALL_HINT: &str = "apt-get install -y postgresql";

/// A running throwaway cluster; stopped when dropped (or when the process exits, see the module doc).
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    /// The write end of the watchdog's pipe: held until this process exits.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
    admin: Mutex<Option<postgres::Client>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish()
    }
}

/// The process's cluster, started on first use. Panics — failing the test — with the reason when no
/// cluster can be started (naming [`INSTALL_HINT`] when the server binaries are missing).
pub fn shared() -> &'static Cluster {
    static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
    match SHARED.get_or_init(Cluster::start) {
        Ok(c) => c,
        Err(why) => panic!("no PostgreSQL for the postgres test cases: {why}"),
    }
}

/// A fresh database in the process's cluster: its URL (shorthand for `shared().database()`).
pub fn database() -> String {
    shared().database()
}

impl Cluster {
    /// Start a cluster in a fresh temp dir on a free loopback port.
    pub fn start() -> Result<Cluster, String> {
        let bin = server_bin()?;
        let as_postgres = effective_uid()? == 0;
        if as_postgres && !succeeds(Command::new("id").args(["-u", "postgres"])) {
            return Err(format!("running as root, and there is no `postgres` OS user to run the server as ({INSTALL_HINT} creates it)"));
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // `/tmp`, not `$TMPDIR`: the `postgres` user must reach it, and the server's socket path in it
        // must stay under the 107 bytes a Unix socket name may have.
        let base = if Path::new("/tmp").is_dir() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "switchboard-pg-{}-{:x}",
            std::process::id(),
            stamp & 0xffff_ffff
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        if as_postgres {
            run(Command::new("chown").args(["postgres:postgres"]).arg(&dir))?;
        }
        let mut cluster = Cluster {
            dir,
            bin,
            port: 0,
            as_postgres,
            watchdog: Mutex::new(None),
            admin: Mutex::new(None),
            next: AtomicU64::new(0),
        };
        cluster.start_watchdog()?;
        run(cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.data())
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]))?;
        // A port found free may be taken before the server binds it: try a few.
        let mut last = String::new();
        for _ in 0..3 {
            cluster.port = free_port()?;
            let opts = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
                 -c full_page_writes=off -c max_connections=300",
                cluster.port,
                cluster.dir.display()
            );
            let started = run(cluster
                .command("pg_ctl")
                .arg("-D")
                .arg(cluster.data())
                .args(["-w", "-t", "60", "-l"])
                .arg(cluster.dir.join("server.log"))
                .arg("-o")
                .arg(opts)
                .arg("start"));
            match started {
                Ok(()) => return Ok(cluster),
                Err(e) => {
                    last = format!(
                        "{e}\n{}",
                        std::fs::read_to_string(cluster.dir.join("server.log")).unwrap_or_default()
                    )
                }
            }
        }
        Err(format!("pg_ctl start failed: {last}"))
    }

    /// The URL of database `name` in this cluster.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Create a fresh, empty database and answer its URL. Panics (failing the test) when it cannot.
    /// Callable from async tests too: the synchronous client runs on a thread of its own (it would
    /// refuse to start its runtime inside the caller's).
    pub fn database(&self) -> String {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::SeqCst)
        );
        let created = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
                    if admin.as_ref().is_none_or(postgres::Client::is_closed) {
                        let client =
                            postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
                                .map_err(|e| {
                                    format!(
                                        "connect to the test cluster on port {}: {e}",
                                        self.port
                                    )
                                })?;
                        *admin = Some(client);
                    }
                    let client = admin.as_mut().expect("connected above");
                    client
                        .batch_execute(&format!("CREATE DATABASE {name}"))
                        .map_err(|e| format!("create database {name}: {e}"))
                })
                .join()
        });
        match created {
            Ok(Ok(())) => self.url(&name),
            Ok(Err(why)) => panic!("{why}"),
            Err(_) => panic!("creating database {name} panicked"),
        }
    }

    /// Stop the server now (`-m immediate`); the temp dir goes with the watchdog.
    pub fn stop(&self) {
        self.admin.lock().unwrap_or_else(|p| p.into_inner()).take();
        if self.port != 0 {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "stop"])
                .output();
        }
        // Closing the pipe lets the watchdog remove the temp dir and exit.
        if let Some((mut child, stdin)) = self
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            drop(stdin);
            let _ = child.wait();
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `program` from the server's bin dir, run as the `postgres` user when this process is root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        cmd.stdin(Stdio::null());
        cmd
    }

    /// Start the watchdog that stops the server and removes the temp dir once this process is gone.
    fn start_watchdog(&mut self) -> Result<(), String> {
        let pg_ctl = self.bin.join("pg_ctl");
        let stop = if self.as_postgres {
            format!(
                "runuser -u postgres -- '{}' -D '{}' -m immediate stop",
                pg_ctl.display(),
                self.data().display()
            )
        } else {
            format!(
                "'{}' -D '{}' -m immediate stop",
                pg_ctl.display(),
                self.data().display()
            )
        };
        let script = format!(
            "cat >/dev/null; if [ -f '{data}/postmaster.pid' ]; then {stop}; fi; rm -rf '{dir}'",
            data = self.data().display(),
            dir = self.dir.display()
        );
        let mut cmd = if Path::new("/usr/bin/setsid").exists() || Path::new("/bin/setsid").exists()
        {
            let mut c = Command::new("setsid");
            c.arg("sh");
            c
        } else {
            Command::new("sh")
        };
        let mut child = cmd
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start the cluster's watchdog: {e}"))?;
        let mut stdin = child.stdin.take().ok_or("the watchdog has no stdin")?;
        // Nothing is ever written but this; the watchdog reads until the pipe closes.
        let _ = stdin.write_all(b"");
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some((child, stdin));
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The directory holding `initdb` and `pg_ctl`: the newest `/usr/lib/postgresql/*/bin`, else
/// `pg_config --bindir`, else the first `PATH` entry that has them.
pub fn server_bin() -> Result<PathBuf, String> {
    let has = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| has(d))
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return Ok(d);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has(&d) {
            return Ok(d);
        }
    }
    if let Some(d) =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).find(|d| has(d)))
    {
        return Ok(d);
    }
    Err(format!(
        "the PostgreSQL server binaries (initdb, pg_ctl) are not installed: not in /usr/lib/postgresql/*/bin, \
         `pg_config --bindir` or PATH. Install them with `{INSTALL_HINT}`"
    ))
}

/// This process's effective uid: the `Uid:` line of `/proc/self/status`, else `id -u`.
fn effective_uid() -> Result<u32, String> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(euid) = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|u| u.parse().ok())
        {
            return Ok(euid);
        }
    }
    let out = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("id -u: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("id -u: {e}"))
}

fn free_port() -> Result<u16, String> {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("find a free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("find a free port: {e}"))
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run `cmd` to completion; an error carries its output.
fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether process `pid` holds nothing open on the database at `url` — none of its `switchboard/<pid>`
/// connections in a transaction or a statement (`ActivityProbe::is_idle`): what `chaos` and the tests
/// pause a process by, so a paused process holds no lock. The storage crate opens the one connection it
/// reads `pg_stat_activity` through; callers get only the check.
pub fn idle_check(url: &str) -> crate::Result<impl FnMut(u32) -> crate::Result<bool>> {
    let mut probe = crate::postgres::ActivityProbe::connect(url)?;
    Ok(move |pid| probe.is_idle(pid))
}
