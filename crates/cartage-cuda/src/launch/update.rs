//! The fused optimizer step ([`cartage_core::Kernel::Update`]): one grid-stride launch per
//! parameter over the parameter, its gradient and its state, in 16-byte vectors when every operand
//! is 16-byte aligned (the operands are contiguous: `Kernel::validate` requires it). The constants
//! come from core's [`AdamUpdate::coefficients`](cartage_core::AdamUpdate::coefficients) and
//! [`SgdUpdate::coefficients`](cartage_core::SgdUpdate::coefficients), rounded to the compute
//! type (f32, f64 for f64) as the CPU backend rounds them.

use cartage_core::{AdamCoefficients, DType, Error, Result, SgdCoefficients, TensorArg, UpdateKind, UpdateRule};
use cudarc::driver::DeviceRepr;

use super::geometry::grid;
use super::{aligned16, device_ptr, lanes, launch_kernel, max_blocks};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, SourceFile};

/// The dtypes the update kernels are built for (`update.cu`).
pub(crate) const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A kernel's compute type: f32, or f64 for f64 operands.
pub(super) trait ComputeType: Copy {
    fn of(value: f64) -> Self;
}

impl ComputeType for f32 {
    fn of(value: f64) -> Self {
        value as f32
    }
}

impl ComputeType for f64 {
    fn of(value: f64) -> Self {
        value
    }
}

/// `struct AdamArgs<C>` of update.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct AdamArgs<C> {
    n: u64,
    vectors: u64,
    decay: C,
    l2: C,
    one_minus_beta1: C,
    one_minus_beta2: C,
    inv_sqrt_bc2: C,
    step_size: C,
    eps: C,
}

impl<C: ComputeType> AdamArgs<C> {
    pub(super) fn new(c: &AdamCoefficients, n: u64, vectors: u64) -> Self {
        AdamArgs {
            n,
            vectors,
            decay: C::of(c.decay),
            l2: C::of(c.l2),
            one_minus_beta1: C::of(c.one_minus_beta1),
            one_minus_beta2: C::of(c.one_minus_beta2),
            inv_sqrt_bc2: C::of(c.inv_sqrt_bc2),
            step_size: C::of(c.step_size),
            eps: C::of(c.eps),
        }
    }
}

/// `struct SgdArgs<C>` of update.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct SgdArgs<C> {
    n: u64,
    vectors: u64,
    lr: C,
    weight_decay: C,
    momentum: C,
    grad_scale: C,
    flags: i32,
    pad: i32,
}

/// `SgdArgs::flags`: the update keeps a momentum buffer.
const HAS_BUFFER: i32 = 1;
/// `SgdArgs::flags`: Nesterov momentum.
const NESTEROV: i32 = 2;
/// `SgdArgs::flags`: the buffer is created on this step (written as the gradient, not read).
const FIRST_STEP: i32 = 4;

impl<C: ComputeType> SgdArgs<C> {
    pub(super) fn new(c: &SgdCoefficients, n: u64, vectors: u64) -> Self {
        let flags = if c.momentum != 0.0 { HAS_BUFFER } else { 0 }
            | if c.nesterov { NESTEROV } else { 0 }
            | if c.first_step { FIRST_STEP } else { 0 };
        SgdArgs {
            n,
            vectors,
            lr: C::of(c.lr),
            weight_decay: C::of(c.weight_decay),
            momentum: C::of(c.momentum),
            grad_scale: C::of(c.grad_scale),
            flags,
            pad: 0,
        }
    }
}

// SAFETY: plain `repr(C)` data with the layout of the C structs the kernels declare (f32 and f64
// instantiations).
unsafe impl DeviceRepr for AdamArgs<f32> {}
// SAFETY: as above.
unsafe impl DeviceRepr for AdamArgs<f64> {}
// SAFETY: as above.
unsafe impl DeviceRepr for SgdArgs<f32> {}
// SAFETY: as above.
unsafe impl DeviceRepr for SgdArgs<f64> {}

/// `<sgd|adam>_update_<dtype>`.
fn kernel_name(kind: UpdateKind, dtype: DType) -> KernelName {
    KernelName::new(SourceFile::Update, [kind.name(), dtype.name(), "", ""])
}

