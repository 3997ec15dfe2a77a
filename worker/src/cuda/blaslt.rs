//! cuBLASLt's side of the matmul baseline: the algorithms `cublasLtMatmulAlgoGetHeuristic`
//! proposes for the workload (up to [`MAX_CANDIDATES`]), each run by `cublasLtMatmul` on the
//! same buffers as `cublasGemmEx` (`blas`), with the same operands, compute type and scalars:
//! D = alpha op(A) op(B) + beta D, C and D one buffer with one layout. The executor cross-checks
//! and times every candidate as it does gemmEx, and the baseline is the fastest of them all.
//!
//! cudarc loads `libcublasLt.so`; its loader panics when the library is missing, so [`Lt::new`]
//! looks for it first and reports its absence as an error (the baseline is then gemmEx alone).
//! Heuristic results are read through [`HeuristicRow`], with the status as an integer, so a
//! status the bindings lack cannot become an invalid enum.
//!
//! [`Candidate::describe`] reads what an algorithm is (`cublasLtMatmulAlgoConfigGetAttribute`:
//! tile, stages, cluster shape, split-K and its reduction, swizzle), so that a record can say
//! which algorithm the vendor ran, and a user can see what a space that lost to it lacks.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self, cublasComputeType_t, cublasLtClusterShape_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulAlgoConfigAttributes_t as AlgoAttr, cublasLtMatmulDescAttributes_t as DescAttr,
    cublasLtMatmulPreferenceAttributes_t as PrefAttr, cublasLtMatmulStages_t, cublasLtMatmulTile_t, cublasStatus_t,
    cudaDataType,
};
use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUresult;
use tensortune_kernels::{Activation, DType, InputScale, Matmul};

use super::blas::{Ops, Scalars, operation};
use super::device::{CudaFailure, DevBuf};

/// The most heuristic results asked for.
pub(crate) const MAX_CANDIDATES: usize = 8;
/// cuBLASLt's workspace, offered to every candidate: allocated once, so that no allocation
/// happens while a graph is captured.
const WORKSPACE_BYTES: usize = 32 << 20;

/// One row of `cublasLtMatmulAlgoGetHeuristic`'s answer: `cublasLtMatmulHeuristicResult_t` with
/// its status read as an integer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct HeuristicRow {
    algo: [u64; 8],
    workspace_bytes: usize,
    state: u32,
    waves: f32,
    reserved: [c_int; 4],
}

const _: () = assert!(size_of::<HeuristicRow>() == size_of::<sys::cublasLtMatmulHeuristicResult_t>());
const _: () = assert!(align_of::<HeuristicRow>() == align_of::<sys::cublasLtMatmulHeuristicResult_t>());
const _: () = assert!(size_of::<[u64; 8]>() == size_of::<cublasLtMatmulAlgo_t>());

/// One algorithm cuBLASLt proposes for a [`Plan`]; valid only with that plan.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Candidate {
    algo: cublasLtMatmulAlgo_t,
    /// Workspace it needs, bytes (at most [`WORKSPACE_BYTES`]).
    pub(crate) workspace_bytes: usize,
    /// cuBLASLt's estimate of the waves of blocks it runs on the GPU.
    pub(crate) waves: f32,
}

