//! [`Generator`]: a seeded Philox stream that advances with every draw.
//!
//! Every random kernel draws element `i` from Philox4x32-10 at counter `offset + i` under the key
//! `seed` (see `cartage_core::random`). A generator hands out disjoint counter ranges, so two
//! draws from one generator never share values, and replaying a seed replays every draw on every
//! backend. The seed-per-call constructors ([`crate::Tensor::rand`]) start each call at counter 0:
//! two calls with one seed give tensors whose first elements agree (a shared prefix).

/// A seeded random stream, passed explicitly to the `*_with` constructors and to dropout.
///
/// ```
/// use cartage::{DType, Device, Generator, Tensor};
/// let mut rng = Generator::new(7);
/// let a = Tensor::rand_with(&[4], DType::F32, &mut rng, &Device::cpu())?;
/// let b = Tensor::rand_with(&[4], DType::F32, &mut rng, &Device::cpu())?;
/// assert_ne!(a.to_vec::<f32>()?, b.to_vec::<f32>()?); // the stream moved on
/// let mut again = Generator::new(7);
/// let a2 = Tensor::rand_with(&[4], DType::F32, &mut again, &Device::cpu())?;
/// assert_eq!(a.to_vec::<f32>()?, a2.to_vec::<f32>()?); // one seed, one stream
/// # Ok::<(), cartage::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    /// A generator resumed at `offset` of `seed`'s stream (as saved from [`Generator::seed`] and
    /// [`Generator::offset`], e.g. in a checkpoint): it draws what the saved one would have drawn.
    ///
    /// ```
    /// use cartage::{DType, Device, Generator, Tensor};
    /// let mut a = Generator::new(7);
    /// let _ = Tensor::rand_with(&[5], DType::F32, &mut a, &Device::cpu())?;
    /// let mut b = Generator::resume(a.seed(), a.offset());
    /// let (x, y) = (
    ///     Tensor::rand_with(&[3], DType::F32, &mut a, &Device::cpu())?,
    ///     Tensor::rand_with(&[3], DType::F32, &mut b, &Device::cpu())?,
    /// );
    /// assert_eq!(x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    /// # Ok::<(), cartage::Error>(())
    /// ```
    pub fn resume(seed: u64, offset: u64) -> Generator {
        Generator { seed, offset }
    }

    /// A stream keyed by `seed`, starting at counter 0.
    pub fn new(seed: u64) -> Generator {
        Generator { seed, offset: 0 }
    }

    /// The Philox key.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The counter the next draw starts at.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reserve `count` counters: returns `(seed, first counter)` and moves the stream past them
    /// (rounded up to a multiple of 4, a whole Philox block).
    pub fn advance(&mut self, count: u64) -> (u64, u64) {
        let start = self.offset;
        self.offset = self.offset.wrapping_add(count.div_ceil(4).wrapping_mul(4));
        (self.seed, start)
    }
}
