//! External tools (SPEC §8.3) against local servers on `127.0.0.1:0`: an HTTP tool endpoint that counts
//! calls per `Idempotency-Key` and verifies their signature, and a minimal MCP server (JSON-RPC over
//! HTTP: `initialize`, `tools/list` with annotations, `tools/call`, answering some requests as SSE) whose
//! tools come back prefixed, sanitised and flagged from their annotations. Mutating calls check the
//! workspace fence before they send anything.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storage::RunId;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actors::tools::{
    external_tools, take_workspace, workspace_dir, ExternalToolError, ExternalToolsSettings,
    HttpToolSpec, McpServerSpec, TakeMode, Tool, ToolContext, ToolOutput, Toolbox,
};
use serde_json::{json, Value};

/// The run's owner, and the one that took the workspace over.
const GEN_A: &str = "20260101T000000Z-aaaaaaaa";
const GEN_B: &str = "20260101T000500Z-bbbbbbbb";
const RUN: &str = "run-1";
const SECRET: &[u8] = b"tool secret";

/// A taken workspace and a context owning it.
fn owned_ctx(dir: &Path) -> ToolContext {
    let workspace = workspace_dir(dir, &RunId::from(RUN));
    take_workspace(&workspace, GEN_A, TakeMode::Create).unwrap();
    ToolContext {
        run_id: RUN.into(),
        workspace,
        gen: GEN_A.into(),
        claim: None,
    }
}

/// Start `HttpServer::new($app)` on `127.0.0.1:0`: `(base url, handle)`.
macro_rules! spawn_server {
    ($app:expr) => {{
        let server = HttpServer::new($app)
            .workers(1)
            .disable_signals()
            .shutdown_timeout(0)
            .bind(("127.0.0.1", 0))
            .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        (format!("http://{addr}"), handle)
    }};
}

// ---- HTTP tools ----

/// What the tool endpoint saw: calls per `Idempotency-Key`, and each call's body and whether its
/// signature verified (`webhook-id` = the key).
#[derive(Default)]
struct ToolLog {
    per_key: HashMap<String, u32>,
    calls: Vec<(Value, bool)>,
}

/// `/ok` answers `{"echo": input, "count": n}`, `/text` a JSON string, `/fail` 500, `/plain` a non-JSON
/// 200, `/slow` after 2 s.
fn start_tool_server() -> (String, Arc<Mutex<ToolLog>>, actix_web::dev::ServerHandle) {
    let log: Arc<Mutex<ToolLog>> = Arc::default();
    let shared = log.clone();
    let (base, handle) = spawn_server!(move || {
        let log = shared.clone();
        App::new().route(
            "/{kind}",
            web::post().to(
                move |req: HttpRequest, path: web::Path<String>, bytes: web::Bytes| {
                    let log = log.clone();
                    async move {
                        let header = |n: &str| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned)
                        };
                        let key = header("idempotency-key").unwrap_or_default();
                        let verified = match (
                            header("webhook-id"),
                            header("webhook-timestamp"),
                            header("webhook-signature"),
                        ) {
                            (Some(id), Some(ts), Some(sig)) => {
                                id == key
                                    && ts.parse().is_ok_and(|ts| {
                                        actors::delivery::verify(SECRET, &id, ts, &bytes, &sig)
                                    })
                            }
                            _ => false,
                        };
                        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        let count = {
                            let mut log = log.lock().unwrap();
                            log.calls.push((body.clone(), verified));
                            let n = log.per_key.entry(key).or_default();
                            *n += 1;
                            *n
                        };
                        match path.as_str() {
                            "ok" => HttpResponse::Ok()
                                .json(json!({"echo": body["input"], "count": count})),
                            "text" => HttpResponse::Ok().json("plain words"),
                            "fail" => HttpResponse::InternalServerError().body("boom"),
                            "plain" => HttpResponse::Ok().body("<html>"),
                            "slow" => {
                                actix_rt::time::sleep(Duration::from_secs(2)).await;
                                HttpResponse::Ok().json(json!({}))
                            }
                            _ => HttpResponse::NotFound().finish(),
                        }
                    }
                },
            ),
        )
    });
    (base, log, handle)
}

