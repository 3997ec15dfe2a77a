//! The prepare stage: one async task per leased task generates its kernels and compiles them, with
//! the workload's support module, on the NVRTC pool, then queues the task for the GPU. A config
//! that cannot run (`invalid_config`) or does not compile (`compile_error`) is settled here,
//! without touching the GPU; a task with nothing left to measure is reported from here.

use std::sync::Arc;

use tensortune_proto::pb;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::compiler::{Build, Image};
use crate::held::Lease;
use crate::plan::{Plan, Sampling, Subject, support_module};
use crate::protocol::{MeasureOutcome, Status};
use crate::record::{self, Compile};
use crate::stage::{Leased, Report, Shared, TaskResult};

/// A task ready for the GPU.
pub(crate) struct Prepared {
    pub(crate) lease: Lease,
    /// The workload's support module.
    pub(crate) support: Arc<Image>,
    pub(crate) work: Work,
}

/// What the measure stage does with a prepared task.
pub(crate) enum Work {
    /// A tuning task: its config, measured once.
    Tuning(Box<Kernel>),
    /// A finalist task: its configs in task order, each measured `rounds` times, interleaved.
    Finalists { finalists: Vec<Candidate>, rounds: u32 },
}

/// A config whose kernel compiled.
pub(crate) struct Kernel {
    pub(crate) plan: Plan,
    pub(crate) image: Arc<Image>,
    pub(crate) compile: Compile,
}

/// A config of a task: compiled, or settled before the GPU.
pub(crate) enum Candidate {
    /// Its kernel compiled: it goes to the GPU.
    Ready(Kernel),
    /// It cannot run or did not compile.
    Settled(Settled),
}

/// The outcome of a config that never reaches the GPU.
pub(crate) struct Settled {
    pub(crate) outcome: MeasureOutcome,
    pub(crate) compile: Compile,
}

impl Settled {
    fn new(status: Status, error: impl Into<String>, compile: Compile) -> Settled {
        Settled { outcome: MeasureOutcome::failed(status, error), compile }
    }

    fn record(self, provenance: &pb::Provenance) -> pb::Measurement {
        record::measurement(self.outcome, self.compile, provenance)
    }
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
        let out = Out { measure, report, stop };
        if task.finalist_configs.is_empty() {
            tasks.spawn(async move { prepare_one(task, lease, &shared, &out).await }.instrument(span));
        } else {
            tasks.spawn(async move { prepare_finalists(task, lease, shared, &out).await }.instrument(span));
        }
    }
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Where a prepared task goes.
struct Out {
    measure: mpsc::Sender<Prepared>,
    report: mpsc::Sender<Report>,
    stop: CancellationToken,
}

impl Out {
    async fn measure(&self, prepared: Prepared) {
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = self.measure.send(prepared) => {}
        }
    }

    async fn report(&self, lease: Lease, result: TaskResult) {
        let _ = self.report.send(Report { lease, result }).await;
    }
}

/// Generates and compiles a tuning task; hands it to the measure stage, or reports why it cannot
/// run.
async fn prepare_one(task: pb::Task, lease: Lease, shared: &Shared, out: &Out) {
    let settled = |lease: Lease, settled: Settled| {
        out.report(lease, TaskResult::Tuning(Box::new(settled.record(&shared.provenance))))
    };
    let plan =
        Subject::of_task(&task).and_then(|s| s.plan_json(&task.config, Sampling::of_task(&task), &shared.target));
    let plan = match plan {
        Ok(plan) => plan,
        Err(reason) => {
            tracing::info!("invalid config: {reason}");
            settled(lease, Settled::new(Status::InvalidConfig, reason, Compile::default())).await;
            return;
        }
    };
    tracing::Span::current().record("kernel", plan.spec.name.as_str());
    let (support_name, support_source) = support_module(&plan.workload, &plan.workload_key);
    let (kernel, support) = tokio::select! {
        _ = out.stop.cancelled() => return,
        _ = lease.dropped.cancelled() => return,
        built = async {
            tokio::join!(
                shared.compiler.build(&plan.spec.name, &plan.spec.source),
                shared.compiler.build(&support_name, &support_source),
            )
        } => built,
    };
    let support = match support.image {
        Ok(support) => support,
        Err(log) => {
            let compile = Compile { ms: kernel.compile_ms, cache_hit: kernel.cache_hit };
            settled(lease, support_failed(&plan.workload_key, &log, compile)).await;
            return;
        }
    };
    match compiled(plan, kernel) {
        Candidate::Ready(kernel) => {
            out.measure(Prepared { lease, support, work: Work::Tuning(Box::new(kernel)) }).await
        }
        Candidate::Settled(failed) => settled(lease, failed).await,
    }
}

