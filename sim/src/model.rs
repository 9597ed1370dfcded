//! What the world saw, and what must hold once a seed has quiesced.
//!
//! | invariant | checked | what it means |
//! |---|---|---|
//! | `tools after their step record` | at each tool effect | the ledger's step record does not name the call that runs |
//! | `no call runs unapproved` | at each tool effect (seeds with approvals) | a call that needs approval runs while its row does not hold an `approve` decision for it |
//! | `mutating effect at most once` | at each tool effect | a mutating call's effect landed twice (a re-run) |
//! | `effect after workspace takeover` | at each mutating effect | the workspace fence names another incarnation, yet the write landed |
//! | `no live row remains` | at the end | every run ended within the give-up time |
//! | `one card per run` | at the end (chat seeds where no process loses a lease: no pause, lease expiry or outage) | a run posted a second status card in its thread |
//! | `one answer per run` | at the end (chat seeds without a permanent storage fault) | a run's answer was posted twice in its thread |
//! | `one terminal record` | at the end | every run the ledger held, unkilled, has a final (non-provisional) record |
//! | `seqs strictly increase` | at the end | within each record |
//! | `completed without answer` | at the end | a `completed` record has no `answer` event |
//! | `the record keeps its gate` | at the end | a run seen past its finishing gate has a record of another status (than the gate's, or `failed` for a `completed` one whose reply failed) or without the answer the gate saved |
//! | `accepted exactly once` | at the end | an accepted message is exactly one `input` event of one run (≤ 1 when its answer was lost, 0 when refused; ≤ 1 on a thread with a kill) |
//! | `no follow-up crosses threads` | at the end | an `input` only in a run of its own thread |
//! | `accepted messages get answered` | at the end | no accepted message ends in an `interrupted` run unless a permanent storage fault or an outage landed |

use std::collections::{BTreeMap, BTreeSet};
use storage::RunId;

use serde_json::Value;
use storage::actor::Backend;
use storage::record::RunStatus;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Told {
    /// Not answered yet (or to be sent again).
    Pending,
    /// Started, steered or queued into `run`.
    Accepted,
    /// No answer came: it may or may not have landed.
    Uncertain,
    /// Refused, and why.
    Refused(String),
}

#[derive(Debug, Clone)]
pub struct MessageInfo {
    pub thread: String,
    pub text: String,
    pub keyed: bool,
    /// What it does on a busy thread (SPEC §5.1).
    pub strategy: storage::ledger::Strategy,
    pub told: Told,
    pub run: Option<RunId>,
    pub in_flight: bool,
    pub attempts: u32,
    /// What each attempt was told, for the report.
    pub answers: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Model {
    pub messages: Vec<MessageInfo>,
    /// Every run the ledger held (seen between two transactions), with its thread key.
    pub runs: BTreeMap<RunId, String>,
    pub killed: BTreeSet<RunId>,
    pub stopped: BTreeSet<RunId>,
    /// The final status and answer the finishing gate committed, for each run seen past it.
    pub gates: BTreeMap<RunId, (RunStatus, Option<String>)>,
}

impl Model {
    pub fn add_message(
        &mut self,
        thread: String,
        text: String,
        keyed: bool,
        strategy: storage::ledger::Strategy,
    ) {
        self.messages.push(MessageInfo {
            thread,
            text,
            keyed,
            strategy,
            told: Told::Pending,
            run: None,
            in_flight: false,
            attempts: 0,
            answers: Vec::new(),
        });
    }

    /// The invariants checked at the end, against the store: each violation's invariant and detail.
    /// `lenient`: a fault that may legitimately end runs `interrupted` landed.
    pub fn check_end(
        &self,
        store: &mut dyn Backend,
        now: i64,
        lenient: bool,
    ) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let killed_threads: BTreeSet<&String> = self
            .killed
            .iter()
            .filter_map(|r| self.runs.get(r))
            .collect();
        // Message nonce → the runs holding it as an input.
        let mut inputs: BTreeMap<usize, Vec<RunId>> = BTreeMap::new();
        for (run, thread) in &self.runs {
            if self.killed.contains(run) {
                continue;
            }
            let record = match store.get(run, now) {
                Ok(Some(r)) if !r.head.provisional => r,
                Ok(Some(_)) => {
                    out.push((
                        "one terminal record",
                        format!("{run} has only a provisional record"),
                    ));
                    continue;
                }
                _ => {
                    out.push(("one terminal record", format!("{run} has no record")));
                    continue;
                }
            };
            let seqs: Vec<u64> = record
                .events
                .iter()
                .filter_map(storage::record::event_seq)
                .collect();
            if seqs.windows(2).any(|p| p[0] >= p[1]) || seqs.len() != record.events.len() {
                out.push(("seqs strictly increase", format!("{run}: {seqs:?}")));
            }
            let kind = |e: &Value| e.get("type").and_then(Value::as_str).map(str::to_owned);
            if record.head.status == RunStatus::Completed
                && !record
                    .events
                    .iter()
                    .any(|e| kind(e).as_deref() == Some("answer"))
            {
                out.push((
                    "completed without answer",
                    format!("{run} completed with no answer event"),
                ));
            }
            if let Some((status, answer)) = self.gates.get(run) {
                let head = &record.head;
                let flipped = *status == RunStatus::Completed
                    && head.status == RunStatus::Failed
                    && head.reply_ok == Some(false);
                let answered = record
                    .events
                    .iter()
                    .filter(|e| kind(e).as_deref() == Some("answer"))
                    .filter_map(|e| e.get("text").and_then(Value::as_str))
                    .next_back();
                if (head.status != *status && !flipped)
                    || answer.as_deref().is_some_and(|a| answered != Some(a))
                {
                    out.push((
                        "the record keeps its gate",
                        format!(
                            "{run}: gate committed {} with answer {answer:?}; the record is {} with answer {answered:?}",
                            status.as_str(),
                            head.status.as_str()
                        ),
                    ));
                }
            }
            for event in record
                .events
                .iter()
                .filter(|e| kind(e).as_deref() == Some("input"))
            {
                let text = event
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                for k in crate::agent::nonces(text) {
                    inputs.entry(k).or_default().push(run.clone());
                    let Some(m) = self.messages.get(k.wrapping_sub(1)) else {
                        continue;
                    };
                    let own = format!("c:{}", m.thread);
                    if &own != thread {
                        out.push((
                            "no follow-up crosses threads",
                            format!("m{k} (thread {own}) is an input of {run} on {thread}"),
                        ));
                    }
                    if record.head.status == RunStatus::Interrupted
                        && !lenient
                        && m.told == Told::Accepted
                    {
                        out.push((
                            "accepted messages get answered",
                            format!("m{k} ended in {run}, closed interrupted"),
                        ));
                    }
                }
            }
        }
        for (i, m) in self.messages.iter().enumerate() {
            let k = i + 1;
            let found = inputs.get(&k).map_or(0, Vec::len);
            let killed = killed_threads.contains(&format!("c:{}", m.thread));
            let ok = match &m.told {
                Told::Accepted if !killed => found == 1,
                Told::Accepted | Told::Uncertain | Told::Pending => found <= 1,
                Told::Refused(_) => found == 0,
            };
            if !ok {
                out.push((
                    "accepted exactly once",
                    format!(
                        "m{k} ({}keyed, {:?}, told {:?}, run {:?}; answers {:?}) is an input {found} times: {:?}",
                        if m.keyed { "" } else { "not " },
                        m.strategy,
                        m.told,
                        m.run,
                        m.answers,
                        inputs.get(&k)
                    ),
                ));
            }
        }
        out
    }
}
