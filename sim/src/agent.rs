//! The scripted agent and the fake tools of the simulation.
//!
//! A message's text is `m<k>:<letters>`: one letter per tool call the run owes for it (`m` mutating,
//! `p` side-effect free, `i` idempotent with a key, `f` a permanent model failure at that point). The
//! agent is deterministic from the transcript alone, as a resume needs: it reads every user text (the
//! request and every folded follow-up), concatenates their letters, counts the tool results the
//! transcript already holds (synthetic ones included) and asks for the next calls — at most two per
//! turn — or, when none is owed, answers `done <letters>`. So a follow-up becomes extra turns, and a
//! resumed run asks exactly for what is still owed.

use actors::agent::{self, AssistantTurn, ToolCall, ToolDef};
use serde_json::{json, Value};
use storage::ledger::Turn;

/// The tools every simulated process offers, with the flags a resume settles in-flight calls by: `mut`
/// (mutating: effects unknown), `pure` (side-effect free: re-run), `idem` (an external tool honouring its
/// idempotency key: re-sent with the same key).
pub fn tool_defs() -> Vec<ToolDef> {
    let def = |name: &str, side_effect_free: bool, idempotent: bool| ToolDef {
        name: name.to_owned(),
        description: String::new(),
        parameters: json!({"type": "object"}),
        side_effect_free,
        rerun_safe: false,
        idempotent,
    };
    vec![
        def("mut", false, false),
        def("pure", true, false),
        def("idem", false, true),
    ]
}

/// The tool a letter names.
pub fn tool_of(letter: char) -> &'static str {
    match letter {
        'm' => "mut",
        'i' => "idem",
        _ => "pure",
    }
}

/// The message nonces (`m<k>`) a text carries, in order.
pub fn nonces(text: &str) -> Vec<usize> {
    text.split(|c: char| c.is_whitespace())
        .filter_map(|word| word.strip_prefix('m'))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .collect()
}

/// The letters a text owes, in order.
fn letters(text: &str) -> String {
    text.split(|c: char| c.is_whitespace())
        .filter_map(|w| w.split_once(':').map(|(_, l)| l.to_owned()))
        .collect()
}

/// The next assistant turn for `turns` (everything after the system turn).
pub fn next(turns: &[Turn]) -> Result<AssistantTurn, String> {
    let mut owed = String::new();
    let mut results = 0usize;
    for turn in turns {
        match turn.role.as_str() {
            "user" | "tool_results" => {
                for text in agent::texts_of(turn) {
                    owed.push_str(&letters(text));
                }
                results += agent::results_of(turn).len();
            }
            _ => {}
        }
    }
    let owed: Vec<char> = owed.chars().collect();
    if results >= owed.len() {
        let all: String = owed.iter().collect();
        return Ok(AssistantTurn {
            text: format!("done {all}"),
            ..Default::default()
        });
    }
    if owed[results] == 'f' {
        return Err("scripted model failure".into());
    }
    let mut calls = Vec::new();
    for (i, letter) in owed.iter().enumerate().skip(results).take(2) {
        if *letter == 'f' {
            break;
        }
        calls.push(ToolCall {
            call_id: format!("c{}", i + 1),
            tool: tool_of(*letter).to_owned(),
            args: Value::Null,
        });
    }
    Ok(AssistantTurn {
        calls,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_asks_for_what_is_owed_then_answers() {
        let user = agent::user_turn("m1:mp");
        let first = next(std::slice::from_ref(&user)).expect("calls");
        assert_eq!(
            first
                .calls
                .iter()
                .map(|c| c.call_id.as_str())
                .collect::<Vec<_>>(),
            ["c1", "c2"]
        );
        let results = agent::results_turn(
            &[
                agent::ToolResult {
                    call_id: "c1".into(),
                    tool: "mut".into(),
                    ok: true,
                    output: "ok".into(),
                },
                agent::ToolResult {
                    call_id: "c2".into(),
                    tool: "pure".into(),
                    ok: true,
                    output: "ok".into(),
                },
            ],
            &[(1, "m7:i".into())],
        );
        let turns = vec![user, first.to_turn(), results];
        let second = next(&turns).expect("a call for the follow-up");
        assert_eq!(second.calls.len(), 1);
        assert_eq!(second.calls[0].tool, "idem");
        assert_eq!(nonces("m1:mp\n\nm7:i"), [1, 7]);
    }
}
