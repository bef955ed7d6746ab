//! `Kernel::UpdateMany`: one optimizer step over many parameters in one pass. Every set is cut
//! into pieces of at most [`PIECE`] elements, and the pieces of all sets together go to rayon
//! in one parallel loop (on this thread below [`PARALLEL_MIN_ELEMENTS`] in all). Each piece runs
//! the very per-element code of `Kernel::Update` ([`crate::update`]), so every element gets the
//! bits a single update would give it.

use cartage_core::kernel::UpdateSet;
use cartage_core::{Device, Error, Result, UpdateRule};
use rayon::prelude::*;

use crate::dispatch::with_float;
use crate::fast_math::simd;
use crate::strided::{CHUNK_MIN_ELEMENTS, PARALLEL_MIN_ELEMENTS};
use crate::update::{Pointers, adam_chunk, missing_state, sgd_chunk};

/// The most elements one rayon task updates.
const PIECE: usize = CHUNK_MIN_ELEMENTS;

/// One piece of work: a set and an element range of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    set: usize,
    start: usize,
    end: usize,
}

/// `Kernel::UpdateMany` (validated: every set contiguous, of one float dtype, its written
/// operands apart from every other operand of every set).
pub fn update_many(rule: &UpdateRule, sets: &[UpdateSet]) -> Result<()> {
    let Some(first) = sets.first() else {
        return Ok(());
    };
    let name = rule.kind().many_name();
    let pieces = pieces(sets.iter().map(|s| s.param.layout.numel()), PIECE);
    let total: usize = sets.iter().map(|s| s.param.layout.numel()).sum();
    with_float!(first.param.dtype, T => {
        let ptrs: Vec<Pointers<T>> = sets.iter().map(Pointers::of).collect();
        match rule {
            UpdateRule::Adam(adam) => {
                let c = adam.coefficients();
                let moments: Vec<_> = ptrs.iter().map(|p| p.first.zip(p.second)).collect::<Option<_>>()
                    .ok_or_else(|| missing_state(name))?;
                // SAFETY: launch validated the kernel: each set's operands are contiguous with
                // the piece's range inside them, its parameter and state writable and apart from
                // every other operand of every set; pieces are disjoint ranges of their sets.
                run(total, &pieces, |p| unsafe {
                    let (m, v) = moments[p.set];
                    adam_chunk::<T>(&c, &ptrs[p.set], m, v, p.start, p.end)
                });
            }
            UpdateRule::Sgd(sgd) => {
                let c = sgd.coefficients();
                if c.momentum != 0.0 && ptrs.iter().any(|p| p.first.is_none()) {
                    return Err(missing_state(name));
                }
                // SAFETY: as above.
                run(total, &pieces, |p| unsafe { sgd_chunk::<T>(&c, &ptrs[p.set], p.start, p.end) });
            }
        }
        Ok(())
    }, else Err(Error::unsupported(name, first.param.dtype, Device::cpu(), "optimizer updates are defined for floats")))
}

/// The sets of `sizes` cut into pieces of at most `piece` elements, in order; empty sets give
/// none.
fn pieces(sizes: impl Iterator<Item = usize>, piece: usize) -> Vec<Piece> {
    let mut out = Vec::new();
    for (set, n) in sizes.enumerate() {
        out.extend((0..n).step_by(piece).map(|start| Piece {
            set,
            start,
            end: (start + piece).min(n),
        }));
    }
    out
}

/// Run `body` on every piece: one parallel loop, or this thread for little work.
fn run(total: usize, pieces: &[Piece], body: impl Fn(Piece) + Sync) {
    let each = |p: &Piece| {
        simd(
            #[inline(always)]
            || body(*p),
        )
    };
    if total < PARALLEL_MIN_ELEMENTS || rayon::current_num_threads() <= 1 {
        pieces.iter().for_each(each);
    } else {
        pieces.par_iter().for_each(each);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_every_set_once_in_bounded_ranges() {
        let sizes = [5usize, 0, 8, 9, 1];
        let got = pieces(sizes.iter().copied(), 4);
        for (set, &n) in sizes.iter().enumerate() {
            let mut covered = 0;
            for p in got.iter().filter(|p| p.set == set) {
                assert_eq!(p.start, covered, "set {set}: pieces in order, no gap");
                assert!(p.end > p.start && p.end - p.start <= 4);
                covered = p.end;
            }
            assert_eq!(covered, n, "set {set}");
        }
        assert_eq!(got.len(), 2 + 2 + 3 + 1);
    }
}
