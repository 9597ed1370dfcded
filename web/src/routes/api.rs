//! The JSON read API (SPEC §8.1) over [`actors::runs_service::RunsService`]:
//! `GET /api/runs`, `GET /api/runs/{id}`, `GET /api/runs/{id}/events`, `GET /api/runs/{id}/friction`,
//! `GET /api/live`.
//!
//! Every read needs `runs:read` and applies the caller's visibility filter; a run outside it answers 404
//! exactly as an unknown run does. A run's capability token (`?token=`) grants reading that one run
//! (visibility `all` for that id only). Query parameters are validated here and a bad one answers 400
//! naming it. Also home of the helpers the SSE and HTML routes share ([`query_map`], [`reader`],
//! [`runs_error`]).

use std::collections::HashMap;
use storage::RunId;

use actix_web::{web, HttpRequest, HttpResponse};
use actors::runs_service::{ListParams, RunsError, StatusFilter};
use serde_json::json;
use storage::record::{is_valid_run_id, VisibilityFilter};
use storage::store::Cursor;

use super::resource;
use crate::auth::RUNS_READ;
use crate::error::ApiError;
use crate::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    // One resource per path with all of its methods: `DELETE /api/runs/{id}` (kill) sits beside the read.
    cfg.service(resource("/api/runs", "GET").route(web::get().to(list_runs)))
        .service(
            resource("/api/runs/{id}", "GET, DELETE")
                .route(web::get().to(get_run))
                .route(web::delete().to(super::runs::kill_run)),
        )
        .service(resource("/api/runs/{id}/events", "GET").route(web::get().to(get_events)))
        .service(resource("/api/runs/{id}/friction", "GET").route(web::get().to(get_friction)))
        .service(resource("/api/runs/{id}/children", "GET").route(web::get().to(list_children)))
        .service(resource("/api/live", "GET").route(web::get().to(live)));
}

/// The query string as a map (the last value of a repeated key wins); undecodable → 400 `query`. A
/// repeated `token` is 400 `token`: which of two capability tokens a route would read is no choice to
/// leave to its parser, so every route (reads, streams, pages, stop) refuses it alike.
pub fn query_map(req: &HttpRequest) -> Result<HashMap<String, String>, ApiError> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| ApiError::bad("query", format!("cannot be decoded: {e}")))?
        .into_inner();
    if pairs.iter().filter(|(k, _)| k == "token").count() > 1 {
        return Err(ApiError::bad("token", "is given more than once"));
    }
    Ok(pairs.into_iter().collect())
}

/// The capability token in `q` when it verifies for `run_id`.
pub fn capability<'a>(
    state: &AppState,
    run_id: &RunId,
    q: &'a HashMap<String, String>,
) -> Option<&'a str> {
    q.get("token")
        .map(String::as_str)
        .filter(|t| state.tokens.verify(run_id, t))
}

/// Who may read: a valid capability token for `run_id` sees that run (`all`); otherwise the caller
/// needs `runs:read` and sees what its filter allows.
pub fn reader(
    req: &HttpRequest,
    state: &AppState,
    run_id: Option<&RunId>,
    q: &HashMap<String, String>,
) -> Result<VisibilityFilter, ApiError> {
    if run_id.is_some_and(|id| capability(state, id, q).is_some()) {
        return Ok(VisibilityFilter::All);
    }
    Ok(state.auth.require(req, RUNS_READ)?.visible_to)
}

/// The one map from the read service's outcomes to HTTP (details logged, never returned).
pub fn runs_error(e: RunsError, run_id: &str) -> ApiError {
    match e {
        RunsError::NotFound => ApiError::NotFound(format!("run {run_id}")),
        e @ RunsError::Forbidden(_) => ApiError::Refused(e.to_string()),
        RunsError::Conflict(m) => ApiError::Conflict(m),
        RunsError::Unavailable(why) => {
            tracing::warn!(run_id, error = %why, "run read unavailable");
            ApiError::Unavailable("storage unavailable".into())
        }
    }
}

fn num<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    field: &str,
    what: &str,
) -> Result<Option<T>, ApiError> {
    match q.get(field) {
        None => Ok(None),
        Some(s) => s
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|_| ApiError::bad(field, format!("must be {what}"))),
    }
}

