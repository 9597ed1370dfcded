//! Plan suggestion routes (SPEC §9), thin over [`actors::plan::PlanHandle`]:
//! `POST /api/plans/{id}/suggestions` (start), `GET /api/plans/{id}/suggestions/{rid}`,
//! `POST /api/plans/{id}/suggestions/{rid}/cancel`, `POST /api/plans/{id}/suggestions/{rid}/dismiss`,
//! `POST /api/plans/{id}/import` (create the plan, or advance its revision and/or snapshot).
//!
//! The handle comes from `web::Data<PlanHandle>` — the one coordinator the runner constructed at boot,
//! never one per request. Writes need `runs:write`, the read `runs:read`. Starts are refused while the
//! process drains (the HTTP layer stops plan admission before the coordinator closes). A malformed plan or
//! request id in a path is not found, exactly as an unknown one; bodies are JSON objects whose unknown
//! fields are refused by name.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::plan::{
    PlanError, PlanHandle, PlanIdentity, StartError, StopCause, SuggestionInput, SuggestionView,
};
use serde_json::{json, Map, Value};
use storage::plan::{
    Card, Import, PlanId, PlanRefusal, PlanRequest, RequestId, Revision, SnapshotId, TerminalReason,
};

use super::resource;
use crate::auth::{RUNS_READ, RUNS_WRITE};
use crate::error::ApiError;
use crate::AppState;

/// Request body cap (the base cards alone may reach 800 KiB).
pub const PLAN_BODY_LIMIT: usize = 2 << 20;
/// Longest `prompt`, in UTF-8 bytes.
pub const MAX_PROMPT_BYTES: usize = 64 << 10;

/// The fields of a suggestion start's body and of an import's; any other is a 400 naming it.
pub const START_FIELDS: [&str; 5] = ["revision", "snapshotId", "prompt", "cards", "context"];
pub const IMPORT_FIELDS: [&str; 2] = ["snapshotId", "advanceRevision"];

/// Mount the plan routes. Needs `web::Data<AppState>` and `web::Data<PlanHandle>` in the app data.
pub fn configure(cfg: &mut web::ServiceConfig) {
    // A start carries the base cards (up to 100 of 8 KiB): its body cap is the messages' 2 MiB, not the
    // 512 KiB every other route has.
    cfg.service(
        resource("/api/plans/{id}/suggestions", "POST")
            .app_data(web::PayloadConfig::new(PLAN_BODY_LIMIT))
            .route(web::post().to(start_suggestion)),
    )
    .service(
        resource("/api/plans/{id}/suggestions/{rid}", "GET").route(web::get().to(get_suggestion)),
    )
    .service(
        resource("/api/plans/{id}/suggestions/{rid}/cancel", "POST")
            .route(web::post().to(cancel_suggestion)),
    )
    .service(
        resource("/api/plans/{id}/suggestions/{rid}/dismiss", "POST")
            .route(web::post().to(dismiss_suggestion)),
    )
    .service(resource("/api/plans/{id}/import", "POST").route(web::post().to(import_plan)));
}

// ---- wire forms ----

fn request_json(r: &PlanRequest) -> Value {
    json!({
        "requestId": r.request_id.as_str(),
        "planId": r.plan_id.as_str(),
        "revision": r.revision.get(),
        "snapshotId": r.snapshot_id.as_str(),
        "state": r.state.as_str(),
        "reason": r.reason.map(TerminalReason::as_str),
        "diagnostic": r.diagnostic,
        "cards": r.cards,
        "createdAt": r.created_at,
        "settledAt": r.settled_at,
    })
}

fn view_json(v: &SuggestionView) -> Value {
    let mut body = request_json(&v.request);
    body["invocation"] = match v.invocation {
        Some(i) => {
            json!({"state": i.state.as_str(), "stopping": i.stopping.map(StopCause::as_str)})
        }
        None => Value::Null,
    };
    body
}

fn plan_path(id: &str) -> Result<PlanId, ApiError> {
    PlanId::parse(id).ok_or_else(|| ApiError::NotFound(format!("plan {id}")))
}

fn request_path(id: &str, rid: &str) -> Result<(PlanId, RequestId), ApiError> {
    let plan_id = plan_path(id)?;
    let request_id =
        RequestId::parse(rid).ok_or_else(|| ApiError::NotFound(format!("request {rid}")))?;
    Ok((plan_id, request_id))
}

