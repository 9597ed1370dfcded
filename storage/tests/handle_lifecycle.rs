//! The storage handle's composite transactions, against every backend: admission with its first events,
//! a durable step with its events, and a finish that admits the successor for unread follow-ups and
//! leaves none of the finished run's ledger rows behind (SPEC §4.3, §5.2 steps 2, 5 and 8).

use serde_json::{json, Value};
use storage::ledger::{
    Admit, AdmitOutcome, Phase, Promotion, StepRecord, StepWrite, Successor, Turn,
};
use storage::record::validate_record;
use storage::RunId;
use storage::{BackendSpec, ManualClock, MemoryStore, StorageHandle, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const GEN: &str = "20260101T000000Z-00000001";

fn backends(dir: &std::path::Path) -> Vec<(&'static str, StorageHandle)> {
    let clock = std::sync::Arc::new(ManualClock::new(NOW));
    let sqlite = BackendSpec::Sqlite {
        path: dir.join("t.db"),
        synchronous: Synchronous::Normal,
    };
    vec![
        (
            "memory",
            StorageHandle::start(BackendSpec::Memory(MemoryStore::new()), clock.clone()),
        ),
        ("sqlite", StorageHandle::start(sqlite, clock)),
    ]
}

/// [`backends`] and PostgreSQL (a fresh database of the test binary's throwaway cluster, with its read
/// pool).
fn every_backend(dir: &std::path::Path) -> Vec<(&'static str, StorageHandle)> {
    let mut handles = backends(dir);
    handles.push((
        "postgres",
        StorageHandle::start(
            BackendSpec::Postgres {
                url: storage::testing::pg::database(),
                pool: 2,
            },
            std::sync::Arc::new(ManualClock::new(NOW)),
        ),
    ));
    handles
}

fn request(text: &str, user: &str) -> Value {
    json!({"thread": "t", "channel": "c", "user": user, "text": text})
}

fn admission(run_id: &RunId, text: &str) -> Admit {
    Admit {
        thread_key: "c:t".into(),
        gen: GEN.into(),
        run_id: run_id.clone(),
        request: request(text, "u1"),
        meta: json!({"agent": "demo", "model": "m", "label": text, "threadKey": "c:t", "channelId": "c", "userId": "u1",
            "channelVisibility": "machine", "deadline": NOW + 1000, "request": request(text, "u1")}),
        key: None,
        lease_ms: 30_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    }
}

fn first_events(text: &str) -> Vec<Value> {
    vec![
        json!({"type": "run_meta", "seq": 1, "at": NOW, "agent": "demo"}),
        json!({"type": "input", "seq": 2, "at": NOW, "text": text, "source": "request"}),
    ]
}

fn step(step: u64, turn_index: u64, inbox: Option<u64>) -> StepRecord {
    StepRecord {
        step,
        seq: 0,
        turn_index,
        in_flight: vec![],
        inbox_consumed_seq: inbox,
        remaining_ms: 1,
        turn: step,
        iteration: step,
    }
}

fn record(id: &str) -> storage::record::RunRecord {
    validate_record(&json!({"id": id, "channelId": "c", "userId": "u1", "threadKey": "c:t", "channelVisibility": "machine",
        "startedAt": NOW, "finishedAt": NOW, "status": "completed", "eventCount": 2, "storedEventCount": 2,
        "truncated": false, "events": first_events("hi")}))
    .unwrap()
}

/// A run's promotion (prompt "s", no tools) and its seed: the system and user turns, the step-0 record.
fn opening(text: &str) -> (Promotion, StepWrite) {
    let promotion = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 30_000,
    };
    let seed = StepWrite {
        first_idx: 0,
        turns: vec![
            Turn {
                role: "system".into(),
                parts: vec![json!("s")],
            },
            Turn {
                role: "user".into(),
                parts: vec![json!(text)],
            },
        ],
        record: step(0, 2, None),
        events: vec![],
        state: Default::default(),
    };
    (promotion, seed)
}

/// Admit `run_id` with its first events, promotion and seed in one commit (as a fresh run is).
async fn go_live(h: &StorageHandle, run_id: &RunId) {
    assert_eq!(
        h.admit_with_events(
            admission(run_id, "hi"),
            first_events("hi"),
            None,
            Some(opening("hi")),
            NOW
        )
        .await
        .unwrap(),
        (
            AdmitOutcome::Started {
                run_id: run_id.clone()
            },
            true
        )
    );
}

