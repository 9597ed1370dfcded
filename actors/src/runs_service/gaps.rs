//! Reading a live run's events from the ledger without skipping any: where a gap in the seqs may still
//! fill.
//!
//! The ledger's events of a run are not committed in seq order: a step's own events commit with the step,
//! the others (tool results, notes) with the owner's next flush, up to [`crate::flusher::FLUSH_INTERVAL`]
//! later. A reader that took every event past its cursor and moved the cursor to the highest would skip
//! the late ones for good. So readers serve only the settled prefix ([`settled_prefix`]): events up to the
//! first gap that may still fill. A gap is final when the event after it is a `resumed` (a new owner
//! continued past whatever the old one never wrote) or was published more than [`GAP_PATIENCE_MS`] ago
//! (what a crash or a dropped batch lost never commits).

use serde_json::Value;
use storage::record::event_seq;

/// How long after the event that follows a gap the missing events may still commit (four flush
/// intervals). Compared with the owner's `at` stamps, so a host clock skewed by more than this either
/// serves a gap early or holds it for the skew.
pub const GAP_PATIENCE_MS: i64 = 2_000;

/// How many of `events` (sorted by seq, all past `after_seq`) a reader may serve now, and, when it must
/// hold at a gap, when (service clock, epoch ms) that gap becomes final.
pub fn settled_prefix(events: &[Value], after_seq: u64, now_ms: i64) -> (usize, Option<i64>) {
    let mut last = after_seq;
    for (i, e) in events.iter().enumerate() {
        let Some(seq) = event_seq(e) else { continue };
        if seq > last.saturating_add(1) && e.get("type").and_then(Value::as_str) != Some("resumed")
        {
            let final_at = e
                .get("at")
                .and_then(Value::as_i64)
                .unwrap_or(i64::MIN)
                .saturating_add(GAP_PATIENCE_MS);
            if final_at > now_ms {
                return (i, Some(final_at));
            }
        }
        last = seq;
    }
    (events.len(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: u64, at: i64) -> Value {
        json!({"type": "note", "seq": seq, "at": at})
    }

    #[test]
    fn a_fresh_gap_holds_an_old_one_or_one_closed_by_a_resume_does_not() {
        let now = 10_000;
        // Unbroken: everything.
        assert_eq!(settled_prefix(&[ev(5, now), ev(6, now)], 4, now), (2, None));
        // Seqs 2 and 3 may still commit: serve 1, hold until 2 s after seq 4 was published.
        assert_eq!(
            settled_prefix(&[ev(1, now), ev(4, now - 500), ev(5, now)], 0, now),
            (1, Some(now + 1_500))
        );
        // A gap right at the cursor holds everything.
        assert_eq!(
            settled_prefix(&[ev(9, now)], 7, now),
            (0, Some(now + GAP_PATIENCE_MS))
        );
        // Published long enough ago: the missing events were lost (a crash, a dropped batch).
        assert_eq!(
            settled_prefix(
                &[ev(1, now), ev(4, now - GAP_PATIENCE_MS), ev(5, now)],
                0,
                now
            ),
            (3, None)
        );
        // A resume continues past what the old owner never wrote.
        let resumed = json!({"type": "resumed", "seq": 1007, "at": now});
        assert_eq!(
            settled_prefix(&[ev(6, now), resumed, ev(1008, now)], 5, now),
            (3, None)
        );
        // Only the first fresh gap counts.
        assert_eq!(
            settled_prefix(&[ev(3, now - 5_000), ev(4, now), ev(6, now)], 1, now),
            (2, Some(now + GAP_PATIENCE_MS))
        );
    }
}
