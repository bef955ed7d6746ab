//! The structural rules of the backward kernels and of the optimizer update, in the same terms
//! as [`crate::validate`]'s: shapes and dtypes agree, outputs are writable and apart from every
//! input, hyperparameters are in range; a multi-tensor update's sets are apart from each other.

use crate::error::{Error, Result};
use crate::kernel::{NormBackwardArgs, NormKind, TensorArg, UpdateSet};
use crate::update_rule::UpdateRule;
use crate::validate::{aligned, apart, dim_in_range, index_dtype, mismatch, same_dtype, same_shape, writable};

/// `SoftmaxBackward`: output, grad and out of one shape and dtype; `out` apart from both.
pub(crate) fn softmax(
    name: &'static str,
    output: &TensorArg,
    grad: &TensorArg,
    dim: usize,
    out: &TensorArg,
) -> Result<()> {
    for arg in [output, grad] {
        same_shape(name, arg, out)?;
        same_dtype(name, arg, out)?;
        aligned(name, arg)?;
        apart(name, arg, out)?;
    }
    float(name, out)?;
    dim_in_range(name, dim, out.layout.rank())?;
    aligned(name, out)?;
    writable(name, out)
}

/// An element-wise backward (`GeluBackward`): input, grad and out of one shape and float dtype;
/// `out` apart from both.
pub(crate) fn elementwise(name: &'static str, input: &TensorArg, grad: &TensorArg, out: &TensorArg) -> Result<()> {
    for arg in [input, grad] {
        same_shape(name, arg, out)?;
        same_dtype(name, arg, out)?;
        aligned(name, arg)?;
        apart(name, arg, out)?;
    }
    float(name, out)?;
    aligned(name, out)?;
    writable(name, out)
}

/// The op name of a `NormBackward` of `kind`, for errors.
pub(crate) const fn norm_name(kind: NormKind) -> &'static str {
    match kind {
        NormKind::Layer => "layer_norm_backward",
        NormKind::Rms => "rms_norm_backward",
    }
}

/// `NormBackward`: input, grad and the input gradient alike; the weight and the optional weight
/// and bias gradients 1-D of the last dim's size and the input's dtype; a bias gradient for
/// layer norm only; every gradient writable, apart from every input and from each other.
pub(crate) fn norm(a: &NormBackwardArgs) -> Result<()> {
    let name = norm_name(a.kind);
    let (input, grad, out) = (&a.input, &a.grad, &a.grad_input);
    let Some(&last) = input.layout.shape().last() else {
        return Err(Error::invalid(
            name,
            "the input needs at least one dimension to normalise",
        ));
    };
    if !(a.eps.is_finite() && a.eps >= 0.0) {
        return Err(Error::invalid(
            name,
            format!("eps must be finite and ≥ 0, got {}", a.eps),
        ));
    }
    if a.kind == NormKind::Rms && a.grad_bias.is_some() {
        return Err(Error::invalid(
            name,
            "RMS norm has no bias, so there is no bias gradient to write; pass none",
        ));
    }
    for arg in [input, grad] {
        same_shape(name, arg, out)?;
        same_dtype(name, arg, out)?;
        aligned(name, arg)?;
    }
    float(name, out)?;
    aligned(name, out)?;
    writable(name, out)?;
    let columns = [
        ("weight", a.weight.as_ref(), false),
        ("weight gradient", a.grad_weight.as_ref(), true),
        ("bias gradient", a.grad_bias.as_ref(), true),
    ];
    for (role, arg, written) in columns {
        let Some(arg) = arg else { continue };
        same_dtype(name, arg, input)?;
        if arg.layout.shape() != [last] {
            return Err(mismatch(
                name,
                input,
                arg,
                format!("the {role} must be 1-D of the last dim's size {last}"),
            ));
        }
        aligned(name, arg)?;
        if written {
            writable(name, arg)?;
        }
    }
    // Every written operand apart from every other operand (reads may share memory).
    let reads = [Some(input), a.weight.as_ref(), Some(grad)];
    let writes = [Some(out), a.grad_weight.as_ref(), a.grad_bias.as_ref()];
    for (i, written) in writes.iter().enumerate() {
        let Some(written) = written else { continue };
        for read in reads.iter().flatten() {
            apart(name, read, written)?;
        }
        for other in writes[i + 1..].iter().flatten() {
            apart(name, other, written)?;
        }
    }
    Ok(())
}

