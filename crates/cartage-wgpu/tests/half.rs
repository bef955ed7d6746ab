//! f16 and bf16 element-wise kernels four elements at a time: f16 through the adapter's `f16`
//! type (where it has SHADER_F16) and through packed words, bf16 through packed words. Every
//! path must give the bits of the f32 result rounded once (ties to even, overflow to infinity,
//! subnormals kept), the same bits as the one-element-at-a-time kernels.

mod common;

use cartage_core::{Backend, BinaryOp, DType, DeviceBuffer, Kernel, Layout, TensorArg, UnaryOp};
use common::{backend, device};
use half::{bf16, f16};

/// f32 values whose f16/bf16 roundings and sums cover the edge cases.
fn edge_values(n: usize) -> Vec<f32> {
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.5,
        65504.0,
        -65504.0,
        60000.0,
        6.0e-8,
        -6.0e-8,
        3.0e-5,
        1.0e-40,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0 + 1.0 / 1024.0,
        2049.0,
        3.0e38,
        -7.25,
    ];
    (0..n)
        .map(|i| {
            if i % 3 == 0 {
                specials[(i / 3) % specials.len()]
            } else {
                ((i as f32) * 0.731).sin() * 10f32.powi((i % 11) as i32 - 5)
            }
        })
        .collect()
}

/// The 2-byte bits of `x` in `dtype`.
fn bits(dtype: DType, x: f32) -> u16 {
    match dtype {
        DType::F16 => f16::from_f32(x).to_bits(),
        _ => bf16::from_f32(x).to_bits(),
    }
}

fn value(dtype: DType, b: u16) -> f32 {
    match dtype {
        DType::F16 => f16::from_bits(b).to_f32(),
        _ => bf16::from_bits(b).to_f32(),
    }
}

fn to_device(b: &std::sync::Arc<cartage_wgpu::WgpuBackend>, halves: &[u16]) -> DeviceBuffer {
    let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
    let buffer = DeviceBuffer::new(&device(b), bytes.len()).unwrap();
    buffer.write(0, &bytes).unwrap();
    buffer
}

fn from_device(buffer: &DeviceBuffer, offset_elements: usize, n: usize) -> Vec<u16> {
    let mut bytes = vec![0u8; 2 * n];
    buffer.read(2 * offset_elements, &mut bytes).unwrap();
    bytes.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
}

/// True for a nonzero f32 below the smallest normal.
fn f32_subnormal(x: f32) -> bool {
    x != 0.0 && x.abs() < f32::MIN_POSITIVE
}

/// Equal bits, or both NaN.
fn same(dtype: DType, a: u16, b: u16) -> bool {
    a == b || (value(dtype, a).is_nan() && value(dtype, b).is_nan())
}

fn arg(buffer: &DeviceBuffer, layout: Layout, dtype: DType) -> TensorArg {
    buffer.arg(layout, dtype)
}

/// Run `kernel` made from (lhs, rhs, out) on `n` elements starting at element `at` of three
/// fresh buffers; the output's bits.
fn run_binary(
    b: &std::sync::Arc<cartage_wgpu::WgpuBackend>,
    dtype: DType,
    op: BinaryOp,
    lhs: &[u16],
    rhs: &[u16],
    at: usize,
    broadcast_rhs: bool,
) -> Vec<u16> {
    let n = lhs.len() - at;
    let (l, r) = (to_device(b, lhs), to_device(b, rhs));
    let out = DeviceBuffer::new(&device(b), 2 * lhs.len()).unwrap();
    let range = Layout::from_parts(&[n], &[1], at).unwrap();
    let rhs_layout = if broadcast_rhs {
        Layout::from_parts(&[n], &[0], at).unwrap()
    } else {
        range.clone()
    };
    let kernel = Kernel::Binary {
        op,
        lhs: arg(&l, range.clone(), dtype),
        rhs: arg(&r, rhs_layout, dtype),
        out: arg(&out, range, dtype),
    };
    // SAFETY: every operand lies in a buffer alive until after the read below.
    unsafe { b.launch(&kernel) }.unwrap();
    from_device(&out, at, n)
}

