//! The norms' backward through the public API, on the CPU and every GPU that opens: for every
//! subset of {input, weight, bias} that requires a gradient, the gradients of
//! `Σ layer_norm(x, w, b)·R` (and of RMS norm) against the composed formula evaluated on the
//! host in f64 from the same rounded values, in f32, bf16 and f64; shapes with one column, odd
//! column counts and thousands of rows. Then under autocast: half inputs are differentiated in
//! f32 and each gradient comes back in its variable's dtype.

mod common;

use cartage::{DType, Device, NormKind, Op, Result, Tensor, Var, backend};

/// Which operands require a gradient: input, weight, bias.
type Subset = [bool; 3];

const SUBSETS: [Subset; 6] = [
    [true, false, false],
    [false, true, false],
    [false, false, true],
    [false, true, true],
    [true, true, true],
    [true, false, true],
];

const SHAPES: [&[usize]; 5] = [&[4, 1], &[7, 3], &[2, 3, 33], &[3000, 3], &[40, 1000]];

/// Deterministic values in (-2, 2).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
        })
        .collect()
}

/// `values` as a tensor of `dtype` on `device`, and the values it holds (rounded) as f64.
fn tensor(values: Vec<f64>, shape: &[usize], dtype: DType, device: &Device) -> Result<(Tensor, Vec<f64>)> {
    let t = Tensor::from_vec(values, shape, &Device::cpu())?.to_device_dtype(device, dtype)?;
    let held = t.to_device_dtype(&Device::cpu(), DType::F64)?.to_vec::<f64>()?;
    Ok((t, held))
}

/// The composed gradients in f64: input, weight (`Σ g·x̂`), bias (`Σ g`), and the scale of each
/// column sum (the root of the sum of its squared terms).
struct Reference {
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
    dw_scale: Vec<f64>,
    db_scale: Vec<f64>,
}

fn reference(kind: NormKind, x: &[f64], g: &[f64], w: Option<&[f64]>, n: usize, eps: f64) -> Reference {
    let mut dx = Vec::with_capacity(x.len());
    let (mut dw, mut db, mut dw_scale, mut db_scale) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for (xr, gr) in x.chunks(n).zip(g.chunks(n)) {
        let len = n as f64;
        let mean = match kind {
            NormKind::Layer => xr.iter().sum::<f64>() / len,
            NormKind::Rms => 0.0,
        };
        let r = 1.0 / (xr.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / len + eps).sqrt();
        let xhat: Vec<f64> = xr.iter().map(|v| (v - mean) * r).collect();
        let gh: Vec<f64> = (0..n).map(|c| gr[c] * w.map_or(1.0, |w| w[c])).collect();
        let mean_g = match kind {
            NormKind::Layer => gh.iter().sum::<f64>() / len,
            NormKind::Rms => 0.0,
        };
        let mean_gx = gh.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / len;
        dx.extend((0..n).map(|c| r * (gh[c] - mean_g - xhat[c] * mean_gx)));
        for c in 0..n {
            dw[c] += gr[c] * xhat[c];
            db[c] += gr[c];
            dw_scale[c] += (gr[c] * xhat[c]).powi(2);
            db_scale[c] += gr[c] * gr[c];
        }
    }
    for s in dw_scale.iter_mut().chain(&mut db_scale) {
        *s = s.sqrt();
    }
    Reference {
        dx,
        dw,
        db,
        dw_scale,
        db_scale,
    }
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        _ => 3e-2,
    }
}

/// `|got − want| / (1 + scale)` within the dtype's tolerance, `scale` the size of what entered.
fn check(what: &str, got: &Tensor, want: &[f64], scale: impl Fn(usize) -> f64, dtype: DType) -> Result<()> {
    let got = got.to_device_dtype(&Device::cpu(), DType::F64)?.to_vec::<f64>()?;
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + scale(i).max(w.abs()));
        assert!(
            err <= tolerance(dtype),
            "{what}: element {i}: got {g}, want {w} (error {err:e})"
        );
    }
    Ok(())
}

/// The CPU and every GPU that opens here.
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

