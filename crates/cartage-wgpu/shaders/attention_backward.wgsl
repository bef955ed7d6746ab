// The FlashAttention-2 backward of scaled dot-product attention, in three kernels that share
// this head (the pieces below are the kernels' bodies):
// - `rows`: one invocation per query row: D_i = dO_i · O_i and the row's log-sum-exp in base 2
//   into the f32 scratch `aux` (lse₂ at [0, B·L), D at [B·L, 2·B·L)); a row that sees no key
//   (lse −inf) gets lse₂ = +inf, so that every P_ij of it is exp2(−inf) = 0, never
//   exp2(−inf − (−inf)) = NaN, and it adds nothing to any gradient (its O is 0, so D is 0).
// - `keys`: one workgroup per batch entry and tile of BC keys, TPR invocations per key; the key
//   and value tiles stay in workgroup memory while the query tiles that see them stream
//   through (with their dO rows, lse₂ and D). Each pair recomputes P_ij = exp2(scale·log2(e)·
//   q_i·k_j − lse₂_i), dP_ij = dO_i·v_j and dS_ij = P_ij·(dP_ij − D_i); dV_j += Σ_i P_ij dO_i and
//   dK_j += Σ_i dS_ij q_i accumulate in registers (invocation t owns the four-column chunks
//   c ≡ t (mod TPR)) and are written once, dK times the scale.
// - `queries`: one workgroup per batch entry and tile of BR query rows, TPR invocations per
//   row; the key and value tiles stream through, dS is recomputed the same way and dQ_i +=
//   Σ_j dS_ij k_j accumulates in registers, written once times the scale. No atomics: every
//   gradient element has one writer, so the result does not depend on scheduling.
// Masked pairs (causal j > i, rows past L, keys past S) have P = 0. Everything is in f32.
// Additive mask (built in only with one, MASK_BASE and MASK_SCORE): each pair the causal cut
// keeps gets mask[b, i, j]·log2(e) added to its base-2 score before P is recomputed, the same
// mask as the forward's (read through slot 7 and the binding after the others); −inf gives
// P = 0.

{{PRELUDE}}

{{PARAMS}}

{{BINDINGS}}

{{ACCESSORS}}

{{CONSTS}}

//# rows
// Slots: 0 dO (b1), 1 O (b2), 2 the forward's lse (b3, f32 [B·L] from its offset), 3 aux (b4).
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let L = P.sizes.y;
    let rows = P.misc.w;
    let flat = (wid.x + wid.y * nwg.x) * 256u + lid;
    if flat >= rows {
        return;
    }
    let b = flat / L;
    let i = flat % L;
    let gb = at(0u, b, i, 0u);
    let ob = at(1u, b, i, 0u);
    var d = 0.0;
    for (var c = 0u; c < EV; c = c + 1u) {
        d = d + ld_g(gb + c * P.ops[0].w) * ld_o(ob + c * P.ops[1].w);
    }
    let lse = ld_lse(P.ops[2].x + flat);
    aux[P.ops[3].x + flat] = select(lse * 1.4426950408889634, inf_f32(), lse == -inf_f32());
    aux[P.ops[3].x + rows + flat] = d;
}

