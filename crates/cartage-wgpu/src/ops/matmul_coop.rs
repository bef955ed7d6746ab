//! f16 matmul on cooperative matrices with f16 inputs and f32 accumulators, where the adapter
//! has them (probed at run time: the experimental wgpu feature, a 16 × 16 × 16 f16 → f32
//! configuration, and one subgroup size). Two kernels, chosen by a [`CoopTiling`] when the
//! pipeline is made: `direct` (`shaders/matmul_coop.wgsl`: one subgroup per 64 × 64 block,
//! 16 × 16 × 16 fragments loaded straight from storage) and `staged`
//! (`matmul_coop_staged.rs`: several subgroups per workgroup, A and B tiles copied through
//! workgroup memory). The default is [`CoopTiling::DEFAULT`], or the `coop:` entry of
//! `CARTAGE_WGPU_MATMUL_VARIANT` (see `matmul_variant.rs`).
//!
//! Both kernels need row-major operands whose rows start on fragment boundaries: unit inner
//! strides, M and N multiples of the block, K of the K step, offsets and row strides multiples
//! of 16 elements (8 for the staged kernel's A and B). A problem the chosen kernel does not fit
//! tries the medium staged shape, then `direct`, then the tiled kernel (`matmul.rs`). bf16
//! takes the tiled kernel: converting bf16 to f16 per tile would lose range (f16 tops out at
//! 65504 and flushes below 6e-8, where bf16 spans f32's exponents), so bf16 products stay
//! exact in f32.

use cartage_core::{DType, Error, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::matmul_coop_staged;
pub(crate) use crate::ops::matmul_coop_tiling::CoopTiling;
use crate::wgsl;

const MATMUL_COOP: &str = include_str!("../../shaders/matmul_coop.wgsl");

/// Rows and columns of C per workgroup of the direct kernel.
const BM: usize = 64;
const BN: usize = 64;

/// The direct kernel's text for subgroups of `subgroup` invocations.
pub(crate) fn source(subgroup: u32, prefetch: bool) -> Result<String> {
    let pieces = wgsl::Pieces::parse("shaders/matmul_coop.wgsl", MATMUL_COOP);
    let (fm, fn_) = (BM / 16, BN / 16);
    let num = |v: usize| v.to_string();
    // Each piece repeated over the fragment rows (`I`), columns (`J`) or both.
    let over = |name: &str, rows: bool, cols: bool, sep: &str| -> Result<String> {
        let mut out = String::new();
        for i in 0..if rows { fm } else { 1 } {
            for j in 0..if cols { fn_ } else { 1 } {
                let (si, sj) = (num(i), num(j));
                let mut parts: Vec<(&str, &str)> = Vec::new();
                if rows {
                    parts.push(("I", &si));
                }
                if cols {
                    parts.push(("J", &sj));
                }
                out.push_str(&pieces.fill(name, &parts)?);
                out.push_str(sep);
            }
        }
        Ok(out)
    };
    let step = "\n        ";
    let mma = over("mma", true, true, step)?;
    let main_loop = if prefetch {
        pieces.fill(
            "loop_prefetch",
            &[
                (
                    "LOADS_VAR",
                    &(over("load_a_var", true, false, "\n    ")? + &over("load_b_var", false, true, "\n    ")?),
                ),
                (
                    "LOADS_NEXT",
                    &(over("load_a_next", true, false, step)? + &over("load_b_next", false, true, step)?),
                ),
                ("MMA", &mma),
                (
                    "ROTATE",
                    &(over("rotate_a", true, false, step)? + &over("rotate_b", false, true, step)?),
                ),
            ],
        )?
    } else {
        pieces.fill(
            "loop_plain",
            &[
                (
                    "LOADS",
                    &(over("load_a", true, false, step)? + &over("load_b", false, true, step)?),
                ),
                ("MMA", &mma),
            ],
        )?
    };
    pieces.fill_head(&[
        ("SUBGROUP", &subgroup.to_string()),
        ("BM", &num(BM)),
        ("BN", &num(BN)),
        ("FM", &num(fm)),
        ("FN", &num(fn_)),
        ("ACC_DECL", &over("acc_decl", true, true, "\n    ")?),
        ("MAIN_LOOP", &main_loop),
        ("STORES", &over("store", true, true, "\n    ")?),
    ])
}

/// The source of `tiling`'s kernel for subgroups of `subgroup`.
pub(crate) fn kernel_source(tiling: &CoopTiling, subgroup: u32) -> Result<String> {
    match tiling {
        CoopTiling::Direct { prefetch } => source(subgroup, *prefetch),
        CoopTiling::Staged(s) => matmul_coop_staged::source(s, subgroup),
    }
}

/// True when `lhs × rhs → out` (f16 in, f32 out) fits `tiling`'s layout rules.
pub(crate) fn fits(tiling: &CoopTiling, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg, offsets: [u64; 3]) -> bool {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (m, k, n) = (l[1], l[2], r[2]);
    let (ls, rs, os) = (lhs.layout.strides(), rhs.layout.strides(), out.layout.strides());
    let (bm, bn) = tiling.block();
    let operand_align = if matches!(tiling, CoopTiling::Staged(_)) { 8 } else { 16 };
    let aligned = |v: usize| v.is_multiple_of(16);
    let operand = |v: usize| v.is_multiple_of(operand_align);
    lhs.dtype == DType::F16
        && out.dtype == DType::F32
        && k > 0
        && m.is_multiple_of(bm as usize)
        && n.is_multiple_of(bn as usize)
        && k.is_multiple_of(tiling.k_step() as usize)
        && ls[2] == 1
        && rs[2] == 1
        && os[2] == 1
        && [ls[0], ls[1], rs[0], rs[1]].into_iter().all(operand)
        && [os[0], os[1]].into_iter().all(aligned)
        && operand(offsets[0] as usize)
        && operand(offsets[1] as usize)
        && offsets[2].is_multiple_of(16)
}

/// The default shape (`CARTAGE_WGPU_MATMUL_VARIANT`'s `coop:` entry, else
/// [`CoopTiling::DEFAULT`]), read once.
pub(crate) fn default_tiling() -> CoopTiling {
    static CHOSEN: std::sync::OnceLock<CoopTiling> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        crate::ops::matmul_variant::from_env()
            .coop
            .unwrap_or(CoopTiling::DEFAULT)
    })
}

