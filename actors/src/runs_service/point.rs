//! Reads of one run — `get_run`, `get_run_events`, `get_run_friction` (with [`analyze`]) — its stop
//! (`stop_run`, through a [`RunStopper`]), and the uncached live rows, index rows and replay reads the
//! live surfaces use.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use storage::RunId;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use storage::ledger::StopMode;
use storage::record::{
    event_seq, is_valid_run_id, CategoryStat, Diagnosis, RunListItem, VisibilityFilter,
};

use super::{RunView, RunsError, RunsResult, RunsService, LEDGER_EVENTS_CHUNK};
use crate::registry::RunRow;
use crate::run::StopActor;
use crate::supervisor::{StopError, StopRun, Supervisor};

/// Most events in one `get_run_events` page.
pub const EVENTS_PAGE_MAX: usize = 500;
/// Most event JSON (UTF-8 bytes) in one `get_run_events` page; a page always carries at least one event.
pub const EVENTS_PAGE_MAX_BYTES: usize = 256 * 1024;
/// Most events a full read of a ledger row loads (a bound, like the registry's backlog).
const LEDGER_EVENTS_MAX: usize = 20_000;

/// Who carries out a stop: the process's [`Supervisor`] (or a test double).
pub trait RunStopper {
    fn stop(&self, msg: StopRun) -> Pin<Box<dyn Future<Output = Result<(), StopError>> + '_>>;
}

impl RunStopper for actix::Addr<Supervisor> {
    fn stop(&self, msg: StopRun) -> Pin<Box<dyn Future<Output = Result<(), StopError>> + '_>> {
        Box::pin(async move {
            self.send(msg)
                .await
                .map_err(|e| StopError::Unavailable(format!("supervisor: {e}")))?
        })
    }
}

/// A page of a run's events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventPage {
    #[schema(value_type = Vec<storage::record::RunEvent>)]
    pub events: Vec<Value>,
    /// Present while more events follow: pass it back as `afterSeq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<u64>,
}

/// Where a friction answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Friction {
    #[schema(value_type = String)]
    pub id: RunId,
    pub finished: bool,
    pub truncated: bool,
    pub source: FrictionSource,
    pub diagnosis: Diagnosis,
}

/// A stop that was recorded and signalled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StopAccepted {
    #[schema(value_type = String)]
    pub id: RunId,
    pub mode: StopMode,
    /// Always `stopping`.
    pub state: String,
}

/// A ledger row as `GET /api/live` shows it: never the prompt, the tools or the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LiveRowView {
    #[schema(value_type = String)]
    pub run_id: RunId,
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

/// Where a point read found a run.
enum Found {
    /// A registry row, with its final record's summary once a finished row's record landed.
    Registry(RunRow, Option<Box<RunListItem>>),
    /// A ledger row, as its listing shows it.
    Ledger(Box<RunView>),
    Store(RunListItem),
}

