// attention_f32_backward.cu: the tiled (FlashAttention-2-style) backward of scaled dot-product
// attention in f32 on the CUDA cores, exact f32 FMAs (no TF32), head dims D (= E = Ev) that are
// multiples of 16 from 32 to 128. It needs the forward's output O and per-row natural
// log-sum-exp (Kernel::Attention's `lse`), so that the probabilities P = exp(scale q_i.k_j -
// lse_i) are recomputed tile by tile and nothing of size L x S is stored. q, k, v, the incoming
// gradient dO and O are read in place (dense last dimension, batch and row strides multiples of
// 4 elements, 16-byte aligned bases); grad_q, grad_k and grad_v are contiguous [B, L|S, D],
// 16-byte aligned. Two launches:
// - `attention_f32_backward_prep`: a thread per query row: D_i = dO_i.O_i into a [B, L] scratch
//   row; and grad_q zeroed (the main kernel adds into it).
// q, k, v (and, backward, dO and O) are [B, rows, D] or [B1, B2, rows, D], the heads of a packed
// projection read in place: batch entry b starts at att_batch(b, heads, ..) (attention_mma.cuh).
// - `attention_f32_backward_d<D>`: one block of AB_NT = 256 threads per (batch, tile of AB_BN =
//   64 keys); K and V stay in shared memory while the block walks the query tiles of AB_BM = 64
//   rows that see its keys (from the diagonal on when causal, so fully masked tiles are
//   skipped). Thread (tx, ty) = (t % 16, t / 16) owns keys 4 ty .. 4 ty + 3 of the tile: of
//   Sᵀ = K Qᵀ and dPᵀ = V dOᵀ the queries tx + 16 c (c < 4), of dK and dV (in registers for the
//   whole walk) the columns `af_col`. Pᵀ = exp2(scale·log2(e) Sᵀ - lse·log2(e)) and dSᵀ = Pᵀ ∘
//   (dPᵀ - D) go through the thread's half-warp rows of a shared [BN, BM] tile to dV += Pᵀ dO
//   and dK += dSᵀ Q; the whole dSᵀ tile then gives the block's share of dQ = dS K (thread:
//   queries 4 ty .. 4 ty + 3), added to grad_q, scaled, with f32 atomics.
// A key that no query sees (causal, j >= L; or L = 0) gets zero grad_k and grad_v; a query that
// sees no key (S = 0) keeps the zero grad_q of the preprocess. The accumulation order of dQ's
// atomics varies from run to run (the last bits of grad_q may differ); grad_k and grad_v have one
// writer per element.
// `attention_f32_backward_masked_d<D>` adds the forward's f32 mask (AttnMask of
// attention_mma.cuh) to the recomputed scores; a row whose keys the mask removed (its lse is
// −inf) gets zero probabilities, so zero gradients, as the forward's zero output.

#define AB_BM 64   // query rows per tile
#define AB_BN 64   // keys per block
#define AB_NT 256  // threads per block

// Mirrors `F32BwdArgs` in src/launch/attention_f32_backward.rs.
struct AttnF32BwdArgs {
    u64 q;
    u64 k;
    u64 v;
    u64 grad;
    u64 out;
    u64 lse;     // [B, L] f32, natural log
    u64 grad_q;  // [B, L, D] contiguous, accumulated into
    u64 grad_k;  // [B, S, D] contiguous
    u64 grad_v;  // [B, S, D] contiguous
    u64 delta;   // [B, L] f32 scratch
    i64 q_batch;
    i64 q_row;
    i64 k_batch;
    i64 k_row;
    i64 v_batch;
    i64 v_row;
    i64 g_batch;
    i64 g_row;
    i64 o_batch;
    i64 o_row;
    i64 q_inner;  // inner batch strides of [B1, B2, rows, D] operands (0 for [B, rows, D])
    i64 k_inner;
    i64 v_inner;
    i64 g_inner;
    i64 o_inner;
    u32 batch;
    u32 l;
    u32 s;
    u32 d;  // head dim
    f32 scale;
    f32 scale_log2;
    i32 causal;
    u32 heads;  // B2 (1 for [B, rows, D] operands)
};

