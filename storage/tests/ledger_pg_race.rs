//! Real concurrency on one PostgreSQL database (SPEC §1.3: deciding transactions are race-free across
//! hosts; a serialization failure, deadlock or unique violation from a race is retried as transient,
//! never surfaced as a refusal; a group whose COMMIT fails re-runs its messages one by one).
//!
//! Each contender is its own `PgStore` — its own connection, as another host's would be — on its own
//! thread, released together by one `Barrier`, round after round:
//! - three generations reclaim the same expired rows: every row has exactly one winner, the losers see
//!   it live elsewhere under the winner's lease, and the dead generation's zombie writes are fenced and
//!   change nothing (the round every backend's race shares: [`race::reclaim_rounds`]);
//! - three hosts admit onto one free thread: exactly one starts the run, the others are steered into
//!   its inbox (never a refusal, never an error);
//! - a completion and a cleanup settle race on one plan request: exactly one wins;
//! - and the reclaim race once more with each contender an OS process of its own (this test binary,
//!   started again to run `contender_process`), as hosts are.
//!
//! And one case through the storage actor: a group commit that loses a race at `COMMIT` answers every
//! message with its decided value, each after its own commit — none answers the race.

mod race;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use storage::RunId;

use race::{admission, contend, dead_rows, promotion, reclaim_rounds, GENS, LEASE, NOW};
use serde_json::{json, Value};
use storage::ledger::{AdmitOutcome, Claimed, Refusal, RunLedger, StopMode};
use storage::plan::{
    Card, Import, PlanBinding, PlanId, PlanRefusal, PlanStore, RequestState, Revision,
    SettleOutcome, Settlement, SnapshotId, TerminalReason,
};
use storage::testing::pg;
use storage::{BackendSpec, Generation, ManualClock, PgStore, StorageHandle};

const ROUNDS: usize = 30;

fn open(url: &str) -> PgStore {
    PgStore::open(url).expect("open")
}

#[test]
fn three_hosts_reclaiming_the_same_expired_rows_each_row_has_exactly_one_winner() {
    let url = pg::database();
    let mut dead = open(&url);
    let mut hosts: Vec<PgStore> = GENS.iter().map(|_| open(&url)).collect();
    let wins = reclaim_rounds(&mut dead, &mut hosts, ROUNDS, || open(&url));
    eprintln!("rows won: {wins:?}");
}

#[test]
fn three_hosts_admitting_onto_one_free_thread_start_exactly_one_run_and_steer_the_rest() {
    let url = pg::database();
    let mut hosts: Vec<PgStore> = GENS.iter().map(|_| open(&url)).collect();
    for round in 0..ROUNDS {
        let thread = format!("C1:admit-{round}");
        let outcomes = contend(&mut hosts, |i, s| {
            let run = format!("a{round:03}-{i}");
            s.admit(&admission(&thread, &RunId::from(&run), GENS[i], NOW), NOW)
                .expect("a race is retried, never an error")
        });
        let started: Vec<usize> = (0..GENS.len())
            .filter(|&i| matches!(&outcomes[i], AdmitOutcome::Started { .. }))
            .collect();
        assert_eq!(
            started.len(),
            1,
            "round {round}: exactly one start: {outcomes:?}"
        );
        let winner = format!("a{round:03}-{}", started[0]);
        assert_eq!(
            outcomes[started[0]],
            AdmitOutcome::Started {
                run_id: RunId::from(winner.clone())
            }
        );
        let mut seqs: Vec<u64> = outcomes
            .iter()
            .filter_map(|o| match o {
                AdmitOutcome::Steered { run_id, seq } if *run_id == winner => Some(*seq),
                AdmitOutcome::Started { .. } => None,
                other => {
                    panic!("round {round}: a loser was not steered into the winner: {other:?}")
                }
            })
            .collect();
        seqs.sort_unstable();
        assert_eq!(
            seqs,
            vec![1, 2],
            "round {round}: each steer has its own inbox seq"
        );
        let inbox = hosts[0]
            .read_inbox(&RunId::from(&winner), None)
            .unwrap()
            .unwrap();
        assert_eq!(inbox.len(), 2, "round {round}");
        let live = hosts[0].list_live().unwrap();
        assert_eq!(
            live.iter().filter(|r| r.thread_key == thread).count(),
            1,
            "round {round}: one row per thread"
        );
    }
}

