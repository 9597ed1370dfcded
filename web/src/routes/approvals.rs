//! `POST /api/runs/{id}/approvals/{callId}`: a person's decision on a tool call awaiting approval
//! (SPEC §13). The first decision wins; it is committed to the run's row before the tool can run.

use actix_web::{web, HttpRequest, HttpResponse};
use actors::runs_service::RunsError;
use actors::supervisor::{DecideApproval, DecideError};
use serde_json::{json, Value};
use storage::ledger::Decision;
use storage::RunId;

use super::resource;
use super::runs::BODY_LIMIT;
use crate::auth::RUNS_WRITE;
use crate::error::ApiError;
use crate::AppState;

/// Longest `note`, in characters.
pub const MAX_NOTE_CHARS: usize = 2000;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/api/runs/{id}/approvals/{callId}", "POST").route(web::post().to(decide)),
    );
}

/// `POST /api/runs/{id}/approvals/{callId}`: approve or deny a call the run awaits approval of.
#[utoipa::path(
    post,
    path = "/api/runs/{id}/approvals/{callId}",
    tag = "runs",
    params(
        ("id" = String, Path, description = "Run id"),
        ("callId" = String, Path, description = "The call's id, as its `approval_requested` event names it"),
        ("token" = Option<String>, Query, description = "The run's capability token (instead of a bearer token)"),
    ),
    request_body = crate::openapi::DecisionBody,
    responses(
        (status = 200, description = "The decision is committed; the run applies it", body = crate::openapi::DecisionTaken),
        (status = 400, description = "A bad decision or note (named)", body = crate::openapi::ErrorBody),
        (status = 401, description = "No or an unknown bearer token", body = crate::openapi::ErrorBody),
        (status = 403, description = "The token lacks the scope, a cross-site request, or the run is one the token may not see (nothing is written)", body = crate::openapi::ErrorBody),
        (status = 404, description = "No such run, or the run awaits no approval of that call", body = crate::openapi::ErrorBody),
        (status = 409, description = "The call was decided already (the first decision stands), or the run is past its wait", body = crate::openapi::ErrorBody),
        (status = 413, description = "Body over 512 KiB", body = crate::openapi::ErrorBody),
        (status = 415, description = "Not application/json", body = crate::openapi::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::openapi::ErrorBody),
    ),
    security((), ("bearer" = ["runs:write"]))
)]
pub async fn decide(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (run_id, call_id) = path.into_inner();
    let run_id = RunId::from(run_id);
    let by_token = super::api::capability(&state, &run_id, &super::api::query_map(&req)?).is_some();
    let who = if by_token {
        "capability".to_owned()
    } else {
        let p = state.auth.require(&req, RUNS_WRITE)?;
        // A run the caller cannot see is, to it, a run that does not exist.
        match state.runs.get_run(&run_id, false, &p.visible_to).await {
            Ok(_) => {}
            Err(RunsError::NotFound | RunsError::Forbidden(_) | RunsError::Conflict(_)) => {
                return Err(ApiError::NotFound(format!("run {run_id}")))
            }
            Err(RunsError::Unavailable(e)) => {
                tracing::warn!(%run_id, error = %e, "approval: run lookup unavailable");
                return Err(ApiError::Unavailable("could not read the run".into()));
            }
        }
        format!("token:{}", p.name)
    };
    let (decision, note) = parse_decision(&body)?;
    decide_as(&state, run_id, call_id, decision, who, note).await
}

