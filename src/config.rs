//! `config.toml`: the operator's configuration (SPEC §8.4).
//!
//! Every section has documented defaults, so an empty file is a valid configuration. An unknown key or a
//! bad value is a [`ConfigError`] naming the key (as a dotted path) and the source (the file, or the
//! environment variable that overrode it). Scalars can be overridden with `SWITCHBOARD_<SECTION>__<KEY>`
//! environment variables, e.g. `SWITCHBOARD_SERVER__BIND=127.0.0.1:0`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The configuration committed at the repository root, embedded so `switchboard serve` runs anywhere.
pub const EMBEDDED: &str = include_str!("../config.toml");
pub const EMBEDDED_NAME: &str = "<embedded config.toml>";
const ENV_PREFIX: &str = "SWITCHBOARD_";
/// The sections environment variables may override (SPEC §8.4: fixed sections only; agents, tools and
/// tokens come from the file).
const ENV_SECTIONS: [&str; 10] = [
    "server",
    "storage",
    "history",
    "ledger",
    "drain",
    "defaults",
    "auth",
    "delivery",
    "plan",
    "supervisor",
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config {file}: {why}")]
    Read { file: String, why: String },
    #[error("config {file}: {why}")]
    Syntax { file: String, why: String },
    #[error("config {file}: key `{key}`: {why}")]
    Key {
        file: String,
        key: String,
        why: String,
    },
    /// A bad environment override: the variable is named, since the file is not to blame.
    #[error("environment variable {var}: key `{key}`: {why}")]
    Env {
        var: String,
        key: String,
        why: String,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub history: HistoryConfig,
    pub ledger: LedgerConfig,
    pub drain: DrainConfig,
    pub agents: BTreeMap<String, AgentConfig>,
    pub defaults: DefaultsConfig,
    pub auth: AuthConfig,
    pub delivery: DeliveryConfig,
    pub plan: PlanConfig,
    pub supervisor: SupervisorSettings,
    /// `[[tools.http]]` and `[[tools.mcp]]`: external tools (SPEC §8.3).
    pub tools: ToolsConfig,
    /// `[redaction]`: extra patterns for the redactor (SPEC §8.3).
    pub redaction: RedactionConfig,
    /// `[channels.*]`: chat channels whose threads show their runs (SPEC §12).
    pub channels: ChannelsConfig,
    /// Where this configuration came from, for error messages (not a key).
    #[serde(skip)]
    pub source: String,
    /// The keys environment variables set (`"ledger.lease_ms"` → `"SWITCHBOARD_LEDGER__LEASE_MS"`), so
    /// a bad value is blamed on the variable, not the file (not a key).
    #[serde(skip)]
    pub overrides: BTreeMap<String, String>,
}

impl Default for Config {
    fn default() -> Self {
        let mut agents = BTreeMap::new();
        agents.insert("demo".to_owned(), AgentConfig::default());
        Config {
            server: ServerConfig::default(),
            storage: StorageConfig::default(),
            history: HistoryConfig::default(),
            ledger: LedgerConfig::default(),
            drain: DrainConfig::default(),
            agents,
            defaults: DefaultsConfig::default(),
            auth: AuthConfig::default(),
            delivery: DeliveryConfig::default(),
            plan: PlanConfig::default(),
            supervisor: SupervisorSettings::default(),
            tools: ToolsConfig::default(),
            redaction: RedactionConfig::default(),
            channels: ChannelsConfig::default(),
            source: "<defaults>".into(),
            overrides: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the HTTP server listens on; port 0 picks a free port.
    pub bind: String,
    /// Base of the `liveUrl` handed to integrations; derived from the bound address when unset.
    pub public_base_url: Option<String>,
    /// This process's host identity, recorded with its generation; fast reclaim of dead generations
    /// applies to its own host_id only (SPEC §1.3). Default: the machine's hostname ([`Config::host_id`]).
    pub host_id: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "127.0.0.1:8080".into(),
            public_base_url: None,
            host_id: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    #[default]
    Sqlite,
    Memory,
    /// PostgreSQL at `storage.url`, shared by many hosts (SPEC §1.3).
    Postgres,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SynchronousSetting {
    #[default]
    Full,
    Normal,
}

/// `[storage]`. Its `Debug` redacts the password a PostgreSQL `url` may hold.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub kind: StorageKind,
    /// The SQLite database file; its directory is the data dir (by default the workspaces live there).
    pub path: PathBuf,
    pub synchronous: SynchronousSetting,
    /// The PostgreSQL database (`postgres://user[:password]@host[:port]/db`); required for
    /// `kind = "postgres"`, ignored otherwise. May hold a password: never logged as is.
    pub url: Option<String>,
    /// PostgreSQL read connections beside the storage actor's (0 sends reads to the actor).
    pub pool: u32,
    /// Where run workspaces live (`<workspace_root>/<run_id>/`, SPEC §8.3); default `<data dir>/workspaces`
    /// ([`Config::workspace_root`]). With several hosts, a filesystem every host mounts with working locks.
    pub workspace_root: Option<PathBuf>,
}

/// Bounds of `[storage] pool`.
pub const POOL: std::ops::RangeInclusive<u32> = 0..=64;

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            kind: StorageKind::Sqlite,
            path: "data/switchboard.db".into(),
            synchronous: SynchronousSetting::Full,
            url: None,
            pool: 4,
            workspace_root: None,
        }
    }
}

