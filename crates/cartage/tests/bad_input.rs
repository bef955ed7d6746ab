//! Bad input through the public API never panics: constructors with huge, overflowing or
//! mismatched shapes, out-of-range and negative dimensions, mismatched shapes and dtypes for
//! every op family, bad view arguments, float, negative and out-of-range indices, matmul rank
//! and batch problems, reductions of empty tensors, host reads of the wrong type or size, bad
//! device strings and devices that are not there. Each case runs under `catch_unwind` and must
//! return a typed [`Error`] (of the stated [`ErrorKind`] where one is stated) whose message
//! prints. The cases run on the CPU and again on every other device that opens here.
//!
//! Nothing relies on debug-build overflow checks: every overflowing size is a case that must
//! come back as an error, which only holds if the library checks it explicitly.

mod common;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

use cartage::memory::{MemoryTracker, Optimizer, TrainingEstimate, tensor_bytes};
use cartage::prelude::*;
use cartage::{DeviceKind, Error, ErrorKind, MatmulPrecision};

/// The fewest distinct cases a device must run, so that the suite cannot shrink silently.
const MIN_CASES: usize = 150;

/// A broadcast view this long is cheap to make but cannot be materialised anywhere.
const HUGE: usize = 1 << 40;

/// Runs cases on one device and collects every failure, so that one run lists all of them.
struct Cases {
    device: Device,
    names: BTreeSet<String>,
    failures: Vec<String>,
}

/// What a case must return.
#[derive(Clone, Copy)]
enum Expect {
    /// An error of this kind.
    Kind(ErrorKind),
    /// An error of one of these kinds (it depends on the build or the device).
    AnyOf(&'static [ErrorKind]),
}

use Expect::{AnyOf, Kind};

/// The kinds a device that is not compiled in, or not present, comes back as.
const NO_SUCH_DEVICE: &[ErrorKind] = &[ErrorKind::BackendNotCompiled, ErrorKind::BackendUnavailable];

impl Cases {
    fn new(device: Device) -> Self {
        Cases {
            device,
            names: BTreeSet::new(),
            failures: Vec::new(),
        }
    }

    /// Run `f` under `catch_unwind` and check it returns an error as `expect` says, whose
    /// message also prints without panicking. Returns the error for further checks.
    fn case<T: Debug>(&mut self, name: &str, expect: Expect, f: impl FnOnce() -> Result<T>) -> Option<Error> {
        assert!(self.names.insert(name.to_string()), "case `{name}` is listed twice");
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let result = f();
            result.map_err(|e| {
                let message = e.to_string();
                (e, message)
            })
        }));
        let failure = match outcome {
            Err(payload) => {
                let what = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                format!("panicked: {what}")
            }
            Ok(Ok(value)) => format!("returned Ok({value:?}) instead of an error"),
            Ok(Err((error, message))) => {
                let kind = error.kind();
                let fits = match expect {
                    Kind(k) => kind == k,
                    AnyOf(kinds) => kinds.contains(&kind),
                };
                if fits && !message.is_empty() {
                    return Some(error);
                }
                format!("wrong error kind {kind}: {message}")
            }
        };
        self.failures.push(format!("{} / {name}: {failure}", self.device));
        None
    }

    /// [`Cases::case`] that also checks the message contains each of `needles`.
    fn case_naming<T: Debug>(&mut self, name: &str, expect: Expect, needles: &[&str], f: impl FnOnce() -> Result<T>) {
        if let Some(error) = self.case(name, expect, f) {
            let message = error.to_string();
            for needle in needles {
                if !message.contains(needle) {
                    self.failures
                        .push(format!("{} / {name}: `{needle}` missing from: {message}", self.device));
                }
            }
        }
    }
}

/// Tensors the cases start from, on one device.
struct Fixtures {
    device: Device,
    /// f32 [2, 3].
    a: Tensor,
    /// f32 [4].
    v4: Tensor,
    /// f64 [2, 3].
    a64: Tensor,
    /// i64 [2, 3].
    ai: Tensor,
    /// bool [2, 3].
    flags: Tensor,
    /// f32 [] (one element).
    scalar: Tensor,
    /// f32 [0, 3].
    empty: Tensor,
    /// f32 [3, 2, 2] (a batch of matrices).
    batch: Tensor,
}

impl Fixtures {
    fn new(device: &Device) -> Result<Self> {
        let a = Tensor::arange(0.0, 6.0, 1.0, DType::F32, device)?.reshape(&[2, 3])?;
        Ok(Fixtures {
            device: *device,
            v4: Tensor::ones(&[4], DType::F32, device)?,
            a64: a.to_dtype(DType::F64)?,
            ai: a.to_dtype(DType::I64)?,
            flags: a.gt(&Tensor::full(&[2, 3], 2.0, DType::F32, device)?)?,
            scalar: Tensor::full(&[], 1.5, DType::F32, device)?,
            empty: Tensor::zeros(&[0, 3], DType::F32, device)?,
            batch: Tensor::ones(&[3, 2, 2], DType::F32, device)?,
            a,
        })
    }

    /// An i64 index tensor of `values` with `shape`.
    fn index(&self, values: &[i64], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_slice(values, shape, &self.device)
    }

