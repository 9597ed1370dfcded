//! SQL for the `runs` and `run_events` tables and the policy row of `meta` (SPEC §3): everything that
//! reads or writes a finished record, as free functions over one transaction. Mirrors `sqlite/records.rs`
//! function by function; the retention floor is the same [`Kept`].
//!
//! **Callers:** `runs.rs` ([`RunStore`](crate::store::RunStore)) and `ledger.rs` (`finish` upserts the
//! record with [`put_in`] inside its own transaction; `append` writes live events into `run_events`).
//! **Depends on:** [`super::live`] for [`is_live`] (a put reads the deletion fence in its own first statement).

use crate::RunId;
use std::collections::BTreeMap;

use super::Db;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::facts::{PutFacts, Totals, POLICY_KEY};
use super::live::is_live;
use super::{big, params, too_big, Params};
use crate::record::{
    is_valid_run_id, stored_event_seqs, RetentionPolicy, RunHead, RunListItem, RunRecord,
    VisibilityFilter,
};
use crate::sqlite::{within, Kept};
use crate::store::{
    clamp_future, decode_event_row, effective_open_cards_limit, EventsPage, Expired, ListQuery,
    PolicyProposal, PutOutcome, StoredPolicy, TRIM_PER_PUT,
};
use crate::{Error, Result};

/// The SQL predicate for "kept", binding its parameters.
fn kept_sql(kept: &Kept, cutoff: i64, p: &mut Params) -> String {
    match kept {
        Kept::All => format!("finished_at >= {}", p.push(cutoff)),
        Kept::From(f, id) => {
            let c = p.push(cutoff);
            format!(
                "finished_at >= {c} AND (finished_at, run_id) >= ({}, {})",
                p.push(*f),
                p.push(id.clone())
            )
        }
        Kept::Nothing => "FALSE".into(),
    }
}

pub(super) fn read_policy(c: &mut Db) -> Result<StoredPolicy> {
    let raw: Option<String> = c
        .query_opt("SELECT value FROM meta WHERE key = $1", &[&POLICY_KEY])?
        .map(|r| r.get(0));
    decode_policy(raw)
}

/// The policy stored as `raw` (the policy row's value; the default without one).
fn decode_policy(raw: Option<String>) -> Result<StoredPolicy> {
    let Some(raw) = raw else {
        return Ok(StoredPolicy::default());
    };
    let v: Value =
        serde_json::from_str(&raw).map_err(|e| Error::corrupt("meta.retention_policy", e))?;
    let num = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
    Ok(StoredPolicy {
        policy: RetentionPolicy::clamp(num("retentionDays"), num("maxRuns"), num("maxBytes")),
        updated_at: v.get("policyUpdatedAt").and_then(Value::as_i64),
    })
}

fn write_policy(c: &mut Db, p: &StoredPolicy) -> Result<()> {
    let v = serde_json::json!({
        "retentionDays": p.policy.retention_days,
        "maxRuns": p.policy.max_runs,
        "maxBytes": p.policy.max_bytes,
        "policyUpdatedAt": p.updated_at,
    });
    c.execute(
        "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        &[&POLICY_KEY, &v.to_string()],
    )?;
    Ok(())
}

/// Every stored run's count and bytes (`run_totals`, kept by triggers).
fn totals(c: &mut Db) -> Result<Option<(i64, i64)>> {
    Ok(
        c.query_opt("SELECT runs, bytes FROM run_totals WHERE id = 1", &[])?
            .map(|r| (r.get(0), r.get(1))),
    )
}

/// Decide the kept floor. When every stored run together is within both bounds, every in-cutoff row is
/// kept (one row read); else one aggregate over the in-cutoff rows, and a walk of the newest rows only
/// when a count or byte bound is exceeded.
pub(super) fn kept(c: &mut Db, policy: &RetentionPolicy, now_ms: i64) -> Result<Kept> {
    if totals(c)?.is_some_and(|t| within(policy, t)) {
        return Ok(Kept::All);
    }
    let cutoff = policy.cutoff_ms(now_ms);
    let row = c.query_one(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0)::BIGINT FROM runs WHERE finished_at >= $1",
        &[&cutoff],
    )?;
    if within(policy, (row.get(0), row.get(1))) {
        return Ok(Kept::All);
    }
    let rows = c.query(
        "SELECT finished_at, run_id, bytes FROM runs WHERE finished_at >= $1
         ORDER BY finished_at DESC, run_id DESC LIMIT $2",
        &[&cutoff, &i64::from(policy.max_runs)],
    )?;
    let (mut total, mut floor) = (0u64, Kept::Nothing);
    for row in rows {
        total += row.get::<_, i64>(2).max(0) as u64;
        if total > policy.max_bytes {
            break;
        }
        floor = Kept::From(row.get(0), row.get(1));
    }
    Ok(floor)
}