impl Candidate {
    /// What cuBLASLt says this algorithm is, as `algo=ID tile=MxNxK stages=S cluster=XxYxZ
    /// splitk=N [reduction=R] swizzle=0|1`, each attribute left out when the library does not
    /// report it (an older cuBLASLt has no cluster shape), e.g. `algo=66 tile=128x64x64 stages=4
    /// cluster=1x1x1 splitk=1 swizzle=0`. The tile's K is its stages' (cuBLASLt names a stage
    /// configuration KxS). Runs nothing on the GPU.
    pub(crate) fn describe(&self) -> String {
        let attr = |a| config_attribute(&self.algo, a);
        let mut parts = Vec::new();
        if let Some(id) = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_ID) {
            parts.push(format!("algo={}", id as i32));
        }
        let tile = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_TILE_ID).and_then(tile_name);
        let stages = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_STAGES_ID).and_then(stages_name);
        // A stage configuration is named KxS (K of the tile, S stages) or KxAUTO.
        let (k, depth) = match stages.as_deref().and_then(|s| s.split_once('x')) {
            Some((k, depth)) => (Some(k.to_owned()), Some(depth.to_lowercase())),
            None => (None, stages),
        };
        match (tile, k) {
            (Some(tile), Some(k)) => parts.push(format!("tile={tile}x{k}")),
            (Some(tile), None) => parts.push(format!("tile={tile}")),
            _ => {}
        }
        if let Some(depth) = depth {
            parts.push(format!("stages={depth}"));
        }
        if let Some(cluster) = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID).and_then(cluster_name) {
            parts.push(format!("cluster={cluster}"));
        }
        if let Some(splits) = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_SPLITK_NUM) {
            let splits = splits as i32;
            parts.push(format!("splitk={splits}"));
            if splits > 1
                && let Some(scheme) = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)
            {
                parts.push(format!("reduction={}", reduction_name(scheme)));
            }
        }
        if let Some(swizzle) = attr(AlgoAttr::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) {
            parts.push(format!("swizzle={swizzle}"));
        }
        parts.join(" ")
    }
}

/// One attribute of an algorithm's configuration as an unsigned integer of its size (1 to 8
/// bytes, as the library says when asked with an empty buffer); `None` when the library does not
/// know the attribute.
fn config_attribute(algo: &cublasLtMatmulAlgo_t, attr: AlgoAttr) -> Option<u64> {
    let mut size = 0usize;
    // SAFETY: `algo` is a live algorithm from this library's heuristic; with a size of 0 and a
    // null buffer the call only writes the size the attribute needs into `size`.
    let status = unsafe { sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, ptr::null_mut(), 0, &mut size) };
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS || !(1..=8).contains(&size) {
        return None;
    }
    let mut buf = [0u8; 8];
    let mut written = 0usize;
    // SAFETY: `buf` has room for the `size` (at most 8) bytes asked for; `written` is a valid
    // out-pointer.
    let status = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, buf.as_mut_ptr().cast::<c_void>(), size, &mut written)
    };
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS || written != size {
        return None;
    }
    Some(match size {
        1 => u64::from(buf[0]),
        2 => u64::from(u16::from_ne_bytes([buf[0], buf[1]])),
        4 => u64::from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]])),
        8 => u64::from_ne_bytes(buf),
        _ => return None,
    })
}

// The enums below are read from integers the library returns. In the bindings built here (cudarc
// 0.19.10, cuda-13000) each declares every value from 0 to its END but those named in the
// functions below (checked against the bindings' source when this was written); a change of
// bindings that moves an END fails these assertions, and the gaps must be checked again.
const TILE_END: u32 = 635;
const STAGES_END: u32 = 39;
const CLUSTER_END: u32 = 52;
const _: () = assert!(cublasLtMatmulTile_t::CUBLASLT_MATMUL_TILE_END as u32 == TILE_END);
const _: () = assert!(cublasLtMatmulStages_t::CUBLASLT_MATMUL_STAGES_END as u32 == STAGES_END);
const _: () = assert!(cublasLtClusterShape_t::CUBLASLT_CLUSTER_SHAPE_END as u32 == CLUSTER_END);

/// A tile id as cuBLASLt names it (`128x256`); `None` for undefined or unknown ids.
fn tile_name(id: u64) -> Option<String> {
    let id = u32::try_from(id).ok().filter(|&id| id > 0 && id < TILE_END)?;
    // SAFETY: `cublasLtMatmulTile_t` is `repr(u32)` and declares every value in 1..TILE_END.
    let tile: cublasLtMatmulTile_t = unsafe { std::mem::transmute::<u32, cublasLtMatmulTile_t>(id) };
    Some(format!("{tile:?}").trim_start_matches("CUBLASLT_MATMUL_TILE_").to_owned())
}

