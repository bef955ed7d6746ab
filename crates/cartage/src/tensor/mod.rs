//! [`Tensor`]: shared device storage + a strided layout + dtype + device + origin.
//!
//! Cloning a tensor is cheap and shares its storage; views (transpose, permute, narrow, reshape
//! of compatible strides, broadcast, squeeze/unsqueeze) share it too. Ops return new tensors as
//! `Result<Tensor>` and check devices and dtypes first. The origin is the source location
//! (`#[track_caller]`) where the tensor was created or last moved; views keep their source's
//! origin, so an error names the line that decided where the data lives.
//!
//! The methods live in one file per job: [`create`] (constructors),
//! `view` (views), `shape` (cat, stack, split, expand, repeat, flip, roll, tril/triu, pad),
//! [`slicing`] (`x.i((1..3, .., 2))`), `elementwise` (unary, binary, comparison,
//! `where_cond`), `math` (rounding, trigonometry, activations, clamps, logical ops),
//! `ops_traits` (`&a + &b`), `reduce` (reductions, softmax), `stats` (prod, var/std, norm,
//! any/all, scans, sort, topk), `linalg` (matmul), `index` (gather, index_select), `scatter`
//! (masked_fill, scatter, index_add, one_hot, nonzero, embedding), [`nn`]
//! (normalisation, losses, dropout, convolution, pooling, attention), `transfer` (moves, casts,
//! contiguous, copy_from, async copies), `host` (reads) and `display` (printing values).

mod check;
pub mod create;
mod display;
mod elementwise;
mod host;
mod index;
mod linalg;
mod math;
pub mod nn;
mod ops_traits;
mod reduce;
mod scatter;
mod shape;
pub mod slicing;
mod stats;
mod transfer;
mod update;
mod view;

pub use math::LerpWeight;
pub use stats::NormOrd;

use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cartage_core::raw::BufferSlice;

use crate::autograd::graph::GradLink;
use cartage_core::{
    Backend, DType, Device, DeviceBuffer, IndexRange, Kernel, Layout, Result, Site, TensorArg, checked_bytes,
};

/// Device memory owned by one or more tensors; given back to the backend's cache on drop.
///
/// It wraps core's [`DeviceBuffer`], the sound path to device memory: every kernel, copy and
/// read of a tensor goes through it, with the storages of all operands borrowed for the call.
///
/// A storage counts its in-place writes (its *version*), as PyTorch's tensors do: autograd
/// records the version of every tensor an op saves for backward, and backward refuses a tensor
/// written since ([`cartage_core::Error::ModifiedInPlace`]), naming the last write.
pub struct Storage {
    buffer: DeviceBuffer,
    /// Bumped by every in-place write (ops making fresh tensors never touch it).
    version: AtomicU64,
    /// The last in-place write: its op name and call site (read only to report an error).
    last_write: Mutex<Option<(&'static str, Site)>>,
    /// The CUDA graph capture running on this thread when the storage was made (0: none); see
    /// [`crate::graph`].
    capture: u64,
    /// The range of its integer values as known on the host, and the version it holds for
    /// (see [`Storage::known_range`]).
    known_range: Mutex<Option<(u64, IndexRange)>>,
}

impl Storage {
    /// Allocate `bytes` on `backend`, recording `site` as the creation site (shown on OOM).
    pub fn new(backend: &Arc<dyn Backend>, bytes: usize, site: Site) -> Result<Storage> {
        Ok(Storage {
            buffer: DeviceBuffer::new_at(backend, bytes, site)?,
            version: AtomicU64::new(0),
            last_write: Mutex::new(None),
            capture: crate::graph::capture_id(),
            known_range: Mutex::new(None),
        })
    }

    /// A storage over `buffer` (memory imported through DLPack).
    pub(crate) fn from_buffer(buffer: DeviceBuffer) -> Storage {
        Storage {
            buffer,
            version: AtomicU64::new(0),
            last_write: Mutex::new(None),
            capture: crate::graph::capture_id(),
            known_range: Mutex::new(None),
        }
    }

