//! What the coordinator invokes: the [`SuggestionProvider`] trait with its abortable invocation, the
//! caller's [`SuggestionInput`], and the injected [`Timer`] that drives timeouts.
//!
//! A provider's invocation is a future plus an [`AbortSignal`]. The contract that makes cancellation safe:
//! the future resolves only once the provider has *terminated* — after an abort request, only once the work
//! it started has actually stopped (an agent run has finished, a subprocess has exited). The coordinator
//! keeps the invocation tracked, and its result pending, until then.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use storage::plan::{Card, PlanBinding, RequestId};
use tokio::sync::watch;

/// The caller's input for one suggestion. Copied at submit (the coordinator keeps its own `Arc` of a deep
/// clone), so a caller that mutates its value afterwards changes nothing the provider sees.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SuggestionInput {
    /// What the user asks for.
    pub prompt: String,
    /// The plan's cards as of the caller's snapshot: the immutable base the suggestion builds on.
    pub cards: Vec<Card>,
    /// Any further repository data the caller's snapshot owns, verbatim.
    pub context: serde_json::Value,
}

/// One invocation, as a provider receives it: the captured binding and request id, and the frozen input.
#[derive(Debug, Clone)]
pub struct SuggestionJob {
    pub request_id: RequestId,
    pub binding: PlanBinding,
    pub input: Arc<SuggestionInput>,
}

/// How a provider failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider ran and refused or failed (its text is the diagnostic).
    #[error("provider rejected: {0}")]
    Rejected(String),
    /// The provider stopped because an abort was requested — a generic ending that never outranks the
    /// timeout, cancellation or shutdown that asked for it.
    #[error("provider aborted: {0}")]
    Aborted(String),
}

impl ProviderError {
    pub fn diagnostic(&self) -> &str {
        match self {
            ProviderError::Rejected(d) | ProviderError::Aborted(d) => d,
        }
    }
}

pub type ProviderResult = Result<Vec<Card>, ProviderError>;

/// A suggestion provider (SPEC §9). Production: [`super::AgentPlanProvider`]; tests: controllable ones.
pub trait SuggestionProvider: Send + Sync + 'static {
    /// Start one invocation. It must watch `abort` and, once asked, stop its work; the returned future
    /// resolves only after the work has terminated. Validation of the cards is the coordinator's.
    fn invoke(
        &self,
        job: SuggestionJob,
        abort: AbortSignal,
    ) -> LocalBoxFuture<'static, ProviderResult>;
}

/// The provider's side of an abort request.
#[derive(Debug, Clone)]
pub struct AbortSignal(watch::Receiver<bool>);

impl AbortSignal {
    /// Whether an abort has been requested.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once an abort is requested (or the coordinator's side is gone, which means the same).
    pub async fn requested(&mut self) {
        loop {
            if *self.0.borrow_and_update() {
                return;
            }
            if self.0.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The coordinator's side: requesting an abort is idempotent and never blocks. Dropping it counts as a
/// request.
#[derive(Debug)]
pub struct AbortTrigger(watch::Sender<bool>);

impl AbortTrigger {
    pub fn pair() -> (AbortTrigger, AbortSignal) {
        let (tx, rx) = watch::channel(false);
        (AbortTrigger(tx), AbortSignal(rx))
    }

    pub fn request(&self) {
        self.0.send_replace(true);
    }
}

/// The timeout mechanism, injected so tests fire timeouts on command instead of sleeping.
pub trait Timer: Send + Sync + 'static {
    /// A future that resolves once `duration` has passed. Dropping it cancels the timer.
    fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()>;
}

/// The production timer: tokio's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioTimer;

impl Timer for TokioTimer {
    fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
