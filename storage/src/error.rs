//! The storage crate's one error type.
//!
//! A refusal the caller must act on (thread live, fenced, unknown run, …) is a typed *result value* of the
//! operation, never an `Error`: an `Error` means "the storage could not answer", and the caller decides
//! whether to retry (§5.5). `Unavailable` is what every caller sees while the storage actor is down.

use crate::record::RecordError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage actor's mailbox is closed or the backend could not be opened; transient.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// SQLite failed (including `SQLITE_BUSY` after `busy_timeout`); transient from the caller's view.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database was written by a newer version of Switchboard than this one.
    #[error("database schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew { found: i64, supported: i64 },
    /// A record handed to the store does not satisfy the record contract.
    #[error("invalid record: {0}")]
    InvalidRecord(#[from] RecordError),
    /// A value read back from disk does not decode; the row is skipped or reported, never trusted.
    #[error("corrupt stored value in {what}: {why}")]
    Corrupt { what: &'static str, why: String },
    /// A transaction body panicked; it was rolled back and the connection reopened.
    #[error("storage operation panicked: {0}")]
    Panicked(String),
}

impl Error {
    pub(crate) fn corrupt(what: &'static str, why: impl std::fmt::Display) -> Self {
        Error::Corrupt { what, why: why.to_string() }
    }

    /// Whether waiting and trying again may succeed (SPEC §5.5): the actor down or its queue full, a
    /// busy or locked database, a full disk, a panicked transaction. Anything else (an I/O error, a
    /// constraint, a corrupt value, a newer schema) fails the same way again.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable(_) | Error::Panicked(_) => true,
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked | rusqlite::ErrorCode::DiskFull
            ),
            _ => false,
        }
    }

    /// Whether the connection may be left in a bad state, so the actor should reopen it.
    pub fn poisons_connection(&self) -> bool {
        matches!(self, Error::Panicked(_))
            || matches!(self, Error::Sqlite(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::NotADatabase
                    | rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::SystemIoFailure))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
