//! The status card's frames (SPEC §12): a pure fold of the run's own events into a [`CardView`], and
//! the one text a view renders to. The live view link is on every frame.

use serde_json::Value;
use storage::record::RunStatus;
use storage::RunId;

use super::Frame;

/// Longest failure message or saved answer a frame quotes, in characters.
const QUOTE_CHARS: usize = 500;
/// The most calls awaiting approval a frame lists (with their buttons); the rest are counted. A step
/// rarely has more, and Slack caps a message at 50 blocks.
pub const AWAITED_SHOWN: usize = 10;

/// A tool call waiting for a person's decision (SPEC §13), as its `approval_requested` event named it:
/// the card shows it with Approve / Deny buttons until its `approval_decided` (or its `tool_result`, for
/// a call whose wait a stop ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwaitedCall {
    pub call_id: String,
    pub tool: String,
    /// The call's input, summarized and redacted as the event carries it.
    pub summary: String,
}

impl AwaitedCall {
    /// The frame's line for the call, its strings escaped for Slack's `mrkdwn` (`&`, `<`, `>`: an input
    /// cannot mention a channel or forge a link).
    pub fn line(&self) -> String {
        format!(
            "✋ waiting for approval: {} — {}",
            mrkdwn_escape(&self.tool),
            mrkdwn_escape(&self.summary)
        )
    }
}

/// What a card shows, as the run's events told it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CardView {
    pub run_id: RunId,
    pub agent: String,
    /// The run's live view (with its capability token).
    pub live_url: String,
    /// When the run started (ms), for the closing frame's time.
    pub started_at: i64,
    /// The step the run is at (the last `assistant` or `tool_call` event's).
    pub step: u64,
    /// The tool of the step's last `tool_call`, until its `tool_result` or the next step.
    pub tool: Option<String>,
    /// A `resumed` event was seen: the run continues after a restart.
    pub resumed: bool,
    /// The last `run_failed` message.
    pub failure: Option<String>,
    /// Who asked for the stop (`stop_requested`'s actor, `kind:id`).
    pub stopped_by: Option<String>,
    /// The calls awaiting approval, in the order they were requested.
    pub awaiting: Vec<AwaitedCall>,
    /// How the run ended, once it has.
    pub ending: Option<Ending>,
}

/// A closed card's frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The run ended with this status at this time (ms).
    Ended { status: RunStatus, finished_at: i64 },
    /// Closed from `finishing` by another process: the answer was saved, its delivery is unknown.
    Unconfirmed { answer: Option<String> },
}

impl CardView {
    pub fn new(run_id: &RunId, agent: &str, live_url: String, started_at: i64) -> Self {
        CardView {
            run_id: run_id.to_owned(),
            agent: agent.to_owned(),
            live_url,
            started_at,
            ..Default::default()
        }
    }

