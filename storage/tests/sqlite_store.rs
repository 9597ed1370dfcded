//! SQLite-only behaviour of the history store: migrations, faults mid-transaction, several handles on one
//! file, and the storage actor in front of it.

use serde_json::json;
use storage::record::{validate_record, RunRecord, VisibilityFilter};
use storage::store::{ListQuery, RunStore};
use storage::RunId;
use storage::{BackendSpec, Error, ManualClock, SqliteStore, StorageHandle, Synchronous};

const NOW: i64 = 1_800_000_000_000;

fn record(id: &str, events: usize) -> RunRecord {
    let events: Vec<_> = (1..=events)
        .map(|i| json!({"type": "note", "seq": i, "at": NOW, "summary": "s"}))
        .collect();
    validate_record(&json!({
        "id": id, "channelId": "C1", "userId": "U1", "threadKey": "C1:t", "channelVisibility": "public",
        "startedAt": NOW - 10, "finishedAt": NOW, "status": "completed", "eventCount": events.len(),
        "storedEventCount": events.len(), "truncated": false, "events": events
    }))
    .expect("valid record")
}

fn open(path: &std::path::Path) -> SqliteStore {
    SqliteStore::open(path, Synchronous::Full).expect("open")
}

#[test]
fn crash_mid_put_leaves_no_row_and_no_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(&dir.path().join("t.db"));
    s.put(&record("before", 2), None, NOW).unwrap();
    // Fail the 3rd event insert of the next put, after its runs row and first events were written.
    s.connection()
        .execute_batch(
            "CREATE TRIGGER fail_third BEFORE INSERT ON run_events WHEN NEW.run_id = 'doomed' AND NEW.seq = 3
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END;",
        )
        .unwrap();
    let err = s.put(&record("doomed", 5), None, NOW).unwrap_err();
    assert!(matches!(err, Error::Sqlite(_)), "{err}");
    assert_eq!(s.get(&RunId::from("doomed"), NOW).unwrap(), None);
    let orphan_events: i64 = s
        .connection()
        .query_row(
            "SELECT COUNT(*) FROM run_events WHERE run_id = 'doomed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphan_events, 0);
    assert_eq!(
        s.get(&RunId::from("before"), NOW).unwrap(),
        Some(record("before", 2)),
        "earlier data untouched"
    );
}

#[test]
fn a_database_from_a_newer_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    open(&path).put(&record("kept", 1), None, NOW).unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let err = SqliteStore::open(&path, Synchronous::Full).unwrap_err();
    let supported = storage::sqlite::schema::current_version();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 99, supported: s } if s == supported),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("99") && msg.contains(&supported.to_string()),
        "{msg}"
    );
    // Nothing was touched: the stamp and the data are as they were.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let v: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!((v, n), (99, 1));
}

#[test]
fn reopening_keeps_data_schema_and_capability_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/t.db");
    let s = open(&path);
    let secret = s.capability_secret().unwrap();
    assert_eq!(secret.len(), 64);
    assert!(secret.chars().all(|c| c.is_ascii_hexdigit()));
    drop(s);
    let mut s = open(&path);
    assert_eq!(s.capability_secret().unwrap(), secret);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    s.put(&record("a", 1), None, NOW).unwrap();
    drop(s);
    assert!(open(&path).get(&RunId::from("a"), NOW).unwrap().is_some());
}

#[test]
fn two_handles_share_one_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut a = open(&path);
    let mut b = open(&path);
    a.put(&record("from-a", 3), None, NOW).unwrap();
    assert_eq!(
        b.get(&RunId::from("from-a"), NOW).unwrap(),
        Some(record("from-a", 3))
    );
    b.put(&record("from-b", 1), None, NOW).unwrap();
    let q = ListQuery::visible_to(VisibilityFilter::All);
    assert_eq!(a.list(&q, NOW).unwrap().items.len(), 2);
}

