//! End to end: the plan coordinator's HTTP routes over the real app, with the scripted agent as the
//! suggestion provider (its answer is the cards' JSON).

mod support;

use serde_json::{json, Value};
use support::TestApp;

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let res = app.client.post(app.url(path)).json(&body).send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let res = app.client.get(app.url(path)).send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[actix_web::test]
async fn a_suggestion_is_published_as_cards_and_an_import_makes_it_stale_history() {
    let app = TestApp::spawn().await;
    let (status, plan) = post(&app, "/api/plans/p1/import", json!({"snapshotId": "s1"})).await;
    assert_eq!(status, 201, "{plan}");
    assert_eq!(plan["revision"], 1);
    let prompt = r#"steps=0 answer=[{"title":"Ship","body":"Deploy-Monday"}]"#;
    let (status, started) =
        post(&app, "/api/plans/p1/suggestions", json!({"revision": 1, "snapshotId": "s1", "prompt": prompt})).await;
    assert_eq!(status, 202, "{started}");
    let rid = started["requestId"].as_str().unwrap().to_owned();
    // A second start for the same plan while it runs is refused naming the active request.
    let (status, busy) =
        post(&app, "/api/plans/p1/suggestions", json!({"revision": 1, "snapshotId": "s1", "prompt": prompt})).await;
    if status == 409 {
        assert!(busy.to_string().contains(&rid), "{busy}");
    }
    let path = format!("/api/plans/p1/suggestions/{rid}");
    let ready = support::wait_until(std::time::Duration::from_secs(30), || {
        let (app, path) = (&app, path.clone());
        async move {
            let (_, v) = get(app, &path).await;
            (v["state"] == "ready").then_some(v)
        }
    })
    .await;
    let ready = match ready {
        Some(v) => v,
        None => panic!("never ready: {}", get(&app, &path).await.1),
    };
    assert_eq!(ready["cards"][0]["title"], "Ship");
    assert_eq!(ready["revision"], 1);
    // A stale identity is refused before anything is allocated.
    let (status, _) = post(&app, "/api/plans/p1/suggestions", json!({"revision": 7, "snapshotId": "s1"})).await;
    assert_eq!(status, 409);
    // Advancing the revision invalidates the ready request; its cards stay as history.
    let (status, imported) = post(&app, "/api/plans/p1/import", json!({"snapshotId": "s2"})).await;
    assert_eq!(status, 200, "{imported}");
    assert_eq!(imported["revision"], 2);
    assert_eq!(imported["invalidated"][0], rid.as_str());
    let (_, after) = get(&app, &path).await;
    assert_eq!(after["state"], "invalidated", "{after}");
    assert_eq!(after["cards"][0]["title"], "Ship");
    // Unknown plan and request ids are 404; a bad body names the field.
    assert_eq!(get(&app, "/api/plans/p1/suggestions/nope").await.0, 404);
    let (status, bad) = post(&app, "/api/plans/p1/suggestions", json!({"snapshotId": "s2"})).await;
    assert_eq!(status, 400);
    assert!(bad["message"].as_str().unwrap().contains("revision"), "{bad}");
}
