//! [`Rendezvous`]: a small TCP meeting point on `MASTER_ADDR:MASTER_PORT` where every rank
//! arrives, rank 0 hands out an opaque id (the NCCL unique id, 128 bytes), and nobody leaves
//! before everyone has arrived (a barrier).
//!
//! Rank 0 listens; every other rank connects (retrying while rank 0 is not up yet) and says who
//! it is. When all `WORLD_SIZE - 1` peers have arrived, rank 0 sends each the id. When the
//! timeout passes first, rank 0 fails with [`Error::RanksMissing`] naming the ranks that never
//! arrived, and tells the connected peers, which fail with the same list. A peer that cannot
//! reach rank 0 fails naming rank 0; a peer whose rank 0 disappears fails naming rank 0 too.
//! Nobody hangs: rank 0 gives up at the timeout, a peer at the timeout plus a short grace for
//! rank 0's verdict to arrive. Every accept and every read is bounded by the time left to that
//! overall deadline (never by a fixed per-connection timeout), so connections that arrive and
//! stay silent, or dribble bytes, cannot stretch it. Rank 0 reads the hellos of every pending
//! connection without blocking, so a silent one (a port scanner) keeps no rank out either. A timeout too large to add to the clock
//! (`Duration::MAX`) means no deadline.
//!
//! A world size above [`MAX_WORLD_SIZE`] or a rank outside the group is refused with
//! [`Error::InvalidArgument`] before anything is allocated per rank.
//!
//! The wire format is private to cartage (a magic, a version, fixed little-endian fields); all
//! ranks must run the same cartage.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use cartage_core::{Error, Result};

use super::env::{DistEnv, MAX_WORLD_SIZE};

const MAGIC: [u8; 4] = *b"CTRV";
const VERSION: u32 = 1;
const OK: u8 = 0;
const MISSING: u8 = 1;
const REFUSED: u8 = 2;
/// The largest id rank 0 may hand out.
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// How long a peer waits past its timeout for rank 0's verdict.
const GRACE: Duration = Duration::from_secs(2);
/// How long rank 0 waits for a connected peer to say who it is.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How many connections rank 0 keeps waiting for a hello at once (the oldest goes first).
const MAX_PENDING: usize = 1024;
const POLL: Duration = Duration::from_millis(10);

/// A rendezvous for one rank; see the module docs.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    addr: String,
    port: u16,
    rank: usize,
    world_size: usize,
    timeout: Duration,
}

impl Rendezvous {
    /// The default timeout: how long rank 0 waits for every rank to arrive.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

    /// The rendezvous of `env`'s rank, giving up after `timeout` (`Duration::MAX`, or any
    /// timeout past the clock's range: never). `env` is checked when [`Rendezvous::exchange`]
    /// runs.
    pub fn new(env: &DistEnv, timeout: Duration) -> Rendezvous {
        Rendezvous {
            addr: env.master_addr.clone(),
            port: env.master_port,
            rank: env.rank,
            world_size: env.world_size,
            timeout,
        }
    }

    /// Meet every other rank. Rank 0 gives `payload` (at most [`MAX_PAYLOAD`] bytes); every rank
    /// returns it once all ranks have arrived. Other ranks' `payload` is ignored. A group of one
    /// returns at once. A world size of 0 or above [`MAX_WORLD_SIZE`], or a rank outside the
    /// group, is an [`Error::InvalidArgument`].
    pub fn exchange(&self, payload: &[u8]) -> Result<Vec<u8>> {
        self.check_group()?;
        if self.world_size <= 1 {
            return Ok(payload.to_vec());
        }
        let started = Instant::now();
        let deadline = deadline_after(started, self.timeout);
        let outcome = if self.rank == 0 {
            if payload.len() > MAX_PAYLOAD {
                return Err(Error::invalid(
                    "rendezvous",
                    format!("an id of {} bytes is larger than {MAX_PAYLOAD}", payload.len()),
                ));
            }
            self.host(payload, deadline)
        } else {
            self.join(deadline)
        };
        outcome.map_err(|failure| self.error(failure, started.elapsed()))
    }

