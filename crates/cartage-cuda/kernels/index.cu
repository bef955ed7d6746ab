// index.cu: Kernel::Gather (torch.gather) and Kernel::IndexSelect, moving values by size, and
// Kernel::Scatter. `gather_b<bytes>_<index dtype>`, `index_select_b<bytes>_<index dtype>`,
// `scatter_b<bytes>_<index dtype>` (assign) and `scatter_add_<dtype>_<index dtype>` (atomic add:
// the hardware's for f32/f64/i32/i64 and, on sm_70+/sm_90+, f16/bf16; a compare-and-swap loop on
// the enclosing 32-bit word otherwise and for u8). Shapes are not
// coalesced here: the kernels need the coordinate along `dim`. An index outside [0, size) is not
// followed: the kernel records it in `fault` (the first thread to find one wins) and the host
// turns it into Error::IndexOutOfRange after reading the flag back.

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
