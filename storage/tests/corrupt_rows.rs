//! Corrupt rows on disk, per SQL backend (SQLite and PostgreSQL; the memory backend keeps typed values
//! and has no bytes to corrupt): a row is damaged with raw SQL, then the store is read through its
//! traits, and what it logs is captured (`storage::testing::logs`).
//!
//! - An event row (`run_events.json`) that is not JSON is skipped: the record, an events page and a live
//!   run's events answer the other events; the skip is logged with the run id and the seq, never the
//!   stored bytes.
//! - A receipt (`admit_receipts.answer_json`) that does not decode fails the keyed admission as storage
//!   that could not answer (the API's 503) — nothing written, no second run — and the log tells invalid
//!   JSON from valid JSON of an unsupported shape, with the scope and the run id, never the stored
//!   bytes, the key or the decoder's message.

use serde_json::{json, Value};
use storage::ledger::{Admit, AdmitOutcome, Promotion, ReceiptKey, RunLedger};
use storage::record::{validate_record, RunRecord};
use storage::store::RunStore;
use storage::testing::logs::{capture, Logged};
use storage::RunId;
use storage::{DecodeProblem, Error, PgStore, SqliteStore, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const G1: &str = "20270115T080000Z-11111111";

/// Text planted in a corrupt row: no log line or error may repeat it.
const STORED: &str = "stored-bytes-7f3a";
/// An idempotency key: no log line or error may name it.
const KEY: &str = "secret-key-91c2";

/// A store this file can damage with raw SQL.
trait RawSql: RunStore + RunLedger {
    fn raw(&mut self, sql: &str);
}

impl RawSql for SqliteStore {
    fn raw(&mut self, sql: &str) {
        self.connection().execute_batch(sql).expect("raw sql");
    }
}

impl RawSql for PgStore {
    fn raw(&mut self, sql: &str) {
        self.connection().batch_execute(sql).expect("raw sql");
    }
}

fn ev(seq: u64) -> Value {
    json!({"type": "note", "seq": seq, "at": NOW + seq as i64, "kind": "progress", "summary": format!("event {seq}")})
}

fn record(id: &str, events: Vec<Value>) -> RunRecord {
    let n = events.len();
    validate_record(&json!({
        "id": id, "agent": "demo", "channelId": "C1", "userId": "U1", "threadKey": "C1:t0",
        "channelVisibility": "public", "startedAt": NOW, "finishedAt": NOW + 10, "status": "completed",
        "eventCount": n, "storedEventCount": n, "truncated": false, "events": events,
        "diagnosis": {"byCategory": {}}
    }))
    .expect("a valid record")
}

fn admission(thread: &str, run_id: &RunId, key: Option<&str>) -> Admit {
    Admit {
        thread_key: thread.to_owned(),
        gen: G1.to_owned(),
        run_id: run_id.to_owned(),
        request: json!({"text": "hello"}),
        meta: json!({"agent": "demo", "request": {"text": "hello"}}),
        key: key.map(|k| ReceiptKey {
            scope: "tok".into(),
            key: k.into(),
            body_hash: "h".into(),
        }),
        lease_ms: 30_000,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    }
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect()
}

/// The warnings among `logged` whose message is `message`.
fn warnings<'a>(logged: &'a [Logged], message: &str) -> Vec<&'a Logged> {
    logged
        .iter()
        .filter(|l| l.level == tracing::Level::WARN && l.message == message)
        .collect()
}

fn assert_never_mentions(logged: &[Logged], secrets: &[&str]) {
    for line in logged {
        for secret in secrets {
            assert!(
                !line.text().contains(secret),
                "a log line repeats {secret:?}: {}",
                line.text()
            );
        }
    }
}

/// Seq 2 of a finished record and seq 2 of a live run are not JSON: every read answers the other
/// events, and each skip is logged once per read with the run id, the seq and `invalid_json`.
fn a_corrupt_event_row_is_skipped_and_logged_without_its_bytes<S: RawSql>(s: &mut S) {
    assert!(
        s.put(&record("done", vec![ev(1), ev(2), ev(3)]), None, NOW + 10)
            .unwrap()
            .stored
    );
    assert_eq!(
        s.admit(&admission("C1:t1", &RunId::from("live"), None), NOW)
            .unwrap(),
        AdmitOutcome::Started {
            run_id: "live".into()
        }
    );
    let p = Promotion {
        system_text: "s".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: 30_000,
    };
    s.claim(&RunId::from("live"), G1, &p, NOW)
        .unwrap()
        .expect("promoted");
    s.append(&RunId::from("live"), G1, &[ev(1), ev(2), ev(3)])
        .unwrap()
        .expect("appended");
    s.raw(&format!("UPDATE run_events SET json = '{{\"type\": \"note\", \"summary\": \"{STORED}' WHERE seq = 2"));

    let (record, logged) = capture(|| {
        s.get(&RunId::from("done"), NOW + 10)
            .unwrap()
            .expect("the record")
    });
    assert_eq!(
        seqs(&record.events),
        [1, 3],
        "the record keeps its other events"
    );
    let skips = warnings(&logged, "skipped a corrupt event row");
    assert_eq!(skips.len(), 1, "{logged:?}");
    assert_eq!(
        (skips[0].field("run_id"), skips[0].field("seq")),
        (Some("done"), Some("2"))
    );
    assert_eq!(
        skips[0].field("problem"),
        Some(DecodeProblem::InvalidJson.as_str())
    );
    assert_never_mentions(&logged, &[STORED]);

    let (page, logged) = capture(|| {
        s.events(&RunId::from("done"), 0, None, NOW + 10)
            .unwrap()
            .expect("a page")
    });
    assert_eq!(seqs(&page.events), [1, 3]);
    assert_eq!(warnings(&logged, "skipped a corrupt event row").len(), 1);
    assert_never_mentions(&logged, &[STORED]);

    let (live, logged) = capture(|| {
        s.live_events(&RunId::from("live"), 0, 100)
            .unwrap()
            .expect("a live run")
    });
    assert_eq!(seqs(&live), [1, 3], "a live run's other events are served");
    let skips = warnings(&logged, "skipped a corrupt event row");
    assert_eq!(skips.len(), 1, "{logged:?}");
    assert_eq!(
        (skips[0].field("run_id"), skips[0].field("seq")),
        (Some("live"), Some("2"))
    );
    assert_eq!(skips[0].field("problem"), Some("invalid_json"));
    assert_never_mentions(&logged, &[STORED]);
}

