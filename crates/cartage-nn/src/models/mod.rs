//! Whole models built from the layers: [`Gpt`].

mod gpt;
mod transformers_gpt2;

pub use gpt::{Gpt, GptConfig};
pub use transformers_gpt2::{gpt2_config_from_json, gpt2_state_dict};
