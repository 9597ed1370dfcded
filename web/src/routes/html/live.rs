//! The live view of one run, `GET /runs/{id}` (SPEC §8.1): a header with status, agent, model, thread and
//! timing; the answer, or the error in an error box; "now: step k, waiting on …" while live; the
//! [`timeline`](super::timeline); the Stop soft / Stop hard / Kill buttons; while the run is parked, a
//! panel per call awaiting approval (SPEC §13) with its input, a note and Approve / Deny buttons, which
//! post to `/api/runs/{id}/approvals/{callId}` with the page's capability token, as Stop does; and the
//! event list with relative times and durations, newest last, paged.
//!
//! Paging: the list shows at most [`EVENTS_PAGE`] events — by default the newest (the tail, which the
//! script extends live and follows while scrolled to the bottom); `?before=<seq>` the page before a seq,
//! `?afterSeq=<seq>` the page after one — with "Earlier events" / "Later events" links. Counts are event
//! counts, never seqs (a resumed run's seqs may jump).
//!
//! `GET /runs/{id}/timeline` answers the `#now-slot` and `#timeline` elements alone, which the script
//! re-fetches as events arrive and swaps in by id, so one renderer draws the timeline.
//!
//! Each event of the list carries a `<details>` with what the event itself carries ([`event_fields`]:
//! a tool call's input and a result's output as stored — summarized and redacted —, a model turn's usage,
//! and so on); nothing is read from elsewhere. Steps are numbered by the tool steps: the model turn that
//! gave the answer reads "final answer", as its timeline row reads "answer".
//!
//! "Download JSON" is `GET /runs/{id}/export.json` ([`export`]): the run's view with its events, read
//! through the same service with the same visibility (a capability token in `?token=` reads its run, as
//! the page does). "Run again" posts to `/api/runs/{id}/retry` and says what it answered.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::runs_service::RunView;
use maud::{html, Markup};
use serde_json::Value;
use storage::record::event_seq;
use storage::RunId;

use super::super::api::{capability, query_map, reader, runs_error, seq_cursor};
use super::super::approvals::MAX_NOTE_CHARS;
use super::timeline::{self, Timeline};
use super::{
    ago, describe, error_page, fmt_duration, fmt_time, href, marks, page, respond, scripts,
    status_chip, thread_href,
};
use crate::error::ApiError;
use crate::AppState;

/// The most events one page of the list shows.
pub const EVENTS_PAGE: usize = 200;

/// `GET /runs/{id}`.
pub(super) async fn run_page(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let id = RunId::from(path.into_inner());
    match render_run(&req, &id, &state).await {
        Ok(body) => respond(StatusCode::OK, body),
        Err(e) => error_page(e),
    }
}

/// `GET /runs/{id}/timeline`: the "now" slot and the timeline, as a fragment.
pub(super) async fn timeline_fragment(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let id = RunId::from(path.into_inner());
    let fragment = async {
        let q = query_map(&req)?;
        let visible_to = reader(&req, &state, Some(&id), &q)?;
        let view = state
            .runs
            .get_run(&id, true, &visible_to)
            .await
            .map_err(|e| runs_error(e, &id))?;
        Ok::<_, ApiError>(live_state(&view, state.runs.clock.now_ms()))
    };
    match fragment.await {
        Ok(body) => respond(StatusCode::OK, body),
        Err(e) => error_page(e),
    }
}

/// `GET /runs/{id}/export.json`: the run's view with its events as a JSON download (`run-<id>.json`).
pub(super) async fn export(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = RunId::from(path.into_inner());
    let q = query_map(&req)?;
    let visible_to = reader(&req, &state, Some(&id), &q)?;
    let view = state
        .runs
        .get_run(&id, true, &visible_to)
        .await
        .map_err(|e| runs_error(e, &id))?;
    // The id is a run id (letters, digits, `_`, `-`): safe in the header as is.
    Ok(HttpResponse::Ok()
        .insert_header(("cache-control", "no-store"))
        .insert_header((
            "content-disposition",
            format!("attachment; filename=\"run-{}.json\"", view.id),
        ))
        .json(view))
}

