//! `switchboard runs list|get|events|stop|kill` (SPEC §8.2).
//!
//! Two ways to read: against a running server's JSON API (`--url`, default `$SWITCHBOARD_URL` or
//! `http://127.0.0.1:8080`, with `--token` / `$SWITCHBOARD_TOKEN` as the bearer token), or `--db PATH`:
//! store-only reads of a stopped server's SQLite database, opened read-only through the storage crate
//! (never created, never migrated: an older schema is read as is, a newer one refused by name). Output is
//! a human table by default and the API's JSON shapes with `--json` (the same shapes in both modes).
//!
//! A store-only reader sees no live state: a provisional record (the tombstone a run writes at start)
//! renders as `unfinished — no finish recorded`, never as `interrupted`. Stop, kill and `--follow` need a
//! server.
//!
//! Owns nothing but its HTTP client; [`run`] is called outside any async runtime and starts its own
//! actix system for HTTP.
//!
//! Invariants:
//! - arguments the API would refuse are refused by clap first (exit 2 naming the flag): closed sets are
//!   [`clap::ValueEnum`]s, `--limit` is checked against the API's caps, run ids against the id shape;
//! - every failure maps to one [`Exit`] code: the HTTP status of the answer (404 → 3, 409 → 4, 401/403
//!   → 5, 502/503/504 → 6) or a transport failure (refused, reset or timed out → 6), see [`exit_code`];
//! - `--db` never writes: it goes through [`SqliteStore::open_read_only`] and only calls readers.
//!
//! # Design
//! `runs get` shows the answer, the error (the `run_failed` message) and who stopped the run. A server
//! whose RunView carries `answer`, `error` and `stoppedBy` is taken at its word; otherwise they are read
//! from the run's events (the last `answer`, the last `run_failed`, the strongest `stop_requested`), so
//! the command says the same against every server and against a database. Likewise `runs list
//! --status <terminal status>`: a server that refuses the status (400 naming `status`) has its finished
//! pages filtered here (`--db` asks the store, which filters by status itself).
//!
//! `runs events --follow` and `runs stop --wait` follow `/api/runs/{id}/stream`. A stream that drops
//! (server restarting, slow client dropped, no byte for [`STREAM_IDLE`]) is reopened with
//! `Last-Event-ID` set to the last seq printed, so nothing is printed twice and nothing is skipped; the
//! follower gives up as unavailable after [`RECONNECT_FOR`] without a working stream (at once when the
//! very first connection fails: a wrong `--url` should not hang), and ends at `event: end`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use actors::runs_service::{EventPage, NextBefore, RunList, RunView};
use anyhow::Context;
use futures_util::StreamExt;
use serde_json::{json, Value};
use storage::record::{is_valid_run_id, VisibilityFilter};
use storage::store::{Cursor, ListQuery, EVENTS_MAX_LIMIT, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT};
use storage::{Clock, RunStore, SqliteStore};
use web::routes::html::{describe, fmt_duration, fmt_time};

const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// A stream that sends nothing (not even the 15 s `: ping`) for this long is taken as dead and reopened.
pub const STREAM_IDLE: Duration = Duration::from_secs(45);
/// A follower that cannot get a working stream back for this long gives up (exit 6).
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);
/// Time to connect to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for one plain (non-stream) request, answer included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Exit codes
// ---------------------------------------------------------------------------------------------

/// The process exit code of a failed `runs` command (0 is success).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Anything not named below.
    Failure = 1,
    /// The command line cannot be carried out as given (clap's own errors exit 2 too).
    Usage = 2,
    /// The run (or the page) does not exist, or the caller may not see it.
    NotFound = 3,
    /// The run is in a state that refuses the request (e.g. stopping a finished run).
    Conflict = 4,
    /// No credentials, or credentials without the scope.
    Denied = 5,
    /// The server (or its storage) cannot answer now: 502/503/504, refused, reset, timed out.
    Unavailable = 6,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The exit for a non-success HTTP status.
    pub fn from_http(status: u16) -> Exit {
        match status {
            404 | 410 => Exit::NotFound,
            409 => Exit::Conflict,
            401 | 403 => Exit::Denied,
            502..=504 => Exit::Unavailable,
            _ => Exit::Failure,
        }
    }
}

/// A failure that knows its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub exit: Exit,
    /// The server's answer, when it was one: its status and `error` code.
    pub answer: Option<(u16, String)>,
    pub message: String,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        CliError { exit, answer: None, message: message.into() }
    }
}

fn fail<T>(exit: Exit, message: impl Into<String>) -> anyhow::Result<T> {
    Err(CliError::new(exit, message).into())
}

