//! `POST /slack/events` and `POST /slack/interactions`: the Slack adapter's inbound side (SPEC §12).
//!
//! Owns the signing secret ([`SlackIngress`], on [`AppState::slack`]) and nothing else. The routes are
//! mounted only when `[channels.slack]` is configured; without it they are 404s like any unknown path.
//!
//! In: Slack's Events API callbacks (JSON) and interactive button clicks (a form whose `payload` field
//! is JSON), each signed with `X-Slack-Signature` over `v0:<X-Slack-Request-Timestamp>:<raw body>`.
//! Out: [`AdmitMessage`] to the supervisor for an `app_mention` or a direct message — mirroring
//! `POST /api/messages` — a soft stop through [`actors::runs_service::RunsService::stop_run`] for a
//! card's Stop button, as `POST /api/runs/{id}/stop` does, and a decision through
//! [`decide_as`] for its Approve / Deny buttons, as `POST /api/runs/{id}/approvals/{callId}` does.
//!
//! Invariants:
//! - nothing is admitted, stopped or decided before [`verify`] accepts the request; a refusal is a 401
//!   `bad_signature` or `stale_timestamp`;
//! - a Slack retry (`X-Slack-Retry-Num`) admits nothing twice: the receipt key is the `event_id` (scope
//!   `slack`), and a hit answers the original outcome;
//! - neither the message text nor the secret is ever logged (logs carry the event id, the run id, the
//!   Slack user and channel ids);
//! - the routes do admission only, so they answer within Slack's 3 s; the run goes on in the background.
//!
//! # Design
//! Slack retries any answer that is not a 2xx. So a refusal that would refuse again (a fenced thread,
//! too many receipts, a field over its cap) answers 200 with a warn log instead of starting a retry
//! loop, and only a passing condition (draining, storage unavailable, a finishing thread) answers 503 so
//! Slack tries again later. The interactions route always answers 200 `{}` after a valid signature:
//! anything else makes Slack show the person an error.
//!
//! The edge middleware lets `application/x-www-form-urlencoded` through for [`INTERACTIONS_PATH`] only
//! (see [`crate::edge`]): a cross-site form can reach it, but without the secret it cannot sign.

use std::collections::HashMap;
use storage::RunId;

use actix_web::{web, HttpRequest, HttpResponse};
use actors::channel::slack::{approval_of, APPROVE_ACTION_ID, DENY_ACTION_ID, STOP_ACTION_ID};
use actors::run::{Request, Source, StopActor};
use actors::runs_service::RunsError;
use actors::supervisor::{AdmitError, AdmitMessage, Admitted};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use storage::ledger::{Decision, ReceiptKey, StopMode};
use storage::record::{ChannelVisibility, VisibilityFilter};

use super::approvals::decide_as;
use super::messages::{
    MAX_CHANNEL_CHARS, MAX_KEY_CHARS, MAX_TEXT_BYTES, MAX_THREAD_CHARS, MAX_USER_CHARS,
};
use super::resource;
use crate::error::ApiError;
use crate::AppState;

/// The Events API's path.
pub const EVENTS_PATH: &str = "/slack/events";
/// The interactivity request URL's path (button clicks).
pub const INTERACTIONS_PATH: &str = "/slack/interactions";
/// Request body cap for both routes (a 413 over it).
pub const SLACK_BODY_LIMIT: usize = 1 << 20;
/// The largest distance between a request's timestamp and now, either way (SPEC §12: 5 minutes).
pub const MAX_SKEW_SECS: u64 = 300;
/// The receipt scope of Slack's admissions: its keys are Slack's `event_id`s.
pub const RECEIPT_SCOPE: &str = "slack";
/// How long an event waits for its admission before answering 503 (Slack's limit is 3 s).
pub const ANSWER_BUDGET: std::time::Duration = std::time::Duration::from_millis(2_500);

const SIGNATURE_HEADER: &str = "x-slack-signature";
const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
const RETRY_HEADER: &str = "x-slack-retry-num";

type HmacSha256 = Hmac<Sha256>;

/// What the Slack routes need: the app's signing secret. Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct SlackIngress {
    signing_secret: String,
}

impl SlackIngress {
    pub fn new(signing_secret: impl Into<String>) -> Self {
        SlackIngress {
            signing_secret: signing_secret.into(),
        }
    }
}

impl std::fmt::Debug for SlackIngress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackIngress")
            .field("signing_secret", &"<redacted>")
            .finish()
    }
}

