//! `Kernel::Update`: one optimizer step (SGD or Adam/AdamW) fused into one dispatch per parameter
//! (`shaders/update.wgsl`), the parameter and its state written in place. The per-element
//! constants come from core ([`cartage_core::AdamUpdate::coefficients`],
//! [`cartage_core::SgdUpdate::coefficients`]) as uniforms in the compute type (f32; f64 for
//! f64), so the shader holds only the arithmetic.
//!
//! Validation made every operand contiguous and of one shape. f32 and f64 run one element per
//! invocation; f16 too where the adapter has SHADER_F16 (loaded and stored as its own `f16`).
//! Packed f16 and bf16 run one 32-bit word of each operand per invocation when every operand
//! starts on a word, and otherwise one element per invocation with atomic and/or stores, so
//! that no two invocations race on a word. Operands beyond one storage binding are dispatched
//! in chunks.

use cartage_core::{DType, Error, Result, TensorArg, UpdateRule};

use crate::backend::WgpuBackend;
use crate::bindings::{Bound, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::geometry::{WORKGROUP, grid};
use crate::wgsl;

pub(crate) const UPDATE: &str = include_str!("../../shaders/update.wgsl");

/// How elements map to invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// One element per invocation, plain loads and stores (f32, f64, f16 as the adapter's `f16`).
    Element,
    /// One 32-bit word (two elements) of each packed operand per invocation.
    Pairs,
    /// One element of packed operands per invocation, written with atomic and/or.
    Atomic,
}

impl Path {
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Path::Element => "element",
            Path::Pairs => "pairs",
            Path::Atomic => "atomic",
        }
    }
}

/// The kernel's specialisation: the rule's kind and state count, the dtype, the path.
#[derive(Clone, Copy)]
pub(crate) struct Variant {
    pub(crate) rule: UpdateRule,
    pub(crate) dtype: DType,
    pub(crate) states: usize,
    pub(crate) native_f16: bool,
    pub(crate) path: Path,
}

/// One optimizer step on `param` and `state` from `grad`, in place.
pub(crate) fn update(
    backend: &WgpuBackend,
    rule: &UpdateRule,
    grad: &TensorArg,
    state: &[Option<TensorArg>; 2],
    param: &TensorArg,
) -> Result<()> {
    let numel = param.layout.numel();
    if numel == 0 {
        return Ok(());
    }
    let name = rule.kind().name();
    let operands: Vec<&TensorArg> = [param, grad].into_iter().chain(state.iter().flatten()).collect();
    let native_f16 = param.dtype == DType::F16 && backend.native_f16();
    let bound: Result<Vec<Bound>> = operands
        .iter()
        .map(|a| bind_operand(&backend.ctx, &backend.table, a, name, None))
        .collect();
    match bound {
        Ok(bound) => dispatch(backend, rule, &operands, &bound, native_f16, numel),
        Err(Error::Unsupported { .. }) => chunked(backend, rule, &operands, native_f16, numel),
        Err(e) => Err(e),
    }
}

/// The update in chunks of elements whose every operand fits one binding.
fn chunked(
    backend: &WgpuBackend,
    rule: &UpdateRule,
    operands: &[&TensorArg],
    native_f16: bool,
    numel: usize,
) -> Result<()> {
    let es = operands[0].dtype.size_in_bytes() as u64;
    let slack = 2 * backend.ctx.binding_alignment() + 16;
    // A multiple of four elements, so that every chunk of a packed operand starts where the
    // whole operand's parity says.
    let chunk = (backend.ctx.max_binding().saturating_sub(slack) / es / 4 * 4).max(4) as usize;
    tracing::debug!(
        op = rule.kind().name(),
        numel,
        chunk,
        "chunked dispatch beyond the storage-binding limit"
    );
    let mut start = 0usize;
    while start < numel {
        let len = chunk.min(numel - start);
        let bound: Vec<Bound> = operands
            .iter()
            .map(|a| {
                let first = a.byte_offset() as u64 + start as u64 * es;
                let range = (first, first + len as u64 * es);
                bind_operand(&backend.ctx, &backend.table, a, rule.kind().name(), Some(range))
            })
            .collect::<Result<_>>()?;
        dispatch(backend, rule, operands, &bound, native_f16, len)?;
        start += len;
    }
    Ok(())
}

