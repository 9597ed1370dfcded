//! The kill suite: the real `switchboard` binary on a temp data dir and a free loopback port, crashed,
//! drained, paused and restarted, while runs go through the API. Every wait has a deadline and watches
//! observable state (the database, the process, its log); every process started is killed on drop.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use storage::RunId;

use serde_json::{json, Value};
use storage::ledger::{RunLedger, StopMode};
use storage::record::{RunRecord, RunStatus};
use storage::{RunStore, SqliteStore, Synchronous};
use support::child::{http, now_ms, workspace_lines, Proc};

const DEADLINE: Duration = Duration::from_secs(60);

fn post_run(p: &Proc, thread: &str, text: &str) -> String {
    let (status, body) = http(|c| {
        c.post(p.url("/api/messages"))
            .json(&json!({"thread": thread, "channel": "k", "user": "u", "text": text}))
    });
    assert_eq!(status, 202, "{body}");
    body["runId"].as_str().expect("runId").to_owned()
}

fn db(data: &Path) -> SqliteStore {
    SqliteStore::open(&data.join("switchboard.db"), Synchronous::Normal).expect("open the database")
}

fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    support::child::wait_for(what, DEADLINE, check)
}

/// The live events the ledger holds for a run (empty once it finished).
fn live_events(data: &Path, run_id: &str) -> Vec<Value> {
    db(data)
        .live_events(&RunId::from(run_id), 0, 100_000)
        .unwrap()
        .unwrap_or_default()
}

fn final_record(data: &Path, run_id: &str) -> RunRecord {
    wait_for(&format!("the final record of {run_id}"), || {
        db(data)
            .get(&RunId::from(run_id), now_ms())
            .unwrap()
            .filter(|r| !r.head.provisional)
    })
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["type"] == kind).count()
}

fn assert_contiguous(r: &RunRecord) {
    let seqs: Vec<u64> = r
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs strictly increase: {seqs:?}"
    );
    assert_eq!(count(&r.events, "input"), 1, "exactly one input");
}

fn assert_no_duplicate_lines(lines: &[String]) {
    let mut seen = std::collections::HashSet::new();
    for l in lines {
        assert!(seen.insert(l), "line {l:?} written twice: {lines:?}");
    }
}

fn tempdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    (dir, path)
}

#[test]
fn crash_mid_step_resumes_under_the_same_id_with_one_contiguous_stream() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t1", "steps=8 ms=300 think_ms=100 tool=append_file");
    // Between steps: at least two results are durable, a tool is (or is about to be) in flight.
    wait_for("two tool results", || {
        (count(&live_events(&data, &run_id), "tool_result") >= 2).then_some(())
    });
    a.crash();
    let crashed_at = Instant::now();
    let b = Proc::start(&data, &[]);
    wait_for("the resumed note", || {
        let evs = live_events(&data, &run_id);
        (count(&evs, "resumed") == 1).then_some(()).or_else(|| {
            db(&data)
                .get(&RunId::from(&run_id), now_ms())
                .unwrap()
                .filter(|r| !r.head.provisional)
                .map(|_| ())
        })
    });
    eprintln!(
        "crash-to-resumed (same host, fast reclaim): {} ms",
        crashed_at.elapsed().as_millis()
    );
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(record.head.id, run_id);
    assert_contiguous(&record);
    assert_eq!(count(&record.events, "resumed"), 1);
    assert!(b.logged("boot reclaim"));
    assert_no_duplicate_lines(&workspace_lines(&data, &run_id));
}