/// An admission that starts a run commits its promotion and seed with it: the row is live with its
/// prompt, its transcript holds the seed and step 0 is its last step. A seed the ledger would refuse is
/// left out before anything is written: the run is admitted with its events and tombstone, unpromoted.
#[actix_rt::test]
async fn an_admission_opens_its_run_in_its_own_commit_unless_the_seed_would_be_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in every_backend(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        let row = h.get_live("r1".into()).await.unwrap().expect("the row");
        assert_eq!(row.phase, Phase::Live, "{name}");
        assert_eq!(row.system_text, "s", "{name}");
        assert_eq!(
            h.read_transcript("r1".into()).await.unwrap().turns.len(),
            2,
            "{name}"
        );
        let last = h.last_step("r1".into()).await.unwrap().expect("step 0");
        assert_eq!((last.step, last.turn_index), (0, 2), "{name}");

        let mut admit = admission(&RunId::from("r2"), "too big");
        admit.thread_key = "c:other".into();
        let (promotion, mut seed) = opening("too big");
        seed.turns[1].parts = vec![json!("x".repeat(storage::ledger::MAX_TRANSCRIPT_PART_BYTES))];
        let mut tombstone = record("r2");
        tombstone.head.provisional = true;
        tombstone.head.status = storage::record::RunStatus::Interrupted;
        let unseeded = h
            .admit_with_events(
                admit,
                first_events("too big"),
                Some((tombstone, None)),
                Some((promotion, seed)),
                NOW,
            )
            .await
            .unwrap();
        let started = AdmitOutcome::Started {
            run_id: "r2".into(),
        };
        assert_eq!(unseeded, (started, false), "{name}");
        let row = h.get_live("r2".into()).await.unwrap().expect("the row");
        assert_eq!(row.phase, Phase::Attaching, "{name}");
        assert!(
            h.read_transcript("r2".into())
                .await
                .unwrap()
                .turns
                .is_empty(),
            "{name}"
        );
        assert_eq!(h.last_step("r2".into()).await.unwrap(), None, "{name}");
        assert_eq!(
            h.live_events("r2".into(), 0, 10).await.unwrap(),
            Some(first_events("too big")),
            "{name}"
        );
        assert!(
            h.get("r2".into()).await.unwrap().is_some(),
            "{name}: the tombstone"
        );
    }
}

#[actix_rt::test]
async fn an_admission_commits_its_first_events_and_tombstone_and_a_steer_none() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in every_backend(dir.path()) {
        let tombstone = |id: &str| {
            let mut t = record(id);
            t.head.provisional = true;
            t.head.status = storage::record::RunStatus::Interrupted;
            Some((t, None))
        };
        let started = h
            .admit_with_events(
                admission(&RunId::from("r1"), "hello"),
                first_events("hello"),
                tombstone("r1"),
                Some(opening("hello")),
                NOW,
            )
            .await
            .unwrap();
        assert_eq!(
            started,
            (
                AdmitOutcome::Started {
                    run_id: "r1".into()
                },
                true
            ),
            "{name}"
        );
        assert_eq!(
            h.live_events("r1".into(), 0, 10).await.unwrap(),
            Some(first_events("hello")),
            "{name}"
        );
        // A second message on the thread steers: the pre-minted id gets no row and no events.
        let kept = h.get("r1".into()).await.unwrap().expect("the tombstone");
        assert!(kept.head.provisional, "{name}");
        assert_eq!(
            kept.head.status,
            storage::record::RunStatus::Interrupted,
            "{name}"
        );
        let before = h.inbox_epoch();
        let steered = h
            .admit_with_events(
                admission(&RunId::from("r2"), "more"),
                first_events("more"),
                tombstone("r2"),
                Some(opening("more")),
                NOW,
            )
            .await
            .unwrap();
        assert!(
            matches!(steered, (AdmitOutcome::Steered { ref run_id, .. }, false) if run_id == "r1"),
            "{name}: {steered:?}"
        );
        // The steer moved the inbox epoch, so r1's next inbox read reads; a read moves nothing.
        let after = h.inbox_epoch();
        assert!(after > before, "{name}");
        h.get("r1".into()).await.unwrap();
        assert_eq!(h.inbox_epoch(), after, "{name}");
        assert_eq!(
            h.live_events("r2".into(), 0, 10).await.unwrap(),
            None,
            "{name}"
        );
        assert!(h.get("r2".into()).await.unwrap().is_none(), "{name}");
        assert_eq!(
            h.live_events("r1".into(), 0, 10)
                .await
                .unwrap()
                .map(|e| e.len()),
            Some(2),
            "{name}"
        );
    }
}

