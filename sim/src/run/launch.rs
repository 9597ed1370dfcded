//! The launch paths, simulated (`actors/src/run/launch.rs`): fresh (tombstone → workspace → claim →
//! seed), restart from the saved request, and resume from the transcript with in-flight settlement. Each
//! builds the run's [`RunData`] in [`Actor`]'s launching slot and answers [`Completion::Launched`], or
//! closes a row it cannot run ([`Completion::Over`]). The claim is one await-point segment ([`Op::Claim`]),
//! retried while transient up to the lease; the resume's settlement runs as [`Op::Tools`] in [`super::work`].

use actors::agent::{self, AssistantTurn};
use actors::run::machine::{Started, Written};
use actors::run::{meta_from_row, Adoption, RecordExtras, Request};
use serde_json::{json, Map, Value};
use storage::ledger::decisions::{self, ResumePoint, Settlement};
use storage::ledger::{LiveRow, Promotion, RunLedger, StepWrite};
use storage::record::RunStatus;

use super::work::{
    durable_step, next_delay, publish_run, retried, settle, step_in, write_step, RunData,
};
use super::{complete, spawn_op, Actor, Completion, Op, WRITE_RETRY_MS};
use crate::agent as script;
use crate::supervisor::{self, Via};
use crate::world::{Io, Kind, World, BUDGET_MS, LEASE_MS};

/// A run admitted here: the tombstone (a provisional record), then the workspace and the claim
/// (`launch::fresh`).
pub(super) fn fresh(w: &mut World, slot: usize, a: &mut Actor, request: Request, started_at: i64) {
    let gen = w.procs[slot].gen.clone();
    let run = RunData::new(&gen, &a.fence, &a.run_id, started_at + BUDGET_MS);
    let tombstone = RecordExtras {
        provisional: true,
        ..Default::default()
    };
    if let Some(record) = w.procs[slot].registry.build_record(
        &a.run_id,
        RunStatus::Interrupted,
        started_at,
        tombstone,
    ) {
        let delay = w.io_latency();
        w.spawn_in(
            slot,
            delay,
            Kind::History {
                record,
                via: Via::Store,
                spent: 0,
            },
        );
    }
    a.launching = Some(run);
    promote(w, slot, a, request.text);
}

/// Re-run a row from its saved request (`launch::restart`): the first attempt's events replayed under
/// their seqs, then `resumed`, then the claim. A successor admitted here (`from_gen: None`) starts the
/// same way, without `resumed`.
pub(super) fn restart(
    w: &mut World,
    slot: usize,
    a: &mut Actor,
    row: LiveRow,
    events: Vec<Value>,
    from_gen: Option<String>,
) {
    if from_gen.is_some() && row.detached() {
        let gen = w.procs[slot].gen.clone();
        w.violate(
            "detached runs are never resumed",
            format!(
                "{gen} restarts {} although its row is marked detached",
                row.run_id
            ),
        );
    }
    let meta = meta_from_row(&row);
    let request: Option<Request> = row
        .meta
        .get("request")
        .and_then(|r| serde_json::from_value(r.clone()).ok());
    let Some(request) = request else {
        let (reason, successor) =
            supervisor::close_unstartable(w, slot, &row, events, "the saved request is unreadable");
        return complete(w, slot, a, Completion::Over(reason, successor));
    };
    let deadline = row
        .meta
        .get("deadline")
        .and_then(Value::as_i64)
        .unwrap_or(row.started_at + BUDGET_MS);
    let highest = events
        .iter()
        .filter_map(storage::record::event_seq)
        .max()
        .unwrap_or(0);
    let had_input = events.iter().any(|e| e["type"] == "input");
    let next_seq = if from_gen.is_some() {
        highest + 1000
    } else {
        highest + 1
    };
    w.procs[slot]
        .registry
        .create(&row.run_id, meta.clone(), row.started_at, events, next_seq);
    let gen = w.procs[slot].gen.clone();
    let mut run = RunData::new(&gen, &a.fence, &row.run_id, deadline);
    run.recorded_stop = row.stop;
    if highest == 0 || !had_input {
        publish_run(w, slot, &run, meta.event());
        publish_run(
            w,
            slot,
            &run,
            storage::record::input_event(&request.text, storage::record::InputSource::Request),
        );
    }
    if let Some(from_gen) = from_gen {
        publish_run(
            w,
            slot,
            &run,
            json!({"type": "resumed", "settled": [], "fromGeneration": from_gen}),
        );
    }
    a.launching = Some(run);
    promote(w, slot, a, request.text);
}

