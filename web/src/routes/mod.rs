//! Route handlers, one module per surface.
//!
//! Every path is one [`resource`] holding all of its methods, so a known path with another method
//! answers 405 `method_not_allowed` (with `Allow`), never a 404.
pub mod admin;
pub mod api;
pub mod approvals;
pub mod html;
pub mod messages;
pub mod plans;
pub mod retry;
pub mod runs;
pub mod slack;
pub mod sse;

use actix_web::{web, HttpRequest, Resource};

use crate::error::ApiError;

/// Every `/api` route: its path pattern and its methods as `Allow` names them. The one list the OpenAPI
/// document is checked against: [`resource`] refuses to mount an `/api` path (or methods) not listed
/// here, and the tests check every entry is served and described in `/api/openapi.json`.
pub const API_ROUTES: &[(&str, &str)] = &[
    ("/api/openapi.json", "GET"),
    ("/api/messages", "POST"),
    ("/api/runs", "GET"),
    ("/api/runs/{id}", "GET, DELETE"),
    ("/api/runs/{id}/events", "GET"),
    ("/api/runs/{id}/friction", "GET"),
    ("/api/runs/{id}/children", "GET"),
    ("/api/runs/{id}/stop", "POST"),
    ("/api/runs/{id}/retry", "POST"),
    ("/api/runs/{id}/approvals/{callId}", "POST"),
    ("/api/runs/{id}/stream", "GET"),
    ("/api/live", "GET"),
    ("/api/plans/{id}/suggestions", "POST"),
    ("/api/plans/{id}/suggestions/{rid}", "GET"),
    ("/api/plans/{id}/suggestions/{rid}/cancel", "POST"),
    ("/api/plans/{id}/suggestions/{rid}/dismiss", "POST"),
    ("/api/plans/{id}/import", "POST"),
];

/// The resource at `path`; a method it has no route for answers 405 naming `allow` (the methods its
/// routes take, e.g. `"GET, DELETE"`).
///
/// # Panics
/// When `path` is under `/api` and `(path, allow)` is not in [`API_ROUTES`] (a route the OpenAPI
/// document would not describe): at mount time, so every test that starts the app fails.
pub fn resource(path: &str, allow: &'static str) -> Resource {
    if path == "/api" || path.starts_with("/api/") {
        assert!(
            API_ROUTES.contains(&(path, allow)),
            "{path} ({allow}) is not in routes::API_ROUTES"
        );
    }
    web::resource(path)
        .app_data(RoutePattern(path.to_owned()))
        .default_service(web::to(move |req: HttpRequest| async move {
            Err::<actix_web::HttpResponse, _>(ApiError::MethodNotAllowed {
                method: req.method().to_string(),
                allow,
            })
        }))
}

/// The pattern of the resource a request matched (resource-level app data of every [`resource`]), for
/// the request log and metrics: read from the matched resource instead of matching the path against
/// every pattern again, as `HttpRequest::match_pattern` does.
#[derive(Debug, Clone)]
pub struct RoutePattern(pub String);

/// The app's default service: a path no resource matches.
pub async fn not_found(req: HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!(
        "route {} {}",
        req.method(),
        req.path()
    )))
}
