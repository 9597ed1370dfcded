//! Retention: how long and how much finished history a store keeps ([`RetentionPolicy`]), the one
//! listing order ([`newest_first`]) and the kept set ([`apply_retention`]) every store agrees on.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use super::model::{RunHead, RunListItem};

const MS_PER_DAY: i64 = 86_400_000;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::record::fixtures::good_record;
    use crate::record::validate::validate_record;

    fn head(id: &str, finished_at: i64) -> RunHead {
        let mut record = validate_record(&good_record()).expect("fixture is valid");
        record.head.id = id.into();
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
}