// The dynamic shared memory, byte offsets: K, V [BN, D + 4], Q, dO [BM, D + 4], the Pᵀ / dSᵀ tile
// [BN, BM + 4], then the tile's lse (base 2) and D rows of BM floats. Mirrors `smem_bytes` in
// src/launch/attention_f32_backward.rs.
template <int D> struct AbSmem {
    static constexpr int DP = D + 4;
    static constexpr int RP = AB_BM + 4;
    static constexpr u32 K = 0;
    static constexpr u32 V = K + AB_BN * DP * 4;
    static constexpr u32 Q = V + AB_BN * DP * 4;
    static constexpr u32 G = Q + AB_BM * DP * 4;
    static constexpr u32 R = G + AB_BM * DP * 4;
    static constexpr u32 LSE = R + AB_BN * RP * 4;
    static constexpr u32 DL = LSE + AB_BM * 4;
    static constexpr u32 BYTES = DL + AB_BM * 4;
};

extern "C" __global__ void __launch_bounds__(256) attention_f32_backward_prep(AttnF32BwdArgs a) {
    const u64 rows = (u64)a.batch * a.l;
    const int d4 = (int)a.d / 4;
    for (u64 r = global_thread(); r < rows; r += grid_threads()) {
        const u64 b = r / a.l, i = r % a.l;
        const float4* g = (const float4*)((const float*)a.grad + att_batch((u32)b, a.heads, a.g_batch, a.g_inner) + (i64)i * a.g_row);
        const float4* o = (const float4*)((const float*)a.out + att_batch((u32)b, a.heads, a.o_batch, a.o_inner) + (i64)i * a.o_row);
        // In the order the main kernel sums dO_i.v_j: where O_i = v_j (one key seen), dS = 0
        // exactly.
        float dot = 0.f;
        for (int x = 0; x < d4; ++x) dot = af_dot4(o[x], g[x], dot);
        ((float*)a.delta)[r] = dot;
    }
    const u64 n4 = rows * (u64)d4;
    const float4 zero = {0.f, 0.f, 0.f, 0.f};
    for (u64 x = global_thread(); x < n4; x += grid_threads()) ((float4*)a.grad_q)[x] = zero;
}