    /// The view after `events`, in order.
    pub fn folded<'a>(mut self, events: impl IntoIterator<Item = &'a Value>) -> Self {
        for event in events {
            self.observe(event);
        }
        self
    }

    /// Take one published event into the view; answers whether the frame may have changed.
    pub fn observe(&mut self, event: &Value) -> bool {
        let step = event.get("step").and_then(Value::as_u64);
        match event.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                self.step = step.unwrap_or(self.step);
                self.tool = None;
            }
            Some("tool_call") => {
                self.step = step.unwrap_or(self.step);
                self.tool = event.get("tool").and_then(Value::as_str).map(str::to_owned);
            }
            Some("tool_result") => {
                self.tool = None;
                // A call whose wait a stop ended gets its result (`notRun`) instead of a decision.
                self.settle(event);
            }
            Some("approval_requested") => {
                let field = |k| event.get(k).and_then(Value::as_str);
                let Some(call_id) = field("callId") else {
                    return false;
                };
                if self.awaiting.iter().any(|c| c.call_id == call_id) {
                    return false;
                }
                self.awaiting.push(AwaitedCall {
                    call_id: call_id.to_owned(),
                    tool: field("tool").unwrap_or("a tool").to_owned(),
                    summary: field("summary").unwrap_or_default().to_owned(),
                });
            }
            Some("approval_decided") => self.settle(event),
            Some("resumed") => self.resumed = true,
            Some("run_failed") => {
                self.failure = event
                    .get("message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }
            Some("stop_requested") => {
                let actor = event.get("actor");
                let part = |k| actor.and_then(|a| a.get(k)).and_then(Value::as_str);
                self.stopped_by = match (part("kind"), part("id")) {
                    (Some(kind), Some(id)) => Some(format!("{kind}:{id}")),
                    _ => Some("an operator".into()),
                };
            }
            _ => return false,
        }
        true
    }

    /// The call `event` names (`callId`) awaits no decision any more.
    fn settle(&mut self, event: &Value) {
        if let Some(call_id) = event.get("callId").and_then(Value::as_str) {
            self.awaiting.retain(|c| c.call_id != call_id);
        }
    }

    /// The awaited calls a live frame lists (and offers buttons for): none once the run ended.
    fn awaited_shown(&self) -> &[AwaitedCall] {
        match self.ending {
            None => &self.awaiting[..self.awaiting.len().min(AWAITED_SHOWN)],
            Some(_) => &[],
        }
    }

    /// The frame this view shows now.
    pub fn frame(&self) -> Frame {
        let agent = &self.agent;
        let mut text = match &self.ending {
            None => {
                let doing = match (&self.tool, self.step) {
                    (_, 0) => "starting".to_owned(),
                    (Some(tool), k) => format!("step {k} · {}", mrkdwn_escape(tool)),
                    (None, k) => format!("step {k} · thinking"),
                };
                format!("⏳ {agent} · {doing} …")
            }
            Some(Ending::Ended {
                status,
                finished_at,
            }) => match status {
                RunStatus::Completed => {
                    let secs = (finished_at - self.started_at).max(0) as f64 / 1000.0;
                    let steps = self.step;
                    let s = if steps == 1 { "" } else { "s" };
                    format!("✅ {agent} · done · {steps} step{s} · {secs:.1} s")
                }
                RunStatus::Failed => format!(
                    "❌ {agent} · failed: {}",
                    quote(self.failure.as_deref().unwrap_or("an error"))
                ),
                RunStatus::StoppedSoft => format!(
                    "⏹ stopped by {}",
                    self.stopped_by.as_deref().unwrap_or("an operator")
                ),
                RunStatus::StoppedHard => "⛔ hard-stopped".to_owned(),
                RunStatus::Interrupted => format!(
                    "❌ {agent} · interrupted — the process running it stopped before it could \
                     finish; send your message again to start over"
                ),
            },
            Some(Ending::Unconfirmed { answer }) => {
                let mut t = format!("⚠️ {agent} · ended, delivery unconfirmed");
                if let Some(answer) = answer {
                    t.push_str("\n> ");
                    t.push_str(&quote(answer).replace('\n', "\n> "));
                }
                t
            }
        };
        for call in self.awaited_shown() {
            text.push('\n');
            text.push_str(&call.line());
        }
        if self.ending.is_none() && self.awaiting.len() > AWAITED_SHOWN {
            let more = self.awaiting.len() - AWAITED_SHOWN;
            text.push_str(&format!(
                "\n✋ and {more} more awaiting approval: see the live view"
            ));
        }
        if self.resumed {
            text.push_str("\n🔁 resumed after a restart");
        }
        text.push_str(&format!("\n<{}|live view>", self.live_url));
        Frame {
            text,
            run_id: self.run_id.clone(),
            stop_button: self.ending.is_none(),
            approvals: self.awaited_shown().to_vec(),
        }
    }
}