#[actix_rt::test]
async fn the_handle_runs_each_operation_on_the_storage_actor() {
    let dir = tempfile::tempdir().unwrap();
    let spec = BackendSpec::Sqlite {
        path: dir.path().join("t.db"),
        synchronous: Synchronous::Normal,
    };
    let clock = ManualClock::new(NOW);
    let h = StorageHandle::start(spec, std::sync::Arc::new(clock.clone()));
    assert_eq!(h.kind(), "sqlite");
    h.ping().await.unwrap();
    assert!(h.put(record("r1", 2), None).await.unwrap().stored);
    assert_eq!(h.get("r1".into()).await.unwrap(), Some(record("r1", 2)));
    assert_eq!(
        h.events("r1".into(), 1, None)
            .await
            .unwrap()
            .unwrap()
            .events
            .len(),
        1
    );
    // The handle's clock, not the wall clock, decides retention.
    clock.advance(31 * 86_400_000);
    assert_eq!(h.get("r1".into()).await.unwrap(), None);
}

#[actix_rt::test]
async fn a_panicking_transaction_is_an_error_and_the_actor_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let spec = BackendSpec::Sqlite {
        path: dir.path().join("t.db"),
        synchronous: Synchronous::Normal,
    };
    let h = StorageHandle::start(spec, std::sync::Arc::new(ManualClock::new(NOW)));
    h.put(record("r1", 1), None).await.unwrap();
    let err = h
        .transact_for_test(|_, _| -> storage::Result<()> { panic!("boom") })
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Panicked(m) if m == "boom"), "{err:?}");
    // The actor reopened its backend through the factory and still answers, data intact.
    assert!(h.get("r1".into()).await.unwrap().is_some());
}

#[actix_rt::test]
async fn a_backend_that_cannot_open_answers_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let spec = BackendSpec::Sqlite {
        path: blocker.join("t.db"),
        synchronous: Synchronous::Full,
    };
    let h = StorageHandle::start(spec, std::sync::Arc::new(ManualClock::new(NOW)));
    let err = h.ping().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
}

#[actix_rt::test]
async fn queued_messages_commit_together_and_a_failing_one_rolls_back_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    // A fault for one record only: its third event insert aborts (after its row and first events).
    open(&path)
        .connection()
        .execute_batch(
            "CREATE TRIGGER fail_third BEFORE INSERT ON run_events WHEN NEW.run_id = 'doomed' AND NEW.seq = 3
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END;",
        )
        .unwrap();
    let h = StorageHandle::start(
        BackendSpec::Sqlite {
            path,
            synchronous: Synchronous::Full,
        },
        std::sync::Arc::new(ManualClock::new(NOW)),
    );
    h.ping().await.unwrap();
    // Queue many puts at once: the actor drains them into group commits.
    let mut puts = Vec::new();
    for i in 0..40 {
        let id = if i == 17 {
            "doomed".to_owned()
        } else {
            format!("ok-{i}")
        };
        let h = h.clone();
        // Spawned, so every put is queued before the first answers.
        puts.push(actix_rt::spawn(
            async move { h.put(record(&id, 5), None).await },
        ));
    }
    let mut results = Vec::new();
    for p in puts {
        results.push(p.await.unwrap());
    }
    for (i, r) in results.iter().enumerate() {
        if i == 17 {
            assert!(
                matches!(r, Err(Error::Sqlite(_))),
                "the faulty put answers its own error: {r:?}"
            );
        } else {
            assert!(r.as_ref().is_ok_and(|o| o.stored), "put {i}: {r:?}");
        }
    }
    let stats = h.group_stats();
    assert!(
        stats.groups.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "at least one group commit happened"
    );
    assert!(
        stats
            .grouped_messages
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    // Every other record is durable with all its events; the failing one left nothing behind.
    for i in (0..40).filter(|i| *i != 17) {
        assert_eq!(
            h.get(RunId::from(format!("ok-{i}"))).await.unwrap(),
            Some(record(&format!("ok-{i}"), 5))
        );
    }
    assert_eq!(h.get("doomed".into()).await.unwrap(), None);
    let leftovers: i64 = rusqlite::Connection::open(dir.path().join("t.db"))
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM run_events WHERE run_id = 'doomed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(leftovers, 0);
}

