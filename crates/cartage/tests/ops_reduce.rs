//! Reductions and scans through the frontend on every device that opens here, against
//! expectations computed on the host in f64: prod, var/std, norm, any/all, max_dim/min_dim,
//! cumsum/cumprod, sort/argsort and topk, on strided inputs, with NaN, ties and empty extents,
//! and their refusals of bad input.

mod common;

use cartage::prelude::*;
use cartage::{Error, ErrorKind};

fn devices(test: &str) -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device(test));
    devices
}

/// A `[rows, cols]` view holding `values` row-major, built as the transpose of a `[cols, rows]`
/// tensor (strided, read in place).
fn strided<T: cartage::Element + Default>(values: &[T], rows: usize, cols: usize, device: &Device) -> Result<Tensor> {
    let mut storage = vec![T::default(); values.len()];
    for r in 0..rows {
        for c in 0..cols {
            storage[c * rows + r] = values[r * cols + c];
        }
    }
    let x = Tensor::from_slice(&storage, &[cols, rows], device)?.t()?;
    assert!(!x.is_contiguous() || rows == 1 || cols == 1);
    Ok(x)
}

/// Rows of a row-major `[rows, cols]` matrix, or its columns when `dim == 0`.
fn lanes(values: &[f64], rows: usize, cols: usize, dim: usize) -> Vec<Vec<f64>> {
    if dim == 1 {
        values.chunks(cols).map(<[f64]>::to_vec).collect()
    } else {
        (0..cols)
            .map(|c| (0..rows).map(|r| values[r * cols + c]).collect())
            .collect()
    }
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= tol * (1.0 + w.abs())
        };
        assert!(
            ok,
            "{what}: element {i} is {g}, expected {w} (all: {got:?} vs {want:?})"
        );
    }
}

fn kind<T: std::fmt::Debug>(result: Result<T>) -> ErrorKind {
    match result {
        Ok(t) => panic!("expected an error, got {t:?}"),
        Err(e) => e.kind(),
    }
}

const DATA: [f32; 12] = [3.0, -1.5, 2.0, 0.5, 4.0, -2.0, 1.0, 1.0, 0.25, -3.0, 2.5, 6.0];

#[test]
fn prod_over_dims_wraps_integers_and_is_one_when_empty() -> Result<()> {
    for device in devices("prod") {
        let x = strided(&DATA, 3, 4, &device)?;
        let xs: Vec<f64> = DATA.iter().map(|&v| v as f64).collect();
        for dim in [0usize, 1] {
            let want: Vec<f64> = lanes(&xs, 3, 4, dim).iter().map(|l| l.iter().product()).collect();
            let got = x.prod(&[dim as isize], false)?;
            assert_close(&format!("prod dim {dim} on {device}"), &got.to_vec_f64()?, &want, 1e-6);
        }
        let all = x.prod(&[0, -1], true)?;
        assert_eq!(all.shape(), &[1, 1]);
        assert_close("prod all", &all.to_vec_f64()?, &[xs.iter().product()], 1e-6);
        let big = Tensor::from_slice(&[1i64 << 40, 1 << 30, 3], &[3], &device)?;
        let wrapped = (1i64 << 40).wrapping_mul(1 << 30).wrapping_mul(3);
        assert_eq!(big.prod(&[0], false)?.to_vec::<i64>()?, vec![wrapped]);
        let big = Tensor::from_slice(&[1i32 << 20, 1 << 15, 3, -1], &[2, 2], &device)?.t()?;
        let wrapped = [(1i32 << 20).wrapping_mul(3), (1i32 << 15).wrapping_mul(-1)];
        assert_eq!(big.prod(&[1], false)?.to_vec::<i32>()?, wrapped);
        let empty = Tensor::zeros(&[2, 0], DType::F32, &device)?;
        assert_eq!(empty.prod(&[1], false)?.to_vec::<f32>()?, vec![1.0, 1.0]);
        let flags = Tensor::from_slice(&[true], &[1], &device)?;
        assert_eq!(kind(flags.prod(&[0], false)), ErrorKind::WrongDType);
    }
    Ok(())
}

