//! A local stand-in for Slack's Web API, for tests and `switchboard chaos` only: never a Slack
//! replacement. It answers `chat.postMessage` and `chat.update` with Slack's documented shapes and
//! remembers every message, so a test can read what a thread shows.
//!
//! Owns a loopback HTTP server (`127.0.0.1:0`) on its own OS thread with its own actix `System`, so it
//! serves whatever runtime its caller runs — plain synchronous code, a tokio current-thread runtime, an
//! actix test — and a caller that blocks does not stall it. Dropping the [`SlackStub`] (or
//! [`SlackStub::stop`]) stops the server and joins its thread.
//!
//! What it answers, in this order (every call is counted first, see [`StubCounters`]):
//!
//! | the call                                                     | the answer                                        |
//! |--------------------------------------------------------------|---------------------------------------------------|
//! | while [`SlackStub::rate_limit_next`] has calls left           | http 429, `Retry-After: <secs>`, `{ok: false, error: "ratelimited"}` |
//! | a method other than `chat.postMessage`, `chat.update`        | `{ok: false, error: "unknown_method"}`            |
//! | no `Authorization: Bearer …`                                 | `{ok: false, error: "not_authed"}`                |
//! | a bearer token other than [`SlackStub::token`]               | `{ok: false, error: "invalid_auth"}`              |
//! | a body that is not a JSON object                             | `{ok: false, error: "invalid_json"}`              |
//! | a channel marked by [`SlackStub::missing_channel`] (or none) | `{ok: false, error: "channel_not_found"}`         |
//! | a `text` over 40,000 characters                              | `{ok: false, error: "msg_too_long"}`              |
//! | `chat.postMessage` without `text` or `blocks`                | `{ok: false, error: "no_text"}`                   |
//! | `chat.postMessage`                                           | `{ok: true, channel, ts, message: {…}}`; `ts` unique and increasing (`1700000000.000101`, …) |
//! | `chat.update` of an unknown, deleted or other channel's `ts` | `{ok: false, error: "message_not_found"}`         |
//! | `chat.update`                                                | `{ok: true, channel, ts, text, message: {…}}`; the edit is appended to the message's `edits` |
//!
//! A message's kind is its `metadata.event_type` (`switchboard_card` a card, `switchboard_reply` a
//! reply, anything else or none [`MessageKind::Other`]); its run id is `metadata.event_payload.run_id`.
//!
//! Invariants: every collection is bounded — at most [`MAX_MESSAGES`] messages (the oldest is dropped
//! first), [`MAX_EDITS`] edits kept per message (later edits still change its text), [`MAX_MISSING_CHANNELS`]
//! missing channels — and what was dropped is counted. Nothing is written to disk or logged.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use storage::RunId;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};

/// The bot token the stub accepts (a fixed test value, shaped like Slack's so the redactor knows it).
pub const STUB_BOT_TOKEN: &str = "xoxb-test-000000000000-switchboardstub";
/// The most messages remembered; past it the oldest is forgotten (counted in `messages_dropped`).
pub const MAX_MESSAGES: usize = 100_000;
/// The most edits kept per message; later edits still change the text (counted in `edits_dropped`).
pub const MAX_EDITS: usize = 1_000;
/// The most channels that can be marked missing at once; further marks are ignored.
pub const MAX_MISSING_CHANNELS: usize = 10_000;
/// Slack refuses a longer `text` (`msg_too_long`).
const MAX_TEXT_CHARS: usize = 40_000;
/// The largest request body read.
const MAX_BODY_BYTES: usize = 1 << 20;
/// The first message's `ts` is this many seconds, then counts up in millionths.
const TS_EPOCH_SECS: u64 = 1_700_000_000;
/// The stub bot's user and bot ids, as Slack shows them on the bot's messages.
const BOT_USER: &str = "U0STUBBOT";
const BOT_ID: &str = "B0STUBBOT";

/// What a message is, by its `metadata.event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    /// `switchboard_card`: a run's status card.
    Card,
    /// `switchboard_reply`: a run's answer.
    Reply,
    /// Any other event type, or no metadata.
    Other,
}

/// One `chat.update` of a message, as it left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubEdit {
    pub text: String,
    /// The Stop button's value (a run id) in the edit's blocks, if it has one.
    pub stop_button: Option<String>,
}

