//! End to end: a run actor that panics — restarted through the resume path, its leaked tasks fenced out of
//! the workspace, and past the restart policy closed failed with its thread freed (SPEC §1.1, §6).

mod support;

use serde_json::{json, Value};
use storage::record::RunStatus;
use storage::RunId;
use support::types;

/// A side-effect-free tool that panics the first time it runs (a crash inside a run actor).
struct PanicOnce(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl actors::tools::Tool for PanicOnce {
    fn def(&self) -> actors::agent::ToolDef {
        actors::agent::ToolDef {
            name: "panic_once".into(),
            description: "panics the first time".into(),
            parameters: json!({"type": "object"}),
            side_effect_free: true,
            rerun_safe: true,
            idempotent: false,
        }
    }

    fn call<'a>(
        &'a self,
        _ctx: &'a actors::tools::ToolContext,
        _args: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, actors::tools::ToolOutput> {
        Box::pin(async move {
            if !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
                panic!("tool crashed mid-run");
            }
            actors::tools::ToolOutput::ok("fine this time")
        })
    }
}

#[actix_web::test]
async fn a_run_actor_that_panics_is_restarted_through_the_resume_path_and_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        switchboard::Config::parse("t", switchboard::config::EMBEDDED, Vec::new()).unwrap();
    config.server.bind = "127.0.0.1:0".into();
    config.storage.path = dir.path().join("s.db");
    let tools = actors::tools::Toolbox::builtin().with(PanicOnce(Default::default()));
    let running = switchboard::start_with_tools(config, tools).await.unwrap();
    let client = reqwest::Client::new();
    let body: Value = client
        .post(format!("http://{}/api/messages", running.addr))
        .json(&json!({"thread": "tp", "channel": "c", "user": "u", "text": "steps=2 tool=panic_once"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let storage = running.storage.clone();
    let id = run_id.clone();
    let record = support::wait_until(std::time::Duration::from_secs(30), move || {
        let (s, id) = (storage.clone(), id.clone());
        async move {
            s.get(RunId::from(id))
                .await
                .ok()
                .flatten()
                .filter(|r| !r.head.provisional)
        }
    })
    .await
    .expect("the restarted run finished");
    assert_eq!(record.head.status, RunStatus::Completed);
    let t = types(&record.events);
    assert_eq!(t.iter().filter(|t| **t == "resumed").count(), 1, "{t:?}");
    assert_eq!(
        t.iter().filter(|t| **t == "input").count(),
        1,
        "never a second input: {t:?}"
    );
    let resumed = record
        .events
        .iter()
        .find(|e| e["type"] == "resumed")
        .unwrap();
    assert_eq!(resumed["settled"][0]["how"], "rerun", "{resumed}");
    // The counter continued past the replayed events.
    let seqs: Vec<u64> = record
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(resumed["seq"].as_u64().unwrap() >= 1000, "{resumed}");
}

/// A mutating tool whose first call leaves a task behind (a thread that writes into the workspace when
/// told to) and then panics: what "every task the failed actor spawned" means for a tool.
struct LeakThenPanic {
    go: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    leaked: std::sync::Mutex<Option<std::sync::mpsc::Sender<Result<(), String>>>>,
}

impl actors::tools::Tool for LeakThenPanic {
    fn def(&self) -> actors::agent::ToolDef {
        actors::agent::ToolDef {
            name: "leak_then_panic".into(),
            description: "leaves a writer behind, then panics (first call); appends a line after"
                .into(),
            parameters: json!({"type": "object"}),
            side_effect_free: false,
            rerun_safe: false,
            idempotent: false,
        }
    }

    fn call<'a>(
        &'a self,
        ctx: &'a actors::tools::ToolContext,
        _args: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, actors::tools::ToolOutput> {
        let append = |workspace: &std::path::Path, line: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(workspace.join("steps.log"))
                .unwrap();
            writeln!(f, "{line}").unwrap();
        };
        let (workspace, fence) = (ctx.workspace.clone(), ctx.gen.clone());
        let go = self.go.lock().unwrap().take();
        let report = self.leaked.lock().unwrap().take();
        if let (Some(go), Some(report)) = (go, report) {
            std::thread::spawn(move || {
                let _ = go.recv();
                let out = actors::tools::with_fence(
                    &workspace,
                    &fence,
                    std::time::Duration::from_secs(5),
                    || append(&workspace, "leaked"),
                );
                let _ = report.send(out.map_err(|e| e.to_string()));
            });
            panic!("tool crashed after spawning a writer");
        }
        Box::pin(async move {
            let out = actors::tools::with_fence(
                &workspace,
                &fence,
                std::time::Duration::from_secs(5),
                || append(&workspace, "written"),
            );
            match out {
                Ok(()) => actors::tools::ToolOutput::ok("written"),
                Err(e) => actors::tools::ToolOutput::err(e.to_string()),
            }
        })
    }
}

#[actix_web::test]
async fn a_task_left_by_a_panicked_run_cannot_write_after_the_readoption() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        switchboard::Config::parse("t", switchboard::config::EMBEDDED, Vec::new()).unwrap();
    config.server.bind = "127.0.0.1:0".into();
    config.storage.path = dir.path().join("s.db");
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    let (leak_tx, leak_rx) = std::sync::mpsc::channel();
    let tool = LeakThenPanic {
        go: std::sync::Mutex::new(Some(go_rx)),
        leaked: std::sync::Mutex::new(Some(leak_tx)),
    };
    let running =
        switchboard::start_with_tools(config, actors::tools::Toolbox::builtin().with(tool))
            .await
            .unwrap();
    let client = reqwest::Client::new();
    let body: Value = client
        .post(format!("http://{}/api/messages", running.addr))
        .json(&json!({"thread": "tl", "channel": "c", "user": "u", "text": "steps=2 tool=leak_then_panic"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let storage = running.storage.clone();
    let id = run_id.clone();
    let record = support::wait_until(std::time::Duration::from_secs(30), move || {
        let (s, id) = (storage.clone(), id.clone());
        async move {
            s.get(RunId::from(id))
                .await
                .ok()
                .flatten()
                .filter(|r| !r.head.provisional)
        }
    })
    .await
    .expect("the re-adopted run finished");
    assert_eq!(record.head.status, RunStatus::Completed);
    let resumed = record
        .events
        .iter()
        .find(|e| e["type"] == "resumed")
        .expect("re-adopted");
    assert_eq!(resumed["settled"][0]["how"], "effects_unknown", "{resumed}");
    // Now the left-behind writer tries: the re-adopted incarnation owns the workspace fence.
    go_tx.send(()).unwrap();
    let leaked = tokio::task::spawn_blocking(move || {
        leak_rx.recv_timeout(std::time::Duration::from_secs(10))
    })
    .await
    .unwrap()
    .expect("the writer reported");
    assert!(
        leaked
            .as_ref()
            .is_err_and(|e| e.contains("is owned by generation")),
        "fenced out: {leaked:?}"
    );
    let workspace = dir.path().join("workspaces").join(&run_id);
    let lines = std::fs::read_to_string(workspace.join("steps.log")).unwrap_or_default();
    assert!(!lines.contains("leaked"), "{lines}");
    assert!(
        lines.contains("written"),
        "the re-adopted run wrote: {lines}"
    );
}

/// A side-effect-free tool that always panics.
struct PanicAlways;

impl actors::tools::Tool for PanicAlways {
    fn def(&self) -> actors::agent::ToolDef {
        actors::agent::ToolDef {
            name: "panic_always".into(),
            description: "panics every time".into(),
            parameters: json!({"type": "object"}),
            side_effect_free: true,
            rerun_safe: true,
            idempotent: false,
        }
    }

    fn call<'a>(
        &'a self,
        _ctx: &'a actors::tools::ToolContext,
        _args: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, actors::tools::ToolOutput> {
        panic!("this tool always crashes")
    }
}

#[actix_web::test]
async fn a_run_that_panics_past_the_restart_policy_closes_failed_and_frees_its_thread() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        switchboard::Config::parse("t", switchboard::config::EMBEDDED, Vec::new()).unwrap();
    config.server.bind = "127.0.0.1:0".into();
    config.storage.path = dir.path().join("s.db");
    assert_eq!(
        config.supervisor.max_restarts, 1,
        "the default policy: one re-adoption"
    );
    let running =
        switchboard::start_with_tools(config, actors::tools::Toolbox::builtin().with(PanicAlways))
            .await
            .unwrap();
    let client = reqwest::Client::new();
    let post = |text: &'static str| {
        let client = client.clone();
        let url = format!("http://{}/api/messages", running.addr);
        async move {
            client
                .post(url)
                .json(&json!({"thread": "tf", "channel": "c", "user": "u", "text": text}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let body = post("steps=1 tool=panic_always").await;
    let run_id = body["runId"].as_str().unwrap().to_owned();
    let storage = running.storage.clone();
    let id = run_id.clone();
    let record = support::wait_until(std::time::Duration::from_secs(30), move || {
        let (s, id) = (storage.clone(), id.clone());
        async move {
            s.get(RunId::from(id))
                .await
                .ok()
                .flatten()
                .filter(|r| !r.head.provisional)
        }
    })
    .await
    .expect("the run was closed");
    assert_eq!(record.head.status, RunStatus::Failed);
    let t = types(&record.events);
    assert_eq!(
        t.iter().filter(|t| **t == "resumed").count(),
        1,
        "re-adopted once, then closed: {t:?}"
    );
    assert!(t.contains(&"run_failed"), "{t:?}");
    assert!(
        running.storage.list_live().await.unwrap().is_empty(),
        "no live row remains"
    );
    assert_eq!(running.metrics.restarts("panicked"), 2);
    // The thread is free: the next message starts a new run.
    let next = post("steps=0 answer=ok").await;
    assert_eq!(next["outcome"], "started", "{next}");
}
