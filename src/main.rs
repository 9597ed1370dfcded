//! The `switchboard` binary: parse the CLI, load the configuration, run.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use switchboard::Config;

#[derive(Parser)]
#[command(name = "switchboard", version, about = "A runtime for long-running, chat-driven agent runs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve {
        /// The configuration file (default: ./config.toml when present, else the embedded default).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Read and control runs: against a running server (`--url`, `--token`) or a database (`--db`).
    Runs(switchboard::cli::RunsArgs),
    /// Measure: `steps`, `runs`, `sse`, `recovery`, `idle` or `all` (SPEC §11).
    Bench(switchboard::bench::BenchArgs),
    /// Kill-test: clients admit and steer while processes crash, pause and drain; then verify (SPEC §11).
    Chaos(switchboard::chaos::ChaosArgs),
    /// Run one message in-process and print the answer once its record has landed.
    Ask {
        /// The message text (directives like `steps=3` drive the scripted demo agent).
        text: String,
        /// The agent to run (default: `[defaults] agent`).
        #[arg(long)]
        agent: Option<String>,
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Serve { config } => serve(config),
        Command::Ask { text, agent, config } => ask(text, agent, config),
        Command::Runs(args) => switchboard::cli::run(args),
        Command::Bench(args) => switchboard::bench::run(args),
        Command::Chaos(args) => switchboard::chaos::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchboard: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn load_config(config: Option<PathBuf>) -> anyhow::Result<Config> {
    let path = config.or_else(|| Some(PathBuf::from("config.toml")).filter(|p| p.exists()));
    Ok(Config::load(path.as_deref())?)
}

fn ask(text: String, agent: Option<String>, config: Option<PathBuf>) -> anyhow::Result<()> {
    let mut config = load_config(config)?;
    // The process serves nothing: its listener only exists because boot binds one.
    config.server.bind = "127.0.0.1:0".into();
    actix_web::rt::System::new().block_on(async move {
        let running = switchboard::start(config).await?;
        let outcome = switchboard::ask(&running, text, agent).await;
        running.stop().await?;
        let (status, answer) = outcome?;
        match answer {
            Some(a) => println!("{a}"),
            None => println!("(no answer: {status})"),
        }
        if status == "completed" {
            Ok(())
        } else {
            anyhow::bail!("the run ended {status}")
        }
    })
}

fn serve(config: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load_config(config)?;
    actix_web::rt::System::new().block_on(async move {
        let running = switchboard::start(config).await?;
        let admin_drain = running.shutdown.clone();
        tokio::select! {
            r = shutdown_signal() => r.context("listen for shutdown signals")?,
            _ = admin_drain.notified() => {}
        }
        tracing::info!(generation = running.generation.as_str(), "shutdown: draining");
        running.drain().await.map(|_| ())
    })
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
