//! The drift reference: every worker times the same kernel now and then, so that the tracker can
//! compare workers of one device class and flag one whose timings drift from its peers' (a
//! throttled, misconfigured or shared GPU).
//!
//! The kernel is `tensortune_kernels::template::drift_reference()` (a `wmma_gemm` config of
//! f16 1024^3), generated for this device and measured through the same child and measurement
//! path as tasks (no vendor baseline). The measure stage times it at start, before the first task,
//! then whenever [`INTERVAL`] has passed or [`TASKS`] tasks were measured since, whichever comes
//! first (between tasks, or while idle). Every heartbeat carries the latest median (0 until there
//! is one); a measurement that fails is logged and the previous value kept. On `sim` the time is
//! the analytic model's, the same on every sim worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tensortune_kernels::gemm::WmmaGemm;
use tensortune_kernels::{Target, template};
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::compiler::{Compiler, Image};
use crate::plan::{Pass, Plan, Sampling, Subject, support_module};
use crate::protocol::Status;
use crate::supervisor::Supervisor;

/// The longest time between two reference measurements.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10 * 60);
/// The most tasks (tuning or finalist) measured between two reference measurements.
pub(crate) const TASKS: u32 = 200;
/// The task id reference measurements carry to the child (tracker task ids start at 1); fixed, so
/// the sim's per-sample jitter, and thus its reference time, is the same on every sim worker.
pub(crate) const TASK_ID: u64 = 0;

/// The reference kernel as generated for `target`; `Err` when it cannot run there.
pub(crate) fn plan(target: &Target) -> Result<Plan, String> {
    let (workload, config) = template::drift_reference();
    let subject = Subject { workload, workload_key: workload.key(), template: &WmmaGemm };
    // A time, not an energy: the energy window and a burst's cool-down would add about 2 s to
    // every reference measurement, the first of which stands before a new worker's first task.
    subject.plan(&config, Sampling { no_energy: true, ..Sampling::default() }, target)
}

/// The drift reference of one worker: its kernel, its images, when it is due, and where its
/// time goes.
pub(crate) struct Reference {
    /// The kernel on this device; `None` when it cannot run here (heartbeats then carry 0).
    plan: Option<Plan>,
    /// The kernel's image and its support module's, compiled on first use.
    images: Option<(Arc<Image>, Arc<Image>)>,
    cadence: Cadence,
    time: Arc<ReferenceTime>,
}

impl Reference {
    /// The reference for `target`, publishing its times to `time`.
    pub(crate) fn new(target: &Target, time: Arc<ReferenceTime>, gpu: &str) -> Reference {
        let plan = plan(target)
            .inspect_err(|e| {
                tracing::warn!(
                    gpu = %gpu,
                    "the drift reference cannot run on this device ({e}); heartbeats carry no reference time"
                )
            })
            .ok();
        Reference { plan, images: None, cadence: Cadence::default(), time }
    }

    /// Whether it is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.plan.is_some() && self.cadence.due(now)
    }

    /// When it falls due by time alone; `None` when never (or due at once, see [`Reference::due`]).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.plan.as_ref().and(self.cadence.next())
    }

    /// Counts a measured task towards [`TASKS`].
    pub(crate) fn task_measured(&mut self) {
        self.cadence.task_measured();
    }

    /// Measures the reference in `supervisor`'s child (compiling it first, once) and publishes
    /// its median; a failure is logged and the previous time kept. `Err` only when no measuring
    /// child can be started.
    pub(crate) async fn measure(
        &mut self,
        supervisor: &mut Supervisor,
        compiler: &Compiler,
        gpu: &str,
    ) -> anyhow::Result<()> {
        let Some(plan) = &self.plan else { return Ok(()) };
        self.cadence.attempted(Instant::now());
        let previous = self.time.get();
        let (kernel, support) = match &self.images {
            Some(images) => images.clone(),
            None => {
                let (support_name, support_source) = support_module(&plan.workload, &plan.workload_key);
                let (kernel, support) = tokio::join!(
                    compiler.build(&plan.spec.name, &plan.spec.source),
                    compiler.build(&support_name, &support_source),
                );
                match (kernel.image, support.image) {
                    (Ok(kernel), Ok(support)) => self.images.insert((kernel, support)).clone(),
                    (Err(log), _) | (_, Err(log)) => {
                        tracing::warn!(
                            gpu = %gpu,
                            previous,
                            "the drift reference did not compile; keeping the last time: {log}"
                        );
                        return Ok(());
                    }
                }
            }
        };
        let request = plan.request(TASK_ID, &kernel, &support, false, Pass::Trial);
        let span = tracing::info_span!("reference", kernel = %plan.spec.name, gpu = %gpu);
        let outcome = supervisor.measure(request).instrument(span).await?;
        if outcome.status == Status::Ok && outcome.median_us > 0.0 {
            self.time.set(outcome.median_us);
            tracing::info!(gpu = %gpu, reference_us = outcome.median_us, previous, "timed the drift reference");
        } else {
            tracing::warn!(
                gpu = %gpu,
                status = ?outcome.status,
                previous,
                "the drift reference did not time; keeping the last time: {}",
                outcome.error
            );
        }
        Ok(())
    }
}

