// attention_f32.cuh: what the f32 flash-attention kernels (attention_f32.cu, the forward, and
// attention_f32_backward.cu) share: cp.async copies of f32 tiles into shared memory with rows
// padded by 4 floats, the columns a thread of a half-warp owns, and half-warp reductions.
// Prepended to those files after common.cuh and attention_mma.cuh by
// crates/cartage-cuda/src/modules.rs.

extern __shared__ __align__(16) u8 af_smem[];

// Queue the copy of rows [0, valid) of a [ROWS, D] f32 tile at `g` (rows `stride` elements apart)
// into shared memory at `dst`, rows D + 4 floats apart; rows past `valid` become zeros.
template <int D, int ROWS, int NT>
__device__ __forceinline__ void af_load_tile(u32 dst, const float* g, i64 stride, int valid) {
    constexpr int CHUNKS = D / 4;
    static_assert(ROWS * CHUNKS % NT == 0, "whole passes of the block");
#pragma unroll
    for (int it = 0; it < ROWS * CHUNKS / NT; ++it) {
        const int i = it * NT + (int)threadIdx.x;
        const int r = i / CHUNKS, c = i % CHUNKS;
        const bool in = r < valid;
        const float* src = in ? g + (i64)r * stride + c * 4 : g;
        att_cp_async(dst + (u32)((r * (D + 4) + c * 4) * 4), src, in ? 16u : 0u);
    }
}

// The column of a D-wide row that thread tx of a half-warp owns as its c-th (c < D / 16): groups
// of 4 (float4 accesses) where D is a multiple of 64, else every 16th column.
template <int D> __device__ __forceinline__ int af_col(int tx, int c) {
    if constexpr (D % 64 == 0) {
        return (c >> 2) * 64 + tx * 4 + (c & 3);
    } else {
        return tx + 16 * c;
    }
}

// The D / 16 columns of `row` (shared or global) that thread tx owns.
template <int D> __device__ __forceinline__ void af_read_cols(const float* row, int tx, float* x) {
    if constexpr (D % 64 == 0) {
#pragma unroll
        for (int g = 0; g < D / 64; ++g) {
            const float4 v = *(const float4*)(row + g * 64 + tx * 4);
            x[4 * g] = v.x;
            x[4 * g + 1] = v.y;
            x[4 * g + 2] = v.z;
            x[4 * g + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int c = 0; c < D / 16; ++c) x[c] = row[tx + 16 * c];
    }
}

// Store the D / 16 columns of `row` that thread tx owns, each times `mul`.
template <int D> __device__ __forceinline__ void af_write_cols(float* row, int tx, const float* x, float mul) {
    if constexpr (D % 64 == 0) {
#pragma unroll
        for (int g = 0; g < D / 64; ++g) {
            float4 v;
            v.x = x[4 * g] * mul;
            v.y = x[4 * g + 1] * mul;
            v.z = x[4 * g + 2] * mul;
            v.w = x[4 * g + 3] * mul;
            *(float4*)(row + g * 64 + tx * 4) = v;
        }
    } else {
#pragma unroll
        for (int c = 0; c < D / 16; ++c) row[tx + 16 * c] = x[c] * mul;
    }
}

// Element i (a constant after unrolling) of a float4.
__device__ __forceinline__ float af_lane(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// a·b over a float4 pair, added to `acc` in order (x, y, z, w).
__device__ __forceinline__ float af_dot4(const float4& a, const float4& b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// The max over the 16 lanes of a half-warp.
__device__ __forceinline__ float af_half_max(float x) {
#pragma unroll
    for (int m = 1; m < 16; m <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
    return x;
}

// The sum over the 16 lanes of a half-warp.
__device__ __forceinline__ float af_half_sum(float x) {
#pragma unroll
    for (int m = 1; m < 16; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    return x;
}
