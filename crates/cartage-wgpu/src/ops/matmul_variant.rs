//! [`MatmulVariant`]: a matmul kernel named by text, for sweeps and for the
//! `CARTAGE_WGPU_MATMUL_VARIANT` override.
//!
//! `tiled:BMxBNxBK/TMxTN[:2]` is the tiled kernel with that large tiling (f32, f64, bf16, and
//! f16 without cooperative matrices); `coop:direct`, `coop:direct-prefetch` and
//! `coop:BMxBNxBK/WMxWN:S` are the cooperative-matrix f16 kernels ([`CoopTiling`]).
//! `CARTAGE_WGPU_MATMUL_VARIANT` takes a comma-separated list, at most one of each kind, e.g.
//! `coop:128x128x32/64x32:2,tiled:128x128x8/8x8:2`; it is read once per process and replaces the
//! defaults (an entry that does not parse is reported and ignored).

use std::fmt;

use cartage_core::{Backend, DType, Error, Kernel, Result, TensorArg};

use crate::backend::WgpuBackend;
use crate::ops::matmul::{Coop, MatmulTiling, matmul_with};
use crate::ops::matmul_coop_tiling::CoopTiling;

/// A matmul kernel and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MatmulVariant {
    /// The tiled kernel with this large tiling.
    Tiled(MatmulTiling),
    /// The cooperative-matrix f16 kernel with this shape.
    Coop(CoopTiling),
}

impl fmt::Display for MatmulVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatmulVariant::Tiled(t) => write!(f, "tiled:{t}"),
            MatmulVariant::Coop(t) => write!(f, "coop:{t}"),
        }
    }
}

impl std::str::FromStr for MatmulVariant {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().split_once(':') {
            Some(("tiled", rest)) => rest.parse().map(MatmulVariant::Tiled).map_err(|e| named(s, e)),
            Some(("coop", rest)) => rest.parse().map(MatmulVariant::Coop).map_err(|e| named(s, e)),
            _ => Err(Error::invalid(
                "matmul variant",
                format!("`{s}` is neither `tiled:BMxBNxBK/TMxTN[:2]` nor `coop:<shape>`"),
            )),
        }
    }
}

/// `e` about the variant named `s`.
fn named(s: &str, e: Error) -> Error {
    Error::invalid("matmul variant", format!("`{s}`: {e}"))
}

impl MatmulVariant {
    /// The variants a sweep tries for `dtype` (cooperative shapes for f16 where the adapter has
    /// them, and tiled ones for every float dtype).
    pub(crate) fn candidates(dtype: DType, cooperative: bool) -> Vec<MatmulVariant> {
        let mut out = Vec::new();
        if dtype == DType::F16 && cooperative {
            out.extend(CoopTiling::CANDIDATES.map(MatmulVariant::Coop));
        }
        let tiled: &[MatmulTiling] = if dtype == DType::F32 {
            &MatmulTiling::CANDIDATES
        } else {
            // The half-precision operands are unpacked to f32: a few shapes suffice.
            &MatmulTiling::CANDIDATES[..4]
        };
        out.extend(tiled.iter().copied().map(MatmulVariant::Tiled));
        if dtype != DType::F32 {
            out.push(MatmulVariant::Tiled(MatmulTiling::CANDIDATES[10]));
        }
        out
    }
}

/// The defaults `CARTAGE_WGPU_MATMUL_VARIANT` sets (each `None` where it names none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chosen {
    /// The tiled kernel's large tiling.
    pub tiled: Option<MatmulTiling>,
    /// The cooperative-matrix shape.
    pub coop: Option<CoopTiling>,
}

/// The entries of `text` (see the module doc).
pub(crate) fn parse_list(text: &str) -> Chosen {
    let mut chosen = Chosen::default();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.parse::<MatmulVariant>() {
            Ok(MatmulVariant::Tiled(t)) => chosen.tiled = Some(t),
            Ok(MatmulVariant::Coop(t)) => chosen.coop = Some(t),
            Err(e) => tracing::warn!(%e, "CARTAGE_WGPU_MATMUL_VARIANT: entry ignored"),
        }
    }
    chosen
}

