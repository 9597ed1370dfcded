//! The run lifecycle as a pure state machine (SPEC §1.1): `transition(&RunState, &Msg) -> (RunState,
//! Vec<Effect>)`. No I/O, no clock: what the shell measured (whether the budget ran out, what the model
//! answered, what storage said) arrives inside the message, and what should happen next leaves as
//! [`Effect`]s the actor shell executes — each completion comes back as the next message.
//!
//! ```text
//!  Starting ──Started──▶ (step boundary) ──CallModel──▶ Calling ──ModelAnswered──▶ Writing
//!      ▲                    │   ▲                                                     │
//!      │                    │   └────────ToolsDone──── Tools ◀──StepWritten(calls)────┤
//!      │                    │   └──StepWritten── Folding ◀─Inbox(n>0)── Reading ◀─StepWritten(text)┘
//!      │                    ├──drain──▶ HandingOff ──HandedOff──▶ Ended(HandedOff)
//!      │                    └──end of loop──▶ Gating ──Gate(open)──▶ Replying ──Replied──▶ Recording
//!      │                                          │                                        │
//!      │                                          └──Sealed (no reply to deliver)───────────────▶ Ended(Finished)
//! ```
//! A restart (and a fresh run its admission could not seed) commits its promotion and seed first:
//! `Starting ──Started(Promote)──▶ Promoting ──Promoted──▶ (step boundary)`. A resume re-attaches its
//! workspace, writes the resumed step's record when its turns landed without it, then decides:
//! `Starting ──Started(Reattach)──▶ Reattaching ──Reattached──▶ [Resuming ──StepWritten──▶] Starting
//! ──Started──▶ …`.
//! A fence (another generation owns the run, or it was killed) ends the run silently from any phase
//! before the reply's record: no answer, no webhook, no record. A hard stop aborts a model call or tool
//! calls in flight and concludes `stopped_hard`; a soft stop concludes at the next step boundary. A
//! write in flight is never aborted: its answer decides.

use storage::ledger::StopMode;
use storage::record::RunStatus;

/// What the run is doing now; at most one effect that touches storage is in flight in each phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// The launch builds the run: re-attachment (resume), or the promotion prepared (restart).
    Starting,
    /// The promotion and its seed are being committed.
    Promoting,
    /// A resume takes its workspace.
    Reattaching,
    /// The resumed step's record (its calls, to run afresh) is being written.
    Resuming,
    /// Between steps: the next [`Msg::Step`] decides (stop, drain, budget, or the model).
    Boundary,
    /// The model is being asked for the next step.
    Calling,
    /// The step's turns, events and record are being written.
    Writing {
        calls: bool,
    },
    /// The inbox is read after a text-only turn.
    Reading,
    /// The follow-ups read after a text-only turn are written as a turn of their own.
    Folding,
    /// The step's tool calls run.
    Tools,
    /// The last results commit at the step boundary and the row goes to the next generation.
    HandingOff,
    /// The finishing gate commits the final status and answer.
    Gating,
    /// Past the gate: the answer is published and the reply delivered.
    Replying,
    /// The final record lands through the ledger's finish (which admits any successor).
    Recording,
    Ended(End),
}

/// How a run ended, as the supervisor is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Finished(RunStatus),
    /// Another generation owns the run, or it was killed: nothing more reached the thread.
    Fenced,
    /// Handed to the next generation at a step boundary (drain).
    HandedOff,
    /// Storage stayed unavailable past the lease: the supervisor re-adopts the row.
    StorageLost,
    /// An effect panicked (the panic was caught at the effect's boundary): the supervisor re-adopts
    /// the row within its restart policy.
    Panicked(String),
}

/// Why the step loop ended (SPEC §5.2 step 6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Answer(String),
    Failed(String),
    /// The budget ran out (SPEC §5.3): the last assistant text, or a failure without one.
    BudgetExhausted,
}

/// A storage write's answer, as the machine needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Ok,
    Fenced,
    /// Unavailable past the lease.
    Lost,
}

/// How a launch went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Seeded by its admission, or re-attached: the loop goes on.
    Continue,
    /// A restart (or a fresh run its admission could not seed): commit the promotion and seed first.
    Promote,
    /// A resume: re-attach the workspace first.
    Reattach,
    /// A resume whose transcript already ends on the answer: finish without a model call.
    Finish(String),
    /// The run cannot go on (an unreadable plan, a missing workspace): conclude `failed`.
    Fail(String),
    /// A resumed step whose calls run now, as the step's tools effect: parked on approvals (wait again,
    /// SPEC §13), or in flight when the earlier owner stopped (settled per call, SPEC §6.2).
    Tools,
    /// Past its finishing gate with this status and answer, the reply not yet sent: gate again (the
    /// committed gate answers as `Ok`), then reply and record.
    Gated {
        status: RunStatus,
        answer: Option<String>,
    },
    Fenced,
    Lost,
    /// The launch closed the row itself (an agent not configured here, an unreadable request, a missing
    /// workspace): the run is over as this says.
    Closed(End),
}

