//! `POST /api/messages`: admission (SPEC §5.1).

use actix_web::{web, HttpRequest, HttpResponse};
use actors::run::Request;
use actors::supervisor::{AdmitError, AdmitMessage, Admitted};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use storage::ledger::ReceiptKey;
use storage::RunId;

use super::resource;
use crate::auth::MESSAGES_WRITE;
use crate::error::ApiError;
use crate::AppState;

/// Request body cap for messages.
pub const MESSAGE_BODY_LIMIT: usize = 2 << 20;
/// Longest `text`, in UTF-8 bytes.
pub const MAX_TEXT_BYTES: usize = 1 << 20;
/// Field caps in Unicode characters (SPEC §5.1). `channel` + `:` + `thread` fits the ledger's thread-key cap.
pub const MAX_CHANNEL_CHARS: usize = 64;
pub const MAX_THREAD_CHARS: usize = 191;
pub const MAX_USER_CHARS: usize = 256;
pub const MAX_AGENT_CHARS: usize = 64;
pub const MAX_KEY_CHARS: usize = 256;

/// The fields of a message body; any other is a 400 naming it.
pub const MESSAGE_FIELDS: [&str; 9] = [
    "thread",
    "channel",
    "user",
    "text",
    "agent",
    "visibility",
    "key",
    "parentRunId",
    "strategy",
];

const _: () = assert!(
    MAX_CHANNEL_CHARS + 1 + MAX_THREAD_CHARS <= storage::ledger::decisions::MAX_THREAD_KEY_CHARS
);

fn string_field(
    body: &Map<String, Value>,
    field: &'static str,
    required: bool,
) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(ApiError::bad(field, "is required")),
        // Exactly the document's `minLength: 1`: a blank value is a value (whitespace is not the same set
        // in every language's regexes, so the contract does not depend on it).
        Some(Value::String(s)) if required && s.is_empty() => {
            Err(ApiError::bad(field, "must not be empty"))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad(field, "must be a string")),
    }
}

/// `value` has `min..=max` Unicode characters, else a 400 naming `field`.
fn check_chars(field: &'static str, value: &str, min: usize, max: usize) -> Result<(), ApiError> {
    // Counting stops one past the cap: a huge value costs no more than a legal one.
    let n = value.chars().take(max + 1).count();
    if (min..=max).contains(&n) {
        Ok(())
    } else {
        Err(ApiError::bad(
            field,
            format!("must be {min} to {max} characters"),
        ))
    }
}

/// Validate the body; answers the request and its idempotency key (if any).
pub fn parse_message(body: &[u8]) -> Result<(Request, Option<(String, String)>), ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::bad("body", "must be a JSON object"));
    };
    if let Some(unknown) = map.keys().find(|k| !MESSAGE_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad(
            unknown.clone(),
            "is not a field of a message",
        ));
    }
    let req = |f| string_field(&map, f, true).map(|v| v.expect("required"));
    let request = Request {
        thread: req("thread")?,
        channel: req("channel")?,
        user: req("user")?,
        text: req("text")?,
        agent: string_field(&map, "agent", false)?,
        visibility: string_field(&map, "visibility", false)?,
        parent_run_id: string_field(&map, "parentRunId", false)?.map(RunId::from),
        source: Default::default(),
        strategy: match string_field(&map, "strategy", false)? {
            None => None,
            Some(s) => Some(storage::ledger::Strategy::parse(&s).ok_or_else(|| {
                ApiError::bad("strategy", "must be steer, enqueue, reject or interrupt")
            })?),
        },
    };
    // The thread key `<channel>:<thread>` is injective only while no channel holds the separator.
    if request.channel.contains(':') {
        return Err(ApiError::bad("channel", "must not contain ':'"));
    }
    check_chars("channel", &request.channel, 1, MAX_CHANNEL_CHARS)?;
    check_chars("thread", &request.thread, 1, MAX_THREAD_CHARS)?;
    check_chars("user", &request.user, 1, MAX_USER_CHARS)?;
    if let Some(agent) = &request.agent {
        check_chars("agent", agent, 0, MAX_AGENT_CHARS)?;
    }
    if request
        .parent_run_id
        .as_deref()
        .is_some_and(|p| !storage::record::is_valid_run_id(p))
    {
        return Err(ApiError::bad(
            "parentRunId",
            "must be a run id (1 to 64 of A-Z, a-z, 0-9, _ and -)",
        ));
    }
    if request.text.len() > MAX_TEXT_BYTES {
        return Err(ApiError::PayloadTooLarge(format!(
            "text is {} bytes, over {MAX_TEXT_BYTES}",
            request.text.len()
        )));
    }
    let key = match string_field(&map, "key", false)? {
        None => None,
        Some(k) => {
            check_chars("key", &k, 1, MAX_KEY_CHARS)?;
            // The body hash: SHA-256 of the canonical JSON (sorted keys) of the body minus `key`.
            let mut rest = map.clone();
            rest.remove("key");
            Some((k, body_hash(&Value::Object(rest))))
        }
    };
    Ok((request, key))
}