/// One case: the gradients of the operands in `subset`, each checked; the others get none.
fn run_case(device: &Device, dtype: DType, kind: NormKind, shape: &[usize], subset: Subset) -> Result<()> {
    let n = *shape.last().expect("rank ≥ 1");
    let numel: usize = shape.iter().product();
    let eps = 1e-5;
    let seed = (numel * 31 + n) as u64;
    let (x, xv) = tensor(values(numel, seed), shape, dtype, device)?;
    let (w, wv) = tensor(
        values(n, seed + 1).iter().map(|v| 1.0 + v / 4.0).collect(),
        &[n],
        dtype,
        device,
    )?;
    let (b, _) = tensor(values(n, seed + 2), &[n], dtype, device)?;
    let (r, rv) = tensor(values(numel, seed + 3), shape, dtype, device)?;
    let has_bias = kind == NormKind::Layer;
    let wrap = |t: Tensor, on: bool| -> Result<(Tensor, Option<Var>)> {
        if on {
            let v = Var::new(t)?;
            Ok((v.tensor(), Some(v)))
        } else {
            Ok((t, None))
        }
    };
    let (xt, xvar) = wrap(x, subset[0])?;
    let (wt, wvar) = wrap(w, subset[1])?;
    let (bt, bvar) = wrap(b, subset[2] && has_bias)?;
    let out = match kind {
        NormKind::Layer => xt.layer_norm(Some(&wt), Some(&bt), eps)?,
        NormKind::Rms => xt.rms_norm(Some(&wt), eps)?,
    };
    out.mul(&r)?.sum_all()?.backward()?;
    let want = reference(kind, &xv, &rv, Some(&wv), n, eps);
    let what = format!("{device} {dtype} {} {shape:?} requiring {subset:?}", kind.name());
    let row_scale = |i: usize| {
        let row = i / n;
        rv[row * n..(row + 1) * n].iter().map(|v| v.abs()).sum::<f64>() / n as f64
    };
    if let Some(v) = &xvar {
        let g = v.grad().expect("the input requires a gradient");
        assert_eq!(g.dtype(), dtype, "{what}: input gradient dtype");
        check(&format!("{what}: input gradient"), &g, &want.dx, row_scale, dtype)?;
    }
    if let Some(v) = &wvar {
        let g = v.grad().expect("the weight requires a gradient");
        assert_eq!(g.dtype(), dtype, "{what}: weight gradient dtype");
        check(
            &format!("{what}: weight gradient"),
            &g,
            &want.dw,
            |c| want.dw_scale[c],
            dtype,
        )?;
    }
    if let Some(v) = &bvar {
        let g = v.grad().expect("the bias requires a gradient");
        check(
            &format!("{what}: bias gradient"),
            &g,
            &want.db,
            |c| want.db_scale[c],
            dtype,
        )?;
    }
    Ok(())
}

#[test]
fn norm_gradients_match_the_composed_formula_for_every_subset() -> Result<()> {
    for device in devices("norm_gradients_match_the_composed_formula_for_every_subset") {
        let backend = backend(&device)?;
        let caps = backend.capabilities();
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            if !caps.supports(Op::Norm(NormKind::Layer), dtype) {
                common::skip(&format!("norm_backward: {device} has no norms in {dtype}"));
                continue;
            }
            for kind in [NormKind::Layer, NormKind::Rms] {
                for shape in SHAPES {
                    for subset in SUBSETS {
                        if kind == NormKind::Rms && subset == [false, false, true] {
                            continue;
                        }
                        run_case(&device, dtype, kind, shape, subset)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Under autocast a bf16 input is normalised in f32 with the f32 weight and bias; backward
/// gives the input's gradient in bf16 and the parameters' in f32, with the composed values.
#[test]
fn autocast_norm_gradients_keep_each_variables_dtype() -> Result<()> {
    for device in devices("autocast_norm_gradients_keep_each_variables_dtype") {
        let Ok(_guard) = cartage::autocast(&device, DType::BF16) else {
            common::skip(&format!("norm_backward: {device} has no bf16 autocast"));
            continue;
        };
        let (shape, n, eps) = ([64, 48], 48, 1e-5);
        let (x, xv) = tensor(values(64 * 48, 5), &shape, DType::BF16, &device)?;
        let (w, wv) = tensor(values(n, 6), &[n], DType::F32, &device)?;
        let (b, _) = tensor(values(n, 7), &[n], DType::F32, &device)?;
        let (r, rv) = tensor(values(64 * 48, 8), &shape, DType::F32, &device)?;
        let (x, w, b) = (Var::new(x)?, Var::new(w)?, Var::new(b)?);
        let out = x.tensor().layer_norm(Some(&w.tensor()), Some(&b.tensor()), eps)?;
        assert_eq!(out.dtype(), DType::F32, "{device}: autocast normalises in f32");
        out.mul(&r)?.sum_all()?.backward()?;
        let want = reference(NormKind::Layer, &xv, &rv, Some(&wv), n, eps);
        let (gx, gw, gb) = (
            x.grad().expect("input gradient"),
            w.grad().expect("weight gradient"),
            b.grad().expect("bias gradient"),
        );
        assert_eq!(
            [gx.dtype(), gw.dtype(), gb.dtype()],
            [DType::BF16, DType::F32, DType::F32],
            "{device}"
        );
        check(
            &format!("{device} autocast input gradient"),
            &gx,
            &want.dx,
            |_| 1.0,
            DType::BF16,
        )?;
        check(
            &format!("{device} autocast weight gradient"),
            &gw,
            &want.dw,
            |c| want.dw_scale[c],
            DType::F32,
        )?;
        check(
            &format!("{device} autocast bias gradient"),
            &gb,
            &want.db,
            |c| want.db_scale[c],
            DType::F32,
        )?;
    }
    Ok(())
}
