//! [`ShardedOptimizer`]: ZeRO stage 1 — data-parallel training with the optimizer state split
//! across the ranks.
//!
//! Plain data parallelism keeps a whole copy of the optimizer state on every rank (AdamW: two
//! moments, twice the parameters' bytes). Here the parameters of each dtype are laid end to end
//! in one flat vector, padded to a multiple of the world size and cut into one equal chunk per
//! rank; rank `r` keeps the optimizer state of chunk `r` only. A step:
//!
//! 1. **reduce-scatter** the flattened gradients (average): rank `r` receives the averaged
//!    gradient of its chunk only;
//! 2. the wrapped optimizer updates this rank's chunk: the chunk is one parameter of a private
//!    store, so the optimizer's own multi-tensor step runs on it (one kernel per dtype);
//! 3. **all-gather** the updated chunks: every rank gets every parameter's new value.
//!
//! Each rank holds 1/N of the optimizer state (plus at most N−1 padding elements), and the steps
//! are those of plain data parallelism: the reduce-scatter averages as the all-reduce does, and
//! the optimizers this fits — element-wise ones: [`crate::optim::AdamW`], [`crate::optim::Adam`],
//! [`crate::optim::Sgd`] — compute each element from that element alone. Clipping by a global
//! norm needs the whole gradient, so it does not fit inside the step.
//!
//! Every parameter takes part in every step: one without a gradient on this rank contributes
//! zeros (as in [`super::DataParallel`]). Gradients stay local until the step, so gradient
//! accumulation needs nothing: run several backward passes, then one step.

use cartage::distributed::ProcessGroup;
use cartage::{DType, Error, ReduceKind, Result, Tensor, Var};

use crate::optim::{Optimizer, OptimizerState, StateDiff};
use crate::{ParamStore, StoreId};

/// The parameters of one dtype, laid end to end and cut into one chunk per rank.
struct Flat {
    dtype: DType,
    vars: Vec<Var>,
    /// Elements of all the parameters (without padding).
    numel: usize,
    /// Elements per rank.
    chunk: usize,
    /// This rank's chunk, a parameter of the private store.
    shard: Var,
}

/// ZeRO stage 1 over any element-wise [`Optimizer`]; see the module docs.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use cartage::distributed::{InProcessCollective, ProcessGroup};
/// use cartage::prelude::*;
/// use cartage_nn::ddp::ShardedOptimizer;
/// use cartage_nn::{Module, ParamStore, layers::Linear, optim::{AdamW, Optimizer}};
///
/// let members = InProcessCollective::group(&Device::cpu(), 2, Duration::from_secs(30))?;
/// let weights = std::thread::scope(|scope| {
///     let ranks: Vec<_> = members
///         .into_iter()
///         .map(|member| {
///             scope.spawn(move || -> cartage::Result<Vec<f32>> {
///                 let group = ProcessGroup::new(Arc::new(member));
///                 let store = ParamStore::new(&Device::cpu());
///                 let mut rng = Generator::new(group.rank() as u64);
///                 let layer = Linear::new(&store.root().sub("fc"), 4, 1, true, &mut rng)?;
///                 // Rank 0's initial values everywhere; each rank keeps half of AdamW's moments.
///                 let mut opt = ShardedOptimizer::new(&store, group, |shard| AdamW::new(shard, 1e-2))?;
///                 let x = Tensor::randn(&[8, 4], DType::F32, 7 + opt.rank() as u64, &Device::cpu())?;
///                 layer.forward(&x)?.square()?.mean_all()?.backward()?; // local gradients
///                 opt.step(&store)?; // reduce-scatter, update the shard, all-gather
///                 store.get("fc.weight").unwrap().value().to_vec::<f32>()
///             })
///         })
///         .collect();
///     ranks.into_iter().map(|rank| rank.join().unwrap()).collect::<cartage::Result<Vec<_>>>()
/// })?;
/// assert_eq!(weights[0], weights[1]);
/// # Ok::<(), cartage::Error>(())
/// ```
pub struct ShardedOptimizer {
    store: StoreId,
    group: ProcessGroup,
    shards: ParamStore,
    flats: Vec<Flat>,
    inner: Box<dyn Optimizer>,
}

impl std::fmt::Debug for ShardedOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedOptimizer")
            .field("group", &self.group)
            .field("shard_elements", &self.shard_elements())
            .finish()
    }
}

