//! `Db`: the storage thread's (or a reader's) one connection to PostgreSQL, the statements prepared on
//! it, and pipelining.
//!
//! The connection is `tokio-postgres` driven by a small runtime of its own on the calling thread —
//! what the synchronous `postgres` client is inside — so a call still blocks its thread until answered.
//! What it adds is *pipelining*: what nobody reads the answer of — a transaction's `BEGIN`, and writes
//! whose row count nothing reads ([`Db::execute_later`]) — waits, and goes out in order with the next
//! statement whose answer is needed (or the `COMMIT`), all in one round trip. The server runs them in
//! the order sent, so the answered statement sees them; the first one that failed is the answer (the
//! transaction is then aborted, and so is everything after it). A connection's round trip is what a
//! run's storage costs on PostgreSQL (issue 29), not the server's work.
//!
//! Each statement text is parsed once per connection, and every later run of it is one message
//! (prepared statements outlive transactions and rollbacks).
//!
//! It also keeps two facts of the open transaction, both forgotten at its end (every `BEGIN`,
//! `COMMIT` and `ROLLBACK` goes through [`Db::begin`] or [`Db::batch_execute`]):
//! - `notes`: the cross-host news it sends ([`super::news::notify`]); they go out in the same round
//!   trip as its `COMMIT` — unless nobody else listens ([`Audience`]) — and PostgreSQL delivers notes
//!   only on commit anyway;
//! - `owner`: the run and generation an ownership check passed for. A `SERIALIZABLE` transaction reads
//!   one snapshot, so the same check answers the same until the transaction itself changes what it
//!   reads — a fence, a live row's existence or its `owner_gen` — and any statement that may forgets it.

use crate::news::Audience;
use crate::RunId;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use postgres::types::ToSql;
use postgres::{NoTls, Row, Statement};

use super::facts::PutFacts;
use super::{application_name, session_settings, Params, CONNECT_TIMEOUT};
use crate::{Error, Result};

/// Distinct statement texts a connection keeps prepared; past it the cache starts over (list queries
/// are built from their filters, so their texts are not a fixed set).
const MAX_STATEMENTS: usize = 256;

type PgResult<T> = std::result::Result<T, postgres::Error>;

/// What waits to go out with the next answered statement.
enum Later {
    /// A simple statement (a transaction's `BEGIN`).
    Simple(&'static str),
    /// A prepared write whose row count nobody reads.
    Write(Statement, Params),
}

impl Later {
    fn send<'a>(
        &'a self,
        client: &'a tokio_postgres::Client,
    ) -> Pin<Box<dyn Future<Output = PgResult<()>> + 'a>> {
        match self {
            Later::Simple(sql) => Box::pin(client.batch_execute(sql)),
            Later::Write(st, params) => Box::pin(async move {
                let refs = params.refs();
                client.execute(st, &refs).await.map(|_| ())
            }),
        }
    }

    fn is_begin(&self) -> bool {
        matches!(self, Later::Simple(_))
    }
}

/// A request whose answer is read: what waits goes out first, in the same round trip
/// ([`Db::answered`]). `answered!(query, Vec<Row>)` is `Db::query`, after the client's method.
macro_rules! answered {
    ($method:ident, $out:ty) => {
        pub(crate) fn $method(
            &mut self,
            sql: &str,
            params: &[&(dyn ToSql + Sync)],
        ) -> Result<$out> {
            self.wrote(sql);
            let st = self.statement(sql)?;
            let later = std::mem::take(&mut self.later);
            let out = Self::answered(
                &self.rt,
                &self.client,
                later,
                self.client.$method(&st, params),
            );
            self.checked(out)
        }
    };
}

