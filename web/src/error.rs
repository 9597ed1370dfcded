//! `ApiError`: the one map from failures to HTTP answers `{error, message}` (SPEC §8.1).
//!
//! Details are logged where the error is handled; a 500 carries a generic message, never internals.
//! Answers that actix itself produces (an extractor's 413, a resource's bare 405) are rewritten to the
//! same shape by the edge middleware through [`code_for_status`], so no answer escapes as text.

use actix_web::http::header::{HeaderValue, ALLOW};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A bad request naming the field.
    #[error("{field}: {why}")]
    BadRequest { field: String, why: String },
    #[error("authentication required")]
    Unauthorized,
    #[error("missing scope {0}")]
    Forbidden(&'static str),
    /// Refused whoever the caller is: a cross-site request, or a Host the process does not serve under
    /// dev bypass (SPEC §8.1, cross-site protection). The message says which check refused it.
    #[error("{0}")]
    Refused(String),
    #[error("{0} not found")]
    NotFound(String),
    /// The path exists, the method does not; `Allow` lists the methods it has.
    #[error("method {method} is not allowed here; use {allow}")]
    MethodNotAllowed { method: String, allow: &'static str },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the idempotency key was used with another body")]
    KeyConflict,
    /// A run asked to run again whose stored request text was capped (`truncated: true`): the whole
    /// text is gone, and a shortened one is not the original request. The message says why.
    #[error("{0}")]
    RequestTruncated(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("the process is draining")]
    Draining,
    #[error("the thread's run is finishing; try again")]
    ThreadBusy,
    /// The thread's queue is full (SPEC §5.1 `enqueue`): 429 `queue_full` with `Retry-After`, nothing written.
    #[error("{0}")]
    QueueFull(String),
    /// `strategy: "reject"` on a thread with a live run (SPEC §5.1): 409 `thread_busy`, nothing written.
    #[error("the thread has a live run and the message's strategy is reject")]
    ThreadLive,
    /// A signed webhook (Slack, SPEC §12) without a valid signature: missing, garbled or not matching.
    /// Nothing it asked for is done.
    #[error("{0}")]
    BadSignature(String),
    /// A signed webhook whose timestamp is too far from now (a replay, or a skewed clock). Nothing it
    /// asked for is done.
    #[error("{0}")]
    StaleTimestamp(String),
}

impl ApiError {
    pub fn bad(field: impl Into<String>, why: impl Into<String>) -> Self {
        ApiError::BadRequest {
            field: field.into(),
            why: why.into(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden(_) | ApiError::Refused(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Conflict(_) => "conflict",
            ApiError::KeyConflict => "key_conflict",
            ApiError::RequestTruncated(_) => "request_truncated",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Draining => "draining",
            ApiError::ThreadBusy | ApiError::ThreadLive => "thread_busy",
            ApiError::QueueFull(_) => "queue_full",
            ApiError::BadSignature(_) => "bad_signature",
            ApiError::StaleTimestamp(_) => "stale_timestamp",
        }
    }
}

/// The `error` code for an answer of `status` that no [`ApiError`] produced (actix's own answers), and
/// the message it carries: never the original text of a 5xx.
pub fn code_for_status(status: StatusCode) -> (&'static str, &'static str) {
    match status.as_u16() {
        400 => ("bad_request", "the request is malformed"),
        401 => ("unauthorized", "authentication required"),
        403 => ("forbidden", "forbidden"),
        404 => ("not_found", "no such route"),
        405 => (
            "method_not_allowed",
            "the method is not allowed on this path",
        ),
        409 => ("conflict", "conflict"),
        413 => ("payload_too_large", "the request body is too large"),
        429 => (
            "too_many_requests",
            "too many requests; retry after Retry-After",
        ),
        415 => (
            "unsupported_media_type",
            "the request body must be application/json",
        ),
        503 => ("unavailable", "temporarily unavailable"),
        _ if status.is_client_error() => ("bad_request", "the request cannot be served"),
        _ => ("internal", "internal error"),
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized | ApiError::BadSignature(_) | ApiError::StaleTimestamp(_) => {
                StatusCode::UNAUTHORIZED
            }
            ApiError::Forbidden(_) | ApiError::Refused(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Conflict(_)
            | ApiError::KeyConflict
            | ApiError::RequestTruncated(_)
            | ApiError::ThreadLive => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::Draining | ApiError::ThreadBusy => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code())
            .json(json!({"error": self.code(), "message": self.to_string()}));
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            res.headers_mut()
                .insert(ALLOW, HeaderValue::from_static(allow));
        }
        if let ApiError::QueueFull(_) = self {
            res.headers_mut().insert(
                actix_web::http::header::RETRY_AFTER,
                HeaderValue::from_static("1"),
            );
        }
        res
    }
}
