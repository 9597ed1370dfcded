//! End to end (SPEC §5.2 step 7, §5.6): a kill sends no webhook — neither a kill that lands while the run
//! still works (it never reaches its finishing gate) nor one that lands after the gate committed and
//! before the webhook POST (the owner checks its kill state immediately before the attempt).
//!
//! The second case needs the kill inside a window of microseconds: between the commit of the run's
//! `finishing` transaction and its kill-state read. Both go through this process's storage thread, whose
//! mailbox is one FIFO channel. So the test keeps a *watch* job queued on that thread: each watch reads
//! the run's live row and, while it is not yet `finishing`, queues its successor before its own group
//! commits. The gate's reply leaves only after that commit, so the run's kill-state read is always queued
//! behind a watch, and the first watch to run after the gate sees `finishing` and writes the kill —
//! exactly the ledger write another process's `DELETE` makes while this process's lease is live. No
//! sleep decides the order; the only timing is that the watch starts while the run's one tool call sleeps
//! for 1.5 s, and a watch that starts too late says so instead of passing.

mod support;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use futures_util::FutureExt;
use serde_json::Value;
use storage::ledger::Phase;
use storage::StorageHandle;
use support::{counting_webhook, wait_until, SseEvent, TestApp};

const DEADLINE: Duration = Duration::from_secs(30);

/// The app with its reply webhook pointed at a fresh counting receiver.
async fn app_with_webhook() -> (TestApp, Arc<AtomicUsize>) {
    let (url, hits) = counting_webhook();
    let app = TestApp::spawn_with(|c| c.delivery.webhook_url = Some(url)).await;
    (app, hits)
}

/// Follow the run's live stream until it closes; answers every event it carried and whether it ended
/// with `end` (a run removed without a record closes without one).
async fn follow(app: &TestApp, run_id: &str) -> tokio::task::JoinHandle<(Vec<SseEvent>, bool)> {
    let (status, reader) = app
        .sse(&format!("/api/runs/{run_id}/stream"), None, None)
        .await;
    assert_eq!(status, 200);
    let mut reader = reader.expect("a stream");
    tokio::spawn(async move {
        let (events, end) = reader.until_end(DEADLINE).await;
        (events, end.is_some())
    })
}

fn kinds(events: &[SseEvent]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e.data["type"].as_str().unwrap_or("?"))
        .collect()
}

