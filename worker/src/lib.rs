//! The tensortune worker daemon: leases tasks from the tracker, generates and compiles kernels on a
//! CPU pool, measures them on a GPU (or the `sim` device) in a child process, reports records.
//!
//! # Layout
//!
//! - [`protocol`]: the daemon <-> child contract and the `Executor` trait of device backends.
//! - [`nvrtc`]: NVRTC compilation to cubins.
//! - [`cuda`]: the `cuda` backend (cudarc) that runs in the child.
pub mod cuda;
pub mod nvrtc;
pub mod protocol;
