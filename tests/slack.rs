//! The Slack adapter end to end (SPEC §12), on the real binary: signed Events API requests in, the Web API
//! calls out to a local stand-in ([`SlackStub`]) that answers with Slack's documented shapes. A mention
//! starts a run whose card goes ⏳ → ✅ with the answer as one thread reply; a follow-up in the thread
//! steers; retries are one run; unsigned or stale requests admit nothing; crashes, deleted cards and rate
//! limits never make a second card or a second reply.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use storage::RunId;

use serde_json::{json, Value};
use storage::record::{RunRecord, RunStatus};
use storage::{RunStore, SqliteStore, Synchronous};
use support::child::{http, now_ms, Proc};
use switchboard::slack_stub::{SlackStub, StubMessage};

const DEADLINE: Duration = Duration::from_secs(60);
const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";

fn wait_for<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    support::child::wait_for(what, DEADLINE, check)
}

/// A data dir whose `config.toml` points the Slack channel at `stub`, and the environment naming the
/// token and the signing secret.
fn slack_dir(stub: &SlackStub) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    std::fs::write(
        path.join("config.toml"),
        format!(
            "[channels.slack]\nbot_token_env = \"TEST_SLACK_BOT_TOKEN\"\nsigning_secret_env = \
             \"TEST_SLACK_SIGNING_SECRET\"\napi_base_url = \"{}\"\n",
            stub.url()
        ),
    )
    .unwrap();
    (dir, path)
}

fn start(data: &Path, stub: &SlackStub) -> Proc {
    Proc::start(
        data,
        &[
            ("TEST_SLACK_BOT_TOKEN", stub.token()),
            ("TEST_SLACK_SIGNING_SECRET", SECRET),
        ],
    )
}

/// POST a signed body to `path` with the request timestamp `at` (unix seconds); answers the status.
fn signed(p: &Proc, path: &str, body: &str, at: i64, retry: Option<u32>) -> (u16, Value) {
    let ts = at.to_string();
    let signature = web::routes::slack::sign(SECRET, &ts, body.as_bytes());
    let (url, body) = (p.url(path), body.to_owned());
    http(move |c| {
        let mut req = c
            .post(url)
            .header("content-type", "application/json")
            .header("X-Slack-Request-Timestamp", ts)
            .header("X-Slack-Signature", signature);
        if let Some(n) = retry {
            req = req.header("X-Slack-Retry-Num", n.to_string());
        }
        req.body(body)
    })
}

fn now_secs() -> i64 {
    now_ms() / 1000
}

/// An `app_mention` event callback in channel C1: `ts` its message, `thread_ts` its thread if a reply.
fn mention(event_id: &str, ts: &str, thread_ts: Option<&str>, text: &str) -> String {
    let mut event = json!({"type": "app_mention", "channel": "C1", "user": "U1",
        "text": format!("<@UBOT> {text}"), "ts": ts, "event_ts": ts});
    if let Some(t) = thread_ts {
        event["thread_ts"] = json!(t);
    }
    json!({"type": "event_callback", "team_id": "T1", "api_app_id": "A1", "event_id": event_id,
        "event_time": now_secs(), "event": event})
    .to_string()
}

fn db(data: &Path) -> SqliteStore {
    SqliteStore::open(&data.join("switchboard.db"), Synchronous::Normal).expect("open the database")
}

fn final_record(data: &Path, run_id: &str) -> RunRecord {
    wait_for(&format!("the final record of {run_id}"), || {
        db(data)
            .get(&RunId::from(run_id), now_ms())
            .unwrap()
            .filter(|r| !r.head.provisional)
    })
}

/// The one card of the thread, once posted.
fn the_card(stub: &SlackStub, thread_ts: &str) -> StubMessage {
    wait_for("the card", || stub.cards_in(thread_ts).into_iter().next())
}