/// A message as the stub holds it: posted, then edited in place.
#[derive(Debug, Clone, PartialEq)]
pub struct StubMessage {
    pub channel: String,
    /// The thread it was posted in (`None` for a top-level message).
    pub thread_ts: Option<String>,
    pub ts: String,
    /// Its current text (the last edit's, if edited).
    pub text: String,
    pub kind: MessageKind,
    /// `metadata.event_payload.run_id` of the post, if any.
    pub run_id: Option<RunId>,
    /// The Stop button's value in its current blocks.
    pub stop_button: Option<String>,
    /// Its current blocks as sent.
    pub blocks: Option<Value>,
    /// Every `chat.update` in order (the first [`MAX_EDITS`]).
    pub edits: Vec<StubEdit>,
    /// Deleted by [`SlackStub::delete`]: updates answer `message_not_found`.
    pub deleted: bool,
}

impl StubMessage {
    /// The values of its current buttons with `action_id` (`approve`, `deny`, `stop`), in block order.
    pub fn buttons(&self, action_id: &str) -> Vec<String> {
        self.blocks
            .as_ref()
            .map(|b| button_values(b, action_id))
            .unwrap_or_default()
    }
}

/// Counts of what the stub was asked and answered. A call is counted under its method before anything
/// else, rate-limited and refused calls included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StubCounters {
    /// `chat.postMessage` calls.
    pub post_message: u64,
    /// `chat.update` calls.
    pub update: u64,
    /// Calls of any other method.
    pub other: u64,
    /// Calls answered 429.
    pub rate_limited: u64,
    /// Replies taken while [`SlackStub::hold_replies`] held them (never answered, never posted).
    pub held: u64,
    /// Calls answered `ok: false` (429s not included).
    pub refused: u64,
    /// Messages forgotten to stay within [`MAX_MESSAGES`].
    pub messages_dropped: u64,
    /// Edits not kept to stay within [`MAX_EDITS`].
    pub edits_dropped: u64,
}

/// What the server and the test share.
#[derive(Default)]
struct State {
    /// By `ts`: every `ts` has the same width, so string order is time order (oldest first).
    messages: BTreeMap<String, StubMessage>,
    /// The last `ts` handed out, in millionths of a second past [`TS_EPOCH_SECS`].
    last_ts: u64,
    /// Calls still to answer 429, and the `Retry-After` to send.
    rate_limited: Option<(u64, u64)>,
    missing_channels: HashSet<String>,
    counters: StubCounters,
    /// Replies are taken and never answered (a Slack that hangs): what a crash during delivery meets.
    hold_replies: bool,
    /// `chat.update` answers http 500 (Slack failing edits).
    fail_updates: bool,
}

