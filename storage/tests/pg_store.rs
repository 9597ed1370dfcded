//! PostgreSQL-only behaviour (SPEC §1.3): versioned migrations (a newer schema refused by name, hosts
//! starting together migrate once), the session's timeouts (a peer holding a lock becomes a transient
//! error, not a hang), faults mid-transaction inside and outside a group commit, the handle's kind and
//! read pool, and the database clock. The contract suites cover everything the traits say.

use std::time::{Duration, Instant};
use storage::RunId;

use serde_json::json;
use storage::ledger::{Admit, AdmitOutcome, Claimed, Promotion, Refusal, RunLedger};
use storage::record::{validate_record, RunRecord};
use storage::store::RunStore;
use storage::testing::pg;
use storage::{
    BackendSpec, Clock, DbClock, Error, ManualClock, PgStore, StorageHandle, SystemClock,
};

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

fn open(url: &str) -> PgStore {
    PgStore::open(url).expect("open")
}

/// A trigger that fails the insert of `doomed`'s third event, after its runs row and first events.
fn inject_fault(s: &mut PgStore) {
    s.connection()
        .batch_execute(
            "CREATE FUNCTION fail_third() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.run_id = 'doomed' AND NEW.seq = 3 THEN RAISE EXCEPTION 'injected fault'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER fail_third BEFORE INSERT ON run_events FOR EACH ROW EXECUTE FUNCTION fail_third();",
        )
        .expect("install the fault");
}

fn events_of(s: &mut PgStore, id: &str) -> i64 {
    s.connection()
        .query_one("SELECT count(*) FROM run_events WHERE run_id = $1", &[&id])
        .unwrap()
        .get(0)
}

#[test]
fn a_database_from_a_newer_version_is_refused_by_name_and_left_untouched() {
    let url = pg::database();
    let mut s = open(&url);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::postgres::schema::current_version()
    );
    s.put(&record("kept", 1), None, NOW).unwrap();
    s.connection()
        .batch_execute("UPDATE schema_version SET version = 99")
        .unwrap();
    let err = PgStore::open(&url).unwrap_err();
    let supported = storage::postgres::schema::current_version();
    assert!(
        matches!(err, Error::SchemaTooNew { found: 99, supported: s } if s == supported),
        "{err:?}"
    );
    assert!(!err.is_transient());
    let msg = err.to_string();
    assert!(
        msg.contains("99") && msg.contains(&supported.to_string()),
        "{msg}"
    );
    assert_eq!(s.schema_version().unwrap(), 99, "the stamp is as it was");
    assert!(
        s.get(&RunId::from("kept"), NOW).unwrap().is_some(),
        "and so is the data"
    );
}

#[test]
fn hosts_starting_together_on_a_fresh_database_migrate_it_once() {
    let url = pg::database();
    let barrier = std::sync::Barrier::new(4);
    let secrets: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    open(&url).capability_secret().expect("secret")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("host"))
            .collect()
    });
    assert_eq!(secrets[0].len(), 64, "32 bytes, hex");
    assert!(
        secrets.iter().all(|s| *s == secrets[0]),
        "one secret for every host: {secrets:?}"
    );
    let mut s = open(&url);
    let rows: i64 = s
        .connection()
        .query_one("SELECT count(*) FROM schema_version", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        (rows, s.schema_version().unwrap()),
        (1, storage::postgres::schema::current_version())
    );
}

#[test]
fn every_connection_sets_lock_and_statement_timeouts() {
    let mut s = open(&pg::database());
    for (setting, want) in [("lock_timeout", "5s"), ("statement_timeout", "15s")] {
        let got: String = s
            .connection()
            .query_one(&format!("SHOW {setting}"), &[])
            .unwrap()
            .get(0);
        assert_eq!(got, want, "{setting}");
    }
}

