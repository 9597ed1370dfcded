//! A run's working data and the effects the actor shell executes on it: the model call, the durable
//! step, the tools, the handoff, the finishing gate, the reply and the record (the launch paths that
//! build the data are in [`super::launch`]). Each effect is a future over owned inputs; its answer goes
//! back to the actor, which applies it to [`Run`] and hands the [`super::machine::Msg`] it implies to
//! the state machine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use storage::RunId;

use serde_json::{json, Map, Value};
use storage::ledger::decisions::Settlement;
use storage::ledger::{
    Decision, InFlight, InboxItem, Outcome, Refusal, StepRecord, StepWrite, Turn,
};
use storage::record::RunEvent;

use super::approval::{ApprovalGate, Passed};
use super::machine::Written;
use super::tool_runner::ToolRunner;
use super::{publish, AgentEntry, RunDeps};
use crate::agent::{self, AssistantTurn, Conversation, ToolCall, ToolDef, ToolResult, Usage};
use crate::channel::card::CardView;
use crate::channel::CardPlace;
use crate::registry::RunMeta;

/// Longest `summary` published for a tool call or result.
const SUMMARY_CHARS: usize = 200;
/// First retry delay of a step, state or finishing write (SPEC §5.5), doubling up to the next.
pub(super) const WRITE_RETRY: Duration = Duration::from_millis(200);
pub(super) const MAX_WRITE_RETRY: Duration = Duration::from_secs(5);

/// A published summary: redacted first (a secret cut at the edge must not leak its prefix), then capped.
pub(super) fn summarize(deps: &RunDeps, s: &str) -> String {
    truncate_chars(&deps.registry.redactor().redact(s), SUMMARY_CHARS)
}

/// At most `max` characters of `s`, with a trailing `…` when something was cut.
fn truncate_chars(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    out
}

/// The write-through state of a run's ledger row (SPEC §5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tracking {
    /// Reserved or promoted; writes go through.
    Tracked,
    /// A write failed permanently: later ledger writes are no-ops, the run continues best-effort, never
    /// resumed.
    Detached,
    /// Another generation owns the row.
    Fenced,
}

/// A run's working data: what the effects read and the actor updates with their answers.
pub(super) struct Run {
    pub deps: RunDeps,
    pub id: RunId,
    pub gen: String,
    pub meta: RunMeta,
    pub deadline: i64,
    pub tracking: Tracking,
    pub agent: AgentEntry,
    pub tool_defs: Arc<[ToolDef]>,
    pub system: String,
    /// Transcript turns after the system turn.
    pub turns: Vec<Turn>,
    /// Turn count of the durable transcript (system turn included).
    pub turn_count: u64,
    pub step: u64,
    pub iteration: u64,
    pub inbox_consumed: Option<u64>,
    /// The storage's inbox epoch loaded before this run's last inbox read that answered
    /// ([`storage::StorageHandle::inbox_epoch`]; `u64::MAX`: none yet): while it stands, that read is
    /// still the inbox's state, and a read is skipped.
    pub inbox_read_at: Arc<std::sync::atomic::AtomicU64>,
    /// The previous step's results turn (or follow-ups), written with the next assistant turn.
    pub pending: Option<Turn>,
    /// Events committed with the next durable step, not by the flusher: the `input` events of the
    /// follow-ups folded into `pending` and the step's `assistant` event (SPEC §5.2 step 5).
    pub step_events: Vec<Value>,
    /// The model's turn of the current step, from its answer until its tools ran.
    pub current: Option<AssistantTurn>,
    /// The promotion and seed a restart (or a fresh run its admission could not seed) commits first
    /// ([`Run::write_promotion`]).
    pub promotion: Option<(storage::ledger::Promotion, Option<StepWrite>)>,
    /// How a resumed step's calls settle (SPEC §6.2), one per call of `current`, in order: set by the
    /// resume, taken by the tools effect that runs them.
    pub settling: Option<Vec<Resettle>>,
    /// What a resume carries from its launch through its re-attachment effects.
    pub reattachment: Option<Box<super::launch::Reattachment>>,
    /// The last step's write, held back when its turn answered and the run seals ([`Run::defer_step`]):
    /// it commits with the seal, or ahead of whatever the run writes next.
    pub unwritten: Option<StepWrite>,
    pub workspace: PathBuf,
    /// Whether this incarnation took the workspace (or tried): a fresh run takes it with its first step
    /// that calls a tool with effects, a resume at once.
    pub workspace_taken: bool,
    /// What this incarnation writes into the workspace fence: the generation and a token of this actor,
    /// so a task a panicked incarnation left behind is fenced out after the re-adoption (SPEC §1.1).
    pub fence: String,
    pub model_ms: u64,
    pub model_calls: u64,
    pub tool_ms: u64,
    pub tool_calls: u64,
    /// `(replyOk, replyNote)` when a webhook was called.
    pub reply: Option<(bool, Option<String>)>,
    /// Token usage summed per model over the run's model calls.
    pub usage: std::collections::BTreeMap<String, Usage>,
    /// The stop an earlier incarnation committed to the row (a resume or restart honours it from its
    /// first decision: a finish plan under a recorded soft stop concludes `stopped_soft`).
    pub recorded_stop: Option<storage::ledger::StopMode>,
    /// The chat thread that shows the run, and the card an earlier incarnation posted there (SPEC §12).
    pub card: Option<CardPlace>,
    /// Wakes a wait for approvals: a decision taken in this process, a stop (SPEC §13).
    pub approval_nudge: Arc<tokio::sync::Notify>,
}

