//! End to end: the plan coordinator's HTTP routes over the real app, with the scripted agent as the
//! suggestion provider (its answer is the cards' JSON).

mod support;

use serde_json::{json, Value};
use support::TestApp;

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let res = app
        .client
        .post(app.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
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
    // `think_ms` keeps the model busy long enough that the second start surely finds it running.
    let prompt = r#"steps=0 think_ms=800 answer=[{"title":"Ship","body":"Deploy-Monday"}]"#;
    let (status, started) = post(
        &app,
        "/api/plans/p1/suggestions",
        json!({"revision": 1, "snapshotId": "s1", "prompt": prompt}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let rid = started["requestId"].as_str().unwrap().to_owned();
    // A second start for the same plan while it runs is refused naming the active request (its revision
    // written `1.0`: JSON has one number type, and that is the integer 1).
    let (status, busy) = post(
        &app,
        "/api/plans/p1/suggestions",
        json!({"revision": 1.0, "snapshotId": "s1", "prompt": prompt}),
    )
    .await;
    assert_eq!(status, 409, "{busy}");
    assert!(busy.to_string().contains(&rid), "{busy}");
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
    let (status, _) = post(
        &app,
        "/api/plans/p1/suggestions",
        json!({"revision": 7, "snapshotId": "s1"}),
    )
    .await;
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
    let (status, bad) = post(
        &app,
        "/api/plans/p1/suggestions",
        json!({"snapshotId": "s2"}),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        bad["message"].as_str().unwrap().contains("revision"),
        "{bad}"
    );
}

#[actix_web::test]
async fn a_suggestion_running_past_the_configured_timeout_fails_with_reason_timeout() {
    let app = TestApp::spawn_with(|c| c.plan.timeout_ms = 300).await;
    post(&app, "/api/plans/p1/import", json!({"snapshotId": "s1"})).await;
    // An agent run that would sleep ten minutes in its first tool call.
    let (status, started) = post(
        &app,
        "/api/plans/p1/suggestions",
        json!({"revision": 1, "snapshotId": "s1", "prompt": "steps=3 ms=600000"}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let path = format!(
        "/api/plans/p1/suggestions/{}",
        started["requestId"].as_str().unwrap()
    );
    let failed = support::wait_until(std::time::Duration::from_secs(30), || {
        let (app, path) = (&app, path.clone());
        async move {
            let (_, v) = get(app, &path).await;
            (v["state"] == "failed").then_some(v)
        }
    })
    .await
    .expect("the request never failed");
    assert_eq!(failed["reason"], "timeout", "{failed}");
    assert_eq!(failed["diagnostic"], "timed out after 300 ms", "{failed}");
}

/// SPEC §9 `close()`: a drain refuses plan admissions first (503, nothing allocated), then closes the
/// coordinator — the running suggestion settles `cancelled (shutdown)` once its provider has stopped —
/// and storage still answers after it. A chat run that will not finish holds the drain open for its
/// deadline, so the test sees the draining process answer (nothing else in a drain need take time).
#[actix_web::test]
async fn a_drain_refuses_new_suggestions_and_settles_the_running_one_as_shutdown() {
    let app = TestApp::spawn_with(|c| c.drain.deadline_ms = 3_000).await;
    let (status, run) = post(
        &app,
        "/api/messages",
        json!({"thread": "a", "channel": "k", "user": "u", "text": "steps=1 ms=600000"}),
    )
    .await;
    assert_eq!(status, 202, "{run}");
    post(&app, "/api/plans/p1/import", json!({"snapshotId": "s1"})).await;
    // A provider that would sleep ten minutes in its first tool call.
    let (status, started) = post(
        &app,
        "/api/plans/p1/suggestions",
        json!({"revision": 1, "snapshotId": "s1", "prompt": "steps=3 ms=600000"}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let rid = storage::plan::RequestId::parse(started["requestId"].as_str().unwrap()).unwrap();
    let path = format!(
        "/api/plans/p1/suggestions/{}",
        started["requestId"].as_str().unwrap()
    );
    assert_eq!(get(&app, &path).await.1["state"], "pending");

    let TestApp {
        running,
        base,
        client,
        dir,
    } = app;
    let storage = running.storage.clone();
    let drained = actix_web::rt::spawn(running.drain());
    // Once the process says it is draining, a new suggestion is refused and nothing is allocated.
    let draining = support::wait_until(std::time::Duration::from_secs(10), || {
        let (client, url) = (client.clone(), format!("{base}/readyz"));
        async move { (client.get(url).send().await.ok()?.status().as_u16() == 503).then_some(()) }
    })
    .await;
    assert!(draining.is_some(), "never reported draining");
    // The HTTP server stops only after the coordinator closed and the runs drained: it still answers.
    let res = client
        .post(format!("{base}/api/plans/p1/suggestions"))
        .json(&json!({"revision": 1, "snapshotId": "s1", "prompt": "steps=0"}))
        .send()
        .await
        .expect("the server still answers while draining");
    assert_eq!(res.status().as_u16(), 503);
    drained.await.expect("join the drain").expect("drain");

    let request = storage
        .plan_request(rid)
        .await
        .expect("storage answers after the drain")
        .expect("the request");
    assert_eq!(
        request.state,
        storage::plan::RequestState::Cancelled,
        "{request:?}"
    );
    assert_eq!(
        request.reason,
        Some(storage::plan::TerminalReason::Shutdown),
        "{request:?}"
    );
    let plan = storage
        .plan(storage::plan::PlanId::parse("p1").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plan.revision.get(), 1, "a drain never advances a plan");
    drop(dir);
}

#[test]
fn plan_timeout_ms_defaults_to_ten_minutes_and_must_be_positive() {
    let parse = |text: &str| switchboard::Config::parse("test.toml", text, Vec::new());
    assert_eq!(parse("").expect("defaults").plan.timeout_ms, 600_000);
    assert_eq!(
        parse("[plan]\ntimeout_ms = 1500\n")
            .expect("set")
            .plan
            .timeout_ms,
        1500
    );
    let e = parse("[plan]\ntimeout_ms = 0\n").unwrap_err().to_string();
    assert!(e.contains("plan.timeout_ms"), "{e}");
}

/// A blocking HTTP call on a throwaway runtime (the child-process test has no runtime of its own).
fn http(f: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder + Send) -> (u16, Value) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let res = f(&reqwest::Client::new()).send().await.expect("request");
                let status = res.status().as_u16();
                (status, res.json().await.unwrap_or(Value::Null))
            })
        })
        .join()
        .unwrap()
    })
}

