//! What the CLI prints and writes: JSON views of jobs and records (also the `records export`
//! format, one record per line) and the human-readable tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tensortune_proto::convert::{job_state_name, status_name};
use tensortune_proto::pb;
use tensortune_worker::energy::Power;

/// Where and how a record was measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ProvenanceView {
    /// Worker name.
    pub worker: String,
    /// GPU name.
    pub gpu: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Driver version.
    pub driver: String,
    /// CUDA version.
    pub cuda: String,
    /// NVRTC version.
    pub nvrtc: String,
    /// SM clock at measurement, MHz (0 when unknown).
    pub sm_clock_mhz: u32,
}

/// One measurement record, as exported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RecordView {
    /// Record id.
    pub id: u64,
    /// Task it answered.
    pub task_id: u64,
    /// Job of that task.
    pub job_id: u64,
    /// Workload key.
    pub workload: String,
    /// Template name.
    pub template: String,
    /// Template version.
    pub template_version: u32,
    /// The config.
    pub config: serde_json::Value,
    /// Its index in the template's space.
    pub config_index: u64,
    /// Device class.
    pub device_class: String,
    /// Worker id.
    pub worker_id: u64,
    /// Status name.
    pub status: String,
    /// Error text.
    pub error: String,
    /// NVRTC time.
    pub compile_ms: f64,
    /// GPU-side time.
    pub measure_ms: f64,
    /// Per-launch time of each sample.
    pub samples_us: Vec<f64>,
    /// Median of the samples.
    pub median_us: f64,
    /// (max - min) / median.
    pub spread: f64,
    /// Launches per sample.
    pub batch: u32,
    /// Vendor time.
    pub baseline_us: Option<f64>,
    /// Vendor call.
    pub baseline_kind: String,
    /// The algorithm the vendor library says it ran (cuBLASLt's tile, stages, cluster, split-K);
    /// empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vendor_algo: String,
    /// baseline / median.
    pub speedup: f64,
    /// Achieved TFLOP/s (TOP/s for integers).
    pub tflops: f64,
    /// Worst absolute error of the check.
    pub max_abs_err: Option<f64>,
    /// Worst relative error.
    pub max_rel_err: Option<f64>,
    /// Registers per thread.
    pub registers: u32,
    /// Shared memory per block.
    pub smem_bytes: u32,
    /// Whether the image came from the worker's cache.
    pub cache_hit: bool,
    /// Whether it re-measured a finalist.
    #[serde(default)]
    pub remeasure: bool,
    /// Why the tracker does not trust it (it never wins and never answers `best`); empty when it does.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub untrusted: String,
    /// Provenance.
    pub provenance: ProvenanceView,
    /// When it was stored (ms since the epoch).
    pub created_ms: i64,
    /// Energy per launch (mJ), mean power (W), mean SM clock (MHz) and temperature (C) over the
    /// energy window, as the worker measured them; each null when unknown (flattened: the JSON
    /// keys are those of the worker's `Power`).
    #[serde(flatten)]
    pub power: Power,
    /// The clock regime it was timed in: burst or sustained.
    #[serde(default = "burst")]
    pub regime: String,
    /// Sustained: how long the kernel ran before it was steady, ms.
    #[serde(default)]
    pub settle_ms: f64,
    /// Sustained: whether it was found steady before the cap.
    #[serde(default = "yes")]
    pub steady: bool,
    /// The vendor's energy per launch, mJ; null when unknown.
    #[serde(default)]
    pub baseline_energy_mj: Option<f64>,
}

fn burst() -> String {
    "burst".into()
}

fn yes() -> bool {
    true
}

