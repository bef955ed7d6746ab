//! [`Collective`]: communication among the ranks of a distributed group (all-reduce, broadcast,
//! all-gather, reduce-scatter, send/recv, barrier) over device buffers, and
//! [`CollectiveEngine`], which opens a group across processes.
//!
//! Core knows no communication library. An engine lives beside its backend: NCCL in
//! `cartage-cuda` (feature `nccl`), a test-only in-process engine in the frontend. The rules
//! every engine follows are written here once, as [`Kernel::validate`](crate::Kernel::validate)
//! is for kernels:
//!
//! - an operand is a [`CollectiveArg`]: a contiguous [`TensorArg`] lying inside a borrowed
//!   [`DeviceBuffer`], so a collective, like [`Kernel::run`](crate::Kernel::run), reaches only
//!   memory the caller holds;
//! - the provided methods of [`Collective`] check the call ([`CollectiveCall`]: device, dtype,
//!   sizes, root and peer ranks, no overlap between input and output) and only then hand it to
//!   the engine's [`Collective::run`]. A `CollectiveCall` cannot be built unchecked;
//! - each call returns a [`CollectiveHandle`] (the pattern of [`CopyHandle`](crate::CopyHandle)):
//!   the work may still be running on the device (on a stream of its own, for NCCL) when the
//!   call returns, ordered before every later kernel or copy that uses its operands' memory;
//!   `wait()` blocks the host until it has finished.
//!
//! Every rank of a group must issue the same collectives in the same order with matching sizes
//! (as with NCCL and MPI). A rank that never takes part makes the others fail with
//! [`Error::RanksMissing`] once their engine's timeout has passed, not hang.
//!
//! ```
//! use cartage_core::collective::ReduceKind;
//! use cartage_core::DType;
//! assert!(ReduceKind::Avg.accepts(DType::BF16));
//! assert!(!ReduceKind::Avg.accepts(DType::I32)); // an average of integers is refused
//! assert!(ReduceKind::Max.accepts(DType::Bool)); // max of booleans: any
//! ```

use std::fmt;
use std::sync::Arc;

use crate::allocator::BufferSlice;
use crate::backend::Backend;
use crate::buffer::DeviceBuffer;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::TensorArg;
use crate::pinned::CopyCompletion;

/// How an all-reduce or reduce-scatter combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// The sum (integers wrap, as NCCL's do). Not for booleans.
    Sum,
    /// The mean over the ranks. Float dtypes only.
    Avg,
    /// The maximum (for booleans: any).
    Max,
}

impl ReduceKind {
    /// Every reduction.
    pub const ALL: [ReduceKind; 3] = [ReduceKind::Sum, ReduceKind::Avg, ReduceKind::Max];

    /// `sum`, `avg` or `max`.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "sum",
            ReduceKind::Avg => "avg",
            ReduceKind::Max => "max",
        }
    }

    /// True when this reduction is defined for `dtype`.
    pub const fn accepts(self, dtype: DType) -> bool {
        match self {
            ReduceKind::Sum => !matches!(dtype, DType::Bool),
            ReduceKind::Avg => dtype.is_float(),
            ReduceKind::Max => true,
        }
    }

    /// What the reduction expects, for [`Error::WrongDType`].
    const fn expects(self) -> &'static str {
        match self {
            ReduceKind::Sum => "a sum of booleans is not defined; use `max` (any) or cast to an integer dtype first",
            ReduceKind::Avg => "an average needs a float dtype; sum integers and divide, or cast to a float first",
            ReduceKind::Max => "any dtype",
        }
    }
}

impl fmt::Display for ReduceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One operand of a collective: a contiguous [`TensorArg`] inside a borrowed [`DeviceBuffer`].
/// The borrow keeps the memory alive for the call; engines on asynchronous devices rely on the
/// buffer being freed only in stream order afterwards, as kernels do.
#[derive(Clone, Debug)]
pub struct CollectiveArg<'a> {
    buffer: &'a DeviceBuffer,
    arg: TensorArg,
    /// Exactly the bytes of the elements.
    bytes: BufferSlice,
}

