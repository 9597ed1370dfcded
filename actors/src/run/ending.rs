//! The run's ending effects (SPEC §5.2 steps 7–8): the finishing gate, the answer and its reply, and
//! the final record through the ledger's finish.

use std::time::Duration;

use serde_json::{json, Value};
use storage::ledger::{LiveRow, Refusal, StepWrite};
use storage::record::RunEvent;
use storage::record::{RunRecord, RunStatus};

use actix::{Context, Handler, Message};

use super::machine::{Msg, Written};
use super::record::{admitted_successor, assemble_record, RecordExtras};
use super::work::{retry_transient, Run, Tracking};
use super::{publish, RunActor};
use crate::channel::card::Ending;
use crate::history::{Via, WriteOutcome};

impl Run {
    /// Write the step held back ([`Run::defer_step`]), flush the run's events, then the finishing gate
    /// (SPEC §5.2 step 7): only a confirmed owner replies. Unavailable storage is retried for up to the
    /// lease; a `WrongPhase` whose row already sits in `finishing` under this generation with this
    /// status means an earlier attempt committed. A detached run replies best-effort.
    pub fn finishing_gate(
        &self,
        status: RunStatus,
        answer: Option<String>,
        unwritten: Option<StepWrite>,
    ) -> impl std::future::Future<Output = Gate> + 'static {
        let (deps, id, gen, tracking) = (
            self.deps.clone(),
            self.id.clone(),
            self.gen.clone(),
            self.tracking,
        );
        async move {
            match tracking {
                Tracking::Fenced => return Gate::Answer(Written::Fenced),
                Tracking::Detached => return Gate::Answer(Written::Ok),
                Tracking::Tracked => {}
            }
            if let Some(w) = unwritten.map(std::sync::Arc::new) {
                let s = deps.storage.clone();
                let step = retry_transient(deps.lease_ms, || {
                    s.write_step(id.clone(), gen.clone(), w.clone())
                })
                .await;
                match step {
                    None => return Gate::Answer(Written::Lost),
                    Some(Ok(Ok(()))) => {}
                    Some(Ok(Err(Refusal::Fenced { .. } | Refusal::UnknownRun { .. }))) => {
                        return Gate::Answer(Written::Fenced)
                    }
                    Some(Ok(Err(refusal))) => return Gate::Detach(refusal.to_string()),
                    Some(Err(e)) => return Gate::Detach(e.to_string()),
                }
            }
            // Everything published so far reaches the ledger first: a crash from here on closes the
            // run from complete live events.
            let _ = deps
                .flusher
                .send(crate::flusher::FlushRun(id.clone()))
                .await;
            let s = deps.storage.clone();
            let gate = retry_transient(deps.lease_ms, || {
                s.finishing(id.clone(), gen.clone(), status, answer.clone())
            })
            .await;
            match gate {
                None => Gate::Answer(Written::Lost),
                Some(Ok(Ok(()))) => Gate::Answer(Written::Ok),
                Some(Ok(Err(Refusal::StopPending { mode, .. }))) => Gate::Stopped(mode),
                Some(Ok(Err(Refusal::WrongPhase { .. }))) => {
                    match retry_transient(deps.lease_ms, || s.get_live(id.clone())).await {
                        None => Gate::Answer(Written::Lost),
                        Some(Ok(Some(row)))
                            if row.owner_gen == gen
                                && row.phase == storage::ledger::Phase::Finishing
                                && row.final_status() == Some(status) =>
                        {
                            Gate::Answer(Written::Ok)
                        }
                        Some(_) => Gate::Answer(Written::Fenced),
                    }
                }
                Some(Ok(Err(_))) => Gate::Answer(Written::Fenced),
                Some(Err(e)) => Gate::Detach(e.to_string()),
            }
        }
    }

    /// Whether the run's end has no reply to deliver, so its gate and its final record may commit as
    /// one (SPEC §5.2 step 3: no webhook; nor a chat thread, whose reply is a delivery too).
    pub fn seals(&self) -> bool {
        self.tracking == Tracking::Tracked && self.deps.webhook.is_none() && self.card.is_none()
    }

    /// The step held back, the gate and the final record in one commit ([`storage::StorageHandle::seal`]).
    /// The answer event is stamped first, so the record carries it exactly as it is shown once the
    /// commit answers ([`Gate::Sealed`]). A refusal commits nothing and goes the long way
    /// ([`Run::finishing_gate`]), which answers it as ever; so does a permanent error. Unavailable
    /// storage is retried for up to the lease; a refusal after an unanswered attempt first reads back
    /// whether that attempt sealed (the stored record is this one: same status, same finish time).
    pub fn seal(
        &self,
        status: RunStatus,
        answer: Option<String>,
        unwritten: Option<StepWrite>,
    ) -> impl std::future::Future<Output = Gate> + 'static {
        let long_way = self.finishing_gate(status, answer.clone(), unwritten.clone());
        let finished_at = self.now();
        let shown = answer.as_ref().and_then(|text| {
            self.deps
                .registry
                .stamp(&self.id, RunEvent::answer(text.as_str()).into())
        });
        let record = self.final_record(status, finished_at, shown.clone());
        let successor = super::record::fresh_successor(&self.deps, self.inbox_consumed);
        let (deps, id, gen) = (self.deps.clone(), self.id.clone(), self.gen.clone());
        async move {
            let Some(record) = record else {
                return long_way.await;
            };
            let s = deps.storage.clone();
            let started = std::time::Instant::now();
            let tries = std::cell::Cell::new(0u32);
            let sealed = retry_transient(deps.lease_ms, || {
                tries.set(tries.get() + 1);
                s.seal(
                    gen.clone(),
                    unwritten.clone(),
                    status,
                    record.clone(),
                    deps.history.proposal(),
                    Some(successor.clone()),
                )
            })
            .await;
            if sealed.is_some() && unwritten.is_some() {
                // The held step commits here: storage answered within the lease.
                deps.metrics.step_commit(started.elapsed());
            }
            let admitted = match sealed {
                None => return Gate::Answer(Written::Lost),
                Some(Ok(Ok(admitted))) => admitted,
                // An earlier attempt whose answer was lost may have sealed the run.
                Some(Ok(Err(_)))
                    if tries.get() > 1
                        && s.get(id.clone()).await.is_ok_and(|r| {
                            r.is_some_and(|r| {
                                !r.head.provisional
                                    && r.head.status == status
                                    && r.head.finished_at == finished_at
                            })
                        }) =>
                {
                    true
                }
                Some(Ok(Err(_)) | Err(_)) => return long_way.await,
            };
            let successor = match admitted {
                true => admitted_successor(&deps, &successor.run_id)
                    .await
                    .map(Box::new),
                false => None,
            };
            Gate::Sealed {
                status,
                finished_at,
                shown,
                successor,
            }
        }
    }

    /// Show what a sealed run's record holds that the live view has not shown yet (its answer) and
    /// retire the run from the registry: the store serves its record from now on.
    pub fn sealed(&self, status: RunStatus, finished_at: i64, shown: Option<Value>) {
        if let Some(event) = shown {
            if self.deps.registry.publish_stamped(&self.id, event.clone()) {
                self.deps.cards.observe(&self.id, &event);
            } else {
                tracing::error!(run_id = %self.id, generation = %self.gen, "the sealed answer's seq was taken; not shown live");
            }
        }
        self.finished(status, finished_at);
        self.deps.registry.landed(&self.id);
    }

    /// The registry and metrics learn that the run finished.
    fn finished(&self, status: RunStatus, finished_at: i64) {
        self.deps.registry.finish(&self.id, status, finished_at);
        self.deps.metrics.run_finished(status.as_str());
        if let Some(row) = self.deps.registry.row(&self.id) {
            let took =
                Duration::from_millis(u64::try_from(finished_at - row.started_at).unwrap_or(0));
            self.deps.metrics.run_duration(status.as_str(), took);
        }
    }

    /// The run's final record from the registry's events, plus `last` when it is not shown yet.
    fn final_record(
        &self,
        status: RunStatus,
        finished_at: i64,
        last: Option<Value>,
    ) -> Option<RunRecord> {
        let usage = (!self.usage.is_empty()).then(|| json!(self.usage));
        // A detached run's record is best effort (SPEC §5.5): provisional, so it never replaces the record
        // of the reclaim that closes its row; until then it is the run's latest trace.
        let extras = RecordExtras {
            provisional: !self.tracked(),
            reply: self.reply.clone(),
            diagnosis: Some(self.diagnosis()),
            step_count: Some(self.step),
            usage,
            ..Default::default()
        };
        let (row, mut events) = self.deps.registry.snapshot(&self.id)?;
        let mut event_count = row.event_count;
        if let Some(last) = last {
            events.push(last);
            event_count += 1;
        }
        assemble_record(
            &self.id,
            &row.meta,
            row.started_at,
            finished_at,
            status,
            events,
            event_count,
            row.truncated,
            extras,
        )
    }

    /// Publish the answer and POST the reply to the configured webhook. The kill state is checked
    /// immediately before the attempt: a killed run sends nothing (SPEC §5.2 step 7).
    pub fn deliver(
        &self,
        status: RunStatus,
        answer: Option<String>,
    ) -> impl std::future::Future<Output = Delivery> + 'static {
        if let Some(text) = &answer {
            self.publish(RunEvent::answer(text.as_str()));
        }
        let (deps, id, gen, detached) = (
            self.deps.clone(),
            self.id.clone(),
            self.gen.clone(),
            self.tracking == Tracking::Detached,
        );
        let thread = self.card.as_ref().map(|place| place.thread.clone());
        let text = answer.clone();
        let body = json!({
            "runId": self.id, "threadKey": self.meta.thread_key, "channel": self.meta.channel_id,
            "user": self.meta.user_id, "status": status.as_str(), "answer": answer, "finishedAt": self.now(),
        });
        async move {
            // The kill state is checked before every attempt of a reply.
            let proceed = || {
                let (storage, id) = (deps.storage.clone(), id.clone());
                async move { detached || !storage.is_killed(id).await.unwrap_or(false) }
            };
            // The answer as a reply in the run's chat thread (SPEC §12).
            let chat = match (thread.filter(|_| deps.cards.enabled()), text) {
                (Some(thread), Some(text)) => {
                    if !proceed().await {
                        tracing::info!(run_id = %id, generation = %gen, "killed after the finishing gate: no reply");
                        return Delivery::Killed;
                    }
                    Some(match deps.cards.reply(&thread, &id, &text).await {
                        Ok(()) => (true, None),
                        Err(e) => {
                            tracing::warn!(run_id = %id, generation = %gen, error = %e, "the answer did not reach the chat thread");
                            (false, Some(format!("chat reply failed: {e}")))
                        }
                    })
                }
                _ => None,
            };
            let Some(hook) = deps.webhook.as_ref() else {
                return Delivery::Sent(chat);
            };
            // Signed, retried until the deadline.
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
            let hooked = reply.into_pair();
            Delivery::Sent(Some(match chat {
                Some((false, note)) => (false, note),
                _ => hooked,
            }))
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
    pub fn record(
        &self,
        status: RunStatus,
    ) -> impl std::future::Future<Output = Recorded> + 'static {
        let finished_at = self.now();
        self.finished(status, finished_at);
        let record = self.final_record(status, finished_at, None);
        let successor = self
            .tracked()
            .then(|| super::record::fresh_successor(&self.deps, self.inbox_consumed));
        let via = match &successor {
            Some(s) => Via::Ledger {
                gen: self.gen.clone(),
                successor: Some(s.clone()),
            },
            None => Via::Store,
        };
        let (deps, id) = (self.deps.clone(), self.id.clone());
        async move {
            let Some(mut record) = record else {
                return Recorded::Ended(None);
            };
            // The card's closing frame goes out before the record, which says whether it did.
            let ending = Ending::Ended {
                status,
                finished_at,
            };
            deps.cards
                .close(&id, ending)
                .await
                .stamp(&mut record.head.extra);
            match deps.history.write(record, via).landed().await {
                WriteOutcome::Landed(_) | WriteOutcome::Reconciled => deps.registry.landed(&id),
                // Killed, or another generation owns the run: this process serves it no longer.
                WriteOutcome::Fenced => return Recorded::Fenced,
                // Kept (and served from here) for its TTL: the store does not have it.
                WriteOutcome::StoodDown | WriteOutcome::Lost(_) => {}
            }
            match successor {
                Some(s) => {
                    Recorded::Ended(admitted_successor(&deps, &s.run_id).await.map(Box::new))
                }
                None => Recorded::Ended(None),
            }
        }
    }
}

