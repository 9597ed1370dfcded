//! The plan coordinator (SPEC §9) against real SQLite, with controllable providers and timers.
//!
//! Every provider invocation here is a [`ControlledProvider`] call that resolves, rejects or hangs until
//! the test says so, and every timeout is a [`ManualTimer`] the test fires — no real sleeps, no timed
//! assertions. Each case asserts both the returned outcome and the durable row (read through the store,
//! and after a "restart" through a fresh `SqliteStore` on the file). "Another process" is a second storage
//! actor with its own connection to the same file, as a rolling restart's old and new process have, under
//! a generation of its own; every storage actor of a fixture reads one manual clock, so leases run out
//! only when a test advances it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::host;
use actors::plan::{
    AbortSignal, InvocationState, PlanHandle, PlanIdentity, PlanSettings, ProviderError,
    ProviderResult, StartError, StopCause, SuggestionInput, SuggestionJob, SuggestionProvider,
    Timer,
};
use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use serde_json::json;
use storage::ledger::GenerationInfo;
use storage::plan::{
    Card, Import, PlanBinding, PlanId, PlanRefusal, PlanRequest, PlanStore, RequestId,
    RequestState, Revision, SettleOutcome, Settlement, SnapshotId, TerminalReason,
    MAX_DIAGNOSTIC_BYTES,
};
use storage::{BackendSpec, Generation, ManualClock, SqliteStore, StorageHandle, Synchronous};
use tokio::sync::oneshot;

const NOW: i64 = 1_800_000_000_000;
const TIMEOUT: Duration = Duration::from_secs(30);
const LEASE: Duration = Duration::from_secs(30);
const LEASE_MS: i64 = 30_000;

// ---- controllable provider and timer ----

struct Call {
    job: SuggestionJob,
    abort: AbortSignal,
    reply: Option<oneshot::Sender<ProviderResult>>,
}

/// A provider whose invocations resolve, reject or hang on command. It never ends on its own, not even
/// when asked to abort: the test decides when the "subprocess" has terminated.
#[derive(Clone, Default)]
struct ControlledProvider {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl SuggestionProvider for ControlledProvider {
    fn invoke(
        &self,
        job: SuggestionJob,
        abort: AbortSignal,
    ) -> LocalBoxFuture<'static, ProviderResult> {
        let (tx, rx) = oneshot::channel();
        self.calls.lock().unwrap().push(Call {
            job,
            abort,
            reply: Some(tx),
        });
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(ProviderError::Aborted("the test dropped the call".into())))
        })
    }
}

impl ControlledProvider {
    fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn job(&self, i: usize) -> SuggestionJob {
        self.calls.lock().unwrap()[i].job.clone()
    }

    fn abort_requested(&self, i: usize) -> bool {
        self.calls.lock().unwrap()[i].abort.is_requested()
    }

    fn finish(&self, i: usize, result: ProviderResult) {
        let reply = self.calls.lock().unwrap()[i]
            .reply
            .take()
            .expect("each call finishes once");
        reply
            .send(result)
            .expect("the coordinator still waits for the call");
    }

    fn resolve(&self, i: usize, cards: Vec<Card>) {
        self.finish(i, Ok(cards));
    }

    fn reject(&self, i: usize, diagnostic: &str) {
        self.finish(i, Err(ProviderError::Rejected(diagnostic.to_owned())));
    }

    /// The generic error a provider gives once it has honoured an abort.
    fn end_aborted(&self, i: usize) {
        self.finish(
            i,
            Err(ProviderError::Aborted("terminated by signal".into())),
        );
    }
}

type Fire = oneshot::Sender<oneshot::Sender<()>>;

/// A timer that fires only when told. Firing waits for the timer future to acknowledge, which it does
/// from inside the coordinator's poll, right before the coordinator handles the timeout synchronously.
#[derive(Clone, Default)]
struct ManualTimer {
    pending: Arc<Mutex<Vec<(Duration, Fire)>>>,
}

impl Timer for ManualTimer {
    fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()> {
        let (tx, rx) = oneshot::channel::<oneshot::Sender<()>>();
        self.pending.lock().unwrap().push((duration, tx));
        Box::pin(async move {
            match rx.await {
                Ok(ack) => {
                    let _ = ack.send(());
                }
                // The timer was dropped unfired: it never fires.
                Err(_) => std::future::pending::<()>().await,
            }
        })
    }
}

impl ManualTimer {
    /// Fire every armed timer whose future is still alive; answers how many fired.
    async fn fire_all(&self) -> usize {
        let armed: Vec<(Duration, Fire)> = std::mem::take(&mut *self.pending.lock().unwrap());
        let mut fired = 0;
        for (duration, fire) in armed {
            assert_eq!(duration, TIMEOUT);
            let (ack_tx, ack_rx) = oneshot::channel();
            if fire.send(ack_tx).is_ok() && ack_rx.await.is_ok() {
                fired += 1;
            }
        }
        fired
    }
}

// ---- fixture ----

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    clock: Arc<ManualClock>,
    storage: StorageHandle,
    provider: ControlledProvider,
    timer: ManualTimer,
    plans: PlanHandle,
}

fn settings(max_concurrent: usize) -> PlanSettings {
    PlanSettings {
        max_concurrent,
        timeout: TIMEOUT,
        lease: LEASE,
        host_id: host::hostname(),
    }
}

/// A storage actor with its own connection to `path`: one process's view of the database.
fn process_storage(path: &Path, clock: &Arc<ManualClock>) -> StorageHandle {
    StorageHandle::start(
        BackendSpec::Sqlite {
            path: path.to_owned(),
            synchronous: Synchronous::Normal,
        },
        clock.clone(),
    )
}

