//! End to end on PostgreSQL (SPEC §1.3): the app with `[storage] kind = "postgres"` on a throwaway
//! cluster (`storage::testing::pg`) completes runs readable through the JSON API.

mod support;

use std::time::Duration;

use storage::record::RunStatus;
use support::TestApp;
use switchboard::config::StorageKind;

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
