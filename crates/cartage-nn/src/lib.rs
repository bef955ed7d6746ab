//! cartage-nn: modules, optimizers and training loops on cartage tensors.
//!
//! Built on the frontend alone (no backend crate): whatever device the tensors live on, the
//! same code trains there.
//!
//! - [`ParamStore`]: owns the named parameters ([`cartage::Var`]s). [`ParamStore::to`] moves
//!   every parameter in place, so modules and optimizers, which hold the variables (shared
//!   cells) and their ids, never see a stale parameter (LESSONS R13).
//! - [`Module`] and the layers in [`layers`]: `Linear`, `Embedding`, `LayerNorm`, `RmsNorm`,
//!   `Dropout`, `Conv2d`, pooling, `MultiHeadAttention`, `TransformerBlock`, `Sequential`, with
//!   PyTorch's default initialisations drawn from an explicit [`cartage::Generator`].
//! - [`save_checkpoint`]/[`load_checkpoint`]: parameters, optimizer, scaler and generators in one
//!   safetensors file; resuming on the same device continues bit for bit.
//! - [`GradScaler`]: dynamic loss scaling for f16 training under `cartage::autocast`.
//! - [`optim`]: SGD (momentum, Nesterov, weight decay), Adam and AdamW, learning-rate
//!   schedules and `clip_grad_norm`. An optimizer keeps its state by variable id and takes the
//!   store at each step; its state follows the parameters to their device and dtype.
//!
//! ```
//! use cartage::prelude::*;
//! use cartage_nn::{Module, ParamStore, layers::Linear, optim::{AdamW, Optimizer}};
//!
//! # fn main() -> cartage::Result<()> {
//! let device = Device::cpu();
//! let store = ParamStore::new(&device);
//! let mut rng = Generator::new(0);
//! let layer = Linear::new(&store.root().sub("fc"), 4, 2, true, &mut rng)?;
//! let mut opt = AdamW::new(&store, 1e-2)?;
//! let x = Tensor::randn(&[8, 4], DType::F32, 1, &device)?;
//! let loss = layer.forward(&x)?.square()?.mean_all()?;
//! loss.backward()?;
//! opt.step(&store)?;
//! store.zero_grad();
//! # Ok(())
//! # }
//! ```

mod amp;
mod checkpoint;
pub mod ddp;
pub mod layers;
pub mod models;
mod module;
pub mod optim;
mod state_dict;
mod store;

pub use amp::{GradScaler, ScalerState};
pub use checkpoint::{LoadOptions, load_checkpoint, load_checkpoint_with, save_checkpoint};
pub use ddp::{DataParallel, DistributedSampler};
pub use module::Module;
pub use optim::StateDiff;
pub use state_dict::StateDict;
pub use store::{ParamStore, Scope, SharedGenerator, StoreId};
