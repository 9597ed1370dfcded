//! The `RunLedger` contract (SPEC §4), run against every implementation: in-memory, SQLite and
//! PostgreSQL (a fresh database per case in one throwaway cluster per test binary, `storage::testing::pg`).
//!
//! Each case is a plain function over a store that is both the finished-run history and the live-run
//! ledger (`S: RunStore + RunLedger`); the `contract!` macro instantiates it once per implementation,
//! so both run exactly the same assertions. Time is explicit: every case passes `now_ms` values, and
//! leases expire because a later `now` is passed, never because the test sleeps.
//!
//! Kill and purge have their own module at the end (`mod kill`); the bulk read of deletion fences
//! (`killed_among`) is a macro case like the others. What is deliberately not here: resume
//! classification (pure decisions, tested in `decisions.rs`), and anything above the storage layer.

use std::collections::{BTreeMap, BTreeSet};
use storage::RunId;

use serde_json::{json, Map, Value};
use storage::ledger::{
    Admit, AdmitOutcome, Claimed, GenerationInfo, HandoffResult, InFlight, InboxItem, LiveRow,
    Outcome, Phase, Promotion, PruneReport, ReceiptKey, Reclaimed, Refusal, RunLedger, StepRecord,
    StepWrite, StopMode, TableRows, Turn, MAX_TRANSCRIPT_PART_BYTES,
};
use storage::plan::{
    Card, Import, PlanBinding, PlanId, PlanStore, RequestId, Revision, SettleOutcome, Settlement,
    SnapshotId, TerminalReason,
};
use storage::record::{validate_record, RunRecord, RunStatus, VisibilityFilter};
use storage::store::{ListQuery, RunStore};
use storage::{MemoryStore, SqliteStore, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const LEASE: i64 = 30_000;

/// Generations have the minted shape (`YYYYMMDDTHHMMSSZ-xxxxxxxx`).
const G1: &str = "20270115T080000Z-11111111";
const G2: &str = "20270115T090000Z-22222222";
const G3: &str = "20270115T100000Z-33333333";

/// What every case needs: the finished-run history and the live-run ledger over one state (and the
/// plan tables, whose pending requests a generation owns).
trait Ledger: RunStore + RunLedger + PlanStore {}
impl<T: RunStore + RunLedger + PlanStore> Ledger for T {}

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().expect("a JSON object").clone()
}

fn request(thread: &str, text: &str) -> Value {
    json!({"thread": thread, "channel": "C1", "user": "U1", "text": text})
}

fn meta(thread: &str, text: &str) -> Value {
    json!({
        "agent": "demo", "model": "m1", "label": "demo run", "threadKey": thread, "channelId": "C1",
        "userId": "U1", "channelVisibility": "public", "deadline": NOW + 600_000,
        "request": request(thread, text)
    })
}

fn admission(thread: &str, gen: &str, run_id: &RunId, text: &str) -> Admit {
    Admit {
        thread_key: thread.to_owned(),
        gen: gen.to_owned(),
        run_id: run_id.to_owned(),
        request: request(thread, text),
        meta: meta(thread, text),
        key: None,
        lease_ms: LEASE,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    }
}

fn keyed(mut a: Admit, scope: &str, key: &str, body_hash: &str) -> Admit {
    a.key = Some(ReceiptKey {
        scope: scope.to_owned(),
        key: key.to_owned(),
        body_hash: body_hash.to_owned(),
    });
    a
}

fn started(run: &str) -> AdmitOutcome {
    AdmitOutcome::Started {
        run_id: RunId::from(run),
    }
}

fn steered(run: &str, seq: u64) -> AdmitOutcome {
    AdmitOutcome::Steered {
        run_id: RunId::from(run),
        seq,
    }
}

fn fenced(run: &str) -> Refusal {
    Refusal::Fenced {
        run_id: RunId::from(run),
    }
}

fn unknown(run: &str) -> Refusal {
    Refusal::UnknownRun {
        run_id: RunId::from(run),
    }
}

fn not_live(run: &str) -> Refusal {
    Refusal::NotLive {
        run_id: RunId::from(run),
    }
}

fn promotion(lease_ms: i64) -> Promotion {
    Promotion {
        system_text: "You are demo.".to_owned(),
        tools: json!([{"name": "search", "description": "search the web", "parameters": {"type": "object"}}]),
        state: obj(json!({"seeded": true})),
        lease_ms,
    }
}

/// Admit `run` on a free `thread` under `gen`: it must start.
fn start<S: Ledger>(s: &mut S, run: &str, thread: &str, gen: &str, now: i64) {
    let out = s
        .admit(&admission(thread, gen, &RunId::from(run), "hello"), now)
        .expect("admit");
    assert_eq!(
        out,
        started(run),
        "admit of {run} on the free thread {thread}"
    );
}

/// Promote `gen`'s reservation of `run`.
fn promote<S: Ledger>(s: &mut S, run: &str, gen: &str, now: i64) {
    let out = s
        .claim(&RunId::from(run), gen, &promotion(LEASE), now)
        .expect("claim");
    assert_eq!(
        out,
        Ok(Claimed::Promoted),
        "promotion of {run} by its owner"
    );
}

/// Admit and promote: a `live` row owned by `gen`, lease `now + LEASE`.
fn go_live<S: Ledger>(s: &mut S, run: &str, thread: &str, gen: &str, now: i64) {
    start(s, run, thread, gen, now);
    promote(s, run, gen, now);
}

fn live_row<S: Ledger>(s: &mut S, run: &str) -> LiveRow {
    s.get_live(&RunId::from(run))
        .expect("get_live")
        .unwrap_or_else(|| panic!("{run} should have a live row"))
}

fn ev(seq: u64, text: &str) -> Value {
    json!({"type": "note", "seq": seq, "at": NOW + seq as i64, "kind": "progress", "summary": text})
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["seq"].as_u64().expect("event seq"))
        .collect()
}

fn live_events<S: Ledger>(s: &mut S, run: &str) -> Option<Vec<Value>> {
    s.live_events(&RunId::from(run), 0, 10_000)
        .expect("live_events")
}

fn step_record(step: u64, turn_index: u64, consumed: Option<u64>) -> StepRecord {
    StepRecord {
        step,
        seq: step * 10,
        turn_index,
        in_flight: if step == 0 {
            vec![]
        } else {
            vec![InFlight {
                call_id: format!("call-{step}"),
                tool: "search".to_owned(),
            }]
        },
        inbox_consumed_seq: consumed,
        remaining_ms: 600_000 - step as i64 * 1000,
        turn: step,
        iteration: step,
    }
}

/// A durable step's writes: one assistant turn at `idx`, `events`, `state`, and step `step`'s record.
fn step_write(step: u64, idx: u64, events: Vec<Value>, state: Map<String, Value>) -> StepWrite {
    StepWrite {
        first_idx: idx,
        turns: vec![turn("assistant", &[&format!("turn {idx}")])],
        record: step_record(step, idx + 1, None),
        events,
        state,
    }
}

/// `write_step` lands its turns, events, state and step record together; an event it refuses answers
/// before the step record, which is then not written (what came before it is: the caller's unit
/// decides); a turn it refuses answers before anything is written.
fn a_step_writes_turns_events_state_and_record_and_a_refusal_stops_before_the_record<S: Ledger>(
    s: &mut S,
) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let first = step_write(1, 0, vec![ev(3, "a"), ev(4, "b")], Map::new());
    assert_eq!(
        s.write_step(&RunId::from("run-a"), G1, &first).unwrap(),
        Ok(())
    );
    let second = step_write(2, 1, vec![ev(5, "c")], obj(json!({"binding": "w1"})));
    assert_eq!(
        s.write_step(&RunId::from("run-a"), G1, &second).unwrap(),
        Ok(())
    );
    assert_eq!(
        s.last_step(&RunId::from("run-a")).unwrap(),
        Some(second.record.clone())
    );
    assert_eq!(
        s.read_transcript(&RunId::from("run-a")).unwrap().turns,
        vec![first.turns[0].clone(), second.turns[0].clone()]
    );
    let events = live_events(s, "run-a").expect("live");
    assert!(seqs(&events).ends_with(&[3, 4, 5]), "{events:?}");
    assert_eq!(
        live_row(s, "run-a").state.get("binding"),
        Some(&json!("w1"))
    );

    // An unsequenced event: the turn and the good event land, the record does not.
    let mut bad = step_write(3, 2, vec![ev(6, "d"), json!({"type": "note"})], Map::new());
    assert_eq!(
        s.write_step(&RunId::from("run-a"), G1, &bad).unwrap(),
        Err(Refusal::EventWithoutSeq { index: 1 })
    );
    assert_eq!(
        s.last_step(&RunId::from("run-a")).unwrap(),
        Some(second.record.clone())
    );
    assert_eq!(
        s.read_transcript(&RunId::from("run-a"))
            .unwrap()
            .turns
            .len(),
        3
    );
    assert!(seqs(&live_events(s, "run-a").unwrap()).ends_with(&[5, 6]));

    // A part too large: refused before anything is written.
    bad = step_write(3, 3, vec![ev(7, "e")], Map::new());
    bad.turns = vec![turn(
        "assistant",
        &[&"x".repeat(MAX_TRANSCRIPT_PART_BYTES + 1)],
    )];
    assert!(matches!(
        s.write_step(&RunId::from("run-a"), G1, &bad).unwrap(),
        Err(Refusal::PartTooLarge { idx: 3, .. })
    ));
    assert_eq!(
        s.read_transcript(&RunId::from("run-a"))
            .unwrap()
            .turns
            .len(),
        3
    );
    assert!(seqs(&live_events(s, "run-a").unwrap()).ends_with(&[5, 6]));
    assert_eq!(
        s.last_step(&RunId::from("run-a")).unwrap(),
        Some(second.record)
    );
}

fn turn(role: &str, texts: &[&str]) -> Turn {
    Turn {
        role: role.to_owned(),
        parts: texts
            .iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect(),
    }
}

fn record_json(
    id: &str,
    thread: &str,
    started_at: i64,
    finished_at: i64,
    status: &str,
    events: Vec<Value>,
) -> Value {
    let n = events.len();
    json!({
        "id": id, "agent": "demo", "model": "m1", "channelId": "C1", "userId": "U1", "threadKey": thread,
        "channelVisibility": "public", "startedAt": started_at, "finishedAt": finished_at,
        "status": status, "eventCount": n, "storedEventCount": n, "truncated": false,
        "events": events, "diagnosis": {"byCategory": {}}
    })
}

/// A final (non-provisional) record.
fn record(
    id: &str,
    thread: &str,
    started_at: i64,
    finished_at: i64,
    events: Vec<Value>,
) -> RunRecord {
    validate_record(&record_json(
        id,
        thread,
        started_at,
        finished_at,
        "completed",
        events,
    ))
    .expect("valid record")
}

/// The start tombstone: provisional `interrupted`, `finishedAt = startedAt`.
fn tombstone(id: &str, thread: &str, started_at: i64, events: Vec<Value>) -> RunRecord {
    let mut v = record_json(id, thread, started_at, started_at, "interrupted", events);
    v["provisional"] = json!(true);
    validate_record(&v).expect("valid tombstone")
}

fn all() -> ListQuery {
    ListQuery::visible_to(VisibilityFilter::All)
}

fn listed<S: Ledger>(s: &mut S, now: i64) -> Vec<RunId> {
    s.list(&all(), now)
        .expect("list")
        .items
        .into_iter()
        .map(|i| i.head.id)
        .collect()
}

fn live_ids<S: Ledger>(s: &mut S) -> BTreeSet<RunId> {
    s.list_live()
        .expect("list_live")
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

fn ids_of(rows: &[LiveRow]) -> BTreeSet<RunId> {
    rows.iter().map(|r| r.run_id.clone()).collect()
}

fn by_id(taken: Vec<Reclaimed>) -> BTreeMap<RunId, Reclaimed> {
    let n = taken.len();
    let map: BTreeMap<RunId, Reclaimed> = taken
        .into_iter()
        .map(|t| (t.row.run_id.clone(), t))
        .collect();
    assert_eq!(map.len(), n, "a reclaim answers each taken row once");
    map
}

fn inbox_seqs(items: &[InboxItem]) -> Vec<u64> {
    items.iter().map(|i| i.seq).collect()
}

fn set(ids: &[&str]) -> BTreeSet<RunId> {
    ids.iter().map(|s| RunId::from(*s)).collect()
}

fn gens(gens: &[&str]) -> BTreeSet<String> {
    gens.iter().map(|s| (*s).to_owned()).collect()
}

/// Everything observable about one run, to prove that a refused write changed nothing.
#[derive(Debug, PartialEq)]
struct Snapshot {
    row: Option<LiveRow>,
    events: Option<Vec<Value>>,
    transcript: Vec<Turn>,
    inbox: Outcome<Vec<InboxItem>>,
    record: Option<RunRecord>,
    live: BTreeSet<RunId>,
}

fn snapshot<S: Ledger>(s: &mut S, run: &str, now: i64) -> Snapshot {
    Snapshot {
        row: s.get_live(&RunId::from(run)).expect("get_live"),
        events: live_events(s, run),
        transcript: s
            .read_transcript(&RunId::from(run))
            .expect("read_transcript")
            .turns,
        inbox: s.read_inbox(&RunId::from(run), None).expect("read_inbox"),
        record: s.get(&RunId::from(run), now).expect("get"),
        live: live_ids(s),
    }
}

/// Try every owner write (SPEC §4.3: append, step, transcript write, set_state, heartbeat,
/// finishing, finish, abandon) as `gen`, the destructive ones last; answers each refusal by name.
fn every_owner_write<S: Ledger>(
    s: &mut S,
    run: &str,
    gen: &str,
    now: i64,
) -> Vec<(&'static str, Outcome<()>)> {
    let zombie_record = record(run, "C9:zombie", NOW, now, vec![ev(1, "zombie final")]);
    vec![
        (
            "append",
            s.append(&RunId::from(run), gen, &[ev(900, "zombie")])
                .expect("append"),
        ),
        (
            "step",
            s.step(&RunId::from(run), gen, &step_record(9, 99, Some(99)))
                .expect("step"),
        ),
        (
            "write_transcript",
            s.write_transcript(&RunId::from(run), gen, 40, &[turn("user", &["zombie"])])
                .expect("write_transcript"),
        ),
        (
            "write_step",
            s.write_step(
                &RunId::from(run),
                gen,
                &step_write(9, 41, vec![ev(901, "zombie")], Map::new()),
            )
            .expect("write_step"),
        ),
        (
            "write_step with state",
            s.write_step(
                &RunId::from(run),
                gen,
                &step_write(9, 42, vec![], obj(json!({"zombie": true}))),
            )
            .expect("write_step"),
        ),
        (
            "set_state",
            s.set_state(&RunId::from(run), gen, &obj(json!({"zombie": true})))
                .expect("set_state"),
        ),
        (
            "heartbeat",
            s.heartbeat(&RunId::from(run), gen, LEASE, now)
                .expect("heartbeat")
                .map(|_| ()),
        ),
        (
            "finishing",
            s.finishing(&RunId::from(run), gen, RunStatus::Completed, Some("zombie"))
                .expect("finishing"),
        ),
        (
            "finish",
            s.finish(&RunId::from(run), gen, &zombie_record, None, now)
                .expect("finish")
                .map(|_| ()),
        ),
        (
            "abandon",
            s.abandon(&RunId::from(run), gen).expect("abandon"),
        ),
    ]
}

fn assert_all_refused(results: Vec<(&'static str, Outcome<()>)>, expected: &Refusal, who: &str) {
    for (name, got) in results {
        assert_eq!(got, Err(expected.clone()), "{name} {who}");
    }
}

/// Give a live run some content of every kind: events, transcript, state, a step record and an inbox
/// item.
fn furnish<S: Ledger>(s: &mut S, run: &str, gen: &str) {
    assert_eq!(
        s.append(&RunId::from(run), gen, &[ev(1, "one"), ev(2, "two")])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.write_transcript(
            &RunId::from(run),
            gen,
            0,
            &[turn("system", &["sys"]), turn("user", &["hi"])]
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.set_state(
            &RunId::from(run),
            gen,
            &obj(json!({"binding": {"backend": "local"}}))
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from(run), gen, &step_record(0, 2, None))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.push_inbox(&RunId::from(run), &json!({"text": "follow-up"}))
            .unwrap(),
        Ok(1)
    );
}

// ---------------------------------------------------------------------------------------------
// Admission
// ---------------------------------------------------------------------------------------------

fn admit_on_a_free_thread_reserves_an_attaching_row_and_a_second_admit_steers_into_its_inbox<
    S: Ledger,
>(
    s: &mut S,
) {
    // A free thread: the pre-minted id gets an `attaching` row owned by the admitting generation.
    let first = admission("C1:t1", G1, &RunId::from("run-a"), "hello");
    assert_eq!(s.admit(&first, NOW).unwrap(), started("run-a"));
    let row = live_row(s, "run-a");
    assert_eq!(row.run_id, "run-a");
    assert_eq!(row.thread_key, "C1:t1");
    assert_eq!(row.phase, Phase::Attaching);
    assert_eq!(row.owner_gen, G1);
    assert_eq!(
        row.lease_until,
        NOW + LEASE,
        "admit sets lease_until = now + lease_ms"
    );
    assert_eq!(row.started_at, NOW);
    assert_eq!(row.stop, None);
    assert_eq!(
        row.meta, first.meta,
        "meta (with meta.request) is kept verbatim"
    );
    assert_eq!(row.meta["request"], first.request);
    assert_eq!(row.system_text, "", "no prompt while attaching");
    assert_eq!(row.tools, Value::Null, "no tools while attaching");
    assert!(row.state.is_empty(), "no state yet: {:?}", row.state);

    // A second message on the thread, with another pre-minted id, steers into the live run's inbox.
    let second = admission("C1:t1", G2, &RunId::from("run-b"), "and also");
    assert_eq!(s.admit(&second, NOW + 10).unwrap(), steered("run-a", 1));
    let third = admission("C1:t1", G1, &RunId::from("run-c"), "one more");
    assert_eq!(s.admit(&third, NOW + 20).unwrap(), steered("run-a", 2));
    assert_eq!(
        s.get_live(&RunId::from("run-b")).unwrap(),
        None,
        "a steered message reserves nothing"
    );
    assert_eq!(s.get_live(&RunId::from("run-c")).unwrap(), None);

    // The steered messages are readable, in order, as the live run's inbox.
    let inbox = s
        .read_inbox(&RunId::from("run-a"), None)
        .unwrap()
        .expect("inbox of a live run");
    assert_eq!(inbox_seqs(&inbox), [1, 2]);
    assert_eq!(inbox[0].message, second.request);
    assert_eq!(inbox[1].message, third.request);

    // Steering touched nothing on the row.
    assert_eq!(live_row(s, "run-a"), row);
}

fn one_live_row_per_thread_whatever_the_number_of_admissions<S: Ledger>(s: &mut S) {
    for (i, run) in ["run-a", "run-b", "run-c", "run-d"].iter().enumerate() {
        let out = s
            .admit(
                &admission("C1:t1", G1, &RunId::from(*run), "msg"),
                NOW + i as i64,
            )
            .unwrap();
        if i == 0 {
            assert_eq!(out, started("run-a"));
        } else {
            assert_eq!(
                out,
                steered("run-a", i as u64),
                "admission {i} steers into the holder"
            );
        }
    }
    // Another generation admitting on the same thread is steered too: the thread is the unit.
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("run-e"), "msg"),
            NOW + 10
        )
        .unwrap(),
        steered("run-a", 4)
    );
    // Another thread is independent.
    assert_eq!(
        s.admit(
            &admission("C1:t2", G2, &RunId::from("run-f"), "msg"),
            NOW + 11
        )
        .unwrap(),
        started("run-f")
    );

    let rows = s.list_live().unwrap();
    let on_t1: Vec<&LiveRow> = rows.iter().filter(|r| r.thread_key == "C1:t1").collect();
    assert_eq!(
        on_t1.len(),
        1,
        "exactly one live row on the thread: {rows:?}"
    );
    assert_eq!(on_t1[0].run_id, "run-a");
    assert_eq!(ids_of(&rows), set(&["run-a", "run-f"]));

    // Promoting does not change that: a later admit still steers into the same run.
    promote(s, "run-a", G1, NOW + 20);
    assert_eq!(
        s.admit(
            &admission("C1:t1", G1, &RunId::from("run-g"), "msg"),
            NOW + 30
        )
        .unwrap(),
        steered("run-a", 5)
    );
    assert_eq!(live_ids(s), set(&["run-a", "run-f"]));
}