/// Admit and promote `run_id` for `gen` on its own thread.
fn live_run(s: &mut PgStore, run_id: &RunId, gen: &str) {
    let admit = Admit {
        thread_key: format!("C1:{run_id}"),
        gen: gen.into(),
        run_id: run_id.clone(),
        request: json!({"text": "x"}),
        meta: json!({"agent": "demo", "request": {"text": "x"}}),
        key: None,
        lease_ms: 30_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    };
    assert!(matches!(
        s.admit(&admit, NOW).unwrap(),
        AdmitOutcome::Started { .. }
    ));
    let p = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 30_000,
    };
    assert_eq!(
        s.claim(run_id, gen, &p, NOW).unwrap(),
        Ok(Claimed::Promoted)
    );
}

/// Inside one transaction an ownership check that passed is not asked again — until the transaction
/// itself changes the answer: after a kill or an abandon in the same group, the owner's next write is
/// refused; and the next transaction asks again.
#[test]
fn an_owner_check_is_remembered_only_until_the_transaction_changes_it() {
    let mut s = open(&pg::database());
    let event = |seq: u64| json!({"type": "note", "seq": seq, "at": NOW, "summary": "s"});
    for id in ["k", "a", "n"] {
        live_run(&mut s, &RunId::from(id), "g1");
    }
    assert!(s.begin_group().unwrap());
    assert_eq!(
        s.append(&RunId::from("k"), "g1", &[event(1)]).unwrap(),
        Ok(())
    );
    s.kill(&RunId::from("k"), NOW).unwrap();
    assert!(
        matches!(
            s.append(&RunId::from("k"), "g1", &[event(2)]).unwrap(),
            Err(Refusal::Fenced { .. })
        ),
        "the kill in the same transaction fences the owner"
    );
    assert_eq!(
        s.append(&RunId::from("a"), "g1", &[event(1)]).unwrap(),
        Ok(())
    );
    assert_eq!(s.abandon(&RunId::from("a"), "g1").unwrap(), Ok(()));
    assert!(
        matches!(
            s.append(&RunId::from("a"), "g1", &[event(2)]).unwrap(),
            Err(Refusal::UnknownRun { .. })
        ),
        "the abandon in the same transaction removed the row"
    );
    assert_eq!(
        s.append(&RunId::from("n"), "g1", &[event(1)]).unwrap(),
        Ok(())
    );
    assert!(
        matches!(
            s.append(&RunId::from("n"), "g2", &[event(2)]).unwrap(),
            Err(Refusal::Fenced { .. })
        ),
        "another generation is not the one that passed"
    );
    s.end_group(true).unwrap();
    // Another process takes `n` over between two transactions: the next write asks again.
    open_same(&mut s)
        .connection()
        .execute(
            "UPDATE live_runs SET owner_gen = 'g2' WHERE run_id = 'n'",
            &[],
        )
        .unwrap();
    assert!(matches!(
        s.append(&RunId::from("n"), "g1", &[event(3)]).unwrap(),
        Err(Refusal::Fenced { .. })
    ));
}

