//! The live view's timeline (SPEC §8.1): one row per step with its model call and tool calls as bars on
//! the run's time axis, a gap marker where a crash and resume happened, errors and effects-unknown
//! results marked; and the "now: step k, waiting on …" line of a live run.
//!
//! [`Timeline::build`] is a pure function of the run's stamped events (each carries `at`, epoch ms), the
//! run's start and its end (the finish, or `now` while live); [`render`] turns it into server-side markup.
//! The bars are inline SVG whose geometry travels in presentation attributes (`x="12.5%"`), never in
//! `style` attributes, which the page's Content-Security-Policy does not allow.
//!
//! How events map to bars:
//! - a model call runs from the moment the model got its input (`run_meta`, `input`, `context`,
//!   `tool_result`, `resumed`, or the previous `assistant`) to the `assistant` event of its step; a
//!   `run_failed` while no tool runs ends the pending model call as failed;
//! - a tool call runs from its `tool_call` to the `tool_result` with the same `callId`;
//! - a `resumed` event opens a gap from the event before it (the last thing the crashed process
//!   committed) to itself; tool calls in flight at the crash are cut there, and the settlement the resume
//!   publishes for them (`effectsUnknown`, or a re-run) shows as its own mark;
//! - while live, a call still open runs to `now` and is what "now" describes.

use std::collections::{BTreeMap, HashMap, HashSet};

use maud::{html, Markup};
use serde_json::Value;

use super::fmt_duration;

/// At most this many step rows render (the newest); a note counts the rest.
pub const MAX_ROWS: usize = 300;

/// A model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelBar {
    pub from: i64,
    pub to: i64,
    /// Still running (live) at `to` = now.
    pub open: bool,
    /// The run failed during this call.
    pub failed: bool,
    /// `model_retry` events during this call.
    pub retries: u32,
}

/// A tool call, or a settlement published without one (after a resume).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolBar {
    pub tool: String,
    pub from: i64,
    pub to: i64,
    pub open: bool,
    pub ok: bool,
    pub effects_unknown: bool,
    /// Cut by a crash (or a hard stop) before its result.
    pub cut: bool,
    /// A result without a call on this timeline: the resume's settlement of a call cut by the crash.
    pub settlement: bool,
}

/// One step's row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepRow {
    pub step: u64,
    pub model: Option<ModelBar>,
    pub tools: Vec<ToolBar>,
    /// The model call that gave the answer (a turn with no tool call, followed by the `answer`): its own
    /// row, labelled "answer", not a step — steps are numbered by the tool steps.
    pub answer: bool,
}

/// A crash and resume: nothing happened from `from` (the last event before) to `to` (`resumed`).
#[derive(Debug, Clone, PartialEq)]
pub struct Gap {
    pub from: i64,
    pub to: i64,
    pub from_generation: String,
}

impl Gap {
    pub fn length_ms(&self) -> i64 {
        (self.to - self.from).max(0)
    }
}

/// A row of the timeline, in the order things happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    Step(StepRow),
    Gap(Gap),
}

/// What a live run is doing now.
#[derive(Debug, Clone, PartialEq)]
pub enum Now {
    Tool { step: u64, tool: String, since: i64 },
    Model { step: u64, since: i64 },
}

/// A run's timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// The axis: the run's start …
    pub start: i64,
    /// … and its finish (or now).
    pub end: i64,
    pub rows: Vec<Row>,
    /// Step rows left out (older than the [`MAX_ROWS`] shown).
    pub hidden_steps: usize,
    pub now: Option<Now>,
    /// Per event seq, the duration it closes: a tool result's call, an assistant turn's model call.
    pub durations: HashMap<u64, i64>,
}

fn at(e: &Value) -> Option<i64> {
    e.get("at").and_then(Value::as_i64)
}

fn step_of(e: &Value) -> Option<u64> {
    e.get("step").and_then(Value::as_u64)
}

fn text<'a>(e: &'a Value, k: &str) -> &'a str {
    e.get(k).and_then(Value::as_str).unwrap_or("")
}

/// The rows under construction: step rows by step, and the order rows first appeared in.
#[derive(Default)]
struct Rows {
    order: Vec<Result<u64, Gap>>,
    steps: BTreeMap<u64, StepRow>,
}

