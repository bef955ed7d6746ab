//! cuDNN's side of a convolution: the handle per device (on the compute stream), descriptors
//! and the algorithms cuDNN's heuristics rank for one pass (forward, backward data, backward
//! filter) and shape, cached per pass, shape, strides, dtype, math and search setting (the
//! search itself, which reorders them by measured time, is `search.rs`), the calls themselves,
//! and the report of what each plan ran ([`choices`]). The handle also keeps the graph API's
//! plans (`graph`), so both APIs share one lock, one stream and one cache lifetime.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use cartage_core::raw::Allocation;
use cartage_core::{DType, Device, Error, Result, TensorArg};
use cudarc::cudnn::sys;

pub(super) use super::choice::ConvPass as Pass;
use super::choice::{ConvAlgorithmChoice, ConvApi};
use super::graph::{GraphChoice, GraphPlans};
use super::library::{cudnn_error, load_sublibraries};
use crate::backend::CudaBackend;
use crate::launch::device_ptr;

/// Plans kept per device before the cache is emptied (shapes seen by a model are few).
const MAX_PLANS: usize = 512;

/// cuDNN's (storage, accumulation) types for `dtype`, or `None` for non-floats.
pub(super) fn data_type(dtype: DType) -> Option<(sys::cudnnDataType_t, sys::cudnnDataType_t)> {
    use sys::cudnnDataType_t::*;
    match dtype {
        DType::F32 => Some((CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT)),
        DType::F64 => Some((CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE)),
        DType::F16 => Some((CUDNN_DATA_HALF, CUDNN_DATA_FLOAT)),
        DType::BF16 => Some((CUDNN_DATA_BFLOAT16, CUDNN_DATA_FLOAT)),
        _ => None,
    }
}

/// What a plan depends on. `x` is the forward's input (the input gradient for backward data),
/// `y` the forward's output (the output gradient for the backward passes); the filter is dense.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    pub(super) pass: Pass,
    pub(super) dtype: DType,
    /// `cudnnMathType_t` as a number.
    pub(super) math: u32,
    pub(super) x_dims: [c_int; 4],
    pub(super) x_strides: [c_int; 4],
    pub(super) w_dims: [c_int; 4],
    pub(super) y_strides: [c_int; 4],
    /// Padding, stride, dilation, each (height, width).
    pub(super) window: [c_int; 6],
    pub(super) groups: c_int,
    /// Whether the algorithm search orders this plan (each setting keeps its own plans).
    pub(super) benchmark: bool,
}

/// An algorithm of one of the three passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    Data(sys::cudnnConvolutionBwdDataAlgo_t),
    Filter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    /// cuDNN's name of the algorithm.
    fn name(self) -> String {
        match self {
            Algo::Forward(a) => format!("{a:?}"),
            Algo::Data(a) => format!("{a:?}"),
            Algo::Filter(a) => format!("{a:?}"),
        }
    }
}

/// One algorithm cuDNN proposed, with the math it runs under and its workspace (and its time
/// when the search measured it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Candidate {
    pub(super) algo: Algo,
    pub(super) math: sys::cudnnMathType_t,
    pub(super) workspace: usize,
    pub(super) time_ms: Option<f32>,
}

impl Candidate {
    /// The same algorithm under the same math (times and workspaces aside).
    pub(super) fn same(&self, other: &Candidate) -> bool {
        self.algo == other.algo && self.math == other.math
    }
}

/// An owned cuDNN tensor descriptor.
pub(super) struct TensorDesc(pub(super) sys::cudnnTensorDescriptor_t);
/// An owned cuDNN filter descriptor.
pub(super) struct FilterDesc(pub(super) sys::cudnnFilterDescriptor_t);
/// An owned cuDNN convolution descriptor.
pub(super) struct ConvDesc(pub(super) sys::cudnnConvolutionDescriptor_t);

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateTensorDescriptor and destroyed once, here.
        let _ = unsafe { sys::cudnnDestroyTensorDescriptor(self.0) };
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateFilterDescriptor and destroyed once, here.
        let _ = unsafe { sys::cudnnDestroyFilterDescriptor(self.0) };
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateConvolutionDescriptor and destroyed once, here.
        let _ = unsafe { sys::cudnnDestroyConvolutionDescriptor(self.0) };
    }
}

