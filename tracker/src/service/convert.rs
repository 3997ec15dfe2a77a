//! Wire messages to validated domain types and back. Every check a proto comment promises with
//! "must" or a range is made here, and each failure names its field.

use std::collections::HashMap;

use tensortune_kernels::energy::{self, Objective, Regime};
use tensortune_kernels::registry::by_name;
use tensortune_kernels::{Template, Workload};
use tensortune_proto::convert::{device_from_target, status_name, target_from_device};
use tensortune_proto::pb;

use crate::drift::Drift;
use crate::error::{Error, Result};
use crate::finalists::FinalistView;
use crate::jobs::{JobView, MAX_WORKLOADS};
use crate::model::{
    Device, EarlyStop, JobRequest, JobState, Measurement, Power, Provenance, Registration, Reported, Status, TaskKind,
    TemplateRef, WorkloadState,
};
use crate::store::records::Record;
use crate::store::tasks::LeasedTask;
use crate::store::workers::WorkerRow;
use crate::tuner::TunerKind;

/// Trials per workload a job may ask for.
const MAX_TRIALS: u32 = 100_000;
/// Outstanding tasks per workload a job may ask for, and the default.
const MAX_BATCH: u32 = 4096;
const DEFAULT_BATCH: u32 = 64;
/// Batch of the model tuner when a job names none (the size the replay bars are measured at).
const DEFAULT_MODEL_BATCH: u32 = 16;
/// Timing samples per measurement a job may ask for, and the default.
const MAX_SAMPLES: u32 = 1000;
const DEFAULT_SAMPLES: u32 = 10;
/// Finalists per workload a job may ask for, and the default. More would make the interleaved
/// session long enough for the GPU's conditions to change within it, which is what it avoids.
const MAX_FINALISTS: u32 = 16;
const DEFAULT_FINALISTS: u32 = 3;
/// Rounds of the interleaved re-measurement a job may ask for, and the default.
const MAX_FINALIST_ROUNDS: u32 = 20;
const DEFAULT_FINALIST_ROUNDS: u32 = 3;
/// Trials a job may share across its workloads.
const MAX_TOTAL_TRIALS: u32 = 1_000_000;
/// Longest worker name.
const MAX_NAME_CHARS: usize = 128;

/// A row id from the wire.
pub(crate) fn id(field: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(field, format!("{v} is out of range; ids are below 2^63")))
}

/// Checks that `v` lies in `lo ..= hi`.
pub(crate) fn in_range(field: &str, v: u32, lo: u32, hi: u32) -> Result<u32> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(Error::invalid(field, format!("{v} is out of range; allowed {lo} ..= {hi}")))
    }
}

/// Longest free-text field a job takes (label), in bytes: names, not documents.
const MAX_LABEL_BYTES: usize = 256;
/// Longest name field (template, tuner, device class), in bytes.
const MAX_NAME_BYTES: usize = 128;

/// Refuses a string field longer than `max` bytes, naming it and the bound.
fn check_len(field: &str, value: &str, max: usize) -> Result<()> {
    if value.len() > max {
        return Err(Error::invalid(field, format!("is {} bytes long; at most {max} are allowed", value.len())));
    }
    Ok(())
}

