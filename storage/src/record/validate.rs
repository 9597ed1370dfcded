//! The one gate stored or submitted JSON passes through: [`validate_record`] and
//! [`validate_list_item`] (SPEC §2), with the run-id shape ([`is_valid_run_id`]) and the typed
//! [`RecordError`] naming the offending field.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::model::{
    whole_i64, whole_u64, CategoryStat, ChannelVisibility, Diagnosis, RunHead, RunListItem,
    RunRecord, RunStatus,
};

/// The longest run id; ids are path and SQL safe by construction (`^[A-Za-z0-9_-]{1,64}$`).
const MAX_RUN_ID_LEN: usize = 64;

/// How much of an offending value an error message repeats, so a hostile row cannot bloat logs.
const ECHO_CHARS: usize = 64;

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
    let (head, events) = validated(v)?;
    Ok(RunRecord {
        head,
        events: events.clone(),
    })
}

/// [`validate_record`] of a value the caller gives up: its events move into the record, uncopied.
pub fn into_record(mut v: Value) -> Result<RunRecord, RecordError> {
    let head = validated(&v)?.0;
    let Some(Value::Array(events)) = v.get_mut("events").map(Value::take) else {
        return Err(RecordError::Missing { field: "events" }); // `validated` saw an array
    };
    Ok(RunRecord { head, events })
}

/// The record's head and its events, each event an object with a string `type`.
fn validated(v: &Value) -> Result<(RunHead, &Vec<Value>), RecordError> {
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
    Ok((head, events))
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
        id: id.into(),
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
        parent_run_id: parent_run_id.map(Into::into),
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

/// At most [`ECHO_CHARS`] of an offending value, for an error message.
pub(super) fn echo(s: &str) -> String {
    s.chars().take(ECHO_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::record::fixtures::{good_record, record_json, with};
    use crate::record::model::DIAGNOSIS_CATEGORIES;

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
        assert_eq!(into_record(back).expect("valid by value"), record);
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
            let by_value = into_record(value.clone()).err();
            assert_eq!(validate_record(&value).err(), by_value, "{name}: by value");
            assert_eq!(by_value, Some(expected), "{name}");
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
}
