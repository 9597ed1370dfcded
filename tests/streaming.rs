//! A streaming agent end to end (SPEC §8.3 `stream`): a local OpenAI-compatible stub on 127.0.0.1:0
//! answers as SSE chunks; a viewer of `/api/runs/{id}/stream` gets `event: assistant_delta` frames
//! (no `id:` line) before the run's `answer`, and the stored record holds no delta.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storage::RunId;

use actix_web::{web, App, HttpResponse, HttpServer};
use futures_util::StreamExt;
use serde_json::{json, Value};
use storage::record::RunStatus;
use support::TestApp;

#[derive(Clone, Default)]
struct Stub {
    /// The chunks are held back until the test's viewer is attached.
    gate: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Value>>>,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The stub's answer to its `n`-th request (0-based): first a streamed text with an `echo` call, then
/// the streamed answer.
fn chunks(n: usize) -> Vec<String> {
    let delta =
        |d: Value| sse(&json!({"choices": [{"index": 0, "delta": d, "finish_reason": null}]}));
    let end = |reason: &str, input: u64, output: u64| {
        vec![
            sse(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})),
            sse(
                &json!({"choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output}}),
            ),
            "data: [DONE]\n\n".to_owned(),
        ]
    };
    if n == 0 {
        let mut c = vec![
            delta(json!({"role": "assistant", "content": "Hel"})),
            delta(json!({"content": "lo, "})),
            delta(json!({"content": "world."})),
            delta(
                json!({"tool_calls": [{"index": 0, "id": "call_s", "type": "function",
                "function": {"name": "echo", "arguments": "{\"text\":\"hi\"}"}}]}),
            ),
        ];
        c.extend(end("tool_calls", 7, 3));
        c
    } else {
        let mut c = vec![
            delta(json!({"role": "assistant", "content": "all "})),
            delta(json!({"content": "done"})),
        ];
        c.extend(end("stop", 5, 2));
        c
    }
}

async fn chat(stub: web::Data<Stub>, body: web::Json<Value>) -> HttpResponse {
    let n = {
        let mut requests = stub.requests.lock().unwrap();
        requests.push(body.into_inner());
        requests.len() - 1
    };
    let gate = stub.gate.clone();
    let body =
        futures_util::stream::unfold((0usize, chunks(n), gate), |(i, chunks, gate)| async move {
            while !gate.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let chunk = chunks.get(i)?.clone();
            tokio::time::sleep(Duration::from_millis(30)).await;
            Some((
                Ok::<_, std::io::Error>(web::Bytes::from(chunk)),
                (i + 1, chunks, gate),
            ))
        });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(body)
}

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

/// The raw frames of an SSE body (split on blank lines) until a frame satisfies `last`.
async fn frames_until(res: reqwest::Response, last: impl Fn(&str) -> bool) -> Vec<String> {
    let mut bytes = res.bytes_stream();
    let (mut buf, mut frames) = (String::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let chunk = tokio::time::timeout_at(deadline, bytes.next())
            .await
            .expect("frames within 20 s");
        let Some(Ok(chunk)) = chunk else {
            return frames;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(at) = buf.find("\n\n") {
            let frame = buf[..at].to_owned();
            buf.drain(..at + 2);
            let done = last(&frame);
            frames.push(frame);
            if done {
                return frames;
            }
        }
    }
}

fn event_of(frame: &str) -> &str {
    frame
        .lines()
        .find_map(|l| l.strip_prefix("event: "))
        .unwrap_or_default()
}

fn data_of(frame: &str) -> Value {
    frame
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(Value::Null)
}

#[actix_web::test]
async fn a_streaming_agent_sends_deltas_to_viewers_before_the_answer_and_stores_none() {
    let stub = Stub::default();
    let base_url = start_stub(&stub);
    std::env::set_var("SWITCHBOARD_STREAM_TEST_KEY", "test-key");
    let app = TestApp::spawn_with(move |c| {
        let gpt = switchboard::config::AgentConfig {
            kind: switchboard::config::AgentKind::Openai,
            model: Some("gpt-stream".into()),
            base_url: Some(base_url),
            api_key_env: Some("SWITCHBOARD_STREAM_TEST_KEY".into()),
            tools: Some(vec!["echo".into()]),
            stream: true,
            ..Default::default()
        };
        c.agents.insert("gpt".into(), gpt);
    })
    .await;
    let (status, body) = app
        .post(json!({"thread": "t1", "channel": "c", "user": "u", "text": "greet", "agent": "gpt"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let run_id = body["runId"].as_str().unwrap().to_owned();

    let res = app
        .client
        .get(app.url(&format!("/api/runs/{run_id}/stream")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    // Open the gate once the viewer is attached: spawned so the reader below sees the first frame.
    let gate = stub.gate.clone();
    actix_web::rt::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        gate.store(true, Ordering::SeqCst);
    });
    let frames = frames_until(res, |f| event_of(f) == "end").await;

    let deltas: Vec<&String> = frames
        .iter()
        .filter(|f| event_of(f) == "assistant_delta")
        .collect();
    assert!(!deltas.is_empty(), "no deltas: {frames:#?}");
    for f in &deltas {
        assert!(
            !f.lines().any(|l| l.starts_with("id:")),
            "a delta frame carries no id: {f}"
        );
        let d = data_of(f);
        assert!(
            d["step"].as_u64().is_some()
                && d["attempt"].as_u64().is_some()
                && d["text"].is_string(),
            "{d}"
        );
    }
    let text: String = deltas
        .iter()
        .map(|f| data_of(f)["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(text, "Hello, world.all done", "both model calls streamed");
    let first_delta = frames
        .iter()
        .position(|f| event_of(f) == "assistant_delta")
        .unwrap();
    let answer = frames
        .iter()
        .position(|f| data_of(f)["type"] == "answer")
        .expect("the answer frame");
    assert!(
        first_delta < answer,
        "deltas come before the answer: {frames:#?}"
    );
    // Durable frames keep their ids.
    assert!(
        frames[answer].lines().any(|l| l.starts_with("id: ")),
        "{}",
        frames[answer]
    );

    let record = app.final_record(&run_id).await;
    assert_eq!(
        record.head.status,
        RunStatus::Completed,
        "{:?}",
        record.events
    );
    assert!(
        record.events.iter().all(|e| e["type"] != "assistant_delta"),
        "{:?}",
        record.events
    );
    let answer = record
        .events
        .iter()
        .find(|e| e["type"] == "answer")
        .expect("answer");
    assert_eq!(answer["text"], "all done");
    assert_eq!(stub.requests.lock().unwrap()[0]["stream"], json!(true));
    // The usage the stream reported: summed per model on the record, shown in the live view header.
    let full = app
        .running
        .storage
        .get(RunId::from(run_id.clone()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::to_value(&full).unwrap()["usage"],
        json!({"gpt-stream": {"inputTokens": 12, "outputTokens": 5}})
    );
    let page = app
        .client
        .get(app.url(&format!("/runs/{run_id}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The view does not carry the record's `usage` and the answer turn has no `assistant` event, so the
    // header may show only the tool-calling turns' sum (7/3) rather than the record's (12/5).
    let shown = page
        .split("<dd id=\"f-usage\">")
        .nth(1)
        .and_then(|r| r.split("</dd>").next())
        .unwrap_or_default();
    assert!(
        shown == "gpt-stream: 12 in / 5 out" || shown == "gpt-stream: 7 in / 3 out",
        "{shown:?}"
    );
}