#[test]
fn var_and_std_follow_pytorch_corrections() -> Result<()> {
    for device in devices("var_std") {
        let x = strided(&DATA, 3, 4, &device)?;
        let xs: Vec<f64> = DATA.iter().map(|&v| v as f64).collect();
        let var = |l: &[f64], correction: f64| {
            let mean = l.iter().sum::<f64>() / l.len() as f64;
            let ss: f64 = l.iter().map(|v| (v - mean) * (v - mean)).sum();
            ss / (l.len() as f64 - correction).max(0.0)
        };
        for dim in [0usize, 1] {
            for correction in [0.0, 1.0, 2.0] {
                let want: Vec<f64> = lanes(&xs, 3, 4, dim).iter().map(|l| var(l, correction)).collect();
                let got = x.var(&[dim as isize], correction, false)?;
                assert_close(
                    &format!("var dim {dim} c {correction} on {device}"),
                    &got.to_vec_f64()?,
                    &want,
                    1e-5,
                );
                let want: Vec<f64> = want.iter().map(|v| v.sqrt()).collect();
                let got = x.std(&[dim as isize], correction, true)?;
                assert_eq!(got.rank(), 2);
                assert_close("std", &got.to_vec_f64()?, &want, 1e-5);
            }
        }
        assert_close(
            "var all",
            &x.var(&[0, 1], 1, false)?.to_vec_f64()?,
            &[var(&xs, 1.0)],
            1e-5,
        );
        // n - correction <= 0: a zero divisor gives inf, or NaN for a zero sum (PyTorch).
        let pair = Tensor::from_slice(&[1.0f32, 3.0, 5.0, 5.0], &[2, 2], &device)?;
        let got = pair.var(&[1], 2, false)?.to_vec::<f32>()?;
        assert!(got[0] == f32::INFINITY && got[1].is_nan(), "{got:?}");
        let one = Tensor::from_slice(&[4.0f64], &[1], &device)?;
        assert!(one.std(&[0], 1, false)?.to_vec::<f64>()?[0].is_nan());
        let ints = Tensor::from_slice(&[1i64, 2], &[2], &device)?;
        let err = ints.var(&[0], 1, false).unwrap_err();
        assert!(matches!(err, Error::WrongDType { op: "var", .. }), "{err}");
        let err = x.std(&[0], f64::NAN, false).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "std", .. }), "{err}");
        assert_eq!(kind(x.var(&[2], 1, false)), ErrorKind::DimOutOfRange);
        assert_eq!(kind(x.var(&[1, -1], 1, false)), ErrorKind::InvalidArgument);
    }
    Ok(())
}

/// A norm computed on the host.
type HostNorm = fn(&[f64]) -> f64;

#[test]
fn norms_of_every_order() -> Result<()> {
    for device in devices("norm") {
        let x = strided(&DATA, 3, 4, &device)?;
        let xs: Vec<f64> = DATA.iter().map(|&v| v as f64).collect();
        let orders: [(&str, f64, HostNorm); 4] = [
            ("L1", 1.0, |l| l.iter().map(|v| v.abs()).sum()),
            ("L2", 2.0, |l| l.iter().map(|v| v * v).sum::<f64>().sqrt()),
            ("Inf", f64::INFINITY, |l| l.iter().fold(0.0, |m, v| m.max(v.abs()))),
            ("P3", 3.0, |l| l.iter().map(|v| v.abs().powi(3)).sum::<f64>().cbrt()),
        ];
        for (name, ord, host) in orders {
            for dim in [0usize, 1] {
                let want: Vec<f64> = lanes(&xs, 3, 4, dim).iter().map(|l| host(l)).collect();
                let got = x.norm(ord, &[dim as isize], false)?;
                assert_close(
                    &format!("norm {name} dim {dim} on {device}"),
                    &got.to_vec_f64()?,
                    &want,
                    1e-5,
                );
            }
        }
        assert_close(
            "norm 2 all",
            &x.norm(2, &[0, 1], false)?.to_vec_f64()?,
            &[orders[1].2(&xs)],
            1e-5,
        );
        let empty = Tensor::zeros(&[0, 3], DType::F32, &device)?;
        assert_eq!(empty.norm(f64::INFINITY, &[0], false)?.to_vec::<f32>()?, vec![0.0; 3]);
        assert_eq!(empty.norm(2.0, &[0], true)?.shape(), &[1, 3]);
        let err = x.norm(-1.0, &[0], false).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "norm", .. }), "{err}");
        assert!(err.to_string().contains("-1"), "{err}");
        let ints = Tensor::from_slice(&[1i64], &[1], &device)?;
        assert_eq!(kind(ints.norm(1.0, &[0], false)), ErrorKind::WrongDType);
    }
    Ok(())
}

