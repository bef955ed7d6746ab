//! Safe code never reaches memory it does not hold, even when it tries (DESIGN.md, "Trust"):
//! - a slice made by another allocator (a second CPU backend, an allocator over a test source,
//!   another device) never passes `Kernel::run`, even when its segment id equals the id of a
//!   buffer given to `run`; nothing is written, before or after the other allocator is dropped.
//! - oversized pinned / staging requests are typed errors, never a buffer whose length wrapped.
//!
//! Runs on the CPU and on every GPU that opens (a SKIP line for each one that does not; a failure
//! when `CARTAGE_REQUIRE` names its kind).

mod common;

use std::sync::Arc;

use cartage::{Backend, DType, Device, DeviceBuffer, Kernel, Layout, Scalar, TensorArg};
use cartage_core::allocator::testing::MockSource;
use cartage_core::{AllocatorConfig, CachingAllocator};

/// Bytes of each buffer the tests make (a small-pool block: two per 2 MiB segment).
const BYTES: usize = 1 << 20;

/// A fresh CPU backend of its own (its segment ids start at 1, like every other fresh one's).
fn fresh_cpu() -> Arc<dyn Backend> {
    Arc::new(cartage_cpu::CpuBackend::new())
}

/// A `Fill` of the first 16 f32 of `slice`'s bytes with 7.
fn fill(buffer: cartage_core::allocator::BufferSlice) -> Kernel {
    Kernel::Fill {
        out: TensorArg {
            buffer,
            layout: Layout::contiguous(&[16]).unwrap(),
            dtype: DType::F32,
        },
        value: Scalar::Float(7.0),
    }
}

/// A buffer of `backend` whose segment id is `id`: buffers are made (and kept in `keep`) until
/// one lands in a segment with that id. `backend` must be fresh enough that its ids are below.
fn buffer_in_segment(backend: &Arc<dyn Backend>, id: u64, keep: &mut Vec<DeviceBuffer>) -> DeviceBuffer {
    for _ in 0..4096 {
        let buffer = DeviceBuffer::new(backend, BYTES).unwrap();
        buffer.write(0, &[0u8; 64]).unwrap();
        let got = buffer.slice().segment().id;
        if got == id {
            return buffer;
        }
        assert!(
            got < id,
            "segment ids passed {id} (now {got}): the backend was not fresh"
        );
        keep.push(buffer);
    }
    panic!("no segment with id {id} after 4096 buffers");
}

/// The first 64 bytes of `buffer`.
fn head(buffer: &DeviceBuffer) -> Vec<u8> {
    let mut bytes = vec![0u8; 64];
    buffer.read(0, &mut bytes).unwrap();
    bytes
}

/// `kernel` (made from a slice of another allocator) is refused with `victim` as its buffer, and
/// `victim` is left as it was.
fn assert_refused(what: &str, kernel: &Kernel, victim: &DeviceBuffer) {
    let before = head(victim);
    let result = kernel.run(&[victim]);
    let err = result.expect_err(&format!("{what}: a slice of another allocator was launched"));
    assert!(
        matches!(err, cartage::Error::InvalidArgument { .. }),
        "{what}: expected InvalidArgument, got {err:?}"
    );
    assert_eq!(head(victim), before, "{what}: the refused launch wrote into the victim");
}

#[test]
fn a_slice_of_a_second_cpu_backend_never_passes_run() {
    let (first, second) = (fresh_cpu(), fresh_cpu());
    let victim = DeviceBuffer::new(&first, BYTES).unwrap();
    victim.write(0, &[0u8; 64]).unwrap();
    let foreign = DeviceBuffer::new(&second, BYTES).unwrap();
    foreign.write(0, &[0u8; 64]).unwrap();
    // Two fresh backends hand out the same segment ids, offsets and lengths.
    assert_eq!(victim.slice().segment().id, foreign.slice().segment().id);
    assert_eq!(
        (victim.slice().offset(), victim.slice().len()),
        (foreign.slice().offset(), foreign.slice().len())
    );
    assert_ne!(victim.slice().allocator(), foreign.slice().allocator());
    let kernel = fill(foreign.slice());
    assert_refused("second cpu backend", &kernel, &victim);
    assert_eq!(head(&foreign), vec![0u8; 64], "the foreign buffer was written");
    // Both buffers given: two backends, refused too.
    assert!(kernel.run(&[&victim, &foreign]).is_err());
    // The second backend gone (its memory freed): still refused, no use after free.
    drop(foreign);
    drop(second);
    assert_refused("dropped second cpu backend", &kernel, &victim);
    // The victim's own slice still runs.
    fill(victim.slice()).run(&[&victim]).unwrap();
    assert_eq!(&head(&victim)[..4], &7.0f32.to_le_bytes());
}

