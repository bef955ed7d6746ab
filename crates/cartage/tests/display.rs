//! Ergonomics on every device that opens here: `Display` of values (PyTorch-style, truncated,
//! a counted host sync), `Debug` with the values of small tensors, `DType: FromStr`, typed
//! views of host staging buffers, and the device queries of `DeviceExt`.

mod common;

use std::sync::{Mutex, MutexGuard};

use cartage::prelude::*;
use cartage::runtime::{DeviceExt, device_capabilities, device_info};
use cartage::{ErrorKind, Op, PageableBuffer, UnaryOp};

/// Held by every test that reads values, so that the host-sync count of one is not disturbed
/// by another running at the same time.
static READS: Mutex<()> = Mutex::new(());

fn reads() -> MutexGuard<'static, ()> {
    READS.lock().unwrap_or_else(|p| p.into_inner())
}

fn devices(test: &str) -> Vec<Device> {
    let mut devices = vec![Device::cpu()];
    devices.extend(common::second_device(test));
    devices
}

#[test]
fn display_prints_values_like_pytorch() -> Result<()> {
    let _reads = reads();
    for device in devices("display") {
        let x = Tensor::from_slice(&[1.0f32, -2.5, 3.0, 40.0], &[2, 2], &device)?;
        assert_eq!(
            x.to_string(),
            format!("tensor([[ 1.0000, -2.5000],\n        [ 3.0000, 40.0000]], dtype=f32, device={device})")
        );
        // A strided view prints its logical order.
        assert_eq!(
            x.t()?.to_string(),
            format!("tensor([[ 1.0000,  3.0000],\n        [-2.5000, 40.0000]], dtype=f32, device={device})")
        );
        let scalar = Tensor::full(&[], 0.5, DType::F64, &device)?;
        assert_eq!(
            scalar.to_string(),
            format!("tensor(0.5000, dtype=f64, device={device})")
        );
        let ints = Tensor::from_slice(&[7i64, -12, 0], &[3], &device)?;
        assert_eq!(
            ints.to_string(),
            format!("tensor([  7, -12,   0], dtype=i64, device={device})")
        );
        let flags = Tensor::from_slice(&[true, false], &[2], &device)?;
        assert_eq!(
            flags.to_string(),
            format!("tensor([ true, false], dtype=bool, device={device})")
        );
        let empty = Tensor::zeros(&[0, 3], DType::F32, &device)?;
        assert_eq!(
            empty.to_string(),
            format!("tensor([], size=[0, 3], dtype=f32, device={device})")
        );
        let special = Tensor::from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0], &[4], &device)?;
        assert_eq!(
            special.to_string(),
            format!("tensor([   nan,    inf,   -inf, 1.0000], dtype=f32, device={device})")
        );
        // Magnitudes far apart switch to scientific notation.
        let wide = Tensor::from_slice(&[1e-5f32, 1.0, 3e9], &[3], &device)?;
        let text = wide.to_string();
        assert!(text.contains("1.0000e-5") && text.contains("3.0000e9"), "{text}");
        // Rank 3: a blank line between matrices, rows indented under their bracket.
        let cube = Tensor::arange(0.0, 8.0, 1.0, DType::I32, &device)?.reshape(&[2, 2, 2])?;
        assert_eq!(
            cube.to_string(),
            format!(
                "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], dtype=i32, device={device})"
            )
        );
    }
    Ok(())
}

#[test]
fn display_truncates_large_tensors_and_counts_one_sync() -> Result<()> {
    let _reads = reads();
    for device in devices("display_truncates") {
        let x = Tensor::arange(0.0, 2000.0, 1.0, DType::I64, &device)?.reshape(&[40, 50])?;
        cartage::reset_stats();
        let text = x.to_string();
        let stats = cartage::stats();
        assert_eq!(stats.host_syncs, 1, "one read of the summary: {stats:?}");
        let lines: Vec<&str> = text.lines().collect();
        // 3 head rows, the `...` row, 3 tail rows.
        assert_eq!(lines.len(), 7, "{text}");
        assert_eq!(lines[0], "tensor([[   0,    1,    2,  ...,   47,   48,   49],");
        assert_eq!(lines[3].trim(), "...,");
        assert_eq!(
            lines[6],
            format!("        [1950, 1951, 1952,  ..., 1997, 1998, 1999]], dtype=i64, device={device})")
        );
        // At the threshold nothing is cut.
        let full = Tensor::arange(0.0, 1000.0, 1.0, DType::F32, &device)?;
        let text = full.to_string();
        assert!(!text.contains("..."), "1000 elements print whole");
        assert!(text.contains("999.0000"));
        let long = Tensor::arange(0.0, 1001.0, 1.0, DType::F32, &device)?;
        assert!(
            long.to_string()
                .starts_with("tensor([   0.0000,    1.0000,    2.0000,  ...,  998.0000")
        );
    }
    Ok(())
}

