//! External tools across a crash (SPEC §6.2, §8.3) on the real binary: a local stub on `127.0.0.1:0`
//! serves an HTTP tool endpoint (counting calls per `Idempotency-Key`, holding each call open ~1.5 s so
//! an `/admin/crash` lands mid-call) and a minimal MCP server (JSON-RPC over HTTP). The next process
//! settles the call in flight by the tool's flags: a mutating HTTP tool → effects unknown (never
//! re-sent), an idempotent HTTP tool → re-sent with the same key, a read-only MCP tool → re-run.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storage::RunId;

use serde_json::{json, Value};
use storage::record::{RunRecord, RunStatus};
use storage::{RunStore, SqliteStore, Synchronous};
use support::child::{http, now_ms, Proc};

const DEADLINE: Duration = Duration::from_secs(30);
/// How long the stub holds each tool call open.
const HOLD: Duration = Duration::from_millis(1500);

// ---- the stub: an HTTP tool endpoint and an MCP server on one std listener ----

/// One call the stub received: the tool path (`/tool` or the MCP tool name) and its key.
#[derive(Debug, Clone)]
struct Seen {
    what: String,
    key: Option<String>,
}

#[derive(Clone, Default)]
struct Stub {
    addr: String,
    calls: Arc<Mutex<Vec<Seen>>>,
}

impl Stub {
    fn start() -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stub = Stub {
            addr: listener.local_addr().unwrap().to_string(),
            calls: Arc::default(),
        };
        let shared = stub.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let stub = shared.clone();
                std::thread::spawn(move || stub.serve(conn));
            }
        });
        stub
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn calls(&self) -> Vec<Seen> {
        self.calls.lock().unwrap().clone()
    }

    /// Requests on one connection (keep-alive) until it closes.
    fn serve(&self, conn: TcpStream) {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut out = conn;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let path = line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_owned();
            let mut headers = HashMap::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 {
                    return;
                }
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                }
            }
            let len: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (status, answer) = self.handle(&path, &headers, &body);
            let text = answer.map(|a| a.to_string()).unwrap_or_default();
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nMcp-Session-Id: sess-1\r\nContent-Length: {}\r\n\r\n",
                text.len()
            );
            if out
                .write_all(head.as_bytes())
                .and_then(|_| out.write_all(text.as_bytes()))
                .is_err()
            {
                return;
            }
        }
    }

    fn handle(
        &self,
        path: &str,
        headers: &HashMap<String, String>,
        body: &Value,
    ) -> (&'static str, Option<Value>) {
        if path == "/tool" {
            let key = headers.get("idempotency-key").cloned();
            let effects = {
                let mut calls = self.calls.lock().unwrap();
                calls.push(Seen {
                    what: "/tool".into(),
                    key: key.clone(),
                });
                // The endpoint honours the key: one effect per distinct key.
                let mut keys: Vec<_> = calls.iter().filter_map(|c| c.key.clone()).collect();
                keys.sort();
                keys.dedup();
                keys.len()
            };
            std::thread::sleep(HOLD);
            return (
                "200 OK",
                Some(json!({"done": true, "effects": effects, "echo": body["input"]})),
            );
        }
        // MCP over streamable HTTP, answered as plain JSON.
        let Some(id) = body.get("id").filter(|id| !id.is_null()) else {
            return ("202 Accepted", None);
        };
        let result = match body["method"].as_str().unwrap_or_default() {
            "initialize" => json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                                   "serverInfo": {"name": "crash-mcp", "version": "1.0.0"}}),
            "tools/list" => json!({"tools": [
                {"name": "lookup", "description": "Look a thing up.", "inputSchema": {"type": "object"},
                 "annotations": {"readOnlyHint": true}}
            ]}),
            "tools/call" => {
                let name = body["params"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let key = body["params"]["_meta"]["idempotencyKey"]
                    .as_str()
                    .map(str::to_owned);
                self.calls.lock().unwrap().push(Seen {
                    what: name.clone(),
                    key,
                });
                std::thread::sleep(HOLD);
                json!({"content": [{"type": "text", "text": format!("{name} ok")}], "isError": false})
            }
            _ => {
                return (
                    "200 OK",
                    Some(
                        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}}),
                    ),
                )
            }
        };
        (
            "200 OK",
            Some(json!({"jsonrpc": "2.0", "id": id, "result": result})),
        )
    }
}

// ---- the binary under test ----

fn post_run(p: &Proc, text: &str) -> String {
    let (status, body) = http(|c| {
        c.post(p.url("/api/messages"))
            .json(&json!({"thread": "t1", "channel": "k", "user": "u", "text": text}))
    });
    assert_eq!(status, 202, "{body}");
    body["runId"].as_str().expect("runId").to_owned()
}

fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    support::child::wait_for(what, DEADLINE, check)
}

fn final_record(data: &Path, run_id: &str) -> RunRecord {
    wait_for(&format!("the final record of {run_id}"), || {
        SqliteStore::open(&data.join("switchboard.db"), Synchronous::Normal)
            .ok()?
            .get(&RunId::from(run_id), now_ms())
            .ok()
            .flatten()
            .filter(|r| !r.head.provisional)
    })
}