#[actix_rt::test]
async fn a_durable_step_commits_its_turns_and_record_together_or_not_at_all() {
    use storage::ledger::{Admit, Promotion, Refusal, StepRecord, Turn};
    let dir = tempfile::tempdir().unwrap();
    let spec = BackendSpec::Sqlite {
        path: dir.path().join("t.db"),
        synchronous: Synchronous::Full,
    };
    let h = StorageHandle::start(spec, std::sync::Arc::new(ManualClock::new(NOW)));
    let gen = "20260101T000000Z-00000001".to_owned();
    let admit = Admit {
        thread_key: "c:t".into(),
        gen: gen.clone(),
        run_id: "r".into(),
        request: json!({"text": "x"}),
        meta: json!({"agent": "demo", "request": {"text": "x"}}),
        key: None,
        lease_ms: 30_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    h.admit(admit, NOW).await.unwrap();
    let p = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 30_000,
    };
    h.claim("r".into(), gen.clone(), p).await.unwrap().unwrap();
    let record = |step: u64, turn_index: u64| StepRecord {
        step,
        seq: 0,
        turn_index,
        in_flight: vec![],
        inbox_consumed_seq: None,
        remaining_ms: 1,
        turn: step,
        iteration: step,
    };
    let turn = |text: &str| Turn {
        role: "assistant".into(),
        parts: vec![json!({"type": "text", "text": text})],
    };
    // A refused turn takes its step record down with it.
    let huge = turn(&"x".repeat(storage::ledger::MAX_TRANSCRIPT_PART_BYTES));
    let input = |seq: u64, text: &str| json!({"type": "input", "seq": seq, "at": NOW, "text": text, "source": "followup"});
    let refused = h
        .durable_step(
            "r".into(),
            gen.clone(),
            0,
            vec![turn("ok"), huge],
            record(1, 2),
            vec![input(1, "a")],
        )
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(Refusal::PartTooLarge { idx: 1, .. })),
        "{refused:?}"
    );
    assert_eq!(h.last_step("r".into()).await.unwrap(), None);
    assert!(
        h.read_transcript("r".into())
            .await
            .unwrap()
            .turns
            .is_empty(),
        "not even the first turn landed"
    );
    assert_eq!(
        h.live_events("r".into(), 0, 100).await.unwrap(),
        Some(vec![]),
        "nor its events"
    );
    // A step whose event is refused lands nothing either (its input events ride with it).
    let big = input(2, &"y".repeat(70_000));
    let refused = h
        .durable_step(
            "r".into(),
            gen.clone(),
            0,
            vec![turn("a")],
            record(1, 1),
            vec![input(1, "a"), big],
        )
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(Refusal::EventTooLarge { seq: 2, .. })),
        "{refused:?}"
    );
    assert_eq!(h.last_step("r".into()).await.unwrap(), None);
    assert_eq!(
        h.live_events("r".into(), 0, 100).await.unwrap(),
        Some(vec![])
    );
    // A good step lands turns, events and record.
    h.durable_step(
        "r".into(),
        gen.clone(),
        0,
        vec![turn("a"), turn("b")],
        record(1, 2),
        vec![input(1, "a")],
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        h.last_step("r".into()).await.unwrap().map(|s| s.turn_index),
        Some(2)
    );
    assert_eq!(h.read_transcript("r".into()).await.unwrap().turns.len(), 2);
    assert_eq!(
        h.live_events("r".into(), 0, 100).await.unwrap(),
        Some(vec![input(1, "a")])
    );
    // Another generation's step is fenced and writes neither.
    let fenced = h
        .durable_step(
            "r".into(),
            "20260101T000000Z-00000002".into(),
            2,
            vec![turn("c")],
            record(2, 3),
            vec![input(2, "c")],
        )
        .await
        .unwrap();
    assert!(matches!(fenced, Err(Refusal::Fenced { .. })));
    assert_eq!(h.read_transcript("r".into()).await.unwrap().turns.len(), 2);
    assert_eq!(
        h.live_events("r".into(), 0, 100)
            .await
            .unwrap()
            .map(|e| e.len()),
        Some(1)
    );

    // Inside a group commit (many messages queued at once) a refused step still lands nothing of its
    // own, and its neighbours commit.
    let mut calls = Vec::new();
    for i in 0..40u64 {
        let h = h.clone();
        let gen = gen.clone();
        calls.push(actix_rt::spawn(async move {
            if i == 20 {
                let huge = turn(&"x".repeat(storage::ledger::MAX_TRANSCRIPT_PART_BYTES));
                h.durable_step(
                    "r".into(),
                    gen,
                    2,
                    vec![turn("partial"), huge],
                    record(2, 4),
                    vec![input(9, "lost")],
                )
                .await
                .map(|o| o.is_ok())
            } else {
                h.heartbeat("r".into(), gen, 30_000)
                    .await
                    .map(|o| o.is_ok())
            }
        }));
    }
    let mut oks = 0;
    for c in calls {
        oks += c.await.unwrap().unwrap() as usize;
    }
    assert_eq!(oks, 39, "every heartbeat landed, the refused step did not");
    assert!(
        h.group_stats()
            .groups
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "the messages were grouped"
    );
    assert_eq!(
        h.read_transcript("r".into()).await.unwrap().turns.len(),
        2,
        "no part of the refused step"
    );
    assert_eq!(
        h.live_events("r".into(), 0, 100)
            .await
            .unwrap()
            .map(|e| e.len()),
        Some(1)
    );
}

