//! Slack's Web API as a [`ChannelIo`] (SPEC §12): `chat.postMessage` posts a card or a reply in the run's
//! thread, `chat.update` edits a card; and [`patiently`], the retry loop a caller wraps a call in.
//!
//! Owns one `reqwest::Client` (shared by the calls of every run that goes through this [`SlackIo`]) and
//! the bot token. Who calls it: the process's card keeper ([`super::cards`]) and the run's reply step,
//! through `Arc<dyn ChannelIo>`.
//!
//! How an exchange maps to an answer:
//!
//! | Slack answers                                   | [`SlackIo`] answers                                   |
//! |-------------------------------------------------|-------------------------------------------------------|
//! | http 200, `{ok: true, …}`                       | the card's handle (`channel`, `ts` from the answer) or `()` |
//! | http 200, `{ok: false, error: "message_not_found"}` | [`ChannelError::MessageNotFound`]                 |
//! | http 200, `{ok: false, error: "channel_not_found"}` | [`ChannelError::ChannelNotFound`]                 |
//! | http 200, `{ok: false, error: "not_in_channel"}`    | [`ChannelError::NotInChannel`]                    |
//! | http 200, `{ok: false, error: <code>}`          | [`ChannelError::Api`]`(code)`                         |
//! | http 429                                        | [`ChannelError::RateLimited`]`(Retry-After)`: its seconds, 1 s when missing or unreadable, within 1–60 s |
//! | any other status, a body that is not Slack's shape, no answer within 10 s, no connection | [`ChannelError::Transport`]`(short reason)` |
//!
//! Invariants:
//! - the bot token goes in the `Authorization` header and nowhere else: not in [`SlackIo`]'s `Debug`,
//!   not in an error, not in a log line (nothing here logs the text of a message either);
//! - one attempt per call: retrying (and how long) is the caller's choice, usually [`patiently`];
//! - texts are capped to what Slack accepts: a message's `text` at [`TEXT_MAX_CHARS`], a card's section
//!   block at [`SECTION_MAX_CHARS`], each cut text ending with a `…` note, so a long frame or answer is
//!   shortened rather than refused (`msg_too_long`, `invalid_blocks`).
//!
//! # Design
//! Every message carries Slack message metadata (`event_type` `switchboard_card` or
//! `switchboard_reply`, with the run id in `event_payload` when the frame names one), so a reader of the
//! thread — and the test stub — can tell the bot's cards from its replies without parsing text.

use std::future::Future;
use std::time::Duration;
use storage::RunId;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};

use super::{CardHandle, ChannelError, ChannelIo, Frame, ThreadRef};

/// Slack's own Web API: `api_base_url` when the configuration does not name one.
pub const DEFAULT_API_BASE_URL: &str = "https://slack.com/api";
/// How long one call may take, connect to the last byte of the answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A message's `text` is cut to this many characters (Slack refuses more than 40,000).
pub const TEXT_MAX_CHARS: usize = 39_000;
/// A card's `section` block text is cut to this many characters (Slack's limit for a section's text).
pub const SECTION_MAX_CHARS: usize = 3_000;
/// The `metadata.event_type` of a status card.
pub const CARD_EVENT_TYPE: &str = "switchboard_card";
/// The `metadata.event_type` of a reply.
pub const REPLY_EVENT_TYPE: &str = "switchboard_reply";
/// The Stop button's `action_id` (what `POST /slack/interactions` reads back).
pub const STOP_ACTION_ID: &str = "stop";
/// The Approve button's `action_id` (SPEC §13); its value is [`approval_value`]'s.
pub const APPROVE_ACTION_ID: &str = "approve";
/// The Deny button's `action_id`; its value is [`approval_value`]'s.
pub const DENY_ACTION_ID: &str = "deny";
/// Slack refuses a button whose `value` is longer, in characters.
pub const BUTTON_VALUE_MAX_CHARS: usize = 2_000;

