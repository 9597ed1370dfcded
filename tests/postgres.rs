//! End to end on PostgreSQL (SPEC §1.3): the configuration keys (`[storage] kind = "postgres"`, `url`,
//! `pool`, `[server] host_id`); the app on a throwaway cluster (`storage::testing::pg`) completes runs
//! readable through the JSON API; and three `serve` processes of three host identities on one database:
//! one is killed -9, the others resume its runs after the lease, under the same ids, once each.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use storage::record::{RunRecord, RunStatus};
use storage::{PgStore, RunStore};
use support::TestApp;
use switchboard::child::ChildServer;
use switchboard::config::{ConfigError, StorageKind};
use switchboard::Config;

fn parse_config(text: &str) -> Result<Config, ConfigError> {
    Config::parse("test.toml", text, Vec::new())
}


/// The app on a fresh database of the test cluster.
async fn spawn_on_postgres() -> (TestApp, String) {
    let url = storage::testing::pg::database();
    let u = url.clone();
    let app = TestApp::spawn_with(move |c| {
        c.storage.kind = StorageKind::Postgres;
        c.storage.url = Some(u);
        c.storage.pool = 2;
    })
    .await;
    (app, url)
}

#[actix_web::test]
async fn a_three_step_run_completes_on_postgres_and_reads_back_through_the_api() {
    let (app, _url) = spawn_on_postgres().await;
    let (status, health) = app.get_json("/healthz", None).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["storageKind"], "postgres", "{health}");

    let run_id = app.start_run("pg-e2e", "steps=3 ms=20").await;
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    // The record is in the database, not only in this process: a fresh connection reads it.
    let (status, v) = app.get_json(&format!("/api/runs/{run_id}?include=events"), None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["finished"].as_bool(), v["status"].as_str(), v["persisted"].as_bool()), (Some(true), Some("completed"), Some(true)), "{v}");
    let events = v["events"].as_array().expect("events");
    let steps: Vec<i64> = events.iter().filter(|e| e["type"] == "tool_result").filter_map(|e| e["step"].as_i64()).collect();
    assert_eq!(steps, [1, 2, 3], "three steps, once each: {v}");
    assert_eq!(events.last().map(|e| (e["type"].clone(), e["text"].clone())), Some(("answer".into(), "done".into())), "{v}");

    let (status, list) = app.get_json("/api/runs?status=finished", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["runs"][0]["id"], run_id.as_str(), "{list}");
    let running = app.running;
    tokio::time::timeout(Duration::from_secs(20), running.drain()).await.expect("drained in time").expect("drain");
}

#[test]
fn host_id_defaults_to_the_hostname_and_is_checked() {
    let c = parse_config("").expect("empty");
    assert_eq!((c.server.host_id.clone(), c.host_id()), (None, actors::host::hostname()));
    let env = vec![("SWITCHBOARD_SERVER__HOST_ID".to_owned(), "rack-2.b".to_owned())];
    assert_eq!(Config::parse("test.toml", "", env).expect("env").host_id(), "rack-2.b");
    assert_eq!(parse_config("[server]\nhost_id = \"a\"\n").expect("a").host_id(), "a");
    for text in ["[server]\nhost_id = \"\"\n", "[server]\nhost_id = \"two words\"\n"] {
        let e = parse_config(text).unwrap_err().to_string();
        assert!(e.contains("server.host_id"), "{text:?} → {e}");
    }
}

#[test]
fn postgres_storage_takes_url_and_pool_and_the_url_from_the_environment() {
    let c = parse_config("[storage]\nkind = \"postgres\"\nurl = \"postgres://sb@db.internal/switchboard\"\n").expect("postgres");
    assert_eq!(c.storage.kind, StorageKind::Postgres);
    assert_eq!(c.storage.url.as_deref(), Some("postgres://sb@db.internal/switchboard"));
    assert_eq!(c.storage.pool, 4, "pool defaults to 4");
    let c = parse_config("[storage]\nkind = \"postgres\"\nurl = \"postgresql://h/db\"\npool = 0\n").expect("pool 0");
    assert_eq!(c.storage.pool, 0);

    let env = vec![
        ("SWITCHBOARD_STORAGE__KIND".to_owned(), "postgres".to_owned()),
        ("SWITCHBOARD_STORAGE__URL".to_owned(), "postgres://sb:hunter2@10.0.0.5:5433/sb".to_owned()),
        ("SWITCHBOARD_STORAGE__POOL".to_owned(), "8".to_owned()),
    ];
    let c = Config::parse("test.toml", "[storage]\nurl = \"postgres://file/db\"\n", env).expect("env");
    assert_eq!(c.storage.kind, StorageKind::Postgres);
    assert_eq!(c.storage.url.as_deref(), Some("postgres://sb:hunter2@10.0.0.5:5433/sb"));
    assert_eq!(c.storage.pool, 8);
    // The password never shows in Debug output (which logs may carry).
    let debug = format!("{c:?}");
    assert!(!debug.contains("hunter2") && debug.contains("10.0.0.5:5433"), "{debug}");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn http(f: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder + Send) -> (u16, Value) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                match f(&reqwest::Client::new()).send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.json().await.unwrap_or(Value::Null))
                    }
                    Err(e) => (0, json!({"error": e.to_string()})),
                }
            })
        })
        .join()
        .expect("http thread")
    })
}

