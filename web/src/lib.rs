//! Switchboard's HTTP surface: actix-web routes only.
//!
//! Owns no state of its own: [`AppState`] holds handles into the actors and storage crates. Never touches
//! SQLite (everything goes through `storage::StorageHandle` or the actors).
//!
//! # Layout
//! - [`configure`]: mounts every route on an actix-web `ServiceConfig`, inside the edge middleware;
//!   `/`, `/healthz`, `/readyz`, `/metrics` live here.
//! - [`openapi`]: `GET /api/openapi.json`, generated with `utoipa` from the handlers' annotations.
//! - [`edge`]: the one middleware every request passes — cross-site protection, the dev-bypass Host
//!   check, security headers, JSON errors.
//! - [`auth`]: principals, scopes, the dev bypass.
//! - [`error`]: `ApiError`, the one map to HTTP answers.
//! - [`routes`]: `messages` (admission), `runs` (stop, kill), `api` (JSON reads), `sse`, `html`,
//!   `admin`, `plans`, `slack` (Slack's signed events and button clicks; mounted only when configured).

pub mod auth;
pub mod edge;
pub mod error;
pub mod openapi;
pub mod routes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::json;
use storage::{Generation, StorageHandle};

pub use auth::AuthConfig;
use error::ApiError;
pub use routes::slack::SlackIngress;

/// What every route handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub generation: Generation,
    /// The binary's version, for `/healthz`.
    pub version: &'static str,
    pub storage: StorageHandle,
    /// Set once when a drain begins; admission answers 503 from then on.
    pub draining: Arc<AtomicBool>,
    pub supervisor: actix::Addr<actors::supervisor::Supervisor>,
    pub registry: actors::registry::Registry,
    pub tokens: actors::token::TokenMinter,
    pub auth: AuthConfig,
    pub public_base_url: String,
    /// The one read service behind every read surface (API, SSE, HTML).
    pub runs: actors::runs_service::RunsService,
    /// `POST /admin/drain` notifies it; the binary then drains and exits.
    pub shutdown: Arc<tokio::sync::Notify>,
    pub metrics: Arc<actors::metrics::Metrics>,
    pub history: actors::history::HistoryWriter,
    /// The plan coordinator (one per process and store).
    pub plans: actors::plan::PlanHandle,
    /// The configured agents' names (the values a message's `agent` may take).
    pub agents: Vec<String>,
    /// `[channels.slack]`'s signing secret; `None` (Slack unset): `/slack/*` are 404s.
    pub slack: Option<SlackIngress>,
}

/// How long a health probe waits for storage before calling it failing.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Mount every route, all inside one scope wrapped by the [`edge::Edge`] middleware — so every request,
/// the 404 of a path no route has included, passes the cross-site checks and leaves with the security
/// headers and a JSON error shape. Bodies are capped at [`routes::runs::BODY_LIMIT`] unless a resource
/// says otherwise (messages and plan starts: 2 MiB; Slack's routes: 1 MiB).
pub fn configure(state: AppState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        let checks = edge::Checks::new(state.auth.dev_bypass, &state.public_base_url);
        let edge = edge::Edge::new(checks, state.metrics.clone());
        let slack = state.slack.is_some();
        cfg.app_data(web::Data::new(state.plans.clone()))
            .app_data(web::Data::new(state))
            .app_data(web::PayloadConfig::new(routes::runs::BODY_LIMIT))
            .service(
                web::scope("")
                    .wrap(edge)
                    .service(routes::resource("/", "GET").route(web::get().to(root)))
                    .service(routes::resource("/healthz", "GET").route(web::get().to(healthz)))
                    .service(routes::resource("/readyz", "GET").route(web::get().to(readyz)))
                    .service(routes::resource("/metrics", "GET").route(web::get().to(metrics)))
                    .service(
                        routes::resource("/api/openapi.json", "GET")
                            .route(web::get().to(openapi::openapi_json)),
                    )
                    // A request tries the patterns in this order, each dynamic one a regex match: a
                    // run's own requests (its message, stream and point read) come first. No two of
                    // these patterns match one path, except that `/runs/feed` must win over the HTML
                    // `/runs/{id}`: `sse` before `html`.
                    .configure(routes::messages::configure)
                    .configure(routes::sse::configure)
                    .configure(routes::api::configure)
                    .configure(routes::runs::configure)
                    .configure(routes::html::configure)
                    .configure(routes::admin::configure)
                    .configure(routes::plans::configure)
                    .configure(|cfg| {
                        if slack {
                            routes::slack::configure(cfg)
                        }
                    })
                    .default_service(web::to(routes::not_found)),
            );
    }
}

