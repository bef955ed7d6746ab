// backward.cu: the fused backward kernels (Kernel::SoftmaxBackward, Kernel::NormBackward,
// Kernel::CrossEntropyBackward); in f32 for f16/bf16, f64 for f64, each input gradient rounded
// once on store.
// A row pairs the forward's values `a` (softmax output, norm input) with the incoming gradient
// `g` along the reduced dimension (the last one for norms); rows are the other dimensions
// (`rows_shape`, with strides `rows_a`, `rows_g` and `rows_out`).
// `softmax_backward_<dtype>_v<V>`, `norm_backward_<layer|rms>_<dtype>_v<V>`: dense rows, 16-byte
// aligned (the weight too): both rows held in registers (rows_common.cuh), read once, written once.
// `..._long`: dense aligned rows too long to hold: a block per row, passes of 16-byte loads (the
// later ones read the row again, from L2: the grid is sized so the rows in flight fit there).
// `..._strided`: any strides, a warp or a block per row, one pass per reduction and one to write.
// Softmax: `y·(g − Σ g·y)`; log-softmax: `g − exp(y)·Σ g`. Norms, with `ĝ = g·weight` and
// `x̂ = (x − mean)·r`: layer `r·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))`, RMS `r·(ĝ − x̂·mean(ĝ·x̂))`.
// `cross_entropy_backward_<dtype>_<index dtype>`: a warp or a block per row: one streaming pass
// for (max, sum of exp), one to write `g·(softmax − (1 − s)·onehot(t) − s/C)`; a zero row where
// the target is `ignore_index`. Each row's target is loaded once, by one thread, and that very
// value is shared with the group, checked, and used; one outside [0, C) is recorded in `fault`.

struct GradGeom {
    u64 rows;
    u64 cols;
    Shape rows_shape;
    Strides rows_a;
    Strides rows_g;
    Strides rows_out;
    i64 a_stride;  // along the row, elements (strided kernels)
    i64 g_stride;
    i64 out_stride;
    i64 w_stride;
    f64 eps;
    i32 group;
    i32 flag;  // softmax: 1 = log-softmax; norm: 1 = weight
};

// K sums reduced together (one all-reduction instead of K).
template <typename C, int K> struct Sums {
    C v[K];
};
template <typename C, int K> struct SumsOp {
    __device__ static Sums<C, K> ident() {
        Sums<C, K> a;
#pragma unroll
        for (int k = 0; k < K; ++k) a.v[k] = (C)0;
        return a;
    }
    __device__ static Sums<C, K> comb(Sums<C, K> a, Sums<C, K> b) {
#pragma unroll
        for (int k = 0; k < K; ++k) a.v[k] += b.v[k];
        return a;
    }
};

// The offsets of row `row` in the three row operands, all before any of the row is loaded (the
// out-of-line offset calls then keep no row values live across them).
__device__ __forceinline__ void row_offsets(u64 row, const GradGeom& g, i64& oa, i64& og, i64& oo) {
    oa = row_offset(row, &g.rows_shape, &g.rows_a);
    og = row_offset(row, &g.rows_shape, &g.rows_g);
    oo = row_offset(row, &g.rows_shape, &g.rows_out);
}

// ---- passes over one row in memory (the long and strided kernels) ------------------------------
// DENSE: unit stride along the row, rows (and the weight) 16-byte aligned, `cols` a whole number
// of vectors (the host checks all three): 16-byte vectors `lane + j * group`. Otherwise element
// `lane + j * group` through the strides.

// f(a) for this thread's elements of one operand.
template <typename T, bool DENSE, typename F>
__device__ __forceinline__ void visit1(const T* a, i64 sa, u64 cols, int lane, int group, F f) {
    typedef typename Compute<T>::type C;
    if (DENSE) {
        const int N = Lanes<T>::n;
        typedef Pack<T, N> P;
        const P* va = (const P*)a;
        for (u64 v = lane; v < cols / N; v += group) {
            P pa = va[v];
#pragma unroll
            for (int k = 0; k < N; ++k) f((C)load(pa.v[k]));
        }
    } else {
        for (u64 c = lane; c < cols; c += group) f((C)load(a[(i64)c * sa]));
    }
}

// f(a, g, w) for this thread's elements of a row pair and the weight (1 where `w` is null).
template <typename T, bool DENSE, typename F>
__device__ __forceinline__ void visit3(const T* a, const T* gr, const T* w, const GradGeom& g, int lane, int group,
                                       F f) {
    typedef typename Compute<T>::type C;
    if (DENSE) {
        const int N = Lanes<T>::n;
        typedef Pack<T, N> P;
        const P *va = (const P*)a, *vg = (const P*)gr, *vw = (const P*)w;
        for (u64 v = lane; v < g.cols / N; v += group) {
            P pa = va[v], pg = vg[v], pw;
            if (w) pw = vw[v];
#pragma unroll
            for (int k = 0; k < N; ++k) f((C)load(pa.v[k]), (C)load(pg.v[k]), w ? (C)load(pw.v[k]) : (C)1);
        }
    } else {
        for (u64 c = lane; c < g.cols; c += group) {
            const C wc = w ? (C)load(w[(i64)c * g.w_stride]) : (C)1;
            f((C)load(a[(i64)c * g.a_stride]), (C)load(gr[(i64)c * g.g_stride]), wc);
        }
    }
}

