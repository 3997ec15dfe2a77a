//! The cuDNN handle on the measuring stream and the descriptors of one convolution: created,
//! set from a [`ConvPlan`], checked against our shapes, destroyed together; the algorithm search.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cudarc::cudnn::sys::{
    cudnnActivationDescriptor_t, cudnnActivationMode_t, cudnnConvolutionDescriptor_t, cudnnConvolutionMode_t,
    cudnnFilterDescriptor_t, cudnnHandle_t, cudnnTensorDescriptor_t, cudnnTensorFormat_t,
};
use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUresult;

use super::api::{AlgoPerf, Api, LIB_ENV, SUCCESS, version_text};
use super::types::{ALGOS, ConvPlan, algo_name, data_type};
use crate::cuda::device::{CudaFailure, DevBuf};

/// The most workspace offered to cuDNN. FFT and Winograd algorithms ask for gigabytes on large
/// shapes; frameworks cap what they offer too, and our workloads already hold the GPU's memory.
pub(super) const WORKSPACE_CAP: usize = 1 << 30;

/// A cuDNN handle on the measuring stream.
pub(crate) struct Dnn {
    pub(super) api: Api,
    pub(super) handle: cudnnHandle_t,
    /// e.g. `9.14.0`.
    pub(super) version: String,
}

impl Dnn {
    /// Loads cuDNN (see the module notes) and creates a handle on `stream`.
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Dnn, String> {
        let setting = std::env::var_os(LIB_ENV).filter(|v| !v.is_empty());
        let api = Api::open(setting.as_deref())?;
        // SAFETY: cudnnGetVersion has no preconditions.
        let version = version_text(unsafe { (api.get_version)() });
        stream.context().bind_to_thread().map_err(|e| format!("binding the context for cuDNN: {e:?}"))?;
        let mut handle: cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current on this thread.
        api.check(unsafe { (api.create)(&mut handle) }, "cudnnCreate").map_err(|e| format!("cuDNN {version}: {e}"))?;
        let dnn = Dnn { api, handle, version };
        // SAFETY: the handle is live; the stream outlives it (the executor drops cuDNN first).
        let status = unsafe { (dnn.api.set_stream)(dnn.handle, stream.cu_stream() as *mut c_void) };
        dnn.api.check(status, "cudnnSetStream")?;
        tracing::debug!(version = %dnn.version, "cuDNN loaded");
        Ok(dnn)
    }

    /// Creates and sets the descriptors of `plan`, and checks cuDNN agrees on the output shape.
    pub(super) fn describe(&self, plan: &ConvPlan) -> Result<ConvDescs<'_>, String> {
        let a = &self.api;
        let mut d = ConvDescs {
            dnn: self,
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
        };
        let nhwc = cudnnTensorFormat_t::CUDNN_TENSOR_NHWC as u32;
        // SAFETY: valid out-pointers; every descriptor set below was created just before, and
        // `ConvDescs::drop` destroys whichever were created if a later call fails.
        unsafe {
            a.check((a.create_tensor)(&mut d.x), "cudnnCreateTensorDescriptor")?;
            a.check((a.create_tensor)(&mut d.y), "cudnnCreateTensorDescriptor")?;
            a.check((a.create_filter)(&mut d.w), "cudnnCreateFilterDescriptor")?;
            a.check((a.create_conv)(&mut d.conv), "cudnnCreateConvolutionDescriptor")?;
            let [n, c, h, w] = plan.x_dims;
            a.check((a.set_tensor_4d)(d.x, nhwc, data_type(plan.input), n, c, h, w), "cudnnSetTensor4dDescriptor (x)")?;
            let [k, c, r, s] = plan.w_dims;
            a.check((a.set_filter_4d)(d.w, data_type(plan.input), nhwc, k, c, r, s), "cudnnSetFilter4dDescriptor")?;
            let [n, k, p, q] = plan.y_dims;
            a.check(
                (a.set_tensor_4d)(d.y, nhwc, data_type(plan.output), n, k, p, q),
                "cudnnSetTensor4dDescriptor (y)",
            )?;
            a.check(
                (a.set_conv_2d)(
                    d.conv,
                    plan.pad[0],
                    plan.pad[1],
                    plan.stride[0],
                    plan.stride[1],
                    plan.dilation[0],
                    plan.dilation[1],
                    cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION as u32,
                    data_type(plan.compute),
                ),
                "cudnnSetConvolution2dDescriptor",
            )?;
            let mut dims = [0 as c_int; 4];
            let [dn, dk, dp, dq] = &mut dims;
            a.check((a.output_dim)(d.conv, d.x, d.w, dn, dk, dp, dq), "cudnnGetConvolution2dForwardOutputDim")?;
            if dims != plan.y_dims {
                return Err(format!(
                    "cuDNN computes an output of (n, k, p, q) = {dims:?} where ours is {:?}",
                    plan.y_dims
                ));
            }
        }
        d.set_math(plan.math.descriptor())?;
        Ok(d)
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { (self.api.destroy)(self.handle) };
    }
}

