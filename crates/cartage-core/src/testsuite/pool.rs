//! `Pool2d` and `Pool2dBackward`, optional fused kernels: where the backend lists one for a
//! dtype (per pooling kind), every case below is compared with an f64 host reference (the
//! definitions of the module docs of `kernel.rs`, in naive loops); every other dtype (all of
//! them on a backend without the kernel) must be refused with `Unsupported`. Malformed kernels
//! give the typed error `Kernel::validate` assigns, on every backend.
//!
//! Each case runs max pooling (values, and indices checked exactly: the first NaN tap, else the
//! first largest), average pooling with both divisors (unless dilated: averages take none), and
//! the input gradient of each. Max inputs lie on a coarse grid (ties) with NaN, +inf and -inf
//! sprinkled in; hand-made planes add windows whose in-plane taps are all -inf next to the
//! padding (the index must name an in-plane tap), several NaNs in a window, and ties of +inf.
//! The max backward is fed the reference's indices, then hostile ones (negative, past the
//! plane, `i64::MIN`/`MAX`, positions outside their window, the flat index a padding tap would
//! alias): those must add nothing and never fault.
//!
//! The cases cover 1×1, 2×2, 3×3 and 3×2 windows, strides 1 to 3, padding 0 and 1, dilation 2,
//! odd planes, overlapping windows (stride < kernel: a position's gradient sums several
//! windows), rows and columns no window reads (zero gradient), an empty batch, a plane larger
//! than 64×64, and operands read through strided views: channels-last, narrowed to an odd row
//! stride, one element into the buffer and batch-broadcast inputs; transposed, channels-last,
//! offset, batch-broadcast and one-value gradients; transposed and offset indices.
//!
//! Tolerances: max values and indices are exact. Averages and gradient sums allow one rounding
//! of the dtype plus a few roundings of the compute type (f32, f64 for f64) per term, relative
//! to `Σ|term|`.

use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::kernel::{Kernel, Op, TensorArg};
use crate::layout::Layout;
use crate::pool::{PoolKind, PoolMode, PoolWindow};

use super::buffers::{DeviceBuffer, Operand, Spec, encode_ints, sprinkle_specials};
use super::harness::Harness;
use super::reference::Tolerance;
use super::views::{View, ViewKind, offsets, view};

/// How a 4-D operand is laid out in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lay {
    Contiguous,
    /// Channels last: a permuted view of a dense `[N, H, W, C]`.
    ChannelsLast,
    /// Columns 8.. of a wider dense plane whose row stride is odd.
    Narrowed,
    /// Dense, one element into the buffer (a start no vector load can use).
    Shifted,
    /// Dense, three elements into the buffer.
    Offset,
    /// The last two dims swapped (a transposed dense `[N, C, W, H]`).
    Transposed,
    /// One sample broadcast over the batch (batch stride 0).
    Broadcast,
    /// One value broadcast to the whole shape (every stride 0).
    Scalar,
}

/// One pooling geometry and the layouts of its operands.
#[derive(Clone, Copy, Debug)]
struct Case {
    input: [usize; 4],
    window: PoolWindow,
    /// The forward input's layout.
    x: Lay,
    /// The output gradient's layout.
    g: Lay,
    /// The max backward's indices' layout (no broadcast: each holds its own value).
    idx: Lay,
}

impl Case {
    fn output(&self) -> [usize; 4] {
        let [n, c, h, w] = self.input;
        let [oh, ow] = self
            .window
            .output_size([h, w])
            .expect("suite bug: a case where no window fits");
        [n, c, oh, ow]
    }

    /// The modes this case runs for `kind` (averages take no dilation).
    fn modes(&self, kind: PoolKind) -> Vec<PoolMode> {
        match kind {
            PoolKind::Max => vec![PoolMode::Max],
            PoolKind::Avg if self.window.dilation == [1, 1] => vec![
                PoolMode::Avg {
                    count_include_pad: true,
                },
                PoolMode::Avg {
                    count_include_pad: false,
                },
            ],
            PoolKind::Avg => Vec::new(),
        }
    }

    fn describe(&self, op: &str, mode: PoolMode, dtype: DType) -> String {
        let w = &self.window;
        format!(
            "{op} {mode:?} {dtype} input {:?} ({:?}) kernel {:?} stride {:?} padding {:?} dilation {:?}, grad {:?} \
             ({:?}), indices {:?}",
            self.input,
            self.x,
            w.kernel,
            w.stride,
            w.padding,
            w.dilation,
            self.output(),
            self.g,
            self.idx
        )
    }
}

