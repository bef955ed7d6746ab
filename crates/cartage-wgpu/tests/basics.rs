//! First checks of the wgpu backend on whatever adapter is `wgpu:0`: round trips, fills,
//! element-wise arithmetic, casts and packed dtypes.

mod common;

use cartage_core::{Backend, BinaryOp, Kernel, Scalar};
use common::{backend, download, empty, upload};
use half::{bf16, f16};

#[test]
fn write_read_round_trip_at_odd_offsets() {
    let Some(b) = backend("write_read_round_trip_at_odd_offsets") else {
        return;
    };
    let alloc = b.alloc(64, std::panic::Location::caller()).unwrap();
    let data: Vec<u8> = (1..=64).collect();
    b.write(alloc.slice(), &data).unwrap();
    let patch = [200u8, 201, 202];
    b.write(alloc.slice().slice(5, 3).unwrap(), &patch).unwrap();
    let mut back = vec![0u8; 64];
    b.read(alloc.slice(), &mut back).unwrap();
    let mut expected = data.clone();
    expected[5..8].copy_from_slice(&patch);
    assert_eq!(back, expected);
    let mut part = vec![0u8; 7];
    b.read(alloc.slice().slice(3, 7).unwrap(), &mut part).unwrap();
    assert_eq!(part, expected[3..10]);
    b.free(alloc);
}

#[test]
fn fill_add_and_packed_outputs() {
    let Some(b) = backend("fill_add_and_packed_outputs") else {
        return;
    };
    let (_a, x) = upload(&b, &[1.0f32, 2.0, 3.0, 4.0, 5.0], &[5]);
    let (_c, y) = upload(&b, &[10.0f32, 20.0, 30.0, 40.0, 50.0], &[5]);
    let (_o, out) = empty::<f32>(&b, &[5]);
    b.launch(&Kernel::Binary {
        op: BinaryOp::Add,
        lhs: x.clone(),
        rhs: y,
        out: out.clone(),
    })
    .unwrap();
    assert_eq!(download::<f32>(&b, &out), vec![11.0, 22.0, 33.0, 44.0, 55.0]);
    let (_u, u) = empty::<u8>(&b, &[7]);
    b.launch(&Kernel::Fill {
        out: u.clone(),
        value: Scalar::Int(300),
    })
    .unwrap();
    assert_eq!(download::<u8>(&b, &u), vec![44u8; 7]);
    let (_h, h) = empty::<f16>(&b, &[5]);
    b.launch(&Kernel::Cast {
        input: x.clone(),
        out: h.clone(),
    })
    .unwrap();
    assert_eq!(
        download::<f16>(&b, &h),
        [1.0f32, 2.0, 3.0, 4.0, 5.0].map(f16::from_f32).to_vec()
    );
    let (_g, g) = empty::<bf16>(&b, &[5]);
    b.launch(&Kernel::Cast {
        input: x,
        out: g.clone(),
    })
    .unwrap();
    assert_eq!(
        download::<bf16>(&b, &g),
        [1.0f32, 2.0, 3.0, 4.0, 5.0].map(bf16::from_f32).to_vec()
    );
}
