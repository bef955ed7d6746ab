//! The prefetching loader (R10) on every device under test, pipelined and plain: batches come
//! out in order with their contents, shapes and dtypes; a bad batch is an error in its place;
//! a panic in the source reaches the caller; dropping the loader early stops its worker; and the
//! staging buffers go back to the pool for the next loader, which reuses them. On the CPU,
//! `Auto` is the plain iterator. On CUDA, copies overlap compute, measured with device events.

mod memory_support;

use cartage::loader::{HostBatch, PrefetchLoader, PrefetchMode, kept_loader_staging, release_loader_staging};
use cartage::{DType, Device, Error, Tensor, backend, pinned_bytes_in_use};
use memory_support::{devices_under_test, serial};

/// Batch `i`: `i * 1000 + j` for j in 0..numel, with a shape that changes every third batch.
fn batch(i: usize) -> HostBatch {
    let rows = 2 + i % 3;
    let values: Vec<f32> = (0..rows * 5).map(|j| (i * 1000 + j) as f32).collect();
    HostBatch::new(values, &[rows, 5])
}

fn check_batch(i: usize, t: &Tensor, device: &Device) {
    let rows = 2 + i % 3;
    assert_eq!(
        (t.shape(), t.dtype(), t.device()),
        (&[rows, 5][..], DType::F32, *device),
        "batch {i}"
    );
    let expected: Vec<f32> = (0..rows * 5).map(|j| (i * 1000 + j) as f32).collect();
    assert_eq!(t.to_vec::<f32>().unwrap(), expected, "batch {i} on {device}");
}

const MODES: [PrefetchMode; 3] = [PrefetchMode::Auto, PrefetchMode::Pipelined, PrefetchMode::Plain];

#[test]
fn batches_arrive_in_order_with_their_contents() {
    let _guard = serial();
    for device in devices_under_test("loader_prefetch/order") {
        for mode in MODES {
            release_loader_staging();
            let pinned_before = pinned_bytes_in_use();
            let loader = PrefetchLoader::with_mode((0..12).map(batch), &device, mode).unwrap();
            let expect_pipelined = match mode {
                PrefetchMode::Auto => backend(&device).unwrap().capabilities().async_copies,
                PrefetchMode::Pipelined => true,
                PrefetchMode::Plain => false,
            };
            assert_eq!(loader.is_pipelined(), expect_pipelined, "{device} {mode:?}");
            let mut running = Tensor::zeros(&[], DType::F32, &device).unwrap();
            let mut count = 0;
            for (i, t) in loader.enumerate() {
                let t = t.unwrap();
                check_batch(i, &t, &device);
                // Compute on the batch while the next one is on its way.
                running = running.add(&t.sum_all().unwrap()).unwrap();
                count += 1;
            }
            assert_eq!(count, 12);
            let expected: f32 = (0..12)
                .flat_map(|i: usize| (0..(2 + i % 3) * 5).map(move |j| (i * 1000 + j) as f32))
                .sum();
            assert_eq!(running.item::<f32>().unwrap(), expected);
            release_loader_staging();
            assert_eq!(
                pinned_bytes_in_use(),
                pinned_before,
                "{device} {mode:?}: pinned buffers not returned"
            );
        }
    }
}

#[test]
fn on_the_cpu_auto_is_a_plain_iterator() {
    let loader = PrefetchLoader::new((0..2).map(batch), &Device::cpu()).unwrap();
    assert!(!loader.is_pipelined());
}

#[test]
fn mixed_dtypes_and_empty_batches() {
    let _guard = serial();
    for device in devices_under_test("loader_prefetch/dtypes") {
        for mode in MODES {
            let batches = vec![
                HostBatch::new(vec![1i32, -2, 3], &[3]),
                HostBatch::from_bytes(vec![7, 8, 9, 10], &[2, 2], DType::U8),
                HostBatch::new(Vec::<f32>::new(), &[0, 4]),
                HostBatch::new(vec![true, false], &[2]),
            ];
            let out: Vec<Tensor> = PrefetchLoader::with_mode(batches, &device, mode)
                .unwrap()
                .collect::<cartage::Result<_>>()
                .unwrap();
            assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![1, -2, 3]);
            assert_eq!(out[1].to_vec::<u8>().unwrap(), vec![7, 8, 9, 10]);
            assert_eq!(out[2].shape(), &[0, 4]);
            assert_eq!(out[3].to_vec::<bool>().unwrap(), vec![true, false]);
        }
    }
}

