//! `Kernel::Pool2d` and `Kernel::Pool2dBackward`: 2-D max and average pooling and their input
//! gradients, in f32 (f64 for f64), rounded once on store.
//!
//! Both walk rows of planes: a unit of work is one row of one `[H, W]` plane of the contiguous
//! output (an output row `i` for the forward, an input row `y` for the backward), so the rows
//! a task writes are its own and large launches split across rayon with no shared writes.
//! Operands read through any strides, broadcast included.
//!
//! The forward reads each window's in-plane taps in row-major window order: max keeps the first
//! NaN, else the first largest tap (strict `>`, starting from the first in-plane tap, so padding
//! never wins and an all `-inf` window names its first in-plane tap); average sums the in-plane
//! taps and divides once. The backward is a gather per input position: it visits the windows
//! that contain the position (at most `kh·kw`, found by arithmetic, never by scanning) and sums
//! their contributions, so it is deterministic and needs no atomics. Max pooling's indices are
//! only compared with the position, never used as an address.

use cartage_core::{Device, Error, PoolMode, PoolWindow, Result, TensorArg};

use crate::dispatch::with_float;
use crate::elem::{Float, Real};
use crate::map::base;
use crate::strided::{CHUNK_MIN_ELEMENTS, SyncPtr, for_ranges_with};

/// `Kernel::Pool2d`.
pub fn pool2d(
    mode: PoolMode,
    window: PoolWindow,
    input: &TensorArg,
    out: &TensorArg,
    indices: Option<&TensorArg>,
) -> Result<()> {
    with_float!(input.dtype, T => {
        // SAFETY: launch ran `Kernel::validate`: a 4-D input, `out` (and `indices`) contiguous
        // `[N, C, OH, OW]` for the window, every view inside its buffer, the written operands
        // apart from the input and from each other.
        unsafe { forward::<T>(mode, window, input, out, indices) };
        Ok(())
    }, else Err(unsupported(mode.kind().name(), input)))
}

/// `Kernel::Pool2dBackward`.
pub fn pool2d_backward(
    mode: PoolMode,
    window: PoolWindow,
    grad: &TensorArg,
    indices: Option<&TensorArg>,
    out: &TensorArg,
) -> Result<()> {
    with_float!(grad.dtype, T => {
        // SAFETY: launch ran `Kernel::validate`: `grad` (and `indices`, i64) `[N, C, OH, OW]`
        // for the window over `out`'s plane, `out` contiguous, every view inside its buffer,
        // `out` apart from both inputs.
        unsafe { backward::<T>(mode, window, grad, indices, out) };
        Ok(())
    }, else Err(unsupported(mode.kind().backward_name(), grad)))
}

#[cold]
fn unsupported(op: &'static str, arg: &TensorArg) -> Error {
    Error::unsupported(op, arg.dtype, Device::cpu(), "pooling is defined for float dtypes")
}

/// The window's taps along one axis: `(start, lo, hi)` where tap `t` of an output position sits
/// at `start + t·dilation`, and taps `lo..hi` are inside `0..size`.
#[inline(always)]
fn taps(out_pos: usize, axis: usize, window: &PoolWindow, size: usize) -> (isize, usize, usize) {
    let (k, d) = (window.kernel[axis], window.dilation[axis]);
    let start = (out_pos * window.stride[axis]) as isize - window.padding[axis] as isize;
    let lo = if start < 0 {
        ((-start) as usize).div_ceil(d).min(k)
    } else {
        0
    };
    let hi = if start >= size as isize {
        lo
    } else {
        k.min(((size as isize - start) as usize).div_ceil(d))
    };
    (start, lo, hi.max(lo))
}

/// The number of taps of each output position along one axis that lie inside `0..size`.
fn inside_counts(count: usize, axis: usize, window: &PoolWindow, size: usize) -> Vec<usize> {
    (0..count)
        .map(|i| {
            let (_, lo, hi) = taps(i, axis, window, size);
            hi - lo
        })
        .collect()
}

/// Rows of planes go to rayon only when an operand is as large as the backend's rule for
/// entering its pool (`CHUNK_MIN_ELEMENTS` elements), so a parallel loop never runs on the
/// global pool; a task then gets at least that many elements of work.
fn for_rows(rows: usize, row_work: usize, largest: usize, body: impl Fn(usize, usize) + Sync) {
    let min_parallel = if largest >= CHUNK_MIN_ELEMENTS { 2 } else { usize::MAX };
    for_ranges_with(rows, min_parallel, (CHUNK_MIN_ELEMENTS / row_work.max(1)).max(1), body);
}

/// The `[N, C]` dims of an operand seen as one list of planes.
#[derive(Clone, Copy)]
struct Planes {
    channels: usize,
}