/// `s` with Slack's three control characters escaped (`&amp;`, `&lt;`, `&gt;`), as Slack asks of text
/// that is not meant as markup.
fn mrkdwn_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// At most [`QUOTE_CHARS`] characters of `s`, with `…` when cut, escaped ([`mrkdwn_escape`]): a
/// failure message or an answer is shown as text, never as a mention or a link.
fn quote(s: &str) -> String {
    let mut out: String = s.chars().take(QUOTE_CHARS).collect();
    if s.chars().count() > QUOTE_CHARS {
        out.push('…');
    }
    mrkdwn_escape(&out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view() -> CardView {
        CardView::new(
            &RunId::from("r1"),
            "demo",
            "http://x/runs/r1?token=t".into(),
            1_000,
        )
    }

    #[test]
    fn a_live_card_follows_the_steps_and_tools_of_the_run_with_the_link_and_a_stop_button() {
        let mut v = view();
        assert!(v.frame().text.starts_with("⏳ demo · starting …"));
        assert!(v.observe(&json!({"type": "assistant", "step": 1})));
        assert!(v.frame().text.starts_with("⏳ demo · step 1 · thinking …"));
        v.observe(&json!({"type": "tool_call", "step": 1, "tool": "append_file"}));
        let frame = v.frame();
        assert!(frame.text.starts_with("⏳ demo · step 1 · append_file …"));
        assert!(frame.text.ends_with("<http://x/runs/r1?token=t|live view>"));
        assert!(frame.stop_button);
        assert_eq!(frame.run_id, "r1");
        v.observe(&json!({"type": "tool_result", "step": 1}));
        assert!(v.frame().text.starts_with("⏳ demo · step 1 · thinking …"));
        assert!(!v.observe(&json!({"type": "assistant_delta", "text": "x"})));
    }

    #[test]
    fn every_ending_has_its_frame_and_no_button() {
        let ended = |status, events: Vec<Value>| {
            let mut v = view().folded(&events);
            v.ending = Some(Ending::Ended {
                status,
                finished_at: 3_500,
            });
            v.frame()
        };
        let done = ended(
            RunStatus::Completed,
            vec![json!({"type": "assistant", "step": 3})],
        );
        assert!(
            done.text.starts_with("✅ demo · done · 3 steps · 2.5 s"),
            "{}",
            done.text
        );
        assert!(!done.stop_button);
        let failed = ended(
            RunStatus::Failed,
            vec![json!({"type": "run_failed", "message": "model said no"})],
        );
        assert!(failed.text.starts_with("❌ demo · failed: model said no"));
        // What a model or a provider wrote is text on the card, never a mention or a link.
        let loud = ended(
            RunStatus::Failed,
            vec![
                json!({"type": "run_failed", "message": "<!channel> & <https://x.invalid|click>"}),
            ],
        );
        assert!(
            loud.text.starts_with(
                "❌ demo · failed: &lt;!channel&gt; &amp; &lt;https://x.invalid|click&gt;"
            ),
            "{}",
            loud.text
        );
        let stopped = ended(
            RunStatus::StoppedSoft,
            vec![
                json!({"type": "stop_requested", "mode": "soft", "actor": {"kind": "slack", "id": "U1"}}),
            ],
        );
        assert!(stopped.text.starts_with("⏹ stopped by slack:U1"));
        assert!(ended(RunStatus::StoppedHard, vec![])
            .text
            .starts_with("⛔ hard-stopped"));
        let interrupted = ended(RunStatus::Interrupted, vec![]);
        assert!(interrupted
            .text
            .starts_with("❌ demo · interrupted — the process running it stopped"));
        let mut v = view().folded(&[json!({"type": "resumed"})]);
        v.ending = Some(Ending::Unconfirmed {
            answer: Some("42\nand more".into()),
        });
        let text = v.frame().text;
        assert!(text.starts_with("⚠️ demo · ended, delivery unconfirmed\n> 42\n> and more\n🔁 resumed after a restart\n<"), "{text}");
    }

    fn requested(call_id: &str, summary: &str) -> Value {
        json!({"type": "approval_requested", "step": 1, "callId": call_id, "tool": "append_file",
            "input": {"path": "notes.txt"}, "summary": summary})
    }

    #[test]
    fn a_call_awaiting_approval_shows_its_line_until_its_decision() {
        let mut v = view().folded(&[
            json!({"type": "assistant", "step": 1}),
            json!({"type": "tool_call", "step": 1, "callId": "call-1", "tool": "append_file"}),
        ]);
        assert!(v.observe(&requested("call-1", "{\"path\":\"notes.txt\"}")));
        let text = v.frame().text;
        assert_eq!(
            text,
            "⏳ demo · step 1 · append_file …\n✋ waiting for approval: append_file — \
             {\"path\":\"notes.txt\"}\n<http://x/runs/r1?token=t|live view>"
        );
        // A resumed run's fold holds the one request once; a second sight of it changes nothing.
        assert!(!v.observe(&requested("call-1", "{}")));
        // The buttons: one pair, for the call the line shows.
        let frame = v.frame();
        assert_eq!(
            frame.approvals,
            [AwaitedCall {
                call_id: "call-1".into(),
                tool: "append_file".into(),
                summary: "{\"path\":\"notes.txt\"}".into(),
            }]
        );
        assert!(frame.stop_button, "a parked run can still be stopped");
        assert!(v.observe(
            &json!({"type": "approval_decided", "step": 1, "callId": "call-1",
            "tool": "append_file", "decision": "approve", "who": "slack:U1"})
        ));
        let frame = v.frame();
        assert!(frame.approvals.is_empty(), "decided: no buttons");
        let text = frame.text;
        assert!(!text.contains('✋'), "{text}");
        assert!(
            text.starts_with("⏳ demo · step 1 · append_file …"),
            "{text}"
        );
    }

    #[test]
    fn a_stopped_wait_ends_the_line_and_an_ended_run_lists_nothing() {
        let mut v = view().folded(&[requested("call-1", "a"), requested("call-2", "b")]);
        assert_eq!(v.frame().text.matches("✋ waiting for approval").count(), 2);
        // A stop ended the wait: the call's result says it never ran.
        v.observe(&json!({"type": "tool_result", "step": 1, "callId": "call-1", "notRun": true}));
        assert_eq!(
            v.awaiting
                .iter()
                .map(|c| c.call_id.as_str())
                .collect::<Vec<_>>(),
            ["call-2"]
        );
        v.ending = Some(Ending::Ended {
            status: RunStatus::StoppedSoft,
            finished_at: 2_000,
        });
        let closing = v.frame();
        assert!(!closing.text.contains('✋') && closing.approvals.is_empty());
    }

    #[test]
    fn an_awaited_calls_strings_cannot_become_slack_markup_and_many_calls_are_counted() {
        let v = view().folded(&[requested("c", "<!channel> & <http://evil|click>")]);
        let text = v.frame().text;
        assert!(
            text.contains("— &lt;!channel&gt; &amp; &lt;http://evil|click&gt;\n"),
            "{text}"
        );
        let many: Vec<Value> = (1..=AWAITED_SHOWN + 3)
            .map(|n| requested(&format!("call-{n}"), "x"))
            .collect();
        let frame = view().folded(&many).frame();
        assert_eq!(frame.approvals.len(), AWAITED_SHOWN);
        assert_eq!(frame.approvals[0].call_id, "call-1");
        let text = frame.text;
        assert_eq!(
            text.matches("✋ waiting for approval").count(),
            AWAITED_SHOWN
        );
        assert!(
            text.contains("\n✋ and 3 more awaiting approval: see the live view\n"),
            "{text}"
        );
    }

    #[test]
    fn a_long_failure_is_quoted_capped() {
        let mut v = view().folded(&[json!({"type": "run_failed", "message": "x".repeat(2_000)})]);
        v.ending = Some(Ending::Ended {
            status: RunStatus::Failed,
            finished_at: 2_000,
        });
        let text = v.frame().text;
        assert!(text.contains(&format!("{}…", "x".repeat(QUOTE_CHARS))));
        assert!(!text.contains(&"x".repeat(QUOTE_CHARS + 1)));
    }
}
