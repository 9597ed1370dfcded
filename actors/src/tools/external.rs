//! What the two kinds of external tool share: their settings, their names, their errors, the
//! idempotency key and the pre-dispatch fence check; and [`external_tools`], which boot calls once.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use storage::RunId;

use serde_json::Value;

use super::http::HttpTool;
use super::mcp::McpServer;
use super::{off_runtime, with_fence, Tool, ToolContext, ToolOutput, TOOL_LOCK_WAIT};
use crate::agent::ToolDef;

/// A call's timeout when the config gives none (`timeout_ms`).
pub const DEFAULT_EXTERNAL_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest tool name a model provider accepts (`[A-Za-z0-9_-]{1,64}`).
pub const MAX_TOOL_NAME: usize = 64;

/// One `[[tools.http]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpToolSpec {
    /// The tool's name as the model sees it: `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    pub description: String,
    /// The JSON Schema of the `input` object (`{"type": "object"}` when not configured).
    pub input_schema: Value,
    /// Where each call is POSTed.
    pub url: String,
    /// `false`: the endpoint has no effects (side-effect free: re-run at resume).
    pub mutating: bool,
    /// The endpoint honours `Idempotency-Key`: a call in flight at a crash is re-sent with the same key.
    pub idempotent: bool,
    /// Every call waits for a person's approval (SPEC §13).
    pub approval: bool,
    pub timeout: Duration,
}

/// One `[[tools.mcp]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServerSpec {
    /// The prefix of the server's tool names (`<prefix>__<tool>`): `[A-Za-z0-9_-]+`.
    pub prefix: String,
    /// The server's streamable-HTTP endpoint.
    pub url: String,
    /// Bounds the boot handshake (`initialize` + `tools/list`) and each `tools/call`.
    pub timeout: Duration,
}

/// Everything [`external_tools`] needs from the config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExternalToolsSettings {
    pub http: Vec<HttpToolSpec>,
    pub mcp: Vec<McpServerSpec>,
    /// The webhook signing key (`delivery.secret_env`): HTTP tool calls carry the Standard Webhooks
    /// signature headers when it is set.
    pub secret: Option<Vec<u8>>,
}

/// Why the external tools could not be built. Each names the config entry (`tools.http[0]`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExternalToolError {
    #[error("{key}: `{name}` is not a tool name (1 to {MAX_TOOL_NAME} of A-Z a-z 0-9 _ -)")]
    BadName { key: String, name: String },
    #[error("{key}: url `{url}` must start with http:// or https://")]
    BadUrl { key: String, url: String },
    #[error("{key}: input_schema {why}")]
    BadSchema { key: String, why: String },
    #[error("{key}: timeout_ms must be positive")]
    BadTimeout { key: String },
    /// Two entries produce the same tool name.
    #[error("tool name `{name}` is used by both {first} and {second}")]
    Duplicate {
        name: String,
        first: String,
        second: String,
    },
    /// [`super::Toolbox::with_external`]: the name is already in the toolbox (a built-in).
    #[error("external tool `{name}` would replace a tool of the same name")]
    Taken { name: String },
    /// The MCP server did not answer `initialize` or `tools/list` at boot.
    #[error("{key}: mcp server {url} is unavailable: {why}")]
    McpUnavailable {
        key: String,
        url: String,
        why: String,
    },
}

/// `<runId>/<callId>`: the idempotency key of one call (SPEC §8.3), the same for every attempt of it.
pub fn idempotency_key(run_id: &RunId, call_id: &str) -> String {
    format!("{run_id}/{call_id}")
}

/// The [`ToolDef`] of an external tool: the one place external tools build one, so a new flag on it
/// (`idempotent`, SPEC §6.2) is set here for both kinds. `idempotent` is also answered by
/// [`Tool::idempotent`] until `ToolDef` carries it.
pub(super) fn tool_def(
    name: String,
    description: String,
    parameters: Value,
    side_effect_free: bool,
    idempotent: bool,
) -> ToolDef {
    ToolDef {
        name,
        description,
        parameters,
        side_effect_free,
        rerun_safe: side_effect_free,
        idempotent,
    }
}

