//! cuDNN's fused attention on the layouts a model hands it beyond `[B, L, E]`, on `cuda:0`,
//! against cartage's flash kernels (`AttentionApi::Kernel`, checked against the host by the
//! conformance suite and `cuda_attention_cudnn`) on the same operands: an additive mask (a
//! key-padding mask broadcast over heads and rows, and a full mask per head with a row that sees
//! no key) as cuDNN's bias, and the heads of a packed `[N, L, 3, H, E]` projection read in place
//! as two batch dimensions, with the output written as the heads of an `[N, L, H, E]` block. The
//! forward's output and log-sum-exp, then the three gradients from the saved output, in bf16
//! and f16; cuDNN must have run each case (`CudaBackend::attention_choices`).
//!
//! Without a CUDA device every test prints a SKIP line (`CARTAGE_REQUIRE=cuda` makes it fail);
//! without cuDNN too. cuDNN's own log says why it refused a graph:
//! `CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr RUST_LOG=cartage_cuda=debug`.

mod common;

use std::sync::Arc;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionMask, AttentionSaved};
use cartage_core::{Backend, DType, DeviceBuffer, Kernel, Layout, TensorArg};
use cartage_cuda::{AttentionApi, AttentionPass, CudaBackend};
use common::attention::{Restore, cudnn_backend as backend, one_at_a_time, relative_worst};

/// The mask of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum MaskKind {
    /// None.
    None,
    /// `[N, 1, 1, S]` broadcast to `[N, H, L, S]`: batch entry n sees its first `S − 37·n`
    /// keys.
    Padding,
    /// A full `[N, H, L, S]` mask of values in [−1, 1) with some −inf, and row 5 of the first
    /// head all −inf (it sees no key: 0 out, −inf log-sum-exp).
    Full,
}

/// One case: N sequences of H heads, L = S positions, head dim E, the operands packed as
/// `[N, L, 3, H, E]` (two batch dimensions read in place) or dense `[N·H, L, E]`.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    h: usize,
    l: usize,
    e: usize,
    causal: bool,
    mask: MaskKind,
    packed: bool,
}

impl Case {
    fn scale(&self) -> f64 {
        1.0 / (self.e as f64).sqrt()
    }

    /// Elements of one of q, k, v, out, dO.
    fn numel(&self) -> usize {
        self.n * self.h * self.l * self.e
    }

    /// q, k or v (`which` 0, 1, 2) over `buf`: heads of the packed projection, or dense.
    fn operand(&self, buf: &DeviceBuffer, which: usize, dtype: DType) -> TensorArg {
        let (n, h, l, e) = (self.n, self.h, self.l, self.e);
        let layout = if self.packed {
            Layout::from_parts(&[n, h, l, e], &[l * 3 * h * e, e, 3 * h * e, 1], which * h * e)
        } else {
            Layout::from_parts(&[n * h, l, e], &[l * e, e, 1], which * n * h * l * e)
        };
        buf.arg(layout.expect("layout"), dtype)
    }

    /// The forward's output over `buf`: the heads of an `[N, L, H, E]` block, or dense.
    fn output(&self, buf: &DeviceBuffer, dtype: DType) -> TensorArg {
        let (n, h, l, e) = (self.n, self.h, self.l, self.e);
        let layout = if self.packed {
            Layout::from_parts(&[n, h, l, e], &[l * h * e, e, h * e, 1], 0)
        } else {
            Layout::contiguous(&[n * h, l, e])
        };
        buf.arg(layout.expect("layout"), dtype)
    }

    /// A contiguous gradient in the operands' shape.
    fn dense(&self, buf: &DeviceBuffer, dtype: DType) -> TensorArg {
        let shape: &[usize] = if self.packed {
            &[self.n, self.h, self.l, self.e]
        } else {
            &[self.n * self.h, self.l, self.e]
        };
        common::arg(buf, shape, dtype)
    }

