//! The optional additive mask of the fused attention kernels ([`AttentionMask`]): its binding,
//! its addressing and the WGSL that reads it.
//!
//! The mask `[outer, inner, L, S]` is read in place through any strides (0 along a broadcast
//! dimension) and storage offset, in q's dtype (the half types unpacked on load): batch entry
//! `b` of the merged batch reads `mask[b / inner, b % inner, i, j]`. Its element offset and
//! outer, row and column strides take slot [`MASK_SLOT`] of the parameter block, its inner
//! size and stride the block's `mask` vector (`shaders/attention_params.wgsl`). Only kernels
//! built with the mask bind it and read it (one more storage binding, checked against the
//! adapter with [`check_bindings`]); the unmasked kernels are unchanged.

use cartage_core::kernel::AttentionMask;
use cartage_core::{DType, Error, Result};

use crate::backend::WgpuBackend;
use crate::bindings::{Window, bind_operand};
use crate::encoder::ParamBlock;
use crate::wgsl;

/// The parameter slot (`P.ops[MASK_SLOT]`) of the mask: past every operand slot of the kernels.
pub(crate) const MASK_SLOT: usize = 7;

/// The first word of the `mask` vector of the parameter block (after sizes, misc and the eight
/// operand slots).
const MASK_WORDS: usize = 8 + 4 * 8;

/// The mask as the kernels address it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaskSlot {
    /// Its binding window.
    pub window: Window,
    /// The element offset of `[0, 0, 0, 0]` inside the window.
    offset: usize,
    /// Outer, inner, row and column strides in elements.
    strides: [usize; 4],
    /// The inner size (batch entry `b` reads outer index `b / inner`, inner index `b % inner`).
    inner: usize,
}

impl MaskSlot {
    /// `mask` bound for `op` (validated: rank 4, q's dtype).
    pub fn bind(backend: &WgpuBackend, mask: &AttentionMask, op: &str) -> Result<MaskSlot> {
        let values = &mask.values;
        let bound = bind_operand(&backend.ctx, &backend.table, values, op, None)?;
        let st = values.layout.strides();
        let strides = match st {
            [a, b, c, d] => [*a, *b, *c, *d],
            // No other rank reaches here (the mask is validated).
            _ => [0; 4],
        };
        Ok(MaskSlot {
            window: bound.window,
            offset: bound.element_offset as usize,
            strides,
            inner: mask.batch_split().1.max(1),
        })
    }

    /// Write the mask's addressing into `p`.
    pub fn put(&self, p: &mut ParamBlock) -> Result<()> {
        let [outer, inner, row, col] = self.strides;
        p.put_sizes(
            8 + 4 * MASK_SLOT,
            &[self.offset, outer, row, col],
            "attention mask stride",
        )?;
        p.put_sizes(MASK_WORDS, &[self.inner, inner], "attention mask stride")
    }
}

/// The WGSL of a mask of `dtype` at binding `binding`: `fn mask_base(b) -> u32`, the element
/// of `[b / inner, b % inner, 0, 0]`, and `fn mask2(base, row, col) -> f32`, the mask at
/// (`row`, `col`) from that base times log2(e) (the kernels' scores are in base 2).
pub(crate) fn accessors(binding: u32, dtype: DType) -> String {
    let mut text = wgsl::binding(binding, "b_mask", wgsl::storage_type(dtype));
    text.push_str(&wgsl::load_fn("ld_mask", "b_mask", dtype));
    text.push_str(&format!(
        "fn mask_base(b: u32) -> u32 {{
    let o = P.ops[{MASK_SLOT}u];
    return o.x + (b / P.mask.x) * o.y + (b % P.mask.x) * P.mask.y;
}}
fn mask2(base: u32, row: u32, col: u32) -> f32 {{
    let o = P.ops[{MASK_SLOT}u];
    return ld_mask(base + row * o.z + col * o.w) * 1.4426950408889634;
}}
"
    ));
    text
}

/// Refuse a masked kernel that binds `storage` buffers (the mask included) on an adapter that
/// allows fewer in one dispatch.
pub(crate) fn check_bindings(backend: &WgpuBackend, op: &str, dtype: DType, storage: usize) -> Result<()> {
    let ctx = &backend.ctx;
    if crate::ops::update_many::binding_cap(&ctx.limits) >= storage {
        return Ok(());
    }
    Err(Error::unsupported(
        op,
        dtype,
        ctx.cartage_device,
        format!(
            "the fused attention with an additive mask binds {storage} storage buffers in one dispatch; \
             this adapter allows {} (max_storage_buffers_per_shader_stage); the frontend composes it",
            ctx.limits.max_storage_buffers_per_shader_stage
        ),
    ))
}