#[test]
fn crash_while_a_tool_is_in_flight_never_reruns_the_mutating_call() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t1", "steps=4 ms=1500 tool=append_file");
    // A tool_call published without its result: the mutating call is in flight.
    wait_for("a call in flight", || {
        let evs = live_events(&data, &run_id);
        (count(&evs, "tool_call") >= 2 && count(&evs, "tool_call") > count(&evs, "tool_result"))
            .then_some(())
    });
    a.crash();
    let _b = Proc::start(&data, &[]);
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_contiguous(&record);
    let resumed = record
        .events
        .iter()
        .find(|e| e["type"] == "resumed")
        .expect("resumed");
    assert_eq!(resumed["settled"][0]["how"], "effects_unknown", "{resumed}");
    // The settlement is visible: a tool_result for that call, marked effects-unknown.
    let call_id = resumed["settled"][0]["callId"].clone();
    let settled = record.events.iter().find(|e| {
        e["type"] == "tool_result" && e["callId"] == call_id && e["effectsUnknown"] == true
    });
    assert!(
        settled.is_some_and(|e| e["ok"] == false),
        "{:?}",
        record.events
    );
    assert_no_duplicate_lines(&workspace_lines(&data, &run_id));
}

#[test]
fn a_followup_a_step_consumed_keeps_its_one_input_event_across_a_kill() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t1", "steps=8 ms=300 tool=append_file");
    wait_for("a call in flight", || {
        (count(&live_events(&data, &run_id), "tool_call") >= 1).then_some(())
    });
    for n in 1..=3 {
        let (status, body) = http(|c| {
            c.post(a.url("/api/messages")).json(&json!({"thread": "t1", "channel": "k", "user": "u", "text": format!("followup-{n}")}))
        });
        assert_eq!(
            (status, body["outcome"].as_str()),
            (202, Some("steered")),
            "{body}"
        );
    }
    // The moment a step record says the follow-ups were consumed, kill -9: their input events committed
    // with that step, whatever the flusher had not written yet.
    wait_for("a step consuming the follow-ups", || {
        db(&data)
            .last_step(&RunId::from(&run_id))
            .unwrap()
            .and_then(|s| s.inbox_consumed_seq)
            .filter(|&seq| seq >= 3)
    });
    a.signal("-KILL");
    a.wait_exit(Duration::from_secs(10));
    let _b = Proc::start(&data, &[]);
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    for n in 1..=3 {
        let text = format!("followup-{n}");
        let inputs = record
            .events
            .iter()
            .filter(|e| e["type"] == "input" && e["text"] == text.as_str())
            .count();
        assert_eq!(
            inputs, 1,
            "{text} has exactly one input event: {:?}",
            record.events
        );
    }
    assert_eq!(count(&record.events, "resumed"), 1);
}

#[test]
fn crash_while_attaching_restarts_from_the_request_with_the_same_id_and_start() {
    let (_dir, data) = tempdir();
    // A process that died while attaching: its generation is recorded with a pid that is gone.
    let mut store = db(&data);
    let dead = "20200101T000000Z-deadbeef";
    store
        .record_generation(&storage::ledger::GenerationInfo {
            gen: dead.into(),
            host: actors::host::hostname(),
            host_id: actors::host::hostname(),
            pid: u32::MAX - 11,
            proc_start: "1".into(),
            started_at: now_ms() - 10_000,
        })
        .unwrap();
    let started_at = now_ms() - 5_000;
    let request = json!({"thread": "ta", "channel": "k", "user": "u", "text": "steps=2 ms=0"});
    let meta = json!({"agent": "demo", "model": "scripted", "label": "steps=2 ms=0", "threadKey": "k:ta",
        "channelId": "k", "userId": "u", "channelVisibility": "machine", "deadline": started_at + 600_000,
        "request": request});
    let admitted = store
        .admit(
            &storage::ledger::Admit {
                thread_key: "k:ta".into(),
                gen: dead.into(),
                run_id: "attaching-run-1".into(),
                request: request.clone(),
                meta,
                key: None,
                lease_ms: 30_000,
                writer: None,
                strategy: storage::ledger::Strategy::Steer,
            },
            started_at,
        )
        .unwrap();
    assert_eq!(
        admitted,
        storage::ledger::AdmitOutcome::Started {
            run_id: "attaching-run-1".into()
        }
    );
    drop(store);
    let b = Proc::start(&data, &[]);
    let record = final_record(&data, "attaching-run-1");
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(record.head.started_at, started_at, "the original start");
    assert_contiguous(&record);
    assert_eq!(count(&record.events, "resumed"), 1);
    assert!(b.logged("boot reclaim"));
}