/// Where `contender_process` finds its part: `url|gen|at`. Set only for the child processes.
const CONTENDER_ENV: &str = "SWITCHBOARD_PG_RACE_CONTENDER";

/// Not a case of its own: the body of one contender process of
/// `three_processes_reclaiming_the_same_expired_rows_each_row_has_exactly_one_winner`, which starts
/// this binary again with [`CONTENDER_ENV`] set. Without it there is nothing to do. The contender
/// connects, says `READY`, waits for a line on stdin (the start signal every contender gets at once),
/// reclaims, and prints its answer as one `RESULT` line of JSON.
#[test]
fn contender_process() {
    let Ok(part) = std::env::var(CONTENDER_ENV) else {
        return;
    };
    let fields: Vec<&str> = part.split('|').collect();
    let [url, gen, at] = fields[..] else {
        panic!("bad {CONTENDER_ENV}: {part}")
    };
    let at: i64 = at.parse().expect("at");
    let mut s = open(url);
    // Straight to stdout, past the harness's output capture (which takes `println!`).
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        out.write_all(line.as_bytes())
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush())
            .expect("stdout");
    };
    say("READY".into());
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .expect("the start signal");
    let answer = s
        .reclaim(gen, at, LEASE, &[], &[])
        .expect("a race is retried, never an error");
    let taken: Vec<&str> = answer.taken.iter().map(|t| t.row.run_id.as_str()).collect();
    let elsewhere: Vec<Value> = answer
        .live_elsewhere
        .iter()
        .map(|r| json!([r.run_id, r.owner_gen, r.lease_until]))
        .collect();
    say(format!(
        "RESULT {}",
        json!({"taken": taken, "elsewhere": elsewhere})
    ));
}

/// A contender process: started, connected and waiting for the start signal.
struct Contender {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Contender {
    fn start(url: &str, gen: &str, at: i64) -> Contender {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["contender_process", "--exact", "--test-threads=1"])
            .env(CONTENDER_ENV, format!("{url}|{gen}|{at}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a contender process");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut c = Contender { child, out };
        c.line_after("READY");
        c
    }

    /// What follows `prefix` on the first stdout line holding it (the harness prints its own text, and
    /// `test contender_process ... ` with no newline before the contender's first line).
    fn line_after(&mut self, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .out
                .read_line(&mut line)
                .expect("read a contender's output");
            assert!(n > 0, "the contender ended before printing {prefix}");
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
    }

    fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .expect("start the contender");
    }

    /// The contender's answer: the ids it took and `(id, owner, lease_until)` of what it saw live elsewhere.
    fn answer(mut self) -> (BTreeSet<String>, Vec<(String, String, i64)>) {
        let result: Value = serde_json::from_str(&self.line_after("RESULT")).expect("RESULT json");
        assert!(
            self.child.wait().expect("wait for the contender").success(),
            "the contender failed"
        );
        let taken = result["taken"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        let elsewhere = result["elsewhere"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v[0].as_str().unwrap().to_owned(),
                    v[1].as_str().unwrap().to_owned(),
                    v[2].as_i64().unwrap(),
                )
            })
            .collect();
        (taken, elsewhere)
    }
}

