// unary.cu: element-wise functions of one operand (Kernel::Unary).
// `unary_<op>_<dtype>_contig(out, in, n)`: dense operands, 16-byte vector loads and stores, one
// block per THREADS × U vectors (see binary.cu).
// `unary_<dtype>_strided(out, in, shape, out_strides, in_strides, op)`: any strides, the op as a
// run-time code (one kernel per dtype keeps NVRTC's compile time down; this path is not the fast one).
// f16/bf16 compute in f32; integer neg/abs wrap (as Rust's wrapping_neg/wrapping_abs).

__device__ __forceinline__ i32 wrap_neg(i32 x) { return (i32)(0u - (u32)x); }
__device__ __forceinline__ i64 wrap_neg(i64 x) { return (i64)(0ull - (u64)x); }
__device__ __forceinline__ u8 wrap_neg(u8 x) { return (u8)(0u - (u32)x); }

struct OpNeg {
    __device__ static float f(float x) { return -x; }
    __device__ static double f(double x) { return -x; }
    template <typename I> __device__ static I f(I x) { return wrap_neg(x); }
};
struct OpAbs {
    __device__ static float f(float x) { return fabsf(x); }
    __device__ static double f(double x) { return fabs(x); }
    __device__ static i32 f(i32 x) { return x < 0 ? wrap_neg(x) : x; }
    __device__ static i64 f(i64 x) { return x < 0 ? wrap_neg(x) : x; }
    __device__ static u8 f(u8 x) { return x; }
};
// NaN-propagating: relu(NaN) = NaN.
struct OpRelu {
    __device__ static float f(float x) { return x < 0.0f ? 0.0f : x; }
    __device__ static double f(double x) { return x < 0.0 ? 0.0 : x; }
    __device__ static i32 f(i32 x) { return x < 0 ? 0 : x; }
    __device__ static i64 f(i64 x) { return x < 0 ? 0 : x; }
    __device__ static u8 f(u8 x) { return x; }
};
struct OpExp {
    __device__ static float f(float x) { return expf(x); }
    __device__ static double f(double x) { return exp(x); }
};
struct OpLog {
    __device__ static float f(float x) { return logf(x); }
    __device__ static double f(double x) { return log(x); }
};
struct OpSqrt {
    __device__ static float f(float x) { return sqrtf(x); }
    __device__ static double f(double x) { return sqrt(x); }
};
struct OpTanh {
    __device__ static float f(float x) { return tanhf(x); }
    __device__ static double f(double x) { return tanh(x); }
};
struct OpSigmoid {
    __device__ static float f(float x) { return 1.0f / (1.0f + expf(-x)); }
    __device__ static double f(double x) { return 1.0 / (1.0 + exp(-x)); }
};
// The exact form: x * 0.5 * (1 + erf(x / sqrt 2)).
struct OpGelu {
    __device__ static float f(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f)); }
    __device__ static double f(double x) { return x * 0.5 * (1.0 + erf(x * 0.70710678118654752440)); }
};

