//! A process's supervisor-like loop, simulated: admission (`ThreadSlot` + the ledger's atomic `admit`),
//! boot and the periodic reclaim sweep (classify → resume / restart / close with a successor), the
//! heartbeat (lease renewal, stop relay, fence news), the flusher, stop and kill, the drain (SIGTERM: hand
//! off at step boundaries, exit) and the run actors' endings. Each mirrors `actors::supervisor`
//! (`admission.rs`, `recovery.rs`, `drain.rs`, `kill.rs`, `mod.rs`), `actors::heartbeat` and
//! `actors::flusher`; every storage call goes through [`World::io`] so faults land on it.
//!
//! # Layout
//! - this module: the task dispatch, admission, the heartbeat and the flusher, the sweep, run endings,
//!   stop and kill, the drain;
//! - `history`: closing a row and every record write (the ledger's finish with its successor, a plain
//!   put, the history writer's fire-and-forget writes: `actors::history`);
//! - `orphans`: this generation's rows no actor drives, re-adopted or closed.

mod history;
mod kill;
mod orphans;

use actors::registry::RunMeta;
use actors::run::{Adoption, Launch, RecordExtras, Request, StopReason};
use rand::Rng;
use serde_json::{json, Value};
use storage::ledger::{
    decisions, Admit, AdmitOutcome, LiveRow, Phase, ReceiptKey, Reclaimed, Refusal, RunLedger,
    StepRecord,
};
use storage::record::{ChannelVisibility, RunStatus};

use crate::run::{self, ActorMsg};
use crate::world::{
    Io, Kind, Status, World, BUDGET_MS, DRAIN_DEADLINE_MS, FLUSH_MS, HANDOFF_BUDGET_MS,
    HEARTBEAT_MS, LEASE_MS,
};
pub use history::{admitted_successor, close_unstartable, history_attempt, Attempt, Via};
use history::{close_row, history, launch_successor};
use kill::{kill_run, purge_killed, stop_run};
use orphans::{attend, close_orphan, readopt};

/// Most sweeps a row of this generation may fail to re-adopt before it closes `interrupted`.
const MAX_READOPT_FAILURES: u32 = 3;
/// How long a keyed message waits for a finishing run to free its thread (SPEC §5.1).
const BUSY_WAIT_MS: i64 = 5_000;
/// The history writer's retry delays (SPEC §5.4), each jittered ±50 %.
const HISTORY_BACKOFF_MS: [i64; 2] = [1_000, 4_000];

/// One reclaim pass, a task per stage so a crash can land between rows.
pub struct SweepState {
    stage: Stage,
    /// The boot pass: launches wait for ingress, and no orphans are attended.
    defer: bool,
    taken: Vec<Reclaimed>,
    launches: Vec<Launch>,
    failed: Vec<String>,
}

enum Stage {
    Start,
    Row(usize),
    End,
}

impl SweepState {
    pub fn name(&self) -> String {
        match self.stage {
            Stage::Start => format!("start{}", if self.defer { " (boot)" } else { "" }),
            Stage::Row(i) => format!(
                "row {}",
                self.taken
                    .get(i)
                    .map(|r| r.row.run_id.as_str())
                    .unwrap_or("?")
            ),
            Stage::End => "end".into(),
        }
    }
}

