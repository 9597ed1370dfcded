//! A process's registry of its runs' events, as `actors::registry::Registry` keeps them for records:
//! seqs stamped per run (a replay keeps its seqs, the counter continues past them), `at` from the clock,
//! events capped at publish. No subscribers and no redaction (simulated events carry no secrets), and no
//! regex set compiled per process — which is why the simulator keeps its own.

use std::collections::{BTreeMap, BTreeSet};

use actors::registry::RunMeta;
use actors::run::{assemble_record, RecordExtras};
use serde_json::{json, Value};
use storage::record::{RunRecord, RunStatus};

pub struct Row {
    pub meta: RunMeta,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    /// The record's `eventCount`: the highest seq published.
    pub event_count: u64,
    last_seq: u64,
    pub events: Vec<Value>,
}

#[derive(Default)]
pub struct SimRegistry {
    runs: BTreeMap<String, Row>,
}

impl SimRegistry {
    /// Create (or re-create, on resume) a run's row: `replay` keeps its seqs; the counter continues at
    /// `next_seq` (at least one past the highest replayed).
    pub fn create(
        &mut self,
        id: &str,
        meta: RunMeta,
        started_at: i64,
        replay: Vec<Value>,
        next_seq: u64,
    ) {
        let highest = replay
            .iter()
            .filter_map(storage::record::event_seq)
            .max()
            .unwrap_or(0);
        let row = Row {
            meta,
            started_at,
            finished_at: None,
            event_count: highest,
            last_seq: highest.max(next_seq.saturating_sub(1)),
            events: replay,
        };
        self.runs.insert(id.to_owned(), row);
    }

    /// Stamp `event` with the next seq and `at`; answers the stamped event (`None` for an unknown run).
    pub fn publish(&mut self, id: &str, mut event: Value, now: i64) -> Option<Value> {
        let row = self.runs.get_mut(id)?;
        row.last_seq += 1;
        event["seq"] = json!(row.last_seq);
        event["at"] = json!(now);
        let event = storage::record::cap_event_for_publish(event);
        row.event_count = row.last_seq;
        row.events.push(event.clone());
        Some(event)
    }

    pub fn row(&self, id: &str) -> Option<&Row> {
        self.runs.get(id)
    }

    pub fn last_seq(&self, id: &str) -> Option<u64> {
        self.runs.get(id).map(|r| r.last_seq)
    }

    pub fn finish(&mut self, id: &str, finished_at: i64) {
        if let Some(r) = self.runs.get_mut(id) {
            r.finished_at = Some(finished_at);
        }
    }

    pub fn discard(&mut self, id: &str) {
        self.runs.remove(id);
    }

    /// Runs not finished here.
    pub fn unfinished(&self) -> BTreeSet<String> {
        self.runs
            .iter()
            .filter(|(_, r)| r.finished_at.is_none())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// A record from the run's row and events (`run::build_record`).
    pub fn build_record(
        &self,
        id: &str,
        status: RunStatus,
        finished_at: i64,
        extras: RecordExtras,
    ) -> Option<RunRecord> {
        let row = self.runs.get(id)?;
        assemble_record(
            id,
            &row.meta,
            row.started_at,
            finished_at,
            status,
            row.events.clone(),
            row.event_count,
            false,
            extras,
        )
    }
}
