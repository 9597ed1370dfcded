//! End to end: admission and the run lifecycle on the real app (127.0.0.1:0, SQLite in a temp dir).

mod support;

use serde_json::{json, Value};
use storage::record::RunStatus;
use storage::RunId;
use support::{types, TestApp};

#[actix_web::test]
async fn a_three_step_demo_run_completes_with_its_events_in_seq_order() {
    let app = TestApp::spawn().await;
    let (status, body) = app
        .post(json!({"thread": "t1", "channel": "c1", "user": "u1", "text": "steps=3 ms=10"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let live_url = body["liveUrl"].as_str().unwrap();
    assert!(
        live_url.starts_with(&format!("{}/runs/{run_id}?token=", app.base)),
        "{live_url}"
    );
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    assert!(!record.head.provisional);
    assert_eq!(
        types(&record.events),
        [
            "run_meta",
            "input",
            "assistant",
            "tool_call",
            "tool_result",
            "assistant",
            "tool_call",
            "tool_result",
            "assistant",
            "tool_call",
            "tool_result",
            "answer"
        ]
    );
    let seqs: Vec<u64> = record
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(record.head.event_count, 12);
    assert_eq!(record.events.last().unwrap()["text"], "done");
    assert_eq!(record.head.thread_key, "c1:t1");
    assert_eq!(
        record.head.channel_visibility,
        storage::record::ChannelVisibility::Machine
    );
    // The ledger row is gone: the thread is free, and one record is stored.
    assert_eq!(
        app.running
            .storage
            .get_live(RunId::from(run_id.clone()))
            .await
            .unwrap(),
        None
    );
    let page = app
        .running
        .storage
        .list(storage::store::ListQuery::visible_to(
            storage::record::VisibilityFilter::All,
        ))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    // The transcript went with the live row: the record is the run's history from here.
    assert!(app
        .running
        .storage
        .read_transcript(RunId::from(run_id.clone()))
        .await
        .unwrap()
        .turns
        .is_empty());
}

#[actix_web::test]
async fn a_follow_up_on_a_live_thread_is_steered_and_reflected_in_the_answer() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("t1", "steps=3 ms=300").await;
    app.event(&run_id, "tool_call").await;
    let (status, body) = app
        .post(json!({"thread": "t1", "channel": "c1", "user": "u1", "text": "also check the logs"}))
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["outcome"], "steered");
    assert_eq!(body["runId"], run_id.as_str());
    assert_eq!(body["seq"], 1);
    // The steered run's live view, as for a started one: its link opens the run.
    let live = body["liveUrl"]
        .as_str()
        .unwrap_or_else(|| panic!("no liveUrl: {body}"));
    assert!(
        live.starts_with(&format!("{}/runs/{run_id}?token=", app.base)),
        "{live}"
    );
    assert_eq!(
        app.client.get(live).send().await.unwrap().status().as_u16(),
        200
    );
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    let answer = record
        .events
        .iter()
        .find(|e| e["type"] == "answer")
        .expect("answer");
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .contains("also check the logs"),
        "{answer}"
    );
    let followup = record
        .events
        .iter()
        .find(|e| e["type"] == "input" && e["source"] == "followup")
        .expect("folded follow-up");
    assert_eq!(followup["inboxSeq"], 1);
}

#[actix_web::test]
async fn two_threads_run_concurrently() {
    let app = TestApp::spawn().await;
    let a = app.start_run("ta", "steps=2 ms=300").await;
    let b = app.start_run("tb", "steps=2 ms=300").await;
    assert_ne!(a, b);
    // Both are live at once before either finishes.
    app.event(&a, "tool_call").await;
    app.event(&b, "tool_call").await;
    let live = app.running.storage.list_live().await.unwrap();
    assert_eq!(live.len(), 2);
    assert_eq!(app.final_record(&a).await.head.status, RunStatus::Completed);
    assert_eq!(app.final_record(&b).await.head.status, RunStatus::Completed);
}

async fn stop(app: &TestApp, run_id: &str, mode: &str) -> (u16, Value) {
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{run_id}/stop")))
        .json(&json!({"mode": mode}))
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap())
}