impl std::fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageConfig")
            .field("kind", &self.kind)
            .field("path", &self.path)
            .field("synchronous", &self.synchronous)
            .field("url", &self.url.as_deref().map(storage::redact_url))
            .field("pool", &self.pool)
            .field("workspace_root", &self.workspace_root)
            .finish()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    pub retention_days: u32,
    pub max_runs: u32,
    pub max_bytes: u64,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        let p = storage::record::RetentionPolicy::default();
        HistoryConfig {
            retention_days: p.retention_days,
            max_runs: p.max_runs,
            max_bytes: p.max_bytes,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// Lease length and reclaim sweep interval.
    pub lease_ms: u64,
    /// Lease renewal interval; at most half the lease.
    pub heartbeat_ms: u64,
    /// How long a keyed admission's receipt answers retries after its run ended; the reclaim sweep
    /// prunes it then (SPEC §4.3 finish). Within 1 minute..=365 days.
    pub receipt_ttl_ms: u64,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            lease_ms: 30_000,
            heartbeat_ms: 10_000,
            receipt_ttl_ms: storage::ledger::DEFAULT_RECEIPT_TTL_MS as u64,
        }
    }
}

/// Bounds of `[ledger] receipt_ttl_ms`: a retry window of at least a minute, at most a year.
const RECEIPT_TTL_MS: std::ops::RangeInclusive<u64> = 60_000..=365 * 86_400_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrainConfig {
    pub deadline_ms: u64,
    pub handoff_budget_ms: u64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig {
            deadline_ms: 900_000,
            handoff_budget_ms: 6_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// The deterministic demo agent; the provider keys are ignored.
    #[default]
    Scripted,
    /// An OpenAI-compatible chat-completions provider (`{base_url}/chat/completions`).
    Openai,
    /// The Anthropic Messages API (`{base_url}/v1/messages`).
    Anthropic,
}

impl AgentKind {
    /// The spelling in `config.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Scripted => "scripted",
            AgentKind::Openai => "openai",
            AgentKind::Anthropic => "anthropic",
        }
    }

    /// Whether the agent calls a model provider over HTTP (and so needs `model`, `base_url`, `api_key_env`).
    pub fn is_provider(self) -> bool {
        matches!(self, AgentKind::Openai | AgentKind::Anthropic)
    }
}

/// `[agents.NAME]` (SPEC §8.3, §8.4).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub kind: AgentKind,
    /// The run's budget; waiting between retries counts against it.
    pub budget_ms: u64,
    pub system: String,
    /// The provider's model name (required for `openai` and `anthropic`).
    pub model: Option<String>,
    /// e.g. `https://api.openai.com/v1` or `https://api.anthropic.com` (required for providers).
    pub base_url: Option<String>,
    /// The environment variable holding the API key, never the key itself (required for providers).
    pub api_key_env: Option<String>,
    /// One model request, connect to last byte (default 120000).
    pub timeout_ms: u64,
    /// Sent to the provider when set (openai 0..=2, anthropic 0..=1).
    pub temperature: Option<f64>,
    /// Sent to the provider when set (anthropic requires one and sends 4096 when unset).
    pub max_tokens: Option<u32>,
    /// The tools the model sees, by name; `None` means every built-in. The run enforces it.
    pub tools: Option<Vec<String>>,
    /// Stream text deltas to the owning process's SSE viewers (SPEC §8.3); default false.
    pub stream: bool,
    /// `[agents.NAME.retry]`.
    pub retry: AgentRetryConfig,
    /// What a message on a busy thread does when it names no `strategy` (SPEC §5.1); unset takes
    /// `[defaults] strategy`.
    pub strategy: Option<storage::ledger::Strategy>,
    /// Tools whose every call waits for a person's approval (SPEC §13): exact names, or a prefix ending
    /// in `*`.
    pub approve: Vec<String>,
    /// How long a call waits for a decision before it is denied by `timeout` (default 24 h).
    pub approval_timeout_ms: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            kind: AgentKind::Scripted,
            budget_ms: 600_000,
            system: "You are a helpful agent.".into(),
            model: None,
            base_url: None,
            api_key_env: None,
            timeout_ms: 120_000,
            temperature: None,
            max_tokens: None,
            tools: None,
            stream: false,
            retry: AgentRetryConfig::default(),
            strategy: None,
            approve: Vec::new(),
            approval_timeout_ms: 86_400_000,
        }
    }
}

/// `[agents.NAME.retry]`: how the run retries the agent's transient errors (SPEC §8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentRetryConfig {
    /// Attempts in total, the first included (≥ 1).
    pub max_attempts: u32,
    /// The first backoff ceiling; doubles per attempt.
    pub initial_ms: u64,
    /// The backoff cap; a `Retry-After` above it ends the retries.
    pub max_ms: u64,
}

impl Default for AgentRetryConfig {
    fn default() -> Self {
        AgentRetryConfig {
            max_attempts: 5,
            initial_ms: 1000,
            max_ms: 30_000,
        }
    }
}

