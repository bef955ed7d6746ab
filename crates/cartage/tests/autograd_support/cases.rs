//! Every differentiable op, as gradient cases.

use cartage::{Conv2dOptions, CrossEntropy, DType, Generator, NormOrd, Reduction, Result, Tensor, s};

use super::Case;
use super::Profile::{AwayFromZero as Away, Normal, Positive};

fn ids(values: &[i64], shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::from_slice(values, shape, &like.device())
}

fn mask(values: &[bool], shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::from_slice(values, shape, &like.device())
}

macro_rules! case {
    ($name:expr, [$(($shape:expr, $p:expr)),*], $bf16:expr, $f:expr) => {
        Case { name: $name, inputs: vec![$(($shape.to_vec(), $p)),*], f: $f, bf16: $bf16 }
    };
}

/// The cases, in the order they are checked.
pub fn all() -> Vec<Case> {
    let mut v = elementwise();
    v.extend(reductions());
    v.extend(views_and_joins());
    v.extend(indexing());
    v.extend(nn());
    v
}

fn elementwise() -> Vec<Case> {
    vec![
        case!("add broadcast", [([2, 3], Normal), ([3], Normal)], true, |x| x[0]
            .add(&x[1])),
        case!("sub broadcast", [([2, 1], Normal), ([1, 3], Normal)], true, |x| x[0]
            .sub(&x[1])),
        case!("mul broadcast", [([2, 3], Normal), ([2, 1], Normal)], true, |x| x[0]
            .mul(&x[1])),
        case!("div", [([2, 3], Normal), ([3], Positive)], false, |x| x[0].div(&x[1])),
        case!("pow", [([4], Positive), ([4], Normal)], false, |x| x[0].pow(&x[1])),
        case!("maximum", [([5], Normal), ([5], Normal)], true, |x| x[0].maximum(&x[1])),
        case!("minimum broadcast", [([2, 3], Normal), ([3], Normal)], true, |x| x[0]
            .minimum(&x[1])),
        case!("scalar ops", [([4], Positive)], true, |x| {
            x[0].add_scalar(1.5)?
                .mul_scalar(-2.0)?
                .sub_scalar(0.5)?
                .div_scalar(3.0)?
                .pow_scalar(2.0)
        }),
        case!("ops traits", [([3], Normal), ([3], Normal)], true, |x| -&((&x[0]
            * &x[1])?
            - (&x[0] * 2.0)?)?),
        case!("neg abs", [([5], Away)], true, |x| x[0].neg()?.abs()),
        case!("exp", [([5], Normal)], true, |x| x[0].exp()),
        case!("log", [([5], Positive)], true, |x| x[0].log()),
        case!("sqrt", [([5], Positive)], true, |x| x[0].sqrt()),
        case!("relu", [([6], Away)], true, |x| x[0].relu()),
        case!("tanh", [([5], Normal)], true, |x| x[0].tanh()),
        case!("sigmoid", [([5], Normal)], true, |x| x[0].sigmoid()),
        case!("gelu", [([5], Normal)], true, |x| x[0].gelu()),
        case!("sin cos", [([5], Normal)], true, |x| x[0].sin()?.mul(&x[0].cos()?)),
        case!("rounding is flat", [([5], Normal)], false, |x| {
            let r = x[0].mul_scalar(2.3)?.add_scalar(0.25)?;
            r.floor()?
                .add(&r.ceil()?)?
                .add(&r.round()?)?
                .add(&r.trunc()?)?
                .add(&r.sign()?)?
                .add(&x[0])
        }),
        case!("rsqrt", [([5], Positive)], false, |x| x[0].rsqrt()),
        case!("recip", [([5], Positive)], false, |x| x[0].recip()),
        case!("square", [([5], Normal)], true, |x| x[0].square()),
        case!("erf", [([5], Normal)], true, |x| x[0].erf()),
        case!("log1p expm1", [([5], Positive)], false, |x| x[0]
            .log1p()?
            .add(&x[0].mul_scalar(0.5)?.expm1()?)),
        case!("silu softplus", [([5], Normal)], true, |x| x[0]
            .silu()?
            .add(&x[0].softplus()?)),
        case!("leaky_relu elu", [([6], Away)], true, |x| x[0]
            .leaky_relu(0.1)?
            .add(&x[0].elu(0.7)?)),
        case!("clamp hardtanh", [([8], Away)], true, |x| x[0]
            .clamp(-0.9, 0.8)?
            .add(&x[0].hardtanh(-1.1, 1.2)?)),
        case!("clamp_tensor", [([5], Normal), ([5], Normal)], false, |x| {
            let lo = x[1].sub_scalar(1.0)?;
            x[0].clamp_tensor(&lo, &x[1])
        }),
        case!("lerp", [([4], Normal), ([4], Normal), ([4], Positive)], true, |x| x[0]
            .lerp(&x[1], &x[2])),
        case!("where", [([2, 3], Normal), ([3], Normal)], true, |x| {
            let cond = mask(&[true, false, true, false, false, true], &[2, 3], &x[0])?;
            Tensor::where_cond(&cond, &x[0], &x[1])
        }),
        case!("cast round trip", [([4], Normal)], false, |x| {
            let other = if x[0].dtype() == DType::F64 {
                DType::F32
            } else {
                DType::F64
            };
            x[0].to_dtype(other)?.square()?.to_dtype(x[0].dtype())
        }),
        case!("comparison as constant", [([5], Normal)], true, |x| {
            let zero = Tensor::zeros(&[], x[0].dtype(), &x[0].device())?;
            x[0].gt(&zero)?.to_dtype(x[0].dtype())?.mul(&x[0])
        }),
    ]
}

