//! The block tiling the WMMA templates share (`wmma_gemm`, `wmma_conv2d`): a GEMM view of the
//! workload, the tile, warp, pipeline and split-K knobs, what they cost on a device, the validity
//! rules that follow, and the tensor-core part of the analytic model. Each template wraps a
//! [`Tiling`] in its own plan with its own knobs and rules; `cuda/wmma_core.cu` is the CUDA side
//! of the same split, with holes for what a template loads and how.

use crate::cuda::{Header, Scalar};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::target::Target;
use crate::template::{Arg, KernelSpec, Launch, Resources};
use crate::workload::Types;

/// Fragment shapes WMMA offers for 16-bit and 8-bit inputs: (name, m, n, k).
pub const FRAGS: &[(&str, u32, u32, u32)] =
    &[("m16n16k16", 16, 16, 16), ("m32n8k16", 32, 8, 16), ("m8n32k16", 8, 32, 16)];

/// A launch's fixed cost in the analytic model, microseconds.
pub const LAUNCH_US: f64 = 1.2;

/// Latency of a global load that misses L1, in microseconds (DRAM or a busy L2 on H100/H200).
const LOAD_LATENCY_US: f64 = 0.5;

/// Accumulator registers per thread above which a warp tile would spill.
const MAX_ACC_REGS: u32 = 128;
/// Warps per block: more would need warp tiles too small to reuse their fragments.
const MAX_WARPS: u32 = 8;

/// The GEMM a template computes: D (M x N) = A (M x K) * B (K x N).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmView {
    /// Rows of A and D.
    pub m: u64,
    /// Columns of B and D.
    pub n: u64,
    /// Reduction length.
    pub k: u64,
    /// Element types.
    pub types: Types,
    /// Whether A is stored with K contiguous (its tiles are then staged [m][k]).
    pub a_k_contig: bool,
    /// Whether B is stored with K contiguous (its tiles are then staged [n][k]).
    pub b_k_contig: bool,
    /// Whether D(m, n) lives at m * N + n (conv's NPQK output) rather than at n * M + m
    /// (column-major, wmma_gemm's). The kernel always writes a column-major D, so a row-major one
    /// is computed transposed: D^T = B^T A^T, a GEMM of N x M whose A is this view's B. The knobs
    /// stay in this view's terms; only the generated header swaps the two sides.
    pub transposed: bool,
    /// How messages name M, N and K, e.g. `["M", "N", "K"]`.
    pub axes: [&'static str; 3],
}

/// The knobs every WMMA template has, for one GEMM, and everything derived from them.
#[derive(Clone, Debug)]
pub struct Tiling {
    /// The GEMM.
    pub g: GemmView,
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
    /// Blocks per SM the register allocation must allow (`__launch_bounds__`'s second argument).
    pub min_blocks: u32,
    /// Whether loads use cp.async.
    pub cp_async: bool,
    /// Shared memory a template needs beyond the ring and the epilogue staging, bytes.
    pub extra_smem: u32,
}

