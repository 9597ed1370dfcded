//! Server-Sent Events (SPEC §8.1): `GET /api/runs/{id}/stream` (one run) and `GET /runs/feed` (the index).
//!
//! Owns, per connection, one pump task and a bounded queue of frames to the client. Who feeds it: the
//! registry (a run this process drives), the ledger (a run live under another generation: read again at
//! every cross-host note about it on PostgreSQL, else polled every 500 ms) and the store (a finished
//! run's record).
//!
//! Run stream frames: `id: <seq>` / `event: run_event` / `data: <event JSON>` per event, strictly after the
//! cursor (`Last-Event-ID`, else `?afterSeq`, else 0), then `event: end` / `data: {status, finishedAt}` once
//! the run has finished; `: ping` every 15 s.
//!
//! Invariants:
//! - the same event is never sent twice on one connection and a resume (`Last-Event-ID`) has no gap: the
//!   registry hands out its backlog and the live queue under one lock, and every source is keyed by seq;
//! - a slow client never slows a run: the registry drops a subscriber whose queue is full (in events or
//!   bytes), and the stream then closes without `end` (the browser reconnects with `Last-Event-ID`);
//! - a client's memory is bounded in bytes: its frame queue holds at most [`CLIENT_QUEUE_BYTES`] (frames
//!   share the registry's event JSON), and a client that takes nothing for [`STALL_LIMIT`] is dropped with
//!   its queue released at once;
//! - a denied or unavailable read closes the stream without `end` (an `end` is a claim about the run);
//! - a disconnected client is noticed at the latest by the next ping, and its task ends.

use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::queue::{self, SendError};
use actors::registry::Published;
use actors::runs_service::{
    settled_prefix, FeedChange, IndexFeed, RunView, RunsError, RunsService,
};
use serde_json::{json, Value};
use storage::record::{event_seq, VisibilityFilter};
use tokio::time::{interval_at, Instant, Interval};

use super::api::{after_seq, query_map, reader, runs_error, seq_cursor};
use super::resource;
use crate::auth::RUNS_READ;
use crate::error::ApiError;
use crate::AppState;

/// Keep-alive comment period.
pub const PING_EVERY: Duration = Duration::from_secs(15);
/// How often a run live under another generation (and the index feed) is polled without cross-host news.
pub const POLL_EVERY: Duration = Duration::from_millis(500);
/// With cross-host news a follower reads at every note about its run, and at least this often (a note
/// is a hint; this bounds what a lost one costs).
pub const NEWS_SAFETY_POLL: Duration = Duration::from_secs(30);
/// Frames queued for one client before its pump waits (and, behind it, the registry drops it).
const CLIENT_QUEUE: usize = 64;
/// Bytes queued for one client before its pump waits: twice the largest event (64 KiB).
pub const CLIENT_QUEUE_BYTES: usize = 128 * 1024;
/// The largest piece of a frame handed to the server's connection writer.
const WRITE_SLICE: usize = 8 * 1024;
/// A client whose queue has had no room for this long is dropped and its queue released.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);
/// Events per ledger or store read while following or replaying (a stalled client pins at most one
/// read, for at most [`STALL_LIMIT`]).
const READ_CHUNK: usize = 100;

/// One SSE frame in shared pieces: its `id:`/`event:`/`data: ` lines, then the JSON (the registry's own
/// bytes for a run event), then the blank line.
struct Frame {
    head: Bytes,
    data: Bytes,
}

impl Frame {
    fn event(event: &str, id: Option<u64>, data: Bytes) -> Frame {
        let id = id.map(|s| format!("id: {s}\n")).unwrap_or_default();
        Frame {
            head: Bytes::from(format!("{id}event: {event}\ndata: ")),
            data,
        }
    }

    fn json(event: &str, data: &Value) -> Frame {
        Frame::event(event, None, Bytes::from(data.to_string()))
    }

    /// A frame of its own lines (`retry:`, a ping).
    fn raw(text: &'static [u8]) -> Frame {
        Frame {
            head: Bytes::from_static(text),
            data: Bytes::new(),
        }
    }

    fn len(&self) -> usize {
        self.head.len() + self.data.len() + 2
    }
}

/// A connection's frame queue.
type FrameTx = queue::Sender<Frame>;

/// Queue `frame` for the client, waiting at most [`STALL_LIMIT`] for room.
async fn send_frame(tx: &FrameTx, frame: Frame) -> Result<(), Closed> {
    let n = frame.len();
    match tokio::time::timeout(STALL_LIMIT, tx.send(frame, n)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(SendError::Closed)) => Err("client gone"),
        Ok(Err(SendError::Overflow)) => Err("frame over the client queue"),
        Err(_) => Err("client stalled"),
    }
}

