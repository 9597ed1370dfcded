//! Chat channels (SPEC §12): a run that came from a chat thread shows itself in that thread as one
//! status card the bot posts once and then edits, and its answer as a reply.
//!
//! - [`ChannelIo`]: what a channel can do (post a card, edit it, reply); [`slack::SlackIo`] is Slack's
//!   Web API, and a run without a channel (an API message) has no [`ChannelIo`] at all;
//! - [`card`]: the card's frames, a pure fold of the run's own events;
//! - [`cards`]: the process's open cards: the post (its handle committed to the ledger row right after),
//!   edits coalesced to one a second per card, the closing frame, and silence once fenced.

pub mod card;
pub mod cards;
pub mod slack;

pub use cards::Cards;
pub use slack::patiently;

use std::time::Duration;
use storage::RunId;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// A posted card: the channel and the message's timestamp (Slack's message id), saved on the ledger row
/// as `state.card` and on the record as `card`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardHandle {
    pub channel: String,
    pub ts: String,
}

/// The thread a run answers in: the channel and the thread's root message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadRef {
    pub channel: String,
    pub thread_ts: String,
}

/// Where a run's card lives: its thread, the card the row names (a resumed run's), and whether an earlier
/// incarnation may have posted one it never saved (then it is looked for before a fresh one is posted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardPlace {
    pub thread: ThreadRef,
    pub handle: Option<CardHandle>,
    pub look: bool,
}

/// One rendering of a card: its text (the live view link included), the run it shows, whether it
/// offers the Stop button (a live run's frames do), and the calls it offers Approve / Deny buttons for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub text: String,
    pub run_id: RunId,
    pub stop_button: bool,
    /// The calls awaiting approval the text lists, in its order (SPEC §13); none once the run ended.
    pub approvals: Vec<card::AwaitedCall>,
}

/// What a channel call can answer besides success: Slack's `ok: false` errors typed, its `429`, and the
/// transport failing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The card was deleted: post a fresh one.
    #[error("message_not_found")]
    MessageNotFound,
    /// The channel is gone or the bot is not in it: the run goes on without a card.
    #[error("channel_not_found")]
    ChannelNotFound,
    #[error("not_in_channel")]
    NotInChannel,
    /// `429`: wait `Retry-After`.
    #[error("rate limited for {0:?}")]
    RateLimited(Duration),
    /// Any other `ok: false` error, by its code.
    #[error("slack error {0}")]
    Api(String),
    /// No answer, or not Slack's shape.
    #[error("transport: {0}")]
    Transport(String),
}

impl ChannelError {
    /// No card can exist in this thread: the run goes on without one.
    pub fn no_card_here(&self) -> bool {
        matches!(
            self,
            ChannelError::ChannelNotFound | ChannelError::NotInChannel
        )
    }
}

/// A chat channel's calls. Shared by every run of the process (`Arc<dyn ChannelIo>`).
pub trait ChannelIo: Send + Sync + 'static {
    /// The card run `run_id` posted in `thread`, if any: a process that died between a post and its
    /// commit left one the row does not name, and a second card must never follow.
    fn find_card<'a>(
        &'a self,
        thread: &'a ThreadRef,
        run_id: &'a RunId,
    ) -> BoxFuture<'a, Result<Option<CardHandle>, ChannelError>>;
    /// Post a card as a reply in `thread`; answers its handle.
    fn post_card<'a>(
        &'a self,
        thread: &'a ThreadRef,
        frame: &'a Frame,
    ) -> BoxFuture<'a, Result<CardHandle, ChannelError>>;
    /// Replace a posted card's content.
    fn edit_card<'a>(
        &'a self,
        card: &'a CardHandle,
        frame: &'a Frame,
    ) -> BoxFuture<'a, Result<(), ChannelError>>;
    /// Post `text` (run `run_id`'s answer) as a reply in `thread`.
    fn reply<'a>(
        &'a self,
        thread: &'a ThreadRef,
        run_id: &'a RunId,
        text: &'a str,
    ) -> BoxFuture<'a, Result<(), ChannelError>>;
}
