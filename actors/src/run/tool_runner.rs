//! [`ToolRunner`]: one step's tool calls as an effect of their own — each under its workspace claim, the
//! agent's allowlist and the dispatch rule for untracked runs, its `tool_result` published as it ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use storage::ledger::decisions::{self, Settlement};
use storage::record::RunEvent;

use super::publish;
use super::work::{summarize, Run};
use super::RunDeps;
use crate::agent::{ToolCall, ToolResult};
use crate::tools::ToolContext;

/// What a tool call needs, owned, so the calls can run as an effect of their own.
pub(super) struct ToolRunner {
    deps: RunDeps,
    id: storage::RunId,
    fence: String,
    workspace: PathBuf,
    step: u64,
    tracked: bool,
    /// The agent's allowlist: a call to another tool gets "not available" (SPEC §8.3).
    allowed: Option<Vec<String>>,
}

impl ToolRunner {
    pub(super) fn of(run: &Run) -> Self {
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

    /// A call a person denied (or that timed out): never run; its result is `{denied: true, note}` so the
    /// model sees it (SPEC §13).
    pub(super) fn denied(
        &self,
        call: &ToolCall,
        decided: &storage::ledger::Decided,
    ) -> (ToolResult, Option<Value>) {
        let output = super::approval::denied_output(decided);
        self.answered_unrun(call, output, None, Some(true))
    }

    /// Run one call under its workspace claim (SPEC §10): a mutating call holds the worktree for writing,
    /// a side-effect-free one for reading, until the call and any work of it that outlives a dropped
    /// future have ended ([`ToolContext::claim`]). An unknown tool answers "not available".
    /// Its `tool_call` event was published with the step; answers the result and its published
    /// `tool_result` event.
    pub(super) async fn call(&self, call: &ToolCall) -> (ToolResult, Option<Value>) {
        use crate::operations::{AppId, Claim, Operation, Resource};
        let allowed = self.allowed.as_ref().is_none_or(|a| a.contains(&call.tool));
        let started = Instant::now();
        let tool = self.deps.tools.entry(&call.tool).filter(|_| allowed);
        // The label is a configured tool's name, never a name a model made up.
        let label = if tool.is_some() {
            call.tool.as_str()
        } else {
            "not_available"
        };
        let output = match tool {
            Some((_, def)) if !decisions::dispatchable(self.tracked, def.side_effect_free) => {
                crate::tools::ToolOutput::err(decisions::UNRECORDED_TEXT)
            }
            Some((tool, def)) => {
                let claim = if def.side_effect_free {
                    Claim::read(Resource::RepositoryWorktree)
                } else {
                    Claim::write(Resource::RepositoryWorktree)
                };
                let app = AppId::new(self.id.clone());
                let operation = Operation::new(call.tool.clone());
                match self.deps.operations.acquire(&app, operation, claim).await {
                    Ok(guard) => {
                        let guard = Arc::new(guard);
                        let ctx = ToolContext {
                            run_id: self.id.clone(),
                            workspace: self.workspace.clone(),
                            gen: self.fence.clone(),
                            claim: Some(guard.clone()),
                        };
                        guard
                            .scope(tool.call_keyed(&ctx, &call.call_id, &call.args))
                            .await
                    }
                    Err(e) => crate::tools::ToolOutput::err(format!("refused: {e}")),
                }
            }
            None => crate::tools::ToolOutput::err(decisions::NOT_AVAILABLE_TEXT),
        };
        self.deps.metrics.tool_call(label, started.elapsed());
        let event = publish(
            &self.deps,
            &self.id,
            RunEvent::tool_result(
                &call.call_id,
                &call.tool,
                output.ok,
                summarize(&self.deps, &output.output),
                self.step,
            ),
            self.tracked,
        );
        (
            ToolResult {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                ok: output.ok,
                output: output.output,
            },
            event,
        )
    }

    /// A resumed call answered without running (SPEC §6.2): viewers see its effects are unknown when
    /// they are, and the model gets `text` as its failed result.
    pub(super) fn settled(
        &self,
        call: &ToolCall,
        how: Settlement,
        text: &str,
    ) -> (ToolResult, Option<Value>) {
        let effects_unknown = (how == Settlement::EffectsUnknown).then_some(true);
        self.answered_unrun(call, text.to_owned(), effects_unknown, None)
    }

    /// A call's failed result `output` without running it, and its published `tool_result` (with the
    /// flags that say why).
    fn answered_unrun(
        &self,
        call: &ToolCall,
        output: String,
        effects_unknown: Option<bool>,
        denied: Option<bool>,
    ) -> (ToolResult, Option<Value>) {
        let event = publish(
            &self.deps,
            &self.id,
            RunEvent::ToolResult {
                stamp: Default::default(),
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                ok: false,
                summary: summarize(&self.deps, &output),
                step: self.step,
                effects_unknown,
                denied,
                not_run: None,
            },
            self.tracked,
        );
        (
            ToolResult {
                call_id: call.call_id.clone(),
                tool: call.tool.clone(),
                ok: false,
                output,
            },
            event,
        )
    }
}
