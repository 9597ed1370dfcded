//! A soak of short runs through the storage handle, against every backend (SPEC §4.3 finish, §3
//! retention): 2,000 runs — admission with first events, promotion, seed and one more durable step,
//! a follow-up consumed and, for every tenth run, one left unread (its successor is admitted by the
//! finish and driven to its own finish), keyed admissions for every fourth — under `maxRuns = 100`.
//! The tables stay bounded while it runs, and once every run has finished no transcript, step or inbox
//! row is left; after the receipt TTL a prune leaves no receipt either.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::RunId;

use serde_json::{json, Value};
use storage::ledger::{
    Admit, AdmitOutcome, Promotion, ReceiptKey, StepRecord, Successor, TableRows, Turn,
};
use storage::record::{validate_record, RetentionPolicy, RunRecord, RunStatus};
use storage::store::PolicyProposal;
use storage::{BackendSpec, ManualClock, MemoryStore, StorageHandle, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const GEN: &str = "20260101T000000Z-00000001";
const DRIVERS: usize = 10;
const RUNS_PER_DRIVER: usize = 200;
const MAX_RUNS: u32 = 100;
const LEASE: i64 = 30_000;

fn proposal() -> PolicyProposal {
    PolicyProposal {
        policy: RetentionPolicy::clamp(30.0, f64::from(MAX_RUNS), 2.0 * 1024.0 * 1024.0 * 1024.0),
        updated_at: NOW,
    }
}

fn request(thread: &str, text: &str) -> Value {
    json!({"thread": thread, "channel": "c", "user": "u", "text": text})
}

fn admission(run_id: &RunId, thread: &str, keyed: bool) -> Admit {
    Admit {
        thread_key: thread.into(),
        gen: GEN.into(),
        run_id: run_id.clone(),
        request: request(thread, "go"),
        meta: json!({"agent": "demo", "model": "m", "label": "go", "threadKey": thread, "channelId": "c", "userId": "u",
            "channelVisibility": "machine", "deadline": NOW + 600_000, "request": request(thread, "go")}),
        key: keyed.then(|| ReceiptKey {
            scope: "tok".into(),
            key: format!("key-{run_id}"),
            body_hash: "h".into(),
        }),
        lease_ms: LEASE,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    }
}

fn step(n: u64, turn_index: u64, consumed: Option<u64>) -> StepRecord {
    StepRecord {
        step: n,
        seq: n + 2,
        turn_index,
        in_flight: vec![],
        inbox_consumed_seq: consumed,
        remaining_ms: 1_000,
        turn: n,
        iteration: n,
    }
}

fn record(id: &str, thread: &str, finished_at: i64) -> RunRecord {
    validate_record(&json!({"id": id, "channelId": "c", "userId": "u", "threadKey": thread, "channelVisibility": "machine",
        "startedAt": finished_at - 5, "finishedAt": finished_at, "status": "completed", "eventCount": 3, "storedEventCount": 3,
        "truncated": false, "events": [
            {"type": "run_meta", "seq": 1, "at": finished_at - 5, "agent": "demo"},
            {"type": "input", "seq": 2, "at": finished_at - 5, "text": "go", "source": "request"},
            {"type": "answer", "seq": 3, "at": finished_at, "text": "done"}]}))
    .expect("valid record")
}

/// Promote `run`, write its seed step, and finish it (no follow-ups).
async fn promote_and_finish(h: &StorageHandle, run: &str, thread: &str, finished_at: i64) {
    let p = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: LEASE,
    };
    h.claim(run.into(), GEN.into(), p).await.unwrap().unwrap();
    let seed = vec![
        Turn {
            role: "system".into(),
            parts: vec![json!("s")],
        },
        Turn {
            role: "user".into(),
            parts: vec![json!("go")],
        },
    ];
    h.durable_step(run.into(), GEN.into(), 0, seed, step(0, 2, None), vec![])
        .await
        .unwrap()
        .unwrap();
    h.finishing(
        run.into(),
        GEN.into(),
        RunStatus::Completed,
        Some("done".into()),
    )
    .await
    .unwrap()
    .unwrap();
    let successor = Successor {
        run_id: RunId::from(format!("{run}-next")),
        lease_ms: LEASE,
        inbox_consumed: None,
    };
    h.finish(
        GEN.into(),
        record(run, thread, finished_at),
        Some(proposal()),
        Some(successor),
    )
    .await
    .unwrap()
    .unwrap();
}

