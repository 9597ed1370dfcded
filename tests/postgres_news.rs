//! Cross-host news on PostgreSQL (SPEC §1.3), end to end: two or three `serve` processes of distinct
//! host ids on one database, whose heartbeats are a minute apart — so whatever reaches a run's owner
//! sooner came through LISTEN/NOTIFY, not through the heartbeat. A run live on host A is followed over
//! SSE from host B as it steps (a follower with news only falls back to a read every 30 s); a hard
//! stop sent to B ends A's run before it could complete; a kill sent to B purges A's run mid tool call
//! and every host answers it as unknown.

mod support;

use std::path::Path;
use std::time::Duration;
use storage::RunId;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use storage::ledger::RunLedger;
use storage::{PgStore, RunStore};
use support::child::serve_postgres;
use switchboard::child::ChildServer;

/// Heartbeats a minute apart (the lease must be at least two of them): a run learns nothing from its
/// heartbeat within a test.
fn serve(data: &Path, url: &str, host_id: &str) -> ChildServer {
    serve_postgres(
        data,
        url,
        host_id,
        &[
            ("SWITCHBOARD_LEDGER__LEASE_MS", "150000"),
            ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "60000"),
        ],
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn admit(http: &reqwest::Client, host: &ChildServer, thread: &str, text: &str) -> String {
    let body = json!({"thread": thread, "channel": "k", "user": "u", "text": text});
    let res = http
        .post(host.url("/api/messages"))
        .json(&body)
        .send()
        .await
        .expect("POST /api/messages");
    assert_eq!(res.status().as_u16(), 202);
    let v: Value = res.json().await.expect("json");
    v["runId"].as_str().expect("runId").to_owned()
}

/// Poll `check` every 25 ms until it answers, failing after `within`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The next SSE event within 10 s (without news B would read A's events again only after 30 s).
async fn next_event<S, E>(stream: &mut S) -> eventsource_stream::Event
where
    S: futures_util::Stream<Item = Result<eventsource_stream::Event, E>> + Unpin,
    E: std::fmt::Debug,
{
    let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s");
    event.expect("stream open").expect("an SSE event")
}

#[test]
fn a_run_on_one_host_is_followed_from_another_and_a_stop_sent_there_reaches_it_before_its_heartbeat(
) {
    let url = storage::testing::pg::database();
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (serve(dir.path(), &url, "a"), serve(dir.path(), &url, "b"));
    runtime().block_on(async {
        let http = reqwest::Client::new();
        // About 4 s of steps if nothing stops it.
        let id = admit(&http, &a, "news-1", "steps=40 ms=100").await;
        let res = http
            .get(b.url(&format!("/api/runs/{id}/stream")))
            .send()
            .await
            .expect("stream from B");
        assert_eq!(res.status().as_u16(), 200);
        let mut stream = Box::pin(res.bytes_stream().eventsource());
        let mut results = 0;
        let mut seqs = Vec::new();
        while results < 3 {
            let e = next_event(&mut stream).await;
            assert_eq!(e.event, "run_event", "{e:?} after {seqs:?}");
            let v: Value = serde_json::from_str(&e.data).expect("event json");
            seqs.push(v["seq"].as_u64().expect("seq"));
            results += usize::from(v["type"] == "tool_result");
        }
        let stop = http
            .post(b.url(&format!("/api/runs/{id}/stop")))
            .json(&json!({"mode": "hard"}))
            .send()
            .await
            .expect("stop on B");
        assert_eq!(stop.status().as_u16(), 202);
        let end = loop {
            let e = next_event(&mut stream).await;
            if e.event == "end" {
                break serde_json::from_str::<Value>(&e.data).expect("end json");
            }
            let v: Value = serde_json::from_str(&e.data).expect("event json");
            seqs.push(v["seq"].as_u64().expect("seq"));
        };
        // A learned of the stop from B's note, not from a heartbeat a minute away: the run did not get to
        // complete its 40 steps.
        assert_eq!(end["status"], "stopped_hard", "{end}");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "each event once, in order: {seqs:?}"
        );
        let record: Value = http
            .get(a.url(&format!("/api/runs/{id}?include=events")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let events = record["events"].as_array().expect("events");
        assert_eq!(
            events
                .iter()
                .filter(|e| e["type"] == "stop_requested")
                .count(),
            1,
            "{events:?}"
        );
        let stored: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        assert_eq!(stored, seqs, "B streamed exactly the stored events");
    });
    assert!(!a.logged("panicked") && !b.logged("panicked"));
}

#[test]
fn a_kill_sent_to_one_host_purges_another_hosts_run_mid_tool_call_and_no_host_serves_it() {
    let url = storage::testing::pg::database();
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b, c) = (
        serve(dir.path(), &url, "a"),
        serve(dir.path(), &url, "b"),
        serve(dir.path(), &url, "c"),
    );
    runtime().block_on(async {
        let http = reqwest::Client::new();
        // One mutating call of a minute: without news A would hear of the kill only after it.
        let id = admit(&http, &a, "news-2", "tool=append_file steps=1 ms=60000").await;
        let workspace = dir.path().join("workspaces").join(&id);
        eventually(
            "the tool call in flight on A",
            Duration::from_secs(10),
            || {
                let http = http.clone();
                let url = a.url(&format!("/api/runs/{id}?include=events"));
                async move {
                    let v: Value = http.get(url).send().await.ok()?.json().await.ok()?;
                    v["events"]
                        .as_array()?
                        .iter()
                        .any(|e| e["type"] == "tool_call")
                        .then_some(())
                }
            },
        )
        .await;
        // Every host lists it live (and caches the listing).
        for host in [&a, &b, &c] {
            let v: Value = http
                .get(host.url("/api/runs?status=active"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(
                v["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["id"] == id.as_str()),
                "{v}"
            );
        }
        let killed = http
            .delete(b.url(&format!("/api/runs/{id}")))
            .send()
            .await
            .expect("kill on B");
        assert!(killed.status().is_success(), "{}", killed.status());
        // Every host drops its cached listing at the kill's note: within a second, well inside the 2 s
        // a cached listing would otherwise be served.
        for host in [&a, &b, &c] {
            eventually(
                "the kill dropping every host's views",
                Duration::from_secs(1),
                || {
                    let http = http.clone();
                    let (list, one) = (
                        host.url("/api/runs?status=all"),
                        host.url(&format!("/api/runs/{id}")),
                    );
                    let id = id.clone();
                    async move {
                        let v: Value = http.get(list).send().await.ok()?.json().await.ok()?;
                        let listed = v["runs"].as_array()?.iter().any(|r| r["id"] == id.as_str());
                        let status = http.get(one).send().await.ok()?.status().as_u16();
                        (!listed && status == 404).then_some(())
                    }
                },
            )
            .await;
        }
        // A aborted the run as a fence and purged it: no live row, no record, no workspace.
        eventually("A purged the run", Duration::from_secs(10), || {
            let (url, id, workspace) = (url.clone(), id.clone(), workspace.clone());
            async move {
                let purged = tokio::task::spawn_blocking(move || {
                    let mut s = PgStore::open(&url).expect("open");
                    s.get_live(&RunId::from(&id)).expect("live row").is_none()
                        && s.get(&RunId::from(&id), i64::MAX / 2)
                            .expect("record")
                            .is_none()
                })
                .await
                .expect("read");
                (purged && !workspace.exists()).then_some(())
            }
        })
        .await;
    });
    assert!(a.logged("purged a killed run"), "the owner purged it");
    assert!(!a.logged("panicked") && !b.logged("panicked") && !c.logged("panicked"));
}
