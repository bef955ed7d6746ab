//! Slicing and writes at indices against host-computed expectations, on the CPU and on every
//! other device that opens: `i(..)` with ranges, steps and single indices (views), masked_fill,
//! scatter, scatter_add, index_add, one_hot, nonzero (a counted host sync) and embedding.
//! Bad input: out-of-range slices, a step of 0, scatter indices out of range.

mod common;

use cartage::{DType, Device, Error, Result, SliceItem, Tensor, s, stats};

/// The CPU and every other device that opens here.
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device("ops_index"));
    devices
}

/// `0, 1, …` as i64 with `shape`.
fn iota(shape: &[usize], device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    Tensor::arange(0.0, n as f64, 1.0, DType::I64, device)?.reshape(shape)
}

/// What a slice keeps of each dimension: the entries, and whether the dimension stays.
type Keep = Vec<(Vec<usize>, bool)>;

/// Host reference of a slice of the row-major `0..numel` array of `shape`: per dimension the
/// kept entries (`None`: a single index, dimension dropped).
fn host_slice(shape: &[usize], keep: &[(Vec<usize>, bool)]) -> (Vec<usize>, Vec<i64>) {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let mut lists: Vec<(Vec<usize>, bool)> = keep.to_vec();
    for &size in &shape[keep.len()..] {
        lists.push(((0..size).collect(), true));
    }
    let out_shape: Vec<usize> = lists.iter().filter(|(_, k)| *k).map(|(l, _)| l.len()).collect();
    let mut values = vec![0i64];
    for (d, (list, _)) in lists.iter().enumerate() {
        let stride = strides[d];
        values = values
            .iter()
            .flat_map(|&base| list.iter().map(move |&i| base + (i * stride) as i64))
            .collect();
    }
    (out_shape, values)
}

fn range(a: usize, b: usize, step: usize) -> (Vec<usize>, bool) {
    ((a..b).step_by(step).collect(), true)
}

fn index(i: usize) -> (Vec<usize>, bool) {
    (vec![i], false)
}

#[test]
fn slices_are_views_matching_the_host() -> Result<()> {
    for d in devices() {
        let shape = [4, 5, 6];
        let x = iota(&shape, &d)?;
        let cases: Vec<(Tensor, Keep)> = vec![
            (x.i((1..3, .., 2))?, vec![range(1, 3, 1), range(0, 5, 1), index(2)]),
            (x.i(2)?, vec![index(2)]),
            (x.i(-1)?, vec![index(3)]),
            (x.i((.., -2..))?, vec![range(0, 4, 1), range(3, 5, 1)]),
            (
                x.i((..2, ..=1, s(1, None, 1)))?,
                vec![range(0, 2, 1), range(0, 2, 1), range(1, 6, 1)],
            ),
            (
                x.i((s(None, None, 2), 1.., s(1, -1, 3)))?,
                vec![range(0, 4, 2), range(1, 5, 1), range(1, 5, 3)],
            ),
            (x.i((3, s(0, 5, 2), -6))?, vec![index(3), range(0, 5, 2), index(0)]),
            (x.i((1..1,))?, vec![range(1, 1, 1)]),
            (x.i(..)?, vec![]),
            (
                x.i((.., 4, s(5, None, 4)))?,
                vec![range(0, 4, 1), index(4), range(5, 6, 1)],
            ),
            (
                x.i(vec![SliceItem::Index(1), s(None, 3usize, 1)])?,
                vec![index(1), range(0, 3, 1)],
            ),
        ];
        for (n, (got, keep)) in cases.iter().enumerate() {
            let (shape_h, values) = host_slice(&shape, keep);
            assert_eq!(got.shape(), &shape_h[..], "case {n} on {d}");
            assert_eq!(got.to_vec::<i64>()?, values, "case {n} on {d}");
            assert!(got.shares_storage(&x), "case {n} is a view");
        }
        // A slice of a transposed view: x.t() is [6, 5, 4] (dims reversed).
        let t = x.permute(&[2, 1, 0])?;
        let got = t.i((s(1, None, 2), 3))?;
        assert_eq!(got.shape(), &[3, 4]);
        let expected: Vec<i64> = [1usize, 3, 5]
            .iter()
            .flat_map(|&a| (0..4).map(move |c| (c * 30 + 3 * 6 + a) as i64))
            .collect();
        assert_eq!(got.to_vec::<i64>()?, expected);
        // An empty tensor slices to empty views.
        let e = Tensor::zeros(&[0, 3], DType::F32, &d)?;
        assert_eq!(e.i((.., 1..))?.shape(), &[0, 2]);
    }
    Ok(())
}