// out = f(a, g, w) for this thread's elements, rounded once.
template <typename T, bool DENSE, typename F>
__device__ __forceinline__ void write3(T* out, const T* a, const T* gr, const T* w, const GradGeom& g, int lane,
                                       int group, F f) {
    typedef typename Compute<T>::type C;
    if (DENSE) {
        const int N = Lanes<T>::n;
        typedef Pack<T, N> P;
        const P *va = (const P*)a, *vg = (const P*)gr, *vw = (const P*)w;
        P* vo = (P*)out;
        for (u64 v = lane; v < g.cols / N; v += group) {
            P pa = va[v], pg = vg[v], pw, o;
            if (w) pw = vw[v];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                o.v[k] = out_r<T>(f((C)load(pa.v[k]), (C)load(pg.v[k]), w ? (C)load(pw.v[k]) : (C)1));
            }
            vo[v] = o;
        }
    } else {
        for (u64 c = lane; c < g.cols; c += group) {
            const C wc = w ? (C)load(w[(i64)c * g.w_stride]) : (C)1;
            const C ac = (C)load(a[(i64)c * g.a_stride]), gc = (C)load(gr[(i64)c * g.g_stride]);
            out[(i64)c * g.out_stride] = out_r<T>(f(ac, gc, wc));
        }
    }
}

// ---- softmax / log-softmax ---------------------------------------------------------------------

template <typename T, int V>
__device__ void softmax_backward_fast(const T* y, const T* gr, T* out, const GradGeom& param) {
    typedef typename Compute<T>::type C;
    typedef RegRow<T, V> Row;
    const int N = Row::N;
    typedef Pack<T, N> P;
    __shared__ GradGeom g;
    __shared__ C scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const u64 nv = g.cols / N;
    const bool log = g.flag != 0;
    for (u64 row = L.first; L.more(row, g.rows); row += L.step) {
        const bool active = row < g.rows;
        i64 oa = 0, og = 0, oo = 0;
        if (active) row_offsets(row, g, oa, og, oo);
        Row ry, rg;
        ry.load(y + oa, active ? nv : 0, L.lane, L.group);
        rg.load(gr + og, active ? nv : 0, L.lane, L.group);
        // Elements past the row hold 0 in both, so they add nothing.
        C s = 0;
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int k = 0; k < N; ++k) s += log ? rg.x[v][k] : ry.x[v][k] * rg.x[v][k];
        }
        s = group_allreduce<SumOp<C> >(s, L.group, scratch);
        if (!active) continue;
        P* orow = (P*)(out + oo);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (ry.ok[v]) {
                u64 i = (u64)L.lane + (u64)v * L.group;
                P o;
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const C yv = ry.x[v][k], gv = rg.x[v][k];
                    o.v[k] = out_r<T>(log ? gv - exp_r(yv) * s : yv * (gv - s));
                }
                orow[i] = o;
            }
        }
    }
}

template <typename T, bool DENSE>
__device__ void softmax_backward_rows(const T* y, const T* gr, T* out, const GradGeom& param) {
    typedef typename Compute<T>::type C;
    __shared__ GradGeom g;
    __shared__ C scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const bool log = g.flag != 0;
    // The group is a whole warp or the whole block, so `row < rows` is uniform over it.
    for (u64 row = L.first; row < g.rows; row += L.step) {
        i64 oa, og, oo;
        row_offsets(row, g, oa, og, oo);
        const T *yr = y + oa, *gp = gr + og;
        T* orow = out + oo;
        const T* none = (const T*)0;  // no weight
        C s = 0;
        if (log) {
            visit1<T, DENSE>(gp, g.g_stride, g.cols, L.lane, L.group, [&](C gv) { s += gv; });
        } else {
            visit3<T, DENSE>(yr, gp, none, g, L.lane, L.group, [&](C yv, C gv, C) { s += yv * gv; });
        }
        s = group_allreduce<SumOp<C> >(s, L.group, scratch);
        if (log) {
            write3<T, DENSE>(orow, yr, gp, none, g, L.lane, L.group, [=](C yv, C gv, C) { return gv - exp_r(yv) * s; });
        } else {
            write3<T, DENSE>(orow, yr, gp, none, g, L.lane, L.group, [=](C yv, C gv, C) { return yv * (gv - s); });
        }
    }
}

