//! The PostgreSQL implementation of the storage traits (`storage.kind = "postgres"`, SPEC §1.3): many
//! hosts sharing one database.
//!
//! Owns one connection ([`Db`], `db.rs`: blocking calls over `tokio-postgres` on a runtime of its own,
//! its prepared statements, and pipelining — a `BEGIN` and the writes whose count nobody reads share
//! the next statement's round trip). Exactly one `PgStore` per process writes, inside the storage
//! actor's thread ([`crate::actor`]); a blocking connection fits that thread as `rusqlite` does — the
//! actor is a plain OS thread that runs one transaction at a time. Migrations, the news listener and
//! the test hooks use the synchronous `postgres::Client`. The handle's reads go to `pool` reader connections ([`PgStore::open_reader`],
//! [`crate::readers`]; `pool` of [`crate::BackendSpec::Postgres`]), or to the actor when it is 0.
//!
//! Every decision is the shared pure code ([`crate::ledger::decisions`], [`crate::plan`], the record
//! contract); this module is I/O only and mirrors `sqlite/` method by method.
//!
//! # Design: races across hosts
//! Every writing method is one `SERIALIZABLE` transaction that reads the rows it decides on, asks the
//! decisions what to do and writes the answer — so two hosts cannot both win a row: PostgreSQL aborts
//! one of two conflicting transactions with a serialization failure (`40001`), and a concurrent insert
//! of the same key fails with a unique violation (`23505`). Those, and deadlocks (`40P01`), are races
//! ([`Error::is_race`]): a transaction that is not part of a group is run again from the start after a
//! jittered pause whose ceiling starts at [`RACE_PAUSE_FIRST`] and doubles, for up to [`RACE_BUDGET`];
//! what is still a race after that is a transient error ([`Error::is_transient`]), never a refusal. A
//! lock or statement timeout is not a race: it answers at once, as before. Reads are `REPEATABLE READ
//! READ ONLY`: one snapshot, never aborted.
//!
//! Every connection sets `lock_timeout` and `statement_timeout` ([`LOCK_TIMEOUT`],
//! [`STATEMENT_TIMEOUT`]): a paused peer holding a lock becomes a transient error, not a hang.
//!
//! # Design: group commit
//! [`PgStore::begin_group`] is one `BEGIN ISOLATION LEVEL SERIALIZABLE`, the methods inside it run
//! as they come, [`PgStore::end_group`] is one `COMMIT`. Unlike SQLite there is no `SAVEPOINT` per
//! method: each costs two round trips (a `SAVEPOINT` and its `RELEASE`, a third of every statement a
//! run sent), and a method almost never fails. When one does (an `Err`, or an atomic unit that rolls
//! back) the group is *spoiled*: `end_group` rolls the whole transaction back and answers
//! [`Error::GroupRolledBack`], and the actor runs every message again as its own transaction
//! ([`crate::actor::Backend::rerun_alone`]) — where a failing method rolls back only itself, as before.
//! So what lands is what savepoints would have kept. The same happens when the `COMMIT` loses a race.
//!
//! # Layout
//! - `schema`: versioned migrations in a `schema_version` table;
//! - `live`: reads of `live_runs` and `deletion_fences` shared by both sides;
//! - `records`: the `runs` and `run_events` tables and the policy row of `meta`;
//! - `runs`: [`RunStore`](crate::store::RunStore) for [`PgStore`];
//! - `ledger`: [`RunLedger`](crate::ledger::RunLedger) for [`PgStore`], with `owner` (ownership checks)
//!   and `admission` (admission, promotion, reclaim);
//! - `db`: the connection, its prepared statements and pipelining ([`Db`]);
//! - `plan`: [`PlanStore`](crate::plan::PlanStore) for [`PgStore`];
//! - `news`: the writers' `pg_notify` and the listener thread of cross-host news ([`crate::news`]);
//! - `probe`: [`ActivityProbe`], whether a process holds a transaction open (for `chaos` pauses).
//!
//! JSON is stored as `text`, byte for byte what SQLite stores, so both answer identically; text
//! columns are `COLLATE "C"`, so every `ORDER BY` sorts by bytes as SQLite's `BINARY` does.