/// How a resume's re-attachment went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reattached {
    /// The workspace is taken (or the run goes on without one); `write` when the resumed step's record
    /// is still to be written (its turns landed without it).
    Took { write: bool },
    /// The ledger names another owner.
    Fenced,
    /// The run cannot go on (a bound workspace that cannot be taken, calls that are not the record's).
    Fail(String),
    /// The bound workspace is missing: the re-attachment closed the row as this says.
    Closed(End),
}

/// What the run is told, by its own effects and from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    Started(Started),
    /// The promotion's commit answered.
    Promoted(Written),
    Reattached(Reattached),
    /// The shell's check at a step boundary: whether the run's deadline has passed.
    Step {
        past_deadline: bool,
    },
    ModelAnswered {
        text: String,
        calls: usize,
    },
    ModelFailed(String),
    StepWritten(Written),
    /// After a text-only turn: the follow-ups read from the inbox (folded into the next turn).
    Inbox {
        unread: usize,
    },
    ToolsDone,
    /// A stop recorded on the row ended the step's wait for approval: none of its calls ran (SPEC §13).
    WaitStopped(StopMode),
    /// Storage stayed unavailable past the lease while the step waited for approval.
    ToolsLost,
    /// The boundary write and `handoff` answered; `false` when refused.
    HandedOff(bool),
    Gate(Written),
    /// The gate of a `completed` run found this stop recorded before it (an `interrupt`, or a stop
    /// whose signal had not reached the run yet): conclude again under it.
    GateStopped(StopMode),
    /// The reply went out (or no webhook is configured); `killed` when the kill check before the
    /// webhook found a deletion fence; `failed` when the webhook did not take it.
    Replied {
        killed: bool,
        failed: bool,
    },
    /// The gate and the final record committed together (no reply to deliver, SPEC §5.2 step 3): the
    /// run is over as a [`Msg::Recorded`] of `Ok` would end it.
    Sealed,
    /// The final record's answer: `Ok` written (with any successor the finish admitted), `Fenced` the
    /// ledger refused the finish (killed meanwhile, or another generation owns the run).
    Recorded(Written),
    /// An effect panicked.
    Panicked(String),
    // From outside.
    Stop(StopMode),
    /// Another generation owns the run, this process handed it off, or it was killed.
    Fenced,
    /// The process drains: hand off at the next step boundary.
    Drain,
}

/// What the shell should do. Effects are data; the shell executes them in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send [`Msg::Step`] to itself with the deadline check.
    NextStep,
    /// Commit the promotion and seed ([`Msg::Promoted`]).
    Promote,
    /// Take the resumed run's workspace ([`Msg::Reattached`]).
    Reattach,
    /// Write the resumed step's record ([`Msg::StepWritten`]).
    WriteResumedStep,
    /// Decide how the resumed step goes on ([`Msg::Started`]).
    Resume,
    /// Fold follow-ups into a pending results turn, ask the model ([`Msg::ModelAnswered`] /
    /// [`Msg::ModelFailed`]).
    CallModel,
    /// Write the step durably ([`Msg::StepWritten`]).
    WriteStep,
    /// Read the inbox after a text-only turn ([`Msg::Inbox`]).
    ReadInbox,
    /// Write the follow-ups read after a text-only turn, with that turn's `assistant` event and their
    /// `input` events, in one commit ([`Msg::StepWritten`]).
    WriteFollowups,
    RunTools,
    /// Drop the effect in flight (a model call or tool calls): hard stop or fence.
    AbortInFlight,
    /// Publish `stop_requested` for this mode (once per mode).
    AnnounceStop(StopMode),
    /// Publish a note (`time_budget_exhausted`).
    Note(&'static str),
    /// Publish `run_failed` with this message.
    PublishFailure(String),
    /// Boundary write and `handoff` ([`Msg::HandedOff`]).
    HandOff,
    /// Flush the run's events, then the finishing gate ([`Msg::Gate`]); a run with no reply to deliver
    /// commits its gate and final record together ([`Msg::Sealed`]) unless the gate refuses.
    Gate {
        status: RunStatus,
        answer: Option<String>,
    },
    /// Publish the answer, deliver the reply ([`Msg::Replied`]).
    Reply {
        status: RunStatus,
        answer: Option<String>,
    },
    /// The final record through the ledger's finish ([`Msg::Recorded`]).
    Record {
        status: RunStatus,
    },
    /// Tell the supervisor; the actor stops.
    End(End),
}

/// The run's control state: what the machine decides from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunState {
    pub phase: Phase,
    /// The strongest stop requested so far.
    pub stop: Option<StopMode>,
    /// Stop modes already announced (`stop_requested` once per mode).
    pub announced: Vec<StopMode>,
    pub fenced: bool,
    pub draining: bool,
    /// The last assistant text (the answer when the budget runs out).
    pub last_text: String,
    /// Whether the last step's model turn had tool calls.
    pub calls: bool,
    /// The status and answer decided when the loop ended.
    pub status: Option<RunStatus>,
    pub answer: Option<String>,
}

impl RunState {
    pub fn starting() -> Self {
        RunState {
            phase: Phase::Starting,
            stop: None,
            announced: Vec::new(),
            fenced: false,
            draining: false,
            last_text: String::new(),
            calls: false,
            status: None,
            answer: None,
        }
    }

