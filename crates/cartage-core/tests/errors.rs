//! Every `Error` variant's message names what a user needs to find the cause (LESSONS R16, R26,
//! R28): both devices and both sites of a mismatch, the feature that enables a missing backend,
//! the ordinal a bare `cuda` lacks, dtype + device + op of an unsupported kernel, the element
//! count of an overflowing shape, the fix for a host read of the wrong type, and so on; and
//! `Error::kind()` tells the variants apart.

use std::panic::Location;

use cartage_core::error::ErrorKind;
use cartage_core::layout::MAX_ELEMENTS;
use cartage_core::{DType, Device, Error, Layout, LiveBlock, OomReport};

fn site() -> &'static Location<'static> {
    Location::caller()
}

#[track_caller]
fn here() -> &'static Location<'static> {
    Location::caller()
}

fn assert_names(error: &Error, needles: &[&str]) {
    let message = error.to_string();
    for needle in needles {
        assert!(
            message.contains(needle),
            "`{needle}` missing from {}: {message}",
            error.kind_name()
        );
    }
}

#[test]
fn device_mismatch_names_both_devices_and_both_sites() {
    let lhs_site = here();
    let rhs_site = here();
    let error = Error::DeviceMismatch {
        op: "matmul",
        lhs_device: Device::cuda(1),
        lhs_site,
        rhs_device: Device::cpu(),
        rhs_site,
    };
    assert_ne!(lhs_site.line(), rhs_site.line());
    assert_names(
        &error,
        &[
            "`matmul`",
            "cuda:1",
            "cpu",
            &lhs_site.to_string(),
            &rhs_site.to_string(),
            ".to(&device)",
        ],
    );
}

#[test]
fn dtype_errors_name_dtypes_sites_and_the_fix() {
    let lhs_site = here();
    let rhs_site = here();
    let error = Error::DTypeMismatch {
        op: "add",
        lhs: DType::F32,
        lhs_site,
        rhs: DType::BF16,
        rhs_site,
    };
    assert_names(
        &error,
        &[
            "`add`",
            "f32",
            "bf16",
            &lhs_site.to_string(),
            &rhs_site.to_string(),
            "to_dtype",
        ],
    );
    let error = Error::WrongDType {
        op: "index_select",
        dtype: DType::F32,
        expected: "indices must be i32 or i64",
    };
    assert_names(&error, &["`index_select`", "f32", "i32 or i64"]);
}

#[test]
fn shape_and_dimension_errors_print_shapes() {
    let error = Error::ShapeMismatch {
        op: "add",
        lhs: vec![2, 3],
        rhs: vec![4],
        reason: "dimension 1 is 3 against 4".into(),
    };
    assert_names(&error, &["`add`", "[2, 3]", "[4]", "3 against 4"]);
    let error = Error::DimOutOfRange {
        op: "sum",
        dim: 3,
        rank: 2,
    };
    assert_names(&error, &["`sum`", "dimension 3", "rank 2", "negative"]);
    let error = Error::DimOutOfRange {
        op: "unsqueeze",
        dim: 4,
        rank: 2,
    };
    assert_names(&error, &["`unsqueeze`", "dimension 4", "rank 2", "0..=2", "-3..=-1"]);
    let error = Error::DimOutOfRange {
        op: "squeeze",
        dim: 0,
        rank: 0,
    };
    assert_names(&error, &["rank 0", "no dimension"]);
    let error = Error::SizeOverflow {
        shape: vec![usize::MAX, 2],
        dtype: DType::F64,
    };
    let elements = u128::from(u64::MAX) * 2;
    assert_names(
        &error,
        &[
            &format!("[{}, 2]", usize::MAX),
            "f64",
            "overflow",
            &format!("{elements} elements ({} bytes)", elements * 8),
            &format!("at most {MAX_ELEMENTS} elements"),
        ],
    );
    let error = Error::size_overflow(&[1 << 40, 1 << 40, 1 << 40, 1 << 40], DType::F32);
    assert_names(&error, &["f32", "more than 2^128 elements"]);
    let error = Error::DataLength {
        op: "from_vec",
        shape: vec![2, 3],
        numel: 6,
        len: 5,
    };
    assert_names(&error, &["`from_vec`", "5 values", "[2, 3]", "6"]);
    let error = Error::NotAScalar {
        shape: vec![3],
        numel: 3,
    };
    assert_names(&error, &["`item`", "[3]", "3 elements", "exactly one"]);
    let shape = Layout::contiguous(&[2, 3]).unwrap();
    assert_names(
        &shape.narrow(1, 5, 1).unwrap_err(),
        &["`narrow`", "start 5", "dimension 1", "size 3"],
    );
    assert_names(
        &shape.narrow(1, 2, 4).unwrap_err(),
        &["`narrow`", "start 2", "length 4", "size 3", "at most 1"],
    );
}

