//! Joining and reshaping ops against host-computed expectations, on the CPU and on every other
//! device that opens: cat, stack, split, split_sizes, chunk, reshape with -1, flatten_dims,
//! expand, repeat, select, flip, roll, tril/triu, pad and permute with negative dims. Inputs
//! include transposed (strided) views and empty tensors; bad input gives typed errors.

mod common;

use cartage::{DType, Device, Error, Result, Tensor};

/// The CPU and every other device that opens here.
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device("ops_shape"));
    devices
}

/// `0, 1, …` as i64 with `shape`.
fn iota(shape: &[usize], device: &Device) -> Result<Tensor> {
    iota_from(0, shape, device)
}

/// `start, start + 1, …` as i64 with `shape`, built by `arange` (no i64 arithmetic, which wgpu
/// lacks).
fn iota_from(start: i64, shape: &[usize], device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let start = start as f64;
    Tensor::arange(start, start + n as f64, 1.0, DType::I64, device)?.reshape(shape)
}

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Every multi-index of `shape` in row-major order.
fn positions(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let st = strides(shape);
    (0..n)
        .map(|lin| shape.iter().zip(&st).map(|(&d, &s)| (lin / s) % d).collect())
        .collect()
}

/// The element at `pos` of the row-major `data` with `shape`.
fn at(data: &[i64], shape: &[usize], pos: &[usize]) -> i64 {
    data[pos.iter().zip(strides(shape)).map(|(p, s)| p * s).sum::<usize>()]
}

/// Host transpose of the last two dims of a rank-2 row-major array.
fn transpose2(data: &[i64], rows: usize, cols: usize) -> Vec<i64> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| data[r * cols + c]))
        .collect()
}

#[test]
fn cat_joins_strided_and_empty_inputs_along_any_dim() -> Result<()> {
    for d in devices() {
        let a = iota(&[2, 3], &d)?;
        // A transposed (strided) input: [3, 2]ᵀ = [2, 3].
        let b_src = iota_from(100, &[3, 2], &d)?;
        let b = b_src.t()?;
        assert!(!b.is_contiguous());
        let empty = Tensor::zeros(&[2, 0], DType::I64, &d)?;
        let c = iota_from(50, &[2, 1], &d)?;
        let out = Tensor::cat(&[&a, &b, &empty, &c], -1)?;
        assert_eq!(out.shape(), &[2, 7]);
        let a_h: Vec<i64> = (0..6).collect();
        let b_h = transpose2(&(100..106).collect::<Vec<_>>(), 3, 2);
        let mut expected = Vec::new();
        for r in 0..2 {
            expected.extend_from_slice(&a_h[r * 3..r * 3 + 3]);
            expected.extend_from_slice(&b_h[r * 3..r * 3 + 3]);
            expected.push(50 + r as i64);
        }
        assert_eq!(out.to_vec::<i64>()?, expected, "{d}");
        // Along dim 0, with an empty input of zero rows.
        let rows = Tensor::cat(&[&a, &Tensor::zeros(&[0, 3], DType::I64, &d)?, &b], 0)?;
        assert_eq!(rows.shape(), &[4, 3]);
        let mut expected = a_h.clone();
        expected.extend_from_slice(&b_h);
        assert_eq!(rows.to_vec::<i64>()?, expected, "{d}");
        // Every input empty.
        let none = Tensor::cat(&[&empty, &empty], 1)?;
        assert_eq!(none.shape(), &[2, 0]);
        // Floats, three dims, the middle one.
        let x = Tensor::ones(&[2, 1, 2], DType::F32, &d)?;
        let y = Tensor::zeros(&[2, 2, 2], DType::F32, &d)?;
        let z = Tensor::cat(&[&x, &y], 1)?;
        assert_eq!(
            z.to_vec::<f32>()?,
            vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
        );
    }
    Ok(())
}