/// Record a fresh generation as `generations` would hold it for a process like this one, adjusted by
/// `adjust` (another host, a pid that is gone); answers it.
async fn record_generation(
    storage: &StorageHandle,
    adjust: impl FnOnce(GenerationInfo) -> GenerationInfo,
) -> Generation {
    let generation = Generation::mint(NOW);
    storage
        .record_generation(adjust(host::this_process(
            generation.as_str(),
            NOW,
            &host::hostname(),
        )))
        .await
        .expect("record the generation");
    generation
}

/// A process of this host that has died: its pid no longer exists.
fn gone(info: GenerationInfo) -> GenerationInfo {
    GenerationInfo {
        pid: u32::MAX - 7,
        ..info
    }
}

impl Fixture {
    async fn new(max_concurrent: usize) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plans.db");
        SqliteStore::open(&path, Synchronous::Normal).expect("create and migrate");
        let clock = Arc::new(ManualClock::new(NOW));
        let storage = process_storage(&path, &clock);
        let generation = record_generation(&storage, |live| live).await;
        let provider = ControlledProvider::default();
        let timer = ManualTimer::default();
        let plans = PlanHandle::spawn(
            storage.clone(),
            generation,
            Arc::new(provider.clone()),
            Arc::new(timer.clone()),
            settings(max_concurrent),
        );
        let f = Fixture {
            _dir: dir,
            path,
            clock,
            storage,
            provider,
            timer,
            plans,
        };
        for plan in ["p1", "p2", "p3"] {
            f.import(plan, "s1", true).await;
        }
        f
    }

    async fn import(&self, plan: &str, snapshot: &str, advance: bool) -> Vec<RequestId> {
        let import = Import {
            plan_id: pid(plan),
            snapshot_id: snap(snapshot),
            advance_revision: advance,
        };
        self.plans.import(import).await.expect("import").invalidated
    }

    async fn start(
        &self,
        plan: &str,
        revision: u64,
        snapshot: &str,
    ) -> Result<RequestId, StartError> {
        self.plans
            .start(identity(plan, revision), snap(snapshot), &input("suggest"))
            .await
            .map(|s| s.request_id)
    }

    async fn row(&self, id: &RequestId) -> PlanRequest {
        self.storage
            .plan_request(id.clone())
            .await
            .expect("read")
            .expect("row exists")
    }

    /// Another process's storage actor on the same file and clock.
    fn other_process(&self) -> StorageHandle {
        process_storage(&self.path, &self.clock)
    }

    /// Another live process on this host: its own generation, storage actor, provider and coordinator.
    async fn second_process(&self) -> (StorageHandle, ControlledProvider, PlanHandle) {
        let storage = self.other_process();
        let generation = record_generation(&storage, |live| live).await;
        let provider = ControlledProvider::default();
        let timer = Arc::new(ManualTimer::default());
        let plans = PlanHandle::spawn(
            storage.clone(),
            generation,
            Arc::new(provider.clone()),
            timer,
            settings(4),
        );
        (storage, provider, plans)
    }

    /// The row as a restarted process reads it: a fresh connection to the file.
    fn row_after_restart(&self, id: &RequestId) -> PlanRequest {
        SqliteStore::open(&self.path, Synchronous::Normal)
            .expect("reopen")
            .get_request(id)
            .expect("read")
            .expect("row")
    }
}

fn pid(s: &str) -> PlanId {
    PlanId::parse(s).expect("plan id")
}

fn snap(s: &str) -> SnapshotId {
    SnapshotId::parse(s).expect("snapshot id")
}

fn identity(plan: &str, revision: u64) -> PlanIdentity {
    PlanIdentity {
        plan_id: pid(plan),
        revision: Revision::new(revision),
    }
}

fn binding(plan: &str, revision: u64, snapshot: &str) -> PlanBinding {
    PlanBinding {
        plan_id: pid(plan),
        revision: Revision::new(revision),
        snapshot_id: snap(snapshot),
    }
}

fn input(prompt: &str) -> SuggestionInput {
    SuggestionInput {
        prompt: prompt.to_owned(),
        cards: vec![Card {
            title: "existing".into(),
            body: "the base card".into(),
        }],
        context: json!({"files": ["a.rs"]}),
    }
}

fn cards(titles: &[&str]) -> Vec<Card> {
    titles
        .iter()
        .map(|t| Card {
            title: (*t).to_owned(),
            body: format!("do {t}"),
        })
        .collect()
}

// ---- the cases the seed names ----

#[actix_rt::test]
async fn a_reply_is_published_through_the_cas_and_the_identity_is_compared_before_allocation() {
    let f = Fixture::new(4).await;
    // A caller whose identity is stale is refused before anything is allocated or invoked.
    let stale = f.start("p1", 2, "s1").await;
    assert_eq!(
        stale,
        Err(StartError::Refused(PlanRefusal::IdentityMismatch {
            current: binding("p1", 1, "s1")
        }))
    );
    let wrong_snapshot = f.start("p1", 1, "s0").await;
    assert!(matches!(
        wrong_snapshot,
        Err(StartError::Refused(PlanRefusal::IdentityMismatch { .. }))
    ));
    assert!(matches!(
        f.start("nope", 1, "s1").await,
        Err(StartError::Refused(PlanRefusal::UnknownPlan { .. }))
    ));
    assert_eq!(f.provider.count(), 0);

    let rid = f.start("p1", 1, "s1").await.expect("admitted");
    assert_eq!(f.provider.job(0).request_id, rid);
    assert_eq!(f.provider.job(0).binding, binding("p1", 1, "s1"));
    let view = f.plans.suggestion(&pid("p1"), rid.clone()).await.unwrap();
    assert_eq!(view.request.state, RequestState::Pending);
    assert_eq!(
        view.invocation.map(|i| (i.state, i.stopping)),
        Some((InvocationState::Running, None))
    );

    f.provider.resolve(0, cards(&["a", "b"]));
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason, out.diagnostic.clone()),
        (InvocationState::Completed, None, None)
    );
    let row = f.row(&rid).await;
    assert_eq!(
        (row.state, row.cards.clone()),
        (RequestState::Ready, Some(cards(&["a", "b"])))
    );
    assert_eq!(out.request, Some(row.clone()));
    // No longer tracked: the GET view has no invocation, and the plan admits again.
    assert_eq!(
        f.plans
            .suggestion(&pid("p1"), rid.clone())
            .await
            .unwrap()
            .invocation,
        None
    );
    // A request of one plan is not found under another.
    assert!(f.plans.suggestion(&pid("p2"), rid.clone()).await.is_err());
    // Dismissal is its own store operation; applying a dismissed reply is refused.
    let dismissed = f.plans.dismiss(&pid("p1"), rid.clone()).await.unwrap();
    assert_eq!(
        (dismissed.state, dismissed.reason),
        (RequestState::Cancelled, Some(TerminalReason::Dismissed))
    );
    assert!(f.plans.consume(&pid("p1"), rid.clone()).await.is_err());
    assert_eq!(f.row_after_restart(&rid), dismissed);
}

