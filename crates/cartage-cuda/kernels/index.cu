// index.cu: Kernel::Gather (torch.gather) and Kernel::IndexSelect, moving values by size.
// `gather_b<bytes>_<index dtype>` and `index_select_b<bytes>_<index dtype>`. Shapes are not
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
