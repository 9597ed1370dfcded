//! `PlanCoordinator`: the one in-process owner of suggestion invocations per runner/store (SPEC §9).
//!
//! Owns the invocations of this process — at most one per plan identity, at most `[plan] max_concurrent`
//! in all — from admission until their provider has terminated. It owns no durable state: every durable
//! write is one store transaction through the [`StorageHandle`] (`allocate_request`, `complete_suggestions`,
//! `settle_suggestion`), and the store stays the only authority that advances a revision. Construct ONE
//! per runner/store ([`PlanHandle::spawn`]), never one per HTTP request.
//!
//! Messages in (through [`PlanHandle`]): start, cancel, inspect, watch an outcome, sweep, close; from its
//! own tasks: a provider terminated, a timer fired, the sweep interval. Out: the provider's abort signal,
//! store transactions.
//!
//! | holder | states and legal transitions | owner |
//! |---|---|---|
//! | coordinator | `open → closing`; closing refuses new starts synchronously (in [`PlanHandle::start`], before any await) | the runner |
//! | invocation | `pending → running → completed \| failed \| cancelled \| stale`; pending may cancel before launch ([`InvocationState`]) | this actor, until its provider terminates |
//! | stop | the first cause (timeout, cancellation, shutdown) is retained; the durable request settles and abort is requested at once; the invocation stays tracked, its result pending, until the provider terminates | this actor and the provider |
//! | durable request | `pending → ready → consumed`, or `pending → failed \| cancelled \| invalidated` | the store (`storage::plan`) |
//!
//! Invariants, several of them absences:
//! - admission compares the caller's complete identity (plan id, revision, snapshot id) inside the same
//!   store transaction that allocates the request id; the coordinator never allocates a revision or an id;
//! - no lease, clock or elapsed-time rule ever releases a plan's slot: only the provider's termination does,
//!   so a start (a retry included) answers `Busy` for as long as the invocation is tracked;
//! - a timeout never resolves an invocation early: it settles the durable request and requests abort, and
//!   the result waits for the provider like any other stop;
//! - publication validates every card and then runs the store's completion CAS, whose single transaction
//!   compares the plan's current revision and snapshot and the request's pending state and binding — nothing
//!   awaits between the checks and the write;
//! - every failed, cancelled or stale ending goes through `settle_suggestion` on the exact pending attempt;
//!   when the store refuses (another process completed, cancelled or invalidated first), the durable row is
//!   reread and reclassifies the answer, and the original diagnostic is kept beside it;
//! - `close()` never closes storage;
//! - no request is left pending by a crash (SPEC §9 "Crashes"): each records its holder — this process's
//!   generation — and a lease the holder renews every third of a lease. A sweep at boot, every third of a
//!   lease and whenever another generation holds a plan a start asks for, settles `failed (interrupted)`
//!   through `settle_suggestion` every pending request whose holder is dead: its process provably gone
//!   from this host (the reclaim's rule, [`crate::host::is_gone`]) or past its lease (a holder on another
//!   host, or one stalled that long; a holder with no `generations` row waits for its lease too). A live
//!   holder keeps its plan: a start then answers `Busy` naming the holder's request.
//!
//! # Design
//! Admission is an [`AtomicResponse`]: between the synchronous checks (`Busy`, `Capacity`) and tracking the
//! allocated request, no other message runs, so two starts for one plan cannot both allocate. Providers run
//! as their own tasks and report back with a message, so they progress while the actor awaits storage. The
//! durable settlement a stop asks for is one shared future: the cancel that caused it, inspections and the
//! final reconciliation all await the same transaction instead of racing it.

mod agent;
mod handle;
mod provider;
mod state;
mod vocabulary;

pub use handle::PlanHandle;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, AtomicResponse, Context, Handler, Message,
    ResponseFuture, SpawnHandle, WrapFuture,
};
use futures_util::future::{LocalBoxFuture, Shared};
use futures_util::FutureExt;
use storage::plan::{
    Consumed, Import, Imported, Orphan, Plan, PlanBinding, PlanId, PlanOutcome, PlanRefusal,
    PlanRequest, RequestId, RequestState, SnapshotId, TerminalReason,
};
use storage::{Generation, StorageHandle};
use tokio::sync::oneshot;

