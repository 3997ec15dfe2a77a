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
//!
//! # Layout
//!
//! - `knobs.rs`: the knob domains and the space.
//! - `plan.rs`: [`Plan`], everything a config implies for a workload (tiles, grid, clusters, K
//!   splits, stream-K), and a convolution as the GEMM the body computes ([`ConvGemm`]).
//! - `check.rs`: the validity rules.
//! - `emit.rs`: code generation: name, tensor maps, header, wgmma wrapper, [`KernelSpec`].
//! - `model.rs`: the analytic model and the cost-model features.
//! - `problems.rs`: batched and grouped matmul (several problems' tiles in one grid).
//! - `gemm.rs`: the `wgmma_gemm` template ([`WgmmaGemm`]); [`conv`]: `wgmma_conv2d` on the same
//!   plan.
//! - `gemm.cu`: the kernel body; `tests.rs`: the family's unit tests.

mod check;
pub mod conv;
mod emit;
mod gemm;
mod knobs;
mod model;
mod plan;
mod problems;

pub use gemm::WgmmaGemm;
pub use plan::{ConvGemm, ConvX, Plan, Work, WorkKind};

#[cfg(test)]
mod tests;
