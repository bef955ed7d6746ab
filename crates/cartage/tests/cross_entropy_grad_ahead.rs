//! The reduced `cross_entropy` of logits that need a gradient writes that gradient in its
//! forward pass and hands it over when backward starts from the loss. Checked against the
//! per-row losses (`Reduction::None`, whose gradient backward makes from the saved logits)
//! reduced by hand: the mean and the sum, ignored rows, label smoothing, i32 and i64 targets, a
//! single row; backward passes from a scaled loss, a loss used twice, a caller's seed and a
//! retained graph; and the memory: the node keeps the gradient and not the logits, and a
//! backward from the loss allocates no tensor of the logits' size. On the CPU and every GPU that
//! opens, each missing one skipped loudly.

mod common;

use cartage::tensor::nn::{CrossEntropy, Reduction};
use cartage::{DType, Device, Result, Tensor, Var, graph_memory, memory_stats, reset_peak_memory_stats};

const N: usize = 6;
const C: usize = 5;
/// Row 2 and row 4 are ignored.
const TARGET: [i64; N] = [3, 0, -100, 4, -100, 1];

fn devices() -> Vec<(Device, DType, f64)> {
    let mut all = vec![(Device::cpu(), DType::F64, 1e-12), (Device::cpu(), DType::F32, 2e-6)];
    for d in common::gpu_devices("cross_entropy_grad_ahead") {
        all.push((d, DType::F32, 2e-6));
    }
    all
}

/// Logits `[N, C]` spread over ±4, made on the CPU in f64 and moved, so every device sees the
/// same values.
fn logits(dtype: DType, device: &Device) -> Result<Var> {
    let x = Tensor::randn(&[N, C], DType::F64, 7, &Device::cpu())?.mul_scalar(2.0)?;
    Var::new(x.to_device_dtype(device, dtype)?)
}

