//! CUDA graphs (`cartage::cuda_graph`): a captured MLP forward replays like eager code on new
//! inputs (written in place, or copied from pinned memory); a captured forward and backward
//! replays the eager gradients; host waits and random draws are refused while capturing, and the
//! device works normally afterwards; memory allocated while capturing stays the graph's; devices
//! without graphs say so; a graph holds the storages it captured, so dropping its inputs and
//! outputs (and `empty_cache`) never lets a replay touch new tensors or freed memory. Skips loudly without a CUDA device (fails with `CARTAGE_REQUIRE=cuda`).

mod memory_support;

use cartage::{DType, Device, DeviceKind, ErrorKind, Tensor, Var, backend, cuda_graph};
use memory_support::{required, serial};

fn gpu(test: &str) -> Option<Device> {
    let device = Device::cuda(0);
    match backend(&device) {
        Ok(_) => Some(device),
        Err(e) => {
            assert!(
                !required(DeviceKind::Cuda),
                "{test}: CARTAGE_REQUIRE names cuda but cuda:0 did not open: {e}"
            );
            cartage_core::testsuite::skip::device_missing(test, "cuda:0", &e.to_string());
            None
        }
    }
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{what}[{i}]: {x} against {y}");
    }
}

fn mlp(x: &Tensor, w1: &Tensor, w2: &Tensor) -> cartage::Result<Tensor> {
    x.matmul(w1)?.relu()?.matmul(w2)?.tanh()
}

#[test]
fn a_captured_mlp_forward_replays_like_eager() {
    let _guard = serial();
    let Some(gpu) = gpu("cuda_graph/mlp") else { return };
    let x = Tensor::zeros(&[64, 128], DType::F32, &gpu).unwrap();
    let w1 = Tensor::randn(&[128, 256], DType::F32, 1, &gpu)
        .unwrap()
        .mul_scalar(0.1)
        .unwrap();
    let w2 = Tensor::randn(&[256, 32], DType::F32, 2, &gpu)
        .unwrap()
        .mul_scalar(0.1)
        .unwrap();
    drop(mlp(&x, &w1, &w2).unwrap()); // warm-up
    let (graph, y) = cuda_graph(&gpu, || mlp(&x, &w1, &w2)).unwrap();
    assert!(graph.nodes() >= 4, "{} nodes", graph.nodes());
    assert!(graph.pool_bytes() > 0);
    for step in 0..4u64 {
        let input = Tensor::randn(&[64, 128], DType::F32, 10 + step, &gpu).unwrap();
        x.copy_from(&input).unwrap();
        graph.replay().unwrap();
        let eager = mlp(&input, &w1, &w2).unwrap();
        close(
            &y.to_vec::<f32>().unwrap(),
            &eager.to_vec::<f32>().unwrap(),
            &format!("replay {step}"),
        );
    }
    // An input refreshed by an asynchronous copy from pinned memory: the replay waits for it.
    let host: Vec<f32> = (0..64 * 128).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
    let mut pinned = cartage::alloc_pinned(&gpu, host.len() * 4).unwrap();
    pinned.as_mut_slice_of::<f32>().unwrap().copy_from_slice(&host);
    x.copy_from_pinned_async(&pinned).unwrap().detach();
    graph.replay().unwrap();
    let eager = mlp(&Tensor::from_slice(&host, &[64, 128], &gpu).unwrap(), &w1, &w2).unwrap();
    close(
        &y.to_vec::<f32>().unwrap(),
        &eager.to_vec::<f32>().unwrap(),
        "after a pinned copy",
    );
}

