//! End to end in a real browser: headless Debian Chromium driven over WebDriver (chromedriver), spoken
//! directly as JSON over reqwest.
//! - The run page shows step events live without a reload, and its Stop (hard) button — authorized only
//!   by the capability token in the page URL — stops the run and leaves the page showing the status.
//! - Its timeline has one row per step with model and tool bars; after a crash of the real binary and a
//!   resume, a gap marker with its length; a failed run shows its error box.
//! - The index filters by terminal status, and at 390 px wide it has no horizontal overflow.
//!
//! Every test saves screenshots under `target/screenshots/` (one name per test), to look at.
//!
//! CI installs `chromium` and `chromium-driver` (`.ci/run`); a missing browser FAILS this test.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use storage::record::RunStatus;
use support::{add_token, TestApp};
use web::routes::html::fmt_duration;

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
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: install chromium and chromium-driver (see .ci/run)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let ready = support::wait_until(Duration::from_secs(20), || async {
            let r = driver
                .http
                .get(format!("{}/status", driver.base))
                .send()
                .await
                .ok()?;
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
        self.session_sized(profile, None).await
    }

    /// A session whose viewport is `width × height` CSS pixels (a phone), or the desktop window.
    async fn session_sized(&self, profile: &Path, phone: Option<(u32, u32)>) -> Session<'_> {
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
        let mut options = json!({"binary": CHROMIUM, "args": args});
        if let Some((width, height)) = phone {
            options["mobileEmulation"] =
                json!({"deviceMetrics": {"width": width, "height": height, "pixelRatio": 2.0}});
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}});
        let v = self
            .call(reqwest::Method::POST, "/session", Some(caps))
            .await;
        Session {
            driver: self,
            id: v["sessionId"].as_str().expect("sessionId").to_owned(),
            version: v["capabilities"]["browserVersion"]
                .as_str()
                .unwrap_or("?")
                .to_owned(),
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
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}{path}", self.id),
                Some(body),
            )
            .await
    }

    async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    async fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    async fn click(&self, css: &str) {
        let el = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await;
        let id = el[ELEMENT].as_str().expect("element id").to_owned();
        self.post(&format!("/element/{id}/click"), json!({})).await;
    }

    /// Poll `script` until it returns true.
    async fn wait_for(&self, script: &str, within: Duration) -> bool {
        support::wait_until(within, || async {
            self.js(script).await.as_bool().filter(|b| *b)
        })
        .await
        .is_some()
    }

    async fn screenshot(&self, to: &Path) {
        let v = self
            .driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}/screenshot", self.id),
                None,
            )
            .await;
        let png = base64_decode(v.as_str().expect("base64 screenshot"));
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(to, png).expect("write screenshot");
    }

    /// Save a screenshot as `target/screenshots/<name>.png`; answers its path.
    async fn shoot(&self, name: &str) -> std::path::PathBuf {
        let dir = screenshots();
        let path = dir.join(format!("{name}.png"));
        self.screenshot(&path).await;
        assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        println!("screenshot: {}", path.display());
        path
    }

    async fn close(self) {
        self.driver
            .call(
                reqwest::Method::DELETE,
                &format!("/session/{}", self.id),
                None,
            )
            .await;
    }
}

