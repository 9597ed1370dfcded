//! The model providers against stub HTTP servers on `127.0.0.1:0` (SPEC §8.3 "Real agents"): a whole
//! tool-calling exchange per provider (what the stub receives has the right shape), usage, the typed
//! errors a run retries on (with `Retry-After`), and streamed answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actors::agent::anthropic::{AnthropicAgent, AnthropicConfig};
use actors::agent::openai::{OpenAiAgent, OpenAiConfig};
use actors::agent::scripted::ScriptedAgent;
use actors::agent::{
    results_turn, user_turn, Agent, AgentError, AssistantTurn, Conversation, ToolCall, ToolDef,
    ToolResult, Usage,
};
use serde_json::{json, Value};
use storage::ledger::Turn;
use tokio::sync::Notify;

/// One canned answer of the stub.
#[derive(Clone)]
struct Reply {
    status: u16,
    content_type: &'static str,
    headers: Vec<(&'static str, String)>,
    /// Sent one after another; with a `gate (k, notify)`, the stub waits for `notify` before chunk `k`.
    chunks: Vec<String>,
    gate: Option<(usize, Arc<Notify>)>,
}

impl Reply {
    fn json(status: u16, body: Value) -> Reply {
        Reply::raw(status, "application/json", &body.to_string())
    }

    fn raw(status: u16, content_type: &'static str, body: &str) -> Reply {
        Reply {
            status,
            content_type,
            headers: Vec::new(),
            chunks: vec![body.to_owned()],
            gate: None,
        }
    }

    /// A `text/event-stream` answer, one chunk per event; `gate` holds back the chunks from its index on.
    fn events(events: &[String], gate: Option<(usize, Arc<Notify>)>) -> Reply {
        Reply {
            status: 200,
            content_type: "text/event-stream",
            headers: Vec::new(),
            chunks: events.to_vec(),
            gate,
        }
    }

    fn header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_owned()));
        self
    }
}

/// What the stub received: the path, the headers (lowercase names) and the JSON body.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
    body: Value,
}

/// A provider stand-in answering its canned replies in order (the last one repeats).
struct Stub {
    base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: actix_web::dev::ServerHandle,
}

