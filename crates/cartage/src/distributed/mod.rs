//! Distributed training: a [`ProcessGroup`] of ranks that exchange tensors with collectives
//! (all-reduce, broadcast, all-gather, reduce-scatter, send/recv, barrier), launched the way
//! torchrun launches PyTorch programs.
//!
//! - [`DistEnv`] (`env`): this process's rank, world size and local rank, and where rank 0
//!   listens, from torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//!   `MASTER_PORT`). `Device::pick()` reads `LOCAL_RANK` too, so every rank of a node picks its
//!   own GPU at the program's entry point.
//! - [`Rendezvous`] (`rendezvous`): a small TCP meeting point on `MASTER_ADDR:MASTER_PORT` that
//!   hands rank 0's engine id (the NCCL unique id) to every rank, with a timeout and a typed
//!   error naming the ranks that never arrived.
//! - [`ProcessGroup`]: collectives on tensors, checked (device, contiguity, dtype, shapes), over
//!   any [`Collective`] engine: NCCL on CUDA devices (`cartage-cuda`'s `nccl` feature, joined
//!   through [`ProcessGroup::init`] with its [`CollectiveEngine`]), or
//! - [`InProcessCollective`]: ranks as threads of one process, **for tests only** — not a
//!   distributed engine. On the CPU there is no engine across processes.
//!
//! ```no_run
//! use std::time::Duration;
//! use cartage::distributed::{DistEnv, ProcessGroup, ReduceKind, Rendezvous};
//! use cartage::prelude::*;
//! # fn run(engine: &dyn cartage::distributed::CollectiveEngine) -> cartage::Result<()> {
//! let device = Device::pick()?; // LOCAL_RANK chooses this rank's GPU
//! let env = DistEnv::from_env()?;
//! let group = ProcessGroup::init(&env, &device, engine, Rendezvous::DEFAULT_TIMEOUT)?;
//! let x = Tensor::ones(&[4], DType::F32, &device)?;
//! group.all_reduce(&x, ReduceKind::Sum)?.wait()?; // every element is now the world size
//! # Ok(()) }
//! ```

pub mod env;
mod group;
mod in_process;
pub mod rendezvous;

pub use cartage_core::collective::{CallKind, CollectiveCall};
pub use cartage_core::{Collective, CollectiveArg, CollectiveEngine, CollectiveHandle, ReduceKind};
pub use env::DistEnv;
pub use group::ProcessGroup;
pub use in_process::InProcessCollective;
pub use rendezvous::Rendezvous;
