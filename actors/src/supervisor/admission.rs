//! Admission (SPEC §5.1): one `ThreadSlot` per thread with activity orders that thread's messages; the
//! ledger's atomic `admit` decides.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use actix::{
    Actor, Addr, AsyncContext, AtomicResponse, Context, Handler, Message, ResponseFuture,
    WrapFuture,
};
use serde_json::Value;
use storage::ledger::{decisions, Admit, AdmitOutcome, ReceiptKey};
use storage::record::ChannelVisibility;

use crate::registry::RunMeta;
use crate::run::{Fresh, Launch, Request};

use super::{LaunchRun, SlotShared, Supervisor};

/// How long a keyed message waits for a finishing run to free its thread (SPEC §5.1).
const BUSY_WAIT: Duration = Duration::from_secs(5);
const BUSY_POLL: Duration = Duration::from_millis(100);

/// A message to admit.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Admitted, AdmitError>")]
pub struct AdmitMessage {
    pub request: Request,
    pub key: Option<ReceiptKey>,
    /// What the caller may see: a message reaches only a live run the caller may see (SPEC §8.1 Auth);
    /// `None` for the process's own admissions (`ask`, the plan coordinator).
    pub writer: Option<storage::record::VisibilityFilter>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    Started {
        run_id: RunId,
        token: String,
    },
    /// `token`: the steered run's capability token (its live view's link).
    Steered {
        run_id: RunId,
        seq: u64,
        token: String,
    },
    /// Queued behind the live run `run_id` (`enqueue`), or behind it while it stops (`interrupt`).
    Queued {
        run_id: RunId,
        position: u64,
        interrupting: bool,
        token: String,
    },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmitError {
    #[error("the process is draining")]
    Draining,
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    #[error("unknown visibility {0:?}")]
    BadVisibility(String),
    #[error("thread key {0:?} is not 1 to 256 characters")]
    BadThread(String),
    #[error("the idempotency key was used with another body")]
    KeyConflict,
    #[error("the thread's run is finishing")]
    ThreadBusy,
    /// `reject` on a busy thread (SPEC §5.1): 409, nothing written.
    #[error("the thread has a live run")]
    Rejected,
    #[error(
        "the thread holds the most queued messages it may ({})",
        storage::ledger::MAX_QUEUED_PER_THREAD
    )]
    QueueFull,
    #[error("the run id is fenced")]
    Fenced,
    #[error(
        "the live run holds the most keyed messages it may ({})",
        storage::ledger::MAX_RECEIPTS_PER_RUN
    )]
    ReceiptLimit,
    #[error("thread {0:?} has a live run the caller may not see")]
    Forbidden(String),
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

impl Handler<AdmitMessage> for Supervisor {
    type Result = ResponseFuture<Result<Admitted, AdmitError>>;

    fn handle(&mut self, msg: AdmitMessage, ctx: &mut Context<Self>) -> Self::Result {
        if self.config.draining.load(Ordering::SeqCst) {
            return Box::pin(async { Err(AdmitError::Draining) });
        }
        let slot = self.slot(&msg.request.thread_key(), ctx.address());
        Box::pin(async move {
            slot.send(msg)
                .await
                .map_err(|e| AdmitError::Unavailable(e.to_string()))?
        })
    }
}

/// `ThreadSlot`: one per thread with activity; admits that thread's messages one at a time.
pub struct ThreadSlot {
    shared: Arc<SlotShared>,
    supervisor: Addr<Supervisor>,
}

impl ThreadSlot {
    pub(super) fn new(shared: Arc<SlotShared>, supervisor: Addr<Supervisor>) -> Self {
        ThreadSlot { shared, supervisor }
    }
}

impl Actor for ThreadSlot {
    type Context = Context<Self>;
}

impl Handler<AdmitMessage> for ThreadSlot {
    type Result = AtomicResponse<Self, Result<Admitted, AdmitError>>;

