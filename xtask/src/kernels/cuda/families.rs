//! The one-family modes: `ops` (row-wise model ops in GB/s), `strided` (`contiguous()` of
//! permuted views in TB/s), `attention` (fused flash attention in TFLOP/s) and `conv` (cuDNN
//! conv2d in TFLOP/s).

use anyhow::Result;
use cartage_core::{DType, DeviceBuffer, Distribution, Kernel, Layout, MatmulPrecision, NormKind};
use cartage_cuda::CudaBackend;

use super::{Dyn, MIB, alloc_random, device_time, result, tensor, wall_time};

/// Elements per `ops` case: 256 MiB of f32.
const OPS_ELEMENTS: usize = 1 << 26;

/// Class targets in [0, classes) as i64: uniform floats cast down (truncation).
fn alloc_targets(b: &Dyn, rows: usize, classes: usize) -> Result<DeviceBuffer> {
    let uniform = DeviceBuffer::new(b, rows * 4)?;
    Kernel::Random {
        out: tensor(&uniform, &[rows], DType::F32),
        distribution: Distribution::Uniform {
            low: 0.0,
            high: classes as f64 - 0.5,
        },
        seed: 11,
        offset: 0,
    }
    .run(&[&uniform])?;
    let targets = DeviceBuffer::new(b, rows * 8)?;
    Kernel::Cast {
        input: tensor(&uniform, &[rows], DType::F32),
        out: tensor(&targets, &[rows], DType::I64),
    }
    .run(&[&uniform, &targets])?;
    Ok(targets)
}

/// The row-wise model ops on [2^26 / cols, cols] (GB/s of the bytes each must read and write).
pub(super) fn ops(b: &Dyn) -> Result<()> {
    let time = |k: &Kernel, bufs: &[&DeviceBuffer]| device_time(b, 5, 30, || k.run(bufs).expect("op"));
    for dtype in [DType::F32, DType::BF16] {
        let size = dtype.size_in_bytes();
        for cols in [64usize, 256, 1024, 4096, 16384, 32768] {
            let rows = OPS_ELEMENTS / cols;
            let shape = [rows, cols];
            let bytes = (OPS_ELEMENTS * size) as f64;
            let x = alloc_random(b, &shape, dtype, 21)?;
            let out = DeviceBuffer::new(b, OPS_ELEMENTS * size)?;
            for log in [false, true] {
                let k = Kernel::Softmax {
                    input: tensor(&x, &shape, dtype),
                    dim: 1,
                    log,
                    causal: false,
                    out: tensor(&out, &shape, dtype),
                };
                let name = if log { "log_softmax" } else { "softmax" };
                let t = time(&k, &[&x, &out])?;
                result(&format!("{name}_{dtype}_{cols}"), 2.0 * bytes / t / 1e9, "GB/s");
            }
            if cols != 4096 {
                continue;
            }
            let (w, bias) = (
                alloc_random(b, &[cols], dtype, 22)?,
                alloc_random(b, &[cols], dtype, 23)?,
            );
            for kind in [NormKind::Layer, NormKind::Rms] {
                let k = Kernel::Norm {
                    kind,
                    input: tensor(&x, &shape, dtype),
                    weight: Some(tensor(&w, &[cols], dtype)),
                    bias: (kind == NormKind::Layer).then(|| tensor(&bias, &[cols], dtype)),
                    eps: 1e-5,
                    out: tensor(&out, &shape, dtype),
                };
                let t = time(&k, &[&x, &w, &bias, &out])?;
                result(
                    &format!("{}_{dtype}_{cols}", kind.name()),
                    2.0 * bytes / t / 1e9,
                    "GB/s",
                );
            }
            let targets = alloc_targets(b, rows, cols)?;
            let loss = DeviceBuffer::new(b, rows * size)?;
            let k = Kernel::CrossEntropy {
                logits: tensor(&x, &shape, dtype),
                target: tensor(&targets, &[rows], DType::I64),
                ignore_index: -100,
                label_smoothing: 0.0,
                out: tensor(&loss, &[rows], dtype),
            };
            let t = time(&k, &[&x, &targets, &loss])?;
            let moved = bytes + (rows * (8 + size)) as f64;
            result(&format!("cross_entropy_{dtype}_{cols}"), moved / t / 1e9, "GB/s");
        }
    }
    Ok(())
}

