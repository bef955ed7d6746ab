//! [`ProcessGroup`]: collectives on cartage tensors, through any [`Collective`] engine.
//!
//! The group checks what a user means — the tensor lives on the group's device, it is
//! contiguous, a written tensor is not part of an autograd graph, input and output dtypes agree,
//! gathered and scattered shapes fit the world size — with errors that name the tensors' origins
//! and the line that created the group. Core then checks the call's structure once
//! ([`cartage_core::collective::CollectiveCall::check`]) and the engine runs it.

use std::panic::Location;
use std::sync::Arc;
use std::time::Duration;

use cartage_core::{
    Collective, CollectiveArg, CollectiveEngine, CollectiveHandle, Device, Error, ReduceKind, Result, Site,
};

use super::env::DistEnv;
use super::rendezvous::Rendezvous;
use crate::autograd::graph;
use crate::tensor::Tensor;

/// One rank's view of a group of ranks, each on its own device, that exchange tensors.
///
/// Cloning shares the membership. Every method returns once the work is queued on the device
/// (on CUDA, NCCL on the communicator's own stream, beside compute on other memory: later ops on
/// the tensor are ordered after it); wait on the [`CollectiveHandle`] to block the host or to see
/// a failure. Every rank must call the same
/// collectives in the same order with matching shapes.
#[derive(Clone)]
pub struct ProcessGroup {
    collective: Arc<dyn Collective>,
    created_at: Site,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("device", &self.device())
            .field("engine", &self.engine())
            .finish()
    }
}

impl ProcessGroup {
    /// The group of an engine's member (for instance an
    /// [`InProcessCollective`](super::InProcessCollective) in a test thread).
    #[track_caller]
    pub fn new(collective: Arc<dyn Collective>) -> ProcessGroup {
        ProcessGroup {
            collective,
            created_at: Location::caller(),
        }
    }

    /// Join the group `env` describes (see [`DistEnv::from_env`]) on `device` with `engine`:
    /// rank 0 makes the engine's id, the [`Rendezvous`] on `MASTER_ADDR:MASTER_PORT` hands it to
    /// every rank (failing with [`Error::RanksMissing`] after `timeout` if a rank never
    /// arrives), then every rank joins. Each rank first asks the engine whether it can join
    /// ([`CollectiveEngine::check`]), so a rank that cannot fails before the others wait for it.
    #[track_caller]
    pub fn init(
        env: &DistEnv,
        device: &Device,
        engine: &dyn CollectiveEngine,
        timeout: Duration,
    ) -> Result<ProcessGroup> {
        let created_at = Location::caller();
        let backend = crate::runtime::backend(device)?;
        engine.check(&backend)?;
        let id = if env.is_main() {
            engine.unique_id(&backend)?
        } else {
            Vec::new()
        };
        let id = Rendezvous::new(env, timeout).exchange(&id)?;
        let collective = engine.join(&backend, &id, env.rank, env.world_size)?;
        tracing::info!(
            rank = env.rank,
            world_size = env.world_size,
            %device,
            engine = engine.name(),
            "joined the process group"
        );
        Ok(ProcessGroup { collective, created_at })
    }

    /// [`ProcessGroup::init`] with the device's own cross-process engine
    /// ([`cartage_core::Backend::collective_engine`]: NCCL on CUDA when cartage is built with
    /// the `nccl` feature). A device without one is [`Error::BackendUnavailable`] saying what to
    /// build or use instead.
    #[track_caller]
    pub fn init_on_device(env: &DistEnv, device: &Device, timeout: Duration) -> Result<ProcessGroup> {
        let backend = crate::runtime::backend(device)?;
        let Some(engine) = backend.collective_engine() else {
            return Err(Error::BackendUnavailable {
                device: *device,
                reason: "no cross-process collective engine runs on this device: on CUDA build cartage with the \
                         `nccl` feature (NCCL is loaded at run time); the CPU has only the in-process engine, \
                         for tests (`InProcess`)"
                    .into(),
            });
        };
        ProcessGroup::init(env, device, engine.as_ref(), timeout)
    }

