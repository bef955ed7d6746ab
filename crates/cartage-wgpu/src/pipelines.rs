//! The pipeline cache: WGSL source → compute pipeline, compiled once per (kernel, dtype,
//! specialisation) key and kept for the life of the device.
//!
//! Every cartage kernel has the same interface: binding 0 is a 256-byte uniform block of
//! parameters at a dynamic offset (one slot per op of a batch, see `encoder.rs`), bindings 1..=n
//! are read-write storage buffers. So there is one bind-group layout per storage count, made once.
//! A shader the driver rejects is an [`Error::Driver`] carrying the compiler's message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cartage_core::{Error, Result};

use crate::context::GpuContext;

/// The most storage bindings a cartage kernel uses, but the multi-tensor update (which binds
/// what the adapter allows).
pub(crate) const MAX_STORAGE_BINDINGS: usize = 6;

/// Bytes of one op's parameter block.
pub(crate) const PARAM_BYTES: u64 = 256;

/// Compiled pipelines and the shared layouts.
pub(crate) struct PipelineCache {
    /// Bind-group layouts indexed by storage-binding count (index 0 unused).
    layouts: Vec<wgpu::BindGroupLayout>,
    pipeline_layouts: Vec<wgpu::PipelineLayout>,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    checked: bool,
}

impl PipelineCache {
    /// Layouts for 1..=MAX_STORAGE_BINDINGS storage buffers on `ctx` (more for the
    /// multi-tensor update, up to [`crate::ops::update_many::binding_cap`]).
    pub fn new(ctx: &GpuContext) -> Self {
        let mut layouts = Vec::new();
        let mut pipeline_layouts = Vec::new();
        // The multi-tensor update binds as many buffers as the adapter allows (up to its cap).
        let most = MAX_STORAGE_BINDINGS.max(crate::ops::update_many::binding_cap(&ctx.limits));
        for storage in 0..=most {
            let mut entries = vec![wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: true,
                    min_binding_size: wgpu::BufferSize::new(PARAM_BYTES),
                },
                count: None,
            }];
            for binding in 1..=storage as u32 {
                entries.push(wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
            }
            let layout = ctx.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("cartage kernel bindings"),
                entries: &entries,
            });
            let pipeline_layout = ctx.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("cartage kernel layout"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            layouts.push(layout);
            pipeline_layouts.push(pipeline_layout);
        }
        let checked = std::env::var_os("CARTAGE_WGPU_CHECKED").is_some_and(|v| v != "0");
        PipelineCache {
            layouts,
            pipeline_layouts,
            pipelines: Mutex::default(),
            checked,
        }
    }

    /// The bind-group layout for `storage` storage bindings.
    pub fn layout(&self, storage: usize) -> &wgpu::BindGroupLayout {
        &self.layouts[storage]
    }

    /// The pipeline for `key`, compiling `source()` on first use. `storage` is the number of
    /// storage bindings the shader declares.
    pub fn get(
        &self,
        ctx: &GpuContext,
        key: &str,
        storage: usize,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        self.try_get(ctx, key, storage, || Ok(source()))
    }

    /// [`get`](Self::get) with a source generator that can fail (a template left unfilled).
    pub fn try_get(
        &self,
        ctx: &GpuContext,
        key: &str,
        storage: usize,
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Ok(Arc::clone(p));
        }
        let text = source()?;
        let pipeline = Arc::new(self.compile(ctx, key, storage, &text)?);
        self.pipelines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), Arc::clone(&pipeline));
        Ok(pipeline)
    }

    /// Number of pipelines compiled so far.
    pub fn len(&self) -> usize {
        self.pipelines.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn compile(&self, ctx: &GpuContext, key: &str, storage: usize, text: &str) -> Result<wgpu::ComputePipeline> {
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(text.into()),
        };
        let module = if self.checked {
            ctx.device.create_shader_module(descriptor)
        } else {
            // SAFETY: every cartage shader guards its buffer indices against the element counts
            // it is given (which `Kernel::validate` and the binding windows make consistent)
            // and has loops bounded by uniform counts, or compare-exchange loops (scatter) that
            // end as soon as no other invocation changed the word in between (each retry is
            // another invocation's success), so dropping wgpu's own bounds checks and loop
            // bounding does not allow out-of-bounds access. CARTAGE_WGPU_CHECKED=1 restores them.
            unsafe {
                ctx.device
                    .create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(key),
            layout: Some(&self.pipeline_layouts[storage]),
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        if let Some(error) = pollster::block_on(scope.pop()) {
            tracing::error!(kernel = key, %error, "WGSL kernel rejected:\n{text}");
            return Err(Error::Driver {
                device: ctx.cartage_device,
                op: "compile kernel",
                message: format!("kernel `{key}`: {error}"),
            });
        }
        tracing::debug!(kernel = key, "wgpu pipeline compiled");
        Ok(pipeline)
    }
}