impl From<&pb::Record> for RecordView {
    fn from(r: &pb::Record) -> Self {
        let m = r.measurement.clone().unwrap_or_default();
        let p = m.provenance.clone().unwrap_or_default();
        RecordView {
            id: r.id,
            task_id: r.task_id,
            job_id: r.job_id,
            workload: r.workload_key.clone(),
            template: r.template.clone(),
            template_version: r.template_version,
            config: serde_json::from_str(&r.config).unwrap_or(serde_json::Value::String(r.config.clone())),
            config_index: r.config_index,
            device_class: r.device_class.clone(),
            worker_id: r.worker_id,
            status: status_name(m.status()).to_owned(),
            error: m.error.clone(),
            compile_ms: m.compile_ms,
            measure_ms: m.measure_ms,
            samples_us: m.samples_us.clone(),
            median_us: m.median_us,
            spread: m.spread,
            batch: m.batch,
            baseline_us: m.baseline_us,
            baseline_kind: m.baseline_kind.clone(),
            vendor_algo: m.vendor_algo.clone(),
            speedup: r.speedup,
            tflops: r.tflops,
            max_abs_err: m.max_abs_err,
            max_rel_err: m.max_rel_err,
            registers: m.registers,
            smem_bytes: m.smem_bytes,
            cache_hit: m.cache_hit,
            remeasure: r.remeasure,
            untrusted: r.untrusted.clone(),
            provenance: ProvenanceView {
                worker: p.worker_name,
                gpu: p.gpu_name,
                gpu_uuid: p.gpu_uuid,
                driver: p.driver_version,
                cuda: p.cuda_version,
                nvrtc: p.nvrtc_version,
                sm_clock_mhz: p.sm_clock_mhz,
            },
            created_ms: r.created_ms,
            power: Power {
                energy_mj: m.energy_mj,
                power_w: m.power_w,
                mean_clock_mhz: m.mean_clock_mhz,
                temperature_c: m.temperature_c,
            },
            regime: if m.regime.is_empty() { burst() } else { m.regime.clone() },
            settle_ms: m.settle_ms,
            steady: m.steady || m.regime.is_empty() || m.regime == "burst",
            baseline_energy_mj: m.baseline_energy_mj,
        }
    }
}

/// One workload of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkloadView {
    /// Workload key.
    pub workload: String,
    /// running, done, early_stopped, exhausted.
    pub state: String,
    /// Trials asked for (capped at the valid space).
    pub trials_target: u32,
    /// Trials finished.
    pub trials_done: u32,
    /// Of which answered from the store.
    pub reused: u32,
    /// Valid configs on the job's device class.
    pub space_size: u64,
    /// Finished trials per status.
    pub status_counts: BTreeMap<String, u32>,
    /// Fastest ok record (the re-measured winner once finalists are re-measured).
    pub best: Option<RecordView>,
    /// Finalists, fastest re-measurement first.
    #[serde(default)]
    pub finalists: Vec<FinalistView>,
    /// (runner-up - winner) / winner on re-measurement.
    #[serde(default)]
    pub finalist_gap: f64,
    /// When tuning ended (model tuner): the model's chance that an untried config is >= 2% faster
    /// than the best found.
    #[serde(default)]
    pub chance_better: Option<f64>,
}

/// A finalist of a workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinalistView {
    /// Its template and version, e.g. `wgmma_gemm v2`.
    #[serde(default)]
    pub template: String,
    /// The config.
    pub config: serde_json::Value,
    /// Median of its tuning record.
    pub tuned_us: f64,
    /// Median over the re-measurement rounds.
    pub remeasured_us: f64,
}

/// A job, as `--json` writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobView {
    /// Job id.
    pub id: u64,
    /// State name.
    pub state: String,
    /// Template, or the templates searched joined with '+'.
    pub template: String,
    /// Template version (0 when several templates are searched).
    pub template_version: u32,
    /// Every template searched, with its version (`wmma_gemm v6`), in the job's order.
    #[serde(default)]
    pub templates: Vec<String>,
    /// Tuner.
    pub tuner: String,
    /// Device class.
    pub device_class: String,
    /// Trials per workload.
    pub trials: u32,
    /// Tuner seed.
    pub seed: u64,
    /// Workloads.
    pub workloads: Vec<WorkloadView>,
    /// Why it failed or was cancelled.
    pub error: String,
    /// Wall time from submission to the last change, seconds.
    pub wall_s: f64,
    /// The clock regime it tunes in.
    #[serde(default = "burst")]
    pub regime: String,
    /// What it minimises: time, energy or edp.
    #[serde(default = "time")]
    pub objective: String,
    /// The least-energy pick within this fraction of the fastest (0: off).
    #[serde(default)]
    pub max_slowdown: f64,
    /// Whether its measurements skipped their energy window.
    #[serde(default)]
    pub no_energy: bool,
}

fn time() -> String {
    "time".into()
}

