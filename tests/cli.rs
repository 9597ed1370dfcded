//! End to end: `switchboard runs list|get|events|stop|kill` (SPEC §8.2) — the real binary against a
//! running server (`--url`), and store-only reads of a stopped server's database (`--db`) — plus the
//! rest of the command line: exit codes, usage errors, help, completions and logging.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use storage::record::{validate_record, RunRecord, RunStatus};
use storage::store::RunStore;
use storage::{SqliteStore, Synchronous};
use support::TestApp;

/// Run `switchboard runs <args>` off the test's thread (the server shares it); answers (ok, stdout, stderr).
async fn runs(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["runs"];
    all.extend_from_slice(args);
    let (code, out, err) = switchboard(&all).await;
    (code == 0, out, err)
}

/// Run `switchboard <args>` off the test's thread; answers (exit code, stdout, stderr).
async fn switchboard(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || run_binary(&args, Duration::from_secs(60)))
        .await
        .unwrap()
}

/// Run the binary with `args`, killed (and the test failed) past `timeout`; answers (exit code, stdout,
/// stderr).
fn run_binary(args: &[String], timeout: Duration) -> (i32, String, String) {
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
fn line_of<'a>(out: &'a str, id: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(id))
        .unwrap_or_else(|| panic!("{id} not in:\n{out}"))
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
    assert!(
        out.lines()
            .any(|l| l.starts_with("Status") && l.ends_with("completed")),
        "{out}"
    );
    let (ok, out, _) = runs(&["get", &done, "--url", &url, "--events", "--json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["events"].as_array().unwrap().len(), 9);

    let (ok, out, _) = runs(&[
        "events",
        &done,
        "--url",
        &url,
        "--after-seq",
        "2",
        "--limit",
        "3",
    ])
    .await;
    assert!(ok);
    let seqs: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(seqs, ["#3", "#4", "#5"], "{out}");
    assert!(out.contains("more: --after-seq 5"));
    let (ok, out, _) = runs(&[
        "events",
        &done,
        "--url",
        &url,
        "--after-seq",
        "2",
        "--limit",
        "3",
        "--all",
        "--json",
    ])
    .await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["events"].as_array().unwrap().len(), 7);

    let (ok, out, err) = runs(&["stop", &live, "--mode", "hard", "--url", &url]).await;
    assert!(ok, "{err}");
    assert!(out.contains("stopping"), "{out}");
    assert_eq!(
        app.final_record(&live).await.head.status,
        RunStatus::StoppedHard
    );
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
        token = support::add_token(
            c,
            "cli",
            &["runs:read", "messages:write"],
            json!({"kind": "all"}),
        );
    })
    .await;
    let (ok, _, err) = runs(&["list", "--url", &app.base]).await;
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, out, err) = runs(&["list", "--url", &app.base, "--token", &token]).await;
    assert!(ok, "{err}");
    assert!(out.contains("no runs"), "{out}");
}

/// The per-run rows the database still holds for `id` (tables with none left out), read through the
/// storage crate's read-only store.
fn rows_left(db: &Path, id: &str) -> Vec<(&'static str, u64)> {
    let mut store = SqliteStore::open_read_only(db).expect("open the database read-only");
    store
        .rows_of_run(id)
        .expect("count rows")
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[actix_web::test]
async fn runs_kill_deletes_through_the_api() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    let record = app.final_record(&id).await;
    let keep = app.start_run("t2", "steps=1 ms=0").await;
    app.final_record(&keep).await;
    // Before: the record and its events are there, through the API and on disk.
    for path in [format!("/api/runs/{id}"), format!("/api/runs/{id}/events")] {
        assert_eq!(app.get_json(&path, None).await.0, 200, "{path}");
    }
    let before = rows_left(&app.db_path(), &id);
    assert!(before.contains(&("runs", 1)), "{before:?}");
    assert!(
        before.contains(&("run_events", record.events.len() as u64)),
        "{before:?}"
    );

    let (ok, out, err) = runs(&["kill", &id, "--url", &app.base]).await;
    assert!(ok, "{err}");
    assert!(out.contains("killing"), "{out}");

    // After: 404 through the API (the record, with or without its events, and its event pages) …
    for path in [
        format!("/api/runs/{id}"),
        format!("/api/runs/{id}?include=events"),
        format!("/api/runs/{id}/events"),
    ] {
        assert_eq!(app.get_json(&path, None).await.0, 404, "{path}");
    }
    let (ok, _, err) = runs(&["get", &id, "--url", &app.base]).await;
    assert!(!ok && err.contains("404"), "{err}");
    // … and purged from the database: only the deletion fence (which keeps the id from ever being
    // written again) is left.
    let db = app.db_path();
    let gone = support::wait_until(std::time::Duration::from_secs(10), || {
        let rows = rows_left(&db, &id);
        async move { (rows == [("deletion_fences", 1)]).then_some(()) }
    })
    .await;
    assert!(
        gone.is_some(),
        "rows left after the kill: {:?}",
        rows_left(&db, &id)
    );
    // The other run is untouched.
    assert_eq!(
        app.get_json(&format!("/api/runs/{keep}"), None).await.0,
        200
    );
    assert!(rows_left(&db, &keep).contains(&("runs", 1)));
}

