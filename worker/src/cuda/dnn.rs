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

use std::ffi::{CStr, OsStr, c_char, c_int, c_void};
use std::sync::Arc;

use cudarc::cudnn::sys::{
    cudnnConvolutionDescriptor_t, cudnnConvolutionFwdAlgo_t as Algo, cudnnConvolutionFwdAlgoPerf_t,
    cudnnConvolutionMode_t, cudnnDataType_t, cudnnFilterDescriptor_t, cudnnHandle_t, cudnnMathType_t as MathType,
    cudnnStatus_t, cudnnTensorDescriptor_t, cudnnTensorFormat_t,
};
use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaStream, result};
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::{Conv2d, DType, Types, Workload};

use super::device::{Context, CudaFailure, DevBuf};
use super::workload::{InputSet, WorkloadState};
use super::{CudaExecutor, time_as_asked};
use crate::protocol::MeasureRequest;

/// The setting that names the cuDNN library to load (a path to `libcudnn.so.9`).
pub(crate) const LIB_ENV: &str = "TENSORTUNE_CUDNN_LIB";
/// Names tried through the dynamic loader's search when [`LIB_ENV`] is not set: cuDNN 9's
/// runtime name first, then the development symlink.
const LIB_NAMES: [&str; 2] = ["libcudnn.so.9", "libcudnn.so"];
/// The most workspace offered to cuDNN. FFT and Winograd algorithms ask for gigabytes on large
/// shapes; frameworks cap what they offer too, and our workloads already hold the GPU's memory.
const WORKSPACE_CAP: usize = 1 << 30;
/// Elements converted per host round trip when cuDNN's output type differs from ours.
const CONVERT_CHUNK: u64 = 1 << 22;
/// `poison_value<int>()` of the support module: what an unwritten i32 output holds.
const I32_POISON: i32 = 0x8000_0001_u32 as i32;

/// A cuDNN status, read as an integer (see the module notes).
type Status = u32;
const SUCCESS: Status = cudnnStatus_t::CUDNN_STATUS_SUCCESS as Status;

/// One row of `cudnnFindConvolutionForwardAlgorithmEx`'s answer: `cudnnConvolutionFwdAlgoPerf_t`
/// with its enums read as integers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct AlgoPerf {
    algo: u32,
    status: Status,
    time_ms: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [c_int; 3],
}

const _: () = assert!(std::mem::size_of::<AlgoPerf>() == std::mem::size_of::<cudnnConvolutionFwdAlgoPerf_t>());

