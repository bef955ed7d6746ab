//! The packed attention's backward builds the gradient of `qkv` once: measured with the CPU
//! allocator's statistics against the three views of the same tensor through
//! `scaled_dot_product_attention`, whose backward gives each view a zero-filled gradient of the
//! whole `qkv` and adds them. One test function: the counters are process-wide, and tests in one
//! binary run on parallel threads.

use cartage::{DType, Device, Result, Tensor, Var, memory_stats, reset_peak_memory_stats};

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