#[test]
fn size_overflow_from_a_layout_can_name_the_real_dtype() {
    let error = Layout::contiguous(&[MAX_ELEMENTS, 2]).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::SizeOverflow);
    let error = error.with_dtype(DType::BF16);
    assert!(
        matches!(error, Error::SizeOverflow { dtype: DType::BF16, .. }),
        "{error}"
    );
    assert_names(
        &error,
        &[
            &format!("[{MAX_ELEMENTS}, 2]"),
            "bf16",
            &format!("{} elements", MAX_ELEMENTS as u128 * 2),
        ],
    );
    // Other errors pass through unchanged.
    assert_eq!(
        Error::invalid("x", "y").with_dtype(DType::F32).kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn host_reads_of_the_wrong_type_suggest_the_right_read() {
    let (tensor_site, read_site) = (here(), here());
    let error = Error::DTypeMismatch {
        op: "to_vec",
        lhs: DType::F32,
        lhs_site: tensor_site,
        rhs: DType::F64,
        rhs_site: read_site,
    };
    assert_names(
        &error,
        &[
            "`to_vec::<f64>()`",
            "holds f32",
            "`to_vec::<f32>()`",
            "`to_vec_f64()`",
            ".to_dtype(DType::F64)",
            &tensor_site.to_string(),
            &read_site.to_string(),
        ],
    );
    let error = Error::DTypeMismatch {
        op: "item",
        lhs: DType::I64,
        lhs_site: tensor_site,
        rhs: DType::I32,
        rhs_site: read_site,
    };
    assert_names(&error, &["`item::<i32>()`", "holds i64", "`item::<i64>()`", "to_dtype"]);
}

#[test]
fn index_out_of_range_names_index_dimension_size_and_device() {
    let error = Error::IndexOutOfRange {
        op: "gather",
        index: -1,
        dim: 1,
        size: 7,
        device: Device::wgpu(0),
    };
    assert_names(
        &error,
        &["`gather`", "index -1", "dimension 1", "size 7", "wgpu:0", "off by one"],
    );
}

#[test]
fn unsupported_names_op_dtype_device_and_capabilities() {
    let error = Error::unsupported("matmul", DType::F64, Device::wgpu(1), "WGSL has no f64");
    assert_names(
        &error,
        &[
            "`matmul`",
            "f64",
            "wgpu:1",
            "WGSL has no f64",
            "capabilities()",
            "to_dtype",
        ],
    );
    assert!(matches!(
        error,
        Error::Unsupported {
            dtype: Some(DType::F64),
            ..
        }
    ));
}

#[test]
fn device_errors_ask_for_an_ordinal_or_a_feature() {
    for bare in ["cuda", "wgpu"] {
        let error = bare.parse::<Device>().unwrap_err();
        assert!(matches!(error, Error::InvalidDevice { .. }));
        assert_names(&error, &[&format!("`{bare}`"), &format!("{bare}:0"), "ordinal"]);
    }
    assert_names(
        &"tpu:0".parse::<Device>().unwrap_err(),
        &["`tpu:0`", "cpu", "cuda:N", "wgpu:N"],
    );
    for text in [
        "cpu:99999999999999999999",
        "cuda:99999999999999999999",
        "wgpu:-1",
        "cuda:x",
    ] {
        let error = text.parse::<Device>().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidDevice);
        assert_names(&error, &[&format!("`{text}`"), "not a number"]);
        assert!(!error.to_string().contains("other than 0"), "{error}");
    }
    assert_names(
        &"cpu:2".parse::<Device>().unwrap_err(),
        &["ordinal 0 only", "write `cpu`"],
    );
    let error = Error::BackendNotCompiled {
        device: Device::cuda(0),
        feature: "cuda",
    };
    assert_names(
        &error,
        &[
            "cuda:0",
            "compiled without",
            "`cuda` feature",
            "--features cuda",
            "CARTAGE_DEVICE",
        ],
    );
    let error = Error::BackendUnavailable {
        device: Device::cuda(2),
        reason: "only 1 device (check `nvidia-smi`)".into(),
    };
    assert_names(&error, &["cuda:2", "not available", "nvidia-smi"]);
    let error = Error::Driver {
        device: Device::cuda(0),
        op: "launch",
        message: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
    };
    assert_names(&error, &["cuda:0", "`launch`", "CUDA_ERROR_ILLEGAL_ADDRESS"]);
}

