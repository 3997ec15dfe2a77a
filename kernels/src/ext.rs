//! `mma_ext_gemm`: tensor-core matmul for the types `wmma_gemm` does not take.
//!
//! - **tf32** (f32 data, TF32 math): WMMA `m16n16k8` with `precision::tf32` fragments, each
//!   element rounded by `__float_to_tf32` after its load; any layout; sm_80 and newer.
//! - **s4, u4** (packed 4-bit, tn): `mma.sync.m8n8k32`, K a multiple of 32; **b1xor, b1and**
//!   (packed bits, tn): `mma.sync.m8n8k128` with XOR or AND popcount, K a multiple of 128. These
//!   are the instructions WMMA's experimental sub-byte fragments (`precision::s4/u4/b1`) lower
//!   to; the template issues them directly, so it loads each lane's fragment word itself rather
//!   than through `load_matrix_sync` (whose 256-bit alignment a 16-byte sub-byte K step breaks).
//!   The PTX ISA has them on sm_75 to sm_90 (AND popcount from sm_80); newer GPUs lack them.
//!
//! One block per output tile over the whole of K, a cp.async ring, shared-memory staging of the
//! accumulators for vector stores of D. Its CUDA body is `src/cuda/mma_ext.cu`; everything
//! derives from one [`Plan`].

use crate::cuda::{Header, Scalar, ident};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Knob, Space, positions_at};
use crate::target::Target;
use crate::template::{Arg, KernelSpec, Launch, Resources, Template};
use crate::tiling::{LAUNCH_US, Tiling, feed_efficiency, widest_vec};
use crate::workload::{Matmul, Op, Workload};

const BODY: &str = include_str!("cuda/mma_ext.cu");

// The knob domains, in the order of the space (the last varies fastest in the index).
const BLOCK_M: &[u32] = &[32, 64, 128, 256];
const BLOCK_N: &[u32] = &[32, 64, 128, 256];
/// K per stage in bytes of a K-contiguous row (8, 16 or 32 tf32 elements; 64 to 256 of 4 bits;
/// 256 to 1024 bits), so one domain serves every type.
const BLOCK_K_BYTES: &[u32] = &[32, 64, 128];
const WARPS_M: &[u32] = &[1, 2, 4];
const WARPS_N: &[u32] = &[1, 2, 4];
const STAGES: &[u32] = &[1, 2, 3, 4];
const SKEW: &[u32] = &[0, 1];
const KNOBS: usize = 7;
const DOMAIN_SIZES: [usize; KNOBS] =
    [BLOCK_M.len(), BLOCK_N.len(), BLOCK_K_BYTES.len(), WARPS_M.len(), WARPS_N.len(), STAGES.len(), SKEW.len()];

/// Accumulator registers per thread above which a warp tile would spill: packed types hold one
/// fragment word per operand; tf32 holds four per fragment and ptxas hoists the loads of a whole
/// unrolled K tile, so 128 accumulators spilled (sm_80, NVRTC 13.0).
const MAX_ACC_REGS: u32 = 128;
const MAX_ACC_REGS_TF32: u32 = 64;
/// Warps per block.
const MAX_WARPS: u32 = 8;
/// Global-to-shared vector copies one thread makes per stage.
const MAX_COPIES: u32 = 16;
/// Bytes a kernel may address in one operand with its 32-bit byte offsets.
const MAX_OPERAND_BYTES: u64 = (1 << 31) - 1;

/// The extended-type tensor-core matmul template.
pub struct MmaExtGemm;

/// The fragment (name, m, n, k) of an input type, or `None` for a type the template does not take.
pub fn fragment(input: DType) -> Option<(&'static str, u32, u32, u32)> {
    match input {
        DType::Tf32 => Some(("m16n16k8", 16, 16, 8)),
        DType::S4 | DType::U4 => Some(("m8n8k32", 8, 8, 32)),
        DType::B1Xor | DType::B1And => Some(("m8n8k128", 8, 8, 128)),
        _ => None,
    }
}

