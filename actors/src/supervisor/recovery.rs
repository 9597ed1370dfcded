//! Recovery (SPEC §6.1): the boot reclaim and the periodic sweep, classification of taken rows, and the
//! re-adoption of this generation's own rows that no actor drives.

use std::sync::atomic::Ordering;
use std::time::Duration;
use storage::RunId;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, WrapFuture};
use serde_json::Value;
use storage::ledger::{decisions, LiveRow, Phase, Refusal};
use storage::record::{RunEvent, RunStatus};

use crate::run::{self, Adoption, Launch, RunDeps};

use super::kill::purge_killed;
use super::Supervisor;

impl Supervisor {
    /// Re-adopt a row of this generation that no actor of this process drives (after a caught panic,
    /// `StorageLost`, a failed launch or close; SPEC §6.1): planned exactly as a reclaim plans it, owner
    /// unchanged. A row gone or owned elsewhere is dropped with its registry row; a row that still cannot
    /// be taken stays an orphan, and after [`MAX_READOPT_FAILURES`] failed sweeps closes `interrupted`.
    pub(super) fn readopt(&mut self, run_id: RunId, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        let id = run_id.clone();
        let undelivered = self.undelivered.remove(&run_id);
        let fut = async move { plan_readoption(&deps, &id, undelivered).await };
        ctx.spawn(fut.into_actor(self).map(move |plan, act, ctx| match plan {
            Ok(Readoption::Launch(launch)) => {
                act.orphans.remove(&run_id);
                if act.drives(&run_id) {
                    return; // an actor came back meanwhile, or the run closes past its restart policy
                }
                tracing::info!(run_id = %run_id, generation = act.deps().gen.as_str(), "re-adopting a run of this generation");
                act.deps().metrics.reclaimed("readopted", 1);
                act.launch(launch, ctx);
            }
            Ok(Readoption::Gone) => {
                act.orphans.remove(&run_id);
                if !act.runs.contains_key(&run_id) {
                    act.deps().registry.discard(&run_id);
                }
            }
            Ok(Readoption::Closed(successor)) => {
                act.orphans.remove(&run_id);
                act.launch_successor(successor, ctx);
            }
            Err(e) => {
                if undelivered {
                    act.undelivered.insert(run_id.clone());
                }
                let failures = act.orphans.entry(run_id.clone()).or_default();
                *failures += 1;
                tracing::warn!(run_id = %run_id, failures = *failures, error = %e, "re-adoption failed; retried at the next sweep");
            }
        }));
    }
}

/// What a re-adoption found.
pub(super) enum Readoption {
    Launch(Launch),
    /// The row is gone or owned elsewhere: nothing to drive.
    Gone,
    /// The row was closed (a deletion fence, or too many failed attempts); with its successor, if any.
    Closed(Option<(LiveRow, Vec<Value>)>),
}

/// Most sweeps a row of this generation may fail to re-adopt before it closes `interrupted`.
const MAX_READOPT_FAILURES: u32 = 3;

/// Plan the re-adoption of this generation's own row, as a reclaim would plan it (SPEC §6.1) — except a
/// row past its finishing gate whose actor lost storage at that gate (`undelivered`): this process knows
/// its reply never went out, so the reply continues from the saved answer (SPEC §5.2 step 7).
async fn plan_readoption(
    deps: &RunDeps,
    run_id: &RunId,
    undelivered: bool,
) -> Result<Readoption, String> {
    let s = &deps.storage;
    let Some(row) = s
        .get_live(run_id.to_owned())
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(Readoption::Gone);
    };
    if row.owner_gen != deps.gen.as_str() || row.phase == Phase::Handoff {
        return Ok(Readoption::Gone);
    }
    if s.is_killed(run_id.to_owned())
        .await
        .map_err(|e| e.to_string())?
    {
        let successor = purge_killed(deps.clone(), run_id.to_owned()).await;
        return Ok(Readoption::Closed(successor));
    }
    if !renew_orphan(deps, run_id).await? {
        return Ok(Readoption::Gone);
    }
    let last_step = s
        .last_step(run_id.to_owned())
        .await
        .map_err(|e| e.to_string())?;
    if undelivered && row.phase == Phase::Finishing {
        let events = s
            .live_events(run_id.to_owned(), 0, usize::MAX >> 1)
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let step = last_step.map_or(0, |l| l.step);
        return Ok(Readoption::Launch(Launch::Deliver { row, events, step }));
    }
    // Planned exactly as a reclaim plans a taken row: a row past its finishing gate closes with its final
    // status and is never resumed — its reply may have gone out (the record write was what failed), and
    // a resume would send it again or conclude another status than the one the gate committed.
    let phase = row.phase;
    Ok(
        match plan_row(deps, row, phase, last_step, deps.gen.as_str().to_owned()).await? {
            Fate::Launch(launch) => Readoption::Launch(launch),
            Fate::Closed(_, successor) => Readoption::Closed(successor),
        },
    )
}

