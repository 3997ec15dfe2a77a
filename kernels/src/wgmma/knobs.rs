//! `wgmma_gemm`'s knob domains, in the order of the space (the last varies fastest in the
//! index), and the space they make.

use crate::space::{Knob, Space};

// The knob domains, in the order of the space (the last varies fastest in the index).
/// Tiles along M (wgmma's n side, or its 64-row side when swapped): 32, 48 and every multiple of 16
/// from 64 to 256, widths wgmma's n takes for every input type. Version 19 filled in the steps
/// between 64, 128, 160, 192 and 256: a height that divides a ragged M into whole tiles (M = 776 is
/// seven tiles of 112, against seven of 128 that compute 120 rows of padding) or fits the tiles
/// into the waves costs a step less per tile than the next larger one, and a small or skinny M
/// (M = 16) pads a 32-row tile instead of a 64-row one (cuBLASLt ran 112-, 168- and 32-row tiles
/// where this space lost, 2026-11-29, H200).
pub(super) const BLOCK_M: &[u32] = &[32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256];
/// Tiles along N. 64 and up put N on wgmma's M side (64-row tiles split over the consumers); 16
/// and 32 (version 16) put it on wgmma's n side instead, the operands swapped (see
/// [`super::plan::Plan::swap`]): a decode layer's few tokens then fill the tile instead of a
/// quarter of a 64-row one. 192 (version 20) is three 64-row tiles: over three consumer
/// warpgroups, or one that computes all three (cuBLAS ran 192x192 tiles in 2-block clusters where
/// this space lost, on m3000n3000k4096 nn, 2026-11-29, H200).
pub(super) const BLOCK_N: &[u32] = &[16, 32, 64, 128, 192, 256];
/// Consumer warpgroups. Three (version 20) split a 192-wide tile 64 rows each, cooperatively.
pub(super) const CONSUMERS: &[u32] = &[1, 2, 3];
pub(super) const STAGES: &[u32] = &[2, 3, 4, 5, 6];
pub(super) const CLUSTER: &[u32] = &[1, 2];
pub(super) const PERSISTENT: &[u32] = &[0, 1];
pub(super) const GROUP: &[u32] = &[1, 4, 8, 16];
pub(super) const PRODUCER: &[&str] = &["warpgroup", "inline"];
pub(super) const SCHEDULE: &[&str] = &["cooperative", "pingpong"];
pub(super) const STREAM_K: &[u32] = &[0, 1];
pub(super) const EPILOGUE: &[&str] = &["direct", "tma"];
/// The dimension the tile walk takes first: N (the view's P, down a band of `raster_group`
/// cluster rows, the order of versions 1-10 and the default of a config without the knob) or M
/// (the view's Q, along a band of `raster_group` tile columns).
pub(super) const RASTER: &[&str] = &["n", "m"];
pub(super) const KNOBS: usize = 12;
pub(super) const DOMAIN_SIZES: [usize; KNOBS] = [
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

/// The knob space: one knob per domain above, in their order.
pub(super) fn space() -> Space {
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
