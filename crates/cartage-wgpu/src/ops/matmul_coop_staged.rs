//! The text of the staged cooperative-matrix f16 matmul (`shaders/matmul_coop_staged.wgsl`) for
//! a [`StagedTiling`] and a subgroup size: the generator unrolls the copies, the fragment
//! loads and the multiply-adds of one K step.

use cartage_core::Result;

use crate::ops::matmul_coop_tiling::{PAD, StagedTiling};
use crate::wgsl;

const SOURCE: &str = include_str!("../../shaders/matmul_coop_staged.wgsl");

fn pieces() -> &'static wgsl::Pieces {
    static PIECES: std::sync::OnceLock<wgsl::Pieces> = std::sync::OnceLock::new();
    PIECES.get_or_init(|| wgsl::Pieces::parse("shaders/matmul_coop_staged.wgsl", SOURCE))
}

/// The kernel's text for `t` with subgroups of `subgroup` invocations (the caller checked
/// [`StagedTiling::fits`]).
pub(crate) fn source(t: &StagedTiling, subgroup: u32) -> Result<String> {
    let p = pieces();
    let num = |v: u32| v.to_string();
    let threads = t.subgroups() * subgroup;
    let (fm, fn_) = (t.wm / 16, t.wn / 16);
    // Chunks of eight per row of the A tile (BK wide) and the B tile (BN wide), and chunks per
    // invocation for each.
    let (ach, bch) = (t.bk / 8, t.bn / 8);
    let (la, lb) = (t.bm * t.bk / 8 / threads, t.bk * t.bn / 8 / threads);
    let fill = |name: &str, parts: &[(&'static str, String)]| -> Result<String> {
        let refs: Vec<(&str, &str)> = parts.iter().map(|(k, v)| (*k, v.as_str())).collect();
        p.fill(name, &refs)
    };
    // The copies (each piece takes only the values it uses: a value without a placeholder is
    // an error).
    let mut fetch = String::new();
    for s in 0..la {
        fetch.push_str(&fill(
            "fetch_a",
            &[("S", num(s)), ("THREADS", num(threads)), ("ACH", num(ach))],
        )?);
        fetch.push_str("\n    ");
    }
    for s in 0..lb {
        fetch.push_str(&fill(
            "fetch_b",
            &[("S", num(s)), ("THREADS", num(threads)), ("BCH", num(bch))],
        )?);
        fetch.push_str("\n    ");
    }
    let deposit = |next_a: &str, next_b: &str| -> Result<String> {
        let mut out = String::new();
        for s in 0..la {
            let parts = [
                ("S", num(s)),
                ("THREADS", num(threads)),
                ("ACH", num(ach)),
                ("NEXT_A", next_a.into()),
            ];
            out.push_str(&fill("deposit_a", &parts)?);
            out.push_str("\n        ");
        }
        for s in 0..lb {
            let parts = [
                ("S", num(s)),
                ("THREADS", num(threads)),
                ("BCH", num(bch)),
                ("NEXT_B", next_b.into()),
            ];
            out.push_str(&fill("deposit_b", &parts)?);
            out.push_str("\n        ");
        }
        Ok(out)
    };
    // One K step: BK / 16 fragment steps, each loading FM + FN fragments and doing FM × FN
    // multiply-adds.
    let mut mma_steps = String::new();
    for kk in 0..t.bk / 16 {
        let mut frags = String::new();
        for i in 0..fm {
            frags.push_str(&fill("frag_a", &[("I", num(i)), ("KK", num(kk))])?);
            frags.push_str("\n            ");
        }
        for j in 0..fn_ {
            frags.push_str(&fill("frag_b", &[("J", num(j)), ("KK", num(kk))])?);
            frags.push_str("\n            ");
        }
        let mut mmas = String::new();
        for i in 0..fm {
            for j in 0..fn_ {
                mmas.push_str(&fill("mma", &[("I", num(i)), ("J", num(j))])?);
                mmas.push_str("\n            ");
            }
        }
        mma_steps.push_str(&fill("mma_step", &[("FRAGS", frags), ("MMAS", mmas)])?);
        mma_steps.push_str("\n        ");
    }
    let step_piece = if t.stages == 2 {
        "step_two_stages"
    } else {
        "step_one_stage"
    };
    let main_step = fill(
        step_piece,
        &[("MMA_STEPS", mma_steps), ("DEPOSIT", deposit("a_next", "b_next")?)],
    )?;
    let mut acc_decl = String::new();
    let mut stores = String::new();
    for i in 0..fm {
        for j in 0..fn_ {
            acc_decl.push_str(&fill("acc_decl", &[("I", num(i)), ("J", num(j))])?);
            acc_decl.push_str("\n    ");
            stores.push_str(&fill("store", &[("I", num(i)), ("J", num(j))])?);
            stores.push_str("\n    ");
        }
    }
    let head = [
        ("SUBGROUPS", num(t.subgroups())),
        ("SUBGROUP", num(subgroup)),
        ("BM", num(t.bm)),
        ("BN", num(t.bn)),
        ("BK", num(t.bk)),
        ("WM", num(t.wm)),
        ("WN", num(t.wn)),
        ("FM", num(fm)),
        ("FN", num(fn_)),
        ("SGN", num(t.bn / t.wn)),
        ("STAGES", num(t.stages)),
        ("PAD", num(PAD)),
        ("THREADS", num(threads)),
        ("ACC_DECL", acc_decl),
        ("FETCH", fetch),
        ("DEPOSIT_FIRST", deposit("0u", "0u")?),
        ("MAIN_STEP", main_step),
        ("STORES", stores),
    ];
    let refs: Vec<(&str, &str)> = head.iter().map(|(k, v)| (*k, v.as_str())).collect();
    p.fill_head(&refs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul_coop_tiling::CoopTiling;

    #[test]
    fn every_staged_candidate_fills_its_template() {
        for t in CoopTiling::CANDIDATES {
            let CoopTiling::Staged(s) = t else { continue };
            let text = source(&s, 32).unwrap();
            assert!(!text.contains("{{"), "{t}");
            let (fm, fn_) = (s.wm / 16, s.wn / 16);
            assert_eq!(
                text.matches("coopMultiplyAdd").count() as u32,
                fm * fn_ * s.bk / 16,
                "{t}"
            );
            assert_eq!(text.matches("coopStoreT(").count() as u32, fm * fn_, "{t}");
            assert!(
                text.contains(&format!("@workgroup_size({})", s.subgroups() * 32)),
                "{t}"
            );
            assert_eq!(
                text.matches("workgroupBarrier()").count(),
                if s.stages == 2 { 2 } else { 3 },
                "{t}"
            );
        }
    }
}
