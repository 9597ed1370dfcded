//! The SQLite implementation of the storage traits.
//!
//! Owns one `rusqlite::Connection` to the database file. Exactly one `SqliteStore` per process writes,
//! inside the storage actor's thread; other processes on the host (the old and new process of a rolling
//! restart) may open the same file: WAL lets readers proceed, every transaction is `BEGIN IMMEDIATE` and
//! `busy_timeout` makes a writer wait up to 5 s before `SQLITE_BUSY` becomes a transient error.
//!
//! Only this crate opens connections (SPEC §1.2). Besides the writer ([`SqliteStore::open`], which
//! creates and migrates), it offers three that never change the file: [`SqliteStore::open_reader`] (the
//! handle's readers, [`crate::readers`], on a file at this build's schema), [`SqliteStore::open_read_only`]
//! (the CLI's `--db` reads, any schema version up to this build's, never migrated) and [`WriteLockProbe`]
//! (whether some process holds the write lock right now). The raw connection is reachable only under the
//! `test-hooks` feature, which this crate's own integration tests enable.
//!
//! # Design
//! Retention is applied on read. The kept set is always a newest-first prefix of the in-cutoff rows (age,
//! then `maxRuns`, then `maxBytes` are all prefix cuts of one total order), so it is described by a
//! [`Kept`] floor. One aggregate over the in-cutoff rows decides whether a floor is needed at all; within
//! policy a list page is one indexed `SELECT`.
//!
//! # Layout
//! SQL grouped per table, below the trait implementations; dependencies point down only.
//! - `schema`: migrations by `PRAGMA user_version`;
//! - `live`: reads of `live_runs` and `deletion_fences` shared by both sides (row decoding, `is_live`,
//!   `is_killed`);
//! - `records`: the `runs` and `run_events` tables and the policy row of `meta` — the record upsert
//!   `put_in` that `put` and the ledger's `finish` share, list and event pages, trims;
//! - `runs`: [`RunStore`](crate::store::RunStore) for [`SqliteStore`], over `records`;
//! - `ledger`: [`RunLedger`](crate::ledger::RunLedger) for [`SqliteStore`], over `live` and `records`;
//! - `plan`: [`PlanStore`](crate::plan::PlanStore) for [`SqliteStore`] (its own tables).

mod ledger;
mod live;
mod plan;
mod records;
mod runs;
pub mod schema;

use crate::RunId;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::{Error, Result};

pub(crate) use records::within;
pub use records::Kept;

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
    /// `data_version` as the last top-level transaction saw it, read inside it just before its end
    /// ([`SqliteStore::data_version`] takes it).
    version_seen: VersionSeen,
}

/// See [`SqliteStore::data_version`]. Only the writer ([`SqliteStore::open`]) asks for the value, so
/// only its transactions read it (`watch`): a reader's end is its `COMMIT` alone.
#[derive(Debug, Default)]
struct VersionSeen {
    watch: bool,
    seen: std::cell::Cell<Option<u64>>,
}

/// One method's transaction: a top-level `BEGIN IMMEDIATE` (or deferred, for reads), or — inside a group
/// commit — a savepoint, so a failing method rolls back only itself and the group commits the rest.
/// Dropped without [`Tx::commit`], it rolls back.
///
/// Its control statements are prepared once per connection ([`control`]): rusqlite's `Transaction` and
/// `Savepoint` parse each `BEGIN`, `COMMIT`, `SAVEPOINT` and `RELEASE` again every time — a fifth of a
/// reader thread's samples, whose reads are small.
pub(crate) struct Tx<'c> {
    conn: &'c Connection,
    version_seen: &'c VersionSeen,
    nested: bool,
    /// Begun and neither committed nor rolled back.
    open: bool,
}

/// Opens a savepoint: a method's inside a group ([`Tx`]), or an atomic unit's.
const SAVEPOINT: &str = "SAVEPOINT tx";

fn read_data_version(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get::<_, i64>(0))
        .map(|v| v as u64)
}

