//! Several GPUs in one process: `cuda:all` and `cuda:0,1` run one independent worker per GPU, each
//! with its own registration (`<host>/cuda:N`), measuring child, compile pool (its share of the
//! threads, [`WorkerConfig::for_gpu`]) and leases, all stopped by the same shutdown. GPUs of
//! different models register different device classes, like workers on different machines.
//!
//! A worker that fails stops only its GPU (the error is logged at once); the others go on until
//! shutdown, and [`run`] then returns every failure.

use std::collections::HashMap;

use anyhow::{Context as _, anyhow};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{DeviceSpec, WorkerConfig};
use crate::daemon;

/// Runs one worker per GPU that `config.device` names until `shutdown` fires or all have stopped.
pub(crate) async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let ordinals = tokio::select! {
        o = ordinals(&config.device) => o?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let gpus = ordinals.len();
    let list: Vec<String> = ordinals.iter().map(|n| format!("cuda:{n}")).collect();
    tracing::info!(device = %config.device, gpus, "one worker per GPU: {}", list.join(", "));
    let mut workers = JoinSet::new();
    let mut devices = HashMap::new();
    for &ordinal in &ordinals {
        let gpu = config.for_gpu(ordinal, gpus);
        let device = gpu.device.clone();
        let handle = workers.spawn(daemon::run(gpu, shutdown.clone()));
        devices.insert(handle.id(), device);
    }
    let mut failures = Vec::new();
    while let Some(joined) = workers.join_next_with_id().await {
        let (id, result) = match joined {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(anyhow!("the worker panicked: {e}"))),
        };
        let device = devices.get(&id).map_or_else(|| "a GPU".to_owned(), DeviceSpec::to_string);
        if let Err(e) = result {
            tracing::error!(gpu = %device, "the worker of {device} stopped: {e:#}; the other GPUs' workers go on");
            failures.push(format!("{device}: {e:#}"));
        }
    }
    match failures.len() {
        0 => Ok(()),
        n => Err(anyhow!("{n} of {gpus} GPU workers failed:\n{}", failures.join("\n"))),
    }
}

/// The GPU ordinals a spec names; `cuda:all` asks the driver how many it sees.
async fn ordinals(spec: &DeviceSpec) -> anyhow::Result<Vec<usize>> {
    match spec {
        DeviceSpec::CudaAll => {
            let count = tokio::task::spawn_blocking(crate::cuda::device_count)
                .await
                .context("counting GPUs")?
                .context("cuda:all")?;
            if count == 0 {
                anyhow::bail!("cuda:all: the CUDA driver sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
            }
            Ok((0..count).collect())
        }
        DeviceSpec::CudaSet(ordinals) => Ok(ordinals.clone()),
        DeviceSpec::Cuda(n) => Ok(vec![*n]),
        DeviceSpec::Sim => Err(anyhow!("sim is one device; it runs without the per-GPU fleet")),
    }
}
