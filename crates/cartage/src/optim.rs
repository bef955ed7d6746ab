//! Multi-tensor optimizer steps: [`adam_step_many`] and [`sgd_step_many`] update many parameters
//! and their state in place with one rule, as one `Kernel::UpdateMany` where the device lists it
//! (one pass on the CPU, a launch per group of sets on CUDA), else one fused `Kernel::Update`
//! per parameter, else the same formulas composed from element-wise ops. Every parameter gets
//! exactly the result [`Tensor::adam_step_`] or [`Tensor::sgd_step_`] would give it alone.
//!
//! The parameters of one call share a device and a dtype (an optimizer groups them), and no
//! parameter or state may share memory with any other slot's tensors: the slots run in
//! parallel. Both are typed errors, raised before anything is written.

use std::ops::AddAssign;

use cartage_core::kernel::UpdateSet;
use cartage_core::{AdamUpdate, Error, Kernel, Op, Result, SgdUpdate, Site, UpdateRule};

use crate::Tensor;

/// One parameter of an [`adam_step_many`]: the parameter, its gradient and its moments, all of
/// the parameter's shape.
#[derive(Clone, Copy, Debug)]
pub struct AdamSlot<'a> {
    /// The parameter, updated in place.
    pub param: &'a Tensor,
    /// Its gradient (any float dtype; cast to the parameter's when it differs).
    pub grad: &'a Tensor,
    /// The first moment, updated in place.
    pub exp_avg: &'a Tensor,
    /// The second moment, updated in place.
    pub exp_avg_sq: &'a Tensor,
}

/// One parameter of an [`sgd_step_many`].
#[derive(Clone, Copy, Debug)]
pub struct SgdSlot<'a> {
    /// The parameter, updated in place.
    pub param: &'a Tensor,
    /// Its gradient (any float dtype; cast to the parameter's when it differs).
    pub grad: &'a Tensor,
    /// The momentum buffer: present exactly when the rule has momentum.
    pub momentum_buffer: Option<&'a Tensor>,
}

/// How a multi-tensor step ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Multi-tensor kernels (`Kernel::UpdateMany`) launched, each covering many parameters.
    pub multi_tensor_kernels: usize,
    /// Parameters updated by a fused kernel of their own (`Kernel::Update`).
    pub fused_updates: usize,
    /// Parameters updated with composed element-wise ops.
    pub composed_updates: usize,
}

impl AddAssign for StepReport {
    fn add_assign(&mut self, other: StepReport) {
        self.multi_tensor_kernels += other.multi_tensor_kernels;
        self.fused_updates += other.fused_updates;
        self.composed_updates += other.composed_updates;
    }
}

