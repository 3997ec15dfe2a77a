//! The Hopper template family (sm_90a): wgmma from shared memory, TMA loads into 128-byte-swizzled
//! stages completing on mbarriers, optional warp specialization, 2-block clusters with TMA
//! multicast and a persistent tile walk. Everything about the family lives in this folder: its
//! knobs, validity rules, code generation (`gemm.cu` and the emitted wgmma wrapper), features and
//! analytic model; the worker launches it from the generic [`KernelSpec`] (tensor-map recipes in
//! [`Arg::Map`], the cluster shape compiled into the kernel).
//!
//! The kernel works in a transposed view of D (see `gemm.cu`): P = N rows (wgmma's M), Q = M
//! columns (wgmma's N). The knobs keep the user's names: `block_m` is the tile along M (wgmma's N,
//! 64..256) and `block_n` the tile along N (64-row wgmma tiles split over the consumers).

use std::fmt::Write as _;

use crate::cuda::{Header, Scalar, ident};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::space::{Config, Knob, Space, positions_at};
use crate::target::Target;
use crate::template::{Arg, Im2colMap, KernelSpec, Resources, Template, TensorMap, TensorOperand};
use crate::workload::{Matmul, Op, Workload};

/// The fixed kernel body (holes: `mma_tile`).
const BODY: &str = include_str!("gemm.cu");

// The knob domains, in the order of the space (the last varies fastest in the index).
const BLOCK_M: &[u32] = &[64, 128, 160, 192, 256];
const BLOCK_N: &[u32] = &[64, 128, 256];
const CONSUMERS: &[u32] = &[1, 2];
const STAGES: &[u32] = &[2, 3, 4, 5, 6];
const CLUSTER: &[u32] = &[1, 2];
const PERSISTENT: &[u32] = &[0, 1];
const GROUP: &[u32] = &[1, 4, 8, 16];
const PRODUCER: &[&str] = &["warpgroup", "inline"];
const SCHEDULE: &[&str] = &["cooperative", "pingpong"];
const STREAM_K: &[u32] = &[0, 1];
const EPILOGUE: &[&str] = &["direct", "tma"];
/// The dimension the tile walk takes first: N (the view's P, down a band of `raster_group`
/// cluster rows, the order of versions 1-10 and the default of a config without the knob) or M
/// (the view's Q, along a band of `raster_group` tile columns).
const RASTER: &[&str] = &["n", "m"];
const KNOBS: usize = 12;
const DOMAIN_SIZES: [usize; KNOBS] = [
    BLOCK_M.len(),
    BLOCK_N.len(),
    CONSUMERS.len(),
    STAGES.len(),
    CLUSTER.len(),
    PERSISTENT.len(),
    GROUP.len(),
    PRODUCER.len(),
    SCHEDULE.len(),
    STREAM_K.len(),
    EPILOGUE.len(),
    RASTER.len(),
];

/// Registers a thread of the producer warpgroup keeps (setmaxnreg.dec) when it only issues TMA
/// loads, and when it gathers a convolution's activations (addresses of 16-byte copies).
const PRODUCER_REGS: u32 = 40;
const GATHER_PRODUCER_REGS: u32 = 64;
/// Tiles of gathered copies a producer thread keeps in flight before it waits for the oldest; at
/// most STAGES - 2 (see [`Plan::gather_lag`]).
const GATHER_LAG: u32 = 2;
/// Accumulator registers a consumer thread may hold: the rest of its 232-240 go to descriptors,
/// addresses and the epilogue. 160 is two 64x160 row tiles, the per-warpgroup share of cuBLAS's
/// largest Hopper f16 tile; past it ptxas spills or serializes the wgmmas.
const MAX_ACC_REGS: u32 = 160;
/// The same with stream-K, whose partial-sum add loads a batch of the workspace beside the
/// accumulators: at 160 ptxas spills 0.5-0.7 KB a thread (sm_90a, NVRTC 13.0).
const SK_MAX_ACC_REGS: u32 = 128;
/// Shared memory beyond the stages: 1024 bytes to align the swizzle atoms, and 128 for the
/// mbarriers (a full and an empty one per stage, at most 6 stages, and resident Y's: 104 bytes).
const SMEM_SLACK: u32 = 1024 + 128;
/// The TMA-store epilogue's staging per consumer warpgroup: two buffers of 64 rows x 128 bytes.
const EPI_BYTES_PER_CONSUMER: u32 = 2 * 64 * 128;
/// K split in a cluster (see [`Plan::k_split`]): at most this many blocks share a tile (the
/// portable cluster size), each with at least `SPLIT_MIN_K_TILES` K tiles, so that the exchange of
/// partial sums costs at most about a quarter of a block's time.
const SPLIT_MAX: u32 = 8;
const SPLIT_MIN_K_TILES: u64 = 4;
/// Shared-memory bytes a second per SM the analytic model lets the K split's exchange move: the
/// cluster's distributed shared memory, about 64 bytes a clock.
const DSMEM_BYTES_PER_US: f64 = 1.1e5;
/// Fixed cost of a launch in the analytic model, microseconds (as for the WMMA templates).
const LAUNCH_US: f64 = 2.0;

/// The Hopper matmul template.
pub struct WgmmaGemm;

/// Every quantity a config implies for a workload, computed once.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub w: Matmul,
    /// Tile along the user's M (wgmma N, the view's Q).
    pub bq: u32,
    /// Tile along the user's N (wgmma M rows, the view's P).
    pub bp: u32,
    /// Consumer warpgroups.
    pub consumers: u32,
    /// Pipeline stages.
    pub stages: u32,
    /// Blocks per cluster (Y multicast when 2).
    pub cluster: u32,
    /// Persistent grid (one wave walking the tiles).
    pub persistent: bool,
    /// Cluster rows (raster N) or tile columns (raster M) per rasterization group.
    pub group: u32,
    /// The tile walk goes along M first (the view's Q), in bands of `group` tile columns;
    /// otherwise along N first, in bands of `group` cluster rows.
    pub raster_m: bool,
    /// A producer warpgroup (true) or loads issued by a consumer thread.
    pub specialized: bool,
    /// Ping-pong: each consumer warpgroup owns whole tiles, alternate ones, so one's epilogue
    /// overlaps the other's wgmmas (otherwise the consumers split every tile's rows).
    pub pingpong: bool,
    /// Stream-K: the tiles past the last whole wave are shared out by K tiles over every cluster
    /// of a persistent grid, partial sums meeting in the workspace.
    pub stream_k: bool,
    /// The epilogue stages each 64-row x 128-byte piece of D in shared memory and stores it with
    /// TMA (asynchronously, while the consumer goes on), instead of storing from registers.
    pub tma_store: bool,
    /// The convolution this GEMM computes (`wgmma_conv2d`): `w` is then its implicit GEMM
    /// (M = output channels, N = output pixels, K = R*S*C, layout tn; A the filter, B the im2col
    /// matrix of the input).
    pub conv: Option<ConvGemm>,
}

