//! `switchboard runs list|get|events|stop|kill` (SPEC §8.2).
//!
//! Two ways to read: against a running server's JSON API (`--url`, default `$SWITCHBOARD_URL` or
//! `http://127.0.0.1:8080`, with `--token` / `$SWITCHBOARD_TOKEN` as the bearer token), or `--db PATH`:
//! store-only reads of a stopped server's SQLite database, opened read-only through the storage crate
//! (never created, never migrated: an older schema is read as is, a newer one refused by name). Output is a human table by
//! default and the API's JSON shapes with `--json` (the same shapes in both modes).
//!
//! A store-only reader sees no live state: a provisional record (the tombstone a run writes at start)
//! renders as `unfinished — no finish recorded`, never as `interrupted`. Stop and kill need a server.
//!
//! [`run`] is called outside any async runtime; it starts its own actix system for HTTP.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use actors::runs_service::{EventPage, NextBefore, RunList, RunView, StatusFilter};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use storage::record::{is_valid_run_id, VisibilityFilter};
use storage::store::{Cursor, ListQuery};
use storage::{Clock, RunStore, SqliteStore};
use web::routes::html::{describe, fmt_duration, fmt_time};

const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// `switchboard runs …` arguments.
#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    /// The server's base URL (default: $SWITCHBOARD_URL, else http://127.0.0.1:8080).
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// Bearer token for the server (default: $SWITCHBOARD_TOKEN).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Read a stopped server's database directly (finished-run history only).
    #[arg(long, global = true, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Print JSON (the API's shapes) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: RunsCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first (live runs first).
    List {
        /// active | finished | all.
        #[arg(long, default_value = "all")]
        status: String,
        /// At most this many rows (≤ 200).
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        channel: Option<String>,
        #[arg(long)]
        thread_key: Option<String>,
        #[arg(long)]
        parent_run_id: Option<String>,
        /// Only runs finished (or, live, started) at or after this epoch ms.
        #[arg(long)]
        since_ms: Option<i64>,
        /// Cursor from a previous page: rows finished before this epoch ms …
        #[arg(long)]
        before: Option<i64>,
        /// … and, in the same millisecond, with a smaller id.
        #[arg(long)]
        before_id: Option<String>,
    },
    /// Show one run.
    Get {
        id: String,
        /// Include its events.
        #[arg(long)]
        events: bool,
    },
    /// Print a run's events after a seq.
    Events {
        id: String,
        #[arg(long, default_value_t = 0)]
        after_seq: u64,
        /// Events per page (≤ 500).
        #[arg(long)]
        limit: Option<usize>,
        /// Follow `nextAfterSeq` to the last event.
        #[arg(long)]
        all: bool,
    },
    /// Stop a live run.
    Stop {
        id: String,
        /// soft (finish the current step) or hard (abort now).
        #[arg(long, default_value = "soft")]
        mode: String,
    },
    /// Kill a run: abort it and delete its history.
    Kill { id: String },
}

pub fn run(args: RunsArgs) -> anyhow::Result<()> {
    let out = match &args.db {
        Some(db) => from_db(db, &args)?,
        None => {
            let url = args.url.clone().or_else(|| std::env::var("SWITCHBOARD_URL").ok()).unwrap_or_else(|| DEFAULT_URL.into());
            let token = args.token.clone().or_else(|| std::env::var("SWITCHBOARD_TOKEN").ok()).filter(|t| !t.is_empty());
            let api = Api { base: url.trim_end_matches('/').to_owned(), token };
            actix_web::rt::System::new().block_on(from_server(&api, &args))?
        }
    };
    print!("{out}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Against a running server
// ---------------------------------------------------------------------------------------------

struct Api {
    base: String,
    token: Option<String>,
}

/// Percent-encode a query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", enc(v)))).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn check_id(id: &str) -> anyhow::Result<()> {
    if !is_valid_run_id(id) {
        bail!("{id:?} is not a run id");
    }
    Ok(())
}

impl Api {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut req = reqwest::Client::new().request(method.clone(), &url);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.with_context(|| format!("reach {url}"))?;
        let status = res.status();
        let text = res.text().await.with_context(|| format!("read the answer of {method} {path}"))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let code = v.get("error").and_then(Value::as_str).unwrap_or("error");
            let message = match (v.get("message").and_then(Value::as_str), &v) {
                (Some(m), _) => m.to_owned(),
                (None, Value::String(text)) if !text.trim().is_empty() => text.trim().to_owned(),
                _ => status.canonical_reason().unwrap_or("").to_owned(),
            };
            bail!("{method} {path}: {} {code}: {message}", status.as_u16());
        }
        Ok(v)
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(v).with_context(|| format!("decode the server's {what}"))
}

