//! Cross-host news on PostgreSQL (SPEC §1.3): two handles on one database play two hosts. A write on
//! one reaches the other's feed as a small note once it commits — appended events (with the last seq),
//! stop requests, kills and the end of a run — and nothing is said for a write that did not commit.

use std::time::Duration;
use storage::RunId;

use serde_json::json;
use storage::ledger::{Admit, Promotion, RunLedger, StopMode};
use storage::record::validate_record;
use storage::testing::pg;
use storage::{BackendSpec, News, PgStore, StorageHandle, SystemClock};
use tokio::sync::broadcast;

const GEN: &str = "20260101T000000Z-00000a01";

fn host(url: &str) -> StorageHandle {
    StorageHandle::start(
        BackendSpec::Postgres {
            url: url.to_owned(),
            pool: 1,
        },
        std::sync::Arc::new(SystemClock),
    )
}

/// The next note that is not a `Resync`, within 5 s.
async fn next(rx: &mut broadcast::Receiver<News>) -> News {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Ok(News::Resync)) => continue,
            Ok(Ok(news)) => return news,
            Ok(Err(e)) => panic!("feed: {e}"),
            Err(_) => panic!("no note within 5 s"),
        }
    }
}

/// A receiver whose listener is known to listen (it said `Resync`).
async fn listening(h: &StorageHandle) -> broadcast::Receiver<News> {
    let mut rx = h.news().expect("postgres has news");
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        Ok(Ok(News::Resync)) => rx,
        other => panic!("the listener's first note should be Resync: {other:?}"),
    }
}

async fn live_run(h: &StorageHandle, run_id: &RunId) {
    let admit = Admit {
        thread_key: format!("C1:{run_id}"),
        gen: GEN.into(),
        run_id: run_id.clone(),
        request: json!({"text": "hi"}),
        meta: json!({"agent": "demo", "request": {"text": "hi"}}),
        key: None,
        lease_ms: 60_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    h.admit(admit, h.clock().now_ms()).await.unwrap();
    let promotion = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 60_000,
    };
    h.claim(run_id.clone(), GEN.into(), promotion)
        .await
        .unwrap()
        .unwrap();
}

/// Synchronous client work, off the test's runtime thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking work")
}

fn event(seq: u64) -> serde_json::Value {
    json!({"type": "note", "seq": seq, "at": 1, "kind": "k", "summary": "s"})
}

#[actix_rt::test]
async fn a_write_on_one_host_reaches_the_other_as_a_note_once_it_commits() {
    let url = pg::database();
    let (a, b) = (host(&url), host(&url));
    let mut news = listening(&b).await;
    live_run(&a, &RunId::from("r1")).await;

    a.append("r1".into(), GEN.into(), vec![event(1), event(2), event(3)])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next(&mut news).await,
        News::Appended {
            run_id: "r1".into(),
            seq: 3
        }
    );

    // A refused write commits nothing and says nothing: the next note is the stop.
    let fenced = a
        .append(
            "r1".into(),
            "20260101T000000Z-0000dead".into(),
            vec![event(4)],
        )
        .await
        .unwrap();
    assert!(fenced.is_err(), "another generation's append is fenced");
    b.request_stop("r1".into(), StopMode::Soft)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next(&mut news).await,
        News::Stop {
            run_id: "r1".into()
        }
    );

    let record = validate_record(&json!({
        "id": "r1", "channelId": "C1", "userId": "U1", "threadKey": "C1:r1", "channelVisibility": "public",
        "startedAt": 1, "finishedAt": 2, "status": "completed", "eventCount": 3, "storedEventCount": 3,
        "truncated": false, "events": [event(1), event(2), event(3)]
    }))
    .unwrap();
    a.finish(GEN.into(), record, None, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next(&mut news).await,
        News::Ended {
            run_id: "r1".into()
        }
    );

    a.kill("r1".into()).await.unwrap();
    assert_eq!(
        next(&mut news).await,
        News::Killed {
            run_id: "r1".into()
        }
    );
}