// Launch bounds that leave the registers two held rows need (`held_plan` in
// src/launch/backward.rs: 64 bytes of compute values of each row per thread, so V ≤ 4 for f32 and
// f64, V ≤ 2 for f16 and bf16): V1 (rows of one or two vectors, a pair of lanes each) runs in
// 256-thread blocks, V2 and V4 in blocks of up to 512.
#define SOFTMAX_BACKWARD_FAST(TN, T, V, BOUND)                                                                     \
    extern "C" __global__ void __launch_bounds__(BOUND)                                                            \
        softmax_backward_##TN##_v##V(const T* y, const T* g, T* out, GradGeom geom) {                              \
        softmax_backward_fast<T, V>(y, g, out, geom);                                                              \
    }
#define SOFTMAX_BACKWARD(TN, T)                                                                                    \
    SOFTMAX_BACKWARD_FAST(TN, T, 1, 256)                                                                           \
    SOFTMAX_BACKWARD_FAST(TN, T, 2, 512)                                                                           \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
        softmax_backward_##TN##_long(const T* y, const T* g, T* out, GradGeom geom) {                              \
        softmax_backward_rows<T, true>(y, g, out, geom);                                                           \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
        softmax_backward_##TN##_strided(const T* y, const T* g, T* out, GradGeom geom) {                           \
        softmax_backward_rows<T, false>(y, g, out, geom);                                                          \
    }
SOFTMAX_BACKWARD(f32, f32)
SOFTMAX_BACKWARD(f64, f64)
SOFTMAX_BACKWARD(f16, f16)
SOFTMAX_BACKWARD(bf16, bf16)
SOFTMAX_BACKWARD_FAST(f32, f32, 4, 512)
SOFTMAX_BACKWARD_FAST(f64, f64, 4, 512)

// ---- layer norm / RMS norm ---------------------------------------------------------------------

template <typename T, int V, bool RMS>
__device__ void norm_backward_fast(const T* x, const T* w, const T* gr, T* out, const GradGeom& param) {
    typedef typename Compute<T>::type C;
    typedef RegRow<T, V> Row;
    const int N = Row::N;
    typedef Pack<T, N> P;
    __shared__ GradGeom g;
    __shared__ C scratch[32];
    __shared__ Sums<C, 3> scratch3[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const u64 nv = g.cols / N;
    const C inv_cols = (C)1 / (C)g.cols;
    const C eps = (C)g.eps;
    const bool has_w = (g.flag & 1) != 0;
    for (u64 row = L.first; L.more(row, g.rows); row += L.step) {
        const bool active = row < g.rows;
        i64 oa = 0, og = 0, oo = 0;
        if (active) row_offsets(row, g, oa, og, oo);
        Row rx, rg;
        rx.load(x + oa, active ? nv : 0, L.lane, L.group);
        rg.load(gr + og, active ? nv : 0, L.lane, L.group);
        // rg becomes ĝ = g·weight (0 past the row).
        if (has_w) {
#pragma unroll
            for (int v = 0; v < V; ++v) {
                if (rg.ok[v]) {
                    P pw = ((const P*)w)[(u64)L.lane + (u64)v * L.group];
#pragma unroll
                    for (int k = 0; k < N; ++k) rg.x[v][k] *= (C)load(pw.v[k]);
                }
            }
        }
        C mean = 0;
        if (!RMS) {
            C s = 0;
#pragma unroll
            for (int v = 0; v < V; ++v) {
#pragma unroll
                for (int k = 0; k < N; ++k) s += rx.x[v][k];
            }
            mean = group_allreduce<SumOp<C> >(s, L.group, scratch) * inv_cols;
        }
        // Σ (x − mean)², Σ ĝ, Σ ĝ·(x − mean): x̂ = (x − mean)·r, so Σ ĝ·x̂ = r·Σ ĝ·(x − mean).
        Sums<C, 3> t = SumsOp<C, 3>::ident();
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const C d = rx.ok[v] ? rx.x[v][k] - mean : (C)0;
                t.v[0] += d * d;
                t.v[1] += rg.x[v][k];
                t.v[2] += rg.x[v][k] * d;
            }
        }
        t = group_allreduce<SumsOp<C, 3> >(t, L.group, scratch3);
        const C rstd = rsqrt_r(t.v[0] * inv_cols + eps);
        const C mean_g = RMS ? (C)0 : t.v[1] * inv_cols;
        const C mean_gx = t.v[2] * rstd * inv_cols;
        if (!active) continue;
        P* orow = (P*)(out + oo);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (rx.ok[v]) {
                u64 i = (u64)L.lane + (u64)v * L.group;
                P o;
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const C xhat = (rx.x[v][k] - mean) * rstd;
                    o.v[k] = out_r<T>(rstd * (rg.x[v][k] - mean_g - xhat * mean_gx));
                }
                orow[i] = o;
            }
        }
    }
}

