//! Result checks of the suite: compare a device output with the reference (values within a
//! tolerance, or exact bytes), flag elements that still hold the poison or bytes written outside
//! the output view, and require `Unsupported` for what `capabilities()` does not list.

use crate::error::Error;
use crate::kernel::Kernel;
use crate::layout::Layout;

use super::buffers::{DeviceBuffer, decode, encode};
use super::harness::{Harness, POISON};
use super::reference::{self, Tolerance};
use super::views::offsets;

impl Harness {
    /// Require `kernel` to be refused with [`Error::Unsupported`] naming its op, dtype and device.
    pub fn expect_unsupported(&self, what: &str, kernel: &Kernel) {
        self.count_check();
        let result = self.run(kernel).and_then(|()| self.backend().synchronize());
        match result {
            Err(Error::Unsupported { op, dtype, device, .. }) => {
                if op != kernel.op().name() || dtype != Some(kernel.dtype()) || device != self.device() {
                    self.fail(format!(
                        "{what}: Unsupported names op `{op}`, {dtype:?}, {device}; expected `{}`, {}, {}",
                        kernel.op().name(),
                        kernel.dtype(),
                        self.device()
                    ));
                }
            }
            Err(e) => self.fail(format!(
                "{what}: capabilities() does not list it, so launch must fail with Unsupported, not {}: {e}",
                e.kind_name()
            )),
            Ok(()) => self.fail(format!(
                "{what}: capabilities() does not list it, yet launch accepted it (it must return Unsupported)"
            )),
        }
    }

    /// Check the elements of `out` seen through `layout` against `want` (exact reference values)
    /// with `tol`; elements of `out` outside `layout` must still hold the poison.
    pub fn check(&self, what: &str, out: &DeviceBuffer, layout: &Layout, want: &[f64], tol: Tolerance) {
        self.check_with(what, out, layout, want, |_, w| tol.allowed(w));
    }

    /// [`Harness::check`] with a per-element allowance `allowed(index, want)`.
    pub fn check_with(
        &self,
        what: &str,
        out: &DeviceBuffer,
        layout: &Layout,
        want: &[f64],
        allowed: impl Fn(usize, f64) -> f64,
    ) {
        self.count_check();
        if let Err(message) = self.compare(out, layout, want, allowed) {
            self.fail(format!("{what}: {message}"));
        }
    }

    /// Compare without recording: `Err` describes the mismatches (for property tests, which
    /// shrink before reporting).
    pub fn compare(
        &self,
        out: &DeviceBuffer,
        layout: &Layout,
        want: &[f64],
        allowed: impl Fn(usize, f64) -> f64,
    ) -> std::result::Result<(), String> {
        assert_eq!(want.len(), layout.numel(), "suite bug: reference has the wrong length");
        let bytes = self.read_raw(out)?;
        let values = decode(out.dtype, &bytes);
        let size = out.dtype.size_in_bytes();
        let poison = vec![POISON; size];
        let mut covered = vec![false; out.len];
        let mut bad = Vec::new();
        let mut bad_count = 0usize;
        for (i, offset) in offsets(layout).enumerate() {
            covered[offset] = true;
            let (got, w) = (values[offset], want[i]);
            let tolerance = allowed(i, w);
            let close = reference::close(out.dtype, got, w, tolerance);
            // Still the poison, where the right answer is not the poison's own value.
            let unwritten = bytes[offset * size..(offset + 1) * size] == poison[..]
                && encode(out.dtype, &[out.dtype.round_trip(w)]) != poison;
            if unwritten || !close {
                bad_count += 1;
                if bad.len() < 6 {
                    let note = if unwritten { " (never written)" } else { "" };
                    bad.push(format!("[{i}] got {got:e} want {w:e} ±{tolerance:.1e}{note}"));
                }
            }
        }
        let mut problems = Vec::new();
        if bad_count > 0 {
            problems.push(format!(
                "{bad_count} of {} elements wrong: {}",
                want.len(),
                bad.join(", ")
            ));
        }
        problems.extend(stray_writes(&bytes, size, &covered));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// Compare bytes without recording (see [`Harness::check_bytes`]).
    pub fn compare_bytes(&self, out: &DeviceBuffer, layout: &Layout, want: &[u8]) -> std::result::Result<(), String> {
        let size = out.dtype.size_in_bytes();
        assert_eq!(want.len(), layout.numel() * size, "suite bug: wrong expected length");
        let bytes = self.read_raw(out)?;
        let mut covered = vec![false; out.len];
        let mut bad = Vec::new();
        let mut bad_count = 0usize;
        for (i, offset) in offsets(layout).enumerate() {
            covered[offset] = true;
            let (got, expected) = (
                &bytes[offset * size..(offset + 1) * size],
                &want[i * size..(i + 1) * size],
            );
            if got != expected {
                bad_count += 1;
                if bad.len() < 6 {
                    bad.push(format!("[{i}] got bytes {got:02x?} want {expected:02x?}"));
                }
            }
        }
        let mut problems = Vec::new();
        if bad_count > 0 {
            problems.push(format!(
                "{bad_count} of {} elements differ bitwise: {}",
                layout.numel(),
                bad.join(", ")
            ));
        }
        problems.extend(stray_writes(&bytes, size, &covered));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    pub(super) fn read_raw(&self, buf: &DeviceBuffer) -> std::result::Result<Vec<u8>, String> {
        let mut bytes = vec![0u8; buf.len * buf.dtype.size_in_bytes()];
        buf.raw()
            .read(0, &mut bytes)
            .map_err(|e| format!("reading the result failed: {e}"))?;
        Ok(bytes)
    }

    /// Check that the elements of `out` seen through `layout` hold exactly `want` (the expected
    /// bytes of each element, row-major), and that bytes outside the view still hold the poison.
    pub fn check_bytes(&self, what: &str, out: &DeviceBuffer, layout: &Layout, want: &[u8]) {
        self.count_check();
        if let Err(message) = self.compare_bytes(out, layout, want) {
            self.fail(format!("{what}: {message}"));
        }
    }
}

/// A complaint about elements outside an output view that no longer hold the poison.
fn stray_writes(bytes: &[u8], size: usize, covered: &[bool]) -> Option<String> {
    let stray: Vec<usize> = (0..covered.len())
        .filter(|&j| !covered[j] && bytes[j * size..(j + 1) * size].iter().any(|&b| b != POISON))
        .collect();
    (!stray.is_empty()).then(|| {
        format!(
            "wrote {} elements outside the output view (buffer elements {:?}…)",
            stray.len(),
            &stray[..stray.len().min(6)]
        )
    })
}
