//! Approvals of tool calls (SPEC §13) as the ledger keeps them: the vocabulary of `state.approvals`, and
//! the two rules every backend applies in its transaction — the owner's phase change (park, unpark) and
//! a decision from any process (the first wins).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{decisions, merge_state, state_keys, LiveRow, Outcome, Phase, Refusal};

/// A person's decision on a tool call (SPEC §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approve,
    Deny,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Deny => "deny",
        }
    }

    pub fn parse(s: &str) -> Option<Decision> {
        [Decision::Approve, Decision::Deny]
            .into_iter()
            .find(|d| d.as_str() == s)
    }
}

/// A decision as committed: what, who (`token:<name>`, `capability`, `slack:<user>`, `timeout`), an
/// optional note, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decided {
    pub decision: Decision,
    pub who: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub at: i64,
}

/// One tool call's approval (SPEC §13), kept in the row's `state.approvals` so it outlives any process:
/// requested when the run parked on it, decided by whoever answered first (a process that does not own
/// the run included), released by the owner once the decision's `approval_decided` event is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    pub tool: String,
    pub requested_at: i64,
    /// No decision by then: denied by `timeout`.
    pub deadline: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided: Option<Decided>,
    /// The owner applied the decision and the step's calls may have started: a released call in flight
    /// at a crash is settled like any call, an unreleased one certainly never ran.
    #[serde(default)]
    pub released: bool,
}

/// A run's approvals by call id.
pub type Approvals = std::collections::BTreeMap<String, Approval>;

/// The state patch that stores `approvals`.
pub fn approvals_patch(approvals: &Approvals) -> Map<String, Value> {
    let mut patch = Map::new();
    patch.insert(
        state_keys::APPROVALS.to_owned(),
        serde_json::to_value(approvals).unwrap_or_default(),
    );
    patch
}

/// What a decision found (like [`StopAnswer`]): who owns the run, and whether its lease is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecideAnswer {
    pub owner_gen: String,
    pub owner_lease_live: bool,
}

/// The owner's phase change `change` with `patch` merged into the row's state, applied to `row` (every
/// backend's one rule; the caller persists the row): the new phase, or `WrongPhase`.
pub fn change_phase(
    row: &mut LiveRow,
    change: decisions::PhaseChange,
    patch: &Map<String, Value>,
) -> Outcome<Phase> {
    let next =
        decisions::phase_transition(row.phase, change).map_err(|wrong| Refusal::WrongPhase {
            run_id: row.run_id.clone(),
            phase: wrong.from,
            change: change.as_str(),
        })?;
    let mut patch = patch.clone();
    // Approvals merge by call, never back: a decision another process committed after the owner read
    // the row stays (the first decision wins), and so does a release.
    if let Some(theirs) = patch.get(state_keys::APPROVALS) {
        let mut merged = row.approvals();
        let theirs: Approvals =
            serde_json::from_value(theirs.clone()).map_err(|_| Refusal::UnknownCall {
                run_id: row.run_id.clone(),
                call_id: "(unreadable approvals)".into(),
            })?;
        for (call, mut a) in theirs {
            if let Some(have) = merged.get(&call) {
                a.decided = have.decided.clone().or(a.decided);
                a.released |= have.released;
            }
            merged.insert(call, a);
        }
        patch.extend(approvals_patch(&merged));
    }
    merge_state(&mut row.state, &patch);
    row.phase = next;
    Ok(next)
}

/// A decision on `call_id`, applied to `row` (the caller persists its state): the first decision wins,
/// a call the run does not await is refused, and so is any decision once the run is past its gate (a
/// stop ended the wait; the call never runs).
pub fn decide(
    row: &mut LiveRow,
    call_id: &str,
    decided: &Decided,
    now_ms: i64,
) -> Outcome<DecideAnswer> {
    if row.phase == Phase::Finishing {
        return Err(Refusal::WrongPhase {
            run_id: row.run_id.clone(),
            phase: row.phase,
            change: "decide",
        });
    }
    let mut approvals = row.approvals();
    let Some(approval) = approvals.get_mut(call_id) else {
        return Err(Refusal::UnknownCall {
            run_id: row.run_id.clone(),
            call_id: call_id.to_owned(),
        });
    };
    if let Some(first) = &approval.decided {
        return Err(Refusal::AlreadyDecided {
            run_id: row.run_id.clone(),
            call_id: call_id.to_owned(),
            decided: first.clone(),
        });
    }
    approval.decided = Some(decided.clone());
    merge_state(&mut row.state, &approvals_patch(&approvals));
    Ok(DecideAnswer {
        owner_gen: row.owner_gen.clone(),
        owner_lease_live: !decisions::lease_expired(row.lease_until, now_ms),
    })
}