impl Stub {
    async fn start(replies: Vec<Reply>) -> Stub {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let replies = Arc::new(replies);
        let record = seen.clone();
        let server = HttpServer::new(move || {
            let (record, replies) = (record.clone(), replies.clone());
            App::new().default_service(web::to(move |req: HttpRequest, bytes: web::Bytes| {
                let (record, replies) = (record.clone(), replies.clone());
                async move {
                    let headers = req
                        .headers()
                        .iter()
                        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                        .collect();
                    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    let n = {
                        let mut seen = record.lock().unwrap();
                        seen.push(Seen {
                            path: req.path().to_owned(),
                            headers,
                            body,
                        });
                        seen.len()
                    };
                    let reply = replies[(n - 1).min(replies.len() - 1)].clone();
                    let mut resp = HttpResponse::build(
                        actix_web::http::StatusCode::from_u16(reply.status).unwrap(),
                    );
                    resp.content_type(reply.content_type);
                    for (name, value) in &reply.headers {
                        resp.insert_header((*name, value.as_str()));
                    }
                    let body =
                        futures_util::stream::unfold((0usize, reply), |(i, reply)| async move {
                            if i >= reply.chunks.len() {
                                return None;
                            }
                            if let Some((_, gate)) = reply.gate.as_ref().filter(|(k, _)| *k == i) {
                                gate.notified().await;
                            }
                            let chunk = web::Bytes::from(reply.chunks[i].clone());
                            Some((Ok::<_, std::io::Error>(chunk), (i + 1, reply)))
                        });
                    resp.streaming(body)
                }
            }))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Stub {
            base_url: format!("http://{addr}"),
            seen,
            server: handle,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn openai(&self) -> OpenAiAgent {
        openai_at(&self.base_url)
    }

    fn anthropic(&self) -> AnthropicAgent {
        anthropic_at(&self.base_url)
    }

    async fn stop(self) {
        self.server.stop(false).await;
    }
}

/// An OpenAI agent for a server at `base` (the API lives under `/v1`), with temperature and max_tokens.
fn openai_at(base: &str) -> OpenAiAgent {
    OpenAiAgent::new(OpenAiConfig {
        base_url: format!("{base}/v1"),
        model: "gpt-test".into(),
        api_key: "sk-test-key".into(),
        timeout: Duration::from_secs(10),
        temperature: Some(0.25),
        max_tokens: Some(256),
    })
}

/// An Anthropic agent for a server at `base`, with temperature and max_tokens.
fn anthropic_at(base: &str) -> AnthropicAgent {
    AnthropicAgent::new(AnthropicConfig {
        base_url: base.to_owned(),
        model: "claude-test".into(),
        api_key: "sk-ant-test".into(),
        timeout: Duration::from_secs(10),
        temperature: Some(0.5),
        max_tokens: Some(512),
    })
}

fn tools() -> Vec<ToolDef> {
    vec![ToolDef {
        name: "echo".into(),
        description: "Return the text.".into(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        side_effect_free: true,
        rerun_safe: true,
        idempotent: false,
    }]
}

/// The transcript after the model's call ran: the request, the call, its result and a follow-up.
fn after_call(call: &AssistantTurn) -> Vec<Turn> {
    let c = &call.calls[0];
    vec![
        user_turn("say hello"),
        AssistantTurn {
            usage: None,
            ..call.clone()
        }
        .to_turn(),
        results_turn(
            &[ToolResult {
                call_id: c.call_id.clone(),
                tool: c.tool.clone(),
                ok: true,
                output: "hello".into(),
            }],
            &[(3, "and wave".into())],
        ),
    ]
}

/// Collects streamed deltas and opens `gate` at the first one.
struct Deltas {
    got: Mutex<Vec<String>>,
    gate: Arc<Notify>,
}

impl Deltas {
    fn new() -> Deltas {
        Deltas {
            got: Mutex::new(Vec::new()),
            gate: Arc::new(Notify::new()),
        }
    }

    fn sink(&self) -> impl Fn(&str) + Sync + '_ {
        move |d: &str| {
            self.got.lock().unwrap().push(d.to_owned());
            self.gate.notify_one();
        }
    }

    fn got(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }
}

fn sse(data: &Value) -> String {
    format!("data: {data}\n\n")
}

fn anthropic_sse(data: &Value) -> String {
    format!(
        "event: {}\ndata: {data}\n\n",
        data["type"].as_str().unwrap()
    )
}

#[actix_rt::test]
async fn openai_completes_a_tool_calling_exchange_with_usage() {
    let stub = Stub::start(vec![
        Reply::json(
            200,
            json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
                "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "echo", "arguments": "{\"text\":\"hello\"}"}}]}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49}}),
        ),
        Reply::json(
            200,
            json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "I said hello."}}],
                "usage": {"prompt_tokens": 61, "completion_tokens": 4}}),
        ),
    ])
    .await;
    let agent = stub.openai();
    let tools = tools();

    // Call 1: the model asks for a tool.
    let turns = vec![user_turn("say hello")];
    let first = agent
        .next(Conversation {
            system: "be brief",
            turns: &turns,
            tools: &tools,
        })
        .await
        .unwrap();
    assert_eq!(
        first,
        AssistantTurn {
            text: String::new(),
            calls: vec![ToolCall {
                call_id: "call_1".into(),
                tool: "echo".into(),
                args: json!({"text": "hello"})
            }],
            usage: Some(Usage {
                input_tokens: 40,
                output_tokens: 9
            }),
        }
    );

    // Call 2: the result goes back; the model answers.
    let turns = after_call(&first);
    let second = agent
        .next(Conversation {
            system: "be brief",
            turns: &turns,
            tools: &tools,
        })
        .await
        .unwrap();
    assert_eq!(second.text, "I said hello.");
    assert!(second.calls.is_empty());
    assert_eq!(
        second.usage,
        Some(Usage {
            input_tokens: 61,
            output_tokens: 4
        })
    );
    assert_eq!(
        first.usage.unwrap() + second.usage.unwrap(),
        Usage {
            input_tokens: 101,
            output_tokens: 13
        }
    );

    let seen = stub.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.path, "/v1/chat/completions");
        assert_eq!(
            s.headers.get("authorization").map(String::as_str),
            Some("Bearer sk-test-key")
        );
        assert_eq!(s.body["model"], "gpt-test");
        assert_eq!(s.body["temperature"], json!(0.25));
        assert_eq!(s.body["max_tokens"], json!(256));
        assert!(
            s.body.get("stream").is_none(),
            "not streamed by default: {}",
            s.body
        );
        assert_eq!(
            s.body["tools"],
            json!([{"type": "function", "function": {"name": "echo", "description": "Return the text.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}])
        );
        assert_eq!(
            s.body["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
    }
    assert_eq!(
        seen[1].body["messages"],
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "say hello"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hello\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
            {"role": "user", "content": "and wave"},
        ])
    );
    stub.stop().await;
}

#[actix_rt::test]
async fn anthropic_completes_a_tool_calling_exchange_with_usage() {
    let stub = Stub::start(vec![
        Reply::json(
            200,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                "stop_reason": "tool_use", "content": [
                    {"type": "text", "text": "I'll echo it."},
                    {"type": "tool_use", "id": "toolu_01", "name": "echo", "input": {"text": "hello"}}],
                "usage": {"input_tokens": 55, "output_tokens": 21}}),
        ),
        Reply::json(
            200,
            json!({"id": "msg_2", "type": "message", "role": "assistant", "stop_reason": "end_turn",
                "content": [{"type": "text", "text": "Done: hello."}],
                "usage": {"input_tokens": 90, "output_tokens": 5}}),
        ),
    ])
    .await;
    let agent = stub.anthropic();
    let tools = tools();

    let turns = vec![user_turn("say hello")];
    let first = agent
        .next(Conversation {
            system: "be brief",
            turns: &turns,
            tools: &tools,
        })
        .await
        .unwrap();
    assert_eq!(
        first,
        AssistantTurn {
            text: "I'll echo it.".into(),
            calls: vec![ToolCall {
                call_id: "toolu_01".into(),
                tool: "echo".into(),
                args: json!({"text": "hello"})
            }],
            usage: Some(Usage {
                input_tokens: 55,
                output_tokens: 21
            }),
        }
    );

    let turns = after_call(&first);
    let second = agent
        .next(Conversation {
            system: "be brief",
            turns: &turns,
            tools: &tools,
        })
        .await
        .unwrap();
    assert_eq!(
        second,
        AssistantTurn {
            text: "Done: hello.".into(),
            calls: vec![],
            usage: Some(Usage {
                input_tokens: 90,
                output_tokens: 5
            })
        }
    );

    let seen = stub.seen();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(s.path, "/v1/messages");
        assert_eq!(
            s.headers.get("x-api-key").map(String::as_str),
            Some("sk-ant-test")
        );
        assert_eq!(
            s.headers.get("anthropic-version").map(String::as_str),
            Some("2023-06-01")
        );
        assert!(
            !s.headers.contains_key("authorization"),
            "no bearer auth for anthropic"
        );
        assert_eq!(s.body["model"], "claude-test");
        assert_eq!(s.body["system"], "be brief");
        assert_eq!(s.body["temperature"], json!(0.5));
        assert_eq!(s.body["max_tokens"], json!(512));
        assert!(
            s.body.get("stream").is_none(),
            "not streamed by default: {}",
            s.body
        );
        assert_eq!(
            s.body["tools"],
            json!([{"name": "echo", "description": "Return the text.",
                "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}])
        );
    }
    assert_eq!(
        seen[1].body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "say hello"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "I'll echo it."},
                {"type": "tool_use", "id": "toolu_01", "name": "echo", "input": {"text": "hello"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "hello"},
                {"type": "text", "text": "and wave"}]},
        ])
    );
    stub.stop().await;
}

