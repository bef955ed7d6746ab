//! Patching partial words of a segment (`shaders/patch.wgsl`): the bytes of a host write that
//! do not fill whole 32-bit words, written without touching their neighbours.

use cartage_core::Result;

use crate::backend::WgpuBackend;
use crate::bindings::{Window, align_down};
use crate::encoder::ParamBlock;

const PATCH: &str = include_str!("../../shaders/patch.wgsl");

/// Apply `(word index in the segment, mask, bits)` edits to segment `segment` (`buffer`).
pub(crate) fn patch_words(
    backend: &WgpuBackend,
    segment: u64,
    buffer: &wgpu::Buffer,
    edits: &[(u64, u32, u32)],
) -> Result<()> {
    for group in edits.chunks(4) {
        let first = group.iter().map(|e| e.0).min().unwrap_or(0) * 4;
        let last = group.iter().map(|e| e.0).max().unwrap_or(0) * 4 + 4;
        let offset = align_down(first, backend.ctx.binding_alignment());
        let size = (last - offset).div_ceil(16) * 16;
        let window = Window {
            segment,
            offset,
            size: size.min(buffer.size() - offset),
        };
        let mut params = ParamBlock::default();
        params.0[0] = group.len() as u32;
        for (i, &(word, mask, bits)) in group.iter().enumerate() {
            params.put(4 + 4 * i, &[(word - offset / 4) as u32, mask, bits, 0]);
        }
        let pipeline = backend.pipelines.get(&backend.ctx, "patch", 1, || PATCH.to_string())?;
        backend.record(&pipeline, &[window], &params, [1, 1, 1])?;
    }
    Ok(())
}
