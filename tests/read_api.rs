//! End to end: the JSON read API (SPEC §7, §8.1) and the HTML pages on the real app — the merge of live
//! and finished runs, paging, errors, auth and visibility.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use storage::record::{validate_record, RunStatus};
use support::{add_token, TestApp};

fn ids(body: &Value) -> Vec<String> {
    body["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .collect()
}

async fn stop_hard(app: &TestApp, run_id: &str) {
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{run_id}/stop")))
        .json(&json!({"mode": "hard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
}

#[actix_web::test]
async fn live_and_finished_runs_merge_into_one_row_each() {
    let app = TestApp::spawn().await;
    let done = app.start_run("t-done", "steps=2 ms=5").await;
    app.final_record(&done).await;
    let live = app.start_run("t-live", "steps=5 ms=3000").await;
    app.event(&live, "tool_call").await;

    let (status, all) = app.get_json("/api/runs", None).await;
    assert_eq!(status, 200, "{all}");
    // The live run first, once (its tombstone is suppressed), then the finished one.
    assert_eq!(ids(&all), [live.clone(), done.clone()]);
    let (l, d) = (&all["runs"][0], &all["runs"][1]);
    assert_eq!(
        (
            l["finished"].as_bool(),
            l.get("status"),
            l.get("provisional")
        ),
        (Some(false), None, None)
    );
    assert_eq!(
        (
            d["finished"].as_bool(),
            d["status"].as_str(),
            d["persisted"].as_bool()
        ),
        (Some(true), Some("completed"), Some(true))
    );
    assert_eq!(d["channelVisibility"], "machine");
    assert!(all.get("nextBefore").is_none() && all.get("storeUnavailable").is_none());

    assert_eq!(
        ids(&app.get_json("/api/runs?status=active", None).await.1),
        [live.as_str()]
    );
    assert_eq!(
        ids(&app.get_json("/api/runs?status=finished", None).await.1),
        [done.as_str()]
    );
    assert_eq!(
        ids(&app.get_json("/api/runs?threadKey=c1:t-done", None).await.1),
        [done.as_str()]
    );

    // A point read: no events unless asked, never a token.
    let (status, v) = app.get_json(&format!("/api/runs/{live}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (v["finished"].as_bool(), v.get("events")),
        (Some(false), None)
    );
    let text = v.to_string();
    assert!(!text.contains("token"), "{text}");
    let (_, v) = app
        .get_json(&format!("/api/runs/{live}?include=events"), None)
        .await;
    let events = v["events"].as_array().unwrap();
    assert_eq!(events[0]["type"], "run_meta");

    // Events: strictly after the cursor, with the cursor to continue.
    let (status, page) = app
        .get_json(&format!("/api/runs/{done}/events?afterSeq=2&limit=3"), None)
        .await;
    assert_eq!(status, 200, "{page}");
    let seqs: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        (seqs, page["nextAfterSeq"].as_u64()),
        (vec![3, 4, 5], Some(5))
    );
    let (_, rest) = app
        .get_json(&format!("/api/runs/{done}/events?afterSeq=5"), None)
        .await;
    assert!(rest.get("nextAfterSeq").is_none());
    assert_eq!(rest["events"][0]["seq"], 6);

    // Friction: the diagnosis of the finished run.
    let (status, fr) = app
        .get_json(&format!("/api/runs/{done}/friction"), None)
        .await;
    assert_eq!(status, 200, "{fr}");
    assert_eq!(fr["diagnosis"]["byCategory"]["tool"]["count"], 2);

    // The ledger rows, without prompt, tools or state.
    let (status, lv) = app.get_json("/api/live", None).await;
    assert_eq!(status, 200);
    let rows = lv["runs"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0]["runId"].as_str(), rows[0]["ownerGen"].as_str()),
        (Some(live.as_str()), Some(app.running.generation.as_str()))
    );
    for key in [
        "systemText",
        "system_text",
        "tools",
        "state",
        "toolsJson",
        "stateJson",
    ] {
        assert!(
            rows[0].get(key).is_none() && rows[0]["meta"].get(key).is_none(),
            "{key} leaked: {lv}"
        );
    }
    assert!(rows[0]["meta"].get("request").is_none());
    stop_hard(&app, &live).await;
    assert_eq!(
        app.final_record(&live).await.head.status,
        RunStatus::StoppedHard
    );
}

#[actix_web::test]
async fn next_before_pages_through_history_newest_first_without_repeats() {
    let app = TestApp::spawn().await;
    let mut started = Vec::new();
    for i in 0..5 {
        let id = app.start_run(&format!("p{i}"), "steps=1 ms=0").await;
        app.final_record(&id).await;
        started.push(id);
    }
    let mut seen = Vec::new();
    let mut path = "/api/runs?status=finished&limit=2".to_owned();
    for _ in 0..10 {
        let (status, page) = app.get_json(&path, None).await;
        assert_eq!(status, 200, "{page}");
        assert!(page["runs"].as_array().unwrap().len() <= 2);
        seen.extend(ids(&page));
        match page.get("nextBefore") {
            Some(nb) => {
                path = format!(
                    "/api/runs?status=finished&limit=2&before={}&beforeId={}",
                    nb["finishedAt"].as_i64().unwrap(),
                    nb["id"].as_str().unwrap()
                )
            }
            None => break,
        }
    }
    started.reverse();
    assert_eq!(seen, started);
}

#[actix_web::test]
async fn bad_requests_name_the_field_and_errors_have_one_shape() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
    for (path, field) in [
        ("/api/runs?limit=abc".to_owned(), "limit"),
        ("/api/runs?limit=0".to_owned(), "limit"),
        ("/api/runs?status=bogus".to_owned(), "status"),
        ("/api/runs?before=yesterday".to_owned(), "before"),
        ("/api/runs?beforeId=a.b".to_owned(), "beforeId"),
        ("/api/runs?sinceMs=1.5".to_owned(), "sinceMs"),
        (format!("/api/runs/{id}?include=everything"), "include"),
        (format!("/api/runs/{id}/events?afterSeq=-1"), "afterSeq"),
        // As the document states them: a limit is a 64-bit integer, a parent a run id, a filter 1 to
        // 256 characters.
        ("/api/runs?limit=9223372036854775808".to_owned(), "limit"),
        ("/api/runs?parentRunId=a.b".to_owned(), "parentRunId"),
        (format!("/api/runs?agent={}", "é".repeat(257)), "agent"),
    ] {
        let (status, body) = app.get_json(&path, None).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["error"], "bad_request", "{path}");
        assert!(
            body["message"].as_str().unwrap().starts_with(field),
            "{path}: {body}"
        );
    }
    // `beforeId` alone: the page after that run; a run nobody can see is a 404 naming the parameter.
    let (status, body) = app.get_json("/api/runs?beforeId=x", None).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("beforeId"),
        "{body}"
    );
    let (status, body) = app
        .get_json(&format!("/api/runs?beforeId={id}"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["id"] != id.as_str()),
        "the page after a run does not hold it: {body}"
    );
    // What the document allows is served: the largest limit (clamped), a filter of 256 two-byte
    // characters.
    for path in [
        "/api/runs?limit=9223372036854775807".to_owned(),
        format!("/api/runs?agent={}", "é".repeat(256)),
    ] {
        let (status, body) = app.get_json(&path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    // Unknown and malformed ids: 404 with the same shape.
    for path in [
        "/api/runs/no-such-run",
        "/api/runs/bad.id",
        "/api/runs/no-such-run/events",
        "/api/runs/bad.id/stream",
    ] {
        let (status, body) = app.get_json(path, None).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (404, Some("not_found")),
            "{path}: {body}"
        );
    }
    // A stop of a finished run: 409.
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{id}/stop")))
        .json(&json!({"mode": "soft"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(res.json::<Value>().await.unwrap()["error"], "conflict");
    // A null mode is the default (soft), as an absent one: the run has finished, so 409 again, not 400.
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{id}/stop")))
        .json(&json!({"mode": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 409);
    // A body that is JSON but not an object (nor null) is no stop: 400 naming it, before anything else.
    for body in [json!(false), json!(1), json!("soft"), json!([])] {
        let res = app
            .client
            .post(app.url(&format!("/api/runs/{id}/stop")))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 400, "{body}");
        let answer = res.json::<Value>().await.unwrap();
        assert!(
            answer["message"].as_str().unwrap().starts_with("body"),
            "{answer}"
        );
    }
    // Oversized bodies: 413.
    let (status, body) = app.post(json!({"thread": "t2", "channel": "c1", "user": "u1", "text": "x".repeat((1 << 20) + 1)})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("payload_too_large")),
        "{body}"
    );
    let big = format!(
        "{{\"mode\":\"soft\",\"pad\":\"{}\"}}",
        "x".repeat(600 << 10)
    );
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{id}/stop")))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 413);
}

/// The visibility configuration: `c1` sees channel c1 only; `writer` posts and stops everything.
struct Tokens {
    writer: String,
    c1: String,
    no_scope: String,
}

async fn app_with_tokens() -> (TestApp, Tokens) {
    let mut tokens = None;
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        tokens = Some(Tokens {
            writer: add_token(
                c,
                "writer",
                &["messages:write", "runs:write", "runs:read"],
                json!({"kind": "all"}),
            ),
            c1: add_token(
                c,
                "c1-reader",
                &["runs:read"],
                json!({"kind": "channels-in", "ids": ["c1"]}),
            ),
            no_scope: add_token(c, "poster", &["messages:write"], json!({"kind": "all"})),
        });
    })
    .await;
    (app, tokens.unwrap())
}

async fn start_as(
    app: &TestApp,
    token: &str,
    thread: &str,
    channel: &str,
    text: &str,
) -> (String, String) {
    let (status, body) = app
        .post_as(
            token,
            json!({"thread": thread, "channel": channel, "user": "u1", "text": text}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let live_url = body["liveUrl"].as_str().unwrap();
    let cap = live_url.split("token=").nth(1).unwrap().to_owned();
    (body["runId"].as_str().unwrap().to_owned(), cap)
}

#[actix_web::test]
async fn a_token_limited_to_c1_never_sees_a_c2_run_anywhere() {
    let (app, t) = app_with_tokens().await;
    let (c1_done, _) = start_as(&app, &t.writer, "a", "c1", "steps=1 ms=0").await;
    let (c2_done, _) = start_as(&app, &t.writer, "b", "c2", "steps=1 ms=0").await;
    app.final_record(&c1_done).await;
    app.final_record(&c2_done).await;
    let (c1_live, _) = start_as(&app, &t.writer, "c", "c1", "steps=5 ms=3000").await;
    let (c2_live, c2_cap) = start_as(
        &app,
        &t.writer,
        "d",
        "c2",
        "steps=5 ms=3000 <b>secret-c2</b>",
    )
    .await;
    app.event(&c2_live, "tool_call").await;
    let c1 = Some(t.c1.as_str());

    // Lists, every status.
    for status in ["all", "active", "finished"] {
        let (code, body) = app
            .get_json(&format!("/api/runs?status={status}"), c1)
            .await;
        assert_eq!(code, 200);
        let listed = ids(&body);
        assert!(
            !listed.contains(&c2_done) && !listed.contains(&c2_live),
            "{status}: {body}"
        );
        assert!(
            body.to_string().contains("c1") && !body.to_string().contains("\"c2\""),
            "{body}"
        );
    }
    assert_eq!(
        ids(&app.get_json("/api/runs", c1).await.1),
        [c1_live.clone(), c1_done.clone()]
    );
    // Point reads, events, friction, streams: 404 as for an unknown run.
    for id in [&c2_done, &c2_live] {
        for path in [
            format!("/api/runs/{id}"),
            format!("/api/runs/{id}?include=events"),
            format!("/api/runs/{id}/events"),
            format!("/api/runs/{id}/friction"),
        ] {
            let (code, body) = app.get_json(&path, c1).await;
            assert_eq!(
                (code, body["error"].as_str()),
                (404, Some("not_found")),
                "{path}"
            );
        }
        assert_eq!(
            app.sse(&format!("/api/runs/{id}/stream"), c1, None).await.0,
            404
        );
        let (code, page) = app.get_text(&format!("/runs/{id}"), c1).await;
        assert_eq!(code, 404);
        assert!(!page.contains("secret-c2"));
    }
    // The ledger listing and the HTML index.
    let (_, live) = app.get_json("/api/live", c1).await;
    let live_ids: Vec<&str> = live["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["runId"].as_str().unwrap())
        .collect();
    assert_eq!(live_ids, [c1_live.as_str()]);
    for path in ["/runs", "/runs?all=1"] {
        let (code, page) = app.get_text(path, c1).await;
        assert_eq!(code, 200);
        assert!(
            page.contains(&c1_live) && !page.contains(&c2_live) && !page.contains(&c2_done),
            "{path}"
        );
    }
    // The index feed: c1 rows only.
    let (code, feed) = app.sse("/runs/feed", c1, None).await;
    assert_eq!(code, 200);
    let mut feed = feed.unwrap();
    let mut upserts = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(
            Duration::from_millis(300),
            feed.next(Duration::from_secs(5)),
        )
        .await
        {
            Ok(Some(e)) => upserts.push(e),
            Ok(None) => break,
            Err(_) => {}
        }
    }
    assert!(
        upserts.iter().any(|e| e.data["id"] == c1_live.as_str()),
        "{upserts:?}"
    );
    assert!(
        upserts.iter().all(|e| e.data["channelId"] == "c1"),
        "{upserts:?}"
    );

    // The writer (visibility all) sees both; the capability token of c2_live reads that one run only.
    assert_eq!(
        ids(&app
            .get_json("/api/runs?status=active", Some(&t.writer))
            .await
            .1)
        .len(),
        2
    );
    let (code, v) = app
        .get_json(&format!("/api/runs/{c2_live}?token={c2_cap}"), None)
        .await;
    assert_eq!((code, v["id"].as_str()), (200, Some(c2_live.as_str())));
    assert_eq!(
        app.get_json(&format!("/api/runs/{c1_live}?token={c2_cap}"), None)
            .await
            .0,
        401
    );
    let (code, page) = app
        .get_text(&format!("/runs/{c2_live}?token={c2_cap}"), None)
        .await;
    assert_eq!(code, 200);
    assert!(page.contains("&lt;b&gt;secret-c2&lt;/b&gt;") && !page.contains("<b>secret-c2"));
    let (code, stream) = app
        .sse(
            &format!("/api/runs/{c2_live}/stream?token={c2_cap}"),
            None,
            None,
        )
        .await;
    assert_eq!(code, 200);
    let first = stream.unwrap().next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        (first.event.as_str(), first.id.as_str()),
        ("run_event", "1")
    );
    // A capability token also stops its run (the page's buttons use it).
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{c2_live}/stop?token={c2_cap}")))
        .json(&json!({"mode": "hard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);

    // 401 without credentials, 403 without the scope.
    let (code, body) = app.get_json("/api/runs", None).await;
    assert_eq!((code, body["error"].as_str()), (401, Some("unauthorized")));
    let (code, body) = app.get_json("/api/runs", Some(&t.no_scope)).await;
    assert_eq!((code, body["error"].as_str()), (403, Some("forbidden")));
    assert_eq!(app.get_json("/api/runs", Some("not-a-token")).await.0, 401);
    assert_eq!(app.sse("/runs/feed", None, None).await.0, 401);
    assert_eq!(app.get_text("/runs", Some(&t.no_scope)).await.0, 403);
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{c1_live}/stop")))
        .bearer_auth(&t.writer)
        .json(&json!({"mode": "hard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    app.final_record(&c1_live).await;
    app.final_record(&c2_live).await;
}

#[actix_web::test]
async fn html_pages_escape_run_strings_and_show_history_with_an_older_runs_link() {
    let app = TestApp::spawn().await;
    let hostile = app
        .start_run("t-x", "<script>alert('x')</script> steps=1 ms=0")
        .await;
    app.final_record(&hostile).await;
    let mut newer = Vec::new();
    for i in 0..2 {
        let id = app.start_run(&format!("t{i}"), "steps=1 ms=0").await;
        app.final_record(&id).await;
        newer.push(id);
    }
    // A provisional record (a tombstone whose run never finished anywhere).
    let tomb = validate_record(&json!({
        "id": "tomb-1", "label": "crashed", "agent": "demo", "channelId": "c1", "userId": "u1", "threadKey": "c1:z",
        "channelVisibility": "machine", "startedAt": 1_000, "finishedAt": 1_000, "status": "interrupted",
        "eventCount": 0, "storedEventCount": 0, "truncated": false, "events": [], "diagnosis": {"byCategory": {}},
        "provisional": true
    }))
    .unwrap();
    let mut tomb = tomb;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    (tomb.head.started_at, tomb.head.finished_at) = (now - 5_000, now - 5_000);
    app.running.storage.put(tomb, None).await.unwrap();

    let (code, page) = app.get_text(&format!("/runs/{hostile}"), None).await;
    assert_eq!(code, 200);
    // maud escapes `&`, `<`, `>` and `"` (every attribute is double-quoted, so `'` needs none).
    assert!(
        page.contains("&lt;script&gt;alert('x')&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<script>alert"),
        "a run's script must render as text"
    );
    assert!(
        page.contains("id=\"status\" class=\"status st-ok\">completed<"),
        "status header"
    );
    assert!(
        page.contains("class=\"ev ev-answer\""),
        "the answer is in the history seed"
    );
    assert!(page.contains("stop-hard") && page.contains("kill"));

    let (code, index) = app.get_text("/runs?all=1&limit=2", None).await;
    assert_eq!(code, 200);
    assert!(!index.contains("<script>alert"));
    let older = index
        .split("id=\"older\" href=\"")
        .nth(1)
        .expect("an Older runs link")
        .split('"')
        .next()
        .unwrap()
        .replace("&amp;", "&");
    assert!(older.starts_with("/runs?all=1&before="), "{older}");
    // Newest first (`finishedAt desc, id desc`): the two later runs fill the first page, the hostile run
    // and the older tombstone are on the next one — each on exactly one page.
    for id in &newer {
        assert!(index.contains(id.as_str()), "{id} on the first page");
    }
    assert!(
        !index.contains(&hostile) && !index.contains("tomb-1"),
        "older rows are not on the first page"
    );
    let (code, page2) = app.get_text(&format!("{older}&limit=10"), None).await;
    assert_eq!(code, 200);
    assert!(
        page2.contains(&hostile) && page2.contains("tomb-1"),
        "the older page holds the older rows"
    );
    assert!(
        newer.iter().all(|id| !page2.contains(id.as_str())),
        "no row of the first page again"
    );
    let (_, full) = app.get_text("/runs?all=1", None).await;
    assert!(
        full.contains("unfinished — no finish recorded"),
        "the tombstone renders as its own state"
    );
    assert!(full.contains("Duration") && full.contains("Finished"));
    let (_, live_index) = app.get_text("/runs", None).await;
    assert!(
        live_index.contains("No live runs") && live_index.contains("new EventSource('/runs/feed')")
    );
}

#[actix_web::test]
async fn list_filters_take_a_terminal_status_an_agent_and_a_channel_in_json_and_in_html() {
    let app = TestApp::spawn().await;
    let ok = app.start_run("f-ok", "steps=1 ms=0").await;
    let failed = app.start_run("f-bad", "steps=2 ms=0 fail_at=2").await;
    let (status, body) = app
        .post(json!({"thread": "f-c2", "channel": "c2", "user": "u1", "text": "steps=1 ms=0"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let other = body["runId"].as_str().unwrap().to_owned();
    for id in [&ok, &failed, &other] {
        app.final_record(id).await;
    }
    let live = app.start_run("f-live", "steps=5 ms=3000").await;
    app.event(&live, "tool_call").await;

    // A terminal status lists finished runs with that status only, with a failed run's error.
    let (code, body) = app.get_json("/api/runs?status=failed", None).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(ids(&body), std::slice::from_ref(&failed));
    assert_eq!(body["runs"][0]["status"], "failed");
    assert!(
        body["runs"][0]["error"]
            .as_str()
            .unwrap()
            .contains("scripted failure at model call 2"),
        "{body}"
    );
    let mut completed = ids(&app.get_json("/api/runs?status=completed", None).await.1);
    completed.sort();
    let mut want = vec![ok.clone(), other.clone()];
    want.sort();
    assert_eq!(completed, want);
    for status in ["stopped_soft", "stopped_hard", "interrupted"] {
        assert_eq!(
            ids(&app
                .get_json(&format!("/api/runs?status={status}"), None)
                .await
                .1),
            Vec::<String>::new(),
            "{status}"
        );
    }
    // With the agent and channel filters, and still `active|finished|all`.
    assert_eq!(
        ids(&app
            .get_json("/api/runs?status=completed&channel=c2", None)
            .await
            .1),
        std::slice::from_ref(&other)
    );
    assert_eq!(
        ids(&app
            .get_json("/api/runs?status=failed&channel=c2", None)
            .await
            .1),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&app
            .get_json("/api/runs?status=failed&agent=demo", None)
            .await
            .1),
        std::slice::from_ref(&failed)
    );
    assert_eq!(
        ids(&app.get_json("/api/runs?agent=nope", None).await.1),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&app.get_json("/api/runs?status=active", None).await.1),
        std::slice::from_ref(&live)
    );
    assert_eq!(
        ids(&app
            .get_json("/api/runs?status=all&channel=c2", None)
            .await
            .1),
        std::slice::from_ref(&other)
    );
    // Paging a terminal status: one run a page, each once.
    let (_, first) = app
        .get_json("/api/runs?status=completed&limit=1", None)
        .await;
    let nb = &first["nextBefore"];
    let next = format!(
        "/api/runs?status=completed&limit=1&before={}&beforeId={}",
        nb["finishedAt"],
        nb["id"].as_str().unwrap()
    );
    let (_, second) = app.get_json(&next, None).await;
    let mut paged = [ids(&first), ids(&second)].concat();
    paged.sort();
    assert_eq!(paged, want);
    // An unknown status is a 400 naming `status`, in JSON and in HTML.
    let (code, body) = app.get_json("/api/runs?status=exploded", None).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().starts_with("status"),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("failed"),
        "the message lists the terminal statuses: {body}"
    );
    let (code, page) = app.get_text("/runs?status=exploded", None).await;
    assert_eq!(code, 400);
    assert!(
        page.contains(
            "status: must be one of all, active, awaiting_approval, finished, completed, failed"
        ),
        "{page}"
    );

    // The HTML index applies the same filters (an empty form field means "any").
    let (code, page) = app
        .get_text("/runs?status=failed&agent=&channel=", None)
        .await;
    assert_eq!(code, 200);
    assert!(
        page.contains(&failed)
            && !page.contains(&ok)
            && !page.contains(&other)
            && !page.contains(&live),
        "failed only"
    );
    assert!(
        page.contains("scripted failure at model call 2"),
        "the failed run's error is shown"
    );
    assert!(
        page.contains("<option value=\"failed\" selected>"),
        "the form shows the filter"
    );
    let (_, page) = app
        .get_text("/runs?status=completed&channel=c2", None)
        .await;
    assert!(page.contains(&other) && !page.contains(&ok) && !page.contains(&failed));
    // The chart counts the last hour's runs by status, whatever the page's status filter.
    assert!(
        page.contains("id=\"chart\" data-total=\"1\""),
        "channel c2 has one run in the last hour"
    );
    let (_, page) = app.get_text("/runs?all=1", None).await;
    assert!(
        page.contains("id=\"chart\" data-total=\"4\""),
        "four runs in the last hour"
    );
    stop_hard(&app, &live).await;
    app.final_record(&live).await;
}
