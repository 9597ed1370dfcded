//! `Flusher`: batches published events and appends them to the ledger.
//!
//! Owns the pending batches, per run. A [`Push`] never blocks the publisher (`do_send` into the
//! mailbox); a run's batch is appended when it reaches [`FLUSH_EVENTS`] events, and every batch every
//! [`FLUSH_INTERVAL`]. A failed or refused batch is reported (log + counter) and dropped: the transcript,
//! not the event stream, is what a resume rebuilds from, and the finish record carries every event.
//!
//! Invariant: appends carry the run's generation, so a fenced process's late batch changes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, Message};
use serde_json::Value;
use storage::StorageHandle;

pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
pub const FLUSH_EVENTS: usize = 32;

/// One published event for a run's ledger row.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Push {
    pub run_id: String,
    pub gen: String,
    pub event: Value,
}

/// Append everything pending for one run now (answers when the append settled).
#[derive(Message)]
#[rtype(result = "()")]
pub struct FlushRun(pub String);

/// Drop whatever is pending for a finished run: its record carries every event already.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget(pub String);

pub struct Flusher {
    storage: StorageHandle,
    pending: HashMap<String, (String, Vec<Value>)>,
    failures: Arc<AtomicU64>,
}

impl Flusher {
    pub fn new(storage: StorageHandle, failures: Arc<AtomicU64>) -> Self {
        Flusher { storage, pending: HashMap::new(), failures }
    }

    fn take(&mut self, run_id: &str) -> Option<(String, Vec<Value>)> {
        self.pending.remove(run_id).filter(|(_, evs)| !evs.is_empty())
    }

    fn append(&self, run_id: String, gen: String, events: Vec<Value>) -> impl std::future::Future<Output = ()> + 'static {
        let storage = self.storage.clone();
        let failures = self.failures.clone();
        async move {
            let n = events.len();
            match storage.append(run_id.clone(), gen.clone(), events).await {
                Ok(Ok(())) => {}
                Ok(Err(refusal)) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(run_id, generation = gen, events = n, %refusal, "event batch refused by the ledger");
                }
                Err(e) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(run_id, generation = gen, events = n, error = %e, "event batch failed");
                }
            }
        }
    }
}

impl Actor for Flusher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(FLUSH_INTERVAL, |act, ctx| {
            let ids: Vec<String> = act.pending.keys().cloned().collect();
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
        let entry = self.pending.entry(msg.run_id.clone()).or_insert_with(|| (msg.gen.clone(), Vec::new()));
        entry.0 = msg.gen;
        entry.1.push(msg.event);
        if entry.1.len() >= FLUSH_EVENTS {
            if let Some((gen, events)) = self.take(&msg.run_id) {
                ctx.spawn(actix::fut::wrap_future(self.append(msg.run_id, gen, events)));
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

impl Handler<Forget> for Flusher {
    type Result = ();

    fn handle(&mut self, msg: Forget, _ctx: &mut Context<Self>) {
        self.pending.remove(&msg.0);
    }
}
