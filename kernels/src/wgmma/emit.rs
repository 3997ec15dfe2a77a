//! Code generation: the kernel's name, its tensor-map recipes, the header of constants and the
//! emitted wgmma wrapper that fill `gemm.cu`'s holes, and the [`KernelSpec`].

use std::fmt::Write as _;

use super::plan::{ConvX, Plan, im2col_corners};
use crate::cuda::{Header, Scalar, ident};
use crate::dtype::DType;
use crate::epilogue::InputScale;
use crate::target::Target;
use crate::template::{Arg, Im2colMap, KernelSpec, Launch, Resources, TensorMap, TensorOperand};
use crate::workload::Workload;

/// The fixed kernel body (holes: `mma_tile`).
const BODY: &str = include_str!("gemm.cu");

impl Plan {
    /// The kernel's identity: template, version, knobs (and the K split it implies on `target`)
    /// and a digest of the workload key.
    pub fn name(&self, target: &Target) -> String {
        let split = self.k_split(target);
        let t = &self.w.types;
        let (family, version, key) = match &self.conv {
            Some(c) => (
                match c.x {
                    ConvX::Tiled => "wgmma_conv2d",
                    ConvX::Im2col => "wgmma_conv2d_im2col",
                    ConvX::Gather => "wgmma_conv2d_gather",
                },
                crate::version::WGMMA_CONV2D,
                Workload::Conv2d(c.conv).key(),
            ),
            None => ("wgmma_gemm", crate::version::WGMMA_GEMM, Workload::Matmul(self.w).key()),
        };
        let key_digest = crate::short_digest(&key);
        ident(&format!(
            "tt_{family}_v{}_{}{}{}_{}_m{}n{}{}_c{}{}_s{}_cl{}_{}{}_g{}{}_{}{}{}_{}",
            version,
            t.input,
            t.accumulator,
            t.output,
            self.w.layout,
            self.block_m(),
            self.block_n(),
            if self.swap { "sw" } else { "" },
            self.consumers,
            if self.pingpong { "pp" } else { "" },
            self.stages,
            self.cluster,
            if self.persistent { "pers" } else { "grid" },
            if self.stream_k { "sk" } else { "" },
            self.group,
            if self.raster_m { "m" } else { "" },
            if self.specialized { "ws" } else { "inl" },
            if self.tma_store { "_tmast" } else { "" },
            if split > 1 { format!("_ks{split}") } else { String::new() },
            key_digest
        ))
    }

    /// The tensor map of D for the TMA-store epilogue: rows of M (the view's Q), 128-byte boxes of
    /// 64 rows.
    pub(super) fn map_d(&self) -> TensorMap {
        let w = &self.w;
        let e = w.types.output.bytes();
        TensorMap {
            operand: TensorOperand::D,
            dtype: w.types.output,
            // A batch's problems' rows one after another (see `problems.rs`).
            dims: [w.m, w.n * w.batch],
            row_bytes: w.m * e as u64,
            box_dims: [128 / e, 64],
        }
    }

    /// The tensor map of C when the epilogue loads it by TMA ([`Plan::c_slots`]): D's map over C
    /// (the same shape, type and box).
    pub(super) fn map_c(&self) -> TensorMap {
        TensorMap { operand: TensorOperand::C, ..self.map_d() }
    }

    /// The im2col tensor map of a convolution's input, when X is loaded that way: BP output pixels
    /// of BK channels (128 bytes) per copy.
    pub(super) fn im2col_map(&self) -> Option<Im2colMap> {
        let c = self.conv.filter(|c| c.x == ConvX::Im2col)?.conv;
        let e = c.types.input.bytes() as u64;
        // In range for i32: im2col_fits chose this path only with corners in [-128, 127].
        let (lower, upper) = im2col_corners(&c);
        Some(Im2colMap {
            operand: TensorOperand::A,
            dtype: c.types.input,
            dims: [c.c, c.w, c.h, c.n],
            strides_bytes: [c.c * e, c.w * c.c * e, c.h * c.w * c.c * e],
            lower: lower.map(|v| v as i32),
            upper: upper.map(|v| v as i32),
            channels: self.bk(),
            pixels: self.bp,
            element_strides: [1, c.stride.1 as u32, c.stride.0 as u32, 1],
        })
    }

