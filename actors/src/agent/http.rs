//! What the HTTP providers ([`super::openai`], [`super::anthropic`]) share: per-thread clients, the
//! transient/permanent classification of a failed exchange, `Retry-After`, and a server-sent-events
//! decoder for streamed answers.
//!
//! Owns nothing but the client pool of one agent.
//!
//! Classification (SPEC §8.3):
//!
//! | what happened                                       | error                                   |
//! |-----------------------------------------------------|-----------------------------------------|
//! | connect failure, timeout, reset while reading       | [`AgentError::Transient`]               |
//! | http 408, 429, 5xx                                  | transient, with the `Retry-After` if any |
//! | any other non-2xx                                   | [`AgentError::Permanent`]               |
//! | an error event inside a stream                      | transient unless its type says the request itself is wrong |
//! | a stream that ends before the answer is complete    | transient                               |
//! | a 2xx body or stream chunk that does not parse      | permanent (a malformed answer)          |
//!
//! Invariants: nothing here logs or returns message text or credentials; an error carries the status
//! and the provider's short error message only.
//!
//! # Design
//! A `reqwest::Client`'s pooled connection is driven by a task on the runtime that opened it, and every
//! actix arbiter is its own single-threaded runtime: one client shared by runs on two arbiters couples
//! them (a blocked arbiter stalls the other's request, a stopped one kills its pooled connections;
//! PITFALLS "actix / tokio" 4). So an agent keeps one client per thread, built on first use
//! ([`ClientPool`]). The SSE decoder is hand-written over `Response::chunk` (no extra reqwest feature):
//! it buffers bytes and decodes only complete lines, so a UTF-8 character split across chunks survives.

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, SystemTime};

use super::AgentError;

/// One `reqwest::Client` per calling thread, all with the same whole-request timeout.
pub struct ClientPool {
    timeout: Duration,
    /// A std `Mutex` because it is held only to look up or insert, never across an await; entries are
    /// few (one per arbiter thread).
    clients: Mutex<HashMap<ThreadId, reqwest::Client>>,
}

impl ClientPool {
    /// `timeout` bounds the whole request, connect to last body byte (for a stream: to its last event).
    pub fn new(timeout: Duration) -> Self {
        ClientPool {
            timeout,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// This thread's client, built on first use.
    pub fn client(&self) -> Result<reqwest::Client, AgentError> {
        let id = std::thread::current().id();
        // A poisoned map is still a valid map: take it.
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&id) {
            return Ok(c.clone());
        }
        let client = reqwest::Client::builder()
            .timeout(self.timeout)
            .build()
            .map_err(|e| AgentError::Permanent(format!("build http client: {}", chain(&e))))?;
        clients.insert(id, client.clone());
        Ok(client)
    }
}

/// Sends `req`; a non-2xx answer is read to its end and classified (see the module table). `what`
/// names the endpoint in errors (`"chat completions"`, `"messages"`).
pub async fn send(
    what: &str,
    req: reqwest::RequestBuilder,
) -> Result<reqwest::Response, AgentError> {
    let resp = req.send().await.map_err(|e| send_error(what, e))?;
    let status = resp.status().as_u16();
    if (200..300).contains(&status) {
        return Ok(resp);
    }
    // Taken before the body is read, so a long body does not shorten the wait.
    let now = SystemTime::now();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, now));
    let bytes = resp.bytes().await.map_err(|e| send_error(what, e))?;
    Err(status_error(what, status, retry_after, &bytes))
}

/// The answer's body as JSON; a body that does not parse is a permanent error.
pub async fn json_body(what: &str, resp: reqwest::Response) -> Result<Value, AgentError> {
    let bytes = resp.bytes().await.map_err(|e| send_error(what, e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| AgentError::Permanent(format!("malformed response body: {e}")))
}

/// Whether a 2xx answer is an event stream (a server that ignores `stream: true` answers plain JSON).
pub fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// Feeds every event of a streamed answer to `on_event` until it answers `Ok(true)` (the answer is
/// complete; the rest of the stream is dropped) or the stream ends. Answers whether `on_event` said
/// the answer was complete.
pub async fn for_each_event(
    what: &str,
    mut resp: reqwest::Response,
    mut on_event: impl FnMut(SseEvent) -> Result<bool, AgentError>,
) -> Result<bool, AgentError> {
    let mut decoder = SseDecoder::default();
    loop {
        let (events, ended) = match resp.chunk().await.map_err(|e| send_error(what, e))? {
            Some(bytes) => (decoder.push(&bytes), false),
            None => (decoder.finish(), true),
        };
        for event in events {
            if on_event(event)? {
                return Ok(true);
            }
        }
        if ended {
            return Ok(false);
        }
    }
}

/// Whether an HTTP status may succeed on a retry: 408, 429 and every 5xx.
pub fn is_transient_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

/// The error of a non-2xx answer: `<what> answered http <status>[: <provider message>]`, transient
/// (with `retry_after`) or permanent by [`is_transient_status`].
pub fn status_error(
    what: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> AgentError {
    let detail = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| provider_error(&v))
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    let message = format!("{what} answered http {status}{detail}");
    if is_transient_status(status) {
        AgentError::Transient {
            message,
            retry_after,
        }
    } else {
        AgentError::Permanent(message)
    }
}

/// Error types a provider reports inside a stream that mean the request itself is wrong (the rest —
/// overloaded, rate limits, server errors, unknown types — may pass on a retry).
const PERMANENT_STREAM_ERRORS: [&str; 6] = [
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "context_length_exceeded",
];

/// The error of an `{error: …}` event inside a stream: `<what> stream failed: <provider message>`.
pub fn stream_error(what: &str, body: &Value) -> AgentError {
    let message = format!(
        "{what} stream failed: {}",
        provider_error(body).unwrap_or_else(|| "error event".into())
    );
    let kind = body
        .get("error")
        .and_then(|e| e.get("type").or_else(|| e.get("code")))
        .and_then(Value::as_str);
    match kind {
        Some(k) if PERMANENT_STREAM_ERRORS.contains(&k) => AgentError::Permanent(message),
        _ => AgentError::transient(message),
    }
}

/// A send/receive failure: anything on the way (connect, timeout, reset) may work on a retry.
pub fn send_error(what: &str, e: reqwest::Error) -> AgentError {
    let how = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connect failed"
    } else {
        "request failed"
    };
    AgentError::transient(format!("{what} {how}: {}", chain(&e.without_url())))
}

