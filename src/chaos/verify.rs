//! The verifier of `switchboard chaos`: wait until every run has settled, read every run back through the
//! JSON API of whichever process is up, read every workspace file, and count what breaks the contract
//! (SPEC §11) in a [`Verdict`].
//!
//! It reads nothing but the API and the shared `workspaces/` dir, so it is the same for every backend.
//! Counted as violations: an accepted message lost or duplicated, a repeated or late `append_file` line,
//! a run without its one final record (or with a live row left), two terminals, a run a 2xx named that
//! no listing shows, a repeated seq, a message in another thread's run, a `completed` record without its
//! answer, a tool call of a `completed` or `stopped_soft` record without its result, an `eventCount`
//! that is not the record's number of events; plus the fault driver's drain
//! failures and unexpected exits. What the contract allows (a refused or unanswered message admitted
//! once, a run closed `interrupted`) is a note at most.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};
use storage::RunId;

use anyhow::Context;
use serde_json::{json, Value};

use super::fleet::{Fault, FaultLog, Fleet};
use super::{Answer, ChaosArgs, Sent, Shown, LEASE_MS};
use crate::shared_db::DbSpec;

/// GET `path` from one live process after another until one answers 2xx JSON.
async fn get_json(http: &reqwest::Client, fleet: &Fleet, path: &str) -> anyhow::Result<Value> {
    let mut last = anyhow::anyhow!("no process is up");
    for attempt in 0..10 {
        let addrs = fleet.live_addrs();
        if let Some(addr) = addrs.get(attempt % addrs.len().max(1)) {
            match http.get(format!("http://{addr}{path}")).send().await {
                Ok(r) if r.status().is_success() => {
                    return r.json().await.with_context(|| format!("decode GET {path}"))
                }
                Ok(r) => last = anyhow::anyhow!("GET {path}: {}", r.status()),
                Err(e) => last = anyhow::Error::from(e).context(format!("GET {path}")),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last)
}

/// Every run the API lists (`status=all`, paged with `before`/`beforeId`), newest first, by id.
async fn list_all(http: &reqwest::Client, fleet: &Fleet) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<(i64, Option<String>)> = None;
    for _ in 0..10_000 {
        let mut path = "/api/runs?status=all&limit=200".to_owned();
        if let Some((before, id)) = &cursor {
            let _ = write!(path, "&before={before}");
            if let Some(id) = id {
                let _ = write!(path, "&beforeId={id}");
            }
        }
        let page = get_json(http, fleet, &path).await?;
        out.extend(page["runs"].as_array().cloned().unwrap_or_default());
        let next = page.get("nextBefore").filter(|n| !n.is_null()).map(|n| {
            (
                n["finishedAt"].as_i64().unwrap_or(0),
                n["id"].as_str().map(str::to_owned),
            )
        });
        match next {
            Some(n) if Some(&n) != cursor.as_ref() => cursor = Some(n),
            _ => return Ok(out),
        }
    }
    anyhow::bail!("the run listing never ended")
}

/// Every event of a run, paged with `afterSeq`.
async fn events_all(http: &reqwest::Client, fleet: &Fleet, id: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0u64;
    for _ in 0..10_000 {
        let page = get_json(
            http,
            fleet,
            &format!("/api/runs/{id}/events?afterSeq={after}&limit=500"),
        )
        .await?;
        out.extend(page["events"].as_array().cloned().unwrap_or_default());
        match page["nextAfterSeq"].as_u64() {
            Some(n) if n > after => after = n,
            _ => return Ok(out),
        }
    }
    anyhow::bail!("the events of run {id} never ended")
}

/// Whether a listed run has its final record: finished, not a tombstone, persisted.
fn has_final_record(run: &Value) -> bool {
    run["finished"] == true
        && run["provisional"] != true
        && run["persisted"] == true
        && run["status"].is_string()
}

/// Wait (≤ `within`) until no process lists an active run, the ledger has no live row and every listed
/// run has its final record. Answers whether that happened.
pub(super) async fn settle(http: &reqwest::Client, fleet: &Fleet, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let mut quiet = true;
        for addr in fleet.live_addrs() {
            let active = http
                .get(format!("http://{addr}/api/runs?status=active&limit=200"))
                .send()
                .await;
            let active: Option<Value> = match active {
                Ok(r) if r.status().is_success() => r.json().await.ok(),
                _ => None,
            };
            if active.is_none_or(|v| v["runs"].as_array().is_none_or(|r| !r.is_empty())) {
                quiet = false;
                break;
            }
        }
        if quiet {
            quiet = get_json(http, fleet, "/api/live")
                .await
                .is_ok_and(|v| v["runs"].as_array().is_some_and(Vec::is_empty));
        }
        if quiet {
            quiet = list_all(http, fleet)
                .await
                .is_ok_and(|runs| runs.iter().all(has_final_record));
        }
        if quiet {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

/// What the verifier counted. Every field but the informational ones is a violation when non-zero.
#[derive(Debug, Default)]
pub(super) struct Verdict {
    pub settled: bool,
    pub accepted: usize,
    pub steered: usize,
    pub unanswered: usize,
    pub refused: usize,
    pub runs: usize,
    pub faults: FaultLog,
    /// Accepted messages whose nonce is in no `input` event.
    pub lost_inputs: usize,
    /// Messages whose nonce is in more than one `input` event.
    pub duplicated_inputs: usize,
    /// `append_file` lines that repeat an earlier line of the same workspace file.
    pub duplicated_effects: usize,
    /// `append_file` lines below the highest step already written (written after a fence).
    pub out_of_order_effects: usize,
    /// Runs without their one final record: unfinished, a tombstone, or a live row left.
    pub stuck_runs: usize,
    /// Runs with more than one terminal event (`answer` / `run_failed`).
    pub duplicate_terminals: usize,
    /// Run ids a 2xx answer named that no listing shows.
    pub missing_runs: usize,
    /// Event seqs that repeat within a run.
    pub repeated_seqs: usize,
    /// Messages found in a run of another thread.
    pub crossed_threads: usize,
    /// `completed` records without an `answer` event.
    pub unanswered_completed: usize,
    /// `tool_call` events of `completed` / `stopped_soft` records with no `tool_result` for their call.
    pub calls_without_results: usize,
    /// Records whose `eventCount` is not the number of events they hold (untruncated records).
    pub miscounted_records: usize,
    /// Events a reader was served from the ledger (committed) that the run's record lacks under their seq.
    pub lost_shown_events: usize,
    /// Informational: committed events a reader was served, all checked against the records.
    pub shown_events: usize,
    /// Informational: refused messages that were admitted anyway (once).
    pub refused_but_present: usize,
    /// Informational: nonces found that no client sent.
    pub unknown_nonces: usize,
    /// With `--strategies`: messages queued (`enqueue`) or interrupting, informational.
    pub queued: usize,
    /// Queued or interrupting messages not answered in a run of their own (the request of a run other
    /// than the one they waited behind) that started once that run had ended.
    pub queue_breaches: usize,
    /// Queued messages whose run started before the run of a queued message answered before they were
    /// sent on the same thread had ended.
    pub queue_out_of_order: usize,
    /// Runs an `interrupting` answer named that did not end `stopped_soft`.
    pub interrupts_not_stopped: usize,
    /// With `--approvals`: the approvals the records hold against the workspaces and the approver.
    pub approvals: Option<super::approvals::ApprovalCounts>,
    /// With `--slack`: the cards and replies the Slack stand-in holds, per run.
    pub cards: Option<super::slack::CardCounts>,
    pub elapsed: Duration,
    /// One line per violation.
    pub details: Vec<String>,
    /// One line per informational finding.
    pub notes: Vec<String>,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.lost_inputs
            + self.duplicated_inputs
            + self.duplicated_effects
            + self.out_of_order_effects
            + self.stuck_runs
            + self.duplicate_terminals
            + self.missing_runs
            + self.repeated_seqs
            + self.crossed_threads
            + self.unanswered_completed
            + self.calls_without_results
            + self.miscounted_records
            + self.lost_shown_events
            + self.queue_breaches
            + self.queue_out_of_order
            + self.interrupts_not_stopped
            + self.faults.drain_failures
            + self.faults.unexpected_exits
            + self.cards.as_ref().map_or(0, |c| c.violations())
            + self.approvals.as_ref().map_or(0, |a| a.violations())
    }

    /// With `--strategies`: which, and the checks of their promises.
    fn strategies_json(&self, args: &ChaosArgs) -> Value {
        if args.strategies.is_empty() {
            return Value::Null;
        }
        json!({
            "mix": args.strategies.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "queued": self.queued, "queue_breaches": self.queue_breaches,
            "queue_out_of_order": self.queue_out_of_order,
            "interrupts_not_stopped": self.interrupts_not_stopped,
        })
    }

    fn faults_by_kind(&self) -> BTreeMap<&'static str, usize> {
        Fault::ALL
            .iter()
            .map(|f| (f.as_str(), self.faults.by_kind.get(f).copied().unwrap_or(0)))
            .collect()
    }

    pub fn table(&self, args: &ChaosArgs, db: &DbSpec, seed: u64) -> Vec<(&'static str, String)> {
        let kinds: Vec<String> = self
            .faults_by_kind()
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let on = match db {
            DbSpec::Sqlite => String::new(),
            other => format!(" on {}", other.name()),
        };
        let mut rows = vec![
            (
                "scenario",
                format!(
                    "chaos ({} clients, {} processes{on}{}{}, seed {seed})",
                    args.clients,
                    args.processes,
                    if args.slack { ", via Slack" } else { "" },
                    if args.approvals {
                        ", with approvals"
                    } else {
                        ""
                    }
                ),
            ),
            (
                "accepted (steered)",
                format!("{} ({})", self.accepted, self.steered),
            ),
            (
                "unanswered / refused",
                format!("{} / {}", self.unanswered, self.refused),
            ),
            ("runs", self.runs.to_string()),
            (
                "faults",
                format!(
                    "{} ({})",
                    self.faults.by_kind.values().sum::<usize>(),
                    kinds.join(", ")
                ),
            ),
            (
                "settled",
                if self.settled {
                    "yes".into()
                } else {
                    "no (waited for it past the deadline)".into()
                },
            ),
            ("lost inputs", self.lost_inputs.to_string()),
            ("duplicated inputs", self.duplicated_inputs.to_string()),
            ("duplicated effects", self.duplicated_effects.to_string()),
            (
                "out-of-order effects",
                self.out_of_order_effects.to_string(),
            ),
            ("stuck runs", self.stuck_runs.to_string()),
            ("duplicate terminals", self.duplicate_terminals.to_string()),
            ("missing runs", self.missing_runs.to_string()),
            ("repeated seqs", self.repeated_seqs.to_string()),
            ("crossed threads", self.crossed_threads.to_string()),
            (
                "completed without answer",
                self.unanswered_completed.to_string(),
            ),
            (
                "calls without results",
                self.calls_without_results.to_string(),
            ),
            ("miscounted records", self.miscounted_records.to_string()),
            (
                "lost shown events",
                format!(
                    "{} (of {} read from the ledger)",
                    self.lost_shown_events, self.shown_events
                ),
            ),
            ("drain failures", self.faults.drain_failures.to_string()),
        ];
        if !args.strategies.is_empty() {
            rows.extend([
                (
                    "strategies",
                    args.strategies
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                ("queued (+ interrupting)", self.queued.to_string()),
                ("queued, not own run", self.queue_breaches.to_string()),
                ("queue out of order", self.queue_out_of_order.to_string()),
                (
                    "interrupted, not stopped",
                    self.interrupts_not_stopped.to_string(),
                ),
            ]);
        }
        if let Some(a) = &self.approvals {
            rows.extend(a.rows());
        }
        if let Some(c) = &self.cards {
            rows.extend([
                (
                    "slack cards / replies",
                    format!("{} / {}", c.cards, c.replies),
                ),
                ("second cards", c.second_cards.to_string()),
                ("runs without a card", c.missing_cards.to_string()),
                ("cards left open", c.open_cards.to_string()),
                ("duplicated replies", c.duplicated_replies.to_string()),
                ("lost replies", c.lost_replies.to_string()),
            ]);
        }
        rows.extend([
            ("unexpected exits", self.faults.unexpected_exits.to_string()),
            ("elapsed", format!("{:.1} s", self.elapsed.as_secs_f64())),
            (
                "verdict",
                if self.violations() == 0 {
                    "ok".into()
                } else {
                    format!("{} violation(s)", self.violations())
                },
            ),
        ]);
        rows
    }

    pub fn json(&self, args: &ChaosArgs, db: &DbSpec, seed: u64, data: &Path) -> Value {
        json!({
            "scenario": "chaos", "seed": seed, "clients": args.clients, "processes": args.processes,
            "storage": db.name(), "lease_ms": LEASE_MS,
            "faults": self.faults.by_kind.values().sum::<usize>(), "faults_by_kind": self.faults_by_kind(),
            "pauses_skipped": self.faults.pauses_skipped, "crash_fallbacks": self.faults.crash_fallbacks,
            "accepted": self.accepted, "steered": self.steered, "unanswered": self.unanswered, "refused": self.refused,
            "runs": self.runs, "settled": self.settled,
            "lost_inputs": self.lost_inputs, "duplicated_inputs": self.duplicated_inputs,
            "duplicated_effects": self.duplicated_effects, "out_of_order_effects": self.out_of_order_effects,
            "stuck_runs": self.stuck_runs, "duplicate_terminals": self.duplicate_terminals,
            "missing_runs": self.missing_runs, "repeated_seqs": self.repeated_seqs,
            "crossed_threads": self.crossed_threads, "unanswered_completed": self.unanswered_completed,
            "strategies": self.strategies_json(args),
            "approvals": self.approvals.as_ref().map(super::approvals::ApprovalCounts::json),
            "calls_without_results": self.calls_without_results, "miscounted_records": self.miscounted_records,
            "lost_shown_events": self.lost_shown_events, "shown_events": self.shown_events,
            "drain_failures": self.faults.drain_failures,
            "unexpected_exits": self.faults.unexpected_exits,
            "refused_but_present": self.refused_but_present, "unknown_nonces": self.unknown_nonces,
            "slack": self.cards.as_ref().map(super::slack::CardCounts::json),
            "violations": self.violations(), "ok": self.violations() == 0,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "data_dir": if self.violations() > 0 || args.keep { Value::from(data.display().to_string()) } else { Value::Null },
        })
    }
}

/// What a finished record must hold (SPEC §5.2 steps 5 and 7): whether a `completed` run has its
/// answer; the calls of a `completed` or `stopped_soft` run that have no `tool_result`; and, for an
/// untruncated record, `(eventCount, events)` when they disagree (counts are event counts, never seqs).
fn record_gaps(run: &Value, events: &[Value]) -> (bool, Vec<String>, Option<(u64, u64)>) {
    let status = run["status"].as_str().unwrap_or_default();
    if !has_final_record(run) {
        return (true, Vec::new(), None);
    }
    let answered = status != "completed" || events.iter().any(|e| e["type"] == "answer");
    let calls = if matches!(status, "completed" | "stopped_soft") {
        let results: HashSet<&str> = events
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .filter_map(|e| e["callId"].as_str())
            .collect();
        events
            .iter()
            .filter(|e| e["type"] == "tool_call")
            .filter_map(|e| e["callId"].as_str())
            .filter(|c| !results.contains(c))
            .map(str::to_owned)
            .collect()
    } else {
        Vec::new()
    };
    let said = run["eventCount"].as_u64().unwrap_or_default();
    let held = events.len() as u64;
    let count = (run["truncated"] != true && said != held).then_some((said, held));
    (answered, calls, count)
}

/// The committed events a reader was shown that the record of `run_id` does not hold under the same seq,
/// type and call.
fn lost_shown<'a>(shown: &[&'a Shown], run_id: &RunId, events: &[Value]) -> Vec<&'a Shown> {
    let held: HashSet<Shown> = events.iter().filter_map(|e| Shown::of(run_id, e)).collect();
    shown
        .iter()
        .copied()
        .filter(|s| !held.contains(*s))
        .collect()
}