fn http_spec(name: &str, url: String) -> HttpToolSpec {
    HttpToolSpec {
        name: name.into(),
        description: format!("{name} tool"),
        input_schema: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        url,
        mutating: true,
        idempotent: true,
        timeout: Duration::from_secs(5),
        approval: false,
    }
}

async fn http_tools(specs: Vec<HttpToolSpec>) -> Vec<Arc<dyn Tool>> {
    let settings = ExternalToolsSettings {
        http: specs,
        mcp: vec![],
        secret: Some(SECRET.to_vec()),
    };
    external_tools(&settings, &reqwest::Client::new())
        .await
        .unwrap()
}

#[actix_rt::test]
async fn an_http_tool_posts_run_call_and_input_with_the_idempotency_key_and_a_signature() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = owned_ctx(dir.path());
    let (base, log, server) = start_tool_server();
    let tools = http_tools(vec![http_spec("weather", format!("{base}/ok"))]).await;
    let toolbox = Toolbox::builtin().with_external(tools).unwrap();
    let tool = toolbox.get("weather").unwrap();
    let def = tool.def();
    assert_eq!(
        (def.side_effect_free, def.rerun_safe, tool.idempotent()),
        (false, false, true)
    );
    assert_eq!(def.parameters["properties"]["city"]["type"], "string");

    // The first attempt, and the same call re-sent after a resume: one key, counted twice.
    let args = json!({"city": "Köln"});
    let first = tool.call_keyed(&ctx, "call-1", &args).await;
    assert_eq!(
        first,
        ToolOutput::ok(r#"{"count":1,"echo":{"city":"Köln"}}"#)
    );
    let again = tool.call_keyed(&ctx, "call-1", &args).await;
    assert_eq!(
        again,
        ToolOutput::ok(r#"{"count":2,"echo":{"city":"Köln"}}"#)
    );
    let other = tool.call_keyed(&ctx, "call-2", &args).await;
    assert!(
        other.ok && other.output.contains(r#""count":1"#),
        "{other:?}"
    );

    {
        let log = log.lock().unwrap();
        assert_eq!(log.per_key.get("run-1/call-1"), Some(&2));
        assert_eq!(log.per_key.get("run-1/call-2"), Some(&1));
        assert_eq!(
            log.calls[0].0,
            json!({"runId": RUN, "callId": "call-1", "input": {"city": "Köln"}})
        );
        assert!(
            log.calls.iter().all(|(_, verified)| *verified),
            "every call was signed with webhook-id = the key"
        );
    }
    server.stop(false).await;
}

/// SPEC §13: `[[tools.http]] approval = true` makes every call of the tool wait for a person, whichever
/// agent makes it; the built-ins and an HTTP tool without it do not.
#[actix_rt::test]
async fn an_http_tool_declared_approval_requires_it_and_others_do_not() {
    let gated = HttpToolSpec {
        approval: true,
        ..http_spec("deploy", "http://127.0.0.1:9/deploy".into())
    };
    let tools = http_tools(vec![
        gated,
        http_spec("weather", "http://127.0.0.1:9/w".into()),
    ])
    .await;
    let toolbox = Toolbox::builtin().with_external(tools).unwrap();
    let needs = |name: &str| toolbox.get(name).unwrap().requires_approval();
    assert!(needs("deploy"));
    assert!(!needs("weather"));
    assert!(!needs("append_file"));
}

#[actix_rt::test]
async fn http_tool_failures_are_ok_false_results() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = owned_ctx(dir.path());
    let (base, log, server) = start_tool_server();
    let mut slow = http_spec("slow", format!("{base}/slow"));
    slow.timeout = Duration::from_millis(200);
    let tools = http_tools(vec![
        http_spec("fail", format!("{base}/fail")),
        http_spec("plain", format!("{base}/plain")),
        http_spec("text", format!("{base}/text")),
        slow,
    ])
    .await;
    let by_name: HashMap<String, Arc<dyn Tool>> =
        tools.into_iter().map(|t| (t.def().name, t)).collect();
    let args = json!({});

    let fail = by_name["fail"].call_keyed(&ctx, "c1", &args).await;
    assert_eq!(fail, ToolOutput::err("http tool `fail` answered 500: boom"));
    let plain = by_name["plain"].call_keyed(&ctx, "c2", &args).await;
    assert_eq!(
        plain,
        ToolOutput::err("http tool `plain` answered 200 with a body that is not JSON")
    );
    let slow = by_name["slow"].call_keyed(&ctx, "c3", &args).await;
    assert_eq!(
        slow,
        ToolOutput::err("http tool `slow` timed out after 200 ms (its effects are unknown)")
    );
    // A JSON string body is the result's text.
    assert_eq!(
        by_name["text"].call_keyed(&ctx, "c4", &args).await,
        ToolOutput::ok("plain words")
    );
    // Without a call id there is no key: refused, nothing sent.
    let unkeyed = by_name["text"].call(&ctx, &args).await;
    assert!(
        !unkeyed.ok && unkeyed.output.contains("needs a call id"),
        "{unkeyed:?}"
    );
    assert_eq!(log.lock().unwrap().calls.len(), 4);
    server.stop(false).await;
}

#[actix_rt::test]
async fn a_mutating_http_call_after_a_takeover_is_fenced_and_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = owned_ctx(dir.path());
    let (base, log, server) = start_tool_server();
    let mut read_only = http_spec("lookup", format!("{base}/ok"));
    read_only.mutating = false;
    let tools = http_tools(vec![http_spec("weather", format!("{base}/ok")), read_only]).await;
    let (weather, lookup) = (&tools[0], &tools[1]);
    assert_eq!(
        (
            lookup.def().side_effect_free,
            lookup.def().rerun_safe,
            lookup.idempotent()
        ),
        (true, true, false)
    );

    // Generation B resumes the run and takes the workspace; A is still running.
    take_workspace(&ctx.workspace, GEN_B, TakeMode::Existing).unwrap();
    let late = weather.call_keyed(&ctx, "call-9", &json!({})).await;
    assert!(
        !late.ok && late.output.starts_with("fenced: ") && late.output.contains(GEN_B),
        "{late:?}"
    );
    assert!(
        log.lock().unwrap().calls.is_empty(),
        "a fenced call sends nothing"
    );
    // A read-only call has no effects to fence.
    assert!(lookup.call_keyed(&ctx, "call-10", &json!({})).await.ok);
    // A workspace that is gone fences too.
    let gone = ToolContext {
        workspace: dir.path().join("nowhere"),
        ..ctx.clone()
    };
    assert!(weather
        .call_keyed(&gone, "call-11", &json!({}))
        .await
        .output
        .starts_with("fenced: "));
    assert_eq!(log.lock().unwrap().calls.len(), 1);
    server.stop(false).await;
}

