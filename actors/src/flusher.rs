//! `Flusher`: batches published events and appends them to the ledger.
//!
//! Owns the pending batches, per run. A [`Push`] never blocks the publisher (`do_send` into the
//! mailbox); a run's batch is appended when it reaches [`FLUSH_EVENTS`] events, and every batch every
//! [`FLUSH_INTERVAL`] ([`SHARED_FLUSH_INTERVAL`] on storage other hosts follow). A failed or refused batch is reported (log + counter) and dropped: the transcript,
//! not the event stream, is what a resume rebuilds from, and the finish record carries every event.
//!
//! Invariant: appends carry the run's generation, so a fenced process's late batch changes nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use actix::{Actor, AsyncContext, Context, Handler, Message};
use serde_json::Value;
use storage::ledger::Refusal;
use storage::StorageHandle;

pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// The interval on storage other hosts follow over cross-host news (PostgreSQL): a follower there reads
/// an event when it commits, and a run's later events wait behind a gap until the flush fills it, so
/// this bounds the cross-host delivery lag. At most 20 group-committed appends a second per process.
pub const SHARED_FLUSH_INTERVAL: Duration = Duration::from_millis(50);
pub const FLUSH_EVENTS: usize = 32;

/// One published event for a run's ledger row.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Push {
    pub run_id: RunId,
    pub gen: String,
    pub event: Value,
}

/// Append everything pending for one run now (answers when the append settled).
#[derive(Message)]
#[rtype(result = "()")]
pub struct FlushRun(pub RunId);

/// Drop whatever is pending for a finished run: its record carries every event already.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget(pub RunId);

/// A durable step of `run_id` committed the events of these seqs: a pending copy of one (a
/// `tool_result` is published to both) is not appended again.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Committed {
    pub run_id: RunId,
    pub seqs: Vec<u64>,
}

pub struct Flusher {
    storage: StorageHandle,
    /// Run id → (the generation of its latest push, its pending events in push order).
    pending: BTreeMap<RunId, (String, Vec<Value>)>,
    /// Batches refused or failed; shared with the metrics.
    failures: Arc<AtomicU64>,
    /// How often every pending batch is appended ([`FLUSH_INTERVAL`] or [`SHARED_FLUSH_INTERVAL`]; tests set it).
    every: Duration,
}

impl Flusher {
    /// A flusher at [`FLUSH_INTERVAL`], or [`SHARED_FLUSH_INTERVAL`] when the storage has cross-host news.
    pub fn new(storage: StorageHandle, failures: Arc<AtomicU64>) -> Self {
        let every = if storage.has_news() {
            SHARED_FLUSH_INTERVAL
        } else {
            FLUSH_INTERVAL
        };
        Self::with_interval(storage, failures, every)
    }

    /// A flusher that appends every pending batch each `every` (tests shorten or lengthen it).
    pub fn with_interval(
        storage: StorageHandle,
        failures: Arc<AtomicU64>,
        every: Duration,
    ) -> Self {
        Flusher {
            storage,
            pending: BTreeMap::new(),
            failures,
            every,
        }
    }

    fn take(&mut self, run_id: &RunId) -> Option<(String, Vec<Value>)> {
        self.pending
            .remove(run_id)
            .filter(|(_, evs)| !evs.is_empty())
    }

    fn append(
        &self,
        run_id: RunId,
        gen: String,
        events: Vec<Value>,
    ) -> impl std::future::Future<Output = ()> + 'static {
        let storage = self.storage.clone();
        let failures = self.failures.clone();
        async move {
            let n = events.len();
            match storage.append(run_id.clone(), gen.clone(), events).await {
                Ok(Ok(())) => {}
                // The run ended (sealed, closed, killed) between the push and this batch: its record
                // was assembled from every event it published, these included, so nothing is missing.
                Ok(Err(Refusal::UnknownRun { .. })) => {
                    tracing::debug!(
                        %run_id,
                        generation = gen,
                        events = n,
                        "event batch after the run ended; its record holds them"
                    );
                }
                Ok(Err(refusal)) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%run_id, generation = gen, events = n, %refusal, "event batch refused by the ledger");
                }
                Err(e) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%run_id, generation = gen, events = n, error = %e, "event batch failed");
                }
            }
        }
    }
}

impl Actor for Flusher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |act, ctx| {
            let ids: Vec<RunId> = act.pending.keys().cloned().collect();
            for id in ids {
                if let Some((gen, events)) = act.take(&id) {
                    ctx.spawn(actix::fut::wrap_future(act.append(id, gen, events)));
                }
            }
        });
    }
}

impl Handler<Push> for Flusher {
    type Result = ();

