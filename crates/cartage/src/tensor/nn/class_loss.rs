//! `cross_entropy_with`: PyTorch's `F.cross_entropy` in full — inputs `[N, C, d…]` with targets
//! `[N, d…]`, per-class weights, and probability (soft) targets — and `nll_loss_with`, its
//! `F.nll_loss` counterpart on log-probabilities, composed from `log_softmax`, `gather` and
//! selects, so autograd differentiates them on every backend. The plain `[N, C]` case without
//! weights takes `Tensor::cross_entropy` (one fused kernel) or `Tensor::nll_loss`.

use cartage_core::{Error, Result, Scalar};

use super::{CrossEntropy, Reduction};
use crate::tensor::{Tensor, caller, check};

const NAME: &str = "cross_entropy";
const NLL: &str = "nll_loss";

impl Tensor {
    /// Cross-entropy of logits against class indices or class probabilities, as
    /// `F.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing)`:
    /// - `self` is `[C]`, `[N, C]` or `[N, C, d1, …]` (the class dim second);
    /// - `target` is integer `[N, d1, …]` (`[]` for `[C]`) — class indices, `ignore_index`
    ///   rows giving 0 — or float of `self`'s shape — probabilities per class;
    /// - `weight` `[C]` weighs each class; with indices the mean divides by the summed weight
    ///   of the rows kept, with probabilities by the number of rows (PyTorch's rules).
    ///
    /// ```
    /// use cartage::tensor::nn::{CrossEntropy, Reduction};
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// // [N = 1, C = 2, d = 2]: two positions, each its own row.
    /// let logits = Tensor::from_slice(&[0.0f32, 3.0, 0.0, -3.0], &[1, 2, 2], &cpu)?;
    /// let target = Tensor::from_slice(&[0i64, 1], &[1, 2], &cpu)?;
    /// let weight = Tensor::from_slice(&[1.0f32, 3.0], &[2], &cpu)?;
    /// let opts = CrossEntropy { reduction: Reduction::None, ..Default::default() };
    /// let rows = logits.cross_entropy_with(&target, Some(&weight), opts)?;
    /// assert_eq!(rows.shape(), &[1, 2]);
    /// let soft = Tensor::from_slice(&[0.5f32, 0.5, 0.5, 0.5], &[1, 2, 2], &cpu)?;
    /// let mean = logits.cross_entropy_with(&soft, None, CrossEntropy::default())?;
    /// assert!(mean.item::<f32>()? > 0.0);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn cross_entropy_with(&self, target: &Tensor, weight: Option<&Tensor>, opts: CrossEntropy) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::widened(self)? {
            return wide.cross_entropy_with(target, weight, opts);
        }
        check::same_device(NAME, self, target)?;
        check::float(NAME, self.dtype())?;
        if !(0.0..=1.0).contains(&opts.label_smoothing) {
            return Err(Error::invalid(
                NAME,
                format!("label_smoothing must lie in [0, 1], got {}", opts.label_smoothing),
            ));
        }
        let probabilities = target.dtype().is_float();
        if weight.is_none() && !probabilities && self.rank() <= 2 {
            return self.cross_entropy(target, opts);
        }
        if self.rank() == 0 {
            return Err(shape_error(
                NAME,
                self,
                target,
                "the input needs a class dim: [C], [N, C] or [N, C, d…]",
            ));
        }
        check_weight(NAME, self, weight)?;
        let logp = rows_of(self)?.log_softmax(1)?; // [M, C]
        if probabilities {
            let smoothing = opts.label_smoothing;
            let c = classes(self) as f64;
            check::same_dtype(NAME, self, target)?;
            if target.shape() != self.shape() {
                return Err(shape_error(
                    NAME,
                    self,
                    target,
                    "probability targets have the input's shape",
                ));
            }
            let mut t = rows_of(target)?;
            if smoothing > 0.0 {
                t = t.mul_scalar(1.0 - smoothing)?.add_scalar(smoothing / c)?;
            }
            let mut per_class = t.mul(&logp)?.neg()?;
            if let Some(w) = weight {
                per_class = per_class.mul(w)?;
            }
            let per_row = per_class.sum(&[1], false)?; // [M]
            return match opts.reduction {
                Reduction::Mean => per_row.mean_all(),
                Reduction::Sum => per_row.sum_all(),
                Reduction::None => per_row.reshape(&row_shape(self)),
            };
        }
        index_loss(NAME, self, &logp, target, weight, opts)
    }

    /// Negative log-likelihood of log-probabilities against class indices, as
    /// `F.nll_loss(input, target, weight, ignore_index, reduction)`: `self` is `[C]`, `[N, C]`
    /// or `[N, C, d1, …]` (usually from [`Tensor::log_softmax`] over the class dim), `target`
    /// integer `[N, d1, …]` (`[]` for `[C]`), and `weight` `[C]` weighs each class; the mean
    /// divides by the summed weight of the rows whose target is not `ignore_index` (PyTorch's
    /// rule). `label_smoothing` applies as in [`Tensor::nll_loss`], so
    /// `log_softmax(z, 1).nll_loss_with(t, w, o)` equals `z.cross_entropy_with(t, w, o)`.
    ///
    /// ```
    /// use cartage::tensor::nn::CrossEntropy;
    /// use cartage::{Device, Tensor};
    /// let cpu = Device::cpu();
    /// let logp = Tensor::from_slice(&[-0.5f32, -1.0, -2.0, -0.25], &[2, 2], &cpu)?;
    /// let target = Tensor::from_slice(&[0i64, 1], &[2], &cpu)?;
    /// let weight = Tensor::from_slice(&[1.0f32, 3.0], &[2], &cpu)?;
    /// // (1·0.5 + 3·0.25) / (1 + 3)
    /// let loss = logp.nll_loss_with(&target, Some(&weight), CrossEntropy::default())?;
    /// assert_eq!(loss.item::<f32>()?, 0.3125);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    #[track_caller]
    pub fn nll_loss_with(&self, target: &Tensor, weight: Option<&Tensor>, opts: CrossEntropy) -> Result<Tensor> {
        if let Some(wide) = crate::autocast::widened(self)? {
            return wide.nll_loss_with(target, weight, opts);
        }
        if weight.is_none() && self.rank() <= 2 {
            return self.nll_loss(target, opts);
        }
        check::same_device(NLL, self, target)?;
        check::float(NLL, self.dtype())?;
        if !(0.0..=1.0).contains(&opts.label_smoothing) {
            return Err(Error::invalid(
                NLL,
                format!("label_smoothing must lie in [0, 1], got {}", opts.label_smoothing),
            ));
        }
        if self.rank() == 0 {
            return Err(shape_error(
                NLL,
                self,
                target,
                "the input needs a class dim: [C], [N, C] or [N, C, d…]",
            ));
        }
        check_weight(NLL, self, weight)?;
        index_loss(NLL, self, &rows_of(self)?, target, weight, opts)
    }
}