#[actix_rt::test]
async fn bad_entries_are_refused_naming_the_entry() {
    let http = reqwest::Client::new();
    let build = |specs: Vec<HttpToolSpec>| {
        let settings = ExternalToolsSettings {
            http: specs,
            ..Default::default()
        };
        let http = http.clone();
        async move { external_tools(&settings, &http).await.map(|t| t.len()) }
    };
    let ok = || http_spec("fine", "http://127.0.0.1:9/x".into());

    let e = build(vec![
        ok(),
        HttpToolSpec {
            name: "get.weather".into(),
            ..ok()
        },
    ])
    .await
    .unwrap_err();
    assert_eq!(
        e,
        ExternalToolError::BadName {
            key: "tools.http[1].name".into(),
            name: "get.weather".into()
        }
    );
    let e = build(vec![HttpToolSpec {
        url: "ftp://x".into(),
        ..ok()
    }])
    .await
    .unwrap_err();
    assert!(
        matches!(&e, ExternalToolError::BadUrl { key, .. } if key == "tools.http[0].url"),
        "{e:?}"
    );
    let e = build(vec![HttpToolSpec {
        input_schema: json!({"type": "string"}),
        ..ok()
    }])
    .await
    .unwrap_err();
    assert!(matches!(e, ExternalToolError::BadSchema { .. }), "{e:?}");
    let e = build(vec![ok(), ok()]).await.unwrap_err();
    assert!(
        e.to_string().contains("tools.http[0] and tools.http[1]"),
        "{e}"
    );
    // A schema given as a JSON string is parsed; none at all is an empty object schema.
    assert_eq!(
        build(vec![HttpToolSpec {
            input_schema: json!(r#"{"type":"object"}"#),
            ..ok()
        }])
        .await,
        Ok(1)
    );
    assert_eq!(
        build(vec![HttpToolSpec {
            input_schema: Value::Null,
            ..ok()
        }])
        .await,
        Ok(1)
    );

    // An external tool cannot replace a built-in.
    let echo = external_tools(
        &ExternalToolsSettings {
            http: vec![HttpToolSpec {
                name: "echo".into(),
                ..ok()
            }],
            ..Default::default()
        },
        &http,
    )
    .await
    .unwrap();
    let e = Toolbox::builtin().with_external(echo).unwrap_err();
    assert_eq!(
        e,
        ExternalToolError::Taken {
            name: "echo".into()
        }
    );

    // An MCP server that is not there stops boot, named.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let settings = ExternalToolsSettings {
        mcp: vec![McpServerSpec {
            prefix: "srv".into(),
            url: format!("http://{closed}/mcp"),
            timeout: Duration::from_secs(2),
        }],
        ..Default::default()
    };
    let e = external_tools(&settings, &http)
        .await
        .map(|t| t.len())
        .unwrap_err();
    assert!(
        matches!(&e, ExternalToolError::McpUnavailable { key, .. } if key == "tools.mcp[0]"),
        "{e:?}"
    );
}

