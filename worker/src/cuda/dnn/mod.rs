//! The vendor baseline for conv2d: cuDNN's legacy `cudnnConvolutionForward` on the workload's own
//! buffers (NHWC input, KRSC filter, NPQK output), with the algorithm a user who wants the fastest
//! would pick, timed by the same graph replay as our kernels and cross-checked against the same
//! float64 reference.
//!
//! # Types
//!
//! The legacy API has a fixed set of type configurations; ours map onto them like this, and the
//! baseline's kind says which one ran:
//!
//! | ours (in, acc, out) | cuDNN configuration | x, w | compute | y |
//! |---|---|---|---|---|
//! | f16, f32, f16 | `PSEUDO_HALF_CONFIG` | half | float | half |
//! | f16, f32, f32 | `PSEUDO_HALF_CONFIG` | half | float | half: no configuration writes float from half inputs |
//! | f16, f16, f16 | `PSEUDO_HALF_CONFIG` | half | float, where ours accumulates in f16 | half |
//! | bf16, f32, bf16 or f32 | `PSEUDO_BFLOAT16_CONFIG` | bfloat16 | float | bfloat16 |
//! | i8, i32, i32 | `INT8_EXT_CONFIG` | int8 | int32 | float: no configuration writes int32 |
//! | f32, f32, f32 (exact) | `FLOAT_CONFIG`, math `CUDNN_FMA_MATH` | float | float | float |
//! | tf32, f32, f32 | `FLOAT_CONFIG`, math `CUDNN_TENSOR_OP_MATH` | float | float | float |
//!
//! Where cuDNN's output type differs from ours it writes into a buffer of its own; the cross-check
//! converts that (exactly) into our output buffer and allows for cuDNN's output rounding. For i8
//! the float output is exact below 2^24. `INT8_EXT_CONFIG` needs NHWC tensors and input channels
//! that are a multiple of 4; whether cuDNN runs it on tensor cores is its choice (the kind names
//! only the algorithm). `INT8x32_CONFIG` (NC/32HW32, the layout the legacy API documents for int8
//! tensor cores) would need other buffers than ours, so it is not used. Half compute
//! (`TRUE_HALF_CONFIG`) is not tried for f16 accumulation: frameworks run half convolutions as
//! `PSEUDO_HALF_CONFIG`, and that is the baseline a user would meet.
//!
//! # f32 and TF32
//!
//! Exact f32 and TF32 are one cuDNN configuration, `FLOAT_CONFIG`; what tells them apart is the
//! convolution descriptor's math type ([`Math`]). cuDNN documents `CUDNN_DEFAULT_MATH` as allowing
//! TF32 tensor-core kernels for FLOAT convolutions on sm_80 and newer, so on the GPUs we tune a
//! FLOAT convolution left at its default would be a TF32 one. The exact-f32 baseline therefore
//! runs with `CUDNN_FMA_MATH` (FMA kernels only): it is set before the search and before every
//! call, whatever math type cuDNN lists a candidate with, and each algorithm is timed once. Its
//! cross-check uses exact f32's tolerance, which a kernel that rounded its inputs to TF32 fails
//! (see `Tolerance::for_workload`), so a baseline that was TF32 after all would say so in its
//! kind. The TF32 baseline runs with `CUDNN_TENSOR_OP_MATH`, the math type cuDNN's legacy-API
//! guide names as what lets a convolution use the tensor cores (rather than `DEFAULT_MATH`, whose
//! TF32 depends on the GPU and on `NVIDIA_TF32_OVERRIDE`); each candidate is timed with the math
//! type cuDNN reports for it, which the kind names. With `NVIDIA_TF32_OVERRIDE=0` in the
//! environment cuDNN runs no TF32 at all, and the kind would show FMA math.
//!
//! # Algorithm
//!
//! `cudnnFindConvolutionForwardAlgorithmEx` (outside any graph, with one workspace of up to
//! [`WORKSPACE_CAP`]) lists the algorithms that run this convolution; each of them, with the math
//! type cuDNN reported for it, is then timed the way our kernels are (captured in a CUDA graph,
//! replayed between events) and the fastest is the baseline. cuDNN's own ranking times single
//! calls outside any graph, which for a 5 us convolution includes the launch overhead. An
//! algorithm whose calls fail, or cannot be captured, is left out (and counted in the kind); when
//! none can be timed, there is no baseline.
//!
//! # Finding the library
//!
//! cuDNN is loaded here, with `libloading`, the first time a child is asked for a conv baseline:
//! from the path in `TENSORTUNE_CUDNN_LIB` when set, otherwise as `libcudnn.so.9` or
//! `libcudnn.so` through the dynamic loader's search (`LD_LIBRARY_PATH`, then the system's
//! directories). cudarc's own cuDNN loader is not used: it panics when the library or a symbol is
//! missing and only tries fixed names; here a missing library is a baseline of "none: cuDNN not
//! found (...)" and the measurement goes on. Only cudarc's type definitions are used, and statuses
//! and algorithm numbers are read as integers, so a library newer than those bindings cannot hand
//! back a value the Rust enums lack.