template <typename T, bool RMS, bool DENSE>
__device__ void norm_backward_rows(const T* x, const T* w, const T* gr, T* out, const GradGeom& param) {
    typedef typename Compute<T>::type C;
    __shared__ GradGeom g;
    __shared__ C scratch[32];
    __shared__ Sums<C, 3> scratch3[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const C inv_cols = (C)1 / (C)g.cols;
    const C eps = (C)g.eps;
    const T* wp = (g.flag & 1) != 0 ? w : (const T*)0;
    // The group is a whole warp or the whole block, so `row < rows` is uniform over it.
    for (u64 row = L.first; row < g.rows; row += L.step) {
        i64 oa, og, oo;
        row_offsets(row, g, oa, og, oo);
        const T *xr = x + oa, *gp = gr + og;
        T* orow = out + oo;
        C mean = 0;
        if (!RMS) {
            C s = 0;
            visit1<T, DENSE>(xr, g.a_stride, g.cols, L.lane, L.group, [&](C xv) { s += xv; });
            mean = group_allreduce<SumOp<C> >(s, L.group, scratch) * inv_cols;
        }
        Sums<C, 3> t = SumsOp<C, 3>::ident();
        visit3<T, DENSE>(xr, gp, wp, g, L.lane, L.group, [&](C xv, C gv, C wv) {
            const C d = xv - mean, gh = gv * wv;
            t.v[0] += d * d;
            t.v[1] += gh;
            t.v[2] += gh * d;
        });
        t = group_allreduce<SumsOp<C, 3> >(t, L.group, scratch3);
        const C rstd = rsqrt_r(t.v[0] * inv_cols + eps);
        const C mean_g = RMS ? (C)0 : t.v[1] * inv_cols;
        const C mean_gx = t.v[2] * rstd * inv_cols;
        write3<T, DENSE>(orow, xr, gp, wp, g, L.lane, L.group, [=](C xv, C gv, C wv) {
            const C xhat = (xv - mean) * rstd;
            return rstd * (gv * wv - mean_g - xhat * mean_gx);
        });
    }
}

#define NORM_BACKWARD_FAST(KN, RMS, TN, T, V, BOUND)                                                               \
    extern "C" __global__ void __launch_bounds__(BOUND)                                                            \
        norm_backward_##KN##_##TN##_v##V(const T* x, const T* w, const T* g, T* out, GradGeom geom) {              \
        norm_backward_fast<T, V, RMS>(x, w, g, out, geom);                                                         \
    }
#define NORM_BACKWARD(KN, RMS, TN, T)                                                                              \
    NORM_BACKWARD_FAST(KN, RMS, TN, T, 1, 256)                                                                     \
    NORM_BACKWARD_FAST(KN, RMS, TN, T, 2, 512)                                                                     \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
        norm_backward_##KN##_##TN##_long(const T* x, const T* w, const T* g, T* out, GradGeom geom) {              \
        norm_backward_rows<T, RMS, true>(x, w, g, out, geom);                                                      \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(1024)                                                             \
        norm_backward_##KN##_##TN##_strided(const T* x, const T* w, const T* g, T* out, GradGeom geom) {           \
        norm_backward_rows<T, RMS, false>(x, w, g, out, geom);                                                     \
    }
NORM_BACKWARD(layer, false, f32, f32)
NORM_BACKWARD(rms, true, f32, f32)
NORM_BACKWARD(layer, false, f64, f64)
NORM_BACKWARD(rms, true, f64, f64)
NORM_BACKWARD(layer, false, f16, f16)
NORM_BACKWARD(rms, true, f16, f16)
NORM_BACKWARD(layer, false, bf16, bf16)
NORM_BACKWARD(rms, true, bf16, bf16)
NORM_BACKWARD_FAST(layer, false, f32, f32, 4, 512)
NORM_BACKWARD_FAST(rms, true, f32, f32, 4, 512)
NORM_BACKWARD_FAST(layer, false, f64, f64, 4, 512)
NORM_BACKWARD_FAST(rms, true, f64, f64, 4, 512)

// ---- layer norm / RMS norm with the weight and bias gradients ------------------------------------
// `norm_grads_<layer|rms>_<dtype>_<v1|v2|v4|long|strided>`: the input gradient as the kernels above
// compute it, and the row's terms g·x̂ and g (the incoming g, not ĝ) added into partial sums of
// the compute type: `part_w` (Σ g·x̂) and `part_b` (Σ g), each null when not wanted, one row of
// `cols` per unit. A unit is a block for the register kernels (the groups of a block combined in
// a fixed order: a butterfly over the lanes of a warp, then the warps one after another through
// shared memory) and a group (a warp or the block) for the others, whose every element is read,
// added and written by one thread (the unit's first row stores). A unit that got no row stores
// zeros. RMS norm has no bias: its register kernels keep no Σ g. `norm_grads_reduce_<dtype>`
// then sums the units' rows per column, in a fixed order, into the gradient (any stride), rounded
// once. No atomics: the result does not depend on timing.

// Columns of a block's shared partial row: a group of a warp or less holds at most 32 lanes × 64
// bytes of compute values of a row (held_plan in src/launch/backward.rs).
template <typename C> struct RedCap { static const int n = 2048 / sizeof(C); };

