//! Stop and kill (SPEC §5.6): every stop commits to the ledger first; a kill writes the deletion fence,
//! aborts the run as a fence, then purges it and its workspace.

use actix::{
    ActorFutureExt, Context, Handler, Message, ResponseActFuture, ResponseFuture, WrapFuture,
};
use storage::ledger::StopMode;
use storage::RunId;

use crate::run::{self, RunDeps, StopActor, StopRequest};

use super::Supervisor;

/// A stop from an operator or integration (SPEC §5.6).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), StopError>")]
pub struct StopRun {
    pub run_id: RunId,
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
    pub run_id: RunId,
}

/// Purge a killed run once it has settled, and delete its workspace through the operation coordinator
/// (admission closed, admitted work drained, then `{app-path: write}` through the deletion handle).
/// Answers the successor the purge admitted for the messages queued behind the run (SPEC §5.1), for the
/// caller to launch.
pub(super) async fn purge_killed(
    deps: RunDeps,
    run_id: RunId,
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
    type Result = ResponseActFuture<Self, Result<(), StopError>>;

    fn handle(&mut self, msg: KillRun, _ctx: &mut Context<Self>) -> Self::Result {
        let deps = self.deps().clone();
        let id = msg.run_id;
        let fence = {
            let id = id.clone();
            async move {
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
                deps.storage
                    .kill(id)
                    .await
                    .map_err(|e| StopError::Unavailable(e.to_string()))
            }
        };
        // Who acts on the fence is decided once it is written, from the actors running then: a reclaim
        // may have launched this run's resume while the kill was on its way to storage.
        // A run nobody drives is purged before the kill answers (its record is gone when it does).
        Box::pin(fence.into_actor(self).then(move |answer, act, _ctx| {
            let answer = match answer {
                Ok(answer) => answer,
                Err(e) => return actix::fut::ready(Err(e)).boxed_local(),
            };
            let deps = act.deps().clone();
            tracing::info!(run_id = %id, generation = deps.gen.as_str(), live_owner = ?answer.live_owner, "kill: deletion fence written");
            match kill_route(act.runs.contains_key(&id), &answer) {
                // Ours: abort it as a fence; the supervisor purges when its actor has ended.
                KillRoute::Abort => {
                    if let Some(run) = act.runs.get(&id) {
                        run.do_send(run::Killed);
                    }
                }
                KillRoute::Owner => {}
                KillRoute::PurgeNow => {
                    return purge_killed(deps, id)
                        .into_actor(act)
                        .map(|successor, act, ctx| {
                            act.launch_successor(successor, ctx);
                            Ok(())
                        })
                        .boxed_local();
                }
            }
            actix::fut::ready(Ok(())).boxed_local()
        }))
    }
}

/// Who carries a kill out once its deletion fence is written (SPEC §5.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillRoute {
    /// This process's actor drives the run: it aborts as a fenced run, and the purge follows its end.
    Abort,
    /// A live owner without an actor here: another process (its heartbeat sees the fence), or this one
    /// between a reclaim and the launch of the run's actor (the actor's heartbeat or first write meets
    /// the fence, or the reclaim's own kill check purges). Purging under it could delete the workspace
    /// under a call its actor is about to make.
    Owner,
    /// Finished, or its owner's lease has run out: nothing drives it, purge now.
    PurgeNow,
}

fn kill_route(actor_here: bool, answer: &storage::ledger::KillAnswer) -> KillRoute {
    match (actor_here, &answer.live_owner) {
        (true, _) => KillRoute::Abort,
        (false, Some(_)) if answer.owner_lease_live => KillRoute::Owner,
        _ => KillRoute::PurgeNow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::ledger::KillAnswer;

    fn answer(owner: Option<&str>, live: bool) -> KillAnswer {
        KillAnswer {
            live_owner: owner.map(str::to_owned),
            owner_lease_live: live,
            had_record: false,
        }
    }

    #[test]
    fn a_kill_is_carried_out_by_whoever_drives_the_run_when_its_fence_lands() {
        // An actor here aborts, whoever the row names.
        assert_eq!(
            kill_route(true, &answer(Some("g1"), true)),
            KillRoute::Abort
        );
        assert_eq!(kill_route(true, &answer(None, false)), KillRoute::Abort);
        // A live owner without an actor here, this process's (a reclaim about to launch) or another's.
        assert_eq!(
            kill_route(false, &answer(Some("g1"), true)),
            KillRoute::Owner
        );
        // Nobody drives it: finished, or its owner's lease ran out.
        assert_eq!(kill_route(false, &answer(None, false)), KillRoute::PurgeNow);
        assert_eq!(
            kill_route(false, &answer(Some("g1"), false)),
            KillRoute::PurgeNow
        );
    }
}
