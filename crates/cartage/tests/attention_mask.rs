//! Masked `scaled_dot_product_attention` on every device: bool and float masks of the shapes
//! models pass (a key padding mask `[B, 1, 1, S]`, one mask for every batch entry `[L, S]`, one
//! per batch entry and head `[B, H, L, S]`, a strided view), alone and with `causal`, with rows
//! that see no key (0, and no gradient). The output against an f64 reference, and the output and
//! the three gradients of the path the device takes for a constant mask (the fused kernel where
//! the backend applies masks) against the composed path (taken for a mask that needs its own
//! gradient), with the fused path checked to be taken where the device has it (one recorded
//! node). Under bf16 autocast a float f32 mask is lowered with q, k and v. Each missing GPU
//! is skipped loudly.

mod common;
mod nn_reference;

use cartage::{DType, Device, Op, Result, Tensor, Var, backend, graph_memory, s};
use nn_reference::{attention_reference, values};

const B: usize = 2;
const H: usize = 3;
const L: usize = 5;
const S: usize = 7;
/// A head dim every fused kernel takes (CUDA's: 64 and 128 in bf16 and f16, multiples of 16 from
/// 32 to 128 in f32).
const E: usize = 64;

fn devices() -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices("attention_mask"));
    all
}

/// The masks, as `(name, mask on the host [B, H, L, S] as keep/addend per entry, the tensor)`.
type MaskCase = (
    &'static str,
    Box<dyn Fn(usize, usize, usize, usize) -> Option<f64>>,
    Tensor,
);

fn masks(device: &Device, dtype: DType) -> Result<Vec<MaskCase>> {
    // Key padding: sequence 0 keeps 7 keys, sequence 1 the first 4.
    let lengths = [7usize, 4];
    let padding: Vec<bool> = (0..B * S).map(|i| i % S < lengths[i / S]).collect();
    let padding_t = Tensor::from_slice(&padding, &[B, 1, 1, S], device)?;
    // One float mask for every batch entry, with every key of query row 2 removed.
    let bias: Vec<f32> = values(L * S, 5)
        .iter()
        .enumerate()
        .map(|(i, &x)| if i / S == 2 { f32::NEG_INFINITY } else { x })
        .collect();
    let bias_t = Tensor::from_slice(&bias, &[L, S], device)?.to_dtype(dtype)?;
    // One bool mask per batch entry and head, about a third removed.
    let full: Vec<bool> = (0..B * H * L * S).map(|i| (i * 7 + i / 5) % 3 != 0).collect();
    let full_t = Tensor::from_slice(&full, &[B, H, L, S], device)?;
    // A strided view: the keys of a wider [B, 1, L, 2·S] float mask, every second one.
    let wide: Vec<f32> = values(B * L * 2 * S, 9);
    let wide_t = Tensor::from_slice(&wide, &[B, 1, L, 2 * S], device)?.to_dtype(dtype)?;
    let strided_t = wide_t.i((.., .., .., s(1, None::<i64>, 2)))?;
    Ok(vec![
        (
            "key padding [B, 1, 1, S]",
            Box::new(move |b, _, _, j| padding[b * S + j].then_some(0.0)),
            padding_t,
        ),
        (
            "float [L, S], a row without keys",
            Box::new(move |_, _, i, j| {
                let x = f64::from(bias[i * S + j]);
                (x != f64::NEG_INFINITY).then_some(x)
            }),
            bias_t,
        ),
        (
            "bool [B, H, L, S]",
            Box::new(move |b, h, i, j| full[((b * H + h) * L + i) * S + j].then_some(0.0)),
            full_t,
        ),
        (
            "strided float [B, 1, L, S]",
            Box::new(move |b, _, i, j| Some(f64::from(wide[(b * L + i) * 2 * S + 1 + 2 * j]))),
            strided_t,
        ),
    ])
}