impl Run {
    pub(super) fn new(
        deps: RunDeps,
        id: RunId,
        meta: RunMeta,
        deadline: i64,
        agent: AgentEntry,
        tool_defs: Arc<[ToolDef]>,
    ) -> Self {
        let workspace = crate::tools::workspace_dir(&deps.workspace_root, &id);
        let fence = format!(
            "{}#{}",
            deps.gen.as_str(),
            &format!("{:08x}", storage::entropy::u32())
        );
        Run {
            fence,
            gen: deps.gen.as_str().to_owned(),
            tool_defs,
            system: agent.system.clone(),
            deps,
            id,
            meta,
            deadline,
            tracking: Tracking::Tracked,
            agent,
            turns: Vec::new(),
            turn_count: 0,
            step: 0,
            iteration: 0,
            inbox_consumed: None,
            inbox_read_at: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
            pending: None,
            step_events: Vec::new(),
            unwritten: None,
            current: None,
            promotion: None,
            settling: None,
            reattachment: None,
            workspace,
            workspace_taken: false,
            model_ms: 0,
            model_calls: 0,
            tool_ms: 0,
            tool_calls: 0,
            reply: None,
            usage: Default::default(),
            recorded_stop: None,
            card: None,
            approval_nudge: Default::default(),
        }
    }