/// A job submission, validated as far as it can be without the tracker's state.
pub(crate) fn job_request(req: pb::SubmitJobRequest) -> Result<JobRequest> {
    check_len("label", &req.label, MAX_LABEL_BYTES)?;
    for (field, value) in [("template", &req.template), ("tuner", &req.tuner), ("device_class", &req.device_class)] {
        check_len(field, value, MAX_NAME_BYTES)?;
    }
    if req.workloads.is_empty() {
        return Err(Error::invalid("workloads", "must hold at least one workload"));
    }
    if req.workloads.len() > MAX_WORKLOADS {
        return Err(Error::invalid(
            "workloads",
            format!("holds {} workloads; a job takes at most {MAX_WORKLOADS}, so split it", req.workloads.len()),
        ));
    }
    let workloads = req
        .workloads
        .iter()
        .enumerate()
        .map(|(i, w)| Workload::try_from(w).map_err(|e| Error::from(e.within(&format!("workloads[{i}]")))))
        .collect::<Result<Vec<_>>>()?;
    // No template: the union of every template that takes each workload (resolved against the
    // device class at submission).
    let template: Option<&'static dyn Template> =
        if req.template.is_empty() { None } else { Some(by_name(&req.template).map_err(|e| template_error(&e))?) };
    let tuner = if req.tuner.is_empty() {
        TunerKind::Random
    } else {
        req.tuner.parse().map_err(|message: String| Error::invalid("tuner", message))?
    };
    let trials = in_range("trials", req.trials, 1, MAX_TRIALS)?;
    let batch_size = match (req.batch_size, tuner) {
        // The model learns between batches: smaller ones let it learn sooner.
        (0, TunerKind::Model) => DEFAULT_MODEL_BATCH,
        (0, _) => DEFAULT_BATCH,
        (n, _) => in_range("batch_size", n, 1, MAX_BATCH)?,
    };
    let samples = if req.samples == 0 { DEFAULT_SAMPLES } else { in_range("samples", req.samples, 1, MAX_SAMPLES)? };
    let margin = req.early_stop_margin;
    if !(0.0..=1.0).contains(&margin) {
        return Err(Error::invalid(
            "early_stop_margin",
            format!("{margin} is out of range; it is a fraction, allowed 0 ..= 1 (0.01 means 1%)"),
        ));
    }
    // Unset is the default; 0 and 1 disable finalists (one re-measured config decides nothing),
    // stored as 1, the store's "none".
    let finalists = match req.finalists {
        None => DEFAULT_FINALISTS,
        Some(n) => in_range("finalists", n, 0, MAX_FINALISTS)?.max(1),
    };
    let finalist_rounds = if req.finalist_rounds == 0 {
        DEFAULT_FINALIST_ROUNDS
    } else {
        in_range("finalist_rounds", req.finalist_rounds, 1, MAX_FINALIST_ROUNDS)?
    };
    let total_trials = match req.total_trials {
        0 => 0,
        n if n > MAX_TOTAL_TRIALS => {
            return Err(Error::invalid(
                "total_trials",
                format!("{n} is out of range; allowed 1 ..= {MAX_TOTAL_TRIALS}, or 0 for no job-wide budget"),
            ));
        }
        n if (n as usize) < workloads.len() => {
            return Err(Error::invalid(
                "total_trials",
                format!(
                    "{n} is fewer than the job's {} workloads; each workload needs at least one trial, so \
                     allow at least {} (or 0 for no job-wide budget)",
                    workloads.len(),
                    workloads.len()
                ),
            ));
        }
        n => n,
    };
    let weights = job_weights(&req.weights, workloads.len())?;
    let regime = Regime::parse(&req.regime).map_err(|e| Error::invalid("regime", e))?;
    let objective = Objective::parse(&req.objective).map_err(|e| Error::invalid("objective", e))?;
    let max_slowdown = energy::check_slowdown(req.max_slowdown).map_err(|e| Error::invalid("max_slowdown", e))?;
    Ok(JobRequest {
        regime,
        objective,
        max_slowdown,
        no_energy: req.no_energy,
        weights,
        workloads,
        template,
        tuner,
        trials,
        device_class: Some(req.device_class).filter(|c| !c.is_empty()),
        batch_size,
        seed: Some(req.seed).filter(|s| *s != 0),
        samples,
        label: req.label,
        early_stop: (req.early_stop_trials > 0).then_some(EarlyStop { trials: req.early_stop_trials, margin }),
        finalists,
        finalist_rounds,
        flush_l2: req.flush_l2,
        transfer: req.transfer.unwrap_or(true),
        total_trials,
    })
}

