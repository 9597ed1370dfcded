//! A process's supervisor-like loop, simulated: admission (`ThreadSlot` + the ledger's atomic `admit`),
//! boot and the periodic reclaim sweep (classify → resume / restart / close with a successor; orphans of
//! this generation re-adopted), the heartbeat (lease renewal, stop relay, fence news), the flusher, stop
//! and kill, the drain (SIGTERM: hand off at step boundaries, exit), the run actors' endings and the
//! history writer's fire-and-forget writes. Each mirrors `actors::supervisor` (`admission.rs`,
//! `recovery.rs`, `drain.rs`, `kill.rs`, `mod.rs`), `actors::heartbeat`, `actors::flusher` and
//! `actors::history`; every storage call goes through [`World::io`] so faults land on it.

use std::collections::BTreeSet;

use actors::registry::RunMeta;
use actors::run::{assemble_record, meta_from_row, Adoption, Launch, RecordExtras, Request, StopReason};
use rand::Rng;
use serde_json::{json, Value};
use storage::ledger::{decisions, Admit, AdmitOutcome, LiveRow, Outcome, Phase, Reclaimed, ReceiptKey, Refusal, RunLedger, Successor};
use storage::record::{ChannelVisibility, RunRecord, RunStatus};
use storage::store::PutOutcome;
use storage::{MemoryStore, RunStore};

use crate::run::{self, ActorMsg};
use crate::world::{Io, Kind, Status, World, DRAIN_DEADLINE_MS, FLUSH_MS, HANDOFF_BUDGET_MS, HEARTBEAT_MS, LEASE_MS, BUDGET_MS};

/// Most sweeps a row of this generation may fail to re-adopt before it closes `interrupted`.
const MAX_READOPT_FAILURES: u32 = 3;
/// How long a keyed message waits for a finishing run to free its thread (SPEC §5.1).
const BUSY_WAIT_MS: i64 = 5_000;
/// The history writer's retry delays (SPEC §5.4), each jittered ±50 %.
const HISTORY_BACKOFF_MS: [i64; 2] = [1_000, 4_000];

/// Which operation carries a history write.
#[derive(Debug, Clone)]
pub enum Via {
    /// A plain store put; `detached` when a detached run writes its own record best-effort.
    Store { detached: bool },
    /// The ledger's finish under `gen`, admitting `successor` in the same transaction.
    Ledger { gen: String, successor: Option<Successor> },
}

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
            Stage::Row(i) => format!("row {}", self.taken.get(i).map(|r| r.row.run_id.as_str()).unwrap_or("?")),
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
        Kind::RunEnded { run, reason, successor } => run_ended(w, slot, run, reason, successor),
        Kind::Readopt { run } => readopt(w, slot, run),
        Kind::CloseOrphan { run } => close_orphan(w, slot, run),
        Kind::CloseFailed { run } => close_failed(w, slot, run),
        Kind::History { record, via, spent } => history(w, slot, record, via, spent),
        Kind::SetDetached { run, gen } => {
            let mut patch = serde_json::Map::new();
            patch.insert("detached".into(), Value::Bool(true));
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
    let candidates: Vec<usize> =
        (0..w.procs.len()).filter(|&s| w.procs[s].status == Status::Up && w.procs[s].ingress_open).collect();
    if candidates.is_empty() {
        return w.spawn(crate::world::At::Client, 300, Kind::Send { msg, waited_since });
    }
    let slot = candidates[w.rng.random_range(0..candidates.len())];
    if w.procs[slot].draining {
        // 503 draining: nothing was written; the client tries again (elsewhere, later).
        return w.spawn(crate::world::At::Client, 300, Kind::Send { msg, waited_since });
    }
    admit(w, slot, msg, waited_since);
}