//!
//! # Layout
//!
//! - `api.rs`: the bindings (library loading, entry points, statuses).
//! - `types.rs`: type mapping: configuration, math type, [`ConvPlan`](types::ConvPlan), enum names.
//! - `descs.rs`: the handle ([`Dnn`]) and a convolution's descriptors; the algorithm search.
//! - `convert.rs`: host conversion of cuDNN's output into ours.
//! - here: timing and checking each candidate algorithm the way our kernels are ([`ConvPick`]).

mod api;
mod convert;
mod descs;
mod types;

use std::sync::Arc;

use cudarc::driver::CudaStream;
use tensortune_kernels::support::{self};
use tensortune_kernels::{Conv2d, Workload};

use self::api::{AlgoPerf, SUCCESS};
use self::convert::copy_converted;
use self::types::{ConvPlan, Math, TypeConfig, algo_name, math_name};
use super::CudaExecutor;
use super::device::{Context, CudaFailure, DevBuf};
use super::workload::{InputSet, WorkloadState};
use crate::protocol::MeasureRequest;

pub(crate) use self::descs::Dnn;

/// Why a conv baseline could not be had.
enum Why {
    /// cuDNN refused (unsupported, no algorithm, a descriptor error).
    Cudnn(String),
    /// The GPU failed; may have poisoned the context.
    Cuda(CudaFailure),
}

impl From<CudaFailure> for Why {
    fn from(f: CudaFailure) -> Why {
        Why::Cuda(f)
    }
}

impl CudaExecutor {
    /// The cuDNN baseline of conv workload `wi` (see the module notes): (time, kind), or
    /// (None, "none: why").
    /// With `only`, that algorithm alone is timed (no Find).
    pub(super) fn conv_baseline(
        &mut self,
        wi: usize,
        conv: &Conv2d,
        req: &MeasureRequest,
        only: Option<ConvPick>,
    ) -> (Option<f64>, String, Option<ConvPick>) {
        let plan = match ConvPlan::new(conv) {
            Ok(p) => p,
            Err(why) => return (None, format!("none: cuDNN: {why}"), None),
        };
        if self.dnn.is_none() {
            let loaded = Dnn::new(&self.stream);
            if let Err(e) = &loaded {
                tracing::warn!("conv2d records will carry no vendor baseline: {e}");
            }
            self.dnn = Some(loaded);
        }
        let dnn = match self.dnn.as_ref().expect("set above") {
            Ok(d) => d,
            Err(e) => return (None, format!("none: {e}"), None),
        };
        let w = &self.workloads[wi];
        let out = time_and_check(
            dnn,
            Layer { plan: &plan, conv, state: w },
            |enqueue| self.timer.time(req, enqueue),
            &self.stream,
            req,
            only,
        );
        let (text, sticky) = match out {
            Ok((us, kind, pick)) => return (Some(us), kind, Some(pick)),
            Err(Why::Cudnn(text)) => (format!("cuDNN: {text}"), false),
            Err(Why::Cuda(f)) => (f.to_string(), f.is_sticky()),
        };
        tracing::warn!(workload = %req.workload_key, "no cuDNN baseline: {text}");
        // cuDNN reports a fault inside its kernels as its own status: ask the driver too.
        if sticky || self.ctx.synchronize().is_err() {
            self.poisoned = true;
        }
        (None, format!("none: {text}"), None)
    }
}

/// A conv workload as the baseline sees it: cuDNN's description, the layer and its buffers.
struct Layer<'a> {
    plan: &'a ConvPlan,
    conv: &'a Conv2d,
    state: &'a WorkloadState,
}

/// The cuDNN algorithm (and math type) a baseline picked.
#[derive(Clone, Copy, Debug)]
pub(super) struct ConvPick(AlgoPerf);

