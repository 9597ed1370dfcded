//! End to end: `switchboard runs list|get|events|stop|kill` (SPEC §8.2) — the real binary against a
//! running server (`--url`), and store-only reads of a stopped server's database (`--db`).

mod support;

use serde_json::{json, Value};
use storage::record::{validate_record, RunStatus};
use support::TestApp;

/// Run `switchboard runs <args>` off the test's thread (the server shares it); answers (ok, stdout, stderr).
async fn runs(args: &[&str]) -> (bool, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
            .arg("runs")
            .args(&args)
            .env_remove("SWITCHBOARD_URL")
            .env_remove("SWITCHBOARD_TOKEN")
            .env("RUST_LOG", "warn")
            .output()
            .expect("run the switchboard binary");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    })
    .await
    .unwrap()
}

/// The line of a table that mentions `id`.
fn line_of<'a>(out: &'a str, id: &str) -> &'a str {
    out.lines().find(|l| l.contains(id)).unwrap_or_else(|| panic!("{id} not in:\n{out}"))
}

#[actix_web::test]
async fn runs_commands_read_and_stop_through_a_running_server() {
    let app = TestApp::spawn().await;
    let done = app.start_run("t-done", "steps=2 ms=0").await;
    app.final_record(&done).await;
    let live = app.start_run("t-live", "steps=5 ms=60000").await;
    app.event(&live, "tool_call").await;
    let url = app.base.clone();

    let (ok, out, err) = runs(&["list", "--url", &url]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("ID "), "a table with a header:\n{out}");
    assert!(line_of(&out, &live).contains(" live "), "{out}");
    assert!(line_of(&out, &done).contains(" completed "), "{out}");
    let (ok, out, _) = runs(&["list", "--url", &url, "--json", "--status", "finished"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["runs"].as_array().unwrap().len(), 1);
    assert_eq!(v["runs"][0]["id"], done.as_str());

    let (ok, out, _) = runs(&["get", &done, "--url", &url]).await;
    assert!(ok);
    assert!(out.lines().any(|l| l.starts_with("Status") && l.ends_with("completed")), "{out}");
    let (ok, out, _) = runs(&["get", &done, "--url", &url, "--events", "--json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["events"].as_array().unwrap().len(), 9);

    let (ok, out, _) = runs(&["events", &done, "--url", &url, "--after-seq", "2", "--limit", "3"]).await;
    assert!(ok);
    let seqs: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(seqs, ["#3", "#4", "#5"], "{out}");
    assert!(out.contains("more: --after-seq 5"));
    let (ok, out, _) = runs(&["events", &done, "--url", &url, "--after-seq", "2", "--limit", "3", "--all", "--json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["events"].as_array().unwrap().len(), 7);

    let (ok, out, err) = runs(&["stop", &live, "--mode", "hard", "--url", &url]).await;
    assert!(ok, "{err}");
    assert!(out.contains("stopping"), "{out}");
    assert_eq!(app.final_record(&live).await.head.status, RunStatus::StoppedHard);
    let (ok, _, err) = runs(&["stop", &live, "--url", &url]).await;
    assert!(!ok && err.contains("409"), "{err}");
    let (ok, _, err) = runs(&["get", "no-such-run", "--url", &url]).await;
    assert!(!ok && err.contains("404"), "{err}");
}

#[actix_web::test]
async fn runs_cli_sends_its_bearer_token() {
    let mut token = String::new();
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        token = support::add_token(c, "cli", &["runs:read", "messages:write"], json!({"kind": "all"}));
    })
    .await;
    let (ok, _, err) = runs(&["list", "--url", &app.base]).await;
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, out, err) = runs(&["list", "--url", &app.base, "--token", &token]).await;
    assert!(ok, "{err}");
    assert!(out.contains("no runs"), "{out}");
}

#[actix_web::test]
async fn runs_kill_deletes_through_the_api() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
    let (ok, out, err) = runs(&["kill", &id, "--url", &app.base]).await;
    assert!(ok, "{err}");
    assert!(out.contains("killing"), "{out}");
}

#[actix_web::test]
async fn db_reads_a_stopped_servers_history_and_shows_a_tombstone_as_unfinished() {
    let app = TestApp::spawn().await;
    let done = app.start_run("t1", "steps=2 ms=0").await;
    app.final_record(&done).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let tomb = validate_record(&json!({
        "id": "tomb-1", "label": "crashed mid-run", "agent": "demo", "channelId": "c1", "userId": "u1",
        "threadKey": "c1:z", "channelVisibility": "machine", "startedAt": now - 1000, "finishedAt": now - 1000,
        "status": "interrupted", "eventCount": 0, "storedEventCount": 0, "truncated": false, "events": [],
        "diagnosis": {"byCategory": {}}, "provisional": true
    }))
    .unwrap();
    app.running.storage.put(tomb, None).await.unwrap();
    let db = app.db_path();
    let TestApp { running, dir, .. } = app;
    running.stop().await.unwrap();
    let db = db.to_str().unwrap().to_owned();

    let (ok, out, err) = runs(&["list", "--db", &db]).await;
    assert!(ok, "{err}");
    assert!(line_of(&out, &done).contains(" completed "), "{out}");
    let tomb_line = line_of(&out, "tomb-1");
    assert!(tomb_line.contains("unfinished — no finish recorded") && !tomb_line.contains("interrupted"), "{out}");
    let (ok, out, _) = runs(&["list", "--db", &db, "--json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    let t = v["runs"].as_array().unwrap().iter().find(|r| r["id"] == "tomb-1").unwrap().clone();
    assert_eq!((t["provisional"].as_bool(), t["status"].as_str()), (Some(true), Some("interrupted")));

    let (ok, out, _) = runs(&["get", "tomb-1", "--db", &db]).await;
    assert!(ok);
    assert!(out.lines().any(|l| l.starts_with("Status") && l.ends_with("unfinished — no finish recorded")), "{out}");
    let (ok, out, _) = runs(&["get", &done, "--db", &db, "--events"]).await;
    assert!(ok);
    assert!(out.contains("answer: done"), "{out}");
    let (ok, out, _) = runs(&["events", &done, "--db", &db, "--after-seq", "7"]).await;
    assert!(ok);
    assert_eq!(out.lines().filter(|l| l.starts_with('#')).count(), 2, "{out}");
    let (ok, _, err) = runs(&["stop", &done, "--db", &db]).await;
    assert!(!ok && err.contains("running server"), "{err}");
    let (ok, _, err) = runs(&["get", "no-such-run", "--db", &db]).await;
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, _, err) = runs(&["list", "--db", &dir.path().join("missing.db").to_string_lossy()]).await;
    assert!(!ok && err.contains("no database"), "{err}");
}
