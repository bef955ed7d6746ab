// norm.cu: layer norm and RMS norm over the last dimension (Kernel::Norm), and per-row
// cross-entropy (Kernel::CrossEntropy); in f32 for f16/bf16, f64 for f64.
// `norm_<layer|rms>_<dtype>_v<V>`: dense rows, 16-byte aligned, weight and bias dense: the row is
// held in registers (rows_common.cuh), read once, written once; layer norm's variance is the
// mean of squared deviations from the mean (two passes over registers, not E[x²] - E[x]²).
// `norm_<layer|rms>_<dtype>_strided`: any strides, a block per row, three passes over memory.
// `cross_entropy_<dtype>_<index dtype>`: one streaming pass per row, (max, sum of exp, sum of x)
// kept online; a target outside [0, C) that is not `ignore_index` is recorded in `fault`.

template <typename T, int V, bool RMS>
__device__ void norm_fast(const T* in, T* out, const T* w, const T* b, const RowGeom& param) {
    typedef typename Compute<T>::type C;
    typedef RegRow<T, V> Row;
    const int N = Row::N;
    typedef Pack<T, N> P;
    __shared__ RowGeom g;
    __shared__ C scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const u64 nv = g.cols / N;
    const C inv_cols = (C)1 / (C)g.cols;
    const C eps = (C)g.eps;
    const bool has_w = (g.flag & 1) != 0, has_b = (g.flag & 2) != 0;
    for (u64 row = L.first; L.more(row, g.rows); row += L.step) {
        const bool active = row < g.rows;
        Row r;
        r.load(in + (active ? row_offset(row, &g.rows_shape, &g.rows_in) : 0), active ? nv : 0, L.lane, L.group);
        C mean = 0;
        if (!RMS) {
            C s = 0;
#pragma unroll
            for (int v = 0; v < V; ++v) {
#pragma unroll
                for (int k = 0; k < N; ++k) s += r.x[v][k];
            }
            mean = group_allreduce<SumOp<C> >(s, L.group, scratch) * inv_cols;
        }
        C q = 0;
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int k = 0; k < N; ++k) {
                C d = r.ok[v] ? r.x[v][k] - mean : (C)0;
                q += d * d;
            }
        }
        const C rstd = rsqrt_r(group_allreduce<SumOp<C> >(q, L.group, scratch) * inv_cols + eps);
        if (!active) continue;
        P* orow = (P*)(out + row_offset(row, &g.rows_shape, &g.rows_out));
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (r.ok[v]) {
                u64 i = (u64)L.lane + (u64)v * L.group;
                P pw, pb, o;
                if (has_w) pw = ((const P*)w)[i];
                if (has_b) pb = ((const P*)b)[i];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    C y = (r.x[v][k] - mean) * rstd;
                    if (has_w) y *= (C)load(pw.v[k]);
                    if (has_b) y += (C)load(pb.v[k]);
                    o.v[k] = out_r<T>(y);
                }
                orow[i] = o;
            }
        }
    }
}

template <typename T, bool RMS>
__device__ void norm_strided(const T* in, T* out, const T* w, const T* b, const RowGeom& param) {
    typedef typename Compute<T>::type C;
    __shared__ RowGeom g;
    __shared__ C scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const C inv_cols = (C)1 / (C)g.cols;
    const C eps = (C)g.eps;
    const bool has_w = (g.flag & 1) != 0, has_b = (g.flag & 2) != 0;
    for (u64 row = blockIdx.x; row < g.rows; row += gridDim.x) {
        const T* irow = in + row_offset(row, &g.rows_shape, &g.rows_in);
        T* orow = out + row_offset(row, &g.rows_shape, &g.rows_out);
        C mean = 0;
        if (!RMS) {
            C s = 0;
            for (u64 c = threadIdx.x; c < g.cols; c += blockDim.x) s += (C)load(irow[(i64)c * g.in_stride]);
            mean = group_allreduce<SumOp<C> >(s, blockDim.x, scratch) * inv_cols;
        }
        C q = 0;
        for (u64 c = threadIdx.x; c < g.cols; c += blockDim.x) {
            C d = (C)load(irow[(i64)c * g.in_stride]) - mean;
            q += d * d;
        }
        const C rstd = rsqrt_r(group_allreduce<SumOp<C> >(q, blockDim.x, scratch) * inv_cols + eps);
        for (u64 c = threadIdx.x; c < g.cols; c += blockDim.x) {
            C y = ((C)load(irow[(i64)c * g.in_stride]) - mean) * rstd;
            if (has_w) y *= (C)load(w[(i64)c * g.w_stride]);
            if (has_b) y += (C)load(b[(i64)c * g.b_stride]);
            orow[(i64)c * g.out_stride] = store<T>(y);
        }
    }
}

