//! The daemon: lease tasks, prepare them (generate, compile), measure them in the child, report.
//!
//! ```text
//! lease ──► prepare (a task per lease; NVRTC pool) ──► measure (the child) ──► report
//!               └──── invalid_config / compile_error ─────────────────────────────┘
//! heartbeat: renews the held leases, cancels the tasks the tracker drops
//! ```
//!
//! Each stage is a task owned by [`run`]'s `JoinSet`, connected by bounded channels. Back-pressure
//! comes from one semaphore: a task holds a permit from lease to report and leases ask only for
//! free permits, so at most `max_in_flight` tasks are held, and compiled tasks queue for the GPU
//! while the pool works ahead on the next ones.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use tensortune_kernels::gemm::vendor_model_us;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::{Config, KernelSpec, Layout, Matmul, Target, Workload, short_digest, template};
use tensortune_proto::convert::{status_name, target_from_device};
use tensortune_proto::pb;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::compiler::{Backend, Compiler, Image};
use crate::config::{DeviceSpec, MEASURE_QUEUE, WorkerConfig};
use crate::held::{Held, Lease};
use crate::link::{Link, LinkError};
use crate::nvrtc;
use crate::protocol::{Launch, MeasureOutcome, MeasureRequest, Status};
use crate::record::{self, Compile};
use crate::supervisor::Supervisor;

/// Minimum GPU time of one timing sample, milliseconds (the child grows the batch to reach it).
const MIN_SAMPLE_MS: f64 = 1.0;
/// Fewest launches per timing sample.
const MIN_BATCH: u32 = 50;
/// Timing samples of a task that names none (the tracker's default for jobs).
const DEFAULT_SAMPLES: u32 = 10;
/// Most tasks asked for in one lease call (the tracker's limit).
const MAX_LEASE: usize = 1024;
/// A tracker that answers an empty lease at once (no long poll) is asked again after this long.
const EMPTY_LEASE_PAUSE: Duration = Duration::from_millis(250);
/// Pause before leasing again after the tracker refused a lease.
const REFUSED_LEASE_PAUSE: Duration = Duration::from_secs(5);
/// Times the vendor baseline of a workload is asked for before records go without one (a child
/// that crashed on the first task of a workload took its baseline with it).
const BASELINE_ASKS: u32 = 3;

/// What every stage needs to know about the run.
struct Shared {
    target: Target,
    compiler: Compiler,
    provenance: pb::Provenance,
    gpu: String,
}

/// A task between lease and prepare.
struct Leased {
    task: pb::Task,
    lease: Lease,
}

/// Everything about a task that follows from the task alone.
struct Plan {
    workload: Workload,
    workload_key: String,
    spec: KernelSpec,
    samples: u32,
    model_us: f64,
    vendor_model_us: f64,
    flush_l2: bool,
}

/// A task ready for the GPU.
struct Prepared {
    lease: Lease,
    plan: Plan,
    kernel: Arc<Image>,
    support: Arc<Image>,
    compile: Compile,
}

/// A finished record on its way to the tracker.
struct Report {
    lease: Lease,
    measurement: pb::Measurement,
}

/// Runs the worker until `shutdown` fires (then returns `Ok`) or it cannot go on.
pub(crate) async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Cancelled on shutdown, and by a stage that fails, to stop the others.
    let stop = shutdown.child_token();
    let supervisor = tokio::select! {
        s = Supervisor::start(&config) => s.with_context(|| format!("opening {}", config.device))?,
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
    let link = match Link::connect(&config.tracker, registration, stop.clone()).await {
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
    stages.spawn("heartbeat", {
        let (link, held, stop) = (link.clone(), held.clone(), stop.clone());
        async move { heartbeat_stage(&link, &held, &stop).await }
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
        async move { measure_stage(supervisor, &shared, measure_rx, report_tx, &stop).await }
    });
    stages.spawn("report", async move { report_stage(&link, report_rx).await });

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

async fn heartbeat_stage(link: &Link, held: &Held, stop: &CancellationToken) -> anyhow::Result<()> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(link.heartbeat_interval()) => {}
        }
        let answered = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = link.heartbeat(held.ids()) => r,
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
            let Some(lease) = held.hold(task.task_id, permit) else {
                tracing::warn!(task = task.task_id, "the tracker leased a task this worker already holds; ignoring it");
                continue;
            };
            tracing::debug!(task = task.task_id, config = %task.config, "leased");
            if out.send(Leased { task, lease }).await.is_err() {
                return Ok(());
            }
        }
    }
}

