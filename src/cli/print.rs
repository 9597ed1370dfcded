//! What `runs …` prints, the same against a server and against a database: the `--json` shapes pretty-
//! printed, the run table, `runs get` as `Key  value` lines, event lines; and a run's outcome (`answer`,
//! `error`, `stoppedBy`, `usage`) read from its events where the view does not carry it.
//!
//! Pure functions over the API's wire types and JSON: no I/O, no clock (callers pass `now`).

use std::fmt::Write as _;

use actors::runs_service::{EventPage, RunList, RunView};
use serde_json::{json, Value};
use web::routes::html::{describe, fmt_duration, fmt_time};

use super::decode;

pub(super) fn pretty(v: &Value) -> String {
    format!(
        "{}\n",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    )
}

/// Fill a RunView's `answer` (in full: a view's is capped), `error` and `stoppedBy` from its `events`
/// where the view does not carry them, then drop the events unless `keep_events`.
pub(super) fn with_outcome(view: &mut Value, keep_events: bool) {
    use actors::runs_service::{failure_message, stopped_by_of};
    let Some(obj) = view.as_object_mut() else {
        return;
    };
    let events: Vec<Value> = obj
        .get("events")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(text) = events
        .iter()
        .rev()
        .find(|e| e["type"] == "answer")
        .and_then(|e| e.get("text"))
        .filter(|t| t.is_string())
    {
        obj.insert("answer".into(), text.clone());
    }
    if !obj.contains_key("error") {
        if let Some(message) = failure_message(&events) {
            obj.insert("error".into(), json!(message));
        }
    }
    if !obj.contains_key("stoppedBy") {
        if let Some(by) = stopped_by_of(&events) {
            obj.insert("stoppedBy".into(), by);
        }
    }
    if !obj.contains_key("usage") {
        if let Some(usage) = usage_of_events(&events) {
            obj.insert("usage".into(), usage);
        }
    }
    if !keep_events {
        obj.remove("events");
    }
}

/// Token usage summed per model over the `assistant` events that carry it (SPEC §8.3): the record's
/// `usage` shape, `{<model>: {inputTokens, outputTokens}}`; `None` when no event carries usage.
fn usage_of_events(events: &[Value]) -> Option<Value> {
    let mut sums: std::collections::BTreeMap<String, (u64, u64)> =
        std::collections::BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.get("type").and_then(Value::as_str) == Some("assistant"))
    {
        let Some(u) = e.get("usage").filter(|u| u.is_object()) else {
            continue;
        };
        let model = e
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_owned();
        let sum = sums.entry(model).or_default();
        sum.0 += u.get("inputTokens").and_then(Value::as_u64).unwrap_or(0);
        sum.1 += u.get("outputTokens").and_then(Value::as_u64).unwrap_or(0);
    }
    (!sums.is_empty()).then(|| {
        Value::Object(
            sums.into_iter()
                .map(|(m, (i, o))| (m, json!({"inputTokens": i, "outputTokens": o})))
                .collect(),
        )
    })
}

