//! Route handlers, one module per surface.
pub mod admin;
pub mod api;
pub mod html;
pub mod messages;
pub mod plans;
pub mod runs;
pub mod sse;