#[test]
fn any_and_all_count_non_zero_and_nan_as_true() -> Result<()> {
    for device in devices("any_all") {
        let values = [0.0f32, 0.0, f32::NAN, 0.0, 1.0, 2.0, -0.0, 0.0, 0.0, 3.0, 0.0, 0.0];
        let x = strided(&values, 3, 4, &device)?;
        let truthy: Vec<f64> = values.iter().map(|&v| (v != 0.0) as u8 as f64).collect();
        for dim in [0usize, 1] {
            let l = lanes(&truthy, 3, 4, dim);
            let any: Vec<bool> = l.iter().map(|l| l.iter().any(|&v| v != 0.0)).collect();
            let all: Vec<bool> = l.iter().map(|l| l.iter().all(|&v| v != 0.0)).collect();
            let got = x.any(&[dim as isize], false)?;
            assert_eq!(got.dtype(), DType::Bool);
            assert_eq!(got.to_vec::<bool>()?, any, "any dim {dim} on {device}");
            assert_eq!(x.all(&[dim as isize], false)?.to_vec::<bool>()?, all, "all dim {dim}");
        }
        let ones = Tensor::ones(&[2, 3], DType::I64, &device)?;
        assert_eq!(ones.all(&[0, 1], true)?.to_vec::<bool>()?, vec![true]);
        let flags = Tensor::from_slice(&[true, false, true, true], &[2, 2], &device)?;
        assert_eq!(flags.all(&[-1], false)?.to_vec::<bool>()?, vec![false, true]);
        assert_eq!(flags.any(&[0], true)?.shape(), &[1, 2]);
        // Empty extents: any is false, all is true.
        let empty = Tensor::zeros(&[2, 0], DType::F32, &device)?;
        assert_eq!(empty.any(&[1], false)?.to_vec::<bool>()?, vec![false, false]);
        assert_eq!(empty.all(&[1], true)?.to_vec::<bool>()?, vec![true, true]);
        assert_eq!(empty.all(&[1], true)?.shape(), &[2, 1]);
        assert_eq!(kind(x.any(&[], false)), ErrorKind::InvalidArgument);
        assert_eq!(kind(x.all(&[-3], false)), ErrorKind::DimOutOfRange);
    }
    Ok(())
}

