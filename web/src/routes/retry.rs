//! `POST /api/runs/{id}/retry`: run again (issue 28) — a new run on the retried run's thread from its
//! original request, linked to it by `parentRunId`.
//!
//! The original request is read back from what the run left (SPEC §5.1, §7):
//! - the thread, channel, user, agent and visibility from the run's view (its head), so a live run and
//!   the same run finished give the same request — the agent is the one that ran, not "the default";
//! - the text, for a run live in some process, from its ledger row's `meta.request` (exact: what was
//!   admitted); otherwise from its first `input` event with `source: "request"` (as stored: redacted, and
//!   capped at 64 KiB — a capped text is no longer the request, so that retry is a 409
//!   `request_truncated`).
//!
//! The request is then admitted exactly as a message is ([`messages::admit`]): the same 202 answers
//! (`started`, or `steered` when the thread's live run takes it), the same refusals. It comes through the
//! API, so it shows no chat card, whatever channel the retried run came from: a finished run's record does
//! not say where its message came from, and a live run's retry must not behave otherwise.
//!
//! Who may: the `messages:write` scope (a retry is a message); a run the caller may not see answers 404,
//! as every read does. An optional body `{key?}` makes the retry idempotent like a keyed message: the
//! key is scoped to the token's name and the body hash is over the retried request as a message body
//! (so a key reused for another run, or for a different message, is a `key_conflict`).

use actix_web::{web, HttpRequest, HttpResponse};
use actors::run::{Request, Source};
use actors::runs_service::{RunView, RunsError};
use actors::supervisor::AdmitMessage;
use serde::Serialize;
use serde_json::Value;
use storage::ledger::ReceiptKey;
use storage::record::VisibilityFilter;
use storage::RunId;
use utoipa::ToSchema;

use super::{api, messages, resource};
use crate::auth::MESSAGES_WRITE;
use crate::error::ApiError;
use crate::AppState;

/// The fields of a retry's body; any other is a 400 naming it.
pub const RETRY_FIELDS: [&str; 1] = ["key"];

/// Events read in the first page while looking for the request: it is the run's second event.
const FIRST_PAGE: usize = 8;

/// `POST /api/runs/{id}/retry`'s optional body; any other field is a 400 naming it.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Idempotency key (1 to 256 characters), scoped to the token: the same key for the same run
    /// answers the first retry's answer again; for another run or message, `key_conflict`.
    #[schema(min_length = 1, max_length = 256)]
    pub key: Option<String>,
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/runs/{id}/retry", "POST").route(web::post().to(retry_run)));
}

/// `POST /api/runs/{id}/retry`: run the run's original request again, on its thread, as a new run whose
/// `parentRunId` is this run (or steered into the thread's live run).
#[utoipa::path(
    post,
    path = "/api/runs/{id}/retry",
    tag = "runs",
    params(("id" = String, Path, description = "The run to run again")),
    request_body(content = Option<RetryBody>, description = "Empty, or an idempotency key"),
    responses(
        (status = 202, description = "Started a run (its `parentRunId` is this run) or steered into the thread's live run", body = crate::openapi::Admission),
        (status = 400, description = "A bad body field (named); the run's agent is no longer configured", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody),
        (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such run the caller may see", body = crate::openapi::ErrorBody),
        (status = 409, description = "request_truncated (the stored request text was capped), key_conflict, or conflict (no request recorded; the thread's run was fenced; too many keyed receipts)", body = crate::openapi::ErrorBody),
        (status = 413, description = "Body over 512 KiB", body = crate::openapi::ErrorBody),
        (status = 415, description = "A body that is not application/json", body = crate::openapi::ErrorBody),
        (status = 503, description = "draining, thread_busy (a keyed retry waited 5 s for a finishing run), or storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["messages:write"]))
)]
pub async fn retry_run(
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = state.auth.require(&req, MESSAGES_WRITE)?;
    let run_id = RunId::from(path.into_inner());
    if body.len() > super::runs::BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!(
            "body over {} bytes",
            super::runs::BODY_LIMIT
        )));
    }
    let key = parse_retry(&body)?;
    let request = original_request(&state, &run_id, &principal.visible_to).await?;
    let key = match key {
        None => None,
        Some(key) => {
            let as_message = serde_json::to_value(&request)
                .map_err(|e| ApiError::Unavailable(format!("encode the request: {e}")))?;
            Some(ReceiptKey {
                scope: principal.name.clone(),
                key,
                body_hash: messages::body_hash(&as_message),
            })
        }
    };
    messages::admit(
        &state,
        AdmitMessage {
            request,
            key,
            writer: Some(principal.visible_to.clone()),
        },
    )
    .await
}

