//! Writes at indices: masked_fill, scatter, scatter_add, index_add, one_hot, nonzero, embedding.
