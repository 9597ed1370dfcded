//! `Heartbeat`: renews the leases of the runs this process owns.
//!
//! Owns the set of tracked runs (run id → generation, the run's stop recipient, the stop modes already
//! relayed). Every `heartbeat_ms` it calls the ledger's `heartbeat` for each: the lease moves to
//! `now + lease_ms`; a stop any generation requested is relayed to the run once per mode; a fenced or
//! unknown-run answer tells the run it is fenced and stops tracking it. A storage error is logged and
//! retried at the next tick (lease expiry alone never fences).

use std::collections::HashMap;
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, Message, Recipient};
use storage::ledger::{Refusal, StopMode};
use storage::StorageHandle;

/// What the heartbeat tells a run.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub enum HeartbeatNews {
    /// A stop was requested on the ledger (possibly by another process).
    Stop(StopMode),
    /// Another generation owns the row now (or it is gone): stop, say nothing more.
    Fenced,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Track {
    pub run_id: String,
    pub gen: String,
    pub news: Recipient<HeartbeatNews>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Untrack(pub String);

struct Tracked {
    gen: String,
    news: Recipient<HeartbeatNews>,
    relayed: Vec<StopMode>,
}

pub struct Heartbeat {
    storage: StorageHandle,
    every: Duration,
    lease_ms: i64,
    runs: HashMap<String, Tracked>,
}

impl Heartbeat {
    pub fn new(storage: StorageHandle, every: Duration, lease_ms: i64) -> Self {
        Heartbeat { storage, every, lease_ms, runs: HashMap::new() }
    }
}

/// Beat once for one run; answers what to tell it.
async fn beat(storage: StorageHandle, run_id: String, gen: String, lease_ms: i64) -> Option<HeartbeatNews> {
    match storage.heartbeat(run_id.clone(), gen.clone(), lease_ms).await {
        Ok(Ok(answer)) => answer.stop.map(HeartbeatNews::Stop),
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => Some(HeartbeatNews::Fenced),
        Ok(Err(refusal)) => {
            tracing::warn!(run_id, generation = gen, %refusal, "heartbeat refused");
            None
        }
        Err(e) => {
            tracing::warn!(run_id, generation = gen, error = %e, "heartbeat failed; retrying next tick");
            None
        }
    }
}

impl Actor for Heartbeat {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |act, ctx| {
            for (run_id, t) in &act.runs {
                let fut = beat(act.storage.clone(), run_id.clone(), t.gen.clone(), act.lease_ms);
                let run_id = run_id.clone();
                ctx.spawn(actix::fut::wrap_future::<_, Self>(fut).map(move |news, act, _| {
                    let Some(news) = news else { return };
                    let Some(t) = act.runs.get_mut(&run_id) else { return };
                    match news {
                        HeartbeatNews::Stop(mode) if t.relayed.contains(&mode) => {}
                        HeartbeatNews::Stop(mode) => {
                            t.relayed.push(mode);
                            t.news.do_send(HeartbeatNews::Stop(mode));
                        }
                        HeartbeatNews::Fenced => {
                            t.news.do_send(HeartbeatNews::Fenced);
                            act.runs.remove(&run_id);
                        }
                    }
                }));
            }
        });
    }
}

use actix::ActorFutureExt;

impl Handler<Track> for Heartbeat {
    type Result = ();

    fn handle(&mut self, msg: Track, _ctx: &mut Context<Self>) {
        self.runs.insert(msg.run_id, Tracked { gen: msg.gen, news: msg.news, relayed: Vec::new() });
    }
}

impl Handler<Untrack> for Heartbeat {
    type Result = ();

    fn handle(&mut self, msg: Untrack, _ctx: &mut Context<Self>) {
        self.runs.remove(&msg.0);
    }
}
