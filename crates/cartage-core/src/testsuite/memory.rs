//! The device itself: identity (`info`, one shared backend per ordinal, honest capabilities),
//! host↔device and device↔device copies (sync and pinned async), events, the matmul precision
//! switch; and memory statistics through the backend (allocated, reserved, peaks, counts, cache
//! hits, creation sites, `empty_cache`, out-of-memory and recovery, no growth across steps).

use std::panic::Location;
use std::sync::Arc;

use crate::backend::MatmulPrecision;
use crate::dtype::{DType, Scalar};
use crate::error::Error;
use crate::kernel::{Kernel, Op};

use super::harness::Harness;

/// Identity, capabilities, copies, events.
pub fn device_and_transfers(h: &Harness) {
    let backend = h.backend();
    let info = backend.info();
    h.count_check();
    if info.device != backend.device() {
        h.fail(format!(
            "info() names {} but device() is {}",
            info.device,
            backend.device()
        ));
    }
    match h.reopen() {
        Ok(again) => {
            if Arc::as_ptr(&again) as *const () != Arc::as_ptr(h.backend_arc()) as *const () {
                h.fail("opening the same ordinal twice gave two backends (cache it per ordinal)".into());
            }
        }
        Err(e) => h.fail(format!("opening the backend a second time failed: {e}")),
    }
    let caps = backend.capabilities();
    if caps.is_empty() {
        h.fail("capabilities() lists nothing".into());
    }
    for op in Op::all() {
        for dtype in DType::ALL {
            if caps.supports(op, dtype) && !op.defined_for(dtype) {
                h.fail(format!(
                    "capabilities() lists `{}` for {dtype}, which no device defines",
                    op.name()
                ));
            }
        }
    }
    if caps.max_buffer_bytes == 0 {
        h.fail("capabilities().max_buffer_bytes is 0".into());
    }
    transfers(h);
    events_and_precision(h);
}

fn transfers(h: &Harness) {
    let backend = h.backend();
    let n = 4099;
    let data: Vec<u8> = (0..n).map(|_| h.next_u64() as u8).collect();
    let a = h.upload_bytes(DType::U8, &data);
    h.count_check();
    if h.read_bytes("write then read", &a).is_some_and(|back| back != data) {
        h.fail("write then read: the bytes differ".into());
    }
    // A sub-range write leaves the rest alone.
    let patch: Vec<u8> = (0..50).map(|i| i as u8 ^ 0x5A).collect();
    let mut expected = data.clone();
    expected[100..150].copy_from_slice(&patch);
    match a.raw().write(100, &patch) {
        Ok(()) => {
            if h.read_bytes("sub-range write", &a).is_some_and(|back| back != expected) {
                h.fail("a write into bytes 100..150 changed other bytes or missed some".into());
            }
        }
        Err(e) => h.fail(format!("sub-range write failed: {e}")),
    }
    let mut part = vec![0u8; 77];
    match a.raw().read(1000, &mut part) {
        Ok(()) if part != expected[1000..1077] => h.fail("a sub-range read returned other bytes".into()),
        Ok(()) => {}
        Err(e) => h.fail(format!("sub-range read failed: {e}")),
    }
    // Device to device, between two allocations and at offsets.
    let b = h.poisoned(DType::U8, n);
    let copied = b.raw().copy_from(1000, a.raw(), 10, 3000);
    match copied {
        Ok(()) => {
            let mut want = vec![0xFFu8; n];
            want[1000..4000].copy_from_slice(&expected[10..3010]);
            if h.read_bytes("copy_within", &b).is_some_and(|back| back != want) {
                h.fail("copy_within copied the wrong bytes or touched bytes outside its range".into());
            }
        }
        Err(e) => h.fail(format!("copy_within failed: {e}")),
    }
    // Staging memory (pinned where the device can), asynchronous both ways.
    let pinned_round_trip = || -> crate::Result<Vec<u8>> {
        let mut src = backend.alloc_staging(n)?;
        src.as_mut_slice().copy_from_slice(&data);
        let c = h.poisoned(DType::U8, n);
        c.raw().write_async(0, &src, n)?.wait()?;
        let mut dst = backend.alloc_staging(n)?;
        c.raw().read_async(0, &mut dst, n)?.wait()?;
        Ok(dst.as_slice().to_vec())
    };
    h.count_check();
    match pinned_round_trip() {
        Ok(back) if back != data => h.fail("pinned write_async/read_async: the bytes differ".into()),
        Ok(_) => {}
        Err(e) => h.fail(format!("pinned asynchronous copies failed: {e}")),
    }
    // Zero-length copies are fine.
    let empty = h.alloc(DType::U8, 0);
    if let Err(e) = empty.raw().write(0, &[]).and_then(|()| empty.raw().read(0, &mut [])) {
        h.fail(format!("zero-length write/read failed: {e}"));
    }
}

