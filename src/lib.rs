//! Switchboard: a runtime for long-running, chat-driven agent runs.
//!
//! This thin library is the wiring shared by the binary (`main.rs`) and the end-to-end tests: it turns a
//! [`Config`] into a running process.
//!
//! # Layout
//! - [`config`]: `config.toml` loading, environment overrides, validation.
//! - [`start`]: boot — mint the generation, open and migrate the database, start the storage actor, bind
//!   the HTTP server — answering a [`Running`] handle.
//! - `main.rs`: the CLI (clap), tracing, signal handling.
//! - [`child`], [`shared_db`]: `serve` child processes and the database they share, for [`bench`] and
//!   [`chaos`].

pub mod bench;
pub mod chaos;
pub mod child;
pub mod cli;
pub mod config;
pub mod shared_db;
pub mod slack_stub;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use std::collections::HashMap;
use std::time::Duration;

use actors::agent::anthropic::{AnthropicAgent, AnthropicConfig};
use actors::agent::openai::{OpenAiAgent, OpenAiConfig};
use actors::agent::scripted::ScriptedAgent;
use actors::agent::{Agent, RetryPolicy};
use actors::history::HistoryWriter;
use actors::registry::Registry;
use actors::run::AgentEntry;
use actors::supervisor::{Supervisor, SupervisorConfig};
use actors::token::TokenMinter;
use actors::tools::Toolbox;
use anyhow::Context;
use storage::record::VisibilityFilter;
use storage::store::PolicyProposal;
use storage::{
    BackendSpec, Generation, MemoryStore, PgStore, SqliteStore, StorageHandle, Synchronous,
};

pub use config::Config;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Each connection's kernel send buffer (`SO_SNDBUF`, which Linux doubles): enough for any one answer to
/// leave in a few writes, small enough that a stalled SSE viewer is found out quickly.
pub const SEND_BUFFER_BYTES: usize = 64 * 1024;

/// A started Switchboard process: its address, generation and the handles to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub generation: Generation,
    pub storage: StorageHandle,
    pub draining: Arc<AtomicBool>,
    pub supervisor: actix::Addr<Supervisor>,
    pub registry: Registry,
    pub history: HistoryWriter,
    pub plans: actors::plan::PlanHandle,
    pub metrics: Arc<actors::metrics::Metrics>,
    /// Notified by `POST /admin/drain`: the process drains and exits.
    pub shutdown: Arc<tokio::sync::Notify>,
    drain: DrainSettings,
    server: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

#[derive(Debug, Clone, Copy)]
struct DrainSettings {
    deadline: Duration,
    handoff_budget: Duration,
}

impl Running {
    /// Drain (SPEC §6.4): stop admitting, hand resumable runs to the next generation, wait for the
    /// others up to the deadline, then stop the HTTP server.
    pub async fn drain(self) -> anyhow::Result<actors::supervisor::DrainReport> {
        // Plan admissions are refused from here (`draining`), then the coordinator closes; storage after.
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.plans.close().await;
        let report = self
            .supervisor
            .send(actors::supervisor::Drain {
                deadline: self.drain.deadline,
                handoff_budget: self.drain.handoff_budget,
            })
            .await
            .context("reach the supervisor")?;
        tracing::info!(
            generation = self.generation.as_str(),
            handed_off = report.handed_off.len(),
            waited_for = report.waited_for,
            abandoned = report.abandoned.len(),
            "drained"
        );
        self.stop().await?;
        Ok(report)
    }

    /// Stop accepting connections and finish in-flight requests.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.server.stop(true).await;
        self.task
            .await
            .context("join http server")?
            .context("run http server")
    }

    /// Wait until the server stops on its own.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task
            .await
            .context("join http server")?
            .context("run http server")
    }

    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.clone()
    }
}

/// Boot a process from `config`. Needs an actix `System` (`#[actix_web::main]` / `#[actix_web::test]`).
pub async fn start(config: Config) -> anyhow::Result<Running> {
    start_with_tools(config, Toolbox::builtin()).await
}