fn cases() -> Vec<Case> {
    use Lay::*;
    type Row = (
        [usize; 4],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        [usize; 2],
        Lay,
        Lay,
        Lay,
    );
    // (input, kernel, stride, padding, dilation, input layout, gradient layout, indices layout)
    #[rustfmt::skip]
    let table: [Row; 13] = [
        ([1, 1, 1, 1], [1, 1], [1, 1], [0, 0], [1, 1], Contiguous, Contiguous, Contiguous),
        // Overlapping windows: each position's gradient sums up to 9 windows.
        ([2, 3, 7, 9], [3, 3], [1, 1], [1, 1], [1, 1], Contiguous, Transposed, Transposed),
        // Stride 2 over an odd width: the last column is read by no window.
        ([2, 3, 8, 9], [2, 2], [2, 2], [0, 0], [1, 1], ChannelsLast, Contiguous, Contiguous),
        ([2, 4, 9, 7], [3, 2], [2, 1], [1, 1], [1, 1], Narrowed, ChannelsLast, Offset),
        ([1, 3, 11, 10], [3, 3], [3, 3], [1, 1], [1, 1], Shifted, Offset, Contiguous),
        ([3, 3, 6, 7], [2, 2], [1, 1], [1, 0], [1, 1], Broadcast, Scalar, Transposed),
        ([0, 3, 5, 5], [3, 3], [2, 2], [1, 1], [1, 1], Contiguous, Contiguous, Contiguous),
        // Dilated (max only), padded.
        ([2, 3, 10, 9], [3, 3], [1, 2], [1, 1], [2, 2], Contiguous, Transposed, Transposed),
        ([2, 5, 13, 11], [3, 2], [3, 3], [1, 0], [1, 1], ChannelsLast, Transposed, Contiguous),
        // A plane larger than 64×64, large enough for a parallel path.
        ([2, 8, 67, 70], [3, 3], [2, 2], [1, 1], [1, 1], Contiguous, Contiguous, Contiguous),
        ([1, 3, 5, 5], [2, 2], [1, 1], [1, 1], [1, 1], Narrowed, Contiguous, Offset),
        // Dilated along the rows only, over channels-last memory.
        ([2, 3, 9, 9], [3, 3], [1, 1], [0, 1], [2, 1], ChannelsLast, Offset, Offset),
        ([2, 3, 8, 8], [2, 3], [2, 3], [1, 1], [1, 1], Shifted, Broadcast, Transposed),
    ];
    table
        .into_iter()
        .map(|(input, kernel, stride, padding, dilation, x, g, idx)| Case {
            input,
            window: PoolWindow {
                kernel,
                stride,
                padding,
                dilation,
            },
            x,
            g,
            idx,
        })
        .collect()
}

fn dense(shape: &[usize]) -> Layout {
    Layout::contiguous(shape).expect("suite shapes are small")
}

/// A view of the 4-D `shape` laid out as `lay`.
fn view4(lay: Lay, shape: [usize; 4]) -> View {
    let [n, c, h, w] = shape;
    match lay {
        Lay::Contiguous => view(ViewKind::Contiguous, &shape),
        Lay::ChannelsLast => View {
            kind: ViewKind::Permuted,
            base_len: n * h * w * c,
            layout: dense(&[n, h, w, c]).permute(&[0, 3, 1, 2]).expect("a permutation"),
        },
        Lay::Narrowed => {
            // Row stride `w + extra`, odd whatever `w` is.
            let extra = if (w + 11) % 2 == 1 { 11 } else { 12 };
            View {
                kind: ViewKind::Narrowed,
                base_len: n * c * h * (w + extra),
                layout: dense(&[n, c, h, w + extra]).narrow(3, 8, w).expect("fits"),
            }
        }
        Lay::Shifted => View {
            kind: ViewKind::Offset,
            base_len: n * c * h * w + 1,
            layout: Layout::from_parts(&shape, dense(&shape).strides(), 1).expect("small"),
        },
        Lay::Offset => view(ViewKind::Offset, &shape),
        Lay::Transposed => view(ViewKind::Transposed, &shape),
        Lay::Broadcast => view(ViewKind::Broadcast, &shape),
        Lay::Scalar => view(ViewKind::Scalar, &shape),
    }
}

