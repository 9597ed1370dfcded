//! End to end on PostgreSQL (SPEC §1.3): the configuration keys (`[storage] kind = "postgres"`, `url`,
//! `pool`, `[server] host_id`); the app on a throwaway cluster (`storage::testing::pg`) completes runs
//! readable through the JSON API; and three `serve` processes of three host identities on one database:
//! one is killed -9, the others resume its runs after the lease, under the same ids, once each; and the
//! three are restarted one after another (SIGTERM, a drain that hands the runs off, a replacement of the
//! same host) under steady admissions and follow-ups, and every accepted message is answered and recorded
//! exactly once.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storage::RunId;

use serde_json::{json, Value};
use storage::record::{RunRecord, RunStatus};
use storage::{PgStore, RunStore};
use support::child::{http, now_ms, serve_postgres, wait_for};
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
    let (status, v) = app
        .get_json(&format!("/api/runs/{run_id}?include=events"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (
            v["finished"].as_bool(),
            v["status"].as_str(),
            v["persisted"].as_bool()
        ),
        (Some(true), Some("completed"), Some(true)),
        "{v}"
    );
    let events = v["events"].as_array().expect("events");
    let steps: Vec<i64> = events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .filter_map(|e| e["step"].as_i64())
        .collect();
    assert_eq!(steps, [1, 2, 3], "three steps, once each: {v}");
    assert_eq!(
        events
            .last()
            .map(|e| (e["type"].clone(), e["text"].clone())),
        Some(("answer".into(), "done".into())),
        "{v}"
    );

    let (status, list) = app.get_json("/api/runs?status=finished", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["runs"][0]["id"], run_id.as_str(), "{list}");
    let running = app.running;
    tokio::time::timeout(Duration::from_secs(20), running.drain())
        .await
        .expect("drained in time")
        .expect("drain");
}

#[test]
fn host_id_defaults_to_the_hostname_and_is_checked() {
    let c = parse_config("").expect("empty");
    assert_eq!(
        (c.server.host_id.clone(), c.host_id()),
        (None, actors::host::hostname())
    );
    let env = vec![(
        "SWITCHBOARD_SERVER__HOST_ID".to_owned(),
        "rack-2.b".to_owned(),
    )];
    assert_eq!(
        Config::parse("test.toml", "", env).expect("env").host_id(),
        "rack-2.b"
    );
    assert_eq!(
        parse_config("[server]\nhost_id = \"a\"\n")
            .expect("a")
            .host_id(),
        "a"
    );
    for text in [
        "[server]\nhost_id = \"\"\n",
        "[server]\nhost_id = \"two words\"\n",
    ] {
        let e = parse_config(text).unwrap_err().to_string();
        assert!(e.contains("server.host_id"), "{text:?} → {e}");
    }
}

#[test]
fn postgres_storage_takes_url_and_pool_and_the_url_from_the_environment() {
    let c = parse_config(
        "[storage]\nkind = \"postgres\"\nurl = \"postgres://sb@db.internal/switchboard\"\n",
    )
    .expect("postgres");
    assert_eq!(c.storage.kind, StorageKind::Postgres);
    assert_eq!(
        c.storage.url.as_deref(),
        Some("postgres://sb@db.internal/switchboard")
    );
    assert_eq!(c.storage.pool, 4, "pool defaults to 4");
    let c = parse_config("[storage]\nkind = \"postgres\"\nurl = \"postgresql://h/db\"\npool = 0\n")
        .expect("pool 0");
    assert_eq!(c.storage.pool, 0);

    let env = vec![
        (
            "SWITCHBOARD_STORAGE__KIND".to_owned(),
            "postgres".to_owned(),
        ),
        (
            "SWITCHBOARD_STORAGE__URL".to_owned(),
            "postgres://sb:hunter2@10.0.0.5:5433/sb".to_owned(),
        ),
        ("SWITCHBOARD_STORAGE__POOL".to_owned(), "8".to_owned()),
    ];
    let c = Config::parse(
        "test.toml",
        "[storage]\nurl = \"postgres://file/db\"\n",
        env,
    )
    .expect("env");
    assert_eq!(c.storage.kind, StorageKind::Postgres);
    assert_eq!(
        c.storage.url.as_deref(),
        Some("postgres://sb:hunter2@10.0.0.5:5433/sb")
    );
    assert_eq!(c.storage.pool, 8);
    // The password never shows in Debug output (which logs may carry).
    let debug = format!("{c:?}");
    assert!(
        !debug.contains("hunter2") && debug.contains("10.0.0.5:5433"),
        "{debug}"
    );
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

/// `serve` on the shared database as host `host_id`, with a 1.5 s lease.
fn serve(data: &Path, url: &str, host_id: &str) -> ChildServer {
    serve_postgres(
        data,
        url,
        host_id,
        &[
            ("SWITCHBOARD_LEDGER__LEASE_MS", "1500"),
            ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "300"),
        ],
    )
}