/// Dispatch a task of process `slot`.
pub fn handle(w: &mut World, slot: usize, kind: Kind) {
    match kind {
        Kind::Boot => {
            w.spawn_in(slot, HEARTBEAT_MS, Kind::HeartbeatTick);
            w.spawn_in(slot, FLUSH_MS, Kind::FlushTick);
            start_sweep(w, slot, true);
        }
        Kind::HeartbeatTick => heartbeat_tick(w, slot),
        Kind::Beat { run, gen } => beat(w, slot, run, gen),
        Kind::FlushTick => {
            w.spawn_in(slot, FLUSH_MS, Kind::FlushTick);
            let runs: Vec<String> = w.procs[slot].flusher.keys().cloned().collect();
            for id in runs {
                run::flush_run(w, slot, &id);
            }
        }
        Kind::SweepTick => {
            w.spawn_in(slot, LEASE_MS, Kind::SweepTick);
            if !w.procs[slot].sweeping {
                start_sweep(w, slot, false);
            }
        }
        Kind::Sweep(state) => sweep(w, slot, state),
        Kind::Launch(launch) => run::start(w, slot, launch),
        Kind::RunEnded {
            run,
            reason,
            successor,
        } => run_ended(w, slot, run, reason, successor),
        Kind::Readopt { run } => readopt(w, slot, run),
        Kind::CloseOrphan { run } => close_orphan(w, slot, run),
        Kind::CloseFailed { run } => close_failed(w, slot, run),
        Kind::History { record, via, spent } => history(w, slot, record, via, spent),
        Kind::SetDetached { run, gen } => {
            let mut patch = serde_json::Map::new();
            patch.insert(
                storage::ledger::state_keys::DETACHED.into(),
                Value::Bool(true),
            );
            let _ = w.io(slot, Io::Write, |s, _| s.set_state(&run, &gen, &patch));
        }
        Kind::StopRun { run, mode } => stop_run(w, slot, run, mode),
        Kind::KillRun { run } => kill_run(w, slot, run),
        Kind::DrainPoll => drain_poll(w, slot),
        Kind::DrainWait => drain_wait(w, slot),
        Kind::Msg { actor, msg } => run::message(w, slot, actor, msg),
        Kind::Op { actor, epoch, op } => run::op(w, slot, actor, epoch, op),
        Kind::Send { .. } | Kind::Restart { .. } | Kind::Resume { .. } => {}
    }
}

// ---- admission (SPEC §5.1) ----

/// A client posts message `msg` to a running process of its choice (`POST /api/messages`).
pub fn send(w: &mut World, msg: usize, waited_since: Option<i64>) {
    let candidates: Vec<usize> = (0..w.procs.len())
        .filter(|&s| w.procs[s].status == Status::Up && w.procs[s].ingress_open)
        .collect();
    if candidates.is_empty() {
        return w.spawn(
            crate::world::At::Client,
            300,
            Kind::Send { msg, waited_since },
        );
    }
    let slot = candidates[w.rng.random_range(0..candidates.len())];
    if w.procs[slot].draining {
        // 503 draining: nothing was written; the client tries again (elsewhere, later).
        return w.spawn(
            crate::world::At::Client,
            300,
            Kind::Send { msg, waited_since },
        );
    }
    admit(w, slot, msg, waited_since);
}

