//! The database a scenario's `serve` children share (`switchboard chaos`, `switchboard bench`): the data
//! dir's SQLite file, or a PostgreSQL database — a fresh one in a throwaway cluster this process starts
//! (`storage::testing::pg`), or the one `--storage-url` names.
//!
//! What it owns: the throwaway cluster, stopped (and its temp dir removed) when the [`SharedDb`] is
//! dropped or this process exits. Children get the database through their environment
//! ([`DbSpec::env`]); each child is told its own `[server] host_id` by the caller.
//!
//! It also pauses a child at a moment it holds no transaction open ([`DbSpec::pause_outside_transaction`]):
//! a process stopped inside a write transaction would hold its locks for the length of the pause (SQLite:
//! the file's one write lock, so every writer stalls; PostgreSQL: row locks, so peers run into
//! `lock_timeout`), which is a limit of the database, not something a paused generation can be fenced out
//! of.
//!
//! # Design
//! On PostgreSQL the check is `storage::testing::pg::idle_check`: no SQL client here, the storage crate
//! opens the probe's connection. Every connection the storage crate opens names itself `switchboard/<pid>`
//! (`application_name`), so `pg_stat_activity` tells which backends belong to the stopped process and
//! whether any of them is in a transaction or a statement.

use std::path::Path;

use anyhow::Context;
use storage::testing::pg::Cluster;

use crate::child::ChildServer;

/// `--storage`: which database the scenario's processes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StorageChoice {
    /// One SQLite file in the scenario's data dir (WAL), shared by every process.
    #[default]
    Sqlite,
    /// One PostgreSQL database: a fresh one in a throwaway cluster (initdb + pg_ctl on a free loopback
    /// port, needs the server package), or `--storage-url`.
    Postgres,
}

/// Where the children's database is: cheap to clone, no resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbSpec {
    /// `switchboard.db` in each child's data dir.
    Sqlite,
    /// This PostgreSQL database (the URL may hold a password: never printed as is).
    Postgres { url: String },
}

/// A [`DbSpec`] and the throwaway cluster it lives in, when this process started one.
pub struct SharedDb {
    pub spec: DbSpec,
    /// Dropped last: stops the server. `None` for SQLite and for `--storage-url`.
    cluster: Option<Cluster>,
}

impl SharedDb {
    /// The database for `--storage kind [--storage-url url]`: for PostgreSQL without a URL, a throwaway
    /// cluster with one fresh database (blocks 1–2 s while it starts).
    pub fn open(kind: StorageChoice, url: Option<&str>) -> anyhow::Result<SharedDb> {
        match (kind, url) {
            (StorageChoice::Sqlite, None) => Ok(SharedDb {
                spec: DbSpec::Sqlite,
                cluster: None,
            }),
            (StorageChoice::Sqlite, Some(_)) => {
                anyhow::bail!("--storage-url needs --storage postgres")
            }
            (StorageChoice::Postgres, Some(url)) => {
                anyhow::ensure!(
                    url.starts_with("postgres://") || url.starts_with("postgresql://"),
                    "--storage-url must start with postgres:// or postgresql://"
                );
                Ok(SharedDb {
                    spec: DbSpec::Postgres {
                        url: url.to_owned(),
                    },
                    cluster: None,
                })
            }
            (StorageChoice::Postgres, None) => {
                let cluster = Cluster::start()
                    .map_err(|why| anyhow::anyhow!("start a throwaway PostgreSQL: {why}"))?;
                // `database()` panics rather than answering an error (it is made for tests): keep a panic
                // from taking this process down without the cluster's cleanup.
                let url =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cluster.database()))
                        .map_err(|_| {
                        anyhow::anyhow!("create a database in the throwaway PostgreSQL")
                    })?;
                Ok(SharedDb {
                    spec: DbSpec::Postgres { url },
                    cluster: Some(cluster),
                })
            }
        }
    }

    /// Whether this process started the cluster (and will stop it).
    pub fn is_throwaway(&self) -> bool {
        self.cluster.is_some()
    }
}

impl DbSpec {
    /// `"sqlite"` or `"postgres"`, as JSON lines name the backend.
    pub fn name(&self) -> &'static str {
        match self {
            DbSpec::Sqlite => "sqlite",
            DbSpec::Postgres { .. } => "postgres",
        }
    }

    /// The environment that points a `serve` child at this database (nothing for SQLite: [`ChildServer`]
    /// already sets the file).
    pub fn env(&self) -> Vec<(String, String)> {
        match self {
            DbSpec::Sqlite => Vec::new(),
            DbSpec::Postgres { url } => vec![
                (
                    "SWITCHBOARD_STORAGE__KIND".to_owned(),
                    "postgres".to_owned(),
                ),
                ("SWITCHBOARD_STORAGE__URL".to_owned(), url.clone()),
            ],
        }
    }

    /// SIGSTOP `child` at a moment it holds no write transaction (SQLite: the file's write lock on
    /// `data/switchboard.db`; PostgreSQL: no backend of its pid in a transaction or a statement). Answers
    /// an error, leaving the process running, when no such moment came in 200 tries.
    pub fn pause_outside_transaction(
        &self,
        child: &ChildServer,
        data: &Path,
    ) -> anyhow::Result<()> {
        match self {
            DbSpec::Sqlite => child.pause_outside_transaction(&data.join("switchboard.db")),
            DbSpec::Postgres { url } => {
                let mut idle = storage::testing::pg::idle_check(url)
                    .context("connect the pause probe to PostgreSQL")?;
                let pid = child.pid();
                child.pause_when(|| idle(pid).context("read pg_stat_activity"))
            }
        }
    }
}
