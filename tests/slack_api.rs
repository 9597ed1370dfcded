//! `SlackIo` (SPEC §12) against the local stub of Slack's Web API (`switchboard::slack_stub`): cards are
//! posted and edited in place, replies land in the thread, Slack's errors come back typed, a `429` is
//! waited out by `patiently`, and the bot token shows nowhere.

use std::time::Duration;
use storage::RunId;

use actors::channel::slack::SlackIo;
use actors::channel::{patiently, CardHandle, ChannelError, ChannelIo, Frame, ThreadRef};
use switchboard::slack_stub::{MessageKind, SlackStub};

const THREAD_TS: &str = "1600000000.000001";

fn io_for(stub: &SlackStub) -> SlackIo {
    SlackIo::new(reqwest::Client::new(), &stub.url(), stub.token().to_owned())
}

fn thread() -> ThreadRef {
    ThreadRef {
        channel: "C0GENERAL".into(),
        thread_ts: THREAD_TS.into(),
    }
}

fn live(text: &str) -> Frame {
    Frame {
        text: text.into(),
        run_id: "run-1".into(),
        stop_button: true,
        approvals: Vec::new(),
    }
}

fn closing(text: &str) -> Frame {
    Frame {
        text: text.into(),
        run_id: "run-1".into(),
        stop_button: false,
        approvals: Vec::new(),
    }
}

#[actix_web::test]
async fn a_posted_card_answers_its_handle_and_shows_in_the_thread() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    let card = io
        .post_card(&thread(), &live("⏳ main · step 1"))
        .await
        .expect("post the card");
    assert_eq!(card.channel, "C0GENERAL");
    let cards = stub.cards_in(THREAD_TS);
    assert_eq!(cards.len(), 1, "{cards:?}");
    let shown = &cards[0];
    assert_eq!(shown.ts, card.ts);
    assert_eq!(shown.kind, MessageKind::Card);
    assert_eq!(shown.text, "⏳ main · step 1");
    assert_eq!(shown.run_id.as_deref(), Some("run-1"));
    assert_eq!(shown.stop_button.as_deref(), Some("run-1"));
    assert!(shown.edits.is_empty());
    assert!(stub.replies_in(THREAD_TS).is_empty());

    let second = io
        .post_card(&thread(), &live("⏳ other"))
        .await
        .expect("post a second card");
    assert!(second.ts > card.ts, "{} after {}", second.ts, card.ts);
}

#[actix_web::test]
async fn an_edit_changes_the_cards_text_and_is_listed_in_order() {
    let stub = SlackStub::start().expect("start the stub");
    // A trailing slash on the base URL is tolerated.
    let io = SlackIo::new(
        reqwest::Client::new(),
        &format!("{}/", stub.url()),
        stub.token().to_owned(),
    );
    let card = io
        .post_card(&thread(), &live("⏳ main · step 1"))
        .await
        .expect("post the card");
    io.edit_card(&card, &live("⏳ main · step 2 · search"))
        .await
        .expect("edit the card");
    io.edit_card(&card, &closing("✅ main · done · 2 steps · 3 s"))
        .await
        .expect("close the card");
    let shown = stub.message(&card.ts).expect("the card");
    assert_eq!(shown.text, "✅ main · done · 2 steps · 3 s");
    assert_eq!(
        shown.stop_button, None,
        "a closing frame has no Stop button"
    );
    let edits: Vec<_> = shown
        .edits
        .iter()
        .map(|e| (e.text.as_str(), e.stop_button.as_deref()))
        .collect();
    assert_eq!(
        edits,
        [
            ("⏳ main · step 2 · search", Some("run-1")),
            ("✅ main · done · 2 steps · 3 s", None),
        ]
    );
    assert_eq!(stub.counters().update, 2);
}

#[actix_web::test]
async fn a_reply_lands_in_the_thread_as_a_reply() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    io.reply(&thread(), &RunId::from("run-1"), "the answer is 42")
        .await
        .expect("reply");
    let replies = stub.replies_in(THREAD_TS);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].text, "the answer is 42");
    assert_eq!(replies[0].kind, MessageKind::Reply);
    assert_eq!(replies[0].blocks, None);
    assert!(stub.cards_in(THREAD_TS).is_empty());
}

#[actix_web::test]
async fn a_reply_longer_than_slack_allows_is_cut_not_refused() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    io.reply(&thread(), &RunId::from("run-1"), &"a".repeat(60_000))
        .await
        .expect("reply");
    let replies = stub.replies_in(THREAD_TS);
    assert_eq!(replies.len(), 1);
    assert!(replies[0].text.chars().count() <= 39_000);
    assert!(replies[0].text.ends_with("more characters cut)"));
}

#[actix_web::test]
async fn editing_a_deleted_or_unknown_card_is_message_not_found() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    let card = io
        .post_card(&thread(), &live("⏳ main · step 1"))
        .await
        .expect("post the card");
    assert!(stub.delete(&card.ts));
    assert_eq!(
        io.edit_card(&card, &live("⏳ main · step 2")).await,
        Err(ChannelError::MessageNotFound)
    );
    let unknown = CardHandle {
        channel: "C0GENERAL".into(),
        ts: "1700009999.000001".into(),
    };
    assert_eq!(
        io.edit_card(&unknown, &live("⏳")).await,
        Err(ChannelError::MessageNotFound)
    );
    assert!(stub.message(&card.ts).expect("still remembered").deleted);
}