/// The architectures with the instruction for `input`: (first, last), `None` meaning no last.
fn arch_range(input: DType) -> (u32, Option<u32>) {
    match input {
        DType::Tf32 => (80, None),
        DType::S4 | DType::U4 | DType::B1Xor => (75, Some(90)),
        _ => (80, Some(90)),
    }
}

/// Every quantity a config implies for a workload.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub w: Matmul,
    /// Block tile.
    pub bm: u32,
    /// Block tile.
    pub bn: u32,
    /// K per stage, elements.
    pub bk: u32,
    /// Warp grid.
    pub warps_m: u32,
    /// Warp grid.
    pub warps_n: u32,
    /// Shared-memory ring depth.
    pub stages: u32,
    /// Row padding in bytes (16, or 0).
    pub skew_bytes: u32,
    /// Fragment (name, m, n, k).
    pub frag: (&'static str, u32, u32, u32),
    /// Whether loads use cp.async.
    pub cp_async: bool,
}

impl Plan {
    /// Reads the knobs of `config` (domains are checked by the space).
    pub fn new(w: &Matmul, config: &Config, target: &Target) -> Result<Plan> {
        let positions = MmaExtGemm.space().positions(config)?;
        Plan::from_positions(w, &positions, target)
    }

    /// The plan of the config at `index` of the space.
    pub fn at(w: &Matmul, index: u64, target: &Target) -> Result<Plan> {
        Plan::from_positions(w, &positions_at(index, &DOMAIN_SIZES), target)
    }

    fn from_positions(w: &Matmul, pos: &[usize], target: &Target) -> Result<Plan> {
        let input = w.types.input;
        let frag = fragment(input).ok_or_else(|| unsupported_input(input))?;
        Ok(Plan {
            w: *w,
            bm: BLOCK_M[pos[0]],
            bn: BLOCK_N[pos[1]],
            bk: BLOCK_K_BYTES[pos[2]] * 8 / input.bits(),
            warps_m: WARPS_M[pos[3]],
            warps_n: WARPS_N[pos[4]],
            stages: STAGES[pos[5]],
            skew_bytes: 16 * SKEW[pos[6]],
            frag,
            cp_async: target.has_cp_async(),
        })
    }

    fn bits(&self) -> u32 {
        self.w.types.input.bits()
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.warps_m * self.warps_n * 32
    }

    /// Output tiles along M and N.
    pub fn tiles(&self) -> (u64, u64) {
        (self.w.m.div_ceil(self.bm as u64), self.w.n.div_ceil(self.bn as u64))
    }

    /// K tiles.
    pub fn ktiles(&self) -> u64 {
        self.w.k.div_ceil(self.bk as u64)
    }

    /// Fragments per warp along M and N.
    pub fn frags_per_warp(&self) -> (u32, u32) {
        (self.bm / self.warps_m / self.frag.1, self.bn / self.warps_n / self.frag.2)
    }

    /// Accumulator registers per thread.
    pub fn acc_regs(&self) -> u32 {
        let (fm, fn_) = self.frags_per_warp();
        fm * fn_ * self.frag.1 * self.frag.2 / 32
    }

    /// (rows, bytes per row before padding) of the staged A and B tiles.
    fn staged(&self) -> ((u32, u32), (u32, u32)) {
        let k_row = self.bk * self.bits() / 8;
        let a = if self.w.layout.a_k_contiguous() { (self.bm, k_row) } else { (self.bk, self.bm * 4) };
        let b = if self.w.layout.b_k_contiguous() { (self.bn, k_row) } else { (self.bk, self.bn * 4) };
        (a, b)
    }

    /// Bytes of one ring slot (A and B).
    pub fn stage_bytes(&self) -> u32 {
        let ((ar, ac), (br, bc)) = self.staged();
        ar * (ac + self.skew_bytes) + br * (bc + self.skew_bytes)
    }

    /// Dynamic shared memory: the ring, or the accumulator staging that reuses it.
    pub fn smem_bytes(&self) -> u32 {
        (self.stages * self.stage_bytes()).max(self.bn * (self.bm + 4) * 4)
    }

