//! The HTTP edge against the real app on 127.0.0.1:0 (SPEC §8.1): cross-site protection and the
//! dev-bypass Host check, no CORS, readiness under a storage outage and a drain, JSON for every error
//! (unknown route, wrong method, oversized body), the `/` redirect, HTML security headers, and seq cursors
//! bounded by 2^63 − 1 (SPEC §3).

mod support;

use std::time::Duration;

use reqwest::header::{HeaderMap, CONTENT_TYPE, HOST, ORIGIN};
use reqwest::Method;
use serde_json::{json, Value};
use support::{add_token, TestApp};

const EVIL: &str = "https://evil.example";

fn message(thread: &str) -> Value {
    json!({"thread": thread, "channel": "c1", "user": "u1", "text": "steps=1 ms=0"})
}

/// A request's answer as a test sees it.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
    text: String,
}

impl Answer {
    fn error(&self) -> Option<&str> {
        self.body["error"].as_str()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn answer(req: reqwest::RequestBuilder) -> Answer {
    let res = req.send().await.expect("send");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.unwrap_or_default();
    Answer {
        status,
        headers,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    }
}

/// What a browser on another site sends when its page posts a "simple" (preflight-free) request.
fn cross_site(req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    req.header(ORIGIN, EVIL)
        .header("sec-fetch-site", "cross-site")
}

/// An error answer is `{error, message}` JSON with `code`.
fn assert_json_error(a: &Answer, status: u16, code: &str) {
    assert_eq!((a.status, a.error()), (status, Some(code)), "{}", a.text);
    assert!(
        a.body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        a.text
    );
    assert!(
        a.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{:?}",
        a.headers
    );
}

#[actix_web::test]
async fn a_cross_site_text_plain_post_is_refused_and_a_same_origin_json_post_is_admitted() {
    let app = TestApp::spawn().await;
    let url = app.url("/api/messages");
    let body = message("t1").to_string();
    // What any web page can make the operator's browser send to loopback without a preflight.
    let a = answer(
        cross_site(app.client.post(&url))
            .header(CONTENT_TYPE, "text/plain")
            .body(body.clone()),
    )
    .await;
    assert_json_error(&a, 403, "forbidden");
    // Each signal alone is enough: the Origin, the Sec-Fetch-Site, an opaque `Origin: null`.
    for (name, value) in [
        ("origin", EVIL),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
        ("origin", "null"),
    ] {
        let a = answer(
            app.client
                .post(&url)
                .header(name, value)
                .json(&message("t1")),
        )
        .await;
        assert_json_error(&a, 403, "forbidden");
    }
    // Without the cross-site headers a text/plain body is still not JSON: 415, and a form too.
    let a = answer(
        app.client
            .post(&url)
            .header(CONTENT_TYPE, "text/plain")
            .body(body.clone()),
    )
    .await;
    assert_json_error(&a, 415, "unsupported_media_type");
    let a = answer(
        app.client
            .post(&url)
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body("a=b"),
    )
    .await;
    assert_json_error(&a, 415, "unsupported_media_type");
    let a = answer(app.client.post(&url).body(body.clone())).await;
    assert_json_error(&a, 415, "unsupported_media_type");
    assert!(
        app.running.storage.list_live().await.unwrap().is_empty(),
        "nothing refused was admitted"
    );

    // The same request from the page's own origin (what the run page's buttons send) is served.
    let a = answer(
        app.client
            .post(&url)
            .header(ORIGIN, &app.base)
            .header("sec-fetch-site", "same-origin")
            .json(&message("t2")),
    )
    .await;
    assert_eq!(
        (a.status, a.body["outcome"].as_str()),
        (202, Some("started")),
        "{}",
        a.text
    );
    let run_id = a.body["runId"].as_str().unwrap().to_owned();
    // `Sec-Fetch-Site: none` (typed in the address bar, a bookmarklet) and a charset parameter pass too.
    let a = answer(
        app.client
            .post(&url)
            .header("sec-fetch-site", "none")
            .header(CONTENT_TYPE, "application/json; charset=utf-8")
            .body(message("t3").to_string()),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text);
    // A cross-site DELETE (kill) is refused like a POST, and the run survives it.
    let a = answer(cross_site(
        app.client.delete(app.url(&format!("/api/runs/{run_id}"))),
    ))
    .await;
    assert_json_error(&a, 403, "forbidden");
    app.final_record(&run_id).await;
}

#[actix_web::test]
async fn a_cross_site_crash_is_refused_and_the_server_stays_up() {
    let app = TestApp::spawn().await;
    // Were it served, this test process would exit 137 about 50 ms later.
    let a = answer(
        cross_site(app.client.post(app.url("/admin/crash")))
            .header(CONTENT_TYPE, "text/plain")
            .body("{}"),
    )
    .await;
    assert_json_error(&a, 403, "forbidden");
    let a = answer(
        app.client
            .post(app.url("/admin/drain"))
            .header(ORIGIN, "null"),
    )
    .await;
    assert_json_error(&a, 403, "forbidden");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let health = answer(app.client.get(app.url("/healthz"))).await;
    assert_eq!(
        (health.status, health.body["pid"].as_u64()),
        (200, Some(u64::from(std::process::id())))
    );
    assert_eq!(
        health.body["draining"], false,
        "the refused drain did not start one"
    );
}

#[actix_web::test]
async fn under_dev_bypass_a_rebinding_host_is_refused_even_for_reads() {
    let app = TestApp::spawn_with(|c| {
        c.server.public_base_url = Some("https://switchboard.example.com".into())
    })
    .await;
    let port = app.running.addr.port();
    // A DNS-rebinding page: its own name now resolves to 127.0.0.1, so its requests are same-origin to
    // the browser and carry its Host.
    for path in ["/api/runs", "/healthz", "/runs", "/api/live"] {
        let a = answer(
            app.client
                .get(app.url(path))
                .header(HOST, format!("evil.example:{port}")),
        )
        .await;
        assert_json_error(&a, 403, "forbidden");
    }
    let a = answer(
        app.client
            .post(app.url("/api/messages"))
            .header(HOST, format!("evil.example:{port}"))
            .header(ORIGIN, format!("http://evil.example:{port}"))
            .header("sec-fetch-site", "same-origin")
            .json(&message("t1")),
    )
    .await;
    assert_json_error(&a, 403, "forbidden");
    // A forwarded host is no way around it.
    let a = answer(
        app.client
            .get(app.url("/api/runs"))
            .header(HOST, "evil.example")
            .header("x-forwarded-host", "localhost"),
    )
    .await;
    assert_json_error(&a, 403, "forbidden");
    // Loopback names (any port) and public_base_url's host are served.
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "localhost".into(),
        "switchboard.example.com".into(),
    ] {
        let a = answer(
            app.client
                .get(app.url("/api/runs"))
                .header(HOST, host.as_str()),
        )
        .await;
        assert_eq!(a.status, 200, "{host}: {}", a.text);
    }
    // public_base_url's origin may post (a page served under the public name behind a proxy).
    let a = answer(
        app.client
            .post(app.url("/api/messages"))
            .header(HOST, "switchboard.example.com")
            .header(ORIGIN, "https://switchboard.example.com")
            .header("sec-fetch-site", "same-origin")
            .json(&message("t2")),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text);
    app.final_record(a.body["runId"].as_str().unwrap()).await;
}

#[actix_web::test]
async fn without_dev_bypass_a_bearer_is_the_credential_and_the_host_is_not_checked() {
    let mut reader = String::new();
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        reader = add_token(c, "reader", &["runs:read"], json!({"kind": "all"}));
    })
    .await;
    let a = answer(
        app.client
            .get(app.url("/api/runs"))
            .bearer_auth(&reader)
            .header(HOST, "switchboard.internal:443"),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    // The cross-site checks still apply to writes, before authentication.
    let a =
        answer(cross_site(app.client.post(app.url("/api/messages"))).json(&message("t1"))).await;
    assert_json_error(&a, 403, "forbidden");
    let a = answer(
        app.client
            .post(app.url("/api/messages"))
            .json(&message("t1")),
    )
    .await;
    assert_json_error(&a, 401, "unauthorized");
}