/// The body: empty, `null`, or `{key?}` (the key as a message's: 1 to 256 characters).
fn parse_retry(body: &[u8]) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
    let map = match value {
        Value::Object(map) => map,
        // The body is optional: `null` is no body (as a stop's).
        Value::Null => return Ok(None),
        _ => return Err(ApiError::bad("body", "must be a JSON object")),
    };
    if let Some(unknown) = map.keys().find(|k| !RETRY_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad(unknown.clone(), "is not a field of a retry"));
    }
    match map.get("key") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(k)) => {
            let n = k.chars().take(messages::MAX_KEY_CHARS + 1).count();
            if (1..=messages::MAX_KEY_CHARS).contains(&n) {
                Ok(Some(k.clone()))
            } else {
                Err(ApiError::bad(
                    "key",
                    format!("must be 1 to {} characters", messages::MAX_KEY_CHARS),
                ))
            }
        }
        Some(_) => Err(ApiError::bad("key", "must be a string")),
    }
}

/// The request run `run_id` was admitted with, to run again: a new run's `parentRunId` is `run_id`.
async fn original_request(
    state: &AppState,
    run_id: &RunId,
    visible_to: &VisibilityFilter,
) -> Result<Request, ApiError> {
    let view = match state.runs.get_run(run_id, false, visible_to).await {
        Ok(view) => view,
        // A run the caller cannot see is, to it, a run that does not exist.
        Err(RunsError::NotFound | RunsError::Forbidden(_) | RunsError::Conflict(_)) => {
            return Err(ApiError::NotFound(format!("run {run_id}")))
        }
        Err(e) => return Err(api::runs_error(e, run_id)),
    };
    let live_text = if view.finished {
        None
    } else {
        match state.storage.get_live(run_id.clone()).await {
            // An unreadable request (no `meta.request`) falls back to the events, as a finished run's.
            Ok(row) => row.as_ref().and_then(Request::of_row).map(|r| r.text),
            Err(e) => {
                tracing::warn!(%run_id, error = %e, "retry: ledger read unavailable");
                return Err(ApiError::Unavailable("storage unavailable".into()));
            }
        }
    };
    let text = match live_text {
        Some(text) => text,
        // Finished (or finished since the view was read): the events hold the same seqs live and stored.
        None => recorded_text(state, run_id, visible_to).await?,
    };
    request_of(&view, text)
}

/// The text of the run's first `input` event with `source: "request"`.
async fn recorded_text(
    state: &AppState,
    run_id: &RunId,
    visible_to: &VisibilityFilter,
) -> Result<String, ApiError> {
    let mut after = 0;
    let mut limit = FIRST_PAGE;
    loop {
        let page = state
            .runs
            .get_run_events(run_id, after, Some(limit), visible_to)
            .await
            .map_err(|e| match e {
                RunsError::NotFound | RunsError::Forbidden(_) | RunsError::Conflict(_) => {
                    ApiError::NotFound(format!("run {run_id}"))
                }
                e => api::runs_error(e, run_id),
            })?;
        let request = page
            .events
            .iter()
            .find(|e| e["type"] == "input" && e["source"] == "request");
        if let Some(input) = request {
            if input.get("truncated") == Some(&Value::Bool(true)) {
                return Err(ApiError::RequestTruncated(format!(
                    "run {run_id}'s request text was capped when it was stored (over {} bytes of \
                     JSON); the whole text is gone, so it cannot be run again",
                    storage::record::MAX_EVENT_BYTES
                )));
            }
            return match input["text"].as_str() {
                Some(text) => Ok(text.to_owned()),
                None => Err(ApiError::Conflict(format!(
                    "run {run_id}'s request event has no text"
                ))),
            };
        }
        match page.next_after_seq {
            Some(next) if next > after && !page.events.is_empty() => after = next,
            _ => {
                return Err(ApiError::Conflict(format!(
                    "run {run_id} has no recorded request to run again"
                )))
            }
        }
        limit = actors::runs_service::EVENTS_PAGE_MAX;
    }
}

