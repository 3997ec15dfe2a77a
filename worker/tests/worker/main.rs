//! The worker's integration tests, one binary: each test binary links the whole dependency tree
//! (tokio, tonic, cudarc), so one binary instead of three saves two links and two builds of
//! the shared harness. Run one part with a filter: `cargo test -p tensortune-worker --test worker
//! daemon::`. NVRTC's compile tests of every template live in kernels/tests/compile, which builds
//! without the worker's dependencies (CI runs it while the rest of the workspace builds).
//!
//! - `daemon`: the daemon against a fake tracker, measuring children on `sim` (and, marked
//!   `#[ignore = "needs a GPU"]`, on `cuda:0`).
//! - `compile_process`: the compile child's frame protocol.
//! - `gpu_selftest` (all marked): FP8, fused-epilogue and fused conv kernels on `cuda:0`, every
//!   output element checked, the vendor beside each.

mod compile_process;
mod daemon;
mod gpu_selftest;