/// Why a request's Slack signature is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the X-Slack-Signature or X-Slack-Request-Timestamp header is missing or not text")]
    Missing,
    #[error("the signature is not v0= and 64 hex digits")]
    Malformed,
    #[error("the request timestamp is not a number of seconds")]
    BadTimestamp,
    #[error("the request timestamp is {skew_secs} s from now, over {MAX_SKEW_SECS}")]
    Stale { skew_secs: u64 },
    #[error("the signature does not match")]
    Mismatch,
}

impl From<SignatureError> for ApiError {
    fn from(e: SignatureError) -> Self {
        match e {
            SignatureError::Stale { .. } => ApiError::StaleTimestamp(e.to_string()),
            _ => ApiError::BadSignature(e.to_string()),
        }
    }
}

/// The MAC over Slack's base string `v0:<timestamp>:<body>`.
fn mac(secret: &str, timestamp: &str, body: &[u8]) -> HmacSha256 {
    let mut mac =
        HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

/// The `X-Slack-Signature` value Slack would send for `body` at `timestamp`: `v0=` and the lowercase hex
/// HMAC-SHA256 of `v0:<timestamp>:<body>` under `secret`. For tests and `switchboard chaos`.
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    format!(
        "v0={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// Whether `signature` is Slack's for `body` at `timestamp` (the headers' raw values), and `timestamp`
/// (Unix seconds) is within [`MAX_SKEW_SECS`] of `now_secs`. The MAC is compared in constant time.
pub fn verify(
    secret: &str,
    timestamp: &str,
    body: &[u8],
    signature: &str,
    now_secs: i64,
) -> Result<(), SignatureError> {
    let tag = signature
        .strip_prefix("v0=")
        .and_then(|h| hex::decode(h).ok())
        .filter(|t| t.len() == 32)
        .ok_or(SignatureError::Malformed)?;
    if timestamp.is_empty() || !timestamp.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::BadTimestamp);
    }
    let at: i64 = timestamp
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    let skew_secs = now_secs.abs_diff(at);
    if skew_secs > MAX_SKEW_SECS {
        return Err(SignatureError::Stale { skew_secs });
    }
    mac(secret, timestamp, body)
        .verify_slice(&tag)
        .map_err(|_| SignatureError::Mismatch)
}

/// The configured ingress, else the 404 of a path no route has (the routes are mounted only when Slack
/// is configured; this keeps a handler from ever running without a secret).
fn ingress<'a>(req: &HttpRequest, state: &'a AppState) -> Result<&'a SlackIngress, ApiError> {
    state
        .slack
        .as_ref()
        .ok_or_else(|| ApiError::NotFound(format!("route {} {}", req.method(), req.path())))
}

/// [`verify`] the request's headers and body against the ingress' secret, at the service clock's now.
fn check_signature(
    req: &HttpRequest,
    state: &AppState,
    ingress: &SlackIngress,
    body: &[u8],
) -> Result<(), SignatureError> {
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or(SignatureError::Missing)
    };
    let (signature, timestamp) = (header(SIGNATURE_HEADER)?, header(TIMESTAMP_HEADER)?);
    let now_secs = state.runs.clock.now_ms().div_euclid(1000);
    verify(
        &ingress.signing_secret,
        timestamp,
        body,
        signature,
        now_secs,
    )
}

/// The body-size check, then the signature check; a refusal is logged here (it is handled here).
fn accept(req: &HttpRequest, state: &AppState, body: &[u8]) -> Result<(), ApiError> {
    let ingress = ingress(req, state)?;
    if body.len() > SLACK_BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!(
            "body over {SLACK_BODY_LIMIT} bytes"
        )));
    }
    check_signature(req, state, ingress, body).map_err(|e| {
        tracing::warn!(route = req.path(), error = %e, "slack request refused: signature");
        ApiError::from(e)
    })
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource(EVENTS_PATH, "POST")
            .app_data(web::PayloadConfig::new(SLACK_BODY_LIMIT))
            .route(web::post().to(post_events)),
    )
    .service(
        resource(INTERACTIONS_PATH, "POST")
            .app_data(web::PayloadConfig::new(SLACK_BODY_LIMIT))
            .route(web::post().to(post_interactions)),
    );
}

/// The visibility of a Slack channel by its id's first letter: `D…` a direct message, `G…` a private
/// channel (or a group DM), anything else public.
fn visibility_of(channel: &str) -> ChannelVisibility {
    match channel.as_bytes().first() {
        Some(b'D') => ChannelVisibility::Dm,
        Some(b'G') => ChannelVisibility::Private,
        _ => ChannelVisibility::Public,
    }
}

