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

pub mod config;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use storage::{BackendSpec, Generation, MemoryStore, SqliteStore, StorageHandle, Synchronous};

pub use config::Config;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A started Switchboard process: its address, generation and the handles to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub generation: Generation,
    pub storage: StorageHandle,
    pub draining: Arc<AtomicBool>,
    server: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Stop accepting connections and finish in-flight requests.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.server.stop(true).await;
        self.task.await.context("join http server")?.context("run http server")
    }

    /// Wait until the server stops on its own.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("join http server")?.context("run http server")
    }

    pub fn server_handle(&self) -> actix_web::dev::ServerHandle {
        self.server.clone()
    }
}

/// Boot a process from `config`. Needs an actix `System` (`#[actix_web::main]` / `#[actix_web::test]`).
pub async fn start(config: Config) -> anyhow::Result<Running> {
    let clock = storage::clock::system();
    let generation = Generation::mint(clock.now_ms());
    let span = tracing::info_span!("boot", generation = generation.as_str());
    let _enter = span.enter();
    let spec = match config.storage.kind {
        config::StorageKind::Memory => BackendSpec::Memory(MemoryStore::new()),
        config::StorageKind::Sqlite => {
            let synchronous = match config.storage.synchronous {
                config::SynchronousSetting::Full => Synchronous::Full,
                config::SynchronousSetting::Normal => Synchronous::Normal,
            };
            let path = config.storage.path.clone();
            // Open and migrate once here, so a bad path or a too-new schema fails boot with context.
            SqliteStore::open(&path, synchronous).with_context(|| format!("open database {}", path.display()))?;
            BackendSpec::Sqlite { path, synchronous }
        }
    };
    let storage = StorageHandle::start(spec, clock);
    storage.ping().await.context("start storage actor")?;
    let draining = Arc::new(AtomicBool::new(false));
    let state = web::AppState {
        generation: generation.clone(),
        version: VERSION,
        storage: storage.clone(),
        draining: draining.clone(),
    };
    let server = actix_web::HttpServer::new(move || actix_web::App::new().configure(web::configure(state.clone())))
        .disable_signals()
        .shutdown_timeout(5)
        .bind(&config.server.bind)
        .with_context(|| format!("bind http listener on {}", config.server.bind))?;
    let addr = *server.addrs().first().context("bind http listener: no address")?;
    let server = server.run();
    let handle = server.handle();
    let task = actix_web::rt::spawn(server);
    tracing::info!(%addr, storage = storage.kind(), "switchboard listening");
    Ok(Running { addr, generation, storage, draining, server: handle, task })
}