/// `strided` mode: `contiguous()` of 1 GiB views (2-D transpose, batched transpose, permute with
/// a contiguous inner dimension) in TB/s of bytes read and written, against a dense copy; and
/// reading 256 MiB back into a fresh vector each time, as `to_vec` does.
pub(super) fn strided(b: &Dyn, cuda: &CudaBackend) -> Result<()> {
    let cases: [(&str, DType, &[usize], &[usize]); 5] = [
        ("copy_dense_f32_1GiB", DType::F32, &[1 << 28], &[0]),
        ("transpose_2d_f32_1GiB", DType::F32, &[16384, 16384], &[1, 0]),
        ("transpose_2d_bf16_1GiB", DType::BF16, &[16384, 32768], &[1, 0]),
        ("permute_021_f32_1GiB", DType::F32, &[64, 2048, 2048], &[0, 2, 1]),
        ("permute_0213_f32_1GiB", DType::F32, &[32, 1024, 128, 64], &[0, 2, 1, 3]),
    ];
    for (case, dtype, shape, perm) in cases {
        let numel: usize = shape.iter().product();
        let bytes = numel * dtype.size_in_bytes();
        let src = DeviceBuffer::new(b, bytes)?;
        let out = DeviceBuffer::new(b, bytes)?;
        let view = Layout::contiguous(shape)?.permute(perm)?;
        let out_shape = view.shape().to_vec();
        let kernel = Kernel::Copy {
            input: src.arg(view, dtype),
            out: tensor(&out, &out_shape, dtype),
        };
        let t = device_time(b, 3, 20, || kernel.run(&[&src, &out]).expect("copy"))?;
        result(case, 2.0 * bytes as f64 / t / 1e12, "TB/s");
    }
    let bytes = 256 * MIB;
    let dev = DeviceBuffer::new(b, bytes)?;
    let before = cuda.transfer_stats();
    let t = wall_time(10, || {
        let mut host = vec![0u8; bytes];
        dev.read(0, &mut host)?;
        std::hint::black_box(&host);
        Ok(())
    })?;
    result("d2h_fresh_vec_256MiB", bytes as f64 / t / 1e9, "GB/s");
    let after = cuda.transfer_stats();
    eprintln!("transfer stats over the fresh-vector reads: before {before:?} after {after:?}");
    Ok(())
}

/// `attention` mode: the fused flash-attention kernels, B·H = 128 and L = S = 1024 (bf16, f16 and
/// f32, head dims 64 and 128, causal and not), in TFLOP/s of `4·B·L·S·E` (half that when causal,
/// the usual count: the masked half is skipped).
pub(super) fn attention(b: &Dyn) -> Result<()> {
    let (batch, seq) = (128usize, 1024usize);
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for head in [64usize, 128] {
            let shape = [batch, seq, head];
            let q = alloc_random(b, &shape, dtype, 31)?;
            let k = alloc_random(b, &shape, dtype, 32)?;
            let v = alloc_random(b, &shape, dtype, 33)?;
            let out = DeviceBuffer::new(b, batch * seq * head * dtype.size_in_bytes())?;
            for causal in [false, true] {
                let kernel = Kernel::Attention {
                    q: tensor(&q, &shape, dtype),
                    k: tensor(&k, &shape, dtype),
                    v: tensor(&v, &shape, dtype),
                    scale: 1.0 / (head as f64).sqrt(),
                    causal,
                    mask: None,
                    out: tensor(&out, &shape, dtype),
                    lse: None,
                };
                let t = device_time(b, 5, 30, || kernel.run(&[&q, &k, &v, &out]).expect("attention"))?;
                let mut flops = 4.0 * (batch * seq * seq * head) as f64;
                if causal {
                    flops /= 2.0;
                }
                let case = format!("attention_{dtype}_d{head}_{}", if causal { "causal" } else { "full" });
                result(&case, flops / t / 1e12, "TFLOP/s");
                result(&format!("{case}_time"), t * 1e3, "ms");
            }
        }
    }
    Ok(())
}

/// `conv` mode: see the module docs. Each row is the median of 50 event-timed launches.
pub(super) fn conv(b: &Dyn) -> Result<()> {
    let (n, c, o, hw, k) = (32usize, 64usize, 64usize, 56usize, 3usize);
    let flops = 2.0 * (n * o * hw * hw * c * k * k) as f64;
    let cases = [
        ("f32_highest", DType::F32, MatmulPrecision::Highest, false),
        ("f32_high", DType::F32, MatmulPrecision::High, false),
        ("bf16", DType::BF16, MatmulPrecision::Highest, false),
        ("f16", DType::F16, MatmulPrecision::Highest, false),
        ("bf16_nhwc_input", DType::BF16, MatmulPrecision::Highest, true),
    ];
    for (name, dtype, precision, nhwc) in cases {
        if !b.capabilities().supports(cartage_core::Op::Conv2d, dtype) {
            eprintln!("conv2d {dtype} is not listed by this backend (is cuDNN on the loader's path?)");
            continue;
        }
        b.set_matmul_precision(precision)?;
        let x = alloc_random(b, &[n, c, hw, hw], dtype, 41)?;
        let w = alloc_random(b, &[o, c, k, k], dtype, 42)?;
        let out = DeviceBuffer::new(b, n * o * hw * hw * dtype.size_in_bytes())?;
        let input = if nhwc {
            // The same buffer seen as [N, C, H, W] over channels-last memory [N, H, W, C].
            x.arg(Layout::contiguous(&[n, hw, hw, c])?.permute(&[0, 3, 1, 2])?, dtype)
        } else {
            tensor(&x, &[n, c, hw, hw], dtype)
        };
        let kernel = Kernel::Conv2d {
            input,
            weight: tensor(&w, &[o, c, k, k], dtype),
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
            out: tensor(&out, &[n, o, hw, hw], dtype),
        };
        let t = device_time(b, 10, 50, || kernel.run(&[&x, &w, &out]).expect("conv2d"))?;
        result(&format!("conv2d_resnet3x3_{name}"), flops / t / 1e12, "TFLOP/s");
        result(&format!("conv2d_resnet3x3_{name}_time"), t * 1e3, "ms");
    }
    b.set_matmul_precision(MatmulPrecision::Highest)?;
    Ok(())
}