fn admit(w: &mut World, slot: usize, msg: usize, waited_since: Option<i64>) {
    let info = w.model.messages[msg - 1].clone();
    let req = Request {
        thread: info.thread.clone(),
        channel: "c".into(),
        user: "u".into(),
        text: info.text.clone(),
        agent: None,
        visibility: None,
        parent_run_id: None,
        source: Default::default(),
        strategy: None,
    };
    let thread_key = req.thread_key();
    let run_id = w.mint_run("r");
    let meta = RunMeta {
        agent: "sim".into(),
        model: "scripted".into(),
        label: storage::ledger::label_of(&req.text),
        thread_key: thread_key.clone(),
        channel_id: req.channel.clone(),
        user_id: req.user.clone(),
        channel_visibility: ChannelVisibility::Machine,
        parent_run_id: None,
    };
    let request = serde_json::to_value(&req).expect("a request serializes");
    let now = w.now();
    let mut meta_json = meta.event();
    if let Value::Object(m) = &mut meta_json {
        m.remove("type");
        m.insert("deadline".into(), json!(now + BUDGET_MS));
        m.insert("request".into(), request.clone());
    }
    let gen = w.procs[slot].gen.clone();
    let admit = Admit {
        thread_key: thread_key.clone(),
        gen: gen.clone(),
        run_id: run_id.clone(),
        request,
        meta: meta_json,
        key: info.keyed.then(|| ReceiptKey {
            scope: "sim".into(),
            key: format!("k{msg}"),
            body_hash: format!("h{msg}"),
        }),
        lease_ms: LEASE_MS,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    let first_events: Vec<Value> = [
        meta.event(),
        storage::record::input_event(&req.text, storage::record::InputSource::Request),
    ]
    .into_iter()
    .zip(1u64..)
    .map(|(mut event, seq)| {
        event["seq"] = json!(seq);
        event["at"] = json!(now);
        storage::record::cap_event_for_publish(event)
    })
    .collect();
    let events = first_events.clone();
    let outcome = w.io(slot, Io::Write, |s, _| {
        let out = s.admit(&admit, now)?;
        if matches!(&out, AdmitOutcome::Started { run_id } if *run_id == admit.run_id) {
            s.append(&admit.run_id, &admit.gen, &events)?
                .map_err(|r| storage::Error::Unavailable(format!("first events refused: {r}")))?;
        }
        Ok(out)
    });
    // The world model sees whether a run started, whatever the client was told.
    if w.peek().get_live(&run_id).ok().flatten().is_some() {
        w.model.started(&run_id, &thread_key);
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(_) if info.keyed => {
            return w.spawn(
                crate::world::At::Client,
                200,
                Kind::Send { msg, waited_since },
            )
        }
        Err(_) => return w.model.uncertain(msg),
    };
    match outcome {
        AdmitOutcome::Started { run_id: started } if started == run_id => {
            w.procs[slot]
                .registry
                .create(&run_id, meta.clone(), now, first_events, 3);
            w.spawn_in(
                slot,
                0,
                Kind::Launch(Launch::Fresh {
                    id: run_id.clone(),
                    meta,
                    request: req,
                    started_at: now,
                }),
            );
            w.model.accepted(msg, &run_id);
        }
        AdmitOutcome::Started { run_id }
        | AdmitOutcome::Steered { run_id, .. }
        | AdmitOutcome::Queued { run_id, .. }
        | AdmitOutcome::Interrupting { run_id, .. } => w.model.accepted(msg, &run_id),
        AdmitOutcome::Busy { .. } => {
            let since = waited_since.unwrap_or(now);
            if now - since < BUSY_WAIT_MS {
                w.spawn(
                    crate::world::At::Client,
                    100,
                    Kind::Send {
                        msg,
                        waited_since: Some(since),
                    },
                );
            } else {
                w.model.refused(msg);
            }
        }
        AdmitOutcome::KeyConflict
        | AdmitOutcome::Fenced
        | AdmitOutcome::ReceiptLimit { .. }
        | AdmitOutcome::Rejected { .. }
        | AdmitOutcome::QueueFull { .. }
        | AdmitOutcome::Forbidden => w.model.refused(msg),
    }
}

// ---- the heartbeat and the flusher ----

fn heartbeat_tick(w: &mut World, slot: usize) {
    w.spawn_in(slot, HEARTBEAT_MS, Kind::HeartbeatTick);
    let gen = w.procs[slot].gen.clone();
    let runs: Vec<String> = w.procs[slot].tracked.keys().cloned().collect();
    for run in runs {
        let delay = w.io_latency();
        w.spawn_in(
            slot,
            delay,
            Kind::Beat {
                run,
                gen: gen.clone(),
            },
        );
    }
}

/// One run's renewal; its news go to the actor through the supervisor (`RunNews`).
fn beat(w: &mut World, slot: usize, run: String, gen: String) {
    let answer = w.io(slot, Io::Write, |s, now| {
        s.heartbeat(&run, &gen, LEASE_MS, now)
    });
    let news = match answer {
        Ok(Ok(a)) => a.stop.map(actors::heartbeat::HeartbeatNews::Stop),
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => {
            Some(actors::heartbeat::HeartbeatNews::Fenced)
        }
        Ok(Err(_)) | Err(_) => None,
    };
    let Some(news) = news else { return };
    let p = &mut w.procs[slot];
    let Some(relayed) = p.tracked.get_mut(&run) else {
        return;
    };
    match news {
        actors::heartbeat::HeartbeatNews::Stop(mode) if relayed.contains(&mode) => return,
        actors::heartbeat::HeartbeatNews::Stop(mode) => relayed.push(mode),
        actors::heartbeat::HeartbeatNews::Fenced => {
            p.tracked.remove(&run);
        }
    }
    match w.procs[slot].runs.get(&run).copied() {
        Some(actor) => w.spawn_in(
            slot,
            0,
            Kind::Msg {
                actor,
                msg: ActorMsg::News(news),
            },
        ),
        None if news == actors::heartbeat::HeartbeatNews::Fenced => {
            w.procs[slot].registry.discard(&run)
        }
        None => {}
    }
}

// ---- boot and the reclaim sweep (SPEC §6.1) ----

/// The runs this process still drives (`Supervisor::driven`): an actor, or a final record on its way
/// through the ledger's finish (a close past the restart policy writes one at once here).
fn driven(w: &World, slot: usize) -> Vec<String> {
    let inc = w.procs[slot].inc;
    let mut driven: std::collections::BTreeSet<String> = w.procs[slot]
        .actors
        .values()
        .map(|a| a.run_id.clone())
        .collect();
    for t in &w.tasks {
        if let Kind::History {
            record,
            via: Via::Ledger { .. },
            ..
        } = &t.kind
        {
            if t.at == (crate::world::At::Proc { slot, inc }) {
                driven.insert(record.head.id.clone());
            }
        }
    }
    driven.into_iter().collect()
}

fn start_sweep(w: &mut World, slot: usize, defer: bool) {
    w.procs[slot].sweeping = true;
    let state = SweepState {
        stage: Stage::Start,
        defer,
        taken: Vec::new(),
        launches: Vec::new(),
        failed: Vec::new(),
    };
    w.spawn_in(slot, 0, Kind::Sweep(state));
}

fn sweep(w: &mut World, slot: usize, mut st: SweepState) {
    match st.stage {
        Stage::Start => {
            let inc = w.procs[slot].inc;
            w.model.sweep_started(inc);
            let gen = w.procs[slot].gen.clone();
            let dead: Vec<String> = w.dead_gens.iter().filter(|g| **g != gen).cloned().collect();
            let before: Vec<(String, String)> = w
                .peek()
                .list_live()
                .unwrap_or_default()
                .into_iter()
                .map(|r| (r.run_id, r.owner_gen))
                .collect();
            let keep = driven(w, slot);
            let answer = w.io(slot, Io::Write, |s, now| {
                s.reclaim(&gen, now, LEASE_MS, &dead, &keep)
            });
            // What the reclaim took, whatever this process was told (a lost reply hides it).
            let after = w.peek().list_live().unwrap_or_default();
            for row in after.iter().filter(|r| r.owner_gen == gen) {
                let Some((_, prior)) = before
                    .iter()
                    .find(|(id, owner)| *id == row.run_id && *owner != gen)
                else {
                    continue;
                };
                if driven(w, slot).contains(&row.run_id) {
                    w.violate(
                        "one driver per run",
                        format!("{gen} reclaims {} from {prior} while its own earlier actor (or its pending close) still drives it", row.run_id),
                    );
                }
            }
            match answer {
                Ok(answer) => {
                    if w.cfg.trace && !answer.taken.is_empty() {
                        let ids: Vec<String> = answer
                            .taken
                            .iter()
                            .map(|r| {
                                format!(
                                    "{} (from {} {})",
                                    r.row.run_id, r.prior_owner, r.prior_phase
                                )
                            })
                            .collect();
                        w.note(|| format!("{gen} reclaims {}", ids.join(", ")));
                    }
                    st.taken = answer.taken;
                    st.stage = if st.taken.is_empty() {
                        Stage::End
                    } else {
                        Stage::Row(0)
                    };
                    let delay = w.io_latency();
                    w.spawn_in(slot, delay, Kind::Sweep(st));
                }
                Err(_) => {
                    w.procs[slot].sweeping = false;
                    if st.defer {
                        // Boot retries its reclaim.
                        start_sweep_later(w, slot);
                    }
                }
            }
        }
        Stage::Row(i) => {
            let r = st.taken[i].clone();
            let id = r.row.run_id.clone();
            match take_row(w, slot, r) {
                Ok(Fate::Closed(successor)) => {
                    if let Some((row, events)) = successor {
                        st.launches.push(Launch::Restart {
                            row,
                            events,
                            from_gen: None,
                        });
                    }
                }
                Ok(Fate::Launch(l)) => st.launches.push(l),
                Err(why) => {
                    w.note(|| format!("  {id}: classify or close failed: {why}"));
                    st.failed.push(id);
                }
            }
            st.stage = if i + 1 < st.taken.len() {
                Stage::Row(i + 1)
            } else {
                Stage::End
            };
            let delay = w.io_latency();
            w.spawn_in(slot, delay, Kind::Sweep(st));
        }
        Stage::End => {
            let gen = w.procs[slot].gen.clone();
            let mine: Vec<String> = match w.io(slot, Io::Read, |s, _| s.list_live()) {
                Ok(rows) => rows
                    .into_iter()
                    .filter(|r| r.owner_gen == gen && r.phase != Phase::Handoff)
                    .map(|r| r.run_id)
                    .collect(),
                Err(_) => Vec::new(),
            };
            let p = &mut w.procs[slot];
            p.sweeping = false;
            for id in &st.failed {
                p.orphans.entry(id.clone()).or_default();
            }
            for l in st.launches {
                if st.defer {
                    w.procs[slot].deferred.push(l);
                } else {
                    run::start(w, slot, l);
                }
            }
            if st.defer {
                // Open ingress: launch what the boot reclaim adopted, then sweep every lease.
                w.procs[slot].ingress_open = true;
                for l in std::mem::take(&mut w.procs[slot].deferred) {
                    run::start(w, slot, l);
                }
                w.spawn_in(slot, LEASE_MS, Kind::SweepTick);
            } else {
                attend(w, slot, &mine);
                crate::model::orphan_ages(w, slot, &mine);
            }
        }
    }
}

fn start_sweep_later(w: &mut World, slot: usize) {
    w.procs[slot].sweeping = true;
    let state = SweepState {
        stage: Stage::Start,
        defer: true,
        taken: Vec::new(),
        launches: Vec::new(),
        failed: Vec::new(),
    };
    w.spawn_in(slot, 500, Kind::Sweep(state));
}

/// What one reclaimed row became.
#[allow(clippy::large_enum_variant)] // one per reclaimed row, moved once (as `recovery::Fate`)
pub(super) enum Fate {
    Launch(Launch),
    Closed(Option<(LiveRow, Vec<Value>)>),
}

/// Classify and act on one taken row (`take_row`): purge it when killed, else [`plan_row`].
fn take_row(w: &mut World, slot: usize, r: Reclaimed) -> Result<Fate, String> {
    let id = r.row.run_id.clone();
    if w.io(slot, Io::Read, |s, _| s.is_killed(&id))
        .map_err(|e| e.to_string())?
    {
        purge_killed(w, slot, &id);
        return Ok(Fate::Closed(None));
    }
    plan_row(w, slot, r.row, r.prior_phase, r.last_step, r.prior_owner)
}

/// Classify a row this generation holds — taken by a reclaim, or its own orphan — and close it or plan
/// its launch (`plan_row`).
pub(super) fn plan_row(
    w: &mut World,
    slot: usize,
    row: LiveRow,
    prior_phase: Phase,
    last_step: Option<StepRecord>,
    from_gen: String,
) -> Result<Fate, String> {
    let id = row.run_id.clone();
    let transcript = w
        .io(slot, Io::Read, |s, _| s.read_transcript(&id))
        .map_err(|e| e.to_string())?;
    let final_status = row
        .state
        .get(storage::ledger::state_keys::FINAL_STATUS)
        .and_then(Value::as_str)
        .map(str::to_owned);
    let input = decisions::ClassifyInput {
        prior_phase,
        stop: row.stop,
        final_status: final_status.as_deref(),
        detached: row.detached(),
        has_request: row.meta.get("request").is_some_and(|v| v.is_object()),
        turn_count: transcript.turns.len() as u64,
        gap: transcript.gap,
        last_step: last_step.as_ref().map(|s| s.cursor()),
    };
    let events = w
        .io(slot, Io::Read, |s, _| {
            s.live_events(&id, 0, usize::MAX >> 1)
        })
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let class = decisions::classify(&input);
    w.note(|| format!("  {id}: {class:?}"));
    Ok(match class {
        decisions::Classification::CloseFinal { status } => {
            let status = RunStatus::parse(&status).unwrap_or(RunStatus::Completed);
            let successor = !w.cfg.bugs.no_successor_on_finishing_close;
            Fate::Closed(close_row(
                w,
                slot,
                &row,
                events,
                status,
                "closed from finishing; delivery unknown",
                successor,
            )?)
        }
        decisions::Classification::CloseHardStopped => Fate::Closed(close_row(
            w,
            slot,
            &row,
            events,
            RunStatus::StoppedHard,
            "a hard stop was recorded",
            true,
        )?),
        decisions::Classification::CloseInterrupted { reason } => Fate::Closed(close_row(
            w,
            slot,
            &row,
            events,
            RunStatus::Interrupted,
            &reason,
            true,
        )?),
        decisions::Classification::Restart => Fate::Launch(Launch::Restart {
            row,
            events,
            from_gen: Some(from_gen),
        }),
        decisions::Classification::Resume(point) => match last_step {
            Some(last_step) => Fate::Launch(Launch::Resume(Adoption {
                row,
                last_step,
                transcript: transcript.turns,
                events,
                point,
                from_gen,
            })),
            None => Fate::Closed(close_row(
                w,
                slot,
                &row,
                events,
                RunStatus::Interrupted,
                "no step record",
                true,
            )?),
        },
    })
}

// ---- run endings and the restart policy ----

fn run_ended(
    w: &mut World,
    slot: usize,
    run: String,
    reason: StopReason,
    successor: Option<(LiveRow, Vec<Value>)>,
) {
    w.procs[slot].runs.remove(&run);
    launch_successor(w, slot, successor);
    if w.procs[slot].handed.remove(&run) {
        return;
    }
    match reason {
        StopReason::Panicked(_) | StopReason::StorageLost => {
            let now = w.now();
            let history = w.procs[slot].restarts.entry(run.clone()).or_default();
            history.retain(|t| now - t < 600_000);
            history.push(now);
            let allowed = history.len() <= 1;
            if !allowed {
                w.spawn_in(slot, 0, Kind::CloseFailed { run });
            } else {
                if reason == StopReason::StorageLost {
                    w.procs[slot].undelivered.insert(run.clone());
                }
                w.procs[slot].orphans.entry(run).or_default();
            }
        }
        StopReason::Fenced => {
            w.procs[slot].restarts.remove(&run);
            if w.io(slot, Io::Read, |s, _| s.is_killed(&run))
                .unwrap_or(false)
            {
                purge_killed(w, slot, &run);
            }
        }
        _ => {
            w.procs[slot].restarts.remove(&run);
        }
    }
}

/// Past the restart policy: close the run `failed` from its ledger row and live events, as a reclaim
/// closes a row (`close_failed`); a close that fails leaves an orphan closed at the next sweep.
fn close_failed(w: &mut World, slot: usize, run: String) {
    w.procs[slot].registry.discard(&run);
    let gen = w.procs[slot].gen.clone();
    let closed = (|| -> Result<Option<(LiveRow, Vec<Value>)>, String> {
        let row = w
            .io(slot, Io::Read, |s, _| s.get_live(&run))
            .map_err(|e| e.to_string())?
            .ok_or("the row is gone")?;
        if row.owner_gen != gen {
            return Err("the row is owned elsewhere".to_owned());
        }
        run::flush_run(w, slot, &run);
        let mut events = w
            .io(slot, Io::Read, |s, _| {
                s.live_events(&run, 0, usize::MAX >> 1)
            })
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let last = events
            .iter()
            .filter_map(storage::record::event_seq)
            .max()
            .unwrap_or(0);
        let message = "the run failed more often than the restart policy allows";
        events.push(
            json!({"type": "run_failed", "seq": last + 1, "at": w.now(), "message": message}),
        );
        close_row(w, slot, &row, events, RunStatus::Failed, message, true)
    })();
    match closed {
        Ok(successor) => launch_successor(w, slot, successor),
        Err(_) => {
            w.procs[slot].orphans.insert(run, MAX_READOPT_FAILURES);
        }
    }
}

// ---- drain (SPEC §6.4) ----

/// SIGTERM: stop admitting; every run hands itself off at its next step boundary.
pub fn drain(w: &mut World, slot: usize) {
    let now = w.now();
    let p = &mut w.procs[slot];
    p.draining = true;
    p.drain_started = now;
    let actors: Vec<u64> = p.runs.values().copied().collect();
    for actor in actors {
        w.spawn_in(
            slot,
            0,
            Kind::Msg {
                actor,
                msg: ActorMsg::Drain,
            },
        );
    }
    w.spawn_in(slot, 50, Kind::DrainPoll);
}

/// This process's runs resumable elsewhere: promoted, owned here, not detached.
fn resumable_here(w: &mut World, slot: usize, active: &[String]) -> Vec<String> {
    if active.is_empty() {
        return Vec::new();
    }
    let gen = w.procs[slot].gen.clone();
    match w.io(slot, Io::Read, |s, _| s.list_live()) {
        Ok(rows) => rows
            .into_iter()
            .filter(|r| r.owner_gen == gen && r.phase == Phase::Live)
            .filter(|r| !r.detached())
            .filter(|r| active.contains(&r.run_id))
            .map(|r| r.run_id)
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn active(w: &World, slot: usize) -> Vec<String> {
    let p = &w.procs[slot];
    p.runs
        .keys()
        .filter(|id| !p.handed.contains(*id))
        .cloned()
        .collect()
}

/// Wait for the boundaries up to the handoff budget, then hand off what is still busy.
fn drain_poll(w: &mut World, slot: usize) {
    let act = active(w, slot);
    let resumable = resumable_here(w, slot, &act);
    if !resumable.is_empty() && w.now() - w.procs[slot].drain_started < HANDOFF_BUDGET_MS {
        return w.spawn_in(slot, 100, Kind::DrainPoll);
    }
    let act = active(w, slot);
    let late = resumable_here(w, slot, &act);
    let gen = w.procs[slot].gen.clone();
    let handed: Vec<String> = match w.io(slot, Io::Write, |s, _| s.handoff(&gen, &late)) {
        Ok(results) => results
            .into_iter()
            .filter(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff)
            .map(|(id, _)| id)
            .collect(),
        Err(_) => Vec::new(),
    };
    for id in handed {
        w.procs[slot].handed.insert(id.clone());
        if let Some(actor) = w.procs[slot].runs.get(&id).copied() {
            w.spawn_in(
                slot,
                0,
                Kind::Msg {
                    actor,
                    msg: ActorMsg::Fenced,
                },
            );
        }
        // The run discards its own registry row when it ends (as production does).
    }
    w.spawn_in(slot, 100, Kind::DrainWait);
}

/// Wait for the runs that could not be handed off, up to the deadline; then exit.
fn drain_wait(w: &mut World, slot: usize) {
    let act = active(w, slot);
    if !act.is_empty() && w.now() - w.procs[slot].drain_started < DRAIN_DEADLINE_MS {
        return w.spawn_in(slot, 200, Kind::DrainWait);
    }
    let now = w.now();
    for id in act {
        let provisional = RecordExtras {
            provisional: true,
            ..Default::default()
        };
        if let Some(record) =
            w.procs[slot]
                .registry
                .build_record(&id, RunStatus::Interrupted, now, provisional)
        {
            let _ = history_attempt(w, slot, &record, Via::Store, HISTORY_BACKOFF_MS.len());
        }
    }
    w.take_down(slot, "drained; exit 0");
    let delay = if w.quiescing {
        0
    } else {
        w.rng.random_range(100..=2 * LEASE_MS)
    };
    w.spawn(crate::world::At::Client, delay, Kind::Restart { slot });
}
