//! End to end in a real browser: headless Debian Chromium driven over WebDriver (chromedriver), spoken
//! directly as JSON over reqwest. The run page must show step events live without a reload, and its
//! Stop (hard) button — authorized only by the capability token in the page URL — must stop the run and
//! leave the page showing the stopped status.
//!
//! CI installs `chromium` and `chromium-driver` (`.ci/run`); a missing browser FAILS this test.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use storage::record::RunStatus;
use support::{add_token, TestApp};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The W3C WebDriver element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process, killed on drop.
struct Driver {
    child: Child,
    base: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    async fn start() -> Driver {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(Path::new(bin).exists(), "{bin} is missing: install chromium and chromium-driver (see .ci/run)");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Driver { child, base: format!("http://127.0.0.1:{port}"), http: reqwest::Client::new() };
        let ready = support::wait_until(Duration::from_secs(20), || async {
            let r = driver.http.get(format!("{}/status", driver.base)).send().await.ok()?;
            let v: Value = r.json().await.ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        })
        .await;
        assert!(ready.is_some(), "chromedriver did not become ready");
        driver
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("webdriver request");
        let status = res.status();
        let v: Value = res.json().await.expect("webdriver JSON");
        assert!(status.is_success(), "webdriver {path}: {status} {v}");
        v["value"].clone()
    }

    async fn session(&self, profile: &Path) -> Session<'_> {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1000",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
        }}});
        let v = self.call(reqwest::Method::POST, "/session", Some(caps)).await;
        Session {
            driver: self,
            id: v["sessionId"].as_str().expect("sessionId").to_owned(),
            version: v["capabilities"]["browserVersion"].as_str().unwrap_or("?").to_owned(),
        }
    }
}

struct Session<'a> {
    driver: &'a Driver,
    id: String,
    version: String,
}

impl Session<'_> {
    async fn post(&self, path: &str, body: Value) -> Value {
        self.driver.call(reqwest::Method::POST, &format!("/session/{}{path}", self.id), Some(body)).await
    }

    async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    async fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []})).await
    }

    async fn click(&self, css: &str) {
        let el = self.post("/element", json!({"using": "css selector", "value": css})).await;
        let id = el[ELEMENT].as_str().expect("element id").to_owned();
        self.post(&format!("/element/{id}/click"), json!({})).await;
    }

    /// Poll `script` until it returns true.
    async fn wait_for(&self, script: &str, within: Duration) -> bool {
        support::wait_until(within, || async { self.js(script).await.as_bool().filter(|b| *b) }).await.is_some()
    }

    async fn screenshot(&self, to: &Path) {
        let v = self.driver.call(reqwest::Method::GET, &format!("/session/{}/screenshot", self.id), None).await;
        let png = base64_decode(v.as_str().expect("base64 screenshot"));
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(to, png).expect("write screenshot");
    }

    async fn close(self) {
        self.driver.call(reqwest::Method::DELETE, &format!("/session/{}", self.id), None).await;
    }
}

/// Standard base64 (with padding) to bytes.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| acc | (u32::from(val(*c)) << (18 - 6 * i)));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    out
}

fn count(css: &str) -> String {
    format!("return document.querySelectorAll({css:?}).length;")
}

#[actix_web::test]
async fn the_run_page_streams_steps_live_and_its_hard_stop_button_stops_the_run() {
    // Dev bypass off and no read token for the browser: only the capability token opens the page.
    let mut writer = String::new();
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        writer = add_token(c, "writer", &["messages:write"], json!({"kind": "all"}));
    })
    .await;
    let driver = Driver::start().await;
    let profile = app.dir.path().join("chromium-profile");
    let session = driver.session(&profile).await;
    println!("browser: Chromium {}", session.version);

    let (status, body) = app
        .post_as(&writer, json!({"thread": "browser", "channel": "c1", "user": "u1", "text": "steps=5 ms=400 <script>window.pwned=1</script>"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let token = body["liveUrl"].as_str().unwrap().split("token=").nth(1).unwrap().to_owned();
    session.goto(&app.url(&format!("/runs/{run_id}?token={token}"))).await;
    assert_eq!(session.js("return document.getElementById('status').textContent;").await, "live");
    session.js("window.__samePage = 'yes'; return true;").await;
    let seeded = session.js(&count("#events li.ev-tool_result")).await.as_u64().unwrap();

    // Step events arrive live, without a reload: a step's result the server-rendered seed did not have.
    let tool_results = "#events li.ev-tool_result";
    let one_more = format!("return document.querySelectorAll({tool_results:?}).length >= {};", seeded + 1);
    assert!(session.wait_for(&one_more, Duration::from_secs(20)).await, "step events did not appear live");
    assert_eq!(session.js("return window.__samePage || null;").await, "yes", "the page reloaded");
    let steps_text = session.js("return document.querySelector('#events li.ev-tool_call .kind').textContent;").await;
    assert!(steps_text.as_str().unwrap().starts_with("step 1 · tool call sleep"), "{steps_text}");
    // The request's markup rendered as text, not as a script.
    assert_eq!(session.js("return window.pwned || null;").await, Value::Null);
    let input = session.js("return document.querySelector('#events li.ev-input .body').textContent;").await;
    assert!(input.as_str().unwrap().contains("<script>window.pwned=1</script>"), "{input}");

    // Stop (hard) through the page's button: the page shows the stopped status.
    session.click("#stop-hard").await;
    let stopped = "return document.getElementById('status').textContent === 'stopped_hard';";
    assert!(session.wait_for(stopped, Duration::from_secs(20)).await, "the page never showed stopped_hard");
    assert_eq!(session.js("return document.getElementById('control-msg').textContent;").await, "202 stopping");
    assert!(session.js(&count("#events li.ev-stop_requested")).await.as_u64().unwrap() >= 1);
    assert_eq!(session.js("return document.getElementById('stop-hard').disabled;").await, true);
    assert_eq!(session.js("return window.__samePage || null;").await, "yes");
    let shot = app.dir.path().join("run-page-stopped.png");
    session.screenshot(&shot).await;
    println!("screenshot: {}", shot.display());
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
    // The temp dir goes with the test; keep a copy when asked (for looking at it).
    if let Ok(keep) = std::env::var("SWITCHBOARD_SCREENSHOT_DIR") {
        std::fs::copy(&shot, Path::new(&keep).join("run-page-stopped.png")).expect("copy the screenshot");
    }

    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::StoppedHard);
    let steps = record.events.iter().filter(|e| e["type"] == "tool_result").count();
    assert!(steps < 5, "the hard stop cut the run short ({steps} steps)");
    session.close().await;
}