#[actix_web::test]
async fn no_answer_carries_a_cors_header() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
    let requests = [
        // A CORS preflight from another site.
        app.client
            .request(Method::OPTIONS, app.url("/api/messages"))
            .header(ORIGIN, EVIL)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type"),
        app.client.get(app.url("/api/runs")).header(ORIGIN, EVIL),
        app.client
            .get(app.url(&format!("/api/runs/{id}")))
            .header(ORIGIN, EVIL),
        app.client
            .get(app.url(&format!("/runs/{id}")))
            .header(ORIGIN, EVIL),
        app.client.get(app.url("/healthz")).header(ORIGIN, EVIL),
        cross_site(app.client.post(app.url("/api/messages"))).json(&message("t2")),
        app.client
            .post(app.url("/api/messages"))
            .header(ORIGIN, &app.base)
            .json(&message("t3")),
        app.client.get(app.url("/nope")).header(ORIGIN, EVIL),
    ];
    for req in requests {
        let a = answer(req).await;
        let cors: Vec<_> = a
            .headers
            .keys()
            .filter(|k| k.as_str().starts_with("access-control-"))
            .collect();
        assert!(cors.is_empty(), "{} answered with {cors:?}", a.status);
    }
}

#[actix_web::test]
async fn a_storage_outage_makes_readyz_503_and_healthz_degraded_and_both_recover_without_a_restart()
{
    let app = TestApp::spawn().await;
    let ready = answer(app.client.get(app.url("/readyz"))).await;
    assert_eq!((ready.status, &ready.body), (200, &json!({"ready": true})));
    let health = answer(app.client.get(app.url("/healthz"))).await;
    assert_eq!(
        (
            health.status,
            health.body["storage"].as_str(),
            health.body["ok"].as_bool()
        ),
        (200, Some("ok"), Some(true))
    );
    assert_eq!(health.body["storageKind"], "sqlite");

    app.running.storage.inject_outage(true);
    let ready = answer(app.client.get(app.url("/readyz"))).await;
    assert_json_error(&ready, 503, "unavailable");
    assert_eq!(
        (
            ready.body["ready"].as_bool(),
            ready.body["storage"].as_str()
        ),
        (Some(false), Some("degraded")),
        "{}",
        ready.text
    );
    // Liveness stays 200: the process is alive, its storage is not.
    let health = answer(app.client.get(app.url("/healthz"))).await;
    assert_eq!(
        (health.status, health.body["storage"].as_str()),
        (200, Some("degraded")),
        "{}",
        health.text
    );
    // Writes answer 503 `unavailable`; nothing is admitted.
    let (status, body) = app.post(message("t1")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );

    app.running.storage.inject_outage(false);
    let ready = answer(app.client.get(app.url("/readyz"))).await;
    assert_eq!((ready.status, &ready.body), (200, &json!({"ready": true})));
    let health = answer(app.client.get(app.url("/healthz"))).await;
    assert_eq!(health.body["storage"], "ok");
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
}

