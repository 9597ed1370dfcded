//! A headless Chromium driven over WebDriver (chromedriver), spoken directly as JSON over reqwest: the
//! browser tests' [`Driver`] and [`Session`], screenshots under `target/screenshots/`, and small script
//! builders. CI installs `chromium` and `chromium-driver` (`.ci/run`); a missing browser fails the test.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The W3C WebDriver element reference key.
pub const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process, killed on drop.
pub struct Driver {
    child: Child,
    pub base: String,
    pub http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    pub async fn start() -> Driver {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: install chromium and chromium-driver (see .ci/run)"
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let ready = super::wait_until(Duration::from_secs(20), || async {
            let r = driver
                .http
                .get(format!("{}/status", driver.base))
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        })
        .await;
        assert!(ready.is_some(), "chromedriver did not become ready");
        driver
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("webdriver request");
        let status = res.status();
        let v: Value = res.json().await.expect("webdriver JSON");
        assert!(status.is_success(), "webdriver {path}: {status} {v}");
        v["value"].clone()
    }

    pub async fn session(&self, profile: &Path) -> Session<'_> {
        self.session_sized(profile, None).await
    }

    /// A session whose viewport is `width × height` CSS pixels (a phone), or the desktop window.
    pub async fn session_sized(&self, profile: &Path, phone: Option<(u32, u32)>) -> Session<'_> {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1000",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let mut options = json!({"binary": CHROMIUM, "args": args});
        if let Some((width, height)) = phone {
            options["mobileEmulation"] =
                json!({"deviceMetrics": {"width": width, "height": height, "pixelRatio": 2.0}});
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}});
        let v = self
            .call(reqwest::Method::POST, "/session", Some(caps))
            .await;
        Session {
            driver: self,
            id: v["sessionId"].as_str().expect("sessionId").to_owned(),
            version: v["capabilities"]["browserVersion"]
                .as_str()
                .unwrap_or("?")
                .to_owned(),
        }
    }
}

pub struct Session<'a> {
    pub driver: &'a Driver,
    pub id: String,
    pub version: String,
}

impl Session<'_> {
    pub async fn post(&self, path: &str, body: Value) -> Value {
        self.driver
            .call(
                reqwest::Method::POST,
                &format!("/session/{}{path}", self.id),
                Some(body),
            )
            .await
    }

    pub async fn goto(&self, url: &str) {
        self.post("/url", json!({"url": url})).await;
    }

    /// A Chrome DevTools command through chromedriver (e.g. `Emulation.setEmulatedMedia`).
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.post("/goog/cdp/execute", json!({"cmd": cmd, "params": params}))
            .await
    }

    /// The page as a `prefers-color-scheme: dark` reader sees it (kept across navigations).
    pub async fn prefer_dark(&self) {
        self.cdp(
            "Emulation.setEmulatedMedia",
            json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
        )
        .await;
    }

    pub async fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    pub async fn click(&self, css: &str) {
        let el = self
            .post("/element", json!({"using": "css selector", "value": css}))
            .await;
        let id = el[ELEMENT].as_str().expect("element id").to_owned();
        self.post(&format!("/element/{id}/click"), json!({})).await;
    }

    /// Poll `script` until it returns true.
    pub async fn wait_for(&self, script: &str, within: Duration) -> bool {
        super::wait_until(within, || async {
            self.js(script).await.as_bool().filter(|b| *b)
        })
        .await
        .is_some()
    }

    pub async fn screenshot(&self, to: &Path) {
        let v = self
            .driver
            .call(
                reqwest::Method::GET,
                &format!("/session/{}/screenshot", self.id),
                None,
            )
            .await;
        let png = base64_decode(v.as_str().expect("base64 screenshot"));
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        std::fs::write(to, png).expect("write screenshot");
    }

    /// Save a screenshot as `target/screenshots/<name>.png`; answers its path.
    pub async fn shoot(&self, name: &str) -> std::path::PathBuf {
        let dir = screenshots();
        let path = dir.join(format!("{name}.png"));
        self.screenshot(&path).await;
        assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        println!("screenshot: {}", path.display());
        path
    }

    pub async fn close(self) {
        self.driver
            .call(
                reqwest::Method::DELETE,
                &format!("/session/{}", self.id),
                None,
            )
            .await;
    }
}

/// `target/screenshots/` of this workspace (created).
pub fn screenshots() -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).expect("create target/screenshots");
    dir
}

/// Standard base64 (with padding) to bytes.
pub fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, c)| {
            acc | (u32::from(val(*c)) << (18 - 6 * i))
        });
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    out
}

pub fn count(css: &str) -> String {
    format!("return document.querySelectorAll({css:?}).length;")
}

/// The number of `css` elements matching `pred` (a JS expression over `e`).
pub fn count_where(css: &str, pred: &str) -> String {
    format!("return Array.prototype.filter.call(document.querySelectorAll({css:?}), function (e) {{ return {pred}; }}).length;")
}

/// POST `body` as JSON: the status and the JSON answer (`null` when there is none).
pub async fn post(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let res = http.post(url).json(&body).send().await.expect("POST");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}