    /// Refuse a group no rendezvous can hold (its fields are public, so a `DistEnv` may come from
    /// anywhere, not only [`DistEnv::from_env`]'s checks).
    fn check_group(&self) -> Result<()> {
        let reason = if self.world_size == 0 || self.world_size > MAX_WORLD_SIZE {
            format!(
                "a world size of {} is not valid: a group has 1 to {MAX_WORLD_SIZE} processes. Check WORLD_SIZE",
                self.world_size
            )
        } else if self.rank >= self.world_size {
            format!(
                "rank {} is not in a group of {} (ranks 0..{}). Check RANK and WORLD_SIZE",
                self.rank, self.world_size, self.world_size
            )
        } else {
            return Ok(());
        };
        Err(Error::invalid("rendezvous", reason))
    }

    /// Rank 0: accept every peer, then hand out `payload`.
    fn host(&self, payload: &[u8], deadline: Instant) -> std::result::Result<Vec<u8>, Failure> {
        let listener = TcpListener::bind((self.addr.as_str(), self.port)).map_err(|e| {
            Failure::Refused(format!(
                "rank 0 cannot listen on {}:{}: {e}. Is MASTER_ADDR an address of this host, and is MASTER_PORT free \
                 (another run still using it)?",
                self.addr, self.port
            ))
        })?;
        listener.set_nonblocking(true).map_err(io("listen"))?;
        tracing::debug!(addr = %self.addr, port = self.port, world_size = self.world_size, "rendezvous: rank 0 listening");
        let mut peers: Vec<Option<TcpStream>> = (0..self.world_size).map(|_| None).collect();
        // Connections whose hello is still arriving, read without blocking, so a silent one
        // (a port scanner, a stray client) delays nobody.
        let mut pending: Vec<Pending> = Vec::new();
        while peers[1..].iter().any(Option::is_none) {
            // Checked on every round: connections that keep arriving cannot stretch it.
            if Instant::now() >= deadline {
                let missing = (1..self.world_size).filter(|&r| peers[r].is_none()).collect();
                let failure = Failure::Missing(missing);
                broadcast_verdict(&mut peers, &failure);
                return Err(failure);
            }
            let mut progress = false;
            loop {
                match listener.accept() {
                    Ok((stream, from)) => {
                        progress = true;
                        if stream.set_nonblocking(true).is_err() {
                            continue;
                        }
                        if pending.len() >= MAX_PENDING {
                            let oldest = pending.remove(0);
                            tracing::warn!(from = %oldest.from, "rendezvous: too many connections without a hello; the oldest was dropped");
                        }
                        pending.push(Pending {
                            stream,
                            from,
                            hello: [0; 16],
                            filled: 0,
                            since: Instant::now(),
                        });
                    }
                    Err(e) if e.kind() == IoKind::WouldBlock || e.kind() == IoKind::Interrupted => break,
                    Err(e) => return Err(io("accept")(e)),
                }
            }
            let mut i = 0;
            while i < pending.len() {
                let p = &mut pending[i];
                match p.stream.read(&mut p.hello[p.filled..]) {
                    Ok(0) => {
                        tracing::warn!(from = %p.from, "rendezvous: a connection closed before its hello was dropped");
                        pending.swap_remove(i);
                        continue;
                    }
                    Ok(n) => {
                        progress = true;
                        p.filled += n;
                        if p.filled == p.hello.len() {
                            let p = pending.swap_remove(i);
                            if let Err(failure) = self.admit(p.stream, p.from, p.hello, &mut peers) {
                                broadcast_verdict(&mut peers, &failure);
                                return Err(failure);
                            }
                            continue;
                        }
                    }
                    Err(e) if e.kind() == IoKind::WouldBlock || e.kind() == IoKind::Interrupted => {
                        if p.since.elapsed() >= HELLO_TIMEOUT {
                            tracing::warn!(from = %p.from, "rendezvous: a connection that sent no hello was dropped");
                            pending.swap_remove(i);
                            continue;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(from = %p.from, error = %e, "rendezvous: a connection failed before its hello");
                        pending.swap_remove(i);
                        continue;
                    }
                }
                i += 1;
            }
            if !progress {
                std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
            }
        }
        let mut reply = frame(OK);
        reply.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        reply.extend_from_slice(payload);
        for (rank, peer) in peers.iter_mut().enumerate().skip(1) {
            if let Some(stream) = peer
                && let Err(e) = stream.write_all(&reply)
            {
                tracing::warn!(rank, error = %e, "rendezvous: a rank left before receiving the id");
                return Err(Failure::Missing(vec![rank]));
            }
        }
        tracing::debug!(world_size = self.world_size, "rendezvous: every rank arrived");
        Ok(payload.to_vec())
    }

    /// Rank 0: check a connected peer's `hello` and keep its stream. A stranger (not a cartage
    /// rank) is dropped; a rank that contradicts the group fails the rendezvous.
    fn admit(
        &self,
        mut stream: TcpStream,
        from: SocketAddr,
        hello: [u8; 16],
        peers: &mut [Option<TcpStream>],
    ) -> std::result::Result<(), Failure> {
        // Blocking again for the replies, each write bounded: a peer that stops reading cannot
        // hold rank 0.
        if stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_write_timeout(Some(GRACE)))
            .is_err()
        {
            tracing::warn!(%from, "rendezvous: a connection that could not be configured was dropped");
            return Ok(());
        }
        if hello[..4] != MAGIC {
            tracing::warn!(%from, "rendezvous: a connection that is not a cartage rank was dropped");
            return Ok(());
        }
        let field = |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]) as usize;
        let (version, rank, world_size) = (field(4), field(8), field(12));
        let problem = if version != VERSION as usize {
            Some(format!(
                "a rank from {from} speaks rendezvous version {version}, rank 0 speaks {VERSION}: run one build of the program on every rank"
            ))
        } else if world_size != self.world_size {
            Some(format!(
                "rank {rank} (from {from}) was started with WORLD_SIZE={world_size}, rank 0 with {}: give every rank the same WORLD_SIZE",
                self.world_size
            ))
        } else if rank == 0 || rank >= self.world_size {
            Some(format!(
                "a rank from {from} says it is rank {rank}, which is not a peer rank of a group of {} (1..{})",
                self.world_size, self.world_size
            ))
        } else if peers[rank].is_some() {
            Some(format!(
                "two processes say they are rank {rank}: give every process its own RANK"
            ))
        } else {
            None
        };
        if let Some(reason) = problem {
            let failure = Failure::Refused(reason);
            // The offender hears it too; its write error does not matter.
            let _ = stream.write_all(&verdict(&failure));
            return Err(failure);
        }
        tracing::debug!(rank, %from, "rendezvous: rank arrived");
        peers[rank] = Some(stream);
        Ok(())
    }

    /// A peer: reach rank 0, say who we are, wait for the id.
    fn join(&self, deadline: Instant) -> std::result::Result<Vec<u8>, Failure> {
        let mut stream = self.connect(deadline)?;
        let mut hello = MAGIC.to_vec();
        for field in [VERSION, self.rank as u32, self.world_size as u32] {
            hello.extend_from_slice(&field.to_le_bytes());
        }
        stream.write_all(&hello).map_err(|_| Failure::Missing(vec![0]))?;
        // Rank 0's verdict comes by the deadline plus a grace; every read is bounded by that.
        let by = deadline.checked_add(GRACE).unwrap_or(deadline);
        let lost = |e: std::io::Error| match e.kind() {
            IoKind::WouldBlock | IoKind::TimedOut => Failure::Missing(Vec::new()),
            _ => Failure::Missing(vec![0]),
        };
        let head = read_array_by::<5>(&mut stream, by).map_err(lost)?;
        if head[..4] != MAGIC {
            return Err(Failure::Refused(format!(
                "{}:{} answered, but it is not a cartage rank 0: check MASTER_ADDR and MASTER_PORT",
                self.addr, self.port
            )));
        }
        let len = u32::from_le_bytes(read_array_by::<4>(&mut stream, by).map_err(lost)?) as usize;
        match head[4] {
            OK if len <= MAX_PAYLOAD => {
                let mut payload = vec![0u8; len];
                read_exact_by(&mut stream, &mut payload, by).map_err(lost)?;
                Ok(payload)
            }
            MISSING if len <= self.world_size => {
                let mut missing = Vec::with_capacity(len);
                for _ in 0..len {
                    missing.push(u32::from_le_bytes(read_array_by::<4>(&mut stream, by).map_err(lost)?) as usize);
                }
                Err(Failure::Missing(missing))
            }
            REFUSED if len <= MAX_PAYLOAD => {
                let mut reason = vec![0u8; len];
                read_exact_by(&mut stream, &mut reason, by).map_err(lost)?;
                Err(Failure::Refused(format!(
                    "rank 0 refused the rendezvous: {}",
                    String::from_utf8_lossy(&reason)
                )))
            }
            _ => Err(Failure::Refused("rank 0 sent a malformed reply".into())),
        }
    }

    /// Connect to rank 0, retrying until `deadline` (rank 0 may start later).
    fn connect(&self, deadline: Instant) -> std::result::Result<TcpStream, Failure> {
        let mut last = String::from("no attempt");
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                tracing::debug!(reason = %last, "rendezvous: rank 0 never answered");
                return Err(Failure::Missing(vec![0]));
            }
            let attempt = remaining.min(Duration::from_secs(1));
            match (self.addr.as_str(), self.port).to_socket_addrs() {
                Ok(addrs) => {
                    for addr in addrs {
                        match TcpStream::connect_timeout(&addr, attempt) {
                            Ok(stream) => return Ok(stream),
                            Err(e) => last = format!("{addr}: {e}"),
                        }
                    }
                }
                Err(e) => last = format!("MASTER_ADDR `{}` does not resolve: {e}", self.addr),
            }
            std::thread::sleep(Duration::from_millis(50).min(remaining));
        }
    }

    fn error(&self, failure: Failure, waited: Duration) -> Error {
        match failure {
            Failure::Missing(missing) => Error::RanksMissing {
                op: "rendezvous",
                rank: self.rank,
                world_size: self.world_size,
                missing,
                waited,
            },
            Failure::Refused(reason) => Error::invalid("rendezvous", reason),
        }
    }
}