fn text(q: &HashMap<String, String>, field: &str) -> Result<Option<String>, ApiError> {
    match q.get(field) {
        None => Ok(None),
        Some(s) if s.is_empty() => Err(ApiError::bad(field, "must not be empty")),
        Some(s) if s.chars().nth(256).is_some() => {
            Err(ApiError::bad(field, "must be at most 256 characters"))
        }
        Some(s) => Ok(Some(s.clone())),
    }
}

/// `limit`: a positive 64-bit integer (clamped by the read it pages), else a 400 naming `limit`.
fn limit(q: &HashMap<String, String>) -> Result<Option<usize>, ApiError> {
    match num::<i64>(q, "limit", "a positive integer")? {
        Some(n) if n < 1 => Err(ApiError::bad("limit", "must be a positive integer")),
        l => Ok(l.map(|n| usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

/// The largest seq and seq cursor (SPEC §3): the store's integers are signed 64-bit, so a larger cursor
/// would wrap negative in SQL and read from the start.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// A seq cursor named `field` (`afterSeq`, `Last-Event-ID`): an integer in `0..=MAX_SEQ`, else a 400
/// naming `field`.
pub fn seq_cursor(field: &str, value: &str) -> Result<u64, ApiError> {
    match value.trim().parse::<u64>() {
        Ok(seq) if seq <= MAX_SEQ => Ok(seq),
        _ => Err(ApiError::bad(
            field,
            format!("must be an integer from 0 to {MAX_SEQ}"),
        )),
    }
}

/// `after_seq` from `field` (see [`seq_cursor`]).
pub fn after_seq(q: &HashMap<String, String>, field: &str) -> Result<Option<u64>, ApiError> {
    q.get(field).map(|v| seq_cursor(field, v)).transpose()
}

/// `list_runs` parameters from a query (`status, agent, channel, threadKey, parentRunId, sinceMs, limit,
/// before, beforeId`).
pub fn list_params(
    q: &HashMap<String, String>,
    visible_to: VisibilityFilter,
) -> Result<ListParams, ApiError> {
    let status = match q.get("status").map(String::as_str) {
        None => StatusFilter::All,
        Some(s) => StatusFilter::parse(s).ok_or_else(|| {
            ApiError::bad(
                "status",
                format!("must be one of {}", StatusFilter::CHOICES.join(", ")),
            )
        })?,
    };
    let before = num::<i64>(q, "before", "an integer (epoch ms)")?;
    let before_id = text(q, "beforeId")?;
    if let Some(id) = &before_id {
        if !is_valid_run_id(id) {
            return Err(ApiError::bad("beforeId", "is not a run id"));
        }
    }
    let before = match (before, before_id) {
        (Some(finished_at), id) => Some(Cursor { finished_at, id }),
        (None, Some(_)) => return Err(ApiError::bad("before", "is required with beforeId")),
        (None, None) => None,
    };
    Ok(ListParams {
        status,
        visible_to,
        agent: text(q, "agent")?,
        channel: text(q, "channel")?,
        thread_key: text(q, "threadKey")?,
        parent_run_id: match text(q, "parentRunId")? {
            Some(p) if !storage::record::is_valid_run_id(&p) => {
                return Err(ApiError::bad(
                    "parentRunId",
                    "must be a run id (1 to 64 of A-Z, a-z, 0-9, _ and -)",
                ))
            }
            p => p.map(RunId::from),
        },
        since_ms: num::<i64>(q, "sinceMs", "an integer (epoch ms)")?,
        limit: limit(q)?,
        before,
    })
}

/// `GET /api/runs` → `{runs, nextBefore?, storeUnavailable?, ledgerUnavailable?}`.
#[utoipa::path(
    get,
    path = "/api/runs",
    tag = "runs",
    params(
        ("status" = Option<crate::openapi::StatusParam>, Query, description = "`active`, `finished`, `all` (default) or a terminal status"),
        ("agent" = Option<String>, Query, min_length = 1, max_length = 256, description = "Only this agent's runs"),
        ("channel" = Option<String>, Query, min_length = 1, max_length = 256, description = "Only this channel's runs"),
        ("threadKey" = Option<String>, Query, min_length = 1, max_length = 256, description = "Only this thread's runs"),
        ("parentRunId" = Option<String>, Query, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Only runs started for this run (`parentRunId` on their message)"),
        ("sinceMs" = Option<i64>, Query, description = "Only runs finished (or started, while live) at or after this epoch ms"),
        ("limit" = Option<u64>, Query, minimum = 1, description = "Page size (1 or more; clamped)"),
        ("before" = Option<i64>, Query, description = "Cursor: `nextBefore.finishedAt` of the previous page"),
        ("beforeId" = Option<String>, Query, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Cursor: `nextBefore.id` of the previous page; alone, the page after that run"),
    ),
    responses((status = 200, description = "A page of runs, live first, newest first", body = actors::runs_service::RunList), (status = 400, description = "A bad query parameter (named)", body = crate::openapi::ErrorBody), (status = 404, description = "`beforeId` alone names no run the caller may see", body = crate::openapi::ErrorBody), (status = 503, description = "`beforeId` alone: storage could not say where that run is", body = crate::openapi::ErrorBody), (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks runs:read", body = crate::openapi::ErrorBody)),
    security((), ("bearer" = ["runs:read"]))
)]
async fn list_runs(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let mut q = query_map(&req)?;
    let visible_to = reader(&req, &state, None, &q)?;
    // `beforeId` alone names the run a page follows: that run's own position completes the cursor (a run
    // the caller may not see, or none, is a 404 naming the parameter).
    if let (None, Some(id)) = (q.get("before"), q.get("beforeId")) {
        if !is_valid_run_id(id) {
            return Err(ApiError::bad("beforeId", "is not a run id"));
        }
        let run = match state
            .runs
            .get_run(&RunId::from(id), false, &visible_to)
            .await
        {
            Ok(run) => run,
            Err(RunsError::NotFound) => {
                return Err(ApiError::NotFound(format!("beforeId: no run {id}")))
            }
            Err(e) => return Err(runs_error(e, id)),
        };
        let at = run.finished_at.unwrap_or(run.started_at);
        q.insert("before".into(), at.to_string());
    }
    let params = list_params(&q, visible_to)?;
    Ok(HttpResponse::Ok().json(state.runs.list_runs(&params).await))
}

/// `GET /api/runs/{id}/children` → `{runs}`: the runs started for run `id`, oldest start first.
#[utoipa::path(
    get,
    path = "/api/runs/{id}/children",
    tag = "runs",
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "The parent run's id (it need not still exist)")),
    responses((status = 200, description = "The runs whose message named this run as `parentRunId` and that the caller may see, live and finished, oldest start first (at most 200)", body = actors::runs_service::RunList), (status = 400, description = "The id is not a run id", body = crate::openapi::ErrorBody), (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks runs:read", body = crate::openapi::ErrorBody), (status = 404, description = "The run was deleted (`DELETE /api/runs/{id}`); its children stay listed by `GET /api/runs?parentRunId=`", body = crate::openapi::ErrorBody)),
    security((), ("bearer" = ["runs:read"]))
)]
async fn list_children(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = RunId::from(path.into_inner());
    let q = query_map(&req)?;
    // A bearer token: a run's capability link reads that run, not the runs started for it.
    let visible_to = reader(&req, &state, None, &q)?;
    if !storage::record::is_valid_run_id(&id) {
        return Err(ApiError::bad(
            "id",
            "must be a run id (1 to 64 of A-Z, a-z, 0-9, _ and -)",
        ));
    }
    // A parent that expired or never existed still lists its children; one that was deleted (killed)
    // is gone as a resource, as every other route under it says.
    if state.storage.is_killed(id.clone()).await.unwrap_or(false) {
        return Err(ApiError::NotFound(format!("run {id} was deleted")));
    }
    Ok(HttpResponse::Ok().json(state.runs.list_children(&id, visible_to).await))
}

/// `GET /api/runs/{id}` (`?include=events`) → a RunView.
#[utoipa::path(
    get,
    path = "/api/runs/{id}",
    tag = "runs",
    params(("id" = String, Path, description = "Run id"), ("token" = Option<String>, Query, description = "The run's capability token (instead of a bearer token)"), ("include" = Option<crate::openapi::IncludeParam>, Query, description = "`events`: include the run's events")),
    responses((status = 200, description = "The run", body = actors::runs_service::RunView), (status = 400, description = "A bad query parameter (named)", body = crate::openapi::ErrorBody), (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks runs:read", body = crate::openapi::ErrorBody), (status = 404, description = "No such run the caller may see", body = crate::openapi::ErrorBody), (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody)),
    security((), ("bearer" = ["runs:read"]))
)]
async fn get_run(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = RunId::from(path.into_inner());
    let q = query_map(&req)?;
    let visible_to = reader(&req, &state, Some(&id), &q)?;
    let include_events = match q.get("include").map(String::as_str) {
        None => false,
        Some("events") => true,
        Some(_) => return Err(ApiError::bad("include", "must be events")),
    };
    let view = state
        .runs
        .get_run(&id, include_events, &visible_to)
        .await
        .map_err(|e| runs_error(e, &id))?;
    Ok(HttpResponse::Ok().json(view))
}

/// `GET /api/runs/{id}/events?afterSeq&limit` → `{events, nextAfterSeq?}`.
#[utoipa::path(
    get,
    path = "/api/runs/{id}/events",
    tag = "runs",
    params(
        ("id" = String, Path, description = "Run id"), ("token" = Option<String>, Query, description = "The run's capability token (instead of a bearer token)"),
        ("afterSeq" = Option<u64>, Query, description = "Events strictly after this seq (default 0)"),
        ("limit" = Option<u64>, Query, minimum = 1, description = "Page size (1 or more; clamped)"),
    ),
    responses((status = 200, description = "A page of the run's events", body = actors::runs_service::EventPage), (status = 400, description = "A bad query parameter (named)", body = crate::openapi::ErrorBody), (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks runs:read", body = crate::openapi::ErrorBody), (status = 404, description = "No such run the caller may see", body = crate::openapi::ErrorBody), (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody)),
    security((), ("bearer" = ["runs:read"]))
)]
async fn get_events(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = RunId::from(path.into_inner());
    let q = query_map(&req)?;
    let visible_to = reader(&req, &state, Some(&id), &q)?;
    let after = after_seq(&q, "afterSeq")?.unwrap_or(0);
    let limit = limit(&q)?;
    let page = state
        .runs
        .get_run_events(&id, after, limit, &visible_to)
        .await
        .map_err(|e| runs_error(e, &id))?;
    Ok(HttpResponse::Ok().json(page))
}

/// `GET /api/runs/{id}/friction` → the diagnosis (live: analyzed from the events; persisted: stored).
#[utoipa::path(
    get,
    path = "/api/runs/{id}/friction",
    tag = "runs",
    params(("id" = String, Path, description = "Run id"), ("token" = Option<String>, Query, description = "The run's capability token (instead of a bearer token)")),
    responses((status = 200, description = "Where the run spent its time", body = actors::runs_service::Friction), (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks runs:read", body = crate::openapi::ErrorBody), (status = 404, description = "No such run the caller may see", body = crate::openapi::ErrorBody), (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody)),
    security((), ("bearer" = ["runs:read"]))
)]
async fn get_friction(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = RunId::from(path.into_inner());
    let q = query_map(&req)?;
    let visible_to = reader(&req, &state, Some(&id), &q)?;
    let friction = state
        .runs
        .get_run_friction(&id, &visible_to)
        .await
        .map_err(|e| runs_error(e, &id))?;
    Ok(HttpResponse::Ok().json(friction))
}

/// `GET /api/live` → `{runs: [ledger rows of every generation the caller may see]}`.
#[utoipa::path(
    get,
    path = "/api/live",
    tag = "runs",
    responses((status = 200, description = "Live ledger rows (never the prompt, tools or state)", body = crate::openapi::LiveRuns), (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks runs:read", body = crate::openapi::ErrorBody), (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody)),
    security((), ("bearer" = ["runs:read"]))
)]
async fn live(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let visible_to = state.auth.require(&req, RUNS_READ)?.visible_to;
    let rows = state
        .runs
        .live_rows(&visible_to)
        .await
        .map_err(|e| runs_error(e, "-"))?;
    Ok(HttpResponse::Ok().json(json!({"runs": rows})))
}