/// Renew the lease of this generation's own row before it is driven or closed: no actor is tracked for
/// an orphan, so its lease runs out and another process may be reclaiming it right now. This write decides
/// which of the two drives the row before either shows it anywhere (a card posted, a tool run); `false`
/// when another generation took it (or it is gone).
async fn renew_orphan(deps: &RunDeps, run_id: &RunId) -> Result<bool, String> {
    let renewed = deps
        .storage
        .heartbeat(
            run_id.to_owned(),
            deps.gen.as_str().to_owned(),
            deps.lease_ms,
        )
        .await
        .map_err(|e| e.to_string())?;
    match renewed {
        Ok(_) => Ok(true),
        Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. }) => Ok(false),
        Err(refusal) => Err(refusal.to_string()),
    }
}

/// Close a row of this generation that no actor drives, with `status` naming `why`: an orphan that failed
/// [`MAX_READOPT_FAILURES`] sweeps (`interrupted`), or a run past its restart policy (`failed`, after a
/// `run_failed` event). A killed run is purged instead; a row gone, or another generation's, is left
/// alone (`Gone`).
pub(super) async fn close_own(
    deps: &RunDeps,
    run_id: &RunId,
    status: RunStatus,
    why: &str,
) -> Result<Readoption, String> {
    let s = &deps.storage;
    let Some(row) = s
        .get_live(run_id.to_owned())
        .await
        .map_err(|e| e.to_string())?
    else {
        return Ok(Readoption::Gone);
    };
    if row.owner_gen != deps.gen.as_str() {
        return Ok(Readoption::Gone);
    }
    // A killed run is purged, never closed (its finish would be refused at every sweep).
    if s.is_killed(run_id.to_owned())
        .await
        .map_err(|e| e.to_string())?
    {
        let successor = purge_killed(deps.clone(), run_id.to_owned()).await;
        return Ok(Readoption::Closed(successor));
    }
    if !renew_orphan(deps, run_id).await? {
        return Ok(Readoption::Gone);
    }
    // What the run's last incarnation published reaches the ledger first.
    let _ = deps
        .flusher
        .send(crate::flusher::FlushRun(run_id.to_owned()))
        .await;
    let mut events = s
        .live_events(run_id.to_owned(), 0, usize::MAX >> 1)
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    if status == RunStatus::Failed {
        let last = events
            .iter()
            .filter_map(storage::record::event_seq)
            .max()
            .unwrap_or(0);
        events.push(
            RunEvent::run_failed(why)
                .stamped(last + 1, deps.clock.now_ms())
                .into(),
        );
    }
    Ok(Readoption::Closed(
        run::close_row(deps, &row, events, status, why).await?,
    ))
}

// ---- Recovery: reclaim at boot and on a sweep (SPEC §6.1), drain as handoff (SPEC §6.4) ----

/// One reclaim pass. At boot (`defer_launch`) the runs to resume are held until [`OpenIngress`].
#[derive(Message)]
#[rtype(result = "Result<ReclaimReport, String>")]
pub struct ReclaimPass {
    pub defer_launch: bool,
}

/// Ingress is open: launch the runs the boot reclaim adopted and start the periodic sweep.
#[derive(Message)]
#[rtype(result = "()")]
pub struct OpenIngress;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReclaimReport {
    pub resumed: Vec<RunId>,
    pub restarted: Vec<RunId>,
    pub closed: Vec<(RunId, String)>,
    pub failed: Vec<RunId>,
    pub live_elsewhere: usize,
}

/// What one reclaimed row became.
#[allow(clippy::large_enum_variant)] // one per reclaimed row, moved once
enum Fate {
    Launch(Launch),
    /// Closed, how, and the successor its close admitted here for unread follow-ups.
    Closed(String, Option<(LiveRow, Vec<Value>)>),
}

/// Classify and act on one taken row (SPEC §6.1): purge it when killed, else [`plan_row`].
async fn take_row(deps: &RunDeps, r: storage::ledger::Reclaimed) -> Result<(RunId, Fate), String> {
    let id = r.row.run_id.clone();
    // A killed run is never resumed or closed: it is purged.
    if deps
        .storage
        .is_killed(id.clone())
        .await
        .map_err(|e| e.to_string())?
    {
        let successor = purge_killed(deps.clone(), id.clone()).await;
        return Ok((id, Fate::Closed("killed: purged".into(), successor)));
    }
    Ok((
        id,
        plan_row(deps, r.row, r.prior_phase, r.last_step, r.prior_owner).await?,
    ))
}

