//! `--cases`: which of the planned tasks a run measures.
//!
//! A task's id is `<backend>/<device>/<case>_<dtype>_<size>`, with hyphens inside the case name
//! (`cuda/NVIDIA-H100-80GB-HBM3/layer-norm-fwd-bwd_bf16_33554432`) while the report's tables
//! spell the case with underscores (`layer_norm_fwd_bwd`). A word matches an id that contains
//! it, case-insensitively, with `_` and `-` read as the same character, so both spellings pick
//! the same rows. A word that matches no planned task is an error that lists the case names
//! there are: a run that would measure nothing, or less than asked, says so before it starts.

use std::collections::BTreeSet;

/// An id or word with `_` read as `-`, lowercased.
fn folded(text: &str) -> String {
    text.chars()
        .map(|c| if c == '_' { '-' } else { c.to_ascii_lowercase() })
        .collect()
}

/// Whether `word` picks the task `id`.
pub fn matches(id: &str, word: &str) -> bool {
    folded(id).contains(&folded(word))
}

/// The case part of an id (`layer-norm-fwd-bwd` of `cuda/x/layer-norm-fwd-bwd_bf16_33554432`).
fn case_name(id: &str) -> &str {
    let last = id.rsplit('/').next().unwrap_or(id);
    last.split('_').next().unwrap_or(last)
}

/// Checks that every word of `words` picks at least one of `ids` (the planned tasks of the chosen
/// sections); the error names the words that pick nothing and the case names there are.
pub fn check<'a>(words: &[String], ids: impl Iterator<Item = &'a str> + Clone) -> anyhow::Result<()> {
    let unmatched: Vec<&str> = words
        .iter()
        .map(String::as_str)
        .filter(|w| !ids.clone().any(|id| matches(id, w)))
        .collect();
    if unmatched.is_empty() {
        return Ok(());
    }
    let names: BTreeSet<&str> = ids.map(case_name).collect();
    let names: Vec<&str> = names.into_iter().collect();
    anyhow::bail!(
        "--cases: {} matches no task of the chosen sections and backends; the cases there are: {}",
        unmatched
            .iter()
            .map(|w| format!("`{w}`"))
            .collect::<Vec<_>>()
            .join(", "),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: [&str; 3] = [
        "cuda/NVIDIA-H100-80GB-HBM3/layer-norm-fwd-bwd_bf16_33554432",
        "cuda/NVIDIA-H100-80GB-HBM3/gpt-train_f32_16384",
        "cuda/NVIDIA-H100-80GB-HBM3/gpt-train-graph_f32_16384",
    ];

    #[test]
    fn underscores_and_hyphens_pick_the_same_rows() {
        assert!(matches(IDS[0], "layer_norm"));
        assert!(matches(IDS[0], "layer-norm"));
        assert!(matches(IDS[0], "LAYER_NORM_fwd_bwd"));
        assert!(matches(IDS[1], "gpt_train_f32_16384"));
        assert!(!matches(IDS[2], "gpt_train_f32"));
        assert!(!matches(IDS[1], "rms_norm"));
    }

    #[test]
    fn a_word_that_picks_nothing_is_named_with_the_cases_there_are() {
        let words = vec!["gpt_train".to_string(), "sdpa".to_string()];
        let error = check(&words, IDS.iter().copied()).unwrap_err().to_string();
        assert!(error.contains("`sdpa`") && !error.contains("`gpt_train`"), "{error}");
        assert!(
            error.contains("gpt-train, gpt-train-graph, layer-norm-fwd-bwd"),
            "{error}"
        );
        assert!(check(&words[..1], IDS.iter().copied()).is_ok());
        assert!(check(&[], IDS.iter().copied()).is_ok());
    }
}