/// Three hosts, each with a data directory of its own, their workspaces on one shared directory
/// (`[storage] workspace_root`, README "Several hosts"): a host resuming another's run finds its
/// workspace and fence there.
#[test]
fn three_hosts_on_one_database_resume_a_killed_hosts_runs_after_the_lease_once_each() {
    let url = storage::testing::pg::database();
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = dir.path().join("shared-workspaces");
    let host = |name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir_all(&data).expect("data dir");
        let lease = [
            ("SWITCHBOARD_LEDGER__LEASE_MS", "1500"),
            ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "300"),
            (
                "SWITCHBOARD_STORAGE__WORKSPACE_ROOT",
                shared.to_str().expect("utf-8 path"),
            ),
        ];
        serve_postgres(&data, &url, name, &lease)
    };
    let mut a = host("a");
    let b = host("b");
    let c = host("c");
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
        wait_for(
            &format!("two steps of {id} on A"),
            Duration::from_secs(15),
            || {
                let (_, v) = http(|cl| cl.get(a.url(&format!("/api/runs/{id}?include=events"))));
                let events = v["events"].as_array().cloned().unwrap_or_default();
                (count(&events, "tool_result") >= 2).then_some(())
            },
        );
    }
    a.signal("-KILL").expect("kill -9 A");
    let killed_at = now_ms();
    assert!(a.wait_exit(Duration::from_secs(10)).is_some(), "A is gone");

    let mut store = PgStore::open(&url).expect("open the database");
    let records: Vec<RunRecord> = runs
        .iter()
        .map(|id| {
            wait_for(
                &format!("the final record of {id}"),
                Duration::from_secs(20),
                || {
                    store
                        .get(&RunId::from(id), now_ms())
                        .expect("read")
                        .filter(|r| !r.head.provisional)
                },
            )
        })
        .collect();
    for (id, record) in runs.iter().zip(&records) {
        assert_eq!(
            (record.head.id.as_str(), record.head.status),
            (id.as_str(), RunStatus::Completed),
            "{:?}",
            record.events
        );
        assert_eq!(
            count(&record.events, "input"),
            1,
            "one request: {:?}",
            record.events
        );
        let resumed: Vec<&Value> = record
            .events
            .iter()
            .filter(|e| e["type"] == "resumed")
            .collect();
        assert_eq!(
            resumed.len(),
            1,
            "resumed once, by one host: {:?}",
            record.events
        );
        // A's pid was gone at once, but B and C are other hosts: they waited for A's lease (renewed at
        // most a heartbeat before the kill) to run out.
        let at = resumed[0]["at"].as_i64().expect("at");
        assert!(
            at >= killed_at + 1_500 - 300 - 100,
            "resumed {} ms after the kill, within A's lease",
            at - killed_at
        );
        let seqs: Vec<u64> = record
            .events
            .iter()
            .filter_map(|e| e["seq"].as_u64())
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "one contiguous stream: {seqs:?}"
        );
        let steps = std::fs::read_to_string(shared.join(id).join("steps.log")).unwrap_or_default();
        let lines: Vec<&str> = steps.lines().collect();
        let unique: std::collections::HashSet<&str> = lines.iter().copied().collect();
        assert_eq!(
            unique.len(),
            lines.len(),
            "no append_file line written twice: {lines:?}"
        );
        assert!(
            lines.iter().all(|l| l.starts_with("step ")) && lines.len() >= 5,
            "{lines:?}"
        );
    }
    // The runs went to the surviving hosts, not to a process of host a.
    let took = |p: &ChildServer| {
        p.log_lines()
            .iter()
            .any(|l| l.contains("reclaim pass") && !l.contains("resumed=0"))
    };
    assert!(took(&b) || took(&c), "B or C resumed them");
    assert!(!b.logged("panicked") && !c.logged("panicked"));
}

