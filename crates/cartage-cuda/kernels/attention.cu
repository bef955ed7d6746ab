// attention.cu: fused scaled dot-product attention forward (Kernel::Attention), a
// FlashAttention-2-style kernel on the tensor cores.
// q, k, v (and, backward, dO and O) are [B, rows, D] or [B1, B2, rows, D], the heads of a packed
// projection read in place: batch entry b starts at att_batch(b, heads, ..) (attention_mma.cuh).
// `attention_<bf16|f16>_d<64|128>`: q [B, L, D], k [B, S, D], v [B, S, D] (last dim dense, batch
// and row strides in elements, multiples of 8, 16-byte aligned bases), out [B, L, D] contiguous.
// - One block per (batch, tile of BM query rows), BM / (16 MT) warps; each warp owns MT tiles of
//   16 consecutive rows (the K and V fragments it loads serve all of them). BM, MT and the
//   register cap are chosen per head dim at the end of the file.
//   Blocks are ordered heaviest query tile first (causal tiles near the end see the most keys).
// - The Q tile is staged through shared memory into registers (mma A fragments, ldmatrix); K and
//   V tiles of ATT_BN keys stream through shared memory with cp.async: V_j loads while S = Q K_jᵀ
//   is computed, K_{j+1} while O += P V_j. Shared rows are XOR-swizzled in 16-byte chunks, so
//   ldmatrix is free of bank conflicts.
// - mma.sync m16n8k16 with f32 accumulation; an online softmax in f32 (running max and sum per
//   row, base-2 exponentials with scale·log2(e) folded in); P goes to the second product as
//   16-bit A fragments straight from the accumulators.
// - Causal (top-left: key j masked for query i when j > i): key tiles past the tile's last row are
//   skipped, and only tiles crossing the diagonal or the end of S are masked element-wise.
// - A row that sees no key (S = 0) divides 0 by 0: NaN, as the kernel contract says.
// - `attention_masked_<bf16|f16>_d<D>` adds a mask of the element type ([outer, inner, L, S], any
//   strides: AttnMask of attention_mma.cuh) to the scaled scores before the softmax, every tile
//   element-wise; a row whose keys the mask removes (all −inf) writes 0 and a log-sum-exp of −inf.
// - With a nonzero `lse`, each row's natural log-sum-exp of its scaled scores goes there in f32
//   ([B, L], contiguous): what the tiled backward (attention_flash_backward.cu) needs to
//   recompute the probabilities without a second pass.
// - `attention_lse_unseen` (at the end) readies a log-sum-exp for a backward that does not treat
//   a row that sees no key itself (cuDNN's).
// The shared helpers (cp.async, ldmatrix, mma, swizzle) are in attention_mma.cuh.

#ifndef ATT_BN
#define ATT_BN 64  // keys per tile
#endif