    fn handle(&mut self, msg: Push, ctx: &mut Context<Self>) {
        let entry = self
            .pending
            .entry(msg.run_id.clone())
            .or_insert_with(|| (msg.gen.clone(), Vec::new()));
        entry.0 = msg.gen;
        entry.1.push(msg.event);
        if entry.1.len() >= FLUSH_EVENTS {
            if let Some((gen, events)) = self.take(&msg.run_id) {
                ctx.spawn(actix::fut::wrap_future(
                    self.append(msg.run_id, gen, events),
                ));
            }
        }
    }
}

impl Handler<FlushRun> for Flusher {
    type Result = actix::ResponseFuture<()>;

    fn handle(&mut self, msg: FlushRun, _ctx: &mut Context<Self>) -> Self::Result {
        match self.take(&msg.0) {
            Some((gen, events)) => Box::pin(self.append(msg.0, gen, events)),
            None => Box::pin(async {}),
        }
    }
}

impl Handler<Committed> for Flusher {
    type Result = ();

    fn handle(&mut self, msg: Committed, _ctx: &mut Context<Self>) {
        if let Some((_, events)) = self.pending.get_mut(&msg.run_id) {
            events.retain(|e| {
                !storage::record::event_seq(e).is_some_and(|seq| msg.seqs.contains(&seq))
            });
            if events.is_empty() {
                self.pending.remove(&msg.run_id);
            }
        }
    }
}

impl Handler<Forget> for Flusher {
    type Result = ();

    fn handle(&mut self, msg: Forget, _ctx: &mut Context<Self>) {
        self.pending.remove(&msg.0);
    }
}

#[cfg(test)]
mod tests {
    //! The flusher against the in-memory ledger: batches land by count at once and by time at the
    //! interval, `FlushRun` lands a batch now, `Forget` drops one, and a refused batch is counted and
    //! dropped — never re-sent under a later push's generation.

    use super::*;
    use actix::Addr;
    use serde_json::json;
    use storage::ledger::{Admit, Promotion};
    use storage::{BackendSpec, ManualClock, MemoryStore};

    const NOW: i64 = 1_800_000_000_000;
    const GEN: &str = "20260101T000000Z-00000001";
    const OTHER_GEN: &str = "20260101T000000Z-00000002";
    /// Long enough that no tick falls inside a test that means to see batching by count alone.
    const NEVER: Duration = Duration::from_secs(3600);

    /// A storage actor over a fresh memory backend with one live run `r`, owned by [`GEN`].
    async fn storage_with_run() -> StorageHandle {
        let h = StorageHandle::start(
            BackendSpec::Memory(MemoryStore::new()),
            Arc::new(ManualClock::new(NOW)),
        );
        let admit = Admit {
            thread_key: "c:t".into(),
            gen: GEN.into(),
            run_id: "r".into(),
            request: json!({"text": "x"}),
            meta: json!({"agent": "demo", "request": {"text": "x"}}),
            key: None,
            lease_ms: 30_000,
            writer: None,
            strategy: storage::ledger::Strategy::Steer,
        };
        h.admit(admit, NOW).await.unwrap();
        let p = Promotion {
            system_text: "s".into(),
            tools: json!([]),
            state: Default::default(),
            lease_ms: 30_000,
        };
        h.claim("r".into(), GEN.into(), p).await.unwrap().unwrap();
        h
    }

    fn ev(seq: u64) -> Value {
        json!({"type": "note", "seq": seq, "at": NOW, "kind": "k", "summary": format!("n{seq}")})
    }

    /// The seqs the ledger holds for `r`.
    async fn stored(h: &StorageHandle) -> Vec<u64> {
        let events = h
            .live_events("r".into(), 0, 1000)
            .await
            .unwrap()
            .expect("the live row");
        events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
    }

    /// Push and wait until the flusher handled it (not until any append it started settled).
    async fn push(f: &Addr<Flusher>, gen: &str, seqs: std::ops::RangeInclusive<u64>) {
        for seq in seqs {
            f.send(Push {
                run_id: "r".into(),
                gen: gen.into(),
                event: ev(seq),
            })
            .await
            .unwrap();
        }
    }

