//! The frontend ops that are not one kernel each: what each is built from, as (kernel, dtype)
//! pairs for an input of a given dtype, so that its support on a backend follows from the
//! kernel table. Views (no kernel at all) run everywhere for every dtype.
//!
//! Each line follows the op's implementation in `crates/cartage/src/tensor/`; when that is
//! built from other kernels, its line here changes with it. Index and mask arithmetic runs in
//! the dtype the implementation uses (i64 for most), which is why some ops run on fewer dtypes
//! or backends than their main kernel.

use cartage::{BinaryOp, CompareOp, DType, Op, ReduceOp, ScanOp, ScatterMode, UnaryOp};

/// The kernels an op needs for an input of one dtype, or `None` where the frontend does not
/// define the op for that dtype.
pub type Needs = fn(DType) -> Option<Vec<(Op, DType)>>;

/// One frontend op.
pub struct Composed {
    /// The section of the table.
    pub group: &'static str,
    /// The call, as a user writes it.
    pub name: &'static str,
    /// How it is built, in words.
    pub how: &'static str,
    /// The kernels it launches.
    pub needs: Needs,
    /// The kernels it launches instead on a device that lacks one of `needs` (the frontend
    /// asks the device's capabilities and picks), if it has such a path.
    pub fallback: Option<Needs>,
}

impl Composed {
    /// This op with a second path for devices that lack a kernel of the first.
    const fn or(self, fallback: Needs) -> Composed {
        Composed {
            fallback: Some(fallback),
            ..self
        }
    }
}

fn float(d: DType) -> bool {
    d.is_float()
}

fn index(d: DType) -> bool {
    matches!(d, DType::I32 | DType::I64)
}

/// `x != 0` as bool (itself for bool).
fn truthy(d: DType) -> Vec<(Op, DType)> {
    match d {
        DType::Bool => vec![],
        _ => vec![(Op::Fill, d), (Op::Compare(CompareOp::Ne), d)],
    }
}

fn when(ok: bool, needs: Vec<(Op, DType)>) -> Option<Vec<(Op, DType)>> {
    ok.then_some(needs)
}

const fn op(group: &'static str, name: &'static str, how: &'static str, needs: Needs) -> Composed {
    Composed {
        group,
        name,
        how,
        needs,
        fallback: None,
    }
}

const SHAPE: &str = "Shape and joining";
const INDEXING: &str = "Indexing";
const ELEMENTWISE: &str = "Element-wise";
const REDUCTIONS: &str = "Reductions and scans";
const NN: &str = "NN";
const CONSTRUCTORS: &str = "Constructors";