/// The SQL form of the visibility predicate (SPEC §2), over the `runs` listing columns.
fn visibility_sql(f: &VisibilityFilter, p: &mut Params) -> String {
    match f {
        VisibilityFilter::All => "TRUE".into(),
        VisibilityFilter::None => "FALSE".into(),
        VisibilityFilter::ChannelsIn { ids } if ids.is_empty() => "FALSE".into(),
        VisibilityFilter::ChannelsIn { ids } => {
            format!("channel_id = ANY({})", p.push(ids.clone()))
        }
        VisibilityFilter::UserIs { id } => format!("user_id = {}", p.push(id.clone())),
        VisibilityFilter::VisibilityIn { values } if values.is_empty() => "FALSE".into(),
        VisibilityFilter::VisibilityIn { values } => {
            let v: Vec<String> = values.iter().map(|v| v.as_str().to_owned()).collect();
            format!("channel_visibility = ANY({})", p.push(v))
        }
        VisibilityFilter::Or { of } | VisibilityFilter::And { of } if of.is_empty() => {
            "FALSE".into()
        }
        VisibilityFilter::Or { of } => {
            format!(
                "({})",
                of.iter()
                    .map(|g| visibility_sql(g, p))
                    .collect::<Vec<_>>()
                    .join(" OR ")
            )
        }
        VisibilityFilter::And { of } => {
            format!(
                "({})",
                of.iter()
                    .map(|g| visibility_sql(g, p))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            )
        }
    }
}

/// The one page query of `list` (SQL text and parameters); `None` when the filter matches nothing.
pub(super) fn list_sql(query: &ListQuery, kept: &Kept, cutoff: i64) -> Option<(String, Params)> {
    if matches!(kept, Kept::Nothing) || matches!(query.visible_to, VisibilityFilter::None) {
        return None;
    }
    let mut p = Params::default();
    let mut clauses = vec![kept_sql(kept, cutoff, &mut p)];
    if let Some(s) = query.since_ms {
        clauses.push(format!("finished_at >= {}", p.push(s)));
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
            clauses.push(format!("{col} = {}", p.push(v.clone())));
        }
    }
    if let Some(status) = query.status {
        clauses.push(format!(
            "status = {} AND NOT provisional",
            p.push(status.as_str().to_owned())
        ));
    }
    if let Some(search) = &query.search {
        // ASCII letters folded on both sides (`Search`'s rule, as SQLite's LIKE): `lower` would fold
        // other letters too, by the database's locale.
        let fold = |col: &str| {
            format!("translate({col}, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')")
        };
        clauses.push(format!(
            r"({} LIKE {} ESCAPE '\' OR {} LIKE {} ESCAPE '\')",
            fold("run_id"),
            p.push(search.like_prefix()),
            fold("label"),
            p.push(search.like_contains())
        ));
    }
    if let Some(cur) = &query.before {
        let f = p.push(cur.finished_at);
        match &cur.id {
            Some(id) => clauses.push(format!(
                "(finished_at, run_id) < ({f}, {})",
                p.push(id.clone())
            )),
            None => clauses.push(format!("finished_at < {f}")),
        }
    }
    if !matches!(query.visible_to, VisibilityFilter::All) {
        clauses.push(visibility_sql(&query.visible_to, &mut p));
    }
    let limit = p.push(big(query.effective_limit()));
    let sql = format!(
        "SELECT summary_json, bytes FROM runs WHERE {} ORDER BY finished_at DESC, run_id DESC LIMIT {limit}",
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

/// What one statement tells of `id`'s visibility ([`summary_fast`]); a value of the moment, never
/// stored, so its variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub(super) enum Summary {
    /// The stored runs are within the policy's bounds: the row, when the policy keeps it, and whether
    /// the id carries a deletion fence.
    Known(Option<RunListItem>, bool),
    /// A bound is exceeded: the floor decides ([`visible_summary`]).
    NeedsFloor,
}

