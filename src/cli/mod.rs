//! `switchboard runs list|get|events|stop|kill|retry` (SPEC §8.2).
//!
//! Two ways to read: against a running server's JSON API (`--url`, default `$SWITCHBOARD_URL` or
//! `http://127.0.0.1:8080`, with `--token` / `$SWITCHBOARD_TOKEN` as the bearer token), or `--db PATH`:
//! store-only reads of a stopped server's SQLite database, opened read-only through the storage crate
//! (never created, never migrated: an older schema is read as is, a newer one refused by name). Output is
//! a human table by default and the API's JSON shapes with `--json` (the same shapes in both modes).
//!
//! A store-only reader sees no live state: a provisional record (the tombstone a run writes at start)
//! renders as `unfinished — no finish recorded`, never as `interrupted`. Stop, kill, retry and `--follow`
//! need a server.
//!
//! Owns nothing but its HTTP client; [`run`] is called outside any async runtime and starts its own
//! actix system for HTTP.
//!
//! # Layout
//! - this module: the arguments (clap), the exit codes, the entry [`run`];
//! - `server`: reads and commands against a running server (`--url`): the HTTP client, the stream
//!   follower;
//! - `db`: store-only reads of a stopped server's database (`--db`);
//! - `print`: what both print — the tables, `runs get` as text, event lines — and the outcome read from
//!   a run's events.
//!
//! Invariants:
//! - each subcommand lists only the flags it honours: `--url`, `--token` and `--json` are global (every
//!   subcommand talks to a server and prints), `--db` belongs to `list`, `get` and `events`. `stop`, `kill`
//!   and `retry` accept a hidden `--db` only to refuse it with exit 2 saying a running server is needed,
//!   and `runs --db PATH <list|get|events>` (before the subcommand, as when `--db` was global) still reads;
//! - arguments the API would refuse are refused by clap first (exit 2 naming the flag): closed sets are
//!   [`clap::ValueEnum`]s, `--limit` is checked against the API's caps, run ids against the id shape;
//! - every failure maps to one [`Exit`] code: the HTTP status of the answer (404 → 3, 409 → 4, 401/403
//!   → 5, 502/503/504 → 6) or a transport failure (refused, reset or timed out → 6), see [`exit_code`];
//! - `--db` never writes: it goes through [`storage::SqliteStore::open_read_only`] and only calls readers.
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

mod db;
mod print;
mod server;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use storage::RunId;

use anyhow::Context;
use serde_json::Value;
use storage::record::is_valid_run_id;
use storage::store::{EVENTS_MAX_LIMIT, LIST_MAX_LIMIT};
use storage::Clock;

use db::from_db;
use server::{from_server, Api};

const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// A stream that sends nothing (not even the 15 s `: ping`) for this long is taken as dead and reopened.
pub const STREAM_IDLE: Duration = Duration::from_secs(45);
/// A follower that cannot get a working stream back for this long gives up (exit 6).
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

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
        CliError {
            exit,
            answer: None,
            message: message.into(),
        }
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
    /// `runs --db PATH list`: `--db` before the subcommand, as it was given when it was global (not
    /// listed; the subcommands that read a database list their own).
    #[arg(long, value_name = "PATH", conflicts_with = "url", hide = true)]
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
    /// Run a run again: a new run on its thread from its original request, whose parent is the run
    /// (needs a server and the messages:write scope); prints the new run's id and live URL.
    Retry(RetryArgs),
}

impl RunsArgs {
    /// The database to read, when one was given (before or after the subcommand).
    pub fn db(&self) -> Option<&Path> {
        let given = match &self.command {
            RunsCommand::List(a) => &a.db.db,
            RunsCommand::Get(a) => &a.db.db,
            RunsCommand::Events(a) => &a.db.db,
            RunsCommand::Stop(a) => &a.db.db,
            RunsCommand::Kill(a) => &a.db.db,
            RunsCommand::Retry(a) => &a.db.db,
        };
        self.db.as_deref().or(given.as_deref())
    }
}

/// `--db`, on the subcommands that can read a stopped server's database.
#[derive(Debug, clap::Args)]
pub struct DbArg {
    /// Read a stopped server's database directly, read-only (finished runs only).
    #[arg(long, value_name = "PATH", conflicts_with = "url")]
    pub db: Option<PathBuf>,
}

/// `--db` on a subcommand that needs a running server: not listed, accepted only to be refused with a
/// usage error that says why.
#[derive(Debug, clap::Args)]
pub struct NoDbArg {
    /// Refused: this command needs a running server (`--url`).
    #[arg(long, value_name = "PATH", hide = true)]
    pub db: Option<PathBuf>,
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
    pub parent_run_id: Option<RunId>,
    /// Only runs finished (or, still live, started) since then: a duration ago (`1h`, `30m`, `2days`)
    /// or an RFC 3339 time (`2026-05-01T12:00:00Z`).
    #[arg(long, value_name = "WHEN", value_parser = since_ms)]
    pub since: Option<i64>,
    /// Cursor from a previous page's `more:` line: runs finished before this epoch ms …
    #[arg(long, value_name = "EPOCH_MS")]
    pub before: Option<i64>,
    /// … and, in that same millisecond, with a smaller id.
    #[arg(long, value_name = "ID", requires = "before", value_parser = run_id)]
    pub before_id: Option<RunId>,
    #[command(flatten)]
    pub db: DbArg,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: RunId,
    /// Include its events.
    #[arg(long)]
    pub events: bool,
    #[command(flatten)]
    pub db: DbArg,
}

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: RunId,
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
    #[command(flatten)]
    pub db: DbArg,
}

