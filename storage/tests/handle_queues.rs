//! The storage handle's queues and readers (SPEC §1.2): the actor's queue is bounded and a full one
//! answers `Unavailable` at once (counted), never blocks; reads of the SQLite backend run on read-only
//! connections, so they answer while the actor is busy and never write; the readers' queue is bounded
//! too. And the sweep's `prune_dead` keeps every generation not found dead.
//!
//! The actor (or a reader) is held busy by a job that waits on a channel the test releases, so "busy"
//! is a fact of the test, not a race.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use storage::ledger::{Admit, AdmitOutcome, GenerationInfo, PruneReport, ReceiptKey};
use storage::record::{validate_record, VisibilityFilter};
use storage::store::ListQuery;
use storage::{
    BackendSpec, Error, ManualClock, MemoryStore, StorageHandle, StorageOptions, Synchronous,
};

const NOW: i64 = 1_800_000_000_000;
const DAY: i64 = 86_400_000;

fn record(id: &str) -> storage::record::RunRecord {
    validate_record(&json!({"id": id, "channelId": "c", "userId": "u", "threadKey": "c:t", "startedAt": NOW,
        "finishedAt": NOW, "status": "completed", "eventCount": 1, "storedEventCount": 1, "truncated": false,
        "events": [{"type": "answer", "seq": 1, "at": NOW, "text": "x"}]}))
    .unwrap()
}

fn sqlite(dir: &std::path::Path) -> BackendSpec {
    BackendSpec::Sqlite {
        path: dir.join("t.db"),
        synchronous: Synchronous::Normal,
    }
}

/// Wait (politely, without blocking the runtime) until `check` holds, at most 5 s.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Hold the storage thread busy with a [`holding`] job until the answered sender is sent to (or dropped).
async fn hold_actor(
    h: &StorageHandle,
) -> (
    actix_rt::task::JoinHandle<storage::Result<()>>,
    mpsc::Sender<()>,
) {
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let held = actix_rt::spawn({
        let h = h.clone();
        async move { h.transact_for_test(holding(entered_tx, release_rx)).await }
    });
    until("the actor holds", || entered.try_recv().is_ok()).await;
    (held, release)
}

/// A job for `transact_for_test` / `read_for_test` that says when it started and then holds its thread
/// until released.
fn holding(
    entered: mpsc::Sender<()>,
    release: mpsc::Receiver<()>,
) -> impl FnOnce(&mut dyn storage::actor::Backend, i64) -> storage::Result<()> + Send + 'static {
    move |_, _| {
        let _ = entered.send(());
        let _ = release.recv_timeout(Duration::from_secs(10));
        Ok(())
    }
}

#[actix_rt::test]
async fn a_full_actor_queue_answers_unavailable_at_once_and_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    for (name, spec) in [
        ("memory", BackendSpec::Memory(MemoryStore::new())),
        ("sqlite", sqlite(dir.path())),
    ] {
        let options = StorageOptions {
            queue_capacity: 2,
            ..Default::default()
        };
        let h = StorageHandle::start_with(spec, Arc::new(ManualClock::new(NOW)), options);
        // The actor takes the holding job and waits; two more fill its queue of two.
        let (held, release) = hold_actor(&h).await;
        let queued: Vec<_> = (0..2)
            .map(|i| {
                let h = h.clone();
                actix_rt::spawn(async move { h.put(record(&format!("q{i}")), None).await })
            })
            .collect();
        let stats = h.group_stats();
        until("two messages are queued", || {
            stats.queued.load(Relaxed) == 2
        })
        .await;

        // The third write is refused at once, transient, and counted.
        let t = Instant::now();
        let err = h.put(record("refused"), None).await.unwrap_err();
        let took = t.elapsed();
        assert!(
            matches!(&err, Error::Unavailable(m) if m.contains("full")),
            "{name}: {err:?}"
        );
        assert!(err.is_transient(), "{name}: callers retry a full queue");
        assert!(
            took < Duration::from_millis(200),
            "{name}: a full queue never blocks ({took:?})"
        );
        assert_eq!(stats.rejected.load(Relaxed), 1, "{name}");

        // Released, everything queued lands, and the queue takes messages again.
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        for q in queued {
            assert!(q.await.unwrap().unwrap().stored, "{name}");
        }
        assert!(h.put(record("after"), None).await.unwrap().stored, "{name}");
        assert_eq!(
            h.get("refused".into()).await.unwrap(),
            None,
            "{name}: the refused write never happened"
        );
        assert_eq!(stats.queued.load(Relaxed), 0, "{name}");
    }
}

