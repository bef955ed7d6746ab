//! Capacity first (LESSONS R2, R19): the bytes a tensor or a training job needs, computed before
//! anything is allocated, and whether that fits the memory a device has free.
//!
//! A tensor takes numel × dtype size bytes (f32 4, f16/bf16 2, i64 8, i32 4, bool 1). Training
//! holds parameters, gradients and the optimizer's state: plain SGD keeps nothing more, SGD with
//! momentum one buffer per parameter, Adam two (first and second moments) — so Adam needs 4× the
//! parameters' bytes before any activation, and activations usually dominate: they grow with batch
//! size and sequence length. Add them with [`TrainingEstimate::with_activations`].
//!
//! ```
//! use cartage::memory::{Optimizer, TrainingEstimate, tensor_bytes};
//! use cartage::DType;
//! assert_eq!(tensor_bytes(&[1024, 1024], DType::F16).unwrap(), 2 << 20);
//! let adam = TrainingEstimate::new(7_000_000_000, DType::F32, Optimizer::Adam);
//! assert_eq!(adam.total_bytes(), 4 * 4 * 7_000_000_000); // 112 GB before activations
//! ```

use std::fmt;

use cartage_core::{DType, Device, Error, Result, checked_bytes, format_bytes};

use crate::runtime;

/// Bytes of a tensor of `shape` and `dtype`: numel × dtype size, checked for overflow.
pub fn tensor_bytes(shape: &[usize], dtype: DType) -> Result<usize> {
    checked_bytes(shape, dtype)
}

/// The optimizer whose state the estimate counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Optimizer {
    /// Plain stochastic gradient descent: no state.
    Sgd,
    /// SGD with momentum: one velocity buffer per parameter.
    SgdMomentum,
    /// Adam / AdamW: first and second moments, two buffers per parameter.
    Adam,
}

impl Optimizer {
    /// Buffers of parameter size the optimizer keeps.
    pub const fn state_buffers(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum => 1,
            Optimizer::Adam => 2,
        }
    }

    /// `sgd`, `sgd-momentum` or `adam`.
    pub const fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adam => "adam",
        }
    }
}

/// The memory a training job holds: parameters + gradients + optimizer state (+ activations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainingEstimate {
    /// Number of parameters (elements, not bytes).
    pub params: u64,
    /// Their dtype (gradients and optimizer state are counted in the same dtype).
    pub dtype: DType,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Activation bytes to add (0 unless given: they depend on batch and sequence length).
    pub activation_bytes: u64,
}

impl TrainingEstimate {
    /// An estimate for `params` parameters of `dtype` trained with `optimizer`.
    pub fn new(params: u64, dtype: DType, optimizer: Optimizer) -> Self {
        TrainingEstimate {
            params,
            dtype,
            optimizer,
            activation_bytes: 0,
        }
    }

    /// An estimate for parameters of the given shapes (one per weight or bias).
    pub fn for_shapes(shapes: &[&[usize]], dtype: DType, optimizer: Optimizer) -> Result<Self> {
        let mut params = 0u64;
        for shape in shapes {
            let numel = cartage_core::checked_numel(shape).ok_or_else(|| Error::SizeOverflow {
                shape: shape.to_vec(),
                dtype,
            })?;
            params = params.saturating_add(numel as u64);
        }
        Ok(TrainingEstimate::new(params, dtype, optimizer))
    }

    /// The same estimate with `bytes` of activations added.
    pub fn with_activations(self, bytes: u64) -> Self {
        TrainingEstimate {
            activation_bytes: bytes,
            ..self
        }
    }

    /// Bytes of the parameters.
    pub fn parameter_bytes(&self) -> u64 {
        self.params.saturating_mul(self.dtype.size_in_bytes() as u64)
    }

    /// Bytes of the gradients (one per parameter).
    pub fn gradient_bytes(&self) -> u64 {
        self.parameter_bytes()
    }

    /// Bytes of the optimizer's state.
    pub fn optimizer_bytes(&self) -> u64 {
        self.parameter_bytes().saturating_mul(self.optimizer.state_buffers())
    }

    /// Everything: parameters + gradients + optimizer state + activations.
    pub fn total_bytes(&self) -> u64 {
        self.parameter_bytes()
            .saturating_add(self.gradient_bytes())
            .saturating_add(self.optimizer_bytes())
            .saturating_add(self.activation_bytes)
    }

