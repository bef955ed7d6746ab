//! `cargo xtask launch --nproc N -- <program> [args]`: start N local ranks of a program, as
//! torchrun does on one node, for development.
//!
//! Each process gets torchrun's variables: `RANK` and `LOCAL_RANK` (0..N), `WORLD_SIZE` and
//! `LOCAL_WORLD_SIZE` (N), `MASTER_ADDR` and `MASTER_PORT` (a free port unless given). Their
//! output is forwarded line by line with a `[rank i]` prefix (stdout to stdout, stderr to stderr).
//! When a rank fails, the others are stopped after a short grace (they would otherwise wait for
//! it until their timeout), and the launch fails naming every rank that failed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Arguments of `cargo xtask launch`.
#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// How many processes (ranks) to start on this machine.
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// Where rank 0 listens for the rendezvous.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The rendezvous port (default: a port free right now).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// The program to run, then its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// How long the other ranks may run after one has failed.
const GRACE: Duration = Duration::from_secs(3);

/// Start the ranks, forward their output, and fail if any fails.
pub fn run(args: LaunchArgs) -> anyhow::Result<()> {
    let failed = launch(&args, &mut std::io::stdout(), &mut std::io::stderr())?;
    if failed.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = failed
        .iter()
        .map(|(rank, status)| format!("rank {rank} ({status})"))
        .collect();
    bail!("{} of {} ranks failed: {}", failed.len(), args.nproc, list.join(", "))
}

/// Run the ranks; the ranks that failed, with how. Output goes to `out` and `err` (prefixed).
fn launch(args: &LaunchArgs, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<Vec<(usize, String)>> {
    if args.nproc == 0 {
        bail!("--nproc must be at least 1");
    }
    let (program, rest) = args.command.split_first().context("no program given after `--`")?;
    let port = match args.master_port {
        Some(p) => p,
        None => TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .context("finding a free port for MASTER_PORT")?,
    };
    let mut children: Vec<Child> = Vec::with_capacity(args.nproc);
    for rank in 0..args.nproc {
        let child = Command::new(program)
            .args(rest)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", args.nproc.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match child {
            Ok(child) => children.push(child),
            Err(e) => {
                stop(&mut children);
                return Err(e).with_context(|| format!("starting rank {rank}: `{program}`"));
            }
        }
    }
    tracing::info!(nproc = args.nproc, port, "launched");
    let lines = forward(&mut children);
    let mut ranks = Supervisor::new(children.len());
    loop {
        match lines.recv_timeout(Duration::from_millis(20)) {
            Ok((is_err, line)) => {
                write_line(out, err, is_err, &line);
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_millis(20)),
            Err(RecvTimeoutError::Timeout) => {}
        }
        if ranks.poll(&mut children)? {
            break;
        }
    }
    // The last lines: until every pipe is closed, or a moment (a stopped rank's own children
    // may keep a pipe open).
    let deadline = Instant::now() + Duration::from_secs(1);
    while let Ok((is_err, line)) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        write_line(out, err, is_err, &line);
    }
    Ok(ranks.failures())
}

fn write_line(out: &mut dyn Write, err: &mut dyn Write, is_err: bool, line: &str) {
    let _ = if is_err {
        writeln!(err, "{line}")
    } else {
        writeln!(out, "{line}")
    };
}

/// Read every child's stdout and stderr on threads of their own, sending prefixed lines (with
/// `true` for stderr) to the returned channel, which closes when every pipe has.
fn forward(children: &mut [Child]) -> Receiver<(bool, String)> {
    let (tx, rx) = std::sync::mpsc::channel();
    for (rank, child) in children.iter_mut().enumerate() {
        let pipes: [(bool, Option<Box<dyn Read + Send>>); 2] = [
            (false, child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>)),
            (true, child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>)),
        ];
        for (is_err, pipe) in pipes {
            let Some(pipe) = pipe else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if tx.send((is_err, format!("[rank {rank}] {line}"))).is_err() {
                        break;
                    }
                }
            });
        }
    }
    rx
}