/// Classify a row this generation holds — taken by a reclaim from `from_gen`, or its own orphan — and
/// close it or plan its resume or restart (SPEC §6.1; [`decisions::classify`] decides).
async fn plan_row(
    deps: &RunDeps,
    row: LiveRow,
    prior_phase: Phase,
    last_step: Option<storage::ledger::StepRecord>,
    from_gen: String,
) -> Result<Fate, String> {
    let id = row.run_id.clone();
    let s = &deps.storage;
    let transcript = s
        .read_transcript(id.clone())
        .await
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
    let events = s
        .live_events(id.clone(), 0, usize::MAX >> 1)
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let fate = match decisions::classify(&input) {
        decisions::Classification::CloseFinal { status } => {
            let status = RunStatus::parse(&status).unwrap_or(RunStatus::Completed);
            let successor = run::close_row(
                deps,
                &row,
                events,
                status,
                "closed from finishing; delivery unknown",
            )
            .await?;
            Fate::Closed(status.as_str().into(), successor)
        }
        decisions::Classification::CloseHardStopped => {
            let successor = run::close_row(
                deps,
                &row,
                events,
                RunStatus::StoppedHard,
                "a hard stop was recorded",
            )
            .await?;
            Fate::Closed("stopped_hard".into(), successor)
        }
        decisions::Classification::CloseInterrupted { reason } => {
            let successor =
                run::close_row(deps, &row, events, RunStatus::Interrupted, &reason).await?;
            Fate::Closed(format!("interrupted: {reason}"), successor)
        }
        decisions::Classification::Restart => Fate::Launch(Launch::Restart {
            row,
            events,
            from_gen: Some(from_gen),
        }),
        decisions::Classification::Resume(point) => {
            let agent = row
                .meta
                .get("agent")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match last_step {
                Some(last_step) if deps.agents.contains_key(&agent) => {
                    Fate::Launch(Launch::Resume(Adoption {
                        row,
                        last_step,
                        transcript: transcript.turns,
                        events,
                        point,
                        from_gen,
                    }))
                }
                _ => {
                    let reason = format!("agent {agent:?} is not configured here");
                    let successor =
                        run::close_row(deps, &row, events, RunStatus::Interrupted, &reason).await?;
                    Fate::Closed(format!("interrupted: {reason}"), successor)
                }
            }
        }
    };
    Ok(fate)
}

impl Supervisor {
    /// Storage answered a sweep: re-adopt (or, after too many failures, close) every orphan, and make
    /// orphans of this generation's rows — and drop registry rows — that had no actor two sweeps running.
    fn attend(&mut self, mine: Vec<RunId>, ctx: &mut Context<Self>) {
        if self.config.draining.load(Ordering::SeqCst) {
            return;
        }
        let registry: Vec<RunId> = self
            .deps()
            .registry
            .rows()
            .into_iter()
            .filter(|r| r.finished_at.is_none())
            .map(|r| r.id)
            .collect();
        let idle: std::collections::BTreeSet<RunId> = mine
            .iter()
            .chain(&registry)
            .filter(|id| {
                !self.drives(id) && !self.handed.contains(*id) && !self.orphans.contains_key(*id)
            })
            .cloned()
            .collect();
        for id in idle.intersection(&self.unattended) {
            if mine.contains(id) {
                tracing::warn!(run_id = %id, generation = self.deps().gen.as_str(), "a row of this generation has no actor");
                self.orphans.insert(id.clone(), 0);
            } else {
                self.deps().registry.discard(id);
            }
        }
        self.unattended = idle;
        let orphans: Vec<(RunId, u32)> = self
            .orphans
            .iter()
            .map(|(id, n)| (id.clone(), *n))
            .collect();
        for (id, failures) in orphans {
            if self.drives(&id) {
                self.orphans.remove(&id);
            } else if failures >= MAX_READOPT_FAILURES {
                self.close_orphan(id, ctx);
            } else {
                self.readopt(id, ctx);
            }
        }
        let failing: Vec<RunId> = self
            .failing
            .iter()
            .filter(|id| !self.closing.contains(*id))
            .cloned()
            .collect();
        for id in failing {
            self.close_failed(&id, ctx);
        }
    }

