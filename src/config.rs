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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config {file}: {why}")]
    Read { file: String, why: String },
    #[error("config {file}: {why}")]
    Syntax { file: String, why: String },
    #[error("config {file}: key `{key}`: {why}")]
    Key { file: String, key: String, why: String },
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
    /// Where this configuration came from, for error messages (not a key).
    #[serde(skip)]
    pub source: String,
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
            source: "<defaults>".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address the HTTP server listens on; port 0 picks a free port.
    pub bind: String,
    /// Base of the `liveUrl` handed to integrations.
    pub public_base_url: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig { bind: "127.0.0.1:8080".into(), public_base_url: "http://127.0.0.1:8080".into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    #[default]
    Sqlite,
    Memory,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SynchronousSetting {
    #[default]
    Full,
    Normal,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    pub kind: StorageKind,
    /// The SQLite database file; its directory is the data dir (workspaces live beside it).
    pub path: PathBuf,
    pub synchronous: SynchronousSetting,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig { kind: StorageKind::Sqlite, path: "data/switchboard.db".into(), synchronous: SynchronousSetting::Full }
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
        HistoryConfig { retention_days: p.retention_days, max_runs: p.max_runs, max_bytes: p.max_bytes }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LedgerConfig {
    /// Lease length and reclaim sweep interval.
    pub lease_ms: u64,
    /// Lease renewal interval; at most half the lease.
    pub heartbeat_ms: u64,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig { lease_ms: 30_000, heartbeat_ms: 10_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrainConfig {
    pub deadline_ms: u64,
    pub handoff_budget_ms: u64,
}

impl Default for DrainConfig {
    fn default() -> Self {
        DrainConfig { deadline_ms: 900_000, handoff_budget_ms: 6_000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    #[default]
    Scripted,
    Openai,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub kind: AgentKind,
    pub budget_ms: u64,
    pub system: String,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub api_key_env: Option<String>,
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
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultsConfig {
    pub agent: String,
}

impl Default for DefaultsConfig {
    fn default() -> Self {
        DefaultsConfig { agent: "demo".into() }
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
        AuthConfig { dev_bypass: true, tokens: Vec::new() }
    }
}

pub const SCOPES: [&str; 5] = ["runs:read", "runs:write", "runs:kill", "messages:write", "deploy:write"];

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

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    pub webhook_url: Option<String>,
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
        PlanConfig { max_concurrent: 4, timeout_ms: 600_000 }
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
        SupervisorSettings { max_restarts: 1, window_ms: 600_000 }
    }
}

impl Config {
    /// Load `path` (or the embedded default when `None`), apply environment overrides, validate.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let (name, text) = match path {
            Some(p) => {
                let name = p.display().to_string();
                let text = std::fs::read_to_string(p)
                    .map_err(|e| ConfigError::Read { file: name.clone(), why: e.to_string() })?;
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
            text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax { file: name.into(), why: e.to_string() })?;
        let mut overridden = BTreeMap::new();
        for (var, value) in env {
            let Some(rest) = var.strip_prefix(ENV_PREFIX) else { continue };
            let Some((section, key)) = rest.split_once("__") else {
                return Err(ConfigError::Key {
                    file: format!("environment variable {var}"),
                    key: rest.to_lowercase(),
                    why: "expected SWITCHBOARD_<SECTION>__<KEY>".into(),
                });
            };
            let (section, key) = (section.to_lowercase(), key.to_lowercase());
            let entry = table.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(t) = entry.as_table_mut() else {
                return Err(ConfigError::Key { file: var, key: section, why: "is not a section".into() });
            };
            t.insert(key.clone(), env_scalar(&value));
            overridden.insert(format!("{section}.{key}"), var);
        }
        let mut cfg: Config = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            let file = overridden.get(&key).map(|v| format!("{name} (overridden by {v})")).unwrap_or_else(|| name.into());
            ConfigError::Key { file, key, why: e.into_inner().to_string() }
        })?;
        cfg.source = name.into();
        if cfg.agents.is_empty() {
            cfg.agents.insert("demo".into(), AgentConfig::default());
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn bad(&self, key: impl Into<String>, why: impl Into<String>) -> ConfigError {
        ConfigError::Key { file: self.source.clone(), key: key.into(), why: why.into() }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.server.bind.parse::<SocketAddr>().is_err() {
            return Err(self.bad("server.bind", format!("`{}` is not an address like 127.0.0.1:8080", self.server.bind)));
        }
        let base = &self.server.public_base_url;
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(self.bad("server.public_base_url", "must start with http:// or https://"));
        }
        if self.storage.kind == StorageKind::Sqlite && self.storage.path.as_os_str().is_empty() {
            return Err(self.bad("storage.path", "must name a database file"));
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
                format!("2 × heartbeat_ms ({}) must not exceed ledger.lease_ms ({})", 2 * l.heartbeat_ms, l.lease_ms),
            ));
        }
        for (name, a) in &self.agents {
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(self.bad(format!("agents.{name}"), "agent names use letters, digits, `_` and `-`"));
            }
            if a.budget_ms == 0 {
                return Err(self.bad(format!("agents.{name}.budget_ms"), "must be positive"));
            }
            if a.kind == AgentKind::Openai {
                for (k, v) in [("model", &a.model), ("base_url", &a.base_url), ("api_key_env", &a.api_key_env)] {
                    if v.as_deref().is_none_or(str::is_empty) {
                        return Err(self.bad(format!("agents.{name}.{k}"), "is required for kind = \"openai\""));
                    }
                }
            }
        }
        if !self.agents.contains_key(&self.defaults.agent) {
            return Err(self.bad("defaults.agent", format!("names no configured agent `{}`", self.defaults.agent)));
        }
        for (i, t) in self.auth.tokens.iter().enumerate() {
            if let Some(s) = t.scopes.iter().find(|s| !SCOPES.contains(&s.as_str())) {
                return Err(self.bad(format!("auth.tokens[{i}].scopes"), format!("unknown scope `{s}`")));
            }
            if let Some(v) = &t.visible_to {
                storage::record::VisibilityFilter::parse(v)
                    .map_err(|e| self.bad(format!("auth.tokens[{i}].visible_to"), e.to_string()))?;
            }
        }
        if let Some(u) = &self.delivery.webhook_url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(self.bad("delivery.webhook_url", "must start with http:// or https://"));
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

    /// The retention policy this process proposes to the store (already within bounds).
    pub fn retention(&self) -> storage::record::RetentionPolicy {
        let h = &self.history;
        storage::record::RetentionPolicy::clamp(h.retention_days as f64, h.max_runs as f64, h.max_bytes as f64)
    }
}

/// An environment value as a TOML scalar: integers, floats and booleans by their spelling, else a string.
fn env_scalar(v: &str) -> toml::Value {
    if let Ok(i) = v.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = v.parse::<bool>() {
        toml::Value::Boolean(b)
    } else if let Ok(f) = v.parse::<f64>().map_err(|_| ()).and_then(|f| if f.is_finite() { Ok(f) } else { Err(()) }) {
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

    #[test]
    fn unknown_key_is_named_with_the_file() {
        let e = parse("[server]\nbindd = \"127.0.0.1:1\"\n").unwrap_err().to_string();
        assert!(e.contains("test.toml") && e.contains("server.bindd"), "{e}");
        let e = parse("[nosuch]\nx = 1\n").unwrap_err().to_string();
        assert!(e.contains("nosuch"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        for (text, key) in [
            ("[storage]\nkind = \"postgres\"\n", "storage.kind"),
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
            ("SWITCHBOARD_SERVER__BIND".to_owned(), "127.0.0.1:0".to_owned()),
            ("SWITCHBOARD_STORAGE__PATH".to_owned(), "/tmp/x.db".to_owned()),
            ("SWITCHBOARD_LEDGER__LEASE_MS".to_owned(), "60000".to_owned()),
            ("UNRELATED".to_owned(), "1".to_owned()),
        ];
        let c = Config::parse("test.toml", "", env).expect("overrides");
        assert_eq!(c.server.bind, "127.0.0.1:0");
        assert_eq!(c.storage.path, PathBuf::from("/tmp/x.db"));
        assert_eq!(c.ledger.lease_ms, 60_000);

        let env = vec![("SWITCHBOARD_LEDGER__LEASE_MS".to_owned(), "soon".to_owned())];
        let e = Config::parse("test.toml", "", env).unwrap_err().to_string();
        assert!(e.contains("ledger.lease_ms") && e.contains("SWITCHBOARD_LEDGER__LEASE_MS"), "{e}");
    }
}
