//! `manifest.json`, format 1: what a program needs to launch each kernel of a bundle correctly
//! with nothing but the CUDA driver API, and where each kernel came from.
//!
//! Every kernel is generated for one exact problem (its shape, types, layout and epilogue scales
//! are compiled in): it takes no scalar parameters, only the buffers and TMA tensor maps listed in
//! [`Entry::params`], in order. `index.txt` holds the same facts line by line for C
//! ([`Bundle::index_text`] writes it; `tensortune_bundle.h` reads it).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The manifest format this crate reads and writes.
pub const FORMAT: u32 = 1;
/// The manifest's file name in a bundle directory.
pub const MANIFEST: &str = "manifest.json";
/// The line-based index's file name.
pub const INDEX: &str = "index.txt";

/// Element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single.
    F32,
    /// f32 in memory, multiplied with TF32 precision (a problem's input type; tensor maps over
    /// such operands say `f32`). A kernel of tf32 inputs never answers an exact-f32 problem.
    Tf32,
    /// Signed 8-bit integer.
    I8,
    /// Signed 32-bit integer.
    I32,
    /// 8-bit float, 4 exponent and 3 mantissa bits (OCP FP8 E4M3).
    E4m3,
    /// 8-bit float, 5 exponent and 2 mantissa bits (OCP FP8 E5M2).
    E5m2,
}

impl DType {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::Tf32 => "tf32",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::E4m3 => "e4m3",
            DType::E5m2 => "e5m2",
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            DType::I8 | DType::E4m3 | DType::E5m2 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::Tf32 | DType::I32 => 4,
        }
    }
}

/// Matmul operand layouts in BLAS convention (C and D column-major M x N): the first letter is
/// op(A) (`n`: A stored M x K, M contiguous; `t`: stored K x M), the second op(B) (`n`: B stored
/// K x N, K contiguous; `t`: stored N x K).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// A M-contiguous, B K-contiguous.
    Nn,
    /// A M-contiguous, B N-contiguous.
    Nt,
    /// A K-contiguous, B K-contiguous.
    Tn,
    /// A K-contiguous, B N-contiguous.
    Tt,
}

impl Layout {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nn => "nn",
            Layout::Nt => "nt",
            Layout::Tn => "tn",
            Layout::Tt => "tt",
        }
    }
}

/// The problem a kernel computes, everything compiled into it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Problem {
    /// D = alpha op(A) op(B) + beta C; C and D column-major M x N (leading dimension M), A and B
    /// as [`Layout`] says (leading dimension the contiguous extent).
    Matmul {
        /// Rows of op(A), C and D.
        m: u64,
        /// Columns of op(B), C and D.
        n: u64,
        /// Reduction length.
        k: u64,
        /// Operand layouts.
        layout: Layout,
        /// Type of A and B.
        input: DType,
        /// Type the products are summed in.
        accumulator: DType,
        /// Type of C and D.
        output: DType,
        /// Scale of the product (compiled in).
        alpha: f64,
        /// Scale of C (compiled in); 0: C is never read.
        beta: f64,
        /// What is fused after alpha and beta, per row of D (a linear layer's output feature):
        /// `D = act(alpha op(A) op(B) + beta C + bias[m])`; `residual` is never set here (beta says
        /// whether C is read). Left out when nothing is, so plain bundles read as before.
        #[serde(default, skip_serializing_if = "ConvEpilogue::is_none")]
        epilogue: ConvEpilogue,
    },
    /// Forward convolution: input NHWC, filter KRSC, output NPQK.
    Conv2d {
        /// Batch.
        n: u64,
        /// Input height.
        h: u64,
        /// Input width.
        w: u64,
        /// Input channels.
        c: u64,
        /// Output channels.
        k: u64,
        /// Filter height.
        r: u64,
        /// Filter width.
        s: u64,
        /// Padding (height, width).
        pad: [u64; 2],
        /// Stride (height, width).
        stride: [u64; 2],
        /// Dilation (height, width).
        dilation: [u64; 2],
        /// Type of input and filter.
        input: DType,
        /// Type the products are summed in.
        accumulator: DType,
        /// Type of the output.
        output: DType,
        /// What is fused after the convolution, per output channel; left out when nothing is.
        #[serde(default, skip_serializing_if = "ConvEpilogue::is_none")]
        epilogue: ConvEpilogue,
    },
}