template <typename T, int V, bool RMS>
__device__ void norm_grads_fast(const T* x, const T* w, const T* gr, T* out, typename Compute<T>::type* part_w,
                                typename Compute<T>::type* part_b, const GradGeom& param) {
    typedef typename Compute<T>::type C;
    typedef RegRow<T, V> Row;
    const int N = Row::N;
    const int CAP = RedCap<C>::n;
    typedef Pack<T, N> P;
    __shared__ GradGeom g;
    __shared__ C scratch[32];
    __shared__ Sums<C, 3> scratch3[32];
    __shared__ C red[2][CAP];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const u64 nv = g.cols / N;
    const C inv_cols = (C)1 / (C)g.cols;
    const C eps = (C)g.eps;
    const bool has_w = (g.flag & 1) != 0;
    C aw[V][N], ab[V][N];
#pragma unroll
    for (int v = 0; v < V; ++v) {
#pragma unroll
        for (int k = 0; k < N; ++k) aw[v][k] = ab[v][k] = (C)0;
    }
    bool held[V];
    for (u64 row = L.first; L.more(row, g.rows); row += L.step) {
        const bool active = row < g.rows;
        i64 oa = 0, og = 0, oo = 0;
        if (active) row_offsets(row, g, oa, og, oo);
        Row rx, rg;
        rx.load(x + oa, active ? nv : 0, L.lane, L.group);
        rg.load(gr + og, active ? nv : 0, L.lane, L.group);
        C mean = 0;
        if (!RMS) {
            C s = 0;
#pragma unroll
            for (int v = 0; v < V; ++v) {
#pragma unroll
                for (int k = 0; k < N; ++k) s += rx.x[v][k];
            }
            mean = group_allreduce<SumOp<C> >(s, L.group, scratch) * inv_cols;
        }
        // Σ (x − mean)², Σ ĝ, Σ ĝ·(x − mean), with ĝ = g·weight (0 past the row); rg keeps g.
        Sums<C, 3> t = SumsOp<C, 3>::ident();
#pragma unroll
        for (int v = 0; v < V; ++v) {
            P pw;
            if (has_w && rg.ok[v]) pw = ((const P*)w)[(u64)L.lane + (u64)v * L.group];
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const C d = rx.ok[v] ? rx.x[v][k] - mean : (C)0;
                const C gh = has_w && rg.ok[v] ? rg.x[v][k] * (C)load(pw.v[k]) : rg.x[v][k];
                t.v[0] += d * d;
                t.v[1] += gh;
                t.v[2] += gh * d;
            }
        }
        t = group_allreduce<SumsOp<C, 3> >(t, L.group, scratch3);
        const C rstd = rsqrt_r(t.v[0] * inv_cols + eps);
        const C mean_g = RMS ? (C)0 : t.v[1] * inv_cols;
        const C mean_gx = t.v[2] * rstd * inv_cols;
        if (!active) continue;
        P* orow = (P*)(out + oo);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (rx.ok[v]) {
                u64 i = (u64)L.lane + (u64)v * L.group;
                P o, pw;
                if (has_w) pw = ((const P*)w)[i];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const C xhat = (rx.x[v][k] - mean) * rstd;
                    const C gv = rg.x[v][k];
                    const C gh = has_w ? gv * (C)load(pw.v[k]) : gv;
                    o.v[k] = out_r<T>(rstd * (gh - mean_g - xhat * mean_gx));
                    aw[v][k] += gv * xhat;
                    if (!RMS) ab[v][k] += gv;  // RMS norm has no bias
                }
                orow[i] = o;
            }
        }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) held[v] = (u64)L.lane + (u64)v * L.group < nv;
    C* const pw_row = part_w ? part_w + (u64)blockIdx.x * g.cols : (C*)0;
    C* const pb_row = part_b ? part_b + (u64)blockIdx.x * g.cols : (C*)0;
    if (L.group > 32) {
        // One group is the block: each thread stores its own columns.
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (held[v]) {
                const u64 c0 = ((u64)L.lane + (u64)v * L.group) * N;
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    if (pw_row) pw_row[c0 + k] = aw[v][k];
                    if (!RMS && pb_row) pb_row[c0 + k] = ab[v][k];
                }
            }
        }
        return;
    }
    // The groups of a warp hold the same columns: a butterfly over them (the same bits in
    // every lane, since each step adds two values in either order).
    for (int mask = L.group; mask < 32; mask <<= 1) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int k = 0; k < N; ++k) {
                aw[v][k] += shfl_xor_any(aw[v][k], mask);
                if (!RMS) ab[v][k] += shfl_xor_any(ab[v][k], mask);
            }
        }
    }
    // Then the warps, one after another, into the block's row (warp 0 covers every column).
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const bool first_group = (threadIdx.x % 32) < (u32)L.group;
    for (int turn = 0; turn < warps; ++turn) {
        if (warp == turn && first_group) {
#pragma unroll
            for (int v = 0; v < V; ++v) {
                if (held[v]) {
                    const int c0 = (L.lane + v * L.group) * N;
#pragma unroll
                    for (int k = 0; k < N; ++k) {
                        red[0][c0 + k] = turn == 0 ? aw[v][k] : red[0][c0 + k] + aw[v][k];
                        if (!RMS) red[1][c0 + k] = turn == 0 ? ab[v][k] : red[1][c0 + k] + ab[v][k];
                    }
                }
            }
        }
        __syncthreads();
    }
    for (u64 c = threadIdx.x; c < g.cols; c += blockDim.x) {
        if (pw_row) pw_row[c] = red[0][c];
        if (!RMS && pb_row) pb_row[c] = red[1][c];
    }
}

