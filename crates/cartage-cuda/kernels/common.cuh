// common.cuh: what every cartage kernel file shares — fixed-width types, f16/bf16 storage types
// with their conversions (no CUDA headers: NVRTC needs none of the toolkit's include files),
// Rust `as` casts, strided indexing and 16-byte vector packs. Prepended to each .cu file by
// crates/cartage-cuda/src/modules.rs before NVRTC compiles it.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;
typedef float f32;
typedef double f64;

// Storage types: f16 and bf16 are bit patterns computed in f32; bool is one byte holding 0 or 1.
struct __align__(2) f16 { u16 bits; };
struct __align__(2) bf16 { u16 bits; };
struct __align__(1) bool8 { u8 v; };

#define MAX_RANK 8
#define THREADS 256

// A (coalesced) shape shared by every operand of a launch, and one stride set per operand,
// both in elements. Mirrors `KernelShape` / `KernelStrides` in src/launch/geometry.rs.
struct Shape {
    u64 numel;
    i32 rank;
    i32 pad;
    u64 dims[MAX_RANK];
};
struct Strides {
    i64 s[MAX_RANK];
};

// ---- f16 / bf16 ------------------------------------------------------------------------------

__device__ __forceinline__ float f16_to_f32(f16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ f16 f32_to_f16(float f) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
__device__ __forceinline__ f16 f64_to_f16(double d) {
    f16 h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(bf16 b) { return __uint_as_float(((u32)b.bits) << 16); }
// Round to nearest even; NaN stays a quiet NaN (as the `half` crate does).
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    bf16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (u16)((u >> 16) | 0x40u);
        return b;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    b.bits = (u16)(u >> 16);
    return b;
}

// ---- compute types: f16/bf16 compute in f32, everything else in itself ------------------------

template <typename T> struct Compute { typedef T type; };
template <> struct Compute<f16> { typedef float type; };
template <> struct Compute<bf16> { typedef float type; };
template <> struct Compute<bool8> { typedef u8 type; };

__device__ __forceinline__ float load(f16 x) { return f16_to_f32(x); }
__device__ __forceinline__ float load(bf16 x) { return bf16_to_f32(x); }
__device__ __forceinline__ u8 load(bool8 x) { return x.v; }
__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ double load(double x) { return x; }
__device__ __forceinline__ i32 load(i32 x) { return x; }
__device__ __forceinline__ i64 load(i64 x) { return x; }
__device__ __forceinline__ u8 load(u8 x) { return x; }

template <typename T> __device__ __forceinline__ T store(typename Compute<T>::type v) { return v; }
template <> __device__ __forceinline__ f16 store<f16>(float v) { return f32_to_f16(v); }
template <> __device__ __forceinline__ bf16 store<bf16>(float v) { return f32_to_bf16(v); }
template <> __device__ __forceinline__ bool8 store<bool8>(u8 v) {
    bool8 b;
    b.v = v != 0;
    return b;
}

// ---- Rust `as` casts: float→int truncates and saturates (NaN → 0), int→int wraps,
// anything→bool is `!= 0`. Floats widen to f64 exactly and ints to i64 exactly first. ------------

template <typename T> struct IsFloat { static const bool value = false; };
template <> struct IsFloat<float> { static const bool value = true; };
template <> struct IsFloat<double> { static const bool value = true; };
template <> struct IsFloat<f16> { static const bool value = true; };
template <> struct IsFloat<bf16> { static const bool value = true; };

__device__ __forceinline__ double widen_float(float x) { return x; }
__device__ __forceinline__ double widen_float(double x) { return x; }
__device__ __forceinline__ double widen_float(f16 x) { return f16_to_f32(x); }
__device__ __forceinline__ double widen_float(bf16 x) { return bf16_to_f32(x); }
__device__ __forceinline__ i64 widen_int(i32 x) { return x; }
__device__ __forceinline__ i64 widen_int(i64 x) { return x; }
__device__ __forceinline__ i64 widen_int(u8 x) { return x; }
__device__ __forceinline__ i64 widen_int(bool8 x) { return x.v; }

template <typename D> __device__ __forceinline__ D from_f64(double v);
template <> __device__ __forceinline__ float from_f64<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double from_f64<double>(double v) { return v; }
template <> __device__ __forceinline__ f16 from_f64<f16>(double v) { return f64_to_f16(v); }
// f64 → bf16 exactly as the `half` crate does it (the CPU backend and the conformance reference
// use `bf16::from_f64`): it rounds on the upper 32 bits of the f64 only, so a value just above a
// tie whose extra bits lie in the lower word rounds to even. Matching it keeps random draws and
// casts bit-identical across backends.
__device__ __forceinline__ bf16 f64_to_bf16(double value) {
    u64 val = (u64)__double_as_longlong(value);
    u32 x = (u32)(val >> 32);
    u32 sign = x & 0x80000000u, exp = x & 0x7FF00000u, man = x & 0x000FFFFFu;
    bf16 r;
    if (exp == 0x7FF00000u) {
        u32 nan_bit = (man == 0 && (u32)val == 0) ? 0u : 0x40u;
        r.bits = (u16)((sign >> 16) | 0x7F80u | nan_bit | (man >> 13));
        return r;
    }
    u32 half_sign = sign >> 16;
    i32 half_exp = (i32)(exp >> 20) - 1023 + 127;
    if (half_exp >= 0xFF) {
        r.bits = (u16)(half_sign | 0x7F80u);
        return r;
    }
    if (half_exp <= 0) {
        if (7 - half_exp > 21) {
            r.bits = (u16)half_sign;
            return r;
        }
        u32 m = man | 0x00100000u;
        u32 half_man = m >> (14 - half_exp);
        u32 round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0 && (m & (3 * round_bit - 1)) != 0) half_man += 1;
        r.bits = (u16)(half_sign | half_man);
        return r;
    }
    u32 bits = half_sign | ((u32)half_exp << 7) | (man >> 13);
    if ((man & 0x1000u) != 0 && (man & (3 * 0x1000u - 1)) != 0) bits += 1;
    r.bits = (u16)bits;
    return r;
}
template <> __device__ __forceinline__ bf16 from_f64<bf16>(double v) { return f64_to_bf16(v); }
// The hardware conversion saturates but turns NaN into the most negative integer; Rust gives 0.
template <> __device__ __forceinline__ i32 from_f64<i32>(double v) { return v != v ? 0 : __double2int_rz(v); }
template <> __device__ __forceinline__ i64 from_f64<i64>(double v) { return v != v ? 0 : __double2ll_rz(v); }
template <> __device__ __forceinline__ u8 from_f64<u8>(double v) {
    if (!(v > 0.0)) return 0;
    if (v >= 255.0) return 255;
    return (u8)__double2uint_rz(v);
}
template <> __device__ __forceinline__ bool8 from_f64<bool8>(double v) {
    bool8 b;
    b.v = v != 0.0;
    return b;
}

