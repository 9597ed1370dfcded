//! A run's working data and the effects the actor shell executes on it: the launch paths (fresh,
//! restart, resume), the model call, the durable step, the tools, the handoff, the finishing gate, the
//! reply and the record. Each effect is a future over owned inputs; its answer goes back to the actor,
//! which applies it to [`Run`] and hands the [`super::machine::Msg`] it implies to the state machine.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use storage::ledger::decisions::{self, ResumePoint, Settlement};
use storage::ledger::{InFlight, InboxItem, LiveRow, Outcome, Promotion, Refusal, StepRecord, StepWrite, Successor, Turn};
use storage::record::RunStatus;

use super::machine::{Started, Written};
use super::record::{admitted_successor, build_record, close_unstartable, meta_from_row, RecordExtras};
use super::{publish, Adoption, AgentEntry, Ended, Request, RunDeps, StopReason};
use crate::agent::{self, AssistantTurn, Conversation, ToolCall, ToolDef, ToolResult, Usage};
use crate::history::{Via, WriteOutcome};
use crate::registry::RunMeta;
use crate::tools::ToolContext;

/// Longest `summary` published for a tool call or result.
const SUMMARY_CHARS: usize = 200;
/// Retry delays of the promotion claim (SPEC §5.5).
const CLAIM_RETRIES: [Duration; 2] = [Duration::from_millis(200), Duration::from_millis(800)];
/// First retry delay of a step, state or finishing write (SPEC §5.5), doubling up to the next.
const WRITE_RETRY: Duration = Duration::from_millis(200);
const MAX_WRITE_RETRY: Duration = Duration::from_secs(5);

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
    pub id: String,
    pub gen: String,
    pub meta: RunMeta,
    pub deadline: i64,
    pub tracking: Tracking,
    pub agent: AgentEntry,
    pub tool_defs: Vec<ToolDef>,
    pub system: String,
    /// Transcript turns after the system turn.
    pub turns: Vec<Turn>,
    /// Turn count of the durable transcript (system turn included).
    pub turn_count: u64,
    pub step: u64,
    pub iteration: u64,
    pub inbox_consumed: Option<u64>,
    /// The previous step's results turn (or follow-ups), written with the next assistant turn.
    pub pending: Option<Turn>,
    /// Events committed with the next durable step, not by the flusher: the `input` events of the
    /// follow-ups folded into `pending` and the step's `assistant` event (SPEC §5.2 step 5).
    pub step_events: Vec<Value>,
    /// The model's turn of the current step, from its answer until its tools ran.
    pub current: Option<AssistantTurn>,
    pub workspace: PathBuf,
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
}

