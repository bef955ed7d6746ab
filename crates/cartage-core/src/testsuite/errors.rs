//! Malformed kernels are errors, never panics or out-of-bounds accesses (DESIGN invariant 8):
//! layouts beyond their buffers, operands whose shapes or dtypes do not fit the op, dimensions
//! out of range, float indices (R27), and operands whose buffer starts at a byte offset that is
//! not a multiple of their element size (a misaligned access is undefined behaviour on the host
//! and a fault or a wrong answer on a GPU).

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::dtype::{DType, Scalar};
use crate::kernel::{BinaryOp, CompareOp, Kernel, Op, ReduceOp, TensorArg, UnaryOp};
use crate::layout::{Dims, Layout};

use super::buffers::DeviceBuffer;
use super::harness::Harness;

/// Require `kernel` to be refused with an error (from the launch or the synchronize after it).
fn expect_error(h: &Harness, what: &str, kernel: Kernel) {
    h.count_check();
    let backend = h.backend();
    let outcome = catch_unwind(AssertUnwindSafe(|| h.run(&kernel).and_then(|()| backend.synchronize())));
    match outcome {
        Ok(Err(_)) => {}
        Ok(Ok(())) => h.fail(format!("{what}: the malformed kernel was accepted")),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            h.fail(format!(
                "{what}: launch panicked instead of returning an error: {message}"
            ));
        }
    }
}

/// A float dtype the backend runs `op` for, if any.
fn float_for(h: &Harness, op: Op) -> Option<DType> {
    [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(op, d))
}

fn buf(h: &Harness, dtype: DType, len: usize) -> DeviceBuffer {
    h.upload(dtype, &vec![1.0; len])
}

fn layout(shape: &[usize]) -> Layout {
    Layout::contiguous(shape).expect("small")
}

/// Every malformed kernel below must return an error.
pub fn malformed_kernels(h: &Harness) {
    bounds(h);
    shapes_and_dtypes(h);
    reductions_and_selections(h);
    misaligned(h);
}

/// A contiguous `[n]` operand over `buf` whose buffer slice starts `byte_offset` bytes into the
/// allocation (`buf` holds at least `n + 1` elements, so the slice fits).
fn shifted(buf: &DeviceBuffer, byte_offset: usize, n: usize) -> TensorArg {
    let buffer = buf
        .slice()
        .slice(byte_offset, n * buf.dtype.size_in_bytes())
        .expect("suite bug: the shifted slice fits its allocation");
    TensorArg {
        buffer,
        layout: layout(&[n]),
        dtype: buf.dtype,
    }
}

