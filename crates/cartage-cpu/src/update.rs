//! `Kernel::Update`: one optimizer step (SGD or Adam/AdamW) over a parameter, its gradient and
//! its state in a single pass, in place, in f32 (f64 for f64), spread over rayon in chunks. The
//! per-element constants come from core ([`cartage_core::AdamUpdate::coefficients`]), so this
//! file holds only the arithmetic (shared with `Kernel::UpdateMany`, [`crate::update_many`]).

use cartage_core::kernel::UpdateSet;
use cartage_core::{AdamCoefficients, Device, Error, Result, SgdCoefficients, TensorArg, UpdateRule};

use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::fast_math::simd;
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS, SyncPtr, for_ranges_with};

/// `Kernel::Update`.
pub fn update(rule: &UpdateRule, grad: &TensorArg, state: &[Option<TensorArg>; 2], param: &TensorArg) -> Result<()> {
    let numel = param.layout.numel();
    with_float!(param.dtype, T => {
        let ptrs = Pointers::<T>::new(grad, state, param);
        match rule {
            UpdateRule::Adam(adam) => {
                let (Some(m), Some(v)) = (ptrs.first, ptrs.second) else {
                    return Err(missing_state("adam_update"));
                };
                let c = adam.coefficients();
                // SAFETY: launch validated the kernel: every operand is contiguous with `numel`
                // elements, the parameter and the state are writable and apart from each other
                // and from the gradient; chunks are disjoint.
                for_chunks(numel, |start, end| unsafe { adam_chunk::<T>(&c, &ptrs, m, v, start, end) });
            }
            UpdateRule::Sgd(sgd) => {
                let c = sgd.coefficients();
                if c.momentum != 0.0 && ptrs.first.is_none() {
                    return Err(missing_state("sgd_update"));
                }
                // SAFETY: as above.
                for_chunks(numel, |start, end| unsafe { sgd_chunk::<T>(&c, &ptrs, start, end) });
            }
        }
        Ok(())
    }, else Err(Error::unsupported(rule.kind().name(), param.dtype, Device::cpu(), "optimizer updates are defined for floats")))
}

#[cold]
pub(crate) fn missing_state(op: &'static str) -> Error {
    Error::invalid(
        op,
        "the update's state tensors reached the kernel missing; Kernel::validate requires them",
    )
}

/// The operands' first elements.
pub(crate) struct Pointers<T> {
    pub(crate) param: SyncPtr<T>,
    pub(crate) grad: SyncPtr<T>,
    pub(crate) first: Option<SyncPtr<T>>,
    pub(crate) second: Option<SyncPtr<T>>,
}

impl<T> Pointers<T> {
    fn new(grad: &TensorArg, state: &[Option<TensorArg>; 2], param: &TensorArg) -> Self {
        Pointers {
            param: base::<T>(param),
            grad: base::<T>(grad),
            first: state[0].as_ref().map(base::<T>),
            second: state[1].as_ref().map(base::<T>),
        }
    }

    /// The pointers of one set of a multi-tensor update.
    pub(crate) fn of(set: &UpdateSet) -> Self {
        Self::new(&set.grad, &set.state, &set.param)
    }
}

fn for_chunks(numel: usize, body: impl Fn(usize, usize) + Sync) {
    for_ranges_with(numel, PARALLEL_MIN_ELEMENTS, CHUNK_MIN_ELEMENTS, |start, end| {
        simd(
            #[inline(always)]
            || body(start, end),
        )
    });
}

/// # Safety
/// `[start, end)` lies inside every contiguous operand; no other thread touches these elements.
#[inline(always)]
pub(crate) unsafe fn adam_chunk<T: Real>(
    c: &AdamCoefficients,
    ptrs: &Pointers<T>,
    m: SyncPtr<T>,
    v: SyncPtr<T>,
    start: usize,
    end: usize,
) {
    let f = |x: f64| T::C::from_f64(x);
    let (decay, l2, b1, b2) = (f(c.decay), f(c.l2), f(c.one_minus_beta1), f(c.one_minus_beta2));
    let (inv_sqrt_bc2, step_size, eps) = (f(c.inv_sqrt_bc2), f(c.step_size), f(c.eps));
    for i in start..end {
        // SAFETY: the caller's contract.
        unsafe {
            let p = (*ptrs.param.add(i)).load();
            let g = (*ptrs.grad.add(i)).load() + l2 * p;
            let p = p * decay;
            let mi = (*m.add(i)).load();
            let vi = (*v.add(i)).load();
            let mi = mi + b1 * (g - mi);
            let vi = vi + b2 * (g * g - vi);
            let p = p - step_size * mi / (vi.sqrt() * inv_sqrt_bc2 + eps);
            *m.add(i) = T::store(mi);
            *v.add(i) = T::store(vi);
            *ptrs.param.add(i) = T::store(p);
        }
    }
}

/// # Safety
/// As [`adam_chunk`].
#[inline(always)]
pub(crate) unsafe fn sgd_chunk<T: Real>(c: &SgdCoefficients, ptrs: &Pointers<T>, start: usize, end: usize) {
    let f = |x: f64| T::C::from_f64(x);
    let (lr, wd, momentum, grad_scale) = (f(c.lr), f(c.weight_decay), f(c.momentum), f(c.grad_scale));
    for i in start..end {
        // SAFETY: the caller's contract.
        unsafe {
            let p = (*ptrs.param.add(i)).load();
            let mut g = (*ptrs.grad.add(i)).load() + wd * p;
            if let Some(buf) = ptrs.first {
                let b = if c.first_step {
                    g
                } else {
                    momentum * (*buf.add(i)).load() + grad_scale * g
                };
                *buf.add(i) = T::store(b);
                // The rounded buffer, as a composite update would read it back.
                let b = (*buf.add(i)).load();
                g = if c.nesterov { g + momentum * b } else { b };
            }
            *ptrs.param.add(i) = T::store(p - lr * g);
        }
    }
}