    /// Bytes per global load of A and B, and per store of D.
    pub fn vectors(&self) -> (u32, u32, u32) {
        let w = &self.w;
        let ((_, ac), (_, bc)) = self.staged();
        let row = |k_contig: bool, other: u64| if k_contig { w.types.input.storage_bytes(w.k) } else { other * 4 };
        (
            widest_vec(1, &[row(w.layout.a_k_contiguous(), w.m), ac as u64]),
            widest_vec(1, &[row(w.layout.b_k_contiguous(), w.n), bc as u64]),
            widest_vec(4, &[w.m * 4, (self.bm * 4) as u64]),
        )
    }

    /// Blocks one SM holds at once (threads, shared memory, estimated registers).
    pub fn blocks_per_sm(&self, target: &Target) -> u32 {
        let threads = self.threads();
        let by_threads = 2048 / threads;
        let by_smem = target.smem_per_sm / (self.smem_bytes() + 1024);
        let by_regs = target.regs_per_sm / ((self.acc_regs() + 64).min(255) * threads);
        by_threads.min(by_smem).min(by_regs).clamp(1, 32)
    }

    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        let (fname, fm, fn_, fk) = self.frag;
        let w = &self.w;
        if !self.bm.is_multiple_of(self.warps_m * fm) || !self.bn.is_multiple_of(self.warps_n * fn_) {
            return reject(reason!(format!(
                "block tile {}x{} is not a multiple of warps {}x{} of {fname} fragments",
                self.bm, self.bn, self.warps_m, self.warps_n
            )));
        }
        if !self.bk.is_multiple_of(fk) {
            return reject(reason!(format!("block_k {} is not a multiple of the {fname} step {fk}", self.bk)));
        }
        for (name, tile, dim, axis) in [("block_m", self.bm, w.m, "M"), ("block_n", self.bn, w.n, "N")] {
            if tile > 32 && dim.div_ceil(tile as u64 / 2) == dim.div_ceil(tile as u64) {
                return reject(reason!(format!(
                    "{name} {tile} covers {axis} = {dim} no better than {name} {}: wasted work",
                    tile / 2
                )));
            }
        }
        let warps = self.warps_m * self.warps_n;
        if warps > MAX_WARPS || self.threads() > target.max_threads_per_block {
            return reject(reason!(format!("{warps} warps per block; the template uses at most {MAX_WARPS}")));
        }
        let (fmw, fnw) = self.frags_per_warp();
        let (wm, wn) = (fmw * fm, fnw * fn_);
        if wm > 4 * wn || wn > 4 * wm {
            return reject(reason!(format!(
                "warp tile {wm}x{wn} is skinnier than 4:1: a squarer warp grid reuses fragments better"
            )));
        }
        let max_acc = if w.types.input == DType::Tf32 { MAX_ACC_REGS_TF32 } else { MAX_ACC_REGS };
        if self.acc_regs() > max_acc {
            return reject(reason!(format!(
                "warp tile {wm}x{wn} needs {} accumulator registers per thread; the limit for {} is {max_acc}",
                self.acc_regs(),
                w.types.input
            )));
        }
        // Each thread issues its copies of a stage in one unrolled burst; past 16 the addresses
        // alone crowd the registers (a one-warp block of 24 spilled on sm_80).
        let (vec_a, vec_b, _) = self.vectors();
        let ((ar, ac), (br, bc)) = self.staged();
        let copies = ((ar * ac / vec_a) + (br * bc / vec_b)).div_ceil(self.threads());
        if copies > MAX_COPIES {
            return reject(reason!(format!(
                "{} threads copy {copies} vectors each per stage of a {}x{}x{} tile; at most {MAX_COPIES}",
                self.threads(),
                self.bm,
                self.bn,
                self.bk
            )));
        }
        let smem = self.smem_bytes();
        if smem > target.max_smem_per_block {
            return reject(reason!(format!(
                "block tile {}x{}x{} with {} stages needs {} KiB of shared memory; this GPU allows {} KiB per block",
                self.bm,
                self.bn,
                self.bk,
                self.stages,
                smem.div_ceil(1024),
                target.max_smem_per_block / 1024
            )));
        }
        let ktiles = self.ktiles();
        if self.stages > 1 && !self.cp_async {
            return reject(reason!(format!(
                "stages {} needs cp.async (sm_80+); this GPU is sm_{}",
                self.stages, target.arch
            )));
        }
        if self.stages == 1 && self.cp_async && ktiles > 1 {
            return reject(reason!(format!(
                "stages 1 on a GPU with cp.async and {ktiles} k-tiles: stages 2 overlaps the same loads"
            )));
        }
        if self.stages > 1 && self.stages as u64 > ktiles {
            return reject(reason!(format!("stages {} exceeds the {ktiles} k-tiles", self.stages)));
        }
        for (operand, elems) in [("A", w.m * w.k), ("B", w.k * w.n)] {
            let bytes = w.types.input.storage_bytes(elems);
            if bytes > MAX_OPERAND_BYTES {
                return reject(reason!(format!(
                    "{operand} holds {bytes} bytes; the template addresses at most {MAX_OPERAND_BYTES} with 32-bit offsets"
                )));
            }
        }
        let (tm, tn) = self.tiles();
        Ok(Resources { threads: self.threads(), smem_bytes: smem, blocks: tm * tn, workspace_bytes: 0 })
    }

    /// The kernel's identity: template, version, knobs and a digest of the workload key.
    pub fn name(&self) -> String {
        ident(&format!(
            "tt_mma_ext_gemm_v{}_{}_{}_b{}x{}x{}_w{}x{}_s{}_p{}_{}",
            MmaExtGemm.version(),
            self.w.types.input,
            self.w.layout,
            self.bm,
            self.bn,
            self.bk,
            self.warps_m,
            self.warps_n,
            self.stages,
            u32::from(self.skew_bytes > 0),
            crate::short_digest(&Workload::Matmul(self.w).key())
        ))
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let w = &self.w;
        let t = &w.types;
        let name = self.name();
        let (vec_a, vec_b, vec_d) = self.vectors();
        let packed = t.input.is_packed();
        let scalar = |v: f64| if packed { Scalar::Int(v as i64) } else { Scalar::Float(v) };
        let epi = if packed { "int" } else { "float" };
        let op = match t.input {
            DType::B1Xor => 1,
            DType::B1And => 2,
            _ => 0,
        };
        let mut h = Header::default();
        h.comment(format!("tensortune mma_ext_gemm v{}: {name}", MmaExtGemm.version()))
            .comment(format!("workload: {}", Workload::Matmul(*w).key()))
            .define("KERNEL_NAME", &name)
            .define("TT_PACKED", u8::from(packed))
            .typedef("T_IN", t.input.cuda())
            .typedef("T_ACC", epi)
            .typedef("T_OUT", t.output.cuda())
            .typedef("T_EPI", epi);
        h.int("M", w.m as i64)
            .int("N", w.n as i64)
            .int("K", w.k as i64)
            .int("IN_BITS", t.input.bits() as i64)
            .flag("IN_SIGNED", t.input == DType::S4)
            .int("IN_OP", op)
            .flag("A_K_CONTIG", w.layout.a_k_contiguous())
            .flag("B_K_CONTIG", w.layout.b_k_contiguous())
            .cfg_type("A_FRAG_LAYOUT", if w.layout.a_k_contiguous() { "wmma::row_major" } else { "wmma::col_major" })
            .cfg_type("B_FRAG_LAYOUT", if w.layout.b_k_contiguous() { "wmma::col_major" } else { "wmma::row_major" })
            .int("BM", self.bm as i64)
            .int("BN", self.bn as i64)
            .int("BK", self.bk as i64)
            .int("WARPS_M", self.warps_m as i64)
            .int("WARPS_N", self.warps_n as i64)
            .int("FM", self.frag.1 as i64)
            .int("FN", self.frag.2 as i64)
            .int("FK", self.frag.3 as i64)
            .int("STAGES", self.stages as i64)
            .int("SKEW_BYTES", self.skew_bytes as i64)
            .int("VEC_A", vec_a as i64)
            .int("VEC_B", vec_b as i64)
            .int("VEC_D", vec_d as i64)
            .flag("CP_ASYNC", self.cp_async)
            .flag("READ_C", w.reads_c())
            .value("T_EPI", "ALPHA", scalar(w.alpha))
            .value("T_EPI", "BETA", scalar(w.beta));
        h.source(&format!("ns_{name}"), &[crate::cuda::COMMON, BODY])
    }
}

