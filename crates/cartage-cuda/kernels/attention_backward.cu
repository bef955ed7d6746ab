// attention_backward.cu: the fused backward of scaled dot-product attention
// (Kernel::AttentionBackward), in f32 for f16/bf16/f32 and f64 for f64, every gradient rounded
// once on store. Nothing of size L x S is stored: besides the outputs, two compute-type values
// per query row (its log-sum-exp and D_i = sum_j P_ij dP_ij) go through a [B, L] scratch pair.
// q [B, L, E], k [B, S, E], v [B, S, Ev] and the incoming gradient dO [B, L, Ev] are read in
// place through their (batch, row, column) strides; grad_q, grad_k and grad_v are contiguous.
// With s_ij = scale q_i.k_j (masked to -inf when causal and j > i: top-left, as the forward),
// P_ij = exp(s_ij - lse_i) and dP_ij = dO_i.v_j:
// - `attention_backward_rows_<dtype>_n<N>`: one warp per query row i, one pass over its keys
//   with an online softmax (running max m, sum l, sum of P dP, sum of P dP k_j and of P k_j, all
//   rescaled when m grows): lse_i = m + log l, D_i = sum P dP / l and
//   grad_q_i = scale (sum P dP k_j - D_i sum P k_j) / l. A row that sees no key (S = 0) gets a
//   zero grad_q.
// - `attention_backward_keys_<dtype>_n<N>`: one warp per key row j, over the queries that see it
//   (i >= j when causal), recomputing P_ij from lse_i: grad_v_j = sum_i P_ij dO_i and
//   grad_k_j = scale sum_i P_ij (dP_ij - D_i) q_i, accumulated in registers; a key no query sees
//   gets zeros. Each output element has one writer: no atomics, the result is deterministic.
// Each lane holds the head-dim elements lane + 32 t (t < N) of a row, so E and Ev are at most
// 32 N; the two dot products of a (query, key) pair are reduced across the warp together.

// Mirrors `AttnBwdArgs` in src/launch/attention_backward.rs.
struct AttnBwdArgs {
    u64 q;
    u64 k;
    u64 v;
    u64 grad;
    u64 grad_q;
    u64 grad_k;
    u64 grad_v;
    u64 lse;    // [B, L] compute type
    u64 delta;  // [B, L] compute type
    i64 q_s[3];  // batch, row, column strides in elements
    i64 k_s[3];
    i64 v_s[3];
    i64 g_s[3];
    u64 rows;  // B * L
    u64 keys;  // B * S
    f64 scale;
    u32 l;
    u32 s;
    u32 e;
    u32 ev;
    i32 causal;
    i32 pad;
};

__device__ __forceinline__ float ab_exp(float x) { return expf(x); }
__device__ __forceinline__ double ab_exp(double x) { return exp(x); }
__device__ __forceinline__ float ab_log(float x) { return logf(x); }
__device__ __forceinline__ double ab_log(double x) { return log(x); }
__device__ __forceinline__ float ab_neg_inf(float) { return __int_as_float(0xff800000); }
__device__ __forceinline__ double ab_neg_inf(double) { return __longlong_as_double(0xfff0000000000000ull); }

// Both sums over the warp; every lane gets the same (bitwise) results.
template <typename C> __device__ __forceinline__ void ab_warp_sum2(C& a, C& b) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, m);
        b += __shfl_xor_sync(0xffffffffu, b, m);
    }
}

// This lane's elements of a row of `n` elements `stride` apart (zeros past the end).
template <typename T, int N>
__device__ __forceinline__ void ab_load_row(typename Compute<T>::type* dst, const T* row, i64 stride, u32 n,
                                            int lane) {
    typedef typename Compute<T>::type C;
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const u32 d = (u32)lane + 32u * t;
        dst[t] = d < n ? (C)load(row[(i64)d * stride]) : (C)0;
    }
}

// This lane's elements of a contiguous row of `n` elements, rounded once.
template <typename T, int N>
__device__ __forceinline__ void ab_store_row(T* row, const typename Compute<T>::type* src,
                                             typename Compute<T>::type factor, u32 n, int lane) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
        const u32 d = (u32)lane + 32u * t;
        if (d < n) row[d] = store<T>(src[t] * factor);
    }
}

