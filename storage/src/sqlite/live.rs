//! Reads of the ledger's tables (SPEC §4.1), for the ledger and the history: decoding a live row,
//! finding it by run or by thread, whether a generation owns it ([`owned`], [`owner_only`]), a run's
//! inbox and last step, and the two facts the history's writes must respect — whether a run is
//! live ([`is_live`]) and whether it was killed ([`is_killed`]).
//!
//! **Callers:** the ledger (`ledger.rs`), for every decision it reads rows for, and the finished-run SQL
//! (`records.rs`), before it writes or trims a record. It imports neither: both point down to it. The
//! writes to these tables are the ledger's own and stay in `ledger.rs`.

use crate::RunId;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{Map, Value};

use crate::ledger::decisions::RowView;
use crate::ledger::{
    fence_refusal, view_refusal, InboxItem, LiveRow, Outcome, Phase, Refusal, StepRecord, StopMode,
};
use crate::{Error, Result};

/// The row when `gen` owns it, else the refusal. A killed run fences its owner.
pub(super) fn owned(tx: &Connection, run_id: &RunId, gen: &str) -> Result<Outcome<LiveRow>> {
    if is_killed(tx, run_id)? {
        return Ok(Err(Refusal::Fenced {
            run_id: run_id.to_owned(),
        }));
    }
    let row = get_row(tx, run_id)?;
    Ok(match fence_refusal(row.as_ref(), run_id, gen) {
        Some(refusal) => Err(refusal),
        None => Ok(row.expect("fence_check passes only with a row")),
    })
}

/// `Ok` when `gen` owns the run, else the refusal: [`owned`] reading only the row's ownership columns
/// and the fence, in one statement, for a write that needs nothing else of the row (most of a run's
/// writes; decoding the row's JSON columns was a twelfth of the storage thread's samples).
pub(super) fn owner_only(tx: &Connection, run_id: &RunId, gen: &str) -> Result<Outcome<()>> {
    let (killed, cols): (bool, Option<(String, String, i64)>) = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM deletion_fences WHERE run_id = ?1), l.owner_gen, l.phase, l.lease_until
             FROM (SELECT 1) LEFT JOIN live_runs l ON l.run_id = ?1",
        )?
        .query_row([run_id], |r| {
            let owner: Option<String> = r.get(1)?;
            let cols = match owner {
                None => None,
                Some(owner) => Some((owner, r.get(2)?, r.get(3)?)),
            };
            Ok((r.get(0)?, cols))
        })?;
    if killed {
        return Ok(Err(Refusal::Fenced {
            run_id: run_id.to_owned(),
        }));
    }
    let view = match &cols {
        None => None,
        Some((owner, phase, lease_until)) => Some(RowView {
            run_id,
            owner_gen: owner,
            phase: Phase::parse(phase)
                .ok_or_else(|| Error::corrupt("live_runs.phase", phase.clone()))?,
            lease_until: *lease_until,
        }),
    };
    Ok(match view_refusal(view.as_ref(), run_id, gen) {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    })
}

/// The `live_runs` columns [`live_row`] decodes, in its order.
pub(super) const ROW_COLUMNS: &str =
    "run_id, thread_key, owner_gen, lease_until, started_at, phase, stop, meta_json, \
                           system_text, tools_json, state_json";

fn json_col(row: &Row, i: usize, what: &'static str) -> rusqlite::Result<Value> {
    let s: String = row.get(i)?;
    serde_json::from_str(&s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            Box::new(CorruptColumn(what, e.to_string())),
        )
    })
}

#[derive(Debug)]
struct CorruptColumn(&'static str, String);
impl std::fmt::Display for CorruptColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "corrupt {}: {}", self.0, self.1)
    }
}
impl std::error::Error for CorruptColumn {}

fn bad_text(i: usize, what: &'static str, v: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        i,
        rusqlite::types::Type::Text,
        Box::new(CorruptColumn(what, v.to_owned())),
    )
}

/// Decode one `live_runs` row selected with [`ROW_COLUMNS`]; a corrupt column is a conversion error naming it.
pub(super) fn live_row(row: &Row) -> rusqlite::Result<LiveRow> {
    let phase: String = row.get(5)?;
    let stop: Option<String> = row.get(6)?;
    let state = match json_col(row, 10, "live_runs.state_json")? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    Ok(LiveRow {
        run_id: row.get(0)?,
        thread_key: row.get(1)?,
        owner_gen: row.get(2)?,
        lease_until: row.get(3)?,
        started_at: row.get(4)?,
        phase: Phase::parse(&phase).ok_or_else(|| bad_text(5, "live_runs.phase", &phase))?,
        stop: match stop {
            None => None,
            Some(s) => Some(StopMode::parse(&s).ok_or_else(|| bad_text(6, "live_runs.stop", &s))?),
        },
        meta: json_col(row, 7, "live_runs.meta_json")?,
        system_text: row.get(8)?,
        tools: json_col(row, 9, "live_runs.tools_json")?,
        state,
    })
}

/// The live row of `run_id`, if any.
pub(super) fn get_row(tx: &Connection, run_id: &RunId) -> Result<Option<LiveRow>> {
    Ok(tx
        .prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM live_runs WHERE run_id = ?1"
        ))?
        .query_row([run_id], live_row)
        .optional()?)
}

/// The live row holding `thread_key` (`thread_key UNIQUE`), if any.
pub(super) fn row_by_thread(tx: &Connection, thread_key: &str) -> Result<Option<LiveRow>> {
    Ok(tx
        .prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM live_runs WHERE thread_key = ?1"
        ))?
        .query_row([thread_key], live_row)
        .optional()?)
}

/// Whether `run_id` carries a deletion fence (SPEC §4.3 `kill`): it takes no record, claim or admission again.
pub(super) fn is_killed(tx: &Connection, run_id: &RunId) -> Result<bool> {
    Ok(tx
        .prepare_cached("SELECT 1 FROM deletion_fences WHERE run_id = ?1")?
        .exists([run_id])?)
}

/// Whether `run_id` has a live row: its `run_events` are then the ledger's, not the history's.
pub(super) fn is_live(tx: &Connection, run_id: &str) -> Result<bool> {
    Ok(tx
        .prepare_cached("SELECT 1 FROM live_runs WHERE run_id = ?1")?
        .exists([run_id])?)
}

pub(super) fn inbox_after(
    tx: &Connection,
    run_id: &str,
    after: Option<u64>,
) -> Result<Vec<InboxItem>> {
    let mut stmt = tx.prepare_cached(
        "SELECT seq, json FROM run_inbox WHERE run_id = ?1 AND seq > ?2 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![run_id, after.unwrap_or(0) as i64], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })?;
    rows.map(|r| {
        let (seq, json) = r?;
        let message =
            serde_json::from_str(&json).map_err(|e| Error::corrupt("run_inbox.json", e))?;
        Ok(InboxItem {
            seq: seq as u64,
            message,
        })
    })
    .collect()
}

pub(super) fn last_step(tx: &Connection, run_id: &RunId) -> Result<Option<StepRecord>> {
    let json: Option<String> = tx
        .prepare_cached("SELECT json FROM run_steps WHERE run_id = ?1 ORDER BY step DESC LIMIT 1")?
        .query_row([run_id], |r| r.get(0))
        .optional()?;
    json.map(|j| serde_json::from_str(&j).map_err(|e| Error::corrupt("run_steps.json", e)))
        .transpose()
}