#[actix_rt::test]
async fn import_before_late_completion_answers_stale_and_publishes_nothing() {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    // The plan's revision advances while the provider works.
    assert_eq!(f.import("p1", "s1", true).await, vec![rid.clone()]);
    let invalidated = f.row(&rid).await;
    assert_eq!(
        (invalidated.state, invalidated.reason),
        (
            RequestState::Invalidated,
            Some(TerminalReason::RevisionAdvanced)
        )
    );
    // The late reply is valid, but the CAS refuses it.
    f.provider.resolve(0, cards(&["late"]));
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (
            InvocationState::Stale,
            Some(TerminalReason::RevisionAdvanced)
        )
    );
    assert!(
        out.diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("invalidated")),
        "{out:?}"
    );
    let row = f.row_after_restart(&rid);
    assert_eq!(row, invalidated, "the stale reply changed nothing");
    assert_eq!(row.cards, None);
    // The next start at the new revision is independent of the stale one.
    let next = f
        .start("p1", 2, "s1")
        .await
        .expect("admitted at the new revision");
    assert_ne!(next, rid);
}

#[actix_rt::test]
async fn a_snapshot_change_before_completion_answers_stale() {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    assert_eq!(f.import("p1", "s2", false).await, vec![rid.clone()]);
    f.provider.resolve(0, cards(&["late"]));
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (
            InvocationState::Stale,
            Some(TerminalReason::SnapshotChanged)
        )
    );
    let row = f.row(&rid).await;
    assert_eq!(
        (row.state, row.reason, row.cards),
        (
            RequestState::Invalidated,
            Some(TerminalReason::SnapshotChanged),
            None
        )
    );
    // A provider failure after the change is stale too, not failed, and keeps the provider's diagnostic.
    let rid2 = f.start("p1", 1, "s2").await.unwrap();
    f.import("p1", "s3", false).await;
    f.provider.reject(1, "model overloaded");
    let out = f.plans.outcome(rid2.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.diagnostic.as_deref()),
        (InvocationState::Stale, Some("model overloaded"))
    );
    assert_eq!(f.row(&rid2).await.state, RequestState::Invalidated);
}

#[actix_rt::test]
async fn completion_racing_failure_cleanup_leaves_the_ready_result_untouched() {
    let f = Fixture::new(4).await;
    let other = f.other_process();
    // Another process publishes the request first; then this process's provider fails and cleans up.
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let ready = other
        .complete_suggestions(rid.clone(), binding("p1", 1, "s1"), cards(&["theirs"]))
        .await
        .unwrap()
        .expect("the other process wins");
    f.provider.reject(0, "our provider crashed");
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        out.state,
        InvocationState::Completed,
        "the durable ready reply classifies"
    );
    assert_eq!(
        out.diagnostic.as_deref(),
        Some("our provider crashed"),
        "the original diagnostic is kept"
    );
    assert_eq!(out.request.as_ref(), Some(&ready));
    assert_eq!(f.row_after_restart(&rid), ready);

    // The same race when our cleanup is an invalid-card failure.
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let ready = other
        .complete_suggestions(rid.clone(), binding("p1", 1, "s1"), cards(&["theirs"]))
        .await
        .unwrap()
        .unwrap();
    f.provider.resolve(
        1,
        vec![Card {
            title: String::new(),
            body: "no title".into(),
        }],
    );
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.diagnostic.as_deref()),
        (InvocationState::Completed, Some("card 0: title is empty"))
    );
    assert_eq!(f.row(&rid).await, ready);

    // Without the race, the invalid card fails the request durably.
    let rid = f.start("p1", 1, "s1").await.unwrap();
    f.provider.resolve(
        2,
        vec![Card {
            title: "t".repeat(201),
            body: String::new(),
        }],
    );
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Failed, Some(TerminalReason::InvalidCards))
    );
    let row = f.row(&rid).await;
    assert_eq!(
        (row.state, row.reason, row.cards),
        (
            RequestState::Failed,
            Some(TerminalReason::InvalidCards),
            None
        )
    );
}

#[actix_rt::test]
async fn external_cancellation_reclassifies_a_late_reply_and_a_rejection_as_cancelled() {
    let f = Fixture::new(4).await;
    let other = f.other_process();
    let external = Settlement {
        outcome: SettleOutcome::Cancelled,
        reason: TerminalReason::Cancelled,
        diagnostic: "cancelled from another process".into(),
    };
    // A late reply after the external cancel: the CAS refuses; the answer is cancelled, not failed.
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let cancelled = other
        .settle_suggestion(rid.clone(), binding("p1", 1, "s1"), external.clone())
        .await
        .unwrap()
        .unwrap();
    f.provider.resolve(0, cards(&["late"]));
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Cancelled, Some(TerminalReason::Cancelled))
    );
    assert!(
        out.diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("is cancelled")),
        "the store's diagnostic: {out:?}"
    );
    assert_eq!(
        f.row_after_restart(&rid),
        cancelled,
        "the external cancellation stands, with its own reason"
    );

    // A provider rejection after the external cancel: cancelled, with the provider's original diagnostic.
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let cancelled = other
        .settle_suggestion(rid.clone(), binding("p1", 1, "s1"), external)
        .await
        .unwrap()
        .unwrap();
    f.provider.reject(1, "connection reset");
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.diagnostic.as_deref()),
        (InvocationState::Cancelled, Some("connection reset"))
    );
    assert_eq!(f.row(&rid).await, cancelled);
}