    /// The text of the transcript's last assistant turn (empty when none).
    pub fn last_text(&self) -> String {
        self.turns
            .iter()
            .rev()
            .find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text))
            .unwrap_or_default()
    }

    pub fn now(&self) -> i64 {
        self.deps.clock.now_ms()
    }

    pub fn tracked(&self) -> bool {
        self.tracking == Tracking::Tracked
    }

    /// Publish to the live view, and to the ledger through the flusher while tracked.
    pub fn publish(&self, event: RunEvent) {
        publish(&self.deps, &self.id, event, self.tracked());
    }

    /// Publish to the live view now and to the ledger with the next durable step.
    pub fn publish_in_step(&mut self, event: RunEvent) {
        if let Some(stamped) = publish(&self.deps, &self.id, event, false) {
            self.keep(stamped);
        }
    }

    /// Publish to the live view and the flusher now, and keep the event for the next durable write too:
    /// a `tool_result` whose content the next transcript turn holds commits at the latest with that turn
    /// (SPEC §5.2 step 5, "what a reader was shown is kept"); the flusher's earlier append of the same
    /// row is an identical retry.
    pub fn publish_kept(&mut self, event: RunEvent) {
        if let Some(stamped) = publish(&self.deps, &self.id, event, self.tracked()) {
            self.keep(stamped);
        }
    }

    /// Keep an already published event for the next durable write.
    pub fn keep(&mut self, stamped: Value) {
        if self.tracked() {
            self.step_events.push(stamped);
        }
    }

    /// The step's `tool_call` events, published with the step that records the calls in flight, so a
    /// viewer never sees a call the transcript holds but the history lacks.
    pub fn publish_calls(&mut self, calls: &[ToolCall]) {
        for call in calls {
            let event = RunEvent::ToolCall {
                stamp: Default::default(),
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                summary: summarize(&self.deps, &call.args.to_string()),
                step: self.step,
            };
            self.publish_in_step(event);
        }
    }

    /// The current step's calls did not run (a stop ended their wait for approval): each gets a
    /// `tool_result` saying so, committed with the record, so the record holds no call without a result.
    pub fn not_run(&mut self, why: &str) {
        let calls = self.current.take().map(|t| t.calls).unwrap_or_default();
        for call in calls {
            let mut event =
                RunEvent::tool_result(&call.call_id, &call.tool, false, why.to_owned(), self.step);
            if let RunEvent::ToolResult { not_run, .. } = &mut event {
                *not_run = Some(true);
            }
            self.publish_kept(event);
        }
    }

    pub fn note(&self, kind: &str, summary: &str) {
        self.publish(note_event(kind, summary));
    }

    /// The run's chat thread shows it from here on: its card posted, or the earlier one edited. The view
    /// starts from every event published so far (a resumed run's steps and its `resumed`).
    pub fn open_card(&self) {
        let Some(place) = &self.card else {
            return;
        };
        if !self.deps.cards.enabled() {
            return;
        }
        let Some((row, events)) = self.deps.registry.snapshot(&self.id) else {
            return;
        };
        let live_url = self
            .deps
            .cards
            .live_url(&self.id, &self.deps.tokens.mint(&self.id));
        let view =
            CardView::new(&self.id, &self.meta.agent, live_url, row.started_at).folded(&events);
        self.deps.cards.open(&self.gen, place.clone(), view);
    }

    /// Another generation owns the row: stop writing and renewing.
    pub fn fence(&mut self) {
        self.deps.cards.forget(&self.id);
        if self.tracking != Tracking::Fenced {
            self.deps.metrics.fences.inc();
            tracing::warn!(run_id = %self.id, generation = %self.gen, "fenced: another generation owns the run");
            self.tracking = Tracking::Fenced;
            self.deps
                .heartbeat
                .do_send(crate::heartbeat::Untrack(self.id.clone()));
        }
    }

    /// Stop writing through: one note, one attempt to mark the row detached, no more heartbeats.
    pub fn detach(&mut self, what: &str, why: String) {
        if self.tracking != Tracking::Tracked {
            return;
        }
        tracing::warn!(run_id = %self.id, generation = %self.gen, what, why = %why, "ledger write failed: detaching");
        self.tracking = Tracking::Detached;
        self.deps
            .heartbeat
            .do_send(crate::heartbeat::Untrack(self.id.clone()));
        self.note(
            "ledger_detached",
            &format!("{what} failed; this run is not resumable"),
        );
        let mut patch = Map::new();
        patch.insert(
            storage::ledger::state_keys::DETACHED.into(),
            Value::Bool(true),
        );
        let (storage, id, gen) = (self.deps.storage.clone(), self.id.clone(), self.gen.clone());
        actix::spawn(async move {
            let _ = storage.set_state(id, gen, patch).await;
        });
    }

    /// Act on an owner write's answer: `Ok` when it landed (or the run went on detached), `Fenced`
    /// when another generation owns the row, `Lost` when storage stayed away past the lease.
    pub fn settle<T>(
        &mut self,
        what: &str,
        answer: Option<storage::Result<Outcome<T>>>,
    ) -> Written {
        let Some(answer) = answer else {
            return Written::Lost;
        };
        let refusal = match &answer {
            Ok(Err(Refusal::Fenced { .. })) => Some("fenced"),
            Ok(Err(Refusal::UnknownRun { .. })) => Some("unknown_run"),
            Ok(Err(_)) => Some("other"),
            Err(_) => Some("unavailable"),
            Ok(Ok(_)) => None,
        };
        self.deps.metrics.ledger_write(what, refusal);
        match answer {
            Ok(Ok(_)) => {
                if what == "step record" {
                    self.deps.metrics.steps.inc();
                }
                Written::Ok
            }
            Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. })) => {
                self.fence();
                Written::Fenced
            }
            Ok(Err(refusal)) => {
                self.detach(what, refusal.to_string());
                Written::Ok
            }
            Err(e) => {
                self.detach(what, e.to_string());
                Written::Ok
            }
        }
    }

    /// This step's record as of now.
    fn step_record(&self, calls: &[ToolCall]) -> StepRecord {
        StepRecord {
            step: self.step,
            seq: self.deps.registry.last_seq(&self.id).unwrap_or(0),
            turn_index: self.turn_count,
            in_flight: calls
                .iter()
                .map(|c| InFlight {
                    call_id: c.call_id.clone(),
                    tool: c.tool.clone(),
                })
                .collect(),
            inbox_consumed_seq: self.inbox_consumed,
            remaining_ms: (self.deadline - self.now()).max(0),
            turn: self.step,
            iteration: self.iteration,
        }
    }

    /// The durable write of `new` turns, the step's events and then its record with `calls` in flight,
    /// in one commit (the record is never durable without its turns; the tools run only after both).
    /// The first step that calls a tool with effects takes the workspace before it writes, and its
    /// commit records the binding (SPEC §8.3). The transcript in memory moves on at once; `None` when
    /// there is nothing to do (untracked, and no workspace to take).
    pub fn durable_step(
        &mut self,
        new: Vec<Turn>,
        calls: &[ToolCall],
    ) -> Option<impl std::future::Future<Output = Option<storage::Result<Outcome<()>>>> + 'static>
    {
        let take = (!self.workspace_taken && calls.iter().any(|c| self.has_effects(&c.tool)))
            .then(|| super::launch::Take::of(self));
        self.workspace_taken |= take.is_some();
        let w = self.step_write(new, calls);
        if w.is_none() && take.is_none() {
            return None;
        }
        let tracked = self.tracked();
        let (s, id, gen, lease_ms) = (
            self.deps.storage.clone(),
            self.id.clone(),
            self.gen.clone(),
            self.deps.lease_ms,
        );
        let metrics = self.deps.metrics.clone();
        let flusher = self.deps.flusher.clone();
        Some(async move {
            let mut w = w;
            if let Some(take) = take {
                match take.run(crate::tools::TakeMode::Create).await {
                    Ok(()) => {
                        let binding = json!({"workspace": take.workspace.display().to_string()});
                        if let Some(w) = &mut w {
                            w.state
                                .insert(storage::ledger::state_keys::BINDING.into(), binding);
                        }
                    }
                    Err(super::launch::Took::NotOwner) => {
                        return Some(Ok(Err(Refusal::Fenced { run_id: id })))
                    }
                    Err(super::launch::Took::Failed(why)) => super::launch::without_workspace(
                        &take.deps, &take.id, &take.gen, tracked, &why,
                    ),
                }
            }
            // A detached run took its workspace and writes nothing: its step goes on, best effort.
            let Some(w) = w.map(std::sync::Arc::new) else {
                return Some(Ok(Ok(())));
            };
            let started = Instant::now();
            let answer = retry_transient(lease_ms, || {
                s.write_step(id.clone(), gen.clone(), w.clone())
            })
            .await;
            if answer.is_some() {
                metrics.step_commit(started.elapsed()); // storage answered (committed or refused) within the lease
            }
            if let Some(Ok(Ok(()))) = &answer {
                // What it committed needs no append of the flusher's.
                flusher.do_send(crate::flusher::Committed {
                    run_id: id,
                    seqs: w
                        .events
                        .iter()
                        .filter_map(storage::record::event_seq)
                        .collect(),
                });
            }
            answer
        })
    }

    /// Whether `tool` has effects outside the process (it acts only under the workspace fence).
    fn has_effects(&self, tool: &str) -> bool {
        self.tool_defs
            .iter()
            .any(|d| d.name == tool && !d.side_effect_free)
    }

    /// What [`Run::durable_step`] writes; the transcript in memory moves on at once. `None` when the run
    /// writes nothing (untracked). A step write held back ([`Run::unwritten`]) goes first in it.
    pub(super) fn step_write(&mut self, new: Vec<Turn>, calls: &[ToolCall]) -> Option<StepWrite> {
        let first_idx = self.turn_count;
        self.turn_count += new.len() as u64;
        self.turns.extend(new.iter().cloned());
        let events = std::mem::take(&mut self.step_events);
        let held = self.unwritten.take();
        if !self.tracked() {
            return None;
        }
        let record = self.step_record(calls);
        Some(match held {
            None => StepWrite {
                first_idx,
                turns: new,
                record,
                events,
                state: Default::default(),
            },
            Some(mut held) => {
                held.turns.extend(new);
                held.events.extend(events);
                held.record = record;
                held
            }
        })
    }

    /// Hold back the write of a step whose turn answered, for a run that seals (SPEC §5.2 step 3: the
    /// last step, the gate and the record then cost one commit). A turn without tool calls publishes no
    /// `assistant` event, and its answer is shown only once sealed; the `input` events of follow-ups
    /// folded into its model call were shown before their commit, as in every step.
    pub fn defer_step(&mut self, new: Vec<Turn>) {
        self.unwritten = self.step_write(new, &[]);
    }

    /// The current step's `assistant` event, with the model and its usage when the agent reported it.
    pub fn assistant_event(&self) -> RunEvent {
        let turn = self.current.as_ref();
        let usage = turn.and_then(|t| t.usage);
        RunEvent::Assistant {
            stamp: Default::default(),
            step: Some(self.step),
            text: Some(turn.map(|t| t.text.clone()).unwrap_or_default()),
            model: usage.map(|_| self.agent.agent.model().to_owned()),
            usage: usage.map(|usage| json!(usage)),
            truncated: None,
        }
    }

    /// This step's turns: the pending results (or follow-ups) and the model's turn.
    pub fn take_step_turns(&mut self) -> (Vec<Turn>, Vec<ToolCall>) {
        let turn = self
            .current
            .clone()
            .expect("a step write follows a model answer");
        let mut new: Vec<Turn> = self.pending.take().into_iter().collect();
        new.push(turn.to_turn());
        (new, turn.calls)
    }

    /// Fold follow-ups into the next turn: each gets its one `input {source: "followup"}` event, which
    /// commits with the step that writes the turn (SPEC §5.2 step 5), so a crash before that step
    /// leaves the message unread for the resumed run, and a crash after it leaves both.
    pub fn fold(&mut self, items: Vec<InboxItem>) {
        let Some(last) = items.iter().map(|i| i.seq).max() else {
            return;
        };
        let mut followups = Vec::with_capacity(items.len());
        for item in items {
            let text = item
                .message
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            self.publish_in_step(storage::record::input_event(
                &text,
                storage::record::InputSource::Followup {
                    inbox_seq: Some(item.seq),
                },
            ));
            followups.push((item.seq, text));
        }
        self.inbox_consumed = Some(last);
        match &mut self.pending {
            Some(turn) => turn.parts.extend(
                followups
                    .iter()
                    .map(|(seq, t)| agent::followup_part(*seq, t)),
            ),
            None => self.pending = Some(agent::followups_turn(&followups)),
        }
    }

    /// Unread follow-ups past what this run consumed (none when untracked or unreadable); messages queued
    /// for a run of their own (SPEC §5.1) are not this run's to fold. No read when no inbox can have
    /// changed since this run's last one (issue 29): what it answered was folded, or was not this run's.
    pub fn read_inbox(&self) -> impl std::future::Future<Output = Vec<InboxItem>> + 'static {
        use std::sync::atomic::Ordering::SeqCst;
        let (s, id, after, tracked) = (
            self.deps.storage.clone(),
            self.id.clone(),
            self.inbox_consumed,
            self.tracked(),
        );
        // Loaded before the read: a write that commits while it runs moves it, and the next one reads.
        let epoch = s.inbox_epoch();
        let unchanged = self.inbox_read_at.load(SeqCst) == epoch;
        let read_at = self.inbox_read_at.clone();
        async move {
            if !tracked || unchanged {
                return Vec::new();
            }
            match s.read_inbox(id, after).await {
                Ok(Ok(items)) => {
                    read_at.store(epoch, SeqCst);
                    storage::ledger::steering(items)
                }
                Ok(Err(_)) | Err(_) => Vec::new(),
            }
        }
    }

    /// The model call of the next step: follow-ups join a pending results turn first (step 1 has none:
    /// its follow-ups wait, so the transcript keeps its one-turn-per-step shape). A transient error is
    /// retried per the agent's policy (SPEC §8.3): each retry publishes `model_retry`, and the wait counts
    /// against the budget. Answers the items read (for [`Run::fold`]), the model's reply and the time spent.
    pub fn call_model(
        &self,
    ) -> impl std::future::Future<Output = (Vec<InboxItem>, Result<AssistantTurn, String>, u64)> + 'static
    {
        let inbox = self.pending.is_some().then(|| self.read_inbox());
        let (agent, system, defs, turns, pending) = (
            self.agent.clone(),
            self.system.clone(),
            self.tool_defs.clone(),
            self.turns.clone(),
            self.pending.clone(),
        );
        let (deps, id, tracked, step, deadline) = (
            self.deps.clone(),
            self.id.clone(),
            self.tracked(),
            self.step + 1,
            self.deadline,
        );
        let agent_name = self.meta.agent.clone();
        async move {
            let items = match inbox {
                Some(read) => read.await,
                None => Vec::new(),
            };
            let mut conversation = turns;
            if let Some(mut turn) = pending {
                turn.parts.extend(items.iter().map(|i| {
                    agent::followup_part(
                        i.seq,
                        i.message
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    )
                }));
                conversation.push(turn);
            }
            let started = Instant::now();
            let mut attempt = 1;
            let reply = loop {
                let conv = Conversation {
                    system: &system,
                    turns: &conversation,
                    tools: &defs,
                };
                let answer = if agent.stream {
                    // Deltas reach this process's live viewers only: never stored, never replayed.
                    let on_delta = |text: &str| {
                        let delta = RunEvent::AssistantDelta {
                            step,
                            attempt,
                            text: text.to_owned(),
                        };
                        deps.registry.broadcast(&id, delta.into());
                    };
                    agent.agent.next_streaming(conv, &on_delta).await
                } else {
                    agent.agent.next(conv).await
                };
                let err = match answer {
                    Ok(turn) => break Ok(turn),
                    Err(e) if !e.is_transient() => break Err(e.to_string()),
                    Err(e) => e,
                };
                let Some(wait) =
                    agent
                        .retry
                        .wait(attempt, err.retry_after(), storage::entropy::unit())
                else {
                    break Err(err.to_string());
                };
                if deps.clock.now_ms() + wait.as_millis() as i64 >= deadline {
                    break Err(format!(
                        "time budget exhausted while waiting to retry: {err}"
                    ));
                }
                publish(
                    &deps,
                    &id,
                    RunEvent::ModelRetry {
                        stamp: Default::default(),
                        attempt,
                        wait_ms: wait.as_millis() as u64,
                        error: summarize(&deps, &err.to_string()),
                        step,
                    },
                    tracked,
                );
                tokio::time::sleep(wait).await;
                attempt += 1;
            };
            deps.metrics
                .model_call(&agent_name, agent.agent.model(), started.elapsed());
            (items, reply, started.elapsed().as_millis() as u64)
        }
    }

    /// The current step's tool calls, one after another (SPEC §5.2 step 5).
    /// Answers the results, their published `tool_result` events (kept for the next durable write) and
    /// the time spent.
    /// Whether a call of `tool` waits for a person's approval (SPEC §13): the agent's `approve` list, or
    /// the tool's own `approval`.
    pub fn needs_approval(&self, tool: &str) -> bool {
        self.agent.approves(tool)
            || self
                .deps
                .tools
                .get(tool)
                .is_some_and(|t| t.requires_approval())
    }

    /// The step's tool calls, in order, behind the approval gate when one of them needs a person's yes
    /// (a detached run asks nobody: its calls needing approval are denied). Answers the results, their
    /// published events, the time spent, and how the gate ended when it ended the step instead
    /// ([`Passed::Stopped`], [`Passed::Fenced`], [`Passed::Lost`]: no call ran).
    pub fn run_tools(&mut self) -> impl std::future::Future<Output = ToolsRan> + 'static {
        let calls = self
            .current
            .as_ref()
            .map(|t| t.calls.clone())
            .unwrap_or_default();
        let tools = ToolRunner::of(self);
        // A resumed step's calls settle as its resume decided, past the gate: none of them waits.
        let settling = self.settling.take();
        let gated: Vec<ToolCall> = calls
            .iter()
            .filter(|c| settling.is_none() && self.needs_approval(&c.tool))
            .cloned()
            .collect();
        let gate = (!gated.is_empty() && self.tracked()).then(|| ApprovalGate {
            deps: self.deps.clone(),
            id: self.id.clone(),
            gen: self.gen.clone(),
            step: self.step,
            calls: gated.clone(),
            timeout_ms: self.agent.approval_timeout_ms,
            nudge: self.approval_nudge.clone(),
        });
        async move {
            let decisions = match gate {
                None => BTreeMap::new(),
                Some(gate) => match gate.pass().await {
                    Passed::Decided(decisions) => decisions,
                    ended => return ToolsRan::ended(ended),
                },
            };
            let started = Instant::now();
            let mut results = Vec::with_capacity(calls.len());
            let mut events = Vec::with_capacity(calls.len());
            for (i, call) in calls.iter().enumerate() {
                let (result, event) = match settling.as_ref().and_then(|s| s.get(i)) {
                    Some(Resettle {
                        denied: Some(d), ..
                    }) => tools.denied(call, d),
                    Some(Resettle { how, denied: None }) => match how.synthetic_text() {
                        Some(text) => tools.settled(call, *how, text),
                        None => tools.call(call).await,
                    },
                    None => {
                        let denied = match decisions.get(&call.call_id) {
                            Some(d) if d.decision == Decision::Deny => Some(d),
                            Some(_) => None,
                            // Needing approval without a gate: a detached run, which nobody can answer.
                            None if gated.iter().any(|g| g.call_id == call.call_id) => {
                                Some(&*UNANSWERED)
                            }
                            None => None,
                        };
                        match denied {
                            Some(d) => tools.denied(call, d),
                            None => tools.call(call).await,
                        }
                    }
                };
                results.push(result);
                events.extend(event);
            }
            ToolsRan {
                results,
                events,
                ms: started.elapsed().as_millis() as u64,
                gate: None,
            }
        }
    }

    /// Write the follow-ups folded after a text-only turn at once, as a turn of their own under the same
    /// step with nothing in flight, together with that turn's `assistant` event and their `input`
    /// events (SPEC §4.3): the transcript never holds the answer turn while its event is unflushed.
    pub fn write_followups(
        &mut self,
    ) -> Option<impl std::future::Future<Output = Option<storage::Result<Outcome<()>>>> + 'static>
    {
        let turns: Vec<Turn> = self.pending.take().into_iter().collect();
        self.durable_step(turns, &[])
    }

    /// Drain (SPEC §6.4): at a step boundary, commit the last step's results (and any follow-ups folded
    /// with them) as a turn of their own under the same step with nothing in flight, flush the events,
    /// and hand the row to the next generation. The next process resumes from exactly here.
    pub fn hand_off(&mut self) -> impl std::future::Future<Output = bool> + 'static {
        let results: Vec<Turn> = self.pending.take().into_iter().collect();
        let write =
            (!results.is_empty() || !self.step_events.is_empty() || self.unwritten.is_some())
                .then(|| self.durable_step(results, &[]))
                .flatten();
        let (deps, id, gen, tracked) = (
            self.deps.clone(),
            self.id.clone(),
            self.gen.clone(),
            self.tracked(),
        );
        let step = self.step;
        async move {
            if !tracked {
                return false; // a detached run is never resumed
            }
            if let Some(write) = write {
                if !matches!(write.await, Some(Ok(Ok(())))) {
                    return false;
                }
            }
            let _ = deps
                .flusher
                .send(crate::flusher::FlushRun(id.clone()))
                .await;
            match deps.storage.handoff(gen.clone(), vec![id.clone()]).await {
                Ok(answer)
                    if answer
                        .iter()
                        .any(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff) =>
                {
                    tracing::info!(run_id = %id, generation = %gen, step, "handed off at a step boundary");
                    true
                }
                other => {
                    tracing::warn!(run_id = %id, generation = %gen, answer = ?other, "handoff at the boundary refused");
                    false
                }
            }
        }
    }
}

