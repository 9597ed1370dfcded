//! Switchboard's HTTP surface: actix-web routes only.
//!
//! Owns no state of its own: [`AppState`] holds handles into the actors and storage crates. Never touches
//! SQLite (everything goes through `storage::StorageHandle` or the actors).
//!
//! # Layout
//! - [`configure`]: mounts every route on an actix-web `ServiceConfig`.
//! - [`auth`]: principals, scopes, the dev bypass.
//! - [`error`]: `ApiError`, the one map to HTTP answers.
//! - [`routes`]: `messages` (admission), `runs` (stop).

pub mod auth;
pub mod error;
pub mod routes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use storage::{Generation, StorageHandle};

pub use auth::AuthConfig;

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
}

/// Mount every route.
pub fn configure(state: AppState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        cfg.app_data(web::Data::new(state.plans.clone()))
            .app_data(web::Data::new(state))
            .app_data(web::PayloadConfig::new(routes::messages::MESSAGE_BODY_LIMIT + 1))
            .route("/healthz", web::get().to(healthz))
            .route("/metrics", web::get().to(metrics))
            .route("/api/messages", web::post().to(routes::messages::post_message))
            .route("/api/runs/{id}/stop", web::post().to(routes::runs::stop_run))
            .route("/api/runs/{id}", web::delete().to(routes::runs::kill_run))
            .configure(routes::api::configure)
            .configure(routes::sse::configure)
            .configure(routes::html::configure)
            .configure(routes::admin::configure)
            .configure(routes::plans::configure);
    }
}

#[derive(Serialize)]
struct Health<'a> {
    ok: bool,
    generation: &'a str,
    pid: u32,
    version: &'static str,
    storage: &'static str,
    draining: bool,
}

/// `GET /healthz`: liveness of the process and its storage actor (a closed mailbox answers 503).
async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let storage_ok = match state.storage.ping().await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(generation = state.generation.as_str(), error = %e, "health check: storage unavailable");
            false
        }
    };
    let body = Health {
        ok: storage_ok,
        generation: state.generation.as_str(),
        pid: std::process::id(),
        version: state.version,
        storage: state.storage.kind(),
        draining: state.draining.load(Ordering::SeqCst),
    };
    if storage_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// `GET /metrics`: Prometheus text.
async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let live_runs = state.registry.rows().iter().filter(|r| r.finished_at.is_none()).count() as u64;
    let observed = actors::metrics::Observed {
        live_runs,
        sse_subscribers: state.registry.subscriber_count() as u64,
        history_write_failures: state.history.failures(),
    };
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.metrics.render(observed))
}