/// A convolution's fused epilogue: `Y = act(scale[k] * conv + C + bias[k])`, C (the output's
/// shape, e.g. a residual block's identity) read only with `residual`; `bias` is K values of the
/// output type ([`Operand::Bias`]), `scale` K f32 values ([`Operand::Scale`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvEpilogue {
    /// Multiplies channel k by `scale[k]`.
    #[serde(default)]
    pub scale: bool,
    /// Adds `bias[k]`.
    #[serde(default)]
    pub bias: bool,
    /// Adds C (beta 1).
    #[serde(default)]
    pub residual: bool,
    /// The activation last.
    #[serde(default)]
    pub activation: Activation,
}

/// The activation a fused epilogue applies last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// None.
    #[default]
    None,
    /// max(x, 0).
    Relu,
    /// GELU, tanh form.
    Gelu,
    /// GELU, exact (erf) form: `0.5 x (1 + erf(x / sqrt 2))`.
    #[serde(rename = "gelu_erf")]
    GeluErf,
}

impl ConvEpilogue {
    /// Nothing fused.
    pub fn is_none(&self) -> bool {
        *self == ConvEpilogue::default()
    }

    /// The workload key's spelling (`beta=1,epi=bias+relu`), as `index.txt` writes it.
    pub fn spelling(&self) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if self.scale {
            parts.push("scale");
        }
        if self.bias {
            parts.push("bias");
        }
        match self.activation {
            Activation::None => {}
            Activation::Relu => parts.push("relu"),
            Activation::Gelu => parts.push("gelu"),
            Activation::GeluErf => parts.push("gelu_erf"),
        }
        let epi = if parts.is_empty() { String::new() } else { format!("epi={}", parts.join("+")) };
        match (self.residual, epi.is_empty()) {
            (true, true) => "beta=1".into(),
            (true, false) => format!("beta=1,{epi}"),
            (false, _) => epi,
        }
    }
}

impl Problem {
    /// `matmul` or `conv2d`.
    pub fn op(&self) -> &'static str {
        match self {
            Problem::Matmul { .. } => "matmul",
            Problem::Conv2d { .. } => "conv2d",
        }
    }

    /// (input, accumulator, output) types.
    pub fn types(&self) -> (DType, DType, DType) {
        match *self {
            Problem::Matmul { input, accumulator, output, .. } | Problem::Conv2d { input, accumulator, output, .. } => {
                (input, accumulator, output)
            }
        }
    }
}

/// A buffer a kernel reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operand {
    /// Matmul A / conv input.
    A,
    /// Matmul B / conv filter.
    B,
    /// Epilogue input C (output type); read only when beta != 0.
    C,
    /// The output D.
    D,
    /// Scratch of [`Entry::workspace_bytes`]: zeroed once before the first launch; every launch
    /// leaves it zeroed again. Never shared by two launches in flight at once.
    Workspace,
    /// A fused epilogue's bias: M values of the output type, one per row of D.
    Bias,
    /// A fused epilogue's per-row scale: M f32 values (a per-row alpha).
    Scale,
    /// FP8 inputs' per-tensor scales: two f32 values, A's then B's.
    TensorScales,
}

impl Operand {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Operand::A => "a",
            Operand::B => "b",
            Operand::C => "c",
            Operand::D => "d",
            Operand::Workspace => "workspace",
            Operand::Bias => "bias",
            Operand::Scale => "scale",
            Operand::TensorScales => "tensor_scales",
        }
    }
}