impl From<&pb::Job> for JobView {
    fn from(j: &pb::Job) -> Self {
        JobView {
            id: j.id,
            state: job_state_name(j.state()).to_owned(),
            template: j.template.clone(),
            template_version: j.template_version,
            templates: j.templates.iter().map(|t| format!("{} v{}", t.name, t.version)).collect(),
            tuner: j.tuner.clone(),
            device_class: j.device_class.clone(),
            trials: j.trials,
            seed: j.seed,
            workloads: j
                .workloads
                .iter()
                .map(|w| WorkloadView {
                    workload: w.workload_key.clone(),
                    state: w.state.clone(),
                    trials_target: w.trials_target,
                    trials_done: w.trials_done,
                    reused: w.reused,
                    space_size: w.space_size,
                    status_counts: w.status_counts.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                    best: w.best.as_ref().map(RecordView::from),
                    finalists: w
                        .finalists
                        .iter()
                        .map(|f| FinalistView {
                            template: format!("{} v{}", f.template, f.template_version),
                            config: serde_json::from_str(&f.config)
                                .unwrap_or(serde_json::Value::String(f.config.clone())),
                            tuned_us: f.tuned_us,
                            remeasured_us: f.remeasured_us,
                        })
                        .collect(),
                    finalist_gap: w.finalist_gap,
                    chance_better: w.chance_better,
                })
                .collect(),
            error: j.error.clone(),
            wall_s: (j.finished_ms.max(j.updated_ms) - j.created_ms).max(0) as f64 / 1e3,
            regime: if j.regime.is_empty() { burst() } else { j.regime.clone() },
            objective: if j.objective.is_empty() { time() } else { j.objective.clone() },
            max_slowdown: j.max_slowdown,
            no_energy: j.no_energy,
        }
    }
}

/// A model's predicted GEMM/conv time from a job of its workloads: per workload, its weight (how
/// many times the model runs it) times the faster of the best kernel so far and the vendor's
/// (what `tensortune.torch.apply` runs), summed over the workloads measured so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModelTime {
    /// Sum of weight x min(best, vendor), microseconds.
    pub tuned_us: f64,
    /// Sum of weight x vendor, microseconds: the model as the vendor library runs it.
    pub vendor_us: f64,
    /// Workloads with a vendor time (the sums cover only these).
    pub measured: usize,
    /// Workloads in the job.
    pub workloads: usize,
}

impl ModelTime {
    /// The sums over `job`'s workloads (a weight of 0, from a tracker without weights, counts 1).
    pub fn of(job: &pb::Job) -> ModelTime {
        let mut t = ModelTime { tuned_us: 0.0, vendor_us: 0.0, measured: 0, workloads: job.workloads.len() };
        for w in &job.workloads {
            let Some(m) = w.best.as_ref().and_then(|b| b.measurement.as_ref()) else { continue };
            let Some(vendor) = m.baseline_us.filter(|v| *v > 0.0) else { continue };
            let weight = if w.weight > 0.0 { w.weight } else { 1.0 };
            let best = if m.median_us > 0.0 { m.median_us.min(vendor) } else { vendor };
            t.tuned_us += weight * best;
            t.vendor_us += weight * vendor;
            t.measured += 1;
        }
        t
    }

    /// vendor / tuned (1 when nothing is measured).
    pub fn speedup(&self) -> f64 {
        if self.tuned_us > 0.0 { self.vendor_us / self.tuned_us } else { 1.0 }
    }

    /// `model 1.234 ms (vendor 1.300 ms, 1.05x) over 12/54 workloads`.
    pub fn line(&self) -> String {
        if self.measured == 0 {
            return format!("model: no workload of {} measured yet", self.workloads);
        }
        format!(
            "model {} (vendor {}, {:.3}x) over {}/{} workloads",
            fmt_us(self.tuned_us),
            fmt_us(self.vendor_us),
            self.speedup(),
            self.measured,
            self.workloads
        )
    }
}

/// `4.31 us`, `1.234 ms`.
pub fn fmt_us(us: f64) -> String {
    if us >= 1000.0 { format!("{:.3} ms", us / 1000.0) } else { format!("{us:.2} us") }
}

/// A figure or `-` when unknown: `11.10 mJ`, `650 W`.
pub fn fmt_known(v: Option<f64>, unit: &str, decimals: usize) -> String {
    match v {
        Some(v) => format!("{v:.decimals$} {unit}"),
        None => "-".into(),
    }
}

