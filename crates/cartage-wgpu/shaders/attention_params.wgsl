// The parameters of the attention kernels (`attention.wgsl`, `attention_backward.wgsl`):
// `sizes` (batch, L, S, tiles per batch entry), `misc` (causal, scale·log2(e) and scale as f32
// bits, rows B·L), and per operand slot its element offset and batch, row and column strides.
// A kernel built with the additive mask reads it through slot 7 (its element offset, outer,
// row and column strides) and `mask` (inner, the inner stride): batch entry b reads
// mask[b / inner, b % inner, i, j].
struct Params {
    sizes: vec4<u32>,
    misc: vec4<u32>,
    ops: array<vec4<u32>, 8>,
    mask: vec4<u32>,
    unused: array<vec4<u32>, 5>,
}

@group(0) @binding(0) var<uniform> P: Params;

// The element index of (b, row, col) of the operand in `slot`.
fn at(slot: u32, b: u32, row: u32, col: u32) -> u32 {
    let o = P.ops[slot];
    return o.x + b * o.y + row * o.z + col * o.w;
}
