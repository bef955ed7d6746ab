//! Slicing with ranges, steps and single indices in one call.