/// The listing row of `id` in one statement when the stored runs are within the policy's bounds
/// (then every row younger than the age cutoff is kept): the policy, the totals and the row together,
/// with the deletion fence of `id`.
pub(super) fn summary_fast(c: &mut Db, id: &str, now_ms: i64) -> Result<Summary> {
    let Some(row) = c.query_opt(
        "SELECT (SELECT value FROM meta WHERE key = $2), t.runs, t.bytes,
                r.summary_json, r.bytes, r.finished_at,
                EXISTS (SELECT 1 FROM deletion_fences WHERE run_id = $1)
         FROM run_totals t LEFT JOIN runs r ON r.run_id = $1 WHERE t.id = 1",
        &[&id, &POLICY_KEY],
    )?
    else {
        return Ok(Summary::NeedsFloor);
    };
    let policy = decode_policy(row.get(0))?.policy;
    if !within(&policy, (row.get(1), row.get(2))) {
        return Ok(Summary::NeedsFloor);
    }
    let summary: Option<String> = row.get(3);
    let item = match summary {
        Some(summary) if row.get::<_, i64>(5) >= policy.cutoff_ms(now_ms) => {
            Some(decode_item(&summary, row.get(4))?)
        }
        _ => None,
    };
    Ok(Summary::Known(item, row.get(6)))
}

/// The listing row of `id` when it is visible under the policy.
pub(super) fn visible_summary(c: &mut Db, id: &str, now_ms: i64) -> Result<Option<RunListItem>> {
    if let Summary::Known(item, _) = summary_fast(c, id, now_ms)? {
        return Ok(item);
    }
    floor_summary(c, id, now_ms)
}

/// [`visible_summary`] decided by the retention floor alone (right whatever the bounds; what it answers
/// when [`summary_fast`] cannot).
pub(super) fn floor_summary(c: &mut Db, id: &str, now_ms: i64) -> Result<Option<RunListItem>> {
    let policy = read_policy(c)?.policy;
    let kept = kept(c, &policy, now_ms)?;
    let mut p = Params::default();
    let idp = p.push(id.to_owned());
    let sql = format!(
        "SELECT summary_json, bytes FROM runs WHERE run_id = {idp} AND {}",
        kept_sql(&kept, policy.cutoff_ms(now_ms), &mut p)
    );
    let row = c.query_opt(&sql, &p.refs())?;
    row.map(|r| decode_item(&r.get::<_, String>(0), r.get(1)))
        .transpose()
}

/// Delete a run's row and, unless it is live, its events.
pub(super) fn delete_run(c: &mut Db, id: &str) -> Result<bool> {
    if !is_live(c, id)? {
        c.execute("DELETE FROM run_events WHERE run_id = $1", &[&id])?;
    }
    Ok(c.execute("DELETE FROM runs WHERE run_id = $1", &[&id])? > 0)
}

fn encode(record: &RunRecord) -> Result<(String, String)> {
    let summary = serde_json::to_string(&record.head).map_err(|e| Error::corrupt("record", e))?;
    let full = serde_json::to_vec(record).map_err(|e| Error::corrupt("record", e))?;
    Ok((summary, hex::encode(Sha256::digest(&full))))
}

/// Every stored run's count and bytes, and how many of them are older than `cutoff`, in one statement.
fn totals_and_stale(c: &mut Db, cutoff: i64) -> Result<Option<((i64, i64), i64)>> {
    Ok(c.query_opt(
        "SELECT runs, bytes, (SELECT COUNT(*) FROM runs WHERE finished_at < $1)
             FROM run_totals WHERE id = 1",
        &[&cutoff],
    )?
    .map(|r| ((r.get(0), r.get(1)), r.get(2))))
}

/// Rows the policy keeps (a put's `retained`).
fn retained(c: &mut Db, policy: &RetentionPolicy, now_ms: i64) -> Result<u64> {
    if let Some((t, stale)) =
        totals_and_stale(c, policy.cutoff_ms(now_ms))?.filter(|(t, _)| within(policy, *t))
    {
        return Ok((t.0 - stale).max(0) as u64);
    }
    let kept = kept(c, policy, now_ms)?;
    let mut p = Params::default();
    let sql = format!(
        "SELECT COUNT(*) FROM runs WHERE {}",
        kept_sql(&kept, policy.cutoff_ms(now_ms), &mut p)
    );
    Ok(c.query_one(&sql, &p.refs())?.get::<_, i64>(0).max(0) as u64)
}