pub(crate) struct Db {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    statements: HashMap<String, Statement>,
    later: Vec<Later>,
    notes: Vec<String>,
    /// Whether a `COMMIT` sends its notes.
    audience: Arc<Audience>,
    owner: Option<(RunId, String)>,
    /// A put's facts read ahead in the open transaction ([`Db::read_ahead`]).
    ahead: Option<(RunId, PutFacts)>,
    /// A transaction is open: [`Db::begin`] ran and no `COMMIT` or `ROLLBACK` since.
    open: bool,
    /// A statement outside a transaction runs at the isolation of [`Db::begin`]'s writes
    /// ([`Db::implicit_transactions`]).
    implicit: bool,
    /// The open transaction is one write's own (not a group's), so its last answered statement may
    /// carry its `COMMIT` ([`Db::query_one_committing`]).
    own: bool,
}

impl Db {
    /// Connect to `url` and set the session ([`session_settings`]); a `COMMIT` asks `audience` whether
    /// to send its notes.
    pub(super) fn connect(url: &str, audience: Arc<Audience>) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                Error::Unavailable(format!("no runtime for the PostgreSQL connection: {e}"))
            })?;
        let mut config = tokio_postgres::Config::from_str(url)?;
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name(application_name(std::process::id()));
        let (client, connection) = rt.block_on(config.connect(NoTls))?;
        // Driven whenever this thread waits on the runtime, as the synchronous client does.
        rt.spawn(async move {
            let _ = connection.await;
        });
        let mut db = Db {
            rt,
            client,
            statements: HashMap::new(),
            later: Vec::new(),
            notes: Vec::new(),
            audience,
            owner: None,
            ahead: None,
            open: false,
            implicit: false,
            own: false,
        };
        db.batch_execute(&session_settings())?;
        Ok(db)
    }

    fn statement(&mut self, sql: &str) -> Result<Statement> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        if self.statements.len() >= MAX_STATEMENTS {
            self.statements.clear();
        }
        let s = self.rt.block_on(self.client.prepare(sql));
        let s = self.checked(s)?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    /// Forget the prepared statements when the server says one went stale (a schema another host
    /// changed under them: `0A000` "cached plan must not change result type", `26000`).
    fn checked<T>(&mut self, out: PgResult<T>) -> Result<T> {
        if let Err(e) = &out {
            if e.code()
                .is_some_and(|c| matches!(c.code(), "0A000" | "26000"))
            {
                self.statements.clear();
            }
        }
        Ok(out?)
    }

    /// Send what waits, then `next` (a request of this connection's client, not yet polled), in one
    /// round trip; answer `next`'s answer — or the first failure of what waited.
    fn answered<T>(
        rt: &tokio::runtime::Runtime,
        client: &tokio_postgres::Client,
        later: Vec<Later>,
        next: impl Future<Output = PgResult<T>>,
    ) -> PgResult<T> {
        rt.block_on(async move {
            // `join` polls in order, and each request leaves on its first poll: the server gets them
            // in the order they were made.
            let waiting = async {
                let mut out = Ok(());
                for sent in
                    futures_util::future::join_all(later.iter().map(|l| l.send(client))).await
                {
                    if out.is_ok() {
                        out = sent;
                    }
                }
                out
            };
            let (waited, answer) = tokio::join!(waiting, next);
            waited?;
            answer
        })
    }

    /// Forget the owner check when `sql` may change what it answered: a write of `deletion_fences`,
    /// or one of `live_runs` that adds or removes rows or names `owner_gen` (a row's state, phase,
    /// stop or lease is not what the check reads).
    fn wrote(&mut self, sql: &str) {
        if self.owner.is_some()
            && !sql.trim_start().starts_with("SELECT")
            && (sql.contains("deletion_fences")
                || sql.contains("INSERT INTO live_runs")
                || sql.contains("DELETE FROM live_runs")
                || (sql.contains("live_runs") && sql.contains("owner_gen")))
        {
            self.owner = None;
        }
    }

    /// Whether an ownership check of `run_id` by `gen` already passed in the open transaction.
    pub(crate) fn owner_known(&self, run_id: &RunId, gen: &str) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|(r, g)| r == run_id && g == gen)
    }

    /// Remember that `gen` owns `run_id` for the rest of the open transaction.
    pub(crate) fn owner_passed(&mut self, run_id: &RunId, gen: &str) {
        self.owner = Some((run_id.to_owned(), gen.to_owned()));
    }

    /// Keep `facts` for a put of `run_id` later in the open transaction (a seal's finish): the caller
    /// answers for it that nothing written between changes them but what the put's caller corrects.
    pub(super) fn read_ahead(&mut self, run_id: &RunId, facts: PutFacts) {
        self.ahead = Some((run_id.to_owned(), facts));
    }

    /// The facts read ahead in the open transaction for a put of `run_id` counting stale rows for
    /// `guess`, once.
    pub(super) fn take_ahead(&mut self, run_id: &RunId, guess: i64) -> Option<PutFacts> {
        match self.ahead.take() {
            Some((r, facts)) if r == *run_id && facts.guess == guess => Some(facts),
            _ => None,
        }
    }

    /// Forget what was known of the open transaction (it begins or ends).
    fn forget(&mut self) {
        self.owner = None;
        self.ahead = None;
    }

    /// Queue a note to every listener, sent with the open transaction's `COMMIT`.
    pub(crate) fn note(&mut self, payload: String) {
        self.notes.push(payload);
    }

    answered!(query, Vec<Row>);
    answered!(query_one, Row);
    answered!(query_opt, Option<Row>);
    answered!(execute, u64);

    /// Mark the open transaction as one write's own: nothing else runs in it after its body, so
    /// [`Db::query_one_committing`] may end it.
    pub(super) fn own_transaction(&mut self) {
        self.own = self.open;
    }

    /// [`Db::query_one`] for a write's last answered statement: in a transaction of its own, what
    /// waits, the statement, the transaction's notes and its `COMMIT` go out in one round trip, and
    /// the transaction has ended when this answers (a later `COMMIT` or `ROLLBACK` sends nothing). So
    /// the caller commits whatever the answer says: every write of the transaction must be one it
    /// keeps either way (a write conditional on the ownership the statement checks, which then wrote
    /// nothing). Answers the first failure — the statement's, a note's or the `COMMIT`'s (a lost race
    /// there too) — after rolling the transaction back; inside a group it is [`Db::query_one`].
    pub(crate) fn query_one_committing(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row> {
        if !(self.open && self.own) {
            return self.query_one(sql, params);
        }
        self.wrote(sql);
        let st = self.statement(sql)?;
        let heard = self.audience.commit();
        let silent = !heard.heard || self.notes.is_empty();
        if self.implicit && silent && self.only_begun() {
            // The statement is the whole transaction and nothing is said of it: it goes alone, as a
            // transaction of its own (`implicit`: this session's default is the `BEGIN`'s isolation),
            // one request instead of three — the `BEGIN`, the statement and the `COMMIT` each cost the
            // server a flush and this thread a wake-up.
            self.later.clear();
            self.notes.clear();
            self.open = false;
            (self.owner, self.ahead) = (None, None);
            let out = self.rt.block_on(self.client.query_one(&st, params));
            drop(heard);
            return self.checked(out);
        }
        let later = std::mem::take(&mut self.later);
        let commit = commit_batch(&std::mem::take(&mut self.notes), heard.heard);
        self.open = false;
        (self.owner, self.ahead) = (None, None);
        let client = &self.client;
        let out = Self::answered(&self.rt, client, later, async {
            // The `COMMIT` leaves after the statement, on the same poll; in an aborted transaction
            // (the statement failed) it rolls back instead, or a failed note leaves it open.
            let (row, end) =
                tokio::join!(client.query_one(&st, params), client.batch_execute(&commit));
            let row = row?;
            end?;
            Ok(row)
        });
        drop(heard);
        if out.is_err() && !self.client.is_closed() {
            let _ = self.rt.block_on(self.client.batch_execute("ROLLBACK"));
        }
        self.checked(out)
    }

    /// A write whose row count nobody reads: it goes out with the next answered statement or the
    /// `COMMIT` (only inside a transaction; a failure answers there).
    pub(crate) fn execute_later(&mut self, sql: &str, params: Params) -> Result<()> {
        debug_assert!(self.open, "execute_later outside a transaction: {sql}");
        self.wrote(sql);
        let st = self.statement(sql)?;
        self.later.push(Later::Write(st, params));
        Ok(())
    }

    /// Make a statement sent outside a transaction a `SERIALIZABLE` transaction of its own, as
    /// `BEGIN ISOLATION LEVEL SERIALIZABLE` would: then a write's lone statement needs no `BEGIN` and
    /// no `COMMIT` ([`Db::query_one_committing`]). For the writer's connection.
    pub(super) fn implicit_transactions(&mut self) -> Result<()> {
        self.batch_execute("SET default_transaction_isolation = 'serializable'")?;
        self.implicit = true;
        Ok(())
    }

    /// Whether the open transaction has sent and queued nothing but its serializable `BEGIN`.
    fn only_begun(&self) -> bool {
        matches!(self.later.as_slice(), [Later::Simple(sql)] if *sql == super::BEGIN_WRITE)
    }

    /// Begin a transaction with `sql`; the `BEGIN` goes out with the first statement.
    pub(super) fn begin(&mut self, sql: &'static str) {
        self.open = true;
        self.own = false;
        self.forget();
        self.notes.clear();
        self.later.clear();
        self.later.push(Later::Simple(sql));
    }

    /// Run simple statements: a transaction's `COMMIT` or `ROLLBACK` (which ends what [`Db`] keeps of
    /// it), or the session's settings. A `COMMIT` carries what waits and the transaction's notes in the
    /// same round trip (nothing at all when the transaction sent nothing); when it fails, the
    /// transaction is rolled back. A `ROLLBACK` of a transaction whose `BEGIN` never left sends nothing.
    pub(super) fn batch_execute(&mut self, sql: &str) -> PgResult<()> {
        self.forget();
        let ends = sql == "COMMIT" || sql.starts_with("ROLLBACK");
        if ends && !std::mem::replace(&mut self.open, false) {
            // Already ended: committed with its last statement ([`Db::query_one_committing`]).
            self.later.clear();
            self.notes.clear();
            return Ok(());
        }
        let notes = std::mem::take(&mut self.notes);
        if sql.starts_with("ROLLBACK") {
            let unsent = self.later.first().is_some_and(Later::is_begin);
            self.later.clear();
            if unsent {
                return Ok(());
            }
            return self.rt.block_on(self.client.batch_execute(sql));
        }
        if sql == "COMMIT" && notes.is_empty() && self.later.len() == 1 && self.later[0].is_begin()
        {
            self.later.clear();
            return Ok(());
        }
        let heard = (sql == "COMMIT").then(|| self.audience.commit());
        let batch = match &heard {
            Some(heard) => commit_batch(&notes, heard.heard),
            None => sql.to_owned(),
        };
        let later = std::mem::take(&mut self.later);
        let done = Self::answered(
            &self.rt,
            &self.client,
            later,
            self.client.batch_execute(&batch),
        );
        drop(heard);
        if done.is_err() && sql == "COMMIT" && !self.client.is_closed() {
            let _ = self.rt.block_on(self.client.batch_execute("ROLLBACK"));
        }
        done
    }

    pub(super) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The server's plan of `sql`, one line a step (tests).
    #[cfg(test)]
    pub(super) fn explain(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<String> {
        let lines: Vec<String> = self
            .query(&format!("EXPLAIN {sql}"), params)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        Ok(lines.join("\n"))
    }
}

/// A transaction's `COMMIT` with its notes before it (when someone else hears them), as one simple query.
fn commit_batch(notes: &[String], heard: bool) -> String {
    let notes = if heard { notes } else { &[] };
    let mut batch = String::new();
    for payload in notes {
        batch.push_str(&format!(
            "SELECT pg_notify('{}', '{}'); ",
            crate::news::CHANNEL,
            payload.replace('\'', "''")
        ));
    }
    batch.push_str("COMMIT");
    batch
}
