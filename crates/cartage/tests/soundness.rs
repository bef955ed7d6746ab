//! Safe code cannot race or reach memory it does not hold (docs/ARCHITECTURE.md, "Validation and
//! safety"):
//! - a tensor written in place by one thread is never read half-written by another (each device
//!   runs its work in order, the CPU included);
//! - an index kernel whose indices another thread keeps rewriting gives right values or a typed
//!   error, never a crash (each index is read once);
//! - `copy_from` between overlapping views has snapshot semantics;
//! - a stale or foreign buffer slice cannot be launched through the safe path, and a slice cannot
//!   be stretched past its block.
//!
//! The concurrent tests run on the CPU and on every GPU that opens.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cartage::{DType, Device, DeviceBuffer, Error, Kernel, Layout, Scalar, Tensor};

/// The CPU and every other device that opens here.
fn devices() -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device("soundness"));
    devices
}

/// How long each stress test runs per device.
const STRESS: Duration = Duration::from_millis(1500);

#[test]
fn in_place_writes_are_never_read_half_written() {
    for device in devices() {
        let n = 1 << 20;
        let x = Tensor::zeros(&[n], DType::F32, &device).unwrap();
        let sources = [
            Tensor::zeros(&[n], DType::F32, &device).unwrap(),
            Tensor::ones(&[n], DType::F32, &device).unwrap(),
        ];
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (x, stop) = (x.clone(), stop.clone());
            thread::spawn(move || {
                let mut writes = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    x.copy_from(&sources[writes % 2]).unwrap();
                    writes += 1;
                }
                writes
            })
        };
        let start = Instant::now();
        let mut reads = 0;
        while start.elapsed() < STRESS {
            let values = x.to_vec::<f32>().unwrap();
            let first = values[0];
            assert!(
                values.iter().all(|&v| v == first),
                "{device}: a read saw a half-written tensor ({} zeros, {} ones)",
                values.iter().filter(|&&v| v == 0.0).count(),
                values.iter().filter(|&&v| v == 1.0).count()
            );
            reads += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let writes = writer.join().unwrap();
        assert!(reads > 0 && writes > 1, "{device}: {reads} reads, {writes} writes");
    }
}

#[test]
fn indices_rewritten_during_a_select_give_values_or_an_error() {
    for device in devices() {
        let n = 1 << 20;
        let input = Tensor::arange(0.0, n as f64, 1.0, DType::F32, &device).unwrap();
        let good = Tensor::arange(0.0, n as f64, 1.0, DType::I64, &device)
            .unwrap()
            .flip_for_test();
        let bad = Tensor::full(&[n], 1i64 << 45, DType::I64, &device).unwrap();
        let index = good.clone().copy_for_test();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (index, stop, good) = (index.clone(), stop.clone(), good.clone());
            thread::spawn(move || {
                let mut flips = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    index
                        .copy_from(if flips.is_multiple_of(2) { &bad } else { &good })
                        .unwrap();
                    flips += 1;
                }
            })
        };
        let start = Instant::now();
        let (mut ok, mut refused) = (0, 0);
        while start.elapsed() < STRESS {
            match input.index_select(0, &index).and_then(|t| t.to_vec::<f32>()) {
                Ok(values) => {
                    let expected = (n - 1) as f32;
                    assert_eq!(values[0], expected, "{device}: index_select read a torn index");
                    ok += 1;
                }
                Err(Error::IndexOutOfRange { .. }) => refused += 1,
                Err(e) => panic!("{device}: unexpected error {e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(ok + refused > 0, "{device}: no select ran");
        eprintln!("{device}: {ok} selects with valid indices, {refused} refused");
    }
}

/// Test-only helpers: a reversed copy, and a fresh copy that owns its storage.
trait ForTest {
    fn flip_for_test(self) -> Tensor;
    fn copy_for_test(self) -> Tensor;
}

impl ForTest for Tensor {
    fn flip_for_test(self) -> Tensor {
        let values = self.to_vec::<i64>().unwrap();
        let reversed: Vec<i64> = values.into_iter().rev().collect();
        Tensor::from_slice(&reversed, self.shape(), &self.device()).unwrap()
    }

    fn copy_for_test(self) -> Tensor {
        let out = Tensor::zeros(self.shape(), self.dtype(), &self.device()).unwrap();
        out.copy_from(&self).unwrap();
        out
    }
}

#[test]
fn copies_between_overlapping_views_read_the_source_first() {
    for device in devices() {
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], &[3, 3], &device).unwrap();
        x.copy_from(&x.t().unwrap()).unwrap();
        assert_eq!(
            x.to_vec::<f32>().unwrap(),
            vec![1.0, 4.0, 7.0, 2.0, 5.0, 8.0, 3.0, 6.0, 9.0],
            "{device}: in-place transpose"
        );
        let y = Tensor::arange(0.0, 8.0, 1.0, DType::I32, &device).unwrap();
        // Shift right by two: the destination overlaps the source's tail.
        y.narrow(0, 2, 6)
            .unwrap()
            .copy_from(&y.narrow(0, 0, 6).unwrap())
            .unwrap();
        assert_eq!(
            y.to_vec::<i32>().unwrap(),
            vec![0, 1, 0, 1, 2, 3, 4, 5],
            "{device}: shift right"
        );
        // Shift left by one: the destination overlaps the source's head.
        y.narrow(0, 0, 7)
            .unwrap()
            .copy_from(&y.narrow(0, 1, 7).unwrap())
            .unwrap();
        assert_eq!(
            y.to_vec::<i32>().unwrap(),
            vec![1, 0, 1, 2, 3, 4, 5, 5],
            "{device}: shift left"
        );
        // Onto itself: nothing changes.
        y.copy_from(&y).unwrap();
        assert_eq!(
            y.to_vec::<i32>().unwrap(),
            vec![1, 0, 1, 2, 3, 4, 5, 5],
            "{device}: self copy"
        );
    }
}

