//! Drift of a worker's timings from its peers'. Every worker times the shared reference kernel
//! (`tensortune_kernels::template::drift_reference`) now and then and sends its latest time with
//! its heartbeats; a worker whose time strays from the median of the online workers of its device
//! class is flagged (a throttled, clock-capped or misconfigured GPU), so that an operator can look
//! at it. Flagging never stops dispatch: the worker keeps measuring, and its records keep their
//! provenance.

use std::collections::HashMap;

use crate::model::WorkerId;
use crate::store::workers::WorkerRow;

/// |drift| above which a worker is flagged. Workers of one class time the same kernel the same
/// way (CUDA graphs, a median of samples), so healthy peers agree to about a percent; 5% is well
/// clear of that noise yet catches a GPU held at a lower clock (power or thermal capping), whose
/// timings would otherwise make its configs look slower than they are.
pub(crate) const DRIFT_LIMIT: f64 = 0.05;

/// Where a worker stands against its peers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Drift {
    /// (reference - median of the class) / median; 0 without a reference or a median.
    pub(crate) drift: f64,
    /// |drift| > [`DRIFT_LIMIT`], judged only against a median of at least two workers.
    pub(crate) flagged: bool,
}

/// The drift of a worker whose reference time is `reference_us`, given `peers`: the reference
/// times of the online workers of its class (its own included when it is online). With two peers
/// the median is their mean, so two workers that disagree are both flagged: either may be the
/// wrong one.
pub(crate) fn assess(reference_us: Option<f64>, peers: &[f64]) -> Drift {
    let (Some(reference), Some(median)) = (reference_us, median(peers)) else {
        return Drift::default();
    };
    let drift = (reference - median) / median;
    Drift { drift, flagged: peers.len() >= 2 && drift.abs() > DRIFT_LIMIT }
}

/// The drift of each of `workers`, in order, against the online workers of its class.
pub(crate) fn assess_all(workers: &[WorkerRow]) -> Vec<Drift> {
    let mut peers: HashMap<&str, Vec<f64>> = HashMap::new();
    for w in workers {
        if let (true, Some(r)) = (w.state == "online", w.reference_us) {
            peers.entry(w.device_class.as_str()).or_default().push(r);
        }
    }
    workers
        .iter()
        .map(|w| assess(w.reference_us, peers.get(w.device_class.as_str()).map_or(&[], Vec::as_slice)))
        .collect()
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty or
/// not positive (a median of 0 cannot scale a drift).
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let m = match n {
        0 => return None,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    (m > 0.0).then_some(m)
}

/// A worker whose flag changed at a heartbeat, to log once the heartbeat's write committed.
#[derive(Clone, Debug)]
pub(crate) struct FlagChange {
    pub(crate) worker: WorkerId,
    pub(crate) name: String,
    pub(crate) device_class: String,
    pub(crate) reference_us: f64,
    pub(crate) drift: Drift,
    pub(crate) peers: usize,
}

impl FlagChange {
    /// Logs the change: a warning when the worker became flagged.
    pub(crate) fn log(&self) {
        let (worker, name, class) = (self.worker, self.name.as_str(), self.device_class.as_str());
        if self.drift.flagged {
            tracing::warn!(
                worker,
                name,
                device_class = class,
                reference_us = self.reference_us,
                drift = self.drift.drift,
                limit = DRIFT_LIMIT,
                peers = self.peers,
                "worker flagged: its time of the reference kernel drifts from its peers'; check its clocks"
            );
        } else {
            tracing::info!(
                worker,
                name,
                device_class = class,
                reference_us = self.reference_us,
                drift = self.drift.drift,
                peers = self.peers,
                "worker no longer flagged: its reference time agrees with its peers' again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outlier_of_three_is_flagged() {
        let peers = [100.0, 101.0, 120.0];
        let third = assess(Some(120.0), &peers);
        assert!(third.flagged && (third.drift - 19.0 / 101.0).abs() < 1e-12, "{third:?}");
        assert!(!assess(Some(100.0), &peers).flagged);
        assert_eq!(assess(Some(101.0), &peers), Drift { drift: 0.0, flagged: false });
    }

    #[test]
    fn a_lone_worker_or_no_reference_is_never_flagged() {
        assert_eq!(assess(Some(500.0), &[500.0]), Drift::default());
        // Offline itself, with one online peer: a drift, but no flag from a single peer.
        let lone = assess(Some(200.0), &[100.0]);
        assert!((lone.drift - 1.0).abs() < 1e-12 && !lone.flagged, "{lone:?}");
        assert_eq!(assess(None, &[100.0, 120.0]), Drift::default());
        assert_eq!(assess(Some(100.0), &[]), Drift::default());
    }

    #[test]
    fn two_workers_that_disagree_are_both_flagged() {
        let peers = [100.0, 120.0];
        assert!(assess(Some(100.0), &peers).flagged && assess(Some(120.0), &peers).flagged);
        assert!(!assess(Some(100.0), &[100.0, 104.0]).flagged);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
    }
}
