//! The prefetching loader (R10) on every device under test, pipelined and plain: batches come
//! out in order with their contents, shapes and dtypes; a bad batch is an error in its place;
//! a panic in the source reaches the caller; dropping the loader early stops its worker; and the
//! pinned double buffers are returned afterwards. On the CPU, `Auto` is the plain iterator.

mod memory_support;

use cartage::loader::{HostBatch, PrefetchLoader, PrefetchMode};
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
        let pinned_before = pinned_bytes_in_use();
        let endless = (0..).map(batch);
        let mut loader = PrefetchLoader::with_mode(endless, &device, PrefetchMode::Pipelined).unwrap();
        check_batch(0, &loader.next().unwrap().unwrap(), &device);
        check_batch(1, &loader.next().unwrap().unwrap(), &device);
        drop(loader); // must return: the worker stops at its next hand-over
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