#[actix_rt::test]
async fn bounded_provider_errors_keep_the_original_diagnostic_and_store_the_bounded_one() {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let huge = format!("stack trace: {}", "frame → ".repeat(2000));
    assert!(huge.len() > 4 * MAX_DIAGNOSTIC_BYTES);
    f.provider.reject(0, &huge);
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Failed, Some(TerminalReason::ProviderError))
    );
    assert_eq!(
        out.diagnostic.as_deref(),
        Some(huge.as_str()),
        "the caller gets the original"
    );
    // The store keeps the bounded form, and a restart reads back classification and reason.
    let row = f.row_after_restart(&rid);
    assert_eq!(
        (row.state, row.reason),
        (RequestState::Failed, Some(TerminalReason::ProviderError))
    );
    let d = row.diagnostic.expect("diagnostic");
    assert!(
        d.len() <= MAX_DIAGNOSTIC_BYTES && d.ends_with('…'),
        "{} bytes",
        d.len()
    );
    assert!(huge.starts_with(d.trim_end_matches('…')));
}

#[actix_rt::test]
async fn timeout_followed_by_an_unsettled_provider_settles_at_once_and_resolves_only_at_termination(
) {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    assert_eq!(f.timer.fire_all().await, 1);
    // The durable request settled at once and abort was requested…
    let view = f.plans.suggestion(&pid("p1"), rid.clone()).await.unwrap();
    assert_eq!(
        (view.request.state, view.request.reason),
        (RequestState::Failed, Some(TerminalReason::Timeout))
    );
    assert!(f.provider.abort_requested(0));
    // …but the provider has not terminated: the invocation stays tracked and its result pending.
    assert_eq!(
        view.invocation.map(|i| (i.state, i.stopping)),
        Some((InvocationState::Running, Some(StopCause::Timeout)))
    );
    let mut outcome = Box::pin(f.plans.outcome(rid.clone()));
    assert!((&mut outcome).now_or_never().is_none());
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: rid.clone()
        })
    );
    // A cancel now does not replace the first reason.
    let after_cancel = f.plans.cancel(&pid("p1"), rid.clone()).await.unwrap();
    assert_eq!(after_cancel.request.reason, Some(TerminalReason::Timeout));
    assert_eq!(
        after_cancel.invocation.and_then(|i| i.stopping),
        Some(StopCause::Timeout)
    );
    assert!((&mut outcome).now_or_never().is_none());
    // The provider finally terminates with a generic abort error: the timeout still classifies.
    f.provider.end_aborted(0);
    let out = outcome.await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Failed, Some(TerminalReason::Timeout))
    );
    assert!(
        out.diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("timed out after 30000 ms")),
        "{out:?}"
    );
    assert_eq!(
        f.row_after_restart(&rid),
        view.request,
        "nothing changed after the first settlement"
    );
    assert!(
        f.start("p1", 1, "s1").await.is_ok(),
        "the slot is free once the provider terminated"
    );
}

#[actix_rt::test]
async fn a_reply_after_the_timeout_is_not_published() {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    f.timer.fire_all().await;
    f.provider.resolve(0, cards(&["too late"]));
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Failed, Some(TerminalReason::Timeout))
    );
    let row = f.row(&rid).await;
    assert_eq!((row.state, row.cards), (RequestState::Failed, None));
    // A request that finished before its timer: the timer is disarmed and never fires.
    let rid = f.start("p1", 1, "s1").await.unwrap();
    f.provider.resolve(1, cards(&["quick"]));
    assert_eq!(
        f.plans.outcome(rid.clone()).await.unwrap().state,
        InvocationState::Completed
    );
    assert_eq!(f.timer.fire_all().await, 0);
    assert_eq!(f.row(&rid).await.state, RequestState::Ready);
}

#[actix_rt::test]
async fn retry_while_cancellation_is_pending_is_busy_until_the_provider_terminates() {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let view = f.plans.cancel(&pid("p1"), rid.clone()).await.unwrap();
    assert_eq!(
        (view.request.state, view.request.reason),
        (RequestState::Cancelled, Some(TerminalReason::Cancelled))
    );
    assert_eq!(
        view.invocation.and_then(|i| i.stopping),
        Some(StopCause::Cancelled)
    );
    assert!(f.provider.abort_requested(0));
    // The retry cannot replace it: not after the durable cancel, not after an import, not after its timer.
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: rid.clone()
        })
    );
    f.import("p1", "s1", true).await;
    assert_eq!(
        f.start("p1", 2, "s1").await,
        Err(StartError::Busy {
            request_id: rid.clone()
        })
    );
    f.timer.fire_all().await;
    assert_eq!(
        f.start("p1", 2, "s1").await,
        Err(StartError::Busy {
            request_id: rid.clone()
        })
    );
    assert_eq!(
        f.row(&rid).await.reason,
        Some(TerminalReason::Cancelled),
        "a later timeout replaces nothing"
    );
    assert_eq!(f.provider.count(), 1);
    f.provider.end_aborted(0);
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Cancelled, Some(TerminalReason::Cancelled))
    );
    assert_eq!(f.row_after_restart(&rid), view.request);
    let retry = f
        .start("p1", 2, "s1")
        .await
        .expect("the retry is admitted once the provider terminated");
    assert_ne!(retry, rid);
    assert_eq!(f.provider.count(), 2);
}

