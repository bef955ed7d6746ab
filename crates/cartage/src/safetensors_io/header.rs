//! The safetensors header: an 8-byte little-endian length, then that many bytes of JSON mapping
//! each name to `{dtype, shape, data_offsets}` (offsets relative to the data after the header),
//! padded with spaces to a multiple of 8. Parsed and written with the `safetensors` crate's own
//! types, without ever holding the data.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use ::safetensors::Dtype as FileDType;
use ::safetensors::tensor::{Metadata, TensorInfo};
use cartage_core::{DType, Error, Result, checked_bytes};

/// The format name in errors.
pub(super) const FORMAT: &str = "safetensors";

/// The largest header the reference implementation accepts.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of a file: name, dtype, shape and byte range in the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub start: u64,
    pub end: u64,
}

pub(super) fn format_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::Format {
        path: path.display().to_string(),
        format: FORMAT,
        reason: reason.into(),
    }
}

pub(super) fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The file's dtype for a cartage dtype.
pub(super) fn to_file_dtype(dtype: DType) -> FileDType {
    match dtype {
        DType::F32 => FileDType::F32,
        DType::F64 => FileDType::F64,
        DType::F16 => FileDType::F16,
        DType::BF16 => FileDType::BF16,
        DType::I32 => FileDType::I32,
        DType::I64 => FileDType::I64,
        DType::U8 => FileDType::U8,
        DType::Bool => FileDType::BOOL,
    }
}

/// A file's header, checked: where the data starts, the tensors in data order, and the string
/// metadata stored under `__metadata__` (empty when the file has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub data_start: u64,
    pub entries: Vec<Entry>,
    pub metadata: HashMap<String, String>,
}

/// The key under which the format keeps its string metadata; no tensor may have this name.
pub(super) const METADATA_KEY: &str = "__metadata__";

/// The cartage dtype named `name` in a header (`F32`, `BF16`, `BOOL` …); `Err` says whether the
/// format knows it at all.
fn dtype_from_name(name: &str) -> std::result::Result<DType, &'static str> {
    Ok(match name {
        "F32" => DType::F32,
        "F64" => DType::F64,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I32" => DType::I32,
        "I64" => DType::I64,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        "I8" | "I16" | "U16" | "U32" | "U64" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" | "F6_E2M3" | "F6_E3M2" | "F4"
        | "C64" => return Err("which cartage does not have"),
        _ => return Err("which is not a safetensors dtype"),
    })
}

/// The header's top-level JSON object as (key, value) pairs in file order, refusing a key that
/// appears twice (a JSON map would silently keep only the last).
struct Pairs(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Pairs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object mapping tensor names to {dtype, shape, data_offsets}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> std::result::Result<Pairs, A::Error> {
                let mut pairs: Vec<(String, serde_json::Value)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                while let Some((key, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "the name `{key}` appears twice in the header"
                        )));
                    }
                    pairs.push((key, value));
                }
                Ok(Pairs(pairs))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A short description of a JSON value's kind, for messages.
fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The `__metadata__` value: an object whose values are all strings.
fn parse_metadata(value: serde_json::Value, path: &Path) -> Result<HashMap<String, String>> {
    let serde_json::Value::Object(map) = value else {
        return Err(format_error(
            path,
            format!("`{METADATA_KEY}` is {}, not an object of strings", kind_of(&value)),
        ));
    };
    map.into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => Ok((key, text)),
            other => Err(format_error(
                path,
                format!("`{METADATA_KEY}` entry `{key}` is {}, not a string", kind_of(&other)),
            )),
        })
        .collect()
}

/// A list of non-negative integers that fit in `usize`, or why not.
fn usizes(value: Option<&serde_json::Value>) -> std::result::Result<Vec<usize>, String> {
    let Some(serde_json::Value::Array(items)) = value else {
        return Err(format!(
            "is {}, not an array of integers",
            value.map_or("missing", kind_of)
        ));
    };
    items
        .iter()
        .map(|item| {
            item.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("holds {item}, not a non-negative integer that fits in usize"))
        })
        .collect()
}

