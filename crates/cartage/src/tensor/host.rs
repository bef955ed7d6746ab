//! Host reads: `to_vec`, `to_vec2`, `to_vec3`, `to_vec_f64` and `item`. Each is an explicit synchronisation point —
//! the host waits for the device — and is counted with its call site in `cartage::stats()`, so
//! a loop that reads back every step shows up (R5).

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
        Ok(T::from_le_bytes_slice(&self.read_bytes(site)?))
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
        nested_fits::<T>(self, count)?;
        let flat = T::from_le_bytes_slice(&self.read_bytes(site)?);
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
        nested_fits::<T>(self, count)?;
        let flat = T::from_le_bytes_slice(&self.read_bytes(site)?);
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

    /// The viewed elements as little-endian bytes, row-major (a strided view is made contiguous
    /// on the device first: counted as an implicit copy).
    fn read_bytes(&self, site: Site) -> Result<Vec<u8>> {
        let contiguous = if self.is_contiguous() {
            self.clone()
        } else {
            let copy = self.contiguous_at(site)?;
            runtime::record_implicit_copy("host read of a strided view", copy.size_in_bytes(), site);
            copy
        };
        let mut bytes = vec![0u8; contiguous.size_in_bytes()];
        if !bytes.is_empty() {
            contiguous
                .storage
                .device_buffer()
                .read(contiguous.byte_offset(), &mut bytes)?;
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

/// Fail with [`Error::SizeOverflow`] when `count` empty rows (of an empty tensor such as
/// `[huge, 0]`) would not fit in host memory's address space.
fn nested_fits<T>(t: &Tensor, count: usize) -> Result<()> {
    let fits = count
        .checked_mul(std::mem::size_of::<Vec<T>>())
        .is_some_and(|bytes| bytes <= isize::MAX as usize / 2);
    if fits {
        Ok(())
    } else {
        Err(Error::SizeOverflow {
            shape: t.shape().to_vec(),
            dtype: t.dtype,
        })
    }
}