/// A keyed admission started run `r1`; its receipt is then damaged, once as text that is not JSON and
/// once as JSON of a shape no build wrote. Each retry of the key fails as storage that could not answer
/// (a `Corrupt` error naming only the problem: not transient, never a refusal), writes nothing — no
/// second run, no inbox row — and logs the problem with the scope and the run id.
fn a_corrupt_receipt_fails_the_retry_and_names_its_problem_without_its_bytes<S: RawSql>(s: &mut S) {
    let first = s
        .admit(&admission("C1:t1", &RunId::from("r1"), Some(KEY)), NOW)
        .unwrap();
    assert_eq!(
        first,
        AdmitOutcome::Started {
            run_id: "r1".into()
        }
    );
    let retry = admission("C1:t1", &RunId::from("r2"), Some(KEY));
    assert_eq!(
        s.admit(&retry, NOW + 1).unwrap(),
        first,
        "a sound receipt answers verbatim"
    );

    for (answer_json, problem) in [
        (
            format!("{{\"outcome\": \"started\", \"runId\": \"{STORED}"),
            DecodeProblem::InvalidJson,
        ),
        (
            format!("{{\"outcome\": \"{STORED}\", \"runId\": \"r1\"}}"),
            DecodeProblem::UnsupportedSchema,
        ),
        (
            format!("{{\"outcome\": \"steered\", \"runId\": \"r1\", \"seq\": \"{STORED}\"}}"),
            DecodeProblem::UnsupportedSchema,
        ),
    ] {
        s.raw(&format!(
            "UPDATE admit_receipts SET answer_json = '{answer_json}'"
        ));
        let (answer, logged) = capture(|| s.admit(&retry, NOW + 2));
        let err = answer.expect_err("a receipt that does not decode cannot answer");
        match &err {
            Error::Corrupt { what, why } => assert_eq!(
                (*what, why.as_str()),
                ("admit_receipts.answer_json", problem.as_str())
            ),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(!err.is_transient(), "retrying reads the same bytes");
        for secret in [STORED, KEY] {
            assert!(
                !err.to_string().contains(secret),
                "the error repeats {secret:?}: {err}"
            );
        }
        let lines = warnings(&logged, "a stored admit receipt does not decode");
        assert_eq!(lines.len(), 1, "{logged:?}");
        assert_eq!(lines[0].field("problem"), Some(problem.as_str()));
        assert_eq!(
            (lines[0].field("scope"), lines[0].field("run_id")),
            (Some("tok"), Some("r1"))
        );
        assert_never_mentions(&logged, &[STORED, KEY]);

        // Nothing was written: r1 still holds the thread alone, with an empty inbox, and no r2 exists.
        let live: Vec<RunId> = s
            .list_live()
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(live, ["r1"]);
        assert_eq!(s.read_inbox(&RunId::from("r1"), None).unwrap(), Ok(vec![]));
    }
}

#[test]
fn sqlite_a_corrupt_event_row_is_skipped_and_logged_without_its_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).expect("open");
    a_corrupt_event_row_is_skipped_and_logged_without_its_bytes(&mut s);
}

#[test]
fn postgres_a_corrupt_event_row_is_skipped_and_logged_without_its_bytes() {
    let mut s = PgStore::open(&storage::testing::pg::database()).expect("open");
    a_corrupt_event_row_is_skipped_and_logged_without_its_bytes(&mut s);
}

#[test]
fn sqlite_a_corrupt_receipt_fails_the_retry_and_names_its_problem_without_its_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).expect("open");
    a_corrupt_receipt_fails_the_retry_and_names_its_problem_without_its_bytes(&mut s);
}

#[test]
fn postgres_a_corrupt_receipt_fails_the_retry_and_names_its_problem_without_its_bytes() {
    let mut s = PgStore::open(&storage::testing::pg::database()).expect("open");
    a_corrupt_receipt_fails_the_retry_and_names_its_problem_without_its_bytes(&mut s);
}
