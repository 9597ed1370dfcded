//! `RunsService`: the one read service behind every read surface (JSON API, SSE, HTML, CLI) — SPEC §7.
//!
//! Owns nothing durable. It merges three sources into one [`RunView`] per run:
//! 1. the [`Registry`] — runs this process drives (live, or finished and not yet evicted);
//! 2. the ledger — `live_runs` rows of every generation; rows live under another generation list as live
//!    with their `ownerGen`;
//! 3. the history store — finished (and provisional) records.
//!
//! Precedence is registry > ledger > store, and a run in several sources is ONE row.
//!
//! Who uses it: `web` (API, SSE, HTML) and `src/cli/` (through the API). Every read takes the caller's
//! [`VisibilityFilter`](storage::record::VisibilityFilter); a run outside it answers exactly as an unknown
//! run does ([`RunsError::NotFound`]).
//!
//! Invariants:
//! - no view ever carries a run's capability token (the registry's token is never read here);
//! - an unfinished live row wins whole and suppresses its store row: the provisional tombstone written at
//!   admission never lists while the run lives anywhere;
//! - a finished registry row merges with its record, and the record's `finishedAt` / `status` win;
//! - `active` never calls the store; a store failure degrades to the live rows (`storeUnavailable`), a
//!   ledger failure to the registry and the store (`ledgerUnavailable`) — neither is an error;
//! - a persisted read without events uses `get_summary`, never the full `get`;
//! - a run with a deletion fence (killed here or in another process, SPEC §5.6) is never served from the
//!   registry or the ledger: every read answers it as an unknown run, within one ledger listing.
//!
//! # Layout
//! - `sources` — the [`RunSource`] seam and its [`StorageHandle`] implementation;
//! - `view` — [`RunView`], the one shape of a run, with its constructors per source and the merge with a
//!   final record;
//! - `gaps` — [`settled_prefix`]: how far a live run's ledger events may be served without skipping
//!   events that commit out of seq order;
//! - `list` — [`list_runs`](RunsService::list_runs): [`ListParams`], the three-source merge and the
//!   ledger-listing cache every read shares;
//! - `news` — cross-host news (PostgreSQL, SPEC §1.3): wake-ups for readers following another host's run,
//!   and the cached views a kill or an end elsewhere drops;
//! - `point` — one run at a time: [`get_run`](RunsService::get_run), its events, its friction ([`analyze`]),
//!   [`stop_run`](RunsService::stop_run), and the live and index rows;
//! - `testing` (tests only) — the `Double` source and the `Fixture` the tests of every module share.
//!
//! # Design
//! Storage is reached through the [`RunSource`] seam (implemented by [`StorageHandle`]; unit tests use a
//! double that can fail on demand), so every merge rule is tested without an actor system. One
//! `list_live` serves every read for [`LEDGER_LIST_TTL_MS`] (a page view's run, events and friction reads
//! cost one listing); a failed listing is not cached. The cache sits behind a `std::sync::Mutex` that is
//! never held across an `.await`: two readers racing on an expired entry may both list, which is cheaper
//! than making one wait.
//!
//! ## Kills from other processes
//! A process keeps a finished run in its registry for a minute and serves it from there, so a kill written
//! by another process (its deletion fence, then the purge of the record) would not reach this process's
//! reads without asking. Each listing therefore also asks the ledger which of the ids it may serve — this
//! process's registry rows and the listed ledger rows — carry a deletion fence (`killed_among`: one
//! indexed read, cached with the listing), and drops them. A point read of a registry row checks too: from
//! the fresh listing when that listing asked about the id, else with a one-id `killed_among`. A failed
//! check is no proof of a kill: a point read then serves the row, a listing counts as unavailable.
//!
//! ## Friction (the diagnosis of a live run)
//! [`analyze`] derives per-category counts and durations from the stamped events (`at`, epoch ms):
//! - `tool`: one count per `tool_result` whose `tool_call` (same `callId`) was seen; its duration is
//!   `tool_result.at − tool_call.at`. Calls without a result (in flight, or lost to a crash) are not counted.
//! - `model`: one count per `assistant` or `answer` event (each is one model turn); its duration is the gap
//!   from the latest preceding event that hands the model its input — `run_meta`, `input`, `context`,
//!   `tool_result`, `resumed` or an earlier `assistant`. Notes and stop requests published while the model
//!   thinks do not split the gap. Time across a crash is not counted (`resumed` restarts the clock).
//! - `storage`, `wait`, `retry`: not observable from v1 events; reported as zero.
//!
//! A persisted run answers its stored diagnosis (what the run actor measured), normalized.