//# keys
// Slots: 0 q (b1), 1 k (b2), 2 v (b3), 3 dO (b4), 4 aux (b5), 5 dK (b6), 6 dV (b7).
// Rows padded to an odd number of chunks (PS: one more than BR), so that the rows the
// invocations of a warp read at once fall in different banks.
var<workgroup> k_sh: array<vec4<f32>, BC * ES>;
var<workgroup> v_sh: array<vec4<f32>, BC * EVS>;
var<workgroup> q_sh: array<vec4<f32>, BR * ES>;
var<workgroup> g_sh: array<vec4<f32>, BR * EVS>;
var<workgroup> p_sh: array<f32, BC * PS>;
var<workgroup> ds_sh: array<f32, BC * PS>;
var<workgroup> lse_sh: array<f32, BR>;
var<workgroup> d_sh: array<f32, BR>;

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
    let rows = P.misc.w;
    let b = flat % batch;
    let n0 = (flat / batch) * BC;
    let j = lid / TPR;
    let t = lid % TPR;
    let key = n0 + j;
    {{MASK_BASE}}

    for (var i = lid; i < BC * E4; i = i + WG) {
        var x = vec4<f32>();
        if n0 + i / E4 < S {
            x = chunk_k(b, n0 + i / E4, i % E4);
        }
        k_sh[i / E4 * ES + i % E4] = x;
    }
    for (var i = lid; i < BC * EV4; i = i + WG) {
        var x = vec4<f32>();
        if n0 + i / EV4 < S {
            x = chunk_v(b, n0 + i / EV4, i % EV4);
        }
        v_sh[i / EV4 * EVS + i % EV4] = x;
    }

    var dk: array<vec4<f32>, CKT>;
    var dv: array<vec4<f32>, CVT>;
    var s: array<f32, RPT>;
    var dp: array<f32, RPT>;
    // Causal: the first query tile holding a row that sees key n0.
    var m_start = 0u;
    if causal {
        m_start = n0 / BR * BR;
    }
    for (var m0 = m_start; m0 < L; m0 = m0 + BR) {
        workgroupBarrier();
        for (var i = lid; i < BR * E4; i = i + WG) {
            var x = vec4<f32>();
            if m0 + i / E4 < L {
                x = chunk_q(b, m0 + i / E4, i % E4);
            }
            q_sh[i / E4 * ES + i % E4] = x;
        }
        for (var i = lid; i < BR * EV4; i = i + WG) {
            var x = vec4<f32>();
            if m0 + i / EV4 < L {
                x = chunk_g(b, m0 + i / EV4, i % EV4);
            }
            g_sh[i / EV4 * EVS + i % EV4] = x;
        }
        for (var i = lid; i < BR; i = i + WG) {
            var lse2 = 0.0;
            var d = 0.0;
            if m0 + i < L {
                let at_row = P.ops[4].x + b * L + m0 + i;
                lse2 = aux[at_row];
                d = aux[at_row + rows];
            }
            lse_sh[i] = lse2;
            d_sh[i] = d;
        }
        workgroupBarrier();
        for (var ii = 0u; ii < RPT; ii = ii + 1u) {
            s[ii] = 0.0;
            dp[ii] = 0.0;
        }
        for (var c = 0u; c < E4; c = c + 1u) {
            let kv = k_sh[j * ES + c];
            for (var ii = 0u; ii < RPT; ii = ii + 1u) {
                s[ii] = s[ii] + dot(kv, q_sh[(ii * TPR + t) * ES + c]);
            }
        }
        for (var c = 0u; c < EV4; c = c + 1u) {
            let vv = v_sh[j * EVS + c];
            for (var ii = 0u; ii < RPT; ii = ii + 1u) {
                dp[ii] = dp[ii] + dot(vv, g_sh[(ii * TPR + t) * EVS + c]);
            }
        }
        for (var ii = 0u; ii < RPT; ii = ii + 1u) {
            let i = ii * TPR + t;
            let row = m0 + i;
            let seen = key < S && row < L && !(causal && key > row);
            var x = s[ii] * scale_log2;
            {{MASK_SCORE}}
            let p = select(0.0, exp2(x - lse_sh[i]), seen);
            p_sh[j * PS + i] = p;
            ds_sh[j * PS + i] = p * (dp[ii] - d_sh[i]);
        }
        workgroupBarrier();
        for (var i = 0u; i < BR; i = i + 1u) {
            let p = p_sh[j * PS + i];
            let ds = ds_sh[j * PS + i];
            for (var c = 0u; c < CVT; c = c + 1u) {
                let ch = c * TPR + t;
                if ch < EV4 {
                    dv[c] = dv[c] + p * g_sh[i * EVS + ch];
                }
            }
            for (var c = 0u; c < CKT; c = c + 1u) {
                let ch = c * TPR + t;
                if ch < E4 {
                    dk[c] = dk[c] + ds * q_sh[i * ES + ch];
                }
            }
        }
    }
    if key >= S {
        return;
    }
    let scale = bitcast<f32>(P.misc.z);
    for (var c = 0u; c < CKT; c = c + 1u) {
        let ch = c * TPR + t;
        if ch < E4 {
            st4_a(at(5u, b, key, 4u * ch), dk[c] * scale, min(4u, E - 4u * ch));
        }
    }
    for (var c = 0u; c < CVT; c = c + 1u) {
        let ch = c * TPR + t;
        if ch < EV4 {
            st4_b(at(6u, b, key, 4u * ch), dv[c], min(4u, EV - 4u * ch));
        }
    }
}

