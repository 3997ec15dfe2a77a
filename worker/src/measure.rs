//! The measure stage: the only user of the measuring child. It measures one prepared task at a
//! time (a tuning task once; a finalist task's configs in interleaved rounds, see `finalist`),
//! the drift reference when it is due (see `reference`), and keeps what must outlive a child, the
//! vendor baselines.

use std::collections::HashMap;
use std::sync::Arc;

use tensortune_proto::pb;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::compiler::Image;
use crate::finalist;
use crate::held::Lease;
use crate::inject::{Fault, INJECT_FAULTS_ENV, Injector};
use crate::plan::{Pass, Plan};
use crate::prepare::{Candidate, Prepared, Work};
use crate::protocol::{MeasureOutcome, Status};
use crate::record;
use crate::reference::Reference;
use crate::stage::{Report, Shared, TaskResult};
use crate::supervisor::Supervisor;

/// Times the vendor baseline of a workload is asked for before records go without one (a child
/// that crashed on the first task of a workload took its baseline with it).
const BASELINE_ASKS: u32 = 3;

/// Vendor baselines of this worker run, per workload key and L2 flush (a baseline is timed the
/// way its records are). The daemon keeps them because a child restart loses the child's: every
/// record of a workload carries the same baseline.
#[derive(Default)]
struct Baselines {
    /// Time, kind and energy per launch (when read) of each baseline.
    known: HashMap<(String, bool), (f64, String, Option<f64>)>,
    asked: HashMap<(String, bool), u32>,
}

impl Baselines {
    /// Whether the next measurement of workload `key` (flushing the L2 or not) should time the
    /// vendor library.
    fn wanted(&mut self, key: &str, flush_l2: bool) -> bool {
        let key = (key.to_owned(), flush_l2);
        if self.known.contains_key(&key) {
            return false;
        }
        let asked = self.asked.entry(key).or_insert(0);
        *asked += 1;
        *asked <= BASELINE_ASKS
    }

    /// Remembers the outcome's baseline, or gives the outcome the one remembered.
    fn settle(&mut self, key: &str, flush_l2: bool, outcome: &mut MeasureOutcome) {
        let key = (key.to_owned(), flush_l2);
        match outcome.baseline_us {
            Some(us) => {
                self.known
                    .entry(key)
                    .or_insert_with(|| (us, outcome.baseline_kind.clone(), outcome.baseline_energy_mj));
            }
            None => {
                if let Some((us, kind, energy)) = self.known.get(&key) {
                    outcome.baseline_us = Some(*us);
                    outcome.baseline_kind = kind.clone();
                    outcome.baseline_energy_mj = *energy;
                }
            }
        }
    }
}

/// The key a plan's baselines are remembered under: its workload's, and for the sustained regime
/// apart from burst's (the vendor reads slower at the power-capped clock).
fn baseline_key(plan: &Plan) -> String {
    match plan.sampling.regime {
        tensortune_kernels::energy::Regime::Burst => plan.workload_key.clone(),
        regime => format!("{} {regime}", plan.workload_key),
    }
}