#[test]
fn a_slice_of_a_test_allocator_never_passes_run() {
    let cpu = fresh_cpu();
    let victim = DeviceBuffer::new(&cpu, BYTES).unwrap();
    victim.write(0, &[0u8; 64]).unwrap();
    let mock = CachingAllocator::new(
        Device::cpu(),
        Box::new(MockSource::new(1 << 30)),
        AllocatorConfig::default(),
    );
    let allocation = mock.alloc(BYTES).unwrap();
    let slice = allocation.slice();
    // Same segment id, offset and length; the address is a made-up one nobody owns.
    assert_eq!(slice.segment().id, victim.slice().segment().id);
    assert_eq!(
        (slice.offset(), slice.len()),
        (victim.slice().offset(), victim.slice().len())
    );
    assert_refused("mock allocator", &fill(slice), &victim);
    mock.free(allocation);
    drop(mock);
    assert_refused("dropped mock allocator", &fill(slice), &victim);
}

#[test]
fn a_slice_of_another_device_never_passes_run() {
    for device in common::gpu_devices("a_slice_of_another_device_never_passes_run") {
        let gpu = cartage::backend(&device).unwrap();
        let mut keep = Vec::new();

        // A CPU slice given with a GPU buffer whose segment id is the same.
        let victim = DeviceBuffer::new(&gpu, BYTES).unwrap();
        victim.write(0, &[0u8; 64]).unwrap();
        let cpu = fresh_cpu();
        let foreign = buffer_in_segment(&cpu, victim.slice().segment().id, &mut keep);
        let kernel = fill(foreign.slice());
        assert_refused(&format!("cpu slice, {device} buffer"), &kernel, &victim);
        assert_eq!(head(&foreign), vec![0u8; 64], "{device}: the cpu buffer was written");
        drop((foreign, std::mem::take(&mut keep), cpu));
        assert_refused(&format!("dropped cpu slice, {device} buffer"), &kernel, &victim);

        // A GPU slice given with a CPU buffer whose segment id is the same.
        let foreign = DeviceBuffer::new(&gpu, BYTES).unwrap();
        foreign.write(0, &[0u8; 64]).unwrap();
        let cpu = fresh_cpu();
        let victim = buffer_in_segment(&cpu, foreign.slice().segment().id, &mut keep);
        let kernel = fill(foreign.slice());
        assert_refused(&format!("{device} slice, cpu buffer"), &kernel, &victim);
        assert_eq!(head(&foreign), vec![0u8; 64], "{device}: the device buffer was written");
        drop(foreign);
        gpu.synchronize().unwrap();
        assert_refused(&format!("freed {device} slice, cpu buffer"), &kernel, &victim);

        // A slice of a tensor (`Tensor::as_arg`) of the device, with a CPU buffer.
        let t = cartage::Tensor::zeros(&[16], DType::F32, &device).unwrap();
        let arg = t.as_arg();
        let cpu = fresh_cpu();
        let victim = buffer_in_segment(&cpu, arg.buffer.segment().id, &mut keep);
        let kernel = Kernel::Fill {
            out: arg,
            value: Scalar::Float(7.0),
        };
        assert_refused(&format!("{device} tensor, cpu buffer"), &kernel, &victim);
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            vec![0.0; 16],
            "{device}: the tensor was written"
        );
    }
}