// BM query rows per block, MT tiles of 16 rows per warp: BM / (16 MT) warps.
template <typename T, int D, int BM, int MT, bool MASK>
__device__ __forceinline__ void attention_fwd(const AttnArgs& a, const AttnMask& mk) {
    typedef AttMma<T> M;
    constexpr int WR = 16 * MT;                 // rows per warp
    constexpr int NT = BM / WR * 32;            // threads per block
    constexpr int SMEM_ROWS = BM > 2 * ATT_BN ? BM : 2 * ATT_BN;
    // The Q tile first; once Q is in registers, the K tile then the V tile.
    __shared__ __align__(128) u16 smem[SMEM_ROWS * D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 mb = a.m_blocks - 1 - blockIdx.x / a.batch;
    const u32 b = blockIdx.x % a.batch;
    const int m0 = (int)mb * BM;
    const int L = (int)a.l, S = (int)a.s;
    const u16* qg = (const u16*)a.q + att_batch(b, a.heads, a.q_batch, a.q_inner) + (i64)m0 * a.q_row;
    const u16* kg = (const u16*)a.k + att_batch(b, a.heads, a.k_batch, a.k_inner);
    const u16* vg = (const u16*)a.v + att_batch(b, a.heads, a.v_batch, a.v_inner);
    const T* mask = MASK ? att_mask_plane<T>(mk, b) : nullptr;
    const u32 sq = att_smem_addr(smem);
    const u32 sk = sq, sv = sq + ATT_BN * D * 2;

    att_load_tile<D, BM, NT>(sq, qg, a.q_row, min(BM, L - m0));
    att_cp_commit();
    att_cp_wait<0>();
    __syncthreads();
    u32 qf[MT][D / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
            att_ldsm_x4(sq + att_swz<D>(warp * WR + mt * 16 + (lane & 15), ks * 16 + (lane >> 4) * 8), qf[mt][ks][0],
                        qf[mt][ks][1], qf[mt][ks][2], qf[mt][ks][3]);
    __syncthreads();

    float o[MT][D / 8][4];
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
        mrow[mt][0] = mrow[mt][1] = att_neg_inf();
        lrow[mt][0] = lrow[mt][1] = 0.f;
    }
    const int n_end = a.causal ? min(S, m0 + BM) : S;
    const int n_tiles = (n_end + ATT_BN - 1) / ATT_BN;
    const int wrow = m0 + warp * WR;           // the warp's first row
    const int row0 = wrow + (lane >> 2);        // this thread's rows: row0 + 16 mt + {0, 8}
    const int mi = lane >> 3, mr = lane & 7;    // ldmatrix: which 8x8 matrix, which of its rows

    if (n_tiles > 0) {
        att_load_tile<D, ATT_BN, NT>(sk, kg, a.k_row, min(ATT_BN, S));
        att_cp_commit();
    }
    for (int j = 0; j < n_tiles; ++j) {
        const int n0 = j * ATT_BN;
        att_load_tile<D, ATT_BN, NT>(sv, vg + (i64)n0 * a.v_row, a.v_row, min(ATT_BN, S - n0));
        att_cp_commit();
        att_cp_wait<1>();
        __syncthreads();

        // S = Q K_jᵀ for this warp's rows and the tile's ATT_BN keys.
        float s[MT][ATT_BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < ATT_BN / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
            for (int np = 0; np < ATT_BN / 16; ++np) {
                u32 b0, b1, b2, b3;
                att_ldsm_x4(sk + att_swz<D>(np * 16 + (mi >> 1) * 8 + mr, ks * 16 + (mi & 1) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    M::mma(s[mt][2 * np], qf[mt][ks], b0, b1);
                    M::mma(s[mt][2 * np + 1], qf[mt][ks], b2, b3);
                }
            }
        }

        // Scale (base 2), mask, and fold the tile into the running max and sum.
        const bool masked = n0 + ATT_BN > S || (a.causal && n0 + ATT_BN - 1 > wrow);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int nt = 0; nt < ATT_BN / 8; ++nt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float x = s[mt][nt][e] * a.scale_log2;
                    const int col = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
                    const int row = row0 + mt * 16 + (e >> 1) * 8;
                    if (MASK && row < L && col < S)
                        x += load(mask[(i64)row * mk.row + (i64)col * mk.col]) * 1.4426950408889634f;
                    if (masked && (col >= S || (a.causal && col > row))) x = att_neg_inf();
                    s[mt][nt][e] = x;
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = mrow[mt][h];
#pragma unroll
                for (int nt = 0; nt < ATT_BN / 8; ++nt)
                    mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mu = mx == att_neg_inf() ? 0.f : mx;
                const float corr = att_exp2(mrow[mt][h] - mu);
                mrow[mt][h] = mx;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < ATT_BN / 8; ++nt) {
                    s[mt][nt][2 * h] = att_exp2(s[mt][nt][2 * h] - mu);
                    s[mt][nt][2 * h + 1] = att_exp2(s[mt][nt][2 * h + 1] - mu);
                    sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
                }
                lrow[mt][h] = lrow[mt][h] * corr + sum;  // this thread's part; the quad adds up at the end
#pragma unroll
                for (int dt = 0; dt < D / 8; ++dt) {
                    o[mt][dt][2 * h] *= corr;
                    o[mt][dt][2 * h + 1] *= corr;
                }
            }
        }

        __syncthreads();  // every warp is done with K_j
        if (j + 1 < n_tiles) {
            const int n1 = n0 + ATT_BN;
            att_load_tile<D, ATT_BN, NT>(sk, kg + (i64)n1 * a.k_row, a.k_row, min(ATT_BN, S - n1));
            att_cp_commit();
            att_cp_wait<1>();
        } else {
            att_cp_wait<0>();
        }
        __syncthreads();

        // O += P V_j.
#pragma unroll
        for (int kk = 0; kk < ATT_BN / 16; ++kk) {
            u32 p[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                p[mt][0] = M::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                p[mt][1] = M::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                p[mt][2] = M::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                p[mt][3] = M::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 b0, b1, b2, b3;
                att_ldsm_x4_t(sv + att_swz<D>(kk * 16 + (mi & 1) * 8 + mr, dp * 16 + (mi >> 1) * 8), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    M::mma(o[mt][2 * dp], p[mt], b0, b1);
                    M::mma(o[mt][2 * dp + 1], p[mt], b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with V_j
    }

    u16* og = (u16*)a.out + att_batch(b, a.heads, a.o_batch, a.o_inner);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float l = lrow[mt][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            // A masked row that sees no key: 0 (l = 0 would give 0 / 0).
            const float inv = MASK && l == 0.f ? 0.f : 1.f / l;
            const int row = row0 + mt * 16 + h * 8;
            if (a.lse != 0 && row < L && (lane & 3) == 0) {
                // ln(sum_j exp(scale s_ij)) = ln 2 (m + log2 l), m the running max in base 2;
                // -inf for a row that sees no key.
                ((float*)a.lse)[(i64)b * L + row] = (mrow[mt][h] + att_log2(l)) * 0.6931471805599453f;
            }
            if (row < L) {
                u32* dst = (u32*)(og + (i64)row * a.o_row + 2 * (lane & 3));
#pragma unroll
                for (int dt = 0; dt < D / 8; ++dt)
                    dst[dt * 4] = M::pack(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
            }
        }
    }
}

// Per head dim: BM, MT and the blocks per multiprocessor the registers are capped for. Mirrors
// `config` in src/launch/attention.rs.
#define ATTENTION(TN, T, D, BM_, MT_, MINB)                                                                         \
    extern "C" __global__ void __launch_bounds__(BM_ / (16 * MT_) * 32, MINB) attention_##TN##_d##D(AttnArgs a) { \
        const AttnMask none = {};                                                                                   \
        attention_fwd<T, D, BM_, MT_, false>(a, none);                                                              \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(BM_ / (16 * MT_) * 32, MINB)                                      \
        attention_masked_##TN##_d##D(AttnArgs a, AttnMask m) {                                                      \
        attention_fwd<T, D, BM_, MT_, true>(a, m);                                                                  \
    }

// Measured on an H200 (B·H = 128, L = S = 1024): head dim 64 is fastest with 4 warps of 32 rows
// (254 registers, no spills), 128 with 4 warps of 16 rows and two blocks per multiprocessor.
ATTENTION(bf16, bf16, 64, 128, 2, 1)
ATTENTION(bf16, bf16, 128, 64, 1, 2)
ATTENTION(f16, f16, 64, 128, 2, 1)
ATTENTION(f16, f16, 128, 64, 1, 2)

// `attention_lse_unseen`: the log-sum-exp a backward that recomputes P = exp(s − lse) can take
// (cuDNN's fused backward with a mask): a row that sees no key has lse −inf, and its masked
// scores are −inf too, so exp(−inf − (−inf)) would be NaN; +inf makes its probabilities 0, hence
// its gradients 0, as the flash backward's preprocess does. out[i] = lse[i], −inf made +inf.
extern "C" __global__ void __launch_bounds__(256) attention_lse_unseen(const float* lse, float* out, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float x = lse[i];
        out[i] = x == att_neg_inf() ? __int_as_float(0x7f800000) : x;
    }
}