/// One dispatch over `numel` elements of the bound operands (parameter, gradient, state).
fn dispatch(
    backend: &WgpuBackend,
    rule: &UpdateRule,
    operands: &[&TensorArg],
    bound: &[Bound],
    native_f16: bool,
    numel: usize,
) -> Result<()> {
    let dtype = operands[0].dtype;
    let mut offsets = [0u64; 4];
    for (o, b) in offsets.iter_mut().zip(bound) {
        *o = b.element_offset;
    }
    let path = if !wgsl::packed(dtype) || native_f16 {
        Path::Element
    } else if bound.iter().all(|b| b.element_offset % 2 == 0) {
        Path::Pairs
    } else {
        Path::Atomic
    };
    let count = match path {
        Path::Pairs => numel.div_ceil(2),
        _ => numel,
    };
    let mut params = ParamBlock::default();
    params.put_sizes(0, &[count, numel], "element count")?;
    params.put(2, &[flags(rule)]);
    for (k, &o) in offsets.iter().enumerate() {
        params.put_sizes(4 + k, &[o as usize], "element offset")?;
    }
    put_coefficients(&mut params, rule, dtype);
    let variant = Variant {
        rule: *rule,
        dtype,
        states: bound.len() - 2,
        native_f16,
        path,
    };
    let key = format!(
        "{}|{dtype}|{}|{}{}",
        rule.kind().name(),
        variant.states,
        path.tag(),
        if native_f16 { "|f16" } else { "" }
    );
    let pipeline = backend
        .pipelines
        .try_get(&backend.ctx, &key, bound.len(), || source(&variant))?;
    let windows: Vec<_> = bound.iter().map(|b| b.window).collect();
    let groups = grid(
        count as u64,
        WORKGROUP,
        backend.ctx.limits.max_compute_workgroups_per_dimension,
    );
    backend.record(&pipeline, &windows, &params, groups)
}

/// The shader's `P.flags`: bit 0 Nesterov momentum, bit 1 the step that creates the momentum
/// buffer.
pub(crate) fn flags(rule: &UpdateRule) -> u32 {
    match rule {
        UpdateRule::Sgd(sgd) => u32::from(sgd.nesterov) | (u32::from(sgd.first_step) << 1),
        UpdateRule::Adam(_) => 0,
    }
}

/// The rule's constants at words 8.. (`P.c`): f32 words, or f64 pairs for f64.
pub(crate) fn put_coefficients(params: &mut ParamBlock, rule: &UpdateRule, dtype: DType) {
    let values: [f64; 8] = match rule {
        UpdateRule::Adam(adam) => {
            let c = adam.coefficients();
            [
                c.decay,
                c.l2,
                c.one_minus_beta1,
                c.one_minus_beta2,
                c.inv_sqrt_bc2,
                c.step_size,
                c.eps,
                0.0,
            ]
        }
        UpdateRule::Sgd(sgd) => {
            let c = sgd.coefficients();
            [c.lr, c.weight_decay, c.momentum, c.grad_scale, 0.0, 0.0, 0.0, 0.0]
        }
    };
    for (k, &v) in values.iter().enumerate() {
        if dtype == DType::F64 {
            params.put_f64(8 + 2 * k, v);
        } else {
            params.put(8 + k, &[(v as f32).to_bits()]);
        }
    }
}

/// The operand names in binding order (b1 ..).
pub(crate) const SLOTS: [&str; 4] = ["p", "g", "first", "second"];

fn source(v: &Variant) -> Result<String> {
    let t = wgsl::compute_type(v.dtype);
    let zero = if v.dtype == DType::F64 { "0.0lf" } else { "0.0" };
    let mut bindings = String::new();
    let mut accessors = codec(v);
    for (k, slot) in SLOTS.iter().enumerate() {
        let buf = format!("b{}", k + 1);
        let present = k < 2 + v.states;
        let written = k != 1;
        if present {
            bindings.push_str(&wgsl::binding(k as u32 + 1, &buf, element_type(v)));
        }
        accessors.push_str(&match (v.path, present) {
            (Path::Pairs, true) => pair_accessors(slot, &buf, written),
            (Path::Pairs, false) => format!(
                "fn ld2_{slot}(w: u32) -> vec2<f32> {{ return vec2<f32>(); }}\n\
                 fn st2_{slot}(w: u32, a: f32, b: f32, both: bool) {{}}\n"
            ),
            (_, true) => element_accessors(v, slot, &buf, written),
            (_, false) => {
                format!("fn ld_{slot}(e: u32) -> {t} {{ return {zero}; }}\nfn st_{slot}(e: u32, v: {t}) {{}}\n")
            }
        });
    }
    let pieces = wgsl::Pieces::parse("shaders/update.wgsl", UPDATE);
    let rule = pieces.fill(rule_piece(v), &[("T", t)])?;
    let main = pieces.fill(
        if v.path == Path::Pairs {
            "main_pairs"
        } else {
            "main_element"
        },
        &[],
    )?;
    pieces.fill_head(&[
        ("ENABLE", if v.native_f16 { "enable f16;" } else { "" }),
        ("PRELUDE", &wgsl::prelude(v.dtype == DType::F64)),
        ("T", t),
        ("BINDINGS", &bindings),
        ("ACCESSORS", &accessors),
        ("RULE", &rule),
        ("MAIN", &main),
    ])
}