/// `text` without its leading user mentions (`<@U123>`, `<@U123|name>`: the bot being addressed), trimmed.
fn strip_leading_mentions(text: &str) -> &str {
    let mut rest = text.trim_start();
    while let Some(after) = rest.strip_prefix("<@") {
        let Some(end) = after.find('>') else { break };
        let id = after[..end].split('|').next().unwrap_or("");
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            break;
        }
        rest = after[end + 1..].trim_start();
    }
    rest.trim_end()
}

/// The message an Events API `event` asks to admit, or `None` for an event that starts nothing: another
/// type, a message outside a DM, a bot's (the app's own included) or an edit/join/… (`subtype`), a
/// missing field, or nothing left but the mention.
fn admission_of(event: &Value) -> Option<Request> {
    let present = |f: &str| event.get(f).is_some_and(|v| !v.is_null());
    if present("bot_id") || present("subtype") {
        return None;
    }
    let field = |f: &str| {
        event
            .get(f)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    match field("type")? {
        "app_mention" => {}
        "message" if field("channel_type") == Some("im") => {}
        _ => return None,
    }
    let channel = field("channel")?;
    let text = strip_leading_mentions(field("text")?);
    if text.is_empty() {
        return None;
    }
    Some(Request {
        thread: field("thread_ts").or_else(|| field("ts"))?.to_owned(),
        channel: channel.to_owned(),
        user: field("user")?.to_owned(),
        text: text.to_owned(),
        agent: None,
        visibility: Some(visibility_of(channel).as_str().to_owned()),
        parent_run_id: None,
        source: Source::Slack,
        strategy: None,
    })
}

/// `value` has 1 to `max` Unicode characters.
fn within(value: &str, max: usize) -> bool {
    (1..=max).contains(&value.chars().take(max + 1).count())
}

/// The first field of `request` over the caps `POST /api/messages` applies (SPEC §5.1), if any; a
/// channel holding `:` counts (the thread key would not be injective).
fn over_cap(request: &Request) -> Option<&'static str> {
    if request.channel.contains(':') || !within(&request.channel, MAX_CHANNEL_CHARS) {
        Some("channel")
    } else if !within(&request.thread, MAX_THREAD_CHARS) {
        Some("thread")
    } else if !within(&request.user, MAX_USER_CHARS) {
        Some("user")
    } else if request.text.len() > MAX_TEXT_BYTES {
        Some("text")
    } else {
        None
    }
}

/// The receipt's body hash: SHA-256 hex of the request's JSON (its keys in a fixed order).
fn body_hash(request: &Request) -> String {
    super::messages::body_hash(
        &serde_json::to_value(request).expect("a request of strings serializes"),
    )
}

/// Slack's "got it": any 2xx stops its retries.
fn ok() -> HttpResponse {
    HttpResponse::Ok().json(json!({"ok": true}))
}

