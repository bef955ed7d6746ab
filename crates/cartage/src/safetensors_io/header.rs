//! The safetensors header: an 8-byte little-endian length, then that many bytes of JSON mapping
//! each name to `{dtype, shape, data_offsets}` (offsets relative to the data after the header),
//! padded with spaces to a multiple of 8. Parsed and written with the `safetensors` crate's own
//! types, without ever holding the data.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use ::safetensors::Dtype as FileDType;
use ::safetensors::tensor::{Metadata, TensorInfo};
use cartage_core::{DType, Error, Result};

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

/// The cartage dtype for a file's dtype, if cartage has it.
pub(super) fn from_file_dtype(dtype: FileDType) -> Option<DType> {
    Some(match dtype {
        FileDType::F32 => DType::F32,
        FileDType::F64 => DType::F64,
        FileDType::F16 => DType::F16,
        FileDType::BF16 => DType::BF16,
        FileDType::I32 => DType::I32,
        FileDType::I64 => DType::I64,
        FileDType::U8 => DType::U8,
        FileDType::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Read and check the header of a file of `file_len` bytes. Returns the byte offset where the
/// data section starts and the entries in data order.
pub(super) fn read_header(reader: &mut impl Read, file_len: u64, path: &Path) -> Result<(u64, Vec<Entry>)> {
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
    let metadata: Metadata =
        serde_json::from_slice(&json).map_err(|e| format_error(path, format!("unreadable header: {e}")))?;
    let data_start = 8 + header_len;
    let data_len = metadata.data_len() as u64;
    if data_start + data_len != file_len {
        return Err(format_error(
            path,
            format!(
                "the header describes {data_len} bytes of data but the file holds {} after the header (truncated?)",
                file_len - data_start
            ),
        ));
    }
    let mut entries = Vec::new();
    for name in metadata.offset_keys() {
        let Some(info) = metadata.info(&name) else {
            continue;
        };
        let dtype = from_file_dtype(info.dtype).ok_or_else(|| {
            format_error(
                path,
                format!(
                    "tensor `{name}` has dtype {:?}, which cartage does not have (f32, f64, f16, bf16, i32, i64, u8, bool); convert it before saving",
                    info.dtype
                ),
            )
        })?;
        entries.push(Entry {
            name,
            dtype,
            shape: info.shape.clone(),
            start: info.data_offsets.0 as u64,
            end: info.data_offsets.1 as u64,
        });
    }
    Ok((data_start, entries))
}

/// The header bytes (length prefix included) for tensors in the order given, each with its
/// dtype, shape and byte size, laid out back to back.
pub(super) fn encode_header(tensors: &[(String, DType, Vec<usize>, usize)], path: &Path) -> Result<Vec<u8>> {
    let mut offset = 0;
    let mut infos = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, bytes) in tensors {
        infos.push((
            name.clone(),
            TensorInfo {
                dtype: to_file_dtype(*dtype),
                shape: shape.clone(),
                data_offsets: (offset, offset + bytes),
            },
        ));
        offset += bytes;
    }
    let metadata = Metadata::new(None::<HashMap<String, String>>, infos)
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

    #[test]
    fn header_round_trip() {
        let path = Path::new("mem.safetensors");
        let tensors = vec![
            ("w".to_string(), DType::F32, vec![2, 3], 24),
            ("mask".to_string(), DType::Bool, vec![5], 5),
        ];
        let mut bytes = encode_header(&tensors, path).unwrap();
        assert_eq!(bytes.len() % 8, 0);
        bytes.extend(std::iter::repeat_n(0u8, 29));
        let (start, entries) = read_header(&mut bytes.as_slice(), bytes.len() as u64, path).unwrap();
        assert_eq!(start as usize, bytes.len() - 29);
        assert_eq!(entries[0].name, "w");
        assert_eq!(
            (entries[1].dtype, entries[1].start, entries[1].end),
            (DType::Bool, 24, 29)
        );
    }

    #[test]
    fn every_dtype_maps_both_ways() {
        for dtype in DType::ALL {
            assert_eq!(from_file_dtype(to_file_dtype(dtype)), Some(dtype));
        }
        assert_eq!(from_file_dtype(FileDType::I8), None);
    }

    #[test]
    fn bad_headers_are_format_errors() {
        let path = Path::new("bad.safetensors");
        let cases: Vec<Vec<u8>> = vec![
            vec![1, 2, 3],
            [1000u64.to_le_bytes().as_slice(), b"{}"].concat(),
            [8u64.to_le_bytes().as_slice(), b"not json"].concat(),
            [2u64.to_le_bytes().as_slice(), b"{}", &[0u8; 4]].concat(),
        ];
        for bytes in cases {
            let err = read_header(&mut bytes.as_slice(), bytes.len() as u64, path).unwrap_err();
            assert!(matches!(err, Error::Format { .. }), "{err}");
        }
    }
}