    /// Whether an effect is in flight that a hard stop or a fence may drop (a model call or tools).
    fn abortable(&self) -> bool {
        matches!(self.phase, Phase::Calling | Phase::Tools)
    }
}

/// The next state and effects for `msg` in `state`. A message that does not fit the phase (a late
/// completion of an aborted effect, a second fence) changes nothing.
pub fn transition(state: &RunState, msg: &Msg) -> (RunState, Vec<Effect>) {
    let mut s = state.clone();
    let mut fx = Vec::new();
    if matches!(s.phase, Phase::Ended(_)) {
        return (s, fx);
    }
    match (msg, s.phase.clone()) {
        (Msg::Panicked(why), _) => end(&mut s, &mut fx, End::Panicked(why.clone())),
        // ---- from outside ----
        (Msg::Fenced, phase) => {
            s.fenced = true;
            match phase {
                // A write in flight answers for itself (its answer will be `Fenced`).
                Phase::Promoting
                | Phase::Reattaching
                | Phase::Resuming
                | Phase::Writing { .. }
                | Phase::Folding
                | Phase::Gating
                | Phase::HandingOff
                | Phase::Recording => {}
                Phase::Boundary => end(&mut s, &mut fx, End::Fenced),
                _ => {
                    fx.push(Effect::AbortInFlight);
                    end(&mut s, &mut fx, End::Fenced);
                }
            }
        }
        (Msg::Stop(mode), _) => {
            let strongest = storage::ledger::decisions::strongest_stop(s.stop, *mode);
            s.stop = Some(strongest);
            if !s.announced.contains(mode) {
                s.announced.push(*mode);
                fx.push(Effect::AnnounceStop(*mode));
            }
            if strongest == StopMode::Hard && s.abortable() && !s.fenced {
                fx.push(Effect::AbortInFlight);
                conclude(&mut s, &mut fx, None);
            }
        }
        (Msg::Drain, phase) => {
            s.draining = true;
            // A model call is side-effect free and is made again: stop it at once.
            if phase == Phase::Calling && !s.fenced {
                fx.push(Effect::AbortInFlight);
                s.phase = Phase::HandingOff;
                fx.push(Effect::HandOff);
            }
        }

        // ---- the loop ----
        (Msg::Started(started), Phase::Starting) => match started {
            Started::Continue => {
                s.phase = Phase::Boundary;
                fx.push(Effect::NextStep);
            }
            Started::Promote => {
                s.phase = Phase::Promoting;
                fx.push(Effect::Promote);
            }
            Started::Reattach => {
                s.phase = Phase::Reattaching;
                fx.push(Effect::Reattach);
            }
            Started::Finish(text) => conclude(&mut s, &mut fx, Some(Ending::Answer(text.clone()))),
            Started::Fail(why) => conclude(&mut s, &mut fx, Some(Ending::Failed(why.clone()))),
            Started::Tools => {
                s.calls = true;
                s.phase = Phase::Tools;
                fx.push(Effect::RunTools);
            }
            Started::Gated { status, answer } => {
                s.status = Some(*status);
                s.answer = answer.clone();
                s.phase = Phase::Gating;
                fx.push(Effect::Gate {
                    status: *status,
                    answer: answer.clone(),
                });
            }
            Started::Fenced => end(&mut s, &mut fx, End::Fenced),
            Started::Lost => end(&mut s, &mut fx, End::StorageLost),
            Started::Closed(how) => end(&mut s, &mut fx, how.clone()),
        },
        (Msg::Reattached(how), Phase::Reattaching) => match how {
            Reattached::Fenced => end(&mut s, &mut fx, End::Fenced),
            Reattached::Closed(how) => end(&mut s, &mut fx, how.clone()),
            Reattached::Took { .. } if s.fenced => end(&mut s, &mut fx, End::Fenced),
            Reattached::Fail(why) => conclude(&mut s, &mut fx, Some(Ending::Failed(why.clone()))),
            Reattached::Took { write: true } => {
                s.phase = Phase::Resuming;
                fx.push(Effect::WriteResumedStep);
            }
            Reattached::Took { write: false } => {
                s.phase = Phase::Starting;
                fx.push(Effect::Resume);
            }
        },
        (Msg::StepWritten(written), Phase::Resuming) => match written {
            Written::Fenced => end(&mut s, &mut fx, End::Fenced),
            Written::Lost => end(&mut s, &mut fx, End::StorageLost),
            Written::Ok if s.fenced => end(&mut s, &mut fx, End::Fenced),
            Written::Ok => {
                s.phase = Phase::Starting;
                fx.push(Effect::Resume);
            }
        },
        (Msg::Step { past_deadline }, Phase::Boundary) => {
            if s.fenced {
                end(&mut s, &mut fx, End::Fenced);
            } else if s.stop.is_some() {
                conclude(&mut s, &mut fx, None);
            } else if s.draining {
                s.phase = Phase::HandingOff;
                fx.push(Effect::HandOff);
            } else if *past_deadline {
                fx.push(Effect::Note("time_budget_exhausted"));
                conclude(&mut s, &mut fx, Some(Ending::BudgetExhausted));
            } else {
                s.phase = Phase::Calling;
                fx.push(Effect::CallModel);
            }
        }
        (Msg::ModelAnswered { text, calls }, Phase::Calling) => {
            if !text.is_empty() {
                s.last_text = text.clone();
            }
            s.calls = *calls > 0;
            s.phase = Phase::Writing { calls: s.calls };
            fx.push(Effect::WriteStep);
        }
        (Msg::ModelFailed(why), Phase::Calling) => {
            conclude(&mut s, &mut fx, Some(Ending::Failed(why.clone())))
        }
        (Msg::StepWritten(written), Phase::Writing { calls }) => match written {
            Written::Fenced => end(&mut s, &mut fx, End::Fenced),
            Written::Lost => end(&mut s, &mut fx, End::StorageLost),
            Written::Ok if s.fenced => end(&mut s, &mut fx, End::Fenced),
            // A hard stop that came while the step was written: its tools never start.
            Written::Ok if calls && s.stop == Some(StopMode::Hard) => {
                conclude(&mut s, &mut fx, None)
            }
            Written::Ok if calls => {
                s.phase = Phase::Tools;
                fx.push(Effect::RunTools);
            }
            Written::Ok => {
                // The model answered: read the inbox first; unread follow-ups become a turn.
                s.phase = Phase::Reading;
                fx.push(Effect::ReadInbox);
            }
        },
        (Msg::Inbox { unread }, Phase::Reading) => {
            if *unread > 0 {
                s.phase = Phase::Folding;
                fx.push(Effect::WriteFollowups);
            } else {
                let text = s.last_text.clone();
                conclude(&mut s, &mut fx, Some(Ending::Answer(text)));
            }
        }
        // The promotion, or the follow-ups folded after a text-only turn, committed: the next step.
        (Msg::Promoted(written), Phase::Promoting)
        | (Msg::StepWritten(written), Phase::Folding) => match written {
            Written::Fenced => end(&mut s, &mut fx, End::Fenced),
            Written::Lost => end(&mut s, &mut fx, End::StorageLost),
            Written::Ok if s.fenced => end(&mut s, &mut fx, End::Fenced),
            Written::Ok => {
                s.phase = Phase::Boundary;
                fx.push(Effect::NextStep);
            }
        },
        (Msg::ToolsDone, Phase::Tools) => {
            s.phase = Phase::Boundary;
            fx.push(Effect::NextStep);
        }
        (Msg::WaitStopped(mode), Phase::Tools) => {
            s.stop = Some(storage::ledger::decisions::strongest_stop(s.stop, *mode));
            if !s.announced.contains(mode) {
                s.announced.push(*mode);
                fx.push(Effect::AnnounceStop(*mode));
            }
            conclude(&mut s, &mut fx, None);
        }
        (Msg::ToolsLost, Phase::Tools) => end(&mut s, &mut fx, End::StorageLost),
        (Msg::HandedOff(ok), Phase::HandingOff) => {
            end(
                &mut s,
                &mut fx,
                if *ok { End::HandedOff } else { End::Fenced },
            );
        }

        // ---- finishing ----
        (Msg::Gate(written), Phase::Gating) => match written {
            Written::Ok if !s.fenced => {
                s.phase = Phase::Replying;
                let status = s.status.expect("a gate follows a conclusion");
                fx.push(Effect::Reply {
                    status,
                    answer: s.answer.clone(),
                });
            }
            Written::Ok | Written::Fenced => end(&mut s, &mut fx, End::Fenced),
            Written::Lost => end(&mut s, &mut fx, End::StorageLost),
        },
        (Msg::GateStopped(mode), Phase::Gating) if !s.fenced => {
            s.stop = Some(storage::ledger::decisions::strongest_stop(s.stop, *mode));
            if !s.announced.contains(mode) {
                s.announced.push(*mode);
                fx.push(Effect::AnnounceStop(*mode));
            }
            let ending = s.answer.take().map(Ending::Answer);
            conclude(&mut s, &mut fx, ending);
        }
        (Msg::GateStopped(_), Phase::Gating) => end(&mut s, &mut fx, End::Fenced),
        (Msg::Replied { killed, failed }, Phase::Replying) => {
            if *killed || s.fenced {
                end(&mut s, &mut fx, End::Fenced);
            } else {
                let mut status = s.status.expect("a reply follows a conclusion");
                // A failed reply flips only `completed` to `failed` (SPEC §5.2 step 7).
                if *failed && status == RunStatus::Completed {
                    status = RunStatus::Failed;
                    s.status = Some(status);
                }
                s.phase = Phase::Recording;
                fx.push(Effect::Record { status });
            }
        }
        (Msg::Recorded(written), Phase::Recording) => {
            let status = s.status.expect("a record follows a conclusion");
            // A fence that came while the record was written: the ledger refused the finish.
            let how = match written {
                Written::Ok if !s.fenced => End::Finished(status),
                Written::Ok | Written::Fenced => End::Fenced,
                Written::Lost => End::StorageLost,
            };
            end(&mut s, &mut fx, how);
        }
        (Msg::Sealed, Phase::Gating) => {
            let status = s.status.expect("a seal follows a conclusion");
            let how = match s.fenced {
                false => End::Finished(status),
                true => End::Fenced,
            };
            end(&mut s, &mut fx, how);
        }
        // Anything else does not fit the phase: a late completion of an aborted effect.
        _ => {}
    }
    (s, fx)
}

