//! Constructors. Each takes the `&Device` to build on and builds there: `zeros`, `ones`, `full`,
//! `arange` and the random constructors launch a kernel on the device and never make a host copy
//! (R7); `from_slice`/`from_vec` copy host data once, straight into device memory.
//!
//! Random tensors draw element `i` from Philox at counter `i` under the given seed, so one seed
//! gives the same values on every backend.

use cartage_core::{DType, Device, Distribution, Element, Error, Kernel, Op, Result, Scalar, checked_numel};

use crate::Generator;

use super::{Tensor, caller, check};
use crate::runtime;

impl Tensor {
    /// A tensor of zeros.
    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, Scalar::Int(0), dtype, device, caller())
    }

    /// A tensor of ones.
    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, Scalar::Int(1), dtype, device, caller())
    }

    /// A tensor with every element `value` (converted to `dtype` with `as` semantics).
    #[track_caller]
    pub fn full(shape: &[usize], value: impl Into<Scalar>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, value.into(), dtype, device, caller())
    }

    /// A tensor whose contents are not meaningful yet, to be overwritten (by `copy_from` or an
    /// asynchronous copy). cartage never exposes uninitialised memory: it is filled with zeros.
    #[track_caller]
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, Scalar::Int(0), dtype, device, caller())
    }

    /// `start, start + step, …` below `end` (above it for a negative step), computed on the
    /// device in f64 and converted to `dtype`: `ceil((end − start) / step)` elements.
    #[track_caller]
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let site = caller();
        if !(start.is_finite() && end.is_finite() && step.is_finite()) || step == 0.0 {
            return Err(Error::invalid(
                "arange",
                format!("start {start}, end {end} and step {step} must be finite, with a non-zero step"),
            ));
        }
        let count = ((end - start) / step).ceil().max(0.0);
        if count >= usize::MAX as f64 {
            return Err(Error::SizeOverflow {
                shape: vec![usize::MAX],
                dtype,
            });
        }
        check::defined_for("arange", Op::Arange, dtype, "any dtype")?;
        let backend = runtime::backend(device)?;
        let out = Tensor::alloc_on(&backend, &[count as usize], dtype, site)?;
        let kernel = Kernel::Arange {
            out: out.as_arg(),
            start,
            step,
        };
        out.launch(&kernel, &[], out.numel())?;
        Ok(out)
    }

    /// Uniform random numbers in `[0, 1)` (float dtypes), reproducible from `seed`.
    #[track_caller]
    pub fn rand(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        let distribution = Distribution::Uniform { low: 0.0, high: 1.0 };
        Tensor::random(shape, dtype, distribution, (seed, 0), device, caller())
    }

    /// Uniform random numbers in `[low, high)` (float dtypes), reproducible from `seed`.
    #[track_caller]
    pub fn rand_uniform(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        seed: u64,
        device: &Device,
    ) -> Result<Tensor> {
        if !(low.is_finite() && high.is_finite() && low <= high) {
            return Err(Error::invalid(
                "rand_uniform",
                format!("bounds [{low}, {high}) must be finite with low <= high"),
            ));
        }
        Tensor::random(
            shape,
            dtype,
            Distribution::Uniform { low, high },
            (seed, 0),
            device,
            caller(),
        )
    }

    /// Standard normal random numbers (float dtypes), reproducible from `seed`.
    #[track_caller]
    pub fn randn(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        let distribution = Distribution::Normal { mean: 0.0, std: 1.0 };
        Tensor::random(shape, dtype, distribution, (seed, 0), device, caller())
    }

    /// Uniform random numbers in `[0, 1)` drawn from `rng`, which moves past them: the next draw
    /// gives new values. See [`crate::Generator`].
    #[track_caller]
    pub fn rand_with(shape: &[usize], dtype: DType, rng: &mut Generator, device: &Device) -> Result<Tensor> {
        let distribution = Distribution::Uniform { low: 0.0, high: 1.0 };
        let draw = rng.advance(checked_numel(shape).unwrap_or(0) as u64);
        Tensor::random(shape, dtype, distribution, draw, device, caller())
    }

    /// Standard normal random numbers drawn from `rng`, which moves past them.
    ///
    /// ```
    /// use cartage::{DType, Device, Generator, Tensor};
    /// let mut rng = Generator::new(0);
    /// let x = Tensor::randn_with(&[2, 3], DType::F32, &mut rng, &Device::cpu())?;
    /// assert_eq!(x.shape(), &[2, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn randn_with(shape: &[usize], dtype: DType, rng: &mut Generator, device: &Device) -> Result<Tensor> {
        let distribution = Distribution::Normal { mean: 0.0, std: 1.0 };
        let draw = rng.advance(checked_numel(shape).unwrap_or(0) as u64);
        Tensor::random(shape, dtype, distribution, draw, device, caller())
    }

    /// A tensor holding a copy of `data` (row-major) with `shape`, on `device`.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let site = caller();
        let numel = checked_numel(shape).ok_or_else(|| Error::SizeOverflow {
            shape: shape.to_vec(),
            dtype: T::DTYPE,
        })?;
        if numel != data.len() {
            return Err(Error::DataLength {
                op: "from_slice",
                shape: shape.to_vec(),
                numel,
                len: data.len(),
            });
        }
        let backend = runtime::backend(device)?;
        let out = Tensor::alloc_on(&backend, shape, T::DTYPE, site)?;
        if numel > 0 {
            let bytes = T::to_le_bytes_vec(data);
            out.storage.device_buffer().write(out.byte_offset(), &bytes)?;
        }
        Ok(out)
    }

    /// A tensor holding `data` (row-major) with `shape`, on `device`.
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    fn fill_new(
        shape: &[usize],
        value: Scalar,
        dtype: DType,
        device: &Device,
        site: cartage_core::Site,
    ) -> Result<Tensor> {
        let backend = runtime::backend(device)?;
        let out = Tensor::alloc_on(&backend, shape, dtype, site)?;
        let kernel = Kernel::Fill {
            out: out.as_arg(),
            value,
        };
        out.launch(&kernel, &[], out.numel())?;
        Ok(out)
    }

    fn random(
        shape: &[usize],
        dtype: DType,
        distribution: Distribution,
        (seed, offset): (u64, u64),
        device: &Device,
        site: cartage_core::Site,
    ) -> Result<Tensor> {
        check::float(
            if matches!(distribution, Distribution::Normal { .. }) {
                "randn"
            } else {
                "rand"
            },
            dtype,
        )?;
        let backend = runtime::backend(device)?;
        let out = Tensor::alloc_on(&backend, shape, dtype, site)?;
        let kernel = Kernel::Random {
            out: out.as_arg(),
            distribution,
            seed,
            offset,
        };
        out.launch(&kernel, &[], out.numel())?;
        Ok(out)
    }

    /// A one-element tensor (shape `[]`) of `value` on this tensor's device and dtype.
    pub(super) fn scalar_like(&self, value: Scalar, site: cartage_core::Site) -> Result<Tensor> {
        let out = self.alloc_like(&[], self.dtype, site)?;
        let kernel = Kernel::Fill {
            out: out.as_arg(),
            value,
        };
        out.launch(&kernel, &[], 1)?;
        Ok(out)
    }
}
