//! Loading an entry's cubin and launching it on a stream through the CUDA driver API (cudarc),
//! the way tensortune's worker measured it: dynamic shared memory opted into above 48 KiB, the
//! workspace zeroed once, tensor maps encoded over the caller's buffers, one `cuLaunchKernel`.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUfunction_attribute_enum as FnAttr};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig, PushKernelArg, result,
};
use cudarc::nvrtc::Ptx;

use crate::manifest::{Bundle, DType, Entry, Im2colRecipe, MapRecipe, Operand, Param};
use crate::{Error, Result};

/// Shared memory a block may use without opting in.
const DEFAULT_SMEM_LIMIT: u32 = 48 * 1024;

/// The caller's device buffers (raw pointers, sized for the entry's problem: `Entry::elements`).
/// C may be 0 when the problem's beta is 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct Operands {
    /// A (matmul) / input (conv).
    pub a: sys::CUdeviceptr,
    /// B (matmul) / filter (conv).
    pub b: sys::CUdeviceptr,
    /// C, read when beta != 0.
    pub c: sys::CUdeviceptr,
    /// The output D.
    pub d: sys::CUdeviceptr,
    /// A fused epilogue's bias (M values of the output type); 0 when the entry has none.
    pub bias: sys::CUdeviceptr,
    /// A fused epilogue's per-row scale (M f32 values); 0 when the entry has none.
    pub scale: sys::CUdeviceptr,
    /// FP8 inputs' per-tensor scales (two f32 values, A's then B's); 0 when the entry has none.
    pub tensor_scales: sys::CUdeviceptr,
}

/// A CUtensorMap as a kernel parameter (a `const __grid_constant__` 128-byte value), pushed onto
/// a cudarc launch with `arg`.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct MapParam(sys::CUtensorMap);

impl std::fmt::Debug for MapParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MapParam(..)")
    }
}

// SAFETY: a plain 128-byte value the driver copies into the kernel's parameter space, as the
// generated kernels declare it.
unsafe impl cudarc::driver::DeviceRepr for MapParam {}

/// A loaded kernel of a bundle with its workspace, ready to launch.
pub struct LoadedKernel {
    entry: Entry,
    func: CudaFunction,
    _module: Arc<CudaModule>,
    workspace: Option<Workspace>,
    ctx: Arc<CudaContext>,
}

/// Device scratch owned by a [`LoadedKernel`].
struct Workspace {
    ptr: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync in `LoadedKernel::load`, freed once here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

fn cuda(context: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
    let context = context.into();
    move |source| Error::Cuda { context, source }
}

impl LoadedKernel {
    /// Loads `entry`'s cubin for the context's GPU, opts it into its shared memory and allocates
    /// and zeroes its workspace.
    pub fn load(ctx: &Arc<CudaContext>, bundle: &Bundle, entry: &Entry) -> Result<LoadedKernel> {
        let (major, minor) = ctx.compute_capability().map_err(cuda("reading the compute capability"))?;
        let arch = (major * 10 + minor) as u32;
        let file = entry.cubin_for(arch).ok_or_else(|| Error::NoCubin {
            kernel: entry.name.clone(),
            arch,
            have: entry.cubins.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        let path = bundle.dir.join(file);
        let image = std::fs::read(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let module =
            ctx.load_module(Ptx::from_binary(image)).map_err(cuda(format!("when loading {}", path.display())))?;
        let func = module.load_function(&entry.entry).map_err(cuda(format!("when looking up {}", entry.entry)))?;
        let static_smem = func.get_attribute(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).unwrap_or(0).max(0) as u32;
        let dynamic = entry.launch.dynamic_smem_bytes;
        if static_smem + dynamic > DEFAULT_SMEM_LIMIT {
            func.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic as i32)
                .map_err(cuda(format!("when opting {} into {dynamic} bytes of shared memory", entry.name)))?;
        }
        let workspace = match entry.workspace_bytes {
            0 => None,
            bytes => {
                ctx.bind_to_thread().map_err(cuda("binding the context"))?;
                // SAFETY: the context is bound to this thread; the pointer is freed once by Workspace's Drop.
                let ptr = unsafe { result::malloc_sync(bytes as usize) }
                    .map_err(cuda(format!("allocating {bytes} bytes of workspace")))?;
                let ws = Workspace { ptr, ctx: ctx.clone() };
                // SAFETY: ptr spans `bytes` bytes of this context's memory; a synchronous memset.
                unsafe { result::memset_d8_sync(ptr, 0, bytes as usize) }.map_err(cuda("zeroing the workspace"))?;
                Some(ws)
            }
        };
        Ok(LoadedKernel { entry: entry.clone(), func, _module: module, workspace, ctx: ctx.clone() })
    }

    /// The entry it was loaded from.
    pub fn entry(&self) -> &Entry {
        &self.entry
    }

    /// Enqueues one launch on `stream` over `ops`. Tensor maps are encoded on every call (host
    /// work, no GPU synchronisation); launches that share this kernel's workspace must not run
    /// concurrently (one stream, or one `LoadedKernel` per stream).
    ///
    /// # Safety
    ///
    /// Every pointer of `ops` the kernel uses must be a live device allocation of this context
    /// holding at least `Entry::elements` elements of the problem's type for its operand (D
    /// writable), aligned to 16 bytes, and stay alive until the launch has finished.
    pub unsafe fn launch(&self, stream: &CudaStream, ops: &Operands) -> Result<()> {
        enum Arg {
            Ptr(u64),
            Map(MapParam),
        }
        let ws = self.workspace.as_ref().map_or(0, |w| w.ptr);
        let args: Vec<Arg> = self
            .entry
            .params
            .iter()
            .map(|p| match p {
                Param::Pointer { operand } => Ok(Arg::Ptr(pointer(ops, ws, *operand, &self.entry.name)?)),
                Param::TensorMap(MapRecipe { operand, .. }) | Param::Im2colMap(Im2colRecipe { operand, .. }) => {
                    let ptr = pointer(ops, ws, *operand, &self.entry.name)?;
                    encode_map(p, ptr).map(|m| Arg::Map(m.expect("a map parameter encodes to a map")))
                }
            })
            .collect::<Result<_>>()?;
        self.ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let l = &self.entry.launch;
        let cfg = LaunchConfig {
            grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
            block_dim: (l.block[0], l.block[1], l.block[2]),
            shared_mem_bytes: l.dynamic_smem_bytes,
        };
        let mut b = stream.launch_builder(&self.func);
        for a in &args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::Map(m) => b.arg(m),
            };
        }
        // SAFETY: the arguments follow the kernel's parameter list as the manifest gives it (the
        // generator's argument order); the caller vouches for the buffers (see # Safety).
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda(format!("when launching {}", self.entry.name)))
    }
}

