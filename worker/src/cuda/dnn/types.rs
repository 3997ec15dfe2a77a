//! Type mapping: which configuration of the legacy API a workload runs under ([`TypeConfig`],
//! [`Math`]), the shapes and types cuDNN is told ([`ConvPlan`]), and the spelling of cuDNN's
//! enums.

use std::ffi::c_int;

use cudarc::cudnn::sys::{cudnnConvolutionFwdAlgo_t as Algo, cudnnDataType_t, cudnnMathType_t as MathType};
use tensortune_kernels::support::Tolerance;
use tensortune_kernels::{Conv2d, DType, Types, Workload};

use super::api::AlgoPerf;

/// The type configuration of the legacy API a workload runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TypeConfig {
    /// x, w, y half; compute float.
    PseudoHalf,
    /// x, w, y bfloat16; compute float.
    PseudoBf16,
    /// x, w int8; compute int32; y float.
    Int8Ext,
    /// x, w, y float; compute float (exact f32 or TF32, by the math type).
    Float,
}

/// The math type a convolution descriptor gets, which for `FLOAT_CONFIG` decides between exact
/// f32 and TF32 (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Math {
    /// `CUDNN_TENSOR_OP_MATH` for the search; each candidate runs with the math type cuDNN
    /// reports for it.
    TensorOps,
    /// `CUDNN_FMA_MATH` for the search and for every call: no tensor-core (TF32) kernel.
    FmaOnly,
}

impl Math {
    /// The math type set on the descriptor before the search.
    pub(super) fn descriptor(self) -> u32 {
        match self {
            Math::TensorOps => MathType::CUDNN_TENSOR_OP_MATH as u32,
            Math::FmaOnly => MathType::CUDNN_FMA_MATH as u32,
        }
    }

    /// The candidates to time, from the search's usable rows (fastest first): all of them as
    /// cuDNN listed them, or for [`Math::FmaOnly`] each algorithm once, with FMA math whatever
    /// math type it was listed with.
    pub(super) fn candidates(self, usable: &[AlgoPerf]) -> Vec<AlgoPerf> {
        match self {
            Math::TensorOps => usable.to_vec(),
            Math::FmaOnly => {
                let mut out: Vec<AlgoPerf> = Vec::with_capacity(usable.len());
                for p in usable {
                    if !out.iter().any(|q| q.algo == p.algo) {
                        out.push(AlgoPerf { math_type: self.descriptor(), ..*p });
                    }
                }
                out
            }
        }
    }
}

impl TypeConfig {
    /// cuDNN's name for it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TypeConfig::PseudoHalf => "PSEUDO_HALF_CONFIG",
            TypeConfig::PseudoBf16 => "PSEUDO_BFLOAT16_CONFIG",
            TypeConfig::Int8Ext => "INT8_EXT_CONFIG",
            TypeConfig::Float => "FLOAT_CONFIG",
        }
    }
}

/// How one conv2d workload is described to cuDNN: pure data, so the mapping is testable without
/// a GPU or the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvPlan {
    /// The type configuration.
    pub(crate) config: TypeConfig,
    /// x and w (our inputs, unchanged).
    pub(crate) input: DType,
    /// The convolution descriptor's compute type.
    pub(crate) compute: DType,
    /// y as cuDNN writes it; may differ from ours (see the module notes).
    pub(crate) output: DType,
    /// Our workload's types.
    pub(crate) ours: Types,
    /// The descriptor's math type.
    pub(crate) math: Math,
    /// x as cuDNN counts it (n, c, h, w), stored NHWC.
    pub(crate) x_dims: [c_int; 4],
    /// w as cuDNN counts it (k, c, r, s), stored KRSC (cuDNN's NHWC filter format).
    pub(crate) w_dims: [c_int; 4],
    /// y as cuDNN counts it (n, k, p, q), stored NPQK.
    pub(crate) y_dims: [c_int; 4],
    /// Padding (h, w).
    pub(crate) pad: [c_int; 2],
    /// Stride (h, w).
    pub(crate) stride: [c_int; 2],
    /// Dilation (h, w).
    pub(crate) dilation: [c_int; 2],
}