mod admission;
mod db;
mod facts;
mod ledger;
mod live;
pub(crate) mod news;
mod owner;
mod plan;
mod probe;
mod prune;
mod records;
mod runs;
pub mod schema;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

pub use probe::ActivityProbe;

use crate::news::Audience;

pub(crate) use db::Db;

use postgres::types::ToSql;
use postgres::{Client, NoTls};

use crate::{Error, Result};

/// How long a statement waits for a lock before failing (transient).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one statement may run before failing (transient). Longer than [`LOCK_TIMEOUT`], so a
/// statement stuck behind a peer's lock reports the lock.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a transaction outside a group keeps running again after lost races (its own runs and the
/// pauses between them) before a race answers as a transient error. A fixed small count ran out under
/// mild contention (9 of 11,416 admissions answered 503 with no fault injected); two seconds of backoff
/// ride out a burst of hosts colliding on one thread, and stay far inside a caller's patience.
pub const RACE_BUDGET: Duration = Duration::from_secs(2);

/// The ceiling of the first pause after a lost race; each later ceiling doubles, up to [`RACE_PAUSE_MAX`].
pub const RACE_PAUSE_FIRST: Duration = Duration::from_millis(2);

/// The largest ceiling of one pause: past it, contenders stop spreading out and only wait longer.
pub const RACE_PAUSE_MAX: Duration = Duration::from_millis(250);

pub struct PgStore {
    db: Db,
    /// Where `db` connects: what the test hooks open a connection of their own to.
    #[cfg_attr(not(any(test, feature = "test-hooks")), allow(dead_code))]
    url: String,
    /// The test hooks' own connection ([`PgStore::connection`]).
    #[cfg(any(test, feature = "test-hooks"))]
    raw: Option<Client>,
    /// Inside a group commit: each method runs in a `SAVEPOINT` of the group's one transaction.
    grouped: bool,
    /// Open atomic units, innermost last: `true` when the unit opened the group itself.
    atomic: Vec<bool>,
    /// Inside a group: a method failed or an atomic unit rolled back, so the group must not commit
    /// (its transaction holds that method's partial writes, or is aborted).
    spoiled: bool,
    /// Writing methods that committed (or, inside a group, released their savepoint) on this
    /// connection ([`PgStore::writes`]).
    writes: u64,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("grouped", &self.grouped)
            .finish()
    }
}

/// [`Params`] of owned values, in order: `params![a, b]` (for [`Db::execute_later`]).
macro_rules! params {
    ($($v:expr),* $(,)?) => {{
        let mut p = $crate::postgres::Params::default();
        $( p.push($v); )*
        p
    }};
}
pub(crate) use params;

/// Parameters of one statement built at run time, numbered `$1, $2, …` in push order.
#[derive(Default)]
pub(crate) struct Params(Vec<Box<dyn ToSql + Sync + Send>>);

impl Params {
    /// Bind `v`; answers its placeholder.
    pub(crate) fn push(&mut self, v: impl ToSql + Sync + Send + 'static) -> String {
        self.0.push(Box::new(v));
        format!("${}", self.0.len())
    }

    pub(crate) fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.0.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect()
    }
}

/// An open transaction or savepoint on `client`, rolled back when dropped unfinished — also while a
/// panicking body unwinds, so a savepoint never commits half a message.
struct Open<'c> {
    client: &'c mut Db,
    rollback: Option<&'static str>,
}

impl<'c> Open<'c> {
    fn begin(client: &'c mut Db, begin: &'static str, rollback: &'static str) -> Result<Self> {
        client.begin(begin);
        Ok(Open {
            client,
            rollback: Some(rollback),
        })
    }

