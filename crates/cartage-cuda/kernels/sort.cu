// sort.cu: stable sort along one dimension (Kernel::Sort).
// Every value becomes an unsigned 64-bit key whose order is the wanted order (NaN above +inf,
// -0 equal to +0; all bits inverted for a descending sort), paired with its position: sorting
// the (key, position) pairs, which are all distinct, is a stable sort in both directions.
// - `sort_tile_<dtype>`: a block sorts one tile of up to SORT_TILE pairs in shared memory
//   (bitonic network over the next power of two, padding sorting last). With `direct` the tile
//   is a whole row and the block writes `values` and `indices`; otherwise it writes the sorted
//   tile to scratch (pairs, row-major [rows, cols]) for the merge passes.
// - `sort_merge`: one pass of a merge sort over scratch: runs of `width` are merged pairwise;
//   each element finds its place by a binary search in the other run (ping-pong buffers).
// - `sort_finish_b<bytes>`: writes `indices` and the values they point to.

#define SORT_TILE 2048

struct SortGeom {
    u64 rows;
    u64 cols;
    Shape rows_shape;
    Strides rows_in;
    Strides rows_val;
    Strides rows_idx;
    i64 in_stride;
    i64 val_stride;
    i64 idx_stride;
    u64 tiles;  // tiles per row
    i32 descending;
    i32 direct;
};

__device__ __forceinline__ u64 key_f32(float f) {
    u32 u = __float_as_uint(f);
    if (f != f) u = 0x7fc00000u;
    if (u == 0x80000000u) u = 0;
    return (u64)((u & 0x80000000u) ? ~u : (u | 0x80000000u));
}
__device__ __forceinline__ u64 sort_key(float x) { return key_f32(x); }
__device__ __forceinline__ u64 sort_key(f16 x) { return key_f32(f16_to_f32(x)); }
__device__ __forceinline__ u64 sort_key(bf16 x) { return key_f32(bf16_to_f32(x)); }
__device__ __forceinline__ u64 sort_key(double d) {
    u64 u = (u64)__double_as_longlong(d);
    if (d != d) u = 0x7ff8000000000000ull;
    if (u == 0x8000000000000000ull) u = 0;
    return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}
__device__ __forceinline__ u64 sort_key(i32 x) { return (u64)((u32)x ^ 0x80000000u); }
__device__ __forceinline__ u64 sort_key(i64 x) { return (u64)x ^ 0x8000000000000000ull; }
__device__ __forceinline__ u64 sort_key(u8 x) { return (u64)x; }
__device__ __forceinline__ u64 sort_key(bool8 x) { return (u64)x.v; }

__device__ __forceinline__ bool pair_less(u64 ka, u32 ia, u64 kb, u32 ib) { return ka < kb || (ka == kb && ia < ib); }

__device__ __forceinline__ i64 sort_row_offset(u64 row, const Shape* sh, const Strides* s) {
    if (sh->rank == 1) return (i64)row * s->s[0];
    return offset1_at(row, sh, s);
}

template <typename T> __device__ void sort_tile(const T* in, T* values, i64* indices, u64* skeys, u32* sidx, const SortGeom& param) {
    __shared__ SortGeom g;
    __shared__ u64 keys[SORT_TILE];
    __shared__ u32 idx[SORT_TILE];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const u64 flip = g.descending ? ~0ull : 0ull;
    for (u64 unit = blockIdx.x; unit < g.rows * g.tiles; unit += gridDim.x) {
        const u64 row = unit / g.tiles, tile = unit - row * g.tiles;
        const u64 c0 = tile * SORT_TILE;
        const u64 count = g.cols - c0 < SORT_TILE ? g.cols - c0 : SORT_TILE;
        u32 n = 1;
        while (n < count) n <<= 1;
        const T* ip = in + sort_row_offset(row, &g.rows_shape, &g.rows_in);
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
            if (i < count) {
                keys[i] = sort_key(ip[(i64)(c0 + i) * g.in_stride]) ^ flip;
                idx[i] = (u32)(c0 + i);
            } else {
                keys[i] = ~0ull;
                idx[i] = 0xffffffffu;
            }
        }
        __syncthreads();
        for (u32 k = 2; k <= n; k <<= 1) {
            for (u32 j = k >> 1; j > 0; j >>= 1) {
                for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
                    u32 p = i ^ j;
                    if (p > i) {
                        u64 ka = keys[i], kb = keys[p];
                        u32 ia = idx[i], ib = idx[p];
                        bool up = (i & k) == 0;
                        if (pair_less(kb, ib, ka, ia) == up) {
                            keys[i] = kb;
                            keys[p] = ka;
                            idx[i] = ib;
                            idx[p] = ia;
                        }
                    }
                }
                __syncthreads();
            }
        }
        if (g.direct) {
            T* vp = values + sort_row_offset(row, &g.rows_shape, &g.rows_val);
            i64* xp = indices + sort_row_offset(row, &g.rows_shape, &g.rows_idx);
            for (u32 i = threadIdx.x; i < count; i += blockDim.x) {
                u32 at = idx[i];
                xp[(i64)i * g.idx_stride] = (i64)at;
                vp[(i64)i * g.val_stride] = ip[(i64)at * g.in_stride];
            }
        } else {
            const u64 base = row * g.cols + c0;
            for (u32 i = threadIdx.x; i < count; i += blockDim.x) {
                skeys[base + i] = keys[i];
                sidx[base + i] = idx[i];
            }
        }
        __syncthreads();
    }
}

