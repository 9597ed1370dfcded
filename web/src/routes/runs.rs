//! Run control routes: `POST /api/runs/{id}/stop`.

use actix_web::{web, HttpRequest, HttpResponse};
use actors::run::StopActor;
use actors::supervisor::{StopError, StopRun};
use serde_json::{json, Value};
use storage::ledger::StopMode;

use crate::auth::RUNS_WRITE;
use crate::error::ApiError;
use crate::AppState;

/// The body cap for every route but messages.
pub const BODY_LIMIT: usize = 512 << 10;

pub async fn stop_run(
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let run_id = path.into_inner();
    // A run's capability token grants stopping that one run.
    let by_token = req
        .query_string()
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .is_some_and(|t| state.tokens.verify(&run_id, t));
    let actor = if by_token {
        StopActor::new("capability", &run_id)
    } else {
        let p = state.auth.require(&req, RUNS_WRITE)?;
        StopActor::new("token", &p.name)
    };
    if body.len() > BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!("body over {BODY_LIMIT} bytes")));
    }
    let v: Value = if body.is_empty() { json!({}) } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?
    };
    let mode = match v.get("mode") {
        None => StopMode::Soft,
        Some(Value::String(m)) => StopMode::parse(m).ok_or_else(|| ApiError::bad("mode", "must be soft or hard"))?,
        Some(_) => return Err(ApiError::bad("mode", "must be soft or hard")),
    };
    let answer = state
        .supervisor
        .send(StopRun { run_id: run_id.clone(), mode, actor })
        .await
        .map_err(|e| ApiError::Unavailable(format!("supervisor: {e}")))?;
    match answer {
        Ok(()) => Ok(HttpResponse::Accepted().json(json!({"id": run_id, "mode": mode.as_str(), "state": "stopping"}))),
        Err(StopError::NotFound) => Err(ApiError::NotFound(format!("run {run_id}"))),
        Err(StopError::Finished) => Err(ApiError::Conflict(format!("run {run_id} has finished"))),
        Err(StopError::Unavailable(e)) => {
            tracing::warn!(run_id, error = %e, "stop unavailable");
            Err(ApiError::Unavailable("could not record the stop".into()))
        }
    }
}
