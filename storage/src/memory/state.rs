//! The memory store's one locked state: the finished-run history (`runs`, the persisted policy) next to
//! the ledger's tables, and the record upsert both storage traits share.
//!
//! **Owns:** [`State`], everything [`MemoryStore`](super::MemoryStore) keeps behind its lock, and
//! [`State::put`], the one upsert of a record (SPEC §3) — `RunStore::put` and the ledger's `finish` both
//! call it, as both SQLite implementations call `records::put_in`.
//!
//! **Depends on:** [`super::live`] for the ledger's two facts a put must respect (a live run's events
//! are the ledger's; a killed id takes no record). Neither trait implementation is known here.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::live::LedgerState;
use crate::record::{apply_retention, is_valid_run_id, RunListItem, RunRecord};
use crate::store::{clamp_future, PolicyProposal, PutOutcome, StoredPolicy, TRIM_PER_PUT};
use crate::{Error, Result, RunId};

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) runs: BTreeMap<RunId, StoredRun>,
    pub(super) policy: StoredPolicy,
    /// The live-run ledger's tables (see [`super::live`]).
    pub(super) ledger: LedgerState,
}

#[derive(Debug, Clone)]
pub(super) struct StoredRun {
    pub(super) record: RunRecord,
    pub(super) bytes: u64,
    pub(super) digest: [u8; 32],
}

impl StoredRun {
    /// `record` with its size and digest: the compact JSON's bytes and their SHA-256, which a later put
    /// compares to tell an identical repeat.
    pub(super) fn new(record: RunRecord) -> Result<Self> {
        let encoded = serde_json::to_vec(&record).map_err(|e| Error::corrupt("record", e))?;
        Ok(StoredRun {
            bytes: encoded.len() as u64,
            digest: Sha256::digest(&encoded).into(),
            record,
        })
    }

    pub(super) fn item(&self) -> RunListItem {
        self.record.to_list_item(Some(self.bytes))
    }
}

impl State {
    /// The listing rows the persisted policy keeps, newest first.
    pub(super) fn kept(&self, now_ms: i64) -> Vec<RunListItem> {
        let items: Vec<RunListItem> = self.runs.values().map(StoredRun::item).collect();
        apply_retention(&items, &self.policy.policy, now_ms)
    }

    pub(super) fn visible(&self, id: &str, now_ms: i64) -> Option<&StoredRun> {
        let run = self.runs.get(id)?;
        self.kept(now_ms)
            .iter()
            .any(|i| i.head.id == id)
            .then_some(run)
    }

    fn retained(&self, now_ms: i64) -> u64 {
        self.kept(now_ms).len() as u64
    }

    /// Trim by the persisted policy, oldest first, at most [`TRIM_PER_PUT`] runs; answers the ids the
    /// policy keeps and how many went.
    pub(super) fn trim(&mut self, now_ms: i64) -> (std::collections::HashSet<RunId>, usize) {
        let kept: std::collections::HashSet<RunId> =
            self.kept(now_ms).into_iter().map(|i| i.head.id).collect();
        let mut doomed: Vec<RunListItem> = self
            .runs
            .values()
            .filter(|r| !kept.contains(&r.record.head.id))
            .map(StoredRun::item)
            .collect();
        doomed.sort_by(|a, b| crate::record::newest_first(&a.head, &b.head).reverse());
        doomed.truncate(TRIM_PER_PUT);
        for d in &doomed {
            self.runs.remove(&d.head.id);
        }
        (kept, doomed.len())
    }

    /// The one upsert of a record, shared by `put` and the ledger's `finish` (SPEC §3).
    pub(super) fn put(
        &mut self,
        record: &RunRecord,
        proposal: Option<&PolicyProposal>,
        now_ms: i64,
    ) -> Result<PutOutcome> {
        if !is_valid_run_id(&record.head.id) {
            return Err(Error::InvalidRecord(crate::record::RecordError::BadId));
        }
        let st = self;
        // A killed id takes no record ever again (SPEC §4.3 `kill`).
        if st.ledger.is_killed(&record.head.id) {
            return Ok(PutOutcome {
                stored: false,
                rewritten: false,
                retained: st.retained(now_ms),
            });
        }
        st.policy.consider(proposal, now_ms);
        let mut record = clamp_future(record, now_ms);
        let id = record.head.id.clone();
        if record.head.provisional && st.runs.get(&id).is_some_and(|r| !r.record.head.provisional) {
            return Ok(PutOutcome {
                stored: true,
                rewritten: false,
                retained: st.retained(now_ms),
            });
        }
        // A live run's events are the ledger's: a put while it lives writes only the runs row.
        if st.ledger.is_live(&id) {
            record.events.clear();
        }
        let run = StoredRun::new(record)?;
        let existing = st.runs.get(&id).map(|r| r.digest);
        let unchanged = existing == Some(run.digest);
        if !unchanged {
            st.runs.insert(id.clone(), run);
        }
        let (kept, _) = st.trim(now_ms);
        let stored = kept.contains(&id);
        if !stored {
            st.runs.remove(&id);
        }
        Ok(PutOutcome {
            stored,
            rewritten: existing.is_some() && !unchanged,
            retained: kept.len() as u64,
        })
    }
}