async fn from_server(api: &Api, args: &RunsArgs) -> anyhow::Result<String> {
    let now = storage::SystemClock.now_ms();
    match &args.command {
        RunsCommand::List { status, limit, agent, channel, thread_key, parent_run_id, since_ms, before, before_id } => {
            let path = format!(
                "/api/runs{}",
                query(&[
                    ("status", Some(status.clone())),
                    ("limit", limit.map(|l| l.to_string())),
                    ("agent", agent.clone()),
                    ("channel", channel.clone()),
                    ("threadKey", thread_key.clone()),
                    ("parentRunId", parent_run_id.clone()),
                    ("sinceMs", since_ms.map(|s| s.to_string())),
                    ("before", before.map(|b| b.to_string())),
                    ("beforeId", before_id.clone()),
                ])
            );
            let v = api.get(&path).await?;
            if args.json {
                return Ok(pretty(&v));
            }
            Ok(list_table(&decode::<RunList>(v, "run list")?, now))
        }
        RunsCommand::Get { id, events } => {
            check_id(id)?;
            let include = if *events { "?include=events" } else { "" };
            let v = api.get(&format!("/api/runs/{id}{include}")).await?;
            if args.json {
                return Ok(pretty(&v));
            }
            Ok(run_text(&decode::<RunView>(v, "run")?, now))
        }
        RunsCommand::Events { id, after_seq, limit, all } => {
            check_id(id)?;
            let mut after = *after_seq;
            let mut events = Vec::new();
            let mut next;
            loop {
                let path = format!(
                    "/api/runs/{id}/events{}",
                    query(&[("afterSeq", Some(after.to_string())), ("limit", limit.map(|l| l.to_string()))])
                );
                let page: EventPage = decode(api.get(&path).await?, "events page")?;
                events.extend(page.events);
                next = page.next_after_seq;
                match next {
                    Some(n) if *all && n > after => after = n,
                    _ => break,
                }
            }
            Ok(events_out(EventPage { events, next_after_seq: next }, args.json))
        }
        RunsCommand::Stop { id, mode } => {
            check_id(id)?;
            if !["soft", "hard"].contains(&mode.as_str()) {
                bail!("--mode must be soft or hard");
            }
            let v = api.call(reqwest::Method::POST, &format!("/api/runs/{id}/stop"), Some(json!({"mode": mode}))).await?;
            if args.json {
                return Ok(pretty(&v));
            }
            Ok(format!("{id}: {} ({mode})\n", v.get("state").and_then(Value::as_str).unwrap_or("stopping")))
        }
        RunsCommand::Kill { id } => {
            check_id(id)?;
            let v = api.call(reqwest::Method::DELETE, &format!("/api/runs/{id}"), None).await?;
            if args.json {
                return Ok(pretty(&v));
            }
            Ok(format!("{id}: {}\n", v.get("state").and_then(Value::as_str).unwrap_or("killing")))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Store-only (a stopped server's database)
// ---------------------------------------------------------------------------------------------

fn from_db(db: &Path, args: &RunsArgs) -> anyhow::Result<String> {
    if matches!(args.command, RunsCommand::Stop { .. } | RunsCommand::Kill { .. }) {
        bail!("--db reads a stopped server's history; stop and kill need a running server (--url)");
    }
    // Read-only through the storage crate: never created, never migrated, an older schema read as is,
    // a newer one refused by name (SPEC §1.2, §8.2).
    let mut store = SqliteStore::open_read_only(db).with_context(|| format!("open database {} read-only", db.display()))?;
    let now = storage::SystemClock.now_ms();
    match &args.command {
        RunsCommand::List { status, limit, agent, channel, thread_key, parent_run_id, since_ms, before, before_id } => {
            match StatusFilter::parse(status) {
                Some(StatusFilter::Active) => bail!("--db reads finished-run history only: --status active needs a running server (--url)"),
                Some(_) => {}
                None => bail!("--status must be active, finished or all"),
            }
            if before.is_none() && before_id.is_some() {
                bail!("--before-id needs --before");
            }
            let query = ListQuery {
                visible_to: VisibilityFilter::All,
                limit: *limit,
                before: before.map(|finished_at| Cursor { finished_at, id: before_id.clone() }),
                since_ms: *since_ms,
                agent: agent.clone(),
                channel: channel.clone(),
                thread_key: thread_key.clone(),
                parent_run_id: parent_run_id.clone(),
            };
            let page = store.list(&query, now).context("list runs")?;
            let list = RunList {
                runs: page.items.iter().map(|i| RunView::from_head(&i.head)).collect(),
                next_before: page.next_before.map(|c| NextBefore { finished_at: c.finished_at, id: c.id }),
                store_unavailable: false,
                ledger_unavailable: false,
            };
            if args.json {
                return Ok(pretty(&serde_json::to_value(&list)?));
            }
            Ok(list_table(&list, now))
        }
        RunsCommand::Get { id, events } => {
            check_id(id)?;
            let view = if *events {
                let r = RunStore::get(&mut store, id, now).context("read the run")?;
                r.map(|r| RunView { events: Some(r.events), ..RunView::from_head(&r.head) })
            } else {
                store.get_summary(id, now).context("read the run")?.map(|i| RunView::from_head(&i.head))
            };
            let Some(view) = view else { bail!("run {id} not found") };
            if args.json {
                return Ok(pretty(&serde_json::to_value(&view)?));
            }
            Ok(run_text(&view, now))
        }
        RunsCommand::Events { id, after_seq, limit, all } => {
            check_id(id)?;
            let limit = limit.unwrap_or(500).clamp(1, 500);
            let mut after = *after_seq;
            let mut events = Vec::new();
            let mut next;
            loop {
                let Some(page) = RunStore::events(&mut store, id, after, Some(limit), now).context("read events")? else {
                    bail!("run {id} not found")
                };
                events.extend(page.events);
                next = page.next_after_seq;
                match next {
                    Some(n) if *all && n > after => after = n,
                    _ => break,
                }
            }
            Ok(events_out(EventPage { events, next_after_seq: next }, args.json))
        }
        RunsCommand::Stop { .. } | RunsCommand::Kill { .. } => {
            bail!("--db reads a stopped server's history; stop and kill need a running server (--url)")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

fn pretty(v: &Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()))
}

/// A plain-text table with columns as wide as their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                let pad = widths[i] - c.chars().count();
                let _ = write!(out, "{c}{}  ", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

/// A label on one line, at most 60 characters.
fn one_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    let mut t: String = line.chars().take(60).collect();
    if line.chars().count() > 60 || s.lines().count() > 1 {
        t.push('…');
    }
    t
}

fn list_table(list: &RunList, now: i64) -> String {
    let mut out = String::new();
    if list.store_unavailable {
        out.push_str("warning: the history store is unavailable; showing live runs only\n");
    }
    if list.ledger_unavailable {
        out.push_str("warning: the live-run ledger is unavailable; runs of other processes may be missing\n");
    }
    if list.runs.is_empty() {
        out.push_str("no runs\n");
    } else {
        let rows: Vec<Vec<String>> = list
            .runs
            .iter()
            .map(|v| {
                vec![
                    v.id.clone(),
                    v.status_label(),
                    v.agent.clone().unwrap_or_default(),
                    fmt_time(v.started_at),
                    fmt_duration(v.duration_ms(now)),
                    v.finished_at.map(fmt_time).unwrap_or_else(|| "-".into()),
                    v.event_count.to_string(),
                    one_line(v.label.as_deref().unwrap_or("")),
                ]
            })
            .collect();
        out.push_str(&table(&["ID", "STATUS", "AGENT", "STARTED", "DURATION", "FINISHED", "EVENTS", "LABEL"], &rows));
    }
    if let Some(nb) = &list.next_before {
        let _ = write!(out, "more: --before {}", nb.finished_at);
        if let Some(id) = &nb.id {
            let _ = write!(out, " --before-id {id}");
        }
        out.push('\n');
    }
    out
}

fn run_text(v: &RunView, now: i64) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("Run", v.id.clone()),
        ("Status", v.status_label()),
        ("Label", v.label.clone().unwrap_or_default()),
        ("Agent", format!("{} (model {})", v.agent.as_deref().unwrap_or("-"), v.model.as_deref().unwrap_or("-"))),
        ("Channel", format!("{} ({})", v.channel_id, v.channel_visibility.as_str())),
        ("Thread", v.thread_key.clone()),
        ("User", v.user_id.clone()),
        ("Started", fmt_time(v.started_at)),
        ("Finished", v.finished_at.map(fmt_time).unwrap_or_else(|| "-".into())),
        ("Duration", fmt_duration(v.duration_ms(now))),
    ];
    let mut events = v.event_count.to_string();
    if let Some(s) = v.stored_event_count.filter(|s| *s != v.event_count) {
        let _ = write!(events, " (stored {s})");
    }
    if v.truncated == Some(true) {
        events.push_str(" (truncated)");
    }
    rows.push(("Events", events));
    if let Some(g) = &v.owner_gen {
        rows.push(("Live in", format!("generation {g}")));
    }
    if let Some(p) = &v.parent_run_id {
        rows.push(("Parent", p.clone()));
    }
    let mut out = String::new();
    for (k, val) in rows {
        let _ = writeln!(out, "{k:<9} {val}");
    }
    if let Some(evs) = &v.events {
        out.push('\n');
        out.push_str(&event_lines(evs));
    }
    out
}

fn event_lines(events: &[Value]) -> String {
    let mut out = String::new();
    for e in events {
        let (head, body) = describe(e);
        let seq = e.get("seq").and_then(Value::as_u64).map(|s| s.to_string()).unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "#{seq:<5} {head}: {}", body.replace('\n', "\n       "));
    }
    out
}

fn events_out(page: EventPage, json: bool) -> String {
    if json {
        return pretty(&serde_json::to_value(&page).unwrap_or(Value::Null));
    }
    let mut out = event_lines(&page.events);
    if let Some(n) = page.next_after_seq {
        let _ = writeln!(out, "more: --after-seq {n}");
    }
    out
}
