//! `POST /api/messages`: admission (SPEC §5.1).

use actix_web::{web, HttpRequest, HttpResponse};
use actors::run::Request;
use actors::supervisor::{AdmitError, AdmitMessage, Admitted};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use storage::ledger::ReceiptKey;

use crate::auth::MESSAGES_WRITE;
use crate::error::ApiError;
use crate::AppState;

/// Request body cap for messages.
pub const MESSAGE_BODY_LIMIT: usize = 2 << 20;
/// Longest `text`, in UTF-8 bytes.
pub const MAX_TEXT_BYTES: usize = 1 << 20;
const MAX_KEY_CHARS: usize = 256;

fn string_field(body: &Map<String, Value>, field: &'static str, required: bool) -> Result<Option<String>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(ApiError::bad(field, "is required")),
        Some(Value::String(s)) if required && s.trim().is_empty() => Err(ApiError::bad(field, "must not be empty")),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad(field, "must be a string")),
    }
}

/// Validate the body; answers the request and its idempotency key (if any).
pub fn parse_message(body: &[u8]) -> Result<(Request, Option<(String, String)>), ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
    let Value::Object(map) = value else { return Err(ApiError::bad("body", "must be a JSON object")) };
    if let Some(unknown) = map.keys().find(|k| !["thread", "channel", "user", "text", "agent", "visibility", "key"].contains(&k.as_str())) {
        return Err(ApiError::bad(unknown.clone(), "is not a field of a message"));
    }
    let req = |f| string_field(&map, f, true).map(|v| v.expect("required"));
    let request = Request {
        thread: req("thread")?,
        channel: req("channel")?,
        user: req("user")?,
        text: req("text")?,
        agent: string_field(&map, "agent", false)?,
        visibility: string_field(&map, "visibility", false)?,
    };
    if request.text.len() > MAX_TEXT_BYTES {
        return Err(ApiError::PayloadTooLarge(format!("text is {} bytes, over {MAX_TEXT_BYTES}", request.text.len())));
    }
    let key = match string_field(&map, "key", false)? {
        None => None,
        Some(k) if k.is_empty() || k.chars().count() > MAX_KEY_CHARS => {
            return Err(ApiError::bad("key", format!("must be 1 to {MAX_KEY_CHARS} characters")))
        }
        Some(k) => {
            // The body hash: SHA-256 of the canonical JSON (sorted keys) of the body minus `key`.
            let mut rest = map.clone();
            rest.remove("key");
            let hash = hex::encode(Sha256::digest(Value::Object(rest).to_string().as_bytes()));
            Some((k, hash))
        }
    };
    Ok((request, key))
}

pub async fn post_message(req: HttpRequest, body: web::Bytes, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let principal = state.auth.require(&req, MESSAGES_WRITE)?;
    if body.len() > MESSAGE_BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!("body over {MESSAGE_BODY_LIMIT} bytes")));
    }
    let (request, key) = parse_message(&body)?;
    let key = key.map(|(key, body_hash)| ReceiptKey { scope: principal.name.clone(), key, body_hash });
    let answer = state
        .supervisor
        .send(AdmitMessage { request, key })
        .await
        .map_err(|e| ApiError::Unavailable(format!("supervisor: {e}")))?;
    match answer {
        Ok(Admitted::Started { run_id, token }) => {
            let live_url = format!("{}/runs/{run_id}?token={token}", state.public_base_url.trim_end_matches('/'));
            Ok(HttpResponse::Accepted().json(json!({"outcome": "started", "runId": run_id, "liveUrl": live_url})))
        }
        Ok(Admitted::Steered { run_id, seq }) => {
            Ok(HttpResponse::Accepted().json(json!({"outcome": "steered", "runId": run_id, "seq": seq})))
        }
        Err(AdmitError::Draining) => Err(ApiError::Draining),
        Err(e @ AdmitError::UnknownAgent(_)) => Err(ApiError::bad("agent", e.to_string())),
        Err(e @ AdmitError::BadVisibility(_)) => Err(ApiError::bad("visibility", e.to_string())),
        Err(e @ AdmitError::BadThread(_)) => Err(ApiError::bad("thread", e.to_string())),
        Err(AdmitError::KeyConflict) => Err(ApiError::KeyConflict),
        Err(AdmitError::ThreadBusy) => Err(ApiError::ThreadBusy),
        Err(e @ (AdmitError::Fenced | AdmitError::ReceiptLimit)) => Err(ApiError::Conflict(e.to_string())),
        Err(e @ AdmitError::Unavailable(_)) => {
            tracing::warn!(error = %e, "admission unavailable");
            Err(ApiError::Unavailable("storage unavailable".into()))
        }
    }
}
