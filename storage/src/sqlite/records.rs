//! SQL for the `runs` and `run_events` tables and the policy row of `meta` (SPEC §3): everything that
//! reads or writes a finished record, as free functions over one transaction.
//!
//! **Callers:** both trait implementations — the finished-run history (`runs.rs`, [`RunStore`]) and the
//! live-run ledger (`ledger.rs`), whose `finish` upserts the record with [`put_in`] inside its own
//! transaction, whose `append` writes live events into the shared `run_events`, and whose `abandon`,
//! `kill` and `purge` ask about or remove a run's record. Neither is known here.
//!
//! **Depends on:** [`super::live`] for the two facts about the ledger a history write must respect: while a
//! run is live its `run_events` are the ledger's (a put writes only the `runs` row, and trims never delete
//! them); a killed id takes no record ever again.
//!
//! [`RunStore`]: crate::store::RunStore

use crate::RunId;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::live::{is_killed, is_live};
use crate::record::{
    is_valid_run_id, stored_event_seqs, RetentionPolicy, RunHead, RunListItem, RunRecord,
    VisibilityFilter,
};
use crate::store::{
    clamp_future, decode_event_row, effective_open_cards_limit, EventsPage, Expired, ListQuery,
    PolicyProposal, PutOutcome, StoredPolicy, TRIM_PER_PUT,
};
use crate::{Error, Result};

const POLICY_KEY: &str = "retention_policy";

/// The rows the retention policy keeps, as a floor in newest-first order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// Every row finished at or after the age cutoff.
    All,
    /// In-cutoff rows at or newer than `(finished_at, run_id)`.
    From(i64, String),
    /// The newest row alone is over the byte budget.
    Nothing,
}

impl Kept {
    /// The SQL predicate for "kept", appending its parameters.
    fn sql(&self, cutoff: i64, params: &mut Vec<SqlValue>) -> String {
        params.push(SqlValue::Integer(cutoff));
        match self {
            Kept::All => "finished_at >= ?".into(),
            Kept::From(f, id) => {
                params.push(SqlValue::Integer(*f));
                params.push(SqlValue::Text(id.clone()));
                "finished_at >= ? AND (finished_at, run_id) >= (?, ?)".into()
            }
            Kept::Nothing => "0".into(),
        }
    }

    /// The rows the floor does not keep are exactly those ordered before `(finished_at, run_id)` of the
    /// answer (`None`: every row): the complement of [`Kept::sql`] as one range of the `runs_by_finish`
    /// index, which trimming walks from its old end. (`NOT (kept)` is no range to SQLite: it scanned
    /// every stored row at each finish.)
    pub(crate) fn doomed_before(&self, cutoff: i64) -> Option<(i64, &str)> {
        match self {
            Kept::All => Some((cutoff, "")),
            Kept::From(f, id) if (*f, id.as_str()) > (cutoff, "") => Some((*f, id)),
            Kept::From(..) => Some((cutoff, "")),
            Kept::Nothing => None,
        }
    }
}

pub(super) fn read_policy(tx: &Connection) -> Result<StoredPolicy> {
    let raw: Option<String> = tx
        .prepare_cached("SELECT value FROM meta WHERE key = ?1")?
        .query_row([POLICY_KEY], |r| r.get(0))
        .optional()?;
    let Some(raw) = raw else {
        return Ok(StoredPolicy::default());
    };
    let v: serde_json::Value =
        serde_json::from_str(&raw).map_err(|e| Error::corrupt("meta.retention_policy", e))?;
    let num = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    Ok(StoredPolicy {
        policy: RetentionPolicy::clamp(num("retentionDays"), num("maxRuns"), num("maxBytes")),
        updated_at: v.get("policyUpdatedAt").and_then(serde_json::Value::as_i64),
    })
}

fn write_policy(tx: &Connection, p: &StoredPolicy) -> Result<()> {
    let v = serde_json::json!({
        "retentionDays": p.policy.retention_days,
        "maxRuns": p.policy.max_runs,
        "maxBytes": p.policy.max_bytes,
        "policyUpdatedAt": p.updated_at,
    });
    tx.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
        params![POLICY_KEY, v.to_string()],
    )?;
    Ok(())
}