/// Upsert `record` inside the open transaction: the shared body of `put` (and of the ledger's `finish`).
pub(super) fn put_in(
    c: &mut Db,
    record: &RunRecord,
    proposal: Option<&PolicyProposal>,
    now_ms: i64,
) -> Result<PutOutcome> {
    let facts = PutFacts::read(c, &record.head.id, proposal, now_ms)?;
    put_decided(c, record, proposal, now_ms, facts)
}

/// [`put_in`] deciding on `facts`, read in this transaction by one statement for everything the put
/// decides on (the retention answer's totals before the write, moved by it below).
pub(super) fn put_decided(
    c: &mut Db,
    record: &RunRecord,
    proposal: Option<&PolicyProposal>,
    now_ms: i64,
    facts: PutFacts,
) -> Result<PutOutcome> {
    if !is_valid_run_id(&record.head.id) {
        return Err(Error::InvalidRecord(crate::record::RecordError::BadId));
    }
    let mut stored_policy = decode_policy(facts.policy)?;
    let killed = facts.killed;
    if !killed && stored_policy.consider(proposal, now_ms) {
        write_policy(c, &stored_policy)?;
    }
    let policy = stored_policy.policy;
    let cutoff = policy.cutoff_ms(now_ms);
    // The totals and the rows past the cutoff, as this put leaves them: read before its write when the
    // statement counted for this policy's cutoff, then moved by the write below (`None`: read back after
    // the write).
    let mut totals: Option<Totals> = facts.totals.filter(|_| cutoff == facts.guess);
    let counted = totals.is_some();
    // A killed id takes no record ever again (SPEC §4.3 `kill`).
    if killed {
        return Ok(PutOutcome {
            stored: false,
            rewritten: false,
            retained: retained_from(c, &policy, now_ms, totals)?,
        });
    }
    let mut record = clamp_future(record, now_ms);
    // A live run's events are the ledger's: a put while it lives writes only the runs row.
    let live = facts.live;
    if live {
        record.events.clear();
    }
    let id = record.head.id.as_str();
    let existing = facts.existing;
    // The tombstone floor: a provisional write never replaces a final record.
    if record.head.provisional && existing.as_ref().is_some_and(|e| !e.provisional) {
        return Ok(PutOutcome {
            stored: true,
            rewritten: false,
            retained: retained_from(c, &policy, now_ms, totals)?,
        });
    }
    let (summary, digest) = encode(&record)?;
    let bytes = big(record.encoded_len());
    let unchanged = existing.as_ref().is_some_and(|e| e.digest == digest);
    if !unchanged {
        let h = &record.head;
        let rows: Vec<(u64, String)> = stored_event_seqs(&record.events)
            .into_iter()
            .zip(record.events.iter().map(|ev| ev.to_string()))
            .collect();
        #[rustfmt::skip]
        let mut p = params![
            id.to_owned(), h.finished_at, h.started_at, h.agent.clone(), h.channel_id.clone(),
            h.user_id.clone(), h.thread_key.clone(), h.channel_visibility.as_str(),
            h.parent_run_id.clone(), h.status.as_str(), h.provisional, big(h.event_count), bytes,
            digest, now_ms, summary, h.card_open(), h.label.clone(),
        ];
        let sql = if live {
            // A live run's events are the ledger's (cleared above): the row alone.
            debug_assert!(rows.is_empty());
            PUT_ROW
        } else {
            let (seqs, jsons) = by_seq(rows)?;
            p.push(seqs);
            p.push(jsons);
            PUT_ROW_REPLACING_EVENTS
        };
        c.execute_later(sql, p)?;
        // What the triggers of migration 5 do to the totals, and this row to the count past the cutoff.
        if let Some(t) = &mut totals {
            let past = |finished_at: i64| i64::from(finished_at < cutoff);
            match &existing {
                Some(old) => {
                    t.bytes += bytes - old.bytes;
                    t.stale += past(h.finished_at) - past(old.finished_at);
                }
                None => {
                    t.runs += 1;
                    t.bytes += bytes;
                    t.stale += past(h.finished_at);
                }
            }
        }
    }
    let rewritten = existing.is_some() && !unchanged;
    if !counted {
        // Counted for another cutoff (no proposal, or a newer stored policy): read them back.
        totals = totals_and_stale(c, cutoff)?.map(|((runs, bytes), stale)| Totals {
            runs,
            bytes,
            stale,
        });
    }
    if let Some(t) = totals.filter(|t| within(&policy, (t.runs, t.bytes))) {
        // Within both bounds every row younger than the cutoff is kept (`Kept::All`): only rows past
        // it go, and this record stays exactly when it is not one of them. One statement told all.
        if t.stale > 0 {
            trim(c, &Kept::All, cutoff, TRIM_PER_PUT)?;
        }
        let stored = record.head.finished_at >= cutoff;
        if !stored {
            delete_run(c, id)?;
        }
        return Ok(PutOutcome {
            stored,
            rewritten,
            retained: (t.runs - t.stale).max(0) as u64,
        });
    }
    let shed = shed_oldest(c, &policy)?;
    let kept_now = kept(c, &policy, now_ms)?;
    trim(c, &kept_now, cutoff, TRIM_PER_PUT - shed)?;
    // The record itself goes regardless when the policy does not keep it.
    let stored = visible(c, id, &kept_now, cutoff)?;
    if !stored {
        delete_run(c, id)?;
    }
    Ok(PutOutcome {
        stored,
        rewritten,
        retained: retained(c, &policy, now_ms)?,
    })
}