#[actix_rt::test]
async fn a_finish_admits_one_successor_for_the_unread_inbox_in_the_same_transaction() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in backends(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        let s1 = h
            .push_inbox("r1".into(), request("first", "u2"))
            .await
            .unwrap()
            .unwrap();
        let s2 = h
            .push_inbox("r1".into(), request("second", "u3"))
            .await
            .unwrap()
            .unwrap();
        let s3 = h
            .push_inbox("r1".into(), request("third", "u4"))
            .await
            .unwrap()
            .unwrap();
        // A step consumed the first; the run folded the second after its last step record.
        let turn = Turn {
            role: "assistant".into(),
            parts: vec![json!("a")],
        };
        h.durable_step(
            "r1".into(),
            GEN.into(),
            2,
            vec![turn],
            step(1, 3, Some(s1)),
            vec![],
        )
        .await
        .unwrap()
        .unwrap();
        let successor = Successor {
            run_id: "r2".into(),
            lease_ms: 30_000,
            inbox_consumed: Some(s2),
        };
        h.finish(GEN.into(), record("r1"), None, Some(successor))
            .await
            .unwrap()
            .unwrap();

        assert_eq!(
            h.get_live("r1".into()).await.unwrap(),
            None,
            "{name}: the finished run's row is gone"
        );
        let row = h
            .get_live("r2".into())
            .await
            .unwrap()
            .expect("the successor is admitted");
        assert_eq!(
            (row.phase, row.owner_gen.as_str(), row.thread_key.as_str()),
            (Phase::Attaching, GEN, "c:t"),
            "{name}"
        );
        assert_eq!(
            row.meta["request"]["text"], "third",
            "{name}: only what was never read"
        );
        assert_eq!(row.meta["userId"], "u4", "{name}");
        assert_eq!(row.meta["agent"], "demo", "{name}");
        assert!(
            row.meta.get("deadline").is_none(),
            "{name}: its deadline comes from its own start"
        );
        let events = h.live_events("r2".into(), 0, 10).await.unwrap().unwrap();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["run_meta", "input"], "{name}");
        assert_eq!(
            (events[1]["text"].as_str(), events[1]["source"].as_str()),
            (Some("third"), Some("followup")),
            "{name}"
        );
        assert!(s3 > s2, "{name}");
        // Nothing of r1's ledger rows stayed: its inbox went with it (read or not — the successor took
        // over what was unread in its own request), and so did its transcript and step records.
        assert_eq!(
            h.read_transcript("r1".into()).await.unwrap().turns,
            vec![],
            "{name}"
        );
        assert_eq!(h.last_step("r1".into()).await.unwrap(), None, "{name}");
        let rows = h.table_rows().await.unwrap();
        assert_eq!(
            (
                rows.live_runs,
                rows.run_steps,
                rows.transcript,
                rows.run_inbox
            ),
            (1, 0, 0, 0),
            "{name}: {rows:?}"
        );
    }
}

fn queued(text: &str) -> Value {
    json!({"thread": "t", "channel": "c", "user": "u9", "text": text, "strategy": "enqueue"})
}

fn successor(run_id: &RunId) -> Successor {
    Successor {
        run_id: run_id.clone(),
        lease_ms: 30_000,
        inbox_consumed: None,
    }
}