/// A lone run's write runs on its caller's thread — no hand-off — while the storage thread is idle with
/// nothing queued, and so does its read; with more live runs, with the thread busy, or on a handle that
/// never asked, it is queued for the storage thread (or a reader). Every one of them answers and lands.
#[actix_rt::test]
async fn a_lone_runs_write_runs_on_its_callers_thread_only_while_the_storage_thread_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    for (name, spec) in [
        ("memory", BackendSpec::Memory(MemoryStore::new())),
        ("sqlite", sqlite(dir.path())),
    ] {
        let clock = Arc::new(ManualClock::new(NOW));
        let plain = StorageHandle::start(spec, clock);
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(1));
        let h = plain.clone().here_when_alone(live.clone());
        let stats = h.group_stats();
        let caller = std::thread::current().id();
        let here = || async {
            h.transact_for_test(|_, _| Ok(std::thread::current().id()))
                .await
                .unwrap()
                == caller
        };
        assert!(here().await, "{name}: alone, idle");
        assert!(h.put(record("alone"), None).await.unwrap().stored, "{name}");
        assert_eq!(stats.here.load(Relaxed), 2, "{name}");
        // A read too (SQLite's on the readers' spare connection; the memory backend reads on the actor).
        assert!(h.get("alone".into()).await.unwrap().is_some(), "{name}");
        let reads_here = usize::from(name == "sqlite") as u64;
        assert_eq!(stats.reads_here.load(Relaxed), reads_here, "{name}");

        live.store(2, Relaxed);
        assert!(!here().await, "{name}: another live run");
        assert!(h.get("alone".into()).await.unwrap().is_some(), "{name}");
        assert_eq!(stats.reads_here.load(Relaxed), reads_here, "{name}: queued");
        let ran_on = plain
            .transact_for_test(|_, _| Ok(std::thread::current().id()))
            .await
            .unwrap();
        assert_ne!(ran_on, caller, "{name}: a handle that never asked");

        // The storage thread busy (the holding job went to it while two runs were live): a lone run's
        // write waits in the queue and lands once the thread is free.
        let (held, release) = hold_actor(&h).await;
        live.store(1, Relaxed);
        let ran_here = stats.here.load(Relaxed);
        let queued = actix_rt::spawn({
            let h = h.clone();
            async move { h.put(record("queued"), None).await }
        });
        until("the write is queued", || stats.queued.load(Relaxed) == 1).await;
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        assert!(queued.await.unwrap().unwrap().stored, "{name}");
        assert_eq!(
            stats.here.load(Relaxed),
            ran_here,
            "{name}: nothing more ran here"
        );
        for id in ["alone", "queued"] {
            assert!(h.get(id.into()).await.unwrap().is_some(), "{name}: {id}");
        }
        // The thread answers inside its group, so it may still hold the lock a moment after answering.
        let mut again = false;
        for _ in 0..100 {
            if here().await {
                again = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(again, "{name}: idle again, a lone write runs here again");
    }
}

#[actix_rt::test]
async fn reads_answer_on_read_only_connections_while_the_actor_is_busy() {
    let dir = tempfile::tempdir().unwrap();
    let h = StorageHandle::start(sqlite(dir.path()), Arc::new(ManualClock::new(NOW)));
    assert!(h.put(record("r1"), None).await.unwrap().stored);
    let (held, release) = hold_actor(&h).await;
    // A write queued behind the busy actor…
    let write = actix_rt::spawn({
        let h = h.clone();
        async move { h.put(record("r2"), None).await }
    });
    // …does not hold up reads: each answers from a reader, seeing what was committed (r1, not r2).
    let t = Instant::now();
    assert_eq!(h.get("r1".into()).await.unwrap(), Some(record("r1")));
    let page = h
        .list(ListQuery::visible_to(VisibilityFilter::All))
        .await
        .unwrap();
    assert_eq!(
        page.items
            .iter()
            .map(|i| i.head.id.as_str())
            .collect::<Vec<_>>(),
        ["r1"]
    );
    assert_eq!(h.list_live().await.unwrap(), vec![]);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "reads waited for the actor: {:?}",
        t.elapsed()
    );
    let stats = h.group_stats();
    assert!(stats.pooled_reads.load(Relaxed) >= 3);
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    assert!(write.await.unwrap().unwrap().stored);
    // A write whose answer the caller holds is visible to its next read.
    assert_eq!(h.get("r2".into()).await.unwrap(), Some(record("r2")));
}

#[actix_rt::test]
async fn a_readers_connection_refuses_writes_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = StorageHandle::start(sqlite(dir.path()), Arc::new(ManualClock::new(NOW)));
    h.ping().await.unwrap();
    let err = h
        .read_for_test(|b, now| b.put(&record("sneaky"), None, now))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Sqlite(_)), "{err:?}");
    assert_eq!(h.get("sneaky".into()).await.unwrap(), None);
    // The reader keeps serving.
    assert!(h.put(record("r1"), None).await.unwrap().stored);
    assert!(h.get("r1".into()).await.unwrap().is_some());
}