/// Largest weight a workload may have: a count of occurrences, not an overflow.
const MAX_WEIGHT: f64 = 1e9;

/// The weight of each workload (a model's job), one per workload in (0, 1e9]; `None` when none is given.
fn job_weights(weights: &[f64], workloads: usize) -> Result<Option<Vec<f64>>> {
    if weights.is_empty() {
        return Ok(None);
    }
    if weights.len() != workloads {
        return Err(Error::invalid(
            "weights",
            format!("holds {} weights for {workloads} workloads; give one per workload, or none", weights.len()),
        ));
    }
    for (i, w) in weights.iter().enumerate() {
        if !(w.is_finite() && *w > 0.0 && *w <= MAX_WEIGHT) {
            return Err(Error::invalid(
                format!("weights[{i}]"),
                format!("{w} is out of range; allowed 0 < weight <= {MAX_WEIGHT:e}"),
            ));
        }
    }
    Ok(Some(weights.to_vec()))
}

/// A template lookup's failure, as an error of the `template` field.
pub(crate) fn template_error(e: &tensortune_kernels::Error) -> Error {
    match e {
        tensortune_kernels::Error::Invalid { message, .. } => Error::invalid("template", message.clone()),
        other => Error::invalid("template", other.to_string()),
    }
}

/// A worker's registration.
pub(crate) fn registration(req: pb::RegisterRequest) -> Result<Registration> {
    if req.name.trim().is_empty() {
        return Err(Error::invalid(
            "name",
            format!("{:?} is blank; name the worker, e.g. \"gpu-box-3/cuda:0\"", req.name),
        ));
    }
    let chars = req.name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(Error::invalid("name", format!("has {chars} characters; shorten it to at most {MAX_NAME_CHARS}")));
    }
    let device = req.device.ok_or_else(|| Error::invalid("device", "must be set: the worker's GPU and its limits"))?;
    let target = target_from_device(&device)?;
    if req.templates.is_empty() {
        return Err(Error::invalid(
            "templates",
            "must list at least one template (name and version) the worker implements",
        ));
    }
    let templates = req
        .templates
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if t.name.is_empty() || t.name.contains('@') {
                return Err(Error::invalid(
                    format!("templates[{i}].name"),
                    format!("{:?} is not a template name", t.name),
                ));
            }
            if t.version == 0 {
                return Err(Error::invalid(format!("templates[{i}].version"), "must be 1 or more"));
            }
            Ok(TemplateRef { name: t.name.clone(), version: t.version })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Registration {
        name: req.name,
        device: Device {
            target,
            memory_bytes: device.memory_bytes,
            uuid: device.uuid,
            driver_version: device.driver_version,
            cuda_version: device.cuda_version,
            nvrtc_version: device.nvrtc_version,
            sm_clock_mhz: device.sm_clock_mhz,
            mem_clock_mhz: device.mem_clock_mhz,
        },
        templates,
        // An id this tracker never handed out is simply a new worker.
        previous_id: i64::try_from(req.previous_id).ok().filter(|id| *id != 0),
    })
}

/// What a report holds: a tuning task's `measurement`, or a finalist task's
/// `finalist_measurements` (which kind of task it is, the tracker checks against the task).
pub(crate) fn reported(measurement: Option<pb::Measurement>, finalists: Vec<pb::Measurement>) -> Result<Reported> {
    match (measurement, finalists.len()) {
        (Some(_), 1..) => Err(Error::invalid(
            "measurement",
            "must be unset when finalist_measurements is set; a report holds either a tuning task's \
             measurement or a finalist task's finalist_measurements",
        )),
        (None, 0) => Err(Error::invalid("measurement", "must be set (or finalist_measurements, for a finalist task)")),
        (Some(m), _) => Ok(Reported::Tuning(Box::new(measurement_at("measurement", m)?))),
        (None, n) if n > MAX_FINALISTS as usize => Err(Error::invalid(
            "finalist_measurements",
            format!("holds {n} measurements; a finalist task has at most {MAX_FINALISTS} finalists"),
        )),
        (None, _) => finalists
            .into_iter()
            .enumerate()
            .map(|(i, m)| measurement_at(&format!("finalist_measurements[{i}]"), m))
            .collect::<Result<Vec<_>>>()
            .map(Reported::Finalists),
    }
}