/// The descriptors of one convolution, destroyed together.
pub(super) struct ConvDescs<'a> {
    pub(super) dnn: &'a Dnn,
    pub(super) x: cudnnTensorDescriptor_t,
    pub(super) w: cudnnFilterDescriptor_t,
    pub(super) y: cudnnTensorDescriptor_t,
    pub(super) conv: cudnnConvolutionDescriptor_t,
}

impl ConvDescs<'_> {
    pub(super) fn set_math(&self, math: u32) -> Result<(), String> {
        let a = &self.dnn.api;
        // SAFETY: the descriptor is live; cuDNN rejects an unknown math type with a status.
        a.check(unsafe { (a.set_math_type)(self.conv, math) }, "cudnnSetConvolutionMathType")
    }

    /// The largest workspace any algorithm asks for, up to [`WORKSPACE_CAP`].
    pub(super) fn workspace_bytes(&self) -> usize {
        let a = &self.dnn.api;
        ALGOS
            .iter()
            .filter_map(|&(algo, _)| {
                let mut bytes = 0usize;
                // SAFETY: live handle and descriptors, valid out-pointer.
                let status = unsafe {
                    (a.workspace_size)(self.dnn.handle, self.x, self.w, self.conv, self.y, algo as u32, &mut bytes)
                };
                (status == SUCCESS && bytes <= WORKSPACE_CAP).then_some(bytes)
            })
            .max()
            .unwrap_or(0)
    }

    /// Every algorithm cuDNN tries for this convolution, fastest first by its own timing, with
    /// the status each ran with.
    ///
    /// # Safety
    ///
    /// `x`, `w` and `y` must be device buffers of the plan's sizes and types.
    pub(super) unsafe fn find(&self, x: u64, w: u64, y: u64, workspace: &DevBuf) -> Result<Vec<AlgoPerf>, String> {
        let a = &self.dnn.api;
        let mut max = 0 as c_int;
        // SAFETY: live handle, valid out-pointer.
        a.check(
            unsafe { (a.algo_max_count)(self.dnn.handle, &mut max) },
            "cudnnGetConvolutionForwardAlgorithmMaxCount",
        )?;
        let mut perf = vec![AlgoPerf::default(); max.max(1) as usize];
        let mut returned = 0 as c_int;
        // SAFETY: buffers as the caller promises; `perf` holds `max` rows; the workspace spans
        // `workspace.bytes`. cuDNN runs the candidates on the handle's stream, outside any capture.
        let status = unsafe {
            (a.find_ex)(
                self.dnn.handle,
                self.x,
                x as *const c_void,
                self.w,
                w as *const c_void,
                self.conv,
                self.y,
                y as *mut c_void,
                perf.len() as c_int,
                &mut returned,
                perf.as_mut_ptr(),
                workspace.ptr as *mut c_void,
                workspace.bytes,
            )
        };
        a.check(status, "cudnnFindConvolutionForwardAlgorithmEx")?;
        perf.truncate(returned.clamp(0, max) as usize);
        Ok(perf)
    }

    /// Enqueues y = conv(x, w) with `algo` on the handle's stream (the convolution descriptor's
    /// current math type applies).
    ///
    /// # Safety
    ///
    /// As [`ConvDescs::find`]; `workspace` must hold what `algo` needs.
    pub(super) unsafe fn forward(
        &self,
        algo: u32,
        x: u64,
        w: u64,
        y: u64,
        workspace: &DevBuf,
    ) -> Result<(), CudaFailure> {
        let a = &self.dnn.api;
        // The scaling factors are float for every configuration but double's.
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: as the caller promises; alpha and beta live across the call.
        let status = unsafe {
            (a.forward)(
                self.dnn.handle,
                &alpha as *const f32 as *const c_void,
                self.x,
                x as *const c_void,
                self.w,
                w as *const c_void,
                self.conv,
                algo,
                workspace.ptr as *mut c_void,
                workspace.bytes,
                &beta as *const f32 as *const c_void,
                self.y,
                y as *mut c_void,
            )
        };
        a.check(status, &format!("cudnnConvolutionForward ({})", algo_name(algo)))
            .map_err(|context| CudaFailure { code: CUresult::CUDA_ERROR_NOT_SUPPORTED, context })
    }
}