#[test]
fn sigterm_hands_a_resumable_run_off_and_the_next_process_resumes_it_at_once() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t1", "steps=6 ms=400 tool=append_file");
    // SIGTERM lands while a mutating call is in flight: it finishes and its result commits first.
    wait_for("a call in flight", || {
        (count(&live_events(&data, &run_id), "tool_call") >= 2).then_some(())
    });
    let sent = Instant::now();
    a.signal("-TERM");
    let code = a.wait_exit(Duration::from_secs(6) + Duration::from_secs(3));
    assert_eq!(code, Some(0), "a drained process exits 0");
    eprintln!("drain took {} ms", sent.elapsed().as_millis());
    assert!(
        a.logged("handed off at a step boundary"),
        "the run reached its step boundary before the handoff"
    );
    // The handed-off row is taken at once (its lease is still current).
    let row = db(&data)
        .get_live(&RunId::from(&run_id))
        .unwrap()
        .expect("the row waits for the next process");
    assert_eq!(row.phase, storage::ledger::Phase::Handoff);
    let started = Instant::now();
    let _b = Proc::start(&data, &[]);
    let record = final_record(&data, &run_id);
    eprintln!("handoff-to-finished: {} ms", started.elapsed().as_millis());
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_contiguous(&record);
    assert_eq!(count(&record.events, "resumed"), 1);
    // Nothing was in flight at the handoff: nothing settled effects-unknown, every line written once.
    let resumed = record
        .events
        .iter()
        .find(|e| e["type"] == "resumed")
        .unwrap();
    assert_eq!(resumed["settled"], json!([]), "{resumed}");
    assert!(!record.events.iter().any(|e| e["effectsUnknown"] == true));
    let lines: Vec<String> = (1..=6).map(|n| format!("step {n}")).collect();
    assert_eq!(workspace_lines(&data, &run_id), lines);
}

#[test]
fn a_stop_on_the_newer_process_reaches_a_run_of_the_older_one_through_the_ledger() {
    let (_dir, data) = tempdir();
    let fast = [
        ("SWITCHBOARD_LEDGER__LEASE_MS", "2000"),
        ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "500"),
    ];
    let a = Proc::start(&data, &fast);
    let run_id = post_run(&a, "t1", "steps=40 ms=300");
    wait_for("a step", || {
        (count(&live_events(&data, &run_id), "tool_result") >= 1).then_some(())
    });
    let b = Proc::start(&data, &fast);
    // The newer process lists the older one's run as live, with the generation that owns it.
    let (status, listing) = http(|c| c.get(b.url("/api/runs?status=active")));
    assert_eq!(status, 200, "{listing}");
    let row = listing["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == run_id.as_str())
        .cloned()
        .expect("listed live");
    assert_eq!(row["finished"], false, "{row}");
    let owner = row["ownerGen"].as_str().expect("ownerGen").to_owned();
    assert!(a.logged(&owner), "owned by the older process: {row}");
    let (status, body) = http(|c| {
        c.post(b.url(&format!("/api/runs/{run_id}/stop")))
            .json(&json!({"mode": "soft"}))
    });
    assert_eq!(status, 202, "{body}");
    let asked = Instant::now();
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::StoppedSoft);
    assert!(asked.elapsed() < Duration::from_secs(10));
    // The owner (the older process) finished it: one input, no resume.
    assert_eq!(count(&record.events, "resumed"), 0);
    assert!(record
        .events
        .iter()
        .any(|e| e["type"] == "stop_requested" && e["mode"] == "soft"));
}

