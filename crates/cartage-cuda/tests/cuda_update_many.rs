//! The multi-tensor optimizer step (`Kernel::UpdateMany`) on cuda:0: SGD (momentum on its first
//! and a later step, Nesterov, weight decay), Adam and AdamW in f32 and bf16 over 70 sets at
//! once — empty, one element, odd sizes, several 65536-element chunks, 16-byte aligned (vector
//! loads) and not (one element at a time) — so that the step takes several launches (more
//! than 48 sets; once, one set of more than 320 chunks). Each set is compared with the f64 formulas on the same
//! rounded inputs, as the CPU computes them, and with cuda:0's single-parameter `Update`.
//!
//! Without a CUDA device every test prints a SKIP line; `CARTAGE_REQUIRE=cuda` makes it fail.

mod common;

use std::sync::Arc;

use common::{download, upload, values};

use cartage_core::kernel::UpdateSet;
use cartage_core::{AdamUpdate, Backend, DType, DeviceBuffer, Kernel, Layout, Op, SgdUpdate, UpdateKind, UpdateRule};

/// `cuda:0` with the multi-tensor step listed, or `None` after a SKIP line.
fn backend(test: &str) -> Option<Arc<dyn Backend>> {
    let b = common::backend(test)?;
    if b.capabilities().supports(Op::UpdateMany(UpdateKind::Adam), DType::F32) {
        return Some(b);
    }
    panic!("cuda/{test}: the multi-tensor update is not listed on cuda:0, which builds them for every float dtype");
}

/// (elements, element offset) of each set: offset 1 is not 16-byte aligned. With `long`, one
/// set of 321 chunks, more than one launch takes.
fn sets(long: bool) -> Vec<(usize, usize)> {
    let mut sets = vec![
        (1, 0),
        (7, 1),
        (0, 0),
        (1000, 0),
        (4099, 1),
        (3 * 65536 + 5, 0),
        (33, 0),
        (if long { 321 * 65536 + 3 } else { 20 * 65536 + 3 }, 0),
        (65536, 1),
    ];
    sets.extend((0..61).map(|i| ((i * 37) % 301, i % 2)));
    sets
}

/// The f64 formulas of one element: (param, first state, second state).
fn reference(rule: &UpdateRule, p: f64, g: f64, s0: f64, s1: f64, dtype: DType) -> (f64, f64, f64) {
    let r = |v: f64| common::round(v, dtype);
    match rule {
        UpdateRule::Adam(adam) => {
            let c = adam.coefficients();
            let g = g + c.l2 * p;
            let m = s0 + c.one_minus_beta1 * (g - s0);
            let v = s1 + c.one_minus_beta2 * (g * g - s1);
            let np = p * c.decay - c.step_size * m / (v.sqrt() * c.inv_sqrt_bc2 + c.eps);
            (r(np), r(m), r(v))
        }
        UpdateRule::Sgd(sgd) => {
            let c = sgd.coefficients();
            let g = g + c.weight_decay * p;
            let b = if c.first_step {
                g
            } else {
                c.momentum * s0 + c.grad_scale * g
            };
            let b = r(b);
            let step = if c.nesterov { g + c.momentum * b } else { b };
            (r(p - c.lr * step), b, s1)
        }
    }
}

fn rules() -> Vec<UpdateRule> {
    let adam = AdamUpdate {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        decoupled: false,
        step: 5,
    };
    let sgd = SgdUpdate {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 1e-3,
        nesterov: false,
        first_step: false,
    };
    vec![
        UpdateRule::Adam(adam),
        UpdateRule::Adam(AdamUpdate {
            decoupled: true,
            weight_decay: 0.01,
            step: 1,
            ..adam
        }),
        UpdateRule::Sgd(sgd),
        UpdateRule::Sgd(SgdUpdate { nesterov: true, ..sgd }),
        UpdateRule::Sgd(SgdUpdate {
            first_step: true,
            dampening: 0.1,
            ..sgd
        }),
    ]
}

