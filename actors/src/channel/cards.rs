//! The process's open status cards (SPEC §12): one driver task a card posts it, commits its handle to the
//! ledger row (`state.card`) right after the post, and edits it as the run's events change its frame —
//! at most one edit a second, the latest frame always sent last.
//!
//! A run opens its card at launch ([`Cards::open`]: a fresh card, or the handle a resumed run finds on
//! its row), every published event passes [`Cards::observe`], and the run closes it before its final
//! record ([`Cards::close`]: the closing frame, answered with what the record carries). A fenced or
//! handed-off run [`Cards::forget`]s its card: nothing more from this process reaches the thread. A
//! process closing another process's run edits its card once ([`Cards::close_once`]).
//!
//! One driver at a time a run: a forgotten driver may still have a call in flight (a post cannot be
//! recalled), so it *retires* — the next driver of the run in this process (a re-adoption after a panic)
//! and a close of its row ([`Cards::close_once`]) first wait for it to stop, and take over the card it
//! is on. Without that a re-adopted or closed run could post a second card.
//!
//! Bounded: one entry per open card, each holding only the latest view; no queue of frames.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use storage::RunId;

use serde_json::{Map, Value};
use storage::ledger::{state_keys, LiveRow, Refusal};
use storage::record::RunEvent;
use storage::StorageHandle;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use super::card::{CardView, Ending};
use super::{patiently, CardHandle, CardPlace, ChannelError, ChannelIo, Frame, ThreadRef};

/// The least time between two calls for one card.
pub const EDIT_SPACING: Duration = Duration::from_secs(1);
/// How long a run's record waits for its closing frame; past it the record says the card is open and
/// the orphan sweep closes it later.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// The longest a new driver waits for a retiring one of its run (whose calls are bounded by their own
/// retries: this is a backstop, never the normal wait).
const RETIRE_WAIT: Duration = Duration::from_secs(30);

/// What a closed card leaves on the record: its handle (`card`) and whether the closing frame went out
/// (`cardClosed`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CardClosed {
    pub handle: Option<CardHandle>,
    pub closed: bool,
}

impl CardClosed {
    /// Put `card` and `cardClosed` on a record head's fields.
    pub fn stamp(&self, fields: &mut Map<String, Value>) {
        if let Some(handle) = &self.handle {
            fields.insert(
                storage::record::CARD.into(),
                serde_json::to_value(handle).expect("a handle serializes"),
            );
            fields.insert(
                storage::record::CARD_CLOSED.into(),
                Value::Bool(self.closed),
            );
        }
    }
}

/// The process's cards: `Cards::default()` has no channel and does nothing.
#[derive(Clone, Default)]
pub struct Cards {
    inner: Option<Arc<Inner>>,
}

/// How the cards publish a note on a run (set once by the supervisor: the run's own publish path).
type Notes = Box<dyn Fn(&RunId, RunEvent) + Send + Sync>;

struct Inner {
    io: Arc<dyn ChannelIo>,
    notes: std::sync::OnceLock<Notes>,
    storage: StorageHandle,
    /// `[server] public_base_url`: the live view links on the frames.
    public_base_url: String,
    open: Mutex<HashMap<RunId, Arc<Slot>>>,
    /// Silenced drivers that may still have a call in flight, by run.
    retiring: Mutex<HashMap<RunId, Arc<Slot>>>,
}

struct Slot {
    state: Mutex<SlotState>,
    wake: Notify,
    /// Set once the driver returned: nothing of it reaches the thread any more.
    done: tokio::sync::watch::Sender<bool>,
}

impl Slot {
    /// Wait (at most `limit`) for the driver to return; answers the card it was on.
    async fn retired(&self, limit: Duration) -> Option<CardHandle> {
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(limit, done.wait_for(|d| *d)).await;
        lock(&self.state).handle.clone()
    }
}

struct SlotState {
    run_id: RunId,
    gen: String,
    thread: ThreadRef,
    view: CardView,
    handle: Option<CardHandle>,
    /// The frame last shown (an unchanged frame, text and buttons, is not sent again).
    shown: Option<Frame>,
    /// The closing frame is asked for: answer these once it went out (or could not).
    closers: Vec<oneshot::Sender<CardClosed>>,
    /// Fenced, handed off, or no card possible in this thread: send nothing more.
    silent: bool,
    /// Look for a card an earlier incarnation posted before posting one.
    look: bool,
}