    fn finish(mut self, sql: &str) -> Result<()> {
        self.rollback = None;
        Ok(self.client.batch_execute(sql)?)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if let Some(sql) = self.rollback.take() {
            let _ = self.client.batch_execute(sql);
        }
    }
}

const BEGIN_WRITE: &str = "BEGIN ISOLATION LEVEL SERIALIZABLE";
const BEGIN_READ: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

impl PgStore {
    /// Connect to `url` (`postgres://user@host:port/db`), set the session's timeouts, create or
    /// migrate the schema (a newer one is refused by name, [`Error::SchemaTooNew`]).
    pub fn open(url: &str) -> Result<Self> {
        Self::open_for(url, Default::default())
    }

    /// [`PgStore::open`] for a process whose news listener keeps `audience`: a commit nobody else
    /// hears sends no notes ([`crate::news::Audience`]).
    pub fn open_for(url: &str, audience: Arc<Audience>) -> Result<Self> {
        schema::migrate(&mut connect(url)?)?;
        let mut db = Db::connect(url, audience)?;
        db.implicit_transactions()?;
        Ok(PgStore {
            db,
            url: url.to_owned(),
            #[cfg(any(test, feature = "test-hooks"))]
            raw: None,
            grouped: false,
            atomic: Vec::new(),
            spoiled: false,
            writes: 0,
        })
    }

    /// A read-only connection for the handle's readers ([`crate::readers`]) on a database this build's
    /// writer has already migrated: never migrates, refuses another schema version (its reads then go
    /// through the storage actor), and sets `default_transaction_read_only`, so a write method answers
    /// an error and changes nothing.
    pub fn open_reader(url: &str) -> Result<Self> {
        let found = schema::version(&mut connect(url)?)?;
        let supported = schema::current_version();
        if found != supported {
            return Err(Error::Unavailable(format!(
                "the database is at schema version {found}, this build reads {supported}"
            )));
        }
        let mut db = Db::connect(url, Default::default())?;
        db.batch_execute("SET default_transaction_read_only = on")?;
        Ok(PgStore {
            db,
            url: url.to_owned(),
            #[cfg(any(test, feature = "test-hooks"))]
            raw: None,
            grouped: false,
            atomic: Vec::new(),
            spoiled: false,
            writes: 0,
        })
    }

