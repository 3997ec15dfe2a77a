//! The measure stage: the only user of the measuring child. It measures one prepared task at a
//! time and keeps what must outlive a child, the vendor baselines.

use std::collections::HashMap;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::daemon::{Report, Shared};
use crate::prepare::Prepared;
use crate::protocol::MeasureOutcome;
use crate::record;
use crate::supervisor::Supervisor;

/// Times the vendor baseline of a workload is asked for before records go without one (a child
/// that crashed on the first task of a workload took its baseline with it).
const BASELINE_ASKS: u32 = 3;

/// Vendor baselines of this worker run, per workload key and L2 flush (a baseline is timed the
/// way its records are). The daemon keeps them because a child restart loses the child's: every
/// record of a workload carries the same baseline.
#[derive(Default)]
struct Baselines {
    known: HashMap<(String, bool), (f64, String)>,
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
                self.known.entry(key).or_insert_with(|| (us, outcome.baseline_kind.clone()));
            }
            None => {
                if let Some((us, kind)) = self.known.get(&key) {
                    outcome.baseline_us = Some(*us);
                    outcome.baseline_kind = kind.clone();
                }
            }
        }
    }
}

pub(crate) async fn measure_stage(
    mut supervisor: Supervisor,
    shared: &Shared,
    mut prepared: mpsc::Receiver<Prepared>,
    report: mpsc::Sender<Report>,
    stop: &CancellationToken,
) -> anyhow::Result<()> {
    let mut baselines = Baselines::default();
    let result = async {
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                next = prepared.recv() => next,
            };
            let Some(Prepared { lease, plan, kernel, support, compile }) = next else { return Ok(()) };
            if lease.dropped.is_cancelled() {
                continue;
            }
            let span =
                tracing::info_span!("measure", task = lease.task_id, kernel = %plan.spec.name, gpu = %shared.gpu);
            let baseline = baselines.wanted(&plan.workload_key, plan.sampling.flush_l2);
            let request = plan.request(lease.task_id, &kernel, &support, baseline);
            let measured = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                outcome = supervisor.measure(request).instrument(span) => outcome,
            };
            let mut outcome = measured?;
            baselines.settle(&plan.workload_key, plan.sampling.flush_l2, &mut outcome);
            let measurement = record::measurement(outcome, compile, &shared.provenance);
            if report.send(Report { lease, measurement }).await.is_err() {
                return Ok(());
            }
        }
    }
    .await;
    supervisor.shutdown().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Status;

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