/// A write left to go out with the `COMMIT` (a state patch) that fails there: the group answers
/// `GroupRolledBack` (which message failed is not known; the actor runs each again alone) and nothing
/// of it lands; alone, the failing message answers its own error at its commit.
#[test]
fn a_write_failing_at_the_commit_rolls_the_group_back() {
    let mut s = open(&pg::database());
    let event = |seq: u64| json!({"type": "note", "seq": seq, "at": NOW, "summary": "s"});
    live_run(&mut s, &RunId::from("ok"), "g1");
    live_run(&mut s, &RunId::from("bad"), "g1");
    s.connection()
        .batch_execute(
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'poisoned state'; END $$;
             CREATE TRIGGER poison BEFORE UPDATE ON live_runs FOR EACH ROW
             WHEN (NEW.state_json LIKE '%poison%') EXECUTE FUNCTION poison();",
        )
        .unwrap();
    let patch = json!({"poison": true}).as_object().unwrap().clone();
    assert!(s.begin_group().unwrap());
    assert_eq!(
        s.append(&RunId::from("ok"), "g1", &[event(1)]).unwrap(),
        Ok(())
    );
    assert_eq!(
        s.set_state(&RunId::from("bad"), "g1", &patch).unwrap(),
        Ok(()),
        "its write waits for the commit"
    );
    assert!(matches!(s.end_group(true), Err(Error::GroupRolledBack(_))));
    let mut other = open_same(&mut s);
    assert_eq!(
        other.live_events(&RunId::from("ok"), 0, 10).unwrap(),
        Some(vec![]),
        "nothing of the group landed"
    );
    // Alone, each message answers for itself.
    assert_eq!(
        s.append(&RunId::from("ok"), "g1", &[event(1)]).unwrap(),
        Ok(())
    );
    let alone = s.set_state(&RunId::from("bad"), "g1", &patch).unwrap_err();
    assert!(alone.to_string().contains("poisoned state"), "{alone}");
    assert_eq!(
        other
            .live_events(&RunId::from("ok"), 0, 10)
            .unwrap()
            .map(|e| e.len()),
        Some(1)
    );
}

/// In a group of messages a step write's answer is not read: one whose owner check fails fails the
/// group at its commit (`GroupRolledBack`, nothing of it lands), and alone it answers the refusal.
#[test]
fn a_step_write_in_a_group_that_does_not_own_its_run_spoils_the_group() {
    let mut s = open(&pg::database());
    live_run(&mut s, &RunId::from("ok"), "g1");
    live_run(&mut s, &RunId::from("theirs"), "g1");
    let step = |n: u64| storage::ledger::StepWrite {
        first_idx: 2,
        turns: vec![storage::ledger::Turn {
            role: "assistant".into(),
            parts: vec![json!({"text": "t"})],
        }],
        record: storage::ledger::StepRecord {
            step: n,
            seq: 3,
            turn_index: 3,
            in_flight: vec![],
            inbox_consumed_seq: None,
            remaining_ms: 1_000,
            turn: n,
            iteration: n,
        },
        events: vec![json!({"type": "note", "seq": 3, "at": NOW, "summary": "s"})],
        state: Default::default(),
    };
    // Owned: the group commits it.
    assert!(s.begin_group().unwrap());
    assert_eq!(
        s.write_step(&RunId::from("ok"), "g1", &step(1)).unwrap(),
        Ok(())
    );
    s.end_group(true).unwrap();
    assert_eq!(
        s.last_step(&RunId::from("ok")).unwrap().map(|r| r.step),
        Some(1)
    );
    // Not owned: the group fails at its commit, and nothing of it lands.
    assert!(s.begin_group().unwrap());
    assert_eq!(
        s.write_step(&RunId::from("ok"), "g1", &step(2)).unwrap(),
        Ok(())
    );
    assert_eq!(
        s.write_step(&RunId::from("theirs"), "g2", &step(1))
            .unwrap(),
        Ok(()),
        "its answer waits for the commit"
    );
    assert!(matches!(s.end_group(true), Err(Error::GroupRolledBack(_))));
    assert_eq!(
        s.last_step(&RunId::from("ok")).unwrap().map(|r| r.step),
        Some(1)
    );
    assert!(s.last_step(&RunId::from("theirs")).unwrap().is_none());
    // Alone, each answers for itself.
    assert_eq!(
        s.write_step(&RunId::from("ok"), "g1", &step(2)).unwrap(),
        Ok(())
    );
    assert!(matches!(
        s.write_step(&RunId::from("theirs"), "g2", &step(1))
            .unwrap(),
        Err(Refusal::Fenced { .. })
    ));
    assert_eq!(
        s.last_step(&RunId::from("ok")).unwrap().map(|r| r.step),
        Some(2)
    );
}