impl<'a> CollectiveArg<'a> {
    /// `arg` as a collective operand, checked: it must lie inside `buffer` and be contiguous,
    /// with all its elements inside its slice.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use cartage_core::{Backend, DType, DeviceBuffer, Layout};
    /// use cartage_core::collective::CollectiveArg;
    /// # fn demo(backend: Arc<dyn Backend>) -> cartage_core::Result<()> {
    /// let buffer = DeviceBuffer::new(&backend, 4 * 6)?;
    /// let whole = CollectiveArg::new(&buffer, buffer.arg(Layout::contiguous(&[2, 3])?, DType::F32))?;
    /// assert_eq!(whole.numel(), 6);
    /// let transposed = buffer.arg(Layout::contiguous(&[2, 3])?.transpose(0, 1)?, DType::F32);
    /// assert!(CollectiveArg::new(&buffer, transposed).is_err()); // not contiguous
    /// # Ok(()) }
    /// ```
    pub fn new(buffer: &'a DeviceBuffer, arg: TensorArg) -> Result<Self> {
        if !buffer.slice().contains(&arg.buffer) {
            return Err(Error::invalid(
                "collective",
                "the operand does not lie inside the buffer given with it; pass the buffer the operand was made from",
            ));
        }
        if !arg.layout.is_contiguous() {
            return Err(Error::invalid(
                "collective",
                format!(
                    "a collective needs a contiguous operand, but this one has shape {:?} and strides {:?}; \
                     call `.contiguous()` first (and copy the result back if the collective writes it)",
                    arg.layout.shape(),
                    arg.layout.strides()
                ),
            ));
        }
        let size = arg.dtype.size_in_bytes();
        let numel = arg.layout.numel();
        let range = arg
            .layout
            .offset()
            .checked_mul(size)
            .and_then(|start| Some((start, numel.checked_mul(size)?)));
        let bytes = match range {
            Some((start, len)) => arg.buffer.slice(start, len)?,
            None => return Err(Error::size_overflow(arg.layout.shape(), arg.dtype)),
        };
        Ok(CollectiveArg { buffer, arg, bytes })
    }

    /// The buffer the operand lies in.
    pub fn buffer(&self) -> &'a DeviceBuffer {
        self.buffer
    }

    /// The operand as a kernel argument.
    pub fn arg(&self) -> &TensorArg {
        &self.arg
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        self.arg.dtype
    }

    /// Its number of elements.
    pub fn numel(&self) -> usize {
        self.arg.layout.numel()
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        self.arg.layout.shape()
    }

    /// Exactly the bytes of its elements.
    pub fn bytes(&self) -> BufferSlice {
        self.bytes
    }

    /// The device of its memory.
    pub fn device(&self) -> Device {
        self.buffer.device()
    }

    /// The backend that owns its memory.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.buffer.backend()
    }

    /// The byte offset of its elements inside [`CollectiveArg::buffer`].
    fn offset_in_buffer(&self) -> usize {
        self.bytes.offset() - self.buffer.slice().offset()
    }

    /// Its elements' bytes, read to the host (a synchronisation; for host-staged engines).
    pub fn read_to_host(&self) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.bytes.len()];
        self.buffer.read(self.offset_in_buffer(), &mut bytes)?;
        Ok(bytes)
    }

    /// Overwrite its elements with `bytes` (exactly its byte length; for host-staged engines).
    pub fn write_from_host(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.bytes.len() {
            return Err(Error::invalid(
                "collective",
                format!(
                    "{} bytes given for an operand of {} bytes ({} × {})",
                    bytes.len(),
                    self.bytes.len(),
                    self.numel(),
                    self.dtype()
                ),
            ));
        }
        self.buffer.write(self.offset_in_buffer(), bytes)
    }

    /// True when the two operands share a byte.
    fn overlaps(&self, other: &CollectiveArg<'_>) -> bool {
        let (a, b) = (self.bytes, other.bytes);
        a.same_segment(&b)
            && !a.is_empty()
            && !b.is_empty()
            && a.offset() < b.offset() + b.len()
            && b.offset() < a.offset() + a.len()
    }
}

