//! The gradient reducer behind [`super::DataParallel`]: the bucket plan, and the all-reduces
//! launched from autograd's gradient-ready hooks while backward is still running.
//!
//! Each parameter gets a hook ([`cartage::Var::on_grad_ready`]). While a synced backward runs
//! (the reducer is *armed*), a hook counts its parameter as ready; when every parameter of the
//! next bucket to send is ready, the bucket is flattened into one tensor and its asynchronous
//! all-reduce (average) is queued at once, then the next bucket is checked, and so on. Buckets
//! leave strictly in plan order, as in PyTorch's DDP, so every rank issues the same collectives
//! in the same order even if its backward finishes gradients in another order. When backward
//! returns, the buckets left (parameters that got no gradient on this rank contribute zeros)
//! are queued, every bucket's averaged values become the gradients (views of the bucket, in
//! stream order), and the handles are waited on: after backward, before the optimizer step.
//!
//! Unarmed (a plain `loss.backward()`, or under `no_sync`), a hook returns at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cartage::autograd::GradHookId;
use cartage::distributed::{CollectiveHandle, ProcessGroup};
use cartage::{DType, ReduceKind, Result, Tensor, Var, VarId};

use super::Bucket;
use crate::ParamStore;

/// A bucket with its parameters, in the bucket's order.
pub(super) struct Planned {
    pub(super) bucket: Bucket,
    pub(super) vars: Vec<Var>,
}

/// The buckets of `store`'s parameters: reverse registration order (the order backward
/// finishes them), one dtype per bucket, at most `bucket_bytes` each unless one parameter is
/// larger.
pub(super) fn plan(store: &ParamStore, bucket_bytes: usize) -> Vec<Planned> {
    let mut open: Vec<Planned> = Vec::new();
    let mut done = Vec::new();
    for (name, var) in store.named_vars().into_iter().rev() {
        let dtype = var.dtype();
        let bytes = var.shape().iter().product::<usize>() * dtype.size_in_bytes();
        let slot = open.iter().position(|p| p.bucket.dtype == dtype);
        if let Some(i) = slot
            && open[i].bucket.bytes + bytes > bucket_bytes
        {
            done.push(open.remove(i));
        }
        match open.iter_mut().find(|p| p.bucket.dtype == dtype) {
            Some(p) => {
                p.bucket.names.push(name);
                p.bucket.bytes += bytes;
                p.vars.push(var);
            }
            None => open.push(Planned {
                bucket: Bucket {
                    names: vec![name],
                    dtype,
                    bytes,
                },
                vars: vec![var],
            }),
        }
    }
    done.extend(open);
    done
}

/// One backward pass's progress.
#[derive(Default)]
struct Pass {
    /// Per bucket, how many of its parameters are not ready yet.
    waiting: Vec<usize>,
    /// Which parameters were counted ready in this pass.
    seen: HashSet<VarId>,
    /// The next bucket to queue (buckets leave in plan order).
    next: usize,
    /// The queued buckets: their handles and flattened values.
    queued: Vec<(CollectiveHandle, Tensor)>,
}

/// Launches each bucket's all-reduce once its gradients are ready; see the module docs.
pub(super) struct Reducer {
    group: ProcessGroup,
    buckets: Vec<Planned>,
    /// Each parameter's bucket.
    bucket_of: HashMap<VarId, usize>,
    armed: AtomicBool,
    pass: Mutex<Pass>,
    hooks: Mutex<Vec<(Var, GradHookId)>>,
}

impl Reducer {
    /// A reducer over `buckets`, with a gradient-ready hook on each of their parameters.
    pub(super) fn new(group: ProcessGroup, buckets: Vec<Planned>) -> Arc<Reducer> {
        let bucket_of = buckets
            .iter()
            .enumerate()
            .flat_map(|(i, p)| p.vars.iter().map(move |v| (v.id(), i)))
            .collect();
        let reducer = Arc::new(Reducer {
            group,
            buckets,
            bucket_of,
            armed: AtomicBool::new(false),
            pass: Mutex::new(Pass::default()),
            hooks: Mutex::new(Vec::new()),
        });
        let weak: Weak<Reducer> = Arc::downgrade(&reducer);
        let mut hooks = Vec::new();
        for var in reducer.buckets.iter().flat_map(|p| &p.vars) {
            let weak = weak.clone();
            let id = var.on_grad_ready(Arc::new(move |var: &Var, _grad: &Tensor| match weak.upgrade() {
                Some(reducer) => reducer.ready(var.id()),
                None => Ok(()),
            }));
            hooks.push((var.clone(), id));
        }
        *reducer.hooks.lock().unwrap_or_else(|p| p.into_inner()) = hooks;
        reducer
    }

