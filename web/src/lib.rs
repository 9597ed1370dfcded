//! Switchboard's HTTP surface: actix-web routes only.
//!
//! Owns no state of its own: [`AppState`] holds handles into the actors and storage crates. Never touches
//! SQLite (everything goes through `storage::StorageHandle` or the actors).
//!
//! # Layout
//! - [`configure`]: mounts every route on an actix-web `ServiceConfig`.
//! - `health`: `GET /healthz`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use storage::{Generation, StorageHandle};

/// What every route handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub generation: Generation,
    /// The binary's version, for `/healthz`.
    pub version: &'static str,
    pub storage: StorageHandle,
    /// Set once when a drain begins; admission answers 503 from then on.
    pub draining: Arc<AtomicBool>,
}

/// Mount every route.
pub fn configure(state: AppState) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        cfg.app_data(web::Data::new(state)).route("/healthz", web::get().to(healthz));
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
