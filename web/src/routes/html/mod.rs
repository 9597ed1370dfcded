//! Server-rendered HTML (SPEC §8.1): `GET /runs` (the index), `GET /runs/{id}` (the live view),
//! `GET /runs/{id}/timeline` (the live view's "now" line and timeline, which its script re-fetches as
//! events arrive), `GET /threads/{key}` (a thread's runs, oldest first) and `GET /runs/{id}/export.json`
//! (the live view's "Download JSON": the run's view with its events).
//!
//! No build step: every page is rendered with `maud`, whose `html!` escapes every interpolated value at
//! compile-time-checked points, with one stylesheet ([`CSS`]) and a small vanilla script per page
//! ([`scripts`]). No external assets: no fonts, images or scripts from anywhere.
//!
//! # Layout
//! - `index` — the index: `list_runs` filters as a form, the runs-per-minute chart, the table (cards on
//!   a narrow screen), the "Older runs" cursor link;
//! - `live` — the live view: header, answer or error, controls, the paged event list with each event's
//!   details, and the JSON export;
//! - `thread` — a thread's page: its runs in order, live ones marked;
//! - `timeline` — the pure timeline model and its SVG rows;
//! - `scripts` — the pages' scripts (constants, allowed by hash).
//!
//! Invariants:
//! - every string that comes from a run reaches markup through `maud`'s escaping, and the browser sets
//!   run strings with `textContent`; the only markup the browser inserts is this module's own fragment
//!   (`/runs/{id}/timeline`), parsed with `DOMParser`: a `<script>` in a message renders as text;
//! - values the scripts need (id, token, cursor) travel in `data-` attributes, never inside a script;
//! - a capability token in the page URL (`?token=`) authorizes the page, and the page passes it on to its
//!   stream, its fragment and its buttons;
//! - the only scripts and style a page runs are [`scripts::ALL`] and [`CSS`], allowed by their SHA-256 in
//!   [`content_security_policy`] (which the edge middleware puts on every HTML answer); geometry lives in
//!   SVG presentation attributes, never in `style` attributes (which that policy refuses);
//! - a page never renders an unbounded list: the event list shows at most [`live::EVENTS_PAGE`] events
//!   with "earlier"/"later" links, the timeline at most [`timeline::MAX_ROWS`] steps;
//! - the buttons' `fetch` calls are same-origin and send a body only as `application/json`, which is
//!   what the edge's cross-site protection lets through.

mod index;
mod live;
mod scripts;
mod thread;
pub mod timeline;

use std::sync::OnceLock;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse, ResponseError};
use actors::runs_service::RunView;
use base64::prelude::{Engine as _, BASE64_STANDARD};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::resource;
use crate::error::ApiError;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/runs", "GET").route(web::get().to(index::index)))
        .service(resource("/runs/{id}", "GET").route(web::get().to(live::run_page)))
        .service(
            resource("/runs/{id}/timeline", "GET").route(web::get().to(live::timeline_fragment)),
        )
        .service(resource("/runs/{id}/export.json", "GET").route(web::get().to(live::export)))
        .service(resource("/threads/{key:.+}", "GET").route(web::get().to(thread::thread_page)));
}

/// The thread page of `thread_key` (`/threads/<key, percent-encoded>`).
pub fn thread_href(thread_key: &str) -> String {
    format!("/threads/{}", encode(thread_key))
}

/// The marks of a run, each a small chip whose title says what it means: resumed after its process
/// ended, tool calls with unknown effects, a reply whose delivery is unknown. The index's script renders
/// the same chips for the runs its feed brings ([`scripts::INDEX_JS`]).
pub fn marks(v: &RunView) -> Markup {
    let times = |n: u64| {
        if n == 1 {
            "once".to_owned()
        } else {
            format!("{n} times")
        }
    };
    let calls = |n: u64| {
        if n == 1 {
            "1 tool call".to_owned()
        } else {
            format!("{n} tool calls")
        }
    };
    html! {
        @if v.resumed.is_some() || v.effects_unknown.is_some() || v.delivery_unknown.is_some() || v.awaiting_approval.is_some() {
            span class="marks" {
                @if v.awaiting_approval.is_some() {
                    span class="mark mark-approval" title="Awaiting approval: the run is parked until a person approves or denies a tool call" { "✋ awaiting approval" }
                }
                @if let Some(n) = v.resumed {
                    span class="mark mark-resumed" title=(format!("Resumed {} after the process holding it ended", times(n))) { "↻ resumed" }
                }
                @if let Some(n) = v.effects_unknown {
                    span class="mark mark-unknown" title=(format!("Effects unknown: {} in flight when a process ended; whether they took effect is not known", calls(n))) { "⚠ effects unknown" }
                }
                @if v.delivery_unknown.is_some() {
                    span class="mark mark-delivery" title="Delivery unknown: the process holding the run ended after its finishing gate, so whether its reply reached the channel is not known" { "✉ delivery unknown" }
                }
            }
        }
    }
}

