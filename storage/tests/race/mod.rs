//! What the ledger race tests share, whatever the backend: the fixtures (the dead generation, the
//! surviving generations, an admission, a promotion, an event, a step record, a round's rows the dead
//! generation left), [`contend`] (one thread per store, released together) and the reclaim race itself,
//! round after round ([`reclaim_rounds`]).
//!
//! Each race test passes its own stores — SQLite handles on one file, PostgreSQL connections on one
//! database — so one round structure is asserted against every backend (SPEC §4.3 reclaim: "Two
//! generations reclaiming at once: exactly one wins each row").

// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Barrier;
use storage::RunId;

use serde_json::{json, Value};
use storage::ledger::{
    Admit, AdmitOutcome, Claimed, InFlight, Promotion, ReclaimAnswer, Refusal, RunLedger,
    StepRecord,
};
use storage::record::validate_record;
use storage::store::RunStore;

pub const NOW: i64 = 1_800_000_000_000;
pub const LEASE: i64 = 30_000;
/// Rows the dead generation leaves behind per round.
pub const ROWS: usize = 5;

/// The generation that admitted the rows and died (or so the others think: its zombie writes later).
pub const DEAD: &str = "20270115T080000Z-deaddead";
/// The surviving generations, one per contender.
pub const GENS: [&str; 3] = [
    "20270115T090000Z-aaaaaaaa",
    "20270115T100000Z-bbbbbbbb",
    "20270115T110000Z-cccccccc",
];

pub fn admission(thread: &str, run_id: &RunId, gen: &str, now: i64) -> Admit {
    let request =
        json!({"thread": thread, "channel": "C1", "user": "U1", "text": format!("from {gen}")});
    Admit {
        thread_key: thread.to_owned(),
        gen: gen.to_owned(),
        run_id: run_id.to_owned(),
        request: request.clone(),
        meta: json!({
            "agent": "demo", "model": "m1", "label": "race", "threadKey": thread, "channelId": "C1",
            "userId": "U1", "channelVisibility": "public", "deadline": now + 600_000, "request": request
        }),
        key: None,
        lease_ms: LEASE,
        writer: None,
        strategy: storage::ledger::Strategy::Steer,
    }
}

pub fn promotion() -> Promotion {
    Promotion {
        system_text: "sys".into(),
        tools: json!([]),
        state: Default::default(),
        lease_ms: LEASE,
    }
}

pub fn ev(seq: u64, text: &str) -> Value {
    json!({"type": "note", "seq": seq, "at": NOW, "kind": "progress", "summary": text})
}

pub fn step(step: u64) -> StepRecord {
    StepRecord {
        step,
        seq: step,
        turn_index: 2 * step + 1,
        in_flight: vec![InFlight {
            call_id: format!("c{step}"),
            tool: "search".to_owned(),
        }],
        inbox_consumed_seq: None,
        remaining_ms: 1_000,
        turn: step,
        iteration: step,
    }
}

pub fn taken_ids(a: &ReclaimAnswer) -> BTreeSet<RunId> {
    a.taken.iter().map(|t| t.row.run_id.clone()).collect()
}

