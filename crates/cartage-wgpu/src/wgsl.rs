//! WGSL generation: the shared prelude, and per-dtype storage declarations, loads, stores and
//! conversions that kernels are specialised with (string templating of the `.wgsl` files).
//!
//! Storage per dtype: f32, i32 and f64 are arrays of their type; u8 and bool are packed four to
//! a `u32` word, f16 and bf16 two to a word; i64 is two words (low, high). A kernel computes in
//! the dtype's *compute type*: f32 for f32/f16/bf16 (rounded once on store), f64, i32, u32 for
//! u8/bool, `vec2<u32>` for i64 (exact two's-complement arithmetic on the word pair,
//! `shaders/i64_ops.wgsl`).

use cartage_core::DType;

/// Helpers shared by every kernel.
pub(crate) const COMMON: &str = include_str!("../shaders/common.wgsl");
/// f32 element-wise functions.
pub(crate) const FLOAT_OPS: &str = include_str!("../shaders/float_ops.wgsl");
/// i32/u32 element-wise functions.
pub(crate) const INT_OPS: &str = include_str!("../shaders/int_ops.wgsl");
/// i64 element-wise functions on `vec2<u32>` word pairs.
pub(crate) const I64_OPS: &str = include_str!("../shaders/i64_ops.wgsl");
/// f64 helpers (kernels that touch f64 only).
pub(crate) const F64_OPS: &str = include_str!("../shaders/f64_ops.wgsl");

/// The prelude of a kernel: common helpers, the element-wise functions (f32, i32/u32, i64),
/// f64 ones when needed.
pub(crate) fn prelude(uses_f64: bool) -> String {
    let mut s = String::with_capacity(16 << 10);
    s.push_str(COMMON);
    s.push_str(FLOAT_OPS);
    s.push_str(INT_OPS);
    s.push_str(I64_OPS);
    if uses_f64 {
        s.push_str(F64_OPS);
    }
    s
}

/// The WGSL type a kernel computes `dtype` in.
pub(crate) fn compute_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::U8 | DType::Bool => "u32",
        DType::I64 => "vec2<u32>",
    }
}

/// The suffix of the element-wise function family for `dtype` (`add_f32`, `add_i32`, …).
pub(crate) fn family(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::U8 | DType::Bool => "u32",
    }
}

/// The array element type a binding of `dtype` is declared with.
pub(crate) fn storage_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        _ => "u32",
    }
}

/// Elements of `dtype` per 32-bit storage word (1 for 4- and 8-byte types).
pub(crate) fn per_word(dtype: DType) -> u32 {
    match dtype.size_in_bytes() {
        1 => 4,
        2 => 2,
        _ => 1,
    }
}

/// True when several elements share a storage word (writes must not race).
pub(crate) fn packed(dtype: DType) -> bool {
    per_word(dtype) > 1
}

/// `var<storage, read_write> NAME: array<T>;` at `binding`.
pub(crate) fn binding(binding: u32, name: &str, element: &str) -> String {
    format!("@group(0) @binding({binding}) var<storage, read_write> {name}: array<{element}>;\n")
}

/// `fn FN(e: u32) -> C` loading element `e` of `buf` (declared with [`storage_type`]).
pub(crate) fn load_fn(func: &str, buf: &str, dtype: DType) -> String {
    let c = compute_type(dtype);
    let body = match dtype {
        DType::F32 | DType::F64 | DType::I32 => format!("return {buf}[e];"),
        DType::U8 | DType::Bool => format!("return ({buf}[e >> 2u] >> ((e & 3u) * 8u)) & 0xffu;"),
        DType::F16 => format!("return f16_to_f32(({buf}[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);"),
        DType::BF16 => format!("return bf16_to_f32(({buf}[e >> 1u] >> ((e & 1u) * 16u)) & 0xffffu);"),
        DType::I64 => format!("return vec2<u32>({buf}[2u * e], {buf}[2u * e + 1u]);"),
    };
    format!("fn {func}(e: u32) -> {c} {{ {body} }}\n")
}

/// `fn FN(e: u32, v: C)` storing element `e` of a wide (unpacked) dtype.
pub(crate) fn store_fn(func: &str, buf: &str, dtype: DType) -> String {
    let c = compute_type(dtype);
    let body = match dtype {
        DType::I64 => format!("{buf}[2u * e] = v.x; {buf}[2u * e + 1u] = v.y;"),
        _ => format!("{buf}[e] = v;"),
    };
    format!("fn {func}(e: u32, v: {c}) {{ {body} }}\n")
}

