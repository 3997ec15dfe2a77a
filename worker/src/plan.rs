//! What follows from a task alone: its workload and template (the [`Subject`]), and for each of
//! its configs the generated kernel, the analytic times and the child's [`MeasureRequest`].

use tensortune_kernels::energy::Regime;
use tensortune_kernels::gemm::vendor_model_us;
use tensortune_kernels::support::{self, Tolerance};
use tensortune_kernels::{Config, KernelSpec, Layout, Matmul, Target, Template, Workload, registry, short_digest};
use tensortune_proto::pb;

use crate::compiler::Image;
use crate::protocol::{Launch, MeasureRequest};

/// Minimum GPU time of one timing sample, milliseconds (the child grows the batch to reach it).
const MIN_SAMPLE_MS: f64 = 1.0;
/// Minimum GPU time of a sustained finalist's timing (all its samples), milliseconds: a
/// finalist's measurement and the vendor timing after it each hold the GPU for at least 50 ms (5
/// ms a sample at the default 10), five times a trial's samples. A burst finalist is timed as a
/// trial is (10 samples of 1 ms, from the full clock: `MeasureRequest::start_uncapped`): 50 ms of
/// a large GEMM at 700 W reach an H200's power cap after 20-45 ms, so a burst finalist timed that
/// long read a capped clock (its record 4-8% slower than cool-start shots of the same kernel on 3
/// of 6 tuned winners, while the trials of the same configs matched all 6; 2026-11-28), and
/// made the finalists 20-40% of a 4096^3 job's wall. Holding each timing for half a second, as
/// finalists did until 2026-11-28, measures the clock a sustained load runs at (on an H100 at its
/// power cap, 2026-11-26, f16 4096x14336x4096: vendor/ours 1.045-1.055 in 14 ms measurements,
/// 0.989-0.996 in 0.55 s ones, 0.96-0.99 held alone for seconds): a regime of its own (issue 39),
/// measured where it is asked for.
const FINALIST_MIN_MS: f64 = 50.0;
/// Launches a sustained finalist's measurement (all its samples) needs at most: its samples end
/// once they hold this many, if that comes before [`FINALIST_MIN_MS`] (but never shorter than a
/// trial's [`MIN_SAMPLE_MS`]). A 3 us kernel (f16 512x64x512) then ends its timing after 15 ms,
/// where one sample's median already repeats to a fraction of a percent; from 10 us on, the 50 ms
/// come first.
const FINALIST_LAUNCHES: u32 = 5000;
/// Fewest launches per timing sample.
const MIN_BATCH: u32 = 50;
/// Timing samples of a task that names none (the tracker's default for jobs).
const DEFAULT_SAMPLES: u32 = 10;
/// The window a measurement's energy is read over, milliseconds: NVML's counter publishes every
/// 100 ms and the draw at the power cap swings within a second (see `energy::MIN_WINDOW_MS`), so
/// a trial's 10 ms of samples would read nothing: a measurement that reads energy replays the
/// kernel for this window after its samples (the CLI asks for it only on jobs that need energy,
/// see `no_energy`).
const ENERGY_MS: f64 = crate::energy::MIN_WINDOW_MS;
/// The longest a sustained measurement waits for the steady state, milliseconds: an H100 at its
/// power cap settles in a few seconds; a kernel that never does is timed at the cap, marked
/// unsteady.
pub(crate) const SETTLE_CAP_MS: f64 = 20_000.0;

/// How a task's measurements are sampled (the job's settings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sampling {
    /// Timing samples per measurement; 0 means [`DEFAULT_SAMPLES`].
    pub(crate) samples: u32,
    /// One launch per sample from a cold L2.
    pub(crate) flush_l2: bool,
    /// The clock regime to time in.
    pub(crate) regime: Regime,
    /// Skip the energy window (the job reads no energy).
    pub(crate) no_energy: bool,
}

impl Sampling {
    /// The sampling a task asks for (a regime this build does not know is measured as burst,
    /// with a warning: the tracker validated it, so it comes from a newer tracker).
    pub(crate) fn of_task(task: &pb::Task) -> Sampling {
        let regime = Regime::parse(&task.regime).unwrap_or_else(|e| {
            tracing::warn!(task = task.task_id, "{e}; measuring it as burst");
            Regime::Burst
        });
        Sampling { samples: task.samples, flush_l2: task.flush_l2, regime, no_energy: task.no_energy }
    }
}

