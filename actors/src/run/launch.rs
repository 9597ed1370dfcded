//! The launch paths (SPEC §5.2, §6.2, §6.3): a fresh run (its admission promoted and seeded it), a restart from a
//! row's saved request, and a resume from a row's transcript. Each builds the run's [`Run`] data and
//! answers where it stands, or closes a row it cannot run; the effects that follow live in [`super::work`].
//!
//! Invariants: a promoted row always has its seed (the promotion and the step-0 record share one commit),
//! and no tool runs before the workspace fence names this incarnation.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use storage::ledger::decisions::{self, ResumePoint, Settlement};
use storage::ledger::{LiveRow, Outcome, Promotion, StepRecord, StepWrite, Turn};
use storage::record::RunEvent;
use storage::record::RunStatus;

use super::machine::{Reattached, Started};
use super::record::{bound_workspace, close_unstartable, meta_from_row};
use super::work::{retry_transient, summarize, Resettle, Run, MAX_WRITE_RETRY, WRITE_RETRY};
use super::{Adoption, AgentEntry, Ended, Fresh, Request, RunDeps};
use crate::agent::{self, AssistantTurn, ToolDef};
use crate::channel::CardPlace;

/// Retry delays of the promotion claim (SPEC §5.5).
const CLAIM_RETRIES: [Duration; 2] = [Duration::from_millis(200), Duration::from_millis(800)];

/// How a launch went: the run's data and where it stands, or the row closed without running.
pub(super) enum Launched {
    Run(Box<Run>, Started),
    /// Boxed: the closing answer is far larger than a running launch's.
    Over(Box<Ended>),
}

/// A fresh run's promotion and seed step (SPEC §5.2 step 4), for the admission that starts it to commit
/// with itself: the agent's prompt and tools, the first model call's messages and the step-0 record
/// after the admission's `seq` first events.
pub fn opening(
    agent: &AgentEntry,
    tool_defs: &[ToolDef],
    text: &str,
    seq: u64,
    lease_ms: i64,
) -> (Promotion, StepWrite) {
    let turns = seed_turns(&agent.system, text);
    let promotion = Promotion {
        system_text: agent.system.clone(),
        tools: json!(tool_defs),
        state: Map::new(),
        lease_ms,
    };
    let record = StepRecord {
        step: 0,
        seq,
        turn_index: turns.len() as u64,
        in_flight: Vec::new(),
        inbox_consumed_seq: None,
        remaining_ms: agent.budget_ms,
        turn: 0,
        iteration: 0,
    };
    let seed = StepWrite {
        first_idx: 0,
        turns,
        record,
        events: Vec::new(),
        state: Map::new(),
    };
    (promotion, seed)
}

/// The first model call's messages: the system prompt and the request.
fn seed_turns(system: &str, text: &str) -> Vec<Turn> {
    vec![agent::system_turn(system), agent::user_turn(text)]
}

/// A run admitted here. Its admission committed the promotion and seed ([`opening`]) unless `seeded`
/// is false (a seed the ledger would refuse), when the launch promotes and seeds it now and meets the
/// refusal as a restart would.
pub(super) async fn fresh(deps: RunDeps, fresh: Box<Fresh>) -> Launched {
    let Fresh {
        id,
        meta,
        request,
        started_at,
        agent,
        tool_defs,
        seeded,
        inbox_epoch,
    } = *fresh;
    let deadline = started_at + agent.budget_ms;
    let mut run = Run::new(deps, id, meta, deadline, agent, tool_defs);
    // As if read empty when it was admitted: no inbox row of the run can predate its admission.
    run.inbox_read_at
        .store(inbox_epoch, std::sync::atomic::Ordering::SeqCst);
    run.card = request.chat_thread().map(|thread| CardPlace {
        thread,
        handle: None,
        look: false,
    });
    if !seeded {
        return promote(run, &request.text);
    }
    // The transcript in memory is the seed the admission wrote (`turns` holds what follows the system
    // turn).
    let mut turns = seed_turns(&run.system, &request.text);
    run.turn_count = turns.len() as u64;
    run.turns = turns.split_off(1);
    Launched::Run(Box::new(run), Started::Continue)
}

