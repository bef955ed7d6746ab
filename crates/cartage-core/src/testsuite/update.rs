//! `Update`, the fused optimizer step (an optional kernel): where the backend lists
//! `Op::Update(kind)` for a dtype, SGD (plain, momentum on its first and a later step, dampening,
//! Nesterov, weight decay) and Adam/AdamW (with and without weight decay, early and late steps)
//! are run in place on parameters of 0 to 12288 elements and compared, parameter and state, with
//! the f64 formulas of [`crate::UpdateRule`] on the same rounded inputs; every other dtype must
//! be refused with `Unsupported`. Then malformed updates (missing state, a strided operand, a
//! parameter that aliases its gradient, β outside `[0, 1)`) must be refused with an error.

use crate::dtype::DType;
use crate::kernel::{Kernel, Op};
use crate::update_rule::{AdamUpdate, SgdUpdate, UpdateKind, UpdateRule};

use super::Spec;
use super::buffers::Operand;
use super::harness::Harness;
use super::reference::{Tolerance, accumulation_eps};
use super::views::ViewKind;

const SIZES: [&[usize]; 5] = [&[0], &[1], &[7], &[1000], &[3, 4096]];

pub(super) fn rules() -> Vec<UpdateRule> {
    let adam = AdamUpdate {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: false,
        step: 1,
    };
    let sgd = SgdUpdate {
        lr: 0.1,
        momentum: 0.0,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first_step: false,
    };
    vec![
        UpdateRule::Adam(adam),
        UpdateRule::Adam(AdamUpdate {
            weight_decay: 0.1,
            step: 7,
            ..adam
        }),
        UpdateRule::Adam(AdamUpdate {
            weight_decay: 0.01,
            decoupled: true,
            step: 1000,
            beta2: 0.95,
            eps: 1e-6,
            ..adam
        }),
        UpdateRule::Sgd(sgd),
        UpdateRule::Sgd(SgdUpdate {
            weight_decay: 0.01,
            ..sgd
        }),
        UpdateRule::Sgd(SgdUpdate {
            momentum: 0.9,
            first_step: true,
            ..sgd
        }),
        UpdateRule::Sgd(SgdUpdate {
            momentum: 0.9,
            dampening: 0.1,
            weight_decay: 1e-3,
            ..sgd
        }),
        UpdateRule::Sgd(SgdUpdate {
            momentum: 0.8,
            nesterov: true,
            ..sgd
        }),
    ]
}

/// Every rule × size × dtype the backend lists; the malformed cases.
pub fn update(h: &Harness) {
    for kind in UpdateKind::ALL {
        for dtype in DType::ALL {
            let rule = rules()
                .into_iter()
                .find(|r| r.kind() == kind)
                .expect("a rule of every kind");
            if !h.supports(Op::Update(kind), dtype) {
                let (p, g) = (h.upload(dtype, &[1.0; 3]), h.upload(dtype, &[1.0; 3]));
                let states: Vec<_> = (0..rule.state_count()).map(|_| h.upload(dtype, &[0.0; 3])).collect();
                let mut state = [None, None];
                for (slot, s) in state.iter_mut().zip(&states) {
                    *slot = Some(s.contiguous(&[3]));
                }
                let kernel = Kernel::Update {
                    rule,
                    grad: g.contiguous(&[3]),
                    state,
                    param: p.contiguous(&[3]),
                };
                h.expect_unsupported(&format!("{} {dtype}", kind.name()), &kernel);
                continue;
            }
            for rule in rules().into_iter().filter(|r| r.kind() == kind) {
                for shape in SIZES {
                    update_case(h, dtype, rule, shape);
                }
            }
        }
    }
    malformed(h);
}

fn update_case(h: &Harness, dtype: DType, rule: UpdateRule, shape: &[usize]) {
    let param = h.operand(dtype, ViewKind::Contiguous, shape, Spec::standard());
    let grad = h.operand(dtype, ViewKind::Contiguous, shape, Spec::standard());
    let first = h.operand(dtype, ViewKind::Contiguous, shape, Spec::standard());
    let second = h.operand(dtype, ViewKind::Contiguous, shape, Spec::new((0.0, 4.0), (0, 0)));
    let states: Vec<&Operand> = [&first, &second].into_iter().take(rule.state_count()).collect();
    let mut state = [None, None];
    for (slot, s) in state.iter_mut().zip(&states) {
        *slot = Some(s.arg());
    }
    let what = format!("{rule:?} {dtype} {shape:?}");
    let kernel = Kernel::Update {
        rule,
        grad: grad.arg(),
        state,
        param: param.arg(),
    };
    if !h.launch(&what, &kernel) {
        return;
    }
    let e = Expected::of(rule, dtype, &param.values, &grad.values, &first.values, &second.values);
    h.check_with(
        &format!("{what}: param"),
        &param.buf,
        &param.layout,
        &e.param,
        |i, _| e.allow_param[i],
    );
    if let Some(s) = states.first() {
        h.check_with(&format!("{what}: first state"), &s.buf, &s.layout, &e.first, |i, _| {
            e.allow_first[i]
        });
    }
    if let Some(s) = states.get(1) {
        h.check_with(
            &format!("{what}: second state"),
            &s.buf,
            &s.layout,
            &e.second,
            |i, _| e.allow_second[i],
        );
    }
}

