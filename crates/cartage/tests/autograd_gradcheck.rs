//! Every differentiable op's backward against central finite differences, in f64 on the CPU.

mod autograd_support;

use autograd_support::{analytic, cases, inputs, loss_at};
use cartage::{DType, Device};

const STEP: f64 = 1e-6;

#[test]
fn every_op_matches_finite_differences_in_f64() {
    let cpu = Device::cpu();
    let mut failures = Vec::new();
    for case in cases::all() {
        let grads = match analytic(&case, DType::F64, &cpu) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{}: backward failed: {e}", case.name));
                continue;
            }
        };
        let base: Vec<Vec<f64>> = inputs(&case, DType::F64, &cpu)
            .unwrap()
            .iter()
            .map(|t| t.to_vec::<f64>().unwrap())
            .collect();
        for (i, grad) in grads.iter().enumerate() {
            for j in 0..base[i].len() {
                let mut plus = base.clone();
                plus[i][j] += STEP;
                let mut minus = base.clone();
                minus[i][j] -= STEP;
                let numeric = (loss_at(&case, &plus).unwrap() - loss_at(&case, &minus).unwrap()) / (2.0 * STEP);
                let err = (grad[j] - numeric).abs();
                let rel = if case.through_f32() { 5e-2 } else { 1e-4 };
                if err > 1e-5 + rel * numeric.abs() || !grad[j].is_finite() {
                    failures.push(format!(
                        "{}: input {i} element {j}: backward {} vs finite difference {numeric}",
                        case.name, grad[j]
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