    /// The scalar broadcast to `shape` (a view: no memory).
    fn wide(&self, shape: &[usize]) -> Result<Tensor> {
        self.scalar.broadcast_to(shape)
    }
}

fn constructors(c: &mut Cases, d: &Device) {
    use ErrorKind::*;
    let overflow = Kind(SizeOverflow);
    c.case_naming("zeros [MAX, 2]", overflow, &["f32", "elements"], || {
        Tensor::zeros(&[usize::MAX, 2], DType::F32, d)
    });
    c.case_naming(
        "zeros [2^62] f64",
        overflow,
        &["f64", "4611686018427387904 elements"],
        || Tensor::zeros(&[1 << 62], DType::F64, d),
    );
    c.case_naming("zeros [2^31]^3", overflow, &["bf16"], || {
        Tensor::zeros(&[1 << 31, 1 << 31, 1 << 31], DType::BF16, d)
    });
    c.case("zeros [2^20]^4", overflow, || {
        Tensor::zeros(&[1 << 20; 4], DType::I32, d)
    });
    c.case_naming("ones [MAX] u8", overflow, &["u8"], || {
        Tensor::ones(&[usize::MAX], DType::U8, d)
    });
    c.case("ones [2^61] bool", overflow, || {
        Tensor::ones(&[1 << 61], DType::Bool, d)
    });
    c.case("full [2^40, 2^40]", overflow, || {
        Tensor::full(&[HUGE, HUGE], 3.0, DType::F32, d)
    });
    c.case("full [MAX, MAX] i64", overflow, || {
        Tensor::full(&[usize::MAX, usize::MAX], 7i64, DType::I64, d)
    });
    c.case("empty [MAX, 3]", overflow, || {
        Tensor::empty(&[usize::MAX, 3], DType::F16, d)
    });
    c.case("rand [MAX, 3]", overflow, || {
        Tensor::rand(&[usize::MAX, 3], DType::F32, 1, d)
    });
    c.case("randn [2^61]", overflow, || Tensor::randn(&[1 << 61], DType::F32, 1, d));
    c.case("rand_uniform [MAX]", overflow, || {
        Tensor::rand_uniform(&[usize::MAX], 0.0, 1.0, DType::F32, 1, d)
    });
    c.case("zeros [2^40] f32 (no memory)", AnyOf(&[OutOfMemory]), || {
        Tensor::zeros(&[HUGE], DType::F32, d)
    });
    c.case("rand i32", Kind(WrongDType), || Tensor::rand(&[3], DType::I32, 1, d));
    c.case("randn bool", Kind(WrongDType), || {
        Tensor::randn(&[3], DType::Bool, 1, d)
    });
    c.case("rand u8", Kind(WrongDType), || Tensor::rand(&[3], DType::U8, 1, d));
    c.case("rand_uniform low > high", Kind(InvalidArgument), || {
        Tensor::rand_uniform(&[3], 2.0, 1.0, DType::F32, 1, d)
    });
    c.case("rand_uniform NaN", Kind(InvalidArgument), || {
        Tensor::rand_uniform(&[3], f64::NAN, 1.0, DType::F32, 1, d)
    });
    c.case("rand_uniform infinite", Kind(InvalidArgument), || {
        Tensor::rand_uniform(&[3], 0.0, f64::INFINITY, DType::F32, 1, d)
    });
    c.case("rand_uniform i64", Kind(WrongDType), || {
        Tensor::rand_uniform(&[3], 0.0, 1.0, DType::I64, 1, d)
    });
    c.case("arange step 0", Kind(InvalidArgument), || {
        Tensor::arange(0.0, 4.0, 0.0, DType::F32, d)
    });
    c.case("arange NaN start", Kind(InvalidArgument), || {
        Tensor::arange(f64::NAN, 4.0, 1.0, DType::F32, d)
    });
    c.case("arange infinite end", Kind(InvalidArgument), || {
        Tensor::arange(0.0, f64::INFINITY, 1.0, DType::F32, d)
    });
    c.case("arange NaN step", Kind(InvalidArgument), || {
        Tensor::arange(0.0, 4.0, f64::NAN, DType::F32, d)
    });
    c.case("arange 1e300 elements", overflow, || {
        Tensor::arange(0.0, 1e300, 1.0, DType::F32, d)
    });
    c.case("arange count beyond a layout", overflow, || {
        Tensor::arange(0.0, 2f64.powi(62), 1.0, DType::F64, d)
    });
    c.case("arange tiny step", overflow, || {
        Tensor::arange(0.0, 1.0, 1e-300, DType::F32, d)
    });
    c.case("from_slice too few", Kind(DataLength), || {
        Tensor::from_slice(&[1.0f32, 2.0], &[3], d)
    });
    c.case("from_slice too many", Kind(DataLength), || {
        Tensor::from_slice(&[1i64, 2, 3, 4], &[3], d)
    });
    c.case("from_slice into []", Kind(DataLength), || {
        Tensor::from_slice(&[1u8, 2], &[], d)
    });
    c.case("from_slice into [0]", Kind(DataLength), || {
        Tensor::from_slice(&[true], &[0], d)
    });
    c.case("from_slice overflowing shape", overflow, || {
        Tensor::from_slice(&[1.0f64], &[usize::MAX, 2], d)
    });
    c.case("from_slice beyond a layout", overflow, || {
        Tensor::from_slice::<f32>(&[], &[1 << 62, 4], d)
    });
    c.case("from_vec mismatched", Kind(DataLength), || {
        Tensor::from_vec(vec![1i32; 5], &[2, 3], d)
    });
    c.case("zeros on cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        Tensor::zeros(&[2], DType::F32, &Device::cuda(97))
    });
    c.case("rand on wgpu:97", AnyOf(NO_SUCH_DEVICE), || {
        Tensor::rand(&[2], DType::F32, 0, &Device::wgpu(97))
    });
    c.case("from_slice on cuda:usize::MAX", AnyOf(NO_SUCH_DEVICE), || {
        Tensor::from_slice(&[1.0f32], &[1], &Device::cuda(usize::MAX))
    });
}