/// A database file's identity for "was it written?": its bytes, its schema stamp and its mtime.
fn fingerprint(path: &std::path::Path) -> (Vec<u8>, i64, std::time::SystemTime) {
    let bytes = std::fs::read(path).expect("read the file");
    // The stamp lives in the header: bytes 60..64, big-endian (SQLite file format §1.3).
    let version = i32::from_be_bytes(bytes[60..64].try_into().unwrap()) as i64;
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    (bytes, version, mtime)
}

/// Build a database as an older build left it: migrations `1..=version` only, then `setup` (raw SQL of
/// that version's shape), closed cleanly (WAL checkpointed away, as a stopped server leaves it).
fn old_database(path: &std::path::Path, version: usize, setup: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    for (i, sql) in storage::sqlite::schema::MIGRATIONS[..version]
        .iter()
        .enumerate()
    {
        conn.execute_batch(sql).unwrap();
        conn.pragma_update(None, "user_version", (i + 1) as i64)
            .unwrap();
    }
    conn.execute_batch(setup).unwrap();
}

/// Migration 13 rebuilds `live_runs` as a rowid table (a row with its tool definitions no longer spills to
/// an overflow page): a live run admitted by an older build keeps every column, and the thread stays
/// one run's.
#[test]
fn a_live_run_from_before_the_rowid_live_runs_keeps_its_row() {
    use storage::ledger::RunLedger;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v12.db");
    let tools =
        serde_json::to_string(&json!([{"name": "append_file", "description": "x".repeat(1200)}]))
            .unwrap();
    old_database(
        &path,
        12,
        &format!(
            "INSERT INTO live_runs (run_id, thread_key, owner_gen, lease_until, started_at, phase, stop, meta_json,
                system_text, tools_json, state_json)
             VALUES ('live', 'C1:t', 'g1', {NOW}, {}, 'live', 'soft', '{{\"agent\":\"a\"}}', 'be brief',
                '{tools}', '{{\"binding\":\"b\"}}');",
            NOW - 10
        ),
    );
    let mut s = open(&path);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    let row = s
        .get_live(&RunId::from("live"))
        .unwrap()
        .expect("the live row");
    assert_eq!(
        (
            row.thread_key.as_str(),
            row.owner_gen.as_str(),
            row.lease_until,
            row.started_at
        ),
        ("C1:t", "g1", NOW, NOW - 10)
    );
    assert_eq!(
        (row.phase.as_str(), row.stop.map(|s| s.as_str())),
        ("live", Some("soft"))
    );
    assert_eq!(row.meta, json!({"agent": "a"}));
    assert_eq!(row.system_text, "be brief");
    assert_eq!(
        row.tools,
        serde_json::from_str::<serde_json::Value>(&tools).unwrap()
    );
    assert_eq!(row.state.get("binding"), Some(&json!("b")));
    drop(s);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let without_rowid: i64 = conn
        .query_row("SELECT wr FROM pragma_table_list('live_runs')", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(without_rowid, 0, "live_runs is a rowid table");
    let same_thread = conn.execute(
        "INSERT INTO live_runs (run_id, thread_key, owner_gen, lease_until, started_at, phase, meta_json)
         VALUES ('other', 'C1:t', 'g2', 0, 0, 'attaching', '{}')",
        [],
    );
    assert!(same_thread.is_err(), "a thread still holds one live run");
}