/// Which provider a table row exercises.
#[derive(Debug, Clone, Copy)]
enum Provider {
    OpenAi,
    Anthropic,
}

impl Provider {
    fn agent(self, stub: &Stub) -> Box<dyn Agent> {
        self.agent_at(&stub.base_url)
    }

    fn agent_at(self, base: &str) -> Box<dyn Agent> {
        match self {
            Provider::OpenAi => Box::new(openai_at(base)),
            Provider::Anthropic => Box::new(anthropic_at(base)),
        }
    }

    fn what(self) -> &'static str {
        match self {
            Provider::OpenAi => "chat completions",
            Provider::Anthropic => "messages",
        }
    }
}

#[actix_rt::test]
async fn failures_are_typed_for_the_run_to_retry_or_fail() {
    let secs = Duration::from_secs;
    let in_an_hour = httpdate::fmt_http_date(std::time::SystemTime::now() + secs(3600));
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let rate_limited = json!({"error": {"type": "rate_limit_error", "message": "slow down"}});
    let bad_request =
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}});
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let what = provider.what();
        let cases: Vec<(&str, Reply, AgentError)> = vec![
            (
                "429 with Retry-After seconds",
                Reply::json(429, rate_limited.clone()).header("retry-after", "3"),
                AgentError::Transient {
                    message: format!("{what} answered http 429: rate_limit_error: slow down"),
                    retry_after: Some(secs(3)),
                },
            ),
            (
                "500 without Retry-After",
                Reply::raw(500, "text/plain", "boom"),
                AgentError::Transient {
                    message: format!("{what} answered http 500"),
                    retry_after: None,
                },
            ),
            (
                "529 overloaded",
                Reply::json(529, overloaded.clone()),
                AgentError::Transient {
                    message: format!("{what} answered http 529: overloaded_error: Overloaded"),
                    retry_after: None,
                },
            ),
            (
                "408 with a garbled Retry-After",
                Reply::raw(408, "text/plain", "").header("retry-after", "whenever"),
                AgentError::Transient {
                    message: format!("{what} answered http 408"),
                    retry_after: None,
                },
            ),
            (
                "400",
                Reply::json(400, bad_request.clone()),
                AgentError::Permanent(format!(
                    "{what} answered http 400: invalid_request_error: bad"
                )),
            ),
            (
                "401 ignores Retry-After",
                Reply::raw(401, "text/plain", "").header("retry-after", "3"),
                AgentError::Permanent(format!("{what} answered http 401")),
            ),
            (
                "malformed JSON",
                Reply::raw(200, "application/json", "{\"choices\": [tru"),
                AgentError::Permanent(
                    "malformed response body: EOF while parsing a value at line 1 column 16".into(),
                ),
            ),
        ];
        for (name, reply, want) in cases {
            let stub = Stub::start(vec![reply]).await;
            let turns = [user_turn("hello")];
            let got = provider
                .agent(&stub)
                .next(Conversation {
                    system: "",
                    turns: &turns,
                    tools: &[],
                })
                .await;
            assert_eq!(got, Err(want), "{provider:?}: {name}");
            stub.stop().await;
        }

        // An HTTP-date Retry-After is a wait from now.
        let stub = Stub::start(vec![
            Reply::raw(503, "text/plain", "").header("retry-after", &in_an_hour)
        ])
        .await;
        let turns = [user_turn("hello")];
        let err = provider
            .agent(&stub)
            .next(Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            })
            .await
            .unwrap_err();
        assert!(err.is_transient(), "{provider:?}: {err:?}");
        let wait = err.retry_after().expect("a wait");
        assert!(
            wait > secs(3590) && wait <= secs(3600),
            "{provider:?}: {wait:?}"
        );
        stub.stop().await;

        // A well-formed answer of the wrong shape is malformed too.
        let stub = Stub::start(vec![Reply::json(200, json!({"unexpected": true}))]).await;
        let err = provider
            .agent(&stub)
            .next(Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::Permanent(m) if m.starts_with("malformed response body")),
            "{err:?}"
        );
        stub.stop().await;

        // Nothing listening: a connect failure, transient.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let agent = provider.agent_at(&format!("http://{addr}"));
        let err = agent
            .next(Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::Transient { message, retry_after: None }
                if message.starts_with(&format!("{what} connect failed"))),
            "{provider:?}: {err:?}"
        );
    }
}