fn a_keyed_admit_retried_returns_the_stored_answer_and_appends_once<S: Ledger>(s: &mut S) {
    // A keyed admission that started a run: the retry (which carries a freshly minted id, as a new
    // attempt would) gets the original answer verbatim and reserves nothing.
    let a = keyed(
        admission("C1:t1", G1, &RunId::from("run-a"), "hello"),
        "tok",
        "k-start",
        "hash-1",
    );
    assert_eq!(s.admit(&a, NOW).unwrap(), started("run-a"));
    let retry = keyed(
        admission("C1:t1", G1, &RunId::from("run-a2"), "hello"),
        "tok",
        "k-start",
        "hash-1",
    );
    assert_eq!(
        s.admit(&retry, NOW + 5).unwrap(),
        started("run-a"),
        "the receipt answers first"
    );
    assert_eq!(s.get_live(&RunId::from("run-a2")).unwrap(), None);
    assert_eq!(live_ids(s), set(&["run-a"]));
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), None).unwrap(),
        Ok(vec![]),
        "a receipt hit steers nothing"
    );

    // A keyed admission that steered: the retry answers the same seq and the inbox holds it once.
    let b = keyed(
        admission("C1:t1", G2, &RunId::from("run-b"), "more"),
        "tok",
        "k-steer",
        "hash-2",
    );
    assert_eq!(s.admit(&b, NOW + 10).unwrap(), steered("run-a", 1));
    let b_retry = keyed(
        admission("C1:t1", G2, &RunId::from("run-b2"), "more"),
        "tok",
        "k-steer",
        "hash-2",
    );
    assert_eq!(s.admit(&b_retry, NOW + 20).unwrap(), steered("run-a", 1));
    assert_eq!(s.admit(&b_retry, NOW + 30).unwrap(), steered("run-a", 1));
    let inbox = s.read_inbox(&RunId::from("run-a"), None).unwrap().unwrap();
    assert_eq!(inbox_seqs(&inbox), [1], "appended once");
    assert_eq!(inbox[0].message, b.request);

    // An unkeyed message afterwards takes the next seq.
    assert_eq!(
        s.admit(
            &admission("C1:t1", G1, &RunId::from("run-c"), "x"),
            NOW + 40
        )
        .unwrap(),
        steered("run-a", 2)
    );

    // Receipts survive the run's end: after finish the same keyed message still answers as before,
    // and starts nothing on the now free thread.
    promote(s, "run-a", G1, NOW + 50);
    let fin = s.finish(
        &RunId::from("run-a"),
        G1,
        &record("run-a", "C1:t1", NOW, NOW + 60, vec![ev(1, "done")]),
        None,
        NOW + 60,
    );
    assert!(fin.unwrap().is_ok());
    assert_eq!(
        s.admit(&retry, NOW + 70).unwrap(),
        started("run-a"),
        "receipt outlives the run"
    );
    assert_eq!(s.admit(&b_retry, NOW + 70).unwrap(), steered("run-a", 1));
    assert!(
        live_ids(s).is_empty(),
        "a receipt hit after the run ended starts nothing"
    );
}

fn the_same_key_with_another_body_is_a_key_conflict_and_keys_are_scoped<S: Ledger>(s: &mut S) {
    let a = keyed(
        admission("C1:t1", G1, &RunId::from("run-a"), "hello"),
        "tok",
        "k1",
        "hash-1",
    );
    assert_eq!(s.admit(&a, NOW).unwrap(), started("run-a"));
    // Same scope and key, another body: a conflict, and nothing happens.
    let other = keyed(
        admission("C1:t1", G1, &RunId::from("run-b"), "bye"),
        "tok",
        "k1",
        "hash-other",
    );
    assert_eq!(s.admit(&other, NOW + 1).unwrap(), AdmitOutcome::KeyConflict);
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), None).unwrap(),
        Ok(vec![]),
        "a conflict is not steered"
    );
    assert_eq!(s.get_live(&RunId::from("run-b")).unwrap(), None);
    // The conflict stored nothing: the original retry still answers the original.
    assert_eq!(s.admit(&a, NOW + 2).unwrap(), started("run-a"));
    // On another thread, too, the key is already taken (keys are scoped to the caller, not the thread).
    let elsewhere = keyed(
        admission("C1:t2", G1, &RunId::from("run-c"), "bye"),
        "tok",
        "k1",
        "hash-other",
    );
    assert_eq!(
        s.admit(&elsewhere, NOW + 3).unwrap(),
        AdmitOutcome::KeyConflict
    );
    assert_eq!(s.get_live(&RunId::from("run-c")).unwrap(), None);

    // The same key under another caller's scope is a different key: it is admitted (here: steered).
    let other_scope = keyed(
        admission("C1:t1", G1, &RunId::from("run-d"), "hello"),
        "other-token",
        "k1",
        "hash-1",
    );
    assert_eq!(s.admit(&other_scope, NOW + 4).unwrap(), steered("run-a", 1));
}

fn a_keyed_admit_to_a_finishing_run_is_busy_and_an_unkeyed_one_is_steered<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("done")
        )
        .unwrap(),
        Ok(())
    );

    // Keyed: the message would never be read by a finishing run, so the sender is told to come back.
    let k = keyed(
        admission("C1:t1", G2, &RunId::from("run-b"), "next"),
        "tok",
        "k-busy",
        "hash-b",
    );
    assert_eq!(
        s.admit(&k, NOW + 10).unwrap(),
        AdmitOutcome::Busy {
            run_id: RunId::from("run-a")
        }
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), None).unwrap(),
        Ok(vec![]),
        "Busy appends nothing"
    );
    assert_eq!(s.get_live(&RunId::from("run-b")).unwrap(), None);

    // Unkeyed: it lands in the durable inbox (finish keeps it).
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("run-c"), "late"),
            NOW + 20
        )
        .unwrap(),
        steered("run-a", 1)
    );

    // Busy is not a receipt: once the thread is free, the same keyed message starts a run.
    let fin = s
        .finish(
            &RunId::from("run-a"),
            G1,
            &record("run-a", "C1:t1", NOW, NOW + 30, vec![]),
            None,
            NOW + 30,
        )
        .unwrap();
    assert!(fin.is_ok());
    let k_again = keyed(
        admission("C1:t1", G2, &RunId::from("run-d"), "next"),
        "tok",
        "k-busy",
        "hash-b",
    );
    assert_eq!(s.admit(&k_again, NOW + 40).unwrap(), started("run-d"));
    assert_eq!(live_row(s, "run-d").phase, Phase::Attaching);
}

fn a_message_from_a_writer_who_may_not_see_the_live_run_is_forbidden_and_writes_nothing<
    S: Ledger,
>(
    s: &mut S,
) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let machines: VisibilityFilter =
        serde_json::from_value(json!({"kind": "visibility-in", "values": ["machine"]})).unwrap();
    let mut from_machines = keyed(
        admission("C1:t1", G2, &RunId::from("run-b"), "hijack"),
        "tok",
        "k-forbidden",
        "hash-f",
    );
    from_machines.writer = Some(machines);
    assert_eq!(
        s.admit(&from_machines, NOW + 10).unwrap(),
        AdmitOutcome::Forbidden
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), None).unwrap(),
        Ok(vec![]),
        "nothing appended"
    );
    assert_eq!(
        s.get_live(&RunId::from("run-b")).unwrap(),
        None,
        "nothing reserved"
    );
    // No receipt: the same key from a writer who may see the run steers.
    let mut from_all = keyed(
        admission("C1:t1", G2, &RunId::from("run-c"), "hijack"),
        "tok",
        "k-forbidden",
        "hash-f",
    );
    from_all.writer = Some(VisibilityFilter::All);
    assert_eq!(s.admit(&from_all, NOW + 20).unwrap(), steered("run-a", 1));
    // A free thread starts a run whatever the writer's filter.
    let mut idle = admission("C1:t2", G2, &RunId::from("run-d"), "fresh");
    idle.writer = Some(VisibilityFilter::None);
    assert_eq!(s.admit(&idle, NOW + 30).unwrap(), started("run-d"));
}

// ---------------------------------------------------------------------------------------------
// Claim (promotion)
// ---------------------------------------------------------------------------------------------

fn claim_promotes_the_owners_reservation_and_keeps_identity_start_and_meta<S: Ledger>(s: &mut S) {
    start(s, "run-a", "C1:t1", G1, NOW);
    // State assigned while attaching (the workspace binding) survives the promotion's merge.
    assert_eq!(
        s.set_state(
            &RunId::from("run-a"),
            G1,
            &obj(json!({"binding": {"backend": "local"}}))
        )
        .unwrap(),
        Ok(())
    );
    let reserved = live_row(s, "run-a");

    let later = NOW + 5_000;
    let p = Promotion {
        lease_ms: 45_000,
        ..promotion(LEASE)
    };
    assert_eq!(
        s.claim(&RunId::from("run-a"), G1, &p, later).unwrap(),
        Ok(Claimed::Promoted)
    );
    let row = live_row(s, "run-a");
    assert_eq!(row.phase, Phase::Live);
    assert_eq!(row.system_text, p.system_text);
    assert_eq!(row.tools, p.tools);
    assert_eq!(
        row.state.get("seeded"),
        Some(&json!(true)),
        "the promotion's state lands"
    );
    assert_eq!(
        row.state.get("binding"),
        Some(&json!({"backend": "local"})),
        "state set while attaching survives"
    );
    assert_eq!(
        row.lease_until,
        later + 45_000,
        "claim renews the lease on the writer's clock"
    );
    // Identity and start are untouched.
    assert_eq!(row.run_id, reserved.run_id);
    assert_eq!(row.thread_key, reserved.thread_key);
    assert_eq!(row.owner_gen, G1);
    assert_eq!(
        row.started_at, NOW,
        "started_at is the admission's, not the promotion's"
    );
    assert_eq!(row.meta, reserved.meta);
    assert_eq!(row.stop, None);
    assert_eq!(
        live_ids(s),
        set(&["run-a"]),
        "promoted in place, never a second row"
    );
}

fn re_claim_by_the_owner_is_idempotent_and_changes_nothing<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let before = live_row(s, "run-a");
    // A retried promotion (other content, later clock): AlreadyLive, nothing written.
    let other = Promotion {
        system_text: "a different prompt".to_owned(),
        tools: json!([]),
        state: obj(json!({"seeded": false, "extra": 1})),
        lease_ms: 99_000,
    };
    assert_eq!(
        s.claim(&RunId::from("run-a"), G1, &other, NOW + 1_000)
            .unwrap(),
        Ok(Claimed::AlreadyLive)
    );
    assert_eq!(live_row(s, "run-a"), before, "re-claim changes nothing");
    assert_eq!(
        s.claim(&RunId::from("run-a"), G1, &promotion(LEASE), NOW + 2_000)
            .unwrap(),
        Ok(Claimed::AlreadyLive)
    );
    assert_eq!(live_row(s, "run-a"), before);
    assert_eq!(live_ids(s), set(&["run-a"]));
}

fn claim_by_another_generation_is_fenced_and_of_an_unknown_run_is_unknown_run<S: Ledger>(
    s: &mut S,
) {
    start(s, "run-a", "C1:t1", G1, NOW);
    let reserved = live_row(s, "run-a");
    // Same run, other owner: fenced, whether the row is still attaching…
    assert_eq!(
        s.claim(&RunId::from("run-a"), G2, &promotion(LEASE), NOW + 1)
            .unwrap(),
        Err(fenced("run-a"))
    );
    assert_eq!(
        live_row(s, "run-a"),
        reserved,
        "a fenced claim writes nothing"
    );
    // …or already live.
    promote(s, "run-a", G1, NOW + 2);
    let promoted = live_row(s, "run-a");
    assert_eq!(
        s.claim(&RunId::from("run-a"), G2, &promotion(LEASE), NOW + 3)
            .unwrap(),
        Err(fenced("run-a"))
    );
    assert_eq!(live_row(s, "run-a"), promoted);

    // No row at all: claim only promotes a reservation that admit made.
    assert_eq!(
        s.claim(&RunId::from("ghost"), G1, &promotion(LEASE), NOW)
            .unwrap(),
        Err(unknown("ghost"))
    );
    assert_eq!(s.get_live(&RunId::from("ghost")).unwrap(), None);

    // A run whose admission was steered into another run has no row either; its claim cannot take
    // the thread (ThreadLive is only reachable through claim when the thread's row is another run,
    // which admit prevents by steering): it is refused and the thread keeps one row.
    assert_eq!(
        s.admit(&admission("C1:t1", G2, &RunId::from("run-b"), "x"), NOW + 4)
            .unwrap(),
        steered("run-a", 1)
    );
    let refused = s
        .claim(&RunId::from("run-b"), G2, &promotion(LEASE), NOW + 5)
        .unwrap();
    assert!(
        matches!(
            &refused,
            Err(Refusal::UnknownRun { run_id }) if run_id == "run-b"
        ) || matches!(
            &refused,
            Err(Refusal::ThreadLive { run_id, agent, started_at }) if run_id == "run-a" && agent.as_deref() == Some("demo") && *started_at == NOW
        ),
        "claim of a run without a row: {refused:?}"
    );
    assert_eq!(live_ids(s), set(&["run-a"]));
    assert_eq!(live_row(s, "run-a"), promoted);
}

// ---------------------------------------------------------------------------------------------
// Fencing and lease
// ---------------------------------------------------------------------------------------------

fn every_owner_write_from_another_generation_is_fenced_and_changes_nothing<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    furnish(s, "run-a", G1);
    let before = snapshot(s, "run-a", NOW + 1_000);

    let results = every_owner_write(s, "run-a", G2, NOW + 1_000);
    assert_all_refused(results, &fenced("run-a"), "from another generation");
    assert_eq!(
        snapshot(s, "run-a", NOW + 1_000),
        before,
        "the refused writes changed nothing"
    );

    // The refused step did not land: a reclaim answers only the owner's.
    let ans = s
        .reclaim(G3, NOW + 1_000, LEASE, &[G1.to_owned()], &[])
        .unwrap();
    let taken = by_id(ans.taken);
    let t = taken
        .get("run-a")
        .expect("run-a is taken from its dead owner");
    assert_eq!(t.last_step, Some(step_record(0, 2, None)));
    assert_eq!(t.row.state.get("zombie"), None);
    assert_eq!(t.row.state.get("finalStatus"), None);
}

fn every_owner_write_on_a_run_without_a_row_is_unknown_run_and_writes_nothing<S: Ledger>(
    s: &mut S,
) {
    // A live run elsewhere, to show the refused writes touch nothing of it either.
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let other = snapshot(s, "run-a", NOW);

    let results = every_owner_write(s, "ghost", G1, NOW);
    assert_all_refused(results, &unknown("ghost"), "on a run without a row");
    // The refused finish wrote no record (the caller's fallback put is its own business).
    assert_eq!(s.get(&RunId::from("ghost"), NOW).unwrap(), None);
    assert_eq!(s.get_live(&RunId::from("ghost")).unwrap(), None);
    assert_eq!(live_events(s, "ghost"), None);
    assert!(s
        .read_transcript(&RunId::from("ghost"))
        .unwrap()
        .turns
        .is_empty());
    assert_eq!(listed(s, NOW), Vec::<String>::new());
    assert_eq!(snapshot(s, "run-a", NOW), other);

    // A run whose row is gone (abandoned) answers the same.
    assert_eq!(s.abandon(&RunId::from("run-a"), G1).unwrap(), Ok(()));
    let results = every_owner_write(s, "run-a", G1, NOW + 1);
    assert_all_refused(results, &unknown("run-a"), "after the row is gone");
    assert_eq!(s.get(&RunId::from("run-a"), NOW + 1).unwrap(), None);
    assert!(live_ids(s).is_empty());
}

fn an_expired_lease_alone_never_fences_the_owner<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    // Long after lease_until (a heartbeat blip), nobody reclaimed: every owner write still lands.
    let late = NOW + 10 * LEASE;
    assert!(live_row(s, "run-a").lease_until < late);
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(1, "late")])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 0, &[turn("system", &["sys"])])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(0, 1, None))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.set_state(&RunId::from("run-a"), G1, &obj(json!({"k": 1})))
            .unwrap(),
        Ok(())
    );
    // The heartbeat refreshes the row.
    let hb = s
        .heartbeat(&RunId::from("run-a"), G1, LEASE, late)
        .unwrap()
        .expect("owner heartbeat after expiry");
    assert_eq!(hb.phase, Phase::Live);
    let row = live_row(s, "run-a");
    assert_eq!(row.lease_until, late + LEASE);
    assert_eq!(row.owner_gen, G1);
    assert_eq!(live_events(s, "run-a").map(|e| seqs(&e)), Some(vec![1]));
    // So a reclaim right after finds the lease current again.
    let ans = s.reclaim(G2, late + 1, LEASE, &[], &[]).unwrap();
    assert!(ans.taken.is_empty(), "{:?}", ans.taken);
    assert_eq!(ids_of(&ans.live_elsewhere), set(&["run-a"]));
    // And the owner can still finish.
    assert_eq!(
        s.finishing(&RunId::from("run-a"), G1, RunStatus::Completed, Some("ok"))
            .unwrap(),
        Ok(())
    );
    let fin = s.finish(
        &RunId::from("run-a"),
        G1,
        &record("run-a", "C1:t1", NOW, late + 2, vec![ev(1, "late")]),
        None,
        late + 2,
    );
    assert!(fin.unwrap().is_ok());
}

// ---------------------------------------------------------------------------------------------
// Events, steps, transcript, state
// ---------------------------------------------------------------------------------------------

fn append_is_keyed_by_seq_and_an_identical_retry_is_a_no_op<S: Ledger>(s: &mut S) {
    // The flusher appends from admission on, before the promotion.
    start(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.append(
            &RunId::from("run-a"),
            G1,
            &[ev(1, "one"), ev(2, "two"), ev(3, "three")]
        )
        .unwrap(),
        Ok(())
    );
    promote(s, "run-a", G1, NOW + 1);
    // An identical retry of part of a batch is a no-op.
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(2, "two"), ev(3, "three")])
            .unwrap(),
        Ok(())
    );
    // Out-of-order batches read back in seq order.
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(5, "five"), ev(4, "four")])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[]).unwrap(),
        Ok(()),
        "an empty batch is fine"
    );

    let events = live_events(s, "run-a").expect("a live run has live events");
    assert_eq!(seqs(&events), [1, 2, 3, 4, 5], "each seq once, in order");
    assert_eq!(
        events,
        vec![
            ev(1, "one"),
            ev(2, "two"),
            ev(3, "three"),
            ev(4, "four"),
            ev(5, "five")
        ]
    );
    // Strictly after the cursor, at most `limit`.
    let page = s.live_events(&RunId::from("run-a"), 2, 2).unwrap().unwrap();
    assert_eq!(seqs(&page), [3, 4]);
    assert_eq!(
        s.live_events(&RunId::from("run-a"), 5, 100).unwrap(),
        Some(vec![])
    );
    // Unknown run: no live events at all.
    assert_eq!(s.live_events(&RunId::from("ghost"), 0, 100).unwrap(), None);
}