#[test]
fn cat_names_the_input_that_does_not_fit() -> Result<()> {
    let d = Device::cpu();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d)?;
    let b = Tensor::zeros(&[2, 3], DType::F32, &d)?;
    let bad = Tensor::zeros(&[4, 2], DType::F32, &d)?;
    match Tensor::cat(&[&a, &b, &bad], 1) {
        Err(e @ Error::ShapeMismatch { op: "cat", .. }) => {
            let text = e.to_string();
            assert!(text.contains("input 2"), "{text}");
            assert!(text.contains("[4, 2]") && text.contains("[2, 3]"), "{text}");
        }
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    let wrong_rank = Tensor::zeros(&[2, 3, 1], DType::F32, &d)?;
    assert!(matches!(
        Tensor::cat(&[&a, &wrong_rank], 0),
        Err(Error::ShapeMismatch { op: "cat", .. })
    ));
    let ints = Tensor::zeros(&[2, 3], DType::I64, &d)?;
    assert!(matches!(
        Tensor::cat(&[&a, &ints], 0),
        Err(Error::DTypeMismatch { op: "cat", .. })
    ));
    assert!(matches!(
        Tensor::cat(&[], 0),
        Err(Error::InvalidArgument { op: "cat", .. })
    ));
    assert!(matches!(
        Tensor::cat(&[&a, &b], 2),
        Err(Error::DimOutOfRange { op: "cat", dim: 2, .. })
    ));
    let scalar = Tensor::zeros(&[], DType::F32, &d)?;
    assert!(matches!(
        Tensor::cat(&[&scalar], 0),
        Err(Error::InvalidArgument { op: "cat", .. })
    ));
    assert!(matches!(
        Tensor::stack(&[&a, &bad], 0),
        Err(Error::ShapeMismatch { op: "stack", .. })
    ));
    assert!(matches!(
        Tensor::stack(&[&a, &b], 3),
        Err(Error::DimOutOfRange {
            op: "stack",
            dim: 3,
            rank: 2
        })
    ));
    Ok(())
}

#[test]
fn stack_adds_a_dimension() -> Result<()> {
    for d in devices() {
        let a = iota(&[2, 2], &d)?;
        let b = iota_from(10, &[2, 2], &d)?.t()?;
        let s0 = Tensor::stack(&[&a, &b], 0)?;
        assert_eq!(s0.shape(), &[2, 2, 2]);
        assert_eq!(s0.to_vec::<i64>()?, vec![0, 1, 2, 3, 10, 12, 11, 13]);
        let s_last = Tensor::stack(&[&a, &b], -1)?;
        assert_eq!(s_last.shape(), &[2, 2, 2]);
        assert_eq!(s_last.to_vec::<i64>()?, vec![0, 10, 1, 12, 2, 11, 3, 13]);
        let s1 = Tensor::stack(&[&a, &b, &a], 1)?;
        assert_eq!(s1.shape(), &[2, 3, 2]);
        assert_eq!(s1.to_vec::<i64>()?, vec![0, 1, 10, 12, 0, 1, 2, 3, 11, 13, 2, 3]);
    }
    Ok(())
}

