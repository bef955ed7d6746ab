//! Reductions and scans beyond sum/mean/max/min: prod, var/std, norm, any/all, cumsum/cumprod, sort, topk.
