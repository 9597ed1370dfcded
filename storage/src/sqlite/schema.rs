//! Schema migrations by `PRAGMA user_version`.
//!
//! Migration N (1-based) brings a database from version N-1 to N inside one transaction, together with the
//! `user_version` bump, so a failing step leaves the previous version intact. A database stamped with a
//! version newer than [`MIGRATIONS`] knows is refused by name ([`Error::SchemaTooNew`]); it is never
//! opened for writing by an older build.
//!
//! A read-only store never migrates: it reads an older file as is, with [`stand_ins`] for what the
//! older version lacks.

use rusqlite::Connection;

use crate::{Error, Result};

/// Every migration, in order. Append only; never edit a released entry.
pub const MIGRATIONS: &[&str] = &[
    // 1: finished-run history (SPEC §3) and store metadata.
    r#"
    CREATE TABLE runs (
        run_id             TEXT PRIMARY KEY NOT NULL,
        finished_at        INTEGER NOT NULL,
        started_at         INTEGER NOT NULL,
        agent              TEXT,
        channel_id         TEXT NOT NULL,
        user_id            TEXT NOT NULL,
        thread_key         TEXT NOT NULL,
        channel_visibility TEXT NOT NULL DEFAULT 'unknown',
        parent_run_id      TEXT,
        status             TEXT NOT NULL,
        provisional        INTEGER NOT NULL DEFAULT 0,
        event_count        INTEGER NOT NULL,
        bytes              INTEGER NOT NULL,
        digest             TEXT NOT NULL,
        stored_at          INTEGER NOT NULL,
        summary_json       TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX runs_by_finish     ON runs(finished_at, run_id, bytes);
    CREATE INDEX runs_by_channel    ON runs(channel_id, finished_at, run_id);
    CREATE INDEX runs_by_visibility ON runs(channel_visibility, finished_at, run_id);
    CREATE INDEX runs_by_user       ON runs(user_id, finished_at, run_id);
    CREATE INDEX runs_by_agent      ON runs(agent, finished_at, run_id);
    CREATE INDEX runs_by_thread     ON runs(thread_key, finished_at, run_id);
    CREATE INDEX runs_by_parent     ON runs(parent_run_id, finished_at, run_id);
    CREATE TABLE run_events (
        run_id TEXT NOT NULL,
        seq    INTEGER NOT NULL,
        json   TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
    INSERT INTO meta (key, value) VALUES ('capability_secret', lower(hex(randomblob(32))));
    "#,
    // 2: the live-run ledger (SPEC §4.1). Live events share `run_events`.
    r#"
    CREATE TABLE live_runs (
        run_id      TEXT PRIMARY KEY NOT NULL,
        thread_key  TEXT NOT NULL UNIQUE,
        owner_gen   TEXT NOT NULL,
        lease_until INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        phase       TEXT NOT NULL,
        stop        TEXT,
        meta_json   TEXT NOT NULL,
        system_text TEXT NOT NULL DEFAULT '',
        tools_json  TEXT NOT NULL DEFAULT 'null',
        state_json  TEXT NOT NULL DEFAULT '{}'
    ) WITHOUT ROWID;
    CREATE TABLE run_steps (
        run_id TEXT NOT NULL, step INTEGER NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_id, step)
    ) WITHOUT ROWID;
    CREATE TABLE transcript (
        run_id TEXT NOT NULL, idx INTEGER NOT NULL, part INTEGER NOT NULL, json TEXT NOT NULL,
        PRIMARY KEY (run_id, idx, part)
    ) WITHOUT ROWID;
    CREATE TABLE run_inbox (
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE run_jobs (
        run_id TEXT NOT NULL, kind TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_id, kind)
    ) WITHOUT ROWID;
    CREATE TABLE admit_receipts (
        scope TEXT NOT NULL, key TEXT NOT NULL, body_hash TEXT NOT NULL, run_id TEXT NOT NULL,
        outcome TEXT NOT NULL, seq INTEGER, answer_json TEXT NOT NULL, PRIMARY KEY (scope, key)
    ) WITHOUT ROWID;
    CREATE INDEX admit_receipts_by_run ON admit_receipts(run_id);
    CREATE TABLE deletion_fences (run_id TEXT PRIMARY KEY NOT NULL, at INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE generations (
        gen TEXT PRIMARY KEY NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL, proc_start TEXT NOT NULL,
        started_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 3: plans and their suggestion requests (SPEC §9).
    r#"
    CREATE TABLE plans (
        plan_id     TEXT PRIMARY KEY NOT NULL,
        revision    INTEGER NOT NULL,
        snapshot_id TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE plan_requests (
        request_id  TEXT PRIMARY KEY NOT NULL,
        plan_id     TEXT NOT NULL,
        revision    INTEGER NOT NULL,
        snapshot_id TEXT NOT NULL,
        state       TEXT NOT NULL,
        reason      TEXT,
        diagnostic  TEXT,
        cards_json  TEXT,
        created_at  INTEGER NOT NULL,
        settled_at  INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX plan_requests_by_plan ON plan_requests(plan_id, state);
    "#,
    // 4: each plan request's holder — the generation whose coordinator runs it — and the lease that holder
    // renews (SPEC §9 "Crashes"). Rows from before have no holder: the next sweep settles them interrupted.
    r#"
    ALTER TABLE plan_requests ADD COLUMN generation TEXT;
    ALTER TABLE plan_requests ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX plan_requests_pending ON plan_requests(created_at, request_id) WHERE state = 'pending';
    "#,
    // 5: `run_jobs` goes: nothing ever wrote it outside tests and nothing read it back (a reclaim answered
    // its rows, and no caller looked). A file from before holds no rows a current build would miss.
    r#"
    DROP TABLE run_jobs;
    "#,
    // 6: when each receipt's run ended, so the sweep prunes receipts `receipt_ttl_ms` after it (SPEC
    // §4.3 finish). Receipts from before read NULL; the next prune stamps those whose run is no longer
    // live, and their TTL runs from then.
    r#"
    ALTER TABLE admit_receipts ADD COLUMN ended_at INTEGER;
    CREATE INDEX admit_receipts_by_end ON admit_receipts(ended_at);
    "#,
    // 7: listing by terminal status (SPEC §7 `status=failed` …) is one indexed query, newest first.
    r#"
    CREATE INDEX runs_by_status ON runs(status, finished_at, run_id);
    "#,
    // 8: each generation's host identity (`[server] host_id`, SPEC §1.3): fast reclaim of a dead
    // generation is for its own host only. Rows from before were recorded by hostname: that is their id.
    r#"
    ALTER TABLE generations ADD COLUMN host_id TEXT NOT NULL DEFAULT '';
    UPDATE generations SET host_id = host;
    "#,
    // 9: the orphan-card sweep's worklist (SPEC §12) is one indexed query: `card_open` is 1 on a final
    // record whose head has a `card` and no `cardClosed: true`, set by the record writer and cleared by
    // `close_card`. Rows from before read 0: not open.
    r#"
    ALTER TABLE runs ADD COLUMN card_open INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX runs_open_cards ON runs(finished_at, run_id) WHERE card_open = 1;
    "#,
    // 10: the index's text search (`ListQuery::search`) tests each row's label without reading its JSON:
    // `label` is the head's label, set by the record writer; rows from before take theirs from their
    // summary (NULL where it does not parse).
    r#"
    ALTER TABLE runs ADD COLUMN label TEXT;
    UPDATE runs SET label = CASE WHEN json_valid(summary_json) THEN json_extract(summary_json, '$.label') END;
    "#,
    // 11: the stored runs' count and bytes, kept by triggers, so the retention policy's check on every
    // put and point read is one row instead of a scan of every stored run (SPEC §3).
    r#"
    CREATE TABLE run_totals (
        id    INTEGER PRIMARY KEY CHECK (id = 1),
        runs  INTEGER NOT NULL,
        bytes INTEGER NOT NULL
    );
    INSERT INTO run_totals (id, runs, bytes) SELECT 1, COUNT(*), COALESCE(SUM(bytes), 0) FROM runs;
    CREATE TRIGGER run_totals_on_insert AFTER INSERT ON runs BEGIN
        UPDATE run_totals SET runs = runs + 1, bytes = bytes + NEW.bytes WHERE id = 1;
    END;
    CREATE TRIGGER run_totals_on_delete AFTER DELETE ON runs BEGIN
        UPDATE run_totals SET runs = runs - 1, bytes = bytes - OLD.bytes WHERE id = 1;
    END;
    CREATE TRIGGER run_totals_on_update AFTER UPDATE OF bytes ON runs BEGIN
        UPDATE run_totals SET bytes = bytes - OLD.bytes + NEW.bytes WHERE id = 1;
    END;
    "#,
    // 12: the status and parent indexes hold only the rows their listings read — a status filter never
    // lists a tombstone (`provisional = 0`), a parent filter names a parent (`parent_run_id = ?` implies
    // it is not NULL) — so a run's tombstone, and a run with no parent, write no page of them: four WAL
    // frames of a run's ~55 (issue 29).
    r#"
    DROP INDEX runs_by_status;
    CREATE INDEX runs_by_status ON runs(status, finished_at, run_id) WHERE provisional = 0;
    DROP INDEX runs_by_parent;
    CREATE INDEX runs_by_parent ON runs(parent_run_id, finished_at, run_id) WHERE parent_run_id IS NOT NULL;
    "#,
    // 13: `live_runs` is a rowid table. Its row carries the run's tool definitions (~1.4 KB with them),
    // more than a WITHOUT ROWID page keeps in place (~1,000 bytes of 4 KiB): every row spilled to an
    // overflow page, allocated from the freelist at admission and freed at finish, each time with the
    // freelist's trunk page and the file header — five WAL frames of a run's ~45 (issue 29). A rowid
    // table keeps up to ~4,000 bytes in place; its key is one more index page.
    r#"
    CREATE TABLE live_runs_rowid (
        run_id      TEXT PRIMARY KEY NOT NULL,
        thread_key  TEXT NOT NULL UNIQUE,
        owner_gen   TEXT NOT NULL,
        lease_until INTEGER NOT NULL,
        started_at  INTEGER NOT NULL,
        phase       TEXT NOT NULL,
        stop        TEXT,
        meta_json   TEXT NOT NULL,
        system_text TEXT NOT NULL DEFAULT '',
        tools_json  TEXT NOT NULL DEFAULT 'null',
        state_json  TEXT NOT NULL DEFAULT '{}'
    );
    INSERT INTO live_runs_rowid (run_id, thread_key, owner_gen, lease_until, started_at, phase, stop,
                                 meta_json, system_text, tools_json, state_json)
        SELECT run_id, thread_key, owner_gen, lease_until, started_at, phase, stop,
               meta_json, system_text, tools_json, state_json FROM live_runs;
    DROP TABLE live_runs;
    ALTER TABLE live_runs_rowid RENAME TO live_runs;
    "#,
];

pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Bring `conn` to [`current_version`]; answers the version found before migrating.
pub fn migrate(conn: &mut Connection) -> Result<i64> {
    let found: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let supported = current_version();
    if found > supported {
        return Err(Error::SchemaTooNew { found, supported });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        // Another process may have migrated while we waited for the write lock.
        let now: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if now > i as i64 {
            continue;
        }
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
        tracing::debug!(version = i + 1, "migrated database schema");
    }
    Ok(found)
}

/// Give a read-only connection to an older database the shape of the current schema without writing the
/// file: in the connection's own `temp` schema (searched before `main` for unqualified names), every
/// table a later migration added becomes an empty table of the current shape, and every table that has
/// gained columns since becomes a view over the file's table that adds them with their declared default
/// (or NULL). A version-1 file so reads as "no live runs, no plans", and a read written against the
/// current schema needs no version checks of its own.
///
/// The current shape comes from running [`MIGRATIONS`] on an in-memory database, so the migrations stay
/// the one definition of the schema. Call before `query_only` is set.
pub(crate) fn stand_ins(conn: &Connection) -> Result<()> {
    let current = Connection::open_in_memory()?;
    for sql in MIGRATIONS {
        current.execute_batch(sql)?;
    }
    let tables: Vec<(String, String)> = current
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, sql) in tables {
        let have: Vec<(String, Option<String>)> = columns(conn, &name)?;
        if have.is_empty() {
            // Added after the file's version: an empty table of the current shape.
            let rest = sql.strip_prefix("CREATE TABLE").ok_or_else(|| {
                Error::corrupt("schema", format!("unexpected definition of {name}: {sql}"))
            })?;
            conn.execute_batch(&format!("CREATE TEMP TABLE{rest}"))?;
            continue;
        }
        let want = columns(&current, &name)?;
        if want.iter().all(|(c, _)| have.iter().any(|(h, _)| h == c)) {
            continue;
        }
        // Columns added after the file's version: read as their default.
        let select: Vec<String> = want
            .iter()
            .map(|(c, default)| {
                if have.iter().any(|(h, _)| h == c) {
                    quote(c)
                } else {
                    format!("{} AS {}", default.as_deref().unwrap_or("NULL"), quote(c))
                }
            })
            .collect();
        conn.execute_batch(&format!(
            "CREATE TEMP VIEW {q} AS SELECT {} FROM main.{q}",
            select.join(", "),
            q = quote(&name)
        ))?;
    }
    Ok(())
}

/// The columns of `main.<table>` with their declared defaults (SQL text); empty when it does not exist.
fn columns(conn: &Connection, table: &str) -> Result<Vec<(String, Option<String>)>> {
    Ok(conn
        .prepare("SELECT name, dflt_value FROM pragma_table_info(?1, 'main') ORDER BY cid")?
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?)
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}
