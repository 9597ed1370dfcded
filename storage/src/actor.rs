//! `StorageActor`: the one thread of this process that touches the database.
//!
//! Owns the backend ([`SqliteStore`] or [`MemoryStore`]) inside an actix `SyncArbiter` with one thread, so
//! every storage transaction of the process runs in order, one at a time — like a Durable Object's input
//! gate. Messages are [`Transact`] closures: each runs exactly one backend method, and each backend method is
//! one transaction. Callers never see this type; they use [`crate::StorageHandle`].
//!
//! Invariants:
//! - a handler never panics out: a panicking transaction body is caught, answered as
//!   [`Error::Panicked`], and the actor stops so `SyncArbiter` reopens the backend through its factory
//!   (a panic would otherwise kill the only thread and every caller would get a mailbox error forever);
//! - a backend that failed to open answers `Unavailable` on every message, and the actor retries the open
//!   by stopping (the factory runs again) after each refused message.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use actix::{Actor, Handler, Message, SyncContext};

use crate::memory::MemoryStore;
use crate::sqlite::{SqliteStore, Synchronous};
use crate::ledger::RunLedger;
use crate::plan::PlanStore;
use crate::store::RunStore;
use crate::{Error, Result};

/// Everything a storage backend implements.
pub trait Backend: RunStore + RunLedger + PlanStore + 'static {
    /// The secret capability tokens are derived from (hex; 32 bytes), shared by every process on the database.
    fn capability_secret(&mut self) -> Result<String>;
}

impl Backend for SqliteStore {
    fn capability_secret(&mut self) -> Result<String> {
        SqliteStore::capability_secret(self)
    }
}

impl Backend for MemoryStore {
    fn capability_secret(&mut self) -> Result<String> {
        Ok(self.secret().to_owned())
    }
}

/// Which backend the actor opens (and reopens after a poisoned connection).
#[derive(Debug, Clone)]
pub enum BackendSpec {
    Sqlite { path: PathBuf, synchronous: Synchronous },
    /// The memory backend's clones share one state, so a reopened actor sees the same data.
    Memory(MemoryStore),
}

impl BackendSpec {
    pub fn open(&self) -> Result<Box<dyn Backend>> {
        Ok(match self {
            BackendSpec::Sqlite { path, synchronous } => Box::new(SqliteStore::open(path, *synchronous)?),
            BackendSpec::Memory(m) => Box::new(m.clone()),
        })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::Sqlite { .. } => "sqlite",
            BackendSpec::Memory(_) => "memory",
        }
    }
}

pub struct StorageActor {
    backend: std::result::Result<Box<dyn Backend>, String>,
}

impl StorageActor {
    pub fn new(spec: &BackendSpec) -> Self {
        let backend = spec.open().map_err(|e| {
            tracing::error!(error = %e, "failed to open storage backend");
            e.to_string()
        });
        StorageActor { backend }
    }
}

impl Actor for StorageActor {
    type Context = SyncContext<Self>;
}

/// The body of one transaction.
pub type TransactFn<R> = Box<dyn FnOnce(&mut dyn Backend) -> Result<R> + Send>;

/// One transaction: a closure over the backend. The result type is the operation's own.
pub struct Transact<R>(pub TransactFn<R>);

impl<R: 'static> Message for Transact<R> {
    type Result = Result<R>;
}

impl<R: Send + 'static> Handler<Transact<R>> for StorageActor {
    type Result = Result<R>;

    fn handle(&mut self, msg: Transact<R>, ctx: &mut SyncContext<Self>) -> Result<R> {
        let backend = match &mut self.backend {
            Ok(b) => b,
            Err(why) => {
                let err = Error::Unavailable(why.clone());
                actix::ActorContext::stop(ctx);
                return Err(err);
            }
        };
        let out = catch_unwind(AssertUnwindSafe(|| (msg.0)(backend.as_mut()))).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::Panicked(what))
        });
        if let Err(e) = &out {
            if e.poisons_connection() {
                tracing::error!(error = %e, "storage backend reopens after a poisoning error");
                actix::ActorContext::stop(ctx);
            }
        }
        out
    }
}

/// Start the storage actor on its own thread.
pub fn start(spec: BackendSpec) -> actix::Addr<StorageActor> {
    let spec = Arc::new(spec);
    actix::SyncArbiter::start(1, move || StorageActor::new(&spec))
}