template <typename T, int N> __device__ __forceinline__ void attention_backward_rows(const AttnBwdArgs& a) {
    typedef typename Compute<T>::type C;
    const int lane = threadIdx.x & 31;
    const u64 warps = grid_threads() >> 5;
    const C scale = (C)a.scale;
    for (u64 r = global_thread() >> 5; r < a.rows; r += warps) {
        const u64 b = r / a.l, i = r % a.l;
        C q[N], g[N], pdk[N], pk[N];
        ab_load_row<T, N>(q, (const T*)a.q + (i64)b * a.q_s[0] + (i64)i * a.q_s[1], a.q_s[2], a.e, lane);
        ab_load_row<T, N>(g, (const T*)a.grad + (i64)b * a.g_s[0] + (i64)i * a.g_s[1], a.g_s[2], a.ev, lane);
#pragma unroll
        for (int t = 0; t < N; ++t) pdk[t] = pk[t] = (C)0;
        C m = ab_neg_inf((C)0), l = (C)0, pdp = (C)0;
        const u64 end = a.causal ? min((u64)a.s, i + 1) : (u64)a.s;
        const T* kb = (const T*)a.k + (i64)b * a.k_s[0];
        const T* vb = (const T*)a.v + (i64)b * a.v_s[0];
        for (u64 j = 0; j < end; ++j) {
            C kj[N], vj[N];
            ab_load_row<T, N>(kj, kb + (i64)j * a.k_s[1], a.k_s[2], a.e, lane);
            ab_load_row<T, N>(vj, vb + (i64)j * a.v_s[1], a.v_s[2], a.ev, lane);
            C s = (C)0, dp = (C)0;
#pragma unroll
            for (int t = 0; t < N; ++t) {
                s += q[t] * kj[t];
                dp += g[t] * vj[t];
            }
            ab_warp_sum2(s, dp);
            s *= scale;
            if (s > m) {
                // The first key, or a larger score: rescale what was summed under the old max.
                const C corr = ab_exp(m - s);
                l *= corr;
                pdp *= corr;
#pragma unroll
                for (int t = 0; t < N; ++t) {
                    pdk[t] *= corr;
                    pk[t] *= corr;
                }
                m = s;
            }
            const C p = ab_exp(s - m);
            l += p;
            pdp += p * dp;
#pragma unroll
            for (int t = 0; t < N; ++t) {
                pdk[t] += p * dp * kj[t];
                pk[t] += p * kj[t];
            }
        }
        const bool seen = l > (C)0;
        const C inv = seen ? (C)1 / l : (C)0;
        const C delta = pdp * inv;
        if (lane == 0) {
            ((C*)a.lse)[r] = seen ? m + ab_log(l) : (C)0;
            ((C*)a.delta)[r] = delta;
        }
#pragma unroll
        for (int t = 0; t < N; ++t) pdk[t] -= delta * pk[t];
        ab_store_row<T, N>((T*)a.grad_q + (i64)r * a.e, pdk, scale * inv, a.e, lane);
    }
}

template <typename T, int N> __device__ __forceinline__ void attention_backward_keys(const AttnBwdArgs& a) {
    typedef typename Compute<T>::type C;
    const int lane = threadIdx.x & 31;
    const u64 warps = grid_threads() >> 5;
    const C scale = (C)a.scale;
    const C* lse = (const C*)a.lse;
    const C* delta = (const C*)a.delta;
    for (u64 r = global_thread() >> 5; r < a.keys; r += warps) {
        const u64 b = r / a.s, j = r % a.s;
        C kj[N], vj[N], dk[N], dv[N];
        ab_load_row<T, N>(kj, (const T*)a.k + (i64)b * a.k_s[0] + (i64)j * a.k_s[1], a.k_s[2], a.e, lane);
        ab_load_row<T, N>(vj, (const T*)a.v + (i64)b * a.v_s[0] + (i64)j * a.v_s[1], a.v_s[2], a.ev, lane);
#pragma unroll
        for (int t = 0; t < N; ++t) dk[t] = dv[t] = (C)0;
        const T* qb = (const T*)a.q + (i64)b * a.q_s[0];
        const T* gb = (const T*)a.grad + (i64)b * a.g_s[0];
        const u64 row0 = b * a.l;
        for (u64 i = a.causal ? j : 0; i < a.l; ++i) {
            C q[N], g[N];
            ab_load_row<T, N>(q, qb + (i64)i * a.q_s[1], a.q_s[2], a.e, lane);
            ab_load_row<T, N>(g, gb + (i64)i * a.g_s[1], a.g_s[2], a.ev, lane);
            C s = (C)0, dp = (C)0;
#pragma unroll
            for (int t = 0; t < N; ++t) {
                s += q[t] * kj[t];
                dp += g[t] * vj[t];
            }
            ab_warp_sum2(s, dp);
            const C p = ab_exp(s * scale - lse[row0 + i]);
            const C ds = p * (dp - delta[row0 + i]);
#pragma unroll
            for (int t = 0; t < N; ++t) {
                dv[t] += p * g[t];
                dk[t] += ds * q[t];
            }
        }
        ab_store_row<T, N>((T*)a.grad_k + (i64)r * a.e, dk, scale, a.e, lane);
        ab_store_row<T, N>((T*)a.grad_v + (i64)r * a.ev, dv, (C)1, a.ev, lane);
    }
}

#define ATTENTION_BACKWARD(TN, T, N)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) attention_backward_rows_##TN##_n##N(AttnBwdArgs a) { \
        attention_backward_rows<T, N>(a);                                                                  \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(256) attention_backward_keys_##TN##_n##N(AttnBwdArgs a) { \
        attention_backward_keys<T, N>(a);                                                                  \
    }

#define ATTENTION_BACKWARD_ALL(TN, T) \
    ATTENTION_BACKWARD(TN, T, 1)      \
    ATTENTION_BACKWARD(TN, T, 2)      \
    ATTENTION_BACKWARD(TN, T, 4)      \
    ATTENTION_BACKWARD(TN, T, 8)

ATTENTION_BACKWARD_ALL(f32, float)
ATTENTION_BACKWARD_ALL(f64, double)
ATTENTION_BACKWARD_ALL(f16, f16)
ATTENTION_BACKWARD_ALL(bf16, bf16)
