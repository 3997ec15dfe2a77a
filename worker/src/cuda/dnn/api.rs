//! The cuDNN bindings: the library loaded with `libloading` (see the notes of [`super`]), its
//! entry points as a table of function pointers, statuses read as integers.

use std::ffi::{CStr, OsStr, c_char, c_int, c_void};

use cudarc::cudnn::sys::{
    cudnnActivationDescriptor_t, cudnnConvolutionDescriptor_t, cudnnConvolutionFwdAlgoPerf_t, cudnnFilterDescriptor_t,
    cudnnHandle_t, cudnnStatus_t, cudnnTensorDescriptor_t,
};

/// The setting that names the cuDNN library to load (a path to `libcudnn.so.9`).
pub(crate) const LIB_ENV: &str = "TENSORTUNE_CUDNN_LIB";
/// Names tried through the dynamic loader's search when [`LIB_ENV`] is not set: cuDNN 9's
/// runtime name first, then the development symlink.
pub(super) const LIB_NAMES: [&str; 2] = ["libcudnn.so.9", "libcudnn.so"];

/// A cuDNN status, read as an integer (see the module notes).
pub(super) type Status = u32;
pub(super) const SUCCESS: Status = cudnnStatus_t::CUDNN_STATUS_SUCCESS as Status;

/// One row of `cudnnFindConvolutionForwardAlgorithmEx`'s answer: `cudnnConvolutionFwdAlgoPerf_t`
/// with its enums read as integers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct AlgoPerf {
    pub(super) algo: u32,
    pub(super) status: Status,
    pub(super) time_ms: f32,
    pub(super) memory: usize,
    pub(super) determinism: u32,
    pub(super) math_type: u32,
    pub(super) reserved: [c_int; 3],
}

const _: () = assert!(std::mem::size_of::<AlgoPerf>() == std::mem::size_of::<cudnnConvolutionFwdAlgoPerf_t>());

macro_rules! cudnn_api {
    ($($field:ident = $symbol:literal: fn($($arg:ty),* $(,)?) -> $ret:ty;)*) => {
        /// The cuDNN entry points this baseline calls, resolved from one loaded library.
        pub(super) struct Api {
            /// Keeps the library mapped while the function pointers below are in use.
            _lib: libloading::Library,
            $(pub(super) $field: unsafe extern "C" fn($($arg),*) -> $ret,)*
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
    create_act = "cudnnCreateActivationDescriptor": fn(*mut cudnnActivationDescriptor_t) -> Status;
    destroy_act = "cudnnDestroyActivationDescriptor": fn(cudnnActivationDescriptor_t) -> Status;
    set_act = "cudnnSetActivationDescriptor": fn(cudnnActivationDescriptor_t, u32, u32, f64) -> Status;
    bias_act_forward = "cudnnConvolutionBiasActivationForward": fn(
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
        *const c_void,
        cudnnTensorDescriptor_t,
        *const c_void,
        cudnnActivationDescriptor_t,
        cudnnTensorDescriptor_t,
        *mut c_void,
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
    pub(super) fn open(setting: Option<&OsStr>) -> Result<Api, String> {
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
    pub(super) fn status_text(&self, status: Status) -> String {
        // SAFETY: cudnnGetErrorString accepts any value and returns a static string (or null).
        let p = unsafe { (self.error_string)(status) };
        if p.is_null() {
            return format!("cuDNN status {status}");
        }
        // SAFETY: a non-null result is a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    pub(super) fn check(&self, status: Status, call: &str) -> Result<(), String> {
        if status == SUCCESS { Ok(()) } else { Err(format!("{call} failed: {}", self.status_text(status))) }
    }
}

/// The loader's own words (`dlerror`): libloading's `Display` says only "dlopen failed".
pub(super) fn dl_error(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// `cudnnGetVersion`'s number as text: `MAJOR*10000 + MINOR*100 + PATCH` since cuDNN 9,
/// `MAJOR*1000 + MINOR*100 + PATCH` before.
pub(super) fn version_text(v: usize) -> String {
    if v >= 90_000 {
        format!("{}.{}.{}", v / 10_000, v / 100 % 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, v / 100 % 10, v % 100)
    }
}
