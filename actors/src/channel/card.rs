//! The status card's frames (SPEC §12): a pure fold of the run's own events into a [`CardView`], and
//! the one text a view renders to. The live view link is on every frame.

use serde_json::Value;
use storage::record::RunStatus;

use super::Frame;

/// Longest failure message or saved answer a frame quotes, in characters.
const QUOTE_CHARS: usize = 500;

/// What a card shows, as the run's events told it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CardView {
    pub run_id: String,
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
    pub fn new(run_id: &str, agent: &str, live_url: String, started_at: i64) -> Self {
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
            Some("tool_result") => self.tool = None,
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

    /// The frame this view shows now.
    pub fn frame(&self) -> Frame {
        let agent = &self.agent;
        let mut text = match &self.ending {
            None => {
                let doing = match (&self.tool, self.step) {
                    (_, 0) => "starting".to_owned(),
                    (Some(tool), k) => format!("step {k} · {tool}"),
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
        if self.resumed {
            text.push_str("\n🔁 resumed after a restart");
        }
        text.push_str(&format!("\n<{}|live view>", self.live_url));
        Frame {
            text,
            run_id: self.run_id.clone(),
            stop_button: self.ending.is_none(),
        }
    }
}

/// At most [`QUOTE_CHARS`] characters of `s`, with `…` when cut.
fn quote(s: &str) -> String {
    let mut out: String = s.chars().take(QUOTE_CHARS).collect();
    if s.chars().count() > QUOTE_CHARS {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view() -> CardView {
        CardView::new("r1", "demo", "http://x/runs/r1?token=t".into(), 1_000)
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