/// Descriptors and ranked algorithms of one convolution shape.
pub(super) struct Plan {
    pub(super) x: TensorDesc,
    pub(super) w: FilterDesc,
    pub(super) y: TensorDesc,
    pub(super) conv: ConvDesc,
    /// The algorithms to try, best first: cuDNN's heuristic ranking, or the search's timing
    /// followed by the heuristic candidates it did not time.
    pub(super) candidates: Vec<Candidate>,
    /// True once the search ordered `candidates` (or found it could not run and gave up).
    pub(super) searched: bool,
    /// The candidate the last successful call ran.
    pub(super) chosen: Option<Candidate>,
}

impl Plan {
    /// The raw descriptors, as cuDNN's ranking, sizing and search calls take them.
    pub(super) fn descriptors(&self) -> Descriptors {
        Descriptors {
            x: self.x.0,
            w: self.w.0,
            y: self.y.0,
            conv: self.conv.0,
        }
    }
}

/// A cuDNN handle on one device's compute stream, with its plans (or why cuDNN refused one).
pub(crate) struct Cudnn {
    pub(crate) handle: sys::cudnnHandle_t,
    plans: HashMap<PlanKey, std::result::Result<Plan, String>>,
    /// The graph API's plans, per key and operand alignment (or why none could be had).
    pub(super) graphs: GraphPlans,
    /// The graph engine each key ran last, for keys whose last call took the graph API.
    pub(super) graph_ran: HashMap<PlanKey, GraphChoice>,
    /// The fused attention's plans on this handle (`attention_cudnn`).
    pub(crate) attention: crate::attention_cudnn::Plans,
}

// SAFETY: a cuDNN handle and its descriptors may be used from any thread as long as one thread
// at a time does; every use goes through the `Mutex` that holds this value.
unsafe impl Send for Cudnn {}

impl Drop for Cudnn {
    fn drop(&mut self) {
        self.plans.clear();
        self.graphs.clear();
        self.attention.clear();
        // SAFETY: created by cudnnCreate and destroyed once, here, after its descriptors.
        let _ = unsafe { sys::cudnnDestroy(self.handle) };
    }
}

impl Cudnn {
    /// A handle whose work goes to `backend`'s compute stream (the context is bound).
    fn new(backend: &CudaBackend, op: &'static str, dtype: DType) -> Result<Self> {
        let device = backend.device;
        let dir = load_sublibraries();
        // SAFETY: the library and symbol are present (`available`); no arguments.
        unsafe { sys::cudnnCnnVersionCheck() }.result().map_err(|e| {
            let dir = dir.as_deref().map_or("?".into(), |d| d.display().to_string());
            Error::unsupported(
                op,
                dtype,
                device,
                format!(
                    "cuDNN's convolution library (libcudnn_cnn.so.9 beside {dir}/libcudnn.so) failed to load ({:?}); \
                     install one complete cuDNN 9 and put its lib folder on LD_LIBRARY_PATH",
                    e.0
                ),
            )
        })?;
        let mut handle: sys::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the device's context is bound to this thread.
        unsafe { sys::cudnnCreate(&mut handle) }
            .result()
            .map_err(cudnn_error(device, "cudnnCreate"))?;
        let cudnn = Cudnn {
            handle,
            plans: HashMap::new(),
            graphs: HashMap::new(),
            graph_ran: HashMap::new(),
            attention: Default::default(),
        };
        let stream = backend.compute.cu_stream() as sys::cudaStream_t;
        // SAFETY: a live handle and the backend's compute stream, which outlives the handle (the
        // backend is kept for the process's life by `open`).
        unsafe { sys::cudnnSetStream(cudnn.handle, stream) }
            .result()
            .map_err(cudnn_error(device, "cudnnSetStream"))?;
        Ok(cudnn)
    }