/// How to build a TMA tensor map over an operand with `cuTensorMapEncodeTiled`: rank 2,
/// innermost dimension first; the map is passed by value as a 128-byte `__grid_constant__`
/// `CUtensorMap` parameter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapRecipe {
    /// The buffer it views (a, b or d).
    pub operand: Operand,
    /// `tensorDataType`: f16 -> FLOAT16, bf16 -> BFLOAT16, f32 -> FLOAT32, i32 -> INT32, i8 ->
    /// UINT8 (a copy does not care about signedness).
    pub dtype: DType,
    /// `globalDim`, elements, innermost first.
    pub dims: [u64; 2],
    /// `globalStrides` (rank - 1 entries): bytes between consecutive outer rows.
    pub strides_bytes: [u64; 1],
    /// `boxDim`, elements, innermost first.
    pub box_dims: [u32; 2],
    /// `elementStrides`.
    pub element_strides: [u32; 2],
    /// `interleave`: always `none`.
    pub interleave: String,
    /// `swizzle`: always `128b`.
    pub swizzle: String,
    /// `l2Promotion`: always `256b`.
    pub l2_promotion: String,
    /// `oobFill`: always `none` (out-of-bounds elements read as zero).
    pub oob_fill: String,
}

impl MapRecipe {
    /// The recipe every template uses (128-byte swizzle, no interleave, L2 promotion 256 B, zero
    /// fill) for the given view.
    pub fn tiled(operand: Operand, dtype: DType, dims: [u64; 2], row_bytes: u64, box_dims: [u32; 2]) -> MapRecipe {
        MapRecipe {
            operand,
            dtype,
            dims,
            strides_bytes: [row_bytes],
            box_dims,
            element_strides: [1, 1],
            interleave: "none".into(),
            swizzle: "128b".into(),
            l2_promotion: "256b".into(),
            oob_fill: "none".into(),
        }
    }
}

/// How to build a TMA tensor map in im2col mode over a convolution's NHWC input with
/// `cuTensorMapEncodeIm2col`: rank 4, innermost first (C, W, H, N); 128-byte swizzle, no
/// interleave, L2 promotion 256 B, zero fill, as [`MapRecipe`]. Passed by value like it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Im2colRecipe {
    /// The buffer it views (a: the input).
    pub operand: Operand,
    /// `tensorDataType`, as for [`MapRecipe`].
    pub dtype: DType,
    /// `globalDim` (C, W, H, N), elements.
    pub dims: [u64; 4],
    /// `globalStrides` (W, H, N), bytes.
    pub strides_bytes: [u64; 3],
    /// `pixelBoxLowerCorner` (W, H).
    pub lower_corner: [i32; 2],
    /// `pixelBoxUpperCorner` (W, H).
    pub upper_corner: [i32; 2],
    /// `channelsPerPixel`.
    pub channels_per_pixel: u32,
    /// `pixelsPerColumn`.
    pub pixels_per_column: u32,
    /// `elementStrides` (C, W, H, N): the layer's strides on W and H.
    pub element_strides: [u32; 4],
}

/// One kernel parameter, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Param {
    /// A device pointer (8 bytes) to the operand's buffer.
    Pointer {
        /// Which buffer.
        operand: Operand,
    },
    /// A 128-byte `CUtensorMap` encoded over the operand's buffer, passed by value.
    TensorMap(MapRecipe),
    /// A 128-byte `CUtensorMap` in im2col mode over a convolution's input, passed by value.
    Im2colMap(Im2colRecipe),
}

/// How to launch a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// Grid dimensions (blocks).
    pub grid: [u32; 3],
    /// Block dimensions (threads).
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes. Above 48 KiB (with the kernel's static shared
    /// memory) the launcher must first raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES to it.
    pub dynamic_smem_bytes: u32,
    /// Blocks per cluster. Compiled into the kernel (`__cluster_dims__`), so a plain
    /// `cuLaunchKernel` launches clusters; the grid is a multiple of it. [1, 1, 1] without clusters.
    pub cluster: [u32; 3],
}

/// The device class a kernel was tuned and generated for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Device class key, e.g. `nvidia-h200/sm90/132sm` (`sim` for the simulator).
    pub class_key: String,
    /// Marketing name.
    pub name: String,
    /// Compute capability, major*10 + minor.
    pub arch: u32,
    /// Streaming multiprocessors (persistent grids are sized for it; they run correctly on any).
    pub sm_count: u32,
}

