//! `UpdateMany`, the multi-tensor optimizer step (an optional kernel): where the backend lists
//! `Op::UpdateMany(kind)` for a dtype, every rule of [`super::update`] runs over many sets at
//! once — of 0, 1, 4, 5, 7, 33, 1000 and 12288 elements, some packed back to back (one element
//! apart, at odd offsets) in one buffer per operand, the others each in its own buffers — and
//! each set is compared, parameter and state, with the f64 formulas; the elements between
//! packed sets must stay untouched. One long set (700 001 elements) among small ones and 130
//! small sets cover backends that split the work into several launches. Every other dtype must
//! be refused with `Unsupported`.
//!
//! Then the rules of the kernel itself: no set at all, a parameter listed twice, a parameter
//! that is another set's gradient, a parameter that straddles another set's state, sets of two
//! dtypes and a set that breaks `Update`'s rules are refused before anything is written, while
//! two sets sharing one gradient (a read) are accepted.

use crate::dtype::DType;
use crate::error::ErrorKind;
use crate::kernel::{Kernel, Op, UpdateSet};
use crate::layout::Layout;
use crate::update_rule::{UpdateKind, UpdateRule};

use super::DeviceBuffer;
use super::Spec;
use super::harness::Harness;
use super::update::{Expected, rules};

/// Set sizes: empty, one element, odd, a vector's worth, several blocks.
const SIZES: [usize; 8] = [1, 7, 0, 1000, 33, 3 * 4096, 5, 4];

/// Every rule × dtype the backend lists; the refusals.
pub fn update_many(h: &Harness) {
    for kind in UpdateKind::ALL {
        for dtype in DType::ALL {
            let kind_rules: Vec<UpdateRule> = rules().into_iter().filter(|r| r.kind() == kind).collect();
            if !h.supports(Op::UpdateMany(kind), dtype) {
                let pack = Pack::new(h, dtype, &[3], 0);
                let kernel = pack.kernel(kind_rules[0]);
                h.expect_unsupported(&format!("{} {dtype}", kind.many_name()), &kernel);
                continue;
            }
            for (i, &rule) in kind_rules.iter().enumerate() {
                mixed_case(h, dtype, rule);
                if i == 0 {
                    let long: Vec<usize> = vec![3, 700_001, 1, 17];
                    packed_case(h, dtype, rule, &long, "one long set");
                    let many: Vec<usize> = (0..130).map(|i| (i * 37) % 301).collect();
                    packed_case(h, dtype, rule, &many, "130 sets");
                }
            }
        }
    }
    refusals(h);
}

/// The sets of `SIZES` packed in one buffer per operand, interleaved with the same sizes each
/// in buffers of its own, in one kernel.
fn mixed_case(h: &Harness, dtype: DType, rule: UpdateRule) {
    let packed = Pack::new(h, dtype, &SIZES, 1);
    let alone: Vec<Pack> = SIZES.iter().map(|&n| Pack::new(h, dtype, &[n], 0)).collect();
    let mut sets = Vec::new();
    for (i, own) in alone.iter().enumerate() {
        sets.push(packed.set(rule, i));
        sets.push(own.set(rule, 0));
    }
    let what = format!("{} {rule:?} {dtype} sizes {SIZES:?}", rule.kind().many_name());
    if !h.launch(&what, &Kernel::UpdateMany { rule, sets }) {
        return;
    }
    packed.check(h, &format!("{what}, packed"), rule);
    for (own, n) in alone.iter().zip(SIZES) {
        own.check(h, &format!("{what}, alone {n}"), rule);
    }
}

/// The sets of `sizes`, packed, in one kernel.
fn packed_case(h: &Harness, dtype: DType, rule: UpdateRule, sizes: &[usize], label: &str) {
    let pack = Pack::new(h, dtype, sizes, 1);
    let what = format!("{} {rule:?} {dtype} {label}", rule.kind().many_name());
    if h.launch(&what, &pack.kernel(rule)) {
        pack.check(h, &what, rule);
    }
}

