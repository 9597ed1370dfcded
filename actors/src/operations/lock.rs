//! `with_lock`: mutual exclusion for non-app string identities (canonical file paths, token refreshes).
//!
//! Its signature takes `&str` on purpose: an app is never a lock key (app work declares claims), and
//! the old global `withLock(appId, …)` pattern cannot come back through it. Each key is one FIFO
//! `tokio::sync::Mutex`; the map entry lives only while someone holds or awaits the key.

use std::future::Future;
use std::sync::{Arc, PoisonError};

use super::{Held, OperationCoordinator, OperationError, HELD};

impl OperationCoordinator {
    /// Runs `op` holding the lock named `key`; callers of the same key run one at a time, in arrival
    /// order. Taking a key the task already holds is refused (`NestedLock`) instead of deadlocking.
    pub async fn with_lock<F: Future>(&self, key: &str, op: F) -> Result<F::Output, OperationError> {
        let mut held = Held::now();
        if held.keys.iter().any(|(c, k)| *c == self.inner.id && k == key) {
            return Err(OperationError::NestedLock { key: key.to_owned() });
        }
        let lock = {
            let mut locks = self.inner.locks.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(locks.entry(key.to_owned()).or_default())
        };
        // Declared before the guard, so it drops after it: the map entry is pruned once unused.
        let lease = KeyLease { coord: self.clone(), key: key.to_owned(), lock: Some(lock) };
        let _guard = Arc::clone(lease.lock.as_ref().expect("set above")).lock_owned().await;
        held.keys.push((self.inner.id, key.to_owned()));
        Ok(HELD.scope(held, op).await)
    }
}

/// This caller's reference to a key's lock; dropping it removes the map entry if nobody else has one.
struct KeyLease {
    coord: OperationCoordinator,
    key: String,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        drop(self.lock.take());
        let mut locks = self.coord.inner.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // Only the map's own reference left: no holder, no waiter. Clones are made under this lock
        // (or from a lease that is still counted), so the count cannot rise behind our back.
        if locks.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(&self.key);
        }
    }
}

impl OperationCoordinator {
    /// How many `with_lock` keys are currently held or awaited (for tests and metrics).
    pub fn active_lock_keys(&self) -> usize {
        self.inner.locks.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}