fn device_strings(c: &mut Cases) {
    for text in [
        "",
        "   ",
        "cuda",
        "wgpu",
        "tpu:0",
        "gpu",
        "cpu:1",
        "cpu:99999999999999999999",
        "cuda:99999999999999999999",
        "wgpu:340282366920938463463374607431768211456",
        "cuda:-1",
        "cuda:x",
        "cuda:",
        ":0",
        "cuda:0:1",
        "cuda:1.5",
        "cuda: 1",
        "cpu:+0",
        "wgpu:0x1",
        "cuda:０",
    ] {
        c.case(&format!("parse {text:?}"), Kind(ErrorKind::InvalidDevice), || {
            text.parse::<Device>()
        });
    }
    for text in ["cpu:99999999999999999999", "cuda:-1", "wgpu:x"] {
        c.case_naming(
            &format!("parse {text:?} says not a number"),
            Kind(ErrorKind::InvalidDevice),
            &["not a number"],
            || text.parse::<Device>(),
        );
    }
}

fn views(c: &mut Cases, f: &Fixtures) {
    use ErrorKind::*;
    let a = &f.a;
    c.case("transpose (0, 5)", Kind(DimOutOfRange), || a.transpose(0, 5));
    c.case("transpose (-3, 0)", Kind(DimOutOfRange), || a.transpose(-3, 0));
    c.case("transpose (MIN, 0)", Kind(DimOutOfRange), || a.transpose(isize::MIN, 0));
    c.case("transpose (0, MAX)", Kind(DimOutOfRange), || a.transpose(0, isize::MAX));
    c.case("transpose scalar", Kind(DimOutOfRange), || f.scalar.transpose(0, 0));
    c.case("permute [0, 0]", Kind(InvalidArgument), || a.permute(&[0, 0]));
    c.case("permute [0]", Kind(InvalidArgument), || a.permute(&[0]));
    c.case("permute [0, 1, 2]", Kind(InvalidArgument), || a.permute(&[0, 1, 2]));
    c.case("permute [5, 0]", Kind(InvalidArgument), || a.permute(&[5, 0]));
    c.case("permute [MAX, 0]", Kind(InvalidArgument), || {
        a.permute(&[isize::MAX, 0])
    });
    c.case("permute []", Kind(InvalidArgument), || a.permute(&[]));
    c.case("permute scalar [0]", Kind(InvalidArgument), || f.scalar.permute(&[0]));
    c.case("narrow dim 5", Kind(DimOutOfRange), || a.narrow(5, 0, 1));
    c.case("narrow dim -3", Kind(DimOutOfRange), || a.narrow(-3, 0, 1));
    c.case("narrow dim MIN", Kind(DimOutOfRange), || a.narrow(isize::MIN, 0, 1));
    c.case_naming("narrow start past the end", Kind(InvalidArgument), &["start 4"], || {
        a.narrow(1, 4, 0)
    });
    c.case_naming(
        "narrow start MAX",
        Kind(InvalidArgument),
        &["start 18446744073709551615"],
        || a.narrow(1, usize::MAX, 1),
    );
    c.case_naming(
        "narrow length MAX",
        Kind(InvalidArgument),
        &["start 1", "length 18446744073709551615"],
        || a.narrow(1, 1, usize::MAX),
    );
    c.case("narrow range past the end", Kind(InvalidArgument), || a.narrow(1, 2, 2));
    c.case("narrow scalar", Kind(DimOutOfRange), || f.scalar.narrow(0, 0, 1));
    c.case("narrow empty dim start 1", Kind(InvalidArgument), || {
        f.empty.narrow(0, 1, 0)
    });
    c.case_naming("broadcast_to [MAX]", Kind(SizeOverflow), &["f32"], || {
        f.scalar.broadcast_to(&[usize::MAX])
    });
    c.case("broadcast_to [2^40, 2^40]", Kind(SizeOverflow), || {
        f.scalar.broadcast_to(&[HUGE, HUGE])
    });
    c.case("broadcast_to [MAX, 3] of [2, 3] row", Kind(SizeOverflow), || {
        a.narrow(0, 0, 1)?.broadcast_to(&[usize::MAX, 3])
    });
    c.case("broadcast_to lower rank", Kind(ShapeMismatch), || a.broadcast_to(&[3]));
    c.case("broadcast_to [2, 4]", Kind(ShapeMismatch), || a.broadcast_to(&[2, 4]));
    c.case("broadcast_to []", Kind(ShapeMismatch), || a.broadcast_to(&[]));
    c.case("broadcast_to [0, 3]", Kind(ShapeMismatch), || a.broadcast_to(&[0, 3]));
    c.case("broadcast_to [3, 2, 4]", Kind(ShapeMismatch), || {
        a.broadcast_to(&[3, 2, 4])
    });
    c.case("broadcast empty to [1, 3]", Kind(ShapeMismatch), || {
        f.empty.broadcast_to(&[1, 3])
    });
    c.case("squeeze size 2", Kind(InvalidArgument), || a.squeeze(0));
    c.case("squeeze dim 5", Kind(DimOutOfRange), || a.squeeze(5));
    c.case("squeeze dim -3", Kind(DimOutOfRange), || a.squeeze(-3));
    c.case("squeeze scalar", Kind(DimOutOfRange), || f.scalar.squeeze(0));
    c.case("squeeze empty dim", Kind(InvalidArgument), || f.empty.squeeze(0));
    c.case_naming(
        "unsqueeze 4 on rank 2",
        Kind(DimOutOfRange),
        &["rank 2", "0..=2"],
        || a.unsqueeze(4),
    );
    c.case_naming(
        "unsqueeze 3 on rank 2",
        Kind(DimOutOfRange),
        &["dimension 3", "rank 2"],
        || a.unsqueeze(3),
    );
    c.case("unsqueeze -4 on rank 2", Kind(DimOutOfRange), || a.unsqueeze(-4));
    c.case("unsqueeze MIN", Kind(DimOutOfRange), || a.unsqueeze(isize::MIN));
    c.case("unsqueeze MAX", Kind(DimOutOfRange), || a.unsqueeze(isize::MAX));
    c.case_naming("unsqueeze 2 on a scalar", Kind(DimOutOfRange), &["rank 0"], || {
        f.scalar.unsqueeze(2)
    });
    c.case("reshape [5]", Kind(ShapeMismatch), || a.reshape(&[5]));
    c.case("reshape [0]", Kind(ShapeMismatch), || a.reshape(&[0]));
    c.case("reshape []", Kind(ShapeMismatch), || a.reshape(&[] as &[usize]));
    c.case_naming("reshape [MAX, 2]", Kind(SizeOverflow), &["f32"], || {
        a.reshape(&[usize::MAX, 2])
    });
    c.case("reshape [2^40, 2^40, 0]", Kind(ShapeMismatch), || {
        a.reshape(&[HUGE, HUGE, 0])
    });
    c.case("reshape transposed to [7]", Kind(ShapeMismatch), || {
        a.t()?.reshape(&[7])
    });
    c.case("reshape empty to [1]", Kind(ShapeMismatch), || f.empty.reshape(&[1]));
    c.case("reshape scalar to [2]", Kind(ShapeMismatch), || f.scalar.reshape(&[2]));
}

