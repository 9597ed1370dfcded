//! Facts about processes on this host, for fast reclaim (SPEC §6.1, §1.3): a generation that ran on this
//! host — the same host identity (`[server] host_id`) and the same machine — and whose process is
//! provably gone (no such pid, or a different start time) is dead, so its rows are taken at once. A live
//! process's rows are never taken early; other hosts wait for the lease.

use std::sync::OnceLock;

use storage::ledger::GenerationInfo;

/// This machine's hostname (the default `[server] host_id`): `/proc/sys/kernel/hostname`, else what
/// `hostname` prints, else `/etc/hostname`, else `$HOSTNAME`, else `localhost`. Read once per process.
pub fn hostname() -> String {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let clean = |s: String| Some(s.trim().to_owned()).filter(|h| !h.is_empty());
        let command = || {
            let out = std::process::Command::new("hostname")
                .output()
                .ok()
                .filter(|o| o.status.success())?;
            clean(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .and_then(clean)
            .or_else(command)
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .and_then(clean)
            })
            .or_else(|| std::env::var("HOSTNAME").ok().and_then(clean))
            .unwrap_or_else(|| "localhost".into())
    })
    .clone()
}

/// A running process's start time as `/proc/<pid>/stat` field 22 reports it (tells a reused pid
/// apart). `None` for no such process, and for a zombie (state `Z` or `X`): it has exited, its parent
/// just has not reaped it yet, so it holds nothing (PITFALLS: processes).
pub fn proc_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start(&stat)
}

fn parse_start(stat: &str) -> Option<String> {
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are plain.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18).map(str::to_owned)
}

/// This process, of host identity `host_id`, as the `generations` table records it.
pub fn this_process(gen: &str, started_at: i64, host_id: &str) -> GenerationInfo {
    let pid = std::process::id();
    GenerationInfo {
        gen: gen.to_owned(),
        host: hostname(),
        host_id: host_id.to_owned(),
        pid,
        proc_start: proc_start(pid).unwrap_or_default(),
        started_at,
    }
}

/// Whether `info` names a process of host identity `host_id` (the asking process's), on this machine,
/// that is provably gone. A generation of another host identity is never gone from here, even when
/// its pid is missing on this machine: it waits for its lease (SPEC §1.3).
pub fn is_gone(info: &GenerationInfo, host_id: &str) -> bool {
    if info.host_id != host_id || info.host != hostname() || info.proc_start.is_empty() {
        return false;
    }
    match proc_start(info.pid) {
        None => true,
        Some(start) => start != info.proc_start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_has_no_start_time_so_it_is_dead() {
        let running = "4242 (my (odd) cmd) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start(running).as_deref(), Some("987654"));
        let zombie = running.replace(") S ", ") Z ");
        assert_eq!(parse_start(&zombie), None);
    }

    #[test]
    fn an_exited_child_not_yet_reaped_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let start = proc_start(pid).expect("running");
        // Wait until it has exited (a zombie: its /proc entry stays until we reap it).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let info = GenerationInfo {
            gen: "g".into(),
            host: hostname(),
            host_id: "h1".into(),
            pid,
            proc_start: start,
            started_at: 0,
        };
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "still unreaped"
        );
        assert!(is_gone(&info, "h1"));
        assert!(
            !is_gone(&info, "h2"),
            "another host identity waits for the lease"
        );
        child.wait().expect("reap");
    }

    #[test]
    fn this_process_is_alive_and_a_vanished_pid_or_reused_pid_is_gone() {
        let me = this_process("g", 0, "h1");
        assert_eq!((me.host.clone(), me.host_id.as_str()), (hostname(), "h1"));
        assert!(!me.proc_start.is_empty());
        assert!(!is_gone(&me, "h1"));
        let reused = GenerationInfo {
            proc_start: "1".into(),
            ..me.clone()
        };
        assert!(is_gone(&reused, "h1"));
        let vanished = GenerationInfo {
            pid: u32::MAX - 7,
            ..me.clone()
        };
        assert!(is_gone(&vanished, "h1"));
        assert!(
            !is_gone(&vanished, "h2"),
            "another host identity on this machine waits for the lease"
        );
        let elsewhere = GenerationInfo {
            host: "another-host".into(),
            pid: u32::MAX - 7,
            ..me
        };
        assert!(
            !is_gone(&elsewhere, "h1"),
            "other machines wait for the lease"
        );
    }

    #[test]
    fn the_hostname_is_the_kernels() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("linux");
        assert_eq!(hostname(), kernel.trim());
    }
}
