//! The learned cost model: gradient-boosted trees (the `forust-ml` crate) regressing a config's
//! normalised log-time on its feature row. Targets are normalised per workload (log time minus the
//! median log time of that workload's measurements), so rows of different workloads share one
//! scale and a model trained on some workloads ranks configs of another (transfer).

use forust_ml::GradientBooster;
use forust_ml::data::Matrix;
use forust_ml::objective::ObjectiveType;

use crate::Error;

/// Rows from which a fit builds its histograms on every core (a prior's model, fitted once on
/// tens of thousands of rows); smaller fits (a workload's own, every batch) stay on one thread.
/// The result is the same either way: forust's tiled fill (below) splits a node's rows into
/// segments by the node's size alone and adds their sums in order, whatever the threads.
const PARALLEL_ROWS: usize = 10_000;

/// The most threads a parallel fit runs on. A fit's parallel steps are one histogram per feature
/// column (a few dozen), each small, so its threads meet at a join many times a tree. On rayon's
/// global pool (one thread per core) the preparation of a ResNet-50 job's 27 tuners, their prior
/// fits, took 29.6 s on a 4-GPU host's 64 cores against 2.8 s on 16 (nvidia-h200-x4, 2026-11-28,
/// `taskset` 0-63 vs 0-15); that the pool's width is the cause is inferred, not yet measured.
/// Eight is a guess from the width of those steps, not fitted to the timings.
const MAX_FIT_THREADS: usize = 8;

/// Threads of a parallel fit: the cores, at most [`MAX_FIT_THREADS`].
fn fit_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_FIT_THREADS)
}

/// Boosting rounds, step and depth: small trees on hundreds of rows, refitted every batch.
const ROUNDS: usize = 80;
const LEARNING_RATE: f32 = 0.15;
const MAX_DEPTH: usize = 5;

/// A fitted model.
pub struct CostModel {
    booster: GradientBooster,
    width: usize,
}

fn matrix(rows: &[Vec<f64>], width: usize) -> Vec<f64> {
    // forust takes columns one after another.
    let mut flat = Vec::with_capacity(rows.len() * width);
    for col in 0..width {
        flat.extend(rows.iter().map(|r| r[col]));
    }
    flat
}

impl CostModel {
    /// Fits rows -> targets with per-row weights.
    pub fn fit(rows: &[Vec<f64>], y: &[f64], weights: &[f64], seed: u64) -> Result<CostModel, Error> {
        let width = rows.first().map_or(0, Vec::len);
        if rows.is_empty()
            || rows.len() != y.len()
            || rows.len() != weights.len()
            || rows.iter().any(|r| r.len() != width)
        {
            return Err(Error::Model(format!(
                "{} rows, {} targets and {} weights of mixed widths",
                rows.len(),
                y.len(),
                weights.len()
            )));
        }
        let flat = matrix(rows, width);
        let data = Matrix::new(&flat, rows.len(), width);
        let mut booster = GradientBooster::default()
            .set_objective_type(ObjectiveType::SquaredLoss)
            .set_iterations(ROUNDS)
            .set_learning_rate(LEARNING_RATE)
            .set_max_depth(MAX_DEPTH)
            .set_min_leaf_weight(1.0)
            // Row-wise histograms over tiles of columns for the nodes large enough (forust falls
            // back to one column at a time for small ones): a prior's fit, 45,000 rows of 40
            // columns, took 1.0-1.1 s of the 2-core CI machine's CPU against 1.8-2.2 s column by
            // column (histogram filling was 75% of the fit); a default tune's prior on an H200
            // host, 223-249 ms against 298-304 (2026-11-29, docs/data/gpu-2026-11-29-search12).
            .set_tiled_histograms(true)
            .set_parallel(rows.len() >= PARALLEL_ROWS)
            .set_num_threads(Some(fit_threads()))
            .set_seed(seed);
        booster.fit(&data, y, weights, None).map_err(|e| Error::Model(e.to_string()))?;
        Ok(CostModel { booster, width })
    }

    /// Predicted normalised log-times (lower is faster).
    pub fn predict(&self, rows: &[Vec<f64>]) -> Vec<f64> {
        if rows.is_empty() {
            return Vec::new();
        }
        let flat = matrix(rows, self.width);
        self.booster.predict(&Matrix::new(&flat, rows.len(), self.width), false)
    }
}

