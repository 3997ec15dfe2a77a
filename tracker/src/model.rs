//! Domain types of the tracker: what the store reads and writes and the services convert to and
//! from the wire. Prost types never get past the service layer; these do.

use serde::{Deserialize, Serialize};
use tensortune_kernels::energy::{Objective, Regime};
use tensortune_kernels::{Template, Workload};

use crate::tuner::TunerKind;

/// Row id of a job.
pub(crate) type JobId = i64;
/// Row id of a task.
pub(crate) type TaskId = i64;
/// Row id of a worker.
pub(crate) type WorkerId = i64;
/// Row id of a record.
pub(crate) type RecordId = i64;

/// Milliseconds since the Unix epoch (the tracker's clock, as stored).
pub(crate) fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Lifecycle of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Submitted; no task leased yet.
    Queued,
    /// At least one task was leased.
    Running,
    /// Every workload reached its target (or stopped early).
    Done,
    /// Cancelled by request.
    Cancelled,
    /// Cannot continue (e.g. its template left this build).
    Failed,
}

impl JobState {
    /// Whether the job will never change again.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Cancelled | JobState::Failed)
    }

    /// Lowercase name, as stored.
    pub(crate) fn name(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Cancelled => "cancelled",
            JobState::Failed => "failed",
        }
    }
}

/// Progress state of one workload of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkloadState {
    /// Still proposing or measuring.
    Running,
    /// Tuning ended; its finalists are being re-measured before it names its winner.
    Finalizing,
    /// Measured the trials it asked for.
    Done,
    /// Its best stopped improving.
    EarlyStopped,
    /// Measured every valid config, fewer than the trials asked for.
    Exhausted,
}

impl WorkloadState {
    /// Lowercase name, as stored and sent.
    pub(crate) fn name(self) -> &'static str {
        match self {
            WorkloadState::Running => "running",
            WorkloadState::Finalizing => "finalizing",
            WorkloadState::Done => "done",
            WorkloadState::EarlyStopped => "early_stopped",
            WorkloadState::Exhausted => "exhausted",
        }
    }
}

/// Lifecycle of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskState {
    /// Waiting for a worker.
    Pending,
    /// Held by a worker until its lease expires.
    Leased,
    /// Has a record (measured, reused or lost).
    Done,
    /// Its job was cancelled or its workload stopped before it finished.
    Cancelled,
}

/// What a task asks a worker to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskKind {
    /// Measure one config: a trial of the tuner.
    Tuning,
    /// Measure a workload's finalists again, interleaved, in one session.
    Finalist,
}

/// One config of a finalist task, with the tuning record it got in (stored as JSON in the task).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Finalist {
    /// The template of its config (finalists of a job that searches several templates may differ).
    pub(crate) template: String,
    pub(crate) template_version: u32,
    pub(crate) config_index: u64,
    pub(crate) config: String,
    /// The tuning record that made it a finalist (possibly reused from an earlier job).
    pub(crate) record_id: RecordId,
    /// That record's median; records never change, so it is kept here rather than joined.
    pub(crate) tuned_us: f64,
}

/// What a worker reported for a task, each measurement validated; which kind of task it fits is
/// checked against the task.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Reported {
    /// The measurement of a tuning task (boxed: it is most of the enum's size otherwise).
    Tuning(Box<Measurement>),
    /// A finalist task's measurements, one per finalist in the task's order.
    Finalists(Vec<Measurement>),
}

/// Outcome of a measurement (the names are `convert::status_name`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Status {
    /// Verified and timed.
    Ok,
    /// The config cannot run on the device.
    InvalidConfig,
    /// NVRTC rejected the source.
    CompileError,
    /// The kernel faulted or could not be launched.
    LaunchError,
    /// The output differed from the reference.
    WrongResult,
    /// The kernel ran past the deadline.
    Timeout,
    /// The worker or its GPU was lost.
    DeviceLost,
}

/// Where and how a measurement was taken (stored as JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Provenance {
    pub(crate) worker_name: String,
    pub(crate) gpu_name: String,
    pub(crate) gpu_uuid: String,
    pub(crate) driver_version: String,
    pub(crate) cuda_version: String,
    pub(crate) nvrtc_version: String,
    pub(crate) sm_clock_mhz: u32,
}

/// What a worker measured for one task, validated.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Measurement {
    pub(crate) status: Status,
    pub(crate) error: String,
    pub(crate) compile_ms: f64,
    pub(crate) measure_ms: f64,
    pub(crate) samples_us: Vec<f64>,
    pub(crate) median_us: f64,
    pub(crate) spread: f64,
    pub(crate) batch: u32,
    pub(crate) baseline_us: Option<f64>,
    pub(crate) baseline_kind: String,
    /// The algorithm the vendor library says it ran for the baseline (empty when unknown).
    pub(crate) vendor_algo: String,
    pub(crate) max_abs_err: Option<f64>,
    pub(crate) max_rel_err: Option<f64>,
    pub(crate) provenance: Provenance,
    pub(crate) cache_hit: bool,
    pub(crate) registers: u32,
    pub(crate) smem_bytes: u32,
    /// Energy and the GPU's state over the timed window (each unknown where not read).
    pub(crate) power: Power,
    /// The clock regime it was timed in.
    pub(crate) regime: Regime,
    /// Sustained: how long the kernel ran before it was steady, ms (0 for burst).
    pub(crate) settle_ms: f64,
    /// Sustained: whether it was found steady before the cap.
    pub(crate) steady: bool,
    /// The vendor baseline's energy per launch, mJ, when read.
    pub(crate) baseline_energy_mj: Option<f64>,
}

