//! Batched matrix products (`shaders/matmul.wgsl`): workgroup tiles in shared memory, a
//! register block per invocation, vec4 loads where the operands allow, double-buffered K-tiles.
//!
//! The tile shape is a [`MatmulTiling`], chosen per adapter and problem: the backend's large
//! tiling (from the adapter kind and limits, replaced by [`WgpuBackend::tune_matmul`] or the
//! `CARTAGE_WGPU_MATMUL_TILE=BMxBNxBK/TMxTN` override) when the problem has enough tiles to fill
//! the device, smaller ones otherwise. f16/bf16 operands are read four at a time, decoded to
//! f32, accumulated in f32 into scratch memory, and rounded once by a cast kernel; f16 products
//! run on cooperative matrices instead where the adapter has them (`matmul_coop`). f64 uses the
//! same kernel in f64. The WGSL is `shaders/matmul.wgsl` filled with the pieces of
//! `shaders/matmul_parts.wgsl` (checked: a placeholder left unfilled is an error).

use std::fmt;
use std::time::Duration;

use cartage_core::raw::Allocation;
use cartage_core::{Backend, DType, Error, Kernel, Layout, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::elementwise;
use crate::ops::matmul_coop::{self, CoopTiling};
use crate::ops::matmul_split;
use crate::ops::matmul_variant::MatmulVariant;
use crate::wgsl;

const MATMUL: &str = include_str!("../../shaders/matmul.wgsl");
const MATMUL_PARTS: &str = include_str!("../../shaders/matmul_parts.wgsl");

/// A matmul tile shape: BM × BN outputs per workgroup, BK of K per step, TM × TN per invocation,
/// and 1 or 2 workgroup-memory buffers per operand (written `BMxBNxBK/TMxTN`, with `:2` for two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulTiling {
    /// Rows of C per workgroup.
    pub bm: u32,
    /// Columns of C per workgroup.
    pub bn: u32,
    /// K per shared-memory step.
    pub bk: u32,
    /// Rows per invocation (a multiple of 4).
    pub tm: u32,
    /// Columns per invocation (a multiple of 4).
    pub tn: u32,
    /// Workgroup-memory buffers per operand: 1 (two barriers per K step) or 2 (one).
    pub stages: u32,
}

impl fmt::Display for MatmulTiling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}/{}x{}", self.bm, self.bn, self.bk, self.tm, self.tn)?;
        if self.stages != 1 {
            write!(f, ":{}", self.stages)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for MatmulTiling {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(
                "matmul tiling",
                format!("`{s}` is not BMxBNxBK/TMxTN[:STAGES], e.g. 128x128x8/8x8 or 128x128x8/8x8:2"),
            )
        };
        let (shape, stages) = match s.split_once(':') {
            Some((shape, stages)) => (shape, stages.parse::<u32>().map_err(|_| bad())?),
            None => (s, 1),
        };
        let (block, thread) = shape.split_once('/').ok_or_else(bad)?;
        let b: Vec<u32> = block
            .split('x')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad())?;
        let t: Vec<u32> = thread
            .split('x')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad())?;
        match (b.as_slice(), t.as_slice()) {
            ([bm, bn, bk], [tm, tn]) => Ok(MatmulTiling {
                bm: *bm,
                bn: *bn,
                bk: *bk,
                tm: *tm,
                tn: *tn,
                stages,
            }),
            _ => Err(bad()),
        }
    }
}

