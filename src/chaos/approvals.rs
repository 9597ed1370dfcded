//! `chaos --approvals`: every `append_file` call of the clients' runs needs a person's approval (SPEC §13).
//! An approver decides each request it finds, at a random moment, approve or deny, through a random
//! process; the faults keep coming. The verifier then holds every run's record against what the approver
//! was told and what the workspaces hold: an approved call ran at most once (its line, or a result that
//! says its effects are unknown), a denied or undecided call never ran, a request is made once per call
//! however often its run parks, a decision is committed before its call's result, and a decision the
//! approver got a 200 for is the one the record keeps.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storage::RunId;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::fleet::Fleet;

/// How long a request waits before it is denied by `timeout`: the approver misses some (a fault took
/// its process, the run parked again elsewhere), and those end this way.
pub(super) const APPROVAL_TIMEOUT_MS: u64 = 8_000;

/// The `config.toml` part that makes the clients' agent ask before each `append_file` call.
pub(super) fn config() -> String {
    format!(
        "[agents.demo]\nkind = \"scripted\"\napprove = [\"append_*\"]\napproval_timeout_ms = {APPROVAL_TIMEOUT_MS}\n"
    )
}

/// One decision the approver sent.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub run_id: RunId,
    pub call_id: String,
    pub decision: &'static str,
    /// The HTTP status (0: no answer).
    pub status: u16,
}

/// Decisions the approver has in flight or had answered (200, 409), so it decides each call once; one
/// that got no answer, or a refusal to answer (a process going down), is asked again.
type Asked = Arc<Mutex<std::collections::HashSet<(String, String)>>>;

/// The approver: lists the runs awaiting approval on a random process, and decides each pending call it
/// has not decided yet — approving seven in ten — after a random pause, through a random process (each
/// decision a task of its own, so one slow answer holds up no other).
pub(super) async fn approver_loop(
    seed: u64,
    fleet: Arc<Fleet>,
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xa99_0fe5);
    let Ok(http) = super::client() else { return };
    let asked: Asked = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    while !stop.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..80))).await;
        while tasks.try_join_next().is_some() {}
        let addrs = fleet.live_addrs();
        if addrs.is_empty() {
            continue;
        }
        let addr = addrs[rng.random_range(0..addrs.len())].clone();
        let get = |path: String| {
            let http = http.clone();
            async move {
                let r = http.get(path).send().await.ok()?;
                r.status().is_success().then_some(())?;
                r.json::<Value>().await.ok()
            }
        };
        let Some(parked) = get(format!(
            "http://{addr}/api/runs?status=awaiting_approval&limit=200"
        ))
        .await
        else {
            continue;
        };
        let runs: Vec<String> = parked["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["id"].as_str().map(str::to_owned))
            .collect();
        for run_id in runs {
            let Some(page) = get(format!(
                "http://{addr}/api/runs/{run_id}/events?afterSeq=0&limit=500"
            ))
            .await
            else {
                continue;
            };
            let events = page["events"].as_array().cloned().unwrap_or_default();
            for call_id in pending_calls(&events) {
                let key = (run_id.clone(), call_id.clone());
                if !asked.lock().unwrap_or_else(|p| p.into_inner()).insert(key) {
                    continue;
                }
                let decision = if rng.random_bool(0.7) {
                    "approve"
                } else {
                    "deny"
                };
                // A person takes their time: sometimes long enough for a fault to land in between.
                let pause = Duration::from_millis(rng.random_range(0..300));
                // Half the decisions go to the process the run was listed on (often its owner, which
                // applies it at once), half to any process (the owner then reads it at its next poll).
                let pick = rng
                    .random_bool(0.5)
                    .then(|| rng.random_range(0..usize::MAX));
                let (http, fleet, sent, run_id, asked) = (
                    http.clone(),
                    fleet.clone(),
                    sent.clone(),
                    run_id.clone(),
                    asked.clone(),
                );
                let listed_on = addr.clone();
                tasks.spawn(async move {
                    tokio::time::sleep(pause).await;
                    let addrs = fleet.live_addrs();
                    let to = match pick {
                        None => listed_on,
                        Some(k) => match addrs.get(k % addrs.len().max(1)) {
                            Some(a) => a.clone(),
                            None => return,
                        },
                    };
                    let status = match http
                        .post(format!("http://{to}/api/runs/{run_id}/approvals/{call_id}"))
                        .json(&json!({"decision": decision}))
                        .send()
                        .await
                    {
                        Ok(r) => r.status().as_u16(),
                        Err(_) => 0,
                    };
                    if !matches!(status, 200 | 409) {
                        asked
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&(run_id.clone(), call_id.clone()));
                    }
                    sent.lock().unwrap_or_else(|p| p.into_inner()).push(Sent {
                        run_id: RunId::from(run_id),
                        call_id,
                        decision,
                        status,
                    });
                });
            }
        }
    }
    tasks.shutdown().await;
}