/// `fn FN(v: C) -> u32`: the bits of a packed dtype's value (low 8 or 16 bits).
pub(crate) fn encode_fn(func: &str, dtype: DType) -> String {
    let c = compute_type(dtype);
    let body = match dtype {
        DType::U8 => "return v & 0xffu;",
        DType::Bool => "return select(0u, 1u, v != 0u);",
        DType::F16 => "return f32_to_f16(v);",
        DType::BF16 => "return f32_to_bf16(v);",
        _ => "return bitcast<u32>(v);",
    };
    format!("fn {func}(v: {c}) -> u32 {{ {body} }}\n")
}

/// Bits per element of a packed dtype.
pub(crate) fn bits(dtype: DType) -> u32 {
    32 / per_word(dtype)
}

/// A WGSL expression converting `expr` (compute type of `from`) to the compute type of `to`,
/// with Rust `as` semantics.
pub(crate) fn convert(from: DType, to: DType, expr: &str) -> String {
    use DType::*;
    let f32ish = |d: DType| matches!(d, F32 | F16 | BF16);
    let u32ish = |d: DType| matches!(d, U8 | Bool);
    if f32ish(from) {
        return match to {
            F32 | F16 | BF16 => expr.to_string(),
            I32 => format!("f32_to_i32({expr})"),
            U8 => format!("f32_to_u8({expr})"),
            Bool => format!("select(0u, 1u, (bitcast<u32>({expr}) & 0x7fffffffu) != 0u)"),
            I64 => format!("f32_to_i64({expr})"),
            F64 => format!("f64({expr})"),
        };
    }
    if u32ish(from) {
        return match to {
            F32 | F16 | BF16 => format!("f32({expr})"),
            I32 => format!("i32({expr})"),
            U8 => format!("({expr} & 0xffu)"),
            Bool => format!("select(0u, 1u, {expr} != 0u)"),
            I64 => format!("vec2<u32>({expr}, 0u)"),
            F64 => format!("f64({expr})"),
        };
    }
    match (from, to) {
        (I32, F32 | F16 | BF16) => format!("f32({expr})"),
        (I32, I32) => expr.to_string(),
        (I32, U8) => format!("(bitcast<u32>({expr}) & 0xffu)"),
        (I32, Bool) => format!("select(0u, 1u, {expr} != 0)"),
        (I32, I64) => format!("i64_from_i32({expr})"),
        (I32, F64) => format!("f64({expr})"),
        (I64, F32 | F16 | BF16) => format!("i64_to_f32({expr})"),
        (I64, I32) => format!("bitcast<i32>(({expr}).x)"),
        (I64, U8) => format!("(({expr}).x & 0xffu)"),
        (I64, Bool) => format!("select(0u, 1u, (({expr}).x | ({expr}).y) != 0u)"),
        (I64, I64) => expr.to_string(),
        (I64, F64) => format!("i64_to_f64({expr})"),
        (F64, F32 | F16 | BF16) => format!("f32({expr})"),
        (F64, I32) => format!("f64_to_i32({expr})"),
        (F64, U8) => format!("f64_to_u8({expr})"),
        (F64, Bool) => format!("select(1u, 0u, {expr} == 0.0lf)"),
        (F64, I64) => format!("f64_to_i64({expr})"),
        (F64, F64) => expr.to_string(),
        _ => unreachable!("every (from, to) pair is covered above"),
    }
}

/// Pieces of a WGSL file, each starting at a `//# name` line and running to the next one
/// (text before the first header is a comment about the file).
pub(crate) struct Pieces {
    file: &'static str,
    head: &'static str,
    pieces: Vec<(&'static str, &'static str)>,
}

impl Pieces {
    /// Split `text` (the file `file`) into its pieces.
    pub fn parse(file: &'static str, text: &'static str) -> Pieces {
        let mut pieces = Vec::new();
        let head = text.find("//# ").map_or(text, |at| &text[..at]);
        let mut rest = text;
        while let Some(at) = rest.find("//# ") {
            let after = &rest[at + 4..];
            let line_end = after.find('\n').unwrap_or(after.len());
            let name = after[..line_end].trim();
            let body = &after[(line_end + 1).min(after.len())..];
            let end = body.find("\n//# ").map_or(body.len(), |e| e + 1);
            pieces.push((name, body[..end].trim_end()));
            rest = &body[end..];
        }
        Pieces { file, head, pieces }
    }

