//! The in-process registry of runs this process drives: the live view's source of truth.
//!
//! Owns, per run: its summary row, the monotonic event counter, a bounded backlog of published events
//! (the protected head — `run_meta`, `input`, `context` — plus the newest), its capability token, and its
//! subscribers. A finished run leaves as soon as its record lands ([`Registry::landed`]); one whose record
//! did not land stays for [`FINISHED_TTL_MS`]. Memory therefore follows the live runs, not the history.
//!
//! Who uses it: run actors publish events (`publish` stamps `seq` and `at`); the read service and SSE
//! streams read snapshots and subscribe. Every published event also goes to the flusher, which appends
//! it to the ledger.
//!
//! Invariants:
//! - `seq` only grows per run; a resumed run continues past the highest replayed seq;
//! - an event is published once and shared: the backlog and every subscriber hold one reference-counted
//!   [`Published`] (its value and its JSON bytes), so a viewer costs pointers, not copies;
//! - the backlog is bounded in events and bytes ([`BACKLOG_LIMIT`], [`BACKLOG_BYTES`]) and a subscriber
//!   queue in events and bytes ([`SUBSCRIBER_QUEUE`], [`SUBSCRIBER_QUEUE_BYTES`]): a subscriber that falls
//!   behind is dropped and its queue released at once, never awaited — a slow viewer cannot slow a run
//!   or hold its memory;
//! - the lock is a `std::sync::Mutex` held only for map updates, never across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use storage::RunId;

use bytes::Bytes;
use serde_json::{json, Value};
use storage::ledger::StopMode;
use storage::record::RunStatus;
use storage::Clock;

use crate::queue::{self, SendError};

/// How long a finished run whose record did not land stays in the registry.
pub const FINISHED_TTL_MS: i64 = 60_000;
/// Default bound of a run's event backlog.
pub const BACKLOG_LIMIT: usize = 20_000;
/// Bound of a run's backlog in JSON bytes (the protected head aside): the newest events are kept, as
/// for the count. Above the record's byte budget (`storage::record::MAX_RECORD_BYTES`), so the record
/// a run writes is cut by its own budget, not by this one.
pub const BACKLOG_BYTES: usize = 8 * 1024 * 1024;
/// Per-subscriber queue bound in events; a subscriber this far behind is dropped.
pub const SUBSCRIBER_QUEUE: usize = 1024;
/// Per-subscriber queue bound in JSON bytes; a subscriber this far behind is dropped.
pub const SUBSCRIBER_QUEUE_BYTES: usize = 1024 * 1024;

/// An event as published: its value and its JSON, shared by the backlog and every subscriber.
#[derive(Debug, PartialEq)]
pub struct Published {
    pub event: Value,
    /// `event` serialized once (compact JSON, no newline).
    pub json: Bytes,
}

impl Published {
    pub fn new(event: Value) -> Arc<Self> {
        let json = Bytes::from(serde_json::to_vec(&event).unwrap_or_default());
        Arc::new(Published { event, json })
    }

    /// The last frame a subscription gets when its run finishes: the stream's `end` (`{status,
    /// finishedAt}`), so a subscriber learns how the run ended from its own queue, whether or not the
    /// registry still holds the run when it reads it.
    fn end(status: RunStatus, finished_at: i64) -> Arc<Self> {
        Published::new(json!({"status": status.as_str(), "finishedAt": finished_at}))
    }

    /// The run's end ([`Published::end`]: no `type`, no `seq`) as `(status, finishedAt)`, or `None` for
    /// an event.
    pub fn as_end(&self) -> Option<(RunStatus, i64)> {
        if self.event.get("type").is_some() {
            return None;
        }
        let status = RunStatus::parse(self.event.get("status")?.as_str()?)?;
        Some((status, self.event.get("finishedAt")?.as_i64()?))
    }

    /// What a queue or backlog counts it as.
    pub fn bytes(&self) -> usize {
        self.json.len()
    }
}

/// A subscriber's end of a run's events (and its ephemeral frames).
pub type Subscription = queue::Receiver<Arc<Published>>;

/// Event types kept at the head of the backlog whatever its length.
const HEAD_TYPES: [&str; 3] = ["run_meta", "input", "context"];

/// Identity of a run, as stamped on `run_meta`, the ledger row's meta and the record: one typed
/// encoder and decoder for all three.
pub type RunMeta = storage::ledger::RunIdentity;