impl Rows {
    fn step(&mut self, step: u64) -> &mut StepRow {
        if !self.steps.contains_key(&step) {
            self.order.push(Ok(step));
        }
        self.steps.entry(step).or_insert_with(|| StepRow {
            step,
            ..StepRow::default()
        })
    }
}

/// An open tool call.
struct Open {
    step: u64,
    tool: String,
    from: i64,
}

impl Timeline {
    /// The timeline of `events` (in seq order) for a run started at `start`; `end` is its finish, or
    /// `now` while it is `live`.
    pub fn build(events: &[Value], start: i64, end: i64, live: bool) -> Timeline {
        let mut rows = Rows::default();
        let mut durations = HashMap::new();
        let mut open: Vec<(String, Open)> = Vec::new();
        let mut cut_calls: HashSet<String> = HashSet::new();
        let mut ready = start;
        let mut last_at = start;
        let mut last_model_step = 0u64;
        let mut retries = 0u32;
        let mut failed_at: Option<i64> = None;
        // The model has its input and has not answered yet.
        let mut model_pending = false;
        for e in events {
            let Some(t) = at(e) else { continue };
            let seq = storage::record::event_seq(e);
            let kind = text(e, "type");
            match kind {
                "run_meta" | "input" | "context" => ready = t,
                "assistant" => {
                    let step = step_of(e).unwrap_or(last_model_step + 1);
                    rows.step(step).model = Some(ModelBar {
                        from: ready,
                        to: t,
                        open: false,
                        failed: false,
                        retries,
                    });
                    if let Some(s) = seq {
                        durations.insert(s, t - ready);
                    }
                    (ready, last_model_step, retries) = (t, step.max(last_model_step), 0);
                }
                // A text-only final turn publishes no `assistant` event: its answer closes the model call.
                "answer" if model_pending => {
                    let step = last_model_step + 1;
                    let row = rows.step(step);
                    row.model = Some(ModelBar {
                        from: ready,
                        to: t,
                        open: false,
                        failed: false,
                        retries,
                    });
                    row.answer = true;
                    if let Some(s) = seq {
                        durations.insert(s, t - ready);
                    }
                    (ready, last_model_step, retries) = (t, step, 0);
                }
                // The answer follows the turn that gave it: a turn without tool calls is the answer's row.
                "answer" => {
                    if let Some(row) = rows.steps.get_mut(&last_model_step) {
                        if row.tools.is_empty() && row.model.is_some() {
                            row.answer = true;
                        }
                    }
                }
                "model_retry" => retries += 1,
                "tool_call" => {
                    let step = step_of(e).unwrap_or(last_model_step);
                    rows.step(step);
                    open.push((
                        text(e, "callId").to_owned(),
                        Open {
                            step,
                            tool: text(e, "tool").to_owned(),
                            from: t,
                        },
                    ));
                }
                "tool_result" => {
                    let call_id = text(e, "callId");
                    let ok = e.get("ok").and_then(Value::as_bool).unwrap_or(false);
                    let effects_unknown = e
                        .get("effectsUnknown")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    match open.iter().position(|(id, _)| id == call_id) {
                        Some(i) => {
                            let (_, call) = open.remove(i);
                            if let Some(s) = seq {
                                durations.insert(s, t - call.from);
                            }
                            rows.step(call.step).tools.push(ToolBar {
                                tool: call.tool,
                                from: call.from,
                                to: t,
                                open: false,
                                ok,
                                effects_unknown,
                                cut: false,
                                settlement: false,
                            });
                        }
                        None => {
                            let step = step_of(e).unwrap_or(last_model_step);
                            rows.step(step).tools.push(ToolBar {
                                tool: text(e, "tool").to_owned(),
                                from: t,
                                to: t,
                                open: false,
                                ok,
                                effects_unknown,
                                cut: false,
                                settlement: cut_calls.contains(call_id) || effects_unknown,
                            });
                        }
                    }
                    ready = t;
                }
                "resumed" => {
                    // The crashed process's calls end where its last event did.
                    for (id, call) in open.drain(..) {
                        rows.step(call.step).tools.push(ToolBar {
                            tool: call.tool,
                            from: call.from,
                            to: last_at,
                            open: false,
                            ok: false,
                            effects_unknown: false,
                            cut: true,
                            settlement: false,
                        });
                        cut_calls.insert(id);
                    }
                    rows.order.push(Err(Gap {
                        from: last_at,
                        to: t,
                        from_generation: text(e, "fromGeneration").to_owned(),
                    }));
                    (ready, retries) = (t, 0);
                }
                "run_failed" if open.is_empty() => {
                    let model = ModelBar {
                        from: ready,
                        to: t,
                        open: false,
                        failed: true,
                        retries,
                    };
                    rows.step(last_model_step + 1).model = Some(model);
                    failed_at = Some(t);
                }
                _ => {}
            }
            match kind {
                "run_meta" | "input" | "context" | "tool_result" | "resumed" => {
                    model_pending = true
                }
                "assistant" | "answer" | "run_failed" => model_pending = false,
                _ => {}
            }
            last_at = last_at.max(t);
        }
        let end = end.max(last_at).max(start + 1);
        let mut now = None;
        for (_, call) in open.drain(..) {
            if live {
                now = Some(Now::Tool {
                    step: call.step,
                    tool: call.tool.clone(),
                    since: call.from,
                });
            }
            let bar = ToolBar {
                tool: call.tool,
                from: call.from,
                to: end,
                open: live,
                ok: false,
                effects_unknown: false,
                cut: !live,
                settlement: false,
            };
            rows.step(call.step).tools.push(bar);
        }
        if live && now.is_none() && failed_at.is_none() {
            let step = last_model_step + 1;
            rows.step(step).model = Some(ModelBar {
                from: ready,
                to: end,
                open: true,
                failed: false,
                retries,
            });
            now = Some(Now::Model { step, since: ready });
        }
        let mut out: Vec<Row> = Vec::with_capacity(rows.order.len());
        for item in rows.order {
            match item {
                Ok(step) => {
                    if let Some(row) = rows.steps.remove(&step) {
                        out.push(Row::Step(row));
                    }
                }
                Err(gap) => out.push(Row::Gap(gap)),
            }
        }
        // A row closed as the answer and then given a tool call (a later turn reused its step) is a step.
        for row in &mut out {
            if let Row::Step(s) = row {
                s.answer &= s.tools.is_empty();
            }
        }
        let steps = out.iter().filter(|r| matches!(r, Row::Step(_))).count();
        let hidden_steps = steps.saturating_sub(MAX_ROWS);
        if hidden_steps > 0 {
            let mut skip = hidden_steps;
            out.retain(|r| match r {
                Row::Step(_) if skip > 0 => {
                    skip -= 1;
                    false
                }
                _ => true,
            });
        }
        Timeline {
            start,
            end,
            rows: out,
            hidden_steps,
            now,
            durations,
        }
    }