/// Operands of 4- and 8-byte dtypes whose buffer starts at a byte offset that is not a multiple
/// of the element size, as input, output or index, must be refused with an error, never run.
fn misaligned(h: &Harness) {
    const N: usize = 8;
    for (dtype, offsets) in [
        (DType::F32, &[1usize, 2][..]),
        (DType::I64, &[1, 4][..]),
        (DType::F64, &[1, 4][..]),
    ] {
        for &at in offsets {
            let (raw, ok, out) = (buf(h, dtype, N + 1), buf(h, dtype, N), buf(h, dtype, N));
            let bad = shifted(&raw, at, N);
            let name = |what: &str| format!("{what} with a {dtype} operand at byte offset {at}");
            if h.supports(Op::Fill, dtype) {
                let kernel = Kernel::Fill {
                    out: bad.clone(),
                    value: Scalar::Int(1),
                };
                expect_error(h, &name("fill into it"), kernel);
            }
            if h.supports(Op::Copy, dtype) {
                let kernel = Kernel::Copy {
                    input: bad.clone(),
                    out: out.contiguous(&[N]),
                };
                expect_error(h, &name("copy from it"), kernel);
                let kernel = Kernel::Copy {
                    input: ok.contiguous(&[N]),
                    out: bad.clone(),
                };
                expect_error(h, &name("copy into it"), kernel);
            }
            if h.supports(Op::Unary(UnaryOp::Neg), dtype) {
                let kernel = Kernel::Unary {
                    op: UnaryOp::Neg,
                    input: bad.clone(),
                    out: out.contiguous(&[N]),
                };
                expect_error(h, &name("neg of it"), kernel);
            }
            if h.supports(Op::Binary(BinaryOp::Add), dtype) {
                let kernel = Kernel::Binary {
                    op: BinaryOp::Add,
                    lhs: ok.contiguous(&[N]),
                    rhs: bad.clone(),
                    out: out.contiguous(&[N]),
                };
                expect_error(h, &name("add of it"), kernel);
            }
            if h.supports(Op::Reduce(ReduceOp::Max), dtype) {
                let kernel = Kernel::Reduce {
                    op: ReduceOp::Max,
                    input: bad.clone(),
                    dims: [0].into_iter().collect(),
                    out: out.contiguous(&[1]),
                };
                expect_error(h, &name("max of it"), kernel);
            }
            if h.supports(Op::Matmul, dtype) {
                let kernel = Kernel::Matmul {
                    lhs: TensorArg {
                        layout: layout(&[1, 2, 4]),
                        ..bad.clone()
                    },
                    rhs: ok.arg(&layout(&[1, 4, 2])),
                    out: out.arg(&layout(&[1, 2, 2])),
                };
                expect_error(h, &name("matmul of it"), kernel);
            }
            if dtype == DType::I64 {
                misaligned_index_and_arg_output(h, &bad, at);
            }
        }
    }
}

/// A misaligned i64 operand as the index of `Gather`/`IndexSelect` and as the output of
/// `ArgMax` (`bad`: `[8]` i64 at byte offset `at`).
fn misaligned_index_and_arg_output(h: &Harness, bad: &TensorArg, at: usize) {
    let Some(f) = float_for(h, Op::IndexSelect) else { return };
    let (input, out) = (buf(h, f, 8), buf(h, f, 8));
    let zeros = h.upload(DType::I64, &[0.0; 9]);
    let bad_zeros = shifted(&zeros, at, 8);
    let name = |what: &str| format!("{what} by an i64 index at byte offset {at}");
    let kernel = Kernel::IndexSelect {
        input: input.arg(&layout(&[2, 4])),
        index: TensorArg {
            layout: layout(&[2]),
            ..bad_zeros.clone()
        },
        dim: 0,
        out: out.arg(&layout(&[2, 4])),
    };
    expect_error(h, &name("index_select"), kernel);
    if h.supports(Op::Gather, f) {
        let kernel = Kernel::Gather {
            input: input.arg(&layout(&[2, 4])),
            index: TensorArg {
                layout: layout(&[2, 4]),
                ..bad_zeros
            },
            dim: 1,
            out: out.arg(&layout(&[2, 4])),
        };
        expect_error(h, &name("gather"), kernel);
    }
    if h.supports(Op::Reduce(ReduceOp::ArgMax), f) {
        let kernel = Kernel::Reduce {
            op: ReduceOp::ArgMax,
            input: input.arg(&layout(&[8])),
            dims: [0].into_iter().collect(),
            out: TensorArg {
                layout: layout(&[1]),
                ..bad.clone()
            },
        };
        expect_error(h, &format!("argmax into an i64 output at byte offset {at}"), kernel);
    }
}