fn admit(w: &mut World, slot: usize, msg: usize, waited_since: Option<i64>) {
    let info = w.model.messages[msg - 1].clone();
    let req = Request { thread: info.thread.clone(), channel: "c".into(), user: "u".into(), text: info.text.clone(), agent: None, visibility: None };
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
        key: info.keyed.then(|| ReceiptKey { scope: "sim".into(), key: format!("k{msg}"), body_hash: format!("h{msg}") }),
        lease_ms: LEASE_MS,
    };
    let first_events: Vec<Value> = [meta.event(), json!({"type": "input", "text": req.text, "source": "request"})]
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
        Err(_) if info.keyed => return w.spawn(crate::world::At::Client, 200, Kind::Send { msg, waited_since }),
        Err(_) => return w.model.uncertain(msg),
    };
    match outcome {
        AdmitOutcome::Started { run_id: started } if started == run_id => {
            w.procs[slot].registry.create(&run_id, meta.clone(), now, first_events, 3);
            w.spawn_in(slot, 0, Kind::Launch(Launch::Fresh { id: run_id.clone(), meta, request: req, started_at: now }));
            w.model.accepted(msg, &run_id);
        }
        AdmitOutcome::Started { run_id } | AdmitOutcome::Steered { run_id, .. } => w.model.accepted(msg, &run_id),
        AdmitOutcome::Busy { .. } => {
            let since = waited_since.unwrap_or(now);
            if now - since < BUSY_WAIT_MS {
                w.spawn(crate::world::At::Client, 100, Kind::Send { msg, waited_since: Some(since) });
            } else {
                w.model.refused(msg);
            }
        }
        AdmitOutcome::KeyConflict | AdmitOutcome::Fenced | AdmitOutcome::ReceiptLimit { .. } => w.model.refused(msg),
    }
}

// ---- the heartbeat and the flusher ----

fn heartbeat_tick(w: &mut World, slot: usize) {
    w.spawn_in(slot, HEARTBEAT_MS, Kind::HeartbeatTick);
    let gen = w.procs[slot].gen.clone();
    let runs: Vec<String> = w.procs[slot].tracked.keys().cloned().collect();
    for run in runs {
        let delay = w.io_latency();
        w.spawn_in(slot, delay, Kind::Beat { run, gen: gen.clone() });
    }
}

/// One run's renewal; its news go to the actor through the supervisor (`RunNews`).
fn beat(w: &mut World, slot: usize, run: String, gen: String) {
    let answer = w.io(slot, Io::Write, |s, now| s.heartbeat(&run, &gen, LEASE_MS, now));
    let news = match answer {
        Ok(Ok(a)) => a.stop.map(actors::heartbeat::HeartbeatNews::Stop),
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => Some(actors::heartbeat::HeartbeatNews::Fenced),
        Ok(Err(_)) | Err(_) => None,
    };
    let Some(news) = news else { return };
    let p = &mut w.procs[slot];
    let Some(relayed) = p.tracked.get_mut(&run) else { return };
    match news {
        actors::heartbeat::HeartbeatNews::Stop(mode) if relayed.contains(&mode) => return,
        actors::heartbeat::HeartbeatNews::Stop(mode) => relayed.push(mode),
        actors::heartbeat::HeartbeatNews::Fenced => {
            p.tracked.remove(&run);
        }
    }
    match w.procs[slot].runs.get(&run).copied() {
        Some(actor) => w.spawn_in(slot, 0, Kind::Msg { actor, msg: ActorMsg::News(news) }),
        None if news == actors::heartbeat::HeartbeatNews::Fenced => w.procs[slot].registry.discard(&run),
        None => {}
    }
}

// ---- boot and the reclaim sweep (SPEC §6.1) ----

fn start_sweep(w: &mut World, slot: usize, defer: bool) {
    w.procs[slot].sweeping = true;
    let state = SweepState { stage: Stage::Start, defer, taken: Vec::new(), launches: Vec::new(), failed: Vec::new() };
    w.spawn_in(slot, 0, Kind::Sweep(state));
}

