//! App deletion: close admission, drain admitted work, then deletion-only work through an opaque handle.
//!
//! The order is the seed's: [`OperationCoordinator::close_admission`] refuses every new request for
//! the app (ordinary operations, cross-app operations naming it, session reservations) from the
//! handler step that closes it on; [`AdmissionFence::drain`] waits until everything admitted before
//! the close — holders, waiters, a session slot — is gone; only then does a [`DeletionHandle`] exist,
//! and only it can run work on the closed app (the actor checks its fence). Ordinary handlers have no
//! way past admission: the handle cannot be built, cloned or obtained any other way.
//!
//! A live session is admitted work: the deleting handler ends it first
//! ([`OperationCoordinator::end_session`]), or `drain` waits for it (up to its cap).

use std::future::Future;

use tokio::sync::oneshot;

use super::actor::{CloseAdmission, Drain, Reopen};
use super::{
    Admission, Admit, AppId, Claims, Operation, OperationCoordinator, OperationError,
    OperationGuard, State,
};

impl State {
    /// `CloseAdmission`: refused with `DeletionInProgress` when already closed.
    pub(super) fn close_admission(
        &mut self,
        app: &AppId,
        fence: u64,
    ) -> Result<(), OperationError> {
        let a = self.app_mut(app);
        if let Admission::Closed { .. } = a.admission {
            return Err(OperationError::DeletionInProgress { app: app.clone() });
        }
        a.admission = Admission::Closed { fence };
        tracing::debug!(app = %app, "admission closed");
        Ok(())
    }

    /// `Reopen`: only if `fence` still closes the app.
    pub(super) fn reopen(&mut self, app: &AppId, fence: u64, now: i64) {
        if let Some(a) = self
            .apps
            .get_mut(app)
            .filter(|a| a.admission == Admission::Closed { fence })
        {
            a.admission = Admission::Open;
            tracing::debug!(app = %app, "admission reopened");
        }
        self.pump(app, now);
    }

    /// `Drain`: answers now if the app is idle, else when it becomes idle (in [`State::pump`]).
    pub(super) fn drain(&mut self, app: &AppId, reply: oneshot::Sender<()>) {
        match self.apps.get_mut(app) {
            Some(a) if !a.is_idle() => a.drain_waiters.push(reply),
            _ => {
                let _ = reply.send(());
            }
        }
    }

    /// Admission for deletion-handle work: only while `fence` still closes the app.
    pub(super) fn admit_deletion(
        &self,
        app: &AppId,
        fence: u64,
        operation: &str,
    ) -> Result<(), OperationError> {
        match self.apps.get(app) {
            Some(a) if a.admission == Admission::Closed { fence } => Ok(()),
            _ => Err(OperationError::AdmissionClosed {
                app: app.clone(),
                operation: operation.to_owned(),
            }),
        }
    }
}

impl OperationCoordinator {
    /// Closes admission on `app`: from this step on, new requests for it are refused with
    /// `AdmissionClosed`. Dropping the fence (before `drain` finished) reopens it. Refused with
    /// `DeletionInProgress` when already closed.
    pub async fn close_admission(&self, app: &AppId) -> Result<AdmissionFence, OperationError> {
        // Built before the request: if this future is dropped while waiting, its `Reopen` follows the
        // close (and is ignored when the close was refused: the fence id is not the app's).
        let fence = AdmissionFence {
            coord: self.clone(),
            app: app.clone(),
            fence: self.next_id(),
            armed: true,
        };
        self.ask(|reply| CloseAdmission {
            app: app.clone(),
            fence: fence.fence,
            reply,
        })
        .await??;
        Ok(fence)
    }
}

/// Admission on one app is closed while this lives. Dropping it reopens admission.
#[must_use = "dropping the fence reopens admission"]
#[derive(Debug)]
pub struct AdmissionFence {
    coord: OperationCoordinator,
    app: AppId,
    fence: u64,
    /// Cleared when `drain` hands the closed admission on to the deletion handle.
    armed: bool,
}

impl AdmissionFence {
    pub fn app(&self) -> &AppId {
        &self.app
    }

    /// Waits until all work admitted before the close has finished, then hands over the deletion
    /// handle. Cancelling the wait drops the fence and reopens admission.
    pub async fn drain(mut self) -> DeletionHandle {
        // With admission closed and no handle yet, nothing new is admitted: idle once is idle for good.
        // A coordinator that is gone holds nothing, so its error also means drained.
        let _ = self
            .coord
            .ask(|reply| Drain {
                app: self.app.clone(),
                reply,
            })
            .await;
        self.armed = false;
        tracing::debug!(app = %self.app, "drained; deletion handle issued");
        DeletionHandle {
            coord: self.coord.clone(),
            app: self.app.clone(),
            fence: self.fence,
        }
    }
}

impl Drop for AdmissionFence {
    fn drop(&mut self) {
        if self.armed {
            self.coord.tell(Reopen {
                app: self.app.clone(),
                fence: self.fence,
            });
        }
    }
}

/// The only way to run work on an app whose admission is closed: issued by [`AdmissionFence::drain`],
/// neither `Clone` nor constructible elsewhere. Dropping it — deletion done or abandoned — reopens
/// admission for the id (a workspace with that id may be created again, e.g. by a resumed run).
#[must_use = "dropping the handle reopens admission"]
#[derive(Debug)]
pub struct DeletionHandle {
    coord: OperationCoordinator,
    app: AppId,
    fence: u64,
}

impl DeletionHandle {
    pub fn app(&self) -> &AppId {
        &self.app
    }

    /// Runs deletion-only `op` holding `claims` on the closed app (e.g. `{app-path: write}`), past
    /// admission. Deletion operations still exclude one another by their claims.
    pub async fn run<F: Future>(
        &self,
        operation: Operation,
        claims: impl Into<Claims>,
        op: F,
    ) -> Result<F::Output, OperationError> {
        self.coord
            .check_nesting(std::iter::once(&self.app), operation.name())?;
        let admit = Admit::Deletion { fence: self.fence };
        let ticket = self
            .coord
            .enqueue(&self.app, &operation, claims.into(), admit, Vec::new())
            .await?;
        let guard = OperationGuard {
            operation: operation.name,
            tickets: vec![ticket],
        };
        Ok(guard.scope(op).await)
    }
}

impl Drop for DeletionHandle {
    fn drop(&mut self) {
        self.coord.tell(Reopen {
            app: self.app.clone(),
            fence: self.fence,
        });
    }
}