/// A measurement from a report, its fields named under `at` (`measurement.median_us`,
/// `finalist_measurements[2].status`).
fn measurement_at(at: &str, m: pb::Measurement) -> Result<Measurement> {
    let status = match pb::RecordStatus::try_from(m.status).map(status_from_pb) {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(Error::invalid(format!("{at}.status"), "must be set (ok, compile_error, wrong_result, ...)"));
        }
        Err(_) => return Err(Error::invalid(format!("{at}.status"), format!("unknown status value {}", m.status))),
    };
    let time = |field: &str, v: f64| -> Result<f64> {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(Error::invalid(format!("{at}.{field}"), format!("{v} is not a time; it must be finite and >= 0")))
        }
    };
    time("compile_ms", m.compile_ms)?;
    time("measure_ms", m.measure_ms)?;
    time("median_us", m.median_us)?;
    for (i, s) in m.samples_us.iter().enumerate() {
        time(&format!("samples_us[{i}]"), *s)?;
    }
    if status == Status::Ok && m.median_us <= 0.0 {
        return Err(Error::invalid(
            format!("{at}.median_us"),
            format!("{} is not a valid time for an ok measurement; it must be > 0", m.median_us),
        ));
    }
    if !m.spread.is_finite() || m.spread < 0.0 {
        return Err(Error::invalid(format!("{at}.spread"), format!("{} must be finite and >= 0", m.spread)));
    }
    if let Some(b) = m.baseline_us
        && !(b.is_finite() && b > 0.0)
    {
        return Err(Error::invalid(format!("{at}.baseline_us"), format!("{b} must be finite and > 0, or unset")));
    }
    for (field, v) in [("max_abs_err", m.max_abs_err), ("max_rel_err", m.max_rel_err)] {
        // Infinite errors are real (an overflowed output); NaN would be stored as NULL.
        if let Some(v) = v
            && (v.is_nan() || v < 0.0)
        {
            return Err(Error::invalid(format!("{at}.{field}"), format!("{v} must be >= 0, or unset")));
        }
    }
    // Energy figures are positive or unknown: a 0 from a worker that could not read one is
    // refused rather than stored as a reading.
    for (field, v) in [
        ("energy_mj", m.energy_mj),
        ("power_w", m.power_w),
        ("mean_clock_mhz", m.mean_clock_mhz),
        ("baseline_energy_mj", m.baseline_energy_mj),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0)
        {
            return Err(Error::invalid(
                format!("{at}.{field}"),
                format!("{v} must be finite and > 0, or unset (unknown)"),
            ));
        }
    }
    if let Some(t) = m.temperature_c
        && !(t.is_finite() && (-50.0..=200.0).contains(&t))
    {
        return Err(Error::invalid(
            format!("{at}.temperature_c"),
            format!("{t} must be -50 ..= 200 degrees, or unset"),
        ));
    }
    let regime = Regime::parse(&m.regime).map_err(|e| Error::invalid(format!("{at}.regime"), e))?;
    time("settle_ms", m.settle_ms)?;
    let p = m.provenance.unwrap_or_default();
    Ok(Measurement {
        power: Power {
            energy_mj: m.energy_mj,
            power_w: m.power_w,
            mean_clock_mhz: m.mean_clock_mhz,
            temperature_c: m.temperature_c,
        },
        regime,
        settle_ms: m.settle_ms,
        // Burst records are steady by definition; older workers send false for it.
        steady: m.steady || regime == Regime::Burst,
        baseline_energy_mj: m.baseline_energy_mj,
        status,
        error: m.error,
        compile_ms: m.compile_ms,
        measure_ms: m.measure_ms,
        samples_us: m.samples_us,
        median_us: m.median_us,
        spread: m.spread,
        batch: m.batch,
        baseline_us: m.baseline_us,
        baseline_kind: m.baseline_kind,
        vendor_algo: m.vendor_algo,
        max_abs_err: m.max_abs_err,
        max_rel_err: m.max_rel_err,
        provenance: Provenance {
            worker_name: p.worker_name,
            gpu_name: p.gpu_name,
            gpu_uuid: p.gpu_uuid,
            driver_version: p.driver_version,
            cuda_version: p.cuda_version,
            nvrtc_version: p.nvrtc_version,
            sm_clock_mhz: p.sm_clock_mhz,
        },
        cache_hit: m.cache_hit,
        registers: m.registers,
        smem_bytes: m.smem_bytes,
    })
}

