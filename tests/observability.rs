//! `/metrics` (prometheus-client, histograms, build info) and `/api/openapi.json` against the real app.

mod support;

use std::collections::BTreeMap;

use support::TestApp;

/// Each sample line of a Prometheus text page: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("not a sample line: {l:?}"));
            (
                key.to_owned(),
                value
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("not a number in {l:?}")),
            )
        })
        .collect()
}

fn sample(all: &BTreeMap<String, f64>, key: &str) -> f64 {
    *all.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {:#?}", all.keys().collect::<Vec<_>>()))
}

/// `promtool check metrics` on the page, when promtool is installed (Debian package `prometheus`).
fn promtool_lint(text: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("promtool not installed: lint skipped");
        return;
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool check metrics:\n{report}\n---\n{text}"
    );
}

#[actix_web::test]
async fn metrics_after_a_run_have_histograms_in_seconds_and_build_info() {
    let app = TestApp::spawn().await;
    let run_id = app.start_run("obs", "steps=2 ms=0").await;
    app.final_record(&run_id).await;
    let (status, _) = app.get_json(&format!("/api/runs/{run_id}"), None).await;
    assert_eq!(status, 200);
    let (status, _) = app.get_json("/no/such/route", None).await;
    assert_eq!(status, 404);

    let res = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let content_type = res.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = res.text().await.unwrap();
    let all = samples(&text);

    assert_eq!(
        sample(
            &all,
            &format!(
                "switchboard_build_info{{version=\"{}\"}}",
                switchboard::VERSION
            )
        ),
        1.0
    );
    assert!(
        text.contains("# TYPE switchboard_build_info gauge\n"),
        "{text}"
    );
    // The counters keep their names and meaning.
    assert_eq!(sample(&all, "switchboard_runs_started_total"), 1.0);
    assert_eq!(
        sample(
            &all,
            "switchboard_runs_finished_total{status=\"completed\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&all, "switchboard_steps_total"),
        4.0,
        "seed, two tool steps, the answer step"
    );
    assert_eq!(sample(&all, "switchboard_live_runs"), 0.0);
    // The seed's step record commits with the promotion (one write), the other three alone.
    assert_eq!(
        sample(&all, "switchboard_ledger_writes_total{op=\"promotion\"}"),
        1.0
    );
    assert_eq!(
        sample(&all, "switchboard_ledger_writes_total{op=\"step_record\"}"),
        3.0
    );

    // Histograms: one run, four durable step commits, three model calls, two tool calls.
    for name in [
        "run_duration",
        "step_commit",
        "model_call",
        "tool_call",
        "http_request_duration",
    ] {
        assert!(
            text.contains(&format!("# TYPE switchboard_{name}_seconds histogram\n")),
            "{name}: {text}"
        );
    }
    assert_eq!(
        sample(
            &all,
            "switchboard_run_duration_seconds_count{status=\"completed\"}"
        ),
        1.0
    );
    assert!(
        sample(
            &all,
            "switchboard_run_duration_seconds_sum{status=\"completed\"}"
        ) > 0.0
    );
    assert_eq!(sample(&all, "switchboard_step_commit_seconds_count"), 4.0);
    assert_eq!(
        sample(
            &all,
            "switchboard_model_call_seconds_count{agent=\"demo\",model=\"scripted\"}"
        ),
        3.0
    );
    let tool_calls: f64 = all
        .iter()
        .filter(|(k, _)| k.starts_with("switchboard_tool_call_seconds_count{tool="))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(tool_calls, 2.0, "{text}");
    assert!(!text.contains("tool=\"not_available\""), "{text}");
    // HTTP latency by route pattern (never the raw path) and status class.
    let http = |route: &str, class: &str| {
        sample(&all, &format!("switchboard_http_request_duration_seconds_count{{route=\"{route}\",status_class=\"{class}\"}}"))
    };
    assert_eq!(http("/api/messages", "2xx"), 1.0);
    assert!(http("/api/runs/{id}", "2xx") >= 1.0);
    assert_eq!(http("unmatched", "4xx"), 1.0);
    assert!(
        !text.contains(&run_id),
        "a raw path leaked into a label: {text}"
    );

    // Every histogram series: cumulative buckets ending at +Inf = _count.
    for (key, count) in all.iter().filter(|(k, _)| k.contains("_seconds_count")) {
        let (name, labels) = key.split_once("_count").unwrap();
        let inf = match labels {
            "" => format!("{name}_bucket{{le=\"+Inf\"}}"),
            l => format!("{name}_bucket{},le=\"+Inf\"}}", &l[..l.len() - 1]),
        };
        assert_eq!(sample(&all, &inf), *count, "{key}");
    }
    promtool_lint(&text);
}

/// `path` with its parameters filled: a run id, plan id and request id no one has.
fn concrete(path: &str) -> String {
    path.replace("{id}", "0190d5e8-0000-7000-8000-000000000000")
        .replace("{rid}", "0190d5e8-0000-7000-8000-000000000001")
}

fn schema_properties(doc: &serde_json::Value, name: &str) -> Vec<String> {
    doc["components"]["schemas"][name]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no schema {name}"))
        .keys()
        .cloned()
        .collect()
}

/// Every key of `body` is a property of the schema `name`.
fn conforms(doc: &serde_json::Value, name: &str, body: &serde_json::Value) {
    let props = schema_properties(doc, name);
    for key in body
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {body}"))
        .keys()
    {
        assert!(
            props.contains(key),
            "{name} does not describe `{key}` of {body}"
        );
    }
}

#[actix_web::test]
async fn openapi_describes_every_mounted_api_route_without_auth() {
    // No dev bypass and no token: the document needs no auth, everything else is 401.
    let app = TestApp::spawn_with(|c| c.auth.dev_bypass = false).await;
    let res = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let doc: serde_json::Value = res.json().await.expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], switchboard::VERSION);
    // What only the running process knows: where it serves, and which agents a message may name.
    assert_eq!(doc["servers"], serde_json::json!([{"url": app.base}]));
    let agent = &doc["components"]["schemas"]["MessageBody"]["properties"]["agent"];
    assert!(
        agent["enum"]
            .as_array()
            .is_some_and(|a| a.contains(&serde_json::json!("demo"))),
        "{agent}"
    );

    // The route table is what the app mounts: each (path, method) is served by a route (not the 405 of
    // a known path nor the 404 of an unknown one), and each is in the document.
    for (path, allow) in web::routes::API_ROUTES {
        for method in allow.split(", ") {
            let op = &doc["paths"][*path][method.to_lowercase()];
            assert!(op.is_object(), "{method} {path} is not in the document");
            let req = app
                .client
                .request(method.parse().unwrap(), app.url(&concrete(path)));
            let req = if method == "POST" {
                req.json(&serde_json::json!({}))
            } else {
                req
            };
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            assert_ne!(status, 405, "{method} {path}");
            if status == 404 {
                let body: serde_json::Value = res.json().await.unwrap();
                assert!(
                    !body["message"].as_str().unwrap_or("").starts_with("route "),
                    "{method} {path} is not mounted: {body}"
                );
            }
        }
    }
    // A path the table does not have is not mounted.
    let res = app
        .client
        .get(app.url("/api/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 404);
}

#[actix_web::test]
async fn api_answers_carry_only_what_the_document_describes() {
    let app = TestApp::spawn().await;
    let doc: serde_json::Value = app
        .client
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (status, admitted) =
        app.post(serde_json::json!({"thread": "doc", "channel": "c1", "user": "u1", "text": "steps=1 ms=0"})).await;
    assert_eq!(status, 202);
    conforms(&doc, "Admission", &admitted);
    let run_id = admitted["runId"].as_str().unwrap().to_owned();
    app.final_record(&run_id).await;
    let (_, view) = app
        .get_json(&format!("/api/runs/{run_id}?include=events"), None)
        .await;
    conforms(&doc, "RunView", &view);
    assert!(
        view["events"].as_array().is_some_and(|e| !e.is_empty()),
        "{view}"
    );
    let (_, list) = app.get_json("/api/runs?status=all", None).await;
    conforms(&doc, "RunList", &list);
    conforms(&doc, "RunView", &list["runs"][0]);
    let (_, page) = app
        .get_json(&format!("/api/runs/{run_id}/events?limit=1"), None)
        .await;
    conforms(&doc, "EventPage", &page);
    let (_, friction) = app
        .get_json(&format!("/api/runs/{run_id}/friction"), None)
        .await;
    conforms(&doc, "Friction", &friction);
    let (_, live) = app.get_json("/api/live", None).await;
    conforms(&doc, "LiveRuns", &live);
    let res = app
        .client
        .delete(app.url(&format!("/api/runs/{run_id}")))
        .send()
        .await
        .unwrap();
    let (status, killed): (u16, serde_json::Value) =
        (res.status().as_u16(), res.json().await.unwrap());
    // A finished run: the kill answers 202 or 409, each described.
    match status {
        202 => conforms(&doc, "KillAccepted", &killed),
        _ => conforms(&doc, "ErrorBody", &killed),
    }
}
