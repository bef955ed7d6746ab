//! Scaled dot-product attention through cuDNN's fused flash attention (graph API), chosen per
//! shape against cartage's own flash kernels (`launch::attention`, `launch::attention_backward`).
//!
//! - The forward and backward are the operation graphs cudnn-frontend's `sdpa` and
//!   `sdpa_backward` build (`forward_graph`, `backward_graph`, `scores`), which cuDNN recognises
//!   as its fused attention (on Hopper, its warp-specialised kernels). cartage's operands are
//!   described as `[b, h, s, d]` with their real strides (`batch_split`): `[B1, B2, L, E]` (the
//!   heads of a packed projection) as `b = B1`, `h = B2`; `[B, L, E]` (B = batch · heads, merged
//!   by the frontend) as `b = B`, `h = 1`, or, with a mask, split as the mask splits the batch.
//!   Kᵀ (and Vᵀ in the backward) by swapping the last two dims and strides, as the frontend
//!   does. The causal mask is top-left, as cartage's; the additive mask is cuDNN's bias
//!   (`Bias`: `[outer, 1 or inner, L, S]` in the I/O dtype, a broadcast batch or row keeping
//!   stride 0), added to the scaled scores in both passes (no bias gradient: the kernel
//!   contract computes none).
//! - The forward always writes cuDNN's softmax statistics `max + ln Σ exp`, which is exactly the
//!   natural log-sum-exp cartage keeps in `lse` (`[B, L]` f32): into `lse` when the call has one,
//!   else into a scratch block. The backward recomputes the probabilities from the saved `lse`,
//!   so it runs only with [`cartage_core::kernel::AttentionBackwardArgs::saved`].
//! - Taken: bf16 and f16 (f32 compute), head dims that are multiples of 8 up to 256 (cuDNN's
//!   engines decide the rest: 64 and 128 run everywhere from Ampere on), a dense last dimension
//!   and no broadcast batch or row stride, a mask with a dense last dimension whose rows start
//!   on 16 bytes and that splits two batch dimensions as they are, non-empty sizes. The
//!   backward is also refused for key lengths not a multiple of 128 before cuDNN 9.15.1
//!   (cudnn-frontend works around a bug there with a padding mask, which this graph does not
//!   carry), and with a mask for any such key length. Anything else returns
//!   `Ok(false)`, and cartage's kernel runs (or refuses with `Unsupported`, and the frontend
//!   composes the op).
//! - Which runs ([`AttentionApi`], [`crate::CudaBackend::set_attention_api`],
//!   `CARTAGE_ATTENTION_API`): under `Auto` with the cuDNN algorithm search on
//!   ([`crate::CudaBackend::set_conv_benchmark`], `CARTAGE_CUDNN_BENCHMARK`, on by default), the
//!   first call of a shape (outside a graph capture) builds the graph, times up to
//!   [`SEARCH_COUNT`] of cuDNN's engines on the call's own operands with scratch outputs, times
//!   cartage's kernel the same way (`cudnn_graph::timing`), and the faster runs from then on;
//!   with the search off cartage's kernel runs. `Cudnn` runs cuDNN whenever it can; `Kernel`
//!   never. Plans are cached per pass, sizes, strides, alignment, dtype, mask and search setting
//!   beside the convolutions' (one cuDNN handle per device, on the compute stream).
//! - A graph that does not finalize, an engine that refuses at execution, no workspace: logged
//!   (`tracing` debug), and cartage's kernel runs. No plan is built and nothing is timed inside a
//!   graph capture (a call captured first runs the kernel); a plan built earlier runs there too.
//! - [`crate::CudaBackend::attention_choices`] reports what each shape ran.
//!
//! When cuDNN refuses a graph, its own log says why: run with
//! `CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr` (cuDNN 9; 2 for warnings and errors only) and
//! `RUST_LOG=cartage_cuda=debug` for what this module logged.

mod backward_graph;
mod choice;
mod forward_graph;
mod scores;

use std::collections::HashMap;
use std::ffi::c_void;

use cartage_core::kernel::{AttentionBackwardArgs, AttentionMask, AttentionSaved};
use cartage_core::raw::Allocation;
use cartage_core::{DType, Device, Error, Kernel, Layout, Result, Scalar, TensorArg};
use cudarc::cudnn::sys;
use cudarc::driver::LaunchConfig;

pub(crate) use choice::AttentionSwitch;
use choice::kernel_words;
pub use choice::{ATTENTION_API_VAR, AttentionApi, AttentionChoice, AttentionPass};

use crate::backend::CudaBackend;
use crate::cudnn_graph::builder::OpGraph;
use crate::cudnn_graph::descriptor::Failure;
use crate::cudnn_graph::engines::{self, ExecPlan};
use crate::cudnn_graph::{execute, timing};
use crate::launch::device_ptr;
use crate::modules::{KernelName, SourceFile};

/// cuDNN engines timed per shape at most.
pub(crate) const SEARCH_COUNT: usize = 4;

/// The largest workspace an engine may ask for.
const WORKSPACE_LIMIT: usize = 1 << 30;