/// [`retained`] from totals already read in this transaction, when they are within the policy.
fn retained_from(
    c: &mut Db,
    policy: &RetentionPolicy,
    now_ms: i64,
    totals: Option<Totals>,
) -> Result<u64> {
    match totals.filter(|t| within(policy, (t.runs, t.bytes))) {
        Some(t) => Ok((t.runs - t.stale).max(0) as u64),
        None => retained(c, policy, now_ms),
    }
}

/// The one query of [`RunStore::open_cards`](crate::store::RunStore::open_cards) (SQL text and
/// parameters), over the partial index `runs_open_cards`; `None` when the policy keeps nothing.
pub(super) fn open_cards_sql(
    finished_before: i64,
    limit: usize,
    kept: &Kept,
    cutoff: i64,
) -> Option<(String, Params)> {
    if matches!(kept, Kept::Nothing) {
        return None;
    }
    let mut p = Params::default();
    let before = p.push(finished_before);
    let keep_sql = kept_sql(kept, cutoff, &mut p);
    let limit = p.push(big(effective_open_cards_limit(limit)));
    let sql = format!(
        "SELECT run_id FROM runs WHERE card_open AND finished_at <= {before} AND {keep_sql}
         ORDER BY finished_at ASC, run_id ASC LIMIT {limit}"
    );
    Some((sql, p))
}

/// [`RunStore::open_cards`](crate::store::RunStore::open_cards) inside one transaction.
pub(super) fn open_cards_in(
    c: &mut Db,
    finished_before: i64,
    limit: usize,
    now_ms: i64,
) -> Result<Vec<RunId>> {
    let policy = read_policy(c)?.policy;
    let kept = kept(c, &policy, now_ms)?;
    let Some((sql, p)) = open_cards_sql(finished_before, limit, &kept, policy.cutoff_ms(now_ms))
    else {
        return Ok(Vec::new());
    };
    Ok(c.query(&sql, &p.refs())?.iter().map(|r| r.get(0)).collect())
}

/// [`RunStore::close_card`](crate::store::RunStore::close_card) inside one transaction, as SQLite's
/// `close_card_in`: the head gains `cardClosed: true`, the digest and size become those [`put_in`] would
/// store for the closed record, and a head that does not decode only loses its `card_open`.
pub(super) fn close_card_in(c: &mut Db, id: &str) -> Result<bool> {
    let Some(row) = c.query_opt(
        "SELECT summary_json FROM runs WHERE run_id = $1 AND card_open",
        &[&id],
    )?
    else {
        return Ok(false);
    };
    let mut head = match serde_json::from_str::<RunHead>(&row.get::<_, String>(0)) {
        Ok(head) => head,
        Err(e) => {
            let problem = crate::DecodeProblem::of(&e);
            tracing::warn!(
                run_id = id,
                problem = problem.as_str(),
                "a runs row with an open card does not decode; took it off the open cards"
            );
            c.execute(
                "UPDATE runs SET card_open = FALSE WHERE run_id = $1",
                &[&id],
            )?;
            return Ok(false);
        }
    };
    let changed = head.close_card();
    let events = if is_live(c, id)? {
        Vec::new()
    } else {
        all_events_in(c, id)?
    };
    let record = RunRecord { head, events };
    let (summary, digest) = encode(&record)?;
    c.execute(
        "UPDATE runs SET summary_json = $2, digest = $3, bytes = $4, card_open = $5 WHERE run_id = $1",
        &[
            &id,
            &summary,
            &digest,
            &big(record.encoded_len()),
            &record.head.card_open(),
        ],
    )?;
    Ok(changed)
}

