//! Host reads: `to_vec`, `to_vec2`, `to_vec3`, `to_vec_f64` and `item`. Each is an explicit synchronisation point —
//! the host waits for the device — and is counted with its call site in `cartage::stats()`, so
//! a loop that reads back every step shows up (R5).
//!
//! `to_vec`, `to_vec2` and `to_vec3` read the device's bytes straight into the `Vec<T>` they
//! return ([`read_elements`]): the backend's one copy lands in the result, with no byte buffer in
//! between. The vector is zero-allocated (`calloc`: fresh pages, no memset) before the read.
//!
//! Host memory is asked for fallibly: a result larger than the host's available memory (a GPU
//! tensor bigger than the host's RAM), or one the allocator refuses, is an
//! [`Error::InvalidArgument`] naming the bytes, never an abort; so is a nested read whose row
//! headers alone would be huge (`[2^32, 0]`).

use std::any::Any;

use cartage_core::{DType, Element, Error, Result, Site};
use half::{bf16, f16};

use super::{Tensor, caller};
use crate::runtime;

impl Tensor {
    /// The elements in row-major order. `T` must be this tensor's element type
    /// ([`Error::DTypeMismatch`] otherwise: convert with `to_dtype` first, or use `to_vec_f64`).
    /// A host sync, counted in `cartage::stats()`; a strided view is made contiguous first.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0], [3.0, 4.0]], &Device::cpu())?;
    /// assert_eq!(x.t()?.to_vec::<f32>()?, vec![1.0, 3.0, 2.0, 4.0]);
    /// assert!(x.to_vec::<f64>().is_err()); // the dtype is f32
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let site = caller();
        self.expect_dtype::<T>("to_vec", site)?;
        runtime::record_host_sync(site);
        self.read_vec(site)
    }

    /// The rows of a rank-2 tensor ([`Error::InvalidArgument`] naming the shape for another
    /// rank; [`Error::DTypeMismatch`] unless `T` is the element type).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, &Device::cpu())?.reshape(&[2, 3])?;
    /// assert_eq!(x.to_vec2::<i64>()?, vec![vec![0, 1, 2], vec![3, 4, 5]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn to_vec2<T: Element>(&self) -> Result<Vec<Vec<T>>> {
        let site = caller();
        self.expect_rank("to_vec2", 2)?;
        self.expect_dtype::<T>("to_vec2", site)?;
        runtime::record_host_sync(site);
        let (count, len) = (self.shape()[0], self.shape()[1]);
        nested_fits(
            self,
            "to_vec2",
            count,
            count.saturating_mul(std::mem::size_of::<Vec<T>>()),
        )?;
        let flat = self.read_vec::<T>(site)?;
        Ok(rows(flat, len, count))
    }

    /// The nested rows of a rank-3 tensor (errors as for [`Tensor::to_vec2`]).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 4.0, 1.0, DType::I32, &Device::cpu())?.reshape(&[2, 1, 2])?;
    /// assert_eq!(x.to_vec3::<i32>()?, vec![vec![vec![0, 1]], vec![vec![2, 3]]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn to_vec3<T: Element>(&self) -> Result<Vec<Vec<Vec<T>>>> {
        let site = caller();
        self.expect_rank("to_vec3", 3)?;
        self.expect_dtype::<T>("to_vec3", site)?;
        runtime::record_host_sync(site);
        let (a, b, c) = (self.shape()[0], self.shape()[1], self.shape()[2]);
        let count = a.saturating_mul(b);
        let headers = count
            .saturating_mul(std::mem::size_of::<Vec<T>>())
            .saturating_add(a.saturating_mul(std::mem::size_of::<Vec<Vec<T>>>()));
        nested_fits(self, "to_vec3", count.saturating_add(a), headers)?;
        let flat = self.read_vec::<T>(site)?;
        let inner = rows(flat, c, count);
        let mut it = inner.into_iter();
        Ok((0..a).map(|_| it.by_ref().take(b).collect()).collect())
    }

    fn expect_rank(&self, op: &'static str, rank: usize) -> Result<()> {
        if self.rank() == rank {
            return Ok(());
        }
        Err(Error::invalid(
            op,
            format!(
                "the tensor has shape {:?} (rank {}); `{op}` needs rank {rank}: reshape it first or use `to_vec`",
                self.shape(),
                self.rank()
            ),
        ))
    }

    /// The elements in row-major order, widened to `f64` (any dtype; booleans are 0 or 1).
    /// A host sync, like [`Tensor::to_vec`].
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([3i32, -1], &Device::cpu())?;
    /// assert_eq!(x.to_vec_f64()?, vec![3.0, -1.0]);
    /// assert_eq!(Tensor::new([true, false], &Device::cpu())?.to_vec_f64()?, vec![1.0, 0.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let site = caller();
        runtime::record_host_sync(site);
        // The bytes, then the widened values beside them.
        host_fits(
            "to_vec_f64",
            self.size_in_bytes().saturating_add(self.numel().saturating_mul(8)),
        )?;
        let bytes = self.read_bytes(site)?;
        Ok(match self.dtype {
            DType::F32 => widen::<f32>(&bytes),
            DType::F64 => f64::from_le_bytes_slice(&bytes),
            DType::F16 => widen::<f16>(&bytes),
            DType::BF16 => widen::<bf16>(&bytes),
            DType::I32 => widen::<i32>(&bytes),
            DType::I64 => widen::<i64>(&bytes),
            DType::U8 => widen::<u8>(&bytes),
            DType::Bool => widen::<bool>(&bytes),
        })
    }

    /// The one element of a tensor with exactly one element ([`Error::NotAScalar`] otherwise);
    /// `T` must be the element type. A host sync: avoid it inside a hot loop.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([1.0f32, 2.0, 3.0], &Device::cpu())?;
    /// assert_eq!(x.sum_all()?.item::<f32>()?, 6.0);
    /// assert!(x.item::<f32>().is_err()); // three elements
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let site = caller();
        self.expect_dtype::<T>("item", site)?;
        if self.numel() != 1 {
            return Err(Error::NotAScalar {
                shape: self.shape().to_vec(),
                numel: self.numel(),
            });
        }
        runtime::record_host_sync(site);
        let size = self.dtype.size_in_bytes();
        let mut bytes = [0u8; 8];
        self.storage
            .device_buffer()
            .read(self.layout.offset() * size, &mut bytes[..size])?;
        T::from_le_bytes_slice(&bytes[..size])
            .first()
            .copied()
            .ok_or_else(|| Error::invalid("item", "the device returned no bytes"))
    }

    fn expect_dtype<T: Element>(&self, op: &'static str, site: Site) -> Result<()> {
        if T::DTYPE == self.dtype {
            return Ok(());
        }
        Err(Error::DTypeMismatch {
            op,
            lhs: self.dtype,
            lhs_site: self.origin,
            rhs: T::DTYPE,
            rhs_site: site,
        })
    }

    /// This tensor, or a contiguous copy of a strided view (made on the device: counted as an
    /// implicit copy).
    fn dense_for_read(&self, site: Site) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let copy = self.contiguous_at(site)?;
        runtime::record_implicit_copy("host read of a strided view", copy.size_in_bytes(), site);
        Ok(copy)
    }

    /// The viewed elements, row-major, read by the device straight into the returned vector.
    fn read_vec<T: Element>(&self, site: Site) -> Result<Vec<T>> {
        let dense = self.dense_for_read(site)?;
        let offset = dense.byte_offset();
        read_elements::<T>(dense.numel(), |dst| {
            if dst.is_empty() {
                return Ok(());
            }
            dense.storage.device_buffer().read(offset, dst)
        })
    }

    /// The viewed elements as little-endian bytes, row-major.
    fn read_bytes(&self, site: Site) -> Result<Vec<u8>> {
        let dense = self.dense_for_read(site)?;
        let mut bytes = zeroed::<u8>(dense.size_in_bytes())?;
        if !bytes.is_empty() {
            dense.storage.device_buffer().read(dense.byte_offset(), &mut bytes)?;
        }
        Ok(bytes)
    }
}