/// `target/screenshots/` of this workspace (created).
fn screenshots() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).expect("create target/screenshots");
    dir
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
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| {
            acc | (u32::from(val(*c)) << (18 - 6 * i))
        });
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
        .post_as(&writer, json!({"thread": "browser", "channel": "c1", "user": "u1", "text": "steps=30 ms=400 <script>window.pwned=1</script>"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let token = body["liveUrl"]
        .as_str()
        .unwrap()
        .split("token=")
        .nth(1)
        .unwrap()
        .to_owned();
    session
        .goto(&app.url(&format!("/runs/{run_id}?token={token}")))
        .await;
    assert_eq!(
        session
            .js("return document.getElementById('status').textContent;")
            .await,
        "live"
    );
    session.js("window.__samePage = 'yes'; return true;").await;
    let seeded = session
        .js(&count("#events li.ev-tool_result"))
        .await
        .as_u64()
        .unwrap();

    // Step events arrive live, without a reload: a step's result the server-rendered seed did not have.
    let tool_results = "#events li.ev-tool_result";
    let one_more = format!(
        "return document.querySelectorAll({tool_results:?}).length >= {};",
        seeded + 1
    );
    assert!(
        session.wait_for(&one_more, Duration::from_secs(20)).await,
        "step events did not appear live"
    );
    assert_eq!(
        session.js("return window.__samePage || null;").await,
        "yes",
        "the page reloaded"
    );
    let steps_text = session
        .js("return document.querySelector('#events li.ev-tool_call .kind').textContent;")
        .await;
    assert!(
        steps_text
            .as_str()
            .unwrap()
            .starts_with("step 1 · tool call sleep"),
        "{steps_text}"
    );
    // The request's markup rendered as text, not as a script.
    assert_eq!(
        session.js("return window.pwned || null;").await,
        Value::Null
    );
    let input = session
        .js("return document.querySelector('#events li.ev-input .body').textContent;")
        .await;
    assert!(
        input
            .as_str()
            .unwrap()
            .contains("<script>window.pwned=1</script>"),
        "{input}"
    );

    // The header says what the run waits on, and the timeline grows without a reload.
    let now = session
        .js("var n = document.getElementById('now'); return n ? n.textContent : null;")
        .await;
    assert!(
        now.as_str().is_some_and(|t| t.starts_with("now: step ")),
        "{now}"
    );
    assert!(
        session
            .wait_for(
                &format!(
                    "{} >= 2;",
                    count("#timeline .tl-step").trim_end_matches(';')
                ),
                Duration::from_secs(20)
            )
            .await,
        "the timeline did not grow live"
    );
    assert_eq!(
        session.js("return window.__samePage || null;").await,
        "yes",
        "the page reloaded"
    );
    // Counts are event counts: the list's range and the Events fact agree with the items shown.
    let agree = "var n = document.querySelectorAll('#events li').length; \
                 return document.getElementById('f-events').textContent === String(n) && \
                 document.getElementById('ev-range').textContent === '1\\u2013' + n + ' of ' + n;";
    assert!(
        session.wait_for(agree, Duration::from_secs(5)).await,
        "event counts disagree"
    );
    session.shoot("run-page-live").await;

    // Stop (hard) through the page's button: the page shows the stopped status.
    session.click("#stop-hard").await;
    let stopped = "return document.getElementById('status').textContent === 'stopped_hard';";
    assert!(
        session.wait_for(stopped, Duration::from_secs(20)).await,
        "the page never showed stopped_hard"
    );
    assert_eq!(
        session
            .js("return document.getElementById('control-msg').textContent;")
            .await,
        "202 stopping"
    );
    assert!(
        session
            .js(&count("#events li.ev-stop_requested"))
            .await
            .as_u64()
            .unwrap()
            >= 1
    );
    assert_eq!(
        session
            .js("return document.getElementById('stop-hard').disabled;")
            .await,
        true
    );
    assert_eq!(
        session.js(&count("#now")).await,
        0,
        "a finished run waits on nothing"
    );
    assert_eq!(session.js("return window.__samePage || null;").await, "yes");
    let shot = session.shoot("run-page-stopped").await;
    // Also keep a copy where asked.
    if let Ok(keep) = std::env::var("SWITCHBOARD_SCREENSHOT_DIR") {
        std::fs::copy(&shot, Path::new(&keep).join("run-page-stopped.png"))
            .expect("copy the screenshot");
    }

    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::StoppedHard);
    let steps = record
        .events
        .iter()
        .filter(|e| e["type"] == "tool_result")
        .count();
    assert!(
        steps < 30,
        "the hard stop cut the run short ({steps} steps)"
    );
    session.close().await;
}

/// The number of `css` elements matching `pred` (a JS expression over `e`).
fn count_where(css: &str, pred: &str) -> String {
    format!("return Array.prototype.filter.call(document.querySelectorAll({css:?}), function (e) {{ return {pred}; }}).length;")
}

#[actix_web::test]
async fn the_timeline_of_a_finished_run_has_one_row_per_step_with_model_and_tool_bars() {
    let app = TestApp::spawn().await;
    let driver = Driver::start().await;
    let session = driver
        .session(&app.dir.path().join("chromium-profile"))
        .await;
    let run_id = app
        .start_run("timeline", "steps=4 ms=250 think_ms=120")
        .await;
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    session.goto(&app.url(&format!("/runs/{run_id}"))).await;

    // Four tool-calling steps and the answer's turn: five rows, in order.
    let steps = session.js("return Array.prototype.map.call(document.querySelectorAll('#timeline .tl-step'), function (r) { return r.dataset.step; });").await;
    assert_eq!(steps, json!(["1", "2", "3", "4", "5"]), "one row per step");
    // Every row has a model bar; the four tool steps a tool bar too, each drawn with a real width.
    let drawn = "e.getBoundingClientRect().width > 0";
    assert_eq!(
        session
            .js(&count_where("#timeline .tl-step rect.bar-model", drawn))
            .await,
        5
    );
    assert_eq!(
        session
            .js(&count_where("#timeline .tl-step rect.bar-tool", drawn))
            .await,
        4
    );
    // A 250 ms sleep is drawn wider than nothing and stays inside its track.
    let inside =
        "var t = e.closest('svg').getBoundingClientRect(), b = e.getBoundingClientRect(); \
                  return b.left >= t.left - 0.5 && b.right <= t.right + 0.5 && b.width >= 2;";
    let all_inside = format!("return Array.prototype.every.call(document.querySelectorAll('#timeline rect.bar'), function (e) {{ {inside} }});");
    assert_eq!(session.js(&all_inside).await, true);
    // Durations are written beside the bars: a sleep of about 250 ms.
    let words = session.js("return document.querySelector('#timeline .tl-step[data-step=\"1\"] .tl-dur').textContent;").await;
    assert!(
        words.as_str().unwrap().starts_with("model ")
            && words.as_str().unwrap().contains(" · sleep "),
        "{words}"
    );
    // No gap, no "now" line, nothing failed; the events have relative times, counted as events.
    assert_eq!(session.js(&count(".tl-gap")).await, 0);
    assert_eq!(session.js(&count("#now")).await, 0);
    assert_eq!(session.js(&count(".tl-failed")).await, 0);
    let rel = session
        .js("return document.querySelector('#events li.ev-tool_result .rel').textContent;")
        .await;
    assert!(rel.as_str().unwrap().starts_with('+'), "{rel}");
    let shown = session.js(&count("#events li")).await.as_u64().unwrap();
    assert_eq!(
        session
            .js("return document.getElementById('f-events').textContent;")
            .await,
        shown.to_string()
    );
    assert_eq!(shown as usize, record.events.len());
    assert_eq!(
        session
            .js("return document.getElementById('answer').textContent;")
            .await,
        "done"
    );
    assert_eq!(
        session
            .js("return document.getElementById('error-box').hidden;")
            .await,
        true
    );
    session.shoot("timeline-finished").await;
    session.close().await;
}

#[actix_web::test]
async fn a_failed_run_shows_its_error_box_and_its_failed_step() {
    let app = TestApp::spawn().await;
    let driver = Driver::start().await;
    let session = driver
        .session(&app.dir.path().join("chromium-profile"))
        .await;
    let run_id = app.start_run("failing", "steps=3 ms=100 fail_at=3").await;
    assert_eq!(
        app.final_record(&run_id).await.head.status,
        RunStatus::Failed
    );
    session.goto(&app.url(&format!("/runs/{run_id}"))).await;
    assert_eq!(
        session
            .js("return document.getElementById('status').textContent;")
            .await,
        "failed"
    );
    let box_ = "var b = document.getElementById('error-box'); return !b.hidden && b.getBoundingClientRect().height > 0;";
    assert_eq!(session.js(box_).await, true, "the error box is visible");
    let text = session
        .js("return document.getElementById('error-text').textContent;")
        .await;
    assert_eq!(text, "permanent: scripted failure at model call 3");
    // Above the timeline, and the failed model call is marked on its step's row.
    let above = "return document.getElementById('error-box').getBoundingClientRect().top < document.getElementById('timeline').getBoundingClientRect().top;";
    assert_eq!(session.js(above).await, true);
    assert_eq!(
        session
            .js("return document.querySelector('.tl-failed').dataset.step;")
            .await,
        "3"
    );
    assert_eq!(session.js(&count(".tl-failed rect.bar-bad")).await, 1);
    session.shoot("run-failed").await;
    session.close().await;
}

#[actix_web::test]
async fn after_a_crash_and_resume_the_timeline_shows_the_gap_with_its_length() {
    use switchboard::child::ChildServer;
    let dir = tempfile::tempdir().unwrap();
    let exe = Path::new(env!("CARGO_BIN_EXE_switchboard"));
    let mut first = ChildServer::start(exe, dir.path(), &[]).expect("start switchboard");
    let http = reqwest::Client::new();
    let (status, body) = post(
        &http,
        &first.url("/api/messages"),
        json!({"thread": "crashy", "channel": "c1", "user": "u1",
        "text": "steps=6 think_ms=250 tool=append_file"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    // Two steps are durable, then the whole process dies (exit 137) and stays down a while.
    let events_url =
        |server: &ChildServer| server.url(&format!("/api/runs/{run_id}/events?limit=500"));
    let two = support::wait_until(Duration::from_secs(30), || async {
        let v: Value = http
            .get(events_url(&first))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["events"]
            .as_array()?
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    assert!(two.is_some(), "two steps before the crash");
    let (status, _) = post(&http, &first.url("/admin/crash"), json!({})).await;
    assert_eq!(status, 202);
    assert_eq!(first.wait_exit(Duration::from_secs(10)), Some(137));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let second = ChildServer::start(exe, dir.path(), &[]).expect("restart switchboard");
    let finished = support::wait_until(Duration::from_secs(60), || async {
        let v: Value = http
            .get(second.url(&format!("/api/runs/{run_id}")))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v["finished"] == true && v.get("provisional").is_none()).then_some(v)
    })
    .await
    .expect("the resumed run finished");
    assert_eq!(finished["status"], "completed", "{finished}");

    // The gap the page should show: from the last event the first process committed to `resumed`.
    let v: Value = http
        .get(events_url(&second))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let events = v["events"].as_array().unwrap();
    let resumed = events
        .iter()
        .position(|e| e["type"] == "resumed")
        .expect("a resumed event");
    let gap_ms = events[resumed]["at"].as_i64().unwrap()
        - events[..resumed]
            .iter()
            .filter_map(|e| e["at"].as_i64())
            .max()
            .unwrap();
    assert!(
        gap_ms >= 1_500,
        "the process was down at least 1.5 s: {gap_ms}"
    );

    let driver = Driver::start().await;
    let session = driver.session(&dir.path().join("chromium-profile")).await;
    session.goto(&second.url(&format!("/runs/{run_id}"))).await;
    assert_eq!(
        session.js(&count("#timeline .tl-gap")).await,
        1,
        "one gap marker"
    );
    assert_eq!(
        session
            .js("return document.querySelector('#timeline .tl-gap').dataset.gapMs;")
            .await,
        gap_ms.to_string()
    );
    let text = session
        .js("return document.querySelector('#timeline .tl-gap .tl-dur').textContent;")
        .await;
    assert!(
        text.as_str()
            .unwrap()
            .starts_with(&format!("gap {}", fmt_duration(gap_ms))),
        "{text}"
    );
    // The band is drawn, and every step of the run still has its row.
    assert_eq!(
        session
            .js(&count_where(
                "#timeline .tl-gap rect.gap-mark",
                "e.getBoundingClientRect().width > 0"
            ))
            .await,
        1
    );
    let rows = session
        .js(&count("#timeline .tl-step"))
        .await
        .as_u64()
        .unwrap();
    assert_eq!(rows, 7, "six tool steps and the answer's turn");
    // The gap row sits between the steps before the crash and those after it.
    let order = session.js("return Array.prototype.map.call(document.querySelectorAll('#timeline .tl-step, #timeline .tl-gap'), function (r) { return r.dataset.step || 'gap'; });").await;
    let order: Vec<String> = order
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let at = order.iter().position(|s| s == "gap").unwrap();
    assert!(at >= 2 && at < order.len() - 1, "{order:?}");
    assert_eq!(session.js(&count("#events li.ev-resumed")).await, 1);
    session.shoot("timeline-crash-gap").await;
    session.close().await;
}

async fn post(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let res = http.post(url).json(&body).send().await.expect("POST");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// Runs of every kind for the index: completed ones, a failed one with its error, a stopped one and a
/// live one with a long label.
async fn populate(app: &TestApp) -> (Vec<String>, String, String) {
    let mut completed = Vec::new();
    for i in 0..3 {
        completed.push(app.start_run(&format!("ok-{i}"), "steps=1 ms=0").await);
    }
    let failed = app
        .start_run(
            "failing-thread-with-a-rather-long-name",
            "steps=2 ms=0 fail_at=2",
        )
        .await;
    let stopped = app.start_run("stopped", "steps=50 ms=100").await;
    app.event(&stopped, "tool_call").await;
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{stopped}/stop")))
        .json(&json!({"mode": "soft"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    for id in completed.iter().chain([&failed, &stopped]) {
        app.final_record(id).await;
    }
    let live = app
        .start_run(
            &"long-".repeat(12),
            "steps=20 ms=500 averyveryverylongwordthatdoesnotbreakanywhereatallinthetitle",
        )
        .await;
    app.event(&live, "tool_call").await;
    (completed, failed, live)
}

#[actix_web::test]
async fn the_index_filters_by_a_terminal_status_and_fits_a_390_px_screen() {
    let app = TestApp::spawn().await;
    let (completed, failed, live) = populate(&app).await;
    let driver = Driver::start().await;

    // Desktop: the form's status filter lists failed runs only, with the error.
    let session = driver
        .session(&app.dir.path().join("chromium-profile"))
        .await;
    session.goto(&app.url("/runs?all=1")).await;
    assert_eq!(session.js(&count("#rows tr")).await, 6);
    assert_eq!(
        session
            .js("return document.getElementById('chart').dataset.total;")
            .await,
        "6"
    );
    session.shoot("index-desktop").await;
    session
        .js("document.querySelector('#filters select[name=status]').value = 'failed'; return true;")
        .await;
    session.click("#filters button[type=submit]").await;
    assert!(session.wait_for("return location.search.indexOf('status=failed') >= 0 && !!document.getElementById('rows');", Duration::from_secs(10)).await);
    let listed = session.js("return Array.prototype.map.call(document.querySelectorAll('#rows tr'), function (r) { return r.dataset.id; });").await;
    assert_eq!(listed, json!([failed.clone()]), "only the failed run");
    let statuses = session.js("return Array.prototype.map.call(document.querySelectorAll('#rows .status'), function (s) { return s.textContent; });").await;
    assert_eq!(statuses, json!(["failed"]));
    let err = session
        .js("return document.querySelector('#rows .err').textContent;")
        .await;
    assert_eq!(err, "permanent: scripted failure at model call 2");
    for id in completed.iter().chain([&live]) {
        assert_eq!(
            session
                .js(&format!(
                    "return document.body.textContent.indexOf({id:?}) >= 0;"
                ))
                .await,
            false,
            "{id} is not listed"
        );
    }
    session.shoot("index-failed").await;
    session.close().await;

    // A phone, 390 px wide: the index (with history, and the live one) has no horizontal overflow.
    let phone = driver
        .session_sized(&app.dir.path().join("chromium-phone"), Some((390, 844)))
        .await;
    for (path, name) in [
        ("/runs?all=1", "index-390"),
        ("/runs", "index-live-390"),
        ("/runs?status=failed", "index-failed-390"),
    ] {
        phone.goto(&app.url(path)).await;
        assert_eq!(phone.js("return window.innerWidth;").await, 390, "{path}");
        let width = phone
            .js("return document.documentElement.scrollWidth;")
            .await
            .as_u64()
            .unwrap();
        assert!(width <= 390, "{path}: the page is {width} px wide");
        // The rows became cards: every cell within the screen.
        let outside = count_where(
            "#rows td, #chart, #filters",
            "e.getBoundingClientRect().right > 390.5",
        );
        assert_eq!(phone.js(&outside).await, 0, "{path}");
        phone.shoot(name).await;
    }
    // The live view of a run fits too.
    phone.goto(&app.url(&format!("/runs/{failed}"))).await;
    let width = phone
        .js("return document.documentElement.scrollWidth;")
        .await
        .as_u64()
        .unwrap();
    assert!(width <= 390, "the run page is {width} px wide");
    phone.shoot("run-failed-390").await;
    phone.close().await;
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{live}/stop")))
        .json(&json!({"mode": "hard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    app.final_record(&live).await;
}