template <int D, bool MASK>
__device__ __forceinline__ void attention_f32_bwd(const AttnF32BwdArgs& a, const AttnMask& m) {
    typedef AbSmem<D> SM;
    constexpr int BM = AB_BM, BN = AB_BN, NT = AB_NT;
    constexpr int DP = SM::DP, RP = SM::RP;
    constexpr int CW = D / 16;  // dK, dV and dQ columns per thread
    static_assert(D % 16 == 0 && NT / 16 * 4 == BN && BM == 64, "the micro-tiles the code is written for");
    const int tid = (int)threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const u32 b = blockIdx.x % a.batch;
    const int n0 = (int)(blockIdx.x / a.batch) * BN;  // heaviest (first) key tiles first
    const int L = (int)a.l, S = (int)a.s;
    const u32 base = att_smem_addr(af_smem);
    const float* ks = (const float*)(af_smem + SM::K);
    const float* vs = (const float*)(af_smem + SM::V);
    const float* qs = (const float*)(af_smem + SM::Q);
    const float* gs = (const float*)(af_smem + SM::G);
    float* rs = (float*)(af_smem + SM::R);
    float* lse_s = (float*)(af_smem + SM::LSE);
    float* dl_s = (float*)(af_smem + SM::DL);
    const float* qg = (const float*)a.q + att_batch((u32)b, a.heads, a.q_batch, a.q_inner);
    const float* gg = (const float*)a.grad + att_batch((u32)b, a.heads, a.g_batch, a.g_inner);
    const float* lse = (const float*)a.lse + (i64)b * L;
    const float* delta = (const float*)a.delta + (i64)b * L;
    const float* mask = MASK ? att_mask_plane<float>(m, b) : nullptr;
    const int j0 = ty * 4;  // the thread's first key within the tile (and first query for dQ)

    af_load_tile<D, BN, NT>(base + SM::K, (const float*)a.k + att_batch((u32)b, a.heads, a.k_batch, a.k_inner) + (i64)n0 * a.k_row, a.k_row,
                            min(BN, S - n0));
    af_load_tile<D, BN, NT>(base + SM::V, (const float*)a.v + att_batch((u32)b, a.heads, a.v_batch, a.v_inner) + (i64)n0 * a.v_row, a.v_row,
                            min(BN, S - n0));
    att_cp_commit();

    float dk[4][CW], dv[4][CW];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < CW; ++c) dk[r][c] = dv[r][c] = 0.f;

    const int t_tiles = (L + BM - 1) / BM;
    const int t0 = a.causal ? n0 / BM : 0;  // earlier query tiles see none of these keys
    for (int t = t0; t < t_tiles; ++t) {
        const int m0 = t * BM;
        af_load_tile<D, BM, NT>(base + SM::Q, qg + (i64)m0 * a.q_row, a.q_row, min(BM, L - m0));
        af_load_tile<D, BM, NT>(base + SM::G, gg + (i64)m0 * a.g_row, a.g_row, min(BM, L - m0));
        att_cp_commit();
        if (tid < BM) {
            // Rows past L, and masked rows that see no key (lse −inf): P = exp2(x - inf) = 0.
            const int i = m0 + tid;
            const bool live = i < L && (!MASK || lse[i] != att_neg_inf());
            lse_s[tid] = live ? lse[i] * 1.4426950408889634f : __int_as_float(0x7f800000);
        } else if (tid < 2 * BM) {
            const int i = m0 + tid - BM;
            dl_s[tid - BM] = i < L ? delta[i] : 0.f;
        }
        att_cp_wait<0>();
        __syncthreads();  // K, V (first tile), Q, dO and the rows are in

        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: keys j0 + r, queries tx + 16 c.
        float st[4][4], dpt[4][4];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) st[r][c] = dpt[r][c] = 0.f;
#pragma unroll 2
        for (int d = 0; d < D; d += 4) {
            float4 kr[4], vr[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                kr[r] = *(const float4*)(ks + (j0 + r) * DP + d);
                vr[r] = *(const float4*)(vs + (j0 + r) * DP + d);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float4 qv = *(const float4*)(qs + (tx + 16 * c) * DP + d);
                const float4 gv = *(const float4*)(gs + (tx + 16 * c) * DP + d);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    st[r][c] = af_dot4(kr[r], qv, st[r][c]);
                    dpt[r][c] = af_dot4(vr[r], gv, dpt[r][c]);
                }
            }
        }

        // Pᵀ (in st) and dSᵀ = Pᵀ ∘ (dPᵀ - D) (in dpt, without the scale); Pᵀ to the thread's
        // rows of the shared tile.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int j = n0 + j0 + r;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int il = tx + 16 * c;
                float x = fmaf(st[r][c], a.scale_log2, -lse_s[il]);
                if (MASK && j < S && m0 + il < L) x += mask[(i64)(m0 + il) * m.row + (i64)j * m.col] * 1.4426950408889634f;
                float p = att_exp2(x);
                if (j >= S || (a.causal && j > m0 + il)) p = 0.f;
                st[r][c] = p;
                dpt[r][c] = p * (dpt[r][c] - dl_s[il]);
                rs[(j0 + r) * RP + il] = p;
            }
        }
        __syncwarp();  // the half-warp's Pᵀ rows are in

        // dV += Pᵀ dO over the tile's queries, four at a time.
