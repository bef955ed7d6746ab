// update.cu: the fused optimizer step (Kernel::Update), in place: one grid-stride pass over a
// parameter, its gradient and its state, in f32 for f16/bf16 and f64 for f64, each written value
// rounded once on store. The per-element constants come from the host (core's
// `AdamUpdate::coefficients` / `SgdUpdate::coefficients`, rounded to the compute type).
// `adam_update_<dtype>(param, grad, exp_avg, exp_avg_sq, args)` and
// `sgd_update_<dtype>(param, grad, momentum_buffer, args)`: elements [0, vectors·N) in 16-byte
// vectors (the host passes `vectors` = 0 unless every operand is 16-byte aligned), the rest one by
// one. Every operand is dense and of `n` elements; the written ones are apart from all others.

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

template <typename T>
__device__ void adam_update(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ exp_avg,
                            T* __restrict__ exp_avg_sq, const AdamArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    const int N = Lanes<T>::n;
    typedef Pack<T, N> P;
    const u64 stride = grid_threads();
    P* vp = (P*)param;
    const P* vg = (const P*)grad;
    P* vm = (P*)exp_avg;
    P* vv = (P*)exp_avg_sq;
    for (u64 i = global_thread(); i < a.vectors; i += stride) {
        P pp = vp[i], pg = vg[i], pm = vm[i], pv = vv[i];
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
    for (u64 j = a.vectors * N + global_thread(); j < a.n; j += stride) {
        C p = load(param[j]), m = load(exp_avg[j]), v = load(exp_avg_sq[j]);
        adam_one<C>(p, (C)load(grad[j]), m, v, a);
        param[j] = store<T>(p);
        exp_avg[j] = store<T>(m);
        exp_avg_sq[j] = store<T>(v);
    }
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

template <typename T>
__device__ void sgd_update(T* __restrict__ param, const T* __restrict__ grad, T* __restrict__ buffer,
                           const SgdArgs<typename Compute<T>::type>& a) {
    typedef typename Compute<T>::type C;
    const int N = Lanes<T>::n;
    typedef Pack<T, N> P;
    const u64 stride = grid_threads();
    const bool has_buffer = (a.flags & 1) != 0;
    const bool reads_buffer = has_buffer && (a.flags & 4) == 0;
    P* vp = (P*)param;
    const P* vg = (const P*)grad;
    P* vb = (P*)buffer;
    for (u64 i = global_thread(); i < a.vectors; i += stride) {
        P pp = vp[i], pg = vg[i], pb;
        if (reads_buffer) pb = vb[i];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            C p = load(pp.v[k]);
            sgd_one<T>(p, (C)load(pg.v[k]), pb.v[k], a);
            pp.v[k] = store<T>(p);
        }
        vp[i] = pp;
        if (has_buffer) vb[i] = pb;
    }
    for (u64 j = a.vectors * N + global_thread(); j < a.n; j += stride) {
        C p = load(param[j]);
        T b;
        if (reads_buffer) b = buffer[j];
        sgd_one<T>(p, (C)load(grad[j]), b, a);
        param[j] = store<T>(p);
        if (has_buffer) buffer[j] = b;
    }
}

#define UPDATE(TN, T, C)                                                                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) adam_update_##TN(T* param, const T* grad, T* exp_avg,    \
                                                                            T* exp_avg_sq, AdamArgs<C> a) {        \
        adam_update<T>(param, grad, exp_avg, exp_avg_sq, a);                                                       \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS) sgd_update_##TN(T* param, const T* grad, T* buffer,      \
                                                                           SgdArgs<C> a) {                         \
        sgd_update<T>(param, grad, buffer, a);                                                                     \
    }
UPDATE(f32, f32, f32)
UPDATE(f64, f64, f64)
UPDATE(f16, f16, f32)
UPDATE(bf16, bf16, f32)
