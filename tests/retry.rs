//! End to end: run again — `POST /api/runs/{id}/retry` (issue 28) on the real app, and `switchboard runs
//! retry` (the real binary) against it: a new run on the same thread from the original request, linked
//! by `parentRunId`; steered into the thread's live run when there is one; refused like a message.

mod support;

use serde_json::{json, Value};
use storage::record::RunStatus;
use support::cli::switchboard;
use support::{add_token, TestApp};

/// POST `/api/runs/{id}/retry` (with `body`, and a bearer token); answers (status, JSON body).
async fn retry(app: &TestApp, id: &str, body: Option<Value>, bearer: Option<&str>) -> (u16, Value) {
    let mut req = app.client.post(app.url(&format!("/api/runs/{id}/retry")));
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.expect("POST retry");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// The text of the run's `input` event with `source: "request"`.
fn request_text(events: &[Value]) -> &str {
    events
        .iter()
        .find(|e| e["type"] == "input" && e["source"] == "request")
        .and_then(|e| e["text"].as_str())
        .expect("a request input event")
}

/// The texts of the run's follow-up `input` events, in order.
fn followups(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["type"] == "input" && e["source"] == "followup")
        .filter_map(|e| e["text"].as_str())
        .collect()
}

#[actix_web::test]
async fn a_finished_run_runs_again_on_its_thread_as_its_child_from_its_request() {
    let app = TestApp::spawn().await;
    let text = "steps=1 ms=0 answer=again";
    let (status, body) = app
        .post(json!({"thread": "t:r", "channel": "c1", "user": "u7", "text": text, "visibility": "public"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let original = body["runId"].as_str().unwrap().to_owned();
    app.final_record(&original).await;

    let (status, body) = retry(&app, &original, None, None).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["outcome"], "started", "{body}");
    let child = body["runId"].as_str().unwrap().to_owned();
    assert_ne!(child, original);
    assert!(
        body["liveUrl"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/runs/{child}?token=", app.base)),
        "{body}"
    );

    let record = app.final_record(&child).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(
        record.head.parent_run_id.as_deref(),
        Some(original.as_str())
    );
    assert_eq!(record.head.thread_key, "c1:t:r");
    assert_eq!(record.head.user_id, "u7");
    assert_eq!(record.head.agent.as_deref(), Some("demo"));
    assert_eq!(
        record.head.channel_visibility,
        storage::record::ChannelVisibility::Public
    );
    assert_eq!(request_text(&record.events), text);
    let (_, view) = app.get_json(&format!("/api/runs/{child}"), None).await;
    assert_eq!(view["parentRunId"], original.as_str(), "{view}");
    assert_eq!(view["answer"], "again", "{view}");

    let (status, children) = app
        .get_json(&format!("/api/runs/{original}/children"), None)
        .await;
    assert_eq!(status, 200, "{children}");
    let ids: Vec<&str> = children["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [child.as_str()]);

    // A retry of the retry is the retry's child, with the same request.
    let (status, body) = retry(&app, &child, Some(json!({})), None).await;
    assert_eq!(status, 202, "{body}");
    let grandchild = body["runId"].as_str().unwrap().to_owned();
    let record = app.final_record(&grandchild).await;
    assert_eq!(record.head.parent_run_id.as_deref(), Some(child.as_str()));
    assert_eq!(request_text(&record.events), text);
}

#[actix_web::test]
async fn an_unknown_run_is_404_and_a_bad_body_is_400_naming_the_field() {
    let app = TestApp::spawn().await;
    for id in ["no-such-run", "0196d5d4-0000-7000-8000-000000000000"] {
        let (status, body) = retry(&app, id, None, None).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (404, Some("not_found")),
            "{body}"
        );
    }
    let done = app.start_run("t-bad", "steps=1 ms=0").await;
    app.final_record(&done).await;
    for (body, field) in [
        (json!({"text": "other"}), "text"),
        (json!({"key": ""}), "key"),
        (json!({"key": 7}), "key"),
        (json!(["key"]), "body"),
    ] {
        let (status, answer) = retry(&app, &done, Some(body.clone()), None).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap().starts_with(field),
            "{body}: {answer}"
        );
    }
    // A GET is no retry: the path answers 405 naming its method.
    let res = app
        .client
        .get(app.url(&format!("/api/runs/{done}/retry")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 405);
    assert_eq!(res.headers()["allow"], "POST");
}

#[actix_web::test]
async fn a_retry_needs_messages_write_and_a_run_the_caller_may_see() {
    let (mut writer, mut reader, mut c2_writer) = (String::new(), String::new(), String::new());
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        writer = add_token(
            c,
            "writer",
            &["messages:write", "runs:read"],
            json!({"kind": "all"}),
        );
        reader = add_token(
            c,
            "reader",
            &["runs:read", "runs:write"],
            json!({"kind": "all"}),
        );
        c2_writer = add_token(
            c,
            "c2-writer",
            &["messages:write"],
            json!({"kind": "channels-in", "ids": ["c2"]}),
        );
    })
    .await;
    let (status, body) = app
        .post_as(
            &writer,
            json!({"thread": "t", "channel": "c1", "user": "u1", "text": "steps=1 ms=0"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let run = body["runId"].as_str().unwrap().to_owned();
    app.final_record(&run).await;

    let (status, body) = retry(&app, &run, None, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("unauthorized")),
        "{body}"
    );
    let (status, body) = retry(&app, &run, None, Some("not-a-token")).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = retry(&app, &run, None, Some(&reader)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("forbidden")),
        "{body}"
    );
    // A run outside the caller's view is, to it, no run at all.
    let (status, body) = retry(&app, &run, None, Some(&c2_writer)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    // None of those started anything.
    let (_, children) = app
        .get_json(&format!("/api/runs/{run}/children"), Some(&writer))
        .await;
    assert_eq!(children["runs"], json!([]), "{children}");

    let (status, body) = retry(&app, &run, None, Some(&writer)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("started")),
        "{body}"
    );
}

#[actix_web::test]
async fn a_retry_while_the_thread_has_a_live_run_is_steered_into_it() {
    let app = TestApp::spawn().await;
    let first = app.start_run("t-busy", "steps=1 ms=0 answer=one").await;
    app.final_record(&first).await;
    let live_text = "steps=4 ms=500";
    let live = app.start_run("t-busy", live_text).await;
    app.event(&live, "tool_call").await;

    // The finished run's request goes to the thread's live run as a follow-up.
    let (status, body) = retry(&app, &first, None, None).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["outcome"], "steered", "{body}");
    assert_eq!(body["runId"], live.as_str(), "{body}");
    assert_eq!(body["seq"], 1, "{body}");
    assert!(
        body["liveUrl"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/runs/{live}?token=", app.base)),
        "{body}"
    );
    // A live run's own retry: its exact request (from the ledger row), steered into itself.
    let (status, body) = retry(&app, &live, None, None).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        (
            body["outcome"].as_str(),
            body["runId"].as_str(),
            body["seq"].as_u64()
        ),
        (Some("steered"), Some(live.as_str()), Some(2)),
        "{body}"
    );
    let record = app.final_record(&live).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(
        followups(&record.events),
        ["steps=1 ms=0 answer=one", live_text]
    );
    for parent in [&first, &live] {
        let (_, children) = app
            .get_json(&format!("/api/runs/{parent}/children"), None)
            .await;
        assert_eq!(children["runs"], json!([]), "a steered retry starts no run");
    }
}

#[actix_web::test]
async fn a_keyed_retry_answers_once_and_a_capped_request_is_409_request_truncated() {
    let app = TestApp::spawn().await;
    let a = app.start_run("t-key-a", "steps=1 ms=0").await;
    let b = app.start_run("t-key-b", "steps=1 ms=0").await;
    app.final_record(&a).await;
    app.final_record(&b).await;

    let (status, first) = retry(&app, &a, Some(json!({"key": "k1"})), None).await;
    assert_eq!(status, 202, "{first}");
    let (status, again) = retry(&app, &a, Some(json!({"key": "k1"})), None).await;
    assert_eq!(status, 202, "{again}");
    assert_eq!(again, first, "the same key and run answer the first answer");
    let (status, other) = retry(&app, &b, Some(json!({"key": "k1"})), None).await;
    assert_eq!(
        (status, other["error"].as_str()),
        (409, Some("key_conflict")),
        "{other}"
    );
    let (_, children) = app.get_json(&format!("/api/runs/{a}/children"), None).await;
    assert_eq!(children["runs"].as_array().unwrap().len(), 1, "{children}");

    // Over 64 KiB of text: while the run lives its ledger row holds the exact request, which runs again
    // (here steered into the run itself); once finished only the capped input event is left.
    let long = format!("steps=2 ms=400 {}", "x".repeat(70_000));
    let capped = app.start_run("t-long", &long).await;
    app.event(&capped, "tool_call").await;
    let (status, body) = retry(&app, &capped, None, None).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("steered")),
        "{body}"
    );
    let record = app.final_record(&capped).await;
    assert!(record
        .events
        .iter()
        .any(|e| e["type"] == "input" && e["truncated"] == true));
    let (status, body) = retry(&app, &capped, None, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("request_truncated")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("capped"),
        "it says why: {body}"
    );
}