// ---- MCP ----

/// What the MCP server saw: each request's method, session header, and for `tools/call` the tool name,
/// arguments and `_meta.idempotencyKey`.
#[derive(Default)]
struct McpLog {
    methods: Vec<(String, Option<String>)>,
    calls: Vec<(String, Value, Option<String>)>,
}

const SESSION: &str = "sess-7f3a";

fn long_tool_name() -> String {
    format!("very_{}", "long".repeat(20))
}

/// The tools the server lists: one per annotation case, one needing sanitising, one too long.
fn listed_tools() -> Value {
    json!([
        {"name": "read_thing", "description": "Read a thing.",
         "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
         "annotations": {"readOnlyHint": true}},
        {"name": "put.thing", "description": "Store a thing.", "inputSchema": {"type": "object"},
         "annotations": {"idempotentHint": true, "readOnlyHint": false}},
        {"name": "launch", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": true}},
        {"name": "plain", "inputSchema": {"type": "object"}},
        {"name": long_tool_name(), "inputSchema": {"type": "object"}},
    ])
}

/// A JSON-RPC answer, as JSON or as one SSE `message` event.
fn rpc_answer(id: &Value, result: Value, sse: bool) -> HttpResponse {
    let message = json!({"jsonrpc": "2.0", "id": id, "result": result});
    let mut response = HttpResponse::Ok();
    response.insert_header(("Mcp-Session-Id", SESSION));
    if sse {
        response
            .content_type("text/event-stream")
            .body(format!("event: message\ndata: {message}\n\n"))
    } else {
        response
            .content_type("application/json")
            .body(message.to_string())
    }
}

fn start_mcp_server() -> (String, Arc<Mutex<McpLog>>, actix_web::dev::ServerHandle) {
    let log: Arc<Mutex<McpLog>> = Arc::default();
    let shared = log.clone();
    let (base, handle) = spawn_server!(move || {
        let log = shared.clone();
        App::new()
            .route(
                "/mcp",
                web::post().to(move |req: HttpRequest, bytes: web::Bytes| {
                    let log = log.clone();
                    async move {
                        let session = req.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
                        let Ok(msg) = serde_json::from_slice::<Value>(&bytes) else {
                            return HttpResponse::BadRequest().finish();
                        };
                        let method = msg["method"].as_str().unwrap_or_default().to_owned();
                        log.lock().unwrap().methods.push((method.clone(), session.clone()));
                        if method != "initialize" && session.as_deref() != Some(SESSION) {
                            return HttpResponse::BadRequest().body("missing session");
                        }
                        let Some(id) = msg.get("id").filter(|id| !id.is_null()) else {
                            // A notification or a response: accepted, no body.
                            return HttpResponse::Accepted().finish();
                        };
                        let params = &msg["params"];
                        match method.as_str() {
                            "initialize" => rpc_answer(
                                id,
                                json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                                       "serverInfo": {"name": "test-mcp", "version": "1.0.0"}}),
                                false,
                            ),
                            "tools/list" => rpc_answer(id, json!({"tools": listed_tools()}), false),
                            "tools/call" => {
                                let name = params["name"].as_str().unwrap_or_default().to_owned();
                                let args = params["arguments"].clone();
                                let key = params["_meta"]["idempotencyKey"].as_str().map(str::to_owned);
                                log.lock().unwrap().calls.push((name.clone(), args.clone(), key));
                                let result = if args["fail"] == json!(true) {
                                    json!({"content": [{"type": "text", "text": "launch aborted"}], "isError": true})
                                } else {
                                    json!({"content": [{"type": "text", "text": format!("{name} ok")},
                                                       {"type": "text", "text": args.to_string()}],
                                           "isError": false})
                                };
                                // Calls answer as an SSE stream; the rest as plain JSON.
                                rpc_answer(id, result, true)
                            }
                            _ => HttpResponse::Ok().json(json!({"jsonrpc": "2.0", "id": id,
                                "error": {"code": -32601, "message": "method not found"}})),
                        }
                    }
                }),
            )
            .route("/mcp", web::get().to(|| async { HttpResponse::MethodNotAllowed().finish() }))
            .route("/mcp", web::delete().to(|| async { HttpResponse::Ok().finish() }))
    });
    (format!("{base}/mcp"), log, handle)
}

