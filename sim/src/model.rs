//! The world model and the invariants.
//!
//! The model watches from outside every process: which messages clients sent and what they were told,
//! which runs the ledger started, every tool effect (with the caller's fence token and generation, the
//! workspace fence and the ledger owner at that moment), every reply, and who closed each run. Cheap
//! invariants are checked where the event happens; the rest once the seed has quiesced.
//!
//! | invariant | checked | what it means |
//! |---|---|---|
//! | `effect after workspace takeover` | at each mutating effect | the workspace fence names another incarnation, yet the write landed |
//! | `unsettled effect after a fence` | at each mutating effect | the ledger owner is another generation and the call is not in the in-flight set it will settle `effects_unknown` |
//! | `effect after close` | at each mutating effect | the run was already closed by another generation |
//! | `mutating effect at most once` | at each mutating effect | a mutating call's effect landed twice (a re-run) |
//! | `tools after their step record` | at each effect of a tracked run | the call is not in the ledger's step record |
//! | `one driver per run` | at each reclaim | a process takes back a run one of its own actors (or its pending close) still drives |
//! | `one reply per run` | at each reply | a tracked run's answer delivered twice (a detached run replies best-effort) |
//! | `a run past its finishing gate is never resumed` | at each resume | a row in `finishing` or holding a final status is continued from its transcript |
//! | `a folded follow-up keeps its input event` | at each fold | a follow-up is consumed while its `input` event has nowhere to go |
//! | `only the run's owner takes its workspace` | at each launch | the workspace fence is rewritten by a process that does not own the run |
//! | `a finish and its successor share no follow-up` | at each finish with a successor | a follow-up is an input of the finished record and of the run admitted for the unread inbox |
//! | `detached runs run no unrecorded mutating call` | at each mutating effect | a detached run dispatches a call no step record names |
//! | `detached runs are never resumed` | at each resume | a row marked `detached` is adopted and continued |
//! | `no record after a fence` | at each final plain put | a generation that lost the run writes its record |
//! | `orphan adopted within a sweep` | at each sweep | a row of a healthy process stayed without an actor for 3 sweeps |
//! | `no live row remains` | at quiescence | every run ended |
//! | `one terminal record` | at quiescence | every started, unkilled run has a final (non-provisional) record |
//! | `seqs strictly increase` | at quiescence | within each record |
//! | `accepted exactly once` | at quiescence | every accepted message is exactly one `input` event of one run (≤ 1 when its reply was lost, 0 when refused) |
//! | `no follow-up crosses threads` | at quiescence | an `input` only in a run of its own thread |
//! | `accepted messages get answered` | at quiescence | no accepted message ends in an `interrupted` run unless a permanent fault touched that run |

use std::collections::{BTreeMap, BTreeSet};

use actors::agent::ToolCall;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::Value;
use storage::ledger::RunLedger;
use storage::record::RunStatus;
use storage::RunStore;