#[actix_web::test]
async fn readyz_is_503_while_draining_and_healthz_says_so() {
    let app = TestApp::spawn().await;
    assert_eq!(answer(app.client.get(app.url("/readyz"))).await.status, 200);
    // What a drain sets first (SIGTERM or `POST /admin/drain`).
    app.running
        .draining
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let ready = answer(app.client.get(app.url("/readyz"))).await;
    assert_json_error(&ready, 503, "draining");
    assert_eq!(
        (
            ready.body["ready"].as_bool(),
            ready.body["draining"].as_bool()
        ),
        (Some(false), Some(true))
    );
    assert_eq!(
        ready.body["storage"], "ok",
        "storage is fine: only the drain makes it unready"
    );
    let health = answer(app.client.get(app.url("/healthz"))).await;
    assert_eq!(
        (
            health.status,
            health.body["draining"].as_bool(),
            health.body["storage"].as_str()
        ),
        (200, Some(true), Some("ok"))
    );
}

#[actix_web::test]
async fn unknown_routes_wrong_methods_and_oversized_bodies_answer_json() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
    for (method, path) in [
        (Method::GET, "/nope"),
        (Method::POST, "/nope"),
        (Method::GET, "/api/nope/x"),
        (Method::DELETE, "/runs/x/y"),
    ] {
        let a = answer(app.client.request(method.clone(), app.url(path))).await;
        assert_json_error(&a, 404, "not_found");
    }
    for (method, path, allow) in [
        (Method::GET, "/api/messages".to_owned(), "POST"),
        (Method::POST, "/api/runs".to_owned(), "GET"),
        (Method::PUT, format!("/api/runs/{id}"), "GET, DELETE"),
        (Method::GET, format!("/api/runs/{id}/stop"), "POST"),
        (Method::POST, "/runs/feed".to_owned(), "GET"),
        (Method::DELETE, "/healthz".to_owned(), "GET"),
        (Method::GET, "/admin/crash".to_owned(), "POST"),
        (Method::GET, "/api/plans/p1/import".to_owned(), "POST"),
    ] {
        let a = answer(app.client.request(method.clone(), app.url(&path))).await;
        assert_json_error(&a, 405, "method_not_allowed");
        assert_eq!(a.header("allow"), Some(allow), "{method} {path}");
    }
    // Messages: 2 MiB; everything else: 512 KiB (a plan start carries cards: 2 MiB too).
    let pad = |n: usize| format!("{{\"pad\":\"{}\"}}", "x".repeat(n));
    let over_two_mib = pad(2 << 20);
    let a = answer(
        app.client
            .post(app.url("/api/messages"))
            .header(CONTENT_TYPE, "application/json")
            .body(over_two_mib),
    )
    .await;
    assert_json_error(&a, 413, "payload_too_large");
    let a = answer(
        app.client
            .post(app.url(&format!("/api/runs/{id}/stop")))
            .header(CONTENT_TYPE, "application/json")
            .body(pad(512 << 10)),
    )
    .await;
    assert_json_error(&a, 413, "payload_too_large");
    let a = answer(
        app.client
            .post(app.url("/api/plans/p1/import"))
            .header(CONTENT_TYPE, "application/json")
            .body(pad(512 << 10)),
    )
    .await;
    assert_json_error(&a, 413, "payload_too_large");
    // Under the cap, the same routes read the body (and refuse its content by name).
    let a = answer(
        app.client
            .post(app.url("/api/messages"))
            .header(CONTENT_TYPE, "application/json")
            .body(pad(600 << 10)),
    )
    .await;
    assert_json_error(&a, 400, "bad_request");
}

