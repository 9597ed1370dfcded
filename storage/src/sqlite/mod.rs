//! The SQLite implementation of the storage traits.
//!
//! Owns one `rusqlite::Connection` to the database file. Exactly one `SqliteStore` per process writes,
//! inside the storage actor's thread; other processes on the host (the old and new process of a rolling
//! restart) may open the same file: WAL lets readers proceed, every transaction is `BEGIN IMMEDIATE` and
//! `busy_timeout` makes a writer wait up to 5 s before `SQLITE_BUSY` becomes a transient error.
//!
//! # Design
//! Retention is applied on read. The kept set is always a newest-first prefix of the in-cutoff rows (age,
//! then `maxRuns`, then `maxBytes` are all prefix cuts of one total order), so it is described by a
//! [`Kept`] floor. One aggregate over the in-cutoff rows decides whether a floor is needed at all; within
//! policy a list page is one indexed `SELECT`.

pub mod schema;
mod ledger;
mod runs;
mod plan;

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use crate::Result;

pub use runs::Kept;

/// SQLite's `synchronous` setting for the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// fsync at every commit: a committed step survives power loss.
    #[default]
    Full,
    /// fsync at checkpoints: a committed step survives a process crash, not power loss.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }
}

pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct SqliteStore {
    conn: Connection,
    /// Inside a group commit: each method runs in a `SAVEPOINT` of the group's one transaction.
    grouped: bool,
    /// Open atomic units, innermost last: `true` when the unit opened the group itself (it then commits
    /// or rolls back the transaction), `false` when it is a savepoint inside one.
    atomic: Vec<bool>,
}

/// One method's transaction: a top-level `BEGIN IMMEDIATE` (or deferred, for reads), or — inside a group
/// commit — a savepoint, so a failing method rolls back only itself and the group commits the rest.
pub(crate) enum Tx<'c> {
    Top(rusqlite::Transaction<'c>),
    Nested(rusqlite::Savepoint<'c>),
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        match self {
            Tx::Top(t) => t,
            Tx::Nested(s) => s,
        }
    }
}

impl Tx<'_> {
    pub(crate) fn commit(self) -> rusqlite::Result<()> {
        match self {
            Tx::Top(t) => t.commit(),
            Tx::Nested(s) => s.commit(),
        }
    }
}

impl SqliteStore {
    /// Open (creating when absent) and migrate the database at `path`.
    pub fn open(path: &Path, sync: Synchronous) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| crate::Error::Unavailable(format!("create {}: {e}", dir.display())))?;
        }
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", sync.pragma())?;
        conn.pragma_update(None, "foreign_keys", "OFF")?;
        schema::migrate(&mut conn)?;
        Ok(SqliteStore { conn, grouped: false, atomic: Vec::new() })
    }

    /// The schema version on disk.
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// The connection, for tests that inspect query plans or inject faults.
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The 32-byte capability secret created at the first migration (hex).
    pub fn capability_secret(&self) -> Result<String> {
        Ok(self.conn.query_row("SELECT value FROM meta WHERE key = 'capability_secret'", [], |r| r.get(0))?)
    }

    /// A write transaction: `BEGIN IMMEDIATE`, or a savepoint inside a group.
    fn immediate(&mut self) -> Result<Tx<'_>> {
        Ok(if self.grouped {
            Tx::Nested(self.conn.savepoint()?)
        } else {
            Tx::Top(self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?)
        })
    }

    /// A read transaction: deferred, or a savepoint inside a group (which sees the group's writes).
    fn read(&mut self) -> Result<Tx<'_>> {
        Ok(if self.grouped { Tx::Nested(self.conn.savepoint()?) } else { Tx::Top(self.conn.transaction()?) })
    }

    /// Start a group commit: one `BEGIN IMMEDIATE` that the next methods join as savepoints. Answers
    /// `false` (and starts nothing) when a group is already open: the caller then runs inside it.
    pub fn begin_group(&mut self) -> Result<bool> {
        if self.grouped {
            return Ok(false);
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        self.grouped = true;
        Ok(true)
    }

    /// Start an atomic unit of several methods: a savepoint inside a group, else a group of its own.
    pub fn begin_atomic(&mut self) -> Result<()> {
        let opened = self.begin_group()?;
        if !opened {
            self.conn.execute_batch("SAVEPOINT atomic_unit")?;
        }
        self.atomic.push(opened);
        Ok(())
    }

    /// End the innermost atomic unit: release or roll back its savepoint, or commit or roll back its group.
    pub fn end_atomic(&mut self, commit: bool) -> Result<()> {
        match self.atomic.pop() {
            Some(true) => self.end_group(commit),
            Some(false) if commit => Ok(self.conn.execute_batch("RELEASE atomic_unit")?),
            Some(false) => Ok(self.conn.execute_batch("ROLLBACK TO atomic_unit; RELEASE atomic_unit")?),
            None => Ok(()),
        }
    }

    /// End a group: `COMMIT` (or `ROLLBACK` when `commit` is false or the commit fails).
    pub fn end_group(&mut self, commit: bool) -> Result<()> {
        self.grouped = false;
        let done = if commit { self.conn.execute_batch("COMMIT") } else { self.conn.execute_batch("ROLLBACK") };
        if done.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        Ok(done?)
    }
}