impl AgentConfig {
    /// The problems of one agent's keys, as `(key under agents.NAME, why)`; the first is reported.
    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.budget_ms == 0 {
            return Err(("budget_ms", "must be positive".into()));
        }
        if self.approval_timeout_ms == 0 {
            return Err(("approval_timeout_ms", "must be positive".into()));
        }
        if let Some(bad) = self
            .approve
            .iter()
            .find(|p| p.is_empty() || p.trim_end_matches('*').contains('*'))
        {
            return Err((
                "approve",
                format!("{bad:?} is not a tool name or a prefix ending in one *"),
            ));
        }
        let kind = self.kind.as_str();
        if self.kind.is_provider() {
            for (k, v) in [
                ("model", &self.model),
                ("base_url", &self.base_url),
                ("api_key_env", &self.api_key_env),
            ] {
                if v.as_deref().is_none_or(|s| s.trim().is_empty()) {
                    return Err((k, format!("is required for kind = \"{kind}\"")));
                }
            }
            let base = self.base_url.as_deref().unwrap_or_default();
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                return Err(("base_url", "must start with http:// or https://".into()));
            }
        }
        if self.timeout_ms == 0 {
            return Err(("timeout_ms", "must be positive".into()));
        }
        if let Some(t) = self.temperature {
            let max = if self.kind == AgentKind::Anthropic {
                1.0
            } else {
                2.0
            };
            if !(0.0..=max).contains(&t) {
                return Err((
                    "temperature",
                    format!("must be within 0..={max} for kind = \"{kind}\""),
                ));
            }
        }
        if self.max_tokens == Some(0) {
            return Err(("max_tokens", "must be positive".into()));
        }
        if let Some(tools) = &self.tools {
            if let Some(t) = tools.iter().find(|t| t.trim().is_empty()) {
                return Err(("tools", format!("tool names must not be empty (got {t:?})")));
            }
            if let Some(dup) = tools
                .iter()
                .enumerate()
                .find_map(|(i, t)| tools[..i].contains(t).then_some(t))
            {
                return Err(("tools", format!("`{dup}` is listed twice")));
            }
        }
        let r = &self.retry;
        if r.max_attempts == 0 {
            return Err((
                "retry.max_attempts",
                "must be at least 1 (the first attempt counts)".into(),
            ));
        }
        if r.initial_ms > r.max_ms {
            return Err((
                "retry.initial_ms",
                format!("must not exceed retry.max_ms ({})", r.max_ms),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod agent_config_tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse("test.toml", text, Vec::new())
    }

    /// A minimal valid openai agent; a test appends keys to its table.
    const GPT: &str = r#"
[defaults]
agent = "gpt"
[agents.gpt]
kind = "openai"
model = "gpt-4o-mini"
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
"#;

    #[test]
    fn agent_keys_have_documented_defaults() {
        let c = parse(GPT).expect("gpt agent");
        let a = &c.agents["gpt"];
        assert_eq!(a.kind, AgentKind::Openai);
        assert_eq!(
            (a.timeout_ms, a.budget_ms, a.stream),
            (120_000, 600_000, false)
        );
        assert_eq!(
            (a.temperature, a.max_tokens, a.tools.clone()),
            (None, None, None)
        );
        assert_eq!(
            a.retry,
            AgentRetryConfig {
                max_attempts: 5,
                initial_ms: 1000,
                max_ms: 30_000
            }
        );
    }

    #[test]
    fn a_complete_anthropic_agent_parses() {
        let text = r#"
[defaults]
agent = "claude"
[agents.claude]
kind = "anthropic"
model = "claude-sonnet-4-5"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_API_KEY"
timeout_ms = 60000
temperature = 0.2
max_tokens = 2048
system = "be brief"
budget_ms = 300000
tools = ["echo", "sleep"]
stream = true
[agents.claude.retry]
max_attempts = 3
initial_ms = 500
max_ms = 8000
"#;
        let c = parse(text).expect("claude agent");
        let a = &c.agents["claude"];
        assert_eq!(a.kind, AgentKind::Anthropic);
        assert_eq!(a.model.as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(
            (a.timeout_ms, a.temperature, a.max_tokens),
            (60_000, Some(0.2), Some(2048))
        );
        assert_eq!(a.tools, Some(vec!["echo".to_owned(), "sleep".to_owned()]));
        assert!(a.stream);
        assert_eq!(
            a.retry,
            AgentRetryConfig {
                max_attempts: 3,
                initial_ms: 500,
                max_ms: 8000
            }
        );
    }

    #[test]
    fn bad_agent_keys_are_named() {
        let claude = "[agents.c]\nkind = \"anthropic\"\nmodel = \"m\"\n";
        let cases: Vec<(String, &str)> = vec![
            (
                "[agents.gpt]\nkind = \"openai\"\n".into(),
                "agents.gpt.model",
            ),
            (claude.into(), "agents.c.base_url"),
            (
                format!("{claude}base_url = \"https://x\"\n"),
                "agents.c.api_key_env",
            ),
            ("[agents.c]\nkind = \"gemini\"\n".into(), "agents.c.kind"),
            (
                format!("{GPT}base_url_typo = 1\n"),
                "agents.gpt.base_url_typo",
            ),
            (
                GPT.replace("https://api.openai.com/v1", "api.openai.com"),
                "agents.gpt.base_url",
            ),
            (format!("{GPT}timeout_ms = 0\n"), "agents.gpt.timeout_ms"),
            (
                format!("{GPT}temperature = 2.5\n"),
                "agents.gpt.temperature",
            ),
            (format!("{GPT}max_tokens = 0\n"), "agents.gpt.max_tokens"),
            (
                format!("{GPT}tools = [\"echo\", \"echo\"]\n"),
                "agents.gpt.tools",
            ),
            (format!("{GPT}tools = [\"\"]\n"), "agents.gpt.tools"),
            (
                format!("{GPT}[agents.gpt.retry]\nmax_attempts = 0\n"),
                "agents.gpt.retry.max_attempts",
            ),
            (
                format!("{GPT}[agents.gpt.retry]\ninitial_ms = 5000\nmax_ms = 1000\n"),
                "agents.gpt.retry.initial_ms",
            ),
            (
                format!("{GPT}[agents.gpt.retry]\nmax_attempt = 3\n"),
                "agents.gpt.retry.max_attempt",
            ),
            (
                format!(
                    "{claude}base_url = \"https://x\"\napi_key_env = \"K\"\ntemperature = 1.5\n"
                ),
                "agents.c.temperature",
            ),
        ];
        for (text, key) in cases {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.contains(&format!("`{key}`")), "{text:?} → {e}");
        }
        // The message says why, naming the kind.
        let e = parse("[agents.gpt]\nkind = \"openai\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is required for kind = \"openai\""), "{e}");
    }

    #[test]
    fn commented_agent_examples_in_config_toml_are_complete_and_valid() {
        // Uncomment the key and table lines of the agents section (prose comments stay comments).
        let start = EMBEDDED.find("[agents.demo]").expect("agents section");
        let end = start
            + EMBEDDED[start..]
                .find("\n[auth]")
                .expect("auth section after agents");
        let agents: String = EMBEDDED[start..end]
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest
                            .split_once(" = ")
                            .is_some_and(|(k, _)| !k.contains(' ')) =>
                {
                    rest
                }
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let text = format!("{}{agents}{}", &EMBEDDED[..start], &EMBEDDED[end..]);
        let c = Config::parse("uncommented config.toml", &text, Vec::new())
            .expect("uncommented examples");
        let (gpt, claude) = (&c.agents["gpt"], &c.agents["claude"]);
        assert_eq!(
            (gpt.kind, claude.kind),
            (AgentKind::Openai, AgentKind::Anthropic)
        );
        assert!(gpt.temperature.is_some() && gpt.max_tokens.is_some() && gpt.tools.is_some());
        assert!(claude.stream && claude.tools.is_some());
        assert_eq!(gpt.retry, AgentRetryConfig::default());
        assert_eq!(claude.retry, AgentRetryConfig::default());
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultsConfig {
    pub agent: String,
    /// What a message on a busy thread does when neither it nor its agent says (SPEC §5.1):
    /// `steer`, `enqueue`, `reject` or `interrupt`.
    pub strategy: storage::ledger::Strategy,
}

impl Default for DefaultsConfig {
    fn default() -> Self {
        DefaultsConfig {
            agent: "demo".into(),
            strategy: storage::ledger::Strategy::Steer,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// A request from a loopback address is the operator (all scopes, visibility all).
    pub dev_bypass: bool,
    pub tokens: Vec<TokenConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            dev_bypass: true,
            tokens: Vec::new(),
        }
    }
}

pub const SCOPES: [&str; 5] = [
    "runs:read",
    "runs:write",
    "runs:kill",
    "messages:write",
    "deploy:write",
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    /// The environment variable holding the bearer token (never the token itself).
    pub token_env: String,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// A visibility filter in the SPEC §2 JSON form; default `{"kind":"none"}`.
    #[serde(default)]
    pub visible_to: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    pub webhook_url: Option<String>,
    /// The environment variable holding the Standard Webhooks signing secret (never the secret itself);
    /// webhook deliveries and `[[tools.http]]` calls are signed when it is set. A `whsec_<base64>` value
    /// is decoded; any other value is used as is.
    pub secret_env: Option<String>,
    /// How long a webhook delivery keeps retrying (connect errors, timeouts, 5xx).
    pub deadline_ms: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            webhook_url: None,
            secret_env: None,
            deadline_ms: 30_000,
        }
    }
}