/// What a plan depends on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// Forward or backward.
    pub(crate) pass: AttentionPass,
    /// bf16 or f16.
    pub(crate) dtype: DType,
    /// The causal mask.
    pub(crate) causal: bool,
    /// `[b, h, L, S, E, Ev]`: the batch as cuDNN's two batch dims (see [`batch_split`]).
    pub(crate) sizes: [usize; 6],
    /// (b, h, row) strides of q, k, v, the output (the forward's `out`, the backward's saved
    /// output) and, for the backward, dO (zeros in the forward); size-1 dims given dense
    /// strides.
    pub(crate) strides: [[i64; 3]; 5],
    /// The additive mask as cuDNN's bias, if any.
    pub(crate) bias: Option<Bias>,
    /// Byte alignment of the operands: forward q, k, v, out, lse; backward q, k, v, o, dO, lse,
    /// dq, dk, dv (zeros after the last); then the mask's (0 without one).
    pub(crate) alignment: [i64; 10],
    /// Whether the search orders this plan's engines.
    pub(crate) benchmark: bool,
}

impl Key {
    /// `[B, L, S, E, Ev]` with B = b · h, as [`AttentionChoice`] reports them.
    fn merged_sizes(&self) -> [usize; 5] {
        let [b, h, l, s, e, ev] = self.sizes;
        [b * h, l, s, e, ev]
    }
}

/// cartage's additive mask as the graph's bias tensor `[b, h', L, S]` (in q's dtype): h' is 1
/// where the mask is the same for every head (stride 0), and a batch or row the mask broadcasts
/// keeps stride 0, as cudnn-frontend's users describe an expanded mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Bias {
    /// `[b, h', L, S]`.
    pub(crate) dims: [i64; 4],
    /// Element strides (the last is 1).
    pub(crate) strides: [i64; 4],
}

/// The cuDNN plans of one key.
pub(crate) struct Plan {
    /// Finalized plans: the heuristics' order, or the search's (fastest first).
    candidates: Vec<ExecPlan>,
    /// True once the search has run.
    searched: bool,
    /// True once cuDNN's best was timed against cartage's kernel.
    compared: bool,
    /// Whether cuDNN runs this key under [`AttentionApi::Auto`].
    use_cudnn: bool,
    /// The kernel's time in the comparison.
    kernel_ms: Option<f32>,
    /// The operation graph (dropped after the plans).
    _graph: OpGraph,
}

/// What one key ran last.
#[derive(Clone, Debug)]
struct Ran {
    cudnn: bool,
    implementation: String,
    cudnn_ms: Option<f32>,
    kernel_ms: Option<f32>,
}

/// Every attention plan of a handle (or why cuDNN could not plan that key), and what each key
/// ran last.
#[derive(Default)]
pub(crate) struct Plans {
    plans: HashMap<Key, std::result::Result<Plan, String>>,
    ran: HashMap<Key, Ran>,
}

impl Plans {
    /// Drop every plan (before the handle goes).
    pub(crate) fn clear(&mut self) {
        self.plans.clear();
        self.ran.clear();
    }
}

/// The byte alignment cuDNN is told for `arg`.
fn alignment(arg: &TensorArg) -> i64 {
    if device_ptr(arg).is_multiple_of(16) {
        16
    } else {
        arg.dtype.size_in_bytes() as i64
    }
}

/// How the call's batch splits into cuDNN's `[b, h]`: two batch dimensions as they are; with a
/// mask, the mask's `[outer, inner]` split (operands with two batch dimensions must split as it
/// does); else `[B, 1]`. `None` when the mask splits two batch dimensions differently.
fn batch_split(q: &TensorArg, mask: Option<&AttentionMask>) -> Option<[usize; 2]> {
    let shape = q.layout.shape();
    match (shape.len(), mask.map(AttentionMask::batch_split)) {
        (4, None) => Some([shape[0], shape[1]]),
        (4, Some((outer, inner))) => ((outer, inner) == (shape[0], shape[1])).then_some([outer, inner]),
        (_, Some((outer, inner))) => Some([outer, inner]),
        _ => Some([shape[0], 1]),
    }
}

/// The (b, h, row) strides of a `[B, rows, width]` or `[B1, B2, rows, width]` operand seen as
/// `[b, h, rows, width]` (`split` = `[b, h]`, b · h = B), size-1 dims given dense strides, or
/// `None` for a layout the graph does not take (a last dim that is not dense, a broadcast dim).
fn split_strides(arg: &TensorArg, split: [usize; 2]) -> Option<[i64; 3]> {
    strides_of(arg.layout.shape(), arg.layout.strides(), split)
}

/// [`split_strides`] of a shape and its strides.
fn strides_of(shape: &[usize], st: &[usize], [b, h]: [usize; 2]) -> Option<[i64; 3]> {
    let n = shape.len();
    let (rows, width) = (shape[n - 2], shape[n - 1]);
    if st[n - 1] != 1 && width > 1 {
        return None;
    }
    let row = if rows == 1 { width } else { st[n - 2] };
    let (batch, head) = if n == 3 {
        // One batch stride: entry (i, j) of [b, h] is entry i·h + j.
        let whole = if shape[0] == 1 { rows * row } else { st[0] };
        (h * whole, whole)
    } else {
        if [shape[0], shape[1]] != [b, h] {
            return None;
        }
        let head = if h == 1 { rows * row } else { st[1] };
        (if b == 1 { h * head } else { st[0] }, head)
    };
    (row > 0 && head > 0 && batch > 0).then_some([batch as i64, head as i64, row as i64])
}

/// The mask as the graph's bias (see [`Bias`]), or `None` for one the graph does not take (a
/// last dim that is not dense, rows or a batch not on 16 bytes).
fn bias_of(mask: &AttentionMask, dtype: DType) -> Option<Bias> {
    bias_from(mask.values.layout.shape(), mask.values.layout.strides(), dtype)
}

