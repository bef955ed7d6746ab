// Fused scaled dot-product attention forward (FlashAttention-2 style): one workgroup per batch
// entry and tile of BR query rows, TPR invocations per row. The query tile stays in workgroup
// memory; tiles of BC keys, then their values, stream through one shared tile. Scores are
// computed in f32 with scale·log2(e) folded in, so the online softmax (a running maximum per
// row, shared by the row's invocations, and per-invocation partial sums rescaled with it) uses
// exp2. Invocation t of a row owns the keys j ≡ t (mod TPR) of each tile for the scores and
// the output chunks c ≡ t (mod TPR) (four columns each) for the accumulation. The output is
// written once, divided by the row's sum, and with an `lse` operand each row's natural
// log-sum-exp (−inf for no key). A row that sees no key is EMPTY_ROW: 0 / 0 = NaN unmasked
// (S = 0), 0 with a mask (every key removed by −inf).
// Causal (top-left: key j masked for query i when j > i): key tiles past the tile's last row
// are skipped. Tiles are taken heaviest first (the last query tiles see the most keys).
// Additive mask (built in only with one, MASK_BASE and MASK_SCORE): each key the causal cut
// keeps gets mask[b, row, j]·log2(e) added to its base-2 score (`mask2`).
// Slots (`P.ops`, element offset and batch, row and column strides): 0 q (b1), 1 k (b2), 2 v
// (b3), 3 out (b4), 4 lse (b5, optional), 7 the mask (the binding after the others, optional).

{{PRELUDE}}

{{PARAMS}}

{{BINDINGS}}

{{ACCESSORS}}

{{CONSTS}}

// Rows padded to an odd number of chunks (PS: one more than BC), so that the rows the
// invocations of a warp read at once fall in different banks.
var<workgroup> q_sh: array<vec4<f32>, BR * ES>;
var<workgroup> kv_sh: array<vec4<f32>, BC * KVS>;
var<workgroup> p_sh: array<f32, BR * PS>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let batch = P.sizes.x;
    let L = P.sizes.y;
    let S = P.sizes.z;
    let tiles = P.sizes.w;
    let flat = wid.x + wid.y * nwg.x;
    if flat >= batch * tiles {
        return;
    }
    let causal = P.misc.x != 0u;
    let scale_log2 = bitcast<f32>(P.misc.y);
    let b = flat % batch;
    let m0 = (tiles - 1u - flat / batch) * BR;
    let r = lid / TPR;
    let t = lid % TPR;
    let row = m0 + r;
    {{MASK_BASE}}

    for (var i = lid; i < BR * E4; i = i + WG) {
        let rr = i / E4;
        var v = vec4<f32>();
        if m0 + rr < L {
            v = chunk_q(b, m0 + rr, i % E4);
        }
        q_sh[rr * ES + i % E4] = v;
    }

    var m = -inf_f32();
    var l = 0.0;
    var o: array<vec4<f32>, CPT>;
    var s: array<f32, KPT>;
    var n_end = S;
    if causal {
        n_end = min(S, m0 + BR);
    }
    for (var n0 = 0u; n0 < n_end; n0 = n0 + BC) {
        workgroupBarrier();
        for (var i = lid; i < BC * E4; i = i + WG) {
            let j = i / E4;
            var v = vec4<f32>();
            if n0 + j < S {
                v = chunk_k(b, n0 + j, i % E4);
            }
            kv_sh[j * KVS + i % E4] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < KPT; kk = kk + 1u) {
            s[kk] = 0.0;
        }
        for (var c = 0u; c < E4; c = c + 1u) {
            let qv = q_sh[r * ES + c];
            for (var kk = 0u; kk < KPT; kk = kk + 1u) {
                s[kk] = s[kk] + dot(qv, kv_sh[(kk * TPR + t) * KVS + c]);
            }
        }
        var tile_max = -inf_f32();
        for (var kk = 0u; kk < KPT; kk = kk + 1u) {
            let j = n0 + kk * TPR + t;
            var x = s[kk] * scale_log2;
            if j >= S || (causal && j > row) {
                x = -inf_f32();
            }{{MASK_SCORE}}
            s[kk] = x;
            tile_max = max(tile_max, x);
        }
        red[lid] = tile_max;
        workgroupBarrier();
        // Every invocation of the row reads the same values in the same order: one maximum.
        var mx = m;
        for (var u = 0u; u < TPR; u = u + 1u) {
            mx = max(mx, red[r * TPR + u]);
        }
        let mu = select(mx, 0.0, mx == -inf_f32());
        let corr = exp2(m - mu);
        m = mx;
        var part = 0.0;
        for (var kk = 0u; kk < KPT; kk = kk + 1u) {
            let p = exp2(s[kk] - mu);
            p_sh[r * PS + kk * TPR + t] = p;
            part = part + p;
        }
        l = l * corr + part;
        for (var c = 0u; c < CPT; c = c + 1u) {
            o[c] = o[c] * corr;
        }
        // The keys are read: the values take their place.
        for (var i = lid; i < BC * EV4; i = i + WG) {
            let j = i / EV4;
            var v = vec4<f32>();
            if n0 + j < S {
                v = chunk_v(b, n0 + j, i % EV4);
            }
            kv_sh[j * KVS + i % EV4] = v;
        }
        workgroupBarrier();
        for (var j = 0u; j < BC; j = j + 1u) {
            let p = p_sh[r * PS + j];
            for (var c = 0u; c < CPT; c = c + 1u) {
                let ch = c * TPR + t;
                if ch < EV4 {
                    o[c] = o[c] + p * kv_sh[j * KVS + ch];
                }
            }
        }
    }
    workgroupBarrier();
    red[lid] = l;
    workgroupBarrier();
    var total = 0.0;
    for (var u = 0u; u < TPR; u = u + 1u) {
        total = total + red[r * TPR + u];
    }
    if row >= L {
        return;
    }
    // A row that sees no key.
    let inv = select(1.0 / total, {{EMPTY_ROW}}, total == 0.0);
    for (var c = 0u; c < CPT; c = c + 1u) {
        let ch = c * TPR + t;
        if ch < EV4 {
            st4_out(at(3u, b, row, 4u * ch), o[c] * inv, min(4u, EV - 4u * ch));
        }
    }
    {{LSE}}
}

//# lse
if t == 0u {
        // ln Σ exp(scale·s) = ln 2 · (m + log2 Σ exp2(scale·log2(e)·s − m)); −inf for no key.
        let lse = select((m + log2(total)) * 0.6931471805599453, -inf_f32(), total == 0.0);
        st_lse(P.ops[4].x + b * P.ops[4].y + row * P.ops[4].z, lse);
    }

//# mask_base
let mb = mask_base(b);

//# mask_score
 else if row < L {
                x = x + mask2(mb, row, j);
            }
