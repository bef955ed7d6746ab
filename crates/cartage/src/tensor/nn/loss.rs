//! Classification losses: `cross_entropy` from logits (the per-row loss is one
//! `Kernel::CrossEntropy`) and `nll_loss` from log-probabilities (gather, negate, select),
//! with their reductions computed on the device: the mean divides by the number of rows whose
//! target is not `ignore_index`, counted on the device, so no value is read back to the host.

use cartage_core::{DType, Error, Kernel, Result, Scalar, Site};

use crate::autograd::{formulas, graph};
use crate::tensor::{Tensor, caller, check};

/// How a loss combines its per-row values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The mean over the rows whose target is not ignored (NaN when every row is ignored, as
    /// in PyTorch). Shape `[]`.
    #[default]
    Mean,
    /// The sum over every row (ignored rows count 0). Shape `[]`.
    Sum,
    /// The per-row losses, shape `[N]` (ignored rows hold 0).
    None,
}

/// Options of [`Tensor::cross_entropy`] and [`Tensor::nll_loss`]. The default is PyTorch's:
/// `ignore_index` -100, no label smoothing, the mean.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropy {
    /// Rows whose target equals this give 0 and are left out of the mean.
    pub ignore_index: i64,
    /// Label smoothing `s` in `[0, 1]`: the target distribution puts `1 - s + s / C` on the
    /// target class and `s / C` on every other.
    pub label_smoothing: f64,
    /// How the per-row losses are combined.
    pub reduction: Reduction,
}

impl Default for CrossEntropy {
    fn default() -> Self {
        CrossEntropy {
            ignore_index: -100,
            label_smoothing: 0.0,
            reduction: Reduction::Mean,
        }
    }
}

