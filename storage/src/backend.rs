//! What every storage backend implements ([`Backend`]: [`RunStore`], [`RunLedger`] and [`PlanStore`],
//! with what the storage actor needs of a connection — group commits, atomic units, its write count),
//! the three implementations, and [`atomic`], one logical transaction of several methods.

use crate::RunId;

use crate::ledger::RunLedger;
use crate::memory::MemoryStore;
use crate::plan::PlanStore;
use crate::postgres::PgStore;
use crate::sqlite::SqliteStore;
use crate::store::RunStore;
use crate::{Error, Result};

/// Everything a storage backend implements.
pub trait Backend: RunStore + RunLedger + PlanStore + Send + 'static {
    /// The secret capability tokens are derived from (hex; 32 bytes), shared by every process on the database.
    fn capability_secret(&mut self) -> Result<String>;

    /// Start a group commit; `false` when the backend has none (each method then commits alone) or one is
    /// already open (the caller runs inside it and must not end it).
    fn begin_group(&mut self) -> Result<bool> {
        Ok(false)
    }

    /// End the group begun by [`Backend::begin_group`].
    fn end_group(&mut self, _commit: bool) -> Result<()> {
        Ok(())
    }

    /// Start one logical transaction made of several methods: a savepoint inside a group, its own
    /// transaction outside one. Every `begin_atomic` is closed by exactly one [`Backend::end_atomic`].
    fn begin_atomic(&mut self) -> Result<()> {
        Ok(())
    }

    /// Release (`commit`) or roll back everything written since the matching [`Backend::begin_atomic`].
    fn end_atomic(&mut self, _commit: bool) -> Result<()> {
        Ok(())
    }

    /// A number that moves whenever another connection may have written a run's inbox since the last
    /// call ([`InboxWatch`](crate::actor::InboxWatch)); `None` when the backend cannot tell (every call then counts as a move).
    fn inbox_version(&mut self) -> Option<u64> {
        None
    }

    /// A durable step as one transaction: the ledger's `write_step` in an atomic unit, unless the
    /// backend's `write_step` is one transaction by itself.
    fn write_step_atomic(
        &mut self,
        run_id: &RunId,
        gen: &str,
        write: &crate::ledger::StepWrite,
    ) -> Result<crate::ledger::Outcome<()>> {
        step_in_unit(self, run_id, gen, write)
    }

    /// An admission recorded from its start (SPEC §5.2 step 2), inside the caller's transaction: the
    /// ledger's `admit` and, when it started `a.run_id`, the put of `tombstone` (its provisional record)
    /// with `proposal`. A backend may read the put's facts with the admission's.
    fn admit_recorded(
        &mut self,
        a: &crate::ledger::Admit,
        tombstone: &crate::record::RunRecord,
        proposal: Option<&crate::store::PolicyProposal>,
        now_ms: i64,
    ) -> Result<crate::ledger::AdmitOutcome> {
        let out = self.admit(a, now_ms)?;
        if out.started(&a.run_id) {
            self.put(tombstone, proposal, now_ms)?;
        }
        Ok(out)
    }

    /// The listing row of `id` (as `get_summary`) and whether it carries a deletion fence (as
    /// `killed_among`), in one read.
    fn summary_and_killed(
        &mut self,
        id: &RunId,
        now_ms: i64,
    ) -> Result<(Option<crate::record::RunListItem>, bool)> {
        let item = self.get_summary(id, now_ms)?;
        Ok((
            item,
            !self.killed_among(std::slice::from_ref(id))?.is_empty(),
        ))
    }

    /// Whether a message (or a group whose `COMMIT` failed) that answered `error` should run again
    /// alone: a lost race against another host, which nothing of the message's writes survived. Only
    /// backends with such races say yes (PostgreSQL); SQLite's writers queue for one lock instead.
    fn rerun_alone(&self, _error: &Error) -> bool {
        false
    }

    /// A count that grows whenever this connection writes (never shrinks while it is open): the actor
    /// tells a transaction that wrote from one that only read by it, so a read that commits on a full
    /// disk does not count as space found again ([`WriteSpace`](crate::actor::WriteSpace)). Backends that never run out of space
    /// (memory) keep the default.
    fn writes(&self) -> u64 {
        0
    }

    /// The SQLite store behind this backend, for tests that inject faults on the actor's own connection
    /// (the `test-hooks` feature).
    #[cfg(any(test, feature = "test-hooks"))]
    fn as_sqlite(&mut self) -> Option<&mut SqliteStore> {
        None
    }
}