/// The agents `config` names, built: each provider with its timeout, temperature and max_tokens; the
/// API key read from the environment variable `api_key_env` names (a warning when it is unset).
fn build_agents(config: &Config) -> anyhow::Result<HashMap<String, AgentEntry>> {
    let mut agents = HashMap::new();
    for (name, a) in &config.agents {
        let api_key = || {
            let env = a.api_key_env.clone().unwrap_or_default();
            let key = std::env::var(&env).unwrap_or_default();
            if key.is_empty() {
                tracing::warn!(agent = %name, env = %env, "the agent's API key variable is not set");
            }
            key
        };
        let timeout = Duration::from_millis(a.timeout_ms);
        let agent: Arc<dyn Agent> = match a.kind {
            config::AgentKind::Scripted => Arc::new(ScriptedAgent::new()),
            config::AgentKind::Openai => Arc::new(OpenAiAgent::new(OpenAiConfig {
                base_url: a.base_url.clone().unwrap_or_default(),
                model: a.model.clone().unwrap_or_default(),
                api_key: api_key(),
                timeout,
                temperature: a.temperature,
                max_tokens: a.max_tokens,
            })),
            config::AgentKind::Anthropic => Arc::new(AnthropicAgent::new(AnthropicConfig {
                base_url: a.base_url.clone().unwrap_or_default(),
                model: a.model.clone().unwrap_or_default(),
                api_key: api_key(),
                timeout,
                temperature: a.temperature,
                max_tokens: a.max_tokens,
            })),
        };
        let retry = RetryPolicy {
            max_attempts: a.retry.max_attempts,
            initial: Duration::from_millis(a.retry.initial_ms),
            max: Duration::from_millis(a.retry.max_ms),
        };
        agents.insert(
            name.clone(),
            AgentEntry {
                agent,
                budget_ms: a.budget_ms as i64,
                system: a.system.clone(),
                tools: a.tools.clone(),
                retry,
                stream: a.stream,
                strategy: a.strategy.unwrap_or(config.defaults.strategy),
                approve: a.approve.clone(),
                approval_timeout_ms: a.approval_timeout_ms as i64,
            },
        );
    }
    Ok(agents)
}

/// The bearer tokens `config` names, with their values read from the environment.
fn build_auth(config: &Config) -> anyhow::Result<web::AuthConfig> {
    let mut tokens = Vec::new();
    for t in &config.auth.tokens {
        let token = std::env::var(&t.token_env).unwrap_or_default();
        if token.is_empty() {
            tracing::warn!(token = %t.name, env = %t.token_env, "the token's environment variable is not set; it grants nothing");
        }
        let visible_to = match &t.visible_to {
            Some(v) => VisibilityFilter::parse(v)
                .with_context(|| format!("parse visible_to of token {}", t.name))?,
            None => VisibilityFilter::None,
        };
        tokens.push(web::auth::TokenGrant {
            name: t.name.clone(),
            token,
            scopes: t.scopes.clone(),
            visible_to,
        });
    }
    Ok(web::AuthConfig {
        dev_bypass: config.auth.dev_bypass,
        tokens,
    })
}

