//! What the CUDA backend tells about its fused attention: which implementation may run
//! ([`AttentionApi`], [`CudaBackend::set_attention_api`], `CARTAGE_ATTENTION_API`) and which one
//! each shape runs ([`AttentionChoice`], [`CudaBackend::attention_choices`]).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use cartage_core::DType;

use crate::backend::CudaBackend;

/// The environment variable that sets the initial [`AttentionApi`]: `auto` (the default, also
/// when unset or empty), `cudnn` or `kernel`.
pub const ATTENTION_API_VAR: &str = "CARTAGE_ATTENTION_API";

/// Which implementation runs `Kernel::Attention` and `Kernel::AttentionBackward` on bf16 and f16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttentionApi {
    /// With the cuDNN algorithm search on ([`CudaBackend::set_conv_benchmark`]), the faster of
    /// cuDNN's fused attention and cartage's flash kernel, timed on the first call of each shape
    /// (outside a graph capture); with the search off, cartage's kernel.
    #[default]
    Auto,
    /// cuDNN's fused attention (graph API) whenever it can run the call; cartage's kernel
    /// otherwise (no cuDNN, a shape, dtype or layout its engines refuse, no saved forward for the
    /// backward).
    Cudnn,
    /// cartage's flash kernels only.
    Kernel,
}

impl AttentionApi {
    fn to_u8(self) -> u8 {
        match self {
            AttentionApi::Auto => 0,
            AttentionApi::Cudnn => 1,
            AttentionApi::Kernel => 2,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => AttentionApi::Cudnn,
            2 => AttentionApi::Kernel,
            _ => AttentionApi::Auto,
        }
    }
}

/// The switch of [`CudaBackend::set_attention_api`], as the backend keeps it.
#[derive(Debug)]
pub(crate) struct AttentionSwitch(AtomicU8);

impl Default for AttentionSwitch {
    fn default() -> Self {
        AttentionSwitch(AtomicU8::new(api_from_env().to_u8()))
    }
}

/// `value` as an [`AttentionApi`], `None` when it names none.
fn parse(value: &str) -> Option<AttentionApi> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Some(AttentionApi::Auto),
        "cudnn" => Some(AttentionApi::Cudnn),
        "kernel" => Some(AttentionApi::Kernel),
        _ => None,
    }
}

/// The initial [`AttentionApi`] from [`ATTENTION_API_VAR`] (`Auto` unless it names another).
fn api_from_env() -> AttentionApi {
    let Some(value) = std::env::var_os(ATTENTION_API_VAR) else {
        return AttentionApi::Auto;
    };
    let text = value.to_string_lossy();
    parse(&text).unwrap_or_else(|| {
        tracing::warn!(
            value = %text,
            "{ATTENTION_API_VAR} is none of auto, cudnn, kernel; attention chooses per shape (auto)"
        );
        AttentionApi::Auto
    })
}

/// The attention pass a choice is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttentionPass {
    /// `Kernel::Attention`.
    Forward,
    /// `Kernel::AttentionBackward`.
    Backward,
}

impl AttentionPass {
    /// The op's name: `attention` or `attention_backward`.
    pub const fn op(self) -> &'static str {
        match self {
            AttentionPass::Forward => "attention",
            AttentionPass::Backward => "attention_backward",
        }
    }
}

/// What one attention shape ran last, as [`CudaBackend::attention_choices`] reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionChoice {
    /// The pass.
    pub pass: AttentionPass,
    /// The element type.
    pub dtype: DType,
    /// `[B, L, S, E, Ev]`: batch (batch · heads), query and key lengths, head dims of q/k and v.
    pub sizes: [usize; 5],
    /// The causal mask.
    pub causal: bool,
    /// An additive mask (cuDNN's bias).
    pub masked: bool,
    /// True when cuDNN's fused attention ran it, false for cartage's flash kernel.
    pub cudnn: bool,
    /// The implementation in words: `cuDNN fused attention (graph engine N)` or
    /// ``flash kernel `attention.cu` `` (``… `attention_flash_backward.cu` `` for the backward).
    pub implementation: String,
    /// cuDNN's time in the comparison, in milliseconds (`None` when not compared).
    pub cudnn_ms: Option<f32>,
    /// The kernel's time in the comparison, in milliseconds (`None` when not compared or it
    /// refused the call).
    pub kernel_ms: Option<f32>,
}