pub use agent::{compose_prompt, parse_cards, plan_request, AgentPlanProvider};
pub use provider::{
    AbortSignal, AbortTrigger, ProviderError, ProviderResult, SuggestionInput, SuggestionJob,
    SuggestionProvider, Timer, TokioTimer,
};
pub use state::{classify, decide_finish, Finish, InvocationState, StopCause};

pub use vocabulary::{
    InvocationOutcome, LocalInvocation, PlanError, PlanIdentity, PlanSettings, StartError, Started,
    SuggestionView,
};

/// Outcomes kept after their invocation resolved, so a late `outcome()` still sees the original diagnostic.
const RECENT_OUTCOMES: usize = 256;

/// The answer of a durable settlement, shareable between everyone who waits for it.
type SettleAnswer = Result<PlanOutcome<PlanRequest>, String>;
type SharedSettle = Shared<LocalBoxFuture<'static, SettleAnswer>>;

struct Invocation {
    request_id: RequestId,
    binding: PlanBinding,
    /// The frozen copy of the caller's input.
    input: Arc<SuggestionInput>,
    state: InvocationState,
    stop: Option<StopCause>,
    /// Requests the provider's abort; set at launch.
    abort: Option<AbortTrigger>,
    /// The pending timeout, cancelled when the provider terminates.
    timer: Option<SpawnHandle>,
    /// The provider has terminated (or will never launch); only the final store round trip remains, which
    /// a later stop no longer races.
    provider_done: bool,
    /// The durable settlement the first stop asked for.
    settling: Option<SharedSettle>,
    /// Callers waiting for the outcome; answered when the invocation resolves.
    waiters: Vec<oneshot::Sender<InvocationOutcome>>,
}

impl Invocation {
    fn local(&self) -> LocalInvocation {
        LocalInvocation {
            state: self.state,
            stopping: self.stop,
        }
    }

    fn advance(&mut self, next: InvocationState) {
        debug_assert!(self.state.can_become(next), "{:?} -> {next:?}", self.state);
        self.state = next;
    }
}

/// `open → closing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Closing,
}

pub struct PlanCoordinator {
    storage: StorageHandle,
    /// This process's generation: the holder recorded on every request this coordinator allocates.
    generation: Generation,
    provider: Arc<dyn SuggestionProvider>,
    timer: Arc<dyn Timer>,
    settings: PlanSettings,
    /// Flipped by [`PlanHandle::close`] synchronously, before the close message reaches this actor; read
    /// after an allocation so a start admitted just before close is cancelled before launch.
    closing: Arc<AtomicBool>,
    phase: Phase,
    /// Tracked invocations by plan identity: the one-active-invocation rule is this map's key.
    active: HashMap<PlanId, Invocation>,
    recent: VecDeque<InvocationOutcome>,
    /// `close()` callers, answered when the last invocation resolves.
    drained: Vec<oneshot::Sender<()>>,
    /// A periodic sweep is in flight: the next tick skips rather than piling up behind slow storage.
    sweeping: bool,
}

impl Actor for PlanCoordinator {
    type Context = Context<Self>;

    /// The boot sweep runs before any message is handled, so no start races a dead holder's request; then
    /// renewals and sweeps every third of a lease.
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.wait(
            self.sweep()
                .into_actor(self)
                .map(|answer, _act, _ctx| log_sweep("boot", answer)),
        );
        ctx.run_interval(
            (self.settings.lease / 3).max(Duration::from_millis(10)),
            |act, ctx| {
                if act.sweeping {
                    return;
                }
                act.sweeping = true;
                ctx.spawn(act.sweep().into_actor(act).map(|answer, act, _ctx| {
                    act.sweeping = false;
                    log_sweep("periodic", answer);
                }));
            },
        );
    }
}