/// Which slice of the events the list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The newest [`EVENTS_PAGE`].
    Tail,
    /// The page before this seq.
    Before(u64),
    /// The page after this seq.
    After(u64),
}

impl Window {
    fn from_query(q: &std::collections::HashMap<String, String>) -> Result<Window, ApiError> {
        match (
            q.get("before").filter(|v| !v.is_empty()),
            q.get("afterSeq").filter(|v| !v.is_empty()),
        ) {
            (Some(_), Some(_)) => Err(ApiError::bad("before", "cannot be combined with afterSeq")),
            (Some(b), None) => Ok(Window::Before(seq_cursor("before", b)?)),
            (None, Some(a)) => Ok(Window::After(seq_cursor("afterSeq", a)?)),
            (None, None) => Ok(Window::Tail),
        }
    }

    /// The index range of `events` (in seq order) this window shows.
    pub fn range(self, events: &[Value]) -> std::ops::Range<usize> {
        let seq = |e: &Value| event_seq(e).unwrap_or(0);
        match self {
            Window::Tail => events.len().saturating_sub(EVENTS_PAGE)..events.len(),
            Window::Before(b) => {
                let end = events.partition_point(|e| seq(e) < b);
                end.saturating_sub(EVENTS_PAGE)..end
            }
            Window::After(a) => {
                let start = events.partition_point(|e| seq(e) <= a);
                start..(start + EVENTS_PAGE).min(events.len())
            }
        }
    }
}

async fn render_run(req: &HttpRequest, id: &RunId, state: &AppState) -> Result<Markup, ApiError> {
    let q = query_map(req)?;
    let visible_to = reader(req, state, Some(id), &q)?;
    let token = capability(state, id, &q).unwrap_or("").to_owned();
    let window = Window::from_query(&q)?;
    let view = state
        .runs
        .get_run(id, true, &visible_to)
        .await
        .map_err(|e| runs_error(e, id))?;
    Ok(run_html(&view, &token, state.runs.clock.now_ms(), window))
}

/// The timeline of a view at `now`.
fn timeline_of(v: &RunView, now: i64) -> Timeline {
    let events = v.events.as_deref().unwrap_or_default();
    Timeline::build(
        events,
        v.started_at,
        v.finished_at.unwrap_or(now),
        !v.finished,
    )
}

/// The "now" line's slot (empty once the run finished).
fn now_slot(t: &Timeline, now: i64) -> Markup {
    html! { div id="now-slot" { (timeline::render_now(t.now.as_ref(), now)) } }
}

/// The fragment the script re-fetches: the "now" slot and the timeline, which it swaps in by id.
fn live_state(v: &RunView, now: i64) -> Markup {
    let t = timeline_of(v, now);
    html! { (now_slot(&t, now)) (timeline::render(&t)) }
}

/// The event's `type` as a CSS class fragment (letters, digits and `_` only).
fn kind_class(e: &Value) -> String {
    e.get("type")
        .and_then(Value::as_str)
        .unwrap_or("other")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// What an event carries, as (label, text) rows for its details: every field but `type` and `seq`, in
/// name order, with a tool call's `summary` named "input", a tool result's "output", `at` as a UTC time
/// and `usage` as token counts; strings as stored, other values as compact JSON. The page's script
/// renders the same rows for the events it appends.
pub fn event_fields(e: &Value) -> Vec<(String, String)> {
    let Some(obj) = e.as_object() else {
        return Vec::new();
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let mut keys: Vec<&String> = obj
        .keys()
        .filter(|k| !matches!(k.as_str(), "type" | "seq"))
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let v = &obj[k];
            let label = match (kind, k.as_str()) {
                ("tool_call", "summary") => "input",
                ("tool_result", "summary") => "output",
                ("input" | "context", "text") => "text",
                (_, "at") => "time",
                (_, k) => k,
            };
            let text = match (k.as_str(), v) {
                ("at", Value::Number(n)) if n.is_i64() => fmt_time(n.as_i64().unwrap_or(0)),
                ("usage", Value::Object(u)) => {
                    let n = |k: &str| u.get(k).map(Value::to_string).unwrap_or_else(|| "?".into());
                    format!("{} in / {} out", n("inputTokens"), n("outputTokens"))
                }
                (_, Value::String(s)) => s.clone(),
                (_, other) => other.to_string(),
            };
            (label.to_owned(), text)
        })
        .collect()
}