    /// True when the memory was imported from another framework ([`Tensor::from_dlpack`])
    /// rather than allocated by cartage.
    pub fn is_external(&self) -> bool {
        self.buffer.is_external()
    }

    /// How many in-place writes this storage has had (`copy_from`, optimizer steps, `Var::set`,
    /// writes through a `detach()`ed view): 0 for a fresh tensor.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.storage().version(), 0);
    /// x.copy_from(&Tensor::ones(&[2], DType::F32, &Device::cpu())?)?;
    /// assert_eq!(x.storage().version(), 1);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Count an in-place write by `op` called at `site`.
    pub(crate) fn bump_version(&self, op: &'static str, site: Site) {
        *self.last_write.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((op, site));
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The smallest and largest of its integer values, when known on the host without reading
    /// the device: recorded when the values were written from the host ([`Tensor::from_slice`],
    /// a move from the CPU) or by `arange`, and forgotten by the first in-place write (the
    /// version moves on). Index kernels use it to skip waiting for their device-side check
    /// ([`cartage_core::Kernel::run_with_index_range`]). Never for imported memory, which
    /// another framework may write.
    pub fn known_range(&self) -> Option<IndexRange> {
        let known = *self.known_range.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        known.and_then(|(version, range)| (version == self.version() && !self.is_external()).then_some(range))
    }

    /// Record the range of its values, as they are at the current version.
    pub(crate) fn set_known_range(&self, range: Option<IndexRange>) {
        *self.known_range.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            range.map(|range| (self.version(), range));
    }

    /// The last in-place write (op name and call site), if any.
    pub(crate) fn last_write(&self) -> Option<(&'static str, Site)> {
        *self.last_write.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The id of the graph capture this storage was made in (0: none).
    pub(crate) fn captured_in(&self) -> u64 {
        self.capture
    }

    /// The backend that owns the memory.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.buffer.backend()
    }

    /// The owned device buffer.
    pub fn device_buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// The bytes of the storage (exactly the bytes asked for).
    pub fn buffer(&self) -> BufferSlice {
        self.buffer.slice()
    }

    /// Size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.buffer.len()
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("device", &self.backend().device())
            .field("bytes", &self.len_bytes())
            .finish()
    }
}

/// An n-dimensional array on one device. See the module docs.
///
/// `#[must_use]`: every op returns a new tensor, so `x.to(&device)?;` alone is a compiler warning
/// (LESSONS R8), not a silent no-op.
#[derive(Clone)]
#[must_use = "tensor ops return a new tensor and leave their inputs unchanged"]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    device: Device,
    origin: Site,
    /// How gradients flow back from this tensor: to a variable's cell or to the recorded op
    /// that made it; `None` when no variable leads here (then nothing is recorded).
    link: Option<GradLink>,
}

/// Shape, dtype, device and origin, then the values of a tensor of at most 16 elements
/// (reading them is a counted host sync): `Tensor([2], f32, cpu, from src/main.rs:4:13,
/// values=[1.0000, 2.0000])`.
impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        display::debug(self, f)
    }
}