    /// The schema version in the database.
    pub fn schema_version(&mut self) -> Result<i64> {
        self.read_one(|c| {
            let exists: bool = c
                .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])?
                .get(0);
            if !exists {
                return Ok(0);
            }
            Ok(c.query_opt("SELECT version FROM schema_version", &[])?
                .map_or(0, |r| r.get(0)))
        })
    }

    /// The client, for this crate's tests (the `test-hooks` feature): nothing outside the storage crate
    /// runs SQL of its own (SPEC §1.2).
    ///
    /// A connection of its own to the same database (the store's own is pipelined, [`Db`]): what
    /// runs there is not part of a transaction the store holds open.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn connection(&mut self) -> &mut Client {
        if self.raw.as_ref().is_none_or(Client::is_closed) {
            self.raw = Some(connect(&self.url).expect("the test hooks' connection"));
        }
        self.raw.as_mut().expect("just opened")
    }

    /// The 32-byte capability secret created at the first migration (hex).
    pub fn capability_secret(&mut self) -> Result<String> {
        self.read(|c| {
            Ok(c.query_one(
                "SELECT value FROM meta WHERE key = 'capability_secret'",
                &[],
            )?
            .get(0))
        })
    }

    /// Run `body` as one writing transaction: `SERIALIZABLE` on its own, run again after a lost race;
    /// a savepoint inside a group (no retry there: the group's transaction is the one that lost). An
    /// `Ok` commits (a refusal decided before any write commits nothing), an `Err` rolls back.
    fn write<R>(&mut self, body: impl FnMut(&mut Db) -> Result<R>) -> Result<R> {
        let out = self.write_retried(body);
        if out.is_ok() {
            self.writes += 1;
        }
        out
    }

    /// [`PgStore::write`] without the count.
    fn write_retried<R>(&mut self, mut body: impl FnMut(&mut Db) -> Result<R>) -> Result<R> {
        if self.grouped {
            return self.in_group(body);
        }
        let started = std::time::Instant::now();
        let mut attempt = 0;
        loop {
            let out: Result<R> = (|| {
                let tx = Open::begin(&mut self.db, BEGIN_WRITE, "ROLLBACK")?;
                tx.client.own_transaction();
                let v = body(tx.client)?;
                tx.finish("COMMIT")?;
                Ok(v)
            })();
            match out {
                Err(e) if e.is_race() => {
                    let pause = race_pause(attempt);
                    if started.elapsed() + pause > RACE_BUDGET {
                        return Err(e);
                    }
                    std::thread::sleep(pause);
                    attempt += 1;
                }
                out => return out,
            }
        }
    }

    /// How many writing methods committed on this connection (inside a group: released their savepoint;
    /// the group's `COMMIT` is the actor's to check): it grows when a method that may write succeeded
    /// ([`crate::actor::Backend::writes`]). A refusal decided before any write counts too: PostgreSQL
    /// gives no cheap way to tell, and a disk full enough to fail `53100` fails the next real write again.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Run `body` as one read: a `REPEATABLE READ READ ONLY` transaction, or a savepoint inside a group
    /// (which sees the group's writes).
    fn read<R>(&mut self, body: impl FnOnce(&mut Db) -> Result<R>) -> Result<R> {
        if self.grouped {
            return self.in_group(body);
        }
        let tx = Open::begin(&mut self.db, BEGIN_READ, "ROLLBACK")?;
        let v = body(tx.client)?;
        tx.finish("COMMIT")?;
        Ok(v)
    }

    /// One method inside a group: it runs in the group's transaction; an `Err` (or a panic) spoils
    /// the group, so nothing of it commits.
    fn in_group<R>(&mut self, body: impl FnOnce(&mut Db) -> Result<R>) -> Result<R> {
        // Spoiled until it answers, so a panicking body spoils it too.
        let before = std::mem::replace(&mut self.spoiled, true);
        let out = body(&mut self.db);
        self.spoiled = before || out.is_err();
        out
    }

    /// Run `body`, which sends exactly one statement, as one read: outside a group without a
    /// transaction (one statement sees one snapshot of its own), one round trip instead of three.
    fn read_one<R>(&mut self, body: impl FnOnce(&mut Db) -> Result<R>) -> Result<R> {
        if self.grouped {
            return self.in_group(body);
        }
        body(&mut self.db)
    }

    /// Start a group commit: one `SERIALIZABLE` transaction the next methods run in. Answers `false`
    /// (and starts nothing) when a group is already open.
    pub fn begin_group(&mut self) -> Result<bool> {
        if self.grouped {
            return Ok(false);
        }
        self.db.begin(BEGIN_WRITE);
        self.grouped = true;
        self.spoiled = false;
        Ok(true)
    }

    /// End a group of messages: `COMMIT` (or `ROLLBACK` when `commit` is false). A spoiled group rolls
    /// back and answers [`Error::GroupRolledBack`] instead of committing. So does a `COMMIT` the server
    /// refused for another reason than a race: a write a message left to go out with it
    /// ([`Db::execute_later`]) failed there, and which message's it was is not known — each runs again
    /// alone, where its own commit tells. A failed `COMMIT` leaves no transaction open.
    pub fn end_group(&mut self, commit: bool) -> Result<()> {
        match self.close_group(commit) {
            Err(e)
                if commit
                    && !e.is_race()
                    && matches!(e, Error::Postgres(_))
                    && !e.poisons_connection() =>
            {
                tracing::debug!(error = %e, "a group's commit failed; its messages run again alone");
                Err(Error::GroupRolledBack(
                    "a write of the group failed at its commit",
                ))
            }
            out => out,
        }
    }

    /// [`PgStore::end_group`] answering the server's own error (an atomic unit's group: one message).
    fn close_group(&mut self, commit: bool) -> Result<()> {
        self.grouped = false;
        let spoiled = std::mem::take(&mut self.spoiled);
        let done = self.db.batch_execute(if commit && !spoiled {
            "COMMIT"
        } else {
            "ROLLBACK"
        });
        if done.is_err() && !self.db.is_closed() {
            let _ = self.db.batch_execute("ROLLBACK");
        }
        done?;
        if commit && spoiled {
            return Err(Error::GroupRolledBack(
                "a message of the group failed or rolled back",
            ));
        }
        Ok(())
    }

    /// Start an atomic unit of several methods: part of the open group, else a group of its own.
    pub fn begin_atomic(&mut self) -> Result<()> {
        let opened = self.begin_group()?;
        self.atomic.push(opened);
        Ok(())
    }

    /// End the innermost atomic unit: end its group, or — inside a group it did not open — spoil
    /// that group when the unit rolls back (its writes cannot be undone alone).
    pub fn end_atomic(&mut self, commit: bool) -> Result<()> {
        match self.atomic.pop() {
            Some(true) => self.close_group(commit),
            Some(false) => {
                self.spoiled |= !commit;
                Ok(())
            }
            None => Ok(()),
        }
    }
}

