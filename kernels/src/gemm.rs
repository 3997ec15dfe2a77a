//! `wmma_gemm`: the WMMA matmul template. Knobs, validity rules, code generation, features and
//! the analytic model all derive from one [`Plan`], so what is checked is what is generated.

use crate::cuda::{Header, Scalar, ident};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Knob, Space};
use crate::target::Target;
use crate::template::{Arg, KernelSpec, Resources, Template};
use crate::workload::{Matmul, Op, Workload};

const BODY: &str = include_str!("cuda/wmma_gemm.cu");

/// Fragment shapes WMMA offers for 16-bit and 8-bit inputs: (name, m, n, k).
pub const FRAGS: &[(&str, u32, u32, u32)] =
    &[("m16n16k16", 16, 16, 16), ("m32n8k16", 32, 8, 16), ("m8n32k16", 8, 32, 16)];

// The knob domains, in the order of the space (the last varies fastest in the index).
const BLOCK_M: &[u32] = &[16, 32, 64, 128, 256];
const BLOCK_N: &[u32] = &[16, 32, 64, 128, 256];
const BLOCK_K: &[u32] = &[32, 64];
const WARPS_M: &[u32] = &[1, 2, 4];
const WARPS_N: &[u32] = &[1, 2, 4];
const WARPS_K: &[u32] = &[1, 2, 4];
const STAGES: &[u32] = &[1, 2, 3, 4, 8];
const SKEW: &[u32] = &[0, 1];
const SPLIT_K: &[u32] = &[1, 2, 4, 8, 16];
const SPLIT_REDUCE: &[&str] = &["workspace", "cluster"];
const SWIZZLE: &[u32] = &[1, 8];
const MIN_BLOCKS: &[u32] = &[1, 2];
const KNOBS: usize = 13;
const DOMAIN_SIZES: [usize; KNOBS] = [
    BLOCK_M.len(),
    BLOCK_N.len(),
    BLOCK_K.len(),
    WARPS_M.len(),
    WARPS_N.len(),
    WARPS_K.len(),
    FRAGS.len(),
    STAGES.len(),
    SKEW.len(),
    SPLIT_K.len(),
    SPLIT_REDUCE.len(),
    SWIZZLE.len(),
    MIN_BLOCKS.len(),
];

/// Accumulator registers per thread above which a warp tile would spill.
const MAX_ACC_REGS: u32 = 128;
/// Warps per block: more would need warp tiles too small to reuse their fragments.
const MAX_WARPS: u32 = 8;

/// The WMMA matmul template.
pub struct WmmaGemm;

/// Every quantity a config implies for a workload, computed once.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub w: Matmul,
    /// Block tile.
    pub bm: u32,
    /// Block tile.
    pub bn: u32,
    /// Block tile (K per pipeline stage).
    pub bk: u32,
    /// Warp grid.
    pub warps_m: u32,
    /// Warp grid.
    pub warps_n: u32,
    /// Warps sharing each output sub-tile, taking alternate 16-deep K steps.
    pub warps_k: u32,
    /// Fragment shape name and dims.
    pub frag: (&'static str, u32, u32, u32),
    /// Shared-memory ring depth.
    pub stages: u32,
    /// Row padding in elements (16 bytes, or 0).
    pub skew: u32,
    /// K splits.
    pub split_k: u32,
    /// Whether K splits meet in a thread-block cluster (sm_90) instead of the workspace.
    pub cluster_reduce: bool,
    /// Row tiles per rasterisation group.
    pub swizzle: u32,
    /// Blocks per SM the register allocation must allow (`__launch_bounds__`'s second argument).
    pub min_blocks: u32,
    /// Bytes per global load of A, B and per store of D.
    pub vec_a: u32,
    /// Bytes per global load of B.
    pub vec_b: u32,
    /// Bytes per store of D (and load of C).
    pub vec_d: u32,
    /// Whether loads use cp.async.
    pub cp_async: bool,
}

impl Plan {
    /// Reads the knobs of `config` (domains are checked by the space).
    pub fn new(w: &Matmul, config: &Config, target: &Target) -> Result<Plan> {
        let positions = WmmaGemm.space().positions(config)?;
        Ok(Plan::from_positions(w, &positions, target))
    }

    /// The plan of the config at `index` of the space, without building the config.
    pub fn at(w: &Matmul, index: u64, target: &Target) -> Plan {
        let mut rest = index;
        let mut positions = [0usize; KNOBS];
        for (k, radix) in DOMAIN_SIZES.iter().enumerate().rev() {
            positions[k] = (rest % *radix as u64) as usize;
            rest /= *radix as u64;
        }
        Plan::from_positions(w, &positions, target)
    }

