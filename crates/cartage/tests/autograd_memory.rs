//! What backward keeps and frees, measured with the allocator's statistics and the graph's
//! own counters. One test function: the counters are process-wide, and tests in one binary run
//! on parallel threads.

use cartage::{DType, Device, Result, Tensor, Var, memory_stats, reset_peak_memory_stats};

fn allocated() -> usize {
    memory_stats(&Device::cpu()).unwrap().allocated_bytes
}

#[test]
fn backward_frees_the_graph_and_computes_nothing_off_the_path() -> Result<()> {
    let cpu = Device::cpu();
    let w = Var::new(Tensor::randn(&[256, 256], DType::F32, 1, &cpu)?)?;
    let x = Tensor::randn(&[64, 256], DType::F32, 2, &cpu)?;

    // Memory returns to its level before the forward pass once the loss and gradient go.
    let before = allocated();
    let loss = x
        .matmul(&w.tensor())?
        .relu()?
        .matmul(&w.tensor().t()?)?
        .tanh()?
        .mean_all()?;
    assert!(cartage::saved_activation_bytes() > 0);
    assert!(cartage::live_graph_nodes() > 0);
    loss.backward()?;
    assert_eq!(
        cartage::saved_activation_bytes(),
        0,
        "backward released every saved tensor"
    );
    drop(loss);
    assert_eq!(cartage::live_graph_nodes(), 0);
    w.zero_grad();
    assert_eq!(
        allocated(),
        before,
        "memory after backward is back to its level before the forward pass"
    );

    // A branch that reaches no variable is not recorded, and the gradient of a constant
    // operand is never computed: a [1, N] constant times a one-element variable needs no
    // N-element gradient.
    let n = 1 << 20;
    let big = Tensor::ones(&[1, n], DType::F32, &cpu)?;
    let scale = Var::new(Tensor::ones(&[1, 1], DType::F32, &cpu)?)?;
    let off_path = big.exp()?; // no variable: nothing recorded
    assert!(!off_path.requires_grad());
    let loss = big.mul(&scale.tensor())?.sum_all()?.add(&off_path.sum_all()?)?;
    let nodes = cartage::live_graph_nodes();
    assert_eq!(nodes, 3, "mul, sum_all and add: the off-path branch added none");
    let allocations = |loss: Tensor| -> Result<(u64, usize)> {
        reset_peak_memory_stats(&cpu)?;
        let (count, start) = (memory_stats(&cpu)?.alloc_count, allocated());
        loss.backward()?;
        let stats = memory_stats(&cpu)?;
        Ok((stats.alloc_count - count, stats.peak_allocated_bytes - start))
    };
    let (constant_allocs, constant_peak) = allocations(loss)?;
    // The same product with `big` a variable too: its N-element gradient is computed (and kept).
    let big_var = Var::new(big.clone())?;
    let (variable_allocs, _) = allocations(big_var.tensor().mul(&scale.tensor())?.sum_all()?)?;
    assert!(
        constant_allocs < variable_allocs,
        "backward allocated {constant_allocs} times for a constant operand and {variable_allocs} for a variable \
         one: the constant's gradient was computed"
    );
    assert!(
        constant_peak <= 4 * n + (1 << 16),
        "one N-element temporary at most: {constant_peak} bytes"
    );
    scale.zero_grad();
    drop(big_var);
    let loss = big.mul(&scale.tensor())?.sum_all()?;
    loss.backward()?;
    assert_eq!(scale.grad().unwrap().to_vec::<f32>()?, vec![n as f32]);
    drop(loss);

    // Keeping losses with their graphs (LESSONS R23) keeps every activation alive; keeping
    // them detached keeps none.
    let mut kept = Vec::new();
    for _ in 0..5 {
        kept.push(x.matmul(&w.tensor())?.sigmoid()?.mean_all()?);
    }
    let held = cartage::saved_activation_bytes();
    assert!(
        held >= 5 * 64 * 256 * 4,
        "five graphs hold their activations: {held} bytes"
    );
    kept.clear();
    assert_eq!(cartage::saved_activation_bytes(), 0);
    let mut logged = Vec::new();
    for _ in 0..5 {
        logged.push(x.matmul(&w.tensor())?.sigmoid()?.mean_all()?.detach());
    }
    assert_eq!(cartage::saved_activation_bytes(), 0, "detached losses hold no graph");
    Ok(())
}
