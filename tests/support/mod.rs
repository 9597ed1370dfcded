//! Shared helpers for end-to-end tests: start the real app on 127.0.0.1:0 over a temp data dir; [`child`]:
//! the real binary as a child process.

#![allow(dead_code)]

pub mod browser;
pub mod cli;

pub mod child;

use std::path::PathBuf;
use storage::RunId;

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
        let mut config = Config::parse(
            switchboard::config::EMBEDDED_NAME,
            switchboard::config::EMBEDDED,
            Vec::new(),
        )
        .expect("embedded config");
        config.server.bind = "127.0.0.1:0".into();
        config.storage.path = dir.path().join("switchboard.db");
        tweak(&mut config);
        let running = switchboard::start(config).await.expect("start app");
        let base = format!("http://{}", running.addr);
        TestApp {
            running,
            base,
            client: reqwest::Client::new(),
            dir,
        }
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
        let res = self
            .client
            .post(self.url("/api/messages"))
            .json(&body)
            .send()
            .await
            .expect("POST /api/messages");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Start a run on `thread`; answers its id.
    pub async fn start_run(&self, thread: &str, text: &str) -> String {
        let (status, body) = self
            .post(
                serde_json::json!({"thread": thread, "channel": "c1", "user": "u1", "text": text}),
            )
            .await;
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
            async move {
                storage
                    .get(RunId::from(id))
                    .await
                    .ok()
                    .flatten()
                    .filter(|r| !r.head.provisional)
            }
        })
        .await
        .unwrap_or_else(|| panic!("no final record for {run_id}"))
    }

    /// Wait until the run has published an event of `kind`; answers it.
    pub async fn event(&self, run_id: &str, kind: &str) -> serde_json::Value {
        let registry = self.running.registry.clone();
        let (id, kind2) = (run_id.to_owned(), kind.to_owned());
        wait_until(std::time::Duration::from_secs(30), move || {
            let r = registry
                .snapshot(&RunId::from(&id))
                .map(|(_, evs)| evs.into_iter().find(|e| e["type"] == kind2.as_str()));
            async move { r.flatten() }
        })
        .await
        .unwrap_or_else(|| panic!("run {run_id} never published {kind}"))
    }
}

/// Poll `check` until it answers `Some`, or `None` after `timeout` (for eventual properties only).
/// A webhook receiver that counts the POSTs it gets; answers its URL and the counter.
#[allow(dead_code)] // not every test binary delivers replies
pub fn counting_webhook() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use actix_web::{web, App, HttpResponse, HttpServer};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let server = HttpServer::new(move || {
        let counter = counter.clone();
        App::new().route(
            "/hook",
            web::post().to(move |_: web::Json<serde_json::Value>| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { HttpResponse::Ok().finish() }
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .expect("bind the webhook receiver");
    let url = format!("http://{}/hook", server.addrs()[0]);
    actix_web::rt::spawn(server.run());
    (url, hits)
}

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

// ---- Read surfaces (issue 6): bearer tokens, JSON reads, SSE readers ----

/// Add a bearer token to `config` through a fresh, uniquely named environment variable; answers the
/// token's value. `visible_to` is the SPEC §2 filter JSON.
pub fn add_token(
    config: &mut Config,
    name: &str,
    scopes: &[&str],
    visible_to: serde_json::Value,
) -> String {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let value = format!("tok-{name}-{unique}");
    let env = format!("SWITCHBOARD_TEST_TOKEN_{}", unique.to_uppercase());
    std::env::set_var(&env, &value);
    config.auth.tokens.push(switchboard::config::TokenConfig {
        name: name.to_owned(),
        token_env: env,
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        visible_to: Some(visible_to),
    });
    value
}

/// One server-sent event as a test sees it.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: String,
    pub id: String,
    pub data: serde_json::Value,
}

/// An SSE reader over a reqwest response (`eventsource-stream`).
pub struct SseReader {
    stream: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<eventsource_stream::Event, String>> + Send>,
    >,
}

impl SseReader {
    pub fn new(res: reqwest::Response) -> SseReader {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        let stream = res
            .bytes_stream()
            .eventsource()
            .map(|r| r.map_err(|e| e.to_string()));
        SseReader {
            stream: Box::pin(stream),
        }
    }

    /// The next event; `None` when the stream ended (or failed), panics after `timeout`.
    pub async fn next(&mut self, timeout: std::time::Duration) -> Option<SseEvent> {
        use futures_util::StreamExt;
        let item = tokio::time::timeout(timeout, self.stream.next())
            .await
            .expect("no SSE event within the timeout")?;
        let e = item.ok()?;
        Some(SseEvent {
            event: e.event,
            id: e.id,
            data: serde_json::from_str(&e.data).unwrap_or(serde_json::Value::String(e.data)),
        })
    }

    /// Every `run_event` until `end` (answered as the second value) or the end of the stream.
    pub async fn until_end(
        &mut self,
        timeout: std::time::Duration,
    ) -> (Vec<SseEvent>, Option<SseEvent>) {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(e) if e.event == "end" => return (events, Some(e)),
                Some(e) => events.push(e),
                None => return (events, None),
            }
        }
    }
}

impl TestApp {
    /// GET `path` (optionally with a bearer token); answers (status, JSON body or Null).
    pub async fn get_json(&self, path: &str, bearer: Option<&str>) -> (u16, serde_json::Value) {
        let mut req = self.client.get(self.url(path));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.expect("GET");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// GET `path` as text; answers (status, body).
    pub async fn get_text(&self, path: &str, bearer: Option<&str>) -> (u16, String) {
        let mut req = self.client.get(self.url(path));
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        let res = req.send().await.expect("GET");
        let status = res.status().as_u16();
        (status, res.text().await.unwrap_or_default())
    }

    /// POST a message with a bearer token; answers (status, body).
    pub async fn post_as(&self, bearer: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let res = self
            .client
            .post(self.url("/api/messages"))
            .bearer_auth(bearer)
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = res.status().as_u16();
        (status, res.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// Open an SSE stream; answers the status and, on 200, a reader.
    pub async fn sse(
        &self,
        path: &str,
        bearer: Option<&str>,
        last_event_id: Option<u64>,
    ) -> (u16, Option<SseReader>) {
        let mut req = self
            .client
            .get(self.url(path))
            .header("accept", "text/event-stream");
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = req.send().await.expect("open SSE stream");
        let status = res.status().as_u16();
        (status, (status == 200).then(|| SseReader::new(res)))
    }
}

/// The `type` of each event, in order (`?` for an event without one).
pub fn types(events: &[serde_json::Value]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}