/// Another connection to the database `s` is connected to.
fn open_same(s: &mut PgStore) -> PgStore {
    open(
        &s.connection()
            .query_one("SELECT current_database()", &[])
            .map(|r| pg::shared().url(&r.get::<_, String>(0)))
            .unwrap(),
    )
}

/// A peer that holds a row lock and stalls (a paused host) costs the writer `lock_timeout`, then a
/// transient error — never a hang, never a refusal — and the connection stays usable.
#[test]
fn a_stalled_peer_holding_a_lock_is_a_transient_error_after_the_lock_timeout() {
    let url = pg::database();
    let mut s = open(&url);
    live_run(&mut s, &RunId::from("r1"), "g1");
    let mut peer = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut tx = peer.transaction().unwrap();
    tx.query(
        "SELECT 1 FROM live_runs WHERE run_id = 'r1' FOR UPDATE",
        &[],
    )
    .unwrap();
    let started = Instant::now();
    let err = s
        .heartbeat(&RunId::from("r1"), "g1", 30_000, NOW + 1)
        .unwrap_err();
    let waited = started.elapsed();
    assert!(err.is_transient() && !err.is_race(), "{err}");
    assert!(err.to_string().contains("55P03"), "a lock timeout: {err}");
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(20),
        "{waited:?}"
    );
    tx.rollback().unwrap();
    assert!(
        s.heartbeat(&RunId::from("r1"), "g1", 30_000, NOW + 2)
            .unwrap()
            .is_ok(),
        "the connection is usable again"
    );
}

#[test]
fn a_fault_mid_put_leaves_no_row_and_no_events_and_the_connection_goes_on() {
    let mut s = open(&pg::database());
    s.put(&record("before", 2), None, NOW).unwrap();
    inject_fault(&mut s);
    let err = s.put(&record("doomed", 5), None, NOW).unwrap_err();
    assert!(
        matches!(err, Error::Postgres(_)) && !err.is_transient(),
        "{err}"
    );
    assert!(
        err.to_string().contains("injected fault"),
        "the server's message: {err}"
    );
    assert_eq!(s.get(&RunId::from("doomed"), NOW).unwrap(), None);
    assert_eq!(events_of(&mut s, "doomed"), 0);
    assert_eq!(
        s.get(&RunId::from("before"), NOW).unwrap(),
        Some(record("before", 2)),
        "earlier data untouched"
    );
    s.put(&record("after", 1), None, NOW).unwrap();
    assert_eq!(
        s.get(&RunId::from("after"), NOW).unwrap(),
        Some(record("after", 1))
    );
}

