// One optimizer step over many parameters in one dispatch (the multi-tensor update). The sets'
// operands live in bindings b1..bN (operands of one segment share a binding); the table `tbl`
// holds one row of eight words per set, from word `P.table`:
//   [0] the set's first workgroup (every set starts on a whole workgroup),
//   [1] its element count,
//   [2..6] the element offsets of its parameter, gradient, first and second state in their
//          bindings,
//   [6] the bindings of those four operands (0-based), one byte each from the lowest.
// Each invocation finds its set by a binary search over the first workgroups, then runs the
// single update's per-element code (`shaders/update.wgsl`'s rule, with the same constants in
// `P.c`), so every element gets the bits `Update` gives it.
//
// `main_element` handles one element per invocation (f32, f64, f16 through the adapter's `f16`
// type, and packed f16/bf16 written with atomic and/or when an operand starts mid-word);
// `main_pairs` handles one 32-bit word of each operand (packed f16/bf16 whose operands all
// start on a word).

{{ENABLE}}
{{PRELUDE}}

struct Params {
    // Invocations of the dispatch.
    count: u32,
    // Sets of this dispatch.
    sets: u32,
    // Bit 0: Nesterov momentum; bit 1: the step that creates the momentum buffer.
    flags: u32,
    // The first word of this dispatch's rows in `tbl`.
    table: u32,
    unused: vec4<u32>,
    c: array<vec4<{{T}}>, 2>,
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}
@group(0) @binding({{TABLE}}) var<storage, read_write> tbl: array<u32>;

// The set of this invocation: its operands' element offsets and bindings.
var<private> S_offs: vec4<u32>;
var<private> S_bind: vec4<u32>;

{{ACCESSORS}}

// The results of one element: the parameter and the two state values.
struct Step {
    p: {{T}},
    first: {{T}},
    second: {{T}},
}

{{RULE}}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= P.count {
        return;
    }
    // The last set whose first workgroup is at or before this one (row `lo`).
    let wg = t >> 8u;
    var lo = 0u;
    var hi = P.sets;
    loop {
        if hi - lo <= 1u {
            break;
        }
        let mid = (lo + hi) >> 1u;
        if tbl[P.table + 8u * mid] <= wg {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let row = P.table + 8u * lo;
    let i = t - (tbl[row] << 8u);
    let numel = tbl[row + 1u];
    S_offs = vec4<u32>(tbl[row + 2u], tbl[row + 3u], tbl[row + 4u], tbl[row + 5u]);
    S_bind = (vec4<u32>(tbl[row + 6u]) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    {{MAIN}}
}

//# main_element
if i >= numel {
        return;
    }
    let r = rule(ld_p(S_offs.x + i), ld_g(S_offs.y + i), ld_first(S_offs.z + i), ld_second(S_offs.w + i));
    st_p(S_offs.x + i, r.p);
    st_first(S_offs.z + i, r.first);
    st_second(S_offs.w + i, r.second);
//# main_pairs
if 2u * i >= numel {
        return;
    }
    let w = (S_offs >> vec4<u32>(1u)) + vec4<u32>(i);
    let p = ld2_p(w.x);
    let g = ld2_g(w.y);
    let first = ld2_first(w.z);
    let second = ld2_second(w.w);
    let lo_step = rule(p.x, g.x, first.x, second.x);
    var hi_step = lo_step;
    // The last word of an odd count holds one element of ours; its other half stays as it is.
    let both = 2u * i + 1u < numel;
    if both {
        hi_step = rule(p.y, g.y, first.y, second.y);
    }
    st2_p(w.x, lo_step.p, hi_step.p, both);
    st2_first(w.z, lo_step.first, hi_step.first, both);
    st2_second(w.w, lo_step.second, hi_step.second, both);
