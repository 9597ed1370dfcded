//! The HTTP edge in a real browser (headless Chromium over WebDriver, as tests/browser.rs): the pages'
//! buttons work, another site's page and a DNS-rebinding name get nothing (SPEC §8.1).

mod support;

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};
use support::TestApp;

// ---- In a real browser (headless Chromium over WebDriver, as tests/browser.rs) ----

/// A chromedriver process with one Chromium session; both end on drop.
struct Browser {
    child: std::process::Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Chromium resolving `evil.example` to 127.0.0.1 — what a DNS-rebinding attacker arranges.
    async fn start(profile: &std::path::Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start chromedriver (install chromium and chromium-driver, see .ci/run)");
        let mut b = Browser {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http: reqwest::Client::new(),
        };
        let ready = support::wait_until(Duration::from_secs(20), || async {
            let v: Value = b
                .http
                .get(format!("{}/status", b.base))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        })
        .await;
        assert!(ready.is_some(), "chromedriver did not become ready");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--host-resolver-rules=MAP evil.example 127.0.0.1",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
        }}});
        let v = b.call(Method::POST, "/session", Some(caps)).await;
        b.session = v["sessionId"].as_str().expect("sessionId").to_owned();
        b
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req
            .send()
            .await
            .expect("webdriver")
            .json()
            .await
            .expect("webdriver JSON");
        v["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(
            Method::POST,
            &format!("/session/{}/url", self.session),
            Some(json!({"url": url})),
        )
        .await;
    }

    async fn js(&self, script: &str) -> Value {
        self.call(
            Method::POST,
            &format!("/session/{}/execute/sync", self.session),
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// Poll `script` until it answers something other than null or false.
    async fn wait_for(&self, script: &str) -> Option<Value> {
        support::wait_until(Duration::from_secs(20), || async {
            let v = self.js(script).await;
            (!v.is_null() && v != Value::Bool(false)).then_some(v)
        })
        .await
    }
}

/// A page on another origin (the attacker's site) that fires, on load, what a web page can send to the
/// operator's loopback server without a preflight, and records how each call ended in `window.done`.
async fn evil_site(target: String) -> (std::net::SocketAddr, actix_web::dev::ServerHandle) {
    let page = format!(
        r#"<!doctype html><script>
var t = '{target}', msg = JSON.stringify({{thread: 'evil', channel: 'c1', user: 'u1', text: 'steps=1 ms=0'}});
var calls = [
  fetch(t + '/api/messages', {{method: 'POST', mode: 'no-cors', headers: {{'Content-Type': 'text/plain'}}, body: msg}}),
  fetch(t + '/admin/crash', {{method: 'POST', mode: 'no-cors'}}),
  fetch(t + '/admin/drain', {{method: 'POST', mode: 'no-cors'}}),
  fetch(t + '/api/messages', {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: msg}})
];
Promise.all(calls.map(function (p) {{ return p.then(function (r) {{ return 'answered ' + r.type; }}, function (e) {{ return 'blocked'; }}); }}))
  .then(function (r) {{ window.done = r; }});
</script>"#
    );
    let server = actix_web::HttpServer::new(move || {
        let page = page.clone();
        actix_web::App::new().default_service(actix_web::web::to(move || {
            let page = page.clone();
            async move {
                actix_web::HttpResponse::Ok()
                    .content_type("text/html")
                    .body(page)
            }
        }))
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    (addr, handle)
}

#[actix_web::test]
async fn in_a_browser_the_pages_buttons_work_and_another_sites_page_and_a_rebinding_name_get_nothing(
) {
    let app = TestApp::spawn().await;
    let port = app.running.addr.port();
    let browser = Browser::start(&app.dir.path().join("chromium-profile")).await;

    // The run page's own buttons, under its CSP, same-origin: Stop (soft) on one run, Kill on another.
    let soft = app.start_run("b-soft", "steps=50 ms=200").await;
    browser.goto(&app.url(&format!("/runs/{soft}"))).await;
    assert!(
        browser
            .wait_for("return document.querySelectorAll('#events li.ev-tool_result').length > 0;")
            .await
            .is_some(),
        "the page's script runs and streams"
    );
    browser
        .js("document.getElementById('stop-soft').click(); return true;")
        .await;
    let msg = browser.wait_for("var t = document.getElementById('control-msg').textContent; return t.indexOf('202') === 0 ? t : null;").await;
    assert_eq!(msg, Some(json!("202 stopping")));
    assert_eq!(
        app.final_record(&soft).await.head.status,
        storage::record::RunStatus::StoppedSoft
    );

    let doomed = app.start_run("b-kill", "steps=50 ms=200").await;
    browser.goto(&app.url(&format!("/runs/{doomed}"))).await;
    browser
        .js("window.__noConfirm = true; document.getElementById('kill').click(); return true;")
        .await;
    let msg = browser.wait_for("var t = document.getElementById('control-msg').textContent; return t.indexOf('202') === 0 ? t : null;").await;
    assert_eq!(msg, Some(json!("202 killing")));
    let gone = support::wait_until(Duration::from_secs(20), || async {
        let (status, _) = app.get_json(&format!("/api/runs/{doomed}"), None).await;
        (status == 404).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the killed run is gone");

    // Another site's page fires preflight-free posts at the loopback server: nothing is admitted, the
    // process neither crashes nor drains, and the JSON post needs a preflight that no CORS answer allows.
    let (evil, evil_server) = evil_site(app.base.clone()).await;
    browser
        .goto(&format!("http://localhost:{}/", evil.port()))
        .await;
    let done = browser
        .wait_for("return window.done || null;")
        .await
        .expect("the attacker's calls settled");
    assert_eq!(
        done,
        json!([
            "answered opaque",
            "answered opaque",
            "answered opaque",
            "blocked"
        ]),
        "{done}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, runs) = app.get_json("/api/runs?status=all", None).await;
    assert_eq!(status, 200, "the server is up");
    assert!(
        runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["threadKey"] != "c1:evil"),
        "{runs}"
    );
    assert!(
        !app.running
            .draining
            .load(std::sync::atomic::Ordering::SeqCst),
        "no drain started"
    );
    evil_server.stop(false).await;

    // DNS rebinding: `evil.example` now resolves to 127.0.0.1; the page and its reads are refused.
    browser
        .goto(&format!("http://evil.example:{port}/api/runs"))
        .await;
    let body = browser.js("return document.body.innerText;").await;
    assert!(
        body.as_str().unwrap_or("").contains("\"forbidden\""),
        "{body}"
    );
    browser
        .call(
            Method::DELETE,
            &format!("/session/{}", browser.session),
            None,
        )
        .await;
}
