// sort_radix.cu: stable LSD radix sort of long rows (Kernel::Sort), 8-bit digits.
// Every value becomes an unsigned key (u32 for dtypes of up to 32 bits, u64 for f64/i64) whose
// order is the wanted order: floats flip the sign bit of positives and every bit of negatives,
// NaN (any payload) becomes one canonical quiet NaN above +inf, -0 becomes +0 (equal keys keep
// their input order), signed integers flip the sign bit; a descending sort complements the key,
// which keeps equal keys in input order. The (key, column) pairs are sorted by one pass per digit,
// least significant first (1 pass for u8/bool, 2 for f16/bf16, 4 for f32/i32, 8 for f64/i64);
// every pass is stable, so the whole sort is.
// - `radix_hist_<dtype>`: every pass's digit histogram of every row at once, into `hist`
//   ([rows][passes][256], zeroed by the host).
// - `radix_pass_<dtype>`: one pass; one block per tile of RADIX_TILE columns, tiles taken in
//   order from a ticket counter. Each warp ranks its elements by digit in input order (ballots
//   find the lanes holding the same digit), the block turns the per-warp counts into offsets,
//   and the tile's offset among the row's earlier tiles comes from a decoupled look-back over
//   `status` ([passes][rows * tiles][256] words: a flag and a count, zeroed by the host). The
//   first pass reads `input` (position = column); the last writes `indices` and the values they
//   point to; the others go through scratch pairs (row-major [rows, cols]). With 4-byte keys a
//   tile is staged in shared memory in output order and written out run by run (coalesced);
//   8-byte keys scatter directly. A pass whose digit is the same for a whole row (one histogram
//   bin holds the row) keeps every element in place.

#define RADIX_ITEMS 16
#define RADIX_WARPS (THREADS / 32)
#define RADIX_TILE (THREADS * RADIX_ITEMS)
#define RADIX_BINS 256
#define RADIX_MAX_PASSES 8
// Look-back words: the tile's own count (AGGREGATE) or the count of every tile up to and
// including it (PREFIX), in the low 30 bits; 0 = not yet published.
#define RADIX_AGGREGATE 0x40000000u
#define RADIX_PREFIX 0x80000000u
#define RADIX_COUNT_MASK 0x3fffffffu
// Earlier tiles one look-back step reads at once.
#define RADIX_WINDOW 16

struct RadixGeom {
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
    i32 passes;
};

// ---- order-preserving keys ---------------------------------------------------------------------

__device__ __forceinline__ u32 radix_float32(u32 u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7fc00000u;
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ u32 radix_float16(u32 u, u32 inf, u32 nan) {
    if ((u & 0x7fffu) > inf) u = nan;
    if (u == 0x8000u) u = 0;
    return (u & 0x8000u) ? (~u & 0xffffu) : (u | 0x8000u);
}

template <typename T> struct RadixKey;
template <> struct RadixKey<f32> {
    typedef u32 K;
    static __device__ __forceinline__ u32 of(f32 x) { return radix_float32(__float_as_uint(x)); }
};
template <> struct RadixKey<f16> {
    typedef u32 K;
    static __device__ __forceinline__ u32 of(f16 x) { return radix_float16(x.bits, 0x7c00u, 0x7e00u); }
};
template <> struct RadixKey<bf16> {
    typedef u32 K;
    static __device__ __forceinline__ u32 of(bf16 x) { return radix_float16(x.bits, 0x7f80u, 0x7fc0u); }
};
template <> struct RadixKey<f64> {
    typedef u64 K;
    static __device__ __forceinline__ u64 of(f64 x) {
        u64 u = (u64)__double_as_longlong(x);
        if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) u = 0x7ff8000000000000ull;
        if (u == 0x8000000000000000ull) u = 0;
        return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
    }
};
template <> struct RadixKey<i32> {
    typedef u32 K;
    static __device__ __forceinline__ u32 of(i32 x) { return (u32)x ^ 0x80000000u; }
};
template <> struct RadixKey<i64> {
    typedef u64 K;
    static __device__ __forceinline__ u64 of(i64 x) { return (u64)x ^ 0x8000000000000000ull; }
};
template <> struct RadixKey<u8> {
    typedef u32 K;
    static __device__ __forceinline__ u32 of(u8 x) { return (u32)x; }
};
template <> struct RadixKey<bool8> {
    typedef u32 K;
    static __device__ __forceinline__ u32 of(bool8 x) { return (u32)x.v; }
};

// ---- helpers -----------------------------------------------------------------------------------