fn wait_for<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

/// `serve` on the shared database as host `host_id`, with a 1.5 s lease. Every process has the same
/// data dir: the workspaces are on a filesystem every host mounts (SPEC §1.3).
fn serve(data: &Path, url: &str, host_id: &str) -> ChildServer {
    let env = [
        ("SWITCHBOARD_STORAGE__KIND", "postgres"),
        ("SWITCHBOARD_STORAGE__URL", url),
        ("SWITCHBOARD_SERVER__HOST_ID", host_id),
        ("SWITCHBOARD_LEDGER__LEASE_MS", "1500"),
        ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "300"),
    ];
    ChildServer::start(Path::new(env!("CARGO_BIN_EXE_switchboard")), data, &env).expect("start switchboard")
}

#[test]
fn three_hosts_on_one_database_resume_a_killed_hosts_runs_after_the_lease_once_each() {
    let url = storage::testing::pg::database();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path();
    let mut a = serve(data, &url, "a");
    let b = serve(data, &url, "b");
    let c = serve(data, &url, "c");
    let runs: Vec<String> = (0..3)
        .map(|i| {
            let body = json!({"thread": format!("mh-{i}"), "channel": "k", "user": "u", "text": "steps=6 ms=300 tool=append_file"});
            let (status, v) = http(|cl| cl.post(a.url("/api/messages")).json(&body));
            assert_eq!(status, 202, "{v}");
            v["runId"].as_str().expect("runId").to_owned()
        })
        .collect();
    // Every run has committed two steps on A: mid-run, with a mutating call about to be (or) in flight.
    for id in &runs {
        wait_for(&format!("two steps of {id} on A"), Duration::from_secs(15), || {
            let (_, v) = http(|cl| cl.get(a.url(&format!("/api/runs/{id}?include=events"))));
            let events = v["events"].as_array().cloned().unwrap_or_default();
            (count(&events, "tool_result") >= 2).then_some(())
        });
    }
    a.signal("-KILL").expect("kill -9 A");
    let killed_at = now_ms();
    assert!(a.wait_exit(Duration::from_secs(10)).is_some(), "A is gone");

    let mut store = PgStore::open(&url).expect("open the database");
    let records: Vec<RunRecord> = runs
        .iter()
        .map(|id| {
            wait_for(&format!("the final record of {id}"), Duration::from_secs(20), || {
                store.get(id, now_ms()).expect("read").filter(|r| !r.head.provisional)
            })
        })
        .collect();
    for (id, record) in runs.iter().zip(&records) {
        assert_eq!((record.head.id.as_str(), record.head.status), (id.as_str(), RunStatus::Completed), "{:?}", record.events);
        assert_eq!(count(&record.events, "input"), 1, "one request: {:?}", record.events);
        let resumed: Vec<&Value> = record.events.iter().filter(|e| e["type"] == "resumed").collect();
        assert_eq!(resumed.len(), 1, "resumed once, by one host: {:?}", record.events);
        // A's pid was gone at once, but B and C are other hosts: they waited for A's lease (renewed at
        // most a heartbeat before the kill) to run out.
        let at = resumed[0]["at"].as_i64().expect("at");
        assert!(at >= killed_at + 1_500 - 300 - 100, "resumed {} ms after the kill, within A's lease", at - killed_at);
        let seqs: Vec<u64> = record.events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "one contiguous stream: {seqs:?}");
        let steps = std::fs::read_to_string(data.join("workspaces").join(id).join("steps.log")).unwrap_or_default();
        let lines: Vec<&str> = steps.lines().collect();
        let unique: std::collections::HashSet<&str> = lines.iter().copied().collect();
        assert_eq!(unique.len(), lines.len(), "no append_file line written twice: {lines:?}");
        assert!(lines.iter().all(|l| l.starts_with("step ")) && lines.len() >= 5, "{lines:?}");
    }
    // The runs went to the surviving hosts, not to a process of host a.
    let took = |p: &ChildServer| p.log_lines().iter().any(|l| l.contains("reclaim pass") && !l.contains("resumed=0"));
    assert!(took(&b) || took(&c), "B or C resumed them");
    assert!(!b.logged("panicked") && !c.logged("panicked"));
}
