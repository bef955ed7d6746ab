//! [`save_safetensors`]: tensors from any device into a file, streamed through pinned staging.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use cartage_core::{Error, Result};

use super::header::{encode_header, io_error, to_file_dtype};
use super::load::STAGING_BYTES;
use crate::Tensor;

/// Write `tensors` (name, tensor) to a safetensors file at `path`, from whatever device each
/// lives on. Strided views are made contiguous on their device first. Names must be unique.
///
/// As the Python package does, tensors are laid out by decreasing dtype size, then by name, so
/// that every tensor's data is aligned to its element size.
pub fn save_safetensors<S: AsRef<str>>(path: impl AsRef<Path>, tensors: &[(S, &Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mut seen = HashSet::new();
    let mut ordered: Vec<(&str, Tensor)> = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        let name = name.as_ref();
        if !seen.insert(name) {
            return Err(Error::invalid(
                "save_safetensors",
                format!("the name `{name}` is given twice"),
            ));
        }
        ordered.push((name, tensor.contiguous()?));
    }
    ordered.sort_by(|(ln, lt), (rn, rt)| {
        to_file_dtype(rt.dtype())
            .cmp(&to_file_dtype(lt.dtype()))
            .then(ln.cmp(rn))
    });
    let described: Vec<_> = ordered
        .iter()
        .map(|(name, t)| (name.to_string(), t.dtype(), t.shape().to_vec(), t.size_in_bytes()))
        .collect();
    let header = encode_header(&described, path)?;

    let mut out = BufWriter::new(File::create(path).map_err(|e| io_error(path, e))?);
    out.write_all(&header).map_err(|e| io_error(path, e))?;
    let largest = ordered.iter().map(|(_, t)| t.size_in_bytes()).max().unwrap_or(0);
    let mut staging: Option<(cartage_core::Device, cartage_core::PinnedBuffer)> = None;
    for (_, tensor) in &ordered {
        let bytes = tensor.size_in_bytes();
        if bytes == 0 {
            continue;
        }
        let backend = tensor.backend();
        if staging.as_ref().is_none_or(|(d, _)| *d != tensor.device()) {
            staging = Some((tensor.device(), backend.alloc_pinned(largest.clamp(1, STAGING_BYTES))?));
        }
        let Some((_, buffer)) = staging.as_mut() else {
            unreachable!("staging was just set");
        };
        let elem = tensor.dtype().size_in_bytes();
        let source = tensor
            .storage()
            .buffer()
            .slice(tensor.layout().offset() * elem, bytes)?;
        let mut done = 0;
        while done < bytes {
            let n = buffer.len().min(bytes - done);
            backend.read_async(source.slice(done, n)?, buffer)?.wait()?;
            out.write_all(&buffer.as_slice()[..n]).map_err(|e| io_error(path, e))?;
            done += n;
        }
    }
    out.flush().map_err(|e| io_error(path, e))?;
    tracing::debug!(path = %path.display(), tensors = ordered.len(), "saved safetensors");
    Ok(())
}
