//! The types the daemon's stages pass to each other (lease -> prepare -> measure -> report), apart
//! from the stages themselves: `daemon` wires the stages, `prepare` and `measure` are stages, and
//! each imports these from here rather than from another stage.

use tensortune_kernels::Target;
use tensortune_proto::pb;

use crate::compiler::Compiler;
use crate::held::Lease;

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

/// What a task's report carries.
#[derive(Clone, Debug)]
pub(crate) enum TaskResult {
    /// The record of a tuning task.
    Tuning(Box<pb::Measurement>),
    /// The records of a finalist task, one per config in the task's order.
    Finalists(Vec<pb::Measurement>),
}

impl TaskResult {
    /// The report of task `task_id` (lease `lease_serial`) carrying this result.
    pub(crate) fn request(&self, worker_id: u64, task_id: u64, lease_serial: u32) -> pb::ReportResultRequest {
        let (measurement, finalist_measurements) = match self {
            TaskResult::Tuning(m) => (Some(pb::Measurement::clone(m)), Vec::new()),
            TaskResult::Finalists(ms) => (None, ms.clone()),
        };
        pb::ReportResultRequest { worker_id, task_id, measurement, finalist_measurements, lease_serial }
    }
}