/// Run a pump feeding `queue`; one that stops without `end` releases the queue at once (a stalled client
/// may never read it, and reconnects with `Last-Event-ID` if it ever does). The pump first runs here, in
/// the request's task, up to its first wait: what it has at hand (the `retry:` line, a run's backlog) is
/// queued before the caller's response is written, so the response head and those frames go out in one
/// write, not two (issue 29); the rest runs as a task of its own, whose first poll takes over the wakers.
async fn spawn_pump(
    queue: FrameTx,
    pump: impl std::future::Future<Output = Result<(), Closed>> + 'static,
    what: &'static str,
    run_id: Option<RunId>,
) {
    let mut task = Box::pin(async move {
        if let Err(why) = pump.await {
            queue.abandon();
            tracing::debug!(
                run_id = run_id.as_deref().unwrap_or(""),
                what,
                why,
                "stream closed without end"
            );
        }
    });
    if futures_util::poll!(task.as_mut()).is_pending() {
        actix_web::rt::spawn(task);
    }
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    // `/runs/feed` must win over the HTML `/runs/{id}`: `web::configure` runs this before `html`.
    cfg.service(resource("/api/runs/{id}/stream", "GET").route(web::get().to(stream_run)))
        .service(resource("/runs/feed", "GET").route(web::get().to(index_feed)));
}

/// The SSE response over a frame queue: each frame goes out as its pieces (no copy of the JSON here).
fn sse_response(rx: queue::Receiver<Frame>) -> HttpResponse {
    let body = futures_util::stream::unfold(
        (rx, Vec::<Bytes>::new()),
        |(mut rx, mut pieces)| async move {
            if pieces.is_empty() {
                let frame = rx.recv().await?;
                // Last piece first (they are popped). The JSON goes in slices of the shared bytes: the server
                // copies a piece into a connection's write buffer only while that buffer has room, so a
                // stalled connection holds at most about one slice beyond it.
                pieces.push(Bytes::from_static(b"\n\n"));
                let n = frame.data.len();
                let starts: Vec<usize> = (0..n).step_by(WRITE_SLICE).collect();
                pieces.extend(
                    starts
                        .into_iter()
                        .rev()
                        .map(|at| frame.data.slice(at..n.min(at + WRITE_SLICE))),
                );
                pieces.push(frame.head);
            }
            let piece = pieces.pop()?;
            Some((Ok::<Bytes, actix_web::Error>(piece), (rx, pieces)))
        },
    );
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .insert_header(("content-encoding", "identity"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(body)
}

fn ping_frame() -> Frame {
    Frame::raw(b": ping")
}

fn pinger() -> Interval {
    interval_at(Instant::now() + PING_EVERY, PING_EVERY)
}

/// `GET /api/runs/{id}/stream`.
#[utoipa::path(
    get,
    path = "/api/runs/{id}/stream",
    tag = "runs",
    params(
        ("id" = String, Path, description = "Run id"),
        ("token" = Option<String>, Query, description = "The run's capability token (instead of a bearer token)"),
        ("afterSeq" = Option<u64>, Query, description = "Events strictly after this seq (`Last-Event-ID` wins)"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events, one frame per event: `id: <seq>`, `event: run_event`, `data: <a RunEvent as JSON>` (see the `RunEvent` schema: one per `type`); once the run has finished, `event: end` with `data: {status, finishedAt}`; a `: ping` comment every 15 s. Reconnect with `Last-Event-ID` to resume after a seq.", content_type = "text/event-stream", body = String),
        (status = 400, description = "A bad cursor", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody), (status = 403, description = "The token lacks the scope, or a cross-site request", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such run the caller may see", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:read"]))
)]
async fn stream_run(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = RunId::from(path.into_inner());
    let q = query_map(&req)?;
    let visible_to = reader(&req, &state, Some(&id), &q)?;
    let last_event_id = match req.headers().get("last-event-id") {
        None => None,
        Some(v) => Some(seq_cursor("Last-Event-ID", v.to_str().unwrap_or("-"))?),
    };
    let after = match last_event_id {
        Some(seq) => seq,
        None => after_seq(&q, "afterSeq")?.unwrap_or(0),
    };
    // Resolve (and authorize) before answering 200, so an unknown or hidden run is a plain 404.
    state
        .runs
        .get_run(&id, false, &visible_to)
        .await
        .map_err(|e| runs_error(e, &id))?;
    let (tx, rx) = queue::bounded(CLIENT_QUEUE, CLIENT_QUEUE_BYTES);
    let runs = state.runs.clone();
    let run_id = Some(id.clone());
    spawn_pump(
        tx.clone(),
        async move {
            RunStream {
                runs,
                id,
                last: after,
                visible_to,
                tx,
                ping: pinger(),
            }
            .pump()
            .await
        },
        "run",
        run_id,
    )
    .await;
    Ok(sse_response(rx))
}