#[actix_web::test]
async fn soft_and_hard_stops_give_stopped_records() {
    let app = TestApp::spawn().await;
    let soft = app.start_run("ts", "steps=5 ms=300").await;
    let hard = app.start_run("th", "steps=5 ms=60000").await;
    app.event(&soft, "tool_call").await;
    app.event(&hard, "tool_call").await;
    let (status, body) = stop(&app, &soft, "soft").await;
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("stopping")),
        "{body}"
    );
    let (status, _) = stop(&app, &hard, "hard").await;
    assert_eq!(status, 202);
    let rs = app.final_record(&soft).await;
    let rh = app.final_record(&hard).await;
    assert_eq!(rs.head.status, RunStatus::StoppedSoft);
    assert_eq!(rh.head.status, RunStatus::StoppedHard);
    let note = rh
        .events
        .iter()
        .find(|e| e["type"] == "stop_requested")
        .expect("stop note");
    assert_eq!(note["mode"], "hard");
    assert_eq!(note["actor"]["id"], "operator");
    // The soft stop let the current step finish: fewer than 5 steps, at least one.
    let steps = rs
        .events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .count();
    assert!((1..5).contains(&steps), "{steps}");
    // A finished run answers 409; an unknown one 404.
    assert_eq!(stop(&app, &soft, "soft").await.0, 409);
    assert_eq!(stop(&app, "no-such-run", "soft").await.0, 404);
}

#[actix_web::test]
async fn a_failing_model_call_gives_a_failed_record_with_a_run_failed_note() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("tf", "steps=3 ms=0 fail_at=2").await;
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Failed);
    let t = types(&record.events);
    assert!(t.contains(&"run_failed"), "{t:?}");
    assert!(!t.contains(&"answer"), "{t:?}");
}

#[actix_web::test]
async fn a_fenced_run_writes_no_record_from_the_fenced_process() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("tz", "steps=5 ms=400").await;
    app.event(&run_id, "tool_call").await;
    // Another generation (a second process on the same file) reclaims the row as if its lease ran out.
    let mut other =
        storage::SqliteStore::open(&app.db_path(), storage::Synchronous::Normal).unwrap();
    let far = 4_000_000_000_000;
    let taken = storage::ledger::RunLedger::reclaim(
        &mut other,
        "20990101T000000Z-0000beef",
        far,
        30_000,
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(taken.taken.len(), 1);
    // The fenced process stops the run and forgets it; no final record appears.
    let registry = app.running.registry.clone();
    let id = run_id.clone();
    support::wait_until(std::time::Duration::from_secs(30), move || {
        let gone = registry.row(&RunId::from(&id)).is_none();
        async move { gone.then_some(()) }
    })
    .await
    .expect("the fenced run left the registry");
    app.running.history.settled().await;
    let stored = app
        .running
        .storage
        .get(RunId::from(run_id.clone()))
        .await
        .unwrap();
    assert!(
        stored.is_none_or(|r| r.head.provisional),
        "no final record from the fenced process"
    );
    let row = app
        .running
        .storage
        .get_live(RunId::from(run_id))
        .await
        .unwrap()
        .expect("the row stays with its new owner");
    assert_eq!(row.owner_gen, "20990101T000000Z-0000beef");
}

#[actix_web::test]
async fn bad_bodies_are_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    for (body, field) in [
        (json!({"channel": "c", "user": "u", "text": "x"}), "thread"),
        (
            json!({"thread": "t", "channel": "c", "user": "u", "text": 5}),
            "text",
        ),
        (
            json!({"thread": "t", "channel": "c", "user": "u", "text": "x", "agent": "ghost"}),
            "agent",
        ),
        (
            json!({"thread": "t", "channel": "c", "user": "u", "text": "x", "visibility": "secret"}),
            "visibility",
        ),
        (
            json!({"thread": "t", "channel": "c", "user": "u", "text": "x", "colour": "red"}),
            "colour",
        ),
        (
            json!({"thread": "t".repeat(300), "channel": "c", "user": "u", "text": "x"}),
            "thread",
        ),
    ] {
        let (status, b) = app.post(body).await;
        assert_eq!(status, 400, "{b}");
        assert_eq!(b["error"], "bad_request");
        assert!(b["message"].as_str().unwrap().contains(field), "{b}");
    }
    let big = "x".repeat((2 << 20) + 10);
    let (status, _) = app
        .post(json!({"thread": "t", "channel": "c", "user": "u", "text": big}))
        .await;
    assert_eq!(status, 413);
    let text = "y".repeat((1 << 20) + 1);
    let (status, b) = app
        .post(json!({"thread": "t", "channel": "c", "user": "u", "text": text}))
        .await;
    assert_eq!(
        (status, b["error"].as_str()),
        (413, Some("payload_too_large"))
    );
    // Nothing was admitted by any of them.
    assert!(app.running.storage.list_live().await.unwrap().is_empty());
}