#[derive(Debug, clap::Args)]
pub struct StopArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: RunId,
    /// How to stop.
    #[arg(long, value_enum, default_value_t = StopModeArg::Soft)]
    pub mode: StopModeArg,
    /// Return only once the run has ended (follows its stream to `end`).
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (`30s`, `5m`); exit 1, the run keeps stopping.
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = duration)]
    pub timeout: Option<Duration>,
    #[command(flatten)]
    pub db: NoDbArg,
}

#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// The run id.
    #[arg(value_parser = run_id)]
    pub id: RunId,
    #[command(flatten)]
    pub db: NoDbArg,
}

#[derive(Debug, clap::Args)]
pub struct RetryArgs {
    /// The run to run again (finished or live; its thread's live run, if any, takes the request as a
    /// follow-up instead).
    #[arg(value_parser = run_id)]
    pub id: RunId,
    /// Idempotency key (1 to 256 characters): retrying again with the same key answers the same run.
    #[arg(long, value_parser = retry_key)]
    pub key: Option<String>,
    #[command(flatten)]
    pub db: NoDbArg,
}

/// clap parser: the run id shape (ASCII letters, digits, `-` and `_`).
fn run_id(s: &str) -> Result<RunId, String> {
    if is_valid_run_id(s) {
        Ok(s.into())
    } else {
        Err("not a run id (1 to 128 ASCII letters, digits, '-' or '_')".into())
    }
}

/// clap parser: an idempotency key (1 to 256 characters, as the API takes it).
fn retry_key(s: &str) -> Result<String, String> {
    match s.chars().take(257).count() {
        1..=256 => Ok(s.to_owned()),
        _ => Err("must be 1 to 256 characters".into()),
    }
}

/// clap parser: a humantime duration (`30s`, `5m`, `1h 30m`).
fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{e} (expected a duration like 30s, 5m or 1h)"))
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
        Err(_) => Err(
            "expected a duration ago (1h, 30m, 2days) or an RFC 3339 time (2026-05-01T12:00:00Z)"
                .into(),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Entry
// ---------------------------------------------------------------------------------------------

/// Carry out `switchboard runs …`. Map its error to the exit code with [`exit_code`].
pub fn run(args: RunsArgs) -> anyhow::Result<()> {
    let result = match args.db() {
        Some(db) => from_db(db, &args).and_then(|out| write_out(&out)),
        None => {
            let url = args
                .url
                .clone()
                .or_else(|| std::env::var("SWITCHBOARD_URL").ok())
                .unwrap_or_else(|| DEFAULT_URL.into());
            let token = args
                .token
                .clone()
                .or_else(|| std::env::var("SWITCHBOARD_TOKEN").ok())
                .filter(|t| !t.is_empty());
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
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Print to stdout now (follow output is printed as it comes).
fn write_out(s: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes())
        .and_then(|_| out.flush())
        .context("write to stdout")
}

/// `v` as a wire type; an answer that does not decode names `what`.
fn decode<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> anyhow::Result<T> {
    serde_json::from_value(v).with_context(|| format!("decode the server's {what}"))
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
        assert_eq!(
            parse_since("2027-01-15T08:00:00Z", now),
            Ok(1_800_000_000_000)
        );
        assert_eq!(
            parse_since("2027-01-15T10:00:00+02:00", now),
            Ok(1_800_000_000_000)
        );
        assert_eq!(
            parse_since("2027-01-15T08:00:00.250Z", now),
            Ok(1_800_000_000_250)
        );
        assert!(parse_since("yesterday", now).is_err());
        assert!(
            parse_since("1700000000000", now).is_err(),
            "a bare number is neither"
        );
    }

    #[test]
    fn http_statuses_map_to_exit_codes() {
        let cases = [
            (404, 3),
            (409, 4),
            (401, 5),
            (403, 5),
            (503, 6),
            (502, 6),
            (504, 6),
            (400, 1),
            (500, 1),
        ];
        for (status, code) in cases {
            assert_eq!(Exit::from_http(status).code(), code, "HTTP {status}");
        }
        let e: anyhow::Error =
            anyhow::Error::new(CliError::new(Exit::Conflict, "x")).context("stop the run");
        assert_eq!(exit_code(&e), 4, "found below a context");
        assert_eq!(exit_code(&anyhow::anyhow!("other")), 1);
    }
}