#[actix_rt::test]
async fn shutdown_refuses_starts_synchronously_settles_at_once_and_waits_for_providers() {
    let f = Fixture::new(4).await;
    let rid = f.start("p1", 1, "s1").await.unwrap();
    let mut close = Box::pin(f.plans.close());
    // Admission flipped before any await: the refusal needs no poll of the coordinator.
    assert_eq!(
        f.start("p2", 1, "s1").now_or_never(),
        Some(Err(StartError::Closing))
    );
    assert!(f.plans.is_closing());
    assert!((&mut close).now_or_never().is_none());
    // The close message is handled before this inspection: the request settled at once, abort requested.
    let view = f.plans.suggestion(&pid("p1"), rid.clone()).await.unwrap();
    assert_eq!(
        (view.request.state, view.request.reason),
        (RequestState::Cancelled, Some(TerminalReason::Shutdown))
    );
    assert!(f.provider.abort_requested(0));
    // close() waits for the provider to terminate.
    assert!((&mut close).now_or_never().is_none());
    f.provider.end_aborted(0);
    close.await;
    let out = f.plans.outcome(rid.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Cancelled, Some(TerminalReason::Shutdown))
    );
    assert_eq!(f.start("p3", 1, "s1").await, Err(StartError::Closing));
    // Storage stays open.
    assert_eq!(f.row(&rid).await, view.request);
    assert!(f.storage.ping().await.is_ok());
    assert_eq!(f.provider.count(), 1);
}

#[actix_rt::test]
async fn a_start_admitted_just_before_close_is_cancelled_before_launch() {
    let f = Fixture::new(4).await;
    // The start passes the synchronous gate and its message is sent…
    let mut start = Box::pin(f.plans.start(identity("p1", 1), snap("s1"), &input("x")));
    assert!((&mut start).now_or_never().is_none());
    // …then close() flips admission before the allocation has come back.
    let close = f.plans.close();
    let started = start.await.expect("admitted before close");
    let out = f.plans.outcome(started.request_id.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Cancelled, Some(TerminalReason::Shutdown))
    );
    assert_eq!(
        f.provider.count(),
        0,
        "pending → cancelled: the provider was never launched"
    );
    close.await;
    let row = f.row_after_restart(&started.request_id);
    assert_eq!(
        (row.state, row.reason),
        (RequestState::Cancelled, Some(TerminalReason::Shutdown))
    );
}

#[actix_rt::test]
async fn post_submit_mutation_of_caller_owned_input_changes_nothing() {
    let f = Fixture::new(4).await;
    let mut mine = input("first prompt");
    let original = mine.clone();
    let started = f.plans.start(identity("p1", 1), snap("s1"), &mine);
    // The caller mutates every container it owns after submitting.
    mine.prompt.push_str(" and more");
    mine.cards.push(Card {
        title: "added later".into(),
        body: String::new(),
    });
    mine.cards[0].title = "renamed".into();
    mine.context["files"] = json!(["changed.rs"]);
    let rid = started.await.unwrap().request_id;
    let job = f.provider.job(0);
    assert_eq!(*job.input, original);
    assert_eq!(job.binding, binding("p1", 1, "s1"));
    f.provider.resolve(0, cards(&["a"]));
    assert_eq!(
        f.plans.outcome(rid.clone()).await.unwrap().state,
        InvocationState::Completed
    );
    assert_eq!(f.row(&rid).await.binding(), binding("p1", 1, "s1"));
}

#[actix_rt::test]
async fn one_active_invocation_per_identity_and_different_identities_are_independent() {
    let f = Fixture::new(4).await;
    let a = f.start("p1", 1, "s1").await.unwrap();
    // The same identity is busy whatever the caller names; nothing is allocated for the refusal.
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: a.clone()
        })
    );
    assert_eq!(
        f.start("p1", 9, "s9").await,
        Err(StartError::Busy {
            request_id: a.clone()
        })
    );
    // Another identity is independent: it runs, fails and resolves on its own.
    let b = f.start("p2", 1, "s1").await.unwrap();
    f.provider.reject(1, "p2 failed");
    assert_eq!(
        f.plans.outcome(b.clone()).await.unwrap().state,
        InvocationState::Failed
    );
    assert_eq!(f.row(&a).await.state, RequestState::Pending);
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: a.clone()
        })
    );
    f.provider.resolve(0, cards(&["a"]));
    assert_eq!(
        f.plans.outcome(a.clone()).await.unwrap().state,
        InvocationState::Completed
    );
    assert_eq!(
        (f.row(&a).await.state, f.row(&b).await.state),
        (RequestState::Ready, RequestState::Failed)
    );
    assert_eq!(f.provider.count(), 2);
}

#[actix_rt::test]
async fn the_global_limit_refuses_with_capacity_until_an_invocation_terminates() {
    let f = Fixture::new(2).await;
    let a = f.start("p1", 1, "s1").await.unwrap();
    f.start("p2", 1, "s1").await.unwrap();
    assert_eq!(
        f.start("p3", 1, "s1").await,
        Err(StartError::Capacity { limit: 2 })
    );
    // A stopping invocation still holds its share until its provider terminates.
    f.plans.cancel(&pid("p1"), a.clone()).await.unwrap();
    assert_eq!(
        f.start("p3", 1, "s1").await,
        Err(StartError::Capacity { limit: 2 })
    );
    f.provider.end_aborted(0);
    f.plans.outcome(a).await.unwrap();
    assert!(f.start("p3", 1, "s1").await.is_ok());
    assert_eq!(f.provider.count(), 3);
}

