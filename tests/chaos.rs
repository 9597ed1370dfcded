//! `switchboard chaos` as bounded CI tests (SPEC §11): the real binary starts two `serve` processes on one
//! SQLite database, four clients admit and steer while twelve faults land (kill -9, `/admin/crash`,
//! SIGSTOP past the lease, SIGTERM drain), and the verifier must count no violation; and the same on
//! PostgreSQL with three processes of three host identities on one database of a throwaway cluster (which
//! `chaos` starts itself; the server package must be installed).
//!
//! The seed is fixed so a failure replays the same fault schedule (`CHAOS_SEED` overrides it); on a
//! failure the scenario keeps its data dir (workspaces, every child's log, the SQLite database) and the
//! assertion message names it.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Far above the scenario's own bounds (≈ 30 s of faults and a settle capped at 2 minutes).
const WATCHDOG: Duration = Duration::from_secs(300);

/// The counts that must be zero.
const VIOLATIONS: [&str; 15] = [
    "lost_inputs",
    "duplicated_inputs",
    "duplicated_effects",
    "out_of_order_effects",
    "stuck_runs",
    "duplicate_terminals",
    "missing_runs",
    "repeated_seqs",
    "crossed_threads",
    "unanswered_completed",
    "calls_without_results",
    "miscounted_records",
    "lost_shown_events",
    "drain_failures",
    "unexpected_exits",
];

#[test]
fn chaos_with_crashes_pauses_and_drains_loses_and_duplicates_nothing() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_130);
    let report = chaos(
        &["--clients", "4", "--faults", "12", "--processes", "2"],
        seed,
        12,
    );
    assert_eq!(report["storage"], "sqlite", "{report}");
}

#[test]
fn chaos_on_postgres_with_three_hosts_loses_and_duplicates_nothing() {
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_202);
    let report = chaos(
        &[
            "--storage",
            "postgres",
            "--clients",
            "4",
            "--faults",
            "12",
            "--processes",
            "3",
        ],
        seed,
        12,
    );
    assert_eq!(
        (report["storage"].as_str(), report["processes"].as_u64()),
        (Some("postgres"), Some(3)),
        "{report}"
    );
}

/// Run `switchboard chaos ARGS --json --seed SEED` to its end (or [`WATCHDOG`]), assert that it found no
/// violation, settled, exited 0 and really ran (`faults` landed or were reported skipped, messages were
/// accepted and steered, runs were read back); answers its JSON line.
fn chaos(args: &[&str], seed: u64, faults: u64) -> Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .arg("chaos")
        .args(args)
        .args(["--json", "--seed", &seed.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start switchboard chaos");
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let until = Instant::now() + WATCHDOG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for switchboard chaos") {
            break Some(status);
        }
        if Instant::now() > until {
            // SIGTERM first: chaos then kills its `serve` children and keeps its data dir.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let grace = Instant::now() + Duration::from_secs(40);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < grace {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (
        out.join().expect("stdout reader"),
        err.join().expect("stderr reader"),
    );
    let Some(status) = status else {
        panic!("chaos (seed {seed}) ran past {WATCHDOG:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    };

    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    let Some(line) = line else {
        panic!("chaos (seed {seed}) printed no JSON line ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}")
    };
    let report: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("the JSON line does not parse ({e}): {line}"));

    // Every count at once, so one failure shows the whole picture.
    let nonzero: Vec<String> = VIOLATIONS
        .iter()
        .filter_map(|k| match report[k].as_u64() {
            Some(0) => None,
            Some(n) => Some(format!("{k} = {n}")),
            None => Some(format!("{k} missing")),
        })
        .collect();
    assert!(
        nonzero.is_empty(),
        "chaos (seed {seed}) found violations: {}\n{line}\nstderr:\n{stderr}",
        nonzero.join(", ")
    );
    assert_eq!(
        report["settled"], true,
        "every run settled within 2 minutes: {line}"
    );
    assert!(
        status.success(),
        "chaos exits 0 without violations ({status}): {line}\nstderr:\n{stderr}"
    );

    // The scenario really ran: faults landed, messages were accepted and steered, runs were read back.
    let landed =
        report["faults"].as_u64().unwrap_or(0) + report["pauses_skipped"].as_u64().unwrap_or(0);
    assert_eq!(
        landed, faults,
        "every fault landed or was reported skipped: {line}"
    );
    assert!(
        report["accepted"].as_u64().unwrap_or(0) > 0,
        "messages were accepted: {line}"
    );
    assert!(
        report["steered"].as_u64().unwrap_or(0) > 0,
        "follow-ups steered into live runs: {line}"
    );
    assert!(
        report["runs"].as_u64().unwrap_or(0) > 0,
        "runs were read back: {line}"
    );
    assert!(
        report["shown_events"].as_u64().unwrap_or(0) > 0,
        "a reader was served committed events of runs live elsewhere: {line}"
    );
    report
}
