//! The generic launcher of map kernels (`shaders/map.wgsl`): operand geometry, binding windows,
//! the vec4 fast path, word-per-invocation stores for packed outputs, and chunked dispatch for
//! contiguous operands larger than one storage binding.

use cartage_core::{DType, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::ops::geometry::{Access, Geometry, WORKGROUP, coalesce, grid, map_fields as f};
use crate::wgsl;

const MAP: &str = include_str!("../../shaders/map.wgsl");
const MAP_VEC4: &str = include_str!("../../shaders/map_vec4.wgsl");

/// WGSL text made on demand: only a pipeline-cache miss pays for formatting it.
pub(crate) type Source<'a> = Box<dyn Fn() -> String + 'a>;

/// One map kernel to launch: `out[i] = compute(i)`.
pub(crate) struct MapKernel<'a> {
    /// The op's name and everything that shapes `body` beyond the operand dtypes (a family
    /// and a member, e.g. `binary` and `add`; static so that a launch formats nothing).
    pub name: (&'static str, &'static str),
    /// The output (slot 0).
    pub out: &'a TensorArg,
    /// The inputs (slots 1..=3).
    pub inputs: Vec<&'a TensorArg>,
    /// Makes `fn compute(i: u32) -> C` where C is the output's compute type (called only when
    /// the pipeline is compiled). It may use `offsets(i)` (`.x` out, `.y`/`.z`/`.w` inputs),
    /// `ld_1`..`ld_3`, `P.extra`, `P.base`, `P.xf`.
    pub body: Source<'a>,
    /// Makes `fn compute4(t: u32) -> vec4<T>` for the vectorised path (same 4-byte dtype
    /// everywhere), using `ldq_1`..`ldq_3`.
    pub body4: Option<Source<'a>>,
    /// Op-specific parameter words.
    pub extra: [u32; 8],
    /// Two f64 parameters (f64 kernels).
    pub extra_f64: Option<[f64; 2]>,
    /// A geometry given by the op (gather, index_select) instead of coalesced operand layouts.
    pub geometry: Option<Geometry>,
    /// Additional storage buffers bound after the inputs (the index-error flags).
    pub extra_windows: Vec<Window>,
    /// WGSL declarations for the extra buffers.
    pub extra_bindings: String,
}

impl<'a> MapKernel<'a> {
    /// A map with no extras.
    pub fn new(
        name: (&'static str, &'static str),
        out: &'a TensorArg,
        inputs: Vec<&'a TensorArg>,
        body: impl Fn() -> String + 'a,
    ) -> Self {
        MapKernel {
            name,
            out,
            inputs,
            body: Box::new(body),
            body4: None,
            extra: [0; 8],
            extra_f64: None,
            geometry: None,
            extra_windows: Vec::new(),
            extra_bindings: String::new(),
        }
    }

    fn operands(&self) -> Vec<&'a TensorArg> {
        let mut all = vec![self.out];
        all.extend(self.inputs.iter().copied());
        all
    }

    /// The op's name for error messages.
    pub fn op_name(&self) -> &'static str {
        if self.name.1.is_empty() {
            self.name.0
        } else {
            self.name.1
        }
    }

    fn uses_f64(&self) -> bool {
        self.operands().iter().any(|a| a.dtype == DType::F64) || self.extra_f64.is_some()
    }
}

thread_local! {
    static KEY: std::cell::RefCell<String> = std::cell::RefCell::new(String::with_capacity(96));
}

/// How the output is stored.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    /// One element per invocation, plain store (4- and 8-byte dtypes).
    Wide,
    /// One 32-bit word of a contiguous packed output per invocation.
    Words,
    /// One element of a strided packed output per invocation, atomically.
    Atomic,
}

