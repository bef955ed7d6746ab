//! The layers: each owns its parameters as variables registered in a [`crate::Scope`], draws
//! PyTorch's default initialisation from an explicit [`cartage::Generator`], and checks its
//! input's shape with an error naming the layer.

mod attention;
mod conv;
mod dropout;
mod embedding;
mod init;
mod linear;
mod norm;
mod pool;
mod sequential;
mod transformer;

pub use attention::MultiHeadAttention;
pub use conv::Conv2d;
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use init::{normal, uniform};
pub use linear::Linear;
pub use norm::{LayerNorm, RmsNorm};
pub use pool::{AvgPool2d, MaxPool2d};
pub use sequential::{Activation, Sequential};
pub use transformer::{BlockOptions, Recompute, TransformerBlock};

use cartage::{Error, Generator, Result, Tensor};

/// A shape error for `layer`: the input `x` does not have what the layer needs.
pub(crate) fn wrong_input(layer: &'static str, x: &Tensor, needs: String) -> Error {
    Error::ShapeMismatch {
        op: layer,
        lhs: x.shape().to_vec(),
        rhs: Vec::new(),
        reason: format!("the input has shape {:?}; {needs}", x.shape()),
    }
}

/// Check that `x` has at least `rank` dimensions and `size` in its last one.
pub(crate) fn check_last(layer: &'static str, x: &Tensor, rank: usize, size: usize) -> Result<()> {
    if x.rank() < rank || x.shape().last() != Some(&size) {
        return Err(wrong_input(
            layer,
            x,
            format!("it needs at least {rank} dimension(s) with the last of size {size}"),
        ));
    }
    Ok(())
}

/// A generator of its own for a layer built from `rng`: a new seed drawn from `rng`'s stream, so
/// that layers built one after another draw different masks and a seed replays them all.
pub(crate) fn child_generator(rng: &mut Generator) -> Generator {
    let (seed, at) = rng.advance(4);
    Generator::new(seed ^ at.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A [`Dropout`] of probability `p` registered in `scope`'s store, or `None` for `p = 0`; `p`
/// outside `[0, 1)` is refused, naming `layer`.
pub(crate) fn dropout_layer(
    scope: &crate::Scope,
    layer: &'static str,
    p: f64,
    rng: &mut Generator,
) -> Result<Option<Dropout>> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument {
            op: layer,
            reason: format!("the dropout probability is {p}; it must be in [0, 1)"),
        });
    }
    Ok((p > 0.0).then(|| Dropout::new(scope.store(), p, child_generator(rng))))
}
