// update.cu: the fused optimizer step (Kernel::Update), in place: one grid-stride pass over a
// parameter, its gradient and its state, in f32 for f16/bf16 and f64 for f64, each written value
// rounded once on store. The per-element constants come from the host (core's
// `AdamUpdate::coefficients` / `SgdUpdate::coefficients`, rounded to the compute type).
// `adam_update_<dtype>(param, grad, exp_avg, exp_avg_sq, args)` and
// `sgd_update_<dtype>(param, grad, momentum_buffer, args)`: elements [0, vectors·N) in 16-byte
// vectors (the host passes `vectors` = 0 unless every operand is 16-byte aligned), the rest one by
// one. Every operand is dense and of `n` elements; the written ones are apart from all others.
//
// `adam_update_many_<dtype>(table, args)` and `sgd_update_many_<dtype>(table, args)` are the
// multi-tensor form (Kernel::UpdateMany): one launch updates up to MANY_SETS sets, block b taking
// chunk `table.chunk[b]` (MANY_CHUNK elements) of set `table.set[b]`, in 16-byte vectors where
// that set's operands are all 16-byte aligned. The per-element code is the single update's.

template <typename C> struct AdamArgs {
    u64 n;
    u64 vectors;
    C decay;  // 1 − lr·wd (AdamW), else 1
    C l2;     // wd (Adam), else 0
    C one_minus_beta1;
    C one_minus_beta2;
    C inv_sqrt_bc2;  // 1 / √(1 − β₂ᵗ)
    C step_size;     // lr / (1 − β₁ᵗ)
    C eps;
};

template <typename C> struct SgdArgs {
    u64 n;
    u64 vectors;
    C lr;
    C weight_decay;
    C momentum;
    C grad_scale;  // 1 − dampening
    i32 flags;     // 1: a momentum buffer; 2: Nesterov; 4: the first step (the buffer becomes g)
    i32 pad;
};

__device__ __forceinline__ float sqrt_u(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_u(double x) { return sqrt(x); }

// One Adam/AdamW element: the moments are stored rounded, the step uses them unrounded.
template <typename C> __device__ __forceinline__ void adam_one(C& p, C grad, C& m, C& v, const AdamArgs<C>& a) {
    const C g = grad + a.l2 * p;
    p = p * a.decay;
    m = m + a.one_minus_beta1 * (g - m);
    v = v + a.one_minus_beta2 * (g * g - v);
    p = p - a.step_size * m / (sqrt_u(v) * a.inv_sqrt_bc2 + a.eps);
}

// Element j of one set, loaded, updated and stored.
template <typename T>
__device__ __forceinline__ void adam_element(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ m_,
                                             T* __restrict__ v_, u64 j, const AdamArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    C p = load(param[j]), m = load(m_[j]), v = load(v_[j]);
    adam_one<C>(p, (C)load(grad[j]), m, v, a);
    param[j] = store<T>(p);
    m_[j] = store<T>(m);
    v_[j] = store<T>(v);
}

// The 16-byte vector i of one set (every operand 16-byte aligned).
template <typename T>
__device__ __forceinline__ void adam_vector(Pack<T, Lanes<T>::n>* __restrict__ vp,
                                            const Pack<T, Lanes<T>::n>* __restrict__ vg,
                                            Pack<T, Lanes<T>::n>* __restrict__ vm,
                                            Pack<T, Lanes<T>::n>* __restrict__ vv, u64 i,
                                            const AdamArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    const int N = Lanes<T>::n;
    Pack<T, N> pp = vp[i], pg = vg[i], pm = vm[i], pv = vv[i];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        C p = load(pp.v[k]), m = load(pm.v[k]), v = load(pv.v[k]);
        adam_one<C>(p, (C)load(pg.v[k]), m, v, a);
        pp.v[k] = store<T>(p);
        pm.v[k] = store<T>(m);
        pv.v[k] = store<T>(v);
    }
    vp[i] = pp;
    vm[i] = pm;
    vv[i] = pv;
}

