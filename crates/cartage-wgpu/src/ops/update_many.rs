//! `Kernel::UpdateMany`: one optimizer step over many parameters in as few dispatches as the
//! adapter's binding limits allow (`shaders/update_many.wgsl`).
//!
//! Each parameter, gradient and state lives in its own buffer, and a dispatch binds a fixed
//! number of storage buffers, so the sets are grouped: a group takes sets in order while their
//! operands' binding windows (operands of one segment share one) fit
//! [`WgpuBackend::update_many_bindings`] less one binding for the table. One dispatch per
//! group reads a table of eight words per set (first workgroup, length, element offsets, the
//! binding of each operand) from a device buffer the backend keeps for it; every set starts on
//! a whole workgroup, and each invocation finds its set by a binary search. The per-element code
//! and the constants are the single update's ([`super::update`]), so every element gets the
//! bits `Update` gives its set alone.
//!
//! A set whose operand does not fit one storage binding, or that needs more bindings or
//! workgroups than one dispatch has, runs through the single update (which chunks).

use cartage_core::kernel::UpdateSet;
use cartage_core::{DType, Error, Result, UpdateRule};

use crate::backend::WgpuBackend;
use crate::bindings::{BindGroupCache, Bound, Window, align_up, bind_operand};
use crate::context::GpuContext;
use crate::encoder::ParamBlock;
use crate::memory::SegmentTable;
use crate::ops::geometry::{WORKGROUP, grid, word};
use crate::ops::update::{self, Path, SLOTS, Variant};
use crate::wgsl;

const MANY: &str = include_str!("../../shaders/update_many.wgsl");

/// Words of one set's row in the table.
const ROW: usize = 8;

/// The most storage bindings (operands and the table) one dispatch uses, whatever the adapter
/// allows: the shader picks an operand's binding with a `switch`, so more cost more code.
pub(crate) const MAX_BINDINGS: usize = 32;

/// The most workgroups of one dispatch: its invocation indices stay below 2³¹, so the grid's
/// last row (which may overshoot) never wraps a 32-bit index.
const MAX_WORKGROUPS: u64 = 1 << 23;

/// The storage bindings one dispatch may use under `limits` (at least 2: one operand buffer and
/// the table).
pub(crate) fn binding_cap(limits: &wgpu::Limits) -> usize {
    let per_stage = limits.max_storage_buffers_per_shader_stage as usize;
    let per_group = (limits.max_bindings_per_bind_group as usize).saturating_sub(1);
    per_stage.min(per_group).clamp(2, MAX_BINDINGS)
}

/// The device buffer the tables are written to, registered in the segment table so that a
/// dispatch binds it like an allocation; it grows when a step needs more rows. Callers hold its
/// lock from the table's upload until the dispatches reading it are recorded.
#[derive(Default)]
pub(crate) struct TableBuffer {
    buffer: Option<(wgpu::Buffer, u64)>,
}

impl TableBuffer {
    /// The buffer and its segment id, at least `bytes` long.
    fn reserve(
        &mut self,
        ctx: &GpuContext,
        table: &SegmentTable,
        bind_groups: &BindGroupCache,
        bytes: u64,
    ) -> (wgpu::Buffer, u64) {
        if let Some((buffer, id)) = &self.buffer
            && buffer.size() >= bytes
        {
            return (buffer.clone(), *id);
        }
        if let Some((_, old)) = self.buffer.take() {
            bind_groups.forget_segment(old);
            table.remove(old);
        }
        let size = align_up(bytes.max(4096).next_power_of_two(), 256);
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("cartage update-many tables"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let id = table.insert(buffer.clone());
        self.buffer = Some((buffer.clone(), id));
        (buffer, id)
    }
}

/// One set's row before the path is known: its length, and per operand (parameter, gradient,
/// first and second state) the element offset in its window and the window's binding.
struct Row {
    numel: usize,
    offsets: [u64; 4],
    bindings: [u8; 4],
}

/// The sets of one dispatch and the windows they bind, in binding order.
#[derive(Default)]
struct Group {
    windows: Vec<Window>,
    rows: Vec<Row>,
    /// Workgroups with one element per invocation (an upper bound for every path).
    workgroups: u64,
}

impl Group {
    /// The windows of `bound` this group does not bind yet.
    fn missing(&self, bound: &[Bound]) -> Vec<Window> {
        let mut new: Vec<Window> = Vec::new();
        for b in bound {
            if !self.windows.contains(&b.window) && !new.contains(&b.window) {
                new.push(b.window);
            }
        }
        new
    }