/// One event: seq, time from the run's start, what it says, the duration it closes, and its details.
/// `final_answer`: this is the model turn that gave the answer (its heading says so, not its step).
pub fn event_item(e: &Value, started_at: i64, duration: Option<i64>, final_answer: bool) -> Markup {
    let (head, body) = describe(e);
    let head = if final_answer {
        "final answer · assistant".to_owned()
    } else {
        head
    };
    let step = e.get("step").and_then(Value::as_u64);
    let fields = event_fields(e);
    let seq = event_seq(e).map(|s| s.to_string()).unwrap_or_default();
    let unknown = e
        .get("effectsUnknown")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let class = format!(
        "ev ev-{}{}",
        kind_class(e),
        if unknown { " ev-unknown" } else { "" }
    );
    let rel = e
        .get("at")
        .and_then(Value::as_i64)
        .map(|at| format!("+{}", fmt_duration(at - started_at)));
    html! {
        li class=(class) data-seq=(seq) data-step=[step] {
            span class="seq" { "#" (seq) }
            span class="rel" { (rel.unwrap_or_default()) }
            span class="head" {
                span class="kind" { (head) }
                @if let Some(d) = duration { span class="dur" { (fmt_duration(d)) } }
            }
            span class="body" { (body) }
            @if !fields.is_empty() {
                details class="ev-details" {
                    summary { "details" }
                    dl {
                        @for (k, v) in &fields { dt { (k) } dd { (v) } }
                    }
                }
            }
        }
    }
}

/// The `approval_requested` events of the calls a run awaits a decision on (SPEC §13), in request
/// order: those no `approval_decided` names, nor a `tool_result` (the result a call gets when a stop
/// ended its wait). A resumed run parks again on its call without a second request, so the first one
/// stands for it.
pub fn awaited_calls(events: &[Value]) -> Vec<&Value> {
    fn call_id(e: &Value) -> Option<&str> {
        e.get("callId").and_then(Value::as_str)
    }
    let settled: std::collections::HashSet<&str> = events
        .iter()
        .filter(|e| e["type"] == "approval_decided" || e["type"] == "tool_result")
        .filter_map(call_id)
        .collect();
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .filter(|e| e["type"] == "approval_requested")
        .filter(|e| call_id(e).is_some_and(|c| !settled.contains(c) && seen.insert(c)))
        .collect()
}

/// The panel of the calls awaiting approval: each with its tool, its input (summarized and redacted, as
/// the event carries it), a note and the Approve / Deny buttons the script drives. Rendered hidden when
/// nothing awaits (or the run finished), so the script can fill it as requests arrive.
fn approvals_panel(v: &RunView, events: &[Value]) -> Markup {
    let awaited = if v.finished {
        Vec::new()
    } else {
        awaited_calls(events)
    };
    html! {
        section id="approvals" class="card approvals" data-note-max=(MAX_NOTE_CHARS) hidden[awaited.is_empty()] {
            h2 { "Awaiting approval" }
            p class="muted" { "The run is parked until each of these calls is approved or denied." }
            div id="approval-list" {
                @for e in &awaited { (approval_item(e)) }
            }
        }
    }
}

