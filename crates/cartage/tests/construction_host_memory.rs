//! R7 seen from the host: building a tensor on a device never builds it on the host first. A
//! counting global allocator measures the host heap's peak while `zeros`, `full`, `arange` and
//! `rand` build a 16 MiB tensor on a GPU device (no host allocation of that size at all) and on
//! the CPU (at most the tensor's own memory, never a second copy). Alone in its binary: the
//! counter is process-wide.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use cartage::prelude::*;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = CURRENT.fetch_add(bytes, Ordering::SeqCst) + bytes;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and only
// updates counters besides, so `System`'s guarantees hold for the returned memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: `ptr` was allocated by `System` with `layout` (through this allocator).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, passed on unchanged.
        let out = unsafe { System.realloc(ptr, layout, new_size) };
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        out
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak growth of the host heap while `f` runs.
fn host_peak_growth<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, usize)> {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let value = f()?;
    Ok((value, PEAK.load(Ordering::SeqCst).saturating_sub(base)))
}

fn build_all(device: &Device, limit: usize) -> Result<()> {
    let shape = [4096, 1024];
    let bytes = 4096 * 1024 * 4;
    type Build = fn(&[usize], &Device) -> Result<Tensor>;
    let builders: [(&str, Build); 4] = [
        ("zeros", |s, d| Tensor::zeros(s, DType::F32, d)),
        ("full", |s, d| Tensor::full(s, 3.0, DType::F32, d)),
        ("arange", |s, d| {
            Tensor::arange(0.0, (s[0] * s[1]) as f64, 1.0, DType::F32, d)
        }),
        ("rand", |s, d| Tensor::rand(s, DType::F32, 3, d)),
    ];
    for (name, build) in builders {
        // Warm the device's cache with a block of this size, so the build itself would only
        // allocate on the host if it built the data there.
        drop(build(&shape, device)?);
        cartage::synchronize(device)?;
        let (tensor, growth) = host_peak_growth(|| {
            let t = build(&shape, device)?;
            cartage::synchronize(device)?;
            Ok(t)
        })?;
        assert_eq!(tensor.size_in_bytes(), bytes);
        assert!(
            growth <= limit,
            "{name} on {device} grew the host heap by {growth} bytes (limit {limit}): a host copy was built"
        );
    }
    Ok(())
}

#[test]
fn construction_builds_no_host_copy() -> Result<()> {
    // The CPU's device memory is host memory, served from the warmed cache: no new host bytes.
    build_all(&Device::cpu(), 1 << 20)?;
    if let Some(gpu) = common::second_device("construction_builds_no_host_copy (gpu part)") {
        build_all(&gpu, 1 << 20)?;
    }
    Ok(())
}