fn elementwise(c: &mut Cases, f: &Fixtures) {
    use ErrorKind::*;
    type Binary = fn(&Tensor, &Tensor) -> Result<Tensor>;
    let binaries: [(&str, Binary); 13] = [
        ("add", Tensor::add),
        ("sub", Tensor::sub),
        ("mul", Tensor::mul),
        ("div", Tensor::div),
        ("pow", Tensor::pow),
        ("maximum", Tensor::maximum),
        ("minimum", Tensor::minimum),
        ("eq", Tensor::eq),
        ("ne", Tensor::ne),
        ("lt", Tensor::lt),
        ("le", Tensor::le),
        ("gt", Tensor::gt),
        ("ge", Tensor::ge),
    ];
    for (name, op) in binaries {
        c.case(&format!("{name} [2, 3] with [4]"), Kind(ShapeMismatch), || {
            op(&f.a, &f.v4)
        });
        c.case(&format!("{name} f32 with f64"), Kind(DTypeMismatch), || {
            op(&f.a, &f.a64)
        });
        c.case(&format!("{name} f32 with i64"), Kind(DTypeMismatch), || op(&f.ai, &f.a));
        c.case_naming(
            &format!("{name} broadcast beyond a layout"),
            Kind(SizeOverflow),
            &["f32"],
            || op(&f.wide(&[HUGE, 1])?, &f.wide(&[1, HUGE])?),
        );
    }
    for (name, op) in &binaries[..5] {
        c.case(&format!("{name} on bool"), Kind(WrongDType), || op(&f.flags, &f.flags));
    }
    c.case("add broadcast too large for memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE, 1])?.add(&f.wide(&[1, 1 << 10])?)
    });
    type WithScalar = fn(&Tensor, f64) -> Result<Tensor>;
    let scalars: [(&str, WithScalar); 5] = [
        ("add_scalar", |t, v| t.add_scalar(v)),
        ("sub_scalar", |t, v| t.sub_scalar(v)),
        ("mul_scalar", |t, v| t.mul_scalar(v)),
        ("div_scalar", |t, v| t.div_scalar(v)),
        ("pow_scalar", |t, v| t.pow_scalar(v)),
    ];
    for (name, op) in scalars {
        c.case(&format!("{name} on bool"), Kind(WrongDType), || op(&f.flags, 1.0));
        c.case(
            &format!("{name} on a broadcast beyond memory"),
            Kind(OutOfMemory),
            || op(&f.wide(&[HUGE, 1 << 10])?, 2.0),
        );
    }
    type Unary = fn(&Tensor) -> Result<Tensor>;
    let unaries: [(&str, Unary); 6] = [
        ("exp", Tensor::exp),
        ("log", Tensor::log),
        ("sqrt", Tensor::sqrt),
        ("tanh", Tensor::tanh),
        ("sigmoid", Tensor::sigmoid),
        ("gelu", Tensor::gelu),
    ];
    for (name, op) in unaries {
        c.case(&format!("{name} on i64"), Kind(WrongDType), || op(&f.ai));
        c.case(&format!("{name} on bool"), Kind(WrongDType), || op(&f.flags));
    }
    c.case("neg on bool", Kind(WrongDType), || f.flags.neg());
    c.case("where with f32 condition", Kind(WrongDType), || {
        Tensor::where_cond(&f.a, &f.a, &f.a)
    });
    c.case("where with i64 condition", Kind(WrongDType), || {
        Tensor::where_cond(&f.ai, &f.a, &f.a)
    });
    c.case("where branches f32 and f64", Kind(DTypeMismatch), || {
        Tensor::where_cond(&f.flags, &f.a, &f.a64)
    });
    c.case("where condition shape [4]", Kind(ShapeMismatch), || {
        let cond = f.v4.gt(&f.v4)?;
        Tensor::where_cond(&cond, &f.a, &f.a)
    });
    c.case("where branch shape [4]", Kind(ShapeMismatch), || {
        Tensor::where_cond(&f.flags, &f.a, &f.v4)
    });
    c.case("where_cond beyond a layout", Kind(SizeOverflow), || {
        let cond = f.flags.narrow(0, 0, 1)?.narrow(1, 0, 1)?.broadcast_to(&[HUGE, 1])?;
        Tensor::where_cond(&cond, &f.wide(&[1, HUGE])?, &f.scalar)
    });
}