impl MatmulTiling {
    const fn new(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> Self {
        MatmulTiling {
            bm,
            bn,
            bk,
            tm,
            tn,
            stages: 1,
        }
    }

    /// This tiling with two workgroup-memory buffers per operand.
    pub const fn two_stages(self) -> Self {
        MatmulTiling { stages: 2, ..self }
    }

    /// The tilings [`WgpuBackend::tune_matmul`] tries.
    pub const CANDIDATES: [MatmulTiling; 13] = [
        MatmulTiling::new(128, 128, 8, 8, 8),
        MatmulTiling::new(128, 128, 16, 8, 8),
        MatmulTiling::new(128, 128, 32, 8, 8),
        MatmulTiling::new(128, 64, 32, 8, 4),
        MatmulTiling::new(64, 128, 32, 4, 8),
        MatmulTiling::new(128, 64, 16, 8, 4),
        MatmulTiling::new(64, 128, 16, 4, 8),
        MatmulTiling::new(64, 64, 16, 4, 4),
        MatmulTiling::new(64, 64, 32, 4, 4),
        MatmulTiling::new(64, 64, 8, 8, 8),
        MatmulTiling::new(128, 64, 16, 8, 4).two_stages(),
        MatmulTiling::new(128, 128, 8, 8, 8).two_stages(),
        MatmulTiling::new(128, 128, 16, 8, 8).two_stages(),
    ];
    /// The small tiling for problems with few tiles.
    pub const SMALL: MatmulTiling = MatmulTiling::new(32, 32, 16, 4, 4);

    /// Invocations per workgroup.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// True when the tiling is well-formed and fits `limits` for elements of `bytes` bytes.
    pub fn fits(&self, limits: &wgpu::Limits, bytes: u32) -> bool {
        let t = self.threads();
        self.tm.is_multiple_of(4)
            && self.tn.is_multiple_of(4)
            && self.bm.is_multiple_of(self.tm)
            && self.bn.is_multiple_of(self.tn)
            && self.bk.is_multiple_of(4)
            && t > 0
            && t <= limits.max_compute_invocations_per_workgroup
            && self.bn / self.tn <= limits.max_compute_workgroup_size_x
            && (self.bm * self.bk).is_multiple_of(4 * t)
            && (self.bn * self.bk).is_multiple_of(4 * t)
            && matches!(self.stages, 1 | 2)
            && self.stages * self.bk * (self.bm + self.bn) * bytes <= limits.max_compute_workgroup_storage_size
    }

    /// The default large tiling for an adapter.
    pub fn for_adapter(info: &wgpu::AdapterInfo, limits: &wgpu::Limits) -> MatmulTiling {
        let from_env = std::env::var("CARTAGE_WGPU_MATMUL_TILE")
            .ok()
            .and_then(|s| s.parse::<MatmulTiling>().ok())
            .or(crate::ops::matmul_variant::from_env().tiled);
        if let Some(t) = from_env
            && t.fits(limits, 4)
        {
            return t;
        }
        // GPUs: the fastest candidate of `tune_matmul` on an H200 (32.6 TFLOP/s at 4096³ f32,
        // against 31.2 for 128x128x8/8x8); see bench/RESULTS.md.
        let preferred = match info.device_type {
            wgpu::DeviceType::Cpu => MatmulTiling::new(64, 64, 16, 4, 4),
            _ => MatmulTiling::new(128, 64, 16, 8, 4),
        };
        if preferred.fits(limits, 4) {
            preferred
        } else {
            MatmulTiling::SMALL
        }
    }
}

/// How A, B and C are read and written.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Four consecutive elements (K for A, N for B, N for C) per access.
    Vec4,
    /// Scalars, the first index fastest across invocations.
    ScalarOuterFast,
    /// Scalars, the second index fastest.
    ScalarInnerFast,
}

fn tag(m: Mode) -> &'static str {
    match m {
        Mode::Vec4 => "v",
        Mode::ScalarOuterFast => "o",
        Mode::ScalarInnerFast => "i",
    }
}

struct Plan {
    tiling: MatmulTiling,
    a: Mode,
    b: Mode,
    c_vec4: bool,
    t: &'static str,
    /// f16 operands read through the adapter's `f16` type (SHADER_F16).
    native_f16: bool,
}

/// For four-at-a-time reads of `dtype`: the binding's element type and the WGSL expression
/// turning one element `w` of it into `vec4<t>`.
fn quad(dtype: DType, t: &str, native_f16: bool) -> (String, &'static str) {
    match dtype {
        DType::F16 if native_f16 => ("vec4<f16>".into(), "vec4<f32>(w)"),
        DType::F16 => ("vec2<u32>".into(), "unpack4_f16(w)"),
        DType::BF16 => ("vec2<u32>".into(), "unpack4_bf16(w)"),
        _ => (format!("vec4<{t}>"), "w"),
    }
}

/// The pieces of the matmul kernel (`shaders/matmul_parts.wgsl`).
fn pieces() -> &'static wgsl::Pieces {
    static PIECES: std::sync::OnceLock<wgsl::Pieces> = std::sync::OnceLock::new();
    PIECES.get_or_init(|| wgsl::Pieces::parse("shaders/matmul_parts.wgsl", MATMUL_PARTS))
}

/// How one operand is fetched and deposited: its register type, loads per invocation, and the
/// two code pieces.
struct Operand {
    register: String,
    loads: u32,
    fetch: String,
    deposit: String,
}

