//! What the CUDA backend tells about its convolutions: the three passes ([`ConvPass`]), the
//! algorithm cuDNN runs for each shape ([`ConvAlgorithmChoice`],
//! [`CudaBackend::conv_algorithms`]), the algorithm search switch
//! ([`CudaBackend::set_conv_benchmark`], `CARTAGE_CUDNN_BENCHMARK`) and which of cuDNN's two
//! APIs may run ([`ConvApi`], [`CudaBackend::set_conv_engine_api`], `CARTAGE_CUDNN_API`).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use cartage_core::DType;

use crate::backend::CudaBackend;

/// The environment variable that sets the initial state of the algorithm search:
/// `0`, `false`, `off` or `no` keep cuDNN's heuristics only; unset, empty, `1`, `true`, `on` or
/// `yes` search (the default).
pub const CUDNN_BENCHMARK_VAR: &str = "CARTAGE_CUDNN_BENCHMARK";

/// The environment variable that sets the initial [`ConvApi`]: `auto` (the default, also when
/// unset or empty), `graph` or `legacy`.
pub const CUDNN_API_VAR: &str = "CARTAGE_CUDNN_API";

/// Which of cuDNN's APIs a convolution may run through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvApi {
    /// Both: with the algorithm search on, the faster of the graph API's best engine and the
    /// legacy API's best algorithm, timed on the first call of each plan; with it off, the graph
    /// API's first engine from its heuristics. The legacy API whenever the graph API cannot run
    /// the convolution.
    #[default]
    Auto,
    /// The graph (backend) API whenever it can run the convolution, the legacy API otherwise
    /// (an older cuDNN, an unsupported shape or dtype, no engine finalizing).
    Graph,
    /// The legacy API only (`cudnnConvolutionForward` and the backward calls).
    Legacy,
}

impl ConvApi {
    fn to_u8(self) -> u8 {
        match self {
            ConvApi::Auto => 0,
            ConvApi::Graph => 1,
            ConvApi::Legacy => 2,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => ConvApi::Graph,
            2 => ConvApi::Legacy,
            _ => ConvApi::Auto,
        }
    }
}

/// The switch of [`CudaBackend::set_conv_engine_api`], as the backend keeps it.
#[derive(Debug)]
pub(crate) struct ApiSwitch(AtomicU8);

impl Default for ApiSwitch {
    fn default() -> Self {
        ApiSwitch(AtomicU8::new(api_from_env().to_u8()))
    }
}

/// The initial [`ConvApi`] from [`CUDNN_API_VAR`] (`Auto` unless it names another).
fn api_from_env() -> ConvApi {
    let Some(value) = std::env::var_os(CUDNN_API_VAR) else {
        return ConvApi::Auto;
    };
    match value.to_string_lossy().trim().to_ascii_lowercase().as_str() {
        "" | "auto" => ConvApi::Auto,
        "graph" => ConvApi::Graph,
        "legacy" => ConvApi::Legacy,
        other => {
            tracing::warn!(
                value = other,
                "{CUDNN_API_VAR} is none of auto, graph, legacy; cuDNN convolutions use both APIs (auto)"
            );
            ConvApi::Auto
        }
    }
}

/// Which of cuDNN's three convolution calls runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConvPass {
    /// `y = conv(x, w)` (`Kernel::Conv2d`).
    Forward,
    /// The input gradient from the output gradient and the weight
    /// (`Kernel::Conv2dBackwardInput`, cuDNN's backward data).
    BackwardData,
    /// The weight gradient from the input and the output gradient
    /// (`Kernel::Conv2dBackwardWeight`, cuDNN's backward filter).
    BackwardFilter,
}

impl ConvPass {
    /// The op's name in errors: `conv2d`, `conv2d_backward_input` or `conv2d_backward_weight`.
    pub const fn op(self) -> &'static str {
        match self {
            ConvPass::Forward => "conv2d",
            ConvPass::BackwardData => "conv2d_backward_input",
            ConvPass::BackwardFilter => "conv2d_backward_weight",
        }
    }
}