#[actix_rt::test]
async fn a_second_coordinator_on_the_same_file_completing_first_wins() {
    let f = Fixture::new(4).await;
    // Process B: its own generation, storage actor (its own connection to the file), provider and coordinator.
    let (b_storage, b_provider, b_plans) = f.second_process().await;

    // B runs plan p1 at revision 1; while its request is pending, this process cannot start p1.
    let theirs = b_plans
        .start(identity("p1", 1), snap("s1"), &input("b"))
        .await
        .unwrap()
        .request_id;
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: theirs.clone()
        })
    );
    // B completes: its reply is ready, no longer pending, and this process starts p1 too.
    b_provider.resolve(0, cards(&["from b"]));
    assert_eq!(
        b_plans.outcome(theirs.clone()).await.unwrap().state,
        InvocationState::Completed
    );
    let mine = f.start("p1", 1, "s1").await.unwrap();
    // B applies its reply: the apply advances the revision and invalidates ours.
    let applied = b_plans.consume(&pid("p1"), theirs.clone()).await.unwrap();
    assert_eq!(
        (applied.plan.revision, applied.invalidated.clone()),
        (Revision::new(2), vec![mine.clone()])
    );
    // Our late reply loses: stale, nothing published, B's applied reply untouched.
    f.provider.resolve(0, cards(&["from a"]));
    let out = f.plans.outcome(mine.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (
            InvocationState::Stale,
            Some(TerminalReason::RevisionAdvanced)
        )
    );
    assert_eq!(f.row_after_restart(&mine).cards, None);
    assert_eq!(f.row_after_restart(&theirs), applied.request);

    // And when B's process publishes OUR request first (the same CAS its publication runs), our
    // cancellation's cleanup settle loses and the ready result stands.
    let mine = f.start("p1", 2, "s1").await.unwrap();
    let ready = b_storage
        .complete_suggestions(mine.clone(), binding("p1", 2, "s1"), cards(&["b wins"]))
        .await
        .unwrap()
        .unwrap();
    let view = f.plans.cancel(&pid("p1"), mine.clone()).await.unwrap();
    assert_eq!(
        view.request, ready,
        "the cancel's settle lost without touching the ready reply"
    );
    f.provider.end_aborted(1);
    let out = f.plans.outcome(mine.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.request.as_ref()),
        (InvocationState::Completed, Some(&ready))
    );
    assert_eq!(f.row_after_restart(&mine), ready);
}

#[actix_rt::test]
async fn cancelling_an_untracked_pending_request_settles_it_and_outcomes_answer_from_the_store() {
    let f = Fixture::new(4).await;
    // An orphan: allocated by a process that died before invoking anything.
    let other = f.other_process();
    let orphan = other
        .allocate_request(binding("p1", 1, "s1"), Generation::mint(NOW), LEASE_MS)
        .await
        .unwrap()
        .unwrap();
    let err = f
        .plans
        .outcome(orphan.request_id.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(err, actors::plan::PlanError::NotTracked { .. }),
        "{err:?}"
    );
    let view = f
        .plans
        .cancel(&pid("p1"), orphan.request_id.clone())
        .await
        .unwrap();
    assert_eq!(
        (view.request.state, view.invocation),
        (RequestState::Cancelled, None)
    );
    let out = f.plans.outcome(orphan.request_id.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Cancelled, Some(TerminalReason::Cancelled))
    );
    assert!(f.plans.outcome(RequestId::generate()).await.is_err());
}

// ---- crashes (SPEC §9): no request of a dead holder stays pending ----

#[actix_rt::test]
async fn a_pending_request_of_a_dead_generation_is_settled_interrupted_and_its_plan_admits_again() {
    let f = Fixture::new(4).await;
    // A process of this host crashed (its pid is gone) while running suggestions on p1 and p2.
    let dead = record_generation(&f.storage, gone).await;
    let other = f.other_process();
    let on_p1 = other
        .allocate_request(binding("p1", 1, "s1"), dead.clone(), LEASE_MS)
        .await
        .unwrap()
        .unwrap();
    let on_p2 = other
        .allocate_request(binding("p2", 1, "s1"), dead.clone(), LEASE_MS)
        .await
        .unwrap()
        .unwrap();
    // A start on p1 finds the dead holder's request: the sweep it triggers settles it, and the start is admitted.
    let rid = f
        .start("p1", 1, "s1")
        .await
        .expect("admitted once the orphan is settled");
    let settled = f.row(&on_p1.request_id).await;
    assert_eq!(
        (settled.state, settled.reason),
        (RequestState::Failed, Some(TerminalReason::Interrupted))
    );
    assert!(
        settled
            .diagnostic
            .as_deref()
            .is_some_and(|d| d.contains(dead.as_str()) && d.contains("gone")),
        "{settled:?}"
    );
    assert_eq!(f.row(&rid).await.state, RequestState::Pending);
    // That sweep settled p2's orphan as well: never left pending, whether or not anyone asks for p2. (A
    // periodic sweep may have been the one that freed p1, and settles p2 a moment later.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut settled = f.row_after_restart(&on_p2.request_id);
    while settled.state == RequestState::Pending && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        settled = f.row_after_restart(&on_p2.request_id);
    }
    assert_eq!(
        (settled.state, settled.reason),
        (RequestState::Failed, Some(TerminalReason::Interrupted))
    );
    // A restarted process settles the orphans it finds at boot, before it handles any message.
    let on_p3 = other
        .allocate_request(binding("p3", 1, "s1"), dead.clone(), LEASE_MS)
        .await
        .unwrap()
        .unwrap();
    let (_, _, restarted) = f.second_process().await;
    let view = restarted
        .suggestion(&pid("p3"), on_p3.request_id.clone())
        .await
        .unwrap();
    assert_eq!(
        (view.request.state, view.request.reason),
        (RequestState::Failed, Some(TerminalReason::Interrupted))
    );
    assert_eq!(view.invocation, None);
    let out = restarted.outcome(on_p3.request_id.clone()).await.unwrap();
    assert_eq!(
        (out.state, out.reason),
        (InvocationState::Failed, Some(TerminalReason::Interrupted))
    );
    assert!(restarted
        .start(identity("p3", 1), snap("s1"), &input("again"))
        .await
        .is_ok());
}

