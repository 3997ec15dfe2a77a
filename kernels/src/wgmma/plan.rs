//! Plan geometry: every quantity a config implies for a workload (tiles, grid, clusters, K
//! splits, stream-K ranges, registers, shared memory), computed once, and the convolution seen as
//! the GEMM the body computes.

use super::knobs::{
    BLOCK_M, BLOCK_N, CLUSTER, CONSUMERS, DOMAIN_SIZES, EPILOGUE, GROUP, PERSISTENT, PRODUCER, RASTER, SCHEDULE,
    STAGES, STREAM_K, space,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::space::{Config, positions_at};
use crate::target::Target;
use crate::workload::Matmul;

/// Registers a thread of the producer warpgroup keeps (setmaxnreg.dec) when it only issues TMA
/// loads, and when it gathers a convolution's activations (addresses of 16-byte copies).
pub(super) const PRODUCER_REGS: u32 = 40;
pub(super) const GATHER_PRODUCER_REGS: u32 = 64;
/// Tiles of gathered copies a producer thread keeps in flight before it waits for the oldest; at
/// most STAGES - 2 (see [`Plan::gather_lag`]).
pub(super) const GATHER_LAG: u32 = 2;
/// Accumulator registers a consumer thread may hold: the rest of its 232-240 go to descriptors,
/// addresses and the epilogue. 160 is two 64x160 row tiles, the per-warpgroup share of cuBLAS's
/// largest Hopper f16 tile; past it ptxas spills or serializes the wgmmas.
pub(super) const MAX_ACC_REGS: u32 = 160;
/// The same with stream-K, whose partial-sum add loads a batch of the workspace beside the
/// accumulators: at 160 ptxas spills 0.5-0.7 KB a thread (sm_90a, NVRTC 13.0).
pub(super) const SK_MAX_ACC_REGS: u32 = 128;
/// Registers one wgmma needs beside the accumulators of its 64-row tile (descriptors, addresses,
/// predicates), as ptxas counts them against the launch cap: a 64x208 f32 tile (104) needed 130
/// (C7602 at 512 threads' cap of 128, sm_90a, NVRTC 13.0, 2026-11-29).
pub(super) const WGMMA_OPERAND_REGS: u32 = 26;
/// Shared memory beyond the stages: 1024 bytes to align the swizzle atoms, and 128 for the
/// mbarriers (a full and an empty one per stage, at most 6 stages, and resident Y's: 104 bytes).
pub(super) const SMEM_SLACK: u32 = 1024 + 128;
/// The TMA-store epilogue's staging per consumer warpgroup: two buffers of 64 rows x 128 bytes.
pub(super) const EPI_BYTES_PER_CONSUMER: u32 = 2 * 64 * 128;
/// A block of C loaded by TMA ([`Plan::c_slots`]): the TMA store's piece, 64 rows x 128 bytes,
/// and its two mbarriers.
pub(super) const C_BLOCK_BYTES: u32 = 64 * 128;
pub(super) const C_BLOCK_BARRIERS: u32 = 16;
/// K split in a cluster (see [`Plan::k_split`]): at most this many blocks share a tile (the
/// portable cluster size), each with at least `SPLIT_MIN_K_TILES` K tiles, so that the exchange of
/// partial sums costs at most about a quarter of a block's time.
pub(super) const SPLIT_MAX: u32 = 8;
pub(super) const SPLIT_MIN_K_TILES: u64 = 4;
/// The largest N the swapped view ([`Plan::swap`], `block_n` 16 or 32) takes: it is for skinny
/// GEMMs (a decode step's tokens), where a 64-row wgmma tile along N computes mostly padding. At
/// N > 128 N fills 64-row tiles, and swapped tiles only add configs to search.
pub(super) const SWAP_MAX_N: u64 = 128;

/// Every quantity a config implies for a workload, computed once.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workload.
    pub w: Matmul,
    /// Tile along the view's Q (wgmma N): `block_m`, or `block_n` when [`Plan::swap`].
    pub bq: u32,
    /// Tile along the view's P (wgmma M rows): `block_n`, or `block_m` when [`Plan::swap`].
    pub bp: u32,
    /// The swapped view (`block_n` below 64, version 16): P = the user's M and Q = the user's N, X
    /// the user's A and Y the user's B, so that N lies on wgmma's n side (8-wide steps) instead of
    /// its 64-row M side. A decode step's 16 tokens then make a 16-column tile, not a quarter of a
    /// 64-row one: no wgmma rows of padding, and a stage of 16 rows of X's K tile instead of 64.
    /// D's element (p, q) of this view is at q * M + p, not p * M + q.
    pub swap: bool,
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
            // The output is column-major K x N*P*Q: a channel is a row m of D, so the matmul's
            // per-row epilogue is the layer's per-channel one, and C of D's shape its residual.
            beta: if c.residual { 1.0 } else { 0.0 },
            epilogue: c.epilogue,
            input_scale: crate::InputScale::None,
            batch: 1,
            groups: crate::grouped::Groups::NONE,
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
pub(super) fn im2col_corners(c: &crate::workload::Conv2d) -> ([i64; 2], [i64; 2]) {
    let upper = |pad: u64, extent: u64, dil: u64| pad as i64 - (extent as i64 - 1) * dil as i64;
    ([-(c.pad.1 as i64), -(c.pad.0 as i64)], [upper(c.pad.1, c.s, c.dilation.1), upper(c.pad.0, c.r, c.dilation.0)])
}

/// Whether a 4-D im2col tensor map can load the layer's activations: a K tile (128 bytes of
/// channels) within one filter tap, traversal strides of at most 8, and bounding-box corners in
/// [-128, 127] (the limits of `cuTensorMapEncodeIm2col` for rank 4). The corners bound a window's
/// extent to 256, so the copy's 16-bit tap offsets always fit.
pub(super) fn im2col_fits(c: &crate::workload::Conv2d) -> bool {
    let per_tile = 128 / c.types.input.bytes() as u64;
    let (lower, upper) = im2col_corners(c);
    c.c.is_multiple_of(per_tile)
        && c.stride.0 <= 8
        && c.stride.1 <= 8
        && lower.iter().chain(&upper).all(|v| (-128..=127).contains(v))
}

/// The view's dimensions and tile counts.
pub(super) struct Grid {
    pub(super) tiles_p: u64,
    pub(super) tiles_q: u64,
    pub(super) cluster_tiles: u64,
    pub(super) blocks: u64,
    /// Stream-K: cluster tiles walked tile by tile (a multiple of the clusters in the grid), and
    /// K tiles shared out after them.
    pub(super) sk_dp_tiles: u64,
    pub(super) sk_iters: u64,
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
        let positions = space().positions(config)?;
        Ok(Plan::from_positions(w, &positions))
    }

    /// The plan of the config at `index` of the space, without building the config.
    pub fn at(w: &Matmul, index: u64) -> Plan {
        Plan::from_positions(w, &positions_at(index, &DOMAIN_SIZES))
    }

    pub(super) fn from_positions(w: &Matmul, pos: &[usize]) -> Plan {
        let (block_m, block_n) = (BLOCK_M[pos[0]], BLOCK_N[pos[1]]);
        let swap = block_n < 64;
        Plan {
            w: *w,
            bq: if swap { block_n } else { block_m },
            bp: if swap { block_m } else { block_n },
            swap,
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
    pub(super) fn gather(&self) -> bool {
        self.conv.is_some_and(|c| c.x == ConvX::Gather)
    }

    /// Whether X is loaded by TMA in im2col mode.
    pub(super) fn im2col(&self) -> bool {
        self.conv.is_some_and(|c| c.x == ConvX::Im2col)
    }

    pub(super) fn producer_regs(&self) -> u32 {
        if self.gather() { GATHER_PRODUCER_REGS } else { PRODUCER_REGS }
    }

    /// K elements per stage row: one 128-byte swizzle span.
    pub(super) fn bk(&self) -> u32 {
        128 / self.w.types.input.bytes()
    }

    /// Whether X (the user's B; A when swapped) is K-major.
    pub(super) fn x_kmajor(&self) -> bool {
        if self.swap { self.w.layout.a_k_contiguous() } else { self.w.layout.b_k_contiguous() }
    }

    /// Whether Y (the user's A; B when swapped) is K-major.
    pub(super) fn y_kmajor(&self) -> bool {
        if self.swap { self.w.layout.b_k_contiguous() } else { self.w.layout.a_k_contiguous() }
    }

    /// The view's P extent (rows of wgmma's M side): the user's N, or M when swapped.
    pub(super) fn p_extent(&self) -> u64 {
        if self.swap { self.w.m } else { self.w.n }
    }

    /// The view's Q extent (wgmma's n side): the user's M, or N when swapped.
    pub(super) fn q_extent(&self) -> u64 {
        if self.swap { self.w.n } else { self.w.m }
    }

    /// The `block_m` knob's value (the tile along the user's M).
    pub(super) fn block_m(&self) -> u32 {
        if self.swap { self.bp } else { self.bq }
    }

    /// The `block_n` knob's value (the tile along the user's N).
    pub(super) fn block_n(&self) -> u32 {
        if self.swap { self.bq } else { self.bp }
    }

    /// The knob that sets the view's P tile, for messages.
    pub(super) fn p_knob(&self) -> &'static str {
        if self.swap { "block_m" } else { "block_n" }
    }

    /// Rows of a tile one consumer warpgroup computes.
    pub(super) fn consumer_rows(&self) -> u32 {
        if self.pingpong { self.bp } else { self.bp / self.consumers }
    }

    /// wgmma row tiles per consumer warpgroup.
    pub(super) fn row_tiles(&self) -> u32 {
        self.consumer_rows() / 64
    }

    /// Accumulator registers per consumer thread for one 64-row tile.
    pub(super) fn acc_regs(&self) -> u32 {
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

    pub(super) fn threads(&self) -> u32 {
        128 * (self.consumers + u32::from(self.specialized))
    }

    pub(super) fn smem_bytes(&self, target: &Target) -> u32 {
        self.smem_with(self.y_resident(target))
            + self.c_slots(target) * self.consumers * (C_BLOCK_BYTES + C_BLOCK_BARRIERS)
    }

    /// Blocks of C each consumer's ring holds where the epilogue loads C by TMA (version 18; 0:
    /// it does not). That is the TMA store with C read 16 bytes a thread (`C_VECTORS`: beta != 0,
    /// unswapped, every group's M a multiple of 8) and a producer warpgroup that loads by TMA (not
    /// a gathering one): a loader thread of the producer warpgroup per consumer fills the ring as
    /// far ahead of the consumer's epilogue as it holds (gemm.cu, `C_TMA`). As many blocks as the
    /// block's shared memory leaves beside the stages and the staging, up to two tiles' worth of
    /// the consumer's (a block with a producer warpgroup runs alone on its SM, so the rest would
    /// sit idle); at least 2, or C goes through registers as in version 17.
    pub(super) fn c_slots(&self, target: &Target) -> u32 {
        let epi_cols = 128 / self.w.types.output.bytes();
        let c_tma = self.w.reads_c()
            && self.tma_store
            && self.specialized
            && !self.gather()
            && !self.swap
            && self.m_multiple_of(8)
            && self.bq.is_multiple_of(epi_cols);
        if !c_tma {
            return 0;
        }
        let base = self.smem_with(self.y_resident(target));
        let fit =
            target.max_smem_per_block.saturating_sub(base) / (self.consumers * (C_BLOCK_BYTES + C_BLOCK_BARRIERS));
        let slots = fit.min(2 * self.row_tiles() * (self.bq / epi_cols));
        if slots >= 2 { slots } else { 0 }
    }

    /// Shared memory with Y in the ring (a stage of X and Y each), or resident (the ring holds X;
    /// every K tile of Y has a slot of its own).
    pub(super) fn smem_with(&self, y_resident: bool) -> u32 {
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
    pub(super) fn y_resident(&self, target: &Target) -> bool {
        self.persistent
            && self.cluster == 1
            && !self.w.multi()
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
    pub(super) fn reads_once(&self, target: &Target) -> (bool, bool) {
        // Several problems: each tile row or column is one problem's, read by that problem only.
        if self.data_bytes() <= target.l2_bytes || self.w.multi() {
            return (false, false);
        }
        (self.tiles_q() == 1 && !self.im2col() && !self.gather(), self.tiles_p() == 1)
    }

    /// The kernel's data: A, B, C (where it is read) and D.
    fn data_bytes(&self) -> u64 {
        let w = &self.w;
        let (e_in, e_out) = (w.types.input.bytes() as u64, w.types.output.bytes() as u64);
        (w.m + w.n) * w.k * e_in + w.m * w.n * e_out * if w.reads_c() { 2 } else { 1 }
    }

    /// Whether C's TMA loads and D's TMA stores carry an L2 evict-first hint (version 19,
    /// `C_ONCE`): C by TMA ([`Plan::c_slots`]) where the kernel's data overflows the L2, as for
    /// [`Plan::reads_once`]. Each element of C is read once and each of D written once, so the L2
    /// keeps the operands that other tiles read again. Where everything fits, nothing is pushed
    /// out, and the hint only gave up lines (of C, of D) that the next launch would find. D's hint
    /// also gives up output lines a next layer could find in the L2 (a one-layer bench does not see
    /// that). `target.l2_bytes` is the card's own at run time (60 MiB on an H200, 50 on an H100).
    /// (H200, 2026-11-29, docs/data/gpu-2026-11-29-cnn13, a binary that hinted every kernel of the
    /// path: ResNet-50's N=32 28x28 128->512 block end, 55 MiB, 16.9 us without hints, 15.2 with C's,
    /// 15.0 with C's and D's (4 configs alike); the 56x56 64->256 one, 103 MB, slower with C's hint
    /// alone and as before with both; the 14x14 256->1024 one, 29 MB, 7-8% slower with either at 100
    /// trials. Under this rule the 28x28 block end fits an H200's L2 and is not hinted there.)
    pub(super) fn c_once(&self, target: &Target) -> bool {
        self.c_slots(target) > 0 && self.data_bytes() > target.l2_bytes
    }

    pub(super) fn grid(&self, target: &Target) -> Grid {
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
        if self.persistent || self.stream_k || self.pingpong || self.tma_store || self.w.multi() {
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

    /// Tiles along the view's P (the user's N; M when swapped), rounded up to whole clusters (an odd count's last
    /// cluster has a tile past N).
    pub(super) fn tiles_p(&self) -> u64 {
        self.p_extent().div_ceil(self.bp as u64).next_multiple_of(self.cluster as u64)
    }

    /// Tiles along the view's Q (the user's M, N when swapped): of one problem, or of every group
    /// together.
    pub(super) fn tiles_q(&self) -> u64 {
        match self.schedule() {
            Some(s) => s.columns(),
            None => self.q_extent().div_ceil(self.bq as u64),
        }
    }

    /// Output tiles a cluster takes at a time (one, or a pair that shares Y with a cluster of
    /// 2), of every problem.
    pub(super) fn cluster_tiles(&self) -> u64 {
        self.tiles_p() / self.cluster as u64 * self.tiles_q() * self.w.batch
    }

    /// K tiles of the whole K extent.
    pub(super) fn k_tiles(&self) -> u64 {
        self.w.k.div_ceil(self.bk() as u64)
    }

    /// One block's partial sums: 4 bytes per accumulator register of every consumer thread (what
    /// stream-K leaves in the workspace, and what the K split leaves in the ring).
    pub(super) fn sums_bytes(&self) -> u32 {
        self.consumers * 128 * self.row_tiles() * self.acc_regs() * 4
    }

    /// The stream-K workspace: a flag per (block, consumer) padded to 256 bytes, then a slot of
    /// partial sums per (block, consumer), 4 bytes per accumulator register.
    pub(super) fn workspace_bytes(&self, g: &Grid) -> u64 {
        if !self.stream_k {
            return 0;
        }
        let flags = (g.blocks * self.consumers as u64 * 4).next_multiple_of(256);
        flags + g.blocks * self.sums_bytes() as u64
    }

    /// Clusters that run at once: blocks per SM times SMs, over the cluster size, less what
    /// uneven GPCs leave over for clusters of 4 or more ([`Target::max_clusters`]).
    pub(super) fn wave(&self, target: &Target) -> u64 {
        target.max_clusters(self.cluster, self.blocks_per_sm(target)).max(1)
    }

    /// Registers a consumer thread needs: its accumulators and about 48 for descriptors, addresses
    /// and the epilogue, in the allocation unit of 8.
    pub(super) fn consumer_regs_needed(&self) -> u32 {
        (self.row_tiles() * self.acc_regs() + 48).next_multiple_of(8)
    }

    /// Blocks one SM holds: by shared memory (1 KiB of it reserved per block), threads and
    /// registers (a consumer thread must keep what [`Self::consumer_regs_needed`] says). The kernel
    /// is compiled with this as its `__launch_bounds__` minimum, so the compiler keeps to it.
    /// With a producer warpgroup the answer is 1: setmaxnreg moves registers within a block's
    /// allocation, and with two blocks per SM ptxas either fails (C7602) or the consumers' setmaxnreg.inc
    /// waited forever on an H200 (seen 2026-11-23).
    pub(super) fn blocks_per_sm(&self, target: &Target) -> u32 {
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
    pub(super) fn consumer_regs_at(&self, b: u32, target: &Target) -> u32 {
        let at_entry = self.launch_regs(b, target);
        let regs = if self.specialized {
            let pool_per_lane = at_entry * self.threads() / 128;
            pool_per_lane.saturating_sub(self.producer_regs()) / self.consumers
        } else {
            at_entry
        };
        regs.min(240) / 8 * 8
    }

    /// Registers every thread starts with at `b` blocks per SM: its share of the file under
    /// `__launch_bounds__(threads, b)`, in units of 8, at most 255 (128 at 512 threads, 168 at
    /// 384). ptxas compiles each instruction within this cap, whatever setmaxnreg raises a
    /// consumer to afterwards.
    pub(super) fn launch_regs(&self, b: u32, target: &Target) -> u32 {
        (target.regs_per_sm / b / self.threads()).min(255) / 8 * 8
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
    pub(super) fn sk_begin(&self, g: &Grid, c: u64) -> u64 {
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
}

/// Tile `ct` of a walk over a `along` x `across` grid that goes along its first dimension first
/// (a mirror of `gemm.cu`'s `banded`): with `group` > 1, in bands of `group` lines of that
/// dimension, each band walked across the whole second dimension before the next (every band but
/// the last has `group` lines, the last `along % group` when that is not zero); with `group` 1,
/// down the whole first dimension, then one step across. Returns (position along, position across).
pub(super) fn banded(ct: u64, along: u64, across: u64, group: u64) -> (u64, u64) {
    if group > 1 {
        let per_band = group * across;
        let (first, r) = (ct / per_band * group, ct % per_band);
        let lines = if first + group <= along { group } else { along % group };
        (first + r % lines, r / lines)
    } else {
        (ct % along, ct / along)
    }
}
