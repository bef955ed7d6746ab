//! Constructors. Each takes the `&Device` to build on and builds there: `zeros`, `ones`, `full`,
//! `arange` and the random constructors launch a kernel on the device and never make a host copy
//! (R7); `from_slice`/`from_vec` copy host data once, straight into device memory.
//!
//! Random tensors draw element `i` from Philox at counter `i` under the given seed, so one seed
//! gives the same values on every backend.
//!
//! [`Tensor::new`] builds from nested arrays of any [`Element`] (up to rank 3): the shape comes
//! from the array type ([`NestedArray`]).

use cartage_core::{
    DType, Device, Distribution, Element, Error, IndexRange, Kernel, Op, Result, Scalar, Site, checked_numel,
};
use half::{bf16, f16};

use crate::Generator;

use super::{Tensor, caller, check};
use crate::runtime;

impl Tensor {
    /// A tensor of zeros, filled on the device.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// assert_eq!((x.shape(), x.dtype()), (&[2usize, 3][..], DType::F32));
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0; 6]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, Scalar::Int(0), dtype, device, caller())
    }

    /// A tensor of ones, filled on the device.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::ones(&[2], DType::I32, &Device::cpu())?;
    /// assert_eq!(x.to_vec::<i32>()?, vec![1, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, Scalar::Int(1), dtype, device, caller())
    }

    /// A tensor with every element `value` (converted to `dtype` with `as` semantics).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::full(&[3], 2.7, DType::I64, &Device::cpu())?;
    /// assert_eq!(x.to_vec::<i64>()?, vec![2, 2, 2]); // 2.7 as i64
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn full(shape: &[usize], value: impl Into<Scalar>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, value.into(), dtype, device, caller())
    }

    /// A tensor whose contents are not meaningful yet, to be overwritten (by `copy_from` or an
    /// asynchronous copy). cartage never exposes uninitialised memory: it is filled with zeros.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let cpu = Device::cpu();
    /// let x = Tensor::empty(&[2], DType::F32, &cpu)?;
    /// x.copy_from(&Tensor::from_slice(&[1.0f32, 2.0], &[2], &cpu)?)?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 2.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::fill_new(shape, Scalar::Int(0), dtype, device, caller())
    }

    /// `start, start + step, …` below `end` (above it for a negative step), computed on the
    /// device in f64 and converted to `dtype`: `ceil((end − start) / step)` elements.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::arange(0.0, 5.0, 2.0, DType::I64, &Device::cpu())?;
    /// assert_eq!(x.to_vec::<i64>()?, vec![0, 2, 4]);
    /// let y = Tensor::arange(1.0, 0.0, -0.25, DType::F32, &Device::cpu())?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 0.75, 0.5, 0.25]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
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
        out.storage
            .set_known_range(arange_range(start, step, out.numel(), dtype));
        Ok(out)
    }

    /// Uniform random numbers in `[0, 1)` (float dtypes), reproducible from `seed`: the same
    /// seed gives the same values (on every backend).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::rand(&[100], DType::F32, 7, &Device::cpu())?;
    /// assert!(x.to_vec::<f32>()?.iter().all(|v| (0.0..1.0).contains(v)));
    /// let again = Tensor::rand(&[100], DType::F32, 7, &Device::cpu())?;
    /// assert_eq!(x.to_vec::<f32>()?, again.to_vec::<f32>()?);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn rand(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        let distribution = Distribution::Uniform { low: 0.0, high: 1.0 };
        Tensor::random(shape, dtype, distribution, (seed, 0), device, caller())
    }

    /// Uniform random numbers in `[low, high)` (float dtypes), reproducible from `seed`.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::rand_uniform(&[100], -2.0, 2.0, DType::F64, 0, &Device::cpu())?;
    /// assert!(x.to_vec::<f64>()?.iter().all(|v| (-2.0..2.0).contains(v)));
    /// # Ok::<(), cartage::Error>(())
    /// ```
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
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::randn(&[1000], DType::F32, 0, &Device::cpu())?;
    /// let mean = x.mean_all()?.item::<f32>()?;
    /// assert!(mean.abs() < 0.2, "{mean}");
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn randn(shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        let distribution = Distribution::Normal { mean: 0.0, std: 1.0 };
        Tensor::random(shape, dtype, distribution, (seed, 0), device, caller())
    }

    /// Uniform random numbers in `[0, 1)` drawn from `rng`, which moves past them: the next draw
    /// gives new values. See [`crate::Generator`].
    ///
    /// ```
    /// use cartage::{DType, Device, Generator, Tensor};
    /// let mut rng = Generator::new(0);
    /// let a = Tensor::rand_with(&[4], DType::F32, &mut rng, &Device::cpu())?;
    /// let b = Tensor::rand_with(&[4], DType::F32, &mut rng, &Device::cpu())?;
    /// assert_ne!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    /// # Ok::<(), cartage::Error>(())
    /// ```
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

    /// `steps` values evenly spaced from `start` to `end`, both included exactly (the last
    /// element is written as `end` itself). Computed on the device in f64 and converted to
    /// `dtype`; `steps = 1` gives `[start]`, `steps = 0` an empty tensor.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::linspace(0.0, 1.0, 5, DType::F32, &Device::cpu())?;
    /// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn linspace(start: f64, end: f64, steps: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let site = caller();
        if !(start.is_finite() && end.is_finite()) {
            return Err(Error::invalid(
                "linspace",
                format!("start {start} and end {end} must be finite"),
            ));
        }
        check::defined_for("linspace", Op::Arange, dtype, "any dtype")?;
        let backend = runtime::backend(device)?;
        let out = Tensor::alloc_on(&backend, &[steps], dtype, site)?;
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        let kernel = Kernel::Arange {
            out: out.as_arg(),
            start,
            step,
        };
        out.launch(&kernel, &[], steps)?;
        if steps > 1 {
            let last = out.narrow(0, steps - 1, 1)?;
            let fill = Kernel::Fill {
                out: last.as_arg(),
                value: Scalar::Float(end),
            };
            last.launch(&fill, &[], 1)?;
        }
        Ok(out)
    }

    /// The `n × n` identity matrix, built on the device (an `arange` compared with itself).
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let i = Tensor::eye(2, DType::I64, &Device::cpu())?;
    /// assert_eq!(i.to_vec::<i64>()?, vec![1, 0, 0, 1]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let site = caller();
        // i32 where it holds n: half the bytes of i64, and cheaper to compare on every device.
        let index_dtype = if n <= i32::MAX as usize { DType::I32 } else { DType::I64 };
        let a = Tensor::arange(0.0, n as f64, 1.0, index_dtype, device)?;
        let diagonal = a.reshape(&[n, 1])?.eq(&a.reshape(&[1, n])?)?;
        let out = diagonal.to_dtype(dtype)?;
        Ok(Tensor { origin: site, ..out })
    }

    /// Zeros of this tensor's shape, dtype and device.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::ones(&[2, 3], DType::I32, &Device::cpu())?;
    /// let z = x.zeros_like()?;
    /// assert_eq!((z.shape(), z.dtype()), (&[2usize, 3][..], DType::I32));
    /// assert_eq!(z.to_vec::<i32>()?, vec![0; 6]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::fill_new(self.shape(), Scalar::Int(0), self.dtype, &self.device, caller())
    }

    /// Ones of this tensor's shape, dtype and device.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.ones_like()?.to_vec::<f32>()?, vec![1.0, 1.0]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::fill_new(self.shape(), Scalar::Int(1), self.dtype, &self.device, caller())
    }

    /// `value` (converted to this tensor's dtype) in this tensor's shape, dtype and device.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.full_like(2.5)?.to_vec::<f32>()?, vec![2.5, 2.5]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn full_like(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        Tensor::fill_new(self.shape(), value.into(), self.dtype, &self.device, caller())
    }

    /// Integers drawn uniformly from `[low, high)`, reproducible from `seed`, as `dtype` (any
    /// numeric dtype). Drawn on the device: uniform floats in `[0, high - low)`, floored by the
    /// cast to i64, shifted by `low`, cast to `dtype`. `high - low` may be at most 2^24 where the
    /// device has no f64 random numbers, else 2^52. A range with integers that `dtype` cannot
    /// hold (exactly, for a float dtype) is an [`Error::InvalidArgument`], as in PyTorch: `[-5,
    /// 300)` for u8 would otherwise wrap.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::randint(-3, 3, &[100], DType::I64, 0, &Device::cpu())?;
    /// assert!(x.to_vec::<i64>()?.iter().all(|v| (-3..3).contains(v)));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn randint(low: i64, high: i64, shape: &[usize], dtype: DType, seed: u64, device: &Device) -> Result<Tensor> {
        Tensor::randint_at(low, high, shape, dtype, (seed, 0), device, caller())
    }

    /// [`Tensor::randint`] drawn from `rng`, which moves past the draw.
    ///
    /// ```
    /// use cartage::{DType, Device, Generator, Tensor};
    /// let mut rng = Generator::new(3);
    /// let a = Tensor::randint_with(0, 1000, &[8], DType::I32, &mut rng, &Device::cpu())?;
    /// let b = Tensor::randint_with(0, 1000, &[8], DType::I32, &mut rng, &Device::cpu())?;
    /// assert_ne!(a.to_vec::<i32>()?, b.to_vec::<i32>()?);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn randint_with(
        low: i64,
        high: i64,
        shape: &[usize],
        dtype: DType,
        rng: &mut Generator,
        device: &Device,
    ) -> Result<Tensor> {
        let draw = rng.advance(checked_numel(shape).unwrap_or(0) as u64);
        Tensor::randint_at(low, high, shape, dtype, draw, device, caller())
    }

    fn randint_at(
        low: i64,
        high: i64,
        shape: &[usize],
        dtype: DType,
        draw: (u64, u64),
        device: &Device,
        site: Site,
    ) -> Result<Tensor> {
        if dtype == DType::Bool {
            return Err(Error::WrongDType {
                op: "randint",
                dtype,
                expected: "a numeric dtype",
            });
        }
        // PyTorch's `check_from_to_in_range`: every integer of the range must be a value of
        // `dtype` (exactly, for a float dtype), else the cast at the end would wrap or round.
        let (min, max) = match dtype {
            DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
            DType::U8 => (0, 255),
            DType::I64 => (i64::MIN, i64::MAX),
            DType::F64 => (-(1 << 53), 1 << 53),
            DType::F32 => (-(1 << 24), 1 << 24),
            DType::F16 => (-(1 << 11), 1 << 11),
            DType::BF16 | DType::Bool => (-(1 << 8), 1 << 8),
        };
        if low < min || high.saturating_sub(1) > max {
            return Err(Error::invalid(
                "randint",
                format!(
                    "the range [{low}, {high}) does not fit {dtype}, which holds the integers {min}..={max}{}: \
                     narrow the range or pick a wider dtype",
                    if dtype.is_float() { " exactly" } else { "" }
                ),
            ));
        }
        let backend = runtime::backend(device)?;
        let caps = backend.capabilities();
        let (float, limit) = if caps.supports(Op::RandomUniform, DType::F64) {
            (DType::F64, 1u64 << 52)
        } else {
            (DType::F32, 1u64 << 24)
        };
        let range = high.checked_sub(low).filter(|&r| r > 0 && r as u64 <= limit);
        let Some(range) = range else {
            return Err(Error::invalid(
                "randint",
                format!("the range [{low}, {high}) must be non-empty and span at most {limit} integers on {device}"),
            ));
        };
        let distribution = Distribution::Uniform {
            low: 0.0,
            high: range as f64,
        };
        let uniform = Tensor::random(shape, float, distribution, draw, device, site)?;
        // The draws are ≥ 0, so the cast (truncation) is the floor. Rounding can land a draw on
        // `range` itself: clamp to the last integer, then shift by `low`.
        let ints = uniform.to_dtype(DType::I64)?;
        let top = ints.scalar_like(Scalar::Int(range - 1), site)?;
        let bottom = ints.scalar_like(Scalar::Int(low), site)?;
        let shifted = ints.minimum(&top)?.add(&bottom)?;
        let out = shifted.to_dtype(dtype)?;
        Ok(Tensor { origin: site, ..out })
    }

    /// A tensor from a nested array of any [`Element`]: `[T; N]`, `[[T; N]; M]` or
    /// `[[[T; N]; M]; L]`, whose shape is taken from the type.
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::new([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &Device::cpu())?;
    /// assert_eq!(x.shape(), &[2, 3]);
    /// assert_eq!(x.to_vec2::<f32>()?, vec![vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0]]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn new<A: NestedArray>(data: A, device: &Device) -> Result<Tensor> {
        let mut values = Vec::with_capacity(A::SHAPE.iter().product());
        data.flatten_into(&mut values);
        Tensor::from_vec(values, A::SHAPE, device)
    }

    /// A tensor holding a copy of `data` (row-major) with `shape`, on `device`; the dtype
    /// comes from the element type. `data.len()` must equal the element count of `shape`.
    ///
    /// ```
    /// use cartage::{DType, Device, Tensor};
    /// let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &Device::cpu())?;
    /// assert_eq!((x.shape(), x.dtype()), (&[2usize, 2][..], DType::F32));
    /// assert!(Tensor::from_slice(&[1.0f32, 2.0], &[3], &Device::cpu()).is_err());
    /// # Ok::<(), cartage::Error>(())
    /// ```
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
            out.storage.set_known_range(index_range_of(T::DTYPE, &bytes));
        }
        Ok(out)
    }

    /// A tensor holding `data` (row-major) with `shape`, on `device` (as
    /// [`Tensor::from_slice`]).
    ///
    /// ```
    /// use cartage::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1u8, 2, 3], &[3], &Device::cpu())?;
    /// assert_eq!(x.to_vec::<u8>()?, vec![1, 2, 3]);
    /// # Ok::<(), cartage::Error>(())
    /// ```
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

