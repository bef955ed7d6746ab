//! [`DataParallel`]: data-parallel training over a [`ParamStore`], and [`DistributedSampler`],
//! which gives each rank its share of a dataset.
//!
//! Every rank holds the whole model and trains on its own shard of each batch. [`DataParallel::new`]
//! broadcasts the parameters from rank 0, so every rank starts from the same values; after each
//! backward, [`DataParallel::sync_gradients`] averages the gradients across ranks, so every rank
//! takes the same optimizer step and the parameters stay identical. With the loss a mean over
//! each rank's equal shard, the averaged gradient is the gradient of the mean over the whole
//! batch: N ranks take the steps one process would take on the combined batch.
//!
//! - Gradients travel in buckets of about [`DataParallel::DEFAULT_BUCKET_BYTES`] (25 MiB,
//!   configurable): the parameters in reverse registration order (the order backward finishes
//!   them), grouped by dtype, each bucket flattened into one tensor and averaged with one
//!   all-reduce. Every bucket's all-reduce is queued before the first is waited for, so on NCCL
//!   they overlap each other; they start after backward has finished (cartage's autograd has no
//!   per-gradient hook to start a bucket earlier).
//! - [`DataParallel::no_sync`] skips the all-reduce, for gradient accumulation: micro-steps under
//!   it accumulate locally, and the last one, outside it, averages the sum.
//! - [`DataParallel::mean_across_ranks`] averages a loss and metrics across ranks with one
//!   all-reduce and one host read.
//! - A parameter without a gradient on this rank contributes zeros, so every rank's buckets hold
//!   the same parameters.
//!
//! The collectives come from a [`ProcessGroup`]: NCCL on CUDA devices, or, in tests on the CPU,
//! the in-process test engine (`cartage::distributed::InProcessCollective`).

use std::sync::atomic::{AtomicBool, Ordering};

use cartage::distributed::ProcessGroup;
use cartage::{DType, Error, ReduceKind, Result, Tensor, Var};

use crate::ParamStore;

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
///                 let mut opt = Sgd::new(&store, 0.1);
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
    /// `store` must live on the group's device.
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
        let ddp = DataParallel {
            store: store.clone(),
            group,
            bucket_bytes: Self::DEFAULT_BUCKET_BYTES,
            syncing: AtomicBool::new(true),
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

    /// Backward from `loss`, then average the gradients across ranks unless inside
    /// [`DataParallel::no_sync`].
    pub fn backward(&self, loss: &Tensor) -> Result<()> {
        loss.backward()?;
        if self.syncing.load(Ordering::Relaxed) {
            self.sync_gradients()?;
        }
        Ok(())
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
        self.plan().into_iter().map(|(bucket, _)| bucket).collect()
    }

    /// Average every parameter's gradient across ranks, bucket by bucket (see the module docs).
    /// Every rank must call it at the same point.
    pub fn sync_gradients(&self) -> Result<()> {
        let _plain = cartage::no_grad();
        let mut in_flight = Vec::new();
        for (bucket, vars) in self.plan() {
            let flat: Vec<Tensor> = vars
                .iter()
                .map(|var| {
                    let grad = match var.grad() {
                        Some(g) => g,
                        None => Tensor::zeros(&var.shape(), bucket.dtype, &var.device())?,
                    };
                    let numel = grad.numel();
                    grad.reshape(&[numel])
                })
                .collect::<Result<_>>()?;
            let parts: Vec<&Tensor> = flat.iter().collect();
            let joined = Tensor::cat(&parts, 0)?;
            let handle = self.group.all_reduce(&joined, ReduceKind::Avg)?;
            in_flight.push((handle, joined, vars));
        }
        for (handle, joined, vars) in in_flight {
            handle.wait()?;
            let mut at = 0;
            for var in vars {
                let shape = var.shape();
                let numel = shape.iter().product::<usize>();
                var.set_grad(Some(joined.narrow(0, at, numel)?.reshape(&shape)?))?;
                at += numel;
            }
        }
        Ok(())
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

    /// The buckets with their variables: reverse registration order, one dtype per bucket, at
    /// most `bucket_bytes` each unless one parameter is larger.
    fn plan(&self) -> Vec<(Bucket, Vec<Var>)> {
        let mut open: Vec<(Bucket, Vec<Var>)> = Vec::new();
        let mut done = Vec::new();
        for (name, var) in self.store.named_vars().into_iter().rev() {
            let dtype = var.dtype();
            let bytes = var.shape().iter().product::<usize>() * dtype.size_in_bytes();
            let slot = open.iter().position(|(b, _)| b.dtype == dtype);
            if let Some(i) = slot
                && open[i].0.bytes + bytes > self.bucket_bytes
            {
                done.push(open.remove(i));
            }
            match open.iter_mut().find(|(b, _)| b.dtype == dtype) {
                Some((bucket, vars)) => {
                    bucket.names.push(name);
                    bucket.bytes += bytes;
                    vars.push(var);
                }
                None => open.push((
                    Bucket {
                        names: vec![name],
                        dtype,
                        bytes,
                    },
                    vec![var],
                )),
            }
        }
        done.extend(open);
        done
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

/// Which indices of a dataset each rank reads in an epoch: PyTorch's `DistributedSampler`.
/// Every rank gets the same number of indices (the dataset is padded by repeating its first
/// indices, or cut with `drop_last`), rank `r` takes every `world_size`-th index from `r`, and
/// with shuffling the order depends on the seed and the epoch, the same on every rank.
///
/// ```
/// use cartage_nn::DistributedSampler;
/// let rank0 = DistributedSampler::new(10, 0, 4).indices(0);
/// let rank3 = DistributedSampler::new(10, 3, 4).indices(0);
/// assert_eq!((rank0.len(), rank3.len()), (3, 3)); // 10 padded to 12
/// assert_ne!(rank0, rank3);
/// ```
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    rank: usize,
    world_size: usize,
    /// Shuffle each epoch (the default).
    pub shuffle: bool,
    /// The shuffle's seed, the same on every rank.
    pub seed: u64,
    /// Drop the tail that does not divide evenly instead of padding.
    pub drop_last: bool,
}

impl DistributedSampler {
    /// The sampler of rank `rank` of `world_size` over a dataset of `len` items (shuffled, seed 0,
    /// padded). A rank outside `0..world_size` gets no indices.
    pub fn new(len: usize, rank: usize, world_size: usize) -> DistributedSampler {
        DistributedSampler {
            len,
            rank,
            world_size: world_size.max(1),
            shuffle: true,
            seed: 0,
            drop_last: false,
        }
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        if self.rank >= self.world_size {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut state = self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for i in (1..order.len()).rev() {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                order.swap(i, (z % (i as u64 + 1)) as usize);
            }
        }
        let per_rank = if self.drop_last {
            self.len / self.world_size
        } else {
            self.len.div_ceil(self.world_size)
        };
        let total = per_rank * self.world_size;
        if total > order.len() && !order.is_empty() {
            let pad: Vec<usize> = order.iter().copied().cycle().take(total - order.len()).collect();
            order.extend(pad);
        }
        order.truncate(total);
        order.into_iter().skip(self.rank).step_by(self.world_size).collect()
    }
}