//# queries
// Slots: 0 q (b1), 1 k (b2), 2 v (b3), 3 dO (b4), 4 aux (b5), 5 dQ (b6).
// Rows padded as in `keys` (PS: one more than BC).
var<workgroup> k_sh: array<vec4<f32>, BC * ES>;
var<workgroup> v_sh: array<vec4<f32>, BC * EVS>;
var<workgroup> q_sh: array<vec4<f32>, BR * ES>;
var<workgroup> g_sh: array<vec4<f32>, BR * EVS>;
var<workgroup> ds_sh: array<f32, BR * PS>;

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
    let rows = P.misc.w;
    let b = flat % batch;
    let m0 = (tiles - 1u - flat / batch) * BR;
    let r = lid / TPR;
    let t = lid % TPR;
    let row = m0 + r;
    {{MASK_BASE}}

    for (var i = lid; i < BR * E4; i = i + WG) {
        var x = vec4<f32>();
        if m0 + i / E4 < L {
            x = chunk_q(b, m0 + i / E4, i % E4);
        }
        q_sh[i / E4 * ES + i % E4] = x;
    }
    for (var i = lid; i < BR * EV4; i = i + WG) {
        var x = vec4<f32>();
        if m0 + i / EV4 < L {
            x = chunk_g(b, m0 + i / EV4, i % EV4);
        }
        g_sh[i / EV4 * EVS + i % EV4] = x;
    }
    var lse2 = 0.0;
    var d = 0.0;
    if row < L {
        let at_row = P.ops[4].x + b * L + row;
        lse2 = aux[at_row];
        d = aux[at_row + rows];
    }

    var dq: array<vec4<f32>, CQT>;
    var s: array<f32, KPT>;
    var dp: array<f32, KPT>;
    var n_end = S;
    if causal {
        n_end = min(S, m0 + BR);
    }
    for (var n0 = 0u; n0 < n_end; n0 = n0 + BC) {
        workgroupBarrier();
        for (var i = lid; i < BC * E4; i = i + WG) {
            var x = vec4<f32>();
            if n0 + i / E4 < S {
                x = chunk_k(b, n0 + i / E4, i % E4);
            }
            k_sh[i / E4 * ES + i % E4] = x;
        }
        for (var i = lid; i < BC * EV4; i = i + WG) {
            var x = vec4<f32>();
            if n0 + i / EV4 < S {
                x = chunk_v(b, n0 + i / EV4, i % EV4);
            }
            v_sh[i / EV4 * EVS + i % EV4] = x;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < KPT; kk = kk + 1u) {
            s[kk] = 0.0;
            dp[kk] = 0.0;
        }
        for (var c = 0u; c < E4; c = c + 1u) {
            let qv = q_sh[r * ES + c];
            for (var kk = 0u; kk < KPT; kk = kk + 1u) {
                s[kk] = s[kk] + dot(qv, k_sh[(kk * TPR + t) * ES + c]);
            }
        }
        for (var c = 0u; c < EV4; c = c + 1u) {
            let gv = g_sh[r * EVS + c];
            for (var kk = 0u; kk < KPT; kk = kk + 1u) {
                dp[kk] = dp[kk] + dot(gv, v_sh[(kk * TPR + t) * EVS + c]);
            }
        }
        for (var kk = 0u; kk < KPT; kk = kk + 1u) {
            let j = kk * TPR + t;
            let key = n0 + j;
            let seen = key < S && row < L && !(causal && key > row);
            var x = s[kk] * scale_log2;
            {{MASK_SCORE}}
            let p = select(0.0, exp2(x - lse2), seen);
            ds_sh[r * PS + j] = p * (dp[kk] - d);
        }
        workgroupBarrier();
        for (var j = 0u; j < BC; j = j + 1u) {
            let ds = ds_sh[r * PS + j];
            for (var c = 0u; c < CQT; c = c + 1u) {
                let ch = c * TPR + t;
                if ch < E4 {
                    dq[c] = dq[c] + ds * k_sh[j * ES + ch];
                }
            }
        }
    }
    if row >= L {
        return;
    }
    let scale = bitcast<f32>(P.misc.z);
    for (var c = 0u; c < CQT; c = c + 1u) {
        let ch = c * TPR + t;
        if ch < E4 {
            st4_a(at(5u, b, row, 4u * ch), dq[c] * scale, min(4u, E - 4u * ch));
        }
    }
}

//# mask_base
let mb = mask_base(b);

//# mask_score
if seen {
                x = x + mask2(mb, row, key);
            }