/// A convolution as the GEMM the Hopper body computes.
#[derive(Clone, Copy, Debug)]
pub struct ConvGemm {
    /// The layer.
    pub conv: crate::workload::Conv2d,
    /// How the activations reach shared memory.
    pub x: ConvX,
}

/// How a convolution's activations (the implicit GEMM's X) are loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvX {
    /// 1x1, stride 1, unpadded: the input is a plain [N*H*W][C] matrix, loaded by TMA tiles.
    Tiled,
    /// TMA in im2col mode: C a multiple of a K tile (128 bytes), strides at most 8, and padding and
    /// windows within the range a 4-D im2col map's bounding box takes.
    Im2col,
    /// Any other layer: the producer warpgroup's 128 threads copy it with cp.async.
    Gather,
}

impl ConvGemm {
    /// The layer and its implicit GEMM.
    pub fn of(conv: &crate::workload::Conv2d) -> (ConvGemm, Matmul) {
        let c = *conv;
        let pointwise = c.r == 1 && c.s == 1 && c.stride == (1, 1) && c.pad == (0, 0);
        let gemm = Matmul {
            m: c.k,
            n: c.n * c.p() * c.q(),
            k: c.r * c.s * c.c,
            layout: crate::Layout::Tn,
            types: c.types,
            alpha: 1.0,
            beta: 0.0,
        };
        let x = if pointwise {
            ConvX::Tiled
        } else if im2col_fits(&c) {
            ConvX::Im2col
        } else {
            ConvX::Gather
        };
        (ConvGemm { conv: c, x }, gemm)
    }
}

/// The bounding box of a 4-D im2col map over the layer's input, (W, H) each: the lower corner is
/// where the first window starts relative to the input's first column and row (minus the
/// padding), the upper one where the last window starts relative to its last (the padding less
/// the window's dilated extent).
fn im2col_corners(c: &crate::workload::Conv2d) -> ([i64; 2], [i64; 2]) {
    let upper = |pad: u64, extent: u64, dil: u64| pad as i64 - (extent as i64 - 1) * dil as i64;
    ([-(c.pad.1 as i64), -(c.pad.0 as i64)], [upper(c.pad.1, c.s, c.dilation.1), upper(c.pad.0, c.r, c.dilation.0)])
}

/// Whether a 4-D im2col tensor map can load the layer's activations: a K tile (128 bytes of
/// channels) within one filter tap, traversal strides of at most 8, and bounding-box corners in
/// [-128, 127] (the limits of `cuTensorMapEncodeIm2col` for rank 4). The corners bound a window's
/// extent to 256, so the copy's 16-bit tap offsets always fit.
fn im2col_fits(c: &crate::workload::Conv2d) -> bool {
    let per_tile = 128 / c.types.input.bytes() as u64;
    let (lower, upper) = im2col_corners(c);
    c.c.is_multiple_of(per_tile)
        && c.stride.0 <= 8
        && c.stride.1 <= 8
        && lower.iter().chain(&upper).all(|v| (-128..=127).contains(v))
}

/// The view's dimensions and tile counts.
struct Grid {
    tiles_p: u64,
    tiles_q: u64,
    cluster_tiles: u64,
    blocks: u64,
    /// Stream-K: cluster tiles walked tile by tile (a multiple of the clusters in the grid), and
    /// K tiles shared out after them.
    sk_dp_tiles: u64,
    sk_iters: u64,
}

/// One job of a cluster (see `gemm.cu`'s `WorkList`): K tiles `k0..k1` of cluster tile `ct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Cluster tile (before rasterization).
    pub ct: u64,
    /// First K tile.
    pub k0: u64,
    /// One past the last K tile.
    pub k1: u64,
    /// What the job does with its sum.
    pub kind: WorkKind,
}

/// What a job does with its sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkKind {
    /// The whole K extent: stores the tile.
    Full,
    /// Leaves a partial sum in the workspace.
    Partial,
    /// Ends the tile: adds the partials of the clusters before it, then stores.
    Tail,
    /// One block's share of a tile whose K tiles a cluster splits ([`Plan::k_split`]): its sum
    /// meets its peers' in shared memory, and it stores its share of the tile.
    Split,
}

impl Plan {
    /// Reads the knobs of `config` (domains are checked by the space).
    pub fn new(w: &Matmul, config: &Config) -> Result<Plan> {
        let positions = WgmmaGemm.space().positions(config)?;
        Ok(Plan::from_positions(w, &positions))
    }

    /// The plan of the config at `index` of the space, without building the config.
    pub fn at(w: &Matmul, index: u64) -> Plan {
        Plan::from_positions(w, &positions_at(index, &DOMAIN_SIZES))
    }

    fn from_positions(w: &Matmul, pos: &[usize]) -> Plan {
        Plan {
            w: *w,
            bq: BLOCK_M[pos[0]],
            bp: BLOCK_N[pos[1]],
            consumers: CONSUMERS[pos[2]],
            stages: STAGES[pos[3]],
            cluster: CLUSTER[pos[4]],
            persistent: PERSISTENT[pos[5]] == 1,
            group: GROUP[pos[6]],
            raster_m: RASTER[pos[11]] == "m",
            specialized: PRODUCER[pos[7]] == "warpgroup",
            pingpong: SCHEDULE[pos[8]] == "pingpong",
            stream_k: STREAM_K[pos[9]] == 1,
            tma_store: EPILOGUE[pos[10]] == "tma",
            conv: None,
        }
    }

    /// The plan of the config at `index` for a convolution's implicit GEMM.
    pub fn at_conv(conv: ConvGemm, gemm: &Matmul, index: u64) -> Plan {
        Plan { conv: Some(conv), ..Plan::at(gemm, index) }
    }

    /// Whether the producer warpgroup gathers X with cp.async.
    fn gather(&self) -> bool {
        self.conv.is_some_and(|c| c.x == ConvX::Gather)
    }

