//! End to end: admission's field caps and injective thread keys (SPEC §5.1) on the real app.

mod support;

use serde_json::json;
use storage::record::RunStatus;
use support::TestApp;

#[actix_web::test]
async fn a_channel_holding_the_separator_cannot_steer_another_channels_thread() {
    let app = TestApp::spawn().await;
    // A run on channel "a", thread "b:x": its thread key is "a:b:x".
    let (status, started) = app
        .post(json!({"thread": "b:x", "channel": "a", "user": "u1", "text": "steps=2 ms=300"}))
        .await;
    assert_eq!(
        (status, started["outcome"].as_str()),
        (202, Some("started")),
        "{started}"
    );
    let run_id = started["runId"].as_str().expect("runId").to_owned();
    app.event(&run_id, "tool_call").await;
    // Channel "a:b", thread "x" would build the same key and land in that run's inbox.
    let (status, refused) = app
        .post(json!({"thread": "x", "channel": "a:b", "user": "u2", "text": "injected"}))
        .await;
    assert_eq!(
        (status, refused["error"].as_str()),
        (400, Some("bad_request")),
        "{refused}"
    );
    assert!(
        refused["message"].as_str().unwrap().starts_with("channel:"),
        "{refused}"
    );
    assert!(
        !refused.to_string().contains(&run_id),
        "the refusal reveals the live run: {refused}"
    );
    assert_eq!(refused.get("runId"), None);
    // The first run ends with its own input only: nothing was steered into it.
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(record.head.thread_key, "a:b:x");
    let inputs: Vec<_> = record
        .events
        .iter()
        .filter(|e| e["type"] == "input")
        .collect();
    assert_eq!(inputs.len(), 1, "{inputs:?}");
    assert!(!record
        .events
        .iter()
        .any(|e| e.to_string().contains("injected")));
}

#[actix_web::test]
async fn oversized_fields_are_refused_naming_the_field_and_admit_nothing() {
    let app = TestApp::spawn().await;
    let base = json!({"thread": "t", "channel": "c", "user": "u", "text": "steps=0"});
    let with = |field: &str, value: String| {
        let mut b = base.clone();
        b[field] = json!(value);
        b
    };
    for (body, field) in [
        (with("user", "u".repeat(1_000_000)), "user"),
        (with("channel", "c".repeat(65)), "channel"),
        (with("thread", "t".repeat(192)), "thread"),
        (with("agent", "a".repeat(65)), "agent"),
        (with("key", "k".repeat(257)), "key"),
    ] {
        let (status, refused) = app.post(body).await;
        assert_eq!(
            (status, refused["error"].as_str()),
            (400, Some("bad_request")),
            "{field}: {refused}"
        );
        assert!(
            refused["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field}:")),
            "{refused}"
        );
    }
    assert!(
        app.running.storage.list_live().await.unwrap().is_empty(),
        "a refused message admitted a run"
    );
    // At their caps, the channel and thread make the longest key the ledger stores: admitted.
    let mut longest = with("channel", "c".repeat(64));
    longest["thread"] = json!("t".repeat(191));
    let (status, started) = app.post(longest).await;
    assert_eq!(
        (status, started["outcome"].as_str()),
        (202, Some("started")),
        "{started}"
    );
    let record = app.final_record(started["runId"].as_str().unwrap()).await;
    assert_eq!(record.head.thread_key.chars().count(), 256);
}