/// Run `body` as one logical transaction on `backend`: what it wrote lands together when `keep` says so
/// of its answer, and nothing of it lands otherwise, grouped or not (SPEC §1.2: the savepoint wraps the
/// whole message).
pub fn atomic<B: Backend + ?Sized, R>(
    backend: &mut B,
    body: impl FnOnce(&mut B) -> Result<R>,
    keep: impl FnOnce(&R) -> bool,
) -> Result<R> {
    backend.begin_atomic()?;
    let out = body(backend);
    let commit = out.as_ref().is_ok_and(keep);
    match backend.end_atomic(commit) {
        Ok(()) => out,
        Err(e) if commit => Err(e),
        // A rollback that failed leaves the refusal or error the body answered.
        Err(_) => out,
    }
}

impl Backend for SqliteStore {
    fn capability_secret(&mut self) -> Result<String> {
        SqliteStore::capability_secret(self)
    }

    fn begin_group(&mut self) -> Result<bool> {
        SqliteStore::begin_group(self)
    }

    fn end_group(&mut self, commit: bool) -> Result<()> {
        SqliteStore::end_group(self, commit)
    }

    fn begin_atomic(&mut self) -> Result<()> {
        SqliteStore::begin_atomic(self)
    }

    fn end_atomic(&mut self, commit: bool) -> Result<()> {
        SqliteStore::end_atomic(self, commit)
    }

    fn inbox_version(&mut self) -> Option<u64> {
        SqliteStore::data_version(self)
    }

    fn writes(&self) -> u64 {
        SqliteStore::total_changes(self)
    }

    #[cfg(any(test, feature = "test-hooks"))]
    fn as_sqlite(&mut self) -> Option<&mut SqliteStore> {
        Some(self)
    }
}

impl Backend for PgStore {
    fn capability_secret(&mut self) -> Result<String> {
        PgStore::capability_secret(self)
    }

    fn begin_group(&mut self) -> Result<bool> {
        PgStore::begin_group(self)
    }

    fn end_group(&mut self, commit: bool) -> Result<()> {
        PgStore::end_group(self, commit)
    }

    fn begin_atomic(&mut self) -> Result<()> {
        PgStore::begin_atomic(self)
    }

    fn end_atomic(&mut self, commit: bool) -> Result<()> {
        PgStore::end_atomic(self, commit)
    }

    fn rerun_alone(&self, error: &Error) -> bool {
        error.is_race() || matches!(error, Error::GroupRolledBack(_))
    }

    fn summary_and_killed(
        &mut self,
        id: &RunId,
        now_ms: i64,
    ) -> Result<(Option<crate::record::RunListItem>, bool)> {
        PgStore::summary_and_killed(self, id, now_ms)
    }

    /// The put's facts come with the admission's read of the thread's row.
    fn admit_recorded(
        &mut self,
        a: &crate::ledger::Admit,
        tombstone: &crate::record::RunRecord,
        proposal: Option<&crate::store::PolicyProposal>,
        now_ms: i64,
    ) -> Result<crate::ledger::AdmitOutcome> {
        PgStore::admit_recorded(self, a, tombstone, proposal, now_ms)
    }

    /// Its `write_step` is one statement (so its `COMMIT` can go with it), or an atomic unit when the
    /// step patches the row's state.
    fn write_step_atomic(
        &mut self,
        run_id: &RunId,
        gen: &str,
        write: &crate::ledger::StepWrite,
    ) -> Result<crate::ledger::Outcome<()>> {
        if write.state.is_empty() {
            return self.write_step(run_id, gen, write);
        }
        step_in_unit(self, run_id, gen, write)
    }

    fn writes(&self) -> u64 {
        PgStore::writes(self)
    }

    /// Another host's inbox write arrives as news ([`crate::news::News::Inbox`]), which moves the
    /// watch itself.
    fn inbox_version(&mut self) -> Option<u64> {
        Some(0)
    }
}

impl Backend for MemoryStore {
    fn capability_secret(&mut self) -> Result<String> {
        Ok(self.secret().to_owned())
    }

    fn inbox_version(&mut self) -> Option<u64> {
        Some(self.inbox_writes())
    }
}

/// The ledger's `write_step` in an atomic unit: one transaction whatever the backend's methods.
fn step_in_unit<B: Backend + ?Sized>(
    b: &mut B,
    run_id: &RunId,
    gen: &str,
    write: &crate::ledger::StepWrite,
) -> Result<crate::ledger::Outcome<()>> {
    atomic(b, |b| b.write_step(run_id, gen, write), |out| out.is_ok())
}