/// Prepare the promotion of the reserved row with its seed (SPEC §5.2 steps 4–5) for the machine's
/// promotion effect ([`Started::Promote`], [`Run::write_promotion`]): from its commit the run is
/// resumable. Its workspace is taken only by the first step that calls a tool with effects
/// ([`Run::durable_step`]): a row that never ran one was never promoted with tools in flight, so no
/// earlier owner can have written there, and a run that calls none touches no file.
fn promote(mut run: Run, request_text: &str) -> Launched {
    let promotion = Promotion {
        system_text: run.system.clone(),
        tools: json!(&*run.tool_defs),
        state: Map::new(),
        lease_ms: run.deps.lease_ms,
    };
    // The promotion and the seed (the first model call's messages and the step-0 record) share one
    // commit: the run is resumable exactly when its seed is durable.
    let seed = run.step_write(seed_turns(&run.system, request_text), &[]);
    run.turns.remove(0); // `turns` holds what follows the system turn
    run.promotion = Some((promotion, seed));
    Launched::Run(Box::new(run), Started::Promote)
}

impl Run {
    /// The promotion's commit (with its seed, when the ledger takes one), retried while storage is
    /// away (SPEC §5.5). Answers the ledger's answer (`None`: storage stayed away past the lease) and
    /// whether it carried the seed.
    pub fn write_promotion(
        &mut self,
    ) -> impl std::future::Future<Output = (Option<storage::Result<Outcome<()>>>, bool)> + 'static
    {
        let (promotion, seed) = self
            .promotion
            .take()
            .expect("a promotion effect follows its preparation");
        let seeded = seed.is_some();
        let (s, id, gen) = (self.deps.storage.clone(), self.id.clone(), self.gen.clone());
        let (lease_ms, metrics) = (self.deps.lease_ms, self.deps.metrics.clone());
        let claim = move || {
            let (s, id, gen, promotion, seed) = (
                s.clone(),
                id.clone(),
                gen.clone(),
                promotion.clone(),
                seed.clone(),
            );
            async move {
                let answer = match seed {
                    Some(seed) => s.promote(id, gen, promotion, seed).await,
                    None => s.claim(id, gen, promotion).await,
                };
                answer.map(|o| o.map(|_| ()))
            }
        };
        async move {
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
                retry_transient(lease_ms, claim).await
            } else {
                Some(answer)
            };
            if seeded && answer.is_some() {
                metrics.step_commit(started.elapsed());
            }
            (answer, seeded)
        }
    }
}

/// A workspace that could not be created (a full disk, a bad `workspace_root`) does not fail the run: a
/// run that never calls a workspace tool cannot fail on it, and one that does gets the tool's error as
/// its result (its tools find no fence). The row's binding stays empty, so a resume creates the
/// workspace then instead of closing the run for a workspace it never had (SPEC §8.3).
pub(super) fn without_workspace(
    deps: &RunDeps,
    id: &storage::RunId,
    gen: &str,
    tracked: bool,
    why: &str,
) {
    tracing::warn!(run_id = %id, generation = %gen, error = %why, "running without a workspace");
    let note = super::work::note_event("workspace_unavailable", &summarize(deps, why));
    super::publish(deps, id, note, tracked);
}

/// Why a take did not happen: the ledger names another owner, or the workspace could not be taken.
pub(super) enum Took {
    NotOwner,
    Failed(String),
}

/// What taking a run's workspace needs, detached from the run so a step's write can take it first.
pub(super) struct Take {
    pub deps: RunDeps,
    pub id: storage::RunId,
    pub gen: String,
    pub workspace: std::path::PathBuf,
    pub fence: String,
}

impl Take {
    pub fn of(run: &Run) -> Self {
        Take {
            deps: run.deps.clone(),
            id: run.id.clone(),
            gen: run.gen.clone(),
            workspace: run.workspace.clone(),
            fence: run.fence.clone(),
        }
    }