#[actix_rt::test]
async fn a_pending_request_of_a_live_generation_makes_start_busy_until_it_ends() {
    let f = Fixture::new(4).await;
    let (_, b_provider, b_plans) = f.second_process().await;
    let theirs = b_plans
        .start(identity("p1", 1), snap("s1"), &input("b"))
        .await
        .unwrap()
        .request_id;
    // The holder is alive and within its lease: a start is busy, and no sweep touches its request.
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: theirs.clone()
        })
    );
    assert_eq!(f.plans.sweep().await.unwrap(), vec![]);
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: theirs.clone()
        })
    );
    assert_eq!(f.row(&theirs).await.state, RequestState::Pending);
    assert_eq!(
        f.provider.count(),
        0,
        "nothing was allocated or invoked for the refusals"
    );
    // Its provider ends: the plan admits this process.
    b_provider.reject(0, "no ideas");
    assert_eq!(
        b_plans.outcome(theirs.clone()).await.unwrap().state,
        InvocationState::Failed
    );
    assert!(f.start("p1", 1, "s1").await.is_ok());
}

#[actix_rt::test]
async fn a_holder_past_its_lease_is_settled_interrupted_while_a_live_holder_renews_its_own() {
    let f = Fixture::new(4).await;
    // A generation on another host: its process cannot be checked from here, only its lease.
    let remote = record_generation(&f.storage, |info| GenerationInfo {
        host: "another-host".into(),
        ..gone(info)
    })
    .await;
    let theirs = f
        .other_process()
        .allocate_request(binding("p1", 1, "s1"), remote.clone(), LEASE_MS)
        .await
        .unwrap()
        .unwrap();
    let mine = f.start("p2", 1, "s1").await.unwrap();
    assert_eq!(
        f.plans.sweep().await.unwrap(),
        vec![],
        "within its lease, a remote holder is alive"
    );
    assert_eq!(
        f.start("p1", 1, "s1").await,
        Err(StartError::Busy {
            request_id: theirs.request_id.clone()
        })
    );
    // A lease later the remote holder has renewed nothing; this process renews what it runs as it sweeps.
    f.clock.advance(LEASE_MS);
    let settled = f.plans.sweep().await.unwrap();
    assert_eq!(
        settled.iter().map(|r| &r.request_id).collect::<Vec<_>>(),
        vec![&theirs.request_id]
    );
    assert_eq!(
        (settled[0].state, settled[0].reason),
        (RequestState::Failed, Some(TerminalReason::Interrupted))
    );
    assert!(
        settled[0]
            .diagnostic
            .as_deref()
            .is_some_and(|d| d.contains("lease")),
        "{settled:?}"
    );
    let renewed = f.row(&mine).await;
    assert_eq!(
        (renewed.state, renewed.holder.map(|h| h.lease_until)),
        (RequestState::Pending, Some(NOW + 2 * LEASE_MS))
    );
    assert!(f.start("p1", 1, "s1").await.is_ok());
    assert_eq!(f.row_after_restart(&theirs.request_id), settled[0]);
}

// ---- the production provider: an agent run through the supervisor ----

mod agent_provider {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use storage::RunId;

    use actix::{Actor, Addr};
    use actors::agent::scripted::ScriptedAgent;
    use actors::history::HistoryWriter;
    use actors::plan::{
        plan_request, AbortTrigger, AgentPlanProvider, InvocationState, PlanHandle, PlanIdentity,
        SuggestionInput,
    };
    use actors::registry::Registry;
    use actors::run::AgentEntry;
    use actors::supervisor::{AdmitMessage, Admitted, Supervisor, SupervisorConfig};
    use actors::token::TokenMinter;
    use actors::tools::Toolbox;
    use storage::plan::{Card, Import, RequestId, RequestState, Revision, TerminalReason};
    use storage::{BackendSpec, StorageHandle, Synchronous};

    use super::{pid, settings, snap, ManualTimer};

    struct Runtime {
        _dir: tempfile::TempDir,
        supervisor: Addr<Supervisor>,
        provider: AgentPlanProvider,
        registry: Registry,
        storage: StorageHandle,
        plans: PlanHandle,
    }

    impl Runtime {
        /// Whether the run on `thread` has finished (`None`: no run there): as its registry row says, or —
        /// a finished run leaves the registry once its record lands — as the store's final record says.
        async fn finished_on(&self, thread: &str) -> Option<bool> {
            if let Some(row) = self
                .registry
                .rows()
                .into_iter()
                .find(|r| r.meta.thread_key == thread)
            {
                return Some(row.finished_at.is_some());
            }
            let mut query =
                storage::store::ListQuery::visible_to(storage::record::VisibilityFilter::All);
            query.thread_key = Some(thread.to_owned());
            let page = self.storage.list(query).await.expect("list the store");
            page.items
                .iter()
                .any(|i| !i.head.provisional)
                .then_some(true)
        }
    }

    /// A real supervisor running the scripted agent, and a coordinator whose provider runs through it.
    async fn runtime() -> Runtime {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = storage::clock::system();
        let storage = StorageHandle::start(
            BackendSpec::Sqlite {
                path: dir.path().join("agent.db"),
                synchronous: Synchronous::Normal,
            },
            clock.clone(),
        );
        let registry = Registry::new(clock.clone());
        let mut agents = HashMap::new();
        agents.insert(
            "demo".to_owned(),
            AgentEntry::new(Arc::new(ScriptedAgent::new()), 600_000, "plan"),
        );
        let secret = storage.capability_secret().await.expect("secret");
        let clock_for_ops = clock.clone();
        let supervisor = Supervisor::new(SupervisorConfig {
            storage: storage.clone(),
            registry: registry.clone(),
            history: HistoryWriter::new(Arc::new(storage.clone()), None),
            agents,
            default_agent: "demo".into(),
            tools: Toolbox::builtin(),
            workspace_root: dir.path().join("workspaces"),
            lease_ms: 30_000,
            heartbeat_ms: 10_000,
            webhook: None,
            clock,
            tokens: TokenMinter::new(&secret),
            draining: Arc::new(AtomicBool::new(false)),
            metrics: Arc::default(),
            operations: actors::operations::OperationCoordinator::new(clock_for_ops),
            restart_policy: Default::default(),
            host_id: actors::host::hostname(),
            cards: Default::default(),
            http: reqwest::Client::new(),
        });
        let generation = supervisor.generation().clone();
        let supervisor = supervisor.start();
        let provider =
            AgentPlanProvider::new(supervisor.clone(), registry.clone(), storage.clone(), None);
        let plans = PlanHandle::spawn(
            storage.clone(),
            generation,
            Arc::new(provider.clone()),
            Arc::new(ManualTimer::default()),
            settings(4),
        );
        plans
            .import(Import {
                plan_id: pid("p1"),
                snapshot_id: snap("s1"),
                advance_revision: true,
            })
            .await
            .expect("import");
        Runtime {
            _dir: dir,
            supervisor,
            provider,
            registry,
            storage,
            plans,
        }
    }