fn bounds(h: &Harness) {
    let Some(f) = float_for(h, Op::Fill) else { return };
    let small = buf(h, f, 10);
    expect_error(
        h,
        "fill of 100 elements into a buffer of 10",
        Kernel::Fill {
            out: small.arg(&layout(&[100])),
            value: Scalar::Float(0.0),
        },
    );
    let offset = Layout::from_parts(&[5], &[1], 8).expect("small");
    expect_error(
        h,
        "fill through a view starting at element 8 of 10 with 5 elements",
        Kernel::Fill {
            out: small.arg(&offset),
            value: Scalar::Float(0.0),
        },
    );
    if let Some(f) = float_for(h, Op::Unary(UnaryOp::Neg)) {
        let (input, out) = (buf(h, f, 10), buf(h, f, 100));
        let strided = Layout::from_parts(&[10], &[3], 0).expect("small");
        expect_error(
            h,
            "neg reading 10 elements with stride 3 from a buffer of 10",
            Kernel::Unary {
                op: UnaryOp::Neg,
                input: input.arg(&strided),
                out: out.arg(&layout(&[10])),
            },
        );
    }
}

fn shapes_and_dtypes(h: &Harness) {
    if let Some(f) = float_for(h, Op::Binary(BinaryOp::Add)) {
        let (a, out) = (buf(h, f, 4), buf(h, f, 4));
        expect_error(
            h,
            "add of [3] and [4] into [4]",
            Kernel::Binary {
                op: BinaryOp::Add,
                lhs: a.arg(&layout(&[3])),
                rhs: a.arg(&layout(&[4])),
                out: out.arg(&layout(&[4])),
            },
        );
        let other = if f == DType::F32 { DType::F64 } else { DType::F32 };
        let b = buf(h, other, 4);
        expect_error(
            h,
            "add of two dtypes",
            Kernel::Binary {
                op: BinaryOp::Add,
                lhs: a.arg(&layout(&[4])),
                rhs: b.arg(&layout(&[4])),
                out: out.arg(&layout(&[4])),
            },
        );
        let wrong_out = buf(h, other, 4);
        expect_error(
            h,
            "neg into an output of another dtype",
            Kernel::Unary {
                op: UnaryOp::Neg,
                input: a.arg(&layout(&[4])),
                out: wrong_out.arg(&layout(&[4])),
            },
        );
        expect_error(
            h,
            "copy between two dtypes",
            Kernel::Copy {
                input: a.arg(&layout(&[4])),
                out: wrong_out.arg(&layout(&[4])),
            },
        );
        expect_error(
            h,
            "copy of [4] into [2, 2]",
            Kernel::Copy {
                input: a.arg(&layout(&[4])),
                out: out.arg(&layout(&[2, 2])),
            },
        );
        expect_error(
            h,
            "cast of [4] into [3]",
            Kernel::Cast {
                input: a.arg(&layout(&[4])),
                out: wrong_out.arg(&layout(&[3])),
            },
        );
        expect_error(
            h,
            "compare into a non-bool output",
            Kernel::Compare {
                op: CompareOp::Lt,
                lhs: a.arg(&layout(&[4])),
                rhs: a.arg(&layout(&[4])),
                out: out.arg(&layout(&[4])),
            },
        );
        expect_error(
            h,
            "where with a non-bool condition",
            Kernel::Where {
                cond: a.arg(&layout(&[4])),
                on_true: a.arg(&layout(&[4])),
                on_false: a.arg(&layout(&[4])),
                out: out.arg(&layout(&[4])),
            },
        );
    }
    if let Some(f) = float_for(h, Op::Matmul) {
        let (a, out) = (buf(h, f, 64), buf(h, f, 64));
        let cases = [
            ("matmul of rank-2 operands", [vec![2, 3], vec![3, 2], vec![2, 2]]),
            (
                "matmul with K 3 against 4",
                [vec![1, 2, 3], vec![1, 4, 5], vec![1, 2, 5]],
            ),
            (
                "matmul into a wrong output shape",
                [vec![1, 2, 3], vec![1, 3, 5], vec![1, 2, 4]],
            ),
            (
                "matmul with batches 2 and 3",
                [vec![2, 2, 3], vec![3, 3, 5], vec![3, 2, 5]],
            ),
        ];
        for (what, [l, r, o]) in cases {
            expect_error(
                h,
                what,
                Kernel::Matmul {
                    lhs: a.arg(&layout(&l)),
                    rhs: a.arg(&layout(&r)),
                    out: out.arg(&layout(&o)),
                },
            );
        }
    }
}