fn an_oversized_or_unsequenced_event_is_refused_alone<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(1, "one")])
            .unwrap(),
        Ok(())
    );

    // One event over 64 KiB is refused alone, naming its seq; its neighbours land.
    let big = ev(3, &"x".repeat(70_000));
    let out = s
        .append(
            &RunId::from("run-a"),
            G1,
            &[ev(2, "two"), big, ev(4, "four")],
        )
        .unwrap();
    assert!(
        matches!(out, Err(Refusal::EventTooLarge { seq: 3, bytes }) if bytes > 65_536),
        "{out:?}"
    );
    assert_eq!(
        live_events(s, "run-a").map(|e| seqs(&e)),
        Some(vec![1, 2, 4])
    );

    // Just under the limit is fine.
    let fits = ev(5, &"y".repeat(60_000));
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, std::slice::from_ref(&fits))
            .unwrap(),
        Ok(())
    );
    assert_eq!(live_events(s, "run-a").unwrap()[3], fits);

    // An event without a numeric seq is refused alone, naming its position.
    let out = s
        .append(
            &RunId::from("run-a"),
            G1,
            &[
                ev(6, "six"),
                json!({"type": "note", "at": NOW, "summary": "no seq"}),
            ],
        )
        .unwrap();
    assert_eq!(out, Err(Refusal::EventWithoutSeq { index: 1 }));
    let out = s
        .append(
            &RunId::from("run-a"),
            G1,
            &[json!({"type": "note", "seq": "7", "summary": "string seq"})],
        )
        .unwrap();
    assert_eq!(out, Err(Refusal::EventWithoutSeq { index: 0 }));
    assert_eq!(
        live_events(s, "run-a").map(|e| seqs(&e)),
        Some(vec![1, 2, 4, 5, 6]),
        "only the refused events are missing"
    );
}

fn step_records_are_keyed_by_step_and_reclaim_answers_the_highest<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(0, 2, None))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(1, 4, None))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(2, 6, None))
            .unwrap(),
        Ok(())
    );
    // A retry of step 2 with new content replaces it; a late retry of step 1 does not make it the last.
    let mut step2 = step_record(2, 6, Some(1));
    step2.remaining_ms = 12_345;
    step2.in_flight.push(InFlight {
        call_id: "call-2b".to_owned(),
        tool: "write_file".to_owned(),
    });
    assert_eq!(s.step(&RunId::from("run-a"), G1, &step2).unwrap(), Ok(()));
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(1, 4, Some(0)))
            .unwrap(),
        Ok(())
    );

    let ans = s.reclaim(G2, NOW, LEASE, &[G1.to_owned()], &[]).unwrap();
    let taken = by_id(ans.taken);
    assert_eq!(
        taken["run-a"].last_step,
        Some(step2),
        "the highest step, as last written"
    );

    // A run without step records answers none.
    go_live(s, "run-b", "C1:t2", G1, NOW);
    let ans = s.reclaim(G2, NOW, LEASE, &[G1.to_owned()], &[]).unwrap();
    let taken = by_id(ans.taken);
    assert_eq!(taken["run-b"].last_step, None);
}

/// A finish's successor reads the live row, its highest step record and its whole inbox in seq order
/// (the consumed ones too: the caller decides what is waiting); a run not live has none.
fn successor_facts_read_the_row_the_highest_step_and_the_inbox_in_order<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let facts = s
        .successor_facts(&RunId::from("run-a"))
        .unwrap()
        .expect("live");
    assert_eq!(
        (facts.row, facts.last_step, facts.inbox.len()),
        (live_row(s, "run-a"), None, 0)
    );
    for text in ["m1", "m2", "m3"] {
        assert!(s
            .push_inbox(&RunId::from("run-a"), &json!({ "text": text }))
            .unwrap()
            .is_ok());
    }
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(0, 2, None))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(1, 4, Some(1)))
            .unwrap(),
        Ok(())
    );
    let facts = s
        .successor_facts(&RunId::from("run-a"))
        .unwrap()
        .expect("live");
    assert_eq!(facts.last_step, Some(step_record(1, 4, Some(1))));
    assert_eq!(inbox_seqs(&facts.inbox), vec![1, 2, 3]);
    assert_eq!(facts.inbox[2].message, json!({"text": "m3"}));
    assert_eq!(facts, {
        let row = live_row(s, "run-a");
        storage::ledger::SuccessorFacts {
            row,
            last_step: s.last_step(&RunId::from("run-a")).unwrap(),
            inbox: s.inbox_after(&RunId::from("run-a"), None).unwrap(),
        }
    });
    assert_eq!(s.successor_facts(&RunId::from("run-none")).unwrap(), None);
}

/// A seal's gate (SPEC §5.2 steps 3 and 8) refuses as `finishing` does — another generation, no row, a
/// stop recorded before it, a kill — writing nothing; when it passes it answers the successor's
/// facts as `successor_facts` reads them. A finish after it, in a transaction of its own, stores the
/// record as it would without the gate (what a backend read ahead for it is the gate's transaction's).
fn a_seal_gate_refuses_as_finishing_does_and_answers_the_successor_facts<S: Ledger>(s: &mut S) {
    use storage::ledger::StopMode;
    let id = RunId::from("run-a");
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert!(s.push_inbox(&id, &json!({"text": "m1"})).unwrap().is_ok());
    let rec = record("run-a", "C1:t1", NOW, NOW + 5, vec![]);
    let gate = |s: &mut S, gen: &str, status| {
        s.seal_gate(gen, status, &rec, None, NOW + 5)
            .unwrap()
            .map(|_| ())
    };
    let completed = RunStatus::Completed;
    let by_other = gate(s, G2, completed);
    assert!(by_other.is_err(), "{by_other:?}");
    assert_eq!(by_other, s.finishing(&id, G2, completed, None).unwrap());
    let none = record("run-none", "C1:t9", NOW, NOW + 5, vec![]);
    assert_eq!(
        s.seal_gate(G1, completed, &none, None, NOW + 5)
            .unwrap()
            .map(|_| ()),
        Err(unknown("run-none"))
    );
    assert!(s.request_stop(&id, StopMode::Soft, NOW).unwrap().is_ok());
    let stopped = gate(s, G1, completed);
    assert!(
        matches!(stopped, Err(Refusal::StopPending { .. })),
        "{stopped:?}"
    );
    assert_eq!(stopped, s.finishing(&id, G1, completed, None).unwrap());
    let row = live_row(s, "run-a");
    let facts = s
        .seal_gate(G1, RunStatus::StoppedSoft, &rec, None, NOW + 5)
        .unwrap()
        .expect("the stop's own status passes");
    assert_eq!(Some(facts), s.successor_facts(&id).unwrap());
    assert_eq!(live_row(s, "run-a"), row, "the gate writes nothing");
    let put = s
        .finish(&id, G1, &rec, None, NOW + 5)
        .unwrap()
        .expect("finished");
    assert!(put.stored && !put.rewritten, "{put:?}");
    assert_eq!(s.get(&id, NOW + 5).unwrap().expect("stored").head, rec.head);

    go_live(s, "run-k", "C1:t2", G1, NOW);
    s.kill(&RunId::from("run-k"), NOW + 1).unwrap();
    let killed = record("run-k", "C1:t2", NOW, NOW + 5, vec![]);
    assert_eq!(
        s.seal_gate(G1, completed, &killed, None, NOW + 5)
            .unwrap()
            .map(|_| ()),
        Err(fenced("run-k"))
    );
}

/// Seed item 32: a transcript read stops at its first hole and names it; the turns before stay.
fn a_transcript_with_a_missing_turn_reads_back_to_the_gap_and_names_it<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let (t0, t1, t3) = (
        turn("system", &["sys"]),
        turn("user", &["hi"]),
        turn("assistant", &["late"]),
    );
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 0, &[t0.clone(), t1.clone()])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 3, &[t3])
            .unwrap(),
        Ok(())
    );
    let read = s.read_transcript(&RunId::from("run-a")).unwrap();
    assert_eq!(read.turns, vec![t0, t1]);
    assert_eq!(
        read.gap,
        Some(storage::ledger::TranscriptGap::Turn { idx: 2 })
    );
    assert_eq!(read.gap.unwrap().to_string(), "turn 2 is missing");
}

fn transcript_turns_read_back_in_order_and_are_never_edited<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let t0 = turn("system", &["You are demo."]);
    let t1 = turn("user", &["hello", "and a second part"]);
    let t2 = Turn {
        role: "assistant".to_owned(),
        parts: vec![
            json!({"type": "text", "text": "let me look"}),
            json!({"type": "tool_call", "callId": "c1", "tool": "search", "args": {"q": "rust"}}),
        ],
    };
    let t3 = Turn {
        role: "tool_results".to_owned(),
        parts: vec![json!({"type": "tool_result", "callId": "c1", "ok": true, "text": "found"})],
    };
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 0, &[t0.clone(), t1.clone()])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 2, std::slice::from_ref(&t2))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.read_transcript(&RunId::from("run-a")).unwrap().turns,
        vec![t0.clone(), t1.clone(), t2.clone()]
    );

    // An identical retry is a no-op.
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 0, &[t0.clone(), t1.clone()])
            .unwrap(),
        Ok(())
    );
    // A retry that overlaps an already written turn with other content never edits it; the new turn
    // after it lands.
    let t2_edited = Turn {
        role: "assistant".to_owned(),
        parts: vec![
            json!({"type": "text", "text": "EDITED"}),
            json!({"type": "text", "text": "EDITED too"}),
        ],
    };
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 2, &[t2_edited, t3.clone()])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.read_transcript(&RunId::from("run-a")).unwrap().turns,
        vec![t0, t1, t2, t3],
        "first write stands; one row per part, assembled in (idx, part) order"
    );
    // A run that wrote nothing reads back empty.
    go_live(s, "run-b", "C1:t2", G1, NOW);
    assert!(s
        .read_transcript(&RunId::from("run-b"))
        .unwrap()
        .turns
        .is_empty());
}

fn an_oversized_transcript_part_is_refused_by_name_and_nothing_of_the_batch_lands<S: Ledger>(
    s: &mut S,
) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let t0 = turn("system", &["sys"]);
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 0, std::slice::from_ref(&t0))
            .unwrap(),
        Ok(())
    );

    let huge = json!({"type": "text", "text": "z".repeat(MAX_TRANSCRIPT_PART_BYTES + 1)});
    let ok_turn = turn("user", &["fine"]);
    let bad_turn = Turn {
        role: "assistant".to_owned(),
        parts: vec![json!({"type": "text", "text": "ok"}), huge],
    };
    let out = s
        .write_transcript(&RunId::from("run-a"), G1, 1, &[ok_turn.clone(), bad_turn])
        .unwrap();
    assert!(
        matches!(out, Err(Refusal::PartTooLarge { idx: 2, part: 1, bytes }) if bytes > MAX_TRANSCRIPT_PART_BYTES),
        "refused by name (turn 2, part 1): {out:?}"
    );
    assert_eq!(
        s.read_transcript(&RunId::from("run-a")).unwrap().turns,
        vec![t0.clone()],
        "nothing of the refused batch"
    );

    // The batch without the oversized part lands afterwards at the same indexes.
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 1, std::slice::from_ref(&ok_turn))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.read_transcript(&RunId::from("run-a")).unwrap().turns,
        vec![t0, ok_turn]
    );
}

fn set_state_merges_by_top_level_key<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    // The promotion left {seeded: true}.
    assert_eq!(
        s.set_state(
            &RunId::from("run-a"),
            G1,
            &obj(json!({"binding": {"backend": "local", "workspace": "/w"}, "a": 1}))
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.set_state(
            &RunId::from("run-a"),
            G1,
            &obj(json!({"binding": {"backend": "docker"}, "b": [1, 2]}))
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.set_state(&RunId::from("run-a"), G1, &Map::new()).unwrap(),
        Ok(()),
        "an empty patch is fine"
    );
    let row = live_row(s, "run-a");
    assert_eq!(
        Value::Object(row.state),
        json!({"seeded": true, "a": 1, "binding": {"backend": "docker"}, "b": [1, 2]}),
        "top-level keys merge; a key's value is replaced whole"
    );
    assert_eq!(row.phase, Phase::Live);
}

// ---------------------------------------------------------------------------------------------
// Heartbeat and stop
// ---------------------------------------------------------------------------------------------

fn heartbeat_extends_only_the_owners_lease_and_relays_stop_and_phase<S: Ledger>(s: &mut S) {
    // The heartbeat runs from the reservation on.
    start(s, "run-a", "C1:t1", G1, NOW);
    let hb = s
        .heartbeat(&RunId::from("run-a"), G1, 45_000, NOW + 10_000)
        .unwrap()
        .expect("owner heartbeat");
    assert_eq!(hb.phase, Phase::Attaching);
    assert_eq!(hb.stop, None);
    assert_eq!(
        live_row(s, "run-a").lease_until,
        NOW + 10_000 + 45_000,
        "lease = now + lease_ms"
    );

    // Another generation's heartbeat is fenced and leaves the lease alone.
    assert_eq!(
        s.heartbeat(&RunId::from("run-a"), G2, 45_000, NOW + 20_000)
            .unwrap(),
        Err(fenced("run-a"))
    );
    assert_eq!(live_row(s, "run-a").lease_until, NOW + 55_000);

    promote(s, "run-a", G1, NOW + 20_000);
    // A stop requested by another process shows in the owner's next heartbeat, with the phase.
    s.request_stop(&RunId::from("run-a"), StopMode::Soft, NOW + 21_000)
        .unwrap()
        .expect("stop");
    let hb = s
        .heartbeat(&RunId::from("run-a"), G1, LEASE, NOW + 22_000)
        .unwrap()
        .unwrap();
    assert_eq!((hb.stop, hb.phase), (Some(StopMode::Soft), Phase::Live));
    s.request_stop(&RunId::from("run-a"), StopMode::Hard, NOW + 23_000)
        .unwrap()
        .expect("stop");
    let hb = s
        .heartbeat(&RunId::from("run-a"), G1, LEASE, NOW + 24_000)
        .unwrap()
        .unwrap();
    assert_eq!((hb.stop, hb.phase), (Some(StopMode::Hard), Phase::Live));

    assert_eq!(
        s.finishing(&RunId::from("run-a"), G1, RunStatus::StoppedHard, None)
            .unwrap(),
        Ok(())
    );
    let hb = s
        .heartbeat(&RunId::from("run-a"), G1, LEASE, NOW + 25_000)
        .unwrap()
        .unwrap();
    assert_eq!(
        (hb.stop, hb.phase),
        (Some(StopMode::Hard), Phase::Finishing)
    );
    assert_eq!(live_row(s, "run-a").lease_until, NOW + 25_000 + LEASE);
}

fn request_stop_is_not_fenced_keeps_the_strongest_mode_and_says_whether_the_owner_lease_is_live<
    S: Ledger,
>(
    s: &mut S,
) {
    go_live(s, "run-a", "C1:t1", G1, NOW); // lease_until = NOW + LEASE
    let before = live_row(s, "run-a");

    // Any process may ask (no generation is carried); while the lease is current the owner will relay it.
    let a = s
        .request_stop(&RunId::from("run-a"), StopMode::Soft, NOW + 1)
        .unwrap()
        .expect("stop on a live run");
    assert_eq!(a.stop, StopMode::Soft);
    assert_eq!(a.owner_gen, G1);
    assert!(a.owner_lease_live);
    assert_eq!(live_row(s, "run-a").stop, Some(StopMode::Soft));

    let a = s
        .request_stop(&RunId::from("run-a"), StopMode::Hard, NOW + 2)
        .unwrap()
        .unwrap();
    assert_eq!(a.stop, StopMode::Hard);
    // Hard never downgrades to soft.
    let a = s
        .request_stop(&RunId::from("run-a"), StopMode::Soft, NOW + 3)
        .unwrap()
        .unwrap();
    assert_eq!(
        a.stop,
        StopMode::Hard,
        "a later soft request answers the recorded hard stop"
    );
    let row = live_row(s, "run-a");
    assert_eq!(row.stop, Some(StopMode::Hard));
    // A stop changes nothing else: owner, lease, phase, state.
    assert_eq!(LiveRow { stop: None, ..row }, before);

    // At lease_until exactly the lease is expired (equal-now counts), and after it too.
    let a = s
        .request_stop(&RunId::from("run-a"), StopMode::Hard, NOW + LEASE)
        .unwrap()
        .unwrap();
    assert!(!a.owner_lease_live, "lease_until == now is expired");
    let a = s
        .request_stop(&RunId::from("run-a"), StopMode::Soft, NOW + LEASE + 1)
        .unwrap()
        .unwrap();
    assert!(!a.owner_lease_live);
    assert_eq!(a.stop, StopMode::Hard);
    assert_eq!(a.owner_gen, G1);
    let a = s
        .request_stop(&RunId::from("run-a"), StopMode::Hard, NOW + LEASE - 1)
        .unwrap()
        .unwrap();
    assert!(
        a.owner_lease_live,
        "one millisecond before the lease end it is still live"
    );

    // Works on an attaching reservation, too.
    start(s, "run-b", "C1:t2", G2, NOW);
    let a = s
        .request_stop(&RunId::from("run-b"), StopMode::Soft, NOW)
        .unwrap()
        .unwrap();
    assert_eq!(
        (a.stop, a.owner_gen.as_str(), a.owner_lease_live),
        (StopMode::Soft, G2, true)
    );

    // No live row: NotLive.
    assert_eq!(
        s.request_stop(&RunId::from("ghost"), StopMode::Hard, NOW)
            .unwrap(),
        Err(not_live("ghost"))
    );
}

// ---------------------------------------------------------------------------------------------
// Phases: handoff, finishing
// ---------------------------------------------------------------------------------------------

fn handoff_marks_only_this_generations_live_rows<S: Ledger>(s: &mut S) {
    go_live(s, "r-live", "C1:t1", G1, NOW);
    start(s, "r-attach", "C1:t2", G1, NOW);
    go_live(s, "r-fin", "C1:t3", G1, NOW);
    assert_eq!(
        s.finishing(
            &RunId::from("r-fin"),
            G1,
            RunStatus::Completed,
            Some("done")
        )
        .unwrap(),
        Ok(())
    );
    go_live(s, "r-other", "C1:t4", G2, NOW);
    let before: BTreeMap<RunId, LiveRow> = s
        .list_live()
        .unwrap()
        .into_iter()
        .map(|r| (r.run_id.clone(), r))
        .collect();

    let ids: Vec<RunId> = ["r-live", "r-attach", "r-fin", "r-other"]
        .iter()
        .map(|s| RunId::from(*s))
        .collect();
    let results: BTreeMap<RunId, HandoffResult> =
        s.handoff(G1, &ids).unwrap().into_iter().collect();
    assert_eq!(results.len(), 4, "one answer per id");
    assert_eq!(results["r-live"], HandoffResult::HandedOff);
    assert_eq!(
        results["r-attach"],
        HandoffResult::WrongPhase,
        "never attaching → handoff"
    );
    assert_eq!(
        results["r-fin"],
        HandoffResult::WrongPhase,
        "never finishing → handoff"
    );
    assert_eq!(
        results["r-other"],
        HandoffResult::NotOwner,
        "never another generation's run"
    );

    let row = live_row(s, "r-live");
    assert_eq!(row.phase, Phase::Handoff);
    assert_eq!(
        LiveRow {
            phase: Phase::Live,
            ..row
        },
        before["r-live"],
        "handoff changes only the phase"
    );
    for id in ["r-attach", "r-fin", "r-other"] {
        assert_eq!(live_row(s, id), before[id], "{id} untouched");
    }
    // A handed-off row is not live any more: a second handoff is refused.
    let again: BTreeMap<RunId, HandoffResult> =
        s.handoff(G1, &ids[..1]).unwrap().into_iter().collect();
    assert_eq!(again["r-live"], HandoffResult::WrongPhase);
    // The owner still heartbeats it and sees the phase.
    let hb = s
        .heartbeat(&RunId::from("r-live"), G1, LEASE, NOW + 1)
        .unwrap()
        .unwrap();
    assert_eq!(hb.phase, Phase::Handoff);
}

/// SPEC §5.1: a thread's queue holds at most `MAX_QUEUED_PER_THREAD` messages; the next one is refused
/// with nothing written, while a steer into the same run still lands.
fn a_full_queue_refuses_the_next_queued_message_and_writes_nothing<S: Ledger>(s: &mut S) {
    use storage::ledger::{Strategy, MAX_QUEUED_PER_THREAD};
    let enqueue = |run: &str, text: &str| Admit {
        strategy: Strategy::Enqueue,
        request: json!({"thread": "t1", "channel": "C1", "user": "U1", "text": text,
            "strategy": "enqueue"}),
        ..admission("C1:t1", G1, &RunId::from(run), text)
    };
    assert_eq!(
        s.admit(&enqueue("run-a", "first"), NOW).unwrap(),
        started("run-a")
    );
    promote(s, "run-a", G1, NOW);
    for i in 1..=MAX_QUEUED_PER_THREAD {
        assert_eq!(
            s.admit(&enqueue(&format!("q{i}"), "later"), NOW).unwrap(),
            AdmitOutcome::Queued {
                run_id: "run-a".into(),
                position: i
            }
        );
    }
    assert_eq!(
        s.admit(&enqueue("q-over", "one too many"), NOW).unwrap(),
        AdmitOutcome::QueueFull {
            run_id: "run-a".into()
        }
    );
    let inbox = s.inbox_after(&RunId::from("run-a"), None).unwrap();
    assert_eq!(inbox.len() as u64, MAX_QUEUED_PER_THREAD);
    assert_eq!(
        s.admit(&admission("C1:t1", G1, &RunId::from("x"), "steer"), NOW)
            .unwrap(),
        steered("run-a", MAX_QUEUED_PER_THREAD + 1)
    );
}

/// SPEC §5.1: what a message does on a busy thread, by strategy — and on an idle one, whatever it is.
fn a_busy_thread_steers_queues_rejects_or_interrupts_as_the_message_says<S: Ledger>(s: &mut S) {
    use storage::ledger::Strategy;
    let with = |strategy: Strategy, run: &str, text: &str| Admit {
        strategy,
        request: json!({"thread": "t1", "channel": "C1", "user": "U1", "text": text,
            "strategy": strategy.as_str()}),
        ..admission("C1:t1", G1, &RunId::from(run), text)
    };
    // An idle thread starts a run whatever the strategy.
    assert_eq!(
        s.admit(&with(Strategy::Reject, "run-a", "first"), NOW)
            .unwrap(),
        started("run-a")
    );
    promote(s, "run-a", G1, NOW);

    // reject: nothing written but a keyed message's receipt — the key's answer, so another attempt of
    // the same message (a retry, or an earlier one still in flight that commits later under another run
    // id) answers the refusal too and never lands.
    let rejected = keyed(with(Strategy::Reject, "x1", "no"), "tok", "k-reject", "h");
    let refusal = AdmitOutcome::Rejected {
        run_id: "run-a".into(),
    };
    assert_eq!(s.admit(&rejected, NOW).unwrap(), refusal);
    let late = keyed(with(Strategy::Reject, "x1b", "no"), "tok", "k-reject", "h");
    assert_eq!(s.admit(&late, NOW + 1).unwrap(), refusal);
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), None).unwrap(),
        Ok(vec![])
    );

    // enqueue: into the inbox, marked queued, with its place in the queue.
    let queued = |run: &str, position| AdmitOutcome::Queued {
        run_id: run.into(),
        position,
    };
    assert_eq!(
        s.admit(&with(Strategy::Enqueue, "x2", "q1"), NOW).unwrap(),
        queued("run-a", 1)
    );
    assert_eq!(
        s.admit(&with(Strategy::Steer, "x3", "s1"), NOW).unwrap(),
        steered("run-a", 2)
    );
    let keyed_enqueue = keyed(with(Strategy::Enqueue, "x4", "q2"), "tok", "k-q2", "h");
    assert_eq!(s.admit(&keyed_enqueue, NOW).unwrap(), queued("run-a", 2));
    assert_eq!(
        s.admit(&keyed_enqueue, NOW + 1).unwrap(),
        queued("run-a", 2),
        "a keyed retry answers the stored answer and queues nothing more"
    );
    let inbox = s.read_inbox(&RunId::from("run-a"), None).unwrap().unwrap();
    assert_eq!(
        inbox.iter().map(InboxItem::queued).collect::<Vec<_>>(),
        [true, false, true]
    );
    let steering: Vec<u64> = storage::ledger::steering(inbox)
        .iter()
        .map(|i| i.seq)
        .collect();
    assert_eq!(steering, [2], "a run folds only the steering messages");
    assert_eq!(live_row(s, "run-a").stop, None, "enqueue stops nothing");

    // interrupt: queued too, and a soft stop recorded in the same transaction.
    assert_eq!(
        s.admit(&with(Strategy::Interrupt, "x5", "now this"), NOW)
            .unwrap(),
        AdmitOutcome::Interrupting {
            run_id: "run-a".into(),
            position: 3
        }
    );
    assert_eq!(live_row(s, "run-a").stop, Some(StopMode::Soft));

    // Past its gate no stop reaches the run: an interrupt only queues.
    go_live(s, "run-b", "C1:t2", G1, NOW);
    assert_eq!(
        s.finishing(
            &RunId::from("run-b"),
            G1,
            RunStatus::Completed,
            Some("done")
        )
        .unwrap(),
        Ok(())
    );
    let late = Admit {
        thread_key: "C1:t2".into(),
        ..with(Strategy::Interrupt, "x6", "late")
    };
    assert_eq!(s.admit(&late, NOW).unwrap(), queued("run-b", 1));
    assert_eq!(live_row(s, "run-b").stop, None);
}