/// One short run on `thread`; answers whether its finish admitted a successor.
async fn short_run(h: &StorageHandle, n: usize, thread: &str) -> bool {
    let run = format!("run-{n:05}");
    let first = vec![
        json!({"type": "run_meta", "seq": 1, "at": NOW, "agent": "demo"}),
        json!({"type": "input", "seq": 2, "at": NOW, "text": "go", "source": "request"}),
    ];
    let out = h
        .admit_with_events(
            admission(&RunId::from(&run), thread, n.is_multiple_of(4)),
            first,
            None,
            None,
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(
        out,
        (
            AdmitOutcome::Started {
                run_id: RunId::from(run.clone())
            },
            false
        )
    );
    let p = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: LEASE,
    };
    h.claim(RunId::from(run.clone()), GEN.into(), p)
        .await
        .unwrap()
        .unwrap();
    let seed = vec![
        Turn {
            role: "system".into(),
            parts: vec![json!("s")],
        },
        Turn {
            role: "user".into(),
            parts: vec![json!("go")],
        },
    ];
    h.durable_step(
        RunId::from(run.clone()),
        GEN.into(),
        0,
        seed,
        step(0, 2, None),
        vec![],
    )
    .await
    .unwrap()
    .unwrap();
    h.heartbeat(RunId::from(run.clone()), GEN.into(), LEASE)
        .await
        .unwrap()
        .unwrap();
    // A follow-up, folded into step 1.
    let seq = h
        .push_inbox(RunId::from(run.clone()), request(thread, "more"))
        .await
        .unwrap()
        .unwrap();
    let turns = vec![
        Turn {
            role: "tool_results".into(),
            parts: vec![json!("r"), json!("more")],
        },
        Turn {
            role: "assistant".into(),
            parts: vec![json!("a")],
        },
    ];
    let events = vec![
        json!({"type": "input", "seq": 3, "at": NOW, "text": "more", "source": "followup", "inboxSeq": seq}),
    ];
    h.durable_step(
        RunId::from(run.clone()),
        GEN.into(),
        2,
        turns,
        step(1, 4, Some(seq)),
        events,
    )
    .await
    .unwrap()
    .unwrap();
    // Every tenth run gets one more follow-up that it never reads.
    let unread = n.is_multiple_of(10);
    if unread {
        h.push_inbox(RunId::from(run.clone()), request(thread, "never read"))
            .await
            .unwrap()
            .unwrap();
    }
    h.finishing(
        RunId::from(run.clone()),
        GEN.into(),
        RunStatus::Completed,
        Some("done".into()),
    )
    .await
    .unwrap()
    .unwrap();
    let successor = Successor {
        run_id: RunId::from(format!("{run}-next")),
        lease_ms: LEASE,
        inbox_consumed: Some(seq),
    };
    let finished_at = NOW + n as i64;
    h.finish(
        GEN.into(),
        record(&run, thread, finished_at),
        Some(proposal()),
        Some(successor),
    )
    .await
    .unwrap()
    .unwrap();
    if unread {
        let next = format!("{run}-next");
        let row = h
            .get_live(RunId::from(next.clone()))
            .await
            .unwrap()
            .expect("the successor was admitted");
        assert_eq!(row.meta["request"]["text"], "never read");
        promote_and_finish(h, &next, thread, finished_at).await;
    }
    unread
}