/// `POST /slack/events`: the Events API. Answers a `url_verification` with its challenge, admits an
/// `app_mention` or a direct message, and acknowledges everything else.
async fn post_events(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    accept(&req, &state, &body)?;
    let envelope: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
    match envelope.get("type").and_then(Value::as_str) {
        Some("url_verification") => {
            let challenge = envelope
                .get("challenge")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad("challenge", "must be a string"))?;
            return Ok(HttpResponse::Ok().json(json!({"challenge": challenge})));
        }
        Some("event_callback") => {}
        other => {
            tracing::debug!(kind = other.unwrap_or("(none)"), "slack callback ignored");
            return Ok(ok());
        }
    }
    let Some(event_id) = envelope.get("event_id").and_then(Value::as_str) else {
        tracing::warn!("slack event without an event_id ignored");
        return Ok(ok());
    };
    let retry = req
        .headers()
        .get(RETRY_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("0");
    let Some(request) = envelope.get("event").and_then(admission_of) else {
        tracing::debug!(event_id, "slack event admits nothing");
        return Ok(ok());
    };
    if let Some(field) =
        over_cap(&request).or_else(|| (!within(event_id, MAX_KEY_CHARS)).then_some("event_id"))
    {
        tracing::warn!(event_id = %event_id.chars().take(64).collect::<String>(), field, "slack event over a field cap ignored");
        return Ok(ok());
    }
    let key = ReceiptKey {
        scope: RECEIPT_SCOPE.into(),
        key: event_id.to_owned(),
        body_hash: body_hash(&request),
    };
    let channel = request.channel.clone();
    let admission = state.supervisor.send(AdmitMessage {
        request,
        key: Some(key),
        writer: None,
    });
    // Slack wants an answer within 3 s: past the budget, a 503 makes it retry, and the retry's receipt
    // answers whatever this admission did meanwhile (it goes on: dropping the answer cancels nothing).
    let Ok(answer) = tokio::time::timeout(ANSWER_BUDGET, admission).await else {
        tracing::warn!(
            event_id,
            "slack admission over its budget; Slack will retry"
        );
        return Err(ApiError::Unavailable("admission is slow; retry".into()));
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(event_id, error = %e, "slack admission: supervisor unavailable");
            return Err(ApiError::Unavailable("supervisor unavailable".into()));
        }
    };
    match answer {
        // A retry's receipt answers its first outcome here too: nothing is admitted twice.
        Ok(Admitted::Started { run_id, .. }) => {
            tracing::info!(
                event_id,
                %run_id,
                channel,
                retry,
                "slack message started a run"
            );
            Ok(ok())
        }
        Ok(Admitted::Steered { run_id, seq, .. }) => {
            tracing::info!(
                event_id,
                %run_id,
                channel,
                retry,
                inbox_seq = seq,
                "slack message steered into a run"
            );
            Ok(ok())
        }
        Ok(Admitted::Queued {
            run_id, position, ..
        }) => {
            tracing::info!(
                event_id,
                %run_id,
                channel,
                retry,
                position,
                "slack message queued behind a run"
            );
            Ok(ok())
        }
        // The agent's strategy is `reject` and the thread is busy: Slack has nothing to retry.
        Err(AdmitError::Rejected | AdmitError::QueueFull) => {
            tracing::info!(
                event_id,
                channel,
                retry,
                "slack message rejected: the thread is busy"
            );
            Ok(ok())
        }
        Err(AdmitError::KeyConflict) => {
            tracing::info!(
                event_id,
                retry,
                "slack event already admitted with another body"
            );
            Ok(ok())
        }
        Err(AdmitError::Draining) => Err(ApiError::Draining),
        Err(AdmitError::ThreadBusy) => Err(ApiError::ThreadBusy),
        Err(e @ AdmitError::Unavailable(_)) => {
            tracing::warn!(event_id, error = %e, "slack admission unavailable");
            Err(ApiError::Unavailable("storage unavailable".into()))
        }
        // Refusals a retry would meet again: acknowledged, so Slack does not retry in a loop.
        Err(
            e @ (AdmitError::Fenced
            | AdmitError::ReceiptLimit
            | AdmitError::Forbidden(_)
            | AdmitError::BadThread(_)
            | AdmitError::BadVisibility(_)
            | AdmitError::UnknownAgent(_)),
        ) => {
            tracing::warn!(event_id, channel, error = %e, "slack message refused");
            Ok(ok())
        }
    }
}

/// A button click in a block: what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// A card's Stop button: a soft stop of the run.
    Stop { run_id: RunId },
    /// A card's Approve or Deny button (SPEC §13): the decision on one call the run awaits approval of.
    Decide {
        decision: Decision,
        run_id: RunId,
        call_id: String,
    },
    /// Anything else (including a Stop without a run id, or a decision whose value names no call).
    Other { action_id: String },
}

/// The JSON of a form body's `payload` field; `None` when the body is not such a form.
fn interaction_payload(body: &[u8]) -> Option<Value> {
    let form = std::str::from_utf8(body).ok()?;
    // `Query::from_query` is actix's `application/x-www-form-urlencoded` decoder (serde_urlencoded).
    let mut fields = web::Query::<HashMap<String, String>>::from_query(form)
        .ok()?
        .into_inner();
    serde_json::from_str(&fields.remove("payload")?).ok()
}