    /// The plan for each knob's position in its domain (knob order of [`WmmaGemm::space`]).
    fn from_positions(w: &Matmul, pos: &[usize], target: &Target) -> Plan {
        let esize = w.types.input.bytes();
        let (bm, bn, bk) = (BLOCK_M[pos[0]], BLOCK_N[pos[1]], BLOCK_K[pos[2]]);
        let a_cols = if w.layout.a_k_contiguous() { bk } else { bm };
        let a_extent = if w.layout.a_k_contiguous() { w.k } else { w.m };
        let b_cols = if w.layout.b_k_contiguous() { bk } else { bn };
        let b_extent = if w.layout.b_k_contiguous() { w.k } else { w.n };
        let out = w.types.output.bytes();
        Plan {
            w: *w,
            bm,
            bn,
            bk,
            warps_m: WARPS_M[pos[3]],
            warps_n: WARPS_N[pos[4]],
            warps_k: WARPS_K[pos[5]],
            frag: FRAGS[pos[6]],
            stages: STAGES[pos[7]],
            skew: if SKEW[pos[8]] == 1 { 16 / esize } else { 0 },
            split_k: SPLIT_K[pos[9]],
            cluster_reduce: SPLIT_REDUCE[pos[10]] == "cluster",
            swizzle: SWIZZLE[pos[11]],
            min_blocks: MIN_BLOCKS[pos[12]],
            vec_a: widest_vec(esize, &[a_extent * esize as u64, (a_cols * esize) as u64]),
            vec_b: widest_vec(esize, &[b_extent * esize as u64, (b_cols * esize) as u64]),
            vec_d: widest_vec(out, &[w.m * out as u64, (bm * out) as u64]),
            cp_async: target.has_cp_async(),
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.warps_m * self.warps_n * self.warps_k * 32
    }

    /// Output tiles along M and N.
    pub fn tiles(&self) -> (u64, u64) {
        (self.w.m.div_ceil(self.bm as u64), self.w.n.div_ceil(self.bn as u64))
    }

    /// K tiles in all, and per split.
    pub fn ktiles(&self) -> (u64, u64) {
        let kt = self.w.k.div_ceil(self.bk as u64);
        (kt, kt.div_ceil(self.split_k as u64))
    }

    /// Accumulator fragments per warp.
    pub fn frags_per_warp(&self) -> (u32, u32) {
        (self.bm / self.warps_m / self.frag.1, self.bn / self.warps_n / self.frag.2)
    }

    /// Accumulator registers per thread.
    pub fn acc_regs(&self) -> u32 {
        let (fm, fn_) = self.frags_per_warp();
        let elems = self.frag.1 * self.frag.2 / 32;
        fm * fn_ * elems * self.w.types.accumulator.bytes() / 4
    }

    /// Dynamic shared memory: the pipeline ring or the epilogue staging, whichever is larger.
    pub fn smem_bytes(&self) -> u32 {
        let e = self.w.types.input.bytes();
        let (a_rows, a_cols) = if self.w.layout.a_k_contiguous() { (self.bm, self.bk) } else { (self.bk, self.bm) };
        let (b_rows, b_cols) = if self.w.layout.b_k_contiguous() { (self.bn, self.bk) } else { (self.bk, self.bn) };
        let ring = self.stages * (a_rows * (a_cols + self.skew) + b_rows * (b_cols + self.skew)) * e;
        let acc = self.w.types.accumulator.bytes();
        let staging = self.warps_k * self.bn * (self.bm + 16 / acc) * acc;
        ring.max(staging)
    }

    /// Split-K scratch: a counter per output tile (256-byte aligned), then the partial tiles.
    pub fn workspace_bytes(&self) -> u64 {
        if self.split_k == 1 {
            return 0;
        }
        let (tm, tn) = self.tiles();
        let counters = (tm * tn * 4).div_ceil(256) * 256;
        // Partials are kept in the epilogue's type (f32 or i32), whatever the accumulator.
        counters + tm * tn * self.split_k as u64 * (self.bm * self.bn) as u64 * 4
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        let (tm, tn) = self.tiles();
        tm * tn * self.split_k as u64
    }

    /// Blocks one SM holds at once, limited by threads, shared memory and (estimated) registers.
    pub fn blocks_per_sm(&self, target: &Target) -> u32 {
        let threads = self.threads();
        let regs = (self.acc_regs() + 48).min(255).min(self.register_cap(target)) * threads;
        let by_threads = 2048 / threads;
        let by_smem = target.smem_per_sm / self.smem_bytes().max(1);
        let by_regs = target.regs_per_sm / regs.max(1);
        by_threads.min(by_smem).min(by_regs).clamp(1, 32)
    }

    /// Registers per thread the compiler may use so that `min_blocks` blocks fit on an SM.
    pub fn register_cap(&self, target: &Target) -> u32 {
        (target.regs_per_sm / (self.threads() * self.min_blocks) / 8 * 8).min(255)
    }

    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        let reject = |why: String| Err(Error::Rejected(why));
        let (fname, fm, fn_, fk) = self.frag;
        let w = &self.w;
        if !self.bm.is_multiple_of(self.warps_m * fm) {
            return reject(format!(
                "block_m {} is not a multiple of warps_m {} x fragment m {fm} ({fname})",
                self.bm, self.warps_m
            ));
        }
        if !self.bn.is_multiple_of(self.warps_n * fn_) {
            return reject(format!(
                "block_n {} is not a multiple of warps_n {} x fragment n {fn_} ({fname})",
                self.bn, self.warps_n
            ));
        }
        if !self.bk.is_multiple_of(fk * self.warps_k) {
            return reject(format!(
                "block_k {} has {} sixteen-deep steps, too few to share among warps_k {}",
                self.bk,
                self.bk / fk,
                self.warps_k
            ));
        }
        for (name, tile, dim) in [("block_m", self.bm, w.m), ("block_n", self.bn, w.n)] {
            if tile > 16 && dim.div_ceil(tile as u64 / 2) == dim.div_ceil(tile as u64) {
                let axis = if name == "block_m" { "M" } else { "N" };
                return reject(format!(
                    "{name} {tile} covers {axis} = {dim} no better than {name} {}: wasted work",
                    tile / 2
                ));
            }
        }
        let warps = self.warps_m * self.warps_n * self.warps_k;
        if warps > MAX_WARPS {
            return reject(format!("{warps} warps per block; the template uses at most {MAX_WARPS}"));
        }
        if self.warps_k > 1 && self.blocks() >= 2 * target.sm_count as u64 {
            return reject(format!(
                "warps_k {} on a grid of {} blocks: sliced K is for grids too small to fill the {} SMs twice",
                self.warps_k,
                self.blocks(),
                target.sm_count
            ));
        }
        let warps = self.warps_m * self.warps_n;
        let (fmw, fnw) = self.frags_per_warp();
        if warps >= 4 && fmw * fnw < 2 {
            return reject(format!(
                "{warps} warps each holding one {fm}x{fn_} fragment: a warp tile this small re-reads shared memory for every MMA"
            ));
        }
        let (wm, wn) = (self.bm / self.warps_m, self.bn / self.warps_n);
        // m32n8k16 and m8n32k16 issue the same MMAs as m16n16k16 (the hardware's m16n8k16); they
        // only pay where m16n16k16 cannot tile the warp (8-wide or 8-tall warp tiles).
        if fname != "m16n16k16" && wm % 16 == 0 && wn % 16 == 0 {
            return reject(format!("{fname} on a {wm}x{wn} warp tile: m16n16k16 tiles it with the same MMAs"));
        }
        if wm > 2 * wn || wn > 2 * wm {
            return reject(format!(
                "warp tile {wm}x{wn} is skinnier than 2:1: a squarer warp grid reuses fragments better"
            ));
        }
        let (tm, tn) = self.tiles();
        let many_waves = tm * tn >= 4 * target.sm_count as u64;
        if many_waves && (self.bm < 64 || self.bn < 64) {
            return reject(format!(
                "block tile {}x{} on {} output tiles: a problem of many waves needs tiles of at least 64x64 to stay off the memory roof",
                self.bm,
                self.bn,
                tm * tn
            ));
        }
        let threads = self.threads();
        if threads > target.max_threads_per_block {
            return reject(format!(
                "{threads} threads per block exceed this GPU's limit of {}",
                target.max_threads_per_block
            ));
        }
        let acc_regs = self.acc_regs();
        if acc_regs > MAX_ACC_REGS {
            return reject(format!(
                "warp tile {}x{} needs {acc_regs} accumulator registers per thread; the limit is {MAX_ACC_REGS}",
                fmw * fm,
                fnw * fn_
            ));
        }
        let smem = self.smem_bytes();
        if self.min_blocks > 1 {
            let cap = self.register_cap(target);
            if cap < acc_regs + 40 {
                return reject(format!(
                    "min_blocks {}: {} threads per block leave {cap} registers per thread; the warp tile needs about {}",
                    self.min_blocks,
                    threads,
                    acc_regs + 40
                ));
            }
            // The driver reserves 1 KiB of shared memory per block.
            if self.min_blocks * (smem + 1024) > target.smem_per_sm || self.min_blocks * threads > 2048 {
                return reject(format!(
                    "min_blocks {}: {} blocks of {} KiB shared memory and {threads} threads do not fit on one SM",
                    self.min_blocks,
                    self.min_blocks,
                    smem.div_ceil(1024)
                ));
            }
            if self.blocks() <= target.sm_count as u64 {
                return reject(format!(
                    "min_blocks {} on a grid of {} blocks: a second block per SM only pays when the grid has more blocks than SMs",
                    self.min_blocks,
                    self.blocks()
                ));
            }
        }
        if smem > target.max_smem_per_block {
            return reject(format!(
                "block tile {}x{}x{} with {} stages needs {} KiB of shared memory; this GPU allows {} KiB per block",
                self.bm,
                self.bn,
                self.bk,
                self.stages,
                smem.div_ceil(1024),
                target.max_smem_per_block / 1024
            ));
        }
        let (ktiles, kt_split) = self.ktiles();
        if self.stages > 1 && !self.cp_async {
            return reject(format!("stages {} needs cp.async (sm_80+); this GPU is sm_{}", self.stages, target.arch));
        }
        if self.stages == 1 && self.cp_async && kt_split > 1 {
            return reject(format!(
                "stages 1 on a GPU with cp.async and {kt_split} k-tiles per split: stages 2 overlaps the same loads"
            ));
        }
        if self.stages > 1 && self.stages as u64 > kt_split {
            return reject(format!("stages {} exceeds the {kt_split} k-tiles each split runs", self.stages));
        }
        if self.stages > 4 && self.stages as u64 != kt_split {
            return reject(format!(
                "stages {} is only for putting a whole split in flight at once; each split here runs {kt_split} k-tiles",
                self.stages
            ));
        }
        if self.stages > 2 && self.stages as u64 != kt_split && kt_split < 2 * self.stages as u64 {
            return reject(format!(
                "stages {} on {kt_split} k-tiles per split: a ring deeper than half the loop spends it filling and draining (stages {kt_split} puts them all in flight)",
                self.stages
            ));
        }
        if self.split_k as u64 > ktiles {
            return reject(format!("split_k {} exceeds the {ktiles} k-tiles of K = {}", self.split_k, w.k));
        }
        if (self.split_k as u64 - 1) * kt_split >= ktiles {
            return reject(format!(
                "split_k {} leaves the last split without k-tiles ({ktiles} k-tiles, {kt_split} per split)",
                self.split_k
            ));
        }
        if self.split_k > 1 && tm * tn >= target.sm_count as u64 {
            return reject(format!(
                "split_k {} on {} output tiles: split-K is for grids with fewer output tiles than SMs ({})",
                self.split_k,
                tm * tn,
                target.sm_count
            ));
        }
        if self.cluster_reduce {
            if self.split_k == 1 {
                return reject("split_reduce cluster without split-K is the same kernel as workspace".to_string());
            }
            if target.arch < 90 {
                return reject(format!(
                    "split_reduce cluster needs thread-block clusters (sm_90+); this GPU is sm_{}",
                    target.arch
                ));
            }
            if self.split_k > 8 {
                return reject(format!(
                    "split_reduce cluster takes at most 8 splits (a portable cluster); split_k is {}",
                    self.split_k
                ));
            }
        }
        if self.split_k > 1 && tm * tn * self.split_k as u64 > 2 * target.sm_count as u64 {
            return reject(format!(
                "split_k {} makes {} blocks for {} SMs: splitting past two waves only adds reduction traffic",
                self.split_k,
                tm * tn * self.split_k as u64,
                target.sm_count
            ));
        }
        if self.swizzle > 1 && (tm <= self.swizzle as u64 || tn == 1 || tm * tn < 2 * target.sm_count as u64) {
            return reject(format!(
                "swizzle {} needs more than {} row tiles, more than one column tile and at least two waves (have {tm}x{tn} tiles)",
                self.swizzle, self.swizzle
            ));
        }
        let e = w.types.input.bytes();
        for (what, cols) in [
            ("A", if w.layout.a_k_contiguous() { self.bk } else { self.bm }),
            ("B", if w.layout.b_k_contiguous() { self.bk } else { self.bn }),
        ] {
            if !((cols + self.skew) * e).is_multiple_of(16) {
                return reject(format!(
                    "the {what} tile's row pitch of {} bytes is not a multiple of the 16 bytes WMMA needs",
                    (cols + self.skew) * e
                ));
            }
        }
        if self.skew == 0 {
            let padded = Plan { skew: 16 / e, ..self.clone() };
            // Padding can only hurt through occupancy, and occupancy only matters when the grid
            // has more blocks than the GPU has SMs.
            let occupancy_matters = self.blocks() > target.sm_count as u64;
            if padded.smem_bytes() <= target.max_smem_per_block
                && (!occupancy_matters || padded.blocks_per_sm(target) >= self.blocks_per_sm(target))
            {
                return reject(
                    "skew 0 while padded rows fit with the same occupancy: padding only removes bank conflicts"
                        .to_string(),
                );
            }
        }
        Ok(Resources { threads, smem_bytes: smem, blocks: self.blocks(), workspace_bytes: self.workspace_bytes() })
    }