#[test]
fn a_read_only_store_reads_the_current_schema_and_never_writes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    {
        let mut s = open(&path);
        s.put(&record("a", 3), None, NOW).unwrap();
        s.put(&record("b", 1), None, NOW).unwrap();
    }
    let before = fingerprint(&path);
    assert_eq!(before.1, storage::sqlite::schema::current_version());
    let mut r = SqliteStore::open_read_only(&path).expect("open read-only");
    assert_eq!(
        r.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    assert_eq!(r.get(&RunId::from("a"), NOW).unwrap(), Some(record("a", 3)));
    assert_eq!(
        r.list(&ListQuery::visible_to(VisibilityFilter::All), NOW)
            .unwrap()
            .items
            .len(),
        2
    );
    assert_eq!(
        r.events(&RunId::from("a"), 1, None, NOW)
            .unwrap()
            .unwrap()
            .events
            .len(),
        2
    );
    let rows: Vec<(&str, u64)> = r
        .rows_of_run(&RunId::from("a"))
        .unwrap()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(rows, [("runs", 1), ("run_events", 3)]);
    // Writes are refused at the connection and change nothing.
    assert!(matches!(
        r.put(&record("c", 1), None, NOW),
        Err(Error::Sqlite(_))
    ));
    assert!(matches!(r.delete(&RunId::from("a")), Err(Error::Sqlite(_))));
    drop(r);
    assert!(
        before == fingerprint(&path),
        "the file's bytes, stamp or mtime changed"
    );
    assert_eq!(
        open(&path).get(&RunId::from("a"), NOW).unwrap(),
        Some(record("a", 3)),
        "the data is still there"
    );
}

#[test]
fn a_read_only_store_reads_an_older_schema_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    // Version 1: history only — no live_runs (which `get` and `events` consult), no plans.
    let summary = serde_json::to_string(&record("old", 2).head).unwrap();
    old_database(
        &path,
        1,
        &format!(
            "INSERT INTO runs (run_id, finished_at, started_at, agent, channel_id, user_id, thread_key, channel_visibility,
                status, event_count, bytes, digest, stored_at, summary_json)
             VALUES ('old', {NOW}, {}, NULL, 'C1', 'U1', 'C1:t', 'public', 'completed', 2, 100, 'd', {NOW}, '{summary}');
             INSERT INTO run_events (run_id, seq, json) VALUES
                ('old', 1, '{{\"type\":\"note\",\"seq\":1,\"at\":{NOW},\"summary\":\"s\"}}'),
                ('old', 2, '{{\"type\":\"note\",\"seq\":2,\"at\":{NOW},\"summary\":\"s\"}}');",
            NOW - 10
        ),
    );
    let before = fingerprint(&path);
    assert_eq!(before.1, 1);
    let mut r = SqliteStore::open_read_only(&path).expect("an older schema opens");
    assert_eq!(r.schema_version().unwrap(), 1, "read as is, not migrated");
    assert_eq!(
        r.get(&RunId::from("old"), NOW).unwrap(),
        Some(record("old", 2))
    );
    assert_eq!(
        r.get_summary(&RunId::from("old"), NOW)
            .unwrap()
            .map(|i| i.head.id),
        Some(RunId::from("old".to_owned()))
    );
    assert_eq!(
        r.events(&RunId::from("old"), 1, None, NOW)
            .unwrap()
            .unwrap()
            .events
            .len(),
        1
    );
    let page = r
        .list(&ListQuery::visible_to(VisibilityFilter::All), NOW)
        .unwrap();
    assert_eq!(
        page.items
            .iter()
            .map(|i| i.head.id.as_str())
            .collect::<Vec<_>>(),
        ["old"]
    );
    // The ledger's tables read as empty where the old version had none.
    use storage::ledger::RunLedger;
    assert_eq!(r.list_live().unwrap(), vec![]);
    assert_eq!(r.get_live(&RunId::from("old")).unwrap(), None);
    let rows: Vec<(&str, u64)> = r
        .rows_of_run(&RunId::from("old"))
        .unwrap()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(rows, [("runs", 1), ("run_events", 2)]);
    drop(r);
    assert!(
        before == fingerprint(&path),
        "reading a version-1 file changed it"
    );

    // Version 3: plan_requests without the columns migration 4 added; they read as their defaults.
    let path = dir.path().join("v3.db");
    old_database(
        &path,
        3,
        "INSERT INTO plan_requests (request_id, plan_id, revision, snapshot_id, state, created_at)
         VALUES ('q1', 'p1', 1, 's1', 'pending', 5);",
    );
    let before = fingerprint(&path);
    let mut r = SqliteStore::open_read_only(&path).expect("a version-3 file opens");
    assert_eq!(r.schema_version().unwrap(), 3);
    assert_eq!(r.get(&RunId::from("nothing"), NOW).unwrap(), None);
    use storage::plan::PlanStore;
    let id = storage::plan::RequestId::parse("q1").unwrap();
    let q = r.get_request(&id).unwrap().expect("the request reads");
    assert_eq!(
        (q.request_id, q.holder),
        (id, None),
        "no holder column in version 3: none recorded"
    );
    drop(r);
    assert!(
        before == fingerprint(&path),
        "reading a version-3 file changed it"
    );
}

