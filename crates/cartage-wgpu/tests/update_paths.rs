//! The fused optimizer update on every path the wgpu kernel takes for 2-byte floats: f16 through
//! the adapter's `f16` type (where it has SHADER_F16), packed words two elements at a time when
//! every operand starts on a word (an odd count leaves half of the last word to a neighbour),
//! and one element at a time with atomic stores when an operand starts mid-word (operands may
//! then share a word with each other). Every path must give the packed path's result (which the
//! conformance suite checks against the f64 formulas) and leave every element outside the
//! operands untouched.

mod common;

use std::sync::{Arc, Mutex};

use cartage_core::{AdamUpdate, Backend, DType, DeviceBuffer, Kernel, Layout, SgdUpdate, UpdateRule};
use common::{backend, device};
use half::{bf16, f16};

/// The tests of this file switch the backend's f16 mode: one at a time.
static MODE: Mutex<()> = Mutex::new(());

fn bits(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        _ => bf16::from_f32(x).to_bits(),
    }
}

/// Deterministic values in `[lo, hi)`, rounded to `dtype`.
fn values(dtype: DType, n: usize, seed: u64, lo: f32, hi: f32) -> Vec<u16> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            bits(dtype, lo + (hi - lo) * u)
        })
        .collect()
}

fn rules() -> [UpdateRule; 3] {
    [
        UpdateRule::Adam(AdamUpdate {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-6,
            weight_decay: 0.05,
            decoupled: true,
            step: 3,
        }),
        UpdateRule::Sgd(SgdUpdate {
            lr: 0.1,
            momentum: 0.8,
            dampening: 0.0,
            weight_decay: 1e-2,
            nesterov: true,
            first_step: false,
        }),
        UpdateRule::Sgd(SgdUpdate {
            lr: 0.1,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            first_step: false,
        }),
    ]
}

/// Where the four operands (parameter, gradient, first and second state) live: each in its own
/// buffer starting at element `at`, or all in one buffer side by side from element `at`.
#[derive(Clone, Copy, Debug)]
enum Placement {
    Apart { at: usize },
    Adjacent { at: usize },
}

/// The operands' values, the bits of every buffer after the update, and where each operand's
/// elements sit: (buffer index, first element).
struct Outcome {
    buffers: Vec<Vec<u16>>,
    before: Vec<Vec<u16>>,
    spans: [(usize, usize); 4],
}

