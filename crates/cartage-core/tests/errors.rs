//! Every `Error` variant's message names what a user needs to find the cause (ARTICLE R16, R26,
//! R28): both devices and both sites of a mismatch, the feature that enables a missing backend,
//! the ordinal a bare `cuda` lacks, dtype + device + op of an unsupported kernel, and so on.

use std::panic::Location;

use cartage_core::{DType, Device, Error, LiveBlock, OomReport};

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
    let error = Error::SizeOverflow {
        shape: vec![usize::MAX, 2],
        dtype: DType::F64,
    };
    assert_names(&error, &[&format!("[{}, 2]", usize::MAX), "f64", "overflow"]);
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
    assert_names(
        &Error::invalid("narrow", "range 2..5 is outside"),
        &["`narrow`", "range 2..5"],
    );
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
    assert!(matches!(error, Error::Unsupported { dtype: DType::F64, .. }));
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
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Error>();
}