impl Run {
    fn new(deps: RunDeps, id: String, meta: RunMeta, deadline: i64, agent: AgentEntry) -> Self {
        let workspace = crate::tools::workspace_dir(&deps.data_dir, &id);
        let tool_defs = deps.tools.defs().into_iter().filter(|d| agent.allows(&d.name)).collect();
        let fence = format!("{}#{}", deps.gen.as_str(), &uuid::Uuid::new_v4().simple().to_string()[..8]);
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
            pending: None,
            step_events: Vec::new(),
            current: None,
            workspace,
            model_ms: 0,
            model_calls: 0,
            tool_ms: 0,
            tool_calls: 0,
            reply: None,
            usage: Default::default(),
        }
    }

    pub fn now(&self) -> i64 {
        self.deps.clock.now_ms()
    }

    pub fn tracked(&self) -> bool {
        self.tracking == Tracking::Tracked
    }

    /// Publish to the live view, and to the ledger through the flusher while tracked.
    pub fn publish(&self, event: Value) {
        publish(&self.deps, &self.id, event, self.tracked());
    }

    /// Publish to the live view now and to the ledger with the next durable step.
    pub fn publish_in_step(&mut self, event: Value) {
        if let Some(stamped) = publish(&self.deps, &self.id, event, false) {
            if self.tracked() {
                self.step_events.push(stamped);
            }
        }
    }

    pub fn note(&self, kind: &str, summary: &str) {
        self.publish(json!({"type": "note", "kind": kind, "summary": summary}));
    }

    /// Another generation owns the row: stop writing and renewing.
    pub fn fence(&mut self) {
        if self.tracking != Tracking::Fenced {
            self.deps.metrics.fences.inc();
            tracing::warn!(run_id = %self.id, generation = %self.gen, "fenced: another generation owns the run");
            self.tracking = Tracking::Fenced;
            self.deps.heartbeat.do_send(crate::heartbeat::Untrack(self.id.clone()));
        }
    }

    /// Stop writing through: one note, one attempt to mark the row detached, no more heartbeats.
    pub fn detach(&mut self, what: &str, why: String) {
        if self.tracking != Tracking::Tracked {
            return;
        }
        tracing::warn!(run_id = %self.id, generation = %self.gen, what, why = %why, "ledger write failed: detaching");
        self.tracking = Tracking::Detached;
        self.deps.heartbeat.do_send(crate::heartbeat::Untrack(self.id.clone()));
        self.note("ledger_detached", &format!("{what} failed; this run is not resumable"));
        let mut patch = Map::new();
        patch.insert("detached".into(), Value::Bool(true));
        let (storage, id, gen) = (self.deps.storage.clone(), self.id.clone(), self.gen.clone());
        actix::spawn(async move {
            let _ = storage.set_state(id, gen, patch).await;
        });
    }

    /// Act on an owner write's answer: `Ok` when it landed (or the run went on detached), `Fenced`
    /// when another generation owns the row, `Lost` when storage stayed away past the lease.
    pub fn settle<T>(&mut self, what: &str, answer: Option<storage::Result<Outcome<T>>>) -> Written {
        let Some(answer) = answer else { return Written::Lost };
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
            in_flight: calls.iter().map(|c| InFlight { call_id: c.call_id.clone(), tool: c.tool.clone() }).collect(),
            inbox_consumed_seq: self.inbox_consumed,
            remaining_ms: (self.deadline - self.now()).max(0),
            turn: self.step,
            iteration: self.iteration,
        }
    }

    /// The durable write of `new` turns, the step's events and then its record with `calls` in flight,
    /// in one commit (the record is never durable without its turns; the tools run only after both).
    /// The transcript in memory moves on at once; `None` when there is nothing to write (untracked).
    pub fn durable_step(&mut self, new: Vec<Turn>, calls: &[ToolCall]) -> Option<impl std::future::Future<Output = Option<storage::Result<Outcome<()>>>> + 'static> {
        let w = self.step_write(new, calls)?;
        let (s, id, gen, lease_ms) = (self.deps.storage.clone(), self.id.clone(), self.gen.clone(), self.deps.lease_ms);
        let metrics = self.deps.metrics.clone();
        Some(async move {
            let started = Instant::now();
            let answer =
                retry_transient(lease_ms, || s.durable_step(id.clone(), gen.clone(), w.first_idx, w.turns.clone(), w.record.clone(), w.events.clone())).await;
            if answer.is_some() {
                metrics.step_commit(started.elapsed()); // storage answered (committed or refused) within the lease
            }
            answer
        })
    }

    /// What [`Run::durable_step`] writes; the transcript in memory moves on at once. `None` when the run
    /// writes nothing (untracked).
    fn step_write(&mut self, new: Vec<Turn>, calls: &[ToolCall]) -> Option<StepWrite> {
        let first_idx = self.turn_count;
        self.turn_count += new.len() as u64;
        self.turns.extend(new.iter().cloned());
        let events = std::mem::take(&mut self.step_events);
        if !self.tracked() {
            return None;
        }
        Some(StepWrite { first_idx, turns: new, record: self.step_record(calls), events })
    }

    /// The current step's `assistant` event, with the model and its usage when the agent reported it.
    pub fn assistant_event(&self) -> Value {
        let turn = self.current.as_ref();
        let mut event = json!({"type": "assistant", "text": turn.map(|t| t.text.clone()).unwrap_or_default(), "step": self.step});
        if let Some(usage) = turn.and_then(|t| t.usage) {
            event["usage"] = json!(usage);
            event["model"] = json!(self.agent.agent.model());
        }
        event
    }

    /// This step's turns: the pending results (or follow-ups) and the model's turn.
    pub fn take_step_turns(&mut self) -> (Vec<Turn>, Vec<ToolCall>) {
        let turn = self.current.clone().expect("a step write follows a model answer");
        let mut new: Vec<Turn> = self.pending.take().into_iter().collect();
        new.push(turn.to_turn());
        (new, turn.calls)
    }

    /// Fold follow-ups into the next turn: each gets its one `input {source: "followup"}` event, which
    /// commits with the step that writes the turn (SPEC §5.2 step 5), so a crash before that step
    /// leaves the message unread for the resumed run, and a crash after it leaves both.
    pub fn fold(&mut self, items: Vec<InboxItem>) {
        let Some(last) = items.iter().map(|i| i.seq).max() else { return };
        let mut followups = Vec::with_capacity(items.len());
        for item in items {
            let text = item.message.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
            self.publish_in_step(json!({"type": "input", "text": text, "source": "followup", "inboxSeq": item.seq}));
            followups.push((item.seq, text));
        }
        self.inbox_consumed = Some(last);
        match &mut self.pending {
            Some(turn) => turn.parts.extend(followups.iter().map(|(seq, t)| agent::followup_part(*seq, t))),
            None => self.pending = Some(agent::followups_turn(&followups)),
        }
    }

    /// Unread follow-ups past what this run consumed (none when untracked or unreadable).
    pub fn read_inbox(&self) -> impl std::future::Future<Output = Vec<InboxItem>> + 'static {
        let (s, id, after, tracked) = (self.deps.storage.clone(), self.id.clone(), self.inbox_consumed, self.tracked());
        async move {
            if !tracked {
                return Vec::new();
            }
            match s.read_inbox(id, after).await {
                Ok(Ok(items)) => items,
                Ok(Err(_)) | Err(_) => Vec::new(),
            }
        }
    }

    /// The model call of the next step: follow-ups join a pending results turn first (step 1 has none:
    /// its follow-ups wait, so the transcript keeps its one-turn-per-step shape). A transient error is
    /// retried per the agent's policy (SPEC §8.3): each retry publishes `model_retry`, and the wait counts
    /// against the budget. Answers the items read (for [`Run::fold`]), the model's reply and the time spent.
    pub fn call_model(&self) -> impl std::future::Future<Output = (Vec<InboxItem>, Result<AssistantTurn, String>, u64)> + 'static {
        let inbox = self.pending.is_some().then(|| self.read_inbox());
        let (agent, system, defs, turns, pending) =
            (self.agent.clone(), self.system.clone(), self.tool_defs.clone(), self.turns.clone(), self.pending.clone());
        let (deps, id, tracked, step, deadline) = (self.deps.clone(), self.id.clone(), self.tracked(), self.step + 1, self.deadline);
        let agent_name = self.meta.agent.clone();
        async move {
            let items = match inbox {
                Some(read) => read.await,
                None => Vec::new(),
            };
            let mut conversation = turns;
            if let Some(mut turn) = pending {
                turn.parts.extend(items.iter().map(|i| {
                    agent::followup_part(i.seq, i.message.get("text").and_then(Value::as_str).unwrap_or_default())
                }));
                conversation.push(turn);
            }
            let started = Instant::now();
            let mut attempt = 1;
            let reply = loop {
                let conv = Conversation { system: &system, turns: &conversation, tools: &defs };
                let answer = if agent.stream {
                    // Deltas reach this process's live viewers only: never stored, never replayed.
                    let on_delta = |text: &str| {
                        deps.registry.broadcast(&id, json!({"type": "assistant_delta", "step": step, "attempt": attempt, "text": text}));
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
                let Some(wait) = agent.retry.wait(attempt, err.retry_after(), rand::random::<f64>()) else {
                    break Err(err.to_string());
                };
                if deps.clock.now_ms() + wait.as_millis() as i64 >= deadline {
                    break Err(format!("time budget exhausted while waiting to retry: {err}"));
                }
                publish(&deps, &id, json!({"type": "model_retry", "attempt": attempt, "waitMs": wait.as_millis() as u64,
                    "error": summarize(&deps, &err.to_string()), "step": step}), tracked);
                tokio::time::sleep(wait).await;
                attempt += 1;
            };
            deps.metrics.model_call(&agent_name, agent.agent.model(), started.elapsed());
            (items, reply, started.elapsed().as_millis() as u64)
        }
    }

    /// The current step's tool calls, one after another (SPEC §5.2 step 5).
    pub fn run_tools(&self) -> impl std::future::Future<Output = (Vec<ToolResult>, u64)> + 'static {
        let calls = self.current.as_ref().map(|t| t.calls.clone()).unwrap_or_default();
        let tools = ToolRunner::of(self);
        async move {
            let started = Instant::now();
            let mut results = Vec::with_capacity(calls.len());
            for call in &calls {
                results.push(tools.call(call).await);
            }
            (results, started.elapsed().as_millis() as u64)
        }
    }

    /// Drain (SPEC §6.4): at a step boundary, commit the last step's results (and any follow-ups folded
    /// with them) as a turn of their own under the same step with nothing in flight, flush the events,
    /// and hand the row to the next generation. The next process resumes from exactly here.
    pub fn hand_off(&mut self) -> impl std::future::Future<Output = bool> + 'static {
        let results: Vec<Turn> = self.pending.take().into_iter().collect();
        let write = (!results.is_empty() || !self.step_events.is_empty()).then(|| self.durable_step(results, &[])).flatten();
        let (deps, id, gen, tracked) = (self.deps.clone(), self.id.clone(), self.gen.clone(), self.tracked());
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
            let _ = deps.flusher.send(crate::flusher::FlushRun(id.clone())).await;
            match deps.storage.handoff(gen.clone(), vec![id.clone()]).await {
                Ok(answer) if answer.iter().any(|(_, r)| *r == storage::ledger::HandoffResult::HandedOff) => {
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

    /// Flush the run's events, then the finishing gate (SPEC §5.2 step 7): only a confirmed owner
    /// replies. Unavailable storage is retried for up to the lease; a `WrongPhase` whose row already
    /// sits in `finishing` under this generation with this status means an earlier attempt committed.
    /// A detached run replies best-effort.
    pub fn finishing_gate(&self, status: RunStatus, answer: Option<String>) -> impl std::future::Future<Output = Gate> + 'static {
        let (deps, id, gen, tracking) = (self.deps.clone(), self.id.clone(), self.gen.clone(), self.tracking);
        async move {
            match tracking {
                Tracking::Fenced => return Gate::Answer(Written::Fenced),
                Tracking::Detached => return Gate::Answer(Written::Ok),
                Tracking::Tracked => {}
            }
            // Everything published so far reaches the ledger first: a crash from here on closes the
            // run from complete live events.
            let _ = deps.flusher.send(crate::flusher::FlushRun(id.clone())).await;
            let s = deps.storage.clone();
            let gate = retry_transient(deps.lease_ms, || s.finishing(id.clone(), gen.clone(), status, answer.clone())).await;
            match gate {
                None => Gate::Answer(Written::Lost),
                Some(Ok(Ok(()))) => Gate::Answer(Written::Ok),
                Some(Ok(Err(Refusal::WrongPhase { .. }))) => match retry_transient(deps.lease_ms, || s.get_live(id.clone())).await {
                    None => Gate::Answer(Written::Lost),
                    Some(Ok(Some(row)))
                        if row.owner_gen == gen
                            && row.phase == storage::ledger::Phase::Finishing
                            && row.state.get("finalStatus").and_then(Value::as_str) == Some(status.as_str()) =>
                    {
                        Gate::Answer(Written::Ok)
                    }
                    Some(_) => Gate::Answer(Written::Fenced),
                },
                Some(Ok(Err(_))) => Gate::Answer(Written::Fenced),
                Some(Err(e)) => Gate::Detach(e.to_string()),
            }
        }
    }

    /// Publish the answer and POST the reply to the configured webhook. The kill state is checked
    /// immediately before the attempt: a killed run sends nothing (SPEC §5.2 step 7).
    pub fn deliver(&self, status: RunStatus, answer: Option<String>) -> impl std::future::Future<Output = Delivery> + 'static {
        if let Some(text) = &answer {
            self.publish(json!({"type": "answer", "text": text}));
        }
        let (deps, id, gen, detached) = (self.deps.clone(), self.id.clone(), self.gen.clone(), self.tracking == Tracking::Detached);
        let body = json!({
            "runId": self.id, "threadKey": self.meta.thread_key, "channel": self.meta.channel_id,
            "user": self.meta.user_id, "status": status.as_str(), "answer": answer, "finishedAt": self.now(),
        });
        async move {
            let Some(hook) = deps.webhook.as_ref() else { return Delivery::Sent(None) };
            // Signed, retried until the deadline; the kill state is checked before every attempt.
            let proceed = || {
                let (storage, id) = (deps.storage.clone(), id.clone());
                async move { detached || !storage.is_killed(id).await.unwrap_or(false) }
            };
            let policy = crate::delivery::RetryPolicy::with_deadline(hook.deadline);
            let reply = crate::delivery::deliver_guarded(
                &deps.http,
                &hook.url,
                hook.secret.as_deref(),
                policy,
                &id,
                &body,
                crate::delivery::unix_now_secs,
                proceed,
            )
            .await;
            if reply.withheld {
                tracing::info!(run_id = %id, generation = %gen, "killed after the finishing gate: no webhook");
                return Delivery::Killed;
            }
            Delivery::Sent(Some(reply.into_pair()))
        }
    }

    fn diagnosis(&self) -> Value {
        json!({"byCategory": {
            "model": {"count": self.model_calls, "durationMs": self.model_ms},
            "tool": {"count": self.tool_calls, "durationMs": self.tool_ms},
        }})
    }

    /// The final record through the ledger's finish, which admits the successor for unread follow-ups
    /// in the same transaction (SPEC §5.2 step 8); answers that successor when it was admitted here.
    /// Answers [`Recorded::Fenced`] when the ledger refused the finish (killed meanwhile, or owned by
    /// another generation): the run then ends fenced, and a killed one is purged.
    pub fn record(&self, status: RunStatus) -> impl std::future::Future<Output = Recorded> + 'static {
        let finished_at = self.now();
        self.deps.registry.finish(&self.id, status, finished_at);
        self.deps.metrics.run_finished(status.as_str());
        if let Some(row) = self.deps.registry.row(&self.id) {
            let took = Duration::from_millis(u64::try_from(finished_at - row.started_at).unwrap_or(0));
            self.deps.metrics.run_duration(status.as_str(), took);
        }
        let usage = (!self.usage.is_empty()).then(|| json!(self.usage));
        let extras = RecordExtras { reply: self.reply.clone(), diagnosis: Some(self.diagnosis()), step_count: Some(self.step), usage, ..Default::default() };
        let record = build_record(&self.deps, &self.id, status, finished_at, extras);
        let successor = self.tracked().then(|| Successor {
            run_id: uuid::Uuid::now_v7().to_string(),
            lease_ms: self.deps.lease_ms,
            inbox_consumed: self.inbox_consumed,
        });
        let via = match &successor {
            Some(s) => Via::Ledger { gen: self.gen.clone(), successor: Some(s.clone()) },
            None => Via::Store,
        };
        let (deps, id) = (self.deps.clone(), self.id.clone());
        async move {
            let Some(record) = record else { return Recorded::Ended(None) };
            match deps.history.write(record, via).landed().await {
                WriteOutcome::Landed(_) | WriteOutcome::Reconciled => deps.registry.landed(&id),
                // Killed, or another generation owns the run: this process serves it no longer.
                WriteOutcome::Fenced => return Recorded::Fenced,
                // Kept (and served from here) for its TTL: the store does not have it.
                WriteOutcome::StoodDown | WriteOutcome::Lost(_) => {}
            }
            match successor {
                Some(s) => Recorded::Ended(admitted_successor(&deps, &s.run_id).await),
                None => Recorded::Ended(None),
            }
        }
    }
}