    fn ask(prompt: &str) -> SuggestionInput {
        SuggestionInput {
            prompt: prompt.to_owned(),
            cards: Vec::new(),
            context: serde_json::Value::Null,
        }
    }

    #[actix_rt::test]
    async fn the_agent_run_answer_is_parsed_into_published_cards() {
        let rt = runtime().await;
        let prompt = r#"steps=0 answer=[{"title":"Write_tests","body":"cover_the_CAS"}]"#;
        let identity = PlanIdentity {
            plan_id: pid("p1"),
            revision: Revision::FIRST,
        };
        let started = rt
            .plans
            .start(identity, snap("s1"), &ask(prompt))
            .await
            .expect("admitted");
        let out = rt
            .plans
            .outcome(started.request_id.clone())
            .await
            .expect("outcome");
        assert_eq!(out.state, InvocationState::Completed, "{out:?}");
        let want = vec![Card {
            title: "Write_tests".into(),
            body: "cover_the_CAS".into(),
        }];
        assert_eq!(
            out.request.as_ref().and_then(|r| r.cards.clone()),
            Some(want)
        );
        // The run lived on the fresh thread `plan:<request id>`.
        let thread = format!("plan:{}", started.request_id.as_str());
        assert!(
            rt.finished_on(&thread).await.is_some(),
            "no run on {thread}"
        );
    }

    /// A fresh run opens in its admission's commit, so a short one can finish and land — leaving the
    /// registry — before its provider follows it: the provider then reads its ending from the record.
    #[actix_rt::test]
    async fn a_run_that_landed_before_it_was_followed_answers_from_its_record() {
        let rt = runtime().await;
        let request_id = RequestId::generate();
        let text = r#"steps=0 answer=[{"title":"Landed","body":"read_from_the_record"}]"#;
        let request = plan_request(&request_id, text.to_owned(), None);
        let admitted = rt
            .supervisor
            .send(AdmitMessage {
                request,
                key: None,
                writer: None,
            })
            .await
            .expect("supervisor")
            .expect("admitted");
        let Admitted::Started { run_id, .. } = admitted else {
            panic!("a fresh thread starts a run: {admitted:?}")
        };
        let mut landed = false;
        for _ in 0..2_000 {
            landed = rt.registry.recently_landed(&run_id);
            if landed {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(landed, "run {run_id} did not land");
        assert!(rt.registry.row(&run_id).is_none(), "the registry forgot it");
        let (_trigger, abort) = AbortTrigger::pair();
        let cards = rt.provider.follow(&run_id, &request_id, abort).await;
        assert_eq!(
            cards,
            Ok(vec![Card {
                title: "Landed".into(),
                body: "read_from_the_record".into(),
            }])
        );
        // A run with no final record (one handed to another process) still fails the request.
        let (_trigger, abort) = AbortTrigger::pair();
        let missing = rt
            .provider
            .follow(&RunId::from("r_missing"), &request_id, abort)
            .await;
        assert!(
            matches!(&missing, Err(e) if e.to_string().contains("ended without a record")),
            "{missing:?}"
        );
    }

    #[actix_rt::test]
    async fn an_answer_that_is_not_cards_fails_the_request() {
        let rt = runtime().await;
        let identity = PlanIdentity {
            plan_id: pid("p1"),
            revision: Revision::FIRST,
        };
        let started = rt
            .plans
            .start(identity, snap("s1"), &ask("steps=0 answer=done"))
            .await
            .expect("admitted");
        let out = rt.plans.outcome(started.request_id).await.expect("outcome");
        assert_eq!(
            (out.state, out.reason),
            (InvocationState::Failed, Some(TerminalReason::ProviderError))
        );
        assert!(
            out.diagnostic
                .as_deref()
                .is_some_and(|d| d.contains("not JSON")),
            "{out:?}"
        );
    }

    #[actix_rt::test]
    async fn cancelling_hard_stops_the_run_and_resolves_once_it_has_finished() {
        let rt = runtime().await;
        let identity = PlanIdentity {
            plan_id: pid("p1"),
            revision: Revision::FIRST,
        };
        // A run that would sleep for ten minutes in its first tool call.
        let started = rt
            .plans
            .start(identity, snap("s1"), &ask("steps=3 ms=600000"))
            .await
            .expect("admitted");
        let view = rt
            .plans
            .cancel(&pid("p1"), started.request_id.clone())
            .await
            .expect("cancel");
        assert_eq!(view.request.state, RequestState::Cancelled);
        let out = rt
            .plans
            .outcome(started.request_id.clone())
            .await
            .expect("outcome");
        assert_eq!(
            (out.state, out.reason),
            (InvocationState::Cancelled, Some(TerminalReason::Cancelled))
        );
        // The outcome came only after the run had finished.
        let thread = format!("plan:{}", started.request_id.as_str());
        assert_eq!(
            rt.finished_on(&thread).await,
            Some(true),
            "the run on {thread} had not finished"
        );
    }
}