template <typename T>
__device__ void adam_update(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ exp_avg,
                            T* __restrict__ exp_avg_sq, const AdamArgs<typename Compute<T>::type>& a) {
    const int N = Lanes<T>::n;
    typedef Pack<T, N> P;
    const u64 stride = grid_threads();
    P* vp = (P*)param;
    const P* vg = (const P*)grad;
    P* vm = (P*)exp_avg;
    P* vv = (P*)exp_avg_sq;
    for (u64 i = global_thread(); i < a.vectors; i += stride) adam_vector<T>(vp, vg, vm, vv, i, a);
    for (u64 j = a.vectors * N + global_thread(); j < a.n; j += stride)
        adam_element<T>(param, grad, exp_avg, exp_avg_sq, j, a);
}

// One SGD element; `b` is the momentum buffer's stored value (read only after the first step).
// The step reads the buffer back as stored (rounded), as a composed update would.
template <typename T>
__device__ __forceinline__ void sgd_one(typename Compute<T>::type& p, typename Compute<T>::type grad, T& b,
                                        const SgdArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    C g = grad + a.weight_decay * p;
    if (a.flags & 1) {
        const C nb = (a.flags & 4) ? g : a.momentum * (C)load(b) + a.grad_scale * g;
        b = store<T>(nb);
        const C rb = (C)load(b);
        g = (a.flags & 2) ? g + a.momentum * rb : rb;
    }
    p = p - a.lr * g;
}

// Element j of one set; the buffer is read only after its first step, written only with momentum.
template <typename T>
__device__ __forceinline__ void sgd_element(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ buffer,
                                            u64 j, const SgdArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    C p = load(param[j]);
    T b;
    if ((a.flags & 5) == 1) b = buffer[j];
    sgd_one<T>(p, (C)load(grad[j]), b, a);
    param[j] = store<T>(p);
    if (a.flags & 1) buffer[j] = b;
}

// The 16-byte vector i of one set (every operand 16-byte aligned).
template <typename T>
__device__ __forceinline__ void sgd_vector(Pack<T, Lanes<T>::n>* __restrict__ vp,
                                           const Pack<T, Lanes<T>::n>* __restrict__ vg,
                                           Pack<T, Lanes<T>::n>* __restrict__ vb, u64 i,
                                           const SgdArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    const int N = Lanes<T>::n;
    Pack<T, N> pp = vp[i], pg = vg[i], pb;
    if ((a.flags & 5) == 1) pb = vb[i];
#pragma unroll
    for (int k = 0; k < N; ++k) {
        C p = load(pp.v[k]);
        sgd_one<T>(p, (C)load(pg.v[k]), pb.v[k], a);
        pp.v[k] = store<T>(p);
    }
    vp[i] = pp;
    if (a.flags & 1) vb[i] = pb;
}

template <typename T>
__device__ void sgd_update(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ buffer,
                           const SgdArgs<typename Compute<T>::type>& a) {
    const int N = Lanes<T>::n;
    typedef Pack<T, N> P;
    const u64 stride = grid_threads();
    P* vp = (P*)param;
    const P* vg = (const P*)grad;
    P* vb = (P*)buffer;
    for (u64 i = global_thread(); i < a.vectors; i += stride) sgd_vector<T>(vp, vg, vb, i, a);
    for (u64 j = a.vectors * N + global_thread(); j < a.n; j += stride) sgd_element<T>(param, grad, buffer, j, a);
}

// ---- multi-tensor: many sets per launch ---------------------------------------------------------

#define MANY_SETS 48
#define MANY_BLOCKS 320
#define MANY_CHUNK 65536
#define MANY_THREADS 512