/// One message the rolling-restart clients sent: its nonce, its thread key, and whether a 2xx answered it.
#[derive(Debug, Clone)]
struct Posted {
    nonce: String,
    thread_key: String,
    accepted: bool,
}

/// `serve` for the rolling restart: as [`serve`], with a short handoff budget so a drain takes about a
/// second.
fn serve_draining(data: &Path, url: &str, host_id: &str) -> ChildServer {
    let env = [
        ("SWITCHBOARD_LEDGER__LEASE_MS", "1500"),
        ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "300"),
        ("SWITCHBOARD_DRAIN__HANDOFF_BUDGET_MS", "1000"),
    ];
    serve_postgres(data, url, host_id, &env)
}

/// A client of the rolling restart: a message every ~100 ms to one of four shared threads, on the live
/// processes in turn, until `stop`. A failed or refused request is not retried: the next message carries
/// a fresh nonce.
async fn rolling_client(
    id: usize,
    addrs: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    posted: Arc<Mutex<Vec<Posted>>>,
) {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let mut n = 0usize;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let addr = {
            let addrs = addrs.lock().unwrap_or_else(|p| p.into_inner());
            addrs[(id + n) % addrs.len()].clone()
        };
        let thread = format!("roll-{}", (id * 7 + n) % 4);
        let nonce = format!("r{id}x{n:05}");
        let body = json!({"thread": thread, "channel": "roll", "user": format!("c{id}"),
            "text": format!("tool=append_file steps=3 ms=50 nonce={nonce}")});
        let accepted = matches!(http.post(format!("http://{addr}/api/messages")).json(&body).send().await,
            Ok(r) if r.status().is_success());
        posted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Posted {
                nonce,
                thread_key: format!("roll:{thread}"),
                accepted,
            });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every run the API lists (`status=all`, paged with `before`/`beforeId`).
fn list_all_runs(base: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    for _ in 0..1000 {
        let (status, page) =
            http(|cl| cl.get(format!("{base}/api/runs?status=all&limit=200{cursor}")));
        assert_eq!(status, 200, "{page}");
        out.extend(page["runs"].as_array().cloned().unwrap_or_default());
        let next = &page["nextBefore"];
        if next.is_null() {
            return out;
        }
        let next = format!(
            "&before={}&beforeId={}",
            next["finishedAt"],
            next["id"].as_str().unwrap_or("")
        );
        if next == cursor {
            return out;
        }
        cursor = next;
    }
    panic!("the run listing never ended")
}

/// Every event of a run, paged with `afterSeq`.
fn all_events(base: &str, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    for _ in 0..1000 {
        let (status, page) = http(|cl| {
            cl.get(format!(
                "{base}/api/runs/{id}/events?afterSeq={after}&limit=500"
            ))
        });
        assert_eq!(status, 200, "{page}");
        out.extend(page["events"].as_array().cloned().unwrap_or_default());
        match page["nextAfterSeq"].as_u64() {
            Some(n) if n > after => after = n,
            _ => return out,
        }
    }
    panic!("the events of {id} never ended")
}

/// Whether a listed run has its final record: finished, not a tombstone, persisted.
fn has_final_record(run: &Value) -> bool {
    run["finished"] == true && run["provisional"] != true && run["persisted"] == true
}

