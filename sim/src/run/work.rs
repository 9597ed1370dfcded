//! A simulated run's working data and the step loop's effects (`actors/src/run/work.rs`): the model
//! call (follow-ups read from the inbox fold into the pending results turn; their `input` events go into
//! the step's events), the durable step (turns + events + record in one transaction, retried while
//! transient up to the lease), the inbox read after a text-only turn, the tools (one call at a time:
//! dispatch, then completion), the handoff, the finishing gate (flush first; `WrongPhase` read back), the
//! reply (kill check before the webhook), and the record through the ledger's finish with its successor.
//! Each effect is cut into its await-point segments ([`Op`]); the owner writes here (settle, fence,
//! detach) are shared with [`super::launch`].

use actors::agent::{self, AssistantTurn, ToolCall, ToolResult};
use actors::run::machine::{Started, Written};
use serde_json::{json, Value};
use storage::ledger::decisions::{self, Settlement};
use storage::ledger::{
    InFlight, InboxItem, Outcome, Refusal, RunLedger, StepRecord, StepWrite, Turn,
};
use storage::MemoryStore;

use super::launch::launched;
use super::{
    check_replies, complete, publish, spawn_op, Actor, Completion, Op, MAX_WRITE_RETRY_MS,
    WRITE_RETRY_MS,
};
use crate::agent as script;
use crate::supervisor;
use crate::world::{Io, Kind, World, LEASE_MS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    Tracked,
    Detached,
    Fenced,
}

/// A run's working data (`work::Run`).
pub struct RunData {
    pub id: String,
    pub gen: String,
    pub deadline: i64,
    pub tracking: Tracking,
    pub system: String,
    pub turns: Vec<Turn>,
    pub turn_count: u64,
    pub step: u64,
    pub iteration: u64,
    pub inbox_consumed: Option<u64>,
    pub pending: Option<Turn>,
    pub step_events: Vec<Value>,
    pub current: Option<AssistantTurn>,
    /// This incarnation's workspace fence token (`<gen>#<actor>`).
    pub fence: String,
    pub reply: Option<(bool, Option<String>)>,
    /// The stop an earlier incarnation committed (`Run::recorded_stop`).
    pub recorded_stop: Option<storage::ledger::StopMode>,
}

impl RunData {
    pub(super) fn new(gen: &str, fence: &str, id: &str, deadline: i64) -> RunData {
        RunData {
            id: id.to_owned(),
            gen: gen.to_owned(),
            deadline,
            tracking: Tracking::Tracked,
            system: "sim".into(),
            turns: Vec::new(),
            turn_count: 0,
            step: 0,
            iteration: 0,
            inbox_consumed: None,
            pending: None,
            step_events: Vec::new(),
            current: None,
            fence: fence.to_owned(),
            reply: None,
            recorded_stop: None,
        }
    }

    pub fn tracked(&self) -> bool {
        self.tracking == Tracking::Tracked
    }
}

pub(super) fn publish_run(w: &mut World, slot: usize, run: &RunData, event: Value) {
    publish(w, slot, &run.id, event, run.tracked());
}

/// Publish now; commit with the next durable step (`publish_in_step`).
pub(super) fn publish_in_step(w: &mut World, slot: usize, run: &mut RunData, event: Value) {
    if let Some(stamped) = publish(w, slot, &run.id, event, false) {
        w.model.shown(&run.id, &run.fence, &stamped);
        if run.tracked() {
            run.step_events.push(stamped);
        }
    }
}

/// Publish now (flusher included) and keep for the next durable write (`Run::publish_kept`).
pub(super) fn publish_kept(w: &mut World, slot: usize, run: &mut RunData, event: Value) {
    if let Some(stamped) = publish(w, slot, &run.id, event, run.tracked()) {
        w.model.shown(&run.id, &run.fence, &stamped);
        if run.tracked() {
            run.step_events.push(stamped);
        }
    }
}

/// The step's `tool_call` events, committed with the step (`Run::publish_calls`).
pub(super) fn publish_calls(w: &mut World, slot: usize, run: &mut RunData, calls: &[ToolCall]) {
    let step = run.step;
    for call in calls {
        let summary = call.args.to_string();
        publish_in_step(
            w,
            slot,
            run,
            json!({"type": "tool_call", "callId": call.call_id, "tool": call.tool, "summary": summary, "step": step}),
        );
    }
}

