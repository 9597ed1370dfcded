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
//! Who uses it: `web` (API, SSE, HTML) and `src/cli.rs` (through the API). Every read takes the caller's
//! [`VisibilityFilter`]; a run outside it answers exactly as an unknown run does ([`RunsError::NotFound`]).
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

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use storage::ledger::decisions::Phase;
use storage::ledger::{LiveRow, StopMode};
use storage::record::{
    event_seq, is_valid_run_id, ChannelVisibility, CategoryStat, Diagnosis, RunHead, RunListItem, RunRecord, RunStatus,
    VisibilityFilter,
};
use storage::store::{Cursor, EventsPage, ListPage, ListQuery, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT};
use storage::{Clock, Generation, StorageHandle};

use crate::registry::{Registry, RunRow};
use crate::run::StopActor;
use crate::supervisor::{StopError, StopRun, Supervisor};

/// One `list_live` serves reads for this long (seed `LEDGER_LIST_TTL_MS`).
pub const LEDGER_LIST_TTL_MS: i64 = 2_000;
/// Most events in one `get_run_events` page.
pub const EVENTS_PAGE_MAX: usize = 500;
/// Most event JSON (UTF-8 bytes) in one `get_run_events` page; a page always carries at least one event.
pub const EVENTS_PAGE_MAX_BYTES: usize = 256 * 1024;
/// Page size for reading a live run's events from the ledger.
const LEDGER_EVENTS_CHUNK: usize = 1000;
/// Most events a full read of a ledger row loads (a bound, like the registry's backlog).
const LEDGER_EVENTS_MAX: usize = 20_000;
/// The `nextBefore` of a page filled by unfinished rows alone: every finished run is older than it
/// (2^53 − 1, exact in every JSON reader).
pub const CURSOR_TOP: i64 = 9_007_199_254_740_991;

/// A future from a [`RunSource`].
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = storage::Result<T>> + Send + 'a>>;

/// What the service reads from storage: the history store and the ledger's read side.
///
/// Implemented by [`StorageHandle`]; tests implement it with a double that counts calls and fails on demand.
pub trait RunSource: Send + Sync + 'static {
    fn list(&self, query: ListQuery) -> SourceFuture<'_, ListPage>;
    fn get(&self, id: String) -> SourceFuture<'_, Option<RunRecord>>;
    fn get_summary(&self, id: String) -> SourceFuture<'_, Option<RunListItem>>;
    fn events(&self, id: String, after_seq: u64, limit: Option<usize>) -> SourceFuture<'_, Option<EventsPage>>;
    fn list_live(&self) -> SourceFuture<'_, Vec<LiveRow>>;
    fn get_live(&self, id: String) -> SourceFuture<'_, Option<LiveRow>>;
    fn live_events(&self, id: String, after_seq: u64, limit: usize) -> SourceFuture<'_, Option<Vec<Value>>>;
    /// Which of `ids` carry a deletion fence (SPEC §5.6), sorted and each once.
    fn killed_among(&self, ids: Vec<String>) -> SourceFuture<'_, Vec<String>>;
}

impl RunSource for StorageHandle {
    fn list(&self, query: ListQuery) -> SourceFuture<'_, ListPage> {
        Box::pin(StorageHandle::list(self, query))
    }
    fn get(&self, id: String) -> SourceFuture<'_, Option<RunRecord>> {
        Box::pin(StorageHandle::get(self, id))
    }
    fn get_summary(&self, id: String) -> SourceFuture<'_, Option<RunListItem>> {
        Box::pin(StorageHandle::get_summary(self, id))
    }
    fn events(&self, id: String, after_seq: u64, limit: Option<usize>) -> SourceFuture<'_, Option<EventsPage>> {
        Box::pin(StorageHandle::events(self, id, after_seq, limit))
    }
    fn list_live(&self) -> SourceFuture<'_, Vec<LiveRow>> {
        Box::pin(StorageHandle::list_live(self))
    }
    fn get_live(&self, id: String) -> SourceFuture<'_, Option<LiveRow>> {
        Box::pin(StorageHandle::get_live(self, id))
    }
    fn live_events(&self, id: String, after_seq: u64, limit: usize) -> SourceFuture<'_, Option<Vec<Value>>> {
        Box::pin(StorageHandle::live_events(self, id, after_seq, limit))
    }
    fn killed_among(&self, ids: Vec<String>) -> SourceFuture<'_, Vec<String>> {
        Box::pin(StorageHandle::killed_among(self, ids))
    }
}

/// Who carries out a stop: the process's [`Supervisor`] (or a test double).
pub trait RunStopper {
    fn stop(&self, msg: StopRun) -> Pin<Box<dyn Future<Output = Result<(), StopError>> + '_>>;
}

impl RunStopper for actix::Addr<Supervisor> {
    fn stop(&self, msg: StopRun) -> Pin<Box<dyn Future<Output = Result<(), StopError>> + '_>> {
        Box::pin(async move {
            self.send(msg).await.map_err(|e| StopError::Unavailable(format!("supervisor: {e}")))?
        })
    }
}

/// Why a point read or a stop did not answer `ok`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunsError {
    /// Unknown, malformed, expired, killed — or outside the caller's view (the same answer on purpose).
    #[error("run not found")]
    NotFound,
    /// The operation does not apply to the run as it is (a stop of a finished run).
    #[error("{0}")]
    Conflict(String),
    /// A source could not answer; the caller may retry. The text is for logs, not for clients.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// `ok | not_found | conflict | unavailable`.
pub type RunsResult<T> = Result<T, RunsError>;

/// A run as every read surface shows it: the same shape from every source (SPEC §7).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub channel_id: String,
    pub user_id: String,
    pub thread_key: String,
    pub channel_visibility: ChannelVisibility,
    pub started_at: i64,
    pub finished: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    pub event_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_event_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// The strongest stop requested so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopMode>,
    /// Present (`true`) once the run's final record is in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persisted: Option<bool>,
    /// Present (`true`) for a stored tombstone: no finish was recorded (render "unfinished — no finish
    /// recorded", never "interrupted").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisional: Option<bool>,
    /// The generation a run live in another process is owned by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_gen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// Only when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<Value>>,
}

impl RunView {
    /// A row of this process's registry.
    pub fn from_registry(row: &RunRow) -> Self {
        let m = &row.meta;
        RunView {
            id: row.id.clone(),
            label: Some(m.label.clone()).filter(|l| !l.is_empty()),
            agent: Some(m.agent.clone()),
            model: Some(m.model.clone()),
            channel_id: m.channel_id.clone(),
            user_id: m.user_id.clone(),
            thread_key: m.thread_key.clone(),
            channel_visibility: m.channel_visibility,
            started_at: row.started_at,
            finished: row.finished_at.is_some(),
            finished_at: row.finished_at,
            status: row.status,
            event_count: row.event_count,
            stored_event_count: Some(row.stored_event_count),
            truncated: Some(row.truncated),
            stop: row.stop,
            persisted: row.persisted.then_some(true),
            provisional: None,
            owner_gen: None,
            parent_run_id: m.parent_run_id.clone(),
            events: None,
        }
    }

    /// A stored record or listing row.
    pub fn from_head(h: &RunHead) -> Self {
        RunView {
            id: h.id.clone(),
            label: h.label.clone(),
            agent: h.agent.clone(),
            model: h.model.clone(),
            channel_id: h.channel_id.clone(),
            user_id: h.user_id.clone(),
            thread_key: h.thread_key.clone(),
            channel_visibility: h.channel_visibility,
            started_at: h.started_at,
            finished: true,
            finished_at: Some(h.finished_at),
            status: Some(h.status),
            event_count: h.event_count,
            stored_event_count: Some(h.stored_event_count),
            truncated: Some(h.truncated),
            stop: None,
            persisted: Some(true),
            provisional: h.provisional.then_some(true),
            owner_gen: None,
            parent_run_id: h.parent_run_id.clone(),
            events: None,
        }
    }

    /// A ledger row (a run live in some process), with the highest event seq known for it.
    pub fn from_live(row: &LiveRow, event_count: u64) -> Self {
        let s = |k: &str| row.meta.get(k).and_then(Value::as_str).map(str::to_owned);
        RunView {
            id: row.run_id.clone(),
            label: s("label").filter(|l| !l.is_empty()),
            agent: s("agent"),
            model: s("model"),
            channel_id: s("channelId").unwrap_or_default(),
            user_id: s("userId").unwrap_or_default(),
            thread_key: s("threadKey").unwrap_or_else(|| row.thread_key.clone()),
            channel_visibility: s("channelVisibility").and_then(|v| ChannelVisibility::parse(&v)).unwrap_or_default(),
            started_at: row.started_at,
            finished: false,
            finished_at: None,
            status: None,
            event_count,
            stored_event_count: None,
            truncated: None,
            stop: row.stop,
            persisted: None,
            provisional: None,
            owner_gen: Some(row.owner_gen.clone()),
            parent_run_id: s("parentRunId"),
            events: None,
        }
    }

    /// Overlay a finished live row with its (final) record: the record's finish fields win.
    fn merge_record(&mut self, h: &RunHead) {
        self.finished = true;
        self.finished_at = Some(h.finished_at);
        self.status = Some(h.status);
        self.stored_event_count = Some(h.stored_event_count);
        self.truncated = Some(h.truncated);
        self.persisted = Some(true);
    }

    pub fn visible_to(&self, filter: &VisibilityFilter) -> bool {
        filter.matches(&self.channel_id, &self.user_id, self.channel_visibility)
    }

    /// The listing order key of a finished row: `(finishedAt, id)`.
    fn key(&self) -> (i64, &str) {
        (self.finished_at.unwrap_or(self.started_at), self.id.as_str())
    }

    /// Wall time from start to finish (or to `now_ms` while live).
    pub fn duration_ms(&self, now_ms: i64) -> i64 {
        (self.finished_at.unwrap_or(now_ms) - self.started_at).max(0)
    }

    /// The status word every surface shows: `live` / `stopping` while unfinished, the third state
    /// `unfinished — no finish recorded` for a tombstone, else the status.
    pub fn status_label(&self) -> String {
        if !self.finished {
            return match self.stop {
                Some(m) => format!("stopping ({})", m.as_str()),
                None => "live".into(),
            };
        }
        if self.provisional == Some(true) {
            return "unfinished — no finish recorded".into();
        }
        self.status.map(|s| s.as_str().to_owned()).unwrap_or_else(|| "finished".into())
    }
}

/// Which runs a listing covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusFilter {
    /// Unfinished runs of this process and runs live under other generations; never reads the store.
    Active,
    /// Finished registry rows and the store.
    Finished,
    All,
}

impl StatusFilter {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "active" => Some(StatusFilter::Active),
            "finished" => Some(StatusFilter::Finished),
            "all" => Some(StatusFilter::All),
            _ => None,
        }
    }
}