impl PlanCoordinator {
    /// A sweep of the durable requests as of now (see [`sweep`]).
    fn sweep(&self) -> impl Future<Output = Result<Vec<PlanRequest>, storage::Error>> + 'static {
        let running = self.active.values().map(|i| i.request_id.clone()).collect();
        sweep(
            self.storage.clone(),
            self.generation.clone(),
            self.settings.host_id.clone(),
            running,
            self.settings.lease_ms(),
        )
    }

    fn admission(&self, plan_id: &PlanId) -> Result<(), StartError> {
        if self.phase == Phase::Closing {
            return Err(StartError::Closing);
        }
        if let Some(inv) = self.active.get(plan_id) {
            return Err(StartError::Busy {
                request_id: inv.request_id.clone(),
            });
        }
        if self.active.len() >= self.settings.max_concurrent {
            return Err(StartError::Capacity {
                limit: self.settings.max_concurrent,
            });
        }
        Ok(())
    }

    fn find(&self, request_id: &RequestId) -> Option<&Invocation> {
        self.active.values().find(|i| &i.request_id == request_id)
    }

    /// Track a freshly allocated request, then launch it — or, when `close()` flipped admission while
    /// the allocation was in flight, cancel it before launch.
    fn track(
        &mut self,
        request: PlanRequest,
        input: Arc<SuggestionInput>,
        ctx: &mut Context<Self>,
    ) -> Started {
        let binding = request.binding();
        let plan_id = binding.plan_id.clone();
        self.active.insert(
            plan_id.clone(),
            Invocation {
                request_id: request.request_id.clone(),
                binding: binding.clone(),
                input,
                state: InvocationState::Pending,
                stop: None,
                abort: None,
                timer: None,
                provider_done: false,
                settling: None,
                waiters: Vec::new(),
            },
        );
        tracing::info!(plan_id = plan_id.as_str(), request_id = request.request_id.as_str(), revision = %binding.revision, "admitted a suggestion request");
        if self.closing.load(Ordering::SeqCst) {
            self.stop(&plan_id, StopCause::Shutdown, ctx);
        } else {
            self.launch(&plan_id, ctx);
        }
        Started {
            request_id: request.request_id,
            binding,
        }
    }

    fn launch(&mut self, plan_id: &PlanId, ctx: &mut Context<Self>) {
        let Some(inv) = self.active.get(plan_id) else {
            return;
        };
        let request_id = inv.request_id.clone();
        let job = SuggestionJob {
            request_id: request_id.clone(),
            binding: inv.binding.clone(),
            input: inv.input.clone(),
        };
        let (trigger, signal) = AbortTrigger::pair();
        let run = self.provider.invoke(job, signal);
        let (pid, rid) = (plan_id.clone(), request_id.clone());
        let timer = ctx.spawn(
            self.timer
                .sleep(self.settings.timeout)
                .into_actor(self)
                .map(move |(), act, ctx| act.timed_out(&pid, &rid, ctx)),
        );
        let addr = ctx.address();
        let (pid, rid) = (plan_id.clone(), request_id);
        actix::spawn(async move {
            let result = run.await;
            addr.do_send(ProviderTerminated {
                plan_id: pid,
                request_id: rid,
                result: Some(result),
            });
        });
        let inv = self.active.get_mut(plan_id).expect("checked above");
        inv.abort = Some(trigger);
        inv.timer = Some(timer);
        inv.advance(InvocationState::Running);
    }

    fn timed_out(&mut self, plan_id: &PlanId, request_id: &RequestId, ctx: &mut Context<Self>) {
        if self
            .active
            .get(plan_id)
            .is_some_and(|i| &i.request_id == request_id && i.state == InvocationState::Running)
        {
            self.stop(plan_id, StopCause::Timeout, ctx);
        }
    }

    /// Stop a tracked invocation for `cause`, unless an earlier cause already did (the first is retained) or
    /// its provider has already terminated (its ending is being recorded):
    /// settle the durable request and request abort, both at once. The invocation stays tracked until
    /// its provider terminates; one never launched terminates here. Answers the durable settlement.
    fn stop(
        &mut self,
        plan_id: &PlanId,
        cause: StopCause,
        ctx: &mut Context<Self>,
    ) -> Option<SharedSettle> {
        let storage = self.storage.clone();
        let timeout = self.settings.timeout;
        let inv = self.active.get_mut(plan_id)?;
        if inv.stop.is_some() || inv.provider_done {
            return inv.settling.clone();
        }
        inv.stop = Some(cause);
        let (request_id, binding) = (inv.request_id.clone(), inv.binding.clone());
        let settlement = cause.settlement(timeout);
        let settle: SharedSettle = async move {
            storage
                .settle_suggestion(request_id, binding, settlement)
                .await
                .map_err(|e| e.to_string())
        }
        .boxed_local()
        .shared();
        actix::spawn(settle.clone().map(drop));
        inv.settling = Some(settle.clone());
        if let Some(abort) = &inv.abort {
            abort.request();
        }
        tracing::info!(
            plan_id = plan_id.as_str(),
            request_id = inv.request_id.as_str(),
            cause = cause.as_str(),
            "stopping a suggestion request"
        );
        if inv.state == InvocationState::Pending {
            let request_id = inv.request_id.clone();
            self.terminated(plan_id.clone(), request_id, None, ctx);
        }
        Some(settle)
    }

    /// The provider terminated (or, for `None`, will never launch): publish or settle, reconcile with the
    /// durable row, then resolve.
    fn terminated(
        &mut self,
        plan_id: PlanId,
        request_id: RequestId,
        result: Option<ProviderResult>,
        ctx: &mut Context<Self>,
    ) {
        let Some(inv) = self
            .active
            .get_mut(&plan_id)
            .filter(|i| i.request_id == request_id && !i.provider_done)
        else {
            return;
        };
        inv.provider_done = true;
        if let Some(timer) = inv.timer.take() {
            ctx.cancel_future(timer);
        }
        let finish = decide_finish(inv.stop, result, self.settings.timeout);
        let fut = finish_invocation(
            self.storage.clone(),
            request_id,
            inv.binding.clone(),
            inv.settling.clone(),
            finish,
        );
        ctx.spawn(
            fut.into_actor(self)
                .map(move |outcome, act, _ctx| act.resolve(&plan_id, outcome)),
        );
    }

    fn resolve(&mut self, plan_id: &PlanId, outcome: InvocationOutcome) {
        if self
            .active
            .get(plan_id)
            .is_none_or(|i| i.request_id != outcome.request_id)
        {
            return;
        }
        let mut inv = self.active.remove(plan_id).expect("checked above");
        inv.advance(outcome.state);
        tracing::info!(
            plan_id = plan_id.as_str(),
            request_id = outcome.request_id.as_str(),
            state = outcome.state.as_str(),
            reason = outcome.reason.map(TerminalReason::as_str),
            "a suggestion request resolved"
        );
        for w in inv.waiters.drain(..) {
            let _ = w.send(outcome.clone());
        }
        self.recent.push_back(outcome);
        if self.recent.len() > RECENT_OUTCOMES {
            self.recent.pop_front();
        }
        if self.active.is_empty() {
            for d in self.drained.drain(..) {
                let _ = d.send(());
            }
        }
    }
}

