//! The index, `GET /runs` (SPEC §8.1): the filters of `list_runs` as a form (status — `active`,
//! `finished`, `all` or a terminal status —, agent, channel), a server-rendered SVG chart of the last
//! hour's runs per minute by status, and the runs as a table that collapses to cards on a narrow screen.
//!
//! `/runs` alone lists live runs and follows `/runs/feed` (SPEC §8.1's default, kept); `?all=1` (or
//! `?status=all`) adds history with an "Older runs" cursor link; `?status=…&agent=…&channel=…` filter as
//! `/api/runs` does, with the same 400 naming a bad parameter. An empty form field means "any".
//!
//! `?q=` searches: runs whose id starts with the text or whose label contains it (ASCII case folded; see
//! [`storage::store::Search`]). A search without a status covers every run, live and finished (a search
//! among live runs alone would hide what people look for), and its page is a snapshot (no feed).
//!
//! Each row marks a run that was resumed, one with tool calls of unknown effects and one whose delivery
//! is unknown ([`super::marks`]), and links its thread's page.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::runs_service::{ListParams, RunList, RunView, StatusFilter};
use maud::{html, Markup};
use storage::store::Search;

use super::super::api::{list_params, query_map, reader};
use super::{
    ago, error_page, fmt_duration, fmt_time, href, marks, page, respond, scripts, status_chip,
    thread_href,
};
use crate::error::ApiError;
use crate::AppState;

/// The chart's window: the last hour, one bar a minute.
const CHART_MINUTES: i64 = 60;
const MINUTE_MS: i64 = 60_000;

/// `GET /runs`.
pub(super) async fn index(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    match render_index(&req, &state).await {
        Ok(body) => respond(StatusCode::OK, body),
        Err(e) => error_page(e),
    }
}

/// What the page was asked for, to render the form and the links.
pub(super) struct Ask {
    params: ListParams,
    /// `?all=1` without a `status` (kept in the links so the history view stays one).
    all: bool,
    /// `?q=`: the text search.
    search: Option<Search>,
    /// `q` as typed (the form shows it back).
    q: Option<String>,
}

impl Ask {
    /// The filter part of a link (status or `all=1`, agent, channel, threadKey, parentRunId, sinceMs,
    /// limit).
    fn pairs(&self, keep_status: bool) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        if keep_status {
            if self.all {
                pairs.push(("all", "1".to_owned()));
            } else if self.params.status != StatusFilter::Active {
                pairs.push(("status", self.params.status.as_str().to_owned()));
            }
        }
        if let Some(a) = &self.params.agent {
            pairs.push(("agent", a.clone()));
        }
        if let Some(c) = &self.params.channel {
            pairs.push(("channel", c.clone()));
        }
        if let Some(t) = &self.params.thread_key {
            pairs.push(("threadKey", t.clone()));
        }
        if let Some(p) = &self.params.parent_run_id {
            pairs.push(("parentRunId", p.to_string()));
        }
        if let Some(s) = self.params.since_ms {
            pairs.push(("sinceMs", s.to_string()));
        }
        if let Some(l) = self.params.limit {
            pairs.push(("limit", l.to_string()));
        }
        if let Some(q) = &self.q {
            pairs.push(("q", q.clone()));
        }
        pairs
    }
}

async fn render_index(req: &HttpRequest, state: &AppState) -> Result<Markup, ApiError> {
    let mut q = query_map(req)?;
    q.retain(|_, v| !v.is_empty());
    let visible_to = reader(req, state, None, &q)?;
    // The index's own parameters; the rest are `list_runs`'s, read as `/api/runs` reads them.
    let typed = q.remove("q").filter(|t| !t.trim().is_empty());
    let search = typed.as_deref().and_then(Search::new);
    let all = (q.remove("all").is_some_and(|v| v == "1" || v == "true") || search.is_some())
        && !q.contains_key("status");
    let mut params = list_params(&q, visible_to.clone())?;
    if !q.contains_key("status") {
        params.status = if all {
            StatusFilter::All
        } else {
            StatusFilter::Active
        };
    }
    let list = state
        .runs
        .list_runs_matching(&params, search.as_ref())
        .await;
    let now = state.runs.clock.now_ms();
    // The chart: every run of the last hour under the same agent and channel, whatever the status.
    let mut hour = ListParams::new(StatusFilter::All, visible_to);
    hour.agent = params.agent.clone();
    hour.channel = params.channel.clone();
    hour.since_ms = Some(now - CHART_MINUTES * MINUTE_MS);
    hour.limit = Some(storage::store::LIST_MAX_LIMIT);
    let recent = state.runs.list_runs(&hour).await;
    let ask = Ask {
        params,
        all,
        search,
        q: typed,
    };
    Ok(index_html(&list, &recent, &ask, now))
}

