//! A person in the loop (SPEC §13), on the real binary: a run parks on a tool call its agent must have
//! approved, a decision (first one wins) lets the call run or answers it denied, a timeout denies it, a
//! stop ends the wait, and a crash or a drain while parked loses nothing — the next process parks on the
//! same call without a second request and applies a decision taken while no process held the run.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::child::{http, workspace_lines, Proc};

const DEADLINE: Duration = Duration::from_secs(60);

/// A data dir whose demo agent must have every `append_file` call approved.
fn approving_dir(timeout_ms: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "[agents.demo]\nkind = \"scripted\"\napprove = [\"append_*\"]\napproval_timeout_ms = {timeout_ms}\n\n\
             [drain]\nhandoff_budget_ms = 300\n"
        ),
    )
    .unwrap();
    dir
}

fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    support::child::wait_for(what, DEADLINE, check)
}

fn start_run(p: &Proc, text: &str) -> String {
    let (status, body) = http(|c| {
        c.post(p.url("/api/messages"))
            .json(&json!({"thread": "a", "channel": "k", "user": "u", "text": text}))
    });
    assert_eq!(status, 202, "{body}");
    body["runId"].as_str().unwrap().to_owned()
}

fn events(p: &Proc, run_id: &str) -> Vec<Value> {
    let (status, body) = http(|c| c.get(p.url(&format!("/api/runs/{run_id}/events?limit=1000"))));
    assert_eq!(status, 200, "{body}");
    body["events"].as_array().cloned().unwrap_or_default()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// Wait until the run awaits approval of `call_id`.
fn parked_on(p: &Proc, run_id: &str, call_id: &str) {
    wait_for(&format!("{run_id} to await approval of {call_id}"), || {
        let (status, body) = http(|c| c.get(p.url("/api/runs?status=awaiting_approval")));
        assert_eq!(status, 200, "{body}");
        let listed = body["runs"]
            .as_array()?
            .iter()
            .any(|r| r["id"] == run_id && r["awaitingApproval"] == true);
        let requested = of_type(&events(p, run_id), "approval_requested")
            .iter()
            .any(|e| e["callId"] == call_id);
        (listed && requested).then_some(())
    });
}

fn decide(p: &Proc, run_id: &str, call_id: &str, body: Value) -> (u16, Value) {
    http(|c| {
        c.post(p.url(&format!("/api/runs/{run_id}/approvals/{call_id}")))
            .json(&body)
    })
}

fn finished(p: &Proc, run_id: &str) -> Value {
    wait_for(&format!("{run_id} to finish"), || {
        let (status, body) = http(|c| c.get(p.url(&format!("/api/runs/{run_id}"))));
        (status == 200 && body["finished"] == true && body["persisted"] == true).then_some(body)
    })
}

#[test]
fn approve_runs_the_call_deny_answers_it_and_the_first_decision_wins() {
    let dir = approving_dir(600_000);
    let p = Proc::start(dir.path(), &[]);
    let run = start_run(&p, "tool=append_file steps=2 ms=10");
    parked_on(&p, &run, "call-1");
    assert!(
        workspace_lines(dir.path(), &run).is_empty(),
        "nothing runs before the decision"
    );

    let (status, body) = decide(&p, &run, "call-1", json!({"decision": "approve"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["decision"].as_str(), body["callId"].as_str()),
        (Some("approve"), Some("call-1"))
    );
    let (status, body) = decide(&p, &run, "call-1", json!({"decision": "deny"}));
    assert_eq!(status, 409, "the first decision stands: {body}");
    // Bad bodies are refused by name, and an unknown call is not found.
    let (status, body) = decide(&p, &run, "call-1", json!({"decision": "maybe"}));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("decision"),
        "{body}"
    );
    assert_eq!(
        decide(&p, &run, "call-9", json!({"decision": "approve"})).0,
        404
    );
    assert_eq!(
        decide(&p, "no-such-run", "call-1", json!({"decision": "approve"})).0,
        404
    );

    parked_on(&p, &run, "call-2");
    let (status, body) = decide(
        &p,
        &run,
        "call-2",
        json!({"decision": "deny", "note": "not that file"}),
    );
    assert_eq!(status, 200, "{body}");
    let view = finished(&p, &run);
    assert_eq!(view["status"], "completed", "{view}");
    assert!(view.get("awaitingApproval").is_none(), "{view}");

    let ev = events(&p, &run);
    let decided = of_type(&ev, "approval_decided");
    assert_eq!(decided.len(), 2, "{decided:?}");
    assert_eq!(
        (decided[1]["decision"].as_str(), decided[1]["note"].as_str()),
        (Some("deny"), Some("not that file"))
    );
    assert!(
        decided[0]["who"].as_str().unwrap().starts_with("token:"),
        "{:?}",
        decided[0]
    );
    let results = of_type(&ev, "tool_result");
    assert_eq!(results.len(), 2);
    assert_eq!(
        (results[0]["ok"].as_bool(), results[0]["denied"].as_bool()),
        (Some(true), None)
    );
    assert_eq!(
        (results[1]["ok"].as_bool(), results[1]["denied"].as_bool()),
        (Some(false), Some(true))
    );
    // Each decision commits before its call's result, and the model saw the denial.
    let seq = |e: &Value| e["seq"].as_u64().unwrap();
    assert!(seq(decided[0]) < seq(results[0]) && seq(decided[1]) < seq(results[1]));
    let answer = of_type(&ev, "answer");
    assert_eq!(answer.len(), 1);
    assert_eq!(
        workspace_lines(dir.path(), &run),
        ["step 1"],
        "only the approved call ran"
    );
}

#[test]
fn no_decision_before_the_timeout_denies_the_call() {
    let dir = approving_dir(400);
    let p = Proc::start(dir.path(), &[]);
    let run = start_run(&p, "tool=append_file steps=1 ms=10");
    let view = finished(&p, &run);
    assert_eq!(view["status"], "completed", "{view}");
    let ev = events(&p, &run);
    let decided = of_type(&ev, "approval_decided");
    assert_eq!(decided.len(), 1, "{ev:?}");
    assert_eq!(
        (decided[0]["decision"].as_str(), decided[0]["who"].as_str()),
        (Some("deny"), Some("timeout"))
    );
    assert_eq!(of_type(&ev, "tool_result")[0]["denied"], true);
    assert!(workspace_lines(dir.path(), &run).is_empty());
    // Past its wait, a decision is too late.
    assert_eq!(
        decide(&p, &run, "call-1", json!({"decision": "approve"})).0,
        409
    );
}

#[test]
fn a_stop_ends_the_wait_and_the_call_never_runs() {
    let dir = approving_dir(600_000);
    let p = Proc::start(dir.path(), &[]);
    let run = start_run(&p, "tool=append_file steps=1 ms=10");
    parked_on(&p, &run, "call-1");
    let (status, body) = http(|c| c.post(p.url(&format!("/api/runs/{run}/stop"))));
    assert_eq!(status, 202, "{body}");
    let view = finished(&p, &run);
    assert_eq!(view["status"], "stopped_soft", "{view}");
    let ev = events(&p, &run);
    let results = of_type(&ev, "tool_result");
    assert_eq!(
        (results.len(), results[0]["notRun"].as_bool()),
        (1, Some(true)),
        "{ev:?}"
    );
    assert!(of_type(&ev, "approval_decided").is_empty());
    assert!(workspace_lines(dir.path(), &run).is_empty());
    assert_eq!(
        decide(&p, &run, "call-1", json!({"decision": "approve"})).0,
        409
    );
}

#[test]
fn a_kill_9_while_parked_parks_again_and_a_decision_taken_meanwhile_is_applied() {
    let dir = approving_dir(600_000);
    let mut a = Proc::start(dir.path(), &[]);
    let run = start_run(&a, "tool=append_file steps=1 ms=10");
    parked_on(&a, &run, "call-1");
    a.signal("-KILL");
    assert!(a.wait_exit(Duration::from_secs(10)).is_some(), "killed");
    // The decision lands while nobody runs the run; the next process applies it at its resume.
    let b = Proc::start(dir.path(), &[]);
    let (status, body) = decide(
        &b,
        &run,
        "call-1",
        json!({"decision": "approve", "note": "go"}),
    );
    assert_eq!(status, 200, "{body}");
    let view = finished(&b, &run);
    assert_eq!(view["status"], "completed", "{view}");
    let ev = events(&b, &run);
    assert_eq!(
        of_type(&ev, "approval_requested").len(),
        1,
        "no second request: {ev:?}"
    );
    assert_eq!(of_type(&ev, "approval_decided").len(), 1);
    assert_eq!(of_type(&ev, "resumed").len(), 1);
    assert_eq!(
        workspace_lines(dir.path(), &run),
        ["step 1"],
        "ran exactly once"
    );
}

#[test]
fn a_drain_while_parked_hands_the_run_on_and_the_next_process_parks_on_the_same_call() {
    let dir = approving_dir(600_000);
    let mut a = Proc::start(dir.path(), &[]);
    let run = start_run(&a, "tool=append_file steps=1 ms=10");
    parked_on(&a, &run, "call-1");
    a.signal("-TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(30)),
        Some(0),
        "the drain exits cleanly"
    );
    let b = Proc::start(dir.path(), &[]);
    parked_on(&b, &run, "call-1");
    let (status, body) = decide(&b, &run, "call-1", json!({"decision": "deny"}));
    assert_eq!(status, 200, "{body}");
    let view = finished(&b, &run);
    assert_eq!(view["status"], "completed", "{view}");
    let ev = events(&b, &run);
    assert_eq!(of_type(&ev, "approval_requested").len(), 1, "{ev:?}");
    assert_eq!(of_type(&ev, "tool_result")[0]["denied"], true);
    assert!(
        workspace_lines(dir.path(), &run).is_empty(),
        "a denied call never runs"
    );
}
