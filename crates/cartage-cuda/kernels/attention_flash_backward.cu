// attention_flash_backward.cu: the tiled (FlashAttention-2-style) backward of scaled dot-product
// attention on the tensor cores, for bf16 and f16 with head dims 64 and 128 (Ev = E = D). It
// needs the forward's output O and per-row natural log-sum-exp (Kernel::Attention's `lse`), so
// that the probabilities P = exp(scale q_i.k_j - lse_i) are recomputed tile by tile and nothing of
// size L x S is stored. q, k, v, the incoming gradient dO and O are read in place (dense last
// dimension, batch and row strides multiples of 8 elements, 16-byte aligned bases); grad_q,
// grad_k and grad_v are contiguous [B, L|S, D]. Three launches:
// - `attention_flash_backward_prep_<dtype>_d<D>`: a warp per query row: D_i = dO_i.O_i (f32),
//   lse_i·log2(e), and a zeroed row of the f32 dQ accumulator. The two per-row values go to a
//   [B, LP] scratch pair, LP = L rounded up to the query tile, the rows past L holding D = 0 and
//   lse = +inf (so that P = 0 there without a mask).
// q, k, v (and, backward, dO and O) are [B, rows, D] or [B1, B2, rows, D], the heads of a packed
// projection read in place: batch entry b starts at att_batch(b, heads, ..) (attention_mma.cuh).
// - `attention_flash_backward_<dtype>_d<D>_m<BM>_w<NW>`: one block per (batch, tile of BN = 16 NW
//   keys), NW warps, each owning 16 keys. K and V stay in shared memory; the block walks the
//   query tiles of BM rows that see its keys (from the diagonal on when causal, so fully masked
//   tiles are skipped), Q and dO tiles double-buffered with cp.async (tile t + 1 loads while t is
//   computed). Per tile and warp, with the warp's keys as the rows: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ
//   (mma), Pᵀ = exp2(scale·log2(e) Sᵀ - lse·log2(e)), dSᵀ = Pᵀ ∘ (dPᵀ - D); then dV += Pᵀ dO and
//   dK += dSᵀ Q with Pᵀ and dSᵀ as 16-bit A fragments straight from the accumulators (dK and dV
//   stay in registers for the whole walk). dSᵀ also goes to shared memory, from which the block
//   computes its share of dQ = dS K for the tile and adds it to the f32 accumulator with atomics.
//   Only tiles crossing the diagonal or the end of S are masked element-wise.
// - `attention_flash_backward_dq_<dtype>`: grad_q = scale · the accumulator, rounded once.
// `attention_flash_backward_masked_<dtype>_d<D>_m<BM>_w<NW>` adds the forward's mask (AttnMask of
// attention_mma.cuh) to the recomputed scores; a row whose keys the mask removed (its lse is
// −inf, made +inf by the preprocess) gets zero probabilities, so zero gradients, as the forward's
// zero output.
// A key that no query sees (causal, j >= L) gets zero grad_k and grad_v. The accumulation order
// of dQ's atomics varies from run to run (the last bits of grad_q may differ); grad_k and grad_v
// have one writer per element.

// Mirrors `FlashBwdArgs` in src/launch/attention_flash_backward.rs.
struct FlashBwdArgs {
    u64 q;
    u64 k;
    u64 v;
    u64 grad;
    u64 out;
    u64 lse;     // [B, L] f32, natural log
    u64 grad_q;  // [B, L, D] contiguous
    u64 grad_k;  // [B, S, D] contiguous
    u64 grad_v;  // [B, S, D] contiguous
    u64 dq_acc;  // [B, L, D] f32 scratch
    u64 lse2;    // [B, LP] f32 scratch
    u64 delta;   // [B, LP] f32 scratch
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
    u32 lp;        // L rounded up to the query tile
    u32 n_blocks;  // key tiles per batch entry
    f32 scale;
    f32 scale_log2;
    i32 causal;
    u32 d;  // head dim
    u32 heads;  // B2 (1 for [B, rows, D] operands)
};

