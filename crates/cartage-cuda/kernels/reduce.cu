// reduce.cu: Sum, Mean, LogSumExp and Prod (Kernel::Reduce); the machinery is in reduce_common.cuh.

#define REDUCE_FLOAT(TN, T)          \
    REDUCE(sum, TN, T, SumR<T>)      \
    REDUCE(mean, TN, T, MeanR<T>)    \
    REDUCE(logsumexp, TN, T, LseR<T>) \
    REDUCE(prod, TN, T, ProdR<T>)

REDUCE_FLOAT(f32, f32)
REDUCE_FLOAT(f64, f64)
REDUCE_FLOAT(f16, f16)
REDUCE_FLOAT(bf16, bf16)
REDUCE(sum, i32, i32, SumR<i32>)
REDUCE(sum, i64, i64, SumR<i64>)
REDUCE(sum, u8, u8, SumR<u8>)
REDUCE(prod, i32, i32, ProdR<i32>)
REDUCE(prod, i64, i64, ProdR<i64>)
REDUCE(prod, u8, u8, ProdR<u8>)

// ---- column sums: a sum or mean over the leading dimension of a dense matrix -------------------
//
// `in` is a row-major [reduced, outputs] matrix (a bias gradient: [tokens, features] summed over
// the tokens) and `out` the `outputs` contiguous results. A block of COL_X × COL_Y threads takes
// COL_X × N neighbouring outputs (N elements of 16 bytes per thread, so a warp reads 512
// contiguous bytes of a row) and one of `split` slices of the rows, its COL_Y thread rows
// striding through the slice with UNROLL loads in flight; the thread rows are combined in shared
// memory. With `split` > 1 each slice writes f32 partial sums ([split, outputs]) and a second
// launch (`finish`) adds them in slice order. Sums accumulate in f32, as the general kernel's.

#define COL_X 32
#define COL_Y 8

struct ColumnGeom {
    u64 reduced;
    u64 outputs;
    u64 rows_per_split;
    u64 split;
    i32 mean;
    i32 finish;
};

template <typename T>
__device__ void column_sum(const T* in, T* out, float* partials, const ColumnGeom& g) {
    const int N = Lanes<T>::n;
    __shared__ float tile[COL_Y][COL_X * N];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const u64 col = ((u64)blockIdx.x * COL_X + tx) * N;
    const bool live = col < g.outputs;
    float acc[N];
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = 0.0f;
    if (g.finish) {
        if (live) {
            for (u64 s = ty; s < g.split; s += COL_Y) {
#pragma unroll
                for (int k = 0; k < N; ++k) acc[k] += partials[s * g.outputs + col + k];
            }
        }
    } else if (live) {
        const u64 r0 = (u64)blockIdx.y * g.rows_per_split;
        const u64 r1 = r0 + g.rows_per_split < g.reduced ? r0 + g.rows_per_split : g.reduced;
        const T* p = in + col;
        u64 r = r0 + ty;
#pragma unroll 1
        for (; r + (UNROLL - 1) * COL_Y < r1; r += UNROLL * COL_Y) {
            Pack<T, N> pk[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) pk[u] = *(const Pack<T, N>*)(p + (r + u * COL_Y) * g.outputs);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
                for (int k = 0; k < N; ++k) acc[k] += load(pk[u].v[k]);
            }
        }
#pragma unroll 1
        for (; r < r1; r += COL_Y) {
            Pack<T, N> pk = *(const Pack<T, N>*)(p + r * g.outputs);
#pragma unroll
            for (int k = 0; k < N; ++k) acc[k] += load(pk.v[k]);
        }
    }
    // Lane-major in shared memory (output k of thread tx at k * COL_X + tx): no bank conflicts.
#pragma unroll
    for (int k = 0; k < N; ++k) tile[ty][k * COL_X + tx] = acc[k];
    __syncthreads();
    if (ty != 0 || !live) return;
    const bool final_state = g.finish || g.split == 1;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        float s = tile[0][k * COL_X + tx];
#pragma unroll
        for (int y = 1; y < COL_Y; ++y) s += tile[y][k * COL_X + tx];
        if (final_state) {
            if (g.mean) s /= (float)g.reduced;
            out[col + k] = store<T>(s);
        } else {
            partials[(u64)blockIdx.y * g.outputs + col + k] = s;
        }
    }
}

#define COLUMN_SUM(TN, T)                                                                                \
    extern "C" __global__ void __launch_bounds__(COL_X * COL_Y)                                          \
        column_sum_##TN(const T* in, T* out, float* partials, ColumnGeom g) {                            \
        column_sum<T>(in, out, partials, g);                                                             \
    }

COLUMN_SUM(f32, f32)
COLUMN_SUM(f16, f16)
COLUMN_SUM(bf16, bf16)
