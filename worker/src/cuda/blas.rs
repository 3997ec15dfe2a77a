//! The vendor baseline for matmul: `cublasGemmEx` with the workload's types, layout and epilogue,
//! on the same buffers, timed by the same graph replay as our kernels.

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
}

/// The epilogue scalars, in the type the compute type wants them in.
enum Scalars {
    F32(f32, f32),
    F16(half::f16, half::f16),
    I32(i32, i32),
}

impl Scalars {
    fn ptrs(&self) -> (*const c_void, *const c_void) {
        match self {
            Scalars::F32(a, b) => (a as *const f32 as _, b as *const f32 as _),
            Scalars::F16(a, b) => (a as *const half::f16 as _, b as *const half::f16 as _),
            Scalars::I32(a, b) => (a as *const i32 as _, b as *const i32 as _),
        }
    }
}

fn data_type(d: DType) -> cudaDataType {
    match d {
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::Bf16 => cudaDataType::CUDA_R_16BF,
        DType::I8 => cudaDataType::CUDA_R_8I,
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::I32 => cudaDataType::CUDA_R_32I,
    }
}

impl Blas {
    /// Creates a handle on `stream` with a fixed workspace.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Blas, String> {
        let ctx = stream.context();
        let workspace = DevBuf::new(ctx, WORKSPACE_BYTES).map_err(|e| e.to_string())?;
        ctx.bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
        let handle = blas::create_handle().map_err(|e| format!("cublasCreate failed: {e:?}"))?;
        let out = Blas { handle, _workspace: workspace };
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
    pub(crate) fn gemm(&self, w: &Matmul, a: u64, b: u64, d: u64) -> Result<(), CudaFailure> {
        let t = &w.types;
        let (compute, scalars) = match t.accumulator {
            DType::F32 => (cublasComputeType_t::CUBLAS_COMPUTE_32F, Scalars::F32(w.alpha as f32, w.beta as f32)),
            DType::F16 => (
                cublasComputeType_t::CUBLAS_COMPUTE_16F,
                Scalars::F16(half::f16::from_f64(w.alpha), half::f16::from_f64(w.beta)),
            ),
            _ => (cublasComputeType_t::CUBLAS_COMPUTE_32I, Scalars::I32(w.alpha as i32, w.beta as i32)),
        };
        let (alpha, beta) = scalars.ptrs();
        let (transa, lda) = if w.layout.a_k_contiguous() {
            (cublasOperation_t::CUBLAS_OP_T, w.k)
        } else {
            (cublasOperation_t::CUBLAS_OP_N, w.m)
        };
        let (transb, ldb) = if w.layout.b_k_contiguous() {
            (cublasOperation_t::CUBLAS_OP_N, w.k)
        } else {
            (cublasOperation_t::CUBLAS_OP_T, w.n)
        };
        // SAFETY: a, b, d are live buffers sized for this workload (operand_elements); alpha and
        // beta point at `scalars`, alive for the call; the handle is bound to the stream.
        unsafe {
            blas::gemm_ex(
                self.handle,
                transa,
                transb,
                w.m as i32,
                w.n as i32,
                w.k as i32,
                alpha,
                a as *const c_void,
                data_type(t.input),
                lda as i32,
                b as *const c_void,
                data_type(t.input),
                ldb as i32,
                beta,
                d as *mut c_void,
                data_type(t.output),
                w.m as i32,
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

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}