/// Where a kernel's numbers come from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The tracker's record id.
    pub record_id: u64,
    /// The job that measured it.
    pub job_id: u64,
    /// The worker that measured it.
    pub worker_id: u64,
    /// When it was measured (Unix ms).
    pub created_ms: i64,
    /// Whether the time is a finalist re-measurement (interleaved with the other finalists).
    pub remeasure: bool,
    /// Timing samples of the record, microseconds.
    pub samples_us: Vec<f64>,
    /// Launches per sample (CUDA-graph replay of a batch).
    pub batch: u32,
    /// The measuring worker's name.
    pub worker_name: String,
    /// Its GPU as the driver names it.
    pub gpu_name: String,
    /// Its GPU's UUID.
    pub gpu_uuid: String,
    /// Its kernel driver's version.
    pub driver_version: String,
    /// Its CUDA driver API version.
    pub cuda_version: String,
    /// The NVRTC that compiled the measured kernel.
    pub nvrtc_version: String,
}

/// One kernel of a bundle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Identity (template, workload and knobs); also the file names' stem.
    pub name: String,
    /// The tensortune workload key of the problem.
    pub workload_key: String,
    /// What it computes.
    pub problem: Problem,
    /// Template name.
    pub template: String,
    /// Template version.
    pub template_version: u32,
    /// The config (knobs) as JSON.
    pub config: serde_json::Value,
    /// Its device class.
    pub device: Device,
    /// CUDA C++ source file.
    pub source: String,
    /// Cubin file per NVRTC architecture (`sm_90a`, `sm_80`); empty when exported without NVRTC.
    pub cubins: BTreeMap<String, String>,
    /// `extern "C"` entry point.
    pub entry: String,
    /// Grid, block, shared memory, cluster.
    pub launch: Launch,
    /// Scratch bytes (0: the Workspace parameter, if any, still needs a valid pointer).
    pub workspace_bytes: u64,
    /// The parameters, in order. There are no scalar parameters.
    pub params: Vec<Param>,
    /// Elements of each buffer the kernel touches (a, b, c, d).
    pub elements: BTreeMap<String, u64>,
    /// Median time of the record, microseconds (CUDA-graph replay of a batch of launches; warm
    /// L2 unless the job flushed it).
    pub time_us: f64,
    /// The vendor library's time in the same session, microseconds, when known.
    pub vendor_us: Option<f64>,
    /// What the vendor time is (`cublasGemmEx`, `cublasLt heuristic #3 of 8`, ...).
    pub vendor_kind: String,
    /// Which ran the workload faster in the measuring session ([`Entry::winner_of`]): `ours`
    /// (this kernel) or `vendor` (a program should keep calling the vendor library for it). Empty
    /// in bundles written before this field; read it through [`Entry::winner`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub winner: String,
    /// Where the numbers come from.
    pub provenance: Provenance,
}

impl Entry {
    /// `ours` when the kernel's time is below the vendor's (or no vendor time is known), else
    /// `vendor`.
    pub fn winner_of(time_us: f64, vendor_us: Option<f64>) -> &'static str {
        match vendor_us {
            Some(v) if v > 0.0 && v <= time_us => "vendor",
            _ => "ours",
        }
    }

    /// The recorded winner, or for an older bundle the one its times say.
    pub fn winner(&self) -> &str {
        if self.winner.is_empty() { Self::winner_of(self.time_us, self.vendor_us) } else { &self.winner }
    }

    /// The cubin file for a GPU of compute capability `arch`: `sm_{arch}a` (the arch-specific
    /// image, e.g. the wgmma kernels' `sm_90a`), else `sm_{arch}`.
    pub fn cubin_for(&self, arch: u32) -> Option<&str> {
        [format!("sm_{arch}a"), format!("sm_{arch}")].iter().find_map(|k| self.cubins.get(k)).map(String::as_str)
    }
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The program that wrote it, e.g. `tensortune 0.1.0`.
    pub generator: String,
    /// When (Unix ms).
    pub created_ms: i64,
    /// NVRTC's version that compiled the cubins ("" without cubins).
    pub nvrtc_version: String,
    /// NVRTC flags besides `--gpu-architecture` and the include directory.
    pub nvrtc_flags: Vec<String>,
    /// The kernels.
    pub kernels: Vec<Entry>,
}