macro_rules! cudnn_api {
    ($($field:ident = $symbol:literal: fn($($arg:ty),* $(,)?) -> $ret:ty;)*) => {
        /// The cuDNN entry points this baseline calls, resolved from one loaded library.
        struct Api {
            /// Keeps the library mapped while the function pointers below are in use.
            _lib: libloading::Library,
            $($field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Api {
            /// Resolves every entry point in `lib` (loaded from `path`).
            ///
            /// # Safety
            ///
            /// `lib` must be cuDNN (8 or 9): each symbol is taken with its C signature from
            /// `cudnn.h`, enums passed as 32-bit integers.
            unsafe fn resolve(lib: libloading::Library, path: &str) -> Result<Api, String> {
                $(
                    // SAFETY: the caller vouches that `lib` is cuDNN; the type is the symbol's C
                    // signature, and the pointer is used only while `_lib` keeps it mapped.
                    let $field = *unsafe { lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>($symbol) }
                        .map_err(|e| format!("{path} has no {}: {e}; is it cuDNN 9?", $symbol))?;
                )*
                Ok(Api { _lib: lib, $($field,)* })
            }
        }
    };
}

cudnn_api! {
    get_version = "cudnnGetVersion": fn() -> usize;
    error_string = "cudnnGetErrorString": fn(Status) -> *const c_char;
    create = "cudnnCreate": fn(*mut cudnnHandle_t) -> Status;
    destroy = "cudnnDestroy": fn(cudnnHandle_t) -> Status;
    set_stream = "cudnnSetStream": fn(cudnnHandle_t, *mut c_void) -> Status;
    create_tensor = "cudnnCreateTensorDescriptor": fn(*mut cudnnTensorDescriptor_t) -> Status;
    destroy_tensor = "cudnnDestroyTensorDescriptor": fn(cudnnTensorDescriptor_t) -> Status;
    set_tensor_4d = "cudnnSetTensor4dDescriptor":
        fn(cudnnTensorDescriptor_t, u32, u32, c_int, c_int, c_int, c_int) -> Status;
    create_filter = "cudnnCreateFilterDescriptor": fn(*mut cudnnFilterDescriptor_t) -> Status;
    destroy_filter = "cudnnDestroyFilterDescriptor": fn(cudnnFilterDescriptor_t) -> Status;
    set_filter_4d = "cudnnSetFilter4dDescriptor":
        fn(cudnnFilterDescriptor_t, u32, u32, c_int, c_int, c_int, c_int) -> Status;
    create_conv = "cudnnCreateConvolutionDescriptor": fn(*mut cudnnConvolutionDescriptor_t) -> Status;
    destroy_conv = "cudnnDestroyConvolutionDescriptor": fn(cudnnConvolutionDescriptor_t) -> Status;
    set_conv_2d = "cudnnSetConvolution2dDescriptor":
        fn(cudnnConvolutionDescriptor_t, c_int, c_int, c_int, c_int, c_int, c_int, u32, u32) -> Status;
    set_math_type = "cudnnSetConvolutionMathType": fn(cudnnConvolutionDescriptor_t, u32) -> Status;
    output_dim = "cudnnGetConvolution2dForwardOutputDim": fn(
        cudnnConvolutionDescriptor_t,
        cudnnTensorDescriptor_t,
        cudnnFilterDescriptor_t,
        *mut c_int,
        *mut c_int,
        *mut c_int,
        *mut c_int,
    ) -> Status;
    algo_max_count = "cudnnGetConvolutionForwardAlgorithmMaxCount": fn(cudnnHandle_t, *mut c_int) -> Status;
    workspace_size = "cudnnGetConvolutionForwardWorkspaceSize": fn(
        cudnnHandle_t,
        cudnnTensorDescriptor_t,
        cudnnFilterDescriptor_t,
        cudnnConvolutionDescriptor_t,
        cudnnTensorDescriptor_t,
        u32,
        *mut usize,
    ) -> Status;
    find_ex = "cudnnFindConvolutionForwardAlgorithmEx": fn(
        cudnnHandle_t,
        cudnnTensorDescriptor_t,
        *const c_void,
        cudnnFilterDescriptor_t,
        *const c_void,
        cudnnConvolutionDescriptor_t,
        cudnnTensorDescriptor_t,
        *mut c_void,
        c_int,
        *mut c_int,
        *mut AlgoPerf,
        *mut c_void,
        usize,
    ) -> Status;
    forward = "cudnnConvolutionForward": fn(
        cudnnHandle_t,
        *const c_void,
        cudnnTensorDescriptor_t,
        *const c_void,
        cudnnFilterDescriptor_t,
        *const c_void,
        cudnnConvolutionDescriptor_t,
        u32,
        *mut c_void,
        usize,
        *const c_void,
        cudnnTensorDescriptor_t,
        *mut c_void,
    ) -> Status;
}

impl Api {
    /// Loads cuDNN from `setting` (the value of [`LIB_ENV`]) when given, else by [`LIB_NAMES`].
    /// The error says how to point the worker at the library.
    fn open(setting: Option<&OsStr>) -> Result<Api, String> {
        let (lib, path) = match setting {
            Some(path) => {
                // SAFETY: loading a shared library runs its initialisers; cuDNN's have no
                // preconditions. A library that is not cuDNN fails symbol resolution below.
                let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
                    format!(
                        "cuDNN not found: {LIB_ENV}={path:?} could not be loaded ({}); point it at libcudnn.so.9",
                        dl_error(&e)
                    )
                })?;
                (lib, path.to_string_lossy().into_owned())
            }
            None => {
                let mut errors = Vec::new();
                let mut found = None;
                for name in LIB_NAMES {
                    // SAFETY: as above.
                    match unsafe { libloading::Library::new(name) } {
                        Ok(lib) => {
                            found = Some((lib, name.to_owned()));
                            break;
                        }
                        Err(e) => errors.push(dl_error(&e)),
                    }
                }
                found.ok_or_else(|| {
                    format!(
                        "cuDNN not found (tried {} on the loader's path: {}); set {LIB_ENV}=/path/to/libcudnn.so.9 \
                         or add its directory to LD_LIBRARY_PATH",
                        LIB_NAMES.join(", "),
                        errors.join("; ")
                    )
                })?
            }
        };
        // SAFETY: the library was loaded as cuDNN; `resolve` checks every symbol exists.
        unsafe { Api::resolve(lib, &path) }
    }

    /// cuDNN's name for a status, e.g. `CUDNN_STATUS_NOT_SUPPORTED`.
    fn status_text(&self, status: Status) -> String {
        // SAFETY: cudnnGetErrorString accepts any value and returns a static string (or null).
        let p = unsafe { (self.error_string)(status) };
        if p.is_null() {
            return format!("cuDNN status {status}");
        }
        // SAFETY: a non-null result is a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn check(&self, status: Status, call: &str) -> Result<(), String> {
        if status == SUCCESS { Ok(()) } else { Err(format!("{call} failed: {}", self.status_text(status))) }
    }
}

