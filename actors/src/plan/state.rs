//! The coordinator's pure decisions: invocation states, stop causes, what to do when a provider
//! terminates, and how a durable row reclassifies the local answer. No I/O, no clock.

use std::time::Duration;

use storage::plan::{
    validate_cards, Card, PlanRequest, RequestState, SettleOutcome, Settlement, TerminalReason,
};

use super::provider::ProviderResult;

/// An invocation's state.
///
/// | state | means to outside observers | next |
/// |---|---|---|
/// | `Pending` | admitted and allocated; the provider has not been launched | `Running`, or `Cancelled` before launch (close) |
/// | `Running` | the provider works; a stop may have been requested (see [`StopCause`]) | a terminal state, only once the provider has terminated |
/// | `Completed` | the reply is durable (`ready`) — published by this coordinator or, when it lost a race, by another process | — |
/// | `Failed` | the provider rejected, a card was invalid, or the invocation timed out | — |
/// | `Cancelled` | cancelled, shut down, or cancelled durably by someone else | — |
/// | `Stale` | the plan's revision or snapshot moved on; nothing was published | — |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InvocationState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Stale,
}

impl InvocationState {
    pub fn as_str(self) -> &'static str {
        match self {
            InvocationState::Pending => "pending",
            InvocationState::Running => "running",
            InvocationState::Completed => "completed",
            InvocationState::Failed => "failed",
            InvocationState::Cancelled => "cancelled",
            InvocationState::Stale => "stale",
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, InvocationState::Pending | InvocationState::Running)
    }

    /// The legal transitions of the table above. A pending invocation that is cancelled before launch
    /// may still be reclassified by the durable row (another process may have settled it first).
    pub fn can_become(self, next: InvocationState) -> bool {
        match self {
            InvocationState::Pending => next == InvocationState::Running || next.is_terminal(),
            InvocationState::Running => next.is_terminal(),
            _ => false,
        }
    }
}

/// Why the coordinator asked a provider to stop. The first one is retained; a later one (or the provider's
/// own generic abort error) never replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopCause {
    /// The invocation ran past `[plan] timeout`: durable `failed (timeout)`.
    Timeout,
    /// The caller cancelled: durable `cancelled (cancelled)`.
    Cancelled,
    /// The coordinator closed: durable `cancelled (shutdown)`.
    Shutdown,
}

impl StopCause {
    pub fn as_str(self) -> &'static str {
        match self {
            StopCause::Timeout => "timeout",
            StopCause::Cancelled => "cancelled",
            StopCause::Shutdown => "shutdown",
        }
    }

    pub fn reason(self) -> TerminalReason {
        match self {
            StopCause::Timeout => TerminalReason::Timeout,
            StopCause::Cancelled => TerminalReason::Cancelled,
            StopCause::Shutdown => TerminalReason::Shutdown,
        }
    }

    /// The local classification the cause stands for.
    pub fn state(self) -> InvocationState {
        match self {
            StopCause::Timeout => InvocationState::Failed,
            StopCause::Cancelled | StopCause::Shutdown => InvocationState::Cancelled,
        }
    }

    /// The durable settlement the cause asks for at once.
    pub fn settlement(self, timeout: Duration) -> Settlement {
        let (outcome, diagnostic) = match self {
            StopCause::Timeout => (
                SettleOutcome::Failed,
                format!("timed out after {} ms", timeout.as_millis()),
            ),
            StopCause::Cancelled => (
                SettleOutcome::Cancelled,
                "cancelled by the caller".to_owned(),
            ),
            StopCause::Shutdown => (
                SettleOutcome::Cancelled,
                "the plan coordinator shut down".to_owned(),
            ),
        };
        Settlement {
            outcome,
            reason: self.reason(),
            diagnostic,
        }
    }
}

/// What the coordinator does once the provider has terminated.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// Publish through the store's completion CAS.
    Publish(Vec<Card>),
    /// Settle the exact pending attempt; `state` is the local classification, `diagnostic` the original
    /// (unbounded) text kept beside whatever classification the durable row ends up giving.
    Settle {
        settlement: Settlement,
        state: InvocationState,
        diagnostic: String,
    },
}

/// Decide from the first stop cause (if any) and the provider's result. A stop cause wins over anything
/// the provider answered afterwards — a generic abort error or even a late reply. `result` is `None` when
/// the provider was never launched.
pub fn decide_finish(
    stop: Option<StopCause>,
    result: Option<ProviderResult>,
    timeout: Duration,
) -> Finish {
    if let Some(cause) = stop {
        let settlement = cause.settlement(timeout);
        let diagnostic = settlement.diagnostic.clone();
        return Finish::Settle {
            settlement,
            state: cause.state(),
            diagnostic,
        };
    }
    let failed = |reason: TerminalReason, diagnostic: String| Finish::Settle {
        settlement: Settlement {
            outcome: SettleOutcome::Failed,
            reason,
            diagnostic: diagnostic.clone(),
        },
        state: InvocationState::Failed,
        diagnostic,
    };
    match result {
        Some(Ok(cards)) => match validate_cards(&cards) {
            Ok(()) => Finish::Publish(cards),
            Err(refusal) => failed(TerminalReason::InvalidCards, refusal.to_string()),
        },
        Some(Err(e)) => failed(TerminalReason::ProviderError, e.diagnostic().to_owned()),
        None => failed(
            TerminalReason::ProviderError,
            "the provider was never launched".to_owned(),
        ),
    }
}

