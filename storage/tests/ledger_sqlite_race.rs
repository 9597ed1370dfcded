//! Real concurrency on one SQLite file (SPEC §4.3 reclaim: "Two generations reclaiming at once: exactly
//! one wins each row"; §1.2: refusals are decided inside the immediate transaction).
//!
//! Two `SqliteStore` handles on the same database file, in two threads released by one `Barrier`, race
//! `reclaim` over the same set of expired rows, round after round. A third handle plays the dead
//! generation that admitted the rows, then the zombie whose writes after the reclaim must be refused
//! `Fenced` and change nothing on disk (read back through a fresh read-only handle, which can write
//! nothing itself).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Barrier;

use serde_json::{json, Value};
use storage::ledger::{Admit, AdmitOutcome, Claimed, InFlight, Promotion, ReclaimAnswer, Refusal, RunLedger, StepRecord};
use storage::record::validate_record;
use storage::store::RunStore;
use storage::{SqliteStore, Synchronous};

const NOW: i64 = 1_800_000_000_000;
const LEASE: i64 = 30_000;
const ROUNDS: usize = 100;
const ROWS: usize = 5;

const DEAD: &str = "20270115T080000Z-deaddead";
const GEN_A: &str = "20270115T090000Z-aaaaaaaa";
const GEN_B: &str = "20270115T100000Z-bbbbbbbb";

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, Synchronous::Normal).expect("open")
}

fn admission(thread: &str, run_id: &str, now: i64) -> Admit {
    let request = json!({"thread": thread, "channel": "C1", "user": "U1", "text": "hello"});
    Admit {
        thread_key: thread.to_owned(),
        gen: DEAD.to_owned(),
        run_id: run_id.to_owned(),
        request: request.clone(),
        meta: json!({
            "agent": "demo", "model": "m1", "label": "race", "threadKey": thread, "channelId": "C1",
            "userId": "U1", "channelVisibility": "public", "deadline": now + 600_000, "request": request
        }),
        key: None,
        lease_ms: LEASE,
    }
}

fn ev(seq: u64, text: &str) -> Value {
    json!({"type": "note", "seq": seq, "at": NOW, "kind": "progress", "summary": text})
}

fn step(step: u64) -> StepRecord {
    StepRecord {
        step,
        seq: step,
        turn_index: 2 * step + 1,
        in_flight: vec![InFlight { call_id: format!("c{step}"), tool: "search".to_owned() }],
        inbox_consumed_seq: None,
        remaining_ms: 1_000,
        turn: step,
        iteration: step,
    }
}

fn taken_ids(a: &ReclaimAnswer) -> BTreeSet<String> {
    a.taken.iter().map(|t| t.row.run_id.clone()).collect()
}

