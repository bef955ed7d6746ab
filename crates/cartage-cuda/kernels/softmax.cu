// softmax.cu: Softmax and log-softmax along one dimension (Kernel::Softmax); in f32 for f16/bf16.
// `softmax_fast_<dtype>_v<V>`: dense rows along the last dimension, 16-byte aligned, held in
// registers (rows_common.cuh): one read, an all-reduction of the max, then of the sum of
// exponentials (kept in registers for softmax), one write.
// `softmax_long_<dtype>`: dense aligned rows too long to hold in registers: a block per row,
// a streaming pass of 16-byte loads keeping (max, sum of exp) online, then a second pass that
// reads the row again (from L2: the grid is sized so the rows in flight fit there) and writes.
// `softmax_<dtype>`: any strides, a warp or a block per row: one pass for the running
// (max, sum of exp), one to write. It also runs the causal softmax: row r of each [L, S]
// matrix reads its first r % L + 1 elements and writes 0 (−inf for log-softmax) past them.

struct SoftmaxGeom {
    u64 rows;
    u64 cols;
    Shape rows_shape;
    Strides rows_in;
    Strides rows_out;
    i64 in_stride;
    i64 out_stride;
    i32 group;
    i32 log;
    u64 causal_rows;  // causal: rows per [L, S] matrix (row r keeps its first r % L + 1); 0: all
};

template <typename T> __device__ void softmax(const T* in, T* out, const SoftmaxGeom& param) {
    typedef typename Compute<T>::type C;
    __shared__ SoftmaxGeom g;
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    typedef Lse<C> L;
    typedef typename L::Acc Acc;
    __shared__ Acc row_state;
    const int group = g.group;
    const int lane = threadIdx.x % group;
    const u64 per_block = THREADS / group;
    for (u64 row = blockIdx.x * per_block + threadIdx.x / group; row < g.rows; row += gridDim.x * per_block) {
        i64 bi = offset_shared(row, &g.rows_shape, &g.rows_in);
        i64 bo = offset_shared(row, &g.rows_shape, &g.rows_out);
        const u64 kept = g.causal_rows ? min(row % g.causal_rows + 1, g.cols) : g.cols;
        Acc acc = L::ident();
        for (u64 c = lane; c < kept; c += group) acc = L::comb(acc, L::lift(load(in[bi + (i64)c * g.in_stride])));
        acc = group_reduce<L>(acc, group);
        if (group == 32) {
            acc = shfl_acc(acc, 0);
        } else {
            if (threadIdx.x == 0) row_state = acc;
            __syncthreads();
            acc = row_state;
            __syncthreads();
        }
        C m = acc.m, logs = log_c(acc.s), inv = (C)1 / acc.s;
        for (u64 c = lane; c < g.cols; c += group) {
            C y;
            if (c < kept) {
                C x = load(in[bi + (i64)c * g.in_stride]);
                y = g.log ? x - m - logs : exp_c(x - m) * inv;
            } else {
                y = g.log ? -inf_r((C)0) : (C)0;  // masked (causal)
            }
            out[bo + (i64)c * g.out_stride] = store<T>(y);
        }
    }
}

#define SOFTMAX(TN, T)                                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS) softmax_##TN(const T* in, T* out, SoftmaxGeom g) {        \
        softmax<T>(in, out, g);                                                                                     \
    }

SOFTMAX(f32, f32)
SOFTMAX(f64, f64)
SOFTMAX(f16, f16)
SOFTMAX(bf16, bf16)

template <typename T, int V> __device__ void softmax_fast(const T* in, T* out, const RowGeom& param) {
    typedef typename Compute<T>::type C;
    const int N = RegRow<T, V>::N;
    __shared__ RowGeom g;
    __shared__ C scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const GroupLayout L(g.group);
    const u64 nv = g.cols / N;
    const bool log = g.flag != 0;
    for (u64 row = L.first; L.more(row, g.rows); row += L.step) {
        const bool active = row < g.rows;
        RegRow<T, V> r;
        r.load(in + (active ? row_offset(row, &g.rows_shape, &g.rows_in) : 0), active ? nv : 0, L.lane, L.group);
        C m = -inf_r((C)0);
#pragma unroll
        for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int k = 0; k < N; ++k) {
                if (r.ok[v]) m = max_r(m, r.x[v][k]);
            }
        }
        m = group_allreduce<MaxOp<C> >(m, L.group, scratch);
        C s = 0;
        if (log) {
#pragma unroll
            for (int v = 0; v < V; ++v) {
#pragma unroll
                for (int k = 0; k < N; ++k) s += r.ok[v] ? exp_r(r.x[v][k] - m) : (C)0;
            }
        } else {
            // Keep the exponentials: the output is each one over their sum.
#pragma unroll
            for (int v = 0; v < V; ++v) {
#pragma unroll
                for (int k = 0; k < N; ++k) {
                    r.x[v][k] = r.ok[v] ? exp_r(r.x[v][k] - m) : (C)0;
                    s += r.x[v][k];
                }
            }
        }
        s = group_allreduce<SumOp<C> >(s, L.group, scratch);
        if (!active) continue;
        T* orow = out + row_offset(row, &g.rows_shape, &g.rows_out);
        if (log) {
            const C shift = m + log_r(s);
            r.store(orow, L.lane, L.group, [=](C x, u64) { return x - shift; });
        } else {
            const C inv = (C)1 / s;
            r.store(orow, L.lane, L.group, [=](C x, u64) { return x * inv; });
        }
    }
}