/// How the final record went.
pub(super) enum Recorded {
    /// Written (or kept here when the store would not take it), with the successor it admitted.
    Ended(Option<(LiveRow, Vec<Value>)>),
    /// The ledger refused the finish: killed meanwhile, or another generation owns the run.
    Fenced,
}

/// What the finishing gate answered; `Detach` when a permanent storage error detached the run (it then
/// replies best-effort).
pub(super) enum Gate {
    Answer(Written),
    Detach(String),
}

/// What the reply step did.
pub(super) enum Delivery {
    /// `(replyOk, replyNote)` when a webhook was called.
    Sent(Option<(bool, Option<String>)>),
    /// The run was killed: no webhook, no record.
    Killed,
}

/// What a tool call needs, owned, so the calls can run as an effect of their own.
struct ToolRunner {
    deps: RunDeps,
    id: String,
    fence: String,
    workspace: PathBuf,
    step: u64,
    tracked: bool,
    /// The agent's allowlist: a call to another tool gets "not available" (SPEC §8.3).
    allowed: Option<Vec<String>>,
}

impl ToolRunner {
    fn of(run: &Run) -> Self {
        ToolRunner {
            deps: run.deps.clone(),
            id: run.id.clone(),
            fence: run.fence.clone(),
            workspace: run.workspace.clone(),
            step: run.step,
            tracked: run.tracked(),
            allowed: run.agent.tools.clone(),
        }
    }