async fn prepare_stage(
    shared: Arc<Shared>,
    mut leased: mpsc::Receiver<Leased>,
    measure: mpsc::Sender<Prepared>,
    report: mpsc::Sender<Report>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    // One task per leased task, so compiles of different tasks overlap; the lease room bounds
    // how many there are.
    let tasks = TaskTracker::new();
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => break,
            next = leased.recv() => next,
        };
        let Some(Leased { task, lease }) = next else { break };
        let span = tracing::info_span!("task", task = task.task_id, kernel = tracing::field::Empty, gpu = %shared.gpu);
        let (shared, measure, report, stop) = (shared.clone(), measure.clone(), report.clone(), stop.clone());
        tasks.spawn(async move { prepare_one(task, lease, &shared, &measure, &report, &stop).await }.instrument(span));
    }
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Generates and compiles one task; hands it to the measure stage, or reports why it cannot run.
async fn prepare_one(
    task: pb::Task,
    lease: Lease,
    shared: &Shared,
    measure: &mpsc::Sender<Prepared>,
    report: &mpsc::Sender<Report>,
    stop: &CancellationToken,
) {
    let failed = |lease: Lease, status: Status, error: String, compile: Compile| Report {
        lease,
        measurement: record::measurement(MeasureOutcome::failed(status, error), compile, &shared.provenance),
    };
    let plan = match plan(&task, &shared.target) {
        Ok(plan) => plan,
        Err(reason) => {
            tracing::info!("invalid config: {reason}");
            let _ = report.send(failed(lease, Status::InvalidConfig, reason, Compile::default())).await;
            return;
        }
    };
    tracing::Span::current().record("kernel", plan.spec.name.as_str());
    let support_name = format!("tt_support_{}", short_digest(&plan.workload_key));
    let support_source = support::source(&plan.workload);
    let (kernel, support) = tokio::select! {
        _ = stop.cancelled() => return,
        _ = lease.dropped.cancelled() => return,
        built = async {
            tokio::join!(
                shared.compiler.build(&plan.spec.name, &plan.spec.source),
                shared.compiler.build(&support_name, &support_source),
            )
        } => built,
    };
    let compile = Compile { ms: kernel.compile_ms, cache_hit: kernel.cache_hit };
    let (kernel, support) = match (kernel.image, support.image) {
        (Ok(kernel), Ok(support)) => (kernel, support),
        (Err(log), _) => {
            tracing::info!("compile error");
            let _ = report.send(failed(lease, Status::CompileError, log.to_string(), compile)).await;
            return;
        }
        (_, Err(log)) => {
            let error = format!("the support module of workload {} did not compile: {log}", plan.workload_key);
            tracing::error!("{error}");
            let _ = report.send(failed(lease, Status::CompileError, error, compile)).await;
            return;
        }
    };
    tracing::debug!(compile_ms = compile.ms, cache_hit = compile.cache_hit, "compiled");
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = measure.send(Prepared { lease, plan, kernel, support, compile }) => {}
    }
}