/// A bundle directory and its manifest.
#[derive(Clone, Debug)]
pub struct Bundle {
    /// The directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Bundle {
    /// Reads `dir/manifest.json` and checks its format and that every file it names exists.
    pub fn open(dir: impl AsRef<Path>) -> Result<Bundle> {
        let dir = dir.as_ref().to_owned();
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let manifest = Manifest::parse(&text).map_err(|message| Error::Manifest { path: path.clone(), message })?;
        for e in &manifest.kernels {
            for file in std::iter::once(&e.source).chain(e.cubins.values()) {
                if !dir.join(file).is_file() {
                    return Err(Error::Manifest {
                        path,
                        message: format!("kernel {} names {file:?}, which is not in the bundle", e.name),
                    });
                }
            }
        }
        Ok(Bundle { dir, manifest })
    }

    /// The manifest as `index.txt`: a `tensortune-bundle-index 1` line, then per kernel a block
    /// of `key values...` lines from `kernel NAME` to `end` (see `tensortune_bundle.h`).
    pub fn index_text(manifest: &Manifest) -> String {
        let mut out = format!("tensortune-bundle-index {}\n", manifest.format);
        for e in &manifest.kernels {
            let _ = writeln!(out, "kernel {}", e.name);
            let (i, a, o) = e.problem.types();
            let _ = writeln!(out, "op {}", e.problem.op());
            match e.problem {
                Problem::Matmul { m, n, k, layout, alpha, beta, epilogue, .. } => {
                    let _ = writeln!(out, "shape {m} {n} {k}");
                    let _ = writeln!(out, "layout {}", layout.name());
                    let _ = writeln!(out, "epilogue {alpha:?} {beta:?}");
                    if !epilogue.is_none() {
                        let _ = writeln!(out, "matmul_epilogue {}", epilogue.spelling());
                    }
                }
                Problem::Conv2d { n, h, w, c, k, r, s, pad, stride, dilation, epilogue, .. } => {
                    let _ = writeln!(out, "shape {n} {h} {w} {c} {k}");
                    let _ = writeln!(
                        out,
                        "filter {r} {s} {} {} {} {} {} {}",
                        pad[0], pad[1], stride[0], stride[1], dilation[0], dilation[1]
                    );
                    if !epilogue.is_none() {
                        let _ = writeln!(out, "conv_epilogue {}", epilogue.spelling());
                    }
                }
            }
            let _ = writeln!(out, "types {} {} {}", i.name(), a.name(), o.name());
            let _ = writeln!(out, "device {} {}", e.device.arch, e.device.sm_count);
            for (arch, file) in &e.cubins {
                let _ = writeln!(out, "cubin {arch} {file}");
            }
            let _ = writeln!(out, "entry {}", e.entry);
            let l = &e.launch;
            let _ = writeln!(out, "grid {} {} {}", l.grid[0], l.grid[1], l.grid[2]);
            let _ = writeln!(out, "block {} {} {}", l.block[0], l.block[1], l.block[2]);
            let _ = writeln!(out, "smem {}", l.dynamic_smem_bytes);
            let _ = writeln!(out, "cluster {} {} {}", l.cluster[0], l.cluster[1], l.cluster[2]);
            let _ = writeln!(out, "workspace {}", e.workspace_bytes);
            for p in &e.params {
                match p {
                    Param::Pointer { operand } => {
                        let _ = writeln!(out, "param ptr {}", operand.name());
                    }
                    Param::TensorMap(m) => {
                        let _ = writeln!(
                            out,
                            "param map {} {} {} {} {} {} {}",
                            m.operand.name(),
                            m.dtype.name(),
                            m.dims[0],
                            m.dims[1],
                            m.strides_bytes[0],
                            m.box_dims[0],
                            m.box_dims[1]
                        );
                    }
                    Param::Im2colMap(m) => {
                        let n = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
                        let _ = writeln!(
                            out,
                            "param im2col {} {} {} {} {} {} {} {} {}",
                            m.operand.name(),
                            m.dtype.name(),
                            n(&m.dims.map(|v| v as i64)),
                            n(&m.strides_bytes.map(|v| v as i64)),
                            n(&m.lower_corner.map(i64::from)),
                            n(&m.upper_corner.map(i64::from)),
                            m.channels_per_pixel,
                            m.pixels_per_column,
                            n(&m.element_strides.map(i64::from)),
                        );
                    }
                }
            }
            let _ = writeln!(out, "time_us {:?}", e.time_us);
            match e.vendor_us {
                Some(v) => {
                    let _ = writeln!(out, "vendor_us {v:?}");
                }
                None => out.push_str("vendor_us -\n"),
            }
            // What the vendor time is, on one line (a loader's check times the same call).
            let kind = e.vendor_kind.split_whitespace().collect::<Vec<_>>().join(" ");
            if !kind.is_empty() {
                let _ = writeln!(out, "vendor_kind {kind}");
            }
            out.push_str("end\n");
        }
        out
    }
}

