//! The contract between the worker daemon and its measuring child process, and the `Executor`
//! trait every device backend (cuda, sim) implements.
//!
//! The daemon compiles (NVRTC on a CPU pool) and talks to the tracker; a child process owns the GPU
//! and runs one [`MeasureRequest`] at a time through an [`Executor`]. A kernel that faults, traps
//! or hangs can then only take the child down: the daemon reports the task as `launch_error` or
//! `timeout` and starts a fresh child. Frames on the child's stdin/stdout are a little-endian `u32`
//! byte length followed by that many bytes of JSON (binary images are base64 inside the JSON).

use serde::{Deserialize, Serialize};
use tensortune_kernels::Workload;
use tensortune_kernels::energy::Regime;
use tensortune_kernels::support::Tolerance;

/// Outcome classes of one measurement: the one definition every crate uses.
pub use tensortune_kernels::status::Status;

/// How to launch a compiled kernel: the one definition, beside `tensortune_kernels::KernelSpec`.
pub use tensortune_kernels::template::Launch;

/// What the child needs to measure one config.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MeasureRequest {
    /// The tracker's task id (for logs).
    pub task_id: u64,
    /// The workload.
    pub workload: Workload,
    /// The workload's canonical key (cache key for buffers, references and baselines).
    pub workload_key: String,
    /// The kernel under test.
    pub launch: Launch,
    /// Its cubin for this device's exact architecture (empty on `sim`).
    #[serde(with = "b64")]
    pub cubin: Vec<u8>,
    /// The workload's support module (`kernels::support`), compiled for this device; empty when
    /// the child already holds it for `workload_key` (it says so in `Hello`/earlier responses).
    #[serde(with = "b64")]
    pub support_cubin: Vec<u8>,
    /// How far outputs may be from the reference.
    pub tolerance: Tolerance,
    /// Timing samples to take.
    pub samples: u32,
    /// Minimum GPU time of one sample in milliseconds; the launch batch grows until a sample
    /// takes at least this long (and holds at least `min_batch` launches).
    pub min_sample_ms: f64,
    /// Fewest launches per sample.
    pub min_batch: u32,
    /// When nonzero, a sample may end before `min_sample_ms` once it holds this many launches
    /// (never before `timing`'s shortest sample, a trial's): a finalist's long samples are for
    /// kernels heavy enough to move the GPU's clocks, and would hold a short kernel's for 100000
    /// launches (see `plan`). 0: `min_sample_ms` alone.
    #[serde(default)]
    pub sample_launches: u32,
    /// Flush the L2 cache before every sample: each sample is then one launch from a cold L2
    /// (batch 1; `min_sample_ms` and `min_batch` do not apply), and so is the vendor baseline's.
    #[serde(default)]
    pub flush_l2: bool,
    /// Whether to time the vendor library if this child has no baseline for the workload yet.
    pub baseline: bool,
    /// Time the vendor library again even when this child has a baseline (with `baseline`):
    /// finalist rounds re-time it next to the kernels, so both see the same clocks. A GPU under
    /// long wgmma load was seen throttling from 1980 to 1500 MHz, which a baseline timed once at
    /// the start of a session does not see. Only the algorithm this child picked the last time it
    /// timed every candidate for the workload is timed again (every candidate when it has no
    /// pick), so that the vendor is timed once a round, as each finalist is, and not as the
    /// fastest of up to nine timings (the least of nine noisy times reads low, nine heavy timings
    /// in a row heat the GPU for the configs after them, and the burst's first candidate runs
    /// coolest).
    #[serde(default)]
    pub fresh_baseline: bool,
    /// With `fresh_baseline`: time every vendor candidate again and keep the fastest as the pick
    /// (a finalist task's warm-up does, on a GPU already at the clock of the rounds, in the
    /// rounds' long samples, so that the pick the rounds time is the fastest under sustained load,
    /// not in the short burst at the start of the tuning).
    #[serde(default)]
    pub repick_baseline: bool,
    /// The clock regime to time in: burst (as before regimes) or sustained (after the GPU reached
    /// its steady state running the kernel, see `energy::settled_at`; the vendor's pick is then
    /// timed again right after the kernel, in the same state).
    #[serde(default)]
    pub regime: Regime,
    /// The longest a sustained measurement runs the kernel waiting for the steady state,
    /// milliseconds; at the cap it is timed anyway and says it was not steady.
    #[serde(default)]
    pub settle_cap_ms: f64,
    /// Run the kernel back to back this long before timing it, whatever the steady rule says,
    /// milliseconds (0: not held; `selftest --hold`, the reference a sustained record is checked
    /// against).
    #[serde(default)]
    pub hold_ms: f64,
    /// The window energy is read over, milliseconds (at least `energy::MIN_WINDOW_MS`; 0: no
    /// energy reading). Timed samples that last this long are read directly; shorter ones are
    /// followed by this long a run of the same launches.
    #[serde(default)]
    pub energy_ms: f64,
    /// Burst: when the GPU is held down by its power cap (or a thermal limit) as this
    /// measurement starts, idle until it is not (at most `timing`'s burst cool-down) before the
    /// warm-up, so that the samples start from the full clock a burst means. A finalist's rounds
    /// ask for it: run back to back with the vendor's, they held an H200's clock at 1185-1545 MHz
    /// on every large GEMM, 10-18% slower than the same configs' trials (2026-11-28).
    #[serde(default)]
    pub start_uncapped: bool,
    /// With a fresh baseline: time the vendor's pick before this kernel instead of after it. A
    /// burst finalist's rounds alternate the order, so that each side has rounds it started from
    /// the full clock: after 10-15 ms of a large GEMM the power cap is close, and a vendor timed
    /// second in every round read capped in all of them (an H200, 2026-11-29, f16
    /// 4096x14336x4096: 693.6 us in the record, 628.6 us in the exported bundle's check).
    #[serde(default)]
    pub baseline_first: bool,
    /// The analytic model's time, microseconds (what `sim` reports).
    pub model_us: f64,
    /// The analytic vendor time, microseconds (what `sim` reports as baseline).
    pub vendor_model_us: f64,
}

