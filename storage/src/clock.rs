//! Injected time.
//!
//! Lease, heartbeat, retry, retention and budget logic never reads the wall clock directly: it asks a
//! [`Clock`], so tests drive time with a [`ManualClock`] instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> i64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share one time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(now_ms: i64) -> Self {
        ManualClock(Arc::new(AtomicI64::new(now_ms)))
    }
    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The database's clock, read on the host (SPEC §1.3: lease arithmetic uses the database's `now()`):
/// the host's clock plus an offset measured once against the database when connecting
/// ([`crate::postgres::clock_offset_ms`]). Every host sharing a database then stamps leases on one
/// time line, whatever the skew between their own clocks; a host's clock drifting after the
/// measurement is not followed.
#[derive(Debug, Clone)]
pub struct DbClock {
    base: Arc<dyn Clock>,
    offset_ms: i64,
}

impl DbClock {
    /// `base` shifted by `offset_ms` (database time minus host time).
    pub fn new(base: Arc<dyn Clock>, offset_ms: i64) -> Self {
        DbClock { base, offset_ms }
    }

    /// Measure the offset of the PostgreSQL database at `url` against `base`.
    pub fn measure(base: Arc<dyn Clock>, url: &str) -> crate::Result<Self> {
        let offset_ms = crate::postgres::clock_offset_ms(url, || base.now_ms())?;
        Ok(DbClock { base, offset_ms })
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms
    }
}

impl Clock for DbClock {
    fn now_ms(&self) -> i64 {
        self.base.now_ms().saturating_add(self.offset_ms)
    }
}

/// The clock every production component shares.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}
