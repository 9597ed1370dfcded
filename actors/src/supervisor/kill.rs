//! Stop and kill (SPEC §5.6): every stop commits to the ledger first; a kill writes the deletion fence,
//! aborts the run as a fence, then purges it and its workspace.

use actix::{AsyncContext, Context, Handler, Message, ResponseFuture};
use storage::ledger::StopMode;

use crate::run::{self, RunDeps, StopActor, StopRequest};

use super::Supervisor;

/// A stop from an operator or integration (SPEC §5.6).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), StopError>")]
pub struct StopRun {
    pub run_id: String,
    pub mode: StopMode,
    pub actor: StopActor,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StopError {
    #[error("no such run")]
    NotFound,
    #[error("the run has finished")]
    Finished,
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

impl Handler<StopRun> for Supervisor {
    type Result = ResponseFuture<Result<(), StopError>>;

    fn handle(&mut self, msg: StopRun, _ctx: &mut Context<Self>) -> Self::Result {
        let deps = self.deps().clone();
        let local = self.runs.get(&msg.run_id).cloned();
        Box::pin(async move {
            if deps
                .registry
                .row(&msg.run_id)
                .is_some_and(|r| r.finished_at.is_some())
            {
                return Err(StopError::Finished);
            }
            // Every stop of a tracked run commits to the ledger first, then signals the run.
            match deps
                .storage
                .request_stop(msg.run_id.clone(), msg.mode)
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(_not_live)) => {
                    if local.is_none() {
                        return match deps.storage.get_summary(msg.run_id.clone()).await {
                            Ok(Some(_)) => Err(StopError::Finished),
                            Ok(None) => Err(StopError::NotFound),
                            Err(e) => Err(StopError::Unavailable(e.to_string())),
                        };
                    }
                }
                Err(e) => return Err(StopError::Unavailable(e.to_string())),
            }
            tracing::info!(run_id = %msg.run_id, generation = deps.gen.as_str(), mode = msg.mode.as_str(), by = %msg.actor.id, kind = %msg.actor.kind, "stop recorded");
            if let Some(run) = local {
                run.do_send(StopRequest {
                    mode: msg.mode,
                    actor: msg.actor,
                });
            }
            // A run another process owns: its heartbeat relays the stop.
            Ok(())
        })
    }
}

// ---- Kill (SPEC §5.6): deletion fence, abort as a fence, purge, workspace deletion ----

/// Kill a run: live (here or elsewhere) or finished.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), StopError>")]
pub struct KillRun {
    pub run_id: String,
}

/// Purge a killed run once it has settled, and delete its workspace through the operation coordinator
/// (admission closed, admitted work drained, then `{app-path: write}` through the deletion handle).
/// Answers the successor the purge admitted for the messages queued behind the run (SPEC §5.1), for the
/// caller to launch.
pub(super) async fn purge_killed(
    deps: RunDeps,
    run_id: String,
) -> Option<(storage::ledger::LiveRow, Vec<serde_json::Value>)> {
    let successor = run::fresh_successor(&deps, None);
    let successor_id = successor.run_id.clone();
    match deps
        .storage
        .purge(
            run_id.clone(),
            deps.gen.as_str().to_owned(),
            Some(successor),
        )
        .await
    {
        Ok(true) => {
            tracing::info!(run_id = %run_id, generation = deps.gen.as_str(), "purged a killed run")
        }
        Ok(false) => return None,
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "purge failed; a later reclaim retries it");
            return None;
        }
    }
    let next = run::admitted_successor(&deps, &successor_id).await;
    deps.registry.discard(&run_id);
    use crate::operations::{AppId, Claim, Operation, Resource};
    let app = AppId::new(run_id.clone());
    let Ok(fence) = deps.operations.close_admission(&app).await else {
        return next;
    };
    deps.operations.end_session(&app);
    let handle = fence.drain().await;
    let dir = crate::tools::workspace_dir(&deps.workspace_root, &run_id);
    let removed = handle
        .run(
            Operation::new("delete_workspace"),
            Claim::write(Resource::AppPath),
            async move {
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(e),
                }
            },
        )
        .await;
    if let Ok(Err(e)) | Err(e) = removed.map_err(|e| std::io::Error::other(e.to_string())) {
        tracing::warn!(run_id = %run_id, error = %e, "could not delete the killed run's workspace");
    }
    next
}

impl Handler<KillRun> for Supervisor {
    type Result = ResponseFuture<Result<(), StopError>>;

    fn handle(&mut self, msg: KillRun, ctx: &mut Context<Self>) -> Self::Result {
        let deps = self.deps().clone();
        let supervisor = ctx.address();
        let local = self.runs.get(&msg.run_id).cloned();
        Box::pin(async move {
            let id = msg.run_id;
            let known = deps.registry.row(&id).is_some()
                || deps
                    .storage
                    .get_live(id.clone())
                    .await
                    .map_err(|e| StopError::Unavailable(e.to_string()))?
                    .is_some()
                || deps
                    .storage
                    .get_summary(id.clone())
                    .await
                    .map_err(|e| StopError::Unavailable(e.to_string()))?
                    .is_some();
            if !known {
                return Err(StopError::NotFound);
            }
            let answer = deps
                .storage
                .kill(id.clone())
                .await
                .map_err(|e| StopError::Unavailable(e.to_string()))?;
            tracing::info!(run_id = %id, generation = deps.gen.as_str(), live_owner = ?answer.live_owner, "kill: deletion fence written");
            match (local, answer.live_owner) {
                // Ours: abort it as a fence; the supervisor purges when its actor has ended.
                (Some(run), _) => run.do_send(run::Killed),
                // Another live owner: its heartbeat sees the fence, aborts, and purges.
                (None, Some(owner)) if owner != deps.gen.as_str() && answer.owner_lease_live => {}
                // Finished, or its owner is gone: purge now.
                _ => {
                    if let Some((row, events)) = purge_killed(deps, id).await {
                        supervisor.do_send(super::LaunchRun(run::Launch::Restart {
                            row,
                            events,
                            from_gen: None,
                        }));
                    }
                }
            }
            Ok(())
        })
    }
}