/// The actions of a `block_actions` payload (none for another type).
fn actions_of(payload: &Value) -> Vec<Action> {
    if payload.get("type").and_then(Value::as_str) != Some("block_actions") {
        return Vec::new();
    }
    let actions = payload.get("actions").and_then(Value::as_array);
    actions
        .into_iter()
        .flatten()
        .map(|a| {
            let action_id = a.get("action_id").and_then(Value::as_str).unwrap_or("");
            let value = a
                .get("value")
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty());
            let decision = match action_id {
                APPROVE_ACTION_ID => Some(Decision::Approve),
                DENY_ACTION_ID => Some(Decision::Deny),
                _ => None,
            };
            match (action_id, decision, value) {
                (STOP_ACTION_ID, _, Some(run_id)) => Action::Stop {
                    run_id: run_id.into(),
                },
                (_, Some(decision), Some(value)) => match approval_of(value) {
                    Some((run_id, call_id)) => Action::Decide {
                        decision,
                        run_id: run_id.into(),
                        call_id,
                    },
                    None => Action::Other {
                        action_id: action_id.to_owned(),
                    },
                },
                _ => Action::Other {
                    action_id: action_id.chars().take(64).collect(),
                },
            }
        })
        .collect()
}

/// `POST /slack/interactions`: button clicks. Always 200 `{}` once the signature verifies.
async fn post_interactions(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    accept(&req, &state, &body)?;
    let done = || HttpResponse::Ok().json(json!({}));
    let Some(payload) = interaction_payload(&body) else {
        tracing::warn!("slack interaction without a JSON payload field ignored");
        return Ok(done());
    };
    let user = payload
        .pointer("/user/id")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let channel = payload.pointer("/channel/id").and_then(Value::as_str);
    for action in actions_of(&payload) {
        match action {
            Action::Stop { run_id } => stop(&state, &run_id, user, channel).await,
            Action::Decide {
                decision,
                run_id,
                call_id,
            } => decide(&state, run_id, call_id, decision, user, channel).await,
            Action::Other { action_id } => {
                tracing::debug!(action_id, "slack action ignored")
            }
        }
    }
    Ok(done())
}

/// Only runs of the channel a button was clicked in (its card's channel): a click reaches no run of
/// another channel.
fn clicked_in(channel: Option<&str>) -> VisibilityFilter {
    match channel {
        Some(id) => VisibilityFilter::ChannelsIn {
            ids: vec![id.to_owned()],
        },
        None => VisibilityFilter::None,
    }
}

/// The decision of the Slack user who clicked Approve or Deny on a run's card, taken as the JSON route
/// takes it ([`decide_as`], `who` = `slack:<user>`), for a run of the channel it was clicked in. Slack
/// hears 200 whatever the outcome: a click on a call decided already (409) or a run gone (404) is
/// logged, as the card's next frame shows what happened.
async fn decide(
    state: &AppState,
    run_id: RunId,
    call_id: String,
    decision: Decision,
    user: &str,
    channel: Option<&str>,
) {
    match state
        .runs
        .get_run(&run_id, false, &clicked_in(channel))
        .await
    {
        Ok(_) => {}
        Err(RunsError::Unavailable(e)) => {
            tracing::warn!(%run_id, call_id, slack_user = user, error = %e, "slack decision unavailable");
            return;
        }
        Err(e) => {
            tracing::info!(%run_id, call_id, slack_user = user, error = %e, "slack decision refused: no such run in this channel");
            return;
        }
    }
    let who = StopActor::new("slack", user);
    let who = format!("{}:{}", who.kind, who.id);
    let (run, call) = (run_id.clone(), call_id.clone());
    match decide_as(state, run, call, decision, who, None).await {
        Ok(_) => tracing::info!(
            %run_id,
            call_id,
            decision = decision.as_str(),
            slack_user = user,
            "slack decision recorded"
        ),
        Err(e @ (ApiError::Conflict(_) | ApiError::NotFound(_))) => {
            tracing::info!(%run_id, call_id, slack_user = user, error = %e, "slack decision refused")
        }
        Err(e) => {
            tracing::warn!(%run_id, call_id, slack_user = user, error = %e, "slack decision not recorded")
        }
    }
}

