//! What each effect's answer tells the run: [`Done`] carries an effect's [`Completion`]; the actor
//! folds its data into the run ([`Run`]) and hands the machine the [`Msg`] it means.

use actix::{Context, Handler};

use super::machine::{self, End, Msg, Written};
use super::{
    approval, launch, Completion, Delivery, Done, Launched, RunActor, RunStatus, StopReason,
};
use crate::agent;

impl Handler<Done> for RunActor {
    type Result = ();

    fn handle(&mut self, done: Done, ctx: &mut Context<Self>) {
        if !self.answered(done.epoch) {
            return;
        }
        let msg = match done.what {
            Completion::Panicked(what) => Msg::Panicked(what),
            Completion::Launched(Launched::Over(ended)) => {
                let (reason, successor) = *ended;
                self.successor = successor;
                Msg::Started(machine::Started::Closed(end_of(reason)))
            }
            Completion::Launched(Launched::Run(run, started)) => {
                self.state.last_text = run.last_text();
                if let Some(mode) = run.recorded_stop {
                    // Committed and announced by an earlier incarnation: it decides from the first step.
                    self.deps.registry.set_stop(&self.id, mode);
                    self.state.stop = Some(mode);
                    self.state.announced.push(mode);
                }
                if !matches!(started, machine::Started::Fenced) {
                    run.open_card();
                }
                self.run = Some(run);
                Msg::Started(started)
            }
            Completion::Reattached(took) => Msg::Reattached(match took {
                launch::Reattach::Took => {
                    let run = self.run();
                    let took = run.reattached();
                    self.state.last_text = self.run().last_text();
                    took
                }
                launch::Reattach::NotOwner => machine::Reattached::Fenced,
                launch::Reattach::Failed(why) => machine::Reattached::Fail(why),
                launch::Reattach::Closed(ended) => {
                    let (reason, successor) = *ended;
                    self.successor = successor;
                    machine::Reattached::Closed(end_of(reason))
                }
            }),
            Completion::Resumed(started) => Msg::Started(started),
            Completion::Promoted { answer, seeded } => {
                let run = self.run();
                let written = run.settle("promotion", answer);
                if seeded && written == Written::Ok {
                    run.deps.metrics.steps.inc(); // the seed's step record
                }
                Msg::Promoted(written)
            }
            Completion::ModelDone { items, reply, ms } => {
                let run = self.run();
                run.fold(items);
                run.step += 1;
                run.iteration += 1;
                run.model_ms += ms;
                run.model_calls += 1;
                match reply {
                    Ok(turn) => {
                        if let Some(usage) = turn.usage {
                            let model = run.agent.agent.model().to_owned();
                            run.deps.metrics.tokens(
                                &run.meta.agent,
                                &model,
                                usage.input_tokens,
                                usage.output_tokens,
                            );
                            *run.usage.entry(model).or_default() += usage;
                        }
                        let msg = Msg::ModelAnswered {
                            text: turn.text.clone(),
                            calls: turn.calls.len(),
                        };
                        run.current = Some(turn);
                        msg
                    }
                    Err(why) => Msg::ModelFailed(why),
                }
            }
            Completion::StepWritten(answer) => {
                let run = self.run();
                Msg::StepWritten(run.settle("step record", answer))
            }
            Completion::InboxRead(items) => {
                let run = self.run();
                let unread = items.len();
                if unread > 0 {
                    // The answer turn is not the end: show it, then the follow-ups become a turn, written
                    // at once with both events ([`machine::Effect::WriteFollowups`]).
                    let event = run.assistant_event();
                    run.publish_in_step(event);
                    run.fold(items);
                }
                Msg::Inbox { unread }
            }
            Completion::ToolsDone(ran) => {
                match ran.gate {
                    None => {}
                    // The wait for approvals ended the step: nothing of it ran.
                    Some(approval::Passed::Stopped(mode)) => {
                        self.run()
                            .not_run("not run: the run was stopped while awaiting approval");
                        return self.apply(Msg::WaitStopped(mode), ctx);
                    }
                    Some(approval::Passed::Fenced) => return self.apply(Msg::Fenced, ctx),
                    Some(approval::Passed::Lost) => return self.apply(Msg::ToolsLost, ctx),
                    Some(approval::Passed::Decided(_)) => {}
                }
                let run = self.run();
                for event in ran.events {
                    run.keep(event);
                }
                run.tool_ms += ran.ms;
                run.tool_calls += ran.results.len() as u64;
                run.pending = Some(agent::results_turn(&ran.results, &[]));
                run.current = None;
                Msg::ToolsDone
            }
            Completion::HandedOff(ok) => Msg::HandedOff(ok),
            Completion::Replied(Delivery::Killed) => Msg::Replied {
                killed: true,
                failed: false,
            },
            Completion::Replied(Delivery::Sent(reply)) => {
                let failed = reply.as_ref().is_some_and(|(ok, _)| !ok);
                self.run().reply = reply;
                Msg::Replied {
                    killed: false,
                    failed,
                }
            }
        };
        self.apply(msg, ctx);
    }
}

/// The machine's ending for a launch that closed its row with `reason`.
fn end_of(reason: StopReason) -> End {
    match reason {
        StopReason::Finished(status) => End::Finished(status),
        StopReason::Fenced => End::Fenced,
        StopReason::HandedOff => End::HandedOff,
        StopReason::StorageLost => End::StorageLost,
        StopReason::HardStopped => End::Finished(RunStatus::StoppedHard),
        StopReason::Panicked(what) => End::Panicked(what),
    }
}