/// One sweep (SPEC §9 "Crashes"): renew the lease of `running` (the requests this coordinator tracks),
/// then settle `failed (interrupted)` through `settle_suggestion` every pending request whose holder is
/// dead — gone from this host, or past its lease. Renewing first means a live holder's own sweep never
/// finds its own tracked requests expired. Answers the rows it settled.
async fn sweep(
    storage: StorageHandle,
    generation: Generation,
    host_id: String,
    running: Vec<RequestId>,
    lease_ms: i64,
) -> Result<Vec<PlanRequest>, storage::Error> {
    if !running.is_empty() {
        storage
            .renew_plan_requests(generation.clone(), running, lease_ms)
            .await?;
    }
    let dead = storage
        .generations()
        .await?
        .into_iter()
        .filter(|g| g.gen != generation.as_str() && crate::host::is_gone(g, &host_id))
        .filter_map(|g| Generation::parse(&g.gen))
        .collect();
    let mut settled = Vec::new();
    for Orphan { request, cause } in storage.orphaned_plan_requests(dead).await? {
        let id = request.request_id.clone();
        match storage
            .settle_suggestion(id.clone(), request.binding(), cause.settlement())
            .await?
        {
            Ok(row) => {
                let plan_id = row.plan_id.as_str();
                tracing::warn!(plan_id, request_id = id.as_str(), %cause, "settled an orphaned suggestion request as interrupted");
                settled.push(row);
            }
            // Its holder, alive after all, or another sweep ended it first: that ending stands.
            Err(refusal) => {
                tracing::info!(request_id = id.as_str(), %refusal, "an orphaned suggestion request had already ended")
            }
        }
    }
    Ok(settled)
}

