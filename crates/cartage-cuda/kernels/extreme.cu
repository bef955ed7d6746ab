// extreme.cu: Max, Min, ArgMax and ArgMin (Kernel::Reduce); the machinery is in
// reduce_common.cuh.

#define REDUCE_ORDERED(TN, T)         \
    REDUCE(max, TN, T, MaxR<T>)       \
    REDUCE(min, TN, T, MinR<T>)       \
    REDUCE(argmax, TN, T, ArgMaxR<T>) \
    REDUCE(argmin, TN, T, ArgMinR<T>)
REDUCE_ORDERED(f32, f32)
REDUCE_ORDERED(f64, f64)
REDUCE_ORDERED(f16, f16)
REDUCE_ORDERED(bf16, bf16)
REDUCE_ORDERED(i32, i32)
REDUCE_ORDERED(i64, i64)
REDUCE_ORDERED(u8, u8)
REDUCE_ORDERED(bool, bool8)
