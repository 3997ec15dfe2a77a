//! The vendor baseline for matmul: `cublasGemmEx` with the workload's types, layout and epilogue,
//! on the same buffers, timed by the same graph replay as our kernels. cuBLASLt's candidates
//! (`blaslt`) run the same operands with the same scalars, and the baseline is the fastest.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{self, cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::CudaStream;
use tensortune_kernels::{DType, Matmul};

use super::device::{CudaFailure, DevBuf};

/// cuBLAS's workspace: set explicitly so that no allocation happens while a graph is captured.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLAS handle bound to the measuring stream.
pub(crate) struct Blas {
    handle: sys::cublasHandle_t,
    _workspace: DevBuf,
    /// The device arrays of A, B and D pointers of `cublasGemmGroupedBatchedEx`, per workload
    /// and operands, made by the first call with them (a warm-up or check, outside any graph).
    grouped: super::grouped::PointerArrays,
}

/// The epilogue scalars, in the type the compute type wants them in (cuBLAS's scale type): f32
/// for f32 accumulation, f16 for f16, i32 for integer accumulation. cuBLASLt (`blaslt`) uses
/// the same.
pub(super) enum Scalars {
    F32(f32, f32),
    F16(half::f16, half::f16),
    I32(i32, i32),
}

impl Scalars {
    /// The workload's alpha and beta, converted to its scale type.
    pub(super) fn of(w: &Matmul) -> Scalars {
        match w.types.accumulator {
            DType::F32 => Scalars::F32(w.alpha as f32, w.beta as f32),
            DType::F16 => Scalars::F16(half::f16::from_f64(w.alpha), half::f16::from_f64(w.beta)),
            _ => Scalars::I32(w.alpha as i32, w.beta as i32),
        }
    }

    /// Host pointers to alpha and beta, valid while `self` is.
    pub(super) fn ptrs(&self) -> (*const c_void, *const c_void) {
        match self {
            Scalars::F32(a, b) => (a as *const f32 as _, b as *const f32 as _),
            Scalars::F16(a, b) => (a as *const half::f16 as _, b as *const half::f16 as _),
            Scalars::I32(a, b) => (a as *const i32 as _, b as *const i32 as _),
        }
    }
}

/// The operands as BLAS (column-major) sees them: whether A and B are transposed, and their
/// leading dimensions. D is M x N with leading dimension M (a grouped matmul's packed M: each
/// group is the rows of A and D at its offset, see `grouped::group_part`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ops {
    /// op(A) = A^T: A is stored K x M (K contiguous).
    pub(super) a_t: bool,
    pub(super) lda: u64,
    /// op(B) = B^T: B is stored N x K (N contiguous).
    pub(super) b_t: bool,
    pub(super) ldb: u64,
}

impl Ops {
    pub(super) fn of(w: &Matmul) -> Ops {
        let (a_t, lda) = if w.layout.a_k_contiguous() { (true, w.k) } else { (false, w.m) };
        let (b_t, ldb) = if w.layout.b_k_contiguous() { (false, w.k) } else { (true, w.n) };
        Ops { a_t, lda, b_t, ldb }
    }
}

/// The compute type of a workload's vendor GEMM: exact f32 for f32 (`CUBLAS_COMPUTE_32F` never
/// uses TF32), TF32 tensor cores for tf32 (`CUBLAS_COMPUTE_32F_FAST_TF32`), f16 for f16
/// accumulation and i32 for the integer types. cuBLASLt (`blaslt`) uses the same.
pub(super) fn compute_type(w: &Matmul) -> cublasComputeType_t {
    match (w.types.input, Scalars::of(w)) {
        (DType::Tf32, _) => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        (_, Scalars::F32(..)) => cublasComputeType_t::CUBLAS_COMPUTE_32F,
        (_, Scalars::F16(..)) => cublasComputeType_t::CUBLAS_COMPUTE_16F,
        (_, Scalars::I32(..)) => cublasComputeType_t::CUBLAS_COMPUTE_32I,
    }
}

/// The stand-in cuBLAS runs for a workload with packed inputs, which it has no GEMM for: the
/// same M, N, K and layout (tn) in i8, the nearest integer GEMM. `None` for other workloads.
pub(crate) fn packed_stand_in(w: &Matmul) -> Option<Matmul> {
    if !w.types.input.is_packed() {
        return None;
    }
    let types = tensortune_kernels::Types::default_for(DType::I8).expect("i8 has default types");
    Some(Matmul { types, ..*w })
}