/// Everything that follows from the task alone; `Err` is the reason for an `invalid_config`.
fn plan(task: &pb::Task, target: &Target) -> Result<Plan, String> {
    let workload = task.workload.as_ref().ok_or_else(|| "the task has no workload".to_owned())?;
    let workload = Workload::try_from(workload).map_err(|e| format!("the task's workload is invalid: {e}"))?;
    let workload_key = workload.key();
    if task.workload_key != workload_key {
        tracing::warn!("the task's workload key {:?} differs from this worker's {workload_key:?}", task.workload_key);
    }
    let template = template::by_name(&task.template).map_err(|e| e.to_string())?;
    if task.template_version != template.version() {
        return Err(format!(
            "the task asks for {} version {}; this worker generates version {}",
            task.template,
            task.template_version,
            template.version()
        ));
    }
    let config = Config::from_json(&task.config).map_err(|e| e.to_string())?;
    template.check(&workload, &config, target).map_err(|e| e.to_string())?;
    let spec = template.generate(&workload, &config, target).map_err(|e| e.to_string())?;
    let model_us = template.model_us(&workload, &config, target).map_err(|e| e.to_string())?;
    Ok(Plan {
        vendor_model_us: vendor_time(&workload),
        workload,
        workload_key,
        spec,
        samples: task.samples,
        model_us,
        flush_l2: task.flush_l2,
    })
}

/// The analytic vendor time (what `sim` reports as its baseline).
fn vendor_time(workload: &Workload) -> f64 {
    match workload {
        Workload::Matmul(m) => vendor_model_us(m),
        Workload::Conv2d(c) => {
            // cuDNN's implicit GEMM: NHWC activations are K-contiguous (T), KRSC filters too (N).
            let (m, n, k) = c.gemm_dims();
            vendor_model_us(&Matmul { m, n, k, layout: Layout::Tn, types: c.types, alpha: 1.0, beta: 0.0 })
        }
    }
}

/// Vendor baselines of this worker run, per workload key and L2 flush (a baseline is timed the
/// way its records are). The daemon keeps them because a child restart loses the child's: every
/// record of a workload carries the same baseline.
#[derive(Default)]
struct Baselines {
    known: HashMap<(String, bool), (f64, String)>,
    asked: HashMap<(String, bool), u32>,
}

impl Baselines {
    /// Whether the next measurement of workload `key` (flushing the L2 or not) should time the
    /// vendor library.
    fn wanted(&mut self, key: &str, flush_l2: bool) -> bool {
        let key = (key.to_owned(), flush_l2);
        if self.known.contains_key(&key) {
            return false;
        }
        let asked = self.asked.entry(key).or_insert(0);
        *asked += 1;
        *asked <= BASELINE_ASKS
    }

    /// Remembers the outcome's baseline, or gives the outcome the one remembered.
    fn settle(&mut self, key: &str, flush_l2: bool, outcome: &mut MeasureOutcome) {
        let key = (key.to_owned(), flush_l2);
        match outcome.baseline_us {
            Some(us) => {
                self.known.entry(key).or_insert_with(|| (us, outcome.baseline_kind.clone()));
            }
            None => {
                if let Some((us, kind)) = self.known.get(&key) {
                    outcome.baseline_us = Some(*us);
                    outcome.baseline_kind = kind.clone();
                }
            }
        }
    }
}