/// The pause before running a transaction that lost a race again (`attempt` 0 is the first): full
/// jitter under a ceiling that starts at [`RACE_PAUSE_FIRST`] and doubles up to [`RACE_PAUSE_MAX`], so
/// hosts that collided do not collide again in lockstep and a long contention backs off.
fn race_pause(attempt: u32) -> Duration {
    let ceiling = RACE_PAUSE_FIRST
        .saturating_mul(1 << attempt.min(16))
        .min(RACE_PAUSE_MAX);
    Duration::from_micros(rand::random_range(
        1_000..=ceiling.as_micros().max(1_000) as u64,
    ))
}

/// Connect a synchronous client (migrations, the clock) and set the session.
fn connect(url: &str) -> Result<Client> {
    connect_as(url, &application_name(std::process::id()))
}

/// [`connect`] with the connection named `name` (the news listener's is [`news::LISTENER_NAME`]).
fn connect_as(url: &str, name: &str) -> Result<Client> {
    let mut config = postgres::Config::from_str(url)?;
    config.connect_timeout(CONNECT_TIMEOUT);
    config.application_name(name);
    let mut client = config.connect(NoTls)?;
    client.batch_execute(&session_settings())?;
    Ok(client)
}

/// What every connection sets: timeouts (SPEC §1.3), UTC, and how statements are planned.
///
/// Every statement this product sends finds its rows through an index, and each is prepared once per
/// connection ([`Db`]), so it is planned once — a *generic* plan — and the plan lasts until the
/// table's statistics change. The planner costs a table from its statistics: `live_runs` (a few rows,
/// each written and deleted within a run) and any table of a fresh database look empty to it, and for
/// an empty table a sequential scan costs nothing. Such a plan then read every page of the table,
/// dead versions included, on every call, for as long as the connection lived (issue 29: the per-run
/// ownership checks read all of `live_runs`' ~800 pages, and the put's existing-row lookup all of
/// `runs`, so a run's cost grew with the store). So sequential scans are for tables without a usable
/// index only (`enable_seqscan = off` prices them out, it does not forbid them), and the generic plan
/// is used from the first call (`plan_cache_mode`: no custom plan made, and paid for, per call).
fn session_settings() -> String {
    format!(
        "SET lock_timeout = {}; SET statement_timeout = {}; SET idle_in_transaction_session_timeout = {}; SET TIME ZONE 'UTC'; \
         SET enable_seqscan = off; SET plan_cache_mode = force_generic_plan",
        LOCK_TIMEOUT.as_millis(),
        STATEMENT_TIMEOUT.as_millis(),
        // A transaction left open by a stalled process stops holding its locks.
        STATEMENT_TIMEOUT.as_millis() * 4,
    )
}