/// [`bias_of`] of the mask's shape `[outer, inner, L, S]` and strides.
fn bias_from(shape: &[usize], st: &[usize], dtype: DType) -> Option<Bias> {
    let [outer, inner, l, s] = [shape[0], shape[1], shape[2], shape[3]];
    if st[3] != 1 && s > 1 {
        return None;
    }
    let heads = if st[1] == 0 { 1 } else { inner };
    let row = if l == 1 { s } else { st[2] };
    let head = if heads == 1 { l.max(1) * row.max(s) } else { st[1] };
    let batch = if outer == 1 { heads * head } else { st[0] };
    let strides = [batch, head, row, 1].map(|x| x as i64);
    // Rows and entries on 16 bytes, as for the operands (0 is a broadcast).
    let on_16 = strides[..3]
        .iter()
        .all(|&x| (x as usize * dtype.size_in_bytes()).is_multiple_of(16));
    on_16.then_some(Bias {
        dims: [outer, heads, l, s].map(|x| x as i64),
        strides,
    })
}

/// The cuDNN version (`cudnnGetVersion`), once cuDNN is known loaded.
fn version() -> usize {
    // SAFETY: the library and symbol are present (`graph_available` checked both); no
    // arguments.
    unsafe { sys::cudnnGetVersion() }
}

/// The key of a call, or why the graph does not take it. `inputs` are q, k, v (and for the
/// backward the saved output and dO); `outputs` the forward's out and statistics, or the
/// backward's statistics (read) and three gradients.
fn key(
    pass: AttentionPass,
    causal: bool,
    benchmark: bool,
    inputs: &[&TensorArg],
    outputs: &[&TensorArg],
    mask: Option<&AttentionMask>,
) -> std::result::Result<Key, String> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    if !matches!(q.dtype, DType::BF16 | DType::F16) {
        return Err(format!("cuDNN's fused attention takes bf16 and f16, not {}", q.dtype));
    }
    let split = batch_split(q, mask).ok_or_else(|| {
        "the mask splits the batch otherwise than the operands' two batch dimensions; the flash kernels run it"
            .to_string()
    })?;
    let rows = |arg: &TensorArg| arg.layout.shape()[arg.layout.rank() - 2];
    let width = |arg: &TensorArg| arg.layout.shape()[arg.layout.rank() - 1];
    let sizes = [split[0], split[1], rows(q), rows(k), width(q), width(v)];
    let [b, h, l, s, e, ev] = sizes;
    if b * h == 0 || l == 0 || s == 0 {
        return Err("an empty batch or sequence".into());
    }
    if !(e.is_multiple_of(8) && ev.is_multiple_of(8) && e <= 256 && ev <= 256 && e > 0 && ev > 0) {
        return Err(format!(
            "cuDNN's fused attention takes head dims that are multiples of 8 up to 256, got E = {e}, Ev = {ev}"
        ));
    }
    // The operands whose strides the graph carries: q, k, v, then the forward's output or the
    // backward's saved output and dO.
    let strided: Vec<&TensorArg> = match pass {
        AttentionPass::Forward => vec![q, k, v, outputs[0]],
        AttentionPass::Backward => inputs.to_vec(),
    };
    let mut strides = [[0i64; 3]; 5];
    for (i, arg) in strided.iter().enumerate() {
        strides[i] = split_strides(arg, split).ok_or_else(|| {
            format!(
                "operand {i} has strides {:?}; cuDNN's fused attention reads a dense last dimension and no broadcast",
                arg.layout.strides()
            )
        })?;
    }
    if pass == AttentionPass::Backward && !outputs[1..].iter().all(|g| g.layout.is_contiguous()) {
        return Err("the backward's graph writes contiguous gradients".into());
    }
    // cuDNN's attention engines load 16-byte vectors whatever alignment they are told (an
    // operand 6 bytes into its buffer faulted with a misaligned address on an H100): every
    // operand must start on 16 bytes and every row on 16 bytes, as for cartage's own kernel.
    let rows_on_16 = strides.iter().take(strided.len()).all(|st| {
        st.iter()
            .all(|&x| (x as usize * q.dtype.size_in_bytes()).is_multiple_of(16))
    });
    let mut align = [0i64; 10];
    for (slot, arg) in align.iter_mut().zip(inputs.iter().chain(outputs)) {
        *slot = alignment(arg);
    }
    if !rows_on_16 || align.iter().take(inputs.len() + outputs.len()).any(|&a| a < 16) {
        return Err("cuDNN's fused attention takes operands and rows that start on 16 bytes".into());
    }
    let bias = match mask {
        None => None,
        Some(mask) => {
            align[9] = alignment(&mask.values);
            let bias = bias_of(mask, q.dtype).filter(|_| align[9] >= 16).ok_or_else(|| {
                format!(
                    "the mask {:?} with strides {:?} is not a bias cuDNN reads (a dense last dimension, rows on 16 bytes)",
                    mask.values.layout.shape(),
                    mask.values.layout.strides()
                )
            })?;
            Some(bias)
        }
    };
    Ok(Key {
        pass,
        dtype: q.dtype,
        causal,
        sizes,
        strides,
        bias,
        alignment: align,
        benchmark,
    })
}

/// One call's operands bound to the graph's unique ids: those read, those written (replaced by
/// scratch blocks when timing), the scale and cartage's kernel for the same call.
struct Call<'a> {
    key: Key,
    reads: Vec<(i64, &'a TensorArg)>,
    writes: Vec<(i64, &'a TensorArg)>,
    scale: f32,
    /// cartage's kernel writing into the given outputs (in the order of `writes`).
    kernel: &'a dyn Fn(&[TensorArg]) -> Result<()>,
}

impl Call<'_> {
    fn op(&self) -> &'static str {
        self.key.pass.op()
    }
}