/// The calls `events` request approval of and do not decide.
fn pending_calls(events: &[Value]) -> Vec<String> {
    let decided: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "approval_decided")
        .filter_map(|e| e["callId"].as_str())
        .collect();
    events
        .iter()
        .filter(|e| e["type"] == "approval_requested")
        .filter_map(|e| e["callId"].as_str())
        .filter(|c| !decided.contains(c))
        .map(str::to_owned)
        .collect()
}

/// What one run's record says of its approvals.
#[derive(Debug, Default)]
pub(super) struct RunApprovals {
    /// `approval_requested` events per call.
    requested: BTreeMap<String, usize>,
    /// The first `approval_decided` per call: (decision, seq).
    decided: BTreeMap<String, (String, u64)>,
    /// `tool_result` per call: (seq, effects unknown).
    results: BTreeMap<String, (u64, bool)>,
}

impl RunApprovals {
    pub fn of(events: &[Value]) -> RunApprovals {
        let mut a = RunApprovals::default();
        for e in events {
            let (Some(call), seq) = (e["callId"].as_str(), e["seq"].as_u64().unwrap_or(0)) else {
                continue;
            };
            match e["type"].as_str() {
                Some("approval_requested") => *a.requested.entry(call.to_owned()).or_default() += 1,
                Some("approval_decided") => {
                    let d = e["decision"].as_str().unwrap_or("").to_owned();
                    a.decided.entry(call.to_owned()).or_insert((d, seq));
                }
                Some("tool_result") => {
                    let unknown = e["effectsUnknown"] == true;
                    a.results.entry(call.to_owned()).or_insert((seq, unknown));
                }
                _ => {}
            }
        }
        a
    }

    pub fn is_empty(&self) -> bool {
        self.requested.is_empty()
    }
}

/// What the verifier counted of approvals.
#[derive(Debug, Default, Clone)]
pub(super) struct ApprovalCounts {
    /// Informational: calls requested, decided approve / deny (a timeout is a deny), and the approver's
    /// decisions answered 200 / 409.
    pub requested: usize,
    pub approved: usize,
    pub denied: usize,
    pub taken: usize,
    pub decided_already: usize,
    /// Violations.
    pub denied_ran: usize,
    pub undecided_ran: usize,
    pub approved_twice: usize,
    pub approved_lost: usize,
    pub repeated_requests: usize,
    pub result_before_decision: usize,
    pub decision_changed: usize,
}

impl ApprovalCounts {
    pub fn violations(&self) -> usize {
        self.denied_ran
            + self.undecided_ran
            + self.approved_twice
            + self.approved_lost
            + self.repeated_requests
            + self.result_before_decision
            + self.decision_changed
    }

    pub fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "approvals requested",
                format!(
                    "{} (approved {}, denied {}; approver 200 / 409: {} / {})",
                    self.requested, self.approved, self.denied, self.taken, self.decided_already
                ),
            ),
            ("denied calls that ran", self.denied_ran.to_string()),
            ("undecided calls that ran", self.undecided_ran.to_string()),
            ("approved calls run twice", self.approved_twice.to_string()),
            ("approved calls lost", self.approved_lost.to_string()),
            ("repeated requests", self.repeated_requests.to_string()),
            (
                "results before decision",
                self.result_before_decision.to_string(),
            ),
            ("decisions changed", self.decision_changed.to_string()),
        ]
    }

    pub fn json(&self) -> Value {
        json!({
            "requested": self.requested, "approved": self.approved, "denied": self.denied,
            "taken": self.taken, "decided_already": self.decided_already,
            "denied_ran": self.denied_ran, "undecided_ran": self.undecided_ran,
            "approved_twice": self.approved_twice, "approved_lost": self.approved_lost,
            "repeated_requests": self.repeated_requests,
            "result_before_decision": self.result_before_decision,
            "decision_changed": self.decision_changed,
        })
    }
}