#[actix_rt::test]
async fn a_full_readers_queue_answers_unavailable_at_once_and_writes_still_go_through() {
    let dir = tempfile::tempdir().unwrap();
    let options = StorageOptions {
        readers: 1,
        read_queue_capacity: 1,
        ..Default::default()
    };
    let h = StorageHandle::start_with(sqlite(dir.path()), Arc::new(ManualClock::new(NOW)), options);
    h.ping().await.unwrap();
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let held = actix_rt::spawn({
        let h = h.clone();
        async move { h.read_for_test(holding(entered_tx, release_rx)).await }
    });
    until("the reader holds", || entered.try_recv().is_ok()).await;
    let queued = actix_rt::spawn({
        let h = h.clone();
        async move { h.list_live().await }
    });
    let stats = h.group_stats();
    until("one read is queued", || {
        stats.reads_queued.load(Relaxed) == 1
    })
    .await;
    let t = Instant::now();
    let err = h.get("r1".into()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Unavailable(m) if m.contains("full")),
        "{err:?}"
    );
    assert!(t.elapsed() < Duration::from_millis(200));
    assert_eq!(stats.reads_rejected.load(Relaxed), 1);
    // Writes never queue behind reads: the actor answers while the reader is held.
    assert!(h.put(record("r1"), None).await.unwrap().stored);
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    assert_eq!(queued.await.unwrap().unwrap(), vec![]);
    assert!(h.get("r1".into()).await.unwrap().is_some());
}

#[actix_rt::test]
async fn prune_dead_takes_only_dead_idle_old_generations_and_receipts_past_the_configured_ttl() {
    let dir = tempfile::tempdir().unwrap();
    for (name, spec) in [
        ("memory", BackendSpec::Memory(MemoryStore::new())),
        ("sqlite", sqlite(dir.path())),
    ] {
        let clock = ManualClock::new(NOW);
        let options = StorageOptions {
            receipt_ttl_ms: 60_000,
            ..Default::default()
        };
        let h = StorageHandle::start_with(spec, Arc::new(clock.clone()), options);
        assert_eq!(h.receipt_ttl_ms(), 60_000);
        let gen = |g: &str, started_at: i64| GenerationInfo {
            gen: g.into(),
            host: "h".into(),
            host_id: "h".into(),
            pid: 1,
            proc_start: "1".into(),
            started_at,
        };
        let (own, idle, dead) = (
            "20260101T000000Z-00000001",
            "20260101T000000Z-00000002",
            "20260101T000000Z-00000003",
        );
        for g in [own, idle, dead] {
            h.record_generation(gen(g, NOW - 2 * DAY)).await.unwrap();
        }
        // A keyed run that ends at NOW.
        let admit = Admit {
            thread_key: "c:t".into(),
            gen: own.into(),
            run_id: "r1".into(),
            request: json!({"text": "x"}),
            meta: json!({"agent": "demo", "request": {"text": "x"}}),
            key: Some(ReceiptKey {
                scope: "tok".into(),
                key: "k".into(),
                body_hash: "h".into(),
            }),
            lease_ms: 30_000,
            writer: None,
            strategy: storage::ledger::Strategy::Steer,
        };
        assert_eq!(
            h.admit(admit, NOW).await.unwrap(),
            AdmitOutcome::Started {
                run_id: "r1".into()
            }
        );
        h.finish(own.into(), record("r1"), None, None)
            .await
            .unwrap()
            .unwrap();

        // Only the generation found dead goes; the idle one (alive, just old and rowless) stays.
        let report = h.prune_dead(vec![dead.into()]).await.unwrap();
        assert_eq!(
            report,
            PruneReport {
                generations: 1,
                ..Default::default()
            },
            "{name}"
        );
        let left: Vec<String> = h
            .generations()
            .await
            .unwrap()
            .into_iter()
            .map(|g| g.gen)
            .collect();
        assert_eq!(left, [own, idle], "{name}");
        // The receipt lives the configured TTL after its run ended, then goes.
        clock.advance(59_999);
        assert_eq!(
            h.prune_dead(vec![]).await.unwrap(),
            PruneReport::default(),
            "{name}"
        );
        clock.advance(1);
        assert_eq!(h.prune_dead(vec![]).await.unwrap().receipts, 1, "{name}");
        assert_eq!(h.table_rows().await.unwrap().admit_receipts, 0, "{name}");
    }
}