#[test]
fn bad_slices_name_the_dim_and_value() -> Result<()> {
    let x = iota(&[4, 5], &Device::cpu())?;
    assert!(matches!(
        x.i((1, 5)),
        Err(Error::IndexOutOfRange {
            op: "i",
            index: 5,
            dim: 1,
            size: 5,
            ..
        })
    ));
    assert!(matches!(
        x.i(-5),
        Err(Error::IndexOutOfRange {
            op: "i",
            index: -5,
            dim: 0,
            size: 4,
            ..
        })
    ));
    // Huge values are errors, never a wrapped index or an overflow.
    assert!(matches!(x.i(usize::MAX), Err(Error::IndexOutOfRange { dim: 0, .. })));
    assert!(matches!(
        x.i((.., ..=usize::MAX)),
        Err(Error::InvalidArgument { op: "i", .. })
    ));
    assert_eq!(x.i((.., s(1, None, i64::MAX)))?.to_vec::<i64>()?, vec![1, 6, 11, 16]);
    let text = |r: Result<Tensor>| match r {
        Err(e @ Error::InvalidArgument { op: "i", .. }) => e.to_string(),
        other => panic!("expected InvalidArgument from `i`, got {other:?}"),
    };
    let msg = text(x.i((.., 2..9)));
    assert!(msg.contains("dimension 1") && msg.contains('9'), "{msg}");
    let msg = text(x.i((-7..,)));
    assert!(msg.contains("dimension 0") && msg.contains("-7"), "{msg}");
    let msg = text(x.i((.., s(0, 4, 0))));
    assert!(msg.contains("dimension 1") && msg.contains("step 0"), "{msg}");
    let msg = text(x.i(s(None, None, -1)));
    assert!(msg.contains("step -1"), "{msg}");
    let msg = text(x.i(s(3, 1, 1)));
    assert!(msg.contains("start 3") && msg.contains("end 1"), "{msg}");
    let msg = text(x.i((0, 0, 0)));
    assert!(msg.contains("rank 2"), "{msg}");
    Ok(())
}

#[test]
fn masked_fill_broadcasts_the_mask() -> Result<()> {
    for d in devices() {
        let x = iota(&[2, 3], &d)?.to_dtype(DType::F32)?.t()?; // [3, 2] strided
        let mask = Tensor::from_slice(&[true, false], &[2], &d)?;
        let y = x.masked_fill(&mask, -1.5)?;
        assert_eq!(y.to_vec::<f32>()?, vec![-1.5, 3.0, -1.5, 4.0, -1.5, 5.0]);
        let ints = iota(&[4], &d)?;
        let m = Tensor::from_slice(&[false, false, true, true], &[4], &d)?;
        assert_eq!(ints.masked_fill(&m, 9)?.to_vec::<i64>()?, vec![0, 1, 9, 9]);
        let floats = ints.to_dtype(DType::F32)?;
        let m = floats.gt(&Tensor::full(&[], 1, DType::F32, &d)?)?;
        assert_eq!(floats.masked_fill(&m, 9)?.to_vec::<f32>()?, vec![0.0, 1.0, 9.0, 9.0]);
    }
    let d = Device::cpu();
    let x = Tensor::zeros(&[2, 3], DType::F32, &d)?;
    let wide = Tensor::from_slice(&[true; 4], &[4], &d)?;
    assert!(matches!(
        x.masked_fill(&wide, 0.0),
        Err(Error::ShapeMismatch { op: "masked_fill", .. })
    ));
    let float_mask = Tensor::zeros(&[3], DType::F32, &d)?;
    assert!(matches!(
        x.masked_fill(&float_mask, 0.0),
        Err(Error::WrongDType { op: "masked_fill", .. })
    ));
    Ok(())
}

#[test]
fn scatter_and_scatter_add_match_the_host() -> Result<()> {
    for d in devices() {
        // Along dim 1 of [3, 4], index [3, 2] (a prefix box of src [3, 3]).
        let base = iota(&[3, 4], &d)?.to_dtype(DType::F32)?;
        let idx_h: Vec<i64> = vec![3, 0, 1, 1, 2, 0];
        let index = Tensor::from_slice(&idx_h, &[3, 2], &d)?;
        let src_h: Vec<f32> = (0..9).map(|v| 100.0 + v as f32).collect();
        let src = Tensor::from_slice(&src_h, &[3, 3], &d)?;
        let mut assign: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut add = assign.clone();
        for r in 0..3 {
            for c in 0..2 {
                let j = idx_h[r * 2 + c] as usize;
                add[r * 4 + j] += src_h[r * 3 + c];
                assign[r * 4 + j] = src_h[r * 3 + c];
            }
        }
        // Row 1 writes column 1 twice: assign keeps one of the two values.
        let got = base.scatter(1, &index, &src)?.to_vec::<f32>()?;
        for (i, (&g, &e)) in got.iter().zip(&assign).enumerate() {
            if i == 5 {
                assert!(g == src_h[3] || g == src_h[4], "{got:?}");
            } else {
                assert_eq!(g, e, "element {i}: {got:?} vs {assign:?}");
            }
        }
        assert_eq!(base.scatter_add(-1, &index, &src)?.to_vec::<f32>()?, add);
        // The input is unchanged (functional).
        assert_eq!(base.to_vec::<f32>()?, (0..12).map(|v| v as f32).collect::<Vec<_>>());
        // A transposed destination and an i32 index along dim 0.
        let dest = iota(&[2, 3], &d)?.t()?; // [3, 2]
        let index = Tensor::from_slice(&[2i32, 0], &[1, 2], &d)?;
        let src = Tensor::from_slice(&[7i64, 8], &[1, 2], &d)?;
        let got = dest.scatter_add(0, &index, &src)?;
        assert_eq!(got.to_vec::<i64>()?, vec![0, 11, 1, 4, 9, 5]);
        // An empty index writes nothing.
        let none = Tensor::zeros(&[0, 2], DType::I64, &d)?;
        assert_eq!(dest.scatter(0, &none, &src)?.to_vec::<i64>()?, dest.to_vec::<i64>()?);
    }
    Ok(())
}

