//! End to end: who may reach a run (a message or a stop the caller may not see is refused, nothing
//! written), the runs started for a parent, and what a run's view carries (the answer, who stopped it).

mod support;

use serde_json::json;
use storage::record::RunStatus;
use support::TestApp;

#[actix_web::test]
async fn a_message_never_reaches_a_live_run_its_writer_may_not_see() {
    let mut writer = String::new();
    let app = TestApp::spawn_with(|c| {
        writer = support::add_token(
            c,
            "machines",
            &["messages:write"],
            json!({"kind": "visibility-in", "values": ["machine"]}),
        );
    })
    .await;
    let (status, body) =
        app.post(json!({"thread": "t-priv", "channel": "c1", "user": "u1", "text": "steps=2 ms=300", "visibility": "private"})).await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    app.event(&run_id, "tool_call").await;
    let follow_up = json!({"thread": "t-priv", "channel": "c1", "user": "u2", "text": "answer=hijacked", "key": "k1"});
    let (status, body) = app.post_as(&writer, follow_up.clone()).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"], "forbidden");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("c1:t-priv"),
        "names the thread: {body}"
    );
    assert!(
        !body.to_string().contains(&run_id),
        "never names the run: {body}"
    );
    // Nothing was written: not the message, not a receipt (a retry is refused again, not answered "steered").
    let (status, _) = app.post_as(&writer, follow_up).await;
    assert_eq!(status, 403);
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(
        record
            .events
            .iter()
            .filter(|e| e["type"] == "input")
            .count(),
        1,
        "{:?}",
        record.events
    );
    assert!(!record
        .events
        .iter()
        .any(|e| e.to_string().contains("hijacked")));
    // A writer that may see the run still steers into it; an idle thread starts a run whatever the filter.
    let (status, body) = app
        .post_as(
            &writer,
            json!({"thread": "t-priv", "channel": "c1", "user": "u2", "text": "steps=1 ms=1"}),
        )
        .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("started")),
        "{body}"
    );
}