/// The fetch and deposit code of operand `side` (`a` or `b`), read in `mode`.
fn operand(
    plan: &Plan,
    in_dtype: DType,
    side: &str,
    mode: Mode,
    bindings: &mut String,
    accessors: &mut String,
) -> Result<Operand> {
    let t = plan.t;
    let tl = plan.tiling;
    let threads = tl.threads();
    let (slot, extent) = if side == "a" { (1, tl.bm) } else { (2, tl.bn) };
    let p = pieces();
    if mode == Mode::Vec4 {
        let (stored, unpack) = quad(in_dtype, t, plan.native_f16);
        bindings.push_str(&wgsl::binding(slot, &format!("{side}4"), &stored));
        return Ok(Operand {
            register: format!("vec4<{t}>"),
            loads: extent * tl.bk / 4 / threads,
            fetch: p.fill(&format!("fetch_{side}_vec4"), &[("UNPACK", unpack), ("T", t)])?,
            deposit: p.fill(&format!("deposit_{side}_vec4"), &[])?,
        });
    }
    bindings.push_str(&wgsl::binding(slot, &format!("{side}1"), wgsl::storage_type(in_dtype)));
    accessors.push_str(&wgsl::load_fn(&format!("ld{side}"), &format!("{side}1"), in_dtype));
    let order = if mode == Mode::ScalarInnerFast {
        "inner"
    } else {
        "outer"
    };
    let index = p.fill(&format!("index_{side}_{order}_fast"), &[])?;
    // `f32(x)` of an f32 is the identity; loads of f16/bf16 already return f32.
    let conv = if t == "f64" { "" } else { "f32" };
    Ok(Operand {
        register: t.to_string(),
        loads: extent * tl.bk / threads,
        fetch: p.fill(
            &format!("fetch_{side}_scalar"),
            &[("INDEX", &index), ("CONV", conv), ("T", t)],
        )?,
        deposit: p.fill(&format!("deposit_{side}_scalar"), &[("INDEX", &index)])?,
    })
}

fn source(plan: &Plan, in_dtype: DType) -> Result<String> {
    let t = plan.t;
    let tl = plan.tiling;
    let threads = tl.threads();
    let p = pieces();
    let mut bindings = String::new();
    let mut accessors = String::new();
    let a = operand(plan, in_dtype, "a", plan.a, &mut bindings, &mut accessors)?;
    let b = operand(plan, in_dtype, "b", plan.b, &mut bindings, &mut accessors)?;
    let store = if plan.c_vec4 {
        bindings.push_str(&wgsl::binding(3, "c4", &format!("vec4<{t}>")));
        p.fill("store_vec4", &[])?
    } else {
        bindings.push_str(&wgsl::binding(3, "c1", t));
        p.fill("store_scalar", &[])?
    };
    // The register block, unrolled: one vec4 accumulator per four columns of each row.
    let (row_groups, col_groups) = (tl.tm / 4, tl.tn / 4);
    let num = |v: u32| v.to_string();
    let lanes = ["x", "y", "z", "w"];
    let mut acc_decl = String::new();
    let mut inner = String::new();
    let mut store_all = String::new();
    for i in 0..tl.tm {
        for j in 0..col_groups {
            acc_decl.push_str(&p.fill("acc_decl", &[("I", &num(i)), ("J", &num(j)), ("T", t)])?);
            acc_decl.push_str("\n    ");
        }
    }
    for g in 0..row_groups {
        inner.push_str(&p.fill("load_a", &[("G", &num(g))])?);
        inner.push_str("\n            ");
    }
    for j in 0..col_groups {
        inner.push_str(&p.fill("load_b", &[("J", &num(j))])?);
        inner.push_str("\n            ");
    }
    for i in 0..tl.tm {
        let lane = lanes[(i % 4) as usize];
        inner.push_str(&p.fill("splat", &[("I", &num(i)), ("T", t), ("G", &num(i / 4)), ("LANE", lane)])?);
        inner.push_str("\n            ");
        for j in 0..col_groups {
            inner.push_str(&p.fill("fma", &[("I", &num(i)), ("J", &num(j))])?);
            inner.push_str("\n            ");
        }
    }
    for i in 0..tl.tm {
        store_all.push_str(&p.fill("store_row_open", &[("G", &num(i / 4)), ("Q", &num(i % 4))])?);
        store_all.push('\n');
        for j in 0..col_groups {
            store_all.push_str(&p.fill("store_block", &[("I", &num(i)), ("J", &num(j)), ("STORE", &store)])?);
            store_all.push('\n');
        }
        store_all.push_str(&p.fill("store_row_close", &[])?);
        store_all.push_str("\n    ");
    }
    let loop_piece = if tl.stages == 2 {
        "loop_two_stages"
    } else {
        "loop_one_stage"
    };
    let main_loop = p.fill(loop_piece, &[("INNER", &inner)])?;
    let fetch = format!("{}\n    {}", a.fetch, b.fetch);
    let deposit = format!("{}\n    {}", a.deposit, b.deposit);
    let enable = if plan.native_f16 && (plan.a == Mode::Vec4 || plan.b == Mode::Vec4) {
        "enable f16;"
    } else {
        ""
    };
    wgsl::fill_checked(
        MATMUL,
        &[
            ("ENABLE", enable),
            ("PRELUDE", &wgsl::prelude(t == "f64")),
            ("BINDINGS", &bindings),
            ("ACCESSORS", &accessors),
            ("BM", &num(tl.bm)),
            ("BN", &num(tl.bn)),
            ("BK", &num(tl.bk)),
            ("TM", &num(tl.tm)),
            ("TN", &num(tl.tn)),
            ("LA", &num(a.loads.max(1))),
            ("LB", &num(b.loads.max(1))),
            ("THREADS", &num(threads)),
            ("T", t),
            ("RA", &a.register),
            ("RB", &b.register),
            ("FETCH", &fetch),
            ("DEPOSIT", &deposit),
            ("ACC_DECL", &acc_decl),
            ("STAGES", &num(tl.stages)),
            ("MAIN_LOOP", &main_loop),
            ("STORE_ALL", &store_all),
        ],
    )
    .map_err(|e| Error::Driver {
        device: cartage_core::Device::cpu(),
        op: "wgsl template",
        message: format!("shaders/matmul.wgsl: {e}"),
    })
}