fn run(b: &Arc<cartage_wgpu::WgpuBackend>, dtype: DType, rule: UpdateRule, n: usize, placement: Placement) -> Outcome {
    let operands = [
        values(dtype, n, 1, -2.0, 2.0),
        values(dtype, n, 2, -2.0, 2.0),
        values(dtype, n, 3, -1.0, 1.0),
        values(dtype, n, 4, 0.0, 4.0),
    ];
    let guard = 3;
    let (contents, spans): (Vec<Vec<u16>>, [(usize, usize); 4]) = match placement {
        Placement::Apart { at } => {
            let buffers = operands
                .iter()
                .enumerate()
                .map(|(k, v)| {
                    let mut all = values(dtype, at, 10 + k as u64, -8.0, 8.0);
                    all.extend_from_slice(v);
                    all.extend(values(dtype, guard, 20 + k as u64, -8.0, 8.0));
                    all
                })
                .collect();
            (buffers, [(0, at), (1, at), (2, at), (3, at)])
        }
        Placement::Adjacent { at } => {
            let mut all = values(dtype, at, 10, -8.0, 8.0);
            for v in &operands {
                all.extend_from_slice(v);
            }
            all.extend(values(dtype, guard, 20, -8.0, 8.0));
            (vec![all], [(0, at), (0, at + n), (0, at + 2 * n), (0, at + 3 * n)])
        }
    };
    let device_buffers: Vec<DeviceBuffer> = contents
        .iter()
        .map(|c| {
            let bytes: Vec<u8> = c.iter().flat_map(|h| h.to_le_bytes()).collect();
            let buffer = DeviceBuffer::new(&device(b), bytes.len()).unwrap();
            buffer.write(0, &bytes).unwrap();
            buffer
        })
        .collect();
    let arg = |k: usize| {
        let (buffer, first) = spans[k];
        device_buffers[buffer].arg(Layout::from_parts(&[n], &[1], first).unwrap(), dtype)
    };
    let states = rule.state_count();
    let kernel = Kernel::Update {
        rule,
        grad: arg(1),
        state: [(states > 0).then(|| arg(2)), (states > 1).then(|| arg(3))],
        param: arg(0),
    };
    let refs: Vec<&DeviceBuffer> = device_buffers.iter().collect();
    kernel.run(&refs).unwrap();
    b.synchronize().unwrap();
    let buffers = device_buffers
        .iter()
        .zip(&contents)
        .map(|(buffer, c)| {
            let mut bytes = vec![0u8; 2 * c.len()];
            buffer.read(0, &mut bytes).unwrap();
            bytes.chunks(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect()
        })
        .collect();
    Outcome {
        buffers,
        before: contents,
        spans,
    }
}

impl Outcome {
    /// Operand `k`'s elements after the update.
    fn operand(&self, k: usize, n: usize) -> &[u16] {
        let (buffer, first) = self.spans[k];
        &self.buffers[buffer][first..first + n]
    }

    /// True when element `i` of buffer `buffer` belongs to one of the `written` operands.
    fn inside(&self, buffer: usize, i: usize, n: usize, written: &[usize]) -> bool {
        written.iter().any(|&k| {
            let (bk, first) = self.spans[k];
            bk == buffer && (first..first + n).contains(&i)
        })
    }
}

/// Equal, or one unit apart in the last place (drivers may contract a multiply-add into an FMA
/// in one pipeline and not another).
fn close(a: u16, b: u16) -> bool {
    a == b || ((a ^ b) & 0x8000 == 0 && a.abs_diff(b) <= 1)
}

#[test]
fn half_updates_agree_on_every_path_and_leave_neighbours_alone() {
    let Some(b) = backend("half_updates_agree_on_every_path") else {
        return;
    };
    let _one_at_a_time = MODE.lock().unwrap_or_else(|p| p.into_inner());
    let n = 1001;
    let mut modes = vec![false];
    if b.features().contains(wgpu::Features::SHADER_F16) {
        modes.push(true);
    }
    eprintln!("wgpu/update_paths: f16 modes (native) {modes:?}");
    for dtype in [DType::F16, DType::BF16] {
        for rule in rules() {
            b.set_native_f16(false);
            let reference = run(&b, dtype, rule, n, Placement::Apart { at: 0 });
            let written: Vec<usize> = std::iter::once(0).chain(2..2 + rule.state_count()).collect();
            for &native in &modes {
                assert_eq!(b.set_native_f16(native), native);
                for placement in [
                    Placement::Apart { at: 0 },
                    Placement::Apart { at: 1 },
                    Placement::Adjacent { at: 0 },
                    Placement::Adjacent { at: 1 },
                ] {
                    let got = run(&b, dtype, rule, n, placement);
                    let what = format!("{dtype} {:?} native={native} {placement:?}", rule.kind());
                    for &k in &written {
                        let (want, have) = (reference.operand(k, n), got.operand(k, n));
                        for i in 0..n {
                            assert!(
                                close(want[i], have[i]),
                                "{what}: operand {k} element {i}: {:#06x}, want {:#06x}",
                                have[i],
                                want[i]
                            );
                        }
                    }
                    // The parameter and the state changed somewhere (the update ran).
                    assert_ne!(got.operand(0, n), &got.before[got.spans[0].0][got.spans[0].1..][..n]);
                    for (buffer, (after, before)) in got.buffers.iter().zip(&got.before).enumerate() {
                        for i in 0..after.len() {
                            if !got.inside(buffer, i, n, &written) {
                                assert_eq!(
                                    after[i], before[i],
                                    "{what}: element {i} of buffer {buffer}, outside the written operands, changed"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    b.set_native_f16(true);
}

/// The conformance cases of the update with f16 in packed words, where the adapter would
/// otherwise load it as `f16` (a repeat of the suite's own run on an adapter without SHADER_F16).
#[test]
fn packed_f16_passes_the_conformance_cases() {
    let open = || {
        let b = cartage_wgpu::open_wgpu(0)?;
        b.set_native_f16(false);
        Ok(b as Arc<dyn Backend>)
    };
    let _one_at_a_time = MODE.lock().unwrap_or_else(|p| p.into_inner());
    cartage_core::testsuite::run(
        "wgpu_packed_f16",
        "optimizer_update",
        open,
        cartage_core::testsuite::update::update,
    );
    if let Ok(b) = cartage_wgpu::open_wgpu(0) {
        b.set_native_f16(true);
    }
}