/// The storage backend `config` names, opened and migrated once here (so a bad path, an unreachable
/// database or a too-new schema fails boot with context), and the clock leases are stamped with: the
/// host's, except for PostgreSQL, where it is the database's (SPEC §1.3: hosts with skewed clocks
/// share one lease time line), measured once at boot.
async fn backend(config: &Config) -> anyhow::Result<(BackendSpec, Arc<dyn storage::Clock>)> {
    let system = storage::clock::system();
    Ok(match config.storage.kind {
        config::StorageKind::Memory => (BackendSpec::Memory(MemoryStore::new()), system),
        config::StorageKind::Sqlite => {
            let synchronous = match config.storage.synchronous {
                config::SynchronousSetting::Full => Synchronous::Full,
                config::SynchronousSetting::Normal => Synchronous::Normal,
            };
            let path = config.storage.path.clone();
            SqliteStore::open(&path, synchronous)
                .with_context(|| format!("open database {}", path.display()))?;
            (BackendSpec::Sqlite { path, synchronous }, system)
        }
        config::StorageKind::Postgres => {
            // Validation made it present; the password never reaches a message.
            let url = config.storage.url.clone().unwrap_or_default();
            let shown = storage::redact_url(&url);
            // The synchronous client runs its own runtime: off this (async) thread.
            let (u, base) = (url.clone(), system.clone());
            let clock = tokio::task::spawn_blocking(move || {
                PgStore::open(&u)?;
                storage::DbClock::measure(base, &u)
            })
            .await
            .context("join the database probe")?
            .with_context(|| format!("open database {shown}"))?;
            tracing::info!(url = %shown, offset_ms = clock.offset_ms(), pool = config.storage.pool, "postgres storage; leases on the database's clock");
            (
                BackendSpec::Postgres {
                    url,
                    pool: config.storage.pool as usize,
                },
                Arc::new(clock),
            )
        }
    })
}

/// `[channels.slack]`'s secrets, read from the environment before anything touches storage: the bot
/// token and the signing secret (SPEC §12). `None` without the section: nothing contacts Slack.
fn slack_secrets(config: &Config) -> anyhow::Result<Option<(String, String)>> {
    let Some(slack) = &config.channels.slack else {
        return Ok(None);
    };
    let secret = |key: &str, var: &str| match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(v),
        _ => Err(anyhow::anyhow!(
            "{}: `channels.slack.{key}`: the environment variable `{var}` it names is not set",
            config.source
        )),
    };
    Ok(Some((
        secret("bot_token_env", &slack.bot_token_env)?,
        secret("signing_secret_env", &slack.signing_secret_env)?,
    )))
}