    /// Take the run's workspace for this generation (SPEC §8.3 workspace fencing): rewrite its fence
    /// under the exclusive lock before any tool with effects runs, while the ledger still names this
    /// generation as the run's owner. A lock a paused old owner still holds, or a ledger that cannot
    /// answer, is retried with backoff; any other failure is answered.
    pub async fn run(&self, mode: crate::tools::TakeMode) -> Result<(), Took> {
        let mut delay = WRITE_RETRY;
        loop {
            let owns = still_owner(&self.deps, &self.id);
            match crate::tools::take_workspace_async(
                self.workspace.clone(),
                self.fence.clone(),
                mode,
                owns,
            )
            .await
            {
                Ok(()) => return Ok(()),
                Err(crate::tools::WorkspaceError::Busy { .. }) => {
                    tracing::warn!(run_id = %self.id, generation = %self.gen, "workspace lock held by another owner; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_WRITE_RETRY);
                }
                Err(crate::tools::WorkspaceError::NotOwner { .. }) => return Err(Took::NotOwner),
                Err(e) => return Err(Took::Failed(format!("workspace: {e}"))),
            }
        }
    }
}

/// Whether the ledger names this generation as the owner of `run_id` (one read, no retry: a workspace
/// take holds its lock while it waits for the answer).
pub(super) async fn still_owner(deps: &RunDeps, run_id: &str) -> Result<bool, String> {
    match deps.storage.get_live(run_id.into()).await {
        Ok(row) => Ok(row.is_some_and(|row| row.owner_gen == deps.gen.as_str())),
        Err(e) => Err(e.to_string()),
    }
}

/// Re-run a row from its saved request: same id, original start and deadline; the first attempt's
/// events replayed under their seqs, then `resumed`, then the steps (SPEC §6.3). A successor admitted
/// here (`from_gen: None`) starts the same way, without `resumed`.
pub(super) async fn restart(
    deps: RunDeps,
    row: LiveRow,
    events: Vec<Value>,
    from_gen: Option<String>,
) -> Launched {
    let meta = meta_from_row(&row);
    let request = Request::of_row(&row);
    let (Some(agent), Some(request)) = (deps.agents.get(&meta.agent).cloned(), request) else {
        let reason = format!(
            "cannot restart: agent {:?} is not configured here, or the saved request is unreadable",
            meta.agent
        );
        return Launched::Over(Box::new(
            close_unstartable(&deps, &row, events, &reason).await,
        ));
    };
    let deadline = row
        .meta
        .get("deadline")
        .and_then(Value::as_i64)
        .unwrap_or(row.started_at + agent.budget_ms);
    let highest = events
        .iter()
        .filter_map(storage::record::event_seq)
        .max()
        .unwrap_or(0);
    let token = deps.tokens.mint(&row.run_id);
    let had_input = events.iter().any(|e| e["type"] == "input");
    // Past anything the dead attempt may have published but not flushed; a first start just continues.
    let next_seq = if from_gen.is_some() {
        highest + 1000
    } else {
        highest + 1
    };
    let usage = agent::usage_of(&events);
    deps.registry.create(
        &row.run_id,
        meta.clone(),
        row.started_at,
        token,
        events,
        next_seq,
    );
    let tools = agent.tool_defs(&deps.tools);
    let mut run = Run::new(
        deps,
        row.run_id.clone(),
        meta.clone(),
        deadline,
        agent,
        tools,
    );
    run.usage = usage;
    run.recorded_stop = row.stop;
    run.card = chat_card(&row);
    if highest == 0 || !had_input {
        // The first attempt's events never reached the ledger: publish the identity and request once.
        run.publish(meta.event());
        run.publish(storage::record::input_event(
            &request.text,
            storage::record::InputSource::Request,
        ));
    }
    if let Some(from_gen) = from_gen {
        run.publish(RunEvent::resumed(Vec::new(), Some(from_gen)));
    }
    promote(run, &request.text)
}

/// Adopt a row this generation owns and continue it from its transcript (SPEC §6.2). The launch builds
/// the run's data; the machine's effects do the rest ([`Started::Reattach`]): re-attach the workspace
/// ([`Run::reattach`]), write the resumed step's record when its turns landed without it
/// ([`Run::write_resumed_step`]), and decide how each call in flight settles ([`Run::resume`]); the
/// tools effect settles them ([`Started::Tools`]), then the steps go on.
pub(super) async fn resume(deps: RunDeps, a: Adoption) -> Launched {
    let row = a.row;
    let meta = meta_from_row(&row);
    let Some(agent) = deps.agents.get(&meta.agent).cloned() else {
        let reason = format!(
            "cannot resume: agent {:?} is not configured here",
            meta.agent
        );
        return Launched::Over(Box::new(
            close_unstartable(&deps, &row, a.events, &reason).await,
        ));
    };
    let now = deps.clock.now_ms();
    let highest = a
        .events
        .iter()
        .filter_map(storage::record::event_seq)
        .max()
        .unwrap_or(0);
    let token = deps.tokens.mint(&row.run_id);
    let usage = agent::usage_of(&a.events);
    deps.registry.create(
        &row.run_id,
        meta.clone(),
        row.started_at,
        token,
        a.events,
        highest + 1000,
    );
    let tools = agent.tool_defs(&deps.tools);
    let mut run = Run::new(
        deps,
        row.run_id.clone(),
        meta,
        now + a.last_step.remaining_ms,
        agent,
        tools,
    );
    run.usage = usage;
    run.recorded_stop = row.stop;
    run.card = chat_card(&row);
    if !row.system_text.is_empty() {
        run.system = row.system_text.clone();
    }
    // Re-attach the workspace the row is bound to; never migrate silently (SPEC §8.3). A row bound to no
    // workspace (its launch could not create one) gets it created now.
    let bound = bound_workspace(&row);
    let mode = if bound.is_some() {
        crate::tools::TakeMode::Existing
    } else {
        crate::tools::TakeMode::Create
    };
    if let Some(bound) = bound {
        run.workspace = bound;
    }
    // A resume takes the workspace at once: the calls in flight it settles next may be an earlier
    // owner's, and none may land after this generation decides about them.
    run.workspace_taken = true;
    run.reattachment = Some(Box::new(Reattachment {
        row,
        mode,
        transcript: a.transcript,
        last_step: a.last_step,
        point: a.point,
        from_gen: a.from_gen,
        calls: Vec::new(),
        finish_plan: None,
        last_assistant: None,
    }));
    Launched::Run(Box::new(run), Started::Reattach)
}

/// What a resume carries from its launch through the machine's re-attachment effects.
pub(super) struct Reattachment {
    row: LiveRow,
    mode: crate::tools::TakeMode,
    transcript: Vec<Turn>,
    last_step: StepRecord,
    point: ResumePoint,
    from_gen: String,
    /// From the transcript, once the workspace is taken: the calls the resumed step settles, and the
    /// answer when the transcript already ends on it (a finish plan).
    calls: Vec<crate::agent::ToolCall>,
    finish_plan: Option<String>,
    last_assistant: Option<AssistantTurn>,
}

/// How a resume's workspace take went ([`Run::reattach`]).
pub(super) enum Reattach {
    Took,
    NotOwner,
    /// The bound workspace exists but could not be taken.
    Failed(String),
    /// The bound workspace is missing: the row is closed (boxed: the closing answer is large).
    Closed(Box<Ended>),
}

impl Run {
    fn reattachment(&mut self) -> &mut Reattachment {
        self.reattachment
            .as_mut()
            .expect("a resume's effects follow its launch")
    }