impl fmt::Display for AttentionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [b, l, s, e, ev] = self.sizes;
        write!(
            f,
            "{} {} B {b} L {l} S {s} E {e} Ev {ev}{}{}: {}",
            self.pass.op(),
            self.dtype,
            if self.causal { " causal" } else { "" },
            if self.masked { " masked" } else { "" },
            self.implementation
        )?;
        match (self.cudnn_ms, self.kernel_ms) {
            (Some(c), Some(k)) => write!(f, " (timed: cuDNN {c:.3} ms, kernel {k:.3} ms)"),
            (Some(c), None) => write!(f, " (timed: cuDNN {c:.3} ms)"),
            _ => Ok(()),
        }
    }
}

/// The words for cartage's kernel of `pass`.
pub(crate) fn kernel_words(pass: AttentionPass) -> String {
    match pass {
        AttentionPass::Forward => "flash kernel `attention.cu`".into(),
        AttentionPass::Backward => "flash kernel `attention_flash_backward.cu`".into(),
    }
}

impl CudaBackend {
    /// Choose which implementation runs fused attention ([`AttentionApi`]; `Auto` by default, or
    /// as `CARTAGE_ATTENTION_API` says, [`ATTENTION_API_VAR`]). Under `Auto` the cuDNN algorithm
    /// search switch ([`CudaBackend::set_conv_benchmark`], `CARTAGE_CUDNN_BENCHMARK`) also decides
    /// whether cuDNN's fused attention is timed against cartage's kernel: on, the first call of
    /// each shape times both and the faster runs from then on; off, cartage's kernel runs. The
    /// switch is read at each call; every setting still runs attention (cartage's kernel, or the
    /// frontend's composed path, where cuDNN cannot).
    pub fn set_attention_api(&self, api: AttentionApi) {
        tracing::debug!(device = %self.device, ?api, "attention implementation set");
        self.attention_api.0.store(api.to_u8(), Ordering::Relaxed);
    }

    /// The state of [`CudaBackend::set_attention_api`].
    pub fn attention_api(&self) -> AttentionApi {
        AttentionApi::from_u8(self.attention_api.0.load(Ordering::Relaxed))
    }

    /// What each attention shape seen so far ran last on this device, where cuDNN was
    /// considered (one entry per pass, sizes, strides, alignment, dtype, mask and search
    /// setting), sorted by pass and sizes. Empty before the first attention, without cuDNN, or
    /// under [`AttentionApi::Kernel`].
    pub fn attention_choices(&self) -> Vec<AttentionChoice> {
        super::choices(self.device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_values_round_trip_and_parse() {
        for api in [AttentionApi::Auto, AttentionApi::Cudnn, AttentionApi::Kernel] {
            assert_eq!(AttentionApi::from_u8(api.to_u8()), api);
        }
        assert_eq!(parse(" cuDNN "), Some(AttentionApi::Cudnn));
        assert_eq!(parse(""), Some(AttentionApi::Auto));
        assert_eq!(parse("kernel"), Some(AttentionApi::Kernel));
        assert_eq!(parse("flash"), None);
    }

    #[test]
    fn a_choice_reads_as_one_line() {
        let choice = AttentionChoice {
            pass: AttentionPass::Forward,
            dtype: DType::BF16,
            sizes: [128, 1024, 1024, 64, 64],
            causal: true,
            masked: false,
            cudnn: true,
            implementation: "cuDNN fused attention (graph engine 8)".into(),
            cudnn_ms: Some(0.5),
            kernel_ms: Some(0.75),
        };
        assert_eq!(
            choice.to_string(),
            "attention bf16 B 128 L 1024 S 1024 E 64 Ev 64 causal: cuDNN fused attention (graph engine 8) \
             (timed: cuDNN 0.500 ms, kernel 0.750 ms)"
        );
    }
}