fn events_and_precision(h: &Harness) {
    let backend = h.backend();
    let out = h.alloc(DType::F32, 1 << 20);
    let timed = || -> crate::Result<std::time::Duration> {
        let start = backend.record_event()?;
        h.run(&Kernel::Fill {
            out: out.contiguous(&[1 << 20]),
            value: Scalar::Float(1.0),
        })?;
        let end = backend.record_event()?;
        let elapsed = backend.elapsed(&start, &end)?;
        backend.synchronize()?;
        Ok(elapsed)
    };
    h.count_check();
    match timed() {
        Ok(elapsed) if elapsed.as_secs() > 60 => h.fail(format!("a 4 MiB fill timed at {elapsed:?}")),
        Ok(_) => {}
        Err(e) => h.fail(format!("event timing failed: {e}")),
    }
    match backend.set_matmul_precision(MatmulPrecision::Highest) {
        Ok(true) if backend.matmul_precision() == MatmulPrecision::Highest => {}
        Ok(accepted) => h.fail(format!(
            "set_matmul_precision(Highest) returned {accepted} and precision is {}; Highest is always available",
            backend.matmul_precision().name()
        )),
        Err(e) => h.fail(format!("set_matmul_precision(Highest) failed: {e}")),
    }
}

/// Memory statistics through the backend (runs alone: no other conformance test allocates).
pub fn memory_stats(h: &Harness) {
    let backend = h.backend();
    let stats = || backend.memory_stats();
    settle(h);
    if let Err(e) = backend.empty_cache() {
        h.fail(format!("empty_cache failed: {e}"));
    }
    backend.allocator().reset_peaks();
    let s0 = stats();
    let expect = |ok: bool, message: String| {
        h.count_check();
        if !ok {
            h.fail(message);
        }
    };
    let small = backend.alloc(1000, Location::caller());
    let large = backend.alloc(3 << 20, Location::caller());
    let (Ok(small), Ok(large)) = (small, large) else {
        h.fail("allocating 1000 bytes and 3 MiB failed".into());
        return;
    };
    let s1 = stats();
    expect(
        s1.allocated_bytes >= s0.allocated_bytes + 1000 + (3 << 20),
        format!(
            "allocated {} → {} after allocating 1000 B + 3 MiB",
            s0.allocated_bytes, s1.allocated_bytes
        ),
    );
    expect(
        s1.requested_bytes == s0.requested_bytes + 1000 + (3 << 20),
        format!("requested {} → {}", s0.requested_bytes, s1.requested_bytes),
    );
    expect(
        s1.active_blocks == s0.active_blocks + 2 && s1.alloc_count == s0.alloc_count + 2,
        format!("active blocks / alloc count: {s0:?} → {s1:?}"),
    );
    expect(
        s1.reserved_bytes >= s1.allocated_bytes && s1.peak_allocated_bytes >= s1.allocated_bytes,
        format!("reserved/peak below allocated: {s1:?}"),
    );
    expect(
        s1.peak_reserved_bytes >= s1.reserved_bytes && s1.segments >= 1,
        format!("peak reserved/segments: {s1:?}"),
    );
    let sites = backend.allocator().largest_live(8);
    expect(
        sites.iter().any(|b| b.site.file().ends_with("memory.rs")),
        format!("the allocation sites passed to alloc() are not recorded: {sites:?}"),
    );
    backend.free(small);
    settle(h);
    let s2 = stats();
    expect(
        s2.allocated_bytes < s1.allocated_bytes && s2.reserved_bytes == s1.reserved_bytes,
        format!("after a free, allocated must fall and reserved stay (cached): {s1:?} → {s2:?}"),
    );
    expect(
        s2.free_count == s1.free_count + 1,
        format!("free count: {s1:?} → {s2:?}"),
    );
    match backend.alloc(900, Location::caller()) {
        Ok(again) => {
            let s3 = stats();
            expect(
                s3.cache_hits == s2.cache_hits + 1 && s3.reserved_bytes == s2.reserved_bytes,
                format!("a re-allocation of a freed size must hit the cache: {s2:?} → {s3:?}"),
            );
            backend.free(again);
            settle(h);
        }
        Err(e) => h.fail(format!("re-allocating 900 bytes failed: {e}")),
    }
    backend.free(large);
    settle(h);
    let s4 = stats();
    expect(
        s4.allocated_bytes == s0.allocated_bytes && s4.requested_bytes == s0.requested_bytes,
        format!("after freeing everything allocated must return: {s0:?} → {s4:?}"),
    );
    expect(
        s4.peak_allocated_bytes >= s0.allocated_bytes + 1000 + (3 << 20),
        format!("peak allocated {} is below what was live", s4.peak_allocated_bytes),
    );
    backend.allocator().reset_peaks();
    let s5 = stats();
    expect(
        s5.peak_allocated_bytes == s5.allocated_bytes,
        format!(
            "reset_peaks left peak {} above allocated {}",
            s5.peak_allocated_bytes, s5.allocated_bytes
        ),
    );
    match backend.empty_cache() {
        Ok(released) => {
            let s6 = stats();
            expect(
                released > 0 && s6.reserved_bytes <= s0.reserved_bytes,
                format!(
                    "empty_cache released {released} B; reserved {} → {}",
                    s4.reserved_bytes, s6.reserved_bytes
                ),
            );
            expect(
                s0.allocated_bytes > 0 || s6.reserved_bytes == 0,
                format!(
                    "nothing is live, yet {} B stay reserved after empty_cache",
                    s6.reserved_bytes
                ),
            );
        }
        Err(e) => h.fail(format!("empty_cache failed: {e}")),
    }
    out_of_memory(h);
    no_growth_across_steps(h);
}