/// Wait until the card `ts` shows a frame starting with `prefix`.
fn card_shows(stub: &SlackStub, ts: &str, prefix: &str) -> StubMessage {
    wait_for(&format!("a card frame starting {prefix:?}"), || {
        stub.message(ts).filter(|m| m.text.starts_with(prefix))
    })
}

/// Wait until the run's ledger rows hold two finished steps (it is mid-run, resumable).
fn past_two_steps(data: &Path, run_id: &str) {
    use storage::ledger::RunLedger;
    wait_for("two durable steps", || {
        let events = db(data)
            .live_events(&RunId::from(run_id), 0, 100_000)
            .ok()??;
        (events.iter().filter(|e| e["type"] == "assistant").count() >= 2).then_some(())
    })
}

fn inputs(record: &RunRecord) -> Vec<String> {
    record
        .events
        .iter()
        .filter(|e| e["type"] == "input")
        .map(|e| e["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_mention_starts_a_run_whose_card_goes_from_working_to_done_with_the_answer_as_one_reply() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let p = start(&data, &stub);
    let body = mention(
        "Ev1",
        "1700000001.000100",
        None,
        "steps=3 ms=400 answer=forty-two",
    );
    assert_eq!(signed(&p, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, "1700000001.000100");
    assert!(card.text.starts_with("⏳ demo"), "{}", card.text);
    let run_id = card.run_id.clone().expect("the card names its run");
    assert!(
        card.text.contains(&format!("/runs/{run_id}?token=")),
        "the live view link: {}",
        card.text
    );
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    assert_eq!(inputs(&record), ["steps=3 ms=400 answer=forty-two"]);
    let done = card_shows(&stub, &card.ts, "✅ demo · done · 3 steps");
    assert!(!done.text.contains("🔁"), "{}", done.text);
    assert!(
        done.edits
            .iter()
            .any(|e| e.text.starts_with("⏳ demo · step")),
        "live frames between: {:?}",
        done.edits
    );
    let replies = stub.replies_in("1700000001.000100");
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].text, "forty-two");
    assert_eq!(stub.cards_in("1700000001.000100").len(), 1);
    assert_eq!(
        record.head.extra["card"],
        json!({"channel": "C1", "ts": card.ts})
    );
    assert_eq!(record.head.extra["cardClosed"], json!(true));
    assert_eq!(record.head.reply_ok, Some(true));
}

#[test]
fn retries_are_one_run_and_unsigned_or_stale_requests_admit_nothing() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let p = start(&data, &stub);
    let challenge =
        json!({"type": "url_verification", "token": "x", "challenge": "c-123"}).to_string();
    let (status, answer) = signed(&p, "/slack/events", &challenge, now_secs(), None);
    assert_eq!((status, answer["challenge"].clone()), (200, json!("c-123")));
    // A bad signature, a stale and a future timestamp: 401, nothing admitted. The timestamps sit a minute
    // past the 300 s window: the server reads its clock a moment after this test does.
    let body = mention("Ev2", "1700000002.000100", None, "steps=1 ms=10 answer=x");
    let (url, b) = (p.url("/slack/events"), body.clone());
    let forged = http(move |c| {
        c.post(url)
            .header("content-type", "application/json")
            .header("X-Slack-Request-Timestamp", now_secs().to_string())
            .header("X-Slack-Signature", format!("v0={}", "0".repeat(64)))
            .body(b)
    });
    assert_eq!(forged.0, 401, "{}", forged.1);
    assert_eq!(
        signed(&p, "/slack/events", &body, now_secs() - 360, None).0,
        401
    );
    assert_eq!(
        signed(&p, "/slack/events", &body, now_secs() + 360, None).0,
        401
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(stub.messages().is_empty(), "{:?}", stub.messages());
    // The event, then Slack's retries of it: one run, one card, one reply.
    assert_eq!(signed(&p, "/slack/events", &body, now_secs(), None).0, 200);
    for n in 1..=2 {
        assert_eq!(
            signed(&p, "/slack/events", &body, now_secs(), Some(n)).0,
            200
        );
    }
    let card = the_card(&stub, "1700000002.000100");
    let record = final_record(&data, card.run_id.as_deref().unwrap());
    assert_eq!(inputs(&record).len(), 1);
    card_shows(&stub, &card.ts, "✅");
    wait_for("the reply", || {
        (stub.replies_in("1700000002.000100").len() == 1).then_some(())
    });
    assert_eq!(stub.cards_in("1700000002.000100").len(), 1);
    // A bot's own message and an unknown event type admit nothing.
    let own = json!({"type": "event_callback", "event_id": "Ev3", "event": {"type": "message",
        "channel_type": "im", "channel": "D1", "user": "U1", "bot_id": "B1", "text": "hi",
        "ts": "1700000003.000100"}})
    .to_string();
    assert_eq!(signed(&p, "/slack/events", &own, now_secs(), None).0, 200);
    std::thread::sleep(Duration::from_millis(300));
    assert!(stub.cards_in("1700000003.000100").is_empty());
    // A channel the bot cannot post in: the run goes on without a card, and a note says why.
    stub.missing_channel("C1");
    let lost = mention("Ev9", "1700000009.000100", None, "steps=1 ms=10 answer=y");
    assert_eq!(signed(&p, "/slack/events", &lost, now_secs(), None).0, 200);
    let run_id = wait_for("the run in channel C1's lost thread", || {
        let (_, listing) = http(|c| c.get(p.url("/api/runs?limit=10")));
        listing["runs"]
            .as_array()?
            .iter()
            .find(|r| r["threadKey"] == "C1:1700000009.000100")
            .and_then(|r| r["id"].as_str().map(str::to_owned))
    });
    let record = final_record(&data, &run_id);
    assert!(
        record
            .events
            .iter()
            .any(|e| e["type"] == "note" && e["kind"] == "no_card"),
        "{:?}",
        record.events
    );
    assert!(stub.cards_in("1700000009.000100").is_empty());
}

#[test]
fn a_followup_in_the_thread_steers_the_live_run_under_the_same_card() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let p = start(&data, &stub);
    let root = "1700000004.000100";
    let first = mention("Ev4", root, None, "steps=5 ms=400 answer=both");
    assert_eq!(signed(&p, "/slack/events", &first, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    let followup = mention("Ev5", "1700000004.000200", Some(root), "and this too");
    assert_eq!(
        signed(&p, "/slack/events", &followup, now_secs(), None).0,
        200
    );
    let record = final_record(&data, card.run_id.as_deref().unwrap());
    assert_eq!(
        inputs(&record),
        ["steps=5 ms=400 answer=both", "and this too"]
    );
    card_shows(&stub, &card.ts, "✅");
    assert_eq!(stub.cards_in(root).len(), 1);
    wait_for("one reply", || {
        (stub.replies_in(root).len() == 1).then_some(())
    });
}

#[test]
fn a_crash_mid_run_resumes_on_the_same_card_with_one_reply() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let mut a = start(&data, &stub);
    let root = "1700000005.000100";
    let body = mention(
        "Ev6",
        root,
        None,
        "steps=6 ms=300 tool=append_file answer=kept",
    );
    assert_eq!(signed(&a, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    past_two_steps(&data, card.run_id.as_deref().unwrap());
    card_shows(&stub, &card.ts, "⏳ demo · step");
    a.crash();
    // The card's rate: a few 429s on the way do not lose the last frame.
    stub.rate_limit_next(2, 1);
    let _b = start(&data, &stub);
    let record = final_record(&data, card.run_id.as_deref().unwrap());
    assert_eq!(record.head.status, RunStatus::Completed);
    let done = card_shows(&stub, &card.ts, "✅");
    assert!(
        done.text.contains("🔁 resumed after a restart"),
        "{}",
        done.text
    );
    assert_eq!(stub.cards_in(root).len(), 1, "one card, edited");
    wait_for("one reply", || {
        (stub.replies_in(root).len() == 1).then_some(())
    });
    assert!(stub.counters().rate_limited >= 2);
    assert_eq!(record.head.extra["card"]["ts"], json!(card.ts));
}

#[test]
fn a_crash_during_delivery_closes_the_card_as_unconfirmed_and_never_replies_twice() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let mut a = start(&data, &stub);
    let root = "1700000006.000100";
    stub.hold_replies(true);
    let body = mention("Ev7", root, None, "steps=1 ms=10 answer=the-saved-answer");
    assert_eq!(signed(&a, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    wait_for("the reply in flight", || {
        (stub.counters().held == 1).then_some(())
    });
    a.crash();
    stub.hold_replies(false);
    let _b = start(&data, &stub);
    let record = final_record(&data, card.run_id.as_deref().unwrap());
    assert_eq!(
        record.head.reply_note.as_deref(),
        Some(actors::run::DELIVERY_UNKNOWN)
    );
    let closed = card_shows(&stub, &card.ts, "⚠️ demo · ended, delivery unconfirmed");
    assert!(closed.text.contains("the-saved-answer"), "{}", closed.text);
    assert_eq!(record.head.extra["cardClosed"], json!(true));
    std::thread::sleep(Duration::from_millis(500));
    assert!(stub.replies_in(root).is_empty(), "never re-sent");
    assert_eq!(stub.cards_in(root).len(), 1);
}

#[test]
fn a_deleted_card_is_replaced_by_a_fresh_one_whose_handle_the_record_keeps() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let mut a = start(&data, &stub);
    let root = "1700000007.000100";
    let body = mention("Ev8", root, None, "steps=6 ms=300 answer=fresh");
    assert_eq!(signed(&a, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    past_two_steps(&data, card.run_id.as_deref().unwrap());
    card_shows(&stub, &card.ts, "⏳ demo · step");
    a.crash();
    assert!(stub.delete(&card.ts));
    let _b = start(&data, &stub);
    let record = final_record(&data, card.run_id.as_deref().unwrap());
    let cards = wait_for("a fresh card", || {
        let cards = stub.cards_in(root);
        (cards.len() == 2).then_some(cards)
    });
    let fresh = &cards[1];
    card_shows(&stub, &fresh.ts, "✅");
    assert_eq!(record.head.extra["card"]["ts"], json!(fresh.ts));
    wait_for("one reply", || {
        (stub.replies_in(root).len() == 1).then_some(())
    });
}

#[actix_web::test]
async fn without_a_slack_channel_the_slack_routes_do_not_exist() {
    let app = support::TestApp::spawn().await;
    for path in ["/slack/events", "/slack/interactions"] {
        let res = reqwest::Client::new()
            .post(app.url(path))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 404, "{path}");
    }
}

#[test]
fn the_cards_stop_button_soft_stops_the_run_and_the_card_says_who() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let p = start(&data, &stub);
    let root = "1700000010.000100";
    let body = mention("Ev10", root, None, "steps=30 ms=300 answer=never");
    assert_eq!(signed(&p, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    let run_id = card.run_id.clone().unwrap();
    assert!(card.stop_button.is_some(), "a live card offers Stop");
    assert_eq!(click(&p, "U42", "C1", &card.ts, "stop", &run_id), 200);
    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::StoppedSoft);
    let stopped = card_shows(&stub, &card.ts, "⏹ stopped by slack:U42");
    assert!(stopped.stop_button.is_none(), "a closed card has no button");
}

/// A signed `block_actions` interaction, as Slack posts one when `user` clicks the button `action_id`
/// carrying `value` on the message `message_ts` in `channel`; answers the status.
fn click(
    p: &Proc,
    user: &str,
    channel: &str,
    message_ts: &str,
    action_id: &str,
    value: &str,
) -> u16 {
    let payload = json!({"type": "block_actions", "team": {"id": "T1", "domain": "team"},
        "user": {"id": user, "username": "someone", "name": "someone", "team_id": "T1"},
        "api_app_id": "A1", "token": "legacy", "trigger_id": "1.2.3",
        "container": {"type": "message", "message_ts": message_ts, "channel_id": channel,
            "is_ephemeral": false},
        "channel": {"id": channel, "name": "general"},
        "response_url": "https://hooks.slack.com/actions/T1/1/x",
        "actions": [{"action_id": action_id, "block_id": "b1", "value": value, "type": "button",
            "text": {"type": "plain_text", "text": "x", "emoji": true}, "action_ts": "1700000000.1"}]});
    let form = format!("payload={}", url_encode(&payload.to_string()));
    let ts = now_secs().to_string();
    let signature = web::routes::slack::sign(SECRET, &ts, form.as_bytes());
    let url = p.url("/slack/interactions");
    http(move |c| {
        c.post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("X-Slack-Request-Timestamp", ts)
            .header("X-Slack-Signature", signature)
            .body(form)
    })
    .0
}

#[test]
fn the_cards_approve_and_deny_buttons_decide_the_parked_calls_and_the_record_says_who() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    // The demo agent must have every append_file call approved.
    let config = data.join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[agents.demo]\nkind = \"scripted\"\napprove = [\"append_*\"]\n");
    std::fs::write(&config, text).unwrap();
    let p = start(&data, &stub);
    let root = "1700000012.000100";
    let body = mention(
        "Ev12",
        root,
        None,
        "tool=append_file steps=2 ms=10 answer=decided",
    );
    assert_eq!(signed(&p, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    let run_id = card.run_id.clone().unwrap();
    let awaiting = |step: u64| {
        wait_for(
            &format!("the card to show step {step}'s call awaiting approval"),
            || {
                stub.message(&card.ts).filter(|m| {
                    m.text
                        .starts_with(&format!("⏳ demo · step {step} · append_file …\n"))
                        && m.text
                            .contains("\n✋ waiting for approval: append_file — {")
                })
            },
        )
    };
    // The card offers Approve and Deny for the call, and still Stop.
    let parked = awaiting(1);
    let first = actors::channel::slack::approval_value(&run_id, "call-1").unwrap();
    assert_eq!(parked.buttons("approve"), std::slice::from_ref(&first));
    assert_eq!(parked.buttons("deny"), std::slice::from_ref(&first));
    assert_eq!(parked.buttons("stop"), std::slice::from_ref(&run_id));
    // A click from another channel reaches no run there: the call still awaits its decision.
    assert_eq!(click(&p, "U7", "C9", &card.ts, "deny", &first), 200);
    wait_for("the refusal in the log", || {
        p.logged("slack decision refused: no such run in this channel")
            .then_some(())
    });
    assert!(stub.message(&card.ts).unwrap().text.contains("✋"));

    assert_eq!(click(&p, "U42", "C1", &card.ts, "approve", &first), 200);
    // The next step's call, with its own buttons.
    let second = wait_for("the card's buttons for step 2's call", || {
        let card = awaiting(2);
        let deny = card.buttons("deny");
        (deny.len() == 1 && deny[0] != first).then(|| deny[0].clone())
    });
    assert_eq!(
        Some(second.clone()),
        actors::channel::slack::approval_value(&run_id, "call-2")
    );
    // A late click on the decided call changes nothing (the first decision stands); Slack hears 200.
    assert_eq!(click(&p, "U43", "C1", &card.ts, "deny", &first), 200);
    wait_for("the late click's refusal in the log", || {
        p.log_lines()
            .iter()
            .any(|l| l.contains("slack decision refused") && l.contains("decided already"))
            .then_some(())
    });
    assert_eq!(click(&p, "U42", "C1", &card.ts, "deny", &second), 200);

    let record = final_record(&data, &run_id);
    assert_eq!(record.head.status, RunStatus::Completed);
    let decided: Vec<_> = record
        .events
        .iter()
        .filter(|e| e["type"] == "approval_decided")
        .map(|e| {
            (
                e["callId"].as_str(),
                e["decision"].as_str(),
                e["who"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [
            (Some("call-1"), Some("approve"), Some("slack:U42")),
            (Some("call-2"), Some("deny"), Some("slack:U42"))
        ]
    );
    let result = |call: &str| {
        record
            .events
            .iter()
            .find(|e| e["type"] == "tool_result" && e["callId"] == call)
            .cloned()
            .unwrap_or_else(|| panic!("{call} has a result"))
    };
    assert_eq!(result("call-1")["ok"], json!(true), "approved, it ran");
    assert_eq!(
        result("call-2")["denied"],
        json!(true),
        "denied, it did not"
    );
    let done = card_shows(&stub, &card.ts, "✅ demo · done");
    assert!(!done.text.contains('✋'), "{}", done.text);
    assert!(done.buttons("approve").is_empty() && done.buttons("deny").is_empty());
    wait_for("one reply", || {
        (stub.replies_in(root).len() == 1).then_some(())
    });
    assert_eq!(stub.replies_in(root)[0].text, "decided");
    assert_eq!(stub.cards_in(root).len(), 1);
}

/// Percent-encoding of a form value (every byte outside the unreserved set).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_card_left_open_when_its_run_ended_is_closed_by_the_sweep() {
    let stub = SlackStub::start().unwrap();
    let (_dir, data) = slack_dir(&stub);
    let mut env = vec![
        ("TEST_SLACK_BOT_TOKEN", stub.token()),
        ("TEST_SLACK_SIGNING_SECRET", SECRET),
    ];
    env.push(("SWITCHBOARD_LEDGER__LEASE_MS", "1000"));
    env.push(("SWITCHBOARD_LEDGER__HEARTBEAT_MS", "300"));
    let p = Proc::start(&data, &env);
    let root = "1700000011.000100";
    let body = mention("Ev11", root, None, "steps=2 ms=300 answer=late");
    assert_eq!(signed(&p, "/slack/events", &body, now_secs(), None).0, 200);
    let card = the_card(&stub, root);
    // Slack fails every edit: the run ends, its record says the card is still open.
    stub.fail_updates(true);
    let record = final_record(&data, card.run_id.as_deref().unwrap());
    assert_eq!(record.head.extra["cardClosed"], json!(false));
    assert!(stub.message(&card.ts).unwrap().text.starts_with('⏳'));
    stub.fail_updates(false);
    card_shows(&stub, &card.ts, "✅ demo · done · 2 steps");
    wait_for("the sweep to mark the record's card closed", || {
        let r = db(&data)
            .get(&RunId::from(card.run_id.as_deref().unwrap()), now_ms())
            .unwrap()?;
        (r.head.extra["cardClosed"] == json!(true)).then_some(())
    });
    assert!(p.logged("closed the card of a finished run"));
    assert_eq!(stub.cards_in(root).len(), 1);
}

#[actix_web::test]
async fn a_slack_channel_whose_secrets_are_not_in_the_environment_refuses_to_start_naming_the_key()
{
    let dir = tempfile::tempdir().unwrap();
    let text = "[channels.slack]\nbot_token_env = \"SWITCHBOARD_TEST_UNSET_TOKEN_7f3a\"\n\
                signing_secret_env = \"SWITCHBOARD_TEST_UNSET_SECRET_7f3a\"\n";
    let mut config = switchboard::config::Config::parse("slack.toml", text, Vec::new()).unwrap();
    config.server.bind = "127.0.0.1:0".into();
    config.storage.path = dir.path().join("switchboard.db");
    let Err(e) = switchboard::start(config).await else {
        panic!("started without the bot token");
    };
    let e = format!("{e:#}");
    assert!(
        e.contains("channels.slack.bot_token_env")
            && e.contains("SWITCHBOARD_TEST_UNSET_TOKEN_7f3a")
            && e.contains("slack.toml"),
        "{e}"
    );
    assert!(
        !dir.path().join("switchboard.db").exists(),
        "nothing touched storage"
    );
}