/// How one call of a resumed step settles (SPEC §6.2): as its tool's [`Settlement`] says (run again, or
/// answered without running), unless a person's released denial is its result.
pub(super) struct Resettle {
    pub how: Settlement,
    pub denied: Option<storage::ledger::Decided>,
}

/// What a step's tools did (see [`Run::run_tools`]).
pub(super) struct ToolsRan {
    pub results: Vec<ToolResult>,
    pub events: Vec<Value>,
    pub ms: u64,
    /// How the approval gate ended the step instead, when it did (no call ran).
    pub gate: Option<Passed>,
}

impl ToolsRan {
    fn ended(gate: Passed) -> Self {
        ToolsRan {
            results: Vec::new(),
            events: Vec::new(),
            ms: 0,
            gate: Some(gate),
        }
    }
}

/// The decision a call needing approval gets when nobody can be asked (a detached run).
static UNANSWERED: std::sync::LazyLock<storage::ledger::Decided> =
    std::sync::LazyLock::new(|| storage::ledger::Decided {
        decision: Decision::Deny,
        who: "detached".into(),
        note: Some("the run is detached from the ledger: no approval can be asked".into()),
        at: 0,
    });

/// Retry `op` while it fails transiently, with backoff (200 ms doubling to 5 s), for up to `lease_ms`
/// (SPEC §5.5). `None` when storage stayed away that long; a permanent error is answered.
pub(super) async fn retry_transient<T, F, Fut>(lease_ms: i64, op: F) -> Option<storage::Result<T>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = storage::Result<T>>,
{
    let started = Instant::now();
    let mut delay = WRITE_RETRY;
    loop {
        match op().await {
            Err(e) if e.is_transient() => {
                if started.elapsed() >= Duration::from_millis(lease_ms.max(0) as u64) {
                    tracing::warn!(error = %e, "storage unavailable past the lease");
                    return None;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_WRITE_RETRY);
            }
            other => return Some(other),
        }
    }
}

/// A run's `note` event: what happened to it (`kind`) and a redacted, capped `summary`.
pub(super) fn note_event(kind: &str, summary: &str) -> RunEvent {
    RunEvent::note(kind, summary)
}
