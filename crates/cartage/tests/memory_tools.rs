//! The memory tools against real allocations on every device under test: the training-memory
//! estimate equals what the allocator reports after allocating those tensors (R19), the fit check
//! follows free memory and limits (R2), the tracker catches a planted leak and passes its fix
//! (R20, R23), and the summary shows live tensors with their creation lines.

mod memory_support;

use cartage::memory::{MemoryTracker, Optimizer, TrainingEstimate, memory_summary, tensor_bytes};
use cartage::{DType, Device, Error, Op, Tensor, Var, backend, format_bytes, memory_stats};
use memory_support::{devices_under_test, serial, temp_path};

/// The parameter shapes of a small MLP.
const SHAPES: [&[usize]; 4] = [&[784, 256], &[256], &[256, 10], &[10]];

fn check_estimate(device: &Device, dtype: DType, optimizer: Optimizer) {
    let estimate = TrainingEstimate::for_shapes(&SHAPES, dtype, optimizer).unwrap();
    let before = memory_stats(device).unwrap();
    let copies = 2 + optimizer.state_buffers() as usize; // parameters, gradients, state
    let mut held = Vec::new();
    for _ in 0..copies {
        for shape in SHAPES {
            held.push(Tensor::zeros(shape, dtype, device).unwrap());
        }
    }
    let after = memory_stats(device).unwrap();
    let requested = (after.requested_bytes - before.requested_bytes) as u64;
    let allocated = (after.allocated_bytes - before.allocated_bytes) as u64;
    assert_eq!(
        requested,
        estimate.total_bytes(),
        "{device} {dtype} {optimizer:?}: the estimate ({estimate}) must equal the bytes requested"
    );
    let rounding = 512 * held.len() as u64;
    assert!(
        allocated >= requested && allocated <= requested + rounding,
        "{device}: allocated grew by {allocated} for {requested} requested (rounding allows {rounding})"
    );
    println!(
        "{device}: {estimate}; allocator: +{} allocated",
        format_bytes(allocated)
    );
}

#[test]
fn estimate_matches_what_the_allocator_reports() {
    let _guard = serial();
    for device in devices_under_test("memory_tools/estimate") {
        let caps = backend(&device).unwrap().capabilities().clone();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            if !caps.supports(Op::Fill, dtype) {
                memory_support::skip(&format!("memory_tools/estimate on {device}: no fill for {dtype}"));
                continue;
            }
            for optimizer in [Optimizer::Sgd, Optimizer::SgdMomentum, Optimizer::Adam] {
                check_estimate(&device, dtype, optimizer);
            }
        }
    }
}

#[test]
fn fits_follows_free_memory_and_limits() {
    let _guard = serial();
    for device in devices_under_test("memory_tools/fits") {
        let small = TrainingEstimate::new(1 << 20, DType::F32, Optimizer::Adam);
        match small.check(&device) {
            Ok(report) => {
                assert!(report.fits(), "{report}");
                assert!(report.available > 0 && report.total.is_none_or(|t| t >= report.available / 2));
                let huge = TrainingEstimate::new(1 << 50, DType::F32, Optimizer::Adam);
                assert!(!huge.fits(&device).unwrap(), "{}", huge.check(&device).unwrap());
            }
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("cannot report its free memory"), "{reason}");
                memory_support::skip(&format!("memory_tools/fits free memory on {device}: {reason}"));
            }
            Err(other) => panic!("{device}: {other}"),
        }
        // A limit is a budget every device can be checked against.
        let allocator_limit_guard = LimitGuard::set(&device, 8 << 20);
        let medium = TrainingEstimate::new(4 << 20, DType::F32, Optimizer::Sgd); // 32 MiB
        let limited = medium.check(&device).unwrap();
        assert!(
            !limited.fits(),
            "a limit of 8 MiB above reserved must refuse 32 MiB: {limited}"
        );
        let tiny = TrainingEstimate::new(1 << 10, DType::F32, Optimizer::Sgd); // 8 KiB
        assert!(tiny.fits(&device).unwrap(), "{}", tiny.check(&device).unwrap());
        drop(allocator_limit_guard);
    }
}

/// Caps `device`'s reserved memory at its current reserve + `headroom`; lifts the cap on drop.
struct LimitGuard(Device);