/// The measure stage: measures prepared tasks one at a time, and the drift reference when it is
/// due, until `stop` fires or the prepare stage is done, then stops the child. `Err` only when no
/// measuring child can be started.
pub(crate) async fn measure_stage(
    supervisor: Supervisor,
    shared: &Shared,
    mut prepared: mpsc::Receiver<Prepared>,
    report: mpsc::Sender<Report>,
    reference: Reference,
    injector: Injector,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let mut measurer = Measurer {
        supervisor,
        shared,
        baselines: Baselines::default(),
        reference,
        injector,
        tuning_since: HashMap::new(),
    };
    let result = async {
        loop {
            if measurer.reference.due(Instant::now()) {
                let measured = tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    r = measurer.reference.measure(&mut measurer.supervisor, &shared.compiler, &shared.gpu) => r,
                };
                measured?;
            }
            let next = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = until(measurer.reference.next()) => continue,
                next = prepared.recv() => next,
            };
            let Some(Prepared { lease, support, work }) = next else { return Ok(()) };
            if lease.dropped.is_cancelled() {
                continue;
            }
            let result = match work {
                Work::Tuning(kernel) => {
                    measurer.tuning_since.entry(kernel.plan.workload_key.clone()).or_insert_with(Instant::now);
                    let image = match measurer.injector.next_task() {
                        None => Ok(kernel.image.clone()),
                        Some(fault) => tokio::select! {
                            _ = stop.cancelled() => return Ok(()),
                            image = measurer.faulty(fault, &kernel.plan, lease.task_id) => image,
                        },
                    };
                    let outcome = match image {
                        Ok(image) => tokio::select! {
                            _ = stop.cancelled() => return Ok(()),
                            outcome = measurer.measure(lease.task_id, &kernel.plan, &image, &support, Pass::Trial) => outcome?,
                        },
                        Err(failed) => failed,
                    };
                    TaskResult::Tuning(Box::new(record::measurement(outcome, kernel.compile, &shared.provenance)))
                }
                Work::Finalists { finalists, rounds } => {
                    match measurer.finalists(&lease, &support, finalists, rounds, stop).await? {
                        Some(measurements) => TaskResult::Finalists(measurements),
                        None => continue,
                    }
                }
            };
            measurer.reference.task_measured();
            if report.send(Report { lease, result }).await.is_err() {
                return Ok(());
            }
        }
    }
    .await;
    // The reports are complete: the report stage finishes (and hands back the held tasks) while
    // the child stops on its own.
    drop(report);
    measurer.supervisor.shutdown_detached();
    result
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The measure stage's state: the child and what must outlive it.
struct Measurer<'a> {
    supervisor: Supervisor,
    shared: &'a Shared,
    baselines: Baselines,
    reference: Reference,
    /// Which tuning tasks get an injected fault (`inject`; none unless asked for).
    injector: Injector,
    /// When this stage measured the first tuning task of each workload (by key) since its last
    /// finalist task: the finalists' time is bounded by a share of that ([`FINALIST_SHARE`]).
    tuning_since: HashMap<String, Instant>,
}

/// A finalist task starts no round beyond [`finalist::MIN_ROUNDS`] that would end past this share
/// of the time its workload's tuning took on this worker (from its first measured trial): then
/// finalists take at most about a sixth of a job's wall (the bar of issue 35 is a fifth), whatever
/// the kernel's length, unless two rounds alone take more. A share of the job, not a fixed time:
/// a job of many trials may spend more on deciding its winner. Chosen from the bar, not fitted.
const FINALIST_SHARE: f64 = 0.2;

