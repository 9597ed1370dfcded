//! `with_lock`: mutual exclusion for non-app string identities (canonical file paths, token refreshes).
//!
//! Its signature takes `&str` on purpose: an app is never a lock key (app work declares claims), and
//! the old global `withLock(appId, …)` pattern cannot come back through it. Each key is one FIFO queue
//! in the coordinator actor ([`KeyLocks`]); a key is known only while someone holds or awaits it.

use std::collections::{HashMap, VecDeque};
use std::future::Future;

use tokio::sync::oneshot;

use super::actor::{GetLockKeyCount, Lock, Unlock};
use super::{Held, OperationCoordinator, OperationError, HELD};

/// Every `with_lock` key held or awaited, each a FIFO of lease ids.
#[derive(Debug, Default)]
pub(super) struct KeyLocks {
    keys: HashMap<String, KeyQueue>,
}

#[derive(Debug, Default)]
struct KeyQueue {
    holder: Option<u64>,
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl KeyLocks {
    /// `Lock`: lease `id` queues on `key`; `grant` fires when it holds.
    pub(super) fn lock(&mut self, key: String, id: u64, grant: oneshot::Sender<()>) {
        self.keys
            .entry(key.clone())
            .or_default()
            .waiting
            .push_back((id, grant));
        self.pump(&key);
    }

    /// `Unlock`: lease `id` lets go of `key`, held or awaited; unknown leases change nothing.
    pub(super) fn unlock(&mut self, key: &str, id: u64) {
        let Some(q) = self.keys.get_mut(key) else {
            return;
        };
        if q.holder == Some(id) {
            q.holder = None;
        } else {
            q.waiting.retain(|(waiter, _)| *waiter != id);
        }
        self.pump(key);
    }

    /// Hands a free key to its first waiter that is still there (one whose receiver is gone is
    /// released at once), and forgets a key nobody holds or awaits.
    fn pump(&mut self, key: &str) {
        let Some(q) = self.keys.get_mut(key) else {
            return;
        };
        while q.holder.is_none() {
            let Some((id, grant)) = q.waiting.pop_front() else {
                break;
            };
            if grant.send(()).is_ok() {
                q.holder = Some(id);
            }
        }
        if q.holder.is_none() {
            self.keys.remove(key);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }
}

impl OperationCoordinator {
    /// Runs `op` holding the lock named `key`; callers of the same key run one at a time, in arrival
    /// order. Taking a key the task already holds is refused (`NestedLock`) instead of deadlocking.
    pub async fn with_lock<F: Future>(
        &self,
        key: &str,
        op: F,
    ) -> Result<F::Output, OperationError> {
        let mut held = Held::now();
        if held
            .keys
            .iter()
            .any(|(c, k)| *c == self.ids.coordinator && k == key)
        {
            return Err(OperationError::NestedLock {
                key: key.to_owned(),
            });
        }
        // Built before the request: dropping this future while it waits sends `Unlock` behind `Lock`.
        let lease = KeyLease {
            coord: self.clone(),
            key: key.to_owned(),
            id: self.next_id(),
        };
        self.ask(|grant| Lock {
            key: key.to_owned(),
            id: lease.id,
            grant,
        })
        .await?;
        held.keys.push((self.ids.coordinator, key.to_owned()));
        Ok(HELD.scope(held, op).await)
    }

    /// How many `with_lock` keys are currently held or awaited (for tests and metrics).
    pub async fn active_lock_keys(&self) -> Result<usize, OperationError> {
        self.ask(|reply| GetLockKeyCount { reply }).await
    }
}

/// One caller's place on a key; dropping it (done, cancelled or panicked) sends `Unlock`.
struct KeyLease {
    coord: OperationCoordinator,
    key: String,
    id: u64,
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        self.coord.tell(Unlock {
            key: std::mem::take(&mut self.key),
            id: self.id,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_goes_to_waiters_in_order_skipping_those_that_are_gone() {
        let mut locks = KeyLocks::default();
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, rx2) = oneshot::channel();
        let (tx3, mut rx3) = oneshot::channel();
        locks.lock("k".into(), 1, tx1);
        locks.lock("k".into(), 2, tx2);
        locks.lock("k".into(), 3, tx3);
        assert!(rx1.try_recv().is_ok());
        // Lease 2's caller was cancelled before its turn: the key passes straight to lease 3.
        drop(rx2);
        locks.unlock("k", 1);
        assert!(rx3.try_recv().is_ok());
        assert_eq!(locks.len(), 1);
        locks.unlock("k", 3);
        assert_eq!(locks.len(), 0, "an unused key is forgotten");
        // Unknown leases change nothing.
        locks.unlock("k", 9);
        assert_eq!(locks.len(), 0);
    }
}