    /// Compare with the memory `device` can still give: the device's free memory (from its
    /// backend's memory information) plus what cartage's cache already holds free, capped by an
    /// allocator limit if one is set. A device that cannot report free memory (wgpu) and has no
    /// limit is an [`Error::InvalidArgument`] saying so.
    pub fn check(&self, device: &Device) -> Result<FitReport> {
        let backend = runtime::backend(device)?;
        let stats = backend.memory_stats();
        let cached_free = (stats.reserved_bytes - stats.allocated_bytes) as u64;
        let info = backend.allocator().source().memory_info();
        let mut available = info.map(|i| i.free.saturating_add(cached_free));
        if let Some(limit) = backend.allocator().limit() {
            let under_limit = (limit.saturating_sub(stats.reserved_bytes) as u64).saturating_add(cached_free);
            available = Some(available.map_or(under_limit, |a| a.min(under_limit)));
        }
        let available = available.ok_or_else(|| {
            Error::invalid(
                "fits",
                format!(
                    "{device} cannot report its free memory (wgpu has no API for it); check against a budget \
                     instead: `cartage::backend(&device)?.allocator().set_limit(Some(bytes))`"
                ),
            )
        })?;
        Ok(FitReport {
            device: *device,
            needed: self.total_bytes(),
            available,
            total: info.map(|i| i.total),
        })
    }

    /// True when the estimate fits the memory `device` can still give (see [`TrainingEstimate::check`]).
    pub fn fits(&self, device: &Device) -> Result<bool> {
        Ok(self.check(device)?.fits())
    }
}

impl fmt::Display for TrainingEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = format_bytes;
        write!(
            f,
            "{} parameters of {} with {}: parameters {} + gradients {} + optimizer state {}",
            self.params,
            self.dtype,
            self.optimizer.name(),
            b(self.parameter_bytes()),
            b(self.gradient_bytes()),
            b(self.optimizer_bytes()),
        )?;
        if self.activation_bytes > 0 {
            write!(f, " + activations {}", b(self.activation_bytes))?;
        }
        write!(f, " = {}", b(self.total_bytes()))
    }
}

/// The outcome of [`TrainingEstimate::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitReport {
    /// The device compared against.
    pub device: Device,
    /// Bytes the job needs.
    pub needed: u64,
    /// Bytes the device can still give (its free memory plus cartage's cached free blocks).
    pub available: u64,
    /// The device's capacity, where known.
    pub total: Option<u64>,
}

impl FitReport {
    /// True when the job fits.
    pub fn fits(&self) -> bool {
        self.needed <= self.available
    }
}

impl fmt::Display for FitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.fits() { "fits" } else { "does NOT fit" };
        write!(
            f,
            "needs {} on {}, which can give {}",
            format_bytes(self.needed),
            self.device,
            format_bytes(self.available)
        )?;
        if let Some(total) = self.total {
            write!(f, " of {} in total", format_bytes(total))?;
        }
        write!(f, ": {verdict}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r19_byte_counts() {
        assert_eq!(tensor_bytes(&[10, 10], DType::F32).unwrap(), 400);
        assert_eq!(tensor_bytes(&[10, 10], DType::BF16).unwrap(), 200);
        assert_eq!(tensor_bytes(&[3], DType::I64).unwrap(), 24);
        assert_eq!(tensor_bytes(&[7], DType::Bool).unwrap(), 7);
        assert_eq!(tensor_bytes(&[], DType::F64).unwrap(), 8);
        assert!(matches!(
            tensor_bytes(&[usize::MAX, 2], DType::F32),
            Err(Error::SizeOverflow { .. })
        ));
    }

    #[test]
    fn optimizers_multiply_the_parameters() {
        let p = 1_000_000;
        let bytes = |o| TrainingEstimate::new(p, DType::F32, o).total_bytes();
        assert_eq!(bytes(Optimizer::Sgd), 2 * 4 * p);
        assert_eq!(bytes(Optimizer::SgdMomentum), 3 * 4 * p);
        assert_eq!(bytes(Optimizer::Adam), 4 * 4 * p);
        let with_act = TrainingEstimate::new(p, DType::F16, Optimizer::Adam).with_activations(100);
        assert_eq!(with_act.total_bytes(), 4 * 2 * p + 100);
        let shapes =
            TrainingEstimate::for_shapes(&[&[784, 128], &[128], &[128, 10], &[10]], DType::F32, Optimizer::Sgd)
                .unwrap();
        assert_eq!(shapes.params, 784 * 128 + 128 + 128 * 10 + 10);
        let text = with_act.to_string();
        assert!(text.contains("adam") && text.contains("activations"), "{text}");
    }

    #[test]
    fn fit_report_verdict() {
        let r = FitReport {
            device: Device::cpu(),
            needed: 10,
            available: 9,
            total: Some(100),
        };
        assert!(!r.fits());
        assert!(r.to_string().contains("does NOT fit"), "{r}");
    }
}
