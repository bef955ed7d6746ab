//! Dropout, composed from a uniform draw, a comparison and a select: several kernels, not one
//! fused kernel.

use cartage_core::{DType, Error, Result, Scalar};

use crate::Generator;
use crate::autograd::graph::{self, keep, saving};
use crate::tensor::{Tensor, caller, check};

impl Tensor {
    /// Zero each element with probability `p` and scale the others by `1 / (1 - p)`, drawing
    /// the mask from `rng` (which moves past the draw). With `train == false` or `p == 0` this
    /// is the identity (the same storage, nothing drawn); `p == 1` gives zeros. `p` must lie in
    /// `[0, 1]`. Float dtypes.
    ///
    /// Not fused: it runs a uniform draw, a comparison (`u ≥ p`), a scale and a select, one
    /// kernel each (plus fills for the scalars), so it costs several passes over the tensor.
    ///
    /// ```
    /// use cartage::{DType, Device, Generator, Tensor};
    /// let mut rng = Generator::new(0);
    /// let x = Tensor::ones(&[1000], DType::F32, &Device::cpu())?;
    /// let y = x.dropout(0.5, &mut rng, true)?.to_vec::<f32>()?;
    /// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    /// let kept = y.iter().filter(|&&v| v == 2.0).count();
    /// assert!((400..600).contains(&kept));
    /// // At evaluation time it does nothing.
    /// assert!(x.dropout(0.5, &mut rng, false)?.shares_storage(&x));
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn dropout(&self, p: f64, rng: &mut Generator, train: bool) -> Result<Tensor> {
        let site = caller();
        let name = "dropout";
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::invalid(
                name,
                format!("the drop probability p must lie in [0, 1], got {p}"),
            ));
        }
        check::float(name, self.dtype)?;
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        if p == 1.0 {
            // Everything dropped: the gradient is zero everywhere (not absent).
            let zeros = self.fill_new_like(self.shape(), self.dtype, Scalar::Int(0), site)?;
            return Ok(graph::record(zeros, name, &[self], |_| {
                saving(keep(&[]), |g, _| Ok(vec![Some(g.zeros_like()?)]))
            }));
        }
        // Half types draw in f32, so that `u ≥ p` keeps each element with probability 1 - p
        // to f32 precision rather than half precision.
        let draw_dtype = if self.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let draw = Tensor::rand_with(self.shape(), draw_dtype, rng, &self.device)?;
        let threshold = draw.scalar_like(Scalar::Float(p), site)?;
        let keep = draw.ge(&threshold)?;
        let scaled = self.mul_scalar(1.0 / (1.0 - p))?;
        let zero = self.scalar_like(Scalar::Int(0), site)?;
        Tensor::where_cond(&keep, &scaled, &zero)
    }
}
