//! The I/O of the production shell that is not storage, as the world sees it: every model call and every
//! tool call of a simulated process waits as a pending [`Op`] until the world completes it (then the call
//! answers) or never does (its process crashed). Storage calls wait the same way, as jobs on each
//! process's detached mailbox (see `world`).
//!
//! [`SimAgent`] answers with [`crate::agent::next`] (a function of the transcript); [`SimTool`] is one of
//! the three fake tools (`mut`, `pure`, `idem`): once the world completes its call the effect lands —
//! `mut` and `idem` as a tool with effects does, inside the production workspace fence
//! ([`actors::tools::with_fence`]) — and is recorded with the caller's fence token for the world to check.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use storage::RunId;

use actors::agent::{Agent, AgentError, AssistantTurn, Conversation, ToolDef};
use actors::channel::{CardHandle, ChannelError, ChannelIo, Frame, ThreadRef};
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
    /// A chat call (a card posted, edited or looked for; an answer posted), as the trace says it.
    Chat(String),
    Tool {
        run_id: RunId,
        call_id: String,
        tool: String,
        gen: String,
    },
}

/// How the world completes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Go {
    /// The call goes through.
    On,
    /// A model call fails (a transient provider error).
    Fail,
    /// A model call panics (a bug in an agent): the run actor catches it at the effect's boundary.
    Panic,
}

/// What a model call that the world completes with [`Go::Panic`] panics with.
pub const SIM_PANIC: &str = "simulated agent panic";

/// A call of the production shell waiting for the world.
pub struct Op {
    pub inc: Inc,
    pub kind: OpKind,
    pub done: tokio::sync::oneshot::Sender<Go>,
}

/// A tool effect as it landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub run_id: RunId,
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
    /// The chat: each run's cards (posted, in order) and answers.
    cards: BTreeMap<RunId, Vec<CardHandle>>,
    replies: BTreeMap<RunId, u32>,
}

impl Io {
    fn lock(&self) -> std::sync::MutexGuard<'_, IoState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until the world completes this call, and how.
    async fn wait(&self, inc: Inc, kind: OpKind) -> Go {
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

    /// Per run: the cards posted for it and the answers posted in its thread.
    pub fn chat(&self) -> BTreeMap<RunId, (usize, u32)> {
        let s = self.lock();
        let mut out: BTreeMap<RunId, (usize, u32)> = BTreeMap::new();
        for (run, cards) in &s.cards {
            out.entry(run.clone()).or_default().0 = cards.len();
        }
        for (run, n) in &s.replies {
            out.entry(run.clone()).or_default().1 = *n;
        }
        out
    }
}

/// The chat channel of the simulation (SPEC §12): every call waits on the world; the cards and answers
/// that landed are kept for the invariants (one card per run, at most one answer per run).
pub struct SimChannel {
    pub inc: Inc,
    pub io: Arc<Io>,
}

impl ChannelIo for SimChannel {
    fn find_card<'a>(
        &'a self,
        _thread: &'a ThreadRef,
        run_id: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<CardHandle>, ChannelError>> {
        async move {
            let what = format!("find the card of {run_id}");
            self.io.wait(self.inc, OpKind::Chat(what)).await;
            Ok(self
                .io
                .lock()
                .cards
                .get(run_id)
                .and_then(|c| c.first().cloned()))
        }
        .boxed()
    }

    fn post_card<'a>(
        &'a self,
        thread: &'a ThreadRef,
        frame: &'a Frame,
    ) -> BoxFuture<'a, Result<CardHandle, ChannelError>> {
        async move {
            let what = format!("post a card for {}", frame.run_id);
            self.io.wait(self.inc, OpKind::Chat(what)).await;
            let mut s = self.io.lock();
            s.next += 1;
            let handle = CardHandle {
                channel: thread.channel.clone(),
                ts: format!("card-{}", s.next),
            };
            s.cards
                .entry(frame.run_id.clone())
                .or_default()
                .push(handle.clone());
            Ok(handle)
        }
        .boxed()
    }

    fn edit_card<'a>(
        &'a self,
        _card: &'a CardHandle,
        frame: &'a Frame,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        async move {
            let what = format!("edit the card of {}", frame.run_id);
            self.io.wait(self.inc, OpKind::Chat(what)).await;
            Ok(())
        }
        .boxed()
    }

    fn reply<'a>(
        &'a self,
        _thread: &'a ThreadRef,
        run_id: &'a RunId,
        _text: &'a str,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        async move {
            let what = format!("answer {run_id} in its thread");
            self.io.wait(self.inc, OpKind::Chat(what)).await;
            *self.io.lock().replies.entry(run_id.clone()).or_default() += 1;
            Ok(())
        }
        .boxed()
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
            match self.io.wait(self.inc, OpKind::Model).await {
                Go::On => crate::agent::next(conv.turns).map_err(AgentError::Permanent),
                Go::Fail => Err(AgentError::Transient {
                    message: "simulated provider error".into(),
                    retry_after: None,
                }),
                Go::Panic => std::panic::panic_any(SIM_PANIC),
            }
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
            if self.def.side_effect_free {
                self.io.land(effect);
                return ToolOutput::ok("ok");
            }
            // A tool with effects acts only while the workspace fence names this incarnation (SPEC §8.3):
            // a workspace tool around its write, an external one as its check right before dispatch.
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