fn reductions(c: &mut Cases, f: &Fixtures) {
    use ErrorKind::*;
    let a = &f.a;
    c.case("sum dims [2]", Kind(DimOutOfRange), || a.sum(&[2], false));
    c.case("sum dims [-3]", Kind(DimOutOfRange), || a.sum(&[-3], false));
    c.case("sum dims [MIN]", Kind(DimOutOfRange), || a.sum(&[isize::MIN], true));
    c.case("sum dims []", Kind(InvalidArgument), || a.sum(&[], false));
    c.case("sum dims [0, 0]", Kind(InvalidArgument), || a.sum(&[0, -2], false));
    c.case("sum of a scalar over dim 0", Kind(DimOutOfRange), || {
        f.scalar.sum(&[0], false)
    });
    c.case("mean on i64", Kind(WrongDType), || f.ai.mean(&[0], false));
    c.case("mean on bool", Kind(WrongDType), || f.flags.mean(&[1], true));
    c.case("mean_all on i64", Kind(WrongDType), || f.ai.mean_all());
    c.case("logsumexp on i64", Kind(WrongDType), || f.ai.logsumexp(&[0], false));
    c.case("max of an empty dimension", Kind(InvalidArgument), || {
        f.empty.max(&[0], false)
    });
    c.case("min of an empty dimension", Kind(InvalidArgument), || {
        f.empty.min(&[0], true)
    });
    c.case("argmax of an empty dimension", Kind(InvalidArgument), || {
        f.empty.argmax(0, false)
    });
    c.case("argmin of an empty dimension", Kind(InvalidArgument), || {
        f.empty.argmin(0, true)
    });
    c.case("max_all of an empty tensor", Kind(InvalidArgument), || {
        f.empty.max_all()
    });
    c.case("min_all of an empty tensor", Kind(InvalidArgument), || {
        f.empty.min_all()
    });
    c.case("max dims [5]", Kind(DimOutOfRange), || a.max(&[5], false));
    c.case("argmax dim 2", Kind(DimOutOfRange), || a.argmax(2, false));
    c.case("argmin dim -3", Kind(DimOutOfRange), || a.argmin(-3, false));
    c.case("softmax dim 2", Kind(DimOutOfRange), || a.softmax(2));
    c.case("softmax dim MIN", Kind(DimOutOfRange), || a.softmax(isize::MIN));
    c.case("softmax on i64", Kind(WrongDType), || f.ai.softmax(0));
    c.case("log_softmax on bool", Kind(WrongDType), || f.flags.log_softmax(1));
    c.case("log_softmax of a scalar", Kind(DimOutOfRange), || {
        f.scalar.log_softmax(0)
    });
    c.case("sum into an output beyond memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE, 1 << 10])?.sum(&[1], false)
    });
    c.case("softmax of a broadcast beyond memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE, 8])?.softmax(1)
    });
}

