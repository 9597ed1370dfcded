//! `Heartbeat`: renews the leases of the runs this process owns.
//!
//! Owns the set of tracked runs (run id → generation, the stop modes already relayed). Every
//! `heartbeat_ms` it calls the ledger's `heartbeat` for each: the lease moves to `now + lease_ms`; a stop
//! any generation requested is reported once per mode; a fenced or unknown-run answer is reported and the
//! run is no longer tracked. Reports go to the supervisor ([`RunNews`]), the one fan-out point that tells
//! run actors (SPEC §1.1). A storage error is logged and retried at the next tick (lease expiry alone
//! never fences). With cross-host news (PostgreSQL, SPEC §1.3) a stop or kill another host wrote beats
//! that run at once, so its owner acts within a round trip instead of up to `heartbeat_ms` later.

use std::collections::BTreeMap;
use std::time::Duration;
use storage::RunId;

use actix::{Actor, AsyncContext, Context, Handler, Message, Recipient, StreamHandler};
use storage::ledger::{Refusal, StopMode};
use storage::{News, StorageHandle};
use tokio::sync::broadcast;

/// What the heartbeat tells a run.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub enum HeartbeatNews {
    /// A stop was requested on the ledger (possibly by another process).
    Stop(StopMode),
    /// Another generation owns the row now (or it is gone): stop, say nothing more.
    Fenced,
}

/// News about one run, for the supervisor to pass on.
#[derive(Message, Debug, Clone, PartialEq)]
#[rtype(result = "()")]
pub struct RunNews {
    pub run_id: RunId,
    pub news: HeartbeatNews,
}

/// Renew this run's lease from now on.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Track {
    pub run_id: RunId,
    pub gen: String,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Untrack(pub RunId);

struct Tracked {
    gen: String,
    relayed: Vec<StopMode>,
}

pub struct Heartbeat {
    storage: StorageHandle,
    every: Duration,
    lease_ms: i64,
    runs: BTreeMap<RunId, Tracked>,
    /// Where news goes: the supervisor.
    report: Recipient<RunNews>,
    /// Cross-host news, until `started` turns it into a stream ([`Heartbeat::with_news`]).
    news: Option<broadcast::Receiver<News>>,
}

impl Heartbeat {
    pub fn new(
        storage: StorageHandle,
        every: Duration,
        lease_ms: i64,
        report: Recipient<RunNews>,
    ) -> Self {
        Heartbeat {
            storage,
            every,
            lease_ms,
            runs: BTreeMap::new(),
            report,
            news: None,
        }
    }
}

/// Beat once for one run; answers what to tell it.
async fn beat(
    storage: StorageHandle,
    run_id: RunId,
    gen: String,
    lease_ms: i64,
) -> Option<HeartbeatNews> {
    match storage
        .heartbeat(run_id.clone(), gen.clone(), lease_ms)
        .await
    {
        Ok(Ok(answer)) => answer.stop.map(HeartbeatNews::Stop),
        Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => Some(HeartbeatNews::Fenced),
        Ok(Err(refusal)) => {
            tracing::warn!(%run_id, generation = gen, %refusal, "heartbeat refused");
            None
        }
        Err(e) => {
            tracing::warn!(%run_id, generation = gen, error = %e, "heartbeat failed; retrying next tick");
            None
        }
    }
}

impl Heartbeat {
    /// Also beat a tracked run at once when cross-host news says a stop or a kill was written for it
    /// (SPEC §1.3: the owner acts before its next heartbeat), and every tracked run when notes may have
    /// been missed. Without news (SQLite, memory) the interval alone relays stops.
    pub fn with_news(mut self, news: Option<broadcast::Receiver<News>>) -> Self {
        self.news = news;
        self
    }

