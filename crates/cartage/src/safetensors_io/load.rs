//! [`load_safetensors`] and [`SafetensorsFile`]: a file's tensors (all of them, or the ones
//! named) onto a device, streamed through pinned staging, and the file's string metadata.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use cartage_core::{DType, Device, Result, format_bytes};

use super::header::{Entry, Header, format_error, io_error, read_header};
use crate::{Tensor, runtime};

/// The most pinned host memory loading holds at once (less when the file's data is smaller).
pub const STAGING_BYTES: usize = 16 << 20;

/// Load every tensor of the safetensors file at `path` onto `device`, keyed by name.
///
/// Each tensor is allocated on `device` and filled chunk by chunk: file → one pinned staging
/// buffer of at most [`STAGING_BYTES`] → device memory. Errors: [`cartage_core::Error::Io`] when
/// the file cannot be read, [`cartage_core::Error::Format`] when it is not a valid safetensors
/// file (or holds a dtype cartage lacks), and the device's own errors (out of memory, a dtype the
/// device cannot hold). To read the file's `__metadata__` or load only some tensors, use
/// [`SafetensorsFile`].
///
/// Each tensor's origin ([`Tensor::origin`], named in error messages) is the line that called
/// this function, not a line inside cartage.
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
#[track_caller]
pub fn load_safetensors(path: impl AsRef<Path>, device: &Device) -> Result<HashMap<String, Tensor>> {
    SafetensorsFile::open(path)?.load(device)
}

/// How many names an unknown-name error lists.
const NAMES_IN_ERRORS: usize = 5;

/// An open safetensors file whose header has been read and checked: tensor names, dtypes and
/// shapes, and the string metadata under `__metadata__`. No tensor data is read until
/// [`SafetensorsFile::load`] or [`SafetensorsFile::load_only`].
///
/// Opening checks the whole header without trusting it: every shape's element and byte counts
/// (overflow is an error, not a panic), every tensor's byte range against its shape, dtype and
/// the file's length, and that the ranges neither overlap nor leave gaps. Nothing larger than the
/// header is allocated before that.
///
/// ```no_run
/// use cartage::prelude::*;
/// use cartage::safetensors_io::SafetensorsFile;
/// # fn main() -> cartage::Result<()> {
/// let device = Device::pick()?;
/// let file = SafetensorsFile::open("model.safetensors")?;
/// println!("format: {:?}", file.metadata().get("format"));
/// let embedding = file.load_only(&["embed.weight"], &device)?;
/// assert_eq!(embedding.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    header: Header,
}