/// Wall-clock milliseconds since the Unix epoch (what the server stamps `startedAt` and `finishedAt` with).
pub(super) fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// SPEC §5.1's promises for queued (`enqueue`) and interrupting messages: each is the request of a run of
/// its own, which started once the run it waited behind had ended (an interrupted one `stopped_soft`),
/// and on one thread, a message sent after another's answer came runs after that one's run ended.
fn check_queues(
    v: &mut Verdict,
    sent: &[Sent],
    runs: &BTreeMap<String, Value>,
    requests: &HashMap<String, String>,
    found: &HashMap<String, Vec<(String, String)>>,
) {
    let time = |id: &str, field: &str| runs.get(id).and_then(|r| r[field].as_i64());
    let mut own: Vec<(&Sent, &str)> = Vec::new();
    for s in sent {
        let Answer::Accepted {
            outcome,
            run_id: behind,
        } = &s.answer
        else {
            continue;
        };
        if !matches!(outcome.as_str(), "queued" | "interrupting") {
            continue;
        }
        if found.get(&s.nonce).is_none_or(Vec::is_empty) {
            continue; // counted as a lost input
        }
        let Some(run) = requests.get(&s.nonce).filter(|r| *r != behind) else {
            v.queue_breaches += 1;
            v.details.push(format!(
                "{outcome} message {} (behind {behind}) is not the request of a run of its own",
                s.nonce
            ));
            continue;
        };
        if let (Some(start), Some(end)) = (time(run, "startedAt"), time(behind, "finishedAt")) {
            if start < end {
                v.queue_breaches += 1;
                v.details.push(format!(
                    "{outcome} message {}: its run {run} started at {start}, before {behind} ended at {end}",
                    s.nonce
                ));
            }
        }
        if outcome == "interrupting" {
            let status = runs.get(behind.as_str()).map(|r| r["status"].clone());
            if status.as_ref().and_then(Value::as_str) != Some("stopped_soft") {
                v.interrupts_not_stopped += 1;
                v.details.push(format!(
                    "run {behind}, interrupted by {}, ended {status:?}",
                    s.nonce
                ));
            }
        }
        own.push((s, run));
    }
    for (a, run_a) in &own {
        for (b, run_b) in &own {
            if a.thread_key != b.thread_key || a.answered_ms >= b.sent_ms {
                continue;
            }
            if let (Some(end_a), Some(start_b)) =
                (time(run_a, "finishedAt"), time(run_b, "startedAt"))
            {
                if start_b < end_a {
                    v.queue_out_of_order += 1;
                    v.details.push(format!(
                        "queued {} was sent after {} was answered, but its run {run_b} started at {start_b}, before {run_a} ended at {end_a}",
                        b.nonce, a.nonce
                    ));
                }
            }
        }
    }
}