/// One optimizer step in place on `param` and its `state`, from `grad`.
pub(super) fn update(
    backend: &CudaBackend,
    rule: &UpdateRule,
    grad: &TensorArg,
    state: &[Option<TensorArg>; 2],
    param: &TensorArg,
) -> Result<()> {
    let op = rule.kind().name();
    let states: Vec<&TensorArg> = state.iter().flatten().collect();
    if states.len() != rule.state_count() {
        return Err(Error::invalid(
            op,
            format!(
                "the rule keeps {} state tensor(s) but {} reached the kernel; Kernel::validate requires them",
                rule.state_count(),
                states.len()
            ),
        ));
    }
    let n = param.layout.numel() as u64;
    if n == 0 {
        return Ok(());
    }
    let dtype = param.dtype;
    let mut operands = vec![param, grad];
    operands.extend(&states);
    let lanes = lanes(dtype);
    let vectors = if aligned16(&operands) { n / lanes } else { 0 };
    let kernel = backend.modules.kernel(kernel_name(rule.kind(), dtype))?;
    // Each thread takes vectors, then the elements past them, grid-stride.
    let cfg = grid(vectors.max(n - vectors * lanes), max_blocks(backend, &kernel));
    let slices: Vec<_> = operands.iter().map(|a| a.buffer).collect();
    let (pp, pg) = (device_ptr(param), device_ptr(grad));
    let wide = dtype == DType::F64;
    match rule {
        UpdateRule::Adam(adam) => {
            let c = adam.coefficients();
            let (pm, pv) = (device_ptr(states[0]), device_ptr(states[1]));
            if wide {
                let args = AdamArgs::<f64>::new(&c, n, vectors);
                launch_kernel!(backend, kernel, cfg, slices, &pp, &pg, &pm, &pv, &args)
            } else {
                let args = AdamArgs::<f32>::new(&c, n, vectors);
                launch_kernel!(backend, kernel, cfg, slices, &pp, &pg, &pm, &pv, &args)
            }
        }
        UpdateRule::Sgd(sgd) => {
            let c = sgd.coefficients();
            // No buffer without momentum: the kernel never touches the address then.
            let pb = states.first().map_or(0, |s| device_ptr(s));
            if wide {
                let args = SgdArgs::<f64>::new(&c, n, vectors);
                launch_kernel!(backend, kernel, cfg, slices, &pp, &pg, &pb, &args)
            } else {
                let args = SgdArgs::<f32>::new(&c, n, vectors);
                launch_kernel!(backend, kernel, cfg, slices, &pp, &pg, &pb, &args)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cartage_core::{AdamUpdate, SgdUpdate};

    use super::*;

    #[test]
    fn every_rule_and_dtype_is_built() {
        let entries = crate::precompiled::entry_names(SourceFile::Update);
        for kind in UpdateKind::ALL {
            for dtype in DTYPES {
                let symbol = kernel_name(kind, dtype).symbol();
                assert!(entries.contains(&symbol.as_str()), "{symbol} is not built");
            }
        }
    }

    #[test]
    fn args_match_the_c_layout() {
        // 2 × u64 then the constants, padded to 8 bytes.
        assert_eq!(std::mem::size_of::<AdamArgs<f32>>(), 16 + 7 * 4 + 4);
        assert_eq!(std::mem::size_of::<AdamArgs<f64>>(), 16 + 7 * 8);
        assert_eq!(std::mem::size_of::<SgdArgs<f32>>(), 16 + 4 * 4 + 8);
        assert_eq!(std::mem::size_of::<SgdArgs<f64>>(), 16 + 4 * 8 + 8);
        // (param, grad, exp_avg, exp_avg_sq, args) and (param, grad, buffer, args), as pushed.
        let params = |kind, dtype| {
            let name = kernel_name(kind, dtype);
            super::super::ptx_param_bytes(name.file, &name.symbol())
        };
        let (adam32, adam64) = (size_of::<AdamArgs<f32>>(), size_of::<AdamArgs<f64>>());
        let (sgd32, sgd64) = (size_of::<SgdArgs<f32>>(), size_of::<SgdArgs<f64>>());
        assert_eq!(params(UpdateKind::Adam, DType::F32), [8, 8, 8, 8, adam32]);
        assert_eq!(params(UpdateKind::Adam, DType::BF16), [8, 8, 8, 8, adam32]);
        assert_eq!(params(UpdateKind::Adam, DType::F64), [8, 8, 8, 8, adam64]);
        assert_eq!(params(UpdateKind::Sgd, DType::F16), [8, 8, 8, sgd32]);
        assert_eq!(params(UpdateKind::Sgd, DType::F64), [8, 8, 8, sgd64]);
    }

    #[test]
    fn sgd_flags_follow_the_rule() {
        let plain = SgdUpdate {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            first_step: true,
        };
        let args = |u: SgdUpdate| SgdArgs::<f32>::new(&u.coefficients(), 10, 2).flags;
        // Without momentum there is no buffer, whatever the step.
        assert_eq!(args(plain), FIRST_STEP);
        assert_eq!(args(plain) & HAS_BUFFER, 0);
        let nesterov = SgdUpdate {
            momentum: 0.9,
            nesterov: true,
            first_step: false,
            ..plain
        };
        assert_eq!(args(nesterov), HAS_BUFFER | NESTEROV);
        let damped = SgdArgs::<f64>::new(
            &SgdUpdate {
                momentum: 0.9,
                dampening: 0.25,
                ..plain
            }
            .coefficients(),
            10,
            2,
        );
        assert_eq!((damped.flags, damped.grad_scale), (HAS_BUFFER | FIRST_STEP, 0.75));
    }

    #[test]
    fn adam_constants_are_rounded_to_the_compute_type() {
        let c = AdamUpdate {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decoupled: true,
            step: 3,
        }
        .coefficients();
        let narrow = AdamArgs::<f32>::new(&c, 1, 0);
        let wide = AdamArgs::<f64>::new(&c, 1, 0);
        assert_eq!(narrow.step_size, c.step_size as f32);
        assert_eq!(wide.step_size, c.step_size);
        assert_eq!((wide.decay, wide.l2), (1.0 - 1e-3 * 0.01, 0.0));
        assert_eq!(wide.inv_sqrt_bc2, c.inv_sqrt_bc2);
    }
}