    /// The text before the first piece (a file's main template), filled with `parts`.
    pub fn fill_head(&self, parts: &[(&str, &str)]) -> cartage_core::Result<String> {
        fill_checked(self.head, parts).map_err(|e| template_error(format!("{}: {e}", self.file)))
    }

    /// The piece `name`, filled with `parts` (see [`fill_checked`]).
    pub fn fill(&self, name: &str, parts: &[(&str, &str)]) -> cartage_core::Result<String> {
        let piece = self
            .pieces
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| *text)
            .ok_or_else(|| template_error(format!("{} has no piece `{name}`", self.file)))?;
        fill_checked(piece, parts).map_err(|e| template_error(format!("{}, piece `{name}`: {e}", self.file)))
    }

    /// The names of the pieces, in file order.
    #[cfg(test)]
    pub fn names(&self) -> Vec<&'static str> {
        self.pieces.iter().map(|(n, _)| *n).collect()
    }
}

fn template_error(message: String) -> cartage_core::Error {
    cartage_core::Error::Driver {
        device: cartage_core::Device::cpu(),
        op: "wgsl template",
        message,
    }
}

/// Replace each `{{NAME}}` placeholder of `template` with its value in `parts`; an error (a
/// string saying which) when a placeholder has no value or a value no placeholder. Values are
/// inserted as they are: a placeholder inside a value is not expanded.
pub(crate) fn fill_checked(template: &str, parts: &[(&str, &str)]) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(template.len() + 64);
    let mut used = vec![false; parts.len()];
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("an unclosed `{{{{` at `{}`", &rest[open..(open + 24).min(rest.len())]))?;
        let name = &after[..close];
        let k = parts
            .iter()
            .position(|(n, _)| *n == name)
            .ok_or_else(|| format!("the placeholder `{{{{{name}}}}}` has no value"))?;
        used[k] = true;
        out.push_str(parts[k].1);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    if let Some(k) = used.iter().position(|u| !u) {
        return Err(format!("the value for `{}` fills no placeholder", parts[k].0));
    }
    Ok(out)
}

/// Replace each `{{NAME}}` placeholder of `template`.
pub(crate) fn fill(template: &str, parts: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (name, value) in parts {
        out = out.replace(&format!("{{{{{name}}}}}"), value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced() {
        assert_eq!(fill("a {{X}} b {{Y}} {{X}}", &[("X", "1"), ("Y", "2")]), "a 1 b 2 1");
    }

    #[test]
    fn checked_fill_refuses_missing_and_unused_values() {
        assert_eq!(
            fill_checked("a {{X}} b {{Y}} {{X}}", &[("X", "1"), ("Y", "2")]).unwrap(),
            "a 1 b 2 1"
        );
        // A value holding a placeholder is inserted as it is.
        assert_eq!(fill_checked("{{X}}", &[("X", "{{Y}}")]).unwrap(), "{{Y}}");
        let missing = fill_checked("a {{X}} {{Z}}", &[("X", "1")]).unwrap_err();
        assert!(missing.contains("{{Z}}"), "{missing}");
        let unused = fill_checked("a {{X}}", &[("X", "1"), ("Y", "2")]).unwrap_err();
        assert!(unused.contains("`Y`"), "{unused}");
        assert!(fill_checked("a {{X", &[("X", "1")]).unwrap_err().contains("unclosed"));
    }

    #[test]
    fn pieces_split_at_their_headers() {
        let pieces = Pieces::parse("test.wgsl", "// about\n//# one\nlet a = {{A}};\n//# two\nb\n  c\n\n");
        assert_eq!(pieces.names(), ["one", "two"]);
        assert_eq!(pieces.fill_head(&[]).unwrap(), "// about\n");
        assert_eq!(pieces.fill("one", &[("A", "1")]).unwrap(), "let a = 1;");
        assert_eq!(pieces.fill("two", &[]).unwrap(), "b\n  c");
        assert!(pieces.fill("three", &[]).is_err());
        assert!(pieces.fill("one", &[]).is_err());
    }

    #[test]
    fn every_conversion_is_defined() {
        for from in DType::ALL {
            for to in DType::ALL {
                assert!(!convert(from, to, "x").is_empty());
            }
        }
    }
}