struct OpSin {
    __device__ static float f(float x) { return sinf(x); }
    __device__ static double f(double x) { return sin(x); }
};
struct OpCos {
    __device__ static float f(float x) { return cosf(x); }
    __device__ static double f(double x) { return cos(x); }
};
// The rounding ops are the identity on integers.
struct OpFloor {
    __device__ static float f(float x) { return floorf(x); }
    __device__ static double f(double x) { return floor(x); }
    template <typename I> __device__ static I f(I x) { return x; }
};
struct OpCeil {
    __device__ static float f(float x) { return ceilf(x); }
    __device__ static double f(double x) { return ceil(x); }
    template <typename I> __device__ static I f(I x) { return x; }
};
// Half to even (the current rounding mode of rint).
struct OpRound {
    __device__ static float f(float x) { return rintf(x); }
    __device__ static double f(double x) { return rint(x); }
    template <typename I> __device__ static I f(I x) { return x; }
};
struct OpTrunc {
    __device__ static float f(float x) { return truncf(x); }
    __device__ static double f(double x) { return trunc(x); }
    template <typename I> __device__ static I f(I x) { return x; }
};
// -1, 0 or 1; NaN and ±0 return themselves.
struct OpSign {
    __device__ static float f(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
    __device__ static double f(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x); }
    __device__ static i32 f(i32 x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); }
    __device__ static i64 f(i64 x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); }
    __device__ static u8 f(u8 x) { return x != 0 ? 1 : 0; }
};
struct OpRsqrt {
    __device__ static float f(float x) { return 1.0f / sqrtf(x); }
    __device__ static double f(double x) { return 1.0 / sqrt(x); }
};
struct OpRecip {
    __device__ static float f(float x) { return 1.0f / x; }
    __device__ static double f(double x) { return 1.0 / x; }
};
// Integers wrap.
struct OpSquare {
    __device__ static float f(float x) { return x * x; }
    __device__ static double f(double x) { return x * x; }
    __device__ static i32 f(i32 x) { return (i32)((u32)x * (u32)x); }
    __device__ static i64 f(i64 x) { return (i64)((u64)x * (u64)x); }
    __device__ static u8 f(u8 x) { return (u8)((u32)x * (u32)x); }
};
struct OpErf {
    __device__ static float f(float x) { return erff(x); }
    __device__ static double f(double x) { return erf(x); }
};
struct OpLog1p {
    __device__ static float f(float x) { return log1pf(x); }
    __device__ static double f(double x) { return log1p(x); }
};
struct OpExpm1 {
    __device__ static float f(float x) { return expm1f(x); }
    __device__ static double f(double x) { return expm1(x); }
};
struct OpSilu {
    __device__ static float f(float x) { return x / (1.0f + expf(-x)); }
    __device__ static double f(double x) { return x / (1.0 + exp(-x)); }
};
// log1p(exp(x)), and x itself above 20.
struct OpSoftplus {
    __device__ static float f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
    __device__ static double f(double x) { return x > 20.0 ? x : log1p(exp(x)); }
};

template <typename T, typename Op> __device__ __forceinline__ T apply1(T x) { return store<T>(Op::f(load(x))); }

// The layout of binary.cu's contiguous kernels: a block per THREADS × U vectors, U = UNROLL for
// floats and 1 for integers (the host sizes the grid with the same rule).
template <typename T, typename Op> __device__ void unary_contig(T* __restrict__ out, const T* __restrict__ in, u64 n) {
    const int N = Lanes<T>::n;
    const int U = IsFloat<T>::value ? UNROLL : 1;
    typedef Pack<T, N> P;
    const u64 nvec = n / N;
    const P* vin = (const P*)in;
    P* vout = (P*)out;
    const u64 base = (u64)blockIdx.x * THREADS * U + threadIdx.x;
    if (base + (U - 1) * THREADS < nvec) {
        P a[U];
#pragma unroll
        for (int u = 0; u < U; ++u) a[u] = vin[base + u * THREADS];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            P r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = apply1<T, Op>(a[u].v[k]);
            vout[base + u * THREADS] = r;
        }
    } else {
        for (u64 i = base; i < nvec; i += THREADS) {
            P a = vin[i], r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = apply1<T, Op>(a.v[k]);
            vout[i] = r;
        }
    }
    if (blockIdx.x == 0) {
        for (u64 j = nvec * N + threadIdx.x; j < n; j += THREADS) out[j] = apply1<T, Op>(in[j]);
    }
}

// Op codes of the strided kernels: the order of `UnaryOp::ALL` in cartage-core.
template <typename T> __device__ __forceinline__ T apply_code(T x, int op) {
    if constexpr (IsFloat<T>::value) {
        switch (op) {
            case 0: return apply1<T, OpNeg>(x);
            case 1: return apply1<T, OpAbs>(x);
            case 2: return apply1<T, OpExp>(x);
            case 3: return apply1<T, OpLog>(x);
            case 4: return apply1<T, OpSqrt>(x);
            case 5: return apply1<T, OpRelu>(x);
            case 6: return apply1<T, OpTanh>(x);
            case 7: return apply1<T, OpSigmoid>(x);
            case 8: return apply1<T, OpGelu>(x);
            case 9: return apply1<T, OpSin>(x);
            case 10: return apply1<T, OpCos>(x);
            case 11: return apply1<T, OpFloor>(x);
            case 12: return apply1<T, OpCeil>(x);
            case 13: return apply1<T, OpRound>(x);
            case 14: return apply1<T, OpTrunc>(x);
            case 15: return apply1<T, OpSign>(x);
            case 16: return apply1<T, OpRsqrt>(x);
            case 17: return apply1<T, OpRecip>(x);
            case 18: return apply1<T, OpSquare>(x);
            case 19: return apply1<T, OpErf>(x);
            case 20: return apply1<T, OpLog1p>(x);
            case 21: return apply1<T, OpExpm1>(x);
            case 22: return apply1<T, OpSilu>(x);
            default: return apply1<T, OpSoftplus>(x);
        }
    } else {
        switch (op) {
            case 0: return apply1<T, OpNeg>(x);
            case 1: return apply1<T, OpAbs>(x);
            case 15: return apply1<T, OpSign>(x);
            case 18: return apply1<T, OpSquare>(x);
            case 5: return apply1<T, OpRelu>(x);
            default: return x;  // floor, ceil, round, trunc: the identity on integers
        }
    }
}