impl Tensor {
    /// The sizes of each dimension.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.shape(), &[2, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Same as [`Tensor::shape`].
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.dims(), x.shape());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn dims(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Number of dimensions (0 for a scalar of shape `[]`).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 4], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.rank(), 3);
    /// assert_eq!(x.sum_all()?.rank(), 0);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// Number of elements (1 for shape `[]`, 0 when any dimension is 0).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 4], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.numel(), 24);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The element type.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::from_slice(&[1i64, 2], &[2], &Device::cpu())?;
    /// assert_eq!(x.dtype(), DType::I64);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the data lives.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.device(), Device::cpu());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn device(&self) -> Device {
        self.device
    }

    /// Shape, strides and offset (in elements).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.layout().strides(), &[3, 1]);
    /// assert_eq!(x.t()?.layout().strides(), &[1, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Where this tensor was created or last moved (views keep their source's origin).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.origin().line(), line!() - 1);
    /// assert_eq!(x.t()?.origin(), x.origin());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn origin(&self) -> Site {
        self.origin
    }

    /// Bytes of the elements this tensor views: numel × dtype size (R19). Cannot overflow: a
    /// layout spans at most [`cartage_core::layout::MAX_ELEMENTS`] elements, so this is at most
    /// `isize::MAX`, broadcast views included.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.size_in_bytes(), 24);
    /// assert_eq!(x.narrow(1, 0, 1)?.size_in_bytes(), 8);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn size_in_bytes(&self) -> usize {
        self.numel() * self.dtype.size_in_bytes()
    }

    /// Bytes of the storage underneath (a view may see less of it).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.narrow(1, 0, 1)?.storage_bytes(), 24);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn storage_bytes(&self) -> usize {
        self.storage.len_bytes()
    }

    /// True when the elements are dense and row-major in memory.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert!(x.is_contiguous());
    /// assert!(!x.t()?.is_contiguous());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// True when both tensors view the same storage.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert!(x.t()?.shares_storage(&x));
    /// assert!(!x.add_scalar(1.0)?.shares_storage(&x));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// The backend this tensor's device runs on.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.backend().device(), Device::cpu());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.storage.backend()
    }

    /// The storage underneath, shared by every view of it.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.select(0, 1)?.storage().len_bytes(), 24);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// This tensor as a kernel operand, for backend-level code (benches, loaders).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// let arg = x.t()?.as_arg();
    /// assert_eq!((arg.layout.shape(), arg.dtype), (&[3usize, 2][..], DType::F32));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn as_arg(&self) -> TensorArg {
        TensorArg {
            buffer: self.storage.buffer(),
            layout: self.layout.clone(),
            dtype: self.dtype,
        }
    }

    /// This tensor's storage seen through another layout, as a kernel operand.
    fn arg_with(&self, layout: Layout) -> TensorArg {
        TensorArg {
            buffer: self.storage.buffer(),
            layout,
            dtype: self.dtype,
        }
    }

    /// A view of the same storage with another layout (the origin is kept). Not recorded: the
    /// result has no link; public views record themselves.
    fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: Arc::clone(&self.storage),
            layout,
            dtype: self.dtype,
            device: self.device,
            origin: self.origin,
            link: None,
        }
    }

    /// The link gradients flow back through, if a variable leads here.
    pub(crate) fn link(&self) -> Option<&GradLink> {
        self.link.as_ref()
    }

    /// This tensor with another link (the autograd module records through this).
    pub(crate) fn with_link(self, link: Option<GradLink>) -> Tensor {
        Tensor { link, ..self }
    }

    /// The same tensor with a new origin (a no-op move or cast).
    fn moved_here(&self, site: Site) -> Tensor {
        Tensor {
            origin: site,
            ..self.clone()
        }
    }

    /// A fresh contiguous tensor on `backend`, contents unspecified: every caller writes all
    /// of it (by a kernel or a copy) before handing it out.
    fn alloc_on(backend: &Arc<dyn Backend>, shape: &[usize], dtype: DType, site: Site) -> Result<Tensor> {
        let layout = Layout::contiguous(shape).map_err(|e| e.with_dtype(dtype))?;
        Tensor::alloc_with(backend, backend.device(), layout, dtype, site)
    }

    /// A tensor viewing `storage` through `layout` (an imported DLPack tensor).
    pub(crate) fn from_storage(
        storage: Arc<Storage>,
        layout: Layout,
        dtype: DType,
        device: Device,
        site: Site,
    ) -> Tensor {
        Tensor {
            storage,
            layout,
            dtype,
            device,
            origin: site,
            link: None,
        }
    }

    /// A fresh tensor with `layout`, which must be contiguous from offset 0.
    fn alloc_with(
        backend: &Arc<dyn Backend>,
        device: Device,
        layout: Layout,
        dtype: DType,
        site: Site,
    ) -> Result<Tensor> {
        debug_assert!(layout.is_contiguous() && layout.offset() == 0);
        let bytes = checked_bytes(layout.shape(), dtype)?;
        let storage = Storage::new(backend, bytes, site)?;
        Ok(Tensor {
            storage: Arc::new(storage),
            layout,
            dtype,
            device,
            origin: site,
            link: None,
        })
    }

    /// A fresh contiguous tensor on this tensor's device (for op outputs), contents unspecified:
    /// the caller's kernel must write all of it.
    pub(crate) fn alloc_like(&self, shape: &[usize], dtype: DType, site: Site) -> Result<Tensor> {
        let layout = if shape == self.shape() && self.layout.offset() == 0 && self.is_contiguous() {
            self.layout.clone()
        } else {
            Layout::contiguous(shape).map_err(|e| e.with_dtype(dtype))?
        };
        Tensor::alloc_with(self.backend(), self.device, layout, dtype, site)
    }

    /// Launch `kernel`, whose output is this tensor and whose other operands are `inputs`,
    /// unless the output is empty. The storages are borrowed for the call ([`Kernel::run`]).
    fn launch(&self, kernel: &Kernel, inputs: &[&Tensor], out_numel: usize) -> Result<()> {
        if out_numel == 0 {
            return Ok(());
        }
        crate::graph::hold(std::iter::once(self).chain(inputs.iter().copied()));
        if inputs.len() > 3 {
            return kernel.run(&self.operand_buffers(inputs));
        }
        let mut buffers: [&DeviceBuffer; 4] = [self.storage.device_buffer(); 4];
        for (slot, input) in buffers[1..].iter_mut().zip(inputs) {
            *slot = input.storage.device_buffer();
        }
        kernel.run(&buffers[..1 + inputs.len()])
    }

    /// [`Tensor::launch`] of an index kernel whose index operand is `index`: when the host knows
    /// the range of the index's values ([`Storage::known_range`]), the kernel runs without a
    /// wait for its device-side check where that range fits its bound.
    pub(crate) fn launch_indexed(
        &self,
        kernel: &Kernel,
        inputs: &[&Tensor],
        index: &Tensor,
        out_numel: usize,
    ) -> Result<()> {
        let Some(range) = index.known_index_range() else {
            return self.launch(kernel, inputs, out_numel);
        };
        if out_numel == 0 {
            return Ok(());
        }
        crate::graph::hold(std::iter::once(self).chain(inputs.iter().copied()));
        if inputs.len() > 3 {
            return kernel.run_with_index_range(&self.operand_buffers(inputs), range);
        }
        let mut buffers: [&DeviceBuffer; 4] = [self.storage.device_buffer(); 4];
        for (slot, input) in buffers[1..].iter_mut().zip(inputs) {
            *slot = input.storage.device_buffer();
        }
        kernel.run_with_index_range(&buffers[..1 + inputs.len()], range)
    }

    /// The buffers of this output and of every input, for a kernel with more than three inputs
    /// (the common case takes a fixed array, without allocating).
    fn operand_buffers<'a>(&'a self, inputs: &[&'a Tensor]) -> Vec<&'a DeviceBuffer> {
        std::iter::once(self)
            .chain(inputs.iter().copied())
            .map(|t| t.storage.device_buffer())
            .collect()
    }

    /// The range of this integer tensor's values where the host knows it (a bound: a view may
    /// hold fewer of the storage's values).
    pub(crate) fn known_index_range(&self) -> Option<IndexRange> {
        matches!(self.dtype, DType::I32 | DType::I64)
            .then(|| self.storage.known_range())
            .flatten()
    }

    /// The byte offset of the first viewed element inside the storage.
    fn byte_offset(&self) -> usize {
        self.layout.offset() * self.dtype.size_in_bytes()
    }
}

/// The caller's location, for `#[track_caller]` functions.
#[track_caller]
pub(crate) fn caller() -> Site {
    Location::caller()
}

/// Rewrite raw bytes of bool elements as 0 or 1 (any nonzero byte is `true`), the one form of
/// `true` every backend's kernels expect; for bytes that enter from files or host buffers.
pub(crate) fn normalize_bool_bytes(bytes: &mut [u8]) {
    for b in bytes {
        *b = u8::from(*b != 0);
    }
}
