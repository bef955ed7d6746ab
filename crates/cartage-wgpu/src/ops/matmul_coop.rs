//! f16 matmul on cooperative matrices (`shaders/matmul_coop.wgsl`): 16 × 16 × 16 fragments with
//! f16 inputs and f32 accumulators, where the adapter has them (probed at run time: the
//! experimental wgpu feature, a 16 × 16 × 16 f16 → f32 configuration, and one subgroup size).
//!
//! The kernel loads fragments straight from storage, so it needs row-major operands whose rows
//! start on fragment boundaries: unit inner strides, M, N multiples of the block, K, offsets
//! and row strides multiples of 16 elements. Anything else takes the tiled kernel
//! (`matmul.rs`). bf16 also takes the tiled kernel: converting bf16 to f16 per tile would lose
//! range (f16 tops out at 65504 and flushes below 6e-8, where bf16 spans f32's exponents), so
//! bf16 products stay exact in f32.

use cartage_core::{DType, Error, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::wgsl;

const MATMUL_COOP: &str = include_str!("../../shaders/matmul_coop.wgsl");

/// Rows of C per workgroup.
const BM: usize = 64;
/// Columns of C per workgroup.
const BN: usize = 64;

/// True when `CARTAGE_WGPU_COOP_PREFETCH=1`: load the next K step's fragments while this step
/// multiplies (an experimental variant, not yet measured on hardware; off by default).
pub(crate) fn prefetch() -> bool {
    std::env::var("CARTAGE_WGPU_COOP_PREFETCH").is_ok_and(|v| v.trim() == "1")
}

/// The kernel's text for subgroups of `subgroup` invocations.
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

/// True when `lhs × rhs → out` (f16 in, f32 out) fits the cooperative kernel's layout rules.
pub(crate) fn fits(lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg, offsets: [u64; 3]) -> bool {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (m, k, n) = (l[1], l[2], r[2]);
    let (ls, rs, os) = (lhs.layout.strides(), rhs.layout.strides(), out.layout.strides());
    let aligned = |v: usize| v.is_multiple_of(16);
    lhs.dtype == DType::F16
        && out.dtype == DType::F32
        && m.is_multiple_of(BM)
        && n.is_multiple_of(BN)
        && aligned(k)
        && ls[2] == 1
        && rs[2] == 1
        && os[2] == 1
        && [ls[0], ls[1], rs[0], rs[1], os[0], os[1]].into_iter().all(aligned)
        && offsets.iter().all(|&o| o.is_multiple_of(16))
}

/// Run `out[b] = lhs[b] × rhs[b]` on cooperative matrices (the caller checked [`fits`] and that
/// the device has them).
pub(crate) fn matmul(
    backend: &WgpuBackend,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    subgroup: u32,
) -> Result<bool> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    let (ls, rs, os) = (lhs.layout.strides(), rhs.layout.strides(), out.layout.strides());
    let a = bind_operand(&backend.ctx, &backend.table, lhs, "matmul", None)?;
    let b = bind_operand(&backend.ctx, &backend.table, rhs, "matmul", None)?;
    let c = bind_operand(&backend.ctx, &backend.table, out, "matmul", None)?;
    if !fits(lhs, rhs, out, [a.element_offset, b.element_offset, c.element_offset]) {
        return Ok(false);
    }
    let prefetch = prefetch();
    let key = format!("matmul_coop:f16|{subgroup}|{prefetch}");
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, 3, || source(subgroup, prefetch))?;
    let windows: [Window; 3] = [a.window, b.window, c.window];
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension as usize;
    let (gx, gy) = (n / BN, m / BM);
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
    Ok(true)
}