/// An error and its sources, `: `-separated.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// The provider's `{error: "…"}` or `{error: {type|code, message}}` (OpenAI and Anthropic alike),
/// shortened to 300 characters; `None` when the body has none.
pub fn provider_error(v: &Value) -> Option<String> {
    let err = v.get("error")?;
    let message = match err {
        Value::String(s) => s.clone(),
        _ => {
            let kind = err
                .get("type")
                .or_else(|| err.get("code"))
                .and_then(Value::as_str);
            let message = err.get("message").and_then(Value::as_str).unwrap_or("");
            match kind {
                Some(k) if !message.is_empty() => format!("{k}: {message}"),
                Some(k) => k.to_owned(),
                None => message.to_owned(),
            }
        }
    };
    const MAX: usize = 300;
    Some(if message.chars().count() > MAX {
        format!("{}…", message.chars().take(MAX).collect::<String>())
    } else {
        message
    })
}

/// A `Retry-After` value as a wait from `now`: delay-seconds (`"3"`) or an HTTP date (IMF-fixdate, or
/// the obsolete RFC 850 and asctime forms), a date in the past waiting zero. `None` when it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits: only an absurdly long number fails to parse, and that is "wait forever".
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// One server-sent event: its `event:` name (empty when none) and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// An incremental `text/event-stream` decoder (the WHATWG rules that matter here): lines end in `\n`,
/// `\r\n` or `\r`; `data:` lines accumulate; a blank line dispatches the event (one without data is
/// dropped); `:` comments, `id:`, `retry:` and unknown fields are ignored. At the end of the stream a
/// pending event is still dispatched (lenient: some servers omit the last blank line).
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes not yet ending in a line break.
    buf: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
    finished: bool,
}