    /// The tensor maps of X (the user's B) and Y (the user's A).
    pub(super) fn maps(&self) -> [TensorMap; 2] {
        let w = &self.w;
        let e = w.types.input.bytes() as u64;
        let bk = self.bk();
        // K-major: rows of K, one box of every row of the tile. MN-major: rows of M or N, 64-wide
        // boxes (the 128-byte swizzle span) of BK rows.
        // `stack`: problems stacked along the outer dimension (see `problems.rs`).
        let map = |operand, kmajor: bool, mn: u64, rows_in_box: u32, stack: u64| {
            if kmajor {
                TensorMap {
                    operand,
                    dtype: w.types.input,
                    dims: [w.k, mn * stack],
                    row_bytes: w.k * e,
                    box_dims: [bk, rows_in_box],
                }
            } else {
                TensorMap {
                    operand,
                    dtype: w.types.input,
                    dims: [mn, w.k * stack],
                    row_bytes: mn * e,
                    box_dims: [64, bk],
                }
            }
        };
        // A convolution's X is its input (the worker's A) and its Y the filter (the worker's B); so
        // are a swapped GEMM's.
        let (x_operand, y_operand) = if self.conv.is_some() || self.swap {
            (TensorOperand::A, TensorOperand::B)
        } else {
            (TensorOperand::B, TensorOperand::A)
        };
        [
            map(x_operand, self.x_kmajor(), self.p_extent(), self.bp, w.problems()),
            map(y_operand, self.y_kmajor(), self.q_extent(), self.bq / self.cluster, w.batch),
        ]
    }

    /// The generated source.
    pub fn source(&self, target: &Target) -> String {
        let name = self.name(target);
        let body = crate::cuda::fill_holes(BODY, &format!("// @fill(mma_tile)\n{}", self.mma_tile()));
        self.header(target, &name).source(&format!("ns_{name}"), &[crate::cuda::COMMON, &body])
    }