/// One call awaiting approval; the page's script builds the same markup for a request that arrives live.
pub fn approval_item(e: &Value) -> Markup {
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default();
    let step = e.get("step").and_then(Value::as_u64);
    html! {
        div class="approval" data-call-id=(s("callId")) {
            div class="approval-head" {
                span { "✋ " b class="approval-tool" { (s("tool")) } }
                span class="muted" {
                    @if let Some(k) = step { "step " (k) " · " }
                    "call " (s("callId"))
                }
            }
            pre class="approval-input" { (s("summary")) }
            div class="approval-controls" {
                input type="text" class="approval-note" maxlength=(MAX_NOTE_CHARS) placeholder="Note (optional)" aria-label="Note";
                button type="button" class="btn-primary approval-approve" data-decision="approve" { "Approve" }
                button type="button" class="btn-danger approval-deny" data-decision="deny" { "Deny" }
                span class="approval-msg" role="status" {}
            }
        }
    }
}

/// Token usage summed per model over the `assistant` events that carry it (SPEC §8.3): model →
/// (input, output).
fn usage_of(events: &[Value]) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut sums = std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e["type"] == "assistant") {
        let Some(u) = e.get("usage").filter(|u| u.is_object()) else {
            continue;
        };
        let sum: &mut (u64, u64) = sums
            .entry(e["model"].as_str().unwrap_or("-").to_owned())
            .or_default();
        sum.0 += u["inputTokens"].as_u64().unwrap_or(0);
        sum.1 += u["outputTokens"].as_u64().unwrap_or(0);
    }
    sums
}

/// The `usage` a view carries (SPEC §7 `usage?`), as model → (input, output).
fn view_usage(v: &RunView) -> Option<std::collections::BTreeMap<String, (u64, u64)>> {
    let usage = v.usage.as_ref()?.as_object()?;
    let n = |u: &Value, k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let sums: std::collections::BTreeMap<_, _> = usage
        .iter()
        .map(|(m, u)| (m.clone(), (n(u, "inputTokens"), n(u, "outputTokens"))))
        .collect();
    (!sums.is_empty()).then_some(sums)
}

/// `m1: 30 in / 8 out · m2: …` — the same words the page's script renders.
fn usage_words(usage: &std::collections::BTreeMap<String, (u64, u64)>) -> String {
    usage
        .iter()
        .map(|(m, (i, o))| format!("{m}: {i} in / {o} out"))
        .collect::<Vec<_>>()
        .join(" · ")
}