template <typename D> __device__ __forceinline__ D from_i64(i64 v);
template <> __device__ __forceinline__ float from_i64<float>(i64 v) { return (float)v; }
template <> __device__ __forceinline__ double from_i64<double>(i64 v) { return (double)v; }
template <> __device__ __forceinline__ f16 from_i64<f16>(i64 v) { return f32_to_f16((float)v); }
template <> __device__ __forceinline__ bf16 from_i64<bf16>(i64 v) { return f32_to_bf16((float)v); }
template <> __device__ __forceinline__ i32 from_i64<i32>(i64 v) { return (i32)(u32)(u64)v; }
template <> __device__ __forceinline__ i64 from_i64<i64>(i64 v) { return v; }
template <> __device__ __forceinline__ u8 from_i64<u8>(i64 v) { return (u8)(u64)v; }
template <> __device__ __forceinline__ bool8 from_i64<bool8>(i64 v) {
    bool8 b;
    b.v = v != 0;
    return b;
}

template <typename D, typename S> __device__ __forceinline__ D as_cast(S x) {
    if constexpr (IsFloat<S>::value) {
        return from_f64<D>(widen_float(x));
    } else {
        return from_i64<D>(widen_int(x));
    }
}

// ---- indexing ----------------------------------------------------------------------------------