/// Whether `name` is `[A-Za-z0-9_-]{1,64}`.
pub(super) fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(super) fn check_url(key: &str, url: &str) -> Result<(), ExternalToolError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(ExternalToolError::BadUrl {
            key: key.to_owned(),
            url: url.to_owned(),
        })
    }
}

/// The ownership check a mutating external call makes immediately before dispatch (SPEC §8.3): the
/// workspace fence must name the call's generation. `Err` is the call's output (nothing was sent).
pub(super) async fn check_fence(ctx: &ToolContext, what: &str) -> Result<(), ToolOutput> {
    let (workspace, gen) = (ctx.workspace.clone(), ctx.gen.clone());
    match off_runtime(move || with_fence(Path::new(&workspace), &gen, TOOL_LOCK_WAIT, || ())).await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.is_fenced() => {
            Err(ToolOutput::err(format!("fenced: {e}; {what} was not sent")))
        }
        Ok(Err(e)) => Err(ToolOutput::err(format!(
            "cannot check the workspace fence: {e}; {what} was not sent"
        ))),
        Err(e) => Err(ToolOutput::err(format!(
            "the fence check did not finish: {e}; {what} was not sent"
        ))),
    }
}

/// Build every `[[tools.http]]` tool and connect every `[[tools.mcp]]` server (`initialize`, then
/// `tools/list`, each bounded by the server's timeout), answering the tools to add to the run
/// [`super::Toolbox`] with [`super::Toolbox::with_external`].
///
/// Fails on a bad entry, on two entries producing the same name, and on an MCP server that does not
/// answer: boot stops with the entry named rather than offering agents a partial tool list. `http` is
/// shared by every tool (connection pooling); its own timeouts are not relied on.
pub async fn external_tools(
    settings: &ExternalToolsSettings,
    http: &reqwest::Client,
) -> Result<Vec<Arc<dyn Tool>>, ExternalToolError> {
    let secret: Option<Arc<[u8]>> = settings.secret.as_deref().map(Arc::from);
    let mut tools: Vec<(String, Arc<dyn Tool>)> = Vec::new();
    for (i, spec) in settings.http.iter().enumerate() {
        let key = format!("tools.http[{i}]");
        let tool = HttpTool::new(&key, spec.clone(), http.clone(), secret.clone())?;
        tools.push((key, Arc::new(tool)));
    }
    for (i, spec) in settings.mcp.iter().enumerate() {
        let key = format!("tools.mcp[{i}]");
        let server = McpServer::connect(&key, spec.clone(), http.clone()).await?;
        for tool in server
            .tools()
            .await
            .map_err(|why| ExternalToolError::McpUnavailable {
                key: key.clone(),
                url: spec.url.clone(),
                why,
            })?
        {
            tools.push((key.clone(), Arc::new(tool)));
        }
    }
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (key, tool) in &tools {
        let name = tool.def().name;
        if let Some(first) = seen.insert(name.clone(), key.clone()) {
            return Err(ExternalToolError::Duplicate {
                name,
                first,
                second: key.clone(),
            });
        }
    }
    Ok(tools.into_iter().map(|(_, t)| t).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_a_to_z_digits_underscore_dash_up_to_64() {
        assert!(is_tool_name("weather_v2-beta"));
        assert!(is_tool_name(&"a".repeat(64)));
        assert!(!is_tool_name(&"a".repeat(65)));
        assert!(!is_tool_name(""));
        assert!(!is_tool_name("get.weather"));
        assert!(!is_tool_name("wetter_für_morgen"));
    }

    #[test]
    fn the_idempotency_key_is_run_id_slash_call_id() {
        assert_eq!(
            idempotency_key(&RunId::from("0190-run"), "call_1"),
            "0190-run/call_1"
        );
    }
}