/// Wait (up to 10 s) until `h`'s commits send their notes (`true`) or keep them (`false`).
async fn heard(h: &StorageHandle, want: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h.heard() != Some(want) {
        assert!(
            std::time::Instant::now() < deadline,
            "the audience never became {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A host alone on its database keeps its notes (its own listener would be their only reader). A
/// second host's start is heard at once: the first says Resync to everyone — what it wrote alone is
/// re-read — and its later writes reach both.
#[actix_rt::test]
async fn a_lone_host_keeps_its_notes_until_another_host_listens() {
    let url = pg::database();
    let a = host(&url);
    let mut own = listening(&a).await;
    heard(&a, false).await;
    live_run(&a, &RunId::from("r1")).await;
    a.append("r1".into(), GEN.into(), vec![event(1)])
        .await
        .unwrap()
        .unwrap();

    let b = host(&url);
    let mut news = listening(&b).await;
    heard(&a, true).await;
    assert!(
        b.heard() == Some(true),
        "a host that finds another sends its notes"
    );
    // The resync `a` owed arrives at `b` after `b`'s own (a host's first note is its own resync).
    match tokio::time::timeout(Duration::from_secs(5), news.recv()).await {
        Ok(Ok(News::Resync)) => {}
        other => panic!("the lone host's resync: {other:?}"),
    }
    a.append("r1".into(), GEN.into(), vec![event(2)])
        .await
        .unwrap()
        .unwrap();
    let noted = News::Appended {
        run_id: "r1".into(),
        seq: 2,
    };
    assert_eq!(next(&mut news).await, noted);
    // `a` hears its own notes too: the first is the second append's, so the first append said nothing.
    assert_eq!(next(&mut own).await, noted);
}

/// A note sent inside an atomic unit that rolls back is never delivered: the unit spoils its group,
/// which commits nothing (`GroupRolledBack`); the rest of the group, run again alone, delivers its own.
#[actix_rt::test]
async fn a_rolled_back_unit_takes_its_notes_with_it() {
    let url = pg::database();
    let watcher = host(&url);
    let mut news = listening(&watcher).await;
    let seed = host(&url);
    live_run(&seed, &RunId::from("kept")).await;
    live_run(&seed, &RunId::from("doomed")).await;
    blocking(move || {
        let mut s = PgStore::open(&url).unwrap();
        assert!(s.begin_group().unwrap());
        s.begin_atomic().unwrap();
        s.append(&RunId::from("doomed"), GEN, &[event(1)])
            .unwrap()
            .unwrap();
        s.end_atomic(false).unwrap();
        s.append(&RunId::from("kept"), GEN, &[event(7)])
            .unwrap()
            .unwrap();
        assert!(matches!(
            s.end_group(true),
            Err(storage::Error::GroupRolledBack(_))
        ));
        s.append(&RunId::from("kept"), GEN, &[event(7)])
            .unwrap()
            .unwrap();
    })
    .await;
    assert_eq!(
        next(&mut news).await,
        News::Appended {
            run_id: "kept".into(),
            seq: 7
        }
    );
    // Nothing else follows (a stop on `kept` is the next note, not `doomed`'s append).
    seed.request_stop("kept".into(), StopMode::Hard)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next(&mut news).await,
        News::Stop {
            run_id: "kept".into()
        }
    );
}

/// The listener's connection dies (the server terminates it): it reconnects and says `Resync`, and
/// later notes arrive again.
#[actix_rt::test]
async fn a_listener_that_lost_its_connection_reconnects_and_says_resync() {
    let url = pg::database();
    let (a, b) = (host(&url), host(&url));
    listening(&b).await;
    live_run(&a, &RunId::from("r1")).await;
    let killed: i64 = blocking(move || {
        PgStore::open(&url)
            .unwrap()
            .connection()
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'switchboard-news'",
                &[],
            )
            .unwrap()
            .get(0)
    })
    .await;
    // One per host: a host listens from its start (its runs' inbox reads follow the notes).
    assert_eq!(killed, 2, "one listener connection per host");
    // What `b` hears from now: its listener says Resync once it listens again.
    let mut news = b.news().expect("postgres has news");
    match tokio::time::timeout(Duration::from_secs(10), news.recv()).await {
        Ok(Ok(News::Resync)) => {}
        other => panic!("a reconnect says Resync: {other:?}"),
    }
    // `a`'s listener may have come back first and found itself alone; `b`'s hello is heard.
    heard(&a, true).await;
    a.append("r1".into(), GEN.into(), vec![event(1)])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next(&mut news).await,
        News::Appended {
            run_id: "r1".into(),
            seq: 1
        }
    );
}
