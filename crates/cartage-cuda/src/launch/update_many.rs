//! The multi-tensor optimizer step ([`cartage_core::Kernel::UpdateMany`]), as PyTorch's
//! `multi_tensor_apply` does it: the sets are cut into chunks of [`MANY_CHUNK`] elements, and a
//! [`ManyTable`] passed by value (kernel parameters, under 4 KiB) gives each block of a launch
//! its set and chunk. One launch takes up to [`MANY_SETS`] sets and [`MANY_BLOCKS`] blocks; a
//! step needs as many launches as its tables (a set may continue from one table into the next).
//! A set whose operands are all 16-byte aligned runs in 16-byte vectors. The per-element code
//! and the constants are the single update's (`update.cu`, [`super::update`]).

use cartage_core::kernel::UpdateSet;
use cartage_core::raw::BufferSlice;
use cartage_core::{DType, Error, Result, UpdateKind, UpdateRule};
use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::update::{AdamArgs, SgdArgs};
use super::{device_ptr, launch_kernel};
use crate::backend::CudaBackend;
use crate::modules::{KernelName, LoadedKernel, SourceFile};

/// Sets per launch (`MANY_SETS` in update.cu).
const MANY_SETS: usize = 48;
/// Blocks per launch (`MANY_BLOCKS`).
const MANY_BLOCKS: usize = 320;
/// Elements per block (`MANY_CHUNK`), a multiple of every dtype's vector lanes.
const MANY_CHUNK: u64 = 65536;
/// Threads per block (`MANY_THREADS`).
const MANY_THREADS: u32 = 512;

/// `struct ManyTable` of update.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ManyTable {
    param: [u64; MANY_SETS],
    grad: [u64; MANY_SETS],
    first: [u64; MANY_SETS],
    second: [u64; MANY_SETS],
    n: [u64; MANY_SETS],
    chunk: [u32; MANY_BLOCKS],
    set: [u8; MANY_BLOCKS],
    vector: [u8; MANY_SETS],
}

// SAFETY: plain `repr(C)` data with the layout of the C struct the kernels declare.
unsafe impl DeviceRepr for ManyTable {}

impl ManyTable {
    const EMPTY: ManyTable = ManyTable {
        param: [0; MANY_SETS],
        grad: [0; MANY_SETS],
        first: [0; MANY_SETS],
        second: [0; MANY_SETS],
        n: [0; MANY_SETS],
        chunk: [0; MANY_BLOCKS],
        set: [0; MANY_BLOCKS],
        vector: [0; MANY_SETS],
    };
}

/// `<sgd|adam>_update_many_<dtype>`.
fn kernel_name(kind: UpdateKind, dtype: DType) -> KernelName {
    KernelName::new(SourceFile::Update, [kind.name(), "many", dtype.name(), ""])
}

/// A set's device addresses: parameter, gradient, first and second state (0 when absent).
#[derive(Clone, Copy, Debug)]
struct SetAddresses([u64; 4]);

impl SetAddresses {
    fn of(set: &UpdateSet) -> Self {
        let state = |k: usize| set.state[k].as_ref().map_or(0, device_ptr);
        SetAddresses([device_ptr(&set.param), device_ptr(&set.grad), state(0), state(1)])
    }
}

/// The tables of one step: which blocks of which launch take which chunk of which set.
struct Tables {
    done: Vec<(ManyTable, usize)>,
    table: ManyTable,
    sets: usize,
    blocks: usize,
}

impl Tables {
    /// Cut the sets, given as (addresses, elements), into tables; empty sets take no block.
    fn build(sets: impl Iterator<Item = (SetAddresses, u64)>) -> Result<Vec<(ManyTable, usize)>> {
        let mut t = Tables {
            done: Vec::new(),
            table: ManyTable::EMPTY,
            sets: 0,
            blocks: 0,
        };
        for (set, n) in sets {
            let chunks = u32::try_from(n.div_ceil(MANY_CHUNK)).map_err(|_| {
                Error::invalid(
                    "update_many",
                    format!("a set of {n} elements has more chunks than a u32 counts; split the parameter"),
                )
            })?;
            let mut chunk = 0;
            while chunk < chunks {
                if t.sets == MANY_SETS || t.blocks == MANY_BLOCKS {
                    t.flush();
                }
                let slot = t.add(&set, n);
                while chunk < chunks && t.blocks < MANY_BLOCKS {
                    t.table.chunk[t.blocks] = chunk;
                    t.table.set[t.blocks] = slot;
                    t.blocks += 1;
                    chunk += 1;
                }
            }
        }
        t.flush();
        Ok(t.done)
    }

    /// Enter `set` in the current table; its slot.
    fn add(&mut self, set: &SetAddresses, n: u64) -> u8 {
        let i = self.sets;
        let [param, grad, first, second] = set.0;
        self.table.param[i] = param;
        self.table.grad[i] = grad;
        self.table.first[i] = first;
        self.table.second[i] = second;
        self.table.n[i] = n;
        // Absent states are 0, which is aligned too.
        self.table.vector[i] = u8::from(set.0.iter().all(|a| a.is_multiple_of(16)));
        self.sets += 1;
        i as u8
    }

    fn flush(&mut self) {
        if self.blocks > 0 {
            self.done.push((self.table, self.blocks));
        }
        (self.table, self.sets, self.blocks) = (ManyTable::EMPTY, 0, 0);
    }
}

