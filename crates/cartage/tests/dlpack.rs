//! DLPack export and import: the C layout of `dlpack.h`, zero-copy round trips on the CPU (every
//! dtype, views with offsets and strides, versioned and not), the producer's deleter called
//! exactly once, hostile structs refused with typed errors (the deleter still called once), wgpu
//! refused, and CUDA round trips (skipping loudly without a GPU, failing when `CARTAGE_REQUIRE`
//! names cuda).

mod common;

use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cartage::dlpack::abi::{
    DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, device_type, type_code,
};
use cartage::dlpack::{DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use cartage::{DType, Device, DeviceKind, ErrorKind, Tensor, Var, backend};

// The layout of dlpack.h on 64-bit targets (every platform cartage's GPU backends run on).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(offset_of!(DLPackVersion, major) == 0 && offset_of!(DLPackVersion, minor) == 4);
    assert!(size_of::<DLDevice>() == 8);
    assert!(offset_of!(DLDevice, device_type) == 0 && offset_of!(DLDevice, device_id) == 4);
    assert!(size_of::<DLDataType>() == 4);
    assert!(offset_of!(DLDataType, code) == 0 && offset_of!(DLDataType, bits) == 1);
    assert!(offset_of!(DLDataType, lanes) == 2);
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLTensor, data) == 0);
    assert!(offset_of!(DLTensor, device) == 8);
    assert!(offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensor, dl_tensor) == 0);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, version) == 0);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};

#[test]
fn enum_values_are_dlpack_h_values() {
    assert_eq!(
        [
            device_type::CPU,
            device_type::CUDA,
            device_type::CUDA_HOST,
            device_type::OPENCL
        ],
        [1, 2, 3, 4]
    );
    assert_eq!(
        [device_type::VULKAN, device_type::ROCM, device_type::CUDA_MANAGED],
        [7, 10, 13]
    );
    assert_eq!(
        [
            type_code::INT,
            type_code::UINT,
            type_code::FLOAT,
            type_code::BFLOAT,
            type_code::COMPLEX,
            type_code::BOOL
        ],
        [0, 1, 2, 4, 5, 6]
    );
    assert_eq!(DLPACK_FLAG_BITMASK_READ_ONLY, 1);
    assert_eq!((DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION), (1, 1));
}

/// `[0, 1, ..., n)` of shape `shape` as `dtype` (bool: false, then true).
fn sample(shape: &[usize], dtype: DType, device: &Device) -> Tensor {
    let n: usize = shape.iter().product();
    let x = Tensor::arange(0.0, n as f64, 1.0, DType::F64, device).unwrap();
    x.to_dtype(dtype).unwrap().reshape(shape).unwrap()
}

/// The address of the first element `t` views.
fn first_addr(t: &Tensor) -> u64 {
    t.storage().buffer().addr() + (t.layout().offset() * t.dtype().size_in_bytes()) as u64
}

fn expected_dl_dtype(dtype: DType) -> (u8, u8) {
    match dtype {
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::Bool => (6, 8),
    }
}