#[test]
fn a_rolling_restart_of_three_hosts_answers_and_records_every_message_once() {
    let url = storage::testing::pg::database();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path();
    let hosts = ["a", "b", "c"];
    let mut procs: Vec<ChildServer> = hosts
        .iter()
        .map(|h| serve_draining(data, &url, h))
        .collect();
    let addrs = Arc::new(Mutex::new(
        procs.iter().map(|p| p.addr.clone()).collect::<Vec<_>>(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let posted: Arc<Mutex<Vec<Posted>>> = Arc::new(Mutex::new(Vec::new()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let clients: Vec<_> = (0..3)
        .map(|id| {
            rt.spawn(rolling_client(
                id,
                addrs.clone(),
                stop.clone(),
                posted.clone(),
            ))
        })
        .collect();
    let accepted = || {
        posted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|p| p.accepted)
            .count()
    };

    // Each host in turn: with messages flowing and runs live, SIGTERM it (it stops admitting, hands its
    // runs off at their next step boundary and exits 0), then start its replacement as the same host.
    let mut drained = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let before = accepted();
        wait_for(
            &format!("steady admissions before draining host {host}"),
            Duration::from_secs(30),
            || (accepted() >= before + 20).then_some(()),
        );
        // The host owns a live run: the drain has something to hand off.
        let (_, health) = http(|cl| cl.get(procs[i].url("/healthz")));
        let gen = health["generation"]
            .as_str()
            .expect("generation")
            .to_owned();
        wait_for(
            &format!("a live run of host {host}"),
            Duration::from_secs(20),
            || {
                let (_, v) = http(|cl| cl.get(procs[i].url("/api/live")));
                v["runs"]
                    .as_array()
                    .is_some_and(|rows| rows.iter().any(|r| r["ownerGen"] == gen.as_str()))
                    .then_some(())
            },
        );
        drained.push(gen);
        addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|a| *a != procs[i].addr);
        procs[i].signal("-TERM").expect("SIGTERM");
        assert_eq!(
            procs[i].wait_exit(Duration::from_secs(40)),
            Some(0),
            "host {host} drained and exited 0: {:?}",
            procs[i].log_lines()
        );
        assert!(
            !procs[i].logged("panicked"),
            "host {host}: {:?}",
            procs[i].log_lines()
        );
        procs[i] = serve_draining(data, &url, host);
        addrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(procs[i].addr.clone());
    }
    let before = accepted();
    wait_for(
        "admissions after the last restart",
        Duration::from_secs(30),
        || (accepted() >= before + 20).then_some(()),
    );
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        rt.block_on(c).expect("client");
    }
    let posted = std::mem::take(&mut *posted.lock().unwrap_or_else(|p| p.into_inner()));

    // Settled: no active run on any host, no live row, every listed run has its final record.
    let base = procs[0].url("");
    let runs = wait_for("every run to settle", Duration::from_secs(60), || {
        let idle = procs.iter().all(|p| {
            let (_, v) = http(|cl| cl.get(p.url("/api/runs?status=active")));
            v["runs"].as_array().is_some_and(Vec::is_empty)
        });
        let (_, live) = http(|cl| cl.get(format!("{base}/api/live")));
        let runs = list_all_runs(&base);
        (idle
            && live["runs"].as_array().is_some_and(Vec::is_empty)
            && runs.iter().all(has_final_record))
        .then_some(runs)
    });

    // Every run: one completed record, one terminal event, no repeated seq.
    let mut inputs: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut handed_over = 0;
    for run in &runs {
        let id = run["id"].as_str().expect("id");
        assert_eq!(
            run["status"], "completed",
            "a drained run is handed off and completes elsewhere: {run}"
        );
        let events = all_events(&base, id);
        let terminals = events
            .iter()
            .filter(|e| matches!(e["type"].as_str(), Some("answer" | "run_failed")))
            .count();
        assert_eq!(terminals, 1, "run {id} has one terminal event: {events:?}");
        let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "run {id}: one stream, no repeated seq: {seqs:?}"
        );
        let from_drained = |e: &Value| {
            e["type"] == "resumed" && drained.iter().any(|g| e["fromGeneration"] == g.as_str())
        };
        if events.iter().any(from_drained) {
            handed_over += 1;
        }
        let thread = run["threadKey"].as_str().unwrap_or("").to_owned();
        for e in events.iter().filter(|e| e["type"] == "input") {
            let text = e["text"].as_str().unwrap_or("");
            for (i, _) in text.match_indices("nonce=") {
                let nonce: String = text[i + 6..]
                    .chars()
                    .take_while(char::is_ascii_alphanumeric)
                    .collect();
                inputs
                    .entry(nonce)
                    .or_default()
                    .push((id.to_owned(), thread.clone()));
            }
        }
    }
    assert!(
        handed_over >= 1,
        "a drained host handed a live run over and another process resumed it"
    );
    // Every accepted message is one `input` event of one run of its own thread; any other at most one.
    let accepted: Vec<&Posted> = posted.iter().filter(|p| p.accepted).collect();
    assert!(
        accepted.len() >= 80,
        "steady load: {} accepted of {}",
        accepted.len(),
        posted.len()
    );
    for p in &posted {
        let places = inputs.get(&p.nonce).map(Vec::as_slice).unwrap_or(&[]);
        if p.accepted {
            assert_eq!(
                places.len(),
                1,
                "accepted message {} is exactly one input event: {places:?}",
                p.nonce
            );
        } else {
            assert!(
                places.len() <= 1,
                "unanswered message {} is at most one input event: {places:?}",
                p.nonce
            );
        }
        assert!(
            places.iter().all(|(_, t)| *t == p.thread_key),
            "{} stayed in {}: {places:?}",
            p.nonce,
            p.thread_key
        );
    }
    // No mutating call ran twice: every `append_file` line of every workspace is written once.
    for entry in std::fs::read_dir(data.join("workspaces"))
        .expect("workspaces")
        .flatten()
    {
        let log = std::fs::read_to_string(entry.path().join("steps.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let unique: std::collections::HashSet<&str> = lines.iter().copied().collect();
        assert_eq!(
            unique.len(),
            lines.len(),
            "workspace {:?}: no append_file line twice: {lines:?}",
            entry.file_name()
        );
    }
    for p in &procs {
        assert!(!p.logged("panicked"), "{:?}", p.log_lines());
    }
}

#[test]
fn a_host_is_paused_only_outside_its_transactions() {
    // chaos's pause fault on PostgreSQL: stop a busy host at a moment none of its connections (named
    // `switchboard/<pid>`) is in a transaction, so its peers never wait on its row locks.
    let url = storage::testing::pg::database();
    let dir = tempfile::tempdir().expect("tempdir");
    let host = serve(dir.path(), &url, "a");
    for i in 0..4 {
        let body = json!({"thread": format!("p-{i}"), "channel": "k", "user": "u", "text": "steps=100000 ms=0 think_ms=0"});
        let (status, v) = http(|cl| cl.post(host.url("/api/messages")).json(&body));
        assert_eq!(status, 202, "{v}");
    }
    let db = switchboard::shared_db::DbSpec::Postgres { url: url.clone() };
    let mut idle = storage::testing::pg::idle_check(&url).expect("probe");
    // Running, the host is caught inside a transaction now and then: the probe sees its connections.
    wait_for(
        "the probe to see the running host in a transaction",
        Duration::from_secs(20),
        || (!idle(host.pid()).expect("probe")).then_some(()),
    );
    for _ in 0..5 {
        db.pause_outside_transaction(&host, dir.path())
            .expect("paused outside a transaction");
        let state = std::fs::read_to_string(format!("/proc/{}/stat", host.pid())).expect("stat");
        assert!(
            state
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T')),
            "stopped: {state}"
        );
        // Stopped, it stays outside: every backend of its pid is idle, look after look.
        for _ in 0..5 {
            assert!(
                idle(host.pid()).expect("probe"),
                "a stopped host holds no transaction"
            );
        }
        host.signal("-CONT").expect("SIGCONT");
    }
    // A pid with no connection of that name (init's): the probe says it cannot tell, never "idle".
    assert!(idle(1).is_err());
}
