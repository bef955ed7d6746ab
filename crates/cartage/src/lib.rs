//! cartage: tensors that know where they live.
