//! Switchboard's actors: supervision, run lifecycle, agents and tools, the history writer, the read
//! service.
//!
//! # Layout
//! - [`supervisor`]: the `Supervisor` (generation, admission through `ThreadSlot`s, reclaim, drain,
//!   stop and kill) and the restart policy.
//! - [`run`]: the `RunActor` and its pure machine (`run::machine`), launch paths and record assembly.
//! - [`heartbeat`], [`flusher`], [`history`]: lease renewal, batched event appends, record writes with
//!   retries (final beats provisional).
//! - [`registry`]: the in-process runs (seqs, backlogs, subscribers); [`queue`]: the byte-bounded queue
//!   its subscribers and SSE connections use.
//! - [`runs_service`]: the one read service (registry ∪ ledger ∪ store), the index feed.
//! - [`agent`], [`tools`]: the `Agent` trait and its providers; the `Tool` trait, built-in and external
//!   (HTTP, MCP) tools, workspaces and their fences.
//! - [`plan`], [`operations`]: the seeds' two coordinators (plan suggestions; per-app operations).
//! - [`channel`]: chat channels — the status card in the run's thread and the Slack Web API client.
//! - [`delivery`] (webhook replies), [`redact`] (credentials out of text), [`token`] (capability
//!   tokens), [`metrics`] (`/metrics`), [`host`] (facts about processes on this host).

pub mod agent;
pub mod channel;
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