/// The texts of a run's `input` events with their sources.
async fn inputs(h: &StorageHandle, run_id: &RunId) -> Vec<(String, String)> {
    h.live_events(run_id.clone(), 0, 100)
        .await
        .unwrap()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["type"] == "input")
        .map(|e| {
            (
                e["text"].as_str().unwrap().into(),
                e["source"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// SPEC §5.1 enqueue: each queued message starts its own run in turn — the first queued message is the
/// successor's request, and what waits behind it moves onto the successor's inbox, in order, so the queue
/// goes on through every finish. Late steering messages ahead of it are answered first, together.
#[actix_rt::test]
async fn queued_messages_start_one_run_each_in_order_through_the_finishes() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in backends(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        for message in [
            queued("q1"),
            request("late steer", "u2"),
            queued("q2"),
            queued("q3"),
        ] {
            h.push_inbox("r1".into(), message).await.unwrap().unwrap();
        }
        // r1 folded nothing: q1 is next, the steer rides along on q1's run, q2 and q3 wait their turn.
        h.finish(
            GEN.into(),
            record("r1"),
            None,
            Some(successor(&RunId::from("r2"))),
        )
        .await
        .unwrap()
        .unwrap();
        let row = h.get_live("r2".into()).await.unwrap().expect("q1's run");
        assert_eq!(row.meta["request"]["text"], "q1", "{name}");
        assert_eq!(row.meta["userId"], "u9", "{name}");
        assert_eq!(
            inputs(&h, &RunId::from("r2")).await,
            [("q1".into(), "request".into())],
            "{name}"
        );
        let carried = h.read_inbox("r2".into(), None).await.unwrap().unwrap();
        let texts: Vec<(&str, bool)> = carried
            .iter()
            .map(|i| (i.message["text"].as_str().unwrap(), i.queued()))
            .collect();
        assert_eq!(
            texts,
            [("late steer", false), ("q2", true), ("q3", true)],
            "{name}"
        );

        // r2 folds the steer (its cursor passes q2's seq too); q2 still starts next, then q3.
        let mut r2 = record("r2");
        r2.head.id = "r2".into();
        h.claim(
            "r2".into(),
            GEN.into(),
            Promotion {
                system_text: "s".into(),
                tools: json!([]),
                state: Default::default(),
                lease_ms: 30_000,
            },
        )
        .await
        .unwrap()
        .unwrap();
        let consumed = carried.iter().map(|i| i.seq).max();
        h.finish(
            GEN.into(),
            r2,
            None,
            Some(Successor {
                inbox_consumed: consumed,
                ..successor(&RunId::from("r3"))
            }),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(
            inputs(&h, &RunId::from("r3")).await,
            [("q2".into(), "request".into())],
            "{name}"
        );
        let left = h.read_inbox("r3".into(), None).await.unwrap().unwrap();
        assert_eq!(left.len(), 1, "{name}");
        assert_eq!(left[0].message["text"], "q3", "{name}");
    }
}

/// SPEC §5.1: a kill deletes the run and what steered it, never the messages queued behind it — the
/// purge starts the first of them on the thread it frees, in the same transaction.
#[actix_rt::test]
async fn a_purge_hands_the_queue_to_a_successor_and_drops_the_steering_messages() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in backends(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        for message in [request("steer", "u2"), queued("q1"), queued("q2")] {
            h.push_inbox("r1".into(), message).await.unwrap().unwrap();
        }
        h.kill("r1".into()).await.unwrap();
        assert!(
            h.purge("r1".into(), GEN.into(), Some(successor(&RunId::from("r2"))))
                .await
                .unwrap(),
            "{name}"
        );
        assert_eq!(h.get_live("r1".into()).await.unwrap(), None, "{name}");
        assert_eq!(
            inputs(&h, &RunId::from("r2")).await,
            [("q1".into(), "request".into())],
            "{name}"
        );
        let left = h.read_inbox("r2".into(), None).await.unwrap().unwrap();
        assert_eq!(
            left.iter()
                .map(|i| i.message["text"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["q2"],
            "{name}: the steer died with its run"
        );
        // The next kill hands on q2; the one after that has nothing queued and admits nothing.
        h.kill("r2".into()).await.unwrap();
        assert!(h
            .purge("r2".into(), GEN.into(), Some(successor(&RunId::from("r3"))))
            .await
            .unwrap());
        assert_eq!(
            inputs(&h, &RunId::from("r3")).await,
            [("q2".into(), "request".into())],
            "{name}"
        );
        h.kill("r3".into()).await.unwrap();
        assert!(h
            .purge("r3".into(), GEN.into(), Some(successor(&RunId::from("r4"))))
            .await
            .unwrap());
        assert_eq!(h.get_live("r4".into()).await.unwrap(), None, "{name}");
        assert_eq!(h.table_rows().await.unwrap().live_runs, 0, "{name}");
    }
}

#[actix_rt::test]
async fn a_finish_with_nothing_unread_admits_nothing_and_a_close_reads_the_last_step() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in backends(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        let s1 = h
            .push_inbox("r1".into(), request("first", "u2"))
            .await
            .unwrap()
            .unwrap();
        let turn = Turn {
            role: "assistant".into(),
            parts: vec![json!("a")],
        };
        h.durable_step(
            "r1".into(),
            GEN.into(),
            2,
            vec![turn],
            step(1, 3, Some(s1)),
            vec![],
        )
        .await
        .unwrap()
        .unwrap();
        // A close (no consumed seq of its own) relies on the last step record: nothing unread.
        let successor = Successor {
            run_id: "r2".into(),
            lease_ms: 30_000,
            inbox_consumed: None,
        };
        h.finish(GEN.into(), record("r1"), None, Some(successor))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(h.get_live("r2".into()).await.unwrap(), None, "{name}");
        assert!(
            h.list_live().await.unwrap().is_empty(),
            "{name}: the thread is free"
        );
    }
}

#[actix_rt::test]
async fn a_fenced_finish_admits_no_successor() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in backends(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        h.push_inbox("r1".into(), request("first", "u2"))
            .await
            .unwrap()
            .unwrap();
        let successor = Successor {
            run_id: "r2".into(),
            lease_ms: 30_000,
            inbox_consumed: None,
        };
        let out = h
            .finish(
                "20260101T000000Z-00000009".into(),
                record("r1"),
                None,
                Some(successor),
            )
            .await
            .unwrap();
        assert!(
            matches!(out, Err(storage::ledger::Refusal::Fenced { .. })),
            "{name}: {out:?}"
        );
        assert_eq!(h.get_live("r2".into()).await.unwrap(), None, "{name}");
        assert!(h.get_live("r1".into()).await.unwrap().is_some(), "{name}");
    }
}

/// A promotion repeated after an uncertain answer keeps its row and rewrites its seed; a late one — the
/// run already stepped past its seed under this generation (another generation restarted it and this one
/// reclaimed it back) — is refused `Fenced` and writes nothing, so the request never runs twice.
#[actix_rt::test]
async fn a_promotion_over_a_run_past_its_seed_is_refused_and_a_repeated_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in backends(dir.path()) {
        assert!(matches!(
            h.admit_with_events(
                admission(&RunId::from("r1"), "hi"),
                first_events("hi"),
                None,
                None,
                NOW
            )
            .await
            .unwrap(),
            (AdmitOutcome::Started { .. }, false)
        ));
        let (p, seed) = opening("hi");
        let first = h
            .promote("r1".into(), GEN.into(), p.clone(), seed.clone())
            .await
            .unwrap();
        assert_eq!(first, Ok(storage::ledger::Claimed::Promoted), "{name}");
        let again = h
            .promote("r1".into(), GEN.into(), p.clone(), seed.clone())
            .await
            .unwrap();
        assert_eq!(
            again,
            Ok(storage::ledger::Claimed::AlreadyLive),
            "{name}: a repeat after an uncertain answer"
        );
        let answer = Turn {
            role: "assistant".into(),
            parts: vec![json!("done")],
        };
        h.durable_step(
            "r1".into(),
            GEN.into(),
            2,
            vec![answer],
            step(1, 3, None),
            vec![],
        )
        .await
        .unwrap()
        .unwrap();
        let late = h.promote("r1".into(), GEN.into(), p, seed).await.unwrap();
        assert!(
            matches!(late, Err(storage::ledger::Refusal::Fenced { .. })),
            "{name}: {late:?}"
        );
        assert_eq!(
            h.last_step("r1".into()).await.unwrap().map(|s| s.step),
            Some(1),
            "{name}: untouched"
        );
    }
}

/// The orphan sweep through the handle (SPEC §12), on every backend and PostgreSQL's read pool: the
/// worklist is a read that sees the committed put, and a closed card leaves it at once.
#[actix_rt::test]
async fn the_orphan_sweep_lists_and_closes_cards_through_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in every_backend(dir.path()) {
        let mut carded = record("carded");
        carded
            .head
            .extra
            .insert("card".into(), json!({"channel": "c", "ts": "1.5"}));
        h.put(carded, None).await.unwrap();
        h.put(record("plain"), None).await.unwrap();
        assert_eq!(h.open_cards(NOW, 50).await.unwrap(), ["carded"], "{name}");
        assert_eq!(
            h.open_cards(NOW - 1, 50).await.unwrap(),
            Vec::<String>::new(),
            "{name}"
        );
        assert!(h.close_card("carded".into()).await.unwrap(), "{name}");
        assert!(!h.close_card("carded".into()).await.unwrap(), "{name}");
        assert!(!h.close_card("plain".into()).await.unwrap(), "{name}");
        assert_eq!(
            h.open_cards(NOW, 50).await.unwrap(),
            Vec::<String>::new(),
            "{name}"
        );
        let summary = h.get_summary("carded".into()).await.unwrap().expect(name);
        assert_eq!(
            summary.head.extra.get("cardClosed"),
            Some(&json!(true)),
            "{name}"
        );
    }
}

/// A point read's summary and deletion fence, read together, answer what the two reads answer apart on
/// every backend: a stored run, a killed one, an unknown id.
#[actix_rt::test]
async fn a_summary_and_its_kill_read_together_answer_as_apart() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in every_backend(dir.path()) {
        h.put(record("r1"), None).await.unwrap();
        go_live(&h, &RunId::from("r2")).await;
        h.kill("r2".into()).await.unwrap();
        for id in ["r1", "r2", "r3"] {
            let together = h.get_summary_and_killed(id.into()).await.unwrap();
            let killed = !h.killed_among(vec![id.into()]).await.unwrap().is_empty();
            let apart = (h.get_summary(id.into()).await.unwrap(), killed);
            assert_eq!(together, apart, "{name}: {id}");
            assert_eq!(
                (together.0.is_some(), together.1),
                (id == "r1", id == "r2"),
                "{name}: {id}"
            );
        }
    }
}