#[actix_web::test]
async fn db_reads_a_stopped_servers_history_and_shows_a_tombstone_as_unfinished() {
    let app = TestApp::spawn().await;
    let done = app.start_run("t1", "steps=2 ms=0").await;
    app.final_record(&done).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
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
    assert!(
        tomb_line.contains("unfinished — no finish recorded") && !tomb_line.contains("interrupted"),
        "{out}"
    );
    let (ok, out, _) = runs(&["list", "--db", &db, "--json"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    let t = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "tomb-1")
        .unwrap()
        .clone();
    assert_eq!(
        (t["provisional"].as_bool(), t["status"].as_str()),
        (Some(true), Some("interrupted"))
    );

    let (ok, out, _) = runs(&["get", "tomb-1", "--db", &db]).await;
    assert!(ok);
    assert!(
        out.lines()
            .any(|l| l.starts_with("Status") && l.ends_with("unfinished — no finish recorded")),
        "{out}"
    );
    let (ok, out, _) = runs(&["get", &done, "--db", &db, "--events"]).await;
    assert!(ok);
    assert!(out.contains("answer: done"), "{out}");
    let (ok, out, _) = runs(&["events", &done, "--db", &db, "--after-seq", "7"]).await;
    assert!(ok);
    assert_eq!(
        out.lines().filter(|l| l.starts_with('#')).count(),
        2,
        "{out}"
    );
    let (ok, _, err) = runs(&["stop", &done, "--db", &db]).await;
    assert!(!ok && err.contains("running server"), "{err}");
    let (ok, _, err) = runs(&["get", "no-such-run", "--db", &db]).await;
    assert!(!ok && err.contains("not found"), "{err}");
    let (ok, _, err) = runs(&[
        "list",
        "--db",
        &dir.path().join("missing.db").to_string_lossy(),
    ])
    .await;
    assert!(!ok && err.contains("no database"), "{err}");
}

/// A database file's identity for "was it written?": its bytes, its schema stamp (read through the
/// storage crate) and its mtime.
fn fingerprint(db: &Path) -> (Vec<u8>, i64, std::time::SystemTime) {
    let bytes = std::fs::read(db).expect("read the database file");
    let version = SqliteStore::open_read_only(db)
        .and_then(|s| s.schema_version())
        .unwrap_or(-1);
    (
        bytes,
        version,
        std::fs::metadata(db).unwrap().modified().unwrap(),
    )
}

fn finished(id: &str, finished_at: i64, events: usize) -> RunRecord {
    let events: Vec<Value> =
        (1..=events).map(|i| json!({"type": "note", "seq": i, "at": finished_at, "kind": "k", "summary": format!("n{i}")})).collect();
    validate_record(&json!({
        "id": id, "agent": "demo", "channelId": "c1", "userId": "u1", "threadKey": "c1:t", "channelVisibility": "public",
        "startedAt": finished_at - 100, "finishedAt": finished_at, "status": "completed", "eventCount": events.len(),
        "storedEventCount": events.len(), "truncated": false, "events": events
    }))
    .unwrap()
}

#[actix_web::test]
async fn db_reads_never_write_the_database_and_refuse_a_newer_schema_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("switchboard.db");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    {
        // A current-version database as a stopped server leaves it (closed: the WAL checkpointed away).
        let mut s = SqliteStore::open(&db, Synchronous::Full).unwrap();
        s.put(&finished("r-old", now - 2_000, 3), None, now)
            .unwrap();
        s.put(&finished("r-new", now - 1_000, 2), None, now)
            .unwrap();
    }
    let before = fingerprint(&db);
    assert_eq!(before.1, storage::sqlite::schema::current_version());
    // A coarse mtime clock must not hide a write: let it tick first.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let path = db.to_str().unwrap().to_owned();

    let (ok, out, err) = runs(&["list", "--db", &path]).await;
    assert!(ok, "{err}");
    assert!(line_of(&out, "r-new").contains(" completed "), "{out}");
    assert!(
        out.find("r-new").unwrap() < out.find("r-old").unwrap(),
        "newest first:\n{out}"
    );
    let (ok, out, err) = runs(&["get", "r-old", "--db", &path, "--events", "--json"]).await;
    assert!(ok, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["events"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );
    let (ok, out, err) = runs(&["events", "r-old", "--db", &path, "--after-seq", "1"]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with('#')).count(),
        2,
        "{out}"
    );
    let (ok, _, err) = runs(&["kill", "r-old", "--db", &path]).await;
    assert!(!ok && err.contains("running server"), "{err}");
    assert!(
        before == fingerprint(&db),
        "a --db read changed the database's bytes, schema version or mtime"
    );

    // A database stamped by an older build is read as is: never migrated (the stamp, the 4 bytes at
    // offset 60 of the header, is what decides migrations — a migrating reader would run the last one
    // again here and fail on its duplicate column).
    let mut bytes = std::fs::read(&db).unwrap();
    let older = storage::sqlite::schema::current_version() as i32 - 1;
    bytes[60..64].copy_from_slice(&older.to_be_bytes());
    let older_db = dir.path().join("older.db");
    std::fs::write(&older_db, &bytes).unwrap();
    let before = fingerprint(&older_db);
    assert_eq!(before.1, older as i64);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (ok, out, err) = runs(&["list", "--db", older_db.to_str().unwrap(), "--json"]).await;
    assert!(ok, "{err}");
    let ids: Vec<String> = serde_json::from_str::<Value>(&out).unwrap()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["r-new", "r-old"]);
    let (ok, _, err) = runs(&[
        "get",
        "r-old",
        "--db",
        older_db.to_str().unwrap(),
        "--events",
    ])
    .await;
    assert!(ok, "{err}");
    assert!(
        before == fingerprint(&older_db),
        "a --db read migrated or otherwise wrote an older database"
    );

    // A database stamped by a newer build is refused by name, and left as it was.
    let newer = storage::sqlite::schema::current_version() as i32 + 7;
    bytes[60..64].copy_from_slice(&newer.to_be_bytes());
    let newer_db = dir.path().join("newer.db");
    std::fs::write(&newer_db, &bytes).unwrap();
    let before = fingerprint(&newer_db);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (ok, out, err) = runs(&["list", "--db", newer_db.to_str().unwrap()]).await;
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!("schema version {newer} is newer")),
        "{err}"
    );
    assert!(
        err.contains(newer_db.to_str().unwrap()),
        "the message names the file: {err}"
    );
    assert!(
        before == fingerprint(&newer_db),
        "a refused read changed the file"
    );
    // Nothing migrated it either: the storage crate still sees the newer stamp.
    assert!(
        matches!(SqliteStore::open_read_only(&newer_db), Err(storage::Error::SchemaTooNew { found, .. }) if found == newer as i64)
    );

    // A missing file is an error naming it, and nothing is created.
    let missing = dir.path().join("missing.db");
    let (ok, _, err) = runs(&["list", "--db", missing.to_str().unwrap()]).await;
    assert!(
        !ok && err.contains("no database at") && err.contains(missing.to_str().unwrap()),
        "{err}"
    );
    assert!(!missing.exists());
}

