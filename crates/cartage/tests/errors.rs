//! The frontend's typed errors: device mismatch naming both devices and both operands' origins
//! (R16), dtype mismatch without promotion, float indices refused (R27), `item` on a non-scalar,
//! a host read with the wrong element type. Each is an `Error` value, never a panic (R28).

mod common;

use cartage::prelude::*;
use cartage::{Error, Site};

fn site_line(site: Site) -> u32 {
    site.line()
}

#[test]
fn device_mismatch_names_both_devices_and_both_origins() -> Result<()> {
    let Some(other) = common::second_device("device_mismatch_names_both_devices_and_both_origins") else {
        return Ok(());
    };
    let cpu = Device::cpu();
    let line_a = line!() + 1;
    let a = Tensor::ones(&[2, 3], DType::F32, &cpu)?;
    let line_b = line!() + 1;
    let b = Tensor::ones(&[2, 3], DType::F32, &other)?;
    let err = a.add(&b).unwrap_err();
    match &err {
        Error::DeviceMismatch {
            op,
            lhs_device,
            lhs_site,
            rhs_device,
            rhs_site,
        } => {
            assert_eq!(*op, "add");
            assert_eq!((*lhs_device, *rhs_device), (cpu, other));
            assert_eq!((site_line(lhs_site), site_line(rhs_site)), (line_a, line_b));
            assert!(lhs_site.file().ends_with("errors.rs"), "{lhs_site}");
        }
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
    let message = err.to_string();
    for needle in [
        "cpu".to_string(),
        other.to_string(),
        format!("errors.rs:{line_a}"),
        format!("errors.rs:{line_b}"),
    ] {
        assert!(message.contains(&needle), "{needle:?} missing from: {message}");
    }

    // A move updates the origin: after `to`, the error points at the move, not the creation.
    let line_moved = line!() + 1;
    let moved = a.to(&other)?;
    let Error::DeviceMismatch { rhs_site, .. } = a.mul(&moved).unwrap_err() else {
        panic!("expected DeviceMismatch");
    };
    assert_eq!(rhs_site.line(), line_moved);
    // Views keep the origin of the data they view.
    let Error::DeviceMismatch { lhs_site, .. } = a.t()?.matmul(&b).unwrap_err() else {
        panic!("expected DeviceMismatch");
    };
    assert_eq!(lhs_site.line(), line_a);
    // Every op family checks: comparisons, where, gather, copy_from.
    assert!(matches!(a.lt(&b), Err(Error::DeviceMismatch { op: "lt", .. })));
    let cond = a.gt(&a)?;
    assert!(matches!(
        Tensor::where_cond(&cond, &a, &b),
        Err(Error::DeviceMismatch { op: "where", .. })
    ));
    let index = Tensor::zeros(&[2, 3], DType::I64, &other)?;
    assert!(matches!(
        a.gather(0, &index),
        Err(Error::DeviceMismatch { op: "gather", .. })
    ));
    assert!(matches!(a.copy_from(&b), Err(Error::DeviceMismatch { .. })));
    Ok(())
}

#[test]
fn dtype_mismatch_is_an_error_not_a_promotion() -> Result<()> {
    let d = Device::cpu();
    let line_a = line!() + 1;
    let a = Tensor::ones(&[4], DType::F32, &d)?;
    let b = Tensor::ones(&[4], DType::F64, &d)?;
    match a.add(&b).unwrap_err() {
        Error::DTypeMismatch {
            op, lhs, rhs, lhs_site, ..
        } => {
            assert_eq!((op, lhs, rhs), ("add", DType::F32, DType::F64));
            assert_eq!(lhs_site.line(), line_a);
        }
        other => panic!("expected DTypeMismatch, got {other:?}"),
    }
    assert!(matches!(a.matmul(&b), Err(Error::DTypeMismatch { op: "matmul", .. })));
    assert!(matches!(a.eq(&b), Err(Error::DTypeMismatch { .. })));
    let message = a.sub(&b).unwrap_err().to_string();
    assert!(
        message.contains("f32") && message.contains("f64") && message.contains("to_dtype"),
        "{message}"
    );
    // A host read with another element type is a typed error too.
    assert!(matches!(
        a.to_vec::<f64>(),
        Err(Error::DTypeMismatch { op: "to_vec", .. })
    ));
    assert!(matches!(
        a.sum_all()?.item::<i32>(),
        Err(Error::DTypeMismatch { op: "item", .. })
    ));
    // Ops that need floats refuse integers with WrongDType.
    let i = Tensor::arange(0.0, 4.0, 1.0, DType::I32, &d)?;
    assert!(matches!(i.mean_all(), Err(Error::WrongDType { op: "mean", .. })));
    assert!(matches!(i.exp(), Err(Error::WrongDType { op: "exp", .. })));
    assert!(matches!(i.softmax(0), Err(Error::WrongDType { .. })));
    let flags = i.gt(&i)?;
    assert!(matches!(flags.add(&flags), Err(Error::WrongDType { op: "add", .. })));
    assert!(matches!(
        Tensor::rand(&[3], DType::I64, 1, &d),
        Err(Error::WrongDType { .. })
    ));
    Ok(())
}

#[test]
fn float_indices_are_refused() -> Result<()> {
    let d = Device::cpu();
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &d)?.reshape(&[2, 3])?;
    let float_index = Tensor::zeros(&[3], DType::F32, &d)?;
    for result in [
        x.index_select(1, &float_index),
        x.gather(0, &float_index.reshape(&[1, 3])?),
    ] {
        match result.unwrap_err() {
            Error::WrongDType { dtype, expected, .. } => {
                assert_eq!(dtype, DType::F32);
                assert!(expected.contains("i64"), "{expected}");
            }
            other => panic!("expected WrongDType, got {other:?}"),
        }
    }
    let cond = Tensor::zeros(&[2, 3], DType::F32, &d)?;
    assert!(matches!(
        Tensor::where_cond(&cond, &x, &x),
        Err(Error::WrongDType { op: "where", .. })
    ));
    Ok(())
}