/// What a task measures apart from its configs.
pub(crate) struct Subject {
    pub(crate) workload: Workload,
    pub(crate) workload_key: String,
    pub(crate) template: &'static dyn Template,
}

impl Subject {
    /// The task's workload and template; `Err` is the reason for an `invalid_config`.
    pub(crate) fn of_task(task: &pb::Task) -> Result<Subject, String> {
        let workload = task.workload.as_ref().ok_or_else(|| "the task has no workload".to_owned())?;
        let workload = Workload::try_from(workload).map_err(|e| format!("the task's workload is invalid: {e}"))?;
        let workload_key = workload.key();
        if task.workload_key != workload_key {
            tracing::warn!(
                "the task's workload key {:?} differs from this worker's {workload_key:?}",
                task.workload_key
            );
        }
        let template = template_named(&task.template, task.template_version)?;
        Ok(Subject { workload, workload_key, template })
    }

    /// The same workload with template `name` at `version` (a finalist of a task whose finalists
    /// are of several templates); `Err` is the reason for an `invalid_config`.
    pub(crate) fn with_template(&self, name: &str, version: u32) -> Result<Subject, String> {
        let template = template_named(name, version)?;
        Ok(Subject { workload: self.workload, workload_key: self.workload_key.clone(), template })
    }

    /// The plan of one config given as JSON; `Err` is the reason for an `invalid_config`.
    pub(crate) fn plan_json(&self, config: &str, sampling: Sampling, target: &Target) -> Result<Plan, String> {
        let config = Config::from_json(config).map_err(|e| e.to_string())?;
        self.plan(&config, sampling, target)
    }

    /// The plan of one config; `Err` is the reason for an `invalid_config`.
    pub(crate) fn plan(&self, config: &Config, sampling: Sampling, target: &Target) -> Result<Plan, String> {
        let (template, workload) = (self.template, &self.workload);
        template.check(workload, config, target).map_err(|e| e.to_string())?;
        let spec = template.generate(workload, config, target).map_err(|e| e.to_string())?;
        let model_us = template.model_us(workload, config, target).map_err(|e| e.to_string())?;
        Ok(Plan {
            workload: *workload,
            workload_key: self.workload_key.clone(),
            spec,
            sampling,
            model_us,
            vendor_model_us: vendor_time(workload),
        })
    }
}

/// The template `name` at `version`, which this worker must generate.
fn template_named(name: &str, version: u32) -> Result<&'static dyn Template, String> {
    let template = registry::by_name(name).map_err(|e| e.to_string())?;
    if version != template.version() {
        return Err(format!(
            "the task asks for {name} version {version}; this worker generates version {}",
            template.version()
        ));
    }
    Ok(template)
}

/// What a measurement is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// A tuning task's one measurement: short samples (a burst, as the search compares configs).
    Trial,
    /// A sustained finalist task's warm-up before its rounds (not recorded): long samples (see
    /// [`FINALIST_MIN_MS`]; cold-L2 sampling, one launch a sample, is unchanged), then every
    /// vendor candidate timed the same way, the fastest becoming the pick the rounds time.
    FinalistWarmUp,
    /// A finalist's measurement in a round, and the vendor's pick timed again the same way right
    /// after it (or, with `vendor_first` in a burst, right before it): long samples in the
    /// sustained regime, a trial's from the full clock in a burst.
    FinalistRound {
        /// Time the vendor first (burst only; the rounds alternate).
        vendor_first: bool,
    },
}

/// One config of a task, ready to compile.
pub(crate) struct Plan {
    pub(crate) workload: Workload,
    pub(crate) workload_key: String,
    pub(crate) spec: KernelSpec,
    pub(crate) sampling: Sampling,
    pub(crate) model_us: f64,
    pub(crate) vendor_model_us: f64,
}

