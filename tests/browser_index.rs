//! The index and thread pages in a real browser (headless Chromium over WebDriver, `support::browser`):
//! - the index filters by terminal status, and at 390 px wide it has no horizontal overflow;
//! - it marks resumed runs, runs with tool calls of unknown effects and runs whose delivery is unknown;
//!   it searches by id prefix and label; each row links its thread's page, which lists the thread's runs
//!   oldest first with the live one marked.
//!
//! Every test saves screenshots under `target/screenshots/`. CI installs `chromium` and `chromium-driver`
//! (`.ci/run`); a missing browser FAILS this test.

mod support;

use std::time::Duration;

use serde_json::json;
use support::browser::*;
use support::TestApp;

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
