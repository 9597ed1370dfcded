//! Process metrics, rendered as Prometheus text (format 0.0.4) on `GET /metrics` by the maintained
//! `prometheus-client` crate (SPEC §8.1).
//!
//! Counters, gauges and histograms live in one `prometheus_client` registry owned by [`Metrics`]; the
//! crate appends the conventional suffixes (`_total` for counters, `_seconds` for the histograms'
//! unit, `_info` for build info). Values owned elsewhere — live runs, SSE subscribers, record writes lost
//! after retries, event batches the flusher could not append — are sampled at render time from their
//! owners (a [`Collector`] reads them on each scrape), so they can never drift.
//!
//! Label values are fixed snake_case words (statuses, operations, outcomes, reasons, status classes),
//! agent, model and tool names as configured, and route patterns (`/api/runs/{id}`), never a raw path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Upper bounds (seconds) of the run duration buckets: runs last seconds to the drain deadline (15 min).
const RUN_BUCKETS: [f64; 12] = [
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
/// A durable step is one group commit: sub-millisecond to a few hundred under load or retries.
const COMMIT_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Model and tool calls: milliseconds (scripted, local tools) to minutes (real models, HTTP tools).
const CALL_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];
/// HTTP answers (an SSE stream counts until its head is sent).
const HTTP_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

fn run_histogram() -> Histogram {
    Histogram::new(RUN_BUCKETS)
}
fn commit_histogram() -> Histogram {
    Histogram::new(COMMIT_BUCKETS)
}
fn call_histogram() -> Histogram {
    Histogram::new(CALL_BUCKETS)
}
fn http_histogram() -> Histogram {
    Histogram::new(HTTP_BUCKETS)
}

type Labelled<L> = Family<L, Counter>;
type Timed<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    agent: String,
    model: String,
    kind: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    agent: String,
    model: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: String,
    status_class: String,
}

/// A fixed label value in snake_case: `"step record"` → `"step_record"`.
fn snake(word: &str) -> String {
    word.trim().to_ascii_lowercase().replace([' ', '-'], "_")
}

/// `"2xx"` … `"5xx"` for an HTTP status.
pub fn status_class(status: u16) -> String {
    format!("{}xx", (status / 100).clamp(1, 5))
}

/// Gauges and counters owned elsewhere, read at render time.
#[derive(Debug, Default, Clone, Copy)]
pub struct Observed {
    pub live_runs: u64,
    pub sse_subscribers: u64,
    pub history_write_failures: u64,
}

/// What the [`Sampled`] collector reports on the next scrape.
#[derive(Debug, Default)]
struct Sampled {
    live_runs: AtomicU64,
    sse_subscribers: AtomicU64,
    history_write_failures: AtomicU64,
    /// Shared with the flusher, which bumps it.
    event_batch_failures: Arc<AtomicU64>,
}

impl Sampled {
    fn counter(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        v: &AtomicU64,
    ) -> Result<(), std::fmt::Error> {
        let c = ConstCounter::new(v.load(Ordering::Relaxed));
        c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
    }

