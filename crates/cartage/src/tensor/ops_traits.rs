//! `std::ops` operators on `&Tensor` and scalars, each returning `Result<Tensor>`.