#[actix_web::test]
async fn runs_retry_prints_the_new_run_and_its_live_url() {
    let app = TestApp::spawn().await;
    let url = app.base.clone();
    let done = app.start_run("t-cli", "steps=1 ms=0 answer=cli").await;
    app.final_record(&done).await;

    let (code, out, err) = switchboard(&["runs", "retry", &done, "--url", &url]).await;
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let first = lines.next().unwrap_or_default();
    let child = first.split(':').next().unwrap().to_owned();
    assert!(first.contains("started") && first.contains(&done), "{out}");
    assert!(
        lines
            .next()
            .is_some_and(|l| l.starts_with(&format!("{url}/runs/{child}?token="))),
        "{out}"
    );
    let record = app.final_record(&child).await;
    assert_eq!(record.head.parent_run_id.as_deref(), Some(done.as_str()));

    let (code, out, err) = switchboard(&[
        "runs", "retry", &done, "--url", &url, "--json", "--key", "k",
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["outcome"], "started", "{v}");
    let (code, again, _) = switchboard(&[
        "runs", "retry", &done, "--key", "k", "--json", "--url", &url,
    ])
    .await;
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&again).unwrap(), v);

    // Exit codes as the other `runs` commands: 404 → 3, and --db is a usage error naming the need.
    let (code, _, err) = switchboard(&["runs", "retry", "no-such-run", "--url", &url]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("404"), "{err}");
    let (code, _, err) = switchboard(&["runs", "retry", &done, "--db", "/nonexistent.db"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("running server"), "{err}");
}
