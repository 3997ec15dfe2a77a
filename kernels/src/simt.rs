//! `simt_gemm`: exact f32 matmul on the CUDA cores (no tensor cores, so no TF32 rounding): the
//! classic blocking through shared memory and registers. Knobs: block tile, thread tile (register
//! blocking), K step, global vector width, virtual threads (thread interleaving), double buffering,
//! split-K, the warp tile (how a warp's threads are laid over the block tile) and the blocks per SM
//! ptxas must leave registers for. Valid on sm_70 and newer. Its CUDA body is `src/cuda/simt_gemm.cu`,
//! whose B loader is a hole (`simt_dense.cu` fills it here; `simt_conv2d` fills it with the im2col
//! gather, [`crate::simt_conv`]); like `wmma_gemm`, everything derives from one [`Plan`].

use crate::cuda::{Header, Scalar, ident};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Knob, Space, positions_at};
use crate::target::Target;
use crate::template::{Arg, KernelSpec, Launch, Resources, Template};
use crate::tiling::{LAUNCH_US, Tiling};
use crate::workload::{Conv2d, Layout, Matmul, Op, Workload};

/// The body, with a hole for B's loader.
const CORE: &str = include_str!("cuda/simt_gemm.cu");
/// simt_gemm's loader: a dense B.
const DENSE: &str = include_str!("cuda/simt_dense.cu");
/// simt_conv2d's loader: the im2col gather of an NHWC input.
const IM2COL: &str = include_str!("cuda/simt_conv2d.cu");

/// The body with the loader of a dense B or of a convolution's input, once each.
fn body(conv: bool) -> &'static str {
    static DENSE_BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static CONV_BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if conv {
        CONV_BODY.get_or_init(|| crate::cuda::fill_holes(CORE, IM2COL))
    } else {
        DENSE_BODY.get_or_init(|| crate::cuda::fill_holes(CORE, DENSE))
    }
}

// The knob domains, in the order of the space (the last varies fastest in the index).
const BLOCK_M: &[u32] = &[32, 64, 128, 256];
const BLOCK_N: &[u32] = &[32, 64, 128, 256];
const BLOCK_K: &[u32] = &[8, 16, 32];
const THREAD_M: &[u32] = &[2, 4, 8, 16];
const THREAD_N: &[u32] = &[2, 4, 8, 16];
const VEC: &[u32] = &[1, 2, 4];
const VTHREADS: &[u32] = &[1, 2];
const DOUBLE_BUFFER: &[u32] = &[0, 1];
const SPLIT_K: &[u32] = &[1, 2, 4, 8];
/// A warp's threads along M x N: `none` is v1's layout (threads numbered along M across the whole
/// block), the others lay a warp's 32 thread tiles out as a grid and the warps over the block.
const WARP_TILE: &[(&str, u32, u32)] = &[("none", 0, 0), ("8x4", 8, 4), ("4x8", 4, 8)];
const MIN_BLOCKS: &[u32] = &[1, 2];
const KNOBS: usize = 11;
const DOMAIN_SIZES: [usize; KNOBS] = [
    BLOCK_M.len(),
    BLOCK_N.len(),
    BLOCK_K.len(),
    THREAD_M.len(),
    THREAD_N.len(),
    VEC.len(),
    VTHREADS.len(),
    DOUBLE_BUFFER.len(),
    SPLIT_K.len(),
    WARP_TILE.len(),
    MIN_BLOCKS.len(),
];

/// Accumulators per thread above which register blocking spills (with the operand registers and
/// the prefetch, about 200 of the 255 a thread may have).
const MAX_ACC: u32 = 128;
/// Threads per block: fewer than two warps cannot hide the loads; more than 256 leave at most
/// 128 registers per thread, and ptxas spilled most 512-thread configs it was given.
const THREADS: (u32, u32) = (64, 256);
/// Floats a thread moves from global to shared memory per step: the prefetch registers of
/// double buffering, and what ptxas hoists out of the unrolled loads without it.
const MAX_PREFETCH: u32 = 32;
/// f32 FMA peak of one SM in FLOP/us (H100 SXM: 67 TFLOP/s over 132 SMs).
const FMA_PER_SM: f64 = 67e6 / 132.0;

/// The exact-f32 SIMT matmul template.
pub struct SimtGemm;

/// Every quantity a config implies for a workload.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The GEMM: the workload, or a convolution's implicit GEMM ([`Plan::for_conv`]).
    pub w: Matmul,
    /// The convolution whose implicit GEMM `w` is, if any.
    pub conv: Option<Conv2d>,
    /// Block tile.
    pub bm: u32,
    /// Block tile.
    pub bn: u32,
    /// K per step.
    pub bk: u32,
    /// Thread tile (accumulator rows).
    pub tm: u32,
    /// Thread tile (accumulator columns).
    pub tn: u32,
    /// Floats per global load.
    pub vec: u32,
    /// Virtual threads per axis: 1, or 2 for a thread tile in two runs half a block tile apart.
    pub vt: u32,
    /// Whether the next step is loaded into registers during the current one (two-slot ring).
    pub double_buffer: bool,
    /// K splits.
    pub split_k: u32,
    /// A warp's threads along M (0: v1's layout, threads along M across the block).
    pub warp_tm: u32,
    /// A warp's threads along N (0 with `warp_tm`).
    pub warp_tn: u32,
    /// Blocks per SM that `__launch_bounds__` asks ptxas to leave registers for.
    pub min_blocks: u32,
}