// ---- Exit codes (SPEC §8.2): 0 ok, 1 other, 2 usage, 3 not found, 4 conflict, 5 denied, 6 unavailable ----

#[actix_web::test]
async fn runs_exit_codes_follow_the_api_answer() {
    let app = TestApp::spawn().await;
    let done = app.start_run("t-done", "steps=1 ms=0").await;
    app.final_record(&done).await;
    let url = app.base.clone();

    // 404 → 3, for a run and for its events.
    let (code, _, err) = switchboard(&["runs", "get", "no-such-run", "--url", &url]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("404"), "{err}");
    let (code, _, err) = switchboard(&["runs", "events", "no-such-run", "--url", &url]).await;
    assert_eq!(code, 3, "{err}");
    // 409 → 4: a finished run cannot be stopped.
    let (code, _, err) = switchboard(&["runs", "stop", &done, "--url", &url]).await;
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("409"), "{err}");
    // 503 → 6: the server answers, but its storage is away (a read that needs the store).
    app.running.storage.inject_outage(true);
    let (code, _, err) = switchboard(&["runs", "get", "not-in-memory", "--url", &url]).await;
    app.running.storage.inject_outage(false);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("503"), "{err}");
    // Nothing listening → 6 as well: the server is unavailable, whatever the reason.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("http://127.0.0.1:{port}");
    let (code, _, err) = switchboard(&["runs", "list", "--url", &nowhere]).await;
    assert_eq!(code, 6, "{err}");
    // A follow that never got a stream says so at once, not after its reconnect budget.
    let started = std::time::Instant::now();
    let (code, _, err) =
        switchboard(&["runs", "events", "r1", "--follow", "--url", &nowhere]).await;
    assert_eq!(code, 6, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // And a success is 0.
    let (code, _, err) = switchboard(&["runs", "get", &done, "--url", &url]).await;
    assert_eq!(code, 0, "{err}");
}

