//! Search over kernel spaces: which configs to measure next, and how to compare strategies
//! without a GPU. Used by the tracker (job tuners) and the CLI (`tensortune replay`).
//!
//! # Layout
//!
//! - [`features`]: feature rows of (workload, config) for cost models.
//! - [`model`]: the learned cost model (gradient-boosted trees) and target normalisation.
//! - [`tuner`]: the `Tuner` trait and the random, grid and model-guided tuners (transfer,
//!   diversity, exploration, local moves, evolutionary pool for large spaces).
//! - [`schedule`]: trials across the workloads of a job, by expected gain.
//! - [`records`]: one line of a record file (exports, shipped packs, sweeps).
//! - [`replay`]: tuners against recorded measurements; trials to within 5% / 2% of the true best.

pub mod features;
pub mod model;
pub mod records;
pub mod replay;
pub mod schedule;
pub mod tuner;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tuner name this build does not know.
    #[error("unknown tuner {0:?}; known: random, grid, model, autotvm")]
    UnknownTuner(String),
    /// The cost model could not be fitted.
    #[error("cost model: {0}")]
    Model(String),
    /// A record file that cannot be replayed.
    #[error("{0}")]
    Data(String),
    /// From the kernels crate (features of a config).
    #[error(transparent)]
    Kernels(#[from] tensortune_kernels::Error),
}