/// [`start`] with a given toolbox (tests add tools of their own).
pub async fn start_with_tools(config: Config, tools: Toolbox) -> anyhow::Result<Running> {
    // Bind before anything touches storage: a port in use is a one-line error, and nothing was migrated,
    // reclaimed or started. An unset `public_base_url` is the address actually bound (port 0 included).
    let listener = std::net::TcpListener::bind(&config.server.bind)
        .with_context(|| format!("bind http listener on {}", config.server.bind))?;
    let addr = listener
        .local_addr()
        .context("bind http listener: no address")?;
    let slack_secrets = slack_secrets(&config)?;
    let (spec, clock) = backend(&config).await?;
    let loaded_at = clock.now_ms();
    let options = storage::StorageOptions {
        receipt_ttl_ms: config.ledger.receipt_ttl_ms as i64,
        ..Default::default()
    };
    let redactor = actors::redact::Redactor::new(&config.redaction.patterns)
        .context("compile the redaction patterns")?;
    let registry = Registry::new(clock.clone()).with_redactor(Arc::new(redactor));
    let storage =
        StorageHandle::start_with(spec, clock.clone(), options).here_when_alone(registry.held());
    storage.ping().await.context("start storage actor")?;
    let tokens = TokenMinter::new(
        &storage
            .capability_secret()
            .await
            .context("read the capability secret")?,
    );
    let draining = Arc::new(AtomicBool::new(false));
    let webhook_secret = actors::delivery::secret_from_env(config.delivery.secret_env.as_deref())
        .context("read the webhook secret")?;
    let webhook = config
        .delivery
        .webhook_url
        .clone()
        .map(|url| actors::delivery::Webhook {
            url,
            secret: webhook_secret.clone(),
            deadline: Duration::from_millis(config.delivery.deadline_ms),
        });
    // One HTTP client for the process (external tools, Slack, webhook replies): one pool, one load of
    // the trusted roots.
    let http = reqwest::Client::new();
    let external = actors::tools::external_tools(&config.tools.to_settings(webhook_secret), &http)
        .await
        .context("connect the external tools")?;
    let tools = tools
        .with_external(external)
        .context("add the external tools")?;
    let metrics = actors::metrics::Metrics::shared(VERSION);
    let operations = actors::operations::OperationCoordinator::new(clock.clone());
    // Sessions are capped even when no other call comes in to notice.
    operations.spawn_session_reaper(Duration::from_secs(30));
    let proposal = PolicyProposal {
        policy: config.retention(),
        updated_at: loaded_at,
    };
    let history = HistoryWriter::new(Arc::new(storage.clone()), Some(proposal));
    let host_id = config.host_id();
    let public_base_url = config
        .server
        .public_base_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    // The status cards runs from a chat thread show there, and the Slack ingress (SPEC §12).
    let (cards, slack) = match (&config.channels.slack, slack_secrets) {
        (Some(slack), Some((token, signing_secret))) => {
            let io = actors::channel::slack::SlackIo::new(http.clone(), &slack.api_base_url, token);
            let cards =
                actors::channel::Cards::new(Arc::new(io), storage.clone(), &public_base_url);
            (cards, Some(web::SlackIngress::new(signing_secret)))
        }
        _ => (Default::default(), None),
    };
    // The supervisor mints and owns this process's generation (its fencing token).
    let supervisor = Supervisor::new(SupervisorConfig {
        storage: storage.clone(),
        registry: registry.clone(),
        history: history.clone(),
        agents: build_agents(&config)?,
        default_agent: config.defaults.agent.clone(),
        tools,
        workspace_root: config.workspace_root(),
        lease_ms: config.ledger.lease_ms as i64,
        heartbeat_ms: config.ledger.heartbeat_ms,
        webhook,
        clock: clock.clone(),
        tokens: tokens.clone(),
        draining: draining.clone(),
        metrics: metrics.clone(),
        operations: operations.clone(),
        restart_policy: actors::supervisor::RestartPolicy {
            max_restarts: config.supervisor.max_restarts,
            window_ms: config.supervisor.window_ms as i64,
        },
        host_id: host_id.clone(),
        cards,
        http,
    });
    let generation = supervisor.generation().clone();
    let span = tracing::info_span!("boot", generation = generation.as_str(), host_id = %host_id);
    let _enter = span.enter();
    // Boot order (SPEC §6.1): reclaim before ingress opens; resumes launch after.
    let (supervisor, report) = actors::supervisor::boot(
        supervisor,
        actors::host::this_process(generation.as_str(), loaded_at, &host_id),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!(
        resumed = report.resumed.len(),
        restarted = report.restarted.len(),
        closed = report.closed.len(),
        failed = report.failed.len(),
        live_elsewhere = report.live_elsewhere,
        "boot reclaim"
    );
    let plans = actors::plan::PlanHandle::spawn(
        storage.clone(),
        generation.clone(),
        Arc::new(actors::plan::AgentPlanProvider::new(
            supervisor.clone(),
            registry.clone(),
            storage.clone(),
            None,
        )),
        Arc::new(actors::plan::TokioTimer),
        actors::plan::PlanSettings {
            max_concurrent: config.plan.max_concurrent as usize,
            timeout: Duration::from_millis(config.plan.timeout_ms),
            lease: Duration::from_millis(config.ledger.lease_ms),
            host_id: host_id.clone(),
        },
    );
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let ui_base = public_base_url.clone();
    let state = web::AppState {
        generation: generation.clone(),
        version: VERSION,
        storage: storage.clone(),
        draining: draining.clone(),
        supervisor: supervisor.clone(),
        registry: registry.clone(),
        tokens,
        auth: build_auth(&config)?,
        public_base_url,
        runs: actors::runs_service::RunsService::new(
            registry.clone(),
            storage.clone(),
            generation.clone(),
            clock.clone(),
        ),
        shutdown: shutdown.clone(),
        metrics: metrics.clone(),
        history: history.clone(),
        plans: plans.clone(),
        agents: config.agents.keys().cloned().collect(),
        slack,
    };
    // Cross-host news (PostgreSQL): followers of other hosts' runs wake at each note, kills and ends
    // elsewhere drop cached views (SPEC §1.3).
    if let Some(news) = storage.news() {
        state.runs.hear_news(news);
    }
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().configure(web::configure(state.clone()))
    })
    // No Nagle: SSE frames and small answers leave at once instead of waiting for the peer's
    // delayed ACK (about 40 ms per run end to end, measured by `bench runs`).
    .on_connect(|conn, _| {
        if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
            let _ = tcp.set_nodelay(true);
            // A client that stops reading takes at most this much of our writing before its
            // connection pushes back (the kernel would otherwise grow the buffer to megabytes, each
            // copied for every stalled viewer of a run).
            let _ = socket2::SockRef::from(tcp).set_send_buffer_size(SEND_BUFFER_BYTES);
        }
    })
    .disable_signals()
    .shutdown_timeout(5)
    .listen(listener)
    .with_context(|| format!("listen on {addr}"))?;
    let server = server.run();
    let handle = server.handle();
    let task = actix_web::rt::spawn(server);
    supervisor.do_send(actors::supervisor::OpenIngress);
    let database = match config.storage.kind {
        config::StorageKind::Memory => "memory".to_owned(),
        config::StorageKind::Sqlite => config.storage.path.display().to_string(),
        config::StorageKind::Postgres => {
            storage::redact_url(config.storage.url.as_deref().unwrap_or_default())
        }
    };
    tracing::info!(
        version = VERSION,
        generation = generation.as_str(),
        %addr,
        storage = storage.kind(),
        database,
        config = %config.source,
        ui = %format!("{ui_base}/runs"),
        "switchboard listening"
    );
    let drain = DrainSettings {
        deadline: Duration::from_millis(config.drain.deadline_ms),
        handoff_budget: Duration::from_millis(config.drain.handoff_budget_ms),
    };
    Ok(Running {
        addr,
        generation,
        storage,
        draining,
        supervisor,
        registry,
        history,
        plans,
        metrics,
        shutdown,
        drain,
        server: handle,
        task,
    })
}