/// Export `view`, check the struct describes it exactly, import it back, and check the result
/// is the same memory with the same values.
fn round_trip(view: &Tensor, versioned: bool) -> Tensor {
    let out = view.to_dlpack().unwrap();
    let dl = out.dl_tensor();
    let (code, bits) = expected_dl_dtype(view.dtype());
    assert_eq!((dl.dtype.code, dl.dtype.bits, dl.dtype.lanes), (code, bits, 1));
    let (kind, id) = match view.device().kind() {
        DeviceKind::Cpu => (device_type::CPU, 0),
        _ => (device_type::CUDA, view.device().ordinal() as i32),
    };
    assert_eq!((dl.device.device_type, dl.device.device_id), (kind, id));
    assert_eq!(dl.ndim as usize, view.rank());
    assert_eq!(dl.byte_offset, 0);
    assert_eq!(
        dl.data.addr() as u64,
        first_addr(view),
        "data points at the first element"
    );
    // SAFETY: `shape`/`strides` point to `ndim` values inside `out`, alive here.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(dl.shape, view.rank()),
            std::slice::from_raw_parts(dl.strides, view.rank()),
        )
    };
    assert_eq!(shape, view.shape().iter().map(|&d| d as i64).collect::<Vec<_>>());
    assert_eq!(
        strides,
        view.layout().strides().iter().map(|&s| s as i64).collect::<Vec<_>>()
    );
    let back = if versioned {
        let raw = out.into_raw_versioned();
        // SAFETY: `raw` came from `into_raw_versioned` and is read before it is imported.
        let m = unsafe { raw.as_ref() };
        assert_eq!((m.version.major, m.version.minor, m.flags), (1, 1, 0));
        // SAFETY: imported once; cartage owns it from here.
        unsafe { Tensor::from_dlpack_versioned(raw) }.unwrap()
    } else {
        // SAFETY: imported once; cartage owns it from here.
        unsafe { Tensor::from_dlpack(out.into_raw()) }.unwrap()
    };
    assert_eq!(first_addr(&back), first_addr(view), "the import is zero copy");
    assert_eq!(back.shape(), view.shape());
    assert_eq!(back.layout().strides(), view.layout().strides());
    assert_eq!(back.dtype(), view.dtype());
    assert_eq!(back.device(), view.device());
    assert!(back.storage().is_external());
    assert_eq!(back.to_vec_f64().unwrap(), view.to_vec_f64().unwrap());
    back
}

/// Views with offsets, transposed and broadcast strides, and a scalar.
fn views(base: &Tensor) -> Vec<Tensor> {
    vec![
        base.clone(),
        base.permute(&[2, 0, 1]).unwrap(),
        base.narrow(2, 1, 2).unwrap(),
        base.select(0, 1).unwrap().narrow(0, 1, 2).unwrap(),
        base.narrow(1, 2, 1).unwrap().expand(&[2, 4, 4]).unwrap(),
        base.select(0, 1).unwrap().select(0, 2).unwrap().select(0, 3).unwrap(),
    ]
}

#[test]
fn cpu_round_trips_every_dtype_and_view_zero_copy() {
    let cpu = Device::cpu();
    for dtype in DType::ALL {
        let base = sample(&[2, 3, 4], dtype, &cpu);
        for (i, view) in views(&base).iter().enumerate() {
            let back = round_trip(view, i % 2 == 1);
            // Cartage memory coming back lies in its own block's segment: the overlap checks see it.
            assert!(
                back.storage().buffer().same_segment(&base.storage().buffer()),
                "{dtype} view {i}"
            );
        }
    }
}

#[test]
fn an_export_keeps_the_memory_alive_until_the_deleter() {
    let cpu = Device::cpu();
    let x = sample(&[64], DType::F32, &cpu);
    let expected = x.to_vec_f64().unwrap();
    let storage = Arc::downgrade(x.storage());
    let raw = x.narrow(0, 8, 56).unwrap().to_dlpack_raw().unwrap();
    drop(x);
    assert!(storage.upgrade().is_some(), "the export holds the storage");
    // SAFETY: `raw` came from `to_dlpack_raw`; imported once.
    let back = unsafe { Tensor::from_dlpack(raw) }.unwrap();
    assert_eq!(back.to_vec_f64().unwrap(), expected[8..]);
    drop(back); // calls the deleter
    assert!(storage.upgrade().is_none(), "the deleter dropped the storage");

    // An export never handed out frees nothing twice.
    let y = sample(&[4], DType::I64, &cpu);
    let weak = Arc::downgrade(y.storage());
    drop(y.to_dlpack().unwrap());
    drop(y);
    assert!(weak.upgrade().is_none());
}

#[test]
fn a_tensor_a_variable_leads_to_is_not_exported() {
    let v = Var::new(sample(&[3], DType::F32, &Device::cpu())).unwrap();
    let err = v.tensor().to_dlpack().unwrap_err();
    assert!(err.to_string().contains("detach"), "{err}");
    v.tensor().detach().to_dlpack().unwrap();
}

