//! Transfer cases: host↔device copies from pageable and pinned memory (R9), a batch moved field by
//! field or packed (R4), and a pipeline with and without prefetching (R10).

use std::sync::Arc;

use cartage::bench::{Bench, Measurement};
use cartage::loader::PrefetchLoader;
use cartage::{DType, Device, Result, StagingBuffer, Tensor};

use super::super::cases::PipelineMode;

/// Host values for `bytes` bytes of f32.
fn host_values(bytes: usize) -> Vec<f32> {
    (0..bytes / 4).map(|i| (i % 251) as f32 * 0.5).collect()
}

/// Staging memory for `device` (pinned where its driver can lock memory) holding `values`.
fn pinned_with(device: &Device, values: &[f32]) -> Result<StagingBuffer> {
    let mut pinned = cartage::alloc_staging(device, values.len() * 4)?;
    fill(&mut pinned, values);
    Ok(pinned)
}

/// Copy `values` into the start of `pinned` (what a data loader does for each batch).
fn fill(pinned: &mut StagingBuffer, values: &[f32]) {
    let bytes: &[u8] = bytemuck::cast_slice(values);
    pinned.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
}

/// Host → device: a new tensor from ordinary memory, or an asynchronous copy from pinned memory.
pub fn host_to_device(bytes: usize, pinned: bool, device: &Device, bench: &Bench) -> Result<Measurement> {
    let values = host_values(bytes);
    let len = values.len();
    if pinned {
        let source = pinned_with(device, &values)?;
        let target = Tensor::empty(&[len], DType::F32, device)?;
        bench.run_on(device, || target.copy_from_pinned_async(&source)?.wait())
    } else {
        bench.run_on(device, || Tensor::from_slice(&values, &[len], device).map(drop))
    }
}

/// Device → host: `to_vec` into ordinary memory, or an asynchronous copy into pinned memory.
pub fn device_to_host(bytes: usize, pinned: bool, device: &Device, bench: &Bench) -> Result<Measurement> {
    let values = host_values(bytes);
    let source = Tensor::from_slice(&values, &[values.len()], device)?;
    if pinned {
        let mut target = cartage::alloc_staging(device, bytes)?;
        bench.run_on(device, || source.copy_to_pinned_async(&mut target)?.wait())
    } else {
        bench.run_on(device, || source.to_vec::<f32>().map(drop))
    }
}

/// `fields` host tensors moved one by one, or packed into one buffer, moved once and split into
/// views on the device.
pub fn move_batch(
    fields: usize,
    field_bytes: usize,
    packed: bool,
    device: &Device,
    bench: &Bench,
) -> Result<Measurement> {
    let field_len = field_bytes / 4;
    let host: Vec<Vec<f32>> = (0..fields).map(|_| host_values(field_bytes)).collect();
    if packed {
        let mut staging: Vec<f32> = Vec::with_capacity(fields * field_len);
        bench.run_on(device, || {
            staging.clear();
            for field in &host {
                staging.extend_from_slice(field);
            }
            let batch = Tensor::from_slice(&staging, &[fields, field_len], device)?;
            let views = (0..fields).map(|i| batch.narrow(0, i, 1)).collect::<Result<Vec<_>>>()?;
            drop(views);
            Ok(())
        })
    } else {
        bench.run_on(device, || {
            let moved = host
                .iter()
                .map(|field| Tensor::from_slice(field, &[field_len], device))
                .collect::<Result<Vec<_>>>()?;
            drop(moved);
            Ok(())
        })
    }
}

/// `batches` steps of fill → copy → matmul: serial, with the next copy overlapping this compute,
/// or fed by cartage's `PrefetchLoader`.
pub fn pipeline(
    batches: usize,
    batch_bytes: usize,
    cols: usize,
    mode: PipelineMode,
    device: &Device,
    bench: &Bench,
) -> Result<Measurement> {
    let cols = cols.max(1);
    let rows = batch_bytes / 4 / cols;
    let values = host_values(rows * cols * 4);
    let weight = super::random(&[cols, cols], DType::F32, 5, device)?;
    let mut pinned = [pinned_with(device, &values)?, pinned_with(device, &values)?];
    let batch = [
        Tensor::empty(&[rows, cols], DType::F32, device)?,
        Tensor::empty(&[rows, cols], DType::F32, device)?,
    ];
    match mode {
        PipelineMode::CopyOnly => bench.run_on(device, || {
            for _ in 0..batches {
                fill(&mut pinned[0], &values);
                batch[0].copy_from_pinned_async(&pinned[0])?.wait()?;
            }
            Ok(())
        }),
        PipelineMode::ComputeOnly => bench.run_on(device, || {
            for _ in 0..batches {
                drop(batch[0].matmul(&weight)?);
            }
            Ok(())
        }),
        PipelineMode::Serial => bench.run_on(device, || {
            for _ in 0..batches {
                fill(&mut pinned[0], &values);
                batch[0].copy_from_pinned_async(&pinned[0])?.wait()?;
                drop(batch[0].matmul(&weight)?);
                cartage::synchronize(device)?;
            }
            Ok(())
        }),
        PipelineMode::Loader => {
            // Each batch is written on the host straight into the loader's staging buffer (one
            // copy of its bytes, as `fill` is for the other modes).
            let values: Arc<[f32]> = Arc::from(values.as_slice());
            bench.run_on(device, || {
                let values = Arc::clone(&values);
                let loader = PrefetchLoader::from_fn(&[rows, cols], DType::F32, batches, device, move |_, bytes| {
                    bytes.copy_from_slice(bytemuck::cast_slice(&values));
                    Ok(())
                })?;
                for batch in loader {
                    drop(batch?.matmul(&weight)?);
                }
                Ok(())
            })
        }
        PipelineMode::Prefetch => bench.run_on(device, || {
            fill(&mut pinned[0], &values);
            batch[0].copy_from_pinned_async(&pinned[0])?.wait()?;
            for step in 0..batches {
                let (current, next) = (step % 2, (step + 1) % 2);
                // The previous step's compute read `batch[next]`: it must end before the copy
                // below overwrites it. This step's copy has already completed.
                cartage::synchronize(device)?;
                let output = batch[current].matmul(&weight)?;
                if step + 1 < batches {
                    // Host work and the next copy overlap this step's compute on the device.
                    fill(&mut pinned[next], &values);
                    batch[next].copy_from_pinned_async(&pinned[next])?.wait()?;
                }
                drop(output);
            }
            Ok(())
        }),
    }
}