#[test]
fn a_paused_process_whose_rows_were_reclaimed_goes_silent() {
    let (_dir, data) = tempdir();
    let fast = [
        ("SWITCHBOARD_LEDGER__LEASE_MS", "1500"),
        ("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "500"),
    ];
    let a = Proc::start(&data, &fast);
    let run_id = post_run(&a, "t1", "steps=6 ms=500 tool=append_file");
    wait_for("a step", || {
        (count(&live_events(&data, &run_id), "tool_result") >= 1).then_some(())
    });
    a.0.pause_outside_transaction(&data.join("switchboard.db"))
        .expect("pause");
    let paused = Instant::now();
    let _b = Proc::start(&data, &fast);
    // The paused process is alive: its rows wait for the lease to expire, then the sweep takes them.
    wait_for("the reclaim by the newer process", || {
        let row = db(&data).get_live(&RunId::from(&run_id)).unwrap();
        let taken = row.is_none_or(|r| !r.owner_gen.is_empty() && !a.logged(&r.owner_gen));
        taken.then_some(())
    });
    eprintln!(
        "crash-to-resumed (lease expiry, lease 1500 ms, heartbeat 500 ms): {} ms",
        paused.elapsed().as_millis()
    );
    a.signal("-CONT");
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_contiguous(&record);
    // One takeover, by the newer process, from the paused one.
    let resumed: Vec<&serde_json::Value> = record
        .events
        .iter()
        .filter(|e| e["type"] == "resumed")
        .collect();
    assert_eq!(resumed.len(), 1, "{:?}", record.events);
    let from = resumed[0]["fromGeneration"]
        .as_str()
        .expect("fromGeneration");
    assert!(a.logged(from), "taken from the paused process: {from}");
    // The zombie ran into the fence and wrote nothing after the takeover: every line once, in order.
    wait_for("the zombie to notice the fence", || {
        a.logged("fenced").then_some(())
    });
    let lines = workspace_lines(&data, &run_id);
    let steps: Vec<u64> = lines
        .iter()
        .map(|l| l.trim_start_matches("step ").parse().expect("a step line"))
        .collect();
    assert!(
        steps.windows(2).all(|w| w[0] < w[1]),
        "strictly increasing, no late write: {lines:?}"
    );
}

#[test]
fn a_hard_stop_recorded_before_the_crash_closes_stopped_hard_and_never_runs_again() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t1", "steps=6 ms=400");
    wait_for("a step", || {
        (count(&live_events(&data, &run_id), "tool_result") >= 1).then_some(())
    });
    a.crash();
    // The stop lands on the ledger after the owner died (as one from another process would).
    db(&data)
        .request_stop(&RunId::from(&run_id), StopMode::Hard, now_ms())
        .unwrap()
        .unwrap();
    let _b = Proc::start(&data, &[]);
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::StoppedHard);
    assert_eq!(count(&record.events, "resumed"), 0, "never relaunched");
}

/// A resume settles its step's calls as the step's tools effect, not inside its launch: a hard stop
/// reaches a call the resume runs again (a ten-minute `sleep`, rerun-safe) at once.
#[test]
fn a_hard_stop_aborts_a_call_the_resume_runs_again() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t1", "steps=3 ms=600000");
    wait_for("the call in flight", || {
        (count(&live_events(&data, &run_id), "tool_call") >= 1).then_some(())
    });
    a.crash();
    let b = Proc::start(&data, &[]);
    let resumed = wait_for("the resume", || {
        live_events(&data, &run_id)
            .into_iter()
            .find(|e| e["type"] == "resumed")
    });
    assert_eq!(resumed["settled"][0]["how"], "rerun", "{resumed}");
    let (status, body) = http(|c| {
        c.post(b.url(&format!("/api/runs/{run_id}/stop")))
            .json(&json!({"mode": "hard"}))
    });
    assert_eq!(status, 202, "{body}");
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::StoppedHard);
    assert_eq!(count(&record.events, "resumed"), 1);
    assert_contiguous(&record);
}