/// Inside a group commit (no savepoint per message) a failing message spoils the group: `end_group`
/// rolls everything back and answers `GroupRolledBack`, so nothing of the group lands — the actor then
/// runs each message alone (`the_actor_reruns_a_spoiled_group_one_by_one_and_only_the_failure_is_lost`).
#[test]
fn a_failing_message_spoils_its_group_and_nothing_of_the_group_lands() {
    let mut s = open(&pg::database());
    inject_fault(&mut s);
    let mut fresh = open(
        &s.connection()
            .query_one("SELECT current_database()", &[])
            .map(|r| r.get::<_, String>(0))
            .map(|db| pg::shared().url(&db))
            .unwrap(),
    );
    assert!(s.begin_group().unwrap());
    assert!(!s.begin_group().unwrap(), "a group is already open");
    s.put(&record("a", 1), None, NOW).unwrap();
    assert_eq!(
        s.get(&RunId::from("a"), NOW).unwrap(),
        Some(record("a", 1)),
        "a read inside the group sees its writes"
    );
    assert!(s.put(&record("doomed", 5), None, NOW).is_err());
    assert!(
        matches!(s.end_group(true), Err(Error::GroupRolledBack(_))),
        "a spoiled group does not commit"
    );
    assert_eq!(fresh.get(&RunId::from("a"), NOW).unwrap(), None);
    assert_eq!(fresh.get(&RunId::from("doomed"), NOW).unwrap(), None);
    assert_eq!(events_of(&mut fresh, "doomed"), 0);
    // The next group starts clean and commits.
    assert!(s.begin_group().unwrap());
    s.put(&record("b", 2), None, NOW).unwrap();
    s.end_group(true).unwrap();
    assert_eq!(
        fresh.get(&RunId::from("b"), NOW).unwrap(),
        Some(record("b", 2))
    );
    // An atomic unit rolled back leaves nothing alone, and spoils a group it is part of.
    s.begin_atomic().unwrap();
    s.put(&record("c", 1), None, NOW).unwrap();
    s.end_atomic(false).unwrap();
    assert_eq!(fresh.get(&RunId::from("c"), NOW).unwrap(), None);
    assert!(s.begin_group().unwrap());
    s.put(&record("d", 1), None, NOW).unwrap();
    s.begin_atomic().unwrap();
    s.put(&record("e", 1), None, NOW).unwrap();
    s.end_atomic(false).unwrap();
    assert!(matches!(s.end_group(true), Err(Error::GroupRolledBack(_))));
    assert_eq!(
        (
            fresh.get(&RunId::from("d"), NOW).unwrap(),
            fresh.get(&RunId::from("e"), NOW).unwrap()
        ),
        (None, None)
    );
}

/// Through the actor: puts queued together are drained into groups; the group holding the failing put
/// is rolled back and its messages run again one by one, so every other put lands with all its events,
/// the failing one answers its own error and leaves nothing — what a savepoint per message kept.
#[actix_rt::test]
async fn the_actor_reruns_a_spoiled_group_one_by_one_and_only_the_failure_is_lost() {
    let url = pg::database();
    let setup = url.clone();
    // The synchronous client must not block inside the test's runtime.
    std::thread::spawn(move || inject_fault(&mut open(&setup)))
        .join()
        .unwrap();
    let h = StorageHandle::start(
        BackendSpec::Postgres {
            url: url.clone(),
            pool: 0,
        },
        std::sync::Arc::new(ManualClock::new(NOW)),
    );
    h.ping().await.unwrap();
    // The actor is held busy until every put is queued behind it, so they are drained as one group.
    let (started, running) = tokio::sync::oneshot::channel();
    let (release, held) = std::sync::mpsc::channel::<()>();
    let blocker = {
        let h = h.clone();
        actix_rt::spawn(async move {
            h.transact_for_test(move |_, _| {
                let _ = started.send(());
                let _ = held.recv();
                Ok(())
            })
            .await
        })
    };
    running.await.unwrap();
    let mut puts = Vec::new();
    for i in 0..40 {
        let id = if i == 17 {
            "doomed".to_owned()
        } else {
            format!("ok-{i}")
        };
        let h = h.clone();
        puts.push(actix_rt::spawn(
            async move { h.put(record(&id, 5), None).await },
        ));
    }
    while h
        .group_stats()
        .queued
        .load(std::sync::atomic::Ordering::Relaxed)
        < 40
    {
        actix_rt::task::yield_now().await;
    }
    release.send(()).unwrap();
    blocker.await.unwrap().unwrap();
    let mut results = Vec::new();
    for p in puts {
        results.push(p.await.unwrap());
    }
    for (i, r) in results.iter().enumerate() {
        if i == 17 {
            assert!(
                matches!(r, Err(Error::Postgres(_))),
                "the faulty put answers its own error: {r:?}"
            );
        } else {
            assert!(r.as_ref().is_ok_and(|o| o.stored), "put {i}: {r:?}");
        }
    }
    assert!(
        h.group_stats()
            .rerun_groups
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "the failing put spoiled its group"
    );
    for i in (0..40).filter(|i| *i != 17) {
        assert_eq!(
            h.get(RunId::from(format!("ok-{i}"))).await.unwrap(),
            Some(record(&format!("ok-{i}"), 5))
        );
    }
    assert_eq!(h.get("doomed".into()).await.unwrap(), None);
    let left = std::thread::spawn(move || events_of(&mut open(&url), "doomed"))
        .join()
        .unwrap();
    assert_eq!(left, 0);
}

