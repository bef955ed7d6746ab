//! Helpers of the crate's own tests: open `wgpu:0` or skip loudly (fail when
//! `CARTAGE_REQUIRE` names wgpu), and move typed data in and out of device tensors.

#![allow(dead_code)]

use std::sync::Arc;

use cartage_core::{Allocation, Backend, Element, Layout, TensorArg};
use cartage_wgpu::WgpuBackend;

/// True when `CARTAGE_REQUIRE` lists wgpu.
pub fn required() -> bool {
    std::env::var("CARTAGE_REQUIRE")
        .map(|v| v.split(',').any(|k| k.trim().eq_ignore_ascii_case("wgpu")))
        .unwrap_or(false)
}

/// `wgpu:0`, or `None` after a loud SKIP line (a panic when wgpu is required).
pub fn backend(test: &str) -> Option<Arc<WgpuBackend>> {
    match cartage_wgpu::open_wgpu(0) {
        Ok(b) => Some(b),
        Err(e) => {
            if required() {
                panic!("CARTAGE_REQUIRE names wgpu but wgpu:0 is unavailable: {e}");
            }
            eprintln!("SKIP wgpu/{test}: wgpu:0 is unavailable: {e}");
            None
        }
    }
}

/// A device tensor holding `values` with `shape`.
pub fn upload<T: Element>(b: &WgpuBackend, values: &[T], shape: &[usize]) -> (Allocation, TensorArg) {
    let bytes = T::to_le_bytes_vec(values);
    let alloc = b.alloc(bytes.len(), std::panic::Location::caller()).expect("alloc");
    b.write(alloc.slice(), &bytes).expect("write");
    let arg = TensorArg {
        buffer: alloc.slice(),
        layout: Layout::contiguous(shape).expect("layout"),
        dtype: T::DTYPE,
    };
    (alloc, arg)
}

/// An uninitialised device tensor of `shape`.
pub fn empty<T: Element>(b: &WgpuBackend, shape: &[usize]) -> (Allocation, TensorArg) {
    let layout = Layout::contiguous(shape).expect("layout");
    let bytes = layout.numel() * T::DTYPE.size_in_bytes();
    let alloc = b.alloc(bytes.max(1), std::panic::Location::caller()).expect("alloc");
    let arg = TensorArg {
        buffer: alloc.slice(),
        layout,
        dtype: T::DTYPE,
    };
    (alloc, arg)
}

/// The elements of a contiguous tensor.
pub fn download<T: Element>(b: &WgpuBackend, arg: &TensorArg) -> Vec<T> {
    let n = arg.layout.numel() * T::DTYPE.size_in_bytes();
    let mut bytes = vec![0u8; n];
    let slice = arg
        .buffer
        .slice(arg.layout.offset() * T::DTYPE.size_in_bytes(), n)
        .expect("slice");
    b.read(slice, &mut bytes).expect("read");
    T::from_le_bytes_slice(&bytes)
}
