//! Test fixtures shared by the record module's unit tests: one well-formed record as a writer stores
//! it, and variations of it.

use serde_json::{json, Value};

use super::model::Diagnosis;

/// A well-formed record as a writer would store it, with `events`.
pub(super) fn record_json(events: Value) -> Value {
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

pub(super) fn good_record() -> Value {
    record_json(json!([
        {"type": "input", "seq": 1, "at": 1, "text": "hello", "source": "request"},
        {"type": "answer", "seq": 2, "at": 2, "text": "hi"},
    ]))
}

/// `good_record` with `key` set to `value` (or removed when `value` is `None`).
pub(super) fn with(key: &str, value: Option<Value>) -> Value {
    let mut v = good_record();
    let obj = v.as_object_mut().expect("fixture is an object");
    match value {
        Some(value) => obj.insert(key.to_owned(), value),
        None => obj.remove(key),
    };
    v
}