    /// The plan for `key`, built and ranked by cuDNN's heuristics on first use; a refusal is
    /// kept too, and reported as `Unsupported` with cuDNN's reason.
    pub(super) fn plan(&mut self, device: Device, key: &PlanKey) -> Result<&mut Plan> {
        if !self.plans.contains_key(key) {
            if self.plans.len() >= MAX_PLANS {
                self.plans.clear();
                self.graphs.clear();
                self.graph_ran.clear();
            }
            let plan = self.build(device, key).map_err(|e| e.to_string());
            if let Err(reason) = &plan {
                tracing::debug!(%device, ?key, %reason, "cuDNN refused this convolution");
            }
            self.plans.insert(key.clone(), plan);
        }
        match self.plans.get_mut(key) {
            Some(Ok(plan)) => Ok(plan),
            Some(Err(reason)) => Err(Error::unsupported(
                key.pass.op(),
                key.dtype,
                device,
                format!(
                    "cuDNN refused input {:?} with strides {:?}, output strides {:?}, weight {:?}, (padding, stride, \
                     dilation) {:?}, groups {}: {reason}",
                    key.x_dims, key.x_strides, key.y_strides, key.w_dims, key.window, key.groups
                ),
            )),
            None => Err(Error::invalid(key.pass.op(), "cuDNN plan cache lost an entry")),
        }
    }