/// The f64 reference of one update and the allowance of each element, for the parameter and
/// both state slots (unused slots hold zeros).
pub(super) struct Expected {
    pub param: Vec<f64>,
    pub first: Vec<f64>,
    pub second: Vec<f64>,
    pub allow_param: Vec<f64>,
    pub allow_first: Vec<f64>,
    pub allow_second: Vec<f64>,
}

impl Expected {
    /// `rule` applied to the (already rounded) inputs.
    pub fn of(rule: UpdateRule, dtype: DType, param: &[f64], grad: &[f64], first: &[f64], second: &[f64]) -> Self {
        let n = param.len();
        let tol = Tolerance::of(dtype);
        let acc = 16.0 * accumulation_eps(dtype);
        let (mut want_p, mut want_1, mut want_2) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        let (mut allow_p, mut allow_1, mut allow_2) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        for i in 0..n {
            let (p, g) = (param[i], grad[i]);
            match rule {
                UpdateRule::Adam(adam) => {
                    let c = adam.coefficients();
                    let g = g + c.l2 * p;
                    let decayed = p * c.decay;
                    let m = first[i] + c.one_minus_beta1 * (g - first[i]);
                    let v = second[i] + c.one_minus_beta2 * (g * g - second[i]);
                    let step = c.step_size * m / (v.sqrt() * c.inv_sqrt_bc2 + c.eps);
                    want_p[i] = decayed - step;
                    want_1[i] = m;
                    want_2[i] = v;
                    // The moments are rounded on store; the step is computed from the unrounded
                    // values in the compute type. A moment near zero makes the step sensitive to
                    // its rounding, relative to the step itself.
                    allow_1[i] = tol.allowed(m) + acc * (first[i].abs() + g.abs());
                    allow_2[i] = tol.allowed(v) + acc * (second[i] + g * g);
                    allow_p[i] = tol.allowed(want_p[i]) + acc * (p.abs() + 4.0 * step.abs()) + 1e-3 * step.abs();
                }
                UpdateRule::Sgd(sgd) => {
                    let c = sgd.coefficients();
                    let g = g + c.weight_decay * p;
                    let (g, slack) = if c.momentum != 0.0 {
                        let b = if c.first_step {
                            g
                        } else {
                            c.momentum * first[i] + c.grad_scale * g
                        };
                        want_1[i] = b;
                        allow_1[i] = tol.allowed(b) + acc * (first[i].abs() + g.abs());
                        // The buffer is read back as stored (rounded) for the step.
                        let slack = c.lr * c.momentum.max(1.0) * allow_1[i];
                        (if c.nesterov { g + c.momentum * b } else { b }, slack)
                    } else {
                        (g, 0.0)
                    };
                    want_p[i] = p - c.lr * g;
                    allow_p[i] = tol.allowed(want_p[i]) + acc * (p.abs() + (c.lr * g).abs()) + slack;
                }
            }
        }
        Expected {
            param: want_p,
            first: want_1,
            second: want_2,
            allow_param: allow_p,
            allow_first: allow_1,
            allow_second: allow_2,
        }
    }
}

/// Malformed updates are refused before anything is written.
fn malformed(h: &Harness) {
    let Some(dtype) = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(Op::Update(UpdateKind::Adam), d))
    else {
        return;
    };
    let adam = match rules()[0] {
        UpdateRule::Adam(a) => a,
        UpdateRule::Sgd(_) => unreachable!("the first rule is Adam"),
    };
    let buf = |len: usize| h.upload(dtype, &vec![1.0; len]);
    let (p, g, m, v) = (buf(8), buf(8), buf(8), buf(8));
    let contiguous = |b: &super::DeviceBuffer| Some(b.contiguous(&[8]));
    let strided = crate::layout::Layout::from_parts(&[4], &[2], 0).expect("a valid strided layout");
    let bad: Vec<(&str, Kernel)> = vec![
        (
            "Adam without its second moment",
            Kernel::Update {
                rule: UpdateRule::Adam(adam),
                grad: g.contiguous(&[8]),
                state: [contiguous(&m), None],
                param: p.contiguous(&[8]),
            },
        ),
        (
            "a strided parameter",
            Kernel::Update {
                rule: UpdateRule::Adam(adam),
                grad: g.arg(&strided),
                state: [Some(m.arg(&strided)), Some(v.arg(&strided))],
                param: p.arg(&strided),
            },
        ),
        (
            "a parameter that is its own gradient",
            Kernel::Update {
                rule: UpdateRule::Adam(adam),
                grad: p.contiguous(&[8]),
                state: [contiguous(&m), contiguous(&v)],
                param: p.contiguous(&[8]),
            },
        ),
        (
            "beta1 = 1",
            Kernel::Update {
                rule: UpdateRule::Adam(AdamUpdate { beta1: 1.0, ..adam }),
                grad: g.contiguous(&[8]),
                state: [contiguous(&m), contiguous(&v)],
                param: p.contiguous(&[8]),
            },
        ),
        (
            "step 0",
            Kernel::Update {
                rule: UpdateRule::Adam(AdamUpdate { step: 0, ..adam }),
                grad: g.contiguous(&[8]),
                state: [contiguous(&m), contiguous(&v)],
                param: p.contiguous(&[8]),
            },
        ),
    ];
    for (what, kernel) in bad {
        h.count_check();
        if h.run(&kernel).is_ok() {
            h.fail(format!("adam_update {dtype} with {what} was accepted"));
        }
    }
}
