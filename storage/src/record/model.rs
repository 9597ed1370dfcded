//! The record's shapes and vocabulary: [`RunRecord`], [`RunHead`], [`RunListItem`], [`RunStatus`],
//! [`ChannelVisibility`], [`Diagnosis`]; the events' seq stamps; and the compact-JSON size every other
//! part of the contract measures with ([`json_len`]).
//!
//! The base of the record module: it imports nothing from its siblings.

use crate::RunId;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a run ended. Every finished record carries exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema,
)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CategoryStat {
    pub count: u64,
    pub duration_ms: u64,
}

/// Where a run spent its friction, per category. Kept on the list item too, so the friction
/// ledger is served from a listing without loading events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    pub id: RunId,
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
    pub parent_run_id: Option<RunId>,
    /// Fields this version does not know ride through verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The head field naming a run's status card in its chat thread (SPEC §12), `{channel, ts}`: written by the
/// actors crate, carried in [`RunHead::extra`].
pub const CARD: &str = "card";
/// The head field saying the card shows its closing frame (SPEC §12): `true` once it does.
pub const CARD_CLOSED: &str = "cardClosed";

impl RunHead {
    /// Whether this is a final record whose status card still waits for its closing frame — a `card`
    /// object and no `cardClosed: true` — which the orphan sweep closes (SPEC §12). A provisional record's
    /// card is never open here: its run has not finished, so the card is still its run's (or a reclaim's)
    /// to close.
    pub fn card_open(&self) -> bool {
        !self.provisional
            && self.extra.get(CARD).is_some_and(Value::is_object)
            && self.extra.get(CARD_CLOSED) != Some(&Value::Bool(true))
    }

    /// Mark the card closed (`cardClosed: true`); answers whether it was open ([`RunHead::card_open`]).
    /// A head whose card is not open is left as it is.
    pub fn close_card(&mut self) -> bool {
        if !self.card_open() {
            return false;
        }
        self.extra.insert(CARD_CLOSED.to_owned(), Value::Bool(true));
        true
    }
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

/// Where an `input` event's text came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputSource {
    /// The message that started the run.
    Request,
    /// A follow-up folded into the run; `inbox_seq` names its inbox row when it was read from one.
    Followup { inbox_seq: Option<u64> },
}

/// The `input` event of an accepted message (SPEC §3: exactly one per message): the one builder, for
/// admission, launch, a folded follow-up and a successor's seed. Unstamped (no `seq`, `at`).
pub fn input_event(text: &str, source: InputSource) -> super::RunEvent {
    let (source, inbox_seq) = match source {
        InputSource::Request => (super::InputOrigin::Request, None),
        InputSource::Followup { inbox_seq } => (super::InputOrigin::Followup, inbox_seq),
    };
    super::RunEvent::Input {
        stamp: super::Stamp::default(),
        text: text.to_owned(),
        source,
        inbox_seq,
        truncated: None,
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

/// Largest integer a JSON writer using doubles (the seed's TypeScript) represents exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// A whole number: an integer, or a float with no fraction within the exactly-representable range
/// (a writer using doubles may emit `1.0`).
pub(super) fn whole_i64(v: &Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let x = v.as_f64()?;
    (x.fract() == 0.0 && x.abs() <= MAX_SAFE_INTEGER).then_some(x as i64)
}

/// A whole number >= 0 (see [`whole_i64`]).
pub(super) fn whole_u64(v: &Value) -> Option<u64> {
    if let Some(u) = v.as_u64() {
        return Some(u);
    }
    let x = v.as_f64()?;
    (x.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER).contains(&x)).then_some(x as u64)
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
pub(super) fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut counter = ByteCounter(0);
    serde_json::to_writer(&mut counter, value)
        .expect("records and json values always serialize: string keys, finite numbers");
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::record::fixtures::{good_record, with};
    use crate::record::validate::validate_record;

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

    /// A card is open on a final record with a `card` object and no `cardClosed: true`; closing it once
    /// stamps `cardClosed: true` and a second close changes nothing.
    #[test]
    fn a_card_is_open_until_closed_and_only_on_a_final_record() {
        let card = json!({"channel": "C1", "ts": "1.2"});
        let open = validate_record(&with("card", Some(card.clone()))).expect("valid");
        assert!(open.head.card_open());
        let mut explicit = open.clone();
        explicit.head.extra.insert(CARD_CLOSED.into(), json!(false));
        assert!(explicit.head.card_open(), "cardClosed: false is still open");
        for (what, mut head) in [
            (
                "no card",
                validate_record(&good_record()).expect("valid").head,
            ),
            (
                "a card that is no object",
                validate_record(&with("card", Some(json!("1.2"))))
                    .expect("valid")
                    .head,
            ),
            ("provisional", {
                let mut h = open.head.clone();
                h.provisional = true;
                h
            }),
        ] {
            assert!(!head.card_open(), "{what}");
            let before = head.clone();
            assert!(!head.close_card(), "{what}");
            assert_eq!(head, before, "{what}: left as it is");
        }
        let mut head = explicit.head;
        assert!(head.close_card());
        assert_eq!(head.extra.get(CARD_CLOSED), Some(&json!(true)));
        assert_eq!(head.extra.get(CARD), Some(&card));
        assert!(!head.card_open());
        assert!(!head.close_card());
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

    #[test]
    fn visibility_parse_and_as_str_agree_on_every_value() {
        for v in ChannelVisibility::ALL {
            assert_eq!(ChannelVisibility::parse(v.as_str()), Some(v));
            assert_eq!(serde_json::to_value(v).expect("ser"), json!(v.as_str()));
        }
        assert_eq!(ChannelVisibility::parse("PUBLIC"), None);
        assert_eq!(ChannelVisibility::default(), ChannelVisibility::Unknown);
    }

    /// The one `input` builder: a request, a follow-up read from the inbox, a follow-up a successor seeds.
    #[test]
    fn input_events_name_their_source() {
        assert_eq!(
            Value::from(input_event("hi", InputSource::Request)),
            json!({"type": "input", "text": "hi", "source": "request"})
        );
        assert_eq!(
            Value::from(input_event(
                "more",
                InputSource::Followup { inbox_seq: Some(3) }
            )),
            json!({"type": "input", "text": "more", "source": "followup", "inboxSeq": 3})
        );
        assert_eq!(
            Value::from(input_event(
                "more",
                InputSource::Followup { inbox_seq: None }
            )),
            json!({"type": "input", "text": "more", "source": "followup"})
        );
    }
}