    /// This rank, in `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.collective.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.collective.world_size()
    }

    /// The device this rank communicates on.
    pub fn device(&self) -> Device {
        self.collective.device()
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.collective.engine()
    }

    /// The engine's member underneath.
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.collective
    }

    /// Reduce `tensor` across ranks with `op`, in place on every rank.
    #[track_caller]
    pub fn all_reduce(&self, tensor: &Tensor, op: ReduceKind) -> Result<CollectiveHandle> {
        let buf = self.operand("all_reduce", tensor, true)?;
        self.collective.all_reduce(&buf, op)
    }

    /// Copy rank `root`'s `tensor` into every other rank's `tensor`.
    #[track_caller]
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<CollectiveHandle> {
        let buf = self.operand("broadcast", tensor, true)?;
        self.collective.broadcast(&buf, root)
    }

    /// Gather every rank's `input` into `output`, in rank order. `output` has shape
    /// `[world_size * d0, d1, ...]` (concatenated along the first dimension) or
    /// `[world_size, d0, d1, ...]` (stacked) for an input of shape `[d0, d1, ...]`.
    #[track_caller]
    pub fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<CollectiveHandle> {
        self.check_pair("all_gather", input, output, true)?;
        let (input, output) = (
            self.operand("all_gather", input, false)?,
            self.operand("all_gather", output, true)?,
        );
        self.collective.all_gather(&input, &output)
    }

    /// Reduce every rank's `input` with `op` and keep this rank's chunk in `output`: `input` has
    /// shape `[world_size * d0, d1, ...]` or `[world_size, d0, d1, ...]` for an output of shape
    /// `[d0, d1, ...]`.
    #[track_caller]
    pub fn reduce_scatter(&self, input: &Tensor, output: &Tensor, op: ReduceKind) -> Result<CollectiveHandle> {
        self.check_pair("reduce_scatter", output, input, false)?;
        let (input, output) = (
            self.operand("reduce_scatter", input, false)?,
            self.operand("reduce_scatter", output, true)?,
        );
        self.collective.reduce_scatter(&input, &output, op)
    }

    /// Send `tensor` to rank `peer`, which receives it with [`ProcessGroup::recv`].
    #[track_caller]
    pub fn send(&self, tensor: &Tensor, peer: usize) -> Result<CollectiveHandle> {
        let buf = self.operand("send", tensor, false)?;
        self.collective.send(&buf, peer)
    }

    /// Receive into `tensor` what rank `peer` sends (same shape and dtype).
    #[track_caller]
    pub fn recv(&self, tensor: &Tensor, peer: usize) -> Result<CollectiveHandle> {
        let buf = self.operand("recv", tensor, true)?;
        self.collective.recv(&buf, peer)
    }

    /// Wait until every rank has reached this point.
    pub fn barrier(&self) -> Result<CollectiveHandle> {
        self.collective.barrier()
    }

    /// `tensor` as an operand, after the user-level checks (see the module docs).
    #[track_caller]
    fn operand<'t>(&self, op: &'static str, tensor: &'t Tensor, written: bool) -> Result<CollectiveArg<'t>> {
        if tensor.device() != self.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs_device: tensor.device(),
                lhs_site: tensor.origin(),
                rhs_device: self.device(),
                rhs_site: self.created_at,
            });
        }
        if !tensor.is_contiguous() {
            return Err(Error::invalid(
                op,
                format!(
                    "the tensor created at {} is a strided view (shape {:?}, strides {:?}); collectives need \
                     contiguous tensors: pass `.contiguous()?`, and copy a result back with `copy_from`",
                    tensor.origin(),
                    tensor.shape(),
                    tensor.layout().strides()
                ),
            ));
        }
        if written && graph::tracking(&[tensor]) {
            return Err(Error::Autograd {
                op,
                reason: format!(
                    "the tensor created at {} takes part in autograd, and a collective writes it in place \
                     without recording; communicate gradients or `detach()`ed values, or call it under \
                     `cartage::no_grad()`",
                    tensor.origin()
                ),
            });
        }
        if written {
            // Counted when queued: autograd refuses a saved tensor a collective overwrote.
            tensor.bump_version(op, std::panic::Location::caller());
        }
        crate::graph::hold([tensor]);
        CollectiveArg::new(tensor.storage().device_buffer(), tensor.as_arg())
    }

    /// `small` (one rank's part) and `large` (every rank's parts) agree in dtype, and `large`
    /// concatenates or stacks world-size copies of `small`'s shape.
    fn check_pair(&self, op: &'static str, small: &Tensor, large: &Tensor, gather: bool) -> Result<()> {
        let (input, output) = if gather { (small, large) } else { (large, small) };
        if input.dtype() != output.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: input.dtype(),
                lhs_site: input.origin(),
                rhs: output.dtype(),
                rhs_site: output.origin(),
            });
        }
        let world = self.world_size();
        let (s, l) = (small.shape(), large.shape());
        let stacked = l.len() == s.len() + 1 && l[0] == world && l[1..] == *s;
        let concatenated =
            !s.is_empty() && l.len() == s.len() && Some(l[0]) == s[0].checked_mul(world) && l[1..] == s[1..];
        if stacked || concatenated {
            return Ok(());
        }
        let (what, part) = if gather {
            ("output", "input")
        } else {
            ("input", "output")
        };
        Err(Error::ShapeMismatch {
            op,
            lhs: input.shape().to_vec(),
            rhs: output.shape().to_vec(),
            reason: format!(
                "the {what} must hold the {part}s of all {world} ranks: shape [{world} × d0, ...] (concatenated) or \
                 [{world}, ...{part} shape] (stacked)"
            ),
        })
    }
}