/// One Adam or AdamW step ([`AdamUpdate`]) on every slot at once.
///
/// ```
/// use cartage::optim::{AdamSlot, adam_step_many};
/// use cartage::{AdamUpdate, Device, Tensor};
/// let cpu = Device::cpu();
/// let (w, b) = (Tensor::new([1.0f32, -1.0], &cpu)?, Tensor::new([0.5f32], &cpu)?);
/// let (gw, gb) = (Tensor::new([0.5f32, -0.5], &cpu)?, Tensor::new([2.0f32], &cpu)?);
/// let (mw, vw, mb, vb) = (w.zeros_like()?, w.zeros_like()?, b.zeros_like()?, b.zeros_like()?);
/// let rule = AdamUpdate { lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0,
///                         decoupled: true, step: 1 };
/// let slots = [
///     AdamSlot { param: &w, grad: &gw, exp_avg: &mw, exp_avg_sq: &vw },
///     AdamSlot { param: &b, grad: &gb, exp_avg: &mb, exp_avg_sq: &vb },
/// ];
/// let report = adam_step_many(rule, &slots)?;
/// assert_eq!(report.multi_tensor_kernels, 1); // the CPU runs both in one kernel
/// // The first step moves each weight by lr against its gradient's sign.
/// assert!((b.to_vec::<f32>()?[0] - 0.4).abs() < 1e-6);
/// # Ok::<(), cartage::Error>(())
/// ```
#[track_caller]
pub fn adam_step_many(rule: AdamUpdate, slots: &[AdamSlot<'_>]) -> Result<StepReport> {
    let update = UpdateRule::Adam(rule);
    for s in slots {
        s.param.check_update(&update, s.grad, &[s.exp_avg, s.exp_avg_sq])?;
    }
    let sets: Vec<Operands<'_>> = slots
        .iter()
        .map(|s| Operands {
            param: s.param,
            grad: s.grad,
            state: [Some(s.exp_avg), Some(s.exp_avg_sq)],
        })
        .collect();
    let site = std::panic::Location::caller();
    step_many(update, &sets, site, |s| {
        s.param.adam_step_checked(
            s.grad,
            s.state[0].unwrap_or(s.param),
            s.state[1].unwrap_or(s.param),
            rule,
        )
    })
}

/// One SGD step ([`SgdUpdate`]) on every slot at once; `rule.first_step` applies to all of
/// them (an optimizer groups parameters whose buffer is new apart from the others).
///
/// ```
/// use cartage::optim::{SgdSlot, sgd_step_many};
/// use cartage::{Device, SgdUpdate, Tensor};
/// let cpu = Device::cpu();
/// let (w, b) = (Tensor::new([1.0f32, 2.0], &cpu)?, Tensor::new([3.0f32], &cpu)?);
/// let (gw, gb) = (Tensor::new([1.0f32, -1.0], &cpu)?, Tensor::new([2.0f32], &cpu)?);
/// let rule = SgdUpdate { lr: 0.5, momentum: 0.0, dampening: 0.0, weight_decay: 0.0,
///                        nesterov: false, first_step: false };
/// let slots = [
///     SgdSlot { param: &w, grad: &gw, momentum_buffer: None },
///     SgdSlot { param: &b, grad: &gb, momentum_buffer: None },
/// ];
/// sgd_step_many(rule, &slots)?;
/// assert_eq!((w.to_vec::<f32>()?, b.to_vec::<f32>()?), (vec![0.5, 2.5], vec![2.0]));
/// # Ok::<(), cartage::Error>(())
/// ```
#[track_caller]
pub fn sgd_step_many(rule: SgdUpdate, slots: &[SgdSlot<'_>]) -> Result<StepReport> {
    for s in slots {
        s.param.check_sgd(s.grad, s.momentum_buffer, rule)?;
    }
    let sets: Vec<Operands<'_>> = slots
        .iter()
        .map(|s| Operands {
            param: s.param,
            grad: s.grad,
            state: [s.momentum_buffer, None],
        })
        .collect();
    let site = std::panic::Location::caller();
    step_many(UpdateRule::Sgd(rule), &sets, site, |s| {
        s.param.sgd_step_checked(s.grad, s.state[0], rule)
    })
}

/// One slot, whatever the rule.
struct Operands<'a> {
    param: &'a Tensor,
    grad: &'a Tensor,
    state: [Option<&'a Tensor>; 2],
}

impl Operands<'_> {
    fn tensors(&self) -> impl Iterator<Item = (&Tensor, &'static str, bool)> {
        [
            (Some(self.param), "parameter", true),
            (Some(self.grad), "gradient", false),
            (self.state[0], "first state", true),
            (self.state[1], "second state", true),
        ]
        .into_iter()
        .filter_map(|(t, role, written)| t.map(|t| (t, role, written)))
    }
}

/// The checked slots: one group, apart, then the fastest path the device has. `single` runs one
/// slot alone (`true` when it was fused).
fn step_many(
    rule: UpdateRule,
    sets: &[Operands<'_>],
    site: Site,
    single: impl Fn(&Operands<'_>) -> Result<bool>,
) -> Result<StepReport> {
    let name = rule.kind().many_name();
    let report = step_many_unversioned(rule, sets, single)?;
    // Every written operand changed: autograd refuses a backward through one saved before.
    for s in sets {
        for (t, _, written) in s.tensors() {
            if written {
                t.bump_version(name, site);
            }
        }
    }
    Ok(report)
}

/// [`step_many`] without counting the writes.
fn step_many_unversioned(
    rule: UpdateRule,
    sets: &[Operands<'_>],
    single: impl Fn(&Operands<'_>) -> Result<bool>,
) -> Result<StepReport> {
    let name = rule.kind().many_name();
    let mut report = StepReport::default();
    let Some(first) = sets.first() else {
        return Ok(report);
    };
    for s in &sets[1..] {
        first.param.check_same_group(name, s.param)?;
    }
    apart(name, sets)?;
    let (dtype, backend) = (first.param.dtype(), first.param.backend());
    let multi = backend.capabilities().supports(Op::UpdateMany(rule.kind()), dtype);
    let mut fused: Vec<(&Operands<'_>, Tensor)> = Vec::new();
    let mut alone: Vec<&Operands<'_>> = Vec::new();
    for s in sets.iter().filter(|s| s.param.numel() > 0) {
        match multi.then(|| s.param.fusable_grad(s.grad, s.state)).transpose()? {
            Some(Some(grad)) => fused.push((s, grad)),
            _ => alone.push(s),
        }
    }
    if !fused.is_empty() {
        let kernel = Kernel::UpdateMany {
            rule,
            sets: fused
                .iter()
                .map(|(s, grad)| UpdateSet {
                    grad: grad.as_arg(),
                    state: s.state.map(|t| t.map(Tensor::as_arg)),
                    param: s.param.as_arg(),
                })
                .collect(),
        };
        let mut owners: Vec<&Tensor> = Vec::with_capacity(fused.len() * 4);
        for (s, grad) in &fused {
            owners.extend([s.param, grad]);
            owners.extend(s.state.iter().flatten().copied());
        }
        Tensor::run_on(&kernel, &owners)?;
        report.multi_tensor_kernels += 1;
    }
    for s in alone {
        if single(s)? {
            report.fused_updates += 1;
        } else {
            report.composed_updates += 1;
        }
    }
    Ok(report)
}

/// One tensor's bytes for the overlap sweep.
struct Region {
    storage: usize,
    start: usize,
    end: usize,
    slot: usize,
    role: &'static str,
    written: bool,
}

/// Refuse a parameter or state that shares bytes with another slot's tensors (a parameter listed
/// twice, a state passed for two parameters): sorted by storage and first byte, each region is
/// compared with the earlier ones still open.
fn apart(name: &'static str, sets: &[Operands<'_>]) -> Result<()> {
    let mut regions: Vec<Region> = Vec::with_capacity(sets.len() * 4);
    for (slot, s) in sets.iter().enumerate() {
        for (t, role, written) in s.tensors() {
            let (storage, start, end) = t.storage_span();
            if start < end {
                regions.push(Region {
                    storage,
                    start,
                    end,
                    slot,
                    role,
                    written,
                });
            }
        }
    }
    regions.sort_unstable_by_key(|r| (r.storage, r.start));
    let mut open: Vec<usize> = Vec::new();
    for (i, r) in regions.iter().enumerate() {
        open.retain(|&j| regions[j].storage == r.storage && regions[j].end > r.start);
        if let Some(&j) = open
            .iter()
            .find(|&&j| regions[j].slot != r.slot && (regions[j].written || r.written))
        {
            let o = &regions[j];
            return Err(Error::invalid(
                name,
                format!(
                    "slot {}'s {} and slot {}'s {} share memory, and the step writes one of them; \
                     each parameter and its state may appear in one slot only (is a parameter listed twice?)",
                    o.slot, o.role, r.slot, r.role
                ),
            ));
        }
        open.push(i);
    }
    Ok(())
}