impl Cards {
    pub fn new(io: Arc<dyn ChannelIo>, storage: StorageHandle, public_base_url: &str) -> Self {
        Cards {
            inner: Some(Arc::new(Inner {
                io,
                notes: std::sync::OnceLock::new(),
                storage,
                public_base_url: public_base_url.trim_end_matches('/').to_owned(),
                open: Mutex::new(HashMap::new()),
                retiring: Mutex::new(HashMap::new()),
            })),
        }
    }

    /// Whether a channel is configured.
    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Where the cards' notes on a run go (`note` events, e.g. why a run has no card): set once.
    pub fn on_note(&self, publish: impl Fn(&RunId, RunEvent) + Send + Sync + 'static) {
        if let Some(inner) = &self.inner {
            let _ = inner.notes.set(Box::new(publish));
        }
    }

    /// The run's live view, with its capability token (the link on every frame).
    pub fn live_url(&self, run_id: &RunId, token: &str) -> String {
        let base = self
            .inner
            .as_ref()
            .map_or("", |i| i.public_base_url.as_str());
        format!("{base}/runs/{run_id}?token={token}")
    }

    /// Start showing a run in its thread: post a card, or edit the one `place` names (a resumed run's),
    /// with the view's frame now and as its events change it. Call on the run's arbiter.
    pub fn open(&self, gen: &str, place: CardPlace, view: CardView) {
        let Some(inner) = &self.inner else { return };
        let run_id = view.run_id.clone();
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState {
                run_id: run_id.clone(),
                gen: gen.to_owned(),
                thread: place.thread,
                view,
                handle: place.handle,
                look: place.look,
                shown: None,
                closers: Vec::new(),
                silent: false,
            }),
            wake: Notify::new(),
            done: tokio::sync::watch::Sender::new(false),
        });
        let replaced = lock(&inner.open).insert(run_id, slot.clone());
        if let Some(old) = replaced {
            retire(inner, old);
        }
        actix::spawn(drive(inner.clone(), slot));
    }

    /// Take a published event into its run's card, if it has one.
    pub fn observe(&self, run_id: &RunId, event: &Value) {
        let Some(inner) = &self.inner else { return };
        let Some(slot) = lock(&inner.open).get(run_id).cloned() else {
            return;
        };
        if lock(&slot.state).view.observe(event) {
            slot.wake.notify_one();
        }
    }

    /// Send the closing frame and answer what the record carries; waits at most [`CLOSE_WAIT`] (the
    /// driver goes on trying after that, and the record says the card is still open).
    pub async fn close(&self, run_id: &RunId, ending: Ending) -> CardClosed {
        let Some(inner) = &self.inner else {
            return CardClosed::default();
        };
        let Some(slot) = lock(&inner.open).remove(run_id) else {
            return CardClosed::default();
        };
        let (tx, rx) = oneshot::channel();
        let handle = {
            let mut state = lock(&slot.state);
            state.view.ending = Some(ending);
            state.closers.push(tx);
            state.handle.clone()
        };
        slot.wake.notify_one();
        match tokio::time::timeout(CLOSE_WAIT, rx).await {
            Ok(Ok(closed)) => closed,
            _ => CardClosed {
                handle: lock(&slot.state).handle.clone().or(handle),
                closed: false,
            },
        }
    }

    /// Nothing more from this process reaches the run's thread (fenced, handed off, storage lost).
    pub fn forget(&self, run_id: &RunId) {
        let Some(inner) = &self.inner else { return };
        let slot = lock(&inner.open).remove(run_id);
        if let Some(slot) = slot {
            retire(inner, slot);
        }
    }

    /// Post run `run_id`'s answer as a reply in `thread` (rate limits waited out, transport errors
    /// retried).
    pub async fn reply(
        &self,
        thread: &ThreadRef,
        run_id: &RunId,
        text: &str,
    ) -> Result<(), ChannelError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        patiently("chat.postMessage", || inner.io.reply(thread, run_id, text)).await
    }

    /// Close the card of a run this process closes for another (a reclaim, an orphan, a record whose
    /// card stayed open): one edit of `handle` (or the card the run posted, looked for) with `view`'s
    /// closing frame, a fresh card if it was deleted. Answers what the record carries.
    pub async fn close_once(
        &self,
        mut handle: Option<CardHandle>,
        thread: ThreadRef,
        view: CardView,
    ) -> CardClosed {
        let Some(inner) = &self.inner else {
            return CardClosed::default();
        };
        let frame = view.frame();
        let io = inner.io.as_ref();
        let run_id = &view.run_id;
        let retiring = lock(&inner.retiring).get(run_id).cloned();
        let sent = tokio::time::timeout(CLOSE_WAIT, async {
            // A driver of the run this process silenced may still be posting: it goes first.
            if let Some(old) = retiring {
                let on = old.retired(CLOSE_WAIT).await;
                if handle.is_none() {
                    handle = on;
                }
            }
            if handle.is_none() {
                handle = find(io, &thread, run_id).await;
            }
            show(io, &thread, handle.as_ref(), &frame).await
        })
        .await;
        match sent {
            Ok(Ok(handle)) => CardClosed {
                handle: Some(handle),
                closed: true,
            },
            // No card can ever be shown in this thread (the channel is gone, the bot removed): nothing is
            // left to close.
            Ok(Err(e)) if e.no_card_here() => {
                tracing::warn!(%run_id, error = %e, "the run's card cannot be closed: no card in this thread");
                CardClosed {
                    handle,
                    closed: true,
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(%run_id, error = %e, "could not close the run's card");
                CardClosed {
                    handle,
                    closed: false,
                }
            }
            Err(_) => CardClosed {
                handle,
                closed: false,
            },
        }
    }
}

