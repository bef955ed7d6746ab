// softmax.cu: Softmax and log-softmax along one dimension (Kernel::Softmax), a warp or a block
// per row: one pass for the running (max, sum of exp), one to write; in f32 for f16/bf16.

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
        Acc acc = L::ident();
        for (u64 c = lane; c < g.cols; c += group) acc = L::comb(acc, L::lift(load(in[bi + (i64)c * g.in_stride])));
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
            C x = load(in[bi + (i64)c * g.in_stride]);
            C y = g.log ? x - m - logs : exp_c(x - m) * inv;
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