/// How a forward call scores its keys: `Kernel::Attention`'s scale, causal flag and mask.
pub(crate) struct Scoring<'a> {
    pub(crate) scale: f64,
    pub(crate) causal: bool,
    pub(crate) mask: Option<&'a AttentionMask>,
}

/// Run `Kernel::Attention` through cuDNN when it may and can: `Ok(true)` when queued,
/// `Ok(false)` when cartage's kernel is to run it. `kernel(out, lse)` runs cartage's kernel into
/// other outputs (for the comparison).
pub(crate) fn forward(
    backend: &CudaBackend,
    [q, k, v]: [&TensorArg; 3],
    Scoring { scale, causal, mask }: Scoring<'_>,
    out: &TensorArg,
    lse: Option<&TensorArg>,
    kernel: &dyn Fn(&TensorArg, Option<&TensorArg>) -> Result<()>,
) -> Result<bool> {
    if !may_try(backend) {
        return Ok(false);
    }
    let device = backend.device;
    let (b, l, _) = crate::launch::attention_dims(q);
    // Without an `lse` of the call's, the statistics go to a scratch block.
    let mut own_lse = None;
    let stats = match lse {
        Some(lse) => lse.clone(),
        None => {
            let block = backend.allocator.alloc((b * l * 4).max(16))?;
            let arg = TensorArg {
                buffer: block.slice(),
                layout: Layout::contiguous(&[b, l])?,
                dtype: DType::F32,
            };
            own_lse = Some(block);
            arg
        }
    };
    let key = match key(
        AttentionPass::Forward,
        causal,
        backend.conv_benchmark(),
        &[q, k, v],
        &[out, &stats],
        mask,
    ) {
        Ok(key) => key,
        Err(reason) => {
            tracing::debug!(%device, %reason, "cuDNN's fused attention does not take this call; the kernel runs");
            if let Some(block) = own_lse {
                backend.allocator.free(block);
            }
            return Ok(false);
        }
    };
    let has_lse = lse.is_some();
    let run_kernel = |writes: &[TensorArg]| kernel(&writes[0], has_lse.then(|| &writes[1]));
    let mut reads = vec![(scores::Q, q), (scores::K, k), (scores::V, v)];
    reads.extend(mask.map(|m| (scores::BIAS, &m.values)));
    let call = Call {
        key,
        reads,
        writes: vec![(scores::O, out), (scores::STATS, &stats)],
        scale: scale as f32,
        kernel: &run_kernel,
    };
    let outcome = attempt(backend, &call);
    // The scratch statistics go back in stream order, after the queued work.
    if let Some(block) = own_lse {
        backend.allocator.free(block);
    }
    outcome
}

/// Run `Kernel::AttentionBackward` through cuDNN when it may and can (`Ok(true)` when queued;
/// `Ok(false)` when cartage's kernels are to run it, always without a saved forward).
/// `kernel(args)` runs cartage's backward on other arguments (for the comparison).
pub(crate) fn backward(
    backend: &CudaBackend,
    a: &AttentionBackwardArgs,
    kernel: &dyn Fn(&AttentionBackwardArgs) -> Result<()>,
) -> Result<bool> {
    let Some(saved) = a.saved.as_ref() else {
        return Ok(false);
    };
    if !may_try(backend) {
        return Ok(false);
    }
    let device = backend.device;
    let keyed = key(
        AttentionPass::Backward,
        a.causal,
        backend.conv_benchmark(),
        &[&a.q, &a.k, &a.v, &saved.out, &a.grad],
        &[&saved.lse, &a.grad_q, &a.grad_k, &a.grad_v],
        a.mask.as_ref(),
    )
    .and_then(|key| {
        let s = key.sizes[3];
        if version() < 91501 && !s.is_multiple_of(128) {
            Err(format!(
                "cuDNN {} before 9.15.1 needs a padding mask for key lengths not a multiple of 128 (S = {s})",
                version()
            ))
        } else if key.bias.is_some() && !s.is_multiple_of(128) {
            // With a bias, cuDNN's backward scores the padded part of the last 128-key tile 0
            // instead of −inf: exp(0 − lse) overflows for a row whose lse is below ln(f32::MAX),
            // and dQ turns NaN (seen with cuDNN 9 on Hopper, S % 128 = 64).
            Err(format!(
                "cuDNN's backward with a mask takes key lengths that are multiples of 128 (S = {s})"
            ))
        } else {
            Ok(key)
        }
    });
    let key = match keyed {
        Ok(key) => key,
        Err(reason) => {
            tracing::debug!(%device, %reason, "cuDNN's fused attention backward does not take this call; the kernel runs");
            return Ok(false);
        }
    };
    if key.bias.is_some() {
        return masked_backward(backend, a, saved, key, kernel);
    }
    backward_call(backend, a, key, &saved.lse, kernel)
}