impl ShardedOptimizer {
    /// Shard the optimizer state of `store`'s parameters over `group`: broadcasts rank 0's
    /// parameter values to every rank (as [`super::DataParallel::new`] does), cuts this rank's
    /// chunk of each dtype's flattened parameters, and builds the optimizer on those chunks with
    /// `make` (for instance `|shard| AdamW::new(shard, 1e-3)`). `store` lives on the group's
    /// device and holds every parameter already.
    pub fn new<O: Optimizer + 'static>(
        store: &ParamStore,
        group: ProcessGroup,
        make: impl FnOnce(&ParamStore) -> Result<O>,
    ) -> Result<ShardedOptimizer> {
        if store.device() != group.device() {
            return Err(Error::invalid(
                "ShardedOptimizer::new",
                format!(
                    "the parameters live on {} but the group communicates on {}; move the store with `store.to(..)` \
                     or join the group on the parameters' device",
                    store.device(),
                    group.device()
                ),
            ));
        }
        let _plain = cartage::no_grad();
        let world = group.world_size();
        let (rank, device) = (group.rank(), store.device());
        let shards = ParamStore::new(&device);
        let mut by_dtype: Vec<(DType, Vec<Var>)> = Vec::new();
        for var in store.vars() {
            match by_dtype.iter_mut().find(|(d, _)| *d == var.dtype()) {
                Some((_, vars)) => vars.push(var),
                None => by_dtype.push((var.dtype(), vec![var])),
            }
        }
        let mut flats = Vec::new();
        for (dtype, vars) in by_dtype {
            let values = flatten(&vars, dtype, |v| Ok(Some(v.value())))?;
            let numel = values.numel();
            let chunk = numel.div_ceil(world).max(1);
            let padded = pad(values, chunk * world)?;
            group.broadcast(&padded, 0)?.wait()?;
            let local = padded.narrow(0, rank * chunk, chunk)?.contiguous()?;
            let shard = shards.root().var(&format!("shard.{dtype}"), local)?;
            let flat = Flat {
                dtype,
                vars,
                numel,
                chunk,
                shard,
            };
            flat.scatter_values(&padded)?;
            flats.push(flat);
        }
        let inner = Box::new(make(&shards)?);
        Ok(ShardedOptimizer {
            store: store.id(),
            group,
            shards,
            flats,
            inner,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// Elements of this rank's chunks (over every dtype): the parameters the wrapped optimizer
    /// keeps state for here, about 1/N of the model's.
    pub fn shard_elements(&self) -> usize {
        self.flats.iter().map(|f| f.chunk).sum()
    }

    /// Bytes of the optimizer state this rank holds (every tensor of the wrapped optimizer's
    /// [`Optimizer::state`]).
    pub fn local_state_bytes(&self) -> Result<usize> {
        let state = self.inner.state(&self.shards)?;
        Ok(state
            .tensors
            .iter()
            .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
            .sum())
    }

    fn check_store(&self, op: &'static str, store: &ParamStore) -> Result<()> {
        if store.id() == self.store {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            reason: "this optimizer was built on another ParamStore; pass the store whose parameters it \
                     updates (build one optimizer per store)"
                .into(),
        })
    }
}

impl Optimizer for ShardedOptimizer {
    /// Reduce-scatter the gradients, update this rank's chunk, all-gather the parameters (see
    /// the module docs). Every rank must call it at the same point.
    fn step(&mut self, store: &ParamStore) -> Result<()> {
        self.check_store("ShardedOptimizer::step", store)?;
        let _plain = cartage::no_grad();
        let world = self.group.world_size();
        let mut queued = Vec::new();
        for flat in &self.flats {
            let grads = flatten(&flat.vars, flat.dtype, |v| Ok(v.grad()))?;
            let grads = pad(grads, flat.chunk * world)?;
            let local = Tensor::zeros(&[flat.chunk], flat.dtype, &store.device())?;
            queued.push((self.group.reduce_scatter(&grads, &local, ReduceKind::Avg)?, local));
        }
        for ((handle, local), flat) in queued.into_iter().zip(&self.flats) {
            handle.wait()?;
            flat.shard.set_grad(Some(local))?;
        }
        self.inner.step(&self.shards)?;
        let mut gathered = Vec::new();
        for flat in &self.flats {
            flat.shard.set_grad(None)?;
            let full = Tensor::zeros(&[flat.chunk * world], flat.dtype, &store.device())?;
            gathered.push((self.group.all_gather(&flat.shard.value(), &full)?, full));
        }
        for ((handle, full), flat) in gathered.into_iter().zip(&self.flats) {
            handle.wait()?;
            flat.scatter_values(&full)?;
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.inner.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.inner.set_learning_rate(lr);
    }

    /// This rank's shard of the state: the wrapped optimizer's tensors for the chunks, named
    /// `shard.<dtype>.<slot>`. Save it per rank, and load it on the same world size.
    fn state(&self, store: &ParamStore) -> Result<OptimizerState> {
        self.check_store("ShardedOptimizer::state", store)?;
        self.inner.state(&self.shards)
    }

    fn check_state(&self, store: &ParamStore, state: &OptimizerState) -> Result<StateDiff> {
        self.check_store("ShardedOptimizer::load_state", store)?;
        self.inner.check_state(&self.shards, state)
    }

    fn load_state_with(&mut self, store: &ParamStore, state: &OptimizerState, strict: bool) -> Result<StateDiff> {
        self.check_store("ShardedOptimizer::load_state", store)?;
        self.inner.load_state_with(&self.shards, state, strict)
    }
}

impl Flat {
    /// Give each parameter its slice of `full` (the padded flat values).
    fn scatter_values(&self, full: &Tensor) -> Result<()> {
        let mut at = 0;
        for var in &self.vars {
            let shape = var.shape();
            let numel = shape.iter().product::<usize>();
            var.rebind(full.narrow(0, at, numel)?.reshape(&shape)?)?;
            at += numel;
        }
        debug_assert_eq!(at, self.numel);
        Ok(())
    }
}

/// `vars`' tensors (as `pick` gives them; zeros for `None`) as one flat tensor.
fn flatten(vars: &[Var], dtype: DType, pick: impl Fn(&Var) -> Result<Option<Tensor>>) -> Result<Tensor> {
    let flat: Vec<Tensor> = vars
        .iter()
        .map(|var| {
            let t = match pick(var)? {
                Some(t) => t,
                None => Tensor::zeros(&var.shape(), dtype, &var.device())?,
            };
            let numel = t.numel();
            t.contiguous()?.reshape(&[numel])
        })
        .collect::<Result<_>>()?;
    let parts: Vec<&Tensor> = flat.iter().collect();
    Tensor::cat(&parts, 0)
}

/// `flat` with zeros appended up to `len` elements (a fresh tensor either way).
fn pad(flat: Tensor, len: usize) -> Result<Tensor> {
    let missing = len - flat.numel();
    if missing == 0 {
        return flat.contiguous();
    }
    let zeros = Tensor::zeros(&[missing], flat.dtype(), &flat.device())?;
    Tensor::cat(&[&flat, &zeros], 0)
}
