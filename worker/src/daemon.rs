//! The daemon of one device: lease tasks, prepare them (generate, compile), measure them in the
//! child, report.
//!
//! ```text
//! lease ──► prepare (a task per lease; NVRTC pool) ──► measure (the child) ──► report
//!               └──── invalid_config / compile_error ─────────────────────────────┘
//! heartbeat: renews the held leases, cancels the tasks the tracker drops, carries the drift
//!            reference's latest time (timed by the measure stage between tasks)
//! ```
//!
//! A task is a tuning task (one config, one measurement) or a finalist task (several configs,
//! measured in interleaved rounds; see `finalist`). The prepare stage lives in `prepare`, the
//! measure stage in `measure`, what follows from a task alone in `plan`. Each stage is a task owned
//! by [`run`]'s `JoinSet`, connected by bounded channels. Back-pressure comes from one semaphore: a
//! task holds a permit from lease to report and leases ask only for free permits, so at most
//! `max_in_flight` tasks are held, and compiled tasks queue for the GPU while the pool works ahead
//! on the next ones.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use tensortune_kernels::{Target, template};
use tensortune_proto::convert::{status_name, target_from_device};
use tensortune_proto::pb;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::compiler::{Backend, Compiler};
use crate::config::{DeviceSpec, MEASURE_QUEUE, WorkerConfig};
use crate::held::{Held, Lease};
use crate::inject::{self, Fault, INJECT_FAULTS_ENV, Injector};
use crate::link::{Link, LinkError, TaskResult};
use crate::measure::measure_stage;
use crate::nvrtc;
use crate::prepare::prepare_stage;
use crate::record;
use crate::reference::{Reference, ReferenceTime};
use crate::supervisor::Supervisor;

/// Most tasks asked for in one lease call (the tracker's limit).
const MAX_LEASE: usize = 1024;
/// A tracker that answers an empty lease at once (no long poll) is asked again after this long.
const EMPTY_LEASE_PAUSE: Duration = Duration::from_millis(250);
/// Pause before leasing again after the tracker refused a lease.
const REFUSED_LEASE_PAUSE: Duration = Duration::from_secs(5);

/// What every stage needs to know about the run.
pub(crate) struct Shared {
    pub(crate) target: Target,
    pub(crate) compiler: Compiler,
    pub(crate) provenance: pb::Provenance,
    /// The device, for logs.
    pub(crate) gpu: String,
}

/// A task between lease and prepare.
pub(crate) struct Leased {
    pub(crate) task: pb::Task,
    pub(crate) lease: Lease,
}

/// A finished task on its way to the tracker.
pub(crate) struct Report {
    pub(crate) lease: Lease,
    pub(crate) result: TaskResult,
}

/// Runs the worker until `shutdown` fires (then returns `Ok`) or it cannot go on.
pub(crate) async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let faults = gpu_faults(&config)?;
    // Cancelled on shutdown, and by a stage that fails, to stop the others.
    let stop = shutdown.child_token();
    let supervisor = tokio::select! {
        s = Supervisor::start(&config) => s?,
        _ = stop.cancelled() => return Ok(()),
    };
    let device = record::device_info(supervisor.facts(), nvrtc::version());
    let (target, backend) = match prepare_run(&config, &device) {
        Ok(p) => p,
        Err(e) => {
            supervisor.shutdown().await;
            return Err(e);
        }
    };
    let name = config.worker_name();
    let registration = pb::RegisterRequest {
        name: name.clone(),
        device: Some(device.clone()),
        templates: template::all()
            .iter()
            .map(|t| pb::TemplateRef { name: t.name().to_owned(), version: t.version() })
            .collect(),
        previous_id: 0,
    };
    let link = match Link::connect(&config.tracker, &config.access, registration, stop.clone()).await {
        Ok(link) => Arc::new(link),
        Err(e) => {
            supervisor.shutdown().await;
            return if stop.is_cancelled() { Ok(()) } else { Err(e) };
        }
    };
    let gpu = config.device.to_string();
    tracing::info!(
        gpu = %gpu,
        worker_id = link.worker_id(),
        device = %device.name,
        class = %device.class_key,
        arch = %target.nvrtc_arch(),
        compile_threads = config.compile_threads(),
        max_in_flight = config.max_in_flight(),
        "worker {name} is ready"
    );
    let shared = Arc::new(Shared {
        compiler: Compiler::new(
            backend,
            target.nvrtc_arch(),
            config.compile_threads(),
            config.cache_dir.as_deref(),
            config.child_command.first().cloned(),
        ),
        target,
        provenance: record::provenance(&name, &device),
        gpu,
    });

    let room = Arc::new(Semaphore::new(config.max_in_flight()));
    let held = Arc::new(Held::default());
    let (lease_tx, lease_rx) = mpsc::channel(config.max_in_flight());
    let (measure_tx, measure_rx) = mpsc::channel(MEASURE_QUEUE);
    let (report_tx, report_rx) = mpsc::channel(config.max_in_flight());

    let mut stages = Stages::default();
    let reference_time = Arc::new(ReferenceTime::default());
    let reference = Reference::new(&shared.target, reference_time.clone(), &shared.gpu);
    stages.spawn("heartbeat", {
        let (link, held, stop) = (link.clone(), held.clone(), stop.clone());
        async move { heartbeat_stage(&link, &held, &reference_time, &stop).await }
    });
    stages.spawn("lease", {
        let (link, stop) = (link.clone(), stop.clone());
        async move { lease_stage(&link, room, held, lease_tx, &stop).await }
    });
    stages.spawn("prepare", {
        let (shared, report_tx, stop) = (shared.clone(), report_tx.clone(), stop.clone());
        prepare_stage(shared, lease_rx, measure_tx, report_tx, stop)
    });
    stages.spawn("measure", {
        let (shared, stop) = (shared.clone(), stop.clone());
        let injector = Injector::new(faults);
        async move { measure_stage(supervisor, &shared, measure_rx, report_tx, reference, injector, &stop).await }
    });
    stages.spawn("report", async move {
        let reported = report_stage(&link, report_rx).await;
        // Every earlier stage is gone (the report channel closed): hand back what is still held.
        leave(&link).await;
        reported
    });

    let mut failure = None;
    while let Some((stage, result)) = stages.join_next().await {
        if let Err(e) = result {
            tracing::error!("the {stage} stage failed: {e:#}");
            failure.get_or_insert(e.context(format!("the worker's {stage} stage failed")));
            stop.cancel();
        }
    }
    shared.compiler.close().await;
    tracing::info!("worker {name} stopped");
    failure.map_or(Ok(()), Err)
}