impl LimitGuard {
    fn set(device: &Device, headroom: usize) -> Self {
        cartage::empty_cache(device).unwrap(); // cached free blocks would count as available
        let b = backend(device).unwrap();
        b.allocator()
            .set_limit(Some(b.memory_stats().reserved_bytes + headroom));
        LimitGuard(*device)
    }
}

impl Drop for LimitGuard {
    fn drop(&mut self) {
        backend(&self.0).unwrap().allocator().set_limit(None);
    }
}

/// One training-like step: a batch through a weight that is a variable, a loss on the device
/// with its graph (the matmul saves the batch and the weight, the tanh its output).
fn step_loss(device: &Device, weight: &Var, step: u64) -> Tensor {
    let x = Tensor::rand(&[64, 64], DType::F32, step, device).unwrap();
    x.matmul(&weight.tensor()).unwrap().tanh().unwrap().mean_all().unwrap()
}

#[test]
fn tracker_catches_a_planted_leak_and_passes_the_fix() {
    let _guard = serial();
    for device in devices_under_test("memory_tools/tracker") {
        let weight = Var::new(Tensor::rand(&[64, 64], DType::F32, 99, &device).unwrap()).unwrap();
        // The leak (R23): every step's loss kept in a list, each with its graph, which holds
        // the step's batch and activations.
        let mut leaky = MemoryTracker::new(&device).with_window(16);
        let mut losses = Vec::new();
        for step in 0..24 {
            losses.push(step_loss(&device, &weight, step));
            leaky.record().unwrap();
        }
        let check = leaky.leak_check().unwrap();
        assert!(check.is_leak(), "{device}: {check}");
        let per_step_activations = 2.0 * tensor_bytes(&[64, 64], DType::F32).unwrap() as f64;
        assert!(check.bytes_per_step >= per_step_activations, "{check}");
        assert!(check.to_string().contains("autograd graph grows"), "{check}");
        assert!(check.last_activations >= check.first_activations + 15 * per_step_activations as usize);
        let svg = temp_path(&format!("leak-{}.svg", device.kind().name()));
        leaky.write_svg(&svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.starts_with("<svg") && text.contains("allocated") && text.contains("LEAK"),
            "{text:.300}"
        );
        drop(losses);

        // The fix: accumulate on the device, read once at the end.
        let mut fixed = MemoryTracker::new(&device).with_window(16);
        let mut total = Tensor::zeros(&[], DType::F32, &device).unwrap();
        let mut expected = 0.0f64;
        for step in 0..24 {
            let loss = step_loss(&device, &weight, step);
            expected += f64::from(loss.item::<f32>().unwrap());
            total = total.add(&loss.detach()).unwrap();
            drop(loss); // the step's graph goes with it (a training step's backward frees it too)
            fixed.record().unwrap();
        }
        let check = fixed.leak_check().unwrap();
        assert!(!check.is_leak(), "{device}: {check}");
        assert_eq!(check.last_activations, 0, "{device}: detached losses hold no graph");
        let read_once = f64::from(total.item::<f32>().unwrap());
        assert!(
            (read_once - expected).abs() < 1e-3 * expected.abs().max(1.0),
            "{read_once} vs {expected}"
        );
    }
}

#[test]
fn summary_shows_live_tensors_and_their_lines() {
    let _guard = serial();
    for device in devices_under_test("memory_tools/summary") {
        let big = Tensor::zeros(&[3 << 20], DType::U8, &device).unwrap();
        let line = line!() - 1;
        let stats = memory_stats(&device).unwrap();
        let text = memory_summary(&device).unwrap();
        assert!(text.contains(&format!("cartage memory summary: {device}")), "{text}");
        assert!(text.contains(&format_bytes(stats.allocated_bytes as u64)), "{text}");
        assert!(text.contains(&format_bytes(stats.reserved_bytes as u64)), "{text}");
        assert!(
            text.contains(&format!("memory_tools.rs:{line}")),
            "creation line missing:\n{text}"
        );
        for row in [
            "Cache hits",
            "Segments",
            "Fragmentation",
            "Out-of-memory errors",
            "Pinned host memory",
        ] {
            assert!(text.contains(row), "{row} missing:\n{text}");
        }
        drop(big);
        let after = memory_summary(&device).unwrap();
        assert!(!after.contains(&format!("memory_tools.rs:{line}")), "{after}");
    }
}