    /// Poll the ledger until it holds `want` (the flusher appends on its own schedule), for at most 5 s.
    async fn eventually(h: &StorageHandle, want: Vec<u64>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let got = stored(h).await;
            if got == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "stored {got:?}, want {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[actix_rt::test]
    async fn a_batch_lands_at_32_events_and_not_before() {
        let h = storage_with_run().await;
        let failures = Arc::new(AtomicU64::new(0));
        let f = Flusher::with_interval(h.clone(), failures.clone(), NEVER).start();
        push(&f, GEN, 1..=FLUSH_EVENTS as u64 - 1).await;
        // 31 events handled and no tick: no append was even started.
        assert_eq!(stored(&h).await, Vec::<u64>::new());
        // The 32nd starts the append at once.
        push(&f, GEN, FLUSH_EVENTS as u64..=FLUSH_EVENTS as u64).await;
        eventually(&h, (1..=32).collect()).await;
        // The next batch starts empty: 5 more wait for a count, a tick or a flush.
        push(&f, GEN, 33..=37).await;
        assert_eq!(stored(&h).await.len(), 32);
        assert_eq!(failures.load(Ordering::Relaxed), 0);
    }

    #[actix_rt::test]
    async fn a_partial_batch_lands_at_the_interval() {
        let h = storage_with_run().await;
        let f = Flusher::with_interval(
            h.clone(),
            Arc::new(AtomicU64::new(0)),
            Duration::from_millis(30),
        )
        .start();
        push(&f, GEN, 1..=3).await;
        eventually(&h, vec![1, 2, 3]).await;
        push(&f, GEN, 4..=4).await;
        eventually(&h, vec![1, 2, 3, 4]).await;
    }

    #[test]
    fn the_default_interval_is_500_ms_and_the_batch_32_events() {
        assert_eq!(
            (FLUSH_INTERVAL, FLUSH_EVENTS),
            (Duration::from_millis(500), 32)
        );
    }

    #[actix_rt::test]
    async fn flush_run_lands_now_and_forget_drops_what_is_pending() {
        let h = storage_with_run().await;
        let f = Flusher::with_interval(h.clone(), Arc::new(AtomicU64::new(0)), NEVER).start();
        push(&f, GEN, 1..=5).await;
        // FlushRun answers once the append settled: no polling needed.
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![1, 2, 3, 4, 5]);
        // An empty flush is a no-op.
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![1, 2, 3, 4, 5]);
        // Forget drops the pending batch: a later flush has nothing of it.
        push(&f, GEN, 6..=8).await;
        f.send(Forget("r".into())).await.unwrap();
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![1, 2, 3, 4, 5]);
        // Pushes after the Forget start a fresh batch.
        push(&f, GEN, 9..=9).await;
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![1, 2, 3, 4, 5, 9]);
    }

    #[actix_rt::test]
    async fn what_a_step_committed_is_not_appended_again() {
        let h = storage_with_run().await;
        let f = Flusher::with_interval(h.clone(), Arc::new(AtomicU64::new(0)), NEVER).start();
        push(&f, GEN, 1..=4).await;
        f.send(Committed {
            run_id: "r".into(),
            seqs: vec![1, 3, 9],
        })
        .await
        .unwrap();
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![2, 4], "only what no step committed");
        // A batch the step committed whole leaves nothing pending.
        push(&f, GEN, 5..=5).await;
        f.send(Committed {
            run_id: "r".into(),
            seqs: vec![5],
        })
        .await
        .unwrap();
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![2, 4]);
    }

    #[actix_rt::test]
    async fn a_refused_or_failed_batch_is_counted_and_dropped() {
        let h = storage_with_run().await;
        let failures = Arc::new(AtomicU64::new(0));
        let f = Flusher::with_interval(h.clone(), failures.clone(), NEVER).start();
        // Another generation's batch is refused (fenced) by the ledger: counted, nothing written.
        push(&f, OTHER_GEN, 1..=2).await;
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(failures.load(Ordering::Relaxed), 1);
        assert_eq!(stored(&h).await, Vec::<u64>::new());
        // Dropped, not kept: the owner's next batch carries only its own event, not the refused two
        // under the owner's generation.
        push(&f, GEN, 3..=3).await;
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![3]);
        assert_eq!(failures.load(Ordering::Relaxed), 1);
        // A storage failure (the storage unavailable) is counted and its batch dropped too.
        h.inject_outage(true);
        push(&f, GEN, 4..=5).await;
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(failures.load(Ordering::Relaxed), 2);
        h.inject_outage(false);
        push(&f, GEN, 6..=6).await;
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(stored(&h).await, vec![3, 6]);
        // A batch refused at the count threshold is counted the same way.
        push(&f, OTHER_GEN, 7..=7 + FLUSH_EVENTS as u64 - 1).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while failures.load(Ordering::Relaxed) < 3 {
            assert!(
                std::time::Instant::now() < deadline,
                "the refused full batch was never counted"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(stored(&h).await, vec![3, 6]);
    }

    #[actix_rt::test]
    async fn a_batch_for_a_run_that_ended_meanwhile_is_no_failure() {
        let h = storage_with_run().await;
        let failures = Arc::new(AtomicU64::new(0));
        let f = Flusher::with_interval(h.clone(), failures.clone(), NEVER).start();
        push(&f, GEN, 1..=2).await;
        // The run ends (its record holds every event it published) before the batch goes out.
        assert_eq!(h.abandon("r".into(), GEN.into()).await.unwrap(), Ok(()));
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(failures.load(Ordering::Relaxed), 0);
        // On a run that has ended, any generation's batch meets the same refusal: none is counted.
        push(&f, OTHER_GEN, 3..=3).await;
        f.send(FlushRun("r".into())).await.unwrap();
        assert_eq!(failures.load(Ordering::Relaxed), 0);
    }
}