    /// Whether X is loaded by TMA in im2col mode.
    fn im2col(&self) -> bool {
        self.conv.is_some_and(|c| c.x == ConvX::Im2col)
    }

    fn producer_regs(&self) -> u32 {
        if self.gather() { GATHER_PRODUCER_REGS } else { PRODUCER_REGS }
    }

    /// K elements per stage row: one 128-byte swizzle span.
    fn bk(&self) -> u32 {
        128 / self.w.types.input.bytes()
    }

    /// Whether X (the user's B) is K-major.
    fn x_kmajor(&self) -> bool {
        self.w.layout.b_k_contiguous()
    }

    /// Whether Y (the user's A) is K-major.
    fn y_kmajor(&self) -> bool {
        self.w.layout.a_k_contiguous()
    }

    /// Rows of a tile one consumer warpgroup computes.
    fn consumer_rows(&self) -> u32 {
        if self.pingpong { self.bp } else { self.bp / self.consumers }
    }

    /// wgmma row tiles per consumer warpgroup.
    fn row_tiles(&self) -> u32 {
        self.consumer_rows() / 64
    }

    /// Accumulator registers per consumer thread for one 64-row tile.
    fn acc_regs(&self) -> u32 {
        if self.w.types.accumulator == DType::F16 { self.bq / 4 } else { self.bq / 2 }
    }

    /// Tiles the gathering producer completes late. Issuing tile i needs tile i - STAGES's stage
    /// freed; a consumer frees a tile's stage only once the next tile's stage is full (it keeps one
    /// wgmma group in flight), and tile i - STAGES + 1 is marked full after tile
    /// i - STAGES + 1 + lag is issued. That must come before tile i: lag <= STAGES - 2. With lag =
    /// STAGES - 1 (the first cut) every block with more K tiles than stages waited forever (seen
    /// 2026-11-25 on an H200: 2- and 3-stage gathered configs timed out).
    pub(crate) fn gather_lag(&self) -> u32 {
        GATHER_LAG.min(self.stages.saturating_sub(2))
    }

    fn threads(&self) -> u32 {
        128 * (self.consumers + u32::from(self.specialized))
    }

    fn smem_bytes(&self, target: &Target) -> u32 {
        self.smem_with(self.y_resident(target))
    }

    /// Shared memory with Y in the ring (a stage of X and Y each), or resident (the ring holds X;
    /// every K tile of Y has a slot of its own).
    fn smem_with(&self, y_resident: bool) -> u32 {
        let epilogue = if self.tma_store { self.consumers * EPI_BYTES_PER_CONSUMER } else { 0 };
        let y_slots = if y_resident { self.k_tiles() as u32 } else { self.stages };
        (self.stages * self.bp + y_slots * self.bq) * 128 + epilogue + SMEM_SLACK
    }

    /// Whether each block loads Y once and keeps it: the grid has one column of tiles (every tile
    /// reads the same Y: a pointwise convolution's filter, or a GEMM whose M fits one tile), the
    /// blocks are persistent (each runs many tiles) and alone (no cluster shares Y out), and all
    /// of Y fits beside the ring of X. Then the ring carries X alone and Y crosses L2 once per
    /// block instead of once per tile (for a 1x1 layer with a small filter, half the loads).
    /// Gathered activations keep Y in the ring (their producer is written for it).
    fn y_resident(&self, target: &Target) -> bool {
        self.persistent
            && self.cluster == 1
            && !self.gather()
            && self.tiles_q() == 1
            && self.smem_with(true) <= target.max_smem_per_block
    }

    /// Which operands stream through the L2 once and may push out what it holds, (X, Y): X when
    /// the grid has one column of tiles, Y when it has one row (a K split or stream-K still reads
    /// each K tile once), and only where the kernel's data (A, B, C and D) overflows the L2. Their
    /// copies carry an L2 evict-first hint (X_ONCE, Y_ONCE), so that the L2 keeps what is read
    /// again: the other operand, and the output, which the next layer reads. Where everything fits,
    /// nothing is pushed out and the hint only gives up lines that a later read (of the same layer,
    /// or of a branch that reads its input again) would find. An im2col X is read again by the
    /// layer's other filter taps; a gathered X is not copied by TMA.
    /// (H200, 2026-11-26, warm replays: bulk copies of a pointwise layer's bytes, 51 MB in and
    /// 13 MB out, ran in 17.5 us without the hint and 16.3 us with it, scripts/membw.cu; the hint on
    /// every one-column grid took N=32 28x28 512->128 1x1, 32 MB in all, from 7.2 us to 8.2 us.)
    fn reads_once(&self, target: &Target) -> (bool, bool) {
        let w = &self.w;
        let (e_in, e_out) = (w.types.input.bytes() as u64, w.types.output.bytes() as u64);
        let data = (w.m + w.n) * w.k * e_in + w.m * w.n * e_out * if w.reads_c() { 2 } else { 1 };
        if data <= target.l2_bytes {
            return (false, false);
        }
        (self.tiles_q() == 1 && !self.im2col() && !self.gather(), self.tiles_p() == 1)
    }

    fn grid(&self, target: &Target) -> Grid {
        let tiles_p = self.tiles_p();
        let tiles_q = self.tiles_q();
        let cluster_tiles = self.cluster_tiles();
        let wave = self.wave(target);
        let clusters = match (self.persistent, self.stream_k) {
            // With at most half a wave of tiles, stream-K gives every tile the same number of
            // clusters, whole ones (split-K through the workspace: each range is one share of one
            // tile, and the ranges of a tile read its K in step); a wave's leftover clusters idle.
            // A range that straddled tiles read their panels out of step: 128x64 tiles of
            // 512x1024x16384 in 66 ranges ran 52 us at the cap against 40 us for the same tiles split
            // in two by clusters (H100, 2026-11-27).
            (true, true) if cluster_tiles * 2 <= wave => wave / cluster_tiles * cluster_tiles,
            (true, true) => wave,
            (true, false) => cluster_tiles.min(wave),
            (false, _) => cluster_tiles * self.k_split(target) as u64,
        };
        // Stream-K keeps the whole waves but the last tile by tile and shares out the rest, so
        // every cluster gets between one and two tiles' worth of K tiles there.
        let (sk_dp_tiles, sk_iters) = if self.stream_k {
            let dp = (cluster_tiles / wave).saturating_sub(1) * wave;
            (dp, (cluster_tiles - dp) * self.k_tiles())
        } else {
            (0, 0)
        };
        Grid { tiles_p, tiles_q, cluster_tiles, blocks: clusters * self.cluster as u64, sk_dp_tiles, sk_iters }
    }

