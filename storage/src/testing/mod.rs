//! Support for tests of this crate and of the crates above it, and for `chaos` / `bench` (the `pg-cluster`
//! feature).
//!
//! - [`pg`]: a throwaway PostgreSQL cluster per test process and a fresh database per test.
//! - [`logs`]: the `tracing` events a closure emits on the current thread, for tests of what a log says.

pub mod logs;
pub mod pg;
