//! Run control routes: `POST /api/runs/{id}/stop`, `DELETE /api/runs/{id}` (kill); `POST
//! /api/runs/{id}/retry` is mounted here from [`super::retry`].

use actix_web::{web, HttpRequest, HttpResponse};
use actors::run::StopActor;
use actors::runs_service::RunsError;
use actors::supervisor::{KillRun, StopError};
use serde_json::{json, Value};
use storage::ledger::StopMode;
use storage::RunId;

use super::resource;
use crate::auth::{RUNS_KILL, RUNS_WRITE};
use crate::error::ApiError;
use crate::AppState;

/// The body cap for every route but messages (and a plan suggestion's start).
pub const BODY_LIMIT: usize = 512 << 10;

pub fn configure(cfg: &mut web::ServiceConfig) {
    // `DELETE /api/runs/{id}` (kill) is mounted with the read of the same path (`api::configure`).
    cfg.service(resource("/api/runs/{id}/stop", "POST").route(web::post().to(stop_run)))
        .configure(super::retry::configure)
        .configure(super::approvals::configure);
}

/// `POST /api/runs/{id}/stop`: record a soft or hard stop and signal the run's owner.
#[utoipa::path(
    post,
    path = "/api/runs/{id}/stop",
    tag = "runs",
    params(("id" = String, Path, description = "Run id"), ("token" = Option<String>, Query, description = "The run's capability token (instead of a bearer token)")),
    request_body(content = Option<crate::openapi::StopBody>, description = "Empty: a soft stop"),
    responses(
        (status = 202, description = "The stop is recorded", body = actors::runs_service::StopAccepted),
        (status = 400, description = "A bad mode", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, a cross-site request, or the run is one the token may not see (nothing is written)", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such run", body = crate::openapi::ErrorBody),
        (status = 409, description = "The run has finished", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:write"]))
)]
pub async fn stop_run(
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let run_id = RunId::from(path.into_inner());
    // A run's capability token grants stopping that one run (read as every route reads it).
    let by_token = super::api::capability(&state, &run_id, &super::api::query_map(&req)?).is_some();
    // The capability token sees its run whatever the visibility; a bearer sees what its filter allows.
    let (actor, visible_to) = if by_token {
        (
            StopActor::new("capability", &run_id),
            storage::record::VisibilityFilter::All,
        )
    } else {
        let p = state.auth.require(&req, RUNS_WRITE)?;
        (StopActor::new("token", &p.name), p.visible_to)
    };
    if body.len() > BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!(
            "body over {BODY_LIMIT} bytes"
        )));
    }
    let v: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?
    };
    // `{mode?}` or nothing (`null`): any other JSON value is not a stop's body.
    if !(v.is_object() || v.is_null()) {
        return Err(ApiError::bad("body", "must be a JSON object"));
    }
    let mode = match v.get("mode") {
        None | Some(Value::Null) => StopMode::Soft,
        Some(Value::String(m)) => {
            StopMode::parse(m).ok_or_else(|| ApiError::bad("mode", "must be soft or hard"))?
        }
        Some(_) => return Err(ApiError::bad("mode", "must be soft or hard")),
    };
    match state
        .runs
        .stop_run(&state.supervisor, &run_id, mode, actor, &visible_to)
        .await
    {
        Ok(accepted) => Ok(HttpResponse::Accepted()
            .json(json!({"id": accepted.id, "mode": mode.as_str(), "state": accepted.state}))),
        Err(RunsError::NotFound) => Err(ApiError::NotFound(format!("run {run_id}"))),
        Err(e @ RunsError::Forbidden(_)) => Err(ApiError::Refused(e.to_string())),
        Err(RunsError::Conflict(m)) => Err(ApiError::Conflict(m)),
        Err(RunsError::Unavailable(e)) => {
            tracing::warn!(%run_id, error = %e, "stop unavailable");
            Err(ApiError::Unavailable("could not record the stop".into()))
        }
    }
}

/// `DELETE /api/runs/{id}`: kill (SPEC §5.6) — deletion fence, abort as a fence, purge.
#[utoipa::path(
    delete,
    path = "/api/runs/{id}",
    tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 202, description = "The kill is recorded; the run, its record and its workspace go", body = crate::openapi::KillAccepted),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such run the caller may see", body = crate::openapi::ErrorBody),
        (status = 409, description = "Already finished", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:kill"]))
)]
pub async fn kill_run(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = state.auth.require(&req, RUNS_KILL)?;
    let run_id = RunId::from(path.into_inner());
    // A run the caller cannot see is, to it, a run that does not exist.
    match state
        .runs
        .get_run(&run_id, false, &principal.visible_to)
        .await
    {
        Ok(_) => {}
        Err(RunsError::NotFound | RunsError::Forbidden(_) | RunsError::Conflict(_)) => {
            return Err(ApiError::NotFound(format!("run {run_id}")))
        }
        Err(RunsError::Unavailable(e)) => {
            tracing::warn!(%run_id, error = %e, "kill: run lookup unavailable");
            return Err(ApiError::Unavailable("could not read the run".into()));
        }
    }
    let answer = state
        .supervisor
        .send(KillRun {
            run_id: run_id.clone(),
        })
        .await
        .map_err(|e| ApiError::Unavailable(format!("supervisor: {e}")))?;
    match answer {
        Ok(()) => {
            state.runs.invalidate_live();
            Ok(HttpResponse::Accepted().json(json!({"id": run_id, "state": "killing"})))
        }
        Err(StopError::NotFound) => Err(ApiError::NotFound(format!("run {run_id}"))),
        Err(StopError::Finished) => Err(ApiError::Conflict(format!("run {run_id}"))),
        Err(StopError::Unavailable(e)) => {
            tracing::warn!(%run_id, error = %e, "kill unavailable");
            Err(ApiError::Unavailable("could not record the kill".into()))
        }
    }
}