impl RunsService {
    /// Every live event of a ledger row (bounded by [`LEDGER_EVENTS_MAX`]); `None` once the row is gone.
    async fn all_live_events(&self, id: &RunId) -> RunsResult<Option<Vec<Value>>> {
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

    /// Whether run `id` carries a deletion fence: from the fresh listing when it asked about
    /// the id, else one `killed_among` read. A failed read is no proof of a kill: the run is served.
    async fn is_killed(&self, id: &RunId) -> bool {
        if let Some(known) = self.fresh_listing().and_then(|l| l.killed(id)) {
            return known;
        }
        match self.source.killed_among(vec![id.to_owned()]).await {
            Ok(killed) => killed.iter().any(|k| k == id),
            Err(e) => {
                tracing::warn!(run_id = %id, error = %e, "kill state read failed; serving the run");
                false
            }
        }
    }

    /// Find a run: registry, then the ledger (cached listing), then the store summary.
    async fn find(&self, id: &RunId) -> RunsResult<Found> {
        if !is_valid_run_id(id) {
            return Err(RunsError::NotFound);
        }
        if let Some(row) = self.registry.row(id) {
            if row.finished_at.is_none() {
                if self.is_killed(id).await {
                    return Err(RunsError::NotFound);
                }
                return Ok(Found::Registry(row, None));
            }
            // A finished row: its kill state (known to a fresh listing, else read) and its final record
            // once it landed, in one read.
            let known = self.fresh_listing().and_then(|l| l.killed(id));
            let read = match known {
                Some(true) => return Err(RunsError::NotFound),
                Some(false) => self
                    .source
                    .get_summary(id.to_owned())
                    .await
                    .map(|item| (item, false)),
                None => self.source.get_summary_and_killed(id.to_owned()).await,
            };
            let (killed, record) = match read {
                Ok((item, killed)) => (killed, item.filter(|i| !i.head.provisional).map(Box::new)),
                Err(e) => {
                    tracing::warn!(run_id = %id, error = %e, "history store read failed; serving the registry row");
                    (false, None)
                }
            };
            if killed {
                return Err(RunsError::NotFound);
            }
            return Ok(Found::Registry(row, record));
        }
        if let Ok(listing) = self.live_listing().await {
            if listing.killed.contains(id) {
                return Err(RunsError::NotFound);
            }
            if let Some(row) = listing
                .rows
                .iter()
                .find(|r| r.run_id == id && self.lists_ledger_row(r))
            {
                return Ok(Found::Ledger(Box::new(listing.view(row))));
            }
        }
        match self.source.get_summary(id.to_owned()).await {
            // A tombstone may be a killed run's, its purge still to come: never served. (A final record is
            // never a killed run's: a finished run cannot be killed.)
            Ok(Some(item)) if item.head.provisional && self.is_killed(id).await => {
                Err(RunsError::NotFound)
            }
            Ok(Some(item)) => Ok(Found::Store(item)),
            Ok(None) => Err(RunsError::NotFound),
            Err(e) => {
                tracing::warn!(run_id = %id, error = %e, "history store read failed");
                Err(RunsError::Unavailable(e.to_string()))
            }
        }
    }

    /// `get_run` (SPEC §7): one run's view, with its events when asked.
    pub async fn get_run(
        &self,
        id: &RunId,
        include_events: bool,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<RunView> {
        let mut view = self.find_view(id, include_events, visible_to).await?;
        if let Some(events) = view.events.take() {
            view.fill_from_events(&events);
            view.events = Some(events);
        }
        Ok(view)
    }

    async fn find_view(
        &self,
        id: &RunId,
        include_events: bool,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<RunView> {
        match self.find(id).await? {
            Found::Registry(row, record) => {
                let mut view = RunView::from_registry(&row);
                if !view.visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                // A finished row overlaid with its final record, once the store holds it.
                if let Some(item) = &record {
                    view.merge_record(&item.head);
                }
                if include_events {
                    // Taken after the row: the events cover at least what the row counted.
                    match self.registry.snapshot(id) {
                        Some((_, events)) => view.events = Some(events),
                        // Its record landed meanwhile and the registry let it go: the store has it all.
                        None => return self.stored_run(id, true, visible_to).await,
                    }
                }
                Ok(view)
            }
            Found::Ledger(view) => {
                let mut view = *view;
                if !view.visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                if include_events {
                    match self.all_live_events(id).await? {
                        Some(events) => {
                            view.event_count = events.len() as u64; // a count, never a seq
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
    async fn stored_run(
        &self,
        id: &RunId,
        include_events: bool,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<RunView> {
        let unavailable = |e: storage::Error| {
            tracing::warn!(run_id = %id, error = %e, "history store read failed");
            RunsError::Unavailable(e.to_string())
        };
        let view = if include_events {
            let record = self
                .source
                .get(id.to_owned())
                .await
                .map_err(unavailable)?
                .ok_or(RunsError::NotFound)?;
            let mut view = RunView::from_head(&record.head);
            view.events = Some(record.events);
            view
        } else {
            let item = self
                .source
                .get_summary(id.to_owned())
                .await
                .map_err(unavailable)?
                .ok_or(RunsError::NotFound)?;
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
        id: &RunId,
        after_seq: u64,
        limit: Option<usize>,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<EventPage> {
        let limit = limit.unwrap_or(EVENTS_PAGE_MAX).clamp(1, EVENTS_PAGE_MAX);
        match self.find(id).await? {
            Found::Registry(row, _) => {
                if !RunView::from_registry(&row).visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                let Some((_, events)) = self.registry.snapshot(id) else {
                    // Its record landed since the lookup: the record holds the same seqs.
                    return self.stored_events(id, after_seq, limit, visible_to).await;
                };
                let after = events
                    .into_iter()
                    .filter(|e| event_seq(e).is_some_and(|s| s > after_seq));
                Ok(page_of(after, limit, None))
            }
            Found::Ledger(view) => {
                if !view.visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                let read = self
                    .source
                    .live_events(id.to_owned(), after_seq, limit + 1)
                    .await;
                match read.map_err(|e| RunsError::Unavailable(e.to_string()))? {
                    // Up to the first gap that may still fill: a later read serves it in order.
                    Some(events) => {
                        let (settled, _) =
                            super::settled_prefix(&events, after_seq, self.clock.now_ms());
                        Ok(page_of(events.into_iter().take(settled), limit, None))
                    }
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

    async fn stored_events(
        &self,
        id: &RunId,
        after_seq: u64,
        limit: usize,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<EventPage> {
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
    /// of a persisted run. See the [module docs](super) for the method.
    pub async fn get_run_friction(
        &self,
        id: &RunId,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<Friction> {
        match self.find(id).await? {
            Found::Registry(row, _) => {
                if !RunView::from_registry(&row).visible_to(visible_to) {
                    return Err(RunsError::NotFound);
                }
                let Some((row, events)) = self.registry.snapshot(id) else {
                    // Its record landed since the lookup.
                    return self.stored_friction(id, visible_to).await;
                };
                Ok(Friction {
                    id: id.to_owned(),
                    finished: row.finished_at.is_some(),
                    truncated: row.truncated,
                    source: FrictionSource::Live,
                    diagnosis: analyze(&events),
                })
            }
            Found::Ledger(view) => {
                if !view.visible_to(visible_to) {
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

    async fn stored_friction(
        &self,
        id: &RunId,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<Friction> {
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
    /// with `actor`; a finished run → conflict; unknown or killed → not found; one the caller may not see →
    /// forbidden (SPEC §8.1: visibility applies to writes; nothing is written). Runs outside the registry
    /// are looked up uncached (`get_live`, then `get_summary` — never `get`).
    pub async fn stop_run(
        &self,
        stopper: &dyn RunStopper,
        id: &RunId,
        mode: StopMode,
        actor: StopActor,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<StopAccepted> {
        if !is_valid_run_id(id) {
            return Err(RunsError::NotFound);
        }
        let finished = || RunsError::Conflict(format!("run {id} has finished"));
        if let Some(row) = self.registry.row(id) {
            if self.is_killed(id).await {
                return Err(RunsError::NotFound);
            }
            if !RunView::from_registry(&row).visible_to(visible_to) {
                return Err(RunsError::Forbidden(id.to_owned()));
            }
            if row.finished_at.is_some() {
                return Err(finished());
            }
        } else {
            match self.source.get_live(id.to_owned()).await {
                Ok(Some(row)) => {
                    if !RunView::from_live(&row, 0).visible_to(visible_to) {
                        return Err(RunsError::Forbidden(id.to_owned()));
                    }
                }
                Ok(None) => {
                    return match self.source.get_summary(id.to_owned()).await {
                        Ok(Some(item)) if visible_to.matches_head(&item.head) => Err(finished()),
                        Ok(Some(_)) => Err(RunsError::Forbidden(id.to_owned())),
                        Ok(None) => Err(RunsError::NotFound),
                        Err(e) => Err(RunsError::Unavailable(e.to_string())),
                    };
                }
                Err(e) => return Err(RunsError::Unavailable(e.to_string())),
            }
        }
        match stopper
            .stop(StopRun {
                run_id: id.to_owned(),
                mode,
                actor,
            })
            .await
        {
            Ok(()) => Ok(StopAccepted {
                id: id.to_owned(),
                mode,
                state: "stopping".into(),
            }),
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
        let rows = self
            .source
            .list_live()
            .await
            .map_err(|e| RunsError::Unavailable(e.to_string()))?;
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
        let mut rows: Vec<RunView> = self
            .registry
            .rows()
            .iter()
            .filter(|r| !killed(&r.id))
            .map(RunView::from_registry)
            .collect();
        if let Ok(listing) = &listing {
            for row in listing
                .rows
                .iter()
                .filter(|r| self.lists_ledger_row(r) && !killed(&r.run_id))
            {
                rows.push(listing.view(row));
            }
        }
        rows.retain(|v| v.visible_to(visible_to));
        rows.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
        (rows, listing.is_ok())
    }

    /// A live run's ledger events after `after_seq` (uncached; for following a run live elsewhere).
    /// `Ok(None)` once its row is gone.
    pub async fn ledger_events(
        &self,
        id: &RunId,
        after_seq: u64,
        limit: usize,
    ) -> RunsResult<Option<Vec<Value>>> {
        self.source
            .live_events(id.to_owned(), after_seq, limit)
            .await
            .map_err(|e| RunsError::Unavailable(e.to_string()))
    }

    /// The stored record's summary, for a stream's `end` and the feed (uncached).
    pub async fn stored_summary(
        &self,
        id: &RunId,
        visible_to: &VisibilityFilter,
    ) -> RunsResult<RunView> {
        self.stored_run(id, false, visible_to).await
    }

    /// A page of a stored run's events after `after_seq` (for replays).
    pub async fn stored_event_page(
        &self,
        id: &RunId,
        after_seq: u64,
        limit: usize,
    ) -> RunsResult<EventPage> {
        let page = self
            .source
            .events(id.to_owned(), after_seq, Some(limit))
            .await
            .map_err(|e| RunsError::Unavailable(e.to_string()))?
            .ok_or(RunsError::NotFound)?;
        Ok(EventPage {
            events: page.events,
            next_after_seq: page.next_after_seq,
        })
    }
}

/// Cut a page from `events` (already strictly after the cursor): at most `limit` events and
/// [`EVENTS_PAGE_MAX_BYTES`] of JSON, never empty while any event follows. `source_next` is the source's
/// own "more follow" cursor when it paged already.
fn page_of(
    events: impl Iterator<Item = Value>,
    limit: usize,
    source_next: Option<u64>,
) -> EventPage {
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
    let next_after_seq = if cut {
        out.last().and_then(event_seq)
    } else {
        source_next
    };
    EventPage {
        events: out,
        next_after_seq,
    }
}

/// The friction diagnosis of a run from its stamped events (method in the [module docs](super)).
pub fn analyze(events: &[Value]) -> Diagnosis {
    let mut diagnosis = Diagnosis::default();
    let mut calls: HashMap<String, i64> = HashMap::new();
    let mut model_from: Option<i64> = None;
    let mut tool = CategoryStat::default();
    let mut model = CategoryStat::default();
    for e in events {
        let Some(at) = e.get("at").and_then(Value::as_i64) else {
            continue;
        };
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
    use std::sync::atomic::Ordering;
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::runs_service::testing::*;
    use crate::runs_service::{ListParams, StatusFilter, LEDGER_LIST_TTL_MS};

    #[tokio::test]
    async fn a_point_read_of_a_finished_registry_row_survives_a_failing_store() {
        let f = fixture();
        f.local("r1", "c1", NOW - 900, Some(NOW - 100));
        f.double.fail_store.store(true, Ordering::SeqCst);
        let v = f
            .svc
            .get_run(&RunId::from("r1"), true, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (v.finished, v.persisted, v.events.as_ref().map(Vec::len)),
            (true, None, Some(2))
        );
        assert_eq!(
            f.double.get_calls.load(Ordering::SeqCst),
            0,
            "the full store read is never used for a registry row"
        );
    }

    #[tokio::test]
    async fn point_reads_use_the_summary_and_only_include_events_reads_the_full_record() {
        let f = fixture();
        f.put(record(
            "s1",
            "c1",
            NOW - 100,
            NOW - 50,
            false,
            events(3, NOW - 60),
        ));
        let v = f
            .svc
            .get_run(&RunId::from("s1"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (v.finished, v.persisted, v.events.is_none()),
            (true, Some(true), true)
        );
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 0);
        let v = f
            .svc
            .get_run(&RunId::from("s1"), true, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(v.events.map(|e| e.len()), Some(3));
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 1);
        f.svc
            .get_run_friction(&RunId::from("s1"), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(f.double.get_calls.load(Ordering::SeqCst), 1);
        // Unknown, malformed and expired ids are not found.
        assert_eq!(
            f.svc
                .get_run(&RunId::from("nope"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
        assert_eq!(
            f.svc
                .get_run(&RunId::from("../etc"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
        f.put(record(
            "ancient",
            "c1",
            NOW - 40 * 86_400_000,
            NOW - 31 * 86_400_000,
            false,
            vec![],
        ));
        assert_eq!(
            f.svc
                .get_run(&RunId::from("ancient"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
        // A stored tombstone's flag rides the view; a final record's view has no key.
        f.put(record("tomb", "c1", NOW - 10, NOW - 10, true, vec![]));
        let t = f
            .svc
            .get_run(&RunId::from("tomb"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (t.provisional, t.status_label().as_str()),
            (Some(true), "unfinished — no finish recorded")
        );
        let json = serde_json::to_value(
            f.svc
                .get_run(&RunId::from("s1"), false, &VisibilityFilter::All)
                .await
                .unwrap(),
        )
        .unwrap();
        assert!(json.get("provisional").is_none());
    }

    #[tokio::test]
    async fn visibility_filters_every_source_and_none_touches_nothing() {
        let f = fixture();
        f.local("l1", "c1", NOW - 10, None);
        f.local("l2", "c2", NOW - 10, None);
        f.ledger_row("x2", "c2", OTHER_GEN, NOW - 20, false, 1);
        f.put(record(
            "s1",
            "c1",
            NOW - 100,
            NOW - 50,
            false,
            events(1, NOW - 50),
        ));
        f.put(record(
            "s2",
            "c2",
            NOW - 100,
            NOW - 50,
            false,
            events(1, NOW - 50),
        ));
        let c1 = VisibilityFilter::ChannelsIn {
            ids: vec!["c1".into()],
        };
        let list = f
            .svc
            .list_runs(&ListParams::new(StatusFilter::All, c1.clone()))
            .await;
        assert_eq!(ids(&list), ["l1", "s1"]);
        for id in ["l2", "x2", "s2"] {
            assert_eq!(
                f.svc.get_run(&RunId::from(id), true, &c1).await,
                Err(RunsError::NotFound),
                "{id}"
            );
            assert_eq!(
                f.svc.get_run_events(&RunId::from(id), 0, None, &c1).await,
                Err(RunsError::NotFound),
                "{id}"
            );
            assert_eq!(
                f.svc.get_run_friction(&RunId::from(id), &c1).await,
                Err(RunsError::NotFound),
                "{id}"
            );
            // A write to a run the caller may not see is refused as such, and reaches nothing.
            let stop = f
                .svc
                .stop_run(
                    &NoStop,
                    &RunId::from(id),
                    StopMode::Hard,
                    StopActor::new("t", "x"),
                    &c1,
                )
                .await;
            assert_eq!(stop, Err(RunsError::Forbidden(id.into())), "{id}");
        }
        assert_eq!(f.svc.live_rows(&c1).await.unwrap().len(), 0);
        assert_eq!(
            f.svc
                .index_rows(&c1)
                .await
                .0
                .iter()
                .map(|v| v.id.as_str())
                .collect::<Vec<_>>(),
            ["l1"]
        );
        // `none` touches neither the ledger nor the store.
        let (lists, lives) = (
            f.double.list_calls.load(Ordering::SeqCst),
            f.double.live_list_calls.load(Ordering::SeqCst),
        );
        f.clock.advance(LEDGER_LIST_TTL_MS);
        assert!(f
            .svc
            .list_runs(&ListParams::new(StatusFilter::All, VisibilityFilter::None))
            .await
            .runs
            .is_empty());
        assert_eq!(f.double.list_calls.load(Ordering::SeqCst), lists);
        assert_eq!(f.double.live_list_calls.load(Ordering::SeqCst), lives);
    }

    #[tokio::test]
    async fn event_pages_are_strictly_after_the_cursor_bounded_and_the_same_live_and_persisted() {
        let f = fixture();
        // Live: the registry run's seqs.
        f.local("r1", "c1", NOW - 10, None);
        for i in 0..3 {
            f.registry.publish(
                &RunId::from("r1"),
                json!({"type": "note", "kind": "k", "summary": format!("n{i}")}),
            );
        }
        let live = f
            .svc
            .get_run_events(&RunId::from("r1"), 2, Some(2), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            live.events.iter().filter_map(event_seq).collect::<Vec<_>>(),
            [3, 4]
        );
        assert_eq!(live.next_after_seq, Some(4));
        // Persisted: the same seqs from the record.
        let (_, evs) = f.registry.snapshot(&RunId::from("r1")).unwrap();
        f.registry.discard(&RunId::from("r1"));
        f.put(record("r1", "c1", NOW - 10, NOW, false, evs));
        let stored = f
            .svc
            .get_run_events(&RunId::from("r1"), 2, Some(2), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(stored, live);
        let rest = f
            .svc
            .get_run_events(&RunId::from("r1"), 4, None, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((rest.events.len(), rest.next_after_seq), (1, None));
        assert!(f
            .svc
            .get_run_events(&RunId::from("r1"), 5, None, &VisibilityFilter::All)
            .await
            .unwrap()
            .events
            .is_empty());
        // A big run: 500 per page even when asked for more; then the rest.
        f.put(record("big", "c1", NOW - 10, NOW, false, events(1200, NOW)));
        let p = f
            .svc
            .get_run_events(
                &RunId::from("big"),
                0,
                Some(100_000),
                &VisibilityFilter::All,
            )
            .await
            .unwrap();
        assert_eq!((p.events.len(), p.next_after_seq), (500, Some(500)));
        // 256 KiB: four 60 KiB events make two pages of three and one.
        let fat: Vec<Value> = (1..=4)
            .map(|s| json!({"type": "note", "seq": s, "at": NOW, "summary": "x".repeat(60_000)}))
            .collect();
        f.put(record("fat", "c1", NOW - 10, NOW, false, fat));
        let p1 = f
            .svc
            .get_run_events(&RunId::from("fat"), 0, None, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (p1.events.len(), p1.next_after_seq),
            (4, None),
            "4 × 60 KB < 256 KiB"
        );
        let huge: Vec<Value> = (1..=5)
            .map(|s| json!({"type": "note", "seq": s, "at": NOW, "summary": "x".repeat(63_000)}))
            .collect();
        f.put(record("huge", "c1", NOW - 10, NOW, false, huge));
        let p1 = f
            .svc
            .get_run_events(&RunId::from("huge"), 0, None, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((p1.events.len(), p1.next_after_seq), (4, Some(4)));
        let p2 = f
            .svc
            .get_run_events(&RunId::from("huge"), 4, None, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((p2.events.len(), p2.next_after_seq), (1, None));
        // A single event over the page budget still comes (a page is never empty while events follow).
        let one = page_of(
            vec![json!({"seq": 1, "summary": "x".repeat(300_000)})].into_iter(),
            500,
            None,
        );
        assert_eq!(one.events.len(), 1);
        // Zero-event persisted run: ok, empty.
        f.put(record("empty", "c1", NOW - 10, NOW, false, vec![]));
        assert!(f
            .svc
            .get_run_events(&RunId::from("empty"), 0, None, &VisibilityFilter::All)
            .await
            .unwrap()
            .events
            .is_empty());
        assert_eq!(
            f.svc
                .get_run_events(&RunId::from("nope"), 0, None, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
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
        assert_eq!(
            d.by_category["tool"],
            CategoryStat {
                count: 1,
                duration_ms: 200
            }
        );
        assert_eq!(
            d.by_category["model"],
            CategoryStat {
                count: 3,
                duration_ms: 100 + 50 + 20
            }
        );
        assert_eq!(d.by_category["storage"], CategoryStat::default());
        assert_eq!(d.by_category.len(), 5);
    }

    #[tokio::test]
    async fn friction_is_analyzed_live_and_stored_when_persisted() {
        let f = fixture();
        f.local("r1", "c1", NOW - 10, None);
        let live = f
            .svc
            .get_run_friction(&RunId::from("r1"), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!((live.source, live.finished), (FrictionSource::Live, false));
        f.put(record("s1", "c1", NOW - 100, NOW - 50, false, vec![]));
        let stored = f
            .svc
            .get_run_friction(&RunId::from("s1"), &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(
            (
                stored.source,
                stored.diagnosis.by_category["tool"].duration_ms
            ),
            (FrictionSource::Stored, 40)
        );
        assert_eq!(
            f.svc
                .get_run_friction(&RunId::from("nope"), &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
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
        let ok = FakeStopper {
            answer: Ok(()),
            asked: Mutex::default(),
        };
        let all = VisibilityFilter::All;
        let a = f
            .svc
            .stop_run(
                &ok,
                &RunId::from("live"),
                StopMode::Hard,
                StopActor::new("token", "ops@x"),
                &all,
            )
            .await
            .unwrap();
        assert_eq!((a.mode, a.state.as_str()), (StopMode::Hard, "stopping"));
        f.svc
            .stop_run(
                &ok,
                &RunId::from("remote"),
                StopMode::Soft,
                StopActor::new("token", "ops"),
                &all,
            )
            .await
            .unwrap();
        let asked: Vec<(RunId, StopMode, String)> = ok
            .asked
            .lock()
            .unwrap()
            .iter()
            .map(|m| (m.run_id.clone(), m.mode, m.actor.id.clone()))
            .collect();
        assert_eq!(
            asked,
            [
                ("live".into(), StopMode::Hard, "ops@x".into()),
                ("remote".into(), StopMode::Soft, "ops".into())
            ]
        );
        assert!(matches!(
            f.svc
                .stop_run(
                    &NoStop,
                    &RunId::from("done"),
                    StopMode::Soft,
                    StopActor::new("t", "x"),
                    &all
                )
                .await,
            Err(RunsError::Conflict(_))
        ));
        assert!(matches!(
            f.svc
                .stop_run(
                    &NoStop,
                    &RunId::from("stored"),
                    StopMode::Soft,
                    StopActor::new("t", "x"),
                    &all
                )
                .await,
            Err(RunsError::Conflict(_))
        ));
        assert_eq!(
            f.double.get_calls.load(Ordering::SeqCst),
            0,
            "409-vs-404 comes from the summary"
        );
        assert_eq!(
            f.svc
                .stop_run(
                    &NoStop,
                    &RunId::from("nope"),
                    StopMode::Soft,
                    StopActor::new("t", "x"),
                    &all
                )
                .await,
            Err(RunsError::NotFound)
        );
        // The supervisor's answers map one to one.
        for (answer, expected) in [
            (StopError::NotFound, RunsError::NotFound),
            (
                StopError::Finished,
                RunsError::Conflict("run live has finished".into()),
            ),
            (
                StopError::Unavailable("disk".into()),
                RunsError::Unavailable("disk".into()),
            ),
        ] {
            let s = FakeStopper {
                answer: Err(answer),
                asked: Mutex::default(),
            };
            assert_eq!(
                f.svc
                    .stop_run(
                        &s,
                        &RunId::from("live"),
                        StopMode::Soft,
                        StopActor::new("t", "x"),
                        &all
                    )
                    .await,
                Err(expected)
            );
        }
        // Storage failing on a run outside the registry: unavailable, nothing delegated.
        f.double.fail_ledger.store(true, Ordering::SeqCst);
        assert!(matches!(
            f.svc
                .stop_run(
                    &NoStop,
                    &RunId::from("remote"),
                    StopMode::Soft,
                    StopActor::new("t", "x"),
                    &all
                )
                .await,
            Err(RunsError::Unavailable(_))
        ));
    }

    #[tokio::test]
    async fn live_rows_never_carry_prompt_tools_state_or_request() {
        let f = fixture();
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 30, false, 0);
        let rows = f.svc.live_rows(&VisibilityFilter::All).await.unwrap();
        assert_eq!(rows.len(), 1);
        let s = serde_json::to_string(&rows).unwrap();
        assert!(
            !s.contains("SYSTEM PROMPT")
                && !s.contains("request")
                && !s.contains("\"state\"")
                && !s.contains("tools"),
            "{s}"
        );
        assert_eq!(
            (rows[0].owner_gen.as_str(), rows[0].phase.as_str()),
            (OTHER_GEN, "live")
        );
        f.double.fail_ledger.store(true, Ordering::SeqCst);
        assert!(matches!(
            f.svc.live_rows(&VisibilityFilter::All).await,
            Err(RunsError::Unavailable(_))
        ));
    }

    // ---- kills from other processes (SPEC §5.6): deletion fences checked before a registry row is served ----

    /// Every read of one run, as (get_run, get_run_events, get_run_friction, stop_run) answers not_found.
    async fn assert_not_served(f: &Fixture, id: &str) {
        let all = VisibilityFilter::All;
        assert_eq!(
            f.svc.get_run(&RunId::from(id), false, &all).await,
            Err(RunsError::NotFound),
            "{id}"
        );
        assert_eq!(
            f.svc.get_run(&RunId::from(id), true, &all).await,
            Err(RunsError::NotFound),
            "{id}"
        );
        assert_eq!(
            f.svc.get_run_events(&RunId::from(id), 0, None, &all).await,
            Err(RunsError::NotFound),
            "{id}"
        );
        assert_eq!(
            f.svc.get_run_friction(&RunId::from(id), &all).await,
            Err(RunsError::NotFound),
            "{id}"
        );
        let stop = f
            .svc
            .stop_run(
                &NoStop,
                &RunId::from(id),
                StopMode::Hard,
                StopActor::new("t", "x"),
                &all,
            )
            .await;
        assert_eq!(stop, Err(RunsError::NotFound), "{id}");
    }

    /// A finished registry row's point read asks its kill state and its final record in one read (the
    /// read a client polls after a run's end until it is persisted, issue 29), and serves it merged.
    #[tokio::test]
    async fn a_finished_registry_rows_kill_state_and_record_come_in_one_read() {
        let f = fixture();
        f.local("done", "c1", NOW - 900, Some(NOW - 100));
        let view = f
            .svc
            .get_run(&RunId::from("done"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(view.persisted, None, "no record yet");
        f.put(record(
            "done",
            "c1",
            NOW - 900,
            NOW - 100,
            false,
            events(2, NOW - 100),
        ));
        let view = f
            .svc
            .get_run(&RunId::from("done"), false, &VisibilityFilter::All)
            .await
            .unwrap();
        assert_eq!(view.persisted, Some(true), "merged with its record");
        assert_eq!(f.double.summary_and_kill_calls.load(Ordering::SeqCst), 2);
        assert_eq!(
            f.double.summary_calls.load(Ordering::SeqCst),
            2,
            "no other summary read"
        );
        assert_eq!(f.double.kill_reads(), 2, "no other kill read");
        f.kill_elsewhere("done");
        assert_eq!(
            f.svc
                .get_run(&RunId::from("done"), false, &VisibilityFilter::All)
                .await,
            Err(RunsError::NotFound)
        );
    }

    #[tokio::test]
    async fn a_registry_run_killed_in_another_process_vanishes_from_every_read_within_one_listing()
    {
        let f = fixture();
        f.local("done", "c1", NOW - 900, Some(NOW - 100));
        f.local("live", "c1", NOW - 50, None);
        f.local("kept", "c1", NOW - 800, Some(NOW - 200));
        f.put(record(
            "done",
            "c1",
            NOW - 900,
            NOW - 100,
            false,
            events(2, NOW - 100),
        ));
        assert_eq!(
            ids(&f.list(StatusFilter::All).await),
            ["live", "done", "kept"]
        );
        // Another process kills `done` (finished here, its record not purged yet) and `live` (still running
        // here: its owner learns of the fence at its next heartbeat, the registry row is still there).
        f.kill_elsewhere("done");
        f.kill_elsewhere("live");
        // The cached listing answered for both, and stands for its TTL.
        assert_eq!(
            ids(&f.list(StatusFilter::All).await),
            ["live", "done", "kept"]
        );
        assert!(
            f.svc
                .get_run(&RunId::from("done"), false, &VisibilityFilter::All)
                .await
                .is_ok(),
            "answered from the fresh listing"
        );
        // One listing later, neither is served from any source: not the registry, not the stored record.
        f.clock.advance(LEDGER_LIST_TTL_MS);
        for status in [
            StatusFilter::All,
            StatusFilter::Active,
            StatusFilter::Finished,
        ] {
            let list = f.list(status).await;
            assert!(!list.ledger_unavailable);
            let expected: &[&str] = if status == StatusFilter::Active {
                &[]
            } else {
                &["kept"]
            };
            assert_eq!(ids(&list), expected, "{status:?}");
        }
        assert_not_served(&f, "done").await;
        assert_not_served(&f, "live").await;
        let feed = f.svc.index_rows(&VisibilityFilter::All).await.0;
        assert_eq!(
            feed.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            ["kept"]
        );
        // The run nobody killed is served as before.
        assert!(f
            .svc
            .get_run(&RunId::from("kept"), true, &VisibilityFilter::All)
            .await
            .is_ok());
        assert!(f
            .svc
            .get_run_events(&RunId::from("kept"), 0, None, &VisibilityFilter::All)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn a_killed_ledger_row_lists_from_no_source_and_answers_not_found() {
        let f = fixture();
        // Live under another generation, which has not purged it yet; its tombstone is in the store.
        f.ledger_row("remote", "c1", OTHER_GEN, NOW - 300, false, 3);
        f.put(record("remote", "c1", NOW - 300, NOW - 300, true, vec![]));
        f.kill_elsewhere("remote");
        for status in [
            StatusFilter::All,
            StatusFilter::Active,
            StatusFilter::Finished,
        ] {
            assert!(f.list(status).await.runs.is_empty(), "{status:?}");
        }
        let all = VisibilityFilter::All;
        assert_eq!(
            f.svc.get_run(&RunId::from("remote"), true, &all).await,
            Err(RunsError::NotFound)
        );
        assert_eq!(
            f.svc
                .get_run_events(&RunId::from("remote"), 0, None, &all)
                .await,
            Err(RunsError::NotFound)
        );
        assert_eq!(
            f.svc.get_run_friction(&RunId::from("remote"), &all).await,
            Err(RunsError::NotFound)
        );
        assert!(f.svc.index_rows(&all).await.0.is_empty());
    }

    #[tokio::test]
    async fn a_killed_runs_tombstone_awaiting_its_purge_answers_not_found_from_every_point_read() {
        let f = fixture();
        // Killed, its live row gone already: only the tombstone in the store and the deletion fence remain.
        f.put(record("gone", "c1", NOW - 300, NOW - 300, true, vec![]));
        f.kill_elsewhere("gone");
        let all = VisibilityFilter::All;
        assert_eq!(
            f.svc.get_run(&RunId::from("gone"), true, &all).await,
            Err(RunsError::NotFound)
        );
        assert_eq!(
            f.svc
                .get_run_events(&RunId::from("gone"), 0, None, &all)
                .await,
            Err(RunsError::NotFound)
        );
        // A tombstone without a fence (a live run's) is still served.
        f.put(record("alive", "c2", NOW - 300, NOW - 300, true, vec![]));
        assert!(f
            .svc
            .get_run_events(&RunId::from("alive"), 0, None, &all)
            .await
            .is_ok());
    }
}
