//! Ownership checks of the live-run ledger on PostgreSQL (SPEC §4.3 fencing): whether `gen` owns a run
//! (its live row's `owner_gen`, and no deletion fence), answered with the row ([`owned`]) or without
//! it ([`owner_only`]), and the [`owner!`] macro every owner write opens with. A check that passed is
//! remembered for the rest of its transaction ([`Db::owner_passed`]). Mirrors `sqlite/ledger.rs`.

use super::live::{is_killed, row_and_fence, By};
use super::Db;
use crate::RunId;

use crate::ledger::decisions::{self, Phase};
use crate::ledger::{fence_refusal, view_refusal, LiveRow, Outcome, Refusal};
use crate::{Error, Result};

/// The fence refusal of a run with no live row: `Fenced` when it was killed, else `UnknownRun`.
fn no_row_refusal(c: &mut Db, run_id: &RunId, gen: &str) -> Result<Refusal> {
    if is_killed(c, run_id)? {
        return Ok(killed(run_id));
    }
    Ok(view_refusal(None, run_id, gen).expect("no row is always refused"))
}

/// The refusal of a write to a killed run (its owner, whoever it was, is fenced).
fn killed(run_id: &RunId) -> Refusal {
    Refusal::Fenced {
        run_id: run_id.to_owned(),
    }
}

/// The row when `gen` owns it, else the refusal. A killed run fences its owner. One round trip: the
/// row comes with whether a deletion fence stands (a second statement only when there is no row).
pub(super) fn owned(c: &mut Db, run_id: &RunId, gen: &str) -> Result<Outcome<LiveRow>> {
    let (row, fenced) = row_and_fence(c, By::Run, run_id, run_id)?;
    owned_from(c, run_id, gen, row, fenced)
}

/// [`owned`] deciding on `row` and `fenced` as a statement of the caller's read them.
pub(super) fn owned_from(
    c: &mut Db,
    run_id: &RunId,
    gen: &str,
    row: Option<LiveRow>,
    fenced: bool,
) -> Result<Outcome<LiveRow>> {
    if fenced {
        return Ok(Err(killed(run_id)));
    }
    Ok(match fence_refusal(row.as_ref(), run_id, gen) {
        Some(refusal) => Err(refusal),
        None => {
            c.owner_passed(run_id, gen);
            Ok(row.expect("fence_check passes only with a row"))
        }
    })
}

/// `Ok` when `gen` owns the run, else the refusal: [`owned`] reading only the row's ownership columns,
/// for a write that needs nothing else of the row (most of a run's writes).
pub(super) fn owner_only(c: &mut Db, run_id: &RunId, gen: &str) -> Result<Outcome<()>> {
    if c.owner_known(run_id, gen) {
        return Ok(Ok(()));
    }
    let found = c.query_opt(
        "SELECT owner_gen, phase, lease_until,
                EXISTS (SELECT 1 FROM deletion_fences f WHERE f.run_id = $1)
         FROM live_runs WHERE run_id = $1",
        &[&run_id],
    )?;
    let Some(found) = found else {
        return Ok(Err(no_row_refusal(c, run_id, gen)?));
    };
    if found.try_get::<_, bool>(3)? {
        return Ok(Err(killed(run_id)));
    }
    let (owner, phase): (String, String) = (found.try_get(0)?, found.try_get(1)?);
    let view = decisions::RowView {
        run_id,
        owner_gen: &owner,
        phase: Phase::parse(&phase).ok_or_else(|| Error::corrupt("live_runs.phase", &phase))?,
        lease_until: found.try_get(2)?,
    };
    Ok(match view_refusal(Some(&view), run_id, gen) {
        Some(refusal) => Err(refusal),
        None => {
            c.owner_passed(run_id, gen);
            Ok(())
        }
    })
}

/// Unwrap an owner check or return its refusal from the enclosing closure: `owner!(c, run, gen)`
/// checks only, `owner!(row: c, run, gen)` answers the row.
macro_rules! owner {
    (row: $c:expr, $run:expr, $gen:expr) => {
        match owned($c, $run, $gen)? {
            Ok(row) => row,
            Err(refusal) => return Ok(Err(refusal)),
        }
    };
    ($c:expr, $run:expr, $gen:expr) => {
        if let Err(refusal) = owner_only($c, $run, $gen)? {
            return Ok(Err(refusal));
        }
    };
}
pub(super) use owner;
