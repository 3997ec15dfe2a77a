//! The template abstraction: a kernel family with a version, a knob space, validity rules against
//! a device, code generation, cost-model features and an analytic time model (used by `sim`).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::space::{Config, Space};
use crate::target::Target;
use crate::workload::{Op, Workload};

/// A buffer a generated kernel takes, in argument order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arg {
    /// First operand (matmul A, conv input), input type.
    A,
    /// Second operand (matmul B, conv filter), input type.
    B,
    /// Epilogue input C, output type; read only when beta != 0.
    C,
    /// Output D, output type.
    D,
    /// Scratch of `workspace_bytes`; zeroed once when allocated, kernels leave it zeroed.
    Workspace,
    /// The epilogue's bias: M values of the output type, one per row of D.
    Bias,
    /// The epilogue's per-row scale: M f32 values (a per-row alpha).
    Scale,
    /// The FP8 inputs' per-tensor scales: two f32 values, A's then B's.
    TensorScales,
    /// A TMA tensor map of an operand, passed by value (a `__grid_constant__` CUtensorMap).
    Map(TensorMap),
    /// A TMA tensor map in im2col mode over a convolution's input, passed by value.
    Im2col(Im2colMap),
}

/// How the launcher builds a TMA tensor map (`cuTensorMapEncodeTiled`) over an operand: a 2-D
/// view, innermost dimension first, copied in boxes into 128-byte-swizzled shared memory, with
/// out-of-bounds elements read as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMap {
    /// The buffer it views: [`Arg::A`], [`Arg::B`] or [`Arg::D`].
    pub operand: TensorOperand,
    /// Element type.
    pub dtype: crate::DType,
    /// Extents, innermost first (elements).
    pub dims: [u64; 2],
    /// Distance between consecutive outer rows, bytes (a multiple of 16).
    pub row_bytes: u64,
    /// Box copied per load, innermost first (elements; the inner box is 128 bytes).
    pub box_dims: [u32; 2],
}

/// How the launcher builds a TMA tensor map in im2col mode (`cuTensorMapEncodeIm2col`) over a
/// convolution's NHWC input: rank 4, innermost first (C, W, H, N); each copy brings `pixels`
/// output pixels' `channels` channels of one filter tap into 128-byte-swizzled shared memory,
/// walking the output pixels' windows through the bounding box by the layer's strides, with
/// what lies outside the input read as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Im2colMap {
    /// The buffer it views (the convolution's input, [`TensorOperand::A`]).
    pub operand: TensorOperand,
    /// Element type.
    pub dtype: crate::DType,
    /// Extents C, W, H, N (elements).
    pub dims: [u64; 4],
    /// Distances between consecutive W, H and N positions, bytes (multiples of 16).
    pub strides_bytes: [u64; 3],
    /// `pixelBoxLowerCorner` (W, H): where the first window starts, relative to the input's
    /// first column and row (minus the padding).
    pub lower: [i32; 2],
    /// `pixelBoxUpperCorner` (W, H): where the last window starts, relative to the input's last
    /// column and row (the padding less the window's extent).
    pub upper: [i32; 2],
    /// `channelsPerPixel`: channels per copy (128 bytes).
    pub channels: u32,
    /// `pixelsPerColumn`: output pixels per copy.
    pub pixels: u32,
    /// `elementStrides` (C, W, H, N): the layer's strides on W and H.
    pub element_strides: [u32; 4],
}

/// The buffer a [`TensorMap`] views.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorOperand {
    /// Matmul A / conv input.
    A,
    /// Matmul B / conv filter.
    B,
    /// The epilogue's input C (a TMA load of the residual, `wgmma_gemm` v18).
    C,
    /// The output D (a TMA store).
    D,
}

/// A generated kernel: its source and how to launch it. A spec is a [`Launch`] plus the source
/// it launches, so it reads the launch's fields as its own (`spec.grid` is `spec.launch.grid`,
/// through `Deref`); the worker sends the launch alone to the process that owns the GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelSpec {
    /// CUDA C++ source for NVRTC.
    pub source: String,
    /// How to launch it, with its name and entry point.
    #[serde(flatten)]
    pub launch: Launch,
}

impl std::ops::Deref for KernelSpec {
    type Target = Launch;

    fn deref(&self) -> &Launch {
        &self.launch
    }
}