/// SPEC §13: a run parks on its approvals and resumes from them; a decision from any generation lands
/// once (the first wins), is never undone by the owner's later write of what it read before, and is
/// refused for a call the run does not await and once the run is past its gate.
fn approvals_park_decide_once_and_unpark<S: Ledger>(s: &mut S) {
    use storage::ledger::decisions::PhaseChange;
    use storage::ledger::{approvals_patch, Approval, Approvals, Decided, Decision};
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let pending = Approval {
        tool: "append_file".into(),
        requested_at: NOW,
        deadline: NOW + 1000,
        decided: None,
        released: false,
    };
    let asked: Approvals = [("call-1".to_owned(), pending.clone())].into();
    assert_eq!(
        s.set_phase(
            &RunId::from("run-a"),
            G1,
            PhaseChange::Park,
            &approvals_patch(&asked)
        )
        .unwrap(),
        Ok(Phase::AwaitingApproval)
    );
    assert_eq!(
        s.set_phase(&RunId::from("run-a"), G2, PhaseChange::Unpark, &Map::new())
            .unwrap(),
        Err(fenced("run-a")),
        "only the owner parks and unparks"
    );
    let yes = |who: &str| Decided {
        decision: Decision::Approve,
        who: who.into(),
        note: None,
        at: NOW + 5,
    };
    // Any generation may decide; the first decision wins.
    let answer = s
        .decide(&RunId::from("run-a"), "call-1", &yes("token:ops"), NOW + 5)
        .unwrap()
        .unwrap();
    assert_eq!(
        (answer.owner_gen.as_str(), answer.owner_lease_live),
        (G1, true)
    );
    let again = s
        .decide(
            &RunId::from("run-a"),
            "call-1",
            &Decided {
                decision: Decision::Deny,
                ..yes("timeout")
            },
            NOW + 6,
        )
        .unwrap();
    assert!(
        matches!(&again, Err(Refusal::AlreadyDecided { decided, .. }) if decided.who == "token:ops"),
        "{again:?}"
    );
    assert!(matches!(
        s.decide(&RunId::from("run-a"), "call-9", &yes("x"), NOW)
            .unwrap(),
        Err(Refusal::UnknownCall { .. })
    ));
    assert_eq!(
        s.decide(&RunId::from("no-run"), "call-1", &yes("x"), NOW)
            .unwrap(),
        Err(not_live("no-run"))
    );
    // The owner parks again with what it read before the decision: the decision stays.
    assert_eq!(
        s.set_phase(
            &RunId::from("run-a"),
            G1,
            PhaseChange::Park,
            &approvals_patch(&asked)
        )
        .unwrap(),
        Ok(Phase::AwaitingApproval)
    );
    let row = live_row(s, "run-a");
    assert_eq!(row.approvals()["call-1"].decided, Some(yes("token:ops")));
    let mut released = row.approvals();
    released.get_mut("call-1").unwrap().released = true;
    assert_eq!(
        s.set_phase(
            &RunId::from("run-a"),
            G1,
            PhaseChange::Unpark,
            &approvals_patch(&released)
        )
        .unwrap(),
        Ok(Phase::Live)
    );
    let row = live_row(s, "run-a");
    assert!(row.approvals()["call-1"].released);
    assert_eq!(row.phase, Phase::Live);
    // Past the gate, a decision is refused.
    s.set_phase(
        &RunId::from("run-a"),
        G1,
        PhaseChange::Park,
        &approvals_patch(&[("call-2".to_owned(), pending)].into()),
    )
    .unwrap()
    .unwrap();
    s.finishing(&RunId::from("run-a"), G1, RunStatus::StoppedSoft, None)
        .unwrap()
        .unwrap();
    assert!(matches!(
        s.decide(&RunId::from("run-a"), "call-2", &yes("x"), NOW)
            .unwrap(),
        Err(Refusal::WrongPhase {
            phase: Phase::Finishing,
            ..
        })
    ));
}

/// SPEC §5.1 / §5.6: a stop recorded before the finishing gate wins over a `completed` the run decided
/// without hearing of it; the gate commits nothing then, and any other status goes through.
fn a_stop_recorded_before_the_gate_refuses_a_completed_gate<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    s.request_stop(&RunId::from("run-a"), StopMode::Soft, NOW)
        .unwrap()
        .unwrap();
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("the answer")
        )
        .unwrap(),
        Err(Refusal::StopPending {
            run_id: "run-a".into(),
            mode: StopMode::Soft
        })
    );
    let row = live_row(s, "run-a");
    assert_eq!(
        (row.phase, row.gated()),
        (Phase::Live, false),
        "nothing committed"
    );
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::StoppedSoft,
            Some("the answer")
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        live_row(s, "run-a").final_status(),
        Some(RunStatus::StoppedSoft)
    );
    // A failure stands whatever stop is recorded.
    go_live(s, "run-b", "C1:t2", G1, NOW);
    s.request_stop(&RunId::from("run-b"), StopMode::Hard, NOW)
        .unwrap()
        .unwrap();
    assert_eq!(
        s.finishing(&RunId::from("run-b"), G1, RunStatus::Failed, None)
            .unwrap(),
        Ok(())
    );
}

fn finishing_commits_status_and_answer_once<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.set_state(
            &RunId::from("run-a"),
            G1,
            &obj(json!({"binding": {"backend": "local"}}))
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::StoppedSoft,
            Some("the answer")
        )
        .unwrap(),
        Ok(())
    );
    let row = live_row(s, "run-a");
    assert_eq!(row.phase, Phase::Finishing);
    assert_eq!(row.state.get("finalStatus"), Some(&json!("stopped_soft")));
    assert_eq!(row.state.get("answer"), Some(&json!("the answer")));
    assert_eq!(
        row.state.get("binding"),
        Some(&json!({"backend": "local"})),
        "merged, not replaced"
    );
    assert_eq!(row.state.get("seeded"), Some(&json!(true)));

    // A second finishing is refused and changes nothing.
    let out = s
        .finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("another answer"),
        )
        .unwrap();
    assert!(
        matches!(&out, Err(Refusal::WrongPhase { run_id, phase: Phase::Finishing, .. }) if run_id == "run-a"),
        "{out:?}"
    );
    assert_eq!(live_row(s, "run-a"), row);

    // A dispatch that fails before its prompt finishes from attaching.
    start(s, "run-b", "C1:t2", G1, NOW);
    assert_eq!(
        s.finishing(&RunId::from("run-b"), G1, RunStatus::Failed, None)
            .unwrap(),
        Ok(())
    );
    let row = live_row(s, "run-b");
    assert_eq!(row.phase, Phase::Finishing);
    assert_eq!(row.state.get("finalStatus"), Some(&json!("failed")));
}

fn handoff_then_finishing_is_allowed_for_the_owner<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let out = s.handoff(G1, &[RunId::from("run-a")]).unwrap();
    assert_eq!(out, vec![(RunId::from("run-a"), HandoffResult::HandedOff)]);
    // Another generation cannot take the finishing gate.
    assert_eq!(
        s.finishing(&RunId::from("run-a"), G2, RunStatus::Completed, Some("x"))
            .unwrap(),
        Err(fenced("run-a"))
    );
    // The handed-off run completed before anyone reclaimed it: its owner replies itself.
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("done")
        )
        .unwrap(),
        Ok(())
    );
    let row = live_row(s, "run-a");
    assert_eq!(row.phase, Phase::Finishing);
    assert_eq!(row.state.get("finalStatus"), Some(&json!("completed")));
    // No longer handed off: a reclaim under the owner's current lease leaves it alone.
    let ans = s.reclaim(G2, NOW + 1, LEASE, &[], &[]).unwrap();
    assert!(ans.taken.is_empty(), "{:?}", ans.taken);
    assert_eq!(ids_of(&ans.live_elsewhere), set(&["run-a"]));
    // After its finish no reclaim finds it.
    let fin = s
        .finish(
            &RunId::from("run-a"),
            G1,
            &record("run-a", "C1:t1", NOW, NOW + 2, vec![]),
            None,
            NOW + 2,
        )
        .unwrap();
    assert!(fin.is_ok());
    let ans = s
        .reclaim(G2, NOW + 10 * LEASE, LEASE, &[G1.to_owned()], &[])
        .unwrap();
    assert!(
        ans.taken.is_empty() && ans.live_elsewhere.is_empty(),
        "{ans:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Finish, finished-run reads, abandon
// ---------------------------------------------------------------------------------------------

fn finish_stores_the_record_removes_the_live_rows_and_frees_the_thread_at_once<S: Ledger>(
    s: &mut S,
) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    furnish(s, "run-a", G1);
    assert_eq!(
        s.append(
            &RunId::from("run-a"),
            G1,
            &[ev(3, "three"), ev(4, "four"), ev(5, "five")]
        )
        .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("done")
        )
        .unwrap(),
        Ok(())
    );

    // The record carries its own event stream (say, budget-fitted): it replaces the live events whole.
    let rec = record(
        "run-a",
        "C1:t1",
        NOW,
        NOW + 1_000,
        vec![ev(1, "final one"), ev(2, "final two"), ev(9, "answer")],
    );
    let out = s
        .finish(&RunId::from("run-a"), G1, &rec, None, NOW + 1_000)
        .unwrap()
        .expect("owner finish");
    assert!(out.stored, "{out:?}");
    assert!(!out.rewritten, "nothing was stored under the id before");

    // Readable as finished, with the record's events.
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + 1_000).unwrap(),
        Some(rec.clone())
    );
    assert_eq!(listed(s, NOW + 1_000), ["run-a"]);
    let page = s
        .events(&RunId::from("run-a"), 0, None, NOW + 1_000)
        .unwrap()
        .expect("events of a finished run");
    assert_eq!(
        page.events, rec.events,
        "the record's events replaced the live ones"
    );
    // The live rows are gone.
    assert_eq!(s.get_live(&RunId::from("run-a")).unwrap(), None);
    assert_eq!(s.live_events(&RunId::from("run-a"), 0, 100).unwrap(), None);
    assert!(live_ids(s).is_empty());
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), None).unwrap(),
        Err(not_live("run-a"))
    );
    // Every owner write is now UnknownRun, and a late append cannot touch the finished events.
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(6, "late")])
            .unwrap(),
        Err(unknown("run-a"))
    );
    assert_eq!(
        s.heartbeat(&RunId::from("run-a"), G1, LEASE, NOW + 1_001)
            .unwrap(),
        Err(unknown("run-a"))
    );
    assert_eq!(
        s.events(&RunId::from("run-a"), 0, None, NOW + 1_001)
            .unwrap()
            .unwrap()
            .events,
        rec.events
    );
    // The finished run's steps went with it: a reclaim finds nothing to take.
    let ans = s
        .reclaim(G2, NOW + 10 * LEASE, LEASE, &[G1.to_owned()], &[])
        .unwrap();
    assert!(
        ans.taken.is_empty() && ans.live_elsewhere.is_empty(),
        "{ans:?}"
    );

    // The thread is free at commit: a new admission starts a new run, whose inbox starts fresh.
    assert_eq!(
        s.admit(
            &admission("C1:t1", G1, &RunId::from("run-b"), "again"),
            NOW + 2_000
        )
        .unwrap(),
        started("run-b")
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-b"), None).unwrap(),
        Ok(vec![])
    );
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + 2_000).unwrap(),
        Some(rec),
        "the finished record stays"
    );
}

fn finish_by_a_zombie_generation_after_a_reclaim_is_fenced_and_changes_nothing<S: Ledger>(
    s: &mut S,
) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    furnish(s, "run-a", G1);
    // G1's lease lapses and G2 reclaims the run.
    let ans = s.reclaim(G2, NOW + LEASE, LEASE, &[], &[]).unwrap();
    assert_eq!(
        by_id(ans.taken).keys().cloned().collect::<BTreeSet<_>>(),
        set(&["run-a"])
    );
    let before = snapshot(s, "run-a", NOW + LEASE + 1);

    // The zombie G1 takes the finishing gate and finishes: both fenced, nothing changes.
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("zombie")
        )
        .unwrap(),
        Err(fenced("run-a"))
    );
    let zombie = record(
        "run-a",
        "C1:t1",
        NOW,
        NOW + LEASE + 1,
        vec![ev(1, "zombie")],
    );
    assert_eq!(
        s.finish(&RunId::from("run-a"), G1, &zombie, None, NOW + LEASE + 1)
            .unwrap(),
        Err(fenced("run-a"))
    );
    assert_eq!(
        snapshot(s, "run-a", NOW + LEASE + 1),
        before,
        "no record, live rows intact"
    );
    assert_eq!(live_row(s, "run-a").owner_gen, G2);

    // The new owner closes it.
    let rec = record(
        "run-a",
        "C1:t1",
        NOW,
        NOW + LEASE + 2,
        vec![ev(1, "one"), ev(2, "two")],
    );
    assert!(s
        .finish(&RunId::from("run-a"), G2, &rec, None, NOW + LEASE + 2)
        .unwrap()
        .is_ok());
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + LEASE + 2).unwrap(),
        Some(rec)
    );
    // And the zombie's finish after that is refused as well (no row): still only one record.
    assert_eq!(
        s.finish(&RunId::from("run-a"), G1, &zombie, None, NOW + LEASE + 3)
            .unwrap(),
        Err(unknown("run-a"))
    );
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + LEASE + 3)
            .unwrap()
            .unwrap()
            .events,
        vec![ev(1, "one"), ev(2, "two")]
    );
}