/// The name every connection of process `pid` carries (`switchboard/<pid>`), so `pg_stat_activity` tells
/// which process holds what ([`ActivityProbe`]).
fn application_name(pid: u32) -> String {
    format!("switchboard/{pid}")
}

/// Milliseconds the database's clock (`now()`) is ahead of `local_ms` — what a [`crate::clock::DbClock`]
/// adds to the host's clock. Measured as the midpoint of one round trip.
pub fn clock_offset_ms(url: &str, local_ms: impl Fn() -> i64) -> Result<i64> {
    let mut client = connect(url)?;
    let before = local_ms();
    let db: f64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8",
            &[],
        )?
        .get(0);
    let after = local_ms();
    Ok(db.round() as i64 - (before + (after - before) / 2))
}

/// `url` with its password (if any) replaced by `***`, for logs and `Debug` output: the URL form
/// (`postgres://user:secret@host/db`) and a `password=` query or key-value parameter alike.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest = scheme_end + 3;
        let authority_end = out[rest..].find(['/', '?']).map_or(out.len(), |i| rest + i);
        if let Some(at) = out[rest..authority_end].rfind('@') {
            let userinfo = &out[rest..rest + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest + colon + 1..rest + at, "***");
            }
        }
    }
    let lower = out.to_ascii_lowercase();
    if let Some(i) = lower.find("password=") {
        let start = i + "password=".len();
        let end = out[start..]
            .find(['&', ' '])
            .map_or(out.len(), |j| start + j);
        out.replace_range(start..end, "***");
    }
    out
}