/// The energy line of a record: `energy  11.10 mJ/launch  650 W  1755 MHz  62 C  (burst)`, with
/// the vendor's energy when known and how a sustained record settled.
pub fn fmt_energy(r: &RecordView) -> String {
    let mut s = format!(
        "  energy  {}/launch  {}  {}  {}  ({}",
        fmt_known(r.power.energy_mj, "mJ", 3),
        fmt_known(r.power.power_w, "W", 0),
        fmt_known(r.power.mean_clock_mhz, "MHz", 0),
        fmt_known(r.power.temperature_c, "C", 0),
        r.regime
    );
    if r.regime == "sustained" {
        let how = if r.steady { "steady after" } else { "NOT steady at the cap of" };
        let _ = write!(s, ", {how} {:.1} s", r.settle_ms / 1e3);
    }
    s.push(')');
    if let Some(v) = r.baseline_energy_mj {
        let _ = write!(s, "  vendor {v:.3} mJ");
    }
    s.push('\n');
    s
}

/// `ok 97, compile_error 3`.
pub fn fmt_counts(counts: &BTreeMap<String, u32>) -> String {
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

/// Config JSON without quotes and braces: `block_m=64 block_n=32 ...`.
pub fn fmt_config(config: &serde_json::Value) -> String {
    match config {
        serde_json::Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}

/// A worker as `tensortune workers --json` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkerView {
    /// Worker id.
    pub id: u64,
    /// online, lost, ...
    pub state: String,
    /// Its name (host/gpu).
    pub name: String,
    /// Device class it measures for.
    pub device_class: String,
    /// Tasks it holds now.
    pub leased: u32,
    /// Results it reported.
    pub reported: u64,
    /// Its last time of the shared reference kernel, microseconds (0: not measured yet).
    pub reference_us: f64,
    /// Its reference time against its peers' median, as a fraction.
    pub drift: f64,
    /// Whether its timings disagree with its peers'.
    pub flagged: bool,
}

impl From<&pb::Worker> for WorkerView {
    fn from(w: &pb::Worker) -> Self {
        WorkerView {
            id: w.id,
            state: w.state.clone(),
            name: w.name.clone(),
            device_class: w.device.as_ref().map(|d| d.class_key.clone()).unwrap_or_default(),
            leased: w.leased,
            reported: w.reported,
            reference_us: w.reference_us,
            drift: w.drift,
            flagged: w.flagged,
        }
    }
}

/// Below this speedup a wmma_gemm winner on a Hopper GPU gets a hint that wgmma_gemm exists.
const HOPPER_HINT_BELOW: f64 = 0.8;

/// A hint for a matmul job that was narrowed to `wmma_gemm` by `--template` on an sm_90 device
/// class and lost clearly to the vendor on some workload: without `--template` the job searches
/// wgmma_gemm (wgmma + TMA) beside it, the faster family for large shapes. A job that named no
/// template already searched every template that takes its workloads, so it gets no hint.
pub fn template_hint(template_given: bool, view: &JobView) -> Option<String> {
    let hopper = view.device_class.contains("/sm90/");
    let losing: Vec<&str> = view
        .workloads
        .iter()
        .filter(|w| w.workload.starts_with("matmul/"))
        .filter(|w| w.best.as_ref().is_some_and(|b| b.baseline_us.is_some() && b.speedup < HOPPER_HINT_BELOW))
        .map(|w| w.workload.as_str())
        .collect();
    if !template_given || !hopper || view.template != "wmma_gemm" || losing.is_empty() {
        return None;
    }
    Some(format!(
        "hint: on this Hopper GPU, leave out --template to search wgmma_gemm (wgmma + TMA, the faster family \
         for large shapes) together with wmma_gemm ({} workload(s) here ran below {HOPPER_HINT_BELOW}x of the \
         vendor with wmma_gemm alone)",
        losing.len()
    ))
}

/// The templates of a job as its report names them: `wmma_gemm v6`, or `wmma_gemm v6 +
/// wgmma_gemm v2` for a job that searches several.
pub fn fmt_templates(job: &JobView) -> String {
    if job.templates.is_empty() {
        return format!("{} v{}", job.template, job.template_version);
    }
    job.templates.join(" + ")
}

/// What beat the space's best, when the vendor was faster and says which algorithm it ran: that
/// algorithm, to read beside the best's config for what the space lacks.
pub fn vendor_edge(best: &RecordView) -> Option<&str> {
    let faster = best.baseline_us.is_some_and(|b| b > 0.0 && b < best.median_us);
    (faster && !best.vendor_algo.is_empty()).then_some(best.vendor_algo.as_str())
}

/// The best-record lines of a workload: time, rate, vendor time and speedup, the algorithm the
/// vendor ran where it was faster, config.
pub fn fmt_best(best: &RecordView) -> String {
    let mut s = format!(
        "  best    {}  {:.1} TFLOP/s  (record {}, job {})\n",
        fmt_us(best.median_us),
        best.tflops,
        best.id,
        best.job_id
    );
    match best.baseline_us {
        Some(b) => {
            let _ = writeln!(s, "  vendor  {}  {}  speedup {:.2}x", fmt_us(b), best.baseline_kind, best.speedup);
        }
        None => {
            let _ = writeln!(
                s,
                "  vendor  none ({})",
                if best.baseline_kind.is_empty() { "not measured" } else { &best.baseline_kind }
            );
        }
    }
    if let Some(algo) = vendor_edge(best) {
        let _ = writeln!(s, "  beaten  by the vendor's {algo} (what the space's best below lacks)");
    }
    s.push_str(&fmt_energy(best));
    let _ = writeln!(s, "  config  {}", fmt_config(&best.config));
    if let Some(e) = best.max_abs_err {
        let _ = writeln!(s, "  check   every output element verified (max abs error {e:.3e})");
    }
    s
}

/// A job as a short report.
pub fn fmt_job(job: &JobView) -> String {
    let mut s = format!(
        "job {} {}: {} on {}, tuner {} (seed {}), {:.1} s\n",
        job.id,
        job.state,
        fmt_templates(job),
        job.device_class,
        job.tuner,
        job.seed,
        job.wall_s
    );
    let slowdown = if job.max_slowdown > 0.0 {
        format!(", the least energy within {:.1}% of the fastest", job.max_slowdown * 100.0)
    } else {
        String::new()
    };
    let unread = if job.no_energy { ", energy not read" } else { "" };
    let _ = writeln!(s, "  tuned   {} regime, objective {}{slowdown}{unread}", job.regime, job.objective);
    // With several templates, each best and finalist says which one it is.
    let several = job.templates.len() > 1;
    if !job.error.is_empty() {
        let _ = writeln!(s, "  error: {}", job.error);
    }
    for w in &job.workloads {
        let _ = writeln!(s, "{}", w.workload);
        let _ = writeln!(
            s,
            "  trials  {}/{} of {} valid configs, {} ({}), {} reused",
            w.trials_done,
            w.trials_target,
            w.space_size,
            w.state,
            fmt_counts(&w.status_counts),
            w.reused
        );
        match &w.best {
            Some(b) => {
                s.push_str(&fmt_best(b));
                if several {
                    let _ = writeln!(s, "  kernel  {} v{}", b.template, b.template_version);
                }
            }
            None => s.push_str("  best    none yet\n"),
        }
        if w.finalists.len() > 1 {
            let times: Vec<String> = w
                .finalists
                .iter()
                .map(|f| {
                    let of = if several { format!(" {}", f.template) } else { String::new() };
                    format!("{}{of} (tuned {})", fmt_us(f.remeasured_us), fmt_us(f.tuned_us))
                })
                .collect();
            let _ = writeln!(
                s,
                "  final   {} finalists re-measured: {}; winner ahead by {:.1}%",
                w.finalists.len(),
                times.join(", "),
                w.finalist_gap * 100.0
            );
        }
        if let Some(c) = w.chance_better {
            let _ = writeln!(
                s,
                "  sure    the model gives a {:.0}% chance that an untried config is >= 2% faster",
                c * 100.0
            );
        }
    }
    s
}

/// One line for the progress bar: the best so far of each workload.
pub fn progress_message(job: &pb::Job) -> String {
    // A model's job (a budget shared by several workloads): one line for the whole model.
    if job.total_trials > 0 && job.workloads.len() > 1 {
        return ModelTime::of(job).line();
    }
    let parts: Vec<String> = job
        .workloads
        .iter()
        .filter_map(|w| {
            let b = w.best.as_ref()?;
            let m = b.measurement.as_ref()?;
            // With several templates searched, which one the best is so far.
            let of = if job.templates.len() > 1 { format!(" {}", b.template) } else { String::new() };
            Some(match m.baseline_us {
                Some(base) if m.median_us > 0.0 => {
                    format!("best {}{of} ({:.2}x vendor)", fmt_us(m.median_us), base / m.median_us)
                }
                _ => format!("best {}{of}", fmt_us(m.median_us)),
            })
        })
        .collect();
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_us(4.314), "4.31 us");
        assert_eq!(fmt_us(1234.5), "1.234 ms");
        let c: serde_json::Value = serde_json::from_str(r#"{"block_m":64,"frag":"m16n16k16"}"#).unwrap();
        assert_eq!(fmt_config(&c), "block_m=64 frag=m16n16k16");
        let mut counts = BTreeMap::new();
        assert_eq!(fmt_counts(&counts), "none");
        counts.insert("ok".to_string(), 3);
        assert_eq!(fmt_counts(&counts), "ok 3");
    }

    #[test]
    fn the_vendor_algorithm_shows_beside_a_best_it_beat() {
        let mut best = RecordView::from(&pb::Record::default());
        best.median_us = 12.0;
        best.baseline_us = Some(11.5);
        best.baseline_kind = "cublasLt heuristic #1 of 8".into();
        best.speedup = 11.5 / 12.0;
        best.vendor_algo = "algo=66 tile=128x64x64 stages=4 cluster=2x1x1 splitk=1 swizzle=0".into();
        let text = fmt_best(&best);
        assert!(text.contains("  beaten  by the vendor's algo=66 tile=128x64x64 stages=4 cluster=2x1x1"), "{text}");
        // A best that beat the vendor, or a vendor that does not say, gets no such line.
        best.baseline_us = Some(13.0);
        assert_eq!(vendor_edge(&best), None);
        assert!(!fmt_best(&best).contains("beaten"));
        best.baseline_us = Some(11.5);
        best.vendor_algo.clear();
        assert_eq!(vendor_edge(&best), None);
        best.baseline_us = None;
        assert_eq!(vendor_edge(&best), None);
    }

    #[test]
    fn hopper_hint_only_for_a_matmul_narrowed_to_wmma_that_lost_on_sm90() {
        let view = |class: &str, template: &str, speedup: f64| -> JobView {
            let mut best = RecordView::from(&pb::Record::default());
            (best.baseline_us, best.speedup) = (Some(188.0), speedup);
            let mut v = JobView::from(&pb::Job::default());
            (v.device_class, v.template) = (class.to_string(), template.to_string());
            v.workloads = vec![WorkloadView {
                workload: "matmul/m4096n4096k4096/nn/f16,f32,f32/alpha=1,beta=0".into(),
                state: "done".into(),
                trials_target: 100,
                trials_done: 100,
                reused: 0,
                space_size: 586,
                status_counts: BTreeMap::new(),
                best: Some(best),
                finalists: Vec::new(),
                finalist_gap: 0.0,
                chance_better: None,
            }];
            v
        };
        let h200 = "nvidia-h200/sm90/132sm";
        assert!(template_hint(true, &view(h200, "wmma_gemm", 0.46)).unwrap().contains("leave out --template"));
        assert_eq!(template_hint(false, &view(h200, "wmma_gemm", 0.46)), None, "the union was searched");
        assert_eq!(template_hint(true, &view(h200, "wmma_gemm", 1.16)), None, "it won");
        assert_eq!(template_hint(true, &view("nvidia-a100/sm80/108sm", "wmma_gemm", 0.46)), None, "not Hopper");
        assert_eq!(template_hint(true, &view(h200, "wgmma_gemm", 0.5)), None, "already the Hopper family");
        let both = view(h200, "wmma_gemm+wgmma_gemm", 0.5);
        assert_eq!(template_hint(false, &both), None, "both were searched");
    }

    #[test]
    fn a_union_job_names_each_template_and_each_best_its_own() {
        let mut best = RecordView::from(&pb::Record::default());
        (best.template, best.template_version) = ("wgmma_gemm".into(), 2);
        let mut v = JobView::from(&pb::Job::default());
        v.templates = vec!["wmma_gemm v6".into(), "wgmma_gemm v2".into()];
        v.workloads = vec![WorkloadView {
            workload: "matmul/m4096n4096k4096/nn/f16,f32,f32/alpha=1,beta=0".into(),
            state: "done".into(),
            trials_target: 10,
            trials_done: 10,
            reused: 0,
            space_size: 900,
            status_counts: BTreeMap::new(),
            best: Some(best),
            finalists: Vec::new(),
            finalist_gap: 0.0,
            chance_better: Some(0.034),
        }];
        let text = fmt_job(&v);
        assert!(text.contains("a 3% chance that an untried config is >= 2% faster"), "{text}");
        assert!(text.contains(": wmma_gemm v6 + wgmma_gemm v2 on"), "{text}");
        assert!(text.contains("  kernel  wgmma_gemm v2"), "{text}");
        v.templates.truncate(1);
        assert!(!fmt_job(&v).contains("  kernel "), "one template: the header says it");
    }
}
