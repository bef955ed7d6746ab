//! [`InProcessCollective`]: a [`Collective`] for **tests only** — the ranks are threads of one
//! process sharing a hub in memory. It is not a distributed engine: it cannot reach another
//! process or machine, it moves every operand through host memory, and it blocks the calling
//! thread until the collective is done.
//!
//! What it is for: checking code that uses collectives (data-parallel training, sharded
//! optimizers) on a machine without GPUs, with real semantics — real reductions (sum, average,
//! max for every dtype), broadcast, all-gather, reduce-scatter, ordered point-to-point messages
//! and barriers. Ranks match their collectives by order, as with NCCL; unlike NCCL it also
//! checks that the ranks agree (same collective, dtype and size) and reports a mismatch as an
//! error instead of hanging or corrupting memory. A rank that leaves the group (its member is
//! dropped) or does not arrive within the timeout makes the others fail with
//! [`Error::RanksMissing`].
//!
//! Float sums and averages are computed in f64 and rounded once; integer sums wrap, as NCCL's.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use cartage::distributed::{InProcessCollective, ProcessGroup, ReduceKind};
//! use cartage::{Device, Tensor};
//!
//! let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(10))?;
//! let threads: Vec<_> = members
//!     .into_iter()
//!     .map(|member| {
//!         std::thread::spawn(move || -> cartage::Result<Vec<f32>> {
//!             let group = ProcessGroup::new(Arc::new(member));
//!             let x = Tensor::full(&[3], group.rank() as f64 + 1.0, cartage::DType::F32, &Device::cpu())?;
//!             group.all_reduce(&x, ReduceKind::Sum)?.wait()?;
//!             x.to_vec::<f32>()
//!         })
//!     })
//!     .collect();
//! for t in threads {
//!     assert_eq!(t.join().unwrap()?, vec![3.0, 3.0, 3.0]); // 1 + 2 on both ranks
//! }
//! # Ok::<(), cartage::Error>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cartage_core::collective::{CallKind, CollectiveCall};
use cartage_core::{Collective, CollectiveHandle, DType, Device, Element, Error, ReduceKind, Result};
use half::{bf16, f16};

use super::env::MAX_WORLD_SIZE;

/// What every rank's call of one collective must agree on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Signature {
    op: &'static str,
    dtype: Option<DType>,
    numel: usize,
    /// The root of a broadcast, the reduction of an all-reduce or reduce-scatter.
    detail: String,
}

/// One collective, as the ranks arrive at it.
struct Round {
    signature: Signature,
    first: usize,
    inputs: Vec<Option<Vec<u8>>>,
    outputs: Option<Vec<Vec<u8>>>,
    failure: Option<String>,
    collected: usize,
}

/// A point-to-point message.
struct Message {
    dtype: DType,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct State {
    rounds: HashMap<u64, Round>,
    /// Messages by (sender, receiver), in order.
    mail: HashMap<(usize, usize), VecDeque<Message>>,
    departed: Vec<bool>,
}

/// The memory the ranks of one group share.
struct Hub {
    world_size: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One rank of an in-process group (for tests; see the module docs). Dropping it makes the
/// rank leave: the others' waits for it fail at once.
pub struct InProcessCollective {
    hub: Arc<Hub>,
    rank: usize,
    device: Device,
    next_round: AtomicU64,
}

impl std::fmt::Debug for InProcessCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessCollective")
            .field("rank", &self.rank)
            .field("world_size", &self.hub.world_size)
            .field("device", &self.device)
            .finish()
    }
}