/// A heartbeat's reference time: `None` for 0 (the worker has none yet).
pub(crate) fn reference_us(v: f64) -> Result<Option<f64>> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(Error::invalid(
            "reference_us",
            format!("{v} is not a time; it must be finite and >= 0 (0 until the worker timed the reference kernel)"),
        ));
    }
    Ok((v > 0.0).then_some(v))
}

/// Job states from a listing filter.
pub(crate) fn job_states(states: &[i32]) -> Result<Vec<JobState>> {
    states
        .iter()
        .enumerate()
        .map(|(i, v)| match pb::JobState::try_from(*v) {
            Ok(pb::JobState::Queued) => Ok(JobState::Queued),
            Ok(pb::JobState::Running) => Ok(JobState::Running),
            Ok(pb::JobState::Done) => Ok(JobState::Done),
            Ok(pb::JobState::Cancelled) => Ok(JobState::Cancelled),
            Ok(pb::JobState::Failed) => Ok(JobState::Failed),
            Ok(pb::JobState::Unspecified) | Err(_) => Err(Error::invalid(
                format!("states[{i}]"),
                format!("{v} is not a job state; use queued, running, done, cancelled or failed"),
            )),
        })
        .collect()
}

/// The domain status of a wire status; `None` for unspecified.
fn status_from_pb(s: pb::RecordStatus) -> Option<Status> {
    Some(match s {
        pb::RecordStatus::Unspecified => return None,
        pb::RecordStatus::Ok => Status::Ok,
        pb::RecordStatus::InvalidConfig => Status::InvalidConfig,
        pb::RecordStatus::CompileError => Status::CompileError,
        pb::RecordStatus::LaunchError => Status::LaunchError,
        pb::RecordStatus::WrongResult => Status::WrongResult,
        pb::RecordStatus::Timeout => Status::Timeout,
        pb::RecordStatus::DeviceLost => Status::DeviceLost,
    })
}

fn status_to_pb(s: Status) -> pb::RecordStatus {
    match s {
        Status::Ok => pb::RecordStatus::Ok,
        Status::InvalidConfig => pb::RecordStatus::InvalidConfig,
        Status::CompileError => pb::RecordStatus::CompileError,
        Status::LaunchError => pb::RecordStatus::LaunchError,
        Status::WrongResult => pb::RecordStatus::WrongResult,
        Status::Timeout => pb::RecordStatus::Timeout,
        Status::DeviceLost => pb::RecordStatus::DeviceLost,
    }
}

fn job_state_to_pb(s: JobState) -> pb::JobState {
    match s {
        JobState::Queued => pb::JobState::Queued,
        JobState::Running => pb::JobState::Running,
        JobState::Done => pb::JobState::Done,
        JobState::Cancelled => pb::JobState::Cancelled,
        JobState::Failed => pb::JobState::Failed,
    }
}