/// The count and bytes of every stored run (schema 11's triggers keep them); `None` on a read-only
/// connection to an older file, whose stand-in table is empty.
fn totals(tx: &Connection) -> Result<Option<(i64, i64)>> {
    Ok(tx
        .prepare_cached("SELECT runs, bytes FROM run_totals WHERE id = 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

/// Whether `runs` stored runs of `bytes` together are within both of the policy's bounds.
pub(crate) fn within(policy: &RetentionPolicy, (runs, bytes): (i64, i64)) -> bool {
    runs <= i64::from(policy.max_runs) && bytes.max(0) as u64 <= policy.max_bytes
}

/// Decide the kept floor. When every stored run together is within both bounds, every in-cutoff row is
/// kept (one row read); else one aggregate over the in-cutoff rows, and a walk of the newest rows only
/// when a count or byte bound is exceeded.
pub(super) fn kept(tx: &Connection, policy: &RetentionPolicy, now_ms: i64) -> Result<Kept> {
    if totals(tx)?.is_some_and(|t| within(policy, t)) {
        return Ok(Kept::All);
    }
    let cutoff = policy.cutoff_ms(now_ms);
    let (count, bytes): (i64, i64) = tx
        .prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM runs WHERE finished_at >= ?1",
        )?
        .query_row([cutoff], |r| Ok((r.get(0)?, r.get(1)?)))?;
    if within(policy, (count, bytes)) {
        return Ok(Kept::All);
    }
    let mut stmt = tx.prepare_cached(
        "SELECT finished_at, run_id, bytes FROM runs WHERE finished_at >= ?1
         ORDER BY finished_at DESC, run_id DESC LIMIT ?2",
    )?;
    let mut rows = stmt.query(params![cutoff, policy.max_runs])?;
    let (mut total, mut floor) = (0u64, Kept::Nothing);
    while let Some(row) = rows.next()? {
        total += row.get::<_, i64>(2)?.max(0) as u64;
        if total > policy.max_bytes {
            break;
        }
        floor = Kept::From(row.get(0)?, row.get(1)?);
    }
    Ok(floor)
}

/// The SQL form of the visibility predicate (SPEC §2), over the `runs` listing columns.
fn visibility_sql(f: &VisibilityFilter, params: &mut Vec<SqlValue>) -> String {
    fn placeholders(n: usize) -> String {
        vec!["?"; n].join(", ")
    }
    match f {
        VisibilityFilter::All => "1".into(),
        VisibilityFilter::None => "0".into(),
        VisibilityFilter::ChannelsIn { ids } if ids.is_empty() => "0".into(),
        VisibilityFilter::ChannelsIn { ids } => {
            params.extend(ids.iter().map(|i| SqlValue::Text(i.clone())));
            format!("channel_id IN ({})", placeholders(ids.len()))
        }
        VisibilityFilter::UserIs { id } => {
            params.push(SqlValue::Text(id.clone()));
            "user_id = ?".into()
        }
        VisibilityFilter::VisibilityIn { values } if values.is_empty() => "0".into(),
        VisibilityFilter::VisibilityIn { values } => {
            params.extend(values.iter().map(|v| SqlValue::Text(v.as_str().into())));
            format!("channel_visibility IN ({})", placeholders(values.len()))
        }
        VisibilityFilter::Or { of } | VisibilityFilter::And { of } if of.is_empty() => "0".into(),
        VisibilityFilter::Or { of } => {
            format!(
                "({})",
                of.iter()
                    .map(|g| visibility_sql(g, params))
                    .collect::<Vec<_>>()
                    .join(" OR ")
            )
        }
        VisibilityFilter::And { of } => {
            format!(
                "({})",
                of.iter()
                    .map(|g| visibility_sql(g, params))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            )
        }
    }
}

/// The one page query of `list` (SQL text and parameters); `None` when the filter matches nothing.
pub(super) fn list_sql(
    query: &ListQuery,
    kept: &Kept,
    cutoff: i64,
) -> Option<(String, Vec<SqlValue>)> {
    if matches!(kept, Kept::Nothing) || matches!(query.visible_to, VisibilityFilter::None) {
        return None;
    }
    let mut p = Vec::new();
    let mut clauses = vec![kept.sql(cutoff, &mut p)];
    if let Some(s) = query.since_ms {
        clauses.push("finished_at >= ?".into());
        p.push(SqlValue::Integer(s));
    }
    for (col, v) in [
        ("agent", &query.agent),
        ("channel_id", &query.channel),
        ("thread_key", &query.thread_key),
        (
            "parent_run_id",
            &query.parent_run_id.clone().map(RunId::into_string),
        ),
    ] {
        if let Some(v) = v {
            clauses.push(format!("{col} = ?"));
            p.push(SqlValue::Text(v.clone()));
        }
    }
    if let Some(status) = query.status {
        clauses.push("status = ? AND provisional = 0".into());
        p.push(SqlValue::Text(status.as_str().into()));
    }
    if let Some(search) = &query.search {
        // SQLite's LIKE compares ASCII letters without case and everything else exactly: `Search`'s rule.
        clauses.push(r"(run_id LIKE ? ESCAPE '\' OR label LIKE ? ESCAPE '\')".into());
        p.push(SqlValue::Text(search.like_prefix()));
        p.push(SqlValue::Text(search.like_contains()));
    }
    if let Some(c) = &query.before {
        p.push(SqlValue::Integer(c.finished_at));
        match &c.id {
            Some(id) => {
                clauses.push("(finished_at, run_id) < (?, ?)".into());
                p.push(SqlValue::Text(id.clone()));
            }
            None => clauses.push("finished_at < ?".into()),
        }
    }
    if !matches!(query.visible_to, VisibilityFilter::All) {
        clauses.push(visibility_sql(&query.visible_to, &mut p));
    }
    p.push(SqlValue::Integer(query.effective_limit() as i64));
    let sql = format!(
        "SELECT summary_json, bytes FROM runs WHERE {} ORDER BY finished_at DESC, run_id DESC LIMIT ?",
        clauses.join(" AND ")
    );
    Some((sql, p))
}

pub(super) fn decode_item(summary_json: &str, bytes: i64) -> Result<RunListItem> {
    let head: RunHead =
        serde_json::from_str(summary_json).map_err(|e| Error::corrupt("runs.summary_json", e))?;
    Ok(RunListItem {
        head: RunHead {
            diagnosis: head.diagnosis.clone().normalized(),
            ..head
        },
        bytes: Some(bytes.max(0) as u64),
    })
}

/// The listing row of `id` when it is visible under the policy.
pub(super) fn visible_summary(
    tx: &Connection,
    id: &str,
    now_ms: i64,
) -> Result<Option<RunListItem>> {
    let policy = read_policy(tx)?.policy;
    let kept = kept(tx, &policy, now_ms)?;
    let mut p = vec![SqlValue::Text(id.into())];
    let sql = format!(
        "SELECT summary_json, bytes FROM runs WHERE run_id = ? AND {}",
        kept.sql(policy.cutoff_ms(now_ms), &mut p)
    );
    let row: Option<(String, i64)> = tx
        .prepare_cached(&sql)?
        .query_row(params_from_iter(p), |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    row.map(|(s, b)| decode_item(&s, b)).transpose()
}

/// Delete a run's row and, unless it is live, its events.
pub(super) fn delete_run(tx: &Connection, id: &str) -> Result<bool> {
    if !is_live(tx, id)? {
        delete_events(tx, id)?;
    }
    Ok(tx
        .prepare_cached("DELETE FROM runs WHERE run_id = ?1")?
        .execute([id])?
        > 0)
}

fn encode(record: &RunRecord) -> Result<(String, String)> {
    let summary = serde_json::to_string(&record.head).map_err(|e| Error::corrupt("record", e))?;
    let full = serde_json::to_vec(record).map_err(|e| Error::corrupt("record", e))?;
    Ok((summary, hex::encode(Sha256::digest(&full))))
}

/// Rows the policy keeps (a put's `retained`): the stored runs less those past the age cutoff when the
/// bounds keep them all, else a count of the kept rows.
fn retained(tx: &Connection, policy: &RetentionPolicy, now_ms: i64) -> Result<u64> {
    if let Some(t) = totals(tx)?.filter(|t| within(policy, *t)) {
        let stale: i64 = tx
            .prepare_cached("SELECT COUNT(*) FROM runs WHERE finished_at < ?1")?
            .query_row([policy.cutoff_ms(now_ms)], |r| r.get(0))?;
        return Ok((t.0 - stale).max(0) as u64);
    }
    let mut p = Vec::new();
    let sql = format!(
        "SELECT COUNT(*) FROM runs WHERE {}",
        kept(tx, policy, now_ms)?.sql(policy.cutoff_ms(now_ms), &mut p)
    );
    Ok(tx
        .prepare_cached(&sql)?
        .query_row(params_from_iter(p), |r| r.get::<_, i64>(0))? as u64)
}

/// Upsert `record` inside `tx`: the shared body of `put` (and of the ledger's `finish`).
pub(super) fn put_in(
    tx: &Connection,
    record: &RunRecord,
    proposal: Option<&PolicyProposal>,
    now_ms: i64,
) -> Result<PutOutcome> {
    if !is_valid_run_id(&record.head.id) {
        return Err(Error::InvalidRecord(crate::record::RecordError::BadId));
    }
    // A killed id takes no record ever again (SPEC §4.3 `kill`).
    if is_killed(tx, &record.head.id)? {
        let policy = read_policy(tx)?.policy;
        return Ok(PutOutcome {
            stored: false,
            rewritten: false,
            retained: retained(tx, &policy, now_ms)?,
        });
    }
    let mut stored_policy = read_policy(tx)?;
    if stored_policy.consider(proposal, now_ms) {
        write_policy(tx, &stored_policy)?;
    }
    let policy = stored_policy.policy;
    let mut record = clamp_future(record, now_ms);
    // A live run's events are the ledger's: a put while it lives writes only the runs row.
    let live = is_live(tx, &record.head.id)?;
    if live {
        record.events.clear();
    }
    let id = record.head.id.as_str();
    let existing: Option<(bool, String)> = tx
        .prepare_cached("SELECT provisional, digest FROM runs WHERE run_id = ?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    // The tombstone floor: a provisional write never replaces a final record.
    if record.head.provisional && existing.as_ref().is_some_and(|(prov, _)| !prov) {
        return Ok(PutOutcome {
            stored: true,
            rewritten: false,
            retained: retained(tx, &policy, now_ms)?,
        });
    }
    let (summary, digest) = encode(&record)?;
    let bytes = record.encoded_len() as i64;
    let unchanged = existing.as_ref().is_some_and(|(_, d)| *d == digest);
    if !unchanged {
        let h = &record.head;
        // A rewrite deletes the old row first: the totals' triggers see a delete and an insert.
        if existing.is_some() {
            tx.prepare_cached("DELETE FROM runs WHERE run_id = ?1")?
                .execute([id])?;
        }
        tx.prepare_cached(
            "INSERT INTO runs (run_id, finished_at, started_at, agent, channel_id, user_id, thread_key,
                channel_visibility, parent_run_id, status, provisional, event_count, bytes, digest, stored_at, summary_json,
                card_open, label)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
        )?
        .execute(params![
            id, h.finished_at, h.started_at, h.agent, h.channel_id, h.user_id, h.thread_key,
            h.channel_visibility.as_str(), h.parent_run_id, h.status.as_str(), h.provisional,
            h.event_count as i64, bytes, digest, now_ms, summary, h.card_open(), h.label
        ])?;
        let rows: Vec<(u64, String)> = stored_event_seqs(&record.events)
            .into_iter()
            .zip(record.events.iter().map(|ev| ev.to_string()))
            .collect();
        if !live {
            // The record's events replace the ledger's: the rows it does not hold go, and the upsert
            // below leaves the ones it holds as they are (a finish rewrites nothing it kept).
            let seqs =
                serde_json::to_string(&rows.iter().map(|(seq, _)| *seq).collect::<Vec<u64>>())
                    .map_err(|e| Error::corrupt("event seqs", e))?;
            tx.prepare_cached(
                "DELETE FROM run_events WHERE run_id = ?1
                 AND seq NOT IN (SELECT value FROM json_each(?2))",
            )?
            .execute(params![id, seqs])?;
        }
        insert_events(tx, id, rows)?;
    }
    let shed = shed_oldest(tx, &policy)?;
    let kept_now = kept(tx, &policy, now_ms)?;
    trim(tx, &kept_now, policy.cutoff_ms(now_ms), TRIM_PER_PUT - shed)?;
    // The record itself goes regardless when the policy does not keep it.
    let stored = visible(tx, id, &kept_now, policy.cutoff_ms(now_ms))?;
    if !stored {
        delete_run(tx, id)?;
    }
    Ok(PutOutcome {
        stored,
        rewritten: existing.is_some() && !unchanged,
        retained: retained(tx, &policy, now_ms)?,
    })
}

/// The one query of [`RunStore::open_cards`](crate::store::RunStore::open_cards) (SQL text and
/// parameters), over the partial index `runs_open_cards`; `None` when the policy keeps nothing.
pub(super) fn open_cards_sql(
    finished_before: i64,
    limit: usize,
    kept: &Kept,
    cutoff: i64,
) -> Option<(String, Vec<SqlValue>)> {
    if matches!(kept, Kept::Nothing) {
        return None;
    }
    let mut p = vec![SqlValue::Integer(finished_before)];
    let keep_sql = kept.sql(cutoff, &mut p);
    p.push(SqlValue::Integer(effective_open_cards_limit(limit) as i64));
    let sql = format!(
        "SELECT run_id FROM runs WHERE card_open = 1 AND finished_at <= ? AND {keep_sql}
         ORDER BY finished_at ASC, run_id ASC LIMIT ?"
    );
    Some((sql, p))
}

/// [`RunStore::open_cards`](crate::store::RunStore::open_cards) inside `tx`.
pub(super) fn open_cards_in(
    tx: &Connection,
    finished_before: i64,
    limit: usize,
    now_ms: i64,
) -> Result<Vec<RunId>> {
    let policy = read_policy(tx)?.policy;
    let kept = kept(tx, &policy, now_ms)?;
    let Some((sql, p)) = open_cards_sql(finished_before, limit, &kept, policy.cutoff_ms(now_ms))
    else {
        return Ok(Vec::new());
    };
    let ids = tx
        .prepare_cached(&sql)?
        .query_map(params_from_iter(p), |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(ids)
}

/// [`RunStore::close_card`](crate::store::RunStore::close_card) inside `tx`: the row's head gains
/// `cardClosed: true`, and its digest and size become those [`put_in`] would store for the closed record
/// (its events, or none while the run is live, as a put then writes none), so a later put of the closed
/// record is an identical repeat. A head that does not decode is not closed: its `card_open` is cleared,
/// so one corrupt row never holds the sweep's worklist up, and the answer is `false`.
pub(super) fn close_card_in(tx: &Connection, id: &str) -> Result<bool> {
    let summary: Option<String> = tx
        .prepare_cached("SELECT summary_json FROM runs WHERE run_id = ?1 AND card_open = 1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    let Some(summary) = summary else {
        return Ok(false);
    };
    let mut head = match serde_json::from_str::<RunHead>(&summary) {
        Ok(head) => head,
        Err(e) => {
            let problem = crate::DecodeProblem::of(&e);
            tracing::warn!(
                run_id = id,
                problem = problem.as_str(),
                "a runs row with an open card does not decode; took it off the open cards"
            );
            tx.prepare_cached("UPDATE runs SET card_open = 0 WHERE run_id = ?1")?
                .execute([id])?;
            return Ok(false);
        }
    };
    let changed = head.close_card();
    let events = if is_live(tx, id)? {
        Vec::new()
    } else {
        all_events_in(tx, id)?
    };
    let record = RunRecord { head, events };
    let (summary, digest) = encode(&record)?;
    tx.prepare_cached(
        "UPDATE runs SET summary_json = ?2, digest = ?3, bytes = ?4, card_open = ?5 WHERE run_id = ?1",
    )?
    .execute(params![
        id,
        summary,
        digest,
        record.encoded_len() as i64,
        record.head.card_open()
    ])?;
    Ok(changed)
}

/// While the stored runs together exceed a bound, the oldest goes (at most [`TRIM_PER_PUT`]): what
/// the newest-first floor of [`kept`] would leave out, found by the index from the old end instead of a
/// walk of every kept row, so a put at the policy's bounds costs a few rows, not a scan. (Rows past the
/// age cutoff are the oldest: they go first, as the floor never counts them.)
fn shed_oldest(tx: &Connection, policy: &RetentionPolicy) -> Result<usize> {
    let mut shed = 0;
    while shed < TRIM_PER_PUT && totals(tx)?.is_some_and(|t| !within(policy, t)) {
        let oldest: Option<String> = tx
            .prepare_cached("SELECT run_id FROM runs ORDER BY finished_at ASC, run_id ASC LIMIT 1")?
            .query_row([], |r| r.get(0))
            .optional()?;
        let Some(id) = oldest else { break };
        delete_run(tx, &id)?;
        shed += 1;
    }
    if shed > 0 {
        tracing::info!(trimmed = shed, "retention trimmed finished runs");
    }
    Ok(shed)
}

/// The query of the oldest `limit` rows `kept` does not keep (SQL text and parameters): one range of
/// `runs_by_finish` from its old end.
fn doomed_sql(kept: &Kept, cutoff: i64, limit: usize) -> (&'static str, Vec<SqlValue>) {
    let limit = SqlValue::Integer(limit as i64);
    match kept.doomed_before(cutoff) {
        Some((f, id)) => (
            "SELECT run_id FROM runs WHERE (finished_at, run_id) < (?, ?)
             ORDER BY finished_at ASC, run_id ASC LIMIT ?",
            vec![SqlValue::Integer(f), SqlValue::Text(id.into()), limit],
        ),
        None => (
            "SELECT run_id FROM runs ORDER BY finished_at ASC, run_id ASC LIMIT ?",
            vec![limit],
        ),
    }
}

/// Trim by the persisted policy, oldest first, at most `limit` runs; answers how many went.
fn trim(tx: &Connection, kept: &Kept, cutoff: i64, limit: usize) -> Result<usize> {
    if limit == 0 {
        return Ok(0);
    }
    let (sql, p) = doomed_sql(kept, cutoff, limit);
    let doomed: Vec<String> = tx
        .prepare_cached(sql)?
        .query_map(params_from_iter(p), |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if !doomed.is_empty() {
        tracing::info!(trimmed = doomed.len(), "retention trimmed finished runs");
    }
    for d in &doomed {
        delete_run(tx, d)?;
    }
    Ok(doomed.len())
}

/// [`crate::store::RunStore::expire`] inside `tx`.
pub(super) fn expire_in(tx: &Connection, now_ms: i64, scan_after: &str) -> Result<Expired> {
    let policy = read_policy(tx)?.policy;
    let runs = trim(
        tx,
        &kept(tx, &policy, now_ms)?,
        policy.cutoff_ms(now_ms),
        TRIM_PER_PUT,
    )?;
    let scanned: Vec<String> = tx
        .prepare_cached(
            "SELECT DISTINCT run_id FROM run_events WHERE run_id > ?1 ORDER BY run_id LIMIT ?2",
        )?
        .query_map(params![scan_after, TRIM_PER_PUT as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut orphaned = 0;
    for run_id in &scanned {
        if !has_record(tx, run_id)? && !is_live(tx, run_id)? {
            delete_events(tx, run_id)?;
            orphaned += 1;
        }
    }
    if orphaned > 0 {
        tracing::info!(
            runs = orphaned,
            "removed event rows no record and no live run owned"
        );
    }
    let scan_after = (scanned.len() == TRIM_PER_PUT)
        .then(|| scanned.last().cloned())
        .flatten();
    Ok(Expired {
        runs: runs as u64,
        orphaned,
        scan_after,
    })
}

fn visible(tx: &Connection, id: &str, kept: &Kept, cutoff: i64) -> Result<bool> {
    let mut p = vec![SqlValue::Text(id.into())];
    let sql = format!(
        "SELECT 1 FROM runs WHERE run_id = ? AND {}",
        kept.sql(cutoff, &mut p)
    );
    Ok(tx
        .prepare_cached(&sql)?
        .query_row(params_from_iter(p), |_| Ok(()))
        .optional()?
        .is_some())
}

pub(super) fn events_in(
    tx: &Connection,
    id: &str,
    after_seq: u64,
    limit: usize,
) -> Result<EventsPage> {
    let mut stmt = tx.prepare_cached(
        "SELECT seq, json FROM run_events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    )?;
    let rows: Vec<(i64, String)> = stmt
        .query_map(params![id, after_seq as i64, limit as i64 + 1], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let more = rows.len() > limit;
    let mut events = Vec::with_capacity(rows.len().min(limit));
    let mut last = after_seq;
    for (seq, json) in rows.into_iter().take(limit) {
        last = seq as u64;
        events.extend(decode_event_row(id, seq, &json));
    }
    Ok(EventsPage {
        events,
        next_after_seq: more.then_some(last),
    })
}

/// Every stored event of `id`, in seq order (a corrupt row skipped and logged), page by page.
pub(super) fn all_events_in(tx: &Connection, id: &str) -> Result<Vec<Value>> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = events_in(tx, id, after, crate::store::EVENTS_MAX_LIMIT)?;
        events.extend(page.events);
        match page.next_after_seq {
            Some(n) => after = n,
            None => return Ok(events),
        }
    }
}

/// Write events into `run_events` keyed by seq (`INSERT OR REPLACE`: an identical retry is a no-op): a
/// record's events from [`put_in`], a live run's from the ledger's `append`.
pub(super) fn insert_events(
    tx: &Connection,
    run_id: &str,
    rows: impl IntoIterator<Item = (u64, String)>,
) -> Result<()> {
    let rows: Vec<(i64, String)> = rows
        .into_iter()
        .map(|(seq, json)| (seq as i64, json))
        .collect();
    let rows: Vec<[&dyn rusqlite::ToSql; 2]> = rows
        .iter()
        .map(|(seq, json)| [seq as _, json as _])
        .collect();
    Ok(super::insert_rows(
        tx,
        "INSERT INTO run_events (run_id, seq, json)",
        "ON CONFLICT (run_id, seq) DO UPDATE SET json = excluded.json WHERE json IS NOT excluded.json",
        &run_id,
        &rows,
    )?)
}

/// A live run's events strictly after `after_seq`, in seq order, at most `limit` (the ledger's
/// `live_events`). A corrupt row is skipped and logged.
pub(super) fn live_events_in(
    tx: &Connection,
    run_id: &RunId,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<Value>> {
    let mut stmt = tx.prepare_cached(
        "SELECT seq, json FROM run_events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![run_id, after_seq as i64, limit as i64], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for r in rows {
        let (seq, json) = r?;
        out.extend(decode_event_row(run_id, seq, &json));
    }
    Ok(out)
}

/// Whether `run_id` has a `runs` row (final or provisional), whatever the policy.
pub(super) fn has_record(tx: &Connection, run_id: &str) -> Result<bool> {
    Ok(tx
        .prepare_cached("SELECT 1 FROM runs WHERE run_id = ?1")?
        .exists([run_id])?)
}

/// Delete every `run_events` row of `run_id` (an abandoned run without a record leaves none behind).
pub(super) fn delete_events(tx: &Connection, run_id: &str) -> Result<()> {
    tx.prepare_cached("DELETE FROM run_events WHERE run_id = ?1")?
        .execute([run_id])?;
    Ok(())
}

/// Delete `run_id`'s record and every event, live or not (a killed run's purge); answers the rows removed.
pub(super) fn purge_in(tx: &Connection, run_id: &RunId) -> Result<usize> {
    let mut n = 0;
    for sql in [
        "DELETE FROM runs WHERE run_id = ?1",
        "DELETE FROM run_events WHERE run_id = ?1",
    ] {
        n += tx.prepare_cached(sql)?.execute([run_id])?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::validate_record;
    use crate::sqlite::{SqliteStore, Synchronous};
    use crate::store::RunStore;

    /// SQLite's plan of `sql`: one line a step (`EXPLAIN QUERY PLAN`'s detail column).
    fn query_plan(tx: &Connection, sql: &str, params: Vec<SqlValue>) -> Vec<String> {
        tx.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map(params_from_iter(params), |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    /// The triggers keep `run_totals` equal to a count and a sum over `runs` through every write: a first
    /// put, a rewrite (tombstone to final), an unchanged repeat, a card closed (the bytes change), a
    /// delete, and the oldest shed when a put takes the store past `max_runs`.
    #[test]
    fn the_stored_totals_follow_every_write_of_the_runs_table() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let now = 1_800_000_000_000;
        let record = |id: &str, at: i64, provisional: bool, card: bool| {
            let mut v = serde_json::json!({
                "id": id, "channelId": "C1", "userId": "U1", "threadKey": "t", "startedAt": at - 10,
                "finishedAt": at, "status": "completed", "eventCount": 1, "storedEventCount": 1,
                "truncated": false,
                "events": [{"seq": 1, "type": "answer", "text": format!("answer of {id}")}]
            });
            if provisional {
                v["provisional"] = serde_json::json!(true);
            }
            if card {
                v["card"] = serde_json::json!({"channel": "C1", "ts": "1.2"});
            }
            validate_record(&v).unwrap()
        };
        let check = |s: &mut SqliteStore, runs: i64| {
            let tx = s.conn.transaction().unwrap();
            let exact: (i64, i64) = tx
                .query_row(
                    "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM runs",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .unwrap();
            assert_eq!(totals(&tx).unwrap(), Some(exact));
            assert_eq!(exact.0, runs);
        };
        s.put(&record("a", now - 50, true, false), None, now)
            .unwrap();
        check(&mut s, 1);
        s.put(&record("a", now - 40, false, true), None, now)
            .unwrap();
        s.put(&record("a", now - 40, false, true), None, now)
            .unwrap();
        check(&mut s, 1);
        assert!(s.close_card(&RunId::from("a")).unwrap());
        check(&mut s, 1);
        s.put(&record("b", now - 30, false, false), None, now)
            .unwrap();
        s.put(&record("c", now - 20, false, false), None, now)
            .unwrap();
        check(&mut s, 3);
        assert!(s.delete(&RunId::from("b")).unwrap());
        check(&mut s, 2);
        // A policy of two runs: the third put sheds the oldest, and the totals say two.
        let policy = PolicyProposal {
            policy: RetentionPolicy {
                retention_days: 30,
                max_runs: 2,
                max_bytes: 1 << 30,
            },
            updated_at: now,
        };
        s.put(&record("d", now - 10, false, false), Some(&policy), now)
            .unwrap();
        check(&mut s, 2);
        assert_eq!(
            s.get(&RunId::from("a"), now).unwrap(),
            None,
            "the oldest went"
        );
        assert!(s.get(&RunId::from("d"), now).unwrap().is_some());
    }

    /// Within policy, a list page is ONE indexed SELECT: no table scan and no sort step.
    #[test]
    fn a_page_within_policy_is_one_indexed_select() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let now = 1_800_000_000_000;
        for i in 0..50 {
            let r = validate_record(&serde_json::json!({
                "id": format!("r{i}"), "channelId": format!("C{}", i % 3), "userId": "U1", "threadKey": "t",
                "startedAt": now - 100, "finishedAt": now - i, "status": "completed", "eventCount": 0,
                "storedEventCount": 0, "truncated": false, "events": []
            }))
            .unwrap();
            s.put(&r, None, now).unwrap();
        }
        let tx = s.conn.transaction().unwrap();
        let policy = read_policy(&tx).unwrap().policy;
        let kept = kept(&tx, &policy, now).unwrap();
        assert_eq!(kept, Kept::All);
        let cursor = crate::store::Cursor {
            finished_at: now - 10,
            id: Some("r10".into()),
        };
        for query in [
            ListQuery::visible_to(VisibilityFilter::All),
            ListQuery {
                before: Some(cursor.clone()),
                ..ListQuery::visible_to(VisibilityFilter::All)
            },
            ListQuery {
                agent: Some("demo".into()),
                ..ListQuery::visible_to(VisibilityFilter::All)
            },
            ListQuery {
                status: Some(crate::record::RunStatus::Failed),
                ..ListQuery::visible_to(VisibilityFilter::All)
            },
            ListQuery {
                parent_run_id: Some(RunId::from("r1")),
                ..ListQuery::visible_to(VisibilityFilter::All)
            },
            ListQuery {
                status: Some(crate::record::RunStatus::Completed),
                before: Some(cursor.clone()),
                ..ListQuery::visible_to(VisibilityFilter::All)
            },
            ListQuery::visible_to(VisibilityFilter::UserIs { id: "U1".into() }),
            // A search reads rows in listing order and stops at the limit: no sort step.
            ListQuery {
                search: crate::store::Search::new("r1"),
                before: Some(cursor.clone()),
                ..ListQuery::visible_to(VisibilityFilter::All)
            },
        ] {
            let (sql, params) = list_sql(&query, &kept, policy.cutoff_ms(now)).expect("a query");
            assert_eq!(sql.matches("SELECT").count(), 1, "{sql}");
            let plan = query_plan(&tx, &sql, params);
            eprintln!("{sql}\n  plan: {plan:?}");
            assert!(
                plan.iter()
                    .all(|step| step.contains("USING INDEX")
                        || step.contains("USING COVERING INDEX")),
                "{plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{plan:?}"
            );
        }
        // The partial indexes serve the listings they were cut for.
        for (query, index) in [
            (
                ListQuery {
                    status: Some(crate::record::RunStatus::Completed),
                    ..ListQuery::visible_to(VisibilityFilter::All)
                },
                "runs_by_status",
            ),
            (
                ListQuery {
                    parent_run_id: Some(RunId::from("r1")),
                    ..ListQuery::visible_to(VisibilityFilter::All)
                },
                "runs_by_parent",
            ),
        ] {
            let (sql, params) = list_sql(&query, &kept, policy.cutoff_ms(now)).expect("a query");
            let plan = query_plan(&tx, &sql, params);
            assert!(plan.iter().any(|step| step.contains(index)), "{plan:?}");
        }
    }

    /// The orphan sweep's worklist is one SELECT over the partial index `runs_open_cards`: no table scan,
    /// no sort step, no record JSON read — with the policy keeping everything and with a floor.
    #[test]
    fn open_cards_is_one_select_over_the_partial_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let now = 1_800_000_000_000;
        for i in 0..50 {
            let r = validate_record(&serde_json::json!({
                "id": format!("r{i}"), "channelId": "C1", "userId": "U1", "threadKey": "t",
                "startedAt": now - 100, "finishedAt": now - i, "status": "completed", "eventCount": 0,
                "storedEventCount": 0, "truncated": false, "events": [],
                "card": {"channel": "C1", "ts": format!("{i}")}, "cardClosed": i % 2 == 0
            }))
            .unwrap();
            s.put(&r, None, now).unwrap();
        }
        let tx = s.conn.transaction().unwrap();
        let open: i64 = tx
            .query_row("SELECT COUNT(*) FROM runs WHERE card_open = 1", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(open, 25, "the writer set the column");
        for kept in [Kept::All, Kept::From(now - 40, "r40".into())] {
            let (sql, params) = open_cards_sql(now, 10, &kept, now - 1_000).expect("a query");
            assert_eq!(sql.matches("SELECT").count(), 1, "{sql}");
            let plan = query_plan(&tx, &sql, params);
            assert!(
                plan.iter().all(|step| step.contains("runs_open_cards")),
                "{plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{plan:?}"
            );
        }
        assert_eq!(open_cards_sql(now, 10, &Kept::Nothing, now - 1_000), None);
    }

    /// What trimming picks is exactly what the floor does not keep, for every kind of floor (a `From`
    /// below the age cutoff included), and it is found by a range of `runs_by_finish`, never a scan of
    /// every stored row (which a finish paid before, as `NOT (kept)` is no range to SQLite).
    #[test]
    fn trimming_takes_the_complement_of_the_floor_by_one_index_range() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).unwrap();
        let now = 1_800_000_000_000;
        for i in 0..40 {
            let r = validate_record(&serde_json::json!({
                "id": format!("r{:02}", i % 20), "channelId": "C1", "userId": "U1", "threadKey": "t",
                "startedAt": now - 100, "finishedAt": now - (i / 2) * 10, "status": "completed",
                "eventCount": 0, "storedEventCount": 0, "truncated": false, "events": []
            }))
            .unwrap();
            s.put(&r, None, now).unwrap();
        }
        let tx = s.conn.transaction().unwrap();
        let ids = |sql: &str, p: Vec<SqlValue>| -> std::collections::BTreeSet<String> {
            tx.prepare(sql)
                .unwrap()
                .query_map(params_from_iter(p), |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        let all = ids("SELECT run_id FROM runs", vec![]);
        assert_eq!(all.len(), 20);
        let cutoff = now - 120;
        for kept in [
            Kept::All,
            Kept::From(now - 50, "r05".into()),
            Kept::From(now - 50, "r10".into()),
            Kept::From(now - 500, "r00".into()),
            Kept::Nothing,
        ] {
            let mut p = Vec::new();
            let keep = kept.sql(cutoff, &mut p);
            p.truncate(keep.matches('?').count());
            let kept_ids = ids(&format!("SELECT run_id FROM runs WHERE {keep}"), p);
            let (sql, p) = doomed_sql(&kept, cutoff, 1_000);
            let doomed = ids(sql, p.clone());
            assert!(kept_ids.is_disjoint(&doomed), "{kept:?}");
            assert_eq!(
                kept_ids
                    .union(&doomed)
                    .cloned()
                    .collect::<std::collections::BTreeSet<_>>(),
                all,
                "{kept:?}"
            );
            if !matches!(kept, Kept::Nothing) {
                let plan = query_plan(&tx, sql, p);
                assert!(
                    plan.iter()
                        .all(|step| step.starts_with("SEARCH") && step.contains("runs_by_finish")),
                    "{kept:?}: {plan:?}"
                );
            }
        }
    }
}
