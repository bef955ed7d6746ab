//! `MultiHeadAttention` against the attention written out from its parameters with one product
//! per query, key and value (features `0..D`, `D..2D`, `2D..3D` of `attn.qkv`, head `h` taking
//! `D / heads` consecutive features of each) and the unpacked
//! `Tensor::scaled_dot_product_attention`: the output and the gradients of the input and of
//! every parameter, causal and not, with and without a key padding mask (`forward_masked`), on
//! the CPU and every GPU that opens.

use cartage::prelude::*;
use cartage_nn::layers::MultiHeadAttention;
use cartage_nn::{Module, ParamStore};

mod common;

/// The output and the gradients of `Σ y·r` for the input and then the parameters (by name), as
/// f64, through the layer or, with `reference`, through the written-out attention on copies of
/// the layer's parameters.
fn run(device: &Device, causal: bool, padded: bool, reference: bool) -> Result<Vec<Vec<f64>>> {
    let (b, t, dim, heads) = (2, 7, 24, 3);
    let head = dim / heads;
    let store = ParamStore::new(device);
    let mut rng = Generator::new(11);
    let attn = MultiHeadAttention::new(&store.root().sub("attn"), dim, heads, causal, &mut rng)?;
    let x = Var::new(Tensor::randn(&[b, t, dim], DType::F32, 4, &Device::cpu())?.to(device)?)?;
    // A key padding mask [B, 1, 1, T]: the second sequence has 4 real tokens.
    let real: Vec<bool> = (0..b * t).map(|i| i % t < [t, 4][i / t]).collect();
    let real = Tensor::from_slice(&real, &[b, 1, 1, t], device)?;
    let mask = padded.then_some(&real);
    let names = ["attn.qkv.weight", "attn.qkv.bias", "attn.out.weight", "attn.out.bias"];
    let params = common::params(&store, &names, reference)?;
    let y = if reference {
        let [wqkv, bqkv, wout, bout] = [0, 1, 2, 3].map(|i| params[i].tensor());
        let part = |i: usize| -> Result<Tensor> {
            let w = wqkv.narrow(0, i * dim, dim)?;
            let bias = bqkv.narrow(0, i * dim, dim)?;
            x.tensor()
                .matmul(&w.t()?)?
                .add(&bias)?
                .reshape(&[b, t, heads, head])?
                .transpose(1, 2)
        };
        let heads_out = Tensor::scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, mask, causal, None)?;
        let y = heads_out.transpose(1, 2)?.reshape(&[b, t, dim])?;
        y.matmul(&wout.t()?)?.add(&bout)?
    } else if let Some(mask) = mask {
        attn.forward_masked(&x.tensor(), mask)?
    } else {
        attn.forward(&x.tensor())?
    };
    let r = Tensor::randn(y.shape(), DType::F32, 5, &Device::cpu())?.to(device)?;
    y.mul(&r)?.sum_all()?.backward()?;
    let mut out = vec![y.to_dtype(DType::F64)?.to_vec::<f64>()?];
    for var in std::iter::once(&x).chain(&params) {
        let g = var.grad().expect("every variable gets a gradient");
        out.push(g.to_dtype(DType::F64)?.to_vec::<f64>()?);
    }
    Ok(out)
}

#[test]
fn the_layer_matches_one_product_per_part() -> Result<()> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices("attention_layer"));
    let what = [
        "output",
        "input gradient",
        "qkv.weight",
        "qkv.bias",
        "out.weight",
        "out.bias",
    ];
    for device in devices {
        for (causal, padded) in [(false, false), (true, false), (false, true), (true, true)] {
            let got = run(&device, causal, padded, false)?;
            let want = run(&device, causal, padded, true)?;
            for ((name, g), w) in what.iter().zip(&got).zip(&want) {
                let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                let worst = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
                assert!(
                    worst <= 1e-4,
                    "{device} causal={causal} padded={padded} {name}: worst difference {worst:.3e}"
                );
            }
        }
    }
    Ok(())
}
