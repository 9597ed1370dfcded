//! Drain (SPEC §6.4): stop admitting, hand runs off at their step boundaries, wait for the rest.

use std::sync::atomic::Ordering;
use std::time::Duration;
use storage::RunId;

use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};
use storage::ledger::Phase;
use storage::record::RunStatus;

use crate::history::Via;
use crate::run::{self, RunDeps};

use super::Supervisor;

/// Drain: hand off resumable runs, wait for the rest, write provisional records at the deadline.
#[derive(Message)]
#[rtype(result = "DrainReport")]
pub struct Drain {
    pub deadline: Duration,
    pub handoff_budget: Duration,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrainReport {
    pub handed_off: Vec<RunId>,
    pub waited_for: usize,
    pub abandoned: Vec<RunId>,
}

/// How many run actors are still active, and which (not counting handed-off ones).
#[derive(Message)]
#[rtype(result = "Vec<RunId>")]
struct ActiveRuns;

impl Handler<ActiveRuns> for Supervisor {
    type Result = Vec<RunId>;

    fn handle(&mut self, _msg: ActiveRuns, _ctx: &mut Context<Self>) -> Vec<RunId> {
        self.runs
            .keys()
            .filter(|id| !self.handed.contains(*id))
            .cloned()
            .collect()
    }
}

impl Handler<Drain> for Supervisor {
    type Result = actix::ResponseActFuture<Self, DrainReport>;

    fn handle(&mut self, msg: Drain, ctx: &mut Context<Self>) -> Self::Result {
        self.config.draining.store(true, Ordering::SeqCst);
        // Every run hands itself off at its next step boundary: a model call stops at once, tool calls
        // in flight finish and their results commit first (SPEC §6.4).
        for run in self.runs.values() {
            run.do_send(run::DrainRun);
        }
        let deps = self.deps().clone();
        let me = ctx.address();
        let budget = msg.handoff_budget;
        let deadline = msg.deadline;
        let fut = async move {
            let started = tokio::time::Instant::now();
            // Wait for the boundaries, up to the handoff budget; runs in `finishing` or still attaching
            // are not resumable and are waited for below.
            loop {
                let active = me.send(ActiveRuns).await.unwrap_or_default();
                let resumable = resumable_here(&deps, &active).await;
                if resumable.is_empty() || started.elapsed() >= budget {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Calls still running at the budget are dropped: hand those runs off as they are, and the
            // next process settles their calls effects-unknown.
            let gen = deps.gen.as_str().to_owned();
            let active = me.send(ActiveRuns).await.unwrap_or_default();
            let late = resumable_here(&deps, &active).await;
            let handed: Vec<RunId> = match deps.storage.handoff(gen.clone(), late).await {
                Ok(results) => results
                    .into_iter()
                    .filter(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff)
                    .map(|(id, _)| id)
                    .collect(),
                Err(e) => {
                    tracing::warn!(generation = %gen, error = %e, "drain: handoff failed");
                    Vec::new()
                }
            };
            (handed, deps, me, started)
        };
        Box::pin(fut.into_actor(self).then(move |(handed, deps, me, started), act, _ctx| {
            for id in &handed {
                act.handed.insert(id.clone());
                if let Some(run) = act.runs.get(id) {
                    run.do_send(run::Fenced { why: "handed off to the next generation past the handoff budget" });
                }
                // The run discards its own registry row when it ends: discarding it here, before the run
                // sees the fence, would drop the `input` event of a follow-up its in-flight step commits.
            }
            if !handed.is_empty() {
                tracing::info!(generation = deps.gen.as_str(), runs = ?handed, "drain: handed off runs still busy at the budget");
            }
            let wait = async move {
                let mut waited_for = 0;
                loop {
                    let active = me.send(ActiveRuns).await.unwrap_or_default();
                    waited_for = waited_for.max(active.len());
                    if active.is_empty() || started.elapsed() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // At the deadline: a provisional full-snapshot record for every run still active here.
                let mut abandoned = Vec::new();
                for id in me.send(ActiveRuns).await.unwrap_or_default() {
                    let now = deps.clock.now_ms();
                    let provisional = run::RecordExtras { provisional: true, ..Default::default() };
                    if let Some(r) = run::build_record(&deps, &id, RunStatus::Interrupted, now, provisional) {
                        deps.history.write(r, Via::Store);
                        abandoned.push(id);
                    }
                }
                // Pending history writes get the handoff budget.
                let _ = tokio::time::timeout(budget, deps.history.settled()).await;
                DrainReport { handed_off: handed, waited_for, abandoned }
            };
            wait.into_actor(act)
        }))
    }
}

/// Of `active` (this process's runs), those resumable here: promoted (`live`), owned by this generation,
/// not detached. Never an attaching run, never one in `finishing`.
async fn resumable_here(deps: &RunDeps, active: &[RunId]) -> Vec<RunId> {
    if active.is_empty() {
        return Vec::new();
    }
    match deps.storage.list_live().await {
        Ok(rows) => rows
            .into_iter()
            // A run parked on approvals hands off as it stands: the next owner waits on the same calls.
            .filter(|r| {
                r.owner_gen == deps.gen.as_str()
                    && matches!(r.phase, Phase::Live | Phase::AwaitingApproval)
            })
            .filter(|r| !r.detached())
            .filter(|r| active.contains(&r.run_id))
            .map(|r| r.run_id)
            .collect(),
        Err(e) => {
            tracing::warn!(generation = deps.gen.as_str(), error = %e, "drain: could not list live rows");
            Vec::new()
        }
    }
}