fn reductions() -> Vec<Case> {
    vec![
        case!("sum dims", [([2, 3, 4], Normal)], true, |x| x[0].sum(&[0, 2], false)),
        case!("sum keepdim", [([2, 3], Normal)], true, |x| x[0].sum(&[1], true)),
        case!("sum_all", [([2, 3], Normal)], true, |x| x[0].sum_all()),
        case!("mean", [([2, 3, 2], Normal)], true, |x| x[0].mean(&[-1], false)),
        case!("mean_all", [([7], Normal)], true, |x| x[0].mean_all()),
        case!("max min", [([3, 4], Normal)], true, |x| x[0]
            .max(&[1], false)?
            .add(&x[0].min(&[1], false)?)),
        case!("max_all", [([6], Normal)], true, |x| x[0].max_all()),
        case!("max_dim values", [([3, 4], Normal)], true, |x| Ok(x[0]
            .max_dim(0, true)?
            .0)),
        case!("prod", [([3, 4], Normal)], false, |x| x[0].prod(&[1], false)),
        case!("prod with a zero", [([4], Normal)], false, |x| {
            let hole = mask(&[false, true, false, false], &[4], &x[0])?;
            x[0].masked_fill(&hole, 0.0)?.prod(&[0], false)
        }),
        case!("logsumexp", [([3, 4], Normal)], true, |x| x[0].logsumexp(&[1], false)),
        case!("softmax", [([3, 5], Normal)], true, |x| x[0].softmax(-1)),
        case!("softmax dim 0", [([3, 2], Normal)], true, |x| x[0].softmax(0)),
        case!("log_softmax", [([3, 5], Normal)], true, |x| x[0].log_softmax(1)),
        case!("var std", [([3, 4], Normal)], false, |x| x[0]
            .var(&[1], 1.0, false)?
            .add(&x[0].std(&[1], 0.0, false)?)),
        case!("norms", [([3, 4], Away)], false, |x| {
            let l1 = x[0].norm(NormOrd::L1, &[1], false)?;
            let l2 = x[0].norm(NormOrd::L2, &[1], false)?;
            let inf = x[0].norm(NormOrd::Inf, &[1], false)?;
            l1.add(&l2)?.add(&inf)
        }),
        case!("cumsum", [([3, 4], Normal)], true, |x| x[0].cumsum(1)),
        case!("cumprod", [([2, 4], Positive)], false, |x| x[0].cumprod(-1)),
        case!("sort values", [([3, 5], Normal)], true, |x| Ok(x[0].sort(1, true)?.0)),
        case!("topk values", [([2, 6], Normal)], true, |x| Ok(x[0]
            .topk(3, 1, true)?
            .0)),
    ]
}