impl Planes {
    /// The element offset of plane `p` (`n·C + c`) in an operand with strides `s`.
    #[inline(always)]
    fn offset(self, p: usize, s: &[usize]) -> usize {
        (p / self.channels) * s[0] + (p % self.channels) * s[1]
    }
}

/// # Safety
/// See [`pool2d`]: the kernel was validated and `T` is the storage type of `input` and `out`.
unsafe fn forward<T: Real>(
    mode: PoolMode,
    window: PoolWindow,
    input: &TensorArg,
    out: &TensorArg,
    indices: Option<&TensorArg>,
) {
    let xs = input.layout.shape();
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (oh, ow) = (out.layout.shape()[2], out.layout.shape()[3]);
    let sx = input.layout.strides();
    let (sy, sxw) = (sx[2], sx[3]);
    let planes = Planes { channels: c.max(1) };
    let (x, y) = (base::<T>(input), base::<T>(out));
    let idx: Option<SyncPtr<i64>> = indices.map(base::<i64>);
    // Columns' tap ranges are the same for every output row.
    let cols: Vec<(isize, usize, usize)> = (0..ow).map(|j| taps(j, 1, &window, w)).collect();
    let rows_inside = inside_counts(oh, 0, &window, h);
    let (dy, dx) = (window.dilation[0] as isize, window.dilation[1] as isize);
    let body = |start: usize, end: usize| {
        for unit in start..end {
            let (p, i) = (unit / oh, unit % oh);
            let plane = planes.offset(p, sx);
            let (y0, ylo, yhi) = taps(i, 0, &window, h);
            let row_out = unit * ow;
            for (j, &(x0, xlo, xhi)) in cols.iter().enumerate() {
                let value = match mode {
                    PoolMode::Max => {
                        let mut best = T::C::NEG_INFINITY;
                        // The first in-plane tap (an all `-inf` window keeps it).
                        let mut at = (y0 + ylo as isize * dy) * w as isize + x0 + xlo as isize * dx;
                        'window: for a in ylo..yhi {
                            let yy = (y0 + a as isize * dy) as usize;
                            for b in xlo..xhi {
                                let xx = (x0 + b as isize * dx) as usize;
                                // SAFETY: `yy < h`, `xx < w` and `p < n·c`: inside the input
                                // view, which validate kept inside its buffer.
                                let v = unsafe { *x.add(plane + yy * sy + xx * sxw) }.load();
                                if v > best || v.is_nan() {
                                    best = v;
                                    at = (yy * w + xx) as isize;
                                    if v.is_nan() {
                                        break 'window;
                                    }
                                }
                            }
                        }
                        if let Some(idx) = idx {
                            // A window with no in-plane tap (possible only with dilation) names
                            // no position: -1.
                            let named = if ylo < yhi && xlo < xhi { at as i64 } else { -1 };
                            // SAFETY: `row_out + j < n·c·oh·ow`: inside the contiguous indices,
                            // a row this task alone writes.
                            unsafe { *idx.add(row_out + j) = named };
                        }
                        best
                    }
                    PoolMode::Avg { count_include_pad } => {
                        let mut sum = T::C::ZERO;
                        for a in ylo..yhi {
                            let yy = (y0 + a as isize * dy) as usize;
                            for b in xlo..xhi {
                                let xx = (x0 + b as isize * dx) as usize;
                                // SAFETY: as for max: an in-plane tap of plane `p`.
                                sum = sum + unsafe { *x.add(plane + yy * sy + xx * sxw) }.load();
                            }
                        }
                        let divisor = if count_include_pad {
                            window.kernel[0] * window.kernel[1]
                        } else {
                            rows_inside[i] * (xhi - xlo)
                        };
                        sum / T::C::from_usize(divisor)
                    }
                };
                // SAFETY: inside the contiguous output, in a row this task alone writes.
                unsafe { *y.add(row_out + j) = T::store(value) };
            }
        }
    };
    let taps_per_window = window.kernel[0] * window.kernel[1];
    let largest = input.layout.numel().max(out.layout.numel());
    for_rows(n * c * oh, ow * taps_per_window, largest, body);
}