impl Plan {
    /// The child's request to measure this plan's kernel from `kernel`, with the workload's
    /// `support` module, for a `pass` of the task; `baseline` asks for the vendor library's time
    /// too.
    pub(crate) fn request(
        &self,
        task_id: u64,
        kernel: &Image,
        support: &Image,
        baseline: bool,
        pass: Pass,
    ) -> MeasureRequest {
        let spec = &self.spec;
        let samples = if self.sampling.samples == 0 { DEFAULT_SAMPLES } else { self.sampling.samples };
        let sustained = self.sampling.regime == Regime::Sustained;
        // Long samples: a sustained finalist's (see FINALIST_MIN_MS).
        let long = sustained && pass != Pass::Trial;
        MeasureRequest {
            task_id,
            workload: self.workload,
            workload_key: self.workload_key.clone(),
            launch: Launch::of(spec),
            cubin: kernel.cubin.clone(),
            support_cubin: support.cubin.clone(),
            tolerance: Tolerance::for_workload(&self.workload),
            samples,
            min_sample_ms: if long { (FINALIST_MIN_MS / f64::from(samples)).max(MIN_SAMPLE_MS) } else { MIN_SAMPLE_MS },
            min_batch: MIN_BATCH,
            sample_launches: if long { (FINALIST_LAUNCHES / samples).max(MIN_BATCH) } else { 0 },
            flush_l2: self.sampling.flush_l2,
            // Sustained: the vendor is timed in every measurement, right after the kernel, in the
            // same settled state (a baseline from another moment would compare two clocks).
            baseline: baseline || pass != Pass::Trial || sustained,
            fresh_baseline: pass != Pass::Trial || sustained,
            repick_baseline: pass == Pass::FinalistWarmUp,
            regime: self.sampling.regime,
            settle_cap_ms: if sustained { SETTLE_CAP_MS } else { 0.0 },
            hold_ms: 0.0,
            energy_ms: if self.sampling.no_energy { 0.0 } else { ENERGY_MS },
            // A burst finalist starts from the full clock, as a trial after a compile does.
            start_uncapped: !sustained && pass != Pass::Trial,
            baseline_first: !sustained && matches!(pass, Pass::FinalistRound { vendor_first: true }),
            model_us: self.model_us,
            vendor_model_us: self.vendor_model_us,
        }
    }
}

/// The name and source of the support module of `workload` (whose key is `key`).
pub(crate) fn support_module(workload: &Workload, key: &str) -> (String, String) {
    (format!("tt_support_{}", short_digest(key)), support::source(workload))
}

