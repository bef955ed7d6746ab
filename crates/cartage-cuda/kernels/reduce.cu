// reduce.cu: Sum, Mean and LogSumExp (Kernel::Reduce); the machinery is in reduce_common.cuh.

#define REDUCE_FLOAT(TN, T)          \
    REDUCE(sum, TN, T, SumR<T>)      \
    REDUCE(mean, TN, T, MeanR<T>)    \
    REDUCE(logsumexp, TN, T, LseR<T>)

REDUCE_FLOAT(f32, f32)
REDUCE_FLOAT(f64, f64)
REDUCE_FLOAT(f16, f16)
REDUCE_FLOAT(bf16, bf16)
REDUCE(sum, i32, i32, SumR<i32>)
REDUCE(sum, i64, i64, SumR<i64>)
REDUCE(sum, u8, u8, SumR<u8>)
