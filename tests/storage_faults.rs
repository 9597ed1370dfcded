//! Storage that goes away mid-run (SPEC §5.5, §5.2 step 7, §6.1): the run retries for up to the lease,
//! ends `StorageLost`, stops renewing, and the supervisor re-adopts it at the first sweep storage answers;
//! nothing is live without an actor, and the message is answered once.

mod support;

use std::time::Duration;
use storage::RunId;

use support::{counting_webhook, wait_until, TestApp};

async fn app() -> TestApp {
    TestApp::spawn_with(|c| {
        c.ledger.lease_ms = 1_000;
        c.ledger.heartbeat_ms = 300;
    })
    .await
}

#[actix_web::test]
async fn a_run_whose_storage_goes_away_past_the_lease_is_readopted_and_answers_once() {
    let app = app().await;
    let run_id = app.start_run("t1", "steps=2 ms=300 answer=fine").await;
    app.event(&run_id, "tool_result").await;
    // Storage goes away before the next step can commit.
    app.running.storage.inject_outage(true);
    let metrics = app.running.metrics.clone();
    let lost = wait_until(Duration::from_secs(20), || {
        let n = metrics.restarts("storage_lost");
        async move { (n > 0).then_some(n) }
    })
    .await;
    assert_eq!(
        lost,
        Some(1),
        "the run ended StorageLost once its retries outlasted the lease"
    );
    // Nothing more happens while storage is away: no record, and the run is not finished.
    assert!(app
        .running
        .registry
        .row(&RunId::from(&run_id))
        .is_some_and(|r| r.finished_at.is_none()));
    app.running.storage.inject_outage(false);

    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, storage::record::RunStatus::Completed);
    let count = |kind: &str| record.events.iter().filter(|e| e["type"] == kind).count();
    assert_eq!(count("answer"), 1, "answered once: {:?}", record.events);
    assert_eq!(count("input"), 1);
    assert_eq!(count("resumed"), 1, "re-adopted by this same process");
    assert_eq!(
        record
            .events
            .iter()
            .find(|e| e["type"] == "answer")
            .unwrap()["text"],
        "fine"
    );
    assert!(
        app.running.storage.list_live().await.unwrap().is_empty(),
        "no live row remains"
    );
    assert_eq!(app.running.metrics.restarts("storage_lost"), 1);
}

#[actix_web::test]
async fn a_brief_outage_inside_the_lease_is_ridden_out_without_a_restart() {
    let app = app().await;
    let run_id = app.start_run("t1", "steps=3 ms=200").await;
    app.event(&run_id, "tool_result").await;
    app.running.storage.inject_outage(true);
    tokio::time::sleep(Duration::from_millis(300)).await; // shorter than the lease: the step write retries
    app.running.storage.inject_outage(false);
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, storage::record::RunStatus::Completed);
    assert!(
        !record.events.iter().any(|e| e["type"] == "resumed"),
        "{:?}",
        record.events
    );
    assert!(
        !record
            .events
            .iter()
            .any(|e| e["type"] == "note" && e["kind"] == "ledger_detached"),
        "never detached"
    );
    assert_eq!(app.running.metrics.restarts("storage_lost"), 0);
}

#[actix_web::test]
async fn a_run_that_lost_storage_at_its_committed_gate_is_readopted_and_replies_once_from_the_saved_answer(
) {
    let (url, hits) = counting_webhook();
    let app = TestApp::spawn_with(|c| {
        c.ledger.lease_ms = 1_000;
        c.ledger.heartbeat_ms = 300;
        c.delivery.webhook_url = Some(url);
    })
    .await;
    // The gate commits, its answer is lost and storage stays away past the lease: StorageLost at the gate.
    app.running.storage.inject_lost_finishing();
    let run_id = app.start_run("t-gate", "steps=1 ms=10 answer=saved").await;
    let metrics = app.running.metrics.clone();
    let lost = wait_until(Duration::from_secs(20), || {
        let n = metrics.restarts("storage_lost");
        async move { (n > 0).then_some(n) }
    })
    .await;
    assert_eq!(lost, Some(1));
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no reply before the gate's answer"
    );
    app.running.storage.inject_outage(false);

    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, storage::record::RunStatus::Completed);
    let answers: Vec<_> = record
        .events
        .iter()
        .filter(|e| e["type"] == "answer")
        .collect();
    assert_eq!(answers.len(), 1, "{:?}", record.events);
    assert_eq!(answers[0]["text"], "saved");
    assert_eq!(
        record.head.reply_ok,
        Some(true),
        "this process knew it never replied, and replied: {:?}",
        record.head.reply_note
    );
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one webhook"
    );
    assert!(
        app.running.storage.list_live().await.unwrap().is_empty(),
        "no live row remains"
    );
}

