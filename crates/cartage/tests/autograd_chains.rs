//! Random chains of ops, differentiated: for any composition of the ops below (element-wise,
//! broadcasting, views, reductions, softmax, matmul) the gradient of a variable matches central
//! finite differences in f64.

use cartage::{DType, Device, Result, Tensor, Var};
use proptest::prelude::*;

const SIDE: usize = 3;

/// One link of a chain: a function of the running value and a second, constant operand.
fn apply(op: u8, x: &Tensor, other: &Tensor) -> Result<Tensor> {
    match op % 14 {
        0 => x.mul_scalar(0.7)?.exp(),
        1 => x.tanh(),
        2 => x.sigmoid(),
        3 => x.sin(),
        4 => x.mul(other),
        5 => x.add(&other.sum(&[0], true)?),
        6 => x.square()?.mul_scalar(0.5),
        7 => x.t()?.contiguous(),
        8 => x.softmax(-1),
        9 => x.log_softmax(0),
        10 => x.matmul(other)?.mul_scalar(0.5),
        11 => x.sub(&x.mean(&[1], true)?),
        12 => x.maximum(other),
        _ => Tensor::cat(&[&x.narrow(0, 1, 2)?, &x.narrow(0, 0, 1)?], 0),
    }
}

fn run(chain: &[u8], x: &Tensor, other: &Tensor, weights: &Tensor) -> Result<Tensor> {
    let mut y = x.clone();
    for &op in chain {
        y = apply(op, &y, other)?;
    }
    y.mul(weights)?.sum_all()
}

fn tensor(values: &[f64]) -> Tensor {
    Tensor::from_slice(values, &[SIDE, SIDE], &Device::cpu()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_chains_match_finite_differences(
        chain in prop::collection::vec(any::<u8>(), 1..7),
        x in prop::collection::vec(-1.5f64..1.5, SIDE * SIDE),
        other in prop::collection::vec(-1.5f64..1.5, SIDE * SIDE),
        weights in prop::collection::vec(-1.0f64..1.0, SIDE * SIDE),
    ) {
        let (other_t, weights_t) = (tensor(&other), tensor(&weights));
        let var = Var::new(tensor(&x)).unwrap();
        run(&chain, &var.tensor(), &other_t, &weights_t).unwrap().backward().unwrap();
        let grad = var.grad().unwrap().to_vec::<f64>().unwrap();
        let _plain = cartage::no_grad();
        // The central difference cannot resolve less than the rounding of the loss itself: a
        // chain of exponentials can make one element's term 1e13 while another's slope is 1e3,
        // and then each evaluation is off by an ulp of 1e13. Allow that much beside the usual
        // tolerance (a few ulps of the loss, over the smaller step, through the extrapolation).
        let loss = run(&chain, &tensor(&x), &other_t, &weights_t).unwrap().item::<f64>().unwrap();
        // Chains of exponentials and squares reach slopes of 1e12, where no finite difference in
        // f64 is accurate: such draws say nothing about the backward and are drawn again.
        prop_assume!(loss.abs() < 1e6 && grad.iter().all(|g| g.abs() < 1e6));
        for j in 0..x.len() {
            let at = |delta: f64| {
                let mut moved = x.clone();
                moved[j] += delta;
                run(&chain, &tensor(&moved), &other_t, &weights_t).unwrap().item::<f64>().unwrap()
            };
            // A steep element (sin of exp of exp: slopes of 1e5) turns within a step of 1e-6,
            // so the step shrinks with the slope, and Richardson's extrapolation of two central
            // differences cancels their h² error.
            let h = 1e-6 / (1.0 + grad[j].abs() * 1e-3);
            let central = |step: f64| (at(step) - at(-step)) / (2.0 * step);
            let numeric = (4.0 * central(h / 2.0) - central(h)) / 3.0;
            let rounding = 24.0 * f64::EPSILON * loss.abs() / h;
            prop_assert!(
                (grad[j] - numeric).abs() <= 1e-5 + 1e-4 * numeric.abs() + rounding,
                "chain {:?}: element {}: backward {} vs finite difference {}", chain, j, grad[j], numeric
            );
        }
        prop_assert_eq!(DType::F64, var.grad().unwrap().dtype());
    }
}