/// How the final record went.
pub(super) enum Recorded {
    /// Written (or kept here when the store would not take it), with the successor it admitted (boxed:
    /// a row and its events are far larger than the other answer).
    Ended(Option<Box<(LiveRow, Vec<Value>)>>),
    /// The ledger refused the finish: killed meanwhile, or another generation owns the run.
    Fenced,
}

/// What the finishing gate answered; `Detach` when a permanent storage error detached the run (it then
/// replies best-effort).
pub(super) enum Gate {
    Answer(Written),
    /// The gate and the final record committed together ([`Run::seal`]): `shown` is the stamped answer
    /// event the record carries, for the live view; `successor` what the finish admitted here (boxed:
    /// a row and its events are far larger than the other answers).
    Sealed {
        status: RunStatus,
        finished_at: i64,
        shown: Option<Value>,
        successor: Option<Box<(LiveRow, Vec<Value>)>>,
    },
    /// A stop recorded before the gate of a `completed` run: nothing committed; conclude again.
    Stopped(storage::ledger::StopMode),
    Detach(String),
}

/// What the reply step did.
pub(super) enum Delivery {
    /// `(replyOk, replyNote)` when a webhook was called.
    Sent(Option<(bool, Option<String>)>),
    /// The run was killed: no webhook, no record.
    Killed,
}