    /// The source's header (includes, comments, defines, the `cfg` constants) for the kernel
    /// `name`: a few KB of the source, which the tests that read the constants of every valid
    /// config render alone.
    pub(super) fn header(&self, target: &Target, name: &str) -> Header {
        let w = &self.w;
        let t = &w.types;
        let g = self.grid(target);
        let blocks_per_sm = self.blocks_per_sm(target);
        let split = self.k_split(target);
        let (x_once, y_once) = self.reads_once(target);
        let c_slots = self.c_slots(target);
        let epi_int = t.output.is_int();
        let scalar = |v: f64| if epi_int { Scalar::Int(v as i64) } else { Scalar::Float(v) };
        let mut h = Header::default();
        if t.input.is_fp8() {
            h.include("cuda_fp8.h");
        }
        match &self.conv {
            Some(c) => h
                .comment(format!(
                    "wgmma_conv2d v{}: the convolution as an implicit GEMM on the wgmma_gemm body ({})",
                    crate::version::WGMMA_CONV2D,
                    match c.x {
                        ConvX::Tiled => "pointwise: activations by TMA",
                        ConvX::Im2col => "activations by TMA in im2col mode",
                        ConvX::Gather => "activations gathered",
                    }
                ))
                .comment(format!("workload {}", Workload::Conv2d(c.conv).key())),
            None => h
                .comment(format!(
                    "wgmma_gemm v{}: D = act(alpha * sa * sb * scale[m] * op(A) op(B) + beta * C + bias[m])",
                    crate::version::WGMMA_GEMM
                ))
                .comment(format!("workload {}", Workload::Matmul(*w).key())),
        };
        // Only a fused layer says so: a plain layer's source stays as it was before conv epilogues.
        if self.conv.is_some_and(|c| c.conv.fused()) {
            h.comment("epilogue per output channel k (a row m of the GEMM): D = act(scale[k] * conv + C + bias[k])");
        }
        // The convolution's geometry (placeholders when there is none: the gather is not compiled).
        let geometry = self.conv.map(|c| c.conv);
        let dim = |f: fn(&crate::workload::Conv2d) -> u64, none: u64| geometry.as_ref().map_or(none, f) as i64;
        h.typedef("T_IN", t.input.cuda())
            .typedef("T_OUT", t.output.cuda())
            .typedef("T_EPI", if epi_int { "int" } else { "float" })
            .typedef("T_ACCR", acc_reg_type(t.accumulator))
            .define("KERNEL_NAME", name)
            .define(
                "TT_CLUSTER_ATTR",
                match self.cluster * split {
                    1 => String::new(),
                    blocks => format!("__cluster_dims__({blocks}, 1, 1)"),
                },
            )
            .int("P", self.p_extent() as i64)
            .int("Q", self.q_extent() as i64)
            .int("K", w.k as i64)
            .int("BP", self.bp as i64)
            .int("BQ", self.bq as i64)
            .int("BK", self.bk() as i64)
            .int("STAGES", self.stages as i64)
            .int("CONSUMERS", self.consumers as i64)
            .int("CLUSTER", self.cluster as i64)
            .int("GROUP", self.group as i64)
            .flag("RASTER_M", self.raster_m)
            .int("TILES_P", g.tiles_p as i64)
            .int("TILES_Q", g.tiles_q as i64)
            .int("ACC_REGS", self.acc_regs() as i64)
            .int("PRODUCER_REGS", self.producer_regs() as i64)
            .int("BLOCKS_PER_SM", blocks_per_sm as i64)
            .int("GRID_CLUSTERS", (g.blocks / (self.cluster * split) as u64) as i64)
            .int("SPLIT", split as i64)
            .int("SK_DP_TILES", g.sk_dp_tiles as i64)
            .int("SK_ITERS", g.sk_iters as i64)
            .int("CONSUMER_REGS", self.consumer_regs_at(blocks_per_sm, target) as i64)
            .flag("SPECIALIZED", self.specialized)
            .flag("PINGPONG", self.pingpong)
            .flag("STREAM_K", self.stream_k)
            .flag("TMA_STORE", self.tma_store)
            .flag("Y_RESIDENT", self.y_resident(target))
            .flag("X_ONCE", x_once)
            .flag("Y_ONCE", y_once)
            .int("EPI_COLS", (128 / t.output.bytes()) as i64)
            .define("TT_MAP_D", if self.tma_store { "const __grid_constant__ tt::TmaDesc mapD," } else { "" })
            .define("TT_MAP_D_PTR", if self.tma_store { "&mapD" } else { "nullptr" })
            .int("C_SLOTS", c_slots as i64)
            .flag("C_ONCE", self.c_once(target))
            .define("TT_MAP_C", if c_slots > 0 { "const __grid_constant__ tt::TmaDesc mapC," } else { "" })
            .define("TT_MAP_C_PTR", if c_slots > 0 { "&mapC" } else { "nullptr" })
            .flag("GATHER", self.gather())
            .flag("IM2COL", self.im2col())
            .int("GATHER_LAG", self.gather_lag() as i64)
            .int("CONV_C", dim(|c| c.c, 8))
            .int("CONV_S", dim(|c| c.s, 1))
            .int("IN_H", dim(|c| c.h, 1))
            .int("IN_W", dim(|c| c.w, 1))
            .int("OUT_H", dim(|c| c.p(), 1))
            .int("OUT_W", dim(|c| c.q(), 1))
            .int("PAD_H", dim(|c| c.pad.0, 0))
            .int("PAD_W", dim(|c| c.pad.1, 0))
            .int("STRIDE_H", dim(|c| c.stride.0, 1))
            .int("STRIDE_W", dim(|c| c.stride.1, 1))
            .int("DIL_H", dim(|c| c.dilation.0, 1))
            .int("DIL_W", dim(|c| c.dilation.1, 1))
            .define(
                "TT_X_PARAM",
                if self.gather() { "const T_IN* __restrict__ xin" } else { "const __grid_constant__ tt::TmaDesc mapX" },
            )
            .define("TT_X_MAP", if self.gather() { "nullptr" } else { "&mapX" })
            .define("TT_X_IN", if self.gather() { "xin" } else { "nullptr" })
            .flag("X_KMAJOR", self.x_kmajor())
            .flag("Y_KMAJOR", self.y_kmajor())
            // Whole tiles and, with direct stores, no cluster padding: an odd tile count in
            // clusters of 2 has a tile past N, whose rows must not be stored (they were, 8 KiB to
            // 128 KiB past D's end, on 49-tile pointwise layers; the worker's guard caught each as
            // wrong_result). A TMA store clips that tile itself: those configs keep their source,
            // and so their records (their epilogue may read C's rows past N when beta != 0).
            .flag(
                "EVEN_P",
                self.p_extent().is_multiple_of(self.bp as u64)
                    && (self.tma_store || self.tiles_p() * self.bp as u64 == self.p_extent()),
            )
            .flag(
                "EVEN_Q",
                if self.swap {
                    self.q_extent().is_multiple_of(self.bq as u64)
                } else {
                    self.m_multiple_of(self.bq as u64)
                },
            )
            // Swapped, a thread's pairs are a column of D apart: they go one element at a time.
            .flag("PAIRS_ALIGNED", !self.swap && self.m_multiple_of(2))
            // 2-byte outputs stored from registers go 16 bytes (8 columns of Q) a thread.
            .flag("VEC_ALIGNED", !self.swap && self.m_multiple_of(8))
            .flag("READ_C", w.reads_c())
            .flag("SWAP", self.swap)
            .value("T_EPI", "ALPHA", scalar(w.alpha))
            .value("T_EPI", "BETA", scalar(w.beta));
        self.epilogue_header(&mut h);
        self.problems_header(&mut h);
        h
    }

