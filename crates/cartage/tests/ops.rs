//! Ops through the frontend against hand-computed values: broadcasting, scalars, comparisons,
//! where, unary functions, reductions, softmax, matmul in every rank combination, gather and
//! index_select, casts and random constructors.

use cartage::prelude::*;

fn cpu() -> Device {
    Device::cpu()
}

fn t(data: &[f32], shape: &[usize]) -> Result<Tensor> {
    Tensor::from_slice(data, shape, &cpu())
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn binary_ops_broadcast_like_numpy() -> Result<()> {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let row = t(&[10.0, 20.0, 30.0], &[3])?;
    let col = t(&[1.0, 2.0], &[2, 1])?;
    close(&a.add(&row)?.to_vec()?, &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    close(&a.sub(&col)?.to_vec()?, &[0.0, 1.0, 2.0, 2.0, 3.0, 4.0]);
    close(&a.mul(&row)?.to_vec()?, &[10.0, 40.0, 90.0, 40.0, 100.0, 180.0]);
    close(&a.div(&col)?.to_vec()?, &[1.0, 2.0, 3.0, 2.0, 2.5, 3.0]);
    close(&col.add(&row)?.to_vec()?, &[11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    close(&a.pow(&col)?.to_vec()?, &[1.0, 2.0, 3.0, 16.0, 25.0, 36.0]);
    let m = t(&[3.0, 0.0, 9.0], &[3])?;
    close(&a.maximum(&m)?.to_vec()?, &[3.0, 2.0, 9.0, 4.0, 5.0, 9.0]);
    close(&a.minimum(&m)?.to_vec()?, &[1.0, 0.0, 3.0, 3.0, 0.0, 6.0]);
    // A strided (transposed) operand is read in place.
    close(&a.t()?.add(&a.t()?)?.to_vec()?, &[2.0, 8.0, 4.0, 10.0, 6.0, 12.0]);
    Ok(())
}

#[test]
fn scalar_ops_and_integers() -> Result<()> {
    let a = t(&[1.0, 2.0, 4.0], &[3])?;
    close(&a.add_scalar(1.5)?.to_vec()?, &[2.5, 3.5, 5.5]);
    close(&a.sub_scalar(1.0)?.to_vec()?, &[0.0, 1.0, 3.0]);
    close(&a.mul_scalar(-2.0)?.to_vec()?, &[-2.0, -4.0, -8.0]);
    close(&a.div_scalar(4.0)?.to_vec()?, &[0.25, 0.5, 1.0]);
    close(&a.pow_scalar(2)?.to_vec()?, &[1.0, 4.0, 16.0]);
    let i = Tensor::arange(-3.0, 4.0, 2.0, DType::I64, &cpu())?;
    assert_eq!(i.to_vec::<i64>()?, vec![-3, -1, 1, 3]);
    assert_eq!(i.mul_scalar(3)?.to_vec::<i64>()?, vec![-9, -3, 3, 9]);
    assert_eq!(i.div_scalar(2)?.to_vec::<i64>()?, vec![-1, 0, 0, 1]);
    assert_eq!(i.abs()?.to_vec::<i64>()?, vec![3, 1, 1, 3]);
    assert_eq!(i.relu()?.to_vec::<i64>()?, vec![0, 0, 1, 3]);
    assert_eq!(i.sum_all()?.item::<i64>()?, 0);
    Ok(())
}

#[test]
fn comparisons_and_where() -> Result<()> {
    let a = t(&[1.0, 5.0, 3.0], &[3])?;
    let b = t(&[2.0, 5.0, 1.0], &[3])?;
    assert_eq!(a.lt(&b)?.to_vec::<bool>()?, vec![true, false, false]);
    assert_eq!(a.le(&b)?.to_vec::<bool>()?, vec![true, true, false]);
    assert_eq!(a.eq(&b)?.to_vec::<bool>()?, vec![false, true, false]);
    assert_eq!(a.ne(&b)?.to_vec::<bool>()?, vec![true, false, true]);
    assert_eq!(a.gt(&b)?.to_vec::<bool>()?, vec![false, false, true]);
    assert_eq!(a.ge(&b)?.to_vec::<bool>()?, vec![false, true, true]);
    let zero = Tensor::zeros(&[], DType::F32, &cpu())?;
    let picked = Tensor::where_cond(&a.gt(&b)?, &a, &zero)?;
    close(&picked.to_vec()?, &[0.0, 0.0, 3.0]);
    let cond = Tensor::from_slice(&[true, false], &[2, 1], &cpu())?;
    let grid = Tensor::where_cond(&cond, &a, &b.neg()?)?;
    assert_eq!(grid.shape(), &[2, 3]);
    close(&grid.to_vec()?, &[1.0, 5.0, 3.0, -2.0, -5.0, -1.0]);
    Ok(())
}

#[test]
fn unary_functions() -> Result<()> {
    let x = t(&[-1.0, 0.0, 1.0, 4.0], &[4])?;
    close(&x.neg()?.to_vec()?, &[1.0, 0.0, -1.0, -4.0]);
    close(&x.abs()?.to_vec()?, &[1.0, 0.0, 1.0, 4.0]);
    close(&x.relu()?.to_vec()?, &[0.0, 0.0, 1.0, 4.0]);
    close(&x.exp()?.to_vec()?, &[(-1f32).exp(), 1.0, 1f32.exp(), 4f32.exp()]);
    close(&x.abs()?.sqrt()?.to_vec()?, &[1.0, 0.0, 1.0, 2.0]);
    close(&x.tanh()?.to_vec()?, &[(-1f32).tanh(), 0.0, 1f32.tanh(), 4f32.tanh()]);
    close(&x.sigmoid()?.to_vec()?, &[0.268_941_43, 0.5, 0.731_058_6, 0.982_013_8]);
    close(&x.gelu()?.to_vec()?, &[-0.158_655_26, 0.0, 0.841_344_7, 3.999_873]);
    let e = t(&[1.0, std::f32::consts::E], &[2])?;
    close(&e.log()?.to_vec()?, &[0.0, 1.0]);
    Ok(())
}

#[test]
fn reductions_and_softmax() -> Result<()> {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 9.0], &[2, 3])?;
    close(&a.sum(&[0], false)?.to_vec()?, &[5.0, 7.0, 12.0]);
    let kept = a.sum(&[-1], true)?;
    assert_eq!(kept.shape(), &[2, 1]);
    close(&kept.to_vec()?, &[6.0, 18.0]);
    close(&a.mean(&[1], false)?.to_vec()?, &[2.0, 6.0]);
    close(&a.max(&[0], false)?.to_vec()?, &[4.0, 5.0, 9.0]);
    close(&a.min(&[1], false)?.to_vec()?, &[1.0, 4.0]);
    assert_eq!(a.argmax(1, false)?.to_vec::<i64>()?, vec![2, 2]);
    assert_eq!(a.argmin(0, true)?.shape(), &[1, 3]);
    assert_eq!(a.argmin(0, false)?.to_vec::<i64>()?, vec![0, 0, 0]);
    let sum_all = a.sum_all()?;
    assert_eq!(sum_all.shape(), &[] as &[usize]);
    assert_eq!(sum_all.item::<f32>()?, 24.0);
    assert_eq!(a.mean_all()?.item::<f32>()?, 4.0);
    assert_eq!(a.max_all()?.item::<f32>()?, 9.0);
    assert_eq!(a.min_all()?.item::<f32>()?, 1.0);
    assert_eq!(a.sum(&[0, 1], false)?.item::<f32>()?, 24.0);
    let lse = a.logsumexp(&[1], false)?.to_vec::<f32>()?;
    let expected = |r: &[f32]| r.iter().map(|v| v.exp()).sum::<f32>().ln();
    close(&lse, &[expected(&[1.0, 2.0, 3.0]), expected(&[4.0, 5.0, 9.0])]);
    let s = a.softmax(1)?.to_vec::<f32>()?;
    let z: f32 = [1f32, 2.0, 3.0].iter().map(|v| v.exp()).sum();
    close(&s[..3], &[1f32.exp() / z, 2f32.exp() / z, 3f32.exp() / z]);
    let ls = a.log_softmax(-1)?.to_vec::<f32>()?;
    close(&ls[..3], &[1.0 - z.ln(), 2.0 - z.ln(), 3.0 - z.ln()]);
    // A reduction over a strided view reads it in place.
    close(&a.t()?.sum(&[1], false)?.to_vec()?, &[5.0, 7.0, 12.0]);
    Ok(())
}

#[test]
fn matmul_in_every_rank_combination() -> Result<()> {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let b = t(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
    let c = a.matmul(&b)?;
    assert_eq!(c.shape(), &[2, 2]);
    close(&c.to_vec()?, &[4.0, 5.0, 10.0, 11.0]);
    // Transposed operands are read in place.
    close(&b.t()?.matmul(&a.t()?)?.to_vec()?, &[4.0, 10.0, 5.0, 11.0]);
    let v = t(&[1.0, 1.0, 1.0], &[3])?;
    let dot = v.matmul(&v)?;
    assert_eq!(dot.shape(), &[] as &[usize]);
    assert_eq!(dot.item::<f32>()?, 3.0);
    let mv = a.matmul(&v)?;
    assert_eq!(mv.shape(), &[2]);
    close(&mv.to_vec()?, &[6.0, 15.0]);
    let w = t(&[1.0, 2.0], &[2])?;
    let vm = w.matmul(&a)?;
    assert_eq!(vm.shape(), &[3]);
    close(&vm.to_vec()?, &[9.0, 12.0, 15.0]);
    // Batched with broadcast batch dimensions: [2, 1, 2, 3] × [3, 3, 2] → [2, 3, 2, 2].
    let batch_a = Tensor::stack_for_test(&[&a, &a.mul_scalar(2.0)?], &[2, 1, 2, 3])?;
    let batch_b = Tensor::stack_for_test(&[&b, &b, &b.mul_scalar(-1.0)?], &[3, 3, 2])?;
    let out = batch_a.matmul(&batch_b)?;
    assert_eq!(out.shape(), &[2, 3, 2, 2]);
    let values = out.to_vec::<f32>()?;
    close(&values[..4], &[4.0, 5.0, 10.0, 11.0]);
    close(&values[8..12], &[-4.0, -5.0, -10.0, -11.0]);
    close(&values[12..16], &[8.0, 10.0, 20.0, 22.0]);
    // A 2-D operand against a batch broadcasts too; an empty inner dimension gives zeros.
    assert_eq!(a.matmul(&batch_b)?.shape(), &[3, 2, 2]);
    let empty = Tensor::zeros(&[2, 0], DType::F32, &cpu())?.matmul(&Tensor::zeros(&[0, 3], DType::F32, &cpu())?)?;
    assert_eq!(empty.to_vec::<f32>()?, vec![0.0; 6]);
    Ok(())
}

#[test]
fn gather_and_index_select() -> Result<()> {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let rows = Tensor::from_slice(&[1i64, 0, 1], &[3], &cpu())?;
    let selected = a.index_select(0, &rows)?;
    assert_eq!(selected.shape(), &[3, 3]);
    close(&selected.to_vec()?, &[4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let cols = Tensor::from_slice(&[2i32, 0], &[2], &cpu())?;
    close(&a.index_select(1, &cols)?.to_vec()?, &[3.0, 1.0, 6.0, 4.0]);
    let index = Tensor::from_slice(&[2i64, 1, 0, 0], &[2, 2], &cpu())?;
    let g = a.gather(1, &index)?;
    assert_eq!(g.shape(), &[2, 2]);
    close(&g.to_vec()?, &[3.0, 2.0, 4.0, 4.0]);
    Ok(())
}

#[test]
fn casts_and_constructors() -> Result<()> {
    let d = cpu();
    let x = t(&[-1.7, 0.2, 2.9], &[3])?;
    assert_eq!(x.to_dtype(DType::I32)?.to_vec::<i32>()?, vec![-1, 0, 2]);
    assert_eq!(x.to_dtype(DType::Bool)?.to_vec::<bool>()?, vec![true, true, true]);
    assert_eq!(
        x.to_dtype(DType::F16)?.to_vec_f64()?[2],
        half::f16::from_f32(2.9).to_f64()
    );
    assert_eq!(Tensor::full(&[2], 7, DType::U8, &d)?.to_vec::<u8>()?, vec![7, 7]);
    assert_eq!(Tensor::ones(&[2, 2], DType::BF16, &d)?.to_vec_f64()?, vec![1.0; 4]);
    assert_eq!(Tensor::empty(&[3], DType::I64, &d)?.to_vec::<i64>()?, vec![0; 3]);
    close(
        &Tensor::arange(1.0, 0.0, -0.25, DType::F32, &d)?.to_vec()?,
        &[1.0, 0.75, 0.5, 0.25],
    );
    assert_eq!(Tensor::arange(0.0, -1.0, 1.0, DType::F32, &d)?.numel(), 0);
    let r = Tensor::rand(&[1000], DType::F32, 42, &d)?.to_vec::<f32>()?;
    assert!(r.iter().all(|v| (0.0..1.0).contains(v)));
    assert_eq!(
        r,
        Tensor::rand(&[1000], DType::F32, 42, &d)?.to_vec::<f32>()?,
        "one seed, one stream"
    );
    assert_ne!(r, Tensor::rand(&[1000], DType::F32, 43, &d)?.to_vec::<f32>()?);
    assert_eq!(r[0], cartage_core_uniform(42, 0));
    let u = Tensor::rand_uniform(&[1000], -2.0, -1.0, DType::F64, 1, &d)?.to_vec::<f64>()?;
    assert!(u.iter().all(|v| (-2.0..-1.0).contains(v)));
    let n = Tensor::randn(&[20000], DType::F32, 5, &d)?;
    let mean = n.mean_all()?.item::<f32>()?;
    let var = n.sub_scalar(mean)?.pow_scalar(2)?.mean_all()?.item::<f32>()?;
    assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "{mean} {var}");
    Ok(())
}

/// The Philox stream's first uniform draw, as core computes it on the host.
fn cartage_core_uniform(seed: u64, index: u64) -> f32 {
    let w = philox(seed, index);
    (w >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Philox4x32-10, first output word (a second, independent implementation for the test).
fn philox(seed: u64, index: u64) -> u32 {
    let (mut c, mut k) = (
        [index as u32, (index >> 32) as u32, 0u32, 0u32],
        [seed as u32, (seed >> 32) as u32],
    );
    for _ in 0..10 {
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [k[0].wrapping_add(0x9E37_79B9), k[1].wrapping_add(0xBB67_AE85)];
    }
    c[0]
}

trait StackForTest: Sized {
    fn stack_for_test(parts: &[&Tensor], shape: &[usize]) -> Result<Tensor>;
}

impl StackForTest for Tensor {
    /// Concatenate parts' elements (through the host: test data only) into `shape`.
    fn stack_for_test(parts: &[&Tensor], shape: &[usize]) -> Result<Tensor> {
        let mut data = Vec::new();
        for p in parts {
            data.extend(p.to_vec::<f32>()?);
        }
        Tensor::from_vec(data, shape, &parts[0].device())
    }
}
