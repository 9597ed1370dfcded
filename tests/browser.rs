//! End to end in a real browser: headless Debian Chromium driven over WebDriver (chromedriver), spoken
//! directly as JSON over reqwest.
//! - The run page shows step events live without a reload, and its Stop (hard) button — authorized only
//!   by the capability token in the page URL — stops the run and leaves the page showing the status.
//! - Its timeline has one row per step with model and tool bars; after a crash of the real binary and a
//!   resume, a gap marker with its length; a failed run shows its error box.
//! - The index filters by terminal status, and at 390 px wide it has no horizontal overflow.
//! - The index marks resumed runs, runs with tool calls of unknown effects and runs whose delivery is
//!   unknown; it searches by id prefix and label; each row links its thread's page, which lists the
//!   thread's runs oldest first with the live one marked.
//! - The live view expands each event's details, reads in dark mode (`prefers-color-scheme: dark`,
//!   emulated), downloads its JSON, and runs the run again.
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

    /// A Chrome DevTools command through chromedriver (e.g. `Emulation.setEmulatedMedia`).
    async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.post("/goog/cdp/execute", json!({"cmd": cmd, "params": params}))
            .await
    }

    /// The page as a `prefers-color-scheme: dark` reader sees it (kept across navigations).
    async fn prefer_dark(&self) {
        self.cdp(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
        )
        .await;
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

    // Four tool-calling steps, numbered 1 to 4, then the answer's turn as a row of its own.
    let steps = session.js("return Array.prototype.map.call(document.querySelectorAll('#timeline .tl-step'), function (r) { return r.dataset.step; });").await;
    assert_eq!(steps, json!(["1", "2", "3", "4"]), "one row per tool step");
    assert_eq!(
        session
            .js("var a = document.querySelectorAll('#timeline .tl-row'); var r = a[a.length - 1]; return r.className + ' ' + r.querySelector('.tl-label').textContent;")
            .await,
        "tl-row tl-answer answer",
        "the answer's row comes last"
    );
    // Every row has a model bar; the four tool steps a tool bar too, each drawn with a real width.
    let drawn = "e.getBoundingClientRect().width > 0";
    assert_eq!(
        session
            .js(&count_where("#timeline .tl-step rect.bar-model", drawn))
            .await,
        4
    );
    assert_eq!(
        session
            .js(&count_where("#timeline .tl-answer rect.bar-model", drawn))
            .await,
        1
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
    assert_eq!(rows, 6, "six tool steps");
    assert_eq!(
        session.js(&count("#timeline .tl-answer")).await,
        1,
        "and the answer's turn"
    );
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
    // The header and the index mark the run resumed, with a title that says what happened.
    assert_eq!(session.js(&count("#run .head-row .mark-resumed")).await, 1);
    session.goto(&second.url("/runs?all=1")).await;
    let title = session
        .js(&format!(
            "var m = document.querySelector('#run-{run_id} .mark-resumed'); return m ? m.title : null;"
        ))
        .await;
    assert_eq!(
        title, "Resumed once after the process holding it ended",
        "the index marks the resumed run"
    );
    // Its event count is a count: the record's events, not the last seq (seqs jump at a resume).
    let listed = session
        .js(&format!(
            "return document.querySelector('#run-{run_id} td[data-label=Events]').textContent;"
        ))
        .await;
    assert_eq!(listed, finished["eventCount"].to_string(), "{finished}");
    assert!(
        events.last().and_then(|e| e["seq"].as_u64()).unwrap() > events.len() as u64,
        "the seqs jumped, so a seq would not pass for the count"
    );
    session.shoot("index-resumed-mark").await;
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
        ("/threads/c1%3Aok-0", "thread-390"),
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

/// A finished record as another process might have left it: resumed once, one tool call settled with
/// unknown effects, and closed from its finishing gate (delivery unknown).
fn marked_record(id: &str, thread_key: &str, label: &str, at: i64) -> storage::record::RunRecord {
    storage::record::validate_record(&json!({
        "id": id, "label": label, "agent": "demo", "model": "scripted", "channelId": "c1", "userId": "u1",
        "threadKey": thread_key, "channelVisibility": "public", "startedAt": at - 5_000, "finishedAt": at,
        "status": "completed", "eventCount": 5, "storedEventCount": 5, "truncated": false,
        "resumed": 1, "effectsUnknown": 1, "replyNote": actors::run::DELIVERY_UNKNOWN, "answer": "done",
        "events": [
            {"type": "input", "seq": 1, "at": at - 5_000, "text": label, "source": "request"},
            {"type": "tool_call", "seq": 2, "at": at - 4_900, "step": 1, "callId": "c1", "tool": "append_file", "summary": "{}"},
            {"type": "resumed", "seq": 1001, "at": at - 2_000, "fromGeneration": "20260101T000000Z-0000000a"},
            {"type": "tool_result", "seq": 1002, "at": at - 1_999, "step": 1, "callId": "c1", "tool": "append_file", "ok": false, "effectsUnknown": true, "summary": "effects unknown"},
            {"type": "answer", "seq": 1003, "at": at, "text": "done"}
        ]
    }))
    .expect("a valid record")
}

/// `document.querySelectorAll(css)`'s `data-id`s, in order.
fn listed_ids(css: &str) -> String {
    format!("return Array.prototype.map.call(document.querySelectorAll({css:?}), function (r) {{ return r.dataset.id; }});")
}

#[actix_web::test]
async fn the_index_marks_runs_searches_them_and_links_each_threads_page() {
    let app = TestApp::spawn().await;
    let first = app.start_run("alpha", "steps=1 ms=0").await;
    let second = app.start_run("beta", "steps=1 ms=0").await;
    for id in [&first, &second] {
        app.final_record(id).await;
    }
    let third = app.start_run("alpha", "steps=1 ms=0").await;
    app.final_record(&third).await;
    let now = storage::Clock::now_ms(&storage::SystemClock);
    let marked = "0190aaaa-0000-7000-8000-00000000beef";
    app.running
        .storage
        .put(
            marked_record(marked, "c1:alpha", "Nightly Billing report", now - 10_000),
            None,
        )
        .await
        .expect("put the marked record");
    // A live run on the thread: the newest of its runs.
    let live = app.start_run("alpha", "steps=40 ms=250").await;
    app.event(&live, "tool_call").await;

    let driver = Driver::start().await;
    let session = driver
        .session(&app.dir.path().join("chromium-profile"))
        .await;
    session.goto(&app.url("/runs?all=1")).await;
    // The marked run carries its three marks, each with a title; the others none.
    let marks = session
        .js(&format!(
            "return Array.prototype.map.call(document.querySelectorAll('#run-{marked} .mark'), function (m) {{ return [m.textContent, m.title]; }});"
        ))
        .await;
    let marks = marks.as_array().unwrap();
    assert_eq!(marks.len(), 3, "{marks:?}");
    assert_eq!(marks[0][0], "↻ resumed");
    assert_eq!(
        marks[0][1],
        "Resumed once after the process holding it ended"
    );
    assert_eq!(marks[1][0], "⚠ effects unknown");
    assert!(marks[1][1]
        .as_str()
        .unwrap()
        .starts_with("Effects unknown: 1 tool call in flight"));
    assert_eq!(marks[2][0], "✉ delivery unknown");
    assert!(marks[2][1]
        .as_str()
        .unwrap()
        .contains("whether its reply reached the channel is not known"));
    assert_eq!(
        session.js(&count("#rows .mark")).await,
        3,
        "only the marked run"
    );
    // The Events column counts events (5), not the last seq (1003).
    assert_eq!(
        session
            .js(&format!(
                "return document.querySelector('#run-{marked} td[data-label=Events]').textContent;"
            ))
            .await,
        "5"
    );
    session.shoot("index-marks").await;

    // Search by label (any case) and by id prefix (any case); a search lists finished runs too.
    session.goto(&app.url("/runs")).await;
    session
        .js("document.querySelector('#search input[name=q]').value = 'billing'; return true;")
        .await;
    session.click("#search button[type=submit]").await;
    assert!(
        session
            .wait_for(
                "return location.search.indexOf('q=billing') >= 0 && !!document.getElementById('rows');",
                Duration::from_secs(10)
            )
            .await
    );
    assert_eq!(session.js(&listed_ids("#rows tr")).await, json!([marked]));
    assert_eq!(
        session
            .js("return document.querySelector('#search input[name=q]').value;")
            .await,
        "billing",
        "the form shows the search back"
    );
    session.shoot("index-search").await;
    let prefix = &second[..second.len() - 4];
    session
        .goto(&app.url(&format!("/runs?q={}", prefix.to_uppercase())))
        .await;
    assert_eq!(session.js(&listed_ids("#rows tr")).await, json!([second]));
    session.goto(&app.url("/runs?q=no-such-run")).await;
    assert_eq!(session.js(&count("#rows tr")).await, 0);
    assert_eq!(
        session
            .js("return document.getElementById('empty').textContent;")
            .await,
        "No runs match “no-such-run”."
    );

    // A row's thread links its page: the thread's runs, oldest first, the live one last and marked.
    session.goto(&app.url("/runs?all=1")).await;
    session
        .click(&format!("#run-{first} td.col-thread a"))
        .await;
    assert!(
        session
            .wait_for(
                "return location.pathname === '/threads/c1%3Aalpha' && !!document.getElementById('thread-runs');",
                Duration::from_secs(10)
            )
            .await,
        "the thread page opened"
    );
    assert_eq!(
        session.js(&listed_ids("#thread-runs li")).await,
        json!([marked, first, third, live]),
        "the thread's runs, oldest start first (the marked one started 15 s ago)"
    );
    assert_eq!(
        session.js(&listed_ids("#thread-runs li.is-live")).await,
        json!([live])
    );
    assert_eq!(
        session
            .js(&format!(
                "return document.querySelector('#run-{live} .status').textContent;"
            ))
            .await,
        "live"
    );
    assert_eq!(
        session
            .js(&format!(
                "return document.querySelector('#run-{first} .what a').getAttribute('href');"
            ))
            .await,
        format!("/runs/{first}")
    );
    assert_eq!(
        session.js(&count("#thread-runs .mark-resumed")).await,
        1,
        "marks show here too"
    );
    assert_eq!(
        session
            .js("return document.body.textContent.indexOf('c1:beta') < 0;")
            .await,
        true,
        "another thread's run is not listed"
    );
    session.shoot("thread-page").await;
    // The live view's header links the same page.
    session.click(&format!("#run-{first} .what a")).await;
    assert!(
        session
            .wait_for(
                "return !!document.getElementById('thread-link');",
                Duration::from_secs(10)
            )
            .await
    );
    assert_eq!(
        session
            .js("return document.getElementById('thread-link').getAttribute('href');")
            .await,
        "/threads/c1%3Aalpha"
    );
    session.close().await;
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

#[actix_web::test]
async fn the_live_view_expands_event_details_reads_in_dark_mode_downloads_json_and_runs_again() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("details", "steps=2 ms=20 <b>x</b>").await;
    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    let driver = Driver::start().await;

    // Light first: the page background as the light palette has it.
    let light = driver.session(&app.dir.path().join("chromium-light")).await;
    light.goto(&app.url(&format!("/runs/{run_id}"))).await;
    let bg = "return getComputedStyle(document.body).backgroundColor;";
    assert_eq!(light.js(bg).await, "rgb(244, 246, 249)");
    light.close().await;

    let session = driver
        .session(&app.dir.path().join("chromium-profile"))
        .await;
    session.prefer_dark().await;
    session.goto(&app.url(&format!("/runs/{run_id}"))).await;
    assert_eq!(
        session
            .js("return matchMedia('(prefers-color-scheme: dark)').matches;")
            .await,
        true
    );
    assert_eq!(session.js(bg).await, "rgb(14, 19, 26)", "the dark page");
    assert_eq!(
        session
            .js("return getComputedStyle(document.querySelector('.card')).backgroundColor;")
            .await,
        "rgb(22, 28, 37)"
    );
    assert_eq!(
        session
            .js("return getComputedStyle(document.body).color;")
            .await,
        "rgb(229, 233, 240)",
        "light text on it"
    );

    // Every event has its details, closed; opening a tool call's shows its input, a result's its output.
    let items = session.js(&count("#events li")).await.as_u64().unwrap();
    assert_eq!(items as usize, record.events.len());
    assert_eq!(
        session.js(&count("#events li > details.ev-details")).await,
        items
    );
    assert_eq!(session.js(&count("#events details[open]")).await, 0);
    session
        .click("#events li.ev-tool_call details.ev-details summary")
        .await;
    let opened = "var d = document.querySelector('#events li.ev-tool_call details'); \
                  var dl = d.querySelector('dl'); \
                  return d.open && dl.getBoundingClientRect().height > 0;";
    assert_eq!(session.js(opened).await, true, "the details opened");
    let field = |kind: &str, label: &str| {
        format!(
            "var d = document.querySelector('#events li.ev-{kind} details'); \
             var dts = d.querySelectorAll('dt'); \
             for (var i = 0; i < dts.length; i++) if (dts[i].textContent === {label:?}) return dts[i].nextElementSibling.textContent; \
             return null;"
        )
    };
    let call = record
        .events
        .iter()
        .find(|e| e["type"] == "tool_call")
        .unwrap();
    assert_eq!(
        session.js(&field("tool_call", "input")).await,
        call["summary"],
        "the input as stored"
    );
    assert_eq!(
        session.js(&field("tool_call", "callId")).await,
        call["callId"]
    );
    let result = record
        .events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .unwrap();
    assert_eq!(
        session.js(&field("tool_result", "output")).await,
        result["summary"]
    );
    // The request's markup is text in its details too.
    assert_eq!(
        session
            .js("return document.querySelector('#events li.ev-input details dd b') === null;")
            .await,
        true
    );
    // Steps numbered by the tool steps; the answer's turn reads so, in the list and the timeline.
    assert_eq!(
        session.js("return Array.prototype.map.call(document.querySelectorAll('#timeline .tl-step'), function (r) { return r.dataset.step; });").await,
        json!(["1", "2"])
    );
    assert_eq!(session.js(&count("#timeline .tl-answer")).await, 1);
    // The scripted agent's answer turn is text only: no `assistant` event, the `answer` closes it; the
    // model turns listed are the tool steps'.
    assert_eq!(
        session
            .js("return Array.prototype.map.call(document.querySelectorAll('#events li.ev-assistant'), function (r) { return r.dataset.step; });")
            .await,
        json!(["1", "2"])
    );
    assert_eq!(
        session
            .js("return document.querySelector('#events li.ev-answer .kind').textContent;")
            .await,
        "answer"
    );
    let usage = session.js(&field("assistant", "usage")).await;
    assert!(
        usage
            .as_str()
            .is_some_and(|u| u.ends_with(" out") && u.contains(" in / ")),
        "a model turn's usage: {usage}"
    );
    session
        .js("document.querySelector('#events li.ev-tool_call').scrollIntoView({block: 'center'}); return true;")
        .await;
    session.shoot("run-details-dark").await;
    session.js("window.scrollTo(0, 0); return true;").await;
    session.shoot("run-dark").await;

    // Download JSON: a link to the run's view with its events, as a file.
    let href = session
        .js("return document.getElementById('download').getAttribute('href');")
        .await;
    assert_eq!(href, format!("/runs/{run_id}/export.json"));
    let res = app
        .client
        .get(app.url(href.as_str().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(
        res.headers()["content-disposition"],
        format!("attachment; filename=\"run-{run_id}.json\"").as_str()
    );
    let exported: Value = res.json().await.unwrap();
    assert_eq!(exported["id"], run_id.as_str());
    assert_eq!(
        exported["events"].as_array().map(Vec::len),
        Some(record.events.len())
    );

    // Run again: the button posts the retry and links the new run, whose parent is this one.
    assert_eq!(
        session
            .js("return document.getElementById('retry').disabled;")
            .await,
        false
    );
    session.click("#retry").await;
    assert!(
        session
            .wait_for(
                "return !!document.getElementById('retry-link');",
                Duration::from_secs(20)
            )
            .await,
        "the retry answered: {}",
        session
            .js("return document.getElementById('control-msg').textContent;")
            .await
    );
    let said = session
        .js("return document.getElementById('control-msg').textContent;")
        .await;
    assert!(
        said.as_str()
            .unwrap()
            .starts_with("202 started \u{2014} open run "),
        "{said}"
    );
    session.shoot("run-retried").await;
    session.click("#retry-link").await;
    let parent = format!(
        "var p = document.getElementById('f-parent'); return !!p && p.textContent === {run_id:?};"
    );
    assert!(
        session.wait_for(&parent, Duration::from_secs(20)).await,
        "the new run names this one as its parent"
    );
    let new_id = session
        .js("return document.getElementById('run').dataset.id;")
        .await;
    assert_ne!(new_id, run_id.as_str());
    app.final_record(new_id.as_str().unwrap()).await;
    session.close().await;
}