/// How an asked run ended, from its record.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub status: String,
    pub answer: Option<String>,
    /// The `run_failed` message (redacted and capped, as the record keeps it).
    pub error: Option<String>,
}

/// Run one message through `running` as `switchboard ask` does: thread `cli:<uuid>`, visibility
/// `machine`. Answers how the run ended once its record has landed.
pub async fn ask(running: &Running, text: String, agent: Option<String>) -> anyhow::Result<Asked> {
    use actors::supervisor::{AdmitMessage, Admitted};
    let request = actors::run::Request {
        thread: uuid::Uuid::now_v7().to_string(),
        channel: "cli".into(),
        user: "cli".into(),
        text,
        agent,
        visibility: Some("machine".into()),
        parent_run_id: None,
        source: Default::default(),
        strategy: None,
    };
    let admitted = running
        .supervisor
        .send(AdmitMessage {
            request,
            key: None,
            writer: None,
        })
        .await
        .context("reach the supervisor")?
        .map_err(|e| anyhow::anyhow!("admit the message: {e}"))?;
    let Admitted::Started { run_id, .. } = admitted else {
        anyhow::bail!("a fresh thread was steered")
    };
    loop {
        match running.registry.row(&run_id) {
            // Finished but the record did not land: say so rather than wait forever.
            Some(row) if row.finished_at.is_some() && running.history.pending() == 0 => {
                anyhow::bail!(
                    "run {run_id} finished {:?} but its record did not land",
                    row.status
                )
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(25)).await,
            // The registry forgets a run once its record landed: the store has it from then on.
            None => {
                let record = running
                    .storage
                    .get(run_id.clone())
                    .await
                    .context("read the record")?;
                let record = record.filter(|r| !r.head.provisional);
                let record = record
                    .with_context(|| format!("run {run_id} ended without a record (fenced)"))?;
                let last = |kind: &str, field: &str| {
                    record
                        .events
                        .iter()
                        .rev()
                        .find(|e| e["type"] == kind)
                        .and_then(|e| e[field].as_str())
                        .map(str::to_owned)
                };
                return Ok(Asked {
                    status: record.head.status.as_str().to_owned(),
                    answer: last("answer", "text"),
                    error: last("run_failed", "message"),
                });
            }
        }
    }
}
