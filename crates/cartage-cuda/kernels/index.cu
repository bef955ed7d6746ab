// index.cu: Kernel::Gather (torch.gather) and Kernel::IndexSelect, moving values by size, and
// Kernel::Scatter. `gather_b<bytes>_<index dtype>`, `index_select_b<bytes>_<index dtype>`,
// `scatter_b<bytes>_<index dtype>` (assign) and `scatter_add_<dtype>_<index dtype>` (atomic add:
// the hardware's for f32/f64/i32/i64 and, on sm_70+/sm_90+, f16/bf16; a compare-and-swap loop on
// the enclosing 32-bit word otherwise and for u8). Shapes are not
// coalesced here: the kernels need the coordinate along `dim`. An index outside [0, size) is not
// followed: the kernel records it in `fault` (the first thread to find one wins) and the host
// turns it into Error::IndexOutOfRange after reading the flag back.
//
// The row forms (`index_select_rows_w<bytes>_<index dtype>`, `index_add_rows_<dtype>_<index
// dtype>`, see src/launch/index_rows.rs) move whole contiguous rows: a group of lanes per row
// whose first lane reads and checks the index once and hands that value to the others.

struct IndexFault {
    u32 hit;
    u32 pad;
    i64 index;
};

struct IndexGeom {
    Shape out_shape;
    Strides out_strides;
    Strides in_strides;
    Strides index_strides;
    i32 dim;
    i32 pad;
    u64 dim_size;
};

__device__ __forceinline__ void record_fault(IndexFault* fault, i64 index) {
    if (atomicCAS(&fault->hit, 0u, 1u) == 0u) fault->index = index;
}

// torch.gather: out[c] = in[c with c[dim] = index[c]]; out and index share a shape.
template <typename V, typename I>
__device__ void gather(V* out, const V* in, const I* index, IndexFault* fault, const IndexGeom& g) {
    for (u64 i = global_thread(); i < g.out_shape.numel; i += grid_threads()) {
        u64 rest = i;
        i64 oo = 0, oi = 0, ox = 0;
        for (int d = g.out_shape.rank - 1; d >= 0; --d) {
            u64 q = rest / g.out_shape.dims[d];
            i64 c = (i64)(rest - q * g.out_shape.dims[d]);
            rest = q;
            oo += c * g.out_strides.s[d];
            ox += c * g.index_strides.s[d];
            if (d != g.dim) oi += c * g.in_strides.s[d];
        }
        i64 k = (i64)index[ox];
        if (k < 0 || (u64)k >= g.dim_size) {
            record_fault(fault, k);
            continue;
        }
        out[oo] = in[oi + k * g.in_strides.s[g.dim]];
    }
}

// index_select: out[c] = in[c with c[dim] = index[c[dim]]]; index is 1-D.
template <typename V, typename I>
__device__ void index_select(V* out, const V* in, const I* index, IndexFault* fault, const IndexGeom& g) {
    for (u64 i = global_thread(); i < g.out_shape.numel; i += grid_threads()) {
        u64 rest = i;
        i64 oo = 0, oi = 0, pos = 0;
        for (int d = g.out_shape.rank - 1; d >= 0; --d) {
            u64 q = rest / g.out_shape.dims[d];
            i64 c = (i64)(rest - q * g.out_shape.dims[d]);
            rest = q;
            oo += c * g.out_strides.s[d];
            if (d == g.dim) {
                pos = c;
            } else {
                oi += c * g.in_strides.s[d];
            }
        }
        i64 k = (i64)index[pos * g.index_strides.s[0]];
        if (k < 0 || (u64)k >= g.dim_size) {
            record_fault(fault, k);
            continue;
        }
        out[oo] = in[oi + k * g.in_strides.s[g.dim]];
    }
}

#define INDEX(BYTES, V, IN, I)                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        gather_b##BYTES##_##IN(V* out, const V* in, const I* index, IndexFault* fault, IndexGeom g) {               \
        gather<V, I>(out, in, index, fault, g);                                                                     \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        index_select_b##BYTES##_##IN(V* out, const V* in, const I* index, IndexFault* fault, IndexGeom g) {         \
        index_select<V, I>(out, in, index, fault, g);                                                               \
    }

