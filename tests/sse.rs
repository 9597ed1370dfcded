//! End to end: Server-Sent Events (SPEC §8.1) — `GET /api/runs/{id}/stream` and the index feed
//! `GET /runs/feed`, read with an SSE client (`eventsource-stream` over reqwest).

mod support;

use std::time::Duration;
use storage::RunId;

use futures_util::StreamExt;
use serde_json::json;
use storage::record::RunStatus;
use support::{SseEvent, TestApp};

const WAIT: Duration = Duration::from_secs(30);

fn seqs(events: &[SseEvent]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            assert_eq!(e.event, "run_event");
            let seq = e.data["seq"].as_u64().expect("seq");
            assert_eq!(e.id, seq.to_string(), "the SSE id is the event's seq");
            seq
        })
        .collect()
}

/// The identity of a public run on thread `c1:<label>` that a test publishes to itself, standing in for
/// a run actor.
fn public_meta(label: &str) -> actors::registry::RunMeta {
    actors::registry::RunMeta {
        agent: "demo".into(),
        model: "scripted".into(),
        label: label.into(),
        thread_key: format!("c1:{label}"),
        channel_id: "c1".into(),
        user_id: "u1".into(),
        channel_visibility: storage::record::ChannelVisibility::Public,
        parent_run_id: None,
    }
}

#[actix_web::test]
async fn a_live_stream_sends_every_event_with_its_seq_then_end_after_the_finish() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=3 ms=150").await;
    let (status, reader) = app.sse(&format!("/api/runs/{id}/stream"), None, None).await;
    assert_eq!(status, 200);
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    let end = end.expect("end after the finish");
    assert_eq!(end.data["status"], "completed");
    let got = seqs(&events);
    let record = app.final_record(&id).await;
    let stored: Vec<u64> = record
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        got, stored,
        "every event once, in order, the same seqs as the record"
    );
    assert_eq!(
        end.data["finishedAt"].as_i64(),
        Some(record.head.finished_at)
    );
    assert_eq!(events.last().unwrap().data["type"], "answer");
}

#[actix_web::test]
async fn a_reconnect_with_last_event_id_resumes_with_no_gap_and_no_duplicate() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=4 ms=250").await;
    let path = format!("/api/runs/{id}/stream");
    let (_, reader) = app.sse(&path, None, None).await;
    let mut reader = reader.unwrap();
    let mut first = Vec::new();
    while first.len() < 4 {
        first.push(reader.next(WAIT).await.expect("an event"));
    }
    drop(reader);
    let last: u64 = first.last().unwrap().id.parse().unwrap();
    // The browser sends Last-Event-ID; it wins over a stale ?afterSeq in the URL.
    let (status, reader) = app
        .sse(&format!("{path}?afterSeq=1"), None, Some(last))
        .await;
    assert_eq!(status, 200);
    let (rest, end) = reader.unwrap().until_end(WAIT).await;
    assert!(end.is_some());
    let mut all = seqs(&first);
    all.extend(seqs(&rest));
    let record = app.final_record(&id).await;
    let stored: Vec<u64> = record
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(all, stored);
    assert_eq!(seqs(&rest)[0], last + 1);
}

#[actix_web::test]
async fn a_finished_run_replays_then_ends_from_the_registry_and_from_the_store() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=2 ms=0").await;
    let record = app.final_record(&id).await;
    let stored: Vec<u64> = record
        .events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    // Still in the registry (finished rows stay 60 s).
    let (_, reader) = app.sse(&format!("/api/runs/{id}/stream"), None, None).await;
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    assert_eq!(seqs(&events), stored);
    assert_eq!(end.unwrap().data["status"], "completed");
    // Served from the store once the registry let it go; `afterSeq` skips what the client has.
    app.running.registry.discard(&RunId::from(&id));
    let (_, reader) = app
        .sse(&format!("/api/runs/{id}/stream?afterSeq=3"), None, None)
        .await;
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    assert_eq!(seqs(&events), stored[3..].to_vec());
    let end = end.expect("end after a replay");
    assert_eq!(
        (end.data["status"].as_str(), end.data["finishedAt"].as_i64()),
        (Some("completed"), Some(record.head.finished_at))
    );
    // A cursor at the end replays nothing and still ends.
    let last = *stored.last().unwrap();
    let (_, reader) = app
        .sse(&format!("/api/runs/{id}/stream"), None, Some(last))
        .await;
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    assert!(events.is_empty() && end.is_some());
}

