//! Device plumbing: the context, raw device buffers, launches by raw pointer, device facts, and
//! the classification of driver errors into record statuses.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute as Attr, CUresult};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg, result};
use tensortune_kernels::Target;
use tensortune_kernels::target::class_key;

use crate::protocol::Device;

/// A driver error with what we were doing when it happened.
#[derive(Debug, Clone)]
pub(crate) struct CudaFailure {
    /// The driver's result code.
    pub(crate) code: CUresult,
    /// "when loading tt_wmma_gemm_...", etc.
    pub(crate) context: String,
}

impl CudaFailure {
    pub(crate) fn new(e: DriverError, context: impl Into<String>) -> CudaFailure {
        CudaFailure { code: e.0, context: context.into() }
    }

    /// Whether the error leaves the context unusable (every later call fails the same way).
    pub(crate) fn is_sticky(&self) -> bool {
        use CUresult::*;
        matches!(
            self.code,
            CUDA_ERROR_ILLEGAL_ADDRESS
                | CUDA_ERROR_LAUNCH_FAILED
                | CUDA_ERROR_MISALIGNED_ADDRESS
                | CUDA_ERROR_ILLEGAL_INSTRUCTION
                | CUDA_ERROR_HARDWARE_STACK_ERROR
                | CUDA_ERROR_INVALID_PC
                | CUDA_ERROR_ASSERT
                | CUDA_ERROR_INVALID_ADDRESS_SPACE
                | CUDA_ERROR_LAUNCH_TIMEOUT
                | CUDA_ERROR_ECC_UNCORRECTABLE
                | CUDA_ERROR_CONTEXT_IS_DESTROYED
                | CUDA_ERROR_UNKNOWN
        )
    }

    /// Whether the error says the launch configuration cannot run (too many registers or threads,
    /// too much shared memory), which makes the config invalid rather than faulty.
    pub(crate) fn is_resource_limit(&self) -> bool {
        matches!(self.code, CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES | CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

impl std::fmt::Display for CudaFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let err = DriverError(self.code);
        let name =
            err.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", self.code));
        let text = err.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        write!(f, "{name} ({text}) {}", self.context)
    }
}

/// Adds context to a driver result.
pub(crate) trait Context<T> {
    fn when(self, what: impl FnOnce() -> String) -> Result<T, CudaFailure>;
}

impl<T> Context<T> for Result<T, DriverError> {
    fn when(self, what: impl FnOnce() -> String) -> Result<T, CudaFailure> {
        self.map_err(|e| CudaFailure::new(e, what()))
    }
}

/// Device memory addressed by raw pointer. The kernels under test receive raw pointers; cudarc's
/// typed slices would add event tracking around every launch, which we do not want inside graphs.
pub(crate) struct DevBuf {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    /// Allocates `bytes` (at least 256, so an unused buffer is still a valid pointer).
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DevBuf, CudaFailure> {
        let bytes = bytes.max(256);
        ctx.bind_to_thread().when(|| "binding the context".into())?;
        // SAFETY: the context is bound to this thread; the pointer is freed exactly once in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.when(|| format!("allocating {bytes} bytes"))?;
        Ok(DevBuf { ptr, bytes, ctx: ctx.clone() })
    }

    /// Allocates and zero-fills.
    pub(crate) fn zeroed(ctx: &Arc<CudaContext>, stream: &CudaStream, bytes: usize) -> Result<DevBuf, CudaFailure> {
        let buf = DevBuf::new(ctx, bytes)?;
        buf.fill_async(stream, 0).when(|| "zeroing a buffer".into())?;
        Ok(buf)
    }

    /// Allocates and copies `data` in (at least 256 bytes, as [`DevBuf::new`]).
    pub(crate) fn from_bytes(ctx: &Arc<CudaContext>, data: &[u8]) -> Result<DevBuf, CudaFailure> {
        let buf = DevBuf::new(ctx, data.len())?;
        // SAFETY: the buffer holds at least data.len() bytes; the copy is synchronous.
        unsafe { result::memcpy_htod_sync(buf.ptr, data) }.when(|| "copying epilogue vectors in".into())?;
        Ok(buf)
    }

    /// Enqueues a write of `value` to every byte on `stream`.
    pub(crate) fn fill_async(&self, stream: &CudaStream, value: u8) -> Result<(), DriverError> {
        // SAFETY: ptr spans `bytes` bytes of this context's memory.
        unsafe { result::memset_d8_async(self.ptr, value, self.bytes, stream.cu_stream()) }
    }