impl Tensor {
    /// Cross-entropy of logits `[N, C]` (this tensor, float) against integer class indices
    /// `target` `[N]` (i32 or i64); a single row `[C]` takes a scalar target `[]`. The per-row
    /// loss `-(1 - s) * logp[target] - s / C * Σ_c logp[c]` (with `logp = log_softmax(logits)`
    /// and label smoothing `s`) is one kernel; rows whose target is `ignore_index` give 0. A
    /// target outside `[0, C)` other than `ignore_index` is [`Error::IndexOutOfRange`],
    /// reported by the device. See [`CrossEntropy`] and [`Reduction`].
    ///
    /// With a mean or sum over logits that need a gradient, the forward pass also writes the
    /// logits' gradient (the fused gradient kernel, for an output gradient of 1) and the
    /// recorded node keeps it instead of the logits; `loss.backward()` hands it over with no
    /// kernel, and any other output gradient scales it.
    ///
    /// ```
    /// use cartage::tensor::nn::{CrossEntropy, Reduction};
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let logits = Tensor::from_slice(&[0.0f32, 0.0, 5.0, 5.0], &[2, 2], &cpu)?;
    /// let target = Tensor::from_slice(&[1i64, -100], &[2], &cpu)?;
    /// let opts = CrossEntropy { reduction: Reduction::None, ..Default::default() };
    /// let rows = logits.cross_entropy(&target, opts)?.to_vec::<f32>()?;
    /// assert!((rows[0] - std::f32::consts::LN_2).abs() < 1e-6 && rows[1] == 0.0);
    /// // The mean leaves the ignored row out.
    /// let mean = logits.cross_entropy(&target, CrossEntropy::default())?.item::<f32>()?;
    /// assert!((mean - std::f32::consts::LN_2).abs() < 1e-6);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn cross_entropy(&self, target: &Tensor, opts: CrossEntropy) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::widened(self)? {
            return wide.cross_entropy(target, opts);
        }
        let site = caller();
        let name = "cross_entropy";
        let (logits, rows) = self.loss_operands(name, target, &opts)?;
        let n = logits.shape()[0];
        let per_row = logits.alloc_like(&[n], logits.dtype, site)?;
        let kernel = Kernel::CrossEntropy {
            logits: logits.as_arg(),
            target: rows.as_arg(),
            ignore_index: opts.ignore_index,
            label_smoothing: opts.label_smoothing,
            out: per_row.as_arg(),
        };
        per_row.launch_indexed(&kernel, &[&logits, &rows], &rows, n)?;
        if let Some(loss) = Tensor::cross_entropy_with_grad_ahead(&logits, &rows, &per_row, &opts, site)? {
            return Ok(loss);
        }
        let per_row = graph::record(per_row, name, &[&logits], |_| {
            formulas::nn::cross_entropy(&logits, &rows, opts.ignore_index, opts.label_smoothing)
        });
        self.reduce_loss(per_row, &rows, None, &opts, site)
    }

    /// Negative log-likelihood of log-probabilities `[N, C]` (this tensor, float, usually from
    /// [`Tensor::log_softmax`]) against integer class indices `target` `[N]` (i32 or i64); a
    /// single row `[C]` takes a scalar target `[]`. The per-row loss is
    /// `-(1 - s) * x[target] - s / C * Σ_c x[c]`, so `nll_loss(log_softmax(z))` equals
    /// `cross_entropy(z)` for every option. Composed from gather, negation and selects (not one
    /// kernel). A target outside `[0, C)` other than `ignore_index` is
    /// [`Error::IndexOutOfRange`].
    ///
    /// ```
    /// use cartage::tensor::nn::CrossEntropy;
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let logp = Tensor::from_slice(&[-0.5f32, -1.0, -2.0, -0.25], &[2, 2], &cpu)?;
    /// let target = Tensor::from_slice(&[0i64, 1], &[2], &cpu)?;
    /// let loss = logp.nll_loss(&target, CrossEntropy::default())?;
    /// assert_eq!(loss.item::<f32>()?, 0.375);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn nll_loss(&self, target: &Tensor, opts: CrossEntropy) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::widened(self)? {
            return wide.nll_loss(target, opts);
        }
        let site = caller();
        let name = "nll_loss";
        let (logp, rows) = self.loss_operands(name, target, &opts)?;
        let [n, c] = [logp.shape()[0], logp.shape()[1]];
        let valid = rows.kept_rows(opts.ignore_index, site)?;
        // Ignored rows gather class 0 (any in-range index) and are zeroed afterwards.
        let zero_index = rows.scalar_like(Scalar::Int(0), site)?;
        let safe = Tensor::where_cond(&valid, &rows, &zero_index)?;
        let index = safe.with_layout(safe.layout.unsqueeze(1)?);
        // A target out of range is reported by the gather (`gather` in the error, on every
        // device alike: some report it only when a result is read).
        let picked = logp.gather(1, &index)?;
        let picked = picked.view_contiguous(&[n])?;
        let mut per_row = picked.mul_scalar(-(1.0 - opts.label_smoothing))?;
        if opts.label_smoothing > 0.0 && c > 0 {
            let spread = logp.sum(&[1], false)?.mul_scalar(opts.label_smoothing / c as f64)?;
            per_row = per_row.sub(&spread)?;
        }
        let zero = per_row.scalar_like(Scalar::Int(0), site)?;
        let per_row = Tensor::where_cond(&valid, &per_row, &zero)?;
        self.reduce_loss(per_row, &rows, Some(&valid), &opts, site)
    }

    /// Check a loss's operands; returns them as `[N, C]` and `[N]` (a single row gains a unit
    /// dimension).
    fn loss_operands(&self, name: &'static str, target: &Tensor, opts: &CrossEntropy) -> Result<(Tensor, Tensor)> {
        check::same_device(name, self, target)?;
        check::float(name, self.dtype)?;
        check::index_dtype(name, target)?;
        if !(0.0..=1.0).contains(&opts.label_smoothing) {
            return Err(Error::invalid(
                name,
                format!("label_smoothing must lie in [0, 1], got {}", opts.label_smoothing),
            ));
        }
        let fits = match self.rank() {
            1 => target.rank() == 0,
            2 => target.rank() == 1 && target.shape()[0] == self.shape()[0],
            _ => false,
        };
        if !fits {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: target.shape().to_vec(),
                reason: "the input must be [N, C] with a target [N] of class indices, or [C] with a scalar target"
                    .into(),
            });
        }
        if self.rank() == 1 {
            let input = self.unsqueeze(0)?;
            let target = target.with_layout(target.layout.unsqueeze(0)?);
            return Ok((input, target));
        }
        Ok((self.clone(), target.clone()))
    }

    /// Bool `[N]`: true where this target (i32/i64) is not `ignore_index`.
    pub(super) fn kept_rows(&self, ignore_index: i64, site: Site) -> Result<Tensor> {
        if self.dtype != DType::I64 && i32::try_from(ignore_index).is_err() {
            // No i32 target can equal it: every row counts.
            return self.fill_new_like(self.shape(), DType::Bool, Scalar::Bool(true), site);
        }
        let ignore = self.scalar_like(Scalar::Int(ignore_index), site)?;
        self.ne(&ignore)
    }

    /// Apply `opts.reduction` to the per-row losses `[N]`; `rows` are the targets `[N]` and
    /// `valid` their [`Tensor::kept_rows`] when already computed. A single row (this tensor
    /// 1-D) gives `[]` under [`Reduction::None`].
    fn reduce_loss(
        &self,
        per_row: Tensor,
        rows: &Tensor,
        valid: Option<&Tensor>,
        opts: &CrossEntropy,
        site: Site,
    ) -> Result<Tensor> {
        match opts.reduction {
            Reduction::None if self.rank() == 1 => per_row.view_contiguous(&[]),
            Reduction::None => Ok(per_row),
            Reduction::Sum => per_row.sum_all(),
            Reduction::Mean => {
                let valid = match valid {
                    Some(valid) => valid.clone(),
                    None => rows.kept_rows(opts.ignore_index, site)?,
                };
                let count = valid.to_dtype(per_row.dtype)?.sum_all()?;
                per_row.sum_all()?.div(&count)
            }
        }
    }
}
