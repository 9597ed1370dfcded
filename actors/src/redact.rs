//! The redactor (SPEC §8.3 "Redaction"): one place that replaces credentials in text before it is
//! stored or shown.
//!
//! Owns a compiled rule list and nothing else; it is immutable after boot and shared (`Arc<Redactor>`)
//! by whoever publishes text: run labels, `run_failed` messages, tool summaries and event text.
//!
//! What it replaces with `[redacted]`:
//!
//! | rule            | matches                                                      | keeps          |
//! |-----------------|--------------------------------------------------------------|----------------|
//! | bearer          | `Bearer <token>` (any case; a token of 8+ token characters)   | `Bearer `      |
//! | openai          | `sk-…` (16+ of `[A-Za-z0-9_-]`: `sk-proj-…`, `sk-ant-…` too)  |                |
//! | slack           | `xox[abposr]-…` (10+ of `[A-Za-z0-9-]`)                       |                |
//! | github          | `ghp_…`, `gho_…`, `ghu_…`, `ghs_…`, `ghr_…`, `github_pat_…`   |                |
//! | aws             | access key ids `AKIA…` / `ASIA…` (16 of `[0-9A-Z]`)           |                |
//! | pem             | `-----BEGIN … PRIVATE KEY-----` through its `END` line, or to the end of the text when the block was cut | |
//! | configured      | every `[redaction] patterns` regex, the whole match           |                |
//!
//! Invariants:
//! - text without a match is returned borrowed and unchanged ([`Redactor::redact`] answers
//!   `Cow::Borrowed`), so the common case costs one scan and no allocation;
//! - a configured pattern that matches the empty string is refused at construction: it would insert
//!   `[redacted]` between every two characters;
//! - it never sees the transcript: the model needs the raw text, and no read route serves it.
//!
//! # Design
//! One [`RegexSet`] over every rule finds which rules match in a single pass; only those rules then
//! rewrite. Redact before truncating (a summary cut in the middle of a key leaves a fragment too short
//! for the rules; the PEM rule alone also covers a block cut before its `END` line).

use std::borrow::Cow;

use regex::{Regex, RegexSet};
use serde_json::Value;

/// What replaces a secret.
pub const REDACTED: &str = "[redacted]";

/// The event fields [`Redactor::redact_event`] rewrites, at any depth.
pub const EVENT_TEXT_FIELDS: [&str; 5] = ["text", "summary", "message", "label", "error"];

/// The built-in rules: (name, pattern, replacement with `$keep` expanded).
const BUILTIN: [(&str, &str, &str); 6] = [
    (
        "bearer",
        r"(?i)\b(?P<keep>bearer\s+)[A-Za-z0-9\-._~+/]{8,}=*",
        "${keep}[redacted]",
    ),
    ("openai", r"\bsk-[A-Za-z0-9_\-]{16,}", REDACTED),
    ("slack", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}", REDACTED),
    (
        "github",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
        REDACTED,
    ),
    ("aws", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", REDACTED),
    (
        "pem",
        r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*)",
        REDACTED,
    ),
];

/// A configured pattern that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("redaction.patterns[{index}] `{pattern}` is not a valid regex: {why}")]
    Invalid {
        index: usize,
        pattern: String,
        why: String,
    },
    #[error("redaction.patterns[{index}] `{pattern}` matches the empty string")]
    MatchesEmpty { index: usize, pattern: String },
}

/// One rewrite rule.
#[derive(Debug, Clone)]
struct Rule {
    re: Regex,
    /// The replacement; `$keep` is expanded only for the built-ins that use it.
    replacement: &'static str,
    expand: bool,
}

/// Replaces credentials in text with `[redacted]`. Cheap to share (`Arc`); `Send + Sync`.
#[derive(Debug, Clone)]
pub struct Redactor {
    /// Every rule's pattern, in [`Redactor::rules`] order: one pass tells which rules apply.
    set: RegexSet,
    rules: Vec<Rule>,
}

impl Default for Redactor {
    /// The built-in rules only: compiled once per process, shared by clones.
    fn default() -> Self {
        static BUILTIN_ONLY: std::sync::LazyLock<Redactor> =
            std::sync::LazyLock::new(|| Redactor::new(&[]).expect("the built-in patterns compile"));
        BUILTIN_ONLY.clone()
    }
}

impl Redactor {
    /// The built-in rules plus `extra_patterns` (`[redaction] patterns`), each of which replaces its
    /// whole match. Errors name the pattern by its index in the config list.
    pub fn new(extra_patterns: &[String]) -> Result<Redactor, PatternError> {
        let mut rules: Vec<Rule> = BUILTIN
            .iter()
            .map(|(_, p, r)| Rule {
                re: Regex::new(p).expect("the built-in patterns compile"),
                replacement: r,
                expand: *r != REDACTED,
            })
            .collect();
        for (index, pattern) in extra_patterns.iter().enumerate() {
            let re = Regex::new(pattern).map_err(|e| PatternError::Invalid {
                index,
                pattern: pattern.clone(),
                why: e.to_string(),
            })?;
            if re.is_match("") {
                return Err(PatternError::MatchesEmpty {
                    index,
                    pattern: pattern.clone(),
                });
            }
            rules.push(Rule {
                re,
                replacement: REDACTED,
                expand: false,
            });
        }
        let set = RegexSet::new(rules.iter().map(|r| r.re.as_str())).map_err(|e| {
            PatternError::Invalid {
                index: 0,
                pattern: extra_patterns.join(" | "),
                why: e.to_string(),
            }
        })?;
        Ok(Redactor { set, rules })
    }