#[test]
fn two_processes_reclaiming_the_same_expired_rows_each_row_has_exactly_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("race.db");
    let mut dead = open(&path);
    let mut a = open(&path);
    let mut b = open(&path);
    let mut wins = [0usize; 2];

    for round in 0..ROUNDS {
        // The dead generation admits and promotes fresh rows, with an event and a step each.
        let t0 = NOW + round as i64 * 10 * LEASE;
        let ids: Vec<String> = (0..ROWS).map(|i| format!("r{round:03}-{i}")).collect();
        for (i, id) in ids.iter().enumerate() {
            let thread = format!("C1:r{round}-{i}");
            assert_eq!(
                dead.admit(&admission(&thread, id, t0), t0).unwrap(),
                AdmitOutcome::Started { run_id: id.clone() }
            );
            let p = Promotion { system_text: "sys".into(), tools: json!([]), state: Default::default(), lease_ms: LEASE };
            assert_eq!(dead.claim(id, DEAD, &p, t0).unwrap(), Ok(Claimed::Promoted));
            assert_eq!(dead.append(id, DEAD, &[ev(1, "one")]).unwrap(), Ok(()));
            assert_eq!(dead.step(id, DEAD, &step(1)).unwrap(), Ok(()));
        }
        // Both survivors reclaim at the lease end (equal-now is expired), released together.
        let at = t0 + LEASE;
        let barrier = Barrier::new(2);
        let (ans_a, ans_b) = std::thread::scope(|scope| {
            let ha = scope.spawn(|| {
                barrier.wait();
                a.reclaim(GEN_A, at, LEASE, &[]).expect("reclaim A")
            });
            let hb = scope.spawn(|| {
                barrier.wait();
                b.reclaim(GEN_B, at, LEASE, &[]).expect("reclaim B")
            });
            (ha.join().expect("thread A"), hb.join().expect("thread B"))
        });

        let (ta, tb) = (taken_ids(&ans_a), taken_ids(&ans_b));
        let want: BTreeSet<String> = ids.iter().cloned().collect();
        assert!(ta.is_disjoint(&tb), "round {round}: a row taken twice: A {ta:?} B {tb:?}");
        assert_eq!(ta.union(&tb).cloned().collect::<BTreeSet<_>>(), want, "round {round}: every row has a winner");
        for id in &ids {
            let (winner, loser) = if ta.contains(id) { (GEN_A, &ans_b) } else { (GEN_B, &ans_a) };
            let seen = loser.live_elsewhere.iter().find(|r| &r.run_id == id);
            let seen = seen.unwrap_or_else(|| panic!("round {round}: the loser does not report {id} as live elsewhere"));
            assert_eq!(seen.owner_gen, winner, "round {round}: {id} live elsewhere under the winner");
            assert_eq!(seen.lease_until, at + LEASE, "round {round}: {id} under the winner's fresh lease");
            let won = if winner == GEN_A { &ans_a } else { &ans_b };
            let t = won.taken.iter().find(|t| &t.row.run_id == id).unwrap();
            assert_eq!(t.prior_owner, DEAD);
            assert_eq!(t.last_step, Some(step(1)));
        }
        wins[0] += ta.len();
        wins[1] += tb.len();

        // The zombie (the dead generation, still running after all) is fenced on every write, and the
        // database — read through a fresh handle — holds exactly what the winner left.
        let z = &ids[0];
        let winner = if ta.contains(z) { GEN_A } else { GEN_B };
        let mut reader = SqliteStore::open_read_only(&path).expect("open a reader");
        let row_before = reader.get_live(z).unwrap().expect("row");
        let events_before = reader.live_events(z, 0, 100).unwrap();
        assert_eq!(dead.append(z, DEAD, &[ev(2, "zombie")]).unwrap(), Err(Refusal::Fenced { run_id: z.clone() }));
        assert_eq!(dead.step(z, DEAD, &step(2)).unwrap(), Err(Refusal::Fenced { run_id: z.clone() }));
        let rec = validate_record(&json!({
            "id": z, "channelId": "C1", "userId": "U1", "threadKey": format!("C1:r{round}-0"),
            "channelVisibility": "public", "startedAt": t0, "finishedAt": at + 1, "status": "completed",
            "eventCount": 1, "storedEventCount": 1, "truncated": false, "events": [ev(1, "zombie final")]
        }))
        .unwrap();
        assert_eq!(dead.finish(z, DEAD, &rec, None, at + 1).unwrap(), Err(Refusal::Fenced { run_id: z.clone() }));
        let mut reader = SqliteStore::open_read_only(&path).expect("open a reader");
        assert_eq!(reader.get_live(z).unwrap(), Some(row_before.clone()), "round {round}: zombie changed the row");
        assert_eq!(row_before.owner_gen, winner);
        assert_eq!(reader.live_events(z, 0, 100).unwrap(), events_before);
        assert_eq!(events_before.map(|e| e.len()), Some(1));
        assert_eq!(reader.get(z, at + 1).unwrap(), None, "round {round}: the zombie's finish wrote a record");

        // The winners clean up, so the next round starts from an empty ledger.
        for id in &ids {
            let (h, g) = if ta.contains(id) { (&mut a, GEN_A) } else { (&mut b, GEN_B) };
            assert_eq!(h.abandon(id, g).unwrap(), Ok(()), "round {round}: {id}");
        }
        assert!(reader.list_live().unwrap().is_empty());
    }
    // Not an assertion of fairness, just a note in the output of who won how often.
    eprintln!("rows won: A {} B {}", wins[0], wins[1]);
}
