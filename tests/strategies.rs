//! What a message does on a busy thread (SPEC §5.1 multitask strategy), on the real binary: `steer` into
//! the live run, `enqueue` for a run of its own after it (in order, across a crash and a kill), `reject`
//! with 409 `thread_busy` and nothing written, `interrupt` (the live run ends `stopped_soft`, then the
//! message runs). Every wait watches what the API serves, with a deadline.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::child::{http, Proc};

const DEADLINE: Duration = Duration::from_secs(60);

/// `POST /api/messages` on thread `k:<thread>`; answers (status, body).
fn send(p: &Proc, thread: &str, text: &str, strategy: Option<&str>) -> (u16, Value) {
    let mut body = json!({"thread": thread, "channel": "k", "user": "u1", "text": text});
    if let Some(s) = strategy {
        body["strategy"] = json!(s);
    }
    http(|c| c.post(p.url("/api/messages")).json(&body))
}

fn started(p: &Proc, thread: &str, text: &str) -> String {
    let (status, body) = send(p, thread, text, None);
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("started")),
        "{body}"
    );
    body["runId"].as_str().unwrap().to_owned()
}

/// The thread's finished runs, oldest first, once `n` of them have final records.
fn finished_runs(p: &Proc, thread: &str, n: usize) -> Vec<Value> {
    support::child::wait_for(&format!("{n} finished runs on {thread}"), DEADLINE, || {
        let (status, body) = http(|c| {
            c.get(p.url(&format!(
                "/api/runs?threadKey=k:{thread}&status=finished&limit=100"
            )))
        });
        assert_eq!(status, 200, "{body}");
        let mut runs: Vec<Value> = body["runs"].as_array()?.clone();
        (runs.len() >= n).then(|| {
            runs.sort_by_key(|r| r["startedAt"].as_i64());
            runs
        })
    })
}

fn events(p: &Proc, run_id: &str) -> Vec<Value> {
    let (status, body) = http(|c| c.get(p.url(&format!("/api/runs/{run_id}/events?limit=1000"))));
    assert_eq!(status, 200, "{body}");
    body["events"].as_array().cloned().unwrap_or_default()
}

/// The texts of a run's `input` events.
fn inputs(p: &Proc, run_id: &str) -> Vec<String> {
    events(p, run_id)
        .iter()
        .filter(|e| e["type"] == "input")
        .map(|e| e["text"].as_str().unwrap().to_owned())
        .collect()
}

fn id(run: &Value) -> &str {
    run["id"].as_str().unwrap()
}

/// Each run started after the one before it had finished.
fn assert_one_after_another(runs: &[Value]) {
    for w in runs.windows(2) {
        assert!(
            w[1]["startedAt"].as_i64() >= w[0]["finishedAt"].as_i64(),
            "{} started before {} finished",
            id(&w[1]),
            id(&w[0])
        );
    }
}

#[test]
fn enqueue_runs_each_queued_message_on_its_own_in_order_and_steer_folds_into_the_live_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), &[]);
    let first = started(&p, "q", "steps=3 ms=300 first");
    let (status, q1) = send(&p, "q", "steps=1 ms=10 second", Some("enqueue"));
    assert_eq!(status, 202, "{q1}");
    assert_eq!(
        (
            q1["outcome"].as_str(),
            q1["runId"].as_str(),
            q1["position"].as_u64()
        ),
        (Some("queued"), Some(first.as_str()), Some(1))
    );
    assert!(q1["liveUrl"].as_str().unwrap().contains(&first));
    let (_, q2) = send(&p, "q", "steps=0 third", Some("enqueue"));
    assert_eq!(
        (q2["outcome"].as_str(), q2["position"].as_u64()),
        (Some("queued"), Some(2))
    );
    let (_, steer) = send(&p, "q", "and also this", Some("steer"));
    assert_eq!(steer["outcome"], "steered", "{steer}");

    let runs = finished_runs(&p, "q", 3);
    assert_eq!(runs.len(), 3, "one run per queued message: {runs:#?}");
    assert_eq!(id(&runs[0]), first);
    assert_one_after_another(&runs);
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:#?}");
    let texts: Vec<Vec<String>> = runs.iter().map(|r| inputs(&p, id(r))).collect();
    assert_eq!(
        texts,
        [
            vec![
                "steps=3 ms=300 first".to_owned(),
                "and also this".to_owned()
            ],
            vec!["steps=1 ms=10 second".to_owned()],
            vec!["steps=0 third".to_owned()],
        ],
        "each message is answered once, queued ones in their own runs, in order"
    );
}