impl KernelSpec {
    /// SHA-256 of the source: the compile-cache key (with the target arch and NVRTC flags).
    pub fn source_hash(&self) -> String {
        let digest = Sha256::digest(self.source.as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.block.iter().product()
    }

    /// Blocks per cluster as the source compiles them in (`__cluster_dims__(x, y, z)` on the
    /// entry, so a plain launch forms clusters); [1, 1, 1] for a kernel without clusters.
    pub fn cluster_dims(&self) -> [u32; 3] {
        const ATTR: &str = "__cluster_dims__(";
        let parsed = self.source.match_indices(ATTR).find_map(|(at, _)| {
            let rest = &self.source[at + ATTR.len()..];
            let args = &rest[..rest.find(')')?];
            let dims: Vec<u32> = args.split(',').map(|d| d.trim().parse().ok()).collect::<Option<_>>()?;
            <[u32; 3]>::try_from(dims).ok()
        });
        parsed.unwrap_or([1, 1, 1])
    }
}

/// How to launch a compiled kernel: a [`KernelSpec`] without its source (what the worker sends
/// the process that owns the GPU, beside the cubin).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// Identity built from the template, workload and knobs (also the C++ entry name).
    pub name: String,
    /// `extern "C"` entry point in the image.
    pub entry: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes (above 48 KiB the launcher must opt in).
    pub smem_bytes: u32,
    /// Scratch buffer, bytes (0 when unused); zero-filled once when allocated (kernels leave it
    /// zeroed).
    pub workspace_bytes: u64,
    /// Buffers, in argument order.
    pub args: Vec<Arg>,
}

impl Launch {
    /// How to launch the kernel of `spec`.
    pub fn of(spec: &KernelSpec) -> Launch {
        spec.launch.clone()
    }
}

/// What a valid config uses on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
    /// Blocks in the grid.
    pub blocks: u64,
    /// Scratch buffer, bytes.
    pub workspace_bytes: u64,
}

/// A kernel family.
pub trait Template: Send + Sync {
    /// Name, e.g. `wmma_gemm`.
    fn name(&self) -> &'static str;

    /// Bumped whenever a generator change can alter timings; records remember it.
    fn version(&self) -> u32;

    /// The oldest version whose records still describe this version's kernels: a bump that only
    /// adds workloads the older version refused (new types, epilogues) and leaves the kernels of
    /// the others as they were keeps their records good for the search's prior and ground truth.
    /// `version()` unless the template says otherwise.
    fn records_hold_since(&self) -> u32 {
        self.version()
    }

    /// The oldest version whose space of configs is this version's: records of an older one (even
    /// where they hold) sample a smaller space, and cannot stand as the search's ground truth.
    /// [`Template::records_hold_since`] unless the template says otherwise.
    fn space_since(&self) -> u32 {
        self.records_hold_since()
    }

    /// Whether a record made with `version` of this template describes its kernels today.
    fn records_hold_for(&self, version: u32) -> bool {
        (self.records_hold_since()..=self.version()).contains(&version)
    }

    /// The operation it implements.
    fn op(&self) -> Op;

    /// Whether it implements `workload` on `target` at all (op, types, arch, alignment); the error
    /// names the field that rules it out. Includes [`Template::check_workload`].
    fn supports(&self, workload: &Workload, target: &Target) -> Result<()>;

    /// The part of [`Template::supports`] that needs no device (ranges, types, layouts,
    /// alignment), so a service can refuse a bad request naming its field before it looks
    /// anything up. The default checks the workload's own ranges.
    fn check_workload(&self, workload: &Workload) -> Result<()> {
        workload.validate()
    }

    /// The knob space for `workload` (the same domains for every workload of the op).
    fn space(&self) -> Space;

    /// Checks `config` against the workload and device before anything is compiled. `Rejected`
    /// carries the reason, e.g. "block tile 256x256 with 4 stages needs 264 KiB of shared memory;
    /// this GPU allows 227 KiB per block".
    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources>;

    /// Generates the kernel for a config that passed `check`.
    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec>;

    /// Indices of every valid config of the space for `workload` on `target`, ascending. The
    /// default walks the space through `check`; templates may enumerate faster.
    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let space = self.space();
        crate::error::without_reasons(|| {
            let mut out = Vec::new();
            for index in 0..space.len() {
                if self.check(workload, &space.config(index)?, target).is_ok() {
                    out.push(index);
                }
            }
            Ok(out)
        })
    }

    /// Numeric features of (workload, config) for cost models, with names.
    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>>;

    /// Analytic estimate of the kernel's time in microseconds (the `sim` device's clock).
    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64>;
}

/// The shared reference kernel: every worker times it now and then, so the tracker can flag a
/// worker whose timings drift from its peers' (a throttled or misconfigured GPU). f16 1024^3 NN
/// with a mid-size config that is valid on sm_80 and sm_90.
pub fn drift_reference() -> (Workload, Config) {
    use crate::workload::{Layout, Matmul, Types};
    let w = Matmul::new(1024, 1024, 1024, Layout::Nn, Types::default_for(crate::DType::F16).expect("f16 types"))
        .expect("a valid shape");
    let config = Config::from_json(
        r#"{"block_k":64,"block_m":64,"block_n":128,"frag":"m16n16k16","min_blocks":1,"skew":1,"split_k":1,"split_reduce":"workspace","stages":3,"swizzle":1,"warps_k":1,"warps_m":1,"warps_n":4}"#,
    )
    .expect("valid JSON");
    (Workload::Matmul(w), config)
}

/// Every valid config of the space for `workload` on `target`, with its index, in index order.
pub fn valid_configs(template: &dyn Template, workload: &Workload, target: &Target) -> Result<Vec<(u64, Config)>> {
    let space = template.space();
    template.valid_indices(workload, target)?.into_iter().map(|i| Ok((i, space.config(i)?))).collect()
}
