//! The multi-tensor optimizer step against the single one: 40 parameters of mixed sizes (empty
//! and one-element ones included), spread over the buffers of two pools so that a set binds up
//! to four buffers, are stepped once by one `UpdateMany` and once by one `Update` per
//! parameter, from the same bytes at the same places. Every byte of every buffer region must
//! match, parameters, states and the elements between them, for SGD (plain, momentum on its
//! first and a later step, Nesterov, weight decay) and AdamW, in f32 and in the 2-byte floats
//! (every set starting on a word, and sets one element apart). With the bindings per dispatch
//! cut to five the step is split over several dispatches, with the default it takes one.

mod common;

use std::sync::Arc;

use cartage_core::kernel::UpdateSet;
use cartage_core::{AdamUpdate, Backend, DType, DeviceBuffer, Kernel, Layout, SgdUpdate, UpdateRule};
use common::{backend, device};
use half::{bf16, f16};

/// Parameter sizes, in set order.
const SIZES: [usize; 40] = [
    7, 0, 1, 1000, 33, 4099, 2, 257, 256, 5, 0, 1, 64, 3, 911, 128, 17, 2048, 1, 9, 300, 31, 6, 555, 1, 0, 4096, 12,
    77, 1023, 8, 190, 2, 65, 4, 1, 700, 15, 3000, 11,
];

/// Pools of buffers; each operand of a set picks its pool.
const POOLS: usize = 2;

/// Bytes of one pool buffer: at least 10 MiB, so that the allocator gives each its own segment
/// (and a dispatch one binding per buffer).
const BUFFER_BYTES: usize = 10 << 20;

fn rules() -> Vec<(&'static str, UpdateRule)> {
    let sgd = SgdUpdate {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 1e-2,
        nesterov: true,
        first_step: false,
    };
    vec![
        (
            "adamw",
            UpdateRule::Adam(AdamUpdate {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.05,
                decoupled: true,
                step: 3,
            }),
        ),
        ("sgd nesterov", UpdateRule::Sgd(sgd)),
        (
            "sgd momentum, first step",
            UpdateRule::Sgd(SgdUpdate {
                dampening: 0.1,
                nesterov: false,
                first_step: true,
                ..sgd
            }),
        ),
        (
            "sgd plain",
            UpdateRule::Sgd(SgdUpdate {
                momentum: 0.0,
                dampening: 0.0,
                nesterov: false,
                ..sgd
            }),
        ),
    ]
}

/// Deterministic values in `[lo, hi)` as `dtype` bytes.
fn values(dtype: DType, n: usize, seed: u64, lo: f32, hi: f32) -> Vec<u8> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = Vec::with_capacity(n * dtype.size_in_bytes());
    for _ in 0..n {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let x = lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32);
        match dtype {
            DType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
            _ => out.extend_from_slice(&bf16::from_f32(x).to_le_bytes()),
        }
    }
    out
}

/// The ranges of the four roles' buffers of each pool, and where each set's operands sit:
/// per set and role (parameter, gradient, first, second state), (pool, first element).
struct Placement {
    /// Elements used in each [pool][role] buffer.
    used: [[usize; 4]; POOLS],
    at: Vec<[(usize, usize); 4]>,
}

/// Sets placed one after another in the buffer of their pool, `gap` elements apart (rounded up
/// to a word when `aligned`).
fn placement(aligned: bool) -> Placement {
    let mut used = [[0usize; 4]; POOLS];
    let mut at = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let mut set = [(0, 0); 4];
        for (role, slot) in set.iter_mut().enumerate() {
            let pool = (i / (role + 1) + role) % POOLS;
            let mut start = used[pool][role] + 1;
            if aligned {
                start = start.next_multiple_of(2);
            }
            *slot = (pool, start);
            used[pool][role] = start + n;
        }
        at.push(set);
    }
    for pool in &mut used {
        for u in pool.iter_mut() {
            *u += 3;
        }
    }
    Placement { used, at }
}

struct Run {
    buffers: Vec<DeviceBuffer>,
    initial: Vec<Vec<u8>>,
}

impl Run {
    fn new(b: &Arc<cartage_wgpu::WgpuBackend>, dtype: DType, place: &Placement) -> Run {
        let es = dtype.size_in_bytes();
        let mut buffers = Vec::new();
        let mut initial = Vec::new();
        for (pool, used) in place.used.iter().enumerate() {
            for (role, &n) in used.iter().enumerate() {
                let (lo, hi) = [(-2.0, 2.0), (-2.0, 2.0), (-1.0, 1.0), (0.0, 4.0)][role];
                initial.push(values(dtype, n, (10 * pool + role) as u64, lo, hi));
                buffers.push(DeviceBuffer::new(&device(b), BUFFER_BYTES.max(n * es)).unwrap());
            }
        }
        Run { buffers, initial }
    }

