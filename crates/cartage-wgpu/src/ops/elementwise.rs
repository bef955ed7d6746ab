//! Map kernels of the element-wise ops: fill, arange, cast, copy, unary, binary, compare, where.

use cartage_core::{BinaryOp, CompareOp, DType, Result, Scalar, TensorArg, UnaryOp};

use crate::backend::WgpuBackend;
use crate::ops::map::{MapKernel, launch};
use crate::wgsl::{compute_type, convert, family};

/// The body4 of an op applied component-wise: `vec4<T>(f(a.x, b.x), …)`.
fn componentwise(element: &str, inputs: usize, apply: impl Fn(&[String]) -> String) -> String {
    let lanes = ["x", "y", "z", "w"];
    let loads: String = (1..=inputs).map(|k| format!("let a{k} = ldq_{k}(t);\n    ")).collect();
    let parts: Vec<String> = lanes
        .iter()
        .map(|l| apply(&(1..=inputs).map(|k| format!("a{k}.{l}")).collect::<Vec<_>>()))
        .collect();
    format!(
        "fn compute4(t: u32) -> vec4<{element}> {{\n    {loads}return vec4<{element}>({});\n}}\n",
        parts.join(", ")
    )
}

fn vec4_element(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::I32 => Some("i32"),
        _ => None,
    }
}

/// The element type of `compute4` for ops that compute in the dtype's compute type: f16 and
/// bf16 are loaded four at a time and computed in f32 (see `map::Half`).
fn vec4_compute(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F16 | DType::BF16 => Some("f32"),
        other => vec4_element(other),
    }
}

/// `out = value`.
pub(crate) fn fill(backend: &WgpuBackend, out: &TensorArg, value: Scalar) -> Result<()> {
    let dtype = out.dtype;
    let mut bytes = value.to_bytes(dtype);
    bytes.resize(8, 0);
    let lo = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let hi = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let c = compute_type(dtype);
    let value_expr = match dtype {
        DType::F32 => "bitcast<f32>(P.extra[0].x)",
        DType::F16 => "f16_to_f32(P.extra[0].x)",
        DType::BF16 => "bf16_to_f32(P.extra[0].x)",
        DType::I32 => "bitcast<i32>(P.extra[0].x)",
        DType::U8 | DType::Bool => "P.extra[0].x",
        DType::I64 => "vec2<u32>(P.extra[0].x, P.extra[0].y)",
        DType::F64 => "P.xf.x",
    };
    let body = move || format!("fn compute(i: u32) -> {c} {{ return {value_expr}; }}");
    let mut kernel = MapKernel::new(("fill", ""), out, vec![], body);
    kernel.extra[0] = lo;
    kernel.extra[1] = hi;
    if dtype == DType::F64 {
        kernel.extra_f64 = Some([value.as_f64(), 0.0]);
    }
    if let Some(e) = vec4_element(dtype) {
        kernel.body4 = Some(Box::new(move || {
            format!("fn compute4(t: u32) -> vec4<{e}> {{ return vec4<{e}>(bitcast<{e}>(P.extra[0].x)); }}")
        }));
    }
    launch(backend, &kernel)
}

fn is_integral(v: f64) -> bool {
    v.is_finite() && v.trunc() == v && v.abs() < 9.0e18
}