#[actix_web::test]
async fn a_run_cannot_fail_on_a_workspace_it_could_not_get() {
    let app = app().await;
    // Nothing can be created where the workspaces go (the same failure as a full disk: the launch's
    // `mkdir` fails).
    let workspaces = app.dir.path().join("workspaces");
    let _ = std::fs::remove_dir_all(&workspaces);
    std::fs::write(&workspaces, b"not a directory").unwrap();

    let unavailable = |record: &storage::record::RunRecord| {
        record
            .events
            .iter()
            .any(|e| e["type"] == "note" && e["kind"] == "workspace_unavailable")
    };
    // A run that uses no workspace tool never needs one: it completes, and nothing is missing.
    let plain = app.start_run("t-plain", "steps=2 ms=10 answer=fine").await;
    let record = app.final_record(&plain).await;
    assert_eq!(
        record.head.status,
        storage::record::RunStatus::Completed,
        "{:?}",
        record.events
    );
    assert!(!unavailable(&record), "{:?}", record.events);

    // A run that does says why it has no workspace, gets the tool's error as its result, and still
    // completes.
    let writer = app
        .start_run("t-writer", "steps=1 ms=10 tool=append_file answer=tried")
        .await;
    let record = app.final_record(&writer).await;
    assert_eq!(
        record.head.status,
        storage::record::RunStatus::Completed,
        "{:?}",
        record.events
    );
    let result = record
        .events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect("a tool result");
    assert_eq!(result["ok"], false, "{result}");
    assert!(unavailable(&record), "{:?}", record.events);
    assert!(!workspaces.join(&writer).exists());
}

/// A database that fills up for real (SQLite at its `max_page_count`: every write that needs one more
/// page fails `SQLITE_FULL`, as on a full disk) is visible to the probes (SPEC §8.1): while admissions
/// answer 503, `/readyz` is 503 and `/healthz` says `storage: "degraded"`; once space is freed and one
/// write commits, both are back.
#[actix_web::test]
async fn a_full_database_fails_readiness_until_a_write_commits_again() {
    // Heartbeats far apart: no background write commits between the failing admission and the probes.
    let app = TestApp::spawn_with(|c| {
        c.ledger.lease_ms = 120_000;
        c.ledger.heartbeat_ms = 60_000;
    })
    .await;
    let probe = |path: &'static str| {
        let (client, url) = (app.client.clone(), app.url(path));
        async move {
            let res = client.get(url).send().await.expect("probe");
            (
                res.status().as_u16(),
                res.json::<serde_json::Value>()
                    .await
                    .expect("a JSON probe body"),
            )
        }
    };
    assert_eq!(
        probe("/readyz").await,
        (200, serde_json::json!({"ready": true}))
    );

    app.running
        .storage
        .fill_sqlite_for_test(true)
        .await
        .expect("cap the database at its size");
    // A message big enough to need new pages (overflow pages of its text): refused for lack of space.
    let text = format!("steps=1 ms=10 {}", "x".repeat(256 << 10));
    let (status, body) = app
        .post(serde_json::json!({"thread": "full", "channel": "c1", "user": "u1", "text": text}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "unavailable", "{body}");
    assert_eq!(
        app.running.storage.write_space(),
        storage::WriteSpace::Exhausted
    );

    let (status, ready) = probe("/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["ready"], false, "{ready}");
    assert_eq!(ready["storage"], "degraded", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("out of space")),
        "{ready}"
    );
    let (status, health) = probe("/healthz").await;
    assert_eq!(status, 200, "liveness never fails for storage: {health}");
    assert_eq!(health["storage"], "degraded", "{health}");
    assert_eq!(health["ok"], true, "{health}");

    // Space is freed; the probes wait for a write to prove it, and the next admission does.
    app.running
        .storage
        .fill_sqlite_for_test(false)
        .await
        .expect("lift the cap");
    let run_id = app.start_run("full", "steps=1 ms=10 answer=roomy").await;
    assert_eq!(
        app.running.storage.write_space(),
        storage::WriteSpace::Available
    );
    assert_eq!(
        probe("/readyz").await,
        (200, serde_json::json!({"ready": true}))
    );
    let (status, health) = probe("/healthz").await;
    assert_eq!(
        (status, health["storage"].as_str()),
        (200, Some("ok")),
        "{health}"
    );
    assert_eq!(
        app.final_record(&run_id).await.head.status,
        storage::record::RunStatus::Completed
    );
}
