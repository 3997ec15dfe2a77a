//! The `sim` device backend: for machines without a GPU (CI, demos).
//!
//! The daemon still generates and (when libnvrtc loads) really compiles every kernel; the sim child
//! only checks that what it was sent looks like cubins and answers the template's analytic time
//! (`MeasureRequest::model_us`) with a small deterministic jitter per sample. It runs no kernel, so
//! its records carry no error figures (`max_abs_err`/`max_rel_err` are `None`), no registers and
//! an SM clock of 0; the vendor baseline is the analytic vendor time, of kind `model`, with an
//! algorithm text ([`vendor_algo`]) shaped like cuBLASLt's, so that the path from the child to the
//! client's report is exercised without a GPU. An L2 flush
//! changes no time (the model has no cache); it only shows as a batch of 1, as on a GPU.
//!
//! Energy ([`power_model`]): a board of [`SIM_CAP_W`] whose draw grows with how hard a kernel works
//! (its modelled time against the vendor's) and varies by kernel (a per-kernel factor from its
//! name), so that the least-energy config is not always the fastest. Burst runs at full clock and
//! may draw past the cap; sustained holds the cap, which slows a kernel that wanted more and
//! lowers its clock. Deterministic, so that tests can compare energies across runs.
//!
//! Fault injection: [`SimFault`]s, passed to the child as JSON in the [`SIM_FAULTS_ENV`]
//! environment variable, make it abort or hang when asked to measure a given kernel, so tests can
//! exercise the daemon's supervision with real dying and hanging processes.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tensortune_kernels::energy::Regime;
use tensortune_kernels::{Target, Workload};

use crate::protocol::{Device, Executor, MeasureOutcome, MeasureRequest, Status};
use crate::record;

/// Environment variable that carries the faults (a JSON array of [`SimFault`]) to a sim child.
pub const SIM_FAULTS_ENV: &str = "TENSORTUNE_SIM_FAULTS";

/// Half-width of the per-sample jitter, as a fraction of the modelled time.
const JITTER: f64 = 0.005;
/// The simulated board's power cap, watts (an H100 SXM's).
pub const SIM_CAP_W: f64 = 700.0;
/// Its idle draw, watts.
const SIM_IDLE_W: f64 = 150.0;
/// Its full clock, MHz.
const SIM_CLOCK_MHZ: f64 = 1980.0;

/// What `sim` reads for a kernel: the time factor the regime puts on its modelled time and its
/// energy and state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimPower {
    /// Time in this regime over the modelled (burst) time: 1 for burst, >= 1 sustained.
    pub slowdown: f64,
    /// Mean board power, watts.
    pub power_w: f64,
    /// Mean SM clock, MHz.
    pub clock_mhz: f64,
    /// Temperature, degrees Celsius.
    pub temperature_c: f64,
    /// How long the kernel ran before it was steady (sustained), milliseconds.
    pub settle_ms: f64,
}

/// The power model of a kernel called `name` that the analytic model times at `model_us`
/// (the vendor at `vendor_us`), in `regime`. Burst: idle plus up to 700 W more as the kernel's
/// time nears the vendor's, times a per-kernel factor in [0.85, 1.15]. Sustained: the same draw
/// held to the cap, the clock (and the time) scaled down by the square root of the excess.
pub fn power_model(name: &str, model_us: f64, vendor_us: f64, regime: Regime) -> SimPower {
    let work = if model_us > 0.0 && vendor_us > 0.0 { (vendor_us / model_us).clamp(0.2, 1.0) } else { 0.5 };
    let factor = 0.85 + 0.3 * (jitter(name_seed(name), 0) - (1.0 - JITTER)) / (2.0 * JITTER);
    let burst_w = SIM_IDLE_W + 700.0 * work * factor;
    match regime {
        Regime::Burst => SimPower {
            slowdown: 1.0,
            power_w: burst_w,
            clock_mhz: SIM_CLOCK_MHZ,
            temperature_c: (40.0 + 0.03 * burst_w).round(),
            settle_ms: 0.0,
        },
        Regime::Sustained => {
            let excess = (burst_w / SIM_CAP_W).max(1.0);
            SimPower {
                slowdown: excess.sqrt(),
                power_w: burst_w.min(SIM_CAP_W),
                clock_mhz: (SIM_CLOCK_MHZ / excess.sqrt()).round(),
                temperature_c: (55.0 + 0.03 * burst_w.min(SIM_CAP_W)).round(),
                settle_ms: (3000.0 * work).round(),
            }
        }
    }
}