    /// Take the workspace the resumed row is bound to (or create it when it is bound to none). A bound
    /// workspace that is missing closes the row: its files are gone, so no call of it can be settled.
    pub fn reattach(&mut self) -> impl std::future::Future<Output = Reattach> + 'static {
        let take = Take::of(self);
        let tracked = self.tracked();
        let a = self.reattachment();
        let (mode, row) = (a.mode, a.row.clone());
        async move {
            match take.run(mode).await {
                Ok(()) => Reattach::Took,
                Err(Took::NotOwner) => Reattach::NotOwner,
                Err(Took::Failed(why)) if mode == crate::tools::TakeMode::Create => {
                    without_workspace(&take.deps, &take.id, &take.gen, tracked, &why);
                    Reattach::Took
                }
                Err(Took::Failed(why)) if !take.workspace.is_dir() => {
                    let events = take
                        .deps
                        .registry
                        .snapshot(&take.id)
                        .map(|(_, e)| e)
                        .unwrap_or_default();
                    let reason = format!("the run's workspace is missing ({why})");
                    Reattach::Closed(Box::new(
                        close_unstartable(&take.deps, &row, events, &reason).await,
                    ))
                }
                Err(Took::Failed(why)) => Reattach::Failed(why),
            }
        }
    }

    /// The workspace is taken: load the transcript and find the calls the resumed step settles. Answers
    /// whether the step's record must be written first (its turns landed without it), or why the run
    /// cannot go on (the transcript's calls are not the record's).
    pub fn reattached(&mut self) -> Reattached {
        let a = self.reattachment();
        let transcript = std::mem::take(&mut a.transcript);
        let (last_step, point) = (a.last_step.clone(), a.point.clone());
        self.turn_count = transcript.len() as u64;
        self.turns = transcript.into_iter().skip(1).collect();
        self.step = last_step.step;
        self.iteration = last_step.iteration;
        self.inbox_consumed = last_step.inbox_consumed_seq;
        let last_assistant = self.turns.last().and_then(AssistantTurn::from_turn);
        let mut calls = Vec::new();
        let mut finish_plan = None;
        let fresh = match point {
            ResumePoint::ResumeAt { .. } => {
                let recorded: Vec<String> = last_step
                    .in_flight
                    .iter()
                    .map(|c| c.call_id.clone())
                    .collect();
                if let Some(turn) = &last_assistant {
                    let ids: Vec<String> = turn.calls.iter().map(|c| c.call_id.clone()).collect();
                    if let Err(reason) = decisions::in_flight_matches(&recorded, &ids) {
                        let from_gen = self.reattachment().from_gen.clone();
                        self.publish(RunEvent::resumed(Vec::new(), Some(from_gen)));
                        return Reattached::Fail(reason);
                    }
                    if turn.calls.is_empty() {
                        finish_plan = Some(turn.text.clone());
                    }
                    calls = turn.calls.clone();
                }
                false
            }
            ResumePoint::RunStepFresh { step } => {
                // The step's turns landed but not its record: nothing was dispatched, run its calls fresh.
                self.step = step;
                self.iteration += 1;
                calls = last_assistant
                    .as_ref()
                    .map(|t| t.calls.clone())
                    .unwrap_or_default();
                if calls.is_empty() {
                    finish_plan = Some(self.last_text());
                }
                true
            }
        };
        let a = self.reattachment();
        a.calls = calls;
        a.finish_plan = finish_plan;
        a.last_assistant = last_assistant;
        Reattached::Took { write: fresh }
    }