/// Hold each finished run's approvals against its workspace (`append_file` writes `step <n>` for
/// `call-<n>`) and the approver's answers.
pub(super) fn check(
    runs: &HashMap<String, RunApprovals>,
    sent: &[Sent],
    workspaces: &Path,
    details: &mut Vec<String>,
) -> ApprovalCounts {
    let mut c = ApprovalCounts::default();
    for (run_id, a) in runs {
        let log =
            std::fs::read_to_string(workspaces.join(run_id).join("steps.log")).unwrap_or_default();
        let lines = |call: &str| {
            let want = call.strip_prefix("call-").map(|n| format!("step {n}"));
            log.lines()
                .filter(|l| Some(l.trim()) == want.as_deref())
                .count()
        };
        for (call, n) in &a.requested {
            c.requested += 1;
            if *n > 1 {
                c.repeated_requests += 1;
                details.push(format!("run {run_id}: {n} approval requests of {call}"));
            }
            let ran = lines(call);
            match a.decided.get(call).map(|(d, seq)| (d.as_str(), *seq)) {
                Some(("approve", seq)) => {
                    c.approved += 1;
                    if ran > 1 {
                        c.approved_twice += 1;
                        details.push(format!("run {run_id}: approved {call} ran {ran} times"));
                    }
                    match a.results.get(call) {
                        Some((rseq, _)) if *rseq < seq => {
                            c.result_before_decision += 1;
                            details.push(format!(
                                "run {run_id}: {call}'s result (seq {rseq}) precedes its decision (seq {seq})"
                            ));
                        }
                        // Ran, or settled effects-unknown after a crash mid-call: either is a call's end.
                        Some((_, unknown)) if ran == 1 || *unknown => {}
                        // No result: the run ended before the call (a stop, a close) — it must not have run.
                        None if ran == 0 => {}
                        other => {
                            c.approved_lost += 1;
                            details.push(format!(
                                "run {run_id}: approved {call} ran {ran} times with result {other:?}"
                            ));
                        }
                    }
                }
                Some((_, _)) => {
                    c.denied += 1;
                    if ran > 0 {
                        c.denied_ran += 1;
                        details.push(format!("run {run_id}: denied {call} ran {ran} times"));
                    }
                }
                None if ran > 0 => {
                    c.undecided_ran += 1;
                    details.push(format!("run {run_id}: undecided {call} ran {ran} times"));
                }
                None => {}
            }
        }
    }
    for s in sent {
        match s.status {
            200 => {
                c.taken += 1;
                let kept = runs
                    .get(s.run_id.as_str())
                    .and_then(|a| a.decided.get(&s.call_id))
                    .map(|(d, _)| d.as_str());
                // A run killed or closed before it applied the decision keeps no event: only a kept one
                // that differs is a breach.
                if kept.is_some_and(|k| k != s.decision) {
                    c.decision_changed += 1;
                    details.push(format!(
                        "run {}: {} was answered 200 for {} but the record says {kept:?}",
                        s.run_id, s.call_id, s.decision
                    ));
                }
            }
            409 => c.decided_already += 1,
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, call: &str, seq: u64, extra: Value) -> Value {
        let mut e = json!({"type": kind, "callId": call, "seq": seq});
        if let (Some(e), Some(x)) = (e.as_object_mut(), extra.as_object()) {
            e.extend(x.clone());
        }
        e
    }

    #[test]
    fn approvals_are_held_against_the_workspace_and_the_answers() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::create_dir_all(ws.join("r1")).unwrap();
        std::fs::write(ws.join("r1/steps.log"), "step 1\nstep 3\n").unwrap();
        let events = vec![
            ev("approval_requested", "call-1", 4, json!({})),
            ev(
                "approval_decided",
                "call-1",
                5,
                json!({"decision": "approve"}),
            ),
            ev("tool_result", "call-1", 6, json!({})),
            ev("approval_requested", "call-2", 8, json!({})),
            ev("approval_requested", "call-2", 9, json!({})),
            ev(
                "approval_decided",
                "call-2",
                10,
                json!({"decision": "deny"}),
            ),
            ev("tool_result", "call-2", 11, json!({"denied": true})),
            ev("approval_requested", "call-3", 13, json!({})),
        ];
        assert_eq!(pending_calls(&events), ["call-3"]);
        let runs: HashMap<String, RunApprovals> =
            [("r1".to_owned(), RunApprovals::of(&events))].into();
        let sent = vec![
            Sent {
                run_id: "r1".into(),
                call_id: "call-2".into(),
                decision: "approve",
                status: 200,
            },
            Sent {
                run_id: "r1".into(),
                call_id: "call-1".into(),
                decision: "deny",
                status: 409,
            },
        ];
        let mut details = Vec::new();
        let c = check(&runs, &sent, ws, &mut details);
        assert_eq!(
            (
                c.requested,
                c.approved,
                c.denied,
                c.taken,
                c.decided_already
            ),
            (3, 1, 1, 1, 1)
        );
        assert_eq!(c.repeated_requests, 1, "call-2 was requested twice");
        assert_eq!(c.undecided_ran, 1, "call-3 ran without a decision");
        assert_eq!(c.decision_changed, 1, "a 200 for approve, a record of deny");
        assert_eq!((c.denied_ran, c.approved_twice, c.approved_lost), (0, 0, 0));
        assert_eq!(c.violations(), 3, "{details:?}");
    }
}