/// Queue the backward of `a` through cuDNN under `key`, reading `lse` as the statistics.
fn backward_call(
    backend: &CudaBackend,
    a: &AttentionBackwardArgs,
    key: Key,
    lse: &TensorArg,
    kernel: &dyn Fn(&AttentionBackwardArgs) -> Result<()>,
) -> Result<bool> {
    let Some(saved) = a.saved.as_ref() else {
        return Ok(false);
    };
    let run_kernel = |writes: &[TensorArg]| {
        let mut other = a.clone();
        other.grad_q = writes[0].clone();
        other.grad_k = writes[1].clone();
        other.grad_v = writes[2].clone();
        kernel(&other)
    };
    let mut reads = vec![
        (scores::Q, &a.q),
        (scores::K, &a.k),
        (scores::V, &a.v),
        (scores::O, &saved.out),
        (scores::D_O, &a.grad),
        (scores::STATS, lse),
    ];
    reads.extend(a.mask.as_ref().map(|m| (scores::BIAS, &m.values)));
    let call = Call {
        key,
        reads,
        writes: vec![
            (scores::D_Q, &a.grad_q),
            (scores::D_K, &a.grad_k),
            (scores::D_V, &a.grad_v),
        ],
        scale: a.scale as f32,
        kernel: &run_kernel,
    };
    attempt(backend, &call)
}