    /// The resumed step's record, with its calls in flight (run afresh: nothing was dispatched), before
    /// any of them runs; `None` when there is nothing to write.
    pub fn write_resumed_step(
        &mut self,
    ) -> Option<impl std::future::Future<Output = Option<storage::Result<Outcome<()>>>> + 'static>
    {
        let calls = self.reattachment().calls.clone();
        self.publish_calls(&calls);
        self.durable_step(Vec::new(), &calls)
    }

    /// Decide how the resumed step goes on: wait again for approvals a call still needs (SPEC §13),
    /// finish on an answer the transcript holds, continue with the next step, or settle the calls in
    /// flight per call (SPEC §6.2) as the step's tools effect.
    pub fn resume(&mut self) -> Started {
        let a = *self
            .reattachment
            .take()
            .expect("a resume's effects follow its launch");
        let Reattachment {
            row,
            point,
            from_gen,
            calls,
            finish_plan,
            last_assistant,
            ..
        } = a;
        // A step parked on approvals (SPEC §13): while one of its calls needing approval is not released,
        // none of the step's calls ran, so the run waits again (the gate requests only what was never
        // requested, and applies a decision taken while no process held the run).
        let approvals = row.approvals();
        let waiting = calls.iter().any(|c| {
            self.needs_approval(&c.tool) && !approvals.get(&c.call_id).is_some_and(|a| a.released)
        });
        if waiting {
            self.publish(RunEvent::resumed(Vec::new(), Some(from_gen)));
            self.current = last_assistant;
            return Started::Tools;
        }
        let fresh_calls = matches!(point, ResumePoint::RunStepFresh { .. });
        let settling: Vec<Resettle> = calls
            .iter()
            .map(|call| {
                // A released denial is the call's result whatever its settlement: it never ran.
                let denied = approvals
                    .get(&call.call_id)
                    .and_then(|a| a.decided.clone())
                    .filter(|d| d.decision == storage::ledger::Decision::Deny);
                if fresh_calls {
                    return Resettle {
                        how: Settlement::Rerun,
                        denied,
                    };
                }
                let def = self.tool_defs.iter().find(|d| d.name == call.tool);
                let how = decisions::settlement(
                    def.is_some(),
                    def.is_some_and(|d| d.side_effect_free),
                    def.is_some_and(|d| d.rerun_safe),
                    def.is_some_and(|d| d.idempotent),
                );
                Resettle { how, denied }
            })
            .collect();
        let settled: Vec<Value> = if fresh_calls {
            Vec::new()
        } else {
            calls
                .iter()
                .zip(&settling)
                .map(|(c, s)| json!({"callId": c.call_id, "tool": c.tool, "how": s.how}))
                .collect()
        };
        self.publish(RunEvent::resumed(settled, Some(from_gen)));
        if let Some(text) = finish_plan {
            return Started::Finish(text);
        }
        if calls.is_empty() {
            return Started::Continue;
        }
        // The calls settle as the step's tools effect, like any step's: a hard stop aborts them.
        self.current = last_assistant;
        self.settling = Some(settling);
        Started::Tools
    }
}

