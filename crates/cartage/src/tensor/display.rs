//! `Display` of a tensor's values, PyTorch-style, with truncation.