    /// The mask over `buf`, if the case has one.
    fn mask(&self, buf: &DeviceBuffer, dtype: DType) -> Option<AttentionMask> {
        let (n, h, l) = (self.n, self.h, self.l);
        let layout = match self.mask {
            MaskKind::None => return None,
            MaskKind::Padding => Layout::from_parts(&[n, h, l, l], &[l, 0, 0, 1], 0),
            MaskKind::Full => Layout::contiguous(&[n, h, l, l]),
        };
        Some(AttentionMask {
            values: buf.arg(layout.expect("layout"), dtype),
        })
    }

    /// The mask's values in memory.
    fn mask_values(&self, dtype: DType) -> Vec<f64> {
        let (n, h, l) = (self.n, self.h, self.l);
        match self.mask {
            MaskKind::None => vec![0.0],
            MaskKind::Padding => (0..n * l)
                .map(|i| {
                    if i % l < l - 37 * (i / l) {
                        0.0
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect(),
            MaskKind::Full => common::values(n * h * l * l, 99, dtype)
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    let row = i / l;
                    if row == 5 || (v > 3.0 && i % l != row % l) {
                        f64::NEG_INFINITY
                    } else {
                        common::round(v / 4.0, dtype)
                    }
                })
                .collect(),
        }
    }
}

/// One run's outputs read back: out (the whole block), lse, and after the backward dq, dk, dv.
struct Ran {
    out: Vec<f64>,
    lse: Vec<f64>,
    grads: [Vec<f64>; 3],
}

/// The forward with `lse`, then the backward from its saved output, under `api`.
fn run(b: &Arc<dyn Backend>, cuda: &CudaBackend, api: AttentionApi, c: &Case, dtype: DType, seed: u64) -> Ran {
    cuda.set_attention_api(api);
    let numel = c.numel();
    let round = |v: Vec<f64>| v.into_iter().map(|x| common::round(x / 2.0, dtype)).collect::<Vec<_>>();
    let qkv = common::upload(b, &round(common::values(3 * numel, seed, DType::F64)), dtype);
    let d_o = common::upload(b, &round(common::values(numel, seed + 1, DType::F64)), dtype);
    let mask_buf = common::upload(b, &c.mask_values(dtype), dtype);
    let out = common::poisoned(b, numel, dtype);
    let lse = common::poisoned(b, c.n * c.h * c.l, DType::F32);
    let [q, k, v] = [0, 1, 2].map(|i| c.operand(&qkv, i, dtype));
    let mask = c.mask(&mask_buf, dtype);
    let lse_arg = common::arg(&lse, &[c.n * c.h, c.l], DType::F32);
    Kernel::Attention {
        q: q.clone(),
        k: k.clone(),
        v: v.clone(),
        scale: c.scale(),
        causal: c.causal,
        mask: mask.clone().map(Box::new),
        out: c.output(&out, dtype),
        lse: Some(lse_arg.clone()),
    }
    .run(&[&qkv, &mask_buf, &out, &lse])
    .unwrap_or_else(|e| panic!("attention {api:?} {dtype} {c:?}: {e}"));
    let grads: Vec<DeviceBuffer> = (0..3).map(|_| common::poisoned(b, numel, dtype)).collect();
    Kernel::AttentionBackward(Box::new(AttentionBackwardArgs {
        q,
        k,
        v,
        grad: c.dense(&d_o, dtype),
        scale: c.scale(),
        causal: c.causal,
        mask,
        grad_q: c.dense(&grads[0], dtype),
        grad_k: c.dense(&grads[1], dtype),
        grad_v: c.dense(&grads[2], dtype),
        saved: Some(AttentionSaved {
            out: c.output(&out, dtype),
            lse: lse_arg,
        }),
    }))
    .run(&[&qkv, &d_o, &mask_buf, &out, &lse, &grads[0], &grads[1], &grads[2]])
    .unwrap_or_else(|e| panic!("attention_backward {api:?} {dtype} {c:?}: {e}"));
    Ran {
        out: common::download(&out, numel, dtype),
        lse: common::download(&lse, c.n * c.h * c.l, DType::F32),
        grads: [0, 1, 2].map(|i| common::download(&grads[i], numel, dtype)),
    }
}

/// Each side rounds P and dS to the dtype for its products: twice a few of its units.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 5e-2,
        _ => 8e-3,
    }
}

