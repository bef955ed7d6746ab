//! The suite's test harness: backend acquisition (skip loudly, or fail when `CARTAGE_REQUIRE`
//! names the device kind), a seeded std-only random generator, upload/download in any dtype,
//! poisoned outputs, and the list of failures a test collects before failing with the seed that
//! reproduces it. Result checks live in `checks.rs`, buffers and encodings in `buffers.rs`.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::panic::Location;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::backend::Backend;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::kernel::Kernel;
use crate::layout::Layout;

use super::buffers::{DeviceBuffer, Operand, Spec, decode, encode};
use super::views::{View, ViewKind, offsets, view};

/// The environment variable naming device kinds whose absence is a failure, not a skip.
pub const REQUIRE_VAR: &str = "CARTAGE_REQUIRE";

/// The environment variable that replays a run: set it to the seed a failure printed.
pub const SEED_VAR: &str = "CARTAGE_TEST_SEED";

/// The byte every output is filled with before a launch; an element still holding it afterwards
/// was never written (for floats it is a NaN, for bool an invalid value).
pub const POISON: u8 = 0xFF;

/// How an `open` closure of `conformance_tests!` looks.
pub type OpenBackend = Box<dyn Fn() -> Result<Arc<dyn Backend>>>;

/// Tests of one process share backends: the memory test runs alone (write lock), every other
/// test holds a read lock, so its statistics are not disturbed by concurrent allocations.
static EXCLUSIVE: RwLock<()> = RwLock::new(());

/// What to do when a backend could not be opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// Report the device as missing (once per process, [`super::skip::device_missing`]) and
    /// pass.
    Skip {
        /// The device that did not open (`cuda:0`), or its kind.
        device: String,
        /// Why it did not open.
        reason: String,
    },
    /// Fail with this message (`CARTAGE_REQUIRE` names the kind).
    Fail(String),
}

/// Decide between a loud skip and a failure for a backend `suite` that failed to open with
/// `error`, given the value of `CARTAGE_REQUIRE`. The device kind comes from the error's device,
/// else from the suite name (`cpu`, `cuda…`, `wgpu…`).
pub fn on_unavailable(suite: &str, test: &str, error: &Error, require: Option<&str>) -> Unavailable {
    let device = match error {
        Error::BackendUnavailable { device, .. }
        | Error::BackendNotCompiled { device, .. }
        | Error::Driver { device, .. } => Some(*device),
        _ => None,
    };
    let kind = device
        .map(|d| d.kind().name())
        .or_else(|| ["cpu", "cuda", "wgpu"].into_iter().find(|k| suite.starts_with(k)));
    let shown = device.map_or_else(|| kind.unwrap_or("unknown device").to_string(), |d| d.to_string());
    let required = match (require, kind) {
        (Some(list), Some(kind)) => list.split(',').any(|k| k.trim().eq_ignore_ascii_case(kind)),
        _ => false,
    };
    if required {
        Unavailable::Fail(format!(
            "conformance/{suite}/{test}: {shown}: {error} ({REQUIRE_VAR}={} requires this backend)",
            require.unwrap_or_default()
        ))
    } else {
        Unavailable::Skip {
            device: shown,
            reason: error.to_string(),
        }
    }
}

/// Run one conformance test body against the backend `open` returns (shared with other tests).
pub fn run(
    suite: &'static str,
    test: &'static str,
    open: impl Fn() -> Result<Arc<dyn Backend>> + 'static,
    body: fn(&Harness),
) {
    run_with(suite, test, Box::new(open), body, false)
}

/// Like [`run`], but no other conformance test of this process runs meanwhile (memory statistics).
pub fn run_exclusive(
    suite: &'static str,
    test: &'static str,
    open: impl Fn() -> Result<Arc<dyn Backend>> + 'static,
    body: fn(&Harness),
) {
    run_with(suite, test, Box::new(open), body, true)
}

fn run_with(suite: &'static str, test: &'static str, open: OpenBackend, body: fn(&Harness), exclusive: bool) {
    let backend = match open() {
        Ok(backend) => backend,
        Err(error) => {
            let require = std::env::var(REQUIRE_VAR).ok();
            match on_unavailable(suite, test, &error, require.as_deref()) {
                Unavailable::Fail(message) => panic!("{message}"),
                Unavailable::Skip { device, reason } => {
                    // Written to the real stderr, past the test harness's capture: a skip is loud,
                    // once per device and binary.
                    super::skip::device_missing(&format!("conformance/{suite}/{test}"), &device, &reason);
                    return;
                }
            }
        }
    };
    announce(suite, backend.as_ref());
    let (_read, _write);
    if exclusive {
        _write = EXCLUSIVE.write().unwrap_or_else(|p| p.into_inner());
    } else {
        _read = EXCLUSIVE.read().unwrap_or_else(|p| p.into_inner());
    }
    let harness = Harness::new(suite, test, backend, open);
    body(&harness);
    harness.finish();
}