    /// The kernel's identity: template, version, knobs and a digest of the workload key.
    pub fn name(&self) -> String {
        let t = &self.w.types;
        let key_digest = crate::short_digest(&Workload::Matmul(self.w).key());
        ident(&format!(
            "tt_wmma_gemm_v{}_{}{}{}_{}_b{}x{}x{}_w{}x{}x{}_{}_s{}_k{}{}_sw{}_p{}_o{}_{}",
            WmmaGemm.version(),
            t.input,
            t.accumulator,
            t.output,
            self.w.layout,
            self.bm,
            self.bn,
            self.bk,
            self.warps_m,
            self.warps_n,
            self.warps_k,
            self.frag.0,
            self.stages,
            self.split_k,
            if self.cluster_reduce { "c" } else { "" },
            self.swizzle,
            u32::from(self.skew > 0),
            self.min_blocks,
            key_digest
        ))
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let w = &self.w;
        let t = &w.types;
        let name = self.name();
        let epi = if t.output.is_int() { "int" } else { "float" };
        let scalar = |v: f64| {
            if t.output.is_int() { Scalar::Int(v as i64) } else { Scalar::Float(v) }
        };
        let mut h = Header::default();
        h.comment(format!("tensortune wmma_gemm v{}: {name}", WmmaGemm.version()))
            .comment(format!("workload: {}", Workload::Matmul(*w).key()))
            .define("KERNEL_NAME", &name)
            .define(
                "TT_CLUSTER_ATTR",
                if self.cluster_reduce { format!("__cluster_dims__(1, 1, {})", self.split_k) } else { String::new() },
            )
            .typedef("T_IN", t.input.cuda())
            .typedef("T_ACC", t.accumulator.cuda())
            .typedef("T_OUT", t.output.cuda())
            .typedef("T_EPI", epi);
        h.int("M", w.m as i64)
            .int("N", w.n as i64)
            .int("K", w.k as i64)
            .flag("A_K_CONTIG", w.layout.a_k_contiguous())
            .flag("B_K_CONTIG", w.layout.b_k_contiguous())
            .cfg_type("A_FRAG_LAYOUT", if w.layout.a_k_contiguous() { "wmma::row_major" } else { "wmma::col_major" })
            .cfg_type("B_FRAG_LAYOUT", if w.layout.b_k_contiguous() { "wmma::col_major" } else { "wmma::row_major" })
            .int("BM", self.bm as i64)
            .int("BN", self.bn as i64)
            .int("BK", self.bk as i64)
            .int("WARPS_M", self.warps_m as i64)
            .int("WARPS_N", self.warps_n as i64)
            .int("WARPS_K", self.warps_k as i64)
            .int("FM", self.frag.1 as i64)
            .int("FN", self.frag.2 as i64)
            .int("FK", self.frag.3 as i64)
            .int("STAGES", self.stages as i64)
            .int("SKEW", self.skew as i64)
            .int("SPLIT_K", self.split_k as i64)
            .flag("REDUCE_CLUSTER", self.cluster_reduce)
            .int("SWIZZLE", self.swizzle as i64)
            .int("MIN_BLOCKS", self.min_blocks as i64)
            .int("VEC_A", self.vec_a as i64)
            .int("VEC_B", self.vec_b as i64)
            .int("VEC_D", self.vec_d as i64)
            .flag("CP_ASYNC", self.cp_async)
            .flag("READ_C", w.reads_c())
            .value("T_EPI", "ALPHA", scalar(w.alpha))
            .value("T_EPI", "BETA", scalar(w.beta));
        h.source(&format!("ns_{name}"), &[crate::cuda::COMMON, BODY])
    }
}

