//! The storage handle under read load (SPEC §1.2): reads run on read-only connections, never queued
//! behind writes, so heartbeats and durable steps keep their latency while hundreds of readers hammer
//! `live_events` and `list` on the same handle — and no lease is lost.
//!
//! Real SQLite file (WAL, `synchronous = FULL`), real clock: the point is wall-clock latency. Bounds are
//! generous (1 s per heartbeat); the figures are printed for the report (`--nocapture`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::RunId;

use serde_json::{json, Value};
use storage::ledger::{Admit, AdmitOutcome, Promotion, StepRecord, Turn};
use storage::record::{validate_record, VisibilityFilter};
use storage::store::ListQuery;
use storage::{BackendSpec, Clock, StorageHandle, Synchronous, SystemClock};

const GEN: &str = "20260101T000000Z-00000001";
const LEASE_MS: i64 = 3_000;
const READERS: usize = 500;
const HEARTBEATS: usize = 150;

fn admission(run_id: &RunId, thread: &str, now: i64) -> Admit {
    Admit {
        thread_key: thread.into(),
        gen: GEN.into(),
        run_id: run_id.clone(),
        request: json!({"text": "x"}),
        meta: json!({"agent": "demo", "request": {"text": "x"}, "deadline": now + 600_000}),
        key: None,
        lease_ms: LEASE_MS,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    }
}

fn event(seq: u64, now: i64) -> Value {
    json!({"type": "note", "seq": seq, "at": now, "kind": "progress", "summary": format!("event {seq} {}", "x".repeat(200))})
}

fn record(id: &str, finished_at: i64) -> storage::record::RunRecord {
    validate_record(&json!({"id": id, "channelId": "c", "userId": "u", "threadKey": format!("c:{id}"),
        "channelVisibility": "public", "startedAt": finished_at - 10, "finishedAt": finished_at, "status": "completed",
        "eventCount": 1, "storedEventCount": 1, "truncated": false,
        "events": [{"type": "answer", "seq": 1, "at": finished_at, "text": "done"}]}))
    .expect("valid record")
}

fn step(n: u64, turn_index: u64) -> StepRecord {
    StepRecord {
        step: n,
        seq: n,
        turn_index,
        in_flight: vec![],
        inbox_consumed_seq: None,
        remaining_ms: 1,
        turn: n,
        iteration: n,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[actix_rt::test]
async fn heartbeats_and_steps_keep_their_latency_under_five_hundred_concurrent_readers() {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let spec = BackendSpec::Sqlite {
        path: dir.path().join("load.db"),
        synchronous: Synchronous::Full,
    };
    let h = StorageHandle::start(spec, clock.clone());
    h.ping().await.unwrap();

    // A history worth listing, and a live run with a few hundred events worth following.
    let now = clock.now_ms();
    for i in 0..200 {
        assert!(
            h.put(record(&format!("done-{i:03}"), now - i), None)
                .await
                .unwrap()
                .stored
        );
    }
    assert_eq!(
        h.admit(admission(&RunId::from("watched"), "c:watched", now), now)
            .await
            .unwrap(),
        AdmitOutcome::Started {
            run_id: "watched".into()
        }
    );
    let events: Vec<Value> = (1..=300).map(|s| event(s, now)).collect();
    h.append("watched".into(), GEN.into(), events)
        .await
        .unwrap()
        .unwrap();

    // The run whose lease must never lapse.
    assert_eq!(
        h.admit(admission(&RunId::from("beating"), "c:beating", now), now)
            .await
            .unwrap(),
        AdmitOutcome::Started {
            run_id: "beating".into()
        }
    );
    let p = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: LEASE_MS,
    };
    h.claim("beating".into(), GEN.into(), p)
        .await
        .unwrap()
        .unwrap();

    // 500 readers, each in a loop until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let read_errors = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::with_capacity(READERS);
    for i in 0..READERS {
        let (h, stop, reads, read_errors) =
            (h.clone(), stop.clone(), reads.clone(), read_errors.clone());
        readers.push(actix_rt::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let ok = if i % 2 == 0 {
                    h.live_events("watched".into(), 0, 1000)
                        .await
                        .map(|e| e.is_some_and(|e| e.len() == 300))
                } else {
                    h.list(ListQuery::visible_to(VisibilityFilter::All))
                        .await
                        .map(|p| p.items.len() == 50)
                };
                match ok {
                    Ok(true) => reads.fetch_add(1, Ordering::Relaxed),
                    _ => read_errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    // Let the readers fill every queue first.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Heartbeats every 20 ms, a durable step every fifth beat; each timed.
    let mut beat_latency = Vec::with_capacity(HEARTBEATS);
    let mut step_latency = Vec::new();
    let mut turn_index = 0;
    let started = Instant::now();
    for i in 0..HEARTBEATS {
        let t = Instant::now();
        let answer = h.heartbeat("beating".into(), GEN.into(), LEASE_MS).await;
        beat_latency.push(t.elapsed());
        assert!(
            matches!(answer, Ok(Ok(_))),
            "heartbeat {i} answered {answer:?}"
        );
        if i % 5 == 0 {
            let n = (i / 5) as u64;
            let turns = vec![Turn {
                role: "assistant".into(),
                parts: vec![json!(format!("step {n}"))],
            }];
            let t = Instant::now();
            let out = h
                .durable_step(
                    "beating".into(),
                    GEN.into(),
                    turn_index,
                    turns,
                    step(n, turn_index + 1),
                    vec![],
                )
                .await;
            step_latency.push(t.elapsed());
            assert!(matches!(out, Ok(Ok(()))), "step {n} answered {out:?}");
            turn_index += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }

    // No lease was lost: the row is still this generation's, its lease in the future.
    let row = h
        .get_live("beating".into())
        .await
        .unwrap()
        .expect("the run is still live");
    assert_eq!(row.owner_gen, GEN);
    assert!(
        row.lease_until > clock.now_ms(),
        "lease {} lapsed",
        row.lease_until
    );

    beat_latency.sort();
    step_latency.sort();
    let reads = reads.load(Ordering::Relaxed);
    eprintln!(
        "under {READERS} readers: {reads} reads in {elapsed:?} ({:.0}/s), {} read errors; heartbeat p50 {:?} p99 {:?} max {:?}; \
         durable step p50 {:?} max {:?}",
        reads as f64 / elapsed.as_secs_f64(),
        read_errors.load(Ordering::Relaxed),
        percentile(&beat_latency, 0.5),
        percentile(&beat_latency, 0.99),
        beat_latency.last().unwrap(),
        percentile(&step_latency, 0.5),
        step_latency.last().unwrap(),
    );
    let stats = h.group_stats();
    eprintln!(
        "reads on read-only connections: {}, refused (readers' queue full): {}; writes refused (actor queue full): {}",
        stats.pooled_reads.load(Ordering::Relaxed),
        stats.reads_rejected.load(Ordering::Relaxed),
        stats.rejected.load(Ordering::Relaxed),
    );
    assert!(reads > 0, "the readers made progress");
    assert_eq!(
        read_errors.load(Ordering::Relaxed),
        0,
        "every read answered (the queues hold 500 readers)"
    );
    assert!(
        stats.pooled_reads.load(Ordering::Relaxed) >= reads,
        "every read ran on a read-only connection"
    );
    let worst = *beat_latency.last().unwrap();
    assert!(worst < Duration::from_secs(1), "a heartbeat took {worst:?}");
    let worst = *step_latency.last().unwrap();
    assert!(
        worst < Duration::from_secs(1),
        "a durable step took {worst:?}"
    );
}