pub(super) fn fence(w: &mut World, slot: usize, run: &mut RunData) {
    if run.tracking != Tracking::Fenced {
        run.tracking = Tracking::Fenced;
        w.procs[slot].tracked.remove(&run.id);
    }
}

/// One note, one attempt to mark the row detached, no more heartbeats (`Run::detach`).
pub(super) fn detach(w: &mut World, slot: usize, run: &mut RunData, what: &str) {
    if run.tracking != Tracking::Tracked {
        return;
    }
    run.tracking = Tracking::Detached;
    w.procs[slot].tracked.remove(&run.id);
    w.model.tainted.insert(run.id.clone());
    let what = what.to_owned();
    let id = run.id.clone();
    w.note(|| format!("  {id}: {what} failed permanently: detached"));
    publish_run(
        w,
        slot,
        run,
        json!({"type": "note", "kind": "ledger_detached", "summary": format!("{what} failed; this run is not resumable")}),
    );
    let delay = w.io_latency();
    w.spawn_in(
        slot,
        delay,
        Kind::SetDetached {
            run: run.id.clone(),
            gen: run.gen.clone(),
        },
    );
}

/// Act on an owner write's answer (`Run::settle`).
pub(super) fn settle<T>(
    w: &mut World,
    slot: usize,
    run: &mut RunData,
    what: &str,
    answer: Option<storage::Result<Outcome<T>>>,
) -> Written {
    let Some(answer) = answer else {
        return Written::Lost;
    };
    match answer {
        Ok(Ok(_)) => Written::Ok,
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => {
            fence(w, slot, run);
            Written::Fenced
        }
        Ok(Err(_)) | Err(_) => {
            detach(w, slot, run, what);
            Written::Ok
        }
    }
}

pub(super) fn take_step_turns(run: &mut RunData) -> (Vec<Turn>, Vec<ToolCall>) {
    let turn = run
        .current
        .clone()
        .expect("a step write follows a model answer");
    let mut new: Vec<Turn> = run.pending.take().into_iter().collect();
    new.push(turn.to_turn());
    (new, turn.calls)
}

/// The durable write of `new` turns, the step's events and its record (`Run::durable_step`): the
/// transcript in memory moves on at once; `None` when untracked.
pub(super) fn durable_step(
    w: &mut World,
    slot: usize,
    run: &mut RunData,
    new: Vec<Turn>,
    calls: &[ToolCall],
) -> Option<StepWrite> {
    let first_idx = run.turn_count;
    run.turn_count += new.len() as u64;
    run.turns.extend(new.iter().cloned());
    let events = std::mem::take(&mut run.step_events);
    if !run.tracked() {
        return None;
    }
    let record = StepRecord {
        step: run.step,
        seq: w.procs[slot].registry.last_seq(&run.id).unwrap_or(0),
        turn_index: run.turn_count,
        in_flight: calls
            .iter()
            .map(|c| InFlight {
                call_id: c.call_id.clone(),
                tool: c.tool.clone(),
            })
            .collect(),
        inbox_consumed_seq: run.inbox_consumed,
        remaining_ms: (run.deadline - w.now()).max(0),
        turn: run.step,
        iteration: run.iteration,
    };
    Some(StepWrite {
        first_idx,
        turns: new,
        record,
        events,
    })
}

/// Fold follow-ups into the next turn (`Run::fold`): each gets one `input {source: "followup"}` event,
/// committed with the step that writes the turn — unless bug (a) publishes it through the flusher.
pub(super) fn fold(w: &mut World, slot: usize, run: &mut RunData, items: Vec<InboxItem>) {
    let Some(last) = items.iter().map(|i| i.seq).max() else {
        return;
    };
    let mut followups = Vec::with_capacity(items.len());
    for item in items {
        let text = item
            .message
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let event = storage::record::input_event(
            &text,
            storage::record::InputSource::Followup {
                inbox_seq: Some(item.seq),
            },
        );
        if w.procs[slot].registry.row(&run.id).is_none() && run.tracked() {
            let (gen, id, seq) = (run.gen.clone(), run.id.clone(), item.seq);
            w.violate(
                "a folded follow-up keeps its input event",
                format!("{gen} folds inbox item {seq} into {id} after its registry row was discarded: the step commits it without its input"),
            );
        }
        if w.cfg.bugs.followup_outside_step {
            publish_run(w, slot, run, event);
        } else {
            publish_in_step(w, slot, run, event);
        }
        followups.push((item.seq, text));
    }
    run.inbox_consumed = Some(last);
    match &mut run.pending {
        Some(turn) => turn.parts.extend(
            followups
                .iter()
                .map(|(seq, t)| agent::followup_part(*seq, t)),
        ),
        None => run.pending = Some(agent::followups_turn(&followups)),
    }
}