/// Finds the algorithms, times each in graphs with `time`, cross-checks the fastest; with `only`,
/// times and cross-checks that one without finding. Returns (time, kind, what was timed).
fn time_and_check<T>(
    dnn: &Dnn,
    layer: Layer<'_>,
    mut time: T,
    stream: &Arc<CudaStream>,
    req: &MeasureRequest,
    only: Option<ConvPick>,
) -> Result<(f64, String, ConvPick), Why>
where
    T: FnMut(&mut dyn FnMut(&Arc<CudaStream>) -> Result<(), CudaFailure>) -> Result<super::timing::Timing, CudaFailure>,
{
    let Layer { plan, conv, state: w } = layer;
    let descs = dnn.describe(plan).map_err(Why::Cudnn)?;
    let ctx = stream.context();
    let out_elems = support::operand_elements(&Workload::Conv2d(*conv)).2;
    let own_y = match plan.output_differs() {
        true => Some(DevBuf::new(ctx, out_elems as usize * plan.output.bytes() as usize)?),
        false => None,
    };
    let y = own_y.as_ref().map_or(w.d.ptr, |b| b.ptr);
    let workspace = DevBuf::new(ctx, descs.workspace_bytes())?;
    let (xt, wt) = w.inputs(InputSet::Timing);
    // SAFETY: the workload's buffers have the plan's sizes and types; y is ours or cuDNN's own.
    let found = match only {
        Some(ConvPick(p)) => vec![p],
        None => unsafe { descs.find(xt, wt, y, &workspace) }.map_err(Why::Cudnn)?,
    };
    for p in &found {
        tracing::debug!(
            workload = %req.workload_key,
            algo = %algo_name(p.algo),
            math = %math_name(p.math_type),
            status = %dnn.api.status_text(p.status),
            ms = p.time_ms,
            workspace = p.memory,
            "cuDNN candidate"
        );
    }
    let usable: Vec<AlgoPerf> = plan.math.candidates(
        &found.iter().copied().filter(|p| p.status == SUCCESS && p.memory <= workspace.bytes).collect::<Vec<_>>(),
    );
    if usable.is_empty() {
        let tried: Vec<String> =
            found.iter().map(|p| format!("{} {}", algo_name(p.algo), dnn.api.status_text(p.status))).collect();
        let hint = match plan.config {
            TypeConfig::Int8Ext => "; cuDNN documents INT8_EXT_CONFIG for NHWC with channels multiples of 4",
            TypeConfig::Float if plan.math == Math::FmaOnly => "; CUDNN_FMA_MATH lets only FMA kernels run",
            _ => "",
        };
        return Err(Why::Cudnn(format!(
            "no forward algorithm runs {} on cuDNN {} (tried: {}){hint}",
            plan.describe(),
            dnn.version,
            tried.join(", ")
        )));
    }

    // A fused layer: cuDNN's fused convolution-bias-activation where it has the epilogue (bias,
    // then ReLU or none, the residual as z), else its convolution and our elementwise kernel.
    let relu = conv.epilogue.activation == tensortune_kernels::Activation::Relu;
    let mut fused = None;
    let mut unfused_why = String::new();
    if conv.fused() {
        unfused_why = match cudnn_fusable(conv, plan) {
            Ok(()) => match descs.fused(plan, relu, conv.residual) {
                Ok(f) => {
                    fused = Some(f);
                    String::new()
                }
                Err(e) => e,
            },
            Err(why) => why.to_string(),
        };
    }
    let (c, bias) = (w.c_ptr(), w.vectors.bias.ptr);
    let mut best: Option<(f64, AlgoPerf)> = None;
    let mut untimed = Vec::new();
    loop {
        for p in &usable {
            // cuDNN documents the identity activation for IMPLICIT_PRECOMP_GEMM alone.
            if fused.is_some() && !relu && p.algo != IMPLICIT_PRECOMP_GEMM {
                continue;
            }
            descs.set_math(p.math_type).map_err(Why::Cudnn)?;
            // SAFETY: as for `find`; the workspace covers `p.memory`; C and the bias are the
            // workload's (the output's shape, K values of the output type).
            let mut enqueue = |s: &Arc<CudaStream>| match &fused {
                Some(f) => unsafe { descs.fused_forward(f, p.algo, xt, wt, c, bias, y, &workspace) },
                None => {
                    unsafe { descs.forward(p.algo, xt, wt, y, &workspace) }?;
                    if conv.fused() { w.apply_epilogue(s) } else { Ok(()) }
                }
            };
            match time(&mut enqueue) {
                Ok(t) => {
                    tracing::debug!(workload = %req.workload_key, algo = %algo_name(p.algo), us = t.time_us, "cuDNN candidate timed");
                    if best.is_none_or(|(us, _)| t.time_us < us) {
                        best = Some((t.time_us, *p));
                    }
                }
                Err(f) if f.is_sticky() => return Err(Why::Cuda(f)),
                Err(f) => {
                    tracing::warn!(workload = %req.workload_key, algo = %algo_name(p.algo), "cuDNN algorithm not timed: {f}");
                    untimed.push(format!("{}: {f}", algo_name(p.algo)));
                }
            }
        }
        if best.is_some() || fused.is_none() {
            break;
        }
        // No algorithm ran the fused call: the unfused pair, saying why.
        unfused_why = format!("cudnnConvolutionBiasActivationForward ran no algorithm ({})", untimed.join("; "));
        fused = None;
        untimed.clear();
    }
    let Some((us, chosen)) = best else {
        return Err(Why::Cudnn(format!("no algorithm could be timed in a CUDA graph ({})", untimed.join("; "))));
    };

    // Cross-check the chosen algorithm on the check set, as the matmul baseline does.
    descs.set_math(chosen.math_type).map_err(Why::Cudnn)?;
    match &own_y {
        // 0xff bytes are NaN in f16, bf16 and f32: unwritten elements show.
        Some(buf) => buf.fill_async(stream, 0xff).when(|| "when poisoning cuDNN's output".into())?,
        None => w.poison(stream)?,
    }
    let (xc, wc) = w.inputs(InputSet::Check);
    match &fused {
        // SAFETY: as for `find`, and C and the bias as above.
        Some(f) => unsafe { descs.fused_forward(f, chosen.algo, xc, wc, c, bias, y, &workspace) }?,
        // SAFETY: as for `find`.
        None => unsafe { descs.forward(chosen.algo, xc, wc, y, &workspace) }?,
    }
    let tolerance = match &own_y {
        Some(buf) => {
            copy_converted(stream, buf.ptr, plan.output, w.d.ptr, plan.ours.output, out_elems)?;
            plan.tolerance(conv)
        }
        None => req.tolerance,
    };
    if conv.fused() && fused.is_none() {
        w.apply_epilogue(stream)?;
    }
    let c = w.compare(stream, &tolerance)?;
    let mut kind = format!(
        "{} {} ({}), {}, fastest of {} candidates",
        if fused.is_some() { "cudnnConvolutionBiasActivationForward" } else { "cudnnConvolutionForward" },
        algo_name(chosen.algo),
        math_name(chosen.math_type),
        plan.describe(),
        usable.len() - untimed.len()
    );
    if !untimed.is_empty() {
        kind.push_str(&format!(" ({} more failed to run or to be captured)", untimed.len()));
    }
    kind.push_str(&format!(", cuDNN {}", dnn.version));
    if fused.is_some() {
        kind.push_str(&format!(" (fused {})", conv_epilogue_name(conv)));
    } else if conv.fused() {
        kind.push_str(&format!(
            " + tt_epilogue elementwise kernel (unfused {}: {unfused_why})",
            conv_epilogue_name(conv)
        ));
    }
    if c.failures > 0 {
        tracing::warn!(workload = %req.workload_key, failures = c.failures, max_abs = c.max_abs, "cuDNN disagrees with the reference");
        kind.push_str(&format!(" ({}: {} elements, max abs error {:.3e})", super::CHECK_FAILED, c.failures, c.max_abs));
    }
    Ok((us, kind, ConvPick(chosen)))
}