#[actix_web::test]
async fn runs_without_credentials_or_scope_exit_5() {
    let mut reader = String::new();
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        reader = support::add_token(c, "reader", &["runs:read"], json!({"kind": "all"}));
    })
    .await;
    let url = app.base.clone();
    // No token, and a token the server does not know: 401.
    let (code, _, err) = switchboard(&["runs", "list", "--url", &url]).await;
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("401"), "{err}");
    let (code, _, err) =
        switchboard(&["runs", "list", "--url", &url, "--token", "not-a-token"]).await;
    assert_eq!(code, 5, "{err}");
    // A reader may read but not stop or kill: 403.
    let (code, out, err) = switchboard(&["runs", "list", "--url", &url, "--token", &reader]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("no runs"), "{out}");
    for cmd in ["stop", "kill"] {
        let (code, _, err) =
            switchboard(&["runs", cmd, "some-run", "--url", &url, "--token", &reader]).await;
        assert_eq!(code, 5, "{cmd}: {err}");
        assert!(err.contains("403"), "{cmd}: {err}");
    }
    // The token may also come from the environment.
    let args: Vec<String> = ["runs", "list", "--url", &url]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let reader2 = reader.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_switchboard"))
            .args(&args)
            .env("SWITCHBOARD_TOKEN", reader2)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn arguments_outside_the_apis_caps_are_usage_errors_naming_the_flag() {
    let url = ["--url", "http://127.0.0.1:9"]; // never reached: clap refuses first
    let cases: &[(&[&str], &str)] = &[
        (&["runs", "list", "--limit", "500"], "--limit"),
        (&["runs", "list", "--limit", "0"], "--limit"),
        (&["runs", "events", "r1", "--limit", "5001"], "--limit"),
        (&["runs", "list", "--status", "bogus"], "--status"),
        (&["runs", "list", "--since", "last tuesday"], "--since"),
        (&["runs", "list", "--before-id", "r1"], "--before"),
        (&["runs", "stop", "r1", "--mode", "gentle"], "--mode"),
        (&["runs", "stop", "r1", "--timeout", "5s"], "--wait"),
        (&["runs", "get", "../etc/passwd"], "<ID>"),
        (&["runs", "events", "r1", "--follow", "--all"], "--follow"),
        (&["serve", "--log-format", "xml"], "--log-format"),
        (&["completions", "tcsh"], "<SHELL>"),
    ];
    for (args, flag) in cases {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        if args[0] == "runs" {
            all.extend(url.iter().map(|s| s.to_string()));
        }
        let (code, out, err) = run_binary(&all, Duration::from_secs(30));
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(flag), "{args:?} names {flag}: {err}");
    }
    // The caps themselves are accepted (here the unreachable server answers: exit 6, not 2).
    for args in [
        &["runs", "list", "--limit", "200"][..],
        &["runs", "events", "r1", "--limit", "5000"][..],
    ] {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(url.iter().map(|s| s.to_string()));
        let (code, _, err) = run_binary(&all, Duration::from_secs(30));
        assert_eq!(code, 6, "{args:?}: {err}");
    }
    // What --db cannot do is a usage error too, before any file is opened.
    for args in [
        &["runs", "stop", "r1"][..],
        &["runs", "kill", "r1"][..],
        &["runs", "events", "r1", "--follow"][..],
        &["runs", "list", "--status", "active"][..],
    ] {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--db".to_string(),
            "/nonexistent/switchboard.db".to_string(),
        ]);
        let (code, _, err) = run_binary(&all, Duration::from_secs(30));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("running server"), "{args:?}: {err}");
    }
}

