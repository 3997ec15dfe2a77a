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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use tensortune_kernels::{Target, registry};
use tensortune_proto::convert::{status_name, target_from_device};
use tensortune_proto::pb;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::compiler::{Backend, Compiler};
use crate::config::{DeviceSpec, MEASURE_QUEUE, WorkerConfig};
use crate::held::Held;
use crate::inject::{self, Fault, INJECT_FAULTS_ENV, Injector};
use crate::link::{Link, LinkError};
use crate::measure::measure_stage;
use crate::nvrtc;
use crate::prepare::prepare_stage;
use crate::record;
use crate::reference::{Reference, ReferenceTime};
use crate::stage::{Leased, Report, Shared, TaskResult};
use crate::supervisor::Supervisor;

/// Most tasks asked for in one lease call (the tracker's limit).
const MAX_LEASE: usize = 1024;
/// A tracker that answers an empty lease at once (no long poll) is asked again after this long.
const EMPTY_LEASE_PAUSE: Duration = Duration::from_millis(250);
/// Most reports sent in one call (the tracker's limit).
const MAX_REPORTS: usize = 1024;
/// A worker leases what it can finish in this long at its measured rate (see [`Rate`]).
const LEASE_AHEAD: Duration = Duration::from_secs(2);
/// Pause before leasing again after the tracker refused a lease.
const REFUSED_LEASE_PAUSE: Duration = Duration::from_secs(5);
/// Longest a report waits after its first result for more of the worker's results (see
/// [`gathers`]). Each report call costs the tracker its share of a gRPC call and of a write
/// (issue 40: a call carried 5-6 results, and larger calls cut the tracker's CPU a task); a
/// result that waits costs its task's permit that long, and the task's record reaches the store
/// that much later. 25 ms is one result's time of a GPU pipeline at 40 configs/s (it ran 32-50
/// on an H200), so a report of a busy GPU worker takes about one more result, and it is 1/80 of
/// the [`LEASE_AHEAD`] the worker's room is sized by.
const GATHER: Duration = Duration::from_millis(25);