/// The widest power-of-two vector (16 bytes at most, one element at least) dividing every size.
fn widest_vec(elem: u32, sizes: &[u64]) -> u32 {
    [16u32, 8, 4, 2, 1].into_iter().find(|v| *v >= elem && sizes.iter().all(|s| s % *v as u64 == 0)).unwrap_or(elem)
}

fn matmul(workload: &Workload) -> Result<&Matmul> {
    match workload {
        Workload::Matmul(m) => Ok(m),
        other => Err(Error::Unsupported { template: "wmma_gemm", what: format!("{} workloads", other.op().name()) }),
    }
}

impl Template for WmmaGemm {
    fn name(&self) -> &'static str {
        "wmma_gemm"
    }

    fn version(&self) -> u32 {
        6
    }

    fn op(&self) -> Op {
        Op::Matmul
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        let w = matmul(workload)?;
        w.validate()?;
        let (min_arch, what) = match w.types.input {
            DType::F16 => (70, "f16"),
            DType::I8 => (72, "i8"),
            DType::Bf16 => (80, "bf16"),
            other => {
                return Err(Error::invalid("input", format!("{other} is not a WMMA input type")));
            }
        };
        if target.arch < min_arch {
            return Err(Error::Unsupported {
                template: "wmma_gemm",
                what: format!("{what} tensor cores on sm_{} (needs sm_{min_arch} or newer)", target.arch),
            });
        }
        let k_align = 16 / w.types.input.bytes() as u64;
        if w.k % k_align != 0 {
            return Err(Error::invalid(
                "k",
                format!(
                    "{} must be a multiple of {k_align} for {} inputs (wmma_gemm moves K in 16-byte vectors)",
                    w.k, w.types.input
                ),
            ));
        }
        Ok(())
    }

    fn space(&self) -> Space {
        let ints = |name, v: &[u32]| Knob::ints(name, &v.iter().map(|x| *x as i64).collect::<Vec<_>>());
        Space {
            knobs: vec![
                ints("block_m", BLOCK_M),
                ints("block_n", BLOCK_N),
                ints("block_k", BLOCK_K),
                ints("warps_m", WARPS_M),
                ints("warps_n", WARPS_N),
                ints("warps_k", WARPS_K),
                Knob::names("frag", &FRAGS.iter().map(|f| f.0).collect::<Vec<_>>()),
                ints("stages", STAGES),
                ints("skew", SKEW),
                ints("split_k", SPLIT_K),
                Knob::names("split_reduce", SPLIT_REDUCE),
                ints("swizzle", SWIZZLE),
                ints("min_blocks", MIN_BLOCKS),
            ],
        }
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let w = matmul(workload)?;
        let len: u64 = DOMAIN_SIZES.iter().map(|n| *n as u64).product();
        Ok((0..len).filter(|i| Plan::at(w, *i, target).check(target).is_ok()).collect())
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.space().index_of(config)?;
        Plan::new(matmul(workload)?, config, target)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        // The index check rejects unknown or missing knobs before anything is generated.
        self.space().index_of(config)?;
        let plan = Plan::new(matmul(workload)?, config, target)?;
        let res = plan.check(target)?;
        let (tm, tn) = plan.tiles();
        Ok(KernelSpec {
            name: plan.name(),
            source: plan.source(),
            entry: plan.name(),
            grid: [(tm * tn) as u32, 1, plan.split_k],
            block: [res.threads, 1, 1],
            smem_bytes: res.smem_bytes,
            workspace_bytes: res.workspace_bytes,
            args: vec![Arg::A, Arg::B, Arg::C, Arg::D, Arg::Workspace],
        })
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        let p = Plan::new(matmul(workload)?, config, target)?;
        let (tm, tn) = p.tiles();
        let (_, kt_split) = p.ktiles();
        let (fm, fn_) = p.frags_per_warp();
        let occ = p.blocks_per_sm(target);
        let waves = p.blocks() as f64 / (target.sm_count * occ) as f64;
        let frag_index = FRAGS.iter().position(|f| f.0 == p.frag.0).unwrap_or(0) as f64;
        Ok(vec![
            ("log2_block_m", (p.bm as f64).log2()),
            ("log2_block_n", (p.bn as f64).log2()),
            ("log2_block_k", (p.bk as f64).log2()),
            ("warps_m", p.warps_m as f64),
            ("warps_n", p.warps_n as f64),
            ("warps_k", p.warps_k as f64),
            ("frag", frag_index),
            ("stages", p.stages as f64),
            ("skew", (p.skew > 0) as u8 as f64),
            ("log2_split_k", (p.split_k as f64).log2()),
            ("cluster_reduce", p.cluster_reduce as u8 as f64),
            ("log2_swizzle", (p.swizzle as f64).log2()),
            ("min_blocks", p.min_blocks as f64),
            ("threads", p.threads() as f64),
            ("smem_kib", p.smem_bytes() as f64 / 1024.0),
            ("acc_regs", p.acc_regs() as f64),
            ("warp_reuse", (fm * fn_) as f64 / (fm + fn_) as f64),
            ("block_intensity", (p.bm * p.bn) as f64 / (p.bm + p.bn) as f64),
            ("blocks_per_sm", occ as f64),
            ("waves", waves),
            ("wave_efficiency", waves / waves.ceil().max(1.0)),
            ("log2_tiles", ((tm * tn) as f64).log2()),
            ("ktiles_per_split", kt_split as f64),
            ("vec_a", p.vec_a as f64),
            ("vec_b", p.vec_b as f64),
            ("model_log_us", model(&p, target).ln()),
        ])
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        let p = Plan::new(matmul(workload)?, config, target)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

/// Analytic time of a plan in microseconds: the slower of tensor-core work (wave-quantised, scaled
/// by how well the warp tile, pipeline and padding keep the tensor cores fed) and memory traffic,
/// plus fixed launch and split-K costs. Crude on purpose: it ranks configs plausibly for `sim`.
fn model(p: &Plan, target: &Target) -> f64 {
    let (fm, fn_) = p.frags_per_warp();
    let reuse = (fm * fn_) as f64 / (fm + fn_) as f64;
    let mut eff = reuse / (reuse + 0.6);
    eff *= match p.stages {
        1 => 0.55,
        2 => 0.8,
        3 => 0.93,
        _ => 0.95,
    };
    if p.skew == 0 {
        eff *= 0.8;
    }
    let occ = p.blocks_per_sm(target);
    let warps_per_sm = (occ * p.warps_m * p.warps_n * p.warps_k) as f64;
    eff *= (warps_per_sm / 8.0).min(1.0).sqrt();
    // WMMA (HMMA) peak per SM, FLOP/us: ~650 TFLOP/s over 132 SMs for 16-bit, twice that for i8.
    let per_sm = 650e6 / 132.0 * if p.w.types.input == DType::I8 { 2.0 } else { 1.0 };
    let (_, kt_split) = p.ktiles();
    let block_flops = 2.0 * (p.bm * p.bn * p.bk) as f64 * kt_split as f64 / p.warps_k as f64;
    let concurrent = (target.sm_count * occ) as f64;
    let waves = (p.blocks() as f64 / concurrent).ceil();
    let compute = waves * block_flops * occ as f64 / (per_sm * eff);
    let e = p.w.types.input.bytes() as f64;
    let (tm, tn) = p.tiles();
    let l2_reuse = if p.swizzle > 1 { 1.6 } else { 1.0 };
    let bytes = (tn as f64 * (p.w.m * p.w.k) as f64 + tm as f64 * (p.w.k * p.w.n) as f64) * e / l2_reuse
        + (p.w.m * p.w.n) as f64 * p.w.types.output.bytes() as f64 * (1.0 + 2.0 * (p.split_k - 1) as f64);
    let memory = bytes / 3.0e6;
    let split = match (p.split_k, p.cluster_reduce) {
        (1, _) => 0.0,
        (_, true) => 0.25,
        _ => 0.6,
    };
    // A block's k-loop is a chain of dependent global loads: each k-tile waits for its data, with
    // `stages` tiles in flight, so a block needs at least one load latency per `stages` k-tiles.
    let in_flight = p.stages.min(kt_split as u32).max(1) as f64;
    let latency = waves * LOAD_LATENCY_US * (1.0 + kt_split as f64 / in_flight);
    compute.max(memory).max(latency) + 1.2 + split
}

/// Latency of a global load that misses L1, in microseconds (DRAM or a busy L2 on H100/H200).
const LOAD_LATENCY_US: f64 = 0.5;

/// Analytic time of the vendor library (the `sim` device's cuBLAS): 80% of the tensor-core peak
/// or of memory bandwidth, whichever binds, plus launch cost.
pub fn vendor_model_us(w: &Matmul) -> f64 {
    let per_gpu = 650e6 * 1.3 * if w.types.input == DType::I8 { 2.0 } else { 1.0 };
    let e = w.types.input.bytes() as f64;
    let bytes = (w.m * w.k + w.k * w.n) as f64 * e + (w.m * w.n) as f64 * w.types.output.bytes() as f64;
    (w.flops() / (per_gpu * 0.8)).max(bytes / 3.0e6) + 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::valid_configs;
    use crate::workload::{Layout, Types};

    fn mm(m: u64, n: u64, k: u64, layout: Layout, input: DType) -> Workload {
        Workload::Matmul(Matmul::new(m, n, k, layout, Types::default_for(input).unwrap()).unwrap())
    }

    fn cfg(pairs: &[(&str, i64)], frag: &str) -> Config {
        let mut c = WmmaGemm.space().config(0).unwrap();
        for (k, v) in pairs {
            c.0.insert((*k).into(), (*v).into());
        }
        c.0.insert("frag".into(), frag.into());
        c
    }

    #[test]
    fn first_shape_has_a_large_valid_space() {
        let w = mm(512, 64, 512, Layout::Nn, DType::F16);
        let valid = valid_configs(&WmmaGemm, &w, &Target::sm90()).unwrap();
        assert!(valid.len() >= 100, "only {} valid configs", valid.len());
        for (i, c) in valid.iter().take(50) {
            assert_eq!(WmmaGemm.space().index_of(c).unwrap(), *i);
        }
    }

    #[test]
    fn the_drift_reference_is_valid_everywhere() {
        let (w, c) = crate::template::drift_reference();
        for t in [Target::sm80(), Target::sm90(), Target::sim()] {
            WmmaGemm.check(&w, &c, &t).unwrap();
        }
    }

    #[test]
    fn fast_enumeration_matches_the_checked_walk() {
        let w = mm(200, 48, 96, Layout::Tn, DType::I8);
        let t = Target::sm90();
        let space = WmmaGemm.space();
        let fast: std::collections::HashSet<u64> = WmmaGemm.valid_indices(&w, &t).unwrap().into_iter().collect();
        assert!(!fast.is_empty());
        // Every 7th point (coprime with every domain size) through the checked path.
        for i in (0..space.len()).step_by(7) {
            let checked = WmmaGemm.check(&w, &space.config(i).unwrap(), &t).is_ok();
            assert_eq!(checked, fast.contains(&i), "index {i}");
        }
    }

    #[test]
    fn shared_memory_limit_is_enforced_with_the_reason() {
        let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
        let c = cfg(
            &[
                ("block_m", 256),
                ("block_n", 128),
                ("block_k", 64),
                ("warps_m", 4),
                ("warps_n", 2),
                ("stages", 4),
                ("skew", 1),
            ],
            "m16n16k16",
        );
        // 4 stages of (64 x 264 + 128 x 72) halves: 204 KiB, within an H100's 227 KiB, not an A100's 163 KiB.
        let r = WmmaGemm.check(&w, &c, &Target::sm90()).unwrap();
        assert_eq!(r.smem_bytes, 4 * (64 * 264 + 128 * 72) * 2);
        let e = WmmaGemm.check(&w, &c, &Target::sm80()).unwrap_err().to_string();
        assert!(e.contains("shared memory") && e.contains("163 KiB"), "{e}");
    }

    #[test]
    fn register_and_thread_rules() {
        let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
        let c = cfg(&[("block_m", 256), ("block_n", 256), ("warps_m", 1), ("warps_n", 1)], "m16n16k16");
        let e = WmmaGemm.check(&w, &c, &Target::sm90()).unwrap_err().to_string();
        assert!(e.contains("accumulator registers"), "{e}");
        let c = cfg(&[("block_m", 128), ("block_n", 128), ("warps_m", 4), ("warps_n", 4)], "m16n16k16");
        let e = WmmaGemm.check(&w, &c, &Target::sm90()).unwrap_err().to_string();
        assert!(e.contains("16 warps per block"), "{e}");
        let mut small = Target::sm90();
        small.max_threads_per_block = 128;
        let c = cfg(
            &[("block_m", 128), ("block_n", 128), ("warps_m", 2), ("warps_n", 4), ("stages", 3), ("skew", 1)],
            "m16n16k16",
        );
        WmmaGemm.check(&w, &c, &Target::sm90()).unwrap();
        let e = WmmaGemm.check(&w, &c, &small).unwrap_err().to_string();
        assert!(e.contains("256 threads"), "{e}");
    }

    #[test]
    fn divisibility_and_pointless_knobs_are_rejected() {
        let w = mm(512, 64, 512, Layout::Nn, DType::F16);
        let t = Target::sm90();
        let e = WmmaGemm.check(&w, &cfg(&[("block_m", 16), ("warps_m", 2)], "m16n16k16"), &t).unwrap_err().to_string();
        assert!(e.contains("not a multiple of warps_m"), "{e}");
        let e = WmmaGemm.check(&w, &cfg(&[("block_n", 128)], "m16n16k16"), &t).unwrap_err().to_string();
        assert!(e.contains("wasted work"), "{e}");
        let e = WmmaGemm.check(&w, &cfg(&[("split_k", 16), ("block_k", 64)], "m16n16k16"), &t).unwrap_err().to_string();
        assert!(e.contains("split_k 16 exceeds"), "{e}");
        let e = WmmaGemm
            .check(&w, &cfg(&[("stages", 4), ("block_k", 64), ("split_k", 4)], "m16n16k16"), &t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("stages 4 exceeds"), "{e}");
        let mut volta = Target::sm80();
        volta.arch = 70;
        let e = WmmaGemm.check(&w, &cfg(&[("stages", 2)], "m16n16k16"), &volta).unwrap_err().to_string();
        assert!(e.contains("cp.async"), "{e}");
    }

    #[test]
    fn unsupported_workloads_name_the_field() {
        let t = Target::sm90();
        let w = mm(64, 64, 20, Layout::Nn, DType::F16);
        let e = WmmaGemm.supports(&w, &t).unwrap_err();
        assert_eq!(e.field(), Some("k"));
        let w = mm(64, 64, 24, Layout::Tn, DType::I8);
        assert_eq!(WmmaGemm.supports(&w, &t).unwrap_err().field(), Some("k"));
        let mut turing = Target::sm80();
        turing.arch = 75;
        let w = mm(64, 64, 64, Layout::Nn, DType::Bf16);
        assert!(WmmaGemm.supports(&w, &turing).unwrap_err().to_string().contains("sm_80"));
    }

    #[test]
    fn vectors_follow_alignment() {
        let t = Target::sm90();
        let c = cfg(&[("block_m", 64), ("block_n", 64), ("block_k", 32)], "m16n16k16");
        let Workload::Matmul(w) = mm(1000, 1001, 64, Layout::Nn, DType::F16) else { unreachable!() };
        let p = Plan::new(&w, &c, &t).unwrap();
        // A is M-contiguous with M = 1000 halves = 2000 bytes: 16-byte vectors fit.
        assert_eq!((p.vec_a, p.vec_b, p.vec_d), (16, 16, 16));
        let Workload::Matmul(w) = mm(1001, 1000, 64, Layout::Nn, DType::F16) else { unreachable!() };
        let p = Plan::new(&w, &c, &t).unwrap();
        // M = 1001: columns of A and D start at odd element offsets.
        assert_eq!((p.vec_a, p.vec_d), (2, 4));
    }

    #[test]
    fn model_prefers_sensible_configs() {
        let w = mm(4096, 4096, 4096, Layout::Nn, DType::F16);
        let t = Target::sim();
        let valid = valid_configs(&WmmaGemm, &w, &t).unwrap();
        let mut timed: Vec<(f64, &Config)> =
            valid.iter().map(|(_, c)| (WmmaGemm.model_us(&w, c, &t).unwrap(), c)).collect();
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (best, config) = timed[0];
        let worst = timed[timed.len() - 1].0;
        assert!(best * 2.0 < worst, "{best} vs {worst}");
        assert!(config.int("block_m").unwrap() * config.int("block_n").unwrap() >= 128 * 128, "{config}");
        let feats = WmmaGemm.features(&w, config, &t).unwrap();
        assert!(feats.iter().all(|(_, v)| v.is_finite()));
    }
}