#[actix_web::test]
async fn a_draining_process_refuses_new_runs() {
    let app = TestApp::spawn().await;
    app.running
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let (status, body) = app
        .post(json!({"thread": "t", "channel": "c", "user": "u", "text": "x"}))
        .await;
    assert_eq!((status, body["error"].as_str()), (503, Some("draining")));
}

#[actix_web::test]
async fn a_keyed_retry_returns_the_original_answer_and_another_body_conflicts() {
    let app = TestApp::spawn().await;
    let msg =
        json!({"thread": "tk", "channel": "c", "user": "u", "text": "steps=1 ms=0", "key": "k-1"});
    let (s1, b1) = app.post(msg.clone()).await;
    let (s2, b2) = app.post(msg.clone()).await;
    assert_eq!((s1, s2), (202, 202));
    assert_eq!(b1, b2);
    let mut other = msg.clone();
    other["text"] = json!("something else");
    let (s3, b3) = app.post(other).await;
    assert_eq!((s3, b3["error"].as_str()), (409, Some("key_conflict")));
    app.final_record(b1["runId"].as_str().unwrap()).await;
}

#[actix_web::test]
async fn the_reply_is_posted_to_the_webhook() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let server = HttpServer::new(move || {
        let tx = tx.clone();
        App::new().route(
            "/hook",
            web::post().to(move |body: web::Json<Value>| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(body.into_inner());
                    HttpResponse::Ok().finish()
                }
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let hook = format!("http://{}/hook", server.addrs()[0]);
    actix_web::rt::spawn(server.run());
    let app = TestApp::spawn_with(|c| c.delivery.webhook_url = Some(hook)).await;
    let run_id = app.start_run("tw", "steps=1 ms=0 answer=shipped").await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(30), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got["runId"], run_id.as_str());
    assert_eq!(got["status"], "completed");
    assert_eq!(got["answer"], "shipped");
    assert_eq!(got["threadKey"], "c1:tw");
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.reply_ok, Some(true));
}

#[actix_web::test]
async fn a_run_past_its_budget_ends_with_a_budget_note() {
    let app = TestApp::spawn_with(|c| c.agents.get_mut("demo").unwrap().budget_ms = 300).await;
    let run_id = app.start_run("tb", "steps=10 ms=150").await;
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    let note = record
        .events
        .iter()
        .find(|e| e["type"] == "note" && e["kind"] == "time_budget_exhausted");
    assert!(note.is_some(), "{:?}", types(&record.events));
    assert!(
        record
            .events
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .count()
            < 10
    );
}

#[actix_web::test]
async fn metrics_count_runs_steps_and_statuses() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("tm", "steps=2 ms=0").await;
    app.final_record(&run_id).await;
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("switchboard_runs_started_total 1"), "{text}");
    assert!(
        text.contains("switchboard_runs_finished_total{status=\"completed\"} 1"),
        "{text}"
    );
    // Seed record + two tool steps + the answer step.
    assert!(text.contains("switchboard_steps_total 4"), "{text}");
    assert!(text.contains("switchboard_live_runs 0"), "{text}");
}