/// `[channels]`: chat channels (SPEC §12); none unless configured, and then nothing contacts them.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelsConfig {
    pub slack: Option<SlackConfig>,
}

/// `[channels.slack]`: the Slack app whose mentions and direct messages start runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackConfig {
    /// The environment variable holding the bot token (`xoxb-…`), never the token itself.
    pub bot_token_env: String,
    /// The environment variable holding the app's signing secret.
    pub signing_secret_env: String,
    /// The Web API's base URL (tests point it at a local stand-in).
    #[serde(default = "SlackConfig::default_api_base_url")]
    pub api_base_url: String,
}

impl SlackConfig {
    fn default_api_base_url() -> String {
        "https://slack.com/api".into()
    }
}

/// `[tools]`: external tools offered beside the built-ins (SPEC §8.3). They come from the file only.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    pub http: Vec<HttpToolConfig>,
    pub mcp: Vec<McpToolConfig>,
}

/// One `[[tools.http]]` entry: a tool whose calls POST `{runId, callId, input}` to `url`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpToolConfig {
    /// The tool name the model sees: `[A-Za-z0-9_-]{1,64}`.
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the `input` object, as a TOML table or a string holding JSON; default
    /// `{"type": "object"}`.
    #[serde(default)]
    pub input_schema: Option<serde_json::Value>,
    pub url: String,
    /// `false` declares the endpoint free of effects (re-run at resume).
    #[serde(default = "yes")]
    pub mutating: bool,
    /// `true` declares that the endpoint honours `Idempotency-Key` (a call in flight at a crash is
    /// re-sent with the same key).
    #[serde(default)]
    pub idempotent: bool,
    /// `true`: every call waits for a person's approval, whichever agent makes it (SPEC §13).
    #[serde(default)]
    pub approval: bool,
    /// Per call; default 30000.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// One `[[tools.mcp]]` entry: an MCP server over streamable HTTP whose tools are `<name>__<tool>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolConfig {
    /// The prefix of the server's tool names: `[A-Za-z0-9_-]+`.
    pub name: String,
    pub url: String,
    /// Bounds the boot handshake and each call; default 30000.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

impl ToolsConfig {
    /// What `actors::tools::external_tools` needs; `secret` is the key `delivery.secret_env` names.
    pub fn to_settings(&self, secret: Option<Vec<u8>>) -> actors::tools::ExternalToolsSettings {
        let timeout = |ms: Option<u64>| {
            ms.map(std::time::Duration::from_millis)
                .unwrap_or(actors::tools::DEFAULT_EXTERNAL_TIMEOUT)
        };
        actors::tools::ExternalToolsSettings {
            http: self
                .http
                .iter()
                .map(|t| actors::tools::HttpToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    input_schema: t.input_schema.clone().unwrap_or(serde_json::Value::Null),
                    url: t.url.clone(),
                    mutating: t.mutating,
                    idempotent: t.idempotent,
                    approval: t.approval,
                    timeout: timeout(t.timeout_ms),
                })
                .collect(),
            mcp: self
                .mcp
                .iter()
                .map(|m| actors::tools::McpServerSpec {
                    prefix: m.name.clone(),
                    url: m.url.clone(),
                    timeout: timeout(m.timeout_ms),
                })
                .collect(),
            secret,
        }
    }
}

/// `[redaction]`: regexes whose matches are replaced with `[redacted]` in labels, `run_failed`
/// messages, tool summaries and event text, beside the built-in credential patterns.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RedactionConfig {
    pub patterns: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanConfig {
    pub max_concurrent: u32,
    /// The invocation timeout: a suggestion still running after it is settled `failed (timeout)`.
    pub timeout_ms: u64,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            max_concurrent: 4,
            timeout_ms: 600_000,
        }
    }
}

