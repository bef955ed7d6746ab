// One optimizer step in place: every operand is contiguous and of one shape, so element i of the
// parameter, the gradient and the state sit at `P.offs + i` in their bindings (b1 the parameter,
// b2 the gradient, b3 and b4 the state the rule keeps). The rule's per-element constants come in
// `P.c` (computed on the host by cartage-core, rounded to the compute type {{T}}).
//
// `main_element` handles one element per invocation (f32, f64, f16 through the adapter's `f16`
// type, and packed f16/bf16 written with atomic and/or when an operand starts mid-word);
// `main_pairs` handles the two elements of one 32-bit word of each operand (packed f16/bf16
// whose operands all start on a word), so that no two invocations write one word.

{{ENABLE}}
{{PRELUDE}}

struct Params {
    count: u32,
    numel: u32,
    // Bit 0: Nesterov momentum; bit 1: the step that creates the momentum buffer.
    flags: u32,
    unused: u32,
    offs: vec4<u32>,
    c: array<vec4<{{T}}>, 2>,
}

@group(0) @binding(0) var<uniform> P: Params;

{{BINDINGS}}
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
    {{MAIN}}
}

//# adam
// Adam and AdamW: c[0] = (decay, l2, 1 − β₁, 1 − β₂), c[1] = (1/√(1 − β₂ᵗ), lr/(1 − β₁ᵗ), eps).
fn rule(p0: {{T}}, grad: {{T}}, m0: {{T}}, v0: {{T}}) -> Step {
    let g = grad + P.c[0].y * p0;
    let p = p0 * P.c[0].x;
    let m = m0 + P.c[0].z * (g - m0);
    let v = v0 + P.c[0].w * (g * g - v0);
    return Step(p - P.c[1].y * m / (sqrt(v) * P.c[1].x + P.c[1].z), m, v);
}
//# sgd
// SGD without momentum: c[0] = (lr, weight decay).
fn rule(p: {{T}}, grad: {{T}}, unused0: {{T}}, unused1: {{T}}) -> Step {
    return Step(p - P.c[0].x * (grad + P.c[0].y * p), unused0, unused1);
}
//# sgd_momentum
// SGD with momentum: c[0] = (lr, weight decay, momentum, 1 − dampening). The buffer is stored
// rounded, and the step uses the rounded buffer, as a composed update reads it back.
fn rule(p: {{T}}, grad: {{T}}, b0: {{T}}, unused: {{T}}) -> Step {
    let g = grad + P.c[0].y * p;
    var b = P.c[0].z * b0 + P.c[0].w * g;
    if (P.flags & 2u) != 0u {
        b = g;
    }
    let kept = rounded(b);
    var d = kept;
    if (P.flags & 1u) != 0u {
        d = g + P.c[0].z * kept;
    }
    return Step(p - P.c[0].x * d, b, unused);
}
//# main_element
let r = rule(ld_p(P.offs.x + t), ld_g(P.offs.y + t), ld_first(P.offs.z + t), ld_second(P.offs.w + t));
    st_p(P.offs.x + t, r.p);
    st_first(P.offs.z + t, r.first);
    st_second(P.offs.w + t, r.second);
//# main_pairs
let w = (P.offs >> vec4<u32>(1u)) + vec4<u32>(t);
    let p = ld2_p(w.x);
    let g = ld2_g(w.y);
    let first = ld2_first(w.z);
    let second = ld2_second(w.w);
    let lo = rule(p.x, g.x, first.x, second.x);
    var hi = lo;
    // The last word of an odd count holds one element of ours; its other half stays as it is.
    let both = 2u * t + 1u < P.numel;
    if both {
        hi = rule(p.y, g.y, first.y, second.y);
    }
    st2_p(w.x, lo.p, hi.p, both);
    st2_first(w.z, lo.first, hi.first, both);
    st2_second(w.w, lo.second, hi.second, both);
