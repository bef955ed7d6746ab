//! Moves and casts: `to(&device)` (a new tensor; nothing ever moves implicitly), `to_dtype`,
//! `to_device_dtype` (cast and move in the order with the lower peak, R11), `contiguous`,
//! `copy_from` (into a view) and the asynchronous copies to and from pinned host memory.
//!
//! Between two devices data goes device-to-device when the backends can (`copy_to_peer`), else
//! through pinned host staging in chunks of at most [`STAGING_CHUNK`] bytes.

use cartage_core::{CopyHandle, DType, Device, DeviceBuffer, Error, HostStaging, Kernel, Op, Result, Site};

use super::{Tensor, caller, check};
use crate::autograd::{formulas, graph};
use crate::runtime;

/// The largest pinned staging buffer a cross-device move holds at once.
pub const STAGING_CHUNK: usize = 32 << 20;

impl Tensor {
    /// This tensor on `device`, as a new tensor (the original is unchanged). On its own device
    /// it is a cheap clone whose origin becomes the caller's line. `#[must_use]`: `x.to(&d)?;`
    /// alone leaves `x` where it was.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
    /// let y = x.to(&Device::cpu())?; // already there: shares the storage
    /// assert!(y.shares_storage(&x) && y.device() == Device::cpu());
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[must_use = "`to` returns the moved tensor and leaves `self` where it was"]
    #[track_caller]
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        let site = caller();
        if *device == self.device {
            return Ok(self.moved_here(site));
        }
        self.move_to(device, site)
    }

    /// This tensor converted to `dtype` (Rust `as` semantics: floats truncate toward zero and
    /// saturate), on the same device. `#[must_use]`: the result is a new tensor.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::new([1.7f32, -1.7, 300.0], &Device::cpu())?;
    /// let y = x.to_dtype(DType::U8)?;
    /// assert_eq!((y.dtype(), y.to_vec::<u8>()?), (DType::U8, vec![1, 0, 255]));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[must_use = "`to_dtype` returns the converted tensor and leaves `self` as it was"]
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let site = caller();
        if dtype == self.dtype {
            return Ok(self.moved_here(site));
        }
        self.cast_at(dtype, site)
    }

    /// This tensor on `device` as `dtype`, in the order with the lower peak memory: a cast to a
    /// smaller dtype happens before the move (only the small tensor travels and lands), a cast
    /// to a larger one after it (R11). The other order is used when a device cannot cast.
    /// `#[must_use]`: the result is a new tensor.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::new([1.5f32, 2.5], &Device::cpu())?;
    /// let y = x.to_device_dtype(&Device::cpu(), DType::F64)?;
    /// assert_eq!((y.device(), y.to_vec::<f64>()?), (Device::cpu(), vec![1.5, 2.5]));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[must_use = "`to_device_dtype` returns a new tensor and leaves `self` as it was"]
    #[track_caller]
    pub fn to_device_dtype(&self, device: &Device, dtype: DType) -> Result<Tensor> {
        let site = caller();
        if *device == self.device {
            return if dtype == self.dtype {
                Ok(self.moved_here(site))
            } else {
                self.cast_at(dtype, site)
            };
        }
        if dtype == self.dtype {
            return self.move_to(device, site);
        }
        let destination = runtime::backend(device)?;
        let cast = Op::Cast(dtype);
        let source_casts = self.backend().capabilities().supports(cast, self.dtype);
        let destination_casts = destination.capabilities().supports(cast, self.dtype);
        let cast_first = if dtype.size_in_bytes() < self.dtype.size_in_bytes() {
            source_casts || !destination_casts
        } else {
            !destination_casts && source_casts
        };
        if cast_first {
            self.cast_at(dtype, site)?.move_to(device, site)
        } else {
            self.move_to(device, site)?.cast_at(dtype, site)
        }
    }

    /// A contiguous tensor with the same elements: `self` (shared) when already contiguous,
    /// else a copy through `Kernel::Copy`.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 4.0, 1.0, DType::I32, &Device::cpu())?.reshape(&[2, 2])?;
    /// let y = x.t()?.contiguous()?;
    /// assert!(y.is_contiguous() && !y.shares_storage(&x));
    /// assert_eq!(y.to_vec::<i32>()?, vec![0, 2, 1, 3]);
    /// assert!(x.contiguous()?.shares_storage(&x));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn contiguous(&self) -> Result<Tensor> {
        self.contiguous_at(caller())
    }

    /// Copy `src`'s elements into this tensor's view (same shape, dtype and device). Every
    /// tensor sharing the storage sees the new values. It counts as an in-place write (the
    /// storage's [`crate::tensor::Storage::version`]): a backward through an op that saved
    /// this storage before is refused with [`cartage_core::Error::ModifiedInPlace`].
    ///
    /// Overlapping views have snapshot semantics: when `src` and `self` share memory (say
    /// `x.t().copy_from(&x)`, or two overlapping `narrow`s), the result is as if `src` had been
    /// read entirely before anything was written; cartage copies `src` to a temporary first.
    /// Copying a view onto itself does nothing.
    ///
    /// ```
    /// use cartage::prelude::*;
    /// # fn main() -> cartage::Result<()> {
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::cpu())?;
    /// x.copy_from(&x.t()?)?; // in place transpose
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 3.0, 2.0, 4.0]);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        check::same_device_and_dtype("copy_from", self, src)?;
        if graph::tracking(&[self, src]) {
            return Err(Error::Autograd {
                op: "copy_from",
                reason: "an in-place write cannot be recorded, and a variable (or a value computed \
                         from one) takes part in it. Build the value with ops (`cat`, `where_cond`, \
                         `scatter`), or write under `cartage::no_grad()` if no gradient must flow"
                    .into(),
            });
        }
        if self.shape() != src.shape() {
            return Err(Error::ShapeMismatch {
                op: "copy_from",
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
                reason: "the source must have the destination's shape; broadcast it first with `broadcast_to`".into(),
            });
        }
        if self.layout.is_broadcast() {
            return Err(Error::invalid(
                "copy_from",
                "the destination is a broadcast view (several elements share one memory location)",
            ));
        }
        if self.numel() == 0 {
            return Ok(());
        }
        if self.shares_storage(src) && self.spans_intersect(src) {
            if self.layout == src.layout {
                return Ok(());
            }
            let snapshot = src.copy_at(caller())?;
            tracing::trace!(
                bytes = snapshot.size_in_bytes(),
                "copy_from between overlapping views: snapshot"
            );
            return self.copy_from(&snapshot);
        }
        let kernel = Kernel::Copy {
            input: src.as_arg(),
            out: self.as_arg(),
        };
        self.launch(&kernel, &[src], self.numel())?;
        self.storage.bump_version("copy_from", caller());
        Ok(())
    }

    /// True when the element ranges the two views (of one storage and dtype) can touch meet.
    fn spans_intersect(&self, other: &Tensor) -> bool {
        let span = |t: &Tensor| (t.layout.offset(), t.layout.extent());
        let ((a0, a1), (b0, b1)) = (span(self), span(other));
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }

    /// A fresh contiguous copy, even when `self` is already contiguous.
    fn copy_at(&self, site: Site) -> Result<Tensor> {
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Copy {
            input: self.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        out.storage.set_known_range(self.known_index_range());
        Ok(graph::record(out, "copy", &[self], |_| {
            formulas::elementwise::identity()
        }))
    }

    /// Start copying `src`'s first [`Tensor::size_in_bytes`] bytes into this contiguous tensor;
    /// `src` (a [`cartage_core::PinnedBuffer`], [`cartage_core::PageableBuffer`] or
    /// [`cartage_core::StagingBuffer`]) stays borrowed until the returned handle completes.
    /// Memory pinned for another device is refused. The copy is asynchronous: wait on the
    /// `#[must_use]` [`CopyHandle`] before reading the tensor.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let cpu = Device::cpu();
    /// let mut staging = cartage::alloc_staging(&cpu, 8)?;
    /// staging.as_mut_slice_of::<f32>()?.copy_from_slice(&[1.0, 2.0]);
    /// let x = Tensor::empty(&[2], DType::F32, &cpu)?;
    /// x.copy_from_pinned_async(&staging)?.wait()?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn copy_from_pinned_async<'a, S: HostStaging>(&self, src: &'a S) -> Result<CopyHandle<'a>> {
        self.pinned_target("copy_from_pinned_async", src.len())?;
        let handle = self
            .storage
            .device_buffer()
            .write_async(self.byte_offset(), src, self.size_in_bytes())?;
        self.storage.bump_version("copy_from_pinned_async", caller());
        if self.dtype == DType::Bool {
            // Raw bytes may hold any value: queued after the copy (each device runs its work in
            // order), this makes every nonzero byte a 1, the one form of `true` kernels expect.
            self.normalize_bool()?;
        }
        Ok(handle)
    }

    /// Rewrite this bool tensor's bytes as 0 or 1 (any nonzero byte is `true`): for bytes that
    /// entered from raw host memory.
    pub(crate) fn normalize_bool(&self) -> Result<()> {
        debug_assert_eq!(self.dtype, DType::Bool);
        if self.numel() == 0 {
            return Ok(());
        }
        let zero = Tensor::zeros(&[], DType::Bool, &self.device)?;
        self.copy_from(&self.ne(&zero)?)
    }

    /// Start copying this contiguous tensor into the first [`Tensor::size_in_bytes`] bytes of
    /// `dst`; `dst` cannot be read until the returned `#[must_use]` [`CopyHandle`] completes
    /// (the borrow checker enforces it). Memory pinned for another device is refused.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::new([1.0f32, 2.0], &cpu)?;
    /// let mut staging = cartage::alloc_staging(&cpu, x.size_in_bytes())?;
    /// x.copy_to_pinned_async(&mut staging)?.wait()?;
    /// assert_eq!(staging.as_slice_of::<f32>()?, &[1.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn copy_to_pinned_async<'a, S: HostStaging>(&self, dst: &'a mut S) -> Result<CopyHandle<'a>> {
        self.pinned_target("copy_to_pinned_async", dst.len())?;
        self.storage
            .device_buffer()
            .read_async(self.byte_offset(), dst, self.size_in_bytes())
    }

    fn pinned_target(&self, op: &'static str, pinned_len: usize) -> Result<()> {
        if !self.is_contiguous() {
            return Err(Error::invalid(
                op,
                "the tensor is a strided view; copy into or from a contiguous tensor (`contiguous()`)",
            ));
        }
        if pinned_len < self.size_in_bytes() {
            return Err(Error::invalid(
                op,
                format!(
                    "the host buffer holds {pinned_len} bytes but the tensor needs {}",
                    self.size_in_bytes()
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn contiguous_at(&self, site: Site) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy_at(site)
    }

    fn cast_at(&self, dtype: DType, site: Site) -> Result<Tensor> {
        let out = self.alloc_like(self.shape(), dtype, site)?;
        let kernel = Kernel::Cast {
            input: self.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, &[self], out.numel())?;
        // An integer cast keeps values that fit the new dtype (`as` wraps the others).
        let fits = |r: &cartage_core::IndexRange| {
            dtype == DType::I64 || (dtype == DType::I32 && i32::try_from(r.min).is_ok() && i32::try_from(r.max).is_ok())
        };
        out.storage.set_known_range(self.known_index_range().filter(fits));
        if !dtype.is_float() {
            return Ok(graph::record_constant(out, "to_dtype", &[self]));
        }
        Ok(graph::record(out, "to_dtype", &[self], |_| {
            formulas::elementwise::convert(self.device, self.dtype)
        }))
    }

    /// Copy to another device: peer copy when the backends can, else pinned staging.
    fn move_to(&self, device: &Device, site: Site) -> Result<Tensor> {
        let destination = runtime::backend(device)?;
        let src = if self.is_contiguous() {
            self.clone()
        } else {
            let copy = self.contiguous_at(site)?;
            runtime::record_implicit_copy("move of a strided view", copy.size_in_bytes(), site);
            copy
        };
        let out = Tensor::alloc_on(&destination, self.shape(), self.dtype, site)?;
        let out = graph::record(out, "to", &[self], |_| {
            formulas::elementwise::convert(self.device, self.dtype)
        });
        let bytes = out.size_in_bytes();
        if bytes == 0 {
            return Ok(out);
        }
        crate::graph::hold([&src, &out]);
        let (from, to) = (src.storage.device_buffer(), out.storage.device_buffer());
        if !from.copy_to_peer(src.byte_offset(), to, 0, bytes)? {
            stage_through_host(from, src.byte_offset(), to, bytes)?;
        }
        out.storage.set_known_range(self.known_index_range());
        tracing::trace!(from = %self.device, to = %device, bytes, %site, "moved");
        Ok(out)
    }
}

/// Copy `len` bytes of `from` (from byte `offset`) to the front of `to`, another device's
/// buffer, through host staging memory, chunk by chunk. The staging memory comes from the GPU
/// side (pinned where its driver can lock memory), whose copy is asynchronous; the other side
/// copies synchronously from or into it, which works with any host memory.
fn stage_through_host(from: &DeviceBuffer, offset: usize, to: &DeviceBuffer, len: usize) -> Result<()> {
    let chunk = len.min(STAGING_CHUNK);
    let source_stages = !from.device().is_cpu();
    let stager = if source_stages { from } else { to };
    let mut staging = stager.backend().alloc_staging(chunk)?;
    let mut done = 0;
    while done < len {
        let n = chunk.min(len - done);
        if source_stages {
            from.read_async(offset + done, &mut staging, n)?.wait()?;
            to.write(done, &staging.as_slice()[..n])?;
        } else {
            from.read(offset + done, &mut staging.as_mut_slice()[..n])?;
            to.write_async(done, &staging, n)?.wait()?;
        }
        done += n;
    }
    Ok(())
}
