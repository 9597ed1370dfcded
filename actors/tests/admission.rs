//! `ThreadSlot` behind the supervisor (SPEC §5.1): one slot per thread orders that thread's messages, so a
//! burst on one thread starts exactly one run and steers the rest into its inbox in arrival order, while
//! other threads admit independently; a draining supervisor refuses new runs.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix::{Actor, Addr};
use actors::agent::scripted::ScriptedAgent;
use actors::history::HistoryWriter;
use actors::registry::Registry;
use actors::run::{AgentEntry, Request};
use actors::supervisor::{AdmitError, AdmitMessage, Admitted, Supervisor, SupervisorConfig};
use actors::token::TokenMinter;
use actors::tools::Toolbox;
use storage::record::RunStatus;
use storage::{BackendSpec, MemoryStore, StorageHandle};

struct Fixture {
    _dir: tempfile::TempDir,
    supervisor: Addr<Supervisor>,
    storage: StorageHandle,
    draining: Arc<AtomicBool>,
}

async fn fixture() -> Fixture {
    fixture_on(|_| BackendSpec::Memory(MemoryStore::new())).await
}

/// The fixture on the storage `spec` answers for its temporary directory.
async fn fixture_on(spec: impl FnOnce(&std::path::Path) -> BackendSpec) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = storage::clock::system();
    let storage = StorageHandle::start(spec(dir.path()), clock.clone());
    let mut agents = HashMap::new();
    agents.insert(
        "demo".to_owned(),
        AgentEntry::new(Arc::new(ScriptedAgent::new()), 600_000, "s"),
    );
    let secret = storage.capability_secret().await.expect("secret");
    let draining = Arc::new(AtomicBool::new(false));
    let supervisor = Supervisor::new(SupervisorConfig {
        storage: storage.clone(),
        registry: Registry::new(clock.clone()),
        history: HistoryWriter::new(Arc::new(storage.clone()), None),
        agents,
        default_agent: "demo".into(),
        tools: Toolbox::builtin(),
        workspace_root: dir.path().join("workspaces"),
        lease_ms: 30_000,
        heartbeat_ms: 10_000,
        webhook: None,
        clock: clock.clone(),
        tokens: TokenMinter::new(&secret),
        draining: draining.clone(),
        metrics: Arc::default(),
        operations: actors::operations::OperationCoordinator::new(clock),
        restart_policy: Default::default(),
        host_id: "test-host".into(),
        cards: Default::default(),
        http: reqwest::Client::new(),
    })
    .start();
    Fixture {
        _dir: dir,
        supervisor,
        storage,
        draining,
    }
}

fn message(thread: &str, text: &str) -> AdmitMessage {
    AdmitMessage {
        request: Request {
            thread: thread.into(),
            channel: "c".into(),
            user: "u".into(),
            text: text.into(),
            agent: None,
            visibility: None,
            parent_run_id: None,
            source: Default::default(),
            strategy: None,
        },
        writer: None,
        key: None,
    }
}

#[actix_rt::test]
async fn a_burst_on_one_thread_starts_one_run_and_steers_the_rest_in_order() {
    let f = fixture().await;
    // A long first run, so every follow-up finds it live.
    let sends: Vec<_> = (0..20)
        .map(|i| {
            f.supervisor.send(message(
                "t1",
                if i == 0 { "steps=3 ms=2000" } else { "more" },
            ))
        })
        .collect();
    let mut started = Vec::new();
    let mut steered = Vec::new();
    for answer in futures_util::future::join_all(sends).await {
        match answer.expect("mailbox").expect("admitted") {
            Admitted::Started { run_id, .. } => started.push(run_id),
            Admitted::Steered { run_id, seq, .. } => steered.push((run_id, seq)),
            other => panic!("a steer on a busy thread answered {other:?}"),
        }
    }
    assert_eq!(started.len(), 1, "exactly one run starts: {started:?}");
    assert_eq!(steered.len(), 19);
    assert!(
        steered.iter().all(|(id, _)| *id == started[0]),
        "every follow-up steers into that run"
    );
    let seqs: Vec<u64> = steered.iter().map(|(_, s)| *s).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "inbox seqs in arrival order: {seqs:?}"
    );
    let live = f.storage.list_live().await.unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].thread_key, "c:t1");
}

#[actix_rt::test]
async fn threads_admit_independently_and_a_draining_supervisor_refuses_new_runs() {
    let f = fixture().await;
    let sends: Vec<_> = (0..5)
        .map(|i| {
            f.supervisor
                .send(message(&format!("t{i}"), "steps=1 ms=500"))
        })
        .collect();
    for answer in futures_util::future::join_all(sends).await {
        assert!(matches!(answer.unwrap(), Ok(Admitted::Started { .. })));
    }
    assert_eq!(f.storage.list_live().await.unwrap().len(), 5);
    f.draining.store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = f.supervisor.send(message("t9", "hello")).await.unwrap();
    assert_eq!(refused, Err(AdmitError::Draining));
}

/// A fresh run's inbox is empty when its admission commits, so a run nobody steers never reads it (issue
/// 29: one reader round trip a run less), while a steer moves the storage's inbox epoch and the run reads
/// and folds it. On SQLite, whose readers count each read they answer.
#[actix_rt::test]
async fn a_run_nobody_steers_never_reads_its_inbox_and_a_steered_one_folds_the_steer() {
    let f = fixture_on(|dir| BackendSpec::Sqlite {
        path: dir.join("switchboard.db"),
        synchronous: storage::Synchronous::Normal,
    })
    .await;
    let reads = || {
        f.storage
            .group_stats()
            .pooled_reads
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    // Polls the run's record until its final record lands; answers it and how many reads the polls made.
    let finished = |run_id: storage::RunId| {
        let storage = f.storage.clone();
        async move {
            for polls in 1.. {
                let record = storage.get(run_id.clone()).await.expect("get");
                if let Some(record) = record.filter(|r| r.head.status == RunStatus::Completed) {
                    return (record, polls);
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            unreachable!()
        }
    };
    let inputs = |record: &storage::record::RunRecord| {
        record
            .events
            .iter()
            .filter(|e| e["type"] == "input")
            .count()
    };

    let before = reads();
    let Admitted::Started { run_id, .. } = f
        .supervisor
        .send(message("quiet", "steps=3 ms=0"))
        .await
        .expect("mailbox")
        .expect("admitted")
    else {
        panic!("a fresh thread starts a run");
    };
    let (record, polls) = finished(run_id).await;
    assert_eq!(inputs(&record), 1);
    assert_eq!(
        reads() - before,
        polls,
        "the only reads were this test's polls: the run read no inbox"
    );

    let Admitted::Started { run_id, .. } = f
        .supervisor
        .send(message("steered", "steps=3 ms=300"))
        .await
        .expect("mailbox")
        .expect("admitted")
    else {
        panic!("a fresh thread starts a run");
    };
    let steer = f
        .supervisor
        .send(message("steered", "and this"))
        .await
        .expect("mailbox")
        .expect("admitted");
    assert!(
        matches!(&steer, Admitted::Steered { run_id: id, .. } if *id == run_id),
        "{steer:?}"
    );
    let (record, _) = finished(run_id).await;
    assert_eq!(inputs(&record), 2, "the steer was folded into the run");
}