    /// `x` and `width` (percent of the axis) of the interval `from..to`; at least a sliver wide.
    fn place(&self, from: i64, to: i64) -> (f64, f64) {
        let span = (self.end - self.start).max(1) as f64;
        let x = ((from - self.start) as f64 / span * 100.0).clamp(0.0, 100.0);
        let w = ((to - from).max(0) as f64 / span * 100.0).clamp(0.0, 100.0 - x);
        (x, w.max(0.35).min(100.0 - x).max(0.0))
    }

    pub fn gaps(&self) -> impl Iterator<Item = &Gap> {
        self.rows.iter().filter_map(|r| match r {
            Row::Gap(g) => Some(g),
            Row::Step(_) => None,
        })
    }

    /// The steps whose model call gave the answer (their rows read "answer").
    pub fn answer_steps(&self) -> impl Iterator<Item = u64> + '_ {
        self.rows.iter().filter_map(|r| match r {
            Row::Step(s) if s.answer => Some(s.step),
            _ => None,
        })
    }
}

fn pct(v: f64) -> String {
    format!("{v:.3}%")
}

/// "now: step k, waiting on <tool> for N s" (the script ticks N from `data-since`).
pub fn render_now(now: Option<&Now>, now_ms: i64) -> Markup {
    match now {
        None => html! {},
        Some(Now::Tool { step, tool, since }) => html! {
            p id="now" class="now" data-since=(since) {
                span class="pulse" {} "now: step " (step) ", waiting on " code { (tool) } " for "
                span id="now-for" { (fmt_duration(now_ms - since)) }
            }
        },
        Some(Now::Model { step, since }) => html! {
            p id="now" class="now" data-since=(since) {
                span class="pulse" {} "now: step " (step) ", waiting on the model for "
                span id="now-for" { (fmt_duration(now_ms - since)) }
            }
        },
    }
}

