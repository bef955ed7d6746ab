//! [`DataParallel`]: data-parallel training over a [`ParamStore`]; [`DistributedSampler`],
//! which gives each rank its share of a dataset; [`ShardedOptimizer`], ZeRO stage 1.
//!
//! Every rank holds the whole model and trains on its own shard of each batch. [`DataParallel::new`]
//! broadcasts the parameters from rank 0, so every rank starts from the same values;
//! [`DataParallel::backward`] averages the gradients across ranks, so every rank
//! takes the same optimizer step and the parameters stay identical. With the loss a mean over
//! each rank's equal shard, the averaged gradient is the gradient of the mean over the whole
//! batch: N ranks take the steps one process would take on the combined batch.
//!
//! - Gradients travel in buckets of about [`DataParallel::DEFAULT_BUCKET_BYTES`] (25 MiB,
//!   configurable): the parameters in reverse registration order (the order backward finishes
//!   them), grouped by dtype, each bucket flattened into one tensor and averaged with one
//!   all-reduce. [`DataParallel::backward`] **overlaps them with backward**: autograd calls a
//!   hook on each parameter as soon as its gradient is final, and a bucket's asynchronous
//!   all-reduce is queued as soon as all its gradients are (buckets leave in order, so every rank
//!   issues the same collectives in the same order). The handles are waited on once backward
//!   has returned, before the optimizer step (`reducer`).
//! - [`DataParallel::no_sync`] skips the all-reduce, for gradient accumulation: micro-steps under
//!   it accumulate locally, and the last one, outside it, averages the sum.
//! - [`DataParallel::mean_across_ranks`] averages a loss and metrics across ranks with one
//!   all-reduce and one host read.
//! - A parameter without a gradient on this rank contributes zeros, so every rank's buckets hold
//!   the same parameters.
//! - [`ShardedOptimizer`] (`zero`): ZeRO stage 1, the optimizer state sharded across ranks
//!   (reduce-scatter the gradients, update this rank's shard, all-gather the parameters), for
//!   1/N of the optimizer memory per rank.
//!
//! The collectives come from a [`ProcessGroup`]: NCCL on CUDA devices, or, in tests on the CPU,
//! the in-process test engine (`cartage::distributed::InProcessCollective`).

mod reducer;
mod sampler;
mod zero;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cartage::distributed::ProcessGroup;
use cartage::{DType, Error, ReduceKind, Result, Tensor};

use crate::ParamStore;
use reducer::Reducer;
pub use sampler::DistributedSampler;
pub use zero::ShardedOptimizer;

/// Data-parallel training of one store's parameters; see the module docs.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use cartage::distributed::{InProcessCollective, ProcessGroup};
/// use cartage::prelude::*;
/// use cartage_nn::{DataParallel, Module, ParamStore, layers::Linear, optim::{Optimizer, Sgd}};
///
/// // Two ranks as threads (the in-process engine is for tests and examples; use NCCL on GPUs).
/// let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(30))?;
/// let weights = std::thread::scope(|scope| {
///     let ranks: Vec<_> = members
///         .into_iter()
///         .map(|member| {
///             scope.spawn(move || -> cartage::Result<Vec<f32>> {
///                 let group = ProcessGroup::new(Arc::new(member));
///                 let store = ParamStore::new(&Device::cpu());
///                 let mut rng = Generator::new(group.rank() as u64); // different on each rank
///                 let layer = Linear::new(&store.root().sub("fc"), 4, 1, true, &mut rng)?;
///                 let ddp = DataParallel::new(&store, group)?; // rank 0's initial values everywhere
///                 let mut opt = Sgd::new(&store, 0.1)?;
///                 let x = Tensor::randn(&[8, 4], DType::F32, 7 + ddp.rank() as u64, &Device::cpu())?;
///                 ddp.backward(&layer.forward(&x)?.square()?.mean_all()?)?; // gradients averaged
///                 opt.step(&store)?;
///                 store.get("fc.weight").unwrap().value().to_vec::<f32>()
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|rank| rank.join().unwrap()).collect::<cartage::Result<Vec<_>>>()
/// })?;
/// assert_eq!(weights[0], weights[1]); // the ranks took the same step
/// # Ok::<(), cartage::Error>(())
/// ```
pub struct DataParallel {
    store: ParamStore,
    group: ProcessGroup,
    bucket_bytes: usize,
    syncing: AtomicBool,
    reducer: Arc<Reducer>,
}

impl Drop for DataParallel {
    fn drop(&mut self) {
        self.reducer.detach();
    }
}

impl std::fmt::Debug for DataParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("group", &self.group)
            .field("bucket_bytes", &self.bucket_bytes)
            .field("syncing", &self.syncing.load(Ordering::Relaxed))
            .finish()
    }
}

/// One bucket of gradients: parameters of one dtype whose gradients are averaged together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The parameters' names, in the bucket's order.
    pub names: Vec<String>,
    /// Their dtype.
    pub dtype: DType,
    /// The bucket's size in bytes.
    pub bytes: usize,
}

/// While alive, [`DataParallel::backward`] does not average gradients (gradient accumulation).
#[must_use = "gradients are averaged again as soon as this guard is dropped"]
pub struct NoSync<'a> {
    ddp: &'a DataParallel,
    previous: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.ddp.syncing.store(self.previous, Ordering::Relaxed);
    }
}

impl DataParallel {
    /// PyTorch's default bucket size: 25 MiB.
    pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

