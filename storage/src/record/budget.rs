//! The byte budget: one event capped to [`MAX_EVENT_BYTES`] ([`cap_event_for_publish`], and the
//! private `cap_event` both paths share) and a whole record fitted to [`MAX_RECORD_BYTES`]
//! ([`fit_record_to_budget`]). Sizes are measured, never built: [`json_len`] counts the encoding.

use std::borrow::Cow;

use serde_json::Value;

use super::model::{json_len, RunHead, RunRecord};

/// The whole-record budget: a stored record's JSON never exceeds 1.5 MiB.
pub const MAX_RECORD_BYTES: usize = 1_572_864;

/// The per-event cap: one event's JSON never exceeds 64 KiB after [`fit_record_to_budget`].
pub const MAX_EVENT_BYTES: usize = 65_536;

/// The ellipsis that marks a capped `text` or `summary` (U+2026, three UTF-8 bytes, never escaped).
const ELLIPSIS: &str = "\u{2026}";

/// Event types whose content is `text`; every other type is capped on `summary`.
const TEXT_EVENT_TYPES: [&str; 4] = ["input", "context", "assistant", "answer"];

/// `record` fitted to `max_bytes` of JSON (SPEC §2 byte budget); a record that fits untouched is
/// answered as it is.
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
pub fn fit_record_to_budget(record: RunRecord, max_bytes: usize) -> RunRecord {
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
        if capped.iter().all(|e| matches!(e, Cow::Borrowed(_))) {
            // Every event fits as it is (the usual case): the record is the answer, uncopied.
            drop(capped);
            return record;
        }
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
    let flag = if event.get("truncated") == Some(&Value::Bool(true)) {
        0
    } else {
        TRUNCATED_FLAG.len()
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::record::fixtures::good_record;
    use crate::record::model::stored_event_seqs;
    use crate::record::validate::validate_record;

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

        let fitted = fit_record_to_budget(source, MAX_RECORD_BYTES);

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
        let fitted = fit_record_to_budget(source.clone(), MAX_RECORD_BYTES);
        assert_eq!(fitted, source);
        assert!(!fitted.head.truncated);
        // a record the registry already truncated stays truncated, counts untouched
        let mut backlog_cut = source.clone();
        backlog_cut.head.truncated = true;
        backlog_cut.head.event_count = 50;
        assert_eq!(
            fit_record_to_budget(backlog_cut.clone(), MAX_RECORD_BYTES),
            backlog_cut
        );
    }

    #[test]
    fn two_hundred_kilobyte_summary_is_capped_with_a_trailing_ellipsis() {
        let big = json!({"type": "tool_result", "seq": 1, "at": 1, "callId": "c", "tool": "bash",
                         "ok": true, "step": 1, "summary": "s".repeat(200_000), "text": "untouched"});
        let source = record_with_events(vec![big]);
        let fitted = fit_record_to_budget(source.clone(), MAX_RECORD_BYTES);
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
            let fitted = fit_record_to_budget(record_with_events(vec![big]), MAX_RECORD_BYTES);
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
        let fitted = fit_record_to_budget(record_with_events(vec![big]), MAX_RECORD_BYTES);
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
        let fitted = fit_record_to_budget(record_with_events(vec![big]), MAX_RECORD_BYTES);
        let size = serde_json::to_vec(&fitted.events[0]).expect("ser").len();
        assert!(
            size <= MAX_EVENT_BYTES && size > MAX_EVENT_BYTES - 8,
            "{size}"
        );
    }

    #[test]
    fn oversized_event_without_a_cappable_string_is_left_to_the_record_budget() {
        let odd = json!({"type": "tool_result", "seq": 1, "at": 1, "summary": 5, "output": "o".repeat(100_000)});
        let fitted = fit_record_to_budget(record_with_events(vec![odd.clone()]), MAX_RECORD_BYTES);
        assert_eq!(fitted.events, vec![odd]);
    }

    #[test]
    fn capped_events_that_fit_keep_every_event_and_truncated_unchanged() {
        // 20 events of 200 KB: 4 MB before capping, ~1.3 MB after, so nothing is dropped.
        let events: Vec<Value> = (1..=20u64)
            .map(|seq| json!({"type": "context", "seq": seq, "at": seq, "text": "c".repeat(200_000)}))
            .collect();
        let fitted = fit_record_to_budget(record_with_events(events), MAX_RECORD_BYTES);
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
        let fitted = fit_record_to_budget(source.clone(), budget);
        assert_eq!(stored_event_seqs(&fitted.events), vec![1, 2, 10]);
        assert!(fitted.encoded_len() <= budget);
        assert_eq!(fitted.head.stored_event_count, 3);
        assert_eq!(fitted.head.event_count, 10);
    }
}