async fn soak(name: &str, h: StorageHandle, clock: ManualClock) {
    let started = Instant::now();
    // Sample the tables while the soak runs: retention holds the history at maxRuns throughout.
    let done = Arc::new(AtomicBool::new(false));
    let monitor = actix_rt::spawn({
        let (h, done) = (h.clone(), done.clone());
        async move {
            let mut worst = TableRows::default();
            while !done.load(Ordering::Relaxed) {
                let rows = h.table_rows().await.unwrap();
                worst.runs = worst.runs.max(rows.runs);
                worst.live_runs = worst.live_runs.max(rows.live_runs);
                worst.transcript = worst.transcript.max(rows.transcript);
                worst.run_inbox = worst.run_inbox.max(rows.run_inbox);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            worst
        }
    });
    let drivers: Vec<_> = (0..DRIVERS)
        .map(|d| {
            let h = h.clone();
            actix_rt::spawn(async move {
                let thread = format!("c:thread-{d}");
                let mut successors = 0;
                for i in 0..RUNS_PER_DRIVER {
                    successors +=
                        usize::from(short_run(&h, d * RUNS_PER_DRIVER + i, &thread).await);
                }
                successors
            })
        })
        .collect();
    let mut successors = 0;
    for d in drivers {
        successors += d.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let worst = monitor.await.unwrap();
    let elapsed = started.elapsed();
    let runs = DRIVERS * RUNS_PER_DRIVER + successors;

    let rows = h.table_rows().await.unwrap();
    eprintln!("{name}: {runs} runs ({successors} successors) in {elapsed:?}; while running at most {worst:?}; after: {rows:?}");
    assert_eq!(successors, DRIVERS * RUNS_PER_DRIVER / 10);
    assert!(
        worst.runs <= u64::from(MAX_RUNS),
        "{name}: the history stayed within maxRuns: {worst:?}"
    );
    assert!(
        worst.live_runs <= DRIVERS as u64,
        "{name}: one live run per thread: {worst:?}"
    );
    assert!(
        worst.transcript <= 5 * DRIVERS as u64 && worst.run_inbox <= 2 * DRIVERS as u64,
        "{name}: at most one live run's rows per thread: {worst:?}"
    );
    assert_eq!(rows.runs, u64::from(MAX_RUNS), "{name}");
    assert!(
        rows.run_events <= 3 * u64::from(MAX_RUNS),
        "{name}: only the kept records' events: {rows:?}"
    );
    assert_eq!(
        (
            rows.live_runs,
            rows.run_steps,
            rows.transcript,
            rows.run_inbox
        ),
        (0, 0, 0, 0),
        "{name}: {rows:?}"
    );
    assert_eq!(
        rows.admit_receipts,
        (DRIVERS * RUNS_PER_DRIVER / 4) as u64,
        "{name}: receipts stay for their TTL"
    );

    // A TTL later, the sweep's prune leaves no receipt.
    clock.advance(h.receipt_ttl_ms());
    let report = h.prune_dead(vec![]).await.unwrap();
    assert_eq!(report.receipts, rows.admit_receipts, "{name}: {report:?}");
    assert_eq!(
        report.leftover_runs, 0,
        "{name}: finish left nothing to sweep up"
    );
    assert_eq!(h.table_rows().await.unwrap().admit_receipts, 0, "{name}");
}

#[actix_rt::test]
async fn two_thousand_short_runs_leave_bounded_tables_on_every_backend() {
    let clock = ManualClock::new(NOW);
    soak(
        "memory",
        StorageHandle::start(
            BackendSpec::Memory(MemoryStore::new()),
            Arc::new(clock.clone()),
        ),
        clock,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(NOW);
    let spec = BackendSpec::Sqlite {
        path: dir.path().join("soak.db"),
        synchronous: Synchronous::Normal,
    };
    soak(
        "sqlite",
        StorageHandle::start(spec, Arc::new(clock.clone())),
        clock,
    )
    .await;
}
