// pool.cu: 2-D max and average pooling (Kernel::Pool2d) and their input gradients
// (Kernel::Pool2dBackward), as direct kernels (PyTorch's own max_pool2d/avg_pool2d CUDA kernels
// are native too, not cuDNN). Every operand is [N, C, rows, cols]; the read operands go through
// their strides (`a`: the input, or the incoming gradient; `b`: the max backward's indices), the
// written ones are contiguous.
// `max_pool2d_<dtype>_<i32|i64>`, `avg_pool2d_<dtype>_<i32|i64>`: one thread per output element
// (grid-stride). Max keeps the first NaN tap, else the first largest tap in row-major window
// order; taps outside the input are skipped (padding never wins: every window has a tap inside,
// by validation), and `indices`, when not null, get `y·W + x` of that tap. Average sums the taps
// inside the input in f32 (f64 for f64) and divides once, by kh·kw or by the taps inside.
// `max_pool2d_backward_...`, `avg_pool2d_backward_...`: one thread per INPUT element, gathering
// over the windows that contain it (rows `i` with `i·stride − pad + a·dil = y` for a tap `a`), in
// row-major window order: deterministic, no atomics. Max adds a window's gradient when its index
// equals this position (the index is compared, never followed); average adds `grad / divisor`.
// `i32`/`i64`: the width of the position and window arithmetic; the host takes i32 when every
// size involved fits (a faster division), i64 otherwise. Memory offsets are always i64.

struct PoolGeom {
    i64 total;      // threads' items: N·C·OH·OW (forward), N·C·H·W (backward)
    i64 channels;   // C
    i64 height;     // H, W: the input plane
    i64 width;
    i64 out_height; // OH, OW
    i64 out_width;
    Strides a;      // input (forward) or grad (backward): n, c, row, col
    Strides b;      // indices (max backward): n, c, row, col
    i64 kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
    i32 include_pad; // average: divide by kh·kw (else by the taps inside the input)
    i32 pad;
};

template <typename S> struct Unsigned;
template <> struct Unsigned<i32> { typedef u32 type; };
template <> struct Unsigned<i64> { typedef u64 type; };

// Row-major position `i` of [N, C, rows, cols] as (plane n·C + c split into n and c, row, col).
template <typename U>
__device__ __forceinline__ void split4(U i, U channels, U rows, U cols, U& n, U& c, U& y, U& x) {
    U q = i / cols;
    x = i - q * cols;
    U r = q / rows;
    y = q - r * rows;
    n = r / channels;
    c = r - n * channels;
}

// The windows along one axis whose taps reach position `pos`: those `i` in [lo, hi] with
// `i·stride − pad + a·dil = pos` for some `a < kernel` (a window in that range reaches it exactly
// when `(pos + pad − i·stride)` is a multiple of `dil`). Empty when lo > hi.
template <typename S>
__device__ __forceinline__ void window_range(S pos, S pad, S kernel, S stride, S dil, S count, S& lo, S& hi) {
    S t = pos + pad;
    S first = t - (kernel - 1) * dil;
    lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    hi = t / stride;
    if (hi > count - 1) hi = count - 1;
}

template <typename T, typename S>
__device__ __forceinline__ void max_pool2d(T* out, i64* indices, const T* in, const PoolGeom& g) {
    typedef typename Compute<T>::type C;
    typedef typename Unsigned<S>::type U;
    const U total = (U)g.total, channels = (U)g.channels, oh = (U)g.out_height, ow = (U)g.out_width;
    const S h = (S)g.height, w = (S)g.width;
    const S kh = (S)g.kernel_h, kw = (S)g.kernel_w, dh = (S)g.dil_h, dw = (S)g.dil_w;
    for (U i = (U)global_thread(); i < total; i += (U)grid_threads()) {
        U n, c, oy, ox;
        split4<U>(i, channels, oh, ow, n, c, oy, ox);
        const T* plane = in + (i64)n * g.a.s[0] + (i64)c * g.a.s[1];
        const S y0 = (S)oy * (S)g.stride_h - (S)g.pad_h, x0 = (S)ox * (S)g.stride_w - (S)g.pad_w;
        C best = 0;
        S best_at = -1;
        for (S ka = 0; ka < kh; ++ka) {
            const S y = y0 + ka * dh;
            if (y < 0 || y >= h) continue;
            const T* row = plane + (i64)y * g.a.s[2];
            for (S kb = 0; kb < kw; ++kb) {
                const S x = x0 + kb * dw;
                if (x < 0 || x >= w) continue;
                const C v = load(row[(i64)x * g.a.s[3]]);
                if (best_at < 0 || v > best || (v != v && best == best)) {
                    best = v;
                    best_at = y * w + x;
                    if (v != v) {
                        ka = kh;  // the first NaN is final
                        break;
                    }
                }
            }
        }
        out[i] = store<T>(best);
        if (indices) indices[i] = (i64)best_at;
    }
}