    /// Beat `run_id` now (if tracked) and relay what the ledger answers.
    fn beat_run(&self, run_id: &RunId, ctx: &mut Context<Self>) {
        let Some(t) = self.runs.get(run_id) else {
            return;
        };
        let fut = beat(
            self.storage.clone(),
            run_id.to_owned(),
            t.gen.clone(),
            self.lease_ms,
        );
        let run_id = run_id.to_owned();
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(fut).map(move |news, act, _| {
                let Some(news) = news else { return };
                let Some(t) = act.runs.get_mut(&run_id) else {
                    return;
                };
                match news {
                    HeartbeatNews::Stop(mode) if t.relayed.contains(&mode) => {}
                    HeartbeatNews::Stop(mode) => {
                        t.relayed.push(mode);
                        act.report.do_send(RunNews {
                            run_id,
                            news: HeartbeatNews::Stop(mode),
                        });
                    }
                    HeartbeatNews::Fenced => {
                        act.runs.remove(&run_id);
                        act.report.do_send(RunNews {
                            run_id,
                            news: HeartbeatNews::Fenced,
                        });
                    }
                }
            }),
        );
    }

    fn beat_all(&self, ctx: &mut Context<Self>) {
        for run_id in self.runs.keys() {
            self.beat_run(run_id, ctx);
        }
    }
}

impl Actor for Heartbeat {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(self.every, |act, ctx| act.beat_all(ctx));
        if let Some(news) = self.news.take() {
            ctx.add_stream(wakes(news));
        }
    }
}

/// What cross-host news asks of the heartbeat.
enum Wake {
    /// A stop or kill was written for this run.
    Run(RunId),
    /// Notes may have been missed.
    All,
}