#[test]
fn scatter_index_out_of_range_is_an_error() -> Result<()> {
    for d in devices() {
        let base = Tensor::zeros(&[2, 3], DType::F32, &d)?;
        let src = Tensor::ones(&[2, 3], DType::F32, &d)?;
        for bad in [3i64, -1] {
            let index = Tensor::from_slice(&[0i64, bad], &[1, 2], &d)?;
            let got = base.scatter(1, &index, &src).and_then(|t| t.to_vec_f64());
            let named = matches!(got, Err(Error::IndexOutOfRange { index, size: 3, .. }) if index == bad);
            assert!(named, "scatter with {bad} on {d}: {got:?}");
            assert!(
                matches!(
                    base.scatter_add(1, &index, &src).and_then(|t| t.to_vec_f64()),
                    Err(Error::IndexOutOfRange { .. })
                ),
                "scatter_add with {bad} on {d}"
            );
            let row = Tensor::from_slice(&[bad], &[1], &d)?;
            assert!(
                matches!(
                    base.t()?
                        .index_add(0, &row, &src.t()?.narrow(0, 0, 1)?)
                        .and_then(|t| t.to_vec_f64()),
                    Err(Error::IndexOutOfRange { .. })
                ),
                "index_add with {bad} on {d}"
            );
        }
    }
    let d = Device::cpu();
    let base = Tensor::zeros(&[2, 3], DType::F32, &d)?;
    let src = Tensor::ones(&[2, 3], DType::F32, &d)?;
    let float_index = Tensor::zeros(&[2, 3], DType::F32, &d)?;
    assert!(matches!(
        base.scatter(0, &float_index, &src),
        Err(Error::WrongDType { .. })
    ));
    let too_big = Tensor::zeros(&[2, 4], DType::I64, &d)?;
    assert!(matches!(
        base.scatter(0, &too_big, &src),
        Err(Error::ShapeMismatch { .. })
    ));
    let ints = Tensor::ones(&[2, 3], DType::I64, &d)?;
    let index = Tensor::zeros(&[2, 3], DType::I64, &d)?;
    assert!(matches!(
        base.scatter(0, &index, &ints),
        Err(Error::DTypeMismatch { .. })
    ));
    Ok(())
}