/// The ranks' exit statuses as they arrive; once one fails, the others get [`GRACE`], then are
/// stopped.
struct Supervisor {
    status: Vec<Option<ExitStatus>>,
    failed_at: Option<Instant>,
    stopped: Vec<usize>,
}

impl Supervisor {
    fn new(ranks: usize) -> Self {
        Supervisor {
            status: vec![None; ranks],
            failed_at: None,
            stopped: Vec::new(),
        }
    }

    /// Collect the statuses of ranks that exited; true once every rank has.
    fn poll(&mut self, children: &mut [Child]) -> anyhow::Result<bool> {
        for (rank, child) in children.iter_mut().enumerate() {
            if self.status[rank].is_none()
                && let Some(s) = child.try_wait().with_context(|| format!("waiting for rank {rank}"))?
            {
                if !s.success() && self.failed_at.is_none() {
                    self.failed_at = Some(Instant::now());
                }
                self.status[rank] = Some(s);
            }
        }
        if self.failed_at.is_some_and(|t| t.elapsed() >= GRACE) {
            for (rank, child) in children.iter_mut().enumerate() {
                if self.status[rank].is_none() {
                    let _ = child.kill();
                    self.stopped.push(rank);
                    self.status[rank] = Some(child.wait().with_context(|| format!("stopping rank {rank}"))?);
                }
            }
        }
        Ok(self.status.iter().all(Option::is_some))
    }

    /// The ranks that failed or were stopped, with how.
    fn failures(&self) -> Vec<(usize, String)> {
        self.status
            .iter()
            .enumerate()
            .filter_map(|(rank, s)| {
                let s = (*s)?;
                if self.stopped.contains(&rank) {
                    Some((rank, "stopped after another rank failed".to_string()))
                } else if s.success() {
                    None
                } else {
                    Some((rank, s.to_string()))
                }
            })
            .collect()
    }
}

/// Stop every child already started (after a failed start).
fn stop(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nproc: usize, script: &str) -> LaunchArgs {
        LaunchArgs {
            nproc,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            command: vec!["sh".into(), "-c".into(), script.into()],
        }
    }

    fn captured(nproc: usize, script: &str) -> (Vec<(usize, String)>, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let failed = launch(&args(nproc, script), &mut out, &mut err).unwrap();
        (failed, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    }

    #[test]
    fn every_rank_gets_the_torchrun_variables_and_a_prefix() {
        let script =
            r#"echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR" ; echo "port $MASTER_PORT" >&2"#;
        let (failed, out, err) = captured(3, script);
        assert!(failed.is_empty(), "{failed:?}");
        for rank in 0..3 {
            assert!(
                out.contains(&format!("[rank {rank}] {rank} {rank} 3 3 127.0.0.1")),
                "{out}"
            );
            assert!(err.contains(&format!("[rank {rank}] port ")), "{err}");
        }
        let ports: std::collections::HashSet<&str> = err.lines().map(|l| l.rsplit(' ').next().unwrap()).collect();
        assert_eq!(ports.len(), 1, "one MASTER_PORT for all: {err}");
    }

    #[test]
    fn a_failing_rank_fails_the_launch_and_stops_the_others() {
        let started = Instant::now();
        let (failed, _, _) = captured(3, r#"if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30"#);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the others were not stopped"
        );
        assert_eq!(failed.len(), 3, "{failed:?}");
        assert!(failed[1].1.contains('3'), "{failed:?}");
        assert!(
            failed[0].1.contains("stopped") && failed[2].1.contains("stopped"),
            "{failed:?}"
        );
        let err = run(args(2, "exit $RANK")).unwrap_err().to_string();
        assert!(err.contains("1 of 2 ranks failed: rank 1"), "{err}");
    }
}