/// A stages id as cuBLASLt names it (`64x4`: K 64, 4 stages; `64xAUTO`); `None` for undefined
/// or unknown ids.
fn stages_name(id: u64) -> Option<String> {
    let id = u32::try_from(id).ok().filter(|&id| id > 0 && id < STAGES_END && id != 29 && id != 30)?;
    // SAFETY: `cublasLtMatmulStages_t` is `repr(u32)` and declares every value in 1..STAGES_END
    // but 29 and 30, excluded above.
    let stages: cublasLtMatmulStages_t = unsafe { std::mem::transmute::<u32, cublasLtMatmulStages_t>(id) };
    Some(format!("{stages:?}").trim_start_matches("CUBLASLT_MATMUL_STAGES_").to_owned())
}

/// A cluster shape id as cuBLASLt names it (`2x1x1`, `auto`); `None` for unknown ids.
fn cluster_name(id: u64) -> Option<String> {
    let id = u32::try_from(id).ok().filter(|&id| id < CLUSTER_END && id != 1)?;
    // SAFETY: `cublasLtClusterShape_t` is `repr(u32)` and declares every value in 0..CLUSTER_END
    // but 1, excluded above.
    let shape: cublasLtClusterShape_t = unsafe { std::mem::transmute::<u32, cublasLtClusterShape_t>(id) };
    Some(format!("{shape:?}").trim_start_matches("CUBLASLT_CLUSTER_SHAPE_").to_lowercase())
}

/// A split-K reduction scheme (`cublasLtReductionScheme_t`, a bit mask) by name.
fn reduction_name(scheme: u64) -> String {
    match scheme {
        0 => "none".into(),
        1 => "inplace".into(),
        2 => "compute_type".into(),
        4 => "output_type".into(),
        n => format!("{n:#x}"),
    }
}

/// A cuBLASLt handle, with the measuring stream it enqueues on and its workspace.
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    workspace: DevBuf,
}

impl Lt {
    /// Loads cuBLASLt (an error, not a panic, when it is missing) and creates a handle for work
    /// on `stream`, with a fixed workspace.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Lt, String> {
        // SAFETY: only tries to dlopen libcublasLt by its candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err("cuBLASLt (libcublasLt.so) was not found".into());
        }
        let ctx = stream.context();
        let workspace = DevBuf::new(ctx, WORKSPACE_BYTES).map_err(|e| e.to_string())?;
        ctx.bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate failed: {e:?}"))?;
        // SAFETY: cublasLtGetVersion has no preconditions.
        let version = unsafe { sys::cublasLtGetVersion() };
        tracing::debug!(version, "cuBLASLt loaded");
        Ok(Lt { handle, stream: stream.clone(), workspace })
    }

    /// Describes `w` to cuBLASLt as `blas` describes it to `cublasGemmEx`, with its fused
    /// epilogue and FP8 input scales when `fused` gives their device buffers (see [`Fused`]).
    pub(crate) fn plan(&self, w: &Matmul, fused: Option<Fused>) -> Result<Plan<'_>, String> {
        self.plan_ld(w, fused, w.m)
    }

    /// [`Lt::plan`] with D's (and an M-contiguous A's) leading dimension `ld_m`: one group of a
    /// grouped matmul inside its packed operands. A batched `w` gets its batch count and
    /// contiguous strides on every layout.
    pub(crate) fn plan_ld(&self, w: &Matmul, fused: Option<Fused>, ld_m: u64) -> Result<Plan<'_>, String> {
        self.stream.context().bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
        let scalars = Scalars::of(w);
        // The compute types of `blas::compute_type`, in cuBLASLt's own binding of the enum.
        let (compute, scale) = match scalars {
            _ if w.types.input == DType::Tf32 => {
                (cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, cudaDataType::CUDA_R_32F)
            }
            Scalars::F32(..) => (cublasComputeType_t::CUBLAS_COMPUTE_32F, cudaDataType::CUDA_R_32F),
            Scalars::F16(..) => (cublasComputeType_t::CUBLAS_COMPUTE_16F, cudaDataType::CUDA_R_16F),
            Scalars::I32(..) => (cublasComputeType_t::CUBLAS_COMPUTE_32I, cudaDataType::CUDA_R_32I),
        };
        let ops = Ops::of(w);
        let [a, b, d] = stored(w, ld_m);
        // Every handle below is destroyed by `Plan::drop`, including when a later call fails.
        let mut p = Plan {
            lt: self,
            desc: ptr::null_mut(),
            a: ptr::null_mut(),
            b: ptr::null_mut(),
            d: ptr::null_mut(),
            pref: ptr::null_mut(),
            scalars,
        };
        p.desc =
            lt::create_matmul_desc(compute, scale).map_err(|e| format!("cublasLtMatmulDescCreate failed: {e:?}"))?;
        p.set_operation(DescAttr::CUBLASLT_MATMUL_DESC_TRANSA, ops.a_t)?;
        p.set_operation(DescAttr::CUBLASLT_MATMUL_DESC_TRANSB, ops.b_t)?;
        if let Some(f) = fused {
            p.fuse(w, f)?;
        }
        p.a = layout(data_type(w.types.input), a)?;
        p.b = layout(data_type(w.types.input), b)?;
        p.d = layout(data_type(w.types.output), d)?;
        if w.batch > 1 {
            for (l, (rows, cols, _)) in [(p.a, a), (p.b, b), (p.d, d)] {
                batch_layout(l, w.batch, rows * cols)?;
            }
        }
        p.pref = lt::create_matmul_pref().map_err(|e| format!("cublasLtMatmulPreferenceCreate failed: {e:?}"))?;
        let max_workspace = WORKSPACE_BYTES as u64;
        // SAFETY: the preference is live; MAX_WORKSPACE_BYTES holds a uint64_t, read from a
        // local that outlives the call.
        unsafe {
            lt::set_matmul_pref_attribute(
                p.pref,
                PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &max_workspace as *const u64 as *const c_void,
                size_of::<u64>(),
            )
        }
        .map_err(|e| format!("cublasLtMatmulPreferenceSetAttribute failed: {e:?}"))?;
        Ok(p)
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, before the stream and workspace it was used
        // with (fields drop after this).
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// A matmul described to cuBLASLt: the operation, the layouts of A, B and C = D, the heuristic's
/// preferences, and the scalars its calls point at.
pub(crate) struct Plan<'a> {
    lt: &'a Lt,
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    /// C and D: one buffer, one layout.
    d: sys::cublasLtMatrixLayout_t,
    pref: sys::cublasLtMatmulPreference_t,
    scalars: Scalars,
}

