//! The finished-run history contract (SPEC §3): the [`RunStore`] trait and its vocabulary.
//!
//! Implementations: [`crate::memory::MemoryStore`] and [`crate::sqlite::SqliteStore`]. Both are synchronous
//! and take `now_ms` from the caller, so the same contract suite (storage/tests/store_contract.rs) drives
//! both with a manual clock. Async callers go through [`crate::StorageHandle`], which runs each method as
//! one message on the storage actor.
//!
//! Invariants every implementation keeps:
//! - a bad run id is not-found on every method and never reaches SQL;
//! - reads apply the persisted retention policy first: a row outside policy is invisible before any write;
//! - a `provisional` put never overwrites a final record (the tombstone floor);
//! - a put is all-or-nothing.

use crate::record::{RetentionPolicy, RunListItem, RunRecord, RunStatus, VisibilityFilter};
use crate::Result;
use crate::RunId;

/// Clamp for a record's future timestamps: at most this far past the store's clock.
pub const MAX_FUTURE_MS: i64 = 24 * 60 * 60 * 1000;
/// A put trims at most this many rows outside policy; the next put finishes the job.
pub const TRIM_PER_PUT: usize = 500;
pub const LIST_DEFAULT_LIMIT: usize = 50;
pub const LIST_MAX_LIMIT: usize = 200;
pub const EVENTS_DEFAULT_LIMIT: usize = 1000;
pub const EVENTS_MAX_LIMIT: usize = 5000;
/// Cap of one [`RunStore::open_cards`] answer (and its floor is 1).
pub const OPEN_CARDS_MAX_LIMIT: usize = 100;

/// Decode one stored event row (`run_events.json`): every SQL backend's one reading of it, for a
/// record's events and a live run's alike. A row that does not decode is skipped — the read answers the
/// run's other events, never failing whole — and logged as a warning with the run id, the seq and the
/// [`crate::DecodeProblem`] (`problem`), never the stored bytes or the decoder's message.
pub(crate) fn decode_event_row(run_id: &str, seq: i64, json: &str) -> Option<serde_json::Value> {
    match serde_json::from_str(json) {
        Ok(event) => Some(event),
        Err(e) => {
            let problem = crate::DecodeProblem::of(&e);
            tracing::warn!(
                run_id,
                seq,
                problem = problem.as_str(),
                "skipped a corrupt event row"
            );
            None
        }
    }
}

/// A retention policy proposed by a writer, stamped with when its configuration was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyProposal {
    pub policy: RetentionPolicy,
    pub updated_at: i64,
}

impl PolicyProposal {
    /// The stamp the store records: never later than its own clock, so a future-dated proposal cannot
    /// lock out a later, correct one.
    pub fn effective_stamp(&self, now_ms: i64) -> i64 {
        self.updated_at.min(now_ms)
    }
}

/// The persisted policy and the stamp of the proposal that set it (`None`: never set, defaults apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoredPolicy {
    pub policy: RetentionPolicy,
    pub updated_at: Option<i64>,
}

impl StoredPolicy {
    /// Adopt `proposal` when its effective stamp is strictly newer; answers whether it changed.
    pub fn consider(&mut self, proposal: Option<&PolicyProposal>, now_ms: i64) -> bool {
        let Some(p) = proposal else { return false };
        let stamp = p.effective_stamp(now_ms);
        if self.updated_at.is_some_and(|cur| stamp <= cur) {
            return false;
        }
        *self = StoredPolicy {
            policy: p.policy,
            updated_at: Some(stamp),
        };
        true
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The record is on disk and visible under the policy after this put.
    pub stored: bool,
    /// An existing, different record under the id was replaced (events included).
    pub rewritten: bool,
    /// Rows the policy keeps after this put.
    pub retained: u64,
}

/// What a retention pass with no write did ([`RunStore::expire`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    /// Finished runs the persisted policy no longer keeps, removed (at most [`TRIM_PER_PUT`] a pass).
    pub runs: u64,
    /// Runs whose event rows neither a record nor a live run owned, their events removed.
    pub orphaned: u64,
    /// Where the next pass's orphan scan starts (`None`: the scan went round; start from the first id).
    pub scan_after: Option<String>,
}