/// The stage tasks of a run, by name.
#[derive(Default)]
struct Stages {
    set: JoinSet<anyhow::Result<()>>,
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Stages {
    fn spawn(&mut self, name: &'static str, stage: impl Future<Output = anyhow::Result<()>> + Send + 'static) {
        let handle = self.set.spawn(stage);
        self.names.insert(handle.id(), name);
    }

    /// The next stage to end, with its result (a panic is an error).
    async fn join_next(&mut self) -> Option<(&'static str, anyhow::Result<()>)> {
        let (id, result) = match self.set.join_next_with_id().await? {
            Ok((id, result)) => (id, result),
            Err(e) => (e.id(), Err(anyhow!("the stage panicked: {e}"))),
        };
        Some((self.names.get(&id).copied().unwrap_or("unknown"), result))
    }
}

/// The GPU faults to inject (see `inject`), announced loudly; none on `sim`.
fn gpu_faults(config: &WorkerConfig) -> anyhow::Result<Vec<Fault>> {
    let faults = inject::from_env().map_err(|e| anyhow!(e))?;
    if faults.is_empty() {
        return Ok(faults);
    }
    let list: Vec<String> = faults.iter().map(Fault::to_string).collect();
    let list = list.join(",");
    if config.device == DeviceSpec::Sim {
        tracing::warn!("{INJECT_FAULTS_ENV}={list} is ignored on sim, which runs no kernel (sim faults are SimFaults)");
        return Ok(Vec::new());
    }
    tracing::warn!(
        gpu = %config.device,
        "{INJECT_FAULTS_ENV}={list}: INJECTING FAULTS into this worker's tuning tasks (counted from 1 as they are \
         sent to the child); their records will say launch_error or timeout by design"
    );
    Ok(faults)
}

/// The target kernels are generated for, and how they are compiled, on this device.
fn prepare_run(config: &WorkerConfig, device: &pb::DeviceInfo) -> anyhow::Result<(Target, Backend)> {
    let target =
        target_from_device(device).map_err(|e| anyhow!("{} reports an unusable device: {e}", config.device))?;
    let backend = match (nvrtc::version(), nvrtc::find_include_dir()) {
        (Some(version), Some(include_dir)) => Backend::Nvrtc { include_dir, version },
        (version, _) => {
            let why = if version.is_none() {
                "libnvrtc.so.13 could not be loaded (put its directory on LD_LIBRARY_PATH; scripts/setup-nvrtc.sh installs it)"
            } else {
                "the CUDA headers (mma.h, cuda_fp16.h) were not found (set TENSORTUNE_CUDA_INCLUDE or CUDA_HOME)"
            };
            match config.device {
                DeviceSpec::Sim => {
                    tracing::warn!("{why}; the sim device compiles nothing and reports compile_ms 0");
                    Backend::Skip
                }
                _ => anyhow::bail!("{} cannot compile kernels: {why}", config.device),
            }
        }
    };
    Ok((target, backend))
}

async fn heartbeat_stage(
    link: &Link,
    held: &Held,
    reference: &ReferenceTime,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(link.heartbeat_interval()) => {}
        }
        let answered = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = link.heartbeat(held.ids(), reference.get()) => r,
        };
        match answered {
            Ok(drop_ids) => {
                for task in drop_ids {
                    if held.drop_task(task) {
                        tracing::info!(task, "the tracker dropped the task; abandoning it");
                    }
                }
            }
            Err(LinkError::Cancelled) => return Ok(()),
            Err(LinkError::Register(e)) => anyhow::bail!(e),
            Err(e) => tracing::warn!("heartbeat: {e}"),
        }
    }
}