impl ConvPlan {
    /// The plan for `c`, or why cuDNN has no configuration for it.
    pub(crate) fn new(c: &Conv2d) -> Result<ConvPlan, String> {
        let ours = c.types;
        let (config, compute, output) = match ours.input {
            DType::F16 => (TypeConfig::PseudoHalf, DType::F32, DType::F16),
            DType::Bf16 => (TypeConfig::PseudoBf16, DType::F32, DType::Bf16),
            DType::I8 if !c.c.is_multiple_of(4) => {
                return Err(format!("INT8_EXT_CONFIG needs the input channels to be a multiple of 4; C = {}", c.c));
            }
            DType::I8 => (TypeConfig::Int8Ext, DType::I32, DType::F32),
            DType::F32 | DType::Tf32 => (TypeConfig::Float, DType::F32, DType::F32),
            other => return Err(format!("{other} inputs have no cuDNN convolution configuration")),
        };
        let int = |what: &str, v: u64| {
            c_int::try_from(v).map_err(|_| format!("{what} = {v} does not fit cuDNN's 32-bit dimensions"))
        };
        let math = if ours.input == DType::F32 { Math::FmaOnly } else { Math::TensorOps };
        Ok(ConvPlan {
            config,
            // TF32 data is f32 in memory.
            input: if ours.input == DType::Tf32 { DType::F32 } else { ours.input },
            compute,
            output,
            ours,
            math,
            x_dims: [int("n", c.n)?, int("c", c.c)?, int("h", c.h)?, int("w", c.w)?],
            w_dims: [int("k", c.k)?, int("c", c.c)?, int("r", c.r)?, int("s", c.s)?],
            y_dims: [int("n", c.n)?, int("k", c.k)?, int("p", c.p())?, int("q", c.q())?],
            pad: [int("pad_h", c.pad.0)?, int("pad_w", c.pad.1)?],
            stride: [int("stride_h", c.stride.0)?, int("stride_w", c.stride.1)?],
            dilation: [int("dilation_h", c.dilation.0)?, int("dilation_w", c.dilation.1)?],
        })
    }

    /// Whether cuDNN writes another type than our kernels do; its output then goes to a buffer
    /// of its own and is converted for the cross-check.
    pub(crate) fn output_differs(&self) -> bool {
        self.output != self.ours.output
    }

    /// The tolerance cuDNN's output is checked with: our workload's, with cuDNN's output type
    /// (its rounding) in place of ours.
    pub(crate) fn tolerance(&self, c: &Conv2d) -> Tolerance {
        let types = Types { output: self.output, ..c.types };
        Tolerance::for_workload(&Workload::Conv2d(Conv2d { types, ..*c }))
    }

    /// The configuration and types, with what differs from ours, e.g.
    /// `PSEUDO_HALF_CONFIG f16->f16 (our output f32)`.
    pub(crate) fn describe(&self) -> String {
        let mut notes = Vec::new();
        match (self.config, self.math) {
            (TypeConfig::Float, Math::FmaOnly) => notes.push("FMA math only: exact f32".to_string()),
            (TypeConfig::Float, Math::TensorOps) => notes.push("tensor-op math: TF32".to_string()),
            _ => {}
        }
        if self.compute != self.ours.accumulator {
            notes.push(format!("{} accumulation, ours {}", self.compute, self.ours.accumulator));
        }
        if self.output_differs() {
            notes.push(format!("our output {}", self.ours.output));
        }
        let mut s = format!("{} {}->{}", self.config.name(), self.input, self.output);
        if !notes.is_empty() {
            s.push_str(&format!(" ({})", notes.join("; ")));
        }
        s
    }
}

/// cuDNN's data type for one of ours.
pub(super) fn data_type(d: DType) -> u32 {
    (match d {
        DType::F16 => cudnnDataType_t::CUDNN_DATA_HALF,
        DType::Bf16 => cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        DType::I8 => cudnnDataType_t::CUDNN_DATA_INT8,
        // TF32 data is f32 in memory.
        DType::F32 | DType::Tf32 => cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::I32 => cudnnDataType_t::CUDNN_DATA_INT32,
        // Conv2d::validate refuses packed types, so no conv descriptor meets one; their nearest
        // storage is bytes.
        DType::S4 | DType::U4 | DType::B1Xor | DType::B1And => cudnnDataType_t::CUDNN_DATA_INT8,
        // Conv2d::validate refuses FP8 too.
        DType::E4m3 => cudnnDataType_t::CUDNN_DATA_FP8_E4M3,
        DType::E5m2 => cudnnDataType_t::CUDNN_DATA_FP8_E5M2,
    }) as u32
}

/// The forward algorithms, with the short names the baseline's kind uses.
pub(super) const ALGOS: [(Algo, &str); 8] = [
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, "IMPLICIT_GEMM"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, "IMPLICIT_PRECOMP_GEMM"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM, "GEMM"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, "DIRECT"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_FFT, "FFT"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, "FFT_TILING"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, "WINOGRAD"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, "WINOGRAD_NONFUSED"),
];

pub(super) fn algo_name(algo: u32) -> String {
    ALGOS.iter().find(|(a, _)| *a as u32 == algo).map_or_else(|| format!("algo {algo}"), |(_, n)| (*n).to_owned())
}

pub(super) fn math_name(math: u32) -> String {
    const NAMES: [(MathType, &str); 4] = [
        (MathType::CUDNN_DEFAULT_MATH, "default math"),
        (MathType::CUDNN_TENSOR_OP_MATH, "tensor ops"),
        (MathType::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, "tensor ops with conversion"),
        (MathType::CUDNN_FMA_MATH, "FMA only"),
    ];
    NAMES.iter().find(|(m, _)| *m as u32 == math).map_or_else(|| format!("math type {math}"), |(_, n)| (*n).to_owned())
}
