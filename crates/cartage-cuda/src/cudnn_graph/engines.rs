//! Engines for an operation graph: cuDNN's heuristics (`ENGINEHEUR`, mode A, then the fallback
//! mode) list engine configurations; each one the caller's filter allows is finalized as an
//! `EXECUTION_PLAN` on the handle, with its workspace size, until enough plans are had.
//!
//! [`precise`] is the convolutions' filter, the precision rule of their legacy path (`conv.rs`,
//! `conv/plan.rs`):
//! - f32 under FMA math (the device's precision `Highest`) takes no engine with
//!   `CUDNN_NUMERICAL_NOTE_TENSOR_CORE` (no TF32), exactly as the legacy path drops tensor-op
//!   algorithms; under `High` tensor cores are allowed;
//! - no engine that down-converts its inputs (`DOWN_CONVERT_INPUTS`) or reduces in reduced
//!   precision (`REDUCED_PRECISION_REDUCTION`): f16 and bf16 accumulate in f32 as the graph's
//!   f32 compute type says.
//!
//! The legacy path has no determinism rule, so non-deterministic engines are allowed too.

use cudarc::cudnn::sys;
use sys::cudnnBackendAttributeName_t as A;
use sys::cudnnBackendAttributeType_t as T;
use sys::cudnnBackendDescriptorType_t as D;
use sys::cudnnBackendNumericalNote_t as Note;

use super::descriptor::{Descriptor, Failure, Outcome};

/// Engine configurations read from one heuristics query at most.
const MAX_CONFIGS: usize = 64;

/// What cuDNN says of one engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EngineInfo {
    /// The engine's global index (cuDNN's own number for it).
    pub(crate) index: i64,
    /// Its numerical notes, as `cudnnBackendNumericalNote_t` numbers.
    pub(crate) notes: Vec<u32>,
    /// Its behavior notes, as `cudnnBackendBehaviorNote_t` numbers.
    pub(crate) behavior: Vec<u32>,
}

impl EngineInfo {
    /// True when the engine carries the numerical note `note`.
    pub(crate) fn has(&self, note: Note) -> bool {
        self.notes.contains(&(note as u32))
    }