    fn gauge(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        v: &AtomicU64,
    ) -> Result<(), std::fmt::Error> {
        let g = ConstGauge::new(i64::try_from(v.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
        g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
    }
}

impl Collector for Sampled {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        Self::gauge(
            &mut encoder,
            "switchboard_live_runs",
            "Runs this process is driving now.",
            &self.live_runs,
        )?;
        Self::gauge(
            &mut encoder,
            "switchboard_sse_subscribers",
            "Live event subscribers.",
            &self.sse_subscribers,
        )?;
        Self::counter(
            &mut encoder,
            "switchboard_history_write_failures",
            "Record writes lost after retries.",
            &self.history_write_failures,
        )?;
        Self::counter(
            &mut encoder,
            "switchboard_event_batch_failures",
            "Event batches the ledger refused or could not take.",
            &self.event_batch_failures,
        )
    }
}

#[derive(Debug)]
pub struct Metrics {
    pub runs_started: Counter,
    pub steps: Counter,
    pub fences: Counter,
    /// Event batches the flusher could not append (shared with the flusher).
    pub event_batch_failures: Arc<AtomicU64>,
    runs_finished: Labelled<StatusLabel>,
    ledger_writes: Labelled<OpLabel>,
    ledger_refusals: Labelled<KindLabel>,
    reclaims: Labelled<OutcomeLabel>,
    restarts: Labelled<ReasonLabel>,
    tokens: Labelled<TokenLabels>,
    run_duration: Timed<StatusLabel>,
    step_commit: Histogram,
    model_call: Timed<ModelLabels>,
    tool_call: Timed<ToolLabel>,
    http_request: Timed<HttpLabels>,
    sampled: Arc<Sampled>,
    registry: Registry,
}

impl Default for Metrics {
    /// Build info names this crate's version; the server uses [`Metrics::new`] with the binary's.
    fn default() -> Self {
        Metrics::new(env!("CARGO_PKG_VERSION"))
    }
}

impl Metrics {
    /// Every metric registered, with `switchboard_build_info{version}` = 1.
    pub fn new(version: &str) -> Self {
        let mut registry = Registry::default();
        let runs_started = Counter::default();
        let steps = Counter::default();
        let fences = Counter::default();
        let runs_finished = Labelled::<StatusLabel>::default();
        let ledger_writes = Labelled::<OpLabel>::default();
        let ledger_refusals = Labelled::<KindLabel>::default();
        let reclaims = Labelled::<OutcomeLabel>::default();
        let restarts = Labelled::<ReasonLabel>::default();
        let tokens = Labelled::<TokenLabels>::default();
        let run_duration =
            Timed::<StatusLabel>::new_with_constructor(run_histogram as fn() -> Histogram);
        let step_commit = commit_histogram();
        let model_call =
            Timed::<ModelLabels>::new_with_constructor(call_histogram as fn() -> Histogram);
        let tool_call =
            Timed::<ToolLabel>::new_with_constructor(call_histogram as fn() -> Histogram);
        let http_request =
            Timed::<HttpLabels>::new_with_constructor(http_histogram as fn() -> Histogram);
        let sampled = Arc::new(Sampled::default());

        // Help texts without a final period: prometheus-client adds it.
        let r = &mut registry;
        r.register(
            "switchboard_build",
            "The running binary's version (always 1)",
            Info::new(vec![("version".to_owned(), version.to_owned())]),
        );
        r.register(
            "switchboard_runs_started",
            "Runs started in this process",
            runs_started.clone(),
        );
        r.register(
            "switchboard_runs_finished",
            "Runs finished in this process, by status",
            runs_finished.clone(),
        );
        r.register("switchboard_steps", "Durable steps written", steps.clone());
        r.register(
            "switchboard_ledger_writes",
            "Owner writes to the live-run ledger, by operation",
            ledger_writes.clone(),
        );
        r.register(
            "switchboard_ledger_refusals",
            "Ledger refusals, by kind",
            ledger_refusals.clone(),
        );
        r.register(
            "switchboard_fences",
            "Runs this process found fenced by another generation",
            fences.clone(),
        );
        r.register(
            "switchboard_reclaims",
            "Reclaimed rows, by outcome",
            reclaims.clone(),
        );
        r.register(
            "switchboard_tokens",
            "Model tokens, by agent, model and kind",
            tokens.clone(),
        );
        r.register(
            "switchboard_run_restarts",
            "Run actors that failed and were re-adopted or closed, by reason",
            restarts.clone(),
        );
        r.register_with_unit(
            "switchboard_run_duration",
            "Run duration from start to finish, by final status",
            Unit::Seconds,
            run_duration.clone(),
        );
        r.register_with_unit(
            "switchboard_step_commit",
            "Durable step write latency (turns, events and step record in one commit)",
            Unit::Seconds,
            step_commit.clone(),
        );
        r.register_with_unit(
            "switchboard_model_call",
            "Model call latency (retries included), by agent and model",
            Unit::Seconds,
            model_call.clone(),
        );
        r.register_with_unit(
            "switchboard_tool_call",
            "Tool call latency (its workspace claim included), by tool",
            Unit::Seconds,
            tool_call.clone(),
        );
        r.register_with_unit(
            "switchboard_http_request_duration",
            "HTTP request latency until the response head, by route pattern and status class",
            Unit::Seconds,
            http_request.clone(),
        );
        r.register_collector(Box::new(sampled.clone()));
        let event_batch_failures = sampled.event_batch_failures.clone();
        Metrics {
            runs_started,
            steps,
            fences,
            event_batch_failures,
            runs_finished,
            ledger_writes,
            ledger_refusals,
            reclaims,
            restarts,
            tokens,
            run_duration,
            step_commit,
            model_call,
            tool_call,
            http_request,
            sampled,
            registry,
        }
    }