async fn kill(app: &TestApp, run_id: &str) -> (u16, Value) {
    let res = app
        .client
        .delete(app.url(&format!("/api/runs/{run_id}")))
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[actix_web::test]
async fn a_killed_live_run_leaves_no_record_no_rows_and_no_workspace() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("tk", "steps=5 ms=400 tool=append_file").await;
    app.event(&run_id, "tool_result").await;
    let workspace = app.dir.path().join("workspaces").join(&run_id);
    assert!(workspace.join("steps.log").exists());
    let (status, body) = kill(&app, &run_id).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (202, Some("killing")),
        "{body}"
    );
    let (storage, id) = (app.running.storage.clone(), run_id.clone());
    support::wait_until(std::time::Duration::from_secs(30), move || {
        let (s, id) = (storage.clone(), id.clone());
        async move {
            let gone = s.get_live(RunId::from(id.clone())).await.unwrap().is_none()
                && s.get(RunId::from(id)).await.unwrap().is_none();
            gone.then_some(())
        }
    })
    .await
    .expect("purged");
    let ws = workspace.clone();
    support::wait_until(std::time::Duration::from_secs(30), move || {
        let gone = !ws.exists();
        async move { gone.then_some(()) }
    })
    .await
    .expect("workspace deleted");
    app.running.history.settled().await;
    assert_eq!(
        app.running
            .storage
            .get(RunId::from(run_id.clone()))
            .await
            .unwrap(),
        None,
        "no record, ever"
    );
    assert!(app
        .running
        .storage
        .is_killed(RunId::from(run_id.clone()))
        .await
        .unwrap());
    // The thread is free again.
    let next = app.start_run("tk", "steps=1 ms=0").await;
    assert_eq!(
        app.final_record(&next).await.head.status,
        RunStatus::Completed
    );
}

/// A run's workspace is taken by its first step that calls a tool with effects, and that step's commit
/// records the binding a resume re-attaches (SPEC §8.3); a run whose tools have none touches no file.
#[actix_web::test]
async fn the_workspace_is_taken_by_the_first_step_with_effects_and_never_without_one() {
    let app = TestApp::spawn().await;
    let quiet = app.start_run("tws-quiet", "steps=3 ms=0").await;
    assert_eq!(
        app.final_record(&quiet).await.head.status,
        RunStatus::Completed
    );
    assert!(
        !app.dir.path().join("workspaces").join(&quiet).exists(),
        "no workspace for a run without effects"
    );

    let busy = app
        .start_run("tws-busy", "steps=3 ms=300 tool=append_file")
        .await;
    app.event(&busy, "tool_result").await;
    let workspace = app.dir.path().join("workspaces").join(&busy);
    let row = app
        .running
        .storage
        .get_live(RunId::from(busy.clone()))
        .await
        .unwrap()
        .expect("live");
    assert_eq!(
        row.bound_workspace(),
        Some(workspace.display().to_string().as_str()),
        "the binding committed with the step"
    );
    assert!(workspace.join("steps.log").exists());
    assert_eq!(
        app.final_record(&busy).await.head.status,
        RunStatus::Completed
    );
}

/// `[storage] workspace_root` (SPEC §8.3, §8.4): a run's workspace is `<workspace_root>/<run_id>/` wherever
/// the database is — nothing lands in `<data dir>/workspaces` — and a kill deletes it there.
#[actix_web::test]
async fn workspaces_live_under_the_configured_workspace_root() {
    let outside = tempfile::tempdir().expect("a directory outside the data dir");
    let root = outside.path().join("ws");
    let app = TestApp::spawn_with(|c| c.storage.workspace_root = Some(root.clone())).await;
    let run_id = app.start_run("twr", "steps=2 ms=10 tool=append_file").await;
    assert_eq!(
        app.final_record(&run_id).await.head.status,
        RunStatus::Completed
    );
    let log = std::fs::read_to_string(root.join(&run_id).join("steps.log"))
        .expect("steps.log under the root");
    assert_eq!(log.lines().collect::<Vec<_>>(), ["step 1", "step 2"]);
    assert!(
        !app.dir.path().join("workspaces").exists(),
        "nothing under the data dir"
    );

    let killed = app
        .start_run("twr-kill", "steps=5 ms=400 tool=append_file")
        .await;
    app.event(&killed, "tool_result").await;
    let ws = root.join(&killed);
    assert!(ws.join("steps.log").exists());
    let (status, body) = kill(&app, &killed).await;
    assert_eq!(status, 202, "{body}");
    support::wait_until(std::time::Duration::from_secs(30), move || {
        let gone = !ws.exists();
        async move { gone.then_some(()) }
    })
    .await
    .expect("the killed run's workspace is deleted under the root");
}

