//! Whole models built from the layers: [`Gpt`].

mod gpt;

pub use gpt::{Gpt, GptConfig};