/// The exit code for an error out of [`run`]: the first [`CliError`] in its chain decides; a transport
/// failure (connection refused or reset, timeout) is unavailable; anything else is 1.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    // Also finds a CliError attached as context, which the chain below shows only as its wrapper.
    if let Some(c) = e.downcast_ref::<CliError>() {
        return c.exit.code();
    }
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CliError>() {
            return c.exit.code();
        }
        if let Some(r) = cause.downcast_ref::<reqwest::Error>() {
            if r.is_connect() || r.is_timeout() || r.is_request() {
                return Exit::Unavailable.code();
            }
        }
    }
    Exit::Failure.code()
}

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------

/// `switchboard runs …` arguments.
#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    /// The server's base URL (default: $SWITCHBOARD_URL, else http://127.0.0.1:8080).
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// Bearer token for the server (default: $SWITCHBOARD_TOKEN).
    #[arg(long, global = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// Read a stopped server's database directly, read-only (list, get and events; finished runs only).
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "url")]
    pub db: Option<PathBuf>,
    /// Print JSON (the API's shapes) instead of tables; with --follow, one JSON object per line.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: RunsCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// List runs: live runs first (newest start first), then finished runs (newest finish first).
    List(ListArgs),
    /// Show one run: status, timing, the answer, the error and who stopped it.
    Get(GetArgs),
    /// Print a run's events after a seq, or tail its live stream with --follow.
    Events(EventsArgs),
    /// Stop a live run (needs a server and the runs:write scope).
    Stop(StopArgs),
    /// Kill a run: abort it and delete its history (needs a server and the runs:kill scope).
    Kill(KillArgs),
}

/// Which runs `runs list` shows (the API's `status` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusArg {
    /// Unfinished runs, in this process or live under another generation (needs a server).
    Active,
    /// Finished runs.
    Finished,
    /// Unfinished and finished runs.
    All,
    /// Finished runs that completed.
    Completed,
    /// Finished runs that failed.
    Failed,
    /// Finished runs that a soft stop ended.
    #[value(name = "stopped_soft", alias = "stopped-soft")]
    StoppedSoft,
    /// Finished runs that a hard stop ended.
    #[value(name = "stopped_hard", alias = "stopped-hard")]
    StoppedHard,
    /// Finished runs closed without a finish of their own (crash, lost lease).
    Interrupted,
}

impl StatusArg {
    /// The API's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            StatusArg::Active => "active",
            StatusArg::Finished => "finished",
            StatusArg::All => "all",
            StatusArg::Completed => "completed",
            StatusArg::Failed => "failed",
            StatusArg::StoppedSoft => "stopped_soft",
            StatusArg::StoppedHard => "stopped_hard",
            StatusArg::Interrupted => "interrupted",
        }
    }

    /// The terminal status this filter selects, when it selects one.
    fn terminal(self) -> Option<&'static str> {
        match self {
            StatusArg::Active | StatusArg::Finished | StatusArg::All => None,
            other => Some(other.as_str()),
        }
    }
}

/// How `runs stop` stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StopModeArg {
    /// Let the current step finish, then end the run (`stopped_soft`).
    Soft,
    /// Abort now: in-flight tool calls are dropped (`stopped_hard`).
    Hard,
}

impl StopModeArg {
    pub fn as_str(self) -> &'static str {
        match self {
            StopModeArg::Soft => "soft",
            StopModeArg::Hard => "hard",
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Which runs to list.
    #[arg(long, value_enum, default_value_t = StatusArg::All)]
    pub status: StatusArg,
    /// At most this many rows (1 to 200; the server's default is 50).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=LIST_MAX_LIMIT as u64))]
    pub limit: Option<u64>,
    /// Only runs of this agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only runs in this channel.
    #[arg(long)]
    pub channel: Option<String>,
    /// Only runs on this thread key (`<channel>:<thread>`).
    #[arg(long)]
    pub thread_key: Option<String>,
    /// Only runs started by this parent run (plan steps).
    #[arg(long, value_parser = run_id)]
    pub parent_run_id: Option<String>,
    /// Only runs finished (or, still live, started) since then: a duration ago (`1h`, `30m`, `2days`)
    /// or an RFC 3339 time (`2026-05-01T12:00:00Z`).
    #[arg(long, value_name = "WHEN", value_parser = since_ms)]
    pub since: Option<i64>,
    /// Cursor from a previous page's `more:` line: runs finished before this epoch ms …
    #[arg(long, value_name = "EPOCH_MS")]
    pub before: Option<i64>,
    /// … and, in that same millisecond, with a smaller id.
    #[arg(long, value_name = "ID", requires = "before", value_parser = run_id)]
    pub before_id: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: String,
    /// Include its events.
    #[arg(long)]
    pub events: bool,
}

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: String,
    /// Only events after this seq.
    #[arg(long, default_value_t = 0, value_name = "SEQ")]
    pub after_seq: u64,
    /// At most this many events (1 to 5000; with --all, per page).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=EVENTS_MAX_LIMIT as u64))]
    pub limit: Option<u64>,
    /// Read every page to the last event.
    #[arg(long, conflicts_with = "follow")]
    pub all: bool,
    /// Tail the run's live stream: print events as they come, end when the run has ended (needs a
    /// server; reconnects with Last-Event-ID when the stream drops).
    #[arg(long, short = 'f', conflicts_with = "limit")]
    pub follow: bool,
}

