//! `runs …` against a running server's JSON API (`--url`): plain requests with a timeout, and a run's
//! `/api/runs/{id}/stream` followed across dropped connections (`runs events --follow`, `runs stop
//! --wait`).
//!
//! Owns the HTTP client ([`Api`]). Every non-success answer becomes a [`CliError`] carrying its exit and
//! the server's status and `error` code; a stream reopened after a drop resumes with `Last-Event-ID`, so
//! nothing is printed twice and nothing is skipped.

use std::time::Duration;
use storage::RunId;

use actors::runs_service::{EventPage, NextBefore, RunList};
use anyhow::Context;
use futures_util::StreamExt;
use serde_json::{json, Value};
use storage::store::{LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT};
use storage::Clock;
use web::routes::html::fmt_time;

use super::print::{event_lines, events_out, list_table, pretty, run_text, with_outcome};
use super::{
    decode, fail, write_out, CliError, EventsArgs, Exit, ListArgs, RunsArgs, RunsCommand, StopArgs,
    RECONNECT_FOR, STREAM_IDLE,
};

/// Time to connect to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for one plain (non-stream) request, answer included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) struct Api {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

/// Percent-encode a query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", enc(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// The error for a non-success answer: `{METHOD} {path}: {status} {code}: {message}`, with its exit.
async fn answer_error(method: &reqwest::Method, path: &str, res: reqwest::Response) -> CliError {
    let status = res.status();
    let text = res.text().await.unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    let code = v.get("error").and_then(Value::as_str).unwrap_or("error");
    let message = match (v.get("message").and_then(Value::as_str), &v) {
        (Some(m), _) => m.to_owned(),
        (None, Value::String(text)) if !text.trim().is_empty() => text.trim().to_owned(),
        _ => status.canonical_reason().unwrap_or("").to_owned(),
    };
    CliError {
        exit: Exit::from_http(status.as_u16()),
        answer: Some((status.as_u16(), code.to_owned())),
        message: format!("{method} {path}: {} {code}: {message}", status.as_u16()),
    }
}