impl InProcessCollective {
    /// The members of a new group of `world_size` ranks on `device`, rank 0 first: hand one to
    /// each thread. A rank waits at most `timeout` for the others. A `world_size` of 0 or above
    /// [`MAX_WORLD_SIZE`] is an [`Error::InvalidArgument`] (nothing is allocated for it).
    pub fn group(device: &Device, world_size: usize, timeout: Duration) -> Result<Vec<InProcessCollective>> {
        if world_size == 0 {
            return Err(Error::invalid(
                "InProcessCollective::group",
                "a group has at least one rank",
            ));
        }
        if world_size > MAX_WORLD_SIZE {
            return Err(Error::invalid(
                "InProcessCollective::group",
                format!(
                    "a group of {world_size} ranks is more than the {MAX_WORLD_SIZE} a group may hold (one thread \
                     each): check how the world size was computed"
                ),
            ));
        }
        let hub = Arc::new(Hub {
            world_size,
            timeout,
            state: Mutex::new(State {
                departed: vec![false; world_size],
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        Ok((0..world_size)
            .map(|rank| InProcessCollective {
                hub: Arc::clone(&hub),
                rank,
                device: *device,
                next_round: AtomicU64::new(0),
            })
            .collect())
    }

    /// Take part in the next collective: contribute `input`; the last rank to arrive runs
    /// `combine` over every rank's input (in rank order) to get every rank's output.
    fn round(
        &self,
        signature: Signature,
        input: Vec<u8>,
        combine: impl FnOnce(Vec<Vec<u8>>) -> Vec<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let (hub, rank, world_size) = (&*self.hub, self.rank, self.hub.world_size);
        let id = self.next_round.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut state = hub.lock();
        let round = state.rounds.entry(id).or_insert_with(|| Round {
            signature: signature.clone(),
            first: rank,
            inputs: vec![None; world_size],
            outputs: None,
            failure: None,
            collected: 0,
        });
        if round.signature != signature && round.failure.is_none() {
            round.failure = Some(format!(
                "collective #{id}: rank {rank} called {signature:?} while rank {} called {:?}; every rank must issue \
                 the same collectives in the same order, with the same dtype and size",
                round.first, round.signature
            ));
        }
        round.inputs[rank] = Some(input);
        if round.failure.is_none() && round.inputs.iter().all(Option::is_some) {
            let inputs = round.inputs.iter_mut().map(|i| i.take().unwrap_or_default()).collect();
            round.outputs = Some(combine(inputs));
        }
        hub.changed.notify_all();
        loop {
            let departed = state.departed.clone();
            let Some(round) = state.rounds.get_mut(&id) else {
                return Err(Error::invalid(signature.op, "the collective's round vanished"));
            };
            if let Some(failure) = &round.failure {
                return Err(Error::invalid(signature.op, failure.clone()));
            }
            if let Some(outputs) = &mut round.outputs {
                let out = std::mem::take(&mut outputs[rank]);
                round.collected += 1;
                if round.collected == world_size {
                    state.rounds.remove(&id);
                }
                return Ok(out);
            }
            let missing: Vec<usize> = (0..world_size).filter(|&r| round.inputs[r].is_none()).collect();
            let gone: Vec<usize> = missing.iter().copied().filter(|&r| departed[r]).collect();
            let waited = started.elapsed();
            if !gone.is_empty() || waited >= hub.timeout {
                return Err(self.missing(signature.op, if gone.is_empty() { missing } else { gone }, waited));
            }
            state = hub
                .changed
                .wait_timeout(state, hub.timeout - waited)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn send_bytes(&self, peer: usize, message: Message) -> Result<()> {
        let mut state = self.hub.lock();
        if state.departed[peer] {
            return Err(self.missing("send", vec![peer], Duration::ZERO));
        }
        state.mail.entry((self.rank, peer)).or_default().push_back(message);
        self.hub.changed.notify_all();
        Ok(())
    }

    fn recv_bytes(&self, peer: usize) -> Result<Message> {
        let started = Instant::now();
        let mut state = self.hub.lock();
        loop {
            if let Some(message) = state.mail.get_mut(&(peer, self.rank)).and_then(VecDeque::pop_front) {
                return Ok(message);
            }
            let waited = started.elapsed();
            if state.departed[peer] || waited >= self.hub.timeout {
                return Err(self.missing("recv", vec![peer], waited));
            }
            state = self
                .hub
                .changed
                .wait_timeout(state, self.hub.timeout - waited)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn missing(&self, op: &'static str, missing: Vec<usize>, waited: Duration) -> Error {
        Error::RanksMissing {
            op,
            rank: self.rank,
            world_size: self.hub.world_size,
            missing,
            waited,
        }
    }
}

impl Drop for InProcessCollective {
    fn drop(&mut self) {
        self.hub.lock().departed[self.rank] = true;
        self.hub.changed.notify_all();
    }
}

impl Collective for InProcessCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.hub.world_size
    }

    fn device(&self) -> Device {
        self.device
    }

    fn engine(&self) -> &'static str {
        "in-process (tests only)"
    }

    /// Runs the call to completion before returning (the handle is already complete).
    fn run(&self, call: &CollectiveCall<'_>) -> Result<CollectiveHandle> {
        let op = call.name();
        let world_size = self.hub.world_size;
        let signature = |dtype: Option<DType>, numel: usize, detail: String| Signature {
            op,
            dtype,
            numel,
            detail,
        };
        match call.kind() {
            CallKind::AllReduce { buf, op: reduce } => {
                let sig = signature(Some(buf.dtype()), buf.numel(), reduce.name().into());
                let (dtype, reduce) = (buf.dtype(), *reduce);
                let out = self.round(sig, buf.read_to_host()?, |inputs| {
                    vec![reduce_bytes(dtype, reduce, &inputs); world_size]
                })?;
                buf.write_from_host(&out)?;
            }
            CallKind::Broadcast { buf, root } => {
                let sig = signature(Some(buf.dtype()), buf.numel(), format!("root {root}"));
                let input = if self.rank == *root {
                    buf.read_to_host()?
                } else {
                    Vec::new()
                };
                let root = *root;
                let out = self.round(sig, input, |mut inputs| {
                    vec![std::mem::take(&mut inputs[root]); world_size]
                })?;
                if self.rank != root {
                    buf.write_from_host(&out)?;
                }
            }
            CallKind::AllGather { input, output } => {
                let sig = signature(Some(input.dtype()), input.numel(), String::new());
                let out = self.round(sig, input.read_to_host()?, |inputs| vec![inputs.concat(); world_size])?;
                output.write_from_host(&out)?;
            }
            CallKind::ReduceScatter {
                input,
                output,
                op: reduce,
            } => {
                let sig = signature(Some(input.dtype()), input.numel(), reduce.name().into());
                let (dtype, reduce) = (input.dtype(), *reduce);
                let out = self.round(sig, input.read_to_host()?, |inputs| {
                    let reduced = reduce_bytes(dtype, reduce, &inputs);
                    let chunk = reduced.len() / world_size;
                    (0..world_size)
                        .map(|r| reduced[r * chunk..(r + 1) * chunk].to_vec())
                        .collect()
                })?;
                output.write_from_host(&out)?;
            }
            CallKind::Send { buf, peer } => {
                let bytes = buf.read_to_host()?;
                self.send_bytes(
                    *peer,
                    Message {
                        dtype: buf.dtype(),
                        bytes,
                    },
                )?;
            }
            CallKind::Recv { buf, peer } => {
                let message = self.recv_bytes(*peer)?;
                if message.dtype != buf.dtype() || message.bytes.len() != buf.bytes().len() {
                    return Err(Error::invalid(
                        "recv",
                        format!(
                            "rank {peer} sent {} bytes of {} but rank {} receives into {} elements of {} ({} bytes); \
                             send and receive one shape and dtype",
                            message.bytes.len(),
                            message.dtype,
                            self.rank,
                            buf.numel(),
                            buf.dtype(),
                            buf.bytes().len()
                        ),
                    ));
                }
                buf.write_from_host(&message.bytes)?;
            }
            CallKind::Barrier => {
                self.round(signature(None, 0, String::new()), Vec::new(), |_| {
                    vec![Vec::new(); world_size]
                })?;
            }
        }
        Ok(CollectiveHandle::completed(op))
    }
}

/// The element-wise reduction of every rank's bytes (all of one dtype and length).
fn reduce_bytes(dtype: DType, op: ReduceKind, inputs: &[Vec<u8>]) -> Vec<u8> {
    match dtype {
        DType::F32 => reduce_floats::<f32>(op, inputs),
        DType::F64 => reduce_floats::<f64>(op, inputs),
        DType::F16 => reduce_floats::<f16>(op, inputs),
        DType::BF16 => reduce_floats::<bf16>(op, inputs),
        DType::I32 => reduce_ints::<i32>(op, inputs),
        DType::I64 => reduce_ints::<i64>(op, inputs),
        DType::U8 => reduce_ints::<u8>(op, inputs),
        // Core refuses sum and average of booleans: max is any.
        DType::Bool => columns::<bool>(inputs, |column| column.iter().any(|&b| b)),
    }
}

/// Apply `f` to each element position's values across ranks.
fn columns<T: Element>(inputs: &[Vec<u8>], f: impl Fn(&[T]) -> T) -> Vec<u8> {
    let decoded: Vec<Vec<T>> = inputs.iter().map(|bytes| T::from_le_bytes_slice(bytes)).collect();
    let len = decoded.first().map_or(0, Vec::len);
    let mut column = Vec::with_capacity(decoded.len());
    let out: Vec<T> = (0..len)
        .map(|i| {
            column.clear();
            column.extend(decoded.iter().map(|values| values[i]));
            f(&column)
        })
        .collect();
    T::to_le_bytes_vec(&out).into_owned()
}

fn reduce_floats<T: Element>(op: ReduceKind, inputs: &[Vec<u8>]) -> Vec<u8> {
    let ranks = inputs.len() as f64;
    columns::<T>(inputs, |column| {
        let values = column.iter().map(|v| v.to_f64());
        T::from_f64(match op {
            ReduceKind::Sum => values.sum(),
            ReduceKind::Avg => values.sum::<f64>() / ranks,
            ReduceKind::Max => values.fold(f64::NEG_INFINITY, |a, b| {
                if a.is_nan() || b.is_nan() { f64::NAN } else { a.max(b) }
            }),
        })
    })
}

/// Integers that sum with wrap-around, as NCCL's do.
trait WrappingInt: Element + Ord {
    const ZERO: Self;
    fn wrapping_sum(self, other: Self) -> Self;
}

macro_rules! wrapping_int {
    ($($t:ty),*) => {$(
        impl WrappingInt for $t {
            const ZERO: Self = 0;
            fn wrapping_sum(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
        }
    )*};
}

wrapping_int!(i32, i64, u8);

fn reduce_ints<T: WrappingInt>(op: ReduceKind, inputs: &[Vec<u8>]) -> Vec<u8> {
    columns::<T>(inputs, |column| match op {
        // Core refuses an average of integers.
        ReduceKind::Sum | ReduceKind::Avg => column.iter().fold(T::ZERO, |a, &b| a.wrapping_sum(b)),
        ReduceKind::Max => column.iter().copied().max().unwrap_or(T::ZERO),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Element>(values: &[T]) -> Vec<u8> {
        T::to_le_bytes_vec(values).into_owned()
    }

    #[test]
    fn reductions_follow_their_dtype() {
        let f = [bytes(&[1.5f32, -2.0]), bytes(&[2.5f32, 7.0])];
        assert_eq!(reduce_bytes(DType::F32, ReduceKind::Sum, &f), bytes(&[4.0f32, 5.0]));
        assert_eq!(reduce_bytes(DType::F32, ReduceKind::Avg, &f), bytes(&[2.0f32, 2.5]));
        assert_eq!(reduce_bytes(DType::F32, ReduceKind::Max, &f), bytes(&[2.5f32, 7.0]));
        let nan = [bytes(&[f64::NAN]), bytes(&[1.0f64])];
        assert!(f64::from_le_bytes_slice(&reduce_bytes(DType::F64, ReduceKind::Max, &nan))[0].is_nan());
        let u = [bytes(&[250u8, 3]), bytes(&[10u8, 4])];
        assert_eq!(reduce_bytes(DType::U8, ReduceKind::Sum, &u), bytes(&[4u8, 7])); // wraps
        assert_eq!(reduce_bytes(DType::U8, ReduceKind::Max, &u), bytes(&[250u8, 4]));
        let b = [bytes(&[false, true, false]), bytes(&[false, false, true])];
        assert_eq!(
            reduce_bytes(DType::Bool, ReduceKind::Max, &b),
            bytes(&[false, true, true])
        );
        let h = [
            bytes(&[bf16::from_f32(1.0)]),
            bytes(&[bf16::from_f32(2.0)]),
            bytes(&[bf16::from_f32(4.5)]),
        ];
        assert_eq!(
            reduce_bytes(DType::BF16, ReduceKind::Avg, &h),
            bytes(&[bf16::from_f32(2.5)])
        );
    }
}