__device__ __forceinline__ i64 radix_row_offset(u64 row, const Shape* sh, const Strides* s) {
    if (sh->rank == 1) return (i64)row * s->s[0];
    return offset1_at(row, sh, s);
}

// The lanes of the warp whose `digit` equals this lane's, among the lanes with `valid` set.
// Every lane of the warp must call it.
__device__ __forceinline__ u32 radix_peers(u32 digit, bool valid) {
    u32 peers = __ballot_sync(0xffffffffu, valid);
#pragma unroll
    for (int b = 0; b < 8; ++b) {
        const u32 bit = (digit >> b) & 1u;
        const u32 ones = __ballot_sync(0xffffffffu, bit);
        peers &= bit ? ones : ~ones;
    }
    return peers;
}

// Exclusive prefix sum over the block of one value per thread (THREADS threads, in thread
// order). `sums` is shared scratch of RADIX_WARPS words. Holds two __syncthreads: every thread
// of the block must call it.
__device__ __forceinline__ u32 radix_block_scan(u32 v, u32* sums) {
    const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    u32 inclusive = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        const u32 t = __shfl_up_sync(0xffffffffu, inclusive, o);
        if (lane >= o) inclusive += t;
    }
    if (lane == 31u) sums[warp] = inclusive;
    __syncthreads();
    u32 before = 0;
    for (u32 w = 0; w < warp; ++w) before += sums[w];
    __syncthreads();
    return before + inclusive - v;
}

// ---- histograms ---------------------------------------------------------------------------------

template <typename T> __device__ void radix_hist(const T* in, u32* hist, const RadixGeom& param) {
    typedef typename RadixKey<T>::K K;
    __shared__ RadixGeom g;
    __shared__ u32 s_hist[RADIX_MAX_PASSES * RADIX_BINS];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const K flip = g.descending ? ~(K)0 : (K)0;
    const u32 bins = (u32)g.passes * RADIX_BINS;
    for (u64 unit = blockIdx.x; unit < g.rows * g.tiles; unit += gridDim.x) {
        for (u32 b = threadIdx.x; b < bins; b += blockDim.x) s_hist[b] = 0;
        __syncthreads();
        const u64 row = unit / g.tiles, tile = unit - row * g.tiles;
        const u64 c0 = tile * RADIX_TILE;
        const u32 count = (u32)(g.cols - c0 < RADIX_TILE ? g.cols - c0 : RADIX_TILE);
        const T* ip = in + radix_row_offset(row, &g.rows_shape, &g.rows_in);
        for (u32 i = threadIdx.x; i < count; i += blockDim.x) {
            const K k = RadixKey<T>::of(ip[(i64)(c0 + i) * g.in_stride]) ^ flip;
            for (i32 p = 0; p < g.passes; ++p) {
                atomicAdd(&s_hist[p * RADIX_BINS + ((u32)(k >> (8 * p)) & 0xffu)], 1u);
            }
        }
        __syncthreads();
        u32* hp = hist + row * bins;
        for (u32 b = threadIdx.x; b < bins; b += blockDim.x) {
            const u32 n = s_hist[b];
            if (n != 0) atomicAdd(hp + b, n);
        }
        __syncthreads();
    }
}

#define RADIX_HIST_KERNEL(TN, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) radix_hist_##TN(const T* in, u32* hist, RadixGeom g) {    \
        radix_hist<T>(in, hist, g);                                                                                 \
    }

RADIX_HIST_KERNEL(f32, f32)
RADIX_HIST_KERNEL(f64, f64)
RADIX_HIST_KERNEL(f16, f16)
RADIX_HIST_KERNEL(bf16, bf16)
RADIX_HIST_KERNEL(i32, i32)
RADIX_HIST_KERNEL(i64, i64)
RADIX_HIST_KERNEL(u8, u8)
RADIX_HIST_KERNEL(bool, bool8)

// ---- one digit pass -----------------------------------------------------------------------------

// Where an element goes: `dest` in its row. The last pass writes `indices` and `values`
// (gathered from `input` through the position), the others the scratch pair.
template <typename T, typename K>
__device__ __forceinline__ void radix_put(bool last, u64 dest, K key, u32 pos, const T* ip, T* vp, i64* xp, K* kr,
                                          u32* ir, const RadixGeom& g) {
    if (last) {
        xp[(i64)dest * g.idx_stride] = (i64)pos;
        vp[(i64)dest * g.val_stride] = ip[(i64)pos * g.in_stride];
    } else {
        kr[dest] = key;
        ir[dest] = pos;
    }
}