/// The finishing gate's answer (SPEC §5.2 step 6): the final status and answer committed, a stop
/// recorded before it, or a permanent error that detached the run.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Finishing {
    pub(super) epoch: u64,
    pub(super) gate: Gate,
}

/// The final record's answer (SPEC §5.2 step 8): written through the ledger's finish (with the successor
/// it admitted for unread follow-ups), or refused.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Finish {
    pub(super) epoch: u64,
    pub(super) recorded: Recorded,
}

impl Handler<Finishing> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: Finishing, ctx: &mut Context<Self>) {
        if !self.answered(msg.epoch) {
            return;
        }
        let held = self.held.take().unwrap_or_default();
        if !matches!(msg.gate, Gate::Sealed { .. }) {
            let tracked = self.run().tracked();
            for event in held {
                publish(&self.deps, &self.id, event, tracked);
            }
        }
        let msg = match msg.gate {
            Gate::Sealed {
                status,
                finished_at,
                shown,
                successor,
            } => {
                self.run().sealed(status, finished_at, shown);
                self.successor = successor.map(|s| *s);
                Msg::Sealed
            }
            Gate::Answer(written) => Msg::Gate(written),
            Gate::Stopped(mode) => Msg::GateStopped(mode),
            Gate::Detach(why) => {
                self.run().detach("finishing", why);
                Msg::Gate(Written::Ok)
            }
        };
        self.apply(msg, ctx);
    }
}

impl Handler<Finish> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: Finish, ctx: &mut Context<Self>) {
        if !self.answered(msg.epoch) {
            return;
        }
        let written = match msg.recorded {
            Recorded::Ended(successor) => {
                self.successor = successor.map(|s| *s);
                Written::Ok
            }
            Recorded::Fenced => Written::Fenced,
        };
        self.apply(Msg::Recorded(written), ctx);
    }
}