/// Validate a decision body: `{decision: "approve"|"deny", note?}`, nothing else.
pub fn parse_decision(body: &[u8]) -> Result<(Decision, Option<String>), ApiError> {
    if body.len() > BODY_LIMIT {
        return Err(ApiError::PayloadTooLarge(format!(
            "body over {BODY_LIMIT} bytes"
        )));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("not JSON: {e}")))?;
    let Value::Object(map) = v else {
        return Err(ApiError::bad("body", "must be a JSON object"));
    };
    if let Some(unknown) = map
        .keys()
        .find(|k| !["decision", "note"].contains(&k.as_str()))
    {
        return Err(ApiError::bad(
            unknown.clone(),
            "is not a field of a decision",
        ));
    }
    let decision = map
        .get("decision")
        .and_then(Value::as_str)
        .and_then(Decision::parse)
        .ok_or_else(|| ApiError::bad("decision", "must be approve or deny"))?;
    let note = match map.get("note") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) if n.chars().take(MAX_NOTE_CHARS + 1).count() > MAX_NOTE_CHARS => {
            return Err(ApiError::bad(
                "note",
                format!("must be at most {MAX_NOTE_CHARS} characters"),
            ))
        }
        Some(Value::String(n)) => Some(n.clone()),
        Some(_) => return Err(ApiError::bad("note", "must be a string")),
    };
    Ok((decision, note))
}

/// Take a decision through the supervisor and answer as the route does: the one answer of every
/// surface that decides (the API, the Slack card's buttons).
pub async fn decide_as(
    state: &AppState,
    run_id: RunId,
    call_id: String,
    decision: Decision,
    who: String,
    note: Option<String>,
) -> Result<HttpResponse, ApiError> {
    let answer = state
        .supervisor
        .send(DecideApproval {
            run_id: run_id.clone(),
            call_id: call_id.clone(),
            decision,
            who,
            note,
        })
        .await
        .map_err(|e| ApiError::Unavailable(format!("supervisor: {e}")))?;
    match answer {
        Ok(d) => Ok(HttpResponse::Ok().json(json!({
            "runId": run_id, "callId": call_id, "decision": d.decision, "who": d.who,
            "note": d.note, "at": d.at,
        }))),
        Err(DecideError::NotFound) => Err(ApiError::NotFound(format!("run {run_id}"))),
        Err(e @ DecideError::UnknownCall(_)) => Err(ApiError::NotFound(e.to_string())),
        Err(DecideError::AlreadyDecided(first)) => Err(ApiError::Conflict(format!(
            "call {call_id} was decided already: {} by {}",
            first.decision.as_str(),
            first.who
        ))),
        Err(e @ DecideError::Finished) => Err(ApiError::Conflict(e.to_string())),
        Err(DecideError::Unavailable(e)) => {
            tracing::warn!(%run_id, error = %e, "approval unavailable");
            Err(ApiError::Unavailable(
                "could not record the decision".into(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(body: &str) -> String {
        match parse_decision(body.as_bytes()) {
            Err(ApiError::BadRequest { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn a_decision_body_is_a_decision_and_an_optional_note_and_nothing_else() {
        assert_eq!(
            parse_decision(br#"{"decision":"approve"}"#).unwrap(),
            (Decision::Approve, None)
        );
        assert_eq!(
            parse_decision(br#"{"decision":"deny","note":"no","extra":null}"#).map_err(|_| ()),
            Err(())
        );
        assert_eq!(
            parse_decision(br#"{"decision":"deny","note":null}"#).unwrap(),
            (Decision::Deny, None)
        );
        assert_eq!(refused_field(r#"{"decision":"maybe"}"#), "decision");
        assert_eq!(refused_field(r#"{}"#), "decision");
        assert_eq!(refused_field(r#"{"decision":"deny","note":3}"#), "note");
        assert_eq!(refused_field(r#"{"decision":"deny","extra":1}"#), "extra");
        assert_eq!(refused_field("[]"), "body");
        assert_eq!(refused_field("nope"), "body");
        let long = format!(
            r#"{{"decision":"deny","note":"{}"}}"#,
            "é".repeat(MAX_NOTE_CHARS + 1)
        );
        assert_eq!(refused_field(&long), "note");
        let fits = format!(
            r#"{{"decision":"deny","note":"{}"}}"#,
            "é".repeat(MAX_NOTE_CHARS)
        );
        assert!(parse_decision(fits.as_bytes()).is_ok());
    }
}