/// How long [`Registry::recently_landed`] remembers a landed run: as long as a cached ledger listing
/// may be served (`runs_service::LEDGER_LIST_TTL_MS`).
pub const LANDED_MEMORY_MS: i64 = 2_000;

/// Ids of recently landed runs, oldest first; bounded by the landing rate times [`LANDED_MEMORY_MS`].
#[derive(Default)]
struct Landed {
    order: VecDeque<(i64, RunId)>,
    ids: std::collections::HashSet<RunId>,
}

impl Landed {
    fn forget_before(&mut self, cutoff: i64) {
        while self.order.front().is_some_and(|(at, _)| *at < cutoff) {
            if let Some((_, id)) = self.order.pop_front() {
                self.ids.remove(&id);
            }
        }
    }
}

/// A run's row as readers see it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub id: RunId,
    pub meta: RunMeta,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub status: Option<RunStatus>,
    pub stop: Option<StopMode>,
    /// Events published so far (the record's `eventCount`).
    pub event_count: u64,
    /// Events still in the backlog.
    pub stored_event_count: u64,
    /// The backlog dropped events from its middle.
    pub truncated: bool,
    /// Resumes and effects-unknown results among every event published (not only the backlog's).
    pub marks: crate::runs_service::Marks,
}

struct Entry {
    row: RunRow,
    token: String,
    last_seq: u64,
    head: Vec<Arc<Published>>,
    tail: VecDeque<Arc<Published>>,
    /// JSON bytes of `tail`.
    tail_bytes: usize,
    subscribers: Vec<queue::Sender<Arc<Published>>>,
}

impl Entry {
    /// The backlog, as shared references (cheap under the lock).
    fn events(&self) -> Vec<Arc<Published>> {
        self.head.iter().chain(self.tail.iter()).cloned().collect()
    }

    /// Hand `p` to every subscriber; one that has no room is dropped (its queue released at once).
    fn fan_out(&mut self, id: &RunId, p: &Arc<Published>) {
        self.subscribers
            .retain(|s| match s.try_send(p.clone(), p.bytes()) {
                Ok(()) => true,
                Err(SendError::Overflow) => {
                    tracing::warn!(run_id = %id, "dropped a subscriber that fell behind");
                    false
                }
                Err(SendError::Closed) => false,
            });
    }
}

/// Values of shared events, copied outside the registry lock.
fn values(events: Vec<Arc<Published>>) -> Vec<Value> {
    events.iter().map(|p| p.event.clone()).collect()
}

