//! End to end: `switchboard runs get` (the answer, the error, the stopper), `runs events --follow` (the live
//! stream, reconnects with `Last-Event-ID`) and `runs stop --wait`, the real binary against a running server.

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{json, Value};
use storage::record::RunStatus;
use support::cli::{run_binary, switchboard};
use support::TestApp;

// ---- runs get: the answer, the error and who stopped the run ----

#[actix_web::test]
async fn runs_get_shows_the_answer_the_error_and_the_stopper() {
    let app = TestApp::spawn().await;
    let url = app.base.clone();
    let ok = app.start_run("t-ok", "steps=1 ms=0 answer=forty-two").await;
    let failed = app.start_run("t-fail", "steps=2 ms=0 fail_at=2").await;
    let stopped = app.start_run("t-stop", "steps=5 ms=60000").await;
    app.final_record(&ok).await;
    let failed_record = app.final_record(&failed).await;
    assert_eq!(failed_record.head.status, RunStatus::Failed);
    let message = failed_record
        .events
        .iter()
        .find(|e| e["type"] == "run_failed")
        .expect("a run_failed event")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    app.event(&stopped, "tool_call").await;
    let (code, _, err) =
        switchboard(&["runs", "stop", &stopped, "--mode", "hard", "--url", &url]).await;
    assert_eq!(code, 0, "{err}");
    app.final_record(&stopped).await;

    let field = |out: &str, key: &str| -> Option<String> {
        out.lines()
            .find(|l| l.starts_with(&format!("{key:<9} ")))
            .map(|l| l[10..].to_owned())
    };
    let (code, out, err) = switchboard(&["runs", "get", &ok, "--url", &url]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(field(&out, "Answer").as_deref(), Some("forty-two"), "{out}");
    assert_eq!(
        (field(&out, "Error"), field(&out, "Stopped")),
        (None, None),
        "{out}"
    );

    let (code, out, _) = switchboard(&["runs", "get", &failed, "--url", &url]).await;
    assert_eq!(code, 0);
    assert_eq!(field(&out, "Status").as_deref(), Some("failed"), "{out}");
    assert_eq!(field(&out, "Error"), Some(message.clone()), "{out}");

    let (code, out, _) = switchboard(&["runs", "get", &stopped, "--url", &url]).await;
    assert_eq!(code, 0);
    assert_eq!(
        field(&out, "Status").as_deref(),
        Some("stopped_hard"),
        "{out}"
    );
    assert_eq!(
        field(&out, "Stopped").as_deref(),
        Some("hard, by token:operator"),
        "{out}"
    );

    // --json carries the same, in the RunView's names, without the events unless asked.
    let (_, out, _) = switchboard(&["runs", "get", &failed, "--url", &url, "--json"]).await;
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["error"], message.as_str());
    assert!(v.get("events").is_none(), "{v}");
    let (_, out, _) = switchboard(&["runs", "get", &stopped, "--url", &url, "--json"]).await;
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["stoppedBy"],
        json!({"mode": "hard", "actor": {"kind": "token", "id": "operator"}})
    );
    let (_, out, _) = switchboard(&["runs", "get", &ok, "--url", &url, "--json"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["answer"],
        "forty-two"
    );

    // A terminal status lists only the runs that ended so (whether the server filters or the CLI does).
    for (status, want) in [
        ("failed", &failed),
        ("stopped_hard", &stopped),
        ("completed", &ok),
    ] {
        let (code, out, err) =
            switchboard(&["runs", "list", "--url", &url, "--status", status, "--json"]).await;
        assert_eq!(code, 0, "{err}");
        let ids: Vec<Value> = serde_json::from_str::<Value>(&out).unwrap()["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].clone())
            .collect();
        assert_eq!(ids, [json!(want)], "--status {status}");
    }
    let (code, out, _) =
        switchboard(&["runs", "list", "--url", &url, "--status", "interrupted"]).await;
    assert_eq!((code, out.as_str()), (0, "no runs\n"));

    // A stopped server's database says the same.
    let db = app.db_path();
    let TestApp {
        running, dir: _dir, ..
    } = app;
    running.stop().await.unwrap();
    let db = db.to_str().unwrap();
    let (code, out, err) = switchboard(&["runs", "get", &failed, "--db", db]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(field(&out, "Error"), Some(message), "{out}");
    let (_, out, _) = switchboard(&["runs", "get", &stopped, "--db", db]).await;
    assert_eq!(
        field(&out, "Stopped").as_deref(),
        Some("hard, by token:operator"),
        "{out}"
    );
    let (_, out, _) = switchboard(&["runs", "get", &ok, "--db", db]).await;
    assert_eq!(field(&out, "Answer").as_deref(), Some("forty-two"), "{out}");
    // A terminal status filters the history, and "not found" is exit 3 here too.
    let (code, out, err) =
        switchboard(&["runs", "list", "--db", db, "--status", "failed", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let ids: Vec<Value> = serde_json::from_str::<Value>(&out).unwrap()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    assert_eq!(ids, [json!(failed)]);
    let (code, out, _) = switchboard(&["runs", "list", "--db", db, "--since", "1h"]).await;
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 4, "a header and three runs: {out}");
    let (code, out, _) = switchboard(&[
        "runs",
        "list",
        "--db",
        db,
        "--since",
        "2999-01-01T00:00:00Z",
    ])
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("no runs"), "{out}");
    let (code, _, err) = switchboard(&["runs", "get", "no-such-run", "--db", db]).await;
    assert_eq!(code, 3, "{err}");
}

// ---- events --follow and stop --wait ----

/// The seqs of the `#<seq>` lines of `out`, in order.
fn seqs_of(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

#[actix_web::test]
async fn events_follow_prints_the_live_stream_until_the_run_ends() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=3 ms=300 answer=followed").await;
    let url = app.base.clone();
    let (code, out, err) = switchboard(&["runs", "events", &id, "--follow", "--url", &url]).await;
    assert_eq!(code, 0, "{err}");
    let record = app.final_record(&id).await;
    // Every event once, in seq order, then the end line.
    let want: Vec<u64> = record
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs_of(&out), want, "{out}");
    assert!(out.contains("answer: followed"), "{out}");
    assert!(
        out.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("end: completed at "),
        "{out}"
    );

    // From a cursor, as JSON lines: the events after it, then {"end": {...}}.
    let (code, out, err) = switchboard(&[
        "runs",
        "events",
        &id,
        "--follow",
        "--after-seq",
        "2",
        "--json",
        "--url",
        &url,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (end, events) = lines.split_last().unwrap();
    assert_eq!(
        events
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        want[2..]
    );
    assert_eq!(end["end"]["status"], "completed", "{end}");
}

/// Read an HTTP request head (up to the blank line) from `conn`.
fn read_head(conn: &mut std::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[test]
fn events_follow_reconnects_with_last_event_id_and_prints_nothing_twice() {
    // A stand-in server: the first stream drops after seqs 1 and 2; the second (which must ask to resume
    // after 2) replays 2 — a repeat the client must not print — then sends 3 and the end.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let frame = |seq: u64| {
        let data = json!({"type": "note", "seq": seq, "kind": "k", "summary": format!("n{seq}")});
        format!("id: {seq}\nevent: run_event\ndata: {data}\n\n")
    };
    let bodies = [
        format!("{}: ping\n\n{}", frame(1), frame(2)),
        format!(
            "{}{}event: end\ndata: {}\n\n",
            frame(2),
            frame(3),
            json!({"status": "completed", "finishedAt": 1_800_000_000_000_i64})
        ),
    ];
    let server = std::thread::spawn(move || {
        let mut heads = Vec::new();
        for body in bodies {
            let (mut conn, _) = listener.accept().unwrap();
            heads.push(read_head(&mut conn));
            write!(conn, "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}").unwrap();
        }
        heads
    });
    let args: Vec<String> = ["runs", "events", "r1", "--follow", "--url", &url]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (code, out, err) = run_binary(&args, Duration::from_secs(30));
    let heads = server.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        heads[0].starts_with("GET /api/runs/r1/stream?afterSeq=0 "),
        "{}",
        heads[0]
    );
    assert!(
        heads[1]
            .to_ascii_lowercase()
            .contains("\r\nlast-event-id: 2\r\n"),
        "resumed after the last seq printed: {}",
        heads[1]
    );
    assert_eq!(seqs_of(&out), [1, 2, 3], "{out}");
    assert!(
        out.ends_with("end: completed at 2027-01-15 08:00:00Z\n"),
        "{out}"
    );
}

#[actix_web::test]
async fn stop_wait_returns_once_the_run_has_ended() {
    let app = TestApp::spawn().await;
    let url = app.base.clone();
    // A soft stop lets the current step (300 ms of tool) finish first: the command waits for it.
    let id = app.start_run("t1", "steps=50 ms=300").await;
    app.event(&id, "tool_call").await;
    let (code, out, err) = switchboard(&["runs", "stop", &id, "--wait", "--url", &url]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("{id}: ended stopped_soft at ")),
        "{out}"
    );
    // Ended by the time the command returned — not eventually.
    let (status, view) = app.get_json(&format!("/api/runs/{id}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (view["finished"].as_bool(), view["status"].as_str()),
        (Some(true), Some("stopped_soft")),
        "{view}"
    );

    // Hard, as JSON: the stop's answer plus how the run ended.
    let id = app.start_run("t2", "steps=5 ms=60000").await;
    app.event(&id, "tool_call").await;
    let (code, out, err) = switchboard(&[
        "runs",
        "stop",
        &id,
        "--mode",
        "hard",
        "--wait",
        "--timeout",
        "30s",
        "--json",
        "--url",
        &url,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["ended"]["status"].as_str()),
        (Some("stopping"), Some("stopped_hard")),
        "{v}"
    );
    let (_, view) = app.get_json(&format!("/api/runs/{id}"), None).await;
    assert_eq!(view["finished"], true, "{view}");
}
