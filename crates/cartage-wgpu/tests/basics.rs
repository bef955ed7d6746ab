//! First checks of the wgpu backend on whatever adapter is `wgpu:0`: round trips, fills,
//! element-wise arithmetic, casts and packed dtypes.

mod common;

use cartage_core::{BinaryOp, DeviceBuffer, Kernel, Scalar};
use common::{backend, device, download, empty, upload};
use half::{bf16, f16};

#[test]
fn write_read_round_trip_at_odd_offsets() {
    let Some(b) = backend("write_read_round_trip_at_odd_offsets") else {
        return;
    };
    let buffer = DeviceBuffer::new(&device(&b), 64).unwrap();
    let data: Vec<u8> = (1..=64).collect();
    buffer.write(0, &data).unwrap();
    let patch = [200u8, 201, 202];
    buffer.write(5, &patch).unwrap();
    let mut back = vec![0u8; 64];
    buffer.read(0, &mut back).unwrap();
    let mut expected = data.clone();
    expected[5..8].copy_from_slice(&patch);
    assert_eq!(back, expected);
    let mut part = vec![0u8; 7];
    buffer.read(3, &mut part).unwrap();
    assert_eq!(part, expected[3..10]);
    // Past the end is an error, never a write into a neighbour.
    assert!(buffer.write(62, &patch).is_err());
    assert!(buffer.read(60, &mut part).is_err());
}

#[test]
fn fill_add_and_packed_outputs() {
    let Some(b) = backend("fill_add_and_packed_outputs") else {
        return;
    };
    let (xb, x) = upload(&b, &[1.0f32, 2.0, 3.0, 4.0, 5.0], &[5]);
    let (yb, y) = upload(&b, &[10.0f32, 20.0, 30.0, 40.0, 50.0], &[5]);
    let (ob, out) = empty::<f32>(&b, &[5]);
    Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: y,
        out: out.clone(),
    }
    .run(&[&xb, &yb, &ob])
    .unwrap();
    assert_eq!(download::<f32>(&ob, &out), vec![11.0, 22.0, 33.0, 44.0, 55.0]);
    let (ub, u) = empty::<u8>(&b, &[7]);
    Kernel::Fill {
        out: u.clone(),
        value: Scalar::Int(300),
    }
    .run(&[&ub])
    .unwrap();
    assert_eq!(download::<u8>(&ub, &u), vec![44u8; 7]);
    let (hb, h) = empty::<f16>(&b, &[5]);
    Kernel::Cast {
        input: x.clone(),
        out: h.clone(),
    }
    .run(&[&xb, &hb])
    .unwrap();
    assert_eq!(
        download::<f16>(&hb, &h),
        [1.0f32, 2.0, 3.0, 4.0, 5.0].map(f16::from_f32).to_vec()
    );
    let (gb, g) = empty::<bf16>(&b, &[5]);
    Kernel::Cast {
        input: x,
        out: g.clone(),
    }
    .run(&[&xb, &gb])
    .unwrap();
    assert_eq!(
        download::<bf16>(&gb, &g),
        [1.0f32, 2.0, 3.0, 4.0, 5.0].map(bf16::from_f32).to_vec()
    );
}