#[test]
fn a_captured_forward_and_backward_replays_the_gradients() {
    let _guard = serial();
    let Some(gpu) = gpu("cuda_graph/backward") else { return };
    let x = Tensor::zeros(&[32, 64], DType::F32, &gpu).unwrap();
    let target = Tensor::zeros(&[32, 16], DType::F32, &gpu).unwrap();
    let w1 = Var::new(
        Tensor::randn(&[64, 48], DType::F32, 3, &gpu)
            .unwrap()
            .mul_scalar(0.2)
            .unwrap(),
    )
    .unwrap();
    let w2 = Var::new(
        Tensor::randn(&[48, 16], DType::F32, 4, &gpu)
            .unwrap()
            .mul_scalar(0.2)
            .unwrap(),
    )
    .unwrap();
    let step = || -> cartage::Result<Tensor> {
        let out = mlp(&x, &w1.tensor(), &w2.tensor())?;
        let loss = out.sub(&target)?.square()?.mean_all()?;
        loss.backward()?;
        Ok(loss.detach())
    };
    drop(step().unwrap()); // warm-up
    w1.zero_grad();
    w2.zero_grad();
    // Gradients are absent when the capture starts, so the graph writes them (no accumulation).
    let (graph, loss) = cuda_graph(&gpu, step).unwrap();
    let (g1, g2) = (w1.grad().unwrap(), w2.grad().unwrap());
    for seed in 0..3u64 {
        let (xs, ts) = (
            Tensor::randn(&[32, 64], DType::F32, 20 + seed, &gpu).unwrap(),
            Tensor::randn(&[32, 16], DType::F32, 30 + seed, &gpu).unwrap(),
        );
        x.copy_from(&xs).unwrap();
        target.copy_from(&ts).unwrap();
        graph.replay().unwrap();
        // The same step, eager, on fresh variables holding the same weights.
        let (e1, e2) = (
            Var::new(w1.tensor().clone()).unwrap(),
            Var::new(w2.tensor().clone()).unwrap(),
        );
        let eager = mlp(&xs, &e1.tensor(), &e2.tensor())
            .unwrap()
            .sub(&ts)
            .unwrap()
            .square()
            .unwrap()
            .mean_all()
            .unwrap();
        eager.backward().unwrap();
        close(&[loss.item::<f32>().unwrap()], &[eager.item::<f32>().unwrap()], "loss");
        close(
            &g1.to_vec::<f32>().unwrap(),
            &e1.grad().unwrap().to_vec::<f32>().unwrap(),
            "grad w1",
        );
        close(
            &g2.to_vec::<f32>().unwrap(),
            &e2.grad().unwrap().to_vec::<f32>().unwrap(),
            "grad w2",
        );
    }
}

#[test]
fn host_waits_and_random_draws_are_refused_while_capturing() {
    let _guard = serial();
    let Some(gpu) = gpu("cuda_graph/refused") else { return };
    let x = Tensor::ones(&[8], DType::F32, &gpu).unwrap();
    drop(x.add(&x).unwrap());
    type Case<'a> = Box<dyn Fn() -> cartage::Result<()> + 'a>;
    let cases: Vec<(&str, Case<'_>)> = vec![
        ("to_vec", Box::new(|| x.add(&x)?.to_vec::<f32>().map(drop))),
        ("synchronize", Box::new(|| cartage::synchronize(&gpu))),
        (
            "upload",
            Box::new(|| Tensor::from_slice(&[1.0f32, 2.0], &[2], &gpu).map(drop)),
        ),
        ("random", Box::new(|| Tensor::rand(&[4], DType::F32, 1, &gpu).map(drop))),
    ];
    for (what, case) in cases {
        let err = cuda_graph(&gpu, case).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::GraphCapture, "{what}: {err}");
        assert!(err.to_string().contains("captures a graph"), "{what}: {err}");
        // The capture ended: the device works as before.
        assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), vec![2.0; 8], "{what}");
    }
    // A panic inside the capture ends it too.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = cuda_graph(&gpu, || -> cartage::Result<()> { panic!("inside the capture") });
    }));
    assert!(panicked.is_err());
    assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), vec![2.0; 8]);
}

#[test]
fn memory_allocated_while_capturing_stays_the_graphs() {
    let _guard = serial();
    let Some(gpu) = gpu("cuda_graph/pool") else { return };
    let x = Tensor::ones(&[1 << 20], DType::F32, &gpu).unwrap();
    drop(x.exp().unwrap());
    // The closure's temporary (exp) is freed inside the capture; the replay still writes it.
    let (graph, y) = cuda_graph(&gpu, || x.exp()?.add_scalar(1.0)).unwrap();
    let held = graph.pool_bytes();
    assert!(held >= 2 * (4 << 20), "{held}");
    // New tensors made now never land in the graph's memory.
    let others: Vec<Tensor> = (0..4)
        .map(|i| Tensor::full(&[1 << 20], i as f32, DType::F32, &gpu).unwrap())
        .collect();
    for _ in 0..3 {
        graph.replay().unwrap();
    }
    for (i, t) in others.iter().enumerate() {
        assert!(
            t.to_vec::<f32>().unwrap().iter().all(|v| *v == i as f32),
            "tensor {i} was overwritten"
        );
    }
    let e = std::f32::consts::E + 1.0;
    assert!(y.to_vec::<f32>().unwrap().iter().all(|v| (v - e).abs() < 1e-5));
    drop(graph);
    drop(y);
}

/// The captured work: `out = tanh(x · w) + bias`, written in place into `out`.
fn affine_into(out: &Tensor, x: &Tensor, w: &Tensor, bias: &Tensor) -> cartage::Result<()> {
    out.copy_from(&x.matmul(w)?.tanh()?.add(bias)?)
}

/// Every value of `t` equals `value`.
fn all_equal(t: &Tensor, value: f32, what: &str) {
    let values = t.to_vec::<f32>().unwrap();
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| **v != value) {
        panic!("{what}: element {i} is {v}, expected {value} (the graph wrote a tensor it never captured)");
    }
}