/// SPEC §9 "Crashes": a process killed mid-suggestion (`/admin/crash`: exit 137, no drain) leaves its
/// request pending; the next process settles it `failed (interrupted)` at boot and admits the plan again.
#[test]
fn a_suggestion_of_a_crashed_process_is_settled_interrupted_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_switchboard"));
    let mut a = switchboard::child::ChildServer::start(exe, dir.path(), &[])
        .expect("start the first process");
    let (status, _) = http(|c| {
        c.post(a.url("/api/plans/p1/import"))
            .json(&json!({"snapshotId": "s1"}))
    });
    assert_eq!(status, 201);
    let start = json!({"revision": 1, "snapshotId": "s1", "prompt": "steps=3 ms=600000"});
    let (status, started) = http(|c| c.post(a.url("/api/plans/p1/suggestions")).json(&start));
    assert_eq!(status, 202, "{started}");
    let rid = started["requestId"].as_str().unwrap().to_owned();
    let path = format!("/api/plans/p1/suggestions/{rid}");
    let (status, _) = http(|c| c.post(a.url("/admin/crash")));
    assert_eq!(status, 202);
    assert_eq!(a.wait_exit(std::time::Duration::from_secs(10)), Some(137));

    let b = switchboard::child::ChildServer::start(exe, dir.path(), &[])
        .expect("start the next process");
    let (_, row) = http(|c| c.get(b.url(&path)));
    assert_eq!(
        (row["state"].as_str(), row["reason"].as_str()),
        (Some("failed"), Some("interrupted")),
        "{row}"
    );
    assert!(
        row["diagnostic"]
            .as_str()
            .is_some_and(|d| d.contains("gone")),
        "{row}"
    );
    let (status, again) = http(|c| c.post(b.url("/api/plans/p1/suggestions")).json(&start));
    assert_eq!(status, 202, "{again}");
    assert_ne!(again["requestId"].as_str(), Some(rid.as_str()));
}
