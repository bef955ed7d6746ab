// binary.cu: element-wise functions of two operands of one dtype (Kernel::Binary).
// `binary_<op>_<dtype>_contig(out, lhs, rhs, n)`: dense operands, 16-byte vector loads/stores.
// `binary_<dtype>_strided(out, lhs, rhs, shape, so, sl, sr, op)`: any strides (broadcast = 0),
// the op as a run-time code in the order of `BinaryOp::ALL`.
// Integer add/sub/mul wrap; integer div truncates toward zero and x / 0 = 0; integer pow with a
// negative exponent is 0 unless the base is 1 or -1; float maximum/minimum propagate NaN;
// bool maximum/minimum are or/and.

template <typename U, typename I> __device__ __forceinline__ I wrap_add(I a, I b) { return (I)((U)a + (U)b); }
template <typename U, typename I> __device__ __forceinline__ I wrap_sub(I a, I b) { return (I)((U)a - (U)b); }
template <typename U, typename I> __device__ __forceinline__ I wrap_mul(I a, I b) { return (I)((U)a * (U)b); }

template <typename C> struct Unsigned { typedef C type; };
template <> struct Unsigned<i32> { typedef u32 type; };
template <> struct Unsigned<i64> { typedef u64 type; };
template <> struct Unsigned<u8> { typedef u32 type; };

struct OpAdd {
    __device__ static float f(float a, float b) { return a + b; }
    __device__ static double f(double a, double b) { return a + b; }
    template <typename I> __device__ static I f(I a, I b) { return wrap_add<typename Unsigned<I>::type>(a, b); }
};
struct OpSub {
    __device__ static float f(float a, float b) { return a - b; }
    __device__ static double f(double a, double b) { return a - b; }
    template <typename I> __device__ static I f(I a, I b) { return wrap_sub<typename Unsigned<I>::type>(a, b); }
};
struct OpMul {
    __device__ static float f(float a, float b) { return a * b; }
    __device__ static double f(double a, double b) { return a * b; }
    template <typename I> __device__ static I f(I a, I b) { return wrap_mul<typename Unsigned<I>::type>(a, b); }
};
struct OpDiv {
    __device__ static float f(float a, float b) { return a / b; }
    __device__ static double f(double a, double b) { return a / b; }
    __device__ static u8 f(u8 a, u8 b) { return b == 0 ? 0 : a / b; }
    template <typename I> __device__ static I f(I a, I b) {
        if (b == 0) return 0;
        if (b == -1) return wrap_sub<typename Unsigned<I>::type>((I)0, a);
        return a / b;
    }
};
template <typename I> __device__ __forceinline__ I int_pow(I base, I exp) {
    typedef typename Unsigned<I>::type U;
    if (exp < 0) {
        if (base == 1) return 1;
        if (base == -1) return (exp & 1) ? (I)-1 : (I)1;
        return 0;
    }
    U result = 1, b = (U)base;
    u64 e = (u64)exp;
    while (e) {
        if (e & 1) result *= b;
        b *= b;
        e >>= 1;
    }
    return (I)result;
}
struct OpPow {
    __device__ static float f(float a, float b) { return powf(a, b); }
    __device__ static double f(double a, double b) { return pow(a, b); }
    __device__ static u8 f(u8 a, u8 b) { return (u8)int_pow<i32>((i32)a, (i32)b); }
    template <typename I> __device__ static I f(I a, I b) { return int_pow<I>(a, b); }
};
struct OpMaximum {
    template <typename C> __device__ static C f(C a, C b) { return (a != a || a > b) ? a : b; }
};
struct OpMinimum {
    template <typename C> __device__ static C f(C a, C b) { return (a != a || a < b) ? a : b; }
};

template <typename T, typename Op> __device__ __forceinline__ T apply2(T a, T b) {
    return store<T>(Op::f(load(a), load(b)));
}

// One block covers THREADS × U consecutive vectors (thread t takes t, t + THREADS, …): a grid of
// many short blocks, with all U loads of a thread issued before any is used. U is UNROLL for
// float types and 1 for integers (which keeps NVRTC's compile time down); the host sizes the grid
// with the same rule (`contig_blocks` in src/launch/elementwise.rs).
template <typename T, typename Op>
__device__ void binary_contig(T* __restrict__ out, const T* __restrict__ lhs, const T* __restrict__ rhs, u64 n) {
    const int N = Lanes<T>::n;
    const int U = IsFloat<T>::value ? UNROLL : 1;
    typedef Pack<T, N> P;
    const u64 nvec = n / N;
    const P* vl = (const P*)lhs;
    const P* vr = (const P*)rhs;
    P* vo = (P*)out;
    const u64 base = (u64)blockIdx.x * THREADS * U + threadIdx.x;
    if (base + (U - 1) * THREADS < nvec) {
        P a[U], b[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a[u] = vl[base + u * THREADS];
            b[u] = vr[base + u * THREADS];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            P r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = apply2<T, Op>(a[u].v[k], b[u].v[k]);
            vo[base + u * THREADS] = r;
        }
    } else {
        for (u64 i = base; i < nvec; i += THREADS) {
            P a = vl[i], b = vr[i], r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = apply2<T, Op>(a.v[k], b.v[k]);
            vo[i] = r;
        }
    }
    if (blockIdx.x == 0) {
        for (u64 j = nvec * N + threadIdx.x; j < n; j += THREADS) out[j] = apply2<T, Op>(lhs[j], rhs[j]);
    }
}