#[test]
fn three_processes_reclaiming_the_same_expired_rows_each_row_has_exactly_one_winner() {
    let url = pg::database();
    let mut dead = open(&url);
    let mut hosts: Vec<PgStore> = GENS.iter().map(|_| open(&url)).collect();
    for round in 0..10 {
        let t0 = NOW + round as i64 * 10 * LEASE;
        let ids = dead_rows(&mut dead, "p", round, t0, false);
        let at = t0 + LEASE;
        let mut contenders: Vec<Contender> =
            GENS.iter().map(|g| Contender::start(&url, g, at)).collect();
        for c in &mut contenders {
            c.go();
        }
        let answers: Vec<_> = contenders.into_iter().map(Contender::answer).collect();
        let mut all = BTreeSet::new();
        for (taken, _) in &answers {
            assert!(
                taken.is_disjoint(&all),
                "round {round}: a row taken twice: {answers:?}"
            );
            all.extend(taken.iter().cloned());
        }
        assert_eq!(
            all,
            ids.iter().cloned().collect::<BTreeSet<_>>(),
            "round {round}: every row has a winner"
        );
        for id in &ids {
            let w = answers
                .iter()
                .position(|(t, _)| t.contains(id))
                .expect("a winner");
            for (l, (_, elsewhere)) in answers.iter().enumerate().filter(|(l, _)| *l != w) {
                let seen = elsewhere.iter().find(|(r, _, _)| r == id);
                let seen = seen.unwrap_or_else(|| {
                    panic!("round {round}: process {l} does not see {id} live elsewhere")
                });
                assert_eq!(
                    (seen.1.as_str(), seen.2),
                    (GENS[w], at + LEASE),
                    "round {round}: {id}"
                );
            }
            assert_eq!(
                hosts[w]
                    .get_live(&RunId::from(id))
                    .unwrap()
                    .map(|r| r.owner_gen),
                Some(GENS[w].to_owned())
            );
            assert_eq!(
                hosts[w].abandon(&RunId::from(id), GENS[w]).unwrap(),
                Ok(()),
                "round {round}: {id}"
            );
        }
        assert!(hosts[0].list_live().unwrap().is_empty());
    }
}

fn binding() -> PlanBinding {
    PlanBinding {
        plan_id: PlanId::parse("p").unwrap(),
        revision: Revision::new(1),
        snapshot_id: SnapshotId::parse("s1").unwrap(),
    }
}

#[test]
fn a_completion_and_a_cleanup_racing_on_one_database_have_exactly_one_winner() {
    let url = pg::database();
    let mut setup = open(&url);
    setup
        .import(
            &Import {
                plan_id: PlanId::parse("p").unwrap(),
                snapshot_id: SnapshotId::parse("s1").unwrap(),
                advance_revision: true,
            },
            NOW,
        )
        .unwrap();
    let gen = Generation::parse(GENS[0]).unwrap();
    let bind = binding();
    let mut hosts = [open(&url), open(&url)];
    for round in 0..ROUNDS {
        let r = setup
            .allocate_request(&bind, &gen, LEASE, NOW + round as i64)
            .unwrap()
            .expect("allocated");
        let cards = [Card {
            title: "won".into(),
            body: "the winner's card".into(),
        }];
        let settlement = Settlement {
            outcome: SettleOutcome::Failed,
            reason: TerminalReason::ProviderError,
            diagnostic: "lost?".into(),
        };
        let out = contend(&mut hosts, |i, s| {
            if i == 0 {
                s.complete_suggestions(&r.request_id, &bind, &cards, NOW)
                    .expect("never an error")
            } else {
                s.settle_suggestion(&r.request_id, &bind, &settlement, NOW)
                    .expect("never an error")
            }
        });
        let stored = setup.get_request(&r.request_id).unwrap().expect("row");
        match (&out[0], &out[1]) {
            (Ok(ready), Err(PlanRefusal::NotPending { found })) => {
                assert_eq!((&stored, &**found), (ready, ready));
                assert_eq!(stored.state, RequestState::Ready);
            }
            (Err(PlanRefusal::NotPending { found }), Ok(failed)) => {
                assert_eq!((&stored, &**found), (failed, failed));
                assert_eq!(stored.state, RequestState::Failed);
            }
            other => panic!("round {round}: not exactly one winner: {other:?}"),
        }
    }
}