fn finish_of_a_record_under_another_id_changes_nothing<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(1, "one")])
            .unwrap(),
        Ok(())
    );
    let before = snapshot(s, "run-a", NOW + 1);
    let wrong = record("run-zzz", "C1:t1", NOW, NOW + 1, vec![ev(1, "x")]);
    let out = s.finish(&RunId::from("run-a"), G1, &wrong, None, NOW + 1);
    assert!(
        !matches!(out, Ok(Ok(_))),
        "finish(run-a) with a record for run-zzz must be refused: {out:?}"
    );
    assert_eq!(snapshot(s, "run-a", NOW + 1), before);
    assert_eq!(s.get(&RunId::from("run-zzz"), NOW + 1).unwrap(), None);
}

fn finished_run_reads_never_see_a_live_runs_events<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.append(
            &RunId::from("run-a"),
            G1,
            &[ev(1, "live one"), ev(2, "live two")]
        )
        .unwrap(),
        Ok(())
    );

    // Without a tombstone a live run is unknown to the finished-run reads.
    assert_eq!(s.get(&RunId::from("run-a"), NOW).unwrap(), None);
    assert_eq!(s.get_summary(&RunId::from("run-a"), NOW).unwrap(), None);
    assert_eq!(s.events(&RunId::from("run-a"), 0, None, NOW).unwrap(), None);
    assert_eq!(listed(s, NOW), Vec::<String>::new());

    // The provisional tombstone put while live is stored (only its runs row): get returns it with no
    // events, list shows it; the ledger's live events are untouched by it.
    let tomb = tombstone("run-a", "C1:t1", NOW, vec![ev(1, "tombstone's own event")]);
    let out = s.put(&tomb, None, NOW + 1).unwrap();
    assert!(out.stored, "{out:?}");
    let got = s
        .get(&RunId::from("run-a"), NOW + 1)
        .unwrap()
        .expect("the tombstone is stored");
    assert!(got.head.provisional);
    assert_eq!(got.head.status, RunStatus::Interrupted);
    assert_eq!(got.head.finished_at, NOW);
    assert_eq!(
        got.events,
        Vec::<Value>::new(),
        "a finished-run read never carries a live run's events"
    );
    assert_eq!(listed(s, NOW + 1), ["run-a"]);
    let events = s
        .events(&RunId::from("run-a"), 0, None, NOW + 1)
        .unwrap()
        .map(|p| p.events)
        .unwrap_or_default();
    assert_eq!(
        events,
        Vec::<Value>::new(),
        "events() of a live run shows none of its live events"
    );
    assert_eq!(
        live_events(s, "run-a"),
        Some(vec![ev(1, "live one"), ev(2, "live two")])
    );

    // Appends after the tombstone still go to the live stream only.
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(3, "live three")])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        live_events(s, "run-a").map(|e| seqs(&e)),
        Some(vec![1, 2, 3])
    );
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + 2)
            .unwrap()
            .unwrap()
            .events,
        Vec::<Value>::new()
    );

    // Finish replaces the tombstone whole, with the record's events.
    let rec = record(
        "run-a",
        "C1:t1",
        NOW,
        NOW + 3,
        vec![ev(1, "live one"), ev(2, "live two"), ev(3, "live three")],
    );
    let out = s
        .finish(&RunId::from("run-a"), G1, &rec, None, NOW + 3)
        .unwrap()
        .expect("finish");
    assert!(
        out.stored && out.rewritten,
        "the final record replaced the tombstone: {out:?}"
    );
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + 3).unwrap(),
        Some(rec.clone())
    );
    assert_eq!(
        s.events(&RunId::from("run-a"), 0, None, NOW + 3)
            .unwrap()
            .unwrap()
            .events,
        rec.events
    );
    // A late provisional put is stood down by the floor.
    let out = s.put(&tomb, None, NOW + 4).unwrap();
    assert!(out.stored && !out.rewritten);
    assert_eq!(s.get(&RunId::from("run-a"), NOW + 4).unwrap(), Some(rec));
}

fn abandon_drops_the_reservation_without_a_record<S: Ledger>(s: &mut S) {
    start(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.append(&RunId::from("run-a"), G1, &[ev(1, "one")])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.abandon(&RunId::from("run-a"), G2).unwrap(),
        Err(fenced("run-a")),
        "only the owner abandons"
    );
    assert_eq!(live_row(s, "run-a").owner_gen, G1);

    assert_eq!(s.abandon(&RunId::from("run-a"), G1).unwrap(), Ok(()));
    assert_eq!(s.get_live(&RunId::from("run-a")).unwrap(), None);
    assert_eq!(s.live_events(&RunId::from("run-a"), 0, 100).unwrap(), None);
    assert!(live_ids(s).is_empty());
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW).unwrap(),
        None,
        "no record"
    );
    assert_eq!(listed(s, NOW), Vec::<String>::new());
    assert_eq!(
        s.abandon(&RunId::from("run-a"), G1).unwrap(),
        Err(unknown("run-a")),
        "afterwards the run is unknown"
    );
    // The thread is free.
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("run-b"), "again"),
            NOW + 1
        )
        .unwrap(),
        started("run-b")
    );

    // A promoted run can be abandoned the same way.
    go_live(s, "run-c", "C1:t2", G1, NOW);
    assert_eq!(s.abandon(&RunId::from("run-c"), G1).unwrap(), Ok(()));
    assert_eq!(s.get_live(&RunId::from("run-c")).unwrap(), None);
    assert_eq!(
        s.admit(
            &admission("C1:t2", G1, &RunId::from("run-d"), "again"),
            NOW + 1
        )
        .unwrap(),
        started("run-d")
    );
}

fn abandon_after_a_tombstone_leaves_the_tombstone_and_frees_the_thread<S: Ledger>(s: &mut S) {
    // The tombstone is put while the run lives (only its runs row is written), then setup fails and
    // the owner abandons: no final record is written, the tombstone stays the truth, the thread is free.
    start(s, "run-a", "C1:t1", G1, NOW);
    assert_eq!(
        s.append(
            &RunId::from("run-a"),
            G1,
            &[ev(1, "run_meta"), ev(2, "input")]
        )
        .unwrap(),
        Ok(())
    );
    let tomb = tombstone("run-a", "C1:t1", NOW, vec![ev(1, "tombstone's own")]);
    assert!(s.put(&tomb, None, NOW).unwrap().stored);
    assert_eq!(s.abandon(&RunId::from("run-a"), G1).unwrap(), Ok(()));
    assert_eq!(s.get_live(&RunId::from("run-a")).unwrap(), None);
    let got = s
        .get(&RunId::from("run-a"), NOW + 1)
        .unwrap()
        .expect("the tombstone stays");
    assert!(got.head.provisional);
    assert_eq!(got.head.status, RunStatus::Interrupted);
    // Both implementations agree here (SQLite shares `run_events` with the history, and only finish
    // and kill replace a live run's events — SPEC §3): the appended events now read as the tombstone's.
    assert_eq!(seqs(&got.events), [1, 2]);
    assert_eq!(got.events[1], ev(2, "input"));
    assert_eq!(listed(s, NOW + 1), ["run-a"]);
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("run-b"), "again"),
            NOW + 2
        )
        .unwrap(),
        started("run-b")
    );
}

// ---------------------------------------------------------------------------------------------
// Inbox
// ---------------------------------------------------------------------------------------------

fn inbox_is_not_fenced_and_reads_strictly_after_the_cursor<S: Ledger>(s: &mut S) {
    start(s, "run-a", "C1:t1", G1, NOW);
    // push_inbox carries no generation: whichever process is up delivers the steer.
    assert_eq!(
        s.push_inbox(&RunId::from("run-a"), &json!({"text": "m1"}))
            .unwrap(),
        Ok(1)
    );
    assert_eq!(
        s.push_inbox(&RunId::from("run-a"), &json!({"text": "m2"}))
            .unwrap(),
        Ok(2)
    );
    // Admission steers share the same per-run sequence.
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("run-x"), "m3"),
            NOW + 1
        )
        .unwrap(),
        steered("run-a", 3)
    );
    assert_eq!(
        s.push_inbox(&RunId::from("run-a"), &json!({"text": "m4"}))
            .unwrap(),
        Ok(4)
    );

    let all_items = s.read_inbox(&RunId::from("run-a"), None).unwrap().unwrap();
    assert_eq!(inbox_seqs(&all_items), [1, 2, 3, 4]);
    assert_eq!(all_items[0].message, json!({"text": "m1"}));
    assert_eq!(all_items[2].message, request("C1:t1", "m3"));
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), Some(0))
            .unwrap()
            .map(|i| inbox_seqs(&i)),
        Ok(vec![1, 2, 3, 4])
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), Some(2))
            .unwrap()
            .map(|i| inbox_seqs(&i)),
        Ok(vec![3, 4])
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), Some(4)).unwrap(),
        Ok(vec![])
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), Some(99)).unwrap(),
        Ok(vec![])
    );

    // After the owner changes, pushes still land and continue the sequence.
    let ans = s
        .reclaim(G2, NOW + 1, LEASE, &[G1.to_owned()], &[])
        .unwrap();
    assert_eq!(ans.taken.len(), 1);
    assert_eq!(
        s.push_inbox(&RunId::from("run-a"), &json!({"text": "m5"}))
            .unwrap(),
        Ok(5)
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-a"), Some(4))
            .unwrap()
            .map(|i| inbox_seqs(&i)),
        Ok(vec![5])
    );

    // Without a live row: NotLive, and nothing is stored.
    assert_eq!(
        s.push_inbox(&RunId::from("ghost"), &json!({"text": "lost"}))
            .unwrap(),
        Err(not_live("ghost"))
    );
    assert_eq!(
        s.read_inbox(&RunId::from("ghost"), None).unwrap(),
        Err(not_live("ghost"))
    );
    // Each run has its own sequence.
    go_live(s, "run-b", "C1:t2", G1, NOW);
    assert_eq!(
        s.push_inbox(&RunId::from("run-b"), &json!({"text": "b1"}))
            .unwrap(),
        Ok(1)
    );
}

// ---------------------------------------------------------------------------------------------
// Reclaim
// ---------------------------------------------------------------------------------------------

/// The reclaim time of [`reclaim_fixture`].
const T: i64 = NOW + LEASE;

/// Rows of every kind, for a reclaim by G3 at `T` with `dead_gens = [G2, G3]`:
/// - `r-attach`  G1, attaching, lease ends exactly at T (equal-now: expired); two steered messages;
/// - `r-live`    G1, live, expired; steps 0 and 1 (inboxConsumedSeq 2), inbox 1..3, state, a soft stop;
/// - `r-handoff` G1, handed off under a current lease;
/// - `r-fin`     G1, finishing (stopped_soft, "the answer"), expired;
/// - `r-dead`    G2 (dead), live under a current lease;
/// - `r-current` G1, live under a current lease;
/// - `r-edge`    G1, live, lease ends one millisecond after T;
/// - `r-own`     G3's own row, attaching, expired;
/// - `r-own-ho`  G3's own row, handed off.
fn reclaim_fixture<S: Ledger>(s: &mut S) -> BTreeMap<RunId, LiveRow> {
    let fresh = T - 1_000; // admitted later: lease current at T
    start(s, "r-attach", "C1:t1", G1, NOW);
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("x1"), "first follow-up"),
            NOW + 1
        )
        .unwrap(),
        steered("r-attach", 1)
    );
    assert_eq!(
        s.admit(
            &admission("C1:t1", G2, &RunId::from("x2"), "second follow-up"),
            NOW + 2
        )
        .unwrap(),
        steered("r-attach", 2)
    );

    go_live(s, "r-live", "C1:t2", G1, NOW);
    assert_eq!(
        s.step(&RunId::from("r-live"), G1, &step_record(0, 2, None))
            .unwrap(),
        Ok(())
    );
    for i in 1..=3u64 {
        assert_eq!(
            s.push_inbox(&RunId::from("r-live"), &json!({"text": format!("m{i}")}))
                .unwrap(),
            Ok(i)
        );
    }
    assert_eq!(
        s.step(&RunId::from("r-live"), G1, &step_record(1, 4, Some(2)))
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.set_state(
            &RunId::from("r-live"),
            G1,
            &obj(json!({"binding": {"backend": "local"}}))
        )
        .unwrap(),
        Ok(())
    );
    s.request_stop(&RunId::from("r-live"), StopMode::Soft, NOW + 3)
        .unwrap()
        .expect("stop");
    assert_eq!(
        s.append(&RunId::from("r-live"), G1, &[ev(1, "one"), ev(2, "two")])
            .unwrap(),
        Ok(())
    );

    go_live(s, "r-handoff", "C1:t3", G1, fresh);
    assert_eq!(
        s.handoff(G1, &[RunId::from("r-handoff")]).unwrap(),
        vec![(RunId::from("r-handoff"), HandoffResult::HandedOff)]
    );

    go_live(s, "r-fin", "C1:t4", G1, NOW);
    assert_eq!(
        s.finishing(
            &RunId::from("r-fin"),
            G1,
            RunStatus::StoppedSoft,
            Some("the answer")
        )
        .unwrap(),
        Ok(())
    );

    go_live(s, "r-dead", "C1:t5", G2, fresh);
    go_live(s, "r-current", "C1:t6", G1, fresh);
    go_live(s, "r-edge", "C1:t7", G1, NOW + 1);

    start(s, "r-own", "C1:t8", G3, NOW);
    go_live(s, "r-own-ho", "C1:t9", G3, NOW);
    assert_eq!(
        s.handoff(G3, &[RunId::from("r-own-ho")]).unwrap(),
        vec![(RunId::from("r-own-ho"), HandoffResult::HandedOff)]
    );

    s.list_live()
        .unwrap()
        .into_iter()
        .map(|r| (r.run_id.clone(), r))
        .collect()
}

fn reclaim_takes_expired_handed_off_and_dead_owner_rows_and_never_its_own<S: Ledger>(s: &mut S) {
    let before = reclaim_fixture(s);
    assert_eq!(before.len(), 9);
    let ans = s
        .reclaim(G3, T, LEASE, &[G2.to_owned(), G3.to_owned()], &[])
        .unwrap();
    let taken = by_id(ans.taken);
    assert_eq!(
        taken.keys().cloned().collect::<BTreeSet<_>>(),
        set(&["r-attach", "r-live", "r-handoff", "r-fin", "r-dead"]),
        "expired (lease_until <= now), handed off, or owned by a dead generation — never G3's own"
    );
    assert_eq!(
        ids_of(&ans.live_elsewhere),
        set(&["r-current", "r-edge"]),
        "another generation's current lease: left alone and reported"
    );
    for r in &ans.live_elsewhere {
        assert_eq!(
            r, &before[&r.run_id],
            "a row live elsewhere is reported as it is"
        );
        assert_eq!(
            live_row(s, &r.run_id),
            before[&r.run_id],
            "and left untouched"
        );
    }
    // Own rows, even expired or handed off (and even with G3 in dead_gens), stay as they were.
    assert_eq!(live_row(s, "r-own"), before["r-own"]);
    assert_eq!(live_row(s, "r-own-ho"), before["r-own-ho"]);

    // Each taken row: owner := G3, lease := T + LEASE, phase per reclaim_phase; identity, start,
    // meta and stop kept; the answer's row is the row as now stored.
    let expect_phase = [
        ("r-attach", Phase::Attaching, Phase::Attaching, G1),
        ("r-live", Phase::Live, Phase::Live, G1),
        ("r-handoff", Phase::Handoff, Phase::Live, G1),
        ("r-fin", Phase::Finishing, Phase::Live, G1),
        ("r-dead", Phase::Live, Phase::Live, G2),
    ];
    for (id, prior, now_phase, prior_owner) in expect_phase {
        let t = &taken[id];
        let old = &before[id];
        assert_eq!(t.prior_phase, prior, "{id} prior phase");
        assert_eq!(t.prior_owner, prior_owner, "{id} prior owner");
        assert_eq!(t.row.phase, now_phase, "{id} phase after reclaim");
        assert_eq!(t.row.owner_gen, G3, "{id} owner");
        assert_eq!(t.row.lease_until, T + LEASE, "{id} lease = now + lease_ms");
        assert_eq!(t.row.run_id, old.run_id);
        assert_eq!(t.row.thread_key, old.thread_key, "{id} thread");
        assert_eq!(t.row.started_at, old.started_at, "{id} start");
        assert_eq!(t.row.meta, old.meta, "{id} meta");
        assert_eq!(t.row.stop, old.stop, "{id} stop");
        assert_eq!(t.row.system_text, old.system_text, "{id} prompt");
        assert_eq!(t.row.tools, old.tools, "{id} tools");
        assert_eq!(t.row.state, old.state, "{id} state");
        assert_eq!(live_row(s, id), t.row, "{id}: the answer is the stored row");
    }
    assert_eq!(s.list_live().unwrap().len(), 9, "a reclaim deletes nothing");

    // A reclaim right after takes nothing more: G3 owns them now and its own rows are never taken.
    let again = s.reclaim(G3, T + 10 * LEASE, LEASE, &[], &[]).unwrap();
    assert!(
        again.taken.iter().all(|t| ![
            "r-attach",
            "r-live",
            "r-handoff",
            "r-fin",
            "r-dead",
            "r-own",
            "r-own-ho"
        ]
        .contains(&t.row.run_id.as_str())),
        "{:?}",
        again.taken
    );
}

fn reclaim_answers_last_step_unread_inbox_and_state<S: Ledger>(s: &mut S) {
    reclaim_fixture(s);
    let ans = s.reclaim(G3, T, LEASE, &[G2.to_owned()], &[]).unwrap();
    let taken = by_id(ans.taken);

    // r-live: the last (highest) step, the inbox past its inboxConsumedSeq, state, the stop.
    let t = &taken["r-live"];
    assert_eq!(t.last_step, Some(step_record(1, 4, Some(2))));
    assert_eq!(
        inbox_seqs(&t.unread_inbox),
        [3],
        "only items past inboxConsumedSeq = 2"
    );
    assert_eq!(t.unread_inbox[0].message, json!({"text": "m3"}));
    assert_eq!(
        t.row.state.get("binding"),
        Some(&json!({"backend": "local"}))
    );
    assert_eq!(t.row.state.get("seeded"), Some(&json!(true)));
    assert_eq!(t.row.stop, Some(StopMode::Soft));
    // Its live events are still readable for a close record.
    assert_eq!(live_events(s, "r-live").map(|e| seqs(&e)), Some(vec![1, 2]));

    // r-attach: no step record, so every inbox item is unread; the request rides in meta.
    let t = &taken["r-attach"];
    assert_eq!(t.last_step, None);
    assert_eq!(inbox_seqs(&t.unread_inbox), [1, 2]);
    assert_eq!(
        t.unread_inbox[0].message,
        request("C1:t1", "first follow-up")
    );
    assert_eq!(t.row.meta["request"], request("C1:t1", "hello"));

    // A run taken from finishing comes back with its recorded final status and answer.
    let t = &taken["r-fin"];
    assert_eq!(t.prior_phase, Phase::Finishing);
    assert_eq!(t.row.phase, Phase::Live);
    assert_eq!(t.row.state.get("finalStatus"), Some(&json!("stopped_soft")));
    assert_eq!(t.row.state.get("answer"), Some(&json!("the answer")));
    assert!(t.unread_inbox.is_empty());
}