/// The number of classes of `input` (`[C]`, or the dim after the batch).
fn classes(input: &Tensor) -> usize {
    if input.rank() == 1 {
        input.shape()[0]
    } else {
        input.shape()[1]
    }
}

/// `weight`, when given, is `[C]` of the input's dtype and device.
fn check_weight(op: &'static str, input: &Tensor, weight: Option<&Tensor>) -> Result<()> {
    if let Some(w) = weight {
        check::same_device_and_dtype(op, input, w)?;
        if w.shape() != [classes(input)] {
            return Err(shape_error(
                op,
                input,
                w,
                "the class weights must be [C], one per class",
            ));
        }
    }
    Ok(())
}

/// The loss of log-probabilities `logp` `[M, C]` (the rows of `input`) against class indices:
/// `-w[t]·logp[t]` per row (smoothed), `ignore_index` rows giving 0, the mean over the summed
/// weight of the rows kept.
fn index_loss(
    op: &'static str,
    input: &Tensor,
    logp: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    opts: CrossEntropy,
) -> Result<Tensor> {
    let smoothing = opts.label_smoothing;
    let c = classes(input) as f64;
    check::index_dtype(op, target)?;
    if target.shape() != row_shape(input).as_slice() {
        return Err(shape_error(
            op,
            input,
            target,
            "class-index targets are [N, d…] for an input [N, C, d…] ([] for [C])",
        ));
    }
    let m = logp.shape()[0];
    let rows = target.reshape(&[m])?;
    let ignore = rows.scalar_like(Scalar::Int(opts.ignore_index), caller())?;
    let valid = rows.ne(&ignore)?;
    let safe = Tensor::where_cond(&valid, &rows, &rows.zeros_like()?)?;
    let picked = logp.gather(1, &safe.reshape(&[m, 1])?)?.reshape(&[m])?.neg()?; // -logp[t]
    let zero = picked.zeros_like()?;
    let row_weight = match weight {
        Some(w) => Tensor::where_cond(&valid, &w.index_select(0, &safe)?, &zero)?,
        None => Tensor::where_cond(&valid, &zero.add_scalar(1.0)?, &zero)?,
    };
    let mut per_row = picked.mul(&row_weight)?.mul_scalar(1.0 - smoothing)?;
    if smoothing > 0.0 {
        let weighted = match weight {
            Some(w) => logp.mul(w)?,
            None => logp.clone(),
        };
        let spread = weighted.sum(&[1], false)?.neg()?.mul_scalar(smoothing / c)?;
        per_row = per_row.add(&Tensor::where_cond(&valid, &spread, &zero)?)?;
    }
    match opts.reduction {
        Reduction::Mean => per_row.sum_all()?.div(&row_weight.sum_all()?),
        Reduction::Sum => per_row.sum_all(),
        Reduction::None => per_row.reshape(&row_shape(input)),
    }
}

/// `[N, C, d…]` (or `[C]`) as rows `[N·d…, C]`, the class dim last.
fn rows_of(x: &Tensor) -> Result<Tensor> {
    match x.rank() {
        1 => x.reshape(&[1, x.shape()[0]]),
        2 => Ok(x.clone()),
        r => {
            let c = x.shape()[1];
            let mut perm: Vec<isize> = vec![0];
            perm.extend(2..r as isize);
            perm.push(1);
            let m = x.numel() / c.max(1);
            x.permute(&perm)?.reshape(&[m, c])
        }
    }
}

/// The input's shape without its class dim: `[N, d…]`, or `[]` for `[C]`.
fn row_shape(x: &Tensor) -> Vec<usize> {
    match x.rank() {
        1 => Vec::new(),
        _ => x
            .shape()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, &d)| d)
            .collect(),
    }
}

fn shape_error(op: &'static str, input: &Tensor, other: &Tensor, reason: &str) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: input.shape().to_vec(),
        rhs: other.shape().to_vec(),
        reason: reason.into(),
    }
}
