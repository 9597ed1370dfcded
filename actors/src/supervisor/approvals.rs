//! A person's decision on a tool call awaiting approval (SPEC §13): committed to the run's row by
//! whichever process takes it — the first decision wins — then the owner applies it (at once when it
//! runs here, at its next poll when it runs elsewhere, at the resume when nobody holds it).

use actix::{Context, Handler, Message, ResponseFuture};
use storage::ledger::{Decided, Decision, Refusal};
use storage::RunId;

use crate::run::ApprovalNews;

use super::Supervisor;

/// Decide a call awaiting approval.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Decided, DecideError>")]
pub struct DecideApproval {
    pub run_id: RunId,
    pub call_id: String,
    pub decision: Decision,
    /// Who decided: `token:<name>`, `capability`, `slack:<user>`.
    pub who: String,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecideError {
    #[error("no such run")]
    NotFound,
    #[error("the run awaits no approval of call {0}")]
    UnknownCall(String),
    /// The first decision stands.
    #[error("the call was decided already")]
    AlreadyDecided(Decided),
    /// The run has finished, or a stop ended its wait: the call never runs.
    #[error("the run is past its wait for approval")]
    Finished,
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

impl Handler<DecideApproval> for Supervisor {
    type Result = ResponseFuture<Result<Decided, DecideError>>;

    fn handle(&mut self, msg: DecideApproval, _ctx: &mut Context<Self>) -> Self::Result {
        let deps = self.deps().clone();
        let local = self.runs.get(&msg.run_id).cloned();
        Box::pin(async move {
            let decided = Decided {
                decision: msg.decision,
                who: msg.who,
                note: msg.note,
                at: deps.clock.now_ms(),
            };
            let answer = deps
                .storage
                .decide(msg.run_id.clone(), msg.call_id.clone(), decided.clone())
                .await
                .map_err(|e| DecideError::Unavailable(e.to_string()))?;
            match answer {
                Ok(_) => {
                    tracing::info!(run_id = %msg.run_id, generation = deps.gen.as_str(), call_id = %msg.call_id, decision = decided.decision.as_str(), "approval decided");
                    if let Some(run) = local {
                        run.do_send(ApprovalNews);
                    }
                    Ok(decided)
                }
                Err(Refusal::AlreadyDecided { decided, .. }) => {
                    Err(DecideError::AlreadyDecided(decided))
                }
                Err(Refusal::UnknownCall { call_id, .. }) => Err(DecideError::UnknownCall(call_id)),
                Err(Refusal::WrongPhase { .. }) => Err(DecideError::Finished),
                Err(_not_live) => match deps.storage.get_summary(msg.run_id).await {
                    Ok(Some(_)) => Err(DecideError::Finished),
                    Ok(None) => Err(DecideError::NotFound),
                    Err(e) => Err(DecideError::Unavailable(e.to_string())),
                },
            }
        })
    }
}
