//! Process metrics, rendered as Prometheus text on `GET /metrics`.
//!
//! Counters are atomics or small labelled maps behind a `std::sync::Mutex` (held only to bump or read a
//! number, never across an await). Gauges (live runs, SSE subscribers) are read at render time from
//! their owners, so they can never drift.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub struct Metrics {
    pub runs_started: AtomicU64,
    pub steps: AtomicU64,
    pub fences: AtomicU64,
    /// Event batches the flusher could not append (shared with the flusher).
    pub event_batch_failures: Arc<AtomicU64>,
    runs_finished: Mutex<BTreeMap<String, u64>>,
    ledger_writes: Mutex<BTreeMap<String, u64>>,
    ledger_refusals: Mutex<BTreeMap<String, u64>>,
    reclaims: Mutex<BTreeMap<String, u64>>,
    restarts: Mutex<BTreeMap<String, u64>>,
    /// Tokens by `agent="…",model="…",kind="input|output"`.
    tokens: Mutex<BTreeMap<String, u64>>,
}

fn bump(map: &Mutex<BTreeMap<String, u64>>, label: &str, by: u64) {
    *map.lock().unwrap_or_else(|p| p.into_inner()).entry(label.to_owned()).or_default() += by;
}

fn labelled(out: &mut String, name: &str, help: &str, label: &str, map: &Mutex<BTreeMap<String, u64>>) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (k, v) in map.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {v}");
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn single(out: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

/// Gauges and counters owned elsewhere, read at render time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Observed {
    pub live_runs: u64,
    pub sse_subscribers: u64,
    pub history_write_failures: u64,
}

impl Metrics {
    pub fn shared() -> Arc<Metrics> {
        Arc::default()
    }

    pub fn run_finished(&self, status: &str) {
        bump(&self.runs_finished, status, 1);
    }

    /// One owner write to the ledger; `refusal` names its kind when it was refused.
    pub fn ledger_write(&self, op: &str, refusal: Option<&str>) {
        bump(&self.ledger_writes, op, 1);
        if let Some(kind) = refusal {
            bump(&self.ledger_refusals, kind, 1);
        }
    }

    pub fn reclaimed(&self, outcome: &str, n: u64) {
        if n > 0 {
            bump(&self.reclaims, outcome, n);
        }
    }

    /// A run actor failed and the supervisor re-adopts (or closes) its run; `reason` is
    /// `panicked` or `storage_lost`.
    pub fn run_restart(&self, reason: &str) {
        bump(&self.restarts, reason, 1);
    }

    /// Tokens a model call used, by agent and model (SPEC §8.3).
    pub fn tokens(&self, agent: &str, model: &str, input: u64, output: u64) {
        let label = |kind: &str| format!("agent=\"{}\",model=\"{}\",kind=\"{kind}\"", escape_label(agent), escape_label(model));
        bump(&self.tokens, &label("input"), input);
        bump(&self.tokens, &label("output"), output);
    }

    /// Run actors that failed, by reason.
    pub fn restarts(&self, reason: &str) -> u64 {
        self.restarts.lock().unwrap_or_else(|p| p.into_inner()).get(reason).copied().unwrap_or(0)
    }

    pub fn render(&self, observed: Observed) -> String {
        let mut out = String::new();
        single(&mut out, "switchboard_runs_started_total", "Runs started in this process.", "counter", self.runs_started.load(Ordering::Relaxed));
        labelled(&mut out, "switchboard_runs_finished_total", "Runs finished in this process, by status.", "status", &self.runs_finished);
        single(&mut out, "switchboard_live_runs", "Runs this process is driving now.", "gauge", observed.live_runs);
        single(&mut out, "switchboard_steps_total", "Durable steps written.", "counter", self.steps.load(Ordering::Relaxed));
        labelled(&mut out, "switchboard_ledger_writes_total", "Owner writes to the live-run ledger, by operation.", "op", &self.ledger_writes);
        labelled(&mut out, "switchboard_ledger_refusals_total", "Ledger refusals, by kind.", "kind", &self.ledger_refusals);
        single(&mut out, "switchboard_fences_total", "Runs this process found fenced by another generation.", "counter", self.fences.load(Ordering::Relaxed));
        labelled(&mut out, "switchboard_reclaims_total", "Reclaimed rows, by outcome.", "outcome", &self.reclaims);
        let _ = writeln!(out, "# HELP switchboard_tokens_total Model tokens, by agent, model and kind.\n# TYPE switchboard_tokens_total counter");
        for (labels, v) in self.tokens.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = writeln!(out, "switchboard_tokens_total{{{labels}}} {v}");
        }
        labelled(&mut out, "switchboard_run_restarts_total", "Run actors that failed and were re-adopted or closed, by reason.", "reason", &self.restarts);
        single(&mut out, "switchboard_history_write_failures_total", "Record writes lost after retries.", "counter", observed.history_write_failures);
        single(&mut out, "switchboard_event_batch_failures_total", "Event batches the ledger refused or could not take.", "counter", self.event_batch_failures.load(Ordering::Relaxed));
        single(&mut out, "switchboard_sse_subscribers", "Live event subscribers.", "gauge", observed.sse_subscribers);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_prometheus_text_with_labels() {
        let m = Metrics::default();
        m.runs_started.fetch_add(2, Ordering::Relaxed);
        m.run_finished("completed");
        m.ledger_write("step", Some("fenced"));
        m.reclaimed("resumed", 3);
        let text = m.render(Observed { live_runs: 1, ..Default::default() });
        assert!(text.contains("switchboard_runs_started_total 2"));
        assert!(text.contains("switchboard_runs_finished_total{status=\"completed\"} 1"));
        assert!(text.contains("switchboard_ledger_refusals_total{kind=\"fenced\"} 1"));
        assert!(text.contains("switchboard_reclaims_total{outcome=\"resumed\"} 3"));
        assert!(text.contains("# TYPE switchboard_live_runs gauge\nswitchboard_live_runs 1"));
    }
}