// The two values of a 32-bit pair of 16-bit elements.
__device__ __forceinline__ void fb_unpack(bf16, u32 v, float& lo, float& hi) {
    lo = __uint_as_float(v << 16);
    hi = __uint_as_float(v & 0xffff0000u);
}
__device__ __forceinline__ void fb_unpack(f16, u32 v, float& lo, float& hi) {
    f16 a, b;
    a.bits = (u16)(v & 0xffffu);
    b.bits = (u16)(v >> 16);
    lo = f16_to_f32(a);
    hi = f16_to_f32(b);
}

template <typename T, int D> __device__ __forceinline__ void attention_flash_prep(const FlashBwdArgs& a) {
    const int lane = threadIdx.x & 31;
    const u64 warps = grid_threads() >> 5;
    const u64 rows = (u64)a.batch * a.lp;
    for (u64 r = global_thread() >> 5; r < rows; r += warps) {
        const u64 b = r / a.lp, i = r % a.lp;
        const bool real = i < a.l;
        float dot = 0.f;
        if (real) {
            const u32* g = (const u32*)((const u16*)a.grad + att_batch((u32)b, a.heads, a.g_batch, a.g_inner) + (i64)i * a.g_row);
            const u32* o = (const u32*)((const u16*)a.out + att_batch((u32)b, a.heads, a.o_batch, a.o_inner) + (i64)i * a.o_row);
#pragma unroll
            for (int t = 0; t < D / 64; ++t) {
                float g0, g1, o0, o1;
                fb_unpack(T(), g[lane + 32 * t], g0, g1);
                fb_unpack(T(), o[lane + 32 * t], o0, o1);
                dot = fmaf(g0, o0, fmaf(g1, o1, dot));
            }
#pragma unroll
            for (int m = 16; m > 0; m >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, m);
            float* acc = (float*)a.dq_acc + (b * a.l + i) * D;
#pragma unroll
            for (int t = 0; t < D / 64; ++t) {
                acc[2 * (lane + 32 * t)] = 0.f;
                acc[2 * (lane + 32 * t) + 1] = 0.f;
            }
        }
        if (lane == 0) {
            ((float*)a.delta)[r] = dot;
            // Rows past L, and masked rows that see no key (lse −inf): +inf, so that P = 0.
            const float lse = real ? ((const float*)a.lse)[b * a.l + i] : att_neg_inf();
            ((float*)a.lse2)[r] = lse == att_neg_inf() ? __int_as_float(0x7f800000) : lse * 1.4426950408889634f;
        }
    }
}

// The shared memory of the main kernel, in bytes: K and V [BN, D], two Q and two dO buffers
// [BM, D], dSᵀ [BN, BM], then two lse and two D rows of BM floats. Mirrors `smem_bytes` in
// src/launch/attention_flash_backward.rs.
template <int D, int BM, int NW> struct FbSmem {
    static constexpr int BN = 16 * NW;
    static constexpr u32 K = 0;
    static constexpr u32 V = K + BN * D * 2;
    static constexpr u32 Q = V + BN * D * 2;
    static constexpr u32 G = Q + 2 * BM * D * 2;
    static constexpr u32 DS = G + 2 * BM * D * 2;
    static constexpr u32 LSE = DS + BN * BM * 2;
    static constexpr u32 DL = LSE + 2 * BM * 4;
    static constexpr u32 BYTES = DL + 2 * BM * 4;
};

extern __shared__ __align__(128) u8 fb_smem[];

