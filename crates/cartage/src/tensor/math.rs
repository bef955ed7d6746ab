//! Element-wise math beyond the basic ops: rounding, trigonometry, activations, clamps, logical ops.
