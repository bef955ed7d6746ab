// reduce_common.cuh: the reduction machinery shared by reduce.cu, extreme.cu and softmax.cu
// (prepended after common.cuh by src/modules.rs).
//
// The host views the input as rows × cols: a row is one output element (the kept dimensions,
// `rows_shape` with input strides `rows_in` and output strides `rows_out`), a column one reduced
// element (`cols_shape`, `cols_in`). One kernel per `<op>_<dtype>`, `reduce_<op>_<dtype>`, whose
// `group` threads share a row: a block (256) or a warp (32) for long rows — dense rows read with
// 16-byte vector loads — or a single thread (1) for many short rows whose neighbours are adjacent
// in memory (a reduction over a leading dimension: loads coalesce across threads). A long row is
// split over many blocks (`split` > 1) that write partial states; a second launch with `finish`
// set combines them.
// Sum keeps the input dtype (integers wrap); Mean and LogSumExp are float-only; Max/Min propagate
// NaN; ArgMax/ArgMin write i64 and pick the first extreme (NaN counts as the extreme).

struct ReduceGeom {
    u64 rows;
    u64 cols;
    u64 split;
    u64 chunk;
    Shape rows_shape;
    Strides rows_in;
    Strides rows_out;
    Shape cols_shape;
    Strides cols_in;
    i32 group;
    i32 dense;
    i32 finish;
    i32 pad;
};

// ---- reducers: identity, lift one element, combine (associative and commutative), finish ------

template <typename T> struct SumAcc { typedef T type; };
template <> struct SumAcc<f16> { typedef float type; };
template <> struct SumAcc<bf16> { typedef float type; };
template <> struct SumAcc<i32> { typedef u32 type; };
template <> struct SumAcc<i64> { typedef u64 type; };
template <> struct SumAcc<u8> { typedef u32 type; };

template <typename T> struct SumR {
    typedef typename SumAcc<T>::type Acc;
    typedef T Out;
    __device__ static Acc ident() { return (Acc)0; }
    __device__ static Acc lift(T x, u64) { return (Acc)load(x); }
    __device__ static Acc comb(Acc a, Acc b) { return a + b; }
    __device__ static Out fin(Acc a, u64) { return store<T>((typename Compute<T>::type)a); }
};

template <typename T> struct MeanR {
    typedef typename SumAcc<T>::type Acc;
    typedef T Out;
    __device__ static Acc ident() { return (Acc)0; }
    __device__ static Acc lift(T x, u64) { return (Acc)load(x); }
    __device__ static Acc comb(Acc a, Acc b) { return a + b; }
    __device__ static Out fin(Acc a, u64 count) { return store<T>(a / (Acc)count); }
};

// Product: integers wrap (accumulated unsigned, truncated on store); the empty product is 1.
template <typename T> struct ProdR {
    typedef typename SumAcc<T>::type Acc;
    typedef T Out;
    __device__ static Acc ident() { return (Acc)1; }
    __device__ static Acc lift(T x, u64) { return (Acc)load(x); }
    __device__ static Acc comb(Acc a, Acc b) { return a * b; }
    __device__ static Out fin(Acc a, u64) { return store<T>((typename Compute<T>::type)a); }
};

template <typename T> struct ExtAcc { typedef typename Compute<T>::type type; };
template <> struct ExtAcc<u8> { typedef u32 type; };
template <> struct ExtAcc<bool8> { typedef u32 type; };

template <typename A> struct Limits;
template <> struct Limits<float> {
    __device__ static float lowest() { return -__int_as_float(0x7f800000); }
    __device__ static float highest() { return __int_as_float(0x7f800000); }
};
template <> struct Limits<double> {
    __device__ static double lowest() { return -__longlong_as_double(0x7ff0000000000000ll); }
    __device__ static double highest() { return __longlong_as_double(0x7ff0000000000000ll); }
};
template <> struct Limits<i32> {
    __device__ static i32 lowest() { return (i32)0x80000000u; }
    __device__ static i32 highest() { return 0x7fffffff; }
};
template <> struct Limits<i64> {
    __device__ static i64 lowest() { return (i64)0x8000000000000000ull; }
    __device__ static i64 highest() { return 0x7fffffffffffffffll; }
};
template <> struct Limits<u32> {
    __device__ static u32 lowest() { return 0; }
    __device__ static u32 highest() { return 0xffffffffu; }
};

template <typename T, bool MAX> struct ExtR {
    typedef typename ExtAcc<T>::type Acc;
    typedef T Out;
    __device__ static Acc ident() { return MAX ? Limits<Acc>::lowest() : Limits<Acc>::highest(); }
    __device__ static Acc lift(T x, u64) { return (Acc)load(x); }
    __device__ static Acc comb(Acc a, Acc b) {
        if (a != a) return a;
        if (b != b) return b;
        return MAX ? (a > b ? a : b) : (a < b ? a : b);
    }
    __device__ static Out fin(Acc a, u64) { return store<T>((typename Compute<T>::type)a); }
};

