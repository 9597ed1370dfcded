//! Real agents end to end (SPEC §8.3) against a local OpenAI-compatible stub on 127.0.0.1:0: transient
//! errors are retried with `model_retry` events, usage is summed per model in the record, the tool
//! allowlist is what the model receives and what it may call, and secrets never reach a read surface.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};
use storage::record::RunStatus;
use support::TestApp;

/// One canned answer of the stub: status, `Retry-After` (seconds), body.
type Canned = (u16, Option<u64>, Value);

#[derive(Clone, Default)]
struct Stub {
    answers: Arc<Mutex<VecDeque<Canned>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

async fn chat(stub: web::Data<Stub>, _req: HttpRequest, body: web::Json<Value>) -> HttpResponse {
    stub.requests.lock().unwrap().push(body.into_inner());
    let (status, retry_after, answer) = stub
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .expect("a canned answer left");
    let mut res = HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap());
    if let Some(s) = retry_after {
        res.insert_header(("retry-after", s.to_string()));
    }
    res.json(answer)
}

/// Start the stub; answers its base URL.
fn start_stub(stub: &Stub) -> String {
    let data = web::Data::new(stub.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/v1/chat/completions", web::post().to(chat))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    format!("http://{addr}/v1")
}

fn completion(message: Value, prompt_tokens: u64, completion_tokens: u64) -> Value {
    json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}})
}

fn tool_call(id: &str, name: &str, args: Value) -> Value {
    json!({"role": "assistant", "content": null,
        "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]})
}

async fn app_with_gpt(base_url: String) -> TestApp {
    std::env::set_var("SWITCHBOARD_TEST_KEY", "test-key");
    TestApp::spawn_with(move |c| {
        let gpt = switchboard::config::AgentConfig {
            kind: switchboard::config::AgentKind::Openai,
            model: Some("gpt-test".into()),
            base_url: Some(base_url),
            api_key_env: Some("SWITCHBOARD_TEST_KEY".into()),
            tools: Some(vec!["echo".into()]),
            retry: switchboard::config::AgentRetryConfig {
                max_attempts: 5,
                initial_ms: 10,
                max_ms: 2_000,
            },
            ..Default::default()
        };
        c.agents.insert("gpt".into(), gpt);
    })
    .await
}

async fn run(app: &TestApp, text: &str) -> storage::record::RunRecord {
    let (status, body) = app
        .post(json!({"thread": "t1", "channel": "c", "user": "u", "text": text, "agent": "gpt"}))
        .await;
    assert_eq!(status, 202, "{body}");
    app.final_record(body["runId"].as_str().unwrap()).await
}

fn of_type<'a>(record: &'a storage::record::RunRecord, kind: &str) -> Vec<&'a Value> {
    record.events.iter().filter(|e| e["type"] == kind).collect()
}

#[actix_web::test]
async fn transient_errors_are_retried_usage_is_summed_and_the_allowlist_is_what_the_model_sees() {
    let stub = Stub::default();
    stub.answers.lock().unwrap().extend([
        (429, Some(1), json!({"error": {"message": "slow down"}})),
        (503, None, json!({"error": {"message": "overloaded"}})),
        (
            200,
            None,
            completion(tool_call("call_1", "echo", json!({"text": "hi"})), 10, 3),
        ),
        (
            200,
            None,
            completion(json!({"role": "assistant", "content": "all done"}), 20, 5),
        ),
    ]);
    let app = app_with_gpt(start_stub(&stub)).await;
    let record = run(&app, "say hi").await;
    assert_eq!(
        record.head.status,
        RunStatus::Completed,
        "{:?}",
        record.events
    );
    // Two retries, each a visible event; the Retry-After of the first is honoured.
    let retries = of_type(&record, "model_retry");
    assert_eq!(retries.len(), 2, "{:?}", record.events);
    assert_eq!(
        (
            retries[0]["attempt"].as_u64(),
            retries[1]["attempt"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert!(
        retries[0]["waitMs"].as_u64().unwrap() >= 1000,
        "{}",
        retries[0]
    );
    assert_eq!(retries[0]["step"], 1);
    // The echo call ran, and the answer came through.
    assert_eq!(of_type(&record, "tool_result")[0]["ok"], true);
    assert_eq!(of_type(&record, "answer")[0]["text"], "all done");
    // Usage: on the assistant event with its model, and summed per model on the record.
    let assistant = of_type(&record, "assistant")[0];
    assert_eq!(
        (
            assistant["usage"]["inputTokens"].as_u64(),
            assistant["model"].as_str()
        ),
        (Some(10), Some("gpt-test"))
    );
    let full = app
        .running
        .storage
        .get(record.head.id.clone())
        .await
        .unwrap()
        .unwrap();
    let usage = serde_json::to_value(&full).unwrap()["usage"].clone();
    assert_eq!(
        usage,
        json!({"gpt-test": {"inputTokens": 30, "outputTokens": 8}}),
        "{usage}"
    );
    // The run's view carries it too.
    let view: Value = app
        .client
        .get(app.url(&format!("/api/runs/{}", record.head.id)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["usage"], usage, "{view}");
    // The model saw exactly the allowlist.
    let requests = stub.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 4);
    let names: Vec<&str> = requests[2]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo"]);
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains(r#"switchboard_tokens_total{agent="gpt",model="gpt-test",kind="input"} 30"#),
        "{metrics}"
    );
}

#[actix_web::test]
async fn a_call_to_a_tool_outside_the_allowlist_is_not_available_and_a_permanent_error_fails_at_once(
) {
    let stub = Stub::default();
    stub.answers.lock().unwrap().extend([
        (
            200,
            None,
            completion(
                tool_call("call_1", "append_file", json!({"path": "x", "line": "y"})),
                1,
                1,
            ),
        ),
        (400, None, json!({"error": {"message": "bad request"}})),
    ]);
    let app = app_with_gpt(start_stub(&stub)).await;
    let record = run(&app, "write something").await;
    let result = of_type(&record, "tool_result")[0];
    assert_eq!(
        (result["ok"].as_bool(), result["summary"].as_str()),
        (Some(false), Some("not available")),
        "{result}"
    );
    assert!(
        !app.dir
            .path()
            .join("workspaces")
            .join(record.head.id.as_str())
            .join("x")
            .exists(),
        "nothing was written"
    );
    // A 400 is permanent: no retry, the run fails.
    assert_eq!(record.head.status, RunStatus::Failed);
    assert!(of_type(&record, "model_retry").is_empty());
    assert_eq!(stub.requests.lock().unwrap().len(), 2);
}

#[actix_web::test]
async fn a_secret_in_a_message_never_reaches_a_read_surface() {
    let app = TestApp::spawn().await;
    let secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
    let run_id = app
        .start_run("ts", &format!("use {secret} now steps=1 ms=0 answer=ok"))
        .await;
    let record = app.final_record(&run_id).await;
    let stored = serde_json::to_string(&record.events).unwrap();
    assert!(!stored.contains(secret), "{stored}");
    assert!(stored.contains("[redacted]"), "{stored}");
    assert!(!record
        .head
        .label
        .as_deref()
        .unwrap_or_default()
        .contains(secret));
    for path in [
        "/api/runs?status=all",
        &format!("/api/runs/{run_id}?include=events"),
        "/runs?all=1",
        &format!("/runs/{run_id}"),
    ] {
        let body = app
            .client
            .get(app.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!body.contains(secret), "{path} leaks the secret");
    }
}
