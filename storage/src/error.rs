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
    /// PostgreSQL failed: a lost race (serialization failure `40001`, deadlock `40P01`, unique
    /// violation `23505` from a concurrent insert), a lock or statement timeout, a dropped connection —
    /// all transient ([`Error::is_transient`]) — or anything else, which is not.
    #[error("postgres: {}", pg_display(.0))]
    Postgres(#[from] postgres::Error),
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
    /// A group commit was rolled back because one of its messages failed or rolled back its own
    /// writes (PostgreSQL groups keep no savepoint per message): nothing of it landed, and each
    /// message runs again as its own transaction ([`crate::actor::Backend::rerun_alone`]); transient.
    #[error("storage group rolled back: {0}")]
    GroupRolledBack(&'static str),
}

impl Error {
    pub(crate) fn corrupt(what: &'static str, why: impl std::fmt::Display) -> Self {
        Error::Corrupt {
            what,
            why: why.to_string(),
        }
    }

    /// Whether waiting and trying again may succeed (SPEC §5.5): the actor down or its queue full, a
    /// busy or locked database, a full disk, a panicked transaction. Anything else (an I/O error, a
    /// constraint, a corrupt value, a newer schema) fails the same way again.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable(_) | Error::Panicked(_) | Error::GroupRolledBack(_) => true,
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy
                    | rusqlite::ErrorCode::DatabaseLocked
                    | rusqlite::ErrorCode::DiskFull
            ),
            Error::Postgres(e) => pg_transient(e),
            _ => false,
        }
    }

    /// Whether the write failed for lack of space (SPEC §8.1: readiness fails while it lasts): SQLite's
    /// `SQLITE_FULL` (its VFS reports a write that hit `ENOSPC` this way too, and so does a database at
    /// its `max_page_count`), PostgreSQL's `53100 disk_full`. Transient: freeing space makes the same
    /// write succeed.
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => {
                e.code == rusqlite::ErrorCode::DiskFull
            }
            Error::Postgres(e) => pg_code(e) == Some("53100"),
            _ => false,
        }
    }

    /// Whether this is a lost race against another connection (a serialization failure, a deadlock, or
    /// a unique violation from a concurrent insert): running the whole transaction again decides anew.
    /// A race is transient and never a refusal (SPEC §1.3).
    pub fn is_race(&self) -> bool {
        matches!(self, Error::Postgres(e) if pg_code(e).is_some_and(|c| PG_RACES.contains(&c)))
    }

    /// Whether the connection may be left in a bad state, so the actor should reopen it.
    pub fn poisons_connection(&self) -> bool {
        matches!(self, Error::Panicked(_))
            || matches!(self, Error::Sqlite(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::NotADatabase
                    | rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::SystemIoFailure))
            || matches!(self, Error::Postgres(e) if pg_lost(e)
                || pg_code(e).is_some_and(|c| c.starts_with("08") || c.starts_with("57P")))
    }
}

/// SQLSTATEs of a lost race: `serialization_failure`, `deadlock_detected`, `unique_violation`.
const PG_RACES: [&str; 3] = ["40001", "40P01", "23505"];

fn pg_code(e: &postgres::Error) -> Option<&str> {
    e.code().map(postgres::error::SqlState::code)
}

/// A PostgreSQL error with what the server said (`postgres::Error` alone prints "db error").
fn pg_display(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// No answer from the server: the connection is closed, or an I/O error (connecting included).
fn pg_lost(e: &postgres::Error) -> bool {
    e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// A PostgreSQL error worth retrying: a race, a lock or statement timeout (`55P03`, `57014`), too many
/// connections or no resources (`53…`), a server shutting down or a connection lost (`57P…`, `08…`), or
/// no answer from the server at all (an I/O error, a closed connection).
fn pg_transient(e: &postgres::Error) -> bool {
    match pg_code(e) {
        None => pg_lost(e),
        Some(c) => {
            PG_RACES.contains(&c)
                || matches!(c, "55P03" | "57014")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c.starts_with("08")
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a stored JSON value does not decode: what a log line or an [`Error::Corrupt`] may say about a
/// bad row, in place of the stored bytes or the decoder's message (which can quote them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeProblem {
    /// The stored text is not JSON at all (a syntax error, or cut short).
    InvalidJson,
    /// The stored text is JSON, but not of a shape this build reads: a missing or mistyped field, an
    /// unknown variant — a row from another version, or one edited by hand.
    UnsupportedSchema,
}

impl DecodeProblem {
    /// Classify a `serde_json` failure: syntax and end-of-input errors are invalid JSON, data errors an
    /// unsupported shape. (An I/O error cannot come from decoding text; it counts as invalid JSON.)
    pub fn of(e: &serde_json::Error) -> Self {
        match e.classify() {
            serde_json::error::Category::Data => DecodeProblem::UnsupportedSchema,
            serde_json::error::Category::Syntax
            | serde_json::error::Category::Eof
            | serde_json::error::Category::Io => DecodeProblem::InvalidJson,
        }
    }

    /// The stable spelling a log field carries: `invalid_json` or `unsupported_schema`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecodeProblem::InvalidJson => "invalid_json",
            DecodeProblem::UnsupportedSchema => "unsupported_schema",
        }
    }
}

impl std::fmt::Display for DecodeProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::DecodeProblem;

    fn problem<T: serde::de::DeserializeOwned + std::fmt::Debug>(text: &str) -> DecodeProblem {
        DecodeProblem::of(
            &serde_json::from_str::<T>(text).expect_err("a text that does not decode"),
        )
    }

    /// Text that is not JSON — garbage, cut short, trailing bytes — is invalid JSON; JSON of the wrong
    /// shape — another tag, a missing or mistyped field, another type — is an unsupported schema.
    #[test]
    fn a_decode_failure_is_invalid_json_or_an_unsupported_schema() {
        use crate::ledger::AdmitOutcome;
        for text in [
            "",
            "not json",
            "{\"outcome\":\"started\",",
            "{\"outcome\":\"started\",\"runId\":\"r\"} x",
            "\u{0}",
        ] {
            assert_eq!(
                problem::<AdmitOutcome>(text),
                DecodeProblem::InvalidJson,
                "{text:?}"
            );
            assert_eq!(
                problem::<serde_json::Value>(text),
                DecodeProblem::InvalidJson,
                "{text:?}"
            );
        }
        for text in [
            "{\"outcome\":\"teleported\",\"runId\":\"r\"}",
            "{\"outcome\":\"started\"}",
            "{\"outcome\":\"steered\",\"runId\":\"r\",\"seq\":\"one\"}",
            "{\"runId\":\"r\"}",
            "[1, 2]",
            "42",
            "null",
        ] {
            assert_eq!(
                problem::<AdmitOutcome>(text),
                DecodeProblem::UnsupportedSchema,
                "{text:?}"
            );
        }
        assert_eq!(DecodeProblem::InvalidJson.to_string(), "invalid_json");
        assert_eq!(
            DecodeProblem::UnsupportedSchema.as_str(),
            "unsupported_schema"
        );
    }
}