/// Wait for queued work, so that an asynchronous backend's stream-ordered frees have landed.
fn settle(h: &Harness) {
    if let Err(e) = h.backend().synchronize() {
        h.fail(format!("synchronize failed: {e}"));
    }
}

fn out_of_memory(h: &Harness) {
    let backend = h.backend();
    let before = backend.memory_stats();
    let huge = 1usize << 60;
    h.count_check();
    match backend.alloc(huge, Location::caller()) {
        Err(Error::OutOfMemory(report)) => {
            let message = Error::OutOfMemory(report.clone()).to_string();
            if report.requested != huge || !message.contains(&h.device().to_string()) {
                h.fail(format!("the out-of-memory report is incomplete: {message}"));
            }
            let after = backend.memory_stats();
            if after.allocated_bytes != before.allocated_bytes || after.oom_count != before.oom_count + 1 {
                h.fail(format!("out of memory changed the counters: {before:?} → {after:?}"));
            }
        }
        Err(e) => h.fail(format!(
            "allocating 1 EiB must fail with OutOfMemory, not {}: {e}",
            e.kind_name()
        )),
        Ok(a) => {
            backend.free(a);
            h.fail("allocating 1 EiB succeeded".into());
        }
    }
    match backend.alloc(4096, Location::caller()) {
        Ok(a) => backend.free(a),
        Err(e) => h.fail(format!("a small allocation after out of memory failed: {e}")),
    }
}

/// Running the same kernels twice leaves `allocated` where the first round left it.
fn no_growth_across_steps(h: &Harness) {
    let step = || {
        let a = h.upload(DType::F32, &vec![0.5; 64 * 64]);
        let out = h.poisoned(DType::F32, 64 * 64);
        let matmul = Kernel::Matmul {
            lhs: a.contiguous(&[1, 64, 64]),
            rhs: a.contiguous(&[1, 64, 64]),
            out: out.contiguous(&[1, 64, 64]),
        };
        let fill = Kernel::Fill {
            out: out.contiguous(&[64 * 64]),
            value: Scalar::Float(2.0),
        };
        for kernel in [matmul, fill] {
            if h.supports(kernel.op(), DType::F32) {
                h.launch("a step of the no-growth check", &kernel);
            }
        }
        if let Err(e) = h.backend().synchronize() {
            h.fail(format!("synchronize failed: {e}"));
        }
    };
    step();
    let first = h.backend().memory_stats().allocated_bytes;
    step();
    step();
    let third = h.backend().memory_stats().allocated_bytes;
    h.count_check();
    if third != first {
        h.fail(format!(
            "allocated grew from {first} to {third} bytes over two identical steps (a leak)"
        ));
    }
}