#[actix_rt::test]
async fn openai_streams_deltas_then_answers_the_whole_turn() {
    let deltas = Deltas::new();
    let chunk = |delta: Value| {
        sse(&json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]}))
    };
    let events = vec![
        chunk(json!({"role": "assistant", "content": "Hel"})),
        chunk(json!({"content": "lo, "})),
        chunk(json!({"content": "world."})),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_s", "type": "function",
            "function": {"name": "echo", "arguments": ""}}]}),
        ),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"text\":"}}]})),
        chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"hi\"}"}}]})),
        sse(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})),
        sse(&json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 8}})),
        "data: [DONE]\n\n".to_owned(),
    ];
    // The stub holds everything after the first chunk until a delta arrived: deltas come while the
    // answer is still being written, not after it.
    let stub = Stub::start(vec![Reply::events(&events, Some((1, deltas.gate.clone())))]).await;
    let agent = stub.openai();
    let (turns, tools) = ([user_turn("hello")], tools());
    let sink = deltas.sink();
    let turn = agent
        .next_streaming(
            Conversation {
                system: "s",
                turns: &turns,
                tools: &tools,
            },
            &sink,
        )
        .await
        .unwrap();
    assert_eq!(deltas.got(), vec!["Hel", "lo, ", "world."]);
    assert_eq!(
        turn,
        AssistantTurn {
            text: "Hello, world.".into(),
            calls: vec![ToolCall {
                call_id: "call_s".into(),
                tool: "echo".into(),
                args: json!({"text": "hi"})
            }],
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 8
            }),
        }
    );
    let body = &stub.seen()[0].body;
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        stub.seen()[0].headers.get("accept").map(String::as_str),
        Some("text/event-stream")
    );
    stub.stop().await;
}