/// The card a row's state names (`state.card`).
pub fn card_of(row: &LiveRow) -> Option<CardHandle> {
    row.state
        .get(state_keys::CARD)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Silence a driver no run of this process uses any more, and keep it where the run's next driver or
/// close finds it until it returned.
fn retire(inner: &Inner, slot: Arc<Slot>) {
    silence(&slot);
    let run_id = lock(&slot.state).run_id.clone();
    // Under the lock the driver returns under: it is either done, or removes this entry when it is.
    let mut retiring = lock(&inner.retiring);
    if !*slot.done.borrow() {
        retiring.insert(run_id, slot);
    }
}

fn silence(slot: &Slot) {
    let mut state = lock(&slot.state);
    state.silent = true;
    for tx in state.closers.drain(..) {
        let _ = tx.send(CardClosed::default());
    }
    drop(state);
    slot.wake.notify_one();
}

/// The card run `run_id` posted in `thread` that no row names, if Slack has one (a failed lookup finds
/// none: a second card is better than none).
async fn find(io: &dyn ChannelIo, thread: &ThreadRef, run_id: &RunId) -> Option<CardHandle> {
    match patiently("conversations.replies", || io.find_card(thread, run_id)).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(%run_id, error = %e, "could not look for the run's card");
            None
        }
    }
}

/// Show `frame`: edit `handle`, or post a fresh card when there is none or it was deleted. Answers the
/// card it is on.
async fn show(
    io: &dyn ChannelIo,
    thread: &ThreadRef,
    handle: Option<&CardHandle>,
    frame: &Frame,
) -> Result<CardHandle, ChannelError> {
    if let Some(handle) = handle {
        match patiently("chat.update", || io.edit_card(handle, frame)).await {
            Ok(()) => return Ok(handle.clone()),
            Err(ChannelError::MessageNotFound) => {}
            Err(e) => return Err(e),
        }
    }
    patiently("chat.postMessage", || io.post_card(thread, frame)).await
}

/// One card's driver, once the run's retiring driver (if any) stopped: its card is this one's.
async fn drive(inner: Arc<Inner>, slot: Arc<Slot>) {
    let run_id = lock(&slot.state).run_id.clone();
    let old = lock(&inner.retiring).get(&run_id).cloned();
    if let Some(old) = old {
        let on = old.retired(RETIRE_WAIT).await;
        let mut state = lock(&slot.state);
        if state.handle.is_none() {
            state.handle = on;
        }
    }
    show_frames(&inner, &slot).await;
    let mut retiring = lock(&inner.retiring);
    slot.done.send_replace(true);
    if retiring.get(&run_id).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
        retiring.remove(&run_id);
    }
}