    /// Train `store`'s parameters data-parallel over `group`: checks that every rank has the
    /// same parameters (count and sizes), then broadcasts rank 0's values to every rank.
    /// `store` must live on the group's device and hold every parameter already (the buckets
    /// are planned here).
    pub fn new(store: &ParamStore, group: ProcessGroup) -> Result<DataParallel> {
        if store.device() != group.device() {
            return Err(Error::invalid(
                "DataParallel::new",
                format!(
                    "the parameters live on {} but the group communicates on {}; move the store with `store.to(..)` \
                     or join the group on the parameters' device",
                    store.device(),
                    group.device()
                ),
            ));
        }
        let reducer = Reducer::new(group.clone(), reducer::plan(store, Self::DEFAULT_BUCKET_BYTES));
        let ddp = DataParallel {
            store: store.clone(),
            group,
            bucket_bytes: Self::DEFAULT_BUCKET_BYTES,
            syncing: AtomicBool::new(true),
            reducer,
        };
        ddp.check_same_model()?;
        ddp.broadcast_parameters()?;
        Ok(ddp)
    }

    /// The same wrapper with buckets of at most `bytes` (a larger parameter gets a bucket of its
    /// own). `bytes` must be positive.
    pub fn with_bucket_bytes(mut self, bytes: usize) -> Result<DataParallel> {
        if bytes == 0 {
            return Err(Error::invalid(
                "DataParallel::with_bucket_bytes",
                "a bucket holds at least one byte; the default is 25 MiB",
            ));
        }
        self.reducer.detach();
        self.reducer = Reducer::new(self.group.clone(), reducer::plan(&self.store, bytes));
        self.bucket_bytes = bytes;
        Ok(self)
    }

    /// The process group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// Backward from `loss`, averaging the gradients across ranks unless inside
    /// [`DataParallel::no_sync`]: each bucket's all-reduce is queued during backward as soon as
    /// its gradients are final, and all are waited for before this returns. Every rank must call
    /// it at the same point.
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        if self.syncing.load(Ordering::Relaxed) {
            self.reducer.backward(loss)
        } else {
            loss.backward().map(drop)
        }
    }

    /// Skip the gradient average while the guard lives: micro-steps accumulate locally, and the
    /// first backward after the guard is dropped averages the accumulated sum.
    pub fn no_sync(&self) -> NoSync<'_> {
        NoSync {
            ddp: self,
            previous: self.syncing.swap(false, Ordering::Relaxed),
        }
    }

    /// The buckets the gradients travel in, in the order they are sent.
    pub fn buckets(&self) -> Vec<Bucket> {
        self.reducer.buckets()
    }

    /// Average every parameter's gradient across ranks now, bucket by bucket (after a plain
    /// `loss.backward()`; [`DataParallel::backward`] does it during backward). Every rank must
    /// call it at the same point.
    pub fn sync_gradients(&self) -> Result<()> {
        self.reducer.sync()
    }

    /// The mean of each scalar in `values` across ranks (a loss, a metric), computed with one
    /// all-reduce and read with one host synchronisation. Every rank passes the same number of
    /// values, each with one element, on the group's device.
    pub fn mean_across_ranks(&self, values: &[&Tensor]) -> Result<Vec<f64>> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let _plain = cartage::no_grad();
        let parts: Vec<Tensor> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if v.numel() != 1 {
                    return Err(Error::invalid(
                        "DataParallel::mean_across_ranks",
                        format!(
                            "value {i} has shape {:?}; pass one-element tensors (reduce them first)",
                            v.shape()
                        ),
                    ));
                }
                v.detach().to_dtype(DType::F32)?.reshape(&[1])
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = parts.iter().collect();
        let joined = Tensor::cat(&refs, 0)?;
        self.group.all_reduce(&joined, ReduceKind::Avg)?.wait()?;
        joined.to_vec_f64()
    }

    /// Fail unless every rank has as many parameters, of as many elements, as this one.
    fn check_same_model(&self) -> Result<()> {
        let vars = self.store.vars();
        let count = vars.len() as i64;
        let elements = self.store.num_params() as i64;
        let local = [count, elements, -count, -elements];
        let shape = Tensor::from_slice(&local, &[4], &self.store.device())?;
        self.group.all_reduce(&shape, ReduceKind::Max)?.wait()?;
        let seen = shape.to_vec::<i64>()?;
        if seen[0] != -seen[2] || seen[1] != -seen[3] {
            return Err(Error::invalid(
                "DataParallel::new",
                format!(
                    "rank {} has {count} parameters of {elements} elements, but the ranks range from {} to {} \
                     parameters and {} to {} elements: build the same model on every rank",
                    self.rank(),
                    -seen[2],
                    seen[0],
                    -seen[3],
                    seen[1]
                ),
            ));
        }
        Ok(())
    }

    /// Give every rank rank 0's parameter values.
    fn broadcast_parameters(&self) -> Result<()> {
        let _plain = cartage::no_grad();
        let mut in_flight = Vec::new();
        for var in self.store.vars() {
            let value = var.value();
            let target = if value.is_contiguous() {
                value
            } else {
                value.contiguous()?
            };
            in_flight.push((self.group.broadcast(&target, 0)?, var, target));
        }
        for (handle, var, target) in in_flight {
            handle.wait()?;
            if !target.shares_storage(&var.value()) {
                var.set(target)?;
            }
        }
        Ok(())
    }
}