fn after_a_reclaim_every_owner_write_of_the_old_generation_is_fenced<S: Ledger>(s: &mut S) {
    reclaim_fixture(s);
    s.reclaim(G3, T, LEASE, &[G2.to_owned()], &[]).unwrap();

    for (id, old) in [
        ("r-live", G1),
        ("r-fin", G1),
        ("r-handoff", G1),
        ("r-dead", G2),
    ] {
        let before = snapshot(s, id, T + 1);
        let results = every_owner_write(s, id, old, T + 1);
        assert_all_refused(
            results,
            &fenced(id),
            &format!("of the old owner {old} after the reclaim of {id}"),
        );
        assert_eq!(
            snapshot(s, id, T + 1),
            before,
            "{id}: the zombie's writes changed nothing"
        );
    }
    // The reclaimed attaching row: the old owner's promotion is fenced, the new owner's lands.
    assert_eq!(
        s.claim(&RunId::from("r-attach"), G1, &promotion(LEASE), T + 2)
            .unwrap(),
        Err(fenced("r-attach"))
    );
    assert_eq!(live_row(s, "r-attach").phase, Phase::Attaching);
    assert_eq!(
        s.claim(&RunId::from("r-attach"), G3, &promotion(LEASE), T + 3)
            .unwrap(),
        Ok(Claimed::Promoted)
    );
    let row = live_row(s, "r-attach");
    assert_eq!(
        (row.phase, row.started_at, row.lease_until),
        (Phase::Live, NOW, T + 3 + LEASE)
    );

    // The new owner writes freely.
    assert_eq!(
        s.append(&RunId::from("r-live"), G3, &[ev(3, "resumed")])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from("r-live"), G3, &step_record(2, 6, Some(3)))
            .unwrap(),
        Ok(())
    );
    let hb = s
        .heartbeat(&RunId::from("r-live"), G3, LEASE, T + 4)
        .unwrap()
        .expect("new owner heartbeat");
    assert_eq!((hb.phase, hb.stop), (Phase::Live, Some(StopMode::Soft)));
    // The new owner closes the run taken from finishing.
    let rec = record("r-fin", "C1:t4", NOW, T + 5, vec![]);
    assert!(s
        .finish(&RunId::from("r-fin"), G3, &rec, None, T + 5)
        .unwrap()
        .is_ok());
    assert_eq!(s.get(&RunId::from("r-fin"), T + 5).unwrap(), Some(rec));
}

fn a_second_generation_reclaiming_after_the_first_sees_its_rows_live_elsewhere<S: Ledger>(
    s: &mut S,
) {
    for (i, id) in ["ra", "rb", "rc"].iter().enumerate() {
        go_live(s, id, &format!("C1:s{i}"), G1, NOW);
    }
    let first = s.reclaim(G2, NOW + LEASE, LEASE, &[], &[]).unwrap();
    assert_eq!(
        by_id(first.taken).keys().cloned().collect::<BTreeSet<_>>(),
        set(&["ra", "rb", "rc"])
    );
    assert!(first.live_elsewhere.is_empty());

    // At the same instant, another generation finds them under G2's fresh lease: nothing to take.
    let second = s
        .reclaim(G3, NOW + LEASE, LEASE, &[G1.to_owned()], &[])
        .unwrap();
    assert!(
        second.taken.is_empty(),
        "each row is taken once: {:?}",
        second.taken
    );
    assert_eq!(ids_of(&second.live_elsewhere), set(&["ra", "rb", "rc"]));
    for r in &second.live_elsewhere {
        assert_eq!(r.owner_gen, G2);
        assert_eq!(r.lease_until, NOW + 2 * LEASE);
    }
    // Once G2's lease lapses too, G3 takes them from G2.
    let third = s.reclaim(G3, NOW + 2 * LEASE, LEASE, &[], &[]).unwrap();
    let taken = by_id(third.taken);
    assert_eq!(
        taken.keys().cloned().collect::<BTreeSet<_>>(),
        set(&["ra", "rb", "rc"])
    );
    assert!(taken
        .values()
        .all(|t| t.prior_owner == G2 && t.row.owner_gen == G3));
}

/// A generation never takes back a run it still drives (an old actor of its own, or its pending close,
/// from before another generation took the row): the row is left to its owner, reported nowhere, and
/// taken at a later reclaim once nothing drives it here.
fn a_run_the_reclaimer_still_drives_is_left_alone_until_it_does_not<S: Ledger>(s: &mut S) {
    go_live(s, "ra", "C1:d1", G1, NOW);
    go_live(s, "rb", "C1:d2", G1, NOW);
    let ans = s
        .reclaim(G2, NOW + LEASE, LEASE, &[], &[RunId::from("ra")])
        .unwrap();
    assert_eq!(
        by_id(ans.taken).keys().cloned().collect::<BTreeSet<_>>(),
        set(&["rb"])
    );
    assert!(ans.live_elsewhere.is_empty(), "{:?}", ans.live_elsewhere);
    let ra = s.get_live(&RunId::from("ra")).unwrap().expect("ra");
    assert_eq!(
        (ra.owner_gen.as_str(), ra.lease_until),
        (G1, NOW + LEASE),
        "untouched"
    );
    let later = s.reclaim(G2, NOW + LEASE + 1, LEASE, &[], &[]).unwrap();
    let taken = by_id(later.taken);
    assert_eq!(taken.keys().cloned().collect::<BTreeSet<_>>(), set(&["ra"]));
    assert_eq!(taken["ra"].prior_owner, G1);
}

// ---------------------------------------------------------------------------------------------
// Generations
// ---------------------------------------------------------------------------------------------

fn generations_round_trip<S: Ledger>(s: &mut S) {
    assert_eq!(s.generations().unwrap(), vec![]);
    let a = GenerationInfo {
        gen: G1.to_owned(),
        host: "host-a".to_owned(),
        host_id: "rack-1/a".to_owned(),
        pid: 4242,
        proc_start: "123456789".to_owned(),
        started_at: NOW,
    };
    let b = GenerationInfo {
        gen: G2.to_owned(),
        host: "host-b".to_owned(),
        host_id: "host-b".to_owned(),
        pid: 1,
        proc_start: "987".to_owned(),
        started_at: NOW + 1_000,
    };
    s.record_generation(&a).unwrap();
    s.record_generation(&b).unwrap();
    let mut got = s.generations().unwrap();
    got.sort_by(|x, y| x.gen.cmp(&y.gen));
    assert_eq!(got, vec![a, b]);
}

// ---------------------------------------------------------------------------------------------
// Bounded tables: what finish leaves behind, and the sweep's prune (SPEC §4.3 finish)
// ---------------------------------------------------------------------------------------------

const TTL: i64 = 86_400_000;
const DAY: i64 = 86_400_000;

fn generation(gen: &str, started_at: i64) -> GenerationInfo {
    GenerationInfo {
        gen: gen.to_owned(),
        host: "host-a".to_owned(),
        host_id: "host-a".to_owned(),
        pid: 7,
        proc_start: "1".to_owned(),
        started_at,
    }
}

/// Every ledger row of `run` is gone (its record and receipts are not the ledger's live rows).
fn assert_no_live_rows_of<S: Ledger>(s: &mut S, run: &str, who: &str) {
    assert_eq!(
        s.get_live(&RunId::from(run)).unwrap(),
        None,
        "{who}: live row"
    );
    assert_eq!(
        s.read_transcript(&RunId::from(run)).unwrap().turns,
        Vec::<Turn>::new(),
        "{who}: transcript"
    );
    assert_eq!(
        s.last_step(&RunId::from(run)).unwrap(),
        None,
        "{who}: step records"
    );
    assert_eq!(
        s.inbox_after(&RunId::from(run), None).unwrap(),
        Vec::<InboxItem>::new(),
        "{who}: inbox, read or not"
    );
}

/// A finished run leaves its record and its receipts, and nothing else: no live row, step record,
/// transcript part or inbox row — read or unread (a successor admission reads the unread ones first, in
/// the same transaction, and carries them in its own request).
fn finish_leaves_no_transcript_steps_or_inbox_rows_of_the_run<S: Ledger>(s: &mut S) {
    let a = keyed(
        admission("C1:t1", G1, &RunId::from("run-a"), "hello"),
        "tok",
        "k1",
        "h1",
    );
    assert_eq!(s.admit(&a, NOW).unwrap(), started("run-a"));
    promote(s, "run-a", G1, NOW);
    furnish(s, "run-a", G1);
    assert_eq!(
        s.write_transcript(&RunId::from("run-a"), G1, 2, &[turn("assistant", &["a1"])])
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(1, 3, Some(1)))
            .unwrap(),
        Ok(())
    );
    // A second follow-up arrives and is never read.
    assert_eq!(
        s.admit(
            &keyed(
                admission("C1:t1", G1, &RunId::from("run-x"), "late"),
                "tok",
                "k2",
                "h2"
            ),
            NOW + 1
        )
        .unwrap(),
        steered("run-a", 2)
    );
    // Another run on another thread, untouched by run-a's finish.
    go_live(s, "run-b", "C1:t2", G1, NOW);
    furnish(s, "run-b", G1);
    let before = s.table_rows().unwrap();
    assert_eq!(
        (
            before.live_runs,
            before.run_steps,
            before.transcript,
            before.run_inbox,
            before.admit_receipts
        ),
        (2, 3, 5, 3, 2)
    );

    let rec = record("run-a", "C1:t1", NOW, NOW + 10, vec![ev(1, "one")]);
    assert!(
        s.finish(&RunId::from("run-a"), G1, &rec, None, NOW + 10)
            .unwrap()
            .expect("finish")
            .stored
    );
    assert_no_live_rows_of(s, "run-a", "after finish");
    let after = s.table_rows().unwrap();
    assert_eq!(
        after,
        TableRows {
            live_runs: 1,
            run_steps: 1,
            transcript: 2,
            run_inbox: 1,
            runs: 1,
            run_events: after.run_events,
            ..before
        },
        "only run-b's rows stay besides run-a's record and both receipts"
    );
    // The receipts still answer verbatim, within their TTL.
    assert_eq!(s.admit(&a, NOW + 20).unwrap(), started("run-a"));
    assert_eq!(s.get(&RunId::from("run-a"), NOW + 20).unwrap(), Some(rec));
    // run-b is intact.
    assert_eq!(
        s.read_transcript(&RunId::from("run-b"))
            .unwrap()
            .turns
            .len(),
        2
    );
    assert_eq!(
        s.read_inbox(&RunId::from("run-b"), None)
            .unwrap()
            .map(|i| inbox_seqs(&i)),
        Ok(vec![1])
    );
}

