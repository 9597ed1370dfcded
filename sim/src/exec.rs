//! The deterministic executor: the production actors on one thread, in virtual time.
//!
//! An actix `System` over a current-thread tokio runtime whose clock starts paused: time moves only when
//! every task waits, and then straight to the next timer. Every I/O of the production shell waits on the
//! world: storage calls arrive as jobs on a [`storage::actor::detached`] mailbox, model and tool calls
//! as [`Pending`] operations; the world's task picks, by its seeded RNG, which one completes (or fails)
//! next. So a seed is a complete description of an execution of the real code.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use storage::Clock;

/// The simulated clock starts here (an ordinary 2027 epoch-ms).
pub const T0: i64 = 1_800_000_000_000;

/// Run `f` to completion on a fresh actix system in paused virtual time.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let system = actix_rt::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime")
    });
    system.block_on(f)
}

/// The production [`Clock`] in virtual time: `T0` plus what tokio's paused clock has advanced since the
/// world began.
#[derive(Debug, Clone)]
pub struct VirtualClock {
    start: tokio::time::Instant,
}

impl VirtualClock {
    /// A clock at `T0` now (call inside [`block_on`]).
    pub fn start() -> Arc<Self> {
        Arc::new(VirtualClock {
            start: tokio::time::Instant::now(),
        })
    }
}

impl Clock for VirtualClock {
    fn now_ms(&self) -> i64 {
        T0 + tokio::time::Instant::now()
            .duration_since(self.start)
            .as_millis() as i64
    }
}

/// Wait until every other task of the runtime waits (virtual time then moves by one millisecond).
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;

    use actix::Actor;
    use actors::agent::scripted::ScriptedAgent;
    use actors::history::HistoryWriter;
    use actors::registry::Registry;
    use actors::run::{AgentEntry, Request};
    use actors::supervisor::{AdmitMessage, Admitted, Supervisor, SupervisorConfig};
    use actors::token::TokenMinter;
    use actors::tools::Toolbox;
    use storage::actor::Backend;
    use storage::{BackendSpec, MemoryStore, StorageHandle};

    use super::*;

    #[test]
    fn the_production_supervisor_runs_a_message_to_its_record_in_virtual_time() {
        let store = MemoryStore::new();
        let record = block_on(async move {
            let clock = VirtualClock::start();
            let (mailbox, jobs) = storage::actor::detached(1024);
            let handle = StorageHandle::on_mailbox(mailbox, clock.clone(), "memory");
            let mut backend: Box<dyn Backend> = BackendSpec::Memory(store.clone()).open().unwrap();
            // The world: run every storage job as it comes.
            let world = tokio::task::spawn_local(async move {
                loop {
                    settle().await;
                    while let Ok(mut job) = jobs.try_recv() {
                        job.run(backend.as_mut());
                        job.reply(None);
                    }
                }
            });
            let secret = handle.capability_secret().await.unwrap();
            let dir = tempfile::tempdir().unwrap();
            let mut agents = HashMap::new();
            agents.insert(
                "demo".to_owned(),
                AgentEntry::new(Arc::new(ScriptedAgent::new()), 600_000, "s"),
            );
            let supervisor = Supervisor::new(SupervisorConfig {
                storage: handle.clone(),
                registry: Registry::new(clock.clone()),
                history: HistoryWriter::new(Arc::new(handle.clone()), None),
                agents,
                default_agent: "demo".into(),
                tools: Toolbox::builtin(),
                workspace_root: dir.path().to_owned(),
                lease_ms: 3_000,
                heartbeat_ms: 1_000,
                webhook: None,
                clock: clock.clone(),
                tokens: TokenMinter::new(&secret),
                draining: Arc::new(AtomicBool::new(false)),
                metrics: Arc::default(),
                operations: actors::operations::OperationCoordinator::new(clock.clone()),
                restart_policy: Default::default(),
                host_id: "sim".into(),
                cards: Default::default(),
                http: reqwest::Client::new(),
            })
            .start();
            let admitted = supervisor
                .send(AdmitMessage {
                    request: Request {
                        thread: "t".into(),
                        channel: "c".into(),
                        user: "u".into(),
                        text: "steps=2 ms=500".into(),
                        agent: None,
                        visibility: None,
                        parent_run_id: None,
                        source: Default::default(),
                        strategy: None,
                    },
                    writer: None,
                    key: None,
                })
                .await
                .unwrap()
                .unwrap();
            let Admitted::Started { run_id, .. } = admitted else {
                panic!("{admitted:?}")
            };
            loop {
                settle().await;
                if handle.list_live().await.unwrap().is_empty() {
                    let r = handle.get(run_id.clone()).await.unwrap().expect("a record");
                    world.abort();
                    return (r, clock.now_ms() - T0);
                }
            }
        });
        let (record, ms) = record;
        let types: Vec<&str> = record
            .events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(record.head.status, storage::record::RunStatus::Completed);
        assert_eq!(
            types,
            [
                "run_meta",
                "input",
                "assistant",
                "tool_call",
                "tool_result",
                "assistant",
                "tool_call",
                "tool_result",
                "answer"
            ]
        );
        // Two 500 ms tool sleeps, in virtual time: the test took no wall-clock second.
        assert!((1_000..1_100).contains(&ms), "{ms} ms of virtual time");
    }
}
