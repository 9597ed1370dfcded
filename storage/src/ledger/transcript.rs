//! A run's transcript as read back from its rows (seed item 32): in order, up to the first gap.

use serde_json::Value;

use super::Turn;

/// A run's transcript as read back (seed item 32): its turns in order up to the first missing turn or
/// part, and that gap when there is one — a resume never rebuilds a conversation with a hole in it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Transcript {
    pub turns: Vec<Turn>,
    pub gap: Option<TranscriptGap>,
}

/// What is missing where a transcript stops short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranscriptGap {
    /// Turn `idx` has no row, though a later turn has.
    Turn { idx: u64 },
    /// Turn `idx` has a part after `part` but not `part` itself.
    Part { idx: u64, part: u64 },
}

impl std::fmt::Display for TranscriptGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TranscriptGap::Turn { idx } => write!(f, "turn {idx} is missing"),
            TranscriptGap::Part { idx, part } => write!(f, "part {part} of turn {idx} is missing"),
        }
    }
}

impl Transcript {
    /// Assemble rows `(idx, part, json)` in `(idx, part)` order — every backend's one reading of its
    /// transcript rows. Stops at the first gap: the turns before it are kept and the gap is named.
    pub fn assemble(
        rows: impl IntoIterator<Item = (u64, u64, String)>,
    ) -> crate::Result<Transcript> {
        let mut turns: Vec<Turn> = Vec::new();
        let mut last: Option<(u64, u64)> = None;
        for (idx, part, json) in rows {
            let expected = match last {
                None => (0, 0),
                Some((i, p)) if i == idx => (i, p + 1),
                Some((i, _)) => (i + 1, 0),
            };
            if (idx, part) != expected {
                let (want_idx, want_part) = expected;
                if idx != want_idx {
                    return Ok(Transcript {
                        turns,
                        gap: Some(TranscriptGap::Turn { idx: want_idx }),
                    });
                }
                // A part missing makes its turn unusable: the turn is cut whole.
                if want_part > 0 {
                    turns.pop();
                }
                return Ok(Transcript {
                    turns,
                    gap: Some(TranscriptGap::Part {
                        idx: want_idx,
                        part: want_part,
                    }),
                });
            }
            let mut v: Value = serde_json::from_str(&json)
                .map_err(|e| crate::Error::corrupt("transcript.json", e))?;
            let role = v
                .get("role")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let part_value = v.get_mut("part").map(Value::take).unwrap_or(Value::Null);
            if last.is_some_and(|(i, _)| i == idx) {
                if let Some(turn) = turns.last_mut() {
                    turn.parts.push(part_value);
                }
            } else {
                turns.push(Turn {
                    role,
                    parts: vec![part_value],
                });
            }
            last = Some((idx, part));
        }
        Ok(Transcript { turns, gap: None })
    }
}

#[cfg(test)]
mod transcript_tests {
    use super::{Transcript, TranscriptGap};
    use crate::ledger::Turn;
    use serde_json::json;

    fn row(idx: u64, part: u64) -> (u64, u64, String) {
        (
            idx,
            part,
            json!({"role": "user", "part": format!("{idx}.{part}")}).to_string(),
        )
    }

    fn read(rows: &[(u64, u64)]) -> (usize, Option<TranscriptGap>) {
        let t = Transcript::assemble(rows.iter().map(|&(i, p)| row(i, p))).unwrap();
        (t.turns.len(), t.gap)
    }

    #[test]
    fn assembly_stops_at_the_first_missing_turn_or_part_and_names_it() {
        assert_eq!(read(&[]), (0, None));
        assert_eq!(read(&[(0, 0), (0, 1), (1, 0)]), (2, None));
        let whole = Transcript::assemble([row(0, 0), row(0, 1)]).unwrap();
        assert_eq!(
            whole.turns,
            vec![Turn {
                role: "user".into(),
                parts: vec![json!("0.0"), json!("0.1")]
            }]
        );
        assert_eq!(read(&[(1, 0)]), (0, Some(TranscriptGap::Turn { idx: 0 })));
        assert_eq!(
            read(&[(0, 1)]),
            (0, Some(TranscriptGap::Part { idx: 0, part: 0 }))
        );
        assert_eq!(
            read(&[(0, 0), (2, 0)]),
            (1, Some(TranscriptGap::Turn { idx: 1 }))
        );
        // A part missing inside a turn cuts that turn whole.
        assert_eq!(
            read(&[(0, 0), (1, 0), (1, 2), (2, 0)]),
            (1, Some(TranscriptGap::Part { idx: 1, part: 1 }))
        );
        assert_eq!(
            read(&[(0, 0), (1, 1)]),
            (1, Some(TranscriptGap::Part { idx: 1, part: 0 }))
        );
    }
}
