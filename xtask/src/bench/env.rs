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

/// `git describe` of the working tree, else the commit this binary was built from.
fn commit() -> String {
    let described = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    match (described, option_env!("CARTAGE_BUILD_COMMIT")) {
        (Some(now), _) => now,
        (None, Some(built)) if !built.is_empty() => format!("{built} (the binary's build)"),
        _ => "unknown".into(),
    }
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