/// The in-plane taps of window `(i, j)` over a plane `[h, w]`, in row-major window order, as
/// `(y, x)`.
fn window_taps(window: &PoolWindow, [h, w]: [usize; 2], i: usize, j: usize) -> Vec<(usize, usize)> {
    let at = |axis: usize, out: usize, t: usize| {
        (out * window.stride[axis] + t * window.dilation[axis]) as isize - window.padding[axis] as isize
    };
    let mut taps = Vec::new();
    for a in 0..window.kernel[0] {
        let y = at(0, i, a);
        for b in 0..window.kernel[1] {
            let x = at(1, j, b);
            if (0..h as isize).contains(&y) && (0..w as isize).contains(&x) {
                taps.push((y as usize, x as usize));
            }
        }
    }
    taps
}

/// The forward reference over row-major `x` [N, C, H, W]: each output's value, the index the
/// max names (0 for averages), and `Σ|tap|` divided like the value (the scale of an average's
/// rounding error).
fn forward_reference(mode: PoolMode, window: &PoolWindow, input: [usize; 4], x: &[f64]) -> Reference {
    let [n, c, h, w] = input;
    let [oh, ow] = window.output_size([h, w]).expect("suite cases fit");
    let mut r = Reference::default();
    for plane in 0..n * c {
        let xp = &x[plane * h * w..(plane + 1) * h * w];
        for i in 0..oh {
            for j in 0..ow {
                let taps = window_taps(window, [h, w], i, j);
                assert!(!taps.is_empty(), "suite bug: a window with no tap in the plane");
                match mode {
                    PoolMode::Max => {
                        let mut best = taps[0];
                        for &tap in &taps[1..] {
                            let (b, v) = (xp[best.0 * w + best.1], xp[tap.0 * w + tap.1]);
                            if !b.is_nan() && (v.is_nan() || v > b) {
                                best = tap;
                            }
                        }
                        let at = best.0 * w + best.1;
                        r.values.push(xp[at]);
                        r.indices.push(at as i64);
                        r.scale.push(0.0);
                    }
                    PoolMode::Avg { count_include_pad } => {
                        let divisor = if count_include_pad {
                            window.kernel[0] * window.kernel[1]
                        } else {
                            taps.len()
                        } as f64;
                        let sum: f64 = taps.iter().map(|&(y, xx)| xp[y * w + xx]).sum();
                        let abs: f64 = taps.iter().map(|&(y, xx)| xp[y * w + xx].abs()).sum();
                        r.values.push(sum / divisor);
                        r.indices.push(0);
                        r.scale.push(abs / divisor);
                    }
                }
            }
        }
    }
    r
}

/// What a reference computes: values row-major, max indices, and the error scale per value.
#[derive(Default)]
struct Reference {
    values: Vec<f64>,
    indices: Vec<i64>,
    scale: Vec<f64>,
}

/// The backward reference, scattered window by window (the kernels may gather): the input
/// gradient [N, C, H, W] from row-major `g` and, for max, row-major `indices`, with `Σ|term|`
/// per element.
fn backward_reference(
    mode: PoolMode,
    window: &PoolWindow,
    input: [usize; 4],
    g: &[f64],
    indices: &[i64],
) -> (Vec<f64>, Vec<f64>) {
    let [n, c, h, w] = input;
    let [oh, ow] = window.output_size([h, w]).expect("suite cases fit");
    let (mut want, mut scale) = (vec![0.0; n * c * h * w], vec![0.0; n * c * h * w]);
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let k = (plane * oh + i) * ow + j;
                let taps = window_taps(window, [h, w], i, j);
                for &(y, x) in &taps {
                    let at = y * w + x;
                    let term = match mode {
                        PoolMode::Max if indices[k] == at as i64 => g[k],
                        PoolMode::Max => continue,
                        PoolMode::Avg { count_include_pad } => {
                            let divisor = if count_include_pad {
                                window.kernel[0] * window.kernel[1]
                            } else {
                                taps.len()
                            };
                            g[k] / divisor as f64
                        }
                    };
                    want[plane * h * w + at] += term;
                    scale[plane * h * w + at] += term.abs();
                }
            }
        }
    }
    (want, scale)
}

/// The allowed error per unit of `Σ|term|`, on top of one rounding of the result: a few
/// roundings of the compute type (f32, f64 for f64) for each of the window's `taps` terms, plus
/// the division.
fn accumulation(dtype: DType, window: &PoolWindow) -> f64 {
    let eps = if dtype == DType::F64 {
        f64::EPSILON
    } else {
        f32::EPSILON as f64
    };
    eps * (2 * window.kernel[0] * window.kernel[1] + 4) as f64
}