#[actix_web::test]
async fn the_root_redirects_to_the_runs_index() {
    let app = TestApp::spawn().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let a = answer(client.get(app.url("/"))).await;
    assert_eq!((a.status, a.header("location")), (302, Some("/runs")));
    let followed = answer(app.client.get(app.url("/"))).await;
    assert_eq!(followed.status, 200);
    assert!(followed.text.contains("<h1>Runs</h1>"));
}

#[actix_web::test]
async fn html_answers_carry_a_content_security_policy_nosniff_and_no_referrer() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
    for path in [
        "/runs".to_owned(),
        "/runs?all=1".to_owned(),
        format!("/runs/{id}"),
        "/runs/no-such-run".to_owned(),
    ] {
        let a = answer(app.client.get(app.url(&path))).await;
        assert!(
            a.header("content-type")
                .is_some_and(|c| c.starts_with("text/html")),
            "{path}: {:?}",
            a.headers
        );
        let csp = a
            .header("content-security-policy")
            .unwrap_or_else(|| panic!("{path}: no CSP"));
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
            "{path}: {csp}"
        );
        assert!(
            csp.contains("script-src 'sha256-") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert_eq!(
            a.header("x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(a.header("referrer-policy"), Some("no-referrer"), "{path}");
    }
    // JSON answers are not sniffed either.
    let a = answer(app.client.get(app.url("/api/runs"))).await;
    assert_eq!(a.header("x-content-type-options"), Some("nosniff"));
}

#[actix_web::test]
async fn a_seq_cursor_past_two_to_the_63_minus_one_is_a_400_naming_it() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=0").await;
    app.final_record(&id).await;
    let max = i64::MAX as u64;
    // The largest cursor is valid: nothing follows it.
    let (status, page) = app
        .get_json(&format!("/api/runs/{id}/events?afterSeq={max}"), None)
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"], json!([]));
    for bad in [max + 1, u64::MAX] {
        let (status, body) = app
            .get_json(&format!("/api/runs/{id}/events?afterSeq={bad}"), None)
            .await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("bad_request")),
            "{body}"
        );
        assert!(
            body["message"].as_str().unwrap().contains("afterSeq"),
            "{body}"
        );
        let (status, body) = app
            .get_json(&format!("/api/runs/{id}/stream?afterSeq={bad}"), None)
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("afterSeq"),
            "{body}"
        );
        let a = answer(
            app.client
                .get(app.url(&format!("/api/runs/{id}/stream")))
                .header("last-event-id", bad.to_string()),
        )
        .await;
        assert_json_error(&a, 400, "bad_request");
        assert!(
            a.body["message"]
                .as_str()
                .unwrap()
                .contains("Last-Event-ID"),
            "{}",
            a.text
        );
    }
    let (status, body) = app
        .get_json(
            &format!("/api/runs/{id}/events?afterSeq=18446744073709551616"),
            None,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    // The largest Last-Event-ID is valid: the finished run answers `end` straight away.
    let (status, reader) = app
        .sse(&format!("/api/runs/{id}/stream"), None, Some(max))
        .await;
    assert_eq!(status, 200);
    let (events, end) = reader.unwrap().until_end(Duration::from_secs(10)).await;
    assert!(events.is_empty() && end.is_some(), "{events:?} {end:?}");
}