/// Runs the worker until `shutdown` fires (then returns `Ok`) or it cannot go on.
pub(crate) async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let faults = gpu_faults(&config)?;
    // Cancelled on shutdown, and by a stage that fails, to stop the others.
    let stop = shutdown.child_token();
    // Loading NVRTC (tens to a hundred milliseconds) overlaps the measuring child's start; the
    // library stays loaded for `prepare_run` and the compile threads.
    let nvrtc_loaded = tokio::task::spawn_blocking(nvrtc::available);
    let supervisor = tokio::select! {
        s = Supervisor::start(&config) => s?,
        _ = stop.cancelled() => return Ok(()),
    };
    let _ = nvrtc_loaded.await;
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
        templates: registry::all()
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
            // A GPU's first batch waits for its compiles; the sim's tests start many workers.
            config.device != DeviceSpec::Sim,
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
    let rate = Arc::new(Rate::new());
    let floor = config.compile_threads();
    let reporting = Reporting { held: held.clone(), drained: Arc::new(AtomicBool::new(false)) };
    stages.spawn("lease", {
        let (link, rate, stop, drained) = (link.clone(), rate.clone(), stop.clone(), reporting.drained.clone());
        async move { lease_stage(&link, room, held, &rate, &drained, floor, lease_tx, &stop).await }
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
        let reported = report_stage(&link, &rate, &reporting, report_rx).await;
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
    let backend = match nvrtc::find() {
        Ok(t) => Backend::Nvrtc { include_dir: t.include_dir, version: t.version },
        Err(why) => match config.device {
            DeviceSpec::Sim => {
                tracing::warn!("{why}; the sim device compiles nothing and reports compile_ms 0");
                Backend::Skip
            }
            _ => anyhow::bail!("{} cannot compile kernels: {why}", config.device),
        },
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

/// Leases as many tasks as there is room for, up to what the worker finishes in [`LEASE_AHEAD`]
/// (at least `floor`, what its compile pool starts at once), in one call. Sets `drained` when the
/// tracker had fewer pending tasks than asked for (see [`Reporting::drained`]).
#[allow(clippy::too_many_arguments)]
async fn lease_stage(
    link: &Link,
    room: Arc<Semaphore>,
    held: Arc<Held>,
    rate: &Rate,
    drained: &AtomicBool,
    floor: usize,
    out: mpsc::Sender<Leased>,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            p = room.clone().acquire_owned() => p.expect("the room semaphore is never closed"),
        };
        let mut permits = vec![first];
        let size = rate.lease_size(floor);
        while permits.len() < size {
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
        drained.store(tasks.len() < asked, Ordering::Relaxed);
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

/// What the report stage reads to decide whether a report waits for more results ([`gathers`]).
struct Reporting {
    /// The tasks the worker holds: while it holds none beyond a report's, no more results come.
    held: Arc<Held>,
    /// Set by the lease stage when the tracker's last lease answered fewer tasks than asked (none
    /// included): its pending tasks ran out, so the results now due may be the last ones a job
    /// waits for, and they go at once. Cleared by a lease that got all it asked for.
    drained: Arc<AtomicBool>,
}

/// Whether a report of `batch` waits (up to [`GATHER`]) for more results: not when it holds a
/// finalist task's result (a job's verdict waits on it), not when the tracker ran out of pending
/// tasks (`drained`: the job's last tasks may be due), and not when the worker holds no task
/// beyond the batch's (`held`: none is coming).
fn gathers(batch: &[Report], held: usize, drained: bool) -> bool {
    !drained && held > batch.len() && batch.iter().all(|r| matches!(r.result, TaskResult::Tuning(_)))
}

async fn report_stage(
    link: &Link,
    rate: &Rate,
    reporting: &Reporting,
    mut reports: mpsc::Receiver<Report>,
) -> anyhow::Result<()> {
    // Set once a report was abandoned at shutdown: the tracker is unreachable, so the rest are
    // abandoned without another attempt (their leases expire and the tasks are measured again).
    let mut abandoning = false;
    // Cleared when the tracker predates `ReportResults`: reports then go one per call.
    let mut batches = true;
    while let Some(first) = reports.recv().await {
        // Everything that finished while the last report was on its way goes in one call.
        let mut batch = vec![first];
        while batch.len() < MAX_REPORTS {
            match reports.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        // And what finishes within `GATHER` of the first, while more is coming (`gathers`).
        let until = tokio::time::Instant::now() + GATHER;
        while batch.len() < MAX_REPORTS
            && gathers(&batch, reporting.held.len(), reporting.drained.load(Ordering::Relaxed))
        {
            match tokio::time::timeout_at(until, reports.recv()).await {
                Ok(Some(r)) => batch.push(r),
                Ok(None) | Err(_) => break,
            }
        }
        rate.finished(batch.len());
        batch.retain(|r| !r.lease.dropped.is_cancelled());
        if abandoning || batch.is_empty() {
            continue;
        }
        if batches {
            let items: Vec<(u64, u32, &TaskResult)> =
                batch.iter().map(|r| (r.lease.task_id, r.lease.lease_serial, &r.result)).collect();
            match link.report_batch(&items).await {
                Ok(outcomes) => {
                    for (r, o) in batch.iter().zip(outcomes) {
                        match Code::from_i32(o.code) {
                            Code::Ok => reported(r, o.stored),
                            code => tracing::warn!(
                                task = r.lease.task_id,
                                "giving up on the report: the tracker refused it: {code:?}: {}",
                                o.message
                            ),
                        }
                    }
                    continue;
                }
                Err(LinkError::Refused { code: Code::Unimplemented, .. }) => {
                    tracing::info!("the tracker predates batched reports; reporting one task per call");
                    batches = false;
                }
                Err(LinkError::Cancelled) => {
                    tracing::info!(
                        tasks = batch.len(),
                        "shutting down with the tracker unreachable; abandoning unreported results"
                    );
                    abandoning = true;
                    continue;
                }
                Err(LinkError::Register(e)) => anyhow::bail!(e),
                Err(e @ LinkError::Refused { .. }) => {
                    tracing::warn!(tasks = batch.len(), "giving up on the reports: {e}");
                    continue;
                }
            }
        }
        for r in &batch {
            if abandoning {
                break;
            }
            let task = r.lease.task_id;
            let delivered = tokio::select! {
                _ = r.lease.dropped.cancelled() => continue,
                d = link.report(task, r.lease.lease_serial, &r.result) => d,
            };
            match delivered {
                Ok(stored) => reported(r, stored),
                Err(LinkError::Cancelled) => {
                    tracing::info!(task, "shutting down with the tracker unreachable; abandoning unreported results");
                    abandoning = true;
                }
                Err(LinkError::Register(e)) => anyhow::bail!(e),
                Err(e @ LinkError::Refused { .. }) => tracing::warn!(task, "giving up on the report: {e}"),
            }
        }
    }
    Ok(())
}

/// Logs a delivered report.
fn reported(r: &Report, stored: bool) {
    let task = r.lease.task_id;
    match &r.result {
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
    }
}

/// How fast this worker finishes tasks, to size its leases: a worker leases what it can finish
/// within [`LEASE_AHEAD`], so that tasks wait on the tracker for whichever worker is free rather
/// than on a slow worker that took many.
pub(crate) struct Rate {
    started: Instant,
    finished: AtomicU64,
}

impl Rate {
    fn new() -> Rate {
        Rate { started: Instant::now(), finished: AtomicU64::new(0) }
    }

    fn finished(&self, n: usize) {
        self.finished.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Tasks to lease at most now, given `floor` (what the compile pool can start at once): the
    /// tasks finished in [`LEASE_AHEAD`] at the rate so far, never fewer than `floor`.
    fn lease_size(&self, floor: usize) -> usize {
        let finished = self.finished.load(Ordering::Relaxed) as f64;
        let elapsed = self.started.elapsed().as_secs_f64().max(1.0);
        let ahead = (finished / elapsed * LEASE_AHEAD.as_secs_f64()).ceil() as usize;
        ahead.max(floor).clamp(1, MAX_LEASE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(held: &Arc<Held>, room: &Arc<Semaphore>, task_id: u64, result: TaskResult) -> Report {
        let permit = room.clone().try_acquire_owned().expect("room");
        Report { lease: held.hold(task_id, 1, permit).expect("not held yet"), result }
    }

    #[test]
    fn a_report_waits_for_more_only_while_more_tuning_results_are_coming() {
        let (held, room) = (Arc::new(Held::default()), Arc::new(Semaphore::new(8)));
        let tuning = || TaskResult::Tuning(Box::default());
        let batch = vec![report(&held, &room, 1, tuning())];
        // Another held task is still to come: wait for it, unless the tracker ran dry.
        assert!(gathers(&batch, 2, false));
        assert!(!gathers(&batch, 2, true));
        // Nothing held beyond the batch: nothing is coming.
        assert!(!gathers(&batch, 1, false));
        // A finalist task's result (a job's verdict waits on it) goes at once.
        let with_finalist =
            vec![report(&held, &room, 2, tuning()), report(&held, &room, 3, TaskResult::Finalists(vec![]))];
        assert!(!gathers(&with_finalist, 5, false));
    }
}