// The block limit of each V leaves the registers a thread needs to hold its vectors (V1/V2:
// 1024 threads, 64 registers; V4: 512, 128; V8: 256, 255); the host keeps blocks within 512.
// f32's V4 keeps the 64-register limit of 1024: its few spills cost less on the H200 than the
// occupancy 94 registers would lose (1.31× against 1.04× PyTorch at rows of 4096).
#define SOFTMAX_FAST(TN, T, V, BOUND)                                                                               \
    extern "C" __global__ void __launch_bounds__(BOUND) softmax_fast_##TN##_v##V(const T* in, T* out, RowGeom g) {  \
        softmax_fast<T, V>(in, out, g);                                                                             \
    }
#define SOFTMAX_FAST_ALL(TN, T, B4) \
    SOFTMAX_FAST(TN, T, 1, 1024) SOFTMAX_FAST(TN, T, 2, 1024) SOFTMAX_FAST(TN, T, 4, B4) SOFTMAX_FAST(TN, T, 8, 256)

SOFTMAX_FAST_ALL(f32, f32, 1024)
SOFTMAX_FAST_ALL(f64, f64, 512)
SOFTMAX_FAST_ALL(f16, f16, 512)
SOFTMAX_FAST_ALL(bf16, bf16, 512)

// Fold K values into a running (max, sum of exp(x - max)): one rescale for the lot. A NaN sticks
// in the max (and so in every output of the row).
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

template <typename T> __device__ void softmax_long(const T* in, T* out, const RowGeom& param) {
    typedef typename Compute<T>::type C;
    const int N = Lanes<T>::n;
    const int U = N <= 4 ? 4 : 2;
    typedef Pack<T, N> P;
    __shared__ RowGeom g;
    __shared__ MaxSum<C> scratch[32];
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const u64 nv = g.cols / N;
    const u64 B = blockDim.x;
    const bool log = g.flag != 0;
    for (u64 row = blockIdx.x; row < g.rows; row += gridDim.x) {
        const P* ip = (const P*)(in + row_offset(row, &g.rows_shape, &g.rows_in));
        P* op = (P*)(out + row_offset(row, &g.rows_shape, &g.rows_out));
        MaxSum<C> a = MaxSumOp<C>::ident();
        u64 v = threadIdx.x;
#pragma unroll 1
        for (; v + (U - 1) * B < nv; v += U * B) {
            P pk[U];
#pragma unroll
            for (int u = 0; u < U; ++u) pk[u] = ip[v + u * B];
            C x[U * N];
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int k = 0; k < N; ++k) x[u * N + k] = (C)load(pk[u].v[k]);
            }
            max_sum_fold<C, U * N>(a, x);
        }
#pragma unroll 1
        for (; v < nv; v += B) {
            P pk = ip[v];
            C x[N];
#pragma unroll
            for (int k = 0; k < N; ++k) x[k] = (C)load(pk.v[k]);
            max_sum_fold<C, N>(a, x);
        }
        a = group_allreduce<MaxSumOp<C> >(a, (int)B, scratch);
        const C m = a.m, shift = a.m + log_r(a.s), inv = (C)1 / a.s;
#pragma unroll 1
        for (v = threadIdx.x; v < nv; v += B) {
            P pk = ip[v], o;
#pragma unroll
            for (int k = 0; k < N; ++k) {
                C x = (C)load(pk.v[k]);
                o.v[k] = out_r<T>(log ? x - shift : exp_r(x - m) * inv);
            }
            op[v] = o;
        }
    }
}

#define SOFTMAX_LONG(TN, T)                                                                                         \
    extern "C" __global__ void __launch_bounds__(1024) softmax_long_##TN(const T* in, T* out, RowGeom g) {          \
        softmax_long<T>(in, out, g);                                                                                \
    }

SOFTMAX_LONG(f32, f32)
SOFTMAX_LONG(f64, f64)
SOFTMAX_LONG(f16, f16)
SOFTMAX_LONG(bf16, bf16)