/// A producer's tensor built by hand: `words` of memory (8-byte aligned), its own shape and
/// strides arrays, and a deleter that counts its calls.
#[repr(C)]
struct HandBuilt {
    managed: DLManagedTensor,
    words: Vec<u64>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    deleted: Arc<AtomicUsize>,
}

/// # Safety
/// `m` is a pointer made by [`hand_built`], deleted once.
unsafe extern "C" fn delete_hand_built(m: *mut DLManagedTensor) {
    // SAFETY: made by `Box::into_raw` in `hand_built`; `managed` is the first field.
    let b = unsafe { Box::from_raw(m.cast::<HandBuilt>()) };
    b.deleted.fetch_add(1, Ordering::SeqCst);
}

struct Spec {
    words: Vec<u64>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: DLDataType,
    device: DLDevice,
    byte_offset: u64,
}

fn f32_spec(values: &[f32], shape: &[i64]) -> Spec {
    let mut words = vec![0u64; values.len().div_ceil(2)];
    for (i, v) in values.iter().enumerate() {
        words[i / 2] |= u64::from(v.to_bits()) << (32 * (i % 2));
    }
    Spec {
        words,
        shape: shape.to_vec(),
        strides: None,
        dtype: DLDataType {
            code: type_code::FLOAT,
            bits: 32,
            lanes: 1,
        },
        device: DLDevice {
            device_type: device_type::CPU,
            device_id: 0,
        },
        byte_offset: 0,
    }
}

fn hand_built(spec: Spec, deleted: &Arc<AtomicUsize>) -> NonNull<DLManagedTensor> {
    let mut b = Box::new(HandBuilt {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: std::ptr::null_mut(),
                device: spec.device,
                ndim: spec.shape.len() as i32,
                dtype: spec.dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: spec.byte_offset,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_hand_built),
        },
        words: spec.words,
        shape: spec.shape,
        strides: spec.strides.unwrap_or_default(),
        deleted: Arc::clone(deleted),
    });
    b.managed.dl_tensor.data = b.words.as_mut_ptr().cast::<c_void>();
    b.managed.dl_tensor.shape = b.shape.as_mut_ptr();
    if !b.strides.is_empty() {
        b.managed.dl_tensor.strides = b.strides.as_mut_ptr();
    }
    NonNull::from(Box::leak(b)).cast()
}

#[test]
fn a_producers_deleter_runs_once_when_the_last_view_drops() {
    let deleted = Arc::new(AtomicUsize::new(0));
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let raw = hand_built(f32_spec(&values, &[3, 4]), &deleted);
    // SAFETY: `raw` is a valid hand-built struct, handed over once.
    let x = unsafe { Tensor::from_dlpack(raw) }.unwrap();
    // SAFETY: still owned by `x`, alive: its data pointer is the one cartage wraps.
    let data = unsafe { raw.as_ref() }.dl_tensor.data.addr() as u64;
    assert_eq!(x.storage().buffer().addr(), data);
    assert_eq!(
        x.storage().buffer().allocator(),
        backend(&Device::cpu()).unwrap().allocator().id()
    );
    let view = x.t().unwrap();
    assert_eq!(view.to_vec_f64().unwrap()[..3], [0.0, 2.0, 4.0]);
    // Cartage writes land in the producer's memory.
    x.copy_from(&x.mul_scalar(2.0).unwrap()).unwrap();
    drop(x);
    assert_eq!(deleted.load(Ordering::SeqCst), 0, "a view still holds the memory");
    assert_eq!(view.to_vec_f64().unwrap()[..3], [0.0, 4.0, 8.0]);
    drop(view);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);

    // Explicit non-contiguous strides become a view; an empty tensor releases at once.
    let mut spec = f32_spec(&values, &[4, 3]);
    spec.strides = Some(vec![1, 4]);
    // SAFETY: a valid hand-built struct, handed over once.
    let t = unsafe { Tensor::from_dlpack(hand_built(spec, &deleted)) }.unwrap();
    assert_eq!(t.to_vec_f64().unwrap()[..4], [0.0, 2.0, 4.0, 0.5]);
    drop(t);
    assert_eq!(deleted.load(Ordering::SeqCst), 2);
    // SAFETY: a valid hand-built struct, handed over once.
    let empty = unsafe { Tensor::from_dlpack(hand_built(f32_spec(&[], &[0, 5]), &deleted)) }.unwrap();
    assert_eq!((empty.shape(), deleted.load(Ordering::SeqCst)), (&[0usize, 5][..], 3));
}