impl Plan<'_> {
    /// Sets the TRANSA or TRANSB attribute.
    fn set_operation(&self, attr: DescAttr, transposed: bool) -> Result<(), String> {
        let op = operation(transposed) as i32;
        // SAFETY: the descriptor is live; TRANSA and TRANSB hold a cublasOperation_t, an int32_t,
        // read from a local that outlives the call.
        unsafe { lt::set_matmul_desc_attribute(self.desc, attr, &op as *const i32 as *const c_void, size_of::<i32>()) }
            .map_err(|e| format!("cublasLtMatmulDescSetAttribute({attr:?}) failed: {e:?}"))
    }

    /// Sets one attribute of the descriptor from a plain value.
    fn set<T: Copy>(&self, attr: DescAttr, value: &T) -> Result<(), String> {
        // SAFETY: the descriptor is live; every attribute set through here is of T's size and
        // representation (uint32 for the epilogue, int32 for a data type, a device pointer for a
        // pointer attribute), read from a reference that outlives the call.
        unsafe { lt::set_matmul_desc_attribute(self.desc, attr, value as *const T as *const c_void, size_of::<T>()) }
            .map_err(|e| format!("cublasLtMatmulDescSetAttribute({attr:?}) failed: {e:?}"))
    }

    /// The fused epilogue (`CUBLASLT_EPILOGUE_*` with the bias pointer) and the FP8 inputs'
    /// scale pointers. A per-row scale has no cuBLASLt epilogue: [`fusable`] says so first.
    fn fuse(&self, w: &Matmul, f: Fused) -> Result<(), String> {
        use sys::cublasLtEpilogue_t as E;
        let e = &w.epilogue;
        let epilogue = match (e.bias, e.activation) {
            (false, Activation::None) => E::CUBLASLT_EPILOGUE_DEFAULT,
            (false, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU,
            (false, Activation::Gelu) => E::CUBLASLT_EPILOGUE_GELU,
            (true, Activation::None) => E::CUBLASLT_EPILOGUE_BIAS,
            (true, Activation::Relu) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, Activation::Gelu) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
            (_, Activation::GeluErf) => return Err(NO_ERF_GELU.into()),
        };
        self.set(DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE, &(epilogue as u32))?;
        if e.bias {
            self.set(DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &f.bias)?;
            self.set(DescAttr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(data_type(w.types.output) as i32))?;
        }
        if w.input_scale == InputScale::Tensor {
            self.set(DescAttr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &f.a_scale)?;
            self.set(DescAttr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &f.b_scale)?;
        }
        Ok(())
    }

    /// The algorithms cuBLASLt's heuristic proposes, best first by its own estimate; those it
    /// marks as failed or that need more than the workspace are left out. An error when none is
    /// left.
    pub(crate) fn candidates(&self) -> Result<Vec<Candidate>, String> {
        let mut rows = [HeuristicRow::default(); MAX_CANDIDATES];
        let mut count: c_int = 0;
        // SAFETY: the handle, descriptors and preference are live; `rows` has room for the
        // MAX_CANDIDATES results asked for, laid out as cublasLtMatmulHeuristicResult_t (asserted
        // above); `count` is a valid out-pointer. Runs nothing on the GPU.
        let status = unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.lt.handle,
                self.desc,
                self.a,
                self.b,
                self.d,
                self.d,
                self.pref,
                MAX_CANDIDATES as c_int,
                rows.as_mut_ptr().cast::<sys::cublasLtMatmulHeuristicResult_t>(),
                &mut count,
            )
        };
        status.result().map_err(|e| format!("cublasLtMatmulAlgoGetHeuristic failed: {e:?}"))?;
        let returned = &rows[..(count.max(0) as usize).min(MAX_CANDIDATES)];
        let found: Vec<Candidate> = returned
            .iter()
            .filter(|r| r.state == cublasStatus_t::CUBLAS_STATUS_SUCCESS as u32 && r.workspace_bytes <= WORKSPACE_BYTES)
            .map(|r| Candidate {
                algo: cublasLtMatmulAlgo_t { data: r.algo },
                workspace_bytes: r.workspace_bytes,
                waves: r.waves,
            })
            .collect();
        if found.is_empty() {
            return Err(format!(
                "cublasLtMatmulAlgoGetHeuristic proposed no usable algorithm ({} returned)",
                returned.len()
            ));
        }
        Ok(found)
    }

    /// Enqueues D = alpha op(A) op(B) + beta D with `candidate` (one of this plan's) on the
    /// measuring stream. As with `cublasGemmEx`, C is D: with beta != 0 it reads D as C.
    pub(crate) fn matmul(&self, candidate: &Candidate, a: u64, b: u64, d: u64) -> Result<(), CudaFailure> {
        let (alpha, beta) = self.scalars.ptrs();
        let lt = self.lt;
        // SAFETY: a, b, d are live buffers sized for this plan's workload (operand_elements) and
        // described by its layouts; alpha and beta are host pointers of the scale type into
        // `self.scalars`, read during the call; the algorithm came from this plan's heuristic and
        // needs at most the workspace passed, which lives as long as the handle; the stream is
        // the one the handle's owner keeps alive.
        unsafe {
            lt::matmul(
                lt.handle,
                self.desc,
                alpha,
                beta,
                a as *const c_void,
                self.a,
                b as *const c_void,
                self.b,
                d as *const c_void,
                self.d,
                d as *mut c_void,
                self.d,
                &candidate.algo,
                lt.workspace.ptr as *mut c_void,
                WORKSPACE_BYTES,
                lt.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| CudaFailure {
            code: CUresult::CUDA_ERROR_NOT_SUPPORTED,
            context: format!("cublasLtMatmul returned {e:?}"),
        })
    }
}