/// Launch `kernel` on `backend`.
pub(crate) fn launch(backend: &WgpuBackend, kernel: &MapKernel<'_>) -> Result<()> {
    let numel = kernel.out.layout.numel();
    if numel == 0 {
        return Ok(());
    }
    let operands = kernel.operands();
    let geometry = match &kernel.geometry {
        Some(g) => g.clone(),
        None => {
            let strides: Vec<&[usize]> = operands.iter().map(|a| a.layout.strides()).collect();
            coalesce(kernel.out.layout.shape(), &strides)
        }
    };
    geometry.check_rank("launch")?;
    let access: Vec<Access> = (0..operands.len())
        .map(|k| {
            if kernel.geometry.is_some() {
                Access::Strided
            } else {
                geometry.access(k)
            }
        })
        .collect();
    let out_dtype = kernel.out.dtype;
    let store = if !wgsl::packed(out_dtype) {
        Store::Wide
    } else if access[0] == Access::Contiguous {
        Store::Words
    } else {
        Store::Atomic
    };
    let op_name = kernel.op_name();
    let bound: Result<Vec<_>> = operands
        .iter()
        .map(|a| bind_operand(&backend.ctx, &backend.table, a, op_name, None))
        .collect();
    let bound = match bound {
        Ok(b) => b,
        Err(e) => {
            let chunkable = kernel.geometry.is_none()
                && access.iter().all(|a| *a != Access::Strided)
                && matches!(e, cartage_core::Error::Unsupported { .. });
            if chunkable {
                return launch_chunked(backend, kernel, &access, store, numel);
            }
            return Err(e);
        }
    };
    let offsets: Vec<u64> = bound.iter().map(|b| b.element_offset).collect();
    let windows: Vec<Window> = bound.iter().map(|b| b.window).collect();
    dispatch(backend, kernel, &geometry, &access, store, &offsets, &windows, numel, 0)
}