/// One buffer per operand role (parameter, gradient, first and second state) holding sets back
/// to back, `gap` elements apart, the first at element `gap`.
struct Pack {
    dtype: DType,
    /// Parameter, gradient, first state, second state.
    bufs: [DeviceBuffer; 4],
    /// Their values before the update.
    values: [Vec<f64>; 4],
    /// Each set's first element and length.
    sets: Vec<(usize, usize)>,
}

impl Pack {
    fn new(h: &Harness, dtype: DType, sizes: &[usize], gap: usize) -> Pack {
        let mut sets = Vec::with_capacity(sizes.len());
        let mut at = gap;
        for &n in sizes {
            sets.push((at, n));
            at += n + gap;
        }
        // At least one element, so that every buffer is a real allocation.
        let len = at.max(1);
        let specs = [
            Spec::standard(),
            Spec::standard(),
            Spec::standard(),
            Spec::new((0.0, 4.0), (0, 0)),
        ];
        let values = specs.map(|spec| h.random_values(dtype, len, spec));
        let bufs = [0, 1, 2, 3].map(|i| h.upload(dtype, &values[i]));
        Pack {
            dtype,
            bufs,
            values,
            sets,
        }
    }

    /// The operands of set `i` for `rule`.
    fn set(&self, rule: UpdateRule, i: usize) -> UpdateSet {
        let (start, n) = self.sets[i];
        let layout = Layout::from_parts(&[n], &[1], start).expect("a valid 1-D layout");
        let mut state = [None, None];
        for (slot, buf) in state.iter_mut().zip(&self.bufs[2..]).take(rule.state_count()) {
            *slot = Some(buf.arg(&layout));
        }
        UpdateSet {
            grad: self.bufs[1].arg(&layout),
            state,
            param: self.bufs[0].arg(&layout),
        }
    }

    /// Every set of the pack in one kernel.
    fn kernel(&self, rule: UpdateRule) -> Kernel {
        let sets = (0..self.sets.len()).map(|i| self.set(rule, i)).collect();
        Kernel::UpdateMany { rule, sets }
    }

    /// The parameter and the state the rule keeps, whole buffers: the f64 reference inside the
    /// sets, the old values (exactly) between them.
    fn check(&self, h: &Harness, what: &str, rule: UpdateRule) {
        let [p, g, s1, s2] = &self.values;
        let mut e = Expected::of(rule, self.dtype, p, g, s1, s2);
        let mut inside = vec![false; p.len()];
        for &(start, n) in &self.sets {
            inside[start..start + n].fill(true);
        }
        for i in (0..inside.len()).filter(|&i| !inside[i]) {
            (e.param[i], e.first[i], e.second[i]) = (p[i], s1[i], s2[i]);
            (e.allow_param[i], e.allow_first[i], e.allow_second[i]) = (0.0, 0.0, 0.0);
        }
        let layout = Layout::contiguous(&[p.len()]).expect("a small shape");
        let checks = [
            ("param", &self.bufs[0], &e.param, &e.allow_param),
            ("first state", &self.bufs[2], &e.first, &e.allow_first),
            ("second state", &self.bufs[3], &e.second, &e.allow_second),
        ];
        for (role, buf, want, allow) in checks.into_iter().take(1 + rule.state_count()) {
            h.check_with(&format!("{what}: {role}"), buf, &layout, want, |i, _| allow[i]);
        }
    }
}