#define SORT_TILE_KERNEL(TN, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        sort_tile_##TN(const T* in, T* values, i64* indices, u64* skeys, u32* sidx, SortGeom g) {                   \
        sort_tile<T>(in, values, indices, skeys, sidx, g);                                                          \
    }

SORT_TILE_KERNEL(f32, f32)
SORT_TILE_KERNEL(f64, f64)
SORT_TILE_KERNEL(f16, f16)
SORT_TILE_KERNEL(bf16, bf16)
SORT_TILE_KERNEL(i32, i32)
SORT_TILE_KERNEL(i64, i64)
SORT_TILE_KERNEL(u8, u8)
SORT_TILE_KERNEL(bool, bool8)

// Number of pairs in [lo, hi) of the sorted run that are less than (k, i).
__device__ __forceinline__ u64 rank_in(const u64* keys, const u32* idx, u64 lo, u64 hi, u64 k, u32 i) {
    u64 a = lo, b = hi;
    while (a < b) {
        u64 m = (a + b) / 2;
        if (pair_less(keys[m], idx[m], k, i)) {
            a = m + 1;
        } else {
            b = m;
        }
    }
    return a - lo;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    sort_merge(const u64* kin, const u32* iin, u64* kout, u32* iout, u64 rows, u64 cols, u64 width) {
    const u64 total = rows * cols;
    for (u64 e = global_thread(); e < total; e += grid_threads()) {
        const u64 row = e / cols, p = e - row * cols, base = row * cols;
        const u64 start = p - p % (2 * width);
        const u64 mid = start + width < cols ? start + width : cols;
        const u64 end = start + 2 * width < cols ? start + 2 * width : cols;
        const u64 k = kin[e];
        const u32 i = iin[e];
        u64 at;
        if (p < mid) {
            at = p + rank_in(kin + base, iin + base, mid, end, k, i);
        } else {
            at = start + (p - mid) + rank_in(kin + base, iin + base, start, mid, k, i);
        }
        kout[base + at] = k;
        iout[base + at] = i;
    }
}

template <typename V> __device__ void sort_finish(const V* in, V* values, i64* indices, const u32* sidx, const SortGeom& param) {
    __shared__ SortGeom g;
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const u64 total = g.rows * g.cols;
    for (u64 e = global_thread(); e < total; e += grid_threads()) {
        const u64 row = e / g.cols, p = e - row * g.cols;
        const u32 at = sidx[e];
        const V* ip = in + sort_row_offset(row, &g.rows_shape, &g.rows_in);
        values[sort_row_offset(row, &g.rows_shape, &g.rows_val) + (i64)p * g.val_stride] = ip[(i64)at * g.in_stride];
        indices[sort_row_offset(row, &g.rows_shape, &g.rows_idx) + (i64)p * g.idx_stride] = (i64)at;
    }
}

#define SORT_FINISH(BYTES, V)                                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        sort_finish_b##BYTES(const V* in, V* values, i64* indices, const u32* sidx, SortGeom g) {                   \
        sort_finish<V>(in, values, indices, sidx, g);                                                               \
    }
SORT_FINISH(1, u8)
SORT_FINISH(2, u16)
SORT_FINISH(4, u32)
SORT_FINISH(8, u64)