    /// Add a set of `numel` elements whose present operands are `bound` (parameter, gradient,
    /// states), binding the windows it adds.
    fn add(&mut self, bound: &[Bound], numel: usize) {
        let mut row = Row {
            numel,
            offsets: [0; 4],
            bindings: [0; 4],
        };
        for (k, b) in bound.iter().enumerate() {
            let at = match self.windows.iter().position(|w| *w == b.window) {
                Some(at) => at,
                None => {
                    self.windows.push(b.window);
                    self.windows.len() - 1
                }
            };
            row.offsets[k] = b.element_offset;
            // At most MAX_BINDINGS windows.
            row.bindings[k] = at as u8;
        }
        self.rows.push(row);
        self.workgroups += (numel as u64).div_ceil(WORKGROUP);
    }
}

/// One step of `rule` over every set, in place.
pub(crate) fn update_many(backend: &WgpuBackend, rule: &UpdateRule, sets: &[UpdateSet]) -> Result<()> {
    let name = rule.kind().many_name();
    let Some(first) = sets.first() else {
        return Ok(());
    };
    let dtype = first.param.dtype;
    let operand_cap = backend.update_many_bindings() - 1;
    let max_dim = u64::from(backend.ctx.limits.max_compute_workgroups_per_dimension);
    let max_workgroups = MAX_WORKGROUPS.min(max_dim * max_dim);
    let mut groups: Vec<Group> = Vec::new();
    let mut group = Group::default();
    for set in sets {
        let numel = set.param.layout.numel();
        if numel == 0 {
            continue;
        }
        let operands = [
            Some(&set.param),
            Some(&set.grad),
            set.state[0].as_ref(),
            set.state[1].as_ref(),
        ];
        let bound: Result<Vec<Bound>> = operands
            .into_iter()
            .flatten()
            .map(|a| bind_operand(&backend.ctx, &backend.table, a, name, None))
            .collect();
        let bound = match bound {
            Ok(bound) => bound,
            Err(Error::Unsupported { .. }) => {
                update::update(backend, rule, &set.grad, &set.state, &set.param)?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let workgroups = (numel as u64).div_ceil(WORKGROUP);
        if Group::default().missing(&bound).len() > operand_cap || workgroups > max_workgroups {
            update::update(backend, rule, &set.grad, &set.state, &set.param)?;
            continue;
        }
        let full = group.windows.len() + group.missing(&bound).len() > operand_cap
            || group.workgroups + workgroups > max_workgroups;
        if full {
            groups.push(std::mem::take(&mut group));
        }
        group.add(&bound, numel);
    }
    if !group.rows.is_empty() {
        groups.push(group);
    }
    if groups.is_empty() {
        return Ok(());
    }
    let native_f16 = dtype == DType::F16 && backend.native_f16();
    let states = rule.state_count();
    // Each group's rows, at offsets a binding may start at.
    let alignment = backend.ctx.binding_alignment();
    let mut words: Vec<u32> = Vec::new();
    let mut plans = Vec::with_capacity(groups.len());
    for group in &groups {
        let path = path(dtype, native_f16, group, 2 + states);
        let start = align_up(words.len() as u64 * 4, alignment) as usize / 4;
        words.resize(start, 0);
        let mut first_workgroup = 0u64;
        for row in &group.rows {
            let count = match path {
                Path::Pairs => row.numel.div_ceil(2),
                _ => row.numel,
            };
            words.push(word(first_workgroup as usize, "update-many workgroup")?);
            words.push(word(row.numel, "element count")?);
            for &o in &row.offsets {
                words.push(word(o as usize, "element offset")?);
            }
            words.push(u32::from_le_bytes(row.bindings));
            words.push(0);
            first_workgroup += (count as u64).div_ceil(WORKGROUP);
        }
        plans.push((path, start, first_workgroup));
    }
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    let mut tables = backend.many_table.lock().unwrap_or_else(|p| p.into_inner());
    let (buffer, segment) = tables.reserve(&backend.ctx, &backend.table, &backend.bind_groups, bytes.len() as u64);
    // The previous step's dispatches read the buffer: they are submitted before the upload,
    // which the queue runs before the next submission.
    backend.flush();
    backend.ctx.queue.write_buffer(&buffer, 0, bytes);
    for (group, &(path, start, workgroups)) in groups.iter().zip(&plans) {
        let table = Window {
            segment,
            offset: start as u64 * 4,
            size: align_up((group.rows.len() * ROW * 4) as u64, 16),
        };
        let variant = Variant {
            rule: *rule,
            dtype,
            states,
            native_f16,
            path,
        };
        dispatch(backend, &variant, group, table, workgroups)?;
    }
    drop(tables);
    tracing::trace!(
        op = name,
        sets = sets.len(),
        dispatches = groups.len(),
        "multi-tensor update"
    );
    Ok(())
}

/// How the group's elements map to invocations (as the single update picks it; every path gives
/// the same bits).
fn path(dtype: DType, native_f16: bool, group: &Group, operands: usize) -> Path {
    if !wgsl::packed(dtype) || native_f16 {
        Path::Element
    } else if group
        .rows
        .iter()
        .all(|r| r.offsets[..operands].iter().all(|o| o % 2 == 0))
    {
        Path::Pairs
    } else {
        Path::Atomic
    }
}

/// One dispatch over `workgroups` workgroups of the group's sets.
fn dispatch(backend: &WgpuBackend, v: &Variant, group: &Group, table: Window, workgroups: u64) -> Result<()> {
    let mut params = ParamBlock::default();
    let invocations = workgroups * WORKGROUP;
    params.put_sizes(0, &[invocations as usize, group.rows.len()], "update-many size")?;
    params.put(2, &[update::flags(&v.rule), 0]);
    update::put_coefficients(&mut params, &v.rule, v.dtype);
    let n = group.windows.len();
    let key = format!(
        "{}|{}|{}|{}|{n}{}",
        v.rule.kind().many_name(),
        v.dtype,
        v.states,
        v.path.tag(),
        if v.native_f16 { "|f16" } else { "" }
    );
    let pipeline = backend.pipelines.try_get(&backend.ctx, &key, n + 1, || source(v, n))?;
    let mut windows = group.windows.clone();
    windows.push(table);
    let groups = grid(
        invocations,
        WORKGROUP,
        backend.ctx.limits.max_compute_workgroups_per_dimension,
    );
    backend.record(&pipeline, &windows, &params, groups)
}

/// The kernel for `v` with `bindings` operand bindings (b1 ..) and the table after them.
fn source(v: &Variant, bindings: usize) -> Result<String> {
    let t = wgsl::compute_type(v.dtype);
    let mut declarations = String::new();
    let mut accessors = update::codec(v);
    for k in 1..=bindings {
        let buf = format!("b{k}");
        declarations.push_str(&wgsl::binding(k as u32, &buf, update::element_type(v)));
        accessors.push_str(&match v.path {
            Path::Pairs => update::pair_accessors(&buf, &buf, true),
            _ => update::element_accessors(v, &buf, &buf, true),
        });
    }
    for (k, slot) in SLOTS.iter().enumerate() {
        accessors.push_str(&slot_accessors(v, slot, k, bindings));
    }
    let single = wgsl::Pieces::parse("shaders/update.wgsl", update::UPDATE);
    let rule = single.fill(update::rule_piece(v), &[("T", t)])?;
    let pieces = wgsl::Pieces::parse("shaders/update_many.wgsl", MANY);
    let main = pieces.fill(
        if v.path == Path::Pairs {
            "main_pairs"
        } else {
            "main_element"
        },
        &[],
    )?;
    let table = (bindings + 1).to_string();
    pieces.fill_head(&[
        ("ENABLE", if v.native_f16 { "enable f16;" } else { "" }),
        ("PRELUDE", &wgsl::prelude(v.dtype == DType::F64)),
        ("T", t),
        ("BINDINGS", &declarations),
        ("TABLE", &table),
        ("ACCESSORS", &accessors),
        ("RULE", &rule),
        ("MAIN", &main),
    ])
}

/// `ld_SLOT`/`st_SLOT` (or `ld2_SLOT`/`st2_SLOT` on the pairs path) for operand `k` of the
/// set: a switch over the binding the table names (`S_bind[k]`), or zeros where the rule keeps
/// no such state.
fn slot_accessors(v: &Variant, slot: &str, k: usize, bindings: usize) -> String {
    let t = wgsl::compute_type(v.dtype);
    let lane = ["x", "y", "z", "w"][k];
    let present = k < 2 + v.states;
    let cases = |call: &dyn Fn(usize) -> String| {
        let mut s = String::new();
        for b in 1..=bindings {
            if b == bindings {
                s.push_str(&format!("        default: {{ {} }}\n", call(b)));
            } else {
                s.push_str(&format!("        case {}u: {{ {} }}\n", b - 1, call(b)));
            }
        }
        s
    };
    match (v.path, present) {
        (Path::Pairs, true) => format!(
            "fn ld2_{slot}(w: u32) -> vec2<f32> {{\n    var v: vec2<f32>;\n    switch S_bind.{lane} {{\n{}    }}\n    return v;\n}}\n\
             fn st2_{slot}(w: u32, a: f32, b: f32, both: bool) {{\n    switch S_bind.{lane} {{\n{}    }}\n}}\n",
            cases(&|b| format!("v = ld2_b{b}(w);")),
            cases(&|b| format!("st2_b{b}(w, a, b, both);")),
        ),
        (Path::Pairs, false) => format!(
            "fn ld2_{slot}(w: u32) -> vec2<f32> {{ return vec2<f32>(); }}\n\
             fn st2_{slot}(w: u32, a: f32, b: f32, both: bool) {{}}\n"
        ),
        (_, true) => format!(
            "fn ld_{slot}(e: u32) -> {t} {{\n    var v: {t};\n    switch S_bind.{lane} {{\n{}    }}\n    return v;\n}}\n\
             fn st_{slot}(e: u32, v: {t}) {{\n    switch S_bind.{lane} {{\n{}    }}\n}}\n",
            cases(&|b| format!("v = ld_b{b}(e);")),
            cases(&|b| format!("st_b{b}(e, v);")),
        ),
        (_, false) => {
            let zero = if v.dtype == DType::F64 { "0.0lf" } else { "0.0" };
            format!("fn ld_{slot}(e: u32) -> {t} {{ return {zero}; }}\nfn st_{slot}(e: u32, v: {t}) {{}}\n")
        }
    }
}