/// Unread follow-ups past what the run consumed (none when untracked or unreadable).
fn read_inbox(w: &mut World, slot: usize, run: &RunData) -> Vec<InboxItem> {
    if !run.tracked() {
        return Vec::new();
    }
    let (id, after) = (run.id.clone(), run.inbox_consumed);
    match w.io(slot, Io::Read, |s, _| s.read_inbox(&id, after)) {
        Ok(Ok(items)) => storage::ledger::steering(items),
        Ok(Err(_)) | Err(_) => Vec::new(),
    }
}

/// Retry `op` while it fails transiently, for up to the lease (`retry_transient`): `Err(delay)` asks
/// for another attempt after `delay`; `Ok(None)` when storage stayed away that long.
pub(super) fn retried<T>(
    w: &World,
    answer: storage::Result<T>,
    since: i64,
    delay: i64,
) -> Result<Option<storage::Result<T>>, i64> {
    match answer {
        Err(e) if e.is_transient() => {
            if w.now() - since >= LEASE_MS {
                Ok(None)
            } else {
                Err(delay)
            }
        }
        other => Ok(Some(other)),
    }
}

pub(super) fn next_delay(delay: i64) -> i64 {
    (delay * 2).min(MAX_WRITE_RETRY_MS)
}

/// A durable step under `gen`, by the incarnation `fence`; what it committed (even when the reply was
/// lost) is told to the model.
pub(super) fn write_step(
    w: &mut World,
    slot: usize,
    run_id: &str,
    gen: &str,
    fence: &str,
    sw: &StepWrite,
) -> storage::Result<Outcome<()>> {
    let answer = w.io(slot, Io::OwnerWrite, |s, _| step_in(s, run_id, gen, sw));
    if w.peek().last_step(run_id).ok().flatten().as_ref() == Some(&sw.record) {
        w.model.committed(run_id, fence, &sw.turns);
    }
    answer
}

/// A step's turns, its events and then its record (`StorageHandle::durable_step`'s body).
pub(super) fn step_in(
    s: &mut MemoryStore,
    run_id: &str,
    gen: &str,
    sw: &StepWrite,
) -> storage::Result<Outcome<()>> {
    if let Err(refusal) = s.write_transcript(run_id, gen, sw.first_idx, &sw.turns)? {
        return Ok(Err(refusal));
    }
    if !sw.events.is_empty() {
        if let Err(refusal) = s.append(run_id, gen, &sw.events)? {
            return Ok(Err(refusal));
        }
    }
    s.step(run_id, gen, &sw.record)
}

/// Append everything the flusher holds for `run` now (`FlushRun`).
pub fn flush_run(w: &mut World, slot: usize, run: &str) {
    if let Some((gen, events)) = w.procs[slot]
        .flusher
        .remove(run)
        .filter(|(_, e)| !e.is_empty())
    {
        let _ = w.io(slot, Io::Write, |s, _| s.append(run, &gen, &events));
    }
}

