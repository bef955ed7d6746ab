// The pieces the matmul generator (src/ops/matmul.rs) assembles into shaders/matmul.wgsl. Each
// piece starts at a `//# name` line and runs to the next one; `{{NAME}}` placeholders are filled
// by `wgsl::Template`, which refuses a piece with a placeholder left unfilled.

//# fetch_a_vec4
for (var s = 0u; s < LA; s = s + 1u) {
        let v = lid + s * THREADS;
        let m = v / (BK / 4u);
        let kq = v % (BK / 4u);
        let row = row0 + m;
        let kk = k0 + kq * 4u;
        if row < P.m && kk < P.k {
            let w = a4[(a_base + row * P.a_sm + kk) >> 2u];
            ra[s] = {{UNPACK}};
        } else {
            ra[s] = vec4<{{T}}>();
        }
    }
//# deposit_a_vec4
for (var s = 0u; s < LA; s = s + 1u) {
        let v = lid + s * THREADS;
        let m = v / (BK / 4u);
        let kq = v % (BK / 4u);
        for (var c = 0u; c < 4u; c = c + 1u) {
            As[sa + (kq * 4u + c) * (BM / 4u) + m / 4u][m % 4u] = ra[s][c];
        }
    }
//# fetch_a_scalar
for (var s = 0u; s < LA; s = s + 1u) {
        let v = lid + s * THREADS;
        {{INDEX}}
        let row = row0 + m;
        let kk = k0 + k;
        if row < P.m && kk < P.k {
            ra[s] = {{CONV}}(lda(a_base + row * P.a_sm + kk * P.a_sk));
        } else {
            ra[s] = {{T}}();
        }
    }
//# deposit_a_scalar
for (var s = 0u; s < LA; s = s + 1u) {
        let v = lid + s * THREADS;
        {{INDEX}}
        As[sa + k * (BM / 4u) + m / 4u][m % 4u] = ra[s];
    }
//# index_a_inner_fast
let m = v / BK;
        let k = v % BK;
//# index_a_outer_fast
let m = v % BM;
        let k = v / BM;
//# fetch_b_vec4
for (var s = 0u; s < LB; s = s + 1u) {
        let v = lid + s * THREADS;
        let k = v / (BN / 4u);
        let nq = v % (BN / 4u);
        let col = col0 + nq * 4u;
        let kk = k0 + k;
        if kk < P.k && col < P.n {
            let w = b4[(b_base + kk * P.b_sk + col) >> 2u];
            rb[s] = {{UNPACK}};
        } else {
            rb[s] = vec4<{{T}}>();
        }
    }
//# deposit_b_vec4
for (var s = 0u; s < LB; s = s + 1u) {
        let v = lid + s * THREADS;
        Bs[sb + (v / (BN / 4u)) * (BN / 4u) + v % (BN / 4u)] = rb[s];
    }
//# fetch_b_scalar
for (var s = 0u; s < LB; s = s + 1u) {
        let v = lid + s * THREADS;
        {{INDEX}}
        let col = col0 + n;
        let kk = k0 + k;
        if kk < P.k && col < P.n {
            rb[s] = {{CONV}}(ldb(b_base + kk * P.b_sk + col * P.b_sn));
        } else {
            rb[s] = {{T}}();
        }
    }
//# deposit_b_scalar
for (var s = 0u; s < LB; s = s + 1u) {
        let v = lid + s * THREADS;
        {{INDEX}}
        Bs[sb + k * (BN / 4u) + n / 4u][n % 4u] = rb[s];
    }
//# index_b_inner_fast
let k = v / BN;
        let n = v % BN;
//# index_b_outer_fast
let k = v % BK;
        let n = v / BK;
//# store_vec4
if c < P.n {
            c4[(c_base + r * P.c_sm + c) >> 2u] = v;
        }
//# store_scalar
for (var q = 0u; q < 4u; q = q + 1u) {
            if c + q < P.n {
                c1[c_base + r * P.c_sm + c + q] = v[q];
            }
        }
//# acc_decl
var acc_{{I}}_{{J}} = vec4<{{T}}>();
    
//# load_a
let a{{G}} = As[sa + kk * (BM / 4u) + {{G}}u * WY + ty];
            
//# load_b
let b{{J}} = Bs[sb + kk * (BN / 4u) + {{J}}u * WX + tx];
            
//# splat
let s{{I}} = vec4<{{T}}>(a{{G}}.{{LANE}});
            
//# fma
acc_{{I}}_{{J}} = fma(s{{I}}, b{{J}}, acc_{{I}}_{{J}});
            
//# store_row_open
if row0 + {{G}}u * (WY * 4u) + ty * 4u + {{Q}}u < P.m {
        let r = row0 + {{G}}u * (WY * 4u) + ty * 4u + {{Q}}u;

//# store_block
        {
        let c = col0 + {{J}}u * (WX * 4u) + tx * 4u;
        let v = acc_{{I}}_{{J}};
        {{STORE}}
        }

//# store_row_close
    }
    

//# loop_one_stage
let sa = 0u;
    let sb = 0u;
    fetch(0u, a_base, b_base, row0, col0, lid);
    deposit(lid, 0u, 0u);
    workgroupBarrier();
    for (var k0 = 0u; k0 < P.k; k0 = k0 + BK) {
        let next = k0 + BK < P.k;
        if next {
            fetch(k0 + BK, a_base, b_base, row0, col0, lid);
        }
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            {{INNER}}
        }
        workgroupBarrier();
        if next {
            deposit(lid, 0u, 0u);
            workgroupBarrier();
        }
    }
//# loop_two_stages
fetch(0u, a_base, b_base, row0, col0, lid);
    deposit(lid, 0u, 0u);
    workgroupBarrier();
    var stage = 0u;
    for (var k0 = 0u; k0 < P.k; k0 = k0 + BK) {
        let next = k0 + BK < P.k;
        if next {
            fetch(k0 + BK, a_base, b_base, row0, col0, lid);
        }
        let sa = stage * A_TILE;
        let sb = stage * B_TILE;
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            {{INNER}}
        }
        // The other buffer was last read before the previous barrier.
        if next {
            deposit(lid, (1u - stage) * A_TILE, (1u - stage) * B_TILE);
        }
        workgroupBarrier();
        stage = 1u - stage;
    }