fn matmul(c: &mut Cases, f: &Fixtures) {
    use ErrorKind::*;
    let a = &f.a;
    c.case("matmul [2, 3] x [2, 3]", Kind(ShapeMismatch), || a.matmul(a));
    c.case("matmul scalar", Kind(ShapeMismatch), || f.scalar.matmul(a));
    c.case("matmul by a scalar", Kind(ShapeMismatch), || a.matmul(&f.scalar));
    c.case("matmul [3] x [4]", Kind(ShapeMismatch), || {
        a.narrow(0, 0, 1)?.reshape(&[3])?.matmul(&f.v4)
    });
    c.case("matmul [4] x [2, 3]", Kind(ShapeMismatch), || f.v4.matmul(a));
    c.case("matmul f32 x f64", Kind(DTypeMismatch), || a.matmul(&f.a64.t()?));
    c.case("matmul i64", Kind(WrongDType), || f.ai.matmul(&f.ai.t()?));
    c.case("matmul bool", Kind(WrongDType), || f.flags.matmul(&f.flags.t()?));
    c.case("matmul batch 3 with batch 2", Kind(ShapeMismatch), || {
        f.batch.matmul(&Tensor::ones(&[2, 2, 2], DType::F32, &f.device)?)
    });
    c.case("matmul batch inner mismatch", Kind(ShapeMismatch), || {
        f.batch.matmul(&a.t()?)
    });
    c.case_naming("matmul overflowing batch", Kind(SizeOverflow), &["f32"], || {
        let lhs = f.wide(&[HUGE, 1, 2, 2])?;
        let rhs = f.wide(&[1, HUGE, 2, 2])?;
        lhs.matmul(&rhs)
    });
    c.case("matmul batch too large for memory", Kind(OutOfMemory), || {
        let lhs = f.wide(&[1 << 30, 1, 2, 2])?;
        let rhs = f.wide(&[1, 1 << 20, 2, 2])?;
        lhs.matmul(&rhs)
    });
    c.case("matmul output too large for memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE, 1])?.matmul(&f.wide(&[1, 1 << 10])?)
    });
    c.case("matmul output beyond a layout", Kind(SizeOverflow), || {
        f.wide(&[1 << 50, 1])?.matmul(&f.wide(&[1, 1 << 50])?)
    });
}

/// Index cases read their result back: a device may report an index out of range at the next
/// synchronisation rather than at the launch.
fn indexing(c: &mut Cases, f: &Fixtures) -> Result<()> {
    use ErrorKind::*;
    let a = &f.a;
    let float_index = Tensor::zeros(&[2], DType::F32, &f.device)?;
    c.case("index_select f32 index", Kind(WrongDType), || {
        a.index_select(1, &float_index)
    });
    c.case("index_select f64 index", Kind(WrongDType), || {
        a.index_select(1, &float_index.to_dtype(DType::F64)?)
    });
    c.case("index_select bool index", Kind(WrongDType), || {
        a.index_select(0, &f.flags.flatten()?)
    });
    c.case("index_select u8 index", Kind(WrongDType), || {
        a.index_select(0, &Tensor::zeros(&[1], DType::U8, &f.device)?)
    });
    c.case("gather f32 index", Kind(WrongDType), || a.gather(0, &a.clone()));
    c.case("gather f16 index", Kind(WrongDType), || {
        a.gather(1, &a.to_dtype(DType::F16)?)
    });
    for (name, values) in [
        ("index 3", vec![0i64, 3]),
        ("index -1", vec![-1]),
        ("index i64::MAX", vec![i64::MAX]),
        ("index i64::MIN", vec![i64::MIN]),
    ] {
        c.case(&format!("index_select {name}"), Kind(IndexOutOfRange), || {
            a.index_select(1, &f.index(&values, &[values.len()])?)?.to_vec_f64()
        });
        c.case(&format!("gather {name}"), Kind(IndexOutOfRange), || {
            a.gather(1, &f.index(&values, &[1, values.len()])?)?.to_vec_f64()
        });
    }
    c.case("index_select i32 -1", Kind(IndexOutOfRange), || {
        a.index_select(0, &Tensor::from_slice(&[-1i32], &[1], &f.device)?)?
            .to_vec_f64()
    });
    c.case("index_select i32 MAX", Kind(IndexOutOfRange), || {
        a.index_select(0, &Tensor::from_slice(&[i32::MAX], &[1], &f.device)?)?
            .to_vec_f64()
    });
    c.case("index_select into an empty dimension", Kind(IndexOutOfRange), || {
        f.empty.index_select(0, &f.index(&[0], &[1])?)?.to_vec_f64()
    });
    c.case("index_select 2-D index", Kind(ShapeMismatch), || {
        a.index_select(0, &f.index(&[0, 1], &[1, 2])?)
    });
    c.case("index_select scalar index", Kind(ShapeMismatch), || {
        a.index_select(0, &f.index(&[0], &[])?)
    });
    c.case("index_select dim 2", Kind(DimOutOfRange), || {
        a.index_select(2, &f.index(&[0], &[1])?)
    });
    c.case("index_select dim MIN", Kind(DimOutOfRange), || {
        a.index_select(isize::MIN, &f.index(&[0], &[1])?)
    });
    c.case("gather rank 1 index on rank 2", Kind(ShapeMismatch), || {
        a.gather(0, &f.index(&[0], &[1])?)
    });
    c.case("gather index wider than the input", Kind(ShapeMismatch), || {
        a.gather(0, &f.index(&[0; 8], &[1, 8])?)
    });
    c.case("gather dim 2", Kind(DimOutOfRange), || {
        a.gather(2, &f.index(&[0], &[1, 1])?)
    });
    c.case("gather dim -3", Kind(DimOutOfRange), || {
        a.gather(-3, &f.index(&[0], &[1, 1])?)
    });
    c.case("gather index on a huge broadcast", Kind(OutOfMemory), || {
        let index = f.index(&[0], &[1, 1])?.broadcast_to(&[HUGE, 1 << 10])?;
        f.wide(&[1, 1 << 10])?.gather(0, &index)
    });
    Ok(())
}