/// An idempotency receipt's body hash (SPEC §5.1): SHA-256 hex of the canonical JSON of `body` (a
/// message minus its `key`). `serde_json`'s maps keep their keys sorted, so `to_string` is canonical.
pub fn body_hash(body: &Value) -> String {
    hex::encode(Sha256::digest(body.to_string().as_bytes()))
}

/// The run's live view, with its capability token.
fn live_url(state: &AppState, run_id: &RunId, token: &str) -> String {
    format!(
        "{}/runs/{run_id}?token={token}",
        state.public_base_url.trim_end_matches('/')
    )
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/api/messages", "POST")
            .app_data(web::PayloadConfig::new(MESSAGE_BODY_LIMIT))
            .route(web::post().to(post_message)),
    );
}

/// `POST /api/messages`: admit a message — a new run on its thread, or a follow-up into the thread's live run.
#[utoipa::path(
    post,
    path = "/api/messages",
    tag = "runs",
    request_body = crate::openapi::MessageBody,
    responses(
        (status = 202, description = "Started a run, steered into the live one, queued behind it or interrupting it (SPEC §5.1 strategy)", body = crate::openapi::Admission),
        (status = 400, description = "A bad field (named), an unknown agent", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, a cross-site request, or the thread's live run is one the token may not see (nothing written)", body = crate::openapi::ErrorBody),
        (status = 409, description = "key_conflict; thread_busy (strategy reject and the thread has a live run; nothing written but a keyed message's receipt, so its retries answer the same); or conflict (the thread's run was fenced; too many keyed receipts)", body = crate::openapi::ErrorBody),
        (status = 413, description = "Body over 2 MiB or text over 1 MiB", body = crate::openapi::ErrorBody),
        (status = 429, description = "queue_full: the thread holds 100 queued messages already (nothing written); retry after `Retry-After` seconds", body = crate::openapi::ErrorBody),
        (status = 415, description = "Not application/json", body = crate::openapi::ErrorBody),
        (status = 503, description = "draining, thread_busy (a keyed message waited 5 s for a finishing run), or storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["messages:write"]))
)]
pub async fn post_message(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = state.auth.require(&req, MESSAGES_WRITE)?;
    if body.len() > MESSAGE_BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!(
            "body over {MESSAGE_BODY_LIMIT} bytes"
        )));
    }
    let (request, key) = parse_message(&body)?;
    let key = key.map(|(key, body_hash)| ReceiptKey {
        scope: principal.name.clone(),
        key,
        body_hash,
    });
    admit(
        &state,
        AdmitMessage {
            request,
            key,
            writer: Some(principal.visible_to.clone()),
        },
    )
    .await
}