// The long and strided kernels with the partial sums: unit = the group.
template <typename T, bool RMS, bool DENSE>
__device__ void norm_grads_rows(const T* x, const T* w, const T* gr, T* out, typename Compute<T>::type* part_w,
                                typename Compute<T>::type* part_b, const GradGeom& param) {
    typedef typename Compute<T>::type C;
    __shared__ GradGeom g;
    __shared__ C scratch[32];
    __shared__ Sums<C, 3> scratch3[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const C inv_cols = (C)1 / (C)g.cols;
    const C eps = (C)g.eps;
    const T* wp = (g.flag & 1) != 0 ? w : (const T*)0;
    const u64 unit = (u64)blockIdx.x * (blockDim.x / L.group) + threadIdx.x / L.group;
    C* const pw_row = part_w ? part_w + unit * g.cols : (C*)0;
    C* const pb_row = part_b ? part_b + unit * g.cols : (C*)0;
    // Add `gv·xhat` and `gv` at column c (stored by the unit's first row).
    auto add = [&](u64 c, C gv, C xhat, bool first) {
        if (pw_row) pw_row[c] = first ? gv * xhat : pw_row[c] + gv * xhat;
        if (pb_row) pb_row[c] = first ? gv : pb_row[c] + gv;
    };
    // The group is a whole warp or the whole block, so `row < rows` is uniform over it.
    for (u64 row = L.first; row < g.rows; row += L.step) {
        const bool first = row == L.first;
        i64 oa, og, oo;
        row_offsets(row, g, oa, og, oo);
        const T *xr = x + oa, *gp = gr + og;
        T* orow = out + oo;
        C mean = 0;
        if (!RMS) {
            C s = 0;
            visit1<T, DENSE>(xr, g.a_stride, g.cols, L.lane, L.group, [&](C xv) { s += xv; });
            mean = group_allreduce<SumOp<C> >(s, L.group, scratch) * inv_cols;
        }
        Sums<C, 3> t = SumsOp<C, 3>::ident();
        visit3<T, DENSE>(xr, gp, wp, g, L.lane, L.group, [&](C xv, C gv, C wv) {
            const C d = xv - mean, gh = gv * wv;
            t.v[0] += d * d;
            t.v[1] += gh;
            t.v[2] += gh * d;
        });
        t = group_allreduce<SumsOp<C, 3> >(t, L.group, scratch3);
        const C rstd = rsqrt_r(t.v[0] * inv_cols + eps);
        const C mean_g = RMS ? (C)0 : t.v[1] * inv_cols;
        const C mean_gx = t.v[2] * rstd * inv_cols;
        if (DENSE) {
            const int N = Lanes<T>::n;
            typedef Pack<T, N> P;
            const P *va = (const P*)xr, *vg = (const P*)gp, *vw = (const P*)wp;
            P* vo = (P*)orow;
            for (u64 v = L.lane; v < g.cols / N; v += L.group) {
                P pa = va[v], pg = vg[v], pw, o;
                if (wp) pw = vw[v];
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    const C xhat = ((C)load(pa.v[k]) - mean) * rstd;
                    const C gv = (C)load(pg.v[k]);
                    const C wv = wp ? (C)load(pw.v[k]) : (C)1;
                    o.v[k] = out_r<T>(rstd * (gv * wv - mean_g - xhat * mean_gx));
                    add(v * N + k, gv, xhat, first);
                }
                vo[v] = o;
            }
        } else {
            for (u64 c = L.lane; c < g.cols; c += L.group) {
                const C xhat = ((C)load(xr[(i64)c * g.a_stride]) - mean) * rstd;
                const C gv = (C)load(gp[(i64)c * g.g_stride]);
                const C wv = wp ? (C)load(wp[(i64)c * g.w_stride]) : (C)1;
                orow[(i64)c * g.out_stride] = out_r<T>(rstd * (gv * wv - mean_g - xhat * mean_gx));
                add(c, gv, xhat, first);
            }
        }
    }
    if (L.first >= g.rows) {
        for (u64 c = L.lane; c < g.cols; c += L.group) add(c, (C)0, (C)0, true);
    }
}

// The second pass: column `c` of the gradient is the sum over `units` rows of `cols` partials,
// in a fixed order: 8 slices of a block each sum every 8th row, then the slices in turn.
struct NormReduceGeom {
    u64 cols;
    u64 units;
    i64 out_stride;
};