    fn build(&self, device: Device, key: &PlanKey) -> Result<Plan> {
        let err = |op| cudnn_error(device, op);
        let (storage, accumulation) = data_type(key.dtype)
            .ok_or_else(|| Error::unsupported(key.pass.op(), key.dtype, device, "cuDNN convolves floats"))?;
        let [n, _, _, _] = key.x_dims;
        let [o, _, _, _] = key.w_dims;
        let [ph, pw, sh, sw, dh, dw] = key.window;
        // Output [N, O, OH, OW] as in core's rule (validated before launch).
        let out_size = |size: c_int, k: c_int, p: c_int, s: c_int, d: c_int| (size + 2 * p - d * (k - 1) - 1) / s + 1;
        let oh = out_size(key.x_dims[2], key.w_dims[2], ph, sh, dh);
        let ow = out_size(key.x_dims[3], key.w_dims[3], pw, sw, dw);
        let y_dims = [n, o, oh, ow];

        let mut raw: sys::cudnnTensorDescriptor_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { sys::cudnnCreateTensorDescriptor(&mut raw) }
            .result()
            .map_err(err("cudnnCreateTensorDescriptor"))?;
        let x = TensorDesc(raw);
        // SAFETY: a live descriptor; dims and strides are 4-element arrays.
        unsafe { sys::cudnnSetTensorNdDescriptor(x.0, storage, 4, key.x_dims.as_ptr(), key.x_strides.as_ptr()) }
            .result()
            .map_err(err("cudnnSetTensorNdDescriptor (input)"))?;
        let mut raw: sys::cudnnTensorDescriptor_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { sys::cudnnCreateTensorDescriptor(&mut raw) }
            .result()
            .map_err(err("cudnnCreateTensorDescriptor"))?;
        let y = TensorDesc(raw);
        // SAFETY: a live descriptor; dims and strides are 4-element arrays.
        unsafe { sys::cudnnSetTensorNdDescriptor(y.0, storage, 4, y_dims.as_ptr(), key.y_strides.as_ptr()) }
            .result()
            .map_err(err("cudnnSetTensorNdDescriptor (output)"))?;
        let mut raw: sys::cudnnFilterDescriptor_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { sys::cudnnCreateFilterDescriptor(&mut raw) }
            .result()
            .map_err(err("cudnnCreateFilterDescriptor"))?;
        let w = FilterDesc(raw);
        let [k, c, r, s] = key.w_dims;
        // SAFETY: a live descriptor.
        unsafe {
            sys::cudnnSetFilter4dDescriptor(w.0, storage, sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW, k, c, r, s)
        }
        .result()
        .map_err(err("cudnnSetFilter4dDescriptor"))?;
        let mut raw: sys::cudnnConvolutionDescriptor_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { sys::cudnnCreateConvolutionDescriptor(&mut raw) }
            .result()
            .map_err(err("cudnnCreateConvolutionDescriptor"))?;
        let conv = ConvDesc(raw);
        // SAFETY: a live descriptor.
        unsafe {
            sys::cudnnSetConvolution2dDescriptor(
                conv.0,
                ph,
                pw,
                sh,
                sw,
                dh,
                dw,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                accumulation,
            )
        }
        .result()
        .map_err(err("cudnnSetConvolution2dDescriptor"))?;
        // SAFETY: a live descriptor.
        unsafe { sys::cudnnSetConvolutionGroupCount(conv.0, key.groups) }
            .result()
            .map_err(err("cudnnSetConvolutionGroupCount"))?;
        let requested = math_from_u32(key.math);
        // SAFETY: a live descriptor.
        unsafe { sys::cudnnSetConvolutionMathType(conv.0, requested) }
            .result()
            .map_err(err("cudnnSetConvolutionMathType"))?;

        let descriptors = Descriptors {
            x: x.0,
            w: w.0,
            y: y.0,
            conv: conv.0,
        };
        let ranked = self.rank(device, key.pass, &descriptors)?;
        let mut candidates = Vec::new();
        for p in ranked {
            if p.status != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                continue;
            }
            // f32 under FMA math must not run on TF32: tensor-op algorithms are left out and the
            // rest run under FMA math; otherwise each runs under the math cuDNN ranked it with.
            let fma = requested == sys::cudnnMathType_t::CUDNN_FMA_MATH;
            let tensor_ops = matches!(
                p.math_type,
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
                    | sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
            );
            if fma && tensor_ops {
                continue;
            }
            let math = if fma { requested } else { p.math_type };
            // SAFETY: a live descriptor.
            unsafe { sys::cudnnSetConvolutionMathType(conv.0, math) }
                .result()
                .map_err(err("cudnnSetConvolutionMathType"))?;
            if let Some(workspace) = workspace_size(self.handle, &descriptors, p.algo) {
                candidates.push(Candidate {
                    algo: p.algo,
                    math,
                    workspace,
                    time_ms: None,
                });
            }
        }
        if candidates.is_empty() {
            return Err(Error::unsupported(
                key.pass.op(),
                key.dtype,
                device,
                format!(
                    "cuDNN has no {:?} algorithm for input {:?} (strides {:?}), weight {:?}, window {:?}, groups {}",
                    key.pass, key.x_dims, key.x_strides, key.w_dims, key.window, key.groups
                ),
            ));
        }
        tracing::debug!(%device, ?key, ?candidates, "cuDNN conv2d plan");
        Ok(Plan {
            x,
            w,
            y,
            conv,
            candidates,
            searched: false,
            chosen: None,
        })
    }
}

/// The raw descriptors of a plan, as the ranking, sizing and search calls take them.
pub(super) struct Descriptors {
    pub(super) x: sys::cudnnTensorDescriptor_t,
    pub(super) w: sys::cudnnFilterDescriptor_t,
    pub(super) y: sys::cudnnTensorDescriptor_t,
    pub(super) conv: sys::cudnnConvolutionDescriptor_t,
}

/// One entry of cuDNN's ranking, whatever the pass.
struct Ranked {
    algo: Algo,
    status: sys::cudnnStatus_t,
    math_type: sys::cudnnMathType_t,
}