/// The masked backward through cuDNN: a row the mask leaves no key has lse −inf, where cuDNN's
/// recomputed probabilities `exp(s − lse)` would be NaN (−inf − −inf); it reads a copy of the lse
/// with −inf made +inf (`attention_lse_unseen` of `attention.cu`), so that such a row's
/// probabilities and gradients are 0, as the kernel contract says. A shape already timed in
/// favour of the kernel skips the copy.
fn masked_backward(
    backend: &CudaBackend,
    a: &AttentionBackwardArgs,
    saved: &AttentionSaved,
    key: Key,
    kernel: &dyn Fn(&AttentionBackwardArgs) -> Result<()>,
) -> Result<bool> {
    if decided_for_kernel(backend, &key) {
        return Ok(false);
    }
    let n = saved.lse.layout.numel();
    let block = backend.allocator.alloc((n * 4).max(16))?;
    let outcome = (|| {
        let lse = TensorArg {
            buffer: block.slice(),
            layout: Layout::contiguous(saved.lse.layout.shape())?,
            dtype: DType::F32,
        };
        let function = backend.modules.kernel(KernelName::new(
            SourceFile::Attention,
            ["attention_lse_unseen", "", "", ""],
        ))?;
        let cfg = LaunchConfig {
            grid_dim: (
                (n.div_ceil(256) as u64).clamp(1, backend.sm_count as u64 * 8) as u32,
                1,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (from, to, count) = (device_ptr(&saved.lse), device_ptr(&lse), n as u64);
        crate::launch::launch_kernel!(
            backend,
            function,
            cfg,
            [saved.lse.buffer, lse.buffer],
            &from,
            &to,
            &count
        )?;
        backward_call(backend, a, key, &lse, kernel)
    })();
    // Given back in stream order: its users are queued before any later reuse.
    backend.allocator.free(block);
    outcome
}

/// True when `key` was timed under `Auto` and the kernel won (cuDNN will not run it).
fn decided_for_kernel(backend: &CudaBackend, key: &Key) -> bool {
    if backend.attention_api() != AttentionApi::Auto {
        return false;
    }
    let Some(cudnn) = crate::conv::existing_cudnn(backend.device) else {
        return false;
    };
    let cudnn = cudnn.lock().unwrap_or_else(|p| p.into_inner());
    match cudnn.attention.plans.get(key) {
        Some(Ok(plan)) => plan.compared && !plan.use_cudnn,
        Some(Err(_)) => true,
        None => false,
    }
}

/// Whether cuDNN may be tried at all: not under [`AttentionApi::Kernel`], nor under `Auto` with
/// the search off, and only with cuDNN's graph API loaded.
fn may_try(backend: &CudaBackend) -> bool {
    match backend.attention_api() {
        AttentionApi::Kernel => return false,
        AttentionApi::Auto if !backend.conv_benchmark() => return false,
        _ => {}
    }
    if let Err(reason) = crate::conv::graph_available() {
        tracing::debug!(device = %backend.device, %reason, "cuDNN's graph API is not available; the attention kernel runs");
        return false;
    }
    true
}

/// Build `key`'s graph and its plans, or say why not.
fn build(device: Device, handle: sys::cudnnHandle_t, key: &Key) -> std::result::Result<Plan, String> {
    let op = key.pass.op();
    let graph = match key.pass {
        AttentionPass::Forward => forward_graph::build(handle, key),
        AttentionPass::Backward => backward_graph::build(handle, key),
    }
    .map_err(|f| f.error(device, op).to_string())?;
    let want = if key.benchmark { SEARCH_COUNT } else { 1 };
    // cartage's own kernels round P and dS to the I/O dtype for their products too: every
    // engine is admitted.
    let candidates = engines::plans(handle, &graph.graph, &|_| true, want, WORKSPACE_LIMIT)
        .map_err(|f| f.error(device, op).to_string())?;
    if candidates.is_empty() {
        return Err(format!("cuDNN's heuristics offer no engine for this {op} graph"));
    }
    tracing::debug!(
        %device,
        ?key,
        engines = ?candidates.iter().map(|c| (c.engine.index, c.workspace)).collect::<Vec<_>>(),
        "cuDNN fused attention plan"
    );
    Ok(Plan {
        candidates,
        searched: false,
        compared: false,
        use_cudnn: false,
        kernel_ms: None,
        _graph: graph,
    })
}

/// Queue `call` through cuDNN when it may and can (see [`forward`]).
fn attempt(backend: &CudaBackend, call: &Call<'_>) -> Result<bool> {
    let device = backend.device;
    let api = backend.attention_api();
    let key = &call.key;
    let cudnn = match crate::conv::cudnn_handle(backend, call.op(), key.dtype) {
        Ok(cudnn) => cudnn,
        Err(e) => {
            tracing::debug!(%device, error = %e, "no cuDNN handle; the attention kernel runs");
            return Ok(false);
        }
    };
    let mut cudnn = cudnn.lock().unwrap_or_else(|p| p.into_inner());
    let handle = cudnn.handle;
    let plans = &mut cudnn.attention;
    if !plans.plans.contains_key(key) {
        if backend.capture.active() {
            // Finalizing plans may compile kernels: not inside a graph capture.
            return Ok(false);
        }
        let built = build(device, handle, key);
        if let Err(reason) = &built {
            tracing::debug!(%device, ?key, %reason, "cuDNN cannot run this attention; the kernel will");
        }
        plans.plans.insert(key.clone(), built);
    }
    let can_time = key.benchmark && !backend.capture.active();
    let Some(Ok(plan)) = plans.plans.get_mut(key) else {
        return Ok(false);
    };
    if can_time && !plan.searched {
        if let Err(e) = search(backend, handle, plan, call) {
            tracing::debug!(%device, ?key, error = %e, "the cuDNN attention search did not finish; the heuristics' order stays");
        }
        plan.searched = true;
    }
    if can_time && api == AttentionApi::Auto && !plan.compared {
        plan.kernel_ms = time_kernel(backend, call);
        let cudnn_ms = plan.candidates.first().and_then(|c| c.time_ms);
        plan.use_cudnn = match (cudnn_ms, plan.kernel_ms) {
            (Some(c), Some(k)) => c < k,
            (Some(_), None) => true,
            _ => false,
        };
        plan.compared = true;
        tracing::debug!(
            %device,
            ?key,
            cudnn_ms,
            kernel_ms = plan.kernel_ms,
            use_cudnn = plan.use_cudnn,
            "cuDNN fused attention against the flash kernel"
        );
    }
    if plan.candidates.is_empty() {
        plans
            .plans
            .insert(key.clone(), Err("every cuDNN engine refused these operands".into()));
        return Ok(false);
    }
    if api == AttentionApi::Auto && !(plan.compared && plan.use_cudnn) {
        if plan.compared {
            let ran = Ran {
                cudnn: false,
                implementation: kernel_words(key.pass),
                cudnn_ms: plan.candidates.first().and_then(|c| c.time_ms),
                kernel_ms: plan.kernel_ms,
            };
            plans.ran.insert(key.clone(), ran);
        }
        return Ok(false);
    }
    let kernel_ms = plan.kernel_ms;
    while let Some(candidate) = plan.candidates.first() {
        let writes: Vec<TensorArg> = call.writes.iter().map(|(_, w)| (*w).clone()).collect();
        match run(backend, handle, candidate, call, &writes) {
            Err(e) if is_out_of_memory(&e) => {
                tracing::debug!(%device, error = %e, "no memory for cuDNN's attention; the kernel runs");
                return Ok(false);
            }
            Err(e) => return Err(e),
            Ok(Ok(())) => {
                let ran = Ran {
                    cudnn: true,
                    implementation: format!("cuDNN fused attention ({})", candidate.engine.name()),
                    cudnn_ms: candidate.time_ms,
                    kernel_ms,
                };
                plans.ran.insert(key.clone(), ran);
                return Ok(true);
            }
            Ok(Err(failure)) => {
                tracing::debug!(%device, ?key, %failure, "cuDNN refused this attention engine; trying the next");
                plan.candidates.remove(0);
            }
        }
    }
    plans
        .plans
        .insert(key.clone(), Err("every cuDNN engine refused at execution".into()));
    Ok(false)
}

/// True for the allocator's out-of-memory error.
fn is_out_of_memory(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory(_))
}

/// A pass-by-value f32 on the host, aligned as cuDNN's scalar tensors are said to be.
#[repr(C, align(16))]
struct HostScalar(f32);

/// Queue `candidate` for `call` with `writes` in place of its outputs: `Ok(Ok(()))` when queued,
/// `Ok(Err(_))` when cuDNN refused, `Err` for a failure that is not cuDNN's (memory, ordering).
fn run(
    backend: &CudaBackend,
    handle: sys::cudnnHandle_t,
    candidate: &ExecPlan,
    call: &Call<'_>,
    writes: &[TensorArg],
) -> Result<std::result::Result<(), Failure>> {
    let key = &call.key;
    let scratch_sizes: Vec<(i64, usize)> = match key.pass {
        AttentionPass::Forward => Vec::new(),
        AttentionPass::Backward => backward_graph::scratch(key).to_vec(),
    };
    let mut blocks: Vec<(i64, Allocation)> = Vec::new();
    let mut taken = || -> Result<Option<Allocation>> {
        for &(uid, bytes) in &scratch_sizes {
            blocks.push((uid, backend.allocator.alloc(bytes.max(16))?));
        }
        if candidate.workspace == 0 {
            Ok(None)
        } else {
            backend.allocator.alloc(candidate.workspace).map(Some)
        }
    };
    let workspace = match taken() {
        Ok(w) => w,
        Err(e) => {
            for (_, block) in blocks {
                backend.allocator.free(block);
            }
            return Err(e);
        }
    };
    let outcome = (|| {
        let mut slices: Vec<_> = call.reads.iter().map(|(_, a)| a.buffer).collect();
        slices.extend(writes.iter().map(|a| a.buffer));
        slices.extend(blocks.iter().map(|(_, b)| b.slice()));
        slices.extend(workspace.iter().map(|b| b.slice()));
        backend.order.before_compute(&backend.compute, &slices)?;
        if key.pass == AttentionPass::Backward
            && version() < 90600
            && let Some((_, block)) = blocks.iter().find(|(uid, _)| *uid == scores::DQ_ACCUM)
        {
            // cuDNN before 9.6 accumulates dQ into the f32 buffer as it is: zero it first.
            let [b, h, l, _, e, _] = key.sizes;
            let b = b * h;
            let zero = Kernel::Fill {
                out: TensorArg {
                    buffer: block.slice(),
                    layout: Layout::contiguous(&[b * l * e])?,
                    dtype: DType::F32,
                },
                value: Scalar::Float(0.0),
            };
            // SAFETY: a fresh f32 block of `b·l·e` elements, live until after the queued work.
            unsafe { crate::launch::launch(backend, &zero) }?;
        }
        let mut scale = HostScalar(call.scale);
        // cuDNN before 9.10 wants the lowest finite value for masked scores (cudnn-frontend).
        let mut neg_inf = HostScalar(if version() < 91000 { f32::MIN } else { f32::NEG_INFINITY });
        let mut one = HostScalar(1.0);
        let mut uids: Vec<i64> = Vec::new();
        let mut pointers: Vec<*mut c_void> = Vec::new();
        for ((uid, _), arg) in call
            .reads
            .iter()
            .map(|(u, a)| ((*u, ()), *a))
            .chain(call.writes.iter().zip(writes).map(|((u, _), a)| ((*u, ()), a)))
        {
            uids.push(uid);
            pointers.push(device_ptr(arg) as *mut c_void);
        }
        for (uid, block) in &blocks {
            uids.push(*uid);
            pointers.push(block.slice().addr() as *mut c_void);
        }
        uids.push(scores::SCALE);
        pointers.push((&mut scale.0 as *mut f32).cast());
        if key.causal {
            uids.push(scores::NEG_INF);
            pointers.push((&mut neg_inf.0 as *mut f32).cast());
        }
        if key.pass == AttentionPass::Backward {
            uids.push(scores::ONE);
            pointers.push((&mut one.0 as *mut f32).cast());
        }
        let space = workspace
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.slice().addr() as *mut c_void);
        // SAFETY: every non-virtual tensor of the plan's graph is bound: the operands are
        // validated, in live blocks freed only in stream order (the launch's contract), with the
        // dims, strides and alignment the key (hence the graph) holds; the outputs are apart
        // from the inputs (validated; scratch outputs are fresh blocks); the scratch tensors and
        // the workspace are live blocks of the sizes the graph and plan ask for, given back in
        // stream order below; the scalars are host values alive for the call; the handle is the
        // plan's.
        Ok(unsafe { execute::execute(handle, candidate, &uids, &pointers, space) })
    })();
    for (_, block) in blocks {
        backend.allocator.free(block);
    }
    if let Some(block) = workspace {
        backend.allocator.free(block);
    }
    outcome
}

