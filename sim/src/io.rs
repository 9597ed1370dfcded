//! The I/O of the production shell that is not storage, as the world sees it: every model call and every
//! tool call of a simulated process waits as a pending [`Op`] until the world completes it (then the call
//! answers) or never does (its process crashed). Storage calls wait the same way, as jobs on each
//! process's detached mailbox (see `world`).
//!
//! [`SimAgent`] answers with [`crate::agent::next`] (a function of the transcript); [`SimTool`] is one of
//! the three fake tools (`mut`, `pure`, `idem`): once the world completes its call the effect lands —
//! `mut` as a mutating workspace tool does, inside the production workspace fence
//! ([`actors::tools::with_fence`]) — and is recorded with the caller's fence token for the world to check.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actors::agent::{Agent, AgentError, AssistantTurn, Conversation, ToolDef};
use actors::tools::{Tool, ToolContext, ToolOutput};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::Value;

/// Which incarnation of which process slot an operation belongs to.
pub type Inc = u64;

/// What a pending operation is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Model,
    Tool {
        run_id: String,
        call_id: String,
        tool: String,
        gen: String,
    },
}

/// A call of the production shell waiting for the world.
pub struct Op {
    pub inc: Inc,
    pub kind: OpKind,
    /// `true`: the call goes through; `false`: it fails (a transient model error).
    pub done: tokio::sync::oneshot::Sender<bool>,
}

/// A tool effect as it landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub run_id: String,
    pub call_id: String,
    pub tool: String,
    /// The caller's fence token (its generation and actor nonce).
    pub gen: String,
    pub workspace: std::path::PathBuf,
}

/// The world's side of every process's model and tool calls.
#[derive(Default)]
pub struct Io {
    state: Mutex<IoState>,
}

#[derive(Default)]
struct IoState {
    next: u64,
    ops: BTreeMap<u64, Op>,
    /// Landed and not yet checked by the world.
    landed: Vec<Effect>,
    effects: Vec<Effect>,
}

impl Io {
    fn lock(&self) -> std::sync::MutexGuard<'_, IoState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until the world completes this call: `Some(true)` go on, `Some(false)` fail.
    async fn wait(&self, inc: Inc, kind: OpKind) -> bool {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut s = self.lock();
            s.next += 1;
            let id = s.next;
            s.ops.insert(
                id,
                Op {
                    inc,
                    kind,
                    done: tx,
                },
            );
        }
        match rx.await {
            Ok(go) => go,
            // The world dropped the call (the simulation ended): never answer.
            Err(_) => std::future::pending().await,
        }
    }

    /// The pending operations' ids and kinds, in the order they were issued.
    pub fn pending(&self) -> Vec<(u64, Inc, OpKind)> {
        self.lock()
            .ops
            .iter()
            .map(|(id, op)| (*id, op.inc, op.kind.clone()))
            .collect()
    }

    /// Take operation `id` out of the pending set.
    pub fn take(&self, id: u64) -> Option<Op> {
        self.lock().ops.remove(&id)
    }

    /// An effect landed (the world checks it at its next turn: nothing it checks against can change
    /// before then, since storage moves only when the world runs a job).
    pub fn land(&self, effect: Effect) {
        let mut s = self.lock();
        s.effects.push(effect.clone());
        s.landed.push(effect);
    }

    /// The effects landed since the last call.
    pub fn take_landed(&self) -> Vec<Effect> {
        std::mem::take(&mut self.lock().landed)
    }

    /// Every effect that landed, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }
}

/// The scripted model of the simulation, waiting on the world for every call.
pub struct SimAgent {
    pub inc: Inc,
    pub io: Arc<Io>,
}

impl Agent for SimAgent {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    fn model(&self) -> &str {
        "sim"
    }

    fn next<'a>(
        &'a self,
        conv: Conversation<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        async move {
            if !self.io.wait(self.inc, OpKind::Model).await {
                return Err(AgentError::Transient {
                    message: "simulated provider error".into(),
                    retry_after: None,
                });
            }
            crate::agent::next(conv.turns).map_err(AgentError::Permanent)
        }
        .boxed()
    }
}

/// One fake tool of the simulation; its effect is the world completing its call.
pub struct SimTool {
    pub def: ToolDef,
    pub inc: Inc,
    pub io: Arc<Io>,
}

impl SimTool {
    /// The three tools of an incarnation.
    pub fn all(inc: Inc, io: &Arc<Io>) -> Vec<Arc<dyn Tool>> {
        crate::agent::tool_defs()
            .into_iter()
            .map(|def| {
                Arc::new(SimTool {
                    def,
                    inc,
                    io: io.clone(),
                }) as Arc<dyn Tool>
            })
            .collect()
    }
}

impl Tool for SimTool {
    fn def(&self) -> ToolDef {
        self.def.clone()
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext, args: &'a Value) -> BoxFuture<'a, ToolOutput> {
        self.call_keyed(ctx, "", args)
    }

    fn call_keyed<'a>(
        &'a self,
        ctx: &'a ToolContext,
        call_id: &'a str,
        _args: &'a Value,
    ) -> BoxFuture<'a, ToolOutput> {
        async move {
            let kind = OpKind::Tool {
                run_id: ctx.run_id.clone(),
                call_id: call_id.to_owned(),
                tool: self.def.name.clone(),
                gen: ctx.gen.clone(),
            };
            self.io.wait(self.inc, kind).await;
            let effect = Effect {
                run_id: ctx.run_id.clone(),
                call_id: call_id.to_owned(),
                tool: self.def.name.clone(),
                gen: ctx.gen.clone(),
                workspace: ctx.workspace.clone(),
            };
            if self.def.name != "mut" {
                self.io.land(effect);
                return ToolOutput::ok("ok");
            }
            // A mutating workspace tool writes only while the fence names this incarnation (SPEC §8.3).
            let fenced = actors::tools::with_fence(
                &ctx.workspace,
                &ctx.gen,
                std::time::Duration::ZERO,
                || self.io.land(effect),
            );
            match fenced {
                Ok(()) => ToolOutput::ok("ok"),
                Err(e) => ToolOutput::err(e.to_string()),
            }
        }
        .boxed()
    }
}