/// While the stored runs together exceed a bound, the oldest goes (at most [`TRIM_PER_PUT`]): what
/// the newest-first floor of [`kept`] would leave out, found by the index from the old end instead of a
/// walk of every kept row. (Rows past the age cutoff are the oldest: they go first, as the floor never
/// counts them.)
fn shed_oldest(c: &mut Db, policy: &RetentionPolicy) -> Result<usize> {
    let mut shed = 0;
    while shed < TRIM_PER_PUT && totals(c)?.is_some_and(|t| !within(policy, t)) {
        let oldest: Option<String> = c
            .query_opt(
                "SELECT run_id FROM runs ORDER BY finished_at ASC, run_id ASC LIMIT 1",
                &[],
            )?
            .map(|r| r.get(0));
        let Some(id) = oldest else { break };
        delete_run(c, &id)?;
        shed += 1;
    }
    if shed > 0 {
        tracing::info!(trimmed = shed, "retention shed the oldest finished runs");
    }
    Ok(shed)
}

/// Trim by the persisted policy, oldest first, at most `limit` runs; answers how many went.
fn trim(c: &mut Db, kept: &Kept, cutoff: i64, limit: usize) -> Result<usize> {
    if limit == 0 {
        return Ok(0);
    }
    // One range of `runs_by_finish` from its old end (see [`Kept::doomed_before`]).
    let mut p = Params::default();
    let doomed_sql = match kept.doomed_before(cutoff) {
        Some((f, id)) => format!(
            "(finished_at, run_id) < ({}, {})",
            p.push(f),
            p.push(id.to_owned())
        ),
        None => "TRUE".into(),
    };
    let limit = p.push(big(limit));
    let doomed: Vec<String> = c
        .query(&format!("SELECT run_id FROM runs WHERE {doomed_sql} ORDER BY finished_at ASC, run_id ASC LIMIT {limit}"), &p.refs())?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !doomed.is_empty() {
        tracing::info!(trimmed = doomed.len(), "retention trimmed finished runs");
    }
    for d in &doomed {
        delete_run(c, d)?;
    }
    Ok(doomed.len())
}

