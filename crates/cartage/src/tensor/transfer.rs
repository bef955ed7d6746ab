//! Moves and casts: `to(&device)` (a new tensor; nothing ever moves implicitly), `to_dtype`,
//! `to_device_dtype` (cast and move in the order with the lower peak, R11), `contiguous`,
//! `copy_from` (into a view) and the asynchronous copies to and from pinned host memory.
//!
//! Between two devices data goes device-to-device when the backends can (`copy_to_peer`), else
//! through pinned host staging in chunks of at most [`STAGING_CHUNK`] bytes.

use std::sync::Arc;

use cartage_core::{Backend, BufferSlice, CopyHandle, DType, Device, Error, Kernel, Op, PinnedBuffer, Result, Site};

use super::{Tensor, caller, check};
use crate::runtime;

/// The largest pinned staging buffer a cross-device move holds at once.
pub const STAGING_CHUNK: usize = 32 << 20;

impl Tensor {
    /// This tensor on `device`, as a new tensor (the original is unchanged). On its own device
    /// it is a cheap clone whose origin becomes the caller's line.
    #[must_use = "`to` returns the moved tensor and leaves `self` where it was"]
    #[track_caller]
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        let site = caller();
        if *device == self.device {
            return Ok(self.moved_here(site));
        }
        self.move_to(device, site)
    }

    /// This tensor converted to `dtype` (Rust `as` semantics), on the same device.
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
    #[track_caller]
    pub fn contiguous(&self) -> Result<Tensor> {
        self.contiguous_at(caller())
    }

    /// Copy `src`'s elements into this tensor's view (same shape, dtype and device). Every
    /// tensor sharing the storage sees the new values.
    #[track_caller]
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        check::same_device_and_dtype("copy_from", self, src)?;
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
        let kernel = Kernel::Copy {
            input: src.as_arg(),
            out: self.as_arg(),
        };
        self.launch(&kernel, self.numel())
    }

    /// Start copying `src`'s first [`Tensor::size_in_bytes`] bytes into this contiguous tensor;
    /// `src` stays borrowed until the returned handle completes.
    pub fn copy_from_pinned_async<'a>(&self, src: &'a PinnedBuffer) -> Result<CopyHandle<'a>> {
        let dst = self.pinned_target("copy_from_pinned_async", src.len())?;
        self.backend().write_async(dst, src)
    }

    /// Start copying this contiguous tensor into the first [`Tensor::size_in_bytes`] bytes of
    /// `dst`; `dst` cannot be read until the returned handle completes.
    pub fn copy_to_pinned_async<'a>(&self, dst: &'a mut PinnedBuffer) -> Result<CopyHandle<'a>> {
        let src = self.pinned_target("copy_to_pinned_async", dst.len())?;
        self.backend().read_async(src, dst)
    }

    fn pinned_target(&self, op: &'static str, pinned_len: usize) -> Result<BufferSlice> {
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
                    "the pinned buffer holds {pinned_len} bytes but the tensor needs {}",
                    self.size_in_bytes()
                ),
            ));
        }
        self.contiguous_slice()
    }

    pub(super) fn contiguous_at(&self, site: Site) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = self.alloc_like(self.shape(), self.dtype, site)?;
        let kernel = Kernel::Copy {
            input: self.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, out.numel())?;
        Ok(out)
    }

    fn cast_at(&self, dtype: DType, site: Site) -> Result<Tensor> {
        let out = self.alloc_like(self.shape(), dtype, site)?;
        let kernel = Kernel::Cast {
            input: self.as_arg(),
            out: out.as_arg(),
        };
        out.launch(&kernel, out.numel())?;
        Ok(out)
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
        let bytes = out.size_in_bytes();
        if bytes == 0 {
            return Ok(out);
        }
        let (from, to) = (src.contiguous_slice()?, out.contiguous_slice()?);
        if !src.backend().copy_to_peer(from, destination.as_ref(), to)? {
            stage_through_host(src.backend(), from, &destination, to)?;
        }
        tracing::trace!(from = %self.device, to = %device, bytes, %site, "moved");
        Ok(out)
    }
}

/// Copy `from` (on `source`) to `to` (on `destination`) through pinned host memory, chunk by
/// chunk (the last chunk uses the front of the buffer). The pinned buffer comes from the GPU side so that both copies run at pinned speed.
fn stage_through_host(
    source: &Arc<dyn Backend>,
    from: BufferSlice,
    destination: &Arc<dyn Backend>,
    to: BufferSlice,
) -> Result<()> {
    let chunk = from.len.min(STAGING_CHUNK);
    let pinning = if source.device().is_cpu() { destination } else { source };
    let mut staging = pinning.alloc_pinned(chunk)?;
    let mut done = 0;
    while done < from.len {
        let n = chunk.min(from.len - done);
        source.read_async(from.slice(done, n)?, &mut staging)?.wait()?;
        destination.write_async(to.slice(done, n)?, &staging)?.wait()?;
        done += n;
    }
    Ok(())
}