template <typename T>
__device__ void norm_grads_reduce(const typename Compute<T>::type* part, T* out, const NormReduceGeom& g) {
    typedef typename Compute<T>::type C;
    __shared__ C slices[8][32];
    const u32 lane = threadIdx.x % 32, slice = threadIdx.x / 32;
    const u64 c = (u64)blockIdx.x * 32 + lane;
    C s = 0;
    if (c < g.cols) {
        for (u64 u = slice; u < g.units; u += 8) s += part[u * g.cols + c];
    }
    slices[slice][lane] = s;
    __syncthreads();
    if (slice == 0 && c < g.cols) {
        C total = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) total += slices[k][lane];
        out[(i64)c * g.out_stride] = out_r<T>(total);
    }
}

#define NORM_GRADS_FAST(KN, RMS, TN, T, V, BOUND)                                                                  \
    extern "C" __global__ void __launch_bounds__(BOUND) norm_grads_##KN##_##TN##_v##V(                             \
        const T* x, const T* w, const T* g, T* out, Compute<T>::type* pw, Compute<T>::type* pb, GradGeom geom) {   \
        norm_grads_fast<T, V, RMS>(x, w, g, out, pw, pb, geom);                                                    \
    }
#define NORM_GRADS(KN, RMS, TN, T)                                                                                 \
    NORM_GRADS_FAST(KN, RMS, TN, T, 1, 256)                                                                        \
    NORM_GRADS_FAST(KN, RMS, TN, T, 2, 512)                                                                        \
    extern "C" __global__ void __launch_bounds__(1024) norm_grads_##KN##_##TN##_long(                              \
        const T* x, const T* w, const T* g, T* out, Compute<T>::type* pw, Compute<T>::type* pb, GradGeom geom) {   \
        norm_grads_rows<T, RMS, true>(x, w, g, out, pw, pb, geom);                                                 \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(1024) norm_grads_##KN##_##TN##_strided(                           \
        const T* x, const T* w, const T* g, T* out, Compute<T>::type* pw, Compute<T>::type* pb, GradGeom geom) {   \
        norm_grads_rows<T, RMS, false>(x, w, g, out, pw, pb, geom);                                                \
    }
#define NORM_GRADS_REDUCE(TN, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                                              \
        norm_grads_reduce_##TN(const Compute<T>::type* part, T* out, NormReduceGeom geom) {                        \
        norm_grads_reduce<T>(part, out, geom);                                                                     \
    }
NORM_GRADS(layer, false, f32, f32)
NORM_GRADS(rms, true, f32, f32)
NORM_GRADS(layer, false, f64, f64)
NORM_GRADS(rms, true, f64, f64)
NORM_GRADS(layer, false, f16, f16)
NORM_GRADS(rms, true, f16, f16)
NORM_GRADS(layer, false, bf16, bf16)
NORM_GRADS(rms, true, bf16, bf16)
NORM_GRADS_FAST(layer, false, f32, f32, 4, 512)
NORM_GRADS_FAST(rms, true, f32, f32, 4, 512)
NORM_GRADS_FAST(layer, false, f64, f64, 4, 512)
NORM_GRADS_FAST(rms, true, f64, f64, 4, 512)
NORM_GRADS_REDUCE(f32, f32)
NORM_GRADS_REDUCE(f64, f64)
NORM_GRADS_REDUCE(f16, f16)
NORM_GRADS_REDUCE(bf16, bf16)

// ---- cross-entropy -----------------------------------------------------------------------------

// The fault record of norm.cu's cross-entropy and index.cu (src/launch/index.rs reads it back).
struct CeFault {
    u32 hit;
    u32 pad;
    i64 index;
};

struct CeGradGeom {
    u64 rows;
    u64 cols;
    i64 row_stride;  // logits, elements
    i64 col_stride;
    i64 out_row;  // out, elements
    i64 out_col;
    i64 target_stride;
    i64 grad_stride;
    i64 ignore_index;
    f64 spread;  // s / C
    f64 keep;    // 1 − s
    i32 group;
    i32 dense;  // bit 0: logits, bit 1: out have column stride 1 and 16-byte aligned rows
};

// Fold K values into a running (max, sum of exp(x - max)), as softmax.cu does: one rescale for the
// lot; a NaN sticks in the max (and so in every output of the row).
template <typename C, int K> __device__ __forceinline__ void max_sum_fold(MaxSum<C>& a, const C (&x)[K]) {
    C pm = a.m;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if ((x[k] > pm || x[k] != x[k]) && pm == pm) pm = x[k];
    }
    if (pm != a.m) {
        a.s = a.m == -inf_r((C)0) ? (C)0 : a.s * exp_r(a.m - pm);
        a.m = pm;
    }
    if (a.m == -inf_r((C)0)) return;
#pragma unroll
    for (int k = 0; k < K; ++k) a.s += exp_r(x[k] - a.m);
}

// Lane 0's value of the group (a power of two up to 32 lanes of one warp), to every lane of it.
__device__ __forceinline__ i64 group_broadcast(i64 v, int group) {
    u32 lo = (u32)(u64)v, hi = (u32)((u64)v >> 32);
    lo = __shfl_sync(0xffffffffu, lo, 0, group);
    hi = __shfl_sync(0xffffffffu, hi, 0, group);
    return (i64)(((u64)hi << 32) | (u64)lo);
}