/// `list_runs` parameters (SPEC §7).
#[derive(Debug, Clone, PartialEq)]
pub struct ListParams {
    pub status: StatusFilter,
    /// Required: the caller's visibility.
    pub visible_to: VisibilityFilter,
    pub agent: Option<String>,
    pub channel: Option<String>,
    pub thread_key: Option<String>,
    pub parent_run_id: Option<String>,
    /// Compared with `finishedAt ?? startedAt`.
    pub since_ms: Option<i64>,
    /// ≤ 200, default 50.
    pub limit: Option<usize>,
    /// A cursor page (`nextBefore` of the previous page): live rows are omitted.
    pub before: Option<Cursor>,
}

impl ListParams {
    pub fn new(status: StatusFilter, visible_to: VisibilityFilter) -> Self {
        ListParams {
            status,
            visible_to,
            agent: None,
            channel: None,
            thread_key: None,
            parent_run_id: None,
            since_ms: None,
            limit: None,
            before: None,
        }
    }

    fn effective_limit(&self) -> usize {
        self.limit.unwrap_or(LIST_DEFAULT_LIMIT).clamp(1, LIST_MAX_LIMIT)
    }

    /// The non-visibility filters on a live row (a ledger row without the field is excluded).
    fn admits(&self, v: &RunView) -> bool {
        self.agent.as_deref().is_none_or(|a| v.agent.as_deref() == Some(a))
            && self.channel.as_deref().is_none_or(|c| v.channel_id == c)
            && self.thread_key.as_deref().is_none_or(|t| v.thread_key == t)
            && self.parent_run_id.as_deref().is_none_or(|p| v.parent_run_id.as_deref() == Some(p))
            && self.since_ms.is_none_or(|s| v.finished_at.unwrap_or(v.started_at) >= s)
            && v.visible_to(&self.visible_to)
    }
}

/// The wire form of a list cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NextBefore {
    pub finished_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl NextBefore {
    pub fn to_cursor(&self) -> Cursor {
        Cursor { finished_at: self.finished_at, id: self.id.clone() }
    }
}

/// A listing page.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunList {
    pub runs: Vec<RunView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<NextBefore>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub store_unavailable: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ledger_unavailable: bool,
}

/// A page of a run's events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventPage {
    pub events: Vec<Value>,
    /// Present while more events follow: pass it back as `afterSeq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<u64>,
}

/// Where a friction answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrictionSource {
    /// Analyzed from this process's registry events.
    Live,
    /// Analyzed from the ledger's events of a run live under another generation.
    Ledger,
    /// The stored record's diagnosis.
    Stored,
}

/// `get_run_friction`'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Friction {
    pub id: String,
    pub finished: bool,
    pub truncated: bool,
    pub source: FrictionSource,
    pub diagnosis: Diagnosis,
}

/// A stop that was recorded and signalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StopAccepted {
    pub id: String,
    pub mode: StopMode,
    /// Always `stopping`.
    pub state: String,
}

/// A ledger row as `GET /api/live` shows it: never the prompt, the tools or the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveRowView {
    pub run_id: String,
    pub thread_key: String,
    pub owner_gen: String,
    pub lease_until: i64,
    pub started_at: i64,
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopMode>,
    /// `meta_json` minus the admitted request (identity, agent, deadline).
    pub meta: Value,
}

/// One `list_live` answer with the highest known event seq of each row, and the kill state of every id
/// the listing may serve.
#[derive(Debug, Default)]
struct LiveListing {
    rows: Vec<LiveRow>,
    last_seq: HashMap<String, u64>,
    /// The ids whose deletion fence was asked for: this process's registry rows at listing time and the
    /// listed ledger rows. A registry row created since is not covered (a point read asks for it).
    asked: HashSet<String>,
    /// Those of `asked` that carry a deletion fence: never served, never listed.
    killed: HashSet<String>,
}

impl LiveListing {
    /// Whether `id` was killed, when this listing knows (`None`: it did not ask).
    fn killed(&self, id: &str) -> Option<bool> {
        self.asked.contains(id).then(|| self.killed.contains(id))
    }
}

#[derive(Debug, Default)]
struct LiveCache {
    /// The last successful listing and when (service clock) it was taken.
    listing: Option<(i64, Arc<LiveListing>)>,
    /// Highest event seq seen per ledger row, so a refresh reads only the events past it.
    last_seq: HashMap<String, u64>,
}

/// Where a point read found a run.
enum Found {
    Registry(RunRow),
    Ledger(LiveRow, u64),
    Store(RunListItem),
}

/// The read service. Cheap to clone; clones share the ledger cache.
#[derive(Clone)]
pub struct RunsService {
    pub registry: Registry,
    pub gen: Generation,
    pub clock: Arc<dyn Clock>,
    source: Arc<dyn RunSource>,
    /// Shared by clones; a `std` mutex because it is held only for map updates, never across an `.await`.
    live: Arc<Mutex<LiveCache>>,
}

impl std::fmt::Debug for RunsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsService").field("gen", &self.gen).finish_non_exhaustive()
    }
}

impl RunsService {
    pub fn new(registry: Registry, storage: StorageHandle, gen: Generation, clock: Arc<dyn Clock>) -> Self {
        Self::with_source(registry, Arc::new(storage), gen, clock)
    }

    /// Over any [`RunSource`] (tests pass a double).
    pub fn with_source(registry: Registry, source: Arc<dyn RunSource>, gen: Generation, clock: Arc<dyn Clock>) -> Self {
        RunsService { registry, gen, clock, source, live: Arc::default() }
    }

    fn cache(&self) -> MutexGuard<'_, LiveCache> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forget the cached ledger listing (after a kill, so the run disappears at once).
    pub fn invalidate_live(&self) {
        self.cache().listing = None;
    }

    /// The cached ledger listing while it is at most [`LEDGER_LIST_TTL_MS`] old.
    fn fresh_listing(&self) -> Option<Arc<LiveListing>> {
        let now = self.clock.now_ms();
        match &self.cache().listing {
            Some((at, listing)) if (0..LEDGER_LIST_TTL_MS).contains(&(now - at)) => Some(listing.clone()),
            _ => None,
        }
    }

    /// The ledger listing, at most [`LEDGER_LIST_TTL_MS`] old; `Err` (logged once) when it cannot be read.
    /// A refresh costs one `list_live`, one `killed_among` (chunked by the ledger when the ids are many)
    /// and, per listed row, a read of the events past the highest seq already known.
    async fn live_listing(&self) -> Result<Arc<LiveListing>, String> {
        if let Some(listing) = self.fresh_listing() {
            return Ok(listing);
        }
        let now = self.clock.now_ms();
        let unavailable = |e: storage::Error| {
            tracing::warn!(generation = self.gen.as_str(), error = %e, "ledger listing failed; serving registry and store");
            e.to_string()
        };
        let rows = self.source.list_live().await.map_err(unavailable)?;
        // Each row's highest seq, reading only past what is already known (rows in parallel).
        let known: HashMap<String, u64> = {
            let cache = self.cache();
            rows.iter().map(|r| (r.run_id.clone(), cache.last_seq.get(&r.run_id).copied().unwrap_or(0))).collect()
        };
        let reads = rows.iter().map(|r| {
            let (id, from) = (r.run_id.clone(), known[&r.run_id]);
            async move { (id.clone(), self.highest_live_seq(id, from).await) }
        });
        // The kill state of everything this listing may serve, read beside the seqs.
        let asked: HashSet<String> =
            self.registry.rows().into_iter().map(|r| r.id).chain(rows.iter().map(|r| r.run_id.clone())).collect();
        let kills = async {
            if asked.is_empty() {
                return Ok(Vec::new());
            }
            self.source.killed_among(asked.iter().cloned().collect()).await
        };
        let (seqs, killed) = futures_util::future::join(futures_util::future::join_all(reads), kills).await;
        let killed: HashSet<String> = killed.map_err(unavailable)?.into_iter().collect();
        let last_seq: HashMap<String, u64> = seqs.into_iter().collect();
        let listing = Arc::new(LiveListing { rows, last_seq: last_seq.clone(), asked, killed });
        let mut cache = self.cache();
        cache.last_seq = last_seq;
        cache.listing = Some((now, listing.clone()));
        Ok(listing)
    }

    /// The highest live event seq of `id` past `from` (or `from` when none follow or the read fails).
    async fn highest_live_seq(&self, id: String, mut from: u64) -> u64 {
        loop {
            match self.source.live_events(id.clone(), from, LEDGER_EVENTS_CHUNK).await {
                Ok(Some(events)) => {
                    let n = events.len();
                    from = events.iter().filter_map(event_seq).max().unwrap_or(from).max(from);
                    if n < LEDGER_EVENTS_CHUNK {
                        return from;
                    }
                }
                _ => return from,
            }
        }
    }