INDEX(1, u8, i32, i32)
INDEX(2, u16, i32, i32)
INDEX(4, u32, i32, i32)
INDEX(8, u64, i32, i32)
INDEX(1, u8, i64, i64)
INDEX(2, u16, i64, i64)
INDEX(4, u32, i64, i64)
INDEX(8, u64, i64, i64)

// ---- scatter -----------------------------------------------------------------------------------

// out[p with p[dim] = index[p]] (= or +=) src[p] for every position p of index (`out_shape` is
// the index's shape, `in_strides` the source's).
template <typename V, typename I, typename Apply>
__device__ void scatter(V* out, const V* src, const I* index, IndexFault* fault, const IndexGeom& g) {
    for (u64 i = global_thread(); i < g.out_shape.numel; i += grid_threads()) {
        u64 rest = i;
        i64 oo = 0, os = 0, ox = 0;
        for (int d = g.out_shape.rank - 1; d >= 0; --d) {
            u64 q = rest / g.out_shape.dims[d];
            i64 c = (i64)(rest - q * g.out_shape.dims[d]);
            rest = q;
            os += c * g.in_strides.s[d];
            ox += c * g.index_strides.s[d];
            if (d != g.dim) oo += c * g.out_strides.s[d];
        }
        i64 k = (i64)index[ox];
        if (k < 0 || (u64)k >= g.dim_size) {
            record_fault(fault, k);
            continue;
        }
        Apply::apply(out + oo + k * g.out_strides.s[g.dim], src[os]);
    }
}

struct AssignV {
    template <typename V> __device__ static void apply(V* dst, V v) { *dst = v; }
};

// A compare-and-swap loop on the 32-bit word holding the 1- or 2-byte element at `p`.
template <typename V> __device__ __forceinline__ void cas_add_narrow(V* p, V v) {
    const u64 addr = (u64)p;
    u32* word = (u32*)(addr & ~3ull);
    const u32 shift = (u32)(addr & 3ull) * 8;
    const u32 mask = (sizeof(V) == 1 ? 0xffu : 0xffffu) << shift;
    u32 old = *word, assumed;
    do {
        assumed = old;
        V cur;
        if (sizeof(V) == 1) {
            u8 b = (u8)((assumed & mask) >> shift);
            cur = *(V*)&b;
        } else {
            u16 h = (u16)((assumed & mask) >> shift);
            cur = *(V*)&h;
        }
        V sum = store<V>(load(cur) + load(v));
        u32 bits = sizeof(V) == 1 ? (u32)*(u8*)&sum : (u32)*(u16*)&sum;
        old = atomicCAS(word, assumed, (assumed & ~mask) | (bits << shift));
    } while (old != assumed);
}

__device__ __forceinline__ void atomic_add_v(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add_v(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add_v(i32* p, i32 v) { atomicAdd((unsigned*)p, (unsigned)v); }
__device__ __forceinline__ void atomic_add_v(i64* p, i64 v) { atomicAdd((unsigned long long*)p, (unsigned long long)v); }
__device__ __forceinline__ void atomic_add_v(u8* p, u8 v) { cas_add_narrow(p, v); }
__device__ __forceinline__ void atomic_add_v(f16* p, f16 v) {
#if __CUDA_ARCH__ >= 700
    asm volatile("red.global.add.noftz.f16 [%0], %1;" ::"l"(p), "h"(v.bits) : "memory");
#else
    cas_add_narrow(p, v);
#endif
}
__device__ __forceinline__ void atomic_add_v(bf16* p, bf16 v) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.noftz.bf16 [%0], %1;" ::"l"(p), "h"(v.bits) : "memory");
#else
    cas_add_narrow(p, v);
#endif
}

struct AddV {
    template <typename V> __device__ static void apply(V* dst, V v) { atomic_add_v(dst, v); }
};

#define SCATTER_ASSIGN(BYTES, V, IN, I)                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        scatter_b##BYTES##_##IN(V* out, const V* src, const I* index, IndexFault* fault, IndexGeom g) {             \
        scatter<V, I, AssignV>(out, src, index, fault, g);                                                          \
    }
#define SCATTER_ADD(TN, T, IN, I)                                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        scatter_add_##TN##_##IN(T* out, const T* src, const I* index, IndexFault* fault, IndexGeom g) {             \
        scatter<T, I, AddV>(out, src, index, fault, g);                                                             \
    }