/// Every algorithm cuDNN ranks for one pass, best first, through the pass's `_v7` heuristic
/// (`$get`) and its perf struct (`$perf`), each entry mapped into [`Algo`] by `$wrap`.
macro_rules! rank_with {
    ($handle:expr, $get:ident, $perf:ty, $count:expr, $wrap:path, $a:expr, $b:expr, $c:expr, $d:expr, $err:expr) => {{
        const COUNT: usize = $count as usize;
        // SAFETY: a plain C struct of enums and numbers, for which all-zero bytes are valid
        // (status 0 is success, algorithm 0 exists in every pass); cuDNN overwrites the ones
        // it returns.
        let mut perf: [$perf; COUNT] = unsafe { std::mem::zeroed() };
        let mut returned: c_int = 0;
        // SAFETY: live handle and descriptors of this plan; `perf` holds COUNT results.
        unsafe {
            sys::$get(
                $handle,
                $a,
                $b,
                $c,
                $d,
                COUNT as c_int,
                &mut returned,
                perf.as_mut_ptr(),
            )
        }
        .result()
        .map_err($err(stringify!($get)))?;
        perf.iter()
            .take((returned.max(0) as usize).min(COUNT))
            .map(|p| Ranked {
                algo: $wrap(p.algo),
                status: p.status,
                math_type: p.mathType,
            })
            .collect::<Vec<Ranked>>()
    }};
}

impl Cudnn {
    /// cuDNN's ranking of the algorithms of `pass` for the descriptors.
    fn rank(&self, device: Device, pass: Pass, d: &Descriptors) -> Result<Vec<Ranked>> {
        let err = |op| cudnn_error(device, op);
        Ok(match pass {
            Pass::Forward => rank_with!(
                self.handle,
                cudnnGetConvolutionForwardAlgorithm_v7,
                sys::cudnnConvolutionFwdAlgoPerf_t,
                sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                Algo::Forward,
                d.x,
                d.w,
                d.conv,
                d.y,
                err
            ),
            Pass::BackwardData => rank_with!(
                self.handle,
                cudnnGetConvolutionBackwardDataAlgorithm_v7,
                sys::cudnnConvolutionBwdDataAlgoPerf_t,
                sys::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                Algo::Data,
                d.w,
                d.y,
                d.conv,
                d.x,
                err
            ),
            Pass::BackwardFilter => rank_with!(
                self.handle,
                cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                sys::cudnnConvolutionBwdFilterAlgoPerf_t,
                sys::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                Algo::Filter,
                d.x,
                d.y,
                d.conv,
                d.w,
                err
            ),
        })
    }
}

/// The workspace `algo` needs under the convolution descriptor's current math type, or `None`
/// when cuDNN will not size it (the algorithm is then left out).
pub(super) fn workspace_size(handle: sys::cudnnHandle_t, d: &Descriptors, algo: Algo) -> Option<usize> {
    let mut bytes = 0usize;
    // SAFETY: a live handle and live descriptors of one plan; `bytes` is a valid out-pointer.
    let status = unsafe {
        match algo {
            Algo::Forward(a) => {
                sys::cudnnGetConvolutionForwardWorkspaceSize(handle, d.x, d.w, d.conv, d.y, a, &mut bytes)
            }
            Algo::Data(a) => {
                sys::cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w, d.y, d.conv, d.x, a, &mut bytes)
            }
            Algo::Filter(a) => {
                sys::cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x, d.y, d.conv, d.w, a, &mut bytes)
            }
        }
    };
    status.result().ok().map(|()| bytes)
}

/// The `cudnnMathType_t` of a [`PlanKey`]'s number.
pub(super) fn math_from_u32(v: u32) -> sys::cudnnMathType_t {
    use sys::cudnnMathType_t::*;
    match v {
        1 => CUDNN_TENSOR_OP_MATH,
        2 => CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        3 => CUDNN_FMA_MATH,
        _ => CUDNN_DEFAULT_MATH,
    }
}

/// Every device's cuDNN handle (with its plans).
type Handles = Mutex<HashMap<Device, Arc<Mutex<Cudnn>>>>;

fn handles() -> &'static Handles {
    static HANDLES: OnceLock<Handles> = OnceLock::new();
    HANDLES.get_or_init(Default::default)
}

