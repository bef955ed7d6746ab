// attention_mma.cuh: what the flash-attention kernels (attention.cu, the forward, and
// attention_flash_backward.cu, and the f32 pair attention_f32*.cu) share: the forward's argument
// struct, cp.async tile copies into XOR-swizzled shared memory, ldmatrix, and the mma.sync
// m16n8k16 product with f32 accumulation for bf16 and f16.
// Prepended to those files after common.cuh by crates/cartage-cuda/src/modules.rs.
//
// Fragment layouts (PTX ISA, mma.m16n8k16): lane t holds, of an A fragment (16 x 16, row-major),
// rows t/4 and t/4 + 8 at columns 2(t%4) + {0, 1} and + 8; of a B fragment (16 x 8, k x n), rows
// 2(t%4) + {0, 1} and + 8 of column t/4; of the f32 accumulator (16 x 8), c0 c1 at row t/4 and
// c2 c3 at row t/4 + 8, columns 2(t%4) + {0, 1}. An accumulator pair of n-tiles (2kk, 2kk + 1)
// packed to 16 bits is thus the A fragment of k-step kk of the next product.

// The forward kernels' argument (attention.cu and attention_f32.cu); mirrors `AttentionArgs`
// in src/launch/attention.rs. q, k and v are [B, rows, D] or [B1, B2, rows, D] (the heads of a
// packed projection read in place): batch entry b starts at att_batch(b, heads, *_batch, *_inner).
struct AttnArgs {
    u64 q;
    u64 k;
    u64 v;
    u64 out;
    u64 lse;  // [B, L] f32, or 0 for none
    i64 q_batch;
    i64 q_row;
    i64 k_batch;
    i64 k_row;
    i64 v_batch;
    i64 v_row;
    i64 q_inner;  // the inner batch stride of [B1, B2, rows, D] operands (0 for [B, rows, D])
    i64 k_inner;
    i64 v_inner;
    i64 o_batch;  // the output's strides: outer, inner (0 for [B, L, D]) and row
    i64 o_inner;
    i64 o_row;
    u32 batch;  // B = B1 B2
    u32 l;
    u32 s;
    u32 m_blocks;
    f32 scale_log2;
    i32 causal;
    u32 heads;  // B2 (1 for [B, rows, D] operands)
    u32 pad;
};

// The element offset of batch entry b (= b1 B2 + b2) of an operand [B1, B2, rows, D] with batch
// strides `outer` and `inner` (a [B, rows, D] operand: heads = 1, inner = 0).
__device__ __forceinline__ i64 att_batch(u32 b, u32 heads, i64 outer, i64 inner) {
    return (i64)(b / heads) * outer + (i64)(b % heads) * inner;
}

// The additive mask of the `_masked` kernels (Kernel::Attention's `AttentionMask`), forward and
// backward: values of the kernel's element type [outer, inner, L, S] with strides in elements (0
// along a broadcast dimension); batch entry b reads entry (b / inner_count, b % inner_count).
// Mirrors `MaskArgs` in src/launch/attention.rs.
struct AttnMask {
    u64 values;
    i64 outer;
    i64 inner;
    i64 row;
    i64 col;
    u32 inner_count;
    u32 pad;
};

// Batch entry b's [L, S] plane of the mask.
template <typename T> __device__ __forceinline__ const T* att_mask_plane(const AttnMask& m, u32 b) {
    return (const T*)m.values + (i64)(b / m.inner_count) * m.outer + (i64)(b % m.inner_count) * m.inner;
}

__device__ __forceinline__ float att_neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float att_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float att_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ u32 att_smem_addr(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared; `bytes` = 0 fills the destination with zeros and reads nothing.
__device__ __forceinline__ void att_cp_async(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void att_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void att_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void att_ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void att_ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// The tensor-core product and the f32 -> 16-bit pair packing of each element type.
template <typename T> struct AttMma;
template <> struct AttMma<bf16> {
    __device__ static __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ static __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct AttMma<f16> {
    __device__ static __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    __device__ static __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

// Byte offset of element (row, col) in a swizzled [rows, C] 16-bit tile; col is a multiple of 8.
// The 16-byte chunks of a row are permuted by its row number so that the eight rows an
// ldmatrix reads fall in eight different bank groups: XOR with row & 7 for rows of 8 or more
// chunks, with (row / 2) & 3 for rows of 4 (two rows share 128 bytes).
template <int C> __device__ __forceinline__ u32 att_swz(int row, int col) {
    static_assert(C == 32 || C % 64 == 0, "rows of 4 or a multiple of 8 chunks");
    const int chunk = C >= 64 ? (col >> 3) ^ (row & 7) : (col >> 3) ^ ((row >> 1) & 3);
    return (u32)((row * C + (chunk << 3)) * 2);
}

// Queue the copy of rows [0, valid) of a [ROWS, D] tile at `g` (rows `stride` elements apart)
// into shared memory at `dst`; rows past `valid` become zeros.
template <int D, int ROWS, int THREADS_>
__device__ __forceinline__ void att_load_tile(u32 dst, const u16* g, i64 stride, int valid) {
    constexpr int CHUNKS = D / 8;
    static_assert(ROWS * CHUNKS % THREADS_ == 0, "whole passes of the block");
#pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / THREADS_; ++it) {
        const int i = it * THREADS_ + (int)threadIdx.x;
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool in = r < valid;
        const u16* src = in ? g + (i64)r * stride + c * 8 : g;
        att_cp_async(dst + att_swz<D>(r, c * 8), src, in ? 16u : 0u);
    }
}

// A 32-bit store into shared memory at the shared-window address `addr`.
__device__ __forceinline__ void att_st_shared(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