impl Manifest {
    /// Parses a manifest and checks what a launcher relies on.
    pub fn parse(text: &str) -> std::result::Result<Manifest, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match value.get("format").and_then(serde_json::Value::as_u64) {
            Some(f) if f == FORMAT as u64 => {}
            Some(f) => return Err(format!("format {f} is not supported; this reader takes format {FORMAT}")),
            None => return Err("it has no \"format\" number".into()),
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| e.to_string())?;
        for e in &manifest.kernels {
            manifest_check(e)?;
        }
        Ok(manifest)
    }
}

/// What a launcher relies on: sane launch dimensions and recipes the drivers accept.
fn manifest_check(e: &Entry) -> std::result::Result<(), String> {
    let l = &e.launch;
    if l.grid.contains(&0) || l.block.contains(&0) || l.cluster.contains(&0) {
        return Err(format!("kernel {}: grid, block and cluster dimensions must be positive", e.name));
    }
    if l.grid.iter().zip(l.cluster).any(|(g, c)| g % c != 0) {
        return Err(format!(
            "kernel {}: the grid {:?} is not a multiple of the cluster {:?}",
            e.name, l.grid, l.cluster
        ));
    }
    for p in &e.params {
        if let Param::Im2colMap(m) = p {
            if m.operand != Operand::A {
                return Err(format!("kernel {}: an im2col map over {} is not supported", e.name, m.operand.name()));
            }
            if m.strides_bytes.iter().any(|s| s % 16 != 0) || m.dims.contains(&0) {
                return Err(format!(
                    "kernel {}: im2col map dims {:?} / strides {:?} (bytes, multiples of 16)",
                    e.name, m.dims, m.strides_bytes
                ));
            }
            let corners = m.lower_corner.iter().chain(&m.upper_corner);
            if corners.clone().any(|c| !(-128..=127).contains(c))
                || !(1..=256).contains(&m.channels_per_pixel)
                || !(1..=256).contains(&m.pixels_per_column)
                || m.element_strides.iter().any(|s| !(1..=8).contains(s))
            {
                return Err(format!(
                    "kernel {}: im2col map corners {:?} {:?}, {} channels x {} pixels, strides {:?}: outside what a \
                     rank-4 im2col map takes (corners -128..=127, 1..=256 each, strides 1..=8)",
                    e.name,
                    m.lower_corner,
                    m.upper_corner,
                    m.channels_per_pixel,
                    m.pixels_per_column,
                    m.element_strides
                ));
            }
        }
        if let Param::TensorMap(m) = p {
            if !matches!(m.operand, Operand::A | Operand::B | Operand::D) {
                return Err(format!("kernel {}: a tensor map over {} is not supported", e.name, m.operand.name()));
            }
            let fixed = (m.interleave.as_str(), m.swizzle.as_str(), m.l2_promotion.as_str(), m.oob_fill.as_str());
            if fixed != ("none", "128b", "256b", "none") || m.element_strides != [1, 1] {
                return Err(format!(
                    "kernel {}: tensor map {fixed:?} with element strides {:?} is not the recipe this reader encodes \
                     (none, 128b, 256b, none; [1, 1])",
                    e.name, m.element_strides
                ));
            }
            if m.strides_bytes[0] % 16 != 0 {
                return Err(format!(
                    "kernel {}: tensor-map stride {} is not a multiple of 16",
                    e.name, m.strides_bytes[0]
                ));
            }
        }
    }
    Ok(())
}