/// Admit `msg` through the supervisor and answer as `POST /api/messages` does (SPEC §5.1): 202
/// `{outcome: "started", runId, liveUrl}` or `{outcome: "steered", runId, seq, liveUrl}`, or the
/// admission's refusal as an [`ApiError`]. The one answer of every admission route (a message, a run's
/// retry), so they cannot drift apart.
pub async fn admit(state: &AppState, msg: AdmitMessage) -> Result<HttpResponse, ApiError> {
    let answer = state
        .supervisor
        .send(msg)
        .await
        .map_err(|e| ApiError::Unavailable(format!("supervisor: {e}")))?;
    match answer {
        Ok(Admitted::Started { run_id, token }) => {
            let live_url = live_url(state, &run_id, &token);
            Ok(HttpResponse::Accepted()
                .json(json!({"outcome": "started", "runId": run_id, "liveUrl": live_url})))
        }
        Ok(Admitted::Steered { run_id, seq, token }) => {
            let live_url = live_url(state, &run_id, &token);
            Ok(HttpResponse::Accepted().json(
                json!({"outcome": "steered", "runId": run_id, "seq": seq, "liveUrl": live_url}),
            ))
        }
        Ok(Admitted::Queued {
            run_id,
            position,
            interrupting,
            token,
        }) => {
            let live_url = live_url(state, &run_id, &token);
            let outcome = if interrupting {
                "interrupting"
            } else {
                "queued"
            };
            Ok(HttpResponse::Accepted().json(json!({
                "outcome": outcome, "runId": run_id, "position": position, "liveUrl": live_url,
            })))
        }
        Err(AdmitError::Draining) => Err(ApiError::Draining),
        Err(e @ AdmitError::UnknownAgent(_)) => Err(ApiError::bad("agent", e.to_string())),
        Err(e @ AdmitError::BadVisibility(_)) => Err(ApiError::bad("visibility", e.to_string())),
        Err(e @ AdmitError::BadThread(_)) => Err(ApiError::bad("thread", e.to_string())),
        Err(AdmitError::KeyConflict) => Err(ApiError::KeyConflict),
        Err(AdmitError::ThreadBusy) => Err(ApiError::ThreadBusy),
        Err(AdmitError::Rejected) => Err(ApiError::ThreadLive),
        Err(e @ AdmitError::QueueFull) => Err(ApiError::QueueFull(e.to_string())),
        Err(e @ (AdmitError::Fenced | AdmitError::ReceiptLimit)) => {
            Err(ApiError::Conflict(e.to_string()))
        }
        // Names the thread, never the run the caller may not see (SPEC §8.1: visibility on writes).
        Err(e @ AdmitError::Forbidden(_)) => Err(ApiError::Refused(e.to_string())),
        Err(e @ AdmitError::Unavailable(_)) => {
            tracing::warn!(error = %e, "admission unavailable");
            Err(ApiError::Unavailable("storage unavailable".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid message with `field` set to `value`.
    fn body_with(field: &str, value: Value) -> Vec<u8> {
        let mut map = Map::new();
        for (k, v) in [
            ("thread", "t"),
            ("channel", "c"),
            ("user", "u"),
            ("text", "x"),
        ] {
            map.insert(k.into(), Value::String(v.into()));
        }
        map.insert(field.into(), value);
        Value::Object(map).to_string().into_bytes()
    }

    /// `None` when the message is accepted, else the field its 400 names.
    fn refused_field(field: &str, value: &str) -> Option<String> {
        match parse_message(&body_with(field, Value::String(value.into()))) {
            Ok(_) => None,
            Err(ApiError::BadRequest { field, .. }) => Some(field),
            Err(other) => panic!("{field}: not a 400: {other:?}"),
        }
    }

    #[test]
    fn every_field_cap_accepts_its_boundary_and_refuses_one_over_naming_the_field() {
        // Two-byte characters: the caps count Unicode characters, not bytes.
        for (field, max) in [
            ("channel", MAX_CHANNEL_CHARS),
            ("thread", MAX_THREAD_CHARS),
            ("user", MAX_USER_CHARS),
            ("agent", MAX_AGENT_CHARS),
            ("key", MAX_KEY_CHARS),
        ] {
            assert_eq!(
                refused_field(field, &"é".repeat(max)),
                None,
                "{field} at its cap"
            );
            assert_eq!(
                refused_field(field, &"é".repeat(max + 1)).as_deref(),
                Some(field),
                "{field} one over"
            );
        }
        // The lower bounds: one character is enough, none is refused naming the field.
        for field in ["channel", "thread", "user", "key"] {
            assert_eq!(refused_field(field, "é"), None, "{field} of one character");
            assert_eq!(
                refused_field(field, "").as_deref(),
                Some(field),
                "empty {field}"
            );
        }
        // The longest channel and thread make the longest thread key the ledger stores.
        let longest = body_with("channel", "c".repeat(MAX_CHANNEL_CHARS).into());
        let mut longest: Map<String, Value> = serde_json::from_slice(&longest).unwrap();
        longest.insert("thread".into(), "t".repeat(MAX_THREAD_CHARS).into());
        let (request, _) = parse_message(Value::Object(longest).to_string().as_bytes())
            .expect("both at their caps");
        assert!(storage::ledger::decisions::is_valid_thread_key(
            &request.thread_key()
        ));
    }

    #[test]
    fn text_is_capped_in_bytes_with_a_413() {
        assert!(parse_message(&body_with("text", "x".repeat(MAX_TEXT_BYTES).into())).is_ok());
        let over = parse_message(&body_with("text", "x".repeat(MAX_TEXT_BYTES + 1).into()));
        assert!(
            matches!(over, Err(ApiError::PayloadTooLarge(_))),
            "{over:?}"
        );
        // 2-byte characters: half as many characters reach the same byte cap.
        let over = parse_message(&body_with(
            "text",
            "é".repeat(MAX_TEXT_BYTES / 2 + 1).into(),
        ));
        assert!(
            matches!(over, Err(ApiError::PayloadTooLarge(_))),
            "{over:?}"
        );
    }

    #[test]
    fn a_channel_holding_the_key_separator_is_refused_so_thread_keys_stay_injective() {
        // ("a", "b:x") and ("a:b", "x") would both be the key "a:b:x": only the first is admissible.
        let mut first: Map<String, Value> =
            serde_json::from_slice(&body_with("channel", "a".into())).unwrap();
        first.insert("thread".into(), "b:x".into());
        let (request, _) = parse_message(Value::Object(first).to_string().as_bytes())
            .expect("a thread may hold ':'");
        assert_eq!(request.thread_key(), "a:b:x");
        assert_eq!(refused_field("channel", "a:b").as_deref(), Some("channel"));
        assert_eq!(refused_field("channel", ":").as_deref(), Some("channel"));
    }
}