/// The device's cuDNN handle, created on first use.
pub(crate) fn handle(backend: &CudaBackend, op: &'static str, dtype: DType) -> Result<Arc<Mutex<Cudnn>>> {
    let mut handles = handles().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = handles.get(&backend.device) {
        return Ok(h.clone());
    }
    let h = Arc::new(Mutex::new(Cudnn::new(backend, op, dtype)?));
    handles.insert(backend.device, h.clone());
    Ok(h)
}

/// The device's cuDNN handle if one was created.
pub(crate) fn existing(device: Device) -> Option<Arc<Mutex<Cudnn>>> {
    handles()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&device)
        .cloned()
}

/// What each plan of `device` that has run chose, sorted by pass and key (none before the first
/// convolution).
pub(super) fn choices(device: Device) -> Vec<ConvAlgorithmChoice> {
    let Some(cudnn) = existing(device) else {
        return Vec::new();
    };
    let cudnn = cudnn.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<(PlanSort, ConvAlgorithmChoice)> = cudnn
        .plans
        .iter()
        .filter(|(key, _)| !cudnn.graph_ran.contains_key(key))
        .filter_map(|(key, plan)| {
            let chosen = plan.as_ref().ok()?.chosen?;
            let searched = plan.as_ref().ok()?.searched && chosen.time_ms.is_some();
            Some((sort_key(key), choice_of(key, &chosen, searched)))
        })
        .collect();
    out.extend(
        cudnn
            .graph_ran
            .iter()
            .map(|(key, ran)| (sort_key(key), graph_choice_of(key, ran))),
    );
    out.sort_by_key(|a| a.0);
    out.into_iter().map(|(_, c)| c).collect()
}

/// The order of [`choices`]: pass, then the key's numbers.
type PlanSort = (
    Pass,
    DType,
    bool,
    u32,
    [c_int; 4],
    [c_int; 4],
    [c_int; 4],
    [c_int; 4],
    [c_int; 6],
    c_int,
);

fn sort_key(k: &PlanKey) -> PlanSort {
    (
        k.pass,
        k.dtype,
        k.benchmark,
        k.math,
        k.x_dims,
        k.x_strides,
        k.w_dims,
        k.y_strides,
        k.window,
        k.groups,
    )
}

/// The public report of the graph engine `ran` for `key`.
fn graph_choice_of(key: &PlanKey, ran: &GraphChoice) -> ConvAlgorithmChoice {
    let mut choice = report_of(key);
    choice.api = ConvApi::Graph;
    choice.algorithm = ran.engine.name();
    choice.math = if ran.engine.tensor_cores() {
        super::choice::GRAPH_TENSOR_CORES
    } else {
        super::choice::GRAPH_NO_TENSOR_CORES
    }
    .into();
    choice.workspace_bytes = ran.workspace;
    choice.searched = ran.time_ms.is_some();
    choice.search_ms = ran.time_ms;
    choice
}

/// The public report of `chosen` for `key`.
fn choice_of(key: &PlanKey, chosen: &Candidate, searched: bool) -> ConvAlgorithmChoice {
    ConvAlgorithmChoice {
        algorithm: chosen.algo.name(),
        math: format!("{:?}", chosen.math),
        workspace_bytes: chosen.workspace,
        searched,
        search_ms: if searched { chosen.time_ms } else { None },
        ..report_of(key)
    }
}

/// The report's fields that come from `key` alone (a legacy entry with no algorithm yet).
fn report_of(key: &PlanKey) -> ConvAlgorithmChoice {
    let four = |v: [c_int; 4]| v.map(|x| x.max(0) as usize);
    let [ph, pw, sh, sw, dh, dw] = key.window.map(|x| x.max(0) as usize);
    ConvAlgorithmChoice {
        pass: key.pass,
        dtype: key.dtype,
        input: four(key.x_dims),
        input_strides: four(key.x_strides),
        weight: four(key.w_dims),
        output_strides: four(key.y_strides),
        padding: [ph, pw],
        stride: [sh, sw],
        dilation: [dh, dw],
        groups: key.groups.max(0) as usize,
        api: ConvApi::Legacy,
        algorithm: String::new(),
        math: String::new(),
        workspace_bytes: 0,
        searched: false,
        search_ms: None,
    }
}

