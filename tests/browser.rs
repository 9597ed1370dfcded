//! End to end in a real browser: headless Debian Chromium driven over WebDriver (`support::browser`).
//! - The run page shows step events live without a reload, and its Stop (hard) button — authorized only
//!   by the capability token in the page URL — stops the run and leaves the page showing the status.
//! - Its timeline has one row per step with model and tool bars; after a crash of the real binary and a
//!   resume, a gap marker with its length; a failed run shows its error box.
//! - The live view expands each event's details, reads in dark mode (`prefers-color-scheme: dark`,
//!   emulated), downloads its JSON, and runs the run again.
//! - A run parked for approval shows a panel per call; its Approve and Deny buttons — authorized by the
//!   capability token alone — decide the calls, the panels go as the decisions arrive live, and the run
//!   finishes.
//!
//! The index and thread pages are in tests/browser_index.rs. Every test saves screenshots under
//! `target/screenshots/` (one name per test), to look at. CI installs `chromium` and `chromium-driver`
//! (`.ci/run`); a missing browser FAILS this test.

mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use storage::record::RunStatus;
use support::browser::*;
use support::{add_token, TestApp};
use web::routes::html::fmt_duration;

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

#[actix_web::test]
async fn the_run_pages_approve_and_deny_buttons_decide_the_parked_calls_and_the_run_finishes() {
    // Dev bypass off: the page's capability token is all that authorizes a decision, as for Stop.
    let mut writer = String::new();
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        writer = add_token(c, "writer", &["messages:write"], json!({"kind": "all"}));
        c.agents.entry("demo".into()).or_default().approve = vec!["append_*".into()];
    })
    .await;
    let driver = Driver::start().await;
    let session = driver
        .session(&app.dir.path().join("chromium-profile"))
        .await;
    let (status, body) = app
        .post_as(
            &writer,
            json!({"thread": "approvals", "channel": "c1", "user": "u1",
            "text": "tool=append_file steps=2 ms=10 answer=decided"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let live_url = body["liveUrl"].as_str().unwrap();
    let token = live_url.split("token=").nth(1).unwrap().to_owned();
    app.event(&run_id, "approval_requested").await;
    session
        .goto(&app.url(&format!("/runs/{run_id}?token={token}")))
        .await;
    session.js("window.__samePage = 'yes'; return true;").await;

    // The parked call's panel: its tool and input, a note, Approve and Deny.
    let panel = |call: &str| format!(".approval[data-call-id=\"{call}\"]");
    let shown = |call: &str| {
        format!(
            "var p = document.querySelector({:?}); \
             return !!p && !document.getElementById('approvals').hidden && p.getBoundingClientRect().height > 0;",
            panel(call)
        )
    };
    assert!(
        session
            .wait_for(&shown("call-1"), Duration::from_secs(20))
            .await,
        "no panel for the parked call"
    );
    assert_eq!(
        session
            .js(&format!(
                "return document.querySelector({:?}).textContent;",
                format!("{} .approval-tool", panel("call-1"))
            ))
            .await,
        "append_file"
    );
    let input = session
        .js(&format!(
            "return document.querySelector({:?}).textContent;",
            format!("{} .approval-input", panel("call-1"))
        ))
        .await;
    assert!(
        input.as_str().is_some_and(|t| t.starts_with('{')),
        "{input}"
    );
    session.shoot("approval-parked").await;

    // Approve with a note: the answer is shown, and the panel goes once the decision's event arrives.
    session
        .js(&format!(
            "document.querySelector({:?}).value = 'looks <b>fine</b>'; return true;",
            format!("{} .approval-note", panel("call-1"))
        ))
        .await;
    session
        .click(&format!("{} .approval-approve", panel("call-1")))
        .await;
    let gone = format!("return !document.querySelector({:?});", panel("call-1"));
    assert!(
        session.wait_for(&gone, Duration::from_secs(20)).await,
        "the decided call's panel stayed"
    );
    assert_eq!(
        session
            .js("return document.getElementById('control-msg').textContent;")
            .await,
        "call call-1 approved by capability"
    );
    // The next step parks on its own call, whose panel arrives live; Deny it.
    assert!(
        session
            .wait_for(&shown("call-2"), Duration::from_secs(20))
            .await,
        "no live panel for the next call"
    );
    session
        .click(&format!("{} .approval-deny", panel("call-2")))
        .await;
    let completed = "return document.getElementById('status').textContent === 'completed';";
    assert!(
        session.wait_for(completed, Duration::from_secs(20)).await,
        "the run did not finish"
    );
    assert_eq!(
        session
            .js("return document.getElementById('approvals').hidden;")
            .await,
        true
    );
    assert_eq!(session.js(&count(".approval")).await, 0);
    assert_eq!(
        session.js("return window.__samePage || null;").await,
        "yes",
        "the page reloaded"
    );
    // The list says what was decided, by whom.
    let decided = session
        .js("return Array.prototype.map.call(document.querySelectorAll('#events li.ev-approval_decided'), \
             function (li) { return li.querySelector('.kind').textContent + ' | ' + li.querySelector('.body').textContent; });")
        .await;
    assert_eq!(
        decided,
        json!([
            "step 1 · approved append_file | by capability: looks <b>fine</b>",
            "step 2 · denied append_file | by capability"
        ])
    );
    session.shoot("approval-decided").await;

    let record = app.final_record(&run_id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    let decisions: Vec<_> = record
        .events
        .iter()
        .filter(|e| e["type"] == "approval_decided")
        .map(|e| (e["decision"].clone(), e["who"].clone(), e["note"].clone()))
        .collect();
    assert_eq!(
        decisions,
        [
            (
                json!("approve"),
                json!("capability"),
                json!("looks <b>fine</b>")
            ),
            (json!("deny"), json!("capability"), Value::Null)
        ]
    );
    session.close().await;
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
