//! Operator endpoints: `POST /admin/crash` (SPEC §6.5) and `POST /admin/drain` (SPEC §6.4).

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::resource;
use crate::auth::DEPLOY_WRITE;
use crate::error::ApiError;
use crate::AppState;

/// The exit code of a simulated kill: what a process killed by SIGKILL reports.
pub const CRASH_EXIT_CODE: i32 = 137;
/// How long the crash answer has to reach the caller before the process dies.
pub const CRASH_DELAY: Duration = Duration::from_millis(50);

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/admin/crash", "POST").route(web::post().to(crash)))
        .service(resource("/admin/drain", "POST").route(web::post().to(drain)));
}

/// 503 when no caller could ever hold `deploy:write` (dev bypass off, no token configured).
fn authorize(req: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if !state.auth.dev_bypass && state.auth.tokens.is_empty() {
        return Err(ApiError::Unavailable(
            "no operator credentials are configured".into(),
        ));
    }
    state.auth.require(req, DEPLOY_WRITE).map(|_| ())
}

/// Exit 137 about 50 ms after answering: no drain, no handoff, no finish writes.
async fn crash(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    tracing::warn!(
        generation = state.generation.as_str(),
        "POST /admin/crash: exiting 137 without draining"
    );
    std::thread::spawn(|| {
        std::thread::sleep(CRASH_DELAY);
        std::process::exit(CRASH_EXIT_CODE);
    });
    Ok(HttpResponse::Accepted().json(json!({
        "ok": true, "generation": state.generation.as_str(), "pid": std::process::id(),
    })))
}

/// Start a drain; the process exits when it is done.
async fn drain(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    authorize(&req, &state)?;
    state.shutdown.notify_one();
    Ok(HttpResponse::Accepted().json(json!({
        "ok": true, "generation": state.generation.as_str(), "pid": std::process::id(), "draining": true,
    })))
}