/// A stable seed from a kernel's name (FNV-1a).
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// What an injected fault does to the child.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimFaultKind {
    /// `std::process::abort()`: the child dies with SIGABRT mid-measurement.
    Crash,
    /// Sleeps forever: the daemon's measurement deadline has to kill it.
    Hang,
}

/// A fault the sim child injects when asked to measure the kernel called `kernel`.
///
/// Faults are keyed by kernel name (`KernelSpec::name`): it names the template, its version, the
/// workload and every knob, so one fault hits exactly one config of one workload, and the child
/// can match it without knowing the tracker's config indices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimFault {
    /// The kernel's name (`Launch::name`).
    pub kernel: String,
    /// What happens.
    pub kind: SimFaultKind,
}

impl SimFault {
    /// The child aborts when measuring `kernel`.
    pub fn crash(kernel: impl Into<String>) -> SimFault {
        SimFault { kernel: kernel.into(), kind: SimFaultKind::Crash }
    }

    /// The child hangs when measuring `kernel`.
    pub fn hang(kernel: impl Into<String>) -> SimFault {
        SimFault { kernel: kernel.into(), kind: SimFaultKind::Hang }
    }
}

/// The simulator, driven by the child's request loop.
pub struct SimExecutor {
    target: Target,
    faults: Vec<SimFault>,
    /// Vendor time per workload key, "timed" once per child session like a real baseline.
    baselines: HashMap<String, f64>,
    /// Workload keys whose support module this child was given.
    support: BTreeSet<String>,
}

impl SimExecutor {
    /// A simulator that injects `faults`.
    pub fn new(faults: Vec<SimFault>) -> SimExecutor {
        SimExecutor { target: Target::sim(), faults, baselines: HashMap::new(), support: BTreeSet::new() }
    }

    /// A simulator with the faults named in [`SIM_FAULTS_ENV`] (none when it is unset).
    pub fn from_env() -> anyhow::Result<SimExecutor> {
        let faults = match std::env::var(SIM_FAULTS_ENV) {
            Ok(text) if !text.trim().is_empty() => serde_json::from_str(&text).map_err(|e| {
                anyhow::anyhow!(
                    "invalid {SIM_FAULTS_ENV} {text:?}: {e}; expected [{{\"kernel\":\"...\",\"kind\":\"crash\"}}]"
                )
            })?,
            _ => Vec::new(),
        };
        Ok(SimExecutor::new(faults))
    }

    fn inject(&self, request: &MeasureRequest) {
        let Some(fault) = self.faults.iter().find(|f| f.kernel == request.launch.name) else { return };
        tracing::warn!(task = request.task_id, kernel = %request.launch.name, "injecting a {:?} fault", fault.kind);
        match fault.kind {
            SimFaultKind::Crash => std::process::abort(),
            SimFaultKind::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
        }
    }
}

/// Whether `image` is empty (nothing compiled) or starts like an ELF file, as cubins do.
fn plausible_cubin(image: &[u8]) -> bool {
    image.is_empty() || image.starts_with(b"\x7fELF")
}

/// Per-sample factor in [1 - JITTER, 1 + JITTER], a pure function of the task and sample index so
/// that a repeated measurement reads the same.
fn jitter(task_id: u64, sample: u32) -> f64 {
    // splitmix64's finaliser over the pair: cheap, well mixed, no dependency.
    let mut z = task_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(sample).wrapping_add(0x632b_e59b_d9b4_e019);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
    1.0 + JITTER * (2.0 * unit - 1.0)
}