    /// The buckets, in the order they are sent.
    pub(super) fn buckets(&self) -> Vec<Bucket> {
        self.buckets.iter().map(|p| p.bucket.clone()).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Pass> {
        self.pass.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start a pass: every bucket waits for all its parameters.
    fn begin(&self) -> MutexGuard<'_, Pass> {
        let mut pass = self.lock();
        *pass = Pass {
            waiting: self.buckets.iter().map(|p| p.vars.len()).collect(),
            ..Pass::default()
        };
        pass
    }

    /// Backward from `loss` with the buckets launched as their gradients become ready, then
    /// average the rest and install the results.
    pub(super) fn backward(&self, loss: &Tensor) -> Result<()> {
        drop(self.begin());
        self.armed.store(true, Ordering::Release);
        let outcome = loss.backward();
        self.armed.store(false, Ordering::Release);
        outcome?;
        self.finish()
    }

    /// Average every bucket now, from the gradients as they are.
    pub(super) fn sync(&self) -> Result<()> {
        drop(self.begin());
        self.finish()
    }

    /// A hook: `id`'s gradient is final for this pass.
    fn ready(&self, id: VarId) -> Result<()> {
        if !self.armed.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(&bucket) = self.bucket_of.get(&id) else {
            return Ok(());
        };
        let mut pass = self.lock();
        if pass.seen.insert(id) {
            pass.waiting[bucket] -= 1;
        }
        self.launch_ready(&mut pass, false)
    }

    /// Queue buckets in plan order while the next one is complete (or all of them: `all`).
    fn launch_ready(&self, pass: &mut Pass, all: bool) -> Result<()> {
        let _plain = cartage::no_grad();
        while pass.next < self.buckets.len() && (all || pass.waiting[pass.next] == 0) {
            let planned = &self.buckets[pass.next];
            let joined = flatten(&planned.vars, planned.bucket.dtype)?;
            tracing::trace!(
                bucket = pass.next,
                bytes = planned.bucket.bytes,
                "all-reduce of a gradient bucket queued"
            );
            let handle = self.group.all_reduce(&joined, ReduceKind::Avg)?;
            pass.queued.push((handle, joined));
            pass.next += 1;
        }
        Ok(())
    }

    /// Queue the buckets left, install each bucket's average as its parameters' gradients, and
    /// wait for every all-reduce.
    fn finish(&self) -> Result<()> {
        let mut pass = self.lock();
        self.launch_ready(&mut pass, true)?;
        let queued = std::mem::take(&mut pass.queued);
        drop(pass);
        let _plain = cartage::no_grad();
        let mut handles = Vec::with_capacity(queued.len());
        for ((handle, joined), planned) in queued.into_iter().zip(&self.buckets) {
            let mut at = 0;
            for var in &planned.vars {
                let shape = var.shape();
                let numel = shape.iter().product::<usize>();
                var.set_grad(Some(joined.narrow(0, at, numel)?.reshape(&shape)?))?;
                at += numel;
            }
            handles.push(handle);
        }
        for handle in handles {
            handle.wait()?;
        }
        Ok(())
    }

    /// Remove the hooks (the wrapper is going away).
    pub(super) fn detach(&self) {
        for (var, id) in self.hooks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            var.remove_grad_hook(id);
        }
    }
}

/// The gradients of `vars` as one flat tensor (zeros for a parameter without one).
fn flatten(vars: &[Var], dtype: DType) -> Result<Tensor> {
    let flat: Vec<Tensor> = vars
        .iter()
        .map(|var| {
            let grad = match var.grad() {
                Some(g) => g,
                None => Tensor::zeros(&var.shape(), dtype, &var.device())?,
            };
            let numel = grad.numel();
            grad.reshape(&[numel])
        })
        .collect::<Result<_>>()?;
    let parts: Vec<&Tensor> = flat.iter().collect();
    Tensor::cat(&parts, 0)
}
