// cast.cu: dtype conversions with Rust `as` semantics (Kernel::Cast), see `as_cast` in common.cuh.
// `cast_<src>_<dst>(out, in, shape, out_strides, in_strides)`; a dense pair coalesces to rank 1,
// where the offsets are a multiply and no division.

template <typename D, typename S>
__device__ void cast_strided(D* out, const S* in, const Shape& sh, const Strides& so, const Strides& si) {
    for (u64 i = global_thread(); i < sh.numel; i += grid_threads()) {
        i64 oo, oi;
        offset2(i, sh, so, si, oo, oi);
        out[oo] = as_cast<D, S>(in[oi]);
    }
}

#define CAST(SN, S, DN, D)                                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        cast_##SN##_##DN(D* out, const S* in, Shape sh, Strides so, Strides si) {                                   \
        cast_strided<D, S>(out, in, sh, so, si);                                                                    \
    }

#define CAST_FROM(SN, S)    \
    CAST(SN, S, f32, f32)   \
    CAST(SN, S, f64, f64)   \
    CAST(SN, S, f16, f16)   \
    CAST(SN, S, bf16, bf16) \
    CAST(SN, S, i32, i32)   \
    CAST(SN, S, i64, i64)   \
    CAST(SN, S, u8, u8)     \
    CAST(SN, S, bool, bool8)

CAST_FROM(f32, f32)
CAST_FROM(f64, f64)
CAST_FROM(f16, f16)
CAST_FROM(bf16, bf16)
CAST_FROM(i32, i32)
CAST_FROM(i64, i64)
CAST_FROM(u8, u8)
CAST_FROM(bool, bool8)