/// A soft stop of `run_id` by the Slack user who clicked its card's Stop button, as the JSON stop route
/// does it, for a run of the channel it was clicked in.
async fn stop(state: &AppState, run_id: &RunId, user: &str, channel: Option<&str>) {
    let visible_to = clicked_in(channel);
    let actor = StopActor::new("slack", user);
    match state
        .runs
        .stop_run(
            &state.supervisor,
            run_id,
            StopMode::Soft,
            actor,
            &visible_to,
        )
        .await
    {
        Ok(_) => tracing::info!(%run_id, slack_user = user, "slack stop recorded"),
        Err(RunsError::Unavailable(e)) => {
            tracing::warn!(%run_id, slack_user = user, error = %e, "slack stop unavailable")
        }
        Err(e) => tracing::info!(%run_id, slack_user = user, error = %e, "slack stop refused"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const NOW: i64 = 1_531_420_618;

    #[test]
    fn a_signed_request_verifies_and_any_change_is_refused() {
        // Slack's documented example: this secret, timestamp and body sign to this value.
        let body = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        let ts = NOW.to_string();
        let signature = sign(SECRET, &ts, body);
        assert_eq!(
            signature,
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
        assert_eq!(verify(SECRET, &ts, body, &signature, NOW), Ok(()));
        // Within the window either way.
        assert_eq!(verify(SECRET, &ts, body, &signature, NOW + 300), Ok(()));
        assert_eq!(verify(SECRET, &ts, body, &signature, NOW - 300), Ok(()));

        // One flipped byte of the body, of the signature, of the secret, of the timestamp: refused.
        let mut flipped = body.to_vec();
        flipped[10] ^= 1;
        assert_eq!(
            verify(SECRET, &ts, &flipped, &signature, NOW),
            Err(SignatureError::Mismatch)
        );
        let mut bad = signature.clone().into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'0' { b'1' } else { b'0' };
        let bad = String::from_utf8(bad).unwrap();
        assert_eq!(
            verify(SECRET, &ts, body, &bad, NOW),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("another secret", &ts, body, &signature, NOW),
            Err(SignatureError::Mismatch)
        );
        let next = (NOW + 1).to_string();
        assert_eq!(
            verify(SECRET, &next, body, &signature, NOW),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn timestamps_over_five_minutes_off_or_not_numbers_are_refused() {
        let body = br#"{"type":"event_callback"}"#;
        let at = |secs: i64| {
            let ts = secs.to_string();
            let signature = sign(SECRET, &ts, body);
            verify(SECRET, &ts, body, &signature, NOW)
        };
        // Validly signed, but too old or too far in the future: a replay or a skewed clock.
        assert_eq!(at(NOW - 301), Err(SignatureError::Stale { skew_secs: 301 }));
        assert_eq!(at(NOW + 301), Err(SignatureError::Stale { skew_secs: 301 }));
        assert_eq!(
            at(0),
            Err(SignatureError::Stale {
                skew_secs: NOW as u64
            })
        );
        for ts in [
            "",
            "abc",
            "1531420618.5",
            "-1",
            "+1531420618",
            " 1531420618",
            "99999999999999999999",
        ] {
            let signature = sign(SECRET, ts, body);
            assert_eq!(
                verify(SECRET, ts, body, &signature, NOW),
                Err(SignatureError::BadTimestamp),
                "{ts:?}"
            );
        }
        // The stale refusal is its own answer; the others are bad signatures.
        assert!(matches!(
            ApiError::from(SignatureError::Stale { skew_secs: 301 }),
            ApiError::StaleTimestamp(_)
        ));
        assert!(matches!(
            ApiError::from(SignatureError::BadTimestamp),
            ApiError::BadSignature(_)
        ));
    }

    #[test]
    fn a_signature_without_its_v0_prefix_or_not_hex_is_malformed() {
        let body = b"{}";
        let ts = NOW.to_string();
        let signature = sign(SECRET, &ts, body);
        let hex = signature.strip_prefix("v0=").unwrap();
        for bad in [
            hex.to_owned(),
            format!("v1={hex}"),
            format!("V0={hex}"),
            format!("v0={}", &hex[..62]),
            format!("v0={hex}00"),
            format!("v0={}zz", &hex[..62]),
            String::new(),
            "v0=".into(),
        ] {
            assert_eq!(
                verify(SECRET, &ts, body, &bad, NOW),
                Err(SignatureError::Malformed),
                "{bad:?}"
            );
        }
        // Hex digits are hex digits in either case.
        let upper = format!("v0={}", hex.to_ascii_uppercase());
        assert_eq!(verify(SECRET, &ts, body, &upper, NOW), Ok(()));
    }

    #[test]
    fn the_ingress_debug_hides_the_secret() {
        let shown = format!("{:?}", SlackIngress::new("s3cr3t-value"));
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }

    fn mention(text: &str) -> Value {
        json!({
            "type": "app_mention", "user": "U061F7AUR", "text": text,
            "ts": "1515449522.000016", "channel": "C0LAN2Q65", "event_ts": "1515449522000016"
        })
    }

    #[test]
    fn a_mention_is_admitted_on_its_thread_with_the_mention_stripped() {
        // A top-level mention starts a thread at its own ts.
        let r = admission_of(&mention("<@U0LAN0Z89> is it everything a river should be?"))
            .expect("admitted");
        assert_eq!(r.thread, "1515449522.000016");
        assert_eq!(r.channel, "C0LAN2Q65");
        assert_eq!(r.user, "U061F7AUR");
        assert_eq!(r.text, "is it everything a river should be?");
        assert_eq!(r.agent, None);
        assert_eq!(r.parent_run_id, None);
        assert_eq!(r.visibility.as_deref(), Some("public"));
        assert_eq!(r.source, Source::Slack);
        assert_eq!(r.thread_key(), "C0LAN2Q65:1515449522.000016");

        // A mention inside a thread belongs to that thread.
        let mut in_thread = mention("<@U0LAN0Z89> and now?");
        in_thread["thread_ts"] = json!("1515449000.000001");
        assert_eq!(
            admission_of(&in_thread).unwrap().thread,
            "1515449000.000001"
        );

        // Several leading mentions, a labelled one, surrounding space; a later mention stays.
        let r = admission_of(&mention(
            "  <@U0LAN0Z89|bot> <@W123>  ask <@U999> please \n",
        ))
        .unwrap();
        assert_eq!(r.text, "ask <@U999> please");
        // Not a mention: kept as typed.
        let r = admission_of(&mention("<@ not one> hi")).unwrap();
        assert_eq!(r.text, "<@ not one> hi");
        // Nothing left but the mention: nothing to ask.
        assert_eq!(admission_of(&mention("<@U0LAN0Z89>  ")), None);
    }

    #[test]
    fn visibility_follows_the_channel_id_prefix() {
        for (channel, visibility) in [
            ("D024BE91L", "dm"),
            ("G024BE91L", "private"),
            ("C024BE91L", "public"),
        ] {
            let mut e = mention("<@U0LAN0Z89> hi");
            e["channel"] = json!(channel);
            assert_eq!(
                admission_of(&e).unwrap().visibility.as_deref(),
                Some(visibility)
            );
            // Each is a visibility the record contract knows.
            assert!(ChannelVisibility::ALL
                .iter()
                .any(|v| v.as_str() == visibility));
        }
    }

    #[test]
    fn a_direct_message_is_admitted_and_a_channel_message_without_a_mention_is_not() {
        let dm = json!({
            "type": "message", "channel_type": "im", "channel": "D024BE91L", "user": "U2147483697",
            "text": "Hello hello can you hear me?", "ts": "1355517523.000005"
        });
        let r = admission_of(&dm).expect("a DM is admitted");
        assert_eq!(r.text, "Hello hello can you hear me?");
        assert_eq!(r.visibility.as_deref(), Some("dm"));
        assert_eq!(r.thread, "1355517523.000005");

        let mut in_channel = dm.clone();
        in_channel["channel_type"] = json!("channel");
        in_channel["channel"] = json!("C024BE91L");
        assert_eq!(admission_of(&in_channel), None);
        let mut no_type = dm.clone();
        no_type.as_object_mut().unwrap().remove("channel_type");
        assert_eq!(admission_of(&no_type), None);
    }

    #[test]
    fn bots_subtypes_other_types_and_missing_fields_admit_nothing() {
        let dm = json!({
            "type": "message", "channel_type": "im", "channel": "D024BE91L", "user": "U2147483697",
            "text": "hi", "ts": "1355517523.000005"
        });
        // The app's own messages (and any bot's) carry a bot_id.
        let mut bot = dm.clone();
        bot["bot_id"] = json!("B123");
        assert_eq!(admission_of(&bot), None);
        let mut bot_mention = mention("<@U0LAN0Z89> hi");
        bot_mention["bot_id"] = json!("B123");
        assert_eq!(admission_of(&bot_mention), None);
        // Edits, deletions, joins…
        for subtype in [
            "message_changed",
            "message_deleted",
            "bot_message",
            "channel_join",
        ] {
            let mut e = dm.clone();
            e["subtype"] = json!(subtype);
            assert_eq!(admission_of(&e), None, "{subtype}");
        }
        // Other event types.
        for kind in ["reaction_added", "app_home_opened", ""] {
            let mut e = dm.clone();
            e["type"] = json!(kind);
            assert_eq!(admission_of(&e), None, "{kind}");
        }
        // Each required field missing, empty or not a string.
        for f in ["type", "channel", "user", "text", "ts"] {
            for broken in [None, Some(json!("")), Some(json!(7))] {
                let mut e = dm.clone();
                match broken {
                    None => {
                        e.as_object_mut().unwrap().remove(f);
                    }
                    Some(v) => e[f] = v,
                }
                assert_eq!(admission_of(&e), None, "{f}");
            }
        }
        assert_eq!(admission_of(&json!("not an object")), None);
        // A null bot_id or subtype is no bot and no subtype.
        let mut nulls = dm.clone();
        nulls["bot_id"] = Value::Null;
        nulls["subtype"] = Value::Null;
        assert!(admission_of(&nulls).is_some());
    }

    #[test]
    fn caps_match_the_json_api_and_the_body_hash_is_stable() {
        let r = admission_of(&mention("<@U0LAN0Z89> hi")).unwrap();
        assert_eq!(over_cap(&r), None);
        let with = |f: fn(&mut Request)| {
            let mut r = r.clone();
            f(&mut r);
            over_cap(&r)
        };
        assert_eq!(with(|r| r.channel = "C".repeat(65)), Some("channel"));
        assert_eq!(with(|r| r.channel = "C:1".into()), Some("channel"));
        assert_eq!(with(|r| r.thread = "1".repeat(192)), Some("thread"));
        assert_eq!(with(|r| r.thread = "1".repeat(191)), None);
        assert_eq!(with(|r| r.user = "U".repeat(257)), Some("user"));
        assert_eq!(
            with(|r| r.text = "x".repeat(MAX_TEXT_BYTES + 1)),
            Some("text")
        );
        assert_eq!(with(|r| r.text = "x".repeat(MAX_TEXT_BYTES)), None);

        // A retry maps to the same request, so to the same hash: the receipt answers it.
        let again = admission_of(&mention("<@U0LAN0Z89> hi")).unwrap();
        assert_eq!(body_hash(&r), body_hash(&again));
        assert_eq!(body_hash(&r).len(), 64);
        assert_ne!(body_hash(&r), body_hash(&with_text(&r, "ho")));
    }

    fn with_text(r: &Request, text: &str) -> Request {
        Request {
            text: text.into(),
            ..r.clone()
        }
    }

    /// `payload=<json>` form-encoded, as Slack posts an interaction.
    fn form(payload: &Value) -> Vec<u8> {
        let encoded: String = payload
            .to_string()
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".into(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        format!("payload={encoded}").into_bytes()
    }

    #[test]
    fn stop_and_decision_clicks_name_their_run_and_call_and_other_actions_are_told_apart() {
        let approval =
            actors::channel::slack::approval_value(&RunId::from("0190a1b2-run"), "call-1").unwrap();
        let payload = json!({
            "type": "block_actions",
            "user": {"id": "U123", "name": "a person"},
            "channel": {"id": "C024BE91L"},
            "actions": [
                {"action_id": "stop", "value": "0190a1b2-run", "type": "button"},
                {"action_id": "approve", "value": approval, "type": "button"},
                {"action_id": "deny", "value": approval, "type": "button"},
                {"action_id": "approve", "value": "call-1"},
                {"action_id": "deny"},
                {"action_id": "stop"},
                {"action_id": "something_else", "value": "x"}
            ]
        });
        let parsed = interaction_payload(&form(&payload)).expect("a form with a JSON payload");
        assert_eq!(parsed, payload);
        assert_eq!(
            actions_of(&parsed),
            vec![
                Action::Stop {
                    run_id: "0190a1b2-run".into()
                },
                Action::Decide {
                    decision: Decision::Approve,
                    run_id: "0190a1b2-run".into(),
                    call_id: "call-1".into(),
                },
                Action::Decide {
                    decision: Decision::Deny,
                    run_id: "0190a1b2-run".into(),
                    call_id: "call-1".into(),
                },
                // A value that names no run and call, or none: nothing to decide.
                Action::Other {
                    action_id: "approve".into()
                },
                Action::Other {
                    action_id: "deny".into()
                },
                Action::Other {
                    action_id: "stop".into()
                },
                Action::Other {
                    action_id: "something_else".into()
                },
            ]
        );
        // Another payload type carries no block actions.
        let mut other = payload.clone();
        other["type"] = json!("view_submission");
        assert_eq!(actions_of(&other), Vec::new());
        // Not a form with a JSON payload.
        assert_eq!(interaction_payload(b"payload=not%20json"), None);
        assert_eq!(interaction_payload(b"other=1"), None);
        assert_eq!(interaction_payload(&[0xff, 0xfe]), None);
    }
}