/// One run stream's pump.
struct RunStream {
    runs: RunsService,
    id: RunId,
    /// The highest seq sent (or the client's cursor).
    last: u64,
    visible_to: VisibilityFilter,
    tx: FrameTx,
    ping: Interval,
}

/// Why a pump stopped without `end`.
type Closed = &'static str;

impl RunStream {
    async fn send(&mut self, frame: Frame) -> Result<(), Closed> {
        send_frame(&self.tx, frame).await
    }

    /// How `event` goes out: `None` when it is at or before the cursor. A streamed text delta is its own
    /// event type with no `id:` (so `Last-Event-ID` is untouched) and is never replayed (SPEC §8.3 `stream`).
    fn kind(&self, event: &Value) -> Option<(&'static str, Option<u64>)> {
        if event.get("type").and_then(Value::as_str) == Some("assistant_delta") {
            return Some(("assistant_delta", None));
        }
        let seq = event_seq(event);
        if seq.is_some_and(|s| s <= self.last) {
            return None;
        }
        Some(("run_event", seq))
    }

    async fn emit_json(
        &mut self,
        kind: (&'static str, Option<u64>),
        json: Bytes,
    ) -> Result<(), Closed> {
        self.send(Frame::event(kind.0, kind.1, json)).await?;
        if let (_, Some(s)) = kind {
            self.last = s;
        }
        Ok(())
    }

    /// Send `event` (read from the ledger or the store) unless it is at or before the cursor.
    async fn emit(&mut self, event: &Value) -> Result<(), Closed> {
        match self.kind(event) {
            Some(kind) => self.emit_json(kind, Bytes::from(event.to_string())).await,
            None => Ok(()),
        }
    }

    /// Send a registry event with the registry's own JSON bytes.
    async fn emit_published(&mut self, p: &Published) -> Result<(), Closed> {
        match self.kind(&p.event) {
            Some(kind) => self.emit_json(kind, p.json.clone()).await,
            None => Ok(()),
        }
    }

    async fn end(&mut self, view: &RunView) -> Result<(), Closed> {
        let mut data = json!({"status": view.status, "finishedAt": view.finished_at});
        if view.provisional == Some(true) {
            data["provisional"] = json!(true);
        }
        self.send(Frame::json("end", &data)).await
    }

    async fn pump(&mut self) -> Result<(), Closed> {
        self.send(Frame::raw(b"retry: 2000")).await?;
        if self.follow_registry().await? {
            return Ok(());
        }
        self.follow_ledger().await?;
        self.replay_record().await
    }

    /// A run in this process's registry: backlog, then live events until it finishes. Answers whether
    /// the stream is complete (`end` sent); `false` when the registry no longer holds the run.
    async fn follow_registry(&mut self) -> Result<bool, Closed> {
        let Some((backlog, mut rx, finished)) = self.runs.registry.subscribe(&self.id, self.last)
        else {
            return Ok(false);
        };
        for e in &backlog {
            self.emit_published(e).await?;
        }
        drop(backlog);
        if !finished {
            loop {
                tokio::select! {
                    next = rx.recv() => match next {
                        // The run's end rides its queue: the stream is complete whatever the registry
                        // holds by now (a sealed run leaves it at once).
                        Some(e) if e.as_end().is_some() => {
                            self.send(Frame::event("end", None, e.json.clone())).await?;
                            return Ok(true);
                        }
                        Some(e) => self.emit_published(&e).await?,
                        None => break,
                    },
                    _ = self.ping.tick() => self.send(ping_frame()).await?,
                }
            }
        }
        drop(rx);
        match self.runs.registry.row(&self.id) {
            Some(row) if row.finished_at.is_some() => {
                // Anything published between the queue closing and now (normally nothing).
                if let Some((rest, _, _)) = self.runs.registry.subscribe(&self.id, self.last) {
                    for e in &rest {
                        self.emit_published(e).await?;
                    }
                }
                let view = RunView::from_registry(&row);
                self.end(&view).await?;
                Ok(true)
            }
            Some(_) => {
                tracing::info!(run_id = %self.id, "dropped a run stream that fell behind");
                Err("fell behind")
            }
            // Discarded here (handed off, fenced): follow it wherever it went.
            None => Ok(false),
        }
    }

    /// A run live under another generation: read its ledger events until its row goes — again at every
    /// cross-host note about it (PostgreSQL), else every [`POLL_EVERY`].
    ///
    /// Only the settled prefix of each read is sent ([`settled_prefix`]): the ledger's events commit out
    /// of seq order, and a follower that moved past a gap would skip the late events for good.
    async fn follow_ledger(&mut self) -> Result<(), Closed> {
        // Taken before the first read, so a note landing between a read and the wait is not missed.
        let mut news = self.runs.follow_news(&self.id);
        // Whether this read follows a note (or is the first): then the run's followers that woke at the
        // same note share one read. A timer's read (a gap turning final, the safety poll) reads alone.
        let mut noted = true;
        loop {
            let seen = news.as_mut().map(|rx| *rx.borrow_and_update());
            let read = match seen.filter(|_| noted) {
                Some(notes) => {
                    self.runs
                        .read_followed(&self.id, self.last, READ_CHUNK, notes)
                        .await
                }
                None => self
                    .runs
                    .ledger_events(&self.id, self.last, READ_CHUNK)
                    .await
                    .map(|p| p.map(Arc::new)),
            };
            noted = true;
            let page = match read {
                Ok(Some(page)) => page,
                Ok(None) => return Ok(()),
                Err(_) => return Err("ledger unavailable"),
            };
            let (settled, gap_final_at) =
                settled_prefix(&page, self.last, self.runs.clock.now_ms());
            for e in &page[..settled] {
                self.emit(e).await?;
            }
            if gap_final_at.is_some() || page.len() < READ_CHUNK {
                let mut poll = if news.is_some() {
                    NEWS_SAFETY_POLL
                } else {
                    POLL_EVERY
                };
                if let Some(at) = gap_final_at {
                    let wait = u64::try_from(at - self.runs.clock.now_ms()).unwrap_or(0);
                    poll = poll.min(Duration::from_millis(wait));
                }
                tokio::select! {
                    _ = tokio::time::sleep(poll) => noted = false,
                    woke = changed(&mut news) => {
                        // A closed feed (storage gone) falls back to polling.
                        if woke.is_err() {
                            news = None;
                        }
                    }
                    _ = self.ping.tick() => self.send(ping_frame()).await?,
                }
            }
        }
    }

    /// The stored record: the events past the cursor, then `end`.
    async fn replay_record(&mut self) -> Result<(), Closed> {
        let view = match self.runs.stored_summary(&self.id, &self.visible_to).await {
            Ok(v) => v,
            Err(RunsError::NotFound) => return Err("no record (killed or hidden)"),
            Err(_) => return Err("store unavailable"),
        };
        loop {
            let page = self
                .runs
                .stored_event_page(&self.id, self.last, READ_CHUNK)
                .await
                .map_err(|_| "store unavailable")?;
            for e in &page.events {
                self.emit(e).await?;
            }
            match page.next_after_seq {
                Some(next) if next > self.last => self.last = next,
                Some(_) | None => break,
            }
        }
        self.end(&view).await
    }
}

/// The next cross-host note about the followed run (never, without news).
async fn changed(
    news: &mut Option<tokio::sync::watch::Receiver<u64>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match news {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

/// `GET /runs/feed`: the index feed — `upsert` (a RunView without events) when a run appears or changes
/// (one that started and finished between two polls included), `removed` `{id}` when a run shown goes
/// without a record or is killed ([`IndexFeed`]).
async fn index_feed(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let visible_to = state.auth.require(&req, RUNS_READ)?.visible_to;
    let (tx, rx) = queue::bounded(CLIENT_QUEUE, CLIENT_QUEUE_BYTES);
    let runs = state.runs.clone();
    spawn_pump(tx.clone(), feed_pump(runs, visible_to, tx), "feed", None).await;
    Ok(sse_response(rx))
}

async fn feed_pump(
    runs: RunsService,
    visible_to: VisibilityFilter,
    tx: FrameTx,
) -> Result<(), Closed> {
    send_frame(&tx, Frame::raw(b"retry: 2000")).await?;
    let mut feed = IndexFeed::new(&runs, visible_to);
    let mut poll = tokio::time::interval(POLL_EVERY);
    let mut ping = pinger();
    loop {
        tokio::select! {
            _ = poll.tick() => {}
            _ = ping.tick() => {
                send_frame(&tx, ping_frame()).await?;
                continue;
            }
        }
        for change in feed.poll(&runs).await {
            let frame = match change {
                FeedChange::Upsert(view) => Frame::json(
                    "upsert",
                    &serde_json::to_value(&view).unwrap_or(Value::Null),
                ),
                FeedChange::Removed(id) => Frame::json("removed", &json!({"id": id})),
            };
            send_frame(&tx, frame).await?;
        }
    }
}