/// `[supervisor]`: the restart policy (SPEC §1.1). A run re-adopted (after a panic or lost storage) more
/// than `max_restarts` times within `window_ms` closes `failed`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorSettings {
    pub max_restarts: u32,
    pub window_ms: u64,
}

impl Default for SupervisorSettings {
    fn default() -> Self {
        SupervisorSettings {
            max_restarts: 1,
            window_ms: 600_000,
        }
    }
}

impl Config {
    /// Load `path` (or the embedded default when `None`), apply environment overrides, validate.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let (name, text) = match path {
            Some(p) => {
                let name = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|e| ConfigError::Read {
                    file: name.clone(),
                    why: e.to_string(),
                })?;
                (name, text)
            }
            None => (EMBEDDED_NAME.to_owned(), EMBEDDED.to_owned()),
        };
        Self::parse(&name, &text, std::env::vars())
    }

    /// Parse `text` (named `name` in errors) with the given environment.
    pub fn parse(
        name: &str,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    file: name.into(),
                    why: e.to_string(),
                })?;
        let mut overridden = BTreeMap::new();
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let Some((section, key)) = rest
                .split_once("__")
                .filter(|(s, k)| !s.is_empty() && !k.is_empty())
            else {
                // Not an override: another variable of ours (`SWITCHBOARD_URL` for the CLI, a secret a
                // `*_env` key names) — unless it reads like a mistyped one (`SWITCHBOARD_SERVER_BIND`).
                let lower = rest.to_lowercase();
                let typo = ENV_SECTIONS
                    .iter()
                    .find(|s| lower.strip_prefix(**s).is_some_and(|k| k.starts_with('_')));
                match typo {
                    Some(section) if !names_variable(&table, &var) => {
                        let why = format!(
                            "expected SWITCHBOARD_<SECTION>__<KEY> (two underscores after {})",
                            section.to_uppercase()
                        );
                        return Err(ConfigError::Env {
                            key: lower,
                            var,
                            why,
                        });
                    }
                    _ => continue,
                }
            };
            let (section, key) = (section.to_lowercase(), key.to_lowercase());
            if !ENV_SECTIONS.contains(&section.as_str()) {
                let why = format!(
                    "unknown section `{section}` (environment overrides: {})",
                    ENV_SECTIONS.join(", ")
                );
                return Err(ConfigError::Env {
                    key: format!("{section}.{key}"),
                    var,
                    why,
                });
            }
            let entry = table
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(t) = entry.as_table_mut() else {
                return Err(ConfigError::Env {
                    key: section,
                    var,
                    why: "is not a section".into(),
                });
            };
            t.insert(key.clone(), env_scalar(&value));
            overridden.insert(format!("{section}.{key}"), var);
        }
        let mut cfg: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let key = e.path().to_string();
                let why = e.into_inner().to_string();
                match overridden.get(&key) {
                    // serde names an unknown key "field"; the operator wrote a key.
                    Some(var) => ConfigError::Env {
                        var: var.clone(),
                        key,
                        why: why.replace("unknown field", "unknown key"),
                    },
                    None => ConfigError::Key {
                        file: name.into(),
                        key,
                        why,
                    },
                }
            })?;
        cfg.source = name.into();
        cfg.overrides = overridden;
        // The scripted demo agent is built in (SPEC §8.8): there whether or not the file defines it.
        cfg.agents.entry("demo".into()).or_default();
        cfg.validate()?;
        Ok(cfg)
    }

    /// A bad value of `key`, blamed on the environment variable that set it, else on the file.
    fn bad(&self, key: impl Into<String>, why: impl Into<String>) -> ConfigError {
        let (key, why) = (key.into(), why.into());
        match self.overrides.get(&key) {
            Some(var) => ConfigError::Env {
                var: var.clone(),
                key,
                why,
            },
            None => ConfigError::Key {
                file: self.source.clone(),
                key,
                why,
            },
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.server.bind.parse::<SocketAddr>().is_err() {
            return Err(self.bad(
                "server.bind",
                format!(
                    "`{}` is not an address like 127.0.0.1:8080",
                    self.server.bind
                ),
            ));
        }
        if let Some(base) = &self.server.public_base_url {
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                return Err(self.bad(
                    "server.public_base_url",
                    "must start with http:// or https://",
                ));
            }
        }
        if let Some(id) = &self.server.host_id {
            let ok = id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c));
            if id.is_empty() || id.len() > 255 || !ok {
                return Err(self.bad(
                    "server.host_id",
                    "must be 1..=255 of letters, digits and `-_.:/`",
                ));
            }
        }
        if self.storage.kind == StorageKind::Sqlite && self.storage.path.as_os_str().is_empty() {
            return Err(self.bad("storage.path", "must name a database file"));
        }
        if self.storage.kind == StorageKind::Postgres {
            let url = self
                .storage
                .url
                .as_deref()
                .map(str::trim)
                .unwrap_or_default();
            if url.is_empty() {
                return Err(self.bad(
                    "storage.url",
                    "is required for kind = \"postgres\" (or set SWITCHBOARD_STORAGE__URL)",
                ));
            }
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(self.bad(
                    "storage.url",
                    "must start with postgres:// or postgresql://",
                ));
            }
        }
        if self
            .storage
            .workspace_root
            .as_ref()
            .is_some_and(|r| r.as_os_str().is_empty())
        {
            return Err(self.bad(
                "storage.workspace_root",
                "must name a directory (or be left out for <data dir>/workspaces)",
            ));
        }
        if !POOL.contains(&self.storage.pool) {
            return Err(self.bad(
                "storage.pool",
                format!("must be within {}..={}", POOL.start(), POOL.end()),
            ));
        }
        let h = &self.history;
        if !(1..=365).contains(&h.retention_days) {
            return Err(self.bad("history.retention_days", "must be within 1..=365"));
        }
        if !(1..=20_000).contains(&h.max_runs) {
            return Err(self.bad("history.max_runs", "must be within 1..=20000"));
        }
        if !((16 << 20)..=(8u64 << 30)).contains(&h.max_bytes) {
            return Err(self.bad("history.max_bytes", "must be within 16 MiB..=8 GiB"));
        }
        let l = &self.ledger;
        if l.heartbeat_ms == 0 {
            return Err(self.bad("ledger.heartbeat_ms", "must be positive"));
        }
        if 2 * l.heartbeat_ms > l.lease_ms {
            return Err(self.bad(
                "ledger.heartbeat_ms",
                format!(
                    "2 × heartbeat_ms ({}) must not exceed ledger.lease_ms ({})",
                    2 * l.heartbeat_ms,
                    l.lease_ms
                ),
            ));
        }
        if !RECEIPT_TTL_MS.contains(&l.receipt_ttl_ms) {
            return Err(self.bad(
                "ledger.receipt_ttl_ms",
                "must be within 60000 (a minute)..=31536000000 (a year)",
            ));
        }
        for (name, a) in &self.agents {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(self.bad(
                    format!("agents.{name}"),
                    "agent names use letters, digits, `_` and `-`",
                ));
            }
            a.check()
                .map_err(|(key, why)| self.bad(format!("agents.{name}.{key}"), why))?;
        }
        if !self.agents.contains_key(&self.defaults.agent) {
            return Err(self.bad(
                "defaults.agent",
                format!("names no configured agent `{}`", self.defaults.agent),
            ));
        }
        for (i, t) in self.auth.tokens.iter().enumerate() {
            if let Some(s) = t.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
                return Err(self.bad(
                    format!("auth.tokens[{i}].scopes"),
                    format!("unknown scope `{s}`"),
                ));
            }
            if let Some(v) = &t.visible_to {
                storage::record::VisibilityFilter::parse(v)
                    .map_err(|e| self.bad(format!("auth.tokens[{i}].visible_to"), e.to_string()))?;
            }
        }
        if let Some(u) = &self.delivery.webhook_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(self.bad(
                    "delivery.webhook_url",
                    "must start with http:// or https://",
                ));
            }
        }
        if let Some(slack) = &self.channels.slack {
            if !(slack.api_base_url.starts_with("http://")
                || slack.api_base_url.starts_with("https://"))
            {
                return Err(self.bad(
                    "channels.slack.api_base_url",
                    "must start with http:// or https://",
                ));
            }
        }
        if self.supervisor.window_ms == 0 {
            return Err(self.bad("supervisor.window_ms", "must be positive"));
        }
        if self.plan.max_concurrent == 0 {
            return Err(self.bad("plan.max_concurrent", "must be positive"));
        }
        if self.plan.timeout_ms == 0 {
            return Err(self.bad("plan.timeout_ms", "must be positive"));
        }
        Ok(())
    }

    /// The data dir: the directory of `[storage] path` (`.` when it names a bare file).
    pub fn data_dir(&self) -> PathBuf {
        match self.storage.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => ".".into(),
        }
    }

    /// Where run workspaces live: `[storage] workspace_root`, else `<data dir>/workspaces` (SPEC §8.4).
    pub fn workspace_root(&self) -> PathBuf {
        self.storage
            .workspace_root
            .clone()
            .unwrap_or_else(|| self.data_dir().join("workspaces"))
    }

    /// This process's host identity: `[server] host_id`, else the machine's hostname.
    pub fn host_id(&self) -> String {
        self.server
            .host_id
            .clone()
            .unwrap_or_else(actors::host::hostname)
    }

    /// The retention policy this process proposes to the store (already within bounds).
    pub fn retention(&self) -> storage::record::RetentionPolicy {
        let h = &self.history;
        storage::record::RetentionPolicy::clamp(
            h.retention_days as f64,
            h.max_runs as f64,
            h.max_bytes as f64,
        )
    }
}