/// One run as a table row (a card on a narrow screen); `data-label` names each cell there.
fn row(v: &RunView, now: i64) -> Markup {
    let title = v.label.as_deref().unwrap_or(&v.id);
    html! {
        tr id=(format!("run-{}", v.id)) data-id=(v.id) {
            td data-label="Status" { (status_chip(v, None)) }
            td class="run" data-label="Run" {
                div {
                    a href=(format!("/runs/{}", v.id)) { (title) }
                    (marks(v))
                    div class="sub" { (v.id) }
                    @if let Some(e) = &v.error {
                        div class="err" title=(e) { (e) }
                    }
                }
            }
            td data-label="Agent" { (v.agent.as_deref().unwrap_or("—")) }
            td data-label="Channel" { (v.channel_id) }
            td class="col-thread" data-label="Thread" { a class="sub" href=(thread_href(&v.thread_key)) title="This thread's runs" { (v.thread_key) } }
            td data-label="Started" { (ago(now, v.started_at)) }
            td class="num" data-label="Duration" { (fmt_duration(v.duration_ms(now))) }
            td data-label="Finished" {
                @match v.finished_at { Some(f) => (ago(now, f)), None => span class="muted" { "—" } }
            }
            td class="num" data-label="Events" { (v.event_count) }
        }
    }
}

/// The chart's series, in stacking order (bottom first), with their legend words.
const SERIES: [(&str, &str); 5] = [
    ("completed", "completed"),
    ("failed", "failed"),
    ("stopped", "stopped"),
    ("interrupted", "interrupted"),
    ("live", "live"),
];

/// Which series a run counts in.
fn series(v: &RunView) -> usize {
    use storage::record::RunStatus::*;
    if !v.finished {
        return 4;
    }
    match v.status {
        Some(Completed) => 0,
        Some(Failed) => 1,
        Some(StoppedSoft | StoppedHard) => 2,
        Some(Interrupted) | None => 3,
    }
}

/// Runs per minute by status over the last hour (bucketed by `finishedAt ?? startedAt`, as `sinceMs`
/// compares), as stacked SVG bars in a 600 × 100 box scaled to the card's width.
fn chart(recent: &RunList, now: i64) -> Markup {
    let mut buckets = vec![[0u32; SERIES.len()]; CHART_MINUTES as usize];
    let mut totals = [0u32; SERIES.len()];
    for v in &recent.runs {
        let t = v.finished_at.unwrap_or(v.started_at);
        let age = (now - t).max(0) / MINUTE_MS;
        if age < CHART_MINUTES {
            let s = series(v);
            buckets[(CHART_MINUTES - 1 - age) as usize][s] += 1;
            totals[s] += 1;
        }
    }
    let peak = buckets
        .iter()
        .map(|b| b.iter().sum::<u32>())
        .max()
        .unwrap_or(0)
        .max(1);
    let total: u32 = totals.iter().sum();
    let full = recent.runs.len() >= storage::store::LIST_MAX_LIMIT;
    html! {
        section class="card chart-card" id="chart" data-total=(total) {
            div class="chart-head" {
                h2 { "Runs per minute · last hour" }
                span class="muted" {
                    (total) @if full { "+" } " runs · peak " (peak) "/min"
                }
            }
            svg class="chart" viewBox="0 0 600 100" preserveAspectRatio="none" role="img" aria-label="runs per minute by status, last hour" {
                line x1="0" y1="99.5" x2="600" y2="99.5" stroke="#e3e7ee" {}
                @for (i, b) in buckets.iter().enumerate() {
                    g {
                        title { (bucket_label(now, i)) " UTC — " (words(b)) }
                        @for (class, y, h) in stack(b, peak) {
                            rect class=(class) x=(i * 10 + 1) y=(format!("{y:.2}")) width="8" height=(format!("{h:.2}")) {}
                        }
                    }
                }
            }
            div class="chart-axis" { span { "−60 min" } span { "−30 min" } span { "now" } }
            div class="legend" {
                @for (s, (class, word)) in SERIES.iter().enumerate() {
                    span { span class=(format!("sw sw-{class}")) {} (word) " " (totals[s]) }
                }
            }
        }
    }
}