#[test]
fn twenty_random_crashes_leave_one_terminal_record_per_run_and_no_blocked_thread() {
    let (_dir, data) = tempdir();
    let mut runs: Vec<String> = Vec::new();
    let mut seed: u64 = 0x5eed_1234;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..20 {
        let mut p = Proc::start(&data, &[]);
        for t in 0..2 {
            let thread = format!("r{round}-{t}");
            let text = if next() % 2 == 0 {
                "steps=3 ms=80 tool=append_file"
            } else {
                "steps=2 ms=120"
            };
            runs.push(post_run(&p, &thread, text));
        }
        std::thread::sleep(Duration::from_millis(50 + next() % 400));
        p.crash();
    }
    let _last = Proc::start(&data, &[]);
    let mut resumed = 0;
    for id in &runs {
        let r = final_record(&data, id);
        assert!(!r.head.provisional);
        // Every message is answered: a crash resumes or restarts its run, never closes it.
        assert_eq!(r.head.status, RunStatus::Completed, "{id}: {:?}", r.events);
        // Its answer, unless it crashed past its finishing gate (then it closes with the saved status,
        // delivery unknown, and the answer event may not have reached the ledger).
        let answered = r
            .events
            .iter()
            .any(|e| e["type"] == "answer" && e["text"] == "done");
        let closed_from_finishing = r.events.iter().any(|e| {
            e["kind"] == "reclaimed"
                && e["summary"]
                    .as_str()
                    .is_some_and(|s| s.contains("finishing"))
        });
        assert!(answered || closed_from_finishing, "{id}: {:?}", r.events);
        assert_contiguous(&r);
        resumed += count(&r.events, "resumed");
        let lines = workspace_lines(&data, id);
        assert_no_duplicate_lines(&lines);
        let steps: Vec<u64> = lines
            .iter()
            .map(|l| l.trim_start_matches("step ").parse().expect("a step line"))
            .collect();
        assert!(steps.windows(2).all(|w| w[0] < w[1]), "{id}: {lines:?}");
        // Without an unknown outcome, every mutating call wrote exactly once.
        if !lines.is_empty() && !r.events.iter().any(|e| e["effectsUnknown"] == true) {
            assert_eq!(steps, [1, 2, 3], "{id}");
        }
    }
    assert!(resumed > 0, "twenty crashes mid-run resumed some run");
    wait_for("every thread free", || {
        db(&data).list_live().unwrap().is_empty().then_some(())
    });
}

/// The events a viewer of the owning process was shown (its registry serves them before the ledger has
/// them all).
fn shown(p: &Proc, run_id: &str) -> Option<Vec<Value>> {
    let (status, body) = http(|c| c.get(p.url(&format!("/api/runs/{run_id}/events"))));
    (status == 200)
        .then(|| body["events"].as_array().cloned())
        .flatten()
}

#[test]
fn events_a_viewer_was_shown_before_a_crash_are_in_the_record_under_their_seqs() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let run_id = post_run(&a, "t-seen", "steps=4 ms=1500 tool=append_file");
    // Step 3's call is shown: step 2's result and step 3's call are in the committed transcript.
    let seen = wait_for("step 3's tool call, shown", || {
        shown(&a, &run_id).filter(|e| count(e, "tool_call") >= 3)
    });
    a.crash();
    let _b = Proc::start(&data, &[]);
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_contiguous(&record);
    for e in seen.iter().filter(|e| {
        ["assistant", "tool_call", "tool_result"].contains(&e["type"].as_str().unwrap_or_default())
    }) {
        let kept = record.events.iter().find(|r| r["seq"] == e["seq"]);
        assert_eq!(
            kept.map(|r| (&r["type"], &r["callId"], &r["step"])),
            Some((&e["type"], &e["callId"], &e["step"])),
            "shown {e}, not kept under its seq: {:?}",
            record.events
        );
    }
    for call in record.events.iter().filter(|e| e["type"] == "tool_call") {
        let results = record
            .events
            .iter()
            .filter(|r| r["type"] == "tool_result" && r["callId"] == call["callId"])
            .count();
        assert_eq!(
            results, 1,
            "call {call} has one result: {:?}",
            record.events
        );
    }
    assert_eq!(
        record.head.event_count,
        record.events.len() as u64,
        "eventCount counts events, never seqs"
    );
}