/// What a [`CollectiveCall`] asks for. Engines match on it in [`Collective::run`].
#[derive(Clone, Debug)]
pub enum CallKind<'a> {
    /// Every rank's `buf` becomes the reduction of all ranks' `buf`, in place.
    AllReduce {
        /// Input and output.
        buf: CollectiveArg<'a>,
        /// How values combine.
        op: ReduceKind,
    },
    /// Every rank's `buf` becomes rank `root`'s `buf`.
    Broadcast {
        /// Source on `root`, destination elsewhere.
        buf: CollectiveArg<'a>,
        /// The rank whose values are sent.
        root: usize,
    },
    /// `output` (world size × `input` elements) becomes every rank's `input`, in rank order.
    AllGather {
        /// This rank's contribution.
        input: CollectiveArg<'a>,
        /// The concatenation of all contributions.
        output: CollectiveArg<'a>,
    },
    /// `input` (world size × `output` elements) is reduced across ranks; rank `r` keeps chunk `r`.
    ReduceScatter {
        /// This rank's full-size contribution.
        input: CollectiveArg<'a>,
        /// This rank's chunk of the reduction.
        output: CollectiveArg<'a>,
        /// How values combine.
        op: ReduceKind,
    },
    /// Send `buf` to rank `peer`, which receives it with a matching `Recv`.
    Send {
        /// The values sent.
        buf: CollectiveArg<'a>,
        /// The receiving rank.
        peer: usize,
    },
    /// Receive into `buf` what rank `peer` sends with a matching `Send`.
    Recv {
        /// Where the values land.
        buf: CollectiveArg<'a>,
        /// The sending rank.
        peer: usize,
    },
    /// Return once every rank has reached the barrier (on the device's stream: work queued
    /// after it starts only when every rank has queued the barrier).
    Barrier,
}

impl CallKind<'_> {
    /// The collective's name (`all_reduce`, `broadcast`, …).
    pub const fn name(&self) -> &'static str {
        match self {
            CallKind::AllReduce { .. } => "all_reduce",
            CallKind::Broadcast { .. } => "broadcast",
            CallKind::AllGather { .. } => "all_gather",
            CallKind::ReduceScatter { .. } => "reduce_scatter",
            CallKind::Send { .. } => "send",
            CallKind::Recv { .. } => "recv",
            CallKind::Barrier => "barrier",
        }
    }

    /// The operands, in order.
    pub fn operands(&self) -> Vec<&CollectiveArg<'_>> {
        match self {
            CallKind::AllReduce { buf, .. }
            | CallKind::Broadcast { buf, .. }
            | CallKind::Send { buf, .. }
            | CallKind::Recv { buf, .. } => vec![buf],
            CallKind::AllGather { input, output } | CallKind::ReduceScatter { input, output, .. } => {
                vec![input, output]
            }
            CallKind::Barrier => Vec::new(),
        }
    }
}

/// A collective call whose rules have been checked against its group ([`CollectiveCall::check`]
/// is the only way to make one), handed to [`Collective::run`].
#[derive(Clone, Debug)]
pub struct CollectiveCall<'a> {
    kind: CallKind<'a>,
}

impl<'a> CollectiveCall<'a> {
    /// Check `kind` for rank `rank` of a group of `world_size` ranks on `device`:
    /// - every operand lives on `device`;
    /// - a reduction accepts the dtype ([`ReduceKind::accepts`]);
    /// - an input and its output share a dtype and do not overlap, and their sizes differ by
    ///   exactly the world size (all-gather: output = world × input; reduce-scatter: input =
    ///   world × output);
    /// - `root` is a rank of the group; `peer` is another rank of the group.
    pub fn check(kind: CallKind<'a>, rank: usize, world_size: usize, device: Device) -> Result<Self> {
        let op = kind.name();
        for operand in kind.operands() {
            if operand.device() != device {
                return Err(Error::invalid(
                    op,
                    format!(
                        "an operand lives on {} but this group communicates on {device}; move it with `.to(&device)`",
                        operand.device()
                    ),
                ));
            }
        }
        match &kind {
            CallKind::AllReduce { buf, op: reduce } => check_reduce(op, *reduce, buf.dtype())?,
            CallKind::Broadcast { root, .. } => check_rank(op, "root", *root, world_size)?,
            CallKind::AllGather { input, output } => check_pair(op, input, output, world_size, true)?,
            CallKind::ReduceScatter {
                input,
                output,
                op: reduce,
            } => {
                check_reduce(op, *reduce, input.dtype())?;
                check_pair(op, input, output, world_size, false)?;
            }
            CallKind::Send { peer, .. } | CallKind::Recv { peer, .. } => {
                check_rank(op, "peer", *peer, world_size)?;
                if *peer == rank {
                    return Err(Error::invalid(
                        op,
                        format!("rank {rank} cannot {op} to itself; copy the tensor instead"),
                    ));
                }
            }
            CallKind::Barrier => {}
        }
        Ok(CollectiveCall { kind })
    }

    /// What the call asks for.
    pub fn kind(&self) -> &CallKind<'a> {
        &self.kind
    }

    /// The collective's name.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }
}

fn check_reduce(op: &'static str, reduce: ReduceKind, dtype: DType) -> Result<()> {
    if reduce.accepts(dtype) {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op,
            dtype,
            expected: reduce.expects(),
        })
    }
}

