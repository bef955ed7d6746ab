// rows_common.cuh: what the row-wise kernels (softmax.cu, norm.cu) share — the row geometry,
// group all-reductions and the register-held row (prepended after common.cuh by src/modules.rs).
//
// A row is `cols` elements of the last (or chosen) dimension; rows are the other dimensions
// (`rows_shape`, with input strides `rows_in` and output strides `rows_out`). `group` threads
// share a row: a warp (32, several rows per block) or the whole block (blockDim.x, one row).
// The fast kernels hold the row in registers: each thread loads up to V 16-byte vectors
// (`lane + v * group`), so the row is read from memory once.

struct RowGeom {
    u64 rows;
    u64 cols;
    Shape rows_shape;
    Strides rows_in;
    Strides rows_out;
    i64 in_stride;   // along the row, elements (strided kernels)
    i64 out_stride;
    i64 w_stride;
    i64 b_stride;
    f64 eps;
    i32 group;
    i32 flag;  // softmax: log-softmax; norm: 1 = weight, 2 = bias (bits)
};

__device__ __forceinline__ i64 row_offset(u64 row, const Shape* sh, const Strides* s) {
    if (sh->rank == 1) return (i64)row * s->s[0];
    return offset1_at(row, sh, s);
}

__device__ __forceinline__ float inf_r(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double inf_r(double) { return __longlong_as_double(0x7ff0000000000000ll); }

template <typename C> struct SumOp {
    __device__ static C ident() { return (C)0; }
    __device__ static C comb(C a, C b) { return a + b; }
};

// (max, sum of exp(x - max)); a part with max -inf contributes nothing.
// Maximum ignoring NaN (fmax): softmax needs no NaN in the max, since a NaN input makes the sum
// of exponentials, and so every output of its row, NaN anyway.
__device__ __forceinline__ float max_r(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_r(double a, double b) { return fmax(a, b); }
template <typename C> struct MaxOp {
    __device__ static C ident() { return -inf_r((C)0); }
    __device__ static C comb(C a, C b) { return max_r(a, b); }
};

// Rounding to the storage type on the way out: the hardware's conversion for bf16 on sm_80+
// (NaN becomes the canonical NaN), `store` otherwise.
template <typename T> __device__ __forceinline__ T out_r(typename Compute<T>::type v) { return store<T>(v); }
template <> __device__ __forceinline__ bf16 out_r<bf16>(float v) {
#if __CUDA_ARCH__ >= 800
    bf16 b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(v));
    return b;
#else
    return f32_to_bf16(v);
#endif
}

template <typename C> struct MaxSum {
    C m;
    C s;
};
__device__ __forceinline__ float exp_r(float x) { return expf(x); }
__device__ __forceinline__ double exp_r(double x) { return exp(x); }
__device__ __forceinline__ float log_r(float x) { return logf(x); }
__device__ __forceinline__ double log_r(double x) { return log(x); }
__device__ __forceinline__ float rsqrt_r(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_r(double x) { return 1.0 / sqrt(x); }

template <typename C> struct MaxSumOp {
    __device__ static MaxSum<C> ident() {
        MaxSum<C> a;
        a.m = -inf_r((C)0);
        a.s = 0;
        return a;
    }
    __device__ static MaxSum<C> comb(MaxSum<C> a, MaxSum<C> b) {
        MaxSum<C> r;
        if (a.m != a.m || b.m != b.m) {
            r.m = a.m != a.m ? a.m : b.m;
            r.s = r.m;
            return r;
        }
        r.m = a.m > b.m ? a.m : b.m;
        if (r.m == -inf_r((C)0)) {
            r.s = a.s + b.s;
            return r;
        }
        C sa = a.m == -inf_r((C)0) ? (C)0 : a.s * exp_r(a.m - r.m);
        C sb = b.m == -inf_r((C)0) ? (C)0 : b.s * exp_r(b.m - r.m);
        r.s = sa + sb;
        return r;
    }
};

template <typename A> __device__ __forceinline__ A shfl_xor_any(A a, int mask) {
    const int W = sizeof(A) / 4;
    union {
        A a;
        u32 w[W];
    } u;
    u.a = a;
#pragma unroll
    for (int k = 0; k < W; ++k) u.w[k] = __shfl_xor_sync(0xffffffffu, u.w[k], mask);
    return u.a;
}

// Combine `a` over the group (2–32 lanes of a warp, or the whole block); every thread of the
// group gets the result. Every lane of a warp must call it; with a whole block every thread
// (it synchronises). `scratch` holds 32.
template <typename Op, typename A> __device__ __forceinline__ A group_allreduce(A a, int group, A* scratch) {
    if (group <= 32) {
        for (int mask = group >> 1; mask > 0; mask >>= 1) a = Op::comb(a, shfl_xor_any(a, mask));
        return a;
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) a = Op::comb(a, shfl_xor_any(a, mask));
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    if (lane == 0) scratch[warp] = a;
    __syncthreads();
    a = lane < warps ? scratch[lane] : Op::ident();
#pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) a = Op::comb(a, shfl_xor_any(a, mask));
    __syncthreads();
    return a;
}

// A register-held row: V 16-byte vectors per thread, converted to the compute type.
template <typename T, int V> struct RegRow {
    typedef typename Compute<T>::type C;
    static const int N = Lanes<T>::n;
    C x[V][N];
    bool ok[V];

    __device__ __forceinline__ void load(const T* row, u64 nv, int lane, int group) {
        typedef Pack<T, N> P;
        const P* vp = (const P*)row;
        P pk[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            u64 i = (u64)lane + (u64)v * group;
            ok[v] = i < nv;
            if (ok[v]) pk[v] = vp[i];
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int k = 0; k < N; ++k) x[v][k] = ok[v] ? (C)::load(pk[v].v[k]) : (C)0;
        }
    }

    // Store f(x, column) for each held element.
    template <typename F> __device__ __forceinline__ void store(T* row, int lane, int group, F f) const {
        typedef Pack<T, N> P;
        P* vp = (P*)row;
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (ok[v]) {
                u64 i = (u64)lane + (u64)v * group;
                P r;
#pragma unroll
                for (int k = 0; k < N; ++k) r.v[k] = out_r<T>(f(x[v][k], i * N + k));
                vp[i] = r;
            }
        }
    }
};

// The group layout of a row kernel: `group` threads per row (a power of two: 2–32 lanes of a
// warp, or the whole block), the lane in the group and the rows one block covers. Groups of a
// warp take consecutive rows; `more(row)` keeps every lane of a warp in the loop while any of
// its groups has a row (their shuffles need the whole warp), `row < rows` says whether this
// group's row is real.
struct GroupLayout {
    int group;
    int lane;
    u64 first;
    u64 step;
    u64 sub;
    __device__ __forceinline__ GroupLayout(int g) {
        group = g;
        lane = (int)(threadIdx.x % (u32)g);
        u64 per_block = blockDim.x / g;
        first = (u64)blockIdx.x * per_block + threadIdx.x / g;
        step = (u64)gridDim.x * per_block;
        sub = g < 32 ? (threadIdx.x & 31) / g : 0;
    }
    __device__ __forceinline__ bool more(u64 row, u64 rows) const { return row - sub < rows; }
};