/// Chunks of contiguous (or broadcast) operands, each within one binding.
fn launch_chunked(
    backend: &WgpuBackend,
    kernel: &MapKernel<'_>,
    access: &[Access],
    store: Store,
    numel: usize,
) -> Result<()> {
    let operands = kernel.operands();
    let widest = operands.iter().map(|a| a.dtype.size_in_bytes()).max().unwrap_or(1) as u64;
    let slack = 2 * backend.ctx.binding_alignment() + 16;
    let chunk = ((backend.ctx.max_binding().saturating_sub(slack)) / widest / 4 * 4).max(4) as usize;
    tracing::debug!(
        op = kernel.op_name(),
        numel,
        chunk,
        "chunked dispatch beyond the storage-binding limit"
    );
    let mut start = 0usize;
    while start < numel {
        let len = chunk.min(numel - start);
        let mut offsets = Vec::with_capacity(operands.len());
        let mut windows = Vec::with_capacity(operands.len());
        for (arg, acc) in operands.iter().zip(access) {
            let es = arg.dtype.size_in_bytes() as u64;
            let first = arg.byte_offset() as u64;
            let (lo, hi) = match acc {
                Access::Broadcast => (first, first + es),
                _ => (first + start as u64 * es, first + (start + len) as u64 * es),
            };
            let bound = bind_operand(&backend.ctx, &backend.table, arg, kernel.op_name(), Some((lo, hi)))?;
            offsets.push(bound.element_offset);
            windows.push(bound.window);
        }
        let geometry = Geometry {
            shape: vec![len],
            strides: access
                .iter()
                .map(|a| vec![usize::from(*a != Access::Broadcast)])
                .collect(),
        };
        dispatch(
            backend, kernel, &geometry, access, store, &offsets, &windows, len, start,
        )?;
        start += len;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    backend: &WgpuBackend,
    kernel: &MapKernel<'_>,
    geometry: &Geometry,
    access: &[Access],
    store: Store,
    offsets: &[u64],
    windows: &[Window],
    numel: usize,
    base: usize,
) -> Result<()> {
    let operands = kernel.operands();
    let out_dtype = kernel.out.dtype;
    // Four elements at a time: 4-byte dtypes as vec4, f16 and bf16 as 8-byte groups.
    let half = match out_dtype {
        DType::BF16 => Some(Half::Bf16),
        DType::F16 if backend.native_f16() => Some(Half::F16Native),
        DType::F16 => Some(Half::F16Packed),
        _ => None,
    };
    let vec4 = kernel.body4.is_some()
        && kernel.extra_windows.is_empty()
        && numel.is_multiple_of(4)
        && operands
            .iter()
            .all(|a| (a.dtype.size_in_bytes() == 4 || half.is_some()) && a.dtype == out_dtype)
        && access[0] == Access::Contiguous
        && access
            .iter()
            .zip(offsets)
            .all(|(a, &o)| *a == Access::Broadcast || (*a == Access::Contiguous && o % 4 == 0));
    // A copy moves the words as they are (NaN payloads included).
    let half = half
        .filter(|_| vec4)
        .map(|h| if kernel.name == ("copy", "") { Half::Raw } else { h });
    let mut params = ParamBlock::default();
    // Four vec4s per invocation pay off on large tensors (more loads in flight per thread);
    // four 2-byte groups are half as many bytes, so they pay off from fewer elements.
    let large = if half.is_some() { 8 << 20 } else { 32 << 20 };
    let quads_per_invocation = if numel >= large {
        backend.vec4_per_invocation() as usize
    } else {
        1
    };
    let count = if vec4 {
        numel / 4
    } else {
        match store {
            Store::Words => {
                let per = wgsl::per_word(out_dtype) as u64;
                let first = offsets[0];
                ((first + numel as u64 - 1) / per - first / per + 1) as usize
            }
            _ => numel,
        }
    };
    params.put_sizes(f::COUNT, &[count, numel, geometry.shape.len(), base], "element count")?;
    params.put_sizes(f::SHAPE, &geometry.shape, "dimension size")?;
    for (k, &o) in offsets.iter().enumerate() {
        params.put_sizes(f::OFFS + k, &[o as usize], "element offset")?;
    }
    for (k, strides) in geometry.strides.iter().enumerate() {
        params.put_sizes(f::STRIDES + 8 * k, strides, "stride")?;
    }
    params.put(f::EXTRA, &kernel.extra);
    if let Some([a, b]) = kernel.extra_f64 {
        params.put_f64(f::F64, a);
        params.put_f64(f::F64 + 2, b);
    }
    let storage = windows.len() + kernel.extra_windows.len();
    let store_tag = match (vec4, store) {
        (true, _) if half == Some(Half::F16Native) && quads_per_invocation == 4 => "v4hx4",
        (true, _) if quads_per_invocation == 4 => "v4x4",
        (true, _) if half == Some(Half::F16Native) => "v4h",
        (true, _) => "v4",
        (false, Store::Wide) => "wide",
        (false, Store::Words) => "words",
        (false, Store::Atomic) => "atomic",
    };
    // The key is written into a reused buffer: a launch whose pipeline exists allocates nothing.
    let pipeline = KEY.with_borrow_mut(|key| {
        use std::fmt::Write;
        key.clear();
        let _ = write!(key, "map:{}_{}|", kernel.name.0, kernel.name.1);
        for a in &operands {
            let _ = write!(key, "{},", a.dtype.name());
        }
        key.extend(access.iter().map(|a| a.tag()));
        let _ = write!(key, "|{store_tag}");
        backend.pipelines.get(&backend.ctx, key, storage, || {
            if vec4 {
                source_vec4(kernel, access, quads_per_invocation, half)
            } else {
                source(kernel, access, store)
            }
        })
    })?;
    let mut all_windows = windows.to_vec();
    all_windows.extend_from_slice(&kernel.extra_windows);
    let threads = if vec4 {
        count.div_ceil(quads_per_invocation)
    } else {
        count
    };
    let groups = grid(
        threads as u64,
        WORKGROUP,
        backend.ctx.limits.max_compute_workgroups_per_dimension,
    );
    backend.record(&pipeline, &all_windows, &params, groups)
}

fn source(kernel: &MapKernel<'_>, access: &[Access], store: Store) -> String {
    let operands = kernel.operands();
    let out_dtype = kernel.out.dtype;
    let mut bindings = String::new();
    let mut accessors = String::new();
    for (k, arg) in operands.iter().enumerate() {
        let buf = format!("b{}", k + 1);
        let element = if k == 0 && store == Store::Atomic {
            "atomic<u32>"
        } else {
            wgsl::storage_type(arg.dtype)
        };
        bindings.push_str(&wgsl::binding(k as u32 + 1, &buf, element));
        if k > 0 {
            accessors.push_str(&wgsl::load_fn(&format!("ld_{k}"), &buf, arg.dtype));
        }
    }
    bindings.push_str(&kernel.extra_bindings);
    let out_c = wgsl::compute_type(out_dtype);
    let store_text = match store {
        Store::Wide => {
            accessors.push_str(&wgsl::store_fn("st_out", "b1", out_dtype));
            "st_out(offsets(t).x, compute(t));".to_string()
        }
        Store::Words => {
            accessors.push_str(&wgsl::encode_fn("enc_out", out_dtype));
            let per = wgsl::per_word(out_dtype);
            let bits = wgsl::bits(out_dtype);
            let full = (1u64 << bits) - 1;
            format!(
                "let first = P.offs.x;
    let w = first / {per}u + t;
    var word = 0u;
    var mask = 0u;
    for (var j = 0u; j < {per}u; j = j + 1u) {{
        let pos = w * {per}u + j;
        if pos >= first && pos - first < P.numel {{
            word = word | (enc_out(compute(pos - first)) << (j * {bits}u));
            mask = mask | ({full}u << (j * {bits}u));
        }}
    }}
    if mask != 0xffffffffu {{
        word = word | (b1[w] & ~mask);
    }}
    b1[w] = word;"
            )
        }
        Store::Atomic => {
            accessors.push_str(&wgsl::encode_fn("enc_out", out_dtype));
            let per = wgsl::per_word(out_dtype);
            let bits = wgsl::bits(out_dtype);
            let full = (1u64 << bits) - 1;
            format!(
                "let pos = offsets(t).x;
    let w = pos / {per}u;
    let shift = (pos % {per}u) * {bits}u;
    let value = enc_out(compute(t));
    atomicAnd(&b1[w], ~({full}u << shift));
    atomicOr(&b1[w], value << shift);"
            )
        }
    };
    let offsets = if access.iter().all(|a| *a != Access::Strided) {
        let factors: Vec<&str> = (0..4)
            .map(|k| match access.get(k) {
                Some(Access::Contiguous) => "1u",
                _ => "0u",
            })
            .collect();
        format!(
            "fn offsets(i: u32) -> vec4<u32> {{ return P.offs + i * vec4<u32>({}); }}",
            factors.join(", ")
        )
    } else {
        "fn offsets(i: u32) -> vec4<u32> { return strided_offsets(i); }".to_string()
    };
    let _ = out_c;
    let uses_f64 = kernel.uses_f64();
    wgsl::fill(
        MAP,
        &[
            ("PRELUDE", &wgsl::prelude(uses_f64)),
            ("PARAMS_F64", if uses_f64 { "xf: vec2<f64>," } else { "" }),
            ("BINDINGS", &bindings),
            ("OFFSETS", &offsets),
            ("ACCESSORS", &accessors),
            ("BODY", &(kernel.body)()),
            ("STORE", &store_text),
        ],
    )
}

/// How a 2-byte float dtype is loaded and stored four elements at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Half {
    /// bf16 in two u32 words, unpacked by shifts.
    Bf16,
    /// f16 in two u32 words, converted exactly by the prelude's bit routines.
    F16Packed,
    /// f16 as `vec4<f16>` (the adapter's SHADER_F16), converted by the hardware both ways.
    F16Native,
    /// Either dtype, words moved as they are (copies).
    Raw,
}