async fn kill(app: &TestApp, run_id: &str) -> (u16, Value) {
    let res = app
        .client
        .delete(app.url(&format!("/api/runs/{run_id}")))
        .send()
        .await
        .expect("DELETE");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Wait until the killed run is purged (no live row, no record) and its actor is gone from the registry.
/// A webhook, had one been sent, was answered before any of that: the count is final afterwards.
async fn wait_purged(app: &TestApp, run_id: &str) {
    let (storage, registry, id) = (
        app.running.storage.clone(),
        app.running.registry.clone(),
        run_id.to_owned(),
    );
    wait_until(DEADLINE, move || {
        let (s, id) = (storage.clone(), id.clone());
        let discarded = registry.row(&RunId::from(&id)).is_none();
        async move {
            let gone = s.get_live(RunId::from(id.clone())).await.ok()?.is_none()
                && s.get(RunId::from(id.clone())).await.ok()?.is_none();
            (discarded && gone && s.is_killed(RunId::from(id)).await.ok()?).then_some(())
        }
    })
    .await
    .unwrap_or_else(|| panic!("run {run_id} was never purged"));
    app.running.history.settled().await;
}

/// Where the watch is.
const WATCHING: u8 = 0;
/// A watch saw the row in `finishing` and wrote the kill in the same storage group or the next one.
const KILLED_AFTER_GATE: u8 = 1;
/// The first watch already found the row past `live`: armed too late to say anything.
const ARMED_TOO_LATE: u8 = 2;
/// The row went away under the watch without ever being seen in `finishing`.
const ROW_GONE: u8 = 3;

/// Queue one watch job on the storage thread (see the module docs). `first` marks the job that arms it.
fn watch(storage: StorageHandle, run_id: RunId, state: Arc<AtomicU8>, first: bool) {
    let next = storage.clone();
    let job = storage.transact_for_test(move |b, now| {
        match b.get_live(&run_id)? {
            Some(row) if row.phase == Phase::Finishing => {
                if first {
                    state.store(ARMED_TOO_LATE, Ordering::SeqCst);
                } else {
                    b.kill(&run_id, now)?;
                    state.store(KILLED_AFTER_GATE, Ordering::SeqCst);
                }
            }
            Some(row) if first && row.phase != Phase::Live => {
                state.store(ARMED_TOO_LATE, Ordering::SeqCst)
            }
            Some(_) => {
                // Not at the gate yet: queue the successor now, before this group commits. The pause only
                // keeps the watch from spinning the storage thread; it decides no order.
                std::thread::sleep(Duration::from_millis(1));
                watch(next, run_id, state, false);
            }
            None => state.store(ROW_GONE, Ordering::SeqCst),
        }
        Ok(())
    });
    // `transact` queues its job on the first poll; the answer is not needed (the state says it all).
    assert!(
        job.now_or_never().is_none_or(|r| r.is_ok()),
        "the storage actor is gone"
    );
}

#[actix_web::test]
async fn a_kill_landing_after_the_finishing_gate_sends_no_webhook_and_leaves_no_record() {
    let (app, hits) = app_with_webhook().await;
    let run_id = app
        .start_run("tw-gate", "steps=1 ms=1500 answer=never-delivered")
        .await;
    // The one tool call sleeps 1.5 s: the gate is well ahead. Arm the watch now.
    app.event(&run_id, "tool_call").await;
    let stream = follow(&app, &run_id).await;
    let state = Arc::new(AtomicU8::new(WATCHING));
    watch(
        app.running.storage.clone(),
        RunId::from(run_id.clone()),
        state.clone(),
        true,
    );
    let seen = state.clone();
    let outcome = wait_until(DEADLINE, move || {
        let s = seen.load(Ordering::SeqCst);
        async move { (s != WATCHING).then_some(s) }
    })
    .await
    .expect("the run never reached its finishing gate");
    assert_eq!(
        outcome, KILLED_AFTER_GATE,
        "the watch did not catch the gate (2 = armed too late, 3 = row gone)"
    );
    wait_purged(&app, &run_id).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a kill before the webhook attempt sends no webhook"
    );
    // The run did pass its gate — the answer is published only after it — and then ended as fenced:
    // removed without a record, so its stream closes without `end`.
    let (events, ended) = stream.await.expect("the stream task");
    let answer = events
        .iter()
        .find(|e| e.data["type"] == "answer")
        .unwrap_or_else(|| panic!("no answer: {:?}", kinds(&events)));
    assert_eq!(answer.data["text"], "never-delivered");
    assert!(!ended, "{:?}", kinds(&events));
    assert_eq!(
        app.get_json(&format!("/api/runs/{run_id}"), None).await.0,
        404
    );
    // The thread is free, and a run nobody kills still gets its webhook (the receiver works).
    let next = app.start_run("tw-gate", "steps=1 ms=0").await;
    app.final_record(&next).await;
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

#[actix_web::test]
async fn a_kill_while_the_tool_runs_ends_the_run_before_its_gate_and_sends_no_webhook() {
    let (app, hits) = app_with_webhook().await;
    let run_id = app
        .start_run("tw-tool", "steps=1 ms=1500 answer=never-delivered")
        .await;
    app.event(&run_id, "tool_call").await;
    let stream = follow(&app, &run_id).await;
    let (status, body) = kill(&app, &run_id).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("killing")),
        "{body}"
    );
    wait_purged(&app, &run_id).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "a killed run sends no webhook"
    );
    // Aborted mid-tool, it never reached its gate: no answer, no result of the aborted call, no `end`.
    let (events, ended) = stream.await.expect("the stream task");
    assert!(
        !kinds(&events)
            .iter()
            .any(|k| *k == "answer" || *k == "tool_result")
            && !ended,
        "{:?}",
        kinds(&events)
    );
    assert_eq!(
        app.get_json(&format!("/api/runs/{run_id}"), None).await.0,
        404
    );
    assert_eq!(
        kill(&app, &run_id).await.0,
        404,
        "a killed run is an unknown run"
    );
}
