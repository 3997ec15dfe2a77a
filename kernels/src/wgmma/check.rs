//! Validity: the rules a plan must pass on a device, in the order a user would want to hear
//! them, and the resources a valid plan uses.

use super::plan::{MAX_ACC_REGS, Plan, SK_MAX_ACC_REGS, SWAP_MAX_N, WGMMA_OPERAND_REGS};
use crate::error::{Error, Result};
use crate::target::Target;
use crate::template::Resources;

impl Plan {
    /// The validity rules, in the order a user would want to hear them.
    pub fn check(&self, target: &Target) -> Result<Resources> {
        self.check_problems()?;
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
        if self.swap {
            self.check_swap()?;
        }
        if self.stream_k && !self.persistent {
            return Err(Error::Rejected(
                "stream_k shares K tiles out over a grid of one wave: it needs persistent 1".into(),
            ));
        }
        if self.tma_store && !(self.w.m * self.w.types.output.bytes() as u64).is_multiple_of(16) {
            return Err(Error::Rejected(reason!(format!(
                "epilogue tma stores rows of D (M={} elements of {}) by TMA, which needs rows of whole 16-byte units",
                self.w.m, self.w.types.output
            ))));
        }
        // Stream-K's partial-sum add wants about 112 registers beside the accumulators (its tiles
        // are sized for 240: SK_MAX_ACC_REGS); three consumers have 152-168 a thread, and ptxas
        // spilled 192x192 and 208x192 tiles there (sm_90a, NVRTC 13.0).
        if self.stream_k && self.consumers > 2 {
            return Err(Error::Rejected(
                "stream_k adds partial sums beside the accumulators, for which three consumer warpgroups have no registers (152-168 a thread): it needs consumers 1 or 2".into(),
            ));
        }
        if self.stream_k && self.pingpong {
            return Err(Error::Rejected(
                "stream_k needs schedule cooperative: ping-pong consumers own whole tiles".into(),
            ));
        }
        if !self.consumer_rows().is_multiple_of(64) {
            return Err(Error::Rejected(reason!(format!(
                "{} {} cannot be split into whole 64-row wgmma tiles over {} consumer warpgroups",
                self.p_knob(),
                self.bp,
                self.consumers
            ))));
        }
        if !self.y_kmajor() && !self.bq.is_multiple_of(64) {
            return Err(Error::Rejected(reason!(format!(
                "block_m {} with layout {}: an M-contiguous A is loaded and read in 64-column chunks, so block_m must be a multiple of 64",
                self.bq, self.w.layout
            ))));
        }
        let epi_cols = 128 / self.w.types.output.bytes();
        if self.tma_store && !self.bq.is_multiple_of(epi_cols) {
            return Err(Error::Rejected(reason!(format!(
                "epilogue tma stores D in 128-byte pieces ({epi_cols} {} elements): block_m {} is not a whole number of them",
                self.w.types.output, self.bq
            ))));
        }
        let acc = self.row_tiles() * self.acc_regs();
        if acc > MAX_ACC_REGS {
            return Err(Error::Rejected(reason!(format!(
                "a {}x{} tile over {} consumer warpgroups holds {acc} accumulator registers per thread; at most {MAX_ACC_REGS} fit beside the wgmma operands",
                self.block_m(),
                self.block_n(),
                self.consumers
            ))));
        }
        if self.stream_k && acc > SK_MAX_ACC_REGS {
            return Err(Error::Rejected(reason!(format!(
                "stream_k adds partial sums beside the accumulators: a {}x{} tile over {} consumer warpgroups holds {acc} per thread, at most {SK_MAX_ACC_REGS} fit with it",
                self.block_m(),
                self.block_n(),
                self.consumers
            ))));
        }
        // With a producer warpgroup the consumers get what setmaxnreg leaves them of the block's
        // registers (Plan::consumer_regs_at): with three consumers (512 threads) that is 152, less
        // than two consumers' 232, and a consumer short of its accumulators spills or hangs.
        if self.specialized && self.consumer_regs_at(1, target) < self.consumer_regs_needed() {
            return Err(Error::Rejected(reason!(format!(
                "a {}x{} tile over {} consumer warpgroups needs {} registers a consumer thread; beside a producer warpgroup they get {}",
                self.block_m(),
                self.block_n(),
                self.consumers,
                self.consumer_regs_needed(),
                self.consumer_regs_at(1, target)
            ))));
        }
        // ptxas fits each wgmma in the registers a thread starts with, before setmaxnreg raises the
        // consumers: with a producer and three consumers (512 threads, 128) a 64-row tile of 208 f32
        // accumulators does not compile (C7602), though the raised 152 would hold it.
        let cap = self.launch_regs(1, target);
        if self.specialized && self.acc_regs() + WGMMA_OPERAND_REGS > cap {
            return Err(Error::Rejected(reason!(format!(
                "a {}x{} tile over {} consumer warpgroups puts {} accumulators in one wgmma, which needs {} registers; beside a producer warpgroup ({} threads) ptxas compiles it within {}",
                self.block_m(),
                self.block_n(),
                self.consumers,
                self.acc_regs(),
                self.acc_regs() + WGMMA_OPERAND_REGS,
                self.threads(),
                cap
            ))));
        }
        let smem = self.smem_bytes(target);
        if smem > target.max_smem_per_block {
            return Err(Error::Rejected(reason!(format!(
                "{} stages of a {}x{} tile need {} KiB of shared memory; this GPU allows {} KiB per block",
                self.stages,
                self.block_m(),
                self.block_n(),
                smem.div_ceil(1024),
                target.max_smem_per_block / 1024
            ))));
        }
        // Tiles more than twice the problem's extent only compute zeros: the smaller tile is in
        // the space and does the same work (below 64, the swapped view's narrow N tiles).
        for (knob, tile, extent, field) in
            [("block_m", self.block_m(), self.w.m, "M"), ("block_n", self.block_n(), self.w.n, "N")]
        {
            if (tile > 64 || (tile < 64 && knob == "block_n")) && tile as u64 >= 2 * extent {
                return Err(Error::Rejected(reason!(format!(
                    "{knob} {tile} is at least twice {field}={extent}: half the tile would compute nothing"
                ))));
            }
        }
        let g = self.grid(target);
        if self.cluster > 1 && self.p_extent().div_ceil(self.bp as u64) < 2 {
            return Err(Error::Rejected(reason!(format!(
                "a cluster of 2 needs at least two {} tiles ({}={} is one tile of {})",
                self.p_knob(),
                if self.swap { "M" } else { "N" },
                self.p_extent(),
                self.bp
            ))));
        }
        let wave = self.wave(target);
        if self.stream_k {
            if g.cluster_tiles.is_multiple_of(wave) {
                return Err(Error::Rejected(reason!(format!(
                    "stream_k: the {} tiles fill whole waves of {} blocks; there is no ragged wave to share out",
                    g.cluster_tiles * self.cluster as u64,
                    wave * self.cluster as u64
                ))));
            }
            if g.sk_iters < 2 * wave {
                return Err(Error::Rejected(reason!(format!(
                    "stream_k: {} K tiles over {} clusters is fewer than 2 each",
                    g.sk_iters, wave
                ))));
            }
        } else if self.persistent && g.cluster_tiles <= wave {
            return Err(Error::Rejected(reason!(format!(
                "persistent: the {} tiles fit in one wave of {} blocks already",
                g.cluster_tiles * self.cluster as u64,
                wave * self.cluster as u64
            ))));
        }
        let cluster_rows = g.tiles_p / self.cluster as u64;
        if self.raster_m {
            if cluster_rows == 1 || g.tiles_q == 1 {
                return Err(Error::Rejected(reason!(format!(
                    "raster m walks a grid of one row or one column of tiles as raster n does (have {}x{})",
                    cluster_rows, g.tiles_q
                ))));
            }
            if self.group > 1 && g.tiles_q <= self.group as u64 {
                return Err(Error::Rejected(reason!(format!(
                    "raster_group {} with raster m needs more than {} columns of block_m tiles (have {})",
                    self.group, self.group, g.tiles_q
                ))));
            }
        } else if self.group > 1 && (cluster_rows <= self.group as u64 || g.tiles_q == 1) {
            return Err(Error::Rejected(reason!(format!(
                "raster_group {} needs more than {} rows of block_n tiles and more than one column (have {}x{})",
                self.group, self.group, cluster_rows, g.tiles_q
            ))));
        }
        Ok(Resources {
            threads: self.threads(),
            smem_bytes: smem,
            blocks: g.blocks,
            workspace_bytes: self.workspace_bytes(&g),
        })
    }