#[test]
fn help_lists_the_values_of_every_enumerated_flag() {
    let help = |args: &[&str]| {
        let all: Vec<String> = args
            .iter()
            .map(|s| s.to_string())
            .chain(["--help".to_string()])
            .collect();
        let (code, out, err) = run_binary(&all, Duration::from_secs(30));
        assert_eq!(code, 0, "{err}");
        out
    };
    let list = help(&["runs", "list"]);
    for value in [
        "active",
        "finished",
        "all",
        "completed",
        "failed",
        "stopped_soft",
        "stopped_hard",
        "interrupted",
    ] {
        assert!(
            list.contains(value),
            "runs list --help lists {value}:\n{list}"
        );
    }
    assert!(
        list.contains("--since <WHEN>") && list.contains("RFC 3339"),
        "{list}"
    );
    let stop = help(&["runs", "stop"]);
    assert!(
        stop.contains("soft") && stop.contains("hard") && stop.contains("--wait"),
        "{stop}"
    );
    let serve = help(&["serve"]);
    assert!(
        serve.contains("--log-format") && serve.contains("json") && serve.contains("text"),
        "{serve}"
    );
    let completions = help(&["completions"]);
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        assert!(completions.contains(shell), "{completions}");
    }
    let events = help(&["runs", "events"]);
    assert!(
        events.contains("--follow") && events.contains("Last-Event-ID"),
        "{events}"
    );
    let runs = help(&["runs"]);
    assert!(
        runs.contains("6 unavailable"),
        "the exit codes are documented: {runs}"
    );
}

#[test]
fn completions_print_a_shell_script() {
    let (code, out, err) = run_binary(
        &["completions".into(), "bash".into()],
        Duration::from_secs(30),
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("_switchboard()") && out.contains("complete -F _switchboard"),
        "{out}"
    );
    assert!(
        out.contains("--log-format") && out.contains("--follow"),
        "every subcommand's flags are completed"
    );
    let (code, out, _) = run_binary(
        &["completions".into(), "zsh".into()],
        Duration::from_secs(30),
    );
    assert_eq!(code, 0);
    assert!(out.starts_with("#compdef switchboard"), "{out}");
}

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

// ---- Logging ----

/// `cmd` with an empty environment but `PATH`: other tests here set `SWITCHBOARD_TEST_TOKEN_*` variables
/// at any moment, which a server would read as configuration overrides (and `NO_COLOR` must be unset).
fn clean_env(cmd: &mut Command) -> &mut Command {
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd
}

/// Start `switchboard serve <extra>` with stderr into `log` (a file: not a terminal) and no `NO_COLOR`;
/// once it listens, stop it with SIGTERM and answer the log.
fn serve_once(dir: &Path, log: &Path, extra: &[&str]) -> String {
    serve_while(dir, log, extra, |_| {})
}

