//! End to end: Server-Sent Events (SPEC §8.1) — `GET /api/runs/{id}/stream` and the index feed
//! `GET /runs/feed`, read with an SSE client (`eventsource-stream` over reqwest).

mod support;

use std::time::Duration;

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
    let stored: Vec<u64> = record.events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(got, stored, "every event once, in order, the same seqs as the record");
    assert_eq!(end.data["finishedAt"].as_i64(), Some(record.head.finished_at));
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
    let (status, reader) = app.sse(&format!("{path}?afterSeq=1"), None, Some(last)).await;
    assert_eq!(status, 200);
    let (rest, end) = reader.unwrap().until_end(WAIT).await;
    assert!(end.is_some());
    let mut all = seqs(&first);
    all.extend(seqs(&rest));
    let record = app.final_record(&id).await;
    let stored: Vec<u64> = record.events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(all, stored);
    assert_eq!(seqs(&rest)[0], last + 1);
}

#[actix_web::test]
async fn a_finished_run_replays_then_ends_from_the_registry_and_from_the_store() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=2 ms=0").await;
    let record = app.final_record(&id).await;
    let stored: Vec<u64> = record.events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    // Still in the registry (finished rows stay 60 s).
    let (_, reader) = app.sse(&format!("/api/runs/{id}/stream"), None, None).await;
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    assert_eq!(seqs(&events), stored);
    assert_eq!(end.unwrap().data["status"], "completed");
    // Served from the store once the registry let it go; `afterSeq` skips what the client has.
    app.running.registry.discard(&id);
    let (_, reader) = app.sse(&format!("/api/runs/{id}/stream?afterSeq=3"), None, None).await;
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    assert_eq!(seqs(&events), stored[3..].to_vec());
    let end = end.expect("end after a replay");
    assert_eq!((end.data["status"].as_str(), end.data["finishedAt"].as_i64()), (Some("completed"), Some(record.head.finished_at)));
    // A cursor at the end replays nothing and still ends.
    let last = *stored.last().unwrap();
    let (_, reader) = app.sse(&format!("/api/runs/{id}/stream"), None, Some(last)).await;
    let (events, end) = reader.unwrap().until_end(WAIT).await;
    assert!(events.is_empty() && end.is_some());
}

#[actix_web::test]
async fn a_stream_that_is_not_read_never_slows_the_run_and_what_it_got_has_no_gap() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=400 ms=0").await;
    // Open a stream and leave it unread while the run publishes ~1,200 events.
    let res = app.client.get(app.url(&format!("/api/runs/{id}/stream"))).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let record = app.final_record(&id).await;
    assert_eq!(record.head.status, RunStatus::Completed);
    // Whatever the stream delivered (everything and `end`, or a prefix before it was dropped) is contiguous.
    let mut reader = support::SseReader::new(res);
    let (events, _end) = reader.until_end(WAIT).await;
    let got = seqs(&events);
    assert!(!got.is_empty());
    assert!(got.windows(2).all(|w| w[1] == w[0] + 1), "a gap in a slow stream");
    assert_eq!(got[0], 1);
}

#[actix_web::test]
async fn an_idle_stream_gets_a_keep_alive_comment() {
    let app = TestApp::spawn().await;
    let id = app.start_run("t1", "steps=1 ms=30000").await;
    app.event(&id, "tool_call").await;
    let res = app.client.get(app.url(&format!("/api/runs/{id}/stream"))).send().await.unwrap();
    let mut body = res.bytes_stream();
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.contains(": ping\n") {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let chunk = tokio::time::timeout(left, body.next()).await.expect("a ping within 20 s").expect("stream open").unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("id: 1\nevent: run_event\ndata: {"), "{seen}");
    let res = app.client.post(app.url(&format!("/api/runs/{id}/stop"))).json(&json!({"mode": "hard"})).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 202);
}

#[actix_web::test]
async fn the_index_feed_upserts_live_and_finished_rows_and_removes_a_killed_one() {
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
    // Gone from the registry and the store (as a kill leaves it): `removed`.
    app.running.registry.discard(&id);
    app.running.storage.delete(id.clone()).await.unwrap();
    loop {
        let e = feed.next(WAIT).await.expect("feed open");
        if e.event == "removed" {
            assert_eq!(e.data["id"], id.as_str());
            break;
        }
    }
}

/// Start `switchboard serve` on `data` (embedded config: dev bypass on loopback).
fn serve(data: &std::path::Path) -> switchboard::child::ChildServer {
    switchboard::child::ChildServer::start(std::path::Path::new(env!("CARGO_BIN_EXE_switchboard")), data, &[]).expect("start switchboard")
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
    let id = res.json::<serde_json::Value>().await.unwrap()["runId"].as_str().unwrap().to_owned();

    // Watch it on the first process until a few steps are in, then crash that process.
    let res = client.get(a.url(&format!("/api/runs/{id}/stream"))).send().await.unwrap();
    let mut reader = support::SseReader::new(res);
    let mut seen = Vec::new();
    while seen.iter().filter(|e: &&SseEvent| e.data["type"] == "tool_result").count() < 2 {
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
    let (rest, end) = support::SseReader::new(res).until_end(Duration::from_secs(60)).await;
    assert_eq!(end.expect("end after the resumed run finished").data["status"], "completed");
    let mut all = seqs(&seen);
    let after = seqs(&rest);
    assert!(after.iter().all(|s| *s > last), "nothing at or before Last-Event-ID: {after:?}");
    all.extend(&after);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "no duplicate, in order: {all:?}");
    assert!(rest.iter().any(|e| e.data["type"] == "resumed"), "the resumed note is streamed");
    // No gap: every event of the final record past the cursor reached the viewer.
    let record = client.get(b.url(&format!("/api/runs/{id}?include=events"))).send().await.unwrap().json::<serde_json::Value>().await.unwrap();
    let stored_after: Vec<u64> =
        record["events"].as_array().unwrap().iter().map(|e| e["seq"].as_u64().unwrap()).filter(|s| *s > last).collect();
    assert_eq!(after, stored_after);
}