template <typename T, typename I>
__device__ void cross_entropy_backward(const T* logits, const I* target, const T* grad, T* out, CeFault* fault,
                                       const CeGradGeom& param) {
    typedef typename Compute<T>::type C;
    const int N = Lanes<T>::n;
    const int U = N <= 4 ? 4 : 2;
    typedef Pack<T, N> P;
    __shared__ CeGradGeom g;
    __shared__ MaxSum<C> scratch[32];
    __shared__ i64 block_target;
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const bool dense_in = (g.dense & 1) != 0, dense_out = (g.dense & 3) == 3;
    const u64 nv = g.cols / N;
    // The group is a whole warp or the whole block, so `row < rows` is uniform over it.
    for (u64 row = L.first; row < g.rows; row += L.step) {
        i64 t = 0;
        if (L.group <= 32) {
            if (L.lane == 0) t = (i64)load(target[(i64)row * g.target_stride]);
            t = group_broadcast(t, L.group);
        } else {
            if (threadIdx.x == 0) block_target = (i64)load(target[(i64)row * g.target_stride]);
            __syncthreads();
            t = block_target;
            __syncthreads();
        }
        T* o = out + (i64)row * g.out_row;
        if (t == g.ignore_index) {
            u64 done = 0;
            if (dense_out) {
                P z;
#pragma unroll
                for (int k = 0; k < N; ++k) z.v[k] = store<T>((C)0);
                for (u64 v = L.lane; v < nv; v += L.group) ((P*)o)[v] = z;
                done = nv * N;
            }
            for (u64 c = done + L.lane; c < g.cols; c += L.group) o[(i64)c * g.out_col] = store<T>((C)0);
            continue;
        }
        if (t < 0 || (u64)t >= g.cols) {
            if (L.lane == 0 && atomicCAS(&fault->hit, 0u, 1u) == 0u) fault->index = t;
            continue;
        }
        const T* p = logits + (i64)row * g.row_stride;
        MaxSum<C> a = MaxSumOp<C>::ident();
        u64 done = 0;
        if (dense_in) {
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
                max_sum_fold<C, U * N>(a, x);
            }
#pragma unroll 1
            for (; v < nv; v += L.group) {
                P pk = vp[v];
                C x[N];
#pragma unroll
                for (int k = 0; k < N; ++k) x[k] = (C)load(pk.v[k]);
                max_sum_fold<C, N>(a, x);
            }
            done = nv * N;
        }
        for (u64 c = done + L.lane; c < g.cols; c += L.group) {
            C x[1] = {(C)load(p[(i64)c * g.col_stride])};
            max_sum_fold<C, 1>(a, x);
        }
        a = group_allreduce<MaxSumOp<C> >(a, L.group, scratch);
        // g·softmax − g·s/C, and g·(1 − s) less at the target (the order of the CPU's arithmetic).
        const C gv = (C)load(grad[(i64)row * g.grad_stride]);
        const C scale = (C)1 / a.s * gv;
        const C floor = gv * (C)g.spread;
        const C hit = gv * (C)g.keep;
        const u64 tc = (u64)t;
        done = 0;
        if (dense_out) {
            const P* vp = (const P*)p;
            P* vo = (P*)o;
            for (u64 v = L.lane; v < nv; v += L.group) {
                P pk = vp[v], r;
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    C y = exp_r((C)load(pk.v[k]) - a.m) * scale - floor;
                    if (v * N + k == tc) y -= hit;
                    r.v[k] = out_r<T>(y);
                }
                vo[v] = r;
            }
            done = nv * N;
        }
        for (u64 c = done + L.lane; c < g.cols; c += L.group) {
            C y = exp_r((C)load(p[(i64)c * g.col_stride]) - a.m) * scale - floor;
            if (c == tc) y -= hit;
            o[(i64)c * g.out_col] = out_r<T>(y);
        }
    }
}

#define CROSS_ENTROPY_BACKWARD(TN, T, IN, I)                                                                       \
    extern "C" __global__ void __launch_bounds__(1024) cross_entropy_backward_##TN##_##IN(                         \
        const T* logits, const I* target, const T* grad, T* out, CeFault* fault, CeGradGeom g) {                   \
        cross_entropy_backward<T, I>(logits, target, grad, out, fault, g);                                         \
    }
#define CROSS_ENTROPY_BACKWARD_BOTH(TN, T) \
    CROSS_ENTROPY_BACKWARD(TN, T, i32, i32) \
    CROSS_ENTROPY_BACKWARD(TN, T, i64, i64)

CROSS_ENTROPY_BACKWARD_BOTH(f32, f32)
CROSS_ENTROPY_BACKWARD_BOTH(f64, f64)
CROSS_ENTROPY_BACKWARD_BOTH(f16, f16)
CROSS_ENTROPY_BACKWARD_BOTH(bf16, bf16)