    fn reset(&self) {
        for (buffer, bytes) in self.buffers.iter().zip(&self.initial) {
            buffer.write(0, bytes).unwrap();
        }
    }

    fn read(&self) -> Vec<Vec<u8>> {
        self.buffers
            .iter()
            .zip(&self.initial)
            .map(|(buffer, bytes)| {
                let mut out = vec![0u8; bytes.len()];
                buffer.read(0, &mut out).unwrap();
                out
            })
            .collect()
    }

    fn sets(&self, dtype: DType, rule: UpdateRule, place: &Placement) -> Vec<UpdateSet> {
        let states = rule.state_count();
        place
            .at
            .iter()
            .zip(SIZES)
            .map(|(set, n)| {
                let arg = |role: usize| {
                    let (pool, first) = set[role];
                    self.buffers[4 * pool + role].arg(Layout::from_parts(&[n], &[1], first).unwrap(), dtype)
                };
                UpdateSet {
                    grad: arg(1),
                    state: [(states > 0).then(|| arg(2)), (states > 1).then(|| arg(3))],
                    param: arg(0),
                }
            })
            .collect()
    }
}

/// One multi-tensor step against single steps; the dispatches the multi-tensor step took.
fn compare(
    b: &Arc<cartage_wgpu::WgpuBackend>,
    run: &Run,
    dtype: DType,
    rule: UpdateRule,
    place: &Placement,
    what: &str,
) -> u64 {
    let refs: Vec<&DeviceBuffer> = run.buffers.iter().collect();
    let sets = run.sets(dtype, rule, place);
    run.reset();
    for set in &sets {
        let single = Kernel::Update {
            rule,
            grad: set.grad.clone(),
            state: set.state.clone(),
            param: set.param.clone(),
        };
        single.run(&refs).unwrap();
    }
    b.synchronize().unwrap();
    let alone = run.read();
    run.reset();
    b.synchronize().unwrap();
    let before = b.dispatch_counters().0;
    Kernel::UpdateMany { rule, sets }.run(&refs).unwrap();
    let dispatches = b.dispatch_counters().0 - before;
    b.synchronize().unwrap();
    let many = run.read();
    let written = 2 + rule.state_count();
    for (k, (m, a)) in many.iter().zip(&alone).enumerate() {
        if k % 4 == 0 || (2..written).contains(&(k % 4)) {
            assert_ne!(m, &run.initial[k], "{what}: buffer {k} was updated");
        }
        if let Some(i) = m.iter().zip(a).position(|(x, y)| x != y) {
            panic!(
                "{what}: pool {} role {} differs from single updates at byte {i} of {}",
                k / 4,
                k % 4,
                m.len()
            );
        }
    }
    dispatches
}

#[test]
fn many_parameters_step_bit_for_bit_as_single_updates() {
    let Some(b) = backend("update_many_bit_for_bit") else {
        return;
    };
    let default_bindings = b.set_update_many_bindings(usize::MAX);
    assert!(default_bindings >= 2 && default_bindings <= b.limits().max_storage_buffers_per_shader_stage as usize);
    assert_eq!(b.update_many_bindings(), default_bindings);
    assert_eq!(b.set_update_many_bindings(0), 2);
    eprintln!(
        "wgpu/update_many: {default_bindings} bindings per dispatch (max_storage_buffers_per_shader_stage {})",
        b.limits().max_storage_buffers_per_shader_stage
    );
    let nonempty = SIZES.iter().filter(|&&n| n > 0).count() as u64;
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        for aligned in [true, false] {
            let place = placement(aligned);
            let run = Run::new(&b, dtype, &place);
            for (name, rule) in rules() {
                // Operand buffers this rule's sets bind: parameter, gradient and states of each pool.
                let windows = POOLS * (2 + rule.state_count());
                for bindings in [default_bindings, 5] {
                    assert_eq!(b.set_update_many_bindings(bindings), bindings);
                    let what = format!("{dtype} {name} (aligned {aligned}, {bindings} bindings)");
                    let dispatches = compare(&b, &run, dtype, rule, &place, &what);
                    if windows < bindings {
                        assert_eq!(dispatches, 1, "{what}: one dispatch for every set");
                    } else {
                        assert!(
                            (2..=nonempty).contains(&dispatches),
                            "{what}: {dispatches} dispatches for {nonempty} sets"
                        );
                    }
                }
                b.set_update_many_bindings(default_bindings);
            }
        }
    }
}