impl Plan {
    /// Reads the knobs of `config` (domains are checked by the space).
    pub fn new(w: &Matmul, config: &Config) -> Result<Plan> {
        let positions = SimtGemm.space().positions(config)?;
        Ok(Plan::from_positions(w, &positions))
    }

    /// The plan of the config at `index` of the space, without building the config.
    pub fn at(w: &Matmul, index: u64) -> Plan {
        Plan::from_positions(w, &positions_at(index, &DOMAIN_SIZES))
    }

    /// The plan of `config` for a convolution: the GEMM D^T = filter x im2col(input), whose M is
    /// the output channels, N the output pixels N*P*Q and K the taps R*S*C, both operands
    /// K-contiguous (layout tn) and D column-major M x N, which is the NPQK output.
    pub fn for_conv(c: &Conv2d, config: &Config) -> Result<Plan> {
        let positions = SimtGemm.space().positions(config)?;
        Ok(Plan::conv_at_positions(c, &positions))
    }

    /// [`Plan::for_conv`] of the config at `index` of the space.
    pub fn conv_at(c: &Conv2d, index: u64) -> Plan {
        Plan::conv_at_positions(c, &positions_at(index, &DOMAIN_SIZES))
    }

    fn conv_at_positions(c: &Conv2d, pos: &[usize]) -> Plan {
        let (pixels, channels, taps) = c.gemm_dims();
        let w = Matmul {
            m: channels,
            n: pixels,
            k: taps,
            layout: Layout::Tn,
            types: c.types,
            alpha: 1.0,
            beta: 0.0,
            epilogue: crate::Epilogue::NONE,
            input_scale: crate::InputScale::None,
            batch: 1,
            groups: crate::grouped::Groups::NONE,
        };
        Plan { conv: Some(*c), ..Plan::from_positions(&w, pos) }
    }

    fn from_positions(w: &Matmul, pos: &[usize]) -> Plan {
        Plan {
            w: *w,
            conv: None,
            bm: BLOCK_M[pos[0]],
            bn: BLOCK_N[pos[1]],
            bk: BLOCK_K[pos[2]],
            tm: THREAD_M[pos[3]],
            tn: THREAD_N[pos[4]],
            vec: VEC[pos[5]],
            vt: VTHREADS[pos[6]],
            double_buffer: DOUBLE_BUFFER[pos[7]] == 1,
            split_k: SPLIT_K[pos[8]],
            warp_tm: WARP_TILE[pos[9]].1,
            warp_tn: WARP_TILE[pos[9]].2,
            min_blocks: MIN_BLOCKS[pos[10]],
        }
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Output tiles along M and N.
    pub fn tiles(&self) -> (u64, u64) {
        (self.w.m.div_ceil(self.bm as u64), self.w.n.div_ceil(self.bn as u64))
    }

    /// K steps in all, and per split.
    pub fn ktiles(&self) -> (u64, u64) {
        let kt = self.w.k.div_ceil(self.bk as u64);
        (kt, kt.div_ceil(self.split_k as u64))
    }

    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        let (tm, tn) = self.tiles();
        tm * tn * self.split_k as u64
    }

    /// Row padding (floats) of an operand's shared tile: 4 where it is transposed on the way in
    /// (K-contiguous in global memory), which spreads the scattered stores over the banks.
    fn pads(&self) -> (u32, u32) {
        let pad = |k_contig: bool| if k_contig { 4 } else { 0 };
        (pad(self.w.layout.a_k_contiguous()), pad(self.w.layout.b_k_contiguous()))
    }

    /// Dynamic shared memory, bytes: one or two slots of both K-major tiles.
    pub fn smem_bytes(&self) -> u32 {
        let (pa, pb) = self.pads();
        let slots = if self.double_buffer { 2 } else { 1 };
        slots * self.bk * (self.bm + pa + self.bn + pb) * 4
    }

    /// Floats a thread moves from global to shared memory per step.
    pub fn prefetch(&self) -> u32 {
        (self.bm + self.bn) * self.bk / self.threads().max(1)
    }

    /// Registers a thread needs, roughly: accumulators, two k's operands (ptxas overlaps the
    /// shared-memory reads of the next k with the current FMAs), the prefetched floats and
    /// addressing (fitted to ptxas's counts for sm_80 over a spread of 4096^3 configs).
    pub fn regs(&self) -> u32 {
        self.tm * self.tn + 2 * (self.tm + self.tn) + self.prefetch() + 40 + self.gather_regs()
    }

    /// Global loads of B a thread issues per step.
    fn b_loads(&self) -> u32 {
        (self.bn * self.bk / self.vec).div_ceil(self.threads().max(1))
    }

    /// Registers a convolution's gather adds: each B load's pixel origin (its row's base, h and
    /// w), kept across steps (ptxas held to 128 spilled a 64x128 tile of 8 B loads without them).
    fn gather_regs(&self) -> u32 {
        if self.conv.is_some() { 3 * self.b_loads() } else { 0 }
    }

    /// The fewest registers a thread can do with: accumulators, two k's operands, the prefetched
    /// floats, two or three per global load (its address; narrower loads take more arithmetic)
    /// and about 20 for the rest. Fitted to ptxas held to 128 on sm_90: 128x128 over 8x8 fits at
    /// a K step of 8 with vec 4 (127 used) and spills at 16; at a K step of 32, 128x64 and
    /// 128x32 spilled with vec 1 and 2 (12 to 20 loads per step). A convolution's gather adds
    /// its own.
    pub fn min_regs(&self) -> u32 {
        let threads = self.threads().max(1);
        let loads = (self.bm * self.bk / self.vec).div_ceil(threads) + self.b_loads();
        let per_load = if self.vec == 4 { 2 } else { 3 };
        self.tm * self.tn + 2 * (self.tm + self.tn) + self.prefetch() + per_load * loads + 20 + self.gather_regs()
    }

