//! The packed attention's backward builds the gradient of `qkv` once: measured with the CPU
//! allocator's statistics against the three views of the same tensor through
//! `scaled_dot_product_attention`, whose backward gives each view a zero-filled gradient of the
//! whole `qkv` and adds them. One test function per device: the counters are per device, and
//! tests in one binary run on parallel threads. On a GPU that fuses attention, the forward keeps
//! one copy of its output for the backward.

mod common;

use cartage::{DType, Device, Op, Result, Tensor, Var, memory_stats, reset_peak_memory_stats, synchronize};

/// The bytes allocated beyond the level before `loss.backward()` at its peak.
fn backward_peak(loss: Tensor) -> Result<usize> {
    let cpu = Device::cpu();
    reset_peak_memory_stats(&cpu)?;
    let before = memory_stats(&cpu)?.allocated_bytes;
    loss.backward()?;
    Ok(memory_stats(&cpu)?.peak_allocated_bytes - before)
}

#[test]
fn the_packed_gradient_is_built_once() -> Result<()> {
    let cpu = Device::cpu();
    // Few positions and wide heads: the [B, H, T, T] scores are small beside qkv's gradient.
    let (b, t, h, e) = (4, 4, 2, 256);
    let width = 3 * h * e;
    let x = Tensor::randn(&[b, t, width], DType::F32, 1, &cpu)?;
    let qkv_bytes = x.size_in_bytes();

    let qkv = Var::new(x.clone())?;
    let y = Tensor::scaled_dot_product_attention_packed(&qkv.tensor(), h, None, true, None)?;
    let packed_peak = backward_peak(y.sum_all()?)?;
    let packed_grad = qkv.grad().expect("qkv has a gradient").to_vec::<f32>()?;
    drop(qkv);

    let qkv = Var::new(x)?;
    let split = qkv.tensor().reshape(&[b, t, 3, h, e])?;
    let part = |i: isize| split.select(2, i)?.transpose(1, 2);
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let y = Tensor::scaled_dot_product_attention(&q, &k, &v, None, true, None)?
        .transpose(1, 2)?
        .reshape(&[b, t, h * e])?;
    let views_peak = backward_peak(y.sum_all()?)?;
    let views_grad = qkv.grad().expect("qkv has a gradient").to_vec::<f32>()?;
    // The packed backward holds the three parts' gradients ([B, H, T, E] each) and the one
    // gradient of qkv they are copied into: twice qkv's size, and the small scores. The views'
    // backward holds a zero-filled qkv-sized gradient per view, and their sum, on top.
    let slack = qkv_bytes / 8;
    assert!(
        packed_peak <= 2 * qkv_bytes + slack,
        "the packed backward peaked {packed_peak} bytes above its start, for a qkv of {qkv_bytes}: more than one \
         gradient of qkv's size besides the parts' gradients"
    );
    assert!(
        packed_peak + qkv_bytes / 2 <= views_peak,
        "the packed backward peaked {packed_peak} bytes, the three views' {views_peak} (qkv: {qkv_bytes})"
    );
    let diff = packed_grad
        .iter()
        .zip(&views_grad)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff <= 1e-5, "the two gradients differ by {diff}");
    Ok(())
}

/// Where the forward is fused (it saves the log-sum-exp for a fused backward), the node keeps its
/// own `[B, T, H·E]` result for the backward, the tensor the caller holds anyway, and not the
/// kernel's `[B, H, T, E]` output beside it: the forward leaves one output's worth of memory
/// (and the small log-sum-exp) allocated, not two.
#[test]
fn the_fused_packed_node_keeps_one_copy_of_its_output() -> Result<()> {
    for device in common::gpu_devices("attention_packed_memory/output") {
        let caps = cartage::backend(&device)?.capabilities().clone();
        if !(caps.supports(Op::Attention, DType::F32) && caps.supports(Op::AttentionBackward, DType::F32)) {
            common::skip(&format!(
                "attention_packed_memory/output: {device} does not fuse f32 attention"
            ));
            continue;
        }
        let (b, t, h, e) = (2, 64, 4, 32);
        // Made on the device from host values: nothing on the CPU's allocator, which the test
        // beside this one measures.
        let values: Vec<f32> = (0..b * t * 3 * h * e)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let x = Tensor::from_vec(values, &[b, t, 3 * h * e], &device)?;
        let qkv = Var::new(x)?;
        synchronize(&device)?;
        let before = memory_stats(&device)?.allocated_bytes;
        let y = Tensor::scaled_dot_product_attention_packed(&qkv.tensor(), h, None, true, None)?;
        synchronize(&device)?;
        let held = memory_stats(&device)?.allocated_bytes - before;
        let (out_bytes, lse_bytes) = (y.size_in_bytes(), b * h * t * 4);
        assert!(
            held < out_bytes + out_bytes / 2 + lse_bytes,
            "{device}: the forward left {held} bytes allocated for an output of {out_bytes} and a \
             log-sum-exp of {lse_bytes}: a second copy of the output is kept"
        );
        y.sum_all()?.backward()?;
        assert!(qkv.grad().is_some());
    }
    Ok(())
}
