//! Route handlers, one module per surface.
pub mod messages;
pub mod runs;
