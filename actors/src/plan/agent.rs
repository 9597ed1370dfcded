//! `AgentPlanProvider`: the production suggestion provider — one agent run (SPEC §5) per invocation.
//!
//! An invocation admits a message through the [`Supervisor`] on a fresh thread `plan:<request id>`
//! (visibility `machine`), then follows the run in the [`Registry`] until it has finished — or reads its
//! final record from the store once it has left the registry — and parses its `answer` event as a JSON
//! array of cards `[{title, body}]`. Abort is a hard stop ([`StopRun`] with [`StopMode::Hard`]); the
//! invocation still resolves only once the run has actually finished, as the provider contract requires.
//! It does not validate the cards (the coordinator does, every one) and holds no state between
//! invocations.

use actix::Addr;
use futures_util::future::LocalBoxFuture;
use serde_json::Value;
use storage::ledger::StopMode;
use storage::plan::{Card, RequestId};
use storage::record::RunStatus;
use storage::RunId;
use storage::StorageHandle;

use super::provider::{
    AbortSignal, ProviderError, ProviderResult, SuggestionJob, SuggestionProvider,
};
use crate::registry::Registry;
use crate::run::{Request, StopActor};
use crate::supervisor::{AdmitMessage, Admitted, StopRun, Supervisor};

/// The channel of plan threads: a run's thread key is `plan:<request id>`.
pub const PLAN_CHANNEL: &str = "plan";

/// Runs each suggestion as an agent run through the supervisor.
#[derive(Clone)]
pub struct AgentPlanProvider {
    supervisor: Addr<Supervisor>,
    registry: Registry,
    storage: StorageHandle,
    /// The configured agent to run (`None`: `[defaults] agent`).
    agent: Option<String>,
}

impl std::fmt::Debug for AgentPlanProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentPlanProvider")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl AgentPlanProvider {
    pub fn new(
        supervisor: Addr<Supervisor>,
        registry: Registry,
        storage: StorageHandle,
        agent: Option<String>,
    ) -> Self {
        AgentPlanProvider {
            supervisor,
            registry,
            storage,
            agent,
        }
    }
}

impl SuggestionProvider for AgentPlanProvider {
    fn invoke(
        &self,
        job: SuggestionJob,
        abort: AbortSignal,
    ) -> LocalBoxFuture<'static, ProviderResult> {
        let this = self.clone();
        Box::pin(async move { this.run(job, abort).await })
    }
}

impl AgentPlanProvider {
    async fn run(self, job: SuggestionJob, abort: AbortSignal) -> ProviderResult {
        if abort.is_requested() {
            return Err(ProviderError::Aborted(
                "aborted before the agent run started".into(),
            ));
        }
        let request = plan_request(&job.request_id, compose_prompt(&job), self.agent.clone());
        let admitted = self
            .supervisor
            .send(AdmitMessage {
                request,
                key: None,
                writer: None,
            })
            .await
            .map_err(|e| ProviderError::Rejected(format!("supervisor: {e}")))?
            .map_err(|e| ProviderError::Rejected(format!("admission refused: {e}")))?;
        let run_id = match admitted {
            Admitted::Started { run_id, .. } => run_id,
            Admitted::Steered { run_id, .. } | Admitted::Queued { run_id, .. } => {
                return Err(ProviderError::Rejected(format!(
                    "the plan thread was already live with run {run_id}"
                )))
            }
        };
        self.follow(&run_id, &job.request_id, abort).await
    }

    /// Follow the admitted run `run_id` until it has finished and read its answer as cards; an abort
    /// request hard-stops it, and the answer still waits for its end. A run the registry no longer holds has
    /// landed (its final record is in the store; a fresh run can finish before this follows it), so its
    /// ending and answer are read from the record.
    pub async fn follow(
        &self,
        run_id: &RunId,
        request_id: &RequestId,
        mut abort: AbortSignal,
    ) -> ProviderResult {
        let mut stop_sent = false;
        let mut after = 0u64;
        let mut answer: Option<String> = None;
        // A subscription closes when the run finishes (or when this subscriber falls behind, in which case
        // it resubscribes after the last seq it saw).
        let status = loop {
            let Some((backlog, mut rx, finished)) = self.registry.subscribe(run_id, after) else {
                break self.landed(run_id, &mut answer).await?;
            };
            for event in backlog {
                note(&event.event, &mut after, &mut answer);
            }
            // How the run ended, as its queue's last frame says.
            let mut ended = None;
            if !finished {
                loop {
                    tokio::select! {
                        event = rx.recv() => match event {
                            Some(event) => match event.as_end() {
                                Some((status, _)) => ended = Some(status),
                                None => note(&event.event, &mut after, &mut answer),
                            },
                            None => break,
                        },
                        () = abort.requested(), if !stop_sent => {
                            stop_sent = true;
                            self.hard_stop(run_id, request_id).await;
                        }
                    }
                }
            }
            match (ended, self.registry.row(run_id)) {
                (Some(status), _) => break Some(status),
                (None, Some(row)) if row.finished_at.is_none() => continue,
                (None, Some(row)) => break row.status,
                (None, None) => break self.landed(run_id, &mut answer).await?,
            }
        };
        match (status, answer) {
            (Some(RunStatus::Completed), Some(text)) if !stop_sent => {
                parse_cards(&text).map_err(ProviderError::Rejected)
            }
            (status, _) if stop_sent => Err(ProviderError::Aborted(format!(
                "the agent run {run_id} stopped ({})",
                status.map(RunStatus::as_str).unwrap_or("unknown")
            ))),
            (Some(RunStatus::Completed), None) => Err(ProviderError::Rejected(format!(
                "the agent run {run_id} completed without an answer"
            ))),
            (status, _) => Err(ProviderError::Rejected(format!(
                "the agent run {run_id} ended {}",
                status.map(RunStatus::as_str).unwrap_or("unknown")
            ))),
        }
    }