/// The compound list cursor: rows strictly older than `(finished_at, id)` in newest-first order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub finished_at: i64,
    /// Absent: every row finished strictly before `finished_at`.
    pub id: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListQuery {
    pub visible_to: VisibilityFilter,
    pub limit: Option<usize>,
    pub before: Option<Cursor>,
    pub since_ms: Option<i64>,
    pub agent: Option<String>,
    pub channel: Option<String>,
    pub thread_key: Option<String>,
    pub parent_run_id: Option<RunId>,
    /// Only final records with this status (SPEC §7's terminal-status filter): a provisional tombstone
    /// matches none, since it shows as "unfinished", never as its stored `interrupted`.
    pub status: Option<RunStatus>,
    /// Only runs whose id starts with, or whose label contains, this text ([`Search`]).
    pub search: Option<Search>,
}

/// The index's text search (`q`): a run matches when its id starts with the text or its label contains it,
/// ASCII letters compared without case (other characters exactly), on every backend alike.
///
/// The SQL stores test the `runs.label` column and the run id in listing order (newest first) and stop at
/// the page's limit: no index serves a substring, so a search that matches little reads every row the
/// retention policy keeps — which `max_runs` (at most 20,000) bounds — and never a record's JSON. The
/// text is bound as a `LIKE` pattern with its wildcards (`%`, `_`) and the escape (`\`) escaped
/// ([`Search::like_prefix`], [`Search::like_contains`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// Trimmed, ASCII-lowercased, 1..=[`Search::MAX_CHARS`] characters.
    text: String,
}

impl Search {
    /// The longest search text (longer text is cut here).
    pub const MAX_CHARS: usize = 256;

    /// The search for `text` (trimmed, cut to [`Search::MAX_CHARS`]); `None` when nothing is left.
    pub fn new(text: &str) -> Option<Search> {
        let text: String = text.trim().chars().take(Self::MAX_CHARS).collect();
        (!text.is_empty()).then(|| Search {
            text: text.to_ascii_lowercase(),
        })
    }

    /// The text as matched (ASCII-lowercased).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether a run with this id and label matches.
    pub fn matches(&self, id: &str, label: Option<&str>) -> bool {
        id.to_ascii_lowercase().starts_with(&self.text)
            || label.is_some_and(|l| l.to_ascii_lowercase().contains(&self.text))
    }

    /// `text%`, escaped for `LIKE … ESCAPE '\'`.
    pub fn like_prefix(&self) -> String {
        format!("{}%", like_escape(&self.text))
    }

    /// `%text%`, escaped for `LIKE … ESCAPE '\'`.
    pub fn like_contains(&self) -> String {
        format!("%{}%", like_escape(&self.text))
    }
}

