//! `switchboard chaos --slack`: the messages come through `POST /slack/events` (signed `app_mention`
//! events, retried as Slack retries: the same `event_id` with `X-Slack-Retry-Num`), and every process
//! talks to one local Slack Web API stand-in ([`SlackStub`]) that counts the cards and replies. Beside
//! the usual invariants, the verifier checks SPEC §12 from the stub's side: every run has exactly one card,
//! closed (no `⏳` frame left), and at most one reply; a run that delivered its answer has exactly one.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};

use crate::slack_stub::SlackStub;

/// The signing secret the children verify with and the clients sign with.
const SECRET: &str = "chaos-signing-secret";
/// The Slack channel every chaos thread is in.
pub(super) const CHANNEL: &str = "CCHAOS";
/// Attempts of one event (the first and Slack's retries).
const ATTEMPTS: u32 = 4;

/// The stub, and the environment and config that point the children at it.
pub(super) struct SlackChaos {
    pub stub: SlackStub,
}

impl SlackChaos {
    /// Start the stub and write the `config.toml` the children read in `data`; answers the environment
    /// they need beside it.
    pub fn start(data: &Path) -> anyhow::Result<(SlackChaos, Vec<(String, String)>)> {
        let stub = SlackStub::start().context("start the Slack stand-in")?;
        std::fs::write(
            data.join("config.toml"),
            format!(
                "[channels.slack]\nbot_token_env = \"SWITCHBOARD_CHAOS_SLACK_TOKEN\"\n\
                 signing_secret_env = \"SWITCHBOARD_CHAOS_SLACK_SECRET\"\napi_base_url = \"{}\"\n",
                stub.url()
            ),
        )
        .context("write the chaos config.toml")?;
        let env = vec![
            (
                "SWITCHBOARD_CHAOS_SLACK_TOKEN".to_owned(),
                stub.token().to_owned(),
            ),
            (
                "SWITCHBOARD_CHAOS_SLACK_SECRET".to_owned(),
                SECRET.to_owned(),
            ),
        ];
        Ok((SlackChaos { stub }, env))
    }
}

/// The thread `tN`'s root message ts (its thread key is `CCHAOS:<ts>`).
pub(super) fn thread_ts(thread: &str) -> String {
    let n: u64 = thread.trim_start_matches('t').parse().unwrap_or(0);
    format!("1700000000.{n:06}")
}

/// Send `text` as a signed `app_mention` in `thread_ts`, retrying as Slack does (each attempt to the next
/// of `addrs`, as a load balancer in front of the processes would); answers the first 2xx status, else
/// the last status (0: no answer).
pub(super) async fn mention(
    http: &reqwest::Client,
    addrs: &[String],
    event_id: &str,
    thread_ts: &str,
    ts: &str,
    text: &str,
) -> u16 {
    let body = json!({"type": "event_callback", "team_id": "TCHAOS", "event_id": event_id,
        "event": {"type": "app_mention", "channel": CHANNEL, "user": "UCHAOS",
            "text": format!("<@UBOT> {text}"), "ts": ts, "thread_ts": thread_ts}})
    .to_string();
    let mut last = 0;
    for attempt in 0..ATTEMPTS {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
            .to_string();
        let addr = &addrs[attempt as usize % addrs.len()];
        let mut req = http
            .post(format!("http://{addr}/slack/events"))
            .header("content-type", "application/json")
            .header("X-Slack-Request-Timestamp", &now)
            .header(
                "X-Slack-Signature",
                web::routes::slack::sign(SECRET, &now, body.as_bytes()),
            )
            .body(body.clone());
        if attempt > 0 {
            req = req.header("X-Slack-Retry-Num", attempt.to_string());
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
        }
        last = match req.send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        if (200..300).contains(&last) {
            return last;
        }
    }
    last
}

/// What the stub saw, against the runs: counted violations and their lines.
#[derive(Debug, Default)]
pub(super) struct CardCounts {
    /// Runs with more than one card.
    pub second_cards: usize,
    /// Runs with no card at all.
    pub missing_cards: usize,
    /// Finished runs whose card still shows a live (`⏳`) frame.
    pub open_cards: usize,
    /// Runs with more than one reply.
    pub duplicated_replies: usize,
    /// Runs that delivered their answer (an `answer` event, never closed by a reclaim) without a reply.
    pub lost_replies: usize,
    /// Informational: cards and replies the stub holds.
    pub cards: usize,
    pub replies: usize,
}

impl CardCounts {
    pub fn json(&self) -> Value {
        json!({"cards": self.cards, "replies": self.replies, "second_cards": self.second_cards,
            "missing_cards": self.missing_cards, "open_cards": self.open_cards,
            "duplicated_replies": self.duplicated_replies, "lost_replies": self.lost_replies})
    }

    pub fn violations(&self) -> usize {
        self.second_cards
            + self.missing_cards
            + self.open_cards
            + self.duplicated_replies
            + self.lost_replies
    }
}

/// Count the cards and replies per run; `runs` holds each run's id and its events.
pub(super) fn check(
    stub: &SlackStub,
    runs: &[(String, Vec<Value>)],
    details: &mut Vec<String>,
) -> CardCounts {
    use crate::slack_stub::MessageKind;
    let messages = stub.messages();
    let mut c = CardCounts::default();
    for (id, events) in runs {
        let mine = |kind: MessageKind| {
            messages
                .iter()
                .filter(move |m| m.kind == kind && m.run_id.as_deref() == Some(id.as_str()))
        };
        let cards: Vec<_> = mine(MessageKind::Card).collect();
        let replies = mine(MessageKind::Reply).count();
        c.cards += cards.len();
        c.replies += replies;
        match cards.len() {
            0 => {
                c.missing_cards += 1;
                details.push(format!("run {id} has no card"));
            }
            1 => {}
            n => {
                c.second_cards += 1;
                let ts: Vec<&str> = cards.iter().map(|m| m.ts.as_str()).collect();
                details.push(format!("run {id} has {n} cards: {ts:?}"));
            }
        }
        if let Some(open) = cards.iter().find(|m| m.text.starts_with('⏳')) {
            c.open_cards += 1;
            details.push(format!(
                "run {id}: its card {} still shows {:?}",
                open.ts,
                open.text.lines().next().unwrap_or_default()
            ));
        }
        let answered = events.iter().any(|e| e["type"] == "answer");
        let reclaimed = events
            .iter()
            .any(|e| e["type"] == "note" && e["kind"] == "reclaimed");
        if replies > 1 {
            c.duplicated_replies += 1;
            details.push(format!("run {id} has {replies} replies"));
        } else if replies == 0 && answered && !reclaimed {
            c.lost_replies += 1;
            details.push(format!("run {id} answered but its thread has no reply"));
        }
    }
    c
}
