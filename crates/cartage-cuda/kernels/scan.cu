// scan.cu: inclusive cumsum and cumprod along one dimension (Kernel::Scan).
// `scan_<sum|prod>_<dtype>`: rows are the other dimensions (coalesced; input and output
// strides), a row is `cols` elements `in_stride`/`out_stride` apart.
// - `group` = blockDim.x: one block per row, chunks of blockDim.x × ITEMS elements: each thread
//   scans its ITEMS consecutive elements, the block scans the thread totals (warp shuffles, then
//   the warp totals), and a running carry joins the chunks in order.
// - `group` = 1: one thread per row, in order: for rows side by side in memory (a scan along a
//   leading dimension), where neighbouring threads read neighbouring addresses.
// f16/bf16 accumulate in f32; integers wrap (accumulated unsigned in their own width or wider,
// truncated on store).

#define SCAN_ITEMS 4

struct ScanGeom {
    u64 rows;
    u64 cols;
    Shape rows_shape;
    Strides rows_in;
    Strides rows_out;
    i64 in_stride;
    i64 out_stride;
    i32 group;
    i32 pad;
};

template <typename T> struct ScanAcc { typedef typename Compute<T>::type type; };
template <> struct ScanAcc<i32> { typedef u32 type; };
template <> struct ScanAcc<i64> { typedef u64 type; };
template <> struct ScanAcc<u8> { typedef u32 type; };

template <typename A> struct ScanSum {
    __device__ static A ident() { return (A)0; }
    __device__ static A comb(A a, A b) { return a + b; }
};
template <typename A> struct ScanProd {
    __device__ static A ident() { return (A)1; }
    __device__ static A comb(A a, A b) { return a * b; }
};

template <typename T, typename A> __device__ __forceinline__ T scan_store(A a) {
    return store<T>((typename Compute<T>::type)a);
}

template <typename A> __device__ __forceinline__ A shfl_up_scan(A a, int delta) {
    const int W = sizeof(A) / 4;
    union {
        A a;
        u32 w[W];
    } u;
    u.a = a;
#pragma unroll
    for (int k = 0; k < W; ++k) u.w[k] = __shfl_up_sync(0xffffffffu, u.w[k], delta);
    return u.a;
}
template <typename A> __device__ __forceinline__ A shfl_scan(A a, int lane) {
    const int W = sizeof(A) / 4;
    union {
        A a;
        u32 w[W];
    } u;
    u.a = a;
#pragma unroll
    for (int k = 0; k < W; ++k) u.w[k] = __shfl_sync(0xffffffffu, u.w[k], lane);
    return u.a;
}

template <typename T, typename Op> __device__ void scan(const T* in, T* out, const ScanGeom& param) {
    typedef typename ScanAcc<T>::type A;
    __shared__ ScanGeom g;
    __shared__ A warp_total[32];
    __shared__ A chunk_total;
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    if (g.group == 1) {
        for (u64 row = global_thread(); row < g.rows; row += grid_threads()) {
            const T* ip = in + row_offset(row, &g.rows_shape, &g.rows_in);
            T* op = out + row_offset(row, &g.rows_shape, &g.rows_out);
            A acc = Op::ident();
            for (u64 c = 0; c < g.cols; ++c) {
                acc = Op::comb(acc, (A)load(ip[(i64)c * g.in_stride]));
                op[(i64)c * g.out_stride] = scan_store<T>(acc);
            }
        }
        return;
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const u64 chunk = (u64)blockDim.x * SCAN_ITEMS;
    for (u64 row = blockIdx.x; row < g.rows; row += gridDim.x) {
        const T* ip = in + row_offset(row, &g.rows_shape, &g.rows_in);
        T* op = out + row_offset(row, &g.rows_shape, &g.rows_out);
        A carry = Op::ident();
        for (u64 c0 = 0; c0 < g.cols; c0 += chunk) {
            const u64 first = c0 + (u64)threadIdx.x * SCAN_ITEMS;
            A x[SCAN_ITEMS];
#pragma unroll
            for (int k = 0; k < SCAN_ITEMS; ++k) {
                x[k] = first + k < g.cols ? (A)load(ip[(i64)(first + k) * g.in_stride]) : Op::ident();
            }
#pragma unroll
            for (int k = 1; k < SCAN_ITEMS; ++k) x[k] = Op::comb(x[k - 1], x[k]);
            // Inclusive scan of the thread totals within the warp.
            A t = x[SCAN_ITEMS - 1];
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                A up = shfl_up_scan(t, d);
                if (lane >= d) t = Op::comb(up, t);
            }
            if (lane == 31) warp_total[warp] = t;
            __syncthreads();
            if (warp == 0) {
                A w = lane < warps ? warp_total[lane] : Op::ident();
#pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    A up = shfl_up_scan(w, d);
                    if (lane >= d) w = Op::comb(up, w);
                }
                if (lane < warps) warp_total[lane] = w;  // inclusive over warps
                if (lane == 31) chunk_total = w;
            }
            __syncthreads();
            // The exclusive prefix of this thread: carry, earlier warps, earlier lanes.
            A before = shfl_up_scan(t, 1);
            if (lane == 0) before = Op::ident();
            A prefix = carry;
            if (warp > 0) prefix = Op::comb(prefix, warp_total[warp - 1]);
            prefix = Op::comb(prefix, before);
#pragma unroll
            for (int k = 0; k < SCAN_ITEMS; ++k) {
                if (first + k < g.cols) op[(i64)(first + k) * g.out_stride] = scan_store<T>(Op::comb(prefix, x[k]));
            }
            carry = Op::comb(carry, chunk_total);
            __syncthreads();
        }
    }
}

#define SCAN(TN, T)                                                                                                 \
    extern "C" __global__ void __launch_bounds__(THREADS) scan_sum_##TN(const T* in, T* out, ScanGeom g) {          \
        scan<T, ScanSum<typename ScanAcc<T>::type> >(in, out, g);                                                   \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS) scan_prod_##TN(const T* in, T* out, ScanGeom g) {         \
        scan<T, ScanProd<typename ScanAcc<T>::type> >(in, out, g);                                                  \
    }

SCAN(f32, f32)
SCAN(f64, f64)
SCAN(f16, f16)
SCAN(bf16, bf16)
SCAN(i32, i32)
SCAN(i64, i64)
SCAN(u8, u8)