/// The loader's own words (`dlerror`): libloading's `Display` says only "dlopen failed".
fn dl_error(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// `cudnnGetVersion`'s number as text: `MAJOR*10000 + MINOR*100 + PATCH` since cuDNN 9,
/// `MAJOR*1000 + MINOR*100 + PATCH` before.
fn version_text(v: usize) -> String {
    if v >= 90_000 {
        format!("{}.{}.{}", v / 10_000, v / 100 % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    }
}

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
    fn descriptor(self) -> u32 {
        match self {
            Math::TensorOps => MathType::CUDNN_TENSOR_OP_MATH as u32,
            Math::FmaOnly => MathType::CUDNN_FMA_MATH as u32,
        }
    }

    /// The candidates to time, from the search's usable rows (fastest first): all of them as
    /// cuDNN listed them, or for [`Math::FmaOnly`] each algorithm once, with FMA math whatever
    /// math type it was listed with.
    fn candidates(self, usable: &[AlgoPerf]) -> Vec<AlgoPerf> {
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
fn data_type(d: DType) -> u32 {
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
    }) as u32
}

/// The forward algorithms, with the short names the baseline's kind uses.
const ALGOS: [(Algo, &str); 8] = [
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, "IMPLICIT_GEMM"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, "IMPLICIT_PRECOMP_GEMM"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM, "GEMM"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, "DIRECT"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_FFT, "FFT"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, "FFT_TILING"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, "WINOGRAD"),
    (Algo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, "WINOGRAD_NONFUSED"),
];

fn algo_name(algo: u32) -> String {
    ALGOS.iter().find(|(a, _)| *a as u32 == algo).map_or_else(|| format!("algo {algo}"), |(_, n)| (*n).to_owned())
}

fn math_name(math: u32) -> String {
    const NAMES: [(MathType, &str); 4] = [
        (MathType::CUDNN_DEFAULT_MATH, "default math"),
        (MathType::CUDNN_TENSOR_OP_MATH, "tensor ops"),
        (MathType::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, "tensor ops with conversion"),
        (MathType::CUDNN_FMA_MATH, "FMA only"),
    ];
    NAMES.iter().find(|(m, _)| *m as u32 == math).map_or_else(|| format!("math type {math}"), |(_, n)| (*n).to_owned())
}