/// One segment of an effect of the step loop (every [`Op`] but the launch's, which [`super::launch`] runs).
pub(super) fn step_op(w: &mut World, slot: usize, a: &mut Actor, op: Op) {
    match op {
        Op::Write {
            w: sw,
            since,
            delay,
        } => {
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            let answer = write_step(w, slot, &id, &gen, &a.fence.clone(), &sw);
            let answer = match retried(w, answer, since, delay) {
                Ok(answer) => answer,
                Err(d) => {
                    return spawn_op(
                        w,
                        slot,
                        a,
                        d,
                        Op::Write {
                            w: sw,
                            since,
                            delay: next_delay(d),
                        },
                    )
                }
            };
            complete(w, slot, a, Completion::StepWritten(answer));
        }
        Op::Model => {
            let run = a.run.take().expect("run");
            let items = if run.pending.is_some() {
                read_inbox(w, slot, &run)
            } else {
                Vec::new()
            };
            let mut conversation = run.turns.clone();
            if let Some(mut turn) = run.pending.clone() {
                turn.parts.extend(items.iter().map(|i| {
                    agent::followup_part(
                        i.seq,
                        i.message
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    )
                }));
                conversation.push(turn);
            }
            a.run = Some(run);
            let reply = script::next(&conversation);
            complete(w, slot, a, Completion::ModelDone { items, reply });
        }
        Op::ReadInbox => {
            let items = read_inbox(w, slot, a.run.as_ref().expect("run"));
            complete(w, slot, a, Completion::InboxRead(items));
        }
        Op::Tools {
            calls,
            hows,
            i,
            mut results,
            out,
            settle,
        } => {
            let Some(call) = calls.get(i).cloned() else {
                return if settle {
                    if let Some(run) = a.launching.as_mut() {
                        run.pending = Some(agent::results_turn(&results, &[]));
                    }
                    launched(w, slot, a, Started::Continue)
                } else {
                    complete(w, slot, a, Completion::ToolsDone(results))
                };
            };
            let run = if settle {
                a.launching.as_mut()
            } else {
                a.run.as_mut()
            }
            .expect("tools run on the run's data");
            let step = run.step;
            match out {
                None => match hows[i].synthetic_text() {
                    None => {
                        let output = if decisions::dispatchable(run.tracked(), call.tool == "pure")
                        {
                            crate::model::tool_effect(w, slot, run, &call)
                        } else {
                            (false, decisions::UNRECORDED_TEXT.to_owned())
                        };
                        let delay = w.work_latency();
                        spawn_op(
                            w,
                            slot,
                            a,
                            delay,
                            Op::Tools {
                                calls,
                                hows,
                                i,
                                results,
                                out: Some(output),
                                settle,
                            },
                        );
                    }
                    Some(text) => {
                        let mut event = json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": false, "summary": text, "step": step});
                        if hows[i] == Settlement::EffectsUnknown {
                            event["effectsUnknown"] = json!(true);
                            w.model.settled_unknown(&run.id, &call.call_id);
                        }
                        publish_kept(w, slot, run, event);
                        results.push(ToolResult {
                            call_id: call.call_id.clone(),
                            tool: call.tool.clone(),
                            ok: false,
                            output: text.to_owned(),
                        });
                        spawn_op(
                            w,
                            slot,
                            a,
                            0,
                            Op::Tools {
                                calls,
                                hows,
                                i: i + 1,
                                results,
                                out: None,
                                settle,
                            },
                        );
                    }
                },
                Some((ok, output)) => {
                    publish_kept(
                        w,
                        slot,
                        run,
                        json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": ok, "summary": output, "step": step}),
                    );
                    results.push(ToolResult {
                        call_id: call.call_id.clone(),
                        tool: call.tool.clone(),
                        ok,
                        output,
                    });
                    spawn_op(
                        w,
                        slot,
                        a,
                        0,
                        Op::Tools {
                            calls,
                            hows,
                            i: i + 1,
                            results,
                            out: None,
                            settle,
                        },
                    );
                }
            }
        }
        Op::HandOff {
            write,
            tracked,
            since,
            delay,
            written,
        } => {
            if !tracked {
                return complete(w, slot, a, Completion::HandedOff(false));
            }
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            if let (Some(sw), false) = (&write, written) {
                let answer = write_step(w, slot, &id, &gen, &a.fence.clone(), sw);
                match retried(w, answer, since, delay) {
                    Err(d) => {
                        return spawn_op(
                            w,
                            slot,
                            a,
                            d,
                            Op::HandOff {
                                write,
                                tracked,
                                since,
                                delay: next_delay(d),
                                written,
                            },
                        )
                    }
                    Ok(Some(Ok(Ok(())))) => {
                        let delay = w.io_latency();
                        return spawn_op(
                            w,
                            slot,
                            a,
                            delay,
                            Op::HandOff {
                                write,
                                tracked,
                                since,
                                delay,
                                written: true,
                            },
                        );
                    }
                    Ok(_) => return complete(w, slot, a, Completion::HandedOff(false)),
                }
            }
            flush_run(w, slot, &id);
            let answer = w.io(slot, Io::Write, |s, _| {
                s.handoff(&gen, std::slice::from_ref(&id))
            });
            let ok = matches!(&answer, Ok(results) if results.iter().any(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff));
            complete(w, slot, a, Completion::HandedOff(ok));
        }
        Op::GateFlush { status, answer } => {
            // Everything published so far reaches the ledger first.
            flush_run(w, slot, &a.run_id.clone());
            let (now, delay) = (w.now(), w.io_latency());
            spawn_op(
                w,
                slot,
                a,
                delay,
                Op::Gate {
                    status,
                    answer,
                    since: now,
                    delay: WRITE_RETRY_MS,
                },
            );
        }
        Op::Gate {
            status,
            answer,
            since,
            delay,
        } => {
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            let result = w.io(slot, Io::OwnerWrite, |s, _| {
                s.finishing(&id, &gen, status, answer.as_deref())
            });
            let result = match retried(w, result, since, delay) {
                Ok(r) => r,
                Err(d) => {
                    return spawn_op(
                        w,
                        slot,
                        a,
                        d,
                        Op::Gate {
                            status,
                            answer,
                            since,
                            delay: next_delay(d),
                        },
                    )
                }
            };
            match result {
                None => complete(w, slot, a, Completion::Gate(Written::Lost)),
                Some(Ok(Ok(()))) => complete(w, slot, a, Completion::Gate(Written::Ok)),
                Some(Ok(Err(Refusal::StopPending { mode, .. }))) => {
                    complete(w, slot, a, Completion::GateStopped(mode))
                }
                Some(Ok(Err(Refusal::WrongPhase { .. }))) => {
                    let (now, d) = (w.now(), w.io_latency());
                    spawn_op(
                        w,
                        slot,
                        a,
                        d,
                        Op::GateCheck {
                            status,
                            since: now,
                            delay: WRITE_RETRY_MS,
                        },
                    );
                }
                Some(Ok(Err(_))) => complete(w, slot, a, Completion::Gate(Written::Fenced)),
                Some(Err(e)) => complete(w, slot, a, Completion::GateDetach(e.to_string())),
            }
        }
        Op::GateCheck {
            status,
            since,
            delay,
        } => {
            let (id, gen) = (a.run_id.clone(), w.procs[slot].gen.clone());
            let row = w.io(slot, Io::Read, |s, _| s.get_live(&id));
            let row = match retried(w, row, since, delay) {
                Ok(r) => r,
                Err(d) => {
                    return spawn_op(
                        w,
                        slot,
                        a,
                        d,
                        Op::GateCheck {
                            status,
                            since,
                            delay: next_delay(d),
                        },
                    )
                }
            };
            let written = match row {
                None => Written::Lost,
                Some(Ok(Some(row)))
                    if row.owner_gen == gen
                        && row.phase == storage::ledger::Phase::Finishing
                        && row.final_status() == Some(status) =>
                {
                    Written::Ok
                }
                Some(_) => Written::Fenced,
            };
            complete(w, slot, a, Completion::Gate(written));
        }
        Op::Reply { detached } => {
            if !w.webhook {
                return complete(
                    w,
                    slot,
                    a,
                    Completion::Replied {
                        killed: false,
                        reply: None,
                    },
                );
            }
            let id = a.run_id.clone();
            if !detached
                && w.io(slot, Io::Read, |s, _| s.is_killed(&id))
                    .unwrap_or(false)
            {
                return complete(
                    w,
                    slot,
                    a,
                    Completion::Replied {
                        killed: true,
                        reply: None,
                    },
                );
            }
            let tracked = a.run.as_ref().is_some_and(RunData::tracked);
            let gen = w.procs[slot].gen.clone();
            w.model.replied(&id, &gen, tracked);
            check_replies(w, &id);
            complete(
                w,
                slot,
                a,
                Completion::Replied {
                    killed: false,
                    reply: Some((true, None)),
                },
            );
        }
        Op::Record {
            record,
            via,
            spent,
            successor,
        } => {
            let Some(record) = record else {
                return complete(w, slot, a, Completion::Finish(None));
            };
            match supervisor::history_attempt(w, slot, &record, via, spent) {
                supervisor::Attempt::Retry { via, delay } => spawn_op(
                    w,
                    slot,
                    a,
                    delay,
                    Op::Record {
                        record: Some(record),
                        via,
                        spent: spent + 1,
                        successor,
                    },
                ),
                supervisor::Attempt::Done { landed } => {
                    let _ = landed;
                    let next =
                        successor.and_then(|id| supervisor::admitted_successor(w, slot, &id));
                    complete(w, slot, a, Completion::Finish(next));
                }
            }
        }
        Op::Fresh { .. }
        | Op::Restart { .. }
        | Op::Resume(_)
        | Op::Deliver { .. }
        | Op::Claim { .. } => {
            unreachable!("launch segments run in `launch`")
        }
    }
}
