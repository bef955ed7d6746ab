//! Helpers of the crate's own tests: open `wgpu:0` or skip loudly (fail when
//! `CARTAGE_REQUIRE` names wgpu), and move typed data in and out of device tensors.

#![allow(dead_code)]

use std::sync::Arc;

use cartage_core::{Backend, DeviceBuffer, Element, Layout, TensorArg};
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
            cartage_core::testsuite::skip::device_missing(&format!("wgpu/{test}"), "wgpu:0", &e.to_string());
            None
        }
    }
}

/// The backend as the trait object device buffers hold.
pub fn device(b: &Arc<WgpuBackend>) -> Arc<dyn Backend> {
    Arc::clone(b) as Arc<dyn Backend>
}

/// A device tensor holding `values` with `shape`: its buffer and a contiguous view of it.
#[track_caller]
pub fn upload<T: Element>(b: &Arc<WgpuBackend>, values: &[T], shape: &[usize]) -> (DeviceBuffer, TensorArg) {
    let bytes = T::to_le_bytes_vec(values);
    let buffer = DeviceBuffer::new(&device(b), bytes.len()).expect("alloc");
    buffer.write(0, &bytes).expect("write");
    let arg = buffer.arg(Layout::contiguous(shape).expect("layout"), T::DTYPE);
    (buffer, arg)
}

/// An uninitialised device tensor of `shape`: its buffer and a contiguous view of it.
#[track_caller]
pub fn empty<T: Element>(b: &Arc<WgpuBackend>, shape: &[usize]) -> (DeviceBuffer, TensorArg) {
    let layout = Layout::contiguous(shape).expect("layout");
    let bytes = layout.numel() * T::DTYPE.size_in_bytes();
    let buffer = DeviceBuffer::new(&device(b), bytes.max(1)).expect("alloc");
    let arg = buffer.arg(layout, T::DTYPE);
    (buffer, arg)
}

/// The elements of `arg`, a contiguous view into `buffer`.
pub fn download<T: Element>(buffer: &DeviceBuffer, arg: &TensorArg) -> Vec<T> {
    let n = arg.layout.numel() * T::DTYPE.size_in_bytes();
    let mut bytes = vec![0u8; n];
    let offset = arg
        .byte_offset()
        .checked_sub(buffer.slice().offset())
        .expect("the view lies in the buffer");
    buffer.read(offset, &mut bytes).expect("read");
    T::from_le_bytes_slice(&bytes)
}
