//! The real `switchboard` binary as a child process, for the end-to-end tests that crash, signal and
//! restart it on a data dir: [`Proc`] starts it (and kills it on drop), [`http`] drives it without an
//! async test runtime, [`wait_for`] watches what it leaves behind (the database, its log) with a deadline.
//!
//! Each test crash is `/admin/crash` (exit 137, SPEC §6.5), never a signal the process could catch;
//! the binary is the one cargo built for this test run (`CARGO_BIN_EXE_switchboard`).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The binary under test, as a child process.
pub struct Proc(pub switchboard::child::ChildServer);

impl std::ops::Deref for Proc {
    type Target = switchboard::child::ChildServer;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Proc {
    /// `switchboard serve` in `data` (which may hold the `config.toml` it reads) with extra environment;
    /// answers once it listens.
    pub fn start(data: &Path, extra_env: &[(&str, &str)]) -> Proc {
        Proc(
            switchboard::child::ChildServer::start(
                Path::new(env!("CARGO_BIN_EXE_switchboard")),
                data,
                extra_env,
            )
            .expect("start switchboard"),
        )
    }

    pub fn signal(&self, sig: &str) {
        self.0.signal(sig).expect("signal");
    }

    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        self.0.wait_exit(within)
    }

    /// `POST /admin/crash`, then the exit 137 it promises.
    pub fn crash(&mut self) {
        let res = http(|c| c.post(self.url("/admin/crash")));
        assert_eq!(res.0, 202, "{}", res.1);
        assert_eq!(
            self.wait_exit(Duration::from_secs(10)),
            Some(137),
            "crash exits 137"
        );
    }
}

/// A blocking HTTP call on a throwaway runtime; answers (status, JSON body).
pub fn http(f: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder + Send) -> (u16, Value) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let client = reqwest::Client::new();
                match f(&client).send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.json().await.unwrap_or(Value::Null))
                    }
                    Err(e) => (0, json!({"error": e.to_string()})),
                }
            })
        })
        .join()
        .unwrap()
    })
}

/// Milliseconds since the Unix epoch, as the binary stamps its rows.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The lines of a run's `steps.log` workspace file (what the scripted agent's `append_file` calls wrote).
pub fn workspace_lines(data: &Path, run_id: &str) -> Vec<String> {
    std::fs::read_to_string(data.join("workspaces").join(run_id).join("steps.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Poll `check` every 20 ms until it answers `Some`; fails naming `what` once `within` has passed.
pub fn wait_for<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `switchboard serve` on the PostgreSQL database `url` as host `host_id`, with `extra` environment
/// (lease and heartbeat, drain settings). Every host shares `data`: its workspaces are on a filesystem
/// every host mounts (SPEC §1.3).
pub fn serve_postgres(
    data: &Path,
    url: &str,
    host_id: &str,
    extra: &[(&str, &str)],
) -> switchboard::child::ChildServer {
    let mut env = vec![
        ("SWITCHBOARD_STORAGE__KIND", "postgres"),
        ("SWITCHBOARD_STORAGE__URL", url),
        ("SWITCHBOARD_SERVER__HOST_ID", host_id),
    ];
    env.extend_from_slice(extra);
    switchboard::child::ChildServer::start(Path::new(env!("CARGO_BIN_EXE_switchboard")), data, &env)
        .expect("start switchboard")
}