/// The body as a JSON object with only `allowed` keys (an empty body is `{}`).
fn body_object(body: &[u8], allowed: &[&str]) -> Result<Map<String, Value>, ApiError> {
    if body.len() > PLAN_BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!(
            "body over {PLAN_BODY_LIMIT} bytes"
        )));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::bad("body", "must be a JSON object"));
    };
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad(
            unknown.clone(),
            "is not a field of this request",
        ));
    }
    Ok(map)
}

fn snapshot_field(map: &Map<String, Value>) -> Result<SnapshotId, ApiError> {
    match map.get("snapshotId") {
        Some(Value::String(s)) => SnapshotId::parse(s).ok_or_else(|| {
            ApiError::bad(
                "snapshotId",
                "must be 1 to 256 characters without control characters",
            )
        }),
        None | Some(Value::Null) => Err(ApiError::bad("snapshotId", "is required")),
        Some(_) => Err(ApiError::bad("snapshotId", "must be a string")),
    }
}

fn plan_error(e: PlanError) -> ApiError {
    match e {
        PlanError::NotFound(what) => ApiError::NotFound(what),
        PlanError::NotTracked { request } => ApiError::Conflict(format!(
            "request {} is pending elsewhere",
            request.request_id.as_str()
        )),
        PlanError::Refused(PlanRefusal::UnknownRequest { request_id }) => {
            ApiError::NotFound(format!("request {}", request_id.as_str()))
        }
        PlanError::Refused(refusal) => ApiError::Conflict(refusal.to_string()),
        PlanError::Unavailable(why) => {
            tracing::warn!(error = %why, "plan operation unavailable");
            ApiError::Unavailable("storage unavailable".into())
        }
    }
}

/// What the routes on one suggestion request share, in their order: the scope (401/403), the plan and
/// request ids from the path (a malformed one is not found, as an unknown one), then `op` on the
/// coordinator with them — its answer is the 200 body, a [`PlanError`] its status (see [`plan_error`]).
async fn on_request<Fut>(
    req: &HttpRequest,
    state: &AppState,
    scope: &'static str,
    path: web::Path<(String, String)>,
    op: impl FnOnce(PlanId, RequestId) -> Fut,
) -> Result<HttpResponse, ApiError>
where
    Fut: std::future::Future<Output = Result<Value, PlanError>>,
{
    state.auth.require(req, scope)?;
    let (id, rid) = path.into_inner();
    let (plan_id, request_id) = request_path(&id, &rid)?;
    let body = op(plan_id, request_id).await.map_err(plan_error)?;
    Ok(HttpResponse::Ok().json(body))
}

fn refusal_response(status: StatusCode, code: &str, message: String, extra: Value) -> HttpResponse {
    let mut body = json!({"error": code, "message": message});
    if let (Value::Object(b), Value::Object(x)) = (&mut body, extra) {
        b.extend(x);
    }
    HttpResponse::build(status).json(body)
}

// ---- handlers ----