/// An admission's tombstone is a live run's record: its put writes the `runs` row alone and leaves the
/// run's events to the ledger — here the admission's first events, appended after it; none of the
/// tombstone's own (SPEC §5.2 step 2).
#[actix_rt::test]
async fn an_admissions_tombstone_leaves_the_live_events_to_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in every_backend(dir.path()) {
        let mut tombstone = record("r1");
        tombstone.head.provisional = true;
        tombstone.head.status = storage::record::RunStatus::Interrupted;
        tombstone
            .events
            .push(json!({"type": "assistant", "seq": 3, "at": NOW, "text": "not the ledger's"}));
        tombstone.head.event_count = 3;
        let started = h
            .admit_with_events(
                admission(&RunId::from("r1"), "hello"),
                first_events("hello"),
                Some((tombstone, None)),
                None,
                NOW,
            )
            .await
            .unwrap();
        assert!(started.0.started(&RunId::from("r1")), "{name}: {started:?}");
        assert_eq!(
            h.live_events("r1".into(), 0, 10).await.unwrap(),
            Some(first_events("hello")),
            "{name}"
        );
    }
}

/// A run with no reply to deliver seals (SPEC §5.2 step 3): its held-back last step, its finishing gate
/// and its finish with the successor commit as one. A seal the gate refuses (a stop recorded before it)
/// commits nothing of the three; the same seal under the stop's status then lands.
#[actix_rt::test]
async fn a_seal_commits_the_last_step_the_gate_and_the_finish_as_one_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (name, h) in every_backend(dir.path()) {
        go_live(&h, &RunId::from("r1")).await;
        let first = h
            .push_inbox("r1".into(), request("late", "u2"))
            .await
            .unwrap()
            .unwrap();
        h.push_inbox("r1".into(), request("later", "u2"))
            .await
            .unwrap()
            .unwrap();
        // The held-back last step read the first message: only the second waits for the successor.
        let last = storage::ledger::StepWrite {
            first_idx: 2,
            turns: vec![Turn {
                role: "assistant".into(),
                parts: vec![json!("the answer")],
            }],
            record: step(1, 3, Some(first)),
            events: vec![],
            state: Default::default(),
        };
        // The record carries an event the ledger never had: its answer, which the finish must keep.
        let mut sealed_record = record("r1");
        sealed_record
            .events
            .push(json!({"type": "assistant", "seq": 3, "at": NOW, "text": "the answer"}));
        sealed_record.head.event_count = 3;
        let seal = |status: storage::record::RunStatus| {
            let mut r = sealed_record.clone();
            r.head.status = status;
            h.seal(
                GEN.into(),
                Some(last.clone()),
                status,
                r,
                None,
                Some(successor(&RunId::from("r2"))),
            )
        };
        h.request_stop("r1".into(), storage::ledger::StopMode::Soft)
            .await
            .unwrap()
            .unwrap();
        let refused = seal(storage::record::RunStatus::Completed).await.unwrap();
        assert!(
            matches!(refused, Err(storage::ledger::Refusal::StopPending { .. })),
            "{name}: {refused:?}"
        );
        let row = h.get_live("r1".into()).await.unwrap().expect("still live");
        assert_ne!(row.phase, Phase::Finishing, "{name}: no gate");
        assert_eq!(
            h.read_transcript("r1".into()).await.unwrap().turns.len(),
            2,
            "{name}: no step"
        );
        assert!(
            h.get("r1".into()).await.unwrap().is_none(),
            "{name}: no record"
        );
        assert_eq!(h.get_live("r2".into()).await.unwrap(), None, "{name}");

        let sealed = seal(storage::record::RunStatus::StoppedSoft).await.unwrap();
        assert!(
            matches!(sealed, Ok(true)),
            "{name}: a successor was admitted: {sealed:?}"
        );
        assert_eq!(h.get_live("r1".into()).await.unwrap(), None, "{name}");
        let kept = h.get("r1".into()).await.unwrap().expect("the record");
        assert_eq!(
            (kept.head.status, kept.head.provisional),
            (storage::record::RunStatus::StoppedSoft, false),
            "{name}"
        );
        assert_eq!(
            kept.events, sealed_record.events,
            "{name}: the record's events"
        );
        let next = h
            .get_live("r2".into())
            .await
            .unwrap()
            .expect("the successor");
        assert_eq!(next.meta["request"]["text"], "later", "{name}");
        assert!(first > 0, "{name}");
        let rows = h.table_rows().await.unwrap();
        assert_eq!(
            (rows.live_runs, rows.run_steps, rows.transcript),
            (1, 0, 0),
            "{name}: nothing of r1 stays in the ledger"
        );
    }
}

