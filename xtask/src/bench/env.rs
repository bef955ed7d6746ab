//! Facts about the run for the report's header: date, commit, host, processor.

use std::process::Command;
use std::time::SystemTime;

use super::report::Meta;

/// The header facts of a run started at `started`.
pub fn meta(quick: bool, started: SystemTime) -> Meta {
    Meta {
        date: humantime::format_rfc3339_seconds(started).to_string(),
        commit: commit(),
        host: host_name(),
        cpu: cpu_model(),
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        quick,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        duration_s: 0.0,
    }
}

/// The commit this binary was built from (`git describe` at build time, `-dirty` when the tree
/// had changes), else `git describe` of the working tree. The build's commit comes first: a
/// staged binary runs on a machine whose checkout need not be the one it was built from.
fn commit() -> String {
    if let Some(built) = option_env!("CARTAGE_BUILD_COMMIT").filter(|c| !c.is_empty()) {
        return built.to_string();
    }
    Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