#[test]
fn two_imports_of_the_same_memory_are_seen_to_overlap() {
    let deleted = Arc::new(AtomicUsize::new(0));
    let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let raw = hand_built(f32_spec(&values, &[8]), &deleted);
    // SAFETY: valid, handed over once.
    let a = unsafe { Tensor::from_dlpack(raw) }.unwrap();
    // A second struct viewing the same bytes from element 2, as a producer's slice would.
    let mut spec = f32_spec(&[], &[4]);
    spec.words = Vec::new();
    let second = hand_built(spec, &deleted);
    // SAFETY: both structs are alive; point the second at the first's memory.
    unsafe { (*second.as_ptr()).dl_tensor.data = (*raw.as_ptr()).dl_tensor.data.byte_add(8) };
    // SAFETY: valid (its memory is kept alive by `a`, dropped last), handed over once.
    let b = unsafe { Tensor::from_dlpack(second) }.unwrap();
    let (sa, sb) = (a.storage().buffer(), b.storage().buffer());
    assert!(
        sa.same_segment(&sb) && sa.contains(&sb),
        "imports of one memory share a segment"
    );
    // A kernel writing one import while reading the other is refused as any overlap is.
    let err = a.narrow(0, 0, 4).unwrap().copy_from(&b).unwrap_err();
    assert!(err.to_string().contains("shares memory"), "{err}");
    a.narrow(0, 0, 4)
        .unwrap()
        .copy_from(&b.contiguous().unwrap().add_scalar(0.0).unwrap())
        .unwrap();
    assert_eq!(a.to_vec_f64().unwrap(), [2.0, 3.0, 4.0, 5.0, 4.0, 5.0, 6.0, 7.0]);
    drop(b);
    drop(a);
    assert_eq!(deleted.load(Ordering::SeqCst), 2);
}