#[test]
fn a_bad_batch_is_an_error_in_its_place() {
    let _guard = serial();
    for device in devices_under_test("loader_prefetch/bad") {
        for mode in MODES {
            let batches = vec![batch(0), HostBatch::new(vec![1.0f32; 5], &[2, 3]), batch(2)];
            let out: Vec<_> = PrefetchLoader::with_mode(batches, &device, mode).unwrap().collect();
            assert_eq!(out.len(), 3);
            check_batch(0, out[0].as_ref().unwrap(), &device);
            assert!(matches!(out[1], Err(Error::DataLength { .. })), "{:?}", out[1]);
            check_batch(2, out[2].as_ref().unwrap(), &device);
        }
    }
}

#[test]
fn dropping_early_stops_the_worker() {
    let _guard = serial();
    for device in devices_under_test("loader_prefetch/drop") {
        release_loader_staging();
        let pinned_before = pinned_bytes_in_use();
        let endless = (0..).map(batch);
        let mut loader = PrefetchLoader::with_mode(endless, &device, PrefetchMode::Pipelined).unwrap();
        check_batch(0, &loader.next().unwrap().unwrap(), &device);
        check_batch(1, &loader.next().unwrap().unwrap(), &device);
        drop(loader); // must return: the worker stops at its next hand-over
        release_loader_staging();
        assert_eq!(
            pinned_bytes_in_use(),
            pinned_before,
            "{device}: pinned buffers not returned"
        );
    }
}

#[test]
fn a_panicking_source_reaches_the_caller() {
    let _guard = serial();
    let source = (0..3).map(|i| {
        if i == 2 {
            panic!("source failed at batch 2")
        } else {
            batch(i)
        }
    });
    let mut loader = PrefetchLoader::with_mode(source, &Device::cpu(), PrefetchMode::Pipelined).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut n = 0;
        for t in loader.by_ref() {
            drop(t.unwrap());
            n += 1;
        }
        n
    }));
    let panic = outcome.expect_err("the source's panic must reach the caller");
    let message = panic.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(message.contains("source failed"), "{message}");
}

/// Batch `i` of `from_fn`: `i * 1000 + j` as f32, written straight into the staging bytes.
fn fill_batch(i: usize, bytes: &mut [u8]) -> cartage::Result<()> {
    for (j, chunk) in bytes.chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&((i * 1000 + j) as f32).to_le_bytes());
    }
    Ok(())
}

#[test]
fn from_fn_writes_each_batch_in_place() {
    let _guard = serial();
    for device in devices_under_test("loader_prefetch/from_fn") {
        for mode in MODES {
            let loader = PrefetchLoader::from_fn_with_mode(&[3, 4], DType::F32, 5, &device, mode, fill_batch).unwrap();
            let out: Vec<Vec<f32>> = loader.map(|t| t.unwrap().to_vec::<f32>().unwrap()).collect();
            assert_eq!(out.len(), 5, "{device} {mode:?}");
            for (i, values) in out.iter().enumerate() {
                let expected: Vec<f32> = (0..12).map(|j| (i * 1000 + j) as f32).collect();
                assert_eq!(values, &expected, "batch {i} on {device} {mode:?}");
            }
            // Batches the caller keeps are never written again (the loader's ring of device
            // tensors reuses a slot only once the caller has let go of it).
            let held: Vec<Tensor> =
                PrefetchLoader::from_fn_with_mode(&[3, 4], DType::F32, 11, &device, mode, fill_batch)
                    .unwrap()
                    .collect::<cartage::Result<_>>()
                    .unwrap();
            for (i, t) in held.iter().enumerate() {
                let expected: Vec<f32> = (0..12).map(|j| (i * 1000 + j) as f32).collect();
                assert_eq!(
                    t.to_vec::<f32>().unwrap(),
                    expected,
                    "held batch {i} on {device} {mode:?}"
                );
            }
            // A failing fill is an error in its batch's place.
            let failing = PrefetchLoader::from_fn_with_mode(&[2], DType::F32, 3, &device, mode, |i, bytes| {
                if i == 1 {
                    Err(Error::invalid("fill", "batch 1 is missing"))
                } else {
                    fill_batch(i, bytes)
                }
            })
            .unwrap();
            let out: Vec<_> = failing.collect();
            assert!(
                out[0].is_ok() && out[1].is_err() && out[2].is_ok(),
                "{device} {mode:?}: {out:?}"
            );
        }
    }
    // A shape too large to address is refused up front.
    let huge = PrefetchLoader::from_fn(&[usize::MAX, 2], DType::F32, 1, &Device::cpu(), fill_batch);
    assert!(matches!(huge, Err(Error::SizeOverflow { .. })), "{huge:?}");
}