#[test]
fn a_run_closed_from_finishing_keeps_its_saved_answer_and_says_its_delivery_is_unknown() {
    // A receiver that takes the connection and never answers: the run is past its gate, its POST in flight.
    let hook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    hook.set_nonblocking(true).unwrap();
    let url = format!("http://{}/hook", hook.local_addr().unwrap());
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[("SWITCHBOARD_DELIVERY__WEBHOOK_URL", &url)]);
    let run_id = post_run(&a, "t-gated", "steps=1 ms=10 answer=the-kept-answer");
    let _conn = wait_for("the webhook POST", || hook.accept().ok());
    a.crash();
    let _b = Proc::start(&data, &[]);
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    let answers: Vec<&Value> = record
        .events
        .iter()
        .filter(|e| e["type"] == "answer")
        .collect();
    assert_eq!(answers.len(), 1, "{:?}", record.events);
    assert_eq!(answers[0]["text"], "the-kept-answer");
    assert_eq!(
        record.head.reply_ok, None,
        "nobody knows whether the reply went out"
    );
    assert_eq!(
        record.head.reply_note.as_deref(),
        Some(actors::run::DELIVERY_UNKNOWN)
    );
    assert_eq!(record.head.event_count, record.events.len() as u64);
}

/// Every event real runs write — a request and a follow-up, tools, a failure, both stops, a crash and its
/// resume, a close from a reclaim — reads as a `RunEvent` and writes back as the same JSON: the typed
/// vocabulary the API documents is the one the product writes.
#[test]
fn every_event_real_runs_write_is_in_the_typed_vocabulary() {
    let (_dir, data) = tempdir();
    let mut a = Proc::start(&data, &[]);
    let mut ids = vec![
        post_run(&a, "v1", "steps=2 ms=10 tool=echo answer=hi"),
        post_run(&a, "v2", "steps=3 ms=10 fail_at=2"),
    ];
    let soft = post_run(&a, "v3", "steps=40 ms=200");
    let hard = post_run(&a, "v4", "steps=40 ms=200");
    let crashed = post_run(&a, "v5", "steps=6 ms=300 tool=append_file");
    let (status, _) = http(|c| {
        c.post(a.url("/api/messages"))
            .json(&json!({"thread": "v5", "channel": "k", "user": "u", "text": "and this"}))
    });
    assert_eq!(status, 202);
    for (id, mode) in [(&soft, "soft"), (&hard, "hard")] {
        let (status, body) = http(|c| {
            c.post(a.url(&format!("/api/runs/{id}/stop")))
                .json(&json!({"mode": mode}))
        });
        assert_eq!(status, 202, "{body}");
    }
    wait_for("a step of the run to crash", || {
        (count(&live_events(&data, &crashed), "tool_result") >= 1).then_some(())
    });
    a.crash();
    let _b = Proc::start(&data, &[]);
    ids.extend([soft, hard, crashed]);
    let mut kinds = std::collections::BTreeSet::new();
    for id in &ids {
        for event in &final_record(&data, id).events {
            kinds.insert(event["type"].as_str().unwrap_or_default().to_owned());
            if let Err(e) = storage::record::RunEvent::round_trips(event) {
                panic!("run {id}: {e}");
            }
        }
    }
    for kind in [
        "run_meta",
        "input",
        "assistant",
        "tool_call",
        "tool_result",
        "answer",
        "run_failed",
        "stop_requested",
        "resumed",
    ] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
}