/// The timeline as markup: an axis, then one row per step (and per gap).
pub fn render(t: &Timeline) -> Markup {
    let span = t.end - t.start;
    let steps = t
        .rows
        .iter()
        .filter(|r| matches!(r, Row::Step(s) if !s.answer))
        .count();
    html! {
        section id="timeline" class="card timeline" data-steps=(steps) {
            div class="tl-head" {
                h2 { "Timeline" }
                div class="legend" {
                    span { span class="sw sw-model" {} "model call" }
                    span { span class="sw sw-tool" {} "tool call" }
                    span { span class="sw sw-bad" {} "failed" }
                    span { span class="sw sw-unknown" {} "effects unknown" }
                    span { span class="sw sw-gap" {} "crash gap" }
                }
            }
            @if t.rows.is_empty() {
                p class="muted" { "No steps yet." }
            } @else {
                div class="tl-row tl-axis" {
                    div class="tl-label" {}
                    svg class="tl-track" width="100%" height="16" role="img" aria-label="time axis" {
                        @for i in 0..=4u32 {
                            @let x = f64::from(i) * 25.0;
                            @let anchor = match i { 0 => "start", 4 => "end", _ => "middle" };
                            text x=(pct(x)) y="12" text-anchor=(anchor) {
                                @if i == 0 { "0" } @else { "+" (fmt_duration(span * i64::from(i) / 4)) }
                            }
                        }
                    }
                    div class="tl-dur" {}
                }
                @if t.hidden_steps > 0 {
                    p class="muted tl-hidden" { (t.hidden_steps) " earlier steps not shown" }
                }
                @for row in &t.rows {
                    @match row {
                        Row::Step(s) => (step_row(t, s)),
                        Row::Gap(g) => (gap_row(t, g)),
                    }
                }
            }
        }
    }
}

/// The gap bands every row carries, so a crash reads as one vertical band down the timeline.
fn gap_bands(t: &Timeline) -> Markup {
    html! {
        @for g in t.gaps() {
            @let (x, w) = t.place(g.from, g.to);
            rect class="band-gap" x=(pct(x)) width=(pct(w)) y="0" height="100%" {}
        }
    }
}

