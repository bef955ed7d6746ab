//! What a device is and what it can run, asked of a [`Device`] value without touching its
//! backend: [`device_info`] and [`device_capabilities`], and the same as methods through the
//! [`DeviceExt`] extension trait (`device.info()?`, `device.capabilities()?`).
//!
//! `Device` is a plain value defined in `cartage-core`, which knows no backends; the registry
//! that opens them lives here, so these are free functions and an extension trait rather than
//! inherent methods. Each opens the device's backend on first use (as any op would) and fails
//! with the same typed error when the device is not available.

use cartage_core::{Capabilities, DType, Device, DeviceInfo, Op, Result};

use super::backend;

/// The name, total memory and backend details of `device`.
///
/// ```
/// use cartage::Device;
/// # fn main() -> cartage::Result<()> {
/// let info = cartage::runtime::device_info(&Device::cpu())?;
/// assert_eq!(info.device, Device::cpu());
/// assert!(!info.name.is_empty());
/// # Ok(())
/// # }
/// ```
pub fn device_info(device: &Device) -> Result<DeviceInfo> {
    Ok(backend(device)?.info())
}

/// What `device` can run: the (op, dtype) pairs, the largest buffer, f16 support, device
/// timing and overlapping copies. A copy of the backend's table.
///
/// ```
/// use cartage::{DType, Device, Op, UnaryOp};
/// # fn main() -> cartage::Result<()> {
/// let caps = cartage::runtime::device_capabilities(&Device::cpu())?;
/// assert!(caps.supports(Op::Unary(UnaryOp::Exp), DType::F32));
/// assert!(caps.max_buffer_bytes > 0);
/// # Ok(())
/// # }
/// ```
pub fn device_capabilities(device: &Device) -> Result<Capabilities> {
    Ok(backend(device)?.capabilities().clone())
}

/// Device queries as methods: `use cartage::runtime::DeviceExt;` then `device.info()?`.
///
/// ```
/// use cartage::runtime::DeviceExt;
/// use cartage::{DType, Device, Op};
/// # fn main() -> cartage::Result<()> {
/// let cpu = Device::cpu();
/// println!("{}", cpu.info()?);
/// assert!(cpu.supports(Op::Matmul, DType::F32)?);
/// assert!(!cpu.supports(Op::Matmul, DType::Bool)?); // not defined for bool anywhere
/// # Ok(())
/// # }
/// ```
pub trait DeviceExt {
    /// The name, total memory and backend details ([`device_info`]).
    fn info(&self) -> Result<DeviceInfo>;
    /// What the device can run ([`device_capabilities`]).
    fn capabilities(&self) -> Result<Capabilities>;
    /// True when `op` runs for `dtype` on this device (no copy of the table).
    fn supports(&self, op: Op, dtype: DType) -> Result<bool>;
}

impl DeviceExt for Device {
    fn info(&self) -> Result<DeviceInfo> {
        device_info(self)
    }

    fn capabilities(&self) -> Result<Capabilities> {
        device_capabilities(self)
    }

    fn supports(&self, op: Op, dtype: DType) -> Result<bool> {
        Ok(backend(self)?.capabilities().supports(op, dtype))
    }
}