/// One tensor's entry, checked on its own: a known dtype, a shape whose element and byte counts
/// fit (checked arithmetic), and `data_offsets` spanning exactly those bytes inside the
/// `data_len` bytes of data the file holds.
fn parse_entry(name: String, value: &serde_json::Value, data_len: u64, path: &Path) -> Result<Entry> {
    let bad = |reason: String| format_error(path, format!("tensor `{name}`: {reason}"));
    let serde_json::Value::Object(fields) = value else {
        return Err(bad(format!(
            "is {}, not an object with dtype, shape and data_offsets",
            kind_of(value)
        )));
    };
    let dtype = match fields.get("dtype") {
        Some(serde_json::Value::String(dtype)) => dtype_from_name(dtype).map_err(|why| {
            bad(format!(
                "has dtype {dtype}, {why} (f32, f64, f16, bf16, i32, i64, u8, bool); convert it before saving"
            ))
        })?,
        other => {
            return Err(bad(format!(
                "`dtype` is {}, not a string",
                other.map_or("missing", kind_of)
            )));
        }
    };
    let shape = usizes(fields.get("shape")).map_err(|why| bad(format!("`shape` {why}")))?;
    let offsets = usizes(fields.get("data_offsets")).map_err(|why| bad(format!("`data_offsets` {why}")))?;
    let &[start, end] = offsets.as_slice() else {
        return Err(bad(format!(
            "`data_offsets` holds {} numbers, not [start, end]",
            offsets.len()
        )));
    };
    let bytes = checked_bytes(&shape, dtype).map_err(|e| bad(format!("{e} (a corrupt or hostile header?)")))?;
    let (start, end) = (start as u64, end as u64);
    if end < start {
        return Err(bad(format!("data_offsets [{start}, {end}] end before they start")));
    }
    if end - start != bytes as u64 {
        return Err(bad(format!(
            "data_offsets [{start}, {end}] span {} bytes, but shape {shape:?} of {dtype} takes {bytes}",
            end - start
        )));
    }
    if end > data_len {
        return Err(bad(format!(
            "data_offsets [{start}, {end}] reach past the {data_len} bytes of data in the file (truncated?)"
        )));
    }
    Ok(Entry {
        name,
        dtype,
        shape,
        start,
        end,
    })
}

/// Read and check the header of a file of `file_len` bytes: every tensor's entry (see
/// [`parse_entry`]), and together their byte ranges tile the data section exactly, with no overlap,
/// gap or bytes left over. Nothing is allocated beyond the header itself, whose length is checked
/// against the file's first.
pub(super) fn read_header(reader: &mut impl Read, file_len: u64, path: &Path) -> Result<Header> {
    let mut len_bytes = [0u8; 8];
    reader.read_exact(&mut len_bytes).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => format_error(
            path,
            format!("the file holds {file_len} bytes, fewer than the 8-byte header length"),
        ),
        _ => io_error(path, e),
    })?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES || header_len > file_len.saturating_sub(8) {
        return Err(format_error(
            path,
            format!(
                "the header claims {header_len} bytes but the file holds {file_len} (a truncated or foreign file?)"
            ),
        ));
    }
    let mut json = vec![0u8; header_len as usize];
    reader.read_exact(&mut json).map_err(|e| io_error(path, e))?;
    let Pairs(pairs) =
        serde_json::from_slice(&json).map_err(|e| format_error(path, format!("unreadable header: {e}")))?;
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;
    let mut metadata = HashMap::new();
    let mut entries = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        if name == METADATA_KEY {
            metadata = parse_metadata(value, path)?;
        } else {
            entries.push(parse_entry(name, &value, data_len, path)?);
        }
    }
    entries.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let mut covered = 0u64;
    let mut previous: Option<&Entry> = None;
    for entry in &entries {
        if entry.start < covered {
            let other = previous.map_or("", |p| p.name.as_str());
            return Err(format_error(
                path,
                format!(
                    "tensors `{other}` and `{}` overlap (bytes {}..{covered} belong to both); the header is corrupt",
                    entry.name, entry.start
                ),
            ));
        }
        if entry.start > covered {
            return Err(format_error(
                path,
                format!(
                    "bytes {covered}..{} of the data belong to no tensor (before `{}`); the header is corrupt",
                    entry.start, entry.name
                ),
            ));
        }
        covered = entry.end;
        previous = Some(entry);
    }
    if covered != data_len {
        return Err(format_error(
            path,
            format!(
                "the header describes {covered} bytes of data but the file holds {data_len} after the header (truncated, or bytes appended?)"
            ),
        ));
    }
    Ok(Header {
        data_start,
        entries,
        metadata,
    })
}