/// The promotion and the seed step in one commit (`StorageHandle::promote`), retried while transient.
pub(super) fn claim(
    w: &mut World,
    slot: usize,
    a: &mut Actor,
    seed: Option<StepWrite>,
    since: i64,
    delay: i64,
) {
    let mut run = a.launching.take().expect("a claim belongs to a launch");
    let (id, gen) = (run.id.clone(), run.gen.clone());
    let mut state = Map::new();
    state.insert(
        storage::ledger::state_keys::BINDING.into(),
        json!({"workspace": format!("ws/{id}")}),
    );
    let promotion = Promotion {
        system_text: run.system.clone(),
        tools: json!(script::tool_defs()),
        state,
        lease_ms: LEASE_MS,
    };
    let answer = w.io(slot, Io::OwnerWrite, |s, now| {
        let claimed = match s.claim(&id, &gen, &promotion, now)? {
            Ok(claimed) => claimed,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let Some(sw) = &seed else {
            return Ok(Ok(claimed));
        };
        if storage::ledger::ran_past_its_seed(claimed, s.last_step(&id)?.as_ref()) {
            return Ok(Err(storage::ledger::Refusal::Fenced { run_id: id.clone() }));
        }
        Ok(step_in(s, &id, &gen, sw)?.map(|()| claimed))
    });
    let answer = match retried(w, answer, since, delay) {
        Ok(answer) => answer,
        Err(d) => {
            a.launching = Some(run);
            return spawn_op(
                w,
                slot,
                a,
                d,
                Op::Claim {
                    seed,
                    since,
                    delay: next_delay(d),
                },
            );
        }
    };
    let written = settle(w, slot, &mut run, "promotion", answer);
    a.launching = Some(run);
    seeded(w, slot, a, written);
}

/// Take the workspace, then the claim (`promote`): the workspace fence names this incarnation before any
/// tool runs, and is taken only while the ledger names this generation the run's owner (the check runs
/// under the workspace lock in production, so it and the write are one step here).
fn promote(w: &mut World, slot: usize, a: &mut Actor, request_text: String) {
    let id = a.run_id.clone();
    if !take_workspace(w, slot, &id, &a.fence.clone(), "before its claim") {
        return launched(w, slot, a, Started::Fenced);
    }
    // The seed (the first model call's messages and the step-0 record) commits with the promotion.
    let seed = a.launching.as_mut().and_then(|run| {
        let turns = vec![
            agent::system_turn(&run.system),
            agent::user_turn(&request_text),
        ];
        durable_step(w, slot, run, turns, &[])
    });
    let (now, delay) = (w.now(), w.io_latency());
    spawn_op(
        w,
        slot,
        a,
        delay,
        Op::Claim {
            seed,
            since: now,
            delay: WRITE_RETRY_MS,
        },
    );
}

/// Take the workspace of `id` for `fence` when the ledger names this generation its owner
/// (`tools::take_workspace_async` with `launch::still_owner`); false when another generation owns it.
pub(crate) fn take_workspace(w: &mut World, slot: usize, id: &str, fence: &str, why: &str) -> bool {
    let gen = w.procs[slot].gen.clone();
    let owner = w.peek().get_live(id).ok().flatten().map(|r| r.owner_gen);
    if owner.as_deref() != Some(gen.as_str()) {
        w.note(|| format!("  {id}: {gen} leaves the workspace fence alone: the ledger names {owner:?} the owner"));
        return false;
    }
    if let Some(owner) = w
        .peek()
        .get_live(id)
        .ok()
        .flatten()
        .map(|r| r.owner_gen)
        .filter(|o| *o != gen)
    {
        w.violate(
            "only the run's owner takes its workspace",
            format!("{gen} takes the workspace fence of {id} {why}, while {owner} owns the run"),
        );
    }
    w.model.take_workspace(id, fence);
    true
}

/// The seed write answered: the launch is over (`promote`'s tail).
fn seeded(w: &mut World, slot: usize, a: &mut Actor, written: Written) {
    if let Some(run) = a.launching.as_mut() {
        if !run.turns.is_empty() {
            run.turns.remove(0); // `turns` holds what follows the system turn
        }
    }
    let started = match written {
        Written::Ok => Started::Continue,
        Written::Fenced => Started::Fenced,
        Written::Lost => Started::Lost,
    };
    launched(w, slot, a, started);
}

/// Continue the reply of a row past its finishing gate whose actor lost storage at the gate
/// (`launch::deliver`): the saved status and answer go through the gate again.
pub(super) fn deliver(
    w: &mut World,
    slot: usize,
    a: &mut Actor,
    row: LiveRow,
    events: Vec<Value>,
    step: u64,
) {
    let meta = meta_from_row(&row);
    if w.procs[slot].registry.row(&row.run_id).is_none() {
        let highest = events
            .iter()
            .filter_map(storage::record::event_seq)
            .max()
            .unwrap_or(0);
        w.procs[slot]
            .registry
            .create(&row.run_id, meta, row.started_at, events, highest + 1000);
    }
    let status = row.final_status().unwrap_or(RunStatus::Completed);
    let answer = row.saved_answer().map(str::to_owned);
    let deadline = row
        .meta
        .get("deadline")
        .and_then(Value::as_i64)
        .unwrap_or(row.started_at + BUDGET_MS);
    let gen = w.procs[slot].gen.clone();
    let mut run = RunData::new(&gen, &a.fence, &row.run_id, deadline);
    run.step = step;
    a.launching = Some(run);
    launched(w, slot, a, Started::Gated { status, answer });
}

pub(super) fn launched(w: &mut World, slot: usize, a: &mut Actor, started: Started) {
    complete(w, slot, a, Completion::Launched(started));
}

/// Adopt a row this generation owns and continue it from its transcript (`launch::resume`).
pub(super) fn resume(w: &mut World, slot: usize, a: &mut Actor, ad: Adoption) {
    let row = ad.row;
    // A row in `finishing` continues its reply whatever else it records; any other detached row closes.
    if row.phase != storage::ledger::Phase::Finishing && row.detached() {
        let gen = w.procs[slot].gen.clone();
        w.violate(
            "detached runs are never resumed",
            format!(
                "{gen} resumes {} although its row is marked detached",
                row.run_id
            ),
        );
    }
    let meta = meta_from_row(&row);
    let now = w.now();
    let highest = ad
        .events
        .iter()
        .filter_map(storage::record::event_seq)
        .max()
        .unwrap_or(0);
    w.procs[slot].registry.create(
        &row.run_id,
        meta.clone(),
        row.started_at,
        ad.events,
        highest + 1000,
    );
    let gen = w.procs[slot].gen.clone();
    let mut run = RunData::new(&gen, &a.fence, &row.run_id, now + ad.last_step.remaining_ms);
    run.recorded_stop = row.stop;
    if !row.system_text.is_empty() {
        run.system = row.system_text.clone();
    }
    // Re-attach the workspace; a missing one closes the run (SPEC §8.3).
    if !w.model.workspace_exists(&row.run_id) {
        let events = w.procs[slot]
            .registry
            .row(&run.id)
            .map(|r| r.events.clone())
            .unwrap_or_default();
        let (reason, successor) =
            supervisor::close_unstartable(w, slot, &row, events, "the run's workspace is missing");
        return complete(w, slot, a, Completion::Over(reason, successor));
    }
    if !take_workspace(w, slot, &row.run_id, &a.fence.clone(), "to resume it") {
        a.launching = Some(run);
        return launched(w, slot, a, Started::Fenced);
    }
    run.turn_count = ad.transcript.len() as u64;
    run.turns = ad.transcript.into_iter().skip(1).collect();
    run.step = ad.last_step.step;
    run.iteration = ad.last_step.iteration;
    run.inbox_consumed = ad.last_step.inbox_consumed_seq;
    let last_text = run
        .turns
        .iter()
        .rev()
        .find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text))
        .unwrap_or_default();
    if row.phase == storage::ledger::Phase::Finishing || row.gated() {
        let gen = w.procs[slot].gen.clone();
        w.violate(
            "a run past its finishing gate is never resumed",
            format!("{gen} resumes {} from the transcript although its row is past its finishing gate (its reply may be out)", row.run_id),
        );
    }
    let last_assistant = run.turns.last().and_then(AssistantTurn::from_turn);
    let mut calls = Vec::new();
    let mut finish_plan = None;
    let fresh = matches!(ad.point, ResumePoint::RunStepFresh { .. });
    match ad.point {
        ResumePoint::ResumeAt { .. } => {
            let recorded: Vec<String> = ad
                .last_step
                .in_flight
                .iter()
                .map(|c| c.call_id.clone())
                .collect();
            if let Some(turn) = &last_assistant {
                let ids: Vec<String> = turn.calls.iter().map(|c| c.call_id.clone()).collect();
                if let Err(reason) = decisions::in_flight_matches(&recorded, &ids) {
                    publish_run(
                        w,
                        slot,
                        &run,
                        json!({"type": "resumed", "settled": [], "fromGeneration": ad.from_gen}),
                    );
                    a.launching = Some(run);
                    return launched(w, slot, a, Started::Fail(reason));
                }
                if turn.calls.is_empty() {
                    finish_plan = Some(turn.text.clone());
                }
                calls = turn.calls.clone();
            }
        }
        ResumePoint::RunStepFresh { step } => {
            // Unreachable here (a durable step lands whole), kept for fidelity: one attempt, no retries.
            run.step = step;
            run.iteration += 1;
            calls = last_assistant
                .as_ref()
                .map(|t| t.calls.clone())
                .unwrap_or_default();
            if calls.is_empty() {
                finish_plan = Some(last_text.clone());
            }
            super::work::publish_calls(w, slot, &mut run, &calls);
            if let Some(sw) = durable_step(w, slot, &mut run, Vec::new(), &calls) {
                let (id, gen, fence) = (run.id.clone(), run.gen.clone(), run.fence.clone());
                let answer = write_step(w, slot, &id, &gen, &fence, &sw);
                let answer = if answer.as_ref().is_err_and(storage::Error::is_transient) {
                    None
                } else {
                    Some(answer)
                };
                match settle(w, slot, &mut run, "step record", answer) {
                    Written::Ok => {}
                    Written::Fenced => {
                        a.launching = Some(run);
                        return launched(w, slot, a, Started::Fenced);
                    }
                    Written::Lost => {
                        a.launching = Some(run);
                        return launched(w, slot, a, Started::Lost);
                    }
                }
            }
        }
    }
    let defs = script::tool_defs();
    let hows: Vec<Settlement> = calls
        .iter()
        .map(|call| {
            if fresh {
                return Settlement::Rerun;
            }
            let def = defs.iter().find(|d| d.name == call.tool);
            decisions::settlement(
                def.is_some(),
                def.is_some_and(|d| d.side_effect_free),
                def.is_some_and(|d| d.rerun_safe),
                def.is_some_and(|d| d.idempotent),
            )
        })
        .collect();
    let settled: Vec<Value> = if fresh {
        Vec::new()
    } else {
        calls
            .iter()
            .zip(&hows)
            .map(|(c, h)| json!({"callId": c.call_id, "tool": c.tool, "how": h}))
            .collect()
    };
    publish_run(
        w,
        slot,
        &run,
        json!({"type": "resumed", "settled": settled, "fromGeneration": ad.from_gen}),
    );
    a.launching = Some(run);
    if let Some(text) = finish_plan {
        return launched(w, slot, a, Started::Finish(text));
    }
    if calls.is_empty() {
        return launched(w, slot, a, Started::Continue);
    }
    spawn_op(
        w,
        slot,
        a,
        0,
        Op::Tools {
            calls,
            hows,
            i: 0,
            results: Vec::new(),
            out: None,
            settle: true,
        },
    );
}