/// `HH:MM` of the `i`-th bar's minute.
fn bucket_label(now: i64, i: usize) -> String {
    fmt_time(now - (CHART_MINUTES - 1 - i as i64) * MINUTE_MS)[11..16].to_owned()
}

/// A bucket's stacked rects, bottom first: (class, top, height) in the 100-high box.
fn stack(b: &[u32; SERIES.len()], peak: u32) -> Vec<(String, f64, f64)> {
    let mut y = 100.0;
    let mut out = Vec::new();
    for (s, n) in b.iter().enumerate().filter(|(_, n)| **n > 0) {
        let h = f64::from(*n) / f64::from(peak) * 94.0;
        y -= h;
        out.push((format!("c-{}", SERIES[s].0), y, h));
    }
    out
}

/// `2 completed, 1 failed` for a bucket (or `no runs`).
fn words(b: &[u32; SERIES.len()]) -> String {
    let parts: Vec<String> = b
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{n} {}", SERIES[s].1))
        .collect();
    if parts.is_empty() {
        "no runs".into()
    } else {
        parts.join(", ")
    }
}

fn filters(ask: &Ask) -> Markup {
    let current = if ask.all {
        "all"
    } else {
        ask.params.status.as_str()
    };
    html! {
        form class="card filters" method="get" action="/runs" id="filters" {
            label {
                "Status"
                select name="status" {
                    @for choice in StatusFilter::CHOICES {
                        option value=(choice) selected[choice == current] { (choice.replace('_', " ")) }
                    }
                }
            }
            label { "Agent" input type="text" name="agent" value=[ask.params.agent.as_deref()] placeholder="any"; }
            label { "Channel" input type="text" name="channel" value=[ask.params.channel.as_deref()] placeholder="any"; }
            @if let Some(q) = &ask.q { input type="hidden" name="q" value=(q); }
            @if let Some(t) = &ask.params.thread_key { input type="hidden" name="threadKey" value=(t); }
            @if let Some(p) = &ask.params.parent_run_id { input type="hidden" name="parentRunId" value=(p); }
            @if let Some(s) = ask.params.since_ms { input type="hidden" name="sinceMs" value=(s); }
            @if let Some(l) = ask.params.limit { input type="hidden" name="limit" value=(l); }
            button class="btn-primary" type="submit" { "Filter" }
            a class="btn" href="/runs" { "Reset" }
        }
    }
}

/// The search bar: its own form, so a search from the default (live) page covers every run; a status
/// chosen before (other than the default) and the other filters ride along hidden.
fn search_form(ask: &Ask) -> Markup {
    let status =
        (!ask.all && ask.params.status != StatusFilter::Active).then(|| ask.params.status.as_str());
    html! {
        form class="card filters" method="get" action="/runs" id="search" role="search" {
            label { "Search runs" input type="search" name="q" value=[ask.q.as_deref()] placeholder="run id prefix or label" maxlength="256"; }
            @if let Some(s) = status { input type="hidden" name="status" value=(s); }
            @if let Some(a) = &ask.params.agent { input type="hidden" name="agent" value=(a); }
            @if let Some(c) = &ask.params.channel { input type="hidden" name="channel" value=(c); }
            @if let Some(t) = &ask.params.thread_key { input type="hidden" name="threadKey" value=(t); }
            @if let Some(p) = &ask.params.parent_run_id { input type="hidden" name="parentRunId" value=(p); }
            @if let Some(s) = ask.params.since_ms { input type="hidden" name="sinceMs" value=(s); }
            @if let Some(l) = ask.params.limit { input type="hidden" name="limit" value=(l); }
            button class="btn-primary" type="submit" { "Search" }
        }
    }
}