    fn publish(&self, event: Value) {
        publish(&self.deps, &self.id, event, self.tracked);
    }

    /// Run one call under its workspace claim (SPEC §10): a mutating call holds the worktree for writing,
    /// a side-effect-free one for reading. An unknown tool answers "not available".
    async fn call(&self, call: &ToolCall) -> ToolResult {
        use crate::operations::{AppId, Claim, Operation, Resource};
        self.publish(json!({"type": "tool_call", "callId": call.call_id, "tool": call.tool,
            "summary": summarize(&self.deps, &call.args.to_string()), "step": self.step}));
        let allowed = self.allowed.as_ref().is_none_or(|a| a.contains(&call.tool));
        let started = Instant::now();
        let tool = self.deps.tools.get(&call.tool).filter(|_| allowed);
        // The label is a configured tool's name, never a name a model made up.
        let label = if tool.is_some() { call.tool.as_str() } else { "not_available" };
        let output = match tool {
            Some(tool) => {
                let ctx = ToolContext { run_id: self.id.clone(), workspace: self.workspace.clone(), gen: self.fence.clone() };
                let claim = if tool.def().side_effect_free {
                    Claim::read(Resource::RepositoryWorktree)
                } else {
                    Claim::write(Resource::RepositoryWorktree)
                };
                let app = AppId::new(self.id.clone());
                self.deps
                    .operations
                    .run(&app, Operation::new(call.tool.clone()), claim, tool.call_keyed(&ctx, &call.call_id, &call.args))
                    .await
                    .unwrap_or_else(|e| crate::tools::ToolOutput::err(format!("refused: {e}")))
            }
            None => crate::tools::ToolOutput::err(decisions::NOT_AVAILABLE_TEXT),
        };
        self.deps.metrics.tool_call(label, started.elapsed());
        self.publish(json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": output.ok,
            "summary": summarize(&self.deps, &output.output), "step": self.step}));
        ToolResult { call_id: call.call_id.clone(), tool: call.tool.clone(), ok: output.ok, output: output.output }
    }
}

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

