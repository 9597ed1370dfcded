//! The storage handle's hooks for tests (the `test-hooks` feature): free-form transactions and reads,
//! and a SQLite database filled for real.

use super::StorageHandle;
use crate::actor::Backend;
use crate::{Error, Result};

impl StorageHandle {
    /// A free-form transaction for tests that inject faults or orderings (the `test-hooks` feature);
    /// everything else goes through the typed methods below.
    pub async fn transact_for_test<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        self.transact_once(f).await
    }

    /// Fill the SQLite database for real (the `test-hooks` feature): `PRAGMA max_page_count` on the
    /// actor's write connection caps the file at the pages it holds now, so a write that needs one more
    /// page fails `SQLITE_FULL` exactly as on a full disk; `full = false` lifts the cap again. Answers
    /// the cap now in force.
    pub async fn fill_sqlite_for_test(&self, full: bool) -> Result<u64> {
        self.transact_once(move |b, _| {
            let store = b
                .as_sqlite()
                .ok_or_else(|| Error::Unavailable("not a SQLite backend".into()))?;
            let conn = store.connection();
            let pages: i64 = if full {
                conn.query_row("PRAGMA page_count", [], |r| r.get(0))?
            } else {
                i64::from(u32::MAX - 1)
            };
            let cap: i64 =
                conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |r| {
                    r.get(0)
                })?;
            Ok(cap.max(0) as u64)
        })
        .await
    }

    /// A free-form read, routed as the handle's reads are (a reader's read-only connection, or the actor
    /// without readers), for tests of that routing (the `test-hooks` feature).
    pub async fn read_for_test<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        self.read_once(f).await
    }

    /// [`StorageHandle::transact`] for a body that can run only once (tests): never run again.
    pub(super) async fn transact_once<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        if self.outage.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable("injected outage".into()));
        }
        let now = self.clock.now_ms();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let body: crate::actor::Body<R> = Box::new(move |b: &mut dyn Backend| f(b, now));
        self.send(crate::actor::job(body, tx), rx).await
    }

    /// [`StorageHandle::read`] for a body that can run only once (tests).
    async fn read_once<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn Backend, i64) -> Result<R> + Send + 'static,
    {
        let Some(readers) = &self.readers else {
            return self.transact_once(f).await;
        };
        if self.outage.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Unavailable("injected outage".into()));
        }
        let now = self.clock.now_ms();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let body: crate::actor::Body<R> = Box::new(move |b: &mut dyn Backend| f(b, now));
        if let Err(e) = readers.try_send(crate::actor::job(body, tx)) {
            return Err(e.into_error("storage readers"));
        }
        rx.await
            .map_err(|_| Error::Unavailable("the storage readers dropped the message".into()))?
    }
}