/// # Safety
/// See [`pool2d_backward`]: the kernel was validated and `T` is the storage type of `grad` and
/// `out`.
unsafe fn backward<T: Real>(
    mode: PoolMode,
    window: PoolWindow,
    grad: &TensorArg,
    indices: Option<&TensorArg>,
    out: &TensorArg,
) {
    let xs = out.layout.shape();
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (oh, ow) = (grad.layout.shape()[2], grad.layout.shape()[3]);
    let sg = grad.layout.strides();
    let planes = Planes { channels: c.max(1) };
    let (g, y) = (base::<T>(grad), base::<T>(out));
    let idx = indices.map(|a| (base::<i64>(a), a.layout.strides()));
    // For every input column, the windows `j` containing it; likewise for rows, per row.
    let col_windows: Vec<Vec<usize>> = (0..w).map(|x| windows_containing(x, 1, &window, ow)).collect();
    let row_windows: Vec<Vec<usize>> = (0..h).map(|r| windows_containing(r, 0, &window, oh)).collect();
    // Average pooling's divisor of each window, as a factor per axis.
    let (rows_inside, cols_inside) = (inside_counts(oh, 0, &window, h), inside_counts(ow, 1, &window, w));
    let body = |start: usize, end: usize| {
        for unit in start..end {
            let (p, r) = (unit / h, unit % h);
            let g_plane = planes.offset(p, sg);
            let idx_plane = idx.map(|(ptr, s)| (ptr, planes.offset(p, s), s[2], s[3]));
            let row_out = unit * w;
            for (xx, cols) in col_windows.iter().enumerate() {
                let mut sum = T::C::ZERO;
                let here = (r * w + xx) as i64;
                for &i in &row_windows[r] {
                    for &j in cols {
                        // SAFETY: `i < oh`, `j < ow`, `p < n·c`: inside the gradient view.
                        let gv = unsafe { *g.add(g_plane + i * sg[2] + j * sg[3]) }.load();
                        match mode {
                            PoolMode::Max => {
                                let Some((ptr, at, si, sj)) = idx_plane else { continue };
                                // SAFETY: the indices have the gradient's shape (validate):
                                // inside their view. The value is compared, never dereferenced.
                                let named = unsafe { *ptr.add(at + i * si + j * sj) };
                                if named == here {
                                    sum = sum + gv;
                                }
                            }
                            PoolMode::Avg { count_include_pad } => {
                                let divisor = if count_include_pad {
                                    window.kernel[0] * window.kernel[1]
                                } else {
                                    rows_inside[i] * cols_inside[j]
                                };
                                sum = sum + gv / T::C::from_usize(divisor);
                            }
                        }
                    }
                }
                // SAFETY: inside the contiguous output, in a row this task alone writes.
                unsafe { *y.add(row_out + xx) = T::store(sum) };
            }
        }
    };
    let largest = grad.layout.numel().max(out.layout.numel());
    for_rows(n * c * h, w * window.kernel[0] * window.kernel[1], largest, body);
}

/// The output positions along one axis whose window has a tap at input position `pos`: for tap
/// `t`, `i·stride − padding + t·dilation = pos` with `0 ≤ i < count`.
fn windows_containing(pos: usize, axis: usize, window: &PoolWindow, count: usize) -> Vec<usize> {
    let (s, d) = (window.stride[axis], window.dilation[axis]);
    (0..window.kernel[axis])
        .filter_map(|t| {
            let shifted = (pos + window.padding[axis]).checked_sub(t * d)?;
            (shifted % s == 0 && shifted / s < count).then_some(shifted / s)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_cut_the_window_at_both_edges() {
        // Kernel 3, padding 1 over 5 positions: window 0 starts at -1 and loses its first tap.
        let w = PoolWindow::new([3, 3], [2, 2], [1, 1]);
        assert_eq!(taps(0, 0, &w, 5), (-1, 1, 3));
        assert_eq!(taps(2, 0, &w, 5), (3, 0, 2));
        assert_eq!(taps(1, 0, &w, 5), (1, 0, 3));
        // Dilation 3, kernel 2, padding 1 over 2 positions: taps -1 and 2, both outside.
        let dilated = PoolWindow {
            dilation: [3, 3],
            ..PoolWindow::new([2, 2], [1, 1], [1, 1])
        };
        let (_, lo, hi) = taps(0, 0, &dilated, 2);
        assert_eq!(lo, hi);
        // Dilation 2: taps -1, 1, 3 over 4 positions keep 1 and 3.
        let d2 = PoolWindow { dilation: [2, 2], ..w };
        assert_eq!(taps(0, 0, &d2, 4), (-1, 1, 3));
        assert_eq!(inside_counts(3, 0, &w, 5), vec![2, 3, 2]);
    }

    #[test]
    fn windows_containing_inverts_taps() {
        for (kernel, stride, padding, dilation, size) in
            [(3, 2, 1, 1, 7), (3, 1, 1, 2, 9), (2, 3, 1, 1, 8), (1, 1, 0, 1, 3)]
        {
            let w = PoolWindow {
                kernel: [kernel, 1],
                stride: [stride, 1],
                padding: [padding, 0],
                dilation: [dilation, 1],
            };
            let count = w.output_size([size, 1]).unwrap()[0];
            for pos in 0..size {
                let mut want: Vec<usize> = (0..count)
                    .filter(|&i| {
                        let (start, lo, hi) = taps(i, 0, &w, size);
                        (lo..hi).any(|t| start + (t * dilation) as isize == pos as isize)
                    })
                    .collect();
                want.sort_unstable();
                let mut got = windows_containing(pos, 0, &w, count);
                got.sort_unstable();
                assert_eq!(got, want, "{w:?} position {pos}");
            }
        }
    }
}