/// The candidate's call on the handle's stream: `cudnnConvolutionForward` (reads `x`, `w`,
/// writes `y`), `cudnnConvolutionBackwardData` (reads `y` and `w`, writes `x`) or
/// `cudnnConvolutionBackwardFilter` (reads `x` and `y`, writes `w`), overwriting (beta 0).
#[allow(clippy::too_many_arguments)]
pub(super) fn execute(
    device: Device,
    handle: sys::cudnnHandle_t,
    plan: &Plan,
    candidate: &Candidate,
    x: &TensorArg,
    w: &TensorArg,
    y: &TensorArg,
    workspace: Option<&Allocation>,
) -> Result<()> {
    let (alpha64, beta64) = (1.0f64, 0.0f64);
    let (alpha32, beta32) = (1.0f32, 0.0f32);
    let (alpha, beta) = if x.dtype == DType::F64 {
        (
            &alpha64 as *const f64 as *const c_void,
            &beta64 as *const f64 as *const c_void,
        )
    } else {
        (
            &alpha32 as *const f32 as *const c_void,
            &beta32 as *const f32 as *const c_void,
        )
    };
    let (ws_addr, ws_bytes) = match workspace {
        Some(block) => (block.slice().addr() as *mut c_void, candidate.workspace),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: a live descriptor of this plan.
    unsafe { sys::cudnnSetConvolutionMathType(plan.conv.0, candidate.math) }
        .result()
        .map_err(cudnn_error(device, "cudnnSetConvolutionMathType"))?;
    let (xp, wp, yp) = (
        device_ptr(x) as *mut c_void,
        device_ptr(w) as *mut c_void,
        device_ptr(y) as *mut c_void,
    );
    // SAFETY: (all three calls) the descriptors describe `x` and `y` (their real strides, within
    // their validated buffers) and `w` (dense [O, C/g, kh, kw]), all live blocks of this device;
    // only the pass's output is written, and it is dense and apart from the inputs (validated);
    // the workspace is a live block of the size cuDNN asked for; alpha/beta are host scalars of
    // the accumulation type that outlive the call; the call is queued on the compute stream (the
    // handle's) after the operands' earlier users (the caller ordered it).
    let (status, name) = unsafe {
        match candidate.algo {
            Algo::Forward(algo) => (
                sys::cudnnConvolutionForward(
                    handle,
                    alpha,
                    plan.x.0,
                    xp,
                    plan.w.0,
                    wp,
                    plan.conv.0,
                    algo,
                    ws_addr,
                    ws_bytes,
                    beta,
                    plan.y.0,
                    yp,
                ),
                "cudnnConvolutionForward",
            ),
            Algo::Data(algo) => (
                sys::cudnnConvolutionBackwardData(
                    handle,
                    alpha,
                    plan.w.0,
                    wp,
                    plan.y.0,
                    yp,
                    plan.conv.0,
                    algo,
                    ws_addr,
                    ws_bytes,
                    beta,
                    plan.x.0,
                    xp,
                ),
                "cudnnConvolutionBackwardData",
            ),
            Algo::Filter(algo) => (
                sys::cudnnConvolutionBackwardFilter(
                    handle,
                    alpha,
                    plan.x.0,
                    xp,
                    plan.y.0,
                    yp,
                    plan.conv.0,
                    algo,
                    ws_addr,
                    ws_bytes,
                    beta,
                    plan.w.0,
                    wp,
                ),
                "cudnnConvolutionBackwardFilter",
            ),
        }
    };
    status.result().map_err(cudnn_error(device, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn math_types_round_trip_through_the_key() {
        use sys::cudnnMathType_t::*;
        for m in [
            CUDNN_DEFAULT_MATH,
            CUDNN_TENSOR_OP_MATH,
            CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            CUDNN_FMA_MATH,
        ] {
            assert_eq!(math_from_u32(m as u32), m);
        }
    }
}
