//! The reduced `cross_entropy` of logits that need a gradient, with that gradient written in the
//! forward pass. The node's forward runs the loss kernel, reduces it, and then runs the
//! gradient kernel for a unit output gradient (`Kernel::CrossEntropyBackward` with each row's
//! weight `1 / rows kept` for the mean, `1` for the sum); the node keeps that `[N, C]` gradient
//! instead of the logits. When backward starts from this loss (`loss.backward()`, the usual
//! training step) the node hands the gradient over as it is: no kernel runs, and the step holds
//! one tensor of the vocabulary's size at the start of backward where it held two (the logits
//! kept for backward and the gradient made from them). Any other output gradient (a scaled loss,
//! a loss added to another, a retained graph) scales it, one pass.

use cartage_core::{Error, Op, Result, Scalar, Site};

use super::loss::{CrossEntropy, Reduction};
use crate::autograd::{formulas, graph};
use crate::tensor::Tensor;

const NAME: &str = "cross_entropy";

impl Tensor {
    /// The loss `opts.reduction` gives from `per_row` (the losses of `logits` `[N, C]` against
    /// `rows` `[N]`), recorded as one node whose backward hands over the gradient written here;
    /// `None` where this path does not apply: no reduction, logits that need no gradient, or a
    /// backend without the fused gradient kernel for their dtype.
    pub(super) fn cross_entropy_with_grad_ahead(
        logits: &Tensor,
        rows: &Tensor,
        per_row: &Tensor,
        opts: &CrossEntropy,
        site: Site,
    ) -> Result<Option<Tensor>> {
        let kernel_there = logits
            .backend()
            .capabilities()
            .supports(Op::CrossEntropyBackward, logits.dtype);
        if opts.reduction == Reduction::None || !kernel_there || !graph::tracking(&[logits]) {
            return Ok(None);
        }
        let n = logits.shape()[0];
        let (loss, grad) = {
            // The reduction and the gradient are this node's forward: none of it is recorded.
            let _plain = crate::autograd::no_grad();
            let one = per_row.scalar_like(Scalar::Float(1.0), site)?;
            let (loss, row_weight) = match opts.reduction {
                Reduction::Mean => {
                    let count = rows
                        .kept_rows(opts.ignore_index, site)?
                        .to_dtype(per_row.dtype)?
                        .sum_all()?;
                    (per_row.sum_all()?.div(&count)?, one.div(&count)?)
                }
                _ => (per_row.sum_all()?, one),
            };
            let row_weight = row_weight.broadcast_to(&[n])?;
            let grad =
                logits.cross_entropy_backward_fused(rows, &row_weight, opts.ignore_index, opts.label_smoothing)?;
            (loss, grad)
        };
        let Some(grad) = grad else {
            return Err(Error::invalid(
                NAME,
                "internal: the gradient kernel the backend lists did not run; this is a bug in cartage",
            ));
        };
        Ok(Some(graph::record(loss, NAME, &[logits], |_| {
            formulas::nn::cross_entropy_grad_ahead(grad)
        })))
    }
}