fn source_vec4(kernel: &MapKernel<'_>, access: &[Access], quads: usize, half: Option<Half>) -> String {
    let operands = kernel.operands();
    let element = match half {
        Some(_) => "f32",
        None => wgsl::storage_type(kernel.out.dtype),
    };
    let mut bindings = String::new();
    let mut accessors = String::new();
    for (k, _) in operands.iter().enumerate() {
        let stored = match half {
            None => format!("vec4<{element}>"),
            Some(Half::F16Native) => "vec4<f16>".to_string(),
            Some(_) => "vec2<u32>".to_string(),
        };
        bindings.push_str(&wgsl::binding(k as u32 + 1, &format!("b{}", k + 1), &stored));
        if k > 0 {
            let buf = format!("b{}", k + 1);
            let slot = ["x", "y", "z", "w"][k];
            let unpack = match half {
                None | Some(Half::Raw) => "w",
                Some(Half::Bf16) => "unpack4_bf16(w)",
                Some(Half::F16Packed) => "unpack4_f16(w)",
                Some(Half::F16Native) => "vec4<f32>(w)",
            };
            let loaded = if half == Some(Half::Raw) {
                "vec2<u32>".to_string()
            } else {
                format!("vec4<{element}>")
            };
            let body = match access[k] {
                Access::Broadcast if half == Some(Half::Raw) => {
                    // One 2-byte value repeated: its bits in both halves of both words.
                    format!(
                        "let o = P.offs.{slot}; let h = ({buf}[o >> 2u][(o >> 1u) & 1u] >> ((o & 1u) * 16u)) & 0xffffu; return vec2<u32>(h | (h << 16u));"
                    )
                }
                Access::Broadcast => format!(
                    "let w = {buf}[P.offs.{slot} >> 2u]; let q = {unpack}; return vec4<{element}>(q[P.offs.{slot} & 3u]);"
                ),
                _ => format!("let w = {buf}[(P.offs.{slot} >> 2u) + t]; return {unpack};"),
            };
            accessors.push_str(&format!("fn ldq_{k}(t: u32) -> {loaded} {{ {body} }}\n"));
        }
    }
    let encode = match half {
        None | Some(Half::Raw) => "",
        Some(Half::Bf16) => "pack4_bf16",
        Some(Half::F16Packed) => "pack4_f16",
        // The hardware rounds to nearest even (Vulkan's OpFConvert is correctly rounded).
        Some(Half::F16Native) => "vec4<f16>",
    };
    let body = if half == Some(Half::Raw) {
        "fn compute4(t: u32) -> vec2<u32> { return ldq_1(t); }".to_string()
    } else {
        kernel.body4.as_ref().map(|b| b()).unwrap_or_default()
    };
    let source = wgsl::fill(
        MAP_VEC4,
        &[
            ("PRELUDE", &wgsl::prelude(false)),
            ("BINDINGS", &bindings),
            ("ACCESSORS", &accessors),
            ("BODY", &body),
            ("BODY_MAIN", &vec4_main(quads, encode)),
        ],
    );
    if half == Some(Half::F16Native) {
        format!("enable f16;\n{source}")
    } else {
        source
    }
}

/// The body of the vectorised kernel's `main` for `quads` vec4s per invocation, each result
/// stored through `encode` (a WGSL function name, or empty to store it as it is).
fn vec4_main(quads: usize, encode: &str) -> String {
    if quads <= 1 {
        return format!(
            "if t >= P.count {{
        return;
    }}
    b1[o + t] = {encode}(compute4(t));"
        );
    }
    let mut s = String::from("let stride = nwg.x * nwg.y * 256u;\n    ");
    for u in 0..quads {
        s.push_str(&format!("let q{u} = t + {u}u * stride;\n    "));
    }
    s.push_str(&format!("if q{} < P.count {{\n", quads - 1));
    for u in 0..quads {
        s.push_str(&format!("        let r{u} = compute4(q{u});\n"));
    }
    for u in 0..quads {
        s.push_str(&format!("        b1[o + q{u}] = {encode}(r{u});\n"));
    }
    s.push_str("        return;\n    }\n");
    for u in 0..quads {
        s.push_str(&format!(
            "    if q{u} < P.count {{\n        b1[o + q{u}] = {encode}(compute4(q{u}));\n    }}\n"
        ));
    }
    s
}