/// One set's buffers (param, grad, first state, second state) and their values.
struct Set {
    n: usize,
    offset: usize,
    bufs: [DeviceBuffer; 4],
    values: [Vec<f64>; 4],
}

impl Set {
    fn new(b: &Arc<dyn Backend>, n: usize, offset: usize, seed: u64, dtype: DType) -> Set {
        let len = n + offset;
        let mut values = [0, 1, 2, 3].map(|k| values(len, seed * 4 + k, dtype));
        values[3].iter_mut().for_each(|v| *v = v.abs());
        let bufs = [0, 1, 2, 3].map(|k| upload(b, &values[k], dtype));
        Set {
            n,
            offset,
            bufs,
            values,
        }
    }

    fn operands(&self, rule: &UpdateRule, dtype: DType) -> UpdateSet {
        let layout = Layout::from_parts(&[self.n], &[1], self.offset).expect("layout");
        let view = |k: usize| self.bufs[k].arg(layout.clone(), dtype);
        let state = match rule {
            UpdateRule::Adam(_) => [Some(view(2)), Some(view(3))],
            UpdateRule::Sgd(_) => [Some(view(2)), None],
        };
        UpdateSet {
            grad: view(1),
            state,
            param: view(0),
        }
    }

    fn read(&self, dtype: DType) -> Vec<Vec<f64>> {
        self.bufs
            .iter()
            .map(|buf| download(buf, self.n + self.offset, dtype))
            .collect()
    }
}

#[test]
fn the_multi_tensor_step_matches_the_formulas_and_single_updates() {
    let Some(b) = backend("update_many") else { return };
    for dtype in [DType::F32, DType::BF16] {
        let tol = if dtype == DType::BF16 { 2e-2 } else { 2e-5 };
        for (r, rule) in rules().into_iter().enumerate() {
            let layout = sets(dtype == DType::F32 && r == 0);
            let many: Vec<Set> = layout
                .iter()
                .enumerate()
                .map(|(i, &(n, o))| Set::new(&b, n, o, i as u64, dtype))
                .collect();
            let single: Vec<Set> = layout
                .iter()
                .enumerate()
                .map(|(i, &(n, o))| Set::new(&b, n, o, i as u64, dtype))
                .collect();
            let kernel = Kernel::UpdateMany {
                rule,
                sets: many.iter().map(|s| s.operands(&rule, dtype)).collect(),
            };
            let owners: Vec<&DeviceBuffer> = many.iter().flat_map(|s| s.bufs.iter()).collect();
            kernel.run(&owners).expect("update_many");
            for s in &single {
                let o = s.operands(&rule, dtype);
                let k = Kernel::Update {
                    rule,
                    grad: o.grad,
                    state: o.state,
                    param: o.param,
                };
                k.run(&s.bufs.iter().collect::<Vec<_>>()).expect("update");
            }
            for (i, (m, one)) in many.iter().zip(&single).enumerate() {
                let (got, alone) = (m.read(dtype), one.read(dtype));
                let [p, g, s0, s1] = &m.values;
                let mut want = m.values.clone();
                for j in m.offset..m.offset + m.n {
                    (want[0][j], want[2][j], want[3][j]) = reference(&rule, p[j], g[j], s0[j], s1[j], dtype);
                }
                let states = 2 + if matches!(rule, UpdateRule::Adam(_)) { 2 } else { 1 };
                for (k, name) in ["param", "grad", "first state", "second state"]
                    .iter()
                    .enumerate()
                    .take(states)
                {
                    let what = format!("{rule:?} {dtype} set {i} ({} at {}): {name}", m.n, m.offset);
                    common::check_within(&what, &got[k], &want[k], tol);
                    common::check_within(&format!("{what} against Update"), &got[k], &alone[k], tol);
                }
            }
        }
    }
}