/// The caller's pointer for `operand`; a kernel without workspace bytes still gets a valid
/// pointer for its Workspace parameter (D's, which it never dereferences).
fn pointer(ops: &Operands, ws: u64, operand: Operand, name: &str) -> Result<u64> {
    let p = match operand {
        Operand::A => ops.a,
        Operand::B => ops.b,
        Operand::C => ops.c,
        Operand::D => ops.d,
        Operand::Bias => ops.bias,
        Operand::Scale => ops.scale,
        Operand::TensorScales => ops.tensor_scales,
        Operand::Workspace => {
            if ws != 0 {
                ws
            } else {
                ops.d
            }
        }
    };
    if p == 0 && operand != Operand::C {
        return Err(Error::Operands(format!("kernel {name} needs operand {}, which is null", operand.name())));
    }
    Ok(p)
}

/// Encodes a tensor-map parameter over the device buffer at `ptr` (`cuTensorMapEncodeTiled` or
/// `cuTensorMapEncodeIm2col`, as the recipe says); `None` for a pointer parameter. tensortune's
/// worker encodes the maps of the kernels it measures with this function too.
pub fn encode_map(param: &Param, ptr: sys::CUdeviceptr) -> Result<Option<MapParam>> {
    match param {
        Param::Pointer { .. } => Ok(None),
        Param::TensorMap(recipe) => encode(recipe, ptr).map(Some),
        Param::Im2colMap(recipe) => encode_im2col(recipe, ptr).map(Some),
    }
}

/// The tensor-map element type of `dtype` (a copy does not care about signedness).
fn map_dtype(dtype: DType) -> sys::CUtensorMapDataType {
    use sys::CUtensorMapDataType as Ty;
    match dtype {
        DType::F16 => Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::Bf16 => Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F32 | DType::Tf32 => Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::I32 => Ty::CU_TENSOR_MAP_DATA_TYPE_INT32,
        DType::I8 | DType::E4m3 | DType::E5m2 => Ty::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    }
}

/// Encodes `recipe` over `ptr` with `cuTensorMapEncodeIm2col` (rank 4).
fn encode_im2col(recipe: &Im2colRecipe, ptr: u64) -> Result<MapParam> {
    let mut out = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live array of the length the call reads for rank 4 (dims and
    // element strides 4, strides 3, corners 2); `out` is written by the driver on success and read
    // only then.
    let r = unsafe {
        sys::cuTensorMapEncodeIm2col(
            out.as_mut_ptr(),
            map_dtype(recipe.dtype),
            4,
            ptr as *mut std::ffi::c_void,
            recipe.dims.as_ptr(),
            recipe.strides_bytes.as_ptr(),
            recipe.lower_corner.as_ptr(),
            recipe.upper_corner.as_ptr(),
            recipe.channels_per_pixel,
            recipe.pixels_per_column,
            recipe.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(cuda(format!("when encoding an im2col tensor map over {}", recipe.operand.name())))?;
    // SAFETY: the driver filled the map (checked above).
    Ok(MapParam(unsafe { out.assume_init() }))
}

/// Encodes `recipe` over `ptr` with `cuTensorMapEncodeTiled`.
fn encode(recipe: &MapRecipe, ptr: u64) -> Result<MapParam> {
    let dtype = map_dtype(recipe.dtype);
    let mut out = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live array of the rank given (2; strides has rank - 1
    // entries); `out` is written by the driver on success and read only then.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            out.as_mut_ptr(),
            dtype,
            2,
            ptr as *mut std::ffi::c_void,
            recipe.dims.as_ptr(),
            recipe.strides_bytes.as_ptr(),
            recipe.box_dims.as_ptr(),
            recipe.element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(cuda(format!("when encoding a tensor map over {}", recipe.operand.name())))?;
    // SAFETY: the driver filled the map (checked above).
    Ok(MapParam(unsafe { out.assume_init() }))
}