/// The loop ended: decide the final status and answer once (SPEC §5.2 step 6) and go to the gate.
/// `ending` is `None` when a stop ended the loop.
fn conclude(s: &mut RunState, fx: &mut Vec<Effect>, ending: Option<Ending>) {
    let (status, answer) = match (ending, s.stop) {
        (Some(Ending::Failed(why)), _) => {
            fx.push(Effect::PublishFailure(why));
            (RunStatus::Failed, None)
        }
        (Some(Ending::BudgetExhausted), stop) if s.last_text.is_empty() => {
            let _ = stop;
            fx.push(Effect::PublishFailure(
                "time budget exhausted before an answer".into(),
            ));
            (RunStatus::Failed, None)
        }
        (_, Some(StopMode::Hard)) => (RunStatus::StoppedHard, None),
        (None, Some(StopMode::Soft)) => (RunStatus::StoppedSoft, None),
        (None, None) => (RunStatus::StoppedHard, None),
        (Some(Ending::Answer(text)), Some(StopMode::Soft)) => (RunStatus::StoppedSoft, Some(text)),
        (Some(Ending::BudgetExhausted), Some(StopMode::Soft)) => {
            (RunStatus::StoppedSoft, Some(s.last_text.clone()))
        }
        (Some(Ending::Answer(text)), None) => (RunStatus::Completed, Some(text)),
        (Some(Ending::BudgetExhausted), None) => (RunStatus::Completed, Some(s.last_text.clone())),
    };
    s.status = Some(status);
    s.answer = answer.clone();
    s.phase = Phase::Gating;
    fx.push(Effect::Gate { status, answer });
}