impl SafetensorsFile {
    /// Open the file at `path` and check its header. Errors: [`cartage_core::Error::Io`] when it
    /// cannot be read, [`cartage_core::Error::Format`] when the header is not a valid safetensors
    /// header or names a dtype cartage lacks.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io_error(path, e))?;
        let file_len = file.metadata().map_err(|e| io_error(path, e))?.len();
        let header = read_header(&mut BufReader::new(&file), file_len, path)?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            file,
            header,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's string metadata (its `__metadata__`; empty when it has none).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.header.metadata
    }

    /// The tensor names, in the order of their data in the file.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.header.entries.iter().map(|e| e.name.as_str())
    }

    /// How many tensors the file holds.
    pub fn len(&self) -> usize {
        self.header.entries.len()
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.header.entries.is_empty()
    }

    /// The dtype and shape of the tensor `name`, if the file has it.
    pub fn dtype_and_shape(&self, name: &str) -> Option<(DType, &[usize])> {
        self.entry(name).map(|e| (e.dtype, e.shape.as_slice()))
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        self.header.entries.iter().find(|e| e.name == name)
    }

    /// Load every tensor onto `device`, keyed by name (see [`load_safetensors`]). Each tensor's
    /// origin is the caller's line.
    #[track_caller]
    pub fn load(&self, device: &Device) -> Result<HashMap<String, Tensor>> {
        let entries: Vec<&Entry> = self.header.entries.iter().collect();
        self.load_entries(&entries, device)
    }

    /// Load only the tensors named in `names` onto `device`, keyed by name; the others' bytes are
    /// never read. A name the file lacks is an [`cartage_core::Error::InvalidArgument`] listing
    /// some of the names it has; nothing is loaded then. Each tensor's origin is the caller's
    /// line.
    #[track_caller]
    pub fn load_only<S: AsRef<str>>(&self, names: &[S], device: &Device) -> Result<HashMap<String, Tensor>> {
        let mut wanted: Vec<&Entry> = Vec::with_capacity(names.len());
        for name in names {
            let name = name.as_ref();
            let entry = self.entry(name).ok_or_else(|| self.unknown_name(name))?;
            if !wanted.iter().any(|e| e.name == name) {
                wanted.push(entry);
            }
        }
        wanted.sort_by_key(|e| e.start);
        self.load_entries(&wanted, device)
    }

    fn unknown_name(&self, name: &str) -> cartage_core::Error {
        let mut available: Vec<&str> = self.names().collect();
        available.sort_unstable();
        let total = available.len();
        let listed = available
            .iter()
            .take(NAMES_IN_ERRORS)
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let holds = match total {
            0 => "it holds no tensor".to_string(),
            n if n <= NAMES_IN_ERRORS => format!("it holds {listed}"),
            n => format!("it holds {n} tensors: {listed} and {} more", n - NAMES_IN_ERRORS),
        };
        cartage_core::Error::invalid(
            "load_safetensors",
            format!(
                "{} has no tensor named `{name}`; {holds}. Check the spelling and any prefix (such as `model.`); \
                 `SafetensorsFile::names` lists them all",
                self.path.display()
            ),
        )
    }

    /// Stream `entries` (in data order) onto `device` through one staging buffer (the tensors'
    /// origin is the caller's caller: every public loader is `#[track_caller]`).
    #[track_caller]
    fn load_entries(&self, entries: &[&Entry], device: &Device) -> Result<HashMap<String, Tensor>> {
        let path = self.path.as_path();
        let backend = runtime::backend(device)?;
        let largest = entries.iter().map(|e| e.end - e.start).max().unwrap_or(0) as usize;
        let mut staging = backend.alloc_staging(largest.clamp(1, STAGING_BYTES))?;
        let mut reader = &self.file;

        let mut tensors = HashMap::with_capacity(entries.len());
        let mut dtypes: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut parameters = 0usize;
        let mut loaded_bytes = 0u64;
        for entry in entries {
            let tensor = Tensor::empty(&entry.shape, entry.dtype, device)?;
            let bytes = tensor.size_in_bytes();
            if bytes as u64 != entry.end - entry.start {
                return Err(format_error(
                    path,
                    format!("tensor `{}`: shape and byte range disagree", entry.name),
                ));
            }
            if bytes > 0 {
                reader
                    .seek(SeekFrom::Start(self.header.data_start + entry.start))
                    .map_err(|e| io_error(path, e))?;
                let destination = tensor.storage().device_buffer();
                let mut done = 0;
                while done < bytes {
                    let n = staging.len().min(bytes - done);
                    reader
                        .read_exact(&mut staging.as_mut_slice()[..n])
                        .map_err(|e| io_error(path, e))?;
                    if entry.dtype == DType::Bool {
                        crate::tensor::normalize_bool_bytes(&mut staging.as_mut_slice()[..n]);
                    }
                    destination.write_async(done, &staging, n)?.wait()?;
                    done += n;
                }
            }
            parameters += tensor.numel();
            loaded_bytes += bytes as u64;
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
            bytes = %format_bytes(loaded_bytes),
            path = %path.display(),
            "loaded safetensors onto {device}: {parameters} parameters ({dtypes})"
        );
        Ok(tensors)
    }
}
