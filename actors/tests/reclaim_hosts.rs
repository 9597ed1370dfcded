//! Fast reclaim is per host identity (SPEC §1.3, §6.1): a dead generation (its pid gone) of this
//! process's own `host_id` has its rows taken at once; one of another host_id — even on this very
//! machine, where its pid is also gone — waits for its lease.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use storage::RunId;

use actix::Actor;
use actors::agent::scripted::ScriptedAgent;
use actors::history::HistoryWriter;
use actors::host;
use actors::registry::Registry;
use actors::run::AgentEntry;
use actors::supervisor::{ReclaimPass, Supervisor, SupervisorConfig};
use actors::token::TokenMinter;
use actors::tools::Toolbox;
use serde_json::json;
use storage::ledger::{Admit, AdmitOutcome, GenerationInfo, Phase};
use storage::{BackendSpec, ManualClock, MemoryStore, StorageHandle};

const NOW: i64 = 1_800_000_000_000;
const LEASE_MS: i64 = 30_000;

/// A generation that ran on this machine under `host_id` and whose process is gone.
fn dead(gen: &str, host_id: &str) -> GenerationInfo {
    GenerationInfo {
        gen: gen.into(),
        host: host::hostname(),
        host_id: host_id.into(),
        pid: u32::MAX - 7,
        proc_start: "1".into(),
        started_at: NOW - 10_000,
    }
}

/// An `attaching` row of `gen` whose lease runs until `NOW + LEASE_MS`.
async fn admitted(storage: &StorageHandle, gen: &str, thread: &str, run_id: &RunId) {
    let request = json!({"thread": thread, "channel": "k", "user": "u", "text": "steps=1 ms=0"});
    let meta = json!({"agent": "demo", "model": "scripted", "label": "steps=1 ms=0", "threadKey": format!("k:{thread}"),
        "channelId": "k", "userId": "u", "channelVisibility": "machine", "deadline": NOW + 600_000, "request": request});
    let admit = Admit {
        thread_key: format!("k:{thread}"),
        gen: gen.into(),
        run_id: run_id.clone(),
        request,
        meta,
        key: None,
        lease_ms: LEASE_MS,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    let outcome = storage.admit(admit, NOW).await.expect("admit");
    assert_eq!(
        outcome,
        AdmitOutcome::Started {
            run_id: run_id.clone()
        }
    );
}

#[actix_rt::test]
async fn a_dead_generation_of_another_host_id_waits_for_its_lease_while_one_of_this_host_id_is_taken_at_once(
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(NOW));
    let storage = StorageHandle::start(BackendSpec::Memory(MemoryStore::new()), clock.clone());
    let (mine, theirs) = ("20260101T000000Z-0000000a", "20260101T000000Z-0000000b");
    storage
        .record_generation(dead(mine, "node-a"))
        .await
        .expect("record");
    storage
        .record_generation(dead(theirs, "node-b"))
        .await
        .expect("record");
    admitted(&storage, mine, "t-mine", &RunId::from("run-mine")).await;
    admitted(&storage, theirs, "t-theirs", &RunId::from("run-theirs")).await;

    let mut agents = HashMap::new();
    agents.insert(
        "demo".to_owned(),
        AgentEntry::new(Arc::new(ScriptedAgent::new()), 600_000, "s"),
    );
    let secret = storage.capability_secret().await.expect("secret");
    let supervisor = Supervisor::new(SupervisorConfig {
        storage: storage.clone(),
        registry: Registry::new(clock.clone()),
        history: HistoryWriter::new(Arc::new(storage.clone()), None),
        agents,
        default_agent: "demo".into(),
        tools: Toolbox::builtin(),
        workspace_root: dir.path().join("workspaces"),
        lease_ms: LEASE_MS,
        heartbeat_ms: 10_000,
        webhook: None,
        clock: clock.clone(),
        tokens: TokenMinter::new(&secret),
        draining: Arc::new(AtomicBool::new(false)),
        metrics: Arc::default(),
        operations: actors::operations::OperationCoordinator::new(clock.clone()),
        restart_policy: Default::default(),
        host_id: "node-a".into(),
        cards: Default::default(),
        http: reqwest::Client::new(),
    });
    let gen = supervisor.generation().clone();
    storage
        .record_generation(host::this_process(gen.as_str(), NOW, "node-a"))
        .await
        .expect("record");
    let supervisor = supervisor.start();

    // Within both leases: only this host's dead generation is reclaimed.
    let report = supervisor
        .send(ReclaimPass { defer_launch: true })
        .await
        .expect("reach")
        .expect("pass");
    assert_eq!(report.restarted, vec!["run-mine".to_owned()], "{report:?}");
    assert_eq!(report.live_elsewhere, 1, "{report:?}");
    let row = storage
        .get_live("run-theirs".into())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(
        (row.owner_gen.as_str(), row.phase),
        (theirs, Phase::Attaching),
        "untouched: {row:?}"
    );
    let row = storage
        .get_live("run-mine".into())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.owner_gen, gen.as_str());

    // Past its lease, the other host's row is taken too.
    clock.advance(LEASE_MS + 1);
    let report = supervisor
        .send(ReclaimPass { defer_launch: true })
        .await
        .expect("reach")
        .expect("pass");
    assert_eq!(
        (report.restarted, report.live_elsewhere),
        (vec![RunId::from("run-theirs")], 0)
    );
    let row = storage
        .get_live("run-theirs".into())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.owner_gen, gen.as_str());
}
