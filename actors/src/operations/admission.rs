//! App deletion: close admission, drain admitted work, then deletion-only work through an opaque handle.
//!
//! The order is the seed's: [`OperationCoordinator::close_admission`] refuses every new request for
//! the app (ordinary operations, cross-app operations naming it, session reservations) in the same
//! locked step; [`AdmissionFence::drain`] waits until everything admitted before the close — holders,
//! waiters, a session slot — is gone; only then does a [`DeletionHandle`] exist, and only it can run
//! work on the closed app. Ordinary handlers have no way past admission: the handle cannot be built,
//! cloned or obtained any other way.
//!
//! A live session is admitted work: the deleting handler ends it first
//! ([`OperationCoordinator::end_session`]), or `drain` waits for it (up to its cap).

use std::future::Future;

use super::{Admission, Admit, AppId, Claims, Operation, OperationCoordinator, OperationError, OperationGuard};

impl OperationCoordinator {
    /// Closes admission on `app`: from this step on, new requests for it are refused with
    /// `AdmissionClosed`. Dropping the fence (before `drain` finished) reopens it. Refused with
    /// `DeletionInProgress` when already closed.
    pub fn close_admission(&self, app: &AppId) -> Result<AdmissionFence, OperationError> {
        let fence = self.apply(|st, _, _| {
            let fence = st.next_id();
            let a = st.app_mut(app);
            if let Admission::Closed { .. } = a.admission {
                return Err(OperationError::DeletionInProgress { app: app.clone() });
            }
            a.admission = Admission::Closed { fence };
            Ok(fence)
        })?;
        tracing::debug!(app = %app, "admission closed");
        Ok(AdmissionFence { coord: self.clone(), app: app.clone(), fence, armed: true })
    }

    /// Reopens `app` if `fence` still closes it.
    fn reopen(&self, app: &AppId, fence: u64) {
        self.apply(|st, now, fx| {
            if let Some(a) = st.apps.get_mut(app).filter(|a| a.admission == Admission::Closed { fence }) {
                a.admission = Admission::Open;
                tracing::debug!(app = %app, "admission reopened");
            }
            st.pump(app, now, fx);
        });
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
        loop {
            let wait = self.coord.apply(|st, _, _| {
                let a = st.apps.get_mut(&self.app)?;
                if a.is_idle() {
                    return None;
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                a.drain_waiters.push(tx);
                Some(rx)
            });
            match wait {
                // Woken when idle; loop to confirm under the lock.
                Some(rx) => {
                    let _ = rx.await;
                }
                None => break,
            }
        }
        self.armed = false;
        tracing::debug!(app = %self.app, "drained; deletion handle issued");
        DeletionHandle { coord: self.coord.clone(), app: self.app.clone(), fence: self.fence }
    }
}

impl Drop for AdmissionFence {
    fn drop(&mut self) {
        if self.armed {
            self.coord.reopen(&self.app, self.fence);
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
        self.coord.check_nesting(std::iter::once(&self.app), operation.name())?;
        debug_assert!(self.coord.apply(|st, _, _| st
            .apps
            .get(&self.app)
            .is_some_and(|a| a.admission == Admission::Closed { fence: self.fence })));
        let mut ticket = self.coord.enqueue(&self.app, &operation, claims.into(), Admit::Deletion)?;
        ticket.granted().await;
        let guard = OperationGuard { operation: operation.name, tickets: vec![ticket] };
        Ok(guard.scope(op).await)
    }
}

impl Drop for DeletionHandle {
    fn drop(&mut self) {
        self.coord.reopen(&self.app, self.fence);
    }
}