/// Run a transaction-control statement from the connection's statement cache.
fn control(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// End the innermost savepoint — a method's inside a group, or an atomic unit's; all are named `tx`
/// (`RELEASE` and `ROLLBACK TO` take the most recent of a name) — keeping or undoing its writes.
fn end_savepoint(conn: &Connection, commit: bool) -> rusqlite::Result<()> {
    if !commit {
        control(conn, "ROLLBACK TO tx")?;
    }
    control(conn, "RELEASE tx")
}

/// End the open transaction: `COMMIT` or `ROLLBACK`; a `COMMIT` that fails and leaves it open is
/// rolled back. On the writer, first, inside it, `data_version` into `seen`: a read of the open transaction's
/// snapshot, where a read after it is a transaction of its own (its locks, the WAL index's header).
fn end_transaction(conn: &Connection, commit: bool, seen: &VersionSeen) -> rusqlite::Result<()> {
    if seen.watch {
        seen.seen.set(read_data_version(conn).ok());
    }
    let done = control(conn, if commit { "COMMIT" } else { "ROLLBACK" });
    if done.is_err() && !conn.is_autocommit() {
        let _ = control(conn, "ROLLBACK");
    }
    done
}

impl<'c> Tx<'c> {
    fn begin(
        conn: &'c Connection,
        version_seen: &'c VersionSeen,
        begin: &str,
        nested: bool,
    ) -> rusqlite::Result<Self> {
        control(conn, begin)?;
        Ok(Tx {
            conn,
            version_seen,
            nested,
            open: true,
        })
    }

    pub(crate) fn commit(mut self) -> rusqlite::Result<()> {
        self.end(true)
    }

    /// A commit that fails leaves `open` set: the drop then undoes what is left.
    fn end(&mut self, commit: bool) -> rusqlite::Result<()> {
        let out = match self.nested {
            true => end_savepoint(self.conn, commit),
            false => end_transaction(self.conn, commit, self.version_seen),
        };
        self.open = commit && out.is_err();
        out
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.end(false);
        }
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.conn
    }
}

/// Most rows one multi-row `INSERT` ([`insert_rows`]) carries; more take more statements.
const ROWS_PER_INSERT: usize = 16;

/// Insert `rows` with one statement per [`ROWS_PER_INSERT`]: `{head} VALUES (?1, …), (?1, …) {tail}`,
/// where `?1` is `key` in every row and each row binds its own `N` values after it. A statement a row
/// cost a run's step three and its record a dozen executions, each a bind, a seek and a reset; the
/// texts (one per row count) stay in the statement cache.
fn insert_rows<const N: usize>(
    tx: &Connection,
    head: &str,
    tail: &str,
    key: &dyn rusqlite::ToSql,
    rows: &[[&dyn rusqlite::ToSql; N]],
) -> rusqlite::Result<()> {
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut sql = format!("{head} VALUES ");
        let mut next = 2;
        for i in 0..chunk.len() {
            sql.push_str(if i == 0 { "(?1" } else { ", (?1" });
            for _ in 0..N {
                sql.push_str(&format!(", ?{next}"));
                next += 1;
            }
            sql.push(')');
        }
        sql.push(' ');
        sql.push_str(tail);
        let params: Vec<&dyn rusqlite::ToSql> = std::iter::once(key)
            .chain(chunk.iter().flatten().copied())
            .collect();
        tx.prepare_cached(&sql)?.execute(&*params)?;
    }
    Ok(())
}

/// Prepared statements each connection keeps. The ledger, the store and the plan tables use a few dozen
/// distinct statements; rusqlite's default of 16 made every run's writes prepare most of theirs again
/// (the SQL parser was a tenth of the storage thread's samples at concurrency 16).
const STATEMENT_CACHE: usize = 256;