/// Print, once per suite and process and past the test harness's capture, which backend and
/// device the suite runs on.
fn announce(suite: &'static str, backend: &dyn Backend) {
    static ANNOUNCED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut announced = ANNOUNCED.lock().unwrap_or_else(|p| p.into_inner());
    if !announced.contains(&suite) {
        announced.push(suite);
        let _ = writeln!(
            std::io::stderr(),
            "conformance/{suite}: running on {} ({} backend)",
            backend.info(),
            backend.device().kind().name()
        );
    }
}

/// One test's view of the backend under test: the backend, a seeded generator, and the list of
/// failures found so far.
pub struct Harness {
    backend: Arc<dyn Backend>,
    open: OpenBackend,
    suite: &'static str,
    test: &'static str,
    seed: u64,
    state: Cell<u64>,
    checks: Cell<usize>,
    failures: RefCell<Vec<String>>,
    /// Every buffer the harness allocated, so that `launch` can borrow the owners of a kernel's
    /// operands (the sound path, `Kernel::run`).
    buffers: RefCell<Vec<Weak<crate::DeviceBuffer>>>,
}

impl Harness {
    /// Require `kernel` to fail validation with `kind`, and the launch with `kind` too
    /// (`Unsupported` allowed where the backend does not list the op).
    pub(super) fn expect_refused(&self, what: &str, kernel: &Kernel, kind: ErrorKind) {
        self.count_check();
        match kernel.validate() {
            Err(e) if e.kind() == kind => {}
            Err(e) => self.fail(format!(
                "{what}: validate() gave {} ({e}), expected {}",
                e.kind_name(),
                kind.name()
            )),
            Ok(()) => self.fail(format!("{what}: validate() accepted it, expected {}", kind.name())),
        }
        let supported = self.supports(kernel.op(), kernel.dtype());
        match self.run(kernel).and_then(|()| self.backend().synchronize()) {
            Err(e) if e.kind() == kind => {}
            Err(e) if !supported && e.kind() == ErrorKind::Unsupported => {}
            Err(e) => self.fail(format!(
                "{what}: launch gave {} ({e}), expected {}",
                e.kind_name(),
                kind.name()
            )),
            Ok(()) => self.fail(format!("{what}: the malformed kernel was accepted")),
        }
    }

