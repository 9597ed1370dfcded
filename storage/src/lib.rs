//! Switchboard's storage: the record contract, finished-run history, the live-run ledger, and the one
//! actor that owns the database.
//!
//! Owns the SQLite file (or the in-memory state). Everything above this crate reaches storage through a
//! [`StorageHandle`]; nothing here knows about HTTP, SSE or actor supervision.
//!
//! # Layout
//! - [`record`]: the pure record contract — `RunRecord`, validation, retention, byte budget, visibility.
//! - [`store`]: the [`RunStore`] trait (finished-run history) and its vocabulary.
//! - [`ledger`]: the live-run ledger; [`ledger::decisions`] holds every pure decision.
//! - [`memory`], [`sqlite`], [`postgres`]: the three implementations; one contract suite tests them all.
//! - [`actor`], [`handle`]: the storage actor (one thread, the one write connection, a bounded queue)
//!   and its async handle;
//! - [`readers`]: read-only connections on threads of their own, so reads never queue behind writes.
//! - [`news`]: cross-host news (PostgreSQL's LISTEN/NOTIFY) and its in-process fan-out.
//! - [`clock`]: injected time.
//! - [`RunId`]: a run's id, the bare string on the wire and on disk.
//! - `testing` (the `pg-cluster` feature): a throwaway PostgreSQL cluster for tests, `chaos` and `bench`.
//!
//! Invariants:
//! - only the storage actor's thread writes the database; each message is one transaction;
//! - reads of the SQLite backend run on read-only connections, never in the actor's queue;
//! - every queue is bounded: a full one answers [`Error::Unavailable`] at once, never blocks;
//! - a refusal is a typed result value; an [`Error`] means storage could not answer;
//! - a bad run id never reaches SQL.

pub mod actor;
mod backend;
pub mod clock;
pub mod entropy;
mod error;
pub mod generation;
pub mod handle;
pub mod ledger;
pub mod memory;
pub mod news;
pub mod plan;
pub mod postgres;
pub mod readers;
pub mod record;
mod run_id;
pub mod sqlite;
pub mod store;
#[cfg(any(test, feature = "pg-cluster"))]
pub mod testing;

pub use actor::{BackendSpec, WriteSpace};
pub use clock::{Clock, DbClock, ManualClock, SystemClock};
pub use error::{DecodeProblem, Error, Result};
pub use generation::Generation;
pub use handle::{StorageHandle, StorageOptions};
pub use memory::MemoryStore;
pub use news::{News, NewsFeed};
pub use postgres::{redact_url, PgStore};
pub use run_id::RunId;
pub use sqlite::{SqliteStore, Synchronous, WriteLockProbe};
pub use store::RunStore;