    /// `s` with every match of every rule replaced; borrowed when nothing matched.
    pub fn redact<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let matched = self.set.matches(s);
        if !matched.matched_any() {
            return Cow::Borrowed(s);
        }
        let mut out = s.to_owned();
        for i in matched.iter() {
            let rule = &self.rules[i];
            let replaced = if rule.expand {
                rule.re.replace_all(&out, rule.replacement)
            } else {
                rule.re.replace_all(&out, regex::NoExpand(rule.replacement))
            };
            if let Cow::Owned(o) = replaced {
                out = o;
            }
        }
        Cow::Owned(out)
    }

    /// Redacts, in place, every string under a key of [`EVENT_TEXT_FIELDS`] (`text`, `summary`,
    /// `message`, `label`, `error`) anywhere in `event`. Other fields (ids, seqs, tool names) are left
    /// alone.
    pub fn redact_event(&self, event: &mut Value) {
        match event {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    match value {
                        Value::String(s) if EVENT_TEXT_FIELDS.contains(&key.as_str()) => {
                            if let Cow::Owned(r) = self.redact(s) {
                                *s = r;
                            }
                        }
                        Value::Object(_) | Value::Array(_) => self.redact_event(value),
                        _ => {}
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_event(v)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_builtin_rule_redacts_its_secret() {
        let r = Redactor::default();
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nabc==\n-----END RSA PRIVATE KEY-----";
        let cases = [
            (
                "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig",
                "Authorization: Bearer [redacted]",
            ),
            (
                "curl -H 'authorization: bearer abcdefgh12345678'",
                "curl -H 'authorization: bearer [redacted]'",
            ),
            (
                "key sk-proj-AbCdEf0123456789xyz done",
                "key [redacted] done",
            ),
            (
                "OPENAI_API_KEY=sk-abcdefghijklmnop1234",
                "OPENAI_API_KEY=[redacted]",
            ),
            (
                "slack xoxb-123456789012-abcdefABCDEF ok",
                "slack [redacted] ok",
            ),
            ("xoxp-1111111111-2222", "[redacted]"),
            (
                "token ghp_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij",
                "token [redacted]",
            ),
            (
                "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
                "[redacted]",
            ),
            ("aws AKIAIOSFODNN7EXAMPLE here", "aws [redacted] here"),
            (&format!("key:\n{pem}\nafter"), "key:\n[redacted]\nafter"),
            // A block cut before its END line (a truncated summary) is redacted to the end.
            (
                "x -----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
                "x [redacted]",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(r.redact(input), want, "redact {input:?}");
        }
    }

    #[test]
    fn ordinary_text_is_left_intact_and_borrowed() {
        let r = Redactor::default();
        for text in [
            "step 1: appended 7 bytes to steps.log",
            "the bearer of bad news",
            "task-1234567890abcdefghij is a task id, not a key",
            "scikit-learn and sk-learn are libraries",
            "xoxo hugs, ghp is not a token, AKIA alone is not a key",
            "-----BEGIN PUBLIC KEY----- is not private",
            "",
        ] {
            assert!(
                matches!(r.redact(text), Cow::Borrowed(t) if t == text),
                "left intact: {text:?}"
            );
        }
    }

    #[test]
    fn configured_patterns_replace_their_whole_match() {
        let r = Redactor::new(&[r"ACME-[0-9]{6}".into(), r"(?i)password=\S+".into()]).unwrap();
        assert_eq!(
            r.redact("ticket ACME-123456, PASSWORD=hunter2 ok"),
            "ticket [redacted], [redacted] ok"
        );
        // Built-ins still apply alongside them.
        assert_eq!(
            r.redact("ACME-000001 sk-abcdefghijklmnopqrst"),
            "[redacted] [redacted]"
        );
        assert_eq!(r.redact("ACME-12"), "ACME-12");
    }

    #[test]
    fn a_bad_or_empty_matching_pattern_is_refused_by_index() {
        let e = Redactor::new(&["ok".into(), "(unclosed".into()]).unwrap_err();
        assert!(
            matches!(&e, PatternError::Invalid { index: 1, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("redaction.patterns[1]"), "{e}");
        let e = Redactor::new(&["a*".into()]).unwrap_err();
        assert_eq!(
            e,
            PatternError::MatchesEmpty {
                index: 0,
                pattern: "a*".into()
            }
        );
    }

    #[test]
    fn redact_event_rewrites_text_fields_at_any_depth_and_nothing_else() {
        let r = Redactor::default();
        let key = "sk-abcdefghijklmnopqrstuv";
        let mut event = json!({
            "type": "tool_result", "callId": key, "ok": true, "step": 3,
            "summary": format!("used {key}"),
            "text": "Bearer abcdefghijkl",
            "message": "no secret here",
            "label": format!("deploy with {key}"),
            "meta": {"label": key, "other": key},
            "items": [{"error": key}],
        });
        r.redact_event(&mut event);
        assert_eq!(
            event,
            json!({
                "type": "tool_result", "callId": key, "ok": true, "step": 3,
                "summary": "used [redacted]",
                "text": "Bearer [redacted]",
                "message": "no secret here",
                "label": "deploy with [redacted]",
                "meta": {"label": "[redacted]", "other": key},
                "items": [{"error": "[redacted]"}],
            })
        );
    }
}
