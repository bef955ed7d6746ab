//! [`DistributedSampler`]: which items of a dataset each rank reads in an epoch.

/// Which indices of a dataset each rank reads in an epoch: PyTorch's `DistributedSampler`.
/// Every rank gets the same number of indices (the dataset is padded by repeating its first
/// indices, or cut with `drop_last`), rank `r` takes every `world_size`-th index from `r`, and
/// with shuffling the order depends on the seed and the epoch, the same on every rank.
///
/// ```
/// use cartage_nn::DistributedSampler;
/// let rank0 = DistributedSampler::new(10, 0, 4).indices(0);
/// let rank3 = DistributedSampler::new(10, 3, 4).indices(0);
/// assert_eq!((rank0.len(), rank3.len()), (3, 3)); // 10 padded to 12
/// assert_ne!(rank0, rank3);
/// ```
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    rank: usize,
    world_size: usize,
    /// Shuffle each epoch (the default).
    pub shuffle: bool,
    /// The shuffle's seed, the same on every rank.
    pub seed: u64,
    /// Drop the tail that does not divide evenly instead of padding.
    pub drop_last: bool,
}

impl DistributedSampler {
    /// The sampler of rank `rank` of `world_size` over a dataset of `len` items (shuffled, seed 0,
    /// padded). A rank outside `0..world_size` gets no indices.
    pub fn new(len: usize, rank: usize, world_size: usize) -> DistributedSampler {
        DistributedSampler {
            len,
            rank,
            world_size: world_size.max(1),
            shuffle: true,
            seed: 0,
            drop_last: false,
        }
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        if self.rank >= self.world_size {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut state = self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for i in (1..order.len()).rev() {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                order.swap(i, (z % (i as u64 + 1)) as usize);
            }
        }
        let per_rank = if self.drop_last {
            self.len / self.world_size
        } else {
            self.len.div_ceil(self.world_size)
        };
        let total = per_rank * self.world_size;
        if total > order.len() && !order.is_empty() {
            let pad: Vec<usize> = order.iter().copied().cycle().take(total - order.len()).collect();
            order.extend(pad);
        }
        order.truncate(total);
        order.into_iter().skip(self.rank).step_by(self.world_size).collect()
    }
}
