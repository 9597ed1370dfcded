//! The real binary as a command-line client (`switchboard runs …`), for the CLI tests.

use std::process::{Command, Stdio};
use std::time::Duration;

/// Run `switchboard runs <args>` off the test's thread (the server shares it); answers (ok, stdout, stderr).
pub async fn runs(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["runs"];
    all.extend_from_slice(args);
    let (code, out, err) = switchboard(&all).await;
    (code == 0, out, err)
}

/// Run `switchboard <args>` off the test's thread; answers (exit code, stdout, stderr).
pub async fn switchboard(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || run_binary(&args, Duration::from_secs(60)))
        .await
        .unwrap()
}

/// Run the binary with `args`, killed (and the test failed) past `timeout`; answers (exit code, stdout,
/// stderr).
pub fn run_binary(args: &[String], timeout: Duration) -> (i32, String, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(args)
        .env_remove("SWITCHBOARD_URL")
        .env_remove("SWITCHBOARD_TOKEN")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the switchboard binary");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("wait for the switchboard binary"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("switchboard {args:?} still running after {timeout:?}");
        }
    };
    (
        out.status.code().expect("exited, not killed by a signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The line of a table that mentions `id`.
pub fn line_of<'a>(out: &'a str, id: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(id))
        .unwrap_or_else(|| panic!("{id} not in:\n{out}"))
}