/// The header bytes (length prefix included) for tensors in the order given, each with its
/// dtype, shape and byte size, laid out back to back, and `metadata` (when not empty) under
/// `__metadata__`.
pub(super) fn encode_header(
    tensors: &[(String, DType, Vec<usize>, usize)],
    metadata: &HashMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>> {
    let mut offset = 0usize;
    let mut infos = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, bytes) in tensors {
        let end = offset
            .checked_add(*bytes)
            .ok_or_else(|| format_error(path, "the tensors hold more bytes than fit in usize"))?;
        infos.push((
            name.clone(),
            TensorInfo {
                dtype: to_file_dtype(*dtype),
                shape: shape.clone(),
                data_offsets: (offset, end),
            },
        ));
        offset = end;
    }
    let metadata = Metadata::new((!metadata.is_empty()).then(|| metadata.clone()), infos)
        .map_err(|e| format_error(path, format!("cannot describe these tensors: {e}")))?;
    let mut json = serde_json::to_vec(&metadata).map_err(|e| format_error(path, e.to_string()))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, data_len: usize) -> Result<Header> {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.resize(bytes.len() + data_len, 0);
        read_header(&mut bytes.as_slice(), bytes.len() as u64, Path::new("mem.safetensors"))
    }

    fn reason(json: &str, data_len: usize) -> String {
        match parse(json, data_len) {
            Err(Error::Format { reason, .. }) => reason,
            other => panic!("{json}: expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn header_round_trip() {
        let path = Path::new("mem.safetensors");
        let tensors = vec![
            ("w".to_string(), DType::F32, vec![2, 3], 24),
            ("mask".to_string(), DType::Bool, vec![5], 5),
        ];
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let mut bytes = encode_header(&tensors, &metadata, path).unwrap();
        assert_eq!(bytes.len() % 8, 0);
        bytes.extend(std::iter::repeat_n(0u8, 29));
        let header = read_header(&mut bytes.as_slice(), bytes.len() as u64, path).unwrap();
        assert_eq!(header.data_start as usize, bytes.len() - 29);
        assert_eq!(header.entries[0].name, "w");
        assert_eq!(
            (header.entries[1].dtype, header.entries[1].start, header.entries[1].end),
            (DType::Bool, 24, 29)
        );
        assert_eq!(header.metadata, metadata);
        let plain = encode_header(&tensors, &HashMap::new(), path).unwrap();
        assert!(!String::from_utf8_lossy(&plain).contains(METADATA_KEY));
    }

    #[test]
    fn every_dtype_maps_both_ways() {
        for dtype in DType::ALL {
            let name = serde_json::to_value(to_file_dtype(dtype)).unwrap();
            assert_eq!(dtype_from_name(name.as_str().unwrap()), Ok(dtype));
        }
        let i8_name = serde_json::to_value(FileDType::I8).unwrap();
        assert_eq!(
            dtype_from_name(i8_name.as_str().unwrap()),
            Err("which cartage does not have")
        );
        assert_eq!(dtype_from_name("Q4"), Err("which is not a safetensors dtype"));
    }

    #[test]
    fn bad_headers_are_format_errors() {
        let path = Path::new("bad.safetensors");
        let cases: Vec<Vec<u8>> = vec![
            vec![1, 2, 3],
            [1000u64.to_le_bytes().as_slice(), b"{}"].concat(),
            [8u64.to_le_bytes().as_slice(), b"not json"].concat(),
            [2u64.to_le_bytes().as_slice(), b"{}", &[0u8; 4]].concat(),
            [u64::MAX.to_le_bytes().as_slice(), b"{}"].concat(),
        ];
        for bytes in cases {
            let err = read_header(&mut bytes.as_slice(), bytes.len() as u64, path).unwrap_err();
            assert!(matches!(err, Error::Format { .. }), "{err}");
        }
    }

    #[test]
    fn empty_shapes_with_huge_sizes_are_fine() {
        let header = parse(
            r#"{"e":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}}"#,
            0,
        )
        .unwrap();
        assert_eq!(header.entries[0].shape, [0, 1 << 40, 1 << 40]);
    }

    #[test]
    fn overflowing_shapes_are_refused() {
        let elements = reason(
            r#"{"x":{"dtype":"U8","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}}"#,
            0,
        );
        assert!(elements.contains("tensor `x`"), "{elements}");
        // The element count fits in usize; its bytes as f64 do not.
        let bytes = reason(
            r#"{"x":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#,
            0,
        );
        assert!(bytes.contains("tensor `x`"), "{bytes}");
        let negative = reason(r#"{"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}"#, 0);
        assert!(negative.contains("`shape`"), "{negative}");
    }

    #[test]
    fn offsets_must_match_the_shape_and_stay_inside_the_file() {
        let wrong = reason(r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#, 12);
        assert!(wrong.contains("span 12 bytes") && wrong.contains("takes 16"), "{wrong}");
        let backwards = reason(r#"{"x":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}}"#, 8);
        assert!(backwards.contains("end before they start"), "{backwards}");
        let outside = reason(
            r#"{"x":{"dtype":"U8","shape":[576460752303423488],"data_offsets":[0,576460752303423488]}}"#,
            8,
        );
        assert!(outside.contains("reach past"), "{outside}");
        let max = reason(
            r#"{"x":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}}"#,
            8,
        );
        assert!(max.contains("reach past"), "{max}");
        let three = reason(r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}"#, 1);
        assert!(three.contains("[start, end]"), "{three}");
    }

    #[test]
    fn ranges_must_tile_the_data() {
        let overlap = reason(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            12,
        );
        assert!(
            overlap.contains("overlap") && overlap.contains("`a`") && overlap.contains("`b`"),
            "{overlap}"
        );
        let same = reason(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            8,
        );
        assert!(same.contains("overlap"), "{same}");
        let gap = reason(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#, 8);
        assert!(gap.contains("belong to no tensor"), "{gap}");
        let extra = reason(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#, 8);
        assert!(extra.contains("describes 4 bytes"), "{extra}");
    }

    #[test]
    fn names_and_metadata_are_checked() {
        let twice = reason(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            2,
        );
        assert!(twice.contains("appears twice"), "{twice}");
        let not_strings = reason(r#"{"__metadata__":{"epoch":3}}"#, 0);
        assert!(not_strings.contains("`epoch`"), "{not_strings}");
        let not_object = reason(r#"{"__metadata__":"pt"}"#, 0);
        assert!(not_object.contains("not an object"), "{not_object}");
        let not_an_entry = reason(r#"{"x":[1,2]}"#, 0);
        assert!(not_an_entry.contains("tensor `x`"), "{not_an_entry}");
        let unknown = reason(r#"{"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#, 1);
        assert!(unknown.contains("not a safetensors dtype"), "{unknown}");
        assert!(reason("[]", 0).contains("unreadable header"));
        let header = parse(r#"{"__metadata__":{"format":"pt"}}"#, 0).unwrap();
        assert_eq!(header.metadata["format"], "pt");
        assert!(header.entries.is_empty());
    }
}