#[test]
fn item_needs_exactly_one_element() -> Result<()> {
    let d = Device::cpu();
    let x = Tensor::full(&[2, 2], 3.5, DType::F32, &d)?;
    match x.item::<f32>().unwrap_err() {
        Error::NotAScalar { shape, numel } => assert_eq!((shape, numel), (vec![2, 2], 4)),
        other => panic!("expected NotAScalar, got {other:?}"),
    }
    assert_eq!(x.narrow(0, 1, 1)?.narrow(1, 1, 1)?.item::<f32>()?, 3.5);
    assert_eq!(x.sum_all()?.item::<f32>()?, 14.0);
    assert!(matches!(
        Tensor::zeros(&[0], DType::F32, &d)?.item::<f32>(),
        Err(Error::NotAScalar { numel: 0, .. })
    ));
    Ok(())
}

#[test]
fn shape_and_argument_problems_are_errors() -> Result<()> {
    let d = Device::cpu();
    let a = Tensor::ones(&[2, 3], DType::F32, &d)?;
    let b = Tensor::ones(&[4], DType::F32, &d)?;
    assert!(matches!(a.add(&b), Err(Error::ShapeMismatch { op: "add", .. })));
    assert!(matches!(a.matmul(&a), Err(Error::ShapeMismatch { op: "matmul", .. })));
    assert!(matches!(a.sum(&[2], false), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(a.transpose(0, 5), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(a.reshape(&[5]), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(a.narrow(1, 2, 2), Err(Error::InvalidArgument { .. })));
    assert!(matches!(a.sum(&[0, 0], false), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        Tensor::from_slice(&[1.0f32, 2.0], &[3], &d),
        Err(Error::DataLength { len: 2, numel: 3, .. })
    ));
    assert!(matches!(
        Tensor::arange(0.0, 1.0, 0.0, DType::F32, &d),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        Tensor::zeros(&[usize::MAX, 4], DType::F32, &d),
        Err(Error::SizeOverflow { .. })
    ));
    let empty = Tensor::zeros(&[0, 3], DType::F32, &d)?;
    assert!(matches!(empty.max(&[0], false), Err(Error::InvalidArgument { .. })));
    let index = Tensor::from_slice(&[0i64, 7], &[2], &d)?;
    assert!(matches!(a.index_select(1, &index), Err(Error::IndexOutOfRange { .. })));
    Ok(())
}

/// Mixed dtypes are refused (cartage never promotes silently), and the message names the dtype
/// PyTorch would have computed in and the operand to convert.
#[test]
fn mixed_dtypes_name_the_cast_to_write() {
    let cpu = cartage::Device::cpu();
    let cases = [
        (
            cartage::DType::BF16,
            cartage::DType::F32,
            "DType::F32",
            "the left operand",
        ),
        (
            cartage::DType::F32,
            cartage::DType::F64,
            "DType::F64",
            "the left operand",
        ),
        (cartage::DType::F16, cartage::DType::BF16, "DType::F32", "both operands"),
        (
            cartage::DType::F32,
            cartage::DType::I64,
            "DType::F32",
            "the right operand",
        ),
    ];
    for (a, b, cast, which) in cases {
        let x = cartage::Tensor::ones(&[2], a, &cpu).unwrap();
        let y = cartage::Tensor::ones(&[2], b, &cpu).unwrap();
        let err = x.mul(&y).unwrap_err();
        assert!(matches!(err, cartage::Error::DTypeMismatch { .. }), "{a} × {b}: {err}");
        let text = err.to_string();
        assert!(text.contains(cast) && text.contains(which), "{a} × {b}: {text}");
    }
}