/// Normalised targets of one workload's measurements: ln(t) - median ln(t) over its ok ones;
/// failures get the worst ok value plus one (e-fold slower), so the model learns to avoid them.
pub fn normalise(times: &[Option<f64>]) -> Vec<f64> {
    let mut logs: Vec<f64> = times.iter().flatten().map(|t| t.ln()).collect();
    if logs.is_empty() {
        return vec![0.0; times.len()];
    }
    logs.sort_by(f64::total_cmp);
    let median = logs[logs.len() / 2];
    let worst = logs[logs.len() - 1] - median;
    times.iter().map(|t| t.map_or(worst + 1.0, |t| t.ln() - median)).collect()
}

/// How much slower than a workload's best a config may be before a transfer target stops telling
/// them apart: twice as slow is as bad as it gets.
pub const TRANSFER_CAP: f64 = std::f64::consts::LN_2;

/// Targets of another workload's measurements for transfer: ln(t / best) capped at
/// [`TRANSFER_CAP`], failures a half cap beyond. A prior model then spends its trees on ranking
/// the configs near each workload's best, which is what a new workload's first batch needs,
/// rather than on how slow the slow half of a space is.
pub fn normalise_transfer(times: &[Option<f64>]) -> Vec<f64> {
    let best = times.iter().flatten().copied().fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return vec![0.0; times.len()];
    }
    times.iter().map(|t| t.map_or(TRANSFER_CAP * 1.5, |t| (t / best).ln().min(TRANSFER_CAP))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_a_simple_function() {
        let rows: Vec<Vec<f64>> = (0..200).map(|i| vec![(i % 20) as f64, (i / 20) as f64]).collect();
        let y: Vec<f64> = rows.iter().map(|r| (r[0] - 7.0).abs() + 0.1 * r[1]).collect();
        let m = CostModel::fit(&rows, &y, &vec![1.0; rows.len()], 1).unwrap();
        let p = m.predict(&[vec![7.0, 0.0], vec![19.0, 9.0]]);
        assert!(p[0] < p[1], "{p:?}");
        assert!(CostModel::fit(&[], &[], &[], 1).is_err());
    }

    #[test]
    fn missing_columns_of_another_template_are_learned_around() {
        // Two templates in one layout (one-hot, a column each, NaN where not its own): the first
        // is fastest at its knob 3, the second is faster overall at its knob 5.
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for v in 0..10 {
            rows.push(vec![1.0, 0.0, v as f64, f64::NAN]);
            y.push(1.0 + (v as f64 - 3.0).abs());
            rows.push(vec![0.0, 1.0, f64::NAN, v as f64]);
            y.push((v as f64 - 5.0).abs());
        }
        let m = CostModel::fit(&rows, &y, &vec![1.0; rows.len()], 1).unwrap();
        let p =
            m.predict(&[vec![1.0, 0.0, 3.0, f64::NAN], vec![1.0, 0.0, 9.0, f64::NAN], vec![0.0, 1.0, f64::NAN, 5.0]]);
        assert!(p.iter().all(|v| v.is_finite()), "{p:?}");
        assert!(p[0] < p[1] && p[2] < p[0], "{p:?}");
    }

    #[test]
    fn transfer_targets_are_capped_relative_to_the_best() {
        let n = normalise_transfer(&[Some(2.0), Some(3.0), Some(10.0), None]);
        assert_eq!(n[0], 0.0);
        assert!((n[1] - 1.5f64.ln()).abs() < 1e-12);
        assert_eq!(n[2], TRANSFER_CAP);
        assert!(n[3] > TRANSFER_CAP);
        assert_eq!(normalise_transfer(&[None]), vec![0.0]);
    }

    #[test]
    fn normalisation_centres_and_penalises_failures() {
        let n = normalise(&[Some(1.0), Some(std::f64::consts::E), None]);
        assert!(n[0] <= 0.0 && n[1] >= 0.0);
        assert!(n[2] > n[1], "{n:?}");
        assert_eq!(normalise(&[None, None]), vec![0.0, 0.0]);
    }
}