fn target(index: DType, device: &Device) -> Result<Tensor> {
    Tensor::from_slice(&TARGET, &[N], device)?.to_dtype(index)
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.to_vec::<f64>()
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i} is {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// The loss and the logits' gradient of `seed · loss`, through the fused node (`reference`
/// false) or through the per-row losses reduced by hand (`reference` true). `run` takes the
/// loss and runs backward from it however the case asks.
fn loss_and_grad(
    device: &Device,
    dtype: DType,
    index: DType,
    opts: CrossEntropy,
    reference: bool,
    run: &dyn Fn(&Tensor) -> Result<()>,
) -> Result<(f64, Vec<f64>)> {
    let x = logits(dtype, device)?;
    let t = target(index, device)?;
    let loss = if reference {
        let per_row = x.tensor().cross_entropy(
            &t,
            CrossEntropy {
                reduction: Reduction::None,
                ..opts
            },
        )?;
        let kept = TARGET.iter().filter(|&&c| c != opts.ignore_index).count();
        match opts.reduction {
            Reduction::Mean => per_row.sum_all()?.mul_scalar(1.0 / kept as f64)?,
            _ => per_row.sum_all()?,
        }
    } else {
        x.tensor().cross_entropy(&t, opts)?
    };
    let value = values(&loss)?[0];
    run(&loss)?;
    Ok((value, values(&x.grad().expect("the logits have a gradient"))?))
}

#[test]
fn the_gradient_written_ahead_matches_the_one_made_in_backward() -> Result<()> {
    let plain: &dyn Fn(&Tensor) -> Result<()> = &|loss| loss.backward().map(drop);
    let scaled: &dyn Fn(&Tensor) -> Result<()> = &|loss| loss.mul_scalar(3.0)?.backward().map(drop);
    let twice: &dyn Fn(&Tensor) -> Result<()> = &|loss| loss.add(loss)?.backward().map(drop);
    let seeded: &dyn Fn(&Tensor) -> Result<()> = &|loss| {
        let seed = Tensor::full(&[], -0.5, loss.dtype(), &loss.device())?;
        loss.backward_with(Some(&seed), false).map(drop)
    };
    // Twice through a retained graph: the gradients add up to twice the loss's.
    let retained: &dyn Fn(&Tensor) -> Result<()> = &|loss| {
        loss.backward_with(None, true)?;
        loss.backward_with(None, false).map(drop)
    };
    let runs = [
        ("backward()", plain),
        ("3 · loss", scaled),
        ("loss + loss", twice),
        ("a seed of -0.5", seeded),
        ("a retained graph, twice", retained),
    ];
    for (device, dtype, tol) in devices() {
        for reduction in [Reduction::Mean, Reduction::Sum] {
            for label_smoothing in [0.0, 0.1] {
                for index in [DType::I64, DType::I32] {
                    let opts = CrossEntropy {
                        reduction,
                        label_smoothing,
                        ..CrossEntropy::default()
                    };
                    for (name, run) in runs {
                        let what = format!("{device} {dtype} {reduction:?} ε {label_smoothing} {index} {name}");
                        let (loss, grad) = loss_and_grad(&device, dtype, index, opts, false, run)?;
                        let (want_loss, want_grad) = loss_and_grad(&device, dtype, index, opts, true, run)?;
                        close(&format!("{what}: loss"), &[loss], &[want_loss], tol);
                        close(&format!("{what}: gradient"), &grad, &want_grad, tol);
                        // Ignored rows get no gradient.
                        assert!(grad[2 * C..3 * C].iter().all(|&g| g == 0.0), "{what}: {grad:?}");
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn a_single_row_and_every_row_ignored() -> Result<()> {
    for (device, dtype, tol) in devices() {
        // One row [C] with a scalar target.
        let x = Var::new(logits(dtype, &device)?.tensor().select(0, 0)?.contiguous()?)?;
        let t = Tensor::from_slice(&[3i64], &[], &device)?;
        x.tensor().cross_entropy(&t, CrossEntropy::default())?.backward()?;
        let fused = values(&x.grad().expect("a gradient"))?;
        let y = Var::new(x.tensor().detach())?;
        let per_row = CrossEntropy {
            reduction: Reduction::None,
            ..CrossEntropy::default()
        };
        y.tensor().cross_entropy(&t, per_row)?.backward()?;
        close(
            &format!("{device} {dtype} one row"),
            &fused,
            &values(&y.grad().expect("a gradient"))?,
            tol,
        );

        // Every row ignored: the mean is NaN (0 / 0, as in PyTorch) and the gradient is zero.
        let x = logits(dtype, &device)?;
        let t = Tensor::full(&[N], -100i64, DType::I64, &device)?;
        let loss = x.tensor().cross_entropy(&t, CrossEntropy::default())?;
        assert!(values(&loss)?[0].is_nan(), "{device} {dtype}: the mean over no rows");
        loss.backward()?;
        let grad = values(&x.grad().expect("a gradient"))?;
        assert!(grad.iter().all(|&g| g == 0.0), "{device} {dtype}: {grad:?}");
    }
    Ok(())
}

/// One test function: the allocator's counters and the graph's memory are per device, and the
/// tests of one binary run on parallel threads.
#[test]
fn the_node_keeps_the_gradient_and_backward_allocates_nothing_of_its_size() -> Result<()> {
    let cpu = Device::cpu();
    let (n, c) = (64, 4096);
    let x = Var::new(Tensor::randn(&[n, c], DType::F32, 1, &cpu)?)?;
    let t = Tensor::from_vec((0..n as i64).map(|i| i * 61 % c as i64).collect(), &[n], &cpu)?;
    let logits_bytes = n * c * 4;
    let before = graph_memory(&cpu).saved_bytes;
    let loss = x.tensor().cross_entropy(&t, CrossEntropy::default())?;
    let kept = graph_memory(&cpu).saved_bytes - before;
    assert!(
        kept <= logits_bytes + 1024,
        "the graph keeps {kept} bytes for logits of {logits_bytes}: more than one tensor of their size"
    );
    // The logits are a variable here, so the gradient handed over becomes its gradient as it is.
    reset_peak_memory_stats(&cpu)?;
    let start = memory_stats(&cpu)?.allocated_bytes;
    loss.backward()?;
    let peak = memory_stats(&cpu)?.peak_allocated_bytes - start;
    assert!(
        peak < logits_bytes / 2,
        "backward from the loss peaked {peak} bytes above its start, for logits of {logits_bytes}: it made a \
         gradient the forward had already written"
    );

    // A scaled loss takes one pass, into a new tensor (a fresh variable: nothing to add to).
    let x = Var::new(x.tensor().detach())?;
    let loss = x.tensor().cross_entropy(&t, CrossEntropy::default())?;
    let scaled = loss.mul_scalar(2.0)?;
    reset_peak_memory_stats(&cpu)?;
    let start = memory_stats(&cpu)?.allocated_bytes;
    scaled.backward()?;
    let peak = memory_stats(&cpu)?.peak_allocated_bytes - start;
    assert!(
        peak >= logits_bytes,
        "a scaled loss's backward peaked {peak} bytes: the gradient was not scaled into a tensor of its own"
    );
    Ok(())
}
