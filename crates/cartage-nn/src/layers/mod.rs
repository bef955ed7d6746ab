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
pub use transformer::TransformerBlock;

use cartage::{Error, Result, Tensor};

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