/// Fresh blocks in place of `call`'s outputs (same shapes, dense).
fn scratch_outputs(backend: &CudaBackend, call: &Call<'_>) -> Result<(Vec<Allocation>, Vec<TensorArg>)> {
    let mut blocks = Vec::new();
    let mut args = Vec::new();
    for (_, w) in &call.writes {
        let shape = w.layout.shape();
        let block = match backend
            .allocator
            .alloc((w.layout.numel() * w.dtype.size_in_bytes()).max(16))
        {
            Ok(block) => block,
            Err(e) => {
                blocks.into_iter().for_each(|b| backend.allocator.free(b));
                return Err(e);
            }
        };
        let layout = match Layout::contiguous(shape) {
            Ok(layout) => layout,
            Err(e) => {
                backend.allocator.free(block);
                blocks.into_iter().for_each(|b| backend.allocator.free(b));
                return Err(e);
            }
        };
        args.push(TensorArg {
            buffer: block.slice(),
            layout,
            dtype: w.dtype,
        });
        blocks.push(block);
    }
    Ok((blocks, args))
}

/// Time the plan's engines on the call's inputs with scratch outputs and order them fastest
/// first; an engine cuDNN refuses is dropped. An error that is not cuDNN's stops the search and
/// leaves the untimed engines after the timed ones.
fn search(backend: &CudaBackend, handle: sys::cudnnHandle_t, plan: &mut Plan, call: &Call<'_>) -> Result<()> {
    let device = backend.device;
    let (blocks, writes) = scratch_outputs(backend, call)?;
    let candidates = std::mem::take(&mut plan.candidates);
    let (ranked, outcome) = timing::rank_engines(backend, candidates, "fused attention", call.op(), |candidate| {
        run(backend, handle, candidate, call, &writes)
    });
    tracing::debug!(%device, key = ?call.key, "cuDNN fused attention search done");
    blocks.into_iter().for_each(|b| backend.allocator.free(b));
    plan.candidates = ranked;
    outcome
}

/// cartage's kernel for `call`, timed with the search's clock on scratch outputs, or `None`
/// when it refuses the call or cannot be timed (logged).
fn time_kernel(backend: &CudaBackend, call: &Call<'_>) -> Option<f32> {
    let device = backend.device;
    let (blocks, writes) = match scratch_outputs(backend, call) {
        Ok(scratch) => scratch,
        Err(e) => {
            tracing::debug!(%device, error = %e, "no memory to time the attention kernel");
            return None;
        }
    };
    let measured = timing::time_ms(backend, || (call.kernel)(&writes));
    blocks.into_iter().for_each(|b| backend.allocator.free(b));
    match measured {
        Ok(ms) => Some(ms),
        Err(e) => {
            tracing::debug!(%device, key = ?call.key, error = %e, "the attention kernel could not be timed; cuDNN runs");
            None
        }
    }
}