/// `out[i] = start + i * step` (evaluated in f64 by the reference, then cast).
pub(crate) fn arange(backend: &WgpuBackend, out: &TensorArg, start: f64, step: f64) -> Result<()> {
    let dtype = out.dtype;
    let c = compute_type(dtype);
    let integer_out = matches!(dtype, DType::I32 | DType::U8 | DType::Bool | DType::I64);
    if dtype == DType::F64 {
        let body = move || format!("fn compute(i: u32) -> {c} {{ return P.xf.x + f64(P.base + i) * P.xf.y; }}");
        let mut kernel = MapKernel::new(("arange", ""), out, vec![], body);
        kernel.extra_f64 = Some([start, step]);
        return launch(backend, &kernel);
    }
    if integer_out && is_integral(start) && is_integral(step) && step.abs() < 2_147_483_648.0 {
        // Exact 64-bit integer arithmetic, then Rust's saturating `as` from the value.
        let start_i = start as i64;
        let step_i = step as i64;
        let finish = match dtype {
            DType::I64 => "return v;".to_string(),
            DType::I32 => "if i64_is_neg(v) { if v.y != 0xffffffffu || (v.x & 0x80000000u) == 0u { return -2147483647 - 1; } return bitcast<i32>(v.x); }
    if v.y != 0u || (v.x & 0x80000000u) != 0u { return 2147483647; }
    return bitcast<i32>(v.x);"
                .to_string(),
            DType::U8 => "if i64_is_neg(v) { return 0u; }
    if v.y != 0u || v.x > 255u { return 255u; }
    return v.x;"
                .to_string(),
            _ => "return select(0u, 1u, (v.x | v.y) != 0u);".to_string(),
        };
        let body = move || {
            format!(
                "fn compute(i: u32) -> {c} {{
    let step_neg = P.extra[1].x != 0u;
    let m = mul_wide(P.base + i, P.extra[0].z);
    let v = i64_add(vec2<u32>(P.extra[0].x, P.extra[0].y), select(m, i64_neg(m), step_neg));
    {finish}
}}"
            )
        };
        let mut kernel = MapKernel::new(("arange_int", ""), out, vec![], body);
        kernel.extra[0] = start_i as u32;
        kernel.extra[1] = (start_i >> 32) as u32;
        kernel.extra[2] = step_i.unsigned_abs() as u32;
        kernel.extra[4] = u32::from(step_i < 0);
        return launch(backend, &kernel);
    }
    // Double-f32: start and step each as a sum of two f32, the product error recovered by fma.
    let split = |v: f64| {
        let hi = v as f32;
        let lo = (v - f64::from(hi)) as f32;
        (hi.to_bits(), lo.to_bits())
    };
    let (sh, sl) = split(start);
    let (th, tl) = split(step);
    let value = convert(DType::F32, dtype, "r");
    let body = move || {
        format!(
            "fn compute(i: u32) -> {c} {{
    let n = f32(P.base + i);
    let step_hi = bitcast<f32>(P.extra[0].z);
    let p = n * step_hi;
    let e = fma(n, step_hi, -p);
    let r = bitcast<f32>(P.extra[0].x) + p + (e + bitcast<f32>(P.extra[0].y) + n * bitcast<f32>(P.extra[0].w));
    return {value};
}}"
        )
    };
    let mut kernel = MapKernel::new(("arange_float", ""), out, vec![], body);
    kernel.extra[..4].copy_from_slice(&[sh, sl, th, tl]);
    launch(backend, &kernel)
}

/// Convert dtypes element by element.
pub(crate) fn cast(backend: &WgpuBackend, input: &TensorArg, out: &TensorArg) -> Result<()> {
    let value = convert(input.dtype, out.dtype, "ld_1(offsets(i).y)");
    let body = move || {
        format!(
            "fn compute(i: u32) -> {} {{ return {value}; }}",
            compute_type(out.dtype)
        )
    };
    launch(backend, &MapKernel::new(("cast", ""), out, vec![input], body))
}

/// Strided copy, same dtype.
pub(crate) fn copy(backend: &WgpuBackend, input: &TensorArg, out: &TensorArg) -> Result<()> {
    let body = move || {
        format!(
            "fn compute(i: u32) -> {} {{ return ld_1(offsets(i).y); }}",
            compute_type(out.dtype)
        )
    };
    let mut kernel = MapKernel::new(("copy", ""), out, vec![input], body);
    if let Some(e) = vec4_compute(out.dtype) {
        kernel.body4 = Some(Box::new(move || {
            format!("fn compute4(t: u32) -> vec4<{e}> {{ return ldq_1(t); }}")
        }));
    }
    launch(backend, &kernel)
}

/// `out = op(input)`.
pub(crate) fn unary(backend: &WgpuBackend, op: UnaryOp, input: &TensorArg, out: &TensorArg) -> Result<()> {
    let (name, fam) = (op.name(), family(input.dtype));
    let body = move || {
        format!(
            "fn compute(i: u32) -> {} {{ return {name}_{fam}(ld_1(offsets(i).y)); }}",
            compute_type(out.dtype)
        )
    };
    let mut kernel = MapKernel::new(("unary", op.name()), out, vec![input], body);
    if let Some(e) = vec4_compute(out.dtype) {
        kernel.body4 = Some(Box::new(move || {
            componentwise(e, 1, |a| format!("{name}_{fam}({})", a[0]))
        }));
    }
    launch(backend, &kernel)
}