#define SCATTER_BOTH_INDEX(M, A, B) M(A, B, i32, i32) M(A, B, i64, i64)

SCATTER_BOTH_INDEX(SCATTER_ASSIGN, 1, u8)
SCATTER_BOTH_INDEX(SCATTER_ASSIGN, 2, u16)
SCATTER_BOTH_INDEX(SCATTER_ASSIGN, 4, u32)
SCATTER_BOTH_INDEX(SCATTER_ASSIGN, 8, u64)
SCATTER_BOTH_INDEX(SCATTER_ADD, f32, f32)
SCATTER_BOTH_INDEX(SCATTER_ADD, f64, f64)
SCATTER_BOTH_INDEX(SCATTER_ADD, f16, f16)
SCATTER_BOTH_INDEX(SCATTER_ADD, bf16, bf16)
SCATTER_BOTH_INDEX(SCATTER_ADD, i32, i32)
SCATTER_BOTH_INDEX(SCATTER_ADD, i64, i64)
SCATTER_BOTH_INDEX(SCATTER_ADD, u8, u8)

// ---- whole rows --------------------------------------------------------------------------------

// Positions are (outer o, entry p, unit u): entry p of the index picks row k = index[p]. A gather
// (index_select) writes destination row (o, p) from source row (o, k); a scatter (index_add) adds
// source row (o, p) into destination row (o, k). Units are words of the kernel's width for the
// gather and elements for the scatter; offsets and strides below are in units. Mirrors `RowGeom`
// in src/launch/index_rows.rs.
struct RowGeom {
    u64 tasks;       // outer * count * chunks
    u64 count;       // index entries
    u64 chunks;      // chunks per row
    u64 row_len;     // units per row
    u64 chunk_len;   // units per chunk
    i64 src_outer;   // stride of the outer dimension in the source
    i64 dst_outer;   // and in the destination
    i64 src_step;    // stride of the indexed dimension in the source
    i64 dst_step;    // and in the destination
    i64 index_stride;
    u64 dim_size;    // the bound of the index values
    u32 group;       // lanes per task: a power of two up to 32
    u32 pad;
};

// Lane 0's value of each group of `group` lanes (a power of two up to 32), to every lane of it.
__device__ __forceinline__ i64 row_broadcast(i64 v, u32 group) {
    u32 lo = (u32)(u64)v, hi = (u32)((u64)v >> 32);
    lo = __shfl_sync(0xffffffffu, lo, 0, (int)group);
    hi = __shfl_sync(0xffffffffu, hi, 0, (int)group);
    return (i64)(((u64)hi << 32) | (u64)lo);
}

// One chunk of one row: where the row starts in the source and destination, and its units.
struct RowTask {
    i64 src;
    i64 dst;
    u64 begin;
    u64 end;
};

// Decode task `t` for `lane` of its group. Lane 0 reads the index once; the group uses that very
// value, checked here. Every lane of the warp must call this together (the broadcast is a warp
// shuffle). False when `t` is past the end or its index is out of range (recorded in `fault`).
template <bool SCATTER, typename I>
__device__ __forceinline__ bool row_task(u64 t, u32 lane, const I* index, IndexFault* fault, const RowGeom& g,
                                         RowTask& r) {
    const bool valid = t < g.tasks;
    u64 row = 0, chunk = 0;
    if (valid) {
        row = g.chunks == 1 ? t : t / g.chunks;
        chunk = t - row * g.chunks;
    }
    u64 o = 0, p = row;
    if (row >= g.count) {
        o = row / g.count;
        p = row - o * g.count;
    }
    i64 k = 0;
    if (valid && lane == 0) k = (i64)index[(i64)p * g.index_stride];
    k = row_broadcast(k, g.group);
    if (!valid) return false;
    if (k < 0 || (u64)k >= g.dim_size) {
        if (lane == 0) record_fault(fault, k);
        return false;
    }
    const i64 from = SCATTER ? (i64)p : k;
    const i64 to = SCATTER ? k : (i64)p;
    r.src = (i64)o * g.src_outer + from * g.src_step;
    r.dst = (i64)o * g.dst_outer + to * g.dst_step;
    r.begin = chunk * g.chunk_len;
    r.end = r.begin + g.chunk_len < g.row_len ? r.begin + g.chunk_len : g.row_len;
    return true;
}