    fn new(suite: &'static str, test: &'static str, backend: Arc<dyn Backend>, open: OpenBackend) -> Self {
        let seed = std::env::var(SEED_VAR)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                let nanos = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                nanos ^ test.bytes().fold(0u64, |h, b| h.rotate_left(5) ^ b as u64)
            });
        eprintln!(
            "conformance/{suite}/{test}: {} via {} backend, seed {seed}",
            backend.info(),
            backend.device().kind().name()
        );
        Harness {
            backend,
            open,
            suite,
            test,
            seed,
            state: Cell::new(seed),
            checks: Cell::new(0),
            failures: RefCell::new(Vec::new()),
            buffers: RefCell::new(Vec::new()),
        }
    }

    /// The backend under test.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// The shared handle of the backend under test.
    pub fn backend_arc(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Open the backend again through the suite's `open` closure.
    pub fn reopen(&self) -> Result<Arc<dyn Backend>> {
        (self.open)()
    }

    /// The device under test.
    pub fn device(&self) -> Device {
        self.backend.device()
    }

    /// The seed of this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// True when the backend lists `op` for `dtype`.
    pub fn supports(&self, op: crate::kernel::Op, dtype: DType) -> bool {
        self.backend.capabilities().supports(op, dtype)
    }

    // ---- randomness (SplitMix64: std only, reproducible from the printed seed) ----

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        let s = self.state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.state.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw from `[lo, hi)`.
    pub fn uniform(&self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `lo..=hi`.
    pub fn int(&self, lo: i64, hi: i64) -> i64 {
        let span = (hi as i128 - lo as i128 + 1) as u128;
        (lo as i128 + (self.next_u64() as u128 % span) as i128) as i64
    }

    /// A uniform index below `n` (`n > 0`).
    pub fn below(&self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` random values valid for `dtype` under `spec`, already rounded to what `dtype` stores.
    pub fn random_values(&self, dtype: DType, n: usize, spec: Spec) -> Vec<f64> {
        let (ilo, ihi) = match dtype {
            DType::U8 => (spec.int.0.clamp(0, 255), spec.int.1.clamp(0, 255)),
            DType::I32 => (
                spec.int.0.clamp(i32::MIN as i64, i32::MAX as i64),
                spec.int.1.clamp(i32::MIN as i64, i32::MAX as i64),
            ),
            _ => spec.int,
        };
        (0..n)
            .map(|_| match dtype {
                DType::Bool => self.below(2) as f64,
                d if d.is_int() => self.int(ilo, ihi.max(ilo)) as f64,
                d => {
                    let mut v = self.uniform(spec.float.0, spec.float.1);
                    if spec.step > 0.0 {
                        v = (v / spec.step).round() * spec.step;
                    }
                    if spec.random_sign && self.below(2) == 1 {
                        v = -v;
                    }
                    d.round_trip(v)
                }
            })
            .collect()
    }

    // ---- device buffers ----

    /// A fresh allocation of `len` elements of `dtype`, uninitialised.
    #[track_caller]
    pub fn alloc(&self, dtype: DType, len: usize) -> DeviceBuffer {
        let bytes = len * dtype.size_in_bytes();
        let inner = crate::DeviceBuffer::new_at(&self.backend, bytes, Location::caller())
            .unwrap_or_else(|e| panic!("{}: allocating {bytes} bytes failed: {e}", self.name()));
        let buf = DeviceBuffer::new(Arc::new(inner), dtype, len);
        let mut known = self.buffers.borrow_mut();
        known.retain(|w| w.strong_count() > 0);
        known.push(buf.weak());
        buf
    }

    /// Upload `bytes` (already encoded) into a fresh allocation.
    #[track_caller]
    pub fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> DeviceBuffer {
        let buf = self.alloc(dtype, bytes.len() / dtype.size_in_bytes());
        buf.raw()
            .write(0, bytes)
            .unwrap_or_else(|e| panic!("{}: writing {} bytes failed: {e}", self.name(), bytes.len()));
        buf
    }

    /// Upload host values (as stored by `dtype`) into a fresh allocation.
    #[track_caller]
    pub fn upload(&self, dtype: DType, values: &[f64]) -> DeviceBuffer {
        self.upload_bytes(dtype, &encode(dtype, values))
    }

    /// A fresh allocation of `len` elements with every byte set to [`POISON`].
    #[track_caller]
    pub fn poisoned(&self, dtype: DType, len: usize) -> DeviceBuffer {
        self.upload_bytes(dtype, &vec![POISON; len * dtype.size_in_bytes()])
    }

    /// A poisoned output for a view of kind `kind` and shape `shape`.
    #[track_caller]
    pub fn poisoned_view(&self, dtype: DType, kind: ViewKind, shape: &[usize]) -> (DeviceBuffer, Layout) {
        let v = view(kind, shape);
        (self.poisoned(dtype, v.base_len), v.layout)
    }

    /// An operand of `dtype` viewed as `kind` with `shape`, filled with random values under `spec`.
    #[track_caller]
    pub fn operand(&self, dtype: DType, kind: ViewKind, shape: &[usize], spec: Spec) -> Operand {
        let v = view(kind, shape);
        let base = self.random_values(dtype, v.base_len, spec);
        self.operand_from(dtype, v, &base)
    }

    /// An operand over given base values (the whole buffer), viewed through `v`.
    #[track_caller]
    pub fn operand_from(&self, dtype: DType, v: View, base: &[f64]) -> Operand {
        assert_eq!(
            base.len(),
            v.base_len,
            "suite bug: base values do not fill the view's buffer"
        );
        let values = offsets(&v.layout).map(|o| base[o]).collect();
        Operand {
            buf: self.upload(dtype, base),
            layout: v.layout,
            kind: v.kind,
            values,
        }
    }

    /// All bytes of `buf`, or a recorded failure.
    pub fn read_bytes(&self, what: &str, buf: &DeviceBuffer) -> Option<Vec<u8>> {
        let mut bytes = vec![0u8; buf.len * buf.dtype.size_in_bytes()];
        match buf.raw().read(0, &mut bytes) {
            Ok(()) => Some(bytes),
            Err(e) => {
                self.fail(format!("{what}: reading the result failed: {e}"));
                None
            }
        }
    }

    /// The values of `buf` seen through `layout`, in row-major order, decoded to f64.
    pub fn read_values(&self, what: &str, buf: &DeviceBuffer, layout: &Layout) -> Option<Vec<f64>> {
        let bytes = self.read_bytes(what, buf)?;
        let all = decode(buf.dtype, &bytes);
        Some(offsets(layout).map(|o| all[o]).collect())
    }

    // ---- launches and checks ----

    /// Run `kernel` soundly: the buffers the harness allocated that hold its operands are
    /// borrowed for the call ([`Kernel::run`]).
    pub fn run(&self, kernel: &Kernel) -> Result<()> {
        let owners: Vec<Arc<crate::DeviceBuffer>> = {
            let known = self.buffers.borrow();
            let operands = kernel.operands();
            known
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|b| operands.iter().any(|a| b.slice().contains(&a.buffer)))
                .collect()
        };
        let borrowed: Vec<&crate::DeviceBuffer> = owners.iter().map(|b| b.as_ref()).collect();
        // With no owner found, `run` refuses the kernel (it needs the buffers of its operands).
        kernel.run(&borrowed)
    }

    /// Launch `kernel`; a failure is recorded (and `false` returned) instead of a panic.
    pub fn launch(&self, what: &str, kernel: &Kernel) -> bool {
        match self.run(kernel) {
            Ok(()) => true,
            Err(e) => {
                self.fail(format!("{what}: launch failed with {} error: {e}", e.kind_name()));
                false
            }
        }
    }

    /// `n` elements of `dtype` as random bit patterns: any value for integers, any non-NaN bit
    /// pattern for floats (subnormals, −0 and infinities included), 0 or 1 for bool.
    pub fn random_bits(&self, dtype: DType, n: usize) -> Vec<u8> {
        let size = dtype.size_in_bytes();
        let mut out = Vec::with_capacity(n * size);
        for _ in 0..n {
            loop {
                let word = self.next_u64().to_le_bytes();
                let bits = &word[..size];
                let keep = match dtype {
                    DType::Bool => {
                        out.push(bits[0] & 1);
                        break;
                    }
                    d if d.is_float() => !decode(d, bits)[0].is_nan(),
                    _ => true,
                };
                if keep {
                    out.extend_from_slice(bits);
                    break;
                }
            }
        }
        out
    }

    /// Record a passing check (for the summary line).
    pub fn count_check(&self) {
        self.checks.set(self.checks.get() + 1);
    }

    /// Record a failure; the test fails at its end with every failure listed.
    pub fn fail(&self, message: String) {
        eprintln!("FAIL {}: {message}", self.name());
        self.failures.borrow_mut().push(message);
    }

    /// `suite/test`, as printed.
    pub fn name(&self) -> String {
        format!("conformance/{}/{}", self.suite, self.test)
    }

    fn finish(&self) {
        let failures = self.failures.borrow();
        let checks = self.checks.get();
        if failures.is_empty() {
            eprintln!("{}: {checks} checks passed on {}", self.name(), self.device());
            return;
        }
        let shown: Vec<&str> = failures.iter().take(40).map(String::as_str).collect();
        panic!(
            "{}: {} of {checks} checks failed on {} (seed {seed}; {SEED_VAR}={seed} repeats this run):\n  {}{}",
            self.name(),
            failures.len(),
            self.backend.info(),
            shown.join("\n  "),
            if failures.len() > shown.len() { "\n  …" } else { "" },
            seed = self.seed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_backends_skip_unless_required() {
        let err = Error::BackendUnavailable {
            device: Device::cuda(0),
            reason: "no driver".into(),
        };
        match on_unavailable("cuda", "fill", &err, None) {
            Unavailable::Skip { device, reason } => {
                assert_eq!(device, "cuda:0");
                assert!(reason.contains("no driver"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            on_unavailable("cuda", "fill", &err, Some("wgpu")),
            Unavailable::Skip { .. }
        ));
        match on_unavailable("cuda", "fill", &err, Some("wgpu, cuda")) {
            Unavailable::Fail(msg) => assert!(msg.contains("no driver") && msg.contains(REQUIRE_VAR), "{msg}"),
            other => panic!("{other:?}"),
        }
        // An error without a device: the kind comes from the suite name.
        let other = Error::invalid("open", "weird");
        assert!(matches!(
            on_unavailable("wgpu_lavapipe", "fill", &other, Some("wgpu")),
            Unavailable::Fail(_)
        ));
        assert!(matches!(
            on_unavailable("mystery", "fill", &other, Some("cpu,cuda,wgpu")),
            Unavailable::Skip { .. }
        ));
    }
}