fn reductions_and_selections(h: &Harness) {
    if let Some(f) = float_for(h, Op::Reduce(ReduceOp::Sum)) {
        let (a, out) = (buf(h, f, 12), buf(h, f, 12));
        let dims = |d: &[usize]| d.iter().copied().collect::<Dims>();
        for (what, d, o) in [
            ("sum over dimension 2 of a rank-2 input", dims(&[2]), vec![3, 1]),
            ("sum into a wrong output shape", dims(&[1]), vec![3, 2]),
        ] {
            expect_error(
                h,
                what,
                Kernel::Reduce {
                    op: ReduceOp::Sum,
                    input: a.arg(&layout(&[3, 4])),
                    dims: d,
                    out: out.arg(&layout(&o)),
                },
            );
        }
        if h.supports(Op::Reduce(ReduceOp::ArgMax), f) {
            let idx = buf(h, DType::I64, 12);
            expect_error(
                h,
                "argmax over two dimensions",
                Kernel::Reduce {
                    op: ReduceOp::ArgMax,
                    input: a.arg(&layout(&[3, 4])),
                    dims: dims(&[0, 1]),
                    out: idx.arg(&layout(&[1, 1])),
                },
            );
            expect_error(
                h,
                "argmax into a float output",
                Kernel::Reduce {
                    op: ReduceOp::ArgMax,
                    input: a.arg(&layout(&[3, 4])),
                    dims: dims(&[1]),
                    out: out.arg(&layout(&[3, 1])),
                },
            );
        }
    }
    if let Some(f) = float_for(h, Op::Softmax) {
        let (a, out) = (buf(h, f, 12), buf(h, f, 12));
        expect_error(
            h,
            "softmax over dimension 2 of a rank-2 input",
            Kernel::Softmax {
                input: a.arg(&layout(&[3, 4])),
                dim: 2,
                log: false,
                causal: false,
                out: out.arg(&layout(&[3, 4])),
            },
        );
    }
    if let Some(f) = float_for(h, Op::Gather) {
        let (a, out, float_index, index) = (
            buf(h, f, 12),
            buf(h, f, 12),
            buf(h, f, 12),
            h.upload(DType::I64, &[0.0; 12]),
        );
        let cases = [
            ("gather with f32-dtype indices", &float_index, vec![3, 4], 0),
            ("gather with an index of another rank", &index, vec![12], 0),
            ("gather along dimension 2 of a rank-2 input", &index, vec![3, 4], 2),
        ];
        for (what, idx, shape, dim) in cases {
            expect_error(
                h,
                what,
                Kernel::Gather {
                    input: a.arg(&layout(&[3, 4])),
                    index: idx.arg(&layout(&shape)),
                    dim,
                    out: out.arg(&layout(&shape)),
                },
            );
        }
    }
    if let Some(f) = float_for(h, Op::IndexSelect) {
        let (a, out, float_index, index) = (
            buf(h, f, 12),
            buf(h, f, 12),
            buf(h, f, 12),
            h.upload(DType::I64, &[0.0; 12]),
        );
        expect_error(
            h,
            "index_select with float indices",
            Kernel::IndexSelect {
                input: a.arg(&layout(&[3, 4])),
                index: float_index.arg(&layout(&[2])),
                dim: 0,
                out: out.arg(&layout(&[2, 4])),
            },
        );
        expect_error(
            h,
            "index_select with a rank-2 index",
            Kernel::IndexSelect {
                input: a.arg(&layout(&[3, 4])),
                index: index.arg(&layout(&[2, 1])),
                dim: 0,
                out: out.arg(&layout(&[2, 4])),
            },
        );
    }
}