#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: String,
    /// How to stop.
    #[arg(long, value_enum, default_value_t = StopModeArg::Soft)]
    pub mode: StopModeArg,
    /// Return only once the run has ended (follows its stream to `end`).
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (`30s`, `5m`); exit 1, the run keeps stopping.
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = duration)]
    pub timeout: Option<Duration>,
}

#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: String,
}

/// clap parser: the run id shape (ASCII letters, digits, `-` and `_`).
fn run_id(s: &str) -> Result<String, String> {
    if is_valid_run_id(s) {
        Ok(s.to_owned())
    } else {
        Err("not a run id (1 to 128 ASCII letters, digits, '-' or '_')".into())
    }
}

/// clap parser: a humantime duration (`30s`, `5m`, `1h 30m`).
fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (expected a duration like 30s, 5m or 1h)"))
}

/// clap parser: `--since` as epoch ms — a duration before now, or an RFC 3339 time.
fn since_ms(s: &str) -> Result<i64, String> {
    parse_since(s, storage::SystemClock.now_ms())
}

fn parse_since(s: &str, now_ms: i64) -> Result<i64, String> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(now_ms.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    }
    match time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339) {
        Ok(t) => Ok((t.unix_timestamp_nanos() / 1_000_000) as i64),
        Err(_) => Err("expected a duration ago (1h, 30m, 2days) or an RFC 3339 time (2026-05-01T12:00:00Z)".into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Entry
// ---------------------------------------------------------------------------------------------

/// Carry out `switchboard runs …`. Map its error to the exit code with [`exit_code`].
pub fn run(args: RunsArgs) -> anyhow::Result<()> {
    let result = match &args.db {
        Some(db) => from_db(db, &args).and_then(|out| write_out(&out)),
        None => {
            let url = args.url.clone().or_else(|| std::env::var("SWITCHBOARD_URL").ok()).unwrap_or_else(|| DEFAULT_URL.into());
            let token = args.token.clone().or_else(|| std::env::var("SWITCHBOARD_TOKEN").ok()).filter(|t| !t.is_empty());
            let api = Api::new(url.trim_end_matches('/'), token)?;
            actix_web::rt::System::new().block_on(from_server(&api, &args))
        }
    };
    match result {
        // A reader that went away (`| head`) is not a failure.
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Print to stdout now (follow output is printed as it comes).
fn write_out(s: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes()).and_then(|_| out.flush()).context("write to stdout")
}

// ---------------------------------------------------------------------------------------------
// Against a running server
// ---------------------------------------------------------------------------------------------

struct Api {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
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
    fn new(base: &str, token: Option<String>) -> anyhow::Result<Api> {
        let client = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT).build().context("build the HTTP client")?;
        Ok(Api { base: base.to_owned(), token, client })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let mut req = self.request(method.clone(), path).timeout(REQUEST_TIMEOUT);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.with_context(|| format!("reach {}{path}", self.base))?;
        if !res.status().is_success() {
            return Err(answer_error(&method, path, res).await.into());
        }
        let text = res.text().await.with_context(|| format!("read the answer of {method} {path}"))?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// Follow `/api/runs/{id}/stream` from `after` to `event: end` (answering its data), calling
    /// `on_event` once per `run_event` in seq order. A stream that drops once open is reopened with
    /// `Last-Event-ID` for up to [`RECONNECT_FOR`] without progress; a first connection that fails, and
    /// a 404, 401 or 403 at any time, end the follow at once.
    async fn follow(&self, id: &str, after: u64, on_event: &mut dyn FnMut(&Value) -> anyhow::Result<()>) -> anyhow::Result<Value> {
        let mut last = after;
        let mut connected = false;
        let mut backoff = Duration::from_millis(200);
        let mut down_since: Option<tokio::time::Instant> = None;
        loop {
            match self.stream_once(id, &mut last, &mut connected, on_event).await {
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
                            format!("follow run {id}: no working stream for {}: {why:#}", humantime::format_duration(RECONNECT_FOR)),
                        );
                    }
                    tracing::debug!(run_id = id, last_seq = last, error = format!("{why:#}"), "stream dropped; reconnecting");
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
            self.request(reqwest::Method::GET, &path).header("Last-Event-ID", last.to_string())
        } else {
            self.request(reqwest::Method::GET, &format!("{path}?afterSeq={last}"))
        };
        let req = req.header(reqwest::header::ACCEPT, "text/event-stream");
        let res = match req.send().await {
            Ok(res) => res,
            Err(e) => return Err(Dropped::Retry { progressed: false, why: anyhow::Error::new(e).context(format!("reach {}{path}", self.base)) }),
        };
        if !res.status().is_success() {
            let e = answer_error(&reqwest::Method::GET, &path, res).await;
            return Err(match e.exit {
                Exit::Unavailable => Dropped::Retry { progressed: false, why: e.into() },
                _ => Dropped::Fatal(e.into()),
            });
        }
        *connected = true;
        let mut events = Box::pin(eventsource_stream::Eventsource::eventsource(idle_timeout(res.bytes_stream(), STREAM_IDLE)));
        let mut progressed = false;
        while let Some(item) = events.next().await {
            let ev = match item {
                Ok(ev) => ev,
                Err(e) => return Err(Dropped::Retry { progressed, why: anyhow::anyhow!("read the stream: {e}") }),
            };
            match ev.event.as_str() {
                "run_event" => {
                    let data: Value = match serde_json::from_str(&ev.data) {
                        Ok(v) => v,
                        Err(e) => return Err(Dropped::Fatal(anyhow::anyhow!("decode a run_event of run {id}: {e}"))),
                    };
                    let seq = ev.id.trim().parse::<u64>().ok().or_else(|| data.get("seq").and_then(Value::as_u64));
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
        Err(Dropped::Retry { progressed, why: anyhow::anyhow!("the stream closed before the run's end") })
    }
}

/// Why one stream connection ended without `end`.
enum Dropped {
    /// Try again (with `Last-Event-ID`) once a stream was open; `progressed` when this connection
    /// delivered events.
    Retry { progressed: bool, why: anyhow::Error },
    /// Give up: not found, denied, or the output failed.
    Fatal(anyhow::Error),
}

/// `bytes` with an error in place of a silence longer than `idle` (the server pings every 15 s).
fn idle_timeout<S, B>(bytes: S, idle: Duration) -> impl futures_util::Stream<Item = Result<B, String>>
where
    S: futures_util::Stream<Item = reqwest::Result<B>>,
{
    futures_util::stream::unfold((Box::pin(bytes), false), move |(mut bytes, failed)| async move {
        if failed {
            return None;
        }
        match tokio::time::timeout(idle, bytes.next()).await {
            Ok(Some(Ok(b))) => Some((Ok(b), (bytes, false))),
            Ok(Some(Err(e))) => Some((Err(e.to_string()), (bytes, true))),
            Ok(None) => None,
            Err(_) => Some((Err(format!("nothing received for {}", humantime::format_duration(idle))), (bytes, true))),
        }
    })
}

fn decode<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(v).with_context(|| format!("decode the server's {what}"))
}

async fn from_server(api: &Api, args: &RunsArgs) -> anyhow::Result<()> {
    let now = storage::SystemClock.now_ms();
    let out = match &args.command {
        RunsCommand::List(a) => {
            let v = match api.get(&list_path(a, a.status.as_str(), a.limit, a.before, a.before_id.clone())).await {
                Ok(v) => v,
                // A server that does not filter by terminal status yet (400 on `status`): filter its
                // finished pages here, as `--db` does.
                Err(e) if a.status.terminal().is_some() && refused_status(&e) => {
                    serde_json::to_value(list_filtered(api, a).await?).context("encode the run list")?
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
            let mut v = api.get(&format!("/api/runs/{}?include=events", a.id)).await?;
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
                let want = a.limit.map(|l| if a.all { l } else { l.saturating_sub(events.len() as u64).max(1) });
                let path = format!(
                    "/api/runs/{}/events{}",
                    a.id,
                    query(&[("afterSeq", Some(after.to_string())), ("limit", want.map(|l| l.to_string()))])
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
            events_out(EventPage { events, next_after_seq: next }, args.json)
        }
        RunsCommand::Stop(a) => return stop(api, a, args.json).await,
        RunsCommand::Kill(a) => {
            let v = api.call(reqwest::Method::DELETE, &format!("/api/runs/{}", a.id), None).await?;
            if args.json {
                pretty(&v)
            } else {
                format!("{}: {}\n", a.id, v.get("state").and_then(Value::as_str).unwrap_or("killing"))
            }
        }
    };
    write_out(&out)
}

/// `/api/runs?…` for `a` with this status, limit and cursor.
fn list_path(a: &ListArgs, status: &str, limit: Option<u64>, before: Option<i64>, before_id: Option<String>) -> String {
    format!(
        "/api/runs{}",
        query(&[
            ("status", Some(status.to_owned())),
            ("limit", limit.map(|l| l.to_string())),
            ("agent", a.agent.clone()),
            ("channel", a.channel.clone()),
            ("threadKey", a.thread_key.clone()),
            ("parentRunId", a.parent_run_id.clone()),
            ("sinceMs", a.since.map(|s| s.to_string())),
            ("before", before.map(|b| b.to_string())),
            ("beforeId", before_id),
        ])
    )
}

/// Whether `e` is the server refusing the `status` parameter (400 `bad_request` naming it).
fn refused_status(e: &anyhow::Error) -> bool {
    e.downcast_ref::<CliError>()
        .is_some_and(|c| matches!(&c.answer, Some((400, code)) if code == "bad_request") && c.message.contains(" bad_request: status:"))
}

/// `runs list --status <terminal>` against a server that lists only active/finished/all: its finished
/// pages (200 rows each, newest finish first) filtered here until the limit is met. A tombstone matches
/// no terminal status (it is shown as unfinished).
async fn list_filtered(api: &Api, a: &ListArgs) -> anyhow::Result<RunList> {
    let status = a.status.terminal().expect("called for a terminal status");
    let limit = a.limit.map_or(LIST_DEFAULT_LIMIT, |l| l as usize);
    let mut cursor = a.before.map(|b| (b, a.before_id.clone()));
    let mut list = RunList { runs: Vec::new(), next_before: None, store_unavailable: false, ledger_unavailable: false };
    loop {
        let path = list_path(a, "finished", Some(LIST_MAX_LIMIT as u64), cursor.as_ref().map(|c| c.0), cursor.as_ref().and_then(|c| c.1.clone()));
        let page: RunList = decode(api.get(&path).await?, "run list")?;
        list.store_unavailable |= page.store_unavailable;
        list.ledger_unavailable |= page.ledger_unavailable;
        for run in page.runs {
            if run.status.is_some_and(|s| s.as_str() == status) && run.provisional != Some(true) {
                let at = run.finished_at.unwrap_or(run.started_at);
                let id = run.id.clone();
                list.runs.push(run);
                if list.runs.len() == limit {
                    list.next_before = Some(NextBefore { finished_at: at, id: Some(id) });
                    return Ok(list);
                }
            }
        }
        match page.next_before {
            Some(nb) if cursor.as_ref() != Some(&(nb.finished_at, nb.id.clone())) => cursor = Some((nb.finished_at, nb.id)),
            _ => return Ok(list),
        }
    }
}

/// `runs events --follow`.
async fn follow_events(api: &Api, a: &EventsArgs, json: bool) -> anyhow::Result<()> {
    let mut print = |e: &Value| -> anyhow::Result<()> {
        let line = if json { format!("{e}\n") } else { event_lines(std::slice::from_ref(e)) };
        write_out(&line)
    };
    let end = api.follow(&a.id, a.after_seq, &mut print).await?;
    let line = if json { format!("{}\n", json!({"end": end})) } else { format!("end: {}\n", end_words(&end)) };
    write_out(&line)
}

/// `completed at 2026-…Z` from an `end` frame's data.
fn end_words(end: &Value) -> String {
    let status = end.get("status").and_then(Value::as_str).unwrap_or("finished");
    match end.get("finishedAt").and_then(Value::as_i64) {
        Some(at) => format!("{status} at {}", fmt_time(at)),
        None => status.to_owned(),
    }
}

/// `runs stop [--wait]`.
async fn stop(api: &Api, a: &StopArgs, json: bool) -> anyhow::Result<()> {
    let id = &a.id;
    let mode = a.mode.as_str();
    let mut v = api.call(reqwest::Method::POST, &format!("/api/runs/{id}/stop"), Some(json!({"mode": mode}))).await?;
    let state = v.get("state").and_then(Value::as_str).unwrap_or("stopping").to_owned();
    if !a.wait {
        return write_out(&if json { pretty(&v) } else { format!("{id}: {state} ({mode})\n") });
    }
    if !json {
        write_out(&format!("{id}: {state} ({mode}); waiting for the run to end\n"))?;
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
            Err(_) => return fail(Exit::Failure, format!("run {id} had not ended after {}", humantime::format_duration(t))),
        },
    };
    if json {
        v["ended"] = end;
        write_out(&pretty(&v))
    } else {
        write_out(&format!("{id}: ended {}\n", end_words(&end)))
    }
}

// ---------------------------------------------------------------------------------------------
// Store-only (a stopped server's database)
// ---------------------------------------------------------------------------------------------

fn from_db(db: &Path, args: &RunsArgs) -> anyhow::Result<String> {
    match &args.command {
        RunsCommand::Stop(_) | RunsCommand::Kill(_) => {
            return fail(Exit::Usage, "--db reads a stopped server's history; stop and kill need a running server (--url)")
        }
        RunsCommand::Events(a) if a.follow => {
            return fail(Exit::Usage, "--db reads a stopped server's history; --follow needs a running server (--url)")
        }
        RunsCommand::List(a) if a.status == StatusArg::Active => {
            return fail(Exit::Usage, "--db reads finished-run history only: --status active needs a running server (--url)")
        }
        _ => {}
    }
    // Read-only through the storage crate: never created, never migrated, an older schema read as is,
    // a newer one refused by name (SPEC §1.2, §8.2).
    let mut store = SqliteStore::open_read_only(db).with_context(|| format!("open database {} read-only", db.display()))?;
    let now = storage::SystemClock.now_ms();
    match &args.command {
        RunsCommand::List(a) => {
            let list = db_list(&mut store, a, now)?;
            if args.json {
                return Ok(pretty(&serde_json::to_value(&list)?));
            }
            Ok(list_table(&list, now))
        }
        RunsCommand::Get(a) => {
            let Some(record) = RunStore::get(&mut store, &a.id, now).context("read the run")? else {
                return fail(Exit::NotFound, format!("run {} not found", a.id));
            };
            let usage = record.head.extra.get("usage").filter(|u| u.as_object().is_some_and(|m| !m.is_empty())).cloned();
            let view = RunView { events: Some(record.events), ..RunView::from_head(&record.head) };
            let mut v = serde_json::to_value(&view)?;
            // The record's own per-model sum (SPEC §2 `usage`), which the view does not carry.
            if let (Some(u), Some(obj)) = (usage, v.as_object_mut()) {
                obj.insert("usage".into(), u);
            }
            with_outcome(&mut v, a.events);
            if args.json {
                return Ok(pretty(&v));
            }
            run_text(&v, now)
        }
        RunsCommand::Events(a) => {
            let mut after = a.after_seq;
            let mut events = Vec::new();
            let mut next;
            loop {
                let want = a.limit.map(|l| if a.all { l } else { l.saturating_sub(events.len() as u64).max(1) }).map(|l| l as usize);
                let Some(page) = RunStore::events(&mut store, &a.id, after, want, now).context("read events")? else {
                    return fail(Exit::NotFound, format!("run {} not found", a.id));
                };
                let got = page.events.len();
                events.extend(page.events);
                next = page.next_after_seq;
                let more_wanted = a.all || a.limit.is_some_and(|l| (events.len() as u64) < l);
                match next {
                    Some(n) if more_wanted && n > after && got > 0 => after = n,
                    _ => break,
                }
            }
            Ok(events_out(EventPage { events, next_after_seq: next }, args.json))
        }
        RunsCommand::Stop(_) | RunsCommand::Kill(_) => unreachable!("refused above"),
    }
}

/// `runs list --db`: one store page; a terminal status is the store's own filter (one indexed query; a
/// tombstone matches none: it is shown as unfinished, not as `interrupted`).
fn db_list(store: &mut SqliteStore, a: &ListArgs, now: i64) -> anyhow::Result<RunList> {
    let limit = a.limit.map_or(LIST_DEFAULT_LIMIT, |l| l as usize);
    let query = ListQuery {
        visible_to: VisibilityFilter::All,
        limit: Some(limit),
        before: a.before.map(|finished_at| Cursor { finished_at, id: a.before_id.clone() }),
        since_ms: a.since,
        agent: a.agent.clone(),
        channel: a.channel.clone(),
        thread_key: a.thread_key.clone(),
        parent_run_id: a.parent_run_id.clone(),
        status: a.status.terminal().and_then(storage::record::RunStatus::parse),
    };
    let page = store.list(&query, now).context("list runs")?;
    let runs = page.items.iter().map(|i| RunView::from_head(&i.head)).collect();
    let next_before = page.next_before;
    Ok(RunList {
        runs,
        next_before: next_before.map(|c| NextBefore { finished_at: c.finished_at, id: c.id }),
        store_unavailable: false,
        ledger_unavailable: false,
    })
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

fn pretty(v: &Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()))
}

/// Fill a RunView's `answer`, `error` and `stoppedBy` from its `events` where the view does not carry
/// them, then drop the events unless `keep_events`.
fn with_outcome(view: &mut Value, keep_events: bool) {
    let Some(obj) = view.as_object_mut() else { return };
    let events: Vec<Value> = obj.get("events").and_then(Value::as_array).cloned().unwrap_or_default();
    let last_of = |kind: &str| events.iter().rev().find(|e| e.get("type").and_then(Value::as_str) == Some(kind));
    if !obj.contains_key("answer") {
        if let Some(text) = last_of("answer").and_then(|e| e.get("text")).filter(|t| !t.is_null()) {
            obj.insert("answer".into(), text.clone());
        }
    }
    if !obj.contains_key("error") {
        if let Some(message) = last_of("run_failed").and_then(|e| e.get("message")).filter(|m| !m.is_null()) {
            obj.insert("error".into(), message.clone());
        }
    }
    if !obj.contains_key("stoppedBy") {
        // The strongest stop: a hard one over a soft one, else the first.
        let stops: Vec<&Value> = events.iter().filter(|e| e.get("type").and_then(Value::as_str) == Some("stop_requested")).collect();
        let stop = stops.iter().find(|e| e.get("mode").and_then(Value::as_str) == Some("hard")).or(stops.first());
        if let Some(e) = stop {
            let mut by = json!({"mode": e.get("mode").cloned().unwrap_or(Value::Null)});
            if let Some(actor) = e.get("actor") {
                by["actor"] = actor.clone();
            }
            obj.insert("stoppedBy".into(), by);
        }
    }
    if !obj.contains_key("usage") {
        if let Some(usage) = usage_of_events(&events) {
            obj.insert("usage".into(), usage);
        }
    }
    if !keep_events {
        obj.remove("events");
    }
}

/// Token usage summed per model over the `assistant` events that carry it (SPEC §8.3): the record's
/// `usage` shape, `{<model>: {inputTokens, outputTokens}}`; `None` when no event carries usage.
fn usage_of_events(events: &[Value]) -> Option<Value> {
    let mut sums: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e.get("type").and_then(Value::as_str) == Some("assistant")) {
        let Some(u) = e.get("usage").filter(|u| u.is_object()) else { continue };
        let model = e.get("model").and_then(Value::as_str).unwrap_or("-").to_owned();
        let sum = sums.entry(model).or_default();
        sum.0 += u.get("inputTokens").and_then(Value::as_u64).unwrap_or(0);
        sum.1 += u.get("outputTokens").and_then(Value::as_u64).unwrap_or(0);
    }
    (!sums.is_empty()).then(|| {
        Value::Object(sums.into_iter().map(|(m, (i, o))| (m, json!({"inputTokens": i, "outputTokens": o}))).collect())
    })
}

/// `usage` as one line per model: `gpt-4o: 30 in / 8 out`.
fn usage_words(usage: &Value) -> Option<String> {
    let lines: Vec<String> = usage
        .as_object()?
        .iter()
        .map(|(model, u)| {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            format!("{model}: {} in / {} out", n("inputTokens"), n("outputTokens"))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
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

/// `kind:id` of a stop actor, or `-`.
fn actor_words(actor: Option<&Value>) -> String {
    let s = |k: &str| actor.and_then(|a| a.get(k)).and_then(Value::as_str).unwrap_or("");
    match (s("kind"), s("id")) {
        ("", "") => "unknown".into(),
        (kind, "") => kind.to_owned(),
        ("", id) => id.to_owned(),
        (kind, id) => format!("{kind}:{id}"),
    }
}

/// A value as text: a string as is, anything else as JSON.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.get("text").is_some_and(Value::is_string) => o["text"].as_str().unwrap_or_default().to_owned(),
        other => other.to_string(),
    }
}

/// `runs get` as text: one `Key  value` line per field; the answer and the error in full (continuation
/// lines indented under the value).
fn run_text(raw: &Value, now: i64) -> anyhow::Result<String> {
    let v: RunView = decode(raw.clone(), "run")?;
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
    if let Some(by) = raw.get("stoppedBy").filter(|b| !b.is_null()) {
        let mode = by.get("mode").and_then(Value::as_str).unwrap_or("?");
        rows.push(("Stopped", format!("{mode}, by {}", actor_words(by.get("actor")))));
    } else if let Some(m) = v.stop {
        rows.push(("Stopped", format!("{}, by unknown", m.as_str())));
    }
    if let Some(e) = raw.get("error").filter(|e| !e.is_null()) {
        rows.push(("Error", text_of(e)));
    }
    if let Some(u) = raw.get("usage").and_then(usage_words) {
        rows.push(("Usage", u));
    }
    if let Some(a) = raw.get("answer").filter(|a| !a.is_null()) {
        rows.push(("Answer", text_of(a)));
    }
    let mut out = String::new();
    for (k, val) in rows {
        let _ = writeln!(out, "{k:<9} {}", val.replace('\n', "\n          "));
    }
    if let Some(evs) = &v.events {
        out.push('\n');
        out.push_str(&event_lines(evs));
    }
    Ok(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_ago_or_an_rfc3339_time() {
        let now = 1_800_000_000_000;
        assert_eq!(parse_since("1h", now), Ok(now - 3_600_000));
        assert_eq!(parse_since("90s", now), Ok(now - 90_000));
        assert_eq!(parse_since("2days", now), Ok(now - 2 * 86_400_000));
        // UTC and offsets both name the same instant.
        assert_eq!(parse_since("2027-01-15T08:00:00Z", now), Ok(1_800_000_000_000));
        assert_eq!(parse_since("2027-01-15T10:00:00+02:00", now), Ok(1_800_000_000_000));
        assert_eq!(parse_since("2027-01-15T08:00:00.250Z", now), Ok(1_800_000_000_250));
        assert!(parse_since("yesterday", now).is_err());
        assert!(parse_since("1700000000000", now).is_err(), "a bare number is neither");
    }

    #[test]
    fn http_statuses_map_to_exit_codes() {
        let cases = [(404, 3), (409, 4), (401, 5), (403, 5), (503, 6), (502, 6), (504, 6), (400, 1), (500, 1)];
        for (status, code) in cases {
            assert_eq!(Exit::from_http(status).code(), code, "HTTP {status}");
        }
        let e: anyhow::Error = anyhow::Error::new(CliError::new(Exit::Conflict, "x")).context("stop the run");
        assert_eq!(exit_code(&e), 4, "found below a context");
        assert_eq!(exit_code(&anyhow::anyhow!("other")), 1);
    }

    #[test]
    fn the_outcome_is_read_from_events_when_the_view_does_not_carry_it() {
        // A run that was soft-stopped by a token, then hard-stopped by its capability link, and failed.
        let mut v = json!({"id": "r1", "events": [
            {"type": "stop_requested", "seq": 5, "mode": "soft", "actor": {"kind": "token", "id": "ops"}},
            {"type": "stop_requested", "seq": 6, "mode": "hard", "actor": {"kind": "capability", "id": "r1"}},
            {"type": "run_failed", "seq": 7, "message": "model said no"},
        ]});
        with_outcome(&mut v, false);
        assert_eq!(v["stoppedBy"], json!({"mode": "hard", "actor": {"kind": "capability", "id": "r1"}}));
        assert_eq!(v["error"], "model said no");
        assert!(v.get("answer").is_none() && v.get("events").is_none());
        // A view that carries them is taken at its word.
        let mut v = json!({"id": "r1", "answer": "from the view", "events": [{"type": "answer", "text": "from events"}]});
        with_outcome(&mut v, true);
        assert_eq!(v["answer"], "from the view");
        assert!(v["events"].is_array());
    }

    #[test]
    fn usage_is_summed_per_model_from_assistant_events_and_printed() {
        let mut v = json!({"id": "r1", "events": [
            {"type": "assistant", "seq": 2, "model": "m1", "usage": {"inputTokens": 10, "outputTokens": 3}},
            {"type": "assistant", "seq": 4, "model": "m1", "usage": {"inputTokens": 20, "outputTokens": 5}},
            {"type": "assistant", "seq": 6, "model": "m2", "usage": {"inputTokens": 1, "outputTokens": 1}},
            {"type": "assistant", "seq": 7, "text": "no usage"},
        ]});
        with_outcome(&mut v, false);
        assert_eq!(v["usage"], json!({"m1": {"inputTokens": 30, "outputTokens": 8}, "m2": {"inputTokens": 1, "outputTokens": 1}}));
        assert_eq!(usage_words(&v["usage"]).as_deref(), Some("m1: 30 in / 8 out\nm2: 1 in / 1 out"));
        // A view that carries usage is taken at its word; none at all adds none.
        let mut v = json!({"id": "r1", "usage": {"x": {"inputTokens": 1, "outputTokens": 2}}, "events": []});
        with_outcome(&mut v, false);
        assert_eq!(v["usage"], json!({"x": {"inputTokens": 1, "outputTokens": 2}}));
        let mut v = json!({"id": "r1", "events": [{"type": "assistant", "text": "hi"}]});
        with_outcome(&mut v, false);
        assert!(v.get("usage").is_none());
    }
}