fn sweep(w: &mut World, slot: usize, mut st: SweepState) {
    match st.stage {
        Stage::Start => {
            let inc = w.procs[slot].inc;
            w.model.sweep_started(inc);
            let gen = w.procs[slot].gen.clone();
            let dead: Vec<String> = w.dead_gens.iter().filter(|g| **g != gen).cloned().collect();
            let before: Vec<(String, String)> = w.peek().list_live().unwrap_or_default().into_iter().map(|r| (r.run_id, r.owner_gen)).collect();
            let answer = w.io(slot, Io::Write, |s, now| s.reclaim(&gen, now, LEASE_MS, &dead));
            // What the reclaim took, whatever this process was told (a lost reply hides it).
            let after = w.peek().list_live().unwrap_or_default();
            for row in after.iter().filter(|r| r.owner_gen == gen) {
                let Some((_, prior)) = before.iter().find(|(id, owner)| *id == row.run_id && *owner != gen) else { continue };
                let inc = w.procs[slot].inc;
                let driving = w.procs[slot].actors.values().any(|a| a.run_id == row.run_id)
                    || w.tasks.iter().any(|t| {
                        t.at == crate::world::At::Proc { slot, inc }
                            && matches!(&t.kind, Kind::History { record, via: Via::Ledger { .. }, .. } if record.head.id == row.run_id)
                    });
                if driving {
                    w.violate(
                        "one driver per run",
                        format!("{gen} reclaims {} from {prior} while its own earlier actor (or its pending close) still drives it", row.run_id),
                    );
                }
            }
            match answer {
                Ok(answer) => {
                    if w.cfg.trace && !answer.taken.is_empty() {
                        let ids: Vec<String> = answer.taken.iter().map(|r| format!("{} (from {} {})", r.row.run_id, r.prior_owner, r.prior_phase)).collect();
                        w.note(|| format!("{gen} reclaims {}", ids.join(", ")));
                    }
                    st.taken = answer.taken;
                    st.stage = if st.taken.is_empty() { Stage::End } else { Stage::Row(0) };
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
                        st.launches.push(Launch::Restart { row, events, from_gen: None });
                    }
                }
                Ok(Fate::Launch(l)) => st.launches.push(l),
                Err(why) => {
                    w.note(|| format!("  {id}: classify or close failed: {why}"));
                    st.failed.push(id);
                }
            }
            st.stage = if i + 1 < st.taken.len() { Stage::Row(i + 1) } else { Stage::End };
            let delay = w.io_latency();
            w.spawn_in(slot, delay, Kind::Sweep(st));
        }
        Stage::End => {
            let gen = w.procs[slot].gen.clone();
            let mine: Vec<String> = match w.io(slot, Io::Read, |s, _| s.list_live()) {
                Ok(rows) => rows.into_iter().filter(|r| r.owner_gen == gen && r.phase != Phase::Handoff).map(|r| r.run_id).collect(),
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
    let state = SweepState { stage: Stage::Start, defer: true, taken: Vec::new(), launches: Vec::new(), failed: Vec::new() };
    w.spawn_in(slot, 500, Kind::Sweep(state));
}

/// What one reclaimed row became.
#[allow(clippy::large_enum_variant)] // one per reclaimed row, moved once (as `recovery::Fate`)
enum Fate {
    Launch(Launch),
    Closed(Option<(LiveRow, Vec<Value>)>),
}

/// Classify and act on one taken row (`take_row`).
fn take_row(w: &mut World, slot: usize, r: Reclaimed) -> Result<Fate, String> {
    let id = r.row.run_id.clone();
    if w.io(slot, Io::Read, |s, _| s.is_killed(&id)).map_err(|e| e.to_string())? {
        purge_killed(w, slot, &id);
        return Ok(Fate::Closed(None));
    }
    let transcript = w.io(slot, Io::Read, |s, _| s.read_transcript(&id)).map_err(|e| e.to_string())?;
    let final_status = r.row.state.get("finalStatus").and_then(Value::as_str).map(str::to_owned);
    let input = decisions::ClassifyInput {
        prior_phase: r.prior_phase,
        stop: r.row.stop,
        final_status: final_status.as_deref(),
        detached: r.row.state.get("detached").and_then(Value::as_bool).unwrap_or(false),
        has_request: r.row.meta.get("request").is_some_and(|v| v.is_object()),
        turn_count: transcript.len() as u64,
        last_step: r.last_step.as_ref().map(|s| s.cursor()),
    };
    let events = w.io(slot, Io::Read, |s, _| s.live_events(&id, 0, usize::MAX >> 1)).map_err(|e| e.to_string())?.unwrap_or_default();
    let class = decisions::classify(&input);
    w.note(|| format!("  {id}: {class:?}"));
    Ok(match class {
        decisions::Classification::CloseFinal { status } => {
            let status = RunStatus::parse(&status).unwrap_or(RunStatus::Completed);
            let successor = !w.cfg.bugs.no_successor_on_finishing_close;
            Fate::Closed(close_row(w, slot, &r.row, events, status, "closed from finishing; delivery unknown", successor)?)
        }
        decisions::Classification::CloseHardStopped => {
            Fate::Closed(close_row(w, slot, &r.row, events, RunStatus::StoppedHard, "a hard stop was recorded", true)?)
        }
        decisions::Classification::CloseInterrupted { reason } => {
            Fate::Closed(close_row(w, slot, &r.row, events, RunStatus::Interrupted, &reason, true)?)
        }
        decisions::Classification::Restart => {
            Fate::Launch(Launch::Restart { row: r.row, events, from_gen: Some(r.prior_owner) })
        }
        decisions::Classification::Resume(point) => match r.last_step {
            Some(last_step) => Fate::Launch(Launch::Resume(Adoption {
                row: r.row,
                last_step,
                transcript,
                events,
                point,
                from_gen: r.prior_owner,
            })),
            None => Fate::Closed(close_row(w, slot, &r.row, events, RunStatus::Interrupted, "no step record", true)?),
        },
    })
}

/// Close a row with a record built from the row and its live events, through the finish transaction,
/// which admits the successor for its unread inbox (`run::close_row`).
fn close_row(
    w: &mut World,
    slot: usize,
    row: &LiveRow,
    mut events: Vec<Value>,
    status: RunStatus,
    reason: &str,
    with_successor: bool,
) -> Result<Option<(LiveRow, Vec<Value>)>, String> {
    // The workspace fence goes to the closer first, so an old owner that wakes up later cannot write into
    // the workspace of a run already closed (best effort: a missing workspace keeps no fence).
    if w.model.workspace_exists(&row.run_id) {
        let gen = w.procs[slot].gen.clone();
        if let Some(owner) = w.peek().get_live(&row.run_id).ok().flatten().map(|r| r.owner_gen).filter(|o| *o != gen) {
            w.violate(
                "only the run's owner takes its workspace",
                format!("{gen} takes the workspace fence of {} to close it, while {owner} owns the run", row.run_id),
            );
        }
        w.model.take_workspace(&row.run_id, &format!("{gen}#close"));
    }
    let meta = meta_from_row(row);
    let now = w.now();
    let last = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    events.push(json!({"type": "note", "seq": last + 1, "at": now, "kind": "reclaimed", "summary": reason}));
    let record = assemble_record(&row.run_id, &meta, row.started_at, now, status, events, last + 1, false, Default::default())
        .ok_or("the row does not make a valid record")?;
    let successor = with_successor.then(|| Successor { run_id: w.mint_run("s"), lease_ms: LEASE_MS, inbox_consumed: None });
    let successor_id = successor.as_ref().map(|s| s.run_id.clone());
    let gen = w.procs[slot].gen.clone();
    if status == RunStatus::Interrupted {
        w.model.closed_interrupted(&row.run_id, reason);
    }
    match finish_tx(w, slot, &gen, &record, successor) {
        Ok(Ok(_)) => Ok(successor_id.and_then(|id| admitted_successor(w, slot, &id))),
        Ok(Err(refusal)) => Err(refusal.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Close a row this generation holds that cannot run (`close_unstartable`).
pub fn close_unstartable(w: &mut World, slot: usize, row: &LiveRow, events: Vec<Value>, reason: &str) -> (StopReason, Option<(LiveRow, Vec<Value>)>) {
    w.procs[slot].registry.discard(&row.run_id);
    match close_row(w, slot, row, events, RunStatus::Interrupted, reason, true) {
        Ok(successor) => (StopReason::Finished(RunStatus::Interrupted), successor),
        Err(_) => (StopReason::StorageLost, None),
    }
}

/// The successor a finish admitted under this generation (`admitted_successor`).
pub fn admitted_successor(w: &mut World, slot: usize, id: &str) -> Option<(LiveRow, Vec<Value>)> {
    let gen = w.procs[slot].gen.clone();
    let row = w.io(slot, Io::Read, |s, _| s.get_live(id)).ok()??;
    if row.owner_gen != gen || row.phase != Phase::Attaching {
        return None;
    }
    let events = w.io(slot, Io::Read, |s, _| s.live_events(id, 0, usize::MAX >> 1)).ok()??;
    Some((row, events))
}

/// The ledger's finish with its successor admission, as one transaction (`storage::handle::finish_in`),
/// and what the world model learns from it.
pub fn finish_tx(w: &mut World, slot: usize, gen: &str, record: &RunRecord, successor: Option<Successor>) -> storage::Result<Outcome<PutOutcome>> {
    let id = record.head.id.clone();
    let thread = record.head.thread_key.clone();
    let before = w.peek().get_live(&id).ok().flatten();
    let out = w.io(slot, Io::Write, |s, now| finish_in(s, gen, record, successor.as_ref(), now));
    let after = w.peek().get_live(&id).ok().flatten();
    if before.is_some() && after.is_none() {
        w.model.closed(&id, gen, record.head.status);
    }
    if let Some(s) = successor {
        if w.peek().get_live(&s.run_id).ok().flatten().is_some() {
            w.model.started(&s.run_id, &thread);
            crate::model::check_successor_disjoint(w, record, &s.run_id);
        }
    }
    out
}

/// One transaction: the ledger's `finish` of `record` and, when the run left unread follow-ups past what
/// it consumed, the admission of their successor with its first events (`storage::handle::finish_in`,
/// step for step; the memory store has no rollback, and nothing after `finish` can refuse here: the
/// thread was just freed and the successor's id is fresh).
fn finish_in(s: &mut MemoryStore, gen: &str, record: &RunRecord, successor: Option<&Successor>, now: i64) -> storage::Result<Outcome<PutOutcome>> {
    let id = record.head.id.as_str();
    let admission = match successor {
        None => None,
        Some(succ) => match s.get_live(id)? {
            None => None,
            Some(row) => {
                let stepped = s.last_step(id)?.and_then(|s| s.inbox_consumed_seq);
                let consumed = stepped.max(succ.inbox_consumed);
                let unread = s.inbox_after(id, consumed)?;
                storage::ledger::successor_admission(&row, gen, &unread, succ, now)
            }
        },
    };
    let out = s.finish(id, gen, record, None, now)?;
    if let (Ok(_), Some((admit, events))) = (&out, admission) {
        match s.admit(&admit, now)? {
            AdmitOutcome::Started { .. } => {
                s.append(&admit.run_id, gen, &events)?.map_err(|r| storage::Error::Unavailable(format!("successor events refused: {r}")))?;
            }
            other => return Err(storage::Error::Unavailable(format!("successor not admitted: {other:?}"))),
        }
    }
    Ok(out)
}

/// A plain store put, and the check that no final record comes from a generation that lost the run.
fn put_tx(w: &mut World, slot: usize, record: &RunRecord, detached: bool) -> storage::Result<Outcome<PutOutcome>> {
    let gen = w.procs[slot].gen.clone();
    let _ = detached;
    if !record.head.provisional {
        crate::model::check_record_writer(w, &gen, &record.head.id);
    }
    w.io(slot, Io::Write, |s, now| RunStore::put(s, record, None, now)).map(Ok)
}

/// How one history write attempt went.
pub enum Attempt {
    Retry { via: Via, delay: i64 },
    Done { landed: bool },
}

/// One attempt of the history writer (`Inner::drive`): an `UnknownRun` finish falls back to a plain put
/// at once; a fenced finish writes nothing; transient failures get two retries (1 s, then 4 s, ±50 %).
pub fn history_attempt(w: &mut World, slot: usize, record: &RunRecord, mut via: Via, spent: usize) -> Attempt {
    let id = record.head.id.clone();
    if record.head.provisional && w.procs[slot].finals.contains(&id) {
        return Attempt::Done { landed: false }; // final beats provisional: stood down
    }
    if !record.head.provisional {
        w.procs[slot].finals.insert(id.clone());
    }
    loop {
        let answer = match &via {
            Via::Ledger { gen, successor } => {
                let gen = gen.clone();
                finish_tx(w, slot, &gen, record, successor.clone())
            }
            Via::Store { detached } => put_tx(w, slot, record, *detached),
        };
        let transient = match answer {
            Ok(Ok(_)) => return Attempt::Done { landed: true },
            Ok(Err(Refusal::UnknownRun { .. })) if matches!(via, Via::Ledger { .. }) => {
                w.note(|| format!("  {id}: the ledger has no live row; the record falls back to a plain put"));
                via = Via::Store { detached: false };
                continue;
            }
            Ok(Err(_)) => return Attempt::Done { landed: false },
            Err(e) => matches!(e, storage::Error::Unavailable(_) | storage::Error::Sqlite(_) | storage::Error::Panicked(_)),
        };
        if !transient || spent >= HISTORY_BACKOFF_MS.len() {
            w.note(|| format!("  {id}: the history write is lost"));
            return Attempt::Done { landed: false };
        }
        let base = HISTORY_BACKOFF_MS[spent];
        let delay = w.rng.random_range(base / 2..=base * 3 / 2);
        return Attempt::Retry { via, delay };
    }
}

/// A fire-and-forget history write; a ledger write with a successor launches it once settled (the
/// supervisor's `close_failed`).
fn history(w: &mut World, slot: usize, record: RunRecord, via: Via, spent: usize) {
    let successor = match &via {
        Via::Ledger { successor: Some(s), .. } => Some(s.run_id.clone()),
        _ => None,
    };
    match history_attempt(w, slot, &record, via, spent) {
        Attempt::Retry { via, delay } => w.spawn_in(slot, delay, Kind::History { record, via, spent: spent + 1 }),
        Attempt::Done { .. } => {
            if let Some(id) = successor {
                let next = admitted_successor(w, slot, &id);
                launch_successor(w, slot, next);
            }
        }
    }
}

fn launch_successor(w: &mut World, slot: usize, successor: Option<(LiveRow, Vec<Value>)>) {
    if let Some((row, events)) = successor {
        run::start(w, slot, Launch::Restart { row, events, from_gen: None });
    }
}

// ---- orphans: rows of this generation no actor drives (SPEC §6.1) ----

/// Make orphans of this generation's rows that had no actor two sweeps running, and re-adopt (or, after
/// too many failures, close) every orphan (`Supervisor::attend`).
fn attend(w: &mut World, slot: usize, mine: &[String]) {
    let p = &w.procs[slot];
    if p.draining {
        return;
    }
    let registry: BTreeSet<String> = p.registry.unfinished();
    let idle: BTreeSet<String> = mine
        .iter()
        .chain(&registry)
        .filter(|id| !p.runs.contains_key(*id) && !p.handed.contains(*id) && !p.orphans.contains_key(*id))
        .cloned()
        .collect();
    let seen_twice: Vec<String> = idle.intersection(&p.unattended).cloned().collect();
    for id in seen_twice {
        if mine.contains(&id) {
            w.note(|| format!("  {id}: a row of this generation has no actor"));
            w.procs[slot].orphans.insert(id, 0);
        } else {
            w.procs[slot].registry.discard(&id);
        }
    }
    w.procs[slot].unattended = idle;
    if w.cfg.bugs.no_readopt {
        return;
    }
    let orphans: Vec<(String, u32)> = w.procs[slot].orphans.iter().map(|(id, n)| (id.clone(), *n)).collect();
    for (id, failures) in orphans {
        if w.procs[slot].runs.contains_key(&id) {
            w.procs[slot].orphans.remove(&id);
        } else if failures >= MAX_READOPT_FAILURES {
            let delay = w.io_latency();
            w.spawn_in(slot, delay, Kind::CloseOrphan { run: id });
        } else {
            let delay = w.io_latency();
            w.spawn_in(slot, delay, Kind::Readopt { run: id });
        }
    }
}

#[allow(clippy::large_enum_variant)] // one per re-adoption, moved once
enum Readoption {
    Launch(Launch),
    Gone,
    Closed(Option<(LiveRow, Vec<Value>)>),
}

/// Plan the re-adoption of this generation's own row, as a reclaim would plan it (`plan_readoption`).
fn plan_readoption(w: &mut World, slot: usize, id: &str) -> Result<Readoption, String> {
    let gen = w.procs[slot].gen.clone();
    let Some(row) = w.io(slot, Io::Read, |s, _| s.get_live(id)).map_err(|e| e.to_string())? else { return Ok(Readoption::Gone) };
    if row.owner_gen != gen || row.phase == Phase::Handoff {
        return Ok(Readoption::Gone);
    }
    if w.io(slot, Io::Read, |s, _| s.is_killed(id)).map_err(|e| e.to_string())? {
        purge_killed(w, slot, id);
        return Ok(Readoption::Closed(None));
    }
    let last_step = w.io(slot, Io::Read, |s, _| s.last_step(id)).map_err(|e| e.to_string())?;
    let transcript = w.io(slot, Io::Read, |s, _| s.read_transcript(id)).map_err(|e| e.to_string())?;
    let events = w.io(slot, Io::Read, |s, _| s.live_events(id, 0, usize::MAX >> 1)).map_err(|e| e.to_string())?.unwrap_or_default();
    let from_gen = Some(gen.clone());
    let has_request = row.meta.get("request").is_some_and(Value::is_object);
    // A recorded hard stop or a detached row closes exactly as a reclaim would close it.
    if row.phase != Phase::Finishing {
        if row.stop == Some(storage::ledger::StopMode::Hard) {
            return Ok(Readoption::Closed(close_row(w, slot, &row, events, RunStatus::StoppedHard, "a hard stop was recorded", true)?));
        }
        if row.state.get("detached").and_then(Value::as_bool).unwrap_or(false) {
            return Ok(Readoption::Closed(close_row(w, slot, &row, events, RunStatus::Interrupted, decisions::DETACHED_REASON, true)?));
        }
    }
    if row.phase == Phase::Attaching || last_step.is_none() {
        if !has_request {
            return Ok(Readoption::Closed(close_row(w, slot, &row, events, RunStatus::Interrupted, decisions::NO_REQUEST_REASON, true)?));
        }
        return Ok(Readoption::Launch(Launch::Restart { row, events, from_gen }));
    }
    let last_step = last_step.expect("checked above");
    match decisions::completeness(transcript.len() as u64, Some(last_step.cursor())) {
        Ok(point) => Ok(Readoption::Launch(Launch::Resume(Adoption { row, last_step, transcript, events, point, from_gen: gen }))),
        Err(reason) => Ok(Readoption::Closed(close_row(w, slot, &row, events, RunStatus::Interrupted, &reason, true)?)),
    }
}

fn readopt(w: &mut World, slot: usize, id: String) {
    match plan_readoption(w, slot, &id) {
        Ok(Readoption::Launch(launch)) => {
            w.procs[slot].orphans.remove(&id);
            if w.procs[slot].runs.contains_key(&id) {
                return; // an actor came back meanwhile
            }
            w.note(|| format!("  {id}: re-adopted"));
            run::start(w, slot, launch);
        }
        Ok(Readoption::Gone) => {
            let p = &mut w.procs[slot];
            p.orphans.remove(&id);
            if !p.runs.contains_key(&id) {
                p.registry.discard(&id);
            }
        }
        Ok(Readoption::Closed(successor)) => {
            w.procs[slot].orphans.remove(&id);
            launch_successor(w, slot, successor);
        }
        Err(_) => *w.procs[slot].orphans.entry(id).or_default() += 1,
    }
}

fn close_orphan(w: &mut World, slot: usize, id: String) {
    let gen = w.procs[slot].gen.clone();
    let closed = (|| -> Result<Readoption, String> {
        let Some(row) = w.io(slot, Io::Read, |s, _| s.get_live(&id)).map_err(|e| e.to_string())? else { return Ok(Readoption::Gone) };
        if row.owner_gen != gen {
            return Ok(Readoption::Gone);
        }
        // A killed run is purged, never closed (its finish would be refused every sweep).
        if w.io(slot, Io::Read, |s, _| s.is_killed(&id)).map_err(|e| e.to_string())? {
            purge_killed(w, slot, &id);
            return Ok(Readoption::Closed(None));
        }
        let events = w.io(slot, Io::Read, |s, _| s.live_events(&id, 0, usize::MAX >> 1)).map_err(|e| e.to_string())?.unwrap_or_default();
        w.model.tainted.insert(id.clone());
        let why = format!("could not be re-adopted in {MAX_READOPT_FAILURES} sweeps");
        Ok(Readoption::Closed(close_row(w, slot, &row, events, RunStatus::Interrupted, &why, true)?))
    })();
    match closed {
        Ok(Readoption::Closed(successor)) => {
            w.procs[slot].orphans.remove(&id);
            launch_successor(w, slot, successor);
        }
        Ok(_) => {
            w.procs[slot].orphans.remove(&id);
            w.procs[slot].registry.discard(&id);
        }
        Err(_) => {}
    }
}

// ---- run endings and the restart policy ----

fn run_ended(w: &mut World, slot: usize, run: String, reason: StopReason, successor: Option<(LiveRow, Vec<Value>)>) {
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
                w.procs[slot].orphans.entry(run).or_default();
            }
        }
        StopReason::Fenced => {
            w.procs[slot].restarts.remove(&run);
            if w.io(slot, Io::Read, |s, _| s.is_killed(&run)).unwrap_or(false) {
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
        let row = w.io(slot, Io::Read, |s, _| s.get_live(&run)).map_err(|e| e.to_string())?.ok_or("the row is gone")?;
        if row.owner_gen != gen {
            return Err("the row is owned elsewhere".to_owned());
        }
        run::flush_run(w, slot, &run);
        let mut events = w.io(slot, Io::Read, |s, _| s.live_events(&run, 0, usize::MAX >> 1)).map_err(|e| e.to_string())?.unwrap_or_default();
        let last = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
        let message = "the run failed more often than the restart policy allows";
        events.push(json!({"type": "run_failed", "seq": last + 1, "at": w.now(), "message": message}));
        close_row(w, slot, &row, events, RunStatus::Failed, message, true)
    })();
    match closed {
        Ok(successor) => launch_successor(w, slot, successor),
        Err(_) => {
            w.procs[slot].orphans.insert(run, MAX_READOPT_FAILURES);
        }
    }
}

// ---- stop and kill (SPEC §5.6) ----

fn stop_run(w: &mut World, slot: usize, run: String, mode: storage::ledger::StopMode) {
    if w.procs[slot].registry.row(&run).is_some_and(|r| r.finished_at.is_some()) {
        return;
    }
    let local = w.procs[slot].runs.get(&run).copied();
    match w.io(slot, Io::Write, |s, now| s.request_stop(&run, mode, now)) {
        Ok(Ok(_)) => {}
        Ok(Err(_)) if local.is_none() => return,
        Ok(Err(_)) => {}
        Err(_) => return, // 503: nothing is aborted
    }
    if let Some(actor) = local {
        w.spawn_in(slot, 0, Kind::Msg { actor, msg: ActorMsg::Stop(mode) });
    }
}

fn kill_run(w: &mut World, slot: usize, run: String) {
    let local = w.procs[slot].runs.get(&run).copied();
    let gen = w.procs[slot].gen.clone();
    let known = w.procs[slot].registry.row(&run).is_some()
        || matches!(w.io(slot, Io::Read, |s, _| s.get_live(&run)), Ok(Some(_)))
        || matches!(w.io(slot, Io::Read, |s, now| s.get_summary(&run, now)), Ok(Some(_)));
    if !known {
        return;
    }
    let answer = w.io(slot, Io::Write, |s, now| s.kill(&run, now));
    // The model learns of the deletion fence whatever the operator was told.
    if w.peek().is_killed(&run).unwrap_or(false) {
        let thread = w.model.run_threads.get(&run).cloned().unwrap_or_default();
        w.model.killed(&run, &thread);
    }
    let Ok(answer) = answer else { return };
    match (local, answer.live_owner) {
        (Some(actor), _) => w.spawn_in(slot, 0, Kind::Msg { actor, msg: ActorMsg::Killed }),
        (None, Some(owner)) if owner != gen && answer.owner_lease_live => {}
        _ => purge_killed(w, slot, &run),
    }
}

fn purge_killed(w: &mut World, slot: usize, run: &str) {
    if let Ok(true) = w.io(slot, Io::Write, |s, _| s.purge(run)) {
        w.procs[slot].registry.discard(run);
        w.model.workspace_deleted(run);
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
        w.spawn_in(slot, 0, Kind::Msg { actor, msg: ActorMsg::Drain });
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
            .filter(|r| !r.state.get("detached").and_then(Value::as_bool).unwrap_or(false))
            .filter(|r| active.contains(&r.run_id))
            .map(|r| r.run_id)
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn active(w: &World, slot: usize) -> Vec<String> {
    let p = &w.procs[slot];
    p.runs.keys().filter(|id| !p.handed.contains(*id)).cloned().collect()
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
        Ok(results) => results.into_iter().filter(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff).map(|(id, _)| id).collect(),
        Err(_) => Vec::new(),
    };
    for id in handed {
        w.procs[slot].handed.insert(id.clone());
        if let Some(actor) = w.procs[slot].runs.get(&id).copied() {
            w.spawn_in(slot, 0, Kind::Msg { actor, msg: ActorMsg::Fenced });
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
        let provisional = RecordExtras { provisional: true, ..Default::default() };
        if let Some(record) = w.procs[slot].registry.build_record(&id, RunStatus::Interrupted, now, provisional) {
            let _ = history_attempt(w, slot, &record, Via::Store { detached: false }, HISTORY_BACKOFF_MS.len());
        }
    }
    w.take_down(slot, "drained; exit 0");
    let delay = if w.quiescing { 0 } else { w.rng.random_range(100..=2 * LEASE_MS) };
    w.spawn(crate::world::At::Client, delay, Kind::Restart { slot });
}