impl SqliteStore {
    fn on(conn: Connection) -> Self {
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // The query planner's stability guarantee: a cached statement keeps its plan whatever is bound
        // (without it, a new value for a `LIMIT ?` or a column a partial index names made SQLite plan
        // the statement again at its next step: a twentieth of the storage thread's samples).
        let _ = conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        );
        SqliteStore {
            conn,
            grouped: false,
            atomic: Vec::new(),
            version_seen: VersionSeen::default(),
        }
    }

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
        // Ephemeral tables and sorts (a finish's `seq NOT IN (…)`, ordered reads) stay in memory: on
        // the default a statement that needs one creates, fills and closes a file in /var/tmp.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        schema::migrate(&mut conn)?;
        let mut store = SqliteStore::on(conn);
        store.version_seen.watch = true;
        Ok(store)
    }

    /// Open an existing database for reading only (the CLI's `--db`, SPEC §8.2): never created, never
    /// migrated, never written.
    ///
    /// - a missing file is an error naming the path (nothing is created);
    /// - a schema newer than this build is refused by name ([`Error::SchemaTooNew`]); a file with no
    ///   Switchboard schema at all (version 0) is refused too;
    /// - an older schema is read as is: tables and columns added since its version read as empty
    ///   stand-ins in the connection's own `temp` schema ([`schema::stand_ins`]) — a version-1 file has
    ///   no live runs — so every read of the current code works against it.
    ///
    /// The connection is opened `SQLITE_OPEN_READ_ONLY` and set `query_only`: a write method answers an
    /// error and changes nothing. SQLite itself may create the empty `-wal`/`-shm` companions a reader of
    /// a WAL database needs (when the directory is writable); the database file is never touched.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::Unavailable(format!(
                "no database at {}",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let supported = schema::current_version();
        if found > supported {
            return Err(Error::SchemaTooNew { found, supported });
        }
        if found == 0 {
            return Err(Error::Unavailable(format!(
                "{} holds no switchboard schema (schema version 0)",
                path.display()
            )));
        }
        // Stand-ins live in memory, never beside the file; they must exist before `query_only`.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        if found < supported {
            schema::stand_ins(&conn)?;
        }
        conn.pragma_update(None, "query_only", true)?;
        Ok(SqliteStore::on(conn))
    }

    /// A read-only connection for the handle's readers ([`crate::readers`]) on a database this build's
    /// writer has already created and migrated: opened `SQLITE_OPEN_READ_ONLY` and `query_only`, never
    /// created, never migrated. A file at another schema version is refused (the writer has not migrated
    /// it yet, or a newer build has): its reads then go through the storage actor.
    pub fn open_reader(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::Unavailable(format!(
                "no database at {}",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let supported = schema::current_version();
        if found != supported {
            return Err(Error::Unavailable(format!(
                "{} is at schema version {found}, this build reads {supported}",
                path.display()
            )));
        }
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.pragma_update(None, "query_only", true)?;
        Ok(SqliteStore::on(conn))
    }

    /// The schema version on disk.
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    /// The connection, for this crate's tests that inspect query plans or inject faults. Behind the
    /// `test-hooks` feature (enabled by the crate's dev-dependency on itself): nothing outside the storage
    /// crate runs SQL of its own (SPEC §1.2).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// How many rows each per-run table holds for `run_id`, table by table (read-only forensics: what a
    /// kill or a retention trim left behind, without SQL outside this crate). Tables an older schema lacks
    /// count 0 on a read-only store.
    pub fn rows_of_run(&mut self, run_id: &RunId) -> Result<Vec<(&'static str, u64)>> {
        const TABLES: [&str; 8] = [
            "runs",
            "run_events",
            "live_runs",
            "run_steps",
            "transcript",
            "run_inbox",
            "admit_receipts",
            "deletion_fences",
        ];
        let tx = self.read()?;
        let mut out = Vec::with_capacity(TABLES.len());
        for table in TABLES {
            let n: i64 = tx.query_row(
                &format!("SELECT COUNT(*) FROM {table} WHERE run_id = ?1"),
                [run_id],
                |r| r.get(0),
            )?;
            out.push((table, n.max(0) as u64));
        }
        Ok(out)
    }

    /// The 32-byte capability secret created at the first migration (hex).
    pub fn capability_secret(&self) -> Result<String> {
        Ok(self.conn.query_row(
            "SELECT value FROM meta WHERE key = 'capability_secret'",
            [],
            |r| r.get(0),
        )?)
    }

    /// Rows this connection has inserted, updated or deleted since it opened (SQLite's
    /// `sqlite3_total_changes64`): it grows exactly when a statement wrote.
    pub fn total_changes(&self) -> u64 {
        self.conn.total_changes()
    }

    /// SQLite's `data_version` on this connection: it moves exactly when another connection committed
    /// (never for this one's own commits). `None` when it cannot be read.
    ///
    /// The value the last top-level transaction read just before its end, when there is one not yet
    /// taken: it misses only commits after that transaction's snapshot began (none while this connection
    /// held the write lock), and the next transaction's value shows those. A read of its own here was a
    /// transaction after every group — its locks and WAL-index check, a sixtieth of a run's writer
    /// samples (issue 29).
    pub fn data_version(&self) -> Option<u64> {
        self.version_seen
            .seen
            .take()
            .or_else(|| read_data_version(&self.conn).ok())
    }

    /// A write transaction: `BEGIN IMMEDIATE`, or a savepoint inside a group.
    fn immediate(&mut self) -> Result<Tx<'_>> {
        self.tx("BEGIN IMMEDIATE")
    }

    /// A read transaction: deferred, or a savepoint inside a group (which sees the group's writes).
    fn read(&mut self) -> Result<Tx<'_>> {
        self.tx("BEGIN")
    }

    fn tx(&mut self, top: &str) -> Result<Tx<'_>> {
        Ok(match self.grouped {
            true => Tx::begin(&self.conn, &self.version_seen, SAVEPOINT, true)?,
            false => Tx::begin(&self.conn, &self.version_seen, top, false)?,
        })
    }

    /// Start a group commit: one `BEGIN IMMEDIATE` that the next methods join as savepoints. Answers
    /// `false` (and starts nothing) when a group is already open: the caller then runs inside it.
    pub fn begin_group(&mut self) -> Result<bool> {
        if self.grouped {
            return Ok(false);
        }
        control(&self.conn, "BEGIN IMMEDIATE")?;
        self.grouped = true;
        Ok(true)
    }

    /// Start an atomic unit of several methods: a savepoint inside a group, else a group of its own.
    pub fn begin_atomic(&mut self) -> Result<()> {
        let opened = self.begin_group()?;
        if !opened {
            control(&self.conn, SAVEPOINT)?;
        }
        self.atomic.push(opened);
        Ok(())
    }

    /// End the innermost atomic unit: release or roll back its savepoint, or commit or roll back its group.
    pub fn end_atomic(&mut self, commit: bool) -> Result<()> {
        match self.atomic.pop() {
            Some(true) => self.end_group(commit),
            Some(false) => Ok(end_savepoint(&self.conn, commit)?),
            None => Ok(()),
        }
    }

    /// End a group: `COMMIT` (or `ROLLBACK` when `commit` is false or the commit fails).
    pub fn end_group(&mut self, commit: bool) -> Result<()> {
        self.grouped = false;
        Ok(end_transaction(&self.conn, commit, &self.version_seen)?)
    }
}