async fn mcp_tools(url: String) -> HashMap<String, Arc<dyn Tool>> {
    let settings = ExternalToolsSettings {
        mcp: vec![McpServerSpec {
            prefix: "srv".into(),
            url,
            timeout: Duration::from_secs(5),
        }],
        ..Default::default()
    };
    let tools = external_tools(&settings, &reqwest::Client::new())
        .await
        .expect("mcp tools");
    tools.into_iter().map(|t| (t.def().name, t)).collect()
}

#[actix_rt::test]
async fn an_mcp_server_s_tools_are_prefixed_sanitised_and_flagged_from_annotations() {
    let (url, log, server) = start_mcp_server();
    let tools = mcp_tools(url).await;

    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort();
    let long = names
        .iter()
        .find(|n| n.starts_with("srv__very_"))
        .copied()
        .unwrap_or_default();
    assert_eq!(
        names,
        vec![
            "srv__launch",
            "srv__plain",
            "srv__put_thing",
            "srv__read_thing",
            long
        ]
    );
    assert_eq!(long.len(), 64, "{long}");
    for name in &names {
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{name}"
        );
    }
    // (side-effect free, rerun safe, idempotent) per annotation.
    let flags = |n: &str| {
        let t = &tools[n];
        (t.def().side_effect_free, t.def().rerun_safe, t.idempotent())
    };
    assert_eq!(flags("srv__read_thing"), (true, true, false));
    assert_eq!(flags("srv__put_thing"), (false, false, true));
    assert_eq!(flags("srv__launch"), (false, false, false));
    assert_eq!(flags("srv__plain"), (false, false, false));
    let read = tools["srv__read_thing"].def();
    assert_eq!(read.description, "Read a thing.");
    assert_eq!(read.parameters["properties"]["id"]["type"], "string");

    // The boot handshake: initialize (no session yet), then everything under the session it gave.
    let methods = log.lock().unwrap().methods.clone();
    assert_eq!(methods[0], ("initialize".to_owned(), None));
    assert!(
        methods
            .iter()
            .any(|(m, s)| m == "tools/list" && s.as_deref() == Some(SESSION)),
        "{methods:?}"
    );
    server.stop(false).await;
}