/// [`serve_once`], calling `work` with the bound address (`127.0.0.1:<port>`) before the SIGTERM.
fn serve_while(dir: &Path, log: &Path, extra: &[&str], work: impl FnOnce(&str)) -> String {
    let file = std::fs::File::create(log).unwrap();
    let mut child = clean_env(&mut Command::new(env!("CARGO_BIN_EXE_switchboard")))
        .arg("serve")
        .args(extra)
        .current_dir(dir)
        .env("SWITCHBOARD_SERVER__BIND", "127.0.0.1:0")
        .env("SWITCHBOARD_STORAGE__PATH", dir.join("s.db"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("spawn switchboard serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("switchboard listening")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never listened: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("switchboard listening"))
        .unwrap();
    let addr: String = line[line.find("127.0.0.1:").unwrap()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    work(&addr);
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(child.wait().unwrap().success());
    std::fs::read_to_string(log).unwrap()
}

#[test]
fn serve_logs_to_a_file_carry_no_ansi_escapes_in_text_or_json() {
    let dir = tempfile::tempdir().unwrap();
    let text = serve_once(dir.path(), &dir.path().join("text.log"), &[]);
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escapes in a redirected log:\n{text:?}"
    );
    assert!(
        text.lines().any(|l| l.contains(" INFO ")
            && l.contains("switchboard listening")
            && l.contains("addr=127.0.0.1:")),
        "{text}"
    );

    let json = serve_once(
        dir.path(),
        &dir.path().join("json.log"),
        &["--log-format", "json"],
    );
    assert!(!json.contains('\u{1b}'), "{json:?}");
    let lines: Vec<Value> = json
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    let listening = lines
        .iter()
        .find(|l| l["fields"]["message"] == "switchboard listening")
        .expect("the listening line");
    assert_eq!(listening["level"], "INFO");
    let f = &listening["fields"];
    assert!(
        f["addr"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{listening}"
    );
    // The banner: version, generation, the database, the configuration and where the UI is.
    assert_eq!(f["version"], switchboard::VERSION);
    assert!(
        storage::Generation::parse(f["generation"].as_str().unwrap()).is_some(),
        "{listening}"
    );
    assert!(
        f["database"].as_str().unwrap().ends_with("s.db") && f["config"].is_string(),
        "{listening}"
    );
    assert!(
        f["ui"].as_str().unwrap().starts_with("http://127.0.0.1:")
            && f["ui"].as_str().unwrap().ends_with("/runs"),
        "{listening}"
    );
    // Migrations are debug detail.
    assert!(!json.contains("migrated"), "{json}");
}

/// Every 4xx and 5xx is an info access line: method, route pattern (never the path's values), status,
/// the error code.
#[test]
fn a_refused_request_is_an_info_access_line_naming_the_route_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let log = serve_while(dir.path(), &dir.path().join("access.log"), &[], |addr| {
        let url = format!("http://{addr}/api/runs/no-such-run-id");
        let status = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async { reqwest::get(url).await.unwrap().status().as_u16() })
        })
        .join()
        .unwrap();
        assert_eq!(status, 404);
    });
    let line = log
        .lines()
        .find(|l| l.contains("request refused or failed"))
        .unwrap_or_else(|| panic!("no access line:\n{log}"));
    assert!(
        line.contains(" INFO ") && line.contains("status=404") && line.contains("/api/runs/{id}"),
        "{line}"
    );
    assert!(
        line.contains("not_found") && !line.contains("no-such-run-id"),
        "{line}"
    );
}

/// An operator finds why a run failed from the log alone (at info): one line at the run's end with its
/// status and the (redacted) error.
#[test]
fn a_failed_run_ends_with_one_info_line_naming_its_status_and_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    clean_env(&mut cmd)
        .args(["ask", "steps=2 ms=0 fail_at=1"])
        .current_dir(dir.path())
        .env("RUST_LOG", "info");
    let out = cmd.output().expect("run switchboard ask");
    assert_eq!(out.status.code(), Some(1));
    let log = String::from_utf8_lossy(&out.stderr);
    // The failure is said, with its error, on the last line.
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("switchboard: the run ended failed: "),
        "{log}"
    );
    // Nothing is left in the working directory: the database was a temporary one.
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "ask left files behind"
    );
    let end = log
        .lines()
        .find(|l| l.contains("run finished"))
        .unwrap_or_else(|| panic!("no run end line:\n{log}"));
    assert!(
        end.contains("status=\"failed\"") || end.contains("status=failed"),
        "{end}"
    );
    assert!(end.contains("error=") && end.contains("run_id="), "{end}");
}

#[test]
fn ask_logs_at_warn_unless_rust_log_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let ask = |rust_log: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
        clean_env(&mut cmd)
            .args(["ask", "steps=1 ms=0 answer=quiet"])
            .current_dir(dir.path())
            .env("SWITCHBOARD_STORAGE__PATH", dir.path().join("ask.db"));
        match rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
        let out = cmd.output().expect("run switchboard ask");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "quiet");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let quiet = ask(None);
    assert!(
        !quiet.contains("INFO") && !quiet.contains("switchboard listening"),
        "info lines without RUST_LOG:\n{quiet}"
    );
    let loud = ask(Some("info"));
    assert!(
        loud.contains("switchboard listening"),
        "RUST_LOG=info wins:\n{loud}"
    );
}

/// A client command whose reader has gone (`switchboard completions fish | head`) ends quietly on the
/// closed pipe, as Unix tools do: no panic, nothing on stderr.
#[test]
fn a_closed_pipe_ends_a_client_command_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["completions", "fish"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run switchboard completions");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