/// The state behind a std `Mutex`: it is held only while one request is answered or one snapshot is
/// copied, never across an await, by the server thread and the test alike.
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    /// A poisoned lock still holds consistent state (no update panics half-way): take it.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running stub of Slack's Web API (see the module doc). Stops when dropped.
pub struct SlackStub {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: actix_web::dev::ServerHandle,
    /// The server's thread; `None` once stopped.
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SlackStub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackStub")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SlackStub {
    /// Starts the stub on `127.0.0.1` (a free port) on its own thread; answers once it is serving.
    pub fn start() -> io::Result<SlackStub> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
        });
        let data = web::Data::from(shared.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("slack-stub".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    let server = HttpServer::new(move || {
                        App::new()
                            .app_data(data.clone())
                            .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
                            .route("/api/{method}", web::post().to(api))
                            .route("/api/conversations.replies", web::get().to(replies))
                    })
                    .workers(1)
                    .disable_signals()
                    .shutdown_timeout(0)
                    .listen(listener);
                    let server = match server {
                        Ok(s) => s.run(),
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(Ok(server.handle()));
                    if let Err(e) = server.await {
                        tracing::warn!("slack stub server failed: {e}");
                    }
                })
            })?;
        let server = match rx.recv() {
            Ok(Ok(handle)) => handle,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(io::Error::other(
                    "the slack stub's thread ended before serving",
                ));
            }
        };
        Ok(SlackStub {
            addr,
            shared,
            server,
            thread: Some(thread),
        })
    }

    /// The `api_base_url` to configure: `http://127.0.0.1:<port>/api`.
    pub fn url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    /// The address the stub listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bot token the stub accepts ([`STUB_BOT_TOKEN`]).
    pub fn token(&self) -> &'static str {
        STUB_BOT_TOKEN
    }

    /// Every message remembered, oldest first (deleted ones included, marked).
    pub fn messages(&self) -> Vec<StubMessage> {
        self.shared.lock().messages.values().cloned().collect()
    }

    /// The message `ts`, if remembered.
    pub fn message(&self, ts: &str) -> Option<StubMessage> {
        self.shared.lock().messages.get(ts).cloned()
    }

    /// The cards posted in the thread `thread_ts`, oldest first (deleted ones included, marked).
    pub fn cards_in(&self, thread_ts: &str) -> Vec<StubMessage> {
        self.in_thread(thread_ts, MessageKind::Card)
    }

    /// The replies posted in the thread `thread_ts`, oldest first.
    pub fn replies_in(&self, thread_ts: &str) -> Vec<StubMessage> {
        self.in_thread(thread_ts, MessageKind::Reply)
    }

    fn in_thread(&self, thread_ts: &str, kind: MessageKind) -> Vec<StubMessage> {
        self.shared
            .lock()
            .messages
            .values()
            .filter(|m| m.kind == kind && m.thread_ts.as_deref() == Some(thread_ts))
            .cloned()
            .collect()
    }

    /// Deletes the message `ts` as a user would: later updates of it answer `message_not_found`.
    /// Answers whether such a message was remembered.
    pub fn delete(&self, ts: &str) -> bool {
        match self.shared.lock().messages.get_mut(ts) {
            Some(m) => {
                m.deleted = true;
                true
            }
            None => false,
        }
    }

    /// The next `n` calls, of any method, answer http 429 with `Retry-After: <retry_after_secs>`
    /// (replacing any such calls still pending).
    pub fn rate_limit_next(&self, n: u32, retry_after_secs: u64) {
        self.shared.lock().rate_limited = (n > 0).then_some((u64::from(n), retry_after_secs));
    }

    /// From now on, calls naming `channel` answer `channel_not_found`.
    pub fn missing_channel(&self, channel: &str) {
        let mut state = self.shared.lock();
        if state.missing_channels.len() < MAX_MISSING_CHANNELS {
            state.missing_channels.insert(channel.to_owned());
        }
    }

    /// While `hold` is set, a reply (`chat.postMessage` with the reply metadata) is taken and never
    /// answered nor posted — the connection stays open until the caller gives up or dies.
    pub fn hold_replies(&self, hold: bool) {
        self.shared.lock().hold_replies = hold;
    }

    /// While `fail` is set, `chat.update` answers http 500 and changes nothing.
    pub fn fail_updates(&self, fail: bool) {
        self.shared.lock().fail_updates = fail;
    }

    /// What the stub was asked and answered so far.
    pub fn counters(&self) -> StubCounters {
        self.shared.lock().counters
    }

    /// Stops the server and joins its thread (what dropping the stub does).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(thread) = self.thread.take() {
            // `stop` sends the command at once; its future only waits for the completion, which the
            // join below waits for anyway. Graceful, so the server's future ends only once its worker
            // has dropped every connection (a kept-alive one included: `shutdown_timeout(0)` closes it
            // at once); a forced stop ends before the worker does, and a pooled client could still be
            // answered after the drop.
            drop(self.server.stop(true));
            if thread.join().is_err() {
                tracing::warn!("the slack stub's thread panicked");
            }
        }
    }
}

