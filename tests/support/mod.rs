//! Shared helpers for end-to-end tests: start the real app on 127.0.0.1:0 over a temp data dir.

#![allow(dead_code)]

use std::path::PathBuf;

use switchboard::{Config, Running};

/// A running app and the temp dir that holds its database; dropped together.
pub struct TestApp {
    pub running: Running,
    pub base: String,
    pub client: reqwest::Client,
    pub dir: tempfile::TempDir,
}

impl TestApp {
    /// Start the app with the embedded default configuration, a free port and a temp database.
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::parse(switchboard::config::EMBEDDED_NAME, switchboard::config::EMBEDDED, Vec::new())
            .expect("embedded config");
        config.server.bind = "127.0.0.1:0".into();
        config.storage.path = dir.path().join("switchboard.db");
        tweak(&mut config);
        let running = switchboard::start(config).await.expect("start app");
        let base = format!("http://{}", running.addr);
        TestApp { running, base, client: reqwest::Client::new(), dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("switchboard.db")
    }
}