fn host_reads(c: &mut Cases, f: &Fixtures) {
    use ErrorKind::*;
    c.case_naming(
        "to_vec::<f64> on f32",
        Kind(DTypeMismatch),
        &["to_vec_f64", "f32"],
        || f.a.to_vec::<f64>(),
    );
    c.case("to_vec::<i32> on f32", Kind(DTypeMismatch), || f.a.to_vec::<i32>());
    c.case("to_vec::<f32> on i64", Kind(DTypeMismatch), || f.ai.to_vec::<f32>());
    c.case("to_vec::<u8> on bool", Kind(DTypeMismatch), || f.flags.to_vec::<u8>());
    c.case("to_vec::<bool> on f64", Kind(DTypeMismatch), || f.a64.to_vec::<bool>());
    c.case("to_vec of a broadcast beyond memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE])?.to_vec::<f32>()
    });
    // The host's memory is checked before the read (an `InvalidArgument` naming the bytes) and
    // the device's when the strided view is materialised: whichever limit is met first.
    c.case(
        "to_vec_f64 of a broadcast beyond memory",
        AnyOf(&[OutOfMemory, InvalidArgument]),
        || f.wide(&[HUGE, 4])?.to_vec_f64(),
    );
    c.case("item on [2, 3]", Kind(NotAScalar), || f.a.item::<f32>());
    c.case("item on [0, 3]", Kind(NotAScalar), || f.empty.item::<f32>());
    c.case("item on a broadcast [2^40]", Kind(NotAScalar), || {
        f.wide(&[HUGE])?.item::<f32>()
    });
    c.case_naming("item::<i32> on f32", Kind(DTypeMismatch), &["item::<f32>()"], || {
        f.scalar.item::<i32>()
    });
    c.case("item::<f64> on i64", Kind(DTypeMismatch), || {
        f.ai.narrow(0, 1, 1)?.narrow(1, 2, 1)?.item::<f64>()
    });
}

fn transfers_and_runtime(c: &mut Cases, f: &Fixtures) {
    use ErrorKind::*;
    let a = &f.a;
    let missing = Device::cuda(97);
    c.case("to cuda:97", AnyOf(NO_SUCH_DEVICE), || a.to(&missing));
    c.case("to_device_dtype wgpu:97", AnyOf(NO_SUCH_DEVICE), || {
        a.to_device_dtype(&Device::wgpu(97), DType::F16)
    });
    c.case("copy_from shape mismatch", Kind(ShapeMismatch), || a.copy_from(&f.v4));
    c.case("copy_from dtype mismatch", Kind(DTypeMismatch), || a.copy_from(&f.a64));
    c.case("copy_from into a broadcast view", Kind(InvalidArgument), || {
        f.scalar.broadcast_to(&[2, 3])?.copy_from(a)
    });
    c.case("contiguous of a broadcast beyond memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE, 8])?.contiguous()
    });
    c.case("to_dtype of a broadcast beyond memory", Kind(OutOfMemory), || {
        f.wide(&[HUGE, 8])?.to_dtype(DType::F64)
    });
    c.case("memory_stats cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        cartage::memory_stats(&missing)
    });
    c.case("empty_cache cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        cartage::empty_cache(&missing)
    });
    c.case("synchronize wgpu:97", AnyOf(NO_SUCH_DEVICE), || {
        cartage::synchronize(&Device::wgpu(97))
    });
    c.case("reset_peak_memory_stats cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        cartage::reset_peak_memory_stats(&missing)
    });
    c.case("set_matmul_precision cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        cartage::set_matmul_precision(&missing, MatmulPrecision::Highest)
    });
    c.case("backend cuda:usize::MAX", AnyOf(NO_SUCH_DEVICE), || {
        cartage::backend(&Device::cuda(usize::MAX)).map(|_| ())
    });
    c.case("alloc_pinned cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        cartage::alloc_pinned(&missing, 16).map(|_| ())
    });
    c.case("tensor_bytes overflow", Kind(SizeOverflow), || {
        tensor_bytes(&[usize::MAX, 2], DType::F32)
    });
    c.case("tensor_bytes beyond a layout", Kind(SizeOverflow), || {
        tensor_bytes(&[1 << 61], DType::U8)
    });
    c.case("training estimate of an overflowing shape", Kind(SizeOverflow), || {
        TrainingEstimate::for_shapes(&[&[usize::MAX, 2]], DType::F32, Optimizer::Adam)
    });
    c.case("training estimate on cuda:97", AnyOf(NO_SUCH_DEVICE), || {
        TrainingEstimate::new(10, DType::F32, Optimizer::Sgd).check(&missing)
    });
    c.case("detached tracker records", Kind(InvalidArgument), || {
        MemoryTracker::detached().record()
    });
    c.case("tracker on cuda:97 records", AnyOf(NO_SUCH_DEVICE), || {
        MemoryTracker::new(&missing).record()
    });
    if let Some(error) = c.case("tracker svg into a missing directory", Kind(Io), || {
        MemoryTracker::new(&f.device).write_svg("/nonexistent-cartage-directory/curve.svg")
    }) && error.io_kind() != Some(std::io::ErrorKind::NotFound)
    {
        c.failures
            .push(format!("{}: the svg error lost its io kind: {error}", f.device));
    }
}

