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

impl TestApp {
    /// POST a message; answers (status, body).
    pub async fn post(&self, body: serde_json::Value) -> (u16, serde_json::Value) {
        let res = self.client.post(self.url("/api/messages")).json(&body).send().await.expect("POST /api/messages");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Start a run on `thread`; answers its id.
    pub async fn start_run(&self, thread: &str, text: &str) -> String {
        let (status, body) = self.post(serde_json::json!({"thread": thread, "channel": "c1", "user": "u1", "text": text})).await;
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["outcome"], "started", "{body}");
        body["runId"].as_str().expect("runId").to_owned()
    }

    /// The run's final (non-provisional) record, once it has landed.
    pub async fn final_record(&self, run_id: &str) -> storage::record::RunRecord {
        let storage = self.running.storage.clone();
        let id = run_id.to_owned();
        wait_until(std::time::Duration::from_secs(30), move || {
            let (storage, id) = (storage.clone(), id.clone());
            async move { storage.get(id).await.ok().flatten().filter(|r| !r.head.provisional) }
        })
        .await
        .unwrap_or_else(|| panic!("no final record for {run_id}"))
    }

    /// Wait until the run has published an event of `kind`; answers it.
    pub async fn event(&self, run_id: &str, kind: &str) -> serde_json::Value {
        let registry = self.running.registry.clone();
        let (id, kind2) = (run_id.to_owned(), kind.to_owned());
        wait_until(std::time::Duration::from_secs(30), move || {
            let r = registry.snapshot(&id).map(|(_, evs)| evs.into_iter().find(|e| e["type"] == kind2.as_str()));
            async move { r.flatten() }
        })
        .await
        .unwrap_or_else(|| panic!("run {run_id} never published {kind}"))
    }
}

/// Poll `check` until it answers `Some`, or `None` after `timeout` (for eventual properties only).
pub async fn wait_until<T, F, Fut>(timeout: std::time::Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