/// The storage actor on PostgreSQL groups two heartbeats into one transaction while another host kills
/// the first run: the other host read the run's row before the group wrote it, and wrote the fence the
/// group had read as absent, then commits first — the group's `COMMIT` fails with a serialization
/// failure. Both heartbeats then run again alone and answer what a lone run decides: the killed run is
/// fenced, the other's lease is renewed. Neither answers the race.
#[actix_rt::test]
async fn a_group_that_loses_a_race_at_commit_answers_each_message_after_running_it_alone() {
    let url = pg::database();
    let clock = ManualClock::new(NOW);
    let h = StorageHandle::start(
        BackendSpec::Postgres {
            url: url.clone(),
            pool: 0,
        },
        Arc::new(clock.clone()),
    );
    assert_eq!(h.kind(), "postgres");
    for (run, thread) in [("g1", "C1:g1"), ("g2", "C1:g2")] {
        assert_eq!(
            h.admit(admission(thread, &RunId::from(run), GENS[0], NOW), NOW)
                .await
                .unwrap(),
            AdmitOutcome::Started { run_id: run.into() }
        );
        assert_eq!(
            h.claim(run.into(), GENS[0].into(), promotion())
                .await
                .unwrap(),
            Ok(Claimed::Promoted)
        );
    }

    // The other host: reads g1, fences it, and locks g2's row, in one open SERIALIZABLE transaction.
    let (ready_tx, ready) = mpsc::channel::<()>();
    let (go, go_rx) = mpsc::channel::<()>();
    let other_url = url.clone();
    // On a thread of its own: the synchronous client cannot block inside the test's runtime.
    let other = std::thread::spawn(move || -> Result<(), String> {
        let mut c =
            postgres::Client::connect(&other_url, postgres::NoTls).map_err(|e| e.to_string())?;
        let mut watcher =
            postgres::Client::connect(&other_url, postgres::NoTls).map_err(|e| e.to_string())?;
        let mut tx = c
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::Serializable)
            .start()
            .map_err(|e| e.to_string())?;
        tx.query("SELECT * FROM live_runs WHERE run_id = 'g1'", &[])
            .map_err(|e| e.to_string())?;
        tx.execute(
            "INSERT INTO deletion_fences (run_id, at) VALUES ('g1', 1)",
            &[],
        )
        .map_err(|e| e.to_string())?;
        tx.query(
            "SELECT 1 FROM live_runs WHERE run_id = 'g2' FOR UPDATE",
            &[],
        )
        .map_err(|e| e.to_string())?;
        let _ = ready_tx.send(());
        go_rx.recv().map_err(|e| e.to_string())?;
        // Commit only once the group waits for g2's row lock: it has read the fence table and written g1.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let waiting: i64 = watcher
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'", &[])
                .map_err(|e| e.to_string())?
                .get(0);
            if waiting > 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err("the group never waited for g2's lock".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        tx.commit().map_err(|e| e.to_string())
    });
    ready.recv().expect("the other host is ready");

    // Hold the actor, queue both heartbeats behind the holder, then release it: one group of two.
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, release_rx) = mpsc::channel::<()>();
    let holder = {
        let h = h.clone();
        actix_rt::spawn(async move {
            h.transact_for_test(move |_, _| {
                let _ = entered_tx.send(());
                let _ = release_rx.recv_timeout(Duration::from_secs(10));
                Ok(())
            })
            .await
        })
    };
    while entered.try_recv().is_err() {
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    let mut beats = Vec::new();
    for (i, run) in ["g1", "g2"].into_iter().enumerate() {
        let h2 = h.clone();
        beats.push(actix_rt::spawn(async move {
            h2.heartbeat(run.into(), GENS[0].into(), LEASE).await
        }));
        while h
            .group_stats()
            .queued
            .load(std::sync::atomic::Ordering::Relaxed)
            < i as u64 + 1
        {
            actix_rt::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let groups_before = h
        .group_stats()
        .groups
        .load(std::sync::atomic::Ordering::Relaxed);
    go.send(()).expect("the other host waits");
    release.send(()).expect("the holder waits");
    holder.await.expect("holder task").expect("holder job");
    let g1 = beats.remove(0).await.expect("task");
    let g2 = beats.remove(0).await.expect("task");
    other
        .join()
        .expect("other host thread")
        .expect("the other host commits first");

    assert_eq!(
        g1.expect("the race is never an error"),
        Err(Refusal::Fenced {
            run_id: "g1".into()
        })
    );
    let renewed = g2
        .expect("the race is never an error")
        .expect("the owner's heartbeat");
    assert_eq!(renewed.stop, None);
    assert_eq!(
        h.group_stats()
            .groups
            .load(std::sync::atomic::Ordering::Relaxed),
        groups_before,
        "the group did not commit"
    );
    assert!(h.is_killed("g1".into()).await.unwrap());
    assert_eq!(
        h.get_live("g2".into())
            .await
            .unwrap()
            .map(|r| r.lease_until),
        Some(NOW + LEASE)
    );
    assert_eq!(
        h.request_stop("g2".into(), StopMode::Soft)
            .await
            .unwrap()
            .map(|a| a.stop),
        Ok(StopMode::Soft)
    );
}
