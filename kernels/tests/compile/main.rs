//! NVRTC compiles what every template generates, on the CPU, one binary (tensortune-nvrtc, the
//! worker's own compiler): each `*_compile` module a template or a path, through `common`'s
//! batched harness. The exhaustive compile of one workload's space is marked `#[ignore]`:
//! thousands of kernels, run on the GPU machine's cores by `scripts/gpu-check.sh gputests`. Run
//! one part with a filter: `cargo test -p tensortune-kernels --test compile wgmma_compile::`.
//! Needs NVRTC and the CUDA headers (`scripts/setup-nvrtc.sh` installs both from PyPI): without
//! them every test fails saying so, never skips.

mod common;
mod conv_compile;
mod fused_compile;
mod generated_kernels_compile;
mod grouped_compile;
mod mma_ext_compile;
mod simt_compile;
mod wgmma_compile;
mod wgmma_conv_compile;