    /// The fused epilogue's constants and the kernel parameters it adds after the workspace, in
    /// the order of [`Plan::epilogue_args`].
    fn epilogue_header(&self, h: &mut Header) {
        let e = &self.w.epilogue;
        let tensor = self.w.input_scale == InputScale::Tensor;
        let act = e.activation.code();
        let mut params = String::new();
        if e.bias {
            params.push_str(", const T_OUT* __restrict__ bias_v");
        }
        if e.scale {
            params.push_str(", const float* __restrict__ rscale_v");
        }
        if tensor {
            params.push_str(", const float* __restrict__ tscale_v");
        }
        h.flag("EPI_SCALE", e.scale)
            .flag("EPI_BIAS", e.bias)
            .int("EPI_ACT", act)
            .flag("TENSOR_SCALE", tensor)
            .flag("FUSED", self.w.fused())
            .define("TT_EPI_PARAMS", params)
            .define("TT_EPI_BIAS", if e.bias { "bias_v" } else { "nullptr" })
            .define("TT_EPI_RSCALE", if e.scale { "rscale_v" } else { "nullptr" })
            .define("TT_EPI_AB", if tensor { "(tscale_v[0] * tscale_v[1])" } else { "1.0f" });
    }

    /// The epilogue's buffers, in parameter order (after the workspace).
    pub(super) fn epilogue_args(&self) -> Vec<Arg> {
        let e = &self.w.epilogue;
        let mut args = Vec::new();
        if e.bias {
            args.push(Arg::Bias);
        }
        if e.scale {
            args.push(Arg::Scale);
        }
        if self.w.input_scale == InputScale::Tensor {
            args.push(Arg::TensorScales);
        }
        args
    }