    /// Blocks that share each output tile, splitting its K tiles between them (1: none). A grid of
    /// one block per tile that would leave most of the GPU idle (a deep-K layer at a small batch,
    /// a small GEMM with a long K) is split automatically: the largest power of two whose cluster
    /// (split blocks, times 2 with a cluster of 2) has at most [`SPLIT_MAX`] blocks, whose
    /// clusters all run at once ([`Target::max_clusters`]) and whose blocks keep
    /// [`SPLIT_MIN_K_TILES`] K tiles each.
    /// The blocks of a tile are in one cluster; each leaves its sums in its own (by then idle)
    /// ring, and each adds its peers' sums of its share of the tile over distributed shared memory
    /// and stores that share. With a cluster of 2, the two tiles that share Y by multicast are
    /// split alike, block by block, so the pairs of the same K range load together. Only where
    /// nothing else reorganizes the work: a grid of one tile per block (not persistent, not
    /// stream-K), cooperative consumers, stores from registers, and partial sums that fit in the
    /// ring.
    pub fn k_split(&self, target: &Target) -> u32 {
        if self.persistent || self.stream_k || self.pingpong || self.tma_store {
            return 1;
        }
        let acc = self.row_tiles() * self.acc_regs();
        if self.sums_bytes() > self.stages * (self.bp + self.bq) * 128 || !acc.is_multiple_of(4) {
            return 1;
        }
        // With a cluster of 2 (Y multicast), each pair of vertically adjacent tiles splits its K
        // tiles the same way: a cluster of 2 * split blocks, pairs of the same K range side by side.
        let cluster_tiles = self.cluster_tiles();
        let per_sm = self.blocks_per_sm(target);
        let mut split = 1;
        for s in std::iter::successors(Some(2u32), |s| Some(s * 2)).take_while(|s| *s * self.cluster <= SPLIT_MAX) {
            // One wave: a cluster's blocks sit in one GPC, and GPCs are uneven, so fewer clusters
            // of 4 or 8 fit than the SMs suggest. v5-v11 kept one cluster spare: right for 8 (15
            // fit), but it let 31-32 clusters of 4 through on a 132-SM part, where 30 fit; 32 ran
            // as two waves on an H100 (2026-11-27), as did 16 of 8 in a trial build.
            let fits = cluster_tiles <= target.max_clusters(s * self.cluster, per_sm);
            if fits && self.k_tiles() / s as u64 >= SPLIT_MIN_K_TILES && (acc / 4).is_multiple_of(s) {
                split = s;
            }
        }
        split
    }

    /// Tiles along the user's N (the view's P), rounded up to whole clusters (an odd count's last
    /// cluster has a tile past N).
    fn tiles_p(&self) -> u64 {
        self.w.n.div_ceil(self.bp as u64).next_multiple_of(self.cluster as u64)
    }

    /// Tiles along the user's M (the view's Q).
    fn tiles_q(&self) -> u64 {
        self.w.m.div_ceil(self.bq as u64)
    }

    /// Output tiles a cluster takes at a time: one, or a pair that shares Y with a cluster of 2.
    fn cluster_tiles(&self) -> u64 {
        self.tiles_p() / self.cluster as u64 * self.tiles_q()
    }

    /// K tiles of the whole K extent.
    fn k_tiles(&self) -> u64 {
        self.w.k.div_ceil(self.bk() as u64)
    }

    /// One block's partial sums: 4 bytes per accumulator register of every consumer thread (what
    /// stream-K leaves in the workspace, and what the K split leaves in the ring).
    fn sums_bytes(&self) -> u32 {
        self.consumers * 128 * self.row_tiles() * self.acc_regs() * 4
    }

    /// The stream-K workspace: a flag per (block, consumer) padded to 256 bytes, then a slot of
    /// partial sums per (block, consumer), 4 bytes per accumulator register.
    fn workspace_bytes(&self, g: &Grid) -> u64 {
        if !self.stream_k {
            return 0;
        }
        let flags = (g.blocks * self.consumers as u64 * 4).next_multiple_of(256);
        flags + g.blocks * self.sums_bytes() as u64
    }

    /// Clusters that run at once: blocks per SM times SMs, over the cluster size, less what
    /// uneven GPCs leave over for clusters of 4 or more ([`Target::max_clusters`]).
    fn wave(&self, target: &Target) -> u64 {
        target.max_clusters(self.cluster, self.blocks_per_sm(target)).max(1)
    }

    /// Registers a consumer thread needs: its accumulators and about 48 for descriptors, addresses
    /// and the epilogue, in the allocation unit of 8.
    fn consumer_regs_needed(&self) -> u32 {
        (self.row_tiles() * self.acc_regs() + 48).next_multiple_of(8)
    }

    /// Blocks one SM holds: by shared memory (1 KiB of it reserved per block), threads and
    /// registers (a consumer thread must keep what [`Self::consumer_regs_needed`] says). The kernel
    /// is compiled with this as its `__launch_bounds__` minimum, so the compiler keeps to it.
    /// With a producer warpgroup the answer is 1: setmaxnreg moves registers within a block's
    /// allocation, and with two blocks per SM ptxas either fails (C7602) or the consumers' setmaxnreg.inc
    /// waited forever on an H200 (seen 2026-11-23).
    fn blocks_per_sm(&self, target: &Target) -> u32 {
        if self.specialized {
            return 1;
        }
        let fits = |b: u32| {
            let smem = b * (self.smem_bytes(target) + 1024) <= target.smem_per_sm;
            let threads = b * self.threads() <= 2048;
            smem && threads && self.consumer_regs_at(b, target) >= self.consumer_regs_needed()
        };
        (1..=8).take_while(|b| fits(*b)).last().unwrap_or(1)
    }

    /// Registers of a consumer thread with `b` blocks per SM: with a producer warpgroup, what
    /// setmaxnreg leaves it of the block's share of the register file; otherwise the share per
    /// thread. At most 240, a multiple of 8.
    ///
    /// setmaxnreg only moves registers within what the block was given at launch: every thread
    /// starts at the `__launch_bounds__(threads, 1)` cap (its share of the file in units of 8, at
    /// most 255; 168 at 384 threads, so 64,512 of the 65,536), and the consumers' raise must fit in
    /// that pool less what the producer keeps. A raise past it waits forever (seen 2026-11-25 on an
    /// H200: two consumers at 224 beside a 64-register gathering producer hung every block).
    fn consumer_regs_at(&self, b: u32, target: &Target) -> u32 {
        let per_block = target.regs_per_sm / b;
        let regs = if self.specialized {
            let at_entry = (per_block / self.threads()).min(255) / 8 * 8;
            let pool_per_lane = at_entry * self.threads() / 128;
            pool_per_lane.saturating_sub(self.producer_regs()) / self.consumers
        } else {
            (per_block / self.threads()).min(255)
        };
        regs.min(240) / 8 * 8
    }