#[test]
fn split_split_sizes_and_chunk_are_views() -> Result<()> {
    for d in devices() {
        let x = iota(&[3, 5], &d)?;
        let parts = x.split(2, -1)?;
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].to_vec::<i64>()?, vec![0, 1, 5, 6, 10, 11]);
        assert_eq!(parts[2].to_vec::<i64>()?, vec![4, 9, 14]);
        assert!(parts.iter().all(|p| p.shares_storage(&x)));
        let sized = x.split_sizes(&[1, 0, 2], 0)?;
        assert_eq!(sized.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(), vec![1, 0, 2]);
        assert_eq!(sized[2].to_vec::<i64>()?, (5..15).collect::<Vec<_>>());
        let chunks = x.chunk(2, 1)?;
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[1].to_vec::<i64>()?, vec![3, 4, 8, 9, 13, 14]);
        // torch.chunk gives fewer chunks when fewer are needed: 5 into 4 is 2 + 2 + 1.
        assert_eq!(x.chunk(4, 1)?.len(), 3);
        assert_eq!(x.chunk(9, 1)?.len(), 5);
        // A transposed input splits along its own dims.
        let t = x.t()?.split(4, 0)?;
        assert_eq!(t[1].to_vec::<i64>()?, vec![4, 9, 14]);
        // An empty dimension splits into one empty view.
        let e = Tensor::zeros(&[0, 2], DType::F32, &d)?;
        assert_eq!(e.split(3, 0)?.len(), 1);
    }
    let x = iota(&[3, 5], &Device::cpu())?;
    assert!(matches!(x.split(0, 0), Err(Error::InvalidArgument { op: "split", .. })));
    match x.split_sizes(&[2, 2], 0) {
        Err(e @ Error::InvalidArgument { op: "split_sizes", .. }) => {
            assert!(e.to_string().contains("[2, 2]") && e.to_string().contains('3'), "{e}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(matches!(x.chunk(0, 0), Err(Error::InvalidArgument { op: "chunk", .. })));
    assert!(matches!(x.split(1, -3), Err(Error::DimOutOfRange { .. })));
    Ok(())
}

#[test]
fn reshape_infers_one_size_and_takes_any_integer_type() -> Result<()> {
    let d = Device::cpu();
    let x = iota(&[2, 3, 4], &d)?;
    assert_eq!(x.reshape(&[-1, 4])?.shape(), &[6, 4]);
    assert_eq!(x.reshape(&[2, -1])?.shape(), &[2, 12]);
    let mut reversed = x.shape().to_vec();
    reversed.reverse();
    assert_eq!(x.reshape(&reversed)?.shape(), &[4, 3, 2]);
    assert_eq!(x.reshape(&[3i64, -1, 2])?.shape(), &[3, 4, 2]);
    let dims: &[usize] = &[24];
    assert_eq!(x.reshape(dims)?.to_vec::<i64>()?, (0..24).collect::<Vec<_>>());
    // A strided input that cannot be a view is copied, values in logical order.
    let t = iota(&[3, 4], &d)?.t()?.reshape(&[-1])?;
    assert_eq!(t.to_vec::<i64>()?, transpose2(&(0..12).collect::<Vec<_>>(), 3, 4));
    // An empty tensor: -1 next to a zero size has no single answer.
    let e = Tensor::zeros(&[0, 3], DType::F32, &d)?;
    assert_eq!(e.reshape(&[3, 0])?.shape(), &[3, 0]);
    assert!(matches!(
        e.reshape(&[0, -1]),
        Err(Error::ShapeMismatch { op: "reshape", .. })
    ));
    assert!(matches!(
        x.reshape(&[-1, -1]),
        Err(Error::InvalidArgument { op: "reshape", .. })
    ));
    assert!(matches!(
        x.reshape(&[-1, 5]),
        Err(Error::ShapeMismatch { op: "reshape", .. })
    ));
    match x.reshape(&[4, -2, 3]) {
        Err(e @ Error::InvalidArgument { .. }) => assert!(e.to_string().contains("-2"), "{e}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    Ok(())
}

#[test]
fn flatten_dims_expand_and_select() -> Result<()> {
    for d in devices() {
        let x = iota(&[2, 3, 4], &d)?;
        assert_eq!(x.flatten_dims(0, 1)?.shape(), &[6, 4]);
        assert_eq!(x.flatten_dims(-2, -1)?.shape(), &[2, 12]);
        assert_eq!(x.flatten_dims(1, 1)?.shape(), &[2, 3, 4]);
        assert_eq!(Tensor::zeros(&[], DType::F32, &d)?.flatten_dims(0, -1)?.shape(), &[1]);
        let tf = x.transpose(0, 2)?.flatten_dims(1, 2)?;
        assert_eq!(tf.shape(), &[4, 6]);
        let host: Vec<i64> = (0..24).collect();
        let expected: Vec<i64> = positions(&[4, 3, 2])
            .iter()
            .map(|p| at(&host, &[2, 3, 4], &[p[2], p[1], p[0]]))
            .collect();
        assert_eq!(tf.to_vec::<i64>()?, expected);

        let col = iota(&[3, 1], &d)?;
        let e = col.expand(&[2, -1, 4])?;
        assert_eq!(e.shape(), &[2, 3, 4]);
        assert!(e.shares_storage(&col));
        let expected: Vec<i64> = positions(&[2, 3, 4]).iter().map(|p| p[1] as i64).collect();
        assert_eq!(e.to_vec::<i64>()?, expected);

        let s = x.select(1, -1)?;
        assert_eq!(s.shape(), &[2, 4]);
        assert!(s.shares_storage(&x));
        assert_eq!(s.to_vec::<i64>()?, vec![8, 9, 10, 11, 20, 21, 22, 23]);
        assert_eq!(x.select(-1, 0)?.to_vec::<i64>()?, vec![0, 4, 8, 12, 16, 20]);
        assert_eq!(iota(&[3, 4], &d)?.t()?.select(0, 1)?.to_vec::<i64>()?, vec![1, 5, 9]);
    }
    let x = iota(&[2, 3], &Device::cpu())?;
    assert!(matches!(x.flatten_dims(1, 0), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        x.select(1, 3),
        Err(Error::IndexOutOfRange {
            op: "select",
            index: 3,
            dim: 1,
            size: 3,
            ..
        })
    ));
    assert!(matches!(
        x.select(0, -3),
        Err(Error::IndexOutOfRange {
            op: "select",
            index: -3,
            dim: 0,
            ..
        })
    ));
    assert!(matches!(
        x.expand(&[4, 3]),
        Err(Error::ShapeMismatch { op: "expand", .. })
    ));
    assert!(matches!(
        x.expand(&[3]),
        Err(Error::InvalidArgument { op: "expand", .. })
    ));
    assert!(matches!(
        x.expand(&[-1, 2, 3]),
        Err(Error::InvalidArgument { op: "expand", .. })
    ));
    Ok(())
}

#[test]
fn permute_takes_negative_dims() -> Result<()> {
    let d = Device::cpu();
    let x = iota(&[2, 3, 4], &d)?;
    let p = x.permute(&[-1, 0, -2])?;
    assert_eq!(p.shape(), &[4, 2, 3]);
    let host: Vec<i64> = (0..24).collect();
    let expected: Vec<i64> = positions(&[4, 2, 3])
        .iter()
        .map(|q| at(&host, &[2, 3, 4], &[q[1], q[2], q[0]]))
        .collect();
    assert_eq!(p.to_vec::<i64>()?, expected);
    assert!(matches!(
        x.permute(&[0, 1, -3]),
        Err(Error::InvalidArgument { op: "permute", .. })
    ));
    assert!(matches!(
        x.permute(&[0, 1, -4]),
        Err(Error::InvalidArgument { op: "permute", .. })
    ));
    Ok(())
}

#[test]
fn repeat_tiles_like_torch() -> Result<()> {
    for d in devices() {
        let x = iota(&[2, 3], &d)?.t()?; // [3, 2], strided
        let host = transpose2(&(0..6).collect::<Vec<_>>(), 2, 3);
        let r = x.repeat(&[2, 2, 3])?;
        assert_eq!(r.shape(), &[2, 6, 6]);
        let expected: Vec<i64> = positions(&[2, 6, 6])
            .iter()
            .map(|p| at(&host, &[3, 2], &[p[1] % 3, p[2] % 2]))
            .collect();
        assert_eq!(r.to_vec::<i64>()?, expected);
        assert!(!r.shares_storage(&x));
        assert_eq!(x.repeat(&[0, 1])?.shape(), &[0, 2]);
        assert_eq!(Tensor::zeros(&[0], DType::F32, &d)?.repeat(&[3])?.shape(), &[0]);
    }
    let x = iota(&[2, 3], &Device::cpu())?;
    assert!(matches!(
        x.repeat(&[2]),
        Err(Error::InvalidArgument { op: "repeat", .. })
    ));
    Ok(())
}

#[test]
fn flip_and_roll() -> Result<()> {
    for d in devices() {
        let x = iota(&[2, 3, 4], &d)?;
        let host: Vec<i64> = (0..24).collect();
        let f = x.flip(&[0, -1])?;
        let expected: Vec<i64> = positions(&[2, 3, 4])
            .iter()
            .map(|p| at(&host, &[2, 3, 4], &[1 - p[0], p[1], 3 - p[2]]))
            .collect();
        assert_eq!(f.to_vec::<i64>()?, expected);
        let flipped_none = x.flip(&[])?;
        assert!(!flipped_none.shares_storage(&x));
        assert_eq!(flipped_none.to_vec::<i64>()?, host);
        // A transposed input.
        let ft = x.transpose(0, 2)?.flip(&[1])?;
        let expected: Vec<i64> = positions(&[4, 3, 2])
            .iter()
            .map(|p| at(&host, &[2, 3, 4], &[p[2], 2 - p[1], p[0]]))
            .collect();
        assert_eq!(ft.to_vec::<i64>()?, expected);

        for shift in [-5isize, -1, 0, 2, 4, 7] {
            let r = x.roll(shift, 1)?;
            let expected: Vec<i64> = positions(&[2, 3, 4])
                .iter()
                .map(|p| {
                    let src = (p[1] as isize - shift).rem_euclid(3) as usize;
                    at(&host, &[2, 3, 4], &[p[0], src, p[2]])
                })
                .collect();
            assert_eq!(r.to_vec::<i64>()?, expected, "shift {shift}");
        }
        assert_eq!(Tensor::zeros(&[0, 2], DType::F32, &d)?.roll(3, 0)?.shape(), &[0, 2]);
    }
    let x = iota(&[2, 3], &Device::cpu())?;
    assert!(matches!(
        x.flip(&[1, -1]),
        Err(Error::InvalidArgument { op: "flip", .. })
    ));
    assert!(matches!(x.flip(&[2]), Err(Error::DimOutOfRange { op: "flip", .. })));
    assert!(matches!(x.roll(1, 2), Err(Error::DimOutOfRange { op: "roll", .. })));
    Ok(())
}

#[test]
fn tril_and_triu_match_the_host() -> Result<()> {
    for d in devices() {
        let shape = [2, 3, 4];
        let x = iota_from(1, &shape, &d)?;
        let host: Vec<i64> = (1..25).collect();
        for k in -3i64..=4 {
            let lower: Vec<i64> = positions(&shape)
                .iter()
                .map(|p| {
                    if p[2] as i64 - p[1] as i64 <= k {
                        at(&host, &shape, p)
                    } else {
                        0
                    }
                })
                .collect();
            let upper: Vec<i64> = positions(&shape)
                .iter()
                .map(|p| {
                    if p[2] as i64 - p[1] as i64 >= k {
                        at(&host, &shape, p)
                    } else {
                        0
                    }
                })
                .collect();
            assert_eq!(x.tril_with(k)?.to_vec::<i64>()?, lower, "tril({k}) on {d}");
            assert_eq!(x.triu_with(k)?.to_vec::<i64>()?, upper, "triu({k}) on {d}");
            if k == 0 {
                // PyTorch's default diagonal is 0.
                assert_eq!(x.tril()?.to_vec::<i64>()?, lower, "tril() on {d}");
                assert_eq!(x.triu()?.to_vec::<i64>()?, upper, "triu() on {d}");
            }
        }
        // A transposed float input keeps its dtype.
        let f = Tensor::ones(&[3, 2], DType::F32, &d)?.t()?;
        assert_eq!(f.tril()?.to_vec::<f32>()?, vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0]);
        assert_eq!(Tensor::zeros(&[0, 3], DType::F32, &d)?.triu()?.shape(), &[0, 3]);
    }
    let v = Tensor::zeros(&[3], DType::F32, &Device::cpu())?;
    assert!(matches!(v.tril(), Err(Error::InvalidArgument { op: "tril", .. })));
    Ok(())
}

#[test]
fn pad_pairs_start_from_the_last_dim() -> Result<()> {
    for d in devices() {
        let x = iota(&[2, 3], &d)?.t()?; // [3, 2] strided
        let host = transpose2(&(0..6).collect::<Vec<_>>(), 2, 3);
        let y = x.pad(&[1, 2, 0, 1], -7)?;
        assert_eq!(y.shape(), &[4, 5]);
        let expected: Vec<i64> = positions(&[4, 5])
            .iter()
            .map(|p| {
                let (r, c) = (p[0], p[1] as isize - 1);
                if r < 3 && (0..2).contains(&c) {
                    at(&host, &[3, 2], &[r, c as usize])
                } else {
                    -7
                }
            })
            .collect();
        assert_eq!(y.to_vec::<i64>()?, expected);
        let f = Tensor::zeros(&[0, 2], DType::F32, &d)?.pad(&[0, 0, 1, 1], 2.5)?;
        assert_eq!(f.to_vec::<f32>()?, vec![2.5; 4]);
        assert_eq!(x.pad(&[], 0)?.to_vec::<i64>()?, host);
    }
    let x = iota(&[2, 3], &Device::cpu())?;
    assert!(matches!(x.pad(&[1], 0), Err(Error::InvalidArgument { op: "pad", .. })));
    assert!(matches!(
        x.pad(&[1, 1, 1, 1, 1, 1], 0),
        Err(Error::InvalidArgument { op: "pad", .. })
    ));
    Ok(())
}