// The block limit of each V as in softmax.cu (V1/V2: 1024, V4: 512, V8: 256); f32 layer norm's
// V4 keeps 1024 (64 registers), which measured faster on the H200 (1.22× against 0.99×).
#define NORM_FAST(KN, RMS, TN, T, V, BOUND)                                                                        \
    extern "C" __global__ void __launch_bounds__(BOUND)                                                            \
        norm_##KN##_##TN##_v##V(const T* in, T* out, const T* w, const T* b, RowGeom g) {                          \
        norm_fast<T, V, RMS>(in, out, w, b, g);                                                                    \
    }
#define NORM(KN, RMS, TN, T, B4)                                                                                   \
    NORM_FAST(KN, RMS, TN, T, 1, 1024) \
    NORM_FAST(KN, RMS, TN, T, 2, 1024) \
    NORM_FAST(KN, RMS, TN, T, 4, B4) \
    NORM_FAST(KN, RMS, TN, T, 8, 256) \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
        norm_##KN##_##TN##_strided(const T* in, T* out, const T* w, const T* b, RowGeom g) {                       \
        norm_strided<T, RMS>(in, out, w, b, g);                                                                    \
    }
NORM(layer, false, f32, f32, 1024)
NORM(rms, true, f32, f32, 512)
NORM(layer, false, f64, f64, 512)
NORM(rms, true, f64, f64, 512)
NORM(layer, false, f16, f16, 512)
NORM(rms, true, f16, f16, 512)
NORM(layer, false, bf16, bf16, 512)
NORM(rms, true, bf16, bf16, 512)

// ---- cross-entropy -----------------------------------------------------------------------------

struct CeFault {
    u32 hit;
    u32 pad;
    i64 index;
};

struct CeGeom {
    u64 rows;
    u64 cols;
    i64 row_stride;  // logits, elements
    i64 col_stride;
    i64 target_stride;
    i64 out_stride;
    i64 ignore_index;
    f64 smoothing;
    i32 group;
    i32 dense;  // col_stride 1, every row 16-byte aligned
};

// Online (max, sum of exp(x - max), sum of x).
template <typename C> struct CeAcc {
    C m;
    C s;
    C sx;
};
template <typename C> struct CeOp {
    __device__ static CeAcc<C> ident() {
        CeAcc<C> a;
        a.m = -inf_r((C)0);
        a.s = 0;
        a.sx = 0;
        return a;
    }
    __device__ static CeAcc<C> comb(CeAcc<C> a, CeAcc<C> b) {
        MaxSum<C> x, y;
        x.m = a.m;
        x.s = a.s;
        y.m = b.m;
        y.s = b.s;
        MaxSum<C> r = MaxSumOp<C>::comb(x, y);
        CeAcc<C> o;
        o.m = r.m;
        o.s = r.s;
        o.sx = a.sx + b.sx;
        return o;
    }
};