/// Whether some connection holds the write lock of a database file right now — what a test that pauses
/// a server process (`SIGSTOP`) checks first, so the paused process does not stall every writer.
///
/// Holds one connection opened read-write but never created (a missing file is an error naming it). A
/// probe takes the write lock with `BEGIN IMMEDIATE` and rolls back at once: it writes nothing.
#[derive(Debug)]
pub struct WriteLockProbe {
    conn: Connection,
}

impl WriteLockProbe {
    /// Open a probe on `path`; a probe waits up to `wait` for the lock before calling it held.
    pub fn open(path: &Path, wait: Duration) -> Result<Self> {
        if !path.is_file() {
            return Err(Error::Unavailable(format!(
                "no database at {}",
                path.display()
            )));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(wait)?;
        Ok(WriteLockProbe { conn })
    }

    /// `true` when the write lock could be taken (and was released again) within the wait; `false` when
    /// another connection holds it.
    pub fn is_free(&self) -> Result<bool> {
        match self.conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;") {
            Ok(()) => Ok(true),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The floor a durable step is measured against (`switchboard bench steps`, SPEC §11): `n` single-row
/// transactions (`BEGIN IMMEDIATE`, one insert, `COMMIT`) on a fresh database at `path` in WAL mode with
/// `synchronous` — raw SQLite, no actor, no schema of ours. Answers each commit's latency. Here because
/// only this crate opens database connections (SPEC §1.2).
pub fn raw_commit_latencies(
    path: &Path,
    synchronous: Synchronous,
    n: usize,
) -> Result<Vec<Duration>> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(
        None,
        "synchronous",
        if synchronous == Synchronous::Full {
            "FULL"
        } else {
            "NORMAL"
        },
    )?;
    conn.execute_batch("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = std::time::Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        conn.execute(
            "INSERT INTO t (k, v) VALUES (?1, ?2)",
            rusqlite::params![i as i64, "step"],
        )?;
        conn.execute_batch("COMMIT")?;
        out.push(t.elapsed());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(conn: &Connection) -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    /// A method's transaction keeps what it committed and nothing of what it dropped, at the top and as
    /// a savepoint inside a group (whose other methods stay), with its control statements cached.
    #[test]
    fn a_transaction_keeps_its_commit_and_rolls_back_when_dropped_top_or_nested() {
        let mut s = SqliteStore::on(Connection::open_in_memory().unwrap());
        s.conn.execute_batch("CREATE TABLE t (k INTEGER)").unwrap();
        let insert = |tx: &Tx<'_>| tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
        for _ in 0..2 {
            let tx = s.immediate().unwrap();
            insert(&tx);
            tx.commit().unwrap();
            insert(&s.immediate().unwrap()); // dropped: rolled back
        }
        assert_eq!(count(&s.conn), 2);
        assert!(s.conn.is_autocommit(), "no transaction left open");

        assert!(s.begin_group().unwrap());
        let kept = s.immediate().unwrap();
        insert(&kept);
        kept.commit().unwrap();
        insert(&s.immediate().unwrap()); // dropped: only this savepoint rolls back
        let read = s.read().unwrap();
        assert_eq!(
            count(&read),
            3,
            "a read inside the group sees the group's writes"
        );
        drop(read);
        s.end_group(true).unwrap();
        assert_eq!(count(&s.conn), 3);
        assert!(s.conn.is_autocommit());
    }

    /// A multi-row insert writes every row of every chunk with its key, in order: a later row of a
    /// repeated key wins under `DO UPDATE`, as one statement a row would have it.
    #[test]
    fn insert_rows_writes_every_row_across_chunks_in_order() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (k TEXT, n INTEGER, v TEXT, PRIMARY KEY (k, n))")
            .unwrap();
        let n = 2 * ROWS_PER_INSERT + 3;
        let rows: Vec<(i64, String)> = (0..n as i64)
            .map(|i| (i, format!("v{i}")))
            .chain([(0, "again".to_string())])
            .collect();
        let refs: Vec<[&dyn rusqlite::ToSql; 2]> =
            rows.iter().map(|(i, v)| [i as _, v as _]).collect();
        let tail = "ON CONFLICT (k, n) DO UPDATE SET v = excluded.v";
        insert_rows(&conn, "INSERT INTO t (k, n, v)", tail, &"key", &refs).unwrap();
        let got: Vec<(String, i64, String)> = conn
            .prepare("SELECT k, n, v FROM t ORDER BY n")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(got.len(), n);
        assert!(got.iter().all(|(k, _, _)| k == "key"));
        assert_eq!(got[0].2, "again");
        assert_eq!(
            got[n - 1],
            ("key".to_string(), n as i64 - 1, format!("v{}", n - 1))
        );
        insert_rows::<2>(&conn, "INSERT INTO t (k, n, v)", tail, &"key", &[]).unwrap();
        assert_eq!(count(&conn), n as i64);
    }
}