    fn close_orphan(&mut self, run_id: RunId, ctx: &mut Context<Self>) {
        let deps = self.deps().clone();
        let id = run_id.clone();
        let fut = async move {
            let why = format!("could not be re-adopted in {MAX_READOPT_FAILURES} sweeps");
            close_own(&deps, &id, RunStatus::Interrupted, &why).await
        };
        ctx.spawn(fut.into_actor(self).map(move |closed, act, ctx| match closed {
            Ok(Readoption::Closed(successor)) => {
                act.orphans.remove(&run_id);
                act.launch_successor(successor, ctx);
            }
            Ok(_) => {
                act.orphans.remove(&run_id);
                act.deps().registry.discard(&run_id);
            }
            Err(e) => tracing::warn!(run_id = %run_id, error = %e, "closing an orphan failed; retried at the next sweep"),
        }));
    }

    fn launch_or_defer(&mut self, launch: Launch, defer: bool, ctx: &mut Context<Self>) {
        if defer {
            self.deferred.push(launch);
        } else {
            self.launch(launch, ctx);
        }
    }
}

impl Handler<ReclaimPass> for Supervisor {
    type Result = actix::ResponseActFuture<Self, Result<ReclaimReport, String>>;

    fn handle(&mut self, msg: ReclaimPass, _ctx: &mut Context<Self>) -> Self::Result {
        if self.sweeping {
            return Box::pin(actix::fut::ready(Ok(ReclaimReport::default())));
        }
        self.sweeping = true;
        let deps = self.deps().clone();
        let lease_ms = deps.lease_ms;
        let host_id = self.config.host_id.clone();
        let driven = self.driven();
        let fut = async move {
            let dead: Vec<String> = match deps.storage.generations().await {
                Ok(gens) => gens
                    .into_iter()
                    .filter(|g| g.gen != deps.gen.as_str() && crate::host::is_gone(g, &host_id))
                    .map(|g| g.gen)
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "could not read generations; no fast reclaim this pass");
                    Vec::new()
                }
            };
            // Receipts past their TTL, and dead generations that own nothing (SPEC §4.3 finish): once per pass.
            if let Err(e) = deps.storage.prune_dead(dead.clone()).await {
                tracing::warn!(error = %e, "could not prune receipts and dead generations; retried next pass");
            }
            // Finished runs past the retention policy and event rows nobody owns go even while nothing
            // is written (a put trims too, but an idle store has no puts).
            if let Err(e) = deps.storage.expire().await {
                tracing::warn!(error = %e, "could not expire finished runs; retried next pass");
            }
            close_open_cards(&deps).await;
            let answer = deps
                .storage
                .reclaim(deps.gen.as_str().to_owned(), lease_ms, dead, driven)
                .await
                .map_err(|e| e.to_string())?;
            let mut report = ReclaimReport {
                live_elsewhere: answer.live_elsewhere.len(),
                ..Default::default()
            };
            let mut launches = Vec::new();
            for r in answer.taken {
                let id = r.row.run_id.clone();
                let from_gen = r.row.owner_gen.clone();
                // One row's failure is logged and never stops the others; the row stays ours and is
                // re-adopted at a later sweep.
                match take_row(&deps, r).await {
                    Ok((id, Fate::Closed(how, successor))) => {
                        report.closed.push((id, how));
                        if let Some((row, events)) = successor {
                            launches.push(Launch::Restart {
                                row,
                                events,
                                from_gen: None,
                            });
                        }
                    }
                    Ok((id, Fate::Launch(l))) => {
                        let how = if matches!(l, Launch::Restart { .. }) {
                            "restarting"
                        } else {
                            "resuming"
                        };
                        tracing::info!(run_id = %id, generation = deps.gen.as_str(), from_gen = %from_gen, how, "reclaimed a run");
                        match &l {
                            Launch::Restart { .. } => report.restarted.push(id),
                            _ => report.resumed.push(id),
                        }
                        launches.push(l);
                    }
                    Err(e) => {
                        tracing::error!(run_id = %id, generation = deps.gen.as_str(), error = %e, "reclaimed row could not be classified or closed");
                        report.failed.push(id);
                    }
                }
            }
            deps.metrics
                .reclaimed("resumed", report.resumed.len() as u64);
            deps.metrics
                .reclaimed("restarted", report.restarted.len() as u64);
            deps.metrics.reclaimed("closed", report.closed.len() as u64);
            deps.metrics.reclaimed("failed", report.failed.len() as u64);
            if !(report.resumed.is_empty()
                && report.restarted.is_empty()
                && report.closed.is_empty())
            {
                tracing::info!(
                    generation = deps.gen.as_str(),
                    resumed = report.resumed.len(),
                    restarted = report.restarted.len(),
                    closed = report.closed.len(),
                    "reclaim pass"
                );
            }
            // Rows of this generation, to find any without an actor (SPEC §6.1: no run is live without one).
            let mine: Vec<RunId> = match deps.storage.list_live().await {
                Ok(rows) => rows
                    .into_iter()
                    .filter(|r| r.owner_gen == deps.gen.as_str() && r.phase != Phase::Handoff)
                    .map(|r| r.run_id)
                    .collect(),
                Err(_) => Vec::new(),
            };
            Ok::<_, String>((report, launches, mine))
        };
        Box::pin(fut.into_actor(self).map(move |result, act, ctx| {
            act.sweeping = false;
            let (report, launches, mine) = result?;
            for id in &report.failed {
                act.orphans.entry(id.clone()).or_default();
            }
            for l in launches {
                act.launch_or_defer(l, msg.defer_launch, ctx);
            }
            if !msg.defer_launch {
                act.attend(mine, ctx);
            }
            Ok(report)
        }))
    }
}