/// What the child measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasureOutcome {
    /// Outcome class.
    pub status: Status,
    /// Fault text, first mismatch, or empty.
    pub error: String,
    /// Per-launch time of every sample, microseconds.
    pub samples_us: Vec<f64>,
    /// The measurement's time: the median of `samples_us`; in the burst regime the fastest of them
    /// (the kernel at the full clock: `cuda::timing`'s `at_full_clock`); a settled timing's, the
    /// time over its energy window. A finalist's record: the regime's center of its rounds.
    pub median_us: f64,
    /// (max - min) / the time.
    pub spread: f64,
    /// Launches per sample.
    pub batch: u32,
    /// Vendor time for the workload in this child session, microseconds.
    pub baseline_us: Option<f64>,
    /// Which vendor call was timed (`cublasGemmEx`, `cublasLt heuristic #3 of 8`, `model`).
    pub baseline_kind: String,
    /// Worst absolute error of the full-output check.
    pub max_abs_err: Option<f64>,
    /// Worst relative error.
    pub max_rel_err: Option<f64>,
    /// Registers per thread of the loaded kernel.
    pub registers: u32,
    /// Static + dynamic shared memory per block.
    pub smem_bytes: u32,
    /// Wall time spent on the GPU side, milliseconds.
    pub measure_ms: f64,
    /// SM clock read around the measurement, MHz (0 when unknown).
    pub sm_clock_mhz: u32,
    /// Energy per launch, mean power, mean clock and temperature over the energy window (each
    /// unknown where it could not be read).
    #[serde(default)]
    pub power: crate::energy::Power,
    /// The regime it was timed in.
    #[serde(default)]
    pub regime: Regime,
    /// Sustained: how long the kernel ran before it was found steady (or the cap), ms.
    #[serde(default)]
    pub settle_ms: f64,
    /// Sustained: whether the steady state was found before the cap (true for burst).
    #[serde(default = "steady_default")]
    pub steady: bool,
    /// The vendor baseline's energy per launch, mJ, when read.
    #[serde(default)]
    pub baseline_energy_mj: Option<f64>,
    /// The settle phase's (or hold's) clock and power, a point per second; empty without one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<crate::energy::StatePoint>,
}