/// The `Retry-After` used when a `429` carries none (or one that does not read as seconds).
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The longest `Retry-After` honoured: a longer one is waited as this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Room kept at the end of a cut text for its `…` note.
const CUT_NOTE_ROOM: usize = 64;

/// Slack's Web API with one bot token. Cheap to share (`Arc<dyn ChannelIo>`); every call is one
/// request with its own [`CALL_TIMEOUT`].
#[derive(Clone)]
pub struct SlackIo {
    /// Shared by every call; a pooled connection lives on the runtime that opened it.
    http: reqwest::Client,
    /// `https://slack.com/api` (or a stub's), without a trailing slash.
    api_base_url: String,
    /// Sent as `Authorization: Bearer …` and never shown (see the `Debug` impl).
    bot_token: String,
}

impl std::fmt::Debug for SlackIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackIo")
            .field("api_base_url", &self.api_base_url)
            .field("bot_token", &"[redacted]")
            .finish()
    }
}

impl SlackIo {
    /// A client of the Web API at `api_base_url` ([`DEFAULT_API_BASE_URL`] in production; a trailing
    /// slash is tolerated) calling as the bot whose token is `bot_token`.
    pub fn new(http: reqwest::Client, api_base_url: &str, bot_token: String) -> SlackIo {
        SlackIo {
            http,
            api_base_url: api_base_url.trim_end_matches('/').to_owned(),
            bot_token,
        }
    }

    /// The API base URL calls go to (no trailing slash).
    pub fn api_base_url(&self) -> &str {
        &self.api_base_url
    }

    /// Calls `method` with `body`; answers Slack's `{ok: true, …}` body, or the typed error (module
    /// table).
    async fn call(&self, method: &str, body: &Value) -> Result<Value, ChannelError> {
        let url = format!("{}/{method}", self.api_base_url);
        let request = self.http.post(url).body(body.to_string()).header(
            reqwest::header::CONTENT_TYPE,
            "application/json; charset=utf-8",
        );
        self.send(method, request).await
    }

    /// Calls the read method `method` (a GET with `query`, as Slack's read methods take no JSON body).
    async fn read(&self, method: &str, query: &[(&str, &str)]) -> Result<Value, ChannelError> {
        let url =
            reqwest::Url::parse_with_params(&format!("{}/{method}", self.api_base_url), query)
                .map_err(|_| ChannelError::Transport(format!("{method}: not a URL")))?;
        self.send(method, self.http.get(url)).await
    }

    async fn send(
        &self,
        method: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Value, ChannelError> {
        let resp = request
            .timeout(CALL_TIMEOUT)
            .bearer_auth(&self.bot_token)
            .send()
            .await
            .map_err(|e| transport(method, &e))?;
        let status = resp.status().as_u16();
        if status == 429 {
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok());
            return Err(ChannelError::RateLimited(retry_after_from(retry_after)));
        }
        if !(200..300).contains(&status) {
            return Err(ChannelError::Transport(format!(
                "{method} answered http {status}"
            )));
        }
        let bytes = resp.bytes().await.map_err(|e| transport(method, &e))?;
        let answer: Value = serde_json::from_slice(&bytes).map_err(|_| {
            ChannelError::Transport(format!("{method} answered a body that is not json"))
        })?;
        match answer.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(answer),
            Some(false) => Err(api_error(
                answer
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown_error"),
            )),
            None => Err(ChannelError::Transport(format!(
                "{method} answered json without ok"
            ))),
        }
    }
}