/// `POST /api/plans/{id}/suggestions` with `{revision, snapshotId, prompt, cards?, context?}`: 202 with the
/// pending request; 409 `busy` (naming the active request) or `stale_identity` (naming the current one);
/// 429 `capacity` (with `Retry-After`) while `[plan] max_concurrent` requests run: the caller asked too
/// early, nothing is wrong with the server.
#[utoipa::path(
    post,
    path = "/api/plans/{id}/suggestions",
    tag = "plans",
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Plan id")),
    request_body = crate::openapi::StartSuggestionBody,
    responses(
        (status = 202, description = "The pending request", body = crate::openapi::SuggestionStarted),
        (status = 400, description = "A bad field (named)", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such plan", body = crate::openapi::ErrorBody),
        (status = 409, description = "busy (names requestId) or stale_identity (names current)", body = crate::openapi::ErrorBody),
        (status = 429, description = "capacity (names limit): retry after `Retry-After` seconds", body = crate::openapi::ErrorBody),
        (status = 503, description = "draining or storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:write"]))
)]
pub async fn start_suggestion(
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Bytes,
    state: web::Data<AppState>,
    plans: web::Data<PlanHandle>,
) -> Result<HttpResponse, ApiError> {
    state.auth.require(&req, RUNS_WRITE)?;
    let plan_id = plan_path(&path.into_inner())?;
    if state.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::Draining);
    }
    let map = body_object(&body, &START_FIELDS)?;
    let revision = match map.get("revision") {
        // JSON has one number type: `3.0` is the integer 3 (as JSON Schema reads it), up to 2^53.
        Some(v) => v
            .as_u64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f <= 9_007_199_254_740_992.0)
                    .map(|f| f as u64)
            })
            .filter(|n| *n >= 1)
            .ok_or_else(|| ApiError::bad("revision", "must be a positive integer"))?,
        None => return Err(ApiError::bad("revision", "is required")),
    };
    let snapshot_id = snapshot_field(&map)?;
    let prompt = match map.get("prompt") {
        Some(Value::String(s)) if s.len() <= MAX_PROMPT_BYTES => s.clone(),
        Some(Value::String(_)) => {
            return Err(ApiError::bad(
                "prompt",
                format!("must be at most {MAX_PROMPT_BYTES} bytes"),
            ))
        }
        None | Some(Value::Null) => String::new(),
        Some(_) => return Err(ApiError::bad("prompt", "must be a string")),
    };
    let cards: Vec<Card> = match map.get("cards") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            ApiError::bad("cards", format!("must be an array of {{title, body}}: {e}"))
        })?,
    };
    storage::plan::validate_cards(&cards).map_err(|e| ApiError::bad("cards", e.to_string()))?;
    let input = SuggestionInput {
        prompt,
        cards,
        context: map.get("context").cloned().unwrap_or(Value::Null),
    };
    let identity = PlanIdentity {
        plan_id: plan_id.clone(),
        revision: Revision::new(revision),
    };
    match plans.start(identity, snapshot_id, &input).await {
        Ok(started) => Ok(HttpResponse::Accepted().json(json!({
            "requestId": started.request_id.as_str(),
            "planId": started.binding.plan_id.as_str(),
            "revision": started.binding.revision.get(),
            "snapshotId": started.binding.snapshot_id.as_str(),
            "state": "pending",
        }))),
        Err(StartError::Closing) => Err(ApiError::Unavailable(
            "the plan coordinator is closing".into(),
        )),
        Err(StartError::Busy { request_id }) => Ok(refusal_response(
            StatusCode::CONFLICT,
            "busy",
            format!(
                "plan {} has an active suggestion request {}",
                plan_id.as_str(),
                request_id.as_str()
            ),
            json!({"requestId": request_id.as_str()}),
        )),
        Err(e @ StartError::Capacity { limit }) => {
            let mut res = refusal_response(
                StatusCode::TOO_MANY_REQUESTS,
                "capacity",
                e.to_string(),
                json!({"limit": limit}),
            );
            res.headers_mut().insert(
                actix_web::http::header::RETRY_AFTER,
                actix_web::http::header::HeaderValue::from_static("1"),
            );
            Ok(res)
        }
        Err(StartError::Refused(PlanRefusal::UnknownPlan { plan_id })) => {
            Err(ApiError::NotFound(format!("plan {}", plan_id.as_str())))
        }
        Err(StartError::Refused(PlanRefusal::IdentityMismatch { current })) => {
            Ok(refusal_response(
                StatusCode::CONFLICT,
                "stale_identity",
                format!(
                    "the plan is at revision {} over snapshot {}",
                    current.revision,
                    current.snapshot_id.as_str()
                ),
                json!({"current": {"revision": current.revision.get(), "snapshotId": current.snapshot_id.as_str()}}),
            ))
        }
        Err(StartError::Refused(other)) => Err(ApiError::Conflict(other.to_string())),
        Err(StartError::Unavailable(why)) => {
            tracing::warn!(plan_id = plan_id.as_str(), error = %why, "plan admission unavailable");
            Err(ApiError::Unavailable("storage unavailable".into()))
        }
    }
}

/// `GET /api/plans/{id}/suggestions/{rid}`: the durable request and, while this process runs it, the
/// invocation (`{state, stopping}`).
#[utoipa::path(
    get,
    path = "/api/plans/{id}/suggestions/{rid}",
    tag = "plans",
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Plan id"), ("rid" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Suggestion request id")),
    responses(
        (status = 200, description = "The request and its invocation", body = crate::openapi::SuggestionView),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such plan or request", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:read"]))
)]
pub async fn get_suggestion(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
    plans: web::Data<PlanHandle>,
) -> Result<HttpResponse, ApiError> {
    on_request(
        &req,
        &state,
        RUNS_READ,
        path,
        |plan_id, request_id| async move {
            plans
                .suggestion(&plan_id, request_id)
                .await
                .map(|view| view_json(&view))
        },
    )
    .await
}