#[actix_rt::test]
async fn anthropic_streams_deltas_then_answers_the_whole_turn() {
    let deltas = Deltas::new();
    let events: Vec<String> = [
        json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
            "content": [], "usage": {"input_tokens": 30, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "check."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_s", "name": "echo", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"text\": \"h"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "i\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 17}}),
        json!({"type": "message_stop"}),
    ]
    .iter()
    .map(anthropic_sse)
    .collect();
    // Held back after the first text delta (event 3) until the agent reported it.
    let stub = Stub::start(vec![Reply::events(&events, Some((4, deltas.gate.clone())))]).await;
    let agent = stub.anthropic();
    let (turns, tools) = ([user_turn("hello")], tools());
    let sink = deltas.sink();
    let turn = agent
        .next_streaming(
            Conversation {
                system: "s",
                turns: &turns,
                tools: &tools,
            },
            &sink,
        )
        .await
        .unwrap();
    assert_eq!(deltas.got(), vec!["Let me ", "check."]);
    assert_eq!(
        turn,
        AssistantTurn {
            text: "Let me check.".into(),
            calls: vec![ToolCall {
                call_id: "toolu_s".into(),
                tool: "echo".into(),
                args: json!({"text": "hi"})
            }],
            usage: Some(Usage {
                input_tokens: 30,
                output_tokens: 17
            }),
        }
    );
    assert_eq!(stub.seen()[0].body["stream"], json!(true));
    stub.stop().await;
}

#[actix_rt::test]
async fn broken_streams_fail_typed() {
    let turns = [user_turn("hello")];
    let text_chunk = sse(&json!({"choices": [{"index": 0, "delta": {"content": "par"}}]}));
    let start =
        anthropic_sse(&json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}));
    type Check = fn(&AgentError) -> bool;
    let cases: Vec<(&str, Provider, Vec<String>, Check)> = vec![
        (
            "openai: cut before [DONE]",
            Provider::OpenAi,
            vec![text_chunk.clone()],
            |e| {
                e == &AgentError::transient(
                    "chat completions stream ended before the answer was complete",
                )
            },
        ),
        (
            "openai: a chunk that is not JSON",
            Provider::OpenAi,
            vec![text_chunk.clone(), "data: {oops\n\n".into()],
            |e| matches!(e, AgentError::Permanent(m) if m.starts_with("malformed stream chunk")),
        ),
        (
            "openai: an error chunk",
            Provider::OpenAi,
            vec![
                text_chunk,
                sse(&json!({"error": {"type": "server_error", "message": "lost it"}})),
            ],
            |e| {
                e == &AgentError::transient("chat completions stream failed: server_error: lost it")
            },
        ),
        (
            "anthropic: cut before message_stop",
            Provider::Anthropic,
            vec![start.clone()],
            |e| e == &AgentError::transient("messages stream ended before message_stop"),
        ),
        (
            "anthropic: overloaded mid-stream",
            Provider::Anthropic,
            vec![
                start,
                anthropic_sse(
                    &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                ),
            ],
            |e| e == &AgentError::transient("messages stream failed: overloaded_error: Overloaded"),
        ),
    ];
    for (name, provider, events, check) in cases {
        let stub = Stub::start(vec![Reply::events(&events, None)]).await;
        let sink = |_: &str| {};
        let got = provider
            .agent(&stub)
            .next_streaming(
                Conversation {
                    system: "",
                    turns: &turns,
                    tools: &[],
                },
                &sink,
            )
            .await;
        assert!(got.as_ref().is_err_and(check), "{name}: {got:?}");
        stub.stop().await;
    }
}

