//! The `scripted` agent: the default `demo` agent, a deterministic function of the transcript (SPEC §8.3).
//!
//! Owns nothing. It reads directives from the text of the FIRST user turn (the run's request):
//!
//! | directive    | meaning                                                                | default |
//! |--------------|------------------------------------------------------------------------|---------|
//! | `steps=N`    | tool calls before the answer                                           | 3       |
//! | `tool=NAME`  | the tool to call                                                       | `sleep` |
//! | `ms=M`       | `sleep` duration per call                                              | 200     |
//! | `think_ms=M` | model latency before each answer (0 = no sleep at all)                 | 0       |
//! | `fail_at=K`  | the K-th model call (1-based) fails with [`AgentError::Permanent`]     | never   |
//! | `answer=TEXT`| the final answer; TEXT is the rest of that whitespace-separated token  | `done`  |
//!
//! A directive that does not parse is ignored (its default stands); a repeated one takes its last value.
//!
//! Each model call emits ONE tool call with text `step <n>` and call id `call-<n>`, where `n` is the
//! number of tool results already in the transcript plus one, until `steps` results exist; then a
//! text-only answer. The model call count is the number of assistant turns plus one, so a resumed run
//! continues where the transcript says, and `fail_at` fires at the same call after a resume.
//!
//! Follow-ups (text parts of user turns after the first, and text parts inside `tool_results` turns) are
//! echoed in the answer as `<answer> (follow-ups: <text1>; <text2>)`, so a steered message is visible.
//!
//! Each answer reports a deterministic [`Usage`] (see [`usage_of`]): input = the words the conversation
//! shows the model, output = the words of the answer plus one per tool call, so usage sums can be
//! tested without a network. Asked to stream ([`Agent::next_streaming`]), it reports its text word by
//! word (each delta keeps its trailing whitespace, so the deltas concatenate to the text).
//!
//! Invariants: no state between calls, no randomness, no clock reads (the only effect is the
//! `think_ms` sleep).

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Value};
use std::time::Duration;
use storage::ledger::Turn;

use super::{
    part, part_type, results_of, role, texts_of, Agent, AgentError, AssistantTurn, Conversation,
    DeltaFn, ToolCall, Usage,
};

/// The deterministic demo agent. Stateless: one value serves every run.
#[derive(Debug, Clone, Default)]
pub struct ScriptedAgent;

impl ScriptedAgent {
    pub fn new() -> Self {
        ScriptedAgent
    }
}

/// The directives read from the request text.
#[derive(Debug, Clone, PartialEq)]
pub struct Directives {
    pub steps: u64,
    pub tool: String,
    pub ms: u64,
    pub think_ms: u64,
    pub fail_at: Option<u64>,
    pub answer: String,
}

impl Default for Directives {
    fn default() -> Self {
        Directives {
            steps: 3,
            tool: "sleep".to_owned(),
            ms: 200,
            think_ms: 0,
            fail_at: None,
            answer: "done".to_owned(),
        }
    }
}

impl Directives {
    /// Reads `key=value` tokens from `text`; anything else, and any value that does not parse, is ignored.
    pub fn parse(text: &str) -> Directives {
        let mut d = Directives::default();
        for token in text.split_whitespace() {
            let Some((key, value)) = token.split_once('=') else {
                continue;
            };
            match key {
                "steps" => set_u64(&mut d.steps, value),
                "ms" => set_u64(&mut d.ms, value),
                "think_ms" => set_u64(&mut d.think_ms, value),
                "fail_at" => {
                    if let Ok(k @ 1..) = value.parse::<u64>() {
                        d.fail_at = Some(k);
                    }
                }
                "tool" if !value.is_empty() => d.tool = value.to_owned(),
                "answer" if !value.is_empty() => d.answer = value.to_owned(),
                _ => {}
            }
        }
        d
    }

    /// The directives of a conversation: from its first user turn, or the defaults without one.
    pub fn of(turns: &[Turn]) -> Directives {
        turns
            .iter()
            .find(|t| t.role == role::USER)
            .map(|t| Directives::parse(&texts_of(t).join("\n")))
            .unwrap_or_default()
    }

    /// The arguments of call `n` for the configured tool.
    fn args(&self, n: u64) -> Value {
        match self.tool.as_str() {
            "sleep" => json!({"ms": self.ms}),
            "echo" => json!({"text": format!("step {n}")}),
            "append_file" => {
                json!({"path": "steps.log", "line": format!("step {n}"), "ms": self.ms})
            }
            _ => json!({}),
        }
    }
}