    /// Registers per thread ptxas may use: 255, or what leaves room for `min_blocks` blocks of
    /// this size in the register file (allocated 8 at a time).
    pub fn register_cap(&self, target: &Target) -> u32 {
        (target.regs_per_sm / (self.threads().max(1) * self.min_blocks) / 8 * 8).min(255)
    }

    /// Registers per thread ptxas is expected to use: the estimate, held to the cap.
    pub fn regs_used(&self, target: &Target) -> u32 {
        self.regs().min(self.register_cap(target))
    }

    /// The thread tile (tx, ty) of each lane of warp 0 (all warps see the same pattern).
    fn lane_tiles(&self) -> [(u32, u32); 32] {
        let threads_m = self.bm / self.tm;
        let mut tiles = [(0, 0); 32];
        for (lane, tile) in tiles.iter_mut().enumerate() {
            let lane = lane as u32;
            *tile = if self.warp_tm == 0 {
                (lane % threads_m, lane / threads_m)
            } else {
                (lane % self.warp_tm, lane / self.warp_tm)
            };
        }
        tiles
    }

    /// Shared-memory wavefronts one warp spends reading one k's operands: per load instruction,
    /// the most distinct 4-byte words that fall into one of the 32 banks (broadcasts are free).
    pub fn smem_wavefronts(&self) -> u32 {
        let (vs_a, vs_b, _) = self.vectors();
        let tiles = self.lane_tiles();
        let mut total = 0;
        for (sub, vs, of) in [(self.tm / self.vt, vs_a, 0usize), (self.tn / self.vt, vs_b, 1)] {
            for i in (0..sub).step_by(vs as usize) {
                let mut words: Vec<u32> =
                    tiles.iter().flat_map(|t| (0..vs).map(move |e| [t.0, t.1][of] * sub + i + e)).collect();
                words.sort_unstable();
                words.dedup();
                let mut per_bank = [0u32; 32];
                for w in words {
                    per_bank[(w % 32) as usize] += 1;
                }
                total += per_bank.iter().max().copied().unwrap_or(1) * self.vt;
            }
        }
        total
    }

    /// Split-K scratch: a counter per output tile (256-byte aligned), then the partial tiles.
    pub fn workspace_bytes(&self) -> u64 {
        if self.split_k == 1 {
            return 0;
        }
        let (tm, tn) = self.tiles();
        (tm * tn * 4).div_ceil(256) * 256 + tm * tn * self.split_k as u64 * (self.bm * self.bn) as u64 * 4
    }

    /// Blocks one SM holds at once (threads, shared memory, estimated registers).
    pub fn blocks_per_sm(&self, target: &Target) -> u32 {
        let threads = self.threads().max(1);
        let by_threads = 2048 / threads;
        // The driver reserves 1 KiB of shared memory per block.
        let by_smem = target.smem_per_sm / (self.smem_bytes() + 1024);
        let by_regs = target.regs_per_sm / (self.regs_used(target) * threads);
        by_threads.min(by_smem).min(by_regs).clamp(1, 32)
    }

    /// Widest vector (floats, at most 4) that divides `run` and, if given, `extent`.
    fn widest(run: u32, extent: Option<u64>) -> u32 {
        [4u32, 2, 1]
            .into_iter()
            .find(|v| run.is_multiple_of(*v) && extent.is_none_or(|e| e % *v as u64 == 0))
            .unwrap_or(1)
    }