template <typename T> struct ArgValue { typedef typename Compute<T>::type type; };
template <> struct ArgValue<i32> { typedef i64 type; };
template <> struct ArgValue<u8> { typedef i64 type; };
template <> struct ArgValue<bool8> { typedef i64 type; };

template <typename V> struct ArgAcc {
    V v;
    i64 i;
};

template <typename T, bool MAX> struct ArgR {
    typedef typename ArgValue<T>::type V;
    typedef ArgAcc<V> Acc;
    typedef i64 Out;
    __device__ static Acc ident() {
        Acc a;
        a.v = MAX ? Limits<V>::lowest() : Limits<V>::highest();
        a.i = 0x7fffffffffffffffll;
        return a;
    }
    __device__ static Acc lift(T x, u64 index) {
        Acc a;
        a.v = (V)load(x);
        a.i = (i64)index;
        return a;
    }
    __device__ static Acc comb(Acc a, Acc b) {
        bool an = a.v != a.v, bn = b.v != b.v;
        if (an || bn) {
            if (an && bn) return a.i <= b.i ? a : b;
            return an ? a : b;
        }
        if (MAX ? a.v > b.v : a.v < b.v) return a;
        if (MAX ? b.v > a.v : b.v < a.v) return b;
        return a.i <= b.i ? a : b;
    }
    __device__ static Out fin(Acc a, u64) { return a.i; }
};

template <typename C> struct LseAcc {
    C m;
    C s;
};
__device__ __forceinline__ float exp_c(float x) { return expf(x); }
__device__ __forceinline__ double exp_c(double x) { return exp(x); }
__device__ __forceinline__ float log_c(float x) { return logf(x); }
__device__ __forceinline__ double log_c(double x) { return log(x); }

// Running (max, sum of exp(x - max)) — the state of logsumexp and of softmax's first pass.
template <typename C> struct Lse {
    typedef LseAcc<C> Acc;
    __device__ static Acc ident() {
        Acc a;
        a.m = Limits<C>::lowest();
        a.s = 0;
        return a;
    }
    __device__ static Acc lift(C x) {
        Acc a;
        a.m = x;
        a.s = 1;
        return a;
    }
    __device__ static Acc comb(Acc a, Acc b) {
        if (a.m != a.m) return a;
        if (b.m != b.m) return b;
        if (a.m == Limits<C>::lowest()) return b;
        if (b.m == Limits<C>::lowest()) return a;
        Acc r;
        if (a.m == b.m) {
            r.m = a.m;
            r.s = a.s + b.s;
        } else if (a.m > b.m) {
            r.m = a.m;
            r.s = a.s + b.s * exp_c(b.m - a.m);
        } else {
            r.m = b.m;
            r.s = b.s + a.s * exp_c(a.m - b.m);
        }
        return r;
    }
    __device__ static C value(Acc a) {
        if (a.m == Limits<C>::lowest() || a.m == Limits<C>::highest() || a.m != a.m) return a.m;
        return a.m + log_c(a.s);
    }
};

template <typename T> struct LseR {
    typedef typename Compute<T>::type C;
    typedef LseAcc<C> Acc;
    typedef T Out;
    __device__ static Acc ident() { return Lse<C>::ident(); }
    __device__ static Acc lift(T x, u64) { return Lse<C>::lift(load(x)); }
    __device__ static Acc comb(Acc a, Acc b) { return Lse<C>::comb(a, b); }
    __device__ static Out fin(Acc a, u64) { return store<T>(Lse<C>::value(a)); }
};

// ---- group reductions --------------------------------------------------------------------------

template <typename A> __device__ __forceinline__ A shfl_down_acc(A a, int offset) {
    const int W = sizeof(A) / 4;
    union {
        A a;
        u32 w[W];
    } u;
    u.a = a;
#pragma unroll
    for (int k = 0; k < W; ++k) u.w[k] = __shfl_down_sync(0xffffffffu, u.w[k], offset);
    return u.a;
}

template <typename A> __device__ __forceinline__ A shfl_acc(A a, int lane) {
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

// Combine `acc` over a group of 32 or THREADS threads; the result is valid in the group's lane 0.
// With a whole block, every thread must call it (it synchronises).
template <typename R> __device__ typename R::Acc group_reduce(typename R::Acc acc, int group) {
    typedef typename R::Acc Acc;
    __shared__ Acc partial[THREADS / 32];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) acc = R::comb(acc, shfl_down_acc(acc, offset));
    if (group == 32) return acc;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < THREADS / 32 ? partial[lane] : R::ident();
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) acc = R::comb(acc, shfl_down_acc(acc, offset));
    }
    __syncthreads();
    return acc;
}

