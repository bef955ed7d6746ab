// compare.cu: comparisons to bool (Kernel::Compare) and selection (Kernel::Where).
// `compare_<op>_<dtype>_contig(out, lhs, rhs, n)` / `compare_<dtype>_strided(.., op)` with op codes
// in the order of `CompareOp::ALL`; floats compare as IEEE (NaN is unequal to everything).
// `where_b<bytes>_contig(out, cond, on_true, on_false, n)` / `where_b<bytes>_strided(..)` move
// values by size, so one kernel serves every dtype of that width.

struct OpEq { template <typename C> __device__ static bool f(C a, C b) { return a == b; } };
struct OpNe { template <typename C> __device__ static bool f(C a, C b) { return a != b; } };
struct OpLt { template <typename C> __device__ static bool f(C a, C b) { return a < b; } };
struct OpLe { template <typename C> __device__ static bool f(C a, C b) { return a <= b; } };
struct OpGt { template <typename C> __device__ static bool f(C a, C b) { return a > b; } };
struct OpGe { template <typename C> __device__ static bool f(C a, C b) { return a >= b; } };

template <typename T, typename Op> __device__ __forceinline__ bool8 cmp(T a, T b) {
    bool8 r;
    r.v = Op::f(load(a), load(b)) ? 1 : 0;
    return r;
}

template <typename T, typename Op> __device__ void compare_contig(bool8* out, const T* lhs, const T* rhs, u64 n) {
    const int N = Lanes<T>::n;
    u64 nvec = n / N;
    const Pack<T, N>* vl = (const Pack<T, N>*)lhs;
    const Pack<T, N>* vr = (const Pack<T, N>*)rhs;
    Pack<bool8, N>* vo = (Pack<bool8, N>*)out;
    for (u64 i = global_thread(); i < nvec; i += grid_threads()) {
        Pack<T, N> a = vl[i];
        Pack<T, N> b = vr[i];
        Pack<bool8, N> r;
#pragma unroll
        for (int k = 0; k < N; ++k) r.v[k] = cmp<T, Op>(a.v[k], b.v[k]);
        vo[i] = r;
    }
    for (u64 i = nvec * N + global_thread(); i < n; i += grid_threads()) out[i] = cmp<T, Op>(lhs[i], rhs[i]);
}

template <typename T> __device__ __forceinline__ bool8 cmp_code(T a, T b, int op) {
    switch (op) {
        case 0: return cmp<T, OpEq>(a, b);
        case 1: return cmp<T, OpNe>(a, b);
        case 2: return cmp<T, OpLt>(a, b);
        case 3: return cmp<T, OpLe>(a, b);
        case 4: return cmp<T, OpGt>(a, b);
        default: return cmp<T, OpGe>(a, b);
    }
}

template <typename T>
__device__ void compare_strided(bool8* out, const T* lhs, const T* rhs, const Shape& sh, const Strides& so,
                                const Strides& sl, const Strides& sr, int op) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, ol, orr;
        offset3(i, sh, so, sl, sr, oo, ol, orr);
        out[oo] = cmp_code(lhs[ol], rhs[orr], op);
    }
}

#define COMPARE(NAME, OP, TN, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        compare_##NAME##_##TN##_contig(bool8* out, const T* lhs, const T* rhs, u64 n) {                             \
        compare_contig<T, OP>(out, lhs, rhs, n);                                                                    \
    }
#define COMPARE_ALL(TN, T)                                                                                          \
    COMPARE(eq, OpEq, TN, T)                                                                                        \
    COMPARE(ne, OpNe, TN, T)                                                                                        \
    COMPARE(lt, OpLt, TN, T)                                                                                        \
    COMPARE(le, OpLe, TN, T)                                                                                        \
    COMPARE(gt, OpGt, TN, T)                                                                                        \
    COMPARE(ge, OpGe, TN, T)                                                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS) compare_##TN##_strided(                                   \
        bool8* out, const T* lhs, const T* rhs, Shape sh, Strides so, Strides sl, Strides sr, int op) {             \
        compare_strided<T>(out, lhs, rhs, sh, so, sl, sr, op);                                                      \
    }

COMPARE_ALL(f32, f32)
COMPARE_ALL(f64, f64)
COMPARE_ALL(f16, f16)
COMPARE_ALL(bf16, bf16)
COMPARE_ALL(i32, i32)
COMPARE_ALL(i64, i64)
COMPARE_ALL(u8, u8)
COMPARE_ALL(bool, bool8)

// ---- where -------------------------------------------------------------------------------------

template <typename V>
__device__ void where_contig(V* out, const bool8* cond, const V* on_true, const V* on_false, u64 n) {
    const int N = Lanes<V>::n;
    u64 nvec = n / N;
    const Pack<bool8, N>* vc = (const Pack<bool8, N>*)cond;
    const Pack<V, N>* vt = (const Pack<V, N>*)on_true;
    const Pack<V, N>* vf = (const Pack<V, N>*)on_false;
    Pack<V, N>* vo = (Pack<V, N>*)out;
    for (u64 i = global_thread(); i < nvec; i += grid_threads()) {
        Pack<bool8, N> c = vc[i];
        Pack<V, N> t = vt[i];
        Pack<V, N> f = vf[i];
        Pack<V, N> r;
#pragma unroll
        for (int k = 0; k < N; ++k) r.v[k] = c.v[k].v ? t.v[k] : f.v[k];
        vo[i] = r;
    }
    for (u64 i = nvec * N + global_thread(); i < n; i += grid_threads()) out[i] = cond[i].v ? on_true[i] : on_false[i];
}

template <typename V>
__device__ void where_strided(V* out, const bool8* cond, const V* on_true, const V* on_false, const Shape& sh,
                              const Strides& so, const Strides& sc, const Strides& st, const Strides& sf) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, oc, ot, of;
        offset4(i, sh, so, sc, st, sf, oo, oc, ot, of);
        out[oo] = cond[oc].v ? on_true[ot] : on_false[of];
    }
}

#define WHERE(BYTES, V)                                                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        where_b##BYTES##_contig(V* out, const bool8* cond, const V* on_true, const V* on_false, u64 n) {            \
        where_contig<V>(out, cond, on_true, on_false, n);                                                           \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        where_b##BYTES##_strided(V* out, const bool8* cond, const V* on_true, const V* on_false, Shape sh,           \
                                 Strides so, Strides sc, Strides st, Strides sf) {                                  \
        where_strided<V>(out, cond, on_true, on_false, sh, so, sc, st, sf);                                         \
    }

WHERE(1, u8)
WHERE(2, u16)
WHERE(4, u32)
WHERE(8, u64)
