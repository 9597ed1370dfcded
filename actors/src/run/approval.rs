//! The approval gate (SPEC §13): a step's calls of tools that need a person's yes wait for it before any
//! call of the step runs.
//!
//! In order, each write one ledger transaction: the `approval_requested` events of calls not yet
//! requested, with their [`Approval`]s in `state.approvals` and the phase `awaiting_approval` (park);
//! then the wait — decisions land in the row from any process ([`storage::ledger::decide`]), a decision
//! made here nudges the wait, one made elsewhere is read at the next poll, a call past its deadline is
//! denied by `timeout` (first decision wins, so a person racing the timeout is either taken or told
//! 409); then the `approval_decided` events with the approvals marked released and the phase `live`
//! (unpark). Only then do the step's calls run: a denied call's result is `{denied: true, note}`.
//!
//! Invariants: a call is never run before its decision is committed with its event; an unreleased
//! approval means none of the step's calls ran (a resume parks again, or applies a decision that came
//! while no process held the run); a stop recorded on the row ends the wait and nothing of the step
//! runs. A resumed run never requests the same call twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use serde_json::{json, Value};
use storage::ledger::decisions::PhaseChange;
use storage::ledger::{approvals_patch, Approval, Approvals, Decided, Decision, Refusal, StopMode};
use storage::record::RunEvent;

use super::work::{retry_transient, summarize};
use super::{publish, RunDeps};
use crate::agent::ToolCall;

/// Largest call input an `approval_requested` event carries whole (JSON bytes); a larger one is left out
/// (its summary stays), so the event always fits the 64 KiB an event may weigh.
const MAX_INPUT_BYTES: usize = 16 << 10;

/// How often a parked run reads its row for decisions taken by other processes (and its stop).
const POLL: Duration = Duration::from_secs(1);

/// How a wait ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Passed {
    /// Every call is decided and released: run the step, denied calls answered by their decision.
    Decided(BTreeMap<String, Decided>),
    /// A stop is recorded on the row: nothing of the step runs.
    Stopped(StopMode),
    /// Another generation owns the run, or it is gone.
    Fenced,
    /// Storage stayed unavailable past the lease.
    Lost,
}

/// One step's wait for approvals, over owned inputs.
pub(super) struct ApprovalGate {
    pub deps: RunDeps,
    pub id: RunId,
    pub gen: String,
    pub step: u64,
    /// The step's calls that need a decision.
    pub calls: Vec<ToolCall>,
    pub timeout_ms: i64,
    /// Woken by a decision taken in this process, and by a stop.
    pub nudge: Arc<tokio::sync::Notify>,
}

