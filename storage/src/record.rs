//! The record contract: what a finished run looks like on disk and on the wire, and the pure rules
//! every store and writer applies to it (SPEC §2, seed items 1–6).
//!
//! Owns:
//! - the shapes [`RunRecord`], [`RunHead`] (a record minus its events) and [`RunListItem`] (a head
//!   plus the stored size), with camelCase JSON;
//! - the structural validators [`validate_record`] and [`validate_list_item`], the one gate every
//!   reader passes stored JSON through;
//! - retention ([`RetentionPolicy`], [`apply_retention`], the shared total order [`newest_first`]);
//! - the byte budget ([`fit_record_to_budget`]);
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

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The whole-record budget: a stored record's JSON never exceeds 1.5 MiB.
pub const MAX_RECORD_BYTES: usize = 1_572_864;
/// The per-event cap: one event's JSON never exceeds 64 KiB after [`fit_record_to_budget`].
pub const MAX_EVENT_BYTES: usize = 65_536;

/// The longest run id; ids are path and SQL safe by construction (`^[A-Za-z0-9_-]{1,64}$`).
const MAX_RUN_ID_LEN: usize = 64;
/// The ellipsis that marks a capped `text` or `summary` (U+2026, three UTF-8 bytes, never escaped).
const ELLIPSIS: &str = "\u{2026}";
/// Event types whose content is `text`; every other type is capped on `summary`.
const TEXT_EVENT_TYPES: [&str; 4] = ["input", "context", "assistant", "answer"];
/// How much of an offending value an error message repeats, so a hostile row cannot bloat logs.
const ECHO_CHARS: usize = 64;
const MS_PER_DAY: i64 = 86_400_000;

/// Whether `id` has the run-id shape `^[A-Za-z0-9_-]{1,64}$`.
///
/// Ids appear in URLs, file names and SQL, so the shape is what makes them safe to interpolate
/// (`../../etc/x` and the empty string are refused).
pub fn is_valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RUN_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// How a run ended. Every finished record carries exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The agent produced its answer.
    Completed,
    /// A soft stop was honoured at a step boundary.
    StoppedSoft,
    /// A hard stop cut the run mid-step.
    StoppedHard,
    /// The run ended on an error.
    Failed,
    /// The run was cut down before finish (crash, replacement, drain deadline); the provisional
    /// tombstone and the drain-deadline write are its only writers.
    Interrupted,
}

impl RunStatus {
    /// Every status, in wire order.
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Completed,
        RunStatus::StoppedSoft,
        RunStatus::StoppedHard,
        RunStatus::Failed,
        RunStatus::Interrupted,
    ];

    /// The wire (and SQL column) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Completed => "completed",
            RunStatus::StoppedSoft => "stopped_soft",
            RunStatus::StoppedHard => "stopped_hard",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }

    /// The status spelled `s` on the wire, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == s)
    }
}

/// The channel's visibility as the directory reported it at dispatch; what authorization reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelVisibility {
    Public,
    Private,
    Dm,
    /// Machine callers (HTTP API, CLI): no human channel behind the run.
    Machine,
    /// Not known. The default, so a row written before the stamp existed never reads as public.
    #[default]
    Unknown,
}

impl ChannelVisibility {
    /// Every visibility, in wire order.
    pub const ALL: [ChannelVisibility; 5] = [
        ChannelVisibility::Public,
        ChannelVisibility::Private,
        ChannelVisibility::Dm,
        ChannelVisibility::Machine,
        ChannelVisibility::Unknown,
    ];

    /// The wire (and SQL column) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelVisibility::Public => "public",
            ChannelVisibility::Private => "private",
            ChannelVisibility::Dm => "dm",
            ChannelVisibility::Machine => "machine",
            ChannelVisibility::Unknown => "unknown",
        }
    }

    /// The visibility spelled `s` on the wire, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// The friction categories v1 diagnoses. Readers zero-fill missing ones and drop unknown ones, so
/// adding a category never invalidates a stored record.
pub const DIAGNOSIS_CATEGORIES: [&str; 5] = ["model", "tool", "storage", "wait", "retry"];

/// Totals for one friction category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CategoryStat {
    pub count: u64,
    pub duration_ms: u64,
}

/// Where a run spent its friction, per category. Kept on the list item too, so the friction
/// ledger is served from a listing without loading events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnosis {
    pub by_category: BTreeMap<String, CategoryStat>,
}

impl Diagnosis {
    /// Exactly the v1 categories: missing ones zero-filled, unknown ones dropped.
    pub fn normalized(self) -> Self {
        let mut by_category = self.by_category;
        let by_category = DIAGNOSIS_CATEGORIES
            .iter()
            .map(|name| {
                let stat = by_category.remove(*name).unwrap_or_default();
                ((*name).to_owned(), stat)
            })
            .collect();
        Diagnosis { by_category }
    }
}

impl Default for Diagnosis {
    /// All five categories at zero.
    fn default() -> Self {
        Diagnosis {
            by_category: BTreeMap::new(),
        }
        .normalized()
    }
}

/// Everything a record and a listing row share (record minus events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunHead {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub channel_id: String,
    pub user_id: String,
    pub thread_key: String,
    /// Absent on rows written before the stamp existed; such rows read `unknown`, never public.
    #[serde(default)]
    pub channel_visibility: ChannelVisibility,
    /// Epoch ms.
    pub started_at: i64,
    /// Epoch ms; the retention and listing order key.
    pub finished_at: i64,
    /// Epoch ms the triggering message was received (tracing stamp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_at: Option<i64>,
    /// Epoch ms the record was sealed (tracing stamp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_at: Option<i64>,
    /// Whether the reply reached the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_ok: Option<bool>,
    /// Why the reply did (not) arrive, e.g. "no channel to deliver to".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_note: Option<String>,
    /// The registry's content-event count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_count: Option<u64>,
    pub status: RunStatus,
    /// What the run published.
    pub event_count: u64,
    /// `events.len()` of the stored record.
    pub stored_event_count: u64,
    /// Whether events were dropped (by the registry backlog or the byte budget).
    pub truncated: bool,
    #[serde(default)]
    pub diagnosis: Diagnosis,
    /// The tombstone / drain-deadline stamp: "no finish recorded yet". On the wire present only as
    /// `true`, so a final write never carries it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provisional: bool,
    /// The run that spawned this one, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// Fields this version does not know ride through verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A finished run as stored: its head plus the (possibly budget-trimmed) event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    #[serde(flatten)]
    pub head: RunHead,
    /// Each event is `{type, seq, at, …}`; kept as JSON so unknown event types and fields ride
    /// through verbatim.
    pub events: Vec<Value>,
}

/// A listing row: the record minus events, plus the stored JSON size when the store knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunListItem {
    #[serde(flatten)]
    pub head: RunHead,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl RunRecord {
    /// The listing row for this record. `bytes` is the listing's own field, so a stray `bytes`
    /// key riding in `extra` is left out rather than written twice.
    pub fn to_list_item(&self, bytes: Option<u64>) -> RunListItem {
        let mut head = self.head.clone();
        head.extra.remove("bytes");
        RunListItem { head, bytes }
    }

    /// The size of this record's compact JSON encoding in bytes, measured without building it.
    pub fn encoded_len(&self) -> usize {
        json_len(self)
    }
}

/// The registry's `seq` stamp of an event, if it carries a whole non-negative one.
pub fn event_seq(event: &Value) -> Option<u64> {
    event.get("seq").and_then(whole_u64)
}

