//! End to end: `switchboard runs list|get|events|stop|kill` (SPEC §8.2) — the real binary against a
//! running server (`--url`), and store-only reads of a stopped server's database (`--db`) — plus the
//! rest of the command line: exit codes, usage errors, help and completions. `runs get`, `events --follow`
//! and `stop --wait` are in `cli_follow.rs`; logging, `ask` and pipes in `cli_process.rs`.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;
use storage::RunId;

use serde_json::{json, Value};
use storage::record::{validate_record, RunRecord, RunStatus};
use storage::store::RunStore;
use storage::{SqliteStore, Synchronous};
use support::cli::{line_of, run_binary, runs, switchboard};
use support::TestApp;

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
        .rows_of_run(&RunId::from(id))
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
fn each_runs_subcommand_lists_only_the_flags_it_honours() {
    let help = |sub: &str| {
        let args = ["runs", sub, "--help"].map(String::from);
        let (code, out, err) = run_binary(&args, Duration::from_secs(30));
        assert_eq!(code, 0, "{err}");
        out
    };
    // `--db` reads a stopped server's database: list, get and events can; the rest need a server.
    for sub in ["list", "get", "events"] {
        assert!(
            help(sub).contains("--db <PATH>"),
            "runs {sub} --help lists --db"
        );
    }
    for sub in ["stop", "kill", "retry"] {
        let out = help(sub);
        assert!(
            !out.contains("--db"),
            "runs {sub} --help lists --db:\n{out}"
        );
        // What every subcommand honours stays listed.
        for flag in ["--url", "--token", "--json"] {
            assert!(out.contains(flag), "runs {sub} --help lists {flag}:\n{out}");
        }
    }
    assert!(help("retry").contains("--key"));
    // `--db` given before the subcommand, as when it was a flag of `runs`, still reads.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("switchboard.db");
    let (code, _, err) = run_binary(
        &[
            "runs".into(),
            "--db".into(),
            db.to_string_lossy().into_owned(),
            "list".into(),
        ],
        Duration::from_secs(30),
    );
    assert!(
        err.contains("no database"),
        "read as a database path: {code} {err}"
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