/// Run `f(i, store)` on one thread per store, released together; answers the results in order.
pub fn contend<S: Send, R: Send>(
    stores: &mut [S],
    f: impl Fn(usize, &mut S) -> R + Sync,
) -> Vec<R> {
    let barrier = Barrier::new(stores.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = stores
            .iter_mut()
            .enumerate()
            .map(|(i, s)| {
                let (barrier, f) = (&barrier, &f);
                scope.spawn(move || {
                    barrier.wait();
                    f(i, s)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("contender thread"))
            .collect()
    })
}

/// Round `round`'s [`ROWS`] rows, admitted and promoted by the dead generation at `t0`: ids
/// `<prefix><round:03>-<i>`, each on its own thread `C1:<prefix><round>-<i>`; with `progressed`, each also
/// with an event and a step record. Answers the ids.
pub fn dead_rows<S: RunLedger>(
    dead: &mut S,
    prefix: &str,
    round: usize,
    t0: i64,
    progressed: bool,
) -> Vec<String> {
    let ids: Vec<String> = (0..ROWS)
        .map(|i| format!("{prefix}{round:03}-{i}"))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let thread = format!("C1:{prefix}{round}-{i}");
        assert_eq!(
            dead.admit(&admission(&thread, &RunId::from(id), DEAD, t0), t0)
                .unwrap(),
            AdmitOutcome::Started {
                run_id: RunId::from(id.clone())
            }
        );
        assert_eq!(
            dead.claim(&RunId::from(id), DEAD, &promotion(), t0)
                .unwrap(),
            Ok(Claimed::Promoted)
        );
        if progressed {
            assert_eq!(
                dead.append(&RunId::from(id), DEAD, &[ev(1, "one")])
                    .unwrap(),
                Ok(())
            );
            assert_eq!(dead.step(&RunId::from(id), DEAD, &step(1)).unwrap(), Ok(()));
        }
    }
    ids
}

/// `rounds` rounds of one reclaim race. Each round the dead generation leaves [`ROWS`] fresh rows
/// ([`dead_rows`], an event and a step each); at the lease end `hosts[i]` reclaims as `GENS[i]`, all released
/// together. Asserts that every row has exactly one winner, that every loser sees it live elsewhere under
/// the winner's fresh lease, and that the zombie's writes (the dead generation, still running after all)
/// are refused `Fenced` and change nothing — read back through `reader()`, a fresh handle each time. The
/// winners then clean up, so the next round starts from an empty ledger. Answers the rows each host won.
pub fn reclaim_rounds<S, R>(
    dead: &mut S,
    hosts: &mut [S],
    rounds: usize,
    mut reader: impl FnMut() -> R,
) -> Vec<usize>
where
    S: RunLedger,
    R: RunLedger + RunStore,
{
    let gens = &GENS[..hosts.len()];
    let mut wins = vec![0usize; hosts.len()];
    for round in 0..rounds {
        let t0 = NOW + round as i64 * 10 * LEASE;
        let ids = dead_rows(dead, "r", round, t0, true);
        // Every survivor reclaims at the lease end (equal-now is expired), released together.
        let at = t0 + LEASE;
        let answers = contend(hosts, |i, s| {
            s.reclaim(gens[i], at, LEASE, &[], &[])
                .expect("a race is retried, never an error")
        });
        let taken: Vec<BTreeSet<RunId>> = answers.iter().map(taken_ids).collect();
        let want: BTreeSet<RunId> = ids.iter().map(RunId::from).collect();
        let mut all = BTreeSet::new();
        for t in &taken {
            assert!(
                t.is_disjoint(&all),
                "round {round}: a row taken twice: {taken:?}"
            );
            all.extend(t.iter().cloned());
        }
        assert_eq!(all, want, "round {round}: every row has a winner");
        let winner = |id: &String| {
            taken
                .iter()
                .position(|t| t.contains(id.as_str()))
                .expect("a winner")
        };
        for id in &ids {
            let w = winner(id);
            let t = answers[w]
                .taken
                .iter()
                .find(|t| &t.row.run_id == id)
                .unwrap();
            assert_eq!(
                (t.prior_owner.as_str(), t.last_step.clone()),
                (DEAD, Some(step(1)))
            );
            for (l, loser) in answers.iter().enumerate().filter(|(l, _)| *l != w) {
                let seen = loser.live_elsewhere.iter().find(|r| &r.run_id == id);
                let seen = seen.unwrap_or_else(|| {
                    panic!("round {round}: host {l} does not see {id} live elsewhere")
                });
                assert_eq!(
                    (seen.owner_gen.as_str(), seen.lease_until),
                    (gens[w], at + LEASE),
                    "round {round}: {id}"
                );
            }
            wins[w] += 1;
        }

        // The zombie is fenced on every write, and the database holds exactly what the winner left.
        let z = &ids[0];
        let mut before = reader();
        let row_before = before.get_live(&RunId::from(z)).unwrap().expect("row");
        let events_before = before.live_events(&RunId::from(z), 0, 100).unwrap();
        assert_eq!(
            dead.append(&RunId::from(z), DEAD, &[ev(2, "zombie")])
                .unwrap(),
            Err(Refusal::Fenced {
                run_id: RunId::from(z.clone())
            })
        );
        assert_eq!(
            dead.step(&RunId::from(z), DEAD, &step(2)).unwrap(),
            Err(Refusal::Fenced {
                run_id: RunId::from(z.clone())
            })
        );
        let rec = validate_record(&json!({
            "id": z, "channelId": "C1", "userId": "U1", "threadKey": format!("C1:r{round}-0"),
            "channelVisibility": "public", "startedAt": t0, "finishedAt": at + 1, "status": "completed",
            "eventCount": 1, "storedEventCount": 1, "truncated": false, "events": [ev(1, "zombie final")]
        }))
        .unwrap();
        assert_eq!(
            dead.finish(&RunId::from(z), DEAD, &rec, None, at + 1)
                .unwrap(),
            Err(Refusal::Fenced {
                run_id: RunId::from(z.clone())
            })
        );
        let mut after = reader();
        assert_eq!(
            after.get_live(&RunId::from(z)).unwrap(),
            Some(row_before.clone()),
            "round {round}: the zombie changed the row"
        );
        assert_eq!(row_before.owner_gen, gens[winner(z)]);
        assert_eq!(
            after.live_events(&RunId::from(z), 0, 100).unwrap(),
            events_before
        );
        assert_eq!(events_before.map(|e| e.len()), Some(1));
        assert_eq!(
            after.get(&RunId::from(z), at + 1).unwrap(),
            None,
            "round {round}: the zombie's finish wrote a record"
        );

        // The winners clean up, so the next round starts from an empty ledger.
        for id in &ids {
            let w = winner(id);
            assert_eq!(
                hosts[w].abandon(&RunId::from(id), gens[w]).unwrap(),
                Ok(()),
                "round {round}: {id}"
            );
        }
        assert!(after.list_live().unwrap().is_empty());
    }
    wins
}
