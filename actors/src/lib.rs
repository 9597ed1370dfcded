//! Switchboard's actors: supervision, run lifecycle, agents and tools, the history writer.
//!
//! # Layout
//! - [`agent`]: the `Agent` trait and the built-in agents (`scripted`, `openai`).
//! - [`tools`]: the `Tool` trait, the built-in tools and the run workspace.
//! - [`history`]: the history writer (fire-and-forget record writes with retries).

pub mod agent;
pub mod delivery;
pub mod flusher;
pub mod heartbeat;
pub mod history;
pub mod host;
pub mod metrics;
pub mod operations;
pub mod plan;
pub mod queue;
pub mod redact;
pub mod registry;
pub mod run;
pub mod runs_service;
pub mod supervisor;
pub mod token;
pub mod tools;