/// The tiling for a problem of `tiles(t)` workgroups under the large tiling `large`.
/// Workgroup tiles that keep the adapter busy: 192 on a GPU, 16 on a CPU adapter.
pub(crate) fn enough_tiles(backend: &WgpuBackend) -> usize {
    if backend.ctx.info.device_type == wgpu::DeviceType::Cpu {
        16
    } else {
        192
    }
}

fn choose(backend: &WgpuBackend, large: MatmulTiling, batch: usize, m: usize, n: usize, bytes: u32) -> MatmulTiling {
    let limits = &backend.ctx.limits;
    let tiles = |t: MatmulTiling| batch * m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    let enough = enough_tiles(backend);
    let medium = MatmulTiling::new(64, 64, 16, 4, 4);
    for t in [large, medium] {
        if t.fits(limits, bytes) && tiles(t) >= enough {
            return t;
        }
    }
    if medium.fits(limits, bytes) && m >= 64 && n >= 64 && tiles(medium) >= enough / 4 {
        return medium;
    }
    MatmulTiling::SMALL
}

/// `out[b] = lhs[b] × rhs[b]`.
pub(crate) fn matmul(backend: &WgpuBackend, lhs: &TensorArg, rhs: &TensorArg, out: &TensorArg) -> Result<()> {
    if let Some(chunks) = matmul_split::chunks(backend, lhs, rhs) {
        return matmul_split::matmul(backend, lhs, rhs, out, chunks);
    }
    let large = backend.matmul_tiling();
    let coop = if backend.cooperative_matrices() {
        Coop::Preferred(matmul_coop::default_tiling())
    } else {
        Coop::Off
    };
    matmul_with(backend, lhs, rhs, out, Some(large), coop).map(|_| ())
}

/// Whether an f16 product may run on cooperative matrices.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Coop {
    /// The tiled kernel only.
    Off,
    /// This shape, or the next one that fits the problem (then the tiled kernel).
    Preferred(CoopTiling),
    /// This shape or the tiled kernel.
    Exactly(CoopTiling),
}