/// A stored record on the wire.
pub(crate) fn record(r: Record) -> pb::Record {
    let p = r.provenance.0;
    pb::Record {
        id: r.id as u64,
        task_id: r.task_id as u64,
        job_id: r.job_id as u64,
        workload_key: r.workload_key,
        workload: Some(pb::Workload::from(&r.workload.0)),
        template: r.template,
        template_version: r.template_version,
        config: r.config,
        config_index: r.config_index as u64,
        device_class: r.device_class,
        worker_id: r.worker_id.unwrap_or_default() as u64,
        measurement: Some(pb::Measurement {
            status: status_to_pb(r.status) as i32,
            error: r.error,
            compile_ms: r.compile_ms,
            measure_ms: r.measure_ms,
            samples_us: r.samples.0,
            median_us: r.median_us,
            spread: r.spread,
            batch: r.batch,
            baseline_us: r.baseline_us,
            baseline_kind: r.baseline_kind,
            max_abs_err: r.max_abs_err,
            max_rel_err: r.max_rel_err,
            provenance: Some(pb::Provenance {
                worker_name: p.worker_name,
                gpu_name: p.gpu_name,
                gpu_uuid: p.gpu_uuid,
                driver_version: p.driver_version,
                cuda_version: p.cuda_version,
                nvrtc_version: p.nvrtc_version,
                sm_clock_mhz: p.sm_clock_mhz,
            }),
            cache_hit: r.cache_hit,
            registers: r.registers,
            smem_bytes: r.smem_bytes,
            vendor_algo: r.vendor_algo,
            energy_mj: r.energy_mj,
            power_w: r.power_w,
            mean_clock_mhz: r.mean_clock_mhz,
            temperature_c: r.temperature_c,
            regime: r.regime,
            settle_ms: r.settle_ms,
            steady: r.steady,
            baseline_energy_mj: r.baseline_energy_mj,
        }),
        tflops: r.tflops,
        speedup: r.speedup,
        created_ms: r.created_ms,
        remeasure: r.remeasure,
        token_id: r.token_id.unwrap_or_default() as u64,
        untrusted: r.untrusted.unwrap_or_default(),
    }
}

/// A finalist of a workload on the wire.
fn finalist(f: FinalistView) -> pb::Finalist {
    pb::Finalist {
        config: f.finalist.config,
        config_index: f.finalist.config_index,
        tuned_us: f.finalist.tuned_us,
        remeasured_us: f.remeasured_us,
        record_id: f.record_id as u64,
        template: f.finalist.template,
        template_version: f.finalist.template_version,
    }
}

/// A job snapshot on the wire.
pub(crate) fn job(view: JobView) -> pb::Job {
    let JobView { job, workloads } = view;
    pb::Job {
        id: job.id as u64,
        state: job_state_to_pb(job.state) as i32,
        template: job.template,
        template_version: job.template_version,
        tuner: job.tuner.name().to_owned(),
        device_class: job.device_class,
        trials: job.trials,
        batch_size: job.batch_size,
        seed: job.seed as u64,
        samples: job.samples,
        label: job.label,
        workloads: workloads
            .into_iter()
            .map(|w| pb::WorkloadProgress {
                workload: Some(pb::Workload::from(&w.row.workload.0)),
                workload_key: w.row.workload_key,
                trials_target: w.row.trials_target,
                space_size: w.row.space_size as u64,
                trials_done: w.row.done,
                reused: w.row.reused,
                status_counts: w
                    .status_counts
                    .into_iter()
                    .map(|(s, n)| (status_name(status_to_pb(s)).to_owned(), n))
                    .collect::<HashMap<_, _>>(),
                best: w.best.map(record),
                state: if job.state == JobState::Cancelled
                    && matches!(w.row.state, WorkloadState::Running | WorkloadState::Finalizing)
                {
                    "cancelled".to_owned()
                } else {
                    w.row.state.name().to_owned()
                },
                finalists: w.finalists.into_iter().map(finalist).collect(),
                finalist_gap: w.row.finalist_gap.unwrap_or_default(),
                chance_better: w.row.chance_better,
                weight: w.row.weight.unwrap_or(1.0),
            })
            .collect(),
        error: job.error,
        created_ms: job.created_ms,
        updated_ms: job.updated_ms,
        finished_ms: job.finished_ms.unwrap_or_default(),
        early_stop_trials: job.early_stop_trials,
        early_stop_margin: job.early_stop_margin,
        // The store keeps "none" as 1; the wire says 0.
        finalists: if job.finalists < 2 { 0 } else { job.finalists },
        finalist_rounds: job.finalist_rounds,
        flush_l2: job.flush_l2,
        transfer: job.transfer,
        total_trials: job.total_trials,
        regime: job.regime,
        objective: job.objective,
        max_slowdown: job.max_slowdown,
        no_energy: job.no_energy,
        templates: job
            .templates
            .0
            .iter()
            .filter_map(|s| TemplateRef::parse(s))
            .map(|t| pb::TemplateRef { name: t.name, version: t.version })
            .collect(),
    }
}

