//! The test double every `runs_service` test module shares: a [`Double`] — a real `MemoryStore` (store +
//! ledger) behind the [`RunSource`] seam, with call counters and switches that make the store or the
//! ledger fail — and a [`Fixture`] that wires it, a registry and a [`RunsService`] on one `ManualClock`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use storage::RunId;

use serde_json::{json, Value};
use storage::ledger::{Admit, LiveRow, Promotion, RunLedger};
use storage::record::{
    validate_record, ChannelVisibility, RunListItem, RunRecord, RunStatus, VisibilityFilter,
};
use storage::store::{EventsPage, ListPage, ListQuery, RunStore};
use storage::{Clock, Generation, ManualClock, MemoryStore};

use super::{ListParams, RunList, RunSource, RunsService, SourceFuture, StatusFilter};
use crate::registry::{Registry, RunMeta};

pub(super) const NOW: i64 = 1_800_000_000_000;
pub(super) const OTHER_GEN: &str = "20270115T080000Z-0000beef";

#[derive(Clone)]
pub(super) struct Double {
    pub(super) mem: MemoryStore,
    pub(super) clock: ManualClock,
    pub(super) fail_store: Arc<AtomicBool>,
    pub(super) fail_ledger: Arc<AtomicBool>,
    pub(super) list_calls: Arc<AtomicUsize>,
    pub(super) list_limits: Arc<Mutex<Vec<usize>>>,
    pub(super) get_calls: Arc<AtomicUsize>,
    pub(super) summary_calls: Arc<AtomicUsize>,
    pub(super) live_list_calls: Arc<AtomicUsize>,
    pub(super) live_event_calls: Arc<AtomicUsize>,
    /// Fails only `killed_among` (the rest of the ledger answers).
    pub(super) fail_kills: Arc<AtomicBool>,
    /// Every `killed_among` question, in order.
    pub(super) kill_questions: Arc<Mutex<Vec<Vec<RunId>>>>,
    /// `get_summary_and_killed` calls (each also counted as a summary call and a kill question).
    pub(super) summary_and_kill_calls: Arc<AtomicUsize>,
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
            live_event_calls: Arc::default(),
            fail_kills: Arc::default(),
            kill_questions: Arc::default(),
            summary_and_kill_calls: Arc::default(),
        }
    }

    pub(super) fn kill_reads(&self) -> usize {
        self.kill_questions.lock().unwrap().len()
    }

    fn store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut MemoryStore, i64) -> storage::Result<T>,
    ) -> SourceFuture<'_, T> {
        let out = if self.fail_store.load(Ordering::SeqCst) {
            Err(storage::Error::Unavailable("injected store failure".into()))
        } else {
            f(&mut self.mem.clone(), self.clock.now_ms())
        };
        Box::pin(std::future::ready(out))
    }

    fn ledger<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut MemoryStore) -> storage::Result<T>,
    ) -> SourceFuture<'_, T> {
        let out = if self.fail_ledger.load(Ordering::SeqCst) {
            Err(storage::Error::Unavailable(
                "injected ledger failure".into(),
            ))
        } else {
            f(&mut self.mem.clone())
        };
        Box::pin(std::future::ready(out))
    }
}

impl RunSource for Double {
    fn list(&self, query: ListQuery) -> SourceFuture<'_, ListPage> {
        self.list_calls.fetch_add(1, Ordering::SeqCst);
        self.list_limits
            .lock()
            .unwrap()
            .push(query.limit.unwrap_or(0));
        self.store(move |m, now| m.list(&query, now))
    }
    fn get(&self, id: RunId) -> SourceFuture<'_, Option<RunRecord>> {
        self.get_calls.fetch_add(1, Ordering::SeqCst);
        self.store(move |m, now| RunStore::get(m, &id, now))
    }
    fn get_summary(&self, id: RunId) -> SourceFuture<'_, Option<RunListItem>> {
        self.summary_calls.fetch_add(1, Ordering::SeqCst);
        self.store(move |m, now| m.get_summary(&id, now))
    }
    fn events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: Option<usize>,
    ) -> SourceFuture<'_, Option<EventsPage>> {
        self.store(move |m, now| RunStore::events(m, &id, after_seq, limit, now))
    }
    fn list_live(&self) -> SourceFuture<'_, Vec<LiveRow>> {
        self.live_list_calls.fetch_add(1, Ordering::SeqCst);
        self.ledger(|m| m.list_live())
    }
    fn get_live(&self, id: RunId) -> SourceFuture<'_, Option<LiveRow>> {
        self.ledger(move |m| m.get_live(&id))
    }
    fn live_events(
        &self,
        id: RunId,
        after_seq: u64,
        limit: usize,
    ) -> SourceFuture<'_, Option<Vec<Value>>> {
        self.live_event_calls.fetch_add(1, Ordering::SeqCst);
        self.ledger(move |m| m.live_events(&id, after_seq, limit))
    }
    fn killed_among(&self, ids: Vec<RunId>) -> SourceFuture<'_, Vec<RunId>> {
        let mut asked = ids.clone();
        asked.sort();
        self.kill_questions.lock().unwrap().push(asked);
        if self.fail_kills.load(Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(storage::Error::Unavailable(
                "injected kill read failure".into(),
            ))));
        }
        self.ledger(move |m| m.killed_among(&ids))
    }
    fn get_summary_and_killed(&self, id: RunId) -> SourceFuture<'_, (Option<RunListItem>, bool)> {
        self.summary_and_kill_calls.fetch_add(1, Ordering::SeqCst);
        let summary = self.get_summary(id.clone());
        let killed = self.killed_among(vec![id]);
        Box::pin(async move { Ok((summary.await?, !killed.await?.is_empty())) })
    }
}

