//! The analytic model (the tuner's cold start and `sim`'s clock) and the cost-model features of a
//! plan.

use super::plan::{Grid, Plan};
use crate::dtype::DType;
use crate::target::Target;

/// Shared-memory bytes a second per SM the analytic model lets the K split's exchange move: the
/// cluster's distributed shared memory, about 64 bytes a clock.
pub(super) const DSMEM_BYTES_PER_US: f64 = 1.1e5;
/// Fixed cost of a launch in the analytic model, microseconds (as for the WMMA templates).
pub(super) const LAUNCH_US: f64 = 2.0;

impl Plan {
    /// The model tuner's features of the plan.
    pub(super) fn features(&self, target: &Target) -> Vec<(&'static str, f64)> {
        let p = self;
        let g = p.grid(target);
        let waves = g.blocks as f64 / target.sm_count as f64;
        vec![
            ("log2_block_m", (p.block_m() as f64).log2()),
            ("log2_block_n", (p.block_n() as f64).log2()),
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

/// How full the last wave of output tiles is when `slots` blocks run at once (1 when the tiles
/// fill whole waves): a persistent grid's `waves` is 1 whatever the tiles, and a nearly empty
/// last wave is where stream-K and other tile shapes pay.
pub(super) fn last_wave_fill(tiles: u64, slots: u64) -> f64 {
    let rest = tiles % slots.max(1);
    if rest == 0 { 1.0 } else { rest as f64 / slots.max(1) as f64 }
}

/// The share of the computed tile area that lies inside D.
pub(super) fn tile_efficiency(p: &Plan, g: &Grid) -> f64 {
    (p.w.m * p.w.n) as f64 / ((g.tiles_q * p.bq as u64) as f64 * (g.tiles_p * p.bp as u64) as f64)
}

/// Analytic time in microseconds: wgmma work at a rate that grows with the tile's N (operand
/// reuse) and the pipeline depth, quantised into waves of blocks, against the memory traffic the
/// tiles imply; plus launch cost. Crude on purpose: the tuner's cold start and `sim`'s clock.
pub(super) fn model(p: &Plan, target: &Target) -> f64 {
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
    // Every tile row of the view reads all of Y (Q rows of K), every tile column all of X.
    let (p_rows, q_rows) = (p.p_extent(), p.q_extent());
    let bytes = (g.tiles_p as f64 * (q_rows * p.w.k) as f64 + g.tiles_q as f64 * (p.w.k * p_rows) as f64) * e
        / l2_reuse
        + (p.w.m * p.w.n) as f64 * p.w.types.output.bytes() as f64;
    let memory = bytes / 3.0e6;
    (compute.powi(4) + memory.powi(4)).powf(0.25) + LAUNCH_US
}
