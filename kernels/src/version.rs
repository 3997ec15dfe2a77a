//! Each template's version, in one place: bumped whenever a generator change can alter timings,
//! and remembered by every measurement record. What each version changed is in
//! `kernels/CHANGELOG.md`, one section per template.
//!
//! A template names its kernels with its version, and a template that builds on another's body
//! (`simt_conv2d` on `simt_gemm`'s, `wgmma_conv2d` on `wgmma_gemm`'s) names them with its own;
//! the numbers living here lets the shared body name either without importing the other
//! template.

/// `wmma_gemm`.
pub const WMMA_GEMM: u32 = 6;
/// `wmma_conv2d`.
pub const WMMA_CONV2D: u32 = 1;
/// `wgmma_gemm`.
pub const WGMMA_GEMM: u32 = 20;
/// `wgmma_conv2d`: follows `wgmma_gemm` since version 3 (they share the body).
pub const WGMMA_CONV2D: u32 = 20;
/// The oldest `wgmma_gemm` / `wgmma_conv2d` version whose records hold for today's kernels: v15
/// added FP8 inputs and fused epilogues, which v14 refused, and generates the workloads v14 took
/// with every new branch compiled out (`FUSED`, `EPI_*`, `TENSOR_SCALE` false); v16 added the
/// swapped view of skinny GEMMs (`block_n` 16 and 32, configs v15 did not have), compiled out
/// elsewhere (`SWAP` false); v17 reads C 16 bytes a thread where rows of D are stored whole, which
/// changes only kernels with C (beta != 0) on those paths: none is in a shipped pack, and a
/// measurement is reused only at its own version; v18 loads C by TMA beside the TMA store (kernels
/// with C and a producer warpgroup only), likewise; v19 puts L2 evict-first hints on that path's
/// loads of C and stores of D where the data overflows the L2 (no golden kernel does), likewise;
/// v19 and v20 add configs (heights; 192-wide tiles over three consumers), and the code of the
/// others keeps its machine code, bar v20's third consumer's named barrier.
/// The single-block golden kernels without C keep their v14 machine code byte for byte
/// (`wgmma_compile`'s golden test).
pub const WGMMA_RECORDS_HOLD_SINCE: u32 = 14;
/// The oldest `wgmma_gemm` / `wgmma_conv2d` version whose space is today's: v19 added `block_m` 32,
/// 48 and every multiple of 16 to 256, v20 `block_n` 192 with three consumer warpgroups (configs no
/// earlier version had), so the search's ground truth must sample v20's space, whatever older
/// records still hold for the configs they measured (`search/tests/ground_truth_current.rs` waives
/// it, dated, until union-v19's suite is swept again).
pub const WGMMA_SPACE_SINCE: u32 = 20;
/// `simt_gemm`.
pub const SIMT_GEMM: u32 = 2;
/// `simt_conv2d`.
pub const SIMT_CONV2D: u32 = 1;
/// `mma_ext_gemm`.
pub const MMA_EXT_GEMM: u32 = 1;