/// A run's live publisher floods a stream whose client reads nothing. The registry's bounded queue for
/// that subscriber (behind the connection's own queue and the socket buffers) fills, the registry drops
/// the subscriber instead of waiting for it, and the server closes the stream without `end`; the
/// publisher never waited. The browser then reconnects with `Last-Event-ID` and misses nothing.
#[actix_web::test]
async fn a_slow_stream_is_dropped_by_the_server_and_never_slows_the_run() {
    use actors::registry::SUBSCRIBER_QUEUE_BYTES;
    use tokio::time::Instant;

    let app = TestApp::spawn().await;
    let registry = app.running.registry.clone();
    // The publisher stands in for a run actor: a live registry row, published to the way a run does.
    let id = "slow-viewer-run";
    let meta = public_meta("flood");
    registry.create(
        &RunId::from(id),
        meta,
        1_000,
        "capability".into(),
        vec![],
        1,
    );
    assert_eq!(registry.subscriber_count(), 0);

    // Open the stream and never read it while the flood goes on.
    let res = app
        .client
        .get(app.url(&format!("/api/runs/{id}/stream")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let subscribed = support::wait_until(WAIT, || {
        let n = registry.subscriber_count();
        async move { (n == 1).then_some(()) }
    })
    .await;
    assert!(subscribed.is_some(), "the stream never subscribed");

    // Publish until the server gives up on the subscriber: far more than its queue holds, because the
    // connection's queue and the socket buffers take some first. Each publish answers at once.
    let filler = "x".repeat(4 * 1024);
    let (mut published, mut slowest) = (0u64, Duration::ZERO);
    let flood = Instant::now();
    while registry.subscriber_count() > 0 {
        assert!(
            published < 20_000,
            "20,000 unread events and the slow subscriber is still attached"
        );
        let t = Instant::now();
        let stamped = registry.publish(
            &RunId::from(id),
            json!({"type": "note", "kind": "filler", "summary": filler}),
        );
        slowest = slowest.max(t.elapsed());
        published += 1;
        assert_eq!(stamped.and_then(|e| e["seq"].as_u64()), Some(published));
    }
    let flooded = published as usize * filler.len();
    assert!(
        flooded > SUBSCRIBER_QUEUE_BYTES,
        "dropped after {flooded} bytes, before its queue was full"
    );
    // Dropped means released: nothing stays queued for it.
    assert_eq!(registry.subscriber_queued_bytes(), 0);
    assert!(
        slowest < Duration::from_millis(500),
        "a publish waited {slowest:?} for the slow subscriber"
    );
    eprintln!(
        "subscriber dropped after {published} events in {:?} (slowest publish {slowest:?})",
        flood.elapsed()
    );
    // The run is still live, and every event was counted.
    let row = registry.row(&RunId::from(id)).expect("the row");
    assert_eq!((row.finished_at, row.event_count), (None, published));

    // Now read: a contiguous prefix from seq 1, then the server closes the stream — no `end`, since the
    // run has not ended.
    let mut reader = support::SseReader::new(res);
    let (events, end) = reader.until_end(WAIT).await;
    assert!(
        end.is_none(),
        "an `end` for a run that is still live: {end:?}"
    );
    let got = seqs(&events);
    assert_eq!(got.first(), Some(&1));
    assert!(
        got.windows(2).all(|w| w[1] == w[0] + 1),
        "a gap in the slow stream"
    );
    let last = *got.last().unwrap();
    assert!(
        last < published,
        "the dropped stream delivered everything ({last} of {published})"
    );

    // The browser reconnects with Last-Event-ID: the rest, with no gap and no duplicate, then `end`.
    registry.finish(&RunId::from(id), RunStatus::Completed, 2_000);
    let (status, reader) = app
        .sse(&format!("/api/runs/{id}/stream"), None, Some(last))
        .await;
    assert_eq!(status, 200);
    let (rest, end) = reader.unwrap().until_end(WAIT).await;
    assert_eq!(seqs(&rest), (last + 1..=published).collect::<Vec<_>>());
    assert_eq!(
        end.expect("end after the finish").data["status"],
        "completed"
    );
}

/// Many viewers that stop reading a run of large events (SPEC §8.1; issue 24 item 4): each is dropped
/// once its queue is full in bytes — long before its event count would be — and pins nothing after,
/// while a viewer that reads gets every event in order and admissions carry on.
#[actix_web::test]
async fn many_stalled_streams_of_large_events_are_dropped_and_pin_nothing_while_a_reader_keeps_up()
{
    use actors::registry::{SUBSCRIBER_QUEUE, SUBSCRIBER_QUEUE_BYTES};
    use tokio::io::AsyncWriteExt;

    const STALLED: usize = 40;
    let app = TestApp::spawn().await;
    let registry = app.running.registry.clone();
    let id = "stalled-viewers-run";
    let meta = public_meta("large");
    registry.create(
        &RunId::from(id),
        meta,
        1_000,
        "capability".into(),
        vec![],
        1,
    );
    // Viewers that send their request and never read a byte (a small receive buffer, as a stalled phone).
    let addr: std::net::SocketAddr = app.base.trim_start_matches("http://").parse().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut conn = socket.connect(addr).await.unwrap();
        conn.write_all(
            format!("GET /api/runs/{id}/stream HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        stalled.push(conn);
    }
    let (status, reader) = app.sse(&format!("/api/runs/{id}/stream"), None, None).await;
    assert_eq!(status, 200);
    let reading = tokio::spawn(async move { reader.unwrap().until_end(WAIT).await });
    let subscribed = support::wait_until(WAIT, || {
        let n = registry.subscriber_count();
        async move { (n == STALLED + 1).then_some(()) }
    })
    .await;
    assert!(
        subscribed.is_some(),
        "{} of {} streams subscribed",
        registry.subscriber_count(),
        STALLED + 1
    );

    // 60 KB events, paced so the reading viewer keeps up, until only it is left.
    let text = "y".repeat(60_000);
    let mut published = 0u64;
    while registry.subscriber_count() > 1 {
        assert!(
            published < 2_000,
            "{published} large events and {} viewers still attached",
            registry.subscriber_count()
        );
        registry.publish(
            &RunId::from(id),
            json!({"type": "note", "kind": "large", "summary": text}),
        );
        published += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        (published as usize) < SUBSCRIBER_QUEUE,
        "dropped by bytes after {published} events, not by count"
    );
    // What the server still holds for viewers is the reading one's queue at most.
    assert!(
        registry.subscriber_queued_bytes() <= SUBSCRIBER_QUEUE_BYTES,
        "{}",
        registry.subscriber_queued_bytes()
    );
    let (code, body) = app
        .post(json!({"thread": "t-other", "channel": "c1", "user": "u1", "text": "steps=1 ms=1"}))
        .await;
    assert_eq!(
        (code, body["outcome"].as_str()),
        (202, Some("started")),
        "{body}"
    );

    registry.finish(&RunId::from(id), RunStatus::Completed, 2_000);
    let (events, end) = reading.await.unwrap();
    assert_eq!(
        seqs(&events),
        (1..=published).collect::<Vec<_>>(),
        "the reading viewer missed or repeated an event"
    );
    assert_eq!(end.expect("end").data["status"], "completed");
    drop(stalled);
}

#[actix_web::test]
async fn an_idle_stream_gets_a_keep_alive_comment() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=30000").await;
    app.event(&id, "tool_call").await;
    let res = app
        .client
        .get(app.url(&format!("/api/runs/{id}/stream")))
        .send()
        .await
        .unwrap();
    let mut body = res.bytes_stream();
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.contains(": ping\n") {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let chunk = tokio::time::timeout(left, body.next())
            .await
            .expect("a ping within 20 s")
            .expect("stream open")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("id: 1\nevent: run_event\ndata: {"), "{seen}");
    let res = app
        .client
        .post(app.url(&format!("/api/runs/{id}/stop")))
        .json(&json!({"mode": "hard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
}

#[actix_web::test]
async fn the_index_feed_upserts_live_quick_and_finished_rows_and_removes_killed_ones() {
    let app = TestApp::spawn().await;
    let (status, feed) = app.sse("/runs/feed", None, None).await;
    assert_eq!(status, 200);
    let mut feed = feed.unwrap();
    // Longer than a few feed polls (500 ms), so the feed sees it live.
    let id = app.start_run("t1", "steps=4 ms=400").await;
    let mut saw_live = false;
    loop {
        let e = feed.next(WAIT).await.expect("feed open");
        assert_eq!(e.event, "upsert");
        assert!(e.data.get("events").is_none() && !e.data.to_string().contains("token"));
        if e.data["id"] != id.as_str() {
            continue;
        }
        if e.data["finished"] == false {
            saw_live = true;
        }
        if e.data["finished"] == true {
            assert_eq!(e.data["status"], "completed");
            break;
        }
    }
    assert!(saw_live, "the feed showed the run while it was live");
    app.final_record(&id).await;
    // A live run killed: it goes without a record, so the feed says `removed`.
    let doomed = app.start_run("t2", "steps=50 ms=400").await;
    loop {
        let e = feed.next(WAIT).await.expect("feed open");
        if e.event == "upsert" && e.data["id"] == doomed.as_str() {
            break;
        }
    }
    let res = app
        .client
        .delete(app.url(&format!("/api/runs/{doomed}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    loop {
        let e = feed.next(WAIT).await.expect("feed open");
        if e.event == "removed" {
            assert_eq!(e.data["id"], doomed.as_str());
            break;
        }
    }
    // A run that starts and finishes between two polls is still shown, finished; killed once finished, it
    // is removed too.
    let quick = app.start_run("t3", "steps=0").await;
    app.final_record(&quick).await;
    loop {
        let e = feed.next(WAIT).await.expect("feed open");
        if e.event == "upsert" && e.data["id"] == quick.as_str() && e.data["finished"] == true {
            break;
        }
    }
    let res = app
        .client
        .delete(app.url(&format!("/api/runs/{quick}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    loop {
        let e = feed.next(WAIT).await.expect("feed open");
        if e.event == "removed" {
            assert_eq!(e.data["id"], quick.as_str());
            break;
        }
    }
}

/// Start `switchboard serve` on `data` (embedded config: dev bypass on loopback).
fn serve(data: &std::path::Path) -> switchboard::child::ChildServer {
    switchboard::child::ChildServer::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchboard")),
        data,
        &[],
    )
    .expect("start switchboard")
}

#[actix_web::test]
async fn a_reconnect_after_a_crash_and_resume_sees_no_gap_and_no_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let mut a = serve(dir.path());
    let res = client
        .post(a.url("/api/messages"))
        .json(&json!({"thread": "t1", "channel": "c1", "user": "u1", "text": "steps=6 ms=400"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 202);
    let id = res.json::<serde_json::Value>().await.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();

    // Watch it on the first process until a few steps are in, then crash that process.
    let res = client
        .get(a.url(&format!("/api/runs/{id}/stream")))
        .send()
        .await
        .unwrap();
    let mut reader = support::SseReader::new(res);
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|e: &&SseEvent| e.data["type"] == "tool_result")
        .count()
        < 2
    {
        seen.push(reader.next(WAIT).await.expect("an event before the crash"));
    }
    let res = client.post(a.url("/admin/crash")).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 202);
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(137));
    // The connection died with the process: whatever else arrived, no `end`.
    while let Some(e) = reader.next(WAIT).await {
        assert_eq!(e.event, "run_event", "no end from a crashed process");
        seen.push(e);
    }
    let last: u64 = seen.last().unwrap().id.parse().unwrap();

    // The next process resumes the run; the viewer reconnects with Last-Event-ID.
    let b = serve(dir.path());
    let res = client
        .get(b.url(&format!("/api/runs/{id}/stream")))
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let (rest, end) = support::SseReader::new(res)
        .until_end(Duration::from_secs(60))
        .await;
    assert_eq!(
        end.expect("end after the resumed run finished").data["status"],
        "completed"
    );
    let mut all = seqs(&seen);
    let after = seqs(&rest);
    assert!(
        after.iter().all(|s| *s > last),
        "nothing at or before Last-Event-ID: {after:?}"
    );
    all.extend(&after);
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "no duplicate, in order: {all:?}"
    );
    assert!(
        rest.iter().any(|e| e.data["type"] == "resumed"),
        "the resumed note is streamed"
    );
    // No gap: every event of the final record past the cursor reached the viewer.
    let record = client
        .get(b.url(&format!("/api/runs/{id}?include=events")))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let stored_after: Vec<u64> = record["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .filter(|s| *s > last)
        .collect();
    assert_eq!(after, stored_after);
}