/// `YYYY-MM-DD HH:MM:SSZ` (UTC) for an epoch-ms instant.
pub fn fmt_time(ms: i64) -> String {
    let s = storage::generation::utc_stamp(ms);
    format!(
        "{}-{}-{} {}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    )
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

/// `just now`, `42 s ago`, `3 min ago`, `5 h ago`, `2 d ago` — the same words the scripts render.
pub fn fmt_ago(now_ms: i64, ms: i64) -> String {
    let s = (now_ms - ms).max(0) / 1000;
    match s {
        0..=4 => "just now".into(),
        5..=59 => format!("{s} s ago"),
        60..=3_599 => format!("{} min ago", s / 60),
        3_600..=86_399 => format!("{} h ago", s / 3_600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A relative time that never wraps, with the absolute one as its tooltip; the scripts keep it current.
fn ago(now_ms: i64, ms: i64) -> Markup {
    html! { time class="ago" datetime=(fmt_time(ms)) title=(fmt_time(ms)) data-ms=(ms) { (fmt_ago(now_ms, ms)) } }
}

/// A CSS class for a run's status chip.
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

/// The status chip (`id` given to the live view's, which its script updates).
fn status_chip(v: &RunView, id: Option<&str>) -> Markup {
    html! { span id=[id] class=(format!("status st-{}", status_class(v))) { (v.status_label()) } }
}

/// An error as a small HTML page with the API's status.
fn error_page(e: ApiError) -> HttpResponse {
    let status = e.status_code();
    let title = format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let body = html! {
        main class="narrow" {
            div class="card" {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                p { (e.to_string()) }
                p { a href="/runs" { "All runs" } }
            }
        }
    };
    respond(status, page(&title, body, None))
}

/// An HTML answer that is never cached (pages show live state and may carry a capability token).
fn respond(status: StatusCode, body: Markup) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(body.into_string())
}

/// The one stylesheet of every page (allowed by its hash).
pub const CSS: &str = r#"
:root{--bg:#f4f6f9;--card:#fff;--ink:#18212f;--muted:#677489;--line:#e3e7ee;--blue:#2563eb;--green:#15803d;--red:#c81e1e;--amber:#b45309;--violet:#7c3aed;--gray:#8a94a6}
*{box-sizing:border-box}
body{font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:var(--ink);background:var(--bg)}
a{color:var(--blue);text-decoration:none}a:hover{text-decoration:underline}
code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
.top{background:#111827;color:#e5e7eb;display:flex;align-items:center;gap:18px;padding:10px 20px;flex-wrap:wrap}
.top .brand{color:#fff;font-weight:700;letter-spacing:.02em}
.top nav{display:flex;gap:14px;flex-wrap:wrap}.top nav a{color:#cbd5e1}
main{max-width:1180px;margin:0 auto;padding:18px 20px 48px}
main.narrow{max-width:640px}
h1{font-size:22px;margin:4px 0 12px;overflow-wrap:anywhere}
h2{font-size:15px;margin:0 0 10px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px;margin:0 0 14px;box-shadow:0 1px 2px rgba(16,24,40,.04)}
.muted{color:var(--muted)}
.status{display:inline-block;padding:1px 9px;border-radius:999px;font-weight:600;font-size:12px;white-space:nowrap}
.st-live{background:#dbeafe;color:#1e40af}.st-stopping{background:#fef3c7;color:#92400e}
.st-ok{background:#dcfce7;color:#166534}.st-stopped{background:#e5e7eb;color:#374151}
.st-bad{background:#fee2e2;color:#991b1b}.st-warn{background:#fef3c7;color:#92400e}
.banner{background:#fff7ed;border:1px solid #fdba74;border-radius:8px;padding:8px 12px;margin:0 0 12px}
time.ago{white-space:nowrap}
.filters{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-end}
.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--muted);gap:3px}
.filters select,.filters input{font:inherit;height:34px;padding:0 8px;border:1px solid #cfd6e0;border-radius:6px;background:#fff;min-width:0;width:160px}
.btn,button{font:inherit;height:34px;padding:0 14px;border-radius:6px;border:1px solid #cfd6e0;background:#fff;color:var(--ink);cursor:pointer;display:inline-flex;align-items:center}
.btn:hover{text-decoration:none;background:#f8fafc}
.btn-primary{background:var(--blue);border-color:var(--blue);color:#fff}
button:disabled{opacity:.45;cursor:default}
.btn-danger{border-color:#f3b4b4;color:var(--red)}
.chart-card{display:flex;flex-direction:column;gap:6px}
.chart-head{display:flex;justify-content:space-between;gap:10px;flex-wrap:wrap;align-items:baseline}
svg.chart{width:100%;height:90px;display:block;background:#fbfcfe;border-radius:6px}
.chart-axis{display:flex;justify-content:space-between;font-size:11px;color:var(--muted)}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);align-items:center}
.legend>span{white-space:nowrap}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.c-completed,.sw-completed{fill:#22c55e;background:#22c55e}.c-failed,.sw-failed{fill:#ef4444;background:#ef4444}
.c-stopped,.sw-stopped{fill:#94a3b8;background:#94a3b8}.c-interrupted,.sw-interrupted{fill:#f59e0b;background:#f59e0b}
.c-live,.sw-live{fill:#3b82f6;background:#3b82f6}
table.runs{border-collapse:collapse;width:100%}
.runs th,.runs td{text-align:left;padding:8px 10px;border-bottom:1px solid var(--line);vertical-align:top}
.runs td.run,.runs td.col-thread{overflow-wrap:anywhere}
.runs td.run a{font-weight:600}
@media (min-width:641px){.runs th,.runs td{white-space:nowrap}.runs td.run,.runs td.col-thread{white-space:normal}.runs td.run{min-width:240px}.runs td.col-thread{max-width:200px}}
.runs th{font-size:12px;font-weight:600;color:var(--muted);text-transform:uppercase;letter-spacing:.03em}
.runs tbody tr:hover{background:#f8fafc}
.runs .sub{color:var(--muted);font-size:12px;word-break:break-all}
.runs .err{color:var(--red);font-size:12px;margin-top:3px;max-width:420px;overflow:hidden;text-overflow:ellipsis;display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;word-break:break-word}
.num{font-variant-numeric:tabular-nums;white-space:nowrap}
.pager{display:flex;gap:16px;margin-top:10px}
.table-card{padding:4px 6px}
@media (max-width:900px){.col-thread{display:none}}
@media (max-width:640px){
 main{padding:12px 10px 40px}.top{padding:10px 12px}
 .filters label{flex:1 1 140px}.filters select,.filters input{width:100%}
 table.runs,.runs tbody,.runs tr,.runs td{display:block;width:100%}
 .runs thead{display:none}
 .runs tr{border-bottom:1px solid var(--line);padding:8px 4px}
 .runs td{border:0;padding:2px 6px;display:flex;gap:10px}
 .runs td::before{content:attr(data-label);flex:0 0 76px;color:var(--muted);font-size:12px}
 .runs td>*{min-width:0}
 .runs td.col-thread{display:none}
 .runs .err{max-width:none}
}
.head-row{display:flex;align-items:center;gap:10px;flex-wrap:wrap}
.head-row h1{margin:0}
.meta-line{color:var(--muted);margin:6px 0 0;display:flex;flex-wrap:wrap;gap:4px 14px}
.meta-line b{color:var(--ink);font-weight:600;overflow-wrap:anywhere}
.now{margin:10px 0 0;font-weight:600;color:#1e40af}
.pulse{display:inline-block;width:8px;height:8px;border-radius:50%;background:#3b82f6;margin-right:8px;animation:pulse 1.2s ease-in-out infinite}
@keyframes pulse{50%{opacity:.3}}
.errbox{background:#fef2f2;border:1px solid #fca5a5;border-left:4px solid var(--red);border-radius:8px;padding:10px 14px;margin:0 0 14px;color:#7f1d1d;white-space:pre-wrap;word-break:break-word}
.errbox strong{display:block;color:var(--red);margin-bottom:2px}
.answer{background:#f0fdf4;border:1px solid #86efac;border-left:4px solid var(--green);border-radius:8px;padding:10px 14px;margin:0 0 14px;white-space:pre-wrap;word-break:break-word}
.answer:empty{display:none}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(210px,1fr));gap:8px 18px;margin:0}
dl.facts div{min-width:0}
dt{color:var(--muted);font-size:12px}dd{margin:0;word-break:break-word}
.controls{display:flex;gap:8px;align-items:center;flex-wrap:wrap;margin-top:12px}
#control-msg{color:var(--muted)}
.approvals{border-left:4px solid var(--amber)}
.approval{padding:10px 0 4px;border-top:1px solid var(--line)}
.approval-head{display:flex;gap:4px 12px;flex-wrap:wrap;align-items:baseline;overflow-wrap:anywhere}
.approval-input{font:12px/1.45 ui-monospace,SFMono-Regular,Menlo,monospace;white-space:pre-wrap;word-break:break-word;margin:6px 0 8px;padding:6px 10px;border-left:2px solid var(--line);background:var(--sunk);max-height:240px;overflow:auto}
.approval-controls{display:flex;gap:8px;align-items:center;flex-wrap:wrap}
.approval-note{font:inherit;height:34px;padding:0 8px;border:1px solid #cfd6e0;border-radius:6px;background:var(--card);color:var(--ink);flex:1 1 220px;min-width:0}
.approval-msg{color:var(--muted)}
.ev-approval_requested{background:#fffbeb}
.tl-head{display:flex;justify-content:space-between;align-items:baseline;gap:10px;flex-wrap:wrap;margin-bottom:6px}
.sw-model{background:#6366f1}.sw-tool{background:#14b8a6}.sw-bad{background:#ef4444}.sw-unknown{background:#f59e0b}.sw-gap{background:#fde68a;border:1px dashed #d97706}
.tl-row{display:grid;grid-template-columns:64px minmax(0,1fr) minmax(0,230px);gap:10px;align-items:center;padding:2px 0}
.tl-label{font-size:12px;color:var(--muted);white-space:nowrap}
.tl-dur{font-size:12px;color:var(--muted);white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
svg.tl-track{display:block;overflow:visible}
.tl-axis text{font-size:10px;fill:var(--muted)}
.lane{fill:#f3f5f9}
.bar-model{fill:#6366f1}.bar-tool{fill:#14b8a6}.bar-bad{fill:#ef4444}.bar-unknown{fill:#f59e0b}
.bar-cut{fill:#cbd5e1;stroke:#ef4444;stroke-dasharray:2 2}
.bar-open{opacity:.65}
.band-gap{fill:#fde68a;opacity:.55}.gap-mark{opacity:1;stroke:#d97706;stroke-dasharray:3 2}
.tl-gap .tl-label{color:#b45309;font-weight:600}.tl-gap .tl-dur{color:#92400e}
.tl-failed .tl-label{color:var(--red)}.tl-unknown .tl-label{color:var(--amber)}
@media (max-width:640px){.tl-row{grid-template-columns:50px minmax(0,1fr)}.tl-dur{grid-column:2}}
.ev-head{display:flex;justify-content:space-between;align-items:baseline;gap:10px;flex-wrap:wrap}
ol#events{list-style:none;padding:0;margin:0}
ol#events li{padding:7px 4px;border-bottom:1px solid #eef0f3;display:grid;grid-template-columns:56px 64px minmax(0,1fr);gap:2px 10px}
.seq,.rel{color:var(--gray);font:12px/1.6 ui-monospace,SFMono-Regular,Menlo,monospace;white-space:nowrap}
.kind{font-weight:600}
.dur{color:var(--muted);font-size:12px;margin-left:8px;white-space:nowrap}
.body{grid-column:3;white-space:pre-wrap;word-break:break-word;color:#344054}
.body:empty{display:none}
.ev-tool_call .kind,.ev-tool_result .kind{color:#6b21a8}
.ev-answer{background:#f0fdf4}.ev-run_failed{background:#fef2f2}.ev-stop_requested{background:#fffbeb}.ev-resumed{background:#fffbeb}
.ev-unknown .kind::after{content:" · effects unknown";color:var(--amber)}
.marks{display:inline-flex;flex-wrap:wrap;gap:4px;margin-left:6px;vertical-align:1px}
.mark{display:inline-block;padding:0 7px;border-radius:999px;font-size:11px;font-weight:600;white-space:nowrap;cursor:help}
.mark-resumed{background:#ede9fe;color:#5b21b6}.mark-unknown{background:#fef3c7;color:#92400e}.mark-delivery{background:#e0f2fe;color:#075985}.mark-approval{background:#fee2e2;color:#991b1b}
#search{flex-wrap:nowrap}#search label{flex:1 1 auto;min-width:0}#search input{width:100%}
.ev-details{grid-column:3;margin-top:2px}
.ev-details summary{cursor:pointer;color:var(--muted);font-size:12px;width:max-content}
.ev-details dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 12px;margin:4px 0 2px;padding:6px 10px;border-left:2px solid var(--line);background:var(--sunk)}
.ev-details dt{font-size:12px}
.ev-details dd{font:12px/1.45 ui-monospace,SFMono-Regular,Menlo,monospace;white-space:pre-wrap;word-break:break-word}
.tl-answer .tl-label{color:var(--green);font-weight:600}
#thread h1 code{font-size:17px}
#thread-link b{color:var(--blue)}
.thread-runs{list-style:none;margin:0;padding:0}
.thread-runs li{display:grid;grid-template-columns:34px minmax(0,1fr) auto;gap:4px 12px;padding:10px 6px;border-bottom:1px solid var(--line);align-items:start}
.thread-runs li.is-live{background:var(--sunk)}
.thread-runs .ord{color:var(--gray);font:12px/1.9 ui-monospace,SFMono-Regular,Menlo,monospace}
.thread-runs .what a{font-weight:600;overflow-wrap:anywhere}
.thread-runs .said{color:var(--muted);font-size:12px;margin-top:2px;overflow:hidden;text-overflow:ellipsis;display:-webkit-box;-webkit-line-clamp:2;-webkit-box-orient:vertical;word-break:break-word}
.thread-runs .said.err{color:var(--red)}
.thread-runs .when{text-align:right;font-size:12px;color:var(--muted);white-space:nowrap}
@media (max-width:640px){.thread-runs li{grid-template-columns:28px minmax(0,1fr)}.thread-runs .when{grid-column:2;text-align:left}}
:root{color-scheme:light dark;--sunk:#f8fafc}
@media (prefers-color-scheme:dark){
:root{--bg:#0e131a;--card:#161c25;--ink:#e5e9f0;--muted:#a3adbf;--line:#2b3441;--blue:#8ab4ff;--green:#5ee08c;--red:#ff8a8a;--amber:#f7c04a;--violet:#c4b5fd;--gray:#95a0b3;--sunk:#11171f}
.top{background:#0a0e14}
.card{box-shadow:none}
.st-live{background:#1e3a8a;color:#dbeafe}.st-stopping{background:#5b3a0a;color:#fde68a}
.st-ok{background:#14532d;color:#dcfce7}.st-stopped{background:#334155;color:#e2e8f0}
.st-bad{background:#7f1d1d;color:#fee2e2}.st-warn{background:#5b3a0a;color:#fde68a}
.banner{background:#33240d;border-color:#92400e;color:#fde68a}
.filters select,.filters input{background:#0e131a;border-color:#3a4556;color:var(--ink)}
.btn,button{background:#212a36;border-color:#3a4556;color:var(--ink)}
.btn:hover{background:#2a3443}
.btn-primary{background:#2563eb;border-color:#2563eb;color:#fff}
.btn-danger{border-color:#7f1d1d;color:var(--red)}
svg.chart{background:#10161e}svg.chart line{stroke:var(--line)}
.runs tbody tr:hover{background:#1c2430}
.now{color:#9cc3ff}
.errbox{background:#2a1215;border-color:#7f1d1d;color:#fecaca}
.answer{background:#0f2417;border-color:#166534;color:var(--ink)}
ol#events li{border-bottom-color:var(--line)}
.body{color:#cfd6e1}
.ev-tool_call .kind,.ev-tool_result .kind{color:#d8b4fe}
.ev-answer{background:#0f2417}.ev-run_failed{background:#2a1215}.ev-stop_requested,.ev-resumed,.ev-approval_requested{background:#2b210c}
.approval-note{border-color:#3a4556}
.lane{fill:#1d2430}
.bar-cut{fill:#475569}
.band-gap{fill:#b45309;opacity:.45}.sw-gap{background:#b45309;border-color:#f59e0b}
.tl-gap .tl-label{color:var(--amber)}.tl-gap .tl-dur{color:#fcd34d}
.mark-resumed{background:#3b2a6b;color:#ede9fe}.mark-unknown{background:#5b3a0a;color:#fde68a}.mark-delivery{background:#0c3b57;color:#e0f2fe}.mark-approval{background:#5b1a1a;color:#fee2e2}
}
"#;

/// A whole page: the common header, `body`, and the page's script when it has one.
fn page(title: &str, body: Markup, script: Option<&'static str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Switchboard" }
                style { (PreEscaped(CSS)) }
            }
            body {
                header class="top" {
                    a class="brand" href="/runs" { "Switchboard" }
                    nav {
                        a href="/runs" { "Live" }
                        a href="/runs?all=1" { "All runs" }
                        a href="/runs?status=failed" { "Failed" }
                    }
                }
                (body)
                @if let Some(s) = script {
                    script { (PreEscaped(s)) }
                }
            }
        }
    }
}

/// The `Content-Security-Policy` of every HTML answer: nothing loads from anywhere but this origin (the
/// pages' `EventSource` and `fetch` are same-origin), the only scripts and the only style that run are
/// [`scripts::ALL`] and [`CSS`], allowed by their SHA-256 — no `'unsafe-inline'`, so markup that ever
/// slipped past escaping still could not run — and no page may be framed (`frame-ancestors 'none'`).
///
/// Hashes rather than a per-response nonce: the scripts are constants, so the policy is too, and a hash
/// admits exactly that text where a nonce admits whatever carries it.
pub fn content_security_policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        let hash = |s: &str| {
            format!(
                "'sha256-{}'",
                BASE64_STANDARD.encode(Sha256::digest(s.as_bytes()))
            )
        };
        let scripts: Vec<String> = scripts::ALL.iter().map(|s| hash(s)).collect();
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self'; \
             base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
            scripts.join(" "),
            hash(CSS)
        )
    })
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
        "run_meta" => (
            "run started".into(),
            format!("agent {} · model {}", s("agent"), s("model")),
        ),
        "input" => (format!("input ({})", s("source")), s("text")),
        "context" => ("context".into(), s("text")),
        "assistant" => (format!("step {} · assistant", s("step")), s("text")),
        "tool_call" => (
            format!("step {} · tool call {}", s("step"), s("tool")),
            s("summary"),
        ),
        "tool_result" => {
            let ok = if e.get("ok").and_then(Value::as_bool).unwrap_or(false) {
                "ok"
            } else {
                "failed"
            };
            (
                format!("step {} · tool result {} {ok}", s("step"), s("tool")),
                s("summary"),
            )
        }
        "note" => (format!("note {}", s("kind")), s("summary")),
        "stop_requested" => {
            let actor = e.get("actor");
            let a = |k: &str| {
                actor
                    .and_then(|a| a.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            (
                format!("stop requested ({})", s("mode")),
                format!("by {}:{}", a("kind"), a("id")),
            )
        }
        "resumed" => (
            "resumed".into(),
            format!("from generation {}", s("fromGeneration")),
        ),
        "run_failed" => ("run failed".into(), s("message")),
        "answer" => ("answer".into(), s("text")),
        "approval_requested" => (
            format!("step {} · approval requested {}", s("step"), s("tool")),
            s("summary"),
        ),
        "approval_decided" => {
            let verdict = if s("decision") == "approve" {
                "approved"
            } else {
                "denied"
            };
            let mut by = format!("by {}", s("who"));
            if !s("note").is_empty() {
                by.push_str(&format!(": {}", s("note")));
            }
            (format!("step {} · {verdict} {}", s("step"), s("tool")), by)
        }
        _ => (kind, e.to_string()),
    }
}

/// Percent-encode a query value (everything but RFC 3986 unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `path?k=v&…` with the values encoded.
fn href(path: &str, pairs: &[(&str, String)]) -> String {
    if pairs.is_empty() {
        return path.to_owned();
    }
    let q: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    format!("{path}?{}", q.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every `<tag>…</tag>` in `page`.
    pub(super) fn inline(page: &str, tag: &str) -> Vec<String> {
        let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
        page.split(&open)
            .skip(1)
            .map(|rest| rest.split(&close).next().unwrap_or("").to_owned())
            .collect()
    }

    #[test]
    fn every_inline_script_and_style_of_every_page_is_allowed_by_its_hash_and_nothing_else_is() {
        let policy = content_security_policy();
        let hash = |s: &str| {
            format!(
                "'sha256-{}'",
                BASE64_STANDARD.encode(Sha256::digest(s.as_bytes()))
            )
        };
        let mut pages = index::sample_pages();
        pages.push(live::sample_page());
        pages.push(page("404 Not Found", html! { main { h1 { "404" } } }, None).into_string());
        pages.push(thread::sample_page());
        let mut scripts = 0;
        for p in &pages {
            for script in inline(p, "script") {
                assert!(
                    policy.contains(&hash(&script)),
                    "a page script is not in the policy: {policy}"
                );
                scripts += 1;
            }
            for style in inline(p, "style") {
                assert!(
                    policy.contains(&hash(&style)),
                    "a page style is not in the policy: {policy}"
                );
            }
            // Geometry never travels in style attributes (the policy would refuse them).
            assert!(!p.contains(" style=\""), "a style attribute: {p}");
        }
        assert_eq!(
            scripts,
            pages.len() - 3,
            "each live page carries its script; a history page, an error page and a thread page none"
        );
        // Nothing inline is allowed by keyword, nothing loads from another origin, no framing.
        for forbidden in [
            "unsafe-inline",
            "unsafe-eval",
            "*",
            "http:",
            "https:",
            "data:",
        ] {
            assert!(!policy.contains(forbidden), "{forbidden} in {policy}");
        }
        for directive in [
            "default-src 'none'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(
                policy.contains(directive),
                "{directive} missing from {policy}"
            );
        }
    }

    #[test]
    fn times_and_durations_render_readably() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(fmt_duration(850), "850 ms");
        assert_eq!(fmt_duration(12_345), "12.3 s");
        assert_eq!(fmt_duration(243_000), "4 m 03 s");
        assert_eq!(fmt_duration(7_500_000), "2 h 05 m");
        let now = 10_000_000_000;
        let ago = |s: i64| fmt_ago(now, now - s * 1000);
        assert_eq!(
            [ago(0), ago(42), ago(185), ago(7_300), ago(200_000)],
            ["just now", "42 s ago", "3 min ago", "2 h ago", "2 d ago"]
        );
        assert_eq!(
            fmt_ago(now, now + 5_000),
            "just now",
            "a clock ahead of ours is not the future"
        );
    }

    /// WCAG relative luminance of `#rrggbb` (or `#rgb`).
    fn luminance(hex: &str) -> f64 {
        let hex = if hex.len() == 4 {
            hex.chars().skip(1).fold("#".to_owned(), |mut h, c| {
                h.push(c);
                h.push(c);
                h
            })
        } else {
            hex.to_owned()
        };
        let c = |i: usize| {
            let v = f64::from(u8::from_str_radix(&hex[i..i + 2], 16).unwrap()) / 255.0;
            if v <= 0.04045 {
                v / 12.92
            } else {
                ((v + 0.055) / 1.055).powf(2.4)
            }
        };
        0.2126 * c(1) + 0.7152 * c(3) + 0.0722 * c(5)
    }

    /// WCAG contrast ratio of two `#rrggbb` colours (1 to 21).
    pub(super) fn contrast(a: &str, b: &str) -> f64 {
        let (la, lb) = (luminance(a), luminance(b));
        (la.max(lb) + 0.05) / (la.min(lb) + 0.05)
    }

    /// `--name:#hex` declarations of the first `:root{…}` in `css`.
    fn vars(css: &str) -> std::collections::HashMap<String, String> {
        let root = css
            .split(":root{")
            .nth(1)
            .unwrap()
            .split('}')
            .next()
            .unwrap();
        root.split(';')
            .filter_map(|d| d.split_once(':'))
            .filter(|(k, v)| k.starts_with("--") && v.starts_with('#'))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn contrast_is_computed_as_wcag_does() {
        assert!((contrast("#000000", "#ffffff") - 21.0).abs() < 1e-9);
        assert!((contrast("#777777", "#777777") - 1.0).abs() < 1e-9);
        assert!((contrast("#767676", "#ffffff") - 4.54).abs() < 0.01);
    }

    /// Dark mode follows `prefers-color-scheme`, and its text reads: body text, muted text, links and the
    /// status colours on the page and card backgrounds, and every chip (a rule with both a background and
    /// a text colour), at least 4.5:1 (WCAG AA) — light mode's chips too.
    #[test]
    fn dark_mode_text_has_at_least_aa_contrast() {
        let (light, dark) = CSS
            .split_once("@media (prefers-color-scheme:dark){")
            .expect("a dark block");
        let v = vars(dark);
        for fg in [
            "--ink", "--muted", "--blue", "--green", "--red", "--amber", "--violet", "--gray",
        ] {
            for bg in ["--bg", "--card", "--sunk"] {
                let r = contrast(&v[fg], &v[bg]);
                assert!(r >= 4.5, "dark {fg} on {bg}: {r:.2}");
            }
        }
        let light_vars = vars(light);
        for fg in ["--ink", "--muted", "--blue", "--red"] {
            let r = contrast(&light_vars[fg], &light_vars["--card"]);
            assert!(r >= 4.5, "light {fg} on --card: {r:.2}");
        }
        // Every chip: `…{background:#x;color:#y}` in either scheme.
        let mut chips = 0;
        for rule in CSS.split('}') {
            let Some((sel, body)) = rule.rsplit_once('{') else {
                continue;
            };
            let get = |k: &str| {
                body.split(';')
                    .filter_map(|d| d.split_once(':'))
                    .find(|(p, v)| *p == k && v.starts_with('#') && v.len() == 7)
                    .map(|(_, v)| v.to_owned())
            };
            if let (Some(bg), Some(fg)) = (get("background"), get("color")) {
                let r = contrast(&fg, &bg);
                assert!(r >= 4.5, "{sel}: {fg} on {bg}: {r:.2}");
                chips += 1;
            }
        }
        assert!(chips >= 20, "the chips were found: {chips}");
    }

    #[test]
    fn marks_say_what_they_mean_and_only_when_they_apply() {
        let mut v = live::tests::view(vec![]);
        assert_eq!(marks(&v).into_string(), "", "an unmarked run");
        v.resumed = Some(2);
        v.effects_unknown = Some(1);
        v.delivery_unknown = Some(true);
        let html = marks(&v).into_string();
        assert!(html.contains("class=\"mark mark-resumed\" title=\"Resumed 2 times after the process holding it ended\">↻ resumed<"), "{html}");
        assert!(html.contains("title=\"Effects unknown: 1 tool call in flight when a process ended; whether they took effect is not known\">⚠ effects unknown<"), "{html}");
        assert!(html.contains("class=\"mark mark-delivery\""), "{html}");
        // The index's script words them the same.
        for words in ["Resumed ", " after the process holding it ended", "Effects unknown: ", " in flight when a process ended; whether they took effect is not known", "Delivery unknown: the process holding the run ended after its finishing gate, so whether its reply reached the channel is not known"] {
            assert!(html.contains(words) && scripts::INDEX_JS.contains(words), "{words}");
        }
        assert_eq!(thread_href("c1:t/x y"), "/threads/c1%3At%2Fx%20y");
    }

    #[test]
    fn links_encode_their_values() {
        assert_eq!(href("/runs", &[]), "/runs");
        assert_eq!(
            href(
                "/runs",
                &[("agent", "a b&c".into()), ("status", "failed".into())]
            ),
            "/runs?agent=a%20b%26c&status=failed"
        );
    }
}
