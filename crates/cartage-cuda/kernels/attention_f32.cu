// attention_f32.cu: fused scaled dot-product attention forward (Kernel::Attention) in f32, a
// FlashAttention-2-style kernel on the CUDA cores with exact f32 FMAs (no TF32).
// q, k, v (and, backward, dO and O) are [B, rows, D] or [B1, B2, rows, D], the heads of a packed
// projection read in place: batch entry b starts at att_batch(b, heads, ..) (attention_mma.cuh).
// `attention_f32_d<D>`: q [B, L, D], k [B, S, D], v [B, S, D] (last dim dense, batch and row
// strides in elements, multiples of 4, 16-byte aligned bases), out [B, L, D] contiguous, D a
// multiple of 16 from 32 to 128.
// - One block of AF_NT = 128 threads per (batch, tile of AF_BM = 64 query rows); blocks are
//   ordered heaviest query tile first (causal tiles near the end see the most keys).
// - The Q tile and K, V tiles of AF_BN = 64 keys sit in shared memory (rows padded by 4 floats,
//   so the float4 reads of the micro-tiles are free of bank conflicts), copied with cp.async:
//   V_j loads while S = Q K_jᵀ is computed, K_{j+1} while O += P V_j.
// - Thread (tx, ty) = (t % 16, t / 16) owns query rows 8 ty .. 8 ty + 7 of the tile: of S the
//   keys tx + 16 c (c < 4), of O the columns `af_col` (D / 16 of them). The 16 threads of a row
//   group are one half-warp: the row max and sum are reduced with shuffles, and P goes through
//   the half-warp's own rows of a shared tile to the second product.
// - An online softmax in f32 (running max and sum per row, base-2 exponentials with
//   scale·log2(e) folded in); O is rescaled as the max grows and written once.
// - Causal (top-left: key j masked for query i when j > i): key tiles past the tile's last row are
//   skipped, and only tiles crossing the diagonal or the end of S are masked element-wise.
// - A row that sees no key (S = 0) divides 0 by 0: NaN, as the kernel contract says.
// - `attention_f32_masked_d<D>` adds an f32 mask ([outer, inner, L, S], any strides: AttnMask of
//   attention_mma.cuh) to the scaled scores before the softmax, every tile element-wise; a row
//   whose keys the mask removes (all −inf) writes 0 and a log-sum-exp of −inf.
// - With a nonzero `lse`, each row's natural log-sum-exp of its scaled scores goes there in f32
//   ([B, L], contiguous), for the tiled backward (attention_f32_backward.cu).
// cp.async and the base-2 exponential come from attention_mma.cuh, the f32 tile helpers from
// attention_f32.cuh.

#define AF_BM 64   // query rows per block
#define AF_BN 64   // keys per tile
#define AF_NT 128  // threads per block

// The dynamic shared memory, byte offsets: Q [BM, D + 4], K and V [BN, D + 4], P [BM, BN + 4].
// Mirrors `smem_bytes` in src/launch/attention_f32.rs.
template <int D> struct AfSmem {
    static constexpr int DP = D + 4;
    static constexpr int PP = AF_BN + 4;
    static constexpr u32 Q = 0;
    static constexpr u32 K = Q + AF_BM * DP * 4;
    static constexpr u32 V = K + AF_BN * DP * 4;
    static constexpr u32 P = V + AF_BN * DP * 4;
    static constexpr u32 BYTES = P + AF_BM * PP * 4;
};

template <int D, bool MASK> __device__ __forceinline__ void attention_f32_fwd(const AttnArgs& a, const AttnMask& m) {
    typedef AfSmem<D> SM;
    constexpr int BM = AF_BM, BN = AF_BN, NT = AF_NT;
    constexpr int DP = SM::DP, PP = SM::PP;
    constexpr int RT = BM / (NT / 16);  // rows per thread
    constexpr int KT = BN / 16;         // keys per thread
    constexpr int CW = D / 16;          // output columns per thread
    static_assert(D % 16 == 0 && RT == 8 && KT == 4, "the micro-tiles the code is written for");
    const int tid = (int)threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const u32 mb = a.m_blocks - 1 - blockIdx.x / a.batch;
    const u32 b = blockIdx.x % a.batch;
    const int m0 = (int)mb * BM;
    const int L = (int)a.l, S = (int)a.s;
    const float* qg = (const float*)a.q + att_batch(b, a.heads, a.q_batch, a.q_inner) + (i64)m0 * a.q_row;
    const float* kg = (const float*)a.k + att_batch(b, a.heads, a.k_batch, a.k_inner);
    const float* vg = (const float*)a.v + att_batch(b, a.heads, a.v_batch, a.v_inner);
    const float* mask = MASK ? att_mask_plane<float>(m, b) : nullptr;
    const u32 base = att_smem_addr(af_smem);
    const float* qs = (const float*)(af_smem + SM::Q);
    const float* ks = (const float*)(af_smem + SM::K);
    const float* vs = (const float*)(af_smem + SM::V);
    float* ps = (float*)(af_smem + SM::P);
    const int r0 = ty * RT;  // the thread's first row within the tile

    const int n_end = a.causal ? min(S, m0 + BM) : S;
    const int n_tiles = (n_end + BN - 1) / BN;
    af_load_tile<D, BM, NT>(base + SM::Q, qg, a.q_row, min(BM, L - m0));
    if (n_tiles > 0) af_load_tile<D, BN, NT>(base + SM::K, kg, a.k_row, min(BN, S));
    att_cp_commit();

    float o[RT][CW], mrow[RT], lrow[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
#pragma unroll
        for (int c = 0; c < CW; ++c) o[r][c] = 0.f;
        mrow[r] = att_neg_inf();
        lrow[r] = 0.f;
    }

    for (int j = 0; j < n_tiles; ++j) {
        const int n0 = j * BN;
        af_load_tile<D, BN, NT>(base + SM::V, vg + (i64)n0 * a.v_row, a.v_row, min(BN, S - n0));
        att_cp_commit();
        att_cp_wait<1>();  // Q and K_j are in
        __syncthreads();

        // S = Q K_jᵀ: rows r0 + r, keys tx + 16 c.
        float s[RT][KT];
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int c = 0; c < KT; ++c) s[r][c] = 0.f;
#pragma unroll 2
        for (int d = 0; d < D; d += 4) {
            float4 kv[KT];
#pragma unroll
            for (int c = 0; c < KT; ++c) kv[c] = *(const float4*)(ks + (tx + 16 * c) * DP + d);
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const float4 qv = *(const float4*)(qs + (r0 + r) * DP + d);
#pragma unroll
                for (int c = 0; c < KT; ++c) s[r][c] = af_dot4(qv, kv[c], s[r][c]);
            }
        }

        // Scale (base 2), mask, fold the tile into the running max and sum, P to shared memory.
        const bool edge = n0 + BN > S || (a.causal && n0 + BN - 1 > m0);
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            const int row = m0 + r0 + r;
            float mx = mrow[r];