#[actix_rt::test]
async fn the_handle_on_postgres_says_so_and_keeps_its_secret_across_a_restart() {
    let url = pg::database();
    let clock = std::sync::Arc::new(ManualClock::new(NOW));
    let spec = BackendSpec::Postgres {
        url: url.clone(),
        pool: 4,
    };
    assert_eq!(spec.kind(), "postgres");
    let h = StorageHandle::start(spec.clone(), clock.clone());
    assert_eq!(h.kind(), "postgres");
    h.ping().await.unwrap();
    let secret = h.capability_secret().await.unwrap();
    h.put(record("r", 3), None).await.unwrap();
    // Reads go to the pool's read-only connections and see every write whose answer is in hand.
    let pooled = || {
        h.group_stats()
            .pooled_reads
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = pooled();
    assert_eq!(h.get("r".into()).await.unwrap(), Some(record("r", 3)));
    assert_eq!(pooled(), before + 1, "the read ran on a reader");
    let err = h
        .read_for_test(|b, now| b.put(&record("sneaky", 1), None, now))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("25006"),
        "a reader refuses writes (read-only transaction): {err}"
    );
    assert_eq!(h.get("sneaky".into()).await.unwrap(), None);
    drop(h);
    let again = StorageHandle::start(spec, clock);
    assert_eq!(again.capability_secret().await.unwrap(), secret);
    assert_eq!(again.get("r".into()).await.unwrap(), Some(record("r", 3)));
}

/// A `DbClock` reads the host's clock shifted to the database's: measured against a host clock that
/// is a day behind, it answers the database's time.
#[test]
fn the_database_clock_corrects_a_skewed_host_clock() {
    let url = pg::database();
    let real = SystemClock.now_ms();
    let skewed = std::sync::Arc::new(ManualClock::new(real - 86_400_000));
    let clock = DbClock::measure(skewed.clone(), &url).expect("measure");
    assert!(
        (clock.offset_ms() - 86_400_000).abs() < 5_000,
        "offset {}",
        clock.offset_ms()
    );
    assert!((clock.now_ms() - SystemClock.now_ms()).abs() < 5_000);
    skewed.advance(1_000);
    assert_eq!(
        clock.now_ms(),
        skewed.now_ms() + clock.offset_ms(),
        "it follows its base"
    );
}

/// What migration 5 (`run_totals`) added, undone: with it a test rebuilds an older schema.
const UNDO_TOTALS: &str =
    "DROP TRIGGER run_totals_follow ON runs; DROP FUNCTION run_totals_follow();
     DROP TABLE run_totals;";

/// Migration 5 adds `run_totals`: it starts from the rows already stored, and its trigger follows the
/// puts after it.
#[test]
fn migration_five_counts_the_runs_stored_before_it() {
    let url = pg::database();
    let mut s = open(&url);
    s.put(&record("a", 1), None, NOW).unwrap();
    s.put(&record("b", 3), None, NOW).unwrap();
    s.connection()
        .batch_execute(&(UNDO_TOTALS.to_owned() + "UPDATE schema_version SET version = 4;"))
        .unwrap();
    drop(s);
    let mut s = open(&url);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::postgres::schema::current_version()
    );
    s.put(&record("c", 2), None, NOW).unwrap();
    let totals = |s: &mut PgStore| {
        let r = s
            .connection()
            .query_one(
                "SELECT (SELECT runs FROM run_totals), (SELECT bytes FROM run_totals),
                        (SELECT COUNT(*) FROM runs), (SELECT SUM(bytes)::BIGINT FROM runs)",
                &[],
            )
            .unwrap();
        (
            (r.get::<_, i64>(0), r.get::<_, i64>(1)),
            (r.get::<_, i64>(2), r.get::<_, i64>(3)),
        )
    };
    let (kept, exact) = totals(&mut s);
    assert_eq!(kept, exact);
    assert_eq!(kept.0, 3);
}