/// Boot a process's supervisor (SPEC §6.1): record its generation, start it, and reclaim before ingress
/// opens (the runs to resume wait for [`OpenIngress`], which the caller sends once it accepts messages).
/// An `Err` is a boot that failed: the process exits.
pub async fn boot(
    supervisor: Supervisor,
    info: storage::ledger::GenerationInfo,
) -> Result<(Addr<Supervisor>, ReclaimReport), String> {
    let storage = supervisor.config.storage.clone();
    storage
        .record_generation(info)
        .await
        .map_err(|e| format!("record the generation: {e}"))?;
    let supervisor = supervisor.start();
    let report = supervisor
        .send(ReclaimPass { defer_launch: true })
        .await
        .map_err(|e| format!("reach the supervisor: {e}"))?
        .map_err(|e| format!("reclaim at boot: {e}"))?;
    Ok((supervisor, report))
}

impl Handler<OpenIngress> for Supervisor {
    type Result = ();

    fn handle(&mut self, _msg: OpenIngress, ctx: &mut Context<Self>) {
        for l in std::mem::take(&mut self.deferred) {
            self.launch(l, ctx);
        }
        let every = Duration::from_millis(self.deps().lease_ms.max(100) as u64);
        ctx.run_interval(every, |_act, ctx| {
            ctx.address().do_send(ReclaimPass {
                defer_launch: false,
            });
        });
    }
}

/// How long after its record a run's card may stay open before a sweep closes it (the run's own process
/// stops trying once its row is gone; a sweep and a late close of the same card show the same frame).
const OPEN_CARD_AGE_MS: i64 = 10_000;
/// Cards closed per sweep at most.
const OPEN_CARDS_PER_PASS: usize = 16;

/// The orphan sweep of cards (SPEC §12): a finished run whose card never got its closing frame (its
/// record has `card` and no `cardClosed`: chat was unreachable when it ended, or its process died
/// right after the record) gets it now, from the record.
async fn close_open_cards(deps: &RunDeps) {
    if !deps.cards.enabled() {
        return;
    }
    let before = deps.clock.now_ms() - OPEN_CARD_AGE_MS;
    let ids = match deps.storage.open_cards(before, OPEN_CARDS_PER_PASS).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!(error = %e, "could not list open cards; retried next pass");
            return;
        }
    };
    for id in ids {
        let record = match deps.storage.get(id.clone()).await {
            Ok(Some(record)) => record,
            Ok(None) => continue,
            // A record that cannot be read never gets a frame: off the list, so it cannot hold it up.
            Err(e) => {
                tracing::warn!(run_id = %id, error = %e, "an unreadable record's card is given up");
                let _ = deps.storage.close_card(id).await;
                continue;
            }
        };
        let h = &record.head;
        let handle: Option<crate::channel::CardHandle> = h
            .extra
            .get(storage::record::CARD)
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        let thread = crate::channel::ThreadRef {
            channel: h.channel_id.clone(),
            thread_ts: h
                .thread_key
                .strip_prefix(&format!("{}:", h.channel_id))
                .unwrap_or(&h.thread_key)
                .to_owned(),
        };
        let closed = run::close_card_of(deps, &record, thread, handle).await;
        if closed.closed {
            match deps.storage.close_card(id.clone()).await {
                Ok(_) => {
                    tracing::info!(run_id = %id, generation = deps.gen.as_str(), "closed the card of a finished run")
                }
                Err(e) => {
                    tracing::warn!(run_id = %id, generation = deps.gen.as_str(), error = %e, "card closed; its record not yet marked")
                }
            }
        }
    }
}
