//! Joining and reshaping: cat, stack, split, chunk, expand, repeat, select, flip, roll, tril/triu, pad.