fn step_row(t: &Timeline, s: &StepRow) -> Markup {
    let failed = s.model.as_ref().is_some_and(|m| m.failed)
        || s.tools
            .iter()
            .any(|b| !b.ok && !b.open && !b.cut && !b.effects_unknown);
    let unknown = s.tools.iter().any(|b| b.effects_unknown || b.cut);
    let mut words: Vec<String> = Vec::new();
    if let Some(m) = &s.model {
        let what = if m.failed { "model failed" } else { "model" };
        words.push(format!("{what} {}", fmt_duration(m.to - m.from)));
    }
    for b in s.tools.iter().take(3) {
        let mut w = format!("{} {}", b.tool, fmt_duration(b.to - b.from));
        if b.effects_unknown {
            w.push_str(" (effects unknown)");
        } else if b.cut {
            w.push_str(" (cut)");
        } else if !b.ok && !b.open {
            w.push_str(" (failed)");
        }
        words.push(w);
    }
    if s.tools.len() > 3 {
        words.push(format!("+{} more", s.tools.len() - 3));
    }
    if s.answer {
        return answer_row(t, s);
    }
    let class = format!(
        "tl-row tl-step{}{}",
        if failed { " tl-failed" } else { "" },
        if unknown { " tl-unknown" } else { "" }
    );
    html! {
        div class=(class) data-step=(s.step) {
            div class="tl-label" { "step " (s.step) }
            svg class="tl-track" width="100%" height="22" {
                rect class="lane" x="0" y="0" width="100%" height="100%" {}
                (gap_bands(t))
                @if let Some(m) = &s.model {
                    @let (x, w) = t.place(m.from, m.to);
                    @let cls = if m.failed { "bar bar-model bar-bad" } else if m.open { "bar bar-model bar-open" } else { "bar bar-model" };
                    rect class=(cls) x=(pct(x)) width=(pct(w)) y="3" height="7" rx="2" {
                        title { "model call: " (fmt_duration(m.to - m.from)) @if m.retries > 0 { ", " (m.retries) " retries" } @if m.failed { ", failed" } }
                    }
                }
                @for b in &s.tools {
                    @let (x, w) = t.place(b.from, b.to);
                    @let cls = if b.effects_unknown { "bar bar-tool bar-unknown" } else if b.cut { "bar bar-tool bar-cut" } else if b.open { "bar bar-tool bar-open" } else if !b.ok { "bar bar-tool bar-bad" } else { "bar bar-tool" };
                    rect class=(cls) x=(pct(x)) width=(pct(w)) y="12" height="7" rx="2" {
                        title { (b.tool) ": " (fmt_duration(b.to - b.from))
                            @if b.effects_unknown { " — effects unknown" } @else if b.cut { " — cut by a crash" } @else if !b.ok && !b.open { " — failed" } }
                    }
                }
            }
            @let words = words.join(" · ");
            div class="tl-dur" title=(words) { (words) }
        }
    }
}

/// The answer's model call: its own row after the steps.
fn answer_row(t: &Timeline, s: &StepRow) -> Markup {
    let words = s
        .model
        .as_ref()
        .map(|m| format!("model {}", fmt_duration(m.to - m.from)))
        .unwrap_or_default();
    html! {
        div class="tl-row tl-answer" data-answer-step=(s.step) {
            div class="tl-label" { "answer" }
            svg class="tl-track" width="100%" height="22" {
                rect class="lane" x="0" y="0" width="100%" height="100%" {}
                (gap_bands(t))
                @if let Some(m) = &s.model {
                    @let (x, w) = t.place(m.from, m.to);
                    rect class="bar bar-model" x=(pct(x)) width=(pct(w)) y="3" height="7" rx="2" {
                        title { "the answer's model call: " (fmt_duration(m.to - m.from)) @if m.retries > 0 { ", " (m.retries) " retries" } }
                    }
                }
            }
            div class="tl-dur" title=(words) { (words) }
        }
    }
}