    /// Floats per shared-memory read of A's and B's operands, and per store of D.
    pub fn vectors(&self) -> (u32, u32, u32) {
        let (sub_m, sub_n) = (self.tm / self.vt, self.tn / self.vt);
        (Plan::widest(sub_m, None), Plan::widest(sub_n, None), Plan::widest(sub_m, Some(self.w.m)))
    }

    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        let w = &self.w;
        let threads = self.threads();
        if self.tm > self.bm || self.tn > self.bn {
            return reject(reason!(format!(
                "thread tile {}x{} is larger than the block tile {}x{}",
                self.tm, self.tn, self.bm, self.bn
            )));
        }
        if self.tm > 4 * self.tn || self.tn > 4 * self.tm {
            return reject(reason!(format!(
                "thread tile {}x{} is skinnier than 4:1: a squarer one reads fewer operands per multiply-add",
                self.tm, self.tn
            )));
        }
        if self.vt > 1 && (self.tm < 2 * self.vt || self.tn < 2 * self.vt) {
            return reject(reason!(format!(
                "vthreads {} on a {}x{} thread tile: each run would be a single element",
                self.vt, self.tm, self.tn
            )));
        }
        let (axis_m, axis_n) =
            if self.conv.is_some() { ("K (output channels)", "N*P*Q (output pixels)") } else { ("M", "N") };
        for (name, tile, dim, axis) in [("block_m", self.bm, w.m, axis_m), ("block_n", self.bn, w.n, axis_n)] {
            if tile > 32 && dim.div_ceil(tile as u64 / 2) == dim.div_ceil(tile as u64) {
                return reject(reason!(format!(
                    "{name} {tile} covers {axis} = {dim} no better than {name} {}: wasted work",
                    tile / 2
                )));
            }
        }
        if threads < THREADS.0 || threads > THREADS.1.min(target.max_threads_per_block) {
            return reject(reason!(format!(
                "block tile {}x{} over thread tile {}x{} makes {threads} threads; the template takes {} to {}",
                self.bm,
                self.bn,
                self.tm,
                self.tn,
                THREADS.0,
                THREADS.1.min(target.max_threads_per_block)
            )));
        }
        if self.tm * self.tn > MAX_ACC {
            return reject(reason!(format!(
                "thread tile {}x{} holds {} accumulators per thread; the limit is {MAX_ACC} (more spill)",
                self.tm,
                self.tn,
                self.tm * self.tn
            )));
        }
        if self.prefetch() > MAX_PREFETCH {
            return reject(reason!(format!(
                "block tile {}x{}x{} on {threads} threads moves {} floats per thread per step; at most {MAX_PREFETCH} stay in registers",
                self.bm,
                self.bn,
                self.bk,
                self.prefetch()
            )));
        }
        if self.warp_tm > 0 {
            let (threads_m, threads_n) = (self.bm / self.tm, self.bn / self.tn);
            if threads_m % self.warp_tm != 0 || threads_n % self.warp_tn != 0 {
                return reject(reason!(format!(
                    "warp_tile {}x{} needs the {threads_m}x{threads_n} thread tiles of block tile {}x{} over thread tile {}x{} to be a multiple of it",
                    self.warp_tm, self.warp_tn, self.bm, self.bn, self.tm, self.tn
                )));
            }
        }
        let cap = self.register_cap(target);
        if self.min_blocks > 1 {
            let free = (target.regs_per_sm / threads / 8 * 8).min(255);
            if cap == free {
                return reject(reason!(format!(
                    "min_blocks {} on {threads} threads changes nothing: {free} registers per thread already let {} blocks share an SM",
                    self.min_blocks, self.min_blocks
                )));
            }
            if self.min_regs() > cap {
                return reject(reason!(format!(
                    "min_blocks {} holds {threads} threads to {cap} registers each; thread tile {}x{} with {} floats per step needs at least {}",
                    self.min_blocks,
                    self.tm,
                    self.tn,
                    self.prefetch(),
                    self.min_regs()
                )));
            }
            // The driver reserves 1 KiB of shared memory per block.
            let need = (self.smem_bytes() + 1024) * self.min_blocks;
            if need > target.smem_per_sm {
                return reject(reason!(format!(
                    "min_blocks {} needs {} KiB of shared memory per SM ({} KiB per block); this GPU has {} KiB",
                    self.min_blocks,
                    need.div_ceil(1024),
                    (self.smem_bytes() + 1024).div_ceil(1024),
                    target.smem_per_sm / 1024
                )));
            }
        }
        // ptxas's count runs up to ~10% over the estimate on large tiles: keep that margin where
        // ptxas is free to take what it wants (a held count is min_regs's business).
        if self.min_blocks == 1 && self.regs() + self.regs() / 10 > cap {
            return reject(reason!(format!(
                "thread tile {}x{} with {} floats per step needs about {} registers per thread; {threads} threads may have {cap}",
                self.tm,
                self.tn,
                self.prefetch(),
                self.regs()
            )));
        }
        if let Some(c) = &self.conv
            && !c.c.is_multiple_of(self.vec as u64)
        {
            return reject(reason!(format!(
                "vec {} needs c = {} to be a multiple of {}: a vector of the input may not straddle two filter taps",
                self.vec, c.c, self.vec
            )));
        }
        let a_run = if w.layout.a_k_contiguous() { ("K", w.k, "A") } else { ("M", w.m, "A") };
        let b_run = if w.layout.b_k_contiguous() { ("K", w.k, "B") } else { ("N", w.n, "B") };
        for (axis, extent, operand) in [a_run, b_run] {
            if !extent.is_multiple_of(self.vec as u64) {
                return reject(reason!(format!(
                    "vec {} needs {axis} = {extent} to be a multiple of {} ({operand} is {axis}-contiguous in layout {})",
                    self.vec, self.vec, w.layout
                )));
            }
        }
        let smem = self.smem_bytes();
        if smem > target.max_smem_per_block {
            return reject(reason!(format!(
                "block tile {}x{}x{} needs {} KiB of shared memory; this GPU allows {} KiB per block",
                self.bm,
                self.bn,
                self.bk,
                smem.div_ceil(1024),
                target.max_smem_per_block / 1024
            )));
        }
        let (ktiles, kt_split) = self.ktiles();
        if self.double_buffer && kt_split < 2 {
            return reject(reason!(format!("double_buffer with {kt_split} k-step per split has nothing to overlap")));
        }
        if self.split_k as u64 > ktiles || (self.split_k as u64 - 1) * kt_split >= ktiles {
            return reject(reason!(format!(
                "split_k {} leaves a split without k-steps ({ktiles} k-steps of {} at K = {})",
                self.split_k, self.bk, w.k
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
        if self.split_k > 1 && self.blocks() > 2 * target.sm_count as u64 {
            return reject(reason!(format!(
                "split_k {} makes {} blocks for {} SMs: splitting past two waves only adds reduction traffic",
                self.split_k,
                self.blocks(),
                target.sm_count
            )));
        }
        Ok(Resources { threads, smem_bytes: smem, blocks: self.blocks(), workspace_bytes: self.workspace_bytes() })
    }

    /// The warp tile's spelling in configs and names.
    pub fn warp_tile_name(&self) -> &'static str {
        WARP_TILE.iter().find(|w| (w.1, w.2) == (self.warp_tm, self.warp_tn)).map_or("none", |w| w.0)
    }

    /// The kernel's identity: template, version, knobs and a digest of the workload key.
    pub fn name(&self) -> String {
        let (prefix, key) = match &self.conv {
            Some(c) => (format!("tt_simt_conv2d_v{}", crate::version::SIMT_CONV2D), Workload::Conv2d(*c).key()),
            None => (format!("tt_simt_gemm_v{}_{}", SimtGemm.version(), self.w.layout), Workload::Matmul(self.w).key()),
        };
        ident(&format!(
            "{prefix}_b{}x{}x{}_t{}x{}_v{}_vt{}_db{}_k{}_w{}_mb{}_{}",
            self.bm,
            self.bn,
            self.bk,
            self.tm,
            self.tn,
            self.vec,
            self.vt,
            u8::from(self.double_buffer),
            self.split_k,
            self.warp_tile_name(),
            self.min_blocks,
            crate::short_digest(&key)
        ))
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let w = &self.w;
        let name = self.name();
        let (pa, pb) = self.pads();
        let (vs_a, vs_b, vd) = self.vectors();
        let mut h = Header::default();
        match &self.conv {
            Some(c) => h
                .comment(format!("tensortune simt_conv2d v{}: {name}", crate::version::SIMT_CONV2D))
                .comment(format!("workload: {}", Workload::Conv2d(*c).key())),
            None => h
                .comment(format!("tensortune simt_gemm v{}: {name}", SimtGemm.version()))
                .comment(format!("workload: {}", Workload::Matmul(*w).key())),
        };
        h.define("KERNEL_NAME", &name).typedef("T_IN", "float").typedef("T_OUT", "float").typedef("T_EPI", "float");
        h.int("M", w.m as i64)
            .int("N", w.n as i64)
            .int("K", w.k as i64)
            .flag("A_K_CONTIG", w.layout.a_k_contiguous())
            .flag("B_K_CONTIG", w.layout.b_k_contiguous())
            .int("BM", self.bm as i64)
            .int("BN", self.bn as i64)
            .int("BK", self.bk as i64)
            .int("TM", self.tm as i64)
            .int("TN", self.tn as i64)
            .int("VT", self.vt as i64)
            .int("VEC", self.vec as i64)
            .int("A_PAD", pa as i64)
            .int("B_PAD", pb as i64)
            .int("VS_A", vs_a as i64)
            .int("VS_B", vs_b as i64)
            .int("VD", vd as i64)
            .flag("DOUBLE_BUFFER", self.double_buffer)
            .int("SPLIT_K", self.split_k as i64)
            .int("WARP_TM", self.warp_tm as i64)
            .int("WARP_TN", self.warp_tn as i64)
            .int("MIN_BLOCKS", self.min_blocks as i64)
            .flag("READ_C", w.reads_c())
            .value("float", "ALPHA", Scalar::Float(w.alpha))
            .value("float", "BETA", Scalar::Float(w.beta));
        if let Some(c) = &self.conv {
            for (key, v) in crate::support::conv_geometry(c) {
                h.int(key, v as i64);
            }
        }
        h.source(&format!("ns_{name}"), &[crate::cuda::COMMON, body(self.conv.is_some())])
    }

    /// Numeric features for cost models.
    pub fn features(&self, target: &Target) -> Vec<(&'static str, f64)> {
        let p = self;
        let (tm, tn) = p.tiles();
        let (_, kt_split) = p.ktiles();
        let occ = p.blocks_per_sm(target);
        let waves = p.blocks() as f64 / (target.sm_count * occ) as f64;
        vec![
            ("log2_block_m", (p.bm as f64).log2()),
            ("log2_block_n", (p.bn as f64).log2()),
            ("log2_block_k", (p.bk as f64).log2()),
            ("log2_thread_m", (p.tm as f64).log2()),
            ("log2_thread_n", (p.tn as f64).log2()),
            ("vec", p.vec as f64),
            ("vthreads", p.vt as f64),
            ("double_buffer", u8::from(p.double_buffer) as f64),
            ("log2_split_k", (p.split_k as f64).log2()),
            ("threads", p.threads() as f64),
            ("smem_kib", p.smem_bytes() as f64 / 1024.0),
            ("regs", p.regs_used(target) as f64),
            ("warp_tiled", f64::from(u8::from(p.warp_tm > 0))),
            ("min_blocks", p.min_blocks as f64),
            ("smem_wavefronts_per_fma", p.smem_wavefronts() as f64 / (p.tm * p.tn) as f64),
            ("thread_reuse", (p.tm * p.tn) as f64 / (p.tm + p.tn) as f64),
            ("block_intensity", (p.bm * p.bn) as f64 / (p.bm + p.bn) as f64),
            ("blocks_per_sm", occ as f64),
            ("waves", waves),
            ("wave_efficiency", waves / waves.ceil().max(1.0)),
            ("log2_tiles", ((tm * tn) as f64).log2()),
            ("ksteps_per_split", kt_split as f64),
            ("model_log_us", model(p, target).ln()),
        ]
    }

    /// The analytic time in microseconds (the `sim` device's clock, the tuner's prior).
    pub fn model_us(&self, target: &Target) -> f64 {
        model(self, target)
    }

    /// The launch of a checked config.
    pub fn spec(&self, res: &Resources) -> KernelSpec {
        let (tm, tn) = self.tiles();
        let name = self.name();
        KernelSpec {
            source: self.source(),
            launch: Launch {
                entry: name.clone(),
                name,
                grid: [(tm * tn) as u32, 1, self.split_k],
                block: [res.threads, 1, 1],
                smem_bytes: res.smem_bytes,
                workspace_bytes: res.workspace_bytes,
                // A convolution's GEMM multiplies the filter (Arg::B) by the input (Arg::A).
                args: if self.conv.is_some() {
                    vec![Arg::B, Arg::A, Arg::C, Arg::D, Arg::Workspace]
                } else {
                    vec![Arg::A, Arg::B, Arg::C, Arg::D, Arg::Workspace]
                },
            },
        }
    }
}

fn reject<T>(why: String) -> Result<T> {
    Err(Error::Rejected(why))
}

fn matmul(workload: &Workload) -> Result<&Matmul> {
    workload.matmul_for("simt_gemm")
}

impl Template for SimtGemm {
    fn name(&self) -> &'static str {
        "simt_gemm"
    }

    fn version(&self) -> u32 {
        crate::version::SIMT_GEMM
    }

    fn op(&self) -> Op {
        Op::Matmul
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        if target.arch < 70 {
            return Err(Error::Unsupported {
                template: "simt_gemm",
                what: format!("sm_{} (it is tuned for sm_70 or newer)", target.arch),
            });
        }
        Ok(())
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let w = matmul(workload)?;
        w.validate()?;
        w.require_plain("simt_gemm")?;
        if w.types.input != DType::F32 {
            return Err(Error::invalid(
                "input",
                format!(
                    "simt_gemm computes exact f32 (f32,f32,f32), not {} inputs; tf32 goes to the tensor-core templates",
                    w.types.input
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
                ints("thread_m", THREAD_M),
                ints("thread_n", THREAD_N),
                ints("vec", VEC),
                ints("vthreads", VTHREADS),
                ints("double_buffer", DOUBLE_BUFFER),
                ints("split_k", SPLIT_K),
                Knob::names("warp_tile", &WARP_TILE.iter().map(|w| w.0).collect::<Vec<_>>()),
                ints("min_blocks", MIN_BLOCKS),
            ],
        }
    }

    fn valid_indices(&self, workload: &Workload, target: &Target) -> Result<Vec<u64>> {
        self.supports(workload, target)?;
        let w = matmul(workload)?;
        let len: u64 = DOMAIN_SIZES.iter().map(|n| *n as u64).product();
        Ok((0..len).filter(|i| Plan::at(w, *i).check(target).is_ok()).collect())
    }

    fn check(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Resources> {
        self.check_workload(workload)?;
        self.space().index_of(config)?;
        Plan::new(matmul(workload)?, config)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        let plan = Plan::new(matmul(workload)?, config)?;
        let res = plan.check(target)?;
        Ok(plan.spec(&res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        Ok(Plan::new(matmul(workload)?, config)?.features(target))
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        self.check_workload(workload)?;
        let p = Plan::new(matmul(workload)?, config)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

/// Analytic time of a plan in microseconds: FMA work at the CUDA-core peak (wave-quantised),
/// scaled by what one warp's k-step costs the SM (its multiply-adds and shared-memory loads take
/// issue slots, its loads take wavefronts of the shared-memory pipe; see
/// [`Plan::smem_wavefronts`]), by the barrier stalls a single buffer leaves (hidden in part by a
/// second block on the SM), by registers held below what ptxas would take, by a convolution's
/// gather, and by occupancy;
/// memory traffic and the load-latency floor combined as [`Tiling::bound_us`] does, plus launch
/// and split-K costs.
fn model(p: &Plan, target: &Target) -> f64 {
    let (vs_a, vs_b, _) = p.vectors();
    // Per warp and k, in SM clocks: 4 warp instructions issue per clock, 1 wavefront is served.
    let fma = (p.tm * p.tn) as f64 / 4.0;
    let loads = (p.tm / vs_a + p.tn / vs_b) as f64 / 4.0;
    let wavefronts = p.smem_wavefronts() as f64;
    let mut eff = fma / ((fma + loads).max(wavefronts) + 0.3 * wavefronts);
    let occ = p.blocks_per_sm(target);
    eff *= match (p.double_buffer, occ) {
        (true, _) => 0.95,
        (false, 1) => 0.75,
        (false, _) => 0.85,
    };
    if p.regs() > p.register_cap(target) {
        eff *= 0.97;
    }
    if p.conv.is_some() {
        // The im2col gather splits each input vector's index into pixel and tap every step.
        eff *= 0.95;
    }
    let warps = (occ * p.threads() / 32) as f64;
    eff *= (warps / 16.0).min(1.0).powf(0.3);
    let (_, kt_split) = p.ktiles();
    let block_flops = 2.0 * (p.bm * p.bn * p.bk) as f64 * kt_split as f64;
    let concurrent = (target.sm_count * occ) as f64;
    let waves = (p.blocks() as f64 / concurrent).ceil();
    let compute = waves * block_flops * occ as f64 / (FMA_PER_SM * eff);
    let (tm, tn) = p.tiles();
    let w = &p.w;
    let out = (w.m * w.n) as f64 * 4.0 * (1.0 + 2.0 * (p.split_k - 1) as f64);
    let bytes = (tn as f64 * (w.m * w.k) as f64 + tm as f64 * (w.k * w.n) as f64) * 4.0 + out;
    let memory = bytes / 3.0e6;
    let in_flight = if p.double_buffer { 2.0 } else { 1.0 };
    let latency = waves * 0.5 * (1.0 + kt_split as f64 / in_flight);
    let split = if p.split_k > 1 { 0.6 } else { 0.0 };
    Tiling::bound_us(compute, memory, latency) + LAUNCH_US + split
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::valid_configs;
    use crate::workload::{Layout, Types};

    fn mm(m: u64, n: u64, k: u64, layout: Layout) -> Workload {
        Workload::Matmul(Matmul::new(m, n, k, layout, Types::default_for(DType::F32).unwrap()).unwrap())
    }

    fn cfg(pairs: &[(&str, i64)]) -> Config {
        let mut c = SimtGemm.space().config(0).unwrap();
        for (k, v) in pairs {
            c.0.insert((*k).into(), (*v).into());
        }
        c
    }

    #[test]
    fn the_suite_shapes_have_large_valid_spaces() {
        for (shape, layout) in [(1024, Layout::Nn), (4096, Layout::Tn), (1000, Layout::Nt)] {
            let w = mm(shape, shape, shape, layout);
            let valid = valid_configs(&SimtGemm, &w, &Target::sm90()).unwrap();
            assert!(valid.len() >= 200, "{}: only {} valid configs", w.key(), valid.len());
            for (i, c) in valid.iter().take(20) {
                assert_eq!(SimtGemm.space().index_of(c).unwrap(), *i);
            }
        }
    }

    #[test]
    fn fast_enumeration_matches_the_checked_walk() {
        let w = mm(200, 96, 320, Layout::Tt);
        let t = Target::sm80();
        let space = SimtGemm.space();
        let fast: std::collections::HashSet<u64> = SimtGemm.valid_indices(&w, &t).unwrap().into_iter().collect();
        assert!(!fast.is_empty());
        for i in (0..space.len()).step_by(7) {
            assert_eq!(SimtGemm.check(&w, &space.config(i).unwrap(), &t).is_ok(), fast.contains(&i), "index {i}");
        }
    }

    #[test]
    fn rules_give_reasons() {
        let t = Target::sm90();
        let w = mm(4096, 4096, 4096, Layout::Nn);
        let base = [("block_m", 128), ("block_n", 128), ("block_k", 8), ("thread_m", 8), ("thread_n", 8)];
        let ok = cfg(&base);
        let r = SimtGemm.check(&w, &ok, &t).unwrap();
        // B is K-contiguous in nn: its tile is transposed on the way in, rows padded by 4 floats.
        assert_eq!((r.threads, r.smem_bytes), (256, 8 * (128 + 128 + 4) * 4));
        let with = |pairs: &[(&str, i64)]| {
            let mut c = ok.clone();
            for (k, v) in pairs {
                c.0.insert((*k).into(), (*v).into());
            }
            SimtGemm.check(&w, &c, &t).map_err(|e| e.to_string())
        };
        assert!(with(&[("thread_m", 16), ("thread_n", 16)]).unwrap_err().contains("accumulators"));
        assert!(with(&[("thread_m", 2), ("thread_n", 16)]).unwrap_err().contains("skinnier"));
        assert!(with(&[("thread_m", 2), ("thread_n", 2)]).unwrap_err().contains("4096 threads"));
        assert!(with(&[("split_k", 2)]).unwrap_err().contains("split-K is for grids"));
        assert!(
            with(&[("vthreads", 2), ("thread_m", 2), ("thread_n", 2), ("block_m", 32), ("block_n", 32)])
                .unwrap_err()
                .contains("single element")
        );
        // 4 floats per load need every run of the contiguous axis to be a multiple of 4.
        let odd = mm(4098, 4096, 4096, Layout::Nn);
        let mut c = ok.clone();
        c.0.insert("vec".into(), 4i64.into());
        let e = SimtGemm.check(&odd, &c, &t).unwrap_err().to_string();
        assert!(e.contains("vec 4") && e.contains("M = 4098"), "{e}");
        let e = SimtGemm.check(&mm(64, 64, 8, Layout::Nn), &cfg(&[("double_buffer", 1)]), &t).unwrap_err();
        assert!(e.to_string().contains("nothing to overlap"), "{e}");
    }

    #[test]
    fn warp_tile_and_min_blocks_rules_give_reasons() {
        let t = Target::sm90();
        let w = mm(4096, 4096, 4096, Layout::Nn);
        let check = |pairs: &[(&str, i64)], warp: &str| {
            let mut c = cfg(pairs);
            c.0.insert("warp_tile".into(), warp.into());
            SimtGemm.check(&w, &c, &t).map_err(|e| e.to_string())
        };
        let classic = [("block_m", 128), ("block_n", 128), ("block_k", 8), ("thread_m", 8), ("thread_n", 8)];
        // The classic SGEMM: 256 threads held to 128 registers, double buffered, two blocks per SM.
        let mut two = classic.to_vec();
        two.extend([("double_buffer", 1), ("min_blocks", 2), ("vthreads", 2), ("vec", 4)]);
        for warp in ["none", "8x4", "4x8"] {
            assert_eq!(check(&two, warp).unwrap().threads, 256, "{warp}");
        }
        let plan = |pairs: &[(&str, i64)], warp: &str| {
            let mut c = cfg(pairs);
            c.0.insert("warp_tile".into(), warp.into());
            Plan::new(matmul(&w).unwrap(), &c).unwrap()
        };
        let p = plan(&two, "8x4");
        assert_eq!((p.register_cap(&t), p.blocks_per_sm(&t)), (128, 2));
        assert_eq!(plan(&classic, "8x4").register_cap(&t), 255);
        // 32x128 over 8x4 makes 4x32 thread tiles: a warp of 8 along M does not fit.
        let narrow = [("block_m", 32), ("block_n", 128), ("thread_m", 8), ("thread_n", 4)];
        let e = check(&narrow, "8x4").unwrap_err();
        assert!(e.contains("warp_tile 8x4") && e.contains("4x32"), "{e}");
        check(&narrow, "4x8").unwrap();
        // 64 threads may have 255 registers either way.
        let e = check(&[("block_m", 64), ("block_n", 64), ("thread_m", 8), ("thread_n", 8), ("min_blocks", 2)], "none")
            .unwrap_err();
        assert!(e.contains("changes nothing"), "{e}");
        // 128 accumulators and their operands do not fit in 128 registers.
        let e =
            check(&[("block_m", 256), ("block_n", 128), ("thread_m", 8), ("thread_n", 16), ("min_blocks", 2)], "8x4")
                .unwrap_err();
        assert!(e.contains("min_blocks 2 holds 256 threads to 128 registers"), "{e}");
        // ptxas spilled the classic tile at a K step of 16 when held to 128 registers.
        let mut deep = two.clone();
        deep.push(("block_k", 16));
        let e = check(&deep, "8x4").unwrap_err();
        assert!(e.contains("16 floats per step needs at least 140"), "{e}");
        // Two blocks' shared memory must fit the SM.
        let mut small = t.clone();
        small.smem_per_sm = 32 * 1024;
        let e = SimtGemm.check(&w, &cfg(&two), &small).unwrap_err().to_string();
        assert!(e.contains("min_blocks 2 needs 35 KiB of shared memory per SM (18 KiB per block)"), "{e}");
    }

    #[test]
    fn warp_tiles_read_fewer_wavefronts() {
        let w = mm(4096, 4096, 4096, Layout::Nn);
        let p = |warp: &str, vt: i64| {
            let mut c = cfg(&[
                ("block_m", 128),
                ("block_n", 128),
                ("block_k", 8),
                ("thread_m", 8),
                ("thread_n", 8),
                ("vthreads", vt),
            ]);
            c.0.insert("warp_tile".into(), warp.into());
            Plan::new(matmul(&w).unwrap(), &c).unwrap()
        };
        // v1's layout: 16 lanes along M read 8 floats 32 bytes apart (two 4-way bank conflicts),
        // the two rows of lanes along N read two B vectors (one wavefront each).
        assert_eq!(p("none", 1).smem_wavefronts(), 2 * 4 + 2);
        // 16 lanes x 16 contiguous bytes: 2 wavefronts per A load.
        assert_eq!(p("none", 2).smem_wavefronts(), 2 * 2 + 2);
        // A warp of 8x4 lanes with split runs reads 128 contiguous bytes of A, 64 of B per load.
        assert_eq!(p("8x4", 2).smem_wavefronts(), 4);
        assert_eq!(p("4x8", 2).smem_wavefronts(), 4);
        let t = Target::sm90();
        let at = |pl: &Plan| model(pl, &t);
        assert!(at(&p("8x4", 2)) < at(&p("none", 1)));
    }

    #[test]
    fn only_exact_f32_is_taken() {
        let t = Target::sm90();
        let tf32 =
            Workload::Matmul(Matmul::new(64, 64, 64, Layout::Nn, Types::default_for(DType::Tf32).unwrap()).unwrap());
        let e = SimtGemm.supports(&tf32, &t).unwrap_err();
        assert_eq!(e.field(), Some("input"));
        assert!(e.to_string().contains("tf32"), "{e}");
        let f16 =
            Workload::Matmul(Matmul::new(64, 64, 64, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap());
        assert_eq!(SimtGemm.supports(&f16, &t).unwrap_err().field(), Some("input"));
        let mut old = Target::sm80();
        old.arch = 61;
        assert!(SimtGemm.supports(&mm(64, 64, 64, Layout::Nn), &old).is_err());
    }

    #[test]
    fn generated_source_carries_the_knobs() {
        let t = Target::sm90();
        let w = mm(1024, 1024, 1024, Layout::Tn);
        let c = cfg(&[
            ("block_m", 128),
            ("block_n", 64),
            ("block_k", 16),
            ("thread_m", 8),
            ("thread_n", 4),
            ("vec", 4),
            ("vthreads", 2),
            ("double_buffer", 1),
            ("min_blocks", 2),
        ]);
        let mut c = c;
        c.0.insert("warp_tile".into(), "4x8".into());
        let spec = SimtGemm.generate(&w, &c, &t).unwrap();
        for want in [
            "constexpr int TM = 8;",
            "constexpr int VT = 2;",
            "constexpr int A_PAD = 4;",
            "constexpr bool DOUBLE_BUFFER = true;",
            "constexpr int VS_A = 4;",
            "constexpr int VS_B = 2;",
            "constexpr int WARP_TM = 4;",
            "constexpr int WARP_TN = 8;",
            "constexpr int MIN_BLOCKS = 2;",
        ] {
            assert!(spec.source.contains(want), "missing {want}");
        }
        assert_eq!(spec.block, [256, 1, 1]);
        assert_eq!(spec.grid, [8 * 16, 1, 1]);
        assert_eq!(spec.smem_bytes, 2 * 16 * (132 + 68) * 4);
    }

    #[test]
    fn model_prefers_register_blocking() {
        let w = mm(4096, 4096, 4096, Layout::Nn);
        let t = Target::sim();
        let valid = valid_configs(&SimtGemm, &w, &t).unwrap();
        let mut timed: Vec<(f64, &Config)> =
            valid.iter().map(|(_, c)| (SimtGemm.model_us(&w, c, &t).unwrap(), c)).collect();
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (best, config) = timed[0];
        assert!(best * 2.0 < timed[timed.len() - 1].0);
        assert!(config.int("thread_m").unwrap() * config.int("thread_n").unwrap() >= 32, "{config}");
        // At the FMA peak 4096^3 takes 2 ms; the model may not promise better.
        assert!(best > 2.0 * 4096f64.powi(3) / (FMA_PER_SM * 132.0), "{best}");
        assert!(SimtGemm.features(&w, config, &t).unwrap().iter().all(|(_, v)| v.is_finite()));
    }
}