/// [`crate::store::RunStore::expire`] inside one transaction.
pub(super) fn expire_in(c: &mut Db, now_ms: i64, scan_after: &str) -> Result<Expired> {
    let policy = read_policy(c)?.policy;
    let kept_now = kept(c, &policy, now_ms)?;
    let runs = trim(c, &kept_now, policy.cutoff_ms(now_ms), TRIM_PER_PUT)?;
    let scanned: Vec<String> = c
        .query(
            "SELECT DISTINCT run_id FROM run_events WHERE run_id > $1 ORDER BY run_id LIMIT $2",
            &[&scan_after, &big(TRIM_PER_PUT)],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut orphaned = 0;
    for run_id in &scanned {
        if c.query_opt("SELECT 1 FROM runs WHERE run_id = $1", &[run_id])?
            .is_none()
            && !is_live(c, run_id)?
        {
            c.execute("DELETE FROM run_events WHERE run_id = $1", &[run_id])?;
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

fn visible(c: &mut Db, id: &str, kept: &Kept, cutoff: i64) -> Result<bool> {
    let mut p = Params::default();
    let idp = p.push(id.to_owned());
    let sql = format!(
        "SELECT 1 FROM runs WHERE run_id = {idp} AND {}",
        kept_sql(kept, cutoff, &mut p)
    );
    Ok(c.query_opt(&sql, &p.refs())?.is_some())
}

/// A page of `run_events` strictly after `after_seq` (a cursor past `i64::MAX` is past every row).
pub(super) fn events_in(c: &mut Db, id: &str, after_seq: u64, limit: usize) -> Result<EventsPage> {
    let Ok(after) = i64::try_from(after_seq) else {
        return Ok(EventsPage {
            events: Vec::new(),
            next_after_seq: None,
        });
    };
    let rows = c.query(
        "SELECT seq, json FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        &[&id, &after, &big(limit).saturating_add(1)],
    )?;
    let more = rows.len() > limit;
    let mut events = Vec::with_capacity(rows.len().min(limit));
    let mut last = after_seq;
    for row in rows.iter().take(limit) {
        let (seq, json): (i64, String) = (row.get(0), row.get(1));
        last = seq as u64;
        events.extend(decode_event_row(id, seq, &json));
    }
    Ok(EventsPage {
        events,
        next_after_seq: more.then_some(last),
    })
}

/// Every stored event of `id`, in seq order (a corrupt row skipped and logged), page by page.
pub(super) fn all_events_in(c: &mut Db, id: &str) -> Result<Vec<Value>> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = events_in(c, id, after, crate::store::EVENTS_MAX_LIMIT)?;
        events.extend(page.events);
        match page.next_after_seq {
            Some(n) => after = n,
            None => return Ok(events),
        }
    }
}

/// The upsert of a record's `runs` row from `$1` … `$18`.
macro_rules! upsert_run {
    () => {
        "INSERT INTO runs (run_id, finished_at, started_at, agent, channel_id, user_id, thread_key,
            channel_visibility, parent_run_id, status, provisional, event_count, bytes, digest, stored_at, summary_json,
            card_open, label)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
         ON CONFLICT (run_id) DO UPDATE SET finished_at = EXCLUDED.finished_at, started_at = EXCLUDED.started_at,
            agent = EXCLUDED.agent, channel_id = EXCLUDED.channel_id, user_id = EXCLUDED.user_id,
            thread_key = EXCLUDED.thread_key, channel_visibility = EXCLUDED.channel_visibility,
            parent_run_id = EXCLUDED.parent_run_id, status = EXCLUDED.status, provisional = EXCLUDED.provisional,
            event_count = EXCLUDED.event_count, bytes = EXCLUDED.bytes, digest = EXCLUDED.digest,
            stored_at = EXCLUDED.stored_at, summary_json = EXCLUDED.summary_json, card_open = EXCLUDED.card_open,
            label = EXCLUDED.label"
    };
}

/// The upsert of `$1`'s events from the arrays `$seqs` and `$jsons`, writing only what changed.
macro_rules! upsert_events {
    ($seqs:literal, $jsons:literal) => {
        concat!(
            "INSERT INTO run_events (run_id, seq, json) SELECT $1, s, j FROM UNNEST(",
            $seqs,
            "::BIGINT[], ",
            $jsons,
            "::text[]) AS t(s, j)
             ON CONFLICT (run_id, seq) DO UPDATE SET json = EXCLUDED.json
             WHERE run_events.json IS DISTINCT FROM EXCLUDED.json"
        )
    };
}

/// A put's row, while the run is live (its events are the ledger's).
const PUT_ROW: &str = upsert_run!();

/// A put's row and, replacing the run's rows, the record's events (`$19` seqs, `$20` JSON), in one
/// statement: the rows the record does not hold go and the upsert leaves the ones it holds as they
/// are (a finish rewrites nothing it kept). Each part writes rows no other part writes.
const PUT_ROW_REPLACING_EVENTS: &str = concat!(
    "WITH r AS (",
    upsert_run!(),
    "), gone AS (DELETE FROM run_events WHERE run_id = $1 AND NOT (seq = ANY($19::BIGINT[]))) ",
    upsert_events!("$19", "$20")
);

/// Write events into `run_events` keyed by seq (an upsert: an identical retry is a no-op; within one
/// batch the last event of a seq wins, as SQLite's `INSERT OR REPLACE` in order does). One statement.
pub(super) fn insert_events(
    c: &mut Db,
    run_id: &str,
    rows: impl IntoIterator<Item = (u64, String)>,
) -> Result<()> {
    let (seqs, jsons) = by_seq(rows)?;
    if seqs.is_empty() {
        return Ok(());
    }
    c.execute_later(
        upsert_events!("$2", "$3"),
        params![run_id.to_owned(), seqs, jsons],
    )
}

/// Rows as two arrays in seq order, the last of a repeated seq winning (one statement updates a row once).
fn by_seq(rows: impl IntoIterator<Item = (u64, String)>) -> Result<(Vec<i64>, Vec<String>)> {
    let mut by_seq = BTreeMap::new();
    for (seq, json) in rows {
        by_seq.insert(
            i64::try_from(seq).map_err(|_| too_big("run_events.seq", seq))?,
            json,
        );
    }
    Ok(by_seq.into_iter().unzip())
}

/// A live run's events strictly after `after_seq`, in seq order, at most `limit`. A corrupt row is
/// skipped and logged.
pub(super) fn live_events_in(
    c: &mut Db,
    run_id: &RunId,
    after_seq: u64,
    limit: usize,
) -> Result<Vec<Value>> {
    let Ok(after) = i64::try_from(after_seq) else {
        return Ok(Vec::new());
    };
    let rows = c.query(
        "SELECT seq, json FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        &[&run_id, &after, &big(limit)],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let (seq, json): (i64, String) = (row.get(0), row.get(1));
        out.extend(decode_event_row(run_id, seq, &json));
    }
    Ok(out)
}

/// Whether `run_id` has a `runs` row (final or provisional), whatever the policy.
pub(super) fn has_record(c: &mut Db, run_id: &str) -> Result<bool> {
    Ok(
        c.query_opt("SELECT 1 FROM runs WHERE run_id = $1", &[&run_id])?
            .is_some(),
    )
}

/// Delete every `run_events` row of `run_id`.
pub(super) fn delete_events(c: &mut Db, run_id: &str) -> Result<()> {
    c.execute("DELETE FROM run_events WHERE run_id = $1", &[&run_id])?;
    Ok(())
}

/// Delete `run_id`'s record and every event, live or not (a killed run's purge); answers the rows removed.
pub(super) fn purge_in(c: &mut Db, run_id: &RunId) -> Result<u64> {
    let mut n = 0;
    for sql in [
        "DELETE FROM runs WHERE run_id = $1",
        "DELETE FROM run_events WHERE run_id = $1",
    ] {
        n += c.execute(sql, &[&run_id])?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postgres::PgStore;
    use crate::record::validate_record;
    use crate::store::RunStore;

    /// The orphan sweep's worklist is one SELECT over the partial index `runs_open_cards` with no sort
    /// step, with the policy keeping everything and with a floor (a session prices sequential scans
    /// out: [`super::super::session_settings`]).
    #[test]
    fn open_cards_is_one_select_over_the_partial_index() {
        let mut s = PgStore::open(&crate::testing::pg::database()).expect("open");
        let now = 1_800_000_000_000;
        for i in 0..50 {
            let r = validate_record(&serde_json::json!({
                "id": format!("r{i}"), "channelId": "C1", "userId": "U1", "threadKey": "t",
                "startedAt": now - 100, "finishedAt": now - i, "status": "completed", "eventCount": 0,
                "storedEventCount": 0, "truncated": false, "events": [],
                "card": {"channel": "C1", "ts": format!("{i}")}, "cardClosed": i % 2 == 0
            }))
            .expect("valid");
            s.put(&r, None, now).expect("put");
        }
        s.read(|c| {
            let open: i64 = c
                .query_one("SELECT COUNT(*) FROM runs WHERE card_open", &[])?
                .get(0);
            assert_eq!(open, 25, "the writer set the column");
            for kept in [Kept::All, Kept::From(now - 40, "r40".into())] {
                let (sql, p) = open_cards_sql(now, 10, &kept, now - 1_000).expect("a query");
                assert_eq!(sql.matches("SELECT").count(), 1, "{sql}");
                let plan = c.explain(&sql, &p.refs())?;
                assert!(plan.contains("runs_open_cards"), "{plan}");
                assert!(!plan.contains("Sort"), "{plan}");
            }
            Ok(())
        })
        .expect("explain");
        assert!(open_cards_sql(now, 10, &Kept::Nothing, now - 1_000).is_none());
    }

    /// The trigger keeps `run_totals` equal to a count and a sum over `runs` through every write: a
    /// first put, a rewrite (tombstone to final, an upsert), an unchanged repeat, a card closed (the
    /// bytes change), a delete, and the oldest shed when a put takes the store past `max_runs`.
    #[test]
    fn the_stored_totals_follow_every_write_of_the_runs_table() {
        let mut s = PgStore::open(&crate::testing::pg::database()).expect("open");
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
            validate_record(&v).expect("valid")
        };
        let check = |s: &mut PgStore, runs: i64| {
            s.read(|c| {
                let r = c.query_one(
                    "SELECT COUNT(*), COALESCE(SUM(bytes), 0)::BIGINT FROM runs",
                    &[],
                )?;
                let exact: (i64, i64) = (r.get(0), r.get(1));
                assert_eq!(totals(c)?, Some(exact));
                assert_eq!(exact.0, runs);
                Ok(())
            })
            .expect("totals");
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
}
