//! `ApiError`: the one map from failures to HTTP answers `{error, message}` (SPEC §8.1).
//!
//! Details are logged where the error is handled; a 500 carries a generic message, never internals.

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
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the idempotency key was used with another body")]
    KeyConflict,
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("the process is draining")]
    Draining,
    #[error("the thread's run is finishing; try again")]
    ThreadBusy,
}

impl ApiError {
    pub fn bad(field: impl Into<String>, why: impl Into<String>) -> Self {
        ApiError::BadRequest { field: field.into(), why: why.into() }
    }

    fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::KeyConflict => "key_conflict",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Draining => "draining",
            ApiError::ThreadBusy => "thread_busy",
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) | ApiError::KeyConflict => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unavailable(_) | ApiError::Draining | ApiError::ThreadBusy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(json!({"error": self.code(), "message": self.to_string()}))
    }
}