impl Drop for SlackStub {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `POST /api/{method}`: one Web API call (see the module table).
async fn api(
    req: HttpRequest,
    method: web::Path<String>,
    body: web::Bytes,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let method = method.into_inner();
    let is_reply = method == "chat.postMessage"
        && serde_json::from_slice::<Value>(&body)
            .is_ok_and(|b| b["metadata"]["event_type"] == actors::channel::slack::REPLY_EVENT_TYPE);
    let hold = {
        let mut state = shared.lock();
        match method.as_str() {
            "chat.postMessage" => state.counters.post_message += 1,
            "chat.update" => state.counters.update += 1,
            _ => state.counters.other += 1,
        }
        let hold = is_reply && state.hold_replies;
        state.counters.held += u64::from(hold);
        hold
    };
    if hold {
        return held().await;
    }
    let mut state = shared.lock();
    if method == "chat.update" && state.fail_updates {
        return HttpResponse::InternalServerError().finish();
    }
    if let Some(limited) = rate_limited(&mut state) {
        return limited;
    }
    match answer(&mut state, &req, &method, &body) {
        Ok(body) => HttpResponse::Ok().json(body),
        Err(code) => {
            state.counters.refused += 1;
            HttpResponse::Ok().json(json!({"ok": false, "error": code}))
        }
    }
}

/// `GET /api/conversations.replies?channel&ts[&include_all_metadata]`: the thread's messages, oldest
/// first, with their metadata when asked (one page: the stub's threads are short).
async fn replies(
    req: HttpRequest,
    query: web::Query<std::collections::HashMap<String, String>>,
    shared: web::Data<Shared>,
) -> HttpResponse {
    let mut state = shared.lock();
    state.counters.other += 1;
    if let Some(limited) = rate_limited(&mut state) {
        return limited;
    }
    let authed = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {STUB_BOT_TOKEN}"));
    let (Some(channel), Some(ts)) = (query.get("channel"), query.get("ts")) else {
        return HttpResponse::Ok().json(json!({"ok": false, "error": "invalid_arguments"}));
    };
    if !authed {
        return HttpResponse::Ok().json(json!({"ok": false, "error": "invalid_auth"}));
    }
    if state.missing_channels.contains(channel) {
        return HttpResponse::Ok().json(json!({"ok": false, "error": "channel_not_found"}));
    }
    let metadata = query.get("include_all_metadata").map(String::as_str) == Some("true");
    let messages: Vec<Value> = state
        .messages
        .values()
        .filter(|m| {
            !m.deleted
                && &m.channel == channel
                && (&m.ts == ts || m.thread_ts.as_deref() == Some(ts.as_str()))
        })
        .map(|m| {
            let mut v = json!({"type": "message", "ts": m.ts, "text": m.text, "bot_id": BOT_ID,
                "thread_ts": m.thread_ts});
            let event_type = match m.kind {
                MessageKind::Card => Some(actors::channel::slack::CARD_EVENT_TYPE),
                MessageKind::Reply => Some(actors::channel::slack::REPLY_EVENT_TYPE),
                MessageKind::Other => None,
            };
            if let (true, Some(event_type)) = (metadata, event_type) {
                v["metadata"] = json!({"event_type": event_type,
                    "event_payload": {"run_id": m.run_id}});
            }
            v
        })
        .collect();
    HttpResponse::Ok().json(json!({"ok": true, "messages": messages, "has_more": false,
        "response_metadata": {"next_cursor": ""}}))
}

/// The 429 a call meets while [`SlackStub::rate_limit_next`] has calls left to refuse.
fn rate_limited(state: &mut State) -> Option<HttpResponse> {
    let (left, secs) = state.rate_limited?;
    state.rate_limited = (left > 1).then_some((left - 1, secs));
    state.counters.rate_limited += 1;
    Some(
        HttpResponse::TooManyRequests()
            .insert_header(("Retry-After", secs.to_string()))
            .json(json!({"ok": false, "error": "ratelimited"})),
    )
}

/// A held reply: never answered; the caller's timeout or death ends the exchange.
async fn held() -> HttpResponse {
    std::future::pending().await
}

/// The `ok: true` body of a call, or its `ok: false` error code.
fn answer(
    state: &mut State,
    req: &HttpRequest,
    method: &str,
    body: &[u8],
) -> Result<Value, &'static str> {
    if !matches!(method, "chat.postMessage" | "chat.update") {
        return Err("unknown_method");
    }
    let auth = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or("not_authed")?;
    if auth != STUB_BOT_TOKEN {
        return Err("invalid_auth");
    }
    let body: Value = serde_json::from_slice(body).map_err(|_| "invalid_json")?;
    if !body.is_object() {
        return Err("invalid_json");
    }
    let field = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
    let channel = field("channel").ok_or("channel_not_found")?;
    if state.missing_channels.contains(&channel) {
        return Err("channel_not_found");
    }
    let text = field("text");
    if text
        .as_ref()
        .is_some_and(|t| t.chars().count() > MAX_TEXT_CHARS)
    {
        return Err("msg_too_long");
    }
    let blocks = body.get("blocks").filter(|b| !b.is_null()).cloned();
    match method {
        "chat.postMessage" => {
            if text.is_none() && blocks.is_none() {
                return Err("no_text");
            }
            let metadata = body.get("metadata").filter(|m| !m.is_null()).cloned();
            let kind = match metadata
                .as_ref()
                .and_then(|m| m.get("event_type"))
                .and_then(Value::as_str)
            {
                Some("switchboard_card") => MessageKind::Card,
                Some("switchboard_reply") => MessageKind::Reply,
                _ => MessageKind::Other,
            };
            let run_id = metadata
                .as_ref()
                .and_then(|m| m.pointer("/event_payload/run_id"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            state.last_ts += 1;
            let ts = format!(
                "{}.{:06}",
                TS_EPOCH_SECS + state.last_ts / 1_000_000,
                state.last_ts % 1_000_000
            );
            let thread_ts = field("thread_ts");
            let text = text.unwrap_or_default();
            let mut message = json!({
                "type": "message",
                "subtype": "bot_message",
                "text": text,
                "user": BOT_USER,
                "bot_id": BOT_ID,
                "ts": ts,
            });
            for (name, value) in [
                ("thread_ts", thread_ts.clone().map(Value::String)),
                ("blocks", blocks.clone()),
                ("metadata", metadata),
            ] {
                if let Some(v) = value {
                    message[name] = v;
                }
            }
            if state.messages.len() >= MAX_MESSAGES {
                state.messages.pop_first();
                state.counters.messages_dropped += 1;
            }
            state.messages.insert(
                ts.clone(),
                StubMessage {
                    channel: channel.clone(),
                    thread_ts,
                    ts: ts.clone(),
                    text,
                    kind,
                    run_id: run_id.map(RunId::from),
                    stop_button: blocks.as_ref().and_then(stop_button),
                    blocks,
                    edits: Vec::new(),
                    deleted: false,
                },
            );
            Ok(json!({"ok": true, "channel": channel, "ts": ts, "message": message}))
        }
        "chat.update" => {
            let ts = field("ts").ok_or("message_not_found")?;
            let message = state
                .messages
                .get_mut(&ts)
                .filter(|m| !m.deleted && m.channel == channel)
                .ok_or("message_not_found")?;
            // As Slack does: what the update leaves out stays as it was.
            if let Some(text) = text {
                message.text = text;
            }
            if let Some(blocks) = blocks {
                message.stop_button = stop_button(&blocks);
                message.blocks = Some(blocks);
            }
            if message.edits.len() < MAX_EDITS {
                message.edits.push(StubEdit {
                    text: message.text.clone(),
                    stop_button: message.stop_button.clone(),
                });
            } else {
                state.counters.edits_dropped += 1;
            }
            let mut shown = json!({"text": message.text, "user": BOT_USER, "bot_id": BOT_ID});
            if let Some(b) = &message.blocks {
                shown["blocks"] = b.clone();
            }
            Ok(json!({
                "ok": true,
                "channel": channel,
                "ts": ts,
                "text": message.text,
                "message": shown,
            }))
        }
        _ => Err("unknown_method"),
    }
}

/// The value of the button with `action_id` `stop` in `blocks`' action blocks.
fn stop_button(blocks: &Value) -> Option<String> {
    button_values(blocks, "stop").into_iter().next()
}

/// The values of every button with `action_id` in `blocks`' action blocks, in block order (a card awaiting
/// several approvals has an Approve button per call).
fn button_values(blocks: &Value, action_id: &str) -> Vec<String> {
    blocks
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("actions"))
        .filter_map(|b| b.get("elements").and_then(Value::as_array))
        .flatten()
        .filter(|e| {
            e.get("type").and_then(Value::as_str) == Some("button")
                && e.get("action_id").and_then(Value::as_str) == Some(action_id)
        })
        .filter_map(|e| e.get("value").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}