    fn handle(&mut self, msg: AdmitMessage, _ctx: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let supervisor = self.supervisor.clone();
        AtomicResponse::new(Box::pin(admit(shared, supervisor, msg).into_actor(self)))
    }
}

/// Admission (SPEC §5.1): the ledger's atomic `admit`, then — only for a run it started — the registry
/// row, `run_meta` and `input`, and the run actor.
async fn admit(
    shared: Arc<SlotShared>,
    supervisor: Addr<Supervisor>,
    msg: AdmitMessage,
) -> Result<Admitted, AdmitError> {
    let req = msg.request;
    let thread_key = req.thread_key();
    if !decisions::is_valid_thread_key(&thread_key) {
        return Err(AdmitError::BadThread(thread_key));
    }
    let agent_name = req
        .agent
        .clone()
        .unwrap_or_else(|| shared.default_agent.clone());
    let agent = shared
        .agents
        .get(&agent_name)
        .ok_or_else(|| AdmitError::UnknownAgent(agent_name.clone()))?;
    let visibility = match req.visibility.as_deref() {
        None => ChannelVisibility::Machine,
        Some(v) => {
            ChannelVisibility::parse(v).ok_or_else(|| AdmitError::BadVisibility(v.to_owned()))?
        }
    };
    let run_id = storage::entropy::run_id(shared.clock.now_ms());
    let meta = RunMeta {
        agent: agent_name.clone(),
        model: agent.agent.model().to_owned(),
        label: storage::ledger::label_of(&shared.registry.redactor().redact(&req.text)),
        thread_key: thread_key.clone(),
        channel_id: req.channel.clone(),
        user_id: req.user.clone(),
        channel_visibility: visibility,
        parent_run_id: req.parent_run_id.clone(),
    };
    // The strategy as resolved is what the request carries (omitted for `steer`): a queued inbox item
    // says it is one, and a restart from the request admits it the same way.
    let strategy = req.strategy.unwrap_or(agent.strategy);
    let mut req = req;
    req.strategy = (strategy != storage::ledger::Strategy::Steer).then_some(strategy);
    let request = serde_json::to_value(&req).map_err(|e| AdmitError::Unavailable(e.to_string()))?;
    let tool_defs = agent.tool_defs(&shared.tools);
    let waited_since = shared.clock.now_ms();
    loop {
        let now = shared.clock.now_ms();
        let meta_json = meta.meta_json(Some(now + agent.budget_ms), &request);
        let admit = Admit {
            thread_key: thread_key.clone(),
            gen: shared.gen.as_str().to_owned(),
            run_id: run_id.clone(),
            request: request.clone(),
            meta: meta_json,
            key: msg.key.clone(),
            lease_ms: shared.lease_ms,
            writer: msg.writer.clone(),
            strategy,
        };
        // `run_meta` and `input` (seqs 1 and 2) commit with the admission itself: a crash right after it
        // still replays them, so a restarted run never loses (or repeats) its input (SPEC §5.2 step 2).
        let first_events: Vec<Value> = [
            meta.event(),
            storage::record::input_event(&req.text, storage::record::InputSource::Request),
        ]
        .into_iter()
        .zip(1u64..)
        .map(|(event, seq)| {
            let mut event = Value::from(event.stamped(seq, now));
            shared.registry.redactor().redact_event(&mut event);
            storage::record::cap_event_for_publish(event)
        })
        .collect();
        // The tombstone (SPEC §5.2 step 3) commits with the admission too: a run admitted here leaves a
        // provisional record from its first commit on.
        let tombstone = crate::run::assemble_record(
            &run_id,
            &meta,
            now,
            now,
            storage::record::RunStatus::Interrupted,
            first_events.clone(),
            first_events.len() as u64,
            false,
            crate::run::RecordExtras {
                provisional: true,
                ..Default::default()
            },
        );
        // So do the promotion and the seed (SPEC §5.2 step 4; nothing orders them apart): a run admitted
        // here is resumable from its first commit.
        let opening = crate::run::opening(
            agent,
            &tool_defs,
            &req.text,
            first_events.len() as u64,
            shared.lease_ms,
        );
        // Loaded before the commit that creates the run: its inbox was empty then, so its first read can
        // be skipped until an inbox write moves the epoch ([`crate::run::Run::read_inbox`]).
        let inbox_epoch = shared.storage.inbox_epoch();
        let committing = std::time::Instant::now();
        let (outcome, seeded) = shared
            .storage
            .admit_with_events(
                admit,
                first_events.clone(),
                tombstone.map(|t| (t, shared.proposal)),
                Some(opening),
                now,
            )
            .await
            .map_err(|e| AdmitError::Unavailable(e.to_string()))?;
        return match outcome {
            AdmitOutcome::Started { run_id: started } if started == run_id => {
                if seeded {
                    // This commit was the promotion's write and the seed's durable step.
                    shared.metrics.ledger_write("promotion", None);
                    shared.metrics.steps.inc();
                    shared.metrics.step_commit(committing.elapsed());
                }
                let token = shared.tokens.mint(&run_id);
                shared
                    .registry
                    .create(&run_id, meta.clone(), now, token.clone(), first_events, 3);
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), "admitted a new run");
                shared.metrics.runs_started.inc();
                supervisor.do_send(LaunchRun(Launch::Fresh(Box::new(Fresh {
                    id: run_id.clone(),
                    meta: meta.clone(),
                    request: req.clone(),
                    started_at: now,
                    agent: agent.clone(),
                    tool_defs: tool_defs.clone(),
                    seeded,
                    inbox_epoch,
                }))));
                Ok(Admitted::Started { run_id, token })
            }
            // A keyed retry of an earlier admission: its answer, verbatim.
            AdmitOutcome::Started { run_id } => Ok(Admitted::Started {
                token: shared.tokens.mint(&run_id),
                run_id,
            }),
            AdmitOutcome::Steered { run_id, seq } => {
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), inbox_seq = seq, "steered into a live run");
                Ok(Admitted::Steered {
                    token: shared.tokens.mint(&run_id),
                    run_id,
                    seq,
                })
            }
            AdmitOutcome::Queued { run_id, position } => {
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), position, "queued behind a live run");
                Ok(Admitted::Queued {
                    token: shared.tokens.mint(&run_id),
                    run_id,
                    position,
                    interrupting: false,
                })
            }
            AdmitOutcome::Interrupting { run_id, position } => {
                tracing::info!(run_id = %run_id, generation = shared.gen.as_str(), position, "interrupting a live run");
                // The soft stop is in the ledger already; a run of this process hears it now, one
                // elsewhere at its next heartbeat. Who asked is the message's user.
                supervisor.do_send(crate::supervisor::StopRun {
                    run_id: run_id.clone(),
                    mode: storage::ledger::StopMode::Soft,
                    actor: crate::run::StopActor::new("interrupt", &req.user),
                });
                Ok(Admitted::Queued {
                    token: shared.tokens.mint(&run_id),
                    run_id,
                    position,
                    interrupting: true,
                })
            }
            AdmitOutcome::Rejected { .. } => Err(AdmitError::Rejected),
            AdmitOutcome::QueueFull { .. } => Err(AdmitError::QueueFull),
            AdmitOutcome::Busy { .. } if now - waited_since < BUSY_WAIT.as_millis() as i64 => {
                tokio::time::sleep(BUSY_POLL).await;
                continue;
            }
            AdmitOutcome::Busy { .. } => Err(AdmitError::ThreadBusy),
            AdmitOutcome::KeyConflict => Err(AdmitError::KeyConflict),
            AdmitOutcome::Fenced => Err(AdmitError::Fenced),
            AdmitOutcome::ReceiptLimit { .. } => Err(AdmitError::ReceiptLimit),
            AdmitOutcome::Forbidden => Err(AdmitError::Forbidden(thread_key.clone())),
        };
    }
}