#[test]
fn a_view_stretched_past_its_cartage_block_is_refused() {
    // 128 f32 fill one 512-byte block exactly: 256 elements from its start reach past it (into a
    // neighbour block or past the segment), which no live tensor holds wholly.
    let x = Tensor::zeros(&[128], DType::F32, &Device::cpu()).unwrap();
    let addr = x.storage().buffer().addr();
    refused(
        "stretched cartage memory",
        |m| {
            m.dl_tensor.data = std::ptr::with_exposed_provenance_mut(addr as usize);
            // SAFETY: the shape array holds 2 values.
            unsafe { *m.dl_tensor.shape = 128 };
        },
        "no live tensor holds wholly",
    );
    // Within the block it is the block's own segment.
    let deleted = Arc::new(AtomicUsize::new(0));
    let raw = hand_built(f32_spec(&[0.0; 4], &[2, 2]), &deleted);
    // SAFETY: alive and not yet handed over; `x` keeps the memory it now names alive.
    unsafe { (*raw.as_ptr()).dl_tensor.data = std::ptr::with_exposed_provenance_mut(addr as usize + 16) };
    // SAFETY: handed over once; `x` outlives the import.
    let inner = unsafe { Tensor::from_dlpack(raw) }.unwrap();
    assert!(x.storage().buffer().contains(&inner.storage().buffer()));
    drop(inner);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

/// Import `spec` (mutated by `edit`) and expect a typed error containing `needle`, with the
/// deleter called exactly once.
fn refused(what: &str, edit: impl FnOnce(&mut DLManagedTensor), needle: &str) {
    refused_as(ErrorKind::InvalidArgument, what, edit, needle);
}

/// As [`refused`], expecting an error of `kind`.
fn refused_as(kind: ErrorKind, what: &str, edit: impl FnOnce(&mut DLManagedTensor), needle: &str) {
    let deleted = Arc::new(AtomicUsize::new(0));
    let raw = hand_built(f32_spec(&[1.0, 2.0, 3.0, 4.0], &[2, 2]), &deleted);
    // SAFETY: the struct is alive and not yet handed over.
    edit(unsafe { &mut *raw.as_ptr() });
    // SAFETY: handed over once; the fields may be hostile but the arrays it names are alive.
    let err = unsafe { Tensor::from_dlpack(raw) }.unwrap_err();
    assert_eq!(deleted.load(Ordering::SeqCst), 1, "{what}: the deleter ran once");
    assert_eq!(err.kind(), kind, "{what}: {err}");
    assert!(err.to_string().contains(needle), "{what}: `{err}` lacks `{needle}`");
}

#[test]
fn hostile_structs_are_typed_errors_and_the_deleter_still_runs_once() {
    refused(
        "null data",
        |m| m.dl_tensor.data = std::ptr::null_mut(),
        "null data pointer",
    );
    refused("huge ndim", |m| m.dl_tensor.ndim = 1 << 20, "ndim");
    refused("negative ndim", |m| m.dl_tensor.ndim = -1, "ndim");
    refused("null shape", |m| m.dl_tensor.shape = std::ptr::null_mut(), "null shape");
    refused(
        "negative size",
        // SAFETY: the shape array holds 2 values.
        |m| unsafe { *m.dl_tensor.shape = -2 },
        "negative size",
    );
    refused_as(
        ErrorKind::SizeOverflow,
        "shape product overflow",
        // SAFETY: the shape array holds 2 values.
        |m| unsafe {
            *m.dl_tensor.shape = 1 << 40;
            *m.dl_tensor.shape.add(1) = 1 << 40;
        },
        "elements",
    );
    refused("unknown dtype", |m| m.dl_tensor.dtype.code = 99, "unknown type code");
    refused("complex", |m| m.dl_tensor.dtype.code = type_code::COMPLEX, "complex");
    refused(
        "int8",
        |m| {
            m.dl_tensor.dtype = DLDataType {
                code: type_code::INT,
                bits: 8,
                lanes: 1,
            };
        },
        "no cartage dtype",
    );
    refused("lanes", |m| m.dl_tensor.dtype.lanes = 4, "lanes");
    refused(
        "bool bits",
        |m| {
            m.dl_tensor.dtype = DLDataType {
                code: type_code::BOOL,
                bits: 1,
                lanes: 1,
            };
        },
        "bool of 1 bits",
    );
    refused(
        "OpenCL",
        |m| m.dl_tensor.device.device_type = device_type::OPENCL,
        "kDLOpenCL",
    );
    refused(
        "unknown device",
        |m| m.dl_tensor.device.device_type = 99,
        "unknown DLPack device type 99",
    );
    refused(
        "managed",
        |m| m.dl_tensor.device.device_type = device_type::CUDA_MANAGED,
        "managed",
    );
    refused("cpu id", |m| m.dl_tensor.device.device_id = 3, "device_id 3");
    refused(
        "negative cuda id",
        |m| {
            m.dl_tensor.device = DLDevice {
                device_type: device_type::CUDA,
                device_id: -1,
            };
        },
        "negative id",
    );
    refused("misaligned", |m| m.dl_tensor.byte_offset = 2, "not aligned");
    refused(
        "byte_offset overflow",
        |m| m.dl_tensor.byte_offset = u64::MAX,
        "address space",
    );
    refused(
        "misaligned shape array",
        |m| m.dl_tensor.shape = m.dl_tensor.shape.cast::<u8>().wrapping_add(1).cast(),
        "aligned",
    );
    // Negative strides need a strides array: give it one in the struct's own shape array's place.
    let deleted = Arc::new(AtomicUsize::new(0));
    let mut spec = f32_spec(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    spec.strides = Some(vec![-2, 1]);
    let spec_raw = hand_built(spec, &deleted);
    // SAFETY: handed over once.
    let err = unsafe { Tensor::from_dlpack(spec_raw) }.unwrap_err();
    assert!(err.to_string().contains("negative stride"), "{err}");
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
    // A stride reaching past what a layout may address.
    let mut spec = f32_spec(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    spec.strides = Some(vec![i64::MAX, 1]);
    // SAFETY: handed over once.
    let err = unsafe { Tensor::from_dlpack(hand_built(spec, &deleted)) }.unwrap_err();
    assert!(err.to_string().contains("reaches beyond"), "{err}");
    assert_eq!(deleted.load(Ordering::SeqCst), 2);
}

/// A versioned struct around a hand-built one; its deleter deletes the inner one.
#[repr(C)]
struct HandBuiltVersioned {
    managed: DLManagedTensorVersioned,
    inner: NonNull<DLManagedTensor>,
}

/// # Safety
/// `m` was made by [`versioned`], deleted once.
unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: made by `Box::into_raw` in `versioned`.
    let b = unsafe { Box::from_raw(m.cast::<HandBuiltVersioned>()) };
    // SAFETY: the inner struct's own deleter, called once.
    unsafe { delete_hand_built(b.inner.as_ptr()) };
}

fn versioned(major: u32, flags: u64, deleted: &Arc<AtomicUsize>) -> NonNull<DLManagedTensorVersioned> {
    let inner = hand_built(f32_spec(&[1.0, 2.0], &[2]), deleted);
    let b = Box::new(HandBuiltVersioned {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            // SAFETY: the inner struct is alive (deleted with this one).
            dl_tensor: unsafe { inner.as_ref() }.dl_tensor,
        },
        inner,
    });
    NonNull::from(Box::leak(b)).cast()
}

#[test]
fn versioned_structs_check_the_version_and_refuse_read_only() {
    let deleted = Arc::new(AtomicUsize::new(0));
    // SAFETY: each struct is valid and handed over once.
    let ok = unsafe { Tensor::from_dlpack_versioned(versioned(1, 0, &deleted)) }.unwrap();
    assert_eq!(ok.to_vec_f64().unwrap(), [1.0, 2.0]);
    drop(ok);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
    // SAFETY: valid, handed over once (its fields are not read past the version).
    let err = unsafe { Tensor::from_dlpack_versioned(versioned(2, 0, &deleted)) }.unwrap_err();
    assert!(err.to_string().contains("version 2.0"), "{err}");
    assert_eq!(deleted.load(Ordering::SeqCst), 2);
    // SAFETY: valid, handed over once.
    let err =
        unsafe { Tensor::from_dlpack_versioned(versioned(1, DLPACK_FLAG_BITMASK_READ_ONLY, &deleted)) }.unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(deleted.load(Ordering::SeqCst), 3);
}

#[test]
fn a_null_deleter_is_allowed() {
    let deleted = Arc::new(AtomicUsize::new(0));
    let raw = hand_built(f32_spec(&[1.0, 2.0], &[2]), &deleted);
    // SAFETY: alive; the struct is freed below by its real deleter instead.
    unsafe { (*raw.as_ptr()).deleter = None };
    // SAFETY: valid; a NULL deleter means nothing to call.
    let x = unsafe { Tensor::from_dlpack(raw) }.unwrap();
    assert_eq!(x.to_vec_f64().unwrap(), [1.0, 2.0]);
    drop(x);
    assert_eq!(deleted.load(Ordering::SeqCst), 0);
    // SAFETY: cartage is done with it; free it once.
    unsafe { delete_hand_built(raw.as_ptr()) };
}

#[test]
fn wgpu_tensors_are_refused_with_a_hint() {
    let device = Device::wgpu(0);
    if let Err(e) = backend(&device) {
        assert!(
            !common::required(DeviceKind::Wgpu),
            "CARTAGE_REQUIRE names wgpu but it did not open: {e}"
        );
        common::device_missing("wgpu_tensors_are_refused_with_a_hint", &device, &e);
        return;
    }
    let x = Tensor::zeros(&[4], DType::F32, &device).unwrap();
    let err = x.to_dlpack().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("no device type for wgpu"), "{err}");
}

