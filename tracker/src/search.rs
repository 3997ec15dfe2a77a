//! The in-memory side of each workload's search: its valid configs, its tuner and the configs that
//! already have a task. All of it is derived from the database (and rebuilt after a restart); it
//! lives in memory because enumerating a template's space against a device walks hundreds of
//! thousands of points.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tensortune_kernels::{Target, Template, Workload};

use crate::model::JobId;
use crate::tuner::{Tuner, TunerKind};

/// Identifies a workload of a job.
pub(crate) type SearchKey = (JobId, u32);

/// One workload's search.
pub(crate) struct Search {
    tuner: Box<dyn Tuner>,
    /// Config indices that have a task (in any state), mirroring the tasks table.
    taken: HashSet<u64>,
}

impl Search {
    /// A search over `valid` that continues after the configs in `taken`.
    pub(crate) fn new(
        kind: TunerKind,
        seed: u64,
        workload_idx: u32,
        valid: Arc<[u64]>,
        taken: impl IntoIterator<Item = u64>,
    ) -> Search {
        Search { tuner: kind.build(valid, seed, workload_idx), taken: taken.into_iter().collect() }
    }

    /// Up to `n` configs to propose next, skipping those taken and those in `pending` (proposed in
    /// a write that has not committed yet).
    pub(crate) fn propose(&self, pending: Option<&HashSet<u64>>, n: usize) -> Vec<u64> {
        let taken = |c: u64| self.taken.contains(&c) || pending.is_some_and(|p| p.contains(&c));
        self.tuner.propose(&taken, n)
    }

    /// Marks configs as having a task (after the write that created them committed).
    pub(crate) fn take(&mut self, configs: impl IntoIterator<Item = u64>) {
        self.taken.extend(configs);
    }
}

/// The searches of every running workload.
#[derive(Default)]
pub(crate) struct Searches {
    map: HashMap<SearchKey, Search>,
}

impl Searches {
    /// The search of a workload, if loaded.
    pub(crate) fn get(&self, key: SearchKey) -> Option<&Search> {
        self.map.get(&key)
    }

    /// The search of a workload, if loaded.
    pub(crate) fn get_mut(&mut self, key: SearchKey) -> Option<&mut Search> {
        self.map.get_mut(&key)
    }

    /// Adds (or replaces) the search of a workload.
    pub(crate) fn insert(&mut self, key: SearchKey, search: Search) {
        self.map.insert(key, search);
    }

    /// Forgets the searches of a workload (it stopped) or of a whole job (`idx` `None`).
    pub(crate) fn remove(&mut self, job: JobId, idx: Option<u32>) {
        self.map.retain(|(j, i), _| *j != job || idx.is_some_and(|idx| idx != *i));
    }

    /// Forgets everything written by a write that failed: it is reloaded from the database.
    pub(crate) fn remove_keys(&mut self, keys: impl IntoIterator<Item = SearchKey>) {
        for key in keys {
            self.map.remove(&key);
        }
    }
}

/// The valid config indices of each of `workloads` for `template` on `target`, enumerated on a
/// blocking thread (a space has hundreds of thousands of points). Identical workloads are enumerated
/// once. On failure, returns the position of the workload and the template's error.
pub(crate) async fn valid_configs(
    template: &'static dyn Template,
    workloads: Vec<Workload>,
    target: Target,
) -> crate::error::Result<Result<Vec<Arc<[u64]>>, (usize, tensortune_kernels::Error)>> {
    let task = tokio::task::spawn_blocking(move || {
        let mut by_key: HashMap<String, Arc<[u64]>> = HashMap::new();
        let mut out = Vec::with_capacity(workloads.len());
        for (i, w) in workloads.iter().enumerate() {
            let key = w.key();
            if let Some(v) = by_key.get(&key) {
                out.push(v.clone());
                continue;
            }
            let valid: Arc<[u64]> = template.valid_indices(w, &target).map_err(|e| (i, e))?.into();
            by_key.insert(key, valid.clone());
            out.push(valid);
        }
        Ok(out)
    });
    Ok(task.await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_proposals_are_skipped_and_taken_after_commit() {
        let valid: Arc<[u64]> = (0..10u64).collect();
        let mut s = Search::new(TunerKind::Grid, 1, 0, valid, [0, 1]);
        let pending: HashSet<u64> = [2].into();
        assert_eq!(s.propose(Some(&pending), 2), vec![3, 4]);
        s.take([2, 3, 4]);
        assert_eq!(s.propose(None, 100), vec![5, 6, 7, 8, 9]);
    }

    #[test]
    fn removing_a_job_keeps_other_jobs() {
        let valid: Arc<[u64]> = (0..10u64).collect();
        let mut all = Searches::default();
        for key in [(1, 0), (1, 1), (2, 0)] {
            all.insert(key, Search::new(TunerKind::Grid, 1, key.1, valid.clone(), []));
        }
        all.remove(1, Some(1));
        assert!(all.get((1, 0)).is_some() && all.get((1, 1)).is_none());
        all.remove(1, None);
        assert!(all.get((1, 0)).is_none() && all.get((2, 0)).is_some());
    }
}