/// Clamp a count or limit to what a `BIGINT` parameter holds.
pub(crate) fn big(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// The error for a value a column cannot hold (a `u64` past `i64::MAX`).
pub(crate) fn too_big(what: &'static str, n: u64) -> Error {
    Error::corrupt(what, format!("{n} is past i64::MAX"))
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn passwords_are_redacted_and_the_rest_is_kept() {
        assert_eq!(
            redact_url("postgres://sb:hunter2@db:5432/x"),
            "postgres://sb:***@db:5432/x"
        );
        assert_eq!(
            redact_url("postgres://sb:p%40ss@w@db/x"),
            "postgres://sb:***@db/x"
        );
        assert_eq!(redact_url("postgres://sb@db/x"), "postgres://sb@db/x");
        assert_eq!(
            redact_url("postgresql://db/x?user=sb&password=hunter2&sslmode=off"),
            "postgresql://db/x?user=sb&password=***&sslmode=off"
        );
        assert_eq!(
            redact_url("host=db password=hunter2 user=sb"),
            "host=db password=*** user=sb"
        );
    }
}

#[cfg(test)]
mod session_tests {
    use super::*;

    /// A write whose one statement is its whole transaction runs it alone — still `SERIALIZABLE`, and
    /// committed when it answers; an explicit transaction keeps its `BEGIN`'s isolation.
    #[test]
    fn a_lone_statement_is_a_serializable_transaction_of_its_own() {
        let mut store = PgStore::open(&crate::testing::pg::database()).expect("open");
        let isolation: String = store
            .write(|db| {
                let row = db.query_one_committing(
                    "WITH w AS (INSERT INTO meta (key, value) VALUES ('t', 'v') RETURNING 1)
                     SELECT current_setting('transaction_isolation') FROM w",
                    &[],
                )?;
                Ok(row.get(0))
            })
            .expect("write");
        assert_eq!(isolation, "serializable");
        let mut other = PgStore::open_reader(&store.url).expect("reader");
        let value: Option<String> = other
            .read(|db| {
                Ok(db
                    .query_opt("SELECT value FROM meta WHERE key = 't'", &[])?
                    .map(|r| r.get(0)))
            })
            .expect("read");
        assert_eq!(value.as_deref(), Some("v"), "committed");
        // Two statements: an explicit transaction, as its `BEGIN` says.
        let isolation: String = store
            .write(|db| {
                db.execute("UPDATE meta SET value = 'w' WHERE key = 't'", &[])?;
                Ok(db
                    .query_one_committing("SELECT current_setting('transaction_isolation')", &[])?
                    .get(0))
            })
            .expect("write");
        assert_eq!(isolation, "serializable");
    }

    /// A keyed statement on an empty table (as `live_runs` nearly always is) is planned once, as a
    /// generic plan, and that plan reads the table through its index: no sequential scan whose cost
    /// grows with the table's dead rows for the connection's lifetime.
    #[test]
    fn a_prepared_lookup_of_an_empty_table_is_a_generic_index_plan() {
        let mut store = PgStore::open(&crate::testing::pg::database()).expect("open");
        store
            .read(|db| {
                let live: i64 = db.query_one("SELECT COUNT(*) FROM live_runs", &[])?.get(0);
                assert_eq!(live, 0);
                db.execute(
                    "PREPARE owned(text, text) AS SELECT 1 FROM live_runs WHERE run_id = $1 AND owner_gen = $2",
                    &[],
                )?;
                let plan = db.explain("EXECUTE owned('r1', 'g1')", &[])?;
                // Either index finds the one row: both columns are in its condition.
                assert!(plan.contains("Index Cond: ((owner_gen = $2) AND (run_id = $1))")
                    || plan.contains("Index Cond: (run_id = $1)") && !plan.contains("Filter: (run_id"),
                    "{plan}");
                assert!(!plan.contains("Seq Scan"), "{plan}");
                assert!(plan.contains("$1"), "a generic plan names its parameters: {plan}");
                db.execute("DEALLOCATE owned", &[])?;
                Ok(())
            })
            .expect("explain");
    }
}

#[cfg(test)]
mod race_budget_tests {
    use super::*;

    /// A lost race, raised by the server itself (SQLSTATE `40001`).
    const LOSE: &str =
        "DO $$ BEGIN RAISE EXCEPTION 'lost' USING ERRCODE = 'serialization_failure'; END $$";

    #[test]
    fn pauses_start_short_double_and_stay_under_the_ceiling() {
        for attempt in 0..40 {
            let ceiling = (RACE_PAUSE_FIRST * 2u32.pow(attempt.min(16)))
                .min(RACE_PAUSE_MAX)
                .max(Duration::from_millis(1));
            for _ in 0..20 {
                let p = race_pause(attempt);
                assert!(
                    p >= Duration::from_millis(1) && p <= ceiling,
                    "attempt {attempt}: {p:?} over {ceiling:?}"
                );
            }
        }
    }

    /// Mild contention: a transaction that loses a dozen races in a row (more than a fixed count of 8
    /// retries allowed) still commits inside the budget, run again each time from the start.
    #[test]
    fn a_transaction_losing_a_dozen_races_still_commits() {
        let mut store = PgStore::open(&crate::testing::pg::database()).expect("open");
        let mut runs = 0;
        let out = store.write(|db| {
            runs += 1;
            if runs <= 12 {
                db.execute(LOSE, &[])?;
            }
            Ok(runs)
        });
        assert_eq!(out.expect("committed after its lost races"), 13);
    }

    /// A race that never ends answers a transient error once the budget is spent — not sooner, not
    /// much later.
    #[test]
    fn a_race_that_never_ends_is_transient_after_the_budget() {
        let mut store = PgStore::open(&crate::testing::pg::database()).expect("open");
        let started = std::time::Instant::now();
        let e = store
            .write(|db| db.execute(LOSE, &[]))
            .expect_err("always loses");
        let took = started.elapsed();
        assert!(e.is_race() && e.is_transient(), "{e}");
        assert!(
            took >= RACE_BUDGET - RACE_PAUSE_MAX && took <= RACE_BUDGET + Duration::from_secs(1),
            "{took:?}"
        );
    }
}
