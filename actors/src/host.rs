//! Facts about processes on this host, for fast reclaim (SPEC §6.1): a generation that ran here and whose
//! process is provably gone (no such pid, or a different start time) is dead, so its rows are taken at
//! once. A live process's rows are never taken early; other hosts wait for the lease.

use storage::ledger::GenerationInfo;

/// This host's name.
pub fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// A process's start time as `/proc/<pid>/stat` field 22 reports it (tells a reused pid apart).
pub fn proc_start(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are plain.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// This process as the `generations` table records it.
pub fn this_process(gen: &str, started_at: i64) -> GenerationInfo {
    let pid = std::process::id();
    GenerationInfo { gen: gen.to_owned(), host: hostname(), pid, proc_start: proc_start(pid).unwrap_or_default(), started_at }
}

/// Whether `info` names a process on this host that is provably gone.
pub fn is_gone(info: &GenerationInfo) -> bool {
    if info.host != hostname() || info.proc_start.is_empty() {
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
    fn this_process_is_alive_and_a_vanished_pid_or_reused_pid_is_gone() {
        let me = this_process("g", 0);
        assert!(!me.proc_start.is_empty());
        assert!(!is_gone(&me));
        let reused = GenerationInfo { proc_start: "1".into(), ..me.clone() };
        assert!(is_gone(&reused));
        let vanished = GenerationInfo { pid: u32::MAX - 7, ..me.clone() };
        assert!(is_gone(&vanished));
        let elsewhere = GenerationInfo { host: "another-host".into(), pid: u32::MAX - 7, ..me };
        assert!(!is_gone(&elsewhere), "other hosts wait for the lease");
    }
}