template <typename T, int D, int BM, int NW, bool MASK>
__device__ __forceinline__ void attention_flash_bwd(const FlashBwdArgs& a, const AttnMask& mk) {
    typedef AttMma<T> M;
    typedef FbSmem<D, BM, NW> SM;
    constexpr int BN = SM::BN;
    constexpr int NT = 32 * NW;
    constexpr int RG = BM / 16;    // dQ: row groups of 16 query rows
    constexpr int CG = NW / RG;    // dQ: column groups per row group
    constexpr int DQW = D / CG;    // dQ: columns per warp
    static_assert(NW % RG == 0 && DQW % 16 == 0, "the dQ tile splits evenly over the warps");
    static_assert(BM / 4 * 2 <= NT, "one pass copies the lse and D rows");

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 b = blockIdx.x % a.batch;
    const int n0 = (int)(blockIdx.x / a.batch) * BN;  // heaviest (first) key tiles first
    const int L = (int)a.l, S = (int)a.s;
    const u32 base = att_smem_addr(fb_smem);
    const u32 sk = base + SM::K, sv = base + SM::V, sds = base + SM::DS;
    const float* lse_s = (const float*)(fb_smem + SM::LSE);
    const float* dl_s = (const float*)(fb_smem + SM::DL);
    const u16* qg = (const u16*)a.q + att_batch((u32)b, a.heads, a.q_batch, a.q_inner);
    const u16* gg = (const u16*)a.grad + att_batch((u32)b, a.heads, a.g_batch, a.g_inner);
    const float* lse2 = (const float*)a.lse2 + (u64)b * a.lp;
    const float* delta = (const float*)a.delta + (u64)b * a.lp;
    const T* mask = MASK ? att_mask_plane<T>(mk, b) : nullptr;

    // Queue the copy of query tile t (Q, dO, lse, D) into buffer `buf`.
    auto load_rows = [&](int t, int buf) {
        const int m0 = t * BM;
        const int valid = min(BM, L - m0);
        att_load_tile<D, BM, NT>(base + SM::Q + buf * BM * D * 2, qg + (i64)m0 * a.q_row, a.q_row, valid);
        att_load_tile<D, BM, NT>(base + SM::G + buf * BM * D * 2, gg + (i64)m0 * a.g_row, a.g_row, valid);
        const int i = (int)threadIdx.x;
        if (i < BM / 4) {
            att_cp_async(base + SM::LSE + buf * BM * 4 + i * 16, lse2 + m0 + 4 * i, 16u);
        } else if (i < BM / 2) {
            const int c = i - BM / 4;
            att_cp_async(base + SM::DL + buf * BM * 4 + c * 16, delta + m0 + 4 * c, 16u);
        }
    };

    const int t_tiles = (L + BM - 1) / BM;
    const int t0 = a.causal ? n0 / BM : 0;  // earlier query tiles see none of these keys
    att_load_tile<D, BN, NT>(sk, (const u16*)a.k + att_batch((u32)b, a.heads, a.k_batch, a.k_inner) + (i64)n0 * a.k_row, a.k_row, min(BN, S - n0));
    att_load_tile<D, BN, NT>(sv, (const u16*)a.v + att_batch((u32)b, a.heads, a.v_batch, a.v_inner) + (i64)n0 * a.v_row, a.v_row, min(BN, S - n0));
    if (t0 < t_tiles) load_rows(t0, 0);
    att_cp_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
    const int kr = warp * 16;                 // the warp's first key, within the tile
    const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: which 8x8 matrix, which of its rows
    const int key0 = n0 + kr + (lane >> 2);   // this thread's keys: key0 and key0 + 8

    for (int t = t0; t < t_tiles; ++t) {
        const int buf = (t - t0) & 1;
        att_cp_wait<0>();
        __syncthreads();  // tile t is in; every warp is done with tile t - 1 (its buffers, dSᵀ)
        if (t + 1 < t_tiles) {
            load_rows(t + 1, buf ^ 1);
            att_cp_commit();
        }
        const u32 sq = base + SM::Q + buf * BM * D * 2;
        const u32 sg = base + SM::G + buf * BM * D * 2;
        const float* lse_t = lse_s + buf * BM;
        const float* dl_t = dl_s + buf * BM;
        const int m0 = t * BM;

        // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for the warp's 16 keys and the tile's BM queries.
        float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
        for (int i = 0; i < BM / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            u32 ka[4], va[4];
            att_ldsm_x4(sk + att_swz<D>(kr + (lane & 15), ks * 16 + (lane >> 4) * 8), ka[0], ka[1], ka[2], ka[3]);
            att_ldsm_x4(sv + att_swz<D>(kr + (lane & 15), ks * 16 + (lane >> 4) * 8), va[0], va[1], va[2], va[3]);
#pragma unroll
            for (int np = 0; np < BM / 16; ++np) {
                const int row = np * 16 + (mi >> 1) * 8 + mr, col = ks * 16 + (mi & 1) * 8;
                u32 b0, b1, b2, b3;
                att_ldsm_x4(sq + att_swz<D>(row, col), b0, b1, b2, b3);
                M::mma(st[2 * np], ka, b0, b1);
                M::mma(st[2 * np + 1], ka, b2, b3);
                att_ldsm_x4(sg + att_swz<D>(row, col), b0, b1, b2, b3);
                M::mma(dpt[2 * np], va, b0, b1);
                M::mma(dpt[2 * np + 1], va, b2, b3);
            }
        }

        // Pᵀ (in st) and dSᵀ = Pᵀ ∘ (dPᵀ - D) (in dpt, without the scale).
        const bool masked = n0 + BN > S || (a.causal && n0 + BN - 1 > m0);
#pragma unroll
        for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int il = nt * 8 + 2 * (lane & 3) + (e & 1);
                const int j = key0 + (e >> 1) * 8;
                float x;
                if (MASK) {
                    // The scaled score plus the mask, as the forward added them, then less the lse.
                    x = st[nt][e] * a.scale_log2;
                    if (j < S && m0 + il < L)
                        x += load(mask[(i64)(m0 + il) * mk.row + (i64)j * mk.col]) * 1.4426950408889634f;
                    x -= lse_t[il];
                } else {
                    x = fmaf(st[nt][e], a.scale_log2, -lse_t[il]);
                }
                float p = att_exp2(x);
                if (masked && (j >= S || (a.causal && j > m0 + il))) p = 0.f;
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - dl_t[il]);
            }
        }

        // dV += Pᵀ dO and dK += dSᵀ Q (the tile's queries are the k dimension); dSᵀ to shared
        // memory for dQ.
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            u32 pa[4], sa[4];
            pa[0] = M::pack(st[2 * kk][0], st[2 * kk][1]);
            pa[1] = M::pack(st[2 * kk][2], st[2 * kk][3]);
            pa[2] = M::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]);
            pa[3] = M::pack(st[2 * kk + 1][2], st[2 * kk + 1][3]);
            sa[0] = M::pack(dpt[2 * kk][0], dpt[2 * kk][1]);
            sa[1] = M::pack(dpt[2 * kk][2], dpt[2 * kk][3]);
            sa[2] = M::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
            sa[3] = M::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
            const int srow = kr + (lane >> 2), scol = 2 * kk * 8;
            att_st_shared(sds + att_swz<BM>(srow, scol) + (lane & 3) * 4, sa[0]);
            att_st_shared(sds + att_swz<BM>(srow + 8, scol) + (lane & 3) * 4, sa[1]);
            att_st_shared(sds + att_swz<BM>(srow, scol + 8) + (lane & 3) * 4, sa[2]);
            att_st_shared(sds + att_swz<BM>(srow + 8, scol + 8) + (lane & 3) * 4, sa[3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                const int row = kk * 16 + (mi & 1) * 8 + mr, col = dp * 16 + (mi >> 1) * 8;
                u32 b0, b1, b2, b3;
                att_ldsm_x4_t(sg + att_swz<D>(row, col), b0, b1, b2, b3);
                M::mma(dv[2 * dp], pa, b0, b1);
                M::mma(dv[2 * dp + 1], pa, b2, b3);
                att_ldsm_x4_t(sq + att_swz<D>(row, col), b0, b1, b2, b3);
                M::mma(dk[2 * dp], sa, b0, b1);
                M::mma(dk[2 * dp + 1], sa, b2, b3);
            }
        }
        __syncthreads();  // dSᵀ of every warp is in

        // dQ (rows qr.., columns qc..) += dS K over the tile's BN keys, then into the accumulator.
        {
            const int qr = (warp % RG) * 16, qc = (warp / RG) * DQW;
            float dq[DQW / 8][4];
#pragma unroll
            for (int i = 0; i < DQW / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                u32 sa[4];
                att_ldsm_x4_t(sds + att_swz<BM>(kk * 16 + (mi >> 1) * 8 + mr, qr + (mi & 1) * 8), sa[0], sa[1], sa[2],
                              sa[3]);
#pragma unroll
                for (int dp = 0; dp < DQW / 16; ++dp) {
                    u32 b0, b1, b2, b3;
                    att_ldsm_x4_t(sk + att_swz<D>(kk * 16 + (mi & 1) * 8 + mr, qc + dp * 16 + (mi >> 1) * 8), b0, b1,
                                  b2, b3);
                    M::mma(dq[2 * dp], sa, b0, b1);
                    M::mma(dq[2 * dp + 1], sa, b2, b3);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = m0 + qr + (lane >> 2) + 8 * h;
                if (i < L) {
                    float* dst = (float*)a.dq_acc + ((i64)b * L + i) * D + qc + 2 * (lane & 3);
#pragma unroll
                    for (int dt = 0; dt < DQW / 8; ++dt) {
                        atomicAdd(dst + dt * 8, dq[dt][2 * h]);
                        atomicAdd(dst + dt * 8 + 1, dq[dt][2 * h + 1]);
                    }
                }
            }
        }
    }

    att_cp_wait<0>();  // nothing left in flight (a key tile no query sees loaded K and V only)

    // grad_k = scale dK, grad_v = dV, rounded once.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int j = key0 + 8 * h;
        if (j < S) {
            const i64 at = ((i64)b * S + j) * D + 2 * (lane & 3);
            u32* gk = (u32*)((u16*)a.grad_k + at);
            u32* gv = (u32*)((u16*)a.grad_v + at);
#pragma unroll
            for (int dt = 0; dt < D / 8; ++dt) {
                gk[dt * 4] = M::pack(dk[dt][2 * h] * a.scale, dk[dt][2 * h + 1] * a.scale);
                gv[dt * 4] = M::pack(dv[dt][2 * h], dv[dt][2 * h + 1]);
            }
        }
    }
}