template <typename T, typename S>
__device__ __forceinline__ void avg_pool2d(T* out, const T* in, const PoolGeom& g) {
    typedef typename Compute<T>::type C;
    typedef typename Unsigned<S>::type U;
    const U total = (U)g.total, channels = (U)g.channels, oh = (U)g.out_height, ow = (U)g.out_width;
    const S h = (S)g.height, w = (S)g.width, kh = (S)g.kernel_h, kw = (S)g.kernel_w;
    const C whole = (C)(g.kernel_h * g.kernel_w);
    // Average pooling has dilation 1 (validated): a window is the box [y0, y0 + kh) × [x0, x0 + kw).
    for (U i = (U)global_thread(); i < total; i += (U)grid_threads()) {
        U n, c, oy, ox;
        split4<U>(i, channels, oh, ow, n, c, oy, ox);
        const T* plane = in + (i64)n * g.a.s[0] + (i64)c * g.a.s[1];
        const S y0 = (S)oy * (S)g.stride_h - (S)g.pad_h, x0 = (S)ox * (S)g.stride_w - (S)g.pad_w;
        const S ys = y0 < 0 ? 0 : y0, ye = y0 + kh < h ? y0 + kh : h;
        const S xs = x0 < 0 ? 0 : x0, xe = x0 + kw < w ? x0 + kw : w;
        C sum = 0;
        for (S y = ys; y < ye; ++y) {
            const T* row = plane + (i64)y * g.a.s[2];
            for (S x = xs; x < xe; ++x) sum += load(row[(i64)x * g.a.s[3]]);
        }
        const C divisor = g.include_pad ? whole : (C)((ye - ys) * (xe - xs));
        out[i] = store<T>(sum / divisor);
    }
}

template <typename T, typename S>
__device__ __forceinline__ void max_pool2d_backward(T* out, const T* grad, const i64* indices, const PoolGeom& g) {
    typedef typename Compute<T>::type C;
    typedef typename Unsigned<S>::type U;
    const U total = (U)g.total, channels = (U)g.channels, hu = (U)g.height, wu = (U)g.width;
    const S w = (S)g.width, oh = (S)g.out_height, ow = (S)g.out_width;
    const S kh = (S)g.kernel_h, kw = (S)g.kernel_w, sh = (S)g.stride_h, sw = (S)g.stride_w;
    const S ph = (S)g.pad_h, pw = (S)g.pad_w, dh = (S)g.dil_h, dw = (S)g.dil_w;
    for (U i = (U)global_thread(); i < total; i += (U)grid_threads()) {
        U n, c, yu, xu;
        split4<U>(i, channels, hu, wu, n, c, yu, xu);
        const S y = (S)yu, x = (S)xu;
        const T* gp = grad + (i64)n * g.a.s[0] + (i64)c * g.a.s[1];
        const i64* ip = indices + (i64)n * g.b.s[0] + (i64)c * g.b.s[1];
        const i64 here = (i64)(y * w + x);
        S ilo, ihi, jlo, jhi;
        window_range<S>(y, ph, kh, sh, dh, oh, ilo, ihi);
        window_range<S>(x, pw, kw, sw, dw, ow, jlo, jhi);
        C sum = 0;
        for (S wi = ilo; wi <= ihi; ++wi) {
            if (dh != 1 && (y + ph - wi * sh) % dh != 0) continue;
            for (S wj = jlo; wj <= jhi; ++wj) {
                if (dw != 1 && (x + pw - wj * sw) % dw != 0) continue;
                if (ip[(i64)wi * g.b.s[2] + (i64)wj * g.b.s[3]] == here) {
                    sum += load(gp[(i64)wi * g.a.s[2] + (i64)wj * g.a.s[3]]);
                }
            }
        }
        out[i] = store<T>(sum);
    }
}