/// Every composed frontend op, in table order.
pub fn all() -> Vec<Composed> {
    use BinaryOp::{Add, Div, Maximum, Minimum, Mul, Pow, Sub};
    use CompareOp::{Eq, Ge, Gt, Le, Lt, Ne};
    const I64: DType = DType::I64;
    vec![
        op(SHAPE, "Tensor::cat", "one strided copy into each input's slot", |d| {
            Some(vec![(Op::Copy, d)])
        }),
        op(SHAPE, "Tensor::stack", "`cat` of unsqueezed views", |d| {
            Some(vec![(Op::Copy, d)])
        }),
        op(SHAPE, "split, split_sizes, chunk, expand, select", "views", |_| {
            Some(vec![])
        }),
        op(
            SHAPE,
            "reshape, flatten, flatten_dims",
            "a view; a copy when the strides cannot be merged",
            |d| Some(vec![(Op::Copy, d)]),
        ),
        op(SHAPE, "repeat", "one copy of a broadcast view", |d| {
            Some(vec![(Op::Copy, d)])
        }),
        op(SHAPE, "flip", "index_select with a reversed i64 arange per dim", |d| {
            Some(vec![(Op::Copy, d), (Op::Arange, I64), (Op::IndexSelect, d)])
        }),
        op(SHAPE, "roll", "`cat` of two narrowed views", |d| {
            Some(vec![(Op::Copy, d)])
        }),
        op(
            SHAPE,
            "tril, triu",
            "`where` with a mask comparing two i32 aranges (i64 past 2³⁰ rows or columns)",
            |d| {
                Some(vec![
                    (Op::Arange, DType::I32),
                    (Op::Compare(Le), DType::I32),
                    (Op::Compare(Ge), DType::I32),
                    (Op::Fill, d),
                    (Op::Where, d),
                ])
            },
        ),
        op(SHAPE, "pad", "a fill, then a copy into the interior", |d| {
            Some(vec![(Op::Fill, d), (Op::Copy, d)])
        }),
        op(INDEXING, "x.i((..))", "a view (ranges, steps, single indices)", |_| {
            Some(vec![])
        }),
        op(INDEXING, "masked_fill", "`where` with the value broadcast", |d| {
            Some(vec![(Op::Fill, d), (Op::Where, d)])
        }),
        op(INDEXING, "scatter", "a copy, then scatter in place", |d| {
            Some(vec![(Op::Copy, d), (Op::Scatter(ScatterMode::Assign), d)])
        }),
        op(
            INDEXING,
            "scatter_add, index_add",
            "a copy, then scatter_add in place",
            |d| Some(vec![(Op::Copy, d), (Op::Scatter(ScatterMode::Add), d)]),
        ),
        op(
            INDEXING,
            "one_hot",
            "compare with an arange, cast to i64 (in i32 where the device cannot compare the ids' dtype)",
            |d| {
                when(
                    index(d),
                    vec![(Op::Arange, d), (Op::Compare(Eq), d), (Op::Cast(I64), DType::Bool)],
                )
            },
        )
        .or(|d| {
            let cast = (d != DType::I32).then_some((Op::Cast(DType::I32), d));
            when(
                index(d),
                cast.into_iter()
                    .chain([
                        (Op::Arange, DType::I32),
                        (Op::Compare(Eq), DType::I32),
                        (Op::Cast(I64), DType::Bool),
                    ])
                    .collect(),
            )
        }),
        op(
            INDEXING,
            "nonzero",
            "compare with 0 on the device; the mask is read by the host (a counted sync)",
            |d| Some(truthy(d)),
        ),
        op(INDEXING, "embedding", "index_select of rows", |d| {
            Some(vec![(Op::IndexSelect, d)])
        }),
        op(
            ELEMENTWISE,
            "clamp, clamp_min, clamp_max, hardtanh, maximum_scalar, minimum_scalar",
            "maximum/minimum with the bound filled on the device",
            |d| Some(vec![(Op::Fill, d), (Op::Binary(Maximum), d), (Op::Binary(Minimum), d)]),
        ),
        op(ELEMENTWISE, "clamp_tensor", "maximum, then minimum", |d| {
            Some(vec![(Op::Binary(Maximum), d), (Op::Binary(Minimum), d)])
        }),
        op(ELEMENTWISE, "leaky_relu", "`where(x > 0, x, slope * x)`", |d| {
            when(
                float(d),
                vec![
                    (Op::Fill, d),
                    (Op::Compare(Gt), d),
                    (Op::Binary(Mul), d),
                    (Op::Where, d),
                ],
            )
        }),
        op(ELEMENTWISE, "elu", "`where(x > 0, x, alpha * expm1(x))`", |d| {
            when(
                float(d),
                vec![
                    (Op::Fill, d),
                    (Op::Compare(Gt), d),
                    (Op::Unary(UnaryOp::Expm1), d),
                    (Op::Binary(Mul), d),
                    (Op::Where, d),
                ],
            )
        }),
        op(ELEMENTWISE, "isnan", "`x != x`", |d| Some(vec![(Op::Compare(Ne), d)])),
        op(
            ELEMENTWISE,
            "isinf, isfinite",
            "`abs(x)` compared with infinity; `x != x` or `x == x` for integers",
            |d| match float(d) {
                true => Some(vec![
                    (Op::Unary(UnaryOp::Abs), d),
                    (Op::Fill, d),
                    (Op::Compare(Eq), d),
                    (Op::Compare(Lt), d),
                ]),
                false => Some(vec![(Op::Compare(Ne), d), (Op::Compare(Eq), d)]),
            },
        ),
        op(
            ELEMENTWISE,
            "logical_and, logical_or, logical_xor, logical_not",
            "`x != 0`, then minimum/maximum/not-equal on bool",
            |d| {
                let mut needs = truthy(d);
                needs.extend([
                    (Op::Fill, d),
                    (Op::Compare(Eq), d),
                    (Op::Binary(Minimum), DType::Bool),
                    (Op::Binary(Maximum), DType::Bool),
                    (Op::Compare(Ne), DType::Bool),
                ]);
                Some(needs)
            },
        ),
        op(ELEMENTWISE, "lerp", "`x + weight * (end - x)`", |d| {
            when(
                float(d),
                vec![
                    (Op::Fill, d),
                    (Op::Binary(Sub), d),
                    (Op::Binary(Mul), d),
                    (Op::Binary(Add), d),
                ],
            )
        }),
        op(
            REDUCTIONS,
            "var, std",
            "mean, centred squares, sum, divide (and sqrt)",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::Reduce(ReduceOp::Mean), d),
                        (Op::Binary(Sub), d),
                        (Op::Binary(Mul), d),
                        (Op::Reduce(ReduceOp::Sum), d),
                        (Op::Fill, d),
                        (Op::Binary(Div), d),
                        (Op::Unary(UnaryOp::Sqrt), d),
                    ],
                )
            },
        ),
        op(
            REDUCTIONS,
            "norm (L1, L2, inf, p)",
            "abs and sum; squares, sum and sqrt; abs and max; abs, pow, sum and pow",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::Unary(UnaryOp::Abs), d),
                        (Op::Binary(Mul), d),
                        (Op::Unary(UnaryOp::Sqrt), d),
                        (Op::Reduce(ReduceOp::Sum), d),
                        (Op::Reduce(ReduceOp::Max), d),
                        (Op::Fill, d),
                        (Op::Binary(Pow), d),
                    ],
                )
            },
        ),
        op(REDUCTIONS, "any, all", "`x != 0`, then max/min over bool", |d| {
            let mut needs = truthy(d);
            needs.extend([
                (Op::Reduce(ReduceOp::Max), DType::Bool),
                (Op::Reduce(ReduceOp::Min), DType::Bool),
            ]);
            Some(needs)
        }),
        op(REDUCTIONS, "max_dim, min_dim", "max and argmax (min and argmin)", |d| {
            Some(vec![
                (Op::Reduce(ReduceOp::Max), d),
                (Op::Reduce(ReduceOp::ArgMax), d),
                (Op::Reduce(ReduceOp::Min), d),
                (Op::Reduce(ReduceOp::ArgMin), d),
            ])
        }),
        op(
            REDUCTIONS,
            "cumsum, cumprod",
            "the scan kernel; integers and bool are widened to i64 first",
            |d| match float(d) {
                true => Some(vec![(Op::Scan(ScanOp::Sum), d), (Op::Scan(ScanOp::Prod), d)]),
                false => Some(vec![
                    (Op::Cast(I64), d),
                    (Op::Scan(ScanOp::Sum), I64),
                    (Op::Scan(ScanOp::Prod), I64),
                ]),
            },
        ),
        op(
            REDUCTIONS,
            "argsort, topk",
            "the stable sort (topk: then a copy of the first k)",
            |d| Some(vec![(Op::Sort, d), (Op::Copy, d), (Op::Copy, I64)]),
        ),
        op(
            NN,
            "cross_entropy",
            "the per-row kernel; the mean counts the rows kept on the device",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::CrossEntropy, d),
                        (Op::Reduce(ReduceOp::Sum), d),
                        (Op::Fill, I64),
                        (Op::Compare(Ne), I64),
                        (Op::Cast(d), DType::Bool),
                        (Op::Binary(Div), d),
                    ],
                )
            },
        ),
        op(
            NN,
            "nll_loss",
            "gather of the target's log-probability, negated, masked, mean (targets compared like cross_entropy's)",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::Fill, I64),
                        (Op::Compare(Ne), I64),
                        (Op::Where, I64),
                        (Op::Gather, d),
                        (Op::Fill, d),
                        (Op::Binary(Mul), d),
                        (Op::Where, d),
                        (Op::Reduce(ReduceOp::Sum), d),
                        (Op::Cast(d), DType::Bool),
                        (Op::Binary(Div), d),
                    ],
                )
            },
        ),
        op(
            NN,
            "dropout",
            "uniform draws from the generator (f32, f64 for f64), `where`, scale",
            |d| {
                let draw = if d == DType::F64 { DType::F64 } else { DType::F32 };
                when(
                    float(d),
                    vec![
                        (Op::RandomUniform, draw),
                        (Op::Fill, draw),
                        (Op::Compare(Ge), draw),
                        (Op::Fill, d),
                        (Op::Binary(Mul), d),
                        (Op::Where, d),
                    ],
                )
            },
        ),
        op(
            NN,
            "conv2d",
            "the fused `conv2d` kernel where listed (CUDA with cuDNN), else im2col: a padded copy seen through a window view, copied once, one batched matmul; the bias added",
            |d| {
                when(
                    float(d),
                    vec![(Op::Fill, d), (Op::Copy, d), (Op::Matmul, d), (Op::Binary(Add), d)],
                )
            },
        ),
        op(
            NN,
            "max_pool2d",
            "the fused `max_pool2d` kernel where listed (every backend), else max over a window view of the padded input; `max_pool2d_with_indices` needs the fused kernel",
            |d| {
                when(
                    float(d),
                    vec![(Op::Fill, d), (Op::Copy, d), (Op::Reduce(ReduceOp::Max), d)],
                )
            },
        ),
        op(
            NN,
            "avg_pool2d",
            "the fused `avg_pool2d` kernel where listed (every backend), else mean (or sum ÷ taps) over a window view of the padded input",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::Fill, d),
                        (Op::Copy, d),
                        (Op::Reduce(ReduceOp::Mean), d),
                        (Op::Reduce(ReduceOp::Sum), d),
                        (Op::Binary(Div), d),
                    ],
                )
            },
        ),
        op(
            NN,
            "Tensor::scaled_dot_product_attention",
            "the fused `attention` kernel where listed (CUDA: bf16/f16 with head dims 64 and 128, f32 with head dims 32 to 128 in steps of 16; wgpu: f32, f16, bf16, head dims up to 128), without a mask or with one the backend applies (a bool mask as 0 / −inf, read in place as `[outer, inner, L, S]`), else matmul, scale, the mask added, softmax (with the causal mask in the softmax kernel when there is no other mask; a `where` over two i32 aranges otherwise; rows that see no key zeroed), matmul",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::Matmul, d),
                        (Op::Fill, d),
                        (Op::Binary(Mul), d),
                        (Op::Arange, DType::I32),
                        (Op::Compare(Le), DType::I32),
                        (Op::Where, d),
                        (Op::Softmax, d),
                        (Op::Binary(Add), d),
                        (Op::Reduce(ReduceOp::Max), d),
                        (Op::Compare(Eq), d),
                    ],
                )
            },
        ),
        op(
            NN,
            "Tensor::scaled_dot_product_attention_packed",
            "`scaled_dot_product_attention` (fused or composed) on the three `[B, H, T, E]` views of the packed `[B, T, 3·H·E]` input, the heads put back side by side (one copy); one node, whose backward copies the three parts' gradients into one",
            |d| {
                when(
                    float(d),
                    vec![
                        (Op::Matmul, d),
                        (Op::Fill, d),
                        (Op::Binary(Mul), d),
                        (Op::Arange, DType::I32),
                        (Op::Compare(Le), DType::I32),
                        (Op::Where, d),
                        (Op::Softmax, d),
                        (Op::Copy, d),
                    ],
                )
            },
        ),
        op(CONSTRUCTORS, "linspace", "arange, and a fill of the last entry", |d| {
            Some(vec![(Op::Arange, d), (Op::Fill, d)])
        }),
        op(CONSTRUCTORS, "eye", "two i32 aranges compared, cast", |d| {
            Some(vec![
                (Op::Arange, DType::I32),
                (Op::Compare(Eq), DType::I32),
                (Op::Cast(d), DType::Bool),
            ])
        }),
        op(CONSTRUCTORS, "zeros_like, ones_like, full_like", "fill", |d| {
            Some(vec![(Op::Fill, d)])
        }),
        op(
            CONSTRUCTORS,
            "randint",
            "uniform draws (f64 where the device has them, else f32), cast to i64, clamped, shifted, cast",
            |d| {
                when(
                    d != DType::Bool,
                    vec![
                        (Op::RandomUniform, DType::F32),
                        (Op::Cast(I64), DType::F32),
                        (Op::Fill, I64),
                        (Op::Binary(Minimum), I64),
                        (Op::Binary(Add), I64),
                        (Op::Cast(d), I64),
                    ],
                )
            },
        ),
        op(CONSTRUCTORS, "Tensor::rand_with", "the uniform kernel", |d| {
            when(float(d), vec![(Op::RandomUniform, d)])
        }),
        op(CONSTRUCTORS, "Tensor::randn_with", "the normal kernel", |d| {
            when(float(d), vec![(Op::RandomNormal, d)])
        }),
    ]
}