    /// The ending of a run that left the registry, from its final record: its status, and its newest
    /// `answer` into `answer`. A run with no final record was handed away (fenced, or reclaimed by another
    /// process), so this provider cannot see it end.
    async fn landed(
        &self,
        run_id: &RunId,
        answer: &mut Option<String>,
    ) -> Result<Option<RunStatus>, ProviderError> {
        let record = self
            .storage
            .get(run_id.to_owned())
            .await
            .map_err(|e| ProviderError::Rejected(format!("reading run {run_id}: {e}")))?;
        match record {
            Some(record) if !record.head.provisional => {
                let mut after = 0;
                for event in &record.events {
                    note(event, &mut after, answer);
                }
                Ok(Some(record.head.status))
            }
            _ => Err(ProviderError::Rejected(format!(
                "run {run_id} ended without a record"
            ))),
        }
    }

    async fn hard_stop(&self, run_id: &RunId, request_id: &RequestId) {
        let stop = StopRun {
            run_id: run_id.to_owned(),
            mode: StopMode::Hard,
            actor: StopActor::new("plan", request_id.as_str()),
        };
        match self.supervisor.send(stop).await {
            Ok(Ok(())) => tracing::info!(
                %run_id,
                request_id = request_id.as_str(),
                "hard-stopped a plan run"
            ),
            Ok(Err(e)) => {
                tracing::info!(%run_id, error = %e, "a plan run's hard stop found nothing to stop")
            }
            Err(e) => {
                tracing::warn!(%run_id, error = %e, "could not reach the supervisor to stop a plan run")
            }
        }
    }
}

/// The message a plan request admits: `text` on the fresh thread `plan:<request id>`, visible to machines
/// only, for `agent` (`None`: `[defaults] agent`).
pub fn plan_request(request_id: &RequestId, text: String, agent: Option<String>) -> Request {
    Request {
        thread: request_id.as_str().to_owned(),
        channel: PLAN_CHANNEL.to_owned(),
        user: PLAN_CHANNEL.to_owned(),
        text,
        agent,
        visibility: Some("machine".to_owned()),
        parent_run_id: None,
        source: Default::default(),
        strategy: None,
    }
}

/// Track the highest seq seen and the newest `answer` text.
fn note(event: &Value, after: &mut u64, answer: &mut Option<String>) {
    if let Some(seq) = storage::record::event_seq(event) {
        *after = (*after).max(seq);
    }
    if event.get("type").and_then(Value::as_str) == Some("answer") {
        *answer = event.get("text").and_then(Value::as_str).map(str::to_owned);
    }
}

/// The agent's request text: the instructions, the captured binding, the base cards and context, and the
/// user's prompt last.
pub fn compose_prompt(job: &SuggestionJob) -> String {
    let input = &job.input;
    let cards = serde_json::to_string(&input.cards).unwrap_or_else(|_| "[]".into());
    let mut text = format!(
        "Suggest cards for plan {} (revision {}, snapshot {}).\n\
         Answer with ONLY a JSON array of cards: [{{\"title\": \"...\", \"body\": \"...\"}}] \
         (title at most 200 characters, body at most 8 KiB).\n\
         Current cards: {cards}\n",
        job.binding.plan_id.as_str(),
        job.binding.revision,
        job.binding.snapshot_id.as_str(),
    );
    if !input.context.is_null() {
        text.push_str(&format!("Context: {}\n", input.context));
    }
    text.push_str("Request: ");
    text.push_str(&input.prompt);
    text
}

/// Parse an answer as a JSON array of `{title, body}` cards (a fenced code block around it is tolerated).
/// Limits are not checked here: the coordinator validates every card.
pub fn parse_cards(answer: &str) -> Result<Vec<Card>, String> {
    let mut text = answer.trim();
    if let Some(rest) = text.strip_prefix("```") {
        let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
        text = rest.strip_suffix("```").unwrap_or(rest).trim();
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the answer is not JSON: {e}"))?;
    let Value::Array(items) = value else {
        return Err("the answer is not a JSON array of cards".into());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |name: &str| match item.get(name) {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(format!("card {i}: {name} must be a string")),
            };
            Ok(Card {
                title: field("title")?,
                body: field("body")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_parses_as_cards_with_or_without_a_fence() {
        let want = vec![Card {
            title: "a".into(),
            body: "b".into(),
        }];
        assert_eq!(
            parse_cards(r#"[{"title": "a", "body": "b"}]"#),
            Ok(want.clone())
        );
        assert_eq!(
            parse_cards("```json\n[{\"title\":\"a\",\"body\":\"b\",\"extra\":1}]\n```"),
            Ok(want)
        );
        assert_eq!(parse_cards(" [] "), Ok(vec![]));
    }

    #[test]
    fn anything_but_an_array_of_title_body_objects_is_refused_by_name() {
        assert!(parse_cards("done").unwrap_err().contains("not JSON"));
        assert!(parse_cards(r#"{"title": "a"}"#)
            .unwrap_err()
            .contains("not a JSON array"));
        assert_eq!(
            parse_cards(r#"[{"title": "a"}]"#),
            Err("card 0: body must be a string".into())
        );
        assert_eq!(
            parse_cards(r#"[{"title": 1, "body": ""}]"#),
            Err("card 0: title must be a string".into())
        );
    }
}