/// The extra descriptors of cuDNN's fused convolution-bias-activation: the bias (1 x K x 1 x 1 of
/// the output type) and the activation (ReLU, or identity: cuDNN then allows only
/// IMPLICIT_PRECOMP_GEMM).
pub(super) struct FusedDescs<'a> {
    dnn: &'a Dnn,
    bias: cudnnTensorDescriptor_t,
    act: cudnnActivationDescriptor_t,
    /// Whether z (the residual, the output's shape) is added: alpha2 = 1.
    residual: bool,
}

impl<'a> ConvDescs<'a> {
    /// The fused call's descriptors for a layer with bias, ReLU or none, and perhaps a residual.
    pub(super) fn fused(&self, plan: &ConvPlan, relu: bool, residual: bool) -> Result<FusedDescs<'a>, String> {
        let a = &self.dnn.api;
        let mut f = FusedDescs { dnn: self.dnn, bias: std::ptr::null_mut(), act: std::ptr::null_mut(), residual };
        let nchw = cudnnTensorFormat_t::CUDNN_TENSOR_NCHW as u32;
        let mode = if relu {
            cudnnActivationMode_t::CUDNN_ACTIVATION_RELU
        } else {
            cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY
        };
        // SAFETY: valid out-pointers; `FusedDescs::drop` destroys whichever were created.
        unsafe {
            a.check((a.create_tensor)(&mut f.bias), "cudnnCreateTensorDescriptor (bias)")?;
            a.check((a.create_act)(&mut f.act), "cudnnCreateActivationDescriptor")?;
            a.check(
                (a.set_tensor_4d)(f.bias, nchw, data_type(plan.output), 1, plan.y_dims[1], 1, 1),
                "cudnnSetTensor4dDescriptor (bias)",
            )?;
            // CUDNN_NOT_PROPAGATE_NAN = 0; the coefficient is for clipped ReLU and ELU only.
            a.check((a.set_act)(f.act, mode as u32, 0, 0.0), "cudnnSetActivationDescriptor")?;
        }
        Ok(f)
    }

    /// Enqueues y = act(conv(x, w) + alpha2 z + bias) with `algo`: cuDNN's fused call.
    ///
    /// # Safety
    ///
    /// As [`ConvDescs::forward`]; `z` (the output's shape and type) and `bias` (K values of the
    /// output type) must be device buffers.
    #[allow(clippy::too_many_arguments)] // the fused call's operands, each a buffer
    pub(super) unsafe fn fused_forward(
        &self,
        f: &FusedDescs<'_>,
        algo: u32,
        x: u64,
        w: u64,
        z: u64,
        bias: u64,
        y: u64,
        workspace: &DevBuf,
    ) -> Result<(), CudaFailure> {
        let a = &self.dnn.api;
        let (alpha1, alpha2) = (1.0f32, if f.residual { 1.0f32 } else { 0.0 });
        // SAFETY: as the caller promises; the factors live across the call. Without a residual
        // z is y itself, as cuDNN's documentation allows (alpha2 = 0 leaves it unread).
        let status = unsafe {
            (a.bias_act_forward)(
                self.dnn.handle,
                &alpha1 as *const f32 as *const c_void,
                self.x,
                x as *const c_void,
                self.w,
                w as *const c_void,
                self.conv,
                algo,
                workspace.ptr as *mut c_void,
                workspace.bytes,
                &alpha2 as *const f32 as *const c_void,
                self.y,
                if f.residual { z } else { y } as *const c_void,
                f.bias,
                bias as *const c_void,
                f.act,
                self.y,
                y as *mut c_void,
            )
        };
        a.check(status, &format!("cudnnConvolutionBiasActivationForward ({})", algo_name(algo)))
            .map_err(|context| CudaFailure { code: CUresult::CUDA_ERROR_NOT_SUPPORTED, context })
    }
}

impl Drop for FusedDescs<'_> {
    fn drop(&mut self) {
        let a = &self.dnn.api;
        // SAFETY: created by this library (or null and skipped), destroyed once.
        unsafe {
            if !self.bias.is_null() {
                (a.destroy_tensor)(self.bias);
            }
            if !self.act.is_null() {
                (a.destroy_act)(self.act);
            }
        }
    }
}

impl Drop for ConvDescs<'_> {
    fn drop(&mut self) {
        let a = &self.dnn.api;
        // SAFETY: each descriptor was created by this library (or is null and skipped) and is
        // destroyed once.
        unsafe {
            if !self.x.is_null() {
                (a.destroy_tensor)(self.x);
            }
            if !self.y.is_null() {
                (a.destroy_tensor)(self.y);
            }
            if !self.w.is_null() {
                (a.destroy_filter)(self.w);
            }
            if !self.conv.is_null() {
                (a.destroy_conv)(self.conv);
            }
        }
    }
}