/// Every `nonce=` token in a text.
fn nonces_in(text: &str) -> Vec<&str> {
    text.match_indices("nonce=")
        .map(|(i, m)| {
            let rest = &text[i + m.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.is_empty())
        .collect()
}

/// `append_file` lines (`step <n>`) of one workspace file: (repeats, lines below the highest so far).
fn effect_order(log: &str) -> (usize, usize) {
    let (mut seen, mut high, mut dup, mut late) = (HashSet::new(), 0u64, 0, 0);
    for n in log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("step ")?.parse::<u64>().ok())
    {
        if !seen.insert(n) {
            dup += 1;
        } else if n < high {
            late += 1;
        }
        high = high.max(n);
    }
    (dup, late)
}

pub(super) async fn verify(
    http: &reqwest::Client,
    fleet: &Fleet,
    sent: &[Sent],
    shown: &[Shown],
    settled: bool,
    slack: Option<&crate::slack_stub::SlackStub>,
    decisions: Option<&[super::approvals::Sent]>,
) -> anyhow::Result<Verdict> {
    let mut approvals: HashMap<String, super::approvals::RunApprovals> = HashMap::new();
    let mut v = Verdict {
        settled,
        shown_events: shown.len(),
        ..Verdict::default()
    };
    for s in sent {
        match &s.answer {
            Answer::Accepted { outcome, .. } => {
                v.accepted += 1;
                match outcome.as_str() {
                    "steered" => v.steered += 1,
                    "queued" | "interrupting" => v.queued += 1,
                    _ => {}
                }
            }
            Answer::Refused { .. } => v.refused += 1,
            Answer::Unanswered => v.unanswered += 1,
        }
    }
    let mut runs: BTreeMap<String, Value> = BTreeMap::new();
    for run in list_all(http, fleet).await.context("list every run")? {
        if let Some(id) = run["id"].as_str() {
            runs.entry(id.to_owned()).or_insert(run);
        }
    }
    v.runs = runs.len();

    // Terminal records and live rows.
    let live = get_json(http, fleet, "/api/live")
        .await
        .context("read the live rows")?;
    let mut stuck: BTreeMap<String, String> = BTreeMap::new();
    for row in live["runs"].as_array().into_iter().flatten() {
        let id = row["runId"]
            .as_str()
            .or(row["run_id"].as_str())
            .or(row["id"].as_str())
            .unwrap_or("?");
        stuck.insert(id.to_owned(), format!("a live row remains: {row}"));
    }
    for (id, run) in &runs {
        if !has_final_record(run) {
            stuck.entry(id.clone()).or_insert_with(|| {
                format!(
                    "no final record (finished {}, status {}, provisional {}, persisted {})",
                    run["finished"], run["status"], run["provisional"], run["persisted"]
                )
            });
        }
    }
    v.stuck_runs = stuck.len();
    for (id, why) in &stuck {
        v.details.push(format!("stuck run {id}: {why}"));
    }
    for s in sent {
        if let Answer::Accepted { run_id, outcome } = &s.answer {
            if !run_id.is_empty()
                && !runs.contains_key(run_id.as_str())
                && !stuck.contains_key(run_id.as_str())
            {
                v.missing_runs += 1;
                v.details.push(format!(
                    "missing run {run_id}: answered {outcome} for {} on {}",
                    s.nonce, s.thread_key
                ));
            }
        }
    }

    // Events: seqs, terminals, inputs, and what readers were shown.
    let mut shown_by_run: HashMap<&str, Vec<&Shown>> = HashMap::new();
    for s in shown {
        shown_by_run.entry(s.run_id.as_str()).or_default().push(s);
    }
    let mut found: HashMap<String, Vec<(String, String)>> = HashMap::new();
    // Where a nonce shows in an answer (the scripted agent echoes the follow-ups it read): tells a lost
    // `input` event of a message a run did read apart from a message no run ever read.
    let mut answered: HashMap<String, String> = HashMap::new();
    let mut slack_runs: Vec<(String, Vec<Value>)> = Vec::new();
    // The run each message started as its request (its own run).
    let mut requests: HashMap<String, String> = HashMap::new();
    for (id, run) in &runs {
        let events = events_all(http, fleet, id)
            .await
            .with_context(|| format!("read the events of run {id}"))?;
        if slack.is_some() {
            slack_runs.push((id.clone(), events.clone()));
        }
        if decisions.is_some() && has_final_record(run) {
            let a = super::approvals::RunApprovals::of(&events);
            if !a.is_empty() {
                approvals.insert(id.clone(), a);
            }
        }
        let mut seqs = HashSet::new();
        let mut terminals = 0;
        for e in &events {
            if let Some(seq) = e["seq"].as_u64() {
                if !seqs.insert(seq) {
                    v.repeated_seqs += 1;
                    v.details.push(format!("repeated seq {seq} in run {id}"));
                }
            }
            match e["type"].as_str() {
                Some("answer" | "run_failed") => {
                    terminals += 1;
                    for n in nonces_in(e["text"].as_str().unwrap_or("")) {
                        answered.entry(n.to_owned()).or_insert_with(|| id.clone());
                    }
                }
                Some("input") => {
                    if e["source"] == "request" {
                        for n in nonces_in(e["text"].as_str().unwrap_or("")) {
                            requests.insert(n.to_owned(), id.clone());
                        }
                    }
                    for n in nonces_in(e["text"].as_str().unwrap_or("")) {
                        let thread = run["threadKey"].as_str().unwrap_or("").to_owned();
                        found
                            .entry(n.to_owned())
                            .or_default()
                            .push((id.clone(), thread));
                    }
                }
                _ => {}
            }
        }
        if terminals > 1 {
            v.duplicate_terminals += 1;
            v.details.push(format!(
                "run {id} has {terminals} terminal events (answer / run_failed)"
            ));
        }
        if has_final_record(run) && run["truncated"] != true {
            let lost = lost_shown(
                shown_by_run
                    .get(id.as_str())
                    .map(Vec::as_slice)
                    .unwrap_or_default(),
                &RunId::from(id),
                &events,
            );
            if !lost.is_empty() {
                v.lost_shown_events += lost.len();
                v.details.push(format!(
                    "run {id}: events served from the ledger are missing from its record: {lost:?}"
                ));
            }
        }
        let (answer, calls, count) = record_gaps(run, &events);
        if !answer {
            v.unanswered_completed += 1;
            v.details
                .push(format!("run {id} is completed without an answer event"));
        }
        if !calls.is_empty() {
            v.calls_without_results += calls.len();
            v.details.push(format!(
                "run {id} ({}) has tool calls without a result: {calls:?}",
                run["status"]
            ));
        }
        if let Some((said, held)) = count {
            v.miscounted_records += 1;
            v.details
                .push(format!("run {id} says eventCount {said} for {held} events"));
        }
    }

    // Messages against what the runs hold.
    let by_nonce: HashMap<&str, &Sent> = sent.iter().map(|s| (s.nonce.as_str(), s)).collect();
    for s in sent {
        let places = found.get(&s.nonce).map(Vec::as_slice).unwrap_or(&[]);
        match (&s.answer, places.len()) {
            (Answer::Accepted { outcome, run_id }, 0) => {
                v.lost_inputs += 1;
                let read = match answered.get(&s.nonce) {
                    Some(r) => format!("read: the answer of run {r} names it"),
                    None => "no run read it".into(),
                };
                v.details.push(format!(
                    "lost input {} ({outcome} into run {run_id} on {}; {read})",
                    s.nonce, s.thread_key
                ));
            }
            (Answer::Refused { status }, 1) => {
                v.refused_but_present += 1;
                v.notes.push(format!(
                    "refused ({status}) message {} was admitted anyway (run {})",
                    s.nonce, places[0].0
                ));
            }
            (_, 0 | 1) => {}
            (answer, n) => {
                v.duplicated_inputs += 1;
                let runs: Vec<&str> = places.iter().map(|(r, _)| r.as_str()).collect();
                v.details.push(format!(
                    "duplicated input {} ({answer:?}): {n} input events, runs {runs:?}",
                    s.nonce
                ));
            }
        }
        let crossed: Vec<&(String, String)> =
            places.iter().filter(|(_, t)| *t != s.thread_key).collect();
        if !crossed.is_empty() {
            v.crossed_threads += 1;
            v.details.push(format!(
                "crossed thread: {} was sent to {} but is in {crossed:?}",
                s.nonce, s.thread_key
            ));
        }
    }
    check_queues(&mut v, sent, &runs, &requests, &found);
    v.unknown_nonces = found
        .keys()
        .filter(|n| !by_nonce.contains_key(n.as_str()))
        .count();
    if v.runs >= 19_000 {
        v.notes.push(format!(
            "{} runs: near the 20000-run retention cap, so trimmed runs may count as lost",
            v.runs
        ));
    }

    if let Some(stub) = slack {
        v.cards = Some(super::slack::check(stub, &slack_runs, &mut v.details));
    }
    if let Some(decisions) = decisions {
        v.approvals = Some(super::approvals::check(
            &approvals,
            decisions,
            &fleet.data.join("workspaces"),
            &mut v.details,
        ));
    }

    // Workspaces: every steps.log on disk, whether or not its run is listed.
    let root = fleet.data.join("workspaces");
    if let Ok(dirs) = std::fs::read_dir(&root) {
        for dir in dirs.flatten() {
            let Ok(log) = std::fs::read_to_string(dir.path().join("steps.log")) else {
                continue;
            };
            let (dup, late) = effect_order(&log);
            if dup + late > 0 {
                let id = dir.file_name().to_string_lossy().into_owned();
                v.duplicated_effects += dup;
                v.out_of_order_effects += late;
                let lines: Vec<&str> = log.lines().collect();
                v.details.push(format!("workspace {id}: {dup} repeated and {late} out-of-order append_file lines: {lines:?}"));
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_record_must_hold_its_answer_its_results_and_a_true_count() {
        let run = |status: &str, count: u64| json!({"status": status, "finished": true, "persisted": true, "eventCount": count});
        let call = |id: &str| json!({"type": "tool_call", "callId": id});
        let result = |id: &str| json!({"type": "tool_result", "callId": id});
        let answer = json!({"type": "answer", "text": "a"});
        let whole = vec![call("c1"), result("c1"), answer.clone()];
        assert_eq!(
            record_gaps(&run("completed", 3), &whole),
            (true, vec![], None)
        );
        assert_eq!(
            record_gaps(&run("completed", 2), &whole[..2]),
            (false, vec![], None),
            "completed without its answer"
        );
        assert_eq!(
            record_gaps(&run("completed", 1014), &whole),
            (true, vec![], Some((1014, 3))),
            "a seq is not a count"
        );
        let cut = vec![call("c1"), call("c2"), result("c1"), answer];
        assert_eq!(
            record_gaps(&run("stopped_soft", 4), &cut),
            (true, vec!["c2".to_owned()], None)
        );
        assert_eq!(
            record_gaps(&run("stopped_hard", 4), &cut),
            (true, vec![], None),
            "a hard stop drops calls in flight"
        );
        assert_eq!(
            record_gaps(&run("interrupted", 4), &cut),
            (true, vec![], None)
        );
    }

    #[test]
    fn a_committed_event_a_reader_was_shown_must_stay_under_its_seq() {
        let ev = |seq: u64, kind: &str, call: Option<&str>| {
            let mut e = json!({"type": kind, "seq": seq});
            if let Some(c) = call {
                e["callId"] = json!(c);
            }
            e
        };
        let record = [
            ev(1, "run_meta", None),
            ev(4, "tool_call", Some("c1")),
            ev(5, "tool_result", Some("c1")),
            ev(1006, "resumed", None),
        ];
        let seen = [
            ev(4, "tool_call", Some("c1")),
            ev(5, "tool_result", Some("c1")),
            ev(6, "tool_call", Some("c2")),
            ev(5, "tool_result", Some("c9")),
        ];
        let shown: Vec<Shown> = seen
            .iter()
            .filter_map(|e| Shown::of(&RunId::from("r1"), e))
            .collect();
        let refs: Vec<&Shown> = shown.iter().collect();
        let lost: Vec<(u64, Option<String>)> = lost_shown(&refs, &RunId::from("r1"), &record)
            .into_iter()
            .map(|s| (s.seq, s.call_id.clone()))
            .collect();
        assert_eq!(
            lost,
            vec![(6, Some("c2".to_owned())), (5, Some("c9".to_owned()))],
            "a vanished seq, and a seq now holding another call"
        );
    }

    #[test]
    fn queued_messages_must_run_on_their_own_after_what_they_waited_behind_and_in_order() {
        let sent =
            |nonce: &str, outcome: &str, behind: &str, sent_ms: i64, answered_ms: i64| Sent {
                nonce: nonce.into(),
                thread_key: "chaos:t0".into(),
                answer: Answer::Accepted {
                    outcome: outcome.into(),
                    run_id: behind.into(),
                },
                sent_ms,
                answered_ms,
            };
        let run = |status: &str, started: i64, finished: i64| json!({"status": status, "startedAt": started, "finishedAt": finished});
        let runs: BTreeMap<String, Value> = [
            ("r0".to_owned(), run("stopped_soft", 0, 100)),
            ("r1".to_owned(), run("completed", 100, 200)),
            ("r2".to_owned(), run("completed", 150, 300)),
            ("r3".to_owned(), run("completed", 90, 400)),
            ("r4".to_owned(), run("completed", 500, 600)),
        ]
        .into();
        let messages = [
            sent("a", "interrupting", "r0", 10, 11),
            sent("b", "queued", "r0", 12, 13), // ran in r2, which started before r1 (a's run) ended
            sent("c", "queued", "r1", 300, 301), // ran in r3, which started before r1 ended
            sent("d", "interrupting", "r1", 400, 401), // r1 ended completed, not stopped
            sent("e", "queued", "r4", 402, 403), // ran in r4 itself: not a run of its own
        ];
        let requests: HashMap<String, String> = [
            ("a", "r1"),
            ("b", "r2"),
            ("c", "r3"),
            ("d", "r4"),
            ("e", "r4"),
        ]
        .into_iter()
        .map(|(n, r)| (n.to_owned(), r.to_owned()))
        .collect();
        let found: HashMap<String, Vec<(String, String)>> = requests
            .iter()
            .map(|(n, r)| (n.clone(), vec![(r.clone(), "chaos:t0".to_owned())]))
            .collect();
        let mut v = Verdict::default();
        check_queues(&mut v, &messages, &runs, &requests, &found);
        assert_eq!(v.interrupts_not_stopped, 1, "{:?}", v.details);
        assert_eq!(
            v.queue_breaches, 2,
            "c started before r1 ended; e is not its own run: {:?}",
            v.details
        );
        assert!(
            v.queue_out_of_order >= 1,
            "b's run started before a's ended: {:?}",
            v.details
        );
    }

    #[test]
    fn nonces_are_found_inside_joined_successor_requests() {
        let joined = "tool=append_file steps=3 ms=50 nonce=q01x000007\n\ntool=append_file steps=3 ms=50 nonce=q02x000011";
        assert_eq!(nonces_in(joined), vec!["q01x000007", "q02x000011"]);
        assert_eq!(
            nonces_in("no nonce here, nonce= either"),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn effect_order_counts_repeats_and_late_lines_apart() {
        // A resume may skip a step (its call settled effects-unknown): a gap is fine.
        assert_eq!(effect_order("step 1\nstep 2\nstep 4\n"), (0, 0));
        // The same step twice: a mutating call ran twice.
        assert_eq!(effect_order("step 1\nstep 2\nstep 2\nstep 3\n"), (1, 0));
        // A stale owner writing step 2 after the new owner wrote step 3.
        assert_eq!(effect_order("step 1\nstep 3\nstep 2\n"), (0, 1));
        // Other lines are not effects of the scripted agent.
        assert_eq!(effect_order("hello\nstep 1\n"), (0, 0));
    }
}
