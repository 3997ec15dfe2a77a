//! tensortune's shared language: workloads, kernel templates, knob spaces, validity rules and CUDA
//! C++ generation. No CUDA and no async runtime here: everything about a kernel is testable on a
//! machine without a GPU (the compile tests use NVRTC alone).
//!
//! # Layout
//!
//! - [`dtype`]: element types and their spellings.
//! - [`workload`]: matmul and conv2d workloads, validation, canonical keys.
//! - [`grouped`]: batched and grouped matmul: the groups' M and the grouped tile schedule.
//! - [`target`]: device limits for validity rules; device-class keys.
//! - [`space`]: knobs, spaces, configs and their indices.
//! - [`status`]: the outcome class of a measurement, one definition for worker, wire and store.
//! - [`energy`]: the clock regime a measurement is taken in and the objective a job minimises
//!   (time, energy, energy x delay), the max-slowdown pick and the time-energy front.
//! - [`template`]: the `Template` trait and the generated `KernelSpec`s.
//! - [`registry`]: every template this build knows, by name and by operation.
//! - [`version`]: each template's version (what each changed: `kernels/CHANGELOG.md`).
//! - [`tiling`]: the block tiling the WMMA templates share: GEMM view, knobs, rules, model.
//! - [`gemm`]: the `wmma_gemm` template (its CUDA body is `src/cuda/wmma_gemm.cu`).
//! - [`conv`]: the `wmma_conv2d` template, an implicit GEMM (`src/cuda/wmma_conv2d.cu`).
//! - [`wgmma`]: the Hopper family (sm_90a): `wgmma_gemm`, with TMA, mbarriers, warp
//!   specialization, clusters and a persistent tile walk; everything about it is in its folder.
//! - [`ext`]: the `mma_ext_gemm` template, tensor-core matmul of tf32 (WMMA m16n16k8) and the
//!   packed s4, u4 and b1 types (mma.sync m8n8k32 / m8n8k128) (`src/cuda/mma_ext.cu`).
//! - [`simt`]: the `simt_gemm` template, exact f32 on the CUDA cores (`src/cuda/simt_gemm.cu`).
//! - [`simt_conv`]: the `simt_conv2d` template, exact f32 convolution on `simt_gemm`'s body with an
//!   im2col loader (`src/cuda/simt_conv2d.cu`).
//! - [`support`]: input generation, the float64 reference and the comparison kernels.
//! - [`cuda`]: the typed emitter for generated headers and the filler of template holes;
//!   `src/cuda/wmma_core.cu` is the block-level WMMA GEMM both templates' kernels share.

/// A rejection's reason: the expression (a `format!`), evaluated only where reasons are wanted
/// (an empty string inside [`error::without_reasons`]).
macro_rules! reason {
    ($why:expr) => {
        if $crate::error::reasons_wanted() { $why } else { String::new() }
    };
}

pub mod conv;
pub mod cuda;
pub mod dtype;
pub mod energy;
pub mod epilogue;
pub mod error;
pub mod ext;
pub mod gemm;
pub mod grouped;
pub mod registry;
pub mod simt;
pub mod simt_conv;
pub mod space;
pub mod status;
pub mod support;
pub mod target;
pub mod template;
pub mod tiling;
pub mod version;
pub mod wgmma;
pub mod workload;

pub use dtype::DType;
pub use epilogue::{Activation, Epilogue, InputScale};
pub use error::{Error, Result};
pub use space::{Config, Knob, KnobValue, Space};
pub use target::Target;
pub use template::{Arg, Im2colMap, KernelSpec, Launch, Resources, Template, TensorMap, TensorOperand};
pub use workload::{Conv2d, Layout, Matmul, Op, Types, Workload};

/// The first 8 hex digits of the SHA-256 of `text`: short, stable names for long keys.
pub fn short_digest(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).iter().take(4).map(|b| format!("{b:02x}")).collect()
}
