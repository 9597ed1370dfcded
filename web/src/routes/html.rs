//! Server-rendered HTML (SPEC §8.1): `GET /runs` (the index) and `GET /runs/{id}` (the live view).
//!
//! No build step: each page is one HTML string with a little CSS and vanilla JS. The index lists live runs
//! (`?all=1` adds history with duration, finish time and an "Older runs" cursor link) and follows
//! `/runs/feed`. The run page is seeded with the run's history, then follows
//! `/api/runs/{id}/stream` from the last seeded seq and closes its `EventSource` after `end` (a browser
//! reconnects a stream that ends otherwise); its Stop soft / Stop hard / Kill buttons call the API.
//!
//! Invariants:
//! - every string that comes from a run is escaped on the server ([`esc`]) and set with `textContent` in
//!   the browser, never as markup: a `<script>` in a message renders as text;
//! - values the script needs (id, token, cursor) travel in `data-` attributes, never inside the script;
//! - a capability token in the page URL (`?token=`) authorizes the page, and the page passes it on to its
//!   stream and its buttons;
//! - the only script and style a page runs are this module's constants, allowed by their SHA-256 in
//!   [`content_security_policy`] (which the edge middleware puts on every HTML answer): a new inline
//!   script must join [`SCRIPTS`];
//! - the buttons' `fetch` calls are same-origin and send a body only as `application/json`, which is
//!   what the edge's cross-site protection lets through.

use std::fmt::Write as _;
use std::sync::OnceLock;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use actors::runs_service::{ListParams, RunList, RunView, StatusFilter};
use base64::prelude::{Engine as _, BASE64_STANDARD};
use serde_json::Value;
use sha2::{Digest, Sha256};
use storage::record::is_valid_run_id;
use storage::store::Cursor;

use super::api::{capability, query_map, reader, runs_error};
use super::resource;
use crate::error::ApiError;
use crate::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/runs", "GET").route(web::get().to(index)))
        .service(resource("/runs/{id}", "GET").route(web::get().to(run_page)));
}

/// Escape text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `YYYY-MM-DD HH:MM:SSZ` (UTC) for an epoch-ms instant.
pub fn fmt_time(ms: i64) -> String {
    let s = storage::generation::utc_stamp(ms);
    format!("{}-{}-{} {}:{}:{}Z", &s[0..4], &s[4..6], &s[6..8], &s[9..11], &s[11..13], &s[13..15])
}

/// `850 ms`, `12.3 s`, `4 m 03 s`, `2 h 05 m`.
pub fn fmt_duration(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{} m {:02} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {:02} m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// A CSS class for a status word.
fn status_class(v: &RunView) -> &'static str {
    use storage::record::RunStatus::*;
    if !v.finished {
        return if v.stop.is_some() { "stopping" } else { "live" };
    }
    if v.provisional == Some(true) {
        return "warn";
    }
    match v.status {
        Some(Completed) => "ok",
        Some(StoppedSoft | StoppedHard) => "stopped",
        Some(Failed | Interrupted) | None => "bad",
    }
}

/// An error as a small HTML page with the API's status.
fn error_page(e: ApiError) -> HttpResponse {
    let status = e.status_code();
    let body = page(
        &format!("{} {}", status.as_u16(), status.canonical_reason().unwrap_or("")),
        &format!("<main><h1>{}</h1><p>{}</p><p><a href=\"/runs\">All runs</a></p></main>", status.as_u16(), esc(&e.to_string())),
        "",
    );
    HttpResponse::build(status).content_type("text/html; charset=utf-8").body(body)
}

fn html(status: StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(body)
}