/// Every case on `device`; returns the number of distinct cases run.
fn run_all(device: &Device) -> usize {
    let mut cases = Cases::new(*device);
    let fixtures = match Fixtures::new(device) {
        Ok(f) => f,
        Err(e) => panic!("{device}: the fixtures could not be built: {e}"),
    };
    constructors(&mut cases, device);
    device_strings(&mut cases);
    views(&mut cases, &fixtures);
    elementwise(&mut cases, &fixtures);
    reductions(&mut cases, &fixtures);
    matmul(&mut cases, &fixtures);
    if let Err(e) = indexing(&mut cases, &fixtures) {
        cases.failures.push(format!("{device}: the index fixtures failed: {e}"));
    }
    host_reads(&mut cases, &fixtures);
    transfers_and_runtime(&mut cases, &fixtures);
    // The device is still usable after all of that.
    match fixtures.a.add(&fixtures.a).and_then(|t| t.to_vec::<f32>()) {
        Ok(v) => assert_eq!(v, vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "{device}"),
        Err(e) => cases
            .failures
            .push(format!("{device}: a plain add failed afterwards: {e}")),
    }
    assert!(
        cases.failures.is_empty(),
        "{} of {} bad inputs on {device} misbehaved:\n{}",
        cases.failures.len(),
        cases.names.len(),
        cases.failures.join("\n")
    );
    cases.names.len()
}

/// Empty shapes are legal however large their other sizes: they build, read back and view
/// without an error (and without overflowing), on every device the cases run on.
fn empty_shapes_with_huge_sizes_work(device: &Device) -> Result<()> {
    for shape in [[0, HUGE, HUGE], [HUGE, HUGE, 0], [usize::MAX, 0, usize::MAX]] {
        let t = Tensor::zeros(&shape, DType::F32, device)?;
        assert_eq!((t.numel(), t.size_in_bytes()), (0, 0), "{shape:?}");
        assert!(t.is_contiguous());
        assert_eq!(t.to_vec::<f32>()?, Vec::<f32>::new());
        assert_eq!(t.transpose(0, 2)?.contiguous()?.numel(), 0);
        assert_eq!(t.unsqueeze(1)?.reshape(&[0])?.shape(), &[0]);
        assert_eq!(t.add(&t)?.numel(), 0);
        assert_eq!(t.mul_scalar(2.0)?.numel(), 0);
        assert_eq!(t.narrow(1, 0, 0)?.numel(), 0);
    }
    let t = Tensor::zeros(&[0, HUGE, HUGE], DType::F32, device)?;
    assert_eq!(t.sum_all()?.item::<f32>()?, 0.0);
    assert!(t.mean_all()?.item::<f32>()?.is_nan());
    assert_eq!(t.sum(&[1], true)?.shape(), &[0, 1, HUGE]);
    assert_eq!(t.sum(&[0], false).unwrap_err().kind(), ErrorKind::SizeOverflow);
    let e = Tensor::ones(&[0, HUGE, HUGE], DType::F64, device)?;
    let m = Tensor::ones(&[HUGE, 0], DType::F64, device)?;
    assert_eq!(m.matmul(&m.t()?.narrow(1, 0, 0)?)?.shape(), &[HUGE, 0]);
    assert_eq!(
        e.matmul(&Tensor::ones(&[HUGE, 0], DType::F64, device)?)?.shape(),
        &[0, HUGE, 0]
    );
    Ok(())
}

#[test]
fn empty_shapes_with_huge_sizes_work_on_every_device() -> Result<()> {
    for info in cartage::devices() {
        empty_shapes_with_huge_sizes_work(&info.device)?;
    }
    Ok(())
}

#[test]
fn bad_input_is_a_typed_error_on_the_cpu() {
    let count = run_all(&Device::cpu());
    assert!(
        count >= MIN_CASES,
        "only {count} bad-input cases ran; the suite must keep at least {MIN_CASES}"
    );
}

#[test]
fn bad_input_is_a_typed_error_on_every_other_device() {
    let others: Vec<Device> = cartage::devices()
        .into_iter()
        .map(|info| info.device)
        .filter(|d| !d.is_cpu())
        .collect();
    if others.is_empty() {
        common::skip("bad_input on GPUs: no device besides the CPU opens here");
        for kind in [DeviceKind::Cuda, DeviceKind::Wgpu] {
            assert!(
                !common::required(kind),
                "CARTAGE_REQUIRE names {} but no such device opened",
                kind.name()
            );
        }
        return;
    }
    for device in others {
        let count = run_all(&device);
        assert!(count >= MIN_CASES, "{device}: only {count} bad-input cases ran");
    }
}
