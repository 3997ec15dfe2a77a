//! The prepare stage: one async task per leased task generates its kernel and compiles it, with
//! the workload's support module, on the NVRTC pool, then queues it for the GPU; a config that
//! cannot run (`invalid_config`) or does not compile (`compile_error`) is reported from here,
//! without touching the GPU.

use std::sync::Arc;

use tensortune_kernels::support;
use tensortune_proto::pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::compiler::Image;
use crate::daemon::{Leased, Report, Shared};
use crate::held::Lease;
use crate::plan::{Plan, Sampling, Subject};
use crate::protocol::{MeasureOutcome, Status};
use crate::record::{self, Compile};

/// A task ready for the GPU.
pub(crate) struct Prepared {
    pub(crate) lease: Lease,
    pub(crate) plan: Plan,
    pub(crate) kernel: Arc<Image>,
    pub(crate) support: Arc<Image>,
    pub(crate) compile: Compile,
}

pub(crate) async fn prepare_stage(
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
    let plan =
        Subject::of_task(&task).and_then(|s| s.plan_json(&task.config, Sampling::of_task(&task), &shared.target));
    let plan = match plan {
        Ok(plan) => plan,
        Err(reason) => {
            tracing::info!("invalid config: {reason}");
            let _ = report.send(failed(lease, Status::InvalidConfig, reason, Compile::default())).await;
            return;
        }
    };
    tracing::Span::current().record("kernel", plan.spec.name.as_str());
    let support_name = plan.support_name();
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