/// Shared handle; clones see one registry.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Mutex<HashMap<RunId, Entry>>>,
    /// Runs whose record landed in the last [`LANDED_MEMORY_MS`]: a ledger listing cached before the
    /// landing still shows them live, and readers must not serve that (see [`Registry::recently_landed`]).
    landed: Arc<Mutex<Landed>>,
    clock: Arc<dyn Clock>,
    backlog_limit: usize,
    /// Applied to every event before it is stored or shown (SPEC §8.3 redaction).
    redactor: Arc<crate::redact::Redactor>,
    /// How many runs `inner` holds, after each change of it ([`Registry::held`]).
    held: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_backlog_limit(clock, BACKLOG_LIMIT)
    }

    pub fn with_backlog_limit(clock: Arc<dyn Clock>, backlog_limit: usize) -> Self {
        let redactor = Arc::new(crate::redact::Redactor::default());
        Registry {
            inner: Arc::default(),
            landed: Arc::default(),
            clock,
            backlog_limit: backlog_limit.max(4),
            redactor,
            held: Arc::default(),
        }
    }

    /// How many runs the registry holds — live, or finished with their record still to land — kept
    /// current as rows come and go: what tells the storage handle a run is alone
    /// ([`storage::StorageHandle::here_when_alone`]).
    pub fn held(&self) -> Arc<AtomicUsize> {
        self.held.clone()
    }

    /// Remove `id`'s row, if any, and count what is left.
    fn remove(&self, id: &RunId) {
        let mut map = self.lock();
        map.remove(id);
        self.held.store(map.len(), Ordering::SeqCst);
    }

    /// The same registry redacting with `redactor` (the built-in rules plus `[redaction] patterns`).
    pub fn with_redactor(mut self, redactor: Arc<crate::redact::Redactor>) -> Self {
        self.redactor = redactor;
        self
    }

    /// The redactor every published event goes through.
    pub fn redactor(&self) -> &crate::redact::Redactor {
        &self.redactor
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RunId, Entry>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Create (or re-create, on resume) a run's row. `replay` events keep their seqs; the counter
    /// continues at `next_seq` (at least one past the highest replayed).
    pub fn create(
        &self,
        id: &RunId,
        meta: RunMeta,
        started_at: i64,
        token: String,
        replay: Vec<Value>,
        next_seq: u64,
    ) {
        let mut map = self.lock();
        let highest = replay
            .iter()
            .filter_map(storage::record::event_seq)
            .max()
            .unwrap_or(0);
        let mut entry = Entry {
            row: RunRow {
                id: id.to_owned(),
                meta,
                started_at,
                finished_at: None,
                status: None,
                stop: None,
                event_count: 0,
                stored_event_count: 0,
                truncated: false,
                marks: crate::runs_service::Marks::of(&replay),
            },
            token,
            last_seq: highest.max(next_seq.saturating_sub(1)),
            head: Vec::new(),
            tail: VecDeque::new(),
            tail_bytes: 0,
            subscribers: Vec::new(),
        };
        // Counts are event counts, never seqs: a resumed run's seqs jump past what the dead process may
        // have published (SPEC §5.2 step 5).
        entry.row.event_count = replay.len() as u64;
        for mut e in replay {
            self.redactor.redact_event(&mut e);
            Self::store(&mut entry, Published::new(e), self.backlog_limit);
        }
        map.insert(id.to_owned(), entry);
        self.held.store(map.len(), Ordering::SeqCst);
    }

    fn store(entry: &mut Entry, event: Arc<Published>, limit: usize) {
        let is_head = entry.tail.is_empty()
            && event
                .event
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| HEAD_TYPES.contains(&t));
        if is_head {
            entry.head.push(event);
        } else {
            entry.tail_bytes += event.bytes();
            entry.tail.push_back(event);
            // The newest event always stays, whatever its size.
            while entry.tail.len() > 1
                && (entry.head.len() + entry.tail.len() > limit || entry.tail_bytes > BACKLOG_BYTES)
            {
                if let Some(old) = entry.tail.pop_front() {
                    entry.tail_bytes -= old.bytes();
                }
                entry.row.truncated = true;
            }
        }
        entry.row.stored_event_count = (entry.head.len() + entry.tail.len()) as u64;
    }

    /// Stamp `event` with the next seq and `at`, keep it, fan it out; answers the stamped event.
    pub fn publish(&self, id: &RunId, event: Value) -> Option<Value> {
        let now = self.clock.now_ms();
        let mut map = self.lock();
        let entry = map.get_mut(id)?;
        let event = self.stamped(entry.last_seq + 1, now, event);
        self.show(id, entry, event.clone());
        Some(event)
    }

    /// `event` stamped as the run's next event (seq, time, redaction, cap) but not published: a record
    /// sealed before its last event is shown carries it, and [`Registry::publish_stamped`] then shows it
    /// exactly so. `None` for a run not here.
    pub fn stamp(&self, id: &RunId, event: Value) -> Option<Value> {
        let now = self.clock.now_ms();
        let last = self.lock().get(id)?.last_seq;
        Some(self.stamped(last + 1, now, event))
    }

    /// Publish an event [`Registry::stamp`] stamped, as stamped. `false` (nothing shown) when the run is
    /// not here or another event took that seq meanwhile.
    pub fn publish_stamped(&self, id: &RunId, event: Value) -> bool {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(id) else {
            return false;
        };
        if storage::record::event_seq(&event) != Some(entry.last_seq + 1) {
            return false;
        }
        self.show(id, entry, event);
        true
    }

    fn stamped(&self, seq: u64, now: i64, mut event: Value) -> Value {
        event["seq"] = json!(seq);
        event["at"] = json!(now);
        self.redactor.redact_event(&mut event);
        // No event over 64 KiB is ever published: its text is capped here, the full text stays in the
        // request and the transcript (SPEC §4.3 `append`).
        storage::record::cap_event_for_publish(event)
    }

    /// Keep a stamped event as the run's next and send it to the live subscribers.
    fn show(&self, id: &RunId, entry: &mut Entry, event: Value) {
        entry.last_seq = storage::record::event_seq(&event).unwrap_or(entry.last_seq + 1);
        entry.row.event_count += 1;
        entry.row.marks.observe(&event);
        let shared = Published::new(event);
        Self::store(entry, shared.clone(), self.backlog_limit);
        entry.fan_out(id, &shared);
    }

    /// Send an ephemeral frame (a streamed `assistant_delta`) to this run's live subscribers: no seq, never
    /// stored, never replayed; a subscriber that fell behind is dropped as for any event.
    pub fn broadcast(&self, id: &RunId, frame: Value) {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(id) else { return };
        if !entry.subscribers.is_empty() {
            entry.fan_out(id, &Published::new(frame));
        }
    }

    /// Events strictly after `after_seq` (shared, so a replay of a long run costs pointers under the lock)
    /// and a subscription to the ones published from now on.
    pub fn subscribe(
        &self,
        id: &RunId,
        after_seq: u64,
    ) -> Option<(Vec<Arc<Published>>, Subscription, bool)> {
        let mut map = self.lock();
        let entry = map.get_mut(id)?;
        let backlog: Vec<Arc<Published>> = entry
            .events()
            .into_iter()
            .filter(|p| storage::record::event_seq(&p.event).is_some_and(|s| s > after_seq))
            .collect();
        let (tx, rx) = queue::bounded(SUBSCRIBER_QUEUE, SUBSCRIBER_QUEUE_BYTES);
        let finished = entry.row.finished_at.is_some();
        if !finished {
            entry.subscribers.push(tx);
        }
        Some((backlog, rx, finished))
    }

    /// Live subscribers across every run.
    pub fn subscriber_count(&self) -> usize {
        self.lock()
            .values()
            .map(|e| e.subscribers.iter().filter(|s| !s.is_closed()).count())
            .sum()
    }

    /// JSON bytes queued for subscribers across every run (what viewers pin beyond the backlogs).
    pub fn subscriber_queued_bytes(&self) -> usize {
        self.lock()
            .values()
            .flat_map(|e| e.subscribers.iter())
            .map(queue::Sender::queued_bytes)
            .sum()
    }

    pub fn row(&self, id: &RunId) -> Option<RunRow> {
        self.lock().get(id).map(|e| e.row.clone())
    }

    pub fn rows(&self) -> Vec<RunRow> {
        self.lock().values().map(|e| e.row.clone()).collect()
    }

    /// Call `f` with the backlog's events, read in place under the lock (no copy: keep `f` short).
    pub fn with_backlog<R>(&self, id: &RunId, f: impl FnOnce(&[&Value]) -> R) -> Option<R> {
        let map = self.lock();
        let entry = map.get(id)?;
        let events: Vec<&Value> = entry
            .head
            .iter()
            .chain(entry.tail.iter())
            .map(|p| &p.event)
            .collect();
        Some(f(&events))
    }

    /// The row and every backlog event.
    pub fn snapshot(&self, id: &RunId) -> Option<(RunRow, Vec<Value>)> {
        let (row, events) = self.lock().get(id).map(|e| (e.row.clone(), e.events()))?;
        Some((row, values(events)))
    }

    pub fn token(&self, id: &RunId) -> Option<String> {
        self.lock().get(id).map(|e| e.token.clone())
    }

    pub fn last_seq(&self, id: &RunId) -> Option<u64> {
        self.lock().get(id).map(|e| e.last_seq)
    }

    pub fn set_stop(&self, id: &RunId, stop: StopMode) {
        if let Some(e) = self.lock().get_mut(id) {
            e.row.stop = Some(e.row.stop.map_or(stop, |s| s.max(stop)));
        }
    }

    /// Mark the run finished; each subscriber gets the run's end ([`Published::as_end`]) as its last
    /// frame, then its queue closes.
    pub fn finish(&self, id: &RunId, status: RunStatus, finished_at: i64) {
        if let Some(e) = self.lock().get_mut(id) {
            e.row.status = Some(status);
            e.row.finished_at = Some(finished_at);
            let end = Published::end(status, finished_at);
            e.fan_out(id, &end);
            e.subscribers.clear();
        }
    }

    /// The run's final record landed: the store serves it from now on, so the registry forgets it at
    /// once. Holding finished runs for a while would make memory grow with the admission rate, not with
    /// the live runs (about 15 KB a run at 500 runs/s over a minute).
    pub fn landed(&self, id: &RunId) {
        let now = self.clock.now_ms();
        let mut landed = self.landed.lock().unwrap_or_else(|p| p.into_inner());
        landed.forget_before(now - LANDED_MEMORY_MS);
        landed.order.push_back((now, id.to_owned()));
        landed.ids.insert(id.to_owned());
        drop(landed);
        self.remove(id);
    }

    /// Whether `id`'s record landed in the last [`LANDED_MEMORY_MS`] — here, or on another host as its
    /// news said: a ledger row of it in a listing cached before that is stale, and the store serves it.
    pub fn recently_landed(&self, id: &RunId) -> bool {
        let mut landed = self.landed.lock().unwrap_or_else(|p| p.into_inner());
        landed.forget_before(self.clock.now_ms() - LANDED_MEMORY_MS);
        landed.ids.contains(id)
    }

    /// Forget a run entirely (a fenced or killed run, or one handed to another process).
    pub fn discard(&self, id: &RunId) {
        self.remove(id);
    }

    /// Drop finished rows older than the TTL: runs whose record did not land (a failing store), which the
    /// registry serves meanwhile.
    pub fn evict_expired(&self) {
        let now = self.clock.now_ms();
        let mut map = self.lock();
        map.retain(|_, e| e.row.finished_at.is_none_or(|f| now - f < FINISHED_TTL_MS));
        self.held.store(map.len(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::record::ChannelVisibility;
    use storage::ManualClock;

    fn meta() -> RunMeta {
        RunMeta {
            agent: "demo".into(),
            model: "scripted".into(),
            label: "l".into(),
            thread_key: "c:t".into(),
            channel_id: "c".into(),
            user_id: "u".into(),
            channel_visibility: ChannelVisibility::Machine,
            parent_run_id: None,
        }
    }

    /// The count the storage handle reads to know a run is alone follows every way a row comes and
    /// goes: created (a re-create of the same id is one row), finished (still held), landed, discarded,
    /// expired.
    #[test]
    fn held_counts_the_rows_through_every_change() {
        let clock = ManualClock::new(1000);
        let r = Registry::new(Arc::new(clock.clone()));
        let held = r.held();
        let n = || held.load(Ordering::SeqCst);
        for id in ["a", "b", "c"] {
            r.create(&RunId::from(id), meta(), 1000, "tok".into(), vec![], 1);
        }
        r.create(&RunId::from("a"), meta(), 1000, "tok".into(), vec![], 1);
        assert_eq!(n(), 3);
        r.finish(&RunId::from("a"), RunStatus::Completed, 1000);
        assert_eq!(n(), 3, "finished, its record still to land");
        r.landed(&RunId::from("a"));
        assert_eq!(n(), 2);
        r.discard(&RunId::from("b"));
        assert_eq!(n(), 1);
        r.finish(&RunId::from("c"), RunStatus::Completed, 1000);
        clock.advance(FINISHED_TTL_MS + 1);
        r.evict_expired();
        assert_eq!(n(), 0);
    }

    #[test]
    fn publish_stamps_monotonic_seqs_and_fans_out() {
        let clock = ManualClock::new(1000);
        let r = Registry::new(Arc::new(clock.clone()));
        r.create(&RunId::from("r1"), meta(), 1000, "tok".into(), vec![], 1);
        let (backlog, mut rx, finished) = r.subscribe(&RunId::from("r1"), 0).unwrap();
        assert!(backlog.is_empty() && !finished);
        let a = r
            .publish(&RunId::from("r1"), json!({"type": "run_meta"}))
            .unwrap();
        clock.advance(5);
        let b = r
            .publish(&RunId::from("r1"), json!({"type": "input", "text": "hi"}))
            .unwrap();
        assert_eq!(
            (a["seq"].as_u64(), b["seq"].as_u64(), b["at"].as_i64()),
            (Some(1), Some(2), Some(1005))
        );
        assert_eq!(rx.try_recv().unwrap().event["seq"], 1);
        assert_eq!(rx.try_recv().unwrap().event["seq"], 2);
        assert_eq!(r.row(&RunId::from("r1")).unwrap().event_count, 2);
    }

    /// A sealed run's answer: stamped before its record commits, shown after exactly as stamped — unless
    /// another event took its seq meanwhile. A finish ends each subscription with the run's end.
    #[test]
    fn a_stamped_event_is_shown_as_stamped_and_a_finish_ends_the_queue_with_the_end() {
        let clock = ManualClock::new(1000);
        let r = Registry::new(Arc::new(clock.clone()));
        r.create(&RunId::from("r1"), meta(), 1000, "tok".into(), vec![], 1);
        let (_, mut rx, _) = r.subscribe(&RunId::from("r1"), 0).unwrap();
        let stamped = r
            .stamp(&RunId::from("r1"), json!({"type": "answer", "text": "a"}))
            .unwrap();
        assert_eq!(
            (stamped["seq"].as_u64(), stamped["at"].as_i64()),
            (Some(1), Some(1000))
        );
        assert!(rx.try_recv().is_none(), "stamped, not shown");
        clock.advance(7);
        assert!(r.publish_stamped(&RunId::from("r1"), stamped.clone()));
        assert_eq!(rx.try_recv().unwrap().event, stamped, "shown as stamped");
        assert_eq!(r.row(&RunId::from("r1")).unwrap().event_count, 1);
        let late = r
            .stamp(&RunId::from("r1"), json!({"type": "answer", "text": "b"}))
            .unwrap();
        r.publish(&RunId::from("r1"), json!({"type": "note"}))
            .unwrap();
        assert!(
            !r.publish_stamped(&RunId::from("r1"), late),
            "its seq was taken"
        );
        assert_eq!(rx.try_recv().unwrap().event["type"], "note");

        r.finish(&RunId::from("r1"), RunStatus::Completed, 1010);
        let end = rx.try_recv().unwrap();
        assert_eq!(end.as_end(), Some((RunStatus::Completed, 1010)));
        assert_eq!(
            &end.json[..],
            br#"{"finishedAt":1010,"status":"completed"}"#
        );
        assert!(rx.try_recv().is_none(), "the queue closed");
        assert_eq!(Published::new(stamped).as_end(), None, "an event is no end");
    }

    #[test]
    fn a_bounded_backlog_keeps_the_protected_head_and_the_newest() {
        let r = Registry::with_backlog_limit(Arc::new(ManualClock::new(0)), 6);
        r.create(&RunId::from("r"), meta(), 0, "t".into(), vec![], 1);
        r.publish(&RunId::from("r"), json!({"type": "run_meta"}));
        r.publish(&RunId::from("r"), json!({"type": "input"}));
        for i in 0..10 {
            r.publish(&RunId::from("r"), json!({"type": "note", "i": i}));
        }
        let (row, events) = r.snapshot(&RunId::from("r")).unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, [1, 2, 9, 10, 11, 12]);
        assert_eq!(
            (row.event_count, row.stored_event_count, row.truncated),
            (12, 6, true)
        );
    }

    #[test]
    fn a_resumed_run_replays_under_original_seqs_and_continues_past_them() {
        let r = Registry::new(Arc::new(ManualClock::new(0)));
        let replay = vec![
            json!({"type": "run_meta", "seq": 1}),
            json!({"type": "input", "seq": 2}),
            json!({"type": "assistant", "seq": 7}),
        ];
        r.create(&RunId::from("r"), meta(), 0, "t".into(), replay, 1007);
        let (backlog, _rx, _) = r.subscribe(&RunId::from("r"), 2).unwrap();
        assert_eq!(backlog.len(), 1);
        assert_eq!(
            r.publish(&RunId::from("r"), json!({"type": "resumed"}))
                .unwrap()["seq"],
            1007
        );
    }

    #[test]
    fn an_oversized_event_is_capped_when_published_and_a_small_one_is_untouched() {
        let r = Registry::new(Arc::new(ManualClock::new(0)));
        r.create(&RunId::from("r"), meta(), 0, "t".into(), vec![], 1);
        let big = r
            .publish(
                &RunId::from("r"),
                json!({"type": "input", "text": "é".repeat(100_000), "source": "request"}),
            )
            .unwrap();
        let bytes = big.to_string().len();
        assert!(
            bytes <= storage::record::MAX_EVENT_BYTES
                && bytes > storage::record::MAX_EVENT_BYTES - 16,
            "{bytes}"
        );
        assert_eq!(big["truncated"], true);
        assert!(big["text"].as_str().unwrap().ends_with('…'));
        let small = r
            .publish(&RunId::from("r"), json!({"type": "input", "text": "hi"}))
            .unwrap();
        assert_eq!(
            (small["text"].as_str(), small.get("truncated")),
            (Some("hi"), None)
        );
        // What subscribers and the backlog hold is the capped event.
        let (backlog, _rx, _) = r.subscribe(&RunId::from("r"), 0).unwrap();
        assert_eq!(backlog[0].event, big);
        assert_eq!(backlog[0].json, big.to_string().as_bytes());
    }

    #[test]
    fn the_backlog_is_bounded_in_bytes_keeping_the_head_and_the_newest() {
        let r = Registry::new(Arc::new(ManualClock::new(0)));
        r.create(&RunId::from("r"), meta(), 0, "t".into(), vec![], 1);
        r.publish(&RunId::from("r"), json!({"type": "run_meta"}));
        r.publish(
            &RunId::from("r"),
            json!({"type": "input", "text": "x".repeat(60_000)}),
        );
        let n = 2 * BACKLOG_BYTES / 60_000;
        for _ in 0..n {
            r.publish(
                &RunId::from("r"),
                json!({"type": "note", "text": "y".repeat(60_000)}),
            );
        }
        let (row, events) = r.snapshot(&RunId::from("r")).unwrap();
        let bytes: usize = events[2..].iter().map(|e| e.to_string().len()).sum();
        assert!(
            bytes <= BACKLOG_BYTES && bytes > BACKLOG_BYTES - 70_000,
            "{bytes}"
        );
        assert_eq!(
            (events[0]["type"].as_str(), events[1]["type"].as_str()),
            (Some("run_meta"), Some("input"))
        );
        assert_eq!(
            events.last().unwrap()["seq"],
            n as u64 + 2,
            "the newest stays"
        );
        assert!(row.truncated && row.event_count == n as u64 + 2);
    }

    #[test]
    fn a_subscriber_behind_by_bytes_is_dropped_and_its_queue_released_at_once() {
        let r = Registry::new(Arc::new(ManualClock::new(0)));
        r.create(&RunId::from("r"), meta(), 0, "t".into(), vec![], 1);
        let (_, mut stalled, _) = r.subscribe(&RunId::from("r"), 0).unwrap();
        let (_, mut reading, _) = r.subscribe(&RunId::from("r"), 0).unwrap();
        let per = 60_000;
        for _ in 0..SUBSCRIBER_QUEUE_BYTES / per {
            r.publish(
                &RunId::from("r"),
                json!({"type": "note", "text": "z".repeat(per)}),
            );
            assert!(reading.try_recv().is_some());
        }
        assert!(r.subscriber_queued_bytes() > SUBSCRIBER_QUEUE_BYTES - 2 * per);
        // Far fewer than SUBSCRIBER_QUEUE events: the byte bound is what drops it.
        r.publish(
            &RunId::from("r"),
            json!({"type": "note", "text": "z".repeat(per)}),
        );
        assert_eq!(
            r.subscriber_count(),
            1,
            "the stalled subscriber is dropped, the reading one kept"
        );
        assert!(reading.try_recv().is_some());
        assert_eq!(
            r.subscriber_queued_bytes(),
            0,
            "nothing stays pinned for the dropped one"
        );
        assert!(
            stalled.try_recv().is_none(),
            "it sees the end without draining"
        );
    }

    #[test]
    fn a_slow_subscriber_is_dropped_and_never_blocks_publishing() {
        let r = Registry::new(Arc::new(ManualClock::new(0)));
        r.create(&RunId::from("r"), meta(), 0, "t".into(), vec![], 1);
        let (_, rx, _) = r.subscribe(&RunId::from("r"), 0).unwrap();
        for _ in 0..SUBSCRIBER_QUEUE + 10 {
            r.publish(&RunId::from("r"), json!({"type": "note"}));
        }
        drop(rx);
        assert_eq!(r.lock().get("r").unwrap().subscribers.len(), 0);
    }

    #[test]
    fn finished_rows_expire_after_the_ttl() {
        let clock = ManualClock::new(0);
        let r = Registry::new(Arc::new(clock.clone()));
        r.create(&RunId::from("r"), meta(), 0, "t".into(), vec![], 1);
        r.finish(&RunId::from("r"), RunStatus::Completed, 0);
        clock.advance(FINISHED_TTL_MS - 1);
        r.evict_expired();
        assert!(r.row(&RunId::from("r")).is_some());
        clock.advance(1);
        r.evict_expired();
        assert!(r.row(&RunId::from("r")).is_none());
    }
}