template <typename T, typename S>
__device__ __forceinline__ void avg_pool2d_backward(T* out, const T* grad, const PoolGeom& g) {
    typedef typename Compute<T>::type C;
    typedef typename Unsigned<S>::type U;
    const U total = (U)g.total, channels = (U)g.channels, hu = (U)g.height, wu = (U)g.width;
    const S h = (S)g.height, w = (S)g.width, oh = (S)g.out_height, ow = (S)g.out_width;
    const S kh = (S)g.kernel_h, kw = (S)g.kernel_w, sh = (S)g.stride_h, sw = (S)g.stride_w;
    const S ph = (S)g.pad_h, pw = (S)g.pad_w;
    const C whole = (C)(g.kernel_h * g.kernel_w);
    for (U i = (U)global_thread(); i < total; i += (U)grid_threads()) {
        U n, c, yu, xu;
        split4<U>(i, channels, hu, wu, n, c, yu, xu);
        const S y = (S)yu, x = (S)xu;
        const T* gp = grad + (i64)n * g.a.s[0] + (i64)c * g.a.s[1];
        S ilo, ihi, jlo, jhi;
        window_range<S>(y, ph, kh, sh, (S)1, oh, ilo, ihi);
        window_range<S>(x, pw, kw, sw, (S)1, ow, jlo, jhi);
        C sum = 0;
        if (g.include_pad) {
            for (S wi = ilo; wi <= ihi; ++wi) {
                for (S wj = jlo; wj <= jhi; ++wj) sum += load(gp[(i64)wi * g.a.s[2] + (i64)wj * g.a.s[3]]);
            }
            sum = sum / whole;
        } else {
            for (S wi = ilo; wi <= ihi; ++wi) {
                const S r0 = wi * sh - ph, r1 = r0 + kh;
                const S rows = (r1 < h ? r1 : h) - (r0 < 0 ? 0 : r0);
                for (S wj = jlo; wj <= jhi; ++wj) {
                    const S c0 = wj * sw - pw, c1 = c0 + kw;
                    const S cols = (c1 < w ? c1 : w) - (c0 < 0 ? 0 : c0);
                    sum += load(gp[(i64)wi * g.a.s[2] + (i64)wj * g.a.s[3]]) / (C)(rows * cols);
                }
            }
        }
        out[i] = store<T>(sum);
    }
}

#define POOL_WIDTH(TN, T, SN, S)                                                                                   \
    extern "C" __global__ void __launch_bounds__(THREADS) max_pool2d_##TN##_##SN(T* out, i64* indices, const T* in, \
                                                                                 PoolGeom g) {                     \
        max_pool2d<T, S>(out, indices, in, g);                                                                     \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS) avg_pool2d_##TN##_##SN(T* out, const T* in, PoolGeom g) { \
        avg_pool2d<T, S>(out, in, g);                                                                              \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                          \
        max_pool2d_backward_##TN##_##SN(T* out, const T* grad, const i64* indices, PoolGeom g) {                   \
        max_pool2d_backward<T, S>(out, grad, indices, g);                                                          \
    }                                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                          \
        avg_pool2d_backward_##TN##_##SN(T* out, const T* grad, PoolGeom g) {                                       \
        avg_pool2d_backward<T, S>(out, grad, g);                                                                   \
    }
#define POOL(TN, T)               \
    POOL_WIDTH(TN, T, i32, i32)   \
    POOL_WIDTH(TN, T, i64, i64)
POOL(f32, f32)
POOL(f64, f64)
POOL(f16, f16)
POOL(bf16, bf16)