impl Api {
    pub(super) fn new(base: &str, token: Option<String>) -> anyhow::Result<Api> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .context("build the HTTP client")?;
        Ok(Api {
            base: base.to_owned(),
            token,
            client,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self.request(method.clone(), path).timeout(REQUEST_TIMEOUT);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req
            .send()
            .await
            .with_context(|| format!("reach {}{path}", self.base))?;
        if !res.status().is_success() {
            return Err(answer_error(&method, path, res).await.into());
        }
        let text = res
            .text()
            .await
            .with_context(|| format!("read the answer of {method} {path}"))?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// Follow `/api/runs/{id}/stream` from `after` to `event: end` (answering its data), calling
    /// `on_event` once per `run_event` in seq order. A stream that drops once open is reopened with
    /// `Last-Event-ID` for up to [`RECONNECT_FOR`] without progress; a first connection that fails, and
    /// a 404, 401 or 403 at any time, end the follow at once.
    async fn follow(
        &self,
        id: &str,
        after: u64,
        on_event: &mut dyn FnMut(&Value) -> anyhow::Result<()>,
    ) -> anyhow::Result<Value> {
        let mut last = after;
        let mut connected = false;
        let mut backoff = Duration::from_millis(200);
        let mut down_since: Option<tokio::time::Instant> = None;
        loop {
            match self
                .stream_once(id, &mut last, &mut connected, on_event)
                .await
            {
                Ok(end) => return Ok(end),
                Err(Dropped::Fatal(e)) => return Err(e),
                Err(Dropped::Retry { why, .. }) if !connected => return Err(why),
                Err(Dropped::Retry { progressed, why }) => {
                    if progressed {
                        backoff = Duration::from_millis(200);
                        down_since = None;
                    }
                    let since = *down_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() >= RECONNECT_FOR {
                        return fail(
                            Exit::Unavailable,
                            format!(
                                "follow run {id}: no working stream for {}: {why:#}",
                                humantime::format_duration(RECONNECT_FOR)
                            ),
                        );
                    }
                    tracing::debug!(
                        run_id = id,
                        last_seq = last,
                        error = format!("{why:#}"),
                        "stream dropped; reconnecting"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One connection of [`Api::follow`]. `last` is the highest seq handed to `on_event` so far;
    /// `connected` turns true at the first stream the server opens (later ones resume).
    async fn stream_once(
        &self,
        id: &str,
        last: &mut u64,
        connected: &mut bool,
        on_event: &mut dyn FnMut(&Value) -> anyhow::Result<()>,
    ) -> Result<Value, Dropped> {
        let path = format!("/api/runs/{id}/stream");
        let req = if *connected {
            // The server resumes strictly after the last event the client has (SSE's own mechanism).
            self.request(reqwest::Method::GET, &path)
                .header("Last-Event-ID", last.to_string())
        } else {
            self.request(reqwest::Method::GET, &format!("{path}?afterSeq={last}"))
        };
        let req = req.header(reqwest::header::ACCEPT, "text/event-stream");
        let res = match req.send().await {
            Ok(res) => res,
            Err(e) => {
                return Err(Dropped::Retry {
                    progressed: false,
                    why: anyhow::Error::new(e).context(format!("reach {}{path}", self.base)),
                })
            }
        };
        if !res.status().is_success() {
            let e = answer_error(&reqwest::Method::GET, &path, res).await;
            return Err(match e.exit {
                Exit::Unavailable => Dropped::Retry {
                    progressed: false,
                    why: e.into(),
                },
                _ => Dropped::Fatal(e.into()),
            });
        }
        *connected = true;
        let mut events = Box::pin(eventsource_stream::Eventsource::eventsource(idle_timeout(
            res.bytes_stream(),
            STREAM_IDLE,
        )));
        let mut progressed = false;
        while let Some(item) = events.next().await {
            let ev = match item {
                Ok(ev) => ev,
                Err(e) => {
                    return Err(Dropped::Retry {
                        progressed,
                        why: anyhow::anyhow!("read the stream: {e}"),
                    })
                }
            };
            match ev.event.as_str() {
                "run_event" => {
                    let data: Value = match serde_json::from_str(&ev.data) {
                        Ok(v) => v,
                        Err(e) => {
                            return Err(Dropped::Fatal(anyhow::anyhow!(
                                "decode a run_event of run {id}: {e}"
                            )))
                        }
                    };
                    let seq = ev
                        .id
                        .trim()
                        .parse::<u64>()
                        .ok()
                        .or_else(|| data.get("seq").and_then(Value::as_u64));
                    if seq.is_some_and(|s| s <= *last) {
                        continue; // already printed (a replay overlapping the cursor)
                    }
                    on_event(&data).map_err(Dropped::Fatal)?;
                    if let Some(s) = seq {
                        *last = s;
                    }
                    progressed = true;
                }
                "end" => return Ok(serde_json::from_str(&ev.data).unwrap_or(Value::Null)),
                _ => {}
            }
        }
        Err(Dropped::Retry {
            progressed,
            why: anyhow::anyhow!("the stream closed before the run's end"),
        })
    }
}

/// Why one stream connection ended without `end`.
enum Dropped {
    /// Try again (with `Last-Event-ID`) once a stream was open; `progressed` when this connection
    /// delivered events.
    Retry {
        progressed: bool,
        why: anyhow::Error,
    },
    /// Give up: not found, denied, or the output failed.
    Fatal(anyhow::Error),
}

/// `bytes` with an error in place of a silence longer than `idle` (the server pings every 15 s).
fn idle_timeout<S, B>(
    bytes: S,
    idle: Duration,
) -> impl futures_util::Stream<Item = Result<B, String>>
where
    S: futures_util::Stream<Item = reqwest::Result<B>>,
{
    futures_util::stream::unfold(
        (Box::pin(bytes), false),
        move |(mut bytes, failed)| async move {
            if failed {
                return None;
            }
            match tokio::time::timeout(idle, bytes.next()).await {
                Ok(Some(Ok(b))) => Some((Ok(b), (bytes, false))),
                Ok(Some(Err(e))) => Some((Err(e.to_string()), (bytes, true))),
                Ok(None) => None,
                Err(_) => Some((
                    Err(format!(
                        "nothing received for {}",
                        humantime::format_duration(idle)
                    )),
                    (bytes, true),
                )),
            }
        },
    )
}

pub(super) async fn from_server(api: &Api, args: &RunsArgs) -> anyhow::Result<()> {
    let now = storage::SystemClock.now_ms();
    let out = match &args.command {
        RunsCommand::List(a) => {
            let v = match api
                .get(&list_path(
                    a,
                    a.status.as_str(),
                    a.limit,
                    a.before,
                    a.before_id.clone().map(RunId::into_string),
                ))
                .await
            {
                Ok(v) => v,
                // A server that does not filter by terminal status yet (400 on `status`): filter its
                // finished pages here, as `--db` does.
                Err(e) if a.status.terminal().is_some() && refused_status(&e) => {
                    serde_json::to_value(list_filtered(api, a).await?)
                        .context("encode the run list")?
                }
                Err(e) => return Err(e),
            };
            if args.json {
                pretty(&v)
            } else {
                list_table(&decode::<RunList>(v, "run list")?, now)
            }
        }
        RunsCommand::Get(a) => {
            // The events come along so the outcome can be read from them when the view does not carry it.
            let mut v = api
                .get(&format!("/api/runs/{}?include=events", a.id))
                .await?;
            with_outcome(&mut v, a.events);
            if args.json {
                pretty(&v)
            } else {
                run_text(&v, now)?
            }
        }
        RunsCommand::Events(a) if a.follow => return follow_events(api, a, args.json).await,
        RunsCommand::Events(a) => {
            let mut after = a.after_seq;
            let mut events = Vec::new();
            let mut next;
            loop {
                // Against a server a page is capped lower than --limit may ask: read on until it is met.
                let want = a.limit.map(|l| {
                    if a.all {
                        l
                    } else {
                        l.saturating_sub(events.len() as u64).max(1)
                    }
                });
                let path = format!(
                    "/api/runs/{}/events{}",
                    a.id,
                    query(&[
                        ("afterSeq", Some(after.to_string())),
                        ("limit", want.map(|l| l.to_string()))
                    ])
                );
                let page: EventPage = decode(api.get(&path).await?, "events page")?;
                let got = page.events.len();
                events.extend(page.events);
                next = page.next_after_seq;
                let more_wanted = a.all || a.limit.is_some_and(|l| (events.len() as u64) < l);
                match next {
                    Some(n) if more_wanted && n > after && got > 0 => after = n,
                    _ => break,
                }
            }
            events_out(
                EventPage {
                    events,
                    next_after_seq: next,
                },
                args.json,
            )
        }
        RunsCommand::Stop(a) => return stop(api, a, args.json).await,
        RunsCommand::Retry(a) => {
            let body = a.key.as_ref().map(|k| json!({"key": k}));
            let v = api
                .call(
                    reqwest::Method::POST,
                    &format!("/api/runs/{}/retry", a.id),
                    body,
                )
                .await?;
            if args.json {
                pretty(&v)
            } else {
                retry_text(&a.id, &v)
            }
        }
        RunsCommand::Kill(a) => {
            let v = api
                .call(
                    reqwest::Method::DELETE,
                    &format!("/api/runs/{}", a.id),
                    None,
                )
                .await?;
            if args.json {
                pretty(&v)
            } else {
                format!(
                    "{}: {}\n",
                    a.id,
                    v.get("state").and_then(Value::as_str).unwrap_or("killing")
                )
            }
        }
    };
    write_out(&out)
}

/// `runs retry` as text: the run that took the request and its live URL, one per line after a summary.
fn retry_text(id: &str, v: &Value) -> String {
    let str_of = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("?");
    let run = str_of("runId");
    let live = str_of("liveUrl");
    match str_of("outcome") {
        "steered" => format!(
            "{run}: steered (the thread's live run took {id}'s request as a follow-up, seq {})\n{live}\n",
            v.get("seq").map_or_else(|| "?".to_owned(), Value::to_string)
        ),
        outcome => format!("{run}: {outcome} (a retry of {id})\n{live}\n"),
    }
}

/// `/api/runs?…` for `a` with this status, limit and cursor.
fn list_path(
    a: &ListArgs,
    status: &str,
    limit: Option<u64>,
    before: Option<i64>,
    before_id: Option<String>,
) -> String {
    format!(
        "/api/runs{}",
        query(&[
            ("status", Some(status.to_owned())),
            ("limit", limit.map(|l| l.to_string())),
            ("agent", a.agent.clone()),
            ("channel", a.channel.clone()),
            ("threadKey", a.thread_key.clone()),
            (
                "parentRunId",
                a.parent_run_id.clone().map(RunId::into_string)
            ),
            ("sinceMs", a.since.map(|s| s.to_string())),
            ("before", before.map(|b| b.to_string())),
            ("beforeId", before_id),
        ])
    )
}

/// Whether `e` is the server refusing the `status` parameter (400 `bad_request` naming it).
fn refused_status(e: &anyhow::Error) -> bool {
    e.downcast_ref::<CliError>().is_some_and(|c| {
        matches!(&c.answer, Some((400, code)) if code == "bad_request")
            && c.message.contains(" bad_request: status:")
    })
}

/// `runs list --status <terminal>` against a server that lists only active/finished/all: its finished
/// pages (200 rows each, newest finish first) filtered here until the limit is met. A tombstone matches
/// no terminal status (it is shown as unfinished).
async fn list_filtered(api: &Api, a: &ListArgs) -> anyhow::Result<RunList> {
    let status = a.status.terminal().expect("called for a terminal status");
    let limit = a.limit.map_or(LIST_DEFAULT_LIMIT, |l| l as usize);
    let mut cursor = a
        .before
        .map(|b| (b, a.before_id.clone().map(RunId::into_string)));
    let mut list = RunList {
        runs: Vec::new(),
        next_before: None,
        store_unavailable: false,
        ledger_unavailable: false,
    };
    loop {
        let path = list_path(
            a,
            "finished",
            Some(LIST_MAX_LIMIT as u64),
            cursor.as_ref().map(|c| c.0),
            cursor.as_ref().and_then(|c| c.1.clone()),
        );
        let page: RunList = decode(api.get(&path).await?, "run list")?;
        list.store_unavailable |= page.store_unavailable;
        list.ledger_unavailable |= page.ledger_unavailable;
        for run in page.runs {
            if run.status.is_some_and(|s| s.as_str() == status) && run.provisional != Some(true) {
                let at = run.finished_at.unwrap_or(run.started_at);
                let id = run.id.to_string();
                list.runs.push(run);
                if list.runs.len() == limit {
                    list.next_before = Some(NextBefore {
                        finished_at: at,
                        id: Some(id),
                    });
                    return Ok(list);
                }
            }
        }
        match page.next_before {
            Some(nb) if cursor.as_ref() != Some(&(nb.finished_at, nb.id.clone())) => {
                cursor = Some((nb.finished_at, nb.id))
            }
            _ => return Ok(list),
        }
    }
}

/// `runs events --follow`.
async fn follow_events(api: &Api, a: &EventsArgs, json: bool) -> anyhow::Result<()> {
    let mut print = |e: &Value| -> anyhow::Result<()> {
        let line = if json {
            format!("{e}\n")
        } else {
            event_lines(std::slice::from_ref(e))
        };
        write_out(&line)
    };
    let end = api.follow(&a.id, a.after_seq, &mut print).await?;
    let line = if json {
        format!("{}\n", json!({"end": end}))
    } else {
        format!("end: {}\n", end_words(&end))
    };
    write_out(&line)
}

/// `completed at 2026-…Z` from an `end` frame's data.
fn end_words(end: &Value) -> String {
    let status = end
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("finished");
    match end.get("finishedAt").and_then(Value::as_i64) {
        Some(at) => format!("{status} at {}", fmt_time(at)),
        None => status.to_owned(),
    }
}

/// `runs stop [--wait]`.
async fn stop(api: &Api, a: &StopArgs, json: bool) -> anyhow::Result<()> {
    let id = &a.id;
    let mode = a.mode.as_str();
    let mut v = api
        .call(
            reqwest::Method::POST,
            &format!("/api/runs/{id}/stop"),
            Some(json!({"mode": mode})),
        )
        .await?;
    let state = v
        .get("state")
        .and_then(Value::as_str)
        .unwrap_or("stopping")
        .to_owned();
    if !a.wait {
        return write_out(&if json {
            pretty(&v)
        } else {
            format!("{id}: {state} ({mode})\n")
        });
    }
    if !json {
        write_out(&format!(
            "{id}: {state} ({mode}); waiting for the run to end\n"
        ))?;
    }
    // Start the stream near its tail: earlier events are not printed here, only the end matters.
    let hint = match api.get(&format!("/api/runs/{id}")).await {
        Ok(view) => view.get("eventCount").and_then(Value::as_u64).unwrap_or(0),
        Err(_) => 0,
    };
    let mut ignore = |_: &Value| Ok(());
    let follow = api.follow(id, hint, &mut ignore);
    let end = match a.timeout {
        None => follow.await?,
        Some(t) => match tokio::time::timeout(t, follow).await {
            Ok(end) => end?,
            Err(_) => {
                return fail(
                    Exit::Failure,
                    format!(
                        "run {id} had not ended after {}",
                        humantime::format_duration(t)
                    ),
                )
            }
        },
    };
    if json {
        v["ended"] = end;
        write_out(&pretty(&v))
    } else {
        write_out(&format!("{id}: ended {}\n", end_words(&end)))
    }
}