fn check_rank(op: &'static str, what: &str, value: usize, world_size: usize) -> Result<()> {
    if value < world_size {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            format!("{what} {value} is not a rank of this group of {world_size} (ranks 0..{world_size})"),
        ))
    }
}

/// An input and output whose sizes differ by the world size (`gather`: output is the larger).
fn check_pair(
    op: &'static str,
    input: &CollectiveArg<'_>,
    output: &CollectiveArg<'_>,
    world_size: usize,
    gather: bool,
) -> Result<()> {
    if input.dtype() != output.dtype() {
        return Err(Error::invalid(
            op,
            format!(
                "the input is {} but the output is {}; both must have one dtype",
                input.dtype(),
                output.dtype()
            ),
        ));
    }
    let (small, large) = if gather { (input, output) } else { (output, input) };
    if small.numel().checked_mul(world_size) != Some(large.numel()) {
        let reason = if gather {
            format!(
                "the output must hold world size ({world_size}) × the input's {} elements, but holds {}",
                input.numel(),
                output.numel()
            )
        } else {
            format!(
                "the input must hold world size ({world_size}) × the output's {} elements, but holds {}",
                output.numel(),
                input.numel()
            )
        };
        return Err(Error::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: output.shape().to_vec(),
            reason,
        });
    }
    if input.overlaps(output) {
        return Err(Error::invalid(
            op,
            "the input and the output overlap in memory; give the output its own tensor",
        ));
    }
    Ok(())
}

/// A collective in flight. Dropping it without [`CollectiveHandle::wait`] waits (logging a
/// failure). Later work on the same device is ordered after the collective whether or not the
/// host waits; waiting is for the host (reading a result, timing, catching a failure).
#[must_use = "a collective may still be running: wait on it to see whether it failed"]
pub struct CollectiveHandle {
    op: &'static str,
    completion: Option<Arc<dyn CopyCompletion>>,
}

impl fmt::Debug for CollectiveHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectiveHandle")
            .field("op", &self.op)
            .field("done", &self.is_done())
            .finish()
    }
}

impl CollectiveHandle {
    /// A handle for an engine's completion of `op`.
    pub fn new(op: &'static str, completion: Arc<dyn CopyCompletion>) -> Self {
        CollectiveHandle {
            op,
            completion: Some(completion),
        }
    }

    /// A handle for a collective that already completed (synchronous engines).
    pub fn completed(op: &'static str) -> Self {
        CollectiveHandle { op, completion: None }
    }

    /// The collective's name.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Block until the collective has finished on the device.
    pub fn wait(mut self) -> Result<()> {
        match self.completion.take() {
            Some(c) => c.wait(),
            None => Ok(()),
        }
    }

    /// True once the collective has finished (never blocks).
    pub fn is_done(&self) -> bool {
        self.completion.as_ref().is_none_or(|c| c.is_done())
    }
}

impl Drop for CollectiveHandle {
    fn drop(&mut self) {
        if let Some(c) = self.completion.take()
            && let Err(e) = c.wait()
        {
            tracing::error!(op = self.op, error = %e, "a collective failed (handle dropped without wait)");
        }
    }
}

/// One rank's membership of a group of ranks that communicate on one device each.
///
/// Engines implement [`Collective::run`] and the accessors; callers use the provided methods,
/// which check the call first ([`CollectiveCall::check`]). Those methods return once the work is
/// queued on the device; see [`CollectiveHandle`].
pub trait Collective: Send + Sync {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn world_size(&self) -> usize;

    /// The device this rank communicates on.
    fn device(&self) -> Device;

    /// The engine's name (`nccl`, `in-process (tests only)`).
    fn engine(&self) -> &'static str;