template <typename T>
__device__ void unary_strided(T* out, const T* in, const Shape& sh, const Strides& so, const Strides& si, int op) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, oi;
        offset2(i, sh, so, si, oo, oi);
        out[oo] = apply_code(in[oi], op);
    }
}

#define UNARY(NAME, OP, TN, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS) unary_##NAME##_##TN##_contig(T* out, const T* in, u64 n) { \
        unary_contig<T, OP>(out, in, n);                                                                           \
    }
#define UNARY_STRIDED(TN, T)                                                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                          \
        unary_##TN##_strided(T* out, const T* in, Shape sh, Strides so, Strides si, int op) {                      \
        unary_strided<T>(out, in, sh, so, si, op);                                                                 \
    }

#define UNARY_FLOAT(NAME, OP) \
    UNARY(NAME, OP, f32, f32) \
    UNARY(NAME, OP, f64, f64) \
    UNARY(NAME, OP, f16, f16) \
    UNARY(NAME, OP, bf16, bf16)
#define UNARY_INT(NAME, OP)   \
    UNARY(NAME, OP, i32, i32) \
    UNARY(NAME, OP, i64, i64) \
    UNARY(NAME, OP, u8, u8)

UNARY_FLOAT(neg, OpNeg)
UNARY_FLOAT(abs, OpAbs)
UNARY_FLOAT(exp, OpExp)
UNARY_FLOAT(log, OpLog)
UNARY_FLOAT(sqrt, OpSqrt)
UNARY_FLOAT(relu, OpRelu)
UNARY_FLOAT(tanh, OpTanh)
UNARY_FLOAT(sigmoid, OpSigmoid)
UNARY_FLOAT(gelu, OpGelu)
UNARY_FLOAT(sin, OpSin)
UNARY_FLOAT(cos, OpCos)
UNARY_FLOAT(floor, OpFloor)
UNARY_FLOAT(ceil, OpCeil)
UNARY_FLOAT(round, OpRound)
UNARY_FLOAT(trunc, OpTrunc)
UNARY_FLOAT(sign, OpSign)
UNARY_FLOAT(rsqrt, OpRsqrt)
UNARY_FLOAT(recip, OpRecip)
UNARY_FLOAT(square, OpSquare)
UNARY_FLOAT(erf, OpErf)
UNARY_FLOAT(log1p, OpLog1p)
UNARY_FLOAT(expm1, OpExpm1)
UNARY_FLOAT(silu, OpSilu)
UNARY_FLOAT(softplus, OpSoftplus)
UNARY_INT(neg, OpNeg)
UNARY_INT(abs, OpAbs)
UNARY_INT(relu, OpRelu)
UNARY_INT(sign, OpSign)
UNARY_INT(square, OpSquare)
UNARY_INT(floor, OpFloor)
UNARY_INT(ceil, OpCeil)
UNARY_INT(round, OpRound)
UNARY_INT(trunc, OpTrunc)
UNARY_STRIDED(f32, f32)
UNARY_STRIDED(f64, f64)
UNARY_STRIDED(f16, f16)
UNARY_STRIDED(bf16, bf16)
UNARY_STRIDED(i32, i32)
UNARY_STRIDED(i64, i64)
UNARY_STRIDED(u8, u8)
