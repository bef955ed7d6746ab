//! [`save_safetensors`]: tensors from any device into a file, streamed through pinned staging,
//! written to a temporary file beside the target and renamed over it once complete.

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::Path;

use cartage_core::{Error, Result};

use super::header::{METADATA_KEY, encode_header, io_error, to_file_dtype};
use super::load::STAGING_BYTES;
use crate::Tensor;

/// Write `tensors` (name, tensor) to a safetensors file at `path`, from whatever device each
/// lives on. Strided views are made contiguous on their device first. Names must be unique and
/// none may be `__metadata__` (the format's key for string metadata): either is an
/// [`Error::InvalidArgument`], raised before anything is written.
///
/// As the Python package does, tensors are laid out by decreasing dtype size, then by name, so
/// that every tensor's data is aligned to its element size.
///
/// The file is written to a new temporary file in the same folder, flushed to disk, then renamed
/// over `path`: until the new file is complete, a file already at `path` stays as it was, and a
/// failure leaves it untouched and removes the temporary file. A file replaced this way keeps its
/// permissions; a new one gets the usual ones (0666 less the umask on Unix). A symbolic link at
/// `path` is replaced by the file, not written through.
pub fn save_safetensors<S: AsRef<str>>(path: impl AsRef<Path>, tensors: &[(S, &Tensor)]) -> Result<()> {
    save_safetensors_with_metadata(path, tensors, &HashMap::new())
}

/// [`save_safetensors`], also storing `metadata` as the file's `__metadata__` (string keys and
/// values, e.g. `{"format": "pt"}`), which [`super::SafetensorsFile::metadata`] and the Python
/// package's `safe_open(...).metadata()` read back. An empty map writes no `__metadata__`.
pub fn save_safetensors_with_metadata<S: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(S, &Tensor)],
    metadata: &HashMap<String, String>,
) -> Result<()> {
    let path = path.as_ref();
    let mut seen = HashSet::new();
    for (name, _) in tensors {
        let name = name.as_ref();
        if name == METADATA_KEY {
            return Err(Error::invalid(
                "save_safetensors",
                format!(
                    "a tensor is named `{METADATA_KEY}`, which the safetensors format reserves for the file's string \
                     metadata; rename the tensor (string metadata goes through `save_safetensors_with_metadata`)"
                ),
            ));
        }
        if !seen.insert(name) {
            return Err(Error::invalid(
                "save_safetensors",
                format!("the name `{name}` is given twice; each tensor in a file needs its own name"),
            ));
        }
    }
    let mut ordered: Vec<(&str, Tensor)> = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        ordered.push((name.as_ref(), tensor.contiguous()?));
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
    let header = encode_header(&described, metadata, path)?;

    let mut tmp = temporary_beside(path)?;
    let mut out = BufWriter::new(tmp.as_file_mut());
    out.write_all(&header).map_err(|e| io_error(path, e))?;
    let largest = ordered.iter().map(|(_, t)| t.size_in_bytes()).max().unwrap_or(0);
    let mut staging: Option<(cartage_core::Device, cartage_core::StagingBuffer)> = None;
    for (_, tensor) in &ordered {
        let bytes = tensor.size_in_bytes();
        if bytes == 0 {
            continue;
        }
        let backend = tensor.backend();
        if staging.as_ref().is_none_or(|(d, _)| *d != tensor.device()) {
            staging = Some((tensor.device(), backend.alloc_staging(largest.clamp(1, STAGING_BYTES))?));
        }
        let Some((_, buffer)) = staging.as_mut() else {
            unreachable!("staging was just set");
        };
        let elem = tensor.dtype().size_in_bytes();
        let source = tensor.storage().device_buffer();
        let start = tensor.layout().offset() * elem;
        let mut done = 0;
        while done < bytes {
            let n = buffer.len().min(bytes - done);
            source.read_async(start + done, buffer, n)?.wait()?;
            out.write_all(&buffer.as_slice()[..n]).map_err(|e| io_error(path, e))?;
            done += n;
        }
    }
    out.flush().map_err(|e| io_error(path, e))?;
    drop(out);
    // On disk before the rename, so that a crash never leaves a renamed but incomplete file.
    tmp.as_file().sync_all().map_err(|e| io_error(path, e))?;
    tmp.persist(path).map_err(|e| io_error(path, e.error))?;
    tracing::debug!(path = %path.display(), tensors = ordered.len(), "saved safetensors");
    Ok(())
}

/// A new temporary file in `path`'s folder (so the final rename stays on one file system),
/// removed when dropped unless persisted. It gets the permissions of a file already at `path`, or
/// else those a newly created file would get.
fn temporary_beside(path: &Path) -> Result<tempfile::NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let prefix = format!(
        ".{}.",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
    );
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Created with mode 0666 less the umask, as `File::create` would.
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let tmp = builder.tempfile_in(dir).map_err(|e| io_error(path, e))?;
    if let Ok(existing) = std::fs::metadata(path)
        && existing.is_file()
    {
        tmp.as_file()
            .set_permissions(existing.permissions())
            .map_err(|e| io_error(path, e))?;
    }
    Ok(tmp)
}