/// `cuda:0`, or `None` after a SKIP line (a panic when `CARTAGE_REQUIRE` names cuda).
fn cuda0(test: &str) -> Option<Device> {
    let device = Device::cuda(0);
    match backend(&device) {
        Ok(_) => Some(device),
        Err(e) => {
            assert!(
                !common::required(DeviceKind::Cuda),
                "{test}: CARTAGE_REQUIRE names cuda but {device} did not open: {e}"
            );
            common::device_missing(test, &device, &e);
            None
        }
    }
}

#[test]
fn cuda_round_trips_every_dtype_and_view_zero_copy() {
    let Some(cuda) = cuda0("cuda_round_trips_every_dtype_and_view_zero_copy") else {
        return;
    };
    for dtype in DType::ALL {
        let base = sample(&[2, 3, 4], dtype, &cuda);
        for (i, view) in views(&base).iter().enumerate() {
            let back = round_trip(view, i % 2 == 0);
            assert!(
                back.storage().buffer().same_segment(&base.storage().buffer()),
                "{dtype} view {i}"
            );
            // Computing on the import reads the right elements.
            if dtype.is_float() {
                let doubled = back.mul_scalar(2.0).unwrap().to_vec_f64().unwrap();
                let expected: Vec<f64> = view.to_vec_f64().unwrap().iter().map(|v| v * 2.0).collect();
                assert_eq!(doubled, expected, "{dtype} view {i}");
            }
        }
    }
}