use crate::run::RunData;
use crate::world::{Status, World, LEASE_MS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Told {
    /// Not sent yet (or still retrying).
    Pending,
    /// Started or steered into `run`.
    Accepted,
    /// The admission's reply was lost: it may or may not have landed.
    Uncertain,
    Refused,
}

#[derive(Debug, Clone)]
pub struct MessageInfo {
    pub thread: String,
    pub text: String,
    pub keyed: bool,
    pub told: Told,
    pub run: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct CallStat {
    applied: u32,
    sends: u32,
}

#[derive(Debug, Default)]
pub struct Model {
    pub messages: Vec<MessageInfo>,
    /// Runs the ledger started (an admission or a successor), with their thread key.
    pub run_threads: BTreeMap<String, String>,
    pub killed_runs: BTreeSet<String>,
    pub killed_threads: BTreeSet<String>,
    /// Runs a permanent fault or a give-up close touched: `interrupted` is their legitimate end.
    pub tainted: BTreeSet<String>,
    /// Each run's replies: the generation of each.
    pub replies: BTreeMap<String, Vec<String>>,
    /// The generation whose finish removed each run's live row.
    pub closed_by: BTreeMap<String, String>,
    /// Each run's workspace fence token, while the workspace exists.
    workspace: BTreeMap<String, String>,
    calls: BTreeMap<(String, String), CallStat>,
    /// Per (incarnation, run): the owner's sweep that last saw it without an actor, how many sweeps in a
    /// row did, and when the second one did (the supervisor re-adopts from then on).
    orphan_ages: BTreeMap<(u64, String), (u64, u32, i64)>,
    /// Sweeps each incarnation completed.
    sweeps: BTreeMap<u64, u64>,
    pub interrupted: BTreeMap<String, String>,
    pub effects: u64,
    /// Per run: the `tool_call` and `tool_result` events a reader was shown (the registry's), as (seq,
    /// content key, the incarnation's fence that published it).
    shown: BTreeMap<String, Vec<(u64, String, String)>>,
    /// (run, fence, content key): content a committed transcript turn of that incarnation holds (a call in
    /// an assistant turn, a result in a results turn).
    committed: BTreeSet<(String, String, String)>,
}

impl Model {
    pub fn add_message(&mut self, k: usize, thread: &str, text: String, keyed: bool) {
        debug_assert_eq!(k, self.messages.len() + 1);
        self.messages.push(MessageInfo {
            thread: thread.to_owned(),
            text,
            keyed,
            told: Told::Pending,
            run: None,
        });
    }

    pub fn started(&mut self, run: &str, thread_key: &str) {
        self.run_threads
            .insert(run.to_owned(), thread_key.to_owned());
    }

    pub fn accepted(&mut self, msg: usize, run: &str) {
        let m = &mut self.messages[msg - 1];
        m.told = Told::Accepted;
        m.run = Some(run.to_owned());
    }

    pub fn uncertain(&mut self, msg: usize) {
        self.messages[msg - 1].told = Told::Uncertain;
    }

    pub fn refused(&mut self, msg: usize) {
        self.messages[msg - 1].told = Told::Refused;
    }

    pub fn killed(&mut self, run: &str, thread: &str) {
        self.killed_runs.insert(run.to_owned());
        self.killed_threads.insert(thread.to_owned());
    }

    /// A reply went out. A detached run replies best-effort by design (SPEC §5.2 step 7), so only a
    /// tracked run's reply counts toward "one reply per run".
    pub fn replied(&mut self, run: &str, gen: &str, tracked: bool) {
        if tracked {
            self.replies
                .entry(run.to_owned())
                .or_default()
                .push(gen.to_owned());
        }
    }

    pub fn closed(&mut self, run: &str, gen: &str, _status: RunStatus) {
        self.closed_by.insert(run.to_owned(), gen.to_owned());
    }

    pub fn closed_interrupted(&mut self, run: &str, reason: &str) {
        self.interrupted.insert(run.to_owned(), reason.to_owned());
    }

    pub fn take_workspace(&mut self, run: &str, token: &str) {
        self.workspace.insert(run.to_owned(), token.to_owned());
    }

    pub fn workspace_exists(&self, run: &str) -> bool {
        self.workspace.contains_key(run)
    }

    pub fn workspace_deleted(&mut self, run: &str) {
        self.workspace.remove(run);
    }

    /// An actor for `run` started in incarnation `inc`: its sightings without one start over.
    pub fn actor_started(&mut self, inc: u64, run: &str) {
        self.orphan_ages.remove(&(inc, run.to_owned()));
    }

    /// A sweep of incarnation `inc` starts (a failed one breaks a run of sightings).
    pub fn sweep_started(&mut self, inc: u64) {
        *self.sweeps.entry(inc).or_default() += 1;
    }

    pub fn settled_unknown(&mut self, _run: &str, _call: &str) {}

    /// A reader was shown `event` (stamped) of `run`, published by the incarnation `fence`.
    pub fn shown(&mut self, run: &str, fence: &str, event: &Value) {
        let (Some(key), Some(seq)) = (content_key(event), storage::record::event_seq(event)) else {
            return;
        };
        self.shown
            .entry(run.to_owned())
            .or_default()
            .push((seq, key, fence.to_owned()));
    }

    /// The incarnation `fence` committed `turns` of `run` to its transcript.
    pub fn committed(&mut self, run: &str, fence: &str, turns: &[storage::ledger::Turn]) {
        for part in turns.iter().flat_map(|t| t.parts.iter()) {
            let call = part.get("callId").and_then(Value::as_str);
            let key = match (part.get("type").and_then(Value::as_str), call) {
                (Some("tool_call"), Some(id)) => format!("call/{id}"),
                (Some("tool_result"), Some(id)) => format!("result/{id}"),
                _ => continue,
            };
            self.committed
                .insert((run.to_owned(), fence.to_owned(), key));
        }
    }

    /// A run some client could name (for stops and kills).
    pub fn some_run(&self, rng: &mut StdRng) -> Option<String> {
        if self.run_threads.is_empty() {
            return None;
        }
        let i = rng.random_range(0..self.run_threads.len());
        self.run_threads.keys().nth(i).cloned()
    }
}

/// A tool call's effect in the world (the fake tools): `mut` writes into the run's workspace under its
/// fence, `idem` sends with the idempotency key `<run>/<call>` (the far side applies a key once), `pure`
/// changes nothing. Checks the effect invariants and answers the tool's output.
pub fn tool_effect(w: &mut World, slot: usize, run: &RunData, call: &ToolCall) -> (bool, String) {
    let key = (run.id.clone(), call.call_id.clone());
    match call.tool.as_str() {
        "mut" => {
            if run.tracking == crate::run::Tracking::Detached {
                let (recorded, owner) = ledger_view(w, run, call);
                if !recorded || owner.as_deref() != Some(run.gen.as_str()) {
                    w.violate(
                        "detached runs run no unrecorded mutating call",
                        format!("{} runs {}/{} detached, with no step record naming it or no longer the owner ({owner:?})", run.gen, run.id, call.call_id),
                    );
                }
            }
            let fence = w.model.workspace.get(&run.id).cloned();
            let taken_over = fence.as_deref() != Some(run.fence.as_str());
            if taken_over && !w.cfg.bugs.no_workspace_fence {
                return (
                    false,
                    format!(
                        "fenced: the workspace fence names {}",
                        fence.as_deref().unwrap_or("nobody")
                    ),
                );
            }
            w.model.effects += 1;
            let stat = w.model.calls.entry(key).or_default();
            stat.applied += 1;
            let applied = stat.applied;
            let who = format!("{} ({})", run.gen, run.fence);
            w.note(|| format!("  EFFECT {} {} by {who}", run.id, call.call_id));
            if taken_over {
                w.violate(
                    "effect after workspace takeover",
                    format!(
                        "{who} wrote {}/{} while the workspace fence names {}",
                        run.id,
                        call.call_id,
                        fence.as_deref().unwrap_or("nobody")
                    ),
                );
            }
            if applied > 1 {
                w.violate(
                    "mutating effect at most once",
                    format!(
                        "{}/{} applied {applied} times (last by {who})",
                        run.id, call.call_id
                    ),
                );
            }
            check_owner(w, slot, run, call);
        }
        "idem" => {
            w.model.effects += 1;
            let stat = w.model.calls.entry(key).or_default();
            stat.sends += 1;
            stat.applied = 1;
            check_owner(w, slot, run, call);
        }
        _ => {}
    }
    (true, "ok".into())
}

/// Whether the ledger's last step record names `call`, and who owns the run's row.
fn ledger_view(w: &World, run: &RunData, call: &ToolCall) -> (bool, Option<String>) {
    let mut store = w.peek();
    let last = store.last_step(&run.id).ok().flatten();
    let owner = store.get_live(&run.id).ok().flatten().map(|r| r.owner_gen);
    (
        last.is_some_and(|l| l.in_flight.iter().any(|c| c.call_id == call.call_id)),
        owner,
    )
}

/// The ledger's view at the moment an effect lands: the caller still owns the run, or the call is in the
/// in-flight set its new owner settles; and a tracked run never runs a call its step record lacks.
fn check_owner(w: &mut World, _slot: usize, run: &RunData, call: &ToolCall) {
    let store = w.peek();
    let mut s = store.clone();
    let row = s.get_live(&run.id).ok().flatten();
    let last = s.last_step(&run.id).ok().flatten();
    let recorded = last
        .as_ref()
        .is_some_and(|l| l.in_flight.iter().any(|c| c.call_id == call.call_id));
    let mutating = call.tool == "mut";
    // A detached run continues best-effort by design (SPEC §5.5): it cannot know it lost the run.
    let detached = run.tracking == crate::run::Tracking::Detached;
    match row {
        Some(row) if row.owner_gen != run.gen => {
            if mutating && !recorded && !detached {
                w.violate(
                    "unsettled effect after a fence",
                    format!("{} ran {}/{} while {} owns the run and its step record does not name the call", run.gen, run.id, call.call_id, row.owner_gen),
                );
            }
        }
        Some(_) => {
            if run.tracked() && !recorded && last.as_ref().is_none_or(|l| l.step <= run.step) {
                w.violate(
                    "tools after their step record",
                    format!(
                        "{} ran {}/{} before its step record named it",
                        run.gen, run.id, call.call_id
                    ),
                );
            }
        }
        None => {
            let closer = w.model.closed_by.get(&run.id).cloned();
            if mutating && !detached && closer.as_deref().is_some_and(|c| c != run.gen) {
                w.violate(
                    "effect after close",
                    format!(
                        "{} ran {}/{} after {} closed the run",
                        run.gen,
                        run.id,
                        call.call_id,
                        closer.unwrap_or_default()
                    ),
                );
            }
        }
    }
}

/// A finish that admitted a successor: no follow-up is an `input` of both the finished record and the
/// successor's first events.
pub fn check_successor_disjoint(
    w: &mut World,
    record: &storage::record::RunRecord,
    successor: &str,
) {
    let nonces = |events: &[Value]| -> BTreeSet<usize> {
        events
            .iter()
            .filter(|e| e.get("type").and_then(Value::as_str) == Some("input"))
            .flat_map(|e| {
                crate::agent::nonces(e.get("text").and_then(Value::as_str).unwrap_or_default())
            })
            .collect()
    };
    let theirs = nonces(
        &w.peek()
            .live_events(successor, 0, usize::MAX >> 1)
            .ok()
            .flatten()
            .unwrap_or_default(),
    );
    let both: Vec<usize> = nonces(&record.events)
        .intersection(&theirs)
        .copied()
        .collect();
    if !both.is_empty() {
        w.violate(
            "a finish and its successor share no follow-up",
            format!(
                "{}'s record and its successor {successor} both hold the input of {both:?}",
                record.head.id
            ),
        );
    }
}

/// A final record put by `gen` (not through the ledger's finish): the run must not belong to, or have
/// been closed by, another generation.
pub fn check_record_writer(w: &mut World, gen: &str, id: &str) {
    let row = w.peek().get_live(id).ok().flatten();
    let other = match row {
        Some(row) if row.owner_gen != gen => Some(format!("{} owns its live row", row.owner_gen)),
        Some(_) => None,
        None => w
            .model
            .closed_by
            .get(id)
            .filter(|c| *c != gen)
            .map(|c| format!("{c} already closed it")),
    };
    if let Some(other) = other {
        w.violate(
            "no record after a fence",
            format!("{gen} writes the final record of {id} while {other}"),
        );
    }
}

/// After a sweep of `slot`: rows of this generation without an actor age by one sweep; three in a row
/// on a healthy process (no storage fault meanwhile, not draining) is an orphan nobody adopts.
pub fn orphan_ages(w: &mut World, slot: usize, mine: &[String]) {
    let p = &w.procs[slot];
    let inc = p.inc;
    let healthy = p.status == Status::Up && !p.draining && p.outage_until < w.now() - 3 * LEASE_MS;
    let driven: BTreeSet<String> = p.actors.values().map(|a| a.run_id.clone()).collect();
    let sweep = w.model.sweeps.get(&inc).copied().unwrap_or_default();
    let now = w.now();
    let mut stale = Vec::new();
    for id in mine {
        let (last, age, second) = w.model.orphan_ages.entry((inc, id.clone())).or_default();
        if driven.contains(id) || !healthy {
            *age = 0;
        } else {
            // Seen at the sweep before too: one more; otherwise (new, or it was away) the count restarts.
            *age = if *last + 1 == sweep { *age + 1 } else { 1 };
            if *age == 2 {
                *second = now;
            }
            // Two sightings make an orphan, re-adopted at once: a third sighting well after, with no
            // re-adoption on its way, is a failure.
            if *age >= 3 && now - *second >= LEASE_MS / 3 {
                stale.push((id.clone(), *age));
            }
        }
        *last = sweep;
    }
    for (id, age) in stale {
        let adopting = w.tasks.iter().any(|t| {
            t.at == crate::world::At::Proc { slot, inc }
                && matches!(&t.kind, crate::world::Kind::Readopt { run } | crate::world::Kind::CloseOrphan { run } if *run == id)
        });
        if adopting {
            continue;
        }
        let gen = w.procs[slot].gen.clone();
        w.violate(
            "orphan adopted within a sweep",
            format!("{id} is live under {gen} with no actor for {age} sweeps"),
        );
    }
}

/// The checks once the seed quiesced.
pub fn final_checks(w: &mut World) {
    let mut store = w.peek();
    let now = w.now();
    for row in store.list_live().unwrap_or_default() {
        w.violate(
            "no live row remains",
            format!(
                "{} is still {} under {}",
                row.run_id, row.phase, row.owner_gen
            ),
        );
    }
    let mut inputs: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let runs: Vec<(String, String)> = w
        .model
        .run_threads
        .iter()
        .map(|(r, t)| (r.clone(), t.clone()))
        .collect();
    for (run, thread) in runs {
        if w.model.killed_runs.contains(&run) {
            continue;
        }
        let record = match RunStore::get(&mut store, &run, now) {
            Ok(Some(r)) if !r.head.provisional => r,
            Ok(Some(_)) => {
                w.violate(
                    "one terminal record",
                    format!("{run} has only a provisional record"),
                );
                continue;
            }
            _ => {
                w.violate("one terminal record", format!("{run} has no record"));
                continue;
            }
        };
        if w.cfg.trace {
            let inputs: Vec<String> = record
                .events
                .iter()
                .filter(|e| e.get("type").and_then(Value::as_str) == Some("input"))
                .map(|e| {
                    format!(
                        "{}@{}",
                        e.get("text").and_then(Value::as_str).unwrap_or_default(),
                        storage::record::event_seq(e).unwrap_or(0)
                    )
                })
                .collect();
            let (status, n) = (record.head.status, record.events.len());
            w.note(|| {
                format!("record {run} ({thread}): {status:?}, {n} events, inputs {inputs:?}")
            });
        }
        // What a reader was shown is kept (SPEC §5.2 step 5): every shown call or result whose content its
        // incarnation committed to the transcript is in the record under the seq it was shown with.
        let kept: BTreeSet<(u64, String)> = record
            .events
            .iter()
            .filter_map(|e| Some((storage::record::event_seq(e)?, content_key(e)?)))
            .collect();
        for (seq, key, fence) in w.model.shown.get(&run).cloned().unwrap_or_default() {
            if w.model
                .committed
                .contains(&(run.clone(), fence.clone(), key.clone()))
                && !kept.contains(&(seq, key.clone()))
            {
                w.violate("what a reader was shown is kept", format!("{run}: {key} shown at seq {seq} by {fence} and committed, missing from the record"));
            }
        }
        let seqs: Vec<u64> = record
            .events
            .iter()
            .filter_map(storage::record::event_seq)
            .collect();
        if seqs.windows(2).any(|p| p[0] >= p[1]) || seqs.len() != record.events.len() {
            w.violate("seqs strictly increase", format!("{run}: {seqs:?}"));
        }
        for event in &record.events {
            if event.get("type").and_then(Value::as_str) != Some("input") {
                continue;
            }
            let text = event
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default();
            for k in crate::agent::nonces(text) {
                inputs.entry(k).or_default().push(run.clone());
                let Some(m) = w.model.messages.get(k.wrapping_sub(1)).cloned() else {
                    continue;
                };
                let own = format!("c:{}", m.thread);
                if own != thread {
                    w.violate(
                        "no follow-up crosses threads",
                        format!("m{k} (thread {own}) is an input of {run} on {thread}"),
                    );
                }
                if record.head.status == RunStatus::Interrupted
                    && !w.model.tainted.contains(&run)
                    && m.told == Told::Accepted
                {
                    let why = w.model.interrupted.get(&run).cloned().unwrap_or_default();
                    w.violate(
                        "accepted messages get answered",
                        format!("m{k} ended in {run}, closed interrupted: {why}"),
                    );
                }
            }
        }
    }
    let messages = w.model.messages.clone();
    for (i, m) in messages.iter().enumerate() {
        let k = i + 1;
        let found = inputs.get(&k).cloned().unwrap_or_default();
        let exempt = w.model.killed_threads.contains(&format!("c:{}", m.thread));
        let ok = match m.told {
            Told::Accepted if exempt => found.len() <= 1,
            Told::Accepted => found.len() == 1,
            Told::Uncertain => found.len() <= 1,
            Told::Pending | Told::Refused => found.is_empty(),
        };
        if !ok {
            w.violate(
                "accepted exactly once",
                format!(
                    "m{k} ({:?}, run {:?}) is an input of {} runs: {found:?}",
                    m.told,
                    m.run,
                    found.len()
                ),
            );
        }
    }
}

/// The content a `tool_call` or `tool_result` event shows: `call/<callId>` or `result/<callId>`.
fn content_key(event: &Value) -> Option<String> {
    let id = event.get("callId").and_then(Value::as_str)?;
    match event.get("type").and_then(Value::as_str)? {
        "tool_call" => Some(format!("call/{id}")),
        "tool_result" => Some(format!("result/{id}")),
        _ => None,
    }
}
