//! [`load_safetensors`]: a file's tensors onto a device, streamed through pinned staging.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use cartage_core::{Device, Result, format_bytes};

use super::header::{format_error, io_error, read_header};
use crate::{Tensor, runtime};

/// The most pinned host memory loading holds at once (less when the file's data is smaller).
pub const STAGING_BYTES: usize = 16 << 20;

/// Load every tensor of the safetensors file at `path` onto `device`, keyed by name.
///
/// Each tensor is allocated on `device` and filled chunk by chunk: file → one pinned staging
/// buffer of at most [`STAGING_BYTES`] → device memory. Errors: [`cartage_core::Error::Io`] when
/// the file cannot be read, [`cartage_core::Error::Format`] when it is not a valid safetensors
/// file (or holds a dtype cartage lacks), and the device's own errors (out of memory, a dtype the
/// device cannot hold).
///
/// ```no_run
/// use cartage::prelude::*;
/// # fn main() -> cartage::Result<()> {
/// let device = Device::pick()?;
/// let weights = cartage::load_safetensors("model.safetensors", &device)?;
/// let w = &weights["fc1.weight"];
/// assert_eq!(w.device(), device);
/// # Ok(()) }
/// ```
pub fn load_safetensors(path: impl AsRef<Path>, device: &Device) -> Result<HashMap<String, Tensor>> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let file_len = file.metadata().map_err(|e| io_error(path, e))?.len();
    let mut reader = BufReader::new(file);
    let (data_start, entries) = read_header(&mut reader, file_len, path)?;
    let backend = runtime::backend(device)?;
    let largest = entries.iter().map(|e| e.end - e.start).max().unwrap_or(0) as usize;
    let mut staging = backend.alloc_pinned(largest.clamp(1, STAGING_BYTES))?;
    let mut reader = reader.into_inner();
    reader
        .seek(SeekFrom::Start(data_start))
        .map_err(|e| io_error(path, e))?;

    let mut tensors = HashMap::with_capacity(entries.len());
    let mut dtypes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut parameters = 0usize;
    for entry in &entries {
        let tensor = Tensor::empty(&entry.shape, entry.dtype, device)?;
        let bytes = tensor.size_in_bytes();
        if bytes as u64 != entry.end - entry.start {
            return Err(format_error(
                path,
                format!("tensor `{}`: shape and byte range disagree", entry.name),
            ));
        }
        if bytes > 0 {
            let destination = tensor.storage().buffer().slice(0, bytes)?;
            let mut done = 0;
            while done < bytes {
                let n = staging.len().min(bytes - done);
                reader
                    .read_exact(&mut staging.as_mut_slice()[..n])
                    .map_err(|e| io_error(path, e))?;
                backend.write_async(destination.slice(done, n)?, &staging)?.wait()?;
                done += n;
            }
        }
        parameters += tensor.numel();
        *dtypes.entry(entry.dtype.name()).or_default() += 1;
        tensors.insert(entry.name.clone(), tensor);
    }
    let dtypes = dtypes
        .iter()
        .map(|(d, n)| format!("{d}×{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    tracing::info!(
        %device,
        dtypes = %dtypes,
        parameters,
        tensors = tensors.len(),
        bytes = %format_bytes(file_len - data_start),
        path = %path.display(),
        "loaded safetensors onto {device}: {parameters} parameters ({dtypes})"
    );
    Ok(tensors)
}