#[actix_web::test]
async fn a_429_is_rate_limited_for_the_retry_after_seconds() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    stub.rate_limit_next(1, 7);
    assert_eq!(
        io.post_card(&thread(), &live("⏳")).await,
        Err(ChannelError::RateLimited(Duration::from_secs(7)))
    );
    // Only the next call was limited.
    io.post_card(&thread(), &live("⏳"))
        .await
        .expect("post after the limit");
    let counters = stub.counters();
    assert_eq!((counters.post_message, counters.rate_limited), (2, 1));
}

#[actix_web::test]
async fn patiently_gets_through_two_rate_limited_answers() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    stub.rate_limit_next(2, 1);
    let started = std::time::Instant::now();
    let (thread, frame) = (thread(), live("⏳"));
    let card = patiently("post card", || io.post_card(&thread, &frame))
        .await
        .expect("posted after waiting");
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(stub.cards_in(THREAD_TS).len(), 1);
    assert_eq!(stub.cards_in(THREAD_TS)[0].ts, card.ts);
    let counters = stub.counters();
    assert_eq!((counters.post_message, counters.rate_limited), (3, 2));
}

#[actix_web::test]
async fn a_wrong_token_is_invalid_auth() {
    let stub = SlackStub::start().expect("start the stub");
    let io = SlackIo::new(
        reqwest::Client::new(),
        &stub.url(),
        "xoxb-not-the-right-token".into(),
    );
    assert_eq!(
        io.reply(&thread(), &RunId::from("run-1"), "hello").await,
        Err(ChannelError::Api("invalid_auth".into()))
    );
    assert!(stub.messages().is_empty());
    assert_eq!(stub.counters().refused, 1);
}

#[actix_web::test]
async fn a_missing_channel_is_channel_not_found() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    stub.missing_channel("C0GENERAL");
    let err = io
        .post_card(&thread(), &live("⏳"))
        .await
        .expect_err("no card in a missing channel");
    assert_eq!(err, ChannelError::ChannelNotFound);
    assert!(err.no_card_here());
    assert_eq!(
        io.reply(&thread(), &RunId::from("run-1"), "hello").await,
        Err(ChannelError::ChannelNotFound)
    );
    assert!(stub.messages().is_empty());
}

#[actix_web::test]
async fn the_token_shows_neither_in_debug_nor_in_errors() {
    let stub = SlackStub::start().expect("start the stub");
    let io = io_for(&stub);
    let shown = format!("{io:?}");
    assert!(!shown.contains(stub.token()), "{shown}");
    assert!(shown.contains("redacted"), "{shown}");

    // A port nobody listens on: the failure is a transport error naming neither token nor URL.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let io = SlackIo::new(
        reqwest::Client::new(),
        &format!("http://{closed}/api"),
        stub.token().to_owned(),
    );
    let err = io
        .post_card(&thread(), &live("⏳"))
        .await
        .expect_err("nobody listens");
    assert!(matches!(err, ChannelError::Transport(_)), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains(stub.token()), "{text}");
    assert!(!text.contains(&closed.to_string()), "{text}");
}

/// The stub serves callers on any runtime: here plain synchronous code driving a tokio current-thread
/// runtime; and it stops serving once dropped.
#[test]
fn the_stub_serves_a_current_thread_runtime_and_stops_when_dropped() {
    let stub = SlackStub::start().expect("start the stub");
    let url = stub.url();
    let token = stub.token().to_owned();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a runtime");
    let io = SlackIo::new(reqwest::Client::new(), &url, token);
    let card = runtime
        .block_on(io.post_card(&thread(), &live("⏳")))
        .expect("post the card");
    assert_eq!(stub.cards_in(THREAD_TS)[0].ts, card.ts);
    drop(stub);
    let after = runtime.block_on(io.edit_card(&card, &live("⏳ 2")));
    assert!(
        matches!(after, Err(ChannelError::Transport(_))),
        "{after:?}"
    );
}

#[actix_web::test]
async fn a_posted_card_is_found_by_its_run_in_its_thread_and_no_other() {
    let stub = SlackStub::start().expect("start the stub");
    let io = SlackIo::new(reqwest::Client::new(), &stub.url(), stub.token().to_owned());
    let posted = io.post_card(&thread(), &live("⏳ demo")).await.unwrap();
    io.reply(&thread(), &RunId::from("run-1"), "an answer")
        .await
        .unwrap();
    assert_eq!(
        io.find_card(&thread(), &RunId::from("run-1"))
            .await
            .unwrap(),
        Some(posted.clone())
    );
    assert_eq!(
        io.find_card(&thread(), &RunId::from("run-2"))
            .await
            .unwrap(),
        None
    );
    let other = ThreadRef {
        channel: "C0GENERAL".into(),
        thread_ts: "1.000000".into(),
    };
    assert_eq!(
        io.find_card(&other, &RunId::from("run-1")).await.unwrap(),
        None
    );
    assert!(stub.delete(&posted.ts));
    assert_eq!(
        io.find_card(&thread(), &RunId::from("run-1"))
            .await
            .unwrap(),
        None
    );
}