    /// Copies the first `N` u64 words to the host (synchronises the stream first).
    pub(crate) fn read_u64<const N: usize>(&self, stream: &CudaStream) -> Result<[u64; N], CudaFailure> {
        stream.synchronize().when(|| "waiting for the stream".into())?;
        let mut out = [0u64; N];
        // SAFETY: the buffer holds at least 256 bytes >= N * 8 for the N we use (5).
        unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr) }.when(|| "reading back statistics".into())?;
        Ok(out)
    }

    /// Writes `words` at the start of the buffer.
    pub(crate) fn write_u64(&self, stream: &CudaStream, words: &[u64]) -> Result<(), CudaFailure> {
        stream.synchronize().when(|| "waiting for the stream".into())?;
        // SAFETY: words.len() * 8 <= self.bytes for every caller (5 words in a 256-byte buffer).
        unsafe { result::memcpy_htod_sync(self.ptr, words) }.when(|| "writing statistics".into())
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync in `new`, freed once; errors (a dead context) are ignored.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KArg {
    /// A device pointer.
    Ptr(sys::CUdeviceptr),
    /// An unsigned 64-bit value.
    U64(u64),
    /// An unsigned 32-bit value.
    U32(u32),
    /// A signed 32-bit value.
    I32(i32),
    /// A double.
    F64(f64),
    /// A TMA tensor map, passed by value.
    Map(tensortune_bundle::MapParam),
}

/// Launches `func` on `stream` with the given arguments.
pub(crate) fn launch(
    stream: &CudaStream,
    func: &CudaFunction,
    cfg: LaunchConfig,
    args: &[KArg],
) -> Result<(), DriverError> {
    let mut b = stream.launch_builder(func);
    for a in args {
        match a {
            KArg::Ptr(p) | KArg::U64(p) => b.arg(p),
            KArg::U32(v) => b.arg(v),
            KArg::I32(v) => b.arg(v),
            KArg::F64(v) => b.arg(v),
            KArg::Map(m) => b.arg(m),
        };
    }
    // SAFETY: every caller passes the argument list of the kernel's signature (the generated
    // kernels' signatures come from `Launch::args`, the support kernels' from `support::ENTRIES`),
    // and every pointer is a live DevBuf of the sizes the kernel was generated for.
    unsafe { b.launch(cfg) }.map(|_| ())
}

/// A grid-stride launch shape for `n` elements.
pub(crate) fn grid_for(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 16) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Reads the device's facts.
pub(crate) fn facts(ctx: &Arc<CudaContext>) -> Result<Device, CudaFailure> {
    let attr = |a: Attr| ctx.attribute(a).map(|v| v.max(0) as u32).when(|| format!("reading {a:?}"));
    let name = ctx.name().when(|| "reading the device name".into())?;
    let (major, minor) = ctx.compute_capability().when(|| "reading the compute capability".into())?;
    let arch = (major * 10 + minor) as u32;
    let sm_count = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let uuid = ctx.uuid().map(|u| format_uuid(&u.bytes)).unwrap_or_default();
    let mut version = 0i32;
    // SAFETY: a valid out-pointer; the driver is loaded (the context exists).
    let cuda_version = if unsafe { sys::cuDriverGetVersion(&mut version) } == CUresult::CUDA_SUCCESS {
        format!("{}.{}", version / 1000, (version % 1000) / 10)
    } else {
        String::new()
    };
    Ok(Device {
        target: Target {
            class_key: class_key(&name, arch, sm_count),
            name,
            arch,
            sm_count,
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_smem_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            smem_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            regs_per_sm: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
        },
        memory_bytes: ctx.total_mem().map(|m| m as u64).unwrap_or(0),
        uuid,
        driver_version: driver_version().unwrap_or_default(),
        cuda_version,
        nvrtc_version: String::new(),
        sm_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000,
        mem_clock_mhz: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? / 1000,
    })
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as nvidia-smi prints it.
fn format_uuid(bytes: &[std::ffi::c_char; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The kernel driver's version (e.g. `580.159.04`), from `/proc/driver/nvidia/version`.
fn driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    text.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.matches('.').count() >= 1)
        .map(str::to_owned)
}
