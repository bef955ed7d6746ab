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