/// The piece of `shaders/update.wgsl` holding the rule's per-element code.
pub(crate) fn rule_piece(v: &Variant) -> &'static str {
    match v.rule {
        UpdateRule::Adam(_) => "adam",
        UpdateRule::Sgd(_) if v.states == 0 => "sgd",
        UpdateRule::Sgd(_) => "sgd_momentum",
    }
}

/// The array element a binding is declared with (every operand of the atomic path is atomic, so
/// that a word shared by a read and a written operand is only ever accessed atomically).
pub(crate) fn element_type(v: &Variant) -> &'static str {
    match v.path {
        Path::Element if v.native_f16 => "f16",
        Path::Atomic => "atomic<u32>",
        _ => wgsl::storage_type(v.dtype),
    }
}

/// `dec`/`enc` (the 16-bit codec of a packed dtype) and `rounded` (a value as stored).
pub(crate) fn codec(v: &Variant) -> String {
    let t = wgsl::compute_type(v.dtype);
    match v.dtype {
        DType::F16 => "fn dec(h: u32) -> f32 { return f16_to_f32(h); }\n\
                       fn enc(x: f32) -> u32 { return f32_to_f16(x); }\n\
                       fn rounded(x: f32) -> f32 { return dec(enc(x)); }\n"
            .to_string(),
        DType::BF16 => "fn dec(h: u32) -> f32 { return bf16_to_f32(h); }\n\
                        fn enc(x: f32) -> u32 { return f32_to_bf16(x); }\n\
                        fn rounded(x: f32) -> f32 { return dec(enc(x)); }\n"
            .to_string(),
        _ => format!("fn rounded(x: {t}) -> {t} {{ return x; }}\n"),
    }
}

/// `ld_SLOT(e)` and `st_SLOT(e, v)` for one element.
pub(crate) fn element_accessors(v: &Variant, slot: &str, buf: &str, written: bool) -> String {
    let t = wgsl::compute_type(v.dtype);
    let (load, store) = if v.native_f16 {
        (format!("return f32({buf}[e]);"), format!("{buf}[e] = f16(v);"))
    } else if v.path == Path::Atomic {
        (
            format!("return dec((atomicLoad(&{buf}[e >> 1u]) >> ((e & 1u) * 16u)) & 0xffffu);"),
            format!(
                "let shift = (e & 1u) * 16u; \
                 atomicAnd(&{buf}[e >> 1u], ~(0xffffu << shift)); \
                 atomicOr(&{buf}[e >> 1u], enc(v) << shift);"
            ),
        )
    } else {
        let load = wgsl::load_fn(&format!("ld_{slot}"), buf, v.dtype);
        let store = if written {
            wgsl::store_fn(&format!("st_{slot}"), buf, v.dtype)
        } else {
            format!("fn st_{slot}(e: u32, v: {t}) {{}}\n")
        };
        return load + &store;
    };
    let store = if written { store } else { String::new() };
    format!("fn ld_{slot}(e: u32) -> {t} {{ {load} }}\nfn st_{slot}(e: u32, v: {t}) {{ {store} }}\n")
}

/// `ld2_SLOT(w)` (the two elements of word `w`) and `st2_SLOT(w, a, b, both)` (`b` only when
/// `both`; otherwise the word's upper half is kept).
pub(crate) fn pair_accessors(slot: &str, buf: &str, written: bool) -> String {
    let store = if written {
        format!(
            "let lo = enc(a);
    if both {{
        {buf}[w] = lo | (enc(b) << 16u);
    }} else {{
        {buf}[w] = ({buf}[w] & 0xffff0000u) | lo;
    }}"
        )
    } else {
        String::new()
    };
    format!(
        "fn ld2_{slot}(w: u32) -> vec2<f32> {{
    let x = {buf}[w];
    return vec2<f32>(dec(x & 0xffffu), dec(x >> 16u));
}}
fn st2_{slot}(w: u32, a: f32, b: f32, both: bool) {{
    {store}
}}
"
    )
}