/// `CrossEntropyBackward`: logits and out [N, C], target and grad [N].
pub(crate) fn cross_entropy(
    logits: &TensorArg,
    target: &TensorArg,
    grad: &TensorArg,
    smoothing: f64,
    out: &TensorArg,
) -> Result<()> {
    let name = "cross_entropy_backward";
    index_dtype(name, target)?;
    let (l, t, g) = (logits.layout.shape(), target.layout.shape(), grad.layout.shape());
    if l.len() != 2 || t != [l[0]] || g != [l[0]] {
        return Err(mismatch(
            name,
            logits,
            target,
            format!("logits [N, C] take a target [N] and a per-row gradient [N]; the gradient is {g:?}"),
        ));
    }
    same_shape(name, logits, out)?;
    same_dtype(name, logits, out)?;
    same_dtype(name, grad, out)?;
    float(name, out)?;
    if !(0.0..=1.0).contains(&smoothing) {
        return Err(Error::invalid(
            name,
            format!("label smoothing must lie in [0, 1], got {smoothing}"),
        ));
    }
    for arg in [logits, target, grad] {
        aligned(name, arg)?;
        apart(name, arg, out)?;
    }
    aligned(name, out)?;
    writable(name, out)
}

/// `Update`: every operand contiguous, of the parameter's shape and float dtype; the parameter
/// and the state written, each apart from every other operand; as many state tensors as the
/// rule keeps, in the leading slots.
pub(crate) fn update(
    rule: &UpdateRule,
    grad: &TensorArg,
    state: &[Option<TensorArg>; 2],
    param: &TensorArg,
) -> Result<()> {
    let name = rule.kind().name();
    rule.check()?;
    let wanted = rule.state_count();
    let given = state.iter().take_while(|s| s.is_some()).count();
    if given != wanted || state.iter().filter(|s| s.is_some()).count() != wanted {
        return Err(Error::invalid(
            name,
            format!("the rule keeps {wanted} state tensor(s) in the leading slots, but {given} were given"),
        ));
    }
    float(name, param)?;
    let states: Vec<&TensorArg> = state.iter().flatten().collect();
    for arg in std::iter::once(grad).chain(states.iter().copied()) {
        same_shape(name, arg, param)?;
        same_dtype(name, arg, param)?;
    }
    let all: Vec<&TensorArg> = [param, grad].into_iter().chain(states.iter().copied()).collect();
    for arg in &all {
        aligned(name, arg)?;
        if !arg.layout.is_contiguous() {
            return Err(Error::invalid(
                name,
                format!(
                    "every operand must be contiguous, but one of shape {:?} has strides {:?}",
                    arg.layout.shape(),
                    arg.layout.strides()
                ),
            ));
        }
    }
    for (i, written) in std::iter::once(param).chain(states.iter().copied()).enumerate() {
        writable(name, written)?;
        for (j, other) in all.iter().enumerate() {
            // `all` lists the parameter first, then the gradient, then the state: the written
            // operand `i` sits at index 0 (parameter) or `i + 1` (state).
            let own = if i == 0 { 0 } else { i + 1 };
            if j != own {
                apart(name, other, written)?;
            }
        }
    }
    Ok(())
}