#[test]
fn oversized_pinned_and_staging_requests_are_typed_errors() {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices(
        "oversized_pinned_and_staging_requests_are_typed_errors",
    ));
    for device in devices {
        let backend = cartage::backend(&device).unwrap();
        // Sizes whose rounding to a word (4 or 8 bytes) would wrap, and one past any address space.
        for bytes in [usize::MAX, usize::MAX - 1, usize::MAX - 3, usize::MAX / 2 + 1] {
            match backend.alloc_pinned(bytes) {
                Ok(buffer) => panic!(
                    "{device}: alloc_pinned({bytes}) gave a buffer of {} bytes",
                    buffer.len()
                ),
                Err(e) => assert!(
                    matches!(e, cartage::Error::OutOfMemory(_) | cartage::Error::Unsupported { .. }),
                    "{device}: alloc_pinned({bytes}): {e:?}"
                ),
            }
            match backend.alloc_staging(bytes) {
                Ok(buffer) => panic!(
                    "{device}: alloc_staging({bytes}) gave a buffer of {} bytes",
                    buffer.len()
                ),
                Err(e) => assert!(
                    matches!(e, cartage::Error::OutOfMemory(_)),
                    "{device}: alloc_staging({bytes}): {e:?}"
                ),
            }
        }
        // Ordinary sizes still work.
        let staging = backend.alloc_staging(13).unwrap();
        assert_eq!(staging.len(), 13);
    }
}

/// A bool tensor holding the raw bytes `[0, 1, 2, 255, 0, 128]` reads as
/// `[false, true, true, true, false, true]` everywhere: cast, logical ops, `where`, sums.
fn assert_bools_normalised(device: &Device, t: &cartage::Tensor, how: &str) {
    let want = [false, true, true, true, false, true];
    let ones: Vec<u8> = want.iter().map(|&b| u8::from(b)).collect();
    assert_eq!(t.dtype(), DType::Bool, "{device} {how}");
    assert_eq!(t.to_vec::<bool>().unwrap(), want, "{device} {how}: values");
    assert_eq!(
        t.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        ones,
        "{device} {how}: cast to u8"
    );
    let as_f32: Vec<f32> = ones.iter().map(|&b| f32::from(b)).collect();
    assert_eq!(
        t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        as_f32,
        "{device} {how}: cast to f32"
    );
    let not: Vec<bool> = want.iter().map(|b| !b).collect();
    assert_eq!(
        t.logical_not().unwrap().to_vec::<bool>().unwrap(),
        not,
        "{device} {how}: logical_not"
    );
    let a = cartage::Tensor::full(&[6], 1.0f32, DType::F32, device).unwrap();
    let b = cartage::Tensor::full(&[6], -1.0f32, DType::F32, device).unwrap();
    let picked: Vec<f32> = want.iter().map(|&w| if w { 1.0 } else { -1.0 }).collect();
    assert_eq!(
        cartage::Tensor::where_cond(t, &a, &b).unwrap().to_vec::<f32>().unwrap(),
        picked,
        "{device} {how}: where"
    );
}

const RAW_BOOLS: [u8; 6] = [0, 1, 2, 255, 0, 128];

#[test]
fn bool_bytes_from_a_safetensors_file_are_normalised() {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices("bool_bytes_from_a_safetensors_file_are_normalised"));
    let header = br#"{"b":{"dtype":"BOOL","shape":[6],"data_offsets":[0,6]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(&RAW_BOOLS);
    let path = std::env::temp_dir().join(format!("cartage-hostile-bools-{}.safetensors", std::process::id()));
    std::fs::write(&path, &file).unwrap();
    for device in devices {
        let tensors = cartage::load_safetensors(&path, &device).unwrap();
        assert_bools_normalised(&device, &tensors["b"], "safetensors");
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn bool_bytes_copied_from_host_staging_are_normalised() {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::gpu_devices(
        "bool_bytes_copied_from_host_staging_are_normalised",
    ));
    for device in devices {
        let mut staging = cartage::alloc_staging(&device, RAW_BOOLS.len()).unwrap();
        staging.as_mut_slice()[..RAW_BOOLS.len()].copy_from_slice(&RAW_BOOLS);
        let t = cartage::Tensor::empty(&[6], DType::Bool, &device).unwrap();
        t.copy_from_pinned_async(&staging).unwrap().wait().unwrap();
        assert_bools_normalised(&device, &t, "copy_from_pinned_async");
    }
}