fn run_unary(
    b: &std::sync::Arc<cartage_wgpu::WgpuBackend>,
    dtype: DType,
    op: UnaryOp,
    input: &[u16],
    at: usize,
) -> Vec<u16> {
    let n = input.len() - at;
    let x = to_device(b, input);
    let out = DeviceBuffer::new(&device(b), 2 * input.len()).unwrap();
    let range = Layout::from_parts(&[n], &[1], at).unwrap();
    let kernel = Kernel::Unary {
        op,
        input: arg(&x, range.clone(), dtype),
        out: arg(&out, range, dtype),
    };
    // SAFETY: as above.
    unsafe { b.launch(&kernel) }.unwrap();
    from_device(&out, at, n)
}

/// The f16 modes to test: native (where the adapter has SHADER_F16) and packed.
fn modes(b: &cartage_wgpu::WgpuBackend) -> Vec<bool> {
    let mut modes = vec![false];
    if b.features().contains(wgpu::Features::SHADER_F16) {
        modes.push(true);
    }
    modes
}

#[test]
fn half_binary_ops_round_once_on_every_path() {
    let Some(b) = backend("half_binary_ops_round_once_on_every_path") else {
        return;
    };
    let n = 4096;
    let a = edge_values(n);
    let c: Vec<f32> = edge_values(n + 7)[7..].to_vec();
    for native in modes(&b) {
        assert_eq!(b.set_native_f16(native), native);
        for dtype in [DType::F16, DType::BF16] {
            let (ha, hc): (Vec<u16>, Vec<u16>) = (
                a.iter().map(|&x| bits(dtype, x)).collect(),
                c.iter().map(|&x| bits(dtype, x)).collect(),
            );
            for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Maximum] {
                let f = |x: f32, y: f32| match op {
                    BinaryOp::Add => x + y,
                    BinaryOp::Sub => x - y,
                    BinaryOp::Mul => x * y,
                    _ => {
                        if x.is_nan() || y.is_nan() {
                            f32::NAN
                        } else {
                            x.max(y)
                        }
                    }
                };
                // Aligned (four at a time), then offset by one element (one at a time), then
                // with a broadcast right operand.
                for (at, broadcast) in [(0, false), (1, false), (0, true)] {
                    let got = run_binary(&b, dtype, op, &ha, &hc, at, broadcast);
                    for (i, &g) in got.iter().enumerate() {
                        let j = i + at;
                        let y = if broadcast { hc[at] } else { hc[j] };
                        let want = bits(dtype, f(value(dtype, ha[j]), value(dtype, y)));
                        if dtype == DType::BF16 && [ha[j], y, want].iter().any(|&h| f32_subnormal(value(dtype, h))) {
                            // bf16 shares f32's subnormals, which f32 arithmetic may flush to
                            // zero on a GPU (NVIDIA's Vulkan driver does), on every path alike.
                            continue;
                        }
                        assert!(
                            same(dtype, g, want),
                            "{dtype:?} {op:?} native={native} at={at} broadcast={broadcast} element {j}: {:?} op {:?} gave {:#06x}, want {want:#06x}",
                            value(dtype, ha[j]),
                            value(dtype, y),
                            g
                        );
                    }
                }
            }
        }
    }
    b.set_native_f16(true);
}