#pragma unroll
            for (int c = 0; c < KT; ++c) {
                float x = s[r][c] * a.scale_log2;
                if (MASK) {
                    const int col = n0 + tx + 16 * c;
                    if (row < L && col < S) x += mask[(i64)row * m.row + (i64)col * m.col] * 1.4426950408889634f;
                }
                if (edge) {
                    const int col = n0 + tx + 16 * c;
                    if (col >= S || (a.causal && col > row)) x = att_neg_inf();
                }
                s[r][c] = x;
                mx = fmaxf(mx, x);
            }
            mx = af_half_max(mx);
            const float mu = mx == att_neg_inf() ? 0.f : mx;
            const float corr = att_exp2(mrow[r] - mu);
            mrow[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int c = 0; c < KT; ++c) {
                const float p = att_exp2(s[r][c] - mu);
                sum += p;
                ps[(r0 + r) * PP + tx + 16 * c] = p;
            }
            lrow[r] = lrow[r] * corr + sum;  // this thread's part; the half-warp adds up at the end
#pragma unroll
            for (int c = 0; c < CW; ++c) o[r][c] *= corr;
        }

        __syncthreads();  // every thread is done with K_j; P is in
        if (j + 1 < n_tiles) {
            const int n1 = n0 + BN;
            af_load_tile<D, BN, NT>(base + SM::K, kg + (i64)n1 * a.k_row, a.k_row, min(BN, S - n1));
            att_cp_commit();
            att_cp_wait<1>();  // V_j is in
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();

        // O += P V_j over the tile's keys, four at a time.
#pragma unroll 2
        for (int kk = 0; kk < BN; kk += 4) {
            float4 p[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) p[r] = *(const float4*)(ps + (r0 + r) * PP + kk);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v[CW];
                af_read_cols<D>(vs + (kk + e) * DP, tx, v);
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    const float pe = af_lane(p[r], e);
#pragma unroll
                    for (int c = 0; c < CW; ++c) o[r][c] = fmaf(pe, v[c], o[r][c]);
                }
            }
        }
        __syncthreads();  // every thread is done with V_j and P
    }
    att_cp_wait<0>();  // nothing left in flight (no key tile at all: the Q copy)

    float* og = (float*)a.out + att_batch(b, a.heads, a.o_batch, a.o_inner);
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const float l = af_half_sum(lrow[r]);
        const int row = m0 + r0 + r;
        if (row < L) {
            if (a.lse != 0 && tx == 0) {
                // ln(sum_j exp(scale s_ij)) = m ln 2 + ln l, m the running max in base 2; -inf for
                // a row that sees no key.
                ((float*)a.lse)[(i64)b * L + row] = mrow[r] * 0.6931471805599453f + logf(l);
            }
            // A masked row that sees no key: 0 (l = 0 would give 0 / 0).
            af_write_cols<D>(og + (i64)row * a.o_row, tx, o[r], MASK && l == 0.f ? 0.f : 1.f / l);
        }
    }
}

// Per head dim: the blocks per multiprocessor the registers are capped for, as many as an H100's
// shared memory holds (68 KiB a block at head dim 64: three, 168 registers, no spills on sm_90;
// 116 KiB at 128: one). The head dims mirror `HEAD_DIMS` in src/launch/attention_f32.rs.
#define ATTENTION_F32(D, MINB)                                                                          \
    extern "C" __global__ void __launch_bounds__(AF_NT, MINB) attention_f32_d##D(AttnArgs a) {           \
        const AttnMask none = {};                                                                       \
        attention_f32_fwd<D, false>(a, none);                                                           \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(AF_NT, MINB) attention_f32_masked_d##D(AttnArgs a,      \
                                                                                     AttnMask m) {      \
        attention_f32_fwd<D, true>(a, m);                                                               \
    }

ATTENTION_F32(32, 3)
ATTENTION_F32(48, 3)
ATTENTION_F32(64, 3)
ATTENTION_F32(80, 2)
ATTENTION_F32(96, 2)
ATTENTION_F32(112, 2)
ATTENTION_F32(128, 1)