#pragma unroll 2
        for (int i = 0; i < BM; i += 4) {
            float4 p[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) p[r] = *(const float4*)(rs + (j0 + r) * RP + i);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float g[CW];
                af_read_cols<D>(gs + (i + e) * DP, tx, g);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float pe = af_lane(p[r], e);
#pragma unroll
                    for (int c = 0; c < CW; ++c) dv[r][c] = fmaf(pe, g[c], dv[r][c]);
                }
            }
        }
        __syncwarp();  // the half-warp is done reading its Pᵀ rows
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) rs[(j0 + r) * RP + tx + 16 * c] = dpt[r][c];
        __syncthreads();  // the whole dSᵀ tile is in

        // dK += dSᵀ Q over the tile's queries, four at a time.
#pragma unroll 2
        for (int i = 0; i < BM; i += 4) {
            float4 s[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) s[r] = *(const float4*)(rs + (j0 + r) * RP + i);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float q[CW];
                af_read_cols<D>(qs + (i + e) * DP, tx, q);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float se = af_lane(s[r], e);
#pragma unroll
                    for (int c = 0; c < CW; ++c) dk[r][c] = fmaf(se, q[c], dk[r][c]);
                }
            }
        }

        // dQ (queries j0 + r of the tile) = dS K over the block's keys, into grad_q.
        {
            float dq[4][CW];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < CW; ++c) dq[r][c] = 0.f;
#pragma unroll 4
            for (int jj = 0; jj < BN; ++jj) {
                const float4 s = *(const float4*)(rs + jj * RP + j0);
                float kv[CW];
                af_read_cols<D>(ks + jj * DP, tx, kv);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float se = af_lane(s, r);
#pragma unroll
                    for (int c = 0; c < CW; ++c) dq[r][c] = fmaf(se, kv[c], dq[r][c]);
                }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int i = m0 + j0 + r;
                if (i < L) {
                    float* dst = (float*)a.grad_q + ((i64)b * L + i) * D;
#pragma unroll
                    for (int c = 0; c < CW; ++c) atomicAdd(dst + af_col<D>(tx, c), dq[r][c] * a.scale);
                }
            }
        }
        __syncthreads();  // every thread is done with Q, dO, the dSᵀ tile and the rows
    }
    att_cp_wait<0>();  // nothing left in flight (a key tile no query sees loaded K and V only)

    // grad_k = scale dK, grad_v = dV.
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int j = n0 + j0 + r;
        if (j < S) {
            const i64 at = ((i64)b * S + j) * D;
            af_write_cols<D>((float*)a.grad_k + at, tx, dk[r], a.scale);
            af_write_cols<D>((float*)a.grad_v + at, tx, dv[r], 1.f);
        }
    }
}

// Per head dim: the blocks per multiprocessor the registers are capped for. Up to head dim 64,
// two blocks of 256 threads (128 registers, a few bytes spilled on sm_90; 86 KiB of shared
// memory each), so that one block's loads overlap the other's products; above, one (dK and dV
// take D / 2 registers). The head dims mirror `HEAD_DIMS` in src/launch/attention_f32.rs.
#define ATTENTION_F32_BWD(D, MINB)                                                                              \
    extern "C" __global__ void __launch_bounds__(AB_NT, MINB) attention_f32_backward_d##D(AttnF32BwdArgs a) { \
        const AttnMask none = {};                                                                            \
        attention_f32_bwd<D, false>(a, none);                                                                \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(AB_NT, MINB)                                                \
        attention_f32_backward_masked_d##D(AttnF32BwdArgs a, AttnMask m) {                                   \
        attention_f32_bwd<D, true>(a, m);                                                                    \
    }

ATTENTION_F32_BWD(32, 2)
ATTENTION_F32_BWD(48, 2)
ATTENTION_F32_BWD(64, 2)
ATTENTION_F32_BWD(80, 1)
ATTENTION_F32_BWD(96, 1)
ATTENTION_F32_BWD(112, 1)
ATTENTION_F32_BWD(128, 1)