fn end(s: &mut RunState, fx: &mut Vec<Effect>, how: End) {
    s.phase = Phase::Ended(how.clone());
    fx.push(Effect::End(how));
}

#[cfg(test)]
mod tests {
    use super::*;
    use Effect as E;

    fn at(phase: Phase) -> RunState {
        RunState {
            phase,
            ..RunState::starting()
        }
    }

    fn with(phase: Phase, f: impl FnOnce(&mut RunState)) -> RunState {
        let mut s = at(phase);
        f(&mut s);
        s
    }

    fn gate(status: RunStatus, answer: Option<&str>) -> Effect {
        E::Gate {
            status,
            answer: answer.map(str::to_owned),
        }
    }

    /// One row per (phase, message) pair that matters: the effects and the phase after.
    #[test]
    fn transition_table() {
        use Phase as P;
        use RunStatus as S;
        let hard = Msg::Stop(StopMode::Hard);
        let soft = Msg::Stop(StopMode::Soft);
        let answered = with(P::Replying, |s| {
            s.status = Some(S::Completed);
            s.answer = Some("done".into());
        });
        let gating = with(P::Gating, |s| {
            s.status = Some(S::Completed);
            s.answer = Some("done".into());
        });
        let recording = with(P::Recording, |s| s.status = Some(S::Completed));
        let texted = with(P::Reading, |s| s.last_text = "hello".into());
        #[rustfmt::skip]
        let table: Vec<(&str, RunState, Msg, Vec<Effect>, Phase)> = vec![
            // launch
            ("started goes to the first step",          at(P::Starting), Msg::Started(Started::Continue), vec![E::NextStep], P::Boundary),
            ("a finish plan skips the model",           at(P::Starting), Msg::Started(Started::Finish("a".into())), vec![gate(S::Completed, Some("a"))], P::Gating),
            ("a failed launch fails the run",           at(P::Starting), Msg::Started(Started::Fail("no workspace".into())), vec![E::PublishFailure("no workspace".into()), gate(S::Failed, None)], P::Gating),
            ("a resumed step runs its calls",           at(P::Starting), Msg::Started(Started::Tools), vec![E::RunTools], P::Tools),
            ("a gated row continues at its gate",       at(P::Starting), Msg::Started(Started::Gated { status: S::StoppedSoft, answer: Some("a".into()) }), vec![gate(S::StoppedSoft, Some("a"))], P::Gating),
            ("a fenced launch ends silently",           at(P::Starting), Msg::Started(Started::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a launch without storage is lost",        at(P::Starting), Msg::Started(Started::Lost), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a launch that closed its row ends so",    at(P::Starting), Msg::Started(Started::Closed(End::Finished(S::Interrupted))), vec![E::End(End::Finished(S::Interrupted))], P::Ended(End::Finished(S::Interrupted))),
            ("a launch that could not close is lost",   at(P::Starting), Msg::Started(Started::Closed(End::StorageLost)), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a panicking launch ends panicked",        at(P::Starting), Msg::Panicked("boom".into()), vec![E::End(End::Panicked("boom".into()))], P::Ended(End::Panicked("boom".into()))),
            ("a restart commits its promotion first",   at(P::Starting), Msg::Started(Started::Promote), vec![E::Promote], P::Promoting),
            ("promoted: the first step",                at(P::Promoting), Msg::Promoted(Written::Ok), vec![E::NextStep], P::Boundary),
            ("a fenced promotion ends silently",        at(P::Promoting), Msg::Promoted(Written::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a promotion without storage is lost",     at(P::Promoting), Msg::Promoted(Written::Lost), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a fence waits for the promotion",         at(P::Promoting), Msg::Fenced, vec![], P::Promoting),
            ("promoted after a fence ends silently",    with(P::Promoting, |s| s.fenced = true), Msg::Promoted(Written::Ok), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a resume re-attaches its workspace first", at(P::Starting), Msg::Started(Started::Reattach), vec![E::Reattach], P::Reattaching),
            ("re-attached: the resume decides",         at(P::Reattaching), Msg::Reattached(Reattached::Took { write: false }), vec![E::Resume], P::Starting),
            ("re-attached: the fresh step's record",    at(P::Reattaching), Msg::Reattached(Reattached::Took { write: true }), vec![E::WriteResumedStep], P::Resuming),
            ("a workspace another owner holds: fenced", at(P::Reattaching), Msg::Reattached(Reattached::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a workspace not taken fails the run",     at(P::Reattaching), Msg::Reattached(Reattached::Fail("busy".into())), vec![E::PublishFailure("busy".into()), gate(S::Failed, None)], P::Gating),
            ("a missing workspace closed the row",      at(P::Reattaching), Msg::Reattached(Reattached::Closed(End::Finished(S::Interrupted))), vec![E::End(End::Finished(S::Interrupted))], P::Ended(End::Finished(S::Interrupted))),
            ("a fence waits for the re-attachment",     at(P::Reattaching), Msg::Fenced, vec![], P::Reattaching),
            ("re-attached after a fence ends silently", with(P::Reattaching, |s| s.fenced = true), Msg::Reattached(Reattached::Took { write: true }), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a hard stop waits for the re-attachment", at(P::Reattaching), Msg::Stop(StopMode::Hard), vec![E::AnnounceStop(StopMode::Hard)], P::Reattaching),
            ("the resumed step written: decide",        at(P::Resuming), Msg::StepWritten(Written::Ok), vec![E::Resume], P::Starting),
            ("a fenced resumed step ends silently",     at(P::Resuming), Msg::StepWritten(Written::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a resumed step without storage is lost",  at(P::Resuming), Msg::StepWritten(Written::Lost), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a fence waits for the resumed step",      at(P::Resuming), Msg::Fenced, vec![], P::Resuming),
            ("written after a fence ends silently",     with(P::Resuming, |s| s.fenced = true), Msg::StepWritten(Written::Ok), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a decision after a fence is dropped",     with(P::Starting, |s| s.fenced = true), Msg::Fenced, vec![E::AbortInFlight, E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a hard stop waits for the promotion",     at(P::Promoting), Msg::Stop(StopMode::Hard), vec![E::AnnounceStop(StopMode::Hard)], P::Promoting),
            ("a panic in the tools ends panicked",      at(P::Tools), Msg::Panicked("boom".into()), vec![E::End(End::Panicked("boom".into()))], P::Ended(End::Panicked("boom".into()))),
            ("a panic while finishing ends panicked",   at(P::Recording), Msg::Panicked("boom".into()), vec![E::End(End::Panicked("boom".into()))], P::Ended(End::Panicked("boom".into()))),
            // step boundary
            ("a step calls the model",                  at(P::Boundary), Msg::Step { past_deadline: false }, vec![E::CallModel], P::Calling),
            ("budget exhausted with text completes",    with(P::Boundary, |s| s.last_text = "so far".into()), Msg::Step { past_deadline: true }, vec![E::Note("time_budget_exhausted"), gate(S::Completed, Some("so far"))], P::Gating),
            ("budget exhausted without text fails",     at(P::Boundary), Msg::Step { past_deadline: true }, vec![E::Note("time_budget_exhausted"), E::PublishFailure("time budget exhausted before an answer".into()), gate(S::Failed, None)], P::Gating),
            ("a soft stop ends at the boundary",        with(P::Boundary, |s| s.stop = Some(StopMode::Soft)), Msg::Step { past_deadline: false }, vec![gate(S::StoppedSoft, None)], P::Gating),
            ("a drain hands off at the boundary",       with(P::Boundary, |s| s.draining = true), Msg::Step { past_deadline: false }, vec![E::HandOff], P::HandingOff),
            ("a fence at the boundary ends silently",   with(P::Boundary, |s| s.fenced = true), Msg::Step { past_deadline: false }, vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            // the model
            ("tool calls are written first",            at(P::Calling), Msg::ModelAnswered { text: "t".into(), calls: 2 }, vec![E::WriteStep], P::Writing { calls: true }),
            ("a text turn is written first",            at(P::Calling), Msg::ModelAnswered { text: "t".into(), calls: 0 }, vec![E::WriteStep], P::Writing { calls: false }),
            ("a model failure fails the run",           at(P::Calling), Msg::ModelFailed("http 400".into()), vec![E::PublishFailure("http 400".into()), gate(S::Failed, None)], P::Gating),
            // the step write
            ("a written step runs its tools",           at(P::Writing { calls: true }), Msg::StepWritten(Written::Ok), vec![E::RunTools], P::Tools),
            ("a written text turn reads the inbox",     at(P::Writing { calls: false }), Msg::StepWritten(Written::Ok), vec![E::ReadInbox], P::Reading),
            ("a fenced step write ends silently",       at(P::Writing { calls: true }), Msg::StepWritten(Written::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a lost step write ends storage-lost",     at(P::Writing { calls: true }), Msg::StepWritten(Written::Lost), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("follow-ups after an answer are written",  texted.clone(), Msg::Inbox { unread: 2 }, vec![E::WriteFollowups], P::Folding),
            ("written follow-ups go on",                at(P::Folding), Msg::StepWritten(Written::Ok), vec![E::NextStep], P::Boundary),
            ("a fenced follow-up write ends silently",  at(P::Folding), Msg::StepWritten(Written::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a lost follow-up write ends storage-lost", at(P::Folding), Msg::StepWritten(Written::Lost), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a fence waits for the follow-up write",   at(P::Folding), Msg::Fenced, vec![], P::Folding),
            ("a hard stop waits for the follow-up write", at(P::Folding), Msg::Stop(StopMode::Hard), vec![E::AnnounceStop(StopMode::Hard)], P::Folding),
            ("no follow-ups: the answer concludes",     texted, Msg::Inbox { unread: 0 }, vec![gate(S::Completed, Some("hello"))], P::Gating),
            // tools
            ("tools done: the next step",               at(P::Tools), Msg::ToolsDone, vec![E::NextStep], P::Boundary),
            ("a hard stop aborts tools",                at(P::Tools), hard.clone(), vec![E::AnnounceStop(StopMode::Hard), E::AbortInFlight, gate(S::StoppedHard, None)], P::Gating),
            ("a hard stop aborts the model call",       at(P::Calling), hard.clone(), vec![E::AnnounceStop(StopMode::Hard), E::AbortInFlight, gate(S::StoppedHard, None)], P::Gating),
            ("a stop ends a wait for approval",         at(P::Tools), Msg::WaitStopped(StopMode::Soft), vec![E::AnnounceStop(StopMode::Soft), gate(S::StoppedSoft, None)], P::Gating),
            ("an announced stop ends a wait once",      with(P::Tools, |s| { s.stop = Some(StopMode::Hard); s.announced = vec![StopMode::Hard]; }), Msg::WaitStopped(StopMode::Hard), vec![gate(S::StoppedHard, None)], P::Gating),
            ("storage lost while waiting for approval", at(P::Tools), Msg::ToolsLost, vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a soft stop lets tools finish",           at(P::Tools), soft.clone(), vec![E::AnnounceStop(StopMode::Soft)], P::Tools),
            ("a hard stop waits for a write",           at(P::Writing { calls: true }), hard.clone(), vec![E::AnnounceStop(StopMode::Hard)], P::Writing { calls: true }),
            ("a written step under a hard stop runs no tools", with(P::Writing { calls: true }, |s| s.stop = Some(StopMode::Hard)), Msg::StepWritten(Written::Ok), vec![gate(S::StoppedHard, None)], P::Gating),
            ("a record refused under a fence is silent", with(P::Recording, |s| { s.status = Some(S::Completed); s.fenced = true; }), Msg::Recorded(Written::Ok), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a repeated stop is announced once",       with(P::Tools, |s| { s.stop = Some(StopMode::Soft); s.announced = vec![StopMode::Soft]; }), soft.clone(), vec![], P::Tools),
            ("a fence aborts tools",                    at(P::Tools), Msg::Fenced, vec![E::AbortInFlight, E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a fence aborts a launch",                 at(P::Starting), Msg::Fenced, vec![E::AbortInFlight, E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a fence between steps ends silently",     at(P::Boundary), Msg::Fenced, vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a hard stop between steps concludes next",at(P::Boundary), hard.clone(), vec![E::AnnounceStop(StopMode::Hard)], P::Boundary),
            ("a hard stop then the step",               with(P::Boundary, |s| s.stop = Some(StopMode::Hard)), Msg::Step { past_deadline: false }, vec![gate(S::StoppedHard, None)], P::Gating),
            ("a hard stop lets a launch finish",        at(P::Starting), hard.clone(), vec![E::AnnounceStop(StopMode::Hard)], P::Starting),
            ("a drain during the inbox read",           at(P::Reading), Msg::Drain, vec![], P::Reading),
            ("a fence waits for a write",               at(P::Writing { calls: false }), Msg::Fenced, vec![], P::Writing { calls: false }),
            ("a write that landed under a fence ends",  with(P::Writing { calls: true }, |s| s.fenced = true), Msg::StepWritten(Written::Ok), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a drain stops the model call",            at(P::Calling), Msg::Drain, vec![E::AbortInFlight, E::HandOff], P::HandingOff),
            ("a drain lets tools finish",               at(P::Tools), Msg::Drain, vec![], P::Tools),
            ("handed off",                              at(P::HandingOff), Msg::HandedOff(true), vec![E::End(End::HandedOff)], P::Ended(End::HandedOff)),
            ("a refused handoff is a fence",            at(P::HandingOff), Msg::HandedOff(false), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            // the finishing gate
            ("gate open: reply",                        gating.clone(), Msg::Gate(Written::Ok), vec![E::Reply { status: S::Completed, answer: Some("done".into()) }], P::Replying),
            ("gate fenced: silence",                    gating.clone(), Msg::Gate(Written::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("gate unavailable past the lease",         gating.clone(), Msg::Gate(Written::Lost), vec![E::End(End::StorageLost)], P::Ended(End::StorageLost)),
            ("a stop recorded before the gate concludes again", gating.clone(), Msg::GateStopped(StopMode::Soft), vec![E::AnnounceStop(StopMode::Soft), gate(S::StoppedSoft, Some("done"))], P::Gating),
            ("a hard stop recorded before the gate",    gating.clone(), Msg::GateStopped(StopMode::Hard), vec![E::AnnounceStop(StopMode::Hard), gate(S::StoppedHard, None)], P::Gating),
            ("a stop at the gate of a fenced run: silence", with(P::Gating, |s| { s.fenced = true; s.status = Some(S::Completed); }), Msg::GateStopped(StopMode::Soft), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a stop while finishing changes nothing",  gating.clone(), hard.clone(), vec![E::AnnounceStop(StopMode::Hard)], P::Gating),
            ("a fence while gating waits for the gate", gating.clone(), Msg::Fenced, vec![], P::Gating),
            ("sealed: gate and record in one commit",   gating.clone(), Msg::Sealed, vec![E::End(End::Finished(S::Completed))], P::Ended(End::Finished(S::Completed))),
            ("a seal under a fence is silent",          with(P::Gating, |s| { s.fenced = true; s.status = Some(S::Completed); }), Msg::Sealed, vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a seal after the gate changes nothing",   answered.clone(), Msg::Sealed, vec![], P::Replying),
            ("a drain while finishing finishes",        gating, Msg::Drain, vec![], P::Gating),
            // past the gate
            ("a kill after the gate: no webhook",       answered.clone(), Msg::Fenced, vec![E::AbortInFlight, E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("the kill check before the webhook",       answered.clone(), Msg::Replied { killed: true, failed: false }, vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("replied: the record",                     answered.clone(), Msg::Replied { killed: false, failed: false }, vec![E::Record { status: S::Completed }], P::Recording),
            ("a failed reply fails a completed run",    answered, Msg::Replied { killed: false, failed: true }, vec![E::Record { status: S::Failed }], P::Recording),
            ("recorded: finished",                      recording.clone(), Msg::Recorded(Written::Ok), vec![E::End(End::Finished(S::Completed))], P::Ended(End::Finished(S::Completed))),
            ("a finish the ledger refused ends fenced", recording.clone(), Msg::Recorded(Written::Fenced), vec![E::End(End::Fenced)], P::Ended(End::Fenced)),
            ("a panic after the end changes nothing",   at(P::Ended(End::Fenced)), Msg::Panicked("late".into()), vec![], P::Ended(End::Fenced)),
            ("follow-ups arriving while finishing wait for the successor", recording, Msg::Inbox { unread: 3 }, vec![], P::Recording),
            // late completions of aborted effects
            ("a late model answer after a hard stop",   at(P::Gating), Msg::ModelAnswered { text: "x".into(), calls: 1 }, vec![], P::Gating),
            ("a late tools-done after a fence",         at(P::Ended(End::Fenced)), Msg::ToolsDone, vec![], P::Ended(End::Fenced)),
        ];
        for (name, state, msg, want_fx, want_phase) in table {
            let (next, fx) = transition(&state, &msg);
            assert_eq!(fx, want_fx, "{name}: effects");
            assert_eq!(next.phase, want_phase, "{name}: phase");
        }
    }

    #[test]
    fn a_soft_stop_then_the_answer_keeps_the_answer_as_stopped_soft() {
        let s = with(Phase::Reading, |s| {
            s.stop = Some(StopMode::Soft);
            s.last_text = "partial".into();
        });
        let (next, fx) = transition(&s, &Msg::Inbox { unread: 0 });
        assert_eq!(fx, vec![gate(RunStatus::StoppedSoft, Some("partial"))]);
        assert_eq!(
            (next.status, next.answer.as_deref()),
            (Some(RunStatus::StoppedSoft), Some("partial"))
        );
    }

    #[test]
    fn a_whole_run_walks_the_machine_to_its_record() {
        let mut s = RunState::starting();
        let script = [
            Msg::Started(Started::Continue),
            Msg::Step {
                past_deadline: false,
            },
            Msg::ModelAnswered {
                text: String::new(),
                calls: 1,
            },
            Msg::StepWritten(Written::Ok),
            Msg::ToolsDone,
            Msg::Step {
                past_deadline: false,
            },
            Msg::ModelAnswered {
                text: "done".into(),
                calls: 0,
            },
            Msg::StepWritten(Written::Ok),
            Msg::Inbox { unread: 0 },
            Msg::Gate(Written::Ok),
            Msg::Replied {
                killed: false,
                failed: false,
            },
            Msg::Recorded(Written::Ok),
        ];
        let mut all = Vec::new();
        for m in &script {
            let (next, fx) = transition(&s, m);
            s = next;
            all.extend(fx);
        }
        assert_eq!(s.phase, Phase::Ended(End::Finished(RunStatus::Completed)));
        assert_eq!(
            all.last(),
            Some(&Effect::End(End::Finished(RunStatus::Completed)))
        );
        assert_eq!(
            all.iter()
                .filter(|e| matches!(e, Effect::WriteStep))
                .count(),
            2
        );
    }
}