fn widen<T: Element>(bytes: &[u8]) -> Vec<f64> {
    T::from_le_bytes_slice(bytes).into_iter().map(Element::to_f64).collect()
}

/// `flat` cut into `count` rows of `len` elements (`count` empty rows when `len` is 0).
fn rows<T: Copy>(flat: Vec<T>, len: usize, count: usize) -> Vec<Vec<T>> {
    if len == 0 {
        return vec![Vec::new(); count];
    }
    flat.chunks(len).map(<[T]>::to_vec).collect()
}

/// Row headers a nested read may always build, whatever its elements weigh: 1 GiB.
const NESTED_HEADER_FLOOR: usize = 1 << 30;

/// Refuse a nested read (`to_vec2`, `to_vec3`) whose `vecs` row vectors need `header_bytes` of
/// host memory for their headers alone, before anything is allocated. The headers may weigh as
/// much as the elements, or [`NESTED_HEADER_FLOOR`]: an empty tensor such as `[2^32, 0]` holds
/// nothing, yet its rows would be 2^32 empty vectors (96 GiB of headers), which would abort the
/// process on the host allocation. [`Error::InvalidArgument`] naming the shape, the row count and
/// the bytes otherwise ([`Error::SizeOverflow`] when the count does not even fit in `usize`).
fn nested_fits(t: &Tensor, op: &'static str, vecs: usize, header_bytes: usize) -> Result<()> {
    if vecs == usize::MAX || header_bytes == usize::MAX {
        return Err(Error::size_overflow(t.shape(), t.dtype));
    }
    let elements = t.numel().saturating_mul(t.dtype.size_in_bytes());
    if header_bytes <= elements.max(NESTED_HEADER_FLOOR) {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "the tensor has shape {:?} ({} elements), so its rows would be {vecs} vectors needing {} of host memory \
             for their headers alone (the elements take {}); refused rather than abort on the allocation. \
             Read it flat with `to_vec` (and index rows yourself), or narrow it first. Check how the shape was computed",
            t.shape(),
            t.numel(),
            cartage_core::format_bytes(header_bytes as u64),
            cartage_core::format_bytes(elements as u64),
        ),
    ))
}