    /// Shared metrics reporting `version` as the build.
    pub fn shared(version: &str) -> Arc<Metrics> {
        Arc::new(Metrics::new(version))
    }

    pub fn run_finished(&self, status: &str) {
        self.runs_finished
            .get_or_create(&StatusLabel {
                status: snake(status),
            })
            .inc();
    }

    /// A run's duration from its start to its finish (a resumed run counts from its first start).
    pub fn run_duration(&self, status: &str, took: Duration) {
        self.run_duration
            .get_or_create(&StatusLabel {
                status: snake(status),
            })
            .observe(took.as_secs_f64());
    }

    /// One durable step write (its retries included), committed or not.
    pub fn step_commit(&self, took: Duration) {
        self.step_commit.observe(took.as_secs_f64());
    }

    /// One model call (its retries included), by agent and model as configured.
    pub fn model_call(&self, agent: &str, model: &str, took: Duration) {
        self.model_call
            .get_or_create(&ModelLabels {
                agent: agent.to_owned(),
                model: model.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// One tool call (from its workspace claim to its output), by the tool's configured name (`not_available` for a tool the agent may not call).
    pub fn tool_call(&self, tool: &str, took: Duration) {
        self.tool_call
            .get_or_create(&ToolLabel {
                tool: tool.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// One HTTP request by route pattern (`unmatched` when no route has the path) and status.
    pub fn http_request(&self, route: Option<&str>, status: u16, took: Duration) {
        let labels = HttpLabels {
            route: route.unwrap_or("unmatched").to_owned(),
            status_class: status_class(status),
        };
        self.http_request
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// One owner write to the ledger; `refusal` names its kind when it was refused.
    pub fn ledger_write(&self, op: &str, refusal: Option<&str>) {
        self.ledger_writes
            .get_or_create(&OpLabel { op: snake(op) })
            .inc();
        if let Some(kind) = refusal {
            self.ledger_refusals
                .get_or_create(&KindLabel { kind: snake(kind) })
                .inc();
        }
    }

    pub fn reclaimed(&self, outcome: &str, n: u64) {
        if n > 0 {
            self.reclaims
                .get_or_create(&OutcomeLabel {
                    outcome: snake(outcome),
                })
                .inc_by(n);
        }
    }

    /// A run actor failed and the supervisor re-adopts (or closes) its run; `reason` is
    /// `panicked` or `storage_lost`.
    pub fn run_restart(&self, reason: &str) {
        self.restarts
            .get_or_create(&ReasonLabel {
                reason: snake(reason),
            })
            .inc();
    }

    /// Tokens a model call used, by agent and model (SPEC §8.3).
    pub fn tokens(&self, agent: &str, model: &str, input: u64, output: u64) {
        for (kind, n) in [("input", input), ("output", output)] {
            let labels = TokenLabels {
                agent: agent.to_owned(),
                model: model.to_owned(),
                kind: kind.to_owned(),
            };
            self.tokens.get_or_create(&labels).inc_by(n);
        }
    }

    /// Run actors that failed, by reason.
    pub fn restarts(&self, reason: &str) -> u64 {
        self.restarts
            .get(&ReasonLabel {
                reason: snake(reason),
            })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// The Prometheus text page, with `observed` as the sampled values.
    pub fn render(&self, observed: Observed) -> String {
        self.sampled
            .live_runs
            .store(observed.live_runs, Ordering::Relaxed);
        self.sampled
            .sse_subscribers
            .store(observed.sse_subscribers, Ordering::Relaxed);
        self.sampled
            .history_write_failures
            .store(observed.history_write_failures, Ordering::Relaxed);
        let mut out = String::new();
        // Writing to a `String` cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// The `Content-Type` of [`Metrics::render`]'s page.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_prometheus_text_with_labels_suffixes_and_build_info() {
        let m = Metrics::new("9.8.7");
        m.runs_started.inc_by(2);
        m.run_finished("completed");
        m.ledger_write("step record", Some("fenced"));
        m.reclaimed("resumed", 3);
        m.reclaimed("closed", 0);
        m.event_batch_failures.fetch_add(5, Ordering::Relaxed);
        m.tokens("gpt \"x\"", "m", 3, 4);
        let text = m.render(Observed {
            live_runs: 1,
            history_write_failures: 2,
            ..Default::default()
        });
        assert!(
            text.contains("switchboard_build_info{version=\"9.8.7\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE switchboard_build_info gauge"),
            "{text}"
        );
        assert!(!text.contains(".."), "a help text ends twice: {text}");
        assert!(
            text.contains("switchboard_runs_started_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_runs_finished_total{status=\"completed\"} 1\n"),
            "{text}"
        );
        // Fixed label values are snake_case.
        assert!(
            text.contains("switchboard_ledger_writes_total{op=\"step_record\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_ledger_refusals_total{kind=\"fenced\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_reclaims_total{outcome=\"resumed\"} 3\n"),
            "{text}"
        );
        assert!(!text.contains("outcome=\"closed\""), "{text}");
        // Configured names pass as they are, escaped.
        assert!(
            text.contains(
                "switchboard_tokens_total{agent=\"gpt \\\"x\\\"\",model=\"m\",kind=\"output\"} 4\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("# TYPE switchboard_live_runs gauge\nswitchboard_live_runs 1\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_history_write_failures_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_event_batch_failures_total 5\n"),
            "{text}"
        );
        // The sampled values follow their owners on the next scrape.
        let text = m.render(Observed::default());
        assert!(text.contains("switchboard_live_runs 0\n"), "{text}");
    }

    #[test]
    fn histograms_count_their_observations_in_seconds_by_label() {
        let m = Metrics::default();
        m.step_commit(Duration::from_micros(700));
        m.step_commit(Duration::from_millis(3));
        m.model_call("demo", "scripted", Duration::from_millis(20));
        m.tool_call("sleep", Duration::from_millis(1));
        m.run_duration("completed", Duration::from_secs(2));
        m.http_request(Some("/api/runs/{id}"), 404, Duration::from_millis(2));
        m.http_request(None, 200, Duration::from_millis(2));
        let text = m.render(Observed::default());
        assert!(
            text.contains("# TYPE switchboard_step_commit_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_step_commit_seconds_count 2\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_step_commit_seconds_bucket{le=\"0.001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_step_commit_seconds_bucket{le=\"0.005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_step_commit_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "switchboard_model_call_seconds_count{agent=\"demo\",model=\"scripted\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("switchboard_tool_call_seconds_count{tool=\"sleep\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("switchboard_run_duration_seconds_sum{status=\"completed\"} 2.0\n"),
            "{text}"
        );
        assert!(text.contains("switchboard_http_request_duration_seconds_count{route=\"/api/runs/{id}\",status_class=\"4xx\"} 1\n"), "{text}");
        assert!(text.contains("switchboard_http_request_duration_seconds_count{route=\"unmatched\",status_class=\"2xx\"} 1\n"), "{text}");
    }

    #[test]
    fn status_classes_and_snake_case_labels() {
        assert_eq!(
            [
                status_class(200),
                status_class(302),
                status_class(404),
                status_class(503)
            ],
            ["2xx", "3xx", "4xx", "5xx"]
        );
        assert_eq!(status_class(99), "1xx");
        assert_eq!(snake("Step Record"), "step_record");
        assert_eq!(snake("storage-lost"), "storage_lost");
    }
}