/// [`matmul`] with an explicit large tiling (`None`: the automatic choice) and cooperative-matrix
/// choice (ignored where the adapter has no cooperative matrices); returns the kernel that ran.
pub(crate) fn matmul_with(
    backend: &WgpuBackend,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    large: Option<MatmulTiling>,
    coop: Coop,
) -> Result<MatmulVariant> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    let large = large.unwrap_or_else(|| MatmulTiling::for_adapter(&backend.ctx.info, &backend.ctx.limits));
    if batch * m * n == 0 {
        return Ok(MatmulVariant::Tiled(large));
    }
    if k == 0 {
        elementwise::fill(backend, out, cartage_core::Scalar::Float(0.0))?;
        return Ok(MatmulVariant::Tiled(large));
    }
    let dtype = lhs.dtype;
    if matches!(dtype, DType::F16 | DType::BF16) {
        // Accumulate in f32 scratch, then round once into the output.
        let scratch = backend.scratch(batch * m * n * 4)?;
        let staged = TensorArg {
            buffer: scratch.slice(),
            layout: Layout::contiguous(&[batch, m, n])?,
            dtype: DType::F32,
        };
        let wanted = match (coop, backend.ctx.coop_f16_subgroup) {
            (Coop::Preferred(t), Some(sg)) => Some((t, false, sg)),
            (Coop::Exactly(t), Some(sg)) => Some((t, true, sg)),
            _ => None,
        };
        let product = match wanted {
            Some((tiling, exact, subgroup)) if dtype == DType::F16 => {
                matmul_coop::matmul(backend, lhs, rhs, &staged, subgroup, tiling, exact).and_then(|ran| match ran {
                    Some(t) => Ok(MatmulVariant::Coop(t)),
                    None => matmul_core(backend, lhs, rhs, &staged, large).map(MatmulVariant::Tiled),
                })
            }
            _ => matmul_core(backend, lhs, rhs, &staged, large).map(MatmulVariant::Tiled),
        };
        let result = product.and_then(|ran| elementwise::cast(backend, &staged, out).map(|()| ran));
        backend.free(scratch);
        return result;
    }
    matmul_core(backend, lhs, rhs, out, large).map(MatmulVariant::Tiled)
}

/// `acc[b] = lhs[b] × rhs[b]` into an f32 `acc` (f64 for f64 operands) with the default
/// kernels: cooperative matrices for f16 where the adapter has them, else the tiled kernel.
pub(crate) fn accumulate(backend: &WgpuBackend, lhs: &TensorArg, rhs: &TensorArg, acc: &TensorArg) -> Result<()> {
    if lhs.dtype == DType::F16
        && backend.cooperative_matrices()
        && let Some(subgroup) = backend.ctx.coop_f16_subgroup
        && matmul_coop::matmul(backend, lhs, rhs, acc, subgroup, matmul_coop::default_tiling(), false)?.is_some()
    {
        return Ok(());
    }
    matmul_core(backend, lhs, rhs, acc, backend.matmul_tiling()).map(|_| ())
}

/// The tiled kernel under the large tiling `large`; returns the tiling that ran.
fn matmul_core(
    backend: &WgpuBackend,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
    large: MatmulTiling,
) -> Result<MatmulTiling> {
    let (l, r) = (lhs.layout.shape(), rhs.layout.shape());
    let (batch, m, k, n) = (l[0], l[1], l[2], r[2]);
    let (ls, rs, os) = (lhs.layout.strides(), rhs.layout.strides(), out.layout.strides());
    let a = bind_operand(&backend.ctx, &backend.table, lhs, "matmul", None)?;
    let b = bind_operand(&backend.ctx, &backend.table, rhs, "matmul", None)?;
    let c = bind_operand(&backend.ctx, &backend.table, out, "matmul", None)?;
    // Every float dtype has a four-at-a-time read (f16 and bf16 unpacked to f32).
    let wide = matches!(lhs.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    let native_f16 = lhs.dtype == DType::F16 && backend.native_f16();
    let t = if lhs.dtype == DType::F64 { "f64" } else { "f32" };
    let bytes = if t == "f64" { 8 } else { 4 };
    let a_mode = if wide && ls[2] == 1 && k % 4 == 0 && a.element_offset % 4 == 0 && ls[1] % 4 == 0 && ls[0] % 4 == 0 {
        Mode::Vec4
    } else if ls[2] == 1 || m == 1 {
        Mode::ScalarInnerFast
    } else {
        Mode::ScalarOuterFast
    };
    let b_mode = if wide && rs[2] == 1 && n % 4 == 0 && b.element_offset % 4 == 0 && rs[1] % 4 == 0 && rs[0] % 4 == 0 {
        Mode::Vec4
    } else if rs[2] == 1 || k == 1 {
        Mode::ScalarInnerFast
    } else {
        Mode::ScalarOuterFast
    };
    let c_vec4 = n % 4 == 0 && c.element_offset % 4 == 0 && os[1] % 4 == 0 && os[0] % 4 == 0;
    let tiling = choose(backend, large, batch, m, n, bytes);
    let plan = Plan {
        tiling,
        a: a_mode,
        b: b_mode,
        c_vec4,
        t,
        native_f16,
    };
    let key = format!(
        "matmul:{}{}|{tiling}|{}{}{}",
        lhs.dtype,
        if native_f16 { "n" } else { "" },
        tag(a_mode),
        tag(b_mode),
        if c_vec4 { "v" } else { "s" }
    );
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, 3, || source(&plan, lhs.dtype))?;
    let windows: [Window; 3] = [a.window, b.window, c.window];
    let max_dim = backend.ctx.limits.max_compute_workgroups_per_dimension as usize;
    let (gx, gy) = (n.div_ceil(tiling.bn as usize), m.div_ceil(tiling.bm as usize));
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
    Ok(tiling)
}