/// One optimizer step over every set, in as few launches as the tables need.
pub(super) fn update_many(backend: &CudaBackend, rule: &UpdateRule, sets: &[UpdateSet]) -> Result<()> {
    let Some(first) = sets.first() else {
        return Ok(());
    };
    let dtype = first.param.dtype;
    let tables = Tables::build(
        sets.iter()
            .map(|s| (SetAddresses::of(s), s.param.layout.numel() as u64)),
    )?;
    if tables.is_empty() {
        return Ok(());
    }
    let kernel = backend.modules.kernel(kernel_name(rule.kind(), dtype))?;
    let slices: Vec<BufferSlice> = sets
        .iter()
        .flat_map(|s| [Some(&s.param), Some(&s.grad), s.state[0].as_ref(), s.state[1].as_ref()])
        .flatten()
        .map(|a| a.buffer)
        .collect();
    let wide = dtype == DType::F64;
    for (table, blocks) in &tables {
        let cfg = LaunchConfig {
            grid_dim: (*blocks as u32, 1, 1),
            block_dim: (MANY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch_one(backend, &kernel, cfg, &slices, rule, table, wide)?;
    }
    Ok(())
}

/// Launch one table with the rule's constants in the compute type.
fn launch_one(
    backend: &CudaBackend,
    kernel: &LoadedKernel,
    cfg: LaunchConfig,
    slices: &[BufferSlice],
    rule: &UpdateRule,
    table: &ManyTable,
    wide: bool,
) -> Result<()> {
    match rule {
        UpdateRule::Adam(adam) => {
            let c = adam.coefficients();
            if wide {
                let args = AdamArgs::<f64>::new(&c, 0, 0);
                launch_kernel!(backend, *kernel, cfg, slices, table, &args)
            } else {
                let args = AdamArgs::<f32>::new(&c, 0, 0);
                launch_kernel!(backend, *kernel, cfg, slices, table, &args)
            }
        }
        UpdateRule::Sgd(sgd) => {
            let c = sgd.coefficients();
            if wide {
                let args = SgdArgs::<f64>::new(&c, 0, 0);
                launch_kernel!(backend, *kernel, cfg, slices, table, &args)
            } else {
                let args = SgdArgs::<f32>::new(&c, 0, 0);
                launch_kernel!(backend, *kernel, cfg, slices, table, &args)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::update::DTYPES;

    #[test]
    fn every_rule_and_dtype_is_built_with_the_table_layout() {
        // Five arrays of 48 addresses/sizes, 320 chunk indices, 320 set slots, 48 flags.
        assert_eq!(size_of::<ManyTable>(), 5 * 48 * 8 + 320 * 4 + 320 + 48);
        for kind in UpdateKind::ALL {
            for dtype in DTYPES {
                let name = kernel_name(kind, dtype);
                let args = match (kind, dtype) {
                    (UpdateKind::Adam, DType::F64) => size_of::<AdamArgs<f64>>(),
                    (UpdateKind::Adam, _) => size_of::<AdamArgs<f32>>(),
                    (UpdateKind::Sgd, DType::F64) => size_of::<SgdArgs<f64>>(),
                    (UpdateKind::Sgd, _) => size_of::<SgdArgs<f32>>(),
                };
                let params = super::super::ptx_param_bytes(name.file, &name.symbol());
                assert_eq!(params, [size_of::<ManyTable>(), args], "{}", name.symbol());
                // The parameters stay within the 4 KiB every driver accepts.
                assert!(params.iter().sum::<usize>() <= 4096);
            }
        }
        assert_eq!(MANY_CHUNK % 16, 0, "chunks start on a vector of every dtype");
    }

    #[test]
    fn tables_cover_every_chunk_once_within_the_launch_limits() {
        // 130 small sets (some empty), one set of 700 chunks and a misaligned one.
        let mut sizes: Vec<u64> = (0..130u64).map(|i| (i * 37) % 301).collect();
        sizes.insert(60, 700 * MANY_CHUNK - 5);
        sizes.push(3 * MANY_CHUNK);
        let addresses = |i: usize| {
            SetAddresses([
                (i as u64 + 1) << 20,
                (i as u64 + 1) << 21,
                0,
                if i == 131 { 8 } else { 0 },
            ])
        };
        let tables = Tables::build(sizes.iter().enumerate().map(|(i, &n)| (addresses(i), n))).unwrap();
        let mut seen: Vec<Vec<u32>> = vec![Vec::new(); sizes.len()];
        for (table, blocks) in &tables {
            assert!((1..=MANY_BLOCKS).contains(blocks));
            for b in 0..*blocks {
                let slot = table.set[b] as usize;
                assert!(slot < MANY_SETS && table.n[slot] > 0);
                let set = (table.param[slot] >> 20) as usize - 1;
                assert_eq!(table.n[slot], sizes[set]);
                assert_eq!(table.vector[slot], u8::from(set != 131), "set {set}");
                seen[set].push(table.chunk[b]);
            }
        }
        for (set, chunks) in seen.iter().enumerate() {
            let want: Vec<u32> = (0..sizes[set].div_ceil(MANY_CHUNK) as u32).collect();
            assert_eq!(chunks, &want, "set {set}");
        }
        // 700 chunks need three launches; the 130 small sets three more at 48 sets each.
        assert!(tables.len() >= 4 && tables.len() <= 7, "{} launches", tables.len());
    }
}