#[test]
fn index_add_adds_whole_slices() -> Result<()> {
    for d in devices() {
        let base = iota(&[3, 4], &d)?.to_dtype(DType::F32)?;
        let idx_h = [2i64, 0, 2];
        let index = Tensor::from_slice(&idx_h, &[3], &d)?;
        let src_h: Vec<f32> = (0..9).map(|v| v as f32 * 10.0).collect();
        let src = Tensor::from_slice(&src_h, &[3, 3], &d)?.t()?; // [3, 3] strided
        let mut expected: Vec<f32> = (0..12).map(|v| v as f32).collect();
        // Along dim 1: column j of src is added to column idx[j] of base.
        for r in 0..3 {
            for (j, &k) in idx_h.iter().enumerate() {
                expected[r * 4 + k as usize] += src_h[j * 3 + r];
            }
        }
        assert_eq!(base.index_add(1, &index, &src)?.to_vec::<f32>()?, expected);
        // Along dim 0 with an i32 index.
        let rows = Tensor::from_slice(&[1i32, 1], &[2], &d)?;
        let ones = Tensor::ones(&[2, 4], DType::F32, &d)?;
        let got = base.index_add(0, &rows, &ones)?.to_vec::<f32>()?;
        let mut expected: Vec<f32> = (0..12).map(|v| v as f32).collect();
        expected[4..8].iter_mut().for_each(|v| *v += 2.0);
        assert_eq!(got, expected);
    }
    let d = Device::cpu();
    let base = Tensor::zeros(&[3, 4], DType::F32, &d)?;
    let index = Tensor::zeros(&[2], DType::I64, &d)?;
    match base.index_add(0, &index, &Tensor::zeros(&[3, 4], DType::F32, &d)?) {
        Err(e @ Error::ShapeMismatch { op: "index_add", .. }) => assert!(e.to_string().contains("[2, 4]"), "{e}"),
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    let index2 = Tensor::zeros(&[2, 1], DType::I64, &d)?;
    assert!(matches!(
        base.index_add(0, &index2, &base),
        Err(Error::ShapeMismatch { op: "index_add", .. })
    ));
    Ok(())
}

#[test]
fn one_hot_nonzero_and_embedding() -> Result<()> {
    for d in devices() {
        let ids = Tensor::from_slice(&[1i64, 0, 3, 3], &[2, 2], &d)?;
        let oh = ids.one_hot(4)?;
        assert_eq!((oh.shape(), oh.dtype()), (&[2usize, 2, 4][..], DType::I64));
        let expected: Vec<i64> = [1usize, 0, 3, 3]
            .iter()
            .flat_map(|&c| (0..4).map(move |k| i64::from(k == c)))
            .collect();
        assert_eq!(oh.to_vec::<i64>()?, expected);
        assert_eq!(
            ids.t()?.to_dtype(DType::I32)?.one_hot(4)?.to_vec::<i64>()?[..4],
            [0, 1, 0, 0]
        );
        for bad in [4i64, -1] {
            let ids = Tensor::from_slice(&[0i64, bad], &[2], &d)?;
            let read = ids.one_hot(4).and_then(|t| t.to_vec::<i64>());
            assert!(
                matches!(read, Err(Error::IndexOutOfRange { .. })),
                "one_hot of {bad}: {read:?}"
            );
        }

        let x = Tensor::from_slice(&[0.0f32, 2.0, 0.0, -1.0, 0.0, 5.0], &[2, 3], &d)?;
        let line = line!() + 2;
        let before = stats().syncs_at(file!(), line);
        let nz = x.t()?.nonzero()?;
        let syncs = stats().syncs_at(file!(), line) - before;
        assert_eq!(syncs, 1, "nonzero is one counted host sync");
        // x.t() is [3, 2]: [[0, -1], [2, 0], [0, 5]].
        assert_eq!(nz.shape(), &[3, 2]);
        assert_eq!(nz.to_vec::<i64>()?, vec![0, 1, 1, 0, 2, 1]);
        let flags = Tensor::from_slice(&[false, false], &[2], &d)?;
        assert_eq!(flags.nonzero()?.shape(), &[0, 1]);
        let scalar = Tensor::full(&[], 3, DType::I32, &d)?;
        assert_eq!(scalar.nonzero()?.shape(), &[1, 0]);

        let weight = iota(&[4, 3], &d)?.to_dtype(DType::F32)?;
        let ids3 = Tensor::from_slice(&[3i64, 0, 2, 2, 1, 0], &[2, 1, 3], &d)?;
        let e = weight.embedding(&ids3)?;
        assert_eq!(e.shape(), &[2, 1, 3, 3]);
        let expected: Vec<f32> = [3usize, 0, 2, 2, 1, 0]
            .iter()
            .flat_map(|&r| (0..3).map(move |c| (r * 3 + c) as f32))
            .collect();
        assert_eq!(e.to_vec::<f32>()?, expected);
        let empty_ids = Tensor::zeros(&[0], DType::I64, &d)?;
        assert_eq!(weight.embedding(&empty_ids)?.shape(), &[0, 3]);
        let bad = Tensor::from_slice(&[4i64], &[1], &d)?;
        // A GPU reports a bad index at the next synchronisation: read the result.
        let read = weight.embedding(&bad).and_then(|t| t.to_vec::<f32>());
        assert!(matches!(read, Err(Error::IndexOutOfRange { .. })), "{read:?}");
    }
    let d = Device::cpu();
    let floats = Tensor::zeros(&[2], DType::F32, &d)?;
    assert!(matches!(
        floats.one_hot(3),
        Err(Error::WrongDType { op: "one_hot", .. })
    ));
    let table = Tensor::zeros(&[3, 2], DType::F32, &d)?;
    assert!(matches!(
        table.embedding(&Tensor::zeros(&[1], DType::F32, &d)?),
        Err(Error::WrongDType { op: "embedding", .. })
    ));
    let flat = Tensor::zeros(&[3], DType::F32, &d)?;
    assert!(matches!(
        flat.embedding(&Tensor::zeros(&[1], DType::I64, &d)?),
        Err(Error::ShapeMismatch { op: "embedding", .. })
    ));
    Ok(())
}
