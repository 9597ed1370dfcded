//! One app's claim queue: who holds what, who waits in what order, and who may go next.
//!
//! Pure data with no I/O and no clock, so the grant rule is testable on its own; the coordinator shell
//! wakes the entries [`AppQueue::grant`] returns.
//!
//! Invariants:
//! - an entry is either holding or waiting, never both, and it holds all of its claims or none (the
//!   grant moves it whole; there is no partial hold while waiting);
//! - no two holders conflict;
//! - a waiting entry passes an earlier waiting entry it conflicts with only by the compatible-queue
//!   bypass ([`bypass_allowed`]); everything else is FIFO, so a reader never passes a waiting writer
//!   (writer fairness). Entries that do not conflict are independent and do not wait for each other.
//!
//! Deadlock freedom within an app: a waiting entry waits only for holders or for entries queued before
//! it, and holders never wait, so the waits-for graph has no cycle.

use std::collections::{BTreeSet, VecDeque};

use super::claims::{Claims, Resource};

/// Coordinator-wide entry identity; ids only go up and are never reused.
pub(super) type EntryId = u64;

/// One operation's claims on one app.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub id: EntryId,
    /// The operation's name, for errors, snapshots and logs.
    pub operation: String,
    pub claims: Claims,
    /// The owner set `allow_compatible_queue_bypass`: while it holds, later compatible operations may
    /// pass entries it blocks (see [`bypass_allowed`]).
    pub bypass_owner: bool,
}

#[derive(Debug, Default)]
pub(super) struct AppQueue {
    holding: Vec<Entry>,
    waiting: VecDeque<Entry>,
}

impl AppQueue {
    pub fn push(&mut self, entry: Entry) {
        self.waiting.push_back(entry);
    }

    /// Removes the entry wherever it is. Answers whether it was there.
    pub fn remove(&mut self, id: EntryId) -> bool {
        if let Some(i) = self.holding.iter().position(|e| e.id == id) {
            self.holding.swap_remove(i);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|e| e.id == id) {
            self.waiting.remove(i);
            return true;
        }
        false
    }

    pub fn is_empty(&self) -> bool {
        self.holding.is_empty() && self.waiting.is_empty()
    }

    pub fn holding(&self) -> &[Entry] {
        &self.holding
    }

    pub fn waiting(&self) -> impl Iterator<Item = &Entry> {
        self.waiting.iter()
    }

    /// Moves every entry that may go now from waiting to holding, in queue order, and answers their
    /// ids. One pass suffices: granting only adds holders, which can only make other entries wait.
    pub fn grant(&mut self) -> Vec<EntryId> {
        let mut granted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.grantable(i) {
                let entry = self.waiting.remove(i).expect("index checked against len");
                granted.push(entry.id);
                self.holding.push(entry);
            } else {
                i += 1;
            }
        }
        granted
    }

    /// The waiting entry at `i` conflicts with no holder, and passes every earlier waiting entry it
    /// conflicts with by the bypass rule.
    fn grantable(&self, i: usize) -> bool {
        let entry = &self.waiting[i];
        if self
            .holding
            .iter()
            .any(|h| h.claims.conflicts_with(&entry.claims))
        {
            return false;
        }
        self.waiting
            .iter()
            .take(i)
            .filter(|queued| queued.claims.conflicts_with(&entry.claims))
            .all(|queued| bypass_allowed(&self.holding, queued, entry))
    }
}

