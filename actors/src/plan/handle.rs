//! `PlanHandle`: the async face of the plan coordinator (its messages are the coordinator's, in `mod.rs`).

use super::*;

/// The async face of the coordinator. Cheap to clone; hand one to the HTTP layer (`web::Data`).
#[derive(Clone)]
pub struct PlanHandle {
    addr: Addr<PlanCoordinator>,
    /// Shared with the actor; `close()` flips it before any await, which is what makes refusal synchronous.
    closing: Arc<AtomicBool>,
    storage: StorageHandle,
}

impl std::fmt::Debug for PlanHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanHandle")
            .field("closing", &self.is_closing())
            .finish_non_exhaustive()
    }
}

impl PlanHandle {
    /// Start the coordinator of this process's `generation` (one per runner/store; needs a running actix
    /// `System`). Its first act is the boot sweep.
    pub fn spawn(
        storage: StorageHandle,
        generation: Generation,
        provider: Arc<dyn SuggestionProvider>,
        timer: Arc<dyn Timer>,
        settings: PlanSettings,
    ) -> Self {
        let closing = Arc::new(AtomicBool::new(false));
        let settings = PlanSettings {
            max_concurrent: settings.max_concurrent.max(1),
            ..settings
        };
        let addr = PlanCoordinator {
            storage: storage.clone(),
            generation,
            provider,
            timer,
            settings,
            closing: closing.clone(),
            phase: Phase::Open,
            active: HashMap::new(),
            recent: VecDeque::new(),
            drained: Vec::new(),
            sweeping: false,
        }
        .start();
        PlanHandle {
            addr,
            closing,
            storage,
        }
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Start a suggestion for the caller's complete identity. The input is copied now, before this returns
    /// its future; a coordinator that is closing refuses here, synchronously. Resolves once the request is
    /// allocated and its provider launched (not when it finishes: see [`PlanHandle::outcome`]).
    pub fn start(
        &self,
        identity: PlanIdentity,
        snapshot_id: SnapshotId,
        input: &SuggestionInput,
    ) -> impl Future<Output = Result<Started, StartError>> + 'static {
        let closing = self.is_closing();
        let input = Arc::new(input.clone());
        let addr = self.addr.clone();
        let identity = PlanBinding {
            plan_id: identity.plan_id,
            revision: identity.revision,
            snapshot_id,
        };
        async move {
            if closing {
                return Err(StartError::Closing);
            }
            addr.send(StartSuggestion { identity, input })
                .await
                .map_err(|e| StartError::Unavailable(format!("plan coordinator: {e}")))?
        }
    }

    /// Wait for the outcome of a request: resolves once its provider has terminated and its ending is
    /// durable. A request this coordinator no longer tracks answers from the durable row.
    pub async fn outcome(&self, request_id: RequestId) -> Result<InvocationOutcome, PlanError> {
        self.addr
            .send(WatchSuggestion { request_id })
            .await
            .map_err(|e| PlanError::Unavailable(format!("plan coordinator: {e}")))?
    }

    /// The durable row of `request_id` within `plan_id`, and the local invocation while tracked.
    pub async fn suggestion(
        &self,
        plan_id: &PlanId,
        request_id: RequestId,
    ) -> Result<SuggestionView, PlanError> {
        let view = self
            .addr
            .send(InspectSuggestion { request_id })
            .await
            .map_err(|e| PlanError::Unavailable(format!("plan coordinator: {e}")))??;
        in_plan(view, plan_id)
    }

    /// Cancel a request of `plan_id`: its durable row settles `cancelled` at once (unless it already left
    /// pending) and its provider is asked to abort; the answer is the row after that settlement.
    pub async fn cancel(
        &self,
        plan_id: &PlanId,
        request_id: RequestId,
    ) -> Result<SuggestionView, PlanError> {
        // Check the plan before touching anything: a request of another plan is not found here.
        self.suggestion(plan_id, request_id.clone()).await?;
        let view = self
            .addr
            .send(CancelSuggestion { request_id })
            .await
            .map_err(|e| PlanError::Unavailable(format!("plan coordinator: {e}")))??;
        in_plan(view, plan_id)
    }

    /// Sweep now, as boot and the periodic sweep do: answers the orphaned requests it settled `failed
    /// (interrupted)`.
    pub async fn sweep(&self) -> Result<Vec<PlanRequest>, PlanError> {
        self.addr
            .send(SweepRequests)
            .await
            .map_err(|e| PlanError::Unavailable(format!("plan coordinator: {e}")))?
    }

    /// Explicit user dismissal of a ready reply (a store operation of its own).
    pub async fn dismiss(
        &self,
        plan_id: &PlanId,
        request_id: RequestId,
    ) -> Result<PlanRequest, PlanError> {
        self.request_in_plan(plan_id, &request_id).await?;
        self.storage
            .dismiss_suggestion(request_id)
            .await?
            .map_err(PlanError::Refused)
    }

    /// Apply a ready reply: the store advances the plan's revision and invalidates its siblings.
    pub async fn consume(
        &self,
        plan_id: &PlanId,
        request_id: RequestId,
    ) -> Result<Consumed, PlanError> {
        self.request_in_plan(plan_id, &request_id).await?;
        self.storage
            .consume_suggestion(request_id)
            .await?
            .map_err(PlanError::Refused)
    }

    /// Import through the store (create, advance the revision and/or replace the snapshot).
    pub async fn import(&self, import: Import) -> Result<Imported, PlanError> {
        Ok(self.storage.import_plan(import).await?)
    }

    pub async fn plan(&self, plan_id: PlanId) -> Result<Option<Plan>, PlanError> {
        Ok(self.storage.plan(plan_id).await?)
    }

    /// `open → closing`: new starts are refused from this call on (synchronously); every tracked invocation
    /// settles `cancelled (shutdown)` and is asked to abort; the future resolves once every provider has
    /// terminated. Storage stays open.
    pub fn close(&self) -> impl Future<Output = ()> + 'static {
        self.closing.store(true, Ordering::SeqCst);
        let addr = self.addr.clone();
        async move {
            if let Err(e) = addr.send(CloseCoordinator).await {
                tracing::warn!(error = %e, "the plan coordinator was gone before close");
            }
        }
    }

    async fn request_in_plan(
        &self,
        plan_id: &PlanId,
        request_id: &RequestId,
    ) -> Result<PlanRequest, PlanError> {
        match self.storage.plan_request(request_id.clone()).await? {
            Some(r) if &r.plan_id == plan_id => Ok(r),
            _ => Err(PlanError::NotFound(format!(
                "request {} of plan {}",
                request_id.as_str(),
                plan_id.as_str()
            ))),
        }
    }
}

fn in_plan(view: SuggestionView, plan_id: &PlanId) -> Result<SuggestionView, PlanError> {
    if &view.request.plan_id != plan_id {
        return Err(PlanError::NotFound(format!(
            "request {} of plan {}",
            view.request.request_id.as_str(),
            plan_id.as_str()
        )));
    }
    Ok(view)
}