/// Migration 5 drops `run_jobs` (nothing read it): a version-4 file, rows in it and all, upgrades in place and
/// keeps everything else; a read-only store over the version-4 file reads it as is.
#[test]
fn migration_five_drops_run_jobs_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v4.db");
    let summary = serde_json::to_string(&record("old", 1).head).unwrap();
    old_database(
        &path,
        4,
        &format!(
            "INSERT INTO runs (run_id, finished_at, started_at, agent, channel_id, user_id, thread_key, channel_visibility,
                status, event_count, bytes, digest, stored_at, summary_json)
             VALUES ('old', {NOW}, {}, NULL, 'C1', 'U1', 'C1:t', 'public', 'completed', 1, 100, 'd', {NOW}, '{summary}');
             INSERT INTO run_events (run_id, seq, json) VALUES
                ('old', 1, '{{\"type\":\"note\",\"seq\":1,\"at\":{NOW},\"summary\":\"s\"}}');
             INSERT INTO run_jobs (run_id, kind, json) VALUES ('old', 'reflect', '{{}}');",
            NOW - 10
        ),
    );
    let mut r = SqliteStore::open_read_only(&path).expect("a version-4 file opens");
    assert_eq!(r.schema_version().unwrap(), 4);
    assert_eq!(
        r.get(&RunId::from("old"), NOW).unwrap(),
        Some(record("old", 1))
    );
    drop(r);

    let mut s = open(&path);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    let tables: i64 = s
        .connection()
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'run_jobs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "run_jobs is gone");
    assert_eq!(
        s.get(&RunId::from("old"), NOW).unwrap(),
        Some(record("old", 1)),
        "the history is untouched"
    );
    let rows: Vec<(&str, u64)> = s
        .rows_of_run(&RunId::from("old"))
        .unwrap()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(rows, [("runs", 1), ("run_events", 1)]);
}

/// Migration 9 adds `card_open` (SPEC §12's orphan sweep): a row from before reads as not open, even with a
/// card in its head, on a read-only store over the old file and after the upgrade; the next put of the
/// record sets it.
#[test]
fn migration_nine_leaves_cards_from_before_closed_until_their_record_is_put_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v8.db");
    let mut carded = record("old", 1);
    carded
        .head
        .extra
        .insert("card".into(), json!({"channel": "C1", "ts": "1.5"}));
    let summary = serde_json::to_string(&carded.head).unwrap();
    old_database(
        &path,
        8,
        &format!(
            "INSERT INTO runs (run_id, finished_at, started_at, agent, channel_id, user_id, thread_key, channel_visibility,
                status, event_count, bytes, digest, stored_at, summary_json)
             VALUES ('old', {NOW}, {}, NULL, 'C1', 'U1', 'C1:t', 'public', 'completed', 1, 100, 'd', {NOW}, '{summary}');
             INSERT INTO run_events (run_id, seq, json) VALUES
                ('old', 1, '{{\"type\":\"note\",\"seq\":1,\"at\":{NOW},\"summary\":\"s\"}}');",
            NOW - 10
        ),
    );
    let before = fingerprint(&path);
    let mut r = SqliteStore::open_read_only(&path).expect("a version-8 file opens");
    assert_eq!(r.schema_version().unwrap(), 8);
    assert_eq!(r.open_cards(NOW, 10, NOW).unwrap(), Vec::<String>::new());
    assert_eq!(
        r.get(&RunId::from("old"), NOW).unwrap(),
        Some(carded.clone())
    );
    drop(r);
    assert!(
        before == fingerprint(&path),
        "reading a version-8 file changed it"
    );

    let mut s = open(&path);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    assert_eq!(s.open_cards(NOW, 10, NOW).unwrap(), Vec::<String>::new());
    assert!(
        !s.close_card(&RunId::from("old")).unwrap(),
        "not open: nothing to close"
    );
    assert_eq!(
        s.get(&RunId::from("old"), NOW).unwrap(),
        Some(carded.clone())
    );
    assert!(s.put(&carded, None, NOW).unwrap().stored);
    assert_eq!(s.open_cards(NOW, 10, NOW).unwrap(), ["old"]);
}