/// An abandoned run leaves nothing either; a purged one (killed, settled) loses its inbox too.
fn abandon_and_purge_leave_no_transcript_steps_or_inbox_rows<S: Ledger>(s: &mut S) {
    go_live(s, "run-a", "C1:t1", G1, NOW);
    furnish(s, "run-a", G1);
    assert_eq!(s.abandon(&RunId::from("run-a"), G1).unwrap(), Ok(()));
    assert_no_live_rows_of(s, "run-a", "after abandon");
    go_live(s, "run-k", "C1:t2", G1, NOW);
    furnish(s, "run-k", G1);
    s.kill(&RunId::from("run-k"), NOW + 1).unwrap();
    assert!(s.purge(&RunId::from("run-k")).unwrap());
    assert_no_live_rows_of(s, "run-k", "after purge");
    let rows = s.table_rows().unwrap();
    assert_eq!(
        (
            rows.live_runs,
            rows.run_steps,
            rows.transcript,
            rows.run_inbox,
            rows.run_events
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(
        rows.deletion_fences, 1,
        "the fence stays (until a prune a receipt TTL after the kill)"
    );
}

/// Receipts answer retries while their run lives and for `receipt_ttl_ms` after it ended; then a prune
/// takes them (and the key admits afresh). A receipt of a run that ended without a stamp (abandon)
/// starts its TTL at the first prune that sees it.
fn receipts_are_pruned_a_ttl_after_their_run_ended_and_younger_ones_kept<S: Ledger>(s: &mut S) {
    let keep = [G1.to_owned()];
    // run-a: started and steered with keys, finished at NOW + 1_000.
    let a1 = keyed(
        admission("C1:t1", G1, &RunId::from("run-a"), "hello"),
        "tok",
        "a1",
        "h",
    );
    let a2 = keyed(
        admission("C1:t1", G1, &RunId::from("run-y"), "more"),
        "tok",
        "a2",
        "h",
    );
    assert_eq!(s.admit(&a1, NOW).unwrap(), started("run-a"));
    assert_eq!(s.admit(&a2, NOW).unwrap(), steered("run-a", 1));
    assert!(s
        .finish(
            &RunId::from("run-a"),
            G1,
            &record("run-a", "C1:t1", NOW, NOW + 1_000, vec![]),
            None,
            NOW + 1_000
        )
        .unwrap()
        .is_ok());
    // run-c: finished half a TTL later.
    let c1 = keyed(
        admission("C1:t3", G1, &RunId::from("run-c"), "hello"),
        "tok",
        "c1",
        "h",
    );
    assert_eq!(s.admit(&c1, NOW).unwrap(), started("run-c"));
    assert!(s
        .finish(
            &RunId::from("run-c"),
            G1,
            &record("run-c", "C1:t3", NOW, NOW + TTL / 2, vec![]),
            None,
            NOW + TTL / 2
        )
        .unwrap()
        .is_ok());
    // run-b: still live, however old its receipt.
    let b1 = keyed(
        admission("C1:t2", G1, &RunId::from("run-b"), "hello"),
        "tok",
        "b1",
        "h",
    );
    assert_eq!(s.admit(&b1, NOW).unwrap(), started("run-b"));
    // run-d: abandoned (no end stamp of its own).
    let d1 = keyed(
        admission("C1:t4", G1, &RunId::from("run-d"), "hello"),
        "tok",
        "d1",
        "h",
    );
    assert_eq!(s.admit(&d1, NOW).unwrap(), started("run-d"));
    assert_eq!(s.abandon(&RunId::from("run-d"), G1).unwrap(), Ok(()));
    assert_eq!(s.table_rows().unwrap().admit_receipts, 5);

    // One millisecond before run-a's TTL is up, nothing goes; run-d's receipt gets its end stamp.
    assert_eq!(
        s.prune(NOW + 1_000 + TTL - 1, TTL, &keep).unwrap(),
        PruneReport::default()
    );
    assert_eq!(
        s.admit(&a1, NOW + 1_000 + TTL - 1).unwrap(),
        started("run-a"),
        "still answered verbatim"
    );
    // At the TTL, run-a's two receipts go; run-c's (younger), run-b's (live) and run-d's (stamped
    // just now) stay.
    let report = s.prune(NOW + 1_000 + TTL, TTL, &keep).unwrap();
    assert_eq!(
        report,
        PruneReport {
            receipts: 2,
            ..Default::default()
        }
    );
    assert_eq!(s.table_rows().unwrap().admit_receipts, 3);
    assert_eq!(
        s.admit(&c1, NOW + 1_000 + TTL).unwrap(),
        started("run-c"),
        "a younger receipt still answers"
    );
    assert_eq!(
        s.admit(&b1, NOW + 1_000 + TTL).unwrap(),
        started("run-b"),
        "a live run's receipt stays"
    );
    // run-a's key is free again: a retry now is a new admission (here, a new run on the free thread).
    assert_eq!(
        s.admit(
            &keyed(
                admission("C1:t1", G1, &RunId::from("run-a2"), "hello"),
                "tok",
                "a1",
                "h"
            ),
            NOW + 1_001 + TTL
        )
        .unwrap(),
        started("run-a2")
    );

    // run-c's and run-d's go once their own TTL is up; run-b's never while it lives.
    let report = s.prune(NOW + 1_000 + TTL - 1 + TTL, TTL, &keep).unwrap();
    assert_eq!(report.receipts, 2, "{report:?}");
    let receipts_left = s.table_rows().unwrap().admit_receipts;
    assert_eq!(receipts_left, 2, "run-b's and run-a2's");
    assert_eq!(
        s.prune(NOW + 100 * TTL, TTL, &keep).unwrap().receipts,
        0,
        "live runs' receipts stay"
    );
}

/// Generations go when they are not kept, own no rows (no live row, no pending plan request) and
/// started more than a day ago; each of those conditions alone keeps one.
fn dead_generations_are_pruned_and_live_ones_and_ones_owning_rows_kept<S: Ledger>(s: &mut S) {
    const G4: &str = "20270115T110000Z-44444444";
    const G5: &str = "20270115T120000Z-55555555";
    const G6: &str = "20270115T130000Z-66666666";
    let old = NOW - 2 * DAY;
    s.record_generation(&generation(G1, old)).unwrap(); // owns a live row
    s.record_generation(&generation(G2, old)).unwrap(); // dead, owns nothing: pruned
    s.record_generation(&generation(G3, old)).unwrap(); // owns nothing, but kept by the caller
    s.record_generation(&generation(G4, NOW - DAY + 10))
        .unwrap(); // owns nothing, less than a day old
    s.record_generation(&generation(G5, old)).unwrap(); // holds a pending plan request
    s.record_generation(&generation(G6, NOW - DAY)).unwrap(); // exactly a day old: not *older*
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let plan = PlanId::parse("plan-1").unwrap();
    let snapshot = SnapshotId::parse("snap-1").unwrap();
    s.import(
        &Import {
            plan_id: plan.clone(),
            snapshot_id: snapshot.clone(),
            advance_revision: false,
        },
        NOW,
    )
    .unwrap();
    let binding = PlanBinding {
        plan_id: plan,
        revision: Revision::new(1),
        snapshot_id: snapshot,
    };
    let holder = storage::Generation::parse(G5).unwrap();
    let request = s
        .allocate_request(&binding, &holder, LEASE, NOW)
        .unwrap()
        .expect("allocated");

    let report = s.prune(NOW, TTL, &[G3.to_owned()]).unwrap();
    assert_eq!(
        report,
        PruneReport {
            generations: 1,
            ..Default::default()
        }
    );
    let left: BTreeSet<String> = s
        .generations()
        .unwrap()
        .into_iter()
        .map(|g| g.gen)
        .collect();
    assert_eq!(left, gens(&[G1, G3, G4, G5, G6]));

    // Once G1's run finished and G5's request settled, they go too; G3 stays while kept.
    assert!(s
        .finish(
            &RunId::from("run-a"),
            G1,
            &record("run-a", "C1:t1", NOW, NOW + 1, vec![]),
            None,
            NOW + 1
        )
        .unwrap()
        .is_ok());
    let cancelled = Settlement {
        outcome: SettleOutcome::Cancelled,
        reason: TerminalReason::Cancelled,
        diagnostic: "done".into(),
    };
    s.settle_suggestion(&request.request_id, &binding, &cancelled, NOW + 1)
        .unwrap()
        .expect("settled");
    let report = s.prune(NOW + 2, TTL, &[G3.to_owned()]).unwrap();
    assert_eq!(
        report.generations, 3,
        "G1, G5 and G6 (now older than a day): {report:?}"
    );
    let left: BTreeSet<String> = s
        .generations()
        .unwrap()
        .into_iter()
        .map(|g| g.gen)
        .collect();
    assert_eq!(left, gens(&[G3, G4]));
    // Nothing else was touched.
    assert_eq!(
        s.get(&RunId::from("run-a"), NOW + 2)
            .unwrap()
            .map(|r| r.head.id),
        Some(RunId::from("run-a".to_owned()))
    );
}

/// A deletion fence goes once its run is purged (nothing of it left) and the receipt TTL has passed
/// since the kill; a fence whose run is still settling (a live row, a record) stays whatever its age,
/// and while a fence stays every later write for the id is refused.
fn deletion_fences_are_pruned_a_ttl_after_the_kill_once_their_run_is_purged<S: Ledger>(s: &mut S) {
    let keep = [G1.to_owned()];
    // k-purged: live, killed at NOW, purged. k-settling: live, killed at NOW, not purged yet.
    // k-record: a finished record, killed at NOW, not purged yet. k-young: killed half a TTL later.
    go_live(s, "k-purged", "C1:t1", G1, NOW);
    furnish(s, "k-purged", G1);
    go_live(s, "k-settling", "C1:t2", G1, NOW);
    assert!(
        s.put(
            &record("k-record", "C1:t3", NOW, NOW, vec![ev(1, "x")]),
            None,
            NOW
        )
        .unwrap()
        .stored
    );
    for run in ["k-purged", "k-settling", "k-record"] {
        s.kill(&RunId::from(run), NOW).unwrap();
    }
    s.kill(&RunId::from("k-young"), NOW + TTL / 2).unwrap();
    assert!(s.purge(&RunId::from("k-purged")).unwrap());
    // A second kill of a purged run keeps the first kill's time: the TTL still runs from NOW.
    s.kill(&RunId::from("k-purged"), NOW + TTL / 2).unwrap();

    // Within the TTL nothing goes, and the fence still refuses every later write for the id.
    assert_eq!(
        s.prune(NOW + TTL - 1, TTL, &keep).unwrap(),
        PruneReport::default()
    );
    assert!(
        !s.put(
            &record("k-purged", "C1:t1", NOW, NOW, vec![ev(1, "x")]),
            None,
            NOW + TTL - 1
        )
        .unwrap()
        .stored
    );
    assert_eq!(
        s.admit(
            &admission("C1:t9", G2, &RunId::from("k-purged"), "again"),
            NOW + TTL - 1
        )
        .unwrap(),
        AdmitOutcome::Fenced
    );
    assert_eq!(s.table_rows().unwrap().deletion_fences, 4);

    // At the TTL only the purged run's fence goes; the settling ones stay, whatever their age.
    let report = s.prune(NOW + TTL, TTL, &keep).unwrap();
    assert_eq!(
        report,
        PruneReport {
            deletion_fences: 1,
            ..Default::default()
        }
    );
    assert!(!s.is_killed(&RunId::from("k-purged")).unwrap());
    for run in ["k-settling", "k-record", "k-young"] {
        assert!(
            s.is_killed(&RunId::from(run)).unwrap(),
            "{run} keeps its fence"
        );
    }
    assert_eq!(
        s.killed_among(&["k-purged".into(), "k-settling".into()])
            .unwrap(),
        ["k-settling"]
    );
    assert_eq!(
        s.prune(NOW + 10 * TTL, TTL, &keep).unwrap().deletion_fences,
        1,
        "k-young, purged all along"
    );
    assert_eq!(
        s.admit(
            &admission("C1:t9", G2, &RunId::from("k-settling"), "again"),
            NOW + 10 * TTL
        )
        .unwrap(),
        AdmitOutcome::Fenced
    );
    assert_eq!(
        live_row(s, "k-settling").stop,
        Some(StopMode::Hard),
        "the killed live run is untouched"
    );

    // Once they are purged, the next pass takes their fences too (killed more than a TTL ago).
    assert!(s.purge(&RunId::from("k-settling")).unwrap());
    assert!(s.purge(&RunId::from("k-record")).unwrap());
    let report = s.prune(NOW + 10 * TTL, TTL, &keep).unwrap();
    assert_eq!(report.deletion_fences, 2, "{report:?}");
    assert_eq!(s.table_rows().unwrap().deletion_fences, 0);
}

/// Plan requests in a terminal state (consumed, failed, cancelled, invalidated) go the receipt TTL
/// after they settled; a pending or a ready one never, whatever its age. The plan row is never pruned,
/// so its revision never goes back: the next import advances from where it was, not from 1.
fn plan_requests_in_a_terminal_state_are_pruned_a_ttl_after_they_settled_and_plans_never<
    S: Ledger,
>(
    s: &mut S,
) {
    let keep = [G1.to_owned()];
    let holder = storage::Generation::parse(G1).unwrap();
    let plan = PlanId::parse("plan-1").unwrap();
    let snapshot = SnapshotId::parse("snap-1").unwrap();
    let import = |advance| Import {
        plan_id: plan.clone(),
        snapshot_id: snapshot.clone(),
        advance_revision: advance,
    };
    let at = |revision| PlanBinding {
        plan_id: plan.clone(),
        revision: Revision::new(revision),
        snapshot_id: snapshot.clone(),
    };
    let cards = vec![Card {
        title: "t".into(),
        body: "b".into(),
    }];
    let settlement = |outcome, reason| Settlement {
        outcome,
        reason,
        diagnostic: "over".into(),
    };
    s.import(&import(false), NOW).unwrap();
    // Invalidated at NOW + 1 by an import that advances the revision to 2.
    let invalidated = s
        .allocate_request(&at(1), &holder, LEASE, NOW)
        .unwrap()
        .expect("allocated");
    s.import(&import(true), NOW + 1).unwrap();
    // Consumed at NOW + 2 (the apply advances the revision to 3).
    let consumed = s
        .allocate_request(&at(2), &holder, LEASE, NOW + 1)
        .unwrap()
        .expect("allocated");
    s.complete_suggestions(&consumed.request_id, &at(2), &cards, NOW + 1)
        .unwrap()
        .expect("ready");
    s.consume(&consumed.request_id, NOW + 2)
        .unwrap()
        .expect("consumed");
    // Failed at NOW + 2, cancelled at NOW + 3; ready and pending from NOW + 3 on.
    let failed = s
        .allocate_request(&at(3), &holder, LEASE, NOW + 2)
        .unwrap()
        .expect("allocated");
    s.settle_suggestion(
        &failed.request_id,
        &at(3),
        &settlement(SettleOutcome::Failed, TerminalReason::ProviderError),
        NOW + 2,
    )
    .unwrap()
    .expect("failed");
    let cancelled = s
        .allocate_request(&at(3), &holder, LEASE, NOW + 2)
        .unwrap()
        .expect("allocated");
    s.settle_suggestion(
        &cancelled.request_id,
        &at(3),
        &settlement(SettleOutcome::Cancelled, TerminalReason::Cancelled),
        NOW + 3,
    )
    .unwrap()
    .expect("cancelled");
    let ready = s
        .allocate_request(&at(3), &holder, LEASE, NOW + 3)
        .unwrap()
        .expect("allocated");
    s.complete_suggestions(&ready.request_id, &at(3), &cards, NOW + 3)
        .unwrap()
        .expect("ready");
    let pending = s
        .allocate_request(&at(3), &holder, LEASE, NOW + 3)
        .unwrap()
        .expect("allocated");
    let exists = |s: &mut S, id: &RequestId| s.get_request(id).unwrap().is_some();

    // One millisecond before the first TTL is up, nothing goes.
    assert_eq!(
        s.prune(NOW + 1 + TTL - 1, TTL, &keep).unwrap(),
        PruneReport::default()
    );
    // Each terminal request goes once its own TTL is up.
    assert_eq!(
        s.prune(NOW + 1 + TTL, TTL, &keep).unwrap(),
        PruneReport {
            plan_requests: 1,
            ..Default::default()
        }
    );
    assert!(!exists(s, &invalidated.request_id));
    assert!(
        exists(s, &consumed.request_id),
        "settled a millisecond later"
    );
    assert_eq!(
        s.prune(NOW + 3 + TTL, TTL, &keep).unwrap().plan_requests,
        3,
        "consumed, failed, cancelled"
    );
    for gone in [&consumed, &failed, &cancelled] {
        assert!(!exists(s, &gone.request_id), "{:?}", gone.state);
    }
    // Ready and pending requests stay whatever their age; the pending one still holds the plan.
    assert_eq!(
        s.prune(NOW + 100 * TTL, TTL, &keep).unwrap().plan_requests,
        0
    );
    assert!(exists(s, &ready.request_id) && exists(s, &pending.request_id));
    let other = storage::Generation::parse(G2).unwrap();
    assert!(
        s.allocate_request(&at(3), &other, LEASE, NOW + 100 * TTL)
            .unwrap()
            .is_err(),
        "still held by its pending request"
    );

    // The plan row stays: its revision is still 3, and the next advance makes it 4, never 1 again.
    assert_eq!(
        s.plan(&plan).unwrap().map(|p| p.revision),
        Some(Revision::new(3))
    );
    let moved = s.import(&import(true), NOW + 100 * TTL).unwrap();
    assert_eq!(
        (moved.created, moved.plan.revision),
        (false, Revision::new(4))
    );
    // That import invalidated the last two; a TTL later they go as well, and the plan still stands.
    assert_eq!(
        s.prune(NOW + 101 * TTL, TTL, &keep).unwrap().plan_requests,
        2
    );
    assert_eq!(
        s.plan(&plan).unwrap().map(|p| p.revision),
        Some(Revision::new(4))
    );
}

// ---------------------------------------------------------------------------------------------
// Deletion fences, read in bulk
// ---------------------------------------------------------------------------------------------

/// `killed_among` answers exactly the fenced ids among those asked — a live run killed, a finished run
/// killed and purged (its fence outlives every row), never a live or finished run nobody killed — each
/// once and sorted, whatever the order, repeats or number of ids asked (past one statement's chunk).
fn killed_among_answers_exactly_the_fenced_ids_asked_about<S: Ledger>(s: &mut S) {
    assert_eq!(
        s.killed_among(&[]).unwrap(),
        Vec::<String>::new(),
        "nothing asked, nothing read"
    );
    go_live(s, "live-killed", "C1:a", G1, NOW);
    go_live(s, "live-kept", "C1:b", G1, NOW);
    assert!(
        s.put(
            &record("done-killed", "C1:c", NOW, NOW + 1, vec![ev(1, "x")]),
            None,
            NOW + 1
        )
        .unwrap()
        .stored
    );
    assert!(
        s.put(
            &record("done-kept", "C1:d", NOW, NOW + 1, vec![ev(1, "x")]),
            None,
            NOW + 1
        )
        .unwrap()
        .stored
    );
    let asked: Vec<RunId> = [
        "live-kept",
        "done-killed",
        "never-seen",
        "live-killed",
        "done-kept",
        "live-killed",
    ]
    .map(RunId::from)
    .to_vec();
    assert_eq!(
        s.killed_among(&asked).unwrap(),
        Vec::<RunId>::new(),
        "no fence yet"
    );
    s.kill(&RunId::from("live-killed"), NOW + 2).unwrap();
    s.kill(&RunId::from("done-killed"), NOW + 2).unwrap();
    assert!(s.purge(&RunId::from("done-killed")).unwrap());
    assert_eq!(
        s.killed_among(&asked).unwrap(),
        ["done-killed", "live-killed"]
    );
    // Only what was asked: a fenced id not in the question is not in the answer.
    assert_eq!(
        s.killed_among(&[RunId::from("live-kept"), RunId::from("done-killed")])
            .unwrap(),
        ["done-killed"]
    );
    // Many ids: fences spread over several chunks are all found, the answer still sorted and unique.
    let many: Vec<RunId> = (0..1_300)
        .map(|i| RunId::from(format!("bulk-{i:04}")))
        .collect();
    for id in many.iter().step_by(97) {
        s.kill(id, NOW + 3).unwrap();
    }
    let mut question = many.clone();
    question.extend(asked);
    question.reverse();
    let mut expected: Vec<RunId> = many.iter().step_by(97).cloned().collect();
    expected.extend([RunId::from("done-killed"), RunId::from("live-killed")]);
    expected.sort();
    assert_eq!(s.killed_among(&question).unwrap(), expected);
    // A read: the live run nobody killed is untouched.
    assert_eq!(live_row(s, "live-kept").stop, None);
}

/// The ledger's `finish` writes the record through the same upsert as `put` (SPEC §12): a finished record
/// whose status card waits for its closing frame is on the orphan sweep's worklist, its tombstone never
/// was, and closing the card keeps the record's events.
fn a_finished_record_with_an_open_card_is_on_the_orphan_sweeps_worklist<S: Ledger>(s: &mut S) {
    let card = json!({"channel": "C1", "ts": "1700000000.000100"});
    go_live(s, "run-a", "C1:t1", G1, NOW);
    let mut tomb = tombstone("run-a", "C1:t1", NOW, vec![]);
    tomb.head.extra.insert("card".into(), card.clone());
    assert!(s.put(&tomb, None, NOW).unwrap().stored);
    assert_eq!(
        s.open_cards(NOW + 10_000, 100, NOW).unwrap(),
        Vec::<String>::new(),
        "a tombstone's card is its live run's"
    );
    assert_eq!(
        s.finishing(
            &RunId::from("run-a"),
            G1,
            RunStatus::Completed,
            Some("done")
        )
        .unwrap(),
        Ok(())
    );
    let mut rec = record(
        "run-a",
        "C1:t1",
        NOW,
        NOW + 1_000,
        vec![ev(1, "one"), ev(2, "answer")],
    );
    rec.head.extra.insert("card".into(), card);
    let out = s
        .finish(&RunId::from("run-a"), G1, &rec, None, NOW + 1_000)
        .unwrap()
        .expect("owner finish");
    assert!(out.stored, "{out:?}");
    assert_eq!(
        s.open_cards(NOW + 1_000, 100, NOW + 1_000).unwrap(),
        ["run-a"]
    );
    assert_eq!(
        s.open_cards(NOW + 999, 100, NOW + 1_000).unwrap(),
        Vec::<String>::new()
    );
    assert!(s.close_card(&RunId::from("run-a")).unwrap());
    assert!(!s.close_card(&RunId::from("run-a")).unwrap());
    let got = s
        .get(&RunId::from("run-a"), NOW + 1_000)
        .unwrap()
        .expect("the record");
    assert_eq!(got.head.extra.get("cardClosed"), Some(&json!(true)));
    assert_eq!(got.events, rec.events);
    assert_eq!(
        s.open_cards(NOW + 1_000, 100, NOW + 1_000).unwrap(),
        Vec::<String>::new()
    );
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[test] fn $case() { super::$case(&mut storage::MemoryStore::new()); })*
        }
        mod sqlite {
            $(#[test] fn $case() {
                let dir = tempfile::tempdir().expect("tempdir");
                let mut s = storage::SqliteStore::open(&dir.path().join("t.db"), storage::Synchronous::Normal).expect("open");
                super::$case(&mut s);
            })*
        }
        mod postgres {
            $(#[test] fn $case() {
                let mut s = storage::PgStore::open(&storage::testing::pg::database()).expect("open");
                super::$case(&mut s);
            })*
        }
    };
}

contract!(
    admit_on_a_free_thread_reserves_an_attaching_row_and_a_second_admit_steers_into_its_inbox,
    one_live_row_per_thread_whatever_the_number_of_admissions,
    a_keyed_admit_retried_returns_the_stored_answer_and_appends_once,
    the_same_key_with_another_body_is_a_key_conflict_and_keys_are_scoped,
    a_keyed_admit_to_a_finishing_run_is_busy_and_an_unkeyed_one_is_steered,
    a_message_from_a_writer_who_may_not_see_the_live_run_is_forbidden_and_writes_nothing,
    claim_promotes_the_owners_reservation_and_keeps_identity_start_and_meta,
    re_claim_by_the_owner_is_idempotent_and_changes_nothing,
    claim_by_another_generation_is_fenced_and_of_an_unknown_run_is_unknown_run,
    every_owner_write_from_another_generation_is_fenced_and_changes_nothing,
    every_owner_write_on_a_run_without_a_row_is_unknown_run_and_writes_nothing,
    an_expired_lease_alone_never_fences_the_owner,
    append_is_keyed_by_seq_and_an_identical_retry_is_a_no_op,
    an_oversized_or_unsequenced_event_is_refused_alone,
    step_records_are_keyed_by_step_and_reclaim_answers_the_highest,
    successor_facts_read_the_row_the_highest_step_and_the_inbox_in_order,
    a_seal_gate_refuses_as_finishing_does_and_answers_the_successor_facts,
    a_step_writes_turns_events_state_and_record_and_a_refusal_stops_before_the_record,
    transcript_turns_read_back_in_order_and_are_never_edited,
    a_transcript_with_a_missing_turn_reads_back_to_the_gap_and_names_it,
    an_oversized_transcript_part_is_refused_by_name_and_nothing_of_the_batch_lands,
    set_state_merges_by_top_level_key,
    heartbeat_extends_only_the_owners_lease_and_relays_stop_and_phase,
    request_stop_is_not_fenced_keeps_the_strongest_mode_and_says_whether_the_owner_lease_is_live,
    handoff_marks_only_this_generations_live_rows,
    finishing_commits_status_and_answer_once,
    a_busy_thread_steers_queues_rejects_or_interrupts_as_the_message_says,
    a_full_queue_refuses_the_next_queued_message_and_writes_nothing,
    a_stop_recorded_before_the_gate_refuses_a_completed_gate,
    approvals_park_decide_once_and_unpark,
    handoff_then_finishing_is_allowed_for_the_owner,
    finish_stores_the_record_removes_the_live_rows_and_frees_the_thread_at_once,
    finish_by_a_zombie_generation_after_a_reclaim_is_fenced_and_changes_nothing,
    finish_of_a_record_under_another_id_changes_nothing,
    finished_run_reads_never_see_a_live_runs_events,
    abandon_drops_the_reservation_without_a_record,
    abandon_after_a_tombstone_leaves_the_tombstone_and_frees_the_thread,
    inbox_is_not_fenced_and_reads_strictly_after_the_cursor,
    reclaim_takes_expired_handed_off_and_dead_owner_rows_and_never_its_own,
    reclaim_answers_last_step_unread_inbox_and_state,
    after_a_reclaim_every_owner_write_of_the_old_generation_is_fenced,
    a_second_generation_reclaiming_after_the_first_sees_its_rows_live_elsewhere,
    a_run_the_reclaimer_still_drives_is_left_alone_until_it_does_not,
    generations_round_trip,
    killed_among_answers_exactly_the_fenced_ids_asked_about,
    finish_leaves_no_transcript_steps_or_inbox_rows_of_the_run,
    abandon_and_purge_leave_no_transcript_steps_or_inbox_rows,
    receipts_are_pruned_a_ttl_after_their_run_ended_and_younger_ones_kept,
    dead_generations_are_pruned_and_live_ones_and_ones_owning_rows_kept,
    deletion_fences_are_pruned_a_ttl_after_the_kill_once_their_run_is_purged,
    plan_requests_in_a_terminal_state_are_pruned_a_ttl_after_they_settled_and_plans_never,
    a_finished_record_with_an_open_card_is_on_the_orphan_sweeps_worklist,
);

