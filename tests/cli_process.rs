//! End to end: the binary as an operator runs it — `serve`'s log lines (text and JSON, the banner, access
//! lines, run ends), `ask`'s log level and exit, and a client command on a closed pipe.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

// ---- Logging ----

/// `cmd` with an empty environment but `PATH`: other tests here set `SWITCHBOARD_TEST_TOKEN_*` variables
/// at any moment, which a server would read as configuration overrides (and `NO_COLOR` must be unset).
fn clean_env(cmd: &mut Command) -> &mut Command {
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd
}

/// Start `switchboard serve <extra>` with stderr into `log` (a file: not a terminal) and no `NO_COLOR`;
/// once it listens, stop it with SIGTERM and answer the log.
fn serve_once(dir: &Path, log: &Path, extra: &[&str]) -> String {
    serve_while(dir, log, extra, |_| {})
}

/// [`serve_once`], calling `work` with the bound address (`127.0.0.1:<port>`) before the SIGTERM.
fn serve_while(dir: &Path, log: &Path, extra: &[&str], work: impl FnOnce(&str)) -> String {
    let file = std::fs::File::create(log).unwrap();
    let mut child = clean_env(&mut Command::new(env!("CARGO_BIN_EXE_switchboard")))
        .arg("serve")
        .args(extra)
        .current_dir(dir)
        .env("SWITCHBOARD_SERVER__BIND", "127.0.0.1:0")
        .env("SWITCHBOARD_STORAGE__PATH", dir.join("s.db"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(file))
        .spawn()
        .expect("spawn switchboard serve");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains("switchboard listening")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never listened: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("switchboard listening"))
        .unwrap();
    let addr: String = line[line.find("127.0.0.1:").unwrap()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    work(&addr);
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    assert!(child.wait().unwrap().success());
    std::fs::read_to_string(log).unwrap()
}

#[test]
fn serve_logs_to_a_file_carry_no_ansi_escapes_in_text_or_json() {
    let dir = tempfile::tempdir().unwrap();
    let text = serve_once(dir.path(), &dir.path().join("text.log"), &[]);
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escapes in a redirected log:\n{text:?}"
    );
    assert!(
        text.lines().any(|l| l.contains(" INFO ")
            && l.contains("switchboard listening")
            && l.contains("addr=127.0.0.1:")),
        "{text}"
    );

    let json = serve_once(
        dir.path(),
        &dir.path().join("json.log"),
        &["--log-format", "json"],
    );
    assert!(!json.contains('\u{1b}'), "{json:?}");
    let lines: Vec<Value> = json
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .collect();
    let listening = lines
        .iter()
        .find(|l| l["fields"]["message"] == "switchboard listening")
        .expect("the listening line");
    assert_eq!(listening["level"], "INFO");
    let f = &listening["fields"];
    assert!(
        f["addr"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{listening}"
    );
    // The banner: version, generation, the database, the configuration and where the UI is.
    assert_eq!(f["version"], switchboard::VERSION);
    assert!(
        storage::Generation::parse(f["generation"].as_str().unwrap()).is_some(),
        "{listening}"
    );
    assert!(
        f["database"].as_str().unwrap().ends_with("s.db") && f["config"].is_string(),
        "{listening}"
    );
    assert!(
        f["ui"].as_str().unwrap().starts_with("http://127.0.0.1:")
            && f["ui"].as_str().unwrap().ends_with("/runs"),
        "{listening}"
    );
    // Migrations are debug detail.
    assert!(!json.contains("migrated"), "{json}");
}

/// Every 4xx and 5xx is an info access line: method, route pattern (never the path's values), status,
/// the error code.
#[test]
fn a_refused_request_is_an_info_access_line_naming_the_route_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let log = serve_while(dir.path(), &dir.path().join("access.log"), &[], |addr| {
        let url = format!("http://{addr}/api/runs/no-such-run-id");
        let status = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async { reqwest::get(url).await.unwrap().status().as_u16() })
        })
        .join()
        .unwrap();
        assert_eq!(status, 404);
    });
    let line = log
        .lines()
        .find(|l| l.contains("request refused or failed"))
        .unwrap_or_else(|| panic!("no access line:\n{log}"));
    assert!(
        line.contains(" INFO ") && line.contains("status=404") && line.contains("/api/runs/{id}"),
        "{line}"
    );
    assert!(
        line.contains("not_found") && !line.contains("no-such-run-id"),
        "{line}"
    );
}

/// An operator finds why a run failed from the log alone (at info): one line at the run's end with its
/// status and the (redacted) error.
#[test]
fn a_failed_run_ends_with_one_info_line_naming_its_status_and_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    clean_env(&mut cmd)
        .args(["ask", "steps=2 ms=0 fail_at=1"])
        .current_dir(dir.path())
        .env("RUST_LOG", "info");
    let out = cmd.output().expect("run switchboard ask");
    assert_eq!(out.status.code(), Some(1));
    let log = String::from_utf8_lossy(&out.stderr);
    // The failure is said, with its error, on the last line.
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("switchboard: the run ended failed: "),
        "{log}"
    );
    // Nothing is left in the working directory: the database was a temporary one.
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "ask left files behind"
    );
    let end = log
        .lines()
        .find(|l| l.contains("run finished"))
        .unwrap_or_else(|| panic!("no run end line:\n{log}"));
    assert!(
        end.contains("status=\"failed\"") || end.contains("status=failed"),
        "{end}"
    );
    assert!(end.contains("error=") && end.contains("run_id="), "{end}");
}

#[test]
fn ask_logs_at_warn_unless_rust_log_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let ask = |rust_log: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
        clean_env(&mut cmd)
            .args(["ask", "steps=1 ms=0 answer=quiet"])
            .current_dir(dir.path())
            .env("SWITCHBOARD_STORAGE__PATH", dir.path().join("ask.db"));
        match rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
        let out = cmd.output().expect("run switchboard ask");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "quiet");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let quiet = ask(None);
    assert!(
        !quiet.contains("INFO") && !quiet.contains("switchboard listening"),
        "info lines without RUST_LOG:\n{quiet}"
    );
    let loud = ask(Some("info"));
    assert!(
        loud.contains("switchboard listening"),
        "RUST_LOG=info wins:\n{loud}"
    );
}

/// A client command whose reader has gone (`switchboard completions fish | head`) ends quietly on the
/// closed pipe, as Unix tools do: no panic, nothing on stderr.
#[test]
fn a_closed_pipe_ends_a_client_command_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["completions", "fish"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run switchboard completions");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