// Fold `n` values into the running state: one rescale for the lot.
template <typename C, int K> __device__ __forceinline__ void ce_fold(CeAcc<C>& a, const C (&x)[K]) {
    C pm = a.m;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if ((x[k] > pm || x[k] != x[k]) && pm == pm) pm = x[k];
        a.sx += x[k];
    }
    if (pm != a.m) {
        a.s = a.m == -inf_r((C)0) ? (C)0 : a.s * exp_r(a.m - pm);
        a.m = pm;
    }
    if (a.m == -inf_r((C)0)) return;
#pragma unroll
    for (int k = 0; k < K; ++k) a.s += exp_r(x[k] - a.m);
}

template <typename T, typename I>
__device__ void cross_entropy(const T* logits, const I* target, T* out, CeFault* fault, const CeGeom& param) {
    typedef typename Compute<T>::type C;
    typedef CeAcc<C> Acc;
    const int N = Lanes<T>::n;
    const int U = N <= 4 ? 4 : 2;
    typedef Pack<T, N> P;
    __shared__ CeGeom g;
    __shared__ Acc scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    for (u64 row = L.first; row < g.rows; row += L.step) {
        const i64 t = (i64)target[(i64)row * g.target_stride];
        T* o = out + (i64)row * g.out_stride;
        if (t == g.ignore_index) {
            if (L.lane == 0) *o = store<T>((C)0);
            continue;
        }
        if (t < 0 || (u64)t >= g.cols) {
            if (L.lane == 0 && atomicCAS(&fault->hit, 0u, 1u) == 0u) fault->index = t;
            continue;
        }
        const T* p = logits + (i64)row * g.row_stride;
        Acc a = CeOp<C>::ident();
        u64 done = 0;
        if (g.dense) {
            const u64 nv = g.cols / N;
            const P* vp = (const P*)p;
            u64 v = L.lane;
#pragma unroll 1
            for (; v + (U - 1) * L.group < nv; v += U * L.group) {
                P pk[U];
#pragma unroll
                for (int u = 0; u < U; ++u) pk[u] = vp[v + u * L.group];
                C x[U * N];
#pragma unroll
                for (int u = 0; u < U; ++u) {
#pragma unroll
                    for (int k = 0; k < N; ++k) x[u * N + k] = (C)load(pk[u].v[k]);
                }
                ce_fold<C, U * N>(a, x);
            }
#pragma unroll 1
            for (; v < nv; v += L.group) {
                P pk = vp[v];
                C x[N];
#pragma unroll
                for (int k = 0; k < N; ++k) x[k] = (C)load(pk.v[k]);
                ce_fold<C, N>(a, x);
            }
            done = nv * N;
        }
        for (u64 c = done + L.lane; c < g.cols; c += L.group) {
            C x[1] = {(C)load(p[(i64)c * g.col_stride])};
            ce_fold<C, 1>(a, x);
        }
        a = group_allreduce<CeOp<C> >(a, L.group, scratch);
        if (L.lane == 0) {
            const C lse = a.m + log_r(a.s);
            const C xt = (C)load(p[t * g.col_stride]);
            const C s = (C)g.smoothing;
            C loss = ((C)1 - s) * (lse - xt);
            if (s != (C)0) loss += s * (lse - a.sx / (C)g.cols);
            *o = store<T>(loss);
        }
    }
}

#define CROSS_ENTROPY(TN, T, IN, I)                                                                                \
    extern "C" __global__ void __launch_bounds__(1024) cross_entropy_##TN##_##IN(                                  \
        const T* logits, const I* target, T* out, CeFault* fault, CeGeom g) {                                      \
        cross_entropy<T, I>(logits, target, out, fault, g);                                                        \
    }
#define CROSS_ENTROPY_BOTH(TN, T)    \
    CROSS_ENTROPY(TN, T, i32, i32)   \
    CROSS_ENTROPY(TN, T, i64, i64)

CROSS_ENTROPY_BOTH(f32, f32)
CROSS_ENTROPY_BOTH(f64, f64)
CROSS_ENTROPY_BOTH(f16, f16)
CROSS_ENTROPY_BOTH(bf16, bf16)
