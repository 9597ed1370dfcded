//! Route handlers, one module per surface.
//!
//! Every path is one [`resource`] holding all of its methods, so a known path with another method
//! answers 405 `method_not_allowed` (with `Allow`), never a 404.
pub mod admin;
pub mod api;
pub mod html;
pub mod messages;
pub mod plans;
pub mod runs;
pub mod sse;

use actix_web::{web, HttpRequest, Resource};

use crate::error::ApiError;

/// The resource at `path`; a method it has no route for answers 405 naming `allow` (the methods its
/// routes take, e.g. `"GET, DELETE"`).
pub fn resource(path: &str, allow: &'static str) -> Resource {
    web::resource(path).default_service(web::to(move |req: HttpRequest| async move {
        Err::<actix_web::HttpResponse, _>(ApiError::MethodNotAllowed { method: req.method().to_string(), allow })
    }))
}

/// The app's default service: a path no resource matches.
pub async fn not_found(req: HttpRequest) -> Result<actix_web::HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!("route {} {}", req.method(), req.path())))
}