    /// True when the engine runs on tensor cores.
    pub(crate) fn tensor_cores(&self) -> bool {
        self.has(Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
    }

    /// The engine's name in reports: `graph engine 12`, followed by its notes other than tensor
    /// cores (lowercase, e.g. `(winograd, nondeterministic)`).
    pub(crate) fn name(&self) -> String {
        let others: Vec<String> = self
            .notes
            .iter()
            .filter(|&&n| n != Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32)
            .map(|&n| note_name(n))
            .collect();
        if others.is_empty() {
            format!("graph engine {}", self.index)
        } else {
            format!("graph engine {} ({})", self.index, others.join(", "))
        }
    }
}

/// A numerical note's short name.
fn note_name(n: u32) -> String {
    let known = [
        Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
        Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
        Note::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        Note::CUDNN_NUMERICAL_NOTE_FFT,
        Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,
        Note::CUDNN_NUMERICAL_NOTE_WINOGRAD,
        Note::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4,
        Note::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6,
        Note::CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13,
        Note::CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP,
    ];
    match known.iter().find(|k| **k as u32 == n) {
        Some(k) => format!("{k:?}")
            .trim_start_matches("CUDNN_NUMERICAL_NOTE_")
            .to_lowercase(),
        None => format!("note {n}"),
    }
}

/// Whether the precision rule admits an engine (see the module docs); `tensor_cores` says
/// whether the key's math allows them.
pub(crate) fn precise(info: &EngineInfo, tensor_cores: bool) -> bool {
    if !tensor_cores && info.tensor_cores() {
        return false;
    }
    !info.has(Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)
        && !info.has(Note::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
}

/// The engine of an engine configuration, and what cuDNN says of it.
pub(crate) fn engine_info(config: &Descriptor) -> Outcome<EngineInfo> {
    let engine = config
        .get_descriptors(A::CUDNN_ATTR_ENGINECFG_ENGINE, D::CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1)?
        .pop()
        .ok_or_else(|| Failure {
            call: "cudnnBackendGetAttribute",
            what: "CUDNN_ATTR_ENGINECFG_ENGINE returned no engine".into(),
            status: sys::cudnnStatus_t::CUDNN_STATUS_INTERNAL_ERROR,
        })?;
    let count = Note::CUDNN_NUMERICAL_NOTE_TYPE_COUNT as usize;
    Ok(EngineInfo {
        index: engine.get_i64(A::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?,
        notes: engine.get_enums(A::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, T::CUDNN_TYPE_NUMERICAL_NOTE, count)?,
        behavior: engine
            .get_enums(A::CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, T::CUDNN_TYPE_BEHAVIOR_NOTE, 16)
            .unwrap_or_default(),
    })
}

/// The engine configurations cuDNN's heuristics of `mode` list for `graph`, best first.
pub(crate) fn heuristics(graph: &Descriptor, mode: sys::cudnnBackendHeurMode_t) -> Outcome<Vec<Descriptor>> {
    let heur = Descriptor::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_descriptors(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[graph])?;
    heur.set_heur_mode(A::CUDNN_ATTR_ENGINEHEUR_MODE, mode)?;
    heur.finalize()?;
    let count = heur.count_descriptors(A::CUDNN_ATTR_ENGINEHEUR_RESULTS)?;
    heur.get_descriptors(
        A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
        D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
        count.min(MAX_CONFIGS),
    )
}

/// One finalized execution plan with its engine.
pub(crate) struct ExecPlan {
    /// The `EXECUTION_PLAN` descriptor (dropped before its configuration).
    pub(crate) plan: Descriptor,
    _config: Descriptor,
    /// The engine it runs.
    pub(crate) engine: EngineInfo,
    /// Workspace bytes each call takes.
    pub(crate) workspace: usize,
    /// Its time in the search, in milliseconds.
    pub(crate) time_ms: Option<f32>,
}

/// Finalize `config` as an execution plan on `handle`.
fn finalize(handle: sys::cudnnHandle_t, config: Descriptor, engine: EngineInfo) -> Outcome<ExecPlan> {
    let plan = Descriptor::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set_handle(A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, handle)?;
    plan.set_descriptors(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[&config])?;
    plan.finalize()?;
    let workspace = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
    Ok(ExecPlan {
        plan,
        _config: config,
        engine,
        workspace: workspace.max(0) as usize,
        time_ms: None,
    })
}

/// Up to `want` finalized plans for `graph`, in the heuristics' order (mode A's list, then the
/// fallback list's engines not already had), each admitted by `allow` and needing at most
/// `workspace_limit` bytes. Configurations that do not finalize are skipped (logged).
pub(crate) fn plans(
    handle: sys::cudnnHandle_t,
    graph: &Descriptor,
    allow: &dyn Fn(&EngineInfo) -> bool,
    want: usize,
    workspace_limit: usize,
) -> Outcome<Vec<ExecPlan>> {
    let mut out: Vec<ExecPlan> = Vec::new();
    let mut last_failure: Option<Failure> = None;
    for mode in [
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
        sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
    ] {
        let configs = match heuristics(graph, mode) {
            Ok(configs) => configs,
            Err(failure) => {
                tracing::debug!(?mode, %failure, "cuDNN graph heuristics failed");
                last_failure = Some(failure);
                continue;
            }
        };
        let fallback = mode == sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK;
        for config in configs {
            if out.len() >= want {
                return Ok(out);
            }
            let engine = match engine_info(&config) {
                Ok(engine) => engine,
                Err(failure) => {
                    tracing::debug!(%failure, "cuDNN engine configuration unreadable; skipped");
                    continue;
                }
            };
            if !allow(&engine) {
                tracing::debug!(?engine, "engine left out by the caller's filter");
                continue;
            }
            if fallback && out.iter().any(|p| p.engine.index == engine.index) {
                continue;
            }
            match finalize(handle, config, engine.clone()) {
                Ok(plan) if plan.workspace <= workspace_limit => out.push(plan),
                Ok(plan) => {
                    tracing::debug!(
                        engine = engine.index,
                        workspace = plan.workspace,
                        "engine needs too much workspace; skipped"
                    );
                }
                Err(failure) => {
                    tracing::debug!(engine = engine.index, %failure, "cuDNN engine configuration did not finalize; skipped");
                    last_failure = Some(failure);
                }
            }
        }
        if !out.is_empty() && out.len() >= want {
            break;
        }
    }
    if out.is_empty()
        && let Some(failure) = last_failure
    {
        return Err(failure);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(notes: &[Note]) -> EngineInfo {
        EngineInfo {
            index: 12,
            notes: notes.iter().map(|&n| n as u32).collect(),
            behavior: Vec::new(),
        }
    }

    #[test]
    fn highest_f32_takes_no_tensor_core_engine() {
        let tc = engine(&[Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE]);
        assert!(!precise(&tc, false));
        assert!(precise(&tc, true));
        assert!(precise(&engine(&[]), false));
        assert!(precise(&engine(&[Note::CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC]), false));
    }

    #[test]
    fn reduced_precision_engines_are_never_taken() {
        for note in [
            Note::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
            Note::CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
        ] {
            assert!(!precise(&engine(&[Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE, note]), true));
        }
    }

    #[test]
    fn names_list_the_notes_besides_tensor_cores() {
        assert_eq!(
            engine(&[Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE]).name(),
            "graph engine 12"
        );
        assert_eq!(
            engine(&[
                Note::CUDNN_NUMERICAL_NOTE_TENSOR_CORE,
                Note::CUDNN_NUMERICAL_NOTE_WINOGRAD
            ])
            .name(),
            "graph engine 12 (winograd)"
        );
        assert_eq!(note_name(99), "note 99");
    }
}