pub(super) fn run_html(v: &RunView, token: &str, now: i64, window: Window) -> Markup {
    let events = v.events.as_deref().unwrap_or_default();
    let last_seq = events.iter().filter_map(event_seq).max().unwrap_or(0);
    let answer = events
        .iter()
        .rev()
        .find(|e| e["type"] == "answer")
        .and_then(|e| e["text"].as_str())
        .unwrap_or("");
    let error = v
        .error
        .clone()
        .or_else(|| actors::runs_service::failure_message(events));
    let title = v.label.clone().unwrap_or_else(|| v.id.to_string());
    let usage = view_usage(v).unwrap_or_else(|| usage_of(events));
    let usage_json = Value::Object(
        usage
            .iter()
            .map(|(m, (i, o))| (m.clone(), serde_json::json!([i, o])))
            .collect(),
    )
    .to_string();
    let timeline = timeline_of(v, now);
    let range = window.range(events);
    let (first, shown) = (range.start, &events[range.clone()]);
    let tail = range.end == events.len();
    let link = |pairs: Vec<(&'static str, String)>| {
        let mut pairs = pairs;
        if !token.is_empty() {
            pairs.push(("token", token.to_owned()));
        }
        href(&format!("/runs/{}", v.id), &pairs)
    };
    let earlier = (first > 0)
        .then(|| {
            shown
                .first()
                .and_then(event_seq)
                .map(|s| link(vec![("before", s.to_string())]))
        })
        .flatten();
    let later = (!tail)
        .then(|| {
            shown
                .last()
                .and_then(event_seq)
                .map(|s| link(vec![("afterSeq", s.to_string())]))
        })
        .flatten();
    let finished_disabled = v.finished;
    let answer_steps: std::collections::HashSet<u64> = timeline.answer_steps().collect();
    let is_final_answer = |e: &Value| {
        e["type"] == "assistant"
            && e.get("step")
                .and_then(Value::as_u64)
                .is_some_and(|s| answer_steps.contains(&s))
    };
    let export = {
        let mut pairs = Vec::new();
        if !token.is_empty() {
            pairs.push(("token", token.to_owned()));
        }
        href(&format!("/runs/{}/export.json", v.id), &pairs)
    };
    let body = html! {
        main id="run" data-id=(v.id) data-token=(token) data-last-seq=(last_seq) data-finished=(v.finished.to_string())
            data-started-at=(v.started_at) data-usage=(usage_json) data-tail=(tail.to_string()) data-count=(events.len()) data-first=(first + 1) {
            nav class="crumbs" { a href="/runs" { "← Runs" } }
            section class="card" {
                div class="head-row" {
                    h1 { (title) }
                    (status_chip(v, Some("status")))
                    (marks(v))
                    span id="conn" class="muted" {}
                }
                p class="meta-line" {
                    span { "agent " b { (v.agent.as_deref().unwrap_or("—")) } }
                    span { "model " b { (v.model.as_deref().unwrap_or("—")) } }
                    span { "thread " a id="thread-link" href=(thread_href(&v.thread_key)) title="This thread's runs" { b { (v.thread_key) } } }
                    span { "started " (ago(now, v.started_at)) }
                    span { "ran " b id="f-ran" { (fmt_duration(v.duration_ms(now))) } }
                }
                (now_slot(&timeline, now))
                div class="controls" {
                    button id="stop-soft" disabled[finished_disabled] { "Stop (soft)" }
                    button id="stop-hard" disabled[finished_disabled] { "Stop (hard)" }
                    button id="kill" class="btn-danger" { "Kill" }
                    button id="retry" disabled[!v.finished] title="Start a new run on this thread from this run's request" { "Run again" }
                    a id="download" class="btn" href=(export) download=(format!("run-{}.json", v.id)) { "Download JSON" }
                    span id="control-msg" {}
                }
            }
            (approvals_panel(v, events))
            div id="error-box" class="errbox" role="alert" hidden[error.is_none()] {
                strong { "Run failed" }
                span id="error-text" { (error.as_deref().unwrap_or("")) }
            }
            div id="answer" class="answer" { (answer) }
            (timeline::render(&timeline))
            section class="card" {
                h2 { "Details" }
                dl class="facts" {
                    (fact("Run", &v.id, "f-id"))
                    (fact("Agent", v.agent.as_deref().unwrap_or(""), "f-agent"))
                    (fact("Model", v.model.as_deref().unwrap_or(""), "f-model"))
                    (fact("Channel", &format!("{} ({})", v.channel_id, v.channel_visibility.as_str()), "f-channel"))
                    (fact("Thread", &v.thread_key, "f-thread"))
                    (fact("User", &v.user_id, "f-user"))
                    (fact("Started", &fmt_time(v.started_at), "f-started"))
                    (fact("Finished", &v.finished_at.map(fmt_time).unwrap_or_default(), "f-finished"))
                    (fact("Duration", &fmt_duration(v.duration_ms(now)), "f-duration"))
                    (fact("Events", &events.len().to_string(), "f-events"))
                    (fact("Tokens", &usage_words(&usage), "f-usage"))
                    @if let Some(g) = &v.owner_gen { (fact("Live in generation", g, "f-owner")) }
                    @if let Some(p) = &v.parent_run_id { (fact("Parent run", p, "f-parent")) }
                }
            }
            section class="card" id="event-list" {
                div class="ev-head" {
                    h2 { "Events" }
                    span class="muted" id="ev-range" {
                        @if shown.is_empty() { "none yet" } @else { (first + 1) "–" (range.end) " of " (events.len()) }
                    }
                }
                @if let Some(e) = &earlier { p { a id="earlier" href=(e) { "↑ Earlier events" } } }
                ol id="events" {
                    @for e in shown {
                        (event_item(e, v.started_at, event_seq(e).and_then(|s| timeline.durations.get(&s).copied()), is_final_answer(e)))
                    }
                }
                @if let Some(l) = &later {
                    p class="pager" {
                        a id="later" href=(l) { "Later events ↓" }
                        a href=(link(Vec::new())) { "Newest ↓" }
                    }
                }
            }
        }
    };
    page(&format!("Run {title}"), body, Some(scripts::RUN_JS))
}