fn log_sweep(which: &'static str, answer: Result<Vec<PlanRequest>, storage::Error>) {
    match answer {
        Ok(settled) if !settled.is_empty() => {
            tracing::info!(
                sweep = which,
                settled = settled.len(),
                "swept orphaned suggestion requests"
            )
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(sweep = which, error = %e, "failed to sweep orphaned suggestion requests; the next sweep retries")
        }
    }
}

/// Publish or settle as decided, then read the durable state and classify by it.
async fn finish_invocation(
    storage: StorageHandle,
    request_id: RequestId,
    binding: PlanBinding,
    settling: Option<SharedSettle>,
    finish: Finish,
) -> InvocationOutcome {
    // The local classification and reason, the original diagnostic, and the store's answer.
    let (local, local_reason, diagnostic, answer) = match finish {
        Finish::Publish(cards) => {
            let answer = storage
                .complete_suggestions(request_id.clone(), binding, cards)
                .await
                .map_err(|e| e.to_string());
            match &answer {
                Ok(Ok(_)) => (InvocationState::Completed, None, None, answer),
                Ok(Err(refusal)) => (
                    InvocationState::Completed,
                    None,
                    Some(refusal.to_string()),
                    answer,
                ),
                Err(e) => (
                    InvocationState::Failed,
                    None,
                    Some(format!("storage: {e}")),
                    answer,
                ),
            }
        }
        Finish::Settle {
            settlement,
            state,
            diagnostic,
        } => {
            let reason = settlement.reason;
            // A stop already asked for this settlement: its answer stands (a repeat would only be refused).
            let earlier = match settling {
                Some(s) => Some(s.await),
                None => None,
            };
            let answer = match earlier {
                Some(Ok(answer)) => Ok(answer),
                _ => storage
                    .settle_suggestion(request_id.clone(), binding, settlement)
                    .await
                    .map_err(|e| e.to_string()),
            };
            (state, Some(reason), Some(diagnostic), answer)
        }
    };
    let durable = match answer {
        Ok(Ok(row)) => Some(row),
        // Refused: another process completed, cancelled or invalidated it first. Read what is durable now.
        Ok(Err(refusal)) => match storage.plan_request(request_id.clone()).await {
            Ok(Some(row)) => Some(row),
            Ok(None) => refusal.found().cloned(),
            Err(e) => {
                tracing::warn!(request_id = request_id.as_str(), error = %e, "could not reread a refused suggestion request");
                refusal.found().cloned()
            }
        },
        Err(e) => {
            tracing::error!(request_id = request_id.as_str(), error = %e, "failed to record a suggestion request's ending; it stays pending");
            None
        }
    };
    let state = classify(local, durable.as_ref());
    let reason = match state {
        InvocationState::Completed => None,
        _ => durable.as_ref().and_then(|r| r.reason).or(local_reason),
    };
    InvocationOutcome {
        request_id,
        state,
        reason,
        diagnostic,
        request: durable,
    }
}

/// Admit a start (one allocation transaction; nothing else interleaves).
#[derive(Message)]
#[rtype(result = "Result<Started, StartError>")]
struct StartSuggestion {
    identity: PlanBinding,
    input: Arc<SuggestionInput>,
}

