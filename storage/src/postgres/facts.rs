//! What a put and a seal decide on, each read in one statement: a put's facts ([`PutFacts`]), a
//! finish's successor facts ([`successor_facts`]), a seal's gate with both ([`seal_gate`]) — the seal's
//! one read before it writes, so a run's end costs two round trips (this read and the `COMMIT`)
//! instead of four — and an admission's thread read with its tombstone's put facts
//! ([`admission_facts`]; three round trips to two).
//!
//! **Callers:** `records.rs` (`put_in`), `ledger.rs` (`successor_facts`, `seal_gate`, `finish`),
//! `admission.rs` (`admit_in`).

use postgres::Row;

use super::live::{live_row, maybe_live_row, row_columns, ROW_COLUMN_COUNT};
use super::owner::owned_from;
use super::Db;
use crate::ledger::{LiveRow, Outcome, SuccessorFacts};
use crate::record::RunStatus;
use crate::store::PolicyProposal;
use crate::{Error, Result, RunId};

/// The key of the retention policy's row in `meta`.
pub(super) const POLICY_KEY: &str = "retention_policy";

/// The facts of a put of `$id` as one row (`$key`: [`POLICY_KEY`], `$cutoff`: the cutoff the stale count
/// is for), in [`PutFacts::decode`]'s order.
macro_rules! put_facts_sql {
    ($id:literal, $key:literal, $cutoff:literal) => {
        concat!(
            "SELECT EXISTS (SELECT 1 FROM deletion_fences WHERE run_id = ",
            $id,
            ") AS killed,
                (SELECT value FROM meta WHERE key = ",
            $key,
            ") AS policy,
                EXISTS (SELECT 1 FROM live_runs WHERE run_id = ",
            $id,
            ") AS live,
                r.provisional, r.digest, r.bytes AS row_bytes, r.finished_at,
                t.runs AS total_runs, t.bytes AS total_bytes,
                (SELECT COUNT(*) FROM runs WHERE finished_at < ",
            $cutoff,
            ") AS stale
             FROM (VALUES (1)) AS one LEFT JOIN runs r ON r.run_id = ",
            $id,
            " LEFT JOIN run_totals t ON t.id = 1"
        )
    };
}

/// The successor's facts of `$1` after the live row's columns: its highest step record and its inbox as
/// two arrays in seq order (decoded by [`successor_facts_from`]).
macro_rules! successor_columns {
    () => {
        "(SELECT json FROM run_steps s WHERE s.run_id = $1 ORDER BY step DESC LIMIT 1),
         (SELECT array_agg(seq ORDER BY seq) FROM run_inbox i WHERE i.run_id = $1),
         (SELECT array_agg(json ORDER BY seq) FROM run_inbox i WHERE i.run_id = $1)"
    };
}

const PUT_FACTS: &str = put_facts_sql!("$1", "$2", "$3");

const SUCCESSOR_FACTS: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", ",
    successor_columns!(),
    " FROM live_runs WHERE run_id = $1"
);

/// A seal's one read: the live row (all NULL without one), its successor's facts, and the facts of the
/// put of its record — whose `killed` is the owner check's fence too.
const SEAL_FACTS: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", ",
    successor_columns!(),
    ", p.* FROM (",
    put_facts_sql!("$1", "$2", "$3"),
    ") p LEFT JOIN live_runs ON live_runs.run_id = $1"
);

/// An admission's thread read with the facts of its tombstone's put (`$1` the thread, `$2` the run
/// id, `$3` [`POLICY_KEY`], `$4` the cutoff): the thread's live row (all NULL without one), then the
/// put's facts — whose `killed` is the fence of the admitted id the admission checks too.
const ADMISSION_FACTS: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", p.* FROM (",
    put_facts_sql!("$2", "$3", "$4"),
    ") p LEFT JOIN live_runs ON live_runs.thread_key = $1"
);

/// Where the put's facts start in [`SEAL_FACTS`]: after the row and the three successor columns.
const SEAL_PUT_AT: usize = ROW_COLUMN_COUNT + 3;

/// The stored totals (`run_totals`) and how many rows are past a cutoff.
#[derive(Debug, Clone, Copy)]
pub(super) struct Totals {
    pub(super) runs: i64,
    pub(super) bytes: i64,
    pub(super) stale: i64,
}

/// The stored row a put replaces.
#[derive(Debug)]
pub(super) struct Existing {
    pub(super) provisional: bool,
    pub(super) digest: String,
    pub(super) bytes: i64,
    pub(super) finished_at: i64,
}

/// Everything a put decides on, read before it writes: whether the id was killed, the stored policy,
/// whether the run is live, the row it has, and the stored totals with the rows past `guess` (the cutoff
/// of the proposed policy; the put moves them by its own write).
#[derive(Debug)]
pub(super) struct PutFacts {
    pub(super) killed: bool,
    pub(super) policy: Option<String>,
    pub(super) live: bool,
    pub(super) existing: Option<Existing>,
    pub(super) totals: Option<Totals>,
    pub(super) guess: i64,
}

impl PutFacts {
    /// The facts once this transaction deleted the run's live row (a finish): not live.
    pub(super) fn ended(self) -> Self {
        PutFacts {
            live: false,
            ..self
        }
    }

    /// The facts once this transaction inserted the run's live row (an admission): live.
    pub(super) fn started(self) -> Self {
        PutFacts { live: true, ..self }
    }