/// Energy per launch and the GPU's state over a measurement's timed window; `None` is unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Power {
    /// Millijoules per launch.
    pub(crate) energy_mj: Option<f64>,
    /// Mean board power, watts.
    pub(crate) power_w: Option<f64>,
    /// Mean SM clock, MHz.
    pub(crate) mean_clock_mhz: Option<f64>,
    /// Degrees Celsius.
    pub(crate) temperature_c: Option<f64>,
}

impl Measurement {
    /// The record the tracker writes itself when a task's worker was lost too often.
    pub(crate) fn device_lost(error: String) -> Measurement {
        Measurement {
            status: Status::DeviceLost,
            error,
            compile_ms: 0.0,
            measure_ms: 0.0,
            samples_us: Vec::new(),
            median_us: 0.0,
            spread: 0.0,
            batch: 0,
            baseline_us: None,
            baseline_kind: String::new(),
            vendor_algo: String::new(),
            max_abs_err: None,
            max_rel_err: None,
            provenance: Provenance::default(),
            cache_hit: false,
            registers: 0,
            smem_bytes: 0,
            power: Power::default(),
            regime: Regime::Burst,
            settle_ms: 0.0,
            steady: true,
            baseline_energy_mj: None,
        }
    }
}

/// A worker's GPU: the limits validity rules use plus provenance (stored as JSON); the one
/// definition, in `tensortune_kernels::target`.
pub(crate) use tensortune_kernels::target::Device;

/// A template a worker implements, spelled `name@version` in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TemplateRef {
    pub(crate) name: String,
    pub(crate) version: u32,
}

impl TemplateRef {
    /// `name@version`.
    pub(crate) fn spelled(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// Parses `name@version`.
    pub(crate) fn parse(s: &str) -> Option<TemplateRef> {
        let (name, version) = s.rsplit_once('@')?;
        Some(TemplateRef { name: name.to_owned(), version: version.parse().ok()? })
    }
}

/// A validated registration.
#[derive(Clone, Debug)]
pub(crate) struct Registration {
    pub(crate) name: String,
    pub(crate) device: Device,
    pub(crate) templates: Vec<TemplateRef>,
    /// The id this worker had before it lost its connection, if any.
    pub(crate) previous_id: Option<WorkerId>,
}

/// Early-stopping rule of a job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct EarlyStop {
    /// Finished trials without an improvement after which a workload stops.
    pub(crate) trials: u32,
    /// Relative improvement (0 ..= 1) that counts.
    pub(crate) margin: f64,
}

/// A validated job submission (what does not depend on the tracker's state).
pub(crate) struct JobRequest {
    pub(crate) workloads: Vec<Workload>,
    /// How much each workload matters to a model's job with `total_trials`; `None`: not given.
    pub(crate) weights: Option<Vec<f64>>,
    /// The template asked for; `None`: every template that supports each workload on the job's
    /// device class (and that some worker of the class runs).
    pub(crate) template: Option<&'static dyn Template>,
    pub(crate) tuner: TunerKind,
    pub(crate) trials: u32,
    /// `None`: the only class among registered workers.
    pub(crate) device_class: Option<String>,
    pub(crate) batch_size: u32,
    /// `None`: pick one.
    pub(crate) seed: Option<u64>,
    pub(crate) samples: u32,
    pub(crate) label: String,
    pub(crate) early_stop: Option<EarlyStop>,
    /// Finalists to re-measure per workload; 1 disables it.
    pub(crate) finalists: u32,
    /// Rounds of the interleaved re-measurement.
    pub(crate) finalist_rounds: u32,
    /// Flush L2 between timing samples.
    pub(crate) flush_l2: bool,
    /// Start a model search from other workloads' records.
    pub(crate) transfer: bool,
    /// Trials the whole job may measure, shared by expected gain; 0: none.
    pub(crate) total_trials: u32,
    /// The clock regime to tune in.
    pub(crate) regime: Regime,
    /// What the job minimises per record.
    pub(crate) objective: Objective,
    /// The least-energy pick within this fraction of the fastest; 0: off.
    pub(crate) max_slowdown: f64,
    /// Measurements skip their energy window.
    pub(crate) no_energy: bool,
}

/// Filters of a record export.
#[derive(Clone, Debug, Default)]
pub(crate) struct RecordFilter {
    pub(crate) workload_key: Option<String>,
    pub(crate) device_class: Option<String>,
    pub(crate) job_id: Option<JobId>,
    pub(crate) ok_only: bool,
}

crate::store::text_column!(JobState {
    JobState::Queued => "queued",
    JobState::Running => "running",
    JobState::Done => "done",
    JobState::Cancelled => "cancelled",
    JobState::Failed => "failed",
});

crate::store::text_column!(WorkloadState {
    WorkloadState::Running => "running",
    WorkloadState::Finalizing => "finalizing",
    WorkloadState::Done => "done",
    WorkloadState::EarlyStopped => "early_stopped",
    WorkloadState::Exhausted => "exhausted",
});

crate::store::text_column!(TaskState {
    TaskState::Pending => "pending",
    TaskState::Leased => "leased",
    TaskState::Done => "done",
    TaskState::Cancelled => "cancelled",
});

crate::store::text_column!(TaskKind {
    TaskKind::Tuning => "tuning",
    TaskKind::Finalist => "finalist",
});

crate::store::text_column!(Status {
    Status::Ok => "ok",
    Status::InvalidConfig => "invalid_config",
    Status::CompileError => "compile_error",
    Status::LaunchError => "launch_error",
    Status::WrongResult => "wrong_result",
    Status::Timeout => "timeout",
    Status::DeviceLost => "device_lost",
});
