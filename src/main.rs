//! The `switchboard` binary: parse the CLI, set up logging, load the configuration, run.
//!
//! Logging goes to stderr through `tracing-subscriber`: `RUST_LOG` decides the filter; without it
//! `serve` and `chaos` log at info, every other command at warn (a client's stdout is its answer, and its
//! stderr should not fill with a server's info lines). `serve --log-format json` writes one JSON object
//! per line; text (the default) is coloured only when stderr is a terminal and `NO_COLOR` is unset, so
//! a log redirected to a file never carries ANSI escapes.
//!
//! Exit codes: `runs` maps its failures per SPEC §8.2 ([`switchboard::cli::exit_code`]); clap's usage
//! errors exit 2; any other failure exits 1.

use std::io::IsTerminal as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory as _, Parser, Subcommand};
use switchboard::Config;

/// mimalloc instead of glibc's allocator: events, transcripts and records are built on one thread and
/// freed on another (arbiter, storage actor, readers), where glibc's arenas spent about a sixth of the
/// server's samples under `bench runs` (`malloc`, `_int_free`, `malloc_consolidate`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "switchboard",
    version,
    about = "A runtime for long-running, chat-driven agent runs"
)]
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
        /// How log lines are written to stderr.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Read and control runs: against a running server (`--url`, `--token`) or a database (`--db`).
    ///
    /// Exit codes: 0 ok, 1 other failure, 2 usage, 3 not found, 4 conflict, 5 unauthorized or
    /// forbidden, 6 unavailable.
    Runs(switchboard::cli::RunsArgs),
    /// Measure: `steps`, `runs`, `commits`, `sse`, `stalled`, `recovery`, `idle`, `soak` or `all` (SPEC §11).
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
        /// The configuration file (default: ./config.toml when present, else the embedded default).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Keep the run in this SQLite database (default: a temporary one, removed afterwards).
        #[arg(long)]
        db: Option<PathBuf>,
    },
    /// Deterministic simulation of the run lifecycle: seeded crash schedules over one in-memory ledger;
    /// prints a table and a JSON line, and the replayable trace of a failing seed (exit 1).
    Sim(SimArgs),
    /// Print a shell completion script to stdout (e.g. `switchboard completions bash > /etc/bash_completion.d/switchboard`).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `switchboard sim`: which seeds, which faults.
#[derive(clap::Args)]
struct SimArgs {
    /// How many seeds to simulate, spread over the cores (default 1000).
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed (default 0); given alone, replay that one seed and print its trace.
    #[arg(long)]
    seed: Option<u64>,
    /// The faults the seeds may land: `all`, `none`, or a comma-separated list of crash, pause, drain,
    /// outage, permanent, lost-reply, expire-leases, stop, kill, panic.
    #[arg(long, default_value = "all", value_parser = sim::Fault::parse_list)]
    faults: std::collections::BTreeSet<sim::Fault>,
    /// Fail on the known production issues too (by default they are reported, not failed on).
    #[arg(long)]
    strict: bool,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines (coloured only on a terminal without NO_COLOR).
    Text,
    /// One JSON object per line (timestamp, level, target, fields, spans).
    Json,
}

/// Install the global subscriber: `RUST_LOG` when set (and valid), else `default_level`.
fn init_tracing(default_level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(ansi).init();
        }
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}

/// A client command writing to a closed pipe (`switchboard runs list | head`) ends quietly, as Unix tools
/// do, instead of panicking on the failed write: the default `SIGPIPE` action is restored. `serve` and
/// `chaos` keep Rust's default (ignored; a failed write is an error), so a reader that goes away never
/// kills a server.
fn die_quietly_on_a_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: `signal` with `SIG_DFL` installs no handler (no code runs in signal context); it is called
    // once, at the start of `main`, before any thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. } | Command::Chaos(_)) {
        die_quietly_on_a_closed_pipe();
    }
    let (level, format) = match &cli.command {
        Command::Serve { log_format, .. } => ("info", *log_format),
        Command::Chaos(_) => ("info", LogFormat::Text),
        Command::Ask { .. }
        | Command::Bench(_)
        | Command::Runs(_)
        | Command::Completions { .. } => ("warn", LogFormat::Text),
        // The simulated processes are the production code: their logs describe simulated faults, so
        // they stay off unless RUST_LOG asks for them.
        Command::Sim(_) => ("off", LogFormat::Text),
    };
    init_tracing(level, format);
    let result = match cli.command {
        Command::Serve { config, .. } => serve(config),
        Command::Ask {
            text,
            agent,
            config,
            db,
        } => ask(text, agent, config, db),
        Command::Runs(args) => {
            return match switchboard::cli::run(args) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("switchboard: {e:#}");
                    std::process::ExitCode::from(switchboard::cli::exit_code(&e))
                }
            };
        }
        Command::Bench(args) => switchboard::bench::run(args),
        Command::Chaos(args) => switchboard::chaos::run(args),
        Command::Sim(args) => {
            let seeds = args
                .seeds
                .unwrap_or(if args.seed.is_some() { 1 } else { 1000 });
            let run = sim::cli::Args {
                seeds,
                seed: args.seed.unwrap_or(0),
                faults: Some(args.faults),
                strict: args.strict,
                stop_after: None,
            };
            return std::process::ExitCode::from(sim::cli::run(&run) as u8);
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "switchboard",
                &mut std::io::stdout(),
            );
            Ok(())
        }
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

fn ask(
    text: String,
    agent: Option<String>,
    config: Option<PathBuf>,
    db: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut config = load_config(config)?;
    // The process serves nothing: its listener only exists because boot binds one.
    config.server.bind = "127.0.0.1:0".into();
    // Nothing is left in the working directory unless asked: a temporary database and workspaces.
    let scratch = tempfile::tempdir().context("create a temporary data directory")?;
    config.storage.kind = switchboard::config::StorageKind::Sqlite;
    config.storage.path = db.unwrap_or_else(|| scratch.path().join("ask.db"));
    if config.storage.workspace_root.is_none() {
        config.storage.workspace_root = Some(scratch.path().join("workspaces"));
    }
    actix_web::rt::System::new().block_on(async move {
        let running = switchboard::start(config).await?;
        let outcome = switchboard::ask(&running, text, agent).await;
        running.stop().await?;
        let asked = outcome?;
        if let Some(a) = &asked.answer {
            println!("{a}");
        }
        match (asked.status.as_str(), asked.error) {
            ("completed", _) => Ok(()),
            (status, Some(error)) => anyhow::bail!("the run ended {status}: {error}"),
            (status, None) => anyhow::bail!("the run ended {status}"),
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
        tracing::info!(
            generation = running.generation.as_str(),
            "shutdown: draining"
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand and every argument of the commands this file and `cli/` define says what it is
    /// for (SPEC §8.2), and clap's own consistency checks pass for the whole tree.
    #[test]
    fn every_flag_and_subcommand_has_help() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = ["help", "version"].contains(&arg.get_id().as_str());
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        let mut missing = Vec::new();
        for name in ["serve", "runs", "ask", "completions"] {
            let sub = cli.find_subcommand(name).expect("a subcommand");
            walk(sub, name, &mut missing);
        }
        assert!(missing.is_empty(), "without help text: {missing:?}");
    }
}