const CSS: &str = r#"
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:16px 20px}
a{color:#0b5cad}
h1{font-size:20px;margin:8px 0}
nav a{margin-right:12px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #e3e6ea;vertical-align:top}
th{font-weight:600;background:#eef1f4}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.st-live{background:#dbeafe;color:#1e40af}.st-stopping{background:#fef3c7;color:#92400e}
.st-ok{background:#dcfce7;color:#166534}.st-stopped{background:#e5e7eb;color:#374151}
.st-bad{background:#fee2e2;color:#991b1b}.st-warn{background:#fef3c7;color:#92400e}
.banner{background:#fff7ed;border:1px solid #fdba74;padding:6px 10px;margin:8px 0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;background:#fff;padding:10px;margin:8px 0}
dt{color:#5b6570}dd{margin:0;word-break:break-all}
.controls{margin:10px 0}.controls button{margin-right:8px;padding:4px 10px}
ol#events{list-style:none;padding:0;margin:0;background:#fff}
ol#events li{padding:6px 10px;border-bottom:1px solid #eef0f2;white-space:pre-wrap;word-break:break-word}
.seq{color:#8a939c;font-family:ui-monospace,monospace;margin-right:8px}
.kind{font-weight:600;margin-right:8px}
.ev-tool_call .kind,.ev-tool_result .kind{color:#6b21a8}.ev-answer{background:#f0fdf4}
.ev-run_failed{background:#fef2f2}.ev-stop_requested{background:#fffbeb}
#answer{background:#f0fdf4;border:1px solid #86efac;padding:10px;margin:10px 0;white-space:pre-wrap}
#answer:empty{display:none}
"#;

fn page(title: &str, body: &str, script: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{CSS}</style></head><body>{body}{}</body></html>",
        esc(title),
        if script.is_empty() { String::new() } else { format!("<script>{script}</script>") }
    )
}

/// Every inline script a page may carry.
pub const SCRIPTS: [&str; 2] = [INDEX_JS, RUN_JS];

/// The `Content-Security-Policy` of every HTML answer: nothing loads from anywhere but this origin (the
/// pages' `EventSource` and `fetch` are same-origin), the only scripts and the only style that run are
/// [`SCRIPTS`] and [`CSS`], allowed by their SHA-256 — no `'unsafe-inline'`, so markup that ever slipped
/// past [`esc`] still could not run — and no page may be framed (`frame-ancestors 'none'`).
///
/// Hashes rather than a per-response nonce: the scripts are constants, so the policy is too, and a hash
/// admits exactly that text where a nonce admits whatever carries it.
pub fn content_security_policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        let hash = |s: &str| format!("'sha256-{}'", BASE64_STANDARD.encode(Sha256::digest(s.as_bytes())));
        let scripts: Vec<String> = SCRIPTS.iter().map(|s| hash(s)).collect();
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self'; \
             base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
            scripts.join(" "),
            hash(CSS)
        )
    })
}

// ---------------------------------------------------------------------------------------------
// The index
// ---------------------------------------------------------------------------------------------

/// `GET /runs` (live runs) and `GET /runs?all=1[&before=&beforeId=]` (with history).
async fn index(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match render_index(&req, &state).await {
        Ok(body) => html(StatusCode::OK, body),
        Err(e) => error_page(e),
    }
}

async fn render_index(req: &HttpRequest, state: &AppState) -> Result<String, ApiError> {
    let q = query_map(req)?;
    let visible_to = reader(req, state, None, &q)?;
    let all = q.get("all").is_some_and(|v| v == "1" || v == "true");
    let mut params = ListParams::new(if all { StatusFilter::All } else { StatusFilter::Active }, visible_to);
    if all {
        let before = match q.get("before") {
            None => None,
            Some(b) => Some(b.parse::<i64>().map_err(|_| ApiError::bad("before", "must be an integer (epoch ms)"))?),
        };
        let before_id = q.get("beforeId").cloned().filter(|s| !s.is_empty());
        if before_id.as_deref().is_some_and(|id| !is_valid_run_id(id)) {
            return Err(ApiError::bad("beforeId", "is not a run id"));
        }
        params.before = before.map(|finished_at| Cursor { finished_at, id: before_id });
    }
    params.limit = match q.get("limit") {
        None => None,
        Some(l) => Some(l.parse::<usize>().ok().filter(|l| *l > 0).ok_or_else(|| ApiError::bad("limit", "must be a positive integer"))?),
    };
    let list = state.runs.list_runs(&params).await;
    let now = state.runs.clock.now_ms();
    Ok(index_html(&list, all, params.before.is_some(), params.limit, now))
}

fn row_html(v: &RunView, now: i64) -> String {
    let title = v.label.as_deref().unwrap_or(&v.id);
    let mut s = String::new();
    let _ = write!(
        s,
        "<tr id=\"run-{id}\" data-id=\"{id}\"><td><span class=\"status st-{cls}\">{status}</span></td>\
         <td><a href=\"/runs/{id}\">{title}</a><br><small>{id}</small></td><td>{agent}</td><td>{channel}</td>\
         <td>{thread}</td><td>{started}</td><td>{duration}</td><td>{finished}</td><td>{events}</td></tr>",
        id = esc(&v.id),
        cls = status_class(v),
        status = esc(&v.status_label()),
        title = esc(title),
        agent = esc(v.agent.as_deref().unwrap_or("")),
        channel = esc(&v.channel_id),
        thread = esc(&v.thread_key),
        started = fmt_time(v.started_at),
        duration = fmt_duration(v.duration_ms(now)),
        finished = v.finished_at.map(fmt_time).unwrap_or_default(),
        events = v.event_count,
    );
    s
}

fn index_html(list: &RunList, all: bool, cursor_page: bool, limit: Option<usize>, now: i64) -> String {
    let mut body = String::from("<main id=\"index\"");
    let _ = write!(body, " data-all=\"{}\">", if all { "1" } else { "0" });
    body.push_str("<h1>Runs</h1><nav>");
    body.push_str(if all {
        "<a href=\"/runs\">Live runs</a> <strong>All runs</strong>"
    } else {
        "<strong>Live runs</strong> <a href=\"/runs?all=1\">All runs (with history)</a>"
    });
    body.push_str("</nav>");
    if list.store_unavailable {
        body.push_str("<p class=\"banner\">The history store is unavailable: showing live runs only.</p>");
    }
    if list.ledger_unavailable {
        body.push_str("<p class=\"banner\">The live-run ledger is unavailable: runs of other processes may be missing.</p>");
    }
    body.push_str(
        "<table><thead><tr><th>Status</th><th>Run</th><th>Agent</th><th>Channel</th><th>Thread</th>\
         <th>Started</th><th>Duration</th><th>Finished</th><th>Events</th></tr></thead><tbody id=\"rows\">",
    );
    for v in &list.runs {
        body.push_str(&row_html(v, now));
    }
    body.push_str("</tbody></table>");
    if list.runs.is_empty() {
        body.push_str(if all { "<p id=\"empty\">No runs.</p>" } else { "<p id=\"empty\">No live runs.</p>" });
    }
    if all {
        if let Some(nb) = &list.next_before {
            let mut href = format!("/runs?all=1&before={}", nb.finished_at);
            if let Some(id) = &nb.id {
                let _ = write!(href, "&beforeId={id}");
            }
            if let Some(l) = limit {
                let _ = write!(href, "&limit={l}");
            }
            let _ = write!(body, "<p><a id=\"older\" href=\"{}\">Older runs →</a></p>", esc(&href));
        }
        if cursor_page {
            body.push_str("<p><a href=\"/runs?all=1\">← Newest runs</a></p>");
        }
    }
    body.push_str("</main>");
    // The live index follows the feed; a history page is a snapshot.
    let script = if all { "" } else { INDEX_JS };
    page("Runs", &body, script)
}

const INDEX_JS: &str = r#"
(function () {
  var rows = document.getElementById('rows');
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function time(ms) {
    if (ms == null) return '';
    var d = new Date(ms);
    return d.getUTCFullYear() + '-' + pad(d.getUTCMonth() + 1) + '-' + pad(d.getUTCDate()) + ' ' +
      pad(d.getUTCHours()) + ':' + pad(d.getUTCMinutes()) + ':' + pad(d.getUTCSeconds()) + 'Z';
  }
  function dur(ms) {
    ms = Math.max(0, ms);
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    if (ms < 3600000) return Math.floor(ms / 60000) + ' m ' + pad(Math.floor(ms % 60000 / 1000)) + ' s';
    return Math.floor(ms / 3600000) + ' h ' + pad(Math.floor(ms % 3600000 / 60000)) + ' m';
  }
  function label(v) {
    if (!v.finished) return v.stop ? 'stopping (' + v.stop + ')' : 'live';
    if (v.provisional) return 'unfinished \u2014 no finish recorded';
    return v.status || 'finished';
  }
  function cls(v) {
    if (!v.finished) return v.stop ? 'stopping' : 'live';
    if (v.provisional) return 'warn';
    if (v.status === 'completed') return 'ok';
    if (v.status === 'stopped_soft' || v.status === 'stopped_hard') return 'stopped';
    return 'bad';
  }
  function cell(tr, text) { var td = document.createElement('td'); td.textContent = text == null ? '' : String(text); tr.appendChild(td); return td; }
  function render(v) {
    var tr = document.createElement('tr');
    tr.id = 'run-' + v.id; tr.dataset.id = v.id;
    var st = cell(tr, ''); var chip = document.createElement('span');
    chip.className = 'status st-' + cls(v); chip.textContent = label(v); st.appendChild(chip);
    var run = cell(tr, ''); var a = document.createElement('a');
    a.href = '/runs/' + encodeURIComponent(v.id); a.textContent = v.label || v.id; run.appendChild(a);
    run.appendChild(document.createElement('br'));
    var small = document.createElement('small'); small.textContent = v.id; run.appendChild(small);
    cell(tr, v.agent); cell(tr, v.channelId); cell(tr, v.threadKey); cell(tr, time(v.startedAt));
    cell(tr, dur((v.finishedAt || Date.now()) - v.startedAt)); cell(tr, time(v.finishedAt)); cell(tr, v.eventCount);
    return tr;
  }
  var es = new EventSource('/runs/feed');
  es.addEventListener('upsert', function (m) {
    var v = JSON.parse(m.data);
    var old = document.getElementById('run-' + v.id);
    var tr = render(v);
    if (old) { rows.replaceChild(tr, old); } else { rows.insertBefore(tr, rows.firstChild); }
    var empty = document.getElementById('empty'); if (empty) empty.remove();
  });
  es.addEventListener('removed', function (m) {
    var v = JSON.parse(m.data);
    var old = document.getElementById('run-' + v.id); if (old) old.remove();
  });
})();
"#;

// ---------------------------------------------------------------------------------------------
// The live view of one run
// ---------------------------------------------------------------------------------------------

/// `GET /runs/{id}`.
async fn run_page(req: HttpRequest, path: web::Path<String>, state: web::Data<AppState>) -> HttpResponse {
    let id = path.into_inner();
    match render_run(&req, &id, &state).await {
        Ok(body) => html(StatusCode::OK, body),
        Err(e) => error_page(e),
    }
}

async fn render_run(req: &HttpRequest, id: &str, state: &AppState) -> Result<String, ApiError> {
    let q = query_map(req)?;
    let visible_to = reader(req, state, Some(id), &q)?;
    let token = capability(state, id, &q).unwrap_or("").to_owned();
    let view = state.runs.get_run(id, true, &visible_to).await.map_err(|e| runs_error(e, id))?;
    Ok(run_html(&view, &token, state.runs.clock.now_ms()))
}

/// What an event says, as (heading, body) — the same words the page's script renders.
pub fn describe(e: &Value) -> (String, String) {
    let s = |k: &str| match e.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(v) => v.to_string(),
    };
    let kind = s("type");
    match kind.as_str() {
        "run_meta" => ("run started".into(), format!("agent {} · model {}", s("agent"), s("model"))),
        "input" => (format!("input ({})", s("source")), s("text")),
        "context" => ("context".into(), s("text")),
        "assistant" => (format!("step {} · assistant", s("step")), s("text")),
        "tool_call" => (format!("step {} · tool call {}", s("step"), s("tool")), s("summary")),
        "tool_result" => {
            let ok = if e.get("ok").and_then(Value::as_bool).unwrap_or(false) { "ok" } else { "failed" };
            (format!("step {} · tool result {} {ok}", s("step"), s("tool")), s("summary"))
        }
        "note" => (format!("note {}", s("kind")), s("summary")),
        "stop_requested" => {
            let actor = e.get("actor");
            let a = |k: &str| actor.and_then(|a| a.get(k)).and_then(Value::as_str).unwrap_or("").to_owned();
            (format!("stop requested ({})", s("mode")), format!("by {}:{}", a("kind"), a("id")))
        }
        "resumed" => ("resumed".into(), format!("from generation {}", s("fromGeneration"))),
        "run_failed" => ("run failed".into(), s("message")),
        "answer" => ("answer".into(), s("text")),
        _ => (kind, e.to_string()),
    }
}

/// The event's `type` as a CSS class fragment (letters, digits and `_` only).
fn kind_class(e: &Value) -> String {
    e.get("type").and_then(Value::as_str).unwrap_or("other").chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

fn event_html(e: &Value) -> String {
    let (head, body) = describe(e);
    let seq = storage::record::event_seq(e).map(|s| s.to_string()).unwrap_or_default();
    format!(
        "<li class=\"ev ev-{cls}\" data-seq=\"{seq}\"><span class=\"seq\">#{seq}</span><span class=\"kind\">{head}</span>\
         <span class=\"body\">{body}</span></li>",
        cls = kind_class(e),
        head = esc(&head),
        body = esc(&body),
    )
}

fn run_html(v: &RunView, token: &str, now: i64) -> String {
    let events = v.events.as_deref().unwrap_or_default();
    let last_seq = events.iter().filter_map(storage::record::event_seq).max().unwrap_or(0);
    let answer = events.iter().rev().find(|e| e["type"] == "answer").and_then(|e| e["text"].as_str()).unwrap_or("");
    let title = v.label.clone().unwrap_or_else(|| v.id.clone());
    let usage = view_usage(v).unwrap_or_else(|| usage_of(events));
    let mut b = String::new();
    let _ = write!(
        b,
        "<main id=\"run\" data-id=\"{id}\" data-token=\"{token}\" data-last-seq=\"{last_seq}\" data-finished=\"{fin}\" data-started-at=\"{started}\" data-usage=\"{usage}\">\
         <nav><a href=\"/runs\">← Runs</a></nav><h1>{title}</h1>\
         <p>Status: <span id=\"status\" class=\"status st-{cls}\">{status}</span> <span id=\"conn\"></span></p><dl>",
        id = esc(&v.id),
        token = esc(token),
        fin = v.finished,
        started = v.started_at,
        title = esc(&title),
        usage = esc(&Value::Object(usage.iter().map(|(m, (i, o))| (m.clone(), serde_json::json!([i, o]))).collect()).to_string()),
        cls = status_class(v),
        status = esc(&v.status_label()),
    );
    let mut field = |k: &str, val: &str, id: &str| {
        let _ = write!(b, "<dt>{}</dt><dd id=\"{id}\">{}</dd>", esc(k), esc(val));
    };
    field("Run", &v.id, "f-id");
    field("Agent", v.agent.as_deref().unwrap_or(""), "f-agent");
    field("Model", v.model.as_deref().unwrap_or(""), "f-model");
    field("Channel", &format!("{} ({})", v.channel_id, v.channel_visibility.as_str()), "f-channel");
    field("Thread", &v.thread_key, "f-thread");
    field("User", &v.user_id, "f-user");
    field("Started", &fmt_time(v.started_at), "f-started");
    field("Finished", &v.finished_at.map(fmt_time).unwrap_or_default(), "f-finished");
    field("Duration", &fmt_duration(v.duration_ms(now)), "f-duration");
    field("Events", &v.event_count.to_string(), "f-events");
    field("Tokens", &usage_words(&usage), "f-usage");
    if let Some(g) = &v.owner_gen {
        field("Live in generation", g, "f-owner");
    }
    if let Some(p) = &v.parent_run_id {
        field("Parent run", p, "f-parent");
    }
    let disabled = if v.finished { " disabled" } else { "" };
    let _ = write!(
        b,
        "</dl><div class=\"controls\"><button id=\"stop-soft\"{disabled}>Stop (soft)</button>\
         <button id=\"stop-hard\"{disabled}>Stop (hard)</button><button id=\"kill\">Kill</button>\
         <span id=\"control-msg\"></span></div><div id=\"answer\">{}</div><h2>Events</h2><ol id=\"events\">",
        esc(answer)
    );
    for e in events {
        b.push_str(&event_html(e));
    }
    b.push_str("</ol></main>");
    page(&format!("Run {title}"), &b, RUN_JS)
}

/// Token usage summed per model over the `assistant` events that carry it (SPEC §8.3): model →
/// (input, output).
fn usage_of(events: &[Value]) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut sums = std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e["type"] == "assistant") {
        let Some(u) = e.get("usage").filter(|u| u.is_object()) else { continue };
        let sum: &mut (u64, u64) = sums.entry(e["model"].as_str().unwrap_or("-").to_owned()).or_default();
        sum.0 += u["inputTokens"].as_u64().unwrap_or(0);
        sum.1 += u["outputTokens"].as_u64().unwrap_or(0);
    }
    sums
}

/// The `usage` a view carries (SPEC §7 `usage?`), as model → (input, output).
fn view_usage(v: &RunView) -> Option<std::collections::BTreeMap<String, (u64, u64)>> {
    let view = serde_json::to_value(v).ok()?;
    let usage = view.get("usage")?.as_object()?;
    let n = |u: &Value, k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let sums: std::collections::BTreeMap<_, _> =
        usage.iter().map(|(m, u)| (m.clone(), (n(u, "inputTokens"), n(u, "outputTokens")))).collect();
    (!sums.is_empty()).then_some(sums)
}

/// `m1: 30 in / 8 out · m2: …` — the same words the page's script renders.
fn usage_words(usage: &std::collections::BTreeMap<String, (u64, u64)>) -> String {
    usage.iter().map(|(m, (i, o))| format!("{m}: {i} in / {o} out")).collect::<Vec<_>>().join(" · ")
}

const RUN_JS: &str = r#"
(function () {
  var root = document.getElementById('run');
  var id = root.dataset.id, token = root.dataset.token || '';
  var last = Number(root.dataset.lastSeq || 0);
  var list = document.getElementById('events');
  var statusEl = document.getElementById('status');
  var conn = document.getElementById('conn');
  var msg = document.getElementById('control-msg');
  var base = '/api/runs/' + encodeURIComponent(id);
  var tq = token ? 'token=' + encodeURIComponent(token) : '';
  function str(v) { return v == null ? '' : (typeof v === 'string' ? v : JSON.stringify(v)); }
  function describe(e) {
    switch (e.type) {
      case 'run_meta': return ['run started', 'agent ' + str(e.agent) + ' \u00b7 model ' + str(e.model)];
      case 'input': return ['input (' + str(e.source) + ')', str(e.text)];
      case 'context': return ['context', str(e.text)];
      case 'assistant': return ['step ' + str(e.step) + ' \u00b7 assistant', str(e.text)];
      case 'tool_call': return ['step ' + str(e.step) + ' \u00b7 tool call ' + str(e.tool), str(e.summary)];
      case 'tool_result': return ['step ' + str(e.step) + ' \u00b7 tool result ' + str(e.tool) + ' ' + (e.ok === true ? 'ok' : 'failed'), str(e.summary)];
      case 'note': return ['note ' + str(e.kind), str(e.summary)];
      case 'stop_requested': var a = e.actor || {}; return ['stop requested (' + str(e.mode) + ')', 'by ' + str(a.kind) + ':' + str(a.id)];
      case 'resumed': return ['resumed', 'from generation ' + str(e.fromGeneration)];
      case 'run_failed': return ['run failed', str(e.message)];
      case 'answer': return ['answer', str(e.text)];
      default: return [str(e.type), JSON.stringify(e)];
    }
  }
  function span(cls, text) { var s = document.createElement('span'); s.className = cls; s.textContent = text; return s; }
  function render(e) {
    var d = describe(e), li = document.createElement('li');
    li.className = 'ev ev-' + String(e.type || 'other').replace(/[^A-Za-z0-9_]/g, '');
    li.dataset.seq = e.seq == null ? '' : String(e.seq);
    li.appendChild(span('seq', '#' + li.dataset.seq)); li.appendChild(span('kind', d[0])); li.appendChild(span('body', d[1]));
    return li;
  }
  var usage = JSON.parse(root.getAttribute('data-usage') || '{}');
  function addUsage(e) {
    var m = e.model == null ? '-' : String(e.model), u = usage[m] || [0, 0];
    usage[m] = [u[0] + (e.usage.inputTokens || 0), u[1] + (e.usage.outputTokens || 0)];
    document.getElementById('f-usage').textContent = Object.keys(usage).sort().map(function (k) {
      return k + ': ' + usage[k][0] + ' in / ' + usage[k][1] + ' out';
    }).join(' \u00b7 ');
  }
  function setStatus(text, cls) { statusEl.textContent = text; statusEl.className = 'status st-' + cls; }
  function statusClass(s) {
    if (s === 'completed') return 'ok';
    if (s === 'stopped_soft' || s === 'stopped_hard') return 'stopped';
    return 'bad';
  }
  var startedAt = Number(root.dataset.startedAt || 0);
  var durEl = document.getElementById('f-duration');
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function dur(ms) {
    ms = Math.max(0, ms);
    if (ms < 1000) return ms + ' ms';
    if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
    if (ms < 3600000) return Math.floor(ms / 60000) + ' m ' + pad(Math.floor(ms % 60000 / 1000)) + ' s';
    return Math.floor(ms / 3600000) + ' h ' + pad(Math.floor(ms % 3600000 / 60000)) + ' m';
  }
  var ticker = null;
  function finish() {
    document.getElementById('stop-soft').disabled = true;
    document.getElementById('stop-hard').disabled = true;
    if (ticker) { clearInterval(ticker); ticker = null; }
  }
  if (root.dataset.finished !== 'true') {
    ticker = setInterval(function () { durEl.textContent = dur(Date.now() - startedAt); }, 1000);
    var url = base + '/stream?afterSeq=' + last + (tq ? '&' + tq : '');
    var es = new EventSource(url);
    es.onopen = function () { conn.textContent = ''; };
    es.onerror = function () { if (es.readyState !== 2) conn.textContent = '(reconnecting\u2026)'; };
    es.addEventListener('run_event', function (m) {
      var e = JSON.parse(m.data);
      if (e.seq != null && e.seq <= last) return;
      if (e.seq != null) last = e.seq;
      list.appendChild(render(e));
      document.getElementById('f-events').textContent = String(last);
      if (e.type === 'answer') document.getElementById('answer').textContent = str(e.text);
      if (e.type === 'assistant' && e.usage) addUsage(e);
      if (e.type === 'stop_requested') setStatus('stopping (' + str(e.mode) + ')', 'stopping');
    });
    es.addEventListener('end', function (m) {
      es.close();
      var d = JSON.parse(m.data);
      if (d.provisional) setStatus('unfinished \u2014 no finish recorded', 'warn');
      else setStatus(str(d.status), statusClass(d.status));
      if (d.finishedAt != null) {
        var t = new Date(d.finishedAt).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
        document.getElementById('f-finished').textContent = t;
      }
      finish();
      if (d.finishedAt != null) durEl.textContent = dur(d.finishedAt - startedAt);
      conn.textContent = '';
    });
  }
  function call(method, path, body) {
    msg.textContent = '\u2026';
    var url = path + (tq ? (path.indexOf('?') < 0 ? '?' : '&') + tq : '');
    var init = { method: method, headers: {} };
    if (body) { init.headers['content-type'] = 'application/json'; init.body = JSON.stringify(body); }
    fetch(url, init).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (b) {
        msg.textContent = r.status + ' ' + str(b.state || b.message || b.error || '');
      });
    }, function (err) { msg.textContent = 'request failed: ' + err; });
  }
  document.getElementById('stop-soft').addEventListener('click', function () { call('POST', base + '/stop', { mode: 'soft' }); });
  document.getElementById('stop-hard').addEventListener('click', function () { call('POST', base + '/stop', { mode: 'hard' }); });
  document.getElementById('kill').addEventListener('click', function () {
    if (window.confirm && !window.__noConfirm && !window.confirm('Kill this run? Its history is deleted.')) return;
    call('DELETE', base);
  });
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn run_strings_are_escaped_in_every_rendering() {
        let e = json!({"type": "input", "seq": 2, "text": "<script>alert(1)</script> & \"q\"", "source": "request"});
        let li = event_html(&e);
        assert!(li.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;q&quot;"), "{li}");
        assert!(!li.contains("<script>"));
        // A hostile event type cannot break out of the class attribute.
        let odd = event_html(&json!({"type": "x\" onmouseover=\"alert(1)", "seq": 1}));
        assert!(odd.contains("class=\"ev ev-xonmouseoveralert1\""), "{odd}");
    }

    /// The text of every `<tag>…</tag>` in `page`.
    fn inline(page: &str, tag: &str) -> Vec<String> {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        page.split(&open).skip(1).map(|rest| rest.split(&close).next().unwrap_or("").to_owned()).collect()
    }

    #[test]
    fn every_inline_script_and_style_of_every_page_is_allowed_by_its_hash_and_nothing_else_is() {
        let policy = content_security_policy();
        let hash = |s: &str| format!("'sha256-{}'", BASE64_STANDARD.encode(Sha256::digest(s.as_bytes())));
        let list = RunList { runs: Vec::new(), next_before: None, store_unavailable: false, ledger_unavailable: false };
        let pages = [
            index_html(&list, false, false, None, 0),
            index_html(&list, true, false, None, 0),
            page("Run", "<main></main>", RUN_JS),
            page("404 Not Found", "<main><h1>404</h1></main>", ""),
        ];
        let mut scripts = 0;
        for p in &pages {
            for script in inline(p, "script") {
                assert!(policy.contains(&hash(&script)), "a page script is not in the policy: {policy}");
                scripts += 1;
            }
            for style in inline(p, "style") {
                assert!(policy.contains(&hash(&style)), "a page style is not in the policy: {policy}");
            }
        }
        assert_eq!(scripts, 2, "the live index and the run page each carry their script");
        // Nothing inline is allowed by keyword, nothing loads from another origin, no framing.
        for forbidden in ["unsafe-inline", "unsafe-eval", "*", "http:", "https:", "data:"] {
            assert!(!policy.contains(forbidden), "{forbidden} in {policy}");
        }
        for directive in ["default-src 'none'", "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"] {
            assert!(policy.contains(directive), "{directive} missing from {policy}");
        }
    }

    #[test]
    fn the_buttons_post_json_and_send_no_body_otherwise() {
        // The edge refuses a body that is not `application/json` (SPEC §8.1): the script's one `fetch`
        // sets that type whenever it sends a body, and Kill sends none.
        assert!(RUN_JS.contains("if (body) { init.headers['content-type'] = 'application/json'; init.body = JSON.stringify(body); }"));
        assert!(RUN_JS.contains("call('DELETE', base);"));
        assert_eq!(RUN_JS.matches("fetch(").count(), 1);
    }

    #[test]
    fn times_and_durations_render_readably() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(fmt_duration(850), "850 ms");
        assert_eq!(fmt_duration(12_345), "12.3 s");
        assert_eq!(fmt_duration(243_000), "4 m 03 s");
        assert_eq!(fmt_duration(7_500_000), "2 h 05 m");
    }
}