fn views_and_joins() -> Vec<Case> {
    vec![
        case!("transpose t", [([2, 3], Normal)], true, |x| x[0]
            .t()?
            .mul(&x[0].t()?.exp()?)),
        case!("permute", [([2, 3, 4], Normal)], true, |x| x[0]
            .permute(&[2, 0, 1])?
            .contiguous()),
        case!("narrow select", [([4, 3], Normal)], true, |x| x[0]
            .narrow(0, 1, 2)?
            .add(&x[0].select(0, -1)?)),
        case!("slicing with steps", [([5, 4], Normal)], true, |x| x[0]
            .i((s(1, 5, 2), 1..3))),
        case!("reshape flatten", [([2, 3], Normal)], true, |x| {
            x[0].t()?
                .reshape(&[-1isize])?
                .unsqueeze(0)?
                .squeeze(0)?
                .add(&x[0].flatten()?)
        }),
        case!("expand broadcast_to", [([3, 1], Normal)], true, |x| {
            x[0].expand(&[2, -1, 4])?.add(&x[0].broadcast_to(&[2, 3, 4])?)
        }),
        case!("cat", [([2, 3], Normal), ([1, 3], Normal)], true, |x| Tensor::cat(
            &[&x[0], &x[1], &x[0]],
            0
        )),
        case!("stack", [([2, 3], Normal), ([2, 3], Normal)], true, |x| Tensor::stack(
            &[&x[0], &x[1]],
            1
        )),
        case!("split chunk", [([6, 2], Normal)], true, |x| {
            let parts = x[0].split(4, 0)?;
            let halves = x[0].chunk(2, 0)?;
            parts[1].mul(&halves[0].narrow(0, 0, 2)?)
        }),
        case!("repeat", [([2, 3], Normal)], true, |x| x[0].repeat(&[2, 1, 2])),
        case!("flip roll", [([3, 4], Normal)], true, |x| x[0]
            .flip(&[0, 1])?
            .add(&x[0].roll(2, 1)?)),
        case!("tril triu", [([3, 4], Normal)], true, |x| x[0]
            .tril()?
            .sub(&x[0].triu_with(1)?.mul_scalar(2.0)?)),
        case!("pad", [([2, 3], Normal)], true, |x| x[0].pad(&[1, 2, 0, 1], 0.5)),
        case!("contiguous of a view", [([3, 4], Normal)], true, |x| x[0]
            .t()?
            .contiguous()),
        case!("matmul 2d", [([3, 4], Normal), ([4, 2], Normal)], true, |x| x[0]
            .matmul(&x[1])),
        case!(
            "matmul batched broadcast",
            [([2, 3, 4], Normal), ([4, 5], Normal)],
            true,
            |x| x[0].matmul(&x[1])
        ),
        case!(
            "matmul batched, transposed weight",
            [([2, 3, 4], Normal), ([5, 4], Normal)],
            true,
            |x| x[0].matmul(&x[1].t()?)
        ),
        case!(
            "linear, fused where listed",
            [([2, 3, 4], Normal), ([5, 4], Normal), ([5], Normal)],
            true,
            |x| x[0].linear(&x[1], Some(&x[2]), cartage::Epilogue::Identity)
        ),
        case!(
            "matmul batch broadcast both",
            [([2, 1, 3, 4], Normal), ([3, 4, 2], Normal)],
            false,
            |x| { x[0].matmul(&x[1]) }
        ),
        case!("matmul vector", [([4], Normal), ([4, 3], Normal)], true, |x| x[0]
            .matmul(&x[1])),
        case!("matmul matrix vector", [([3, 4], Normal), ([4], Normal)], true, |x| x
            [0]
        .matmul(&x[1])),
        case!("dot", [([5], Normal), ([5], Normal)], true, |x| x[0].matmul(&x[1])),
    ]
}

fn indexing() -> Vec<Case> {
    vec![
        case!("gather", [([3, 4], Normal)], true, |x| x[0]
            .gather(1, &ids(&[0, 3, 3, 1, 2, 0], &[3, 2], &x[0])?)),
        case!("index_select repeats", [([4, 3], Normal)], true, |x| {
            x[0].index_select(0, &ids(&[2, 0, 2, 3], &[4], &x[0])?)
        }),
        case!("embedding", [([5, 3], Normal)], true, |x| x[0].embedding(&ids(
            &[1, 4, 1, 0],
            &[2, 2],
            &x[0]
        )?)),
        case!("masked_fill", [([2, 3], Normal)], true, |x| {
            x[0].masked_fill(&mask(&[true, false, false, true, false, true], &[2, 3], &x[0])?, 7.0)
        }),
        case!("scatter", [([3, 4], Normal), ([3, 2], Normal)], true, |x| {
            x[0].scatter(1, &ids(&[0, 2, 1, 3, 3, 0], &[3, 2], &x[0])?, &x[1])
        }),
        case!("scatter_add", [([3, 4], Normal), ([3, 2], Normal)], true, |x| {
            x[0].scatter_add(1, &ids(&[0, 0, 1, 3, 3, 3], &[3, 2], &x[0])?, &x[1])
        }),
        case!("index_add", [([4, 2], Normal), ([3, 2], Normal)], true, |x| {
            x[0].index_add(0, &ids(&[3, 1, 3], &[3], &x[0])?, &x[1])
        }),
    ]
}

