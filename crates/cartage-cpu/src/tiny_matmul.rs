//! Register-tiled products for tiny matrices (at most [`TINY_MATMUL`] multiply-adds), where a
//! matmul crate's per-call cost (dispatch, packing: about 0.2 µs) exceeds the arithmetic; the
//! measured crossover with `gemm` lies between 24³ and 32³ on the development machine. This is
//! what makes a batch of 1000 8×8 products cheap on the cpu (LESSONS R3).
//!
//! Tiles of 4 rows (then single rows) by 8, 4, 2 and 1 columns accumulate `a[i, p] · b[p, j]`
//! over `p` in registers, vectorised along `j` when `b`'s rows are dense. Where the processor
//! has AVX2 and FMA the same code is compiled for them (one rounding per multiply-add, as
//! `gemm` does); elsewhere it runs on the baseline instruction set with a multiply and an add.

use crate::matmul::{GemmScalar, Strides};

/// Products of at most this many multiply-adds (24³) run here instead of in `gemm`.
pub const TINY_MATMUL: usize = 24 * 24 * 24;

/// `c = a · b` for a tiny product, with the best instruction set the processor has.
///
/// # Safety
/// The pointers and strides describe matrices inside live host buffers; `c`'s elements are
/// distinct and not read concurrently.
pub(crate) unsafe fn tiny<T: GemmScalar>(
    mnk: (usize, usize, usize),
    a: *const T,
    sa: Strides,
    b: *const T,
    sb: Strides,
    c: *mut T,
    sc: Strides,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: forwarded; the processor has AVX2 and FMA.
        unsafe { tiny_gemm_fma(mnk, a, sa, b, sb, c, sc) };
        return;
    }
    // SAFETY: forwarded.
    unsafe { tiny_gemm::<T, false>(mnk, a, sa, b, sb, c, sc) }
}

/// `c = a · b` in register tiles: blocks of 4 rows (then single rows) by 8, 4, 2 and 1 columns.
/// A tile accumulates `a[i, p] · b[p, j]` over `p` in registers (vectorised along `j` when `b`'s
/// rows are dense, four independent rows in flight), in the textbook summation order; `FUSED`
/// uses one rounding per multiply-add (as `gemm` does).
///
/// # Safety
/// As [`tiny`].
#[inline(always)]
unsafe fn tiny_gemm<T: GemmScalar, const FUSED: bool>(
    (m, n, k): (usize, usize, usize),
    a: *const T,
    sa: Strides,
    b: *const T,
    sb: Strides,
    c: *mut T,
    sc: Strides,
) {
    let mut i = 0;
    while i < m {
        let rows = if m - i >= 4 { 4 } else { 1 };
        let mut j = 0;
        while j < n {
            let cols = match n - j {
                8.. => 8,
                4..=7 => 4,
                2..=3 => 2,
                _ => 1,
            };
            let at = Tile {
                i,
                j,
                k,
                a,
                sa,
                b,
                sb,
                c,
                sc,
            };
            // SAFETY: rows i..i + rows and columns j..j + cols are inside the product.
            unsafe {
                match (rows, cols) {
                    (4, 8) => at.run::<4, 8, FUSED>(),
                    (4, 4) => at.run::<4, 4, FUSED>(),
                    (4, 2) => at.run::<4, 2, FUSED>(),
                    (4, _) => at.run::<4, 1, FUSED>(),
                    (_, 8) => at.run::<1, 8, FUSED>(),
                    (_, 4) => at.run::<1, 4, FUSED>(),
                    (_, 2) => at.run::<1, 2, FUSED>(),
                    _ => at.run::<1, 1, FUSED>(),
                }
            }
            j += cols;
        }
        i += rows;
    }
}

/// [`tiny_gemm`] compiled for AVX2 with fused multiply-adds.
///
/// # Safety
/// As [`tiny_gemm`], and the processor supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiny_gemm_fma<T: GemmScalar>(
    mnk: (usize, usize, usize),
    a: *const T,
    sa: Strides,
    b: *const T,
    sb: Strides,
    c: *mut T,
    sc: Strides,
) {
    // SAFETY: forwarded.
    unsafe { tiny_gemm::<T, true>(mnk, a, sa, b, sb, c, sc) }
}

/// One register tile of [`tiny_gemm`]: output rows from `i`, columns from `j`.
struct Tile<T> {
    i: usize,
    j: usize,
    k: usize,
    a: *const T,
    sa: Strides,
    b: *const T,
    sb: Strides,
    c: *mut T,
    sc: Strides,
}

impl<T: GemmScalar> Tile<T> {
    /// `c[i + r, j + q] = Σ_p a[i + r, p] · b[p, j + q]` for `r < R`, `q < W`.
    ///
    /// # Safety
    /// The tile lies inside the product's operands.
    #[inline(always)]
    unsafe fn run<const R: usize, const W: usize, const FUSED: bool>(&self) {
        // SAFETY: forwarded; dense rows of `b` get their own loop so that it vectorises.
        let acc = unsafe {
            if self.sb.col == 1 {
                self.accumulate::<R, W, FUSED, true>()
            } else {
                self.accumulate::<R, W, FUSED, false>()
            }
        };
        let sc = self.sc;
        // SAFETY: the caller's bounds: rows i..i + R, columns j..j + W.
        unsafe {
            let c = self.c.offset(self.i as isize * sc.row + self.j as isize * sc.col);
            for (r, acc) in acc.iter().enumerate() {
                let row = c.offset(r as isize * sc.row);
                for (q, &v) in acc.iter().enumerate() {
                    if sc.col == 1 {
                        *row.add(q) = v;
                    } else {
                        *row.offset(q as isize * sc.col) = v;
                    }
                }
            }
        }
    }

    /// The tile's sums, `b`'s columns at stride 1 when `DENSE_B`.
    ///
    /// # Safety
    /// As [`Tile::run`].
    #[inline(always)]
    unsafe fn accumulate<const R: usize, const W: usize, const FUSED: bool, const DENSE_B: bool>(&self) -> [[T; W]; R] {
        let mut acc = [[T::ZERO; W]; R];
        let (sa, sb) = (self.sa, self.sb);
        // SAFETY: the caller's bounds: rows i..i + R, columns j..j + W, p < k.
        unsafe {
            let a = self.a.offset(self.i as isize * sa.row);
            let b = self.b.offset(self.j as isize * sb.col);
            for p in 0..self.k {
                let brow = b.offset(p as isize * sb.row);
                let mut y = [T::ZERO; W];
                for (q, y) in y.iter_mut().enumerate() {
                    *y = if DENSE_B {
                        *brow.add(q)
                    } else {
                        *brow.offset(q as isize * sb.col)
                    };
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = *a.offset(r as isize * sa.row + p as isize * sa.col);
                    for (acc, &y) in acc.iter_mut().zip(&y) {
                        *acc = if FUSED { T::fused(x, y, *acc) } else { *acc + x * y };
                    }
                }
            }
        }
        acc
    }
}
