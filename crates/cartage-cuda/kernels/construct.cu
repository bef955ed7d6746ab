// construct.cu: kernels that write values without reading a tensor — Fill, Arange, Random —
// plus the by-size strided Copy. Values are built on the device (R7: no host copy).
// `fill_b<bytes>_contig(out, n, bits)` / `fill_b<bytes>_strided(out, shape, strides, bits)`.
// `arange_<dtype>(out, shape, strides, start, step)`: start + i * step in f64, then `as`.
// `rand_<dtype>` / `randn_<dtype>`: Philox4x32-10, identical to cartage_core::random.
// `copy_b<bytes>_strided(out, in, shape, out_strides, in_strides)` (also b16: 16-byte vectors,
// for copies whose innermost dimension is contiguous on both sides, widened by the host).
// `transpose_b<bytes>(out, in, rest, rest_out, rest_in, rows, cols, out_row, in_col)`: the tiled
// copy of a transposed view, out[r * out_row + c] = in[r + c * in_col] for each position of the
// `rest` dimensions, through a shared-memory tile so that both the reads (along r) and the writes
// (along c) are coalesced.

template <typename V> __device__ void fill_contig(V* out, u64 n, u64 bits) {
    const int N = Lanes<V>::n;
    V value = (V)bits;
    Pack<V, N> p;
#pragma unroll
    for (int k = 0; k < N; ++k) p.v[k] = value;
    u64 nvec = n / N;
    Pack<V, N>* vo = (Pack<V, N>*)out;
    for (u64 i = global_thread(); i < nvec; i += grid_threads()) vo[i] = p;
    for (u64 i = nvec * N + global_thread(); i < n; i += grid_threads()) out[i] = value;
}

template <typename V> __device__ void fill_strided(V* out, const Shape& sh, const Strides& so, u64 bits) {
    V value = (V)bits;
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) out[offset1(i, sh, so)] = value;
}

template <typename V>
__device__ void copy_strided(V* out, const V* in, const Shape& sh, const Strides& so, const Strides& si) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, oi;
        offset2(i, sh, so, si, oo, oi);
        out[oo] = in[oi];
    }
}

#define BY_SIZE(BYTES, V)                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) fill_b##BYTES##_contig(V* out, u64 n, u64 bits) {         \
        fill_contig<V>(out, n, bits);                                                                               \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        fill_b##BYTES##_strided(V* out, Shape sh, Strides so, u64 bits) {                                           \
        fill_strided<V>(out, sh, so, bits);                                                                         \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        copy_b##BYTES##_strided(V* out, const V* in, Shape sh, Strides so, Strides si) {                            \
        copy_strided<V>(out, in, sh, so, si);                                                                       \
    }

BY_SIZE(1, u8)
BY_SIZE(2, u16)
BY_SIZE(4, u32)
BY_SIZE(8, u64)

extern "C" __global__ void __launch_bounds__(THREADS)
    copy_b16_strided(uint4* out, const uint4* in, Shape sh, Strides so, Strides si) {
    copy_strided<uint4>(out, in, sh, so, si);
}

// ---- tiled transpose -----------------------------------------------------------------------------

#define TILE 32
#define TILE_ROWS (THREADS / TILE)