/// A nested array [`Tensor::new`] accepts: `[T; N]`, `[[T; N]; M]` or `[[[T; N]; M]; L]` of any
/// [`Element`] `T`.
pub trait NestedArray {
    /// The element type.
    type Elem: Element;
    /// The shape, outermost first.
    const SHAPE: &'static [usize];
    /// Append the elements in row-major order.
    fn flatten_into(&self, out: &mut Vec<Self::Elem>);
}

macro_rules! nested_arrays {
    ($($t:ty),*) => {$(
        impl<const N: usize> NestedArray for [$t; N] {
            type Elem = $t;
            const SHAPE: &'static [usize] = &[N];
            fn flatten_into(&self, out: &mut Vec<$t>) {
                out.extend_from_slice(self);
            }
        }
        impl<const N: usize, const M: usize> NestedArray for [[$t; N]; M] {
            type Elem = $t;
            const SHAPE: &'static [usize] = &[M, N];
            fn flatten_into(&self, out: &mut Vec<$t>) {
                self.iter().for_each(|row| out.extend_from_slice(row));
            }
        }
        impl<const N: usize, const M: usize, const L: usize> NestedArray for [[[$t; N]; M]; L] {
            type Elem = $t;
            const SHAPE: &'static [usize] = &[L, M, N];
            fn flatten_into(&self, out: &mut Vec<$t>) {
                self.iter().flatten().for_each(|row| out.extend_from_slice(row));
            }
        }
    )*};
}
nested_arrays!(f32, f64, f16, bf16, i32, i64, u8, bool);

/// The range of little-endian i32 or i64 values in `bytes` (`None` for other dtypes or none).
pub(crate) fn index_range_of(dtype: DType, bytes: &[u8]) -> Option<IndexRange> {
    match dtype {
        DType::I64 => IndexRange::of(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])),
        ),
        DType::I32 => IndexRange::of(
            bytes
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        ),
        _ => None,
    }
}

/// The range of an integer `arange` of `count` values, where every value is exact: an integral
/// start and step, all values within ±2^53 (so `start + i·step` in f64 is the integer itself,
/// whether or not the device fuses the multiply-add) and within the dtype.
fn arange_range(start: f64, step: f64, count: usize, dtype: DType) -> Option<IndexRange> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    let (lo, hi) = match dtype {
        DType::I64 => (-EXACT, EXACT),
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
        _ => return None,
    };
    if count == 0 || start.fract() != 0.0 || step.fract() != 0.0 {
        return None;
    }
    let span = (count - 1) as f64 * step;
    let last = start + span;
    let (min, max) = if last < start { (last, start) } else { (start, last) };
    (span.abs() <= EXACT && min >= lo && max <= hi).then_some(IndexRange {
        min: min as i64,
        max: max as i64,
    })
}
