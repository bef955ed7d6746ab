//! criterion benches of cartage's kernel families on every compiled-in backend, one group per
//! device (`<backend>/<device-name>`), one bench per `<op>_<dtype>_<size>`. Each sample is timed
//! on the device's clock and read after a synchronisation.
//!
//! `cargo bench -p cartage-benches` (CPU); add `--features wgpu` or `--features cuda`.

use std::time::Duration;

use cartage::{BinaryOp, CompareOp, DType, Op, ReduceOp, Result, Tensor, UnaryOp};
use cartage_benches::{BenchDevice, case_id, devices};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};

/// Elements of the elementwise and reduction inputs.
const NUMEL: usize = 1 << 20;

fn random(shape: &[usize], dtype: DType, seed: u64, d: &BenchDevice) -> Result<Tensor> {
    Tensor::randn(shape, DType::F32, seed, &d.device)?.to_dtype(dtype)
}

/// Register one bench: `work` runs once per iteration on `d`.
fn bench(
    group: &mut BenchmarkGroup<'_, WallTime>,
    d: &BenchDevice,
    (op, dtype, size): (&str, DType, usize),
    needs: Op,
    setup: impl FnOnce() -> Result<Box<dyn FnMut() -> Result<()>>>,
) {
    let id = case_id(op, dtype, size);
    if !d.supports(needs, dtype, &id) {
        return;
    }
    let mut work = match setup() {
        Ok(work) => work,
        Err(e) => {
            println!("SKIP {}/{id}: {e}", d.group());
            return;
        }
    };
    group.bench_function(id, |b| b.iter_custom(|iters| d.time(iters, &mut work)));
}

fn creation(group: &mut BenchmarkGroup<'_, WallTime>, d: &BenchDevice) {
    let dev = d.device;
    bench(group, d, ("fill", DType::F32, NUMEL), Op::Fill, || {
        Ok(Box::new(move || {
            Tensor::full(&[NUMEL], 1.5, DType::F32, &dev).map(drop)
        }))
    });
    bench(group, d, ("rand", DType::F32, NUMEL), Op::RandomUniform, || {
        Ok(Box::new(move || Tensor::rand(&[NUMEL], DType::F32, 7, &dev).map(drop)))
    });
    bench(
        group,
        d,
        ("cast-to-f16", DType::F32, NUMEL),
        Op::Cast(DType::F16),
        || {
            let x = random(&[NUMEL], DType::F32, 1, d)?;
            Ok(Box::new(move || x.to_dtype(DType::F16).map(drop)))
        },
    );
    bench(group, d, ("copy", DType::F32, NUMEL), Op::Copy, || {
        let x = random(&[NUMEL], DType::F32, 1, d)?;
        let out = Tensor::empty(&[NUMEL], DType::F32, &dev)?;
        Ok(Box::new(move || out.copy_from(&x)))
    });
}

fn elementwise(group: &mut BenchmarkGroup<'_, WallTime>, d: &BenchDevice) {
    for (op, name) in [(UnaryOp::Exp, "exp"), (UnaryOp::Relu, "relu"), (UnaryOp::Gelu, "gelu")] {
        bench(group, d, (name, DType::F32, NUMEL), Op::Unary(op), || {
            let x = random(&[NUMEL], DType::F32, 1, d)?;
            Ok(Box::new(move || {
                match op {
                    UnaryOp::Exp => x.exp(),
                    UnaryOp::Relu => x.relu(),
                    _ => x.gelu(),
                }
                .map(drop)
            }))
        });
    }
    for dtype in [DType::F32, DType::F16] {
        bench(group, d, ("add", dtype, NUMEL), Op::Binary(BinaryOp::Add), || {
            let (x, y) = (random(&[NUMEL], dtype, 1, d)?, random(&[NUMEL], dtype, 2, d)?);
            Ok(Box::new(move || x.add(&y).map(drop)))
        });
    }
    bench(
        group,
        d,
        ("mul-broadcast", DType::F32, NUMEL),
        Op::Binary(BinaryOp::Mul),
        || {
            let x = random(&[1024, NUMEL / 1024], DType::F32, 1, d)?;
            let row = random(&[NUMEL / 1024], DType::F32, 2, d)?;
            Ok(Box::new(move || x.mul(&row).map(drop)))
        },
    );
    bench(group, d, ("lt", DType::F32, NUMEL), Op::Compare(CompareOp::Lt), || {
        let (x, y) = (random(&[NUMEL], DType::F32, 1, d)?, random(&[NUMEL], DType::F32, 2, d)?);
        Ok(Box::new(move || x.lt(&y).map(drop)))
    });
    bench(group, d, ("where", DType::F32, NUMEL), Op::Where, || {
        let (x, y) = (random(&[NUMEL], DType::F32, 1, d)?, random(&[NUMEL], DType::F32, 2, d)?);
        let cond = x.lt(&y)?;
        Ok(Box::new(move || Tensor::where_cond(&cond, &x, &y).map(drop)))
    });
}