/// An operand of `dtype` through `v` whose logical values (row-major) are `values`; buffer
/// elements outside the view hold 0. `v` must not broadcast.
fn operand_with(h: &Harness, dtype: DType, v: View, values: &[f64]) -> Operand {
    let mut base = vec![0.0; v.base_len];
    for (k, at) in offsets(&v.layout).enumerate() {
        base[at] = values[k];
    }
    h.operand_from(dtype, v, &base)
}

/// i64 `values` (row-major) uploaded through the non-broadcasting view `v`.
fn indices_with(h: &Harness, v: &View, values: &[i64]) -> DeviceBuffer {
    let mut base = vec![0i64; v.base_len];
    for (k, at) in offsets(&v.layout).enumerate() {
        base[at] = values[k];
    }
    h.upload_bytes(DType::I64, &encode_ints(DType::I64, &base))
}

/// A random input through the case's layout: for max, on a grid of 0.25 (ties) with NaN, ±inf
/// sprinkled in; for averages, continuous in [-1, 1).
fn random_input(h: &Harness, dtype: DType, mode: PoolMode, case: &Case) -> Operand {
    let v = view4(case.x, case.input);
    let mut base = if mode == PoolMode::Max {
        h.random_values(dtype, v.base_len, Spec::new((-2.0, 2.0), (-3, 3)).grid(0.25))
    } else {
        h.random_values(dtype, v.base_len, Spec::new((-1.0, 1.0), (-3, 3)))
    };
    if mode == PoolMode::Max {
        sprinkle_specials(h, dtype, &mut base, 24);
    }
    h.operand_from(dtype, v, &base)
}