fn set_u64(slot: &mut u64, value: &str) {
    if let Ok(v) = value.parse() {
        *slot = v;
    }
}

/// The scripted agent's decision for a conversation, without the `think_ms` latency (and without
/// usage: see [`usage_of`]).
pub fn decide(turns: &[Turn]) -> Result<AssistantTurn, AgentError> {
    let d = Directives::of(turns);
    let call_no = turns.iter().filter(|t| t.role == role::ASSISTANT).count() as u64 + 1;
    if d.fail_at == Some(call_no) {
        return Err(AgentError::Permanent(format!(
            "scripted failure at model call {call_no}"
        )));
    }
    let results = turns
        .iter()
        .filter(|t| t.role == role::TOOL_RESULTS)
        .map(|t| results_of(t).len() as u64)
        .sum::<u64>();
    if results < d.steps {
        let n = results + 1;
        return Ok(AssistantTurn {
            text: format!("step {n}"),
            calls: vec![ToolCall {
                call_id: format!("call-{n}"),
                tool: d.tool.clone(),
                args: d.args(n),
            }],
            usage: None,
        });
    }
    let followups = followups(turns);
    let text = if followups.is_empty() {
        d.answer
    } else {
        format!("{} (follow-ups: {})", d.answer, followups.join("; "))
    };
    Ok(AssistantTurn {
        text,
        calls: Vec::new(),
        usage: None,
    })
}

/// The scripted token count of answering `answer` to `conv`: input = whitespace-separated words of the
/// system prompt, of every text part and of every tool result's output, plus one per tool call in the
/// transcript; output = words of the answer's text plus one per tool call it makes.
pub fn usage_of(conv: &Conversation<'_>, answer: &AssistantTurn) -> Usage {
    let words = |s: &str| s.split_whitespace().count() as u64;
    let mut input_tokens = words(conv.system);
    for p in conv.turns.iter().flat_map(|t| &t.parts) {
        input_tokens += match part_type(p) {
            Some(part::TEXT) => p.get("text").and_then(Value::as_str).map_or(0, words),
            Some(part::TOOL_RESULT) => p.get("output").and_then(Value::as_str).map_or(0, words),
            Some(part::TOOL_CALL) => 1,
            _ => 0,
        };
    }
    Usage {
        input_tokens,
        output_tokens: words(&answer.text) + answer.calls.len() as u64,
    }
}

impl ScriptedAgent {
    /// A model call: the `think_ms` latency, the decision, its usage; the text to `on_delta` word by word.
    async fn call(
        &self,
        conv: Conversation<'_>,
        on_delta: Option<&DeltaFn<'_>>,
    ) -> Result<AssistantTurn, AgentError> {
        let think_ms = Directives::of(conv.turns).think_ms;
        if think_ms > 0 {
            tokio::time::sleep(Duration::from_millis(think_ms)).await;
        }
        let mut turn = decide(conv.turns)?;
        turn.usage = Some(usage_of(&conv, &turn));
        if let Some(on_delta) = on_delta {
            for word in turn.text.split_inclusive(char::is_whitespace) {
                on_delta(word);
            }
        }
        Ok(turn)
    }
}

/// Follow-up texts in transcript order: user turns after the first, and text parts of results turns.
fn followups(turns: &[Turn]) -> Vec<&str> {
    let mut seen_first_user = false;
    let mut out = Vec::new();
    for t in turns {
        match t.role.as_str() {
            role::USER if !seen_first_user => seen_first_user = true,
            role::USER | role::TOOL_RESULTS => out.extend(texts_of(t)),
            _ => {}
        }
    }
    out
}

impl Agent for ScriptedAgent {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    fn model(&self) -> &str {
        "scripted"
    }