fn reject<T>(why: String) -> Result<T> {
    Err(Error::Rejected(why))
}

fn unsupported_input(input: DType) -> Error {
    Error::invalid(
        "input",
        format!(
            "mma_ext_gemm takes tf32, s4, u4, b1xor and b1and inputs, not {input} (wmma_gemm and simt_gemm take the rest)"
        ),
    )
}

fn matmul(workload: &Workload) -> Result<&Matmul> {
    workload.matmul_for("mma_ext_gemm")
}

impl Template for MmaExtGemm {
    fn name(&self) -> &'static str {
        "mma_ext_gemm"
    }

    fn version(&self) -> u32 {
        crate::version::MMA_EXT_GEMM
    }

    fn op(&self) -> Op {
        Op::Matmul
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        let input = matmul(workload)?.types.input;
        let (first, last) = arch_range(input);
        let what = match input {
            DType::Tf32 => "TF32 tensor cores (wmma m16n16k8)",
            DType::B1And => "AND-popcount binary mma (mma.sync m8n8k128 .and.popc)",
            DType::B1Xor => "XOR-popcount binary mma (mma.sync m8n8k128 .xor.popc)",
            _ => "4-bit integer mma (mma.sync m8n8k32)",
        };
        if target.arch < first || last.is_some_and(|l| target.arch > l) {
            let range = match last {
                Some(l) => format!("sm_{first} to sm_{l} in the PTX ISA"),
                None => format!("sm_{first} or newer"),
            };
            return Err(Error::Unsupported {
                template: "mma_ext_gemm",
                what: format!("{input} on sm_{}: {what} exists on {range}", target.arch),
            });
        }
        Ok(())
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let w = matmul(workload)?;
        w.validate()?;
        w.require_plain("mma_ext_gemm")?;
        let input = w.types.input;
        fragment(input).ok_or_else(|| unsupported_input(input))?;
        // Rows of staged tiles move in 16-byte vectors at best and never straddle a row end:
        // tf32 rows are whole floats; packed K is a whole number of 16-byte steps already.
        Ok(())
    }

    fn space(&self) -> Space {
        let ints = |name, v: &[u32]| Knob::ints(name, &v.iter().map(|x| *x as i64).collect::<Vec<_>>());
        Space {
            knobs: vec![
                ints("block_m", BLOCK_M),
                ints("block_n", BLOCK_N),
                ints("block_k_bytes", BLOCK_K_BYTES),
                ints("warps_m", WARPS_M),
                ints("warps_n", WARPS_N),
                ints("stages", STAGES),
                ints("skew", SKEW),
            ],
        }
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let w = matmul(workload)?;
        let len: u64 = DOMAIN_SIZES.iter().map(|n| *n as u64).product();
        crate::error::without_reasons(|| {
            let mut out = Vec::new();
            for i in 0..len {
                if Plan::at(w, i, target)?.check(target).is_ok() {
                    out.push(i);
                }
            }
            Ok(out)
        })
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.check_workload(workload)?;
        self.space().index_of(config)?;
        Plan::new(matmul(workload)?, config, target)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        let plan = Plan::new(matmul(workload)?, config, target)?;
        let res = plan.check(target)?;
        let (tm, tn) = plan.tiles();
        let name = plan.name();
        Ok(KernelSpec {
            source: plan.source(),
            launch: Launch {
                entry: name.clone(),
                name,
                grid: [(tm * tn) as u32, 1, 1],
                block: [res.threads, 1, 1],
                smem_bytes: res.smem_bytes,
                workspace_bytes: 0,
                args: vec![Arg::A, Arg::B, Arg::C, Arg::D, Arg::Workspace],
            },
        })
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        let p = Plan::new(matmul(workload)?, config, target)?;
        let (tm, tn) = p.tiles();
        let (fm, fn_) = p.frags_per_warp();
        let occ = p.blocks_per_sm(target);
        let waves = (tm * tn) as f64 / (target.sm_count * occ) as f64;
        Ok(vec![
            ("log2_block_m", (p.bm as f64).log2()),
            ("log2_block_n", (p.bn as f64).log2()),
            ("log2_block_k", (p.bk as f64).log2()),
            ("warps_m", p.warps_m as f64),
            ("warps_n", p.warps_n as f64),
            ("stages", p.stages as f64),
            ("skew", (p.skew_bytes > 0) as u8 as f64),
            ("threads", p.threads() as f64),
            ("smem_kib", p.smem_bytes() as f64 / 1024.0),
            ("acc_regs", p.acc_regs() as f64),
            ("warp_reuse", (fm * fn_) as f64 / (fm + fn_) as f64),
            ("block_intensity", (p.bm * p.bn) as f64 / (p.bm + p.bn) as f64),
            ("blocks_per_sm", occ as f64),
            ("waves", waves),
            ("wave_efficiency", waves / waves.ceil().max(1.0)),
            ("log2_tiles", ((tm * tn) as f64).log2()),
            ("ktiles", p.ktiles() as f64),
            ("model_log_us", model(&p, target).ln()),
        ])
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        self.check_workload(workload)?;
        let p = Plan::new(matmul(workload)?, config, target)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

/// Analytic time of a plan in microseconds, shaped like `wmma_gemm`'s: tensor-core work at the
/// type's rate (TF32 half the 16-bit peak; 4-bit twice i8's and bits eight times 16-bit on the
/// A100's ratios, which Hopper's datasheet does not state), scaled by fragment reuse, pipeline
/// depth, padding and occupancy; memory traffic in packed bytes; the load-latency floor.
fn model(p: &Plan, target: &Target) -> f64 {
    let occ = p.blocks_per_sm(target);
    let eff = feed_efficiency(p.frags_per_warp(), p.stages, p.skew_bytes != 0, occ * p.warps_m * p.warps_n);
    let rate = match p.w.types.input {
        DType::Tf32 => 0.5,
        DType::S4 | DType::U4 => 4.0,
        _ => 16.0,
    };
    let per_sm = 650e6 / 132.0 * rate;
    let (tm, tn) = p.tiles();
    let block_flops = 2.0 * (p.bm * p.bn * p.bk) as f64 * p.ktiles() as f64;
    let concurrent = (target.sm_count * occ) as f64;
    let waves = ((tm * tn) as f64 / concurrent).ceil();
    let compute = waves * block_flops * occ as f64 / (per_sm * eff);
    let w = &p.w;
    let input = w.types.input;
    let bytes = tn as f64 * input.storage_bytes(w.m * w.k) as f64
        + tm as f64 * input.storage_bytes(w.k * w.n) as f64
        + (w.m * w.n * 4) as f64;
    let memory = bytes / 3.0e6;
    let in_flight = p.stages.min(p.ktiles() as u32).max(1) as f64;
    let latency = waves * 0.5 * (1.0 + p.ktiles() as f64 / in_flight);
    Tiling::bound_us(compute, memory, latency) + LAUNCH_US
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::valid_configs;
    use crate::workload::{Layout, Types};

    fn mm(m: u64, n: u64, k: u64, layout: Layout, input: DType) -> Workload {
        Workload::Matmul(Matmul::new(m, n, k, layout, Types::default_for(input).unwrap()).unwrap())
    }

    #[test]
    fn every_new_type_has_valid_configs_on_the_suite_shapes() {
        for (input, layout) in [
            (DType::Tf32, Layout::Nn),
            (DType::Tf32, Layout::Tt),
            (DType::S4, Layout::Tn),
            (DType::U4, Layout::Tn),
            (DType::B1Xor, Layout::Tn),
            (DType::B1And, Layout::Tn),
        ] {
            for (m, n, k) in [(4096, 4096, 4096), (512, 64, 4096), (1024, 1024, 1024)] {
                let w = mm(m, n, k, layout, input);
                for t in [Target::sm80(), Target::sm90()] {
                    let valid = valid_configs(&MmaExtGemm, &w, &t).unwrap();
                    assert!(valid.len() >= 20, "{} on {}: {} valid", w.key(), t.name, valid.len());
                }
            }
        }
    }

    #[test]
    fn architectures_are_named() {
        let mut t = Target::sm80();
        t.arch = 75;
        let s4 = mm(64, 64, 64, Layout::Tn, DType::S4);
        MmaExtGemm.supports(&s4, &t).unwrap();
        let e = MmaExtGemm.supports(&mm(64, 64, 128, Layout::Tn, DType::B1And), &t).unwrap_err().to_string();
        assert!(e.contains("sm_80 to sm_90") && e.contains("AND"), "{e}");
        let e = MmaExtGemm.supports(&mm(64, 64, 64, Layout::Nn, DType::Tf32), &t).unwrap_err().to_string();
        assert!(e.contains("sm_80 or newer"), "{e}");
        t.arch = 100;
        let e = MmaExtGemm.supports(&s4, &t).unwrap_err().to_string();
        assert!(e.contains("sm_75 to sm_90 in the PTX ISA"), "{e}");
        let e = MmaExtGemm.supports(&mm(64, 64, 64, Layout::Nn, DType::F16), &Target::sm90()).unwrap_err();
        assert_eq!(e.field(), Some("input"));
        // sm_75 has no cp.async: single-stage configs only.
        t.arch = 75;
        let valid = valid_configs(&MmaExtGemm, &mm(256, 256, 4096, Layout::Tn, DType::S4), &t).unwrap();
        assert!(!valid.is_empty() && valid.iter().all(|(_, c)| c.int("stages").unwrap() == 1));
    }

    #[test]
    fn sizes_are_in_bits() {
        let t = Target::sm90();
        let w = mm(4096, 4096, 4096, Layout::Tn, DType::B1Xor);
        let Workload::Matmul(m) = w else { unreachable!() };
        let mut c = MmaExtGemm.space().config(0).unwrap();
        for (k, v) in [("block_m", 128), ("block_n", 128), ("block_k_bytes", 64), ("warps_m", 2), ("warps_n", 2)] {
            c.0.insert(k.into(), v.into());
        }
        let p = Plan::new(&m, &c, &t).unwrap();
        // 64 bytes of bits are 512 elements of K per stage; rows of 64 bytes.
        assert_eq!(p.bk, 512);
        assert_eq!(p.stage_bytes(), 2 * 128 * 64);
        // A row of K = 4096 bits is 512 bytes: 16-byte vectors.
        assert_eq!(p.vectors().0, 16);
        let s4 = mm(64, 64, 96, Layout::Tn, DType::S4);
        let Workload::Matmul(m) = s4 else { unreachable!() };
        let p = Plan::new(&m, &c, &t).unwrap();
        assert_eq!((p.bk, p.vectors().0), (128, 16));
    }

    #[test]
    fn generated_sources_carry_the_type() {
        let t = Target::sm90();
        for (input, layout, want) in [
            (DType::Tf32, Layout::Nt, "#define TT_PACKED 0"),
            (DType::S4, Layout::Tn, "constexpr bool IN_SIGNED = true;"),
            (DType::B1And, Layout::Tn, "constexpr int IN_OP = 2;"),
        ] {
            let w = mm(1024, 1024, 1024, layout, input);
            let valid = valid_configs(&MmaExtGemm, &w, &t).unwrap();
            let spec = MmaExtGemm.generate(&w, &valid[valid.len() / 2].1, &t).unwrap();
            assert!(spec.source.contains(want), "{input}: missing {want}");
            assert!(spec.name.starts_with(&format!("tt_mma_ext_gemm_v1_{input}_{layout}")), "{}", spec.name);
            let model = MmaExtGemm.model_us(&w, &valid[0].1, &t).unwrap();
            assert!(model.is_finite() && model > 0.0);
        }
    }
}
