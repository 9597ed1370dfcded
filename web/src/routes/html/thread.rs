//! A thread's page, `GET /threads/{key}` (`key` is the thread key `<channel>:<thread>`, percent-encoded):
//! the thread's runs in the order they started (oldest first), live ones marked, each linking to its
//! live view. The index's rows and the live view's header link here.
//!
//! It reads `list_runs` with the thread filter (`threadKey`), status `all`, one page of at most
//! [`storage::store::LIST_MAX_LIMIT`] runs: a longer thread shows its newest page, in order, with an
//! "Earlier runs" link that pages the store by its cursor (`?before=&beforeId=`, as the index does; a
//! cursor page has no live runs). Who may read: `runs:read`, and the caller's visibility narrows the runs
//! (a thread with nothing visible is an empty page, not a 404: a thread is not a resource of its own).

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::runs_service::{RunList, RunView};
use maud::{html, Markup};

use super::super::api::{list_params, query_map, reader};
use super::{ago, error_page, fmt_duration, href, marks, page, respond, status_chip, thread_href};
use crate::error::ApiError;
use crate::AppState;

/// `GET /threads/{key}`.
pub(super) async fn thread_page(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> HttpResponse {
    let key = path.into_inner();
    match render_thread(&req, &key, &state).await {
        Ok(body) => respond(StatusCode::OK, body),
        Err(e) => error_page(e),
    }
}

async fn render_thread(req: &HttpRequest, key: &str, state: &AppState) -> Result<Markup, ApiError> {
    let q = query_map(req)?;
    let visible_to = reader(req, state, None, &q)?;
    // The thread filter and the cursor, read (and refused) as `/api/runs` reads them.
    let mut ask: HashMap<String, String> = HashMap::from([
        ("status".to_owned(), "all".to_owned()),
        ("threadKey".to_owned(), key.to_owned()),
        (
            "limit".to_owned(),
            storage::store::LIST_MAX_LIMIT.to_string(),
        ),
    ]);
    for k in ["before", "beforeId"] {
        if let Some(v) = q.get(k).filter(|v| !v.is_empty()) {
            ask.insert(k.to_owned(), v.clone());
        }
    }
    let params = list_params(&ask, visible_to)?;
    let cursor_page = params.before.is_some();
    let list = state.runs.list_runs(&params).await;
    Ok(thread_html(
        key,
        &list,
        cursor_page,
        state.runs.clock.now_ms(),
    ))
}

/// The runs of `list` oldest first (`list_runs` answers newest first, live ones first).
pub fn in_order(list: &RunList) -> Vec<&RunView> {
    let mut runs: Vec<&RunView> = list.runs.iter().collect();
    runs.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
    runs
}

/// One run of the thread: its place, status, label (linking its live view), marks, what it said (the
/// answer or the error), and when.
fn item(n: usize, v: &RunView, now: i64) -> Markup {
    let title = v.label.as_deref().unwrap_or(&v.id);
    let class = if v.finished { "run" } else { "run is-live" };
    html! {
        li class=(class) id=(format!("run-{}", v.id)) data-id=(v.id) {
            span class="ord" { "#" (n) }
            div class="what" {
                (status_chip(v, None)) " "
                a href=(format!("/runs/{}", v.id)) { (title) }
                (marks(v))
                @if let Some(e) = &v.error {
                    div class="said err" title=(e) { (e) }
                } @else if let Some(a) = &v.answer {
                    div class="said" title=(a) { (a) }
                }
                div class="sub muted" { code { (v.id) } " · " (v.agent.as_deref().unwrap_or("—")) " · " (v.event_count) " events" }
            }
            div class="when" {
                div { (ago(now, v.started_at)) }
                div { (fmt_duration(v.duration_ms(now))) @if !v.finished { " so far" } }
            }
        }
    }
}

pub(super) fn thread_html(key: &str, list: &RunList, cursor_page: bool, now: i64) -> Markup {
    let runs = in_order(list);
    let live = runs.iter().filter(|v| !v.finished).count();
    let channel = key.split_once(':').map(|(c, _)| c).unwrap_or(key);
    let earlier = list.next_before.as_ref().map(|nb| {
        let mut pairs = vec![("before", nb.finished_at.to_string())];
        pairs.extend(nb.id.clone().map(|id| ("beforeId", id)));
        href(&thread_href(key), &pairs)
    });
    let body = html! {
        main id="thread" data-key=(key) {
            nav class="crumbs" { a href="/runs" { "← Runs" } }
            section class="card" {
                div class="head-row" {
                    h1 { "Thread " code { (key) } }
                }
                p class="meta-line" {
                    span { "channel " b { (channel) } }
                    span { b id="thread-count" { (runs.len()) } @if runs.len() == 1 { " run" } @else { " runs" } }
                    @if live > 0 { span { b { (live) } " live" } }
                    span { a href=(href("/runs", &[("threadKey", key.to_owned()), ("all", "1".to_owned())])) { "as a table" } }
                }
            }
            @if list.store_unavailable {
                p class="banner" { "The history store is unavailable: showing live runs only." }
            }
            @if list.ledger_unavailable {
                p class="banner" { "The live-run ledger is unavailable: runs of other processes may be missing." }
            }
            section class="card table-card" {
                @if let Some(e) = &earlier {
                    p class="pager" { a id="earlier" href=(e) { "↑ Earlier runs" } }
                }
                @if runs.is_empty() {
                    p id="empty" class="muted" { "No runs in this thread." }
                } @else {
                    ol class="thread-runs" id="thread-runs" {
                        @for (i, v) in runs.iter().enumerate() { (item(i + 1, v, now)) }
                    }
                }
                @if cursor_page {
                    p class="pager" { a href=(thread_href(key)) { "Newest runs ↓" } }
                }
            }
        }
    };
    page(&format!("Thread {key}"), body, None)
}

/// A thread page the CSP test checks.
#[cfg(test)]
pub(super) fn sample_page() -> String {
    thread_html("c1:t", &RunList::default(), false, 0).into_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use storage::record::RunStatus;

    fn view(id: &str, started_at: i64, finished: bool) -> RunView {
        let mut v = super::super::live::tests::view(vec![]);
        v.id = id.into();
        v.label = Some(format!("<i>{id}</i>"));
        v.started_at = started_at;
        v.finished = finished;
        v.finished_at = finished.then_some(started_at + 100);
        v.status = finished.then_some(RunStatus::Completed);
        v.answer = finished.then(|| format!("answer of {id}"));
        v.events = None;
        v
    }

    #[test]
    fn a_thread_lists_its_runs_oldest_first_with_the_live_one_marked_and_linked() {
        // As `list_runs` answers: the live run first, then newest finished first.
        let list = RunList {
            runs: vec![
                view("r3", 3_000, false),
                view("r2", 2_000, true),
                view("r1", 1_000, true),
            ],
            ..RunList::default()
        };
        let html = thread_html("c1:t/x", &list, false, 10_000).into_string();
        let at = |id: &str| html.find(&format!("id=\"run-{id}\"")).unwrap();
        assert!(at("r1") < at("r2") && at("r2") < at("r3"), "{html}");
        assert!(
            html.contains("<li class=\"run is-live\" id=\"run-r3\""),
            "{html}"
        );
        assert!(html.contains("<li class=\"run\" id=\"run-r1\""), "{html}");
        assert!(html.contains("<span class=\"ord\">#1</span>"));
        assert!(
            html.contains("href=\"/runs/r2\">&lt;i&gt;r2&lt;/i&gt;</a>"),
            "{html}"
        );
        assert!(html.contains("answer of r1"));
        assert!(html.contains("<b id=\"thread-count\">3</b>"));
        assert!(
            html.contains("href=\"/runs?threadKey=c1%3At%2Fx&amp;all=1\""),
            "{html}"
        );
        assert!(!html.contains("<script>"), "a snapshot");
        let empty = thread_html("c1:none", &RunList::default(), false, 0).into_string();
        assert!(empty.contains("No runs in this thread."));
    }

    #[test]
    fn a_long_thread_links_its_earlier_runs_by_the_store_cursor() {
        let list = RunList {
            runs: vec![view("r2", 2_000, true)],
            next_before: Some(actors::runs_service::NextBefore {
                finished_at: 2_100,
                id: Some("r2".into()),
            }),
            ..RunList::default()
        };
        let html = thread_html("c1:t", &list, false, 10_000).into_string();
        assert!(
            html.contains("id=\"earlier\" href=\"/threads/c1%3At?before=2100&amp;beforeId=r2\""),
            "{html}"
        );
    }

    /// The route takes the key percent-encoded as [`thread_href`] writes it — a `/` or a `:` in a thread
    /// name included — and hands the handler the key decoded.
    #[actix_rt::test]
    async fn the_route_decodes_the_key_its_links_encode() {
        use actix_web::{test, web, App};
        let app = test::init_service(App::new().route(
            "/threads/{key:.+}",
            web::get().to(|key: web::Path<String>| async move { key.into_inner() }),
        ))
        .await;
        for key in ["c1:alpha", "slack:T1/C2:1700000000.000100", "c 1:ä ?#&"] {
            let req = test::TestRequest::get().uri(&thread_href(key)).to_request();
            let body = test::call_and_read_body(&app, req).await;
            assert_eq!(std::str::from_utf8(&body).unwrap(), key);
        }
    }
}