impl Handler<StartSuggestion> for PlanCoordinator {
    type Result = AtomicResponse<Self, Result<Started, StartError>>;

    fn handle(&mut self, msg: StartSuggestion, _ctx: &mut Context<Self>) -> Self::Result {
        if let Err(refused) = self.admission(&msg.identity.plan_id) {
            return AtomicResponse::new(Box::pin(actix::fut::ready(Err(refused))));
        }
        let storage = self.storage.clone();
        let generation = self.generation.clone();
        let lease_ms = self.settings.lease_ms();
        let sweep = self.sweep();
        let identity = msg.identity;
        let input = msg.input;
        let allocation = async move {
            let allocate =
                || storage.allocate_request(identity.clone(), generation.clone(), lease_ms);
            match allocate().await {
                // Another generation holds the plan: if that holder is dead, a sweep frees it; ask once more.
                Ok(Err(PlanRefusal::Held { .. })) => {
                    log_sweep("admission", sweep.await);
                    allocate().await
                }
                answer => answer,
            }
        };
        AtomicResponse::new(Box::pin(allocation.into_actor(self).map(
            move |allocated, act, ctx| match allocated {
                Ok(Ok(request)) => Ok(act.track(request, input, ctx)),
                // A live process runs this identity.
                Ok(Err(PlanRefusal::Held { found })) => Err(StartError::Busy {
                    request_id: found.request_id,
                }),
                Ok(Err(refusal)) => Err(StartError::Refused(refusal)),
                Err(e) => {
                    tracing::warn!(error = %e, "could not allocate a suggestion request");
                    Err(StartError::Unavailable(e.to_string()))
                }
            },
        )))
    }
}

/// A provider's invocation terminated.
#[derive(Message)]
#[rtype(result = "()")]
struct ProviderTerminated {
    plan_id: PlanId,
    request_id: RequestId,
    result: Option<ProviderResult>,
}

impl Handler<ProviderTerminated> for PlanCoordinator {
    type Result = ();

    fn handle(&mut self, msg: ProviderTerminated, ctx: &mut Context<Self>) {
        self.terminated(msg.plan_id, msg.request_id, msg.result, ctx);
    }
}

/// Cancel a request: a tracked one stops (first cause retained); an untracked pending one is settled at
/// its own binding (another process's attempt, or an orphan).
#[derive(Message)]
#[rtype(result = "Result<SuggestionView, PlanError>")]
struct CancelSuggestion {
    request_id: RequestId,
}

impl Handler<CancelSuggestion> for PlanCoordinator {
    type Result = ResponseFuture<Result<SuggestionView, PlanError>>;

    fn handle(&mut self, msg: CancelSuggestion, ctx: &mut Context<Self>) -> Self::Result {
        let storage = self.storage.clone();
        let timeout = self.settings.timeout;
        let id = msg.request_id;
        let tracked = self.find(&id).map(|i| i.binding.plan_id.clone());
        let (settling, local) = match &tracked {
            Some(plan_id) => {
                let settling = self.stop(plan_id, StopCause::Cancelled, ctx);
                (settling, self.active.get(plan_id).map(Invocation::local))
            }
            None => (None, None),
        };
        Box::pin(async move {
            match (tracked, settling) {
                (Some(_), Some(settle)) => {
                    let _ = settle.await;
                }
                // Tracked, but its provider already terminated: its ending is being recorded; leave it be.
                (Some(_), None) => {}
                (None, _) => {
                    if let Some(row) = storage.plan_request(id.clone()).await? {
                        if row.state == RequestState::Pending {
                            let settlement = StopCause::Cancelled.settlement(timeout);
                            storage
                                .settle_suggestion(id.clone(), row.binding(), settlement)
                                .await?
                                .ok();
                        }
                    }
                }
            }
            let request = storage
                .plan_request(id.clone())
                .await?
                .ok_or_else(|| PlanError::NotFound(format!("request {}", id.as_str())))?;
            Ok(SuggestionView {
                request,
                invocation: local,
            })
        })
    }
}