template <typename T>
__device__ void radix_pass(const T* in, const typename RadixKey<T>::K* kin, const u32* iin, typename RadixKey<T>::K* kout,
                           u32* iout, T* values, i64* indices, const u32* hist, u32* status, u32* tickets,
                           const RadixGeom& param, u64 pass) {
    typedef typename RadixKey<T>::K K;
    __shared__ RadixGeom g;
    __shared__ u32 s_unit;
    __shared__ u32 s_constant;
    __shared__ u32 s_warp[RADIX_WARPS][RADIX_BINS];  // per-warp digit counts, then offsets
    __shared__ u32 s_base[RADIX_BINS];               // the tile's first slot of each digit
    __shared__ u32 s_sums[RADIX_WARPS];
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    if (tid == 0) {
        g = param;
        // Tiles are taken in ticket order, so every tile this one waits for belongs to a block
        // that is already running.
        s_unit = atomicAdd(tickets + pass, 1u);
        s_constant = 0;
    }
    __syncthreads();
    const u64 unit = s_unit;
    const u64 row = unit / g.tiles, tile = unit - row * g.tiles;
    const u64 c0 = tile * RADIX_TILE;
    const bool first = pass == 0, last = pass + 1 == (u64)g.passes;
    const u32 shift = 8u * (u32)pass;
    const K flip = g.descending ? ~(K)0 : (K)0;
    const T* ip = in + radix_row_offset(row, &g.rows_shape, &g.rows_in);
    T* vp = values + radix_row_offset(row, &g.rows_shape, &g.rows_val);
    i64* xp = indices + radix_row_offset(row, &g.rows_shape, &g.rows_idx);
    const K* krow = kin + row * g.cols;
    const u32* irow = iin + row * g.cols;
    K* kr = kout + row * g.cols;
    u32* ir = iout + row * g.cols;

    // The row's first slot of each digit (thread `tid` owns digit `tid`: RADIX_BINS == THREADS).
    const u32 row_count = hist[(row * (u64)g.passes + pass) * RADIX_BINS + tid];
    if ((u64)row_count == g.cols) s_constant = 1;
    const u32 row_first = radix_block_scan(row_count, s_sums);  // its barriers publish s_constant

    const u64 warp_c0 = c0 + (u64)warp * (RADIX_ITEMS * 32);
    if (s_constant) {
        // One digit for the whole row: this pass keeps every element where it is.
        for (int j = 0; j < RADIX_ITEMS; ++j) {
            const u64 c = warp_c0 + (u64)j * 32 + lane;
            if (c < g.cols) {
                const K key = first ? (K)(RadixKey<T>::of(ip[(i64)c * g.in_stride]) ^ flip) : krow[c];
                const u32 pos = first ? (u32)c : irow[c];
                radix_put<T, K>(last, c, key, pos, ip, vp, xp, kr, ir, g);
            }
        }
        return;
    }

    for (u32 w = 0; w < RADIX_WARPS; ++w) s_warp[w][tid] = 0;
    __syncthreads();

    // Rank: element (warp, j, lane) is column warp_c0 + 32 j + lane, so (warp, j, lane) order is
    // input order; rank[j] counts the earlier elements of the warp with the same digit.
    K key[RADIX_ITEMS];
    u32 pos[RADIX_ITEMS];
    u32 rank[RADIX_ITEMS];
#pragma unroll
    for (int j = 0; j < RADIX_ITEMS; ++j) {
        const u64 c = warp_c0 + (u64)j * 32 + lane;
        const bool valid = c < g.cols;
        K k = 0;
        u32 p = 0;
        if (valid) {
            if (first) {
                k = RadixKey<T>::of(ip[(i64)c * g.in_stride]) ^ flip;
                p = (u32)c;
            } else {
                k = krow[c];
                p = irow[c];
            }
        }
        key[j] = k;
        pos[j] = p;
        const u32 d = (u32)(k >> shift) & 0xffu;
        const u32 peers = radix_peers(d, valid);
        const u32 below = __popc(peers & ((1u << lane) - 1u));
        u32 before = 0;
        if (valid) before = s_warp[warp][d];
        __syncwarp();
        if (valid && below == 0) s_warp[warp][d] = before + __popc(peers);
        __syncwarp();
        rank[j] = before + below;
    }
    __syncthreads();

    // Digit `tid`: each warp's first slot within the tile, and the tile's count.
    u32 tile_count = 0;
    for (u32 w = 0; w < RADIX_WARPS; ++w) {
        const u32 n = s_warp[w][tid];
        s_warp[w][tid] = tile_count;
        tile_count += n;
    }

    // Decoupled look-back: the count of digit `tid` in the row's earlier tiles. Tile 0 of the
    // row publishes a prefix at once, so the walk stops there at the latest. The walk reads
    // RADIX_WINDOW earlier tiles at a time (nearest first) and counts them up to the first
    // prefix; at a tile not yet published it counts what it has and reads again from there.
    volatile u32* st = status + (pass * g.rows * g.tiles) * RADIX_BINS;
    u32 earlier = 0;
    if (tile == 0) {
        st[unit * RADIX_BINS + tid] = RADIX_PREFIX | tile_count;
    } else {
        st[unit * RADIX_BINS + tid] = RADIX_AGGREGATE | tile_count;
        u64 next = unit;  // tiles next-1, next-2, ... are still to count
        const u64 row_start = unit - tile;
        bool done = false;
        while (!done) {
            const u64 avail = next - row_start;  // ≥ 1: tile 0 (a prefix) is never passed
            u32 s[RADIX_WINDOW];
#pragma unroll
            for (int i = 0; i < RADIX_WINDOW; ++i) s[i] = (u64)i < avail ? st[(next - 1 - i) * RADIX_BINS + tid] : 0u;
            u32 used = 0;
#pragma unroll
            for (int i = 0; i < RADIX_WINDOW; ++i) {
                if (done || used != (u32)i || s[i] == 0) continue;  // stopped, or not published yet
                earlier += s[i] & RADIX_COUNT_MASK;
                used = i + 1;
                if (s[i] & RADIX_PREFIX) done = true;
            }
            next -= used;
        }
        st[unit * RADIX_BINS + tid] = RADIX_PREFIX | (earlier + tile_count);
    }
    s_base[tid] = row_first + earlier;
    if constexpr (sizeof(K) == 4) {
        // Staged: the tile's elements are placed in shared memory in their output order (digit
        // by digit), then written out in that order, so the threads of a warp write neighbouring
        // slots of one digit's run instead of scattering one element each.
        __shared__ K s_key[RADIX_TILE];
        __shared__ u32 s_pos[RADIX_TILE];
        __shared__ u32 s_local[RADIX_BINS];  // the tile's first staged slot of each digit
        const u32 local_first = radix_block_scan(tile_count, s_sums);  // its barriers publish s_base
        s_local[tid] = local_first;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < RADIX_ITEMS; ++j) {
            const u64 c = warp_c0 + (u64)j * 32 + lane;
            if (c < g.cols) {
                const u32 d = (u32)(key[j] >> shift) & 0xffu;
                const u32 slot = s_local[d] + s_warp[warp][d] + rank[j];
                s_key[slot] = key[j];
                s_pos[slot] = pos[j];
            }
        }
        __syncthreads();
        const u32 count = (u32)(g.cols - c0 < RADIX_TILE ? g.cols - c0 : RADIX_TILE);
        for (u32 i = tid; i < count; i += THREADS) {
            const K k = s_key[i];
            const u32 d = (u32)(k >> shift) & 0xffu;
            const u64 dest = (u64)s_base[d] + (i - s_local[d]);
            radix_put<T, K>(last, dest, k, s_pos[i], ip, vp, xp, kr, ir, g);
        }
    } else {
        // 8-byte keys: the staging arrays would not fit the static shared memory; scatter.
        __syncthreads();
#pragma unroll
        for (int j = 0; j < RADIX_ITEMS; ++j) {
            const u64 c = warp_c0 + (u64)j * 32 + lane;
            if (c < g.cols) {
                const u32 d = (u32)(key[j] >> shift) & 0xffu;
                const u64 dest = (u64)s_base[d] + s_warp[warp][d] + rank[j];
                radix_put<T, K>(last, dest, key[j], pos[j], ip, vp, xp, kr, ir, g);
            }
        }
    }
}

#define RADIX_PASS_KERNEL(TN, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        radix_pass_##TN(const T* in, const RadixKey<T>::K* kin, const u32* iin, RadixKey<T>::K* kout, u32* iout,    \
                        T* values, i64* indices, const u32* hist, u32* status, u32* tickets, RadixGeom g, u64 pass) { \
        radix_pass<T>(in, kin, iin, kout, iout, values, indices, hist, status, tickets, g, pass);                   \
    }

RADIX_PASS_KERNEL(f32, f32)
RADIX_PASS_KERNEL(f64, f64)
RADIX_PASS_KERNEL(f16, f16)
RADIX_PASS_KERNEL(bf16, bf16)
RADIX_PASS_KERNEL(i32, i32)
RADIX_PASS_KERNEL(i64, i64)
RADIX_PASS_KERNEL(u8, u8)
RADIX_PASS_KERNEL(bool, bool8)