/// `UpdateMany`: at least one set; every set obeys `Update`'s rules; one dtype for all; and no
/// written operand (a parameter or a state) shares a byte with any other operand of any set.
/// The sets run in parallel, so the last rule is what keeps two threads off one element.
pub(crate) fn update_many(rule: &UpdateRule, sets: &[UpdateSet]) -> Result<()> {
    let name = rule.kind().many_name();
    let Some(first) = sets.first() else {
        return Err(Error::invalid(
            name,
            "a multi-tensor update needs at least one set of operands",
        ));
    };
    for set in sets {
        update(rule, &set.grad, &set.state, &set.param)?;
        if set.param.dtype != first.param.dtype {
            return Err(Error::invalid(
                name,
                format!(
                    "every set must share one dtype, but the parameters are {} and {}; \
                     group the parameters by dtype",
                    first.param.dtype, set.param.dtype
                ),
            ));
        }
    }
    sets_apart(name, sets)
}

/// One operand's bytes for the overlap sweep.
struct Region {
    /// The allocator id and segment id: segment ids are unique only within one allocator.
    segment: (u64, u64),
    start: usize,
    end: usize,
    set: usize,
    role: &'static str,
    written: bool,
}

/// Sort every non-empty operand by (segment, first byte) and sweep once: an operand overlaps an
/// earlier one exactly when it starts before the furthest end seen so far in its segment.
/// Two reads may overlap (sets can share a gradient); a write may overlap nothing.
fn sets_apart(name: &'static str, sets: &[UpdateSet]) -> Result<()> {
    let mut regions = Vec::with_capacity(sets.len() * 4);
    for (index, set) in sets.iter().enumerate() {
        let operands = [
            (Some(&set.grad), "gradient", false),
            (set.state[0].as_ref(), "first state", true),
            (set.state[1].as_ref(), "second state", true),
            (Some(&set.param), "parameter", true),
        ];
        for (arg, role, written) in operands {
            let Some(arg) = arg else { continue };
            // Contiguous (checked per set above): the view's bytes are one range.
            let bytes = arg.layout.numel() * arg.dtype.size_in_bytes();
            if bytes == 0 {
                continue;
            }
            let start = arg.byte_offset();
            regions.push(Region {
                segment: (arg.buffer.allocator(), arg.buffer.segment().id),
                start,
                end: start + bytes,
                set: index,
                role,
                written,
            });
        }
    }
    regions.sort_unstable_by_key(|r| (r.segment, r.start));
    // The furthest-reaching region so far in this segment, of any kind and written.
    let mut any: Option<usize> = None;
    let mut written: Option<usize> = None;
    for i in 0..regions.len() {
        let current = &regions[i];
        if i > 0 && regions[i - 1].segment != current.segment {
            (any, written) = (None, None);
        }
        let reach = |slot: Option<usize>| slot.map(|j| (regions[j].end, j));
        let hit = if current.written { reach(any) } else { reach(written) };
        if let Some((end, j)) = hit
            && current.start < end
        {
            return Err(overlapping_sets(name, &regions[j], current));
        }
        if any.is_none_or(|j| regions[j].end < current.end) {
            any = Some(i);
        }
        if current.written && written.is_none_or(|j| regions[j].end < current.end) {
            written = Some(i);
        }
    }
    Ok(())
}

#[cold]
fn overlapping_sets(name: &'static str, a: &Region, b: &Region) -> Error {
    Error::invalid(
        name,
        format!(
            "set {}'s {} (bytes {}..{}) and set {}'s {} (bytes {}..{}) share memory in one segment, \
             and at least one of them is written; the sets are updated in parallel, so each \
             parameter and state must be apart from every other operand (is a parameter listed twice?)",
            a.set, a.role, a.start, a.end, b.set, b.role, b.start, b.end
        ),
    )
}

fn float(name: &'static str, arg: &TensorArg) -> Result<()> {
    if arg.dtype.is_float() {
        Ok(())
    } else {
        Err(Error::WrongDType {
            op: name,
            dtype: arg.dtype,
            expected: "a float dtype",
        })
    }
}