fn reductions(group: &mut BenchmarkGroup<'_, WallTime>, d: &BenchDevice) {
    let side = 1024;
    bench(
        group,
        d,
        ("sum-all", DType::F32, NUMEL),
        Op::Reduce(ReduceOp::Sum),
        || {
            let x = random(&[NUMEL], DType::F32, 1, d)?;
            Ok(Box::new(move || x.sum_all().map(drop)))
        },
    );
    bench(
        group,
        d,
        ("sum-rows", DType::F32, NUMEL),
        Op::Reduce(ReduceOp::Sum),
        || {
            let x = random(&[side, side], DType::F32, 1, d)?;
            Ok(Box::new(move || x.sum(&[1], false).map(drop)))
        },
    );
    bench(
        group,
        d,
        ("sum-cols", DType::F32, NUMEL),
        Op::Reduce(ReduceOp::Sum),
        || {
            let x = random(&[side, side], DType::F32, 1, d)?;
            Ok(Box::new(move || x.sum(&[0], false).map(drop)))
        },
    );
    bench(
        group,
        d,
        ("argmax-rows", DType::F32, NUMEL),
        Op::Reduce(ReduceOp::ArgMax),
        || {
            let x = random(&[side, side], DType::F32, 1, d)?;
            Ok(Box::new(move || x.argmax(1, false).map(drop)))
        },
    );
    bench(group, d, ("softmax-rows", DType::F32, NUMEL), Op::Softmax, || {
        let x = random(&[side, side], DType::F32, 1, d)?;
        Ok(Box::new(move || x.softmax(1).map(drop)))
    });
}

fn matmuls(group: &mut BenchmarkGroup<'_, WallTime>, d: &BenchDevice) {
    for (dtype, n) in [
        (DType::F32, 128),
        (DType::F32, 1024),
        (DType::F16, 1024),
        (DType::BF16, 1024),
    ] {
        bench(group, d, ("matmul", dtype, n), Op::Matmul, || {
            let (a, b) = (random(&[n, n], dtype, 1, d)?, random(&[n, n], dtype, 2, d)?);
            Ok(Box::new(move || a.matmul(&b).map(drop)))
        });
    }
    bench(group, d, ("matmul-batched-8x8", DType::F32, 1000), Op::Matmul, || {
        let (a, b) = (
            random(&[1000, 8, 8], DType::F32, 1, d)?,
            random(&[1000, 8, 8], DType::F32, 2, d)?,
        );
        Ok(Box::new(move || a.matmul(&b).map(drop)))
    });
    bench(group, d, ("matmul-transposed", DType::F32, 1024), Op::Matmul, || {
        let (a, b) = (
            random(&[1024, 1024], DType::F32, 1, d)?,
            random(&[1024, 1024], DType::F32, 2, d)?,
        );
        let bt = b.t()?;
        Ok(Box::new(move || a.matmul(&bt).map(drop)))
    });
}

fn indexing(group: &mut BenchmarkGroup<'_, WallTime>, d: &BenchDevice) {
    let (rows, cols) = (4096, 256);
    bench(
        group,
        d,
        ("index-select", DType::F32, rows * cols),
        Op::IndexSelect,
        || {
            let table = random(&[rows, cols], DType::F32, 1, d)?;
            let index = Tensor::from_vec((0..rows as i64).rev().collect::<Vec<_>>(), &[rows], &d.device)?;
            Ok(Box::new(move || table.index_select(0, &index).map(drop)))
        },
    );
    bench(group, d, ("gather", DType::F32, rows * cols), Op::Gather, || {
        let table = random(&[rows, cols], DType::F32, 1, d)?;
        let index = Tensor::from_vec(
            (0..(rows * cols) as i64)
                .map(|i| (i * 7) % cols as i64)
                .collect::<Vec<_>>(),
            &[rows, cols],
            &d.device,
        )?;
        Ok(Box::new(move || table.gather(1, &index).map(drop)))
    });
}

fn transfers(group: &mut BenchmarkGroup<'_, WallTime>, d: &BenchDevice) {
    let len = 4 << 20;
    let host: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let dev = d.device;
    bench(group, d, ("h2d", DType::F32, len * 4), Op::Fill, || {
        Ok(Box::new(move || Tensor::from_slice(&host, &[len], &dev).map(drop)))
    });
    bench(group, d, ("d2h", DType::F32, len * 4), Op::Fill, || {
        let x = Tensor::zeros(&[len], DType::F32, &dev)?;
        Ok(Box::new(move || x.to_vec::<f32>().map(drop)))
    });
}

fn kernels(c: &mut Criterion) {
    for d in devices() {
        let mut group = c.benchmark_group(d.group());
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
        creation(&mut group, &d);
        elementwise(&mut group, &d);
        reductions(&mut group, &d);
        matmuls(&mut group, &d);
        indexing(&mut group, &d);
        transfers(&mut group, &d);
        group.finish();
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