/// The classification a durable row gives: the store's word wins over the local one, except for a row
/// still pending (which only a refused, mis-bound CAS can leave; the local classification stands).
pub fn classify(local: InvocationState, durable: Option<&PlanRequest>) -> InvocationState {
    match durable.map(|r| r.state) {
        Some(RequestState::Ready | RequestState::Consumed) => InvocationState::Completed,
        Some(RequestState::Failed) => InvocationState::Failed,
        Some(RequestState::Cancelled) => InvocationState::Cancelled,
        Some(RequestState::Invalidated) => InvocationState::Stale,
        Some(RequestState::Pending) | None => local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::provider::ProviderError;
    use storage::plan::{PlanId, RequestId, Revision, SnapshotId};

    const T: Duration = Duration::from_secs(30);

    fn card(t: &str) -> Card {
        Card {
            title: t.to_owned(),
            body: String::new(),
        }
    }

    fn row(state: RequestState) -> PlanRequest {
        PlanRequest {
            request_id: RequestId::generate(),
            plan_id: PlanId::parse("p").unwrap(),
            revision: Revision::FIRST,
            snapshot_id: SnapshotId::parse("s").unwrap(),
            state,
            reason: None,
            diagnostic: None,
            cards: None,
            created_at: 0,
            settled_at: None,
            holder: None,
        }
    }

    #[test]
    fn the_first_stop_cause_wins_over_whatever_the_provider_answers_later() {
        // A timeout, then the provider's generic abort error: the timeout classifies.
        let after_abort = Some(Err(ProviderError::Aborted("signal".into())));
        match decide_finish(Some(StopCause::Timeout), after_abort, T) {
            Finish::Settle {
                settlement,
                state,
                diagnostic,
            } => {
                assert_eq!(
                    (settlement.outcome, settlement.reason, state),
                    (
                        SettleOutcome::Failed,
                        TerminalReason::Timeout,
                        InvocationState::Failed
                    )
                );
                assert_eq!(diagnostic, "timed out after 30000 ms");
            }
            other => panic!("{other:?}"),
        }
        // A late reply after a cancel is not published.
        let late = Some(Ok(vec![card("late")]));
        assert!(matches!(
            decide_finish(Some(StopCause::Cancelled), late, T),
            Finish::Settle {
                state: InvocationState::Cancelled,
                ..
            }
        ));
        assert!(matches!(
            decide_finish(Some(StopCause::Shutdown), None, T),
            Finish::Settle {
                settlement: Settlement {
                    reason: TerminalReason::Shutdown,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn without_a_stop_a_valid_reply_publishes_and_anything_else_fails() {
        assert_eq!(
            decide_finish(None, Some(Ok(vec![card("a")])), T),
            Finish::Publish(vec![card("a")])
        );
        match decide_finish(None, Some(Ok(vec![card("a"), card("")])), T) {
            Finish::Settle {
                settlement,
                diagnostic,
                ..
            } => {
                assert_eq!(settlement.reason, TerminalReason::InvalidCards);
                assert_eq!(diagnostic, "card 1: title is empty");
            }
            other => panic!("{other:?}"),
        }
        match decide_finish(None, Some(Err(ProviderError::Rejected("boom".into()))), T) {
            Finish::Settle {
                settlement,
                state,
                diagnostic,
            } => {
                assert_eq!(
                    (settlement.reason, state, diagnostic.as_str()),
                    (
                        TerminalReason::ProviderError,
                        InvocationState::Failed,
                        "boom"
                    )
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_durable_row_reclassifies_the_local_answer() {
        use InvocationState as I;
        use RequestState as R;
        for (local, durable, want) in [
            (I::Failed, Some(R::Cancelled), I::Cancelled),
            (I::Failed, Some(R::Invalidated), I::Stale),
            (I::Completed, Some(R::Invalidated), I::Stale),
            (I::Failed, Some(R::Ready), I::Completed),
            (I::Cancelled, Some(R::Consumed), I::Completed),
            (I::Failed, Some(R::Pending), I::Failed),
            (I::Cancelled, None, I::Cancelled),
        ] {
            assert_eq!(
                classify(local, durable.map(row).as_ref()),
                want,
                "{local:?} {durable:?}"
            );
        }
    }

    #[test]
    fn invocation_transitions_follow_the_table() {
        use InvocationState as I;
        assert!(I::Pending.can_become(I::Running) && I::Pending.can_become(I::Cancelled));
        assert!(I::Running.can_become(I::Stale) && !I::Running.can_become(I::Pending));
        assert!(!I::Completed.can_become(I::Failed) && !I::Stale.can_become(I::Running));
    }
}