// index_select of whole rows, copied as words of type W (1 to 16 bytes) with up to eight loads in
// flight per lane. The loop bound is the same for the whole block, so every lane of a warp reaches the
// shuffle in `row_task` together.
template <typename W, typename I>
__device__ void index_select_rows(W* __restrict__ dst, const W* __restrict__ src, const I* __restrict__ index,
                                  IndexFault* fault, const RowGeom& g) {
    const u32 G = g.group;
    const u32 lane = threadIdx.x & (G - 1);
    const u64 per_block = blockDim.x / G;
    const u64 slot = threadIdx.x / G;
    for (u64 base = (u64)blockIdx.x * per_block; base < g.tasks; base += (u64)gridDim.x * per_block) {
        RowTask r;
        if (!row_task<false, I>(base + slot, lane, index, fault, g, r)) continue;
        const W* s = src + r.src;
        W* d = dst + r.dst;
        // Rounds of up to eight loads in flight per lane, all issued before the first store
        // (a row of 768 f32 is six 16-byte words per lane of a warp: one round).
        for (u64 u = r.begin + lane; u < r.end; u += 8 * (u64)G) {
            W w[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (u + (u64)j * G < r.end) w[j] = s[u + (u64)j * G];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                if (u + (u64)j * G < r.end) d[u + (u64)j * G] = w[j];
            }
        }
    }
}

// index_add of whole rows: each element added with the scatter's atomics.
template <typename T, typename I>
__device__ void index_add_rows(T* dst, const T* __restrict__ src, const I* __restrict__ index, IndexFault* fault,
                               const RowGeom& g) {
    const u32 G = g.group;
    const u32 lane = threadIdx.x & (G - 1);
    const u64 per_block = blockDim.x / G;
    const u64 slot = threadIdx.x / G;
    for (u64 base = (u64)blockIdx.x * per_block; base < g.tasks; base += (u64)gridDim.x * per_block) {
        RowTask r;
        if (!row_task<true, I>(base + slot, lane, index, fault, g, r)) continue;
        const T* s = src + r.src;
        T* d = dst + r.dst;
        u64 u = r.begin + lane;
        for (; u + 3 * (u64)G < r.end; u += 4 * (u64)G) {
            const T a = s[u], b = s[u + G], c = s[u + 2 * G], e = s[u + 3 * G];
            atomic_add_v(d + u, a);
            atomic_add_v(d + u + G, b);
            atomic_add_v(d + u + 2 * G, c);
            atomic_add_v(d + u + 3 * G, e);
        }
        for (; u < r.end; u += G) atomic_add_v(d + u, s[u]);
    }
}

#define SELECT_ROWS(BYTES, W, IN, I)                                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS) index_select_rows_w##BYTES##_##IN(                        \
        W* __restrict__ out, const W* __restrict__ in, const I* __restrict__ index, IndexFault* fault, RowGeom g) { \
        index_select_rows<W, I>(out, in, index, fault, g);                                                          \
    }
#define ADD_ROWS(TN, T, IN, I)                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) index_add_rows_##TN##_##IN(                               \
        T* out, const T* __restrict__ src, const I* __restrict__ index, IndexFault* fault, RowGeom g) {             \
        index_add_rows<T, I>(out, src, index, fault, g);                                                            \
    }

SCATTER_BOTH_INDEX(SELECT_ROWS, 1, u8)
SCATTER_BOTH_INDEX(SELECT_ROWS, 2, u16)
SCATTER_BOTH_INDEX(SELECT_ROWS, 4, u32)
SCATTER_BOTH_INDEX(SELECT_ROWS, 8, u64)
SCATTER_BOTH_INDEX(SELECT_ROWS, 16, uint4)
SCATTER_BOTH_INDEX(ADD_ROWS, f32, f32)
SCATTER_BOTH_INDEX(ADD_ROWS, f64, f64)
SCATTER_BOTH_INDEX(ADD_ROWS, f16, f16)
SCATTER_BOTH_INDEX(ADD_ROWS, bf16, bf16)
SCATTER_BOTH_INDEX(ADD_ROWS, i32, i32)
SCATTER_BOTH_INDEX(ADD_ROWS, i64, i64)
SCATTER_BOTH_INDEX(ADD_ROWS, u8, u8)