/// `out = op(lhs, rhs)`.
pub(crate) fn binary(
    backend: &WgpuBackend,
    op: BinaryOp,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
) -> Result<()> {
    let (name, fam) = (op.name(), family(lhs.dtype));
    let body = move || {
        format!(
            "fn compute(i: u32) -> {} {{ let o = offsets(i); return {name}_{fam}(ld_1(o.y), ld_2(o.z)); }}",
            compute_type(out.dtype)
        )
    };
    let mut kernel = MapKernel::new(("binary", op.name()), out, vec![lhs, rhs], body);
    if let Some(e) = vec4_compute(out.dtype) {
        kernel.body4 = Some(Box::new(move || match op {
            BinaryOp::Add => format!("fn compute4(t: u32) -> vec4<{e}> {{ return ldq_1(t) + ldq_2(t); }}"),
            BinaryOp::Sub => format!("fn compute4(t: u32) -> vec4<{e}> {{ return ldq_1(t) - ldq_2(t); }}"),
            BinaryOp::Mul => format!("fn compute4(t: u32) -> vec4<{e}> {{ return ldq_1(t) * ldq_2(t); }}"),
            _ => componentwise(e, 2, |a| format!("{name}_{fam}({}, {})", a[0], a[1])),
        }));
    }
    launch(backend, &kernel)
}

/// `out = lhs OP rhs` as bool.
pub(crate) fn compare(
    backend: &WgpuBackend,
    op: CompareOp,
    lhs: &TensorArg,
    rhs: &TensorArg,
    out: &TensorArg,
) -> Result<()> {
    // `!=` is written as a negated `==` so that NaN != x holds whatever compare the driver picks.
    // i64 word pairs compare through the signed helpers of `shaders/i64_ops.wgsl`.
    let test = if lhs.dtype == DType::I64 {
        match op {
            CompareOp::Eq => "eq_i64(ld_1(o.y), ld_2(o.z))",
            CompareOp::Ne => "!eq_i64(ld_1(o.y), ld_2(o.z))",
            CompareOp::Lt => "lt_i64(ld_1(o.y), ld_2(o.z))",
            CompareOp::Le => "le_i64(ld_1(o.y), ld_2(o.z))",
            CompareOp::Gt => "gt_i64(ld_1(o.y), ld_2(o.z))",
            CompareOp::Ge => "ge_i64(ld_1(o.y), ld_2(o.z))",
        }
    } else {
        match op {
            CompareOp::Eq => "ld_1(o.y) == ld_2(o.z)",
            CompareOp::Ne => "!(ld_1(o.y) == ld_2(o.z))",
            CompareOp::Lt => "ld_1(o.y) < ld_2(o.z)",
            CompareOp::Le => "ld_1(o.y) <= ld_2(o.z)",
            CompareOp::Gt => "ld_1(o.y) > ld_2(o.z)",
            CompareOp::Ge => "ld_1(o.y) >= ld_2(o.z)",
        }
    };
    let body = move || format!("fn compute(i: u32) -> u32 {{ let o = offsets(i); return select(0u, 1u, {test}); }}");
    launch(
        backend,
        &MapKernel::new(("compare", op.name()), out, vec![lhs, rhs], body),
    )
}

/// `out = cond ? on_true : on_false`.
pub(crate) fn select(
    backend: &WgpuBackend,
    cond: &TensorArg,
    on_true: &TensorArg,
    on_false: &TensorArg,
    out: &TensorArg,
) -> Result<()> {
    let body = move || {
        format!(
            "fn compute(i: u32) -> {} {{ let o = offsets(i); return select(ld_3(o.w), ld_2(o.z), ld_1(o.y) != 0u); }}",
            compute_type(out.dtype)
        )
    };
    launch(
        backend,
        &MapKernel::new(("where", ""), out, vec![cond, on_true, on_false], body),
    )
}