template <typename V>
__device__ void transpose_tiled(V* out, const V* in, const Shape& rest, const Strides& ro, const Strides& ri, u64 rows,
                                u64 cols, i64 out_row, i64 in_col) {
    __shared__ V tile[TILE][TILE + 1];
    const u64 row_tiles = (rows + TILE - 1) / TILE;
    const u64 col_tiles = (cols + TILE - 1) / TILE;
    const int tx = threadIdx.x % TILE, ty = threadIdx.x / TILE;
    for (u64 k = blockIdx.z; k < rest.numel; k += gridDim.z) {
        i64 oo, oi;
        offset2(k, rest, ro, ri, oo, oi);
        for (u64 rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
            for (u64 ct = blockIdx.x; ct < col_tiles; ct += gridDim.x) {
                const u64 r0 = rt * TILE, c0 = ct * TILE;
                // Read: consecutive threads take consecutive rows (the input's unit stride).
                const u64 r = r0 + tx;
#pragma unroll
                for (int j = ty; j < TILE; j += TILE_ROWS) {
                    const u64 c = c0 + j;
                    if (r < rows && c < cols) tile[j][tx] = in[oi + (i64)r + (i64)c * in_col];
                }
                __syncthreads();
                // Write: consecutive threads take consecutive columns (the output's unit stride).
                const u64 c = c0 + tx;
#pragma unroll
                for (int j = ty; j < TILE; j += TILE_ROWS) {
                    const u64 rr = r0 + j;
                    if (rr < rows && c < cols) out[oo + (i64)rr * out_row + (i64)c] = tile[tx][j];
                }
                __syncthreads();
            }
        }
    }
}

#define TRANSPOSE(BYTES, V)                                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        transpose_b##BYTES(V* out, const V* in, Shape rest, Strides ro, Strides ri, u64 rows, u64 cols, i64 out_row, \
                           i64 in_col) {                                                                            \
        transpose_tiled<V>(out, in, rest, ro, ri, rows, cols, out_row, in_col);                                     \
    }

TRANSPOSE(1, u8)
TRANSPOSE(2, u16)
TRANSPOSE(4, u32)
TRANSPOSE(8, u64)

// ---- arange ------------------------------------------------------------------------------------

template <typename T> __device__ void arange(T* out, const Shape& sh, const Strides& so, double start, double step) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        out[offset1(i, sh, so)] = from_f64<T>(start + (double)i * step);
    }
}

#define ARANGE(TN, T)                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        arange_##TN(T* out, Shape sh, Strides so, double start, double step) {                                      \
        arange<T>(out, sh, so, start, step);                                                                        \
    }

ARANGE(f32, f32)
ARANGE(f64, f64)
ARANGE(f16, f16)
ARANGE(bf16, bf16)
ARANGE(i32, i32)
ARANGE(i64, i64)
ARANGE(u8, u8)
ARANGE(bool, bool8)

// ---- random: Philox4x32-10 ---------------------------------------------------------------------

struct Words { u32 w[4]; };

__device__ __forceinline__ Words philox(u64 seed, u64 index) {
    u32 c0 = (u32)index, c1 = (u32)(index >> 32), c2 = 0, c3 = 0;
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    Words r;
    r.w[0] = c0;
    r.w[1] = c1;
    r.w[2] = c2;
    r.w[3] = c3;
    return r;
}

template <typename T>
__device__ void rand_uniform(T* out, const Shape& sh, const Strides& so, u64 seed, u64 offset, double low,
                             double high) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        Words w = philox(seed, offset + i);
        float u = (float)(w.w[0] >> 8) * (1.0f / 16777216.0f);
        out[offset1(i, sh, so)] = from_f64<T>(low + (high - low) * (double)u);
    }
}

template <typename T>
__device__ void rand_normal(T* out, const Shape& sh, const Strides& so, u64 seed, u64 offset, double mean, double std) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        Words w = philox(seed, offset + i);
        float u1 = (float)((w.w[0] >> 8) + 1) * (1.0f / 16777216.0f);
        float u2 = (float)(w.w[1] >> 8) * (1.0f / 16777216.0f);
        float z = sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
        out[offset1(i, sh, so)] = from_f64<T>(mean + std * (double)z);
    }
}

#define RANDOM(TN, T)                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        rand_##TN(T* out, Shape sh, Strides so, u64 seed, u64 offset, double low, double high) {                    \
        rand_uniform<T>(out, sh, so, seed, offset, low, high);                                                      \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        randn_##TN(T* out, Shape sh, Strides so, u64 seed, u64 offset, double mean, double std) {                   \
        rand_normal<T>(out, sh, so, seed, offset, mean, std);                                                       \
    }

RANDOM(f32, f32)
RANDOM(f64, f64)
RANDOM(f16, f16)
RANDOM(bf16, bf16)
