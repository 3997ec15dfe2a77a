//! The tensortune worker daemon: leases tasks from the tracker, generates and compiles kernels on a
//! CPU pool, measures them on a GPU (or the `sim` device) in a child process, reports records.
//!
//! # Layout
//!
//! - `config`: [`WorkerConfig`] and [`DeviceSpec`] (`cuda:N`, `cuda:0,1`, `cuda:all` or `sim`).
//! - `daemon`: [`run`]'s stages (lease, prepare, measure, report, heartbeat) and how they connect;
//!   `plan`: what follows from a task alone; `prepare`: generation and compilation of a task;
//!   `measure`: the stage that drives the measuring child; `finalist`: how the interleaved rounds of
//!   a finalist task combine into its records; `reference`: the drift reference kernel and its
//!   cadence.
//! - `stage`: the types the stages pass to each other (`Shared`, `Leased`, `Report`, `TaskResult`).
//! - `fleet`: one worker per GPU in one process (`cuda:all`, `cuda:0,1`).
//! - `link`: the tracker's `Dispatch` service, with retries and re-registration.
//! - `held`: the tasks a worker holds (back-pressure permits, heartbeat list, drop tokens).
//! - `compiler`: NVRTC on dedicated threads; the memory and disk cache of compiled images.
//! - `supervisor`: the daemon's side of the measuring child (start, deadline, replacement).
//! - `child`: the child's side, [`child_main`]; `frame`: the length-prefixed JSON frames between.
//! - `record`: device info and measurement records as the tracker receives them.
//! - [`protocol`]: the daemon <-> child contract and the `Executor` trait of device backends.
//! - [`sim`]: the `sim` backend (analytic timings, fault injection for tests).
//! - `inject`: fault injection on a real GPU (`TENSORTUNE_INJECT_FAULTS`), for tests of isolation.
//! - [`cuda`]: the `cuda` backend (cudarc) that runs in the child.
//! - [`energy`]: energy per launch, power and the steady state from polled NVML readings (pure).
//! - [`nvrtc`]: NVRTC compilation to cubins (the `tensortune-nvrtc` crate, re-exported).
//! - [`selftest`]: every template checked on one device in this process (`tensortune selftest`).
//!
//! Binaries embedding the worker call [`child_main`] when their first argument is [`CHILD_ARG`]
//! (before parsing flags), so that the same executable can serve as the measuring child.

mod compile_child;
pub mod cuda;
pub mod energy;
pub mod params;
pub mod protocol;
pub mod selftest;
pub mod sim;

pub use tensortune_nvrtc as nvrtc;

mod child;
mod compiler;
mod config;
mod daemon;
mod finalist;
mod fleet;
mod frame;
mod held;
mod inject;
mod link;
mod measure;
mod plan;
mod prepare;
mod record;
mod reference;
mod stage;
mod supervisor;

pub use child::child_main;
pub use compile_child::{COMPILE_CHILD_ARG, compile_child_main};
pub use config::{
    CHILD_ARG, DeviceSpec, DeviceSpecError, MEASURE_QUEUE, WorkerConfig, default_cache_dir, default_child_command,
};
pub use sim::{SimFault, SimFaultKind};

use tensortune_proto::pb;
use tokio_util::sync::CancellationToken;

/// Runs the worker until `shutdown` is cancelled (then returns `Ok` after stopping its child) or
/// it cannot go on: the device cannot be opened, NVRTC is missing on a `cuda` device, the tracker
/// refuses the registration, or no fresh measuring child can be started.
///
/// With several GPUs (`cuda:all`, `cuda:0,1`) it runs one worker per GPU until `shutdown`; one
/// that cannot go on stops alone, and the error lists every GPU whose worker failed.
pub async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    if config.device.is_single() { daemon::run(config, shutdown).await } else { fleet::run(config, shutdown).await }
}

/// Starts a measuring child, asks it for its device, stops it, and returns the device as the
/// tracker would see it (class key, limits, provenance, this process's NVRTC version). For
/// several GPUs, the first one's.
pub async fn probe(config: &WorkerConfig) -> anyhow::Result<pb::DeviceInfo> {
    let config = WorkerConfig { device: config.device.first(), ..config.clone() };
    let supervisor = supervisor::Supervisor::start(&config).await?;
    let device = record::device_info(supervisor.facts(), nvrtc::version());
    supervisor.shutdown().await;
    Ok(device)
}