    /// The jobs of block `block`, in the order it runs them: a mirror of `gemm.cu`'s `WorkList`,
    /// for the CPU check of the tile walk. Change both together.
    pub fn block_work(&self, target: &Target, block: u64) -> Vec<Work> {
        let g = self.grid(target);
        let cl = self.cluster as u64;
        let kt = self.k_tiles();
        let split = self.k_split(target) as u64;
        if split > 1 {
            // Cluster rank r: pair rank r % cluster (the tile, see tile_of), K share r / cluster.
            let (ct, kr) = (block / (cl * split), block % (cl * split) / cl);
            return vec![Work { ct, k0: kr * kt / split, k1: (kr + 1) * kt / split, kind: WorkKind::Split }];
        }
        let (c, nclusters) = (block / cl, g.blocks / cl);
        let full = |ct| Work { ct, k0: 0, k1: kt, kind: WorkKind::Full };
        if !self.stream_k {
            return (c..g.cluster_tiles).step_by(nclusters as usize).map(full).collect();
        }
        let (s, e) = (self.sk_begin(&g, c), self.sk_begin(&g, c + 1));
        let segment = |t: u64, kind| {
            let t0 = t * kt;
            Work { ct: g.sk_dp_tiles + t, k0: s.max(t0) - t0, k1: e.min(t0 + kt) - t0, kind }
        };
        let dp = (0..g.sk_dp_tiles / nclusters).map(|i| full(c + i * nclusters));
        if e == s {
            return dp.collect();
        }
        let (t_first, t_last) = (s / kt, (e - 1) / kt);
        let (starts_inside, ends_inside) = (!s.is_multiple_of(kt), !e.is_multiple_of(kt));
        // The stream-K range first, so that every cluster starts its tile-by-tile tiles together.
        let mut out = Vec::new();
        if ends_inside {
            out.push(segment(t_last, WorkKind::Partial));
        }
        let full_lo = t_first + u64::from(starts_inside);
        let full_hi = t_last + 1 - u64::from(ends_inside);
        out.extend((full_lo..full_hi.max(full_lo)).map(|t| segment(t, WorkKind::Full)));
        if starts_inside && (t_first < t_last || !ends_inside) {
            out.push(segment(t_first, WorkKind::Tail));
        }
        out.extend(dp);
        out
    }

    /// The first stream-K iteration of cluster `c`.
    fn sk_begin(&self, g: &Grid, c: u64) -> u64 {
        (c as u128 * g.sk_iters as u128 / (g.blocks / self.cluster as u64) as u128) as u64
    }

    /// The clusters whose partial sums the tail job of cluster `c` at cluster tile `ct` adds (a
    /// mirror of the loop in `gemm.cu`).
    pub fn tail_sources(&self, target: &Target, c: u64, ct: u64) -> Vec<u64> {
        let g = self.grid(target);
        let start = (ct - g.sk_dp_tiles) * self.k_tiles();
        (0..c).rev().take_while(|c2| self.sk_begin(&g, c2 + 1) > start).collect()
    }

    /// The (p, q) tile of cluster tile `ct` for the block of cluster rank `rank` (a mirror of
    /// `gemm.cu`'s `tile_of`). A cluster's padding row (when the N tiles are odd) shows as
    /// p = tiles_p - 1.
    pub fn tile_of(&self, target: &Target, ct: u64, rank: u64) -> (u64, u64) {
        let g = self.grid(target);
        let cl = self.cluster as u64;
        let (cp, group) = (g.tiles_p / cl, self.group as u64);
        let (pc, tq) = if self.raster_m {
            let (tq, pc) = banded(ct, g.tiles_q, cp, group);
            (pc, tq)
        } else {
            banded(ct, cp, g.tiles_q, group)
        };
        (pc * cl + rank, tq)
    }