// ---- Launch paths (SPEC §5.2, §6.2, §6.3): each builds the run's data, or closes a row it cannot run ----

/// How a launch went: the run's data and where it stands, or the row closed without running.
pub(super) enum Launched {
    Run(Box<Run>, Started),
    Over(Ended),
}

/// A run admitted here: tombstone, promote, seed.
pub(super) async fn fresh(deps: RunDeps, id: String, meta: RunMeta, request: Request, started_at: i64) -> Launched {
    let Some(agent) = deps.agents.get(&meta.agent).cloned() else {
        // The slot checks the agent before admitting; a config reload could still race it.
        tracing::error!(run_id = %id, agent = %meta.agent, "unknown agent; abandoning the reservation");
        let _ = deps.storage.abandon(id.clone(), deps.gen.as_str().to_owned()).await;
        deps.registry.discard(&id);
        return Launched::Over((StopReason::Finished(RunStatus::Failed), None));
    };
    let deadline = started_at + agent.budget_ms;
    let run = Run::new(deps, id, meta, deadline, agent);
    // Tombstone: a provisional record, so a crash before the finish still leaves a trace.
    let tombstone = RecordExtras { provisional: true, ..Default::default() };
    if let Some(tomb) = build_record(&run.deps, &run.id, RunStatus::Interrupted, started_at, tombstone) {
        run.deps.history.write(tomb, Via::Store);
    }
    promote(run, &request.text).await
}

