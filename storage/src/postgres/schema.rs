//! Versioned migrations of the PostgreSQL schema, recorded in a one-row `schema_version` table.
//!
//! Migration N (1-based) brings a database from version N-1 to N; the pending steps run in one
//! transaction together with the version bump, so a failing step leaves the version found intact. Hosts that start together
//! serialize on a transaction-scoped advisory lock, and each re-reads the version under it: exactly one
//! runs each step. A database stamped with a version newer than [`MIGRATIONS`] knows is refused by name
//! ([`Error::SchemaTooNew`]) and never written by an older build.
//!
//! The tables are SQLite's (SPEC §4.1, `sqlite::schema`) at its current version: `BIGINT` for every
//! integer (PostgreSQL has no unsigned type; seqs past `i64::MAX` are refused before they reach SQL, as
//! on SQLite), `BOOLEAN` for flags, `text COLLATE "C"` for every string, JSON as `text`.

use postgres::Client;

use crate::{Error, Result};

/// Key of the advisory lock migrations hold (any constant unique to Switchboard).
const MIGRATION_LOCK: i64 = 0x5357_4254_4d49_4752; // "SWBTMIGR"

/// Every migration, in order. Append only; never edit a released entry.
pub const MIGRATIONS: &[&str] = &[
    // 1: the finished-run history (SPEC §3), the live-run ledger (SPEC §4.1) and plans (SPEC §9), at
    // the shape of SQLite's schema version 6.
    r#"
    CREATE TABLE runs (
        run_id             text COLLATE "C" PRIMARY KEY,
        finished_at        BIGINT NOT NULL,
        started_at         BIGINT NOT NULL,
        agent              text COLLATE "C",
        channel_id         text COLLATE "C" NOT NULL,
        user_id            text COLLATE "C" NOT NULL,
        thread_key         text COLLATE "C" NOT NULL,
        channel_visibility text COLLATE "C" NOT NULL DEFAULT 'unknown',
        parent_run_id      text COLLATE "C",
        status             text COLLATE "C" NOT NULL,
        provisional        BOOLEAN NOT NULL DEFAULT FALSE,
        event_count        BIGINT NOT NULL,
        bytes              BIGINT NOT NULL,
        digest             text COLLATE "C" NOT NULL,
        stored_at          BIGINT NOT NULL,
        summary_json       text NOT NULL
    );
    CREATE INDEX runs_by_finish     ON runs(finished_at, run_id, bytes);
    CREATE INDEX runs_by_channel    ON runs(channel_id, finished_at, run_id);
    CREATE INDEX runs_by_visibility ON runs(channel_visibility, finished_at, run_id);
    CREATE INDEX runs_by_user       ON runs(user_id, finished_at, run_id);
    CREATE INDEX runs_by_agent      ON runs(agent, finished_at, run_id);
    CREATE INDEX runs_by_thread     ON runs(thread_key, finished_at, run_id);
    CREATE INDEX runs_by_parent     ON runs(parent_run_id, finished_at, run_id);
    CREATE INDEX runs_by_status     ON runs(status, finished_at, run_id);
    CREATE TABLE run_events (
        run_id text COLLATE "C" NOT NULL,
        seq    BIGINT NOT NULL,
        json   text NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE meta (key text COLLATE "C" PRIMARY KEY, value text NOT NULL);
    CREATE TABLE live_runs (
        run_id      text COLLATE "C" PRIMARY KEY,
        thread_key  text COLLATE "C" NOT NULL UNIQUE,
        owner_gen   text COLLATE "C" NOT NULL,
        lease_until BIGINT NOT NULL,
        started_at  BIGINT NOT NULL,
        phase       text COLLATE "C" NOT NULL,
        stop        text COLLATE "C",
        meta_json   text NOT NULL,
        system_text text NOT NULL DEFAULT '',
        tools_json  text NOT NULL DEFAULT 'null',
        state_json  text NOT NULL DEFAULT '{}'
    );
    CREATE INDEX live_runs_by_owner ON live_runs(owner_gen);
    CREATE TABLE run_steps (
        run_id text COLLATE "C" NOT NULL, step BIGINT NOT NULL, json text NOT NULL, PRIMARY KEY (run_id, step)
    );
    CREATE TABLE transcript (
        run_id text COLLATE "C" NOT NULL, idx BIGINT NOT NULL, part BIGINT NOT NULL, json text NOT NULL,
        PRIMARY KEY (run_id, idx, part)
    );
    CREATE TABLE run_inbox (
        run_id text COLLATE "C" NOT NULL, seq BIGINT NOT NULL, json text NOT NULL, PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE admit_receipts (
        scope text COLLATE "C" NOT NULL, key text COLLATE "C" NOT NULL, body_hash text COLLATE "C" NOT NULL,
        run_id text COLLATE "C" NOT NULL, outcome text COLLATE "C" NOT NULL, seq BIGINT, answer_json text NOT NULL,
        ended_at BIGINT, PRIMARY KEY (scope, key)
    );
    CREATE INDEX admit_receipts_by_run ON admit_receipts(run_id);
    CREATE INDEX admit_receipts_by_end ON admit_receipts(ended_at);
    CREATE TABLE deletion_fences (run_id text COLLATE "C" PRIMARY KEY, at BIGINT NOT NULL);
    CREATE TABLE generations (
        gen text COLLATE "C" PRIMARY KEY, host text COLLATE "C" NOT NULL, pid BIGINT NOT NULL,
        proc_start text COLLATE "C" NOT NULL, started_at BIGINT NOT NULL
    );
    CREATE TABLE plans (
        plan_id     text COLLATE "C" PRIMARY KEY,
        revision    BIGINT NOT NULL,
        snapshot_id text COLLATE "C" NOT NULL
    );
    CREATE TABLE plan_requests (
        request_id  text COLLATE "C" PRIMARY KEY,
        plan_id     text COLLATE "C" NOT NULL,
        revision    BIGINT NOT NULL,
        snapshot_id text COLLATE "C" NOT NULL,
        state       text COLLATE "C" NOT NULL,
        reason      text COLLATE "C",
        diagnostic  text,
        cards_json  text,
        created_at  BIGINT NOT NULL,
        settled_at  BIGINT,
        generation  text COLLATE "C",
        lease_until BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX plan_requests_by_plan ON plan_requests(plan_id, state);
    CREATE INDEX plan_requests_pending ON plan_requests(created_at, request_id) WHERE state = 'pending';
    "#,
    // 2: each generation's host identity (`[server] host_id`, SPEC §1.3), as SQLite's migration 8: fast
    // reclaim of a dead generation is for its own host only. Rows from before: their hostname.
    r#"
    ALTER TABLE generations ADD COLUMN host_id text COLLATE "C" NOT NULL DEFAULT '';
    UPDATE generations SET host_id = host;
    "#,
    // 3: the orphan-card sweep's worklist (SPEC §12), as SQLite's migration 9: `card_open` is set by the
    // record writer on a final record whose head has a `card` and no `cardClosed: true`, cleared by
    // `close_card`, and read through a partial index. Rows from before read FALSE: not open.
    r#"
    ALTER TABLE runs ADD COLUMN card_open BOOLEAN NOT NULL DEFAULT FALSE;
    CREATE INDEX runs_open_cards ON runs(finished_at, run_id) WHERE card_open;
    "#,
    // 4: the index's text search (`ListQuery::search`), as SQLite's migration 10: `label` is the head's
    // label, set by the record writer; rows from before take theirs from their summary.
    r#"
    ALTER TABLE runs ADD COLUMN label text COLLATE "C";
    UPDATE runs SET label = summary_json::jsonb ->> 'label';
    "#,
    // 5: the stored runs' count and bytes, kept by triggers, as SQLite's migration 11: the retention
    // check of every put and point read is one row instead of an aggregate over every stored run. An
    // upsert that updates a row fires the update trigger only (the count stays, the bytes move).
    r#"
    CREATE TABLE run_totals (
        id    BIGINT PRIMARY KEY CHECK (id = 1),
        runs  BIGINT NOT NULL,
        bytes BIGINT NOT NULL
    );
    INSERT INTO run_totals (id, runs, bytes) SELECT 1, COUNT(*), COALESCE(SUM(bytes), 0) FROM runs;
    CREATE FUNCTION run_totals_follow() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'INSERT' THEN
            UPDATE run_totals SET runs = runs + 1, bytes = bytes + NEW.bytes WHERE id = 1;
        ELSIF TG_OP = 'DELETE' THEN
            UPDATE run_totals SET runs = runs - 1, bytes = bytes - OLD.bytes WHERE id = 1;
        ELSIF NEW.bytes IS DISTINCT FROM OLD.bytes THEN
            UPDATE run_totals SET bytes = bytes - OLD.bytes + NEW.bytes WHERE id = 1;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER run_totals_follow AFTER INSERT OR DELETE OR UPDATE OF bytes ON runs
        FOR EACH ROW EXECUTE FUNCTION run_totals_follow();
    "#,
    // 6: as SQLite's migration 12: the status and parent indexes hold only the rows their listings read
    // (a status filter never lists a tombstone; a parent filter names one), so a run's tombstone and a
    // run with no parent write no entry in them.
    r#"
    DROP INDEX runs_by_status;
    CREATE INDEX runs_by_status ON runs(status, finished_at, run_id) WHERE NOT provisional;
    DROP INDEX runs_by_parent;
    CREATE INDEX runs_by_parent ON runs(parent_run_id, finished_at, run_id) WHERE parent_run_id IS NOT NULL;
    "#,
    // 7: a live row's owner index names the run too. Every ownership check asks for `run_id = $1 AND
    // owner_gen = $2`, and the planner, seeing two one-row indexes, took the owner's and filtered
    // every live run of the generation by id; now either index finds the one row.
    r#"
    DROP INDEX live_runs_by_owner;
    CREATE INDEX live_runs_by_owner ON live_runs(owner_gen, run_id);
    "#,
];

pub fn current_version() -> i64 {
    MIGRATIONS.len() as i64
}

/// The version recorded in the database (0 before the first migration).
pub fn version(client: &mut Client) -> Result<i64> {
    let exists: bool = client
        .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_opt("SELECT version FROM schema_version", &[])?
        .map_or(0, |r| r.get(0)))
}

/// Bring the database to [`current_version`]; answers the version found before migrating.
pub fn migrate(client: &mut Client) -> Result<i64> {
    let found = version(client)?;
    let supported = current_version();
    if found > supported {
        return Err(Error::SchemaTooNew { found, supported });
    }
    if found == supported {
        return Ok(found);
    }
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")?;
    // Another host may have migrated while we waited for the lock.
    let mut now: i64 = tx
        .query_opt("SELECT version FROM schema_version", &[])?
        .map_or(0, |r| r.get(0));
    if now > supported {
        return Err(Error::SchemaTooNew {
            found: now,
            supported,
        });
    }
    if now == 0 {
        tx.execute("INSERT INTO schema_version (version) VALUES (0)", &[])?;
    }
    while now < supported {
        tx.batch_execute(MIGRATIONS[now as usize])?;
        now += 1;
        tx.execute("UPDATE schema_version SET version = $1", &[&now])?;
        tracing::debug!(version = now, "migrated postgres schema");
    }
    let secret: [u8; 32] = rand::random();
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('capability_secret', $1) ON CONFLICT (key) DO NOTHING",
        &[&hex::encode(secret)],
    )?;
    tx.commit()?;
    Ok(found)
}