fn index_html(list: &RunList, recent: &RunList, ask: &Ask, now: i64) -> Markup {
    let status = ask.params.status;
    let cursor_page = ask.params.before.is_some();
    let follows_feed = status == StatusFilter::Active && !cursor_page && ask.search.is_none();
    let empty = match (status, &ask.q) {
        (_, Some(q)) if ask.search.is_some() => format!("No runs match “{q}”."),
        (StatusFilter::Active, _) => "No live runs.".to_owned(),
        (StatusFilter::AwaitingApproval, _) => "No runs await approval.".to_owned(),
        (StatusFilter::Finished | StatusFilter::All, _) => "No runs.".to_owned(),
        (StatusFilter::Terminal(s), _) => format!("No {} runs.", s.as_str().replace('_', " ")),
    };
    // The next store page keeps the filters: `/runs?<status>&before=&beforeId=&<agent, channel, limit>`.
    let older = list
        .next_before
        .as_ref()
        .filter(|_| status != StatusFilter::Active)
        .map(|nb| {
            let mut pairs: Vec<(&str, String)> = ask.pairs(true);
            let at = pairs
                .iter()
                .position(|(k, _)| *k != "all" && *k != "status")
                .unwrap_or(pairs.len());
            let mut cursor = vec![("before", nb.finished_at.to_string())];
            cursor.extend(nb.id.clone().map(|id| ("beforeId", id)));
            pairs.splice(at..at, cursor);
            href("/runs", &pairs)
        });
    let body = html! {
        main id="index" data-all=(if ask.all { "1" } else { "0" }) data-status=(status.as_str())
            data-agent=[ask.params.agent.as_deref()] data-channel=[ask.params.channel.as_deref()] data-now=(now) {
            h1 { "Runs" }
            (search_form(ask))
            (filters(ask))
            @if list.store_unavailable {
                p class="banner" { "The history store is unavailable: showing live runs only." }
            }
            @if list.ledger_unavailable {
                p class="banner" { "The live-run ledger is unavailable: runs of other processes may be missing." }
            }
            (chart(recent, now))
            section class="card table-card" {
                table class="runs" {
                    thead { tr {
                        th { "Status" } th { "Run" } th { "Agent" } th { "Channel" } th class="col-thread" { "Thread" }
                        th { "Started" } th { "Duration" } th { "Finished" } th { "Events" }
                    } }
                    tbody id="rows" {
                        @for v in &list.runs { (row(v, now)) }
                    }
                }
                @if list.runs.is_empty() {
                    p id="empty" class="muted" { (empty) }
                }
            }
            div class="pager" {
                @if cursor_page {
                    a href=(href("/runs", &ask.pairs(true))) { "← Newest runs" }
                }
                @if let Some(older) = &older {
                    a id="older" href=(older) { "Older runs →" }
                }
            }
        }
    };
    page("Runs", body, follows_feed.then_some(scripts::INDEX_JS))
}