async fn measure_stage(
    mut supervisor: Supervisor,
    shared: &Shared,
    mut prepared: mpsc::Receiver<Prepared>,
    report: mpsc::Sender<Report>,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let mut baselines = Baselines::default();
    let result = async {
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                next = prepared.recv() => next,
            };
            let Some(Prepared { lease, plan, kernel, support, compile }) = next else { return Ok(()) };
            if lease.dropped.is_cancelled() {
                continue;
            }
            let span =
                tracing::info_span!("measure", task = lease.task_id, kernel = %plan.spec.name, gpu = %shared.gpu);
            let request = MeasureRequest {
                task_id: lease.task_id,
                baseline: baselines.wanted(&plan.workload_key, plan.flush_l2),
                workload: plan.workload,
                tolerance: Tolerance::for_workload(&plan.workload),
                launch: Launch {
                    name: plan.spec.name,
                    entry: plan.spec.entry,
                    grid: plan.spec.grid,
                    block: plan.spec.block,
                    smem_bytes: plan.spec.smem_bytes,
                    workspace_bytes: plan.spec.workspace_bytes,
                    args: plan.spec.args,
                },
                workload_key: plan.workload_key.clone(),
                cubin: kernel.cubin.clone(),
                support_cubin: support.cubin.clone(),
                samples: if plan.samples == 0 { DEFAULT_SAMPLES } else { plan.samples },
                min_sample_ms: MIN_SAMPLE_MS,
                min_batch: MIN_BATCH,
                model_us: plan.model_us,
                vendor_model_us: plan.vendor_model_us,
                flush_l2: plan.flush_l2,
            };
            let measured = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                outcome = supervisor.measure(request).instrument(span) => outcome,
            };
            let mut outcome = measured?;
            baselines.settle(&plan.workload_key, plan.flush_l2, &mut outcome);
            let measurement = record::measurement(outcome, compile, &shared.provenance);
            if report.send(Report { lease, measurement }).await.is_err() {
                return Ok(());
            }
        }
    }
    .await;
    supervisor.shutdown().await;
    result
}

async fn report_stage(link: &Link, mut reports: mpsc::Receiver<Report>) -> anyhow::Result<()> {
    // Set once a report was abandoned at shutdown: the tracker is unreachable, so the rest are
    // abandoned without another attempt (their leases expire and the tasks are measured again).
    let mut abandoning = false;
    while let Some(Report { lease, measurement }) = reports.recv().await {
        let task = lease.task_id;
        if lease.dropped.is_cancelled() || abandoning {
            continue;
        }
        let status = status_name(measurement.status());
        let delivered = tokio::select! {
            _ = lease.dropped.cancelled() => continue,
            r = link.report(task, &measurement) => r,
        };
        match delivered {
            Ok(stored) => tracing::info!(
                task,
                status,
                median_us = measurement.median_us,
                compile_ms = measurement.compile_ms,
                cache_hit = measurement.cache_hit,
                stored,
                "reported"
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_are_asked_for_until_known_then_copied() {
        let mut b = Baselines::default();
        assert!(b.wanted("w", false));
        let mut crashed = MeasureOutcome::failed(Status::LaunchError, "boom");
        b.settle("w", false, &mut crashed);
        assert_eq!(crashed.baseline_us, None);
        assert!(b.wanted("w", false), "a baseline lost with a crashed child is asked for again");
        let mut first = MeasureOutcome::failed(Status::Ok, "");
        first.baseline_us = Some(2.5);
        first.baseline_kind = "cublasGemmEx".into();
        b.settle("w", false, &mut first);
        assert!(!b.wanted("w", false));
        let mut later = MeasureOutcome::failed(Status::Ok, "");
        b.settle("w", false, &mut later);
        assert_eq!((later.baseline_us, later.baseline_kind.as_str()), (Some(2.5), "cublasGemmEx"));
        assert!(b.wanted("other", false) && b.wanted("other", false) && b.wanted("other", false));
        assert!(!b.wanted("other", false));
    }

    #[test]
    fn a_cold_l2_baseline_is_its_own() {
        let mut b = Baselines::default();
        let mut warm = MeasureOutcome::failed(Status::Ok, "");
        warm.baseline_us = Some(2.5);
        b.settle("w", false, &mut warm);
        assert!(b.wanted("w", true), "the warm baseline does not serve cold records");
        let mut cold = MeasureOutcome::failed(Status::Ok, "");
        b.settle("w", true, &mut cold);
        assert_eq!(cold.baseline_us, None);
        cold.baseline_us = Some(4.0);
        b.settle("w", true, &mut cold);
        let mut later = MeasureOutcome::failed(Status::Ok, "");
        b.settle("w", true, &mut later);
        assert_eq!(later.baseline_us, Some(4.0));
    }
}