#[actix_web::test]
async fn killing_a_finished_run_removes_its_record_and_an_unknown_id_is_404() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("tf", "steps=1 ms=0").await;
    app.final_record(&run_id).await;
    let (status, _) = kill(&app, &run_id).await;
    assert_eq!(status, 202);
    assert_eq!(
        app.running
            .storage
            .get(RunId::from(run_id.clone()))
            .await
            .unwrap(),
        None
    );
    assert_eq!(kill(&app, "no-such-run").await.0, 404);
}

#[actix_web::test]
async fn a_drain_writes_a_provisional_snapshot_for_a_run_it_could_not_hand_off_by_the_deadline() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    // A webhook that answers slowly keeps the run in `finishing`, which is not resumable: the drain waits
    // for it up to the deadline, then writes its full snapshot as a provisional record.
    let server = HttpServer::new(|| {
        App::new().route(
            "/slow",
            web::post().to(|| async {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                HttpResponse::Ok().finish()
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let hook = format!("http://{}/slow", server.addrs()[0]);
    actix_web::rt::spawn(server.run());
    let app = TestApp::spawn_with(|c| {
        c.delivery.webhook_url = Some(hook);
        c.drain.deadline_ms = 300;
        c.drain.handoff_budget_ms = 2000;
    })
    .await;
    let run_id = app.start_run("td", "steps=1 ms=0 answer=late").await;
    app.event(&run_id, "answer").await;
    let row = app
        .running
        .storage
        .get_live(RunId::from(run_id.clone()))
        .await
        .unwrap()
        .expect("still live while delivering");
    assert_eq!(row.phase, storage::ledger::Phase::Finishing);
    let storage = app.running.storage.clone();
    let report = app.running.drain().await.unwrap();
    assert!(report.handed_off.is_empty(), "{report:?}");
    assert_eq!(report.abandoned, vec![run_id.clone()]);
    let record = storage
        .get(RunId::from(run_id.clone()))
        .await
        .unwrap()
        .expect("a provisional record");
    assert!(record.head.provisional);
    assert_eq!(record.head.status, RunStatus::Interrupted);
    // The snapshot was whole (every published event, answer included); while the row lives on for the
    // next process, its events are the ledger's, so the stored row carries the counts, not the events.
    assert_eq!(record.head.stored_event_count, record.head.event_count);
    assert!(record.head.event_count >= 4, "{:?}", record.head);
    assert!(
        storage
            .get_live(RunId::from(run_id))
            .await
            .unwrap()
            .is_some(),
        "the row stays for the next process to close"
    );
}

/// Memory follows the live runs, not the history (issue: ~15 KB a finished run held for a minute grew the
/// server by hundreds of MB under load): a run leaves the registry as soon as its record landed, and is
/// then served from the store, events and all.
#[actix_web::test]
async fn finished_runs_leave_the_registry_once_their_records_land() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(app.start_run(&format!("mem{i}"), "steps=2 ms=0").await);
    }
    for id in &ids {
        assert_eq!(app.final_record(id).await.head.status, RunStatus::Completed);
    }
    let registry = app.running.registry.clone();
    let emptied = support::wait_until(std::time::Duration::from_secs(10), move || {
        let registry = registry.clone();
        async move { registry.rows().is_empty().then_some(()) }
    })
    .await;
    assert!(
        emptied.is_some(),
        "finished runs still held: {}",
        app.running.registry.rows().len()
    );
    let (status, view) = app
        .get_json(&format!("/api/runs/{}?include=events", ids[0]), None)
        .await;
    assert_eq!(
        (status, view["persisted"].as_bool(), view["status"].as_str()),
        (200, Some(true), Some("completed")),
        "{view}"
    );
    assert!(
        types(view["events"].as_array().expect("events")).contains(&"answer"),
        "{view}"
    );
}