/// The seed's compatible-queue bypass: may `later` pass `queued`, with which it conflicts?
///
/// Only while
/// 1. `queued` has direct blockers — the holders it conflicts with — and every one of them opted in
///    (`allow_compatible_queue_bypass`);
/// 2. `later` is compatible with all of those blockers;
/// 3. every domain on which `later` and `queued` conflict is owned (claimed in any mode) by those
///    blockers — so a repository session cannot reorder work in an unrelated domain such as chat
///    content.
///
/// A waiting entry is not a direct blocker: an entry queued behind another waiter inherits that
/// waiter's blockers through the rule applied to the waiter itself. Once a bypasser holds, it is a
/// direct blocker of `queued` too and it has not opted in, so further bypasses wait for it; and when
/// the owner releases, nothing opted-in blocks `queued` any more: normal writer fairness resumes.
pub(super) fn bypass_allowed(holding: &[Entry], queued: &Entry, later: &Entry) -> bool {
    let blockers: Vec<&Entry> = holding
        .iter()
        .filter(|h| h.claims.conflicts_with(&queued.claims))
        .collect();
    if blockers.is_empty() || !blockers.iter().all(|b| b.bypass_owner) {
        return false;
    }
    if blockers
        .iter()
        .any(|b| b.claims.conflicts_with(&later.claims))
    {
        return false;
    }
    let owned: BTreeSet<Resource> = blockers.iter().flat_map(|b| b.claims.domains()).collect();
    queued
        .claims
        .conflict_domains(&later.claims)
        .is_subset(&owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::claims::Resource::*;

    fn entry(id: EntryId, claims: Claims, bypass_owner: bool) -> Entry {
        Entry {
            id,
            operation: format!("op{id}"),
            claims,
            bypass_owner,
        }
    }

    fn holding_ids(q: &AppQueue) -> Vec<EntryId> {
        let mut ids: Vec<_> = q.holding().iter().map(|e| e.id).collect();
        ids.sort();
        ids
    }

    #[test]
    fn readers_share_and_a_waiting_writer_holds_back_later_readers() {
        // Two readers hold together; a writer waits; a third reader queues behind the writer.
        let mut q = AppQueue::default();
        q.push(entry(1, Claims::new().read(Metadata), false));
        q.push(entry(2, Claims::new().read(Metadata), false));
        q.push(entry(3, Claims::new().write(Metadata), false));
        q.push(entry(4, Claims::new().read(Metadata), false));
        assert_eq!(q.grant(), vec![1, 2]);
        // Releasing one reader changes nothing; releasing both lets the writer in alone.
        q.remove(1);
        assert!(q.grant().is_empty());
        q.remove(2);
        assert_eq!(q.grant(), vec![3]);
        q.remove(3);
        assert_eq!(q.grant(), vec![4]);
    }

    #[test]
    fn a_waiting_entry_holds_nothing_until_all_of_it_is_free() {
        // Entry 2 wants metadata and media; media is held, so it holds neither, and entry 3 (metadata
        // only) still waits behind it in FIFO order.
        let mut q = AppQueue::default();
        q.push(entry(1, Claims::new().write(Media), false));
        q.push(entry(2, Claims::new().write(Metadata).write(Media), false));
        q.push(entry(3, Claims::new().write(Metadata), false));
        assert_eq!(q.grant(), vec![1]);
        assert_eq!(holding_ids(&q), vec![1]);
        q.remove(1);
        assert_eq!(q.grant(), vec![2]);
    }

    #[test]
    fn bypass_needs_opted_in_blockers_owning_every_conflict() {
        let owner = entry(
            1,
            Claims::new().write(RepositoryWorktree).read(RepositoryRef),
            true,
        );
        let plain_owner = entry(1, owner.claims.clone(), false);
        let queued = entry(2, Claims::new().write(Repository), false);
        let snapshot = entry(3, Claims::new().read(RepositoryRef), false);
        assert!(bypass_allowed(
            std::slice::from_ref(&owner),
            &queued,
            &snapshot
        ));
        // The blocker did not opt in.
        assert!(!bypass_allowed(
            std::slice::from_ref(&plain_owner),
            &queued,
            &snapshot
        ));
        // The later operation conflicts with the blocker.
        let worktree_reader = entry(3, Claims::new().read(RepositoryWorktree), false);
        assert!(!bypass_allowed(
            std::slice::from_ref(&owner),
            &queued,
            &worktree_reader
        ));
        // A conflict in a domain the blocker does not own (chat content).
        let queued_chat = entry(2, Claims::new().write(Repository).write(ChatContent), false);
        let snapshot_chat = entry(
            3,
            Claims::new().read(RepositoryRef).write(ChatContent),
            false,
        );
        assert!(!bypass_allowed(
            std::slice::from_ref(&owner),
            &queued_chat,
            &snapshot_chat
        ));
        // No holder blocks the queued entry at all: nothing to bypass by.
        assert!(!bypass_allowed(&[], &queued, &snapshot));
    }
}
