//! A run's identity, typed once: the one encoder and decoder of the `run_meta` event, the ledger row's
//! `meta_json` and a record's identity fields (SPEC §2, §4.1), so they can never disagree.

use crate::RunId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::record::{ChannelVisibility, RunEvent, Stamp};

/// Longest label (characters) a run gets from its request's first line.
pub const LABEL_CHARS: usize = 80;

/// A run's label: the first line of its request, trimmed, at most [`LABEL_CHARS`] characters.
pub fn label_of(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default().trim();
    let mut label: String = line.chars().take(LABEL_CHARS).collect();
    if line.chars().count() > LABEL_CHARS {
        label.push('…');
    }
    label
}

/// Who and what a run is: stamped on `run_meta`, the ledger row's meta and the record.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RunIdentity {
    pub agent: String,
    pub model: String,
    pub label: String,
    pub thread_key: String,
    pub channel_id: String,
    pub user_id: String,
    /// A stored value this build does not know reads `unknown`, never public.
    #[serde(deserialize_with = "lenient_visibility")]
    pub channel_visibility: ChannelVisibility,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
}

fn lenient_visibility<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<ChannelVisibility, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_str()
        .and_then(ChannelVisibility::parse)
        .unwrap_or_default())
}

impl RunIdentity {
    /// The identity's fields as a JSON object (camelCase).
    pub fn fields(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }

    /// The `run_meta` event (its `seq` and `at` are stamped when it is published).
    pub fn event(&self) -> RunEvent {
        let some = |s: &String| Some(s.clone());
        RunEvent::RunMeta {
            stamp: Stamp::default(),
            agent: some(&self.agent),
            model: some(&self.model),
            label: some(&self.label),
            thread_key: self.thread_key.clone(),
            channel_id: self.channel_id.clone(),
            user_id: self.user_id.clone(),
            channel_visibility: self.channel_visibility,
            parent_run_id: self.parent_run_id.clone(),
        }
    }

    /// The ledger row's `meta_json`: the identity, the deadline (absent: a restart computes it from the
    /// run's start) and the admitted request.
    pub fn meta_json(&self, deadline: Option<i64>, request: &Value) -> Value {
        let mut m = self.fields();
        if let Some(deadline) = deadline {
            m.insert("deadline".into(), Value::from(deadline));
        }
        m.insert("request".into(), request.clone());
        Value::Object(m)
    }

    /// Read a ledger row's `meta_json` (missing fields read empty; the thread key is the row's).
    pub fn from_meta(thread_key: &str, meta: &Value) -> Self {
        let mut identity: RunIdentity = serde_json::from_value(meta.clone()).unwrap_or_default();
        identity.thread_key = thread_key.to_owned();
        identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn identity() -> RunIdentity {
        RunIdentity {
            agent: "demo".into(),
            model: "m".into(),
            label: "hello".into(),
            thread_key: "c:t".into(),
            channel_id: "c".into(),
            user_id: "u".into(),
            channel_visibility: ChannelVisibility::Private,
            parent_run_id: None,
        }
    }

    #[test]
    fn the_event_the_meta_and_the_reader_agree() {
        let id = identity();
        let event = Value::from(id.event());
        assert_eq!(event["type"], "run_meta");
        assert_eq!(
            (
                event["threadKey"].as_str(),
                event["channelVisibility"].as_str()
            ),
            (Some("c:t"), Some("private"))
        );
        assert!(event.get("parentRunId").is_none());
        let meta = id.meta_json(Some(42), &json!({"text": "hello"}));
        assert_eq!(
            (meta["deadline"].as_i64(), meta["request"]["text"].as_str()),
            (Some(42), Some("hello"))
        );
        assert_eq!(RunIdentity::from_meta("c:t", &meta), id);
    }

    #[test]
    fn a_sparse_or_odd_meta_reads_safely() {
        let read = RunIdentity::from_meta(
            "x:y",
            &json!({"agent": "a", "channelVisibility": "galactic"}),
        );
        assert_eq!(
            (read.agent.as_str(), read.thread_key.as_str()),
            ("a", "x:y")
        );
        assert_eq!(
            read.channel_visibility,
            ChannelVisibility::Unknown,
            "never public by accident"
        );
        assert_eq!(
            RunIdentity::from_meta("x:y", &json!(null)).thread_key,
            "x:y"
        );
    }
}