#[test]
fn reject_refuses_a_busy_thread_with_409_writes_nothing_but_its_receipt_and_an_idle_thread_starts()
{
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), &[]);
    let (status, body) = send(&p, "r", "steps=2 ms=300 go", Some("reject"));
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("started")),
        "{body}"
    );
    let run = body["runId"].as_str().unwrap().to_owned();
    let keyed = json!({"thread": "r", "channel": "k", "user": "u1", "text": "no", "strategy": "reject", "key": "k1"});
    for _ in 0..2 {
        let (status, body) = http(|c| c.post(p.url("/api/messages")).json(&keyed));
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("thread_busy")),
            "{body}"
        );
    }
    let runs = finished_runs(&p, "r", 1);
    assert_eq!(
        inputs(&p, &run),
        ["steps=2 ms=300 go"],
        "the rejected message reached nothing"
    );
    // The refusal is the key's answer (its receipt): the same keyed message is refused again once the
    // thread is idle — an attempt of it still in flight somewhere can never start a run its caller was
    // told was refused. A new key starts one.
    assert_eq!(runs.len(), 1);
    let (status, body) = http(|c| c.post(p.url("/api/messages")).json(&keyed));
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("thread_busy")),
        "{body}"
    );
    let mut fresh = keyed.clone();
    fresh["key"] = json!("k2");
    let (status, body) = http(|c| c.post(p.url("/api/messages")).json(&fresh));
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("started")),
        "{body}"
    );
}

#[test]
fn interrupt_soft_stops_the_live_run_then_runs_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), &[]);
    let first = started(&p, "i", "steps=50 ms=200 long job");
    support::child::wait_for("the first tool call", DEADLINE, || {
        events(&p, &first)
            .iter()
            .any(|e| e["type"] == "tool_call")
            .then_some(())
    });
    let (status, body) = send(&p, "i", "steps=0 stop, do this instead", Some("interrupt"));
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        (
            body["outcome"].as_str(),
            body["runId"].as_str(),
            body["position"].as_u64()
        ),
        (Some("interrupting"), Some(first.as_str()), Some(1))
    );
    let runs = finished_runs(&p, "i", 2);
    assert_eq!(id(&runs[0]), first);
    assert_eq!(runs[0]["status"], "stopped_soft", "{:#?}", runs[0]);
    assert_eq!(runs[1]["status"], "completed", "{:#?}", runs[1]);
    assert_one_after_another(&runs);
    let stop = events(&p, &first)
        .into_iter()
        .find(|e| e["type"] == "stop_requested")
        .expect("the interrupted run says who stopped it");
    assert_eq!(
        (stop["mode"].as_str(), stop["actor"]["kind"].as_str()),
        (Some("soft"), Some("interrupt")),
        "{stop}"
    );
    assert_eq!(inputs(&p, id(&runs[1])), ["steps=0 stop, do this instead"]);
}

#[test]
fn the_queue_survives_a_crash_and_a_kill_of_the_live_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Proc::start(dir.path(), &[]);
    let first = started(&p, "c", "steps=40 ms=200 doomed");
    for text in ["steps=1 ms=10 one", "steps=1 ms=10 two", "steps=0 three"] {
        let (status, body) = send(&p, "c", text, Some("enqueue"));
        assert_eq!(
            (status, body["outcome"].as_str()),
            (202, Some("queued")),
            "{body}"
        );
    }
    p.crash();
    let p = Proc::start(dir.path(), &[]);
    // The resumed run is killed: it goes, and what was queued behind it runs anyway, in order.
    support::child::wait_for("the resumed run", DEADLINE, || {
        events(&p, &first)
            .iter()
            .any(|e| e["type"] == "resumed")
            .then_some(())
    });
    let (status, body) = http(|c| c.delete(p.url(&format!("/api/runs/{first}"))));
    assert_eq!(status, 202, "{body}");
    let runs = finished_runs(&p, "c", 3);
    assert!(
        runs.iter().all(|r| id(r) != first),
        "the killed run is gone: {runs:#?}"
    );
    assert_one_after_another(&runs);
    let texts: Vec<Vec<String>> = runs.iter().map(|r| inputs(&p, id(r))).collect();
    assert_eq!(
        texts,
        [
            vec!["steps=1 ms=10 one".to_owned()],
            vec!["steps=1 ms=10 two".to_owned()],
            vec!["steps=0 three".to_owned()]
        ]
    );
}

#[test]
fn the_strategy_defaults_to_the_agents_then_defaults_and_a_bad_one_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let p = Proc::start(dir.path(), &[("SWITCHBOARD_DEFAULTS__STRATEGY", "enqueue")]);
    let first = started(&p, "d", "steps=2 ms=200 first");
    let (status, body) = send(&p, "d", "steps=0 next", None);
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("queued")),
        "{body}"
    );
    let (status, body) = send(&p, "d", "steps=0 x", Some("steer"));
    assert_eq!(
        (status, body["outcome"].as_str()),
        (202, Some("steered")),
        "{body}"
    );
    let (status, body) = send(&p, "d", "x", Some("rollback"));
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("strategy"),
        "{body}"
    );
    let runs = finished_runs(&p, "d", 2);
    assert_eq!(id(&runs[0]), first);
}