    fn next<'a>(
        &'a self,
        conv: Conversation<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        self.call(conv, None).boxed()
    }

    fn next_streaming<'a>(
        &'a self,
        conv: Conversation<'a>,
        on_delta: &'a DeltaFn<'a>,
    ) -> BoxFuture<'a, Result<AssistantTurn, AgentError>> {
        self.call(conv, Some(on_delta)).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{followups_turn, results_turn, user_turn, ToolResult};

    fn call(n: u64, tool: &str, args: Value) -> AssistantTurn {
        AssistantTurn {
            text: format!("step {n}"),
            calls: vec![ToolCall {
                call_id: format!("call-{n}"),
                tool: tool.into(),
                args,
            }],
            usage: None,
        }
    }

    fn answer(text: &str) -> AssistantTurn {
        AssistantTurn {
            text: text.into(),
            calls: vec![],
            usage: None,
        }
    }

    /// A transcript after `done` completed steps: the request, then per step an assistant turn and
    /// its results turn (the results of the last step carry `folded` follow-ups).
    fn after_steps(request: &str, done: u64, folded: &[(u64, String)]) -> Vec<Turn> {
        let mut turns = vec![user_turn(request)];
        for n in 1..=done {
            turns.push(call(n, "sleep", json!({"ms": 200})).to_turn());
            let r = ToolResult {
                call_id: format!("call-{n}"),
                tool: "sleep".into(),
                ok: true,
                output: "ok".into(),
            };
            let f = if n == done { folded } else { &[] };
            turns.push(results_turn(&[r], f));
        }
        turns
    }

    #[test]
    fn directives_parse_with_defaults_for_bad_values() {
        let cases: Vec<(&str, Directives)> = vec![
            ("", Directives::default()),
            ("please do things", Directives::default()),
            (
                "steps=5 tool=echo ms=10 think_ms=30 fail_at=2 answer=hello",
                Directives {
                    steps: 5,
                    tool: "echo".into(),
                    ms: 10,
                    think_ms: 30,
                    fail_at: Some(2),
                    answer: "hello".into(),
                },
            ),
            (
                "steps=x ms=-4 think_ms=1.5 fail_at=0 tool= answer=",
                Directives::default(),
            ),
            (
                "steps=1 steps=2",
                Directives {
                    steps: 2,
                    ..Directives::default()
                },
            ),
            (
                "answer=two words",
                Directives {
                    answer: "two".into(),
                    ..Directives::default()
                },
            ),
            (
                "answer=a=b",
                Directives {
                    answer: "a=b".into(),
                    ..Directives::default()
                },
            ),
            (
                "run\nsteps=0\tms=7",
                Directives {
                    steps: 0,
                    ms: 7,
                    ..Directives::default()
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(Directives::parse(text), want, "directives of {text:?}");
        }
    }

    #[test]
    fn scripted_decisions_follow_the_transcript() {
        let cases: Vec<(&str, Vec<Turn>, Result<AssistantTurn, AgentError>)> = vec![
            (
                "first call of the default script sleeps",
                after_steps("go", 0, &[]),
                Ok(call(1, "sleep", json!({"ms": 200}))),
            ),
            (
                "second call continues at step 2",
                after_steps("go", 1, &[]),
                Ok(call(2, "sleep", json!({"ms": 200}))),
            ),
            (
                "after three results it answers",
                after_steps("go", 3, &[]),
                Ok(answer("done")),
            ),
            (
                "steps=0 answers at once",
                after_steps("steps=0 answer=hi", 0, &[]),
                Ok(answer("hi")),
            ),
            (
                "ms sets the sleep",
                after_steps("ms=5", 0, &[]),
                Ok(call(1, "sleep", json!({"ms": 5}))),
            ),
            (
                "echo takes text",
                after_steps("tool=echo", 1, &[]),
                Ok(call(2, "echo", json!({"text": "step 2"}))),
            ),
            (
                "append_file writes steps.log",
                after_steps("tool=append_file steps=2", 0, &[]),
                Ok(call(
                    1,
                    "append_file",
                    json!({"path": "steps.log", "line": "step 1", "ms": 200}),
                )),
            ),
            (
                "unknown tool gets empty args",
                after_steps("tool=frobnicate", 0, &[]),
                Ok(call(1, "frobnicate", json!({}))),
            ),
            (
                "fail_at fails the k-th model call",
                after_steps("fail_at=2", 1, &[]),
                Err(AgentError::Permanent(
                    "scripted failure at model call 2".into(),
                )),
            ),
            (
                "fail_at spares other calls",
                after_steps("fail_at=2", 2, &[]),
                Ok(call(3, "sleep", json!({"ms": 200}))),
            ),
            (
                "follow-ups folded at a step appear in the answer",
                after_steps("steps=1 answer=ok", 1, &[(4, "and also".into())]),
                Ok(answer("ok (follow-ups: and also)")),
            ),
            (
                "follow-ups after an answer appear in the next answer",
                {
                    let mut t = after_steps("steps=1", 1, &[(2, "first".into())]);
                    t.push(answer("done (follow-ups: first)").to_turn());
                    t.push(followups_turn(&[(3, "second".into()), (4, "third".into())]));
                    t
                },
                Ok(answer("done (follow-ups: first; second; third)")),
            ),
            (
                "directives come from the first user turn only",
                {
                    let mut t = after_steps("steps=1", 1, &[]);
                    t.push(answer("done").to_turn());
                    t.push(user_turn("steps=9"));
                    t
                },
                Ok(answer("done (follow-ups: steps=9)")),
            ),
            (
                "no user turn means defaults",
                vec![],
                Ok(call(1, "sleep", json!({"ms": 200}))),
            ),
        ];
        for (name, turns, want) in cases {
            assert_eq!(decide(&turns), want, "{name}");
        }
    }

    #[test]
    fn scripted_agent_names_itself() {
        let a = ScriptedAgent::new();
        assert_eq!(a.kind(), "scripted");
        assert_eq!(a.model(), "scripted");
    }

    #[tokio::test(start_paused = true)]
    async fn think_ms_delays_the_answer_and_zero_does_not_sleep() {
        let agent = ScriptedAgent::new();
        let tools = [];
        // think_ms=250: the (paused) clock advances by exactly the latency.
        let turns = after_steps("think_ms=250", 0, &[]);
        let start = tokio::time::Instant::now();
        let got = agent
            .next(Conversation {
                system: "s",
                turns: &turns,
                tools: &tools,
            })
            .await;
        let usage = Some(Usage {
            input_tokens: 2,
            output_tokens: 3,
        });
        assert_eq!(
            got,
            Ok(AssistantTurn {
                usage,
                ..call(1, "sleep", json!({"ms": 200}))
            })
        );
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        // Default think_ms=0: no timer at all, the answer is ready on first poll.
        let turns = after_steps("go", 0, &[]);
        let fut = agent.next(Conversation {
            system: "s",
            turns: &turns,
            tools: &tools,
        });
        assert!(fut.now_or_never().is_some());
    }

    #[test]
    fn usage_counts_words_in_and_out() {
        // System "be brief" (2) + request "steps=1 go" (2) + the call's text "step 1" (2) and the call
        // (1) + its result "ok" (1) + the folded follow-up "and also" (2) = 10 in; the answer
        // "done (follow-ups: and also)" is 4 out.
        let turns = after_steps("steps=1 go", 1, &[(4, "and also".into())]);
        let conv = Conversation {
            system: "be brief",
            turns: &turns,
            tools: &[],
        };
        let answer = decide(&turns).unwrap();
        assert_eq!(answer.text, "done (follow-ups: and also)");
        assert_eq!(
            usage_of(&conv, &answer),
            Usage {
                input_tokens: 10,
                output_tokens: 4
            }
        );
        // A tool-call turn: "step 1" is two words, plus one for the call.
        let turns = after_steps("go", 0, &[]);
        let conv = Conversation {
            system: "",
            turns: &turns,
            tools: &[],
        };
        assert_eq!(
            usage_of(&conv, &decide(&turns).unwrap()),
            Usage {
                input_tokens: 1,
                output_tokens: 3
            }
        );
    }

    #[tokio::test]
    async fn streaming_reports_the_text_word_by_word_then_the_same_turn() {
        let agent = ScriptedAgent::new();
        let turns = after_steps("steps=0 answer=hello", 0, &[(1, "one more".into())]);
        let deltas = std::sync::Mutex::new(Vec::<String>::new());
        let sink = |d: &str| deltas.lock().unwrap().push(d.to_owned());
        let conv = Conversation {
            system: "s",
            turns: &turns,
            tools: &[],
        };
        let streamed = agent.next_streaming(conv, &sink).await.unwrap();
        let plain = agent.next(conv).await.unwrap();
        assert_eq!(streamed, plain);
        assert_eq!(streamed.text, "hello");
        assert_eq!(deltas.into_inner().unwrap(), vec!["hello"]);

        let turns = after_steps("go", 3, &[(9, "a b".into())]);
        let deltas = std::sync::Mutex::new(Vec::<String>::new());
        let sink = |d: &str| deltas.lock().unwrap().push(d.to_owned());
        let got = agent
            .next_streaming(
                Conversation {
                    system: "",
                    turns: &turns,
                    tools: &[],
                },
                &sink,
            )
            .await
            .unwrap();
        let deltas = deltas.into_inner().unwrap();
        assert_eq!(deltas, vec!["done ", "(follow-ups: ", "a ", "b)"]);
        assert_eq!(deltas.concat(), got.text);
    }
}
