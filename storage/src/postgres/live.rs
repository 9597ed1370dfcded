//! Reads of the ledger's `live_runs` and `deletion_fences` tables shared by the ledger (`ledger.rs`) and
//! the finished-run SQL (`records.rs`): decoding a live row, finding it by run or by thread (with a fence, [`row_and_fence`]), and the two
//! facts a history write must respect — [`is_live`] and [`is_killed`]. Mirrors `sqlite/live.rs`.

use crate::RunId;
use postgres::Row;

use super::Db;
use serde_json::{Map, Value};

use crate::ledger::{LiveRow, Phase, StopMode};
use crate::{Error, Result};

/// The `live_runs` columns [`live_row`] decodes, in its order, as a literal (for `concat!`).
macro_rules! row_columns {
    () => {
        "run_id, thread_key, owner_gen, lease_until, started_at, phase, stop, meta_json, \
         system_text, tools_json, state_json"
    };
}
pub(super) use row_columns;

/// The statement of [`row_and_fence`] looking the row up by `$col`: the row's columns (all NULL
/// without a row) and the fence of `$2`, one row always.
macro_rules! concat_row_and_fence {
    ($col:literal) => {
        concat!(
            "SELECT ",
            row_columns!(),
            ", f.killed ",
            "FROM (SELECT EXISTS (SELECT 1 FROM deletion_fences WHERE run_id = $2) AS killed) f ",
            "LEFT JOIN live_runs ON ",
            $col,
            " = $1"
        )
    };
}

/// The `live_runs` columns [`live_row`] decodes, in its order.
pub(super) const ROW_COLUMNS: &str = row_columns!();

/// How many columns [`ROW_COLUMNS`] names (a column selected after them has this index).
pub(super) const ROW_COLUMN_COUNT: usize = 11;

fn json_col(row: &Row, i: usize, what: &'static str) -> Result<Value> {
    let s: String = row.try_get(i)?;
    serde_json::from_str(&s).map_err(|e| Error::corrupt(what, e))
}

/// Decode one `live_runs` row selected with [`ROW_COLUMNS`]; a corrupt column is [`Error::Corrupt`] naming it.
pub(super) fn live_row(row: &Row) -> Result<LiveRow> {
    let phase: String = row.try_get(5)?;
    let stop: Option<String> = row.try_get(6)?;
    let state = match json_col(row, 10, "live_runs.state_json")? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    Ok(LiveRow {
        run_id: row.try_get(0)?,
        thread_key: row.try_get(1)?,
        owner_gen: row.try_get(2)?,
        lease_until: row.try_get(3)?,
        started_at: row.try_get(4)?,
        phase: Phase::parse(&phase).ok_or_else(|| Error::corrupt("live_runs.phase", &phase))?,
        stop: match stop {
            None => None,
            Some(s) => {
                Some(StopMode::parse(&s).ok_or_else(|| Error::corrupt("live_runs.stop", &s))?)
            }
        },
        meta: json_col(row, 7, "live_runs.meta_json")?,
        system_text: row.try_get(8)?,
        tools: json_col(row, 9, "live_runs.tools_json")?,
        state,
    })
}

/// Decode every row of a query selecting [`ROW_COLUMNS`].
pub(super) fn live_rows(rows: Vec<Row>) -> Result<Vec<LiveRow>> {
    rows.iter().map(live_row).collect()
}

/// The live row of `run_id`, if any.
pub(super) fn get_row(c: &mut Db, run_id: &RunId) -> Result<Option<LiveRow>> {
    c.query_opt(
        &format!("SELECT {ROW_COLUMNS} FROM live_runs WHERE run_id = $1"),
        &[&run_id],
    )?
    .as_ref()
    .map(live_row)
    .transpose()
}

/// Where [`row_and_fence`] looks a live row up.
#[derive(Clone, Copy)]
pub(super) enum By {
    Run,
    Thread,
}

/// In one statement: the live row whose run id (or thread key) is `key`, and whether `fenced_id`
/// carries a deletion fence.
pub(super) fn row_and_fence(
    c: &mut Db,
    by: By,
    key: &str,
    fenced_id: &str,
) -> Result<(Option<LiveRow>, bool)> {
    let sql = match by {
        By::Run => concat_row_and_fence!("run_id"),
        By::Thread => concat_row_and_fence!("thread_key"),
    };
    let found = c.query_one(sql, &[&key, &fenced_id])?;
    let killed: bool = found.try_get(ROW_COLUMN_COUNT)?;
    Ok((maybe_live_row(&found)?, killed))
}

/// Decode the live row of a statement that selects [`ROW_COLUMNS`] from an outer join: `None` when they
/// are NULL (no row).
pub(super) fn maybe_live_row(row: &Row) -> Result<Option<LiveRow>> {
    match row.try_get::<_, Option<String>>(0)? {
        Some(_) => live_row(row).map(Some),
        None => Ok(None),
    }
}

/// Whether `run_id` carries a deletion fence (SPEC §4.3 `kill`).
pub(super) fn is_killed(c: &mut Db, run_id: &RunId) -> Result<bool> {
    Ok(c.query_opt(
        "SELECT 1 FROM deletion_fences WHERE run_id = $1",
        &[&run_id],
    )?
    .is_some())
}

/// Whether `run_id` has a live row: its `run_events` are then the ledger's, not the history's.
pub(super) fn is_live(c: &mut Db, run_id: &str) -> Result<bool> {
    Ok(
        c.query_opt("SELECT 1 FROM live_runs WHERE run_id = $1", &[&run_id])?
            .is_some(),
    )
}