impl SseDecoder {
    /// Decodes `chunk`, answering the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(offset) = self.buf[start..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
        {
            let end = start + offset;
            let next = match (self.buf[end], self.buf.get(end + 1)) {
                (b'\r', Some(b'\n')) => end + 2,
                // A `\r` last in the buffer may be half of a `\r\n`: wait for the next chunk.
                (b'\r', None) => break,
                _ => end + 1,
            };
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            self.line(&line, &mut out);
            start = next;
        }
        self.buf.drain(..start);
        out
    }

    /// The end of the stream: the last unterminated line and a pending event, if any.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.finished {
            self.finished = true;
            let rest = std::mem::take(&mut self.buf);
            let rest = String::from_utf8_lossy(&rest);
            let rest = rest.trim_end_matches('\r');
            if !rest.is_empty() {
                self.line(rest, &mut out);
            }
            self.line("", &mut out);
        }
        out
    }

    /// Whether [`Self::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let data = std::mem::take(&mut self.data);
            if std::mem::take(&mut self.has_data) {
                out.push(SseEvent { event, data });
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(event: &str, data: &str) -> SseEvent {
        SseEvent {
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        // 2015-10-21T07:28:00Z, the example date of RFC 9110.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let cases: Vec<(&str, Option<Duration>)> = vec![
            ("3", Some(Duration::from_secs(3))),
            (" 120 ", Some(Duration::from_secs(120))),
            ("0", Some(Duration::ZERO)),
            (
                "99999999999999999999999",
                Some(Duration::from_secs(u64::MAX)),
            ),
            (
                "Wed, 21 Oct 2015 07:28:05 GMT",
                Some(Duration::from_secs(5)),
            ),
            (
                "Wednesday, 21-Oct-15 07:29:00 GMT",
                Some(Duration::from_secs(60)),
            ),
            ("Wed Oct 21 07:28:10 2015", Some(Duration::from_secs(10))),
            ("Wed, 21 Oct 2015 07:00:00 GMT", Some(Duration::ZERO)),
            ("-1", None),
            ("1.5", None),
            ("soon", None),
            ("", None),
            ("Wed, 32 Oct 2015 07:28:05 GMT", None),
        ];
        for (value, want) in cases {
            assert_eq!(parse_retry_after(value, now), want, "{value:?}");
        }
    }

    #[test]
    fn statuses_classify_as_the_spec_says() {
        for status in [408, 429, 500, 502, 503, 529, 599] {
            assert!(is_transient_status(status), "{status}");
        }
        for status in [200, 400, 401, 403, 404, 409, 413, 422] {
            assert!(!is_transient_status(status), "{status}");
        }
        let e = status_error(
            "messages",
            429,
            Some(Duration::from_secs(3)),
            br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        );
        assert_eq!(
            e,
            AgentError::Transient {
                message: "messages answered http 429: rate_limit_error: slow down".into(),
                retry_after: Some(Duration::from_secs(3)),
            }
        );
        // A permanent status drops the Retry-After: nobody should wait for it.
        let e = status_error("messages", 400, Some(Duration::from_secs(3)), b"<html>");
        assert_eq!(
            e,
            AgentError::Permanent("messages answered http 400".into())
        );
    }

    #[test]
    fn stream_errors_are_transient_unless_the_request_is_wrong() {
        let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert_eq!(
            stream_error("messages", &overloaded),
            AgentError::transient("messages stream failed: overloaded_error: Overloaded")
        );
        let invalid = json!({"error": {"type": "invalid_request_error", "message": "bad"}});
        assert_eq!(
            stream_error("chat completions", &invalid),
            AgentError::Permanent(
                "chat completions stream failed: invalid_request_error: bad".into()
            )
        );
        assert_eq!(
            stream_error("x", &json!({})),
            AgentError::transient("x stream failed: error event")
        );
    }

    #[test]
    fn provider_errors_are_shortened() {
        let long = "x".repeat(400);
        let got = provider_error(&json!({"error": {"message": long}})).unwrap();
        assert_eq!(got.chars().count(), 301);
        assert!(got.ends_with('…'));
        assert_eq!(
            provider_error(&json!({"error": "bad key"})).as_deref(),
            Some("bad key")
        );
        assert_eq!(
            provider_error(&json!({"error": {"code": "rate_limited"}})).as_deref(),
            Some("rate_limited")
        );
        assert_eq!(provider_error(&json!({"ok": true})), None);
    }

    #[test]
    fn sse_decoder_handles_split_chunks_line_endings_and_comments() {
        let mut d = SseDecoder::default();
        // An event split mid-line and mid-character ("é" is two bytes).
        let bytes = "event: content_block_delta\ndata: {\"t\":\"caf\u{e9}\"}\n\n".as_bytes();
        let cut = bytes.iter().position(|&b| b == 0xC3).unwrap() + 1;
        assert_eq!(d.push(&bytes[..5]), vec![]);
        assert_eq!(d.push(&bytes[5..cut]), vec![]);
        assert_eq!(
            d.push(&bytes[cut..]),
            vec![ev("content_block_delta", "{\"t\":\"café\"}")]
        );
        // CRLF split between its two bytes, a comment, multi-line data, data without a space.
        assert_eq!(d.push(b": ping\r"), vec![]);
        assert_eq!(d.push(b"\ndata: a\r\ndata:b\r\n\r\n"), vec![ev("", "a\nb")]);
        // Lone CR line endings; an event with no data is dropped; unknown fields ignored. The last CR
        // might be half of a CRLF, so the event waits for the next byte.
        assert_eq!(d.push(b"event: x\r\rid: 7\rdata: [DONE]\r\r"), vec![]);
        // That byte is not a LF: the CR ended the line. An empty data line is still an event.
        assert_eq!(d.push(b"data:\n\n"), vec![ev("", "[DONE]"), ev("", "")]);
        // The end of the stream dispatches a pending event even without its blank line.
        assert_eq!(d.push(b"data: tail"), vec![]);
        assert!(!d.is_finished());
        assert_eq!(d.finish(), vec![ev("", "tail")]);
        assert!(d.is_finished());
        assert_eq!(d.finish(), vec![]);
    }
}

/// How to reach a provider and how to ask it (both providers take the same settings).
#[derive(Clone)]
pub struct ProviderConfig {
    /// The provider's base URL; the endpoint path is appended (a trailing `/` is ignored).
    pub base_url: String,
    pub model: String,
    /// The API key; an empty key sends no auth header (local servers and proxies).
    pub api_key: String,
    /// The whole request, connect to last body byte (for a stream, its last event).
    pub timeout: Duration,
    /// Sent as `temperature` when set.
    pub temperature: Option<f64>,
    /// Sent as `max_tokens` when set.
    pub max_tokens: Option<u32>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            base_url: String::new(),
            model: String::new(),
            api_key: String::new(),
            timeout: Duration::from_secs(120),
            temperature: None,
            max_tokens: None,
        }
    }
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field(
                "api_key",
                &if self.api_key.is_empty() {
                    "<none>"
                } else {
                    "<redacted>"
                },
            )
            .field("timeout", &self.timeout)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}