/// The retried run's request with `text`: its thread, channel, user, agent and visibility as its head
/// states them, `parentRunId` the retried run, from the API.
fn request_of(view: &RunView, text: String) -> Result<Request, ApiError> {
    // The thread key is `<channel>:<thread>`, and a channel holds no `:` (SPEC §5.1).
    let thread = view
        .thread_key
        .strip_prefix(&view.channel_id)
        .and_then(|rest| rest.strip_prefix(':'))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::Conflict(format!(
                "run {}'s thread key {:?} is not of its channel {:?}",
                view.id, view.thread_key, view.channel_id
            ))
        })?;
    Ok(Request {
        thread: thread.to_owned(),
        channel: view.channel_id.clone(),
        user: view.user_id.clone(),
        text,
        agent: view.agent.clone(),
        visibility: Some(view.channel_visibility.as_str().to_owned()),
        parent_run_id: Some(view.id.clone()),
        source: Source::Api,
        strategy: None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use storage::record::ChannelVisibility;

    use super::*;

    fn view(channel: &str, thread_key: &str) -> RunView {
        serde_json::from_value(serde_json::json!({
            "id": "r1", "agent": "demo", "channelId": channel, "userId": "u1",
            "threadKey": thread_key, "channelVisibility": "public", "startedAt": 1,
            "finished": true, "eventCount": 2,
        }))
        .unwrap()
    }

    #[test]
    fn the_request_is_the_runs_thread_identity_and_names_the_run_as_parent() {
        let request = request_of(&view("c1", "c1:t:1"), "again".into()).unwrap();
        assert_eq!(
            request,
            Request {
                thread: "t:1".into(),
                channel: "c1".into(),
                user: "u1".into(),
                text: "again".into(),
                agent: Some("demo".into()),
                visibility: Some(ChannelVisibility::Public.as_str().into()),
                parent_run_id: Some("r1".into()),
                source: Source::Api,
                strategy: None,
            }
        );
        assert_eq!(request.thread_key(), "c1:t:1");
        for bad in ["c2:t", "c1:", "c1t"] {
            assert!(
                matches!(
                    request_of(&view("c1", bad), "x".into()),
                    Err(ApiError::Conflict(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_body_is_empty_or_a_key() {
        assert_eq!(parse_retry(b"").unwrap(), None);
        assert_eq!(parse_retry(b"{}").unwrap(), None);
        assert_eq!(parse_retry(b"null").unwrap(), None);
        assert_eq!(parse_retry(br#"{"key": null}"#).unwrap(), None);
        assert_eq!(
            parse_retry(br#"{"key": "k1"}"#).unwrap().as_deref(),
            Some("k1")
        );
        let field = |body: &str| match parse_retry(body.as_bytes()) {
            Err(ApiError::BadRequest { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        };
        assert_eq!(field(r#"{"key": ""}"#), "key");
        assert_eq!(field(r#"{"key": 3}"#), "key");
        assert_eq!(
            field(&format!(
                r#"{{"key": "{}"}}"#,
                "k".repeat(messages::MAX_KEY_CHARS + 1)
            )),
            "key"
        );
        assert_eq!(field(r#"{"text": "x"}"#), "text");
        assert_eq!(field("[]"), "body");
        assert_eq!(field("{"), "body");
    }

    #[test]
    fn the_documented_body_is_exactly_the_fields_accepted() {
        let doc: Value =
            serde_json::from_str(&crate::openapi::document("0").to_json().unwrap()).unwrap();
        let documented: BTreeSet<&str> = doc["components"]["schemas"]["RetryBody"]["properties"]
            .as_object()
            .expect("RetryBody is in the document")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(documented, RETRY_FIELDS.into_iter().collect());
    }
}
