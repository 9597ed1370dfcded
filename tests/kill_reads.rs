//! End to end (SPEC §5.6, §7): a run killed in another process disappears from this process's reads
//! within one ledger listing, although this process still holds it in its registry (a finished run stays
//! there for a minute).
//!
//! Two real `switchboard` processes share one SQLite database (as in `tests/kill.rs`): A runs a short run
//! to completion, B kills it through its API (deletion fence, then the purge of the record), and A — which
//! could otherwise serve the run from its registry for the rest of the minute — answers 404 and stops
//! listing it. Every wait polls observable state under a deadline well below the registry's TTL.

mod support;

use std::time::{Duration, Instant};
use storage::RunId;

use serde_json::{json, Value};
use storage::{RunStore, SqliteStore, Synchronous};
use support::child::{http, now_ms, wait_for, Proc};

/// How long A may take to stop serving the killed run: far below the registry's 60 s TTL (so only the
/// kill check can explain it), far above one ledger listing (2 s).
const WITHIN: Duration = Duration::from_secs(15);
const DEADLINE: Duration = Duration::from_secs(60);

fn get(p: &Proc, path: &str) -> (u16, Value) {
    http(|c| c.get(p.url(path)))
}

fn listed(p: &Proc, run_id: &str) -> bool {
    let (status, body) = get(p, "/api/runs?status=all");
    assert_eq!(status, 200, "{body}");
    body["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .any(|r| r["id"] == run_id)
}

#[test]
fn a_run_killed_through_another_process_disappears_from_this_processs_reads_within_one_listing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path();
    let a = Proc::start(data, &[]);
    let b = Proc::start(data, &[]);

    // A runs two short runs to completion; both are in A's registry (finished, persisted) for a minute.
    let post = |thread: &str| {
        let (status, body) = http(|c| {
            c.post(a.url("/api/messages")).json(
                &json!({"thread": thread, "channel": "k", "user": "u", "text": "steps=1 ms=0"}),
            )
        });
        assert_eq!(status, 202, "{body}");
        body["runId"].as_str().expect("runId").to_owned()
    };
    let (doomed, kept) = (post("t-doomed"), post("t-kept"));
    for id in [&doomed, &kept] {
        wait_for(
            &format!("A to serve {id} finished and persisted"),
            DEADLINE,
            || {
                let (status, v) = get(&a, &format!("/api/runs/{id}"));
                (status == 200 && v["finished"] == true && v["persisted"] == true).then_some(())
            },
        );
    }
    assert!(listed(&a, &doomed) && listed(&a, &kept));

    // B kills the run it never drove: the deletion fence, then (nobody drives it) the purge at once.
    let (status, body) = http(|c| c.delete(b.url(&format!("/api/runs/{doomed}"))));
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("killing")),
        "{body}"
    );
    let mut db = SqliteStore::open(&data.join("switchboard.db"), Synchronous::Normal)
        .expect("open the database");
    assert!(storage::ledger::RunLedger::is_killed(&mut db, &RunId::from(&doomed)).unwrap());
    wait_for("B's purge of the record", DEADLINE, || {
        db.get(&RunId::from(&doomed), now_ms())
            .unwrap()
            .is_none()
            .then_some(())
    });
    assert_eq!(
        get(&b, &format!("/api/runs/{doomed}")).0,
        404,
        "B answers the killed run as unknown"
    );

    // A still holds the run in its registry; within one ledger listing it serves it from nowhere.
    let killed_at = Instant::now();
    wait_for(
        "A to answer the killed run 404 and stop listing it",
        WITHIN,
        || (get(&a, &format!("/api/runs/{doomed}")).0 == 404 && !listed(&a, &doomed)).then_some(()),
    );
    eprintln!(
        "kill on B to gone on A: {} ms",
        killed_at.elapsed().as_millis()
    );
    for path in [
        format!("/api/runs/{doomed}?include=events"),
        format!("/api/runs/{doomed}/events"),
        format!("/api/runs/{doomed}/friction"),
    ] {
        assert_eq!(get(&a, &path).0, 404, "{path}");
    }
    for status in ["finished", "active"] {
        let (code, body) = get(&a, &format!("/api/runs?status={status}"));
        assert_eq!(code, 200, "{body}");
        assert!(
            !body["runs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["id"] == doomed.as_str()),
            "{status}: {body}"
        );
    }
    // The run nobody killed is served by A as before.
    let (status, v) = get(&a, &format!("/api/runs/{kept}"));
    assert_eq!((status, v["finished"].as_bool()), (200, Some(true)), "{v}");
    assert!(listed(&a, &kept));
}