/// Plain element types: every byte pattern of their size is a valid value, with no padding.
///
/// # Safety
/// Implement it only for such types.
unsafe trait Plain: Copy + Default + 'static {}
// SAFETY: primitive numbers: no padding, and every bit pattern is a value.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for f64 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for i64 {}
// SAFETY: as above.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}

/// Results from this size up are checked against the host's available memory first (smaller
/// ones are not worth reading `/proc/meminfo` for).
const CHECK_AVAILABLE_FROM: usize = 64 << 20;

/// Fail with [`Error::InvalidArgument`] when `bytes` of host memory are more than the host has
/// available (Linux's `MemAvailable`; elsewhere only the allocator refuses): zeroed pages are
/// committed only when the device writes them, so the allocation itself would pass and the
/// process would meet the OOM killer during the read instead.
fn host_fits(op: &'static str, bytes: usize) -> Result<()> {
    if bytes < CHECK_AVAILABLE_FROM {
        return Ok(());
    }
    match available_host_memory() {
        Some(available) if bytes as u64 > available => Err(Error::invalid(
            op,
            format!(
                "the result needs {} of host memory, but the host has {} available: read the tensor in parts \
                 (`narrow` it, and read each part), or reduce it on the device first",
                cartage_core::format_bytes(bytes as u64),
                cartage_core::format_bytes(available)
            ),
        )),
        _ => Ok(()),
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes; `None` where it cannot be read.
fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// `n` zeroed `P`s, zero-allocated (`calloc`: fresh pages, no memset), or an error naming the
/// bytes when the host cannot hold them (see [`host_fits`]) or the allocator refuses.
fn zeroed<P: Plain>(n: usize) -> Result<Vec<P>> {
    let refused = |bytes: String| {
        Error::invalid(
            "host read",
            format!(
                "{bytes} of host memory for the result could not be allocated: read the tensor in parts \
                 (`narrow` it, and read each part), or reduce it on the device first"
            ),
        )
    };
    let layout = std::alloc::Layout::array::<P>(n)
        .map_err(|_| refused(format!("{n} elements of {} bytes", std::mem::size_of::<P>())))?;
    if layout.size() == 0 {
        return Ok(vec![P::default(); n]);
    }
    host_fits("host read", layout.size())?;
    // SAFETY: `layout` has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(refused(cartage_core::format_bytes(layout.size() as u64)));
    }
    // SAFETY: `ptr` comes from the global allocator with `Layout::array::<P>(n)`, so the
    // alignment is `P`'s and the size is `n` elements: capacity `n`. Its bytes are zero, which
    // is a valid `P` (plain: every byte pattern is a value), so all `n` elements are
    // initialised. The `Vec` takes sole ownership of the allocation.
    Ok(unsafe { Vec::from_raw_parts(ptr.cast::<P>(), n, n) })
}

/// `n` zeroed `P`s (zero-allocated) whose bytes `fill` writes in place.
fn filled<P: Plain>(n: usize, fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Vec<P>> {
    let mut values = zeroed::<P>(n)?;
    let len = std::mem::size_of_val(values.as_slice());
    // SAFETY: `values` owns `n` initialised elements, `len` bytes starting at its pointer; `P`
    // is plain (every byte pattern is a valid value, and it has no padding), so viewing them as
    // bytes and letting `fill` write any bytes keeps every element valid. The byte view borrows
    // `values` mutably for the call only.
    let bytes = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), len) };
    fill(bytes)?;
    Ok(values)
}