mod feed;
mod gaps;
mod list;
mod news;
mod point;
mod sources;
#[cfg(test)]
mod testing;
mod view;

use std::sync::{Arc, Mutex};
use storage::RunId;

use storage::{Clock, Generation, StorageHandle};

use crate::registry::Registry;
pub use feed::{FeedChange, IndexFeed, FEED_FINISHED_KEPT, FEED_LANDING_SLACK_MS};
pub use gaps::{settled_prefix, GAP_PATIENCE_MS};
use list::LiveCache;
pub use list::{ListParams, NextBefore, RunList, StatusFilter, CURSOR_TOP, LEDGER_LIST_TTL_MS};
pub use point::{
    analyze, EventPage, Friction, FrictionSource, LiveRowView, RunStopper, StopAccepted,
    EVENTS_PAGE_MAX, EVENTS_PAGE_MAX_BYTES,
};
pub use sources::{RunSource, SourceFuture};
pub use view::{
    answer_of, failure_message, stopped_by_of, HeadFacts, Marks, RunView, ANSWER_VIEW_CHARS,
};

/// Page size for reading a live run's events from the ledger.
const LEDGER_EVENTS_CHUNK: usize = 1000;

/// Why a point read or a stop did not answer `ok`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunsError {
    /// Unknown, malformed, expired, killed — or outside the caller's view (the same answer on purpose).
    #[error("run not found")]
    NotFound,
    /// A write (a stop) to a run the caller may not see (SPEC §8.1 Auth: 403, nothing written). Reads
    /// answer [`RunsError::NotFound`] instead.
    #[error("the caller may not see run {0}")]
    Forbidden(RunId),
    /// The operation does not apply to the run as it is (a stop of a finished run).
    #[error("{0}")]
    Conflict(String),
    /// A source could not answer; the caller may retry. The text is for logs, not for clients.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// `ok | not_found | conflict | unavailable`.
pub type RunsResult<T> = Result<T, RunsError>;

/// The read service. Cheap to clone; clones share the ledger cache.
#[derive(Clone)]
pub struct RunsService {
    pub registry: Registry,
    pub gen: Generation,
    pub clock: Arc<dyn Clock>,
    source: Arc<dyn RunSource>,
    /// Shared by clones; a `std` mutex because it is held only for map updates, never across an `.await`.
    live: Arc<Mutex<LiveCache>>,
    /// Cross-host news: the followers' wake-ups (same mutex discipline as `live`).
    news: Arc<Mutex<news::NewsBoard>>,
}

impl std::fmt::Debug for RunsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsService")
            .field("gen", &self.gen)
            .finish_non_exhaustive()
    }
}

impl RunsService {
    pub fn new(
        registry: Registry,
        storage: StorageHandle,
        gen: Generation,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::with_source(registry, Arc::new(storage), gen, clock)
    }

    /// Over any [`RunSource`] (tests pass a double).
    pub fn with_source(
        registry: Registry,
        source: Arc<dyn RunSource>,
        gen: Generation,
        clock: Arc<dyn Clock>,
    ) -> Self {
        RunsService {
            registry,
            gen,
            clock,
            source,
            live: Arc::default(),
            news: Arc::default(),
        }
    }
}
