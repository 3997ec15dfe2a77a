//! A tensortune export bundle: the best kernels of some workloads, per device class, as a
//! directory a program can use without tensortune. `tensortune export` writes it; this crate reads
//! it, picks the kernel for a shape and a GPU, and launches it through the CUDA driver API
//! (cudarc). `tensortune_bundle.h` does the same from C.
//!
//! # Layout
//!
//! - [`manifest`]: the format of `manifest.json` (and of `index.txt`, its line-based copy for C).
//! - [`select`]: which entry answers a problem on a device: exact, else the nearest tuned shape.
//! - [`launch`]: loading an entry's cubin and launching it on a stream (needs a GPU).
//!
//! A bundle directory holds `manifest.json`, `index.txt`, and per kernel `<name>.cu` and
//! `<name>.<arch>.cubin` (e.g. `sm_90a`).

pub mod launch;
pub mod manifest;
pub mod select;
#[cfg(test)]
mod tests;

pub use launch::{LoadedKernel, MapParam, Operands, encode_map};
pub use manifest::{
    Activation, Bundle, ConvEpilogue, DType, Device, Entry, Im2colRecipe, Launch, Layout, MapRecipe, Operand, Param,
    Problem,
};
pub use select::{Selection, select};

use std::path::PathBuf;

/// Why a bundle could not be read or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the bundle could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `manifest.json` is not a manifest this crate reads.
    #[error("{path} is not a tensortune bundle manifest: {message}")]
    Manifest {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The entry has no cubin for the GPU.
    #[error("kernel {kernel} has no cubin for sm_{arch} (it has: {have}); export it from a record of this GPU's class")]
    NoCubin {
        /// The entry.
        kernel: String,
        /// The GPU's compute capability (90 for sm_90).
        arch: u32,
        /// The architectures it has.
        have: String,
    },
    /// A CUDA driver call failed.
    #[error("{context}: {source:?}")]
    Cuda {
        /// What was being done.
        context: String,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// A launch was asked with operands the entry cannot take.
    #[error("{0}")]
    Operands(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