/// A connection rank 0 accepted whose 16-byte hello is still arriving.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    hello: [u8; 16],
    filled: usize,
    since: Instant,
}

/// Why a rendezvous failed, before it becomes an [`Error`].
enum Failure {
    /// These ranks never arrived (empty: unknown).
    Missing(Vec<usize>),
    /// The group is misconfigured (or rank 0 cannot listen).
    Refused(String),
}

fn frame(status: u8) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.push(status);
    bytes
}

/// The reply that tells a peer why the rendezvous failed.
fn verdict(failure: &Failure) -> Vec<u8> {
    match failure {
        Failure::Missing(missing) => {
            let mut bytes = frame(MISSING);
            bytes.extend_from_slice(&(missing.len() as u32).to_le_bytes());
            for &rank in missing {
                bytes.extend_from_slice(&(rank as u32).to_le_bytes());
            }
            bytes
        }
        Failure::Refused(reason) => {
            let text = &reason.as_bytes()[..reason.len().min(MAX_PAYLOAD)];
            let mut bytes = frame(REFUSED);
            bytes.extend_from_slice(&(text.len() as u32).to_le_bytes());
            bytes.extend_from_slice(text);
            bytes
        }
    }
}

/// Tell every connected peer why the rendezvous failed (best effort: a peer may be gone).
fn broadcast_verdict(peers: &mut [Option<TcpStream>], failure: &Failure) {
    let bytes = verdict(failure);
    for stream in peers.iter_mut().flatten() {
        let _ = stream.write_all(&bytes);
    }
}