impl Drop for Plan<'_> {
    fn drop(&mut self) {
        // SAFETY: each handle was created in `Lt::plan` (or is still null) and is destroyed once.
        unsafe {
            if !self.pref.is_null() {
                let _ = lt::destroy_matmul_pref(self.pref);
            }
            for layout in [self.a, self.b, self.d] {
                if !layout.is_null() {
                    let _ = lt::destroy_matrix_layout(layout);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// The device buffers a fused plan points cuBLASLt at: the bias (output type) and the FP8 inputs'
/// f32 scales, each at the start of a buffer of its own (a pointer 4 bytes into one buffer was
/// refused at launch).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fused {
    pub(crate) bias: u64,
    pub(crate) a_scale: u64,
    pub(crate) b_scale: u64,
}

/// Whether cuBLASLt can fuse `w`'s epilogue, or why not: it has bias, ReLU and GELU epilogues
/// and FP8 scale pointers, but no per-row scale beside a host beta that keeps alpha (its
/// ALPHA_DEVICE_VECTOR modes replace alpha and are not offered with every type), so that one
/// runs unfused.
pub(crate) fn fusable(w: &Matmul) -> Result<(), String> {
    if w.epilogue.scale {
        return Err("cuBLASLt has no per-row scale epilogue".into());
    }
    if w.epilogue.activation == Activation::GeluErf {
        return Err(NO_ERF_GELU.into());
    }
    Ok(())
}

/// Why cuBLASLt cannot fuse the exact GELU.
const NO_ERF_GELU: &str = "cuBLASLt has no exact (erf) GELU epilogue, only the tanh form";

/// The name of the `CUBLASLT_EPILOGUE_*` a fused plan of `w` uses.
pub(crate) fn epilogue_name(w: &Matmul) -> &'static str {
    match (w.epilogue.bias, w.epilogue.activation) {
        (false, Activation::None) => "DEFAULT",
        (false, Activation::Relu) => "RELU",
        (false, Activation::Gelu) => "GELU",
        (true, Activation::None) => "BIAS",
        (true, Activation::Relu) => "RELU_BIAS",
        (true, Activation::Gelu) => "GELU_BIAS",
        // Never fused (see `fusable`).
        (false, Activation::GeluErf) => "none (erf GELU)",
        (true, Activation::GeluErf) => "none (BIAS, erf GELU)",
    }
}

/// A matrix as stored, column-major: rows, columns, leading dimension.
type Stored = (u64, u64, u64);

/// A, B and D as stored (before op): `blas::Ops`'s transposes and leading dimensions, with
/// `ld_m` for D's and an M-contiguous A's (the packed M of a grouped matmul; otherwise M).
fn stored(w: &Matmul, ld_m: u64) -> [Stored; 3] {
    let ops = Ops::of(w);
    let a = if ops.a_t { (w.k, w.m, ops.lda) } else { (w.m, w.k, ld_m) };
    let b = if ops.b_t { (w.n, w.k, ops.ldb) } else { (w.k, w.n, ops.ldb) };
    [a, b, (w.m, w.n, ld_m)]
}

/// Sets a layout's batch count and the stride between its matrices (elements).
fn batch_layout(l: sys::cublasLtMatrixLayout_t, batch: u64, stride: u64) -> Result<(), String> {
    let (count, offset) = (batch as i32, stride as i64);
    // SAFETY: the layout is live; BATCH_COUNT holds an int32_t and STRIDED_BATCH_OFFSET an
    // int64_t, each read from a local that outlives the call.
    unsafe {
        lt::set_matrix_layout_attribute(
            l,
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            size_of::<i32>(),
        )
        .and_then(|_| {
            lt::set_matrix_layout_attribute(
                l,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &offset as *const i64 as *const c_void,
                size_of::<i64>(),
            )
        })
    }
    .map_err(|e| format!("cublasLtMatrixLayoutSetAttribute(batch) failed: {e:?}"))
}

fn layout(ty: cudaDataType, (rows, cols, ld): Stored) -> Result<sys::cublasLtMatrixLayout_t, String> {
    lt::create_matrix_layout(ty, rows, cols, ld as i64).map_err(|e| format!("cublasLtMatrixLayoutCreate failed: {e:?}"))
}

/// cuBLASLt's data type for one of ours (as `blas::data_type`, packed types included).
fn data_type(d: DType) -> cudaDataType {
    match d {
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::Bf16 => cudaDataType::CUDA_R_16BF,
        DType::I8 | DType::S4 | DType::U4 | DType::B1Xor | DType::B1And => cudaDataType::CUDA_R_8I,
        DType::F32 | DType::Tf32 => cudaDataType::CUDA_R_32F,
        DType::I32 => cudaDataType::CUDA_R_32I,
        DType::E4m3 => cudaDataType::CUDA_R_8F_E4M3,
        DType::E5m2 => cudaDataType::CUDA_R_8F_E5M2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_kernels::{Layout, Types};

    fn matmul(layout: Layout) -> Matmul {
        Matmul::new(64, 48, 32, layout, Types::new(DType::F16, DType::F32, Some(DType::F32)).unwrap()).unwrap()
    }

    #[test]
    fn operands_are_stored_as_gemm_ex_reads_them() {
        // (m, n, k) = (64, 48, 32); D is always M x N with ld M.
        let d = (64, 48, 64);
        // A M-contiguous: M x K, ld M; K-contiguous: K x M, ld K (op T).
        // B K-contiguous: K x N, ld K; N-contiguous: N x K, ld N (op T).
        assert_eq!(stored(&matmul(Layout::Nn), 64), [(64, 32, 64), (32, 48, 32), d]);
        assert_eq!(stored(&matmul(Layout::Nt), 64), [(64, 32, 64), (48, 32, 48), d]);
        assert_eq!(stored(&matmul(Layout::Tn), 64), [(32, 64, 32), (32, 48, 32), d]);
        assert_eq!(stored(&matmul(Layout::Tt), 64), [(32, 64, 32), (48, 32, 48), d]);
        assert_eq!(Ops::of(&matmul(Layout::Tn)), Ops { a_t: true, lda: 32, b_t: false, ldb: 32 });
        assert_eq!(Ops::of(&matmul(Layout::Nt)), Ops { a_t: false, lda: 64, b_t: true, ldb: 48 });
    }

    #[test]
    fn algorithm_ids_are_named_as_cublaslt_names_them() {
        assert_eq!(tile_name(23).as_deref(), Some("128x256"));
        assert_eq!(tile_name(18).as_deref(), Some("128x64"));
        assert_eq!((tile_name(0), tile_name(u64::from(TILE_END)), tile_name(1 << 40)), (None, None, None));
        assert_eq!(stages_name(16).as_deref(), Some("64x4"));
        assert_eq!(stages_name(35).as_deref(), Some("64xAUTO"));
        assert_eq!((stages_name(0), stages_name(29), stages_name(30), stages_name(99)), (None, None, None, None));
        assert_eq!(cluster_name(3).as_deref(), Some("2x1x1"));
        assert_eq!(cluster_name(0).as_deref(), Some("auto"));
        assert_eq!((cluster_name(1), cluster_name(u64::from(CLUSTER_END))), (None, None));
        assert_eq!((reduction_name(1), reduction_name(6)), ("inplace".to_string(), "0x6".to_string()));
    }

    #[test]
    fn the_exact_gelu_is_never_fused_and_says_why() {
        let mut w = matmul(Layout::Tn);
        w.epilogue = "bias+gelu".parse().unwrap();
        assert_eq!((fusable(&w), epilogue_name(&w)), (Ok(()), "GELU_BIAS"));
        w.epilogue = "bias+gelu_erf".parse().unwrap();
        assert!(fusable(&w).unwrap_err().contains("no exact (erf) GELU"), "{:?}", fusable(&w));
        // The rest of its epilogue is what the baseline fuses before the elementwise GELU.
        w.epilogue.activation = Activation::None;
        assert_eq!((fusable(&w), epilogue_name(&w)), (Ok(()), "BIAS"));
    }

    #[test]
    fn scalars_take_the_scale_type() {
        let mut w = matmul(Layout::Tn);
        (w.alpha, w.beta) = (2.0, 0.5);
        assert!(matches!(Scalars::of(&w), Scalars::F32(2.0, 0.5)));
        w.types = Types::new(DType::F16, DType::F16, None).unwrap();
        assert!(matches!(Scalars::of(&w), Scalars::F16(a, b) if a.to_f32() == 2.0 && b.to_f32() == 0.5));
        w.types = Types::new(DType::I8, DType::I32, None).unwrap();
        (w.alpha, w.beta) = (1.0, 1.0);
        assert!(matches!(Scalars::of(&w), Scalars::I32(1, 1)));
    }
}