/// `CARTAGE_WGPU_MATMUL_VARIANT`, read once.
pub(crate) fn from_env() -> Chosen {
    static CHOSEN: std::sync::OnceLock<Chosen> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        std::env::var("CARTAGE_WGPU_MATMUL_VARIANT")
            .map(|v| parse_list(&v))
            .unwrap_or_default()
    })
}

impl WgpuBackend {
    /// The f16 matmul path in words, for the device description: the cooperative-matrix
    /// configuration and the default kernel, or the tiled kernel.
    pub fn f16_matmul_path(&self) -> String {
        match self.ctx.coop_f16_subgroup {
            Some(size) if self.cooperative_matrices() => format!(
                "cooperative matrices 16x16x16 f16->f32, subgroups of {size}, kernel {}",
                MatmulVariant::Coop(crate::ops::matmul_coop::default_tiling())
            ),
            Some(_) => format!(
                "tiled kernel {} (cooperative matrices turned off)",
                self.matmul_tiling()
            ),
            None => format!("tiled kernel {} (no cooperative matrices)", self.matmul_tiling()),
        }
    }

    /// The names of the matmul variants a sweep tries for `dtype` on this adapter (see
    /// [`matmul_with_variant`](Self::matmul_with_variant)).
    pub fn matmul_variant_names(&self, dtype: DType) -> Vec<String> {
        MatmulVariant::candidates(dtype, self.has_cooperative_matrices())
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// Run one product on the variant named `variant` (for sweeps: `tiled:BMxBNxBK/TMxTN[:2]`,
    /// `coop:direct`, `coop:direct-prefetch` or `coop:BMxBNxBK/WMxWN:S`), validated as
    /// [`Backend::launch`] validates it. A `coop:` variant runs exactly that shape where the adapter has cooperative
    /// matrices, the product is f16 and fits the shape, and the tiled kernel otherwise; a
    /// `tiled:` variant always runs tiled. Returns the name of the kernel that ran (a tiled
    /// shape the problem is too small for runs as a smaller one, which is what is returned). A
    /// name that does not parse is [`Error::InvalidArgument`] quoting it.
    ///
    /// # Safety
    /// As for [`Backend::launch`]: every operand's buffer lies in a live allocation of this
    /// backend's allocator for the whole call (freed afterwards only in queue order).
    ///
    /// [`Backend::launch`]: cartage_core::Backend::launch
    pub unsafe fn matmul_with_variant(
        &self,
        lhs: &TensorArg,
        rhs: &TensorArg,
        out: &TensorArg,
        variant: &str,
    ) -> Result<String> {
        let variant: MatmulVariant = variant.parse()?;
        let kernel = Kernel::Matmul {
            lhs: lhs.clone(),
            rhs: rhs.clone(),
            out: out.clone(),
        };
        self.check_supported(&kernel)?;
        kernel.validate()?;
        let ran = match variant {
            MatmulVariant::Tiled(t) => matmul_with(self, lhs, rhs, out, Some(t), Coop::Off),
            MatmulVariant::Coop(t) => {
                let coop = if self.cooperative_matrices() {
                    Coop::Exactly(t)
                } else {
                    Coop::Off
                };
                matmul_with(self, lhs, rhs, out, Some(self.matmul_tiling()), coop)
            }
        };
        ran.map(|v| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_round_trip() {
        for dtype in [DType::F16, DType::F32, DType::BF16] {
            for v in MatmulVariant::candidates(dtype, true) {
                assert_eq!(v.to_string().parse::<MatmulVariant>().unwrap(), v, "{v}");
            }
        }
        assert!("tiled".parse::<MatmulVariant>().is_err());
        assert!("wmma:direct".parse::<MatmulVariant>().is_err());
    }

    #[test]
    fn the_override_list_sets_each_kind() {
        let chosen = parse_list("coop:128x128x32/64x32:2, tiled:128x128x8/8x8:2");
        assert_eq!(chosen.coop, Some("128x128x32/64x32:2".parse().unwrap()));
        assert_eq!(chosen.tiled, Some("128x128x8/8x8:2".parse().unwrap()));
        assert_eq!(chosen.tiled.unwrap().stages, 2);
        let partial = parse_list("coop:direct,nonsense");
        assert_eq!(partial.coop, Some(CoopTiling::DIRECT));
        assert_eq!(partial.tiled, None);
        assert_eq!(parse_list(""), Chosen::default());
    }
}
