//! [`Device`]: where a tensor lives, as a plain value `(kind, ordinal)`.
//!
//! There is no "current device" anywhere in cartage: every device carries its ordinal, prints as
//! `cpu`, `cuda:0` or `wgpu:1`, and parsing a bare `cuda` or `wgpu` is an error that asks for one.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// The family of a device: which backend runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// The host processor.
    Cpu,
    /// An NVIDIA GPU through CUDA.
    Cuda,
    /// Any GPU (or a software rasteriser) through wgpu.
    Wgpu,
}

impl DeviceKind {
    /// The lower-case name used in device strings and feature flags (`cpu`, `cuda`, `wgpu`).
    pub const fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Wgpu => "wgpu",
        }
    }
}

/// A device value: kind plus ordinal. Pass it down from the one place that picks it.
///
/// ```
/// use cartage_core::Device;
/// let d: Device = "cuda:1".parse().unwrap();
/// assert_eq!(d, Device::cuda(1));
/// assert_eq!(d.to_string(), "cuda:1");
/// assert!("cuda".parse::<Device>().is_err()); // an ordinal is always required
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    kind: DeviceKind,
    ordinal: usize,
}

impl Device {
    /// The host processor.
    pub const fn cpu() -> Self {
        Device {
            kind: DeviceKind::Cpu,
            ordinal: 0,
        }
    }

    /// CUDA device number `ordinal`.
    pub const fn cuda(ordinal: usize) -> Self {
        Device {
            kind: DeviceKind::Cuda,
            ordinal,
        }
    }

    /// wgpu adapter number `ordinal` (in the order documented by the wgpu backend).
    pub const fn wgpu(ordinal: usize) -> Self {
        Device {
            kind: DeviceKind::Wgpu,
            ordinal,
        }
    }

    /// A device from its parts.
    pub const fn new(kind: DeviceKind, ordinal: usize) -> Self {
        Device { kind, ordinal }
    }

    /// The backend family.
    pub const fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// The ordinal (always 0 for the CPU).
    pub const fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// True for the host processor.
    pub const fn is_cpu(&self) -> bool {
        matches!(self.kind, DeviceKind::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => f.write_str("cpu"),
            kind => write!(f, "{}:{}", kind.name(), self.ordinal),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let text = s.trim();
        let invalid = |reason: String| Error::InvalidDevice {
            input: s.to_string(),
            reason,
        };
        let lower = text.to_ascii_lowercase();
        let (name, ordinal) = match lower.split_once(':') {
            Some((name, ordinal)) => (name, Some(ordinal)),
            None => (lower.as_str(), None),
        };
        let kind = match name {
            "cpu" => DeviceKind::Cpu,
            "cuda" => DeviceKind::Cuda,
            "wgpu" => DeviceKind::Wgpu,
            _ => {
                return Err(invalid(format!(
                    "unknown device kind `{name}`; expected `cpu`, `cuda:N` or `wgpu:N`"
                )));
            }
        };
        let Some(ordinal) = ordinal else {
            return match kind {
                DeviceKind::Cpu => Ok(Device::cpu()),
                _ => Err(invalid(format!(
                    "a bare `{name}` would mean \"whichever device is current\"; cartage has no \
                     current device, so name one with its ordinal, e.g. `{name}:0`"
                ))),
            };
        };
        let expected = match kind {
            DeviceKind::Cpu => "`cpu` (or `cpu:0`)".to_string(),
            _ => format!("`{name}:N` with N = 0, 1, …"),
        };
        let number = parse_ordinal(ordinal).map_err(|problem| invalid(format!("{problem}; expected {expected}")))?;
        match kind {
            DeviceKind::Cpu if number != 0 => Err(invalid(format!(
                "the CPU has ordinal 0 only, not {number}; write `cpu`"
            ))),
            _ => Ok(Device::new(kind, number)),
        }
    }
}

/// The ordinal after the colon: decimal digits only, fitting `usize`; else why not.
fn parse_ordinal(text: &str) -> Result<usize, String> {
    if text.is_empty() {
        return Err("the ordinal after `:` is missing".to_string());
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{text}` is not a device ordinal: it is not a number"));
    }
    text.parse::<usize>().map_err(|_| {
        format!(
            "`{text}` is not a device ordinal: it is not a number that fits in {} bits (at most {})",
            usize::BITS,
            usize::MAX
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for text in ["cpu", "cuda:0", "cuda:3", "wgpu:1"] {
            let d: Device = text.parse().unwrap();
            assert_eq!(d.to_string(), text);
        }
        assert_eq!(" CUDA:2 ".parse::<Device>().unwrap(), Device::cuda(2));
        assert_eq!("cpu:0".parse::<Device>().unwrap(), Device::cpu());
    }

    #[test]
    fn refuses_bare_gpu_kinds_with_a_hint() {
        for bare in ["cuda", "wgpu"] {
            let err = bare.parse::<Device>().unwrap_err().to_string();
            assert!(err.contains(&format!("{bare}:0")), "{err}");
            assert!(err.contains("ordinal"), "{err}");
        }
        let err = "tpu:0".parse::<Device>().unwrap_err().to_string();
        assert!(err.contains("unknown device kind"), "{err}");
        let err = "cuda:x".parse::<Device>().unwrap_err().to_string();
        assert!(err.contains("not a device ordinal"), "{err}");
        assert!("cpu:1".parse::<Device>().is_err());
    }

    #[test]
    fn ordinals_that_are_not_numbers_say_so() {
        for text in [
            "cpu:99999999999999999999",
            "cuda:99999999999999999999",
            "wgpu:-1",
            "cuda:+1",
            "cuda:1.0",
            "cpu:x",
            "cuda:0:1",
        ] {
            let err = text.parse::<Device>().unwrap_err().to_string();
            assert!(err.contains("not a number"), "{text}: {err}");
            assert!(!err.contains("other than 0"), "{text}: {err}");
        }
        let err = "cuda:".parse::<Device>().unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        let err = "cpu:3".parse::<Device>().unwrap_err().to_string();
        assert!(err.contains("ordinal 0 only, not 3"), "{err}");
        assert_eq!(
            format!("cuda:{}", usize::MAX).parse::<Device>().unwrap(),
            Device::cuda(usize::MAX)
        );
    }
}