/// The latest reference median in microseconds, written by the measure stage and read by
/// heartbeats; 0 until the first measurement succeeds.
#[derive(Debug, Default)]
pub(crate) struct ReferenceTime(AtomicU64);

impl ReferenceTime {
    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn set(&self, us: f64) {
        self.0.store(us.to_bits(), Ordering::Relaxed);
    }
}

/// When the reference is due again.
#[derive(Debug, Default)]
pub(crate) struct Cadence {
    /// The last attempt (successful or not); `None` before the first.
    last: Option<Instant>,
    /// Tasks measured since.
    tasks: u32,
}

impl Cadence {
    /// Whether the reference is due at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        match self.next() {
            None => true,
            Some(at) => self.tasks >= TASKS || now >= at,
        }
    }

    /// When it falls due by time alone; `None` before the first attempt (due at once).
    pub(crate) fn next(&self) -> Option<Instant> {
        self.last.map(|last| last + INTERVAL)
    }

    /// Records an attempt at `now`.
    pub(crate) fn attempted(&mut self, now: Instant) {
        self.last = Some(now);
        self.tasks = 0;
    }

    /// Records a measured task.
    pub(crate) fn task_measured(&mut self) {
        self.tasks = self.tasks.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_at_start_then_after_the_interval_or_the_tasks() {
        let start = Instant::now();
        let mut c = Cadence::default();
        assert!(c.due(start) && c.next().is_none());
        c.attempted(start);
        assert!(!c.due(start + INTERVAL / 2));
        assert_eq!(c.next(), Some(start + INTERVAL));
        assert!(c.due(start + INTERVAL));
        for _ in 0..TASKS - 1 {
            c.task_measured();
        }
        assert!(!c.due(start));
        c.task_measured();
        assert!(c.due(start), "due after {TASKS} tasks, however soon");
        c.attempted(start + Duration::from_secs(1));
        assert!(!c.due(start + INTERVAL) && c.due(start + INTERVAL + Duration::from_secs(1)));
    }

    #[test]
    fn the_time_starts_at_zero() {
        let t = ReferenceTime::default();
        assert_eq!(t.get(), 0.0);
        t.set(123.25);
        assert_eq!(t.get(), 123.25);
    }

    #[test]
    fn the_reference_reads_no_energy() {
        let plan = plan(&Target::sm90()).unwrap();
        let image = Image { cubin: vec![1] };
        let req = plan.request(TASK_ID, &image, &image, false, crate::plan::Pass::Trial);
        assert_eq!(req.energy_ms, 0.0, "a reference measurement asked for an energy window");
        assert_eq!(req.regime, tensortune_kernels::energy::Regime::Burst);
    }

    #[test]
    fn the_reference_runs_on_the_sim_and_on_real_gpus() {
        for target in [Target::sim(), Target::sm80(), Target::sm90()] {
            let plan = plan(&target).unwrap();
            assert!(plan.model_us > 0.0 && plan.spec.name.contains("wmma_gemm"), "{}", plan.spec.name);
        }
    }
}
