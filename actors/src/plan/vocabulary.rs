//! The coordinator's vocabulary: its settings, a caller's plan identity, what a start or another operation
//! answers, and what it tells of an invocation.

use std::time::Duration;

use storage::plan::{
    PlanBinding, PlanId, PlanRefusal, PlanRequest, RequestId, Revision, TerminalReason,
};

use super::{classify, InvocationState, StopCause};

/// The coordinator's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSettings {
    /// `[plan] max_concurrent`: tracked invocations across every plan identity.
    pub max_concurrent: usize,
    /// `[plan] timeout_ms`: how long a provider may run before the coordinator settles the request
    /// `failed (timeout)` and requests abort.
    pub timeout: Duration,
    /// `[ledger] lease_ms`: how long a request's holder may go without renewing before other processes
    /// settle its pending requests as interrupted. Renewals and sweeps run every third of it.
    pub lease: Duration,
    /// `[server] host_id`: a dead holder's requests are settled at once only when it ran under this host
    /// identity (the reclaim's rule); other hosts' wait for their lease.
    pub host_id: String,
}

impl PlanSettings {
    pub(super) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }
}

/// The caller's identity of a plan: which plan, at which revision it saw. Together with the snapshot id it
/// is the complete identity admission compares. The one-active-invocation rule keys on `plan_id` alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PlanIdentity {
    pub plan_id: PlanId,
    pub revision: Revision,
}

/// An admitted start: the store-generated request id and the binding captured before invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub request_id: RequestId,
    pub binding: PlanBinding,
}

/// Why a start was refused. Nothing was allocated or invoked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// `close()` was called.
    #[error("the plan coordinator is closing")]
    Closing,
    /// The plan has a tracked invocation (running, or stopping and waiting for its provider).
    #[error("plan has an active suggestion request {}", request_id.as_str())]
    Busy { request_id: RequestId },
    /// `[plan] max_concurrent` invocations are tracked.
    #[error("{limit} suggestion requests are running, the configured limit")]
    Capacity { limit: usize },
    /// The store refused admission (unknown plan, or the caller's identity is not the current one).
    #[error(transparent)]
    Refused(PlanRefusal),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

/// Why a plan operation other than start did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{0} not found")]
    NotFound(String),
    /// The request is durably pending but no invocation of this coordinator owns it (another process's, or
    /// an orphan of a dead one): there is no outcome to wait for here.
    #[error("request {} is pending and not tracked by this coordinator", request.request_id.as_str())]
    NotTracked { request: Box<PlanRequest> },
    #[error(transparent)]
    Refused(PlanRefusal),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

impl From<storage::Error> for PlanError {
    fn from(e: storage::Error) -> Self {
        PlanError::Unavailable(e.to_string())
    }
}

/// An invocation's final answer, resolved only after its provider terminated.
#[derive(Debug, Clone, PartialEq)]
pub struct InvocationOutcome {
    pub request_id: RequestId,
    /// `Completed`, `Failed`, `Cancelled` or `Stale`, as the durable row classifies it.
    pub state: InvocationState,
    /// The durable reason (or the local one when storage could not answer); `None` for a completion.
    pub reason: Option<TerminalReason>,
    /// The original, unbounded diagnostic of the provider, the validator, the stop or the store.
    pub diagnostic: Option<String>,
    /// The durable row as read at the end (`None` only when storage could not answer).
    pub request: Option<PlanRequest>,
}

impl InvocationOutcome {
    /// The outcome the durable row alone gives (an invocation this coordinator no longer remembers).
    pub(super) fn from_durable(row: PlanRequest) -> Self {
        InvocationOutcome {
            request_id: row.request_id.clone(),
            state: classify(InvocationState::Failed, Some(&row)),
            reason: row.reason,
            diagnostic: row.diagnostic.clone(),
            request: Some(row),
        }
    }
}

/// What this coordinator knows of a tracked invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalInvocation {
    pub state: InvocationState,
    /// The retained first stop cause, while the provider winds down.
    pub stopping: Option<StopCause>,
}

/// A request as the HTTP layer shows it: the durable row and, while tracked here, the invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct SuggestionView {
    pub request: PlanRequest,
    pub invocation: Option<LocalInvocation>,
}