/// `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`.
const IMPLICIT_PRECOMP_GEMM: u32 = 1;

/// Whether cuDNN's fused convolution-bias-activation computes the layer's epilogue: a bias, then
/// ReLU or nothing (its other activations are not ours), the residual as z, in cuDNN's own
/// output type.
fn cudnn_fusable(conv: &Conv2d, plan: &ConvPlan) -> Result<(), &'static str> {
    use tensortune_kernels::Activation;
    if !conv.epilogue.bias {
        return Err("cuDNN's fused call always adds a bias; this layer has none");
    }
    if conv.epilogue.scale {
        return Err("cuDNN's fused call has no per-channel scale");
    }
    if matches!(conv.epilogue.activation, Activation::Gelu | Activation::GeluErf) {
        return Err("cuDNN's fused call has no GELU");
    }
    if plan.output_differs() {
        return Err("cuDNN writes another output type than ours");
    }
    Ok(())
}

/// The fused part of a layer as a record's kind names it (`residual+bias+relu`).
fn conv_epilogue_name(conv: &Conv2d) -> String {
    match (conv.residual, conv.epilogue.is_none()) {
        (true, true) => "residual".into(),
        (true, false) => format!("residual+{}", conv.epilogue),
        (false, _) => conv.epilogue.name(),
    }
}

#[cfg(test)]
mod tests;