/// The shapes to try for a `batch` × `m` × `n` product when `wanted` is asked for, best first:
/// `wanted` (unless a staged shape leaves the device short of workgroups), the medium staged
/// shape, then `direct`.
fn preference(wanted: CoopTiling, batch: usize, m: usize, n: usize) -> Vec<CoopTiling> {
    let tiles = |t: CoopTiling| {
        let (bm, bn) = t.block();
        batch * m.div_ceil(bm as usize) * n.div_ceil(bn as usize)
    };
    let mut order = Vec::with_capacity(3);
    if matches!(wanted, CoopTiling::Direct { .. }) || tiles(wanted) >= ENOUGH_TILES {
        order.push(wanted);
    }
    order.push(CoopTiling::MEDIUM);
    if !order.contains(&wanted) {
        order.push(wanted);
    }
    order.push(CoopTiling::DIRECT);
    order
}

/// Workgroups below which a large staged block leaves an H200-sized device half idle.
const ENOUGH_TILES: usize = 192;

/// Run `out[b] = lhs[b] × rhs[b]` on cooperative matrices (the caller checked that the device
/// has them) with `wanted`, or the first fitting shape after it (see [`preference`]; `exact`:
/// `wanted` or nothing). Returns the shape that ran, or `None` when none fits (the caller takes
/// the tiled kernel).
pub(crate) fn matmul(
    backend: &WgpuBackend,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    subgroup: u32,
    wanted: CoopTiling,
    exact: bool,
) -> Result<Option<CoopTiling>> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    let (ls, rs, os) = (lhs.layout.strides(), rhs.layout.strides(), out.layout.strides());
    let a = bind_operand(&backend.ctx, &backend.table, lhs, "matmul", None)?;
    let b = bind_operand(&backend.ctx, &backend.table, rhs, "matmul", None)?;
    let c = bind_operand(&backend.ctx, &backend.table, out, "matmul", None)?;
    let offsets = [a.element_offset, b.element_offset, c.element_offset];
    let has_subgroups = backend.ctx.has(wgpu::Features::SUBGROUP);
    let order = if exact {
        vec![wanted]
    } else {
        preference(wanted, batch, m, n)
    };
    let Some(tiling) = order
        .into_iter()
        .find(|t| t.fits(&backend.ctx.limits, subgroup, has_subgroups) && fits(t, lhs, rhs, out, offsets))
    else {
        return Ok(None);
    };
    let key = format!("matmul_coop:f16|{subgroup}|{tiling}");
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, 3, || kernel_source(&tiling, subgroup))?;
    let windows: [Window; 3] = [a.window, b.window, c.window];
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension as usize;
    let (bm, bn) = tiling.block();
    let (gx, gy) = (n / bn as usize, m / bm as usize);
    if gx > max_dim || gy > max_dim {
        return Err(Error::invalid(
            "matmul",
            format!(
                "a {m}x{n} output needs {gy}x{gx} tiles, more than the adapter's {max_dim} workgroups per dimension"
            ),
        ));
    }
    let mut first = 0usize;
    while first < batch {
        let count = (batch - first).min(max_dim);
        let mut params = ParamBlock::default();
        params.put_sizes(0, &[m, n, k, first], "matmul size")?;
        params.put_sizes(
            4,
            &[
                a.element_offset as usize,
                b.element_offset as usize,
                c.element_offset as usize,
            ],
            "offset",
        )?;
        params.put_sizes(8, &[ls[0], ls[1], ls[2]], "stride")?;
        params.put_sizes(12, &[rs[0], rs[1], rs[2]], "stride")?;
        params.put_sizes(16, &[os[0], os[1]], "stride")?;
        backend.record(&pipeline, &windows, &params, [gx as u32, gy as u32, count as u32])?;
        first += count;
    }
    Ok(Some(tiling))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_problems_prefer_the_medium_block_and_direct_comes_last() {
        let large = CoopTiling::CANDIDATES[2];
        assert_eq!(preference(large, 1, 4096, 4096)[0], large);
        assert_eq!(
            preference(large, 1, 1024, 1024),
            [CoopTiling::MEDIUM, large, CoopTiling::DIRECT]
        );
        assert_eq!(preference(CoopTiling::DIRECT, 1, 64, 64)[0], CoopTiling::DIRECT);
        assert_eq!(*preference(large, 1, 4096, 4096).last().unwrap(), CoopTiling::DIRECT);
    }
}
