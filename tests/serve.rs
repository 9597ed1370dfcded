//! End to end: the process boots, answers `/healthz`, and refuses a bad configuration by name.

mod support;

use std::process::Command;

use support::TestApp;

#[actix_web::test]
async fn healthz_reports_generation_pid_version_storage_and_draining() {
    let app = TestApp::spawn().await;
    let res = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("GET /healthz");
    assert_eq!(res.status().as_u16(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["ok"], true);
    assert_eq!(body["generation"], app.running.generation.as_str());
    assert!(
        storage::Generation::parse(body["generation"].as_str().unwrap()).is_some(),
        "{body}"
    );
    assert_eq!(body["pid"], std::process::id());
    assert_eq!(body["version"], switchboard::VERSION);
    assert_eq!(
        (body["storage"].as_str(), body["storageKind"].as_str()),
        (Some("ok"), Some("sqlite")),
        "{body}"
    );
    assert_eq!(body["draining"], false);
    assert!(
        app.db_path().exists(),
        "the database was created and migrated at boot"
    );
    app.running.stop().await.expect("clean stop");
}

#[actix_web::test]
async fn memory_storage_boots_without_a_database_file() {
    let app =
        TestApp::spawn_with(|c| c.storage.kind = switchboard::config::StorageKind::Memory).await;
    let body: serde_json::Value = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (body["storage"].as_str(), body["storageKind"].as_str()),
        (Some("ok"), Some("memory")),
        "{body}"
    );
    assert!(!app.db_path().exists());
}

#[test]
fn a_bad_config_key_fails_startup_naming_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[ledger]\nlease_ms = 30000\nheartbeet_ms = 10000\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["serve", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .output()
        .expect("run switchboard");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ledger.heartbeet_ms") && stderr.contains("bad.toml"),
        "{stderr}"
    );
}

/// A port in use: one error line naming the address, exit 1, and nothing touched storage (the bind comes
/// before the database is opened, migrated or reclaimed).
#[test]
fn a_port_in_use_is_one_error_line_and_exit_1_with_storage_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let db = dir.path().join("db/s.db");
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .arg("serve")
        .current_dir(dir.path())
        .env("SWITCHBOARD_SERVER__BIND", &addr)
        .env("SWITCHBOARD_STORAGE__PATH", &db)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .output()
        .expect("run switchboard");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("switchboard:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(&addr) && errors[0].contains("in use"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("reclaim"),
        "{stderr}"
    );
    assert!(
        !db.exists() && !dir.path().join("db").exists(),
        "storage was touched before the bind"
    );
}

#[test]
fn the_binary_serves_healthz_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .arg("serve")
        .current_dir(dir.path())
        .env("SWITCHBOARD_SERVER__BIND", "127.0.0.1:0")
        .env("SWITCHBOARD_STORAGE__PATH", dir.path().join("db/s.db"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn switchboard");
    // Wait for the "listening" log line and read the bound address from it.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("switchboard exited before listening")
            .unwrap();
        if let Some(rest) = line
            .split("addr=")
            .nth(1)
            .filter(|_| line.contains("switchboard listening"))
        {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let body = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            reqwest::get(format!("http://{addr}/healthz"))
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        })
    })
    .join()
    .unwrap();
    assert!(
        storage::Generation::parse(body["generation"].as_str().unwrap()).is_some(),
        "{body}"
    );
    assert_eq!(body["pid"], child.id());
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn ask_runs_one_message_and_prints_the_answer_once_the_record_landed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ask.db");
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["ask", "steps=2 ms=0 answer=forty-two", "--db"])
        .arg(&db)
        .current_dir(dir.path())
        .output()
        .expect("run switchboard ask");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "forty-two");
    // The record is in the database the process used.
    let mut store = storage::SqliteStore::open(&db, storage::Synchronous::Full).unwrap();
    let q = storage::store::ListQuery::visible_to(storage::record::VisibilityFilter::All);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let items = storage::RunStore::list(&mut store, &q, now).unwrap().items;
    assert_eq!(items.len(), 1);
    assert!(items[0].head.thread_key.starts_with("cli:"));
    assert_eq!(items[0].head.status, storage::record::RunStatus::Completed);
}

#[actix_web::test]
async fn the_live_url_points_at_the_bound_address_when_public_base_url_is_unset() {
    let app = TestApp::spawn().await;
    assert!(app.running.addr.port() != 8080 && app.running.addr.port() != 0);
    let (status, body) = app
        .post(serde_json::json!({"thread": "t", "channel": "c", "user": "u", "text": "steps=0"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let live = body["liveUrl"].as_str().unwrap();
    assert!(
        live.starts_with(&format!("{}/runs/", app.base)),
        "{live} should start with {}",
        app.base
    );
}
