//! The record contract: what a finished run looks like on disk and on the wire, and the pure rules
//! every store and writer applies to it (SPEC §2, seed items 1–6).
//!
//! Owns:
//! - the shapes [`RunRecord`], [`RunHead`] (a record minus its events) and [`RunListItem`] (a head
//!   plus the stored size), with camelCase JSON;
//! - the structural validators [`validate_record`] and [`validate_list_item`], the one gate every
//!   reader passes stored JSON through;
//! - retention ([`RetentionPolicy`], [`apply_retention`], the shared total order [`newest_first`]);
//! - the byte budget ([`fit_record_to_budget`], and [`cap_event_for_publish`] for one event);
//! - the visibility filter ([`VisibilityFilter`]), the authorization predicate in wire form.
//!
//! Who uses it: the history writer fits and validates a record before `put`; every `RunStore`
//! implementation validates what it reads back and runs the same retention; the read side checks
//! rows against a caller's `VisibilityFilter` and the SQLite store compiles the same filter to SQL.
//!
//! Invariants:
//! - Pure: no I/O, no clock (callers pass `now_ms`), no randomness. Sizes are UTF-8 bytes of the
//!   compact JSON encoding, the same bytes a store writes.
//! - An older reader accepts a newer record: fields this version does not know, on the record and on
//!   each event, ride through verbatim in [`RunHead::extra`] and in the event objects.
//! - A stored row without `channelVisibility` reads [`ChannelVisibility::Unknown`], never public.
//! - Inputs are never mutated: every function here takes shared references and returns new values.
//! - A malformed visibility filter is an error, never "all".
//!
//! What it deliberately does not do: seed fields SPEC §2 does not keep (`restarting`, `seed`,
//! `failure`, `route`, review and coding artifacts, span records) have no typed meaning here; they
//! are carried as unknown fields and never validated.
//!
//! # Layout
//! Every item is re-exported here, so callers name `storage::record::X` whatever file holds it.
//! Dependencies point one way: `model` is the base; `validate`, `retention` and `budget` build on it;
//! `visibility` builds on `model` and borrows `validate`'s error-message clipping.
//! - `model`: the shapes and their vocabulary (`RunStatus`, `ChannelVisibility`, `Diagnosis`), event
//!   seqs, and the compact-JSON size every other part measures with;
//! - `validate`: the run-id shape and the validators (`RecordError`);
//! - `retention`: `RetentionPolicy`, its clamp and cutoff, `newest_first`, `apply_retention`;
//! - `budget`: the per-event cap and the whole-record byte budget;
//! - `visibility`: `VisibilityFilter`, its bounded parse (`FilterError`) and its one truth table.

mod budget;
mod event;
mod model;
mod retention;
mod validate;
mod visibility;

#[cfg(test)]
mod fixtures;

pub use budget::{cap_event_for_publish, fit_record_to_budget, MAX_EVENT_BYTES, MAX_RECORD_BYTES};
pub use event::{InputOrigin, RunEvent, Stamp};
pub use model::{
    event_seq, input_event, stored_event_seqs, CategoryStat, ChannelVisibility, Diagnosis,
    InputSource, RunHead, RunListItem, RunRecord, RunStatus, CARD, CARD_CLOSED,
    DIAGNOSIS_CATEGORIES,
};
pub use retention::{apply_retention, newest_first, RetentionPolicy};
pub use validate::{
    into_record, is_valid_run_id, validate_list_item, validate_record, RecordError,
};
pub use visibility::{FilterError, VisibilityFilter, MAX_FILTER_DEPTH, MAX_FILTER_LEAVES};