/// A leased task on the wire: a tuning task names its config; a finalist task lists its
/// finalists and rounds, with an empty config.
pub(crate) fn task(t: LeasedTask) -> pb::Task {
    let finalist = t.kind == TaskKind::Finalist;
    // A finalist task has no template of its own: it names its first finalist's, which is every
    // finalist's for a worker that predates `finalist_templates`.
    let (template, template_version) = match t.finalists.0.first() {
        Some(f) if finalist => (f.template.clone(), f.template_version),
        _ => (t.template, t.template_version),
    };
    pb::Task {
        task_id: t.id as u64,
        job_id: t.job_id as u64,
        workload: Some(pb::Workload::from(&t.workload.0)),
        workload_key: t.workload_key,
        template,
        template_version,
        finalist_templates: t
            .finalists
            .0
            .iter()
            .map(|f| pb::TemplateRef { name: f.template.clone(), version: f.template_version })
            .collect(),
        config: if finalist { String::new() } else { t.config },
        config_index: if finalist { 0 } else { u64::try_from(t.config_index).unwrap_or_default() },
        samples: t.samples,
        lease_expires_ms: t.lease_expires_ms,
        lease_serial: t.attempts,
        flush_l2: t.flush_l2,
        regime: t.regime,
        no_energy: t.no_energy,
        finalist_indices: t.finalists.0.iter().map(|f| f.config_index).collect(),
        finalist_configs: t.finalists.0.into_iter().map(|f| f.config).collect(),
        rounds: if finalist { t.finalist_rounds } else { 0 },
    }
}

/// A worker on the wire, with its drift from its class.
pub(crate) fn worker(w: WorkerRow, drift: Drift) -> pb::Worker {
    let d = w.device.0;
    pb::Worker {
        id: w.id as u64,
        name: w.name,
        device: Some(pb::DeviceInfo {
            memory_bytes: d.memory_bytes,
            uuid: d.uuid,
            driver_version: d.driver_version,
            cuda_version: d.cuda_version,
            nvrtc_version: d.nvrtc_version,
            sm_clock_mhz: d.sm_clock_mhz,
            mem_clock_mhz: d.mem_clock_mhz,
            ..device_from_target(&d.target)
        }),
        templates: w
            .templates
            .0
            .iter()
            .filter_map(|s| TemplateRef::parse(s))
            .map(|t| pb::TemplateRef { name: t.name, version: t.version })
            .collect(),
        state: w.state,
        registered_ms: w.registered_ms,
        last_seen_ms: w.last_seen_ms,
        leased: w.leased,
        reported: w.reported as u64,
        reference_us: w.reference_us.unwrap_or_default(),
        drift: drift.drift,
        flagged: drift.flagged,
        quarantined: w.quarantined.unwrap_or_default(),
        token_id: w.token_id.unwrap_or_default() as u64,
    }
}