#[test]
fn half_unary_ops_agree_between_the_vector_and_scalar_kernels() {
    let Some(b) = backend("half_unary_ops_agree_between_the_vector_and_scalar_kernels") else {
        return;
    };
    let n = 4097;
    let x = edge_values(n);
    for native in modes(&b) {
        b.set_native_f16(native);
        for dtype in [DType::F16, DType::BF16] {
            let hx: Vec<u16> = x.iter().map(|&v| bits(dtype, v)).collect();
            for op in [
                UnaryOp::Neg,
                UnaryOp::Abs,
                UnaryOp::Relu,
                UnaryOp::Exp,
                UnaryOp::Sqrt,
                UnaryOp::Tanh,
            ] {
                // 4096 elements from 0 take the vector kernel, 4096 from 1 the scalar one.
                let vector = run_unary(&b, dtype, op, &hx[..4096], 0);
                let shifted: Vec<u16> = std::iter::once(0).chain(hx[..4096].iter().copied()).collect();
                let scalar = run_unary(&b, dtype, op, &shifted, 1);
                // Exact ops agree bit for bit; the others may differ by the f32 function's last
                // bit (one compiler fuses differently in vector code), so by one unit once rounded.
                let exact = matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu);
                for i in 0..4096 {
                    let (v, w) = (value(dtype, vector[i]), value(dtype, scalar[i]));
                    let near = !exact && v.is_finite() && w.is_finite() && vector[i].abs_diff(scalar[i]) <= 1;
                    assert!(
                        same(dtype, vector[i], scalar[i]) || near,
                        "{dtype:?} {op:?} native={native} element {i} ({:?}): vector {:#06x}, scalar {:#06x}",
                        value(dtype, hx[i]),
                        vector[i],
                        scalar[i]
                    );
                }
                if matches!(op, UnaryOp::Neg | UnaryOp::Abs) {
                    for i in 0..4096 {
                        let v = value(dtype, hx[i]);
                        if dtype == DType::BF16 && f32_subnormal(v) {
                            continue; // may be flushed, as above
                        }
                        let want = bits(dtype, if op == UnaryOp::Neg { -v } else { v.abs() });
                        assert!(same(dtype, vector[i], want), "{dtype:?} {op:?} element {i}");
                    }
                }
            }
        }
    }
    b.set_native_f16(true);
}

/// `[1, m, k] × [1, k, n]` in `dtype` with the right operand stored as given (`b_transposed`:
/// B is held as [n, k] and viewed transposed, which takes the one-element-at-a-time reads).
fn run_matmul(
    b: &std::sync::Arc<cartage_wgpu::WgpuBackend>,
    dtype: DType,
    a: &[u16],
    bm: &[u16],
    (m, k, n): (usize, usize, usize),
    b_transposed: bool,
) -> Vec<u16> {
    let (la, lb) = (to_device(b, a), to_device(b, bm));
    let out = DeviceBuffer::new(&device(b), 2 * m * n).unwrap();
    let b_layout = if b_transposed {
        Layout::from_parts(&[1, k, n], &[n * k, 1, k], 0).unwrap()
    } else {
        Layout::contiguous(&[1, k, n]).unwrap()
    };
    let kernel = Kernel::Matmul {
        lhs: arg(&la, Layout::contiguous(&[1, m, k]).unwrap(), dtype),
        rhs: arg(&lb, b_layout, dtype),
        out: arg(&out, Layout::contiguous(&[1, m, n]).unwrap(), dtype),
    };
    // SAFETY: as above.
    unsafe { b.launch(&kernel) }.unwrap();
    from_device(&out, 0, m * n)
}

#[test]
fn half_matmul_reads_four_at_a_time_with_the_same_bits_as_scalar_reads() {
    let Some(b) = backend("half_matmul_reads_four_at_a_time_with_the_same_bits_as_scalar_reads") else {
        return;
    };
    let (m, k, n) = (37, 64, 52);
    let av: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.37).sin() * 2.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| ((i as f32) * 0.11).cos()).collect();
    for native in modes(&b) {
        b.set_native_f16(native);
        for dtype in [DType::F16, DType::BF16] {
            let ha: Vec<u16> = av.iter().map(|&x| bits(dtype, x)).collect();
            let hb: Vec<u16> = bv.iter().map(|&x| bits(dtype, x)).collect();
            // B as [n, k] for the transposed view.
            let hbt: Vec<u16> = (0..n * k).map(|i| hb[(i % k) * n + i / k]).collect();
            let fast = run_matmul(&b, dtype, &ha, &hb, (m, k, n), false);
            let slow = run_matmul(&b, dtype, &ha, &hbt, (m, k, n), true);
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|p| f64::from(value(dtype, ha[i * k + p])) * f64::from(value(dtype, hb[p * n + j])))
                        .sum();
                    let got = value(dtype, fast[i * n + j]);
                    let ulp = if dtype == DType::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
                    assert!(
                        (f64::from(got) - exact).abs() <= exact.abs() * ulp + 1e-3,
                        "{dtype:?} native={native} C[{i},{j}] = {got}, want {exact}"
                    );
                    assert_eq!(fast[i * n + j], slow[i * n + j], "{dtype:?} native={native} C[{i},{j}]");
                }
            }
        }
    }
    b.set_native_f16(true);
}