    /// Every live event of a ledger row (bounded by [`LEDGER_EVENTS_MAX`]); `None` once the row is gone.
    async fn all_live_events(&self, id: &str) -> RunsResult<Option<Vec<Value>>> {
        let mut out: Vec<Value> = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .source
                .live_events(id.to_owned(), after, LEDGER_EVENTS_CHUNK)
                .await
                .map_err(|e| RunsError::Unavailable(e.to_string()))?;
            let Some(page) = page else { return Ok(None) };
            let n = page.len();
            after = page.iter().filter_map(event_seq).max().unwrap_or(after);
            out.extend(page);
            if n < LEDGER_EVENTS_CHUNK || out.len() >= LEDGER_EVENTS_MAX {
                return Ok(Some(out));
            }
        }
    }

    /// Whether a ledger row is listed by this process: every row except this generation's `attaching`
    /// reservations (their registry row is about to exist) and rows the registry already serves.
    fn lists_ledger_row(&self, row: &LiveRow) -> bool {
        !(row.owner_gen == self.gen.as_str() && row.phase == Phase::Attaching) && self.registry.row(&row.run_id).is_none()
    }

    /// Whether the registry row `id` carries a deletion fence: from the fresh listing when it asked about
    /// the id, else one `killed_among` read. A failed read is no proof of a kill: the row is served.
    async fn registry_row_killed(&self, id: &str) -> bool {
        if let Some(known) = self.fresh_listing().and_then(|l| l.killed(id)) {
            return known;
        }
        match self.source.killed_among(vec![id.to_owned()]).await {
            Ok(killed) => killed.iter().any(|k| k == id),
            Err(e) => {
                tracing::warn!(run_id = id, error = %e, "kill state read failed; serving the registry row");
                false
            }
        }
    }

    /// `list_runs` (SPEC §7): the three-source merge, sorted, limited, with the store cursor.
    pub async fn list_runs(&self, params: &ListParams) -> RunList {
        let limit = params.effective_limit();
        if params.visible_to == VisibilityFilter::None {
            // Nothing is visible: touch neither the ledger nor the store.
            return RunList::default();
        }
        let cursor = params.before.as_ref();
        let older_than_cursor = |v: &RunView| {
            cursor.is_none_or(|c| match &c.id {
                Some(id) => v.key() < (c.finished_at, id.as_str()),
                None => v.key().0 < c.finished_at,
            })
        };

        // Live rows: the registry, then ledger rows it does not hold; a killed id lists from no source.
        let listing = self.live_listing().await;
        let mut suppress: HashSet<String> = HashSet::new();
        if let Ok(listing) = &listing {
            suppress.extend(listing.killed.iter().cloned());
        }
        let mut unfinished: Vec<RunView> = Vec::new();
        let mut finished_live: Vec<RunView> = Vec::new();
        for row in self.registry.rows() {
            if suppress.contains(&row.id) {
                continue;
            }
            let view = RunView::from_registry(&row);
            if view.finished {
                finished_live.push(view);
            } else {
                suppress.insert(view.id.clone());
                unfinished.push(view);
            }
        }
        if let Ok(listing) = &listing {
            for row in &listing.rows {
                if listing.killed.contains(&row.run_id) {
                    continue; // suppressed already
                }
                suppress.insert(row.run_id.clone());
                if self.lists_ledger_row(row) {
                    let seq = listing.last_seq.get(&row.run_id).copied().unwrap_or(0);
                    unfinished.push(RunView::from_live(row, seq));
                }
            }
        }
        unfinished.retain(|v| params.admits(v));
        finished_live.retain(|v| params.admits(v) && older_than_cursor(v));
        if cursor.is_some() || params.status == StatusFilter::Finished {
            unfinished.clear();
        }
        if params.status == StatusFilter::Active {
            finished_live.clear();
        }

        // The store: one bounded page, asked for enough rows to survive suppression and merging.
        let mut store_unavailable = false;
        let mut boundary: Option<Cursor> = None;
        let mut stored: Vec<RunListItem> = Vec::new();
        if params.status != StatusFilter::Active {
            let ask = (limit + suppress.len() + finished_live.len()).min(LIST_MAX_LIMIT);
            let query = ListQuery {
                visible_to: params.visible_to.clone(),
                limit: Some(ask),
                before: params.before.clone(),
                since_ms: params.since_ms,
                agent: params.agent.clone(),
                channel: params.channel.clone(),
                thread_key: params.thread_key.clone(),
                parent_run_id: params.parent_run_id.clone(),
            };
            match self.source.list(query).await {
                Ok(page) => {
                    boundary = page.next_before;
                    stored = page.items;
                }
                Err(e) => {
                    tracing::warn!(generation = self.gen.as_str(), error = %e, "history store listing failed; serving live rows");
                    store_unavailable = true;
                }
            }
        }

        // Merge: a finished registry row takes its final record's finish fields; suppressed ids vanish.
        let mut finished: HashMap<String, RunView> = finished_live.into_iter().map(|v| (v.id.clone(), v)).collect();
        for item in stored {
            let h = &item.head;
            if suppress.contains(&h.id) || !params.visible_to.matches_head(h) {
                continue;
            }
            match finished.get_mut(&h.id) {
                // The tombstone lends nothing, not even its status.
                Some(live) if !h.provisional => live.merge_record(h),
                Some(_) => {}
                None => {
                    finished.insert(h.id.clone(), RunView::from_head(h));
                }
            }
        }
        let mut finished: Vec<RunView> = finished.into_values().collect();
        // A full store page is only complete down to its last row: older registry rows wait for the next page.
        if let Some(b) = &boundary {
            let b_key = (b.finished_at, b.id.as_deref().unwrap_or(""));
            finished.retain(|v| v.key() >= b_key);
        }
        unfinished.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
        finished.sort_by(|a, b| b.key().cmp(&a.key()));

        let shown_unfinished = unfinished.len().min(limit);
        let shown_finished = finished.len().min(limit - shown_unfinished);
        let next_before = if shown_finished < finished.len() {
            Some(match shown_finished.checked_sub(1).map(|i| &finished[i]) {
                Some(last) => NextBefore { finished_at: last.key().0, id: Some(last.id.clone()) },
                None => NextBefore { finished_at: CURSOR_TOP, id: None },
            })
        } else {
            boundary.map(|b| NextBefore { finished_at: b.finished_at, id: b.id })
        };
        let mut runs = unfinished;
        runs.truncate(shown_unfinished);
        runs.extend(finished.into_iter().take(shown_finished));
        RunList { runs, next_before, store_unavailable, ledger_unavailable: listing.is_err() }
    }

    /// Find a run: registry, then the ledger (cached listing), then the store summary.
    async fn find(&self, id: &str) -> RunsResult<Found> {
        if !is_valid_run_id(id) {
            return Err(RunsError::NotFound);
        }
        if let Some(row) = self.registry.row(id) {
            if self.registry_row_killed(id).await {
                return Err(RunsError::NotFound);
            }
            return Ok(Found::Registry(row));
        }
        if let Ok(listing) = self.live_listing().await {
            if listing.killed.contains(id) {
                return Err(RunsError::NotFound);
            }
            if let Some(row) = listing.rows.iter().find(|r| r.run_id == id && self.lists_ledger_row(r)) {
                let seq = listing.last_seq.get(id).copied().unwrap_or(0);
                return Ok(Found::Ledger(row.clone(), seq));
            }
        }
        match self.source.get_summary(id.to_owned()).await {
            Ok(Some(item)) => Ok(Found::Store(item)),
            Ok(None) => Err(RunsError::NotFound),
            Err(e) => {
                tracing::warn!(run_id = id, error = %e, "history store read failed");
                Err(RunsError::Unavailable(e.to_string()))
            }
        }
    }

    /// A finished registry row overlaid with its final record, once the store holds it. A store failure is
    /// one warning and the registry row as it is.
    async fn overlay_record(&self, view: &mut RunView) {
        if !view.finished {
            return;
        }
        match self.source.get_summary(view.id.clone()).await {
            Ok(Some(item)) if !item.head.provisional => view.merge_record(&item.head),
            Ok(_) => {}
            Err(e) => tracing::warn!(run_id = %view.id, error = %e, "history store read failed; serving the registry row"),
        }
    }

    /// `get_run` (SPEC §7): one run's view, with its events when asked.
    pub async fn get_run(&self, id: &str, include_events: bool, visible_to: &VisibilityFilter) -> RunsResult<RunView> {
        match self.find(id).await? {
            Found::Registry(row) => {
                let mut view = RunView::from_registry(&row);
                if !view.visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                self.overlay_record(&mut view).await;
                if include_events {
                    // Taken after the row: the events cover at least what the row counted.
                    let events = self.registry.snapshot(id).map(|(_, e)| e).unwrap_or_default();
                    view.events = Some(events);
                }
                Ok(view)
            }
            Found::Ledger(row, seq) => {
                let mut view = RunView::from_live(&row, seq);
                if !view.visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                if include_events {
                    match self.all_live_events(id).await? {
                        Some(events) => {
                            view.event_count = events.iter().filter_map(event_seq).max().unwrap_or(0).max(seq);
                            view.events = Some(events);
                        }
                        // The row went between the listing and this read: it finished; read its record.
                        None => return self.stored_run(id, true, visible_to).await,
                    }
                }
                Ok(view)
            }
            Found::Store(item) => {
                if !visible_to.matches_head(&item.head) {
                    return Err(RunsError::NotFound);
                }
                if include_events {
                    return self.stored_run(id, true, visible_to).await;
                }
                Ok(RunView::from_head(&item.head))
            }
        }
    }

    /// The store's view of a run (the full record when `include_events`).
    async fn stored_run(&self, id: &str, include_events: bool, visible_to: &VisibilityFilter) -> RunsResult<RunView> {
        let unavailable = |e: storage::Error| {
            tracing::warn!(run_id = id, error = %e, "history store read failed");
            RunsError::Unavailable(e.to_string())
        };
        let view = if include_events {
            let record = self.source.get(id.to_owned()).await.map_err(unavailable)?.ok_or(RunsError::NotFound)?;
            let mut view = RunView::from_head(&record.head);
            view.events = Some(record.events);
            view
        } else {
            let item = self.source.get_summary(id.to_owned()).await.map_err(unavailable)?.ok_or(RunsError::NotFound)?;
            RunView::from_head(&item.head)
        };
        if view.visible_to(visible_to) {
            Ok(view)
        } else {
            Err(RunsError::NotFound)
        }
    }

    /// `get_run_events` (SPEC §7): events strictly after `after_seq`, at most `limit` (≤ 500) and 256 KiB of
    /// JSON, always at least one when any follows; `nextAfterSeq` while more follow. Live and persisted
    /// reads address the same events by the same seqs.
    pub async fn get_run_events(
        &self,
        id: &str,
        after_seq: u64,
        limit: Option<usize>,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<EventPage> {
        let limit = limit.unwrap_or(EVENTS_PAGE_MAX).clamp(1, EVENTS_PAGE_MAX);
        match self.find(id).await? {
            Found::Registry(row) => {
                if !RunView::from_registry(&row).visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                let events = self.registry.snapshot(id).map(|(_, e)| e).unwrap_or_default();
                let after = events.into_iter().filter(|e| event_seq(e).is_some_and(|s| s > after_seq));
                Ok(page_of(after, limit, None))
            }
            Found::Ledger(row, seq) => {
                if !RunView::from_live(&row, seq).visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                let read = self.source.live_events(id.to_owned(), after_seq, limit + 1).await;
                match read.map_err(|e| RunsError::Unavailable(e.to_string()))? {
                    Some(events) => Ok(page_of(events.into_iter(), limit, None)),
                    // Finished between the listing and this read: the record holds the same seqs.
                    None => self.stored_events(id, after_seq, limit, visible_to).await,
                }
            }
            Found::Store(item) => {
                if !visible_to.matches_head(&item.head) {
                    return Err(RunsError::NotFound);
                }
                self.stored_events(id, after_seq, limit, visible_to).await
            }
        }
    }

    async fn stored_events(&self, id: &str, after_seq: u64, limit: usize, visible_to: &VisibilityFilter) -> RunsResult<EventPage> {
        // Visibility first (a summary read), then the page.
        self.stored_run(id, false, visible_to).await?;
        let page = self
            .source
            .events(id.to_owned(), after_seq, Some(limit))
            .await
            .map_err(|e| RunsError::Unavailable(e.to_string()))?
            .ok_or(RunsError::NotFound)?;
        Ok(page_of(page.events.into_iter(), limit, page.next_after_seq))
    }

    /// `get_run_friction` (SPEC §7): the diagnosis — analyzed from the events of a live run, the stored one
    /// of a persisted run. See the module docs for the method.
    pub async fn get_run_friction(&self, id: &str, visible_to: &VisibilityFilter) -> RunsResult<Friction> {
        match self.find(id).await? {
            Found::Registry(row) => {
                if !RunView::from_registry(&row).visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                let (row, events) = self.registry.snapshot(id).ok_or(RunsError::NotFound)?;
                Ok(Friction {
                    id: id.to_owned(),
                    finished: row.finished_at.is_some(),
                    truncated: row.truncated,
                    source: FrictionSource::Live,
                    diagnosis: analyze(&events),
                })
            }
            Found::Ledger(row, seq) => {
                if !RunView::from_live(&row, seq).visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                match self.all_live_events(id).await? {
                    Some(events) => Ok(Friction {
                        id: id.to_owned(),
                        finished: false,
                        truncated: events.len() >= LEDGER_EVENTS_MAX,
                        source: FrictionSource::Ledger,
                        diagnosis: analyze(&events),
                    }),
                    None => self.stored_friction(id, visible_to).await,
                }
            }
            Found::Store(item) => {
                if !visible_to.matches_head(&item.head) {
                    return Err(RunsError::NotFound);
                }
                Ok(Friction {
                    id: id.to_owned(),
                    finished: true,
                    truncated: item.head.truncated,
                    source: FrictionSource::Stored,
                    diagnosis: item.head.diagnosis.clone().normalized(),
                })
            }
        }
    }

    async fn stored_friction(&self, id: &str, visible_to: &VisibilityFilter) -> RunsResult<Friction> {
        let item = self
            .source
            .get_summary(id.to_owned())
            .await
            .map_err(|e| RunsError::Unavailable(e.to_string()))?
            .filter(|i| visible_to.matches_head(&i.head))
            .ok_or(RunsError::NotFound)?;
        Ok(Friction {
            id: id.to_owned(),
            finished: true,
            truncated: item.head.truncated,
            source: FrictionSource::Stored,
            diagnosis: item.head.diagnosis.normalized(),
        })
    }

    /// `stop_run` (SPEC §7, §5.6): a live run (here or under another generation) → `stopping` through the
    /// supervisor, which commits the stop to the ledger before signalling and publishes `stop_requested`
    /// with `actor`; a finished run → conflict; unknown or invisible → not found. Runs outside the registry
    /// are looked up uncached (`get_live`, then `get_summary` — never `get`).
    pub async fn stop_run(
        &self,
        stopper: &dyn RunStopper,
        id: &str,
        mode: StopMode,
        actor: StopActor,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<StopAccepted> {
        if !is_valid_run_id(id) {
            return Err(RunsError::NotFound);
        }
        let finished = || RunsError::Conflict(format!("run {id} has finished"));
        if let Some(row) = self.registry.row(id) {
            if !RunView::from_registry(&row).visible_to(visible_to) || self.registry_row_killed(id).await {
                return Err(RunsError::NotFound);
            }
            if row.finished_at.is_some() {
                return Err(finished());
            }
        } else {
            match self.source.get_live(id.to_owned()).await {
                Ok(Some(row)) => {
                    if !RunView::from_live(&row, 0).visible_to(visible_to) {
                        return Err(RunsError::NotFound);
                    }
                }
                Ok(None) => {
                    return match self.source.get_summary(id.to_owned()).await {
                        Ok(Some(item)) if visible_to.matches_head(&item.head) => Err(finished()),
                        Ok(_) => Err(RunsError::NotFound),
                        Err(e) => Err(RunsError::Unavailable(e.to_string())),
                    };
                }
                Err(e) => return Err(RunsError::Unavailable(e.to_string())),
            }
        }
        match stopper.stop(StopRun { run_id: id.to_owned(), mode, actor }).await {
            Ok(()) => Ok(StopAccepted { id: id.to_owned(), mode, state: "stopping".into() }),
            Err(StopError::NotFound) => Err(RunsError::NotFound),
            Err(StopError::Finished) => Err(finished()),
            Err(StopError::Unavailable(e)) => Err(RunsError::Unavailable(e)),
        }
    }

    /// `GET /api/live`: ledger rows of every generation the caller may see (uncached).
    pub async fn live_rows(&self, visible_to: &VisibilityFilter) -> RunsResult<Vec<LiveRowView>> {
        if *visible_to == VisibilityFilter::None {
            return Ok(Vec::new());
        }
        let rows = self.source.list_live().await.map_err(|e| RunsError::Unavailable(e.to_string()))?;
        let mut out: Vec<LiveRowView> = rows
            .into_iter()
            .filter(|r| RunView::from_live(r, 0).visible_to(visible_to))
            .map(|r| {
                let mut meta = r.meta;
                if let Value::Object(m) = &mut meta {
                    m.remove("request");
                }
                LiveRowView {
                    run_id: r.run_id,
                    thread_key: r.thread_key,
                    owner_gen: r.owner_gen,
                    lease_until: r.lease_until,
                    started_at: r.started_at,
                    phase: r.phase.as_str().to_owned(),
                    stop: r.stop,
                    meta,
                }
            })
            .collect();
        out.sort_by(|a, b| (b.started_at, &b.run_id).cmp(&(a.started_at, &a.run_id)));
        Ok(out)
    }

    /// The index feed's rows: every registry row (finished ones until evicted) and ledger rows live under
    /// other generations, visible to the caller, newest start first. The flag says whether the ledger
    /// answered (a failed listing is no proof that its rows went away).
    pub async fn index_rows(&self, visible_to: &VisibilityFilter) -> (Vec<RunView>, bool) {
        if *visible_to == VisibilityFilter::None {
            return (Vec::new(), true);
        }
        let listing = self.live_listing().await;
        let killed = |id: &str| listing.as_ref().is_ok_and(|l| l.killed.contains(id));
        let mut rows: Vec<RunView> =
            self.registry.rows().iter().filter(|r| !killed(&r.id)).map(RunView::from_registry).collect();
        if let Ok(listing) = &listing {
            for row in listing.rows.iter().filter(|r| self.lists_ledger_row(r) && !killed(&r.run_id)) {
                rows.push(RunView::from_live(row, listing.last_seq.get(&row.run_id).copied().unwrap_or(0)));
            }
        }
        rows.retain(|v| v.visible_to(visible_to));
        rows.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
        (rows, listing.is_ok())
    }

    /// A live run's ledger events after `after_seq` (uncached; for following a run live elsewhere).
    /// `Ok(None)` once its row is gone.
    pub async fn ledger_events(&self, id: &str, after_seq: u64, limit: usize) -> RunsResult<Option<Vec<Value>>> {
        self.source.live_events(id.to_owned(), after_seq, limit).await.map_err(|e| RunsError::Unavailable(e.to_string()))
    }

    /// The stored record's summary, for a stream's `end` and the feed (uncached).
    pub async fn stored_summary(&self, id: &str, visible_to: &VisibilityFilter) -> RunsResult<RunView> {
        self.stored_run(id, false, visible_to).await
    }

    /// A page of a stored run's events after `after_seq` (for replays).
    pub async fn stored_event_page(&self, id: &str, after_seq: u64, limit: usize) -> RunsResult<EventPage> {
        let page = self
            .source
            .events(id.to_owned(), after_seq, Some(limit))
            .await
            .map_err(|e| RunsError::Unavailable(e.to_string()))?
            .ok_or(RunsError::NotFound)?;
        Ok(EventPage { events: page.events, next_after_seq: page.next_after_seq })
    }
}

/// Cut a page from `events` (already strictly after the cursor): at most `limit` events and
/// [`EVENTS_PAGE_MAX_BYTES`] of JSON, never empty while any event follows. `source_next` is the source's
/// own "more follow" cursor when it paged already.
fn page_of(events: impl Iterator<Item = Value>, limit: usize, source_next: Option<u64>) -> EventPage {
    let mut out: Vec<Value> = Vec::new();
    let mut bytes = 0usize;
    let mut cut = false;
    for e in events {
        let n = e.to_string().len();
        if !out.is_empty() && (out.len() >= limit || bytes + n > EVENTS_PAGE_MAX_BYTES) {
            cut = true;
            break;
        }
        bytes += n;
        out.push(e);
    }
    let next_after_seq = if cut { out.last().and_then(event_seq) } else { source_next };
    EventPage { events: out, next_after_seq }
}

/// The friction diagnosis of a run from its stamped events (method in the module docs).
pub fn analyze(events: &[Value]) -> Diagnosis {
    let mut diagnosis = Diagnosis::default();
    let mut calls: HashMap<String, i64> = HashMap::new();
    let mut model_from: Option<i64> = None;
    let mut tool = CategoryStat::default();
    let mut model = CategoryStat::default();
    for e in events {
        let Some(at) = e.get("at").and_then(Value::as_i64) else { continue };
        let kind = e.get("type").and_then(Value::as_str).unwrap_or_default();
        let call_id = e.get("callId").and_then(Value::as_str);
        match kind {
            "tool_call" => {
                if let Some(c) = call_id {
                    calls.insert(c.to_owned(), at);
                }
            }
            "tool_result" => {
                if let Some(started) = call_id.and_then(|c| calls.remove(c)) {
                    tool.count += 1;
                    tool.duration_ms += (at - started).max(0) as u64;
                }
                model_from = Some(at);
            }
            "assistant" | "answer" => {
                model.count += 1;
                if let Some(from) = model_from {
                    model.duration_ms += (at - from).max(0) as u64;
                }
                model_from = Some(at);
            }
            "run_meta" | "input" | "context" | "resumed" => model_from = Some(at),
            _ => {}
        }
    }
    diagnosis.by_category.insert("tool".into(), tool);
    diagnosis.by_category.insert("model".into(), model);
    diagnosis
}

#[cfg(test)]
mod tests {
    //! Every merge rule against a [`Double`]: a real `MemoryStore` (store + ledger) behind the
    //! [`RunSource`] seam, with call counters and switches that make the store or the ledger fail.

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use serde_json::json;
    use storage::ledger::{Admit, Promotion, RunLedger};
    use storage::record::validate_record;
    use storage::store::RunStore;
    use storage::{ManualClock, MemoryStore};

    use super::*;
    use crate::registry::RunMeta;

    const NOW: i64 = 1_800_000_000_000;
    const OTHER_GEN: &str = "20270115T080000Z-0000beef";

    #[derive(Clone)]
    struct Double {
        mem: MemoryStore,
        clock: ManualClock,
        fail_store: Arc<AtomicBool>,
        fail_ledger: Arc<AtomicBool>,
        list_calls: Arc<AtomicUsize>,
        list_limits: Arc<Mutex<Vec<usize>>>,
        get_calls: Arc<AtomicUsize>,
        summary_calls: Arc<AtomicUsize>,
        live_list_calls: Arc<AtomicUsize>,
        /// Fails only `killed_among` (the rest of the ledger answers).
        fail_kills: Arc<AtomicBool>,
        /// Every `killed_among` question, in order.
        kill_questions: Arc<Mutex<Vec<Vec<String>>>>,
    }

    impl Double {
        fn new(clock: &ManualClock) -> Self {
            Double {
                mem: MemoryStore::new(),
                clock: clock.clone(),
                fail_store: Arc::default(),
                fail_ledger: Arc::default(),
                list_calls: Arc::default(),
                list_limits: Arc::default(),
                get_calls: Arc::default(),
                summary_calls: Arc::default(),
                live_list_calls: Arc::default(),
                fail_kills: Arc::default(),
                kill_questions: Arc::default(),
            }
        }

        fn kill_reads(&self) -> usize {
            self.kill_questions.lock().unwrap().len()
        }

        fn store<T: Send + 'static>(&self, f: impl FnOnce(&mut MemoryStore, i64) -> storage::Result<T>) -> SourceFuture<'_, T> {
            let out = if self.fail_store.load(Ordering::SeqCst) {
                Err(storage::Error::Unavailable("injected store failure".into()))
            } else {
                f(&mut self.mem.clone(), self.clock.now_ms())
            };
            Box::pin(std::future::ready(out))
        }

        fn ledger<T: Send + 'static>(&self, f: impl FnOnce(&mut MemoryStore) -> storage::Result<T>) -> SourceFuture<'_, T> {
            let out = if self.fail_ledger.load(Ordering::SeqCst) {
                Err(storage::Error::Unavailable("injected ledger failure".into()))
            } else {
                f(&mut self.mem.clone())
            };
            Box::pin(std::future::ready(out))
        }
    }

    impl RunSource for Double {
        fn list(&self, query: ListQuery) -> SourceFuture<'_, ListPage> {
            self.list_calls.fetch_add(1, Ordering::SeqCst);
            self.list_limits.lock().unwrap().push(query.limit.unwrap_or(0));
            self.store(move |m, now| m.list(&query, now))
        }
        fn get(&self, id: String) -> SourceFuture<'_, Option<RunRecord>> {
            self.get_calls.fetch_add(1, Ordering::SeqCst);
            self.store(move |m, now| RunStore::get(m, &id, now))
        }
        fn get_summary(&self, id: String) -> SourceFuture<'_, Option<RunListItem>> {
            self.summary_calls.fetch_add(1, Ordering::SeqCst);
            self.store(move |m, now| m.get_summary(&id, now))
        }
        fn events(&self, id: String, after_seq: u64, limit: Option<usize>) -> SourceFuture<'_, Option<EventsPage>> {
            self.store(move |m, now| RunStore::events(m, &id, after_seq, limit, now))
        }
        fn list_live(&self) -> SourceFuture<'_, Vec<LiveRow>> {
            self.live_list_calls.fetch_add(1, Ordering::SeqCst);
            self.ledger(|m| m.list_live())
        }
        fn get_live(&self, id: String) -> SourceFuture<'_, Option<LiveRow>> {
            self.ledger(move |m| m.get_live(&id))
        }
        fn live_events(&self, id: String, after_seq: u64, limit: usize) -> SourceFuture<'_, Option<Vec<Value>>> {
            self.ledger(move |m| m.live_events(&id, after_seq, limit))
        }
        fn killed_among(&self, ids: Vec<String>) -> SourceFuture<'_, Vec<String>> {
            let mut asked = ids.clone();
            asked.sort();
            self.kill_questions.lock().unwrap().push(asked);
            if self.fail_kills.load(Ordering::SeqCst) {
                return Box::pin(std::future::ready(Err(storage::Error::Unavailable("injected kill read failure".into()))));
            }
            self.ledger(move |m| m.killed_among(&ids))
        }
    }

    struct Fixture {
        clock: ManualClock,
        double: Double,
        registry: Registry,
        svc: RunsService,
    }

    fn fixture() -> Fixture {
        let clock = ManualClock::new(NOW);
        let double = Double::new(&clock);
        let registry = Registry::new(Arc::new(clock.clone()));
        let gen = Generation::parse("20270115T090000Z-0000cafe").unwrap();
        let svc = RunsService::with_source(registry.clone(), Arc::new(double.clone()), gen, Arc::new(clock.clone()));
        Fixture { clock, double, registry, svc }
    }

    fn meta(channel: &str, thread: &str) -> RunMeta {
        RunMeta {
            agent: "demo".into(),
            model: "scripted".into(),
            label: "a label".into(),
            thread_key: format!("{channel}:{thread}"),
            channel_id: channel.into(),
            user_id: "u1".into(),
            channel_visibility: ChannelVisibility::Public,
            parent_run_id: None,
        }
    }

    fn record(id: &str, channel: &str, started: i64, finished: i64, provisional: bool, events: Vec<Value>) -> RunRecord {
        let mut v = json!({
            "id": id, "agent": "demo", "model": "scripted", "channelId": channel, "userId": "u1",
            "threadKey": format!("{channel}:{id}"), "channelVisibility": "public", "startedAt": started,
            "finishedAt": finished, "status": if provisional { "interrupted" } else { "completed" },
            "eventCount": events.len(), "storedEventCount": events.len(), "truncated": false, "events": events,
            "diagnosis": {"byCategory": {"tool": {"count": 2, "durationMs": 40}}}
        });
        if provisional {
            v["provisional"] = json!(true);
        }
        validate_record(&v).expect("valid test record")
    }

    fn events(n: u64, at: i64) -> Vec<Value> {
        (1..=n).map(|s| json!({"type": "note", "kind": "k", "summary": format!("e{s}"), "seq": s, "at": at})).collect()
    }

    impl Fixture {
        fn put(&self, r: RunRecord) {
            self.double.mem.clone().put(&r, None, NOW).unwrap();
        }

        /// A registry run with `n` events; finished when `finished` is given.
        fn local(&self, id: &str, channel: &str, started: i64, finished: Option<i64>) {
            self.registry.create(id, meta(channel, id), started, format!("secret-token-{id}"), vec![], 1);
            self.registry.publish(id, json!({"type": "run_meta"}));
            self.registry.publish(id, json!({"type": "input", "text": "hi", "source": "request"}));
            if let Some(f) = finished {
                self.registry.finish(id, RunStatus::Completed, f);
            }
        }

        /// A run live under `gen` in the ledger (promoted unless `attaching`), with `n` events.
        fn ledger_row(&self, id: &str, channel: &str, gen: &str, started: i64, attaching: bool, n: u64) {
            let mut m = self.double.mem.clone();
            let admit = Admit {
                thread_key: format!("{channel}:{id}"),
                gen: gen.into(),
                run_id: id.into(),
                request: json!({"text": "hi"}),
                meta: json!({"agent": "demo", "model": "scripted", "label": "remote", "threadKey": format!("{channel}:{id}"),
                    "channelId": channel, "userId": "u1", "channelVisibility": "public", "request": {"text": "hi"}}),
                key: None,
                lease_ms: 30_000,
            };
            m.admit(&admit, started).unwrap();
            if !attaching {
                let p = Promotion { system_text: "SYSTEM PROMPT".into(), tools: json!([]), state: Default::default(), lease_ms: 30_000 };
                m.claim(id, gen, &p, started).unwrap().unwrap();
                if n > 0 {
                    m.append(id, gen, &events(n, started)).unwrap().unwrap();
                }
            }
        }

        async fn list(&self, status: StatusFilter) -> RunList {
            self.svc.list_runs(&ListParams::new(status, VisibilityFilter::All)).await
        }

        /// Another process kills `id`: its deletion fence lands in the shared ledger (and `stop = hard` on a
        /// live row); nothing reaches this process's registry.
        fn kill_elsewhere(&self, id: &str) {
            self.double.mem.clone().kill(id, NOW).unwrap();
        }
    }

    fn ids(list: &RunList) -> Vec<&str> {
        list.runs.iter().map(|v| v.id.as_str()).collect()
    }

    #[tokio::test]
    async fn an_unfinished_live_row_wins_whole_and_its_tombstone_never_lists() {
        let f = fixture();
        f.local("r1", "c1", NOW - 500, None);
        f.put(record("r1", "c1", NOW - 500, NOW - 500, true, vec![]));
        for status in [StatusFilter::All, StatusFilter::Active, StatusFilter::Finished] {
            let list = f.list(status).await;
            let r1: Vec<&RunView> = list.runs.iter().filter(|v| v.id == "r1").collect();
            if status == StatusFilter::Finished {
                assert!(r1.is_empty(), "{status:?}: the tombstone surfaced: {list:?}");
            } else {
                assert_eq!(r1.len(), 1, "{status:?}");
                assert!(!r1[0].finished && r1[0].provisional.is_none() && r1[0].status.is_none());
            }
        }
        // A point read serves the live row too.
        let v = f.svc.get_run("r1", false, &VisibilityFilter::All).await.unwrap();
        assert!(!v.finished && v.provisional.is_none());
    }

    #[tokio::test]
    async fn a_finished_registry_row_merges_with_its_record_whose_finish_fields_win() {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.registry.set_stop("r1", StopMode::Soft);
        // Before the record lands: not persisted, and the tombstone lends nothing.
        f.put(record("r1", "c1", NOW - 900, NOW - 900, true, vec![]));
        let list = f.list(StatusFilter::Finished).await;
        assert_eq!(ids(&list), ["r1"]);
        let v = &list.runs[0];
        assert_eq!((v.finished_at, v.persisted, v.provisional, v.status), (Some(NOW - 100), None, None, Some(RunStatus::Completed)));
        // The final record lands with its own finish fields: they win; the live stop and counts stay.
        let mut final_record = record("r1", "c1", NOW - 900, NOW - 90, false, events(2, NOW - 95));
        final_record.head.status = RunStatus::StoppedSoft;
        f.put(final_record);
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["r1"]);
        let v = &list.runs[0];
        assert_eq!((v.finished_at, v.status, v.persisted), (Some(NOW - 90), Some(RunStatus::StoppedSoft), Some(true)));
        assert_eq!((v.stop, v.event_count, v.agent.as_deref()), (Some(StopMode::Soft), 2, Some("demo")));
        let got = f.svc.get_run("r1", false, &VisibilityFilter::All).await.unwrap();
        assert_eq!((got.finished_at, got.persisted), (Some(NOW - 90), Some(true)));
        // After eviction the store serves the same run with the same event count.
        f.clock.advance(crate::registry::FINISHED_TTL_MS);
        f.registry.evict_expired();
        let cold = f.svc.get_run("r1", false, &VisibilityFilter::All).await.unwrap();
        assert_eq!((cold.event_count, cold.persisted, cold.finished), (got.event_count, Some(true), true));
    }

    #[tokio::test]
    async fn a_point_read_of_a_finished_registry_row_survives_a_failing_store() {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.double.fail_store.store(true, Ordering::SeqCst);
        let v = f.svc.get_run("r1", true, &VisibilityFilter::All).await.unwrap();
        assert_eq!((v.finished, v.persisted, v.events.as_ref().map(Vec::len)), (true, None, Some(2)));
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 0, "the full store read is never used for a registry row");
    }

    #[tokio::test]
    async fn a_foreign_ledger_row_lists_as_live_with_its_owner_and_suppresses_its_tombstone() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 4);
        f.put(record("remote", "c1", NOW - 300, NOW - 300, true, vec![]));
        for status in [StatusFilter::All, StatusFilter::Active] {
            let list = f.list(status).await;
            assert_eq!(ids(&list), ["remote"], "{status:?}");
            let v = &list.runs[0];
            assert_eq!((v.owner_gen.as_deref(), v.finished, v.event_count), (Some(OTHER_GEN), false, 4));
            assert_eq!(v.label.as_deref(), Some("remote"));
        }
        assert!(f.list(StatusFilter::Finished).await.runs.is_empty(), "never finished, never the tombstone");
        // Point reads answer for it after the registry and before the store.
        let v = f.svc.get_run("remote", true, &VisibilityFilter::All).await.unwrap();
        assert_eq!((v.owner_gen.as_deref(), v.events.as_ref().map(Vec::len)), (Some(OTHER_GEN), Some(4)));
        let page = f.svc.get_run_events("remote", 2, None, &VisibilityFilter::All).await.unwrap();
        assert_eq!(page.events.iter().filter_map(event_seq).collect::<Vec<_>>(), [3, 4]);
        let fr = f.svc.get_run_friction("remote", &VisibilityFilter::All).await.unwrap();
        assert_eq!((fr.source, fr.finished), (FrictionSource::Ledger, false));
        // Serialized, no view carries the prompt, tools or state of the row.
        let all = serde_json::to_string(&(f.list(StatusFilter::All).await, v)).unwrap();
        assert!(!all.contains("SYSTEM PROMPT"));
    }

    #[tokio::test]
    async fn a_run_in_the_registry_and_the_ledger_lists_once_as_the_registry_row() {
        let f = fixture();
        f.local("r1", "c1", NOW - 300, None);
        f.ledger_row("r1", "c1", f.svc.gen.as_str(), NOW - 300, false, 2);
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["r1"]);
        assert_eq!(list.runs[0].owner_gen, None);
    }

    #[tokio::test]
    async fn this_generations_attaching_rows_not_yet_in_the_registry_are_skipped() {
        let f = fixture();
        let gen = f.svc.gen.as_str().to_owned();
        f.ledger_row("mine", "c1", &gen, NOW, true, 0);
        f.ledger_row("theirs", "c1", OTHER_GEN, NOW - 1, true, 0);
        f.put(record("mine", "c1", NOW, NOW, true, vec![]));
        let list = f.list(StatusFilter::All).await;
        // Ours is skipped (and still suppresses its tombstone); another generation's reservation lists.
        assert_eq!(ids(&list), ["theirs"]);
    }

    #[tokio::test]
    async fn active_is_live_rows_only_and_never_calls_the_store() {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        f.local("done", "c1", NOW - 20, Some(NOW - 5));
        f.put(record("old", "c1", NOW - 100, NOW - 50, false, vec![]));
        let list = f.list(StatusFilter::Active).await;
        assert_eq!(ids(&list), ["live"]);
        assert_eq!(list.next_before, None);
        assert_eq!(f.double.list_calls.load(Ordering::SeqCst), 0);
        // A failing store does not touch active listings.
        f.double.fail_store.store(true, Ordering::SeqCst);
        assert!(!f.list(StatusFilter::Active).await.store_unavailable);
        // `finished` = finished registry rows ∪ store; `all` = both.
        f.double.fail_store.store(false, Ordering::SeqCst);
        assert_eq!(ids(&f.list(StatusFilter::Finished).await), ["done", "old"]);
        assert_eq!(ids(&f.list(StatusFilter::All).await), ["live", "done", "old"]);
    }

    #[tokio::test]
    async fn a_store_failure_degrades_to_live_rows_with_store_unavailable() {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        f.local("done", "c1", NOW - 20, Some(NOW - 5));
        f.put(record("old", "c1", NOW - 100, NOW - 50, false, vec![]));
        f.double.fail_store.store(true, Ordering::SeqCst);
        let all = f.list(StatusFilter::All).await;
        assert_eq!((ids(&all), all.store_unavailable), (vec!["live", "done"], true));
        let fin = f.list(StatusFilter::Finished).await;
        assert_eq!((ids(&fin), fin.store_unavailable), (vec!["done"], true));
        // A point read of a stored run is unavailable, not "not found".
        assert!(matches!(f.svc.get_run("old", false, &VisibilityFilter::All).await, Err(RunsError::Unavailable(_))));
    }

    #[tokio::test]
    async fn a_ledger_failure_sets_ledger_unavailable_and_is_not_cached() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 1);
        f.put(record("old", "c1", NOW - 100, NOW - 50, false, vec![]));
        f.double.fail_ledger.store(true, Ordering::SeqCst);
        for status in [StatusFilter::All, StatusFilter::Active, StatusFilter::Finished] {
            let list = f.list(status).await;
            assert!(list.ledger_unavailable, "{status:?}");
        }
        let cursor_page = ListParams { before: Some(Cursor { finished_at: NOW, id: None }), ..ListParams::new(StatusFilter::All, VisibilityFilter::All) };
        let page = f.svc.list_runs(&cursor_page).await;
        assert!(page.ledger_unavailable && ids(&page) == ["old"]);
        // The next successful listing clears the marker at once (the failure was not cached).
        f.double.fail_ledger.store(false, Ordering::SeqCst);
        let list = f.list(StatusFilter::All).await;
        assert!(!list.ledger_unavailable);
        assert_eq!(ids(&list), ["remote", "old"]);
    }

    #[tokio::test]
    async fn one_ledger_listing_serves_reads_for_two_seconds() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 3);
        f.list(StatusFilter::All).await;
        f.svc.get_run("remote", false, &VisibilityFilter::All).await.unwrap();
        f.svc.get_run_events("remote", 0, None, &VisibilityFilter::All).await.unwrap();
        f.svc.get_run_friction("remote", &VisibilityFilter::All).await.unwrap();
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        f.clock.advance(LEDGER_LIST_TTL_MS - 1);
        f.list(StatusFilter::Active).await;
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        f.clock.advance(1);
        f.list(StatusFilter::Active).await;
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn unfinished_rows_sort_first_then_finished_newest_and_the_limit_applies_after_the_merge() {
        let f = fixture();
        f.local("l-old", "c1", NOW - 5000, None);
        f.local("l-new", "c1", NOW - 10, None);
        f.ledger_row("l-mid", "c1", OTHER_GEN, NOW - 100, false, 0);
        f.local("f-reg", "c1", NOW - 3000, Some(NOW - 40));
        f.put(record("s-a", "c1", NOW - 9000, NOW - 50, false, vec![]));
        f.put(record("s-b", "c1", NOW - 9000, NOW - 50, false, vec![]));
        f.put(record("s-c", "c1", NOW - 100, NOW - 60, false, vec![]));
        let list = f.list(StatusFilter::All).await;
        assert_eq!(ids(&list), ["l-new", "l-mid", "l-old", "f-reg", "s-b", "s-a", "s-c"]);
        let limited = f.svc.list_runs(&ListParams { limit: Some(4), ..ListParams::new(StatusFilter::All, VisibilityFilter::All) }).await;
        assert_eq!(ids(&limited), ["l-new", "l-mid", "l-old", "f-reg"]);
        assert_eq!(limited.next_before, Some(NextBefore { finished_at: NOW - 40, id: Some("f-reg".into()) }));
    }

    #[tokio::test]
    async fn the_store_is_asked_for_limit_plus_the_live_count_capped_at_200() {
        let f = fixture();
        f.local("a", "c1", NOW - 10, None);
        f.local("b", "c1", NOW - 20, None);
        f.svc.list_runs(&ListParams { limit: Some(10), ..ListParams::new(StatusFilter::All, VisibilityFilter::All) }).await;
        f.svc.list_runs(&ListParams { limit: Some(500), ..ListParams::new(StatusFilter::Finished, VisibilityFilter::All) }).await;
        assert_eq!(*f.double.list_limits.lock().unwrap(), [12, 200]);
    }

    #[tokio::test]
    async fn cursor_pages_walk_the_store_without_skipping_same_millisecond_siblings_or_listing_live_rows() {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        // Seven runs, four of them finishing in the same millisecond.
        for (id, fin) in [("a", 10), ("b", 20), ("c", 20), ("d", 20), ("e", 20), ("f", 30), ("g", 40)] {
            f.put(record(id, "c1", NOW - 1000, NOW - 1000 + fin, false, vec![]));
        }
        let mut seen = Vec::new();
        let mut params = ListParams { limit: Some(3), ..ListParams::new(StatusFilter::All, VisibilityFilter::All) };
        for _ in 0..10 {
            let page = f.svc.list_runs(&params).await;
            seen.extend(page.runs.iter().map(|v| v.id.clone()));
            match page.next_before {
                Some(nb) => params.before = Some(nb.to_cursor()),
                None => break,
            }
        }
        assert_eq!(seen, ["live", "g", "f", "e", "d", "c", "b", "a"]);
    }

    #[tokio::test]
    async fn next_before_stays_present_when_tombstone_suppression_shortens_a_full_store_page() {
        let f = fixture();
        // Three stored rows; the two newest are tombstones of runs live elsewhere.
        f.put(record("t1", "c1", NOW - 10, NOW - 10, true, vec![]));
        f.put(record("t2", "c1", NOW - 20, NOW - 20, true, vec![]));
        f.put(record("old", "c1", NOW - 500, NOW - 400, false, vec![]));
        f.ledger_row("t1", "c1", OTHER_GEN, NOW - 10, false, 0);
        f.ledger_row("t2", "c1", OTHER_GEN, NOW - 20, false, 0);
        let list = f.svc.list_runs(&ListParams { limit: Some(1), ..ListParams::new(StatusFilter::Finished, VisibilityFilter::All) }).await;
        // Asked for 1 + 2 live = 3 rows: all three came, two were suppressed.
        assert_eq!(ids(&list), ["old"]);
        assert_eq!(list.next_before, Some(NextBefore { finished_at: NOW - 400, id: Some("old".into()) }));
        let f2 = fixture();
        for i in 0..3 {
            f2.put(record(&format!("t{i}"), "c1", NOW - 10 - i, NOW - 10 - i, true, vec![]));
            f2.ledger_row(&format!("t{i}"), "c1", OTHER_GEN, NOW - 10 - i, false, 0);
        }
        f2.put(record("old", "c1", NOW - 500, NOW - 400, false, vec![]));
        // Limit 1 + 3 live → 4 rows; 4 exist → the page is full, three suppressed: still a cursor.
        let list = f2.svc.list_runs(&ListParams { limit: Some(1), ..ListParams::new(StatusFilter::Finished, VisibilityFilter::All) }).await;
        assert_eq!(ids(&list), ["old"]);
        assert!(list.next_before.is_some());
    }

    #[tokio::test]
    async fn filters_narrow_live_rows_by_their_meta_and_since_compares_finished_or_started() {
        let f = fixture();
        f.local("t-live", "c1", NOW - 10, None);
        f.local("other", "c2", NOW - 20, None);
        f.local("fin", "c1", NOW - 5000, Some(NOW - 100));
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.thread_key = Some("c1:t-live".into());
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["t-live"]);
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.channel = Some("c2".into());
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["other"]);
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.agent = Some("nope".into());
        assert!(f.svc.list_runs(&p).await.runs.is_empty());
        // sinceMs: the finished run counts from its finish (NOW-100), not its start.
        let mut p = ListParams::new(StatusFilter::All, VisibilityFilter::All);
        p.since_ms = Some(NOW - 150);
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["t-live", "other", "fin"]);
        p.since_ms = Some(NOW - 15);
        assert_eq!(ids(&f.svc.list_runs(&p).await), ["t-live"]);
    }

    #[tokio::test]
    async fn visibility_filters_every_source_and_none_touches_nothing() {
        let f = fixture();
        f.local("l1", "c1", NOW - 10, None);
        f.local("l2", "c2", NOW - 10, None);
        f.ledger_row("x2", "c2", OTHER_GEN, NOW - 20, false, 1);
        f.put(record("s1", "c1", NOW - 100, NOW - 50, false, events(1, NOW - 50)));
        f.put(record("s2", "c2", NOW - 100, NOW - 50, false, events(1, NOW - 50)));
        let c1 = VisibilityFilter::ChannelsIn { ids: vec!["c1".into()] };
        let list = f.svc.list_runs(&ListParams::new(StatusFilter::All, c1.clone())).await;
        assert_eq!(ids(&list), ["l1", "s1"]);
        for id in ["l2", "x2", "s2"] {
            assert_eq!(f.svc.get_run(id, true, &c1).await, Err(RunsError::NotFound), "{id}");
            assert_eq!(f.svc.get_run_events(id, 0, None, &c1).await, Err(RunsError::NotFound), "{id}");
            assert_eq!(f.svc.get_run_friction(id, &c1).await, Err(RunsError::NotFound), "{id}");
            let stop = f.svc.stop_run(&NoStop, id, StopMode::Hard, StopActor::new("t", "x"), &c1).await;
            assert_eq!(stop, Err(RunsError::NotFound), "{id}");
        }
        assert_eq!(f.svc.live_rows(&c1).await.unwrap().len(), 0);
        assert_eq!(f.svc.index_rows(&c1).await.0.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["l1"]);
        // `none` touches neither the ledger nor the store.
        let (lists, lives) = (f.double.list_calls.load(Ordering::SeqCst), f.double.live_list_calls.load(Ordering::SeqCst));
        f.clock.advance(LEDGER_LIST_TTL_MS);
        assert!(f.svc.list_runs(&ListParams::new(StatusFilter::All, VisibilityFilter::None)).await.runs.is_empty());
        assert_eq!(f.double.list_calls.load(Ordering::SeqCst), lists);
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), lives);
    }

    #[tokio::test]
    async fn point_reads_use_the_summary_and_only_include_events_reads_the_full_record() {
        let f = fixture();
        f.put(record("s1", "c1", NOW - 100, NOW - 50, false, events(3, NOW - 60)));
        let v = f.svc.get_run("s1", false, &VisibilityFilter::All).await.unwrap();
        assert_eq!((v.finished, v.persisted, v.events.is_none()), (true, Some(true), true));
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 0);
        let v = f.svc.get_run("s1", true, &VisibilityFilter::All).await.unwrap();
        assert_eq!(v.events.map(|e| e.len()), Some(3));
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 1);
        f.svc.get_run_friction("s1", &VisibilityFilter::All).await.unwrap();
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 1);
        // Unknown, malformed and expired ids are not found.
        assert_eq!(f.svc.get_run("nope", false, &VisibilityFilter::All).await, Err(RunsError::NotFound));
        assert_eq!(f.svc.get_run("../etc", false, &VisibilityFilter::All).await, Err(RunsError::NotFound));
        f.put(record("ancient", "c1", NOW - 40 * 86_400_000, NOW - 31 * 86_400_000, false, vec![]));
        assert_eq!(f.svc.get_run("ancient", false, &VisibilityFilter::All).await, Err(RunsError::NotFound));
        // A stored tombstone's flag rides the view; a final record's view has no key.
        f.put(record("tomb", "c1", NOW - 10, NOW - 10, true, vec![]));
        let t = f.svc.get_run("tomb", false, &VisibilityFilter::All).await.unwrap();
        assert_eq!((t.provisional, t.status_label().as_str()), (Some(true), "unfinished — no finish recorded"));
        let json = serde_json::to_value(f.svc.get_run("s1", false, &VisibilityFilter::All).await.unwrap()).unwrap();
        assert!(json.get("provisional").is_none());
    }

    #[tokio::test]
    async fn no_view_carries_a_capability_token() {
        let f = fixture();
        f.local("r1", "c1", NOW - 10, None);
        f.local("r2", "c1", NOW - 20, Some(NOW - 1));
        let list = serde_json::to_string(&f.list(StatusFilter::All).await).unwrap();
        let one = serde_json::to_string(&f.svc.get_run("r1", true, &VisibilityFilter::All).await.unwrap()).unwrap();
        let feed = serde_json::to_string(&f.svc.index_rows(&VisibilityFilter::All).await.0).unwrap();
        for s in [list, one, feed] {
            assert!(!s.contains("secret-token") && !s.contains("\"token\""), "{s}");
        }
        let v = serde_json::to_value(f.svc.get_run("r1", false, &VisibilityFilter::All).await.unwrap()).unwrap();
        assert_eq!((v["finished"].as_bool(), v.get("events")), (Some(false), None));
    }

    #[tokio::test]
    async fn event_pages_are_strictly_after_the_cursor_bounded_and_the_same_live_and_persisted() {
        let f = fixture();
        // Live: the registry run's seqs.
        f.local("r1", "c1", NOW - 10, None);
        for i in 0..3 {
            f.registry.publish("r1", json!({"type": "note", "kind": "k", "summary": format!("n{i}")}));
        }
        let live = f.svc.get_run_events("r1", 2, Some(2), &VisibilityFilter::All).await.unwrap();
        assert_eq!(live.events.iter().filter_map(event_seq).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(live.next_after_seq, Some(4));
        // Persisted: the same seqs from the record.
        let (_, evs) = f.registry.snapshot("r1").unwrap();
        f.registry.discard("r1");
        f.put(record("r1", "c1", NOW - 10, NOW, false, evs));
        let stored = f.svc.get_run_events("r1", 2, Some(2), &VisibilityFilter::All).await.unwrap();
        assert_eq!(stored, live);
        let rest = f.svc.get_run_events("r1", 4, None, &VisibilityFilter::All).await.unwrap();
        assert_eq!((rest.events.len(), rest.next_after_seq), (1, None));
        assert!(f.svc.get_run_events("r1", 5, None, &VisibilityFilter::All).await.unwrap().events.is_empty());
        // A big run: 500 per page even when asked for more; then the rest.
        f.put(record("big", "c1", NOW - 10, NOW, false, events(1200, NOW)));
        let p = f.svc.get_run_events("big", 0, Some(100_000), &VisibilityFilter::All).await.unwrap();
        assert_eq!((p.events.len(), p.next_after_seq), (500, Some(500)));
        // 256 KiB: four 60 KiB events make two pages of three and one.
        let fat: Vec<Value> = (1..=4).map(|s| json!({"type": "note", "seq": s, "at": NOW, "summary": "x".repeat(60_000)})).collect();
        f.put(record("fat", "c1", NOW - 10, NOW, false, fat));
        let p1 = f.svc.get_run_events("fat", 0, None, &VisibilityFilter::All).await.unwrap();
        assert_eq!((p1.events.len(), p1.next_after_seq), (4, None), "4 × 60 KB < 256 KiB");
        let huge: Vec<Value> = (1..=5).map(|s| json!({"type": "note", "seq": s, "at": NOW, "summary": "x".repeat(63_000)})).collect();
        f.put(record("huge", "c1", NOW - 10, NOW, false, huge));
        let p1 = f.svc.get_run_events("huge", 0, None, &VisibilityFilter::All).await.unwrap();
        assert_eq!((p1.events.len(), p1.next_after_seq), (4, Some(4)));
        let p2 = f.svc.get_run_events("huge", 4, None, &VisibilityFilter::All).await.unwrap();
        assert_eq!((p2.events.len(), p2.next_after_seq), (1, None));
        // A single event over the page budget still comes (a page is never empty while events follow).
        let one = page_of(vec![json!({"seq": 1, "summary": "x".repeat(300_000)})].into_iter(), 500, None);
        assert_eq!(one.events.len(), 1);
        // Zero-event persisted run: ok, empty.
        f.put(record("empty", "c1", NOW - 10, NOW, false, vec![]));
        assert!(f.svc.get_run_events("empty", 0, None, &VisibilityFilter::All).await.unwrap().events.is_empty());
        assert_eq!(f.svc.get_run_events("nope", 0, None, &VisibilityFilter::All).await, Err(RunsError::NotFound));
    }

    #[test]
    fn friction_measures_tool_time_from_call_to_result_and_model_time_before_each_turn() {
        let e = |t: &str, at: i64, extra: Value| {
            let mut v = json!({"type": t, "at": at});
            if let (Value::Object(m), Value::Object(x)) = (&mut v, extra) {
                m.extend(x);
            }
            v
        };
        let events = vec![
            e("run_meta", 1000, json!({})),
            e("input", 1000, json!({})),
            e("note", 1050, json!({})), // does not split the model gap
            e("assistant", 1100, json!({"step": 1})),
            e("tool_call", 1100, json!({"callId": "a"})),
            e("tool_result", 1300, json!({"callId": "a"})),
            e("assistant", 1350, json!({"step": 2})),
            e("tool_call", 1350, json!({"callId": "b"})),
            e("resumed", 9000, json!({})), // a crash: the call never got its result
            e("answer", 9020, json!({})),
        ];
        let d = analyze(&events);
        assert_eq!(d.by_category["tool"], CategoryStat { count: 1, duration_ms: 200 });
        assert_eq!(d.by_category["model"], CategoryStat { count: 3, duration_ms: 100 + 50 + 20 });
        assert_eq!(d.by_category["storage"], CategoryStat::default());
        assert_eq!(d.by_category.len(), 5);
    }

    #[tokio::test]
    async fn friction_is_analyzed_live_and_stored_when_persisted() {
        let f = fixture();
        f.local("r1", "c1", NOW - 10, None);
        let live = f.svc.get_run_friction("r1", &VisibilityFilter::All).await.unwrap();
        assert_eq!((live.source, live.finished), (FrictionSource::Live, false));
        f.put(record("s1", "c1", NOW - 100, NOW - 50, false, vec![]));
        let stored = f.svc.get_run_friction("s1", &VisibilityFilter::All).await.unwrap();
        assert_eq!((stored.source, stored.diagnosis.by_category["tool"].duration_ms), (FrictionSource::Stored, 40));
        assert_eq!(f.svc.get_run_friction("nope", &VisibilityFilter::All).await, Err(RunsError::NotFound));
    }

    /// A stopper that records what it was asked and answers `answer`.
    struct FakeStopper {
        answer: Result<(), StopError>,
        asked: Mutex<Vec<StopRun>>,
    }

    impl RunStopper for FakeStopper {
        fn stop(&self, msg: StopRun) -> Pin<Box<dyn Future<Output = Result<(), StopError>> + '_>> {
            self.asked.lock().unwrap().push(msg);
            Box::pin(std::future::ready(self.answer.clone()))
        }
    }

    /// A stopper that must not be reached.
    struct NoStop;

    impl RunStopper for NoStop {
        fn stop(&self, msg: StopRun) -> Pin<Box<dyn Future<Output = Result<(), StopError>> + '_>> {
            panic!("stop delegated for {}", msg.run_id)
        }
    }

    #[tokio::test]
    async fn stop_delegates_live_runs_and_answers_conflict_or_not_found_otherwise() {
        let f = fixture();
        f.local("live", "c1", NOW - 10, None);
        f.local("done", "c1", NOW - 20, Some(NOW - 1));
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 30, false, 0);
        f.put(record("stored", "c1", NOW - 100, NOW - 50, false, vec![]));
        let ok = FakeStopper { answer: Ok(()), asked: Mutex::default() };
        let all = VisibilityFilter::All;
        let a = f.svc.stop_run(&ok, "live", StopMode::Hard, StopActor::new("token", "ops@x"), &all).await.unwrap();
        assert_eq!((a.mode, a.state.as_str()), (StopMode::Hard, "stopping"));
        f.svc.stop_run(&ok, "remote", StopMode::Soft, StopActor::new("token", "ops"), &all).await.unwrap();
        let asked: Vec<(String, StopMode, String)> =
            ok.asked.lock().unwrap().iter().map(|m| (m.run_id.clone(), m.mode, m.actor.id.clone())).collect();
        assert_eq!(asked, [("live".into(), StopMode::Hard, "ops@x".into()), ("remote".into(), StopMode::Soft, "ops".into())]);
        assert!(matches!(f.svc.stop_run(&NoStop, "done", StopMode::Soft, StopActor::new("t", "x"), &all).await, Err(RunsError::Conflict(_))));
        assert!(matches!(f.svc.stop_run(&NoStop, "stored", StopMode::Soft, StopActor::new("t", "x"), &all).await, Err(RunsError::Conflict(_))));
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 0, "409-vs-404 comes from the summary");
        assert_eq!(f.svc.stop_run(&NoStop, "nope", StopMode::Soft, StopActor::new("t", "x"), &all).await, Err(RunsError::NotFound));
        // The supervisor's answers map one to one.
        for (answer, expected) in [
            (StopError::NotFound, RunsError::NotFound),
            (StopError::Finished, RunsError::Conflict("run live has finished".into())),
            (StopError::Unavailable("disk".into()), RunsError::Unavailable("disk".into())),
        ] {
            let s = FakeStopper { answer: Err(answer), asked: Mutex::default() };
            assert_eq!(f.svc.stop_run(&s, "live", StopMode::Soft, StopActor::new("t", "x"), &all).await, Err(expected));
        }
        // Storage failing on a run outside the registry: unavailable, nothing delegated.
        f.double.fail_ledger.store(true, Ordering::SeqCst);
        assert!(matches!(f.svc.stop_run(&NoStop, "remote", StopMode::Soft, StopActor::new("t", "x"), &all).await, Err(RunsError::Unavailable(_))));
    }

    #[tokio::test]
    async fn live_rows_never_carry_prompt_tools_state_or_request() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 30, false, 0);
        let rows = f.svc.live_rows(&VisibilityFilter::All).await.unwrap();
        assert_eq!(rows.len(), 1);
        let s = serde_json::to_string(&rows).unwrap();
        assert!(!s.contains("SYSTEM PROMPT") && !s.contains("request") && !s.contains("\"state\"") && !s.contains("tools"), "{s}");
        assert_eq!((rows[0].owner_gen.as_str(), rows[0].phase.as_str()), (OTHER_GEN, "live"));
        f.double.fail_ledger.store(true, Ordering::SeqCst);
        assert!(matches!(f.svc.live_rows(&VisibilityFilter::All).await, Err(RunsError::Unavailable(_))));
    }

    // ---- kills from other processes (SPEC §5.6): deletion fences checked before a registry row is served ----

    /// Every read of one run, as (get_run, get_run_events, get_run_friction, stop_run) answers not_found.
    async fn assert_not_served(f: &Fixture, id: &str) {
        let all = VisibilityFilter::All;
        assert_eq!(f.svc.get_run(id, false, &all).await, Err(RunsError::NotFound), "{id}");
        assert_eq!(f.svc.get_run(id, true, &all).await, Err(RunsError::NotFound), "{id}");
        assert_eq!(f.svc.get_run_events(id, 0, None, &all).await, Err(RunsError::NotFound), "{id}");
        assert_eq!(f.svc.get_run_friction(id, &all).await, Err(RunsError::NotFound), "{id}");
        let stop = f.svc.stop_run(&NoStop, id, StopMode::Hard, StopActor::new("t", "x"), &all).await;
        assert_eq!(stop, Err(RunsError::NotFound), "{id}");
    }

    #[tokio::test]
    async fn a_registry_run_killed_in_another_process_vanishes_from_every_read_within_one_listing() {
        let f = fixture();
        f.local("done", "c1", NOW - 900, Some(NOW - 100));
        f.local("live", "c1", NOW - 50, None);
        f.local("kept", "c1", NOW - 800, Some(NOW - 200));
        f.put(record("done", "c1", NOW - 900, NOW - 100, false, events(2, NOW - 100)));
        assert_eq!(ids(&f.list(StatusFilter::All).await), ["live", "done", "kept"]);
        // Another process kills `done` (finished here, its record not purged yet) and `live` (still running
        // here: its owner learns of the fence at its next heartbeat, the registry row is still there).
        f.kill_elsewhere("done");
        f.kill_elsewhere("live");
        // The cached listing answered for both, and stands for its TTL.
        assert_eq!(ids(&f.list(StatusFilter::All).await), ["live", "done", "kept"]);
        assert!(f.svc.get_run("done", false, &VisibilityFilter::All).await.is_ok(), "answered from the fresh listing");
        // One listing later, neither is served from any source: not the registry, not the stored record.
        f.clock.advance(LEDGER_LIST_TTL_MS);
        for status in [StatusFilter::All, StatusFilter::Active, StatusFilter::Finished] {
            let list = f.list(status).await;
            assert!(!list.ledger_unavailable);
            let expected: &[&str] = if status == StatusFilter::Active { &[] } else { &["kept"] };
            assert_eq!(ids(&list), expected, "{status:?}");
        }
        assert_not_served(&f, "done").await;
        assert_not_served(&f, "live").await;
        let feed = f.svc.index_rows(&VisibilityFilter::All).await.0;
        assert_eq!(feed.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["kept"]);
        // The run nobody killed is served as before.
        assert!(f.svc.get_run("kept", true, &VisibilityFilter::All).await.is_ok());
        assert!(f.svc.get_run_events("kept", 0, None, &VisibilityFilter::All).await.is_ok());
    }

    #[tokio::test]
    async fn the_kill_state_costs_one_read_per_listing_and_a_point_read_outside_it_asks_for_its_id_alone() {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.ledger_row("x1", "c1", OTHER_GEN, NOW - 30, false, 2);
        // One listing: one question, about every id it may serve (the registry's and the ledger's rows).
        f.list(StatusFilter::All).await;
        assert_eq!(*f.double.kill_questions.lock().unwrap(), [vec!["r1".to_owned(), "x1".to_owned()]]);
        // Reads within the TTL, listings and point reads alike, are answered from it.
        f.list(StatusFilter::Active).await;
        f.svc.get_run("r1", true, &VisibilityFilter::All).await.unwrap();
        f.svc.get_run_events("r1", 0, None, &VisibilityFilter::All).await.unwrap();
        f.svc.get_run_friction("x1", &VisibilityFilter::All).await.unwrap();
        f.svc.index_rows(&VisibilityFilter::All).await;
        assert_eq!(f.double.kill_reads(), 1);
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        // Past the TTL, a point read of a registry row asks about its id alone, and lists nothing.
        f.clock.advance(LEDGER_LIST_TTL_MS);
        f.kill_elsewhere("r1");
        assert_eq!(f.svc.get_run("r1", false, &VisibilityFilter::All).await, Err(RunsError::NotFound));
        assert_eq!(f.double.kill_questions.lock().unwrap().last().unwrap(), &["r1".to_owned()]);
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), 1);
        // A registry row newer than a fresh listing was not asked about: its point read asks.
        f.list(StatusFilter::All).await;
        let before = f.double.kill_reads();
        f.local("new", "c1", NOW - 1, None);
        f.kill_elsewhere("new");
        assert_eq!(f.svc.get_run("new", false, &VisibilityFilter::All).await, Err(RunsError::NotFound));
        assert_eq!(f.double.kill_reads(), before + 1);
        // An empty process asks nothing.
        let empty = fixture();
        empty.list(StatusFilter::All).await;
        assert_eq!(empty.double.kill_reads(), 0);
    }

    #[tokio::test]
    async fn a_failed_kill_read_fails_the_listing_uncached_and_a_point_read_serves_the_registry_row() {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.ledger_row("x1", "c1", OTHER_GEN, NOW - 30, false, 0);
        f.double.fail_kills.store(true, Ordering::SeqCst);
        // As with any ledger failure: the registry and the store are served, the ledger's rows are not.
        let list = f.list(StatusFilter::All).await;
        assert!(list.ledger_unavailable);
        assert_eq!(ids(&list), ["r1"]);
        // A failed check is no proof of a kill.
        assert!(f.svc.get_run("r1", false, &VisibilityFilter::All).await.is_ok());
        // The failed listing was not cached: the next read lists again and sees the fence.
        f.double.fail_kills.store(false, Ordering::SeqCst);
        f.kill_elsewhere("r1");
        let list = f.list(StatusFilter::All).await;
        assert!(!list.ledger_unavailable);
        assert_eq!(ids(&list), ["x1"]);
    }

    #[tokio::test]
    async fn a_killed_ledger_row_lists_from_no_source_and_answers_not_found() {
        let f = fixture();
        // Live under another generation, which has not purged it yet; its tombstone is in the store.
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 3);
        f.put(record("remote", "c1", NOW - 300, NOW - 300, true, vec![]));
        f.kill_elsewhere("remote");
        for status in [StatusFilter::All, StatusFilter::Active, StatusFilter::Finished] {
            assert!(f.list(status).await.runs.is_empty(), "{status:?}");
        }
        let all = VisibilityFilter::All;
        assert_eq!(f.svc.get_run("remote", true, &all).await, Err(RunsError::NotFound));
        assert_eq!(f.svc.get_run_events("remote", 0, None, &all).await, Err(RunsError::NotFound));
        assert_eq!(f.svc.get_run_friction("remote", &all).await, Err(RunsError::NotFound));
        assert!(f.svc.index_rows(&all).await.0.is_empty());
    }
}
