//! `/admin/crash` and `/admin/drain` refusals (SPEC §6.5), in-process (a granted crash would end the
//! test process: the kill suite in tests/kill.rs exercises it on the real binary).

mod support;

use support::TestApp;

async fn status(app: &TestApp, method: reqwest::Method, path: &str, bearer: Option<&str>) -> u16 {
    let mut req = app.client.request(method, app.url(path));
    if let Some(t) = bearer {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status().as_u16()
}

#[actix_web::test]
async fn admin_endpoints_need_deploy_write() {
    std::env::set_var("SB_TEST_ADMIN_READER", "reader-secret");
    std::env::set_var("SB_TEST_ADMIN_DEPLOYER", "deployer-secret");
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        c.auth.tokens = vec![
            switchboard::config::TokenConfig {
                name: "reader".into(),
                token_env: "SB_TEST_ADMIN_READER".into(),
                scopes: vec!["runs:read".into()],
                visible_to: None,
            },
            switchboard::config::TokenConfig {
                name: "deployer".into(),
                token_env: "SB_TEST_ADMIN_DEPLOYER".into(),
                scopes: vec!["deploy:write".into()],
                visible_to: None,
            },
        ];
    })
    .await;
    use reqwest::Method;
    assert_eq!(status(&app, Method::POST, "/admin/crash", None).await, 401);
    assert_eq!(
        status(&app, Method::POST, "/admin/crash", Some("wrong")).await,
        401
    );
    assert_eq!(
        status(&app, Method::POST, "/admin/crash", Some("reader-secret")).await,
        403
    );
    assert_eq!(
        status(&app, Method::GET, "/admin/crash", Some("deployer-secret")).await,
        405
    );
    assert_eq!(
        status(&app, Method::POST, "/admin/drain", Some("reader-secret")).await,
        403
    );
    // A granted drain answers 202 and tells the process to drain.
    let notified = app.running.shutdown.clone();
    let wait = tokio::spawn(async move { notified.notified().await });
    assert_eq!(
        status(&app, Method::POST, "/admin/drain", Some("deployer-secret")).await,
        202
    );
    tokio::time::timeout(std::time::Duration::from_secs(5), wait)
        .await
        .unwrap()
        .unwrap();
}

#[actix_web::test]
async fn without_dev_bypass_or_tokens_admin_is_unavailable() {
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        c.auth.tokens.clear();
    })
    .await;
    assert_eq!(
        status(&app, reqwest::Method::POST, "/admin/crash", None).await,
        503
    );
    assert_eq!(
        status(&app, reqwest::Method::POST, "/admin/drain", None).await,
        503
    );
}

#[actix_web::test]
async fn a_drain_with_nothing_running_stops_admitting_and_finishes() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&run_id).await;
    let storage = app.running.storage.clone();
    let draining = app.running.draining.clone();
    let report = app.running.drain().await.unwrap();
    assert!(
        report.handed_off.is_empty() && report.abandoned.is_empty(),
        "{report:?}"
    );
    assert!(draining.load(std::sync::atomic::Ordering::SeqCst));
    assert!(storage.list_live().await.unwrap().is_empty());
}

/// A granted crash answers `202 {ok: true, generation, pid}` — the generation `/healthz` shows and the
/// id of the process that is about to die — then the process exits 137. On the real binary: in-process,
/// the exit would end the test.
#[actix_web::test]
async fn a_granted_crash_answers_its_generation_and_pid_then_exits_137() {
    let dir = tempfile::tempdir().unwrap();
    // The embedded configuration: a loopback dev-bypass operator holds `deploy:write`.
    let mut child = switchboard::child::ChildServer::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchboard")),
        dir.path(),
        &[],
    )
    .expect("start switchboard");
    let client = reqwest::Client::new();
    let health: serde_json::Value = client
        .get(child.url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let generation = health["generation"]
        .as_str()
        .expect("a generation on /healthz")
        .to_owned();
    assert!(
        storage::Generation::parse(&generation).is_some(),
        "{generation}"
    );
    assert_eq!(
        health["pid"].as_u64(),
        Some(u64::from(child.pid())),
        "/healthz names the child's pid"
    );

    let res = client.post(child.url("/admin/crash")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 202);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"ok": true, "generation": generation, "pid": child.pid()})
    );
    assert_eq!(
        child.wait_exit(std::time::Duration::from_secs(10)),
        Some(137),
        "crash exits 137"
    );
}