/// A cuDNN handle on the measuring stream.
pub(crate) struct Dnn {
    api: Api,
    handle: cudnnHandle_t,
    /// e.g. `9.14.0`.
    version: String,
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
    fn describe(&self, plan: &ConvPlan) -> Result<ConvDescs<'_>, String> {
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
struct ConvDescs<'a> {
    dnn: &'a Dnn,
    x: cudnnTensorDescriptor_t,
    w: cudnnFilterDescriptor_t,
    y: cudnnTensorDescriptor_t,
    conv: cudnnConvolutionDescriptor_t,
}

impl ConvDescs<'_> {
    fn set_math(&self, math: u32) -> Result<(), String> {
        let a = &self.dnn.api;
        // SAFETY: the descriptor is live; cuDNN rejects an unknown math type with a status.
        a.check(unsafe { (a.set_math_type)(self.conv, math) }, "cudnnSetConvolutionMathType")
    }

    /// The largest workspace any algorithm asks for, up to [`WORKSPACE_CAP`].
    fn workspace_bytes(&self) -> usize {
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
    unsafe fn find(&self, x: u64, w: u64, y: u64, workspace: &DevBuf) -> Result<Vec<AlgoPerf>, String> {
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
    unsafe fn forward(&self, algo: u32, x: u64, w: u64, y: u64, workspace: &DevBuf) -> Result<(), CudaFailure> {
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

/// Converts `src` (elements of `from`, little-endian) into `to`, appending to `out` after
/// clearing it. Only the conversions [`ConvPlan`] needs exist; all are exact (f32 -> i32 holds
/// for integral values, which int32 accumulation converted to float is). Unwritten elements
/// (NaN) stay unwritten: NaN, or the i32 poison.
pub(crate) fn convert_host(src: &[u8], from: DType, to: DType, out: &mut Vec<u8>) -> Result<(), String> {
    out.clear();
    match (from, to) {
        (DType::F16, DType::F32) => {
            for b in src.chunks_exact(2) {
                out.extend_from_slice(&half::f16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes());
            }
        }
        (DType::Bf16, DType::F32) => {
            for b in src.chunks_exact(2) {
                out.extend_from_slice(&half::bf16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes());
            }
        }
        (DType::F32, DType::I32) => {
            for b in src.chunks_exact(4) {
                let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                // `as` saturates out-of-range values; the comparison then flags them.
                let i = if v.is_nan() { I32_POISON } else { v.round() as i32 };
                out.extend_from_slice(&i.to_le_bytes());
            }
        }
        _ => return Err(format!("no conversion from cuDNN's {from} output to {to}")),
    }
    Ok(())
}

/// Copies `elems` elements of `from` at `src` into `dst` as `to`, through the host.
fn copy_converted(
    stream: &CudaStream,
    src: u64,
    from: DType,
    dst: u64,
    to: DType,
    elems: u64,
) -> Result<(), CudaFailure> {
    stream.synchronize().when(|| "waiting for cuDNN's output".into())?;
    let (fb, tb) = (from.bytes() as u64, to.bytes() as u64);
    let mut raw = vec![0u8; (elems.min(CONVERT_CHUNK) * fb) as usize];
    let mut converted = Vec::with_capacity((elems.min(CONVERT_CHUNK) * tb) as usize);
    let mut done = 0;
    while done < elems {
        let n = (elems - done).min(CONVERT_CHUNK);
        let chunk = &mut raw[..(n * fb) as usize];
        // SAFETY: `src` holds `elems` elements of `from`, `dst` of `to`; the chunk is in bounds.
        unsafe { result::memcpy_dtoh_sync(chunk, src + done * fb) }.when(|| "reading cuDNN's output".into())?;
        convert_host(chunk, from, to, &mut converted)
            .map_err(|context| CudaFailure { code: CUresult::CUDA_ERROR_NOT_SUPPORTED, context })?;
        // SAFETY: as above.
        unsafe { result::memcpy_htod_sync(dst + done * tb, &converted) }
            .when(|| "writing cuDNN's converted output".into())?;
        done += n;
    }
    Ok(())
}

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
            |enqueue| {
                time_as_asked(&self.ctx, &self.stream, self.facts.l2_bytes, &mut self.flush_scratch, req, enqueue)
            },
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

    let mut best: Option<(f64, AlgoPerf)> = None;
    let mut untimed = Vec::new();
    for p in &usable {
        descs.set_math(p.math_type).map_err(Why::Cudnn)?;
        // SAFETY: as for `find`; the workspace covers `p.memory`.
        let mut enqueue = |_: &Arc<CudaStream>| unsafe { descs.forward(p.algo, xt, wt, y, &workspace) };
        match time(&mut enqueue) {
            Ok(t) => {
                tracing::debug!(workload = %req.workload_key, algo = %algo_name(p.algo), us = t.median_us, "cuDNN candidate timed");
                if best.is_none_or(|(us, _)| t.median_us < us) {
                    best = Some((t.median_us, *p));
                }
            }
            Err(f) if f.is_sticky() => return Err(Why::Cuda(f)),
            Err(f) => {
                tracing::warn!(workload = %req.workload_key, algo = %algo_name(p.algo), "cuDNN algorithm not timed: {f}");
                untimed.push(format!("{}: {f}", algo_name(p.algo)));
            }
        }
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
    // SAFETY: as for `find`.
    unsafe { descs.forward(chosen.algo, xc, wc, y, &workspace) }?;
    let tolerance = match &own_y {
        Some(buf) => {
            copy_converted(stream, buf.ptr, plan.output, w.d.ptr, plan.ours.output, out_elems)?;
            plan.tolerance(conv)
        }
        None => req.tolerance,
    };
    let c = w.compare(stream, &tolerance)?;
    let mut kind = format!(
        "cudnnConvolutionForward {} ({}), {}, fastest of {} candidates",
        algo_name(chosen.algo),
        math_name(chosen.math_type),
        plan.describe(),
        usable.len() - untimed.len()
    );
    if !untimed.is_empty() {
        kind.push_str(&format!(" ({} more failed to run or to be captured)", untimed.len()));
    }
    kind.push_str(&format!(", cuDNN {}", dnn.version));
    if c.failures > 0 {
        tracing::warn!(workload = %req.workload_key, failures = c.failures, max_abs = c.max_abs, "cuDNN disagrees with the reference");
        kind.push_str(&format!(" ({}: {} elements, max abs error {:.3e})", super::CHECK_FAILED, c.failures, c.max_abs));
    }
    Ok((us, kind, ConvPick(chosen)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(input: DType, acc: DType, out: DType, c: u64, k: u64) -> Conv2d {
        let w = Conv2d {
            n: 1,
            h: 56,
            w: 56,
            c,
            k,
            r: 3,
            s: 3,
            pad: (1, 1),
            stride: (2, 2),
            dilation: (1, 1),
            types: Types::new(input, acc, Some(out)).unwrap(),
        };
        w.validate().unwrap();
        w
    }

    #[test]
    fn f16_to_f32_runs_as_pseudo_half_with_a_half_output() {
        let c = conv(DType::F16, DType::F32, DType::F32, 64, 128);
        let p = ConvPlan::new(&c).unwrap();
        assert_eq!(
            (p.config, p.input, p.compute, p.output),
            (TypeConfig::PseudoHalf, DType::F16, DType::F32, DType::F16)
        );
        assert!(p.output_differs());
        assert_eq!(p.describe(), "PSEUDO_HALF_CONFIG f16->f16 (our output f32)");
        assert_eq!(p.x_dims, [1, 64, 56, 56]);
        assert_eq!(p.w_dims, [128, 64, 3, 3]);
        assert_eq!(p.y_dims, [1, 128, 28, 28]);
        assert_eq!((p.pad, p.stride, p.dilation), ([1, 1], [2, 2], [1, 1]));
        // cuDNN's half output is checked with half rounding, not our f32's.
        let ours = Tolerance::for_workload(&Workload::Conv2d(c));
        let t = p.tolerance(&c);
        assert_eq!(t.acc, ours.acc);
        assert!(t.out > 100.0 * ours.out, "{t:?} vs {ours:?}");
    }

    #[test]
    fn f16_to_f16_matches_our_output() {
        let p = ConvPlan::new(&conv(DType::F16, DType::F32, DType::F16, 64, 128)).unwrap();
        assert_eq!((p.config, p.output), (TypeConfig::PseudoHalf, DType::F16));
        assert!(!p.output_differs());
        assert_eq!(p.describe(), "PSEUDO_HALF_CONFIG f16->f16");
        let p = ConvPlan::new(&conv(DType::F16, DType::F16, DType::F16, 64, 128)).unwrap();
        assert_eq!((p.compute, p.output_differs()), (DType::F32, false));
        assert_eq!(p.describe(), "PSEUDO_HALF_CONFIG f16->f16 (f32 accumulation, ours f16)");
        let p = ConvPlan::new(&conv(DType::Bf16, DType::F32, DType::F32, 64, 128)).unwrap();
        assert_eq!((p.config, p.output), (TypeConfig::PseudoBf16, DType::Bf16));
    }

    #[test]
    fn i8_runs_as_int8_ext_with_a_float_output() {
        let c = conv(DType::I8, DType::I32, DType::I32, 64, 128);
        let p = ConvPlan::new(&c).unwrap();
        assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::Int8Ext, DType::I8, DType::I32, DType::F32));
        assert!(p.output_differs());
        assert_eq!(p.describe(), "INT8_EXT_CONFIG i8->f32 (our output i32)");
        let t = p.tolerance(&c);
        assert_eq!(t.acc, 0.0, "int32 accumulation is exact");
        assert!(t.out > 0.0 && t.out < 1e-6, "float output rounding only: {t:?}");
        assert_eq!(data_type(p.compute), cudnnDataType_t::CUDNN_DATA_INT32 as u32);
        assert_eq!(data_type(p.output), cudnnDataType_t::CUDNN_DATA_FLOAT as u32);
    }

    #[test]
    fn i8_with_channels_not_a_multiple_of_4_is_unsupported() {
        let e = ConvPlan::new(&conv(DType::I8, DType::I32, DType::I32, 3, 64)).unwrap_err();
        assert!(e.contains("INT8_EXT_CONFIG") && e.contains("C = 3"), "{e}");
    }

    #[test]
    fn f32_runs_as_float_config_with_fma_math_and_tf32_with_tensor_ops() {
        let exact = conv(DType::F32, DType::F32, DType::F32, 64, 128);
        let p = ConvPlan::new(&exact).unwrap();
        assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::Float, DType::F32, DType::F32, DType::F32));
        assert_eq!(p.math, Math::FmaOnly);
        assert!(!p.output_differs());
        assert_eq!(p.describe(), "FLOAT_CONFIG f32->f32 (FMA math only: exact f32)");
        assert_eq!(p.math.descriptor(), MathType::CUDNN_FMA_MATH as u32);
        assert_eq!(p.tolerance(&exact), Tolerance::for_workload(&Workload::Conv2d(exact)));

        let tf32 = conv(DType::Tf32, DType::F32, DType::F32, 64, 128);
        let p = ConvPlan::new(&tf32).unwrap();
        // TF32 data is f32 in memory: the same descriptors, another math type.
        assert_eq!((p.config, p.input, p.compute, p.output), (TypeConfig::Float, DType::F32, DType::F32, DType::F32));
        assert_eq!(p.math, Math::TensorOps);
        assert_eq!(p.describe(), "FLOAT_CONFIG f32->f32 (tensor-op math: TF32)");
        assert_eq!(p.math.descriptor(), MathType::CUDNN_TENSOR_OP_MATH as u32);
        assert_eq!(data_type(p.input), cudnnDataType_t::CUDNN_DATA_FLOAT as u32);
        // TF32's cross-check is looser than exact f32's.
        assert!(p.tolerance(&tf32).acc > 100.0 * ConvPlan::new(&exact).unwrap().tolerance(&exact).acc);
    }

    #[test]
    fn fma_only_times_each_algorithm_once_with_fma_math() {
        let row =
            |algo: Algo, math: MathType| AlgoPerf { algo: algo as u32, math_type: math as u32, ..AlgoPerf::default() };
        let found = [
            row(Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, MathType::CUDNN_TENSOR_OP_MATH),
            row(Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, MathType::CUDNN_DEFAULT_MATH),
            row(Algo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM, MathType::CUDNN_FMA_MATH),
        ];
        let fma = Math::FmaOnly.candidates(&found);
        assert_eq!(fma.len(), 2, "{fma:?}");
        assert!(fma.iter().all(|p| p.math_type == MathType::CUDNN_FMA_MATH as u32), "{fma:?}");
        assert_eq!(fma[0].algo, Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM as u32, "the order is kept");
        let ops = Math::TensorOps.candidates(&found);
        assert_eq!(ops.iter().map(|p| p.math_type).collect::<Vec<_>>(), found.map(|p| p.math_type));
        assert_eq!(math_name(MathType::CUDNN_FMA_MATH as u32), "FMA only");
    }

    #[test]
    fn conversions_are_exact_and_keep_poison() {
        let mut out = Vec::new();
        let src: Vec<u8> =
            [1.5f32, -0.125, f32::NAN].iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        convert_host(&src, DType::F16, DType::F32, &mut out).unwrap();
        let got: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(&got[..2], &[1.5, -0.125]);
        assert!(got[2].is_nan());

        let src: Vec<u8> = [12345.0f32, -7.0, f32::NAN].iter().flat_map(|v| v.to_le_bytes()).collect();
        convert_host(&src, DType::F32, DType::I32, &mut out).unwrap();
        let got: Vec<i32> = out.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(got, [12345, -7, I32_POISON]);

        assert!(convert_host(&[0; 4], DType::F32, DType::F16, &mut out).is_err());
    }

    #[test]
    fn a_missing_library_is_a_clear_message_not_a_panic() {
        let e = Api::open(Some(OsStr::new("/nonexistent/libcudnn.so.9"))).err().expect("no such file");
        assert!(e.starts_with("cuDNN not found") && e.contains(LIB_ENV) && e.contains("/nonexistent"), "{e}");
        // A library that is not cuDNN: refused by name, not called.
        let e = Api::open(Some(OsStr::new("libm.so.6"))).err().expect("libm is not cuDNN");
        assert!(e.contains("has no cudnnGetVersion"), "{e}");
        // Without the setting: found on this machine or not, never a panic.
        if let Err(e) = Api::open(None) {
            assert!(e.starts_with("cuDNN not found") && e.contains("LD_LIBRARY_PATH"), "{e}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(version_text(91400), "9.14.0");
        assert_eq!(version_text(90100), "9.1.0");
        assert_eq!(version_text(8907), "8.9.7");
        assert_eq!(algo_name(Algo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM as u32), "IMPLICIT_PRECOMP_GEMM");
        assert_eq!(algo_name(42), "algo 42");
        assert_eq!(math_name(1), "tensor ops");
    }
}
