//! The deployment files: `deploy/switchboard.service` (systemd), `deploy/Dockerfile` and the
//! `deploy/config.toml` both ship, held against the defaults they must respect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use switchboard::Config;

fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A unit file's `[Service]` settings, in order (a key may repeat); comments and blank lines skipped.
fn service_section(unit: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_owned();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a setting: {line:?}"));
        if section == "[Service]" {
            out.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    out
}

fn one<'a>(settings: &'a [(String, String)], key: &str) -> &'a str {
    let found: Vec<&str> = settings
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{key} must be set exactly once in [Service]: {found:?}"
    );
    found[0]
}

/// A systemd time span: bare seconds (`960`), or with units (`16min`, `900s`, `15min 30s`).
fn timespan(v: &str) -> Duration {
    if let Ok(secs) = v.parse::<u64>() {
        return Duration::from_secs(secs);
    }
    humantime::parse_duration(v).unwrap_or_else(|e| panic!("not a time span {v:?}: {e}"))
}

#[test]
fn the_systemd_unit_outlasts_the_default_drain_and_stops_with_sigterm() {
    let unit = deploy_file("switchboard.service");
    let service = service_section(&unit);
    let defaults = Config::default();
    let drain =
        Duration::from_millis(defaults.drain.deadline_ms + defaults.drain.handoff_budget_ms);
    let stop = timespan(one(&service, "TimeoutStopSec"));
    assert!(
        stop > drain,
        "TimeoutStopSec {stop:?} must exceed the drain deadline plus handoff budget {drain:?}"
    );
    assert_eq!(one(&service, "KillSignal"), "SIGTERM");
    assert_eq!(one(&service, "Restart"), "on-failure");
    let exec = one(&service, "ExecStart");
    assert!(
        exec.starts_with("/usr/local/bin/switchboard serve --config /etc/switchboard/config.toml"),
        "{exec}"
    );
    let user = one(&service, "User");
    assert!(
        !user.is_empty() && user != "root",
        "a dedicated user, not {user:?}"
    );
    assert_eq!(one(&service, "NoNewPrivileges"), "yes");
    assert_eq!(one(&service, "ProtectSystem"), "strict");

    // The shipped config with the unit's environment puts the database in a writable path.
    let env: Vec<(String, String)> = service
        .iter()
        .filter(|(k, _)| k == "Environment")
        .filter_map(|(_, v)| v.split_once('=').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .collect();
    let config = Config::parse("deploy/config.toml", &deploy_file("config.toml"), env)
        .expect("the shipped config parses");
    let data_dir = config
        .storage
        .path
        .parent()
        .expect("a data dir")
        .to_path_buf();
    let writable: Vec<PathBuf> = one(&service, "ReadWritePaths")
        .split_whitespace()
        .map(PathBuf::from)
        .collect();
    assert!(
        writable.iter().any(|w| data_dir.starts_with(w)),
        "{} is not in ReadWritePaths {writable:?}",
        data_dir.display()
    );
    assert_eq!(
        config.drain.deadline_ms, defaults.drain.deadline_ms,
        "the unit's stop timeout is sized for the default"
    );
}

#[test]
fn the_image_runs_unprivileged_with_its_data_on_the_volume_and_checks_readyz() {
    let dockerfile = deploy_file("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    let instr = |name: &str| -> Vec<&str> {
        lines
            .iter()
            .filter_map(|l| {
                l.strip_prefix(name)
                    .filter(|r| r.starts_with(' '))
                    .map(str::trim)
            })
            .collect()
    };
    let froms = instr("FROM");
    assert!(froms[0].starts_with("rust:1.95"), "{froms:?}");
    assert_eq!(froms.last().copied(), Some("debian:bookworm-slim"));
    assert!(
        dockerfile.contains("cargo build --release --locked"),
        "{dockerfile}"
    );
    let user = instr("USER");
    assert!(
        user.last().is_some_and(|u| *u != "root" && *u != "0"),
        "{user:?}"
    );
    assert_eq!(instr("VOLUME"), ["[\"/data\"]"]);
    assert!(
        dockerfile.contains("HEALTHCHECK") && dockerfile.contains("/readyz"),
        "{dockerfile}"
    );
    assert_eq!(instr("STOPSIGNAL"), ["SIGTERM"]);

    // The config it copies in keeps the database on the volume and listens on the exposed port.
    let config = Config::parse(
        "deploy/config.toml",
        &deploy_file("config.toml"),
        Vec::new(),
    )
    .expect("the shipped config parses");
    assert!(
        config.storage.path.starts_with("/data"),
        "{}",
        config.storage.path.display()
    );
    let port = config
        .server
        .bind
        .rsplit_once(':')
        .map(|(_, p)| p.to_owned())
        .expect("bind has a port");
    assert_eq!(instr("EXPOSE"), [port.as_str()]);
    assert!(
        dockerfile.contains(&format!("http://127.0.0.1:{port}/readyz")),
        "{dockerfile}"
    );
    assert!(
        !config.auth.dev_bypass,
        "a container is not loopback-only: no dev bypass"
    );
    assert!(
        dockerfile.contains("COPY deploy/config.toml /etc/switchboard/config.toml"),
        "{dockerfile}"
    );
    // The context is the repository root: a build directory (gigabytes) or a local database stays out.
    let ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".dockerignore"))
            .expect(".dockerignore");
    for dir in ["target/", "data/"] {
        assert!(
            ignore.lines().any(|l| l.trim() == dir),
            ".dockerignore lacks {dir}"
        );
    }
}