#[test]
fn a_read_only_store_refuses_a_newer_schema_a_missing_file_and_a_foreign_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    open(&path).put(&record("kept", 1), None, NOW).unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let before = fingerprint(&path);
    let err = SqliteStore::open_read_only(&path).unwrap_err();
    let supported = storage::sqlite::schema::current_version();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 99, supported: s } if s == supported),
        "{err:?}"
    );
    assert!(err.to_string().contains("99"), "{err}");
    assert!(before == fingerprint(&path));

    // A missing file is an error naming it, and is not created.
    let missing = dir.path().join("nope").join("missing.db");
    let err = SqliteStore::open_read_only(&missing).unwrap_err();
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
    assert!(!missing.exists() && !missing.parent().unwrap().exists());

    // A SQLite file without a Switchboard schema is refused, not read as empty.
    let foreign = dir.path().join("foreign.db");
    rusqlite::Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE x (y)")
        .unwrap();
    let err = SqliteStore::open_read_only(&foreign).unwrap_err();
    assert!(err.to_string().contains("schema version 0"), "{err}");
}

#[test]
fn the_write_lock_probe_sees_a_held_lock_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let mut s = open(&path);
    let probe = storage::WriteLockProbe::open(&path, std::time::Duration::from_millis(20)).unwrap();
    assert!(probe.is_free().unwrap());
    s.begin_group().unwrap();
    assert!(
        !probe.is_free().unwrap(),
        "a writer inside BEGIN IMMEDIATE holds the lock"
    );
    s.end_group(true).unwrap();
    assert!(probe.is_free().unwrap());
    let missing = dir.path().join("missing.db");
    assert!(storage::WriteLockProbe::open(&missing, std::time::Duration::ZERO).is_err());
    assert!(!missing.exists());
}

/// Migration 8 adds each generation's `host_id` (SPEC §1.3); generations recorded before have their
/// hostname as their host identity, so fast reclaim on their own host goes on as before.
#[test]
fn migration_eight_gives_old_generations_their_hostname_as_host_id() {
    use storage::ledger::{GenerationInfo, RunLedger};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v7.db");
    old_database(
        &path,
        7,
        "INSERT INTO generations (gen, host, pid, proc_start, started_at)
         VALUES ('20260101T000000Z-0000000a', 'box-1', 42, '777', 5);",
    );
    let mut s = open(&path);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    let old = GenerationInfo {
        gen: "20260101T000000Z-0000000a".into(),
        host: "box-1".into(),
        host_id: "box-1".into(),
        pid: 42,
        proc_start: "777".into(),
        started_at: 5,
    };
    assert_eq!(s.generations().unwrap(), vec![old.clone()]);
    let new = GenerationInfo {
        gen: "20260101T000000Z-0000000b".into(),
        host_id: "blue".into(),
        started_at: 6,
        ..old.clone()
    };
    s.record_generation(&new).unwrap();
    assert_eq!(s.generations().unwrap(), vec![old, new]);
}