#[test]
fn stale_foreign_and_stretched_slices_never_reach_memory() {
    let backend = cartage::backend(&Device::cpu()).unwrap();
    let layout = Layout::contiguous(&[16]).unwrap();
    let fill = |buffer: &DeviceBuffer| Kernel::Fill {
        out: buffer.arg(layout.clone(), DType::F32),
        value: Scalar::Float(7.0),
    };
    // A stale slice: its buffer is gone (its block may soon belong to someone else). The only
    // live buffer given to `run` does not hold it, so the launch is refused.
    let victim = DeviceBuffer::new(&backend, 64).unwrap();
    victim.write(0, &[0u8; 64]).unwrap();
    let stale = {
        let gone = DeviceBuffer::new(&backend, 64).unwrap();
        fill(&gone)
    };
    assert_ne!(stale.operands()[0].buffer, victim.slice());
    assert!(stale.run(&[&victim]).is_err(), "a stale slice was launched");
    let mut bytes = [0u8; 64];
    victim.read(0, &mut bytes).unwrap();
    assert_eq!(bytes, [0u8; 64], "the refused launch wrote somewhere");
    // A slice of one buffer given with another buffer as its owner.
    let other = DeviceBuffer::new(&backend, 64).unwrap();
    assert!(fill(&other).run(&[&victim]).is_err(), "a foreign slice was launched");
    // A layout larger than the buffer.
    let small = DeviceBuffer::new(&backend, 16).unwrap();
    let stretched = Kernel::Fill {
        out: small.arg(layout.clone(), DType::F32),
        value: Scalar::Float(1.0),
    };
    assert!(
        stretched.run(&[&small]).is_err(),
        "a layout past its buffer was launched"
    );
    // A slice can only be narrowed.
    assert!(small.slice().slice(0, 17).is_err());
    assert!(small.slice().slice(usize::MAX, 2).is_err());
    assert!(small.range(8, 9).is_err());
    // Host copies are checked against the buffer too.
    assert!(small.write(10, &[0u8; 7]).is_err());
    assert!(small.read(0, &mut [0u8; 17]).is_err());
    // A broadcast output (several elements at one address) is refused by validation.
    let broadcast = Kernel::Fill {
        out: small.arg(
            Layout::contiguous(&[1]).unwrap().broadcast_to(&[4]).unwrap(),
            DType::F32,
        ),
        value: Scalar::Float(1.0),
    };
    assert!(broadcast.run(&[&small]).is_err(), "a broadcast output was written");
    // Every operand is checked, the optional ones too: an attention mask from a buffer not
    // given to `run` is refused before any backend sees the kernel.
    let qkv = DeviceBuffer::new(&backend, 4 * 4 * 4).unwrap();
    let stray = DeviceBuffer::new(&backend, 64).unwrap();
    let part = |i: usize| qkv.arg(Layout::from_parts(&[1, 2, 2], &[4, 2, 1], i * 4).unwrap(), DType::F32);
    let attention = Kernel::Attention {
        q: part(0),
        k: part(1),
        v: part(2),
        scale: 1.0,
        causal: false,
        mask: Some(Box::new(cartage_core::kernel::AttentionMask {
            values: stray.arg(Layout::contiguous(&[1, 1, 2, 2]).unwrap(), DType::F32),
        })),
        out: part(3),
        lse: None,
    };
    let err = attention.run(&[&qkv]).unwrap_err();
    assert!(err.to_string().contains("does not lie inside any buffer"), "{err}");
}

#[test]
fn host_staging_is_honest_and_fallible() {
    let cpu = Device::cpu();
    assert!(matches!(
        cartage::alloc_pinned(&cpu, 64),
        Err(Error::Unsupported { .. })
    ));
    let staging = cartage::alloc_staging(&cpu, 64).unwrap();
    assert!(!staging.is_pinned());
    assert!(matches!(
        cartage::alloc_staging(&cpu, usize::MAX),
        Err(Error::OutOfMemory(_))
    ));
    assert!(matches!(
        cartage::alloc_staging(&cpu, 1 << 60),
        Err(Error::OutOfMemory(_))
    ));
}