impl Measurer<'_> {
    /// Measures `plan`'s kernel once in the child for `pass`, asking for the vendor baseline
    /// while the worker has none for the workload, or timed afresh when the pass says so. `Err`
    /// only when no measuring child can be started.
    async fn measure(
        &mut self,
        task_id: u64,
        plan: &Plan,
        kernel: &Image,
        support: &Image,
        pass: Pass,
    ) -> anyhow::Result<MeasureOutcome> {
        let (key, flush_l2) = (&baseline_key(plan), plan.sampling.flush_l2);
        let request = plan.request(task_id, kernel, support, self.baselines.wanted(key, flush_l2), pass);
        let fresh_baseline = request.fresh_baseline;
        let span = tracing::info_span!("measure", task = task_id, kernel = %plan.spec.name, gpu = %self.shared.gpu);
        let mut outcome = self.supervisor.measure(request).instrument(span).await?;
        // A fresh timing that did not happen stays missing (the caller pairs it with this
        // measurement); any other outcome takes the remembered baseline.
        if !fresh_baseline || outcome.baseline_us.is_some() {
            self.baselines.settle(key, flush_l2, &mut outcome);
        }
        Ok(outcome)
    }

    /// The image of `plan`'s kernel with `fault` injected, compiled on the pool; a compile error
    /// is the task's `compile_error`.
    async fn faulty(&self, fault: Fault, plan: &Plan, task_id: u64) -> Result<Arc<Image>, MeasureOutcome> {
        tracing::warn!(
            task = task_id,
            kernel = %plan.spec.name,
            gpu = %self.shared.gpu,
            "injecting fault {fault} ({INJECT_FAULTS_ENV})"
        );
        let source = fault.kind.inject(&plan.spec.source);
        self.shared.compiler.build(&plan.spec.name, &source).await.image.map_err(|log| {
            let error = format!("the kernel with the injected fault {fault} did not compile: {log}");
            tracing::error!(task = task_id, "{error}");
            MeasureOutcome::failed(Status::CompileError, error)
        })
    }

    /// Measures a finalist task's configs up to `rounds` times, interleaved (see `finalist`), and
    /// returns their records in task order; `None` when the task was dropped or the worker is
    /// stopping (nothing is reported). Every measurement in the rounds times the vendor's pick
    /// beside it, the same way, so each finalist is compared with the vendor from the same GPU
    /// state, round by round; each record carries the [`finalist::Center`] of its rounds and of the
    /// vendor timings beside them (see [`finalist::vendor_of_rounds`]).
    ///
    /// Burst (the default): each finalist, and the vendor beside it, is timed as a trial is, from
    /// the full clock (a timing that finds the clock held down idles until it is not:
    /// `MeasureRequest::start_uncapped`), as a burst record means and as the pick was made at the
    /// start of the tuning; the rounds alternate which of the two goes first
    /// (`MeasureRequest::baseline_first`), and the record is the fastest round; the vendor's time
    /// is the fastest of all its timings in the task (beside any finalist).
    ///
    /// Sustained: finalists are timed in long samples (`plan::FINALIST_MIN_MS`), at the clock of
    /// a sustained load. The first measurable finalist is measured once before round 1 and not
    /// recorded, so that the rounds run on a GPU in the state they keep it in; that warm-up then
    /// times every vendor candidate again, the same way, and the fastest is the pick the rounds
    /// time. The pick made at the start of the tuning came from short timings on a cool GPU,
    /// where another algorithm may win (2026-11-26, an H100 at its power cap, f16
    /// 4096x14336x4096: cublasGemmEx 652 us and cuBLASLt's #5 671 us in a burst, 763 and 750 us
    /// held for seconds). A burst of nine short timings in the rounds had favoured whichever
    /// candidate it timed first (2026-11-25, when burst timings did not wait for the full clock).
    async fn finalists(
        &mut self,
        lease: &Lease,
        support: &Image,
        finalists: Vec<Candidate>,
        rounds: u32,
        stop: &CancellationToken,
    ) -> anyhow::Result<Option<Vec<pb::Measurement>>> {
        let started = Instant::now();
        let first = finalists.iter().find_map(|f| match f {
            Candidate::Ready(kernel) => Some(kernel),
            Candidate::Settled(_) => None,
        });
        // The share of the tuning's time the rounds may take (none known: no bound but `rounds`).
        let budget = first
            .and_then(|k| self.tuning_since.remove(&k.plan.workload_key))
            .map(|since| started.duration_since(since).mul_f64(FINALIST_SHARE));
        let mut measured: Vec<Vec<MeasureOutcome>> = finalists.iter().map(|_| Vec::new()).collect();
        let mut vendor: Vec<Vec<(f64, String)>> = finalists.iter().map(|_| Vec::new()).collect();
        let sustained = first.is_some_and(|k| k.plan.sampling.regime == tensortune_kernels::energy::Regime::Sustained);
        // A burst record is the fastest round's (see `finalist::Center`).
        let center = if sustained { finalist::Center::Median } else { finalist::Center::Fastest };
        // The warm-up: sustained only (a burst finalist starts from the full clock instead).
        if let Some(kernel) = first.filter(|_| sustained) {
            if lease.dropped.is_cancelled() {
                return Ok(None);
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                warm = self.measure(lease.task_id, &kernel.plan, &kernel.image, support, Pass::FinalistWarmUp) => {
                    tracing::debug!(task = lease.task_id, kernel = %kernel.plan.spec.name, status = ?warm?.status, "finalist warm-up (not recorded)");
                }
            }
        }
        for round in 1..=rounds {
            let round_started = Instant::now();
            for (i, (finalist, outcomes)) in finalists.iter().zip(&mut measured).enumerate() {
                let Candidate::Ready(kernel) = finalist else { continue };
                // A config whose round was not ok is not measured again (see `finalist`).
                if outcomes.last().is_some_and(|o| o.status != Status::Ok) {
                    continue;
                }
                if lease.dropped.is_cancelled() {
                    return Ok(None);
                }
                let outcome = tokio::select! {
                    _ = stop.cancelled() => return Ok(None),
                    outcome = self.measure(lease.task_id, &kernel.plan, &kernel.image, support, Pass::FinalistRound { vendor_first: round % 2 == 0 }) => outcome?,
                };
                if outcome.status == Status::Ok
                    && let Some(us) = outcome.baseline_us
                {
                    vendor[i].push((us, outcome.baseline_kind.clone()));
                }
                tracing::debug!(
                    task = lease.task_id,
                    kernel = %kernel.plan.spec.name,
                    round,
                    status = ?outcome.status,
                    median_us = outcome.median_us,
                    vendor_us = outcome.baseline_us,
                    "finalist measured"
                );
                outcomes.push(outcome);
            }
            // Adaptive: no more rounds once they cannot change the verdict (see `finalist`), or
            // once another would end past the budget.
            let verdict = finalist::verdict(&measured, round, rounds, center);
            let over = budget.is_some_and(|b| started.elapsed() + round_started.elapsed() > b);
            let out_of_time = over && round >= finalist::MIN_ROUNDS;
            if verdict.settled() || round == rounds || out_of_time {
                let ms = started.elapsed().as_secs_f64() * 1e3;
                let budget_ms = budget.map(|b| b.as_secs_f64() * 1e3);
                tracing::info!(
                    task = lease.task_id,
                    round,
                    rounds,
                    ?verdict,
                    out_of_time,
                    ms,
                    budget_ms,
                    "finalist rounds done"
                );
                break;
            }
        }
        let mut records = Vec::with_capacity(finalists.len());
        for ((finalist, outcomes), paired) in finalists.into_iter().zip(measured).zip(&vendor) {
            let record = match finalist {
                Candidate::Ready(kernel) => {
                    let mut outcome = finalist::combine(outcomes, rounds, center);
                    if outcome.status == Status::Ok {
                        match finalist::vendor_of(paired, &vendor, center) {
                            Some((us, kind)) => {
                                outcome.baseline_us = Some(us);
                                outcome.baseline_kind = kind;
                            }
                            // No round timed the vendor (it failed every time): the baseline of
                            // the session, as any record without one of its own.
                            None => {
                                outcome.baseline_us = None;
                                let plan = &kernel.plan;
                                self.baselines.settle(&baseline_key(plan), plan.sampling.flush_l2, &mut outcome);
                            }
                        }
                    }
                    record::measurement(outcome, kernel.compile, &self.shared.provenance)
                }
                Candidate::Settled(settled) => {
                    record::measurement(settled.outcome, settled.compile, &self.shared.provenance)
                }
            };
            records.push(record);
        }
        Ok(Some(records))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_are_asked_for_until_known_then_copied() {
        let mut b = Baselines::default();
        assert!(b.wanted("w", false));
        let mut crashed = MeasureOutcome::failed(Status::LaunchError, "boom");
        b.settle("w", false, &mut crashed);
        assert_eq!(crashed.baseline_us, None);
        assert!(b.wanted("w", false), "a baseline lost with a crashed child is asked for again");
        let mut first = MeasureOutcome::failed(Status::Ok, "");
        first.baseline_us = Some(2.5);
        first.baseline_kind = "cublasGemmEx".into();
        b.settle("w", false, &mut first);
        assert!(!b.wanted("w", false));
        let mut later = MeasureOutcome::failed(Status::Ok, "");
        b.settle("w", false, &mut later);
        assert_eq!((later.baseline_us, later.baseline_kind.as_str()), (Some(2.5), "cublasGemmEx"));
        assert!(b.wanted("other", false) && b.wanted("other", false) && b.wanted("other", false));
        assert!(!b.wanted("other", false));
    }

    #[test]
    fn a_cold_l2_baseline_is_its_own() {
        let mut b = Baselines::default();
        let mut warm = MeasureOutcome::failed(Status::Ok, "");
        warm.baseline_us = Some(2.5);
        b.settle("w", false, &mut warm);
        assert!(b.wanted("w", true), "the warm baseline does not serve cold records");
        let mut cold = MeasureOutcome::failed(Status::Ok, "");
        b.settle("w", true, &mut cold);
        assert_eq!(cold.baseline_us, None);
        cold.baseline_us = Some(4.0);
        b.settle("w", true, &mut cold);
        let mut later = MeasureOutcome::failed(Status::Ok, "");
        b.settle("w", true, &mut later);
        assert_eq!(later.baseline_us, Some(4.0));
    }
}