/// BLAS's operation for a transposed or plain operand.
pub(super) fn operation(transposed: bool) -> cublasOperation_t {
    if transposed { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N }
}

/// cuBLAS's data type for one of ours. Packed types have none: their baseline runs the i8
/// stand-in ([`packed_stand_in`]), so they never reach here; they map to i8, the stand-in's type.
pub(super) fn data_type(d: DType) -> cudaDataType {
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

/// Which cuBLAS call [`Blas::gemm`] makes for a workload: decided once, for the call and for the
/// name the record gives it ([`Blas::kind`]).
enum Call {
    /// A batched workload: one `cublasGemmStridedBatchedEx`.
    StridedBatched,
    /// A grouped workload where the loaded cuBLAS has `cublasGemmGroupedBatchedEx` for its types.
    GroupedBatched,
    /// Another grouped workload: one `cublasGemmEx` per group.
    GroupLoop,
    /// One problem: one `cublasGemmEx`.
    Single,
}

impl Call {
    fn of(w: &Matmul) -> Call {
        if w.batch > 1 {
            Call::StridedBatched
        } else if super::grouped::grouped_batched_usable(w) {
            Call::GroupedBatched
        } else if !w.groups.is_empty() {
            Call::GroupLoop
        } else {
            Call::Single
        }
    }
}

impl Blas {
    /// Creates a handle on `stream` with a fixed workspace.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Blas, String> {
        let ctx = stream.context();
        let workspace = DevBuf::new(ctx, WORKSPACE_BYTES).map_err(|e| e.to_string())?;
        ctx.bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
        let handle = blas::create_handle().map_err(|e| format!("cublasCreate failed: {e:?}"))?;
        let out = Blas { handle, _workspace: workspace, grouped: super::grouped::PointerArrays::new(ctx) };
        // SAFETY: handle is live; the stream and workspace outlive it (the executor drops the
        // handle before either).
        unsafe {
            blas::set_stream(handle, stream.cu_stream() as _).map_err(|e| format!("cublasSetStream failed: {e:?}"))?;
            sys::cublasSetWorkspace_v2(handle, out._workspace.ptr as *mut c_void, WORKSPACE_BYTES)
                .result()
                .map_err(|e| format!("cublasSetWorkspace failed: {e:?}"))?;
        }
        Ok(out)
    }

    /// Enqueues D = alpha op(A) op(B) + beta D on the handle's stream. cuBLAS's C is in-place,
    /// so with beta != 0 it reads D as C: the same work as ours, on other values.
    /// A batched workload runs as one `cublasGemmStridedBatchedEx` (contiguous strides), a
    /// grouped one as one `cublasGemmGroupedBatchedEx` where the loaded cuBLAS has it (12.5+) for
    /// the types, otherwise as a loop of `cublasGemmEx`, one call per group ([`Blas::kind`] names
    /// which).
    pub(crate) fn gemm(&self, w: &Matmul, a: u64, b: u64, d: u64) -> Result<(), CudaFailure> {
        match Call::of(w) {
            Call::StridedBatched => self.strided_batched(w, a, b, d),
            Call::GroupedBatched => self.grouped_batched(w, a, b, d),
            Call::GroupLoop => {
                let (ea, eo) = (w.types.input.bytes() as u64, w.types.output.bytes() as u64);
                for g in 0..w.groups.len() {
                    let p = super::grouped::group_part(w, g);
                    let one = Matmul { m: p.m, groups: Default::default(), ..*w };
                    self.gemm_ld(&one, a + p.a_off * ea, b + p.b_off * ea, d + p.d_off * eo, w.m)?;
                }
                Ok(())
            }
            Call::Single => self.gemm_ld(w, a, b, d, w.m),
        }
    }

    /// The call [`Blas::gemm`] makes for `w`.
    pub(crate) fn kind(w: &Matmul) -> String {
        match Call::of(w) {
            Call::StridedBatched => format!("cublasGemmStridedBatchedEx (batch {})", w.batch),
            Call::GroupedBatched => format!("cublasGemmGroupedBatchedEx ({} groups of one problem)", w.groups.len()),
            Call::GroupLoop => format!("cublasGemmEx loop over {} groups", w.groups.len()),
            Call::Single => "cublasGemmEx".into(),
        }
    }

    /// One `cublasGemmStridedBatchedEx` over `w.batch` problems stored one after another.
    fn strided_batched(&self, w: &Matmul, a: u64, b: u64, d: u64) -> Result<(), CudaFailure> {
        let t = &w.types;
        let scalars = Scalars::of(w);
        let (alpha, beta) = scalars.ptrs();
        let ops = Ops::of(w);
        // SAFETY: a, b, d are live buffers sized for every problem (operand_elements: batch times
        // each stride); alpha and beta point at `scalars`, alive for the call.
        unsafe {
            blas::gemm_strided_batched_ex(
                self.handle,
                operation(ops.a_t),
                operation(ops.b_t),
                w.m as i32,
                w.n as i32,
                w.k as i32,
                alpha,
                a as *const c_void,
                data_type(t.input),
                ops.lda as i32,
                (w.m * w.k) as i64,
                b as *const c_void,
                data_type(t.input),
                ops.ldb as i32,
                (w.k * w.n) as i64,
                beta,
                d as *mut c_void,
                data_type(t.output),
                w.m as i32,
                (w.m * w.n) as i64,
                w.batch as i32,
                compute_type(w),
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaFailure {
            code: cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            context: format!("cublasGemmStridedBatchedEx returned {e:?}"),
        })
    }

    /// One `cublasGemmEx` of `w` with D's (and, M-contiguous, A's) leading dimension `ld_m`.
    fn gemm_ld(&self, w: &Matmul, a: u64, b: u64, d: u64, ld_m: u64) -> Result<(), CudaFailure> {
        let t = &w.types;
        let scalars = Scalars::of(w);
        let compute = compute_type(w);
        let (alpha, beta) = scalars.ptrs();
        let ops = Ops::of(w);
        let lda = if ops.a_t { ops.lda } else { ld_m };
        // SAFETY: a, b, d are live buffers sized for this workload (operand_elements); alpha and
        // beta point at `scalars`, alive for the call; the handle is bound to the stream.
        unsafe {
            blas::gemm_ex(
                self.handle,
                operation(ops.a_t),
                operation(ops.b_t),
                w.m as i32,
                w.n as i32,
                w.k as i32,
                alpha,
                a as *const c_void,
                data_type(t.input),
                lda as i32,
                b as *const c_void,
                data_type(t.input),
                ops.ldb as i32,
                beta,
                d as *mut c_void,
                data_type(t.output),
                ld_m as i32,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaFailure {
            code: cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            context: format!("cublasGemmEx returned {e:?}"),
        })
    }
}

impl Blas {
    /// One `cublasGemmGroupedBatchedEx` of `w`'s groups (group_count G, one problem each).
    fn grouped_batched(&self, w: &Matmul, a: u64, b: u64, d: u64) -> Result<(), CudaFailure> {
        let handle = self.handle;
        let g = w.groups.len();
        let ptrs = self.grouped.pointers(w, a, b, d)?;
        let ops = Ops::of(w);
        let each = |v: u64| vec![v as i32; g];
        let m: Vec<i32> = w.groups.iter().map(|m| m as i32).collect();
        let (n, k, ldb, ldc) = (each(w.n), each(w.k), each(ops.ldb), each(w.m));
        let lda = each(if ops.a_t { ops.lda } else { w.m });
        let (ta, tb) = (vec![operation(ops.a_t); g], vec![operation(ops.b_t); g]);
        let (alpha, beta) = (vec![w.alpha as f32; g], vec![w.beta as f32; g]);
        let sizes = vec![1i32; g];
        let (t_in, t_out) = (data_type(w.types.input), data_type(w.types.output));
        let arrays = |i: u64| (ptrs + i * 8 * g as u64) as *const *const std::ffi::c_void;
        // SAFETY: the host arrays hold one entry per group and live until the call returns
        // (cuBLAS reads them, and the host scalars, when the call is enqueued); `ptrs` holds 3G
        // device pointers into live buffers sized for every group (operand_elements); the handle
        // is bound to the measuring stream; the function exists (grouped_batched_usable).
        unsafe {
            sys::cublasGemmGroupedBatchedEx(
                handle,
                ta.as_ptr(),
                tb.as_ptr(),
                m.as_ptr(),
                n.as_ptr(),
                k.as_ptr(),
                alpha.as_ptr().cast(),
                arrays(0),
                t_in,
                lda.as_ptr(),
                arrays(1),
                t_in,
                ldb.as_ptr(),
                beta.as_ptr().cast(),
                arrays(2) as *const *mut std::ffi::c_void,
                t_out,
                ldc.as_ptr(),
                g as i32,
                sizes.as_ptr(),
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            )
        }
        .result()
        .map_err(|e| CudaFailure {
            code: cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            context: format!("cublasGemmGroupedBatchedEx returned {e:?}"),
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}