impl WgpuBackend {
    /// The large matmul tiling in use.
    pub fn matmul_tiling(&self) -> MatmulTiling {
        *self
            .tiling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| MatmulTiling::for_adapter(&self.ctx.info, &self.ctx.limits))
    }

    /// Time every candidate tiling on an f32 `size`³ product (median of `reps`, device clock
    /// where the adapter has timestamps) and keep the fastest for this device. Returns each
    /// candidate with its time, fastest first.
    pub fn tune_matmul(&self, size: usize, reps: usize) -> Result<Vec<(MatmulTiling, Duration)>> {
        let bytes = size
            .checked_mul(size)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| Error::invalid("tune_matmul", format!("a {size}x{size} f32 matrix overflows usize")))?;
        let mut allocs = Vec::with_capacity(3);
        for _ in 0..3 {
            match self.alloc(bytes, std::panic::Location::caller()) {
                Ok(alloc) => allocs.push(alloc),
                Err(e) => {
                    allocs.into_iter().for_each(|a| self.free(a));
                    return Err(e);
                }
            }
        }
        let result = self.time_tilings(&allocs, size, reps);
        // The single queue runs the timed work before any later use of the freed blocks.
        for alloc in allocs {
            self.free(alloc);
        }
        let mut results = result?;
        results.sort_by_key(|r| r.1);
        if let Some(&(best, time)) = results.first() {
            tracing::info!(device = %self.ctx.cartage_device, %best, ?time, "matmul tiling tuned");
            *self.tiling.lock().unwrap_or_else(|p| p.into_inner()) = Some(best);
        }
        Ok(results)
    }

    /// The median time of every candidate tiling on `[1, size, size]` f32 operands in `allocs`.
    fn time_tilings(&self, allocs: &[Allocation], size: usize, reps: usize) -> Result<Vec<(MatmulTiling, Duration)>> {
        let layout = Layout::contiguous(&[1, size, size])?;
        let args: Vec<TensorArg> = allocs
            .iter()
            .map(|a| TensorArg {
                buffer: a.slice(),
                layout: layout.clone(),
                dtype: DType::F32,
            })
            .collect();
        for (arg, seed) in args[..2].iter().zip(1..) {
            let fill = Kernel::Random {
                out: arg.clone(),
                distribution: cartage_core::Distribution::Uniform { low: -1.0, high: 1.0 },
                seed,
                offset: 0,
            };
            // SAFETY: the operand is a block of `allocs`, live until `tune_matmul` frees it after
            // this function returns (and then only in queue order).
            unsafe { self.launch(&fill) }?;
        }
        let mut results = Vec::new();
        for tiling in MatmulTiling::CANDIDATES {
            if !tiling.fits(&self.ctx.limits, 4) {
                continue;
            }
            let mut times = Vec::with_capacity(reps);
            for rep in 0..=reps {
                let start = self.record_event()?;
                matmul_core(self, &args[0], &args[1], &args[2], tiling)?;
                let end = self.record_event()?;
                let elapsed = self.elapsed(&start, &end)?;
                if rep > 0 {
                    times.push(elapsed);
                }
            }
            times.sort();
            results.push((tiling, times[times.len() / 2]));
        }
        Ok(results)
    }

    /// Run one product with the large tiling `tiling` (for benchmarks comparing tilings); the
    /// kernel is validated as [`Backend::launch`] validates it.
    ///
    /// # Safety
    /// As for [`Backend::launch`]: every operand's buffer lies in a live allocation of this
    /// backend's allocator for the whole call (freed afterwards only in queue order).
    pub unsafe fn matmul_with_tiling(
        &self,
        lhs: &TensorArg,
        rhs: &TensorArg,
        out: &TensorArg,
        tiling: MatmulTiling,
    ) -> Result<()> {
        let kernel = Kernel::Matmul {
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            out: out.clone(),
        };
        self.check_supported(&kernel)?;
        kernel.validate()?;
        let coop = if self.cooperative_matrices() {
            Coop::Preferred(matmul_coop::default_tiling())
        } else {
            Coop::Off
        };
        matmul_with(self, lhs, rhs, out, Some(tiling), coop).map(|_| ())
    }
}