/// The seq of every stored event, for cursors (`afterSeq`) and SSE ids.
///
/// The registry's stamps when every event has one and they strictly increase; otherwise (a record
/// whose events arrived without usable stamps) 1-based positions `1..=n` for every event, never a
/// mix, so a cursor over the result is always strictly increasing. 1-based because cursors start
/// at `afterSeq = 0`.
pub fn stored_event_seqs(events: &[Value]) -> Vec<u64> {
    let stamps: Option<Vec<u64>> = events.iter().map(event_seq).collect();
    match stamps {
        Some(seqs) if seqs.windows(2).all(|w| w[0] < w[1]) => seqs,
        _ => (1..=events.len() as u64).collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// Why stored or submitted JSON is not a record; each variant names the offending field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("{what} is not a json object")]
    NotObject { what: &'static str },
    #[error("missing field {field}")]
    Missing { field: &'static str },
    #[error("field {field} {why}")]
    Field {
        field: &'static str,
        why: &'static str,
    },
    /// `id` is not run-id shaped (a unit variant: stores refuse a bad id before anything else).
    #[error("field id is not a run id (1 to 64 of A-Z, a-z, 0-9, _ and -)")]
    BadId,
    #[error("field parentRunId is not a run id (1 to 64 of A-Z, a-z, 0-9, _ and -)")]
    BadParentId,
    #[error("unknown status {0:?}")]
    UnknownStatus(String),
    #[error("unknown channel visibility {0:?}")]
    UnknownVisibility(String),
    #[error("event {index} {why}")]
    Event { index: usize, why: &'static str },
    #[error("diagnosis category {category:?} {why}")]
    DiagnosisCategory { category: String, why: &'static str },
}

const MUST_BE_STRING: &str = "must be a string";
const MUST_BE_BOOL: &str = "must be a boolean";
const MUST_BE_WHOLE: &str = "must be a whole number";
const MUST_BE_COUNT: &str = "must be a whole number >= 0";

/// Head fields this version knows; everything else on a record rides in [`RunHead::extra`].
const HEAD_FIELDS: [&str; 22] = [
    "id",
    "label",
    "agent",
    "model",
    "channelId",
    "userId",
    "threadKey",
    "channelVisibility",
    "startedAt",
    "finishedAt",
    "receivedAt",
    "sealedAt",
    "replyOk",
    "replyNote",
    "stepCount",
    "status",
    "eventCount",
    "storedEventCount",
    "truncated",
    "diagnosis",
    "provisional",
    "parentRunId",
];

/// Validate stored or submitted JSON as a record and read it the way every reader must.
///
/// Checks SPEC §2: run-id-shaped `id`; string identity (`channelId, userId, threadKey`); whole-number
/// timing (`startedAt, finishedAt`, and `receivedAt, sealedAt` when present); non-negative counts;
/// one of the five statuses; `events` an array of objects each with a string `type`; boolean
/// `truncated`; a structural diagnosis; `provisional` literally `true` when present; a known
/// `channelVisibility` when present; a run-id-shaped `parentRunId` when present; typed optional
/// stamps. Optional fields are either absent or typed: `null` is a wrong type, not "absent".
///
/// Reading normalizes: a missing `channelVisibility` reads `unknown`, the diagnosis is
/// [`Diagnosis::normalized`] (a missing diagnosis reads all zero), and unknown fields land in
/// [`RunHead::extra`] untouched.
pub fn validate_record(v: &Value) -> Result<RunRecord, RecordError> {
    let obj = v
        .as_object()
        .ok_or(RecordError::NotObject { what: "record" })?;
    let head = parse_head(obj, &["events"])?;
    let events = match obj.get("events") {
        None => return Err(RecordError::Missing { field: "events" }),
        Some(Value::Array(events)) => events,
        Some(_) => {
            return Err(RecordError::Field {
                field: "events",
                why: "must be an array",
            })
        }
    };
    for (index, event) in events.iter().enumerate() {
        let event = event.as_object().ok_or(RecordError::Event {
            index,
            why: "is not a json object",
        })?;
        if !matches!(event.get("type"), Some(Value::String(_))) {
            return Err(RecordError::Event {
                index,
                why: "has no string type",
            });
        }
    }
    Ok(RunRecord {
        head,
        events: events.clone(),
    })
}

/// Validate a listing row: the record checks minus events, plus an optional whole `bytes`.
///
/// An `events` key, if a caller passes a whole record, is dropped: a listing row never carries
/// events.
pub fn validate_list_item(v: &Value) -> Result<RunListItem, RecordError> {
    let obj = v
        .as_object()
        .ok_or(RecordError::NotObject { what: "list item" })?;
    let head = parse_head(obj, &["events", "bytes"])?;
    let bytes = Fields(obj).opt_u64("bytes")?;
    Ok(RunListItem { head, bytes })
}

/// Read the head fields of `obj`; keys in `handled_elsewhere` are the caller's and are neither
/// read nor carried in `extra`.
fn parse_head(
    obj: &Map<String, Value>,
    handled_elsewhere: &[&str],
) -> Result<RunHead, RecordError> {
    let f = Fields(obj);
    let id = f.req_str("id")?;
    if !is_valid_run_id(&id) {
        return Err(RecordError::BadId);
    }
    let channel_id = f.req_str("channelId")?;
    let user_id = f.req_str("userId")?;
    let thread_key = f.req_str("threadKey")?;
    let started_at = f.req_i64("startedAt")?;
    let finished_at = f.req_i64("finishedAt")?;
    let status = f.req_str_ref("status")?;
    let status =
        RunStatus::parse(status).ok_or_else(|| RecordError::UnknownStatus(echo(status)))?;
    let event_count = f.req_u64("eventCount")?;
    let stored_event_count = f.req_u64("storedEventCount")?;
    let truncated = f.req_bool("truncated")?;
    let channel_visibility = match f.opt_str_ref("channelVisibility")? {
        None => ChannelVisibility::Unknown,
        Some(s) => {
            ChannelVisibility::parse(s).ok_or_else(|| RecordError::UnknownVisibility(echo(s)))?
        }
    };
    let provisional = match obj.get("provisional") {
        None => false,
        Some(Value::Bool(true)) => true,
        Some(_) => {
            return Err(RecordError::Field {
                field: "provisional",
                why: "must be literally true when present",
            })
        }
    };
    let parent_run_id = f.opt_str("parentRunId")?;
    if let Some(parent) = &parent_run_id {
        if !is_valid_run_id(parent) {
            return Err(RecordError::BadParentId);
        }
    }
    let diagnosis = match obj.get("diagnosis") {
        None => Diagnosis::default(),
        Some(d) => parse_diagnosis(d)?,
    };
    let extra = obj
        .iter()
        .filter(|(k, _)| {
            !HEAD_FIELDS.contains(&k.as_str()) && !handled_elsewhere.contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(RunHead {
        id,
        label: f.opt_str("label")?,
        agent: f.opt_str("agent")?,
        model: f.opt_str("model")?,
        channel_id,
        user_id,
        thread_key,
        channel_visibility,
        started_at,
        finished_at,
        received_at: f.opt_i64("receivedAt")?,
        sealed_at: f.opt_i64("sealedAt")?,
        reply_ok: f.opt_bool("replyOk")?,
        reply_note: f.opt_str("replyNote")?,
        step_count: f.opt_u64("stepCount")?,
        status,
        event_count,
        stored_event_count,
        truncated,
        diagnosis,
        provisional,
        parent_run_id,
        extra,
    })
}

/// A structural diagnosis `{byCategory: {name: {count, durationMs}}}`, normalized.
///
/// Structural, not the current category list: unknown categories are accepted (then dropped by
/// normalization). Totals must be non-negative numbers; a fractional total (a writer summing
/// fractional timings) is floored rather than refused. Other keys are not part of v1's diagnosis
/// and are not kept.
fn parse_diagnosis(d: &Value) -> Result<Diagnosis, RecordError> {
    let obj = d
        .as_object()
        .ok_or(RecordError::NotObject { what: "diagnosis" })?;
    let categories = match obj.get("byCategory") {
        None => {
            return Err(RecordError::Missing {
                field: "diagnosis.byCategory",
            })
        }
        Some(Value::Object(c)) => c,
        Some(_) => {
            return Err(RecordError::Field {
                field: "diagnosis.byCategory",
                why: "must be an object",
            })
        }
    };
    let mut by_category = BTreeMap::new();
    for (name, stat) in categories {
        let bad = |why| RecordError::DiagnosisCategory {
            category: echo(name),
            why,
        };
        let stat = stat
            .as_object()
            .ok_or_else(|| bad("is not a json object"))?;
        let total = |key: &str, why| {
            stat.get(key)
                .and_then(Value::as_f64)
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(|x| x.floor() as u64)
                .ok_or_else(|| bad(why))
        };
        let count = total("count", "needs a number count >= 0")?;
        let duration_ms = total("durationMs", "needs a number durationMs >= 0")?;
        by_category.insert(name.clone(), CategoryStat { count, duration_ms });
    }
    Ok(Diagnosis { by_category }.normalized())
}

/// Typed reads of one JSON object's fields, each error naming the field.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn req(&self, field: &'static str) -> Result<&'a Value, RecordError> {
        self.0.get(field).ok_or(RecordError::Missing { field })
    }

    fn typed<T>(
        &self,
        field: &'static str,
        why: &'static str,
        read: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, RecordError> {
        match self.0.get(field) {
            None => Ok(None),
            Some(v) => read(v).map(Some).ok_or(RecordError::Field { field, why }),
        }
    }

    fn req_str_ref(&self, field: &'static str) -> Result<&'a str, RecordError> {
        self.req(field)?;
        self.opt_str_ref(field)?
            .ok_or(RecordError::Missing { field })
    }

    fn opt_str_ref(&self, field: &'static str) -> Result<Option<&'a str>, RecordError> {
        self.typed(field, MUST_BE_STRING, Value::as_str)
    }

    fn req_str(&self, field: &'static str) -> Result<String, RecordError> {
        self.req_str_ref(field).map(str::to_owned)
    }

    fn opt_str(&self, field: &'static str) -> Result<Option<String>, RecordError> {
        Ok(self.opt_str_ref(field)?.map(str::to_owned))
    }

    fn req_i64(&self, field: &'static str) -> Result<i64, RecordError> {
        self.req(field)?;
        self.opt_i64(field)?.ok_or(RecordError::Missing { field })
    }

    fn opt_i64(&self, field: &'static str) -> Result<Option<i64>, RecordError> {
        self.typed(field, MUST_BE_WHOLE, whole_i64)
    }

    fn req_u64(&self, field: &'static str) -> Result<u64, RecordError> {
        self.req(field)?;
        self.opt_u64(field)?.ok_or(RecordError::Missing { field })
    }

    fn opt_u64(&self, field: &'static str) -> Result<Option<u64>, RecordError> {
        self.typed(field, MUST_BE_COUNT, whole_u64)
    }

    fn req_bool(&self, field: &'static str) -> Result<bool, RecordError> {
        self.req(field)?;
        self.opt_bool(field)?.ok_or(RecordError::Missing { field })
    }

    fn opt_bool(&self, field: &'static str) -> Result<Option<bool>, RecordError> {
        self.typed(field, MUST_BE_BOOL, Value::as_bool)
    }
}

/// Largest integer a JSON writer using doubles (the seed's TypeScript) represents exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// A whole number: an integer, or a float with no fraction within the exactly-representable range
/// (a writer using doubles may emit `1.0`).
fn whole_i64(v: &Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let x = v.as_f64()?;
    (x.fract() == 0.0 && x.abs() <= MAX_SAFE_INTEGER).then_some(x as i64)
}

/// A whole number >= 0 (see [`whole_i64`]).
fn whole_u64(v: &Value) -> Option<u64> {
    if let Some(u) = v.as_u64() {
        return Some(u);
    }
    let x = v.as_f64()?;
    (x.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER).contains(&x)).then_some(x as u64)
}

/// At most [`ECHO_CHARS`] of an offending value, for an error message.
fn echo(s: &str) -> String {
    s.chars().take(ECHO_CHARS).collect()
}

// ---------------------------------------------------------------------------------------------
// Retention
// ---------------------------------------------------------------------------------------------

/// How long and how much finished history a store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionPolicy {
    pub retention_days: u32,
    pub max_runs: u32,
    pub max_bytes: u64,
}

const DAYS_BOUNDS: (u32, u32) = (1, 365);
const RUNS_BOUNDS: (u32, u32) = (1, 20_000);
const BYTES_BOUNDS: (u64, u64) = (16 * 1024 * 1024, 8 * 1024 * 1024 * 1024);

impl Default for RetentionPolicy {
    /// `{30 days, 5000 runs, 2 GiB}`.
    fn default() -> Self {
        RetentionPolicy {
            retention_days: 30,
            max_runs: 5_000,
            max_bytes: 2 * 1024 * 1024 * 1024,
        }
    }
}

impl RetentionPolicy {
    /// A policy from untrusted numbers (config, a caller's proposal): a non-finite value takes the
    /// default, fractions are floored, and each value is clamped to its bounds (days [1, 365], runs
    /// [1, 20000], bytes [16 MiB, 8 GiB]) so no proposal can disable retention or grow it unbounded.
    pub fn clamp(days: f64, runs: f64, bytes: f64) -> Self {
        let default = Self::default();
        let fit = |x: f64, default: f64, (lo, hi): (f64, f64)| {
            if x.is_finite() {
                x.floor().clamp(lo, hi)
            } else {
                default
            }
        };
        let days = fit(
            days,
            f64::from(default.retention_days),
            (f64::from(DAYS_BOUNDS.0), f64::from(DAYS_BOUNDS.1)),
        );
        let runs = fit(
            runs,
            f64::from(default.max_runs),
            (f64::from(RUNS_BOUNDS.0), f64::from(RUNS_BOUNDS.1)),
        );
        let bytes = fit(
            bytes,
            default.max_bytes as f64,
            (BYTES_BOUNDS.0 as f64, BYTES_BOUNDS.1 as f64),
        );
        // The values are whole and within u32/u64 range after the clamp, so the casts are exact.
        RetentionPolicy {
            retention_days: days as u32,
            max_runs: runs as u32,
            max_bytes: bytes as u64,
        }
    }

    /// The expiry line: a run whose `finishedAt` is strictly before it has expired.
    pub fn cutoff_ms(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(i64::from(self.retention_days).saturating_mul(MS_PER_DAY))
    }
}

/// The one listing order: `finishedAt` desc, then `id` desc. A total order over distinct ids, so
/// both sides of a cut (retention, cursor pages) agree on which row falls where.
pub fn newest_first(a: &RunHead, b: &RunHead) -> Ordering {
    b.finished_at
        .cmp(&a.finished_at)
        .then_with(|| b.id.cmp(&a.id))
}

/// The rows a store keeps under `policy` at `now_ms`, newest first.
///
/// Drops rows finished before the cutoff, keeps the newest `maxRuns` by [`newest_first`], then
/// drops the oldest while the cumulative `bytes` exceeds `maxBytes` (a row without `bytes` counts
/// 0). The input is never mutated.
pub fn apply_retention(
    items: &[RunListItem],
    policy: &RetentionPolicy,
    now_ms: i64,
) -> Vec<RunListItem> {
    let cutoff = policy.cutoff_ms(now_ms);
    let mut kept: Vec<&RunListItem> = items
        .iter()
        .filter(|item| item.head.finished_at >= cutoff)
        .collect();
    kept.sort_by(|a, b| newest_first(&a.head, &b.head));
    kept.truncate(policy.max_runs as usize);
    let mut total: u64 = 0;
    let within_bytes = kept
        .iter()
        .take_while(|item| {
            total = total.saturating_add(item.bytes.unwrap_or(0));
            total <= policy.max_bytes
        })
        .count();
    kept.truncate(within_bytes);
    kept.into_iter().cloned().collect()
}

// ---------------------------------------------------------------------------------------------
// Byte budget
// ---------------------------------------------------------------------------------------------

/// `record` fitted to `max_bytes` of JSON (SPEC §2 byte budget). The input is never mutated.
///
/// 1. Every event is capped to [`MAX_EVENT_BYTES`] by truncating its `text` (types `input`,
///    `context`, `assistant`, `answer`) or `summary` (every other type) and appending `…`. The cut
///    is measured in bytes of the JSON encoding (UTF-8, escapes included) and never splits a
///    character. An event whose size lies elsewhere (no such string field) is left whole; step 2
///    still bounds the record.
/// 2. If the record is still over `max_bytes`, events are dropped from the middle: a head and a
///    tail are grown alternately from the two ends (head first) until the next event would not fit,
///    so the request and first steps and the terminal notes survive. The result has
///    `truncated: true`, `eventCount` unchanged and `storedEventCount = events.len()`.
///
/// A record that fits after step 1 keeps every event and its `truncated` and counts as they were.
///
/// # Design
/// Each event is serialized once (into a byte counter, not a buffer) to learn its size; the record
/// size is then arithmetic — the head without events, plus event sizes, plus one comma between
/// neighbours — so a multi-megabyte record is fitted in one pass. Uncapped events are borrowed
/// until chosen, so dropped ones are never copied.
pub fn fit_record_to_budget(record: &RunRecord, max_bytes: usize) -> RunRecord {
    let (capped, sizes): (Vec<Cow<'_, Value>>, Vec<usize>) =
        record.events.iter().map(cap_event).unzip();
    let n = capped.len();
    let events_len = |count: usize, sum: usize| sum + count.saturating_sub(1);

    let shell = |head: &RunHead| {
        json_len(&RunRecord {
            head: head.clone(),
            events: Vec::new(),
        })
    };
    let total = shell(&record.head) + events_len(n, sizes.iter().sum());
    if total <= max_bytes {
        return RunRecord {
            head: record.head.clone(),
            events: capped.into_iter().map(Cow::into_owned).collect(),
        };
    }

    // Size the shell with `storedEventCount = n`: the kept count is at most n, so it has no more
    // digits, and the shell is an upper bound for the final one.
    let mut head = record.head.clone();
    head.truncated = true;
    head.stored_event_count = n as u64;
    let budget = max_bytes.saturating_sub(shell(&head));

    let (mut lo, mut hi) = (0, n); // keep capped[..lo] and capped[hi..]
    let (mut used, mut kept) = (0usize, 0usize);
    let mut head_turn = true;
    while lo < hi {
        let index = if head_turn { lo } else { hi - 1 };
        let cost = sizes[index] + usize::from(kept > 0);
        if used + cost > budget {
            break;
        }
        used += cost;
        kept += 1;
        if head_turn {
            lo += 1;
        } else {
            hi -= 1;
        }
        head_turn = !head_turn;
    }

    let events: Vec<Value> = capped
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i < lo || *i >= hi)
        .map(|(_, e)| e.into_owned())
        .collect();
    head.stored_event_count = events.len() as u64;
    let fitted = RunRecord { head, events };
    debug_assert!(fitted.events.is_empty() || fitted.encoded_len() <= max_bytes);
    fitted
}

/// `,"truncated":true`, as serde_json writes it into an object.
const TRUNCATED_FLAG: &str = ",\"truncated\":true";

/// `event` capped to [`MAX_EVENT_BYTES`] the way a run publishes it (SPEC §2, §4.3 `append`): the text
/// (or summary) field cut with `…` and `truncated: true`; an event that fits is returned untouched.
pub fn cap_event_for_publish(event: Value) -> Value {
    match cap_event(&event).0 {
        Cow::Borrowed(_) => event,
        Cow::Owned(capped) => capped,
    }
}

/// One event capped to [`MAX_EVENT_BYTES`], with its encoded size. Borrowed when untouched.
fn cap_event(event: &Value) -> (Cow<'_, Value>, usize) {
    let size = json_len(event);
    if size <= MAX_EVENT_BYTES {
        return (Cow::Borrowed(event), size);
    }
    let field = match event.get("type").and_then(Value::as_str) {
        Some(t) if TEXT_EVENT_TYPES.contains(&t) => "text",
        _ => "summary",
    };
    let Some(content) = event.get(field).and_then(Value::as_str) else {
        return (Cow::Borrowed(event), size);
    };
    // The event with `field` set to "" (and the `truncated` flag) weighs `size - encoded(content) + 2 + flag`.
    let flag = if event.get("truncated") == Some(&Value::Bool(true)) { 0 } else { TRUNCATED_FLAG.len() };
    let without = size - json_len(content) + 2 + flag;
    let room = MAX_EVENT_BYTES.saturating_sub(without + ELLIPSIS.len());
    let mut cut = 0;
    let mut spent = 0;
    for (i, c) in content.char_indices() {
        let len = escaped_len(c);
        if spent + len > room {
            break;
        }
        spent += len;
        cut = i + c.len_utf8();
    }
    let mut capped = event.clone();
    if let Some(slot) = capped.get_mut(field) {
        *slot = Value::String(format!("{}{ELLIPSIS}", &content[..cut]));
    }
    capped["truncated"] = Value::Bool(true);
    let capped_size = without + spent + ELLIPSIS.len();
    debug_assert_eq!(capped_size, json_len(&capped));
    (Cow::Owned(capped), capped_size)
}

/// Bytes `c` takes inside a JSON string as serde_json writes it: `"` and `\` and the C0 controls
/// are escaped (short forms for the common ones, `\u00XX` otherwise); everything else is raw
/// UTF-8.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{08}' | '\u{0C}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// An `io::Write` that only counts, so sizes are measured without allocating the encoding.
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes of the compact JSON encoding of `value`.
fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut counter = ByteCounter(0);
    serde_json::to_writer(&mut counter, value)
        .expect("records and json values always serialize: string keys, finite numbers");
    counter.0
}

// ---------------------------------------------------------------------------------------------
// Visibility filter
// ---------------------------------------------------------------------------------------------

/// Which runs a caller may see: the authorization predicate in wire form (SPEC §2).
///
/// JSON: `{"kind":"all"} | {"kind":"none"} | {"kind":"channels-in","ids":[…]} |
/// {"kind":"user-is","id":…} | {"kind":"visibility-in","values":[…]} | {"kind":"or","of":[…]} |
/// {"kind":"and","of":[…]}`. Bounded to [`MAX_FILTER_DEPTH`] levels and [`MAX_FILTER_LEAVES`]
/// leaf values so the SQL it compiles to has a bounded number of parameters.
///
/// Build one from untrusted JSON with [`VisibilityFilter::parse`]; a value obtained through serde
/// directly (config) must pass [`VisibilityFilter::validate`] before use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum VisibilityFilter {
    /// Every run.
    All,
    /// No run (the default for a token without a filter).
    None,
    /// Runs in one of these channels.
    ChannelsIn { ids: Vec<String> },
    /// Runs started by this user.
    UserIs { id: String },
    /// Runs whose channel has one of these visibilities.
    VisibilityIn { values: Vec<ChannelVisibility> },
    /// Any of; empty matches nothing.
    Or { of: Vec<VisibilityFilter> },
    /// All of; empty matches nothing (an empty conjunction never grants everything).
    And { of: Vec<VisibilityFilter> },
}

/// Deepest nesting allowed; a leaf alone has depth 1.
pub const MAX_FILTER_DEPTH: usize = 4;
/// Most leaf values allowed: each channel id, each visibility value and each `user-is` counts one.
pub const MAX_FILTER_LEAVES: usize = 100;

/// Why JSON is not a visibility filter; `path` locates the node (`$`, `$.of[1]`, …).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    #[error("filter {path} is not a json object")]
    NotObject { path: String },
    #[error("filter {path} has no string kind")]
    MissingKind { path: String },
    #[error("filter {path} has unknown kind {kind:?}")]
    UnknownKind { path: String, kind: String },
    #[error("filter {path} field {field} must be {expected}")]
    Field {
        path: String,
        field: &'static str,
        expected: &'static str,
    },
    #[error("filter {path} has unexpected field {field:?}")]
    UnexpectedField { path: String, field: String },
    #[error("filter {path} has unknown visibility {value:?}")]
    UnknownVisibility { path: String, value: String },
    #[error("filter nests deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("filter has more than {max} leaf values")]
    TooWide { max: usize },
}

impl VisibilityFilter {
    /// Parse untrusted JSON. Any defect is a typed error naming where it is; nothing falls back to
    /// `all`. Unknown keys on a node are refused too: a predicate this version cannot read fully
    /// is not one it may apply.
    pub fn parse(v: &Value) -> Result<Self, FilterError> {
        let mut leaves = 0;
        parse_filter(v, 1, "$", &mut leaves)
    }

    /// Check the depth and width bounds (for a filter that did not come through [`Self::parse`]).
    pub fn validate(&self) -> Result<(), FilterError> {
        if self.depth() > MAX_FILTER_DEPTH {
            return Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH,
            });
        }
        if self.leaves() > MAX_FILTER_LEAVES {
            return Err(FilterError::TooWide {
                max: MAX_FILTER_LEAVES,
            });
        }
        Ok(())
    }

    /// The one truth table. `none`, an empty `or` and an empty `and` match nothing; a row
    /// without a stamp is passed in as [`ChannelVisibility::Unknown`].
    pub fn matches(&self, channel_id: &str, user_id: &str, visibility: ChannelVisibility) -> bool {
        match self {
            VisibilityFilter::All => true,
            VisibilityFilter::None => false,
            VisibilityFilter::ChannelsIn { ids } => ids.iter().any(|id| id == channel_id),
            VisibilityFilter::UserIs { id } => id == user_id,
            VisibilityFilter::VisibilityIn { values } => values.contains(&visibility),
            VisibilityFilter::Or { of } => of
                .iter()
                .any(|f| f.matches(channel_id, user_id, visibility)),
            VisibilityFilter::And { of } => {
                !of.is_empty()
                    && of
                        .iter()
                        .all(|f| f.matches(channel_id, user_id, visibility))
            }
        }
    }

    /// [`Self::matches`] on a record or listing row.
    pub fn matches_head(&self, h: &RunHead) -> bool {
        self.matches(&h.channel_id, &h.user_id, h.channel_visibility)
    }

    /// The same predicate with every set sorted and deduplicated, so equal filters compare and
    /// compile (to SQL, to cache keys) identically.
    pub fn normalized(self) -> Self {
        match self {
            VisibilityFilter::ChannelsIn { mut ids } => {
                ids.sort();
                ids.dedup();
                VisibilityFilter::ChannelsIn { ids }
            }
            VisibilityFilter::VisibilityIn { mut values } => {
                values.sort_by_key(|v| v.as_str());
                values.dedup();
                VisibilityFilter::VisibilityIn { values }
            }
            VisibilityFilter::Or { of } => VisibilityFilter::Or {
                of: of.into_iter().map(Self::normalized).collect(),
            },
            VisibilityFilter::And { of } => VisibilityFilter::And {
                of: of.into_iter().map(Self::normalized).collect(),
            },
            other => other,
        }
    }

    /// Nesting depth; a leaf (or an empty `or`/`and`) is 1.
    fn depth(&self) -> usize {
        match self {
            VisibilityFilter::Or { of } | VisibilityFilter::And { of } => {
                1 + of.iter().map(Self::depth).max().unwrap_or(0)
            }
            _ => 1,
        }
    }

    /// Leaf values, counted as [`MAX_FILTER_LEAVES`] counts them.
    fn leaves(&self) -> usize {
        match self {
            VisibilityFilter::All | VisibilityFilter::None => 0,
            VisibilityFilter::ChannelsIn { ids } => ids.len(),
            VisibilityFilter::UserIs { .. } => 1,
            VisibilityFilter::VisibilityIn { values } => values.len(),
            VisibilityFilter::Or { of } | VisibilityFilter::And { of } => {
                of.iter().map(Self::leaves).sum()
            }
        }
    }
}

/// Add `n` leaf values to the running count, refusing once it passes [`MAX_FILTER_LEAVES`].
fn count_leaves(leaves: &mut usize, n: usize) -> Result<(), FilterError> {
    *leaves = leaves.saturating_add(n);
    if *leaves > MAX_FILTER_LEAVES {
        return Err(FilterError::TooWide {
            max: MAX_FILTER_LEAVES,
        });
    }
    Ok(())
}

/// Parse one node at `depth` (root = 1), counting leaves as it goes so an over-wide or over-deep
/// filter is refused before the rest of it is read.
fn parse_filter(
    v: &Value,
    depth: usize,
    path: &str,
    leaves: &mut usize,
) -> Result<VisibilityFilter, FilterError> {
    if depth > MAX_FILTER_DEPTH {
        return Err(FilterError::TooDeep {
            max: MAX_FILTER_DEPTH,
        });
    }
    let obj = v.as_object().ok_or_else(|| FilterError::NotObject {
        path: path.to_owned(),
    })?;
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| FilterError::MissingKind {
            path: path.to_owned(),
        })?;
    // The one body field each kind takes, and what it must hold.
    let (body_field, expected): (Option<&'static str>, &'static str) = match kind {
        "all" | "none" => (None, "absent"),
        "channels-in" => (Some("ids"), "an array of strings"),
        "user-is" => (Some("id"), "a string"),
        "visibility-in" => (Some("values"), "an array of visibilities"),
        "or" | "and" => (Some("of"), "an array of filters"),
        other => {
            return Err(FilterError::UnknownKind {
                path: path.to_owned(),
                kind: echo(other),
            })
        }
    };
    if let Some(field) = obj
        .keys()
        .find(|k| k.as_str() != "kind" && Some(k.as_str()) != body_field)
    {
        return Err(FilterError::UnexpectedField {
            path: path.to_owned(),
            field: echo(field),
        });
    }
    let Some(body_field) = body_field else {
        return Ok(if kind == "all" {
            VisibilityFilter::All
        } else {
            VisibilityFilter::None
        });
    };
    let field_error = || FilterError::Field {
        path: path.to_owned(),
        field: body_field,
        expected,
    };
    let body = obj.get(body_field).ok_or_else(field_error)?;
    if kind == "user-is" {
        count_leaves(leaves, 1)?;
        let id = body.as_str().ok_or_else(field_error)?.to_owned();
        return Ok(VisibilityFilter::UserIs { id });
    }
    let items = body.as_array().ok_or_else(field_error)?;
    let filter = match kind {
        "channels-in" => {
            count_leaves(leaves, items.len())?;
            let ids = items
                .iter()
                .map(|id| id.as_str().map(str::to_owned).ok_or_else(field_error))
                .collect::<Result<_, _>>()?;
            VisibilityFilter::ChannelsIn { ids }
        }
        "visibility-in" => {
            count_leaves(leaves, items.len())?;
            let values = items
                .iter()
                .map(|value| {
                    let s = value.as_str().ok_or_else(field_error)?;
                    ChannelVisibility::parse(s).ok_or_else(|| FilterError::UnknownVisibility {
                        path: path.to_owned(),
                        value: echo(s),
                    })
                })
                .collect::<Result<_, _>>()?;
            VisibilityFilter::VisibilityIn { values }
        }
        _ => {
            let of = items
                .iter()
                .enumerate()
                .map(|(i, child)| {
                    parse_filter(child, depth + 1, &format!("{path}.of[{i}]"), leaves)
                })
                .collect::<Result<_, _>>()?;
            if kind == "or" {
                VisibilityFilter::Or { of }
            } else {
                VisibilityFilter::And { of }
            }
        }
    };
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A well-formed record as a writer would store it, with `events`.
    fn record_json(events: Value) -> Value {
        json!({
            "id": "run_01-abc",
            "label": "fix the build",
            "agent": "coder",
            "model": "m-1",
            "channelId": "C1",
            "userId": "U1",
            "threadKey": "C1:T1",
            "channelVisibility": "private",
            "startedAt": 1_700_000_000_000_i64,
            "finishedAt": 1_700_000_060_000_i64,
            "status": "completed",
            "eventCount": 2,
            "storedEventCount": 2,
            "truncated": false,
            "diagnosis": Diagnosis::default(),
            "events": events,
        })
    }

    fn good_record() -> Value {
        record_json(json!([
            {"type": "input", "seq": 1, "at": 1, "text": "hello", "source": "request"},
            {"type": "answer", "seq": 2, "at": 2, "text": "hi"},
        ]))
    }

    /// `good_record` with `key` set to `value` (or removed when `value` is `None`).
    fn with(key: &str, value: Option<Value>) -> Value {
        let mut v = good_record();
        let obj = v.as_object_mut().expect("fixture is an object");
        match value {
            Some(value) => obj.insert(key.to_owned(), value),
            None => obj.remove(key),
        };
        v
    }

    fn head(id: &str, finished_at: i64) -> RunHead {
        let mut record = validate_record(&good_record()).expect("fixture is valid");
        record.head.id = id.to_owned();
        record.head.finished_at = finished_at;
        record.head
    }

    fn item(id: &str, finished_at: i64, bytes: Option<u64>) -> RunListItem {
        RunListItem {
            head: head(id, finished_at),
            bytes,
        }
    }

    fn ids(items: &[RunListItem]) -> Vec<&str> {
        items.iter().map(|i| i.head.id.as_str()).collect()
    }

    // ---- 1.A record contract & validator ------------------------------------------------------

    #[test]
    fn run_id_pattern_accepts_the_alphabet_and_refuses_everything_else() {
        assert!(is_valid_run_id("a"));
        assert!(is_valid_run_id("Run_01-x"));
        assert!(is_valid_run_id(&"a".repeat(64)));
        for bad in [
            "",
            "has space",
            "../../etc/x",
            "a/b",
            "é",
            "a.b",
            &"a".repeat(65),
        ] {
            assert!(!is_valid_run_id(bad), "{bad:?} must be refused");
        }
    }

    #[test]
    fn well_formed_record_is_accepted_also_after_a_json_round_trip() {
        let record = validate_record(&good_record()).expect("valid");
        assert_eq!(record.head.channel_visibility, ChannelVisibility::Private);
        assert_eq!(record.events.len(), 2);
        let text = serde_json::to_string(&record).expect("serializes");
        let back: Value = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, good_record());
        assert_eq!(validate_record(&back).expect("still valid"), record);
        // serde's own derive reads the same thing the validator does
        let via_serde: RunRecord = serde_json::from_str(&text).expect("derive reads it");
        assert_eq!(via_serde, record);
    }

    #[test]
    fn unknown_fields_on_record_and_events_ride_through_verbatim() {
        let mut v = record_json(json!([
            {"type": "tool_result", "seq": 1, "at": 1, "callId": "c1", "exitCode": 2,
             "output": "x", "source": "shell", "tool": "bash", "ok": false, "summary": "s",
             "future": {"nested": [1, 2.5, null]}},
            {"type": "some_future_type", "seq": 2, "at": 2, "whatever": true},
        ]));
        let obj = v.as_object_mut().expect("object");
        obj.insert("restarting".into(), json!(true));
        obj.insert("route".into(), json!({"preset": "x", "reason": "y"}));
        obj.insert("usage".into(), json!({"tokens": 12}));
        let record = validate_record(&v).expect("a newer record is accepted");
        assert_eq!(record.head.extra.get("usage"), Some(&json!({"tokens": 12})));
        assert!(!record.head.extra.contains_key("events"));
        let back = serde_json::to_value(&record).expect("serializes");
        assert_eq!(back, v);
        // the listing row keeps the unknown fields too, but never the events
        let item = record.to_list_item(Some(10));
        let row = serde_json::to_value(&item).expect("serializes");
        assert_eq!(row.get("route"), v.get("route"));
        assert_eq!(row.get("events"), None);
        assert_eq!(row.get("bytes"), Some(&json!(10)));
    }

    #[test]
    fn validator_rejects_each_malformed_record_naming_the_field() {
        use RecordError as E;
        let cases: Vec<(&str, Value, RecordError)> = vec![
            ("id with a space", with("id", Some(json!("a b"))), E::BadId),
            ("empty id", with("id", Some(json!(""))), E::BadId),
            (
                "65-char id",
                with("id", Some(json!("a".repeat(65)))),
                E::BadId,
            ),
            ("path id", with("id", Some(json!("../../etc/x"))), E::BadId),
            (
                "numeric id",
                with("id", Some(json!(7))),
                E::Field {
                    field: "id",
                    why: MUST_BE_STRING,
                },
            ),
            ("missing id", with("id", None), E::Missing { field: "id" }),
            (
                "unknown status",
                with("status", Some(json!("done"))),
                E::UnknownStatus("done".into()),
            ),
            (
                "non-string status",
                with("status", Some(json!(1))),
                E::Field {
                    field: "status",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "events an object",
                with("events", Some(json!({}))),
                E::Field {
                    field: "events",
                    why: "must be an array",
                },
            ),
            (
                "events missing",
                with("events", None),
                E::Missing { field: "events" },
            ),
            (
                "event not object",
                with("events", Some(json!([{"type": "input"}, 3]))),
                E::Event {
                    index: 1,
                    why: "is not a json object",
                },
            ),
            (
                "event without type",
                with("events", Some(json!([{"seq": 1}]))),
                E::Event {
                    index: 0,
                    why: "has no string type",
                },
            ),
            (
                "event with numeric type",
                with("events", Some(json!([{"type": 4}]))),
                E::Event {
                    index: 0,
                    why: "has no string type",
                },
            ),
            (
                "missing channelId",
                with("channelId", None),
                E::Missing { field: "channelId" },
            ),
            (
                "numeric userId",
                with("userId", Some(json!(5))),
                E::Field {
                    field: "userId",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "null threadKey",
                with("threadKey", Some(Value::Null)),
                E::Field {
                    field: "threadKey",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "missing startedAt",
                with("startedAt", None),
                E::Missing { field: "startedAt" },
            ),
            (
                "string finishedAt",
                with("finishedAt", Some(json!("1"))),
                E::Field {
                    field: "finishedAt",
                    why: MUST_BE_WHOLE,
                },
            ),
            (
                "fractional startedAt",
                with("startedAt", Some(json!(1.5))),
                E::Field {
                    field: "startedAt",
                    why: MUST_BE_WHOLE,
                },
            ),
            (
                "string receivedAt",
                with("receivedAt", Some(json!("x"))),
                E::Field {
                    field: "receivedAt",
                    why: MUST_BE_WHOLE,
                },
            ),
            (
                "bool sealedAt",
                with("sealedAt", Some(json!(true))),
                E::Field {
                    field: "sealedAt",
                    why: MUST_BE_WHOLE,
                },
            ),
            (
                "negative eventCount",
                with("eventCount", Some(json!(-1))),
                E::Field {
                    field: "eventCount",
                    why: MUST_BE_COUNT,
                },
            ),
            (
                "missing storedEventCount",
                with("storedEventCount", None),
                E::Missing {
                    field: "storedEventCount",
                },
            ),
            (
                "string truncated",
                with("truncated", Some(json!("false"))),
                E::Field {
                    field: "truncated",
                    why: MUST_BE_BOOL,
                },
            ),
            (
                "numeric truncated",
                with("truncated", Some(json!(0))),
                E::Field {
                    field: "truncated",
                    why: MUST_BE_BOOL,
                },
            ),
            (
                "missing truncated",
                with("truncated", None),
                E::Missing { field: "truncated" },
            ),
            (
                "provisional false",
                with("provisional", Some(json!(false))),
                E::Field {
                    field: "provisional",
                    why: "must be literally true when present",
                },
            ),
            (
                "provisional string",
                with("provisional", Some(json!("true"))),
                E::Field {
                    field: "provisional",
                    why: "must be literally true when present",
                },
            ),
            (
                "unknown visibility",
                with("channelVisibility", Some(json!("secret"))),
                E::UnknownVisibility("secret".into()),
            ),
            (
                "numeric visibility",
                with("channelVisibility", Some(json!(1))),
                E::Field {
                    field: "channelVisibility",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "numeric parentRunId",
                with("parentRunId", Some(json!(3))),
                E::Field {
                    field: "parentRunId",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "empty parentRunId",
                with("parentRunId", Some(json!(""))),
                E::BadParentId,
            ),
            (
                "path parentRunId",
                with("parentRunId", Some(json!("../x"))),
                E::BadParentId,
            ),
            (
                "string replyOk",
                with("replyOk", Some(json!("yes"))),
                E::Field {
                    field: "replyOk",
                    why: MUST_BE_BOOL,
                },
            ),
            (
                "numeric replyNote",
                with("replyNote", Some(json!(1))),
                E::Field {
                    field: "replyNote",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "string stepCount",
                with("stepCount", Some(json!("3"))),
                E::Field {
                    field: "stepCount",
                    why: MUST_BE_COUNT,
                },
            ),
            (
                "numeric label",
                with("label", Some(json!(1))),
                E::Field {
                    field: "label",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "array agent",
                with("agent", Some(json!([]))),
                E::Field {
                    field: "agent",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "null model",
                with("model", Some(Value::Null)),
                E::Field {
                    field: "model",
                    why: MUST_BE_STRING,
                },
            ),
            (
                "diagnosis a string",
                with("diagnosis", Some(json!("x"))),
                E::NotObject { what: "diagnosis" },
            ),
            (
                "diagnosis without byCategory",
                with("diagnosis", Some(json!({}))),
                E::Missing {
                    field: "diagnosis.byCategory",
                },
            ),
            (
                "category without totals",
                with(
                    "diagnosis",
                    Some(json!({"byCategory": {"model": {"count": 1}}})),
                ),
                E::DiagnosisCategory {
                    category: "model".into(),
                    why: "needs a number durationMs >= 0",
                },
            ),
            (
                "negative category count",
                with(
                    "diagnosis",
                    Some(json!({"byCategory": {"tool": {"count": -1, "durationMs": 0}}})),
                ),
                E::DiagnosisCategory {
                    category: "tool".into(),
                    why: "needs a number count >= 0",
                },
            ),
        ];
        for (name, value, expected) in cases {
            assert_eq!(validate_record(&value).err(), Some(expected), "{name}");
        }
        for not_object in [Value::Null, json!([]), json!("run"), json!(1)] {
            assert_eq!(
                validate_record(&not_object).err(),
                Some(RecordError::NotObject { what: "record" })
            );
        }
    }

    #[test]
    fn error_messages_are_lowercase_and_name_the_field() {
        let err = validate_record(&with("truncated", Some(json!(1)))).expect_err("refused");
        assert_eq!(err.to_string(), "field truncated must be a boolean");
        let err =
            validate_record(&with("status", Some(json!("x".repeat(500))))).expect_err("refused");
        assert!(
            err.to_string().len() < 100,
            "offending values are clipped: {err}"
        );
    }

    #[test]
    fn all_five_statuses_are_accepted_interrupted_included() {
        for status in RunStatus::ALL {
            let v = with("status", Some(json!(status.as_str())));
            assert_eq!(validate_record(&v).expect("valid").head.status, status);
            assert_eq!(RunStatus::parse(status.as_str()), Some(status));
            assert_eq!(
                serde_json::to_value(status).expect("serializes"),
                json!(status.as_str())
            );
        }
        assert_eq!(RunStatus::parse("Completed"), None);
    }

    #[test]
    fn provisional_is_valid_only_as_literal_true_and_absent_on_a_final_record() {
        let absent = validate_record(&good_record()).expect("absent is valid");
        assert!(!absent.head.provisional);
        assert_eq!(
            serde_json::to_value(&absent)
                .expect("ser")
                .get("provisional"),
            None
        );
        let tombstone =
            validate_record(&with("provisional", Some(json!(true)))).expect("true is valid");
        assert!(tombstone.head.provisional);
        assert_eq!(
            serde_json::to_value(&tombstone)
                .expect("ser")
                .get("provisional"),
            Some(&json!(true))
        );
        assert!(validate_record(&with("provisional", Some(json!(false)))).is_err());
        assert!(validate_record(&with("provisional", Some(Value::Null))).is_err());
    }

    #[test]
    fn tracing_stamps_and_optional_fields_are_accepted_when_typed() {
        let mut v = good_record();
        let obj = v.as_object_mut().expect("object");
        obj.insert("receivedAt".into(), json!(1_699_999_999_000_i64));
        obj.insert("sealedAt".into(), json!(1_700_000_061_000.0));
        obj.insert("replyOk".into(), json!(false));
        obj.insert("replyNote".into(), json!("no channel to deliver to"));
        obj.insert("stepCount".into(), json!(7));
        obj.insert("parentRunId".into(), json!("parent_1"));
        let record = validate_record(&v).expect("typed stamps are valid");
        let h = &record.head;
        assert_eq!(h.received_at, Some(1_699_999_999_000));
        assert_eq!(
            h.sealed_at,
            Some(1_700_000_061_000),
            "a whole float reads as an integer"
        );
        assert_eq!(h.reply_ok, Some(false));
        assert_eq!(h.reply_note.as_deref(), Some("no channel to deliver to"));
        assert_eq!(h.step_count, Some(7));
        assert_eq!(h.parent_run_id.as_deref(), Some("parent_1"));
        assert!(h.extra.is_empty());
        // absent optional fields leave no key behind
        let plain =
            serde_json::to_value(validate_record(&good_record()).expect("valid")).expect("ser");
        for key in [
            "receivedAt",
            "sealedAt",
            "replyOk",
            "replyNote",
            "stepCount",
            "parentRunId",
        ] {
            assert_eq!(plain.get(key), None, "{key}");
        }
    }

    #[test]
    fn channel_visibility_absent_reads_unknown_and_a_bad_value_is_rejected() {
        let record =
            validate_record(&with("channelVisibility", None)).expect("a pre-stamp row is valid");
        assert_eq!(record.head.channel_visibility, ChannelVisibility::Unknown);
        let item = validate_list_item(&with("channelVisibility", None)).expect("listing row too");
        assert_eq!(item.head.channel_visibility, ChannelVisibility::Unknown);
        for v in ChannelVisibility::ALL {
            let record = validate_record(&with("channelVisibility", Some(json!(v.as_str()))))
                .expect("valid");
            assert_eq!(record.head.channel_visibility, v);
        }
        assert_eq!(
            validate_record(&with("channelVisibility", Some(json!("Public")))).err(),
            Some(RecordError::UnknownVisibility("Public".into()))
        );
        // serde's derive agrees: a missing stamp is unknown, never public
        let mut v = good_record();
        v.as_object_mut()
            .expect("object")
            .remove("channelVisibility");
        let via_serde: RunRecord = serde_json::from_value(v).expect("derive reads it");
        assert_eq!(
            via_serde.head.channel_visibility,
            ChannelVisibility::Unknown
        );
    }

    #[test]
    fn diagnosis_missing_a_category_or_carrying_an_unknown_one_is_accepted_and_normalized() {
        let v = with(
            "diagnosis",
            Some(json!({"byCategory": {
                "model": {"count": 2, "durationMs": 1500},
                "gremlins": {"count": 9, "durationMs": 9},
                "tool": {"count": 1, "durationMs": 12.7},
            }})),
        );
        let diagnosis = validate_record(&v)
            .expect("structurally a diagnosis")
            .head
            .diagnosis;
        let names: Vec<&str> = diagnosis.by_category.keys().map(String::as_str).collect();
        let mut expected = DIAGNOSIS_CATEGORIES.to_vec();
        expected.sort_unstable();
        assert_eq!(names, expected, "unknown dropped, missing zero-filled");
        assert_eq!(
            diagnosis.by_category["model"],
            CategoryStat {
                count: 2,
                duration_ms: 1500
            }
        );
        assert_eq!(
            diagnosis.by_category["tool"],
            CategoryStat {
                count: 1,
                duration_ms: 12
            }
        );
        assert_eq!(diagnosis.by_category["wait"], CategoryStat::default());
        // a record without any diagnosis reads all zero
        let bare = validate_record(&with("diagnosis", None)).expect("valid");
        assert_eq!(bare.head.diagnosis, Diagnosis::default());
        assert_eq!(Diagnosis::default().by_category.len(), 5);
    }

    #[test]
    fn diagnosis_normalization_zero_fills_and_drops_directly() {
        let mut by_category = BTreeMap::new();
        by_category.insert(
            "retry".to_owned(),
            CategoryStat {
                count: 3,
                duration_ms: 4,
            },
        );
        by_category.insert(
            "legacy".to_owned(),
            CategoryStat {
                count: 1,
                duration_ms: 1,
            },
        );
        let normalized = Diagnosis { by_category }.normalized();
        assert_eq!(normalized.by_category.len(), 5);
        assert!(!normalized.by_category.contains_key("legacy"));
        assert_eq!(
            normalized.by_category["retry"],
            CategoryStat {
                count: 3,
                duration_ms: 4
            }
        );
        assert_eq!(
            serde_json::to_value(&normalized).expect("ser")["byCategory"]["retry"],
            json!({"count": 3, "durationMs": 4})
        );
    }

    #[test]
    fn list_item_is_accepted_with_or_without_numeric_bytes_and_bad_bytes_are_rejected() {
        let mut row = good_record();
        row.as_object_mut().expect("object").remove("events");
        let plain = validate_list_item(&row).expect("without bytes");
        assert_eq!(plain.bytes, None);
        row.as_object_mut()
            .expect("object")
            .insert("bytes".into(), json!(2048));
        let sized = validate_list_item(&row).expect("with bytes");
        assert_eq!(sized.bytes, Some(2048));
        assert!(!sized.head.extra.contains_key("bytes"));
        assert_eq!(
            serde_json::to_value(&sized).expect("ser"),
            row,
            "round trip"
        );
        for bad in [
            json!("2048"),
            json!(-1),
            json!(1.5),
            json!(true),
            Value::Null,
        ] {
            row.as_object_mut()
                .expect("object")
                .insert("bytes".into(), bad.clone());
            assert_eq!(
                validate_list_item(&row).err(),
                Some(RecordError::Field {
                    field: "bytes",
                    why: MUST_BE_COUNT
                }),
                "bytes {bad}"
            );
        }
        // a bad row is refused as a record would be
        row.as_object_mut()
            .expect("object")
            .insert("bytes".into(), json!(1));
        row.as_object_mut()
            .expect("object")
            .insert("id".into(), json!("bad id"));
        assert_eq!(validate_list_item(&row).err(), Some(RecordError::BadId));
        assert_eq!(
            validate_list_item(&json!([])).err(),
            Some(RecordError::NotObject { what: "list item" })
        );
    }

    #[test]
    fn list_item_from_a_whole_record_drops_the_events() {
        let item = validate_list_item(&good_record()).expect("a record is a superset of a row");
        assert!(!item.head.extra.contains_key("events"));
        let record = validate_record(&good_record()).expect("valid");
        assert_eq!(item, record.to_list_item(None));
    }

    #[test]
    fn to_list_item_never_writes_bytes_twice() {
        let mut record = validate_record(&with("bytes", Some(json!(5)))).expect("valid");
        assert_eq!(
            record.head.extra.get("bytes"),
            Some(&json!(5)),
            "rides through on the record"
        );
        let text = serde_json::to_string(&record.to_list_item(Some(99))).expect("ser");
        assert_eq!(text.matches("\"bytes\"").count(), 1);
        record.head.extra.clear();
        assert_eq!(record.to_list_item(None).bytes, None);
    }

    #[test]
    fn encoded_len_is_the_length_of_the_compact_json() {
        let record = validate_record(&good_record()).expect("valid");
        let bytes = serde_json::to_vec(&record).expect("ser");
        assert_eq!(record.encoded_len(), bytes.len());
    }

    #[test]
    fn stored_event_seqs_keeps_registry_stamps_when_strictly_increasing() {
        let events = vec![
            json!({"type": "a", "seq": 3}),
            json!({"type": "b", "seq": 7}),
            json!({"type": "c", "seq": 9}),
        ];
        assert_eq!(stored_event_seqs(&events), vec![3, 7, 9]);
        assert_eq!(event_seq(&events[1]), Some(7));
        assert_eq!(stored_event_seqs(&[]), Vec::<u64>::new());
    }

    #[test]
    fn stored_event_seqs_falls_back_to_one_based_positions_for_every_event() {
        let cases = [
            (
                "repeated stamp",
                vec![
                    json!({"type": "a", "seq": 1}),
                    json!({"type": "b", "seq": 1}),
                    json!({"type": "c", "seq": 2}),
                ],
            ),
            (
                "decreasing",
                vec![
                    json!({"type": "a", "seq": 5}),
                    json!({"type": "b", "seq": 4}),
                    json!({"type": "c", "seq": 6}),
                ],
            ),
            (
                "one missing",
                vec![
                    json!({"type": "a", "seq": 1}),
                    json!({"type": "b"}),
                    json!({"type": "c", "seq": 3}),
                ],
            ),
            (
                "non-numeric",
                vec![
                    json!({"type": "a", "seq": "1"}),
                    json!({"type": "b", "seq": 2}),
                    json!({"type": "c", "seq": 3}),
                ],
            ),
            (
                "negative",
                vec![
                    json!({"type": "a", "seq": -1}),
                    json!({"type": "b", "seq": 2}),
                    json!({"type": "c", "seq": 3}),
                ],
            ),
        ];
        for (name, events) in cases {
            assert_eq!(stored_event_seqs(&events), vec![1, 2, 3], "{name}");
        }
    }

    // ---- 1.B byte budget ----------------------------------------------------------------------

    fn record_with_events(events: Vec<Value>) -> RunRecord {
        let mut record = validate_record(&good_record()).expect("valid");
        record.head.event_count = events.len() as u64;
        record.head.stored_event_count = events.len() as u64;
        record.events = events;
        record
    }

    #[test]
    fn four_megabyte_event_list_fits_with_head_and_tail_kept() {
        // 4000 tool results of ~1 KB each: about 4 MB of events.
        let events: Vec<Value> = (1..=4000u64)
            .map(|seq| {
                json!({"type": "tool_result", "seq": seq, "at": seq, "callId": format!("c{seq}"),
                              "tool": "bash", "ok": true, "step": seq, "summary": "x".repeat(1000)})
            })
            .collect();
        let source = record_with_events(events);
        assert!(source.encoded_len() > 4_000_000);
        let before = source.clone();

        let fitted = fit_record_to_budget(&source, MAX_RECORD_BYTES);

        assert_eq!(source, before, "source record untouched");
        assert!(
            fitted.encoded_len() <= MAX_RECORD_BYTES,
            "{}",
            fitted.encoded_len()
        );
        assert!(
            fitted.encoded_len() > MAX_RECORD_BYTES - 2_000,
            "the budget is used, not wasted"
        );
        assert!(fitted.head.truncated);
        assert_eq!(
            fitted.head.event_count, 4000,
            "eventCount is what the run published"
        );
        assert_eq!(fitted.head.stored_event_count, fitted.events.len() as u64);
        let seqs = stored_event_seqs(&fitted.events);
        assert_eq!(seqs.first(), Some(&1), "first event kept");
        assert_eq!(seqs.last(), Some(&4000), "last event kept");
        // one contiguous head 1..=h and one contiguous tail t..=4000, balanced (head first)
        let head_len = seqs.iter().zip(1..).take_while(|(s, i)| **s == *i).count();
        let tail_len = seqs.len() - head_len;
        assert_eq!(
            &seqs[head_len..],
            &(4001 - tail_len as u64..=4000).collect::<Vec<_>>()[..]
        );
        assert!(
            head_len == tail_len || head_len == tail_len + 1,
            "head {head_len} tail {tail_len}"
        );
        // the result is itself a valid record
        let reread = validate_record(&serde_json::to_value(&fitted).expect("ser")).expect("valid");
        assert_eq!(reread, fitted);
    }

    #[test]
    fn under_budget_record_is_returned_intact_and_truncated_stays_false() {
        let source = validate_record(&good_record()).expect("valid");
        let fitted = fit_record_to_budget(&source, MAX_RECORD_BYTES);
        assert_eq!(fitted, source);
        assert!(!fitted.head.truncated);
        // a record the registry already truncated stays truncated, counts untouched
        let mut backlog_cut = source.clone();
        backlog_cut.head.truncated = true;
        backlog_cut.head.event_count = 50;
        assert_eq!(
            fit_record_to_budget(&backlog_cut, MAX_RECORD_BYTES),
            backlog_cut
        );
    }

    #[test]
    fn two_hundred_kilobyte_summary_is_capped_with_a_trailing_ellipsis() {
        let big = json!({"type": "tool_result", "seq": 1, "at": 1, "callId": "c", "tool": "bash",
                         "ok": true, "step": 1, "summary": "s".repeat(200_000), "text": "untouched"});
        let source = record_with_events(vec![big]);
        let fitted = fit_record_to_budget(&source, MAX_RECORD_BYTES);
        let event = &fitted.events[0];
        let size = serde_json::to_vec(event).expect("ser").len();
        assert!(size <= MAX_EVENT_BYTES, "{size}");
        assert!(
            size > MAX_EVENT_BYTES - 8,
            "capped to the limit, not far below: {size}"
        );
        let summary = event["summary"].as_str().expect("string");
        assert!(summary.ends_with('…'));
        assert_eq!(
            event["text"],
            json!("untouched"),
            "only summary is cut on a tool event"
        );
        assert!(!fitted.head.truncated, "capping drops no event");
        assert_eq!(fitted.events.len(), 1);
        assert_eq!(
            source.events[0]["summary"].as_str().map(str::len),
            Some(200_000),
            "source untouched"
        );
    }

    #[test]
    fn two_hundred_kilobyte_text_is_capped_with_a_trailing_ellipsis() {
        for kind in TEXT_EVENT_TYPES {
            let big = json!({"type": kind, "seq": 1, "at": 1, "text": "t".repeat(200_000), "summary": "kept"});
            let fitted = fit_record_to_budget(&record_with_events(vec![big]), MAX_RECORD_BYTES);
            let event = &fitted.events[0];
            assert!(
                serde_json::to_vec(event).expect("ser").len() <= MAX_EVENT_BYTES,
                "{kind}"
            );
            assert!(
                event["text"].as_str().expect("string").ends_with('…'),
                "{kind}"
            );
            assert_eq!(event["summary"], json!("kept"), "{kind}");
        }
    }

    #[test]
    fn multibyte_text_is_capped_by_utf8_bytes_not_chars() {
        // 100 000 three-byte chars: 300 KB of UTF-8 but only 100 000 chars.
        let big = json!({"type": "assistant", "seq": 1, "at": 1, "step": 1, "text": "日".repeat(100_000)});
        let fitted = fit_record_to_budget(&record_with_events(vec![big]), MAX_RECORD_BYTES);
        let text = fitted.events[0]["text"].as_str().expect("string");
        assert!(serde_json::to_vec(&fitted.events[0]).expect("ser").len() <= MAX_EVENT_BYTES);
        assert!(text.ends_with('…'));
        let kept = text.trim_end_matches('…');
        assert!(kept.chars().all(|c| c == '日'), "no char was split");
        assert!(kept.chars().count() < MAX_EVENT_BYTES / 3 + 1);
        assert!(kept.chars().count() > MAX_EVENT_BYTES / 3 - 40);
    }

    #[test]
    fn escaped_characters_are_counted_as_written() {
        // quotes, backslashes, newlines and raw control chars all grow when escaped
        let nasty = "a\"b\\c\nd\u{1}é".repeat(20_000);
        let big = json!({"type": "note", "kind": "x", "seq": 1, "at": 1, "summary": nasty});
        let fitted = fit_record_to_budget(&record_with_events(vec![big]), MAX_RECORD_BYTES);
        let size = serde_json::to_vec(&fitted.events[0]).expect("ser").len();
        assert!(
            size <= MAX_EVENT_BYTES && size > MAX_EVENT_BYTES - 8,
            "{size}"
        );
    }

    #[test]
    fn oversized_event_without_a_cappable_string_is_left_to_the_record_budget() {
        let odd = json!({"type": "tool_result", "seq": 1, "at": 1, "summary": 5, "output": "o".repeat(100_000)});
        let fitted = fit_record_to_budget(&record_with_events(vec![odd.clone()]), MAX_RECORD_BYTES);
        assert_eq!(fitted.events, vec![odd]);
    }

    #[test]
    fn capped_events_that_fit_keep_every_event_and_truncated_unchanged() {
        // 20 events of 200 KB: 4 MB before capping, ~1.3 MB after, so nothing is dropped.
        let events: Vec<Value> = (1..=20u64)
            .map(|seq| json!({"type": "context", "seq": seq, "at": seq, "text": "c".repeat(200_000)}))
            .collect();
        let fitted = fit_record_to_budget(&record_with_events(events), MAX_RECORD_BYTES);
        assert_eq!(fitted.events.len(), 20);
        assert!(!fitted.head.truncated);
        assert!(fitted.encoded_len() <= MAX_RECORD_BYTES);
    }

    #[test]
    fn tiny_budget_keeps_head_first_then_tail() {
        let events: Vec<Value> = (1..=10u64)
            .map(|seq| json!({"type": "note", "kind": "k", "seq": seq, "at": seq, "summary": "n".repeat(100)}))
            .collect();
        let source = record_with_events(events);
        let one_event = serde_json::to_vec(&source.events[0]).expect("ser").len();
        let mut shell = source.clone();
        shell.events.clear();
        shell.head.truncated = true;
        // room for three events plus two commas, with slack for wider seqs but not a fourth event
        let budget = shell.encoded_len() + one_event * 3 + 2 + 10;
        let fitted = fit_record_to_budget(&source, budget);
        assert_eq!(stored_event_seqs(&fitted.events), vec![1, 2, 10]);
        assert!(fitted.encoded_len() <= budget);
        assert_eq!(fitted.head.stored_event_count, 3);
        assert_eq!(fitted.head.event_count, 10);
    }

    // ---- 1.C retention ------------------------------------------------------------------------

    const DAY: i64 = 86_400_000;
    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_run_finished_31_days_ago_is_hidden_and_29_days_ago_is_kept() {
        let policy = RetentionPolicy::default();
        let items = vec![
            item("old", NOW - 31 * DAY, None),
            item("recent", NOW - 29 * DAY, None),
        ];
        assert_eq!(ids(&apply_retention(&items, &policy, NOW)), vec!["recent"]);
        assert_eq!(policy.cutoff_ms(NOW), NOW - 30 * DAY);
        // exactly at the cutoff is not expired
        let edge = vec![item("edge", NOW - 30 * DAY, None)];
        assert_eq!(apply_retention(&edge, &policy, NOW).len(), 1);
    }

    #[test]
    fn max_runs_keeps_the_newest_three_of_four_with_ties_broken_by_id_desc() {
        let policy = RetentionPolicy {
            max_runs: 3,
            ..RetentionPolicy::default()
        };
        let items = vec![
            item("a", NOW - 2_000, None),
            item("b", NOW - 1_000, None),
            item("c", NOW - 1_000, None),
            item("d", NOW - 3_000, None),
        ];
        let before = items.clone();
        let kept = apply_retention(&items, &policy, NOW);
        assert_eq!(
            ids(&kept),
            vec!["c", "b", "a"],
            "newest first, same-ms sibling by id desc"
        );
        assert_eq!(items, before, "input never mutated");
        assert_eq!(
            newest_first(&items[1].head, &items[2].head),
            Ordering::Greater
        );
        assert_eq!(
            newest_first(&items[2].head, &items[2].head),
            Ordering::Equal
        );
    }

    #[test]
    fn max_bytes_trims_the_oldest_runs_even_when_max_runs_would_keep_them() {
        let mib = 1024 * 1024;
        let policy = RetentionPolicy {
            max_bytes: 16 * mib,
            ..RetentionPolicy::default()
        };
        let items = vec![
            item("oldest", NOW - 4_000, Some(6 * mib)),
            item("older", NOW - 3_000, Some(6 * mib)),
            item("newer", NOW - 2_000, Some(6 * mib)),
            item("newest", NOW - 1_000, Some(4 * mib)),
        ];
        assert_eq!(
            ids(&apply_retention(&items, &policy, NOW)),
            vec!["newest", "newer", "older"]
        );
        // once the line is crossed everything older goes, even a small row
        let items = vec![
            item("tiny-old", NOW - 5_000, Some(1)),
            item("huge", NOW - 4_000, Some(16 * mib)),
            item("new", NOW - 1_000, Some(1)),
        ];
        assert_eq!(ids(&apply_retention(&items, &policy, NOW)), vec!["new"]);
    }

    #[test]
    fn missing_bytes_counts_as_zero() {
        let mib = 1024 * 1024;
        let policy = RetentionPolicy {
            max_bytes: 16 * mib,
            ..RetentionPolicy::default()
        };
        let items = vec![
            item("unsized-old", NOW - 3_000, None),
            item("full", NOW - 2_000, Some(16 * mib)),
            item("unsized-new", NOW - 1_000, None),
        ];
        assert_eq!(
            ids(&apply_retention(&items, &policy, NOW)),
            vec!["unsized-new", "full", "unsized-old"]
        );
    }

    #[test]
    fn clamp_fills_defaults_clamps_to_bounds_replaces_non_finite_and_floors() {
        let gib = 1024 * 1024 * 1024_u64;
        let mib = 1024 * 1024_u64;
        let cases = [
            (
                (f64::NAN, f64::INFINITY, f64::NEG_INFINITY),
                (30, 5000, 2 * gib),
            ),
            ((0.0, 0.0, 0.0), (1, 1, 16 * mib)),
            ((-5.0, -1.0, -1.0), (1, 1, 16 * mib)),
            ((1000.0, 1e9, 1e30), (365, 20_000, 8 * gib)),
            ((7.9, 10.99, 20.5 * mib as f64), (7, 10, 20 * mib + mib / 2)),
            ((1.5, 1.5, (16 * mib) as f64 + 0.7), (1, 1, 16 * mib)),
            ((30.0, 5000.0, (2 * gib) as f64), (30, 5000, 2 * gib)),
        ];
        for ((days, runs, bytes), (want_days, want_runs, want_bytes)) in cases {
            let got = RetentionPolicy::clamp(days, runs, bytes);
            assert_eq!(
                got,
                RetentionPolicy {
                    retention_days: want_days,
                    max_runs: want_runs,
                    max_bytes: want_bytes
                },
                "clamp({days}, {runs}, {bytes})"
            );
        }
        assert_eq!(
            RetentionPolicy::default(),
            RetentionPolicy {
                retention_days: 30,
                max_runs: 5000,
                max_bytes: 2 * gib
            }
        );
        assert_eq!(
            serde_json::to_value(RetentionPolicy::default()).expect("ser"),
            json!({"retentionDays": 30, "maxRuns": 5000, "maxBytes": 2 * gib})
        );
    }

    // ---- visibility filter --------------------------------------------------------------------

    fn filter(v: Value) -> VisibilityFilter {
        VisibilityFilter::parse(&v).expect("valid filter")
    }

    #[test]
    fn visibility_truth_table() {
        use ChannelVisibility as V;
        // (filter, channel, user, visibility, matches)
        let rows: Vec<(Value, &str, &str, V, bool)> = vec![
            (json!({"kind": "all"}), "C1", "U1", V::Unknown, true),
            (json!({"kind": "none"}), "C1", "U1", V::Public, false),
            (
                json!({"kind": "channels-in", "ids": ["C1", "C2"]}),
                "C2",
                "U9",
                V::Private,
                true,
            ),
            (
                json!({"kind": "channels-in", "ids": ["C1"]}),
                "C3",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "channels-in", "ids": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "user-is", "id": "U1"}),
                "C9",
                "U1",
                V::Dm,
                true,
            ),
            (
                json!({"kind": "user-is", "id": "U1"}),
                "C9",
                "U2",
                V::Dm,
                false,
            ),
            (
                json!({"kind": "visibility-in", "values": ["public"]}),
                "C1",
                "U1",
                V::Public,
                true,
            ),
            (
                json!({"kind": "visibility-in", "values": ["public"]}),
                "C1",
                "U1",
                V::Unknown,
                false,
            ),
            (
                json!({"kind": "visibility-in", "values": ["unknown"]}),
                "C1",
                "U1",
                V::Unknown,
                true,
            ),
            (
                json!({"kind": "visibility-in", "values": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "or", "of": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "and", "of": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "or", "of": [{"kind": "user-is", "id": "U1"}, {"kind": "visibility-in", "values": ["public"]}]}),
                "C1",
                "U2",
                V::Public,
                true,
            ),
            (
                json!({"kind": "or", "of": [{"kind": "user-is", "id": "U1"}, {"kind": "visibility-in", "values": ["public"]}]}),
                "C1",
                "U2",
                V::Private,
                false,
            ),
            (
                json!({"kind": "and", "of": [{"kind": "channels-in", "ids": ["C1"]}, {"kind": "user-is", "id": "U1"}]}),
                "C1",
                "U1",
                V::Private,
                true,
            ),
            (
                json!({"kind": "and", "of": [{"kind": "channels-in", "ids": ["C1"]}, {"kind": "user-is", "id": "U1"}]}),
                "C1",
                "U2",
                V::Private,
                false,
            ),
            (
                json!({"kind": "and", "of": [{"kind": "all"}, {"kind": "none"}]}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "or", "of": [{"kind": "none"}, {"kind": "and", "of": [{"kind": "all"}]}]}),
                "C1",
                "U1",
                V::Public,
                true,
            ),
        ];
        for (wire, channel, user, visibility, expected) in rows {
            let f = filter(wire.clone());
            assert_eq!(
                f.matches(channel, user, visibility),
                expected,
                "{wire} on ({channel}, {user}, {visibility:?})"
            );
        }
    }

    #[test]
    fn a_row_without_a_stamp_matches_as_unknown_never_public() {
        let row = validate_record(&with("channelVisibility", None))
            .expect("valid")
            .head;
        assert!(!filter(json!({"kind": "visibility-in", "values": ["public"]})).matches_head(&row));
        assert!(filter(json!({"kind": "visibility-in", "values": ["unknown"]})).matches_head(&row));
        assert!(filter(json!({"kind": "user-is", "id": "U1"})).matches_head(&row));
    }

    #[test]
    fn filter_wire_form_round_trips_through_serde() {
        let wire = json!({"kind": "or", "of": [
            {"kind": "all"}, {"kind": "none"},
            {"kind": "channels-in", "ids": ["C1"]},
            {"kind": "user-is", "id": "U1"},
            {"kind": "visibility-in", "values": ["dm", "machine"]},
            {"kind": "and", "of": []},
        ]});
        let parsed = filter(wire.clone());
        assert_eq!(serde_json::to_value(&parsed).expect("ser"), wire);
        let via_serde: VisibilityFilter = serde_json::from_value(wire).expect("derive reads it");
        assert_eq!(via_serde, parsed);
    }

    #[test]
    fn filter_parse_errors_are_typed_and_never_fall_back_to_all() {
        use FilterError as E;
        let cases: Vec<(Value, FilterError)> = vec![
            (json!("all"), E::NotObject { path: "$".into() }),
            (json!({}), E::MissingKind { path: "$".into() }),
            (json!({"kind": 1}), E::MissingKind { path: "$".into() }),
            (
                json!({"kind": "repos-in", "ids": []}),
                E::UnknownKind {
                    path: "$".into(),
                    kind: "repos-in".into(),
                },
            ),
            (
                json!({"kind": "ALL"}),
                E::UnknownKind {
                    path: "$".into(),
                    kind: "ALL".into(),
                },
            ),
            (
                json!({"kind": "all", "ids": []}),
                E::UnexpectedField {
                    path: "$".into(),
                    field: "ids".into(),
                },
            ),
            (
                json!({"kind": "channels-in"}),
                E::Field {
                    path: "$".into(),
                    field: "ids",
                    expected: "an array of strings",
                },
            ),
            (
                json!({"kind": "channels-in", "ids": "C1"}),
                E::Field {
                    path: "$".into(),
                    field: "ids",
                    expected: "an array of strings",
                },
            ),
            (
                json!({"kind": "channels-in", "ids": [1]}),
                E::Field {
                    path: "$".into(),
                    field: "ids",
                    expected: "an array of strings",
                },
            ),
            (
                json!({"kind": "user-is", "id": 5}),
                E::Field {
                    path: "$".into(),
                    field: "id",
                    expected: "a string",
                },
            ),
            (
                json!({"kind": "visibility-in", "values": ["public", "secret"]}),
                E::UnknownVisibility {
                    path: "$".into(),
                    value: "secret".into(),
                },
            ),
            (
                json!({"kind": "visibility-in", "values": [null]}),
                E::Field {
                    path: "$".into(),
                    field: "values",
                    expected: "an array of visibilities",
                },
            ),
            (
                json!({"kind": "or", "of": {}}),
                E::Field {
                    path: "$".into(),
                    field: "of",
                    expected: "an array of filters",
                },
            ),
            (
                json!({"kind": "and", "of": [{"kind": "all"}, {"kind": "nope"}]}),
                E::UnknownKind {
                    path: "$.of[1]".into(),
                    kind: "nope".into(),
                },
            ),
            (
                json!({"kind": "or", "of": [[]]}),
                E::NotObject {
                    path: "$.of[0]".into(),
                },
            ),
        ];
        for (wire, expected) in cases {
            assert_eq!(
                VisibilityFilter::parse(&wire).err(),
                Some(expected),
                "{wire}"
            );
        }
        let message = VisibilityFilter::parse(&json!({"kind": "user-is"}))
            .expect_err("refused")
            .to_string();
        assert_eq!(message, "filter $ field id must be a string");
    }

    /// `levels` nested `or`s around one leaf: depth `levels + 1`.
    fn nested(levels: usize) -> Value {
        (0..levels).fold(
            json!({"kind": "user-is", "id": "U1"}),
            |inner, _| json!({"kind": "or", "of": [inner]}),
        )
    }

    #[test]
    fn filter_depth_is_bounded_to_four() {
        assert!(VisibilityFilter::parse(&nested(MAX_FILTER_DEPTH - 1)).is_ok());
        assert_eq!(
            VisibilityFilter::parse(&nested(MAX_FILTER_DEPTH)).err(),
            Some(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        );
        // a hostile, very deep filter is refused without walking all of it
        assert_eq!(
            VisibilityFilter::parse(&nested(100)).err(),
            Some(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        );
        let too_deep: VisibilityFilter =
            serde_json::from_value(nested(MAX_FILTER_DEPTH)).expect("serde allows it");
        assert_eq!(
            too_deep.validate(),
            Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        );
        assert_eq!(filter(nested(3)).validate(), Ok(()));
    }

    #[test]
    fn filter_width_is_bounded_to_one_hundred_leaf_values() {
        let ids: Vec<String> = (0..MAX_FILTER_LEAVES).map(|i| format!("C{i}")).collect();
        let at_limit = json!({"kind": "channels-in", "ids": ids});
        assert_eq!(filter(at_limit.clone()).validate(), Ok(()));
        // ids, values and user-is all count, across the whole tree
        let over = json!({"kind": "or", "of": [at_limit, {"kind": "user-is", "id": "U1"}]});
        assert_eq!(
            VisibilityFilter::parse(&over).err(),
            Some(FilterError::TooWide {
                max: MAX_FILTER_LEAVES
            })
        );
        let values: Vec<&str> = std::iter::repeat_n("public", 60).collect();
        let split = json!({"kind": "and", "of": [
            {"kind": "visibility-in", "values": values},
            {"kind": "channels-in", "ids": (0..41).map(|i| format!("C{i}")).collect::<Vec<_>>()},
        ]});
        assert_eq!(
            VisibilityFilter::parse(&split).err(),
            Some(FilterError::TooWide {
                max: MAX_FILTER_LEAVES
            })
        );
        let wide: VisibilityFilter = serde_json::from_value(over).expect("serde allows it");
        assert_eq!(
            wide.validate(),
            Err(FilterError::TooWide {
                max: MAX_FILTER_LEAVES
            })
        );
    }

    #[test]
    fn normalized_filter_sorts_and_dedups_sets_without_changing_its_meaning() {
        let f = filter(json!({"kind": "or", "of": [
            {"kind": "channels-in", "ids": ["C3", "C1", "C3", "C2"]},
            {"kind": "visibility-in", "values": ["public", "dm", "public"]},
        ]}));
        let n = f.clone().normalized();
        assert_eq!(
            serde_json::to_value(&n).expect("ser"),
            json!({"kind": "or", "of": [
                {"kind": "channels-in", "ids": ["C1", "C2", "C3"]},
                {"kind": "visibility-in", "values": ["dm", "public"]},
            ]})
        );
        for channel in ["C1", "C4"] {
            for v in ChannelVisibility::ALL {
                assert_eq!(f.matches(channel, "U", v), n.matches(channel, "U", v));
            }
        }
    }

    #[test]
    fn visibility_parse_and_as_str_agree_on_every_value() {
        for v in ChannelVisibility::ALL {
            assert_eq!(ChannelVisibility::parse(v.as_str()), Some(v));
            assert_eq!(serde_json::to_value(v).expect("ser"), json!(v.as_str()));
        }
        assert_eq!(ChannelVisibility::parse("PUBLIC"), None);
        assert_eq!(ChannelVisibility::default(), ChannelVisibility::Unknown);
    }
}