/// The algorithm `sim`'s vendor "runs" for `workload` on `target`, in the words cuBLASLt's are
/// described in (`cuda::blaslt`): a tile as large as the output allows, split-K when the tiles
/// leave most SMs idle on a deep K, a 2x1 cluster when there are waves to share operands in. A
/// rule of thumb, not cuBLASLt's heuristic: it only has to be plausible and differ by shape.
pub(crate) fn vendor_algo(workload: &Workload, target: &Target) -> String {
    let (m, n, k) = match workload {
        Workload::Matmul(mm) => (mm.m, mm.n, mm.k),
        Workload::Conv2d(c) => c.gemm_dims(),
    };
    let tile_m = if m >= 128 { 128 } else { 64 };
    let tile_n = match n {
        n if n >= 2048 => 256,
        n if n >= 128 => 128,
        _ => 64,
    };
    let blocks = m.div_ceil(tile_m) * n.div_ceil(tile_n);
    let sms = u64::from(target.sm_count.max(1));
    let splitk = if blocks * 2 <= sms && k >= 2048 { (k / 1024).min(sms / blocks.max(1)).clamp(1, 4) } else { 1 };
    let cluster = if blocks >= 2 * sms { "2x1x1" } else { "1x1x1" };
    let mut text = format!("algo=sim tile={tile_m}x{tile_n}x64 stages=4 cluster={cluster} splitk={splitk}");
    if splitk > 1 {
        text.push_str(" reduction=compute_type");
    }
    text.push_str(" swizzle=0");
    text
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

impl Executor for SimExecutor {
    fn facts(&self) -> Device {
        Device {
            target: self.target.clone(),
            memory_bytes: 80 << 30,
            uuid: "sim-0".into(),
            driver_version: "sim".into(),
            cuda_version: "sim".into(),
            nvrtc_version: String::new(),
            sm_clock_mhz: 0,
            mem_clock_mhz: 0,
        }
    }

    fn measure(&mut self, request: &MeasureRequest) -> MeasureOutcome {
        let start = Instant::now();
        self.inject(request);
        for (what, image) in [("kernel", &request.cubin), ("support module", &request.support_cubin)] {
            if !plausible_cubin(image) {
                return MeasureOutcome::failed(
                    Status::LaunchError,
                    format!("the {what} image of task {} is not a cubin (no ELF header)", request.task_id),
                );
            }
        }
        self.support.insert(request.workload_key.clone());
        if request.baseline {
            // A fresh baseline "re-times" the model: the same figure.
            self.baselines.entry(request.workload_key.clone()).or_insert(request.vendor_model_us);
        }
        let state = power_model(&request.launch.name, request.model_us, request.vendor_model_us, request.regime);
        let vendor = power_model("vendor", request.vendor_model_us, request.vendor_model_us, request.regime);
        // The vendor in the same regime: burst keeps the figure "timed" once per session.
        let baseline_us = self.baselines.get(&request.workload_key).map(|us| us * vendor.slowdown);
        let model_us = request.model_us * state.slowdown;

        let samples_us: Vec<f64> = (0..request.samples.max(1)).map(|i| model_us * jitter(request.task_id, i)).collect();
        let mut sorted = samples_us.clone();
        sorted.sort_by(f64::total_cmp);
        // The time as the GPU's timing takes it: the median sample, the fastest in the burst regime
        // (`cuda::timing`'s `at_full_clock`).
        let median_us = match request.regime {
            Regime::Burst if request.hold_ms <= 0.0 => sorted.first().copied().unwrap_or(0.0),
            _ => median(&sorted),
        };
        let spread = match (sorted.first(), sorted.last()) {
            (Some(lo), Some(hi)) if median_us > 0.0 => (hi - lo) / median_us,
            _ => 0.0,
        };
        MeasureOutcome {
            status: Status::Ok,
            error: String::new(),
            samples_us,
            median_us,
            spread,
            // A flushing GPU times one launch per sample.
            batch: if request.flush_l2 { 1 } else { request.min_batch.max(1) },
            baseline_us,
            baseline_kind: match baseline_us {
                Some(_) => record::with_vendor_algo("model", &vendor_algo(&request.workload, &self.target)),
                None => String::new(),
            },
            max_abs_err: None,
            max_rel_err: None,
            registers: 0,
            smem_bytes: request.launch.smem_bytes,
            measure_ms: start.elapsed().as_secs_f64() * 1e3,
            sm_clock_mhz: 0,
            power: crate::energy::Power {
                // W x us = uJ; mJ is a thousandth.
                energy_mj: (request.energy_ms > 0.0).then_some(state.power_w * median_us * 1e-3),
                power_w: (request.energy_ms > 0.0).then_some(state.power_w),
                mean_clock_mhz: (request.energy_ms > 0.0).then_some(state.clock_mhz),
                temperature_c: (request.energy_ms > 0.0).then_some(state.temperature_c),
            },
            regime: request.regime,
            settle_ms: state.settle_ms,
            steady: true,
            baseline_energy_mj: baseline_us.filter(|_| request.energy_ms > 0.0).map(|us| vendor.power_w * us * 1e-3),
            trace: Vec::new(),
        }
    }

    fn support_loaded(&self) -> Vec<String> {
        self.support.iter().cloned().collect()
    }

    fn poisoned(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Launch;
    use tensortune_kernels::support::Tolerance;
    use tensortune_kernels::{DType, Layout, Matmul, Types, Workload};

    fn request(task_id: u64, baseline: bool) -> MeasureRequest {
        let workload =
            Workload::Matmul(Matmul::new(512, 64, 512, Layout::Nn, Types::default_for(DType::F16).unwrap()).unwrap());
        MeasureRequest {
            task_id,
            workload_key: workload.key(),
            tolerance: Tolerance::for_workload(&workload),
            workload,
            launch: Launch {
                name: "k".into(),
                entry: "k".into(),
                grid: [1, 1, 1],
                block: [32, 1, 1],
                smem_bytes: 4096,
                workspace_bytes: 0,
                args: Vec::new(),
            },
            cubin: Vec::new(),
            support_cubin: Vec::new(),
            samples: 9,
            min_sample_ms: 1.0,
            min_batch: 50,
            sample_launches: 0,
            flush_l2: false,
            baseline,
            fresh_baseline: false,
            repick_baseline: false,
            regime: Regime::Burst,
            settle_cap_ms: 0.0,
            hold_ms: 0.0,
            energy_ms: 100.0,
            start_uncapped: false,
            baseline_first: false,
            model_us: 10.0,
            vendor_model_us: 3.0,
        }
    }

    #[test]
    fn samples_jitter_around_the_model_deterministically() {
        let mut sim = SimExecutor::new(Vec::new());
        let a = sim.measure(&request(7, false));
        assert_eq!(a.status, Status::Ok);
        assert_eq!(a.samples_us.len(), 9);
        assert!(a.samples_us.iter().all(|s| (9.95..=10.05).contains(s)), "{:?}", a.samples_us);
        assert!(a.spread > 0.0 && a.spread <= 2.0 * JITTER + 1e-12);
        assert_eq!((a.batch, a.smem_bytes, a.max_abs_err), (50, 4096, None));
        assert_eq!(sim.measure(&request(7, false)).samples_us, a.samples_us);
        assert_ne!(sim.measure(&request(8, false)).samples_us, a.samples_us);
        assert_eq!(sim.support_loaded(), vec![request(7, false).workload_key]);
    }

    #[test]
    fn a_flush_changes_no_time_and_shows_as_single_launch_samples() {
        let mut sim = SimExecutor::new(Vec::new());
        let warm = sim.measure(&request(7, true));
        let cold = sim.measure(&MeasureRequest { flush_l2: true, ..request(7, true) });
        assert_eq!((warm.batch, cold.batch), (50, 1));
        assert_eq!((cold.samples_us, cold.baseline_us), (warm.samples_us, warm.baseline_us));
    }

    #[test]
    fn the_baseline_is_the_vendor_model_once_asked_for() {
        let mut sim = SimExecutor::new(Vec::new());
        assert_eq!(sim.measure(&request(1, false)).baseline_us, None);
        let b = sim.measure(&request(2, true));
        let (kind, algo) = record::split_vendor_algo(&b.baseline_kind);
        assert_eq!((b.baseline_us, kind.as_str()), (Some(3.0), "model"));
        // 512x64x512 on 132 SMs: 4 tiles of 128x64, K too shallow to split.
        assert_eq!(algo, "algo=sim tile=128x64x64 stages=4 cluster=1x1x1 splitk=1 swizzle=0");
        assert_eq!(sim.measure(&request(3, false)).baseline_us, Some(3.0));
    }

    #[test]
    fn the_vendor_algorithm_differs_by_shape() {
        let target = Target::sim();
        let mm = |m, n, k| {
            Workload::Matmul(Matmul::new(m, n, k, Layout::Tn, Types::default_for(DType::F16).unwrap()).unwrap())
        };
        let skinny_deep = vendor_algo(&mm(128, 128, 8192), &target);
        assert!(
            skinny_deep.contains("tile=128x128x64") && skinny_deep.contains("splitk=4 reduction="),
            "{skinny_deep}"
        );
        let large = vendor_algo(&mm(8192, 8192, 8192), &target);
        assert!(large.contains("tile=128x256x64") && large.contains("cluster=2x1x1 splitk=1 swizzle"), "{large}");
    }

    #[test]
    fn energy_is_power_times_time_and_sustained_holds_the_cap() {
        let mut sim = SimExecutor::new(Vec::new());
        let burst = sim.measure(&request(7, true));
        let e = burst.power.energy_mj.expect("sim reads energy");
        let w = burst.power.power_w.unwrap();
        assert!((e - w * burst.median_us * 1e-3).abs() < 1e-9, "{burst:?}");
        assert!((150.0..=1000.0).contains(&w), "{w}");
        assert_eq!((burst.regime, burst.settle_ms, burst.steady), (Regime::Burst, 0.0, true));
        assert_eq!(burst.power.mean_clock_mhz, Some(SIM_CLOCK_MHZ));
        assert!(burst.baseline_energy_mj.is_some());
        // The same config again reads the same energy; another kernel another.
        assert_eq!(sim.measure(&request(7, true)).power, burst.power);
        let mut other = request(7, true);
        other.launch.name = "k2".into();
        assert_ne!(sim.measure(&other).power.power_w, burst.power.power_w);
        // A kernel twice as long reads twice the energy at the same power.
        let mut long = request(7, true);
        (long.model_us, long.vendor_model_us) = (20.0, 6.0);
        let ratio = sim.measure(&long).power.energy_mj.unwrap() / e;
        assert!((ratio - 2.0).abs() < 0.02, "{ratio}");
        // Sustained: never above the cap, never faster, and it says how long it settled.
        let sustained = sim.measure(&MeasureRequest { regime: Regime::Sustained, ..request(7, true) });
        assert!(sustained.power.power_w.unwrap() <= SIM_CAP_W && sustained.median_us >= burst.median_us);
        assert!(sustained.settle_ms > 0.0 && sustained.regime == Regime::Sustained);
        // No energy window asked: unknown.
        let none = sim.measure(&MeasureRequest { energy_ms: 0.0, ..request(7, true) });
        assert_eq!((none.power.energy_mj, none.baseline_energy_mj), (None, None));
    }

    #[test]
    fn a_kernel_drawing_past_the_cap_slows_down_sustained() {
        // As fast as the vendor: the most work, the most power.
        let hot =
            (0..64).map(|i| power_model(&format!("k{i}"), 3.0, 3.0, Regime::Burst)).find(|p| p.power_w > SIM_CAP_W);
        let hot = hot.expect("some kernel draws past the cap in burst");
        assert_eq!(hot.slowdown, 1.0);
        let name = (0..64)
            .map(|i| format!("k{i}"))
            .find(|n| power_model(n, 3.0, 3.0, Regime::Burst).power_w > SIM_CAP_W)
            .unwrap();
        let held = power_model(&name, 3.0, 3.0, Regime::Sustained);
        assert!(held.slowdown > 1.0 && held.power_w == SIM_CAP_W && held.clock_mhz < SIM_CLOCK_MHZ, "{held:?}");
    }

    #[test]
    fn images_that_are_not_cubins_are_refused() {
        let mut sim = SimExecutor::new(Vec::new());
        let mut r = request(1, false);
        r.cubin = b"\x7fELF....".to_vec();
        assert_eq!(sim.measure(&r).status, Status::Ok);
        r.support_cubin = b"PTX".to_vec();
        let o = sim.measure(&r);
        assert_eq!(o.status, Status::LaunchError);
        assert!(o.error.contains("support module"), "{}", o.error);
    }

    #[test]
    fn faults_travel_as_json() {
        let faults = vec![SimFault::crash("a"), SimFault::hang("b")];
        let text = serde_json::to_string(&faults).unwrap();
        assert_eq!(text, r#"[{"kernel":"a","kind":"crash"},{"kernel":"b","kind":"hang"}]"#);
        assert_eq!(serde_json::from_str::<Vec<SimFault>>(&text).unwrap(), faults);
    }
}