/// SPEC §8.1 Auth: a stop reaches only runs its caller may see — 403 naming nothing of the run, and
/// nothing is written (no stop on the row, no `stop_requested`, the run completes).
#[actix_web::test]
async fn a_stop_never_reaches_a_live_run_its_caller_may_not_see() {
    let mut stopper = String::new();
    let app = TestApp::spawn_with(|c| {
        stopper = support::add_token(
            c,
            "machines",
            &["runs:write"],
            json!({"kind": "visibility-in", "values": ["machine"]}),
        );
    })
    .await;
    let (status, body) =
        app.post(json!({"thread": "t-priv", "channel": "c1", "user": "u1", "text": "steps=2 ms=300", "visibility": "private"})).await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    app.event(&run_id, "tool_call").await;
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{run_id}/stop")))
        .bearer_auth(&stopper)
        .json(&json!({"mode": "hard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 403);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "forbidden", "{body}");
    let record = app.final_record(&run_id).await;
    assert_eq!(
        record.head.status,
        RunStatus::Completed,
        "{:?}",
        record.events
    );
    assert!(
        !record.events.iter().any(|e| e["type"] == "stop_requested"),
        "{:?}",
        record.events
    );
    // An unknown run is still 404 to the same token.
    let res = app
        .client
        .post(app.url("/api/runs/no-such-run/stop"))
        .bearer_auth(&stopper)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
}

/// Seed items 46 and 58: a message names the run it is started for (`parentRunId`); the new run carries
/// it live and in its record, and `GET /api/runs/{id}/children` lists it (oldest first), as does
/// `?parentRunId=`. A malformed parent is a 400 naming the field, and nothing is admitted.
#[actix_web::test]
async fn a_run_started_for_a_parent_lists_as_its_child_live_and_finished() {
    let app = TestApp::spawn().await;
    let parent = app.start_run("t-parent", "steps=1 ms=1").await;
    let mut children = Vec::new();
    for i in 0..2 {
        let (status, body) = app
            .post(json!({"thread": format!("t-child-{i}"), "channel": "c1", "user": "u1", "text": "steps=2 ms=200", "parentRunId": parent}))
            .await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (202, Some("started")),
            "{body}"
        );
        children.push(body["runId"].as_str().unwrap().to_owned());
    }
    // Live: the views carry the parent, and the children route lists both, oldest first.
    let (status, view) = app
        .get_json(&format!("/api/runs/{}", children[0]), None)
        .await;
    assert_eq!(
        (status, view["parentRunId"].as_str()),
        (200, Some(parent.as_str())),
        "{view}"
    );
    let (status, list) = app
        .get_json(&format!("/api/runs/{parent}/children"), None)
        .await;
    assert_eq!(status, 200, "{list}");
    let listed: Vec<&str> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [children[0].as_str(), children[1].as_str()]);
    // Finished: the record names the parent, and both listings still find the children.
    for child in &children {
        let record = app.final_record(child).await;
        assert_eq!(record.head.parent_run_id.as_deref(), Some(parent.as_str()));
    }
    let (_, list) = app
        .get_json(&format!("/api/runs/{parent}/children"), None)
        .await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 2, "{list}");
    let (_, list) = app
        .get_json(&format!("/api/runs?parentRunId={parent}"), None)
        .await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 2, "{list}");
    // The parent itself has no parent, and a run with no children lists none.
    let (_, list) = app
        .get_json(&format!("/api/runs/{}/children", children[0]), None)
        .await;
    assert_eq!(list["runs"], json!([]));
    let (status, view) = app.get_json(&format!("/api/runs/{parent}"), None).await;
    assert_eq!((status, view.get("parentRunId")), (200, None), "{view}");
    // A malformed parent: 400 naming the field, no run.
    let (status, body) =
        app.post(json!({"thread": "t-bad", "channel": "c1", "user": "u1", "text": "steps=1 ms=1", "parentRunId": "../etc"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("parentRunId:"),
        "{body}"
    );
    let (_, list) = app.get_json("/api/runs?threadKey=c1:t-bad", None).await;
    assert_eq!(list["runs"], json!([]));
    let (status, _) = app.get_json("/api/runs/a%20b/children", None).await;
    assert_eq!(status, 400);
    // A deleted parent is gone as a resource; its children are runs of their own, still listed by query.
    let res = app
        .client
        .delete(app.url(&format!("/api/runs/{parent}")))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    let (status, body) = app
        .get_json(&format!("/api/runs/{parent}/children"), None)
        .await;
    assert_eq!(status, 404, "{body}");
    let (_, list) = app
        .get_json(&format!("/api/runs?parentRunId={parent}"), None)
        .await;
    assert_eq!(list["runs"].as_array().unwrap().len(), 2, "{list}");
}

/// SPEC §7: a RunView carries the answer (and a stopped run who stopped it) from every source — the
/// point read and the listing, live-finished and persisted.
#[actix_web::test]
async fn views_carry_the_answer_and_who_stopped_the_run() {
    let app = TestApp::spawn().await;
    let done = app
        .start_run("t-answer", "steps=1 ms=1 answer=forty-two")
        .await;
    app.final_record(&done).await;
    let (status, view) = app.get_json(&format!("/api/runs/{done}"), None).await;
    assert_eq!(
        (status, view["answer"].as_str()),
        (200, Some("forty-two")),
        "{view}"
    );
    assert!(view.get("stoppedBy").is_none(), "{view}");
    let (_, list) = app.get_json("/api/runs?threadKey=c1:t-answer", None).await;
    assert_eq!(list["runs"][0]["answer"], "forty-two", "{list}");

    let stopped = app.start_run("t-stopped", "steps=3 ms=300").await;
    app.event(&stopped, "tool_call").await;
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{stopped}/stop")))
        .json(&json!({"mode": "soft"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    let record = app.final_record(&stopped).await;
    assert_eq!(record.head.status, RunStatus::StoppedSoft);
    let (_, view) = app.get_json(&format!("/api/runs/{stopped}"), None).await;
    assert_eq!(view["stoppedBy"]["mode"], "soft", "{view}");
    assert!(view["stoppedBy"]["actor"].is_object(), "{view}");
}