#[actix_rt::test]
async fn an_mcp_call_round_trips_with_the_key_in_meta() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = owned_ctx(dir.path());
    let (url, log, server) = start_mcp_server();
    let tools = mcp_tools(url).await;

    let out = tools["srv__put_thing"]
        .call_keyed(&ctx, "call-7", &json!({"id": "a", "value": 1}))
        .await;
    assert_eq!(
        out,
        ToolOutput::ok("put.thing ok\n{\"id\":\"a\",\"value\":1}")
    );
    let again = tools["srv__put_thing"]
        .call_keyed(&ctx, "call-7", &json!({"id": "a", "value": 1}))
        .await;
    assert!(again.ok, "{again:?}");
    let failed = tools["srv__launch"]
        .call_keyed(&ctx, "call-8", &json!({"fail": true}))
        .await;
    assert_eq!(failed, ToolOutput::err("launch aborted"));
    let bad_args = tools["srv__launch"]
        .call_keyed(&ctx, "call-9", &json!([1]))
        .await;
    assert_eq!(bad_args, ToolOutput::err("args must be a JSON object"));

    let calls = log.lock().unwrap().calls.clone();
    assert_eq!(
        calls,
        vec![
            // The server sees its own tool name and the key `<runId>/<callId>`, the same on a re-send.
            (
                "put.thing".to_owned(),
                json!({"id": "a", "value": 1}),
                Some("run-1/call-7".to_owned())
            ),
            (
                "put.thing".to_owned(),
                json!({"id": "a", "value": 1}),
                Some("run-1/call-7".to_owned())
            ),
            (
                "launch".to_owned(),
                json!({"fail": true}),
                Some("run-1/call-8".to_owned())
            ),
        ]
    );
    assert!(
        log.lock()
            .unwrap()
            .methods
            .iter()
            .skip(1)
            .all(|(_, s)| s.as_deref() == Some(SESSION)),
        "every request after initialize carries the session"
    );
    server.stop(false).await;
}

#[actix_rt::test]
async fn a_mutating_mcp_call_after_a_takeover_is_fenced_and_a_read_only_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = owned_ctx(dir.path());
    let (url, log, server) = start_mcp_server();
    let tools = mcp_tools(url).await;
    take_workspace(&ctx.workspace, GEN_B, TakeMode::Existing).unwrap();

    let late = tools["srv__put_thing"]
        .call_keyed(&ctx, "call-1", &json!({}))
        .await;
    assert!(!late.ok && late.output.starts_with("fenced: "), "{late:?}");
    let read = tools["srv__read_thing"]
        .call_keyed(&ctx, "call-2", &json!({"id": "x"}))
        .await;
    assert!(read.ok, "{read:?}");
    let calls = log.lock().unwrap().calls.clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "read_thing");
    server.stop(false).await;
}