/// Generates and compiles every config of a finalist task (concurrently, on the pool); hands the
/// task to the measure stage, or reports it when no config is left to measure. A config that is
/// invalid or does not compile is settled alone; the others go on.
async fn prepare_finalists(task: pb::Task, lease: Lease, shared: Arc<Shared>, out: &Out) {
    let configs = task.finalist_configs.len();
    let rounds = task.rounds.max(1);
    tracing::info!(finalists = configs, rounds, "finalist task");
    let all_settled = |lease: Lease, status: Status, error: &str| {
        let records =
            (0..configs).map(|_| Settled::new(status, error, Compile::default()).record(&shared.provenance)).collect();
        out.report(lease, TaskResult::Finalists(records))
    };
    let subject = match Subject::of_task(&task) {
        Ok(subject) => subject,
        Err(reason) => {
            tracing::info!("invalid finalist task: {reason}");
            all_settled(lease, Status::InvalidConfig, &reason).await;
            return;
        }
    };
    let sampling = Sampling::of_task(&task);
    // Each finalist is of its own template (a job may search several); a task from a tracker that
    // predates `finalist_templates` has them all of the task's.
    let plans: Vec<Result<Plan, String>> = task
        .finalist_configs
        .iter()
        .enumerate()
        .map(|(i, config)| match task.finalist_templates.get(i) {
            Some(t) => subject.with_template(&t.name, t.version)?.plan_json(config, sampling, &shared.target),
            None => subject.plan_json(config, sampling, &shared.target),
        })
        .collect();

    let mut builds = JoinSet::new();
    for (i, plan) in plans.iter().enumerate() {
        if let Ok(plan) = plan {
            let (shared, name, source) = (shared.clone(), plan.spec.name.clone(), plan.spec.source.clone());
            builds.spawn(async move { (i, shared.compiler.build(&name, &source).await) });
        }
    }
    let (support_name, support_source) = support_module(&subject.workload, &subject.workload_key);
    let (support, mut built) = tokio::select! {
        _ = out.stop.cancelled() => return,
        _ = lease.dropped.cancelled() => return,
        built = async {
            tokio::join!(shared.compiler.build(&support_name, &support_source), async {
                let mut built: Vec<Option<Build>> = (0..configs).map(|_| None).collect();
                while let Some(joined) = builds.join_next().await {
                    if let Ok((i, build)) = joined {
                        built[i] = Some(build);
                    }
                }
                built
            })
        } => built,
    };
    let support = match support.image {
        Ok(support) => support,
        Err(log) => {
            let settled = support_failed(&subject.workload_key, &log, Compile::default());
            all_settled(lease, Status::CompileError, &settled.outcome.error).await;
            return;
        }
    };
    let finalists: Vec<Candidate> = plans
        .into_iter()
        .zip(&mut built)
        .map(|(plan, build)| match (plan, build.take()) {
            (Err(reason), _) => Candidate::Settled(Settled::new(Status::InvalidConfig, reason, Compile::default())),
            (Ok(plan), Some(build)) => compiled(plan, build),
            (Ok(plan), None) => Candidate::Settled(Settled::new(
                Status::CompileError,
                format!("the compile of {} was lost (the pool stopped)", plan.spec.name),
                Compile::default(),
            )),
        })
        .collect();
    if finalists.iter().any(|f| matches!(f, Candidate::Ready(_))) {
        out.measure(Prepared { lease, support, work: Work::Finalists { finalists, rounds } }).await;
    } else {
        let records = finalists
            .into_iter()
            .filter_map(|f| match f {
                Candidate::Settled(settled) => Some(settled.record(&shared.provenance)),
                Candidate::Ready(_) => None,
            })
            .collect();
        out.report(lease, TaskResult::Finalists(records)).await;
    }
}

/// The config's kernel, or its `compile_error`.
fn compiled(plan: Plan, build: Build) -> Candidate {
    let compile = Compile { ms: build.compile_ms, cache_hit: build.cache_hit };
    match build.image {
        Ok(image) => {
            tracing::debug!(kernel = %plan.spec.name, compile_ms = compile.ms, cache_hit = compile.cache_hit, "compiled");
            Candidate::Ready(Kernel { plan, image, compile })
        }
        Err(log) => {
            tracing::info!(kernel = %plan.spec.name, "compile error");
            Candidate::Settled(Settled::new(Status::CompileError, log.to_string(), compile))
        }
    }
}

/// The `compile_error` of every config of a workload whose support module did not compile.
fn support_failed(workload_key: &str, log: &str, compile: Compile) -> Settled {
    let error = format!("the support module of workload {workload_key} did not compile: {log}");
    tracing::error!("{error}");
    Settled::new(Status::CompileError, error, compile)
}