#[actix_rt::test]
async fn a_server_that_ignores_stream_answers_once_and_the_text_is_one_delta() {
    let stub = Stub::start(vec![Reply::json(
        200,
        json!({"choices": [{"message": {"content": "whole"}}], "usage": {"prompt_tokens": 2, "completion_tokens": 1}}),
    )])
    .await;
    let deltas = Deltas::new();
    let sink = deltas.sink();
    let turns = [user_turn("hello")];
    let turn = stub
        .openai()
        .next_streaming(
            Conversation {
                system: "",
                turns: &turns,
                tools: &[],
            },
            &sink,
        )
        .await
        .unwrap();
    assert_eq!(turn.text, "whole");
    assert_eq!(
        turn.usage,
        Some(Usage {
            input_tokens: 2,
            output_tokens: 1
        })
    );
    assert_eq!(deltas.got(), vec!["whole"]);
    stub.stop().await;
}

#[tokio::test]
async fn scripted_usage_sums_over_a_run_without_a_network() {
    // A three-step scripted run, driven by hand: every answer reports usage; the sum is deterministic.
    let agent = ScriptedAgent::new();
    let mut turns = vec![user_turn("steps=2 tool=echo answer=ok")];
    let mut total = Usage::default();
    loop {
        let turn = agent
            .next(Conversation {
                system: "be brief",
                turns: &turns,
                tools: &[],
            })
            .await
            .unwrap();
        total += turn.usage.expect("scripted usage");
        turns.push(turn.to_turn());
        if turn.calls.is_empty() {
            break;
        }
        let c = &turn.calls[0];
        turns.push(results_turn(
            &[ToolResult {
                call_id: c.call_id.clone(),
                tool: c.tool.clone(),
                ok: true,
                output: "step done".into(),
            }],
            &[],
        ));
    }
    // In: 2+3, 2+3+3+2, 2+3+3+2+3+2 words/calls; out: 3, 3, 1.
    assert_eq!(
        total,
        Usage {
            input_tokens: 30,
            output_tokens: 7
        }
    );
}
