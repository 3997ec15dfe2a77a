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

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self, cublasComputeType_t, cublasLtMatmulAlgo_t, cublasLtMatmulDescAttributes_t as DescAttr,
    cublasLtMatmulPreferenceAttributes_t as PrefAttr, cublasStatus_t, cudaDataType,
};
use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUresult;
use tensortune_kernels::{DType, Matmul};

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

    /// Describes `w` to cuBLASLt as `blas` describes it to `cublasGemmEx`.
    pub(crate) fn plan(&self, w: &Matmul) -> Result<Plan<'_>, String> {
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
        let [a, b, d] = stored(w);
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
        p.a = layout(data_type(w.types.input), a)?;
        p.b = layout(data_type(w.types.input), b)?;
        p.d = layout(data_type(w.types.output), d)?;
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

/// A matrix as stored, column-major: rows, columns, leading dimension.
type Stored = (u64, u64, u64);

/// A, B and D as stored (before op): `blas::Ops`'s transposes and leading dimensions.
fn stored(w: &Matmul) -> [Stored; 3] {
    let ops = Ops::of(w);
    let a = if ops.a_t { (w.k, w.m, ops.lda) } else { (w.m, w.k, ops.lda) };
    let b = if ops.b_t { (w.n, w.k, ops.ldb) } else { (w.k, w.n, ops.ldb) };
    [a, b, (w.m, w.n, w.m)]
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
        assert_eq!(stored(&matmul(Layout::Nn)), [(64, 32, 64), (32, 48, 32), d]);
        assert_eq!(stored(&matmul(Layout::Nt)), [(64, 32, 64), (48, 32, 48), d]);
        assert_eq!(stored(&matmul(Layout::Tn)), [(32, 64, 32), (32, 48, 32), d]);
        assert_eq!(stored(&matmul(Layout::Tt)), [(32, 64, 32), (48, 32, 48), d]);
        assert_eq!(Ops::of(&matmul(Layout::Tn)), Ops { a_t: true, lda: 32, b_t: false, ldb: 32 });
        assert_eq!(Ops::of(&matmul(Layout::Nt)), Ops { a_t: false, lda: 64, b_t: true, ldb: 48 });
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