#[test]
fn a_graph_holds_the_storages_it_captured() {
    let _guard = serial();
    let Some(gpu) = gpu("cuda_graph/holds") else { return };
    let (m, k, n) = (256, 512, 256);
    let x = Tensor::randn(&[m, k], DType::F32, 3, &gpu)
        .unwrap()
        .mul_scalar(0.05)
        .unwrap();
    let w = Tensor::randn(&[k, n], DType::F32, 4, &gpu)
        .unwrap()
        .mul_scalar(0.05)
        .unwrap();
    let bias = Tensor::randn(&[n], DType::F32, 5, &gpu).unwrap();
    let out = Tensor::zeros(&[m, n], DType::F32, &gpu).unwrap();
    affine_into(&out, &x, &w, &bias).unwrap(); // warm-up
    let (graph, y) = cuda_graph(&gpu, || {
        affine_into(&out, &x, &w, &bias)?;
        out.mul_scalar(2.0)
    })
    .unwrap();
    let expected = x
        .matmul(&w)
        .unwrap()
        .tanh()
        .unwrap()
        .add(&bias)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let doubled: Vec<f32> = expected.iter().map(|v| v * 2.0).collect();
    // Drop every input and the in-place output; the graph still holds their memory.
    drop((x, w, bias, out));
    // New tensors of the same sizes: the allocator hands out its cached blocks first, which
    // were the dropped tensors' blocks if the graph did not hold them.
    let sizes = [[m, k], [k, n], [1, n], [m, n]];
    let fresh: Vec<Tensor> = (0..4)
        .flat_map(|round| sizes.iter().map(move |s| (round, *s)))
        .map(|(round, s)| {
            let shape: Vec<usize> = if s[0] == 1 { vec![s[1]] } else { s.to_vec() };
            Tensor::full(&shape, 100.0 + round as f32, DType::F32, &gpu).unwrap()
        })
        .collect();
    for _ in 0..3 {
        graph.replay().unwrap();
    }
    cartage::synchronize(&gpu).unwrap();
    for (i, t) in fresh.iter().enumerate() {
        all_equal(t, 100.0 + (i / sizes.len()) as f32, &format!("fresh tensor {i}"));
    }
    close(
        &y.to_vec::<f32>().unwrap(),
        &doubled,
        "output after the inputs were dropped",
    );
    // The output returned by the closure dropped too: new tensors stay untouched.
    drop(y);
    let more: Vec<Tensor> = (0..4)
        .map(|i| Tensor::full(&[m, n], -(i as f32), DType::F32, &gpu).unwrap())
        .collect();
    graph.replay().unwrap();
    cartage::synchronize(&gpu).unwrap();
    for (i, t) in more.iter().enumerate() {
        all_equal(t, -(i as f32), &format!("tensor {i} made after the output was dropped"));
    }
    drop(graph);
    // The graph gone, its storages go back to the allocator and the device works normally.
    let again = Tensor::ones(&[m, n], DType::F32, &gpu).unwrap();
    all_equal(&again.add(&again).unwrap(), 2.0, "after the graph");
}

#[test]
fn empty_cache_then_replay_works() {
    let _guard = serial();
    let Some(gpu) = gpu("cuda_graph/empty_cache") else {
        return;
    };
    let x = Tensor::full(&[1 << 20], 0.5f32, DType::F32, &gpu).unwrap();
    let out = Tensor::zeros(&[1 << 20], DType::F32, &gpu).unwrap();
    out.copy_from(&x.exp().unwrap()).unwrap(); // warm-up
    let (graph, y) = cuda_graph(&gpu, || {
        out.copy_from(&x.exp()?)?;
        out.add_scalar(1.0)
    })
    .unwrap();
    drop((x, out));
    // Give every free cached block back to the driver: the inputs' memory would be freed here
    // if the graph did not hold it (then a replay reads and writes unmapped memory).
    cartage::empty_cache(&gpu).unwrap();
    for _ in 0..3 {
        graph.replay().unwrap();
    }
    cartage::synchronize(&gpu).unwrap();
    let e = 0.5f32.exp() + 1.0;
    assert!(
        y.to_vec::<f32>().unwrap().iter().all(|v| (v - e).abs() < 1e-5),
        "the replay after empty_cache gave wrong values"
    );
    drop(graph);
    drop(y);
    cartage::empty_cache(&gpu).unwrap();
    let t = Tensor::ones(&[16], DType::F32, &gpu).unwrap();
    all_equal(&t.add(&t).unwrap(), 2.0, "after the graph and empty_cache");
}

#[test]
fn devices_without_graphs_say_so() {
    let err = cuda_graph(&Device::cpu(), || Ok(())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    // Graph capture does not depend on a dtype: the message must not send the reader to one.
    let message = err.to_string();
    assert!(message.contains("graph capture"), "{message}");
    assert!(!message.contains("dtype"), "{message}");
}