// ---- kernels -----------------------------------------------------------------------------------

// Row-major offset `i` under (shape, strides) held in shared memory, rank 1 without a call.
__device__ __forceinline__ i64 offset_shared(u64 i, const Shape* sh, const Strides* a) {
    if (sh->rank == 1) return (i64)i * a->s[0];
    return offset1_at(i, sh, a);
}

template <typename T, typename R>
__device__ void reduce(const T* in, typename R::Out* out, typename R::Acc* partials, const ReduceGeom& param) {
    typedef typename R::Acc Acc;
    __shared__ ReduceGeom g;
    if (threadIdx.x == 0) g = param;
    __syncthreads();
    const int group = g.group;
    const int lane = threadIdx.x % group;
    const u64 per_block = THREADS / group;
    const u64 units = g.finish ? g.rows : g.rows * g.split;
    for (u64 unit = blockIdx.x * per_block + threadIdx.x / group; unit < units; unit += gridDim.x * per_block) {
        Acc acc = R::ident();
        bool final_state = g.split == 1 || g.finish;
        u64 row, part = 0;
        if (g.finish) {
            row = unit;
            for (u64 p = lane; p < g.split; p += group) acc = R::comb(acc, partials[row * g.split + p]);
        } else {
            // One thread per output (group 1, a reduction over a strided dim): neighbouring
            // threads take neighbouring outputs of the same chunk, so their loads coalesce.
            // Otherwise a group's units walk one output's chunks in turn.
            if (group == 1) {
                part = unit / g.rows;
                row = unit - part * g.rows;
            } else {
                row = unit / g.split;
                part = unit - row * g.split;
            }
            u64 c0 = part * g.chunk;
            u64 c1 = c0 + g.chunk < g.cols ? c0 + g.chunk : g.cols;
            i64 base = offset_shared(row, &g.rows_shape, &g.rows_in);
            if (g.dense) {
                const T* p = in + base;
                const int N = Lanes<T>::n;
                u64 vcount = 0;
                if ((((u64)(p + c0)) & 15) == 0 && c1 > c0) vcount = (c1 - c0) / N;
                const Pack<T, N>* vp = (const Pack<T, N>*)(p + c0);
                u64 v = lane;
                // All loads first, so U × 16 bytes per thread are in flight at once (4-byte and
                // 8-byte types only: the narrow ones would multiply the code NVRTC compiles).
                const int U = N <= 4 ? UNROLL : 1;
#pragma unroll 1
                for (; v + (U - 1) * group < vcount; v += U * group) {
                    Pack<T, N> pk[U];
#pragma unroll
                    for (int u = 0; u < U; ++u) pk[u] = vp[v + u * group];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
#pragma unroll
                        for (int k = 0; k < N; ++k) acc = R::comb(acc, R::lift(pk[u].v[k], c0 + (v + u * group) * N + k));
                    }
                }
#pragma unroll 1
                for (; v < vcount; v += group) {
                    Pack<T, N> pk = vp[v];
#pragma unroll
                    for (int k = 0; k < N; ++k) acc = R::comb(acc, R::lift(pk.v[k], c0 + v * N + k));
                }
                for (u64 c = c0 + vcount * N + lane; c < c1; c += group) acc = R::comb(acc, R::lift(p[c], c));
            } else if (g.cols_shape.rank == 1) {
                i64 s = g.cols_in.s[0];
                for (u64 c = c0 + lane; c < c1; c += group) acc = R::comb(acc, R::lift(in[base + (i64)c * s], c));
            } else {
                for (u64 c = c0 + lane; c < c1; c += group) {
                    acc = R::comb(acc, R::lift(in[base + offset_shared(c, &g.cols_shape, &g.cols_in)], c));
                }
            }
        }
        if (group > 1) acc = group_reduce<R>(acc, group);
        if (lane == 0) {
            if (final_state) {
                out[offset_shared(row, &g.rows_shape, &g.rows_out)] = R::fin(acc, g.cols);
            } else {
                partials[row * g.split + part] = acc;
            }
        }
    }
}

#define REDUCE(NAME, TN, T, R)                                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                           \
        reduce_##NAME##_##TN(const T* in, R::Out* out, R::Acc* partials, ReduceGeom g) {                            \
        reduce<T, R>(in, out, partials, g);                                                                         \
    }

template <typename T> using MaxR = ExtR<T, true>;
template <typename T> using MinR = ExtR<T, false>;
template <typename T> using ArgMaxR = ArgR<T, true>;
template <typename T> using ArgMinR = ArgR<T, false>;