/// Two processes on one SQLite file: a steer the other one admitted moves this one's inbox epoch at its
/// writer's next job (SQLite's `data_version`), so its run reads the message then.
#[actix_rt::test]
async fn another_process_steer_moves_the_inbox_epoch_at_this_writers_next_job() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        StorageHandle::start(
            BackendSpec::Sqlite {
                path: dir.path().join("shared.db"),
                synchronous: Synchronous::Normal,
            },
            std::sync::Arc::new(ManualClock::new(NOW)),
        )
    };
    let (a, b) = (open(), open());
    let started = a
        .admit_with_events(
            admission(&RunId::from("r1"), "hello"),
            first_events("hello"),
            None,
            None,
            NOW,
        )
        .await
        .unwrap();
    assert!(
        matches!(started.0, AdmitOutcome::Started { .. }),
        "{started:?}"
    );
    a.ping().await.unwrap();
    let before = a.inbox_epoch();
    let steered = b
        .admit_with_events(
            admission(&RunId::from("r2"), "more"),
            first_events("more"),
            None,
            None,
            NOW,
        )
        .await
        .unwrap();
    assert!(
        matches!(steered.0, AdmitOutcome::Steered { .. }),
        "{steered:?}"
    );
    a.ping().await.unwrap();
    assert!(a.inbox_epoch() > before, "a's writer saw b's commit");
    // Nothing more was written: the next job moves nothing.
    let seen = a.inbox_epoch();
    a.ping().await.unwrap();
    assert_eq!(a.inbox_epoch(), seen);
}
