//! Trials across the workloads of one job (a model's layers): each next batch goes to the workload
//! with the largest expected gain, as MetaSchedule's gradient-based task scheduler does, instead of
//! round-robin. The gain of a workload is its weight times how fast its best time has been falling
//! (measured over a recent window, or estimated optimistically from its best so far when the
//! window shows nothing yet), so time goes where it still buys microseconds.
//!
//! With the vendor's time of a workload known (the tracker passes it for a model's job, one
//! submitted with weights), its curve is capped there: a model runs the vendor's
//! kernel wherever it is faster (the bundle says which won), so only time below the vendor's is a
//! gain. A workload far behind its vendor then keeps only the optimistic forward estimate, which
//! shrinks as it takes trials, and the budget moves to workloads that can still beat theirs.

/// What the scheduler knows of one workload.
#[derive(Clone, Debug, Default)]
pub struct TaskProgress {
    /// How much the workload matters (e.g. how many times a model runs it); 1 for one each.
    pub weight: f64,
    /// Best time after each finished trial (`f64::INFINITY` until the first ok result).
    pub best_after: Vec<f64>,
    /// Whether it may take more trials (budget left, not stopped).
    pub open: bool,
    /// The vendor library's time for it, when measured: what the model runs if tuning never
    /// beats it.
    pub vendor_us: Option<f64>,
}

impl TaskProgress {
    /// The time the model would spend in this workload with `best` found: the better of it and
    /// the vendor's.
    pub fn effective(&self, best: f64) -> f64 {
        self.vendor_us.filter(|v| v.is_finite() && *v > 0.0).map_or(best, |v| best.min(v))
    }
}

/// Trials every workload gets before gains are compared: too few and the gradient is noise.
pub const WARMUP: usize = 16;
/// Trials the backward gradient looks at.
pub const WINDOW: usize = 32;

/// The expected gain, in weighted microseconds per trial, of giving `t` another trial.
pub fn gain(t: &TaskProgress) -> f64 {
    let n = t.best_after.len();
    let Some(&best) = t.best_after.last() else { return f64::INFINITY };
    if !best.is_finite() {
        return f64::INFINITY;
    }
    let best = t.effective(best);
    let past = t.effective(t.best_after[n.saturating_sub(WINDOW)]);
    let backward = if past.is_finite() { (past - best) / WINDOW.min(n) as f64 } else { best / n as f64 };
    // Optimistic forward estimate: the remaining improvement shrinks like 1/trials.
    let forward = best / (n as f64 * n as f64).max(1.0);
    t.weight * backward.max(forward)
}

/// The workload that should get the next batch: any still in warm-up first (fewest trials first),
/// then the largest gain. `None` when every workload is closed.
pub fn next(tasks: &[TaskProgress]) -> Option<usize> {
    let open = || tasks.iter().enumerate().filter(|(_, t)| t.open);
    if let Some((i, _)) = open().filter(|(_, t)| t.best_after.len() < WARMUP).min_by_key(|(_, t)| t.best_after.len()) {
        return Some(i);
    }
    open().max_by(|(_, a), (_, b)| gain(a).total_cmp(&gain(b))).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(curve: &[f64], weight: f64) -> TaskProgress {
        TaskProgress { weight, best_after: curve.to_vec(), open: true, vendor_us: None }
    }

    #[test]
    fn only_time_below_the_vendor_counts() {
        let falling: Vec<f64> = (0..40).map(|i| 100.0 - i as f64).collect();
        // Falling fast but still far above its vendor's 20 us: the gain is the forward estimate
        // alone, below that of a workload that is beating its vendor.
        let behind = TaskProgress { vendor_us: Some(20.0), ..task(&falling, 1.0) };
        let ahead = TaskProgress { vendor_us: Some(80.0), ..task(&falling, 1.0) };
        assert!(gain(&behind) < gain(&ahead), "{} vs {}", gain(&behind), gain(&ahead));
        assert_eq!(gain(&behind), 20.0 / (40.0 * 40.0));
        assert_eq!(next(&[behind.clone(), ahead]), Some(1));
        // A heavy enough workload still gets its turn.
        let light = task(&vec![10.0; 40], 1.0);
        assert_eq!(next(&[light, TaskProgress { weight: 1000.0, ..behind }]), Some(1));
        assert_eq!(TaskProgress { vendor_us: Some(f64::NAN), ..task(&falling, 1.0) }.effective(5.0), 5.0);
    }

    #[test]
    fn warm_up_comes_first_then_gain() {
        let flat = vec![10.0; 40];
        let falling: Vec<f64> = (0..40).map(|i| 100.0 - i as f64).collect();
        let young = vec![5.0; 3];
        assert_eq!(next(&[task(&flat, 1.0), task(&young, 1.0)]), Some(1));
        assert_eq!(next(&[task(&flat, 1.0), task(&falling, 1.0)]), Some(1));
        // A heavy workload with a slow slope beats a light one with the same slope.
        assert_eq!(next(&[task(&falling, 1.0), task(&falling, 3.0)]), Some(1));
        let mut closed = task(&falling, 10.0);
        closed.open = false;
        assert_eq!(next(&[task(&flat, 1.0), closed]), Some(0));
        assert_eq!(next(&[]), None);
    }

    #[test]
    fn allocation_follows_the_gain() {
        // Two synthetic workloads: one improves for a long time, one converges at once.
        let mut tasks = vec![task(&[], 1.0), task(&[], 1.0)];
        let curve = |w: usize, n: usize| if w == 0 { 100.0 / (1.0 + n as f64).sqrt() } else { 50.0 };
        for _ in 0..200 {
            let i = next(&tasks).unwrap();
            let n = tasks[i].best_after.len();
            tasks[i].best_after.push(curve(i, n));
        }
        assert!(
            tasks[0].best_after.len() > 2 * tasks[1].best_after.len(),
            "{} vs {}",
            tasks[0].best_after.len(),
            tasks[1].best_after.len()
        );
        assert!(tasks[1].best_after.len() >= WARMUP);
    }
}