template <typename T> __device__ __forceinline__ T apply_code(T a, T b, int op) {
    switch (op) {
        case 0: return apply2<T, OpAdd>(a, b);
        case 1: return apply2<T, OpSub>(a, b);
        case 2: return apply2<T, OpMul>(a, b);
        case 3: return apply2<T, OpDiv>(a, b);
        case 4: return apply2<T, OpPow>(a, b);
        case 5: return apply2<T, OpMaximum>(a, b);
        default: return apply2<T, OpMinimum>(a, b);
    }
}
__device__ __forceinline__ bool8 apply_code(bool8 a, bool8 b, int op) {
    return op == 5 ? apply2<bool8, OpMaximum>(a, b) : apply2<bool8, OpMinimum>(a, b);
}

template <typename T>
__device__ void binary_strided(T* out, const T* lhs, const T* rhs, const Shape& sh, const Strides& so, const Strides& sl,
                               const Strides& sr, int op) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, ol, orr;
        offset3(i, sh, so, sl, sr, oo, ol, orr);
        out[oo] = apply_code(lhs[ol], rhs[orr], op);
    }
}

#define BINARY(NAME, OP, TN, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                        \
        binary_##NAME##_##TN##_contig(T* out, const T* lhs, const T* rhs, u64 n) {               \
        binary_contig<T, OP>(out, lhs, rhs, n);                                                  \
    }
#define BINARY_STRIDED(TN, T)                                                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS) binary_##TN##_strided(                                 \
        T* out, const T* lhs, const T* rhs, Shape sh, Strides so, Strides sl, Strides sr, int op) {              \
        binary_strided<T>(out, lhs, rhs, sh, so, sl, sr, op);                                                    \
    }
#define BINARY_ALL(TN, T)            \
    BINARY(add, OpAdd, TN, T)         \
    BINARY(sub, OpSub, TN, T)         \
    BINARY(mul, OpMul, TN, T)         \
    BINARY(div, OpDiv, TN, T)         \
    BINARY(pow, OpPow, TN, T)         \
    BINARY(maximum, OpMaximum, TN, T) \
    BINARY(minimum, OpMinimum, TN, T) \
    BINARY_STRIDED(TN, T)

BINARY_ALL(f32, f32)
BINARY_ALL(f64, f64)
BINARY_ALL(f16, f16)
BINARY_ALL(bf16, bf16)
BINARY_ALL(i32, i32)
BINARY_ALL(i64, i64)
BINARY_ALL(u8, u8)
BINARY(maximum, OpMaximum, bool, bool8)
BINARY(minimum, OpMinimum, bool, bool8)
BINARY_STRIDED(bool, bool8)

// `gelu_backward_<dtype>_contig(out, x, g, n)` and `gelu_backward_<dtype>_strided(out, x, g,
// shape, so, sx, sg)` (Kernel::GeluBackward): the exact GELU's input gradient
// g·(Φ(x) + x·φ(x)), in f32 for the half types, rounded once on store.
struct OpGeluGrad {
    __device__ static float f(float x, float g) {
        float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752440f));
        float pdf = 0.39894228040143267794f * expf(-0.5f * x * x);
        return g * (cdf + x * pdf);
    }
    __device__ static double f(double x, double g) {
        double cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752440));
        double pdf = 0.39894228040143267794 * exp(-0.5 * x * x);
        return g * (cdf + x * pdf);
    }
};
template <typename T>
__device__ void gelu_backward_strided(T* out, const T* x, const T* g, const Shape& sh, const Strides& so,
                                      const Strides& sx, const Strides& sg) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, ox, og;
        offset3(i, sh, so, sx, sg, oo, ox, og);
        out[oo] = apply2<T, OpGeluGrad>(x[ox], g[og]);
    }
}
#define GELU_BACKWARD(TN, T)                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                 \
        gelu_backward_##TN##_contig(T* out, const T* x, const T* g, u64 n) {                              \
        binary_contig<T, OpGeluGrad>(out, x, g, n);                                                        \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) gelu_backward_##TN##_strided(                   \
        T* out, const T* x, const T* g, Shape sh, Strides so, Strides sx, Strides sg) {                   \
        gelu_backward_strided<T>(out, x, g, sh, so, sx, sg);                                               \
    }
GELU_BACKWARD(f32, f32)
GELU_BACKWARD(f64, f64)
GELU_BACKWARD(f16, f16)
GELU_BACKWARD(bf16, bf16)