pub(super) struct Fixture {
    pub(super) clock: ManualClock,
    pub(super) double: Double,
    pub(super) registry: Registry,
    pub(super) svc: RunsService,
}

pub(super) fn fixture() -> Fixture {
    let clock = ManualClock::new(NOW);
    let double = Double::new(&clock);
    let registry = Registry::new(Arc::new(clock.clone()));
    let gen = Generation::parse("20270115T090000Z-0000cafe").unwrap();
    let svc = RunsService::with_source(
        registry.clone(),
        Arc::new(double.clone()),
        gen,
        Arc::new(clock.clone()),
    );
    Fixture {
        clock,
        double,
        registry,
        svc,
    }
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

pub(super) fn record(
    id: &str,
    channel: &str,
    started: i64,
    finished: i64,
    provisional: bool,
    events: Vec<Value>,
) -> RunRecord {
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

pub(super) fn events(n: u64, at: i64) -> Vec<Value> {
    (1..=n).map(|s| json!({"type": "note", "kind": "k", "summary": format!("e{s}"), "seq": s, "at": at})).collect()
}

impl Fixture {
    pub(super) fn put(&self, r: RunRecord) {
        self.double.mem.clone().put(&r, None, NOW).unwrap();
    }

    /// A registry run with `n` events; finished when `finished` is given.
    pub(super) fn local(&self, id: &str, channel: &str, started: i64, finished: Option<i64>) {
        self.registry.create(
            &RunId::from(id),
            meta(channel, id),
            started,
            format!("secret-token-{id}"),
            vec![],
            1,
        );
        self.registry
            .publish(&RunId::from(id), json!({"type": "run_meta"}));
        self.registry.publish(
            &RunId::from(id),
            json!({"type": "input", "text": "hi", "source": "request"}),
        );
        if let Some(f) = finished {
            self.registry
                .finish(&RunId::from(id), RunStatus::Completed, f);
        }
    }

    /// A run live under `gen` in the ledger (promoted unless `attaching`), with `n` events.
    pub(super) fn ledger_row(
        &self,
        id: &str,
        channel: &str,
        gen: &str,
        started: i64,
        attaching: bool,
        n: u64,
    ) {
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
            writer: None,
            strategy: storage::ledger::Strategy::Steer,
        };
        m.admit(&admit, started).unwrap();
        if !attaching {
            let p = Promotion {
                system_text: "SYSTEM PROMPT".into(),
                tools: json!([]),
                state: Default::default(),
                lease_ms: 30_000,
            };
            m.claim(&RunId::from(id), gen, &p, started)
                .unwrap()
                .unwrap();
            if n > 0 {
                m.append(&RunId::from(id), gen, &events(n, started))
                    .unwrap()
                    .unwrap();
            }
        }
    }

    pub(super) async fn list(&self, status: StatusFilter) -> RunList {
        self.svc
            .list_runs(&ListParams::new(status, VisibilityFilter::All))
            .await
    }

    /// Another process kills `id`: its deletion fence lands in the shared ledger (and `stop = hard` on a
    /// live row); nothing reaches this process's registry.
    pub(super) fn kill_elsewhere(&self, id: &str) {
        self.double.mem.clone().kill(&RunId::from(id), NOW).unwrap();
    }
}

pub(super) fn ids(list: &RunList) -> Vec<&str> {
    list.runs.iter().map(|v| v.id.as_str()).collect()
}