/// `values` itself when `P` is `T` (always, for the element types cartage defines), else
/// `otherwise(values)` (an `Element` implemented outside cartage).
fn same_or<T: 'static, P: 'static>(values: Vec<P>, otherwise: impl FnOnce(Vec<P>) -> Vec<T>) -> Vec<T> {
    let mut slot = Some(values);
    if let Some(same) = (&mut slot as &mut dyn Any).downcast_mut::<Option<Vec<T>>>() {
        return same.take().unwrap_or_default();
    }
    otherwise(slot.unwrap_or_default())
}

/// Plain `values` as `Vec<T>` (see [`same_or`]), converted from their bytes when `T` is not `P`.
fn into_elements<T: Element, P: Plain>(values: Vec<P>) -> Vec<T> {
    same_or(values, |values| {
        let len = std::mem::size_of_val(values.as_slice());
        // SAFETY: as in `filled`: `P` is plain, so its `len` bytes are initialised.
        let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), len) };
        T::from_le_bytes_slice(bytes)
    })
}

/// `n` elements of `T` whose little-endian bytes `fill` writes directly into the returned
/// vector's memory (one copy, from the device into the result). Half-precision elements are
/// read as `u16` and booleans as bytes, then reinterpreted in place (a collect that reuses the
/// allocation); booleans are normalised to 0 or 1.
fn read_elements<T: Element>(n: usize, fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<Vec<T>> {
    Ok(match T::DTYPE {
        DType::F32 => into_elements::<T, _>(filled::<f32>(n, fill)?),
        DType::F64 => into_elements::<T, _>(filled::<f64>(n, fill)?),
        DType::I32 => into_elements::<T, _>(filled::<i32>(n, fill)?),
        DType::I64 => into_elements::<T, _>(filled::<i64>(n, fill)?),
        DType::U8 => into_elements::<T, _>(filled::<u8>(n, fill)?),
        DType::F16 => {
            let bits = filled::<u16>(n, fill)?;
            convert_in_place::<T, u16, f16>(bits, f16::from_bits)
        }
        DType::BF16 => {
            let bits = filled::<u16>(n, fill)?;
            convert_in_place::<T, u16, bf16>(bits, bf16::from_bits)
        }
        DType::Bool => {
            let bytes = filled::<u8>(n, fill)?;
            convert_in_place::<T, u8, bool>(bytes, |b| b != 0)
        }
    })
}

/// `values` mapped to `E` in their own allocation, as a `Vec<T>` (see [`same_or`]).
fn convert_in_place<T: Element, P: Plain, E: Element>(values: Vec<P>, f: impl Fn(P) -> E) -> Vec<T> {
    let converted: Vec<E> = values.into_iter().map(f).collect();
    same_or(converted, |values| T::from_le_bytes_slice(&E::to_le_bytes_vec(&values)))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// Read `bytes` through `read_elements`, checking that the backend's copy landed in the
    /// returned vector's own memory (so no second copy happened after it).
    fn read_once<T: Element>(bytes: &[u8]) -> Vec<T> {
        let n = bytes.len() / std::mem::size_of::<T>();
        let landed = Cell::new(std::ptr::null::<u8>());
        let values = read_elements::<T>(n, |dst| {
            assert_eq!(dst.len(), bytes.len());
            dst.copy_from_slice(bytes);
            landed.set(dst.as_ptr());
            Ok(())
        })
        .unwrap();
        assert_eq!(values.len(), n);
        assert_eq!(
            values.as_ptr().cast::<u8>(),
            landed.get(),
            "{}: the read landed elsewhere and was copied again",
            T::DTYPE
        );
        values
    }

    #[test]
    fn reads_land_in_the_returned_vector() {
        let f: Vec<f32> = vec![1.5, -2.0, 3.25];
        let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_once::<f32>(&bytes), f);
        let d: Vec<f64> = vec![0.5, 1e300];
        let bytes: Vec<u8> = d.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_once::<f64>(&bytes), d);
        let i: Vec<i32> = vec![-7, 1 << 30];
        let bytes: Vec<u8> = i.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_once::<i32>(&bytes), i);
        let l: Vec<i64> = vec![i64::MIN, 42];
        let bytes: Vec<u8> = l.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_once::<i64>(&bytes), l);
        assert_eq!(read_once::<u8>(&[0, 255, 9]), vec![0, 255, 9]);
        let h = [f16::from_f32(1.5), f16::from_f32(-0.25)];
        let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_once::<f16>(&bytes), h);
        let b = [bf16::from_f32(3.0), bf16::from_f32(-8.0)];
        let bytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_once::<bf16>(&bytes), b);
    }

    #[test]
    fn booleans_are_normalised_in_place() {
        assert_eq!(read_once::<bool>(&[0, 1, 2, 255]), vec![false, true, true, true]);
    }

    #[test]
    fn a_failed_read_is_returned() {
        let err = read_elements::<f32>(4, |_| Err(Error::invalid("read", "device lost"))).unwrap_err();
        assert!(err.to_string().contains("device lost"), "{err}");
    }

    /// More host memory than exists is an error naming the bytes, not an abort in the allocator
    /// (`vec![0; n]` aborted for 2^60 floats).
    #[test]
    fn a_result_larger_than_host_memory_is_an_error() {
        for n in [1usize << 60, usize::MAX / 4, usize::MAX] {
            let err = read_elements::<f32>(n, |_| panic!("no read without memory")).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
            assert!(err.to_string().contains("host memory"), "{err}");
        }
        if let Some(available) = available_host_memory() {
            let bytes = usize::try_from(available).unwrap_or(usize::MAX).saturating_add(1 << 30);
            let err = host_fits("to_vec", bytes).unwrap_err();
            assert!(err.to_string().contains("available"), "{err}");
        }
        assert!(host_fits("to_vec", 1 << 20).is_ok());
    }

    #[test]
    fn empty_reads_give_empty_vectors() {
        assert!(read_once::<f32>(&[]).is_empty());
        assert!(read_once::<bool>(&[]).is_empty());
    }
}