/// The notes the heartbeat acts on, as a stream that ends when the feed does.
fn wakes(news: broadcast::Receiver<News>) -> impl futures_util::Stream<Item = Wake> {
    futures_util::stream::unfold(news, |mut rx| async move {
        loop {
            let wake = match rx.recv().await {
                Ok(News::Stop { run_id } | News::Killed { run_id }) => Wake::Run(run_id),
                Ok(News::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => Wake::All,
                Ok(News::Appended { .. } | News::Inbox { .. } | News::Ended { .. }) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            return Some((wake, rx));
        }
    })
}

impl StreamHandler<Wake> for Heartbeat {
    fn handle(&mut self, wake: Wake, ctx: &mut Context<Self>) {
        match wake {
            Wake::Run(run_id) => self.beat_run(&run_id, ctx),
            Wake::All => self.beat_all(ctx),
        }
    }

    /// The feed ended (its storage is gone): keep beating on the interval.
    fn finished(&mut self, _ctx: &mut Context<Self>) {}
}

use actix::ActorFutureExt;

impl Handler<Track> for Heartbeat {
    type Result = ();

    fn handle(&mut self, msg: Track, _ctx: &mut Context<Self>) {
        self.runs.insert(
            msg.run_id,
            Tracked {
                gen: msg.gen,
                relayed: Vec::new(),
            },
        );
    }
}

impl Handler<Untrack> for Heartbeat {
    type Result = ();

    fn handle(&mut self, msg: Untrack, _ctx: &mut Context<Self>) {
        self.runs.remove(&msg.0);
    }
}

#[cfg(test)]
mod tests {
    //! The heartbeat against the in-memory ledger, with a manual clock and a 10 ms interval: a renewal is
    //! observed as the row's lease moving to `now + lease_ms` after the clock advanced, and news as
    //! messages reaching a probe actor — no fixed sleeps.

    use super::*;
    use std::sync::Arc;

    use actix::Addr;
    use serde_json::json;
    use storage::ledger::{Admit, Promotion};
    use storage::{BackendSpec, Clock, ManualClock, MemoryStore};
    use tokio::sync::mpsc;

    const NOW: i64 = 1_800_000_000_000;
    const LEASE: i64 = 30_000;
    const GEN: &str = "20260101T000000Z-00000001";
    const OTHER_GEN: &str = "20260101T000000Z-00000002";
    const WITNESS_GEN: &str = "20260101T000000Z-00000003";
    const EVERY: Duration = Duration::from_millis(10);

    type Routes = Arc<std::sync::Mutex<BTreeMap<RunId, mpsc::UnboundedSender<HeartbeatNews>>>>;

    /// Stands in for the supervisor: passes each run's news to that run's channel in the test.
    struct Probe(Routes);

    impl Actor for Probe {
        type Context = Context<Self>;
    }

    impl Handler<RunNews> for Probe {
        type Result = ();

        fn handle(&mut self, msg: RunNews, _ctx: &mut Context<Self>) {
            if let Some(tx) = self.0.lock().unwrap().get(&msg.run_id) {
                let _ = tx.send(msg.news);
            }
        }
    }

    struct Fixture {
        storage: StorageHandle,
        clock: ManualClock,
        heartbeat: Addr<Heartbeat>,
        routes: Routes,
        /// Cross-host news as another host's writes would send it.
        feed: Arc<storage::NewsFeed>,
    }

    impl Fixture {
        /// A memory ledger with live runs (one thread each), each `(id, owner generation)`, and a heartbeat.
        async fn new(runs: &[(&str, &str)]) -> Fixture {
            Self::build(runs, EVERY).await
        }

        /// [`Fixture::new`] with the heartbeat's interval `every`.
        async fn build(runs: &[(&str, &str)], every: Duration) -> Fixture {
            let clock = ManualClock::new(NOW);
            let storage = StorageHandle::start(
                BackendSpec::Memory(MemoryStore::new()),
                Arc::new(clock.clone()),
            );
            for (id, gen) in runs {
                let admit = Admit {
                    thread_key: format!("c:{id}"),
                    gen: (*gen).into(),
                    run_id: (*id).into(),
                    request: json!({"text": "x"}),
                    meta: json!({"agent": "demo", "request": {"text": "x"}}),
                    key: None,
                    lease_ms: LEASE,
                    writer: None,
                    strategy: storage::ledger::Strategy::Steer,
                };
                storage.admit(admit, NOW).await.unwrap();
                let p = Promotion {
                    system_text: "s".into(),
                    tools: json!([]),
                    state: Default::default(),
                    lease_ms: LEASE,
                };
                storage
                    .claim((*id).into(), (*gen).into(), p)
                    .await
                    .unwrap()
                    .unwrap();
            }
            let routes = Routes::default();
            let report = Probe(routes.clone()).start().recipient();
            let feed = storage::NewsFeed::local();
            let heartbeat = Heartbeat::new(storage.clone(), every, LEASE, report)
                .with_news(Some(feed.subscribe()))
                .start();
            Fixture {
                storage,
                clock,
                heartbeat,
                routes,
                feed,
            }
        }

        /// Track `id` for `gen`; answers the receiving end of its news.
        async fn track(&self, id: &str, gen: &str) -> mpsc::UnboundedReceiver<HeartbeatNews> {
            let (tx, rx) = mpsc::unbounded_channel();
            self.routes.lock().unwrap().insert(id.into(), tx);
            self.heartbeat
                .send(Track {
                    run_id: id.into(),
                    gen: gen.into(),
                })
                .await
                .unwrap();
            rx
        }

        async fn lease_until(&self, id: &str) -> i64 {
            self.storage
                .get_live(id.into())
                .await
                .unwrap()
                .expect("the live row")
                .lease_until
        }

        /// Advance the clock by `ms` and wait until `witness` has been renewed at the new time: proof
        /// that the heartbeat ticked (at least once) after the advance.
        async fn tick(&self, ms: i64, witness: &str) {
            self.clock.advance(ms);
            let want = self.clock.now_ms() + LEASE;
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let got = self.lease_until(witness).await;
                if got == want {
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{witness} never renewed: lease {got}, want {want}"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }

    /// The next news within 5 s.
    async fn next(rx: &mut mpsc::UnboundedReceiver<HeartbeatNews>) -> HeartbeatNews {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("news within 5 s")
            .expect("probe alive")
    }

    #[actix_rt::test]
    async fn tracked_runs_are_renewed_every_interval_and_an_untracked_one_never() {
        let f = Fixture::new(&[("a", GEN), ("b", GEN), ("c", GEN)]).await;
        let _a = f.track("a", GEN).await;
        let _c = f.track("c", GEN).await;
        // Each advance is followed by a renewal to the new `now + lease`: the lease moves every interval.
        for _ in 0..3 {
            f.tick(1_000, "a").await;
            f.tick(0, "c").await;
        }
        // `b` was never tracked: its lease is still the one its claim set.
        assert_eq!(f.lease_until("b").await, NOW + LEASE);
        // Untracked, `a` is renewed no more (a beat already in flight may land once; skip past it).
        f.heartbeat.send(Untrack("a".into())).await.unwrap();
        f.tick(1_000, "c").await;
        let after_untrack = f.lease_until("a").await;
        f.tick(1_000, "c").await;
        f.tick(1_000, "c").await;
        assert_eq!(
            f.lease_until("a").await,
            after_untrack,
            "an untracked run was renewed"
        );
        assert!(after_untrack < f.clock.now_ms() + LEASE);
        assert_eq!(f.lease_until("b").await, NOW + LEASE);
    }

    #[actix_rt::test]
    async fn a_stop_from_any_generation_is_relayed_once_per_mode_and_a_fence_is_reported() {
        // `w`, owned by a third generation, is the witness that the heartbeat keeps ticking.
        let f = Fixture::new(&[("a", GEN), ("w", WITNESS_GEN)]).await;
        let mut news = f.track("a", GEN).await;
        let mut witness_news = f.track("w", WITNESS_GEN).await;
        f.tick(1_000, "a").await;
        assert!(news.try_recv().is_err(), "no news without a stop");

        // A stop recorded on the ledger (by any process, no generation involved) reaches the run.
        f.storage
            .request_stop("a".into(), StopMode::Soft)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next(&mut news).await, HeartbeatNews::Stop(StopMode::Soft));
        // Beats keep seeing the stop, but it is relayed once.
        f.tick(1_000, "w").await;
        f.tick(1_000, "w").await;
        assert!(news.try_recv().is_err(), "the soft stop was relayed twice");
        // A stronger mode is news again, once.
        f.storage
            .request_stop("a".into(), StopMode::Hard)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next(&mut news).await, HeartbeatNews::Stop(StopMode::Hard));
        f.tick(1_000, "w").await;
        f.tick(1_000, "w").await;
        assert!(news.try_recv().is_err(), "the hard stop was relayed twice");

        // Another generation takes the row (its owner declared dead): the run hears it is fenced, once,
        // and the heartbeat stops beating for it; the new owner's lease is left alone.
        let answer = f
            .storage
            .reclaim(OTHER_GEN.into(), LEASE, vec![GEN.into()], vec![])
            .await
            .unwrap();
        let taken: Vec<&str> = answer.taken.iter().map(|t| t.row.run_id.as_str()).collect();
        assert_eq!(taken, ["a"]);
        assert_eq!(next(&mut news).await, HeartbeatNews::Fenced);
        let taken_lease = f.lease_until("a").await;
        f.tick(1_000, "w").await;
        f.tick(1_000, "w").await;
        assert!(news.try_recv().is_err(), "news after the fence");
        assert_eq!(f.lease_until("a").await, taken_lease);
        assert!(
            witness_news.try_recv().is_err(),
            "the other run heard news meant for none"
        );
    }

    #[actix_rt::test]
    async fn a_row_that_is_gone_is_reported_as_a_fence() {
        let f = Fixture::new(&[("a", GEN)]).await;
        let mut news = f.track("a", GEN).await;
        f.tick(1_000, "a").await;
        f.storage
            .abandon("a".into(), GEN.into())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next(&mut news).await, HeartbeatNews::Fenced);
    }

    /// With an hour between beats, only news can make the heartbeat read the row now: a stop or kill
    /// another host wrote reaches the run at once; a note about another run or an untracked one does
    /// nothing.
    #[actix_rt::test]
    async fn news_of_a_stop_or_kill_from_another_host_beats_that_run_at_once() {
        let f = Fixture::build(&[("a", GEN), ("b", GEN)], Duration::from_secs(3600)).await;
        let mut a = f.track("a", GEN).await;
        let mut b = f.track("b", GEN).await;
        f.storage
            .request_stop("a".into(), StopMode::Soft)
            .await
            .unwrap()
            .unwrap();
        f.feed.publish(News::Appended {
            run_id: "a".into(),
            seq: 9,
        });
        f.feed.publish(News::Stop {
            run_id: "untracked".into(),
        });
        f.feed.publish(News::Stop { run_id: "a".into() });
        assert_eq!(next(&mut a).await, HeartbeatNews::Stop(StopMode::Soft));
        f.storage.kill("b".into()).await.unwrap();
        f.feed.publish(News::Killed { run_id: "b".into() });
        assert_eq!(next(&mut b).await, HeartbeatNews::Fenced);
        // A resync beats every tracked run: `a`'s stronger stop arrives without a note of its own.
        f.storage
            .request_stop("a".into(), StopMode::Hard)
            .await
            .unwrap()
            .unwrap();
        f.feed.publish(News::Resync);
        assert_eq!(next(&mut a).await, HeartbeatNews::Stop(StopMode::Hard));
        assert!(a.try_recv().is_err() && b.try_recv().is_err());
    }
}