/// SQLite only: what the trait cannot show. Finish deletes the run's `live_runs`, `run_steps`,
/// `transcript` and `run_inbox` rows in its transaction and keeps the receipts, stamped with the run's
/// end (SPEC §4.3 finish).
#[test]
fn sqlite_finish_deletes_the_ledger_rows_and_stamps_the_receipts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).expect("open");
    let a = keyed(
        admission("C1:t1", G1, &RunId::from("run-a"), "hello"),
        "tok",
        "k1",
        "h1",
    );
    assert_eq!(s.admit(&a, NOW).unwrap(), started("run-a"));
    promote(&mut s, "run-a", G1, NOW);
    furnish(&mut s, "run-a", G1);
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(1, 4, Some(1)))
            .unwrap(),
        Ok(())
    );
    let count = |s: &mut SqliteStore, table: &str| -> i64 {
        s.connection()
            .query_row(
                &format!("SELECT count(*) FROM {table} WHERE run_id = 'run-a'"),
                [],
                |r| r.get(0),
            )
            .expect("count")
    };
    assert_eq!(count(&mut s, "run_steps"), 2);
    let ended = |s: &mut SqliteStore| -> Option<i64> {
        s.connection()
            .query_row(
                "SELECT ended_at FROM admit_receipts WHERE run_id = 'run-a'",
                [],
                |r| r.get(0),
            )
            .expect("receipt")
    };
    assert_eq!(ended(&mut s), None, "a live run's receipt carries no end");
    let rec = record("run-a", "C1:t1", NOW, NOW + 1, vec![ev(1, "one")]);
    assert!(s
        .finish(&RunId::from("run-a"), G1, &rec, None, NOW + 1)
        .unwrap()
        .is_ok());
    assert_eq!(count(&mut s, "live_runs"), 0);
    assert_eq!(
        count(&mut s, "run_steps"),
        0,
        "finish deletes the step records"
    );
    assert_eq!(
        count(&mut s, "transcript"),
        0,
        "finish deletes the transcript"
    );
    assert_eq!(count(&mut s, "run_inbox"), 0, "finish deletes the inbox");
    assert_eq!(count(&mut s, "admit_receipts"), 1, "receipts stay");
    assert_eq!(ended(&mut s), Some(NOW + 1), "stamped with the run's end");
}

/// SQLite only: rows an older build's finish left behind (transcript, steps, inbox of runs without a
/// live row) go at the next prune, a bounded number of runs per pass; a live run's rows never.
#[test]
fn sqlite_prune_takes_rows_an_older_finish_left_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).expect("open");
    go_live(&mut s, "run-live", "C1:t1", G1, NOW);
    furnish(&mut s, "run-live", G1);
    let n = storage::ledger::PRUNE_LEFTOVER_RUNS + 20;
    {
        let conn = s.connection();
        let tx = conn.transaction().unwrap();
        for i in 0..n {
            let run = format!("old-{i:04}");
            tx.execute(
                "INSERT INTO transcript (run_id, idx, part, json) VALUES (?1, 0, 0, '{}')",
                [&run],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO run_steps (run_id, step, json) VALUES (?1, 0, '{}')",
                [&run],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO run_inbox (run_id, seq, json) VALUES (?1, 1, '{}')",
                [&run],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let first = s.prune(NOW, TTL, &[G1.to_owned()]).unwrap();
    assert_eq!(
        first.leftover_runs as usize,
        storage::ledger::PRUNE_LEFTOVER_RUNS,
        "bounded per pass"
    );
    let second = s.prune(NOW, TTL, &[G1.to_owned()]).unwrap();
    assert_eq!(second.leftover_runs, 20);
    assert_eq!(
        s.prune(NOW, TTL, &[G1.to_owned()]).unwrap().leftover_runs,
        0
    );
    let rows = s.table_rows().unwrap();
    assert_eq!(
        (rows.transcript, rows.run_steps, rows.run_inbox),
        (2, 1, 1),
        "only the live run's rows stay"
    );
}

/// SQLite only: a backlog of old fences and settled plan requests goes [`PRUNE_BATCH`] rows of each per
/// pass, so one prune stays a short transaction; the next pass takes the rest.
///
/// [`PRUNE_BATCH`]: storage::ledger::PRUNE_BATCH
#[test]
fn sqlite_prune_takes_a_backlog_of_fences_and_plan_requests_a_batch_a_pass() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).expect("open");
    let n = storage::ledger::PRUNE_BATCH + 5;
    {
        let conn = s.connection();
        let tx = conn.transaction().unwrap();
        for i in 0..n {
            tx.execute(
                "INSERT INTO deletion_fences (run_id, at) VALUES (?1, ?2)",
                rusqlite::params![format!("gone-{i:05}"), NOW],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO plan_requests (request_id, plan_id, revision, snapshot_id, state, reason, created_at, settled_at)
                 VALUES (?1, 'p', 1, 's', 'failed', 'timeout', ?2, ?2)",
                rusqlite::params![format!("pr_{i:05}"), NOW],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let first = s.prune(NOW + TTL, TTL, &[]).unwrap();
    assert_eq!(
        (first.deletion_fences as usize, first.plan_requests as usize),
        (storage::ledger::PRUNE_BATCH, storage::ledger::PRUNE_BATCH)
    );
    let second = s.prune(NOW + TTL, TTL, &[]).unwrap();
    assert_eq!((second.deletion_fences, second.plan_requests), (5, 5));
    assert_eq!(
        s.prune(NOW + TTL, TTL, &[]).unwrap(),
        PruneReport::default()
    );
}

/// SQLite only: a file whose receipts predate the end stamp (migration 6) reads them as unended; the
/// first prune stamps those of runs no longer live, and their TTL runs from then.
#[test]
fn sqlite_receipts_from_before_the_end_stamp_get_one_at_the_first_prune() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = SqliteStore::open(&dir.path().join("t.db"), Synchronous::Normal).expect("open");
    s.connection()
        .execute_batch(
            "INSERT INTO admit_receipts (scope, key, body_hash, run_id, outcome, seq, answer_json)
             VALUES ('tok', 'old', 'h', 'gone-run', 'started', NULL, '{\"outcome\":\"started\",\"runId\":\"gone-run\"}');",
        )
        .unwrap();
    assert_eq!(
        s.prune(NOW, TTL, &[]).unwrap().receipts,
        0,
        "stamped, not pruned"
    );
    assert_eq!(s.prune(NOW + TTL - 1, TTL, &[]).unwrap().receipts, 0);
    assert_eq!(s.prune(NOW + TTL, TTL, &[]).unwrap().receipts, 1);
}

/// PostgreSQL: what the trait cannot show, as `sqlite_finish_deletes_the_ledger_rows_and_stamps_the_receipts`.
#[test]
fn postgres_finish_deletes_the_ledger_rows_and_stamps_the_receipts() {
    let mut s = storage::PgStore::open(&storage::testing::pg::database()).expect("open");
    let a = keyed(
        admission("C1:t1", G1, &RunId::from("run-a"), "hello"),
        "tok",
        "k1",
        "h1",
    );
    assert_eq!(s.admit(&a, NOW).unwrap(), started("run-a"));
    promote(&mut s, "run-a", G1, NOW);
    furnish(&mut s, "run-a", G1);
    assert_eq!(
        s.step(&RunId::from("run-a"), G1, &step_record(1, 4, Some(1)))
            .unwrap(),
        Ok(())
    );
    let count = |s: &mut storage::PgStore, table: &str| -> i64 {
        s.connection()
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE run_id = 'run-a'"),
                &[],
            )
            .expect("count")
            .get(0)
    };
    assert_eq!(count(&mut s, "run_steps"), 2);
    let ended = |s: &mut storage::PgStore| -> Option<i64> {
        s.connection()
            .query_one(
                "SELECT ended_at FROM admit_receipts WHERE run_id = 'run-a'",
                &[],
            )
            .expect("receipt")
            .get(0)
    };
    assert_eq!(ended(&mut s), None, "a live run's receipt carries no end");
    let rec = record("run-a", "C1:t1", NOW, NOW + 1, vec![ev(1, "one")]);
    assert!(s
        .finish(&RunId::from("run-a"), G1, &rec, None, NOW + 1)
        .unwrap()
        .is_ok());
    assert_eq!(count(&mut s, "live_runs"), 0);
    assert_eq!(
        count(&mut s, "run_steps"),
        0,
        "finish deletes the step records"
    );
    assert_eq!(
        count(&mut s, "transcript"),
        0,
        "finish deletes the transcript"
    );
    assert_eq!(count(&mut s, "run_inbox"), 0, "finish deletes the inbox");
    assert_eq!(count(&mut s, "admit_receipts"), 1, "receipts stay");
    assert_eq!(ended(&mut s), Some(NOW + 1), "stamped with the run's end");
}

/// PostgreSQL: as `sqlite_prune_takes_rows_an_older_finish_left_behind` — rows without a live run go,
/// a bounded number of runs per pass; a live run's rows never.
#[test]
fn postgres_prune_takes_rows_left_behind_without_a_live_run() {
    let mut s = storage::PgStore::open(&storage::testing::pg::database()).expect("open");
    go_live(&mut s, "run-live", "C1:t1", G1, NOW);
    furnish(&mut s, "run-live", G1);
    let n = storage::ledger::PRUNE_LEFTOVER_RUNS + 20;
    {
        let mut tx = s.connection().transaction().unwrap();
        for i in 0..n {
            let run = format!("old-{i:04}");
            tx.execute(
                "INSERT INTO transcript (run_id, idx, part, json) VALUES ($1, 0, 0, '{}')",
                &[&run],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO run_steps (run_id, step, json) VALUES ($1, 0, '{}')",
                &[&run],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO run_inbox (run_id, seq, json) VALUES ($1, 1, '{}')",
                &[&run],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let first = s.prune(NOW, TTL, &[G1.to_owned()]).unwrap();
    assert_eq!(
        first.leftover_runs as usize,
        storage::ledger::PRUNE_LEFTOVER_RUNS,
        "bounded per pass"
    );
    let second = s.prune(NOW, TTL, &[G1.to_owned()]).unwrap();
    assert_eq!(second.leftover_runs, 20);
    assert_eq!(
        s.prune(NOW, TTL, &[G1.to_owned()]).unwrap().leftover_runs,
        0
    );
    let rows = s.table_rows().unwrap();
    assert_eq!(
        (rows.transcript, rows.run_steps, rows.run_inbox),
        (2, 1, 1),
        "only the live run's rows stay"
    );
}

// Keep the imports used by the macro's expansions visible to the compiler's unused-import check.
#[allow(dead_code)]
fn _implementations(_: MemoryStore, _: Option<SqliteStore>, _: Synchronous) {}

// ---- kill and purge (SPEC §4.3, §5.6) ----

mod kill {
    use serde_json::json;
    use storage::ledger::{Admit, AdmitOutcome, Promotion, Refusal, RunLedger, StopMode};
    use storage::record::{validate_record, VisibilityFilter};
    use storage::store::{ListQuery, RunStore};
    use storage::RunId;

    const NOW: i64 = 1_800_000_000_000;

    fn admit(s: &mut (impl RunLedger + ?Sized), id: &str, thread: &str, gen: &str) {
        let a = Admit {
            thread_key: thread.into(),
            gen: gen.into(),
            run_id: id.into(),
            request: json!({"text": "x"}),
            meta: json!({"agent": "demo", "request": {"text": "x"}}),
            key: None,
            lease_ms: 30_000,
            writer: None,
            strategy: storage::ledger::Strategy::Steer,
        };
        assert_eq!(
            s.admit(&a, NOW).unwrap(),
            AdmitOutcome::Started { run_id: id.into() }
        );
    }

    fn record(id: &str) -> storage::record::RunRecord {
        validate_record(&json!({"id": id, "channelId": "c", "userId": "u", "threadKey": "c:t", "startedAt": NOW,
            "finishedAt": NOW, "status": "completed", "eventCount": 1, "storedEventCount": 1, "truncated": false,
            "events": [{"type": "answer", "seq": 1, "at": NOW, "text": "x"}]}))
        .unwrap()
    }

    pub fn a_kill_fences_the_owner_and_refuses_every_later_write<S: RunLedger + RunStore>(
        s: &mut S,
    ) {
        admit(s, "k1", "c:t", "g1");
        let p = Promotion {
            system_text: "s".into(),
            tools: json!([]),
            state: Default::default(),
            lease_ms: 30_000,
        };
        s.claim(&RunId::from("k1"), "g1", &p, NOW).unwrap().unwrap();
        s.append(
            &RunId::from("k1"),
            "g1",
            &[json!({"type": "input", "seq": 1})],
        )
        .unwrap()
        .unwrap();
        let answer = s.kill(&RunId::from("k1"), NOW + 1).unwrap();
        assert_eq!(answer.live_owner.as_deref(), Some("g1"));
        assert!(answer.owner_lease_live && !answer.had_record);
        assert!(s.is_killed(&RunId::from("k1")).unwrap());
        assert_eq!(
            s.get_live(&RunId::from("k1")).unwrap().unwrap().stop,
            Some(StopMode::Hard)
        );
        // The owner is fenced on its next write and on its heartbeat; no record can land.
        assert!(matches!(
            s.heartbeat(&RunId::from("k1"), "g1", 30_000, NOW + 2)
                .unwrap(),
            Err(Refusal::Fenced { .. })
        ));
        assert!(matches!(
            s.append(
                &RunId::from("k1"),
                "g1",
                &[json!({"type": "note", "seq": 2})]
            )
            .unwrap(),
            Err(Refusal::Fenced { .. })
        ));
        assert!(matches!(
            s.finish(&RunId::from("k1"), "g1", &record("k1"), None, NOW + 3)
                .unwrap(),
            Err(Refusal::Fenced { .. })
        ));
        assert!(!s.put(&record("k1"), None, NOW + 3).unwrap().stored);
        // Purge deletes the live rows, record and events; the thread is free; the id stays dead.
        assert!(s.purge(&RunId::from("k1")).unwrap());
        assert_eq!(s.get_live(&RunId::from("k1")).unwrap(), None);
        assert_eq!(s.get(&RunId::from("k1"), NOW + 4).unwrap(), None);
        assert!(s
            .list(&ListQuery::visible_to(VisibilityFilter::All), NOW + 4)
            .unwrap()
            .items
            .is_empty());
        assert_eq!(
            s.admit(
                &Admit {
                    thread_key: "c:t".into(),
                    gen: "g2".into(),
                    run_id: "k1".into(),
                    request: json!({}),
                    meta: json!({}),
                    key: None,
                    lease_ms: 1,
                    writer: None,
                    strategy: storage::ledger::Strategy::Steer,
                },
                NOW + 5
            )
            .unwrap(),
            AdmitOutcome::Fenced
        );
        admit(s, "k2", "c:t", "g2");
    }

    pub fn killing_a_finished_run_purges_its_record_and_an_unfenced_purge_does_nothing<
        S: RunLedger + RunStore,
    >(
        s: &mut S,
    ) {
        s.put(&record("done"), None, NOW).unwrap();
        assert!(
            !s.purge(&RunId::from("done")).unwrap(),
            "no fence, no purge"
        );
        assert!(s.get(&RunId::from("done"), NOW).unwrap().is_some());
        let answer = s.kill(&RunId::from("done"), NOW).unwrap();
        assert!(answer.had_record && answer.live_owner.is_none());
        assert!(s.purge(&RunId::from("done")).unwrap());
        assert_eq!(s.get(&RunId::from("done"), NOW).unwrap(), None);
        assert!(!s.kill(&RunId::from("never"), NOW).unwrap().had_record);
    }

    #[test]
    fn memory_kill() {
        a_kill_fences_the_owner_and_refuses_every_later_write(&mut storage::MemoryStore::new());
        killing_a_finished_run_purges_its_record_and_an_unfenced_purge_does_nothing(
            &mut storage::MemoryStore::new(),
        );
    }

    #[test]
    fn sqlite_kill() {
        let dir = tempfile::tempdir().unwrap();
        let mut s =
            storage::SqliteStore::open(&dir.path().join("a.db"), storage::Synchronous::Normal)
                .unwrap();
        a_kill_fences_the_owner_and_refuses_every_later_write(&mut s);
        let mut s =
            storage::SqliteStore::open(&dir.path().join("b.db"), storage::Synchronous::Normal)
                .unwrap();
        killing_a_finished_run_purges_its_record_and_an_unfenced_purge_does_nothing(&mut s);
    }

    #[test]
    fn postgres_kill() {
        let mut s = storage::PgStore::open(&storage::testing::pg::database()).unwrap();
        a_kill_fences_the_owner_and_refuses_every_later_write(&mut s);
        let mut s = storage::PgStore::open(&storage::testing::pg::database()).unwrap();
        killing_a_finished_run_purges_its_record_and_an_unfenced_purge_does_nothing(&mut s);
    }
}

// ---- keyed receipts per run (SPEC §5.1) ----

mod receipt_limit {
    use serde_json::json;
    use storage::ledger::{Admit, AdmitOutcome, ReceiptKey, RunLedger, MAX_RECEIPTS_PER_RUN};
    use storage::RunId;

    const NOW: i64 = 1_800_000_000_000;

    fn keyed(key: &str, run_id: &RunId) -> Admit {
        Admit {
            thread_key: "c:t".into(),
            gen: "g1".into(),
            run_id: run_id.clone(),
            request: json!({"text": key}),
            meta: json!({"agent": "demo", "request": {"text": key}}),
            key: Some(ReceiptKey {
                scope: "tok".into(),
                key: key.into(),
                body_hash: format!("h-{key}"),
            }),
            lease_ms: 30_000,
            writer: None,
            strategy: storage::ledger::Strategy::Steer,
        }
    }

    pub fn a_run_holds_at_most_256_keyed_receipts_and_never_evicts_one<S: RunLedger>(s: &mut S) {
        assert_eq!(
            s.admit(&keyed("k0", &RunId::from("live")), NOW).unwrap(),
            AdmitOutcome::Started {
                run_id: "live".into()
            }
        );
        for i in 1..MAX_RECEIPTS_PER_RUN {
            let out = s
                .admit(&keyed(&format!("k{i}"), &RunId::from(format!("x{i}"))), NOW)
                .unwrap();
            assert!(matches!(out, AdmitOutcome::Steered { .. }), "{i}: {out:?}");
        }
        // The 257th key is held: nothing appended to the inbox.
        let held = s
            .admit(&keyed("one-too-many", &RunId::from("y")), NOW)
            .unwrap();
        assert_eq!(
            held,
            AdmitOutcome::ReceiptLimit {
                run_id: "live".into()
            }
        );
        let inbox = s.read_inbox(&RunId::from("live"), None).unwrap().unwrap();
        assert_eq!(inbox.len(), MAX_RECEIPTS_PER_RUN - 1);
        // Earlier keys still answer verbatim.
        let again = s.admit(&keyed("k1", &RunId::from("z")), NOW).unwrap();
        assert_eq!(
            again,
            AdmitOutcome::Steered {
                run_id: "live".into(),
                seq: 1
            }
        );
        // An unkeyed follow-up is still steered.
        let mut plain = keyed("plain", &RunId::from("w"));
        plain.key = None;
        assert!(matches!(
            s.admit(&plain, NOW).unwrap(),
            AdmitOutcome::Steered { .. }
        ));
    }

    #[test]
    fn memory_receipt_limit() {
        a_run_holds_at_most_256_keyed_receipts_and_never_evicts_one(
            &mut storage::MemoryStore::new(),
        );
    }

    #[test]
    fn sqlite_receipt_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut s =
            storage::SqliteStore::open(&dir.path().join("r.db"), storage::Synchronous::Normal)
                .unwrap();
        a_run_holds_at_most_256_keyed_receipts_and_never_evicts_one(&mut s);
    }

    #[test]
    fn postgres_receipt_limit() {
        let mut s = storage::PgStore::open(&storage::testing::pg::database()).unwrap();
        a_run_holds_at_most_256_keyed_receipts_and_never_evicts_one(&mut s);
    }
}