impl Tiling {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.warps_m * self.warps_n * self.warps_k * 32
    }

    /// Output tiles along M and N.
    pub fn tiles(&self) -> (u64, u64) {
        (self.g.m.div_ceil(self.bm as u64), self.g.n.div_ceil(self.bn as u64))
    }

    /// K tiles in all, and per split.
    pub fn ktiles(&self) -> (u64, u64) {
        let kt = self.g.k.div_ceil(self.bk as u64);
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
        fm * fn_ * elems * self.g.types.accumulator.bytes() / 4
    }

    /// Bytes of one pipeline stage's A and B tiles.
    pub fn stage_bytes(&self) -> u32 {
        let e = self.g.types.input.bytes();
        let (a_rows, a_cols) = if self.g.a_k_contig { (self.bm, self.bk) } else { (self.bk, self.bm) };
        let (b_rows, b_cols) = if self.g.b_k_contig { (self.bn, self.bk) } else { (self.bk, self.bn) };
        (a_rows * (a_cols + self.skew) + b_rows * (b_cols + self.skew)) * e
    }

    /// Bytes of the epilogue's accumulator staging: a slice per K-warp, columns along D's
    /// contiguous dimension padded by 16 bytes.
    pub fn staging_bytes(&self) -> u32 {
        let acc = self.g.types.accumulator.bytes();
        let (lines, line) = if self.g.transposed { (self.bm, self.bn) } else { (self.bn, self.bm) };
        self.warps_k * lines * (line + 16 / acc) * acc
    }

    /// Dynamic shared memory: the pipeline ring (with the template's extra after it, which the K
    /// loop uses) or the epilogue staging, which reuses both once the loop is done, whichever is
    /// larger.
    pub fn smem_bytes(&self) -> u32 {
        (self.stages * self.stage_bytes() + self.extra_smem).max(self.staging_bytes())
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

    /// What a valid config uses.
    pub fn resources(&self) -> Resources {
        Resources {
            threads: self.threads(),
            smem_bytes: self.smem_bytes(),
            blocks: self.blocks(),
            workspace_bytes: self.workspace_bytes(),
        }
    }

    /// Rules on the block tile's shape: divisibility by the warp grid, wasted work, warp count.
    pub fn check_shape(&self) -> Result<()> {
        let (fname, fm, fn_, fk) = self.frag;
        let g = &self.g;
        if !self.bm.is_multiple_of(self.warps_m * fm) {
            return reject(reason!(format!(
                "block_m {} is not a multiple of warps_m {} x fragment m {fm} ({fname})",
                self.bm, self.warps_m
            )));
        }
        if !self.bn.is_multiple_of(self.warps_n * fn_) {
            return reject(reason!(format!(
                "block_n {} is not a multiple of warps_n {} x fragment n {fn_} ({fname})",
                self.bn, self.warps_n
            )));
        }
        if !self.bk.is_multiple_of(fk * self.warps_k) {
            return reject(reason!(format!(
                "block_k {} has {} sixteen-deep steps, too few to share among warps_k {}",
                self.bk,
                self.bk / fk,
                self.warps_k
            )));
        }
        for (name, tile, dim, axis) in [("block_m", self.bm, g.m, g.axes[0]), ("block_n", self.bn, g.n, g.axes[1])] {
            if tile > 16 && dim.div_ceil(tile as u64 / 2) == dim.div_ceil(tile as u64) {
                return reject(reason!(format!(
                    "{name} {tile} covers {axis} = {dim} no better than {name} {}: wasted work",
                    tile / 2
                )));
            }
        }
        let warps = self.warps_m * self.warps_n * self.warps_k;
        if warps > MAX_WARPS {
            return reject(reason!(format!("{warps} warps per block; the template uses at most {MAX_WARPS}")));
        }
        Ok(())
    }

    /// The rules that depend on the tile knobs alone ([`Tiling::check_shape`], then
    /// [`Tiling::check_warp_tile`]): a tile failing them fails whatever the other knobs are, so a
    /// walk over a space skips the rest of its configs.
    pub fn check_tile(&self, target: &Target) -> Result<()> {
        self.check_shape()?;
        self.check_warp_tile(target)
    }

    /// Sliced K (warps_k > 1) is for grids too small to fill the GPU twice.
    pub fn check_sliced_k(&self, target: &Target) -> Result<()> {
        if self.warps_k > 1 && self.blocks() >= 2 * target.sm_count as u64 {
            return reject(reason!(format!(
                "warps_k {} on a grid of {} blocks: sliced K is for grids too small to fill the {} SMs twice",
                self.warps_k,
                self.blocks(),
                target.sm_count
            )));
        }
        Ok(())
    }

    /// Rules on the warp tile: fragment reuse, fragment shape, aspect, tile size for large
    /// grids, threads and accumulator registers. Like [`Tiling::check_shape`], they depend on the
    /// tile knobs alone (not on stages, split-K or min_blocks).
    pub fn check_warp_tile(&self, target: &Target) -> Result<()> {
        let (fname, fm, fn_, _) = self.frag;
        let warps = self.warps_m * self.warps_n;
        let (fmw, fnw) = self.frags_per_warp();
        if warps >= 4 && fmw * fnw < 2 {
            return reject(reason!(format!(
                "{warps} warps each holding one {fm}x{fn_} fragment: a warp tile this small re-reads shared memory for every MMA"
            )));
        }
        let (wm, wn) = (self.bm / self.warps_m, self.bn / self.warps_n);
        // m32n8k16 and m8n32k16 issue the same MMAs as m16n16k16 (the hardware's m16n8k16); they
        // only pay where m16n16k16 cannot tile the warp (8-wide or 8-tall warp tiles). (TF32's
        // m16n16k8 is square too.)
        if fm != fn_ && wm % 16 == 0 && wn % 16 == 0 {
            return reject(reason!(format!("{fname} on a {wm}x{wn} warp tile: m16n16k16 tiles it with the same MMAs")));
        }
        if wm > 2 * wn || wn > 2 * wm {
            return reject(reason!(format!(
                "warp tile {wm}x{wn} is skinnier than 2:1: a squarer warp grid reuses fragments better"
            )));
        }
        let (tm, tn) = self.tiles();
        let many_waves = tm * tn >= 4 * target.sm_count as u64;
        if many_waves && (self.bm < 64 || self.bn < 64) {
            return reject(reason!(format!(
                "block tile {}x{} on {} output tiles: a problem of many waves needs tiles of at least 64x64 to stay off the memory roof",
                self.bm,
                self.bn,
                tm * tn
            )));
        }
        let threads = self.threads();
        if threads > target.max_threads_per_block {
            return reject(reason!(format!(
                "{threads} threads per block exceed this GPU's limit of {}",
                target.max_threads_per_block
            )));
        }
        let acc_regs = self.acc_regs();
        if acc_regs > MAX_ACC_REGS {
            return reject(reason!(format!(
                "warp tile {}x{} needs {acc_regs} accumulator registers per thread; the limit is {MAX_ACC_REGS}",
                fmw * fm,
                fnw * fn_
            )));
        }
        Ok(())
    }

    /// Rules on what the block uses and how K is cut: min_blocks, shared memory, the pipeline
    /// depth and split-K with its reduction.
    pub fn check_resources(&self, target: &Target) -> Result<()> {
        let g = &self.g;
        let threads = self.threads();
        let acc_regs = self.acc_regs();
        let smem = self.smem_bytes();
        if self.min_blocks > 1 {
            let cap = self.register_cap(target);
            if cap < acc_regs + 40 {
                return reject(reason!(format!(
                    "min_blocks {}: {} threads per block leave {cap} registers per thread; the warp tile needs about {}",
                    self.min_blocks,
                    threads,
                    acc_regs + 40
                )));
            }
            // The driver reserves 1 KiB of shared memory per block.
            if self.min_blocks * (smem + 1024) > target.smem_per_sm || self.min_blocks * threads > 2048 {
                return reject(reason!(format!(
                    "min_blocks {}: {} blocks of {} KiB shared memory and {threads} threads do not fit on one SM",
                    self.min_blocks,
                    self.min_blocks,
                    smem.div_ceil(1024)
                )));
            }
            if self.blocks() <= target.sm_count as u64 {
                return reject(reason!(format!(
                    "min_blocks {} on a grid of {} blocks: a second block per SM only pays when the grid has more blocks than SMs",
                    self.min_blocks,
                    self.blocks()
                )));
            }
        }
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
        let (ktiles, kt_split) = self.ktiles();
        if self.stages > 1 && !self.cp_async {
            return reject(reason!(format!(
                "stages {} needs cp.async (sm_80+); this GPU is sm_{}",
                self.stages, target.arch
            )));
        }
        if self.stages == 1 && self.cp_async && kt_split > 1 {
            return reject(reason!(format!(
                "stages 1 on a GPU with cp.async and {kt_split} k-tiles per split: stages 2 overlaps the same loads"
            )));
        }
        if self.stages > 1 && self.stages as u64 > kt_split {
            return reject(reason!(format!("stages {} exceeds the {kt_split} k-tiles each split runs", self.stages)));
        }
        if self.stages > 4 && self.stages as u64 != kt_split {
            return reject(reason!(format!(
                "stages {} is only for putting a whole split in flight at once; each split here runs {kt_split} k-tiles",
                self.stages
            )));
        }
        if self.stages > 2 && self.stages as u64 != kt_split && kt_split < 2 * self.stages as u64 {
            return reject(reason!(format!(
                "stages {} on {kt_split} k-tiles per split: a ring deeper than half the loop spends it filling and draining (stages {kt_split} puts them all in flight)",
                self.stages
            )));
        }
        if self.split_k as u64 > ktiles {
            return reject(reason!(format!(
                "split_k {} exceeds the {ktiles} k-tiles of {} = {}",
                self.split_k, g.axes[2], g.k
            )));
        }
        if (self.split_k as u64 - 1) * kt_split >= ktiles {
            return reject(reason!(format!(
                "split_k {} leaves the last split without k-tiles ({ktiles} k-tiles, {kt_split} per split)",
                self.split_k
            )));
        }
        let (tm, tn) = self.tiles();
        if self.split_k > 1 && tm * tn >= target.sm_count as u64 {
            return reject(reason!(format!(
                "split_k {} on {} output tiles: split-K is for grids with fewer output tiles than SMs ({})",
                self.split_k,
                tm * tn,
                target.sm_count
            )));
        }
        if self.cluster_reduce {
            if self.split_k == 1 {
                return reject("split_reduce cluster without split-K is the same kernel as workspace".to_string());
            }
            if target.arch < 90 {
                return reject(reason!(format!(
                    "split_reduce cluster needs thread-block clusters (sm_90+); this GPU is sm_{}",
                    target.arch
                )));
            }
            if self.split_k > 8 {
                return reject(reason!(format!(
                    "split_reduce cluster takes at most 8 splits (a portable cluster); split_k is {}",
                    self.split_k
                )));
            }
        }
        if self.split_k > 1 && tm * tn * self.split_k as u64 > 2 * target.sm_count as u64 {
            return reject(reason!(format!(
                "split_k {} makes {} blocks for {} SMs: splitting past two waves only adds reduction traffic",
                self.split_k,
                tm * tn * self.split_k as u64,
                target.sm_count
            )));
        }
        Ok(())
    }

    /// Rules on the staged tiles' rows: the 16-byte pitch WMMA needs, and padding (skew) wherever
    /// it costs no occupancy.
    pub fn check_layout(&self, target: &Target) -> Result<()> {
        let e = self.g.types.input.bytes();
        for (what, cols) in [
            ("A", if self.g.a_k_contig { self.bk } else { self.bm }),
            ("B", if self.g.b_k_contig { self.bk } else { self.bn }),
        ] {
            if !((cols + self.skew) * e).is_multiple_of(16) {
                return reject(reason!(format!(
                    "the {what} tile's row pitch of {} bytes is not a multiple of the 16 bytes WMMA needs",
                    (cols + self.skew) * e
                )));
            }
        }
        if self.skew == 0 {
            let padded = Tiling { skew: 16 / e, ..self.clone() };
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
        Ok(())
    }

    /// Tensor-core time in microseconds: wave-quantised block work at the WMMA peak, scaled by
    /// how well the warp tile, pipeline and padding keep the tensor cores fed, times `efficiency`
    /// (what the template's own knobs cost; 1 for none).
    pub fn compute_us(&self, target: &Target, efficiency: f64) -> f64 {
        let occ = self.blocks_per_sm(target);
        let warps_per_sm = occ * self.warps_m * self.warps_n * self.warps_k;
        let eff = feed_efficiency(self.frags_per_warp(), self.stages, self.skew != 0, warps_per_sm) * efficiency;
        // WMMA (HMMA) peak per SM, FLOP/us: ~650 TFLOP/s over 132 SMs for 16-bit, twice that for
        // i8, half for TF32.
        let rate = match self.g.types.input {
            DType::I8 => 2.0,
            DType::Tf32 => 0.5,
            _ => 1.0,
        };
        let per_sm = 650e6 / 132.0 * rate;
        let (_, kt_split) = self.ktiles();
        let block_flops = 2.0 * (self.bm * self.bn * self.bk) as f64 * kt_split as f64 / self.warps_k as f64;
        let concurrent = (target.sm_count * occ) as f64;
        let waves = (self.blocks() as f64 / concurrent).ceil();
        waves * block_flops * occ as f64 / (per_sm * eff)
    }

    /// The load-latency floor in microseconds: a block's k-loop is a chain of dependent global
    /// loads; each k-tile waits for its data, with `stages` tiles in flight, so a block needs at
    /// least one load latency per `stages` k-tiles (small shapes are latency-bound).
    pub fn latency_us(&self, target: &Target) -> f64 {
        let occ = self.blocks_per_sm(target);
        let concurrent = (target.sm_count * occ) as f64;
        let waves = (self.blocks() as f64 / concurrent).ceil();
        let (_, kt_split) = self.ktiles();
        let in_flight = self.stages.min(kt_split as u32).max(1) as f64;
        waves * LOAD_LATENCY_US * (1.0 + kt_split as f64 / in_flight)
    }

    /// The time of a kernel bound by tensor-core work, memory traffic and load latency at once,
    /// in microseconds: a smooth maximum (the 4-norm) of the three. A kernel near two limits runs
    /// slower than either alone (they overlap imperfectly), and among configs one limit ties, the
    /// others still rank them.
    pub fn bound_us(compute: f64, memory: f64, latency: f64) -> f64 {
        (compute.powi(4) + memory.powi(4) + latency.powi(4)).powf(0.25)
    }

    /// Bytes of D written, with split-K's partial tiles written and read once more each.
    pub fn output_traffic(&self) -> f64 {
        (self.g.m * self.g.n) as f64 * self.g.types.output.bytes() as f64 * (1.0 + 2.0 * (self.split_k - 1) as f64)
    }

    /// The split-K reduction's fixed cost in microseconds (launch is [`LAUNCH_US`]).
    pub fn split_us(&self) -> f64 {
        match (self.split_k, self.cluster_reduce) {
            (1, _) => 0.0,
            (_, true) => 0.25,
            _ => 0.6,
        }
    }

    /// Cost-model features of the tiling, in a fixed order: the knobs, then what they imply on
    /// `target`. Templates add their own knobs after these (wmma_gemm puts `log2_swizzle` before
    /// `min_blocks`, where it always was).
    pub fn features(&self, target: &Target) -> Vec<(&'static str, f64)> {
        let (tm, tn) = self.tiles();
        let (_, kt_split) = self.ktiles();
        let (fm, fn_) = self.frags_per_warp();
        let occ = self.blocks_per_sm(target);
        let waves = self.blocks() as f64 / (target.sm_count * occ) as f64;
        let frag_index = FRAGS.iter().position(|f| f.0 == self.frag.0).unwrap_or(0) as f64;
        vec![
            ("log2_block_m", (self.bm as f64).log2()),
            ("log2_block_n", (self.bn as f64).log2()),
            ("log2_block_k", (self.bk as f64).log2()),
            ("warps_m", self.warps_m as f64),
            ("warps_n", self.warps_n as f64),
            ("warps_k", self.warps_k as f64),
            ("frag", frag_index),
            ("stages", self.stages as f64),
            ("skew", (self.skew > 0) as u8 as f64),
            ("log2_split_k", (self.split_k as f64).log2()),
            ("cluster_reduce", self.cluster_reduce as u8 as f64),
            ("min_blocks", self.min_blocks as f64),
            ("threads", self.threads() as f64),
            ("smem_kib", self.smem_bytes() as f64 / 1024.0),
            ("acc_regs", self.acc_regs() as f64),
            ("warp_reuse", (fm * fn_) as f64 / (fm + fn_) as f64),
            ("block_intensity", (self.bm * self.bn) as f64 / (self.bm + self.bn) as f64),
            ("blocks_per_sm", occ as f64),
            ("waves", waves),
            ("wave_efficiency", waves / waves.ceil().max(1.0)),
            ("log2_tiles", ((tm * tn) as f64).log2()),
            ("ktiles_per_split", kt_split as f64),
        ]
    }
    /// The tile part of a kernel name: `b{bm}x{bn}x{bk}_w{m}x{n}x{k}_{frag}_s{stages}_k{split}[c]`.
    pub fn name_tiles(&self) -> String {
        format!(
            "b{}x{}x{}_w{}x{}x{}_{}_s{}_k{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.warps_m,
            self.warps_n,
            self.warps_k,
            self.frag.0,
            self.stages,
            self.split_k,
            if self.cluster_reduce { "c" } else { "" }
        )
    }

    /// The padding and occupancy part of a kernel name: `p{skew 0|1}_o{min_blocks}`.
    pub fn name_tail(&self) -> String {
        format!("p{}_o{}", u32::from(self.skew > 0), self.min_blocks)
    }

    /// The generated header that `wmma_core.cu` reads: what the kernel is (`title`, e.g.
    /// `wmma_gemm v6`, and the workload `key`), `KERNEL_NAME`, the element types (T_EPI is the
    /// epilogue's arithmetic: int or float), the GEMM as the kernel computes it (transposed for a
    /// row-major D), the knobs, the template's [`Core`] settings and `CP_ASYNC`. Templates add
    /// their own constants after these. The order of the lines is wmma_gemm v6's.
    pub fn header(&self, title: &str, key: &str, name: &str, core: &Core) -> Header {
        let g = &self.g;
        let t = &g.types;
        // The kernel's view: with a transposed GEMM its A is this view's B and M and N swap.
        let (m, n, a_k_contig, b_k_contig) =
            if g.transposed { (g.n, g.m, g.b_k_contig, g.a_k_contig) } else { (g.m, g.n, g.a_k_contig, g.b_k_contig) };
        let (bm, bn, warps_m, warps_n, fm, fn_) = if g.transposed {
            (self.bn, self.bm, self.warps_n, self.warps_m, self.frag.2, self.frag.1)
        } else {
            (self.bm, self.bn, self.warps_m, self.warps_n, self.frag.1, self.frag.2)
        };
        let mut h = Header::default();
        h.comment(format!("tensortune {title}: {name}"))
            .comment(format!("workload: {key}"))
            .define("KERNEL_NAME", name)
            .define(
                "TT_CLUSTER_ATTR",
                if self.cluster_reduce { format!("__cluster_dims__(1, 1, {})", self.split_k) } else { String::new() },
            )
            .typedef("T_IN", t.input.cuda())
            .typedef("T_ACC", t.accumulator.cuda())
            .typedef("T_OUT", t.output.cuda())
            .typedef("T_EPI", if t.output.is_int() { "int" } else { "float" });
        h.int("M", m as i64)
            .int("N", n as i64)
            .int("K", g.k as i64)
            .flag("A_K_CONTIG", a_k_contig)
            .flag("B_K_CONTIG", b_k_contig)
            .cfg_type("A_FRAG_LAYOUT", if a_k_contig { "wmma::row_major" } else { "wmma::col_major" })
            .cfg_type("B_FRAG_LAYOUT", if b_k_contig { "wmma::col_major" } else { "wmma::row_major" })
            .int("BM", bm as i64)
            .int("BN", bn as i64)
            .int("BK", self.bk as i64)
            .int("WARPS_M", warps_m as i64)
            .int("WARPS_N", warps_n as i64)
            .int("WARPS_K", self.warps_k as i64)
            .int("FM", fm as i64)
            .int("FN", fn_ as i64)
            .int("FK", self.frag.3 as i64)
            .int("STAGES", self.stages as i64)
            .int("SKEW", self.skew as i64)
            .int("SPLIT_K", self.split_k as i64)
            .flag("REDUCE_CLUSTER", self.cluster_reduce)
            .int("SWIZZLE", core.swizzle as i64)
            .int("MIN_BLOCKS", self.min_blocks as i64)
            .int("VEC_A", core.vec_a as i64)
            .int("VEC_B", core.vec_b as i64)
            .int("VEC_D", core.vec_d as i64)
            .flag("CP_ASYNC", self.cp_async)
            .flag("READ_C", core.read_c)
            .value("T_EPI", "ALPHA", core.alpha)
            .value("T_EPI", "BETA", core.beta);
        h
    }

    /// The launch of a checked config: one block per output tile along x, the K splits along z
    /// (a cluster's ranks with cluster reduction), and the five buffers of `wmma_core.cu`'s
    /// kernel: A, B, C, D, workspace in the kernel's view (a transposed GEMM takes this view's B
    /// as its A).
    pub fn spec(&self, name: String, source: String, res: &Resources) -> KernelSpec {
        let (tm, tn) = self.tiles();
        let (a, b) = if self.g.transposed { (Arg::B, Arg::A) } else { (Arg::A, Arg::B) };
        KernelSpec {
            source,
            launch: Launch {
                entry: name.clone(),
                name,
                grid: [(tm * tn) as u32, 1, self.split_k],
                block: [res.threads, 1, 1],
                smem_bytes: res.smem_bytes,
                workspace_bytes: res.workspace_bytes,
                args: vec![a, b, Arg::C, Arg::D, Arg::Workspace],
            },
        }
    }
}

/// What the generated header of `wmma_core.cu` needs beyond the tiling, in the kernel's view.
#[derive(Clone, Copy, Debug)]
pub struct Core {
    /// Row tiles per rasterisation group (1: blocks run down the kernel's M first).
    pub swizzle: u32,
    /// Bytes per global load of the kernel's A.
    pub vec_a: u32,
    /// Bytes per global load of the kernel's B.
    pub vec_b: u32,
    /// Bytes per store of D (and load of C).
    pub vec_d: u32,
    /// Whether the epilogue reads C (beta != 0).
    pub read_c: bool,
    /// The epilogue's alpha, in T_EPI.
    pub alpha: Scalar,
    /// The epilogue's beta, in T_EPI.
    pub beta: Scalar,
}

/// Whether `target` has tensor cores for `input` through WMMA; the error names the input type.
pub fn check_tensor_cores(template: &'static str, input: DType, target: &Target) -> Result<()> {
    let (min_arch, what) = match input {
        DType::F16 => (70, "f16"),
        DType::I8 => (72, "i8"),
        DType::Bf16 => (80, "bf16"),
        other => {
            return Err(Error::invalid("input", format!("{other} is not a WMMA input type")));
        }
    };
    if target.arch < min_arch {
        return Err(Error::Unsupported {
            template,
            what: format!("{what} tensor cores on sm_{} (needs sm_{min_arch} or newer)", target.arch),
        });
    }
    Ok(())
}

/// The widest power-of-two vector (16 bytes at most, one element at least) dividing every size.
pub fn widest_vec(elem: u32, sizes: &[u64]) -> u32 {
    [16u32, 8, 4, 2, 1].into_iter().find(|v| *v >= elem && sizes.iter().all(|s| s % *v as u64 == 0)).unwrap_or(elem)
}

fn reject(why: String) -> Result<()> {
    Err(Error::Rejected(why))
}

/// How well a block keeps the tensor cores fed, from 0 to 1, in the analytic models of the
/// templates on WMMA and mma.sync fragments (`wmma_gemm`, `wmma_conv2d`, `mma_ext_gemm`): the
/// reuse of a warp's `frags` (M x N fragments), the pipeline's `stages`, whether shared rows are
/// padded (bank conflicts otherwise), and the warps resident per SM (8 hide the latencies).
pub(crate) fn feed_efficiency(frags: (u32, u32), stages: u32, padded: bool, warps_per_sm: u32) -> f64 {
    let (fm, fn_) = frags;
    let reuse = (fm * fn_) as f64 / (fm + fn_) as f64;
    let mut eff = reuse / (reuse + 0.6);
    eff *= match stages {
        1 => 0.55,
        2 => 0.8,
        3 => 0.93,
        _ => 0.95,
    };
    if !padded {
        eff *= 0.8;
    }
    eff * (warps_per_sm as f64 / 8.0).min(1.0).sqrt()
}