/// [`ConvAlgorithmChoice::math`] of a graph engine on tensor cores.
pub const GRAPH_TENSOR_CORES: &str = "tensor core";
/// [`ConvAlgorithmChoice::math`] of a graph engine without tensor cores.
pub const GRAPH_NO_TENSOR_CORES: &str = "no tensor core";

/// The algorithm one convolution shape runs, as [`CudaBackend::conv_algorithms`] reports it: the
/// plan's key (pass, sizes, strides, window, dtype) and the last algorithm that ran for it.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvAlgorithmChoice {
    /// The pass.
    pub pass: ConvPass,
    /// The element type.
    pub dtype: DType,
    /// The forward input's sizes `[N, C, H, W]` (the input gradient's, for backward data).
    pub input: [usize; 4],
    /// Its strides as cuDNN was given them, in elements.
    pub input_strides: [usize; 4],
    /// The weight's sizes `[O, C / groups, kh, kw]` (dense).
    pub weight: [usize; 4],
    /// The forward output's strides as cuDNN was given them (the output gradient's, for the
    /// backward passes).
    pub output_strides: [usize; 4],
    /// Zeros added on each side, (height, width).
    pub padding: [usize; 2],
    /// Step of the window, (height, width).
    pub stride: [usize; 2],
    /// Spacing of the window's taps, (height, width).
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
    /// The API that ran it.
    pub api: ConvApi,
    /// cuDNN's name of the algorithm, e.g. `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`
    /// (legacy API), or `graph engine 12` (the graph API's engine by its global index, followed
    /// by its numerical notes other than tensor cores, e.g. `graph engine 3 (winograd)`).
    pub algorithm: String,
    /// cuDNN's math type it runs under, e.g. `CUDNN_TENSOR_OP_MATH` (tensor cores allowed), for
    /// the legacy API; [`GRAPH_TENSOR_CORES`] or [`GRAPH_NO_TENSOR_CORES`] for a graph engine
    /// (whether cuDNN notes it as running on tensor cores).
    pub math: String,
    /// Workspace bytes it takes per call.
    pub workspace_bytes: usize,
    /// True when the algorithm search picked it by timing; false when it is cuDNN's heuristics'
    /// choice (the search off, inside a graph capture, or the search could not run).
    pub searched: bool,
    /// Its time in the search, in milliseconds (`None` when not searched).
    pub search_ms: Option<f32>,
}

impl fmt::Display for ConvAlgorithmChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} x{:?} w{:?} padding {:?} stride {:?} dilation {:?} groups {}: {} ({}, {} B workspace, ",
            self.pass.op(),
            self.dtype,
            self.input,
            self.weight,
            self.padding,
            self.stride,
            self.dilation,
            self.groups,
            self.algorithm,
            self.math,
            self.workspace_bytes,
        )?;
        match self.search_ms {
            Some(ms) if self.searched => write!(f, "searched, {ms:.3} ms)"),
            _ => write!(f, "heuristics)"),
        }
    }
}

/// The search switch's initial state from [`CUDNN_BENCHMARK_VAR`] (on unless it says off).
pub(crate) fn benchmark_from_env() -> bool {
    let value = std::env::var_os(CUDNN_BENCHMARK_VAR);
    let Some(value) = value else { return true };
    let text = value.to_string_lossy().trim().to_ascii_lowercase();
    match text.as_str() {
        "" | "1" | "true" | "on" | "yes" => true,
        "0" | "false" | "off" | "no" => false,
        other => {
            tracing::warn!(
                value = other,
                "{CUDNN_BENCHMARK_VAR} is neither on (1, true, on, yes) nor off (0, false, off, no); the cuDNN \
                 algorithm search stays on"
            );
            true
        }
    }
}