/// Run the forward over `x`; with `indices`, check them exactly too.
fn check_forward(h: &Harness, dtype: DType, mode: PoolMode, case: &Case, x: &Operand, with_indices: bool) {
    let reference = forward_reference(mode, &case.window, case.input, &x.values);
    let out_layout = dense(&case.output());
    let out = h.poisoned(dtype, out_layout.numel());
    let idx = with_indices.then(|| h.poisoned(DType::I64, out_layout.numel()));
    let mut what = case.describe(mode.kind().name(), mode, dtype);
    if with_indices {
        what.push_str(", with indices");
    }
    let kernel = Kernel::Pool2d {
        mode,
        window: case.window,
        input: x.arg(),
        out: out.arg(&out_layout),
        indices: idx.as_ref().map(|b| b.arg(&out_layout)),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    if mode == PoolMode::Max {
        h.check(&what, &out, &out_layout, &reference.values, Tolerance::EXACT);
    } else {
        let (tolerance, per_term) = (Tolerance::of(dtype), accumulation(dtype, &case.window));
        h.check_with(&what, &out, &out_layout, &reference.values, |i, want| {
            tolerance.allowed(want) + per_term * reference.scale[i]
        });
    }
    if let Some(idx) = idx {
        h.check_bytes(
            &format!("{what} (the indices)"),
            &idx,
            &out_layout,
            &encode_ints(DType::I64, &reference.indices),
        );
    }
}

/// Run the backward from a random gradient through the case's layout and, for max, `indices`
/// (row-major) through the case's indices layout.
fn check_backward(h: &Harness, dtype: DType, mode: PoolMode, case: &Case, indices: &[i64], note: &str) {
    let gv = view4(case.g, case.output());
    let g = h.operand_from(
        dtype,
        gv.clone(),
        &h.random_values(dtype, gv.base_len, Spec::new((-1.0, 1.0), (-3, 3))),
    );
    let iv = view4(case.idx, case.output());
    let idx = (mode == PoolMode::Max).then(|| indices_with(h, &iv, indices));
    let out_layout = dense(&case.input);
    let out = h.poisoned(dtype, out_layout.numel());
    let what = format!("{}{note}", case.describe(mode.kind().backward_name(), mode, dtype));
    let kernel = Kernel::Pool2dBackward {
        mode,
        window: case.window,
        grad: g.arg(),
        indices: idx.as_ref().map(|b| b.arg(&iv.layout)),
        out: out.arg(&out_layout),
    };
    if h.launch(&what, &kernel) {
        let (want, scale) = backward_reference(mode, &case.window, case.input, &g.values, indices);
        let (tolerance, per_term) = (Tolerance::of(dtype), accumulation(dtype, &case.window));
        h.check_with(&what, &out, &out_layout, &want, |i, want| {
            tolerance.allowed(want) + per_term * scale[i]
        });
    }
}

/// Indices a forward never writes, mixed with the right ones: negative, past the plane, the
/// extremes of i64, a random position of the plane (mostly outside the window), and the flat
/// index `y·W + x` of the window's first tap even where that tap is padding (which aliases a
/// position of another row).
fn hostile_indices(h: &Harness, case: &Case, right: &[i64]) -> Vec<i64> {
    let [_, _, oh, ow] = case.output();
    let [hh, ww] = [case.input[2] as i64, case.input[3] as i64];
    let w = &case.window;
    right
        .iter()
        .enumerate()
        .map(|(k, &good)| {
            let (i, j) = (((k / ow) % oh) as i64, (k % ow) as i64);
            let (y0, x0) = (
                i * w.stride[0] as i64 - w.padding[0] as i64,
                j * w.stride[1] as i64 - w.padding[1] as i64,
            );
            match h.below(9) {
                0 | 1 => good,
                2 => -1,
                3 => -(h.below(1000) as i64) - 2,
                4 => i64::MIN,
                5 => i64::MAX,
                6 => hh * ww + h.below(50) as i64,
                7 => h.below((hh * ww) as usize) as i64,
                _ => y0 * ww + x0,
            }
        })
        .collect()
}

/// One case in one mode: the forward (max with and without indices) where `fwd`, the backward
/// (max fed the reference's indices, then hostile ones) where `bwd`.
fn run_case(h: &Harness, dtype: DType, mode: PoolMode, case: &Case, fwd: bool, bwd: bool) {
    let x = random_input(h, dtype, mode, case);
    if fwd {
        check_forward(h, dtype, mode, case, &x, false);
        if mode == PoolMode::Max {
            check_forward(h, dtype, mode, case, &x, true);
        }
    }
    if bwd {
        let right = forward_reference(mode, &case.window, case.input, &x.values).indices;
        check_backward(h, dtype, mode, case, &right, "");
        if mode == PoolMode::Max {
            let hostile = hostile_indices(h, case, &right);
            check_backward(h, dtype, mode, case, &hostile, ", hostile indices");
        }
    }
}

/// Hand-made max planes over [1, 3, 5, 6]: channel 0 all -inf (every window, padded or not,
/// must name its first in-plane tap), channel 1 -inf with NaNs and +infs (first NaN, first
/// +inf), channel 2 a pattern of ties (first largest, ±0 included).
fn edge_values() -> Vec<f64> {
    let (h, w) = (5, 6);
    let mut v = vec![f64::NEG_INFINITY; h * w];
    v.extend((0..h * w).map(|k| match k % 7 {
        0 => f64::NAN,
        3 | 4 => f64::INFINITY,
        _ => f64::NEG_INFINITY,
    }));
    v.extend((0..h * w).map(|k| match (k / w + k % w) % 4 {
        0 => 0.0,
        1 => -0.0,
        2 => 1.5,
        _ => -1.0,
    }));
    v
}

/// The edge planes through two windows (both padded) and two layouts, forward and backward.
fn edge_cases(h: &Harness, dtype: DType, fwd: bool, bwd: bool) {
    let values = edge_values();
    for (kernel, stride, padding, x) in [
        ([3, 3], [2, 2], [1, 1], Lay::Contiguous),
        ([2, 3], [1, 1], [1, 1], Lay::ChannelsLast),
    ] {
        let case = Case {
            input: [1, 3, 5, 6],
            window: PoolWindow::new(kernel, stride, padding),
            x,
            g: Lay::Contiguous,
            idx: Lay::Contiguous,
        };
        let operand = operand_with(h, dtype, view4(x, case.input), &values);
        if fwd {
            check_forward(h, dtype, PoolMode::Max, &case, &operand, false);
            check_forward(h, dtype, PoolMode::Max, &case, &operand, true);
        }
        if bwd {
            let right = forward_reference(PoolMode::Max, &case.window, case.input, &operand.values).indices;
            check_backward(h, dtype, PoolMode::Max, &case, &right, ", hand-made planes");
        }
    }
}

/// The smallest well-formed kernel of `op` over one element, to check that an unlisted dtype is
/// refused.
fn tiny(op: Op, x: &DeviceBuffer, idx: &DeviceBuffer, out: &DeviceBuffer) -> Kernel {
    let one = [1, 1, 1, 1];
    let window = PoolWindow::new([1, 1], [1, 1], [0, 0]);
    let mode = |kind| match kind {
        PoolKind::Max => PoolMode::Max,
        PoolKind::Avg => PoolMode::Avg {
            count_include_pad: true,
        },
    };
    match op {
        Op::Pool2d(kind) => Kernel::Pool2d {
            mode: mode(kind),
            window,
            input: x.contiguous(&one),
            out: out.contiguous(&one),
            indices: None,
        },
        Op::Pool2dBackward(kind) => Kernel::Pool2dBackward {
            mode: mode(kind),
            window,
            grad: x.contiguous(&one),
            indices: (kind == PoolKind::Max).then(|| idx.contiguous(&one)),
            out: out.contiguous(&one),
        },
        other => panic!("suite bug: {other:?} is not a pooling op"),
    }
}

/// The forward (`backward` false) or backward kernels of both kinds over the case table for
/// every dtype the backend lists; every other dtype must be refused with `Unsupported`.
fn run_all(h: &Harness, backward: bool) {
    for kind in PoolKind::ALL {
        let op = if backward {
            Op::Pool2dBackward(kind)
        } else {
            Op::Pool2d(kind)
        };
        for dtype in DType::ALL {
            if !h.supports(op, dtype) {
                let (x, idx, out) = (
                    h.upload(dtype, &[1.0]),
                    h.upload(DType::I64, &[0.0]),
                    h.poisoned(dtype, 1),
                );
                h.expect_unsupported(&format!("{} {dtype}", op.name()), &tiny(op, &x, &idx, &out));
                continue;
            }
            for case in cases() {
                for mode in case.modes(kind) {
                    run_case(h, dtype, mode, &case, !backward, backward);
                }
            }
            if kind == PoolKind::Max {
                edge_cases(h, dtype, !backward, backward);
            }
        }
    }
}

/// `Pool2d` (max with and without indices, average with both divisors) over the case table for
/// every dtype the backend lists; every other dtype must be refused with `Unsupported`; then
/// the malformed forward kernels.
pub fn pool2d(h: &Harness) {
    run_all(h, false);
    malformed(h, false);
}

/// `Pool2dBackward` (max from the reference's indices and from hostile ones, average with both
/// divisors) over the case table for every dtype the backend lists; every other dtype must be
/// refused with `Unsupported`; then the malformed backward kernels.
pub fn pool2d_backward(h: &Harness) {
    run_all(h, true);
    malformed(h, true);
}

/// Malformed pooling kernels over a [2, 3, 6, 6] input with a 3×3 window, stride 2, padding 1:
/// the output is [2, 3, 3, 3].
fn malformed(h: &Harness, backward: bool) {
    use ErrorKind::*;
    let op = |kind| {
        if backward {
            Op::Pool2dBackward(kind)
        } else {
            Op::Pool2d(kind)
        }
    };
    let f = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| PoolKind::ALL.iter().all(|&k| h.supports(op(k), d)))
        .unwrap_or(DType::F32);
    let other = if f == DType::F64 { DType::F32 } else { DType::F64 };
    let (x, y) = ([2, 3, 6, 6], [2, 3, 3, 3]);
    let zeros = |dtype, shape: &[usize]| h.upload(dtype, &vec![0.0; shape.iter().product()]);
    let (xb, yb, idx) = (zeros(f, &x), zeros(f, &y), zeros(DType::I64, &y));
    let (x_out, y_out) = (zeros(f, &x), zeros(f, &y));
    let (ints, int_out) = (zeros(DType::I32, &x), zeros(DType::I32, &y));
    let (idx32, wide) = (zeros(DType::I32, &y), zeros(other, &x));
    let (wrong, idx_wrong) = (zeros(f, &[2, 3, 3, 4]), zeros(DType::I64, &[2, 3, 3, 4]));
    let window = PoolWindow::new([3, 3], [2, 2], [1, 1]);
    let max = PoolMode::Max;
    let avg = PoolMode::Avg {
        count_include_pad: false,
    };
    let fwd = |mode, window, input: TensorArg, out: TensorArg, indices| Kernel::Pool2d {
        mode,
        window,
        input,
        out,
        indices,
    };
    let bwd = |mode, window, grad: TensorArg, indices, out: TensorArg| Kernel::Pool2dBackward {
        mode,
        window,
        grad,
        indices,
        out,
    };
    let transposed = dense(&y).transpose(2, 3).expect("rank 4");
    let cases = if !backward {
        vec![
            (
                "a 3-D input",
                fwd(
                    max,
                    window,
                    xb.contiguous(&[6, 6, 6]),
                    y_out.contiguous(&[6, 3, 3]),
                    None,
                ),
                InvalidArgument,
            ),
            (
                "average pooling with indices",
                fwd(
                    avg,
                    window,
                    xb.contiguous(&x),
                    y_out.contiguous(&y),
                    Some(idx.contiguous(&y)),
                ),
                InvalidArgument,
            ),
            (
                "i32 indices",
                fwd(
                    max,
                    window,
                    xb.contiguous(&x),
                    y_out.contiguous(&y),
                    Some(idx32.contiguous(&y)),
                ),
                WrongDType,
            ),
            (
                "a [2, 3, 3, 4] output where the window gives [2, 3, 3, 3]",
                fwd(max, window, xb.contiguous(&x), wrong.contiguous(&[2, 3, 3, 4]), None),
                ShapeMismatch,
            ),
            (
                "padding 2 for a 3×3 kernel",
                fwd(
                    max,
                    PoolWindow::new([3, 3], [2, 2], [2, 1]),
                    xb.contiguous(&x),
                    y_out.contiguous(&[2, 3, 4, 3]),
                    None,
                ),
                InvalidArgument,
            ),
            (
                "average pooling with dilation 2",
                fwd(
                    avg,
                    PoolWindow {
                        dilation: [2, 2],
                        ..window
                    },
                    xb.contiguous(&x),
                    y_out.contiguous(&[2, 3, 2, 2]),
                    None,
                ),
                InvalidArgument,
            ),
            (
                "kernel 0",
                fwd(
                    max,
                    PoolWindow::new([0, 3], [2, 2], [0, 1]),
                    xb.contiguous(&x),
                    y_out.contiguous(&y),
                    None,
                ),
                InvalidArgument,
            ),
            (
                "a dilated window larger than the padded plane",
                fwd(
                    max,
                    PoolWindow {
                        dilation: [4, 4],
                        ..window
                    },
                    xb.contiguous(&x),
                    y_out.contiguous(&y),
                    None,
                ),
                InvalidArgument,
            ),
            (
                "a dilated window whose taps all fall in the padding",
                fwd(
                    max,
                    PoolWindow {
                        kernel: [2, 2],
                        stride: [1, 1],
                        padding: [1, 1],
                        dilation: [3, 3],
                    },
                    xb.contiguous(&[1, 1, 2, 2]),
                    y_out.contiguous(&[1, 1, 1, 1]),
                    None,
                ),
                InvalidArgument,
            ),
            (
                "a transposed output",
                fwd(max, window, xb.contiguous(&x), y_out.arg(&transposed), None),
                InvalidArgument,
            ),
            (
                "an output written over the input",
                fwd(max, window, xb.contiguous(&x), xb.contiguous(&y), None),
                InvalidArgument,
            ),
            (
                "an i32 input",
                fwd(max, window, ints.contiguous(&x), int_out.contiguous(&y), None),
                WrongDType,
            ),
        ]
    } else {
        vec![
            (
                "a 3-D gradient plane",
                bwd(
                    max,
                    window,
                    yb.contiguous(&[6, 3, 3]),
                    Some(idx.contiguous(&[6, 3, 3])),
                    x_out.contiguous(&[6, 6, 6]),
                ),
                InvalidArgument,
            ),
            (
                "max pooling without indices",
                bwd(max, window, yb.contiguous(&y), None, x_out.contiguous(&x)),
                InvalidArgument,
            ),
            (
                "average pooling with indices",
                bwd(
                    avg,
                    window,
                    yb.contiguous(&y),
                    Some(idx.contiguous(&y)),
                    x_out.contiguous(&x),
                ),
                InvalidArgument,
            ),
            (
                "indices shaped [2, 3, 3, 4] for a [2, 3, 3, 3] gradient",
                bwd(
                    max,
                    window,
                    yb.contiguous(&y),
                    Some(idx_wrong.contiguous(&[2, 3, 3, 4])),
                    x_out.contiguous(&x),
                ),
                ShapeMismatch,
            ),
            (
                "float indices",
                bwd(
                    max,
                    window,
                    yb.contiguous(&y),
                    Some(yb.contiguous(&y)),
                    x_out.contiguous(&x),
                ),
                WrongDType,
            ),
            (
                "a [2, 3, 3, 4] gradient where the window gives [2, 3, 3, 3]",
                bwd(avg, window, wrong.contiguous(&[2, 3, 3, 4]), None, x_out.contiguous(&x)),
                ShapeMismatch,
            ),
            (
                "padding 2 for a 3×3 kernel",
                bwd(
                    avg,
                    PoolWindow::new([3, 3], [2, 2], [2, 1]),
                    zeros(f, &[2, 3, 4, 3]).contiguous(&[2, 3, 4, 3]),
                    None,
                    x_out.contiguous(&x),
                ),
                InvalidArgument,
            ),
            (
                "an input gradient of another dtype",
                bwd(avg, window, yb.contiguous(&y), None, wide.contiguous(&x)),
                InvalidArgument,
            ),
            (
                "an input gradient written over the gradient",
                bwd(avg, window, xb.contiguous(&y), None, xb.contiguous(&x)),
                InvalidArgument,
            ),
            (
                "an input gradient into a transposed view",
                bwd(
                    avg,
                    window,
                    yb.contiguous(&y),
                    None,
                    x_out.arg(&dense(&x).transpose(2, 3).expect("rank 4")),
                ),
                InvalidArgument,
            ),
            (
                "an i32 gradient",
                bwd(avg, window, int_out.contiguous(&y), None, ints.contiguous(&x)),
                WrongDType,
            ),
        ]
    };
    for (what, kernel, kind) in cases {
        let name = kernel.op().name();
        h.expect_refused(&format!("{name} with {what}"), &kernel, kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The references on cases worked by hand.
    #[test]
    fn references_match_hand_computed_pools() {
        // A 2×2 window, stride 1, padding 1 over [[1, 2], [3, 4]]: a 3×3 output.
        let window = PoolWindow::new([2, 2], [1, 1], [1, 1]);
        let x = [1.0, 2.0, 3.0, 4.0];
        let max = forward_reference(PoolMode::Max, &window, [1, 1, 2, 2], &x);
        assert_eq!(max.values, vec![1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 3.0, 4.0, 4.0]);
        assert_eq!(max.indices, vec![0, 1, 1, 2, 3, 3, 2, 3, 3]);
        let with_pad = forward_reference(
            PoolMode::Avg {
                count_include_pad: true,
            },
            &window,
            [1, 1, 2, 2],
            &x,
        );
        assert_eq!(with_pad.values[0], 0.25);
        assert_eq!(with_pad.values[4], 2.5);
        let without = forward_reference(
            PoolMode::Avg {
                count_include_pad: false,
            },
            &window,
            [1, 1, 2, 2],
            &x,
        );
        assert_eq!(without.values[0], 1.0);
        assert_eq!(without.values[1], 1.5);
        // First NaN, else first largest; an all -inf window names its first in-plane tap.
        let (nan, inf) = (f64::NAN, f64::NEG_INFINITY);
        let one = PoolWindow::new([1, 3], [1, 1], [0, 1]);
        let edge = forward_reference(PoolMode::Max, &one, [1, 1, 1, 4], &[inf, inf, 5.0, nan]);
        assert_eq!(edge.indices, vec![0, 2, 3, 3]);
        let ties = forward_reference(PoolMode::Max, &one, [1, 1, 1, 3], &[2.0, 2.0, nan]);
        assert_eq!(ties.indices, vec![0, 2, 2]);
        // The max backward adds each window's gradient at its index; a window whose index
        // names no tap of its own adds nothing.
        let (gx, _) = backward_reference(PoolMode::Max, &window, [1, 1, 2, 2], &[1.0; 9], &max.indices);
        assert_eq!(gx, vec![1.0, 2.0, 2.0, 4.0]);
        let mut wrong = max.indices.clone();
        wrong[0] = 3; // window (0, 0) has only the tap 0 in the plane
        wrong[1] = -1;
        let (gx, _) = backward_reference(PoolMode::Max, &window, [1, 1, 2, 2], &[1.0; 9], &wrong);
        assert_eq!(gx, vec![0.0, 1.0, 2.0, 4.0]);
        // The average backward spreads each gradient over its window's divisor.
        let (gx, _) = backward_reference(
            PoolMode::Avg {
                count_include_pad: true,
            },
            &window,
            [1, 1, 2, 2],
            &[4.0; 9],
            &[],
        );
        assert_eq!(gx, vec![4.0; 4]);
    }

    #[test]
    fn cases_are_valid_and_views_have_their_shapes() {
        for case in cases() {
            let out = case.output();
            assert_eq!(view4(case.x, case.input).layout.shape(), case.input);
            assert_eq!(view4(case.g, out).layout.shape(), out);
            let idx = view4(case.idx, out);
            assert_eq!(idx.layout.shape(), out);
            assert!(idx.layout.is_non_overlapping(), "{case:?}: indices must not broadcast");
            let [_, _, h, w] = case.input;
            for i in 0..out[2] {
                for j in 0..out[3] {
                    assert!(case.window.taps_inside([h, w], [i, j]) > 0, "{case:?}");
                }
            }
            if let Lay::Narrowed = case.x {
                assert_eq!(view4(case.x, case.input).layout.strides()[2] % 2, 1);
            }
        }
    }
}