/// The durable row and the local invocation, after any settlement in flight for it.
#[derive(Message)]
#[rtype(result = "Result<SuggestionView, PlanError>")]
struct InspectSuggestion {
    request_id: RequestId,
}

impl Handler<InspectSuggestion> for PlanCoordinator {
    type Result = ResponseFuture<Result<SuggestionView, PlanError>>;

    fn handle(&mut self, msg: InspectSuggestion, _ctx: &mut Context<Self>) -> Self::Result {
        let storage = self.storage.clone();
        let (local, settling) = match self.find(&msg.request_id) {
            Some(inv) => (Some(inv.local()), inv.settling.clone()),
            None => (None, None),
        };
        let id = msg.request_id;
        Box::pin(async move {
            if let Some(settle) = settling {
                let _ = settle.await;
            }
            let request = storage
                .plan_request(id.clone())
                .await?
                .ok_or_else(|| PlanError::NotFound(format!("request {}", id.as_str())))?;
            Ok(SuggestionView {
                request,
                invocation: local,
            })
        })
    }
}

/// Wait for a request's outcome.
#[derive(Message)]
#[rtype(result = "Result<InvocationOutcome, PlanError>")]
struct WatchSuggestion {
    request_id: RequestId,
}

impl Handler<WatchSuggestion> for PlanCoordinator {
    type Result = ResponseFuture<Result<InvocationOutcome, PlanError>>;

    fn handle(&mut self, msg: WatchSuggestion, _ctx: &mut Context<Self>) -> Self::Result {
        let id = msg.request_id;
        if let Some(inv) = self.active.values_mut().find(|i| i.request_id == id) {
            let (tx, rx) = oneshot::channel();
            inv.waiters.push(tx);
            return Box::pin(async move {
                rx.await
                    .map_err(|_| PlanError::Unavailable("the plan coordinator stopped".into()))
            });
        }
        if let Some(done) = self.recent.iter().rev().find(|o| o.request_id == id) {
            let done = done.clone();
            return Box::pin(async move { Ok(done) });
        }
        let storage = self.storage.clone();
        Box::pin(async move {
            let row = storage
                .plan_request(id.clone())
                .await?
                .ok_or_else(|| PlanError::NotFound(format!("request {}", id.as_str())))?;
            if row.state == RequestState::Pending {
                return Err(PlanError::NotTracked {
                    request: Box::new(row),
                });
            }
            Ok(InvocationOutcome::from_durable(row))
        })
    }
}

/// Sweep now: renew this coordinator's leases and settle every orphaned request (see [`sweep`]).
#[derive(Message)]
#[rtype(result = "Result<Vec<PlanRequest>, PlanError>")]
struct SweepRequests;

impl Handler<SweepRequests> for PlanCoordinator {
    type Result = ResponseFuture<Result<Vec<PlanRequest>, PlanError>>;

    fn handle(&mut self, _msg: SweepRequests, _ctx: &mut Context<Self>) -> Self::Result {
        let sweep = self.sweep();
        Box::pin(async move { Ok(sweep.await?) })
    }
}

/// `open → closing`: stop every invocation for shutdown and answer once all providers have terminated.
#[derive(Message)]
#[rtype(result = "()")]
struct CloseCoordinator;

impl Handler<CloseCoordinator> for PlanCoordinator {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _msg: CloseCoordinator, ctx: &mut Context<Self>) -> Self::Result {
        self.closing.store(true, Ordering::SeqCst);
        if self.phase == Phase::Open {
            tracing::info!(
                active = self.active.len(),
                "the plan coordinator is closing"
            );
        }
        self.phase = Phase::Closing;
        let plans: Vec<PlanId> = self.active.keys().cloned().collect();
        for plan_id in plans {
            self.stop(&plan_id, StopCause::Shutdown, ctx);
        }
        if self.active.is_empty() {
            return Box::pin(async {});
        }
        let (tx, rx) = oneshot::channel();
        self.drained.push(tx);
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}