/// The seed's orphan sweep: with no write, `expire` removes the event rows of runs that have neither a
/// record nor a live row, a bounded number of runs a pass, going round the table across passes; a
/// record's events and a live run's events stay.
#[test]
fn expire_removes_event_rows_nobody_owns_a_bounded_amount_a_pass() {
    use storage::ledger::{Admit, Promotion, RunLedger};
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(&dir.path().join("t.db"));
    s.put(&record("kept", 3), None, NOW).unwrap();
    let admit = Admit {
        thread_key: "C1:live".into(),
        gen: "20270115T080000Z-0000beef".into(),
        run_id: "live".into(),
        request: json!({"text": "hi"}),
        meta: json!({"threadKey": "C1:live", "channelId": "C1", "userId": "U1", "channelVisibility": "public"}),
        key: None,
        lease_ms: 30_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    s.admit(&admit, NOW).unwrap();
    let p = Promotion {
        system_text: "S".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 30_000,
    };
    s.claim(&RunId::from("live"), "20270115T080000Z-0000beef", &p, NOW)
        .unwrap()
        .unwrap();
    let live_events = vec![json!({"type": "note", "seq": 1, "at": NOW, "summary": "s"})];
    s.append(
        &RunId::from("live"),
        "20270115T080000Z-0000beef",
        &live_events,
    )
    .unwrap()
    .unwrap();
    // 600 runs' event rows that nothing owns (what an older build could leave behind).
    let tx = s.connection().unchecked_transaction().unwrap();
    for i in 0..600 {
        for seq in 1..=2 {
            tx.execute(
                "INSERT INTO run_events (run_id, seq, json) VALUES (?1, ?2, '{}')",
                rusqlite::params![format!("orphan-{i:03}"), seq],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
    let count = |s: &mut SqliteStore, id: &str| -> i64 {
        s.connection()
            .query_row(
                "SELECT COUNT(*) FROM run_events WHERE run_id LIKE ?1",
                [id],
                |r| r.get(0),
            )
            .unwrap()
    };

    let first = s.expire(NOW, "").unwrap();
    // 500 run ids scanned in id order: "kept", "live" and 498 orphans.
    assert_eq!((first.runs, first.orphaned), (0, 498));
    let after = first
        .scan_after
        .clone()
        .expect("the scan did not go round yet");
    let second = s.expire(NOW, &after).unwrap();
    assert_eq!(
        (second.orphaned, second.scan_after),
        (102, None),
        "the second pass finishes the round"
    );
    assert_eq!(count(&mut s, "orphan-%"), 0);
    assert_eq!(count(&mut s, "kept"), 3, "a record's events stay");
    assert_eq!(count(&mut s, "live"), 1, "a live run's events stay");
    assert_eq!(s.expire(NOW, "").unwrap().orphaned, 0);
}

/// Migration 10 adds `label` (the index's search): a row from before takes its label from its summary (a
/// summary that does not parse leaves it NULL and does not stop the migration), so a search finds it.
#[test]
fn migration_ten_gives_rows_from_before_their_label() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let row = |id: &str, at: i64, summary: &str| {
        format!(
            "INSERT INTO runs (run_id, finished_at, started_at, channel_id, user_id, thread_key, status, event_count,
                bytes, digest, stored_at, summary_json)
             VALUES ('{id}', {at}, 0, 'C1', 'U1', 'C1:t', 'completed', 0, 10, 'd-{id}', 0, '{summary}');"
        )
    };
    let head = |id: &str, at: i64, label: &str| {
        format!(
            r#"{{"id":"{id}","label":"{label}","channelId":"C1","userId":"U1","threadKey":"C1:t","startedAt":0,"finishedAt":{at},"status":"completed","eventCount":0,"storedEventCount":0,"truncated":false}}"#
        )
    };
    let setup = [
        row("old", NOW - 1, &head("old", NOW - 1, "Quarterly Billing")),
        row("other", NOW - 2, &head("other", NOW - 2, "rotate keys")),
        row("broken", NOW - 3, "{not json"),
    ]
    .concat();
    old_database(&path, 9, &setup);
    let mut s = open(&path);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::sqlite::schema::current_version()
    );
    let q = ListQuery {
        search: storage::store::Search::new("BILLING"),
        ..ListQuery::visible_to(VisibilityFilter::All)
    };
    let found: Vec<RunId> = s
        .list(&q, NOW)
        .unwrap()
        .items
        .into_iter()
        .map(|i| i.head.id)
        .collect();
    assert_eq!(found, ["old"]);
}