    /// Blocks in the grid.
    pub fn blocks(&self, target: &Target) -> u64 {
        self.grid(target).blocks
    }

    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        if self.gather() && !self.specialized {
            return Err(Error::Rejected(
                "this layer's activations are gathered (im2col) by the producer warpgroup's 128 threads: it needs producer warpgroup".into(),
            ));
        }
        if self.pingpong && !(self.specialized && self.consumers == 2) {
            return Err(Error::Rejected(
                "schedule pingpong alternates tiles between two consumer warpgroups fed by a producer warpgroup: it needs consumers 2 and producer warpgroup".into(),
            ));
        }
        if self.stream_k && !self.persistent {
            return Err(Error::Rejected(
                "stream_k shares K tiles out over a grid of one wave: it needs persistent 1".into(),
            ));
        }
        if self.tma_store && !(self.w.m * self.w.types.output.bytes() as u64).is_multiple_of(16) {
            return Err(Error::Rejected(format!(
                "epilogue tma stores rows of D (M={} elements of {}) by TMA, which needs rows of whole 16-byte units",
                self.w.m, self.w.types.output
            )));
        }
        if self.stream_k && self.pingpong {
            return Err(Error::Rejected(
                "stream_k needs schedule cooperative: ping-pong consumers own whole tiles".into(),
            ));
        }
        if !self.consumer_rows().is_multiple_of(64) {
            return Err(Error::Rejected(format!(
                "block_n {} cannot be split into whole 64-row wgmma tiles over {} consumer warpgroups",
                self.bp, self.consumers
            )));
        }
        if !self.y_kmajor() && !self.bq.is_multiple_of(64) {
            return Err(Error::Rejected(format!(
                "block_m {} with layout {}: an M-contiguous A is loaded and read in 64-column chunks, so block_m must be a multiple of 64",
                self.bq, self.w.layout
            )));
        }
        let epi_cols = 128 / self.w.types.output.bytes();
        if self.tma_store && !self.bq.is_multiple_of(epi_cols) {
            return Err(Error::Rejected(format!(
                "epilogue tma stores D in 128-byte pieces ({epi_cols} {} elements): block_m {} is not a whole number of them",
                self.w.types.output, self.bq
            )));
        }
        let acc = self.row_tiles() * self.acc_regs();
        if acc > MAX_ACC_REGS {
            return Err(Error::Rejected(format!(
                "a {}x{} tile over {} consumer warpgroups holds {acc} accumulator registers per thread; at most {MAX_ACC_REGS} fit beside the wgmma operands",
                self.bq, self.bp, self.consumers
            )));
        }
        if self.stream_k && acc > SK_MAX_ACC_REGS {
            return Err(Error::Rejected(format!(
                "stream_k adds partial sums beside the accumulators: a {}x{} tile over {} consumer warpgroups holds {acc} per thread, at most {SK_MAX_ACC_REGS} fit with it",
                self.bq, self.bp, self.consumers
            )));
        }
        let smem = self.smem_bytes(target);
        if smem > target.max_smem_per_block {
            return Err(Error::Rejected(format!(
                "{} stages of a {}x{} tile need {} KiB of shared memory; this GPU allows {} KiB per block",
                self.stages,
                self.bq,
                self.bp,
                smem.div_ceil(1024),
                target.max_smem_per_block / 1024
            )));
        }
        // Tiles more than twice the problem's extent only compute zeros: the smaller tile is in
        // the space and does the same work.
        for (knob, tile, extent, field) in [("block_m", self.bq, self.w.m, "M"), ("block_n", self.bp, self.w.n, "N")] {
            if tile > 64 && tile as u64 >= 2 * extent {
                return Err(Error::Rejected(format!(
                    "{knob} {tile} is at least twice {field}={extent}: half the tile would compute nothing"
                )));
            }
        }
        let g = self.grid(target);
        if self.cluster > 1 && self.w.n.div_ceil(self.bp as u64) < 2 {
            return Err(Error::Rejected(format!(
                "a cluster of 2 needs at least two block_n tiles (N={} is one tile of {})",
                self.w.n, self.bp
            )));
        }
        let wave = self.wave(target);
        if self.stream_k {
            if g.cluster_tiles.is_multiple_of(wave) {
                return Err(Error::Rejected(format!(
                    "stream_k: the {} tiles fill whole waves of {} blocks; there is no ragged wave to share out",
                    g.cluster_tiles * self.cluster as u64,
                    wave * self.cluster as u64
                )));
            }
            if g.sk_iters < 2 * wave {
                return Err(Error::Rejected(format!(
                    "stream_k: {} K tiles over {} clusters is fewer than 2 each",
                    g.sk_iters, wave
                )));
            }
        } else if self.persistent && g.cluster_tiles <= wave {
            return Err(Error::Rejected(format!(
                "persistent: the {} tiles fit in one wave of {} blocks already",
                g.cluster_tiles * self.cluster as u64,
                wave * self.cluster as u64
            )));
        }
        let cluster_rows = g.tiles_p / self.cluster as u64;
        if self.raster_m {
            if cluster_rows == 1 || g.tiles_q == 1 {
                return Err(Error::Rejected(format!(
                    "raster m walks a grid of one row or one column of tiles as raster n does (have {}x{})",
                    cluster_rows, g.tiles_q
                )));
            }
            if self.group > 1 && g.tiles_q <= self.group as u64 {
                return Err(Error::Rejected(format!(
                    "raster_group {} with raster m needs more than {} columns of block_m tiles (have {})",
                    self.group, self.group, g.tiles_q
                )));
            }
        } else if self.group > 1 && (cluster_rows <= self.group as u64 || g.tiles_q == 1) {
            return Err(Error::Rejected(format!(
                "raster_group {} needs more than {} rows of block_n tiles and more than one column (have {}x{})",
                self.group, self.group, cluster_rows, g.tiles_q
            )));
        }
        Ok(Resources {
            threads: self.threads(),
            smem_bytes: smem,
            blocks: g.blocks,
            workspace_bytes: self.workspace_bytes(&g),
        })
    }

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
            None => ("wgmma_gemm", WgmmaGemm.version(), Workload::Matmul(self.w).key()),
        };
        let key_digest = crate::short_digest(&key);
        ident(&format!(
            "tt_{family}_v{}_{}{}{}_{}_m{}n{}_c{}{}_s{}_cl{}_{}{}_g{}{}_{}{}{}_{}",
            version,
            t.input,
            t.accumulator,
            t.output,
            self.w.layout,
            self.bq,
            self.bp,
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
    fn map_d(&self) -> TensorMap {
        let w = &self.w;
        let e = w.types.output.bytes();
        TensorMap {
            operand: TensorOperand::D,
            dtype: w.types.output,
            dims: [w.m, w.n],
            row_bytes: w.m * e as u64,
            box_dims: [128 / e, 64],
        }
    }

    /// The im2col tensor map of a convolution's input, when X is loaded that way: BP output pixels
    /// of BK channels (128 bytes) per copy.
    fn im2col_map(&self) -> Option<Im2colMap> {
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
    fn maps(&self) -> [TensorMap; 2] {
        let w = &self.w;
        let e = w.types.input.bytes() as u64;
        let bk = self.bk();
        // K-major: rows of K, one box of every row of the tile. MN-major: rows of M or N, 64-wide
        // boxes (the 128-byte swizzle span) of BK rows.
        let map = |operand, kmajor: bool, mn: u64, rows_in_box: u32| {
            if kmajor {
                TensorMap {
                    operand,
                    dtype: w.types.input,
                    dims: [w.k, mn],
                    row_bytes: w.k * e,
                    box_dims: [bk, rows_in_box],
                }
            } else {
                TensorMap { operand, dtype: w.types.input, dims: [mn, w.k], row_bytes: mn * e, box_dims: [64, bk] }
            }
        };
        // A convolution's X is its input (the worker's A) and its Y the filter (the worker's B).
        let (x_operand, y_operand) = if self.conv.is_some() {
            (TensorOperand::A, TensorOperand::B)
        } else {
            (TensorOperand::B, TensorOperand::A)
        };
        [map(x_operand, self.x_kmajor(), w.n, self.bp), map(y_operand, self.y_kmajor(), w.m, self.bq / self.cluster)]
    }

    /// The generated source.
    pub fn source(&self, target: &Target) -> String {
        let w = &self.w;
        let t = &w.types;
        let name = self.name(target);
        let g = self.grid(target);
        let blocks_per_sm = self.blocks_per_sm(target);
        let split = self.k_split(target);
        let (x_once, y_once) = self.reads_once(target);
        let epi_int = t.output.is_int();
        let scalar = |v: f64| if epi_int { Scalar::Int(v as i64) } else { Scalar::Float(v) };
        let mut h = Header::default();
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
                .comment(format!("wgmma_gemm v{}: D = alpha * op(A) op(B) + beta * C", WgmmaGemm.version()))
                .comment(format!("workload {}", Workload::Matmul(*w).key())),
        };
        // The convolution's geometry (placeholders when there is none: the gather is not compiled).
        let geometry = self.conv.map(|c| c.conv);
        let dim = |f: fn(&crate::workload::Conv2d) -> u64, none: u64| geometry.as_ref().map_or(none, f) as i64;
        h.typedef("T_IN", t.input.cuda())
            .typedef("T_OUT", t.output.cuda())
            .typedef("T_EPI", if epi_int { "int" } else { "float" })
            .typedef("T_ACCR", acc_reg_type(t.accumulator))
            .define("KERNEL_NAME", &name)
            .define(
                "TT_CLUSTER_ATTR",
                match self.cluster * split {
                    1 => String::new(),
                    blocks => format!("__cluster_dims__({blocks}, 1, 1)"),
                },
            )
            .int("P", w.n as i64)
            .int("Q", w.m as i64)
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
            .flag("EVEN_P", w.n.is_multiple_of(self.bp as u64))
            .flag("EVEN_Q", w.m.is_multiple_of(self.bq as u64))
            .flag("PAIRS_ALIGNED", w.m.is_multiple_of(2))
            // 2-byte outputs stored from registers go 16 bytes (8 columns of Q) a thread.
            .flag("VEC_ALIGNED", w.m.is_multiple_of(8))
            .flag("READ_C", w.reads_c())
            .value("T_EPI", "ALPHA", scalar(w.alpha))
            .value("T_EPI", "BETA", scalar(w.beta));
        let body = crate::cuda::fill_holes(BODY, &format!("// @fill(mma_tile)\n{}", self.mma_tile()));
        h.source(&format!("ns_{name}"), &[crate::cuda::COMMON, &body])
    }

    /// `mma_tile(acc, dx, dy)`: one wgmma of a 64 x BQ tile (K 16, or 32 for i8) accumulating into
    /// `acc`, and `acc_pair`, which reads two adjacent accumulators back as T_EPI.
    fn mma_tile(&self) -> String {
        let t = &self.w.types;
        let n = self.bq;
        let regs = self.acc_regs();
        let (shape, constraint) = match (t.input, t.accumulator) {
            (DType::I8, _) => (format!("m64n{n}k32.s32.s8.s8"), "+r"),
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
        } else if t.input == DType::Tf32 {
            // TF32 has the scale immediates but no transpose bits: its operands are K-major.
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
    fn spec(&self, target: &Target, res: &Resources) -> KernelSpec {
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
            entry: name.clone(),
            name,
            grid: [res.blocks as u32, 1, 1],
            block: [res.threads, 1, 1],
            smem_bytes: res.smem_bytes,
            workspace_bytes: res.workspace_bytes,
            args: if self.tma_store {
                vec![x, Arg::Map(y), Arg::Map(self.map_d()), Arg::C, Arg::D, Arg::Workspace]
            } else {
                vec![x, Arg::Map(y), Arg::C, Arg::D, Arg::Workspace]
            },
        }
    }
}

/// The C++ type of one accumulator register.
fn acc_reg_type(acc: DType) -> &'static str {
    match acc {
        DType::F16 => "unsigned",
        DType::I32 => "int",
        _ => "float",
    }
}

fn matmul(workload: &Workload) -> Result<&Matmul> {
    workload.matmul_for("wgmma_gemm")
}

impl Template for WgmmaGemm {
    fn name(&self) -> &'static str {
        "wgmma_gemm"
    }

    fn version(&self) -> u32 {
        crate::version::WGMMA_GEMM
    }

    fn op(&self) -> Op {
        Op::Matmul
    }

    fn supports(&self, workload: &Workload, target: &Target) -> Result<()> {
        self.check_workload(workload)?;
        if target.arch != 90 {
            return Err(Error::invalid(
                "template",
                format!("wgmma_gemm needs an sm_90 GPU (Hopper: wgmma, TMA); this one is sm_{}", target.arch),
            ));
        }
        Ok(())
    }

    fn check_workload(&self, workload: &Workload) -> Result<()> {
        let w = matmul(workload)?;
        w.validate()?;
        let input = w.types.input;
        if !matches!(input, DType::F16 | DType::Bf16 | DType::I8 | DType::Tf32) {
            return Err(Error::invalid("input", format!("wgmma_gemm takes f16, bf16, i8 or tf32 inputs, not {input}")));
        }
        if matches!(input, DType::I8 | DType::Tf32) && w.layout != crate::Layout::Tn {
            let other = if input == DType::I8 { "wmma_gemm" } else { "mma_ext_gemm" };
            return Err(Error::invalid(
                "layout",
                format!(
                    "wgmma reads {input} operands K-major only, so wgmma_gemm takes {input} in layout tn, not {}; {other} takes it",
                    w.layout
                ),
            ));
        }
        // TMA: every row of an operand starts on a 16-byte boundary.
        let e = input.bytes() as u64;
        let rows = [
            ("k", w.k, w.layout.a_k_contiguous() || w.layout.b_k_contiguous()),
            ("m", w.m, !w.layout.a_k_contiguous()),
            ("n", w.n, !w.layout.b_k_contiguous()),
        ];
        for (field, extent, contiguous) in rows {
            if contiguous && !(extent * e).is_multiple_of(16) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{extent} must be a multiple of {} for {input} in layout {} (TMA needs rows of whole 16-byte units)",
                        16 / e,
                        w.layout
                    ),
                ));
            }
        }
        Ok(())
    }

    fn space(&self) -> Space {
        let ints = |name, v: &[u32]| Knob::ints(name, &v.iter().map(|x| *x as i64).collect::<Vec<_>>());
        Space {
            knobs: vec![
                ints("block_m", BLOCK_M),
                ints("block_n", BLOCK_N),
                ints("consumers", CONSUMERS),
                ints("stages", STAGES),
                ints("cluster", CLUSTER),
                ints("persistent", PERSISTENT),
                ints("raster_group", GROUP),
                Knob::names("producer", PRODUCER),
                Knob::names("schedule", SCHEDULE),
                ints("stream_k", STREAM_K),
                Knob::names("epilogue", EPILOGUE),
                Knob::names("raster", RASTER).defaulting_to(0),
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
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        Plan::new(matmul(workload)?, config)?.check(target)
    }

    fn generate(&self, workload: &Workload, config: &Config, target: &Target) -> Result<KernelSpec> {
        self.supports(workload, target)?;
        self.space().index_of(config)?;
        let plan = Plan::new(matmul(workload)?, config)?;
        let res = plan.check(target)?;
        Ok(plan.spec(target, &res))
    }

    fn features(&self, workload: &Workload, config: &Config, target: &Target) -> Result<Vec<(&'static str, f64)>> {
        Ok(Plan::new(matmul(workload)?, config)?.features(target))
    }

    fn model_us(&self, workload: &Workload, config: &Config, target: &Target) -> Result<f64> {
        let p = Plan::new(matmul(workload)?, config)?;
        p.check(target)?;
        Ok(model(&p, target))
    }
}

impl Plan {
    /// The model tuner's features of the plan.
    fn features(&self, target: &Target) -> Vec<(&'static str, f64)> {
        let p = self;
        let g = p.grid(target);
        let waves = g.blocks as f64 / target.sm_count as f64;
        vec![
            ("log2_block_m", (p.bq as f64).log2()),
            ("log2_block_n", (p.bp as f64).log2()),
            ("consumers", p.consumers as f64),
            ("stages", p.stages as f64),
            ("cluster", p.cluster as f64),
            ("persistent", f64::from(u8::from(p.persistent))),
            ("log2_raster_group", (p.group as f64).log2()),
            ("raster_m", f64::from(u8::from(p.raster_m))),
            ("specialized", f64::from(u8::from(p.specialized))),
            ("pingpong", f64::from(u8::from(p.pingpong))),
            ("stream_k", f64::from(u8::from(p.stream_k))),
            ("tma_store", f64::from(u8::from(p.tma_store))),
            ("blocks_per_sm", p.blocks_per_sm(target) as f64),
            ("waves", waves),
            (
                "last_wave_fill",
                last_wave_fill(g.tiles_p * g.tiles_q, target.sm_count as u64 * p.blocks_per_sm(target) as u64),
            ),
            ("tile_efficiency", tile_efficiency(p, &g)),
            ("model_log_us", model(p, target).ln()),
        ]
    }
}

/// Tile `ct` of a walk over a `along` x `across` grid that goes along its first dimension first
/// (a mirror of `gemm.cu`'s `banded`): with `group` > 1, in bands of `group` lines of that
/// dimension, each band walked across the whole second dimension before the next (every band but
/// the last has `group` lines, the last `along % group` when that is not zero); with `group` 1,
/// down the whole first dimension, then one step across. Returns (position along, position across).
fn banded(ct: u64, along: u64, across: u64, group: u64) -> (u64, u64) {
    if group > 1 {
        let per_band = group * across;
        let (first, r) = (ct / per_band * group, ct % per_band);
        let lines = if first + group <= along { group } else { along % group };
        (first + r % lines, r / lines)
    } else {
        (ct % along, ct / along)
    }
}

/// How full the last wave of output tiles is when `slots` blocks run at once (1 when the tiles
/// fill whole waves): a persistent grid's `waves` is 1 whatever the tiles, and a nearly empty
/// last wave is where stream-K and other tile shapes pay.
fn last_wave_fill(tiles: u64, slots: u64) -> f64 {
    let rest = tiles % slots.max(1);
    if rest == 0 { 1.0 } else { rest as f64 / slots.max(1) as f64 }
}

/// The share of the computed tile area that lies inside D.
fn tile_efficiency(p: &Plan, g: &Grid) -> f64 {
    (p.w.m * p.w.n) as f64 / ((g.tiles_q * p.bq as u64) as f64 * (g.tiles_p * p.bp as u64) as f64)
}

/// Analytic time in microseconds: wgmma work at a rate that grows with the tile's N (operand
/// reuse) and the pipeline depth, quantised into waves of blocks, against the memory traffic the
/// tiles imply; plus launch cost. Crude on purpose: the tuner's cold start and `sim`'s clock.
fn model(p: &Plan, target: &Target) -> f64 {
    let g = p.grid(target);
    let rate = match p.w.types.input {
        DType::I8 => 2.0,
        DType::Tf32 => 0.5,
        _ => 1.0,
    };
    let peak = 989e6 * rate * target.sm_count as f64 / 132.0;
    let per_block_peak = peak / target.sm_count as f64;
    // Feeding: a 64xN wgmma reads 64+N rows of shared memory per 64*N products.
    let reuse = (p.bq as f64 * p.bp as f64) / (p.bq as f64 + p.bp as f64) / 85.3;
    let pipe = 1.0 - 0.5 / p.stages as f64;
    // A producer that gathers (im2col) feeds the tensor cores less steadily than TMA.
    let spec = if p.specialized { 1.0 } else { 0.9 } * if p.gather() { 0.85 } else { 1.0 };
    let eff = (reuse.min(1.0) * pipe * spec).max(0.05);
    // A K split runs each tile's K tiles on `split` blocks, which then exchange partial sums.
    let split = p.k_split(target) as f64;
    let tile_flops = 2.0 * p.bq as f64 * p.bp as f64 * p.w.k as f64 / split;
    let per_sm = (target.sm_count / p.cluster * p.cluster).max(1) as f64;
    let waves = (g.cluster_tiles * p.cluster as u64) as f64 * split / per_sm;
    let split_us = if split > 1.0 { p.sums_bytes() as f64 * (split - 1.0) / split / DSMEM_BYTES_PER_US } else { 0.0 };
    // Stream-K evens out the last wave, at the price of a partial sum written and read per block.
    let (waves, fixup_us) = if p.stream_k {
        (waves.max(1.0), p.workspace_bytes(&g) as f64 * 2.0 / 3.0e6)
    } else {
        (waves.ceil().max(1.0), 0.0)
    };
    let compute = waves * tile_flops / (per_block_peak * eff) + fixup_us + split_us;
    let e = p.w.types.input.bytes() as f64;
    let l2_reuse = if p.group > 1 { 1.6 } else { 1.0 };
    let bytes = (g.tiles_p as f64 * (p.w.m * p.w.k) as f64 + g.tiles_q as f64 * (p.w.k * p.w.n) as f64) * e / l2_reuse
        + (p.w.m * p.w.n) as f64 * p.w.types.output.bytes() as f64;
    let memory = bytes / 3.0e6;
    (compute.powi(4) + memory.powi(4)).powf(0.25) + LAUNCH_US
}

pub mod conv;

#[cfg(test)]
mod tests;