/// Whether some string value of the file is `var` (a `token_env`, `secret_env` or `api_key_env` naming
/// the variable): such a variable holds a secret, never an override.
fn names_variable(table: &toml::Table, var: &str) -> bool {
    fn names(v: &toml::Value, var: &str) -> bool {
        match v {
            toml::Value::String(s) => s == var,
            toml::Value::Array(a) => a.iter().any(|v| names(v, var)),
            toml::Value::Table(t) => t.values().any(|v| names(v, var)),
            _ => false,
        }
    }
    table.values().any(|v| names(v, var))
}

/// An environment value as a TOML scalar: integers, floats and booleans by their spelling, else a string.
fn env_scalar(v: &str) -> toml::Value {
    if let Ok(i) = v.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = v.parse::<bool>() {
        toml::Value::Boolean(b)
    } else if let Ok(f) =
        v.parse::<f64>()
            .map_err(|_| ())
            .and_then(|f| if f.is_finite() { Ok(f) } else { Err(()) })
    {
        toml::Value::Float(f)
    } else {
        toml::Value::String(v.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse("test.toml", text, Vec::new())
    }

    #[test]
    fn embedded_default_parses_with_documented_defaults() {
        let c = Config::parse(EMBEDDED_NAME, EMBEDDED, Vec::new()).expect("embedded config");
        assert_eq!(c.storage.kind, StorageKind::Sqlite);
        assert_eq!(c.ledger.lease_ms, 30_000);
        assert_eq!(c.ledger.heartbeat_ms, 10_000);
        assert_eq!(c.drain.deadline_ms, 900_000);
        assert!(c.agents.contains_key(&c.defaults.agent));
        assert!(c.auth.dev_bypass);
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let c = parse("").expect("empty config");
        assert_eq!(c.server.bind, "127.0.0.1:8080");
        assert_eq!(c.history.retention_days, 30);
        assert_eq!(c.storage.synchronous, SynchronousSetting::Full);
        assert_eq!(c.defaults.agent, "demo");
    }

    /// Every key the configuration accepts is in the committed `config.toml`, set or as a commented
    /// example, so an operator reading it sees every knob (the accepted keys are what serde names when a
    /// section is given an unknown one).
    #[test]
    fn every_accepted_key_is_in_the_committed_config_toml() {
        let sections = [
            "[server]",
            "[storage]",
            "[history]",
            "[ledger]",
            "[drain]",
            "[defaults]",
            "[agents.x]",
            "[agents.x.retry]",
            "[auth]",
            "[[auth.tokens]]",
            "[delivery]",
            "[redaction]",
            "[[tools.http]]",
            "[[tools.mcp]]",
            "[plan]",
            "[supervisor]",
            "[channels]",
            "[channels.slack]",
        ];
        let documented: Vec<String> = EMBEDDED
            .lines()
            .map(|l| l.trim_start().trim_start_matches('#').trim_start())
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_owned()))
            .collect();
        let mut missing = Vec::new();
        for section in sections {
            let e = parse(&format!("{section}\nzzz_not_a_key = 1\n"))
                .unwrap_err()
                .to_string();
            let expected = e
                .split("expected one of")
                .nth(1)
                .or_else(|| e.split("expected").nth(1))
                .unwrap_or_else(|| panic!("{section}: {e}"));
            // The list ends its line (a path to the section may follow on the next).
            let keys: Vec<&str> = expected
                .lines()
                .next()
                .unwrap_or_default()
                .split('`')
                .skip(1)
                .step_by(2)
                .collect();
            assert!(!keys.is_empty(), "{section}: {e}");
            // A sub-table (`retry`, `tokens`) is documented by its header.
            let named =
                |k: &str| documented.iter().any(|d| d == k) || EMBEDDED.contains(&format!(".{k}]"));
            missing.extend(
                keys.into_iter()
                    .filter(|k| !named(k))
                    .map(|k| format!("{section} {k}")),
            );
        }
        assert!(
            missing.is_empty(),
            "keys config.toml does not mention: {missing:?}"
        );
    }

    /// SPEC §8.8: the demo agent is built in, so a file that defines only its own agents still starts with
    /// the default `[defaults] agent = "demo"`, and both agents exist.
    #[test]
    fn the_demo_agent_exists_beside_a_file_of_other_agents() {
        let text = "[agents.gpt]\nkind = \"openai\"\nmodel = \"gpt-4o-mini\"\nbase_url = \"https://api.openai.com/v1\"\napi_key_env = \"OPENAI_API_KEY\"\n";
        let c = parse(text).expect("a file of one openai agent");
        assert_eq!(c.defaults.agent, "demo");
        assert!(
            c.agents.contains_key("demo") && c.agents.contains_key("gpt"),
            "{:?}",
            c.agents.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn receipt_ttl_defaults_to_a_day_and_is_bounded() {
        assert_eq!(
            parse("").expect("empty config").ledger.receipt_ttl_ms,
            86_400_000
        );
        assert_eq!(
            parse("[ledger]\nreceipt_ttl_ms = 60000\n")
                .expect("a minute")
                .ledger
                .receipt_ttl_ms,
            60_000
        );
        for text in [
            "[ledger]\nreceipt_ttl_ms = 59999\n",
            "[ledger]\nreceipt_ttl_ms = 31536000001\n",
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("ledger.receipt_ttl_ms"), "{text:?} → {e}");
        }
    }

    #[test]
    fn unknown_key_is_named_with_the_file() {
        let e = parse("[server]\nbindd = \"127.0.0.1:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("test.toml") && e.contains("server.bindd"), "{e}");
        let e = parse("[nosuch]\nx = 1\n").unwrap_err().to_string();
        assert!(e.contains("nosuch"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        for (text, key) in [
            ("[storage]\nkind = \"oracle\"\n", "storage.kind"),
            ("[storage]\nkind = \"postgres\"\n", "storage.url"),
            ("[storage]\nkind = \"postgres\"\nurl = \"\"\n", "storage.url"),
            ("[storage]\nkind = \"postgres\"\nurl = \"mysql://h/db\"\n", "storage.url"),
            ("[storage]\nkind = \"postgres\"\nurl = \"postgres://h/db\"\npool = 65\n", "storage.pool"),
            ("[storage]\npool = -1\n", "storage.pool"),
            ("[storage]\nsynchronous = \"off\"\n", "storage.synchronous"),
            ("[ledger]\nlease_ms = 10000\nheartbeat_ms = 6000\n", "ledger.heartbeat_ms"),
            ("[history]\nretention_days = 0\n", "history.retention_days"),
            ("[history]\nmax_runs = 0\n", "history.max_runs"),
            ("[server]\nbind = \"nowhere\"\n", "server.bind"),
            ("[ledger]\nlease_ms = \"long\"\n", "ledger.lease_ms"),
            ("[defaults]\nagent = \"ghost\"\n", "defaults.agent"),
            ("[agents.x]\nkind = \"openai\"\n", "agents.x.model"),
            ("[[auth.tokens]]\nname = \"a\"\ntoken_env = \"A\"\nscopes = [\"runs:nuke\"]\n", "auth.tokens[0].scopes"),
            ("[[auth.tokens]]\nname = \"a\"\ntoken_env = \"A\"\nvisible_to = { kind = \"everything\" }\n", "auth.tokens[0].visible_to"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?} → {e}");
        }
    }

    #[test]
    fn environment_overrides_scalars_and_is_named_when_bad() {
        let env = vec![
            (
                "SWITCHBOARD_SERVER__BIND".to_owned(),
                "127.0.0.1:0".to_owned(),
            ),
            (
                "SWITCHBOARD_STORAGE__PATH".to_owned(),
                "/tmp/x.db".to_owned(),
            ),
            (
                "SWITCHBOARD_LEDGER__LEASE_MS".to_owned(),
                "60000".to_owned(),
            ),
            ("UNRELATED".to_owned(), "1".to_owned()),
        ];
        let c = Config::parse("test.toml", "", env).expect("overrides");
        assert_eq!(c.server.bind, "127.0.0.1:0");
        assert_eq!(c.storage.path, PathBuf::from("/tmp/x.db"));
        assert_eq!(c.ledger.lease_ms, 60_000);

        let env = vec![("SWITCHBOARD_LEDGER__LEASE_MS".to_owned(), "soon".to_owned())];
        let e = Config::parse("test.toml", "", env).unwrap_err().to_string();
        assert!(
            e.contains("ledger.lease_ms") && e.contains("SWITCHBOARD_LEDGER__LEASE_MS"),
            "{e}"
        );
        let env = vec![("SWITCHBOARD_STORAGE__POOL".to_owned(), "100".to_owned())];
        let e = Config::parse("test.toml", "", env).unwrap_err().to_string();
        assert!(e.contains("storage.pool"), "{e}");
    }

    #[test]
    fn workspace_root_defaults_into_the_data_dir_and_is_overridden_by_file_and_environment() {
        assert_eq!(
            parse("[storage]\npath = \"/srv/sb/db.sqlite\"\n")
                .unwrap()
                .workspace_root(),
            PathBuf::from("/srv/sb/workspaces")
        );
        assert_eq!(
            parse("[storage]\npath = \"db.sqlite\"\n")
                .unwrap()
                .workspace_root(),
            PathBuf::from("./workspaces")
        );
        let file = "[storage]\nworkspace_root = \"/mnt/shared/ws\"\n";
        assert_eq!(
            parse(file).unwrap().workspace_root(),
            PathBuf::from("/mnt/shared/ws")
        );
        let env = vec![(
            "SWITCHBOARD_STORAGE__WORKSPACE_ROOT".to_owned(),
            "/mnt/nfs/ws".to_owned(),
        )];
        assert_eq!(
            Config::parse("test.toml", file, env)
                .unwrap()
                .workspace_root(),
            PathBuf::from("/mnt/nfs/ws")
        );
        let env = vec![(
            "SWITCHBOARD_STORAGE__WORKSPACE_ROOT".to_owned(),
            String::new(),
        )];
        let e = Config::parse("test.toml", file, env)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SWITCHBOARD_STORAGE__WORKSPACE_ROOT")
                && e.contains("storage.workspace_root"),
            "{e}"
        );
        assert!(!e.contains("test.toml"), "the file is not to blame: {e}");
    }

    #[test]
    fn environment_errors_name_the_variable_not_the_file() {
        let env = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        let blamed = |e: &ConfigError| match e {
            ConfigError::Env { var, .. } => Some(var.clone()),
            _ => None,
        };
        // A typo'd section: unknown, and the variable is named.
        let e = Config::parse(
            "test.toml",
            "",
            env("SWITCHBOARD_SERVR__BIND", "127.0.0.1:1"),
        )
        .unwrap_err();
        assert_eq!(
            blamed(&e).as_deref(),
            Some("SWITCHBOARD_SERVR__BIND"),
            "{e}"
        );
        let e = e.to_string();
        assert!(
            e.contains("SWITCHBOARD_SERVR__BIND")
                && e.contains("unknown section `servr`")
                && !e.contains("test.toml"),
            "{e}"
        );
        // A typo'd key of a known section.
        let e = Config::parse(
            "test.toml",
            "",
            env("SWITCHBOARD_SERVER__BIDN", "127.0.0.1:1"),
        )
        .unwrap_err();
        assert_eq!(
            blamed(&e).as_deref(),
            Some("SWITCHBOARD_SERVER__BIDN"),
            "{e}"
        );
        let e = e.to_string();
        assert!(
            e.contains("server.bidn")
                && e.contains("unknown key `bidn`")
                && !e.contains("test.toml"),
            "{e}"
        );
        // A value the validation refuses (it decodes, but is out of bounds).
        let e =
            Config::parse("test.toml", "", env("SWITCHBOARD_HISTORY__MAX_RUNS", "0")).unwrap_err();
        assert_eq!(
            blamed(&e).as_deref(),
            Some("SWITCHBOARD_HISTORY__MAX_RUNS"),
            "{e}"
        );
        let e = e.to_string();
        assert!(
            e.contains("history.max_runs") && e.contains("1..=20000") && !e.contains("test.toml"),
            "{e}"
        );
        // The same value from the file is still the file's.
        let e = parse("[history]\nmax_runs = 0\n").unwrap_err();
        assert!(
            blamed(&e).is_none() && e.to_string().contains("test.toml"),
            "{e}"
        );
        // A variable that cannot be an override is someone else's (the CLI's, a secret); one that reads
        // like a mistyped override is named.
        let others = vec![
            ("SWITCHBOARD_URL".to_owned(), "http://x".to_owned()),
            ("SWITCHBOARD_OPERATOR_TOKEN".to_owned(), "secret".to_owned()),
        ];
        Config::parse("test.toml", "", others).expect("not overrides");
        let e = Config::parse(
            "test.toml",
            "",
            env("SWITCHBOARD_SERVER_BIND", "127.0.0.1:1"),
        )
        .unwrap_err();
        assert_eq!(
            blamed(&e).as_deref(),
            Some("SWITCHBOARD_SERVER_BIND"),
            "{e}"
        );
        let named = "[[auth.tokens]]\nname = \"ops\"\ntoken_env = \"SWITCHBOARD_SERVER_TOKEN\"\nscopes = [\"runs:read\"]\n";
        Config::parse(
            "test.toml",
            named,
            env("SWITCHBOARD_SERVER_TOKEN", "secret"),
        )
        .expect("a token the file names");
    }
}