#[test]
fn file_errors_name_the_path() {
    let error = Error::Io {
        path: "model.safetensors".into(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
    };
    assert_names(&error, &["model.safetensors", "no such file"]);
    assert!(
        std::error::Error::source(&error).is_some(),
        "the io error stays reachable"
    );
    assert_eq!(error.io_kind(), Some(std::io::ErrorKind::NotFound));
    assert_eq!(error.kind(), ErrorKind::Io);
    let error = Error::io(
        "/root/w.bin",
        std::io::Error::from(std::io::ErrorKind::PermissionDenied),
    );
    assert_eq!(error.io_kind(), Some(std::io::ErrorKind::PermissionDenied));
    assert_names(&error, &["/root/w.bin"]);
    assert_eq!(Error::invalid("x", "y").io_kind(), None);
    let error = Error::Format {
        path: "w.bin".into(),
        format: "safetensors",
        reason: "header longer than the file".into(),
    };
    assert_names(&error, &["w.bin", "safetensors", "header longer"]);
}

fn report(requested: usize, reserved: usize, allocated: usize, largest_free: usize) -> OomReport {
    OomReport {
        device: Device::cuda(0),
        requested,
        requested_at: Some(site()),
        capacity: Some(80 << 30),
        free: Some(1 << 30),
        limit: None,
        allocated,
        reserved,
        largest_free_block: largest_free,
        largest_live: vec![LiveBlock {
            bytes: 40 << 30,
            site: site(),
        }],
    }
}

#[test]
fn out_of_memory_says_what_holds_the_memory() {
    let error = Error::OutOfMemory(Box::new(report(2 << 30, 70 << 30, 69 << 30, 1 << 20)));
    assert_names(
        &error,
        &[
            "out of memory on cuda:0",
            "tried to allocate 2.00 GiB",
            &format!("at {}", site()),
            "80.00 GiB in total, 1.00 GiB free",
            "70.00 GiB reserved",
            "69.00 GiB allocated",
            "largest free block 1.00 MiB",
            "Live tensors hold the memory",
            &format!("Largest live allocations: 40.00 GiB at {}", site()),
        ],
    );
    let fragmented = Error::OutOfMemory(Box::new(report(2 << 30, 70 << 30, 60 << 30, 1 << 30)));
    assert_names(&fragmented, &["Fragmentation is the cause", "empty_cache()"]);
    let too_big = Error::OutOfMemory(Box::new(report(100 << 30, 0, 0, 0)));
    assert_names(&too_big, &["exceeds the device's capacity", "numel × dtype size"]);
    // Under a limit with nothing allocated, the limit is the cause, not live tensors.
    let mut limited = report(1 << 10, 0, 0, 0);
    limited.limit = Some(1 << 20);
    let limited = Error::OutOfMemory(Box::new(limited));
    assert_names(
        &limited,
        &[
            "the allocator's limit is 1.00 MiB",
            "The allocator's limit of 1.00 MiB is the cause",
            "nothing is allocated",
            "set_limit",
        ],
    );
    assert!(!limited.to_string().contains("Live tensors hold"), "{limited}");
    // With live tensors under the limit, they are named as before.
    let mut held = report(2 << 30, 70 << 30, 69 << 30, 1 << 20);
    held.limit = Some(70 << 30);
    assert_names(&Error::OutOfMemory(Box::new(held)), &["Live tensors hold the memory"]);
    // A hand-made report with allocated above reserved prints instead of panicking.
    let odd = Error::OutOfMemory(Box::new(report(1, 0, 5, 0)));
    assert_names(&odd, &["0 B cached free"]);
}

#[test]
fn every_variant_has_its_own_kind_name() {
    let (a, b) = (here(), here());
    let errors = [
        Error::DeviceMismatch {
            op: "x",
            lhs_device: Device::cpu(),
            lhs_site: a,
            rhs_device: Device::cuda(0),
            rhs_site: b,
        },
        Error::DTypeMismatch {
            op: "x",
            lhs: DType::F32,
            lhs_site: a,
            rhs: DType::F16,
            rhs_site: b,
        },
        Error::WrongDType {
            op: "x",
            dtype: DType::F32,
            expected: "y",
        },
        Error::ShapeMismatch {
            op: "x",
            lhs: vec![],
            rhs: vec![],
            reason: String::new(),
        },
        Error::DimOutOfRange {
            op: "x",
            dim: 0,
            rank: 0,
        },
        Error::invalid("x", "y"),
        Error::SizeOverflow {
            shape: vec![],
            dtype: DType::U8,
        },
        Error::DataLength {
            op: "x",
            shape: vec![],
            numel: 1,
            len: 0,
        },
        Error::IndexOutOfRange {
            op: "x",
            index: 0,
            dim: 0,
            size: 0,
            device: Device::cpu(),
        },
        Error::NotAScalar {
            shape: vec![],
            numel: 0,
        },
        Error::unsupported("x", DType::Bool, Device::cpu(), "y"),
        Error::OutOfMemory(Box::new(report(1, 0, 0, 0))),
        Error::InvalidDevice {
            input: "x".into(),
            reason: "y".into(),
        },
        Error::BackendNotCompiled {
            device: Device::wgpu(0),
            feature: "wgpu",
        },
        Error::BackendUnavailable {
            device: Device::wgpu(0),
            reason: "y".into(),
        },
        Error::Driver {
            device: Device::cpu(),
            op: "x",
            message: "y".into(),
        },
        Error::Io {
            path: "x".into(),
            source: std::io::Error::other("y"),
        },
        Error::Format {
            path: "x".into(),
            format: "y",
            reason: "z".into(),
        },
    ];
    let mut names: Vec<&str> = errors.iter().map(Error::kind_name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), errors.len(), "kind names must be distinct: {names:?}");
    let mut kinds: Vec<ErrorKind> = errors.iter().map(Error::kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(kinds.len(), errors.len(), "kinds must be distinct: {kinds:?}");
    for error in &errors {
        assert_eq!(error.kind().name(), error.kind_name());
        assert_eq!(error.kind().to_string(), error.kind_name());
    }
    assert_eq!(errors[6].kind(), ErrorKind::SizeOverflow);
    assert_eq!(errors[6].kind_name(), "size-overflow");
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Error>();
}