fn steady_default() -> bool {
    true
}

impl MeasureOutcome {
    /// An outcome with only a status and an error text.
    pub fn failed(status: Status, error: impl Into<String>) -> MeasureOutcome {
        MeasureOutcome {
            status,
            error: error.into(),
            samples_us: Vec::new(),
            median_us: 0.0,
            spread: 0.0,
            batch: 0,
            baseline_us: None,
            baseline_kind: String::new(),
            max_abs_err: None,
            max_rel_err: None,
            registers: 0,
            smem_bytes: 0,
            measure_ms: 0.0,
            sm_clock_mhz: 0,
            power: crate::energy::Power::default(),
            regime: Regime::Burst,
            settle_ms: 0.0,
            steady: true,
            baseline_energy_mj: None,
            trace: Vec::new(),
        }
    }
}

/// The device a child drives: the one definition, in `tensortune_kernels::target`.
pub use tensortune_kernels::target::Device;

/// Daemon -> child.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Describe the device (first message after start).
    Hello,
    /// Measure one config.
    Measure(Box<MeasureRequest>),
    /// Exit cleanly.
    Shutdown,
}

/// Child -> daemon.
///
/// Adjacently tagged (`{"type": ..., "body": ...}`): serde cannot put an internal tag into
/// `Fatal`'s bare string.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", content = "body", rename_all = "snake_case")]
pub enum Response {
    /// Answer to `Hello`.
    Hello(Device),
    /// Answer to `Measure`. `support_loaded` lists the workload keys whose support module the
    /// child holds, so the daemon can stop sending them.
    Measured {
        /// The outcome.
        outcome: MeasureOutcome,
        /// Workload keys with a loaded support module.
        support_loaded: Vec<String>,
        /// True when the CUDA context is no longer usable (a sticky error): the daemon must
        /// replace this child before the next measurement.
        poisoned: bool,
    },
    /// The child could not start (no GPU, driver missing): the text says why.
    Fatal(String),
}

/// A device backend, driven by the child process's request loop on one thread.
pub trait Executor {
    /// Facts about the device.
    fn facts(&self) -> Device;

    /// Measures one config. Never panics on a bad kernel: faults become `launch_error` outcomes,
    /// and `poisoned()` turns true when the context cannot be used again.
    fn measure(&mut self, request: &MeasureRequest) -> MeasureOutcome;

    /// Workload keys whose support module is loaded.
    fn support_loaded(&self) -> Vec<String>;

    /// Whether a sticky error left the device unusable for further work.
    fn poisoned(&self) -> bool;
}

pub(crate) mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_without_a_flush_field_do_not_flush() {
        let w = tensortune_kernels::template::drift_reference().0;
        let request = MeasureRequest {
            task_id: 1,
            workload: w,
            workload_key: w.key(),
            launch: Launch {
                name: "k".into(),
                entry: "k".into(),
                grid: [1, 1, 1],
                block: [32, 1, 1],
                smem_bytes: 0,
                workspace_bytes: 0,
                args: Vec::new(),
            },
            cubin: Vec::new(),
            support_cubin: Vec::new(),
            tolerance: Tolerance::for_workload(&w),
            samples: 1,
            min_sample_ms: 1.0,
            min_batch: 1,
            sample_launches: 0,
            flush_l2: true,
            baseline: false,
            fresh_baseline: false,
            repick_baseline: false,
            regime: Regime::Burst,
            settle_cap_ms: 0.0,
            hold_ms: 0.0,
            energy_ms: 0.0,
            start_uncapped: false,
            baseline_first: false,
            model_us: 1.0,
            vendor_model_us: 1.0,
        };
        let mut json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["flush_l2"], true);
        json.as_object_mut().unwrap().remove("flush_l2");
        assert!(!serde_json::from_value::<MeasureRequest>(json).unwrap().flush_l2);
    }
}