/// The output and the gradients of q, k and v of `Σ out · r` for q `[B, H, L, E]` and k, v
/// `[B, H, S, E]`, with `mask` constant or (when `composed`) a variable, which sends attention
/// to the composed path.
fn run(device: &Device, dtype: DType, mask: &Tensor, causal: bool, composed: bool) -> Result<Vec<Vec<f64>>> {
    run_sized(device, dtype, &[B, H], [L, S, E], mask, causal, composed)
}

/// [`run`] for q `[batch.., l, e]` and k, v `[batch.., s, e]`.
fn run_sized(
    device: &Device,
    dtype: DType,
    batch: &[usize],
    [l, s, e]: [usize; 3],
    mask: &Tensor,
    causal: bool,
    composed: bool,
) -> Result<Vec<Vec<f64>>> {
    let shape = |n: usize| [batch, &[n, e]].concat();
    let make = |seed, n: usize| {
        let shape = shape(n);
        Tensor::from_slice(&values(shape.iter().product(), seed), &shape, device)?.to_dtype(dtype)
    };
    let (q, k, v) = (Var::new(make(1, l)?)?, Var::new(make(2, s)?)?, Var::new(make(3, s)?)?);
    let mask = if composed && mask.dtype().is_float() {
        Var::new(mask.clone())?.tensor()
    } else if composed {
        // A bool mask cannot be a variable: the same mask as 0 / −inf, as a variable.
        let zero = Tensor::zeros(&[], dtype, device)?;
        let removed = Tensor::full(&[], f64::NEG_INFINITY, dtype, device)?;
        Var::new(Tensor::where_cond(mask, &zero, &removed)?)?.tensor()
    } else {
        mask.clone()
    };
    let nodes = graph_memory(device).nodes;
    let out = Tensor::scaled_dot_product_attention(&q.tensor(), &k.tensor(), &v.tensor(), Some(&mask), causal, None)?;
    // Where the device fuses masked attention, a constant mask keeps it fused: one recorded
    // node (a device that fuses only unmasked attention composes it).
    let fuses = backend(device)?.capabilities().supports(Op::AttentionMask, dtype);
    let recorded = graph_memory(device).nodes - nodes;
    assert!(
        composed || !fuses || recorded == 1,
        "{device} {dtype}: a constant mask recorded {recorded} nodes, not the one fused node"
    );
    let r = make(4, l)?;
    out.mul(&r)?.sum_all()?.backward()?;
    let host = |t: &Tensor| t.to_dtype(DType::F64)?.to_vec::<f64>();
    let mut got = vec![host(&out)?];
    for var in [&q, &k, &v] {
        got.push(host(&var.grad().expect("a gradient"))?);
    }
    Ok(got)
}

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() && (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

/// One test function for every device's attention: the graph's node count, read to tell the
/// fused path, is per device, and the tests of one binary run on parallel threads.
#[test]
fn masked_attention_matches_the_reference_and_the_composed_path() -> Result<()> {
    no_key_at_all_gives_zeros_on_every_device()?;
    whole_leading_tiles_masked()?;
    let scale = 1.0 / (E as f64).sqrt();
    let host = |seed, s| values(B * H * s * E, seed);
    let (qd, kd, vd) = (host(1, L), host(2, S), host(3, S));
    for device in devices() {
        for dtype in [DType::F32, DType::BF16] {
            if dtype == DType::BF16 && device == Device::cpu() {
                continue;
            }
            let tol = if dtype == DType::F32 { 1e-5 } else { 3e-2 };
            for (name, keep, mask) in masks(&device, dtype)? {
                for causal in [false, true] {
                    let what = format!("{device} {dtype} {name} causal {causal}");
                    let got = run(&device, dtype, &mask, causal, false)?;
                    let composed = run(&device, dtype, &mask, causal, true)?;
                    // The reference on the host's (unrounded) values: f32 only.
                    if dtype == DType::F32 {
                        let want = attention_reference(&qd, &kd, &vd, [B * H, L, S, E, E], scale, |bh, i, j| {
                            keep(bh / H, bh % H, i, j).filter(|_| !causal || j <= i)
                        });
                        assert_close(&format!("{what}: output"), &got[0], &want, tol);
                    }
                    for (part, (g, c)) in ["output", "dq", "dk", "dv"].iter().zip(got.iter().zip(&composed)) {
                        assert_close(&format!("{what}: {part} against the composed path"), g, c, tol);
                    }
                    // Query row 2 of the float [L, S] mask sees no key: 0, and no gradient.
                    if name.starts_with("float [L, S]") {
                        let rows = |t: &[f64], i: usize| -> Vec<f64> {
                            (0..B * H)
                                .flat_map(|bh| t[(bh * L + i) * E..(bh * L + i + 1) * E].to_vec())
                                .collect()
                        };
                        assert!(
                            rows(&got[0], 2).iter().all(|&x| x == 0.0),
                            "{what}: {:?}",
                            rows(&got[0], 2)
                        );
                        assert!(
                            rows(&got[1], 2).iter().all(|&x| x == 0.0),
                            "{what}: dq {:?}",
                            rows(&got[1], 2)
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn an_f32_mask_is_lowered_under_autocast() -> Result<()> {
    let cpu = Device::cpu();
    let make = |seed, s| Tensor::from_slice(&values(B * H * s * E, seed), &[B, H, s, E], &cpu);
    let (q, k, v) = (make(1, L)?, make(2, S)?, make(3, S)?);
    let bias = Tensor::from_slice(&values(L * S, 5), &[L, S], &cpu)?;
    let want = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&bias), false, None)?.to_vec::<f32>()?;
    let got = {
        let _bf16 = cartage::autocast(&cpu, DType::BF16)?;
        Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&bias), false, None)?
    };
    assert_eq!(got.dtype(), DType::BF16);
    let got = got.to_dtype(DType::F64)?.to_vec::<f64>()?;
    let want: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
    assert_close("autocast", &got, &want, 3e-2);
    Ok(())
}

/// Part of the test above (the graph's node count is per device, and the tests of one binary
/// run on parallel threads).
fn no_key_at_all_gives_zeros_on_every_device() -> Result<()> {
    for device in devices() {
        let q = Var::new(Tensor::from_slice(&values(B * H * L * E, 1), &[B, H, L, E], &device)?)?;
        let k = Tensor::zeros(&[B, H, 0, E], DType::F32, &device)?;
        for causal in [false, true] {
            let out = Tensor::scaled_dot_product_attention(&q.tensor(), &k, &k, None, causal, None)?;
            let got = out.to_vec::<f32>()?;
            assert!(got.iter().all(|&x| x == 0.0), "{device} causal {causal}: {got:?}");
            out.sum_all()?.backward()?;
        }
        let grad = q.grad().expect("a gradient").to_vec::<f32>()?;
        assert!(grad.iter().all(|&x| x == 0.0), "{device}: {grad:?}");
    }
    Ok(())
}

/// Part of the test above: a mask removing the first 100 of 150 keys of every row, so that a
/// fused kernel's first key tiles see nothing but −inf before any live key (its running maximum
/// starts at −inf), alone and with causal (rows 0 to 99 then see no key): the device's path
/// against the composed one, output and gradients, in f32 and (on the GPUs) bf16, with head dims
/// 32 (f32 only on CUDA) and 64.
fn whole_leading_tiles_masked() -> Result<()> {
    let (l, s) = (120, 150);
    for device in devices() {
        let keep: Vec<bool> = (0..l * s).map(|i| i % s >= 100).collect();
        let keep = Tensor::from_slice(&keep, &[l, s], &device)?;
        for (dtype, e, tol) in [(DType::F32, 32, 1e-5), (DType::F32, 64, 1e-5), (DType::BF16, 64, 3e-2)] {
            if dtype == DType::BF16 && device == Device::cpu() {
                continue;
            }
            for causal in [false, true] {
                let run = |composed| run_sized(&device, dtype, &[2], [l, s, e], &keep, causal, composed);
                let (got, want) = (run(false)?, run(true)?);
                for (part, (g, w)) in ["output", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                    assert_close(
                        &format!("{device} {dtype} head dim {e}, leading tiles masked, causal {causal}: {part}"),
                        g,
                        w,
                        tol,
                    );
                }
            }
        }
    }
    Ok(())
}