/// `start + timeout`, or the latest instant the clock can add to `start` when that overflows
/// (`Duration::MAX`: in effect no deadline).
fn deadline_after(start: Instant, timeout: Duration) -> Instant {
    let mut timeout = timeout;
    loop {
        if let Some(deadline) = start.checked_add(timeout) {
            return deadline;
        }
        timeout /= 2;
    }
}

fn read_array_by<const N: usize>(stream: &mut TcpStream, by: Instant) -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    read_exact_by(stream, &mut bytes, by)?;
    Ok(bytes)
}

/// `read_exact` that gives up at `by` ([`IoKind::TimedOut`]) however the bytes trickle in: each
/// read waits at most the time left to `by`.
fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], by: Instant) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(IoKind::TimedOut, "the rendezvous deadline passed"));
        }
        // A zero read timeout would mean "block forever": `left` is at least a nanosecond here.
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(IoKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut | IoKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> Failure {
    move |e| Failure::Refused(format!("rendezvous could not {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A port free right now on the loopback interface.
    fn free_port() -> u16 {
        TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn env(rank: usize, world_size: usize, port: u16) -> DistEnv {
        DistEnv {
            rank,
            world_size,
            local_rank: Some(rank),
            master_addr: "127.0.0.1".into(),
            master_port: port,
        }
    }

    /// Run `ranks` of a group of `world_size` on threads, each with its own payload.
    fn run(ranks: &[usize], world_size: usize, timeout: Duration) -> Vec<(usize, Result<Vec<u8>>, Duration)> {
        let port = free_port();
        let (tx, rx) = mpsc::channel();
        for &rank in ranks {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                let payload = [rank as u8; 128];
                let out = Rendezvous::new(&env(rank, world_size, port), timeout).exchange(&payload);
                tx.send((rank, out, start.elapsed())).unwrap();
            });
        }
        drop(tx);
        let mut results: Vec<_> = rx.iter().collect();
        results.sort_by_key(|(rank, _, _)| *rank);
        results
    }

    #[test]
    fn every_rank_receives_rank_zeros_id() {
        for world_size in [2, 4] {
            let ranks: Vec<usize> = (0..world_size).rev().collect(); // peers may start first
            for (rank, out, _) in run(&ranks, world_size, Duration::from_secs(20)) {
                assert_eq!(out.unwrap(), vec![0u8; 128], "rank {rank} of {world_size}");
            }
        }
    }

    #[test]
    fn a_group_of_one_needs_no_network() {
        let out = Rendezvous::new(&env(0, 1, 1), Duration::from_millis(1)).exchange(b"id");
        assert_eq!(out.unwrap(), b"id");
    }

    /// Rank 2 of 3 never starts: rank 0 and rank 1 fail within the timeout (plus a grace for
    /// the peer), naming rank 2.
    #[test]
    fn a_rank_that_never_arrives_is_named_within_the_timeout() {
        let timeout = Duration::from_millis(600);
        for (rank, out, took) in run(&[0, 1], 3, timeout) {
            let err = out.unwrap_err();
            match &err {
                Error::RanksMissing { missing, rank: r, .. } => {
                    assert_eq!(missing, &vec![2], "{err}");
                    assert_eq!(*r, rank);
                }
                other => panic!("rank {rank}: expected RanksMissing, got {other}"),
            }
            assert!(err.to_string().contains("rank 2 did not take part"), "{err}");
            assert!(
                took >= timeout && took < timeout + GRACE + Duration::from_secs(2),
                "{took:?}"
            );
        }
    }

    /// Rank 0 never starts: the peer fails naming rank 0.
    #[test]
    fn a_missing_rank_zero_is_named_by_the_peers() {
        let timeout = Duration::from_millis(300);
        let (rank, out, took) = run(&[1], 2, timeout).remove(0);
        assert_eq!(rank, 1);
        match out.unwrap_err() {
            Error::RanksMissing { missing, .. } => assert_eq!(missing, vec![0]),
            other => panic!("expected RanksMissing, got {other}"),
        }
        assert!(took >= timeout && took < timeout + Duration::from_secs(3), "{took:?}");
    }

    /// A rank started with another WORLD_SIZE is refused, and both sides say why.
    #[test]
    fn a_rank_with_another_world_size_is_refused() {
        let port = free_port();
        let timeout = Duration::from_secs(10);
        let host = std::thread::spawn(move || Rendezvous::new(&env(0, 2, port), timeout).exchange(b"id"));
        let peer = Rendezvous::new(&env(1, 3, port), timeout).exchange(b"");
        let host = host.join().unwrap();
        for err in [host.unwrap_err(), peer.unwrap_err()] {
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
            assert!(err.to_string().contains("WORLD_SIZE=3"), "{err}");
        }
    }
}