/// `POST /api/plans/{id}/suggestions/{rid}/cancel`: the request settles `cancelled` at once (unless it
/// already left pending) and its provider is asked to abort; answers the request after that.
#[utoipa::path(
    post,
    path = "/api/plans/{id}/suggestions/{rid}/cancel",
    tag = "plans",
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Plan id"), ("rid" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Suggestion request id")),
    responses(
        (status = 200, description = "The request after the cancel", body = crate::openapi::SuggestionView),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such plan or request", body = crate::openapi::ErrorBody), (status = 409, description = "Not ready (dismiss) or pending elsewhere", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:write"]))
)]
pub async fn cancel_suggestion(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
    plans: web::Data<PlanHandle>,
) -> Result<HttpResponse, ApiError> {
    on_request(
        &req,
        &state,
        RUNS_WRITE,
        path,
        |plan_id, request_id| async move {
            plans
                .cancel(&plan_id, request_id)
                .await
                .map(|view| view_json(&view))
        },
    )
    .await
}

/// `POST /api/plans/{id}/suggestions/{rid}/dismiss`: explicit user dismissal of a ready reply; 409 when
/// the request is not ready.
#[utoipa::path(
    post,
    path = "/api/plans/{id}/suggestions/{rid}/dismiss",
    tag = "plans",
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Plan id"), ("rid" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Suggestion request id")),
    responses(
        (status = 200, description = "The dismissed request", body = crate::openapi::SuggestionRequest),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such plan or request", body = crate::openapi::ErrorBody), (status = 409, description = "Not ready (dismiss) or pending elsewhere", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:write"]))
)]
pub async fn dismiss_suggestion(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
    plans: web::Data<PlanHandle>,
) -> Result<HttpResponse, ApiError> {
    on_request(
        &req,
        &state,
        RUNS_WRITE,
        path,
        |plan_id, request_id| async move {
            plans
                .dismiss(&plan_id, request_id)
                .await
                .map(|row| request_json(&row))
        },
    )
    .await
}

/// `POST /api/plans/{id}/import` with `{snapshotId, advanceRevision?}` (default `true`): creates the plan
/// at revision 1, or advances its revision and/or replaces its snapshot, invalidating its pending and
/// ready requests. Answers the plan and the invalidated request ids.
#[utoipa::path(
    post,
    path = "/api/plans/{id}/import",
    tag = "plans",
    params(("id" = String, Path, pattern = r"^[A-Za-z0-9_-]{1,64}$", description = "Plan id")),
    request_body = crate::openapi::ImportBody,
    responses(
        (status = 200, description = "The plan advanced", body = crate::openapi::Imported),
        (status = 201, description = "The plan was created at revision 1", body = crate::openapi::Imported),
        (status = 400, description = "A bad field (named) or plan id", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:write"]))
)]
pub async fn import_plan(
    req: HttpRequest,
    path: web::Path<String>,
    body: web::Bytes,
    state: web::Data<AppState>,
    plans: web::Data<PlanHandle>,
) -> Result<HttpResponse, ApiError> {
    state.auth.require(&req, RUNS_WRITE)?;
    let id = path.into_inner();
    let plan_id = PlanId::parse(&id)
        .ok_or_else(|| ApiError::bad("id", "must match ^[A-Za-z0-9_-]{1,64}$"))?;
    let map = body_object(&body, &IMPORT_FIELDS)?;
    let snapshot_id = snapshot_field(&map)?;
    let advance_revision = match map.get("advanceRevision") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("advanceRevision", "must be a boolean")),
    };
    let imported = plans
        .import(Import {
            plan_id,
            snapshot_id,
            advance_revision,
        })
        .await
        .map_err(plan_error)?;
    let status = if imported.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(HttpResponse::build(status).json(json!({
        "planId": imported.plan.id.as_str(),
        "revision": imported.plan.revision.get(),
        "snapshotId": imported.plan.snapshot_id.as_str(),
        "created": imported.created,
        "invalidated": imported.invalidated.iter().map(RequestId::as_str).collect::<Vec<_>>(),
    })))
}