impl CudaBackend {
    /// Turn the cuDNN algorithm search on or off (like `torch.backends.cudnn.benchmark`). On, the
    /// first convolution of each pass, shape, strides, dtype and math times the pass's
    /// algorithms with `cudnnFindConvolution*AlgorithmEx` and keeps the fastest that fits; off,
    /// cuDNN's heuristics (`_v7`) choose. Where the graph API may run ([`ConvApi`]), the search
    /// also times up to 8 of its engines and keeps the faster API; off, the graph heuristics'
    /// first engine runs. The same switch decides whether fused attention times cuDNN's fused
    /// attention against cartage's flash kernel under [`crate::AttentionApi::Auto`] (off: the
    /// kernel runs). Each setting keeps its own plans, so switching back
    /// and forth searches each shape once. The initial state comes from
    /// `CARTAGE_CUDNN_BENCHMARK` ([`CUDNN_BENCHMARK_VAR`]; on by default).
    pub fn set_conv_benchmark(&self, on: bool) {
        tracing::debug!(device = %self.device, on, "cuDNN algorithm search set");
        self.conv_benchmark.store(on, Ordering::Relaxed);
    }

    /// The state of [`CudaBackend::set_conv_benchmark`].
    pub fn conv_benchmark(&self) -> bool {
        self.conv_benchmark.load(Ordering::Relaxed)
    }

    /// Choose which of cuDNN's APIs convolutions may run through ([`ConvApi`]; `Auto` by
    /// default, or as `CARTAGE_CUDNN_API` says, [`CUDNN_API_VAR`]). Plans already built keep
    /// their engines; the switch is read at each call. `Graph` still falls back to the legacy
    /// API where the graph API cannot run a convolution, so every setting convolves.
    pub fn set_conv_engine_api(&self, api: ConvApi) {
        tracing::debug!(device = %self.device, ?api, "cuDNN convolution API set");
        self.conv_api.0.store(api.to_u8(), Ordering::Relaxed);
    }

    /// The state of [`CudaBackend::set_conv_engine_api`].
    pub fn conv_engine_api(&self) -> ConvApi {
        ConvApi::from_u8(self.conv_api.0.load(Ordering::Relaxed))
    }

    /// The algorithm each convolution shape seen so far runs on this device (one entry per plan
    /// that has run: pass, shape, strides, window, dtype, search setting), sorted by pass and
    /// shape. Empty before the first convolution or without cuDNN.
    pub fn conv_algorithms(&self) -> Vec<ConvAlgorithmChoice> {
        super::plan::choices(self.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_reads_as_one_line() {
        let choice = ConvAlgorithmChoice {
            pass: ConvPass::Forward,
            dtype: DType::BF16,
            input: [32, 64, 56, 56],
            input_strides: [200704, 3136, 56, 1],
            weight: [64, 64, 3, 3],
            output_strides: [200704, 3136, 56, 1],
            padding: [1, 1],
            stride: [1, 1],
            dilation: [1, 1],
            groups: 1,
            api: ConvApi::Legacy,
            algorithm: "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM".into(),
            math: "CUDNN_TENSOR_OP_MATH".into(),
            workspace_bytes: 0,
            searched: true,
            search_ms: Some(0.25),
        };
        let line = choice.to_string();
        assert!(
            line.starts_with("conv2d bf16 x[32, 64, 56, 56] w[64, 64, 3, 3]"),
            "{line}"
        );
        assert!(
            line.ends_with("IMPLICIT_PRECOMP_GEMM (CUDNN_TENSOR_OP_MATH, 0 B workspace, searched, 0.250 ms)"),
            "{line}"
        );
        let heuristic = ConvAlgorithmChoice {
            searched: false,
            search_ms: None,
            ..choice
        };
        assert!(heuristic.to_string().ends_with("heuristics)"));
    }

    #[test]
    fn api_switch_values_round_trip() {
        for api in [ConvApi::Auto, ConvApi::Graph, ConvApi::Legacy] {
            assert_eq!(ConvApi::from_u8(api.to_u8()), api);
        }
    }
}