#[test]
fn debug_shows_values_of_small_tensors_only() -> Result<()> {
    let _reads = reads();
    for device in devices("debug") {
        let small = Tensor::from_slice(&[1.0f32, 2.0], &[2], &device)?;
        let text = format!("{small:?}");
        assert!(text.starts_with(&format!("Tensor([2], f32, {device}, from ")), "{text}");
        assert!(text.contains("display.rs"), "the origin is the creating line: {text}");
        assert!(text.ends_with(", values=[1.0000, 2.0000])"), "{text}");
        let sixteen = Tensor::zeros(&[4, 4], DType::I32, &device)?;
        assert!(format!("{sixteen:?}").contains("values=[[0, 0, 0, 0], [0, 0, 0, 0],"));
        let big = Tensor::zeros(&[17], DType::F32, &device)?;
        let text = format!("{big:?}");
        assert!(!text.contains("values"), "{text}");
        assert!(text.ends_with(')'));
    }
    Ok(())
}

#[test]
fn dtype_parses_from_names() {
    assert_eq!("f32".parse::<DType>().ok(), Some(DType::F32));
    assert_eq!("float32".parse::<DType>().ok(), Some(DType::F32));
    assert_eq!("BFloat16".parse::<DType>().ok(), Some(DType::BF16));
    assert_eq!("torch.long".parse::<DType>().ok(), Some(DType::I64));
    for dtype in DType::ALL {
        assert_eq!(dtype.to_string().parse::<DType>().ok(), Some(dtype));
    }
    let err = "float128".parse::<DType>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let message = err.to_string();
    for name in ["float128", "f32", "bfloat16", "i64", "bool"] {
        assert!(message.contains(name), "{message}");
    }
}

#[test]
fn staging_buffers_have_checked_typed_views() -> Result<()> {
    let _reads = reads();
    let mut buffer = PageableBuffer::new(24)?;
    buffer.as_mut_slice_of::<f64>()?.copy_from_slice(&[1.5, -2.0, 8.0]);
    assert_eq!(buffer.as_slice_of::<f64>()?, &[1.5, -2.0, 8.0]);
    assert_eq!(&buffer.as_slice()[..8], &1.5f64.to_le_bytes());
    assert_eq!(buffer.as_slice_of::<u32>()?.len(), 6);
    let err = buffer.as_slice_of::<[u8; 5]>().map(<[_]>::len).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("24 bytes"), "{err}");
    // A misaligned view is refused, never undefined behaviour: a buffer is 8-byte aligned, so
    // a 16-byte-aligned type fits exactly when its address does.
    let buffer = PageableBuffer::new(32)?;
    let wide = buffer.as_slice_of::<u128>();
    let aligned = (buffer.as_slice().as_ptr() as usize).is_multiple_of(std::mem::align_of::<u128>());
    match wide {
        Ok(values) => assert!(aligned && values.len() == 2),
        Err(e) => assert!(!aligned && e.to_string().contains("not aligned to 16 bytes"), "{e}"),
    }
    for device in devices("typed_views") {
        let mut staging = cartage::alloc_staging(&device, 16)?;
        staging.as_mut_slice_of::<f32>()?.copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let x = Tensor::zeros(&[4], DType::F32, &device)?;
        x.copy_from_pinned_async(&staging)?.wait()?;
        assert_eq!(x.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
    }
    Ok(())
}

#[test]
fn devices_describe_themselves() -> Result<()> {
    let _reads = reads();
    for device in devices("device_info") {
        let info = device.info()?;
        assert_eq!(info.device, device);
        assert!(!info.name.is_empty());
        assert_eq!(device_info(&device)?, info);
        let caps = device.capabilities()?;
        assert!(caps.max_buffer_bytes > 0);
        assert!(caps.supports(Op::Matmul, DType::F32));
        assert!(device.supports(Op::Unary(UnaryOp::Exp), DType::F32)?);
        assert!(!device.supports(Op::Matmul, DType::Bool)?);
        assert_eq!(device_capabilities(&device)?.len(), caps.len());
    }
    let absent = Device::cuda(63);
    assert!(absent.info().is_err());
    Ok(())
}