/// Malformed multi-tensor updates are refused before anything is written; sets that only share
/// what they read are accepted.
fn refusals(h: &Harness) {
    let Some(dtype) = [DType::F32, DType::F64, DType::F16, DType::BF16]
        .into_iter()
        .find(|&d| h.supports(Op::UpdateMany(UpdateKind::Adam), d))
    else {
        return;
    };
    let rule = rules()[0];
    let a = Pack::new(h, dtype, &[8, 8], 0);
    let b = Pack::new(h, dtype, &[8], 0);
    let with = |set: UpdateSet, f: &dyn Fn(&mut UpdateSet)| {
        let mut set = set;
        f(&mut set);
        set
    };
    let straddle = Layout::from_parts(&[8], &[1], 3).expect("a valid layout");
    let second = Layout::from_parts(&[8], &[1], 8).expect("a valid layout");
    let other_dtype = [DType::F32, DType::F64]
        .into_iter()
        .find(|&d| d != dtype && h.supports(Op::UpdateMany(UpdateKind::Adam), d));
    let mut bad: Vec<(&str, Vec<UpdateSet>, ErrorKind)> = vec![
        ("no set", vec![], ErrorKind::InvalidArgument),
        (
            "one parameter listed twice",
            vec![
                a.set(rule, 0),
                with(b.set(rule, 0), &|s| s.param = a.set(rule, 0).param),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "a parameter that is another set's gradient",
            vec![a.set(rule, 0), with(b.set(rule, 0), &|s| s.param = a.set(rule, 0).grad)],
            ErrorKind::InvalidArgument,
        ),
        (
            "a parameter straddling another set's first state",
            vec![
                a.set(rule, 0),
                with(b.set(rule, 0), &|s| s.param = a.bufs[2].arg(&straddle)),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "a gradient that is another set's second state",
            vec![
                a.set(rule, 1),
                with(b.set(rule, 0), &|s| s.grad = a.bufs[3].arg(&second)),
            ],
            ErrorKind::InvalidArgument,
        ),
        (
            "a set without its second moment",
            vec![a.set(rule, 0), with(b.set(rule, 0), &|s| s.state[1] = None)],
            ErrorKind::InvalidArgument,
        ),
    ];
    if let Some(other) = other_dtype {
        let c = Pack::new(h, other, &[8], 0);
        bad.push((
            "sets of two dtypes",
            vec![a.set(rule, 0), c.set(rule, 0)],
            ErrorKind::InvalidArgument,
        ));
    }
    let before: Vec<Option<Vec<u8>>> = [&a, &b]
        .iter()
        .flat_map(|p| p.bufs.iter().map(|buf| h.read_bytes("update_many refusals", buf)))
        .collect();
    for (what, sets, kind) in bad {
        h.count_check();
        match h.run(&Kernel::UpdateMany { rule, sets }) {
            Ok(()) => h.fail(format!("adam_update_many {dtype} with {what} was accepted")),
            Err(e) if e.kind() != kind => h.fail(format!(
                "adam_update_many {dtype} with {what}: want {kind} error, got {}: {e}",
                e.kind_name()
            )),
            Err(_) => {}
        }
    }
    let after: Vec<Option<Vec<u8>>> = [&a, &b]
        .iter()
        .flat_map(|p| p.bufs.iter().map(|buf| h.read_bytes("update_many refusals", buf)))
        .collect();
    h.count_check();
    if before != after {
        h.fail(format!("adam_update_many {dtype}: a refused update wrote memory"));
    }
    // Two sets reading one gradient: allowed, and each gets its own update.
    let shared = Pack::new(h, dtype, &[8, 8], 0);
    let sets = vec![
        shared.set(rule, 0),
        with(shared.set(rule, 1), &|s| s.grad = shared.set(rule, 0).grad),
    ];
    let what = format!("adam_update_many {dtype} with two sets reading one gradient");
    if h.launch(&what, &Kernel::UpdateMany { rule, sets }) {
        let mut grads = shared.values[1].clone();
        grads.copy_within(0..8, 8);
        let alias = Pack {
            dtype,
            bufs: shared.bufs,
            values: [
                shared.values[0].clone(),
                grads,
                shared.values[2].clone(),
                shared.values[3].clone(),
            ],
            sets: shared.sets,
        };
        alias.check(h, &what, rule);
    }
}