/// The analytic vendor time (what `sim` reports as its baseline).
pub(crate) fn vendor_time(workload: &Workload) -> f64 {
    match workload {
        Workload::Matmul(m) => vendor_model_us(m),
        Workload::Conv2d(c) => {
            // cuDNN's implicit GEMM: NHWC activations are K-contiguous (T), KRSC filters too (N).
            let (m, n, k) = c.gemm_dims();
            vendor_model_us(&Matmul {
                m,
                n,
                k,
                layout: Layout::Tn,
                types: c.types,
                alpha: 1.0,
                beta: 0.0,
                epilogue: tensortune_kernels::Epilogue::NONE,
                input_scale: tensortune_kernels::InputScale::None,
                batch: 1,
                groups: Default::default(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensortune_kernels::Target;

    #[test]
    fn finalist_requests_time_the_vendor_the_same_way_longer_only_when_sustained() {
        let mut plan = crate::reference::plan(&Target::sm90()).expect("the drift reference plans for sm_90");
        let image = Image { cubin: vec![1, 2, 3] };
        let trial = plan.request(5, &image, &image, false, Pass::Trial);
        let round = plan.request(5, &image, &image, false, Pass::FinalistRound { vendor_first: false });
        let vendor = |r: &MeasureRequest| (r.baseline, r.fresh_baseline, r.repick_baseline);
        assert_eq!((trial.min_sample_ms, vendor(&trial)), (MIN_SAMPLE_MS, (false, false, false)));
        // A burst finalist is timed as a trial is, from the full clock, with the vendor's pick
        // timed again right after it ...
        assert_eq!(
            (round.min_sample_ms, round.sample_launches, vendor(&round)),
            (MIN_SAMPLE_MS, 0, (true, true, false))
        );
        assert_eq!((trial.start_uncapped, round.start_uncapped), (false, true));
        // Every other round times the vendor first.
        let second = plan.request(5, &image, &image, false, Pass::FinalistRound { vendor_first: true });
        assert_eq!((trial.baseline_first, round.baseline_first, second.baseline_first), (false, false, true));
        // ... and everything else is the trial's request.
        let same = |r: &MeasureRequest| MeasureRequest {
            baseline: false,
            fresh_baseline: false,
            repick_baseline: false,
            start_uncapped: false,
            baseline_first: false,
            ..r.clone()
        };
        assert_eq!(format!("{:?}", same(&trial)), format!("{:?}", same(&round)));
        // The task's own baseline wish still holds on a trial.
        assert!(plan.request(5, &image, &image, true, Pass::Trial).baseline);

        // Sustained: FINALIST_MIN_MS in all, whatever the samples ...
        plan.sampling.regime = Regime::Sustained;
        let warm = plan.request(5, &image, &image, false, Pass::FinalistWarmUp);
        let round = plan.request(5, &image, &image, false, Pass::FinalistRound { vendor_first: false });
        assert!(
            warm.min_sample_ms * f64::from(warm.samples) >= FINALIST_MIN_MS,
            "{} ms x {}",
            warm.min_sample_ms,
            warm.samples
        );
        assert!(warm.min_sample_ms >= 5.0 * MIN_SAMPLE_MS, "longer samples than a trial's: {}", warm.min_sample_ms);
        assert_eq!(vendor(&warm), (true, true, true), "the warm-up picks the vendor's algorithm again");
        assert_eq!((round.min_sample_ms, vendor(&round)), (warm.min_sample_ms, (true, true, false)));
        assert!(!round.start_uncapped, "sustained wants the cap");
        let second = plan.request(5, &image, &image, false, Pass::FinalistRound { vendor_first: true });
        assert!(!second.baseline_first, "sustained: the vendor after the kernel, in the same settled state");
        plan.sampling.samples = 1000;
        let long = plan.request(5, &image, &image, false, Pass::FinalistRound { vendor_first: false });
        assert_eq!((long.samples, long.min_sample_ms), (1000, MIN_SAMPLE_MS), "never shorter samples than a trial's");
        assert_eq!(long.sample_launches, MIN_BATCH);
        plan.sampling.samples = 4;
        assert_eq!(
            plan.request(5, &image, &image, false, Pass::FinalistRound { vendor_first: false }).min_sample_ms,
            FINALIST_MIN_MS / 4.0
        );
        // ... unless its launches come first: 5000 in all (500 a sample of the default 10), at
        // least MIN_BATCH a sample.
        assert_eq!((round.sample_launches, warm.sample_launches), (500, 500));
    }

    #[test]
    fn sustained_trials_settle_and_time_the_vendor_beside_every_kernel() {
        let mut plan = crate::reference::plan(&Target::sm90()).expect("the drift reference plans for sm_90");
        // A task's sampling, not the reference's own (which reads no energy).
        plan.sampling = Sampling::default();
        let image = Image { cubin: vec![1, 2, 3] };
        let burst = plan.request(5, &image, &image, false, Pass::Trial);
        assert_eq!(
            (burst.regime, burst.settle_cap_ms, burst.baseline, burst.fresh_baseline),
            (Regime::Burst, 0.0, false, false)
        );
        assert_eq!(burst.energy_ms, crate::energy::MIN_WINDOW_MS, "every trial reads its energy");
        plan.sampling.regime = Regime::Sustained;
        let sustained = plan.request(5, &image, &image, false, Pass::Trial);
        assert_eq!((sustained.regime, sustained.baseline, sustained.fresh_baseline), (Regime::Sustained, true, true));
        assert_eq!(sustained.settle_cap_ms, SETTLE_CAP_MS);
        let task = pb::Task { regime: "sustained".into(), samples: 3, ..Default::default() };
        assert_eq!(Sampling::of_task(&task).regime, Regime::Sustained);
        assert_eq!(Sampling::of_task(&pb::Task::default()).regime, Regime::Burst, "trackers that predate regimes");
        plan.sampling.no_energy = true;
        assert_eq!(plan.request(5, &image, &image, false, Pass::Trial).energy_ms, 0.0, "a job that reads no energy");
        assert!(Sampling::of_task(&pb::Task { no_energy: true, ..Default::default() }).no_energy);
    }
}