/// `usage` as one line per model: `gpt-4o: 30 in / 8 out`.
fn usage_words(usage: &Value) -> Option<String> {
    let lines: Vec<String> = usage
        .as_object()?
        .iter()
        .map(|(model, u)| {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            format!(
                "{model}: {} in / {} out",
                n("inputTokens"),
                n("outputTokens")
            )
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A plain-text table with columns as wide as their widest cell.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        for (i, c) in cells.iter().enumerate() {
            if i == last {
                out.push_str(c);
            } else {
                let pad = widths[i] - c.chars().count();
                let _ = write!(out, "{c}{}  ", " ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

/// A label on one line, at most 60 characters.
fn one_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    let mut t: String = line.chars().take(60).collect();
    if line.chars().count() > 60 || s.lines().count() > 1 {
        t.push('…');
    }
    t
}

pub(super) fn list_table(list: &RunList, now: i64) -> String {
    let mut out = String::new();
    if list.store_unavailable {
        out.push_str("warning: the history store is unavailable; showing live runs only\n");
    }
    if list.ledger_unavailable {
        out.push_str(
            "warning: the live-run ledger is unavailable; runs of other processes may be missing\n",
        );
    }
    if list.runs.is_empty() {
        out.push_str("no runs\n");
    } else {
        let rows: Vec<Vec<String>> = list
            .runs
            .iter()
            .map(|v| {
                vec![
                    v.id.to_string(),
                    v.status_label(),
                    v.agent.clone().unwrap_or_default(),
                    fmt_time(v.started_at),
                    fmt_duration(v.duration_ms(now)),
                    v.finished_at.map(fmt_time).unwrap_or_else(|| "-".into()),
                    v.event_count.to_string(),
                    one_line(v.label.as_deref().unwrap_or("")),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "ID", "STATUS", "AGENT", "STARTED", "DURATION", "FINISHED", "EVENTS", "LABEL",
            ],
            &rows,
        ));
    }
    if let Some(nb) = &list.next_before {
        let _ = write!(out, "more: --before {}", nb.finished_at);
        if let Some(id) = &nb.id {
            let _ = write!(out, " --before-id {id}");
        }
        out.push('\n');
    }
    out
}

/// `kind:id` of a stop actor, or `-`.
fn actor_words(actor: Option<&Value>) -> String {
    let s = |k: &str| {
        actor
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    match (s("kind"), s("id")) {
        ("", "") => "unknown".into(),
        (kind, "") => kind.to_owned(),
        ("", id) => id.to_owned(),
        (kind, id) => format!("{kind}:{id}"),
    }
}

/// A value as text: a string as is, anything else as JSON.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.get("text").is_some_and(Value::is_string) => {
            o["text"].as_str().unwrap_or_default().to_owned()
        }
        other => other.to_string(),
    }
}

/// `runs get` as text: one `Key  value` line per field; the answer and the error in full (continuation
/// lines indented under the value).
pub(super) fn run_text(raw: &Value, now: i64) -> anyhow::Result<String> {
    let v: RunView = decode(raw.clone(), "run")?;
    let mut rows: Vec<(&str, String)> = vec![
        ("Run", v.id.to_string()),
        ("Status", v.status_label()),
        ("Label", v.label.clone().unwrap_or_default()),
        (
            "Agent",
            format!(
                "{} (model {})",
                v.agent.as_deref().unwrap_or("-"),
                v.model.as_deref().unwrap_or("-")
            ),
        ),
        (
            "Channel",
            format!("{} ({})", v.channel_id, v.channel_visibility.as_str()),
        ),
        ("Thread", v.thread_key.clone()),
        ("User", v.user_id.clone()),
        ("Started", fmt_time(v.started_at)),
        (
            "Finished",
            v.finished_at.map(fmt_time).unwrap_or_else(|| "-".into()),
        ),
        ("Duration", fmt_duration(v.duration_ms(now))),
    ];
    let mut events = v.event_count.to_string();
    if let Some(s) = v.stored_event_count.filter(|s| *s != v.event_count) {
        let _ = write!(events, " (stored {s})");
    }
    if v.truncated == Some(true) {
        events.push_str(" (truncated)");
    }
    rows.push(("Events", events));
    if let Some(g) = &v.owner_gen {
        rows.push(("Live in", format!("generation {g}")));
    }
    if let Some(p) = &v.parent_run_id {
        rows.push(("Parent", p.to_string()));
    }
    if let Some(by) = raw.get("stoppedBy").filter(|b| !b.is_null()) {
        let mode = by.get("mode").and_then(Value::as_str).unwrap_or("?");
        rows.push((
            "Stopped",
            format!("{mode}, by {}", actor_words(by.get("actor"))),
        ));
    } else if let Some(m) = v.stop {
        rows.push(("Stopped", format!("{}, by unknown", m.as_str())));
    }
    if let Some(e) = raw.get("error").filter(|e| !e.is_null()) {
        rows.push(("Error", text_of(e)));
    }
    if let Some(u) = raw.get("usage").and_then(usage_words) {
        rows.push(("Usage", u));
    }
    if let Some(a) = raw.get("answer").filter(|a| !a.is_null()) {
        rows.push(("Answer", text_of(a)));
    }
    let mut out = String::new();
    for (k, val) in rows {
        let _ = writeln!(out, "{k:<9} {}", val.replace('\n', "\n          "));
    }
    if let Some(evs) = &v.events {
        out.push('\n');
        out.push_str(&event_lines(evs));
    }
    Ok(out)
}

pub(super) fn event_lines(events: &[Value]) -> String {
    let mut out = String::new();
    for e in events {
        let (head, body) = describe(e);
        let seq = e
            .get("seq")
            .and_then(Value::as_u64)
            .map(|s| s.to_string())
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "#{seq:<5} {head}: {}", body.replace('\n', "\n       "));
    }
    out
}

pub(super) fn events_out(page: EventPage, json: bool) -> String {
    if json {
        return pretty(&serde_json::to_value(&page).unwrap_or(Value::Null));
    }
    let mut out = event_lines(&page.events);
    if let Some(n) = page.next_after_seq {
        let _ = writeln!(out, "more: --after-seq {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_outcome_is_read_from_events_when_the_view_does_not_carry_it() {
        // A run that was soft-stopped by a token, then hard-stopped by its capability link, and failed.
        let mut v = json!({"id": "r1", "events": [
            {"type": "stop_requested", "seq": 5, "mode": "soft", "actor": {"kind": "token", "id": "ops"}},
            {"type": "stop_requested", "seq": 6, "mode": "hard", "actor": {"kind": "capability", "id": "r1"}},
            {"type": "run_failed", "seq": 7, "message": "model said no"},
        ]});
        with_outcome(&mut v, false);
        assert_eq!(
            v["stoppedBy"],
            json!({"mode": "hard", "actor": {"kind": "capability", "id": "r1"}})
        );
        assert_eq!(v["error"], "model said no");
        assert!(v.get("answer").is_none() && v.get("events").is_none());
        // A view that carries them is taken at its word — but for the answer, which events hold in full.
        let mut v = json!({"id": "r1", "answer": "from the view", "error": "view", "events": [{"type": "answer", "text": "from events"}, {"type": "run_failed", "message": "events"}]});
        with_outcome(&mut v, true);
        assert_eq!(
            (v["answer"].as_str(), v["error"].as_str()),
            (Some("from events"), Some("view"))
        );
        assert!(v["events"].is_array());
        let mut v = json!({"id": "r1", "answer": "capped…"});
        with_outcome(&mut v, false);
        assert_eq!(v["answer"], "capped…");
    }

    #[test]
    fn usage_is_summed_per_model_from_assistant_events_and_printed() {
        let mut v = json!({"id": "r1", "events": [
            {"type": "assistant", "seq": 2, "model": "m1", "usage": {"inputTokens": 10, "outputTokens": 3}},
            {"type": "assistant", "seq": 4, "model": "m1", "usage": {"inputTokens": 20, "outputTokens": 5}},
            {"type": "assistant", "seq": 6, "model": "m2", "usage": {"inputTokens": 1, "outputTokens": 1}},
            {"type": "assistant", "seq": 7, "text": "no usage"},
        ]});
        with_outcome(&mut v, false);
        assert_eq!(
            v["usage"],
            json!({"m1": {"inputTokens": 30, "outputTokens": 8}, "m2": {"inputTokens": 1, "outputTokens": 1}})
        );
        assert_eq!(
            usage_words(&v["usage"]).as_deref(),
            Some("m1: 30 in / 8 out\nm2: 1 in / 1 out")
        );
        // A view that carries usage is taken at its word; none at all adds none.
        let mut v = json!({"id": "r1", "usage": {"x": {"inputTokens": 1, "outputTokens": 2}}, "events": []});
        with_outcome(&mut v, false);
        assert_eq!(
            v["usage"],
            json!({"x": {"inputTokens": 1, "outputTokens": 2}})
        );
        let mut v = json!({"id": "r1", "events": [{"type": "assistant", "text": "hi"}]});
        with_outcome(&mut v, false);
        assert!(v.get("usage").is_none());
    }
}