impl ChannelIo for SlackIo {
    fn find_card<'a>(
        &'a self,
        thread: &'a ThreadRef,
        run_id: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<CardHandle>, ChannelError>> {
        Box::pin(async move {
            let mut cursor = String::new();
            // A card is posted at a run's start, so it is on the thread's first pages.
            for _ in 0..FIND_PAGES {
                let mut query = vec![
                    ("channel", thread.channel.as_str()),
                    ("ts", thread.thread_ts.as_str()),
                    ("include_all_metadata", "true"),
                    ("limit", "200"),
                ];
                if !cursor.is_empty() {
                    query.push(("cursor", cursor.as_str()));
                }
                let answer = self.read("conversations.replies", &query).await?;
                let found = answer["messages"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|m| {
                        m["metadata"]["event_type"] == CARD_EVENT_TYPE
                            && m["metadata"]["event_payload"]["run_id"] == run_id.as_str()
                    });
                if let Some(ts) = found.and_then(|m| m["ts"].as_str()) {
                    return Ok(Some(CardHandle {
                        channel: thread.channel.clone(),
                        ts: ts.to_owned(),
                    }));
                }
                match answer["response_metadata"]["next_cursor"].as_str() {
                    Some(next) if !next.is_empty() && answer["has_more"] == true => {
                        cursor = next.to_owned()
                    }
                    _ => break,
                }
            }
            Ok(None)
        })
    }

    fn post_card<'a>(
        &'a self,
        thread: &'a ThreadRef,
        frame: &'a Frame,
    ) -> BoxFuture<'a, Result<CardHandle, ChannelError>> {
        Box::pin(async move {
            let answer = self
                .call("chat.postMessage", &post_card_body(thread, frame))
                .await?;
            let field = |name: &str| {
                answer
                    .get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ChannelError::Transport(format!("chat.postMessage answered no {name}"))
                    })
            };
            Ok(CardHandle {
                channel: field("channel")?,
                ts: field("ts")?,
            })
        })
    }

    fn edit_card<'a>(
        &'a self,
        card: &'a CardHandle,
        frame: &'a Frame,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            self.call("chat.update", &edit_card_body(card, frame))
                .await
                .map(drop)
        })
    }

    fn reply<'a>(
        &'a self,
        thread: &'a ThreadRef,
        run_id: &'a RunId,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            self.call("chat.postMessage", &reply_body(thread, run_id, text))
                .await
                .map(drop)
        })
    }
}

/// Pages of a thread `find_card` reads at most.
const FIND_PAGES: usize = 5;

/// Runs `op` until it succeeds, waiting as Slack asks: a [`ChannelError::RateLimited`] waits its
/// duration, a [`ChannelError::Transport`] waits a backoff of 200 ms doubling up to 5 s; any other error
/// is answered at once. Gives up, answering the last error, rather than start a wait that would take
/// the total waited past 60 s (the time the calls themselves take is not counted: each is bounded by its
/// own timeout). `what` names the call in debug logs.
pub async fn patiently<T, F, Fut>(what: &str, mut op: F) -> Result<T, ChannelError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ChannelError>>,
{
    const BUDGET: Duration = Duration::from_secs(60);
    const FIRST_BACKOFF: Duration = Duration::from_millis(200);
    const MAX_BACKOFF: Duration = Duration::from_secs(5);
    let mut waited = Duration::ZERO;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let err = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let wait = match &err {
            ChannelError::RateLimited(d) => *d,
            ChannelError::Transport(_) => {
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
            _ => return Err(err),
        };
        if waited + wait > BUDGET {
            return Err(err);
        }
        tracing::debug!(what, wait_ms = wait.as_millis() as u64, error = %err, "channel call retried");
        tokio::time::sleep(wait).await;
        waited += wait;
    }
}

/// The `chat.postMessage` body of a card posted in `thread`.
fn post_card_body(thread: &ThreadRef, frame: &Frame) -> Value {
    json!({
        "channel": thread.channel,
        "thread_ts": thread.thread_ts,
        "text": cap_chars(&frame.text, TEXT_MAX_CHARS),
        "blocks": blocks(frame),
        "metadata": metadata(CARD_EVENT_TYPE, &frame.run_id),
        "unfurl_links": false,
    })
}

/// The `chat.update` body replacing `card`'s content with `frame`.
fn edit_card_body(card: &CardHandle, frame: &Frame) -> Value {
    json!({
        "channel": card.channel,
        "ts": card.ts,
        "text": cap_chars(&frame.text, TEXT_MAX_CHARS),
        "blocks": blocks(frame),
    })
}