__device__ __forceinline__ u64 global_thread() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 grid_threads() { return (u64)gridDim.x * blockDim.x; }

// The coordinate of row-major position `i` along dimension `d` of `sh`, leaving in `i` the
// position among the outer dimensions. The outermost dimension needs no division (a valid `i` is
// already below its size), and a shape of fewer than 2^32 elements divides in 32 bits, a few
// instructions where a 64-bit division is a long subroutine.
__device__ __forceinline__ i64 coordinate(u64& i, const Shape& sh, int d) {
    if (d == 0) {
        i64 c = (i64)i;
        i = 0;
        return c;
    }
    u64 n = sh.dims[d];
    u64 q = (sh.numel >> 32) == 0 ? (u64)((u32)i / (u32)n) : i / n;
    i64 c = (i64)(i - q * n);
    i = q;
    return c;
}

// Element offset of row-major position `i` for one operand.
__device__ __forceinline__ i64 offset1(u64 i, const Shape& sh, const Strides& a) {
    if (sh.rank == 1) return (i64)i * a.s[0];
    i64 oa = 0;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < sh.rank) {
            i64 c = coordinate(i, sh, d);
            oa += c * a.s[d];
        }
    }
    return oa;
}

// The same through pointers, out of line: for kernels that keep their geometry in shared memory
// (inlining the divisions at every call site multiplies NVRTC's compile time, and an out-of-line
// call on a kernel parameter would copy the whole parameter to local memory in every thread).
__device__ __noinline__ i64 offset1_at(u64 i, const Shape* sh, const Strides* a) {
    i64 oa = 0;
    for (int d = sh->rank - 1; d >= 0; --d) {
        u64 q = i / sh->dims[d];
        oa += (i64)(i - q * sh->dims[d]) * a->s[d];
        i = q;
    }
    return oa;
}

__device__ __forceinline__ void offset2(u64 i, const Shape& sh, const Strides& a, const Strides& b, i64& oa, i64& ob) {
    if (sh.rank == 1) {
        oa = (i64)i * a.s[0];
        ob = (i64)i * b.s[0];
        return;
    }
    oa = 0;
    ob = 0;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < sh.rank) {
            i64 c = coordinate(i, sh, d);
            oa += c * a.s[d];
            ob += c * b.s[d];
        }
    }
}

__device__ __forceinline__ void offset3(u64 i, const Shape& sh, const Strides& a, const Strides& b, const Strides& c3,
                                        i64& oa, i64& ob, i64& oc) {
    if (sh.rank == 1) {
        oa = (i64)i * a.s[0];
        ob = (i64)i * b.s[0];
        oc = (i64)i * c3.s[0];
        return;
    }
    oa = 0;
    ob = 0;
    oc = 0;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < sh.rank) {
            i64 c = coordinate(i, sh, d);
            oa += c * a.s[d];
            ob += c * b.s[d];
            oc += c * c3.s[d];
        }
    }
}

__device__ __forceinline__ void offset4(u64 i, const Shape& sh, const Strides& a, const Strides& b, const Strides& c3,
                                        const Strides& d4, i64& oa, i64& ob, i64& oc, i64& od) {
    oa = 0;
    ob = 0;
    oc = 0;
    od = 0;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < sh.rank) {
            i64 c = coordinate(i, sh, d);
            oa += c * a.s[d];
            ob += c * b.s[d];
            oc += c * c3.s[d];
            od += c * d4.s[d];
        }
    }
}

// ---- 16-byte vector packs ----------------------------------------------------------------------

template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T v[N]; };
template <typename T> struct Lanes { static const int n = 16 / sizeof(T); };

// Bandwidth-bound kernels issue UNROLL independent 16-byte loads per thread before using any of
// them, so that enough bytes are in flight to reach memory bandwidth.
#define UNROLL 4