#[test]
fn f16_matmul_agrees_on_cooperative_matrices_and_tiles() {
    let Some(b) = backend("f16_matmul_agrees_on_cooperative_matrices_and_tiles") else {
        return;
    };
    // Two batches of [128, 96] × [96, 192]: every size a multiple of the cooperative block.
    let (batch, m, k, n) = (2, 128, 96, 192);
    let av: Vec<u16> = (0..batch * m * k)
        .map(|i| f16::from_f32(((i as f32) * 0.013).sin()).to_bits())
        .collect();
    let bv: Vec<u16> = (0..batch * k * n)
        .map(|i| f16::from_f32(((i as f32) * 0.029).cos()).to_bits())
        .collect();
    let (la, lb) = (to_device(&b, &av), to_device(&b, &bv));
    let run = |coop: bool| -> Vec<u16> {
        assert_eq!(b.set_cooperative_matrices(coop), coop && b.has_cooperative_matrices());
        let out = DeviceBuffer::new(&device(&b), 2 * batch * m * n).unwrap();
        let kernel = Kernel::Matmul {
            lhs: arg(&la, Layout::contiguous(&[batch, m, k]).unwrap(), DType::F16),
            rhs: arg(&lb, Layout::contiguous(&[batch, k, n]).unwrap(), DType::F16),
            out: arg(&out, Layout::contiguous(&[batch, m, n]).unwrap(), DType::F16),
        };
        // SAFETY: every operand lies in a buffer alive until after the read below.
        unsafe { b.launch(&kernel) }.unwrap();
        from_device(&out, 0, batch * m * n)
    };
    let tiled = run(false);
    let coop = run(true);
    eprintln!(
        "f16 matmul paths on {}: tiled, and {}",
        b.adapter_info().name,
        if b.has_cooperative_matrices() {
            "cooperative matrices"
        } else {
            "no cooperative matrices (tiled again)"
        }
    );
    for z in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|p| {
                        f64::from(f16::from_bits(av[(z * m + i) * k + p]).to_f32())
                            * f64::from(f16::from_bits(bv[(z * k + p) * n + j]).to_f32())
                    })
                    .sum();
                let at = (z * m + i) * n + j;
                for (path, got) in [("tiled", &tiled), ("cooperative", &coop)] {
                    let v = f64::from(f16::from_bits(got[at]).to_f32());
                    assert!(
                        (v - exact).abs() <= exact.abs() / 512.0 + 2e-3,
                        "{path}: C[{z},{i},{j}] = {v}, want {exact}"
                    );
                }
            }
        }
    }
    b.set_cooperative_matrices(true);
}

#[test]
fn half_copies_move_the_bits_as_they_are() {
    let Some(b) = backend("half_copies_move_the_bits_as_they_are") else {
        return;
    };
    // Every 16-bit pattern, NaN payloads and subnormals included.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for native in modes(&b) {
        b.set_native_f16(native);
        for dtype in [DType::F16, DType::BF16] {
            let src = to_device(&b, &all);
            let out = DeviceBuffer::new(&device(&b), 2 * all.len()).unwrap();
            let whole = Layout::contiguous(&[all.len()]).unwrap();
            let kernel = Kernel::Copy {
                input: arg(&src, whole.clone(), dtype),
                out: arg(&out, whole, dtype),
            };
            // SAFETY: both operands lie in buffers alive until after the read below.
            unsafe { b.launch(&kernel) }.unwrap();
            assert!(
                from_device(&out, 0, all.len()) == all,
                "{dtype:?} native={native}: a copy changed bits"
            );
        }
    }
    b.set_native_f16(true);
}
