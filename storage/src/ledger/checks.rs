//! What every backend checks before an owner write lands, the same on each: whether the writer owns
//! the run ([`fence_refusal`], [`view_refusal`] over [`decisions::fence_check`]), and which events and
//! transcript parts may be stored ([`check_events`], [`check_turns`]), and the finishing [`gate`].

use crate::RunId;
use serde_json::Value;

use super::{decisions, LiveRow, Outcome, Phase, Refusal, Turn, MAX_TRANSCRIPT_PART_BYTES};
use crate::record::RunStatus;

/// Validate an append batch: the rows that may land (`(seq, event, json)`), and the first refusal among
/// the rest. An event without a numeric `seq` or over 64 KiB is refused alone; its neighbours land.
pub fn check_events(events: &[Value]) -> (Vec<(u64, &Value, String)>, Option<Refusal>) {
    let mut rows = Vec::with_capacity(events.len());
    let mut refused = None;
    for (index, e) in events.iter().enumerate() {
        let Some(seq) = crate::record::event_seq(e) else {
            refused.get_or_insert(Refusal::EventWithoutSeq { index });
            continue;
        };
        let json = e.to_string();
        if json.len() > crate::record::MAX_EVENT_BYTES {
            refused.get_or_insert(Refusal::EventTooLarge {
                seq,
                bytes: json.len(),
            });
            continue;
        }
        rows.push((seq, e, json));
    }
    (rows, refused)
}

/// Validate transcript parts: each part's JSON at most [`MAX_TRANSCRIPT_PART_BYTES`].
pub fn check_turns(first_idx: u64, turns: &[Turn]) -> Outcome<Vec<(u64, u64, String)>> {
    let mut rows = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        let idx = first_idx + i as u64;
        for (p, part) in turn.parts.iter().enumerate() {
            let json = serde_json::json!({"role": turn.role, "part": part}).to_string();
            if json.len() > MAX_TRANSCRIPT_PART_BYTES {
                return Err(Refusal::PartTooLarge {
                    idx,
                    part: p as u64,
                    bytes: json.len(),
                });
            }
            rows.push((idx, p as u64, json));
        }
    }
    Ok(rows)
}

/// Map a fence decision to the refusal (or `None` for the owner).
pub fn fence_refusal(row: Option<&LiveRow>, run_id: &RunId, gen: &str) -> Option<Refusal> {
    view_refusal(row.map(LiveRow::view).as_ref(), run_id, gen)
}

/// [`fence_refusal`] over a row's ownership columns alone (a writer that needs nothing else of the row).
pub fn view_refusal(
    row: Option<&decisions::RowView<'_>>,
    run_id: &RunId,
    gen: &str,
) -> Option<Refusal> {
    match decisions::fence_check(row, gen) {
        decisions::Fence::Owner => None,
        decisions::Fence::Fenced => Some(Refusal::Fenced {
            run_id: run_id.to_owned(),
        }),
        decisions::Fence::UnknownRun => Some(Refusal::UnknownRun {
            run_id: run_id.to_owned(),
        }),
    }
}

/// What the finishing gate writes: the phase `finishing`, or the refusal — a phase that does not allow
/// it, or a stop recorded before a `completed` gate ([`decisions::stop_before_gate`]). Every backend's one
/// check, in the gate's transaction.
pub fn gate(row: &LiveRow, status: RunStatus) -> Outcome<Phase> {
    let next = decisions::phase_transition(row.phase, decisions::PhaseChange::Finishing).map_err(
        |wrong| Refusal::WrongPhase {
            run_id: row.run_id.clone(),
            phase: wrong.from,
            change: decisions::PhaseChange::Finishing.as_str(),
        },
    )?;
    match decisions::stop_before_gate(row.stop, status) {
        Some(mode) => Err(Refusal::StopPending {
            run_id: row.run_id.clone(),
            mode,
        }),
        None => Ok(next),
    }
}