/// Take the workspace, promote the reserved row and seed the transcript (SPEC §5.2 steps 4–5): from here
/// the run is resumable.
async fn promote(mut run: Run, request_text: &str) -> Launched {
    // The workspace fence names this generation before any tool runs (SPEC §8.3).
    if let Err(why) = take_workspace(&run, crate::tools::TakeMode::Create).await {
        return Launched::Run(Box::new(run), Started::Fail(why));
    }
    let mut state = Map::new();
    state.insert("binding".into(), json!({"workspace": run.workspace.display().to_string()}));
    let promotion = Promotion { system_text: run.system.clone(), tools: json!(run.tool_defs), state, lease_ms: run.deps.lease_ms };
    // The promotion and the seed (the first model call's messages and the step-0 record) share one
    // commit: the run is resumable exactly when its seed is durable.
    let seed = run.step_write(vec![agent::system_turn(&run.system), agent::user_turn(request_text)], &[]);
    let seeded = seed.is_some();
    let (s, id, gen) = (run.deps.storage.clone(), run.id.clone(), run.gen.clone());
    let claim = || {
        let (s, id, gen, promotion, seed) = (s.clone(), id.clone(), gen.clone(), promotion.clone(), seed.clone());
        async move {
            match seed {
                Some(seed) => s.promote(id, gen, promotion, seed).await,
                None => s.claim(id, gen, promotion).await,
            }
        }
    };
    let started = Instant::now();
    let mut answer = claim().await;
    for delay in CLAIM_RETRIES {
        if !answer.as_ref().is_err_and(storage::Error::is_transient) {
            break;
        }
        tokio::time::sleep(delay).await;
        answer = claim().await;
    }
    let answer = if answer.as_ref().is_err_and(storage::Error::is_transient) {
        retry_transient(run.deps.lease_ms, claim).await
    } else {
        Some(answer)
    };
    if seeded && answer.is_some() {
        run.deps.metrics.step_commit(started.elapsed());
    }
    let written = run.settle("promotion", answer);
    if seeded && matches!(written, Written::Ok) {
        run.deps.metrics.steps.inc(); // the seed's step record
    }
    run.turns.remove(0); // `turns` holds what follows the system turn
    let started = match written {
        Written::Ok => Started::Continue,
        Written::Fenced => Started::Fenced,
        Written::Lost => Started::Lost,
    };
    Launched::Run(Box::new(run), started)
}