#[test]
fn max_dim_and_min_dim_pick_the_first_extreme() -> Result<()> {
    for device in devices("max_min_dim") {
        let values = [1.0f32, 5.0, 5.0, -2.0, 0.0, -2.0, 7.0, f32::NAN, 7.0, 3.0, 3.0, 3.0];
        let x = strided(&values, 4, 3, &device)?;
        let xs: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        for dim in [0usize, 1] {
            let l = lanes(&xs, 4, 3, dim);
            // The first maximum (NaN counts as the extreme for both).
            let pick = |lane: &[f64], better: fn(f64, f64) -> bool| -> (f64, i64) {
                let mut best = 0;
                for (i, &v) in lane.iter().enumerate() {
                    if lane[best].is_nan() {
                        break;
                    }
                    if v.is_nan() || better(v, lane[best]) {
                        best = i;
                    }
                }
                (lane[best], best as i64)
            };
            let (values, indices) = x.max_dim(dim as isize, false)?;
            let want: Vec<(f64, i64)> = l.iter().map(|lane| pick(lane, |a, b| a > b)).collect();
            assert_close(
                "max_dim values",
                &values.to_vec_f64()?,
                &want.iter().map(|w| w.0).collect::<Vec<_>>(),
                0.0,
            );
            assert_eq!(
                indices.to_vec::<i64>()?,
                want.iter().map(|w| w.1).collect::<Vec<_>>(),
                "max_dim {dim} on {device}"
            );
            let (values, indices) = x.min_dim(dim as isize - 2, true)?;
            assert_eq!(values.rank(), 2);
            let want: Vec<(f64, i64)> = l.iter().map(|lane| pick(lane, |a, b| a < b)).collect();
            assert_close(
                "min_dim values",
                &values.to_vec_f64()?,
                &want.iter().map(|w| w.0).collect::<Vec<_>>(),
                0.0,
            );
            assert_eq!(
                indices.to_vec::<i64>()?,
                want.iter().map(|w| w.1).collect::<Vec<_>>(),
                "min_dim {dim}"
            );
        }
        let empty = Tensor::zeros(&[0, 2], DType::F32, &device)?;
        assert_eq!(kind(empty.max_dim(0, false)), ErrorKind::InvalidArgument);
        assert_eq!(kind(x.min_dim(2, false)), ErrorKind::DimOutOfRange);
    }
    Ok(())
}

#[test]
fn cumsum_and_cumprod_widen_integers() -> Result<()> {
    for device in devices("scans") {
        let x = strided(&DATA, 3, 4, &device)?;
        let xs: Vec<f64> = DATA.iter().map(|&v| v as f64).collect();
        for dim in [0usize, 1] {
            for (name, prod) in [("cumsum", false), ("cumprod", true)] {
                let got = if prod {
                    x.cumprod(dim as isize)?
                } else {
                    x.cumsum(dim as isize - 2)?
                };
                assert_eq!(got.shape(), &[3, 4]);
                assert_eq!(got.dtype(), DType::F32);
                let mut want = xs.clone();
                for r in 0..3 {
                    for c in 0..4 {
                        let prev = if dim == 0 && r > 0 {
                            Some(want[(r - 1) * 4 + c])
                        } else if dim == 1 && c > 0 {
                            Some(want[r * 4 + c - 1])
                        } else {
                            None
                        };
                        if let Some(p) = prev {
                            want[r * 4 + c] = if prod { p * xs[r * 4 + c] } else { p + xs[r * 4 + c] };
                        }
                    }
                }
                assert_close(
                    &format!("{name} dim {dim} on {device}"),
                    &got.to_vec_f64()?,
                    &want,
                    1e-5,
                );
            }
        }
        // Integers and bool widen to i64 (PyTorch), so sums pass i32::MAX without wrapping.
        let ints = Tensor::from_slice(&[i32::MAX, 1, 2], &[3], &device)?;
        let flags = Tensor::from_slice(&[true, false, true, true], &[4], &device)?;
        let bytes = Tensor::from_slice(&[200u8, 100], &[2], &device)?;
        let sums = ints.cumsum(0)?;
        assert_eq!(sums.dtype(), DType::I64);
        let max = i32::MAX as i64;
        assert_eq!(sums.to_vec::<i64>()?, vec![max, max + 1, max + 3]);
        assert_eq!(flags.cumsum(0)?.to_vec::<i64>()?, vec![1, 1, 2, 3]);
        assert_eq!(flags.cumprod(0)?.to_vec::<i64>()?, vec![1, 0, 0, 0]);
        assert_eq!(bytes.cumsum(0)?.to_vec::<i64>()?, vec![200, 300]);
        let scalar = Tensor::full(&[], 2.5, DType::F32, &device)?;
        let s = scalar.cumsum(-1)?;
        assert_eq!(s.shape(), &[] as &[usize]);
        assert_eq!(s.item::<f32>()?, 2.5);
        assert_eq!(kind(scalar.cumsum(1)), ErrorKind::DimOutOfRange);
        assert_eq!(kind(x.cumprod(2)), ErrorKind::DimOutOfRange);
    }
    Ok(())
}