impl ApprovalGate {
    pub async fn pass(self) -> Passed {
        let s = &self.deps.storage;
        // Park, requesting what was never requested (a resumed run parks again without a second request).
        let Some(row) = self.read().await else {
            return Passed::Lost;
        };
        let Some(row) = row.filter(|r| r.owner_gen == self.gen) else {
            return Passed::Fenced;
        };
        let mut approvals = row.approvals();
        let now = self.deps.clock.now_ms();
        let mut requested = Vec::new();
        for call in &self.calls {
            if approvals.contains_key(&call.call_id) {
                continue;
            }
            approvals.insert(
                call.call_id.clone(),
                Approval {
                    tool: call.tool.clone(),
                    requested_at: now,
                    deadline: now.saturating_add(self.timeout_ms),
                    decided: None,
                    released: false,
                },
            );
            let input = call.args.to_string();
            let event = RunEvent::ApprovalRequested {
                stamp: Default::default(),
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                input: (input.len() <= MAX_INPUT_BYTES).then(|| redacted(&self.deps, &call.args)),
                summary: summarize(&self.deps, &input),
                step: self.step,
            };
            requested.extend(publish(&self.deps, &self.id, event, false));
        }
        match self.change(PhaseChange::Park, requested, &approvals).await {
            Some(true) => {}
            Some(false) => return Passed::Fenced,
            None => return Passed::Lost,
        }
        tracing::info!(run_id = %self.id, generation = %self.gen, calls = self.calls.len(), "parked awaiting approval");
        // Wait for every decision (or the stop).
        let decided = loop {
            let row = match s.get_live(self.id.clone()).await {
                Ok(Some(row)) if row.owner_gen == self.gen => row,
                Ok(_) => return Passed::Fenced,
                Err(e) => {
                    tracing::warn!(run_id = %self.id, error = %e, "approval wait: the row did not read");
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            if let Some(mode) = row.stop {
                return Passed::Stopped(mode);
            }
            approvals = row.approvals();
            let now = self.deps.clock.now_ms();
            let mut open = Vec::new();
            let mut timed_out = false;
            for call in &self.calls {
                match approvals.get(&call.call_id) {
                    Some(a) if a.decided.is_some() => {}
                    Some(a) if a.deadline <= now => {
                        timed_out |= self.time_out(&call.call_id, now).await
                    }
                    Some(a) => open.push(a.deadline),
                    None => return Passed::Fenced, // the row is not the one this gate parked
                }
            }
            if timed_out {
                continue; // read back what was decided
            }
            if open.is_empty()
                && self
                    .calls
                    .iter()
                    .all(|c| approvals[&c.call_id].decided.is_some())
            {
                break self.decisions(&approvals);
            }
            // A timeout that could not be recorded is tried again at the next poll.
            let until = open.iter().min().map_or(POLL, |d| {
                Duration::from_millis(u64::try_from(d - now).unwrap_or(0)).min(POLL)
            });
            tokio::select! {
                biased;
                _ = self.nudge.notified() => {}
                _ = tokio::time::sleep(until) => {}
            }
        };
        // Release: each decision's event commits with the row's return to `live`, before any call runs.
        let mut events = Vec::new();
        for call in &self.calls {
            let Some(a) = approvals.get_mut(&call.call_id) else {
                continue;
            };
            if a.released {
                continue;
            }
            a.released = true;
            let d = a.decided.as_ref().expect("decided above");
            let event = RunEvent::ApprovalDecided {
                stamp: Default::default(),
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                decision: d.decision,
                who: d.who.clone(),
                note: d.note.clone(),
                step: self.step,
            };
            events.extend(publish(&self.deps, &self.id, event, false));
        }
        match self.change(PhaseChange::Unpark, events, &approvals).await {
            Some(true) => {}
            Some(false) => return Passed::Fenced,
            None => return Passed::Lost,
        }
        Passed::Decided(decided)
    }

    /// The row as it stands (`None` when storage stayed away past the lease).
    async fn read(&self) -> Option<Option<storage::ledger::LiveRow>> {
        let s = self.deps.storage.clone();
        match retry_transient(self.deps.lease_ms, || s.get_live(self.id.clone())).await {
            Some(Ok(row)) => Some(row),
            _ => None,
        }
    }

    /// Park or unpark with `events`: `Some(true)` when it committed, `Some(false)` when refused (fenced,
    /// or the row left the phase: a stop's gate, a handoff), `None` when storage stayed away.
    async fn change(
        &self,
        change: PhaseChange,
        events: Vec<Value>,
        approvals: &Approvals,
    ) -> Option<bool> {
        let s = self.deps.storage.clone();
        let patch = approvals_patch(approvals);
        let answer = retry_transient(self.deps.lease_ms, || {
            s.change_phase(
                self.id.clone(),
                self.gen.clone(),
                change,
                events.clone(),
                patch.clone(),
            )
        })
        .await?;
        match answer {
            Ok(Ok(_)) => Some(true),
            Ok(Err(refusal)) => {
                tracing::info!(run_id = %self.id, generation = %self.gen, change = change.as_str(), %refusal, "approval phase change refused");
                Some(false)
            }
            Err(e) => {
                tracing::warn!(run_id = %self.id, generation = %self.gen, error = %e, "approval phase change failed");
                Some(false)
            }
        }
    }

    /// No decision by the deadline: denied by `timeout` (unless a person's decision got in first).
    /// Answers whether the call is decided now.
    async fn time_out(&self, call_id: &str, now: i64) -> bool {
        let decided = Decided {
            decision: Decision::Deny,
            who: "timeout".into(),
            note: None,
            at: now,
        };
        match self
            .deps
            .storage
            .decide(self.id.clone(), call_id.to_owned(), decided)
            .await
        {
            Ok(Ok(_)) | Ok(Err(Refusal::AlreadyDecided { .. })) => true,
            other => {
                tracing::warn!(run_id = %self.id, generation = %self.gen, call_id, answer = ?other, "approval timeout not recorded");
                false
            }
        }
    }

    fn decisions(&self, approvals: &Approvals) -> BTreeMap<String, Decided> {
        self.calls
            .iter()
            .filter_map(|c| {
                let d = approvals.get(&c.call_id)?.decided.clone()?;
                Some((c.call_id.clone(), d))
            })
            .collect()
    }
}

/// `v` with every string passed through the redactor: a call's input is shown to people and kept in the
/// record, and no secret the model put into it may be.
fn redacted(deps: &RunDeps, v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(deps.registry.redactor().redact(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(|i| redacted(deps, i)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, i)| (k.clone(), redacted(deps, i)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A denied call's result, as the model sees it (SPEC §13).
pub(super) fn denied_output(d: &Decided) -> String {
    json!({"denied": true, "note": d.note.as_deref().unwrap_or(match d.who.as_str() {
        "timeout" => "no decision before the approval timeout",
        _ => "denied",
    })})
    .to_string()
}