async fn lease_stage(
    link: &Link,
    room: Arc<Semaphore>,
    held: Arc<Held>,
    out: mpsc::Sender<Leased>,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            p = room.clone().acquire_owned() => p.expect("the room semaphore is never closed"),
        };
        let mut permits = vec![first];
        while permits.len() < MAX_LEASE {
            match room.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let asked = permits.len();
        let started = Instant::now();
        let leased = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = link.lease(asked as u32) => r,
        };
        let tasks = match leased {
            Ok(tasks) => tasks,
            Err(LinkError::Cancelled) => return Ok(()),
            Err(LinkError::Register(e)) => anyhow::bail!(e),
            Err(e) => {
                tracing::warn!("leasing tasks: {e}; trying again in {} s", REFUSED_LEASE_PAUSE.as_secs());
                drop(permits);
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(REFUSED_LEASE_PAUSE) => continue,
                }
            }
        };
        if tasks.is_empty() {
            drop(permits);
            if let Some(rest) = EMPTY_LEASE_PAUSE.checked_sub(started.elapsed()) {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(rest) => {}
                }
            }
            continue;
        }
        if tasks.len() > asked {
            tracing::warn!(
                "the tracker leased {} tasks when {asked} were asked for; the extra ones will expire",
                tasks.len()
            );
        }
        for (task, permit) in tasks.into_iter().zip(permits) {
            let Some(lease) = held.hold(task.task_id, task.lease_serial, permit) else {
                tracing::warn!(task = task.task_id, "the tracker leased a task this worker already holds; ignoring it");
                continue;
            };
            tracing::debug!(task = task.task_id, config = %task.config, finalists = task.finalist_configs.len(), "leased");
            if out.send(Leased { task, lease }).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Hands the tasks the worker still holds back to the tracker in one call (shutdown, or a stage
/// that failed): another worker can lease them at once.
async fn leave(link: &Link) {
    match link.leave().await {
        Ok(Some(released)) => tracing::info!(released, "handed the tasks still held back to the tracker"),
        Ok(None) => tracing::info!("the tracker predates Leave; the tasks still held wait for their leases to expire"),
        Err(e) => tracing::warn!("handing the held tasks back failed ({e}); they wait for their leases to expire"),
    }
}

async fn report_stage(link: &Link, mut reports: mpsc::Receiver<Report>) -> anyhow::Result<()> {
    // Set once a report was abandoned at shutdown: the tracker is unreachable, so the rest are
    // abandoned without another attempt (their leases expire and the tasks are measured again).
    let mut abandoning = false;
    while let Some(Report { lease, result }) = reports.recv().await {
        let task = lease.task_id;
        if lease.dropped.is_cancelled() || abandoning {
            continue;
        }
        let delivered = tokio::select! {
            _ = lease.dropped.cancelled() => continue,
            r = link.report(task, lease.lease_serial, &result) => r,
        };
        match delivered {
            Ok(stored) => match &result {
                TaskResult::Tuning(m) => tracing::info!(
                    task,
                    status = status_name(m.status()),
                    median_us = m.median_us,
                    compile_ms = m.compile_ms,
                    cache_hit = m.cache_hit,
                    stored,
                    "reported"
                ),
                TaskResult::Finalists(ms) => {
                    let outcomes: Vec<String> = ms
                        .iter()
                        .map(|m| match m.status() {
                            pb::RecordStatus::Ok => format!("{:.3} us", m.median_us),
                            other => status_name(other).to_owned(),
                        })
                        .collect();
                    tracing::info!(task, finalists = %outcomes.join(", "), stored, "reported the finalists");
                }
            },
            Err(LinkError::Cancelled) => {
                tracing::info!(task, "shutting down with the tracker unreachable; abandoning unreported results");
                abandoning = true;
            }
            Err(LinkError::Register(e)) => anyhow::bail!(e),
            Err(e @ LinkError::Refused { .. }) => tracing::warn!(task, "giving up on the report: {e}"),
        }
    }
    Ok(())
}
