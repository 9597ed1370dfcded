//! A queue bounded in items and in bytes, for fan-out to readers who may stop reading.
//!
//! Who uses it: the registry's per-subscriber queues (a run's events to one stream or plan follower) and
//! the web layer's per-connection frame queues. Both hold shared, reference-counted payloads, so the
//! bytes counted are what one reader pins, not copies.
//!
//! Invariants:
//! - neither bound is ever exceeded: a [`Sender::try_send`] that would exceed one *overflows* the queue —
//!   its items are released at once and the receiver sees the end without draining them (a reader that
//!   fell behind is dropped, never awaited, and frees its memory immediately);
//! - [`Sender::abandon`] does the same on purpose (a client that stopped reading);
//! - once every sender is dropped the receiver drains what is queued, then sees the end;
//! - once the receiver is dropped every send fails and what was queued is released.
//!
//! The lock is a `std::sync::Mutex` held for a few pointer moves, never across an `.await`. One task
//! receives; [`Sender::send`] (which waits for room) is meant for one producer at a time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Why a send did not queue its item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The item would exceed a bound (this send overflowed the queue), or an earlier one did, or the
    /// queue was abandoned.
    Overflow,
    /// The receiver is gone.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Every sender dropped: drain, then end.
    SendersGone,
    /// Overflowed or abandoned: end at once (items already released).
    Dropped,
    ReceiverGone,
}

struct State<T> {
    items: VecDeque<(T, usize)>,
    bytes: usize,
    senders: usize,
    end: Option<End>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    max_items: usize,
    max_bytes: usize,
    /// Wakes the receiver (an item, or an end).
    readable: Notify,
    /// Wakes a sender waiting for room (or for the receiver's end).
    writable: Notify,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// End the queue now, releasing its items (outside the lock).
    fn drop_items(&self, end: End) {
        let released = {
            let mut s = self.lock();
            if s.end.is_none() || s.end == Some(End::SendersGone) {
                s.end = Some(end);
            }
            s.bytes = 0;
            std::mem::take(&mut s.items)
        };
        drop(released);
        self.readable.notify_one();
        self.writable.notify_one();
    }
}

/// A queue of at most `max_items` items and `max_bytes` counted bytes (an item larger than `max_bytes`
/// alone is still refused: it overflows).
pub fn bounded<T>(max_items: usize, max_bytes: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            bytes: 0,
            senders: 1,
            end: None,
        }),
        max_items: max_items.max(1),
        max_bytes,
        readable: Notify::new(),
        writable: Notify::new(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queue `item` if it fits now: `Ok(None)` queued, `Ok(Some(item))` no room (handed back), `Err` the
    /// queue ended.
    fn offer(&self, item: T, bytes: usize) -> Result<Option<T>, SendError> {
        let mut s = self.shared.lock();
        match s.end {
            Some(End::ReceiverGone) => return Err(SendError::Closed),
            Some(End::Dropped) => return Err(SendError::Overflow),
            Some(End::SendersGone) | None => {}
        }
        if s.items.len() >= self.shared.max_items || s.bytes + bytes > self.shared.max_bytes {
            return Ok(Some(item));
        }
        s.bytes += bytes;
        s.items.push_back((item, bytes));
        drop(s);
        self.shared.readable.notify_one();
        Ok(None)
    }

    /// Queue `item`, counted as `bytes`, or overflow the queue if it does not fit.
    pub fn try_send(&self, item: T, bytes: usize) -> Result<(), SendError> {
        match self.offer(item, bytes)? {
            None => Ok(()),
            Some(_) => {
                self.shared.drop_items(End::Dropped);
                Err(SendError::Overflow)
            }
        }
    }

    /// Queue `item`, waiting for room while the receiver reads. An item that could never fit overflows.
    pub async fn send(&self, mut item: T, bytes: usize) -> Result<(), SendError> {
        if bytes > self.shared.max_bytes {
            self.shared.drop_items(End::Dropped);
            return Err(SendError::Overflow);
        }
        loop {
            let writable = self.shared.writable.notified();
            match self.offer(item, bytes)? {
                None => return Ok(()),
                Some(back) => item = back,
            }
            writable.await;
        }
    }

    /// End the queue now and release what it holds (the reader stopped reading).
    pub fn abandon(&self) {
        self.shared.drop_items(End::Dropped);
    }

    /// Whether sends can no longer succeed (receiver gone, overflowed or abandoned).
    pub fn is_closed(&self) -> bool {
        matches!(
            self.shared.lock().end,
            Some(End::ReceiverGone | End::Dropped)
        )
    }

    /// Counted bytes queued now.
    pub fn queued_bytes(&self) -> usize {
        self.shared.lock().bytes
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.senders -= 1;
        if s.senders == 0 && s.end.is_none() {
            s.end = Some(End::SendersGone);
            drop(s);
            self.shared.readable.notify_one();
        }
    }
}

pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Receiver<T> {
    /// The next item, or `None` once the queue has ended (senders gone and drained, or dropped).
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            let readable = self.shared.readable.notified();
            match self.poll_item() {
                Ok(item) => return item,
                Err(()) => readable.await,
            }
        }
    }

    /// The next item if one is queued now; `None` when none is (or the queue ended).
    pub fn try_recv(&mut self) -> Option<T> {
        self.poll_item().ok().flatten()
    }

    /// `Ok(Some)` an item, `Ok(None)` the end, `Err` nothing yet.
    fn poll_item(&self) -> Result<Option<T>, ()> {
        let mut s = self.shared.lock();
        if s.end == Some(End::Dropped) {
            return Ok(None);
        }
        if let Some((item, bytes)) = s.items.pop_front() {
            s.bytes -= bytes;
            drop(s);
            self.shared.writable.notify_one();
            return Ok(Some(item));
        }
        if s.end.is_some() {
            return Ok(None);
        }
        Err(())
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.drop_items(End::ReceiverGone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn items_queue_in_order_within_both_bounds() {
        let (tx, mut rx) = bounded::<u32>(4, 100);
        for i in 0..4 {
            tx.try_send(i, 25).unwrap();
        }
        assert_eq!(tx.queued_bytes(), 100);
        assert_eq!((rx.try_recv(), rx.try_recv()), (Some(0), Some(1)));
        assert_eq!(tx.queued_bytes(), 50);
    }

    #[test]
    fn a_send_past_the_byte_bound_overflows_and_releases_everything_at_once() {
        let payload = Arc::new(vec![0u8; 1000]);
        let (tx, mut rx) = bounded::<Arc<Vec<u8>>>(1_000, 2_500);
        tx.try_send(payload.clone(), 1000).unwrap();
        tx.try_send(payload.clone(), 1000).unwrap();
        assert_eq!(Arc::strong_count(&payload), 3);
        assert_eq!(tx.try_send(payload.clone(), 1000), Err(SendError::Overflow));
        // Released by the overflow, not by the reader: a stalled reader pins nothing.
        assert_eq!(Arc::strong_count(&payload), 1);
        assert_eq!(tx.queued_bytes(), 0);
        assert!(tx.is_closed());
        assert_eq!(rx.try_recv(), None);
        assert_eq!(
            tx.try_send(payload, 1),
            Err(SendError::Overflow),
            "an overflowed queue stays closed"
        );
    }

    #[test]
    fn a_send_past_the_item_bound_overflows() {
        let (tx, mut rx) = bounded::<u8>(2, usize::MAX);
        tx.try_send(1, 0).unwrap();
        tx.try_send(2, 0).unwrap();
        assert_eq!(tx.try_send(3, 0), Err(SendError::Overflow));
        assert_eq!(rx.try_recv(), None);
    }

    #[tokio::test]
    async fn dropped_senders_let_the_receiver_drain_then_end() {
        let (tx, mut rx) = bounded::<u8>(8, 8);
        let tx2 = tx.clone();
        tx.try_send(1, 1).unwrap();
        drop(tx);
        tx2.try_send(2, 1).unwrap();
        drop(tx2);
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn abandon_ends_the_receiver_without_draining() {
        let (tx, mut rx) = bounded::<u8>(8, 8);
        tx.try_send(1, 1).unwrap();
        tx.abandon();
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_waiting_send_resumes_when_the_receiver_reads_and_fails_when_it_goes() {
        let (tx, mut rx) = bounded::<u8>(1, 8);
        tx.send(1, 1).await.unwrap();
        let waiting = tokio::spawn(async move {
            let r = tx.send(2, 1).await;
            (r, tx)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished(), "no room: the send waits");
        assert_eq!(rx.recv().await, Some(1));
        let (r, tx) = waiting.await.unwrap();
        assert_eq!(r, Ok(()));
        assert_eq!(rx.recv().await, Some(2));
        drop(rx);
        assert_eq!(tx.send(3, 1).await, Err(SendError::Closed));
        assert_eq!(tx.try_send(3, 1), Err(SendError::Closed));
    }

    #[tokio::test]
    async fn an_item_that_can_never_fit_overflows_instead_of_waiting_forever() {
        let (tx, mut rx) = bounded::<u8>(4, 8);
        assert_eq!(tx.send(1, 9).await, Err(SendError::Overflow));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_receiver_waiting_wakes_on_a_send() {
        let (tx, mut rx) = bounded::<u8>(4, 8);
        let reader = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.try_send(7, 1).unwrap();
        assert_eq!(reader.await.unwrap(), Some(7));
    }
}