/// Host stable sort of one lane: (values, indices), NaN above +inf.
fn host_sort(lane: &[f64], descending: bool) -> (Vec<f64>, Vec<i64>) {
    let mut order: Vec<usize> = (0..lane.len()).collect();
    let key = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
    let rank = |v: f64| v.is_nan() as u8;
    order.sort_by(|&a, &b| {
        let ord = (rank(lane[a]), key(lane[a]))
            .partial_cmp(&(rank(lane[b]), key(lane[b])))
            .unwrap();
        if descending { ord.reverse() } else { ord }
    });
    (
        order.iter().map(|&i| lane[i]).collect(),
        order.iter().map(|&i| i as i64).collect(),
    )
}

#[test]
fn sort_is_stable_with_nan_last_and_topk_takes_its_head() -> Result<()> {
    for device in devices("sort") {
        let values = [
            2.0f32,
            1.0,
            2.0,
            f32::NAN,
            -1.0,
            2.0,
            f32::INFINITY,
            1.0,
            0.0,
            1.0,
            f32::NAN,
            -0.5,
        ];
        let x = strided(&values, 3, 4, &device)?;
        let xs: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        for dim in [0usize, 1] {
            for descending in [false, true] {
                let (got_v, got_i) = x.sort(dim as isize, descending)?;
                assert_eq!(got_i.dtype(), DType::I64);
                let (mut want_v, mut want_i) = (vec![0.0; 12], vec![0i64; 12]);
                for (lane_no, lane) in lanes(&xs, 3, 4, dim).iter().enumerate() {
                    let (v, i) = host_sort(lane, descending);
                    for k in 0..lane.len() {
                        let at = if dim == 1 { lane_no * 4 + k } else { k * 4 + lane_no };
                        want_v[at] = v[k];
                        want_i[at] = i[k];
                    }
                }
                let what = format!("sort dim {dim} descending {descending} on {device}");
                assert_close(&what, &got_v.to_vec_f64()?, &want_v, 0.0);
                assert_eq!(got_i.to_vec::<i64>()?, want_i, "{what}");
                assert_eq!(x.argsort(dim as isize, descending)?.to_vec::<i64>()?, want_i, "argsort");
            }
        }
        // topk along the last dim: the head of the stable sort, contiguous.
        for (k, largest) in [(2usize, true), (3, false), (0, true), (4, true)] {
            let (v, i) = x.topk(k, -1, largest)?;
            assert_eq!(v.shape(), &[3, k]);
            assert!(v.is_contiguous() && i.is_contiguous());
            let (mut want_v, mut want_i) = (Vec::new(), Vec::new());
            for lane in lanes(&xs, 3, 4, 1) {
                let (sv, si) = host_sort(&lane, largest);
                want_v.extend_from_slice(&sv[..k]);
                want_i.extend_from_slice(&si[..k]);
            }
            assert_close(
                &format!("topk {k} {largest} on {device}"),
                &v.to_vec_f64()?,
                &want_v,
                0.0,
            );
            assert_eq!(i.to_vec::<i64>()?, want_i, "topk {k} {largest}");
        }
        let err = x.topk(5, 1, true).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { op: "topk", .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("k = 5") && message.contains("n = 4"), "{message}");
        assert_eq!(kind(x.sort(2, false)), ErrorKind::DimOutOfRange);
        // Integers and bool sort too.
        let ints = Tensor::from_slice(&[3i64, -1, 3, 0], &[4], &device)?;
        let (v, i) = ints.sort(0, true)?;
        assert_eq!(v.to_vec::<i64>()?, vec![3, 3, 0, -1]);
        assert_eq!(i.to_vec::<i64>()?, vec![0, 2, 3, 1]);
        let flags = Tensor::from_slice(&[true, false, true], &[3], &device)?;
        assert_eq!(flags.argsort(0, false)?.to_vec::<i64>()?, vec![1, 0, 2]);
    }
    Ok(())
}
