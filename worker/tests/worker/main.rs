//! The worker's integration tests, one binary: each test binary links the whole dependency tree
//! (tokio, tonic, cudarc), so one binary instead of eight saves seven links and seven builds of
//! the shared harness. Run one part with a filter: `cargo test -p tensortune-worker --test worker
//! daemon::`.
//!
//! - `daemon`: the daemon against a fake tracker, measuring children on `sim` (and, marked
//!   `#[ignore = "needs a GPU"]`, on `cuda:0`).
//! - `compile_process`: the compile child's frame protocol.
//! - `fused_compile`: FP8 and fused-epilogue kernels compile (and, marked, pass on `cuda:0`).
//! - `grouped_compile`: batched and grouped matmul kernels and their support modules compile.
//! - `*_compile`: NVRTC compiles what each template generates, through `common`'s batched harness
//!   (the exhaustive compile of one workload's space is marked `#[ignore]` too: thousands of
//!   kernels, run on the GPU machine's cores by `scripts/gpu-check.sh gputests`).

mod common;
mod compile_process;
mod conv_compile;
mod daemon;
mod fused_compile;
mod generated_kernels_compile;
mod grouped_compile;
mod mma_ext_compile;
mod simt_compile;
mod wgmma_compile;
mod wgmma_conv_compile;
