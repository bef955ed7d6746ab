//! How the reference library's rows were measured where output memory differs: cartage reuses
//! its cache for every output, so the reference writes into an output allocated once (`out=`)
//! wherever the library has that form, and the report says which rows did and which could not.

use std::collections::BTreeSet;

use super::{Block, library_name};
use crate::bench::report::Report;

/// The reference runner's counter: 1 when the output was allocated once before timing.
pub const COUNTER: &str = "out_preallocated";

/// The paragraph on output memory, or nothing when no row has a reference.
pub(super) fn paragraph(report: &Report) -> Option<Block> {
    let with_reference: Vec<_> = report
        .rows
        .iter()
        .filter_map(|r| r.reference.as_ref().map(|x| (r, x)))
        .collect();
    if with_reference.is_empty() {
        return None;
    }
    let libraries: BTreeSet<&str> = with_reference.iter().map(|(_, x)| library_name(&x.library)).collect();
    let names = libraries.into_iter().collect::<Vec<_>>().join(" and ");
    let cases = |value: f64| -> Vec<String> {
        let set: BTreeSet<String> = with_reference
            .iter()
            .filter(|(_, x)| x.counters.get(COUNTER) == Some(&value))
            .map(|(r, _)| r.case.clone())
            .collect();
        set.into_iter().map(|c| format!("`{c}`")).collect()
    };
    let (into, fresh) = (cases(1.0), cases(0.0));
    let text = if into.is_empty() && fresh.is_empty() {
        format!(
            "**Output memory.** cartage serves every output from its cache. This report's {names} rows \
             predate preallocated outputs: the reference allocated a fresh output on every call, which on \
             the CPU (no caching allocator) adds page faults that cartage does not pay, so its CPU \
             element-wise rows favour cartage."
        )
    } else {
        format!(
            "**Output memory.** cartage serves every output from its cache, so {names} wrote into an output \
             allocated once before timing (`out=`) wherever it has that form: {}.{} The rest of the \
             reference rows (fused ops, training steps) allocate as the library does in use.",
            if into.is_empty() {
                "none".into()
            } else {
                into.join(", ")
            },
            if fresh.is_empty() {
                String::new()
            } else {
                format!(
                    " These have no `out=` form and allocate a fresh output per call: {} (on CUDA \
                     PyTorch's caching allocator serves it; on the CPU it can cost page faults cartage does not \
                     pay).",
                    fresh.join(", ")
                )
            }
        )
    };
    Some(Block::Paragraph(text))
}