/// Take the run's workspace for this generation (SPEC §8.3 workspace fencing): rewrite its fence under
/// the exclusive lock before any tool runs. A lock a paused old owner still holds is retried with backoff
/// (a fence of this run aborts the launch meanwhile); any other failure is answered.
async fn take_workspace(run: &Run, mode: crate::tools::TakeMode) -> Result<(), String> {
    let mut delay = WRITE_RETRY;
    loop {
        match crate::tools::take_workspace_async(run.workspace.clone(), run.fence.clone(), mode).await {
            Ok(()) => return Ok(()),
            Err(crate::tools::WorkspaceError::Busy { .. }) => {
                tracing::warn!(run_id = %run.id, generation = %run.gen, "workspace lock held by another owner; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_WRITE_RETRY);
            }
            Err(e) => return Err(format!("workspace: {e}")),
        }
    }
}

/// Re-run a row from its saved request: same id, original start and deadline; the first attempt's
/// events replayed under their seqs, then `resumed`, then the steps (SPEC §6.3). A successor admitted
/// here (`from_gen: None`) starts the same way, without `resumed`.
pub(super) async fn restart(deps: RunDeps, row: LiveRow, events: Vec<Value>, from_gen: Option<String>) -> Launched {
    let meta = meta_from_row(&row);
    let request: Option<Request> = row.meta.get("request").and_then(|r| serde_json::from_value(r.clone()).ok());
    let (Some(agent), Some(request)) = (deps.agents.get(&meta.agent).cloned(), request) else {
        let reason = format!("cannot restart: agent {:?} is not configured here, or the saved request is unreadable", meta.agent);
        return Launched::Over(close_unstartable(&deps, &row, events, &reason).await);
    };
    let deadline = row.meta.get("deadline").and_then(Value::as_i64).unwrap_or(row.started_at + agent.budget_ms);
    let highest = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    let token = deps.tokens.mint(&row.run_id);
    let had_input = events.iter().any(|e| e["type"] == "input");
    // Past anything the dead attempt may have published but not flushed; a first start just continues.
    let next_seq = if from_gen.is_some() { highest + 1000 } else { highest + 1 };
    deps.registry.create(&row.run_id, meta.clone(), row.started_at, token, events, next_seq);
    let run = Run::new(deps, row.run_id.clone(), meta.clone(), deadline, agent);
    if highest == 0 || !had_input {
        // The first attempt's events never reached the ledger: publish the identity and request once.
        run.publish(meta.event());
        run.publish(json!({"type": "input", "text": request.text, "source": "request"}));
    }
    if let Some(from_gen) = from_gen {
        run.publish(json!({"type": "resumed", "settled": [], "fromGeneration": from_gen}));
    }
    promote(run, &request.text).await
}

/// Adopt a row this generation owns and continue it from its transcript (SPEC §6.2): re-attach the
/// workspace, settle the calls in flight, then the steps go on.
pub(super) async fn resume(deps: RunDeps, a: Adoption) -> Launched {
    let row = a.row;
    let meta = meta_from_row(&row);
    let Some(agent) = deps.agents.get(&meta.agent).cloned() else {
        let reason = format!("cannot resume: agent {:?} is not configured here", meta.agent);
        return Launched::Over(close_unstartable(&deps, &row, a.events, &reason).await);
    };
    let now = deps.clock.now_ms();
    let highest = a.events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    let token = deps.tokens.mint(&row.run_id);
    deps.registry.create(&row.run_id, meta.clone(), row.started_at, token, a.events, highest + 1000);
    let mut run = Run::new(deps, row.run_id.clone(), meta, now + a.last_step.remaining_ms, agent);
    if !row.system_text.is_empty() {
        run.system = row.system_text.clone();
    }
    // Re-attach the workspace the row is bound to; never migrate silently (SPEC §8.3).
    if let Some(bound) = row.state.get("binding").and_then(|b| b.get("workspace")).and_then(Value::as_str) {
        run.workspace = PathBuf::from(bound);
    }
    if let Err(why) = take_workspace(&run, crate::tools::TakeMode::Existing).await {
        if !run.workspace.is_dir() {
            let events = run.deps.registry.snapshot(&run.id).map(|(_, e)| e).unwrap_or_default();
            let deps = run.deps.clone();
            return Launched::Over(close_unstartable(&deps, &row, events, &format!("the run's workspace is missing ({why})")).await);
        }
        return Launched::Run(Box::new(run), Started::Fail(why));
    }
    run.turn_count = a.transcript.len() as u64;
    run.turns = a.transcript.into_iter().skip(1).collect();
    run.step = a.last_step.step;
    run.iteration = a.last_step.iteration;
    run.inbox_consumed = a.last_step.inbox_consumed_seq;
    let last_text = run.turns.iter().rev().find_map(|t| AssistantTurn::from_turn(t).map(|a| a.text)).unwrap_or_default();
    if row.phase == storage::ledger::Phase::Finishing {
        // Re-adopted past its finishing gate (after `StorageLost`): this process knows it never
        // delivered the reply, so it continues the reply from the saved answer (SPEC §5.2 step 7).
        run.publish(json!({"type": "resumed", "settled": [], "fromGeneration": a.from_gen}));
        let answer = row.state.get("answer").and_then(Value::as_str).unwrap_or(&last_text).to_owned();
        return Launched::Run(Box::new(run), Started::Finish(answer));
    }
    let last_assistant = run.turns.last().and_then(AssistantTurn::from_turn);
    // Which calls to settle, and whether the transcript already ends on the answer (a finish plan).
    let mut calls = Vec::new();
    let mut finish_plan = None;
    match a.point {
        ResumePoint::ResumeAt { .. } => {
            let recorded: Vec<String> = a.last_step.in_flight.iter().map(|c| c.call_id.clone()).collect();
            if let Some(turn) = &last_assistant {
                let ids: Vec<String> = turn.calls.iter().map(|c| c.call_id.clone()).collect();
                if let Err(reason) = decisions::in_flight_matches(&recorded, &ids) {
                    run.publish(json!({"type": "resumed", "settled": [], "fromGeneration": a.from_gen}));
                    return Launched::Run(Box::new(run), Started::Fail(reason));
                }
                if turn.calls.is_empty() {
                    finish_plan = Some(turn.text.clone());
                }
                calls = turn.calls.clone();
            }
        }
        ResumePoint::RunStepFresh { step } => {
            // The step's turns landed but not its record: nothing was dispatched, run its calls fresh.
            run.step = step;
            run.iteration += 1;
            calls = last_assistant.as_ref().map(|t| t.calls.clone()).unwrap_or_default();
            if calls.is_empty() {
                finish_plan = Some(last_text.clone());
            }
            if let Some(write) = run.durable_step(Vec::new(), &calls) {
                let answer = write.await;
                match run.settle("step record", answer) {
                    Written::Ok => {}
                    Written::Fenced => return Launched::Run(Box::new(run), Started::Fenced),
                    Written::Lost => return Launched::Run(Box::new(run), Started::Lost),
                }
            }
        }
    }
    let fresh_calls = matches!(a.point, ResumePoint::RunStepFresh { .. });
    let how: Vec<Settlement> = calls
        .iter()
        .map(|call| {
            if fresh_calls {
                return Settlement::Rerun;
            }
            let def = run.tool_defs.iter().find(|d| d.name == call.tool);
            decisions::settlement(
                def.is_some(),
                def.is_some_and(|d| d.side_effect_free),
                def.is_some_and(|d| d.rerun_safe),
                def.is_some_and(|d| d.idempotent),
            )
        })
        .collect();
    let settled: Vec<Value> = if fresh_calls {
        Vec::new()
    } else {
        calls.iter().zip(&how).map(|(c, h)| json!({"callId": c.call_id, "tool": c.tool, "how": h})).collect()
    };
    run.publish(json!({"type": "resumed", "settled": settled, "fromGeneration": a.from_gen}));
    if let Some(text) = finish_plan {
        return Launched::Run(Box::new(run), Started::Finish(text));
    }
    if !calls.is_empty() {
        let tools = ToolRunner::of(&run);
        let mut results = Vec::with_capacity(calls.len());
        for (call, how) in calls.iter().zip(how) {
            match how.synthetic_text() {
                None => results.push(tools.call(call).await),
                Some(text) => {
                    // A visible settlement: viewers see the call's effects are unknown (SPEC §6.2).
                    let mut event = json!({"type": "tool_result", "callId": call.call_id, "tool": call.tool, "ok": false,
                        "summary": summarize(&run.deps, text), "step": run.step});
                    if how == Settlement::EffectsUnknown {
                        event["effectsUnknown"] = json!(true);
                    }
                    run.publish(event);
                    results.push(ToolResult { call_id: call.call_id.clone(), tool: call.tool.clone(), ok: false, output: text.to_owned() });
                }
            }
        }
        run.pending = Some(agent::results_turn(&results, &[]));
    }
    Launched::Run(Box::new(run), Started::Continue)
}