template <typename T> __device__ __forceinline__ void attention_flash_dq(const FlashBwdArgs& a) {
    typedef AttMma<T> M;
    const u64 n4 = (u64)a.batch * a.l * a.d / 4;
    const float4* src = (const float4*)a.dq_acc;
    uint2* dst = (uint2*)a.grad_q;
    for (u64 i = global_thread(); i < n4; i += grid_threads()) {
        const float4 x = src[i];
        uint2 y;
        y.x = M::pack(x.x * a.scale, x.y * a.scale);
        y.y = M::pack(x.z * a.scale, x.w * a.scale);
        dst[i] = y;
    }
}

#define ATTENTION_FLASH_PREP(TN, T, D)                                                                         \
    extern "C" __global__ void __launch_bounds__(256) attention_flash_backward_prep_##TN##_d##D(FlashBwdArgs a) { \
        attention_flash_prep<T, D>(a);                                                                          \
    }
#define ATTENTION_FLASH_MAIN(TN, T, D, BM, NW)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * NW, 1)                                                          \
        attention_flash_backward_##TN##_d##D##_m##BM##_w##NW(FlashBwdArgs a) {                                          \
        const AttnMask none = {};                                                                                     \
        attention_flash_bwd<T, D, BM, NW, false>(a, none);                                                            \
    }                                                                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * NW, 1)                                                          \
        attention_flash_backward_masked_##TN##_d##D##_m##BM##_w##NW(FlashBwdArgs a, AttnMask m) {                       \
        attention_flash_bwd<T, D, BM, NW, true>(a, m);                                                                \
    }
#define ATTENTION_FLASH_DQ(TN, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(256) attention_flash_backward_dq_##TN(FlashBwdArgs a) { \
        attention_flash_dq<T>(a);                                                                             \
    }

// The block shapes per head dim: mirrors `config` in src/launch/attention_flash_backward.rs.
// Measured on an H100 (causal bf16, B·H = 128, L = S = 1024; and B·H = 32, L = S = 512 for head
// dim 128): 8 warps (128 keys per block) beat 4 by 16% (head dim 64) and 28% (128); head dim
// 128 takes query tiles of 32 rows, as fast as 64 there and faster on the short sequence.
#define ATTENTION_FLASH_ALL(TN, T)          \
    ATTENTION_FLASH_PREP(TN, T, 64)         \
    ATTENTION_FLASH_PREP(TN, T, 128)        \
    ATTENTION_FLASH_MAIN(TN, T, 64, 64, 8)  \
    ATTENTION_FLASH_MAIN(TN, T, 128, 32, 8) \
    ATTENTION_FLASH_DQ(TN, T)

ATTENTION_FLASH_ALL(bf16, bf16)
ATTENTION_FLASH_ALL(f16, f16)