#[test]
fn staging_buffers_are_reused_by_the_next_loader() {
    let _guard = serial();
    for device in devices_under_test("loader_prefetch/reuse") {
        release_loader_staging();
        let base = pinned_bytes_in_use();
        let epoch = || {
            let loader = PrefetchLoader::from_fn_with_mode(
                &[256, 256],
                DType::F32,
                4,
                &device,
                PrefetchMode::Pipelined,
                fill_batch,
            )
            .unwrap();
            for t in loader {
                drop(t.unwrap().sum_all().unwrap());
            }
        };
        epoch();
        assert_eq!(kept_loader_staging(&device), 2, "{device}: the two buffers are kept");
        let after_first = pinned_bytes_in_use();
        for _ in 0..3 {
            epoch();
            assert_eq!(
                kept_loader_staging(&device),
                2,
                "{device}: the same two buffers come back"
            );
            assert_eq!(
                pinned_bytes_in_use(),
                after_first,
                "{device}: a later epoch pinned new memory"
            );
        }
        assert!(release_loader_staging() >= 2 * 256 * 256 * 4);
        assert_eq!(kept_loader_staging(&device), 0);
        assert_eq!(pinned_bytes_in_use(), base, "{device}: released buffers are freed");
    }
}

/// On CUDA the copy of batch k+1 runs while batch k computes: measured on the device's own
/// clock (events on its compute stream), the loader's loop hides at least half of what could be
/// hidden, min(copies, compute), against copies alone and compute alone on the same batches.
#[test]
fn copies_overlap_compute_on_the_device() {
    let _guard = serial();
    let device = Device::cuda(0);
    let Some(gpu) = devices_under_test("loader_prefetch/overlap")
        .into_iter()
        .find(|d| *d == device)
    else {
        return;
    };
    let backend = backend(&gpu).unwrap();
    let (rows, cols, batches) = (2048, 4096, 12);
    let weight = Tensor::rand(&[cols, cols], DType::F32, 3, &gpu).unwrap();
    // The device time of `work`, between events recorded before and after it.
    let device_time = |work: &mut dyn FnMut()| {
        backend.synchronize().unwrap();
        let start = backend.record_event().unwrap();
        work();
        let end = backend.record_event().unwrap();
        backend.synchronize().unwrap();
        backend.elapsed(&start, &end).unwrap().as_secs_f64()
    };
    // Batches whose bytes are left as they are: the host side costs nothing, so the loop is
    // bound by the device's copies and compute.
    let loader = || PrefetchLoader::from_fn(&[rows, cols], DType::F32, batches, &gpu, |_, _| Ok(())).unwrap();
    let best = |mut work: Box<dyn FnMut()>| (0..3).map(|_| device_time(&mut *work)).fold(f64::INFINITY, f64::min);
    let copies = best(Box::new(|| {
        for t in loader() {
            // A one-element read of each batch: it waits for the batch's copy and nothing else.
            drop(t.unwrap().narrow(0, 0, 1).unwrap().sum_all().unwrap());
        }
    }));
    let resident = Tensor::rand(&[rows, cols], DType::F32, 4, &gpu).unwrap();
    let compute = best(Box::new(|| {
        for _ in 0..batches {
            drop(resident.matmul(&weight).unwrap());
        }
    }));
    let pipelined = best(Box::new(|| {
        for t in loader() {
            drop(t.unwrap().matmul(&weight).unwrap());
        }
    }));
    let hideable = copies.min(compute);
    let hidden = copies + compute - pipelined;
    eprintln!(
        "copies {:.2} ms, compute {:.2} ms, pipelined {:.2} ms: {:.0}% of {:.2} ms hidden",
        copies * 1e3,
        compute * 1e3,
        pipelined * 1e3,
        100.0 * hidden / hideable,
        hideable * 1e3
    );
    assert!(
        hidden >= 0.5 * hideable,
        "the loader hid {:.2} ms of {:.2} ms that copies and compute could share",
        hidden * 1e3,
        hideable * 1e3
    );
    release_loader_staging();
}