/// Continue the reply of a row this generation holds past its finishing gate, whose reply never went
/// out (its actor lost storage at the gate; SPEC §5.2 step 7): the saved status and answer go through
/// the gate again (the committed gate answers as `Ok`), then the answer, the webhook and the record.
/// The registry still holds what the lost actor published; else the ledger's events are replayed.
pub(super) async fn deliver(
    deps: RunDeps,
    row: LiveRow,
    events: Vec<Value>,
    step: u64,
) -> Launched {
    let meta = meta_from_row(&row);
    let Some(agent) = deps.agents.get(&meta.agent).cloned() else {
        let reason = format!(
            "cannot deliver: agent {:?} is not configured here",
            meta.agent
        );
        return Launched::Over(Box::new(
            close_unstartable(&deps, &row, events, &reason).await,
        ));
    };
    if deps.registry.row(&row.run_id).is_none() {
        let highest = events
            .iter()
            .filter_map(storage::record::event_seq)
            .max()
            .unwrap_or(0);
        let token = deps.tokens.mint(&row.run_id);
        deps.registry.create(
            &row.run_id,
            meta.clone(),
            row.started_at,
            token,
            events,
            highest + 1000,
        );
    }
    let status = row.final_status().unwrap_or(RunStatus::Completed);
    let answer = row.saved_answer().map(str::to_owned);
    let deadline = row
        .meta
        .get("deadline")
        .and_then(Value::as_i64)
        .unwrap_or(row.started_at + agent.budget_ms);
    // Usage totals never go backwards: from what the lost actor (or the ledger) published.
    let published = deps
        .registry
        .snapshot(&row.run_id)
        .map(|(_, events)| events)
        .unwrap_or_default();
    let tools = agent.tool_defs(&deps.tools);
    let mut run = Run::new(deps, row.run_id.clone(), meta, deadline, agent, tools);
    run.usage = agent::usage_of(&published);
    run.step = step;
    run.card = chat_card(&row);
    if let Some(bound) = bound_workspace(&row) {
        run.workspace = bound;
    }
    tracing::info!(run_id = %run.id, generation = %run.gen, status = status.as_str(), "continuing the reply of a run past its finishing gate");
    Launched::Run(Box::new(run), Started::Gated { status, answer })
}

/// Where a row's run shows its card: its chat thread, the card an earlier incarnation saved there, or one
/// it posted without saving (looked for).
fn chat_card(row: &LiveRow) -> Option<CardPlace> {
    Some(CardPlace {
        thread: Request::of_row(row)?.chat_thread()?,
        handle: crate::channel::cards::card_of(row),
        look: true,
    })
}