fn gap_row(t: &Timeline, g: &Gap) -> Markup {
    let (x, w) = t.place(g.from, g.to);
    html! {
        div class="tl-row tl-gap" data-gap-ms=(g.length_ms()) {
            div class="tl-label" { "crash" }
            svg class="tl-track" width="100%" height="22" {
                rect class="lane" x="0" y="0" width="100%" height="100%" {}
                rect class="band-gap gap-mark" x=(pct(x)) width=(pct(w)) y="0" height="100%" {}
            }
            div class="tl-dur" title=(format!("gap {} · resumed from {}", fmt_duration(g.length_ms()), g.from_generation)) {
                strong { "gap " (fmt_duration(g.length_ms())) }
                @if !g.from_generation.is_empty() { " · resumed from " code { (g.from_generation) } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(seq: u64, at: i64, v: Value) -> Value {
        let mut v = v;
        v["seq"] = json!(seq);
        v["at"] = json!(at);
        v
    }

    /// Two steps with a sleep each, then the answer's text-only turn.
    fn finished_run() -> Vec<Value> {
        vec![
            ev(1, 0, json!({"type": "run_meta"})),
            ev(
                2,
                5,
                json!({"type": "input", "text": "hi", "source": "request"}),
            ),
            ev(
                3,
                105,
                json!({"type": "assistant", "step": 1, "text": "step 1"}),
            ),
            ev(
                4,
                106,
                json!({"type": "tool_call", "step": 1, "callId": "c1", "tool": "sleep"}),
            ),
            ev(
                5,
                306,
                json!({"type": "tool_result", "step": 1, "callId": "c1", "tool": "sleep", "ok": true}),
            ),
            ev(
                6,
                400,
                json!({"type": "assistant", "step": 2, "text": "step 2"}),
            ),
            ev(
                7,
                401,
                json!({"type": "tool_call", "step": 2, "callId": "c2", "tool": "sleep"}),
            ),
            ev(
                8,
                601,
                json!({"type": "tool_result", "step": 2, "callId": "c2", "tool": "sleep", "ok": false}),
            ),
            ev(
                9,
                700,
                json!({"type": "assistant", "step": 3, "text": "done"}),
            ),
            ev(10, 702, json!({"type": "answer", "text": "done"})),
        ]
    }

    #[test]
    fn a_finished_run_has_one_row_per_step_with_its_model_and_tool_bars() {
        let t = Timeline::build(&finished_run(), 0, 710, false);
        let steps: Vec<&StepRow> = t
            .rows
            .iter()
            .filter_map(|r| if let Row::Step(s) = r { Some(s) } else { None })
            .collect();
        assert_eq!(steps.iter().map(|s| s.step).collect::<Vec<_>>(), [1, 2, 3]);
        // The model call of step 1 ran from the input to its assistant event; its tool from call to result.
        assert_eq!(
            steps[0].model.as_ref().map(|m| (m.from, m.to)),
            Some((5, 105))
        );
        assert_eq!(
            steps[0]
                .tools
                .iter()
                .map(|b| (b.from, b.to, b.ok))
                .collect::<Vec<_>>(),
            [(106, 306, true)]
        );
        // Step 2's model call starts at step 1's result; its tool failed.
        assert_eq!(steps[1].model.as_ref().map(|m| m.from), Some(306));
        assert!(!steps[1].tools[0].ok);
        assert_eq!(steps[2].tools.len(), 0);
        // Without the final `assistant` event, the answer closes the last model call.
        let mut no_final_turn = finished_run();
        no_final_turn.remove(8);
        let t2 = Timeline::build(&no_final_turn, 0, 710, false);
        let Some(Row::Step(last)) = t2.rows.last() else {
            panic!("rows")
        };
        assert_eq!(
            (last.step, last.model.as_ref().map(|m| (m.from, m.to))),
            (3, Some((601, 702)))
        );
        assert_eq!((t.now.clone(), t.gaps().count(), t.end), (None, 0, 710));
        // Durations by the seq that closes them.
        assert_eq!(
            (
                t.durations.get(&5),
                t.durations.get(&3),
                t.durations.get(&9)
            ),
            (Some(&200), Some(&100), Some(&99))
        );
        // Steps are numbered by the tool steps; the answer's turn is a row of its own.
        assert_eq!(
            steps.iter().map(|s| s.answer).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert_eq!(t.answer_steps().collect::<Vec<_>>(), [3]);
        assert!(
            last.answer,
            "a text-only final turn is the answer's row too"
        );
        let html = render(&t).into_string();
        assert_eq!(html.matches("class=\"tl-row tl-step").count(), 2, "{html}");
        assert!(
            html.contains("data-steps=\"2\"")
                && html.contains("class=\"tl-row tl-answer\" data-answer-step=\"3\"><div class=\"tl-label\">answer</div>"),
            "{html}"
        );
        assert!(
            html.contains("data-step=\"2\"")
                && html.contains("tl-failed")
                && html.contains("sleep 200 ms (failed)"),
            "{html}"
        );
    }

    #[test]
    fn a_crash_and_resume_is_a_gap_with_its_length_and_the_cut_call_settles_as_effects_unknown() {
        let mut events = finished_run()[..4].to_vec();
        // The process dies during step 1's tool; the next one resumes 3.2 s after the last event.
        events.push(ev(
            5,
            3_306,
            json!({"type": "resumed", "fromGeneration": "G1", "settled": []}),
        ));
        events.push(ev(6, 3_307, json!({"type": "tool_result", "step": 1, "callId": "c1", "tool": "append_file", "ok": false, "effectsUnknown": true})));
        events.push(ev(
            7,
            3_400,
            json!({"type": "assistant", "step": 2, "text": "x"}),
        ));
        let t = Timeline::build(&events, 0, 3_500, false);
        let gaps: Vec<&Gap> = t.gaps().collect();
        assert_eq!(gaps.len(), 1);
        assert_eq!(
            (gaps[0].from, gaps[0].to, gaps[0].length_ms()),
            (106, 3_306, 3_200)
        );
        // Rows in the order things happened: step 1, the gap, step 2.
        let kinds: Vec<String> = t
            .rows
            .iter()
            .map(|r| match r {
                Row::Step(s) => format!("s{}", s.step),
                Row::Gap(_) => "gap".into(),
            })
            .collect();
        assert_eq!(kinds, ["s1", "gap", "s2"]);
        let Row::Step(s1) = &t.rows[0] else {
            panic!("step row first")
        };
        assert_eq!(s1.tools.len(), 2, "the cut call and its settlement");
        assert!(s1.tools[0].cut && s1.tools[0].to == 106);
        assert!(s1.tools[1].effects_unknown && s1.tools[1].settlement);
        // The model call after the resume starts at the resume, not before the crash.
        let Row::Step(s2) = &t.rows[2] else {
            panic!("step 2 last")
        };
        assert_eq!(s2.model.as_ref().map(|m| m.from), Some(3_307));
        let html = render(&t).into_string();
        assert!(
            html.contains("class=\"tl-row tl-gap\" data-gap-ms=\"3200\""),
            "{html}"
        );
        assert!(
            html.contains("gap 3.2 s") && html.contains("effects unknown"),
            "{html}"
        );
        // A cut call is trouble of its own kind, not a failure.
        assert!(
            html.contains("class=\"tl-row tl-step tl-unknown\" data-step=\"1\""),
            "{html}"
        );
    }

    #[test]
    fn a_live_run_says_what_it_waits_on_and_a_failed_model_call_is_marked() {
        let events = finished_run()[..4].to_vec();
        let t = Timeline::build(&events, 0, 1_106, true);
        assert_eq!(
            t.now,
            Some(Now::Tool {
                step: 1,
                tool: "sleep".into(),
                since: 106
            })
        );
        let now = render_now(t.now.as_ref(), 1_106).into_string();
        assert!(
            now.contains(
                "now: step 1, waiting on <code>sleep</code> for <span id=\"now-for\">1.0 s</span>"
            ),
            "{now}"
        );
        // Between steps the model is what it waits on.
        let t = Timeline::build(&finished_run()[..5], 0, 1_000, true);
        assert_eq!(
            t.now,
            Some(Now::Model {
                step: 2,
                since: 306
            })
        );
        // A failure during a model call ends that call, failed; nothing is "now".
        let mut failed = finished_run()[..5].to_vec();
        failed.push(ev(6, 500, json!({"type": "run_failed", "message": "boom"})));
        let t = Timeline::build(&failed, 0, 510, false);
        let Some(Row::Step(s2)) = t.rows.last() else {
            panic!("a row for the failed call")
        };
        assert_eq!(
            (s2.step, s2.model.as_ref().map(|m| (m.from, m.to, m.failed))),
            (2, Some((306, 500, true)))
        );
        assert_eq!(t.now, None);
    }

    #[test]
    fn rows_are_capped_to_the_newest_and_bars_stay_inside_the_axis() {
        let mut events = vec![ev(1, 0, json!({"type": "run_meta"}))];
        for i in 1..=(MAX_ROWS as u64 + 5) {
            events.push(ev(
                i + 1,
                i as i64 * 10,
                json!({"type": "assistant", "step": i}),
            ));
        }
        let t = Timeline::build(&events, 0, 10, false);
        assert_eq!((t.hidden_steps, t.rows.len()), (5, MAX_ROWS));
        assert!(matches!(&t.rows[0], Row::Step(s) if s.step == 6));
        // The axis grew to the last event; every placement is within 0..=100 %.
        assert_eq!(t.end, (MAX_ROWS as i64 + 5) * 10);
        for (from, to) in [(0, 0), (-50, 10), (t.end, t.end + 100), (0, t.end)] {
            let (x, w) = t.place(from, to);
            assert!(
                (0.0..=100.0).contains(&x) && x + w <= 100.0 + 1e-9,
                "{from}..{to}: {x} {w}"
            );
        }
    }
}