    /// The rules of the swapped view (`block_n` 16 or 32).
    fn check_swap(&self) -> Result<()> {
        let bn = self.block_n();
        if self.conv.is_some() {
            return Err(Error::Rejected(reason!(format!(
                "block_n {bn} swaps the GEMM's operands (N on wgmma's n side), which only wgmma_gemm does: a convolution's pixels stay on the 64-row side (block_n 64 and up)"
            ))));
        }
        if self.w.n > SWAP_MAX_N {
            return Err(Error::Rejected(reason!(format!(
                "block_n {bn} (N on wgmma's n side) is for skinny GEMMs, N <= {SWAP_MAX_N}; N={} fills 64-row tiles (block_n 64 and up)",
                self.w.n
            ))));
        }
        if !(self.w.layout.a_k_contiguous() && self.w.layout.b_k_contiguous()) {
            return Err(Error::Rejected(reason!(format!(
                "block_n {bn} swaps the operands, which the kernel reads K-major only: it needs layout tn, not {}",
                self.w.layout
            ))));
        }
        if self.tma_store {
            return Err(Error::Rejected(reason!(format!(
                "block_n {bn} (swapped operands) stores D from registers: a row of the view is a column of D, which epilogue tma cannot store; it needs epilogue direct"
            ))));
        }
        Ok(())
    }
}
