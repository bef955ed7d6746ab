//! `TransformerBlock` while recording, with each `Recompute` choice (by default both norms go
//! into the following product as one node and the activation is recomputed by the down
//! projection; attention over the packed q/k/v projection) against the block written out from its parameters with plain ops:
//! `x + out(attn(layer_norm(x)·Wqkvᵀ + bqkv))`, then `x + down(gelu(layer_norm(x)·Wupᵀ + bup))`.
//! The output and the gradients of the input and of every parameter, causal and not, in f32 on
//! the CPU and every GPU that opens, and under bf16 autocast on the CPU.

use cartage::prelude::*;
use cartage_nn::layers::{BlockOptions, Recompute, TransformerBlock};
use cartage_nn::{Module, ParamStore};

mod common;

const NAMES: [&str; 12] = [
    "block.ln1.weight",
    "block.ln1.bias",
    "block.attn.qkv.weight",
    "block.attn.qkv.bias",
    "block.attn.out.weight",
    "block.attn.out.bias",
    "block.ln2.weight",
    "block.ln2.bias",
    "block.mlp_up.weight",
    "block.mlp_up.bias",
    "block.mlp_down.weight",
    "block.mlp_down.bias",
];

/// The output and the gradients of `Σ y·r` (the input's, then each parameter's in `NAMES`'
/// order) as f64, through the block or, with `reference`, through the written-out block on
/// copies of its parameters.
fn run(device: &Device, causal: bool, autocast: bool, recompute: Recompute, reference: bool) -> Result<Vec<Vec<f64>>> {
    let (b, t, dim, heads) = (2, 6, 16, 2);
    let store = ParamStore::new(device);
    let mut rng = Generator::new(21);
    let options = BlockOptions {
        causal,
        recompute,
        ..BlockOptions::new(dim, heads)
    };
    let block = TransformerBlock::with_options(&store.root().sub("block"), options, &mut rng)?;
    let x = Var::new(Tensor::randn(&[b, t, dim], DType::F32, 8, &Device::cpu())?.to(device)?)?;
    let params = common::params(&store, &NAMES, reference)?;
    let _autocast = autocast.then(|| cartage::autocast(device, DType::BF16)).transpose()?;
    let y = if reference {
        let p: Vec<Tensor> = params.iter().map(Var::tensor).collect();
        let x = x.tensor();
        let linear = |h: &Tensor, w: &Tensor, bias: &Tensor| h.matmul(&w.t()?)?.add(bias);
        let qkv = linear(&x.layer_norm(Some(&p[0]), Some(&p[1]), 1e-5)?, &p[2], &p[3])?;
        let head = dim / heads;
        let split = qkv.reshape(&[b, t, 3, heads, head])?;
        let part = |i: isize| split.select(2, i)?.transpose(1, 2);
        let attended = Tensor::scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, None, causal, None)?
            .transpose(1, 2)?
            .reshape(&[b, t, dim])?;
        let x = x.add(&linear(&attended, &p[4], &p[5])?)?;
        let hidden = linear(&x.layer_norm(Some(&p[6]), Some(&p[7]), 1e-5)?, &p[8], &p[9])?.gelu()?;
        x.add(&linear(&hidden, &p[10], &p[11])?)?
    } else {
        block.forward(&x.tensor())?
    };
    let r = Tensor::randn(y.shape(), DType::F32, 9, &Device::cpu())?.to(device)?;
    y.to_dtype(DType::F32)?.mul(&r)?.sum_all()?.backward()?;
    let mut out = vec![y.to_dtype(DType::F64)?.to_vec::<f64>()?];
    for var in std::iter::once(&x).chain(&params) {
        let g = var.grad().expect("every variable gets a gradient");
        out.push(g.to_dtype(DType::F64)?.to_vec::<f64>()?);
    }
    Ok(out)
}

#[test]
fn the_recording_block_matches_the_block_written_out() -> Result<()> {
    let mut cases = vec![(Device::cpu(), false, 1e-5), (Device::cpu(), true, 3e-2)];
    cases.extend(
        common::gpu_devices("transformer_block")
            .into_iter()
            .map(|d| (d, false, 1e-5)),
    );
    for (device, autocast, tol) in cases {
        let policies = [Recompute::Nothing, Recompute::Norms, Recompute::NormsAndActivation];
        for (causal, recompute) in [false, true].into_iter().flat_map(|c| policies.map(|r| (c, r))) {
            let got = run(&device, causal, autocast, recompute, false)?;
            let want = run(&device, causal, autocast, recompute, true)?;
            let names = std::iter::once("output").chain(std::iter::once("input")).chain(NAMES);
            for ((name, g), w) in names.zip(&got).zip(&want) {
                let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                let worst = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale;
                assert!(
                    worst <= tol,
                    "{device} causal={causal} autocast={autocast} {recompute:?} {name}: worst difference {worst:.3e}"
                );
            }
        }
    }
    Ok(())
}