/// `GET /`: the runs index.
async fn root() -> HttpResponse {
    HttpResponse::Found()
        .insert_header((header::LOCATION, "/runs"))
        .finish()
}

/// What the health probes say of storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StorageHealth {
    /// A round trip answered within [`PROBE_TIMEOUT`] and the last write found space.
    Ok,
    /// The round trip failed or did not answer in time.
    Failing,
    /// The last write failed for lack of space (SPEC §8.1: e.g. a full disk) and none committed since;
    /// reads still answer, admissions do not.
    OutOfSpace,
}

impl StorageHealth {
    fn word(self) -> &'static str {
        match self {
            StorageHealth::Ok => "ok",
            StorageHealth::Failing | StorageHealth::OutOfSpace => "degraded",
        }
    }
}

/// The one probe behind `/healthz` and `/readyz`: whether the storage thread's last write found space
/// ([`StorageHandle::write_space`] — a full disk still answers reads, so a round trip alone passes), and
/// whether storage answers a round trip within [`PROBE_TIMEOUT`].
async fn storage_health(state: &AppState) -> StorageHealth {
    if state.storage.write_space() == storage::WriteSpace::Exhausted {
        return StorageHealth::OutOfSpace;
    }
    match tokio::time::timeout(PROBE_TIMEOUT, state.storage.ping()).await {
        Ok(Ok(())) => StorageHealth::Ok,
        Ok(Err(e)) => {
            tracing::warn!(generation = state.generation.as_str(), error = %e, "health probe: storage failing");
            StorageHealth::Failing
        }
        Err(_) => {
            tracing::warn!(
                generation = state.generation.as_str(),
                timeout_ms = PROBE_TIMEOUT.as_millis() as u64,
                "health probe: storage did not answer"
            );
            StorageHealth::Failing
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Health<'a> {
    ok: bool,
    generation: &'a str,
    pid: u32,
    version: &'static str,
    /// `"ok"` or `"degraded"` (the storage probe failed or timed out, or the last write found no space).
    storage: &'static str,
    /// The backend: `"sqlite"`, `"memory"`, `"postgres"`.
    storage_kind: &'static str,
    draining: bool,
}

/// `GET /healthz`: liveness — always 200 while the process answers (`ok: true`); a failing storage shows
/// as `storage: "degraded"` here and as a 503 on `/readyz`, never as a restart-worthy failure.
async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let storage = storage_health(&state).await;
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(Health {
            ok: true,
            generation: state.generation.as_str(),
            pid: std::process::id(),
            version: state.version,
            storage: storage.word(),
            storage_kind: state.storage.kind(),
            draining: state.draining.load(Ordering::SeqCst),
        })
}

/// `GET /readyz`: 200 `{ready: true}`; 503 `{ready: false, error, message, draining, storage}` while
/// draining (`error: "draining"`) or while storage is failing or out of space (`error: "unavailable"`).
async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let draining = state.draining.load(Ordering::SeqCst);
    let storage = storage_health(&state).await;
    let refusal = match (draining, storage) {
        (false, StorageHealth::Ok) => {
            return HttpResponse::Ok()
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .json(json!({"ready": true}))
        }
        (true, _) => ApiError::Draining,
        (false, StorageHealth::OutOfSpace) => {
            ApiError::Unavailable("storage is out of space".into())
        }
        (false, _) => ApiError::Unavailable("storage is failing".into()),
    };
    let mut res = refusal.error_response();
    let body = json!({
        "ready": false,
        "error": if draining { "draining" } else { "unavailable" },
        "message": refusal.to_string(),
        "draining": draining,
        "storage": storage.word(),
    });
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    res.set_body(actix_web::body::BoxBody::new(body.to_string()))
}

/// `GET /metrics`: Prometheus text (format 0.0.4), see [`actors::metrics`].
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let live_runs = state
        .registry
        .rows()
        .iter()
        .filter(|r| r.finished_at.is_none())
        .count() as u64;
    let observed = actors::metrics::Observed {
        live_runs,
        sse_subscribers: state.registry.subscriber_count() as u64,
        history_write_failures: state.history.failures(),
    };
    HttpResponse::Ok()
        .content_type(actors::metrics::CONTENT_TYPE)
        .body(state.metrics.render(observed))
}