// The sets of one launch and which chunk each block takes. Mirrors `ManyTable` in
// src/launch/update_many.rs; passed by value (kernel parameters, under 4 KiB with the constants).
struct ManyTable {
    u64 param[MANY_SETS];   // device addresses of each set's operands
    u64 grad[MANY_SETS];
    u64 first[MANY_SETS];   // exp_avg / momentum buffer (0 when absent)
    u64 second[MANY_SETS];  // exp_avg_sq (0 when absent)
    u64 n[MANY_SETS];       // elements of each set
    u32 chunk[MANY_BLOCKS]; // block b updates elements [chunk·MANY_CHUNK, +MANY_CHUNK) of set[b]
    u8 set[MANY_BLOCKS];
    u8 vector[MANY_SETS];   // 1: every operand of the set is 16-byte aligned
};

// This block's set, its element range [start, end) and whether it runs in vectors.
struct ManyRange {
    int s;
    u64 start;
    u64 end;
};

__device__ __forceinline__ ManyRange many_range(const ManyTable& t) {
    ManyRange r;
    r.s = t.set[blockIdx.x];
    r.start = (u64)t.chunk[blockIdx.x] * MANY_CHUNK;
    const u64 n = t.n[r.s];
    r.end = r.start + MANY_CHUNK < n ? r.start + MANY_CHUNK : n;
    return r;
}

template <typename T> __device__ void adam_update_many(const ManyTable& t, const AdamArgs<typename Compute<T>::type>& a) {
    const int N = Lanes<T>::n;
    typedef Pack<T, N> P;
    const ManyRange r = many_range(t);
    T* param = (T*)t.param[r.s];
    const T* grad = (const T*)t.grad[r.s];
    T* m = (T*)t.first[r.s];
    T* v = (T*)t.second[r.s];
    u64 j = r.start;
    if (t.vector[r.s]) {
        // MANY_CHUNK is a multiple of every lane count: the chunk starts on a vector.
        const u64 v1 = r.end / N;
        for (u64 i = r.start / N + threadIdx.x; i < v1; i += blockDim.x)
            adam_vector<T>((P*)param, (const P*)grad, (P*)m, (P*)v, i, a);
        j = v1 * N;
    }
    for (j += threadIdx.x; j < r.end; j += blockDim.x) adam_element<T>(param, grad, m, v, j, a);
}

template <typename T> __device__ void sgd_update_many(const ManyTable& t, const SgdArgs<typename Compute<T>::type>& a) {
    const int N = Lanes<T>::n;
    typedef Pack<T, N> P;
    const ManyRange r = many_range(t);
    T* param = (T*)t.param[r.s];
    const T* grad = (const T*)t.grad[r.s];
    T* buffer = (T*)t.first[r.s];
    u64 j = r.start;
    if (t.vector[r.s]) {
        const u64 v1 = r.end / N;
        for (u64 i = r.start / N + threadIdx.x; i < v1; i += blockDim.x)
            sgd_vector<T>((P*)param, (const P*)grad, (P*)buffer, i, a);
        j = v1 * N;
    }
    for (j += threadIdx.x; j < r.end; j += blockDim.x) sgd_element<T>(param, grad, buffer, j, a);
}

#define UPDATE(TN, T, C)                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) adam_update_##TN(T* param, const T* grad, T* exp_avg,    \
                                                                            T* exp_avg_sq, AdamArgs<C> a) {        \
        adam_update<T>(param, grad, exp_avg, exp_avg_sq, a);                                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS) sgd_update_##TN(T* param, const T* grad, T* buffer,      \
                                                                           SgdArgs<C> a) {                         \
        sgd_update<T>(param, grad, buffer, a);                                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MANY_THREADS) adam_update_many_##TN(ManyTable t, AdamArgs<C> a) {  \
        adam_update_many<T>(t, a);                                                                                 \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(MANY_THREADS) sgd_update_many_##TN(ManyTable t, SgdArgs<C> a) {    \
        sgd_update_many<T>(t, a);                                                                                  \
    }
UPDATE(f32, f32, f32)
UPDATE(f64, f64, f64)
UPDATE(f16, f16, f32)
UPDATE(bf16, bf16, f32)