/// Pages the CSP test checks: the live index (with its script) and a history page.
#[cfg(test)]
pub(super) fn sample_pages() -> Vec<String> {
    let list = RunList::default();
    let ask = |status, all| Ask {
        params: ListParams::new(status, storage::record::VisibilityFilter::All),
        all,
        search: None,
        q: None,
    };
    vec![
        index_html(&list, &list, &ask(StatusFilter::Active, false), 0).into_string(),
        index_html(&list, &list, &ask(StatusFilter::All, true), 0).into_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::record::{ChannelVisibility, RunStatus, VisibilityFilter};

    fn view(
        id: &str,
        status: Option<RunStatus>,
        started_at: i64,
        finished_at: Option<i64>,
    ) -> RunView {
        RunView {
            id: id.into(),
            label: Some(format!("<b>{id}</b>")),
            agent: Some("demo".into()),
            model: None,
            channel_id: "c1".into(),
            user_id: "u1".into(),
            thread_key: "c1:t".into(),
            channel_visibility: ChannelVisibility::Machine,
            started_at,
            finished: finished_at.is_some(),
            finished_at,
            status,
            event_count: 3,
            stored_event_count: None,
            truncated: None,
            stop: None,
            persisted: None,
            provisional: None,
            owner_gen: None,
            parent_run_id: None,
            answer: None,
            error: (status == Some(RunStatus::Failed))
                .then(|| "scripted failure at model call 2".into()),
            stopped_by: None,
            usage: None,
            resumed: None,
            effects_unknown: None,
            delivery_unknown: None,
            awaiting_approval: None,
            events: None,
        }
    }

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn the_chart_stacks_the_last_hours_runs_per_minute_by_status() {
        let list = RunList {
            runs: vec![
                view(
                    "a",
                    Some(RunStatus::Completed),
                    NOW - 100_000,
                    Some(NOW - 30_000),
                ),
                view(
                    "b",
                    Some(RunStatus::Failed),
                    NOW - 100_000,
                    Some(NOW - 40_000),
                ),
                view("c", None, NOW - 5_000, None),
                view(
                    "old",
                    Some(RunStatus::Completed),
                    NOW - 9_000_000,
                    Some(NOW - 8_000_000),
                ),
            ],
            ..RunList::default()
        };
        let html = chart(&list, NOW).into_string();
        assert!(
            html.contains("data-total=\"3\""),
            "the run older than an hour is not charted: {html}"
        );
        // The newest minute holds all three, stacked: one rect per series present.
        assert_eq!(html.matches("class=\"c-completed\"").count(), 1);
        assert_eq!(html.matches("class=\"c-failed\"").count(), 1);
        assert_eq!(html.matches("class=\"c-live\"").count(), 1);
        assert!(html.contains("1 completed, 1 failed, 1 live"), "{html}");
        assert!(html.contains("peak 3/min"));
    }

    #[test]
    fn rows_escape_run_strings_show_a_failed_runs_error_and_relative_times() {
        let list = RunList {
            runs: vec![view(
                "r1",
                Some(RunStatus::Failed),
                NOW - 200_000,
                Some(NOW - 180_000),
            )],
            ..RunList::default()
        };
        let ask = Ask {
            params: ListParams::new(
                StatusFilter::Terminal(RunStatus::Failed),
                VisibilityFilter::All,
            ),
            all: false,
            search: None,
            q: None,
        };
        let html = index_html(&list, &RunList::default(), &ask, NOW).into_string();
        assert!(
            html.contains("&lt;b&gt;r1&lt;/b&gt;") && !html.contains("<b>r1"),
            "{html}"
        );
        assert!(
            html.contains("class=\"err\" title=\"scripted failure at model call 2\""),
            "{html}"
        );
        assert!(
            html.contains(">3 min ago</time>") && html.contains(">3 min ago</time>"),
            "{html}"
        );
        assert!(
            html.contains("<option value=\"failed\" selected>failed</option>"),
            "{html}"
        );
        // A filtered page is a snapshot: no feed script.
        assert!(!html.contains("<script>"));
    }

    #[test]
    fn the_older_runs_link_keeps_the_filters_and_the_cursor() {
        let list = RunList {
            runs: vec![view(
                "r1",
                Some(RunStatus::Failed),
                NOW - 200_000,
                Some(NOW - 180_000),
            )],
            next_before: Some(actors::runs_service::NextBefore {
                finished_at: NOW - 180_000,
                id: Some("r1".into()),
            }),
            ..RunList::default()
        };
        let mut params = ListParams::new(
            StatusFilter::Terminal(RunStatus::Failed),
            VisibilityFilter::All,
        );
        params.agent = Some("de mo".into());
        params.thread_key = Some("c1:t".into());
        params.limit = Some(1);
        let ask = Ask {
            params,
            all: false,
            search: None,
            q: None,
        };
        let html = index_html(&list, &RunList::default(), &ask, NOW).into_string();
        let want = format!("id=\"older\" href=\"/runs?status=failed&amp;before={}&amp;beforeId=r1&amp;agent=de%20mo&amp;threadKey=c1%3At&amp;limit=1\"", NOW - 180_000);
        assert!(
            html.contains("<input type=\"hidden\" name=\"threadKey\" value=\"c1:t\">"),
            "the form keeps the filter it does not show"
        );
        assert!(html.contains(&want), "{html}");
        let all = Ask {
            params: ListParams::new(StatusFilter::All, VisibilityFilter::All),
            all: true,
            search: None,
            q: None,
        };
        let html = index_html(&list, &RunList::default(), &all, NOW).into_string();
        assert!(
            html.contains(&format!(
                "href=\"/runs?all=1&amp;before={}&amp;beforeId=r1\"",
                NOW - 180_000
            )),
            "{html}"
        );
    }

    #[test]
    fn rows_mark_resumed_and_unknown_runs_link_their_thread_and_count_events() {
        let mut marked = view(
            "r1",
            Some(RunStatus::Completed),
            NOW - 200_000,
            Some(NOW - 1_000),
        );
        marked.resumed = Some(1);
        marked.effects_unknown = Some(2);
        marked.delivery_unknown = Some(true);
        marked.event_count = 17;
        let plain = view(
            "r2",
            Some(RunStatus::Completed),
            NOW - 200_000,
            Some(NOW - 2_000),
        );
        let list = RunList {
            runs: vec![marked, plain],
            ..RunList::default()
        };
        let ask = Ask {
            params: ListParams::new(StatusFilter::All, VisibilityFilter::All),
            all: true,
            search: None,
            q: None,
        };
        let html = index_html(&list, &RunList::default(), &ask, NOW).into_string();
        let row = |id: &str| {
            let from = html.find(&format!("id=\"run-{id}\"")).unwrap();
            html[from..].split("</tr>").next().unwrap().to_owned()
        };
        let r1 = row("r1");
        assert!(
            r1.contains("mark-resumed")
                && r1.contains("mark-unknown")
                && r1.contains("mark-delivery"),
            "{r1}"
        );
        assert!(r1.contains("title=\"Resumed once after the process holding it ended\""));
        assert!(
            r1.contains("<td class=\"num\" data-label=\"Events\">17</td>"),
            "{r1}"
        );
        assert!(!row("r2").contains("class=\"marks\""));
        assert!(
            r1.contains("<a class=\"sub\" href=\"/threads/c1%3At\" title=\"This thread&#39;s runs\">c1:t</a>")
                || r1.contains("<a class=\"sub\" href=\"/threads/c1%3At\" title=\"This thread's runs\">c1:t</a>"),
            "{r1}"
        );
    }

    #[test]
    fn a_search_shows_its_text_back_keeps_it_in_the_older_link_and_follows_no_feed() {
        let list = RunList {
            runs: vec![view(
                "r1",
                Some(RunStatus::Completed),
                NOW - 2_000,
                Some(NOW - 1_000),
            )],
            next_before: Some(actors::runs_service::NextBefore {
                finished_at: NOW - 1_000,
                id: Some("r1".into()),
            }),
            ..RunList::default()
        };
        let ask = Ask {
            params: ListParams::new(StatusFilter::All, VisibilityFilter::All),
            all: true,
            search: Search::new("Deploy <x>"),
            q: Some("Deploy <x>".into()),
        };
        let html = index_html(&list, &RunList::default(), &ask, NOW).into_string();
        assert!(
            html.contains("<input type=\"search\" name=\"q\" value=\"Deploy &lt;x&gt;\""),
            "{html}"
        );
        assert!(
            html.contains(&format!(
                "id=\"older\" href=\"/runs?all=1&amp;before={}&amp;beforeId=r1&amp;q=Deploy%20%3Cx%3E\"",
                NOW - 1_000
            )),
            "{html}"
        );
        assert!(!html.contains("<script>"), "a search is a snapshot");
        let none = index_html(&RunList::default(), &RunList::default(), &ask, NOW).into_string();
        assert!(none.contains("No runs match “Deploy &lt;x&gt;”."), "{none}");
    }
}