    /// `mma_tile(acc, dx, dy)`: one wgmma of a 64 x BQ tile (K 16, or 32 for i8) accumulating into
    /// `acc`, and `acc_pair`, which reads two adjacent accumulators back as T_EPI.
    pub(super) fn mma_tile(&self) -> String {
        let t = &self.w.types;
        let n = self.bq;
        let regs = self.acc_regs();
        let (shape, constraint) = match (t.input, t.accumulator) {
            (DType::I8, _) => (format!("m64n{n}k32.s32.s8.s8"), "+r"),
            // FP8: K 32 (32 bytes), f32 accumulators, K-major operands only.
            (input, _) if input.is_fp8() => (format!("m64n{n}k32.f32.{0}.{0}", input.name()), "+f"),
            // TF32: K 8 (32 bytes, as every type's step), f32 accumulators.
            (DType::Tf32, _) => (format!("m64n{n}k8.f32.tf32.tf32"), "+f"),
            (DType::F16, DType::F16) => (format!("m64n{n}k16.f16.f16.f16"), "+r"),
            (input, _) => (format!("m64n{n}k16.f32.{0}.{0}", input.name()), "+f"),
        };
        let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
        // The scale-d predicate, then (floats only: integer wgmma has neither, its operands are
        // K-major) the scale-a/b immediates and the transpose bits of MN-major operands.
        let tail = if t.input == DType::I8 {
            "p".to_string()
        } else if t.input == DType::Tf32 || t.input.is_fp8() {
            // TF32 and FP8 have the scale immediates but no transpose bits: their operands are
            // K-major.
            "p, 1, 1".to_string()
        } else {
            format!("p, 1, 1, {}, {}", u32::from(!self.x_kmajor()), u32::from(!self.y_kmajor()))
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            "// wgmma.{shape}: X {}-major, Y {}-major.",
            if self.x_kmajor() { "K" } else { "MN" },
            if self.y_kmajor() { "K" } else { "MN" }
        );
        let _ = writeln!(
            s,
            "__device__ __forceinline__ void mma_tile(T_ACCR (&d)[ACC_REGS], unsigned long long dx, unsigned long long dy) {{"
        );
        let _ = writeln!(s, "  asm volatile(");
        let _ = writeln!(s, "      \"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{}, 0;\\n\"", regs + 2);
        let _ = writeln!(
            s,
            "      \"wgmma.mma_async.sync.aligned.{shape} {{{}}}, %{}, %{}, {};\\n}}\\n\"",
            list.join(", "),
            regs,
            regs + 1,
            tail
        );
        let outs: Vec<String> = (0..regs).map(|i| format!("\"{constraint}\"(d[{i}])")).collect();
        let _ = writeln!(s, "      : {}", outs.join(", "));
        let _ = writeln!(s, "      : \"l\"(dx), \"l\"(dy), \"r\"(1));");
        let _ = writeln!(s, "}}");
        s.push('\n');
        s.push_str(
            "__device__ __forceinline__ void acc_pair(const T_ACCR (&a)[ACC_REGS], int j, int h, T_EPI& v0, T_EPI& v1) {\n",
        );
        if t.accumulator == DType::F16 {
            s.push_str("  const __half2 v = *reinterpret_cast<const __half2*>(&a[2 * j + h]);\n");
            s.push_str("  v0 = to_epi(__low2half(v));\n  v1 = to_epi(__high2half(v));\n");
        } else {
            s.push_str("  v0 = to_epi(a[4 * j + 2 * h]);\n  v1 = to_epi(a[4 * j + 2 * h + 1]);\n");
        }
        s.push_str("}\n");
        s
    }

    /// The kernel spec of a checked plan.
    pub(super) fn spec(&self, target: &Target, res: &Resources) -> KernelSpec {
        let name = self.name(target);
        let [x, y] = self.maps();
        let x = if self.gather() {
            Arg::A
        } else if let Some(m) = self.im2col_map() {
            Arg::Im2col(m)
        } else {
            Arg::Map(x)
        };
        KernelSpec {
            source: self.source(target),
            launch: Launch {
                entry: name.clone(),
                name,
                grid: [res.blocks as u32, 1, 1],
                block: [res.threads, 1, 1],
                smem_bytes: res.smem_bytes,
                workspace_bytes: res.workspace_bytes,
                args: {
                    // The kernel's parameters in order: D's map with the TMA store, then C's
                    // where the epilogue loads C by TMA (only beside the TMA store).
                    let mut args = vec![x, Arg::Map(y)];
                    if self.tma_store {
                        args.push(Arg::Map(self.map_d()));
                    }
                    if self.c_slots(target) > 0 {
                        args.push(Arg::Map(self.map_c()));
                    }
                    args.extend([Arg::C, Arg::D, Arg::Workspace]);
                    args.extend(self.epilogue_args());
                    args
                },
            },
        }
    }
}

/// The C++ type of one accumulator register.
pub(super) fn acc_reg_type(acc: DType) -> &'static str {
    match acc {
        DType::F16 => "unsigned",
        DType::I32 => "int",
        _ => "float",
    }
}