/// The `chat.postMessage` body of a reply in `thread`: text only.
fn reply_body(thread: &ThreadRef, run_id: &RunId, text: &str) -> Value {
    json!({
        "channel": thread.channel,
        "thread_ts": thread.thread_ts,
        "text": cap_chars(text, TEXT_MAX_CHARS),
        "metadata": metadata(REPLY_EVENT_TYPE, run_id),
    })
}

/// A card's blocks: its text as one `mrkdwn` section; for each call awaiting approval an `actions` block
/// with Approve and Deny, led by a `context` block naming the call when several await (so each pair
/// reads as its call's; one call's line is right above in the text); and the Stop button when the frame
/// offers it. A call whose ids no button value can carry gets no buttons (the live view decides it).
fn blocks(frame: &Frame) -> Value {
    let mut blocks = vec![json!({
        "type": "section",
        "text": {"type": "mrkdwn", "text": cap_chars(&frame.text, SECTION_MAX_CHARS)},
    })];
    let several = frame.approvals.len() > 1;
    for call in &frame.approvals {
        let Some(value) = approval_value(&frame.run_id, &call.call_id) else {
            continue;
        };
        if several {
            blocks.push(json!({
                "type": "context",
                "elements": [{"type": "mrkdwn", "text": cap_chars(&call.line(), SECTION_MAX_CHARS)}],
            }));
        }
        blocks.push(json!({
            "type": "actions",
            "elements": [
                button(APPROVE_ACTION_ID, "Approve", "primary", &value),
                button(DENY_ACTION_ID, "Deny", "danger", &value),
            ],
        }));
    }
    if frame.stop_button {
        blocks.push(json!({
            "type": "actions",
            "elements": [button(STOP_ACTION_ID, "Stop", "danger", &frame.run_id)],
        }));
    }
    Value::Array(blocks)
}

/// A Block Kit button: what `POST /slack/interactions` hears back is its `action_id` and `value`.
fn button(action_id: &str, label: &str, style: &str, value: &str) -> Value {
    json!({
        "type": "button",
        "action_id": action_id,
        "value": value,
        "style": style,
        "text": {"type": "plain_text", "text": label},
    })
}

/// The `value` of an Approve or Deny button: the run and the call it decides, as JSON
/// `{"runId":…,"callId":…}`; `None` when that is over [`BUTTON_VALUE_MAX_CHARS`] (no button can carry
/// it: the live view still decides the call).
pub fn approval_value(run_id: &RunId, call_id: &str) -> Option<String> {
    let value = json!({"runId": run_id, "callId": call_id}).to_string();
    (value.chars().count() <= BUTTON_VALUE_MAX_CHARS).then_some(value)
}

/// The run and call an Approve or Deny button's `value` names ([`approval_value`]'s shape, both ids
/// non-empty); `None` for anything else.
pub fn approval_of(value: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(value).ok()?;
    let id = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Some((id("runId")?, id("callId")?))
}

/// Slack message metadata: `event_type`, and the run id in `event_payload`.
fn metadata(event_type: &str, run_id: &RunId) -> Value {
    json!({ "event_type": event_type, "event_payload": { "run_id": run_id } })
}

/// `text` cut to at most `max` characters, the cut one ending with a note of how much was left out.
fn cap_chars(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_owned();
    }
    let keep = max.saturating_sub(CUT_NOTE_ROOM);
    let mut out: String = text.chars().take(keep).collect();
    out.push_str(&format!("\n… ({} more characters cut)", total - keep));
    out
}

/// A `Retry-After` header's wait: whole seconds within 1–60 s; 1 s when absent or not seconds.
fn retry_after_from(header: Option<&str>) -> Duration {
    header
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_RETRY_AFTER)
        .clamp(DEFAULT_RETRY_AFTER, MAX_RETRY_AFTER)
}