fn of_type<'a>(r: &'a RunRecord, kind: &str) -> Vec<&'a Value> {
    r.events.iter().filter(|e| e["type"] == kind).collect()
}

/// A temp data dir holding `config.toml` with `tools` appended.
fn data_dir(tools: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    std::fs::write(path.join("config.toml"), tools).unwrap();
    (dir, path)
}

/// Start a process, run one call of `tool`, crash while the stub holds it, start the next process and
/// answer the final record and the settlement the `resumed` event names.
fn crash_mid_call(data: &Path, stub: &Stub, tool: &str) -> (RunRecord, Value) {
    let mut a = Proc::start(data, &[]);
    let run_id = post_run(&a, &format!("steps=1 tool={tool} answer=finished"));
    wait_for("the call at the stub", || {
        (!stub.calls().is_empty()).then_some(())
    });
    a.crash();
    assert_eq!(stub.calls().len(), 1, "one call before the crash");
    let _b = Proc::start(data, &[]);
    let record = final_record(data, &run_id);
    let resumed = of_type(&record, "resumed");
    assert_eq!(resumed.len(), 1, "{:?}", record.events);
    let settled = resumed[0]["settled"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(settled.len(), 1, "{}", resumed[0]);
    (record, settled[0].clone())
}

#[test]
fn a_mutating_http_call_in_flight_at_a_crash_is_settled_effects_unknown_and_never_resent() {
    let stub = Stub::start();
    let (_dir, data) = data_dir(&format!(
        "[[tools.http]]\nname = \"charge\"\nurl = \"{}\"\nmutating = true\n",
        stub.url("/tool")
    ));
    let (record, settled) = crash_mid_call(&data, &stub, "charge");
    assert_eq!(settled["how"], "effects_unknown", "{settled}");
    let call_id = settled["callId"].clone();
    let result = record
        .events
        .iter()
        .find(|e| e["type"] == "tool_result" && e["callId"] == call_id);
    assert!(
        result.is_some_and(|e| e["effectsUnknown"] == true && e["ok"] == false),
        "{:?}",
        record.events
    );
    assert_eq!(
        record.head.status,
        RunStatus::Completed,
        "{:?}",
        record.events
    );
    // Nothing re-sent: the endpoint saw the call once.
    assert_eq!(stub.calls().len(), 1, "{:?}", stub.calls());
}

#[test]
fn an_idempotent_http_call_in_flight_at_a_crash_is_resent_with_the_same_key() {
    let stub = Stub::start();
    let (_dir, data) = data_dir(&format!(
        "[[tools.http]]\nname = \"book\"\nurl = \"{}\"\nmutating = true\nidempotent = true\n",
        stub.url("/tool")
    ));
    let (record, settled) = crash_mid_call(&data, &stub, "book");
    assert_eq!(settled["how"], "resent", "{settled}");
    assert_eq!(
        record.head.status,
        RunStatus::Completed,
        "{:?}",
        record.events
    );
    let calls = stub.calls();
    assert_eq!(calls.len(), 2, "sent, then re-sent: {calls:?}");
    let key = calls[0].key.clone().expect("an Idempotency-Key");
    assert_eq!(
        key,
        format!("{}/{}", record.head.id, settled["callId"].as_str().unwrap())
    );
    assert_eq!(
        calls[1].key.as_deref(),
        Some(key.as_str()),
        "the same key both times"
    );
    // One effect: the endpoint deduplicated by key, and the result the run kept says so.
    let call_id = settled["callId"].clone();
    let result = record
        .events
        .iter()
        .find(|e| e["type"] == "tool_result" && e["callId"] == call_id && e["ok"] == true);
    assert!(
        result.is_some_and(|e| e.get("effectsUnknown").is_none_or(|v| v != true)),
        "{:?}",
        record.events
    );
    assert_eq!(
        of_type(&record, "answer")
            .first()
            .map(|a| a["text"].clone()),
        Some(json!("finished"))
    );
}

#[test]
fn a_read_only_mcp_call_in_flight_at_a_crash_is_rerun() {
    let stub = Stub::start();
    let (_dir, data) = data_dir(&format!(
        "[[tools.mcp]]\nname = \"srv\"\nurl = \"{}\"\n",
        stub.url("/mcp")
    ));
    let (record, settled) = crash_mid_call(&data, &stub, "srv__lookup");
    assert_eq!(settled["how"], "rerun", "{settled}");
    assert_eq!(
        record.head.status,
        RunStatus::Completed,
        "{:?}",
        record.events
    );
    let calls = stub.calls();
    assert_eq!(calls.len(), 2, "called, then re-run: {calls:?}");
    assert!(calls.iter().all(|c| c.what == "lookup"), "{calls:?}");
    let call_id = settled["callId"].clone();
    let result = record
        .events
        .iter()
        .find(|e| e["type"] == "tool_result" && e["callId"] == call_id && e["ok"] == true);
    assert!(result.is_some(), "{:?}", record.events);
}