#[test]
fn cuda_imports_check_the_pointer_with_the_driver() {
    let Some(cuda) = cuda0("cuda_imports_check_the_pointer_with_the_driver") else {
        return;
    };
    // Host memory labelled as CUDA memory.
    // Host memory labelled as CUDA memory (the driver either does not know it or places it
    // nowhere on this device: an `import_external` error either way).
    refused_cuda("host memory", |_| {}, "`import_external`");
    // A cartage CUDA tensor's pointer with a shape far past its allocation.
    let x = Tensor::zeros(&[16], DType::F32, &cuda).unwrap();
    let addr = x.storage().buffer().addr();
    refused_cuda(
        "past the allocation",
        |m| {
            m.dl_tensor.data = std::ptr::with_exposed_provenance_mut(addr as usize);
            // SAFETY: the shape array holds 2 values.
            unsafe { *m.dl_tensor.shape = 1 << 28 };
        },
        "past the end of the allocation",
    );
    // The right pointer on the wrong ordinal (only meaningful with two GPUs; cuda:1 otherwise
    // is not compiled in or absent, a typed error either way).
    let deleted = Arc::new(AtomicUsize::new(0));
    let mut spec = f32_spec(&[0.0; 4], &[2, 2]);
    spec.device = DLDevice {
        device_type: device_type::CUDA,
        device_id: 1,
    };
    let raw = hand_built(spec, &deleted);
    // SAFETY: alive, not yet handed over.
    unsafe { (*raw.as_ptr()).dl_tensor.data = std::ptr::with_exposed_provenance_mut(addr as usize) };
    // SAFETY: handed over once.
    assert!(unsafe { Tensor::from_dlpack(raw) }.is_err());
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

fn refused_cuda(what: &str, edit: impl FnOnce(&mut DLManagedTensor), needle: &str) {
    refused(
        what,
        |m| {
            m.dl_tensor.device = DLDevice {
                device_type: device_type::CUDA,
                device_id: 0,
            };
            edit(m);
        },
        needle,
    );
}