    /// The cutoff a put with `proposal` counts the stale rows for.
    pub(super) fn guess(proposal: Option<&PolicyProposal>, now_ms: i64) -> i64 {
        proposal.map_or(i64::MIN, |p| p.policy.cutoff_ms(now_ms))
    }

    /// The facts of a put of `run_id` with `proposal`, in one statement.
    pub(super) fn read(
        c: &mut Db,
        run_id: &str,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<Self> {
        let guess = Self::guess(proposal, now_ms);
        let row = c.query_one(PUT_FACTS, &[&run_id, &POLICY_KEY, &guess])?;
        Self::decode(&row, 0, guess)
    }

    /// The facts [`put_facts_sql`] selects, from column `at` of `row`.
    fn decode(row: &Row, at: usize, guess: i64) -> Result<Self> {
        let existing = row
            .try_get::<_, Option<bool>>(at + 3)?
            .map(|provisional| -> Result<Existing> {
                Ok(Existing {
                    provisional,
                    digest: row.try_get(at + 4)?,
                    bytes: row.try_get(at + 5)?,
                    finished_at: row.try_get(at + 6)?,
                })
            })
            .transpose()?;
        let totals = row
            .try_get::<_, Option<i64>>(at + 7)?
            .map(|runs| -> Result<Totals> {
                Ok(Totals {
                    runs,
                    bytes: row.try_get(at + 8)?,
                    stale: row.try_get(at + 9)?,
                })
            })
            .transpose()?;
        Ok(PutFacts {
            killed: row.try_get(at)?,
            policy: row.try_get(at + 1)?,
            live: row.try_get(at + 2)?,
            existing,
            totals,
            guess,
        })
    }
}

/// The successor's facts of a row of [`SUCCESSOR_FACTS`] or [`SEAL_FACTS`], whose live row is `row`.
fn successor_facts_from(r: &Row, row: LiveRow) -> Result<SuccessorFacts> {
    let at = ROW_COLUMN_COUNT;
    let last_step = r
        .try_get::<_, Option<String>>(at)?
        .map(|j| serde_json::from_str(&j).map_err(|e| Error::corrupt("run_steps.json", e)))
        .transpose()?;
    let seqs: Vec<i64> = r
        .try_get::<_, Option<Vec<i64>>>(at + 1)?
        .unwrap_or_default();
    let messages: Vec<String> = r
        .try_get::<_, Option<Vec<String>>>(at + 2)?
        .unwrap_or_default();
    Ok(SuccessorFacts {
        row,
        last_step,
        inbox: seqs
            .into_iter()
            .zip(messages)
            .map(|(seq, json)| super::ledger::inbox_item(seq, Ok(json)))
            .collect::<Result<_>>()?,
    })
}

/// [`RunLedger::successor_facts`](crate::ledger::RunLedger::successor_facts) in one statement.
pub(super) fn successor_facts(c: &mut Db, run_id: &RunId) -> Result<Option<SuccessorFacts>> {
    c.query_opt(SUCCESSOR_FACTS, &[&run_id])?
        .map(|r| successor_facts_from(&r, live_row(&r)?))
        .transpose()
}

/// [`RunLedger::seal_gate`](crate::ledger::RunLedger::seal_gate) in one statement: the owner check,
/// the finishing gate of `status`, the successor's facts, and — kept for the seal's finish
/// ([`Db::read_ahead`]) — the facts of the put of `run_id` with `proposal`. Nothing the seal writes
/// between this read and its finish's put (its last step: `transcript`, `run_events`, `run_steps`)
/// changes the put's facts but `live`, which the finish knows (it deleted the row).
pub(super) fn seal_gate(
    c: &mut Db,
    run_id: &RunId,
    gen: &str,
    status: RunStatus,
    proposal: Option<&PolicyProposal>,
    now_ms: i64,
) -> Result<Outcome<SuccessorFacts>> {
    let guess = PutFacts::guess(proposal, now_ms);
    let r = c.query_one(SEAL_FACTS, &[&run_id, &POLICY_KEY, &guess])?;
    let put = PutFacts::decode(&r, SEAL_PUT_AT, guess)?;
    let row = match owned_from(c, run_id, gen, maybe_live_row(&r)?, put.killed)? {
        Ok(row) => row,
        Err(refusal) => return Ok(Err(refusal)),
    };
    if let Err(refusal) = crate::ledger::gate(&row, status) {
        return Ok(Err(refusal));
    }
    let facts = successor_facts_from(&r, row)?;
    c.read_ahead(run_id, put);
    Ok(Ok(facts))
}

/// An admission's first read with its tombstone's put facts, in one statement: the live row of
/// `thread_key`, whether `run_id` is fenced, and the facts of a put of `run_id` counting stale rows for
/// `guess` (as [`PutFacts::read`] reads them now: before the admission's own writes).
pub(super) fn admission_facts(
    c: &mut Db,
    thread_key: &str,
    run_id: &RunId,
    guess: i64,
) -> Result<(Option<LiveRow>, PutFacts)> {
    let r = c.query_one(
        ADMISSION_FACTS,
        &[&thread_key, &run_id, &POLICY_KEY, &guess],
    )?;
    Ok((
        maybe_live_row(&r)?,
        PutFacts::decode(&r, ROW_COLUMN_COUNT, guess)?,
    ))
}