/// Migration 2 adds each generation's `host_id` (SPEC §1.3); a generation recorded at version 1 has its
/// hostname as its host identity.
#[test]
fn migration_two_gives_old_generations_their_hostname_as_host_id() {
    use storage::ledger::GenerationInfo;
    let url = pg::database();
    let mut s = open(&url);
    // The database as version 1 left it, with one generation in it.
    s.connection()
        .batch_execute(
            &(UNDO_TOTALS.to_owned()
                + "ALTER TABLE generations DROP COLUMN host_id;
             DROP INDEX runs_open_cards; ALTER TABLE runs DROP COLUMN card_open;
             ALTER TABLE runs DROP COLUMN label;
             UPDATE schema_version SET version = 1;
             INSERT INTO generations (gen, host, pid, proc_start, started_at)
             VALUES ('20260101T000000Z-0000000a', 'box-1', 42, '777', 5);"),
        )
        .unwrap();
    drop(s);
    let mut s = open(&url);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::postgres::schema::current_version()
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

/// Migration 3 adds `card_open` (SPEC §12's orphan sweep): a row from before reads as not open, even with a
/// card in its head; the next put of the record sets it.
#[test]
fn migration_three_leaves_cards_from_before_closed_until_their_record_is_put_again() {
    let url = pg::database();
    let mut s = open(&url);
    let mut carded = record("old", 1);
    carded
        .head
        .extra
        .insert("card".into(), json!({"channel": "C1", "ts": "1.5"}));
    s.put(&carded, None, NOW).unwrap();
    // The database as version 2 left it, the row in it.
    s.connection()
        .batch_execute(
            &(UNDO_TOTALS.to_owned()
                + "DROP INDEX runs_open_cards; ALTER TABLE runs DROP COLUMN card_open;
             ALTER TABLE runs DROP COLUMN label;
             UPDATE schema_version SET version = 2;"),
        )
        .unwrap();
    drop(s);
    let mut s = open(&url);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::postgres::schema::current_version()
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
    // An identical repeat writes nothing; a changed record sets the column.
    assert!(!s.put(&carded, None, NOW).unwrap().rewritten);
    assert_eq!(s.open_cards(NOW, 10, NOW).unwrap(), Vec::<String>::new());
    carded.head.extra.insert("label2".into(), json!("x"));
    assert!(s.put(&carded, None, NOW).unwrap().rewritten);
    assert_eq!(s.open_cards(NOW, 10, NOW).unwrap(), ["old"]);
}

/// Migration 4 adds `label` (the index's search): a row from before takes its label from its summary, so a
/// search finds it at once.
#[test]
fn migration_four_gives_rows_from_before_their_label() {
    use storage::store::{ListQuery, Search};
    let url = pg::database();
    let mut s = open(&url);
    let mut labelled = record("old", 1);
    labelled.head.label = Some("Quarterly Billing".into());
    s.put(&labelled, None, NOW).unwrap();
    s.put(&record("plain", 2), None, NOW).unwrap();
    s.connection()
        .batch_execute(
            &(UNDO_TOTALS.to_owned()
                + "ALTER TABLE runs DROP COLUMN label; UPDATE schema_version SET version = 3;"),
        )
        .unwrap();
    drop(s);
    let mut s = open(&url);
    assert_eq!(
        s.schema_version().unwrap(),
        storage::postgres::schema::current_version()
    );
    let q = ListQuery {
        search: Search::new("billing"),
        ..ListQuery::visible_to(storage::record::VisibilityFilter::All)
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