/// A capability token given twice (`?token=A&token=B`) is refused alike by every route that reads one —
/// 400 naming `token` — instead of the read taking the last and the stop the first.
#[actix_web::test]
async fn a_repeated_capability_token_is_a_400_naming_it_on_every_route() {
    // No dev bypass: only the capability token can let these requests in.
    let mut config_token = None;
    let app = TestApp::spawn_with(|c| {
        c.auth.dev_bypass = false;
        config_token = Some(add_token(
            c,
            "writer",
            &["messages:write"],
            json!({"kind": "all"}),
        ));
    })
    .await;
    let bearer = config_token.expect("a token");
    let (status, body) = app
        .post_as(
            &bearer,
            json!({"thread": "t-dup", "channel": "c1", "user": "u1", "text": "steps=3 ms=2000"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["runId"].as_str().expect("runId").to_owned();
    let token = body["liveUrl"]
        .as_str()
        .and_then(|u| u.split_once("?token="))
        .map(|(_, t)| t.to_owned())
        .expect("a token");
    let (good, bad) = (format!("token={token}"), "token=bogus".to_owned());
    for query in [format!("{good}&{bad}"), format!("{bad}&{good}")] {
        for (method, path) in [
            (Method::GET, format!("/api/runs/{id}?{query}")),
            (Method::GET, format!("/api/runs/{id}/events?{query}")),
            (Method::POST, format!("/api/runs/{id}/stop?{query}")),
        ] {
            let a = answer(app.client.request(method.clone(), app.url(&path))).await;
            assert_json_error(&a, 400, "bad_request");
            assert!(
                a.body["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("token")),
                "{method} {path}: {}",
                a.text
            );
        }
        // The page answers its errors as a page.
        let a = answer(app.client.get(app.url(&format!("/runs/{id}?{query}")))).await;
        assert_eq!(a.status, 400, "{}", a.text);
        assert!(
            a.text.contains("token: is given more than once"),
            "{}",
            a.text
        );
    }
    // Once, the token reads and stops its run.
    let a = answer(app.client.get(app.url(&format!("/api/runs/{id}?{good}")))).await;
    assert_eq!(a.status, 200, "{}", a.text);
    let a = answer(
        app.client
            .post(app.url(&format!("/api/runs/{id}/stop?{good}"))),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text);
}