/// Every tiled kernel's text, named: every tiling (the candidates, the small and medium ones),
/// dtype, read mode of A and B, vec4 and scalar stores of C, native and packed f16.
#[cfg(test)]
pub(crate) fn every_source() -> Vec<(String, String)> {
    let modes = [Mode::Vec4, Mode::ScalarOuterFast, Mode::ScalarInnerFast];
    let mut tilings = MatmulTiling::CANDIDATES.to_vec();
    tilings.extend([MatmulTiling::SMALL, MatmulTiling::new(64, 64, 16, 4, 4)]);
    let mut out = Vec::new();
    for tiling in tilings {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for (a, b) in modes.iter().flat_map(|&a| modes.iter().map(move |&b| (a, b))) {
                for (c_vec4, native_f16) in [(true, true), (false, false)] {
                    let plan = Plan {
                        tiling,
                        a,
                        b,
                        c_vec4,
                        t: if dtype == DType::F64 { "f64" } else { "f32" },
                        native_f16: native_f16 && dtype == DType::F16,
                    };
                    let name = format!(
                        "tiled {tiling} {dtype:?} {a:?} {b:?} c_vec4={c_vec4} native={}",
                        plan.native_f16
                    );
                    out.push((name, source(&plan, dtype).unwrap()));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_variant_fills_its_templates() {
        let sources = every_source();
        assert_eq!(sources.len(), 15 * 4 * 9 * 2);
        for (name, text) in &sources {
            assert!(!text.contains("{{"), "{name}");
            let native = name.ends_with("native=true");
            let vec4_read = name.contains("Vec4");
            assert_eq!(text.contains("enable f16;"), native && vec4_read, "{name}");
            // Two workgroup buffers per operand exactly where the tiling asks for them.
            assert_eq!(text.contains("stage = 1u - stage;"), name.contains(":2 "), "{name}");
        }
        for prefetch in [true, false] {
            let coop = matmul_coop::source(32, prefetch).unwrap();
            assert!(!coop.contains("{{") && coop.contains("@workgroup_size(32)"));
            assert_eq!(coop.matches("coopMultiplyAdd").count(), 16);
            assert_eq!(coop.contains("let na0"), prefetch);
        }
    }

    #[test]
    fn tilings_parse_with_and_without_stages() {
        let one: MatmulTiling = "128x64x16/8x4".parse().unwrap();
        assert_eq!(
            (one.bm, one.bn, one.bk, one.tm, one.tn, one.stages),
            (128, 64, 16, 8, 4, 1)
        );
        let two: MatmulTiling = "128x128x8/8x8:2".parse().unwrap();
        assert_eq!(two, MatmulTiling::new(128, 128, 8, 8, 8).two_stages());
        for t in MatmulTiling::CANDIDATES {
            assert_eq!(t.to_string().parse::<MatmulTiling>().unwrap(), t);
        }
        for bad in ["128x64x16", "128x64x16/8x4:x", "128x64/8x4"] {
            assert!(bad.parse::<MatmulTiling>().is_err(), "{bad}");
        }
        // Two stages double the workgroup memory a tiling needs.
        let limits = wgpu::Limits {
            max_compute_workgroup_storage_size: 16384,
            ..wgpu::Limits::default()
        };
        let t = MatmulTiling::new(128, 128, 16, 8, 8);
        assert!(t.fits(&limits, 4) && !t.two_stages().fits(&limits, 4));
    }
}