/// Send the latest frame whenever it changed, no sooner than [`EDIT_SPACING`] after the previous call;
/// commit a new handle to the row right after its post; answer the closers once the closing frame is
/// shown; stop when silenced or closed.
async fn show_frames(inner: &Inner, slot: &Slot) {
    let mut last_call: Option<Instant> = None;
    loop {
        // What to show, if anything changed.
        let next = {
            let state = lock(&slot.state);
            if state.silent {
                return;
            }
            let frame = state.view.frame();
            (state.shown.as_ref() != Some(&frame)).then_some(frame)
        };
        if next.is_none() {
            if answer_closers(slot, true) {
                return;
            }
            slot.wake.notified().await;
            continue;
        }
        if let Some(at) = last_call {
            tokio::time::sleep_until(at + EDIT_SPACING).await;
        }
        // The latest frame after the wait: edits in between coalesce into this one.
        let (frame, thread, mut handle, run_id, gen, look) = {
            let mut state = lock(&slot.state);
            if state.silent {
                return;
            }
            (
                state.view.frame(),
                state.thread.clone(),
                state.handle.clone(),
                state.run_id.clone(),
                state.gen.clone(),
                std::mem::take(&mut state.look),
            )
        };
        // A process paused past its lease wakes here before it learns it was fenced: the ledger says
        // whether the run is still this generation's, right before anything reaches the thread.
        if !still_owner(inner, &run_id, &gen).await {
            tracing::info!(run_id = %run_id, generation = %gen, "not the run's owner any more: its card is left alone");
            silence(slot);
            return;
        }
        if look && handle.is_none() {
            handle = find(inner.io.as_ref(), &thread, &run_id).await;
            if let Some(found) = &handle {
                if !save(inner, &run_id, &gen, found).await {
                    silence(slot);
                    return;
                }
                lock(&slot.state).handle = handle.clone();
            }
        }
        // Silenced while it looked (the run ended here): nothing more reaches the thread.
        if lock(&slot.state).silent {
            return;
        }
        last_call = Some(Instant::now());
        match show(inner.io.as_ref(), &thread, handle.as_ref(), &frame).await {
            Ok(shown_on) => {
                if handle.as_ref() != Some(&shown_on)
                    && !save(inner, &run_id, &gen, &shown_on).await
                {
                    silence(slot);
                    return;
                }
                let mut state = lock(&slot.state);
                state.handle = Some(shown_on);
                state.shown = Some(frame);
            }
            Err(e) if e.no_card_here() => {
                tracing::warn!(run_id = %run_id, generation = %gen, error = %e, "no card in this thread; the run goes on without one");
                if let Some(note) = inner.notes.get() {
                    note(
                        &run_id,
                        RunEvent::note("no_card", format!("no status card in this thread: {e}")),
                    );
                }
                silence(slot);
                return;
            }
            Err(e) => {
                // Given up for now: the next change (or the close) tries again.
                tracing::warn!(run_id = %run_id, generation = %gen, error = %e, "card not updated");
                lock(&slot.state).shown = Some(frame);
                if answer_closers(slot, false) {
                    return;
                }
            }
        }
    }
}

/// Once the run asked for its closing frame, answer its closers (`shown`: the frame went out) and say
/// the driver is done.
fn answer_closers(slot: &Slot, shown: bool) -> bool {
    let mut state = lock(&slot.state);
    if state.view.ending.is_none() || state.closers.is_empty() {
        return false;
    }
    let closed = CardClosed {
        handle: state.handle.clone(),
        closed: shown && state.handle.is_some(),
    };
    for tx in state.closers.drain(..) {
        let _ = tx.send(closed.clone());
    }
    true
}

/// Whether the run's live row is still `gen`'s (a storage error answers yes: the heartbeat is what
/// fences an owner that cannot reach storage).
async fn still_owner(inner: &Inner, run_id: &RunId, gen: &str) -> bool {
    match inner.storage.get_live(run_id.to_owned()).await {
        Ok(Some(row)) => row.owner_gen == gen,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Commit a card's handle to its row (`state.card`). `false` when the row is another generation's: the
/// process is fenced and says nothing more. A row already gone (the run finished meanwhile) is fine:
/// its record carries the handle.
async fn save(inner: &Inner, run_id: &RunId, gen: &str, handle: &CardHandle) -> bool {
    let mut patch = Map::new();
    patch.insert(
        state_keys::CARD.into(),
        serde_json::to_value(handle).expect("a handle serializes"),
    );
    for attempt in 0..3u32 {
        match inner
            .storage
            .set_state(run_id.to_owned(), gen.to_owned(), patch.clone())
            .await
        {
            Ok(Ok(())) | Ok(Err(Refusal::UnknownRun { .. })) => return true,
            Ok(Err(Refusal::Fenced { .. })) => return false,
            Ok(Err(other)) => {
                tracing::warn!(%run_id, generation = gen, refusal = %other, "card handle not saved");
                return true;
            }
            Err(e) => {
                tracing::warn!(%run_id, generation = gen, error = %e, attempt, "card handle not saved yet");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
    true
}