/// cuDNN must have run both passes of `c`.
fn check_ran_cudnn(cuda: &CudaBackend, c: &Case, dtype: DType) {
    for pass in [AttentionPass::Forward, AttentionPass::Backward] {
        let ran = cuda.attention_choices().into_iter().find(|ch| {
            ch.pass == pass
                && ch.dtype == dtype
                && ch.causal == c.causal
                && ch.masked == (c.mask != MaskKind::None)
                && ch.sizes == [c.n * c.h, c.l, c.l, c.e, c.e]
        });
        assert!(
            ran.as_ref().is_some_and(|ch| ch.cudnn),
            "{} {dtype} {c:?}: cuDNN's fused attention did not run under AttentionApi::Cudnn ({ran:?}); run \
             with CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr RUST_LOG=cartage_cuda=debug to see why",
            pass.op()
        );
    }
}

fn check_case(b: &Arc<dyn Backend>, cuda: &CudaBackend, c: &Case, dtype: DType, seed: u64) {
    let what = format!("{dtype} {c:?}");
    let cudnn = run(b, cuda, AttentionApi::Cudnn, c, dtype, seed);
    check_ran_cudnn(cuda, c, dtype);
    let kernel = run(b, cuda, AttentionApi::Kernel, c, dtype, seed);
    let tol = tolerance(dtype);
    let err = relative_worst("out", &cudnn.out, &kernel.out, 1e-3);
    assert!(err <= tol, "out {what}: worst difference {err:.3e} from the kernel");
    for (i, (g, k)) in cudnn.lse.iter().zip(&kernel.lse).enumerate() {
        let same = if k.is_finite() {
            (g - k).abs() <= 1e-3 * (1.0 + k.abs())
        } else {
            g == k
        };
        assert!(same, "lse {what} row {i}: cuDNN {g}, the kernel {k}");
    }
    if c.mask == MaskKind::Full {
        // Row 5 of the first head sees no key: 0, as the kernel contract says.
        let row = &cudnn.out[5 * c.e..][..c.e];
        assert!(
            row.iter().all(|&x| x == 0.0),
            "out {what}: the row that sees no key is {row:?}"
        );
    }
    let largest = kernel.grads.iter().flatten().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (n, name) in ["grad_q", "grad_k", "grad_v"].into_iter().enumerate() {
        let err = relative_worst(name, &cudnn.grads[n], &kernel.grads[n], 0.1 * largest);
        assert!(err <= tol, "{name} {what}: worst difference {err:.3e} from the kernel");
    }
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for causal in [false, true] {
        for (mask, packed) in [
            (MaskKind::Padding, false),
            (MaskKind::Full, false),
            (MaskKind::None, true),
            (MaskKind::Padding, true),
        ] {
            cases.push(Case {
                n: 2,
                h: 4,
                l: 256,
                e: 64,
                causal,
                mask,
                packed,
            });
        }
    }
    cases.push(Case {
        n: 3,
        h: 2,
        l: 128,
        e: 128,
        causal: true,
        mask: MaskKind::None,
        packed: true,
    });
    cases
}

/// Masks as cuDNN's bias and packed heads as two batch dimensions, against the kernels.
#[test]
fn cudnn_takes_masks_and_packed_heads() {
    let _serial = one_at_a_time();
    let Some((b, cuda)) = backend("cudnn_takes_masks_and_packed_heads") else {
        return;
    };
    let _restore = Restore::new(&cuda);
    for dtype in [DType::BF16, DType::F16] {
        for (i, c) in cases().iter().enumerate() {
            check_case(&b, &cuda, c, dtype, 17 * i as u64);
        }
    }
}