/// Slack's `ok: false` error code, typed.
fn api_error(code: &str) -> ChannelError {
    match code {
        "message_not_found" => ChannelError::MessageNotFound,
        "channel_not_found" => ChannelError::ChannelNotFound,
        "not_in_channel" => ChannelError::NotInChannel,
        other => ChannelError::Api(other.chars().take(100).collect()),
    }
}

/// A request that got no (whole) answer: what failed, without the URL (the token is never in it).
fn transport(method: &str, e: &reqwest::Error) -> ChannelError {
    let how = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut reason = format!("{method} {how}");
    // The innermost cause says the most (`connection refused`); the URL is never part of it.
    let mut source = std::error::Error::source(e);
    let mut innermost = None;
    while let Some(cause) = source {
        innermost = Some(cause.to_string());
        source = cause.source();
    }
    if let Some(cause) = innermost {
        reason.push_str(": ");
        reason.extend(cause.chars().take(120));
    }
    ChannelError::Transport(reason)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::channel::card::AwaitedCall;

    fn thread() -> ThreadRef {
        ThreadRef {
            channel: "C1".into(),
            thread_ts: "1700000000.000100".into(),
        }
    }

    fn frame(stop: Option<&str>) -> Frame {
        Frame {
            text: "⏳ main · step 1".into(),
            run_id: RunId::from(stop.unwrap_or("r1").to_owned()),
            stop_button: stop.is_some(),
            approvals: Vec::new(),
        }
    }

    fn awaited(call_id: &str) -> AwaitedCall {
        AwaitedCall {
            call_id: call_id.into(),
            tool: "append_file".into(),
            summary: "{\"path\":\"<notes>\"}".into(),
        }
    }

    #[test]
    fn a_parked_card_has_approve_and_deny_naming_its_run_and_call_before_stop() {
        let mut f = frame(Some("r1"));
        f.approvals = vec![awaited("call-1")];
        let body = post_card_body(&thread(), &f);
        let blocks = body["blocks"].as_array().expect("blocks");
        assert_eq!(blocks.len(), 3, "{blocks:?}");
        assert_eq!(blocks[1]["type"], "actions");
        let value = approval_value(&RunId::from("r1"), "call-1").unwrap();
        assert_eq!(
            blocks[1]["elements"],
            json!([
                {"type": "button", "action_id": "approve", "value": value, "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"}},
                {"type": "button", "action_id": "deny", "value": value, "style": "danger",
                    "text": {"type": "plain_text", "text": "Deny"}},
            ])
        );
        assert_eq!(blocks[2]["elements"][0]["action_id"], "stop");
        // An edit carries the same buttons.
        let card = CardHandle {
            channel: "C1".into(),
            ts: "1700000000.000200".into(),
        };
        assert_eq!(edit_card_body(&card, &f)["blocks"], body["blocks"]);
    }

    #[test]
    fn several_calls_each_have_their_buttons_under_their_line_and_an_overlong_id_has_none() {
        let mut f = frame(None);
        f.approvals = vec![
            awaited("call-1"),
            awaited(&"x".repeat(BUTTON_VALUE_MAX_CHARS)),
            awaited("call-3"),
        ];
        let blocks = blocks(&f);
        let kinds: Vec<_> = blocks
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["section", "context", "actions", "context", "actions"]
        );
        assert_eq!(
            blocks[1]["elements"][0]["text"],
            "✋ waiting for approval: append_file — {\"path\":\"&lt;notes&gt;\"}"
        );
        assert_eq!(
            approval_of(blocks[4]["elements"][1]["value"].as_str().unwrap()),
            Some(("r1".to_owned(), "call-3".to_owned()))
        );
    }

    #[test]
    fn a_live_card_has_a_section_and_a_stop_button_naming_the_run() {
        let body = post_card_body(&thread(), &frame(Some("r1")));
        assert_eq!(body["channel"], "C1");
        assert_eq!(body["thread_ts"], "1700000000.000100");
        assert_eq!(body["text"], "⏳ main · step 1");
        assert_eq!(body["unfurl_links"], false);
        assert_eq!(body["metadata"]["event_type"], CARD_EVENT_TYPE);
        assert_eq!(body["metadata"]["event_payload"]["run_id"], "r1");
        let blocks = body["blocks"].as_array().expect("blocks");
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0]["type"], "section");
        assert_eq!(blocks[0]["text"]["type"], "mrkdwn");
        assert_eq!(blocks[0]["text"]["text"], "⏳ main · step 1");
        let button = &blocks[1]["elements"][0];
        assert_eq!(blocks[1]["type"], "actions");
        assert_eq!(button["type"], "button");
        assert_eq!(button["action_id"], "stop");
        assert_eq!(button["value"], "r1");
        assert_eq!(button["style"], "danger");
        assert_eq!(
            button["text"],
            json!({"type": "plain_text", "text": "Stop"})
        );
    }

    #[test]
    fn a_closing_frame_has_no_button_and_an_edit_names_the_card() {
        let card = CardHandle {
            channel: "C1".into(),
            ts: "1700000000.000200".into(),
        };
        let body = edit_card_body(&card, &frame(None));
        assert_eq!(body["ts"], "1700000000.000200");
        assert_eq!(body["channel"], "C1");
        assert_eq!(body["blocks"].as_array().map(Vec::len), Some(1));
        assert!(body.get("metadata").is_none());
    }

    #[test]
    fn a_reply_is_text_only_and_cut_below_slacks_limit() {
        let long = "é".repeat(50_000);
        let body = reply_body(&thread(), &RunId::from("r1"), &long);
        assert!(body.get("blocks").is_none());
        assert_eq!(body["metadata"]["event_type"], REPLY_EVENT_TYPE);
        let text = body["text"].as_str().expect("text");
        assert!(text.chars().count() <= TEXT_MAX_CHARS);
        assert!(text.starts_with("éé"));
        assert!(text.ends_with("\n… (11064 more characters cut)"));
        assert_eq!(body["metadata"]["event_payload"]["run_id"], "r1");
        assert_eq!(
            reply_body(&thread(), &RunId::from("r1"), "short")["text"],
            "short"
        );
    }

    #[test]
    fn a_long_frame_keeps_its_section_within_slacks_limit() {
        let f = Frame {
            text: "x".repeat(5_000),
            run_id: "r1".into(),
            stop_button: false,
            approvals: Vec::new(),
        };
        let body = post_card_body(&thread(), &f);
        let section = body["blocks"][0]["text"]["text"].as_str().expect("text");
        assert!(section.chars().count() <= SECTION_MAX_CHARS);
        assert_eq!(body["text"].as_str().map(str::len), Some(5_000));
    }

    #[test]
    fn an_approval_buttons_value_names_its_run_and_call_within_slacks_cap() {
        let value = approval_value(&RunId::from("r1"), "call-\"1\"").expect("short ids fit");
        assert_eq!(
            serde_json::from_str::<Value>(&value).ok(),
            Some(json!({"runId": "r1", "callId": "call-\"1\""}))
        );
        assert_eq!(
            approval_of(&value),
            Some(("r1".to_owned(), "call-\"1\"".to_owned()))
        );
        // Ids too long for one button: no value (the live view still decides the call).
        assert_eq!(
            approval_value(&RunId::from("r1"), &"c".repeat(BUTTON_VALUE_MAX_CHARS)),
            None
        );
        for bad in [
            "r1",
            "",
            "{}",
            r#"{"runId":"r1"}"#,
            r#"{"runId":"r1","callId":""}"#,
            r#"{"runId":1,"callId":"c"}"#,
            r#"["r1","c"]"#,
        ] {
            assert_eq!(approval_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn retry_after_is_seconds_within_one_and_sixty() {
        assert_eq!(retry_after_from(Some("7")), Duration::from_secs(7));
        assert_eq!(retry_after_from(Some(" 3 ")), Duration::from_secs(3));
        assert_eq!(retry_after_from(None), Duration::from_secs(1));
        assert_eq!(retry_after_from(Some("soon")), Duration::from_secs(1));
        assert_eq!(retry_after_from(Some("0")), Duration::from_secs(1));
        assert_eq!(retry_after_from(Some("3600")), Duration::from_secs(60));
    }

    #[test]
    fn slack_error_codes_are_typed() {
        assert_eq!(
            api_error("message_not_found"),
            ChannelError::MessageNotFound
        );
        assert_eq!(
            api_error("channel_not_found"),
            ChannelError::ChannelNotFound
        );
        assert_eq!(api_error("not_in_channel"), ChannelError::NotInChannel);
        assert_eq!(
            api_error("invalid_auth"),
            ChannelError::Api("invalid_auth".into())
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let io = SlackIo::new(
            reqwest::Client::new(),
            "https://slack.com/api/",
            "xoxb-secret-123456789".into(),
        );
        let shown = format!("{io:?}");
        assert!(!shown.contains("xoxb-secret"), "{shown}");
        assert_eq!(io.api_base_url(), "https://slack.com/api");
    }

    /// An operation answering `errors` in turn, then `Ok(calls)`; counts its calls.
    fn scripted(
        errors: Vec<ChannelError>,
    ) -> (
        Arc<AtomicU32>,
        impl FnMut() -> std::future::Ready<Result<u32, ChannelError>>,
    ) {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let op = move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(match errors.get(n as usize) {
                Some(e) => Err(e.clone()),
                None => Ok(n + 1),
            })
        };
        (calls, op)
    }

    #[tokio::test(start_paused = true)]
    async fn patiently_waits_each_retry_after_then_succeeds() {
        let limited = ChannelError::RateLimited(Duration::from_secs(3));
        let (calls, op) = scripted(vec![limited.clone(), limited]);
        let start = tokio::time::Instant::now();
        assert_eq!(patiently("test", op).await, Ok(3));
        assert_eq!(start.elapsed(), Duration::from_secs(6));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn patiently_backs_off_on_transport_errors_doubling_from_200_ms() {
        let down = ChannelError::Transport("could not connect".into());
        let (calls, op) = scripted(vec![down.clone(), down.clone(), down]);
        let start = tokio::time::Instant::now();
        assert_eq!(patiently("test", op).await, Ok(4));
        assert_eq!(start.elapsed(), Duration::from_millis(200 + 400 + 800));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn patiently_answers_other_errors_at_once() {
        for err in [
            ChannelError::MessageNotFound,
            ChannelError::ChannelNotFound,
            ChannelError::NotInChannel,
            ChannelError::Api("invalid_auth".into()),
        ] {
            let (calls, op) = scripted(vec![err.clone()]);
            let start = tokio::time::Instant::now();
            assert_eq!(patiently("test", op).await, Err(err));
            assert_eq!(start.elapsed(), Duration::ZERO);
            assert_eq!(calls.load(Ordering::SeqCst), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn patiently_gives_up_rather_than_wait_past_sixty_seconds() {
        let limited = ChannelError::RateLimited(Duration::from_secs(20));
        let (calls, op) = scripted(vec![limited.clone(); 10]);
        let start = tokio::time::Instant::now();
        assert_eq!(patiently("test", op).await, Err(limited));
        // 20 + 20 + 20 waited; a fourth wait would pass 60 s.
        assert_eq!(start.elapsed(), Duration::from_secs(60));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn patiently_caps_the_transport_backoff_at_five_seconds() {
        let down = ChannelError::Transport("timed out".into());
        let (calls, op) = scripted(vec![down.clone(); 100]);
        let start = tokio::time::Instant::now();
        assert_eq!(patiently("test", op).await, Err(down));
        // 0.2 + 0.4 + 0.8 + 1.6 + 3.2, then ten waits of 5 s; an eleventh would pass 60 s.
        assert_eq!(start.elapsed(), Duration::from_millis(6_200 + 50_000));
        assert_eq!(calls.load(Ordering::SeqCst), 16);
    }
}