fn fact(k: &str, val: &str, id: &str) -> Markup {
    html! { div { dt { (k) } dd id=(id) { (val) } } }
}

/// A run page the CSP test checks.
#[cfg(test)]
pub(super) fn sample_page() -> String {
    run_html(&tests::view(vec![]), "", 0, Window::Tail).into_string()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;
    use storage::record::{ChannelVisibility, RunStatus};

    pub fn view(events: Vec<Value>) -> RunView {
        RunView {
            id: "r1".into(),
            label: None,
            agent: Some("demo".into()),
            model: Some("scripted".into()),
            channel_id: "c1".into(),
            user_id: "u1".into(),
            thread_key: "c1:t".into(),
            channel_visibility: ChannelVisibility::Machine,
            started_at: 1_000,
            finished: true,
            finished_at: Some(9_000),
            status: Some(RunStatus::Completed),
            event_count: events.len() as u64,
            stored_event_count: None,
            truncated: None,
            stop: None,
            persisted: None,
            provisional: None,
            owner_gen: None,
            parent_run_id: None,
            answer: None,
            error: None,
            stopped_by: None,
            usage: None,
            resumed: None,
            effects_unknown: None,
            delivery_unknown: None,
            awaiting_approval: None,
            events: Some(events),
        }
    }

    fn notes(n: u64) -> Vec<Value> {
        (1..=n).map(|s| json!({"type": "note", "kind": "k", "summary": format!("n{s}"), "seq": s * 2, "at": 1_000 + s as i64})).collect()
    }

    fn parked(events: Vec<Value>) -> RunView {
        let mut v = view(events);
        v.finished = false;
        v.finished_at = None;
        v.status = None;
        v.awaiting_approval = Some(true);
        v
    }

    fn requested(seq: u64, call_id: &str, summary: &str) -> Value {
        json!({"type": "approval_requested", "seq": seq, "at": 1_000 + seq as i64, "step": 1,
            "callId": call_id, "tool": "append_file", "input": {"path": "a"}, "summary": summary})
    }

    #[test]
    fn a_parked_run_shows_a_panel_per_call_awaiting_approval_with_its_buttons() {
        let v = parked(vec![
            requested(3, "call-1", "{\"text\":\"<b>hi</b>\"}"),
            requested(4, "call-2", "{}"),
            json!({"type": "approval_decided", "seq": 5, "step": 1, "callId": "call-2",
                "tool": "append_file", "decision": "deny", "who": "capability"}),
        ]);
        let html = run_html(&v, "tok", 10_000, Window::Tail).into_string();
        assert!(
            html.contains("<section id=\"approvals\" class=\"card approvals\" data-note-max=\"2000\"><h2>Awaiting approval</h2>"),
            "shown: {html}"
        );
        assert_eq!(html.matches("<div class=\"approval\"").count(), 1, "{html}");
        assert!(
            html.contains("<div class=\"approval\" data-call-id=\"call-1\">"),
            "{html}"
        );
        assert!(
            !html.contains("data-call-id=\"call-2\""),
            "a decided call: {html}"
        );
        assert!(
            html.contains("<b class=\"approval-tool\">append_file</b>"),
            "{html}"
        );
        assert!(html.contains("step 1 · call call-1"), "{html}");
        assert!(
            html.contains("<pre class=\"approval-input\">{&quot;text&quot;:&quot;&lt;b&gt;hi&lt;/b&gt;&quot;}</pre>"),
            "escaped as text: {html}"
        );
        assert!(
            html.contains("<input type=\"text\" class=\"approval-note\" maxlength=\"2000\""),
            "{html}"
        );
        assert!(
            html.contains("data-decision=\"approve\">Approve</button>"),
            "{html}"
        );
        assert!(
            html.contains("data-decision=\"deny\">Deny</button>"),
            "{html}"
        );
        // The page carries the capability token the script posts the decision with, as Stop does.
        assert!(html.contains("data-token=\"tok\""), "{html}");
    }

    #[test]
    fn the_panel_is_hidden_when_nothing_awaits_a_decision() {
        // A stop ended the wait: the call's result says it never ran.
        let stopped = parked(vec![
            requested(3, "call-1", "{}"),
            json!({"type": "tool_result", "seq": 4, "step": 1, "callId": "call-1", "tool": "append_file",
                "ok": false, "notRun": true, "summary": "not run"}),
        ]);
        let mut finished = view(vec![requested(3, "call-1", "{}")]);
        finished.finished = true;
        for v in [stopped, finished, parked(vec![])] {
            let html = run_html(&v, "", 10_000, Window::Tail).into_string();
            assert!(
                html.contains("<section id=\"approvals\" class=\"card approvals\" data-note-max=\"2000\" hidden>"),
                "{html}"
            );
            assert!(!html.contains("<div class=\"approval\""), "{html}");
        }
        // A request seen twice (a resumed run's history) is one call.
        let twice = [requested(3, "call-1", "{}"), requested(9, "call-1", "{}")];
        assert_eq!(awaited_calls(&twice).len(), 1);
    }

    #[test]
    fn run_strings_are_escaped_in_every_rendering() {
        let e = json!({"type": "input", "seq": 2, "at": 2_200, "text": "<script>alert(1)</script> & \"q\"", "source": "request"});
        let li = event_item(&e, 1_000, None, false).into_string();
        assert!(
            li.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot;"),
            "{li}"
        );
        assert!(!li.contains("<script>"));
        assert!(li.contains("<span class=\"rel\">+1.2 s</span>"), "{li}");
        // A hostile event type cannot break out of the class attribute.
        let odd = event_item(
            &json!({"type": "x\" onmouseover=\"alert(1)", "seq": 1}),
            0,
            None,
            false,
        )
        .into_string();
        assert!(odd.contains("class=\"ev ev-xonmouseoveralert1\""), "{odd}");
    }

    #[test]
    fn the_list_shows_the_newest_page_with_a_link_to_earlier_events_and_counts_events_not_seqs() {
        let html = run_html(&view(notes(250)), "tok", 10_000, Window::Tail).into_string();
        assert_eq!(
            html.matches("<li class=\"ev ev-note\"").count(),
            EVENTS_PAGE
        );
        // Seqs are 2, 4, … 500: the count is 250 events, and the page is events 51–250.
        assert!(
            html.contains("<dd id=\"f-events\">250</dd>") && html.contains("51–250 of 250"),
            "counts"
        );
        assert!(
            html.contains("id=\"earlier\" href=\"/runs/r1?before=102&amp;token=tok\""),
            "earlier link"
        );
        assert!(html.contains("data-tail=\"true\"") && !html.contains("id=\"later\""));
        // The earlier page: events 1–50, with a link to what follows.
        let page = run_html(&view(notes(250)), "", 10_000, Window::Before(102)).into_string();
        assert_eq!(page.matches("<li class=\"ev ev-note\"").count(), 50);
        assert!(
            page.contains("1–50 of 250")
                && page.contains("id=\"later\" href=\"/runs/r1?afterSeq=100\"")
        );
        assert!(page.contains("data-tail=\"false\"") && !page.contains("id=\"earlier\""));
        let after = Window::After(100).range(&notes(250));
        assert_eq!(after, 50..250);
    }

    #[test]
    fn a_failed_run_shows_its_error_in_the_error_box_and_a_completed_one_hides_the_box() {
        let mut v = view(vec![
            json!({"type": "run_failed", "seq": 1, "at": 2_000, "message": "boom <x>"}),
        ]);
        v.status = Some(RunStatus::Failed);
        let html = run_html(&v, "", 10_000, Window::Tail).into_string();
        assert!(html.contains("<div id=\"error-box\" class=\"errbox\" role=\"alert\"><strong>Run failed</strong><span id=\"error-text\">boom &lt;x&gt;</span>"), "{html}");
        let ok = run_html(&view(vec![]), "", 10_000, Window::Tail).into_string();
        assert!(
            ok.contains("class=\"errbox\" role=\"alert\" hidden>"),
            "{ok}"
        );
        assert!(ok.contains("id=\"status\" class=\"status st-ok\">completed<"));
    }

    #[test]
    fn each_event_has_its_details_and_the_answers_turn_reads_final_answer() {
        let events = vec![
            json!({"type": "input", "seq": 1, "at": 1_000, "text": "steps=1", "source": "request"}),
            json!({"type": "assistant", "seq": 2, "at": 1_100, "step": 1, "text": "", "model": "m1",
                "usage": {"inputTokens": 30, "outputTokens": 8}}),
            json!({"type": "tool_call", "seq": 3, "at": 1_101, "step": 1, "callId": "c1", "tool": "echo",
                "summary": "{\"text\":\"<b>hi</b>\"}"}),
            json!({"type": "tool_result", "seq": 4, "at": 1_200, "step": 1, "callId": "c1", "tool": "echo",
                "ok": true, "summary": "[redacted] ok"}),
            json!({"type": "assistant", "seq": 5, "at": 1_300, "step": 2, "text": "done"}),
            json!({"type": "answer", "seq": 6, "at": 1_301, "text": "done"}),
        ];
        assert_eq!(
            event_fields(&events[2]),
            [
                ("time", "1970-01-01 00:00:01Z"),
                ("callId", "c1"),
                ("step", "1"),
                ("input", "{\"text\":\"<b>hi</b>\"}"),
                ("tool", "echo"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        // In name order, labelled: a call's summary is its input, a result's its output.
        let labels = |e: &Value| {
            event_fields(e)
                .into_iter()
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            labels(&events[2]),
            ["time", "callId", "step", "input", "tool"]
        );
        assert_eq!(
            event_fields(&events[3])
                .iter()
                .find(|(k, _)| k == "output")
                .map(|(_, v)| v.as_str()),
            Some("[redacted] ok")
        );
        assert_eq!(
            event_fields(&events[1])
                .iter()
                .find(|(k, _)| k == "usage")
                .map(|(_, v)| v.as_str()),
            Some("30 in / 8 out")
        );
        let mut v = view(events);
        v.thread_key = "c1:t x".into();
        let html = run_html(&v, "tok", 10_000, Window::Tail).into_string();
        assert_eq!(
            html.matches("<details class=\"ev-details\">").count(),
            6,
            "{html}"
        );
        assert!(
            html.contains(
                "<dt>input</dt><dd>{&quot;text&quot;:&quot;&lt;b&gt;hi&lt;/b&gt;&quot;}</dd>"
            ),
            "escaped as text: {html}"
        );
        // Step 2 only answered: its turn reads "final answer", step 1's reads as a step.
        assert!(
            html.contains("<span class=\"kind\">final answer · assistant</span>"),
            "{html}"
        );
        assert!(
            html.contains("<span class=\"kind\">step 1 · assistant</span>"),
            "{html}"
        );
        // The header links the thread; the controls download the JSON (with the page's token) and run
        // again (the run finished).
        assert!(
            html.contains("id=\"thread-link\" href=\"/threads/c1%3At%20x\""),
            "{html}"
        );
        assert!(
            html.contains("id=\"download\" class=\"btn\" href=\"/runs/r1/export.json?token=tok\" download=\"run-r1.json\""),
            "{html}"
        );
        assert!(
            html.contains("<button id=\"retry\" title="),
            "enabled: {html}"
        );
        let mut live = view(vec![]);
        live.finished = false;
        live.finished_at = None;
        live.status = None;
        let html = run_html(&live, "", 10_000, Window::Tail).into_string();
        assert!(html.contains("<button id=\"retry\" disabled"), "{html}");
        assert!(html.contains("href=\"/runs/r1/export.json\""), "{html}");
    }
}