fn nn() -> Vec<Case> {
    vec![
        case!(
            "layer_norm affine",
            [([3, 5], Normal), ([5], Normal), ([5], Normal)],
            true,
            |x| { x[0].layer_norm(Some(&x[1]), Some(&x[2]), 1e-5) }
        ),
        case!("layer_norm plain", [([2, 2, 4], Normal)], true, |x| x[0]
            .layer_norm(None, None, 1e-5)),
        case!("rms_norm", [([3, 4], Normal), ([4], Normal)], true, |x| x[0]
            .rms_norm(Some(&x[1]), 1e-6)),
        case!(
            "layer_norm affine rank 3 odd columns",
            [([2, 3, 7], Normal), ([7], Normal), ([7], Normal)],
            true,
            |x| { x[0].layer_norm(Some(&x[1]), Some(&x[2]), 1e-3) }
        ),
        case!("layer_norm bias only", [([5, 3], Normal), ([3], Normal)], true, |x| {
            x[0].layer_norm(None, Some(&x[1]), 1e-5)
        }),
        case!(
            "layer_norm one column",
            [([4, 1], Normal), ([1], Normal), ([1], Normal)],
            false,
            |x| { x[0].layer_norm(Some(&x[1]), Some(&x[2]), 1e-5) }
        ),
        case!("rms_norm one column", [([4, 1], Away), ([1], Normal)], false, |x| x[0]
            .rms_norm(Some(&x[1]), 1e-3)),
        case!("rms_norm plain many rows", [([40, 3], Normal)], true, |x| x[0]
            .rms_norm(None, 1e-5)),
        case!("cross_entropy", [([4, 5], Normal)], true, |x| {
            x[0].cross_entropy(&ids(&[1, 0, 4, 2], &[4], &x[0])?, CrossEntropy::default())
        }),
        case!("cross_entropy ignore smoothing sum", [([4, 3], Normal)], true, |x| {
            let opts = CrossEntropy {
                ignore_index: -1,
                label_smoothing: 0.2,
                reduction: Reduction::Sum,
            };
            x[0].cross_entropy(&ids(&[2, -1, 0, 1], &[4], &x[0])?, opts)
        }),
        case!("nll_loss", [([3, 4], Normal)], true, |x| {
            x[0].log_softmax(1)?
                .nll_loss(&ids(&[3, 0, 1], &[3], &x[0])?, CrossEntropy::default())
        }),
        case!("softplus_with beta threshold", [([6], Normal)], true, |x| x[0]
            .softplus_with(2.0, 3.0)),
        case!("max_pool2d stride = kernel", [([1, 1, 4, 4], Normal)], true, |x| x[0]
            .max_pool2d([2, 2], None, [0, 0])),
        case!("mse_loss", [([2, 3], Normal), ([2, 3], Normal)], true, |x| x[0]
            .mse_loss(&x[1], Reduction::Mean)),
        case!("l1_loss", [([5], Away)], true, |x| {
            x[0].l1_loss(&Tensor::zeros(&[5], x[0].dtype(), &x[0].device())?, Reduction::Sum)
        }),
        case!(
            "smooth_l1_loss both sides of beta",
            [([6], Away), ([6], Normal)],
            true,
            |x| {
                x[0].mul_scalar(2.0)?
                    .smooth_l1_loss(&x[1].mul_scalar(0.01)?, 1.0, Reduction::Mean)
            }
        ),
        case!(
            "bce_with_logits pos_weight",
            [([2, 3], Normal), ([3], Positive)],
            true,
            |x| {
                let t = Tensor::from_slice(&[0.0f64, 0.3, 1.0, 0.5, 0.9, 0.1], &[2, 3], &x[0].device())?
                    .to_dtype(x[0].dtype())?;
                x[0].binary_cross_entropy_with_logits(&t, Some(&x[1]), Reduction::Sum)
            }
        ),
        case!("dropout keeps its mask", [([4, 4], Normal)], true, |x| {
            let mut rng = Generator::new(7);
            x[0].dropout(0.5, &mut rng, true)?.mul(&x[0])
        }),
        case!(
            "conv2d",
            [([2, 2, 5, 5], Normal), ([3, 2, 3, 3], Normal), ([3], Normal)],
            true,
            |x| {
                x[0].conv2d(
                    &x[1],
                    Some(&x[2]),
                    Conv2dOptions {
                        padding: [1, 1],
                        ..Conv2dOptions::default()
                    },
                )
            }
        ),
        case!(
            "conv2d strided dilated",
            [([1, 2, 7, 6], Normal), ([2, 2, 2, 3], Normal)],
            false,
            |x| {
                let opts = Conv2dOptions {
                    stride: [2, 1],
                    padding: [1, 2],
                    dilation: [2, 1],
                    groups: 1,
                };
                x[0].conv2d(&x[1], None, opts)
            }
        ),
        case!(
            "conv2d groups unbatched",
            [([4, 4, 4], Normal), ([4, 2, 3, 3], Normal)],
            false,
            |x| {
                x[0].conv2d(
                    &x[1],
                    None,
                    Conv2dOptions {
                        groups: 2,
                        ..Conv2dOptions::default()
                    },
                )
            }
        ),
        case!("max_pool2d", [([1, 2, 5, 5], Normal)], true, |x| x[0].max_pool2d(
            [3, 3],
            [2, 2],
            [1, 1]
        )),
        case!("avg_pool2d", [([2, 1, 4, 5], Normal)], true, |x| {
            x[0].avg_pool2d([2, 3], [2, 2], [1, 1], true)?
                .add(&x[0].avg_pool2d([3, 3], [1, 2], [1, 1], false)?.sum_all()?)
        }),
        case!(
            "sdpa causal",
            [([2, 4, 8], Normal), ([2, 4, 8], Normal), ([2, 4, 8], Normal)],
            true,
            |x| { Tensor::scaled_dot_product_attention(&x[0], &x[1], &x[2], None, true, None) }
        ),
        case!("sdpa packed causal", [([2, 4, 12], Normal)], true, |x| {
            Tensor::scaled_dot_product_attention_packed(&x[0], 2, None, true, None)
        }),
        case!("sdpa packed", [([1, 3, 18], Normal)], true, |x| {
            Tensor::scaled_dot_product_attention_packed(&x[0], 3, None, false, Some(0.7))
        }),
        case!(
            "sdpa masked",
            [([3, 4], Normal), ([5, 4], Normal), ([5, 2], Normal)],
            true,
            |x| {
                let keep = mask(
                    &[
                        true, true, false, true, true, false, true, true, true, true, true, false, false, true, true,
                    ],
                    &[3, 5],
                    &x[0],
                )?;
                Tensor::scaled_dot_product_attention(&x[0], &x[1], &x[2], Some(&keep), false, Some(0.7))
            }
        ),
        case!(
            "sdpa key padding mask, causal, a row that sees no key",
            [([2, 2, 3, 4], Normal), ([2, 2, 5, 4], Normal), ([2, 2, 5, 3], Normal)],
            true,
            |x| {
                // [batch, 1, 1, S]: the second sequence's last two keys are padding (with the
                // causal mask every row still sees key 0). A [1, 1, L, S] float mask
                // adds a bias and removes every key of query row 1 (−inf): that row gives 0.
                let padding = mask(
                    &[true, true, true, true, true, true, true, true, false, false],
                    &[2, 1, 1, 5],
                    &x[0],
                )?;
                let neg = f32::NEG_INFINITY;
                let bias: [f32; 15] = [
                    0.3, -0.2, 0.0, 0.5, 0.1, neg, neg, neg, neg, neg, -0.4, 0.2, 0.0, 0.0, 0.6,
                ];
                let bias = Tensor::from_slice(&bias, &[1, 1, 3, 5], &x[0].device())?.to_dtype(x[0].dtype())?;
                let padded = Tensor::scaled_dot_product_attention(&x[0], &x[1], &x[2], Some(&padding), true, None)?;
                let biased = Tensor::scaled_dot_product_attention(&x[0], &x[1], &x[2], Some(&bias), false, Some(0.7))?;
                padded.add(&biased)
            }
        ),
    ]
}