/// What each key of `device` ran last, sorted by pass and sizes.
pub(crate) fn choices(device: Device) -> Vec<AttentionChoice> {
    let Some(cudnn) = crate::conv::existing_cudnn(device) else {
        return Vec::new();
    };
    let cudnn = cudnn.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<AttentionChoice> = cudnn
        .attention
        .ran
        .iter()
        .map(|(key, ran)| AttentionChoice {
            pass: key.pass,
            dtype: key.dtype,
            sizes: key.merged_sizes(),
            causal: key.causal,
            masked: key.bias.is_some(),
            cudnn: ran.cudnn,
            implementation: ran.implementation.clone(),
            cudnn_ms: ran.cudnn_ms,
            kernel_ms: ran.kernel_ms,
        })
        .collect();
    out.sort_by_key(|a| (a.pass, a.sizes, a.causal, a.masked));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(shape: &[usize], st: &[usize], bh: [usize; 2]) -> Option<[i64; 3]> {
        strides_of(shape, st, bh)
    }

    #[test]
    fn size_one_dims_get_dense_strides() {
        assert_eq!(split(&[8, 1024, 64], &[65536, 64, 1], [8, 1]), Some([65536, 65536, 64]));
        // A lone batch entry or row: the stride is free, so the dense one is given.
        assert_eq!(split(&[1, 1024, 64], &[0, 64, 1], [1, 1]), Some([65536, 65536, 64]));
        assert_eq!(split(&[4, 1, 64], &[64, 7, 1], [4, 1]), Some([64, 64, 64]));
        // Heads merged from [N, L, H, E]: rows H·E apart.
        assert_eq!(split(&[16, 128, 64], &[64, 1024, 1], [16, 1]), Some([64, 64, 1024]));
    }

    #[test]
    fn one_batch_stride_splits_as_the_mask_does() {
        // [B = 2 · 4, L, E] dense, seen as [2, 4, L, E].
        assert_eq!(split(&[8, 16, 64], &[1024, 64, 1], [2, 4]), Some([4096, 1024, 64]));
    }

    #[test]
    fn two_batch_dims_keep_their_strides() {
        // The heads of a packed [N, L, 3, H, E] projection: N = 2, L = 128, H = 4, E = 64.
        let (l, h, e) = (128, 4, 64);
        let st = [l * 3 * h * e, e, 3 * h * e, 1];
        let want = [l * 3 * h * e, e, 3 * h * e].map(|x| x as i64);
        assert_eq!(split(&[2, h, l, e], &st, [2, h]), Some(want));
        // One head: its stride is free.
        let want = [l * e, l * e, e].map(|x| x as i64);
        assert_eq!(split(&[2, 1, l, e], &[l * e, 0, e, 1], [2, 1]), Some(want));
        // A split other than the operand's own is refused.
        assert_eq!(split(&[2, h, l, e], &st, [1, 2 * h]), None);
    }

    #[test]
    fn layouts_cudnn_cannot_read_are_refused() {
        assert_eq!(split(&[8, 16, 64], &[1024, 1, 16], [8, 1]), None);
        assert_eq!(split(&[8, 16, 64], &[0, 64, 1], [8, 1]), None);
        assert_eq!(split(&[8, 16, 64], &[1024, 0, 1], [8, 1]), None);
        assert_eq!(split(&[2, 4, 16, 64], &[4096, 0, 64, 1], [2, 4]), None);
    }

    #[test]
    fn masks_become_biases_with_broadcasts_kept() {
        // A key-padding mask [N, 1, 1, S] expanded over H heads and L rows.
        let (n, h, l, s) = (8, 16, 1024, 1024);
        let bias = bias_from(&[n, h, l, s], &[s, 0, 0, 1], DType::BF16).expect("bias");
        assert_eq!(bias.dims, [8, 1, 1024, 1024]);
        assert_eq!(bias.strides, [1024, (l * s) as i64, 0, 1]);
        // A full mask per head.
        let st = [4 * 64 * 128, 64 * 128, 128, 1];
        let bias = bias_from(&[2, 4, 64, 128], &st, DType::F16).expect("bias");
        assert_eq!(bias.dims, [2, 4, 64, 128]);
        assert_eq!(bias.strides, st.map(|x| x as i64));
    }

    /// The lse copy of the masked backward is built into the committed PTX with the three
    /// parameters it is launched with (two addresses and a count).
    #[test]
    fn the_lse_kernel_takes_two_addresses_and_a_count() {
        let name = KernelName::new(SourceFile::Attention, ["attention_lse_unseen", "", "", ""]);
        let params = crate::launch::ptx_param_bytes(name.file, &name.symbol());
        assert_eq!(params, vec![8, 8, 8]);
    }

    #[test]
    fn masks_cudnn_cannot_read_are_refused() {
        // Rows 3 elements apart (6 bytes): not on 16 bytes.
        assert!(bias_from(&[1, 1, 4, 3], &[12, 12, 3, 1], DType::BF16).is_none());
        // A transposed mask.
        assert!(bias_from(&[1, 1, 64, 64], &[4096, 4096, 1, 64], DType::BF16).is_none());
    }
}