    /// Queue a checked call. Every operand lies in a buffer borrowed for the call, on
    /// [`Collective::device`], with the sizes the call's rules demand.
    fn run(&self, call: &CollectiveCall<'_>) -> Result<CollectiveHandle>;

    /// Reduce `buf` across ranks with `op`, in place on every rank.
    fn all_reduce(&self, buf: &CollectiveArg<'_>, op: ReduceKind) -> Result<CollectiveHandle> {
        self.submit(CallKind::AllReduce { buf: buf.clone(), op })
    }

    /// Copy rank `root`'s `buf` into every other rank's `buf`.
    fn broadcast(&self, buf: &CollectiveArg<'_>, root: usize) -> Result<CollectiveHandle> {
        self.submit(CallKind::Broadcast { buf: buf.clone(), root })
    }

    /// Concatenate every rank's `input`, in rank order, into every rank's `output`.
    fn all_gather(&self, input: &CollectiveArg<'_>, output: &CollectiveArg<'_>) -> Result<CollectiveHandle> {
        self.submit(CallKind::AllGather {
            input: input.clone(),
            output: output.clone(),
        })
    }

    /// Reduce every rank's `input` with `op` and leave chunk `rank()` of the result in `output`.
    fn reduce_scatter(
        &self,
        input: &CollectiveArg<'_>,
        output: &CollectiveArg<'_>,
        op: ReduceKind,
    ) -> Result<CollectiveHandle> {
        self.submit(CallKind::ReduceScatter {
            input: input.clone(),
            output: output.clone(),
            op,
        })
    }

    /// Send `buf` to rank `peer`.
    fn send(&self, buf: &CollectiveArg<'_>, peer: usize) -> Result<CollectiveHandle> {
        self.submit(CallKind::Send { buf: buf.clone(), peer })
    }

    /// Receive from rank `peer` into `buf`.
    fn recv(&self, buf: &CollectiveArg<'_>, peer: usize) -> Result<CollectiveHandle> {
        self.submit(CallKind::Recv { buf: buf.clone(), peer })
    }

    /// Wait until every rank has reached this point.
    fn barrier(&self) -> Result<CollectiveHandle> {
        self.submit(CallKind::Barrier)
    }

    /// Check `kind` against this rank's group, then [`Collective::run`] it.
    fn submit(&self, kind: CallKind<'_>) -> Result<CollectiveHandle> {
        let call = CollectiveCall::check(kind, self.rank(), self.world_size(), self.device())?;
        self.run(&call)
    }
}

/// A communication library that can join ranks living in separate processes (NCCL). Rank 0
/// makes an id, every rank receives it (through a rendezvous), then every rank joins with it.
pub trait CollectiveEngine: Send + Sync {
    /// The engine's name.
    fn name(&self) -> &'static str;

    /// Fail now if this rank could not join on `backend` (library missing, wrong kind of
    /// device). Every rank calls it before the rendezvous, so that a rank that cannot join fails
    /// before the others block waiting for it, and they see it as missing instead of hanging.
    fn check(&self, backend: &Arc<dyn Backend>) -> Result<()> {
        let _ = backend;
        Ok(())
    }

    /// A fresh group id, made by rank 0 on its `backend` (the others receive its bytes).
    fn unique_id(&self, backend: &Arc<dyn Backend>) -> Result<Vec<u8>>;

    /// Join the group `id` as rank `rank` of `world_size`, communicating on `backend`'s device.
    /// Blocks until every rank has joined (or the engine gives up).
    fn join(
        &self,
        backend: &Arc<dyn Backend>,
        id: &[u8],
        rank: usize,
        world_size: usize,
    ) -> Result<Arc<dyn Collective>>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reductions_accept_the_dtypes_they_are_defined_for() {
        for dtype in DType::ALL {
            assert_eq!(ReduceKind::Sum.accepts(dtype), dtype != DType::Bool, "{dtype}");
            assert_eq!(ReduceKind::Avg.accepts(dtype), dtype.is_float(), "{dtype}");
            assert!(ReduceKind::Max.accepts(dtype), "{dtype}");
        }
        let err = check_reduce("all_reduce", ReduceKind::Avg, DType::I64).unwrap_err();
        assert!(err.to_string().contains("an average needs a float dtype"), "{err}");
    }

    #[test]
    fn missing_ranks_are_named_with_what_to_check() {
        let missing = |missing: Vec<usize>| Error::RanksMissing {
            op: "rendezvous",
            rank: 0,
            world_size: 4,
            missing,
            waited: Duration::from_millis(1500),
        };
        let one = missing(vec![3]).to_string();
        assert!(
            one.starts_with("`rendezvous` on rank 0 of 4: rank 3 did not take part within 1.5s"),
            "{one}"
        );
        assert!(one.contains("WORLD_SIZE, MASTER_ADDR or MASTER_PORT"), "{one}");
        let many = missing(vec![1, 2]).to_string();
        assert!(many.contains("ranks [1, 2] did not take part"), "{many}");
        let unknown = missing(Vec::new()).to_string();
        assert!(unknown.contains("the other ranks did not complete it"), "{unknown}");
        assert_eq!(missing(vec![1]).kind().name(), "ranks-missing");
    }
}