/// `s` with the `LIKE` wildcards and the escape character escaped by `\`.
pub fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl ListQuery {
    pub fn visible_to(filter: VisibilityFilter) -> Self {
        ListQuery {
            visible_to: filter,
            limit: None,
            before: None,
            since_ms: None,
            agent: None,
            channel: None,
            thread_key: None,
            parent_run_id: None,
            status: None,
            search: None,
        }
    }

    pub fn effective_limit(&self) -> usize {
        self.limit
            .unwrap_or(LIST_DEFAULT_LIMIT)
            .clamp(1, LIST_MAX_LIMIT)
    }

    /// The non-visibility filters and the cursor, as one predicate over a listing row.
    pub fn admits(&self, item: &RunListItem) -> bool {
        let h = &item.head;
        self.since_ms.is_none_or(|s| h.finished_at >= s)
            && self
                .agent
                .as_deref()
                .is_none_or(|a| h.agent.as_deref() == Some(a))
            && self.channel.as_deref().is_none_or(|c| h.channel_id == c)
            && self.thread_key.as_deref().is_none_or(|t| h.thread_key == t)
            && self
                .parent_run_id
                .as_deref()
                .is_none_or(|p| h.parent_run_id.as_deref() == Some(p))
            && self.status.is_none_or(|s| h.status == s && !h.provisional)
            && self
                .search
                .as_ref()
                .is_none_or(|s| s.matches(&h.id, h.label.as_deref()))
            && self.before.as_ref().is_none_or(|c| match &c.id {
                Some(id) => (h.finished_at, h.id.as_str()) < (c.finished_at, id.as_str()),
                None => h.finished_at < c.finished_at,
            })
            && self.visible_to.matches_head(h)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListPage {
    pub items: Vec<RunListItem>,
    /// Present when the page is full: pass it back as `before` for the next page.
    pub next_before: Option<Cursor>,
}

impl ListPage {
    pub(crate) fn from_items(items: Vec<RunListItem>, limit: usize) -> Self {
        let next_before = (items.len() == limit).then(|| {
            let last = &items[items.len() - 1].head;
            Cursor {
                finished_at: last.finished_at,
                id: Some(last.id.to_string()),
            }
        });
        ListPage { items, next_before }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventsPage {
    pub events: Vec<serde_json::Value>,
    /// Present while more events follow: pass it back as `after_seq`.
    pub next_after_seq: Option<u64>,
}

/// The limit [`RunStore::open_cards`] applies: `limit` clamped to `1..=`[`OPEN_CARDS_MAX_LIMIT`].
pub fn effective_open_cards_limit(limit: usize) -> usize {
    limit.clamp(1, OPEN_CARDS_MAX_LIMIT)
}

pub fn effective_events_limit(limit: Option<usize>) -> usize {
    limit
        .unwrap_or(EVENTS_DEFAULT_LIMIT)
        .clamp(1, EVENTS_MAX_LIMIT)
}

/// Finished-run history (SPEC §3). Each method is one transaction.
pub trait RunStore: Send {
    /// Upsert a finished (or provisional) record under the persisted policy, adopting `proposal` first
    /// when it is newer.
    fn put(
        &mut self,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<PutOutcome>;
    fn get(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunRecord>>;
    /// The listing row (no events) with its `bytes`.
    fn get_summary(&mut self, id: &RunId, now_ms: i64) -> Result<Option<RunListItem>>;
    fn list(&mut self, query: &ListQuery, now_ms: i64) -> Result<ListPage>;
    /// Events strictly after `after_seq`; `None` for an unknown, expired or malformed id.
    fn events(
        &mut self,
        id: &RunId,
        after_seq: u64,
        limit: Option<usize>,
        now_ms: i64,
    ) -> Result<Option<EventsPage>>;
    /// Remove the record and its events; answers whether a row existed.
    fn delete(&mut self, id: &RunId) -> Result<bool>;
    fn policy(&mut self) -> Result<StoredPolicy>;
    /// Retention with no write (the seed's "alarm with no writes"): remove what the persisted policy no
    /// longer keeps (oldest first, at most [`TRIM_PER_PUT`] runs), and of the next [`TRIM_PER_PUT`] run
    /// ids with event rows after `scan_after` (in id order), the events of those that have neither a
    /// record nor a live row. Each pass is short; passes that carry `scan_after` on go round the table.
    fn expire(&mut self, now_ms: i64, scan_after: &str) -> Result<Expired>;
    /// The orphan sweep's worklist (SPEC §12): the ids of visible final records whose status card still
    /// waits for its closing frame ([`RunHead::card_open`](crate::record::RunHead::card_open)) and that
    /// finished at or before `finished_before`, oldest first (`finished_at`, then id), at most `limit`
    /// (clamped to `1..=`[`OPEN_CARDS_MAX_LIMIT`]). Like every read it applies the persisted policy first.
    /// The SQL stores keep the answer in an indexed column their record writer sets, so this never reads
    /// a record's JSON; a row written before that column existed reads as closed.
    fn open_cards(&mut self, finished_before: i64, limit: usize, now_ms: i64)
        -> Result<Vec<RunId>>;
    /// Mark the stored record's card closed (`cardClosed: true`, read back by `get`, `get_summary` and
    /// `list`) and take it off [`RunStore::open_cards`]; answers whether a record with an open card was
    /// changed — `false` for a bad or unknown id, a provisional record, a record without a card or one
    /// already closed. The stored digest and size become those of the closed record, so a later put of it
    /// is an identical repeat; a later put without `cardClosed: true` opens the card again. Whatever the
    /// policy: a row the policy no longer keeps goes at the next trim either way.
    fn close_card(&mut self, id: &RunId) -> Result<bool>;
}

/// Clamp a record's timestamps to at most [`MAX_FUTURE_MS`] past the store's clock (SPEC §3), so a
/// writer with a wrong clock cannot pin a record at the top of every listing.
pub fn clamp_future(record: &RunRecord, now_ms: i64) -> RunRecord {
    let limit = now_ms.saturating_add(MAX_FUTURE_MS);
    let mut r = record.clone();
    r.head.finished_at = r.head.finished_at.min(limit);
    r.head.received_at = r.head.received_at.map(|t| t.min(limit));
    r.head.sealed_at = r.head.sealed_at.map(|t| t.min(limit));
    r
}
